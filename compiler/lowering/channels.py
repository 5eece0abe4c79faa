"""Channel placement: which channel (and which `sub` group of a level) each transfer's move takes.

Transfers that a pair of GPUs runs at the same level over a path of parallel links (count > 1)
take lanes 0..count-1 (`parallel_lanes`; with `across`, a pair's transfers take them in turn
whatever their level, so one transfer per level to a peer does not always queue on lane 0's thread
block); with `instances` k every transfer becomes k sub-chunk transfers (chunk*k + i) on k
channels; when a thread block would exceed the runtime's step limit,
chunks are spread over `split` more channel groups (`first_split` is the least that can work,
`chunk_splits` picks each chunk's group; a whole chunk keeps one group, so its forwards still
fuse). `lane_widths` says over how many of its k channels a transfer spreads its sub-chunks: as many
as its first link needs to reach its bandwidth (the link carries `lanes` thread blocks at once at the
per-thread-block rate, Costing.lanes) shared by the connections the rank drives on that link at that
level, rounded up to a divisor of k; a transfer of width w puts sub-chunks i on channel
i*w//k of its k (runs of k/w consecutive sub-chunks), so a connection that never needs more than
one lane keeps one thread block however many instances there are. chan = i*w//k + k*(lane + P*j).
`place_moves` then gives each move a `sub` group: at most slots-1 moves of one level per
connection share one (why: compiler/lowering/lower.py, "Why the order is safe").
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields, replace
from typing import Callable

import numpy as np

from compiler.model.schedule import Schedule
from compiler.model.topology import Topology


@dataclass(frozen=True)
class Move:
    """One GPU-to-GPU transfer as the lowering places it."""

    pos: int  # index in the (instance-expanded) schedule order
    chunk: int
    src: int
    dst: int
    reduce: bool
    level: int  # data-dependency level (lower.transfer_levels): sends and receives are ordered by it
    chan: int
    sub: int = 0  # splits a level on one connection so no more than slots-1 share one group
    lane: tuple[int, int] = (-1, -1)  # (first link of the path, channel): sends on one lane are paced
    slow: bool = False  # the path is slower than the fastest link (its receive waits many epochs)
    arrive: int = 0  # the schedule's epoch at which the transfer's data is at its destination
    head: bool = True  # the first of its transfer's sub-chunks on its channel (pacing counts runs)
    width: int = 1  # the channels its transfer's sub-chunks spread over (runs)
    own: bool = False  # sends the source's own contribution, from its input (Transfer.own)
    swap: bool = False  # one of its chunk's swap (Transfer.swap): sent before any receive of the swap

    @property
    def send_key(self) -> tuple[int, int, int, int]:
        return (self.level, self.sub, 0, self.pos)

    @property
    def recv_key(self) -> tuple[int, int, int, int]:
        return (self.level, self.sub, 1, self.pos)


_set = object.__setattr__


def new_move(pos: int, chunk: int, src: int, dst: int, reduce: bool, level: int, chan: int, sub: int,
             lane: tuple[int, int], slow: bool, arrive: int, head: bool, width: int, own: bool, swap: bool) -> Move:
    """Move(...) with every field given, made without the frozen dataclass's __init__ (an
    object.__setattr__ per field): place_moves makes one per sub-chunk transfer and placement,
    and this takes 1.8 us where Move() took 4.7."""
    m = object.__new__(Move)
    _set(m, "__dict__", {"pos": pos, "chunk": chunk, "src": src, "dst": dst, "reduce": reduce, "level": level,
                         "chan": chan, "sub": sub, "lane": lane, "slow": slow, "arrive": arrive, "head": head,
                         "width": width, "own": own, "swap": swap})
    return m


assert new_move.__code__.co_varnames[:len(fields(Move))] == tuple(f.name for f in fields(Move))


def parallel_lanes(schedule: Schedule, topology: Topology, levels: list[int], across: bool = False) -> list[int]:
    """Lane of each transfer: its index among the transfers of its GPU pair and level (across: of its
    GPU pair, whatever the level), modulo the path's parallel link count."""
    seen: dict[tuple[int, int, int], int] = {}
    counts: dict[tuple[int, ...], int] = {}  # per path (a million transfers take a few thousand)
    lanes = []
    for t, lvl in zip(schedule.transfers, levels):
        count = counts.get(t.path)
        if count is None:
            count = counts[t.path] = min(topology.link(a, b).count for a, b in zip(t.path, t.path[1:]))
        key = (t.src, t.dst, 0 if across else lvl)
        k = seen.get(key, 0)
        seen[key] = k + 1
        lanes.append(k % max(1, count))
    return lanes


