"""Classic baselines: NCCL-style rings, one-hop direct sends, relayed sends and one-shot reductions.

All produce schedules that are feasible in the epoch model of compiler/timing.py, so they can warm
start the MILP: each transfer is list-scheduled at the earliest epoch, no earlier than its source
holds the chunk, at which every link of its path has fewer than capacity[l] chunks in flight over
the link's window.

ring: on switch systems the ring follows rank order (the hop between nodes goes through the NICs);
on direct-link meshes the rings are directed Hamiltonian cycles over GPU-to-GPU links, as many
edge-disjoint ones (parallel links counted) as a quick search finds. Chunk lane c (the c-th chunk
of a rank) uses ring c mod R. Every collective is a walk along the ring: a copy chunk travels from
its (first) source until its farthest destination; a reduction chunk accumulates along the ring into
an owner (reduce transfers), which then copies the result on to the other destinations.

direct: every need is one transfer from a source to the destination over the best path; in round r
rank s sends to (s + r) mod N, so no receiver is a hot spot.

relay: direct where some pairs of GPUs are more than one transfer apart (a line, a star, a mesh of
your own): every need goes over a quickest route of one-transfer hops, relayed by the GPUs on it,
store and forward. A copy chunk goes down a tree from its source (a GPU on the way that needs it
passes it on), a reduction chunk up a tree into its owner, adding on the way, and down again; where
several routes are as quick, the one whose links earlier trees used least. Built in well under
a second, so `auto` has a schedule on any connected topology however short its time limit.

oneshot: a reduction in one hop: every contributor sends its own input of each chunk straight to
every other destination, which adds the contributions up (Transfer.own), in direct's rounds. One
transfer's latency where direct's reduce-then-copy takes two, for about N/2 times the bytes: it
pays at small sizes (DGX A100 allreduce 1 KB). An allreduce is planned on the buffer in
--chunks chunks in all, not per rank: a step sends one chunk, and nothing here needs slices.
"""

from __future__ import annotations

import functools
import math
import random
import time
from collections import Counter
from dataclasses import dataclass, field, replace
from typing import Callable

from compiler.model.demand import Chunk, Demand
from compiler.specs.collectives import SPECS
from compiler.specs.errors import CompileError
from compiler.specs.runtimes import ALL, limits, target_runtimes
from compiler.model.schedule import Schedule, Transfer
from compiler.model.timing import TimeExpansion, expand
from compiler.model.topology import Topology
from compiler.planners.registry import register
from compiler.planners.options import PlanOptions

Hop = tuple[int, int, int, bool]  # (chunk, src, dst, reduce)


# ---- epoch-model list scheduling ------------------------------------------------------------------


