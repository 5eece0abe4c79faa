"""Re-planning a saved schedule when the cluster changes: a link fails or slows, or the size changes.

    replan(old_schedule, changed_topology, ReplanOptions) -> Replanned

The method, a repair that starts from the old schedule (its warm start):
1. `repair`: the old transfers replayed in their order on the changed topology with the epoch-model
   list scheduler (compiler/planners/baselines.ListScheduler, so a degraded link's window grows and
   nothing carries more than its new capacity). A transfer whose route still exists, avoids the
   changed link and whose source still holds the chunk is kept as it was; for one that does not,
   its delivery is routed anew right there (`route`), along the route that delivers it first given
   everything placed so far: one transfer from any rank holding the chunk, or two through a relay
   GPU (a relay chain where nothing shorter exists). Deliveries still missing are routed last.
   Variants: without relays; keeping a slowed link's share of its old load on it; appending
   re-routed sends after the old sends of their lane (a program sends on a link in schedule order);
2. where the exact model is small enough, the MILP is solved at the repaired horizon, warm-started
   from the repair (`milp_polish`);
3. the candidates (the repairs, the MILP's, and the old schedule itself where it still runs: a
   slowed link breaks nothing) are judged by the programs they would become, as the compile
   pipeline's `auto` judges its own (`judge`): each is lowered once (a probe), then the best
   probe's program search (compiler/realise.py: protocol and instances, where `auto`) runs with the
   time left, the others' with what it leaves, and the fastest program wins; its realisation is
   kept (`Replanned.realisation`) so that the program written is the one judged, within the limit.
Reductions (whose partial sums a dropped transfer would corrupt downstream) are planned afresh.

A change that leaves some needed (source, destination) pair with no chain of transfers between them
is refused, naming the pair (`check_connected`).
"""

from __future__ import annotations

import heapq
import time
from dataclasses import dataclass, replace

from compiler.lowering.lower import LowerOptions
from compiler.model.demand import Demand
from compiler.model.linknames import disconnected_pair
from compiler.model.program import AUTO
from compiler.model.schedule import Schedule
from compiler.model.timing import expand
from compiler.model.topology import Topology
from compiler.planners.baselines import ListScheduler
from compiler.realise import Realisation
from compiler.specs.errors import CompileError
from compiler.specs.runtimes import ALL

WARM_MILP_MAX_FLOWS = 40_000  # the MILP polish is tried only below this many flow variables
POLISH_SHARE = 0.5  # of the time left, for the MILP polish (the candidates are realised as programs after it)
JUDGE_SHARE = 0.92  # of the time limit by which the last candidate is realised (as the pipeline's JUDGE_SHARE:
# verifying and writing the chosen program take the rest)
NOT_JUDGED = "not judged"  # a candidate whose ideal program cannot beat a realised one (judge)
RELAY_SOURCES = 2  # holders (the first to hold a chunk) from which routes through a relay are tried


@dataclass(frozen=True)
class ReplanOptions:
    changed: frozenset[tuple[int, int]] = frozenset()  # (src, dst) vertex pairs of the failed or degraded links
    what: str = ""  # the change as the user typed it, for messages
    field: str = "fail_link"  # the option that made the change (errors name it)
    size: int | None = None  # a new size (bytes), or None
    time_limit: float = 20.0
    milp: bool = True  # try the warm-started MILP polish where the model is small
    # how candidates are lowered to be timed as programs: protocol and instances auto (searched, as
    # compile_schedule does) unless fixed
    lowering: LowerOptions = LowerOptions(proto=AUTO, instances=0)
    fraction: float | None = None  # a degraded link's share of bandwidth left
    runtime: str = ALL  # the runtimes the program is written for (compile_schedule's `runtime`)


