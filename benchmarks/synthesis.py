"""Issue 3's table: allgather and alltoall at 1 GB on dgx2, dgx2 x2, dgx-a100 and mi250 —
ours (auto: solve time, algbw, bound ratio), the ring baseline, and the lower bound, side by side.

    python benchmarks/synthesis.py [--time-limit 60] [--size 1GB] [--json out.json]
"""

from __future__ import annotations

import argparse
import platform
import sys
from pathlib import Path
if __package__ in (None, ""):  # run as a file: make the repository importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.common import candidate_label, ours_ring_bound, save_rows  # noqa: E402
from compiler.model.demand import make_demand  # noqa: E402
from compiler.model.profiles import load_topology  # noqa: E402
from compiler.specs.units import parse_size  # noqa: E402

CASES = [("dgx2", 1), ("dgx2", 2), ("dgx-a100", 1), ("mi250", 1)]


def run_case(hw: str, nodes: int, coll: str, size: int, limit: float) -> dict:
    topo = load_topology(hw, nodes)
    return {"hw": hw, "nodes": nodes, "collective": coll, "size_bytes": size,
            **ours_ring_bound(topo, make_demand(coll, topo.ngpus, size), limit)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--time-limit", type=float, default=60.0)
    ap.add_argument("--size", default="1GB")
    ap.add_argument("--json", help="write the rows as JSON")
    args = ap.parse_args(argv)
    size = parse_size(args.size)
    rows = []
    head = (f"{'system':<12} {'coll':<10} {'ours':<21} {'wall s':>7} {'algbw':>8} {'ratio':>6} {'plan':>8} "
            f"{'prog/plan':>9} {'ring':>8} {'ratio':>6} {'bound':>8}")
    print(f"# {platform.node()} ({platform.machine()}, {platform.python_version()}), size {args.size}, "
          f"time limit {args.time_limit:g} s; algbw in GB/s of the emitted program (plan: the schedule as the ideal program), ratio = bound / time")
    print(head)
    for hw, nodes in CASES:
        for coll in ("allgather", "alltoall"):
            r = run_case(hw, nodes, coll, size, args.time_limit)
            rows.append(r)
            system = hw if nodes == 1 else f"{hw} x{nodes}"
            ours = candidate_label(r)
            print(f"{system:<12} {coll:<10} {ours:<21} {r['wall_s']:>7.1f} {r['algbw_GBps']:>8.2f} "
                  f"{r['bound_ratio']:>6.3f} {r['planned_algbw_GBps']:>8.2f} "
                  f"{r['time_s'] / r['planned_time_s']:>9.2f} {r['ring_algbw_GBps']:>8.2f} {r['ring_ratio']:>6.3f} "
                  f"{r['bound_algbw_GBps']:>8.2f}", flush=True)
    if args.json:
        save_rows(args.json, rows, size=args.size, time_limit_s=args.time_limit)
    return 0


if __name__ == "__main__":
    sys.exit(main())