def lane_widths(schedule: Schedule, topology: Topology, levels: list[int], instances: int,
                link_lanes: Callable[[int], int]) -> list[int]:
    """Channels (a divisor of `instances`) over which each transfer spreads its sub-chunks: the
    thread-block lanes of its first link (link_lanes: link id -> lanes of one parallel link) over
    the connections its source drives on that link at its level, per parallel link."""
    if instances == 1:
        return [1] * len(schedule.transfers)
    conns: dict[tuple[int, int, int], set[int]] = {}
    firsts = []
    for t, lvl in zip(schedule.transfers, levels):
        first = topology.link_id(t.path[0], t.path[1])
        firsts.append(first)
        conns.setdefault((t.src, first, lvl), set()).add(t.dst)
    divisors = [d for d in range(1, instances + 1) if instances % d == 0]
    out = []
    for t, lvl, first in zip(schedule.transfers, levels, firsts):
        link = topology.links[first]
        per_link = math.ceil(len(conns[(t.src, first, lvl)]) / max(1, link.count))
        need = math.ceil(link_lanes(first) / per_link)
        out.append(next((d for d in divisors if d >= need), instances))
    return out


def chunk_splits(schedule: Schedule, lanes: list[int], split: int) -> dict[int, int]:
    """Channel group of each chunk (0..split-1): greedy, chunk by chunk, the group whose most loaded
    connection of the chunk's is least loaded (then the least total load, then the lowest group)."""
    if split == 1:
        return {}
    ids: dict[tuple[int, int, int], int] = {}  # connection (src, dst, lane) -> row of `load`
    conns: dict[int, list[int]] = {}
    for t, lane in zip(schedule.transfers, lanes):
        conns.setdefault(t.chunk, []).append(ids.setdefault((t.src, t.dst, lane), len(ids)))
    load = np.zeros((len(ids), split), dtype=np.int64)  # transfers per connection and group so far
    out = {}
    for c in sorted(conns):
        rows = np.array(conns[c])
        mine = load[rows]
        peak, total = mine.max(axis=0).tolist(), mine.sum(axis=0).tolist()
        j = min(range(split), key=lambda g: (peak[g], total[g], g))
        np.add.at(load[:, j], rows, 1)
        out[c] = j
    return out