@dataclass(frozen=True)
class Replanned:
    schedule: Schedule
    kept: int  # old transfers kept as they were
    dropped: int  # old transfers dropped (their route changed, or what they relayed was dropped)
    rerouted: int  # deliveries routed anew
    replan_time_s: float
    notes: tuple[str, ...] = ()
    label: str = "repair"  # which candidate it is
    realisation: Realisation | None = None  # its program as judged (hand it to compile_schedule), where judged
    judged: tuple[tuple[str, float | None, str | None], ...] = ()  # every candidate's (label, program time or
    # None, why it could not be lowered or None)


def resized(demand: Demand, size: int | None) -> Demand:
    if size is None or size == demand.size_bytes:
        return demand
    return replace(demand, size_bytes=size, chunk_bytes=demand.chunk_bytes * size / demand.size_bytes)


def check_connected(topo: Topology, demand: Demand, options: ReplanOptions) -> None:
    """Refuse a change after which some rank cannot get a chunk it needs (or a contribution)."""
    if demand.reduce:
        needs = [((s,), d) for c in demand.chunks for s in c.sources for d in c.dests if s != d]
    else:
        needs = [(c.sources, d) for c in demand.chunks for d in c.dests if d not in c.sources]
    pair = disconnected_pair(topo, needs)
    if pair is not None:
        s, d = pair
        raise CompileError(f"{options.field}={options.what}: disconnects rank {s} from rank {d}, which needs its "
                           f"data ({demand.collective}); no schedule can exist on the changed topology")


def _one_hop(ls: ListScheduler, topo: Topology, src: int, dst: int, ready: int, tails: dict | None = None):
    """(arrival epoch, start epoch, path) of the earliest one-transfer route src -> dst, or None
    (with `tails`, no earlier than the epoch after the last kept transfer on its first link)."""
    best = None
    for p in topo.paths(src, dst):
        links = topo.path_links(p)
        k = ls._earliest(links, ready if tails is None else max(ready, tails.get(links[0], -1) + 1))
        cand = (k + ls.te.arrival[links[-1]], k, p)
        if best is None or cand[:2] < best[:2]:
            best = cand
    return best


def _candidates(ls: ListScheduler, topo: Topology, chunk: int, dst: int, relays: int,
                tails: dict | None = None) -> list[tuple]:
    """Routes into dst, as (arrival epoch, transfers, [(src, dst, path), ...]): one transfer from
    each rank holding the chunk, and two through a relay GPU (from the `relays` holders that hold
    it first): a one-transfer route may be stuck behind a slow or busy link that a relay avoids."""
    holders = sorted((ls.ready[(chunk, r)], r) for r in range(topo.ngpus) if (chunk, r) in ls.ready and r != dst)
    out = []
    for ready, r in holders:
        hop = _one_hop(ls, topo, r, dst, ready, tails)
        if hop is not None:
            out.append((hop[0], 1, [(r, dst, hop[2])]))
    held = {r for _, r in holders}
    for ready, r in holders[:relays]:
        for relay in topo.neighbours(r):
            if relay in held or relay == dst or dst not in topo.neighbours(relay):
                continue
            first = _one_hop(ls, topo, r, relay, ready, tails)
            if first is None:
                continue
            second = _one_hop(ls, topo, relay, dst, first[0], tails)
            if second is not None:
                out.append((second[0], 2, [(r, relay, first[2]), (relay, dst, second[2])]))
    out.sort(key=lambda c: (c[0], c[1]))
    return out


def _relay_route(ls: ListScheduler, topo: Topology, chunk: int, dst: int) -> list[tuple[int, int, tuple]] | None:
    """Earliest-arrival chain of transfers to dst through relaying GPUs (Dijkstra over arrival
    epochs, links judged as they are now): [(src, dst, path), ...], or None."""
    te = ls.te
    best = {r: ls.ready[(chunk, r)] for r in range(topo.ngpus) if (chunk, r) in ls.ready}
    prev: dict[int, tuple[int, tuple]] = {}
    heap = [(e, r) for r, e in best.items()]
    heapq.heapify(heap)
    while heap:
        e, u = heapq.heappop(heap)
        if e > best.get(u, float("inf")):
            continue
        if u == dst:
            break
        for v in topo.neighbours(u):
            for p in topo.paths(u, v):
                links = topo.path_links(p)
                arrive = ls._earliest(links, e) + te.arrival[links[-1]]
                if arrive < best.get(v, float("inf")):
                    best[v], prev[v] = arrive, (u, p)
                    heapq.heappush(heap, (arrive, v))
    if dst not in prev:
        return None
    hops, v = [], dst
    while v in prev:
        u, p = prev[v]
        hops.append((u, v, p))
        v = u
    return hops[::-1]


