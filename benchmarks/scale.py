"""Scale: DGX A100 x 1/2/4/8/16 and DGX H100 x 1/2/4, allgather 1 GB — per method: solve time,
simulated algbw, ratio to the lower bound, and the planning process's peak memory (each case runs
in a fresh process so its peak is its own).

    python benchmarks/scale.py [--time-limit 60] [--big-time-limit 600] [--methods auto,hier,milp,rounds,ring]
                               [--chunks 2] [--json out.json]
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
           ("dgx-h100", 1), ("dgx-h100", 2), ("dgx-h100", 4)]


def one(hw: str, nodes: int, method: str, chunks: int | None, limit: float, size: int) -> dict:
    """Plan one case in this process and report it (with this process's peak memory)."""
    from compiler.model.demand import make_demand
    from compiler.specs.errors import CompileError
    from compiler.planners import PlanOptions, plan
    from compiler.model.profiles import load_topology
    from compiler.analysis.simulate import simulate
    topo = load_topology(hw, nodes)
    demand = make_demand("allgather", topo.ngpus, size, chunks or 1)
    t0 = time.perf_counter()
    try:
        s = plan(topo, demand, PlanOptions(method=method, time_limit=limit, refine=chunks is None))
    except CompileError as e:
        return {"error": str(e), "solve_time_s": time.perf_counter() - t0}
    solve = time.perf_counter() - t0
    m = simulate(topo, s)
    return {"method": s.planner, "chunks": s.demand.chunks_per_rank, "status": s.status, "solve_time_s": solve,
            "algbw_GBps": m.algbw / 1e9, "bound_ratio": m.bound_ratio, "time_s": m.finish_time_s,
            "peak_rss_MB": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--time-limit", type=float, default=60.0)
    ap.add_argument("--big-time-limit", type=float, default=600.0, help="for 64 GPUs and more (default 600)")
    ap.add_argument("--methods", default="auto,hier,milp,rounds,ring")
    ap.add_argument("--chunks", type=int, default=None, help="chunks per rank (default: auto chooses)")
    ap.add_argument("--systems", default=",".join(f"{h}x{n}" for h, n in SYSTEMS))
    ap.add_argument("--size", type=int, default=10**9)
    ap.add_argument("--json")
    ap.add_argument("--one", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.one:
        hw, nodes, method, chunks, limit = json.loads(args.one)
        print(json.dumps(one(hw, nodes, method, chunks, limit, args.size)))
        return 0
    rows = []
    print(f"# allgather {args.size / 1e9:g} GB on {platform.node()} ({platform.machine()}, Python "
          f"{platform.python_version()}), HiGHS; time limit {args.time_limit:g} s (>= 64 GPUs: {args.big_time_limit:g} s)")
    print(f"{'system':<14} {'GPUs':>5} {'method':<8} {'chunks':>6} {'solve s':>8} {'algbw':>8} {'ratio':>6} "
          f"{'peak MB':>8}  status")
    for spec in args.systems.split(","):
        hw, nodes = spec.rsplit("x", 1)
        nodes = int(nodes)
        ngpus = nodes * (16 if hw == "dgx2" else 8)
        limit = args.big_time_limit if ngpus >= 64 else args.time_limit
        for method in args.methods.split(","):
            if method == "hier" and nodes == 1:
                continue
            payload = json.dumps([hw, nodes, method, args.chunks, limit])
            proc = subprocess.run([sys.executable, __file__, "--one", payload, "--size", str(args.size)],
                                  capture_output=True, text=True, timeout=limit * 3 + 600)
            try:
                r = json.loads(proc.stdout.strip().splitlines()[-1])
            except (IndexError, json.JSONDecodeError):
                r = {"error": (proc.stderr.strip().splitlines() or ["no output"])[-1]}
            r.update(system=spec, ngpus=ngpus, requested=method)
            rows.append(r)
            if "error" in r:
                print(f"{spec:<14} {ngpus:>5} {method:<8} {'':>6} {r.get('solve_time_s', 0):>8.1f} {'':>8} {'':>6} "
                      f"{'':>8}  {r['error'][:90]}", flush=True)
            else:
                print(f"{spec:<14} {ngpus:>5} {method:<8} {r['chunks']:>6} {r['solve_time_s']:>8.1f} "
                      f"{r['algbw_GBps']:>8.1f} {r['bound_ratio']:>6.3f} {r['peak_rss_MB']:>8.0f}  {r['status']}"
                      + (f" ({r['method']})" if r["method"] != method else ""), flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"machine": platform.node(), "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
