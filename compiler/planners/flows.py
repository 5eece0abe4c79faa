"""The time-expanded network shared by the MILP and the LP: which (chunk, link, epoch) flows can
matter, and the constraint families over them, each a sparse matrix.

F(q, l, k): chunk q starts crossing link l in epoch k. Switches are cut-through: a transfer uses
every link of its path in the same epoch and lands at the next GPU `arrival[l]` epochs later.
B(q, g, k): GPU g holds q at the start of epoch k (k = 1..K; at k = 0 only sources hold).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import numpy as np
import scipy.sparse as sp
from scipy.sparse.csgraph import shortest_path

from compiler.model.timing import TimeExpansion
from compiler.model.topology import Topology

INF = np.iinfo(np.int32).max // 4


@dataclass(frozen=True)
class PathTable:
    """Every GPU-to-GPU route as arrays: first GPU, last GPU, arrival epochs, links (padded -1)."""
    first: np.ndarray
    last: np.ndarray
    arrival: np.ndarray
    links: np.ndarray  # (paths, max hops)


def path_table(topo: Topology, te: TimeExpansion) -> PathTable:
    first, last, arr, links = [], [], [], []
    for s in range(topo.ngpus):
        for d in topo.neighbours(s):
            for p in topo.paths(s, d):
                ids = topo.path_links(p)
                first.append(s)
                last.append(d)
                arr.append(te.arrival[ids[-1]])
                links.append(ids)
    hops = max(len(x) for x in links)
    pad = np.full((len(links), hops), -1, dtype=np.int64)
    for i, ids in enumerate(links):
        pad[i, :len(ids)] = ids
    return PathTable(np.array(first), np.array(last), np.array(arr), pad)


def gpu_distances(topo: Topology, table: PathTable) -> np.ndarray:
    """Fewest epochs from a GPU holding a chunk to another GPU holding it (chains of transfers)."""
    n = topo.ngpus
    w = np.full((n, n), np.inf)
    np.minimum.at(w, (table.first, table.last), table.arrival.astype(float))
    dense = np.where(np.isfinite(w), np.maximum(w, 1e-9), 0.0)
    d = shortest_path(sp.csr_matrix(dense), directed=True)
    d = np.where(np.isfinite(d), np.round(d), INF).astype(np.int64)
    np.fill_diagonal(d, 0)
    return d


@dataclass(frozen=True)
class Flows:
    """The flow variables kept after pruning, as parallel arrays (one entry per variable)."""
    q: np.ndarray
    l: np.ndarray
    k: np.ndarray

    def __len__(self) -> int:
        return len(self.q)


def useful_flows(topo: Topology, src: np.ndarray, dst: np.ndarray, te: TimeExpansion, horizon: int,
                 ready: np.ndarray | None = None, open_end: bool = False) -> Flows:
    """Flows that can lie on a route from a source to a destination within the horizon:
    a link may carry commodity q only after q could reach the route's first GPU, early enough to
    reach a destination by the horizon, and never into one of q's sources.
    src, dst: (commodities, ngpus) bool masks. ready: (commodities, ngpus) epoch from which each
    GPU in src holds q (default 0; a later epoch for a copy still in flight, which is never
    delivered twice). open_end: flows may start in any epoch of the horizon and land after it
    (a window of the rounds planner); the route must still lead to a destination."""
    table, dist = distances(topo, te)
    big = np.int64(INF)
    have = np.zeros(src.shape, dtype=np.int64) if ready is None else np.asarray(ready, dtype=np.int64)
    have = np.where(src, have, big)
    earliest = (have[:, :, None] + dist[None, :, :]).min(axis=1)  # (Q, N)
    togo = np.where(dst[:, None, :], dist[None, :, :], big).min(axis=2)  # (Q, N)
    nl = len(topo.links)
    lo = np.full((len(src), nl), big)
    tail = np.full((len(src), nl), big)
    for hop in range(table.links.shape[1]):
        ids = table.links[:, hop]
        ok = ids >= 0
        a, b, arr, ids = table.first[ok], table.last[ok], table.arrival[ok], ids[ok]
        start = earliest[:, a]  # (Q, P)
        finish = np.where(src[:, b], big, arr[None, :] + togo[:, b])
        np.minimum.at(lo.T, ids, start.T)  # a link appears on many paths: reduce with minimum
        np.minimum.at(tail.T, ids, finish.T)
    hi = np.where(tail < big, horizon - 1, -1) if open_end else horizon - tail
    qs, ls = np.nonzero(lo <= hi)
    counts = (hi[qs, ls] - lo[qs, ls] + 1).astype(np.int64)
    q = np.repeat(qs, counts)
    l = np.repeat(ls, counts)
    offsets = np.arange(counts.sum()) - np.repeat(np.cumsum(counts) - counts, counts)
    k = np.repeat(lo[qs, ls], counts) + offsets
    order = np.lexsort((k, l, q))
    return Flows(q[order], l[order], k[order])


@lru_cache(maxsize=8)
def distances(topo: Topology, te: TimeExpansion) -> tuple[PathTable, np.ndarray]:
    """path_table and gpu_distances, computed once per topology and time expansion (read only)."""
    table = path_table(topo, te)
    return table, gpu_distances(topo, table)


def occupancy(l: np.ndarray, k: np.ndarray, te: TimeExpansion,
              link_images: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(flow index, link, epoch, count) for every link-epoch a flow started on link l[i] in epoch
    k[i] keeps busy: the link's window from k. With a symmetry the flow loads every image of its
    link; the links of one orbit then carry equal loads, so the load is given on the orbit's
    first link only, counted once per group element that maps the link there."""
    window = np.array(te.window)[l]
    idx = np.repeat(np.arange(len(l)), window)
    offs = np.arange(window.sum()) - np.repeat(np.cumsum(window) - window, window)
    epoch = k[idx] + offs
    links = l[idx]
    first, stabiliser = link_orbits(link_images, len(te.window))
    return idx, first[links], epoch, stabiliser[links]


