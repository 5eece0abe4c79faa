"""The msccl-compile command line. The one place that wires compiler/ and backends/ together.

Every subcommand is a function registered in COMMANDS; every error a user can cause is a
CompileError, printed as one line with exit status 2.
"""

from __future__ import annotations

import os
import signal
import sys


def _exit_interrupted(signum=None, frame=None) -> None:
    """Ctrl-C or SIGTERM: staged outputs are already gone (fileio.outputs); leave now, without
    waiting for a solver thread or worker processes to wind down."""
    try:
        sys.stdout.flush()
    except (OSError, ValueError):
        pass
    print(f"{PROG}: interrupted", file=sys.stderr, flush=True)
    os._exit(130)


PROG = "msccl-compile"
if __name__ == "__main__" or os.path.basename(sys.argv[0]) == PROG:  # run as the program: while the rest is
    # imported, a signal just ends the process (main() then turns signals into KeyboardInterrupt)
    signal.signal(signal.SIGINT, _exit_interrupted)
    signal.signal(signal.SIGTERM, _exit_interrupted)

import argparse  # noqa: E402
import re  # noqa: E402
import json  # noqa: E402
import threading  # noqa: E402
from collections import Counter
from typing import TYPE_CHECKING

from compiler import __version__  # noqa: E402
from compiler.specs.collectives import COLLECTIVES, CUSTOM, SPECS, spellings
from compiler.specs.errors import CompileError
from compiler.fileio import outputs
from compiler.model.program import PROTOCOLS
from compiler.specs.runtimes import CHOICES as RUNTIMES
from compiler.specs.units import DTYPE_BYTES, format_size, format_time, parse_size

if TYPE_CHECKING:
    from compiler.model.topology import Topology



class ArgumentError(CompileError):
    pass


class Parser(argparse.ArgumentParser):
    """argparse, but a usage error is one line and exit status 2."""

    def error(self, message):  # noqa: D401 - argparse API
        sub = self.prog[len(PROG):].strip()
        raise ArgumentError(f"{sub}: {message}" if sub else message)


COMMANDS: dict[str, tuple] = {}  # name -> (configure(parser), run(args), help)


def command(name: str, help: str):
    def register(fn):
        COMMANDS[name] = (fn, help)
        return fn
    return register


def add_hw(p) -> None:
    p.add_argument("--hw", required=True, metavar="NAME|FILE", help="hardware profile name, NAME:N, or a profile JSON file")
    p.add_argument("--nodes", type=positive_int, default=1, help="number of nodes (default 1)")


def number(kind, minimum):
    """An argparse type: `kind` (int or float) no smaller than `minimum`, with a one-line error."""
    def parse(text: str):
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"{text!r} is not a {'whole number' if kind is int else 'number'}") from None
        if not value >= minimum:
            raise argparse.ArgumentTypeError(f"{text!r} must be >= {minimum}")
        return value
    return parse


positive_int = number(int, 1)
non_negative_float = number(float, 0.0)


def size_range_arg(text: str) -> tuple[int, int]:
    from compiler.specs.units import parse_size_range
    try:
        return parse_size_range(text, field="")
    except CompileError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def size_arg(text: str) -> int:
    try:
        return parse_size(text, field="")
    except CompileError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


# Imported when a command needs them: `--help` and argument errors stay fast (no numpy, scipy,
# networkx or jsonschema at start-up).
def load_topology(spec: str, nodes: int = 1) -> "Topology":
    from compiler.model.profiles import load_topology as load
    return load(spec, nodes)


def lower_bound(topo, collective, size, root=None):
    from compiler.analysis.bounds import lower_bound as bound
    return bound(topo, collective, size, root)


def busbw(collective: str, ngpus: int, algbw: float) -> float:
    from compiler.analysis.bounds import busbw as bus
    return bus(collective, ngpus, algbw)


def emit_json(obj) -> None:
    print(json.dumps(obj, indent=2, sort_keys=True))


# ---- profiles -------------------------------------------------------------------------------------


def _link_summary(topo: Topology) -> list[str]:
    """Links grouped by kind; direct GPU pairs listed (they are the topology)."""
    lines = []
    pairs = []
    groups: Counter = Counter()
    for l in topo.links:
        a, b = topo.is_gpu(l.src), topo.is_gpu(l.dst)
        if a and b:
            if l.src < l.dst:
                back = topo.has_link(l.dst, l.src)
                pairs.append(f"{l.src}{'-' if back else '->'}{l.dst}{'' if l.count == 1 else f' x{l.count}'}")
            groups[("GPU <-> GPU" if topo.has_link(l.dst, l.src) else "GPU -> GPU", l.bandwidth, l.alpha, l.count)] += 1
        else:
            kind = lambda v: "GPU" if topo.is_gpu(v) else {"switch": "switch", "nic": "NIC", "network": "network"}[topo.switch(v).kind]
            groups[(f"{kind(l.src)} -> {kind(l.dst)}", l.bandwidth, l.alpha, l.count)] += 1
    for (kind, bw, alpha, count), k in sorted(groups.items(), key=lambda x: (x[0][0], -x[0][1], x[0][3])):
        par = f" x {count} parallel" if count > 1 else ""
        lines.append(f"  {k:4d} x {kind:<18} {bw / 1e9:g} GB/s{par}, alpha {alpha * 1e6:g} us")
    if pairs:
        lines.append("  GPU pairs: " + ", ".join(pairs))
    return lines


