"""`msccl-compile replan SCHEDULE.json --hw NAME (--fail-link A-B | --degrade A-B=FRACTION) [--size S]`:
a saved schedule (--schedule-out) repaired for a changed cluster (compiler/replan.py), checked by the
schedule simulator on the changed topology, lowered, verified and written."""

from __future__ import annotations

from compiler.cli.commands.collective import add_lowering, lower_options
from compiler.cli.commands.lower import saved_schedule
from compiler.cli.common import ArgumentError, add_hw, emit_json, seconds, size_arg
from compiler.specs.units import format_size, format_time

HELP = "re-plan a schedule saved with --schedule-out after a link fails or slows (or the size changes)"


def configure(p) -> None:
    p.add_argument("schedule", metavar="SCHEDULE.json")
    add_hw(p)
    change = p.add_mutually_exclusive_group()
    change.add_argument("--fail-link", metavar="A-B", help="a link that failed, as `profiles show` names it "
                                                            "(3-nvswitch, nic2@0-netswitch, 0-1#2 for one of parallel links)")
    change.add_argument("--degrade", metavar="A-B=FRACTION", help="a link left with FRACTION of its bandwidth "
                                                                  "(nic0@0-netswitch=0.5)")
    p.add_argument("--size", type=size_arg, default=None, help="a new buffer size (default: the schedule's)")
    p.add_argument("--time-limit", type=seconds, default=20.0, metavar="S",
                   help="seconds for re-planning (default 20)")
    p.add_argument("-o", "--output", metavar="FILE.xml", help="XML file to write (default COLLECTIVE-PROFILE[-nN].xml)")
    p.add_argument("--schedule-out", metavar="FILE", help="write the new schedule as JSON (to re-plan it again)")
    add_lowering(p)
    p.add_argument("--json", action="store_true")
    p.set_defaults(run=run)


def changed_topology(topo, args):
    """(changed topology, changed (src, dst) pairs, what, field, description, link name, fraction,
    the pairs whose links changed: those of one of parallel links too, which stay usable)."""
    from compiler.model.linknames import degrade, fail, resolve
    if args.fail_link:
        which = resolve(topo, args.fail_link, "fail_link")
        touched = frozenset((topo.links[i].src, topo.links[i].dst) for i in which.link.links)
        pairs = frozenset() if which.parallel else touched
        return fail(topo, which), pairs, args.fail_link, "fail_link", f"{which.name} failed", which.name, None, \
            touched
    if args.degrade:
        name, _, frac = args.degrade.rpartition("=")
        if not name:
            raise ArgumentError(f"--degrade {args.degrade}: expected LINK=FRACTION (e.g. nic0@0-netswitch=0.5)")
        try:
            fraction = float(frac)
        except ValueError:
            raise ArgumentError(f"--degrade {args.degrade}: {frac!r} is not a number (the share of bandwidth left)") \
                from None
        which = resolve(topo, name, "degrade")
        changed = degrade(topo, which, fraction, "degrade")
        pairs = frozenset((topo.links[i].src, topo.links[i].dst) for i in which.link.links)
        return changed, pairs, args.degrade, "degrade", f"{which.name} at {fraction:g} of its bandwidth", which.name, \
            fraction, pairs
    return topo, frozenset(), "", "size", "no link changed", None, None, frozenset()


def link_checks(topo, schedule, metrics, pairs) -> dict:
    """What the simulator's timing says each changed link carries: transfers on it, the most at
    once (against its parallel count) and the fastest rate (against its bandwidth)."""
    out = {}
    for a, b in sorted(pairs):
        if not topo.has_link(a, b):
            used = sum(1 for t in schedule.transfers if (a, b) in zip(t.path, t.path[1:]))
            out[f"{topo.vertex_name(a)}->{topo.vertex_name(b)}"] = {"failed": True, "transfers": used}
            continue
        link = topo.link(a, b)
        spans, rate = [], 0.0
        for t, start in zip(schedule.transfers, metrics.starts):
            if (a, b) in zip(t.path, t.path[1:]):
                bw = topo.path_bandwidth(t.path)
                spans.append((start, start + schedule.demand.chunk_bytes / bw))
                rate = max(rate, bw)
        events = sorted([(s, 1) for s, _ in spans] + [(e, -1) for _, e in spans])
        peak = cur = 0
        for _, d in events:
            cur += d
            peak = max(peak, cur)
        out[f"{topo.vertex_name(a)}->{topo.vertex_name(b)}"] = {
            "failed": False, "transfers": len(spans), "most_at_once": peak, "count": link.count,
            "fastest_Bps": rate, "bandwidth_Bps": link.bandwidth,
            "within_capacity": peak <= link.count and rate <= link.bandwidth * (1 + 1e-9)}
    return out