class ListScheduler:
    """Places transfers one at a time at their earliest feasible epoch."""

    def __init__(self, topo: Topology, demand: Demand, te: TimeExpansion):
        self.topo, self.demand, self.te = topo, demand, te
        self.inflight: list[list[int]] = [[] for _ in topo.links]  # per link, per epoch
        # per link: jump[e] == e where the link has room in epoch e, else a later epoch to try
        # (union-find with path compression, so long full stretches are skipped in one step)
        self.jump: list[list[int]] = [[] for _ in topo.links]
        self.ready: dict[tuple[int, int], int] = {}  # (chunk, rank) -> epoch its value is usable
        for c in demand.chunks:
            for s in c.sources:
                self.ready[(c.id, s)] = 0
        self.transfers: list[Transfer] = []

    def _room(self, link: int, e: int) -> int:
        """First epoch >= e at which `link` has room."""
        jump = self.jump[link]
        root = e
        while root < len(jump) and jump[root] != root:
            root = jump[root]
        while e < len(jump) and jump[e] != e:
            jump[e], e = root, jump[e]
        return root

    def _earliest(self, links: tuple[int, ...], k: int) -> int:
        """First epoch >= k at which every link has room over its whole window (an epoch is full
        where its count reached the capacity: _room jumps from there)."""
        window, capacity, inflight = self.te.window, self.te.capacity, self.inflight
        moved = True
        while moved:
            moved = False
            for l in links:
                occ, cap = inflight[l], capacity[l]
                for e in range(k, min(k + window[l], len(occ))):
                    if occ[e] >= cap:
                        k, moved = self._room(l, e), True
                        break
                if moved:
                    break
        return k

    def add(self, chunk: int, src: int, dst: int, path: tuple[int, ...], reduce: bool = False,
            own: bool = False) -> Transfer:
        links = self.topo.path_links(path)
        if (chunk, src) not in self.ready:
            raise ValueError(f"list schedule: rank {src} sends chunk {chunk} before it holds it")
        k = self._earliest(links, 0 if own else self.ready[(chunk, src)])
        return self._place(chunk, src, dst, path, links, k, reduce, own)

    def add_swap(self, chunk: int, sends: list[tuple[int, int, tuple[int, ...]]]) -> list[Transfer]:
        """A swap of `chunk` (Transfer.swap): (src, dst, path) sends on paths that share no link, every
        one of them at the first epoch at which each sender holds its value and every link of every
        path has room, so that no other transfer of the chunk comes between them in schedule order."""
        links = [self.topo.path_links(path) for _, _, path in sends]
        k, moved = max(self.ready[(chunk, src)] for src, _, _ in sends), True
        while moved:
            latest = max(self._earliest(ids, k) for ids in links)
            moved, k = latest != k, latest
        return [self._place(chunk, src, dst, path, ids, k, True, swap=True)
                for (src, dst, path), ids in zip(sends, links)]

    def _place(self, chunk: int, src: int, dst: int, path: tuple[int, ...], links: tuple[int, ...], k: int,
               reduce: bool, own: bool = False, swap: bool = False) -> Transfer:
        """The transfer starting at epoch k, in flight on `links` (its path's) over their windows."""
        for l in links:
            occ, jump, end = self.inflight[l], self.jump[l], k + self.te.window[l]
            if len(occ) < end:
                jump.extend(range(len(occ), end))
                occ.extend([0] * (end - len(occ)))
            for e in range(k, end):
                occ[e] += 1
                if occ[e] >= self.te.capacity[l]:
                    jump[e] = e + 1
        arrive = k + self.te.arrival[links[-1]]
        key = (chunk, dst)
        if not self.demand.reduce:
            self.ready[key] = min(self.ready.get(key, arrive), arrive)
        elif reduce:
            self.ready[key] = max(self.ready.get(key, 0), arrive)
        else:
            self.ready[key] = arrive
        t = Transfer(chunk, src, dst, path, k, arrive, reduce, own=own, swap=swap)
        self.transfers.append(t)
        return t

    def schedule(self, planner: str, started: float, notes: tuple[str, ...]) -> Schedule:
        epochs = max((t.arrive for t in self.transfers), default=0)
        return Schedule(self.demand, self.topo.name, tuple(self.transfers), self.te.tau, epochs, planner,
                        "heuristic", None, time.perf_counter() - started, None, notes).sorted()


_ListScheduler = ListScheduler  # the name planners/lp.py imports


def _owner(chunk: Chunk) -> int:
    """Where a reduction completes: allreduce chunk k at rank k mod N; else a destination."""
    return chunk.dests[chunk.id % len(chunk.dests)]


def _lane(demand: Demand, chunk: Chunk) -> int:
    """Which of a rank's chunks this is (allreduce chunk k belongs to lane k // N)."""
    if demand.collective in SPECS and SPECS[demand.collective].flat:
        return chunk.id // demand.ngpus
    return chunk.id % max(1, demand.chunks_per_rank)


# ---- rings ----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Ring:
    order: tuple[int, ...]  # ranks in ring order; the last sends to the first
    pos: dict[int, int] = field(init=False, repr=False, compare=False)

    def __post_init__(self):
        object.__setattr__(self, "pos", {r: i for i, r in enumerate(self.order)})

    def step(self, r: int, hops: int = 1) -> int:
        """The rank `hops` places after r (before it if negative)."""
        return self.order[(self.pos[r] + hops) % len(self.order)]

    def distance(self, a: int, b: int) -> int:
        """Hops from a forward to b."""
        return (self.pos[b] - self.pos[a]) % len(self.order)

    def walk(self, start: int, hops: int) -> list[tuple[int, int]]:
        return [(self.step(start, h), self.step(start, h + 1)) for h in range(hops)]


