"""--method auto: run the baselines and the optimiser that suits the demand and its size, judge
every candidate with the simulator, keep the fastest, and say why."""

from __future__ import annotations

import time
from dataclasses import replace

from ..collectives import Demand
from ..errors import CompileError
from ..schedule import Schedule
from ..topology import Topology
from .options import PlanOptions

MILP_MAX_FLOWS = 40_000  # beyond this the exact MILP rarely finishes in a minute on two cores
LP_MAX_FLOWS = 400_000


def estimated_flows(topo: Topology, demand: Demand, symmetry: bool = True) -> int:
    """Rough count of flow variables at the lower-bound horizon (before pruning), after the
    symmetry reduction the planners would apply."""
    from ..bounds import bound_for
    from ..timing import epochs_for, expand
    from .symmetry import chunk_images, find_symmetry
    te = expand(topo, demand)
    k = max(1, epochs_for(bound_for(topo, demand).bandwidth_s, te.tau))
    commodities = len(demand.chunks)
    if not any(len(c.dests) > 1 for c in demand.chunks):
        commodities = len({c.sources for c in demand.chunks})  # the LP aggregates per source
    sym = find_symmetry(topo) if symmetry else None
    if sym is not None and chunk_images(sym, demand) is not None:
        commodities = max(1, commodities // sym.size)
    return commodities * len(topo.links) * k


def candidates(topo: Topology, demand: Demand, options: PlanOptions) -> tuple[list[str], list[str]]:
    """(methods to try, reasons for the ones left out)."""
    plan_demand = demand
    if demand.reduce:
        from .compose import allreduce_phases, dual_demand
        plan_demand = allreduce_phases(demand)[1] if any(len(c.dests) > 1 for c in demand.chunks) else dual_demand(demand)
    copies = any(len(c.dests) > 1 for c in plan_demand.chunks)
    size = estimated_flows(topo, plan_demand, options.symmetry)
    tried, skipped = ["direct", "ring"], []
    if copies:
        if size <= MILP_MAX_FLOWS:
            tried.append("milp")
        else:
            skipped.append(f"milp (about {size} flow variables; above {MILP_MAX_FLOWS})")
            tried.append("rounds")
    else:
        if size <= LP_MAX_FLOWS:
            tried.append("lp")
        else:
            skipped.append(f"lp (about {size} flow variables; above {LP_MAX_FLOWS})")
        if size <= MILP_MAX_FLOWS // 4:
            tried.append("milp")
    return tried, skipped


def plan(topo: Topology, demand: Demand, options: PlanOptions) -> Schedule:
    from . import PLANNERS, plan as plan_with
    from ..simulate import simulate
    t0 = time.perf_counter()
    methods, skipped = candidates(topo, demand, options)
    results: list[tuple[float, str, Schedule]] = []
    failed = []
    for method in methods:
        if method not in PLANNERS:
            skipped.append(f"{method} (not available)")
            continue
        left = options.time_limit - (time.perf_counter() - t0)
        if left <= 1.0 and results:
            skipped.append(f"{method} (time limit reached)")
            continue
        try:
            s = plan_with(topo, demand, replace(options, method=method, time_limit=max(1.0, left)))
        except CompileError as e:
            failed.append(f"{method}: {e}")
            continue
        results.append((simulate(topo, s).finish_time_s, method, s))
    if not results:
        raise CompileError("auto: no planner produced a schedule (" + "; ".join(failed) + ")")
    results.sort(key=lambda r: (r[0], methods.index(r[1])))
    best_time, best_method, best = results[0]
    ranking = ", ".join(f"{m} {t * 1e3:.4g} ms" for t, m, _ in results)
    why = [f"auto chose {best_method}: simulated {ranking}"]
    if skipped:
        why.append("left out: " + "; ".join(skipped))
    if failed:
        why.append("failed: " + "; ".join(failed))
    return replace(best, solve_time=time.perf_counter() - t0, notes=tuple(why) + best.notes)
