"""Planners: plan(topology, demand, options) -> Schedule, one module each (see registry)."""

from compiler.planners.options import PlanOptions
from compiler.planners.registry import METHODS, plan

__all__ = ["PlanOptions", "METHODS", "plan"]
