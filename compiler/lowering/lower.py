"""Lowering: Schedule -> Program (the MSCCL IR), within the limits of a target runtime.

Pipeline (one function each):
1. `check_transfers`: every transfer names a chunk of the demand, two ranks and a path of the
   topology, and sends only what its source holds (schedule order).
2. `transfer_levels`: a level per transfer, its start epoch raised so that, at each rank and chunk,
   a send comes after the receive that wrote the value (RAW), and a receive after every earlier
   send (WAR) and receive (WAW) of that chunk there, all in schedule order. Transfers of a sender's
   own contribution (Transfer.own) read its input, not what it received, and their sums add up in
   any order: they all take one level, so that every rank sends its own before it adds any in
   (the send half of a key sorts first), which keeps the program usable in place.
   A chunk's swap (Transfer.swap) takes one level too, so that each of its ranks sends its value
   before it adds in what the others sent.
3. `parallel_lanes`, `lane_widths`, `first_split`, `chunk_splits`, `place_moves`
   (compiler/lowering/channels.py): each transfer becomes `instances` moves, spread over as many
   channels as its first link needs lanes (the rest run on one channel), each move with a channel
   (lane, instance run, channel group) and a `sub` group of its level; `lower` widens the channel
   groups (from LowerOptions.groups) until thread blocks fit the step limit, and pairs slow receives
   with sends where the thread blocks would not fit otherwise.
4. `lower_rank` (compiler/lowering/codegen.py): thread blocks, fused steps, offsets, dependencies,
   pacing (each outgoing link fed in schedule order).
5. `fill_remote_fields`: the msccl-xml.md §3 convention for the fields a step does not use;
   `merge_runs` (compiler/lowering/merge.py): a run of one transfer's sub-chunks on one channel
   becomes one step with cnt > 1.
6. `check_limits`, then the Program.

Buffers: a source reads its chunk from i[src_index]; a destination keeps it in o[dst_index]; any
other rank that holds it (a relay, a partial sum) keeps it in scratch, one slot per (rank, chunk),
never reused. A rank that is a source and a destination of a copy chunk copies i -> o first (in
the thread block of its first send of it, whose sends then read o). Reduce receipts combine with
the local value (own input for the first, then the stored partial) read from src; a send of a
rank's own contribution (Transfer.own) reads its input.

Why the order is safe. Every step has a key: a send (level, sub, 0, pos), its receive
(level, sub, 1, pos); a fused op is ordered by its receive and no other op of its thread block lies
between its two halves. Each thread block runs in key order, and every wait (program order, an
incoming message, a dependency, a full connection) is on an op with a smaller key: a full
connection holds `slots` messages, at most slots-2 of them from the blocked send's own group, so
the oldest came from a smaller group and its receive has a smaller key. Pacing adds waits on earlier sends of
the rank (smaller keys); a merged run waits only on what its members waited on, all of smaller
key than its first member (compiler/lowering/merge.py). The op with the smallest
key not yet done can therefore always run: no deadlock under bounded slots (msccl-xml.md §7.5).
The same argument with send-and-receive-at-one-key is why msccl-tools' one global order works.
"""

from __future__ import annotations

import functools
import math
import re
import time
from dataclasses import dataclass
from typing import Callable

from compiler.analysis.links import Costing
from compiler.model.demand import Demand
from compiler.specs.collectives import CUSTOM, inplace_alias
from compiler.specs.errors import CompileError
from compiler.specs.runtimes import (ALL, CHOICES, MAX_CHANNELS, NAMES, runtime, MAX_CNT, MAX_DEPID, MAX_NODES, MAX_OFFSET,
                                    MAX_TBS_PER_CHANNEL, limits_for, narrower, target_runtimes)
from compiler.model.program import AUTO, PROTOCOLS, SLOTS, GpuProgram, Program
from compiler.model.schedule import Schedule, Transfer, swap_groups
from compiler.model.topology import Topology
from compiler.lowering.channels import (Move, chunk_splits, first_split, lane_widths, parallel_lanes, place_moves,
                                        spread_peers)
from compiler.lowering.codegen import (LoweringError, RankCode, Slot, TooManySteps, cut_short, fewest_steps, lower_rank,
                                       same)
from compiler.lowering.merge import merge_runs
from compiler.gcpause import without_gc

__all__ = ["LowerOptions", "LoweringError", "TooManySteps", "RuntimeLimits", "RUNTIMES", "runtime_limits", "lower"]

RUNTIMES = CHOICES


@dataclass(frozen=True)
class RuntimeLimits:
    runtime: str
    max_steps: int  # steps per thread block, nops included
    max_tbs: int  # thread blocks per rank
    tb_reason: str  # why max_tbs
    sms: int = 0
    max_channels: int = MAX_CHANNELS
    max_per_channel: int = MAX_TBS_PER_CHANNEL  # thread blocks with a send (with a recv) peer per channel
    max_nodes: int = MAX_NODES  # 1 + ngpus + ntb + nsteps per rank
    max_depid: int = MAX_DEPID
    max_cnt: int = MAX_CNT
    max_offset: int = MAX_OFFSET  # offsets are int16
    targets: tuple[str, ...] = ()  # the runtimes whose limits these are