def _profile_info(topo: Topology, size: int) -> dict:
    ingress = [topo.ingress(g) for g in range(topo.ngpus)]
    egress = [topo.egress(g) for g in range(topo.ngpus)]
    bounds = {}
    for coll in ("allgather", "alltoall"):
        b = lower_bound(topo, coll, size)
        algbw = size / b.time_s
        bounds[coll] = {**b.to_dict(), "algbw_GBps": algbw / 1e9, "busbw_GBps": busbw(coll, topo.ngpus, algbw) / 1e9}
    return {
        "name": topo.name, "profile": topo.profile, "nodes": topo.nodes, "ngpus": topo.ngpus,
        "gpus_per_node": topo.gpus_per_node, "gpu_model": topo.gpu_model, "sms": topo.sms, "vendor": topo.vendor,
        "switches": [s.name for s in topo.switches],
        "multicast_switches": [s.name for s in topo.switches if s.multicast],
        "links": len(topo.links),
        "ingress_GBps": {"min": min(ingress) / 1e9, "max": max(ingress) / 1e9},
        "egress_GBps": {"min": min(egress) / 1e9, "max": max(egress) / 1e9},
        "nics": [{"node": n.node, "gpus": list(n.gpus), "bandwidth_GBps": n.bandwidth / 1e9, "alpha_us": n.alpha * 1e6}
                 for n in topo.nics],
        "bound_size_bytes": size,
        "bounds": bounds,
        "sources": dict(topo.sources),
        "topology": topo.to_dict(),
    }


def cmd_profiles(args) -> int:
    if args.action in (None, "list"):
        from compiler.model.profiles import list_profiles
        infos = list_profiles()
        if args.json:
            emit_json([{"name": p.name, "ngpus": p.ngpus, "aliases": list(p.aliases), "description": p.description,
                        "file": p.origin} for p in infos])
            return 0
        width = max(len(p.name) for p in infos)
        for p in infos:
            print(f"{p.name:<{width}}  {p.ngpus:3d} GPUs  {p.description}")
        print(f"{'NAME:N':<{width}}    N GPUs  synthetic: fully-connected, ring, line, star, hub-and-spoke (e.g. ring:8)")
        return 0
    if args.action != "show" or not args.name:
        raise ArgumentError(f"profiles: expected 'profiles' or 'profiles show NAME' (got {' '.join(filter(None, [args.action, args.name]))!r})")
    topo = load_topology(args.name, args.nodes)
    info = _profile_info(topo, args.size)
    if args.json:
        emit_json(info)
        return 0
    nodes = f" x {topo.nodes} nodes" if topo.nodes > 1 else ""
    print(f"{topo.profile}{nodes}: {topo.ngpus} GPUs ({topo.gpu_model}, {topo.sms} SMs/CUs each)")
    sw = [s for s in topo.switches if s.kind == "switch"]
    print(f"switches: {len(sw)} GPU switch{'es' if len(sw) != 1 else ''}"
          + (f" ({', '.join(s.name for s in sw[:4])}{', ...' if len(sw) > 4 else ''})" if sw else "")
          + (f"; multicast: {', '.join(info['multicast_switches'])}" if info["multicast_switches"] else "")
          + (f"; {sum(1 for s in topo.switches if s.kind == 'nic') // 2} NICs and one network switch" if topo.nodes > 1 else ""))
    print(f"links: {len(topo.links)} directed")
    for line in _link_summary(topo):
        print(line)
    ig, eg = info["ingress_GBps"], info["egress_GBps"]
    rng = lambda r: f"{r['min']:g}" if r["min"] == r["max"] else f"{r['min']:g}..{r['max']:g}"
    print(f"per GPU: ingress {rng(ig)} GB/s, egress {rng(eg)} GB/s")
    if topo.nics:
        per_node = [n for n in topo.nics if n.node == 0]
        serve = "; ".join(f"NIC {n.index}: GPUs {','.join(map(str, n.gpus))}" for n in per_node)
        print(f"NICs per node: {len(per_node)} x {per_node[0].bandwidth / 1e9:g} GB/s, alpha {per_node[0].alpha * 1e6:g} us ({serve})")
    for coll, b in info["bounds"].items():
        print(f"{coll} bound at {format_size(args.size)}: {format_time(b['time_s'])} "
              f"(algbw <= {b['algbw_GBps']:.2f} GB/s, busbw <= {b['busbw_GBps']:.2f} GB/s; {b['binding']})")
    for key, text in topo.sources:
        print(f"source ({key}): {text}")
    return 0


def cmd_bound(args) -> int:
    topo = load_topology(args.hw, args.nodes)
    b = lower_bound(topo, args.collective, args.size, args.root)
    algbw = args.size / b.time_s
    out = {**b.to_dict(), "hw": topo.profile, "nodes": topo.nodes, "ngpus": topo.ngpus,
           "algbw_GBps": algbw / 1e9, "busbw_GBps": busbw(b.collective, topo.ngpus, algbw) / 1e9}
    if args.json:
        emit_json(out)
    else:
        print(f"{b.collective} on {topo.name} ({topo.ngpus} GPUs) at {format_size(args.size)}: >= {format_time(b.time_s)} "
              f"(bandwidth {format_time(b.bandwidth_s)} + alpha {format_time(b.alpha_s)}; latency {format_time(b.latency_s)})")
        print(f"algbw <= {out['algbw_GBps']:.2f} GB/s, busbw <= {out['busbw_GBps']:.2f} GB/s; binding: {b.binding} ({b.method})")
    return 0


# ---- collectives ----------------------------------------------------------------------------------


class Progress:
    """One-line progress reports on stderr, only when stderr is a terminal and after a few seconds."""

    def __init__(self, enabled: bool):
        import time
        self.enabled = enabled
        self.t0 = time.perf_counter()

    def __call__(self, message: str) -> None:
        import time
        elapsed = time.perf_counter() - self.t0
        if self.enabled and elapsed >= 2.0:
            print(f"[{elapsed:6.1f}s] {message}", file=sys.stderr, flush=True)


