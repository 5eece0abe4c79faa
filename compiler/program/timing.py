"""Timing any MSCCL program (ours or another tool's) under the runtime cost model the schedule
simulator uses for its ideal program (compiler/analysis/links.py: one model, two inputs), so the
planned time and the program time compare on equal terms.

The MSCCL kernel runs every thread block's steps once per loop iteration, each iteration on one
slice of every chunk (a chunk larger than the protocol's iteration payload takes several); the
timer unrolls those iterations. A send-type step moves cnt slices to its peer over the topology's
best path: it starts when the step is ready (program order, its dependency in the same iteration,
and for rcs/rrs/rrcs the incoming message) and a thread-block lane is free on every link of the
path (a link carries as many thread blocks at once as fit its bandwidth, Costing.lanes), holds
that lane for bytes / (the lane's share of the payload bandwidth), then costs the thread block the
protocol's step latency, and its data arrives alpha after that. A receive completes when its
message has arrived. Local steps (cpy, re, nop) take no time. A program has no global transfer
order, so lanes are granted first come, first served in time order. A program of many iterations
is timed over its first MAX_ITERATIONS (fewer for a program of millions of steps) and extrapolated at the steady rate of the last ones, and
never faster than its busiest link or thread block gets through the iterations left (the first ones run ahead while a
congested link still holds the first iteration's data). The
call pays the protocol's launch once. Connection slot limits are the verifier's business.

Without runtime costs (a profile without them, or runtime_costs=False) this is alpha-beta: one
iteration, no lanes, no step latency, no launch.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass

from compiler.analysis.links import Costing, path_kind
from compiler.model.program import RECVS, SENDS, Program
from compiler.model.topology import Topology
from compiler.specs.collectives import CUSTOM
from compiler.specs.errors import CompileError

MAX_ITERATIONS = 8  # iterations timed step by step; more are extrapolated
TIMED_STEPS = 1 << 21  # steps timed at most (over the iterations timed): a large program times fewer, never under 2


def timed_iterations(program: Program, iterations: int) -> int:
    """Iterations to time step by step: up to MAX_ITERATIONS, fewer where the program has so many
    steps that they would pass TIMED_STEPS (a 1,024-GPU allgather has about two million)."""
    steps = sum(len(tb.steps) for g in program.gpus for tb in g.tbs)
    return min(iterations, max(2, min(MAX_ITERATIONS, TIMED_STEPS // max(1, steps))))


@dataclass(frozen=True)
class ProgramTiming:
    finish_time_s: float
    algbw: float  # size / time (nccl-tests' definition of size)
    chunk_bytes: float
    ntransfers: int
    proto: str | None = None  # the protocol whose costs were charged (None: alpha-beta)
    iterations: int = 1  # loop iterations of the kernel for this size
    first_iteration_s: float = 0.0  # when the first iteration's steps and data were done (no launch)


def call_bytes(program: Program, size_bytes: float) -> float:
    """The bytes of one call of `program` (nchunksperloop chunks, msccl-xml.md §4) for the size a
    user gives: nccl-tests' size for the standard collectives; for a custom program that carries
    its demand, the size of one chunk of the demand (as `msccl-compile custom --size` takes it),
    which the program holds as demand.chunks_per_rank chunks."""
    d = program.demand
    if program.collective != CUSTOM or d is None:
        return size_bytes
    return size_bytes / d.chunks_per_rank * program.nchunksperloop


class _Routes:
    """Per (src, dst): the path's links, its per-lane payload rate, alpha and step latency."""

    def __init__(self, topo: Topology, costing: Costing):
        self.topo, self.costing, self.known = topo, costing, {}
        self.lanes = [costing.lanes(l.bandwidth, l.kind or "nvlink") for l in topo.links]

    def get(self, a: int, b: int) -> tuple:
        if (a, b) not in self.known:
            topo = self.topo
            if not topo.paths(a, b):
                raise CompileError(f"simulate: rank {a} sends to rank {b}, but {topo.name} has no path between them")
            p = topo.best_path(a, b)
            links = topo.path_links(p)
            rate = min(topo.links[l].bandwidth * self.costing.efficiency / self.lanes[l] for l in links)
            self.known[(a, b)] = (links, rate, topo.path_alpha(p), self.costing.step(path_kind(topo, links)))
        return self.known[(a, b)]