def _add_after(ls: ListScheduler, topo: Topology, chunk: int, a: int, b: int, path, tails: dict | None) -> None:
    """ls.add, no earlier than `tails` allows on the path's first link."""
    held = ls.ready[(chunk, a)]
    if tails is not None:
        ls.ready[(chunk, a)] = max(held, tails.get(topo.link_id(path[0], path[1]), -1) + 1)
    try:
        ls.add(chunk, a, b, path)
    finally:
        ls.ready[(chunk, a)] = held


def route(ls: ListScheduler, topo: Topology, chunk: int, dst: int, relays: int, tails: dict | None = None) -> None:
    """Deliver chunk to dst along the route that delivers it first, given everything placed so far:
    one transfer from a rank that holds it, else a relay chain."""
    options = _candidates(ls, topo, chunk, dst, relays, tails)
    if options:
        for a, b, p in options[0][2]:
            _add_after(ls, topo, chunk, a, b, p, tails)
        return
    hops = _relay_route(ls, topo, chunk, dst)
    if hops is None:
        raise CompileError(f"replan: chunk {chunk} cannot reach rank {dst} on {topo.name}")
    for a, b, p in hops:
        if (chunk, b) not in ls.ready:
            ls.add(chunk, a, b, p)


def repair(old: Schedule, topo: Topology, demand: Demand, options: ReplanOptions, t0: float,
           relays: int = RELAY_SOURCES, keep_share: float = 0.0, append: bool = False) -> Replanned:
    """The old schedule replayed in its order on the changed topology (steps 1-3 of the module
    docstring): a transfer that still holds is list-scheduled as it was; one that does not (its
    route is gone or crosses a changed link, or its source no longer holds the chunk) has its
    delivery routed anew at that point, so re-routed and kept transfers share the links in the
    old schedule's time order; deliveries still missing at the end are routed last.
    keep_share: of the transfers over a degraded link, this first share (in the old order) stays on
    it (a link at half its bandwidth can still carry about half its old load in the old time).
    append: a re-routed send goes after the old schedule's sends on its first link: a program sends
    on an outgoing link in schedule order, so a re-routed send slotted early into a lane would hold
    up every later send there if its data came late."""
    te = expand(topo, demand, tau=old.tau if demand.chunk_bytes == old.demand.chunk_bytes else None)
    ls = ListScheduler(topo, demand, te)
    kept = rerouted = 0
    over = [t for t in old.transfers if any((a, b) in options.changed and topo.has_link(a, b)
                                            for a, b in zip(t.path, t.path[1:]))]
    stay = {id(t) for t in over[:int(len(over) * keep_share)]}
    tails: dict[int, int] | None = None
    if append:
        tails = {}
        for t in old.transfers:
            first = topo.link_id(t.path[0], t.path[1]) if topo.has_link(t.path[0], t.path[1]) else None
            if first is not None:
                tails[first] = max(tails.get(first, -1), t.start)
    for t in old.transfers:
        hops = list(zip(t.path, t.path[1:]))
        holds = (t.chunk, t.src) in ls.ready
        if holds and all(topo.has_link(a, b) and ((a, b) not in options.changed or id(t) in stay) for a, b in hops):
            if (t.chunk, t.dst) not in ls.ready or demand.reduce:
                ls.add(t.chunk, t.src, t.dst, t.path, t.reduce)
                kept += 1
        elif (t.chunk, t.dst) not in ls.ready:
            route(ls, topo, t.chunk, t.dst, relays, tails)
            rerouted += 1
    for c in demand.chunks:
        for d in c.dests:
            if d not in c.sources and (c.id, d) not in ls.ready:
                route(ls, topo, c.id, d, relays, tails)
                rerouted += 1
    note = (f"replan: kept {kept} of {len(old.transfers)} transfers of the {old.planner} schedule, "
            f"routed {rerouted} deliveries anew" + (" (relays allowed)" if relays else " (one transfer each)"))
    schedule = ls.schedule("replan", t0, (note,))
    label = ("repair with relays" if relays else "repair, one transfer per delivery") + \
        (f", {keep_share:.0%} kept on the slowed link" if keep_share else "") + (", appended" if append else "")
    return Replanned(schedule, kept, len(old.transfers) - kept, rerouted, time.perf_counter() - t0, (note,), label)


