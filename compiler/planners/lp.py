"""The LP planner for demands without copies (alltoall, scatter, gather): a fluid multi-commodity
flow over the time-expanded network, one commodity per source (te-ccl-model.md §6), then a
rounding pass that makes it executable.

The LP's own epochs may be coarser than a chunk time (flows are fluid; capacity per epoch is
fractional), which keeps it small at cluster scale. Its value (the fewest epochs in which the
fluid flow meets the demand, times the epoch) is reported beside the rounded schedule's. Rounding:
the flow of each source is decomposed into routes to its destinations, each chunk is cut into m
sub-chunks, sub-chunks are given to routes by largest remainder, and the hops are list-scheduled
in epochs under the link capacities (so the result meets every demand exactly, and the simulator
judges its time).
"""

from __future__ import annotations

import math
import time
from dataclasses import replace

import cvxpy as cp
import numpy as np
import scipy.sparse as sp

from compiler.analysis.bounds import bound_for
from compiler.model.demand import Demand
from compiler.specs.errors import CompileError, InfeasibleError
from compiler.model.schedule import Schedule
from compiler.model.timing import TimeExpansion, delay_epochs, epochs_for, expand
from compiler.model.topology import Topology
from compiler.planners.registry import register
from compiler.planners.options import PlanOptions
from compiler.planners.highs import solve
from compiler.planners.symmetry import Symmetry
from compiler.planners.flows import distances, link_ends, network_nodes, rows_matrix, useful_flows
from compiler.planners.constraints import network_sends_a_node_what_other_nodes_sent, switch_forwards_what_enters
from compiler.planners.reductions import DUAL, Routes, Symmetric, orbits

LP_EPOCHS = 40  # target horizon of the fluid LP; its epoch grows with the problem, not the chunk
SUBCHUNKS = 4  # sub-chunks per chunk in the rounded schedule
FLOW_PENALTY = 1e-4
TOL = 1e-7
# a horizon is tried where the time left exceeds this many seconds per flow variable, and MIN_LEFT_S (cvxpy's
# canonicalisation and HiGHS took 1.0e-4 s per flow on DGX-1 alltoall, 2168 flows, and 1.5e-4 on DGX-2 x 2, 12408;
# building the model a fiftieth of that). It was a fixed 0.5 s: at --time-limit 5, DGX-1 alltoall 32 MB's LP was
# left out with 0.3-0.48 s to go in about half the runs, and ring's program, at 0.42 of the floor, was written
# instead of lp's, at 0.82
SECONDS_PER_FLOW = 1e-4
MIN_LEFT_S = 0.1