def link_orbits(link_images: np.ndarray | None, nlinks: int) -> tuple[np.ndarray, np.ndarray]:
    """Per link: the first link of its orbit under a symmetry (itself without one), and how many
    group elements map it there (its stabiliser's size; 1 where the group acts freely)."""
    if link_images is None:
        return np.arange(nlinks), np.ones(nlinks, dtype=np.int64)
    return link_images.min(axis=0), (link_images == np.arange(nlinks)).sum(axis=0)


def link_ends(topo: Topology) -> tuple[np.ndarray, np.ndarray]:
    return (np.array([l.src for l in topo.links]), np.array([l.dst for l in topo.links]))


def network_nodes(topo: Topology) -> tuple[np.ndarray, np.ndarray]:
    """Per vertex: whether it is a network switch, and its node (a GPU's, a switch's own)."""
    net = np.array([False] * topo.ngpus + [w.kind == "network" for w in topo.switches])
    node = np.array([topo.node_of(g) for g in range(topo.ngpus)] + [w.node for w in topo.switches])
    return net, node


def rows_matrix(rows: np.ndarray, cols: np.ndarray, vals: np.ndarray, ncols: int) -> tuple[sp.csr_matrix, np.ndarray]:
    """Sparse matrix with one row per distinct key in `rows` (keys renumbered densely)."""
    keys, inverse = np.unique(rows, return_inverse=True)
    m = sp.csr_matrix((vals, (inverse, cols)), shape=(len(keys), ncols))
    return m, keys


def capacity_violations(topo: Topology, te: TimeExpansion, transfers) -> list[str]:
    """Links over capacity in some epoch (a transfer occupies each link of its path for the
    link's window from its start epoch); empty when the schedule fits the epoch model."""
    load: dict[tuple[int, int], int] = {}
    seen_groups: set[tuple[int, int]] = set()
    for t in transfers:
        for l in topo.path_links(t.path):
            if t.group >= 0:
                if (t.group, l) in seen_groups:
                    continue
                seen_groups.add((t.group, l))
            for e in range(t.start, t.start + te.window[l]):
                load[(l, e)] = load.get((l, e), 0) + 1
    bad = []
    for (l, e), n in sorted(load.items()):
        if n > te.capacity[l]:
            link = topo.links[l]
            bad.append(f"{topo.vertex_name(link.src)}->{topo.vertex_name(link.dst)} carries {n} chunks in epoch {e} "
                       f"(capacity {te.capacity[l]})")
    return bad


def order_within_epochs(topo: Topology, transfers) -> list:
    """Transfers in epoch order; inside an epoch, in rounds in which no two share a link.

    Where an epoch is longer than a chunk's time on a link (a coarse epoch), several transfers
    start on that link in one epoch and are served one after another in schedule order (by the
    simulator and by the runtime). Ordered carelessly, a link waits for a transfer queued behind
    another one on a different link, and epochs overrun. Greedy edge colouring, slowest
    transfers first, puts each transfer in the first round with none of its links taken; the
    members of a switch-multicast group stay together."""
    def slowest(p):
        return min(topo.links[l].bandwidth for l in topo.path_links(p))

    by_epoch: dict[int, list[list]] = {}
    units: dict[tuple[int, int], list] = {}
    for t in transfers:
        if t.group >= 0:
            unit = units.get((t.start, t.group))
            if unit is not None:
                unit.append(t)
                continue
            unit = units[(t.start, t.group)] = [t]
        else:
            unit = [t]
        by_epoch.setdefault(t.start, []).append(unit)
    out = []
    for epoch in sorted(by_epoch):
        rounds: list[set[int]] = []
        placed = []
        for unit in sorted(by_epoch[epoch], key=lambda u: min(slowest(t.path) for t in u)):
            links = {l for t in unit for l in topo.path_links(t.path)}
            r = next((i for i, taken in enumerate(rounds) if not taken & links), len(rounds))
            if r == len(rounds):
                rounds.append(set())
            rounds[r] |= links
            placed.append((r, unit))
        for _, unit in sorted(placed, key=lambda x: x[0]):
            out += unit
    return out