def _find_cycle(n: int, residual: dict[tuple[int, int], int], rng: random.Random | None,
                budget: int) -> tuple[int, ...] | None:
    """One directed Hamiltonian cycle through 0..n-1 over edges with residual > 0 (DFS, Warnsdorff order)."""
    succ = {v: [w for w in range(n) if residual.get((v, w), 0) > 0] for v in range(n)}
    if n == 1 or any(not s for s in succ.values()):
        return None
    path, seen = [0], {0}

    def options(v: int) -> list[int]:
        cands = [w for w in succ[v] if w not in seen]
        key = {w: (sum(1 for x in succ[w] if x not in seen), -residual[(v, w)],
                   rng.random() if rng else w) for w in cands}
        return sorted(cands, key=key.__getitem__)

    stack = [iter(options(0))]
    while stack:
        budget -= 1
        if budget < 0:
            return None
        w = next(stack[-1], None)
        if w is None:
            stack.pop()
            seen.discard(path.pop())
            continue
        path.append(w)
        seen.add(w)
        if len(path) == n:
            if residual.get((w, 0), 0) > 0:
                return tuple(path)
            seen.discard(path.pop())
            continue
        stack.append(iter(options(w)))
    return None


def hamiltonian_cycles(n: int, counts: dict[tuple[int, int], int], tries: int = 12,
                       budget: int = 50_000) -> list[tuple[int, ...]]:
    """As many edge-disjoint directed Hamiltonian cycles as a few greedy passes find (parallel
    links may carry one cycle each); the passes are seeded, so the answer is remembered (a 32-GPU
    mesh takes about a second, and auto asks for one topology's rings several times: whether there
    is one, their load, the plan)."""
    return list(_hamiltonian_cycles(n, tuple(sorted(counts.items())), tries, budget))


@functools.lru_cache(maxsize=16)
def _hamiltonian_cycles(n: int, count_items: tuple, tries: int, budget: int) -> tuple[tuple[int, ...], ...]:
    counts = dict(count_items)
    most = min(sum(c for (a, _), c in counts.items() if a == v) for v in range(n))
    best: list[tuple[int, ...]] = []
    for attempt in range(tries):
        rng = random.Random(attempt) if attempt else None
        residual = dict(counts)
        found: list[tuple[int, ...]] = []
        while len(found) < most:
            cycle = _find_cycle(n, residual, rng, budget)
            if cycle is None:
                break
            found.append(cycle)
            for a, b in zip(cycle, cycle[1:] + cycle[:1]):
                residual[(a, b)] -= 1
        if len(found) > len(best):
            best = found
        if len(best) == most:
            break
    return tuple(best)


def is_mesh(topo: Topology) -> bool:
    """GPUs of a node talk over direct links (no NVSwitch-like switch)."""
    return not any(s.kind == "switch" for s in topo.switches)


def find_rings(topo: Topology) -> list[Ring]:
    """Rings through every GPU (see module docstring). Raises CompileError if none exists."""
    n, nodes = topo.gpus_per_node, topo.nodes
    if not is_mesh(topo) or n == 1:
        # rank order; across nodes one ring per NIC, each leaving its node through another NIC
        per_nic = len({nic.index for nic in topo.nics}) if nodes > 1 else 1
        cycles = [tuple(range(n))] * max(1, per_nic)
    else:
        counts = {(l.src, l.dst): l.count for l in topo.links if l.src < n and l.dst < n}
        cycles = hamiltonian_cycles(n, counts)
        if not cycles:
            raise CompileError(f"ring: {topo.name} has no cycle through all its GPUs over GPU-to-GPU links; "
                               "the ring baseline needs a cycle through the GPUs (use method='relay' or 'milp')")
    if nodes == 1:
        return [Ring(c) for c in cycles]
    rings, exits = [], {}
    for cycle in cycles:
        # leave each node where the fewest rings so far leave, so rings spread over the NICs
        cut = min(range(n), key=lambda i: (exits.get(_nic_id(topo, cycle[i - 1]), 0), i))
        local = cycle[cut:] + cycle[:cut]
        nic = _nic_id(topo, local[-1])
        exits[nic] = exits.get(nic, 0) + 1
        rings.append(Ring(tuple(node * n + r for node in range(nodes) for r in local)))
    return rings


