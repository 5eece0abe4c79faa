"""Solve a CVXPY problem with HiGHS, keeping what CVXPY's own HiGHS interface does not expose:
a warm start from given variable values, progress reports while the MIP runs, and the incumbent
and gap when the time limit stops it.

CVXPY states the problem and reduces it to the solver's standard form (`get_problem_data`); this
module only passes that form to highspy and maps the column vector back onto the variables.
"""

from __future__ import annotations

import contextlib
import os
import sys
import time
from dataclasses import dataclass

import cvxpy as cp
import highspy
import numpy as np
from cvxpy.reductions.solvers.conic_solvers.conic_solver import dims_to_solver_dict
from cvxpy.settings import A, B, BOOL_IDX, C, DIMS, EQ_DIM, INT_IDX, LEQ_DIM, LOWER_BOUNDS, PARAM_PROB, UPPER_BOUNDS

from compiler.specs.errors import CompileError

POLL_S = 0.05  # how often the waiting thread looks at signals and the deadline

_STATUS = {
    "kOptimal": "optimal", "kTimeLimit": "time_limit", "kInfeasible": "infeasible",
    "kUnboundedOrInfeasible": "infeasible", "kUnbounded": "unbounded", "kInterrupt": "time_limit",  # we interrupt only at the deadline
    "kSolutionLimit": "solution_limit", "kIterationLimit": "iteration_limit", "kObjectiveBound": "objective_bound",
    "kObjectiveTarget": "objective_target",
}


@dataclass(frozen=True)
class SolveResult:
    status: str  # optimal, time_limit, infeasible, interrupted, solution_limit, ...
    has_solution: bool
    objective: float | None
    bound: float | None  # best dual bound (MIP) or objective (LP)
    gap: float | None  # relative MIP gap of the returned solution
    seconds: float
    build_seconds: float  # CVXPY reduction time

    @property
    def proven(self) -> bool:
        return self.status == "optimal"


def new_highs() -> highspy.Highs:
    """A Highs instance; its one-time banner goes to /dev/null, not into our --json output."""
    sys.stdout.flush()
    saved = os.dup(1)
    try:
        with open(os.devnull, "w") as null:
            os.dup2(null.fileno(), 1)
            h = highspy.Highs()
    finally:
        os.dup2(saved, 1)
        os.close(saved)
    return h


@contextlib.contextmanager
def _stdout_to_stderr():
    sys.stdout.flush()
    saved = os.dup(1)
    try:
        os.dup2(2, 1)
        yield
    finally:
        sys.stdout.flush()
        os.dup2(saved, 1)
        os.close(saved)


def _columns(param_prob, variables) -> dict:
    return {v: param_prob.var_id_to_col[v.id] for v in variables}


def run_interruptibly(h: highspy.Highs, deadline: float | None) -> None:
    """h.run() in HiGHS's solver thread while this (the main) thread waits, so that Ctrl-C and
    SIGTERM reach Python at once: the solve is cancelled and KeyboardInterrupt propagates (HiGHS
    would otherwise report the interrupt as one failed solve and the caller carry on). Past
    `deadline` (a time.perf_counter() value) the solve is cancelled too: HiGHS's own time limit
    is not checked everywhere (presolve, crossover), the caller's promise is."""
    h.HandleUserInterrupt = True
    h.startSolve()
    try:
        while not h.wait(POLL_S)[0]:
            if deadline is not None and time.perf_counter() > deadline:
                h.cancelSolve()
    except KeyboardInterrupt:
        h.cancelSolve()
        raise


def solve(problem: cp.Problem, *, time_limit: float, gap: float = 1e-4, warm: dict | None = None,
          verbose: bool = False, progress=None, label: str = "", first_feasible: bool = False,
          ipm: bool = False, deadline: float | None = None) -> SolveResult:
    """Solve `problem` with HiGHS; variable values are set on the problem's variables.

    warm: {cp.Variable: np.ndarray} for a MIP start. progress: called with one-line reports.
    first_feasible: stop at the first integer solution (horizon probes). deadline: a
    time.perf_counter() value the solve never outlives, whatever time_limit says."""
    t0 = time.perf_counter()
    data, _chain, _inv = problem.get_problem_data(cp.HIGHS)
    build = time.perf_counter() - t0
    model, integer = highs_model(data)
    h = new_highs()
    h.setOptionValue("output_flag", bool(verbose))
    h.setOptionValue("log_to_console", bool(verbose))
    remaining = max(0.5, time_limit - build)
    if deadline is not None:
        remaining = max(0.05, min(remaining, deadline - time.perf_counter()))
    h.setOptionValue("time_limit", float(remaining))
    h.setOptionValue("mip_rel_gap", float(gap))
    h.setOptionValue("random_seed", 0)
    if ipm:
        h.setOptionValue("solver", "ipm")
    if first_feasible:
        h.setOptionValue("mip_max_improving_sols", 1)
    h.passModel(model)

    columns = _columns(data[PARAM_PROB], problem.variables())
    if warm and integer:
        set_start(h, columns, warm, model.lp_.num_col_)
    if progress is not None and integer:
        h.cbMipInterrupt.subscribe(_reporter(progress, label, t0))
    if verbose:  # HiGHS logs to stdout; keep stdout for our own output (--json)
        with _stdout_to_stderr():
            run_interruptibly(h, deadline)
    else:
        run_interruptibly(h, deadline)
    return _result(h, problem, columns, bool(integer), label, t0, build)


