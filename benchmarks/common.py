"""What every benchmark table measures for one case, through compiler.pipeline.compile: ours
(auto), the ring baseline and the bound. `ours` is the emitted program (its time under the
runtime cost model); the schedule's figures stand beside it as planned (the ideal program of the
same protocol) and alpha_beta (the schedule without runtime costs: the model TE-CCL's and TACCL's
published figures use)."""

from __future__ import annotations

import json
import math
import platform
import time

from compiler.analysis.bounds import bound_for
from compiler.analysis.simulate import simulate
from compiler.pipeline import CompileOptions, compile
from compiler.planners import PlanOptions
from compiler.specs.errors import CompileError


def figures(result) -> dict:
    m, t = result.planned, result.timing
    size = result.demand.size_bytes
    out = {"planned_time_s": m.finish_time_s, "planned_algbw_GBps": m.algbw / 1e9, "planned_ratio": m.bound_ratio}
    if t is not None:
        out.update(program_time_s=t.finish_time_s, program_algbw_GBps=size / t.finish_time_s / 1e9,
                   program_ratio=m.lower_bound_s / t.finish_time_s)
    return out


def ours_ring_bound(topo, demand, time_limit: float, xml: bool = True, element_bytes: int = 4) -> dict:
    t0 = time.perf_counter()
    ours = compile(topo, demand, CompileOptions(PlanOptions(method="auto", time_limit=time_limit, refine=True,
                                                            element_bytes=element_bytes), xml=xml))
    wall = time.perf_counter() - t0
    try:
        ring = compile(topo, demand, CompileOptions(PlanOptions(method="ring"), xml=xml))
    except CompileError:  # a ring of many GPUs may need more steps than a thread block holds: no baseline
        ring = None
    bound = bound_for(topo, demand)
    plain = simulate(topo, ours.schedule)
    size = demand.size_bytes
    return {"method": ours.schedule.planner, "chunks": ours.demand.chunks_per_rank, "status": ours.schedule.status,
            "solve_time_s": ours.schedule.solve_time, "wall_s": wall, "time_limit_s": time_limit,
            "proto": ours.program.proto if ours.program else None,
            "instances": ours.realisation.instances if ours.realisation else None,
            "time_s": ours.time_s, "algbw_GBps": size / ours.time_s / 1e9, "bound_ratio": ours.bound_ratio,
            **figures(ours), "alpha_beta_time_s": plain.finish_time_s, "alpha_beta_algbw_GBps": plain.algbw / 1e9,
            "alpha_beta_ratio": plain.bound_ratio,
            "ring_algbw_GBps": size / ring.time_s / 1e9 if ring else math.nan,
            "ring_ratio": ring.bound_ratio if ring else math.nan, "ring": figures(ring) if ring else None, "bound_s": bound.time_s, "bound_algbw_GBps": demand.size_bytes / bound.time_s / 1e9,
            "binding": bound.binding, "notes": list(ours.notes[:2])}


def candidate_label(row: dict) -> str:
    """ours as the tables print it: method/chunks/protocol x instances."""
    return f"{row['method']}/{row['chunks']}ch/{row['proto']}x{row['instances']}"


def save_rows(path: str, rows: list[dict], **meta) -> None:
    """The rows as JSON, after this machine's name and `meta` (time limit, size)."""
    with open(path, "w") as f:
        json.dump({"machine": platform.node(), **meta, "rows": rows}, f, indent=1)
