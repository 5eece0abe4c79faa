"""Code generation for one rank: thread blocks, fused steps, buffer offsets and dependencies.

Input: the rank's moves (transfers after channel placement, compiler/lowering/channels.py), each
with a key. The keys of all ranks form one global order; a move's send and its receive have keys
that differ only in the side bit (send first). Every thread block runs its steps in key order,
which is what makes the program deadlock free (compiler/lowering/lower.py, "Why the order is safe").

Per rank (`lower_rank`), one function each: `rank_ops` (sends, receives, local copies i -> o),
`link_forwards` (which op wrote the value each send reads), `place_ops` (thread blocks, paired by
`pair_thread_blocks`), `fuse` (a receive and the send of the value it wrote become one rcs / rrcs /
rrs step), then `_RankGen` emits the steps in key order (a fused op at its receive's key) and
`_Emitter` gives each step its dependencies.
"""

from __future__ import annotations

import heapq
import operator
from dataclasses import dataclass, field, fields
from enum import Enum
from typing import Callable

import numpy as np

from compiler.lowering.channels import Move
from compiler.model.demand import Demand
from compiler.model.program import Step, ThreadBlock
from compiler.specs.errors import CompileError

Slot = tuple[str, int]  # (buffer, chunk offset)
UNUSED: Slot = ("o", -1)  # a field the step does not use (lower.fill_remote_fields fills some, §3)
CONSUMED: Slot = ("-", -1)  # a partial sent by rrs and stored nowhere


def same(slot: Slot) -> Slot:
    """The alias map of a rank whose input and output are apart (the emitter skips calling it)."""
    return slot


class LoweringError(CompileError):
    """The schedule cannot be lowered within a runtime's limits (one line: limit, value, rank, runtime)."""
    cut = False  # a deadline ended the search for a placement that fits (cut_short)


class TooManySteps(LoweringError):
    """A thread block needs more steps than a runtime allows (fewer channels per transfer, or no
    pacing nops, may fit where other placements do not)."""


def cut_short(why: LoweringError, how: str) -> LoweringError:
    """`why`, of its class, said to have been cut short by a deadline (`how`): a lowering given
    more time might not have failed, so none keeps it as the placement's verdict (its `cut`)."""
    out = type(why)(f"{why} ({how})")
    out.cut = True
    return out


class OpKind(Enum):
    SEND = "S"  # the send of a move
    RECV = "R"  # the receive of a move
    COPY = "C"  # a local copy i -> o of a chunk the rank both sources and keeps


SEND, RECV, COPY = OpKind.SEND, OpKind.RECV, OpKind.COPY  # plain names: Enum attribute lookup is slow


@dataclass(eq=False, slots=True)
class Op:
    """A send, receive or copy at a rank. Mutable: its thread block and (for a send) the op that
    wrote the value it sends are found after all ops exist. Compared by identity."""

    kind: OpKind
    key: tuple[int, int, int, int]  # Move.send_key / recv_key; (-1, 0, 0, chunk) for a copy
    move: Move | None  # None for a copy
    chunk: int
    tb: int = -1
    prev_write: Op | None = None  # for a send: the op that last wrote the value it sends


@dataclass(slots=True)
class DraftStep:
    """A step under construction. Mutable, not rebuilt with dataclasses.replace: `hasdep` is settled
    when a later step waits on it, a send's dst (a receive's src) when every rank is generated
    (lower.fill_remote_fields); each is one assignment in place. `to_step` freezes it."""

    type: str  # an MSCCL step type (compiler.model.program.STEP_TYPES)
    src: Slot
    dst: Slot
    cnt: int = 1
    depid: int = -1
    deps: int = -1
    hasdep: bool = False
    seq: int = 0  # emission order at the rank: steps are emitted in key order (compiler/lowering/merge.py)

    def to_step(self, made: dict | None = None) -> Step:
        """The frozen Step; with `made`, the one already made for the same fields, if any (a program
        repeats few distinct steps: 58,523 of 553,472 at 512 GPUs, where the program then pickles
        to the first process from the second in 6.6 MB and 0.5 s, not 29.5 MB and 3.3 s)."""
        key = (self.type, self.src, self.dst, self.cnt, self.depid, self.deps, self.hasdep)
        if made is not None:
            step = made.get(key)
            if step is not None:
                return step
        step = _new_step(self.type, self.src[0], self.src[1], self.dst[0], self.dst[1], self.cnt, self.depid,
                         self.deps, self.hasdep)
        if made is not None:
            made[key] = step
        return step


_set = object.__setattr__


def _new_step(type: str, srcbuf: str, srcoff: int, dstbuf: str, dstoff: int, cnt: int, depid: int, deps: int,
              hasdep: bool) -> Step:
    """Step(...) with every field given, made without the frozen dataclass's __init__ (an
    object.__setattr__ per field, a third of to_step)."""
    step = object.__new__(Step)
    _set(step, "__dict__", {"type": type, "srcbuf": srcbuf, "srcoff": srcoff, "dstbuf": dstbuf, "dstoff": dstoff,
                            "cnt": cnt, "depid": depid, "deps": deps, "hasdep": hasdep})
    return step


