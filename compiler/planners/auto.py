"""--method auto: run the baselines and the optimiser that suits the demand and its size, judge
every candidate with the simulator, keep the fastest, and say why."""

from __future__ import annotations

import time
from dataclasses import replace

from compiler.model.demand import Demand
from compiler.specs.errors import CompileError
from compiler.model.schedule import Schedule
from compiler.model.topology import Topology
from compiler.planners.options import PlanOptions

MILP_MAX_FLOWS = 40_000  # beyond this the exact MILP rarely finishes in a minute on two cores
LP_MAX_FLOWS = 400_000


def estimated_flows(topo: Topology, demand: Demand, symmetry: bool = True, per_source: bool = True) -> int:
    """Rough count of flow variables at the lower-bound horizon (before pruning), after the
    symmetry reduction the planners would apply. per_source: the LP's commodities (one per source
    for demands without copies); otherwise the MILP's (one per chunk)."""
    from compiler.analysis.bounds import bound_for
    from compiler.model.timing import epochs_for, expand
    from compiler.planners.reductions import orbits
    te = expand(topo, demand)
    k = max(1, epochs_for(bound_for(topo, demand).bandwidth_s, te.tau))
    commodities = len(demand.chunks)
    if per_source and not any(len(c.dests) > 1 for c in demand.chunks):
        commodities = len({c.sources for c in demand.chunks})
    reduced = orbits(topo, demand) if symmetry else None
    if reduced is not None:
        commodities = max(1, commodities // reduced.sym.size)
    return commodities * len(topo.links) * k


def candidates(topo: Topology, demand: Demand, options: PlanOptions) -> tuple[list[str], list[str]]:
    """(methods to try, reasons for the ones left out)."""
    from compiler.planners.reductions import copy_demand
    plan_demand = copy_demand(demand)
    copies = any(len(c.dests) > 1 for c in plan_demand.chunks)
    size = estimated_flows(topo, plan_demand, options.symmetry)
    tried, skipped = ["direct", "ring"], []
    if copies and topo.nodes > 1:
        tried.append("hier")
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
        exact = estimated_flows(topo, plan_demand, options.symmetry, per_source=False)
        if exact <= MILP_MAX_FLOWS // 4:
            tried.append("milp")
        else:
            skipped.append(f"milp (about {exact} flow variables; above {MILP_MAX_FLOWS // 4} for a copy-free demand)")
    return tried, skipped


REFINEMENTS = (1, 2, 4, 8)  # sub-chunks per chunk tried when the user did not fix --chunks
FIRST_SHARE = 0.6  # of the time limit for the optimiser on whole chunks
GOOD_ENOUGH = 0.995  # of the lower bound: no finer chunking can pay
BUDGET = 0.9  # of the time limit for planning: simulating and judging the candidates takes the rest


def plan(topo: Topology, demand: Demand, options: PlanOptions) -> Schedule:
    """Every (chunking, method) candidate within the time limit, judged by the simulator. With
    options.refine, chunks are also cut into 2, 4 and 8 sub-chunks (pipelining and finer epochs
    often pay; the simulator decides), the optimisers' share of time divided among them."""
    from compiler.planners.registry import MODULES, plan as plan_with
    from compiler.planners.reductions import Problem, Refine
    from compiler.analysis.simulate import simulate
    t0 = time.perf_counter()
    deadline = t0 + options.time_limit * BUDGET
    if options.deadline is not None:
        deadline = min(deadline, t0 + (options.deadline - t0) * BUDGET)
    refinements = REFINEMENTS if options.refine else (1,)
    results: list[tuple[float, int, str, Schedule, float]] = []
    failed, skipped = [], []
    for n, parts in enumerate(refinements):
        if results and max(r[4] for r in results) >= GOOD_ENOUGH:
            skipped.append(f"finer chunks (already {max(r[4] for r in results):.3f} of the bound)")
            break
        refine = Refine(parts)
        (fine,), inverse = refine.apply(Problem(topo, demand, options))
        d = fine.demand
        if d.chunk_bytes % options.element_bytes:
            skipped.append(f"{parts}x finer chunks ({d.chunk_bytes:g} B is not whole {options.element_bytes}-byte "
                           "elements)")
            break
        methods, left_out = candidates(topo, d, options)
        if parts > 1:
            methods = [m for m in methods if m not in ("direct",)] if d.chunks_per_rank > 1 else methods
            if not any(m in ("milp", "lp", "rounds") for m in methods):
                methods = [m for m in methods if m == "ring"]
        skipped += [f"{x} at {parts}x" for x in left_out] if parts > 1 else left_out
        for method in methods:
            if method not in MODULES:
                skipped.append(f"{method} (not available)")
                continue
            if results and max(r[4] for r in results) >= GOOD_ENOUGH:
                skipped.append(f"{method} at {parts}x (a candidate already reaches {max(r[4] for r in results):.3f} "
                               "of the bound)")
                continue
            left = deadline - time.perf_counter()
            if left <= 1.0 and results:
                skipped.append(f"{method} at {parts}x (time limit reached)")
                continue
            # the whole chunks get most of the time: they are the cheapest model and often enough
            share = (left * FIRST_SHARE if n == 0 else left / (len(refinements) - n)) \
                if method in ("milp", "lp", "rounds") and len(refinements) > 1 else left
            try:
                s = refine.invert((plan_with(topo, d, replace(options, method=method, time_limit=max(1.0, share),
                                                              deadline=deadline, fallback=False)),), inverse)
            except CompileError as e:
                failed.append(f"{method} at {parts}x: {e}")
                if method == "milp" and "lp" not in methods and "rounds" not in methods:
                    methods.append("rounds")  # the exact model was too big for its share: solve it in windows
                continue
            m = simulate(topo, s)
            results.append((m.finish_time_s, parts, method, s, m.bound_ratio))
    if not results:
        raise CompileError("auto: no planner produced a schedule (" + "; ".join(failed) + ")")
    results.sort(key=lambda r: (r[0], r[1], r[2]))
    _, best_parts, best_method, best, _ = results[0]
    label = lambda parts, m: m if len(refinements) == 1 else f"{m}/{demand.chunks_per_rank * parts}ch"
    ranking = ", ".join(f"{label(p, m)} {t * 1e3:.4g} ms" for t, p, m, _, _ in results[:6])
    chosen = best_method if len(refinements) == 1 else \
        f"{best_method} with {demand.chunks_per_rank * best_parts} chunk(s) per rank"
    why = [f"auto chose {chosen}: simulated {ranking}" + (", ..." if len(results) > 6 else "")]
    if skipped:
        why.append("left out: " + "; ".join(skipped))
    if failed:
        why.append("failed: " + "; ".join(failed[:4]) + (" ..." if len(failed) > 4 else ""))
    return replace(best, solve_time=time.perf_counter() - t0, notes=tuple(why) + best.notes)