def runtime_limits(runtime: str, sms: int = 0, targets: tuple[str, ...] = ()) -> RuntimeLimits:
    """The runtime spec's limits as the lowering counts them (thread blocks allowed, not the bound
    they must stay below); 'all' is the strictest of `targets` (default: of every runtime). sms > 0
    caps thread blocks below the SM count (all blocks must be co-resident)."""
    try:
        lim = limits_for(runtime, declared=targets)
    except CompileError as e:
        raise LoweringError(str(e)) from None
    return RuntimeLimits(runtime, lim.max_steps, lim.blocks(sms), lim.blocks_reason(sms), sms=sms, targets=lim.runtimes)


def targets_of(collective: str, runtime: str, vendor: str) -> tuple[str, ...]:
    """The runtimes a program lowered for `runtime` on `vendor`'s GPUs targets."""
    return target_runtimes(collective, ALL, vendor) if runtime == ALL else (runtime,)


@dataclass(frozen=True)
class LowerOptions:
    proto: str = "Simple"
    instances: int = 1  # copies of the program on separate channels, each on 1/k of every chunk
    min_bytes: int = 0  # written as minBytes (inclusive)
    max_bytes: int = 0  # written as maxBytes (inclusive); 0 = no limit (the XML writer makes it finite)
    runtime: str = ALL  # whose limits to respect: a runtime's name, or all (the strictest)
    name: str | None = None  # default f"{collective}-{topology}-{planner}"
    inplace: bool | None = None  # None: claim in-place use wherever the program is correct in place
    pace: bool = True  # each GPU feeds an outgoing link in schedule order (the order the planner timed)
    fit_lanes: bool = True  # a transfer spreads over only as many of its instances' channels as its link needs
    pair_peers: bool = True  # a send and a receive peer that forward nothing between them may share a thread
    # block (fewer blocks; their steps take turns); False gives each its own, an error where the blocks do not fit
    pace_ahead: int = 0  # runs in flight on a paced link beyond its lanes (codegen.lower_rank)
    pace_fast: bool = True  # pace sends over fast links too; False: only over slow paths (through a NIC). At 512
    # GPUs pacing the NVSwitch fan-out cost a nop per send (a third of a rank's steps), and at 1,024 those nops
    # reached the XML node limit, which then cut the NIC pacing that pays
    gate_slow: bool = False  # a send through a NIC waits for the rank's receive planned just before it (codegen)
    groups: int = 1  # channel groups whole chunks spread over at least: a connection gets a thread block per group
    # that carries its chunks, so its sends run on several blocks at once where more instances cannot split chunks
    rotate_slow: int = 1  # channel group sets a connection over a slow path takes in turn, transfer by transfer
    # (channels.place_moves): a thread block pays the step latency after each send, so a NIC fed by two blocks
    # in turn (a chain's forwards to the next node each way) idles that long every other send
    lanes_across: bool = False  # a pair's transfers take its parallel links' lanes in turn across levels, not
    # from lane 0 at each level (channels.parallel_lanes): one send a level to a peer then no longer queues on one block
    fuse_slow: bool = True  # a send through a NIC may share a thread block with a receive (fused into rcs/rrs where
    # it forwards the received value); False gives its peer a block of its own, so the receives do not wait out the
    # NIC's step latency after each send (reduce-scatter's sums out of a node: the receive of the next sum waited)
    ring_ids: bool = True  # thread blocks numbered by peer in ring order from their rank (codegen.pair_thread_blocks);
    # False: by peer id, as before the twelfth session (slower wherever ranks run alike)
    copies_apart: bool = True  # a rank's copies of its input into its output on blocks of their own, which no send
    # waits for (codegen.place_ops); False: each first on the block of its chunk's first send, which sends the copy,
    # and every other send of the chunk waits for it (realise's LEAD, see there)


def _copy_room(lim: RuntimeLimits, options: LowerOptions) -> int | None:
    """lower_rank's max_tbs: the blocks a rank may have where its copies go apart, else None."""
    return lim.max_tbs if options.copies_apart else None


CAPPED_TRIES = 6  # lowerings with peers paired only where their steps fit, after the first (MI250 x 16 alltoall: 4)


def too_many_instances(instances: int) -> str | None:
    """Why `instances` cannot be written whatever the plan (each instance is a channel at least)."""
    if instances > MAX_CHANNELS:
        return f"--instances: {instances} needs {instances} channels; MSCCL allows {MAX_CHANNELS}"
    return None


