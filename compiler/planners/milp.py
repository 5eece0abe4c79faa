"""The exact planner: a time-expanded multi-commodity flow MILP with binary chunk flows
(te-ccl-model.md §3 in linear form, with the fixes of §8: alpha once per transfer, no switch copy
unless the profile marks the switch multicast and the user asks for it, all rounds kept).

The horizon starts at the lower bound and grows (doubling, then bisection) only while the model is
infeasible; the best baseline schedule caps it and warm-starts the solver. The constraint families
are in constraints.py; `build` with a `Start` is also one window of the rounds planner.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace

import cvxpy as cp
import numpy as np

from compiler.analysis.bounds import bound_for
from compiler.model.demand import Demand
from compiler.specs.errors import CompileError, InfeasibleError
from compiler.model.schedule import Schedule, Transfer
from compiler.model.timing import TimeExpansion, epochs_for, expand
from compiler.model.topology import Topology
from compiler.planners.registry import register
from compiler.planners.options import PlanOptions
from compiler.planners.highs import SolveResult, solve
from compiler.planners.symmetry import Symmetry, rep_chunks
from compiler.planners.flows import Flows, distances, link_ends, useful_flows
from compiler.planners.reductions import SYMMETRY, Orbits, Problem
from compiler.planners.constraints import (buffer_equals_previous_plus_arrivals, early_delivery,
                                           every_destination_holds_by_horizon, link_capacity_over_window,
                                           network_sends_a_node_what_other_nodes_sent, send_only_what_is_held,
                                           switch_forwards_what_enters)

MAX_FLOWS = 400_000  # beyond this, building the CVXPY model alone takes minutes
FLOW_PENALTY = 1e-3  # per flow: removes useless transfers, never outweighs one epoch of earliness


@dataclass
class Model:
    """One MILP instance at a fixed horizon: its variables, index arrays and the CVXPY problem."""
    flows: Flows
    horizon: int
    F: cp.Variable
    B: cp.Variable
    b_pos: np.ndarray  # (Q, N, K + 1 + look-ahead) -> column of B, -1 where B is a constant
    held0: np.ndarray  # (Q, N) bool: held at epoch 0 (the sources, or a window's start)
    problem: cp.Problem
    chunk_ids: list[int]  # demand chunk id of each commodity
    sym: Symmetry | None = None
    multicast: bool = False
    landing: np.ndarray | None = None  # (Q, N): epoch a copy sent before the model lands, 0 where none
    upper: np.ndarray | None = None  # (links,): most copies of one commodity a link starts per epoch


@dataclass(frozen=True)
class Start:
    """The state a window of the rounds planner starts from, per commodity of the model (the
    representatives' chunks under a symmetry). A window is the MILP over its epochs with these
    holdings and arrivals, open at the end: flows may land after it (up to the largest arrival
    offset, the look-ahead) and no demand has to be met by its last epoch."""
    held: np.ndarray  # (Q, N) bool: GPUs holding q at the window's epoch 0
    landing: np.ndarray  # (Q, N) int: epoch >= 1 at which a copy of q still in flight lands; 0 where none
    busy: np.ndarray  # (links, horizon) int: capacity per link and epoch taken by earlier windows' flows
    #                   (under a symmetry: on the first link of each orbit, as timexp.occupancy gives it)


def build(topo: Topology, demand: Demand, te: TimeExpansion, horizon: int, multicast: bool,
          relax: bool = False, sym: Symmetry | None = None, start: Start | None = None,
          copies: bool = False) -> Model:
    """The MILP at one horizon. With a symmetry, only the representative's chunks are
    commodities and every link's capacity is shared by the images of all of them.
    With a start, the MILP of one window of the rounds planner (see Start).
    copies: a GPU may send several copies of one chunk through a switch in one epoch (to
    different GPUs, each a unicast transfer costing link capacity): F on a link into a switch is
    an integer up to the link's capacity instead of binary. It matters only where a link carries
    more than one chunk per epoch (an epoch longer than the fastest link's chunk time)."""
    src, dst = demand.masks()
    chunk_ids = list(range(len(demand.chunks)))
    link_images = None
    if sym is not None:
        chunk_ids = rep_chunks(demand, sym.reps)
        src, dst = src[chunk_ids], dst[chunk_ids]
        link_images = sym.link_perms
    Q, N, K = len(chunk_ids), topo.ngpus, horizon
    held, landing, busy, ahead = src, np.zeros(src.shape, dtype=np.int64), None, 0
    if start is not None:
        held, landing, busy, ahead = start.held, start.landing, start.busy, max(te.arrival)
    will = held | (landing > 0)  # never delivered (again) inside the model
    flows = useful_flows(topo, will, dst & ~will, te, horizon, ready=landing, open_end=start is not None)
    l_src, l_dst = link_ends(topo)
    arrival = np.array(te.arrival)
    is_gpu = np.arange(topo.nvertices) < N

    # B(q, g, k) for GPUs that do not hold q at epoch 0 and k = 1..K (+ the look-ahead)
    kb = K + ahead
    b_pos = np.full((Q, N, kb + 1), -1, dtype=np.int64)
    qq, gg = np.nonzero(~held)
    nb = len(qq) * kb
    b_pos[np.repeat(qq, kb), np.repeat(gg, kb), np.tile(np.arange(1, kb + 1), len(qq))] = np.arange(nb)
    nf = len(flows)
    if nf == 0:
        raise InfeasibleError(f"milp: no route can deliver the demand within {horizon} epochs")
    if nf > MAX_FLOWS:
        raise CompileError(f"milp: {nf} flow variables at {horizon} epochs are more than this machine can solve "
                           f"(limit {MAX_FLOWS}); use method='rounds' or 'hier', or fewer chunks per rank "
                           f"(chunks_per_rank={demand.chunks_per_rank})")
    plain = ~is_gpu & ~np.array([False] * N + [multicast and w.multicast for w in topo.switches])
    upper = np.where(copies & plain[l_dst], np.array(te.capacity), 1)  # per link: most copies of q per epoch
    f_ub = upper[flows.l].astype(float)
    if np.all(f_ub == 1):
        F = cp.Variable(nf, name="F", bounds=[0, 1]) if relax else cp.Variable(nf, name="F", boolean=True)
    else:
        F = cp.Variable(nf, name="F", bounds=[np.zeros(nf), f_ub], integer=not relax)
    B = cp.Variable(nb, name="B", bounds=[0, 1]) if nb else None
    cons = []
    cons += buffer_equals_previous_plus_arrivals(flows, b_pos, l_dst, arrival, is_gpu, nf, nb, F, B, landing)
    cons += send_only_what_is_held(flows, b_pos, l_src, is_gpu, held, F, B, f_ub)
    cons += switch_forwards_what_enters(topo, flows, l_src, l_dst, is_gpu, multicast, F)
    cons += network_sends_a_node_what_other_nodes_sent(topo, flows, l_src, l_dst, F)
    cons += link_capacity_over_window(flows, te, K, F, link_images, busy)
    if start is None:
        cons += every_destination_holds_by_horizon(src, dst, b_pos, K, B)
    objective = cp.Minimize(-early_delivery(held, dst, b_pos, kb, nb, B) + FLOW_PENALTY * cp.sum(F))
    return Model(flows, K, F, B, b_pos, held, cp.Problem(objective, cons), chunk_ids, sym, multicast, landing, upper)


# ---- warm start and extraction ------------------------------------------------------------------


def warm_values(model: Model, topo: Topology, transfers) -> dict | None:
    """F and B of transfers planned on the model's time expansion (epochs relative to the model;
    copies still in flight into it land as in the model), or None if they do not fit."""
    f = model.flows
    key = (f.q.astype(np.int64) * len(topo.links) + f.l) * (model.horizon + 1) + f.k
    order = np.argsort(key)
    fval = np.zeros(len(f))
    bval = np.zeros(model.B.size if model.B is not None else 0)
    column = {c: q for q, c in enumerate(model.chunk_ids)}
    last = model.b_pos.shape[2] - 1
    for q, g in zip(*np.nonzero(model.landing if model.landing is not None else [[]])):
        cols = model.b_pos[q, g, model.landing[q, g]:]
        bval[cols[cols >= 0]] = 1.0
    for t in transfers:
        if t.arrive > last or t.start >= model.horizon or t.reduce or t.group >= 0 or t.chunk not in column:
            return None
        q = column[t.chunk]
        for l in topo.path_links(t.path):
            k = (q * len(topo.links) + l) * (model.horizon + 1) + t.start
            pos = np.searchsorted(key, k, sorter=order)
            if pos >= len(key) or key[order[pos]] != k:
                return None
            fval[order[pos]] += 1.0
        cols = model.b_pos[q, t.dst, t.arrive:]
        bval[cols[cols >= 0]] = 1.0
    return {model.F: fval, model.B: bval} if model.B is not None else {model.F: fval}


def extract(model: Model, topo: Topology, te: TimeExpansion) -> list[Transfer]:
    """Follow each flow out of a GPU through the switches it enters in the same epoch."""
    f = model.flows
    count = np.rint(np.maximum(np.asarray(model.F.value), 0)).astype(np.int64)  # copies (F may be an integer)
    on = np.nonzero(count)[0]
    l_src, l_dst = link_ends(topo)
    n = topo.ngpus
    pool: dict[tuple[int, int, int], list[int]] = {}
    starts = []
    for i in on:
        l = int(f.l[i])
        if l_src[l] < n:
            starts += [i] * int(count[i])
        else:
            pool.setdefault((int(f.q[i]), int(l_src[l]), int(f.k[i])), []).extend([l] * int(count[i]))
    for v in pool.values():
        v.sort(reverse=True)
    copy = {topo.ngpus + j for j, s in enumerate(topo.switches) if s.multicast and model.multicast}
    transfers = []
    group = 0
    for i in sorted(starts, key=lambda i: (int(f.k[i]), int(f.q[i]), int(f.l[i]))):
        q, k, l = int(f.q[i]), int(f.k[i]), int(f.l[i])
        routes = _routes(topo, pool, copy, q, k, (int(l_src[l]), int(l_dst[l])))
        g = group if len(routes) > 1 else -1
        group += len(routes) > 1
        for path in routes:
            transfers.append(Transfer(model.chunk_ids[q], path[0], path[-1], path, k,
                                      k + te.path_arrival(topo, path), False, g))
    return _without_round_trips(transfers, topo, te)


def _without_round_trips(transfers: list[Transfer], topo: Topology, te: TimeExpansion) -> list[Transfer]:
    """Copies of one chunk through a network switch in one epoch are paired in the order found;
    where a pairing leaves a node and comes back (network_sends_a_node_what_other_nodes_sent makes
    another pairing exist), swap what follows the switch with a copy from and to other nodes."""
    net = {topo.ngpus + j for j, w in enumerate(topo.switches) if w.kind == "network"}
    through: dict[tuple, list[int]] = {}
    at = lambda t: next((i for i, v in enumerate(t.path) if v in net), None)  # noqa: E731 (the switch's place)
    for n, t in enumerate(transfers):
        w = at(t)
        if w is not None and t.group < 0:
            through.setdefault((t.chunk, t.start, t.path[w]), []).append(n)
    out = list(transfers)
    node = topo.node_of
    for members in through.values():
        for a in members:
            ta = out[a]
            if node(ta.src) != node(ta.dst):
                continue
            b = next((b for b in members if node(out[b].src) != node(ta.src) and node(out[b].dst) != node(ta.src)),
                     None)
            if b is None:
                continue  # lowering refuses it, naming the transfer
            tb = out[b]
            wa, wb = at(ta), at(tb)
            pa, pb = ta.path[:wa] + tb.path[wb:], tb.path[:wb] + ta.path[wa:]
            out[a] = replace(ta, dst=pa[-1], path=pa, arrive=ta.start + te.path_arrival(topo, pa))
            out[b] = replace(tb, dst=pb[-1], path=pb, arrive=tb.start + te.path_arrival(topo, pb))
    return out


def _routes(topo, pool, copy, q, k, path):
    v = path[-1]
    if v < topo.ngpus:
        return [path]
    outs = pool.get((q, v, k), [])
    if not outs:
        return []  # dropped at a switch (cannot happen with conservation equalities)
    take = list(outs) if v in copy else [outs.pop()]
    if v in copy:
        outs.clear()
    result = []
    for l in take:
        result += _routes(topo, pool, copy, q, k, path + (topo.links[l].dst,))
    return result


def prune_useless(transfers: list[Transfer], demand: Demand) -> list[Transfer]:
    """Drop deliveries to ranks that neither need the chunk nor forward it."""
    needed = {(c.id, d) for c in demand.chunks for d in c.dests}
    while True:
        senders = {(t.chunk, t.src) for t in transfers}
        keep = [t for t in transfers if (t.chunk, t.dst) in needed or (t.chunk, t.dst) in senders]
        if len(keep) == len(transfers):
            return keep
        transfers = keep


# ---- the planner ---------------------------------------------------------------------------------


def _baseline(topo, demand, options) -> Schedule | None:
    from compiler.planners.registry import get
    best = None
    for name in ("direct", "ring", "hier"):
        try:
            s = get(name)(topo, demand, options)
        except Exception:  # a baseline that does not apply here is simply not a warm start
            continue
        if best is None or s.epochs < best.epochs:
            best = s
    return best


def fallback_baseline(topo, demand, options) -> Schedule | None:
    """The schedule an optimiser keeps when it finds none in time: the best of _baseline's, else
    `relay` (which plans on any connected topology, where no GPU pair reaches in one transfer
    and no ring runs through them: a line, DGX-1, MI250); None where none applies."""
    best = _baseline(topo, demand, options)
    if best is None:
        from compiler.planners.registry import get
        try:
            best = get("relay")(topo, demand, options)
        except CompileError:
            best = None
    return best


def keep_baseline(error: CompileError, topo, demand, options, t0: float, first=None) -> Schedule:
    """What an optimiser that found no schedule in time (`error`) returns: `first`'s plan where it
    plans (lp: direct), else fallback_baseline's, noted; `error` itself where none plans or the caller
    asked for no fallback (auto: it has other candidates)."""
    if not options.fallback:
        raise error
    base = None
    if first is not None:
        try:
            base = first(topo, demand, options)
        except CompileError:  # some GPUs are more than one transfer apart: relay (or ring) still plans
            pass
    base = base or fallback_baseline(topo, demand, options)
    if base is None:
        raise error
    return replace(base, solve_time=time.perf_counter() - t0).with_notes(f"{error}; kept the {base.planner} baseline")


def search_horizon(topo, demand, te, lower: int, upper: int | None, options: PlanOptions, budget: float,
                   sym: Symmetry | None = None) -> tuple[int, str, dict | None]:
    """Smallest horizon the MILP finds feasible within `budget` seconds: doubling from the lower
    bound (up to options.max_horizon), then bisection. Returns (horizon, how it was chosen,
    solution values of the last feasible probe)."""
    cap, multicast, report, deadline = options.max_horizon, options.multicast, options.progress, options.deadline
    t0 = time.perf_counter()
    infeasible, feasible, values = lower - 1, None, None
    k = lower
    probes = []
    while True:
        if cap is not None and k > cap:
            k = cap
        if upper is not None and k >= upper:
            feasible = upper
            break
        left = budget - (time.perf_counter() - t0)
        if left <= 0.5:
            break
        model = build(topo, demand, te, k, multicast, sym=sym)
        left = budget - (time.perf_counter() - t0)  # building the model took some of it
        if left <= 0.5:
            break
        res = solve(model.problem, time_limit=left, first_feasible=True, label=f"horizon {k}: ", progress=report,
                    deadline=deadline)
        probes.append(f"{k}:{'ok' if res.has_solution else res.status}")
        if report:
            report(f"horizon {k} epochs: {'feasible' if res.has_solution else res.status}")
        if res.has_solution:
            feasible, values = k, {model.F: model.F.value, model.B: model.B.value} if model.B is not None else None
            break
        infeasible = k
        if cap is not None and k >= cap:
            break
        k = 2 * k
    if feasible is None:
        if upper is not None:
            return upper, f"baseline's {upper} epochs (probes: {', '.join(probes)})", None
        raise InfeasibleError(
            f"milp: time_limit={options.time_limit:g} s, max_horizon={cap}: no schedule found within {cap or k} "
            f"epochs ({', '.join(probes) or 'no probe finished'}); raise time_limit or max_horizon")
    # narrowing
    while feasible - infeasible > 1 and budget - (time.perf_counter() - t0) > 0.5:
        mid = (feasible + infeasible) // 2
        model = build(topo, demand, te, mid, multicast, sym=sym)
        if budget - (time.perf_counter() - t0) <= 0.5:
            break
        res = solve(model.problem, time_limit=budget - (time.perf_counter() - t0), first_feasible=True,
                    label=f"horizon {mid}: ", progress=report, deadline=deadline)
        probes.append(f"{mid}:{'ok' if res.has_solution else res.status}")
        if res.has_solution:
            feasible, values = mid, None
        else:
            infeasible = mid
    return feasible, f"from the lower bound {lower} epochs (probes: {', '.join(probes)})", values


@register("milp")
def plan(topo: Topology, demand: Demand, options: PlanOptions) -> Schedule:
    t0 = time.perf_counter()
    te = expand(topo, demand, options.tau)
    bound = bound_for(topo, demand)
    lower = max(1, epochs_for(bound.bandwidth_s, te.tau), _latency_epochs(topo, demand, te))
    cap = options.max_horizon
    if cap is not None and lower > cap:
        raise InfeasibleError(f"max_horizon={cap} epochs is below the lower bound of {lower} epochs "
                              f"(epoch {te.tau * 1e6:.4g} us)")
    return SYMMETRY.plan(Problem(topo, demand, options),
                          lambda reduced: _plan(topo, demand, options, te, lower, t0, reduced))


def _plan(topo, demand, options, te, lower, t0, reduced: Orbits | None = None) -> Schedule:
    """The MILP at the smallest feasible horizon (of the representatives' chunks where `reduced`)."""
    report = options.progress
    sym = reduced.sym if reduced is not None else None
    base = _baseline(topo, demand, options) if options.warm_start and sym is None else None
    fallback = base or (fallback_baseline(topo, demand, options) if options.fallback else None)
    upper = base.epochs if base is not None and abs(base.tau - te.tau) < 1e-15 else None
    budget = options.left(t0)
    try:
        horizon, reason, _ = search_horizon(topo, demand, te, lower, upper, options, budget * 0.4, sym)
    except InfeasibleError as e:
        if fallback is None or not options.fallback:
            raise
        return replace(fallback, solve_time=time.perf_counter() - t0).with_notes(
            f"{e}; kept the {fallback.planner} baseline")
    te = te.with_horizon(horizon, reason)
    model = build(topo, demand, te, horizon, options.multicast, sym=sym)
    warm = warm_values(model, topo, base.transfers) if base is not None and horizon >= base.epochs else None
    left = max(1.0, options.left(t0))
    if report:
        report(f"solving at horizon {horizon} epochs ({len(model.flows)} flow variables, "
               f"{'warm start from ' + base.planner if warm else 'cold start'})")
    res = solve(model.problem, time_limit=left, gap=options.gap, warm=warm, verbose=options.verbose,
                progress=report, label=f"horizon {horizon}: ", deadline=options.deadline)
    if not res.has_solution:
        if base is not None and horizon >= base.epochs or fallback is not None and options.fallback:
            return replace(fallback, solve_time=time.perf_counter() - t0).with_notes(
                f"milp found no solution in {options.time_limit:g} s; kept the {fallback.planner} baseline")
        raise InfeasibleError(f"milp: no solution at horizon {horizon} within time_limit={options.time_limit:g} s "
                              f"({res.status}); raise time_limit")
    transfers = prune_useless(extract(model, topo, te), demand)
    notes = [f"horizon {horizon} epochs of {te.tau * 1e6:.4g} us, {reason}",
             f"{len(model.flows)} flow variables" + (f", warm start from {base.planner}" if warm else "")]
    if reduced is not None:
        transfers, note = SYMMETRY.invert(reduced, topo, te, transfers, model.chunk_ids)
        notes.append(note)
    schedule = Schedule(demand, topo.name, tuple(transfers), te.tau, horizon, "milp", _status(res), res.gap,
                        time.perf_counter() - t0, notes=tuple(notes))
    return schedule.sorted()


def _status(res: SolveResult) -> str:
    if res.status == "optimal":
        return "optimal"
    if res.status in ("time_limit", "interrupted"):
        return "time_limit"
    return "feasible"


def _latency_epochs(topo: Topology, demand: Demand, te: TimeExpansion) -> int:
    """Fewest epochs for the farthest needed delivery (the latency bound in epochs)."""
    dist = distances(topo, te)[1]
    src, dst = demand.masks()
    need = dst & ~src
    worst = 0
    for q in range(len(demand.chunks)):
        for d in np.nonzero(need[q])[0]:
            worst = max(worst, int(dist[src[q], d].min()))
    return worst