assert _new_step.__code__.co_varnames[:len(fields(Step))] == tuple(f.name for f in fields(Step))


@dataclass(slots=True)
class DraftThreadBlock:
    """A thread block under construction: peers and channel fixed, steps appended in key order."""

    send: int  # peer rank, -1 for none
    recv: int
    chan: int
    steps: list[DraftStep] = field(default_factory=list)

    def to_thread_block(self, id: int, made: dict | None = None) -> ThreadBlock:
        if made is None:
            return ThreadBlock(id, self.send, self.recv, self.chan, tuple(s.to_step() for s in self.steps))
        steps = []
        for s in self.steps:  # DraftStep.to_step(made), written out: a call per step was a third of this
            key = (s.type, s.src, s.dst, s.cnt, s.depid, s.deps, s.hasdep)
            step = made.get(key)
            if step is None:
                step = made[key] = _new_step(s.type, s.src[0], s.src[1], s.dst[0], s.dst[1], s.cnt, s.depid, s.deps,
                                             s.hasdep)
            steps.append(step)
        return ThreadBlock(id, self.send, self.recv, self.chan, tuple(steps))


@dataclass(frozen=True)
class RankCode:
    """One rank's generated code; its drafts stay open for lower.fill_remote_fields."""

    rank: int
    tbs: list[DraftThreadBlock]
    s_chunks: int
    inplace_ok: bool
    send_at: dict[int, tuple[int, int]]  # move pos -> (tb, step index) of the step that sends it
    recv_at: dict[int, tuple[int, int]]  # move pos -> (tb, step index) of the step that receives it

    def step(self, at: tuple[int, int]) -> DraftStep:
        return self.tbs[at[0]].steps[at[1]]