def build_demand(args, topo: Topology, warnings: list[str]):
    from compiler.model.demand import demand_counts, load_custom_demand, make_demand
    if args.collective == "custom":
        if not args.demand:
            raise ArgumentError("custom: --demand FILE is required")
        make = lambda size: load_custom_demand(args.demand, topo.ngpus, size, args.chunks or 1)  # noqa: E731
    else:
        require_memory(args.collective, topo.ngpus, *demand_counts(args.collective, topo.ngpus, args.chunks or 1))
        make = lambda size: make_demand(args.collective, topo.ngpus, size, args.chunks or 1, args.root)  # noqa: E731
    demand = make(args.size)
    size = whole_elements(demand, args.dtype, args.size)
    if size != args.size:
        warnings.append(f"--size {args.size}B rounded down to {size}B: each of its {round(args.size / demand.chunk_bytes)} "
                        f"chunks must hold whole {args.dtype} elements")
        demand = make(size)
    return demand


def whole_elements(demand, dtype: str, size: int) -> int:
    """The largest size <= `size` whose chunks hold whole elements; CompileError below one element
    per chunk (the runtime splits a buffer into nchunksperloop pieces of whole elements)."""
    elem = DTYPE_BYTES[dtype]
    pieces = round(size / demand.chunk_bytes)
    least = pieces * elem
    if size < least:
        raise ArgumentError(f"--size: {format_size(size)} is below the minimum of {least}B for {demand.collective} on "
                            f"{demand.ngpus} GPUs: {pieces} chunks of at least one {elem}-byte {dtype} element")
    return size - size % least


def plan_options(args):
    from compiler.planners import PlanOptions
    return PlanOptions(method=args.method, time_limit=args.time_limit, gap=args.gap, max_horizon=args.max_horizon,
                       multicast=args.multicast, verbose=args.verbose, refine=args.chunks is None,
                       element_bytes=DTYPE_BYTES[args.dtype],
                       progress=Progress(sys.stderr.isatty() and not args.verbose))


def default_xml_name(demand, topo: Topology) -> str:
    nodes = f"-n{topo.nodes}" if topo.nodes > 1 else ""
    return f"{demand.collective.replace('_', '-')}-{topo.profile.replace(':', '')}{nodes}.xml"


def refuse_unsupported(collective: str, runtime: str) -> None:
    """One line, before planning, when the runtime asked for has no `coll` for the collective."""
    from compiler.specs.runtimes import ALL, runtime as runtime_spec, target_runtimes
    if runtime == ALL or runtime_spec(runtime).accepts(collective):
        return
    has = ", ".join(target_runtimes(collective))
    why = ("only the old microsoft/msccl runtime has coll=\"custom\"" if collective == "custom"
           else f"its coll attribute has no {collective}")
    raise ArgumentError(f"--runtime: {runtime} cannot run {collective}: {why}; use --runtime {has} or all")


def lower_verified(schedule, topo: Topology, options, runtime: str):
    """Lower and verify for the runtimes the collective targets (verify.target_runtimes);
    (program, runtimes verified)."""
    from compiler.lowering.lower import lower
    from compiler.program.verify import verify
    from compiler.specs.runtimes import target_runtimes
    verified_for = target_runtimes(schedule.demand.collective, runtime)
    program = lower(schedule, topo, options)
    verdict = verify(program, runtime, demand=schedule.demand.split(options.instances), sms=topo.sms)
    if not verdict.ok:
        raise CompileError(f"internal: the lowered program failed verification for {'/'.join(verified_for)} "
                           f"({verdict.summary()}); please report this with --schedule-out")
    return program, verified_for


def write_program(program, path: str, runtime: str, verified_for) -> list[str]:
    """The XML, spelled for the runtime (executor/RCCL when 'all'), plus the legacy reduce_scatter
    twin when every runtime was asked for."""
    from backends.msccl_xml import save_xml
    spelling = verified_for[0] if len(verified_for) == 1 else "executor"  # executor and RCCL spell alike
    save_xml(program, path, spelling)
    written = [path]
    if program.collective == "reduce_scatter" and runtime == "all":
        legacy = path[:-4] + ".legacy.xml" if path.endswith(".xml") else path + ".legacy"
        save_xml(program, legacy, "old")
        written.append(legacy)
    return written


def lower_and_write(args, schedule, topo: Topology) -> dict:
    """Lower, verify, write the XML; returns the JSON fields."""
    from compiler.lowering.lower import LowerOptions
    from compiler.program.timing import call_bytes, time_program
    if any(t.group >= 0 for t in schedule.transfers):
        return {"xml": None, "verified": None,
                "xml_skipped": "switch multicast (NVLS) has no MSCCL XML form; plan without --multicast to get XML"}
    lo, hi = args.size_range if args.size_range else (0, 0)
    from compiler.specs.runtimes import target_runtimes
    aimed = target_runtimes(schedule.demand.collective, args.runtime)  # custom: the old runtime's limits
    options = LowerOptions(proto=args.proto, instances=args.instances, min_bytes=lo,
                           max_bytes=hi - 1 if hi else 0, runtime=aimed[0] if len(aimed) == 1 else args.runtime)
    program, verified_for = lower_verified(schedule, topo, options, args.runtime)
    path = args.output or default_xml_name(schedule.demand, topo)
    written = write_program(program, path, args.runtime, verified_for)
    size = schedule.demand.size_bytes
    if program.collective == "custom":
        size = call_bytes(program, demand_chunks(schedule.demand)[1])
    timing = time_program(program, topo, size)
    return {"xml": path, "xml_files": written, "verified": True, "runtime": args.runtime,
            "verified_for": list(verified_for),
            "nchannels": program.nchannels, "nthreadblocks_max": program.nthreadblocks_max,
            "nsteps_max": program.nsteps_max, "proto": program.proto,
            "program_time_s": timing.finish_time_s,
            "program_algbw_GBps": per_second(schedule.demand.size_bytes, timing.finish_time_s) / 1e9}