def check_options(o: LowerOptions) -> None:
    if o.proto == AUTO:
        raise LoweringError("--proto: auto is chosen by the pipeline (compiler.realise); lower() takes one protocol")
    if o.proto not in PROTOCOLS:
        raise LoweringError(f"--proto: {o.proto!r} is not a protocol (known: {', '.join(PROTOCOLS)})")
    if not isinstance(o.instances, int) or o.instances < 1:
        raise LoweringError(f"--instances: {o.instances!r} must be a whole number >= 1")
    too_many = too_many_instances(o.instances)
    if too_many:
        raise LoweringError(too_many)
    if o.min_bytes < 0 or o.max_bytes < 0 or (o.max_bytes and o.max_bytes < o.min_bytes):
        raise LoweringError(f"--size-range: {o.min_bytes}..{o.max_bytes} is not a range of sizes")
    if not isinstance(o.pace_ahead, int) or o.pace_ahead < 0:
        raise LoweringError(f"pace_ahead: {o.pace_ahead!r} must be a whole number >= 0")
    if not isinstance(o.rotate_slow, int) or o.rotate_slow < 1:
        raise LoweringError(f"rotate_slow: {o.rotate_slow!r} must be a whole number >= 1")
    if not isinstance(o.groups, int) or o.groups < 1:
        raise LoweringError(f"groups: {o.groups!r} must be a whole number >= 1")
    runtime_limits(o.runtime)
    if o.name is not None and not re.fullmatch(r"[A-Za-z0-9._:+@-]{1,255}", o.name):
        raise LoweringError(f"--name: {o.name!r} must be 1-255 letters, digits or . _ : + @ -")


# ---- 1-2: checks and levels ----------------------------------------------------------------------


def check_transfers(schedule: Schedule, topology: Topology) -> None:
    demand = schedule.demand
    if demand.ngpus != topology.ngpus:
        raise LoweringError(f"lowering: the schedule is for {demand.ngpus} GPUs, topology {topology.name} has "
                            f"{topology.ngpus}")
    ids = [c.id for c in demand.chunks]
    if ids != list(range(len(ids))):
        raise LoweringError("lowering: demand chunk ids must be 0..n-1 in order")
    holds = {(s, c.id) for c in demand.chunks for s in c.sources}
    routes: set[tuple[int, ...]] = set()  # paths found to be routes (a million transfers take a few thousand)
    _, broken = swap_groups(schedule.transfers)
    if broken is not None:
        raise LoweringError(f"{_transfer(broken, schedule.transfers[broken])}: a swap transfer must be a reduce "
                            "transfer of the sender's value, its chunk's swap not interrupted by another transfer of it")
    for k, t in enumerate(schedule.transfers):
        if not 0 <= t.chunk < len(ids):
            raise LoweringError(f"{_transfer(k, t)}: the demand has no chunk {t.chunk}")
        if not (0 <= t.src < demand.ngpus and 0 <= t.dst < demand.ngpus) or t.src == t.dst:
            raise LoweringError(f"{_transfer(k, t)}: needs two different ranks in 0..{demand.ngpus - 1}")
        if t.reduce and not demand.reduce:
            raise LoweringError(f"{_transfer(k, t)}: is a reduction but {demand.collective} reduces nothing")
        if t.own and not (t.reduce and t.src in demand.chunks[t.chunk].sources):
            raise LoweringError(f"{_transfer(k, t)}: sends rank {t.src}'s own contribution, which it does not have")
        path = t.path
        if path[:1] != (t.src,) or path[-1:] != (t.dst,) or path not in routes and \
                path not in topology.paths(t.src, t.dst):  # the topology's routes: switches only, no round trip
            raise LoweringError(f"{_transfer(k, t)}: {_not_a_route(path, t, topology)}")
        routes.add(path)
        if (t.src, t.chunk) not in holds:
            raise LoweringError(f"{_transfer(k, t)}: rank {t.src} does not hold the chunk yet")
        holds.add((t.dst, t.chunk))


def _not_a_route(path: tuple[int, ...], t: Transfer, topology: Topology) -> str:
    inner = path[1:-1] if path[:1] == (t.src,) and path[-1:] == (t.dst,) else ()
    if topology.node_of(t.src) == topology.node_of(t.dst) and inner and \
            all(not topology.is_gpu(v) for v in inner) and any(topology.switch(v).kind == "network" for v in inner):
        return (f"path {[topology.vertex_name(v) for v in path]} leaves node {topology.node_of(t.src)} through the "
                "network and comes back into it; the runtimes connect two GPUs of one node inside the node (an "
                "optimiser's plan can route so where a node's GPUs are not all linked: try another --method or --chunks)")
    return f"path {list(path)} is not a route of {topology.name}"


def _transfer(k: int, t: Transfer) -> str:
    return f"lowering: schedule transfer {k} (chunk {t.chunk}, rank {t.src} -> {t.dst})"


