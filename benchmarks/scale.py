"""Scale: the whole pipeline (plan, lower, time the program, verify: compiler.pipeline.compile, as
the CLI runs it) on DGX A100 x 1..16 and DGX H100 x 1..128 (up to 1,024 GPUs), allgather 1 GB,
and reduce-scatter on DGX H100 x 64. Per case: the program's ratio to the bound (what the user
gets) beside the planned one (the schedule's ideal program), the wall time and the peak memory of
a fresh process (each case runs in its own, so its peak is its own) and of the second processes it
started (`+MB`: the largest of them; from 40,000 transfers realise lowers a placement in one beside
the first, so the two peaks together bound the whole command's). Published synthesis times
are printed beside: TACOS (greedy time-expanded matching) synthesises an allgather for 512 NPUs in
6.1 min; TE-CCL's MILP needed 2,700 s of Gurobi for DGX-2 x 2 allgather 1 GB (16 GPUs x 2).

    python benchmarks/scale.py [--time-limit 60] [--methods auto] [--runtime all] [--systems dgx-h100x64,...]
                               [--cases allgather,reduce_scatter@dgx-h100x64] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import platform
import resource
import subprocess
import sys
import time

SYSTEMS = [("dgx-a100", 1), ("dgx-a100", 2), ("dgx-a100", 4), ("dgx-a100", 8), ("dgx-a100", 16),
           ("dgx-h100", 1), ("dgx-h100", 2), ("dgx-h100", 4), ("dgx-h100", 32), ("dgx-h100", 64),
           ("dgx-h100", 128)]
EXTRA = [("dgx-h100", 64, "reduce_scatter")]  # (hw, nodes, collective) beside every system's allgather
PUBLISHED = {512: "TACOS: 6.1 min (512 NPUs, allgather)"}  # synthesis times others report at this many GPUs


def one(hw: str, nodes: int, collective: str, method: str, limit: float, size: int, runtime: str) -> dict:
    """Compile one case in this process, as the CLI does (program written for every runtime), and
    report it with this process's wall time and peak memory."""
    from compiler.model.demand import make_demand
    from compiler.model.profiles import load_topology
    from compiler.pipeline import CompileOptions, compile
    from compiler.planners import PlanOptions
    from compiler.specs.errors import CompileError
    t0 = time.perf_counter()
    topo = load_topology(hw, nodes)
    demand = make_demand(collective, topo.ngpus, size - size % (topo.ngpus * 4))
    try:
        r = compile(topo, demand, CompileOptions(PlanOptions(method=method, time_limit=limit, refine=True),
                                                 runtime=runtime, output="scale.xml"))
    except CompileError as e:
        return {"error": str(e), "wall_s": time.perf_counter() - t0}
    return {"method": r.schedule.planner, "chunks": r.demand.chunks_per_rank, "proto": r.program.proto,
            "ntransfers": len(r.schedule.transfers), "verified": r.verdict.ok, "time_s": r.time_s,
            "algbw_GBps": demand.size_bytes / r.time_s / 1e9, "bound_ratio": r.bound_ratio,
            "planned_bound_ratio": r.planned.bound_ratio, "solve_time_s": r.schedule.solve_time,
            "wall_s": time.perf_counter() - t0,
            "peak_rss_MB": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
            "child_peak_rss_MB": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024}


def cases(systems: str, extra: str) -> list[tuple[str, int, str]]:
    out = []
    for spec in systems.split(","):
        hw, nodes = spec.rsplit("x", 1)
        out.append((hw, int(nodes), "allgather"))
    for item in filter(None, extra.split(",")):
        coll, system = item.split("@")
        hw, nodes = system.rsplit("x", 1)
        if f"{hw}x{nodes}" in systems.split(","):
            out.append((hw, int(nodes), coll))
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--time-limit", type=float, default=60.0, help="--time-limit of each compile (default 60, the CLI's)")
    ap.add_argument("--methods", default="auto")
    ap.add_argument("--systems", default=",".join(f"{h}x{n}" for h, n in SYSTEMS))
    ap.add_argument("--cases", default=",".join(f"{c}@{h}x{n}" for h, n, c in EXTRA),
                    help="more collectives, as COLLECTIVE@SYSTEM (run where SYSTEM is in --systems)")
    ap.add_argument("--size", type=int, default=10**9)
    ap.add_argument("--runtime", default="all", help="the runtimes the program is written for (default all, the CLI's)")
    ap.add_argument("--json")
    ap.add_argument("--one", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.one:
        hw, nodes, coll, method, limit = json.loads(args.one)
        print(json.dumps(one(hw, nodes, coll, method, limit, args.size, args.runtime)))
        return 0
    rows = []
    print(f"# {args.size / 1e9:g} GB on {platform.node()} ({platform.machine()}, Python {platform.python_version()}), "
          f"HiGHS; time limit {args.time_limit:g} s; runtime {args.runtime}; whole pipeline (plan, lower, time, verify) per fresh process")
    print(f"{'system':<14} {'GPUs':>5} {'collective':<15} {'method':<7} {'ch':>3} {'proto':<6} {'program':>7} "
          f"{'planned':>7} {'wall s':>7} {'peak MB':>8} {'+MB':>6}  published")
    for hw, nodes, coll in cases(args.systems, args.cases):
        ngpus = nodes * (16 if hw == "dgx2" else 8)
        for method in args.methods.split(","):
            if method == "hier" and nodes == 1:
                continue
            payload = json.dumps([hw, nodes, coll, method, args.time_limit])
            proc = subprocess.run([sys.executable, __file__, "--one", payload, "--size", str(args.size),
                                   "--runtime", args.runtime],
                                  capture_output=True, text=True, timeout=args.time_limit * 3 + 1800)
            try:
                r = json.loads(proc.stdout.strip().splitlines()[-1])
            except (IndexError, json.JSONDecodeError):
                r = {"error": (proc.stderr.strip().splitlines() or ["no output"])[-1]}
            r.update(system=f"{hw}x{nodes}", ngpus=ngpus, collective=coll, requested=method)
            rows.append(r)
            published = PUBLISHED.get(ngpus, "") if coll == "allgather" else ""
            if "error" in r:
                print(f"{hw + 'x' + str(nodes):<14} {ngpus:>5} {coll:<15} {method:<7} {'':>3} {'':<6} {'':>7} {'':>7} "
                      f"{r.get('wall_s', 0):>7.1f} {'':>8} {'':>6}  {r['error'][:90]}", flush=True)
            else:
                print(f"{hw + 'x' + str(nodes):<14} {ngpus:>5} {coll:<15} {r['method']:<7} {r['chunks']:>3} "
                      f"{r['proto']:<6} {r['bound_ratio']:>7.3f} {r['planned_bound_ratio']:>7.3f} "
                      f"{r['wall_s']:>7.1f} {r['peak_rss_MB']:>8.0f} {r.get('child_peak_rss_MB', 0):>6.0f}  {published}",
                      flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"machine": platform.node(), "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