def per_second(nbytes: float, seconds: float) -> float:
    return nbytes / seconds if seconds > 0 else float("inf")


def demand_chunks(demand) -> tuple[int, float]:
    """(chunks of a custom demand as its file lists them, bytes of each): the planners may have
    cut each into demand.chunks_per_rank pieces."""
    n = max(1, len(demand.chunks) // demand.chunks_per_rank)
    each = demand.size_bytes / n
    return n, int(each) if float(each).is_integer() else each


def require_memory(collective: str, ngpus: int, chunks: int, endpoints: int, deliveries: int) -> None:
    from compiler.model import memory
    memory.require(memory.demand_bytes(chunks, endpoints, deliveries),
                   f"{collective} on {ngpus:,} GPUs ({deliveries:,} deliveries)")


def output_checks(args, warnings: list[str]) -> None:
    """What can be known before planning: the files can be written, the size fits the range."""
    from compiler.fileio import check_writable
    if not args.no_xml and args.output:
        check_writable(args.output, "-o")
    if args.schedule_out:
        check_writable(args.schedule_out, "--schedule-out")
    if args.size_range and not args.size_range[0] <= args.size < args.size_range[1]:
        lo, hi = args.size_range
        warnings.append(f"--size {format_size(args.size)} is outside --size-range {format_size(lo)}:{format_size(hi)}: "
                        "the runtime will not use this file for the size it was planned for")


def cmd_collective(args) -> int:
    from compiler.planners import plan
    from compiler.analysis.simulate import simulate
    warnings: list[str] = []
    output_checks(args, warnings)
    if not args.no_xml:
        refuse_unsupported(args.collective, args.runtime)
    topo = load_topology(args.hw, args.nodes)
    demand = build_demand(args, topo, warnings)
    for w in warnings:
        print(f"{PROG}: warning: {w}", file=sys.stderr)
    schedule = plan(topo, demand, plan_options(args))
    demand = schedule.demand  # auto may have cut the chunks finer
    metrics = simulate(topo, schedule)
    xml = {"xml": None, "verified": None} if args.no_xml else lower_and_write(args, schedule, topo)
    if args.schedule_out:
        schedule.save(args.schedule_out)
    out = {
        "collective": demand.collective, "hw": topo.profile, "nodes": topo.nodes, "ngpus": topo.ngpus,
        "size_bytes": demand.size_bytes, "chunks": demand.chunks_per_rank, "method": schedule.planner,
        "requested_method": args.method, "status": schedule.status, "gap": schedule.gap,
        "solve_time_s": schedule.solve_time, "epochs": schedule.epochs, "epoch_s": schedule.tau,
        "transfer_time_s": metrics.finish_time_s, "algbw_GBps": metrics.algbw / 1e9,
        "busbw_GBps": metrics.busbw / 1e9, "lower_bound_s": metrics.lower_bound_s,
        "bound_ratio": metrics.bound_ratio, "output_buffer_bytes": metrics.output_buffer_bytes,
        "scratch_bytes": metrics.scratch_bytes, "ntransfers": len(schedule.transfers),
        "lp_value_s": schedule.lp_value, "notes": list(schedule.notes),
        "schedule": args.schedule_out, "warnings": warnings, **xml,
    }
    if demand.collective == "custom":
        out["demand_chunks"], out["chunk_size_bytes"] = demand_chunks(demand)
    if args.json:
        emit_json(out)
        return 0
    gap = f", gap {schedule.gap:.2%}" if schedule.gap is not None else ""
    print(f"{demand.collective} on {topo.name} ({topo.ngpus} GPUs), {size_line(demand)}")
    print(f"method {schedule.planner} ({schedule.status}{gap}), planned in {schedule.solve_time:.2f} s, "
          f"{len(schedule.transfers)} transfers over {schedule.epochs} epochs of {format_time(schedule.tau)}")
    if schedule.lp_value is not None:
        print(f"LP value {format_time(schedule.lp_value)}; rounded schedule below")
    print(f"time {format_time(metrics.finish_time_s)}: algbw {metrics.algbw / 1e9:.2f} GB/s, "
          f"busbw {metrics.busbw / 1e9:.2f} GB/s")
    print(f"lower bound {format_time(metrics.lower_bound_s)}: {metrics.bound_ratio:.3f} of the bound; "
          f"output buffer {format_size(metrics.output_buffer_bytes)} per rank"
          + (f", scratch {format_size(metrics.scratch_bytes)}" if metrics.scratch_bytes else ""))
    for note in schedule.notes:
        print(f"  {note}")
    if xml.get("xml"):
        print(f"wrote {', '.join(xml['xml_files'])} (verified for {'/'.join(xml['verified_for'])}; {xml['nchannels']} "
              f"channel{'s' if xml['nchannels'] > 1 else ''}, up to {xml['nthreadblocks_max']} thread blocks and "
              f"{xml['nsteps_max']} steps per block); as a program: {format_time(xml['program_time_s'])}, "
              f"algbw {xml['program_algbw_GBps']:.2f} GB/s")
    elif xml.get("xml_skipped"):
        print(f"no XML: {xml['xml_skipped']}")
    if args.schedule_out:
        print(f"schedule written to {args.schedule_out}")
    return 0


def size_line(demand) -> str:
    """'1MB, 2 chunks per rank'; for a custom demand '64MB per chunk, 2 chunks (128MB in all)'."""
    k = demand.chunks_per_rank
    if demand.collective != "custom":
        return f"{format_size(demand.size_bytes)}, {k} chunk{'s' if k > 1 else ''} per rank"
    n, each = demand_chunks(demand)
    cut = f", each cut into {k} pieces" if k > 1 else ""
    total = format_size(demand.size_bytes)
    return f"{format_size(each)} per chunk, {n} chunk{'s' if n > 1 else ''} ({total} in all){cut}"


def cmd_verify(args) -> int:
    from backends.msccl_xml import read_xml
    from compiler.model.demand import load_custom_demand
    from compiler.program.verify import verify
    program = read_xml(args.file)
    demand = None
    if args.demand:  # cut into the pieces the file's own demand has, if it has one
        pieces = program.demand.chunks_per_rank if program.demand is not None else 1
        demand = load_custom_demand(args.demand, program.ngpus, program.nchunksperloop, pieces)
    verdict = verify(program, args.runtime, demand=demand)
    judged = "/".join(verdict.runtimes)
    if judged != args.runtime:
        judged += f" (the runtime{'s' if len(verdict.runtimes) > 1 else ''} with coll={program.collective})"
    if args.json:
        emit_json({"file": args.file, "verified": verdict.ok, "runtime": args.runtime,
                   "runtimes": list(verdict.runtimes), "demand": "--demand" if args.demand else
                   "embedded" if program.demand is not None else None,
                   "collective": program.collective, "ngpus": program.ngpus,
                   "findings": [{"rule": f.rule, "rank": f.rank, "tb": f.tb, "step": f.step, "message": f.message}
                                for f in verdict.findings]})
    else:
        if verdict.ok:
            print(f"{args.file}: correct for runtime {judged}: {program.collective}, {program.ngpus} GPUs, "
                  f"{program.nthreadblocks_max} thread blocks, {program.nsteps_max} steps per block at most")
        else:
            print(f"{args.file}: {len(verdict.findings)} problem{'s' if len(verdict.findings) > 1 else ''} "
                  f"for runtime {judged}")
            for f in verdict.findings[:args.max_findings]:
                print(f"  [{f.rule}] {f.message}")
            if len(verdict.findings) > args.max_findings:
                print(f"  ... and {len(verdict.findings) - args.max_findings} more (--json lists all)")
    return 0 if verdict.ok else 1


def cmd_simulate(args) -> int:
    from backends.msccl_xml import read_xml
    from compiler.program.timing import call_bytes, time_program
    program = read_xml(args.file)
    topo = load_topology(args.hw, args.nodes)
    timing = time_program(program, topo, call_bytes(program, args.size))
    total, per_chunk = args.size, program.collective == "custom" and program.demand is not None
    if per_chunk:  # --size is one chunk of the demand
        total = args.size * demand_chunks(program.demand)[0]
    out = {"file": args.file, "hw": topo.profile, "nodes": topo.nodes, "ngpus": topo.ngpus,
           "collective": program.collective, "size_bytes": total, "time_s": timing.finish_time_s,
           "algbw_GBps": per_second(total, timing.finish_time_s) / 1e9, "ntransfers": timing.ntransfers}
    if program.collective in COLLECTIVES:
        bound = lower_bound(topo, program.collective, args.size)
        out.update(busbw_GBps=busbw(program.collective, topo.ngpus, timing.algbw) / 1e9,
                   lower_bound_s=bound.time_s, bound_ratio=bound.time_s / timing.finish_time_s)
    if args.json:
        emit_json(out)
        return 0
    at = format_size(args.size) + (" per chunk" if per_chunk else "")
    print(f"{args.file}: {program.collective} on {topo.name} ({topo.ngpus} GPUs) at {at}: "
          f"{format_time(timing.finish_time_s)}, algbw {out['algbw_GBps']:.2f} GB/s"
          + (f", busbw {out['busbw_GBps']:.2f} GB/s; {out['bound_ratio']:.3f} of the lower bound "
             f"{format_time(out['lower_bound_s'])}" if "bound_ratio" in out else ""))
    return 0




def add_collective(p, name: str) -> None:
    from compiler.planners import METHODS
    add_hw(p)
    p.add_argument("--size", type=size_arg, default=10**9,
                   help="buffer size as nccl-tests counts it (allgather: whole output; alltoall: whole send buffer); "
                        "B, KB/MB/GB, KiB/MiB/GiB (default 1GB)")
    p.add_argument("--chunks", type=positive_int, default=None,
                   help="chunks per rank (default: auto tries 1, 2, 4 and 8 and keeps the fastest; other methods 1)")
    if name in SPECS and SPECS[name].rooted:
        p.add_argument("--root", type=int, default=None, help="root rank (default 0)")
    p.add_argument("--dtype", choices=tuple(DTYPE_BYTES), default="float32",
                   help="element type: a chunk is whole elements (default float32)")
    p.add_argument("--method", choices=METHODS, default="auto")
    p.add_argument("--time-limit", type=non_negative_float, default=60.0, metavar="S",
                   help="seconds for planning (default 60)")
    p.add_argument("--gap", type=non_negative_float, default=1e-4, metavar="G",
                   help="relative MIP gap to stop at (default 1e-4)")
    p.add_argument("--max-horizon", type=positive_int, default=None, metavar="K",
                   help="cap on epochs (the horizon is otherwise found from the lower bound)")
    p.add_argument("--multicast", action="store_true",
                   help="let switches marked multicast copy (NVLS); such schedules are simulated, not lowered")
    p.add_argument("--schedule-out", metavar="FILE", help="write the schedule as JSON")
    if name == "custom":
        p.add_argument("--demand", metavar="FILE", help="the demand: JSON {\"chunks\": [{\"from\": 0, \"to\": [1]}]}")
    p.add_argument("--verbose", action="store_true", help="forward the solver log to stderr")
    p.add_argument("-o", "--output", metavar="FILE", help="XML file to write (default COLLECTIVE-PROFILE[-nN].xml)")
    p.add_argument("--no-xml", action="store_true", help="plan and simulate only")
    p.add_argument("--proto", choices=PROTOCOLS, default="Simple", help="MSCCL protocol (default Simple)")
    p.add_argument("--instances", type=positive_int, default=1,
                   help="copies of the algorithm on separate channels, each on 1/N of every chunk")
    p.add_argument("--size-range", type=size_range_arg, metavar="LO:HI",
                   help="sizes [LO, HI) the runtime may use this file for (minBytes/maxBytes)")
    p.add_argument("--runtime", choices=RUNTIMES, default="all",
                   help="runtime whose limits to meet: executor (msccl-executor-nccl), old (microsoft/msccl), "
                        "rccl, or all (default)")
    p.add_argument("--json", action="store_true")
    p.set_defaults(run=cmd_collective, collective=name, root=None, demand=None)


# ---- training integration: env, run, library, bench ----------------------------------------------


def cmd_env(args) -> int:
    from backends.torch_dist import export_lines, msccl_env
    env = msccl_env(args.runtime, args.path, args.world_size)
    if args.json:
        emit_json(env)
    else:
        print("\n".join(export_lines(env)))
    return 0


def cmd_run(args) -> int:
    from backends.torch_dist import parse_dtype, run_local
    result = run_local(args.file, args.nprocs, args.size, parse_dtype(args.dtype), seed=args.seed,
                       inplace=args.inplace, timeout=args.timeout, op=args.op, iters=args.iters)
    if args.json:
        emit_json(result.to_dict())
    else:
        print(result.summary())
    return 0 if result.correct else 1


def size_bands(lo: int, hi: int, factor: int) -> list[tuple[int, int]]:
    """[lo, hi] cut at lo * factor**k into inclusive bands [a, b] with no gap and no overlap."""
    edges = [lo]
    while edges[-1] * factor < hi:
        edges.append(edges[-1] * factor)
    return [(a, (edges[i + 1] - 1) if i + 1 < len(edges) else hi) for i, a in enumerate(edges)]


def band_protocol(topo: Topology, hi: int) -> str:
    """LL for small messages, LL128 for medium ones where NCCL trusts it (NVLink), Simple above."""
    if hi <= 256 * 1024:
        return "LL"
    if hi <= 4 * 1024 * 1024 and topo.vendor == "nvidia":
        return "LL128"
    return "Simple"


def cmd_library(args) -> int:
    import math
    from pathlib import Path
    from compiler.model.demand import make_demand
    from compiler.specs.collectives import canonical
    from compiler.fileio import atomic_write, check_writable, make_directory, remove_later
    from compiler.lowering.lower import LowerOptions
    from compiler.planners import PlanOptions, plan
    from compiler.analysis.simulate import simulate
    topo = load_topology(args.hw, args.nodes)
    colls = [canonical(c) for c in args.collectives.split(",") if c.strip()]
    if not colls:
        raise ArgumentError("library: --collectives: give at least one, e.g. allgather,allreduce")
    lo, hi = args.sizes
    bands = size_bands(lo, hi, args.band_factor)
    if args.runtime == "old" and len(bands) * len(colls) > 4:
        raise ArgumentError(f"library: the old runtime loads at most 4 algorithms; {len(colls)} collective(s) x "
                            f"{len(bands)} bands = {len(bands) * len(colls)}; raise --band-factor or narrow --sizes")
    out = Path(args.output)
    if out.exists() and any(p.is_file() for p in out.iterdir()) and not args.force:
        raise ArgumentError(f"library: {out} already holds files; the runtime would load them all (use --force "
                            "to replace the directory's XML files)")
    make_directory(out / "manifest")
    check_writable(out / "manifest" / "manifest.json", "-o")
    if args.force:
        for f in out.iterdir():
            if f.is_file() and f.name.endswith(".xml"):
                remove_later(f)
    entries = []
    progress = Progress(sys.stderr.isatty())
    for coll in colls:
        for i, (a, b) in enumerate(bands):
            size = int(math.sqrt(a * max(a, b)))  # plan at the band's geometric middle
            demand = make_demand(coll, topo.ngpus, size)
            n_chunks = demand.chunks_per_rank * (topo.ngpus if coll in ("allgather", "alltoall", "reduce_scatter",
                                                                         "allreduce") else 1)
            size = max(n_chunks * 4, size - size % (n_chunks * 4))
            demand = make_demand(coll, topo.ngpus, size)
            schedule = plan(topo, demand, PlanOptions(method=args.method, time_limit=args.time_limit,
                                                       refine=True, progress=progress))
            metrics = simulate(topo, schedule)
            proto = band_protocol(topo, b) if args.proto == "auto" else args.proto
            options = LowerOptions(proto=proto, min_bytes=a, max_bytes=b, runtime=args.runtime,
                                   name=f"{coll}-{topo.name}-{format_size(a)}-{format_size(b)}")
            program, verified_for = lower_verified(schedule, topo, options, args.runtime)
            name = f"{coll.replace('_', '-')}-{i:02d}-{format_size(a)}-{format_size(b)}.xml"
            write_program(program, str(out / name), args.runtime, verified_for)
            entries.append({"file": name, "collective": coll, "min_bytes": a, "max_bytes": b, "planned_at_bytes": size,
                            "method": schedule.planner, "chunks": schedule.demand.chunks_per_rank, "proto": proto,
                            "time_s": metrics.finish_time_s, "algbw_GBps": metrics.algbw / 1e9,
                            "bound_ratio": metrics.bound_ratio, "why": list(schedule.notes[:2]),
                            "inplace": program.inplace, "outofplace": program.outofplace})
            if not args.json:
                print(f"{name}: {format_size(a)}..{format_size(b)}, {proto}, {schedule.planner} with "
                      f"{schedule.demand.chunks_per_rank} chunk(s): {metrics.algbw / 1e9:.2f} GB/s at "
                      f"{format_size(size)} ({metrics.bound_ratio:.3f} of the bound)", flush=True)
    manifest = {"format": "msccl-compile/library-v1", "hw": topo.profile, "nodes": topo.nodes, "ngpus": topo.ngpus,
                "runtime": args.runtime, "sizes": [lo, hi], "algorithms": entries}
    atomic_write(out / "manifest" / "manifest.json", json.dumps(manifest, indent=1) + "\n")
    if args.json:
        emit_json(manifest)
    else:
        print(f"wrote {len(entries)} algorithm(s) to {out}/ and the manifest to {out}/manifest/manifest.json "
              f"(the runtime skips subdirectories); load with: msccl-compile env {out} --runtime {args.runtime}")
    return 0


@command("env", "print the environment that loads a directory of algorithms into a runtime")
def _env(p):
    p.add_argument("path", metavar="DIR", help="algorithm directory (a file or directory for --runtime old)")
    p.add_argument("--runtime", choices=("executor", "old", "rccl"), default="executor")
    p.add_argument("--world-size", type=positive_int, help="refuse files for another GPU count")
    p.add_argument("--json", action="store_true")
    p.set_defaults(run=cmd_env)


@command("run", "run an XML on N local processes (gloo) and compare with torch's own collective (custom: its demand)")
def _run(p):
    p.add_argument("file", metavar="FILE.xml")
    p.add_argument("--nprocs", type=positive_int, required=True)
    p.add_argument("--size", type=size_arg, default=2**20,
                   help="size as nccl-tests counts it; for a custom file, one chunk of its demand (default 1MiB)")
    p.add_argument("--dtype", default="float32")
    p.add_argument("--op", default="sum", choices=("sum", "prod", "max", "min"))
    p.add_argument("--inplace", action="store_true", help="call the collective in place")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--iters", type=positive_int, default=3)
    p.add_argument("--timeout", type=non_negative_float, default=60.0, help="seconds per run")
    p.add_argument("--json", action="store_true")
    p.set_defaults(run=cmd_run)


@command("library", "plan a size-banded algorithm library for a system and write it as a directory")
def _library(p):
    add_hw(p)
    p.add_argument("--collectives", default="allgather,allreduce", help="comma-separated (default allgather,allreduce)")
    p.add_argument("--sizes", type=size_range_arg, default=(1024, 2**30), metavar="LO:HI",
                   help="range of sizes covered, inclusive (default 1KiB:1GiB)")
    p.add_argument("--band-factor", type=positive_int, default=4,
                   help="each band spans this factor of sizes (default 4)")
    p.add_argument("--method", default="auto")
    p.add_argument("--time-limit", type=non_negative_float, default=10.0, metavar="S",
                   help="seconds of planning per band (default 10)")
    p.add_argument("--proto", choices=("auto",) + PROTOCOLS, default="auto",
                   help="auto: LL up to 256KiB, LL128 up to 4MiB on NVIDIA, Simple above")
    p.add_argument("--runtime", choices=("executor", "rccl", "old"), default="executor")
    p.add_argument("-o", "--output", required=True, metavar="DIR")
    p.add_argument("--force", action="store_true", help="replace XML files already in DIR")
    p.add_argument("--json", action="store_true")
    p.set_defaults(run=cmd_library)


@command("bench", "nccl-tests-style sweep: torch's collective and the MSCCL algorithm side by side")
def _bench(p):
    from backends.bench_options import configure  # torch-free: the parser is built for every command
    configure(p)
    p.set_defaults(run=cmd_bench)


def cmd_bench(args) -> int:
    from backends import bench
    return bench.run(args)


# ---- parser ---------------------------------------------------------------------------------------

@command("profiles", "list hardware profiles, or show one")
def _profiles(p):
    p.add_argument("action", nargs="?", choices=["list", "show"], help="list (default) or show one profile")
    p.add_argument("name", nargs="?", help="profile name or file")
    p.add_argument("--nodes", type=positive_int, default=1)
    p.add_argument("--size", type=size_arg, default=10**9, help="buffer size for the bounds (default 1GB)")
    p.add_argument("--json", action="store_true")
    p.set_defaults(run=cmd_profiles)


@command("bound", "lower bound of a collective on a profile")
def _bound(p):
    p.add_argument("collective", help=", ".join(COLLECTIVES))
    add_hw(p)
    p.add_argument("--size", type=size_arg, default=10**9)
    p.add_argument("--root", type=int, default=None)
    p.add_argument("--json", action="store_true")
    p.set_defaults(run=cmd_bound)


@command("verify", "check an MSCCL XML file: contract rules, deadlock under bounded slots, the result")
def _verify(p):
    p.add_argument("file", metavar="FILE.xml")
    p.add_argument("--runtime", choices=RUNTIMES, default="all")
    p.add_argument("--demand", metavar="FILE",
                   help="custom demand JSON (for coll=custom; overrides the demand the file carries)")
    p.add_argument("--max-findings", type=positive_int, default=20)
    p.add_argument("--json", action="store_true")
    p.set_defaults(run=cmd_verify)


@command("simulate", "time an MSCCL XML file (ours or another tool's) under the alpha-beta model")
def _simulate(p):
    p.add_argument("file", metavar="FILE.xml")
    add_hw(p)
    p.add_argument("--size", type=size_arg, default=10**9,
                   help="size as nccl-tests counts it; for a custom file, one chunk of its demand (default 1GB)")
    p.add_argument("--json", action="store_true")
    p.set_defaults(run=cmd_simulate)


def build_parser() -> Parser:
    parser = Parser(prog=PROG, description="Plan GPU collectives as traffic engineering and emit MSCCL XML.")
    parser.add_argument("--version", action="version", version=f"{PROG} {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=Parser)
    for name, (configure, help_text) in COMMANDS.items():
        configure(sub.add_parser(name, help=help_text, description=help_text))
    aliases: dict[str, list[str]] = {}
    for alias, name in spellings().items():
        if alias != name:
            aliases.setdefault(name, []).append(alias)
    for name in COLLECTIVES + (CUSTOM,):
        help_text = f"plan {name} and write it" if name != CUSTOM else "plan a custom demand (--demand FILE)"
        add_collective(sub.add_parser(name, aliases=aliases.get(name, []), help=help_text, description=help_text), name)
    return parser


def _unknown_command(argv: list[str]) -> str | None:
    first = next((a for a in argv if not a.startswith("-")), None)
    if first is None or first in COMMANDS:
        return None
    if first.lower() in spellings() or first == CUSTOM:
        return None
    return (f"unknown command or collective {first!r} "
            f"(collectives: {', '.join(COLLECTIVES)}; commands: {', '.join(c for c in COMMANDS if c not in COLLECTIVES)})")


# compiler/ names the option fields it complains about (`chunks=0: must be >= 1`, "raise
# `time_limit`"); the command line says them as its flags
FIELD_FLAGS = {"chunks": "--chunks", "size": "--size", "root": "--root", "time_limit": "--time-limit",
               "max_horizon": "--max-horizon", "gap": "--gap", "instances": "--instances", "proto": "--proto",
               "runtime": "--runtime", "method": "--method", "name": "--name", "min_bytes": "--size-range",
               "max_bytes": "--size-range", "inplace": "--inplace", "multicast": "--multicast", "nodes": "--nodes",
               "demand": "--demand", "dtype": "--dtype"}
_LEADING = re.compile(r"^([a-z_]+)(?:=([^:]*))?: ")
_QUOTED = re.compile(r"`([a-z_]+)(?:=([^`]*))?`")


def as_flags(message: str) -> str:
    """A compiler message with its field names said as this command line's flags."""
    def flag(m: re.Match, tail: str) -> str:
        name = FIELD_FLAGS.get(m.group(1))
        if name is None:
            return m.group(0)
        return name + (f" {m.group(2)}" if m.group(2) is not None else "") + tail
    message = _LEADING.sub(lambda m: flag(m, ": "), message, count=1)
    return _QUOTED.sub(lambda m: flag(m, ""), message)


def _terminate(signum, frame):
    raise KeyboardInterrupt


def join_negative_values(argv: list[str]) -> list[str]:
    """`--size -1MB` as `--size=-1MB`: argparse would read -1MB as an option and say only
    "expected one argument"; joined, the value reaches its parser, which says what is wrong."""
    out: list[str] = []
    for a in argv:
        prev = out[-1] if out else ""
        if a[:1] == "-" and a[1:2].isdigit() or a[:2] == "-.":
            if prev.startswith("--") and "=" not in prev and len(prev) > 2:
                out[-1] = f"{prev}={a}"
                continue
        out.append(a)
    return out


def unrecognized(args, extra: list[str]) -> str:
    sub = getattr(args, "command", None) or getattr(args, "collective", None)
    where = f"{sub}: " if sub else ""
    why = ""
    if "--root" in extra and getattr(args, "collective", None):
        why = f" ({args.collective} has no root; broadcast, reduce, scatter and gather have one)"
    elif "--demand" in extra and getattr(args, "collective", None):
        why = " (--demand is for the custom collective)"
    return f"{where}unrecognized arguments: {' '.join(extra)}{why}"


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, _terminate)
        signal.signal(signal.SIGINT, signal.default_int_handler)  # even where the shell ignored it (cmd &)
    try:
        unknown = _unknown_command(argv)
        if unknown:
            raise ArgumentError(unknown)
        for i, a in enumerate(argv):  # collective names are case-insensitive (Allgather, ReduceScatter)
            if not a.startswith("-"):
                if a not in COMMANDS and a.lower() in spellings():
                    argv[i] = spellings()[a.lower()]
                break
        parser = build_parser()
        args, extra = parser.parse_known_args(join_negative_values(argv))
        if extra:
            raise ArgumentError(unrecognized(args, extra))
        if not getattr(args, "run", None):
            parser.print_help()
            return 2
        with outputs():  # files are written when the command finishes, or not at all
            return args.run(args) or 0
    except CompileError as e:
        print(f"{PROG}: error: {as_flags(str(e))}", file=sys.stderr)
        return e.exit_status
    except KeyboardInterrupt:
        _exit_interrupted()
    except BrokenPipeError:
        return 0
    except Exception as e:  # a bug, not bad input: one line unless asked for the traceback
        if os.environ.get("MSCCL_COMPILE_DEBUG"):
            raise
        print(f"{PROG}: internal error: {type(e).__name__}: {e} (set MSCCL_COMPILE_DEBUG=1 for the traceback)",
              file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