def transfer_levels(schedule: Schedule) -> list[int]:
    written: dict[tuple[int, int], int] = {}
    read: dict[tuple[int, int], int] = {}
    levels = []
    own = max((t.start for t in schedule.transfers if t.own), default=-1)
    swaps, _ = swap_groups(schedule.transfers)  # check_transfers refused a broken swap
    swap_level: dict[int, int] = {}  # chunk -> the one level of its swap: every send of it before any receive
    for t in schedule.transfers:
        s, d = (t.src, t.chunk), (t.dst, t.chunk)
        if t.own:
            written[d] = max(written.get(d, -1), own)
            levels.append(own)
            continue
        if t.swap:
            if t.chunk not in swap_level:
                group = [schedule.transfers[i] for i in swaps[t.chunk]]
                lvl = max(max(0, m.start, written.get((m.src, m.chunk), -1) + 1, written.get((m.dst, m.chunk), -1) + 1,
                              read.get((m.dst, m.chunk), -1) + 1) for m in group)
                for m in group:
                    read[(m.src, m.chunk)] = max(read.get((m.src, m.chunk), -1), lvl)
                    written[(m.dst, m.chunk)] = max(written.get((m.dst, m.chunk), -1), lvl)
                swap_level[t.chunk] = lvl
            levels.append(swap_level[t.chunk])
            continue
        lvl = max(0, t.start, written.get(s, -1) + 1, written.get(d, -1) + 1, read.get(d, -1) + 1)
        read[s] = max(read.get(s, -1), lvl)
        written[d] = max(written.get(d, -1), lvl)
        levels.append(lvl)
    return levels


# ---- 4-6: ranks, remote fields, limits --------------------------------------------------------------


def alias_map(demand: Demand, rank: int) -> Callable[[Slot], Slot] | None:
    """Which input and output chunks are the same memory when the call is in place (§10)."""
    alias = inplace_alias(demand.collective, rank, demand.input_chunks, demand.output_chunks)
    return alias.map if alias is not None else None


def fill_remote_fields(codes: list[RankCode], moves: list[Move]) -> None:
    """Sends record where the receiver stores the data, receives where the sender read it."""
    chains: list[dict] = []  # built at the first rrs (a reduction's chain): (rank, step) -> pos, pos -> move
    landing: dict[int, Slot] = {}

    def land(m: Move) -> Slot:
        pos, chain = m.pos, []
        while pos not in landing:
            at = codes[m.dst].recv_at[pos]
            rs = codes[m.dst].step(at)
            if rs.type != "rrs":
                landing[pos] = rs.dst
                break
            if not chains:
                chains.append({(code.rank, at): pos for code in codes for pos, at in code.send_at.items()})
                chains.append({m.pos: m for m in moves})
            chain.append(pos)
            pos = chains[0][(m.dst, at)]
            m = chains[1][pos]
        for p in chain:
            landing[p] = landing[pos]
        return landing[chain[0] if chain else pos]

    for m in moves:
        ss = codes[m.src].step(codes[m.src].send_at[m.pos])
        rs = codes[m.dst].step(codes[m.dst].recv_at[m.pos])
        if ss.type in ("s", "rrs"):
            ss.dst = land(m)
        if rs.type == "r":
            rs.src = ss.dst if ss.type in ("rcs", "rrcs") else ss.src


def worst_thread_block(codes: list[RankCode]) -> tuple[int, int, int]:
    """(steps, rank, tb) of the longest thread block."""
    return max(((len(tb.steps), code.rank, i) for code in codes for i, tb in enumerate(code.tbs)),
               key=lambda x: (x[0], -x[1], -x[2]), default=(0, 0, 0))


def _allows(lim: RuntimeLimits, what: str) -> str:
    value = {"steps": lim.max_steps, "channels": lim.max_channels, "nodes": lim.max_nodes,
             "offset": lim.max_offset, "per_channel": lim.max_per_channel}[what]
    if lim.runtime == ALL:
        return f"--runtime all (the strictest runtime) allows {value}"
    return f"{lim.runtime} allows {value}"


def too_many_blocks(rank: int, tbs: int, lim: RuntimeLimits, note: str = "") -> LoweringError:
    roomiest = runtime_limits(max(lim.targets or NAMES, key=lambda r: runtime(r).max_tbs), lim.sms)
    other = f" --runtime {roomiest.runtime} or" if tbs <= roomiest.max_tbs else ""
    return LoweringError(f"lowering: rank {rank} needs {tbs} thread blocks{note}; {lim.tb_reason}; "
                         f"use{other} fewer --instances/--chunks")