def milp_polish(topo: Topology, repaired: Replanned, options: ReplanOptions, t0: float) -> tuple[Replanned | None, str]:
    """The MILP at the repaired horizon, warm-started from the repaired schedule, where the model
    is small enough (a candidate, or None), and a note on what happened."""
    s = repaired.schedule
    flows = len(s.demand.chunks) * len(topo.links) * max(1, s.epochs)
    if not options.milp or flows > WARM_MILP_MAX_FLOWS:
        return None, f"replan: MILP polish skipped (about {flows} flow variables; above {WARM_MILP_MAX_FLOWS})"
    from compiler.planners.highs import solve
    from compiler.planners.milp import build, extract, prune_useless, warm_values
    te = expand(topo, s.demand, tau=s.tau).with_horizon(s.epochs, "the repaired schedule's horizon")
    try:
        model = build(topo, s.demand, te, s.epochs, False)
    except CompileError as e:
        return None, f"replan: MILP polish skipped ({e})"
    warm = warm_values(model, topo, s.transfers)
    left = (options.time_limit - (time.perf_counter() - t0)) * POLISH_SHARE
    if left < 0.5:
        return None, "replan: no time left for the MILP polish"
    res = solve(model.problem, time_limit=left, warm=warm)
    if not res.has_solution:
        return None, f"replan: MILP polish found nothing in {left:.1f} s ({res.status})"
    transfers = prune_useless(extract(model, topo, te), s.demand)
    how = "warm-started from the repair" if warm else "cold: the repair did not fit as a start"
    note = f"replan: MILP at the repair's {s.epochs} epochs, {how} ({res.status})"
    polished = Schedule(s.demand, topo.name, tuple(transfers), s.tau, s.epochs, "replan", "feasible", res.gap,
                        time.perf_counter() - t0, notes=(note,)).sorted()
    return Replanned(polished, repaired.kept, repaired.dropped, repaired.rerouted, time.perf_counter() - t0, (note,),
                     "MILP warm-started from the repair"), note


def realised(topo: Topology, schedule: Schedule, options: ReplanOptions, deadline: float | None = None,
             finish_by: float | None = None) -> tuple[Realisation | None, str | None]:
    """The program `schedule` would become, as compile_schedule realises it (the judge of candidates, as
    for the pipeline's `auto`: protocol and instances searched where `auto`), realised by `deadline`;
    or (None, why) where no program fits the runtimes."""
    from compiler.planners import PlanOptions
    from compiler.pipeline import STALL, enough_time
    from compiler.planners.background import workers
    from compiler.realise import realise
    plan = PlanOptions()  # compile_schedule's defaults, as the replan command writes its program with them
    try:
        return realise(schedule, topo, options.lowering, options.runtime, deadline,
                       enough_time(topo, schedule, plan.good_enough), plan.element_bytes, workers(plan.workers),
                       STALL, finish_by), None
    except CompileError as e:
        return None, str(e)