def _nic_id(topo: Topology, gpu: int) -> int:
    nic = topo.nic_of(gpu)
    return -1 if nic is None else nic.index


def _hop_path(topo: Topology, a: int, b: int) -> tuple[int, ...]:
    if topo.has_link(a, b):
        return (a, b)
    if not topo.paths(a, b):
        raise CompileError(f"ring: rank {a} cannot reach its ring successor {b} in one transfer on {topo.name}; "
                           "use method='milp'")
    return topo.best_path(a, b)


def ring_runs(demand: Demand, chunk: Chunk, ring: Ring) -> list[tuple[int, int, bool]]:
    """(first rank, hops, reduce) of the runs one chunk walks along `ring`, in causal order."""
    if not demand.reduce:
        src = chunk.sources[0]
        return [(src, max((ring.distance(src, d) for d in chunk.dests if d not in chunk.sources), default=0), False)]
    owner = _owner(chunk)
    up = max((ring.distance(s, owner) for s in chunk.sources if s != owner), default=0)
    down = max((ring.distance(owner, d) for d in chunk.dests if d != owner), default=0)
    return [(ring.step(owner, -up), up, True), (owner, down, False)]


def ring_hops(demand: Demand, chunk: Chunk, ring: Ring) -> list[Hop]:
    """The walk of one chunk along `ring`, in causal order."""
    return [(chunk.id, a, b, reduce) for start, hops, reduce in ring_runs(demand, chunk, ring)
            for a, b in ring.walk(start, hops)]


def ring_links_s(topology: Topology, demand: Demand) -> float:
    """A lower bound on the ring baseline's time: the seconds its busiest link needs for the chunks
    its walks put on it, at the link's full bandwidth (all its parallel links at once). An alltoall's
    chunk walks to its destination, half way round on average, so at tens of GPUs this is many
    times what a plan of direct routes takes; it costs a pass over the chunks, not a schedule."""
    import numpy as np
    rings = find_rings(topology)
    n = len(rings[0].order)
    starts = np.zeros((len(rings), 2 * n + 1))  # per ring, +1 where a run starts and -1 after it ends
    for c in demand.chunks:
        k = _lane(demand, c) % len(rings)
        for first, hops, _ in ring_runs(demand, c, rings[k]):
            p = rings[k].pos[first]
            starts[k, p] += 1
            starts[k, p + hops] -= 1
    runs = np.cumsum(starts, axis=1)
    per_link: Counter = Counter()
    for ring, counts in zip(rings, runs[:, :n] + runs[:, n:2 * n]):  # a run past the last rank wraps round
        for i in np.flatnonzero(counts):
            for l in topology.path_links(_hop_path(topology, ring.order[i], ring.step(ring.order[i]))):
                per_link[l] += float(counts[i])
    links = topology.links
    return max((x * demand.chunk_bytes / (links[l].bandwidth * links[l].count) for l, x in per_link.items()), default=0.0)


