"""Options every planner accepts. Planners read what applies to them and ignore the rest."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable


@dataclass(frozen=True)
class PlanOptions:
    method: str = "auto"
    time_limit: float = 60.0  # seconds for the whole plan, model building included
    gap: float = 1e-4  # relative MIP gap at which the solver stops
    max_horizon: int | None = None  # cap on the number of epochs (the horizon is never a user guess)
    tau: float | None = None  # epoch length override (seconds)
    multicast: bool = False  # let switches marked multicast copy (NVLS); MSCCL XML cannot express it
    warm_start: bool = True  # start the solver from the best baseline schedule
    symmetry: bool = True  # solve one representative per symmetry orbit where the topology allows
    verbose: bool = False  # forward the solver log
    progress: Callable[[str], None] | None = None  # one-line progress reports (elapsed, horizon, incumbent, gap)
    refine: bool = False  # auto may cut chunks into sub-chunks (when the user did not fix --chunks)
    element_bytes: int = 4  # chunks are whole elements: auto cuts no finer
    fallback: bool = True  # an optimiser that finds nothing in time returns the best baseline (auto has its own)
    # time.perf_counter() value by which planning returns; plan() sets it from time_limit, and every
    # solve and loop below it respects it (a sub-plan may get a shorter time_limit, never a later deadline)
    deadline: float | None = None
    # the time of the program a schedule realises (raises CompileError where none fits the runtimes), searched
    # until its second argument (a time.perf_counter() value) where that is not None: auto ranks its best
    # candidates by it; the pipeline sets it when it writes a program
    judge: Callable[[object, float | None], float] | None = field(default=None, compare=False, repr=False)
    # the share of the program floor (the lower bound plus what every program pays) at which a written program
    # ends auto's search and the instances search (no other program could gain more than the rest)
    good_enough: float = 0.98
    judge_until: float | None = None  # time.perf_counter() after which auto judges no further candidate
    # the time of the program a schedule realises with one instance (cheaper than judge: no
    # instances search); auto ranks its constructive candidates by it before judging them
    probe: Callable[[object], float] | None = field(default=None, compare=False, repr=False)
    # processes auto may use while it judges programs: 2 plans the optimisers in a second process beside the
    # judging of the constructive candidates; 0: 2 where the process may run on two cores or more
    # (MSCCL_COMPILE_WORKERS, where set, is the default)
    workers: int = 0

    def left(self, t0: float) -> float:
        """Seconds left to a planner that started at t0: of its time_limit, and before the deadline."""
        now = time.perf_counter()
        left = self.time_limit - (now - t0)
        return left if self.deadline is None else min(left, self.deadline - now)
