"""Speed of the stages after planning: simulate, lower, write XML, read it back, verify, time the
program, and send it between processes (pickle there and back, as the second process returns a
lowering) -- median of several runs, in one process.

    python benchmarks/pipeline.py [--repeat 5]                     # DGX-2 x 2 allgather 1 GB, five methods
    python benchmarks/pipeline.py --system dgx-h100x64 --repeat 1  # 512 GPUs, hier/1ch (a minute a run)

Issue target: lowering + writing + verifying a 32-GPU allgather takes <= 2 s.
"""

from __future__ import annotations

import argparse
import pickle
import platform
import statistics
import sys
import time

from backends.msccl_xml import read_xml, to_xml
from compiler.analysis.simulate import simulate
from compiler.gcpause import without_gc
from compiler.lowering.lower import lower
from compiler.model.demand import make_demand
from compiler.model.profiles import load_topology
from compiler.planners import PlanOptions, plan
from compiler.program.timing import time_program
from compiler.program.verify import verify

SYSTEMS = {  # name -> (profile, nodes, the schedules timed)
    "dgx2x2": ("dgx2", 2, (("ring", 1), ("ring", 4), ("direct", 1), ("hier", 2), ("milp", 1))),
    "dgx-h100x16": ("dgx-h100", 16, (("hier", 1),)),
    "dgx-h100x64": ("dgx-h100", 64, (("hier", 1),)),
}


def timed(fn, repeat: int) -> tuple[float, object]:
    times, out = [], None
    for _ in range(repeat):
        t0 = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times), out


@without_gc
def round_trip(program):
    return pickle.loads(pickle.dumps(program, protocol=pickle.HIGHEST_PROTOCOL))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--system", default="dgx2x2", choices=sorted(SYSTEMS))
    args = ap.parse_args(argv)
    profile, nodes, schedules = SYSTEMS[args.system]
    topo = load_topology(profile, nodes)
    print(f"# {args.system} ({topo.ngpus} GPUs) allgather 1 GB on {platform.node()} ({platform.machine()}, "
          f"Python {platform.python_version()}); median of {args.repeat} runs, seconds")
    print(f"{'schedule':<16} {'transfers':>9} {'steps':>8} {'simulate':>9} {'lower':>7} {'write':>7} {'read':>7} "
          f"{'verify':>7} {'l+w+v':>7} {'program':>8} {'pickle':>7}")
    for method, chunks in schedules:
        d = make_demand("allgather", topo.ngpus, 10**9, chunks)
        s = plan(topo, d, PlanOptions(method=method, time_limit=60))
        simulate(topo, s)  # warm the bound cache, as a CLI run does once
        t_sim, _ = timed(lambda: simulate(topo, s), args.repeat)
        t_low, program = timed(lambda: lower(s, topo), args.repeat)
        t_xml, text = timed(lambda: to_xml(program), args.repeat)
        t_read, _ = timed(lambda: read_xml(text), args.repeat)
        t_ver, verdict = timed(lambda: verify(program), args.repeat)
        t_prog, _ = timed(lambda: time_program(program, topo, 10**9), args.repeat)
        t_pickle, _ = timed(lambda: round_trip(program), args.repeat)
        assert verdict.ok, verdict.summary()
        print(f"{method + '/' + str(chunks) + 'ch':<16} {len(s.transfers):>9} {program.nsteps_total:>8} {t_sim:>9.3f} "
              f"{t_low:>7.3f} {t_xml:>7.3f} {t_read:>7.3f} {t_ver:>7.3f} {t_low + t_xml + t_ver:>7.3f} "
              f"{t_prog:>8.3f} {t_pickle:>7.3f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