def run(args) -> int:
    from compiler.analysis.simulate import simulate
    from compiler.fileio import check_writable, distinct_outputs
    from compiler.pipeline import CompileOptions, compile_schedule
    from compiler.replan import ReplanOptions, replan
    from compiler.specs.errors import CompileError
    # --schedule-out may replace the schedule read (re-planning it again, in place): -o may not
    distinct_outputs([("-o", args.output), ("--schedule-out", args.schedule_out)])
    distinct_outputs([("-o", args.output)], [("", args.schedule)])
    if args.output:
        check_writable(args.output, "-o")
    if args.schedule_out:
        check_writable(args.schedule_out, "--schedule-out")
    if not (args.fail_link or args.degrade or args.size):
        raise ArgumentError("replan: nothing changed: give --fail-link A-B, --degrade A-B=FRACTION or --size S")
    old, topo = saved_schedule(args, check=True)
    changed, pairs, what, field, description, link, fraction, touched = changed_topology(topo, args)
    new = replan(old, changed, ReplanOptions(pairs, what, field, args.size, args.time_limit, lowering=lower_options(args),
                                             fraction=fraction, runtime=args.runtime))
    # the program written is the one the candidates were judged by (realised once, within the time limit)
    result = compile_schedule(changed, new.schedule, CompileOptions(lower=lower_options(args), runtime=args.runtime,
                                                                    output=args.output), new.realisation)
    from compiler.cli.commands.collective import write
    write(result, args.schedule_out)
    proto = result.program.proto if result.program is not None else None  # old and new planned alike
    old_time = simulate(topo, old, proto).finish_time_s
    try:
        old_changed = simulate(changed, replace_size(old, new.schedule.demand), proto).finish_time_s
    except CompileError:
        old_changed = None  # the old schedule uses a link that is gone
    out = {**result.summary(), "schedule": args.schedule_out,
           "change": {"kind": field.replace("_link", ""), "link": link, "fraction": fraction, "size_bytes": args.size,
                      "description": description},
           "replan_time_s": new.replan_time_s, "kept_transfers": new.kept, "dropped_transfers": new.dropped,
           "rerouted_deliveries": new.rerouted,
           "candidates": [{"label": label, "program_time_s": t, "why_not": why} for label, t, why in new.judged],
           "old": {"file": args.schedule, "planner": old.planner, "solve_time_s": old.solve_time, "time_s": old_time,
                   "time_on_changed_s": old_changed},
           "checks": {"simulated_on": changed.name + f" with {description}", "links": link_checks(
               changed, new.schedule, result.planned, touched)}}
    if args.json:
        emit_json(out)
    else:
        print_summary(out, result)
    return 0


def replace_size(old, demand):
    from dataclasses import replace
    return replace(old, demand=demand)


def print_summary(out: dict, result) -> None:
    o, c = out["old"], out["change"]
    print(f"{out['collective']} on {result.topology.name} ({out['ngpus']} GPUs), {format_size(out['size_bytes'])}: "
          f"{c['description']}")
    was = f"{format_time(o['time_s'])} planned in {o['solve_time_s']:.2f} s by {o['planner']}"
    now = "unusable (it uses the failed link)" if o["time_on_changed_s"] is None else \
        f"{format_time(o['time_on_changed_s'])} on the changed topology"
    print(f"old schedule: {was}; {now}")
    print(f"re-planned in {out['replan_time_s']:.2f} s: {format_time(out['planned_transfer_time_s'])} planned "
          f"({out['kept_transfers']} transfers kept, {out['dropped_transfers']} dropped, "
          f"{out['rerouted_deliveries']} deliveries routed anew)"
          + (f"; as a program {format_time(out['transfer_time_s'])}" if result.program is not None else ""))
    for name, chk in out["checks"]["links"].items():
        if chk["failed"]:
            print(f"  check {name}: failed link, used by {chk['transfers']} transfers (simulated on the changed topology)")
        else:
            print(f"  check {name}: {chk['transfers']} transfers, at most {chk['most_at_once']} at once "
                  f"(count {chk['count']}), {chk['fastest_Bps'] / 1e9:g} GB/s at most (bandwidth "
                  f"{chk['bandwidth_Bps'] / 1e9:g} GB/s)")
    for note in result.schedule.notes:
        print(f"  {note}")
    if out.get("xml"):
        print(f"wrote {', '.join(out['xml_files'])} (verified for {'/'.join(out['verified_for'])})")
    if out.get("schedule"):
        print(f"schedule written to {out['schedule']}")
