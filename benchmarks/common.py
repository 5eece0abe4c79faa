"""What every benchmark table measures for one case: ours (auto), the ring baseline, the bound."""

from __future__ import annotations

import time

from compiler.analysis.bounds import bound_for
from compiler.planners import PlanOptions, plan
from compiler.analysis.simulate import simulate


def ours_ring_bound(topo, demand, time_limit: float) -> dict:
    t0 = time.perf_counter()
    ours = plan(topo, demand, PlanOptions(method="auto", time_limit=time_limit, refine=True))
    solve = time.perf_counter() - t0
    m = simulate(topo, ours)
    ring = simulate(topo, plan(topo, demand, PlanOptions(method="ring")))
    bound = bound_for(topo, demand)
    return {"method": ours.planner, "chunks": ours.demand.chunks_per_rank, "status": ours.status,
            "solve_time_s": solve, "time_s": m.finish_time_s, "algbw_GBps": m.algbw / 1e9,
            "bound_ratio": m.bound_ratio, "ring_algbw_GBps": ring.algbw / 1e9, "ring_ratio": ring.bound_ratio,
            "bound_s": bound.time_s, "bound_algbw_GBps": demand.size_bytes / bound.time_s / 1e9,
            "binding": bound.binding, "notes": list(ours.notes[:2])}
