"""Planners: plan(topology, demand, options) -> Schedule, one module each, chosen by name."""

from __future__ import annotations

from typing import Callable

from ..collectives import Demand
from ..errors import CompileError
from ..schedule import Schedule
from ..topology import Topology
from .options import PlanOptions

Planner = Callable[[Topology, Demand, PlanOptions], Schedule]
PLANNERS: dict[str, Planner] = {}


def register(name: str):
    def wrap(fn: Planner) -> Planner:
        PLANNERS[name] = fn
        return fn
    return wrap


def get(name: str) -> Planner:
    _load()
    if name not in PLANNERS:
        raise CompileError(f"--method: {name!r} is not a planner (known: {', '.join(sorted(PLANNERS))})")
    return PLANNERS[name]


def _load() -> None:
    # importing a planner module registers it
    from . import baselines  # noqa: F401


__all__ = ["PlanOptions", "Planner", "PLANNERS", "register", "get"]
