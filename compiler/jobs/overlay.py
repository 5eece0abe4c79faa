"""Several jobs' programs run together on the shared links, timed by the program timer.

The judge of every jobs figure (joint, alone, naive) is compiler/program/timing.py's
`time_program`, called through its public signature on one program that overlays the jobs'
programs: each job's ranks mapped to its GPUs, its channels moved past the other jobs' (so no two
jobs share a connection), its step counts scaled to one common chunk unit (jobs may cut their
buffers differently). Links go to whichever job's step is ready first, as the timer grants them.

A job that starts later (`start` > 0) waits on a clock: one extra rank per such job, joined to each
of the job's GPUs by a private link on which a single message takes exactly `start` seconds; every
thread block of the job first waits for that message. The clock ranks and links exist only in the
timed copy of the topology.

A job's finish is the timer's own: when its thread blocks' data has arrived (time_program's
per_tb); the largest of them is checked against the timer's finish. The overlay is timed under
the runtime cost model, like any program, where every job runs one protocol, cuts its buffer into
chunks of one size (so the overlay's kernel iterations are each job's own) and starts at once;
otherwise in alpha-beta (runtime_costs=False): a clock's message would recur in every kernel
iteration, and the iterations of unit-sized chunks would not be the jobs' own. Joint, alone and
naive are timed alike either way, so they compare on equal terms: `run_together(costed=False)`
times an overlay that could be costed in alpha-beta too (compiler/jobs/plan.py asks for that
wherever another overlay of the same jobs cannot be costed: a job alone is never late for itself,
but its time alone must be in the units of its time with a late job).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from fractions import Fraction
from math import gcd

from compiler.model.program import GpuProgram, Program, Step, ThreadBlock
from compiler.model.topology import Link, Topology
from compiler.program.timing import time_program
from compiler.specs.collectives import CUSTOM

CHECK_TOLERANCE = 1e-6  # relative: per-job finishes must reproduce the timer's finish


@dataclass(frozen=True)
class Placed:
    """One job's program (its own communicator's ranks) placed on the shared topology."""
    program: Program
    ranks: tuple[int, ...]  # global rank of each communicator rank
    call_bytes: float  # bytes of one call of the program (program/timing.call_bytes)
    start: float = 0.0  # seconds after the first job's start


@dataclass(frozen=True)
class Together:
    finish: tuple[float, ...]  # per job: seconds from its start to its last delivery
    makespan: float  # the timer's finish of the overlay (from time 0)
    agrees: bool  # the per-job finishes reproduce the timer's own finish
    costed: bool = True  # timed under the runtime cost model (else in alpha-beta)


def _unit(chunks: list[Fraction]) -> Fraction:
    """The largest size every job's chunk is a whole multiple of."""
    num, den = 0, 1
    for c in chunks:
        den = den * c.denominator // gcd(den, c.denominator)
    for c in chunks:
        num = gcd(num, int(c * den))
    return Fraction(num, den)


def with_clocks(topo: Topology, delays: list[tuple[float, tuple[int, ...]]], unit: float) -> Topology:
    """The topology plus one clock GPU per delay, after the real GPUs (switches move up), with a
    private link to each GPU it delays on which one `unit`-byte message takes the delay (alpha-beta)."""
    k, n = len(delays), topo.ngpus
    if not k:
        return topo
    move = lambda v: v if v < n else v + k  # noqa: E731
    links = [Link(move(l.src), move(l.dst), l.bandwidth, l.alpha, l.count, l.kind) for l in topo.links]
    for i, (delay, gpus) in enumerate(delays):
        links += [Link(n + i, g, unit / delay, 0.0, 1, "") for g in gpus]
    return replace(topo, name=topo.name + "+clocks", ngpus=n + k, links=tuple(sorted(links, key=lambda l: (l.src, l.dst))),
                   nics=tuple(replace(c, tx=move(c.tx) if c.tx >= 0 else -1, rx=move(c.rx) if c.rx >= 0 else -1)
                              for c in topo.nics))


def _job_tbs(p: Placed, scale: int, chan0: int, clock: int | None) -> dict[int, list[ThreadBlock]]:
    """Global rank -> the job's thread blocks there (ids from 0; with a clock, tb 0 waits for it)."""
    out: dict[int, list[ThreadBlock]] = {}
    shift = 1 if clock is not None else 0
    for g in p.program.gpus:
        rank = p.ranks[g.rank]
        tbs = [ThreadBlock(0, -1, clock, chan0, (Step("r", "s", 0, "s", 0, 1, -1, -1, True),))] if shift else []
        for tb in g.tbs:
            steps = [replace(s, cnt=s.cnt * scale, depid=s.depid + shift if s.depid >= 0 else -1,
                             deps=s.deps + shift if s.depid >= 0 else -1) for s in tb.steps]
            if shift:
                steps.insert(0, Step("nop", "o", -1, "o", -1, 0, 0, 0, False))
            tbs.append(ThreadBlock(tb.id + shift, p.ranks[tb.send] if tb.send >= 0 else -1,
                                   p.ranks[tb.recv] if tb.recv >= 0 else -1, tb.chan + chan0, tuple(steps)))
        out[rank] = tbs
    return out


def run_together(topo: Topology, placed: list[Placed], costed: bool = True) -> Together:
    """Time the jobs' programs together on `topo` (see the module docstring); costed=False: in
    alpha-beta even where the runtime cost model could time them."""
    chunks = [Fraction(p.call_bytes) / p.program.nchunksperloop for p in placed]
    unit = _unit(chunks)
    protos = sorted({p.program.proto for p in placed})
    delays = [(p.start, p.ranks) for p in placed if p.start > 0]
    costed = costed and len(protos) == 1 and all(c == unit for c in chunks) and not delays
    timed = with_clocks(topo, delays, float(unit))
    n = topo.ngpus
    per_rank: dict[int, list[ThreadBlock]] = {}
    owner: dict[tuple[int, int], int] = {}  # (global rank, tb id) -> job
    chan0, clock = 0, n
    for j, (p, c) in enumerate(zip(placed, chunks)):
        mine = _job_tbs(p, int(c / unit), chan0, clock if p.start > 0 else None)
        if p.start > 0:
            per_rank[clock] = [ThreadBlock(i, g, -1, chan0, (Step("s", "s", 0, "s", 0, 1, -1, -1, False),))
                               for i, g in enumerate(p.ranks)]
            clock += 1
        for rank, tbs in mine.items():
            per_rank[rank] = tbs
            owner.update({(rank, tb.id): j for tb in tbs})
        chan0 += p.program.nchannels
    gpus = tuple(GpuProgram(r, 1, 1, 1, tuple(per_rank.get(r, ()))) for r in range(timed.ngpus))
    program = Program("jobs-together", CUSTOM, timed.ngpus, 1, chan0, gpus, proto=protos[0])
    per_tb: dict = {}
    makespan = time_program(program, timed, float(unit), runtime_costs=costed, per_tb=per_tb).finish_time_s
    ends = [0.0] * len(placed)
    for key, done in per_tb.items():  # a job is done when its last thread block's data has arrived
        j = owner.get(key)
        if j is not None:  # else a clock's message
            ends[j] = max(ends[j], done)
    finish = tuple(max(0.0, e - p.start) for e, p in zip(ends, placed))
    agrees = abs(max(ends, default=0.0) - makespan) <= CHECK_TOLERANCE * max(makespan, 1e-12)
    return Together(finish, makespan, agrees, costed)