def highs_model(data: dict) -> tuple[highspy.HighsModel, list[int]]:
    """CVXPY's standard form for HiGHS (equalities, then inequalities, then bounds) as a HighsModel,
    and the integer columns."""
    dims = dims_to_solver_dict(data[DIMS])
    mat = data[A].tocsc()
    inf = highspy.kHighsInf
    n_eq, n_leq = dims[EQ_DIM], dims[LEQ_DIM]
    upper = np.asarray(data[B], dtype=float)
    lower = np.concatenate([upper[:n_eq], np.full(n_leq, -inf)])

    model = highspy.HighsModel()
    lp = model.lp_
    lp.num_col_, lp.num_row_ = mat.shape[1], mat.shape[0]
    lp.col_cost_ = np.asarray(data[C], dtype=float)
    lp.row_lower_, lp.row_upper_ = lower, upper
    lp.a_matrix_.format_ = highspy.MatrixFormat.kColwise
    lp.a_matrix_.start_, lp.a_matrix_.index_, lp.a_matrix_.value_ = mat.indptr, mat.indices, mat.data
    lb, ub = data[LOWER_BOUNDS], data[UPPER_BOUNDS]
    col_lower = np.full(lp.num_col_, -inf) if lb is None else np.array(lb, dtype=float)
    col_upper = np.full(lp.num_col_, inf) if ub is None else np.array(ub, dtype=float)
    integer = list(data[BOOL_IDX]) + list(data[INT_IDX])
    if data[BOOL_IDX]:
        idx = np.array(data[BOOL_IDX], dtype=int)
        col_lower[idx] = np.maximum(col_lower[idx], 0)
        col_upper[idx] = np.minimum(col_upper[idx], 1)
    if integer:
        kinds = np.zeros(lp.num_col_, dtype=np.uint8)
        kinds[integer] = 1
        lp.integrality_ = [highspy.HighsVarType.kInteger if k else highspy.HighsVarType.kContinuous for k in kinds]
    lp.col_lower_, lp.col_upper_ = col_lower, col_upper
    return model, integer


def set_start(h: highspy.Highs, columns: dict, warm: dict, ncols: int) -> None:
    """A MIP start from {cp.Variable: value} (variables left out start at 0)."""
    x0 = np.zeros(ncols)
    for var, value in warm.items():
        col = columns[var]
        x0[col:col + var.size] = np.asarray(value, dtype=float).ravel(order="F")
    sol = highspy.HighsSolution()
    sol.col_value = list(x0)
    sol.value_valid = True
    h.setSolution(sol)


def _reporter(progress, label: str, t0: float):
    """A MIP callback that reports elapsed time, incumbent and gap, at most every 2 seconds."""
    last = [0.0]

    def report(event):
        now = time.perf_counter() - t0
        if now - last[0] < 2.0:
            return
        last[0] = now
        out = event.data_out
        inc = out.mip_primal_bound
        incumbent = "none" if not np.isfinite(inc) else f"{inc:.6g}"
        g = out.mip_gap if np.isfinite(out.mip_gap) else float("inf")
        progress(f"{label}elapsed {now:.0f}s, incumbent {incumbent}, gap {g:.2%}")

    return report


def _result(h: highspy.Highs, problem: cp.Problem, columns: dict, integer: bool, label: str, t0: float,
            build: float) -> SolveResult:
    """The outcome of a run; where there is a solution, its values set on the problem's variables."""
    info = h.getInfo()
    status = _STATUS.get(h.getModelStatus().name, h.getModelStatus().name)
    if status == "unbounded":
        raise CompileError(f"{label}solver: the model is unbounded (a bug in the model, please report)")
    has = info.primal_solution_status == 2  # kSolutionStatusFeasible
    objective = bound = mip_gap = None
    if has:
        x = np.asarray(h.getSolution().col_value)
        for var, col in columns.items():
            value = x[col:col + var.size].reshape(var.shape, order="F") if var.shape else x[col]
            var.value = var.project(value)  # within the solver's tolerances, not CVXPY's 1e-10
        objective = float(problem.objective.value)
        offset = objective - float(info.objective_function_value)
        if integer:
            bound = float(info.mip_dual_bound) + offset
            mip_gap = float(info.mip_gap) if np.isfinite(info.mip_gap) else None
        else:
            bound = objective
    return SolveResult(status, has, objective, bound, mip_gap, time.perf_counter() - t0, build)