def time_program(program: Program, topo: Topology, size_bytes: float, trace: dict | None = None,
                 runtime_costs: bool = True, per_tb: dict | None = None) -> ProgramTiming:
    """trace: if given, filled with (rank, tb, step) -> (start, ready, end of its hold on the links,
    done: when its thread block moves on, the step latency after the hold; its data arrives alpha
    later) of every send in the first iteration. per_tb: if given, filled with (rank, tb id) -> when
    the thread block's work (its data's arrival included) is done, launch included, extrapolated
    over the iterations like the finish."""
    if program.ngpus != topo.ngpus:
        raise CompileError(f"simulate: the program is for {program.ngpus} GPUs, {topo.name} has {topo.ngpus}")
    costing = Costing.of(topo, program.proto if runtime_costs else None)
    chunk = size_bytes / program.nchunksperloop
    iterations = costing.iterations(chunk)
    timed = timed_iterations(program, iterations)
    by_tb: dict | None = {} if per_tb is not None else None
    busiest: list[float] = []
    finished = _run(program, topo, costing, chunk / iterations, timed, trace, by_tb, busiest)
    sends = sum(1 for g in program.gpus for tb in g.tbs for s in tb.steps if s.type in SENDS)
    launch = costing.launch if sends else 0.0
    # the iterations not timed pass the busiest link or thread block no faster than the timed ones
    finish = max(extrapolate(finished, iterations), finished[0] + (iterations - 1) * busiest[0]) + launch
    if per_tb is not None:
        per_tb.update({k: extrapolate(_monotone(v), iterations) + launch for k, v in by_tb.items()})
    return ProgramTiming(finish, size_bytes / finish if finish > 0 else float("inf"), chunk, sends,
                         costing.proto, iterations, finished[0])


def extrapolate(finished: list[float], iterations: int) -> float:
    """The finish of `iterations` loop iterations from those timed (`finished`: when each was done):
    the rest at the slowest rate seen between two timed iterations. (Not the latest rate: the
    first iterations queue behind each other, so later timed ones finish in their shadow and look
    faster than the program runs; timed to the end, DGX-2 x 2 alltoall 64 MB in LL ran at about the
    rate of its first two iterations.)"""
    timed = len(finished)
    if iterations <= timed:
        return finished[-1]
    slowest = max(b - a for a, b in zip(finished, finished[1:]))
    return finished[-1] + (iterations - timed) * slowest


def _monotone(xs: list[float]) -> list[float]:
    out, top = [], 0.0
    for x in xs:
        top = max(top, x)
        out.append(top)
    return out


