"""Planners: plan(topology, demand, options) -> Schedule, one module each, chosen by name.

`plan` dispatches: reductions are planned natively by planners that know them (the baselines); for
the others it composes the reductions of reductions.py: the time reverse of the copy dual, and
allreduce as reduce-scatter then allgather (each phase planned through `plan` again).
"""

from __future__ import annotations

import time
from dataclasses import replace
from typing import Callable

from compiler.model.demand import Demand, moves_nothing
from compiler.specs.errors import CompileError
from compiler.model.schedule import Schedule
from compiler.model.topology import Topology
from compiler.planners.options import PlanOptions

Planner = Callable[[Topology, Demand, PlanOptions], Schedule]
PLANNERS: dict[str, Planner] = {}
NATIVE_REDUCTIONS = {"ring", "direct", "relay", "oneshot", "swap"}  # planners that plan reduce transfers themselves
METHODS = ("auto", "milp", "lp", "rounds", "ring", "direct", "relay", "oneshot", "hier", "swap", "trees")


def register(name: str):
    def wrap(fn: Planner) -> Planner:
        PLANNERS.setdefault(name, fn)  # a planner put in place before its module loads (a test's) stays
        return fn
    return wrap


MODULES = {"milp": "milp", "lp": "lp", "rounds": "rounds", "ring": "baselines", "direct": "baselines", "relay": "baselines",
           "oneshot": "baselines",
           "hier": "hierarchical", "swap": "hierarchical", "trees": "trees"}  # where each planner lives: only the one asked for is imported (cvxpy is slow)
META = {"auto": "auto"}  # planners of planners: they import this registry, never the other way round


def get(name: str) -> Planner:
    if name in META:
        import importlib
        return importlib.import_module(f"compiler.planners.{META[name]}").plan
    if name not in MODULES:
        raise CompileError(f"method={name!r} is not a planner (known: {', '.join(METHODS)})")
    if name not in PLANNERS:
        import importlib
        importlib.import_module(f"compiler.planners.{MODULES[name]}")  # importing a planner module registers it
    return PLANNERS[name]


def nothing_to_move(topo: Topology, demand: Demand, method: str) -> Schedule:
    from compiler.model.timing import choose_tau
    return Schedule(demand, topo.name, (), choose_tau(topo, demand.chunk_bytes), 0, method, "optimal",
                    notes=(f"{demand.collective}: no chunk has to move",))


def plan(topo: Topology, demand: Demand, options: PlanOptions) -> Schedule:
    """Plan `demand` with options.method, handling reductions for planners that only move copies.
    The plan returns by options.deadline, or time_limit seconds from now where none is set."""
    if options.deadline is None:
        options = replace(options, deadline=time.perf_counter() + options.time_limit)
    planner = get(options.method)
    if moves_nothing(demand):
        return nothing_to_move(topo, demand, options.method)
    if not demand.reduce or options.method in NATIVE_REDUCTIONS or options.method == "auto":
        return planner(topo, demand, options)
    from compiler.planners.reductions import Problem, for_reduction, plan_via
    return plan_via(for_reduction(demand), Problem(topo, demand, options),
                    lambda p: plan(p.topology, p.demand, p.options))


__all__ = ["PlanOptions", "Planner", "PLANNERS", "METHODS", "register", "get", "plan"]