def lower_rank(rank: int, moves_out: list[Move], moves_in: list[Move], demand: Demand,
               alias: Callable[[Slot], Slot], pace: Callable[[int], int] | None = None,
               pair_slow: bool = False, max_nodes: int | None = None, pair_peers: bool = True,
               pace_ahead: int = 0, gate_slow: bool = False, ring_ids: bool = True,
               pace_fast: bool = True, cap: int | None = None, fuse_slow: bool = True,
               max_tbs: int | None = None) -> RankCode:
    """With `pace` (outgoing link id -> w, the thread blocks it carries at full rate under the
    per-thread-block cap), the first send of each run (a transfer's sub-chunks on one channel,
    Move.head) waits for the run w runs before it on the same outgoing link (w rounded up to a
    multiple of the widest transfer the rank sends over it: whole transfers in flight, and a
    transfer's runs never wait for each other), so the
    GPU feeds each link in the schedule's order (the planner timed them in that order) with as
    many runs in flight as the link carries at full rate; the later sends of a run follow it in
    its thread block. Without it, concurrent thread blocks share the link in whatever order they
    run. Pacing is an order, not a correctness need: where a wait costs a nop and the rank would
    store more than `max_nodes` XML nodes (1 + GPUs + thread blocks + steps), the rank is lowered
    again pacing only as many sends through nops as fit (the first ones). pace_ahead: runs in flight
    on a link beyond that (each run pays the step latency after its hold, with every lane idle when
    the runs in flight are whole transfers started together; runs beyond the lanes take them first
    come, first served). gate_slow: a send over a slow path (through a NIC) also waits for the
    latest receive of the rank that the schedule has arrive before the send starts, so that ranks
    sharing a NIC take it in about the schedule's order instead of first come, first served.
    ring_ids: thread blocks numbered by peer in ring order from this rank (pair_thread_blocks).
    pace_fast: False paces only sends over slow paths (Move.slow: through a NIC); a fast link's
    sends, gated by their data anyway, take its lanes first come, first served. Where the rank
    would store too many XML nodes, fast links lose their pacing before any slow one does.
    cap: where given, two peers share a thread block only where their steps fit it (pair_thread_blocks).
    fuse_slow: False gives each send peer over a slow path a thread block of its own (pair_thread_blocks).
    max_tbs: the thread blocks the rank may have; below it, local copies get a block of their own (place_ops).
    None: each copy goes first on the block of its chunk's first send, which then sends the output, and every
    other send of the chunk waits for it (LowerOptions.copies_apart off)."""
    if pace is not None:
        widest: dict[int, int] = {}
        for m in moves_out:
            widest[m.lane[0]] = max(widest.get(m.lane[0], 1), m.width)
        lanes = pace
        pace = lambda link: -(-lanes(link) // widest[link]) * widest[link] + pace_ahead
    budget = None  # pacing waits that may cost a nop (None: all)
    while True:
        ops = rank_ops(rank, moves_out, moves_in, demand)
        by_chunk, weights = link_forwards(ops)
        ring = (rank, demand.ngpus) if ring_ids else None
        tbs = place_ops(ops, weights, pair_slow, pair_peers, ring, cap, fuse_slow, max_tbs)
        copy_tb = None if max_tbs is not None else {o.chunk: o.tb for o in ops if o.kind is COPY}
        gen = _RankGen(rank, demand, by_chunk, _Emitter(tbs, alias, budget, copy_tb is not None), pace, gate_slow,
                       pace_fast, copy_tb)
        for op, fused in fuse(ops, len(tbs)):
            gen.emit(op, fused)
        excess = 0 if max_nodes is None else 1 + demand.ngpus + len(tbs) + sum(len(tb.steps) for tb in tbs) - max_nodes
        if excess <= 0:
            return RankCode(rank, tbs, len(gen.scratch), gen.em.inplace_ok, gen.send_at, gen.recv_at)
        if gen.em.pace_nops and pace_fast and gen.fast_paced:
            pace_fast = False  # a fast link's pacing nops go first (at 1,024 GPUs they crowded out the NIC's)
        elif max_tbs is not None and any(tb.send < 0 and tb.recv < 0 for tb in tbs):
            max_tbs = None  # then the copies' blocks of their own (an XML node each): on the blocks that send
        elif gen.em.pace_nops == 0:
            return RankCode(rank, tbs, len(gen.scratch), gen.em.inplace_ok, gen.send_at, gen.recv_at)
        else:
            budget = max(0, gen.em.pace_nops - excess)


def buffer_indices(demand: Demand) -> list[tuple[dict[int, int], dict[int, int]]]:
    """Per rank: chunk id -> its input-buffer index there, for the chunks the rank sources, and chunk
    id -> output-buffer index, for those it keeps (in chunk order). One pass over the demand for all
    ranks, kept for the last demands by identity: per rank, a scan of every chunk was quadratic (at
    1,024 GPUs a tenth of lowering)."""
    hit = _INDICES.get(id(demand))
    if hit is None or hit[0] is not demand:
        src: list[dict[int, int]] = [{} for _ in range(demand.ngpus)]
        dst: list[dict[int, int]] = [{} for _ in range(demand.ngpus)]
        for c in demand.chunks:
            for r, i in zip(c.sources, c.src_index):
                src[r].setdefault(c.id, i)
            for r, i in zip(c.dests, c.dst_index):
                dst[r].setdefault(c.id, i)
        if len(_INDICES) >= 2:
            del _INDICES[next(iter(_INDICES))]
        hit = _INDICES[id(demand)] = (demand, list(zip(src, dst)))
    return hit[1]


_INDICES: dict[int, tuple[Demand, list]] = {}
_key = operator.attrgetter("key")


def rank_ops(rank: int, moves_out: list[Move], moves_in: list[Move], demand: Demand) -> list[Op]:
    """The rank's ops in key order: the send of each outgoing move, the receive of each incoming
    one, and a copy (keyed first) of each chunk it both sources and keeps, unless a reduction lands
    there."""
    ops = [Op(SEND, (m.level, m.sub, 0, m.pos), m, m.chunk) for m in moves_out]  # Move.send_key, written out
    ops += [Op(RECV, (m.level, m.sub, 1, m.pos), m, m.chunk) for m in moves_in]  # Move.recv_key
    received = {m.chunk for m in moves_in}
    src_idx, dst_idx = buffer_indices(demand)[rank]
    for c in src_idx:
        if c in dst_idx and (not demand.reduce or c not in received):
            ops.append(Op(COPY, (-1, 0, 0, c), None, c))
    ops.sort(key=_key)
    if any(m.swap for m in moves_out):
        received: set[int] = set()  # chunks of which a swap receive came already
        for o in ops:
            if o.kind is not COPY and o.move.swap:
                if o.kind is RECV:
                    received.add(o.chunk)
                elif o.chunk in received:  # their `sub` groups differ: the send would carry what was received
                    raise LoweringError(f"lowering: rank {rank} chunk {o.chunk}: a send of its swap would come after "
                                        "one of its receives")
    return ops


def link_forwards(ops: list[Op]) -> tuple[dict[int, list[Op]], dict[tuple[int, int, int], int]]:
    """Each chunk's ops in key order, and the forwards: sets each send's `prev_write` and counts,
    per (chan, recv peer, send peer), the receives whose value a send on the same channel forwards."""
    by_chunk: dict[int, list[Op]] = {}
    for op in ops:
        by_chunk.setdefault(op.chunk, []).append(op)
    weights: dict[tuple[int, int, int], int] = {}
    for history in by_chunk.values():
        last = None
        for op in history:
            if op.kind is SEND and op.move.own:
                continue  # it reads the rank's input, whatever was written since: no forward
            if op.kind is SEND:
                op.prev_write = last
                if last is not None and last.kind is RECV and last.move.chan == op.move.chan:
                    k = (op.move.chan, last.move.src, op.move.dst)
                    weights[k] = weights.get(k, 0) + 1
            else:
                last = op
    return by_chunk, weights


def fewest_steps(rank: int, moves_out: list[Move], moves_in: list[Move], demand: Demand) -> int:
    """At least as few steps (nops aside) as the rank has after merge_runs, however its thread
    blocks pair peers: every op is a step but for a receive fused with a send of its value (at most
    once per receive that some send forwards) and the sends and receives of sub-chunks that are not
    the first of their run, which merge_runs may fold. lower checks it against the XML node limit
    before lowering every rank (DGX H100 x 4 allreduce 256 MB at 8 instances: 13 s of lowering to
    find 7,856 nodes where 4,095 fit)."""
    ops = rank_ops(rank, moves_out, moves_in, demand)
    link_forwards(ops)
    forwarded = {id(o.prev_write) for o in ops if o.kind is SEND and o.prev_write is not None
                 and o.prev_write.kind is RECV}
    folds = sum(1 for m in moves_out if not m.head) + sum(1 for m in moves_in if not m.head)
    return len(ops) - len(forwarded) - folds


def place_ops(ops: list[Op], weights: dict[tuple[int, int, int], int],
              pair_slow: bool = False, pair_peers: bool = True, ring: tuple[int, int] | None = None,
              cap: int | None = None, fuse_slow: bool = True,
              max_tbs: int | None = None) -> list[DraftThreadBlock]:
    """The rank's thread blocks and each op's `tb`. A copy of the rank's input into its output holds
    its block for its bytes at a block's local rate (compiler/program/timing.py), and no send waits
    for it (a send of the rank's own chunk reads the input): each copy goes on a block of its own
    while the rank has fewer than `max_tbs` blocks, the rest on the blocks that send least (ties: the
    block whose first send or receive comes latest, which would wait the longest anyway). On DGX
    A100 direct allgather 16 MB at 4 instances the program takes 82.2 us, as with copies free; each
    copy after its chunk's last send on that block took 103.4 (the last copies end after the last
    sends), and a broadcast root's copies on its sending blocks delayed its sends (hier 32 MB in 8
    chunks: 709.2 us, 448.3 apart). pair_slow: a receive over a
    slow path may share a thread block with a send peer that would not wait for it (saves thread
    blocks; the sends before it in key order delay it). ring: (rank, GPUs), see pair_thread_blocks."""
    sends = {(o.move.chan, o.move.dst) for o in ops if o.kind is SEND}
    recvs = {(o.move.chan, o.move.src) for o in ops if o.kind is RECV}
    slow = frozenset((o.move.chan, o.move.src) for o in ops if o.kind is RECV and o.move.slow)
    alone = frozenset() if fuse_slow else \
        frozenset((o.move.chan, o.move.dst) for o in ops if o.kind is SEND and o.move.slow)
    steps = None
    if cap is not None:
        counts: dict[tuple[int, int, int], int] = {}
        for o in ops:
            if o.kind is not COPY:
                k = (o.move.chan, 0, o.move.dst) if o.kind is SEND else (o.move.chan, 1, o.move.src)
                counts[k] = counts.get(k, 0) + 1
        steps = (cap, counts)
    peers = pair_thread_blocks(sends, recvs, weights, slow, _behind_slow(ops, slow) if pair_slow else None, pair_peers,
                               ring, steps, alone)
    copies = sum(1 for o in ops if o.kind is COPY)
    if copies:
        room = 0 if max_tbs is None else max(0, max_tbs - len(peers))
        peers = list(peers) + [(-1, -1, 0)] * max(0 if peers else 1, min(copies, room))
    send_tb = {(chan, s): i for i, (s, _, chan) in enumerate(peers) if s >= 0}
    recv_tb = {(chan, r): i for i, (_, r, chan) in enumerate(peers) if r >= 0}
    load = [0] * len(peers)
    first: list[tuple] = [()] * len(peers)  # the key of each block's first op: ties go by it, not by block ids
    sends_of: dict[int, int] = {}  # chunk -> the block of its first send
    for op in ops:
        if op.kind is SEND:
            op.tb = send_tb[(op.move.chan, op.move.dst)]
            load[op.tb] += 1
            sends_of.setdefault(op.chunk, op.tb)
        elif op.kind is RECV:
            op.tb = recv_tb[(op.move.chan, op.move.src)]
        else:
            continue
        if not first[op.tb]:
            first[op.tb] = op.key
    latest = [tuple(-x for x in k) for k in first]  # a block of copies alone has no first op: () sorts first
    for op in ops:
        if op.kind is COPY:
            if max_tbs is None and op.chunk in sends_of:
                op.tb = sends_of[op.chunk]
            else:
                op.tb = min(range(len(peers)), key=lambda t: (load[t], latest[t], t))
            load[op.tb] += 1
    return [DraftThreadBlock(s, r, ch) for s, r, ch in peers]


def _behind_slow(ops: list[Op], slow: frozenset[tuple[int, int]]) -> Callable[[int, int, int], bool]:
    """(chan, send peer, slow recv peer) -> whether a thread block with both would make a send wait
    for a slow receive: some send comes after one of the receives in key order but is scheduled
    before that receive's data arrives."""
    first: dict[tuple[int, int], list[Op]] = {}
    for op in ops:
        if op.kind is RECV and (op.move.chan, op.move.src) in slow:
            first.setdefault((op.move.chan, op.move.src), []).append(op)
    sends: dict[tuple[int, int], list[Op]] = {}
    for op in ops:
        if op.kind is SEND:
            sends.setdefault((op.move.chan, op.move.dst), []).append(op)

    def waits(chan: int, d: int, r: int) -> bool:
        return any(x.key < s.key and s.move.level < x.move.arrive
                   for x in first.get((chan, r), ()) for s in sends.get((chan, d), ()))
    return waits


def pair_thread_blocks(sends: set[tuple[int, int]], recvs: set[tuple[int, int]],
                       weights: dict[tuple[int, int, int], int],
                       slow: frozenset[tuple[int, int]] = frozenset(),
                       waits: Callable[[int, int, int], bool] | None = None,
                       pair_peers: bool = True, ring: tuple[int, int] | None = None,
                       steps: tuple[int, dict[tuple[int, int, int], int]] | None = None,
                       alone: frozenset[tuple[int, int]] = frozenset()) -> list[tuple[int, int, int]]:
    """(send peer, recv peer, chan) per thread block, sorted (= tb ids). sends/recvs hold (chan, peer);
    weights[(chan, recv peer, send peer)] counts forwards that could fuse on such a tb. Per channel:
    a receive over a slow path (in `slow`) gets a thread block of its own (sends placed behind it
    would wait many epochs for it) unless it shares one with a send peer none of whose sends would
    wait for it (`waits(chan, send peer, recv peer)` false; the same peer first), then pairs by
    weight, then (pair_peers) same-peer pairs, then the rest; without pair_peers every send and
    receive peer left has a thread block of its own (no two directions take turns in one block).
    ring: (rank, GPUs) to sort by peer in ring order from the rank ((peer - rank) mod GPUs) instead
    of by peer: every rank of a symmetric plan then lays its blocks out alike, so blocks that are
    ready at once (the timer takes them in id order; a GPU dispatches blocks in about that order,
    though CUDA does not promise it) pair up alike on every rank's link; by peer, each rank's
    network sends paired up differently and met three at a time at receivers the plan gave two
    (DGX H100 x 64 allgather 1 GB: 3.25 against 2.85 ms).
    steps: where given, (cap, count of sends (chan, 0, peer) and of receives (chan, 1, peer)): two
    peers share a block only where its steps (sends plus receives less the forwards that fuse)
    stay within cap; a block per peer is more blocks, but no more channel groups for them all.
    alone: (chan, send peer) pairs that get a thread block with no receive peer, first (LowerOptions.fuse_slow:
    a block pays a NIC's step latency after each send, and a receive on that block would wait it out)."""
    tbs = []

    def fits(chan: int, d: int, a: int) -> bool:
        if steps is None:
            return True
        cap, count = steps
        fused = weights.get((chan, a, d), 0)
        return count.get((chan, 0, d), 0) + count.get((chan, 1, a), 0) - fused <= cap

    for chan in sorted({c for c, _ in sends} | {c for c, _ in recvs}):
        free_s = {p for c, p in sends if c == chan}
        free_r = {p for c, p in recvs if c == chan}
        for p in sorted(free_s):
            if (chan, p) in alone:
                tbs.append((p, -1, chan))
                free_s.discard(p)
        for p in sorted(free_r):
            if (chan, p) in slow:
                mate = next((d for d in [p] + sorted(free_s - {p})
                             if d in free_s and waits is not None and not waits(chan, d, p) and fits(chan, d, p)), -1)
                tbs.append((mate, p, chan))
                free_r.discard(p)
                free_s.discard(mate)
        ranked = sorted((-w, a, d) for (c, a, d), w in weights.items() if c == chan and w > 0)
        for _, a, d in ranked:
            if a in free_r and d in free_s and fits(chan, d, a):
                tbs.append((d, a, chan))
                free_r.discard(a)
                free_s.discard(d)
        if not pair_peers:
            tbs += [(p, -1, chan) for p in sorted(free_s)] + [(-1, p, chan) for p in sorted(free_r)]
            continue
        for p in sorted(free_s & free_r):
            if fits(chan, p, p):
                tbs.append((p, p, chan))
                free_s.discard(p)
                free_r.discard(p)
        if steps is not None:  # the heaviest sender first, with the heaviest receiver that fits; the rest alone
            rest_r = sorted(free_r, key=lambda p: (steps[1].get((chan, 1, p), 0), p))
            for d in sorted(free_s, key=lambda p: (-steps[1].get((chan, 0, p), 0), p)):
                j = next((j for j in range(len(rest_r) - 1, -1, -1) if fits(chan, d, rest_r[j])), -1)
                tbs.append((d, rest_r.pop(j) if j >= 0 else -1, chan))
            tbs += [(-1, a, chan) for a in rest_r]
            continue
        rest_s, rest_r = sorted(free_s), sorted(free_r)
        for i in range(max(len(rest_s), len(rest_r))):
            tbs.append((rest_s[i] if i < len(rest_s) else -1, rest_r[i] if i < len(rest_r) else -1, chan))
    if ring is not None:
        rank, n = ring
        return sorted(tbs, key=lambda tb: (*((p - rank) % n if p >= 0 else -1 for p in tb[:2]), tb[2]))
    return sorted(tbs)


def fuse(ops: list[Op], ntb: int, fanned_apart: bool = True) -> list[tuple[Op, Op | None]]:
    """Units (op, the send it is fused with or None: plain tuples, one per step) in key order: a
    receive followed directly in its thread block by a send of the value it wrote is one unit (one
    step, at the receive's key), unless a send in another thread block reads that value too: a
    fused step is done when its send is (hold and step latency), and the other blocks' sends, which
    wait for the step, would wait for that instead of the receive alone (DGX A100 allreduce 4 MB,
    direct: the owner's sum went out 5.4 us late, 54.2 -> 41.6 us)."""
    per_tb: list[list[Op]] = [[] for _ in range(ntb)]
    fanned: set[int] = set()  # ids of receives whose value a send in another thread block reads
    for op in ops:
        per_tb[op.tb].append(op)
        if fanned_apart and op.kind is SEND and op.prev_write is not None and op.prev_write.tb != op.tb:
            fanned.add(id(op.prev_write))
    units: list[tuple[tuple[int, int, int, int], Op, Op | None]] = []  # keyed for the sort
    for lst in per_tb:
        i, n = 0, len(lst)
        while i < n:
            op = lst[i]
            nxt = lst[i + 1] if i + 1 < n else None
            if op.kind is RECV and nxt is not None and nxt.kind is SEND and nxt.prev_write is op and id(op) not in fanned:
                units.append((op.key, op, nxt))
                i += 2
            else:
                units.append((op.key, op, None))
                i += 1
    units.sort(key=_first)  # keys differ: no two ops of a rank have one
    return [(op, fused) for _, op, fused in units]


_first = operator.itemgetter(0)


class _RankGen:
    """Emits one rank's units in key order, tracking where each chunk's current value lives."""

    def __init__(self, rank: int, demand: Demand, by_chunk: dict[int, list[Op]],
                 em: _Emitter, pace: Callable[[int], int] | None, gate_slow: bool = False, pace_fast: bool = True,
                 copy_tb: dict[int, int] | None = None):
        self.rank, self.reduce, self.by_chunk, self.em, self.pace, self.gate_slow = \
            rank, demand.reduce, by_chunk, em, pace, gate_slow
        self.copy_tb = copy_tb  # chunk -> its copy's block, where that block's send reads the copy (copies_apart off)
        self.pace_fast = pace_fast
        self.fast_paced = False  # whether a send over a fast path was paced
        self.src_idx, self.dst_idx = buffer_indices(demand)[rank]
        self.cur: dict[int, Slot | None] = {} if self.reduce else {c: ("i", i) for c, i in self.src_idx.items()}
        self.scratch: dict[int, int] = {}
        self.send_at: dict[int, tuple[int, int]] = {}
        self.recv_at: dict[int, tuple[int, int]] = {}
        self.sends: dict[int, list[tuple[int, int]]] = {}  # outgoing link -> its runs' first send steps so far
        self.arrivals: list[tuple[int, int, tuple[int, int]]] = []  # heap of (arrive epoch, pos, step) of receives
        self.gate: tuple[int, int] | None = None  # the latest receive planned to arrive before the current send
        self.window: dict[int, int] = {}  # outgoing link -> pace(link), asked once

    def landing(self, c: int) -> Slot:
        if c in self.dst_idx:
            return ("o", self.dst_idx[c])
        if c not in self.scratch:
            self.scratch[c] = len(self.scratch)
        return ("s", self.scratch[c])

    def operand(self, c: int) -> Slot | None:
        """The local value a reduce receipt combines with (None: nothing to combine)."""
        v = self.cur.get(c)
        if v is None and self.reduce and c in self.src_idx:
            return ("i", self.src_idx[c])
        if v == CONSUMED:
            raise LoweringError(f"lowering: rank {self.rank} chunk {c}: a partial sum is used after it was forwarded")
        return v

    def needed_later(self, op: Op, skip: Op) -> bool:
        """Whether the value `op` writes is read later at this rank (or is the rank's output)."""
        history = self.by_chunk[op.chunk]
        for later in history[history.index(op) + 1:]:
            if later is skip:
                continue
            if later.kind is SEND or (later.kind is RECV and later.move.reduce):
                return True
            if later.kind is RECV:
                return False
        return op.chunk in self.dst_idx

    def paced(self, send: Op) -> tuple[tuple[int, int], ...]:
        """The steps the first send of a run waits for besides its data: the send w runs before it
        on its link (pacing: only over a slow path unless pace_fast) and, with gate_slow on a slow
        path, the gate. Receives are emitted in key order and a send's level is at least its start,
        so the gate has a smaller key."""
        m = send.move
        if not m.head:
            return ()
        out = []
        if self.gate_slow and m.slow:
            while self.arrivals and self.arrivals[0][0] <= m.level:
                self.gate = heapq.heappop(self.arrivals)[2]
            if self.gate is not None:
                out.append(self.gate)
        if self.pace is not None and (self.pace_fast or m.slow):
            link = m.lane[0]
            before = self.sends.get(link, ())
            w = self.window.get(link)
            if w is None:
                w = self.window[link] = self.pace(link)
            if len(before) >= w:
                out.append(before[-w])
                self.fast_paced |= not m.slow
        return tuple(out)

    def sent(self, send: Op, at: tuple[int, int]) -> None:
        self.send_at[send.move.pos] = at
        if send.move.head:
            self.sends.setdefault(send.move.lane[0], []).append(at)

    def emit(self, op: Op, fused: Op | None) -> None:
        """Emit one unit: an op, or a receive fused with the send of its value."""
        if op.kind is COPY:
            self.copy(op)
        elif op.kind is SEND:
            self.send(op)
        else:
            self.receive(op, fused)

    def copy(self, op: Op) -> None:
        c = op.chunk
        src, dst = ("i", self.src_idx[c]), ("o", self.dst_idx[c])
        self.em.emit(op.tb, "cpy", src, dst, (src,), (dst,), clobbers=self.em.alias(src) != self.em.alias(dst))
        if self.reduce:
            self.cur[c] = dst

    def send(self, op: Op) -> None:
        c, t = op.chunk, op.tb
        v = ("i", self.src_idx[c]) if op.move.own else self.operand(c) if self.reduce else self.cur.get(c)
        if v is None:
            raise LoweringError(f"lowering: schedule transfer {op.move.pos}: rank {self.rank} sends chunk {c} "
                                "before it holds it")
        if self.copy_tb is not None and not self.reduce and v == ("i", self.src_idx.get(c)) \
                and self.copy_tb.get(c) == t:
            v = ("o", self.dst_idx[c])
        self.sent(op, (t, self.em.emit(t, "s", v, UNUSED, (v,), (), after=self.paced(op))))

    def receive(self, op: Op, fused: Op | None) -> None:
        """A receive, alone (r, rrc) or fused with the send of its value (rcs, rrcs, or rrs when the
        partial sum is needed nowhere else)."""
        c, t, em = op.chunk, op.tb, self.em
        local = self.operand(c) if op.move.reduce else None
        if fused is not None and local is not None and not self.needed_later(op, fused):
            idx = em.emit(t, "rrs", local, UNUSED, (local,), (), after=self.paced(fused))
            self.cur[c] = CONSUMED
        else:
            d = self.landing(c)
            if fused is None and local is None:
                idx = em.emit(t, "r", UNUSED, d, (), (d,))
            elif fused is None:
                idx = em.emit(t, "rrc", local, d, (local,), (d,))
            elif local is None:
                idx = em.emit(t, "rcs", d, d, (), (d,), after=self.paced(fused))
            else:
                idx = em.emit(t, "rrcs", local, d, (local,), (d,), after=self.paced(fused))
            self.cur[c] = d
        self.recv_at[op.move.pos] = (t, idx)
        if self.gate_slow:
            heapq.heappush(self.arrivals, (op.move.arrive, op.move.pos, (t, idx)))
        if fused is not None:
            self.sent(fused, (t, idx))


def _unknown(need: dict[int, int], knows: Callable[[int], int]) -> list[tuple[int, int]]:
    """The waits (tb, step) of `need` that the clock (knows: tb -> the last step of it known) does
    not imply, sorted (most steps wait for one block: no sort then)."""
    if len(need) == 1:
        for d, k in need.items():
            return [(d, k)] if knows(d) < k else []
    return sorted([(d, k) for d, k in need.items() if knows(d) < k])


class _AliasMemo(dict):
    """slot -> the slot an alias map names it by, computed once per slot (a rank names few slots, and
    emit maps every slot it touches)."""

    def __init__(self, alias: Callable[[Slot], Slot]):
        super().__init__()
        self.alias = alias

    def __missing__(self, slot: Slot) -> Slot:
        named = self[slot] = self.alias(slot)
        return named


class _Emitter:
    """Appends steps to thread blocks and derives their dependencies: a step waits on the last writer
    of every slot it reads and, for a slot it writes, on that slot's last writer and readers in other
    thread blocks (RAW, WAW, WAR). Waits already implied by earlier waits (vector clocks) are
    dropped; the rest become nops before the step, the step carrying the last one. A clock is a
    numpy array, never changed once a step's snapshot refers to it (a join makes a new one), and
    its own entry is not kept in it (a snapshot is the clock of step k of its block, which knows
    its own k): with a hundred thread blocks and thousands of steps per rank (512 GPUs), a list
    copied per step was most of lowering."""

    def __init__(self, tbs: list[DraftThreadBlock], alias: Callable[[Slot], Slot], pace_budget: int | None = None,
                 ordered_copies: bool = False):
        self.tbs = tbs
        self.ordered_copies = ordered_copies  # reads of the input wait for an in-place self-copy too (copies_apart off)
        self.pace_budget = pace_budget  # pacing waits that may still cost a nop (None: any number)
        self.pace_nops = 0  # nops spent on pacing waits
        ntb = len(tbs)
        self.known = [np.full(ntb, -1) for _ in range(ntb)]  # known[t][d]: last step of tb d that tb t waited for
        self.snap: list[dict[int, np.ndarray]] = [{} for _ in range(ntb)]  # snap[tb][step]: the clock it ran with
        self.alias = alias
        self.named = None if alias is same else _AliasMemo(alias)
        self.writer: dict[Slot, tuple[int, int]] = {}
        self.readers: dict[Slot, list[tuple[int, int]]] = {}  # reads since the slot's last write, but of the input:
        self.input_readers: dict[Slot, list[tuple[int, int]]] = {}  # those since its last clobbering write
        self.self_copied: set[Slot] = set()  # slots whose last write is an in-place self-copy
        self.clobbered: set[Slot] = set()
        self.inplace_ok = True
        self.seq = 0

    def emit(self, tb: int, kind: str, src: Slot, dst: Slot, reads: tuple[Slot, ...],
             writes: tuple[Slot, ...], clobbers: bool = True, after: tuple[tuple[int, int], ...] = ()) -> int:
        """Append a step (after the nops its dependencies need); returns its index. A write that
        does not clobber (an in-place self-copy) still orders other accesses to the slot. `after`:
        more steps to wait for (send pacing and gates: _RankGen.paced)."""
        named = self.named
        if named is None:
            reads_n, writes_n = reads, writes
        else:  # a step reads a slot at most and writes one at most: no map() for one
            reads_n = (named[reads[0]],) if len(reads) == 1 else tuple(map(named.__getitem__, reads))
            writes_n = (named[writes[0]],) if len(writes) == 1 else tuple(map(named.__getitem__, writes))
        deps = self._waits(tb, reads_n, writes_n, after, clobbers,
                           self._input_reads(reads, reads_n) if (self.self_copied or not clobbers)
                           and not self.ordered_copies else ())
        steps = self.tbs[tb].steps
        seq = self.seq
        if deps:
            for d, k in deps[:-1]:
                seq += 1
                steps.append(DraftStep("nop", UNUSED, UNUSED, 0, d, k, False, seq))
            depid, depstep = deps[-1]
            self.known[tb] = known = self._join(self.known[tb], deps)
        else:
            depid = depstep = -1
            known = self.known[tb]
        idx = len(steps)
        self.seq = seq = seq + 1
        steps.append(DraftStep(kind, src, dst, 1, depid, depstep, False, seq))
        self.snap[tb][idx] = known
        at = (tb, idx)
        if reads_n:
            clobbered = self.clobbered
            for s, orig in zip(reads_n, reads):
                if orig[0] == "i":
                    if s in clobbered:
                        self.inplace_ok = False
                    readers = self.input_readers
                else:
                    readers = self.readers
                if s in readers:
                    readers[s].append(at)
                else:
                    readers[s] = [at]
        for s in writes_n:
            self.writer[s] = at
            self.readers[s] = []
            if clobbers:
                self.clobbered.add(s)
                self.self_copied.discard(s)
                self.input_readers[s] = []
            else:
                self.self_copied.add(s)
        return idx

    def _input_reads(self, reads: tuple[Slot, ...], reads_n: tuple[Slot, ...]) -> tuple[Slot, ...]:
        """The (alias-named) slots a step reads from the input buffer."""
        return tuple(s for s, orig in zip(reads_n, reads) if orig[0] == "i")

    def _waits(self, tb: int, reads: tuple[Slot, ...], writes: tuple[Slot, ...],
               after: tuple[tuple[int, int], ...], clobbers: bool = True,
               input_reads: tuple[Slot, ...] = ()) -> list[tuple[int, int]]:
        """The (tb, step) waits of a step of `tb` that reads and writes these (alias-named) slots,
        sorted, less those its clock already implies; `after` joins them unless that costs a nop
        beyond the budget. An in-place self-copy (a write that does not clobber) and a read of the
        input are not ordered: in the out-of-place call they touch different buffers, and in the
        in-place call the copy writes the values the read finds either way."""
        need: dict[int, int] = {}  # thread block -> the latest of its steps this one must wait for
        writer, readers = self.writer, self.readers
        # want(target) written out in the loops below (a closure made per step, and its calls, were 4 % of
        # lowering): wait for `target` where it is another thread block's step later than any of its steps
        # waited for so far
        for s in reads:
            w = writer.get(s)
            if w is not None and w[0] != tb and need.get(w[0], -1) < w[1]:
                if s in input_reads and s in self.self_copied:
                    continue
                need[w[0]] = w[1]
        for s in writes:
            w = writer.get(s)
            if w is not None and w[0] != tb and need.get(w[0], -1) < w[1]:
                need[w[0]] = w[1]
            for r in readers.get(s, ()):
                if r[0] != tb and need.get(r[0], -1) < r[1]:
                    need[r[0]] = r[1]
            if clobbers:
                for r in self.input_readers.get(s, ()):
                    if r[0] != tb and need.get(r[0], -1) < r[1]:
                        need[r[0]] = r[1]
        if not need and not after:
            return []
        knows = self.known[tb].item
        deps = _unknown(need, knows) if need else []
        if after:
            more = False  # whether `after` adds a wait
            for target in after:
                if target[0] != tb and need.get(target[0], -1) < target[1]:
                    need[target[0]] = target[1]
                    more = True
            paced = _unknown(need, knows) if more else deps
            if len(paced) > max(1, len(deps)):  # the pacing wait costs a nop
                if self.pace_budget is None or self.pace_nops < self.pace_budget:
                    self.pace_nops += 1
                    deps = paced
            else:
                deps = paced
        return deps

    def _join(self, known: np.ndarray, deps: list[tuple[int, int]]) -> np.ndarray:
        """The clock of a step that waits for `deps` after `known` (a new array); marks the steps
        waited for."""
        tbs, snap = self.tbs, self.snap
        for d, k in deps:
            tbs[d].steps[k].hasdep = True
            known = np.maximum(known, snap[d][k])
            if known.item(d) < k:
                known[d] = k
        return known