@register("ring")
def plan_ring(topology: Topology, demand: Demand, options: PlanOptions) -> Schedule:
    started = time.perf_counter()
    rings = find_rings(topology)
    walks = [ring_hops(demand, c, rings[_lane(demand, c) % len(rings)]) for c in demand.chunks]
    te = expand(topology, demand, tau=options.tau)
    ls = ListScheduler(topology, demand, te)
    paths: dict[tuple[int, int], tuple[int, ...]] = {}
    # step j moves hop j of every chunk, as NCCL's ring steps do
    for step in range(max((len(w) for w in walks), default=0)):
        for walk in walks:
            if step < len(walk):
                chunk, a, b, reduce = walk[step]
                if (a, b) not in paths:
                    paths[(a, b)] = _hop_path(topology, a, b)
                ls.add(chunk, a, b, paths[(a, b)], reduce)
    lanes = len({_lane(demand, c) for c in demand.chunks})
    used = min(lanes, len(rings))
    notes = [f"ring: {len(rings)} ring{'s' if len(rings) > 1 else ''} "
             f"({'Hamiltonian cycles over GPU links' if is_mesh(topology) else 'rank order'}"
             f"{', joined across nodes through the NICs' if topology.nodes > 1 else ''}), "
             f"first {' '.join(map(str, rings[0].order))}"]
    if used < len(rings):
        notes.append(f"ring: {lanes} chunk{'s' if lanes > 1 else ''} per rank use{'s' if lanes == 1 else ''} "
                     f"{used} of {len(rings)} rings; --chunks {len(rings)} would use them all")
    return ls.schedule("ring", started, tuple(notes))


# ---- direct ---------------------------------------------------------------------------------------


def one_transfer_path(topo: Topology, src: int, dst: int, planner: str) -> tuple[int, ...]:
    """The best GPU-to-GPU path from src to dst; a clear error naming the planner where none exists."""
    if not topo.paths(src, dst):
        raise CompileError(f"{planner}: rank {src} cannot reach rank {dst} in one transfer on {topo.name}; "
                           "use method='relay', 'ring' or 'milp'")
    return topo.best_path(src, dst)


def nic_rounds(topo: Topology) -> Callable[[int, int], tuple[int, int] | None]:
    """For a transfer between nodes through NICs: (round, turn), a Latin square over the NICs. In
    round (o, r) the NIC with index i on node m sends to NIC i + r on node m + o, so every NIC sends
    to one NIC and receives from one and none is a hot spot while another idles; the GPUs a NIC
    pair serves take turns within the round. None inside a node or where a GPU has no NIC."""
    where = {g: (nic.node, nic.index, nic.gpus.index(g), len(nic.gpus)) for nic in topo.nics for g in nic.gpus}
    per = 1 + max((nic.index for nic in topo.nics), default=0)
    nodes = max(1, topo.nodes)

    def key(s: int, d: int) -> tuple[int, int] | None:
        a, b = where.get(s), where.get(d)
        if a is None or b is None or a[0] == b[0]:
            return None
        return ((b[0] - a[0]) % nodes) * per + (b[1] - a[1]) % per, a[2] * b[3] + b[2]
    return key


def rotating_rounds(topo: Topology, n: int) -> Callable[[int, int, int], tuple[tuple[int, ...], int]]:
    """(source, destination, lane) -> the sort key of a one-hop transfer: inside nodes in round
    (d - s) mod n, then between nodes lane by lane in the rounds of nic_rounds."""
    across = nic_rounds(topo)

    def order(s: int, d: int, lane: int) -> tuple[tuple[int, ...], int]:
        k = across(s, d)
        return ((0, (d - s) % n), lane) if k is None else ((1, lane, *k), lane)
    return order


def direct_hops(topo: Topology, demand: Demand) -> list[Hop]:
    """Every need as one transfer, in rounds: rank s sends to (s + r) mod N in round r; between
    nodes through NICs, after those inside nodes (on other links), chunk lane by chunk lane in the
    rounds of nic_rounds."""
    first: list[tuple[tuple[int, ...], int, int, Hop]] = []  # (round, lane, chunk, hop)
    then: list[tuple[tuple[int, ...], int, int, Hop]] = []
    order = rotating_rounds(topo, demand.ngpus)
    for c in demand.chunks:
        lane = _lane(demand, c)
        if not demand.reduce:
            for d in c.dests:
                if d in c.sources:
                    continue
                s = next((s for s in c.sources if topo.paths(s, d)), c.sources[0])
                first.append((*order(s, d, lane), c.id, (c.id, s, d, False)))
            continue
        owner = _owner(c)
        for s in c.sources:
            if s != owner:
                first.append((*order(s, owner, lane), c.id, (c.id, s, owner, True)))
        for d in c.dests:
            if d != owner:
                then.append((*order(owner, d, lane), c.id, (c.id, owner, d, False)))
    return [h for *_, h in sorted(first)] + [h for *_, h in sorted(then)]


