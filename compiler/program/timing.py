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
protocol's step latency once per primitive call the host splits the step into (one per chunk
where a chunk fills an iteration: Costing.calls), and its data arrives alpha after that. A
receive completes when its message has arrived. A local copy or reduction (cpy, re) holds its
thread block for its bytes at a block's local rate (Costing.local_rate); a nop takes no time. A program has no global transfer
order, so lanes are granted first come, first served in time order: a send that finds no lane
free on some link of its path waits without holding the others' (no lane is reserved ahead, so a
link idles only while no ready send can use it, as a switch port shared by its flows would), and
sends that wait take freed lanes in the order they became ready. A program of many iterations
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
from compiler.model.costs import MAX_COUNT
from compiler.model.program import RECVS, SENDS, Program
from compiler.model.topology import Topology
from compiler.specs.collectives import CUSTOM
from compiler.specs.errors import CompileError
from compiler.gcpause import without_gc

MAX_ITERATIONS = 8  # iterations timed step by step; more are extrapolated
TIMED_STEPS = 1 << 21  # steps timed at most (over the iterations timed): a large program times fewer, never under 2


def timed_iterations(program: Program, iterations: int) -> int:
    """Iterations to time step by step: up to MAX_ITERATIONS, fewer where the program has so many
    steps that they would pass TIMED_STEPS (a 1,024-GPU allgather has about two million)."""
    steps = program.nsteps_total
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

    @classmethod
    def of(cls, topo: Topology, costing: Costing) -> "_Routes":
        """The last few (topology, protocol) pairs' routes, by the topology's identity (the memo
        keeps it alive): auto, realise and the library time dozens of programs on one topology,
        and looking up each thread block's path again was a tenth of the timer."""
        key = (id(topo), costing.proto)
        hit = _ROUTES.get(key)
        if hit is None or hit.topo is not topo or hit.costing != costing:
            if len(_ROUTES) >= 8:
                del _ROUTES[next(iter(_ROUTES))]
            hit = _ROUTES[key] = cls(topo, costing)
        return hit

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