def check_limits(gpus: tuple[GpuProgram, ...], lim: RuntimeLimits, ngpus: int, note: str = "") -> None:
    """Raise LoweringError naming the first limit a rank breaks (msccl-xml.md §11, §16)."""
    for g in gpus:
        r = g.rank
        if len(g.tbs) > lim.max_tbs:
            raise too_many_blocks(r, len(g.tbs), lim, note)
        for tb in g.tbs:
            if len(tb.steps) > lim.max_steps:
                raise TooManySteps(f"lowering: rank {r} thread block {tb.id} needs {len(tb.steps)} steps{note}; "
                                    f"{_allows(lim, 'steps')}; use --runtime old or fewer --chunks")
            if tb.chan >= lim.max_channels:
                raise LoweringError(f"lowering: rank {r} needs channel {tb.chan}{note}; {_allows(lim, 'channels')} "
                                    "channels; use fewer --instances")
            for s in tb.steps:
                if s.depid > lim.max_depid or s.cnt > lim.max_cnt:
                    raise LoweringError(f"lowering: rank {r} thread block {tb.id}: depid {s.depid} / cnt {s.cnt} "
                                        f"exceed the runtimes' {lim.max_depid} / {lim.max_cnt}")
        for side in ("send", "recv"):
            per: dict[int, int] = {}
            for tb in g.tbs:
                if getattr(tb, side) >= 0:
                    per[tb.chan] = per.get(tb.chan, 0) + 1
            for chan, n in sorted(per.items()):
                if n > lim.max_per_channel:
                    raise LoweringError(f"lowering: rank {r} channel {chan} needs {n} thread blocks with a {side} "
                                        f"peer; {_allows(lim, 'per_channel')}")
        nodes = 1 + ngpus + len(g.tbs) + sum(len(tb.steps) for tb in g.tbs)
        if nodes > lim.max_nodes:
            raise LoweringError(f"lowering: rank {r} needs {nodes} XML nodes (1 + gpus + thread blocks + steps){note}; "
                                f"{_allows(lim, 'nodes')}; use fewer --chunks/--instances")
        biggest = max(g.i_chunks, g.o_chunks, g.s_chunks)
        if biggest - 1 > lim.max_offset:
            raise LoweringError(f"lowering: rank {r} needs buffer offsets up to {biggest - 1}; "
                                f"{_allows(lim, 'offset')}; use fewer --chunks/--instances")


# ---- the whole stage ---------------------------------------------------------------------------------


def _gpus(codes: list[RankCode], demand: Demand) -> tuple[GpuProgram, ...]:
    i_ch, o_ch = demand.input_chunks, demand.output_chunks
    if demand.collective == CUSTOM:  # legacy's parser wants i_chunks = o_chunks = nchunksperloop (§2.2)
        i_ch = o_ch = max(1, i_ch, o_ch)
    made: dict = {}  # equal steps share one Step (DraftStep.to_step)
    return tuple(
        GpuProgram(code.rank, i_ch, o_ch, code.s_chunks,
                   tuple(tb.to_thread_block(i, made) for i, tb in enumerate(code.tbs)))
        for code in codes)


def link_lanes(topology: Topology, proto: str) -> list[int]:
    """Thread blocks one (parallel) link carries at once at their full rate, per link id."""
    costing = Costing.of(topology, proto)
    return [costing.lanes(l.bandwidth, l.kind or "nvlink") for l in topology.links]


def pace_window(topology: Topology, options: LowerOptions) -> Callable[[int], int] | None:
    """When pacing: the thread blocks each outgoing link (all its parallel links) carries at full
    rate under the protocol's per-thread-block cap; a rank shares them among the channels it sends
    on over that link (codegen.lower_rank)."""
    if not options.pace:
        return None
    windows = [n * l.count for n, l in zip(link_lanes(topology, options.proto), topology.links)]
    return windows.__getitem__


def _lower_ranks(moves: list[Move], demand: Demand, aliased: bool, pace: Callable[[int], int] | None,
                 instances: int = 1, pair_slow: bool = False, max_nodes: int | None = None,
                 pair_peers: bool = True, stop: Callable[[RankCode], bool] | None = None,
                 pace_ahead: int = 0, gate_slow: bool = False, ring_ids: bool = True,
                 pace_fast: bool = True, cap: int | None = None,
                 probed: dict | None = None, fuse_slow: bool = True,
                 max_tbs: int | None = None) -> tuple[list[RankCode], bool]:
    """Every rank's code and True, or, where `stop` holds for a rank's code, the codes up to that
    rank and False (the caller lowers again some other way: no use lowering the rest first).
    probed: Probed.take's argument (the code probe_split lowered for one rank, used where it is the same)."""
    outs: list[list[Move]] = [[] for _ in range(demand.ngpus)]
    ins: list[list[Move]] = [[] for _ in range(demand.ngpus)]
    for m in moves:
        outs[m.src].append(m)
        ins[m.dst].append(m)
    codes = []
    for r in range(demand.ngpus):
        code = probed.pop((r, aliased), None) if probed and not pair_slow and cap is None else None
        if code is None or (code[0], code[1]) != (outs[r], ins[r]):
            code = lower_rank(r, outs[r], ins[r], demand, (alias_map(demand, r) if aliased else None) or same,
                              pace, pair_slow, max_nodes, pair_peers, pace_ahead, gate_slow, ring_ids, pace_fast, cap,
                              fuse_slow, max_tbs)
        else:
            code = code[2]
        codes.append(code)
        if stop is not None and stop(codes[-1]):
            return codes, False
    fill_remote_fields(codes, moves)
    merge_runs(codes, moves, instances, MAX_CNT)
    return codes, True


def busiest_rank(schedule: Schedule) -> int:
    """The rank that sends and receives the most transfers (the lowest such)."""
    count = [0] * schedule.demand.ngpus
    for t in schedule.transfers:
        count[t.src] += 1
        count[t.dst] += 1
    return max(range(len(count)), key=lambda r: (count[r], -r), default=0)