@register("direct")
def plan_direct(topology: Topology, demand: Demand, options: PlanOptions) -> Schedule:
    started = time.perf_counter()
    hops = direct_hops(topology, demand)
    paths = {(a, b): one_transfer_path(topology, a, b, "direct") for _, a, b, _ in hops}
    ls = ListScheduler(topology, demand, expand(topology, demand, tau=options.tau))
    for chunk, a, b, reduce in hops:
        ls.add(chunk, a, b, paths[(a, b)], reduce)
    return ls.schedule("direct", started, ("direct: one transfer per need over the best path, in rotating rounds",))


# ---- relay ----------------------------------------------------------------------------------------


class Routes:
    """Quickest routes of one-transfer hops between GPUs for chunks of `nbytes`, each hop timed as
    its best path (alpha plus bytes over bandwidth); among equally quick ones, the least loaded."""

    def __init__(self, topo: Topology, nbytes: float, rails: int = 0):
        """rails: where > 0, a hop between nodes joins GPUs of one rail group only (on_rail)."""
        import numpy as np
        from scipy.sparse import csr_matrix
        from scipy.sparse.csgraph import dijkstra
        self.topo = topo
        self.hop = {(a, b): topo.transfer_time(a, b, nbytes) for a in range(topo.ngpus) for b in topo.neighbours(a)
                    if not rails or on_rail(topo, a, b, rails)}
        self.into: dict[int, list[int]] = {}
        self.out: dict[int, list[int]] = {}
        for a, b in self.hop:
            self.into.setdefault(b, []).append(a)
            self.out.setdefault(a, []).append(b)
        self.load: dict[tuple[int, int], float] = {}
        self.known: dict[tuple[int, bool], tuple] = {}  # (root, towards) -> what tree() finds alike every time
        n = topo.ngpus
        graph = csr_matrix((list(self.hop.values()), ([a for a, _ in self.hop], [b for _, b in self.hop])), shape=(n, n))
        self.quickest = dijkstra(graph, directed=True) if self.hop else np.full((n, n), np.inf)  # [from, to]

    def dist(self, root: int, towards: bool) -> list[float]:
        """Quickest time from root to every GPU (towards=False) or from every GPU to root (True)."""
        return (self.quickest[:, root] if towards else self.quickest[root]).tolist()

    def tree(self, root: int, leaves: tuple[int, ...], towards: bool, across_last: bool = False) -> list[tuple[int, int, int]]:
        """(depth, sender, receiver) of a tree of quickest routes joining root and leaves: from root
        to them (towards=False) or from them to root. Each GPU's next hop towards the root is the
        one whose quickest route there crosses the fewest hops of earlier trees (summed over its
        links); each hop taken adds one to its link's count. across_last (from root): a leaf is
        reached by a hop between nodes where an equally quick route ends with one."""
        inf = float("inf")
        if (root, towards) not in self.known:  # what no tree changes: quickest times, and hops on quickest routes
            d = self.dist(root, towards)
            self.known[(root, towards)] = d, 1e-9 * max(1.0, max(x for x in d if x < inf)), {}
        d, tol, on_quickest = self.known[(root, towards)]  # on_quickest: x -> its hops on quickest routes (cross)
        for leaf in leaves:
            if d[leaf] == inf:
                a, b = (leaf, root) if towards else (root, leaf)
                raise CompileError(f"relay: rank {b} cannot be reached from rank {a} on {self.topo.name}")
        crossed, nxt = {root: 0}, {}

        def cross(v: int) -> None:  # crossed[v] and nxt[v], from those of the GPUs a hop nearer the root
            stack = [v]
            while stack:
                x = stack[-1]
                if x in crossed:
                    stack.pop()
                    continue
                edges = on_quickest.get(x)
                if edges is None:
                    near = self.out.get(x, ()) if towards else self.into.get(x, ())
                    edges = [((x, u) if towards else (u, x), u) for u in near if u == root or 0 < d[u] < inf]
                    edges = on_quickest[x] = [(e, u) for e, u in edges if abs(d[u] + self.hop[e] - d[x]) <= tol]
                missing = [u for _, u in edges if u not in crossed]
                if missing:
                    stack += missing
                    continue
                if across_last and x in ends:
                    edges = [(e, u) for e, u in edges if node_of(e[0]) != node_of(e[1])] or edges
                crossed[x], nxt[x] = min((crossed[u] + self.load.get(e, 0), u) for e, u in edges)
                stack.pop()
        node_of, ends = self.topo.node_of, set(leaves)
        parent: dict[int, int] = {root: -1}
        for leaf in sorted(set(leaves) - {root}, key=lambda v: (d[v], v)):
            cross(leaf)
            v = leaf
            while v not in parent:
                u = parent[v] = nxt[v]
                e = (v, u) if towards else (u, v)
                self.load[e] = self.load.get(e, 0) + 1
                v = u
        depth = {root: 0}
        for v in parent:  # a GPU joins after every GPU on its route to the root
            if v not in depth:
                route = [v]
                while parent[route[-1]] not in depth:
                    route.append(parent[route[-1]])
                for w in reversed(route):
                    depth[w] = depth[parent[w]] + 1
        return [(depth[v], v, u) if towards else (depth[v], u, v) for v, u in parent.items() if u >= 0]