@without_gc
def time_program(program: Program, topo: Topology, size_bytes: float, trace: dict | None = None,
                 runtime_costs: bool = True, per_tb: dict | None = None) -> ProgramTiming:
    """trace: if given, filled with (rank, tb, step) -> (start, ready, end of its hold on the links,
    done: when its thread block moves on, the step latency after the hold; its data arrives alpha
    later) of every send in the first iteration. per_tb: if given, filled with (rank, tb id) -> when
    the thread block's work (its data's arrival included) is done, launch included, extrapolated
    over the iterations like the finish."""
    if program.ngpus != topo.ngpus:
        raise CompileError(f"{program.name}: the program is for {program.ngpus} GPUs, {topo.name} has {topo.ngpus}")
    costing = Costing.of(topo, program.proto if runtime_costs else None)
    chunk = size_bytes / program.nchunksperloop
    iterations = costing.iterations(chunk)
    timed = timed_iterations(program, iterations)
    by_tb: dict | None = {} if per_tb is not None else None
    busiest: list[float] = []
    flat = _Flat.of(program)
    # a verified program's cnt is at most MAX_COUNT + 1; an overlay of jobs that cut different chunk sizes counts
    # its steps in a common unit, so a step there may move thousands of unit chunks
    calls = [costing.calls(c, chunk) for c in range(max(MAX_COUNT, flat.most_cnt) + 2)]
    finished = _run(program, topo, costing, chunk / iterations, timed, trace, by_tb, busiest, calls)
    sends = flat.nsends
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
         trace: dict | None, by_tb: dict | None, busiest: list | None, calls: list[int]) -> list[float]:
    """Run `iterations` loop iterations; the time every step of iteration j (and its data) is done,
    for each j; calls[cnt]: the step latencies a step of cnt chunks pays (Costing.calls).
    Event-driven: a thread block waits in a heap until its next step may start, or in
    `blocked_on` until what it needs (a dependency or a message) exists. Long on purpose: the
    event loop is the timer's hot path (auto and realise time dozens of programs per command), so
    each step is flattened first (_Flat: integer keys for connections and dependency targets) and
    the loop's state stays in local variables."""
    flat = _Flat.of(program)
    tbs, nsteps = flat.tbs, flat.nsteps
    kinds, deps, marks, cnts = flat.kinds, flat.deps, flat.marks, flat.cnts
    send_conn, recv_conn = flat.send_conn, flat.recv_conn
    ntbs = len(tbs)
    it_of = [0] * ntbs  # the iteration each tb is in
    s_of = [0] * ntbs  # its next step in that iteration
    clock = [0.0] * ntbs  # when the tb's previous step finished
    done_at: dict[int, float] = {}  # dependency target mark * iterations + iteration -> finish time
    queues: list[list[float]] = [[] for _ in range(flat.nconns)]  # per connection: arrival times, FIFO
    heads = [0] * flat.nconns
    routes = _Routes.of(topo, costing)
    local_hold = piece / costing.local_rate(topo)  # a cpy or re step's seconds per chunk
    route_of: list = [None] * ntbs  # per tb: routes.get of its send peer, when it first sends
    lanes = [[0.0] * (l.count * routes.lanes[i]) for i, l in enumerate(topo.links)]  # heap of free times
    held = [0.0] * len(topo.links)  # lane-seconds of holds per link
    working = [0.0] * ntbs  # seconds each thread block spent sending (holds and step latency)
    finished = [0.0] * iterations
    blocked_on: dict[int | None, list[int]] = {}  # what a waiting tb needs (>= 0: a target's done; < 0: a
    # message on connection -1 - key; None: a step that does not exist) -> the tbs waiting for it
    heappush, heappop, heapreplace = heapq.heappush, heapq.heappop, heapq.heapreplace

    remaining = sum(nsteps) * iterations
    heap = [(0.0, 0.0, i) for i in range(ntbs) if nsteps[i]]
    heapq.heapify(heap)
    while remaining:
        if not heap:
            stuck = min(j for js in blocked_on.values() for j in js) if blocked_on else None
            if stuck is None:
                break
            rank, tb = tbs[stuck]
            raise CompileError(f"rank {rank} tb {tb.id} step {s_of[stuck]} can never run "
                               "(its message or dependency never comes; run msccl-compile verify)")
        when, since, i = heappop(heap)
        it, s = it_of[i], s_of[i]
        kind = kinds[i][s]
        t = clock[i]
        dep = deps[i][s]
        if dep >= 0:
            key = dep * iterations + it
            d = done_at.get(key)
            if d is None:
                blocked_on.setdefault(key, []).append(i)
                continue
            if d > t:
                t = d
        elif dep == NEVER:
            blocked_on.setdefault(None, []).append(i)  # woken by nothing
            continue
        if kind & RECV:
            conn = recv_conn[i]
            q, h = queues[conn], heads[conn]
            if h >= len(q):
                blocked_on.setdefault(-1 - conn, []).append(i)
                continue
            if q[h] > t:
                t = q[h]
        if t > when:  # not ready yet: come back then, so lanes go first come, first served
            heappush(heap, (t, t, i))
            continue
        if kind & SEND:
            route = route_of[i]
            if route is None:
                rank, tb = tbs[i]
                route = route_of[i] = routes.get(rank, tb.send)
            links, rate, alpha, latency = route
            start = t
            for l in links:
                free = lanes[l][0]
                if free > start:
                    start = free
            if start > when:  # no lane free on some link: try again when one is, behind those waiting longer
                heappush(heap, (start, since, i))
                continue
        if kind & RECV:
            heads[recv_conn[i]] += 1
        end = t
        if kind & LOCAL:
            end = t + cnts[i][s] * local_hold
            working[i] += end - t
        if kind & SEND:
            cnt = cnts[i][s]
            hold = cnt * piece / rate
            for l in links:
                heapreplace(lanes[l], start + hold)
                held[l] += hold
            if cnt > 1:
                latency *= calls[cnt]
            end = start + hold + latency
            working[i] += hold + latency
            if trace is not None and it == 0:
                rank, tb = tbs[i]
                trace[(rank, tb.id, s)] = (start, t, start + hold, end)
            arrive = end + alpha
            queues[send_conn[i]].append(arrive)
            if arrive > finished[it]:
                finished[it] = arrive
            if by_tb is not None:
                rank, tb = tbs[i]
                mine = by_tb.setdefault((rank, tb.id), [0.0] * iterations)
                mine[it] = max(mine[it], arrive)
        mark = marks[i][s]
        if mark >= 0:
            done_at[mark * iterations + it] = end
        clock[i] = end
        if end > finished[it]:
            finished[it] = end
        remaining -= 1
        if s + 1 < nsteps[i]:
            s_of[i] = s + 1
            heappush(heap, (end, end, i))
        elif it + 1 < iterations:
            it_of[i], s_of[i] = it + 1, 0
            heappush(heap, (end, end, i))
        else:
            s_of[i] = s + 1
        # the tbs this step unblocks: those waiting for it, or for the message it sent
        if blocked_on:
            if mark >= 0:
                for j in blocked_on.pop(mark * iterations + it, ()):
                    heappush(heap, (clock[j], clock[j], j))
            if kind & SEND:
                for j in blocked_on.pop(-1 - send_conn[i], ()):
                    heappush(heap, (clock[j], clock[j], j))
    if busiest is not None:  # per iteration: the seconds of the busiest link (at all its lanes) or thread block
        link = max((h / len(lanes[l]) for l, h in enumerate(held)), default=0.0)
        busiest.append(max(link, max(working, default=0.0)) / iterations)
    return _monotone(finished)  # an iteration is done no earlier than the one before it