def candidates(old: Schedule, topo: Topology, demand: Demand, options: ReplanOptions, t0: float) -> list[Replanned]:
    """The repairs (with and without relays), the MILP polish where small, and the old schedule
    itself where it still runs unchanged (a slowed link breaks nothing; a re-route may not pay)."""
    shares = (0.0,) if options.fraction is None else (0.0, options.fraction)  # a slowed link keeps its share
    out = [repair(old, topo, demand, options, t0, relays, share, append)
           for append in (False, True) for share in shares for relays in (RELAY_SOURCES, 0)]
    polished, note = milp_polish(topo, out[0], options, t0)
    out[0] = replace(out[0], notes=out[0].notes + (note,))
    if polished is not None:
        out.append(polished)
    if demand == old.demand and all(all(topo.has_link(a, b) for a, b in zip(t.path, t.path[1:]))
                                    for t in old.transfers):
        note = "replan: the old schedule, unchanged (it still runs on the changed topology)"
        out.append(Replanned(replace(old, topology=topo.name, planner="replan", notes=(note,)),
                             len(old.transfers), 0, 0, time.perf_counter() - t0, (note,), "the old schedule unchanged"))
    return out


def replan(old: Schedule, topo: Topology, options: ReplanOptions = ReplanOptions()) -> Replanned:
    """The old schedule repaired for the changed topology (see the module docstring): of the
    candidates, the one whose program the program timer finds fastest."""
    t0 = time.perf_counter()
    demand = resized(old.demand, options.size)
    if demand.ngpus != topo.ngpus:
        raise CompileError(f"replan: the schedule is for {demand.ngpus} GPUs, {topo.name} has {topo.ngpus}")
    check_connected(topo, demand, options)
    if demand.reduce or any(t.group >= 0 for t in old.transfers):
        return afresh(old, topo, demand, options, t0)
    judged = judge(topo, candidates(old, topo, demand, options, t0), options, t0)
    usable = [(r, c) for r, _, c in judged if r is not None] or [(None, judged[0][2])]
    realisation, best = min(usable, key=lambda x: x[0].timing.finish_time_s if x[0] is not None else 0.0)
    ranking = ", ".join(f"{c.label} {r.timing.finish_time_s * 1e3:.4g} ms" if r is not None
                        else f"{c.label} ({e})" if e.startswith(NOT_JUDGED) else f"{c.label} (not lowerable)"
                        for r, e, c in judged)
    note = f"replan: chose {best.label} by program time ({ranking})"
    why = tuple(dict.fromkeys(f"replan: {c.label} is not lowerable ({e})" for r, e, c in judged
                              if r is None and not e.startswith(NOT_JUDGED)))
    notes = tuple(dict.fromkeys(best.schedule.notes + best.notes + (note,) + why))
    schedule = replace(best.schedule, solve_time=time.perf_counter() - t0, notes=notes)
    return replace(best, schedule=schedule, replan_time_s=time.perf_counter() - t0, notes=notes,
                   realisation=realisation,
                   judged=tuple((c.label, r.timing.finish_time_s if r is not None else None, e) for r, e, c in judged))


