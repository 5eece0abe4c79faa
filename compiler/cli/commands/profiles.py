"""`msccl-compile profiles [show NAME]` and `msccl-compile bound COLLECTIVE --hw NAME`."""

from __future__ import annotations

from collections import Counter

from compiler.cli.common import ArgumentError, add_hw, busbw, emit_json, load_topology, lower_bound, positive_int, size_arg
from compiler.specs.collectives import COLLECTIVES
from compiler.specs.units import format_size, format_time

PROFILES_HELP = "list hardware profiles, or show one"
BOUND_HELP = "lower bound of a collective on a profile"
SHOWN_BOUNDS = COLLECTIVES[:2]  # `profiles show` gives the bound of these (allgather, alltoall)


def configure_profiles(p) -> None:
    p.add_argument("action", nargs="?", choices=["list", "show"], help="list (default) or show one profile")
    p.add_argument("name", nargs="?", help="profile name or file")
    p.add_argument("--nodes", type=positive_int, default=1)
    p.add_argument("--size", type=size_arg, default=10**9, help="buffer size for the bounds (default 1GB)")
    p.add_argument("--json", action="store_true")
    p.set_defaults(run=run_profiles)


def configure_bound(p) -> None:
    p.add_argument("collective", help=", ".join(COLLECTIVES))
    add_hw(p)
    p.add_argument("--size", type=size_arg, default=10**9)
    p.add_argument("--root", type=int, default=None)
    p.add_argument("--json", action="store_true")
    p.set_defaults(run=run_bound)


def _link_summary(topo) -> list[str]:
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


def _profile_info(topo, size: int) -> dict:
    from compiler.model.linknames import named_links
    ingress = [topo.ingress(g) for g in range(topo.ngpus)]
    egress = [topo.egress(g) for g in range(topo.ngpus)]
    bounds = {}
    # a node of one GPU (a profile meant for --nodes N) has no collective of its own to bound
    for coll in SHOWN_BOUNDS if topo.ngpus > 1 else ():
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
        "topology": {**topo.to_dict(), "links": [n.to_dict() for n in named_links(topo)]},
    }


def _name_lines(topo, width: int = 100) -> list[str]:
    """The links' names as `replan --fail-link/--degrade` takes them, wrapped."""
    from compiler.model.linknames import named_links
    words = [n.name + (f" (x{n.count}: {n.name}#1..#{n.count})" if n.count > 1 else "") for n in named_links(topo)]
    lines, line = [], "  names:"
    for w in words:
        if len(line) + len(w) + 2 > width:
            lines.append(line + ",")
            line = "   "
        line += (" " if line.endswith(":") or line == "   " else ", ") + w
    return lines + [line]


def run_profiles(args) -> int:
    if args.action in (None, "list") and args.name:  # `profiles list dgx1` listed them all, the name unread
        raise ArgumentError(f"profiles list: takes no name ({args.name!r}); use `profiles show {args.name}`")
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
    for line in _link_summary(topo) + _name_lines(topo):
        print(line)
    ig, eg = info["ingress_GBps"], info["egress_GBps"]
    rng = lambda r: f"{r['min']:g}" if r["min"] == r["max"] else f"{r['min']:g}..{r['max']:g}"
    print(f"per GPU: ingress {rng(ig)} GB/s, egress {rng(eg)} GB/s")
    if topo.nics:
        per_node = [n for n in topo.nics if n.node == 0]
        if len({(n.bandwidth, n.alpha) for n in per_node}) == 1:
            serve = "; ".join(f"NIC {n.index}: GPUs {','.join(map(str, n.gpus))}" for n in per_node)
            print(f"NICs per node: {len(per_node)} x {per_node[0].bandwidth / 1e9:g} GB/s, alpha {per_node[0].alpha * 1e6:g} us ({serve})")
        else:  # NICs of different speeds: each its own figures (the first NIC's stood for all of them)
            serve = "; ".join(f"NIC {n.index}: GPUs {','.join(map(str, n.gpus))}, {n.bandwidth / 1e9:g} GB/s, "
                              f"alpha {n.alpha * 1e6:g} us" for n in per_node)
            print(f"NICs per node: {len(per_node)} ({serve})")
    if not info["bounds"]:
        print("no collective bounds: one GPU (use --nodes N to join N of these nodes)")
    for coll, b in info["bounds"].items():
        print(f"{coll} bound at {format_size(args.size)}: {format_time(b['time_s'])} "
              f"(algbw <= {b['algbw_GBps']:.2f} GB/s, busbw <= {b['busbw_GBps']:.2f} GB/s; {b['binding']})")
    for key, text in topo.sources:
        print(f"source ({key}): {text}")
    return 0


def run_bound(args) -> int:
    topo = load_topology(args.hw, args.nodes)
    from compiler.analysis.simulate import program_floor
    b = lower_bound(topo, args.collective, args.size, args.root)
    algbw = args.size / b.time_s
    floor = program_floor(topo, b)  # what compile's, simulate's and report's bound_ratio divide by
    out = {**b.to_dict(), "hw": topo.profile, "nodes": topo.nodes, "ngpus": topo.ngpus,
           "algbw_GBps": algbw / 1e9, "busbw_GBps": busbw(b.collective, topo.ngpus, algbw) / 1e9,
           "program_floor_s": floor, "program_floor_algbw_GBps": args.size / floor / 1e9}
    if args.json:
        emit_json(out)
    else:
        print(f"{b.collective} on {topo.name} ({topo.ngpus} GPUs) at {format_size(args.size)}: >= {format_time(b.time_s)} "
              f"(bandwidth {format_time(b.bandwidth_s)} + alpha {format_time(b.alpha_s)}; latency {format_time(b.latency_s)})")
        print(f"algbw <= {out['algbw_GBps']:.2f} GB/s, busbw <= {out['busbw_GBps']:.2f} GB/s; binding: {b.binding} ({b.method})")
        if b.across_s > 0:
            print(f"across nodes: bandwidth {format_time(b.across_s)} + alpha {format_time(b.across_alpha_s)} "
                  "(the last byte out of or into a node crosses the network and pays its step under the runtime "
                  "cost model)")
        print(f"program floor: >= {format_time(floor)} (algbw <= {out['program_floor_algbw_GBps']:.2f} GB/s): the bound "
              "plus what every program pays under the runtime cost model; compile's, simulate's and report's "
              "bound_ratio divide by it")
    return 0
