"""The time-expanded network shared by the MILP and the LP: which (chunk, link, epoch) flows can
matter, and the constraint families over them, each a sparse matrix.

F(q, l, k): chunk q starts crossing link l in epoch k. Switches are cut-through: a transfer uses
every link of its path in the same epoch and lands at the next GPU `arrival[l]` epochs later.
B(q, g, k): GPU g holds q at the start of epoch k (k = 1..K; at k = 0 only sources hold).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import scipy.sparse as sp
from scipy.sparse.csgraph import shortest_path

from ..timing import TimeExpansion
from ..topology import Topology

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


def useful_flows(topo: Topology, src: np.ndarray, dst: np.ndarray, te: TimeExpansion, horizon: int) -> Flows:
    """Flows that can lie on a route from a source to a destination within the horizon:
    a link may carry commodity q only after q could reach the route's first GPU, early enough to
    reach a destination by the horizon, and never into one of q's sources.
    src, dst: (commodities, ngpus) bool masks."""
    table = path_table(topo, te)
    dist = gpu_distances(topo, table)
    big = np.int64(INF)
    earliest = np.where(src[:, :, None], dist[None, :, :], big).min(axis=1)  # (Q, N)
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
        for col in range(len(ids)):  # a link appears on many paths: reduce with minimum
            l = ids[col]
            np.minimum(lo[:, l], start[:, col], out=lo[:, l])
            np.minimum(tail[:, l], finish[:, col], out=tail[:, l])
    hi = horizon - tail
    qs, ls = np.nonzero(lo <= hi)
    counts = (hi[qs, ls] - lo[qs, ls] + 1).astype(np.int64)
    q = np.repeat(qs, counts)
    l = np.repeat(ls, counts)
    offsets = np.arange(counts.sum()) - np.repeat(np.cumsum(counts) - counts, counts)
    k = np.repeat(lo[qs, ls], counts) + offsets
    order = np.lexsort((k, l, q))
    return Flows(q[order], l[order], k[order])


def link_ends(topo: Topology) -> tuple[np.ndarray, np.ndarray]:
    return (np.array([l.src for l in topo.links]), np.array([l.dst for l in topo.links]))


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