SEND, RECV, LOCAL = 1, 2, 4
LOCALS = frozenset({"cpy", "re"})  # steps that copy or reduce in the rank's own memory (its thread block's time)
NEVER = -2  # a dependency on a step the program does not have: it never comes


class _Flat:
    """A program's steps as the timer's loop reads them, per thread block (in program order): kinds
    (SEND | RECV bits), deps (the mark of the step it depends on, -1 for none, NEVER for a step
    that does not exist), marks (this step's mark where some step depends on it, else -1), cnts;
    and each block's send and receive connection as an integer."""

    def __init__(self, program: Program):
        self.tbs = [(g.rank, tb) for g in program.gpus for tb in g.tbs]
        self.nsteps = [len(tb.steps) for _, tb in self.tbs]
        lengths = {(rank, tb.id): len(tb.steps) for rank, tb in self.tbs}
        targets: dict[tuple[int, int, int], int] = {}
        self.deps, self.kinds, self.cnts = [], [], []
        kind_of = {t: (SEND if t in SENDS else 0) | (RECV if t in RECVS else 0) for t in SENDS | RECVS}
        kind_of.update(dict.fromkeys(LOCALS, LOCAL))
        for rank, tb in self.tbs:
            deps, kinds, cnts = [], [], []
            for st in tb.steps:
                if st.depid < 0:
                    deps.append(-1)
                elif 0 <= st.deps < lengths.get((rank, st.depid), 0):
                    deps.append(targets.setdefault((rank, st.depid, st.deps), len(targets)))
                else:
                    deps.append(NEVER)
                kinds.append(kind_of.get(st.type, 0))
                cnts.append(st.cnt)
            self.deps.append(deps)
            self.kinds.append(kinds)
            self.cnts.append(cnts)
        self.marks = [[-1] * n for n in self.nsteps]
        index = {(rank, tb.id): i for i, (rank, tb) in enumerate(self.tbs)}
        for (rank, tb, s), mark in targets.items():
            self.marks[index[(rank, tb)]][s] = mark
        conns: dict[tuple[int, int, int], int] = {}
        self.send_conn = [conns.setdefault((rank, tb.send, tb.chan), len(conns)) for rank, tb in self.tbs]
        self.recv_conn = [conns.setdefault((tb.recv, rank, tb.chan), len(conns)) for rank, tb in self.tbs]
        self.nconns = len(conns)
        self.nsends = sum(1 for kinds in self.kinds for k in kinds if k & SEND)
        self.most_cnt = max((max(cnts, default=0) for cnts in self.cnts), default=0)

    @classmethod
    def of(cls, program: Program) -> "_Flat":
        """The last few programs' flattening, by the identity of their thread blocks (a protocol's
        copy of a lowering shares them; the memo keeps them alive)."""
        key = id(program.gpus)
        hit = _FLAT.get(key)
        if hit is None or hit[0] is not program.gpus:
            if len(_FLAT) >= 4:
                del _FLAT[next(iter(_FLAT))]
            hit = _FLAT[key] = (program.gpus, cls(program))
        return hit[1]


_FLAT: dict[int, tuple] = {}
_ROUTES: dict[tuple, _Routes] = {}