def kept_steps(code: RankCode, outs: list[Move], ins: list[Move], instances: int) -> int:
    """The most steps a thread block of the rank has after merge_runs, or (instances > 1, where
    merging needs every rank) at least has: all but its nops and the plain sends and receives of
    sub-chunks that are not the first of their run on their channel (the only steps it folds away)."""
    if instances == 1:
        return max((len(tb.steps) for tb in code.tbs), default=0)
    folds = {code.send_at[m.pos] for m in outs if not m.head} | {code.recv_at[m.pos] for m in ins if not m.head}
    return max((sum(1 for i, st in enumerate(tb.steps)
                    if st.type != "nop" and not (st.type in ("s", "r") and (t, i) in folds))
                for t, tb in enumerate(code.tbs)), default=0)


def probe_split(split: int, most: int, place: Callable[[int, int | None], list[Move]], rank: int,
                demand: Demand, aliased: bool, open_alias: bool, pace: Callable[[int], int] | None,
                lim: RuntimeLimits, options: LowerOptions, probed: dict | None = None) -> int:
    """The channel groups to lower every rank with first: from `split` up, the first count at which
    `rank` (the busiest), lowered alone, keeps its thread blocks within the step limit (a LoweringError
    first where that rank alone needs more XML nodes than the limit, however it is placed). Where that
    rank has the worst block this is the count `lower` would reach by lowering every rank at each
    count, for a GPUs-th of the work (at 512 GPUs two full passes of 30 s each found blocks too long);
    where another rank is worse, `lower` goes on from here as before. probed: gets (rank, whether
    aliased) -> (its sends, its receives, its code) of the last lowering, which _lower_ranks then
    takes instead of lowering the rank again with the same moves (lower_rank's other arguments are the
    same where it has no pair_slow and no cap)."""
    def own(split: int) -> tuple[list[Move], list[Move]]:  # the rank's sends and receives
        moves = place(split, rank)
        return [m for m in moves if m.src == rank], [m for m in moves if m.dst == rank]
    first = split
    outs, ins = own(split)
    least = 1 + demand.ngpus + 1 + fewest_steps(rank, outs, ins, demand)
    if least > lim.max_nodes:  # no placement stores fewer nodes for this rank: fail before lowering the others
        raise LoweringError(f"lowering: rank {rank} needs at least {least} XML nodes (1 + gpus + thread blocks + "
                            f"steps); {_allows(lim, 'nodes')}; use fewer --chunks/--instances")
    while split < most:
        if split != first:
            outs, ins = own(split)
        with_alias = aliased
        code = lower_rank(rank, outs, ins, demand, (alias_map(demand, rank) if aliased else None) or same,
                          pace, False, lim.max_nodes, options.pair_peers, options.pace_ahead, options.gate_slow,
                          options.ring_ids, options.pace_fast, None, options.fuse_slow, _copy_room(lim, options))
        if aliased and open_alias and not code.inplace_ok:  # lower drops aliasing for every rank then
            with_alias = False
            code = lower_rank(rank, outs, ins, demand, same, pace, False, lim.max_nodes, options.pair_peers,
                              options.pace_ahead, options.gate_slow, options.ring_ids, options.pace_fast,
                              None, options.fuse_slow, _copy_room(lim, options))
        worst = kept_steps(code, outs, ins, options.instances)
        if worst <= lim.max_steps:
            if probed is not None:
                probed[(rank, with_alias)] = (outs, ins, code)
            break
        split = min(most, max(split + 1, math.ceil(split * worst / lim.max_steps)))
    return split


def program_name(collective: str, topology: str, planner: str) -> str:
    """The `<algo name>` of a program lowered without a name given: what it is, where, by which planner."""
    return re.sub(r"[^A-Za-z0-9._:+@-]", "_", f"{collective}-{topology}-{planner}")[:255]


