"""--method trees: multicast trees from a fluid flow LP, for copy demands on GPUs joined by direct links.

1. The multicast flow LP (`multicast_loads`): each source's data reaches each of its destinations as a
   flow that fits within the source's own load on every link, and the sources' loads share each link's
   bandwidth; minimise the time T that bandwidth needs. Any schedule with copies is a point of this LP
   (a source's data crossing a link once serves every destination behind it), so T is also a lower
   bound; on MI250 it is the 3.0 ms cut bound, which no single route per chunk reaches.
2. Each source's loads are cut into spanning arborescences rooted at it (`arborescences`: the widest
   one left, its narrowest edge's weight off every edge, again).
3. Chunks go to trees one at a time, each to the tree of its source that keeps the busiest link of the
   tree least busy (`assign`), so the integral chunks follow the fluid loads as closely as they can.
4. Every chunk walks its tree; step j + d moves the depth-d edges of every source's j-th chunk
   (a pipeline, as ring's steps are), list-scheduled at the earliest epoch (baselines.ListScheduler).

The LP is small (sources x destinations x links flow variables), solved by HiGHS through scipy; the
tree search and the assignment are a few lines each, written here because no library packs
arborescences with weights.
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Sequence

import numpy as np

from compiler.model.demand import Demand
from compiler.model.schedule import Schedule
from compiler.model.timing import expand
from compiler.model.topology import Link, Topology
from compiler.planners.baselines import ListScheduler, is_mesh
from compiler.planners.options import PlanOptions
from compiler.planners.registry import register
from compiler.specs.errors import CompileError

Edge = tuple[int, int]
Tree = tuple[tuple[Edge, ...], float]  # edges in the order they joined (a parent's before its children's), weight


def applies(topo: Topology, demand: Demand) -> bool:
    """Whether trees plans this demand (auto's test): copies on one node of GPUs joined by direct links."""
    return _why_not(topo, demand) is None and any(len(c.dests) > 1 for c in demand.chunks)


def _why_not(topo: Topology, demand: Demand) -> str | None:
    if demand.reduce:
        return "trees: plans copies; a reduction is planned as the time reverse of its copy dual"
    if topo.nodes > 1:
        return f"trees: plans one node; {topo.name} has {topo.nodes} (use hier, or auto)"
    if topo.switches or not is_mesh(topo):
        return (f"trees: needs GPUs joined by direct links; {topo.name} joins them through switches "
                "(use direct, milp or rounds, or auto)")
    if any(len(c.sources) != 1 for c in demand.chunks):
        return "trees: every chunk needs exactly one source"
    return None


def multicast_loads(topo: Topology, volume: dict[int, float], dests: dict[int, set[int]],
                    over: Sequence[Link] | None = None,
                    time_limit: float | None = None) -> tuple[float, dict[int, dict[Edge, float]]]:
    """(T, load[s][edge]): the least T in which each source s sends volume[s] to every rank of
    dests[s], the flow to each destination within s's load on every link, the loads together within
    bandwidth x count x T (volumes and bandwidths in any one unit). over: the links to use (default:
    all of topo's; hier gives one node's). time_limit: seconds HiGHS may take (a 32-GPU torus's LP
    took 108 s and auto's 10 s waited for it)."""
    import scipy.sparse as sp  # loaded with the planner only (auto imports `applies` from here)
    from scipy.optimize import linprog
    over = topo.links if over is None else over
    links = [(l.src, l.dst) for l in over]
    cap = np.array([l.bandwidth * l.count for l in over])
    cap = cap / cap.max()
    nodes = sorted({v for e in links for v in e})
    srcs = sorted(volume)
    pairs = [(s, d) for s in srcs for d in sorted(dests[s])]
    E, S, P = len(links), len(srcs), len(pairs)
    # variables: T, load x[s, e] (S x E), flow f[(s, d), e] (P x E)
    nx = 1 + S * E
    col_x = lambda si, e: 1 + si * E + e  # noqa: E731
    col_f = lambda pi, e: nx + pi * E + e  # noqa: E731
    rows, cols, vals, ub = [], [], [], []
    r = 0
    for e in range(E):  # sum_s x[s, e] - cap_e T <= 0
        rows += [r] * (S + 1)
        cols += [col_x(si, e) for si in range(S)] + [0]
        vals += [1.0] * S + [-cap[e]]
        ub.append(0.0)
        r += 1
    sidx = {s: i for i, s in enumerate(srcs)}
    for pi, (s, _) in enumerate(pairs):  # f[(s, d), e] - x[s, e] <= 0
        for e in range(E):
            rows += [r, r]
            cols += [col_f(pi, e), col_x(sidx[s], e)]
            vals += [1.0, -1.0]
            ub.append(0.0)
            r += 1
    a_ub = sp.csr_matrix((vals, (rows, cols)), shape=(r, nx + P * E))
    rows, cols, vals, eq = [], [], [], []
    r = 0
    for pi, (s, d) in enumerate(pairs):  # out - in = volume at s, -volume at d, 0 elsewhere
        for v in nodes:
            for e, (a, b) in enumerate(links):
                if a == v or b == v:
                    rows.append(r)
                    cols.append(col_f(pi, e))
                    vals.append(1.0 if a == v else -1.0)
            eq.append(volume[s] if v == s else -volume[s] if v == d else 0.0)
            r += 1
    a_eq = sp.csr_matrix((vals, (rows, cols)), shape=(r, nx + P * E))
    c = np.zeros(nx + P * E)
    c[0] = 1.0
    limit = {} if time_limit is None else {"time_limit": max(0.1, time_limit)}
    res = linprog(c, A_ub=a_ub, b_ub=ub, A_eq=a_eq, b_eq=eq, bounds=(0, None), method="highs", options=limit)
    if res.status == 1 and time_limit is not None:  # the limit it had (past the deadline, time_limit is negative)
        raise CompileError(f"trees: the multicast flow LP ({P} source-destination flows over {E} links) did not "
                           f"finish within its {limit['time_limit']:.3g} s; raise time_limit")
    if res.status != 0:
        raise CompileError(f"trees: the multicast flow LP found no solution ({res.message})")
    x = res.x
    loads = {s: {links[e]: float(x[col_x(sidx[s], e)]) for e in range(E) if x[col_x(sidx[s], e)] > 1e-9}
             for s in srcs}
    return float(x[0]), loads


def widest_arborescence(root: int, load: dict[Edge, float], reach: set[int]) -> tuple[Edge, ...] | None:
    """The arborescence from `root` spanning `reach` whose narrowest edge is widest (Prim on widths),
    edges in the order they join; None where some rank of `reach` cannot be reached."""
    inside, edges = {root}, []
    out = defaultdict(list)
    for (a, b), w in load.items():
        out[a].append((w, b))
    while not reach <= inside:
        best = max(((w, a, b) for a in inside for w, b in out[a] if b not in inside and w > 1e-9), default=None)
        if best is None:
            return None
        _, a, b = best
        inside.add(b)
        edges.append((a, b))
    return tuple(prune(root, edges, reach))


def prune(root: int, edges: list[Edge], reach: set[int]) -> list[Edge]:
    """Drop branches that lead to no rank of `reach` (a relay that needs nothing is kept only on a path)."""
    kids = defaultdict(list)
    for a, b in edges:
        kids[a].append(b)
    keep: set[int] = set()

    def needed(v: int) -> bool:
        hit = v in reach
        for w in kids[v]:
            hit = needed(w) or hit
        if hit:
            keep.add(v)
        return hit

    needed(root)
    return [(a, b) for a, b in edges if b in keep]


def arborescences(root: int, load: dict[Edge, float], reach: set[int], volume: float) -> list[Tree]:
    """Cut a source's loads into weighted arborescences: the widest one left, less its narrowest
    edge's weight on every edge, until they carry `volume` or none is left."""
    left, trees, carried = dict(load), [], 0.0
    while carried < volume * (1 - 1e-6):
        edges = widest_arborescence(root, left, reach)
        if edges is None:
            break
        w = min(min(left[e] for e in edges), volume - carried)
        for e in edges:
            left[e] -= w
        trees.append((edges, w))
        carried += w
    if not trees:
        raise CompileError(f"trees: rank {root}'s data reaches no destination over its LP loads")
    return trees


def assign(chunks: dict[int, list[int]], trees: dict[int, list[Tree]], cap: dict[Edge, float]) -> dict[int, int]:
    """Each chunk (by source, in turn across the sources) to the tree of its source that keeps the
    busiest of its links least busy (links in chunk-times: load / capacity), ties to the tree
    furthest below its weight. Returns chunk -> tree index."""
    busy: dict[Edge, float] = defaultdict(float)
    given: dict[tuple[int, int], int] = defaultdict(int)
    out = {}
    for j in range(max(map(len, chunks.values()))):
        for s in sorted(chunks):
            if j >= len(chunks[s]):
                continue
            def cost(t: int) -> tuple[float, float]:
                edges, w = trees[s][t]
                return max((busy[e] + 1) / cap[e] for e in edges), given[(s, t)] - w
            t = min(range(len(trees[s])), key=lambda t: (cost(t), t))
            for e in trees[s][t][0]:
                busy[e] += 1
            given[(s, t)] += 1
            out[chunks[s][j]] = t
    return out


def dealt(topo: Topology, chunks: dict[int, list[int]], dests: dict[int, set[int]],
          over: Sequence[Link] | None = None,
          time_limit: float | None = None) -> tuple[float, dict[int, list[Tree]], dict[int, int]]:
    """Steps 1-3 for the chunks of each source (`chunks`: source -> chunk ids, `dests`: source ->
    destinations) over the links `over` (default: all of topo's): (the LP's T in chunk-times of the
    widest link, each source's arborescences, chunk id -> index of its tree)."""
    over = topo.links if over is None else over
    volume = {s: float(len(ids)) for s, ids in chunks.items()}
    fluid, loads = multicast_loads(topo, volume, dests, over, time_limit)
    trees = {s: arborescences(s, loads[s], dests[s], volume[s]) for s in sorted(chunks)}
    top = max(l.bandwidth * l.count for l in over)
    return fluid, trees, assign(chunks, trees, {(l.src, l.dst): l.bandwidth * l.count / top for l in over})


@register("trees")
def plan_trees(topology: Topology, demand: Demand, options: PlanOptions) -> Schedule:
    started = time.perf_counter()
    why = _why_not(topology, demand)
    if why is not None:
        raise CompileError(why)
    chunks: dict[int, list[int]] = defaultdict(list)
    dests: dict[int, set[int]] = defaultdict(set)
    for c in demand.chunks:
        far = set(c.dests) - set(c.sources)
        if far:
            chunks[c.sources[0]].append(c.id)
            dests[c.sources[0]] |= far
    if not chunks:
        raise CompileError("trees: no chunk has to move")
    for s, ids in chunks.items():
        if any(set(demand.chunks[i].dests) - {s} != dests[s] for i in ids):
            raise CompileError(f"trees: rank {s}'s chunks go to different ranks; trees plans one set of "
                               "destinations per source (use milp or direct)")
    fluid, trees, which = dealt(topology, chunks, dests, time_limit=options.left(started))
    # step j + d: the depth-d edges of every source's j-th chunk (a tree lists a parent's edge before its children's)
    hops = []
    for s, ids in chunks.items():
        for j, cid in enumerate(ids):
            edges = trees[s][which[cid]][0]
            depth = {s: 0}
            for a, b in edges:
                depth[b] = depth[a] + 1
                hops.append((j + depth[a], depth[a], s, cid, a, b))
    ls = ListScheduler(topology, demand, expand(topology, demand, tau=options.tau))
    for *_, cid, a, b in sorted(hops):
        ls.add(cid, a, b, (a, b))
    used = sum(len({which[c] for c in ids}) for ids in chunks.values())
    fluid_s = fluid * demand.chunk_bytes / max(l.bandwidth * l.count for l in topology.links)
    notes = (f"trees: multicast flow LP {fluid_s * 1e3:.4g} ms (fluid, a lower bound on any copy schedule); "
             f"{sum(map(len, trees.values()))} arborescences, {used} carrying the {len(which)} chunks",)
    return ls.schedule("trees", started, notes)
