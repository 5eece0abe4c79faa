"""Small and medium sizes beyond DGX-2: allgather, alltoall and reduce-scatter on two DGX A100 and
two DGX H100 nodes (16 GPUs), at the sizes users type (1MB = 10^6 bytes, whose chunks need not
split into powers of two), ours (auto) against the ring baseline and the program floor.

    python benchmarks/sizes.py [--time-limit 10] [--systems dgx-a100x2,dgx-h100x2] [--sizes 64KB,1MB,16MB,256MB]
                               [--collectives allgather,alltoall,reduce_scatter]
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
from compiler.model.profiles import list_profiles, load_topology  # noqa: E402
from compiler.specs.errors import CompileError  # noqa: E402
from compiler.specs.units import parse_size  # noqa: E402

COLLECTIVES = ("allgather", "alltoall", "reduce_scatter")


def system(name: str) -> tuple[str, int]:
    """`dgx-a100x2` -> ("dgx-a100", 2); a profile's own name is one node (`dgx2`, not two `dg`)."""
    if name.lower() in {p.name.lower() for p in list_profiles()}:
        return name, 1
    hw, _, nodes = name.rpartition("x")
    return (hw, int(nodes)) if hw and nodes.isdigit() else (name, 1)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--time-limit", type=float, default=10.0)
    ap.add_argument("--systems", default="dgx-a100x2,dgx-h100x2")
    ap.add_argument("--sizes", default="64KB,1MB,16MB,256MB")
    ap.add_argument("--collectives", default=",".join(COLLECTIVES))
    ap.add_argument("--json", help="write the rows as JSON")
    args = ap.parse_args(argv)
    rows = []
    print(f"# {platform.node()} ({platform.machine()}, Python {platform.python_version()}), time limit "
          f"{args.time_limit:g} s per case; algbw GB/s of the emitted program, ratio = program floor / time")
    print(f"{'system':<12} {'coll':<15} {'size':>6} {'ours':<22} {'wall s':>6} {'algbw':>8} {'ratio':>6} "
          f"{'planned':>7} {'ring':>8} {'ratio':>6}")
    for name in args.systems.split(","):
        hw, nodes = system(name)
        topo = load_topology(hw, nodes)
        for coll in args.collectives.split(","):
            for text in args.sizes.split(","):
                size = parse_size(text)
                size -= size % (topo.ngpus * 4)  # whole float32 elements in every chunk
                r = {"system": name, "collective": coll, "size": text, "size_bytes": size}
                try:
                    r.update(ours_ring_bound(topo, make_demand(coll, topo.ngpus, size), args.time_limit))
                except CompileError as e:
                    rows.append({**r, "failed": str(e)})
                    print(f"{name:<12} {coll:<15} {text:>6} failed: {e}", flush=True)
                    continue
                rows.append(r)
                ours = candidate_label(r)
                print(f"{name:<12} {coll:<15} {text:>6} {ours:<22} {r['wall_s']:>6.1f} {r['algbw_GBps']:>8.4g} "
                      f"{r['bound_ratio']:>6.3f} {r['planned_ratio']:>7.3f} {r['ring_algbw_GBps']:>8.4g} "
                      f"{r['ring_ratio']:>6.3f}", flush=True)
    if args.json:
        save_rows(args.json, rows, time_limit_s=args.time_limit)
    return 0


if __name__ == "__main__":
    sys.exit(main())