@without_gc
def lower(schedule: Schedule, topology: Topology, options: LowerOptions = LowerOptions(),
          where: dict | None = None, until: float | None = None) -> Program:
    """where: if given (and options.instances is 1), filled with schedule transfer index ->
    ((rank, tb, step) of its send, (rank, tb, step) of its receive) in the program (callers that
    add dependencies between transfers, such as compiler/jobs/gates.py). until: a time.perf_counter()
    value by which the capped tries (CAPPED_TRIES) end: none begins that would end later, where it
    takes as long as the lowering before it, and the failure in hand stands, cut_short. Each try
    lowers every rank: at 128 GPUs an allreduce's took 6 s each, and a command with a 60 s limit
    failed after 82 s."""
    check_options(options)
    check_transfers(schedule, topology)
    targets = targets_of(schedule.demand.collective, options.runtime, topology.vendor)
    lim = runtime_limits(options.runtime, topology.sms, targets)
    demand = schedule.demand.split(options.instances)
    levels = transfer_levels(schedule)
    lanes = parallel_lanes(schedule, topology, levels, options.lanes_across)
    can_alias = alias_map(demand, 0) is not None and options.inplace is not False
    notes: list[str] = []
    if schedule.topology != topology.name:
        notes.append(f"lowering: schedule planned for {schedule.topology}, lowered for {topology.name}")
    per_group = options.instances * (max(lanes, default=0) + 1)  # channels in one channel group
    most = MAX_CHANNELS // (per_group * options.rotate_slow)
    if most < 1:
        turns = f" x {options.rotate_slow} turns" if options.rotate_slow > 1 else ""
        raise LoweringError(f"lowering: {options.instances} instances x {per_group // options.instances} parallel "
                            f"lanes{turns} need {per_group * options.rotate_slow} channels; MSCCL allows "
                            f"{MAX_CHANNELS}; use fewer --instances")
    pace = pace_window(topology, options)
    widths = None  # without runtime costs a thread block has no rate cap: every instance is its own channel
    if options.fit_lanes and topology.costs is not None:
        widths = lane_widths(schedule, topology, levels, options.instances, link_lanes(topology, options.proto).__getitem__)

    splits = functools.cache(lambda split: chunk_splits(schedule, lanes, split))  # probe_split's first is lowered

    def place(split: int, rank: int | None = None) -> list[Move]:
        return place_moves(schedule, levels, lanes, splits(split), options.instances,
                           SLOTS[options.proto], topology, widths, rank, options.rotate_slow, split)

    # every rank's moves at a split, spread over channel copies: the same each time the loop below comes back to a
    # split (with slow receives paired, or capped), and Moves are frozen, so placed once per split
    spread = functools.cache(lambda split: spread_peers(place(split), lim.max_per_channel))

    split = first = min(most, max(options.groups, first_split(schedule, lanes, lim.max_steps)))
    probed: dict = {}  # the busiest rank's code as the probe lowered it: _lower_ranks takes it where it is the same
    split = probe_split(split, most, place, busiest_rank(schedule), demand, can_alias, options.inplace is None, pace,
                        lim, options, probed)
    pair_slow = False  # slow receives share thread blocks with sends only where the blocks would not fit
    cap = None  # two peers share a thread block whatever its steps; where more channel groups then need more
    # blocks than the runtime allows, lowered again from the least split (before the probe, which pairs them all)
    # with peers paired only where they fit

    failure: LoweringError | None = None  # why the uncapped lowering failed: said where the capped one fails too
    tries = CAPPED_TRIES

    cut = False  # whether `until` ended the capped tries
    lap = time.perf_counter()  # when the lowering of every rank in hand began

    def late() -> bool:  # one more lowering as long as the one in hand would end past `until`
        nonlocal cut
        now = time.perf_counter()
        cut = cut or (until is not None and 2 * now - lap > until)
        return cut

    def uncapped(why: LoweringError) -> bool:
        nonlocal cap, split, pair_slow, failure
        if cap is not None or not options.pair_peers or split == first or late():
            return False
        failure, cap, split, pair_slow = why, lim.max_steps, first, False
        return True

    def failed(why: LoweringError) -> LoweringError:
        why = failure or why
        return cut_short(why, "the time limit ended the tries with peers paired only where they fit") if cut else why

    def budget() -> bool:  # each capped try lowers every rank: a few, then the first failure stands
        nonlocal tries
        tries -= 1
        return tries >= 0 and not late()
    while True:
        lap = time.perf_counter()
        moves, copies, base = spread(split)
        if base * copies > MAX_CHANNELS:
            raise LoweringError(f"lowering: ranks need {copies} copies of {base} channels to keep at most "
                                f"{lim.max_per_channel} thread blocks with a send (a recv) peer per channel; MSCCL "
                                f"allows {MAX_CHANNELS} channels; use fewer --instances")
        while True:
            open_alias = can_alias and options.inplace is None  # whether in-place use is still to be found out

            def stop(code: RankCode, open_alias: bool = open_alias) -> bool:
                if open_alias and not code.inplace_ok:
                    return True  # not usable in place anyway
                return len(code.tbs) > lim.max_tbs  # the rest need not be lowered this way (aliasing adds no blocks)

            codes, whole = _lower_ranks(moves, demand, can_alias, pace, options.instances, pair_slow, lim.max_nodes,
                                        options.pair_peers, stop, options.pace_ahead, options.gate_slow,
                                        options.ring_ids, options.pace_fast, cap, probed, options.fuse_slow,
                                        _copy_room(lim, options))
            if whole or not (open_alias and not codes[-1].inplace_ok):
                break
            can_alias = False  # drop the dependencies aliasing adds
        most_tbs = max(len(c.tbs) for c in codes)
        if most_tbs > lim.max_tbs and not options.pair_peers:
            rank = next(c.rank for c in codes if len(c.tbs) == most_tbs)
            raise LoweringError(f"lowering: rank {rank} needs {most_tbs} thread blocks with a block per send and "
                                f"receive peer; {lim.tb_reason}; pair peers (the default)")
        if not pair_slow and most_tbs > lim.max_tbs:
            pair_slow = True
            continue
        if most_tbs > lim.max_tbs:  # slow receives paired too: no placement of this split has fewer blocks
            rank = next(c.rank for c in codes if len(c.tbs) == most_tbs)
            why = too_many_blocks(rank, most_tbs, lim, f" (with {split} channel groups)" if split > 1 else "")
            if uncapped(why):
                continue
            if cap is not None and split < most and budget():  # capped: one more group, a fresh cap
                split, cap, pair_slow = split + 1, lim.max_steps, False
                continue
            raise failed(why)
        worst, rank, tb = worst_thread_block(codes)
        if worst <= lim.max_steps:
            break
        if cap is not None and cap > lim.max_steps // 4 and budget():  # capped: fewer steps per block first (nops
            cap = min(cap - 1, cap * lim.max_steps // worst)  # come on top of the sends and receives counted)
            continue
        if split == most or (cap is not None and not budget()):
            why = TooManySteps(f"lowering: rank {rank} thread block {tb} needs {worst} steps with {split * per_group} "
                               f"channels; {_allows(lim, 'steps')}, and MSCCL allows {MAX_CHANNELS} channels; "
                               "use --runtime old or fewer --chunks")
            raise failed(why)
        split = min(most, max(split + 1, math.ceil(split * worst / lim.max_steps)))
        cap = lim.max_steps if cap is not None else None
    if not options.pair_peers:
        notes.append("lowering: every send and receive peer has a thread block of its own unless a forward fuses them")
    if not options.fuse_slow:
        notes.append("lowering: every send peer through a NIC has a thread block of its own")
    if options.lanes_across and max(lanes, default=0) > 0:
        notes.append("lowering: a GPU pair's transfers take its parallel links in turn, level after level")
    if options.gate_slow:
        notes.append("lowering: a send through a NIC waits for the receive its rank is planned to have just before it")
    if not options.pace:
        notes.append("lowering: sends are not paced: each takes its link's lanes first come, first served")
    if options.rotate_slow > 1:
        notes.append(f"lowering: a connection over a slow path takes {options.rotate_slow} channel groups in turn, "
                     "transfer by transfer")
    if options.pace and not options.pace_fast:
        notes.append("lowering: only sends over slow paths are paced; a fast link's take its lanes first come, "
                     "first served")
    if options.pace and options.pace_ahead:
        notes.append(f"lowering: each link a rank feeds in schedule order keeps {options.pace_ahead} more "
                     f"run{'s' if options.pace_ahead > 1 else ''} of sends in flight than it has lanes")
    if cap is not None:
        notes.append(f"lowering: two peers share a thread block only where their sends and receives fit in {cap} "
                     "steps (with every pair that could, more channel groups needed more thread blocks than the "
                     "runtime allows)")
    if split > 1 and split > options.groups:
        notes.append(f"lowering: chunks spread over {split} channel groups to keep thread blocks within "
                     f"{lim.max_steps} steps")
    elif split > 1:
        notes.append(f"lowering: whole chunks spread over {split} channel groups, a thread block per group on each "
                     "connection (their sends run side by side)")
    if copies > 1:
        notes.append(f"lowering: GPU pairs spread over {copies} copies of the {base} channels so that no channel has "
                     f"more than {lim.max_per_channel} thread blocks with a send (a recv) peer")
    inplace_ok = can_alias and all(c.inplace_ok for c in codes)
    if options.inplace and not inplace_ok:
        bad = next((c.rank for c in codes if not c.inplace_ok), 0)
        raise LoweringError(f"lowering: rank {bad} overwrites part of its input before reading it, so the program "
                            "cannot run in place; drop --inplace")
    gpus = _gpus(codes, demand)
    if where is not None and options.instances == 1:
        for m in moves:
            where[m.pos] = ((m.src, *codes[m.src].send_at[m.pos]), (m.dst, *codes[m.dst].recv_at[m.pos]))
    check_limits(gpus, lim, demand.ngpus, f" (with {split} channel groups)" if split > 1 else "")
    name = options.name or program_name(demand.collective, topology.name, schedule.planner)
    if inplace_ok:
        notes.append("lowering: every input chunk is read before anything overwrites it: usable in place")
    if demand.collective not in limits_for(lim.runtime, declared=lim.targets).colls:
        notes.append(f"lowering: no MSCCL coll={demand.collective} in runtime {lim.runtime} (it is in "
                     f"{', '.join(target_runtimes(demand.collective))})")
    return Program(
        name=name, collective=demand.collective, ngpus=demand.ngpus,
        nchunksperloop=max(1, demand.input_chunks, demand.output_chunks),
        nchannels=max((tb.chan for g in gpus for tb in g.tbs), default=0) + 1, gpus=gpus, proto=options.proto,
        inplace=inplace_ok, outofplace=True, min_bytes=options.min_bytes, max_bytes=options.max_bytes,
        demand=demand if demand.collective == CUSTOM else None,
        runtimes=targets if narrower(demand.collective, targets) else (), notes=tuple(notes))
