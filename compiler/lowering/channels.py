"""Channel placement: which channel (and which `sub` group of a level) each transfer's move takes.

Transfers that a pair of GPUs runs at the same level over a path of parallel links (count > 1)
take lanes 0..count-1 (`parallel_lanes`); with `instances` k every transfer becomes k sub-chunk
transfers (chunk*k + i) on k channels; when a thread block would exceed the runtime's step limit,
chunks are spread over `split` more channel groups (`first_split` is the least that can work,
`chunk_splits` picks each chunk's group; a whole chunk keeps one group, so its forwards still
fuse). chan = i + k*(lane + P*j). `place_moves` then gives each move a `sub` group: at most
slots-1 moves of one level per connection share one (why: compiler/lowering/lower.py, "Why the
order is safe").
"""

from __future__ import annotations

import math
from dataclasses import dataclass

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

    @property
    def send_key(self) -> tuple[int, int, int, int]:
        return (self.level, self.sub, 0, self.pos)

    @property
    def recv_key(self) -> tuple[int, int, int, int]:
        return (self.level, self.sub, 1, self.pos)


def parallel_lanes(schedule: Schedule, topology: Topology, levels: list[int]) -> list[int]:
    """Lane of each transfer: its index among the transfers of its GPU pair and level, modulo the
    path's parallel link count."""
    seen: dict[tuple[int, int, int], int] = {}
    lanes = []
    for t, lvl in zip(schedule.transfers, levels):
        count = min(topology.link(a, b).count for a, b in zip(t.path, t.path[1:]))
        key = (t.src, t.dst, lvl)
        k = seen.get(key, 0)
        seen[key] = k + 1
        lanes.append(k % max(1, count))
    return lanes


def chunk_splits(schedule: Schedule, lanes: list[int], split: int) -> dict[int, int]:
    """Channel group of each chunk (0..split-1): greedy, least loaded connection first."""
    if split == 1:
        return {}
    conns: dict[int, list[tuple[int, int, int]]] = {}
    for t, lane in zip(schedule.transfers, lanes):
        conns.setdefault(t.chunk, []).append((t.src, t.dst, lane))
    load: dict[tuple, int] = {}
    out = {}
    for c in sorted(conns):
        def cost(j: int) -> tuple[int, int, int]:
            loads = [load.get((k, j), 0) for k in conns[c]]
            return (max(loads), sum(loads), j)
        j = min(range(split), key=cost)
        for k in conns[c]:
            load[(k, j)] = load.get((k, j), 0) + 1
        out[c] = j
    return out


def place_moves(schedule: Schedule, levels: list[int], lanes: list[int], splits: dict[int, int],
                instances: int, slots: int, topology: Topology) -> list[Move]:
    k, lanes_n, per_group = instances, max(lanes, default=0) + 1, max(1, slots - 1)
    fastest = topology.fastest_bandwidth
    seen: dict[tuple[int, int, int, int], int] = {}
    moves = []
    for n, (t, lvl, lane) in enumerate(zip(schedule.transfers, levels, lanes)):
        chan0 = k * (lane + lanes_n * splits.get(t.chunk, 0))
        first = topology.link_id(t.path[0], t.path[1])
        slow = topology.path_bandwidth(t.path) < fastest
        for i in range(k):
            key = (t.src, t.dst, chan0 + i, lvl)
            j = seen.get(key, 0)
            seen[key] = j + 1
            moves.append(Move(n * k + i, t.chunk * k + i, t.src, t.dst, t.reduce, lvl, chan0 + i, j // per_group,
                              (first, chan0 + i), slow))
    return moves


def first_split(schedule: Schedule, lanes: list[int], max_steps: int) -> int:
    """Channel groups at least needed: a thread block holds every send of its connection."""
    per_conn: dict[tuple[int, int, int], int] = {}
    for t, lane in zip(schedule.transfers, lanes):
        key = (t.src, t.dst, lane)
        per_conn[key] = per_conn.get(key, 0) + 1
    return max(1, math.ceil(max(per_conn.values(), default=0) / max_steps))