def commodity_masks(demand: Demand, only=None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(sources, src mask (S, N), amount (S, N) of chunks each source owes each rank);
    `only`: restrict to these sources (the representatives of a symmetry)."""
    for c in demand.chunks:
        if len(c.sources) != 1 or len(c.dests) != 1:
            if demand.collective.startswith(DUAL):  # a reduction, planned as the time reverse of its copy dual
                raise CompileError(f"lp: {demand.collective[len(DUAL):]} sums chunks from several ranks, which the "
                                   "LP cannot plan (it moves each chunk from one rank to one other: alltoall, "
                                   "scatter, gather); use `method=milp`, ring or auto")
            raise CompileError(f"lp: {demand.collective} copies chunks to several ranks; use method='milp' or 'ring' "
                               "(the LP plans demands without copies: alltoall, scatter, gather)")
    sources = np.array(sorted({c.sources[0] for c in demand.chunks if only is None or c.sources[0] in only}))
    row = {s: i for i, s in enumerate(sources)}
    amount = np.zeros((len(sources), demand.ngpus))
    for c in demand.chunks:
        if c.dests[0] != c.sources[0] and c.sources[0] in row:
            amount[row[c.sources[0]], c.dests[0]] += 1.0
    src = np.zeros((len(sources), demand.ngpus), dtype=bool)
    src[np.arange(len(sources)), sources] = True
    return sources, src, amount


class FluidModel:
    """The LP at one horizon. Variables f (flows, chunk units), H (held at start of epoch)."""

    def __init__(self, topo: Topology, demand: Demand, te: TimeExpansion, horizon: int, sym: Symmetry | None = None,
                 flows=None):
        self.sym = sym
        self.sources, src, amount = commodity_masks(demand, sym.reps if sym else None)
        self.amount = amount
        S, N, K = len(self.sources), topo.ngpus, horizon
        self.flows = flows = fluid_flows(topo, demand, te, horizon, sym) if flows is None else flows
        nf = len(flows)
        if nf == 0:
            raise InfeasibleError(f"lp: no route delivers the demand within {horizon} epochs")
        l_src, l_dst = link_ends(topo)
        is_gpu = np.arange(topo.nvertices) < N
        rate = np.array([l.capacity * te.tau / demand.chunk_bytes for l in topo.links])
        self.h_pos = np.arange(S * N * (K + 1)).reshape(S, N, K + 1)
        self.f = f = cp.Variable(nf, name="f", nonneg=True)
        self.H = H = cp.Variable(S * N * (K + 1), name="H", nonneg=True)
        arrival = np.array(te.arrival)
        cons = held_is_previous_less_sent_plus_arrived(flows, self.h_pos, l_src, l_dst, is_gpu, arrival, f, H)
        cons += sources_start_with_all(self.h_pos, self.sources, amount, H)
        # switches forward in the same epoch what enters them (the MILP's equation, no switch copies)
        cons += switch_forwards_what_enters(topo, flows, l_src, l_dst, is_gpu, False, f)
        cons += network_sends_a_node_what_other_nodes_sent(topo, flows, l_src, l_dst, f)  # no round trip through it
        cons += fluid_link_capacity(flows, rate, K, f, sym)
        cons += destinations_hold_what_they_are_owed(self.h_pos, amount, H)
        delivered, cons_d = early_delivery(self.h_pos, amount, H)
        self.problem = cp.Problem(cp.Minimize(-delivered / max(1.0, amount.sum()) + FLOW_PENALTY * cp.sum(f)),
                                  cons + cons_d)
        self.horizon = K

    def solve(self, time_limit: float, verbose: bool, deadline: float | None = None):
        return solve(self.problem, time_limit=time_limit, verbose=verbose, ipm=True, deadline=deadline)


def fluid_flows(topo: Topology, demand: Demand, te: TimeExpansion, horizon: int, sym: Symmetry | None = None):
    """The flow variables of the LP at `horizon` (FluidModel's; known before the model is built)."""
    _, src, amount = commodity_masks(demand, sym.reps if sym else None)
    return useful_flows(topo, src, amount > 0, te, horizon)


# ---- the LP's equations (fluid amounts per epoch; the MILP's are in constraints.py) ---------------


def held_is_previous_less_sent_plus_arrived(flows, h_pos, l_src, l_dst, is_gpu, arrival, f, H) -> list:
    """held(s,g,k+1) = held(s,g,k) - sent(s,g,k) + arrived(s,g,k+1), at every GPU g: what a GPU
    sends leaves it (no copies)."""
    S, N, K = h_pos.shape[0], h_pos.shape[1], h_pos.shape[2] - 1
    nh, nf = h_pos.size, len(flows)
    s, g, k = np.meshgrid(np.arange(S), np.arange(N), np.arange(K), indexing="ij")
    s, g, k = s.ravel(), g.ravel(), k.ravel()
    rows = np.arange(len(s))
    eq_h = sp.csr_matrix((np.concatenate([np.ones(len(s)), -np.ones(len(s))]),
                          (np.concatenate([rows, rows]), np.concatenate([h_pos[s, g, k + 1], h_pos[s, g, k]]))),
                         shape=(len(s), nh))
    row_of = lambda s_, g_, k_: (s_ * N + g_) * K + k_
    out_gpu = is_gpu[l_src[flows.l]]
    into_gpu = is_gpu[l_dst[flows.l]]
    land = flows.k + arrival[flows.l]
    o = np.nonzero(out_gpu)[0]
    i = np.nonzero(into_gpu & (land >= 1) & (land <= K))[0]
    eq_f = sp.csr_matrix((np.concatenate([np.ones(len(o)), -np.ones(len(i))]),
                          (np.concatenate([row_of(flows.q[o], l_src[flows.l[o]], flows.k[o]),
                                           row_of(flows.q[i], l_dst[flows.l[i]], land[i] - 1)]),
                           np.concatenate([o, i]))), shape=(len(s), nf))
    return [eq_h @ H + eq_f @ f == 0]


def sources_start_with_all(h_pos, sources, amount, H) -> list:
    """held(s,g,0) = everything s owes where g is the source s, else 0."""
    S, N = h_pos.shape[:2]
    start = h_pos[:, :, 0].ravel()
    init_val = np.zeros((S, N))
    init_val[np.arange(S), sources] = amount.sum(axis=1)
    return [H[start] == init_val.ravel()]


def reach_epochs(topo: Topology, demand: Demand, te: TimeExpansion) -> int:
    """The fewest epochs in which the LP can reach every rank a source owes (the flows' own
    distances): no shorter horizon has a flow for the farthest pair, so the horizon search starts
    here (DGX-2 x 2 alltoall 16 KB, alpha-bound: 64 epochs, found after 11 infeasible LPs from the
    bandwidth bound's 20)."""
    _, dist = distances(topo, te)
    pairs = {(c.sources[0], c.dests[0]) for c in demand.chunks if c.sources[0] != c.dests[0]}
    return max((int(dist[s, d]) for s, d in pairs), default=0)


def fluid_link_capacity(flows, rate, horizon, f, sym: Symmetry | None = None) -> list:
    """For every link and epoch: the amount started <= rate[l] (chunks per epoch). With a symmetry
    every flow loads all its link images."""
    nf, K = len(flows), horizon
    links, cols, epochs = flows.l, np.arange(nf), flows.k
    if sym is not None:
        links = sym.link_perms[:, flows.l].ravel()
        cols, epochs = np.tile(cols, sym.size), np.tile(epochs, sym.size)
    m, lk = rows_matrix(links.astype(np.int64) * (K + 1) + epochs, cols, np.ones(len(cols)), nf)
    return [m @ f <= rate[lk // (K + 1)]]


def destinations_hold_what_they_are_owed(h_pos, amount, H) -> list:
    """held(s,d,K) >= what s owes d, by the horizon."""
    ds, dd = np.nonzero(amount > 0)
    return [H[h_pos[ds, dd, h_pos.shape[2] - 1]] >= amount[ds, dd]]


def early_delivery(h_pos, amount, H) -> tuple[cp.Expression, list]:
    """(sum of D, its constraints): D(s,d,k) <= min(held(s,d,k), owed(s,d)) for k = 1..K, so that
    maximising the sum rewards early delivery."""
    ds, dd = np.nonzero(amount > 0)
    K = h_pos.shape[2] - 1
    D = cp.Variable((len(ds), K), name="D", nonneg=True)
    cols = h_pos[ds, dd, 1:]
    return cp.sum(D), [D <= amount[ds, dd][:, None], D <= cp.reshape(H[cols.ravel()], (len(ds), K), order="C")]


def fluid_expansion(topo: Topology, demand: Demand, bound_s: float, tau: float | None = None) -> TimeExpansion:
    """Epochs for the fluid LP: data streams, so a link delivers what it carries one epoch later
    (plus alpha); the epoch is a fraction of the bound, independent of the chunk size."""
    tau = tau or bound_s / LP_EPOCHS
    arrival = [0] * len(topo.links)
    for s in range(topo.ngpus):
        for d in topo.neighbours(s):
            for p in topo.paths(s, d):
                last = topo.link_id(p[-2], p[-1])
                arrival[last] = max(arrival[last], 1 + delay_epochs(topo.path_alpha(p), tau))
    ones = (1,) * len(topo.links)
    return TimeExpansion(tau, demand.chunk_bytes, ones, ones, tuple(arrival), 0, "fluid LP epochs")


def routes(model: FluidModel, topo: Topology) -> Routes:
    """Decompose each source's flow (summed over time) into routes to its destinations:
    {(source, dest): [(vertex path, chunks, mean LP epoch of its first hop)]}; a route may relay
    through GPUs."""
    f = model.flows
    val = np.asarray(model.f.value)
    out: dict[tuple[int, int], list] = {}
    ends = network_nodes(topo)
    for qi, s in enumerate(model.sources):
        sel = (f.q == qi) & (val > TOL)
        flow: dict[int, float] = {}
        when: dict[int, float] = {}
        for l, k, v in zip(f.l[sel], f.k[sel], val[sel]):
            flow[int(l)] = flow.get(int(l), 0.0) + float(v)
            when[int(l)] = when.get(int(l), 0.0) + float(v) * float(k)
        start = {l: when[l] / flow[l] for l in flow}
        need = {int(d): float(a) for d, a in enumerate(model.amount[qi]) if a > 0}
        out_links: dict[int, list[int]] = {}
        for l in sorted(flow):
            out_links.setdefault(topo.links[l].src, []).append(l)
        while any(a > TOL for a in need.values()):
            path, links = _walk(topo, int(s), flow, out_links, need, ends)
            if path is None:
                break
            v = min([flow[l] for l in links] + [need[path[-1]]])
            for l in links:
                flow[l] -= v
            need[path[-1]] -= v
            out.setdefault((int(s), path[-1]), []).append((path, v, start[links[0]]))
        for d, a in need.items():  # what the LP left undecomposed goes the best direct way
            if a > 1e-6:
                out.setdefault((int(s), d), []).append((_fallback(topo, int(s), d), a, float(model.horizon)))
    return out if model.sym is None else Symmetric.invert_routes(model.sym, out)


def _walk(topo, s, flow, out_links, need, ends):
    """A path from s to a destination that still needs data, following positive flow (DFS), never
    out of a network switch into the node it entered from (`ends`: network_nodes): the LP's flows
    summed over epochs can pair a chunk's copy into the network with a copy out of it into the same
    node, which the LP's equation pairs with another node's (topology.paths has no round trip, and
    lowering refuses one; what the walk then leaves goes the best direct way)."""
    net, node = ends
    stack = [(s, (s,), ())]
    seen = {s}
    while stack:
        v, path, links = stack.pop()
        if v != s and topo.is_gpu(v) and need.get(v, 0.0) > TOL:
            return path, links
        for l in reversed(out_links.get(v, [])):
            w = topo.links[l].dst
            if flow[l] > TOL and w not in seen and not (net[v] and node[w] == node[path[-2]]):
                seen.add(w)
                stack.append((w, path + (w,), links + (l,)))
    return None, None


def _fallback(topo: Topology, s: int, d: int) -> tuple[int, ...]:
    import networkx as nx
    g = topo.to_networkx()
    return tuple(nx.shortest_path(g, s, d))


def split_hops(topo: Topology, path: tuple[int, ...]) -> list[tuple[int, ...]]:
    """A route through relay GPUs as its GPU-to-GPU transfers."""
    hops, cur = [], [path[0]]
    for v in path[1:]:
        cur.append(v)
        if topo.is_gpu(v):
            hops.append(tuple(cur))
            cur = [v]
    return hops


def largest_remainder(volumes: list[float], total: int) -> list[int]:
    raw = [v / sum(volumes) * total for v in volumes]
    base = [math.floor(x) for x in raw]
    order = sorted(range(len(raw)), key=lambda i: (-(raw[i] - base[i]), i))
    for i in order[: total - sum(base)]:
        base[i] += 1
    return base


def round_schedule(topo: Topology, demand: Demand, route_map, parts: int, started: float, notes) -> Schedule:
    from compiler.planners.baselines import _ListScheduler as ListScheduler
    fine = demand.split(parts)
    by_pair: dict[tuple[int, int], list[int]] = {}
    for c in fine.chunks:
        if c.sources[0] != c.dests[0]:
            by_pair.setdefault((c.sources[0], c.dests[0]), []).append(c.id)
    jobs = []  # (order key, chunk, hops): in the LP's order, sub-chunks of one route spread over its epochs
    n = demand.ngpus
    for (s, d), ids in sorted(by_pair.items()):
        options = route_map.get((s, d)) or [(_fallback(topo, s, d), 1.0, 0.0)]
        counts = largest_remainder([v for _, v, _ in options], len(ids))
        it = iter(ids)
        for (path, _, when), count in zip(options, counts):
            for j in range(count):
                jobs.append(((when, j, (d - s) % n, s), next(it), split_hops(topo, path)))
    jobs.sort(key=lambda j: j[0])
    sched = ListScheduler(topo, fine, expand(topo, fine))
    for _, chunk, hops in jobs:
        for hop in hops:
            sched.add(chunk, hop[0], hop[-1], hop)
    return sched.schedule("lp", started, notes)


@register("lp")
def plan(topo: Topology, demand: Demand, options: PlanOptions) -> Schedule:
    t0 = time.perf_counter()
    try:
        return _plan(topo, demand, options)
    except InfeasibleError as e:
        from compiler.planners.baselines import plan_direct
        from compiler.planners.milp import keep_baseline
        return keep_baseline(e, topo, demand, options, t0, first=plan_direct)


def _plan(topo: Topology, demand: Demand, options: PlanOptions) -> Schedule:
    t0 = time.perf_counter()
    commodity_masks(demand)  # refuses demands with copies early
    bound = bound_for(topo, demand)
    te = fluid_expansion(topo, demand, bound.time_s, options.tau)
    reduced = orbits(topo, demand) if options.symmetry else None  # with multicast too: the LP has no switch copies
    sym = reduced.sym if reduced is not None else None
    k = max(1, epochs_for(bound.bandwidth_s, te.tau), reach_epochs(topo, demand, te))
    cap = options.max_horizon
    tried = []
    model = None
    while True:
        flows = fluid_flows(topo, demand, te, k, sym)
        left = options.left(t0)
        if left <= max(MIN_LEFT_S, SECONDS_PER_FLOW * len(flows)):
            what = f"tried {', '.join(tried)} epochs of {te.tau * 1e6:.4g} us" if tried else \
                f"no horizon tried: {len(flows)} flow variables at {k} epochs, about " \
                f"{SECONDS_PER_FLOW * len(flows):.2g} s, {max(0.0, left):.2g} s left"
            raise InfeasibleError(f"lp: no feasible horizon found within the time limit of {options.time_limit:g} s "
                                  f"({what})")
        m = FluidModel(topo, demand, te, k, sym, flows)
        res = m.solve(left * 0.6, options.verbose, options.deadline)
        tried.append(str(k))
        if not res.has_solution and res.status != "infeasible":
            raise InfeasibleError(f"lp: the LP at {k} epochs stopped without a solution ({res.status}) within "
                                  f"time_limit={options.time_limit:g} s; raise time_limit")
        if options.progress:
            options.progress(f"lp horizon {k} epochs: {'feasible' if res.has_solution else res.status}")
        if res.has_solution:
            model = m
            break
        if cap is not None and k >= cap:
            raise InfeasibleError(f"lp: infeasible within max_horizon={cap} epochs")
        k = k + max(1, k // 8)
        if cap is not None:
            k = min(k, cap)
    lp_value = model.horizon * te.tau
    route_map = routes(model, topo)
    # whole chunks or sub-chunks: finer rounding follows the fluid flow better but pays alpha per
    # piece; keep the rounding that finishes first in the epoch model (under auto, which tries
    # finer chunks itself and judges them with the simulator, whole chunks only)
    options_parts = [1] + ([SUBCHUNKS] if demand.chunks_per_rank * SUBCHUNKS <= 64 and not options.refine else [])
    rounded = [(p, round_schedule(topo, demand, route_map, p, t0, ())) for p in options_parts]
    parts, schedule = min(rounded, key=lambda ps: (ps[1].epochs * ps[1].tau, ps[0]))
    notes = (f"LP: {model.horizon} epochs of {te.tau * 1e6:.4g} us = {lp_value * 1e3:.4g} ms (fluid), "
             f"{len(model.flows)} flow variables; horizons tried {', '.join(tried)}",
             f"rounded to {parts} sub-chunk{'s' if parts > 1 else ''} per chunk and list-scheduled") + \
        ((f"symmetry: solved sources {', '.join(map(str, sym.reps))} and mapped them by {sym.describe()}",) if sym else ())
    schedule = replace(schedule, notes=notes)
    return replace(schedule, lp_value=lp_value, status="rounded", solve_time=time.perf_counter() - t0)