def place_moves(schedule: Schedule, levels: list[int], lanes: list[int], splits: dict[int, int],
                instances: int, slots: int, topology: Topology, widths: list[int] | None = None,
                rank: int | None = None, rotate: int = 1, split: int = 1) -> list[Move]:
    """widths: per transfer, the channels its sub-chunks spread over (lane_widths); None: all k.
    rank: if given, only the moves that rank sends or receives (the same moves as in the whole list).
    rotate: the sets of `split` channel groups (those of `splits`) a connection over a slow path takes
    in turn, transfer by transfer in schedule order (channels up to rotate times as many)."""
    k, lanes_n, per_group = instances, max(lanes, default=0) + 1, max(1, slots - 1)
    fastest = topology.fastest_bandwidth
    seen: dict[tuple[int, int, int, int], int] = {}
    turn: dict[tuple[int, int], int] = {}
    # path -> (slower than the fastest link, its first link's id): a path's bandwidth is a walk over its links;
    # paths repeat
    path_info: dict[tuple[int, ...], tuple[bool, int]] = {}
    moves = []
    for n, (t, lvl, lane) in enumerate(zip(schedule.transfers, levels, lanes)):
        info = path_info.get(t.path)
        if info is None:
            info = path_info[t.path] = (topology.path_bandwidth(t.path) < fastest,
                                        topology.link_id(t.path[0], t.path[1]))
        slow, first = info
        group = splits.get(t.chunk, 0)
        if rotate > 1 and slow:
            j = turn.get((t.src, t.dst), 0)
            turn[(t.src, t.dst)] = j + 1
            group += split * (j % rotate)
        if rank is not None and rank != t.src and rank != t.dst:
            continue  # `seen` and `turn` count per connection, so the rank's own moves come out the same
        chan0 = k * (lane + lanes_n * group)
        w = k if widths is None else widths[n]
        src, dst, chunk, reduce, arrive, own, swap = t.src, t.dst, t.chunk * k, t.reduce, t.arrive, t.own, t.swap
        for i in range(k):
            chan = chan0 + i * w // k
            key = (src, dst, chan, lvl)
            j = seen.get(key, 0)
            seen[key] = j + 1
            head = i == 0 or chan != chan0 + (i - 1) * w // k
            moves.append(new_move(n * k + i, chunk + i, src, dst, reduce, lvl, chan, j // per_group, (first, chan),
                                  slow, arrive, head, w, own, swap))
    return moves


def first_split(schedule: Schedule, lanes: list[int], max_steps: int) -> int:
    """Channel groups at least needed: a thread block holds every send of its connection."""
    per_conn: dict[tuple[int, int, int], int] = {}
    for t, lane in zip(schedule.transfers, lanes):
        key = (t.src, t.dst, lane)
        per_conn[key] = per_conn.get(key, 0) + 1
    return max(1, math.ceil(max(per_conn.values(), default=0) / max_steps))


def spread_peers(moves: list[Move], limit: int) -> tuple[list[Move], int, int]:
    """Moves whose ranks keep at most `limit` send peers and `limit` recv peers per channel
    (msccl-xml.md §7.2), the copies of the channel layout they take and its channels (base). Where a
    rank has more, GPU pairs take copies of the layout (chan + base*p) greedily, pair by pair in order
    of first appearance, each the first copy where every channel it uses has room at both ends; both
    directions of a pair take one copy, so a block may still pair them. Unchanged (the same list)
    where no rank is over the limit; the caller checks base*copies against the channel limit."""
    sends: dict[tuple[int, int], set[int]] = {}
    recvs: dict[tuple[int, int], set[int]] = {}
    for m in moves:
        sends.setdefault((m.src, m.chan), set()).add(m.dst)
        recvs.setdefault((m.dst, m.chan), set()).add(m.src)
    if all(len(v) <= limit for v in sends.values()) and all(len(v) <= limit for v in recvs.values()):
        return moves, 1, 0
    pairs: dict[tuple[int, int], set[tuple[int, int, int]]] = {}  # {a, b} -> (src, dst, chan) connections
    for m in moves:
        pairs.setdefault((min(m.src, m.dst), max(m.src, m.dst)), set()).add((m.src, m.dst, m.chan))
    used: dict[tuple[str, int, int, int], int] = {}  # (side, rank, chan, copy) -> peers
    copy: dict[tuple[int, int], int] = {}
    for pair, conns in pairs.items():
        keys = [k for s, d, c in sorted(conns) for k in (("s", s, c), ("r", d, c))]
        p = 0
        while any(used.get((*k, p), 0) >= limit for k in keys):
            p += 1
        for k in keys:
            used[(*k, p)] = used.get((*k, p), 0) + 1
        copy[pair] = p
    copies = max(copy.values()) + 1
    base = max(m.chan for m in moves) + 1
    out = []
    for m in moves:
        p = copy[(min(m.src, m.dst), max(m.src, m.dst))]
        if p:
            chan = m.chan + base * p
            m = replace(m, chan=chan, lane=(m.lane[0], chan))
        out.append(m)
    return out, copies, base