def on_rail(topo: Topology, a: int, b: int, group: int) -> bool:
    """Whether GPUs a and b are in one node, or in one rail group: local indices a // group apart."""
    per = topo.gpus_per_node
    return a // per == b // per or a % per // group == b % per // group


def relay_hops(topo: Topology, demand: Demand, rails: int = 0) -> list[Hop]:
    """Every chunk's tree of hops, in causal order: reductions up their trees deepest first, then
    copies down theirs shallowest first, chunk by chunk at each depth (as the ring moves step j of
    every chunk together). rails: where > 0, hops between nodes only within rail groups of that
    many local indices (Routes)."""
    routes = Routes(topo, demand.chunk_bytes, rails)
    up: list[tuple[int, int, int, Hop]] = []
    down: list[tuple[int, int, int, Hop]] = []
    for c in demand.chunks:
        if demand.reduce:
            root = _owner(c)
            up += [(-k, _lane(demand, c), c.id, (c.id, a, b, True))
                   for k, a, b in routes.tree(root, c.sources, towards=True)]
            leaves = tuple(d for d in c.dests if d != root)
        else:
            leaves = tuple(d for d in c.dests if d not in c.sources)
            if not leaves:
                continue
            root = min(c.sources, key=lambda s: (sum(routes.dist(s, False)[d] for d in leaves), s))
        # one destination on rails: gather on its rail in the source's node, then cross (as PXN does), so
        # a GPU forwards only what its own node's GPUs hand it early, never what arrives late over the network
        down += [(k, _lane(demand, c), c.id, (c.id, a, b, False))
                 for k, a, b in routes.tree(root, leaves, towards=False, across_last=bool(rails) and len(leaves) == 1)]
    return [h for *_, h in sorted(up)] + [h for *_, h in sorted(down)]


@register("relay")
def plan_relay(topology: Topology, demand: Demand, options: PlanOptions) -> Schedule:
    started = time.perf_counter()
    hops, notes = relay_hops(topology, demand), []
    lim = limits(target_runtimes(demand.collective, ALL, topology.vendor))
    room, why = lim.blocks(topology.sms), lim.blocks_reason(topology.sms)
    need = thread_blocks(hops, lim.max_steps)
    per = topology.gpus_per_node
    for group in (g for g in range(per - 1, 0, -1) if per % g == 0) if topology.nodes > 1 and need > room else ():
        railed = relay_hops(topology, demand, group)
        if thread_blocks(railed, lim.max_steps) <= room or group == 1:
            hops = railed
            notes.append(f"relay: hops between nodes only among GPUs of one rail group ({group} local "
                         f"ind{'ex' if group == 1 else 'ices'}): straight, a rank needed about {need} thread blocks, "
                         f"where {why}")
            break
    ls = ListScheduler(topology, demand, expand(topology, demand, tau=options.tau))
    for chunk, a, b, reduce in hops:
        ls.add(chunk, a, b, topology.best_path(a, b), reduce)
    relayed = None if demand.reduce else len(hops) - len(demand.needs())
    more = f"; {relayed} hop{'s' if relayed != 1 else ''} beyond one per need" if relayed else ""
    return ls.schedule("relay", started, ("relay: every need over a quickest route of one-transfer hops, relayed "
                                          "by the GPUs on it" + more,) + tuple(notes))


