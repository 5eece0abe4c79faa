"""Timing any MSCCL program (ours or another tool's) under the schedule simulator's alpha-beta
model, so XML files can be compared on equal terms.

Every thread block runs its steps in order. A send-type step moves cnt chunks to its peer over the
topology's best path: it starts when the step is ready (program order, its dependency, and for
rcs/rrs/rrcs the incoming message) and a slot is free on every link of the path, holds those links
for bytes / (slowest bandwidth on the path), and its data arrives alpha later. A receive completes
when its message has arrived. Local steps (cpy, re, nop) take no time. A program has no global
transfer order, so links are granted first come, first served in time order (the schedule
simulator grants them in schedule order). Connection slot limits are the verifier's business.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass

from compiler.specs.errors import CompileError
from compiler.model.program import RECVS, SENDS, Program
from compiler.model.topology import Topology


@dataclass(frozen=True)
class ProgramTiming:
    finish_time_s: float
    algbw: float  # size / time (nccl-tests' definition of size)
    chunk_bytes: float
    ntransfers: int


def call_bytes(program: Program, size_bytes: float) -> float:
    """The bytes of one call of `program` (nchunksperloop chunks, msccl-xml.md §4) for the size a
    user gives: nccl-tests' size for the standard collectives; for a custom program that carries
    its demand, the size of one chunk of the demand (as `msccl-compile custom --size` takes it),
    which the program holds as demand.chunks_per_rank chunks."""
    d = program.demand
    if program.collective != "custom" or d is None:
        return size_bytes
    return size_bytes / d.chunks_per_rank * program.nchunksperloop


def time_program(program: Program, topo: Topology, size_bytes: int, trace: dict | None = None) -> ProgramTiming:
    """trace: if given, filled with (rank, tb, step) -> (start, ready) of every send."""
    if program.ngpus != topo.ngpus:
        raise CompileError(f"simulate: the program is for {program.ngpus} GPUs, {topo.name} has {topo.ngpus}")
    chunk = size_bytes / program.nchunksperloop
    tbs = [(g.rank, tb) for g in program.gpus for tb in g.tbs]
    pc = [0] * len(tbs)
    clock = [0.0] * len(tbs)  # when the tb's previous step finished
    done_at: dict[tuple[int, int, int], float] = {}  # (rank, tb, step) -> finish time
    queues: dict[tuple[int, int, int], list[float]] = {}  # (src, dst, chan) -> arrival times, FIFO
    heads: dict[tuple[int, int, int], int] = {}
    slots = [[0.0] * l.count for l in topo.links]  # heap of free times per parallel link
    routes: dict[tuple[int, int], tuple] = {}
    sent = 0

    def route(a: int, b: int):
        if (a, b) not in routes:
            if not topo.paths(a, b):
                raise CompileError(f"simulate: rank {a} sends to rank {b}, but {topo.name} has no path between them")
            p = topo.best_path(a, b)
            routes[(a, b)] = (topo.path_links(p), topo.path_bandwidth(p), topo.path_alpha(p))
        return routes[(a, b)]

    blocked_on: dict[tuple, list[int]] = {}  # what a waiting tb needs -> the tbs waiting for it

    def ready_time(i: int) -> float | tuple:
        """When step pc[i] can start, or the key of what it still waits for."""
        rank, tb = tbs[i]
        step = tb.steps[pc[i]]
        t = clock[i]
        if step.depid >= 0:
            key = (rank, step.depid, step.deps)
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

    remaining = sum(len(tb.steps) for _, tb in tbs)
    heap = [(0.0, i) for i in range(len(tbs)) if tbs[i][1].steps]
    heapq.heapify(heap)
    finish = 0.0
    while remaining:
        if not heap:
            stuck = min(j for js in blocked_on.values() for j in js) if blocked_on else None
            if stuck is None:
                break
            rank, tb = tbs[stuck]
            raise CompileError(f"simulate: rank {rank} tb {tb.id} step {pc[stuck]} can never run "
                               "(its message or dependency never comes; run msccl-compile verify)")
        when, i = heapq.heappop(heap)
        t = ready_time(i)
        if isinstance(t, tuple):
            blocked_on.setdefault(t, []).append(i)
            continue
        if t > when:  # not ready yet: come back then, so links go first come, first served
            heapq.heappush(heap, (t, i))
            continue
        rank, tb = tbs[i]
        step = tb.steps[pc[i]]
        if step.type in RECVS:
            conn = (tb.recv, rank, tb.chan)
            heads[conn] = heads.get(conn, 0) + 1
        end = t
        if step.type in SENDS:
            links, bw, alpha = route(rank, tb.send)
            start = max([t] + [slots[l][0] for l in links])
            hold = step.cnt * chunk / bw
            for l in links:
                heapq.heapreplace(slots[l], start + hold)
            end = start + hold
            if trace is not None:
                trace[(rank, tb.id, pc[i])] = (start, t)
            queues.setdefault((rank, tb.send, tb.chan), []).append(end + alpha)
            finish = max(finish, end + alpha)
            sent += 1
        done_at[(rank, tb.id, pc[i])] = end
        clock[i] = end
        finish = max(finish, end)
        pc[i] += 1
        remaining -= 1
        if pc[i] < len(tb.steps):
            heapq.heappush(heap, (end, i))
        # the tbs this step unblocks: those waiting for it, or for the message it sent
        if blocked_on:
            wake(("done", rank, tb.id, pc[i] - 1))
            if step.type in SENDS:
                wake(("sent", rank, tb.send, tb.chan))
    return ProgramTiming(finish, size_bytes / finish if finish > 0 else float("inf"), chunk, sent)