def _run(program: Program, topo: Topology, costing: Costing, piece: float, iterations: int,
         trace: dict | None, by_tb: dict | None = None, busiest: list | None = None) -> list[float]:
    """Run `iterations` loop iterations; the time every step of iteration j (and its data) is done,
    for each j. Event-driven: a thread block waits in a heap until its next step may start, or in
    `blocked_on` until what it needs (a dependency or a message) exists. Long on purpose: the
    event loop is the timer's hot path (auto and realise time dozens of programs per command), and
    its state stays in local variables and closures."""
    tbs = [(g.rank, tb) for g in program.gpus for tb in g.tbs]
    nsteps = [len(tb.steps) for _, tb in tbs]
    pc = [0] * len(tbs)  # step index over all iterations: iteration pc // n, step pc % n
    clock = [0.0] * len(tbs)  # when the tb's previous step finished
    done_at: dict[tuple[int, int, int, int], float] = {}  # (rank, tb, step, iteration) -> finish time
    queues: dict[tuple[int, int, int], list[float]] = {}  # (src, dst, chan) -> arrival times, FIFO
    heads: dict[tuple[int, int, int], int] = {}
    routes = _Routes(topo, costing)
    lanes = [[0.0] * (l.count * routes.lanes[i]) for i, l in enumerate(topo.links)]  # heap of free times
    held = [0.0] * len(topo.links)  # lane-seconds of holds per link
    working = [0.0] * len(tbs)  # seconds each thread block spent sending (holds and step latency)
    finished = [0.0] * iterations
    blocked_on: dict[tuple, list[int]] = {}  # what a waiting tb needs -> the tbs waiting for it

    def ready_time(i: int) -> float | tuple:
        """When step pc[i] can start, or the key of what it still waits for."""
        rank, tb = tbs[i]
        it, s = divmod(pc[i], nsteps[i])
        step = tb.steps[s]
        t = clock[i]
        if step.depid >= 0:
            key = (rank, step.depid, step.deps, it)
            if key not in done_at:
                return ("done",) + key
            t = max(t, done_at[key])
        if step.type in RECVS:
            conn = (tb.recv, rank, tb.chan)
            q, h = queues.get(conn, ()), heads.get(conn, 0)
            if h >= len(q):
                return ("sent",) + conn
            t = max(t, q[h])
        return t

    def wake(key: tuple) -> None:
        for j in blocked_on.pop(key, ()):
            heapq.heappush(heap, (clock[j], j))

    remaining = sum(nsteps) * iterations
    heap = [(0.0, i) for i in range(len(tbs)) if nsteps[i]]
    heapq.heapify(heap)
    while remaining:
        if not heap:
            stuck = min(j for js in blocked_on.values() for j in js) if blocked_on else None
            if stuck is None:
                break
            rank, tb = tbs[stuck]
            raise CompileError(f"simulate: rank {rank} tb {tb.id} step {pc[stuck] % nsteps[stuck]} can never run "
                               "(its message or dependency never comes; run msccl-compile verify)")
        when, i = heapq.heappop(heap)
        t = ready_time(i)
        if isinstance(t, tuple):
            blocked_on.setdefault(t, []).append(i)
            continue
        if t > when:  # not ready yet: come back then, so lanes go first come, first served
            heapq.heappush(heap, (t, i))
            continue
        rank, tb = tbs[i]
        it, s = divmod(pc[i], nsteps[i])
        step = tb.steps[s]
        if step.type in RECVS:
            conn = (tb.recv, rank, tb.chan)
            heads[conn] = heads.get(conn, 0) + 1
        end = t
        if step.type in SENDS:
            links, rate, alpha, latency = routes.get(rank, tb.send)
            start = max([t] + [lanes[l][0] for l in links])
            hold = step.cnt * piece / rate
            for l in links:
                heapq.heapreplace(lanes[l], start + hold)
                held[l] += hold
            end = start + hold + latency
            working[i] += hold + latency
            if trace is not None and it == 0:
                trace[(rank, tb.id, s)] = (start, t, start + hold, end)
            queues.setdefault((rank, tb.send, tb.chan), []).append(end + alpha)
            finished[it] = max(finished[it], end + alpha)
            if by_tb is not None:
                mine = by_tb.setdefault((rank, tb.id), [0.0] * iterations)
                mine[it] = max(mine[it], end + alpha)
        done_at[(rank, tb.id, s, it)] = end
        clock[i] = end
        finished[it] = max(finished[it], end)
        pc[i] += 1
        remaining -= 1
        if pc[i] < nsteps[i] * iterations:
            heapq.heappush(heap, (end, i))
        # the tbs this step unblocks: those waiting for it, or for the message it sent
        if blocked_on:
            wake(("done", rank, tb.id, s, it))
            if step.type in SENDS:
                wake(("sent", rank, tb.send, tb.chan))
    if busiest is not None:  # per iteration: the seconds of the busiest link (at all its lanes) or thread block
        link = max((h / len(lanes[l]) for l, h in enumerate(held)), default=0.0)
        busiest.append(max(link, max(working, default=0.0)) / iterations)
    return _monotone(finished)  # an iteration is done no earlier than the one before it