def direct_crowded(topology: Topology, demand: Demand) -> str | None:
    """Why direct cannot be written where a rank would need more thread blocks (one per peer) than
    it may have (DGX A100 x 16 alltoall: 127 peers, 108 SMs), else None."""
    lim = limits(target_runtimes(demand.collective, ALL, topology.vendor))
    room, why = lim.blocks(topology.sms), lim.blocks_reason(topology.sms)
    need = thread_blocks(direct_hops(topology, demand), lim.max_steps)
    return f"a rank needs about {need} thread blocks, one per peer; {why}" if need > room else None


def thread_blocks(hops: list[Hop], max_steps: int) -> int:
    """About the most thread blocks a rank's program needs: one per peer (a send and a receive peer
    share one), times the channel groups the busiest pair's transfers need at `max_steps` per block."""
    peers: dict[tuple[int, int], set[int]] = {}
    pairs: dict[tuple[int, int], int] = {}
    for _, a, b, _ in hops:
        peers.setdefault((a, 0), set()).add(b)
        peers.setdefault((b, 1), set()).add(a)
        pairs[(min(a, b), max(a, b))] = pairs.get((min(a, b), max(a, b)), 0) + 1
    most = max(map(len, peers.values()), default=0)
    return most * math.ceil(max(pairs.values(), default=0) / max_steps)


# ---- oneshot --------------------------------------------------------------------------------------


def whole_buffer(demand: Demand) -> Demand:
    """An allreduce's demand in chunks_per_rank chunks in all (the buffer, not its per-rank slices);
    any other demand as it is."""
    cs, k, first = SPECS.get(demand.collective), demand.chunks_per_rank, demand.chunks[0]
    if cs is None or not cs.flat or not demand.reduce or len(demand.chunks) <= k or \
            any((c.sources, c.dests) != (first.sources, first.dests) for c in demand.chunks):
        return demand
    chunks = tuple(Chunk(i, first.sources, first.dests, (i,) * len(first.sources), (i,) * len(first.dests), first.job)
                   for i in range(k))
    return replace(demand, chunks=chunks, chunk_bytes=demand.size_bytes / k, input_chunks=k, output_chunks=k)


def oneshot_hops(topo: Topology, demand: Demand) -> list[tuple[int, int, int]]:
    """(chunk, contributor, destination) for every contribution a destination lacks, in direct's
    rotating rounds: inside nodes first, then between them in the NICs' Latin square."""
    order = rotating_rounds(topo, demand.ngpus)
    hops = [(*order(s, d, _lane(demand, c)), c.id, s, d) for c in demand.chunks for s in c.sources for d in c.dests
            if d != s]
    return [(c, s, d) for *_, c, s, d in sorted(hops)]


@register("oneshot")
def plan_oneshot(topology: Topology, demand: Demand, options: PlanOptions) -> Schedule:
    started = time.perf_counter()
    if not demand.reduce:
        raise CompileError(f"oneshot: plans reductions only (allreduce, reduce-scatter, reduce); {demand.collective} "
                           "copies: use method='direct'")
    demand = whole_buffer(demand)
    hops = oneshot_hops(topology, demand)
    paths = {(a, b): one_transfer_path(topology, a, b, "oneshot") for _, a, b in hops}
    ls = ListScheduler(topology, demand, expand(topology, demand, tau=options.tau))
    for chunk, a, b in hops:
        ls.add(chunk, a, b, paths[(a, b)], reduce=True, own=True)
    k = len(demand.chunks)
    return ls.schedule("oneshot", started, (f"oneshot: every rank sends its own input ({k} chunk{'s' if k > 1 else ''}) "
                                            "straight to every other rank, which adds them up",))
