"""Speed of the stages after planning, on a 32-GPU allgather (DGX-2 x 2, 1 GB): simulate, lower,
write XML, verify, time the program — median of several runs, in one process.

    python benchmarks/pipeline.py [--repeat 5]

Issue target: lowering + writing + verifying a 32-GPU allgather takes <= 2 s.
"""

from __future__ import annotations

import argparse
import platform
import statistics
import sys
import time

from backends.msccl_xml import to_xml
from compiler.model.demand import make_demand
from compiler.lowering.lower import lower
from compiler.planners import PlanOptions, plan
from compiler.model.profiles import load_topology
from compiler.analysis.simulate import simulate
from compiler.program.timing import time_program
from compiler.program.verify import verify


def timed(fn, repeat: int) -> tuple[float, object]:
    times, out = [], None
    for _ in range(repeat):
        t0 = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times), out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args(argv)
    topo = load_topology("dgx2", 2)
    print(f"# DGX-2 x 2 allgather 1 GB on {platform.node()} ({platform.machine()}, Python {platform.python_version()}); "
          f"median of {args.repeat} runs, seconds")
    print(f"{'schedule':<16} {'transfers':>9} {'simulate':>9} {'lower':>7} {'write':>7} {'verify':>7} "
          f"{'l+w+v':>7} {'program':>8}")
    for method, chunks in (("ring", 1), ("ring", 4), ("direct", 1), ("hier", 2), ("milp", 1)):
        d = make_demand("allgather", topo.ngpus, 10**9, chunks)
        s = plan(topo, d, PlanOptions(method=method, time_limit=60))
        simulate(topo, s)  # warm the bound cache, as a CLI run does once
        t_sim, _ = timed(lambda: simulate(topo, s), args.repeat)
        t_low, program = timed(lambda: lower(s, topo), args.repeat)
        t_xml, _ = timed(lambda: to_xml(program), args.repeat)
        t_ver, verdict = timed(lambda: verify(program), args.repeat)
        t_prog, _ = timed(lambda: time_program(program, topo, 10**9), args.repeat)
        assert verdict.ok
        print(f"{method + '/' + str(chunks) + 'ch':<16} {len(s.transfers):>9} {t_sim:>9.3f} {t_low:>7.3f} "
              f"{t_xml:>7.3f} {t_ver:>7.3f} {t_low + t_xml + t_ver:>7.3f} {t_prog:>8.3f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
