"""What local copies cost the programs we write. A rank's copy of its input into its output (cpy)
holds its thread block for its bytes at a block's rate (the timer's model, "Known limits");
lowering keeps copies off the sends' way, each on a block of its own while the runtime's block
limit leaves room. Each case's program is timed with its copies charged and with them free: a
ratio above 1 means a copy is on the program's critical path.

    python benchmarks/copies.py [--time-limit 30] [--cases dgx-a100:1:allgather:64MB:direct:1,...]

Fixed methods and chunks (the cases of README "Local copies take their thread block's time"),
instances and protocol auto, the size rounded down to whole float32 elements per chunk, as
`msccl-compile COLL --method M --chunks C` writes them.
"""

from __future__ import annotations

import argparse
import contextlib
import platform
import sys
from pathlib import Path
if __package__ in (None, ""):  # run as a file: make the repository importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from compiler.analysis import links  # noqa: E402
from compiler.cli.commands.collective import whole_elements  # noqa: E402
from compiler.model.demand import make_demand  # noqa: E402
from compiler.model.profiles import load_topology  # noqa: E402
from compiler.pipeline import CompileOptions, compile  # noqa: E402
from compiler.planners import PlanOptions  # noqa: E402
from compiler.program.timing import time_program  # noqa: E402
from compiler.specs.units import parse_size  # noqa: E402

CASES = ("dgx-a100:1:allgather:1MB:direct:1", "dgx-a100:1:allgather:64MB:direct:1",
         "dgx-a100:1:alltoall:1MB:direct:1", "dgx-a100:1:alltoall:64MB:direct:1",
         "dgx-a100:1:broadcast:1MB:hier:8", "dgx-a100:1:broadcast:32MB:hier:8",
         "dgx2:2:allgather:1MB:hier:2", "dgx2:2:allgather:64MB:hier:2", "dgx2:2:allgather:1GB:hier:2",
         "dgx2:2:alltoall:64MB:direct:1", "dgx-h100:2:allgather:1MB:hier:2", "dgx-h100:2:allgather:64MB:hier:2",
         "dgx-h100:2:broadcast:32MB:hier:8", "mi250:1:allgather:1MB:trees:16", "mi250:1:allgather:64MB:trees:16",
         "mi250:2:allgather:1MB:hier:2", "mi250:2:allgather:64MB:hier:2", "mi250:2:allgather:1GB:hier:1",
         "dgx1:2:allgather:64MB:hier:2", "dgx-a100:2:alltoall:16MB:direct:1")


@contextlib.contextmanager
def copies_free():
    real = links.Costing.local_rate
    links.Costing.local_rate = lambda self, topo: float("inf")
    try:
        yield
    finally:
        links.Costing.local_rate = real


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--time-limit", type=float, default=30.0)
    ap.add_argument("--cases", default=",".join(CASES), help="hw:nodes:collective:size:method:chunks, comma-separated")
    args = ap.parse_args(argv)
    print(f"# {platform.node() or 'host'} ({platform.machine()}, Python {platform.python_version()}), time limit "
          f"{args.time_limit:g} s per case; us; `charged`: the program as the timer times it, `free`: its copies "
          "taking no time")
    print(f"{'system':12} {'coll':10} {'size':>5} {'method':10} {'program':16} {'copies':>6} {'blocks':>6} "
          f"{'charged':>9} {'free':>9} {'ratio':>6} {'plan':>9}")
    for case in args.cases.split(","):
        hw, nodes, coll, size, method, chunks = case.split(":")
        topo = load_topology(hw, int(nodes))
        demand = make_demand(coll, topo.ngpus, parse_size(size), int(chunks))
        demand = make_demand(coll, topo.ngpus, whole_elements(demand, "float32", demand.size_bytes), int(chunks))
        r = compile(topo, demand, CompileOptions(plan=PlanOptions(method=method, time_limit=args.time_limit),
                                                 xml=True, output=None))
        p = r.program
        with copies_free():
            free = time_program(p, topo, demand.size_bytes).finish_time_s
        charged = r.timing.finish_time_s
        copies = max(sum(st.type == "cpy" for tb in g.tbs for st in tb.steps) for g in p.gpus)
        blocks = max(sum(tb.send < 0 and tb.recv < 0 for tb in g.tbs) for g in p.gpus)
        label = hw if nodes == "1" else f"{hw} x{nodes}"
        print(f"{label:12} {coll:10} {size:>5} {method + '/' + chunks:10} "
              f"{p.proto + 'x' + str(r.realisation.instances):16} {copies:6d} {blocks:6d} {charged * 1e6:9.1f} "
              f"{free * 1e6:9.1f} {charged / free:6.3f} {r.planned.finish_time_s * 1e6:9.1f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