def judge(topo: Topology, cands: list[Replanned], options: ReplanOptions, t0: float) \
        -> list[tuple[Realisation | None, str | None, Replanned]]:
    """(realisation or None, why not or None, candidate) per candidate, in order, as auto judges its
    candidates: the distinct schedules are probed (one lowering each: pipeline._probe), fastest ideal
    program first (the schedule simulator's), then realised best probe first, the first with the time
    left until JUDGE_SHARE of the limit and the others with what its search leaves (it ends once it
    stalls), shared; one whose ideal program, times BEYOND, is no faster than a probe or program
    already found is neither. Where the repairs are alike, their searches are: DGX-2 x 2 allgather
    1 GB with 3-nvswitch failed, four repairs of one ideal program (80.2 ms), each searched for a
    quarter of the time, ended within 5 % of their probes (85.5-92.4 ms). The chosen program is to be
    verified and written by FINISH_BY of the limit (realise's finish_by). Candidates with the same
    transfers share one realisation."""
    from compiler.analysis.links import protocol_names
    from compiler.analysis.simulate import best_ideal, simulate
    from compiler.planners.auto import BEYOND
    from compiler.pipeline import FINISH_BY, CompileOptions, _probe
    end = t0 + options.time_limit * JUDGE_SHARE
    finish_by = t0 + options.time_limit * FINISH_BY
    keys = [(c.schedule.demand, c.schedule.planner, c.schedule.transfers) for c in cands]
    first: dict[tuple, Replanned] = {}  # each distinct schedule's first candidate, in the candidates' order
    for c, key in zip(cands, keys):
        first.setdefault(key, c)
    proto = options.lowering.proto
    probing = CompileOptions(lower=options.lowering, runtime=options.runtime)

    def ideal_s(c: Replanned) -> float:
        s = c.schedule
        return (best_ideal(topo, s, protocol_names(topo)) if proto == AUTO else simulate(topo, s, proto)).finish_time_s
    ideal = {key: ideal_s(c) for key, c in first.items()}
    done: dict[tuple, tuple[Realisation | None, str | None]] = {}
    probes: dict[tuple, float] = {}
    for key in sorted(first, key=lambda k: ideal[k]):  # stable: the candidates' order on ties
        if probes and BEYOND * ideal[key] >= min(probes.values()):
            done[key] = (None, f"{NOT_JUDGED}: ideal program {ideal[key] * 1e3:.4g} ms")
            continue
        try:
            probes[key] = _probe(first[key].schedule, topo, probing)
        except CompileError:
            probes[key] = float("inf")  # its plain placement does not fit: realise may find one that does
    order = sorted(probes, key=lambda k: probes[k])
    for n, key in enumerate(order):
        best = min((r.timing.finish_time_s for r, _ in done.values() if r is not None), default=None)
        if best is not None and BEYOND * ideal[key] >= best:
            done[key] = (None, f"{NOT_JUDGED}: ideal program {ideal[key] * 1e3:.4g} ms")
            continue
        now = time.perf_counter()
        if best is not None and now >= end:  # the searches before used the time: its probe stands for it
            done[key] = (None, f"{NOT_JUDGED}: the time limit came first; probe {probes[key] * 1e3:.4g} ms")
            continue
        share = max(0.0, end - now) / (1 if n == 0 else len(order) - n)
        done[key] = realised(topo, first[key].schedule, options, now + share, finish_by)
    return [(*done[key], c) for c, key in zip(cands, keys)]


def afresh(old: Schedule, topo: Topology, demand: Demand, options: ReplanOptions, t0: float) -> Replanned:
    """Reductions (and multicast schedules) are planned anew with the old schedule's planner, or with auto
    where that planner cannot plan on the changed topology."""
    from compiler.planners import PlanOptions, plan
    from compiler.planners.registry import METHODS
    method = old.planner if old.planner in METHODS else "auto"
    fallback = ""
    try:
        s = plan(topo, demand, PlanOptions(method=method, time_limit=options.time_limit))
    except CompileError as e:  # the old planner cannot plan on the changed topology (check_connected found that
        # some schedule can: hier and direct need one-transfer paths a failed link may have cut), so auto plans
        if method == "auto":
            raise
        fallback = f"; {method} could not plan it ({e})"
        method = "auto"
        s = plan(topo, demand, PlanOptions(method=method, time_limit=max(0.0, options.time_limit
                                                                        - (time.perf_counter() - t0))))
    note = (f"replan: {demand.collective} reduces partial sums along its routes, so it was planned anew with "
            f"{method} (nothing of the old schedule kept){fallback}")
    s = replace(s, notes=s.notes + (note,))
    return Replanned(s, 0, len(old.transfers), len(demand.needs()), time.perf_counter() - t0, (note,), "afresh")
