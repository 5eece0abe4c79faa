"""The objective of one window of the rounds planner beyond the MILP's: the A* cost-to-go
(CostToGo), and the window's solver start (a greedy schedule's values, with the cost-to-go at its
value). See rounds.py for the windows themselves."""

from __future__ import annotations

import cvxpy as cp
import numpy as np
import scipy.sparse as sp

from compiler.model.schedule import Transfer
from compiler.model.topology import Topology
from compiler.planners.milp import Model, Start, warm_values

COST_TO_GO = 0.9  # weight of the estimated (optimistic) early-delivery reward of an open need


class CostToGo:
    """The A* heuristic of a window, in the objective's own units. Early delivery rewards a chunk
    delivered in epoch a of the window (or its look-ahead, up to epoch K + A) with K + A + 1 - a.
    A need (chunk q, GPU d) still open at the window's end is credited the same reward for the
    earliest epoch v at which it could still arrive: a GPU g that holds q from epoch k can deliver
    it at max(K, k) + dist(g, d) (the next window starts at K; dist in epochs, capacity ignored, so
    the estimate is optimistic, as A* requires), times COST_TO_GO. Linear through one variable per
    (q, d, v), v = K+1..K+A: y(q,d,v) <= the number of GPUs g with B(q, g, v - dist(g, d)) = 1
    (epoch capped at K + A), and sum over v of y(q,d,v) <= 1 - B(q, d, K + A), so the best v
    counts once and a delivered need no more. A need no GPU can serve within the look-ahead earns
    nothing. (TE-CCL weights holders by 1 / (1 + distance) instead, te-ccl-model.md §7; that
    reward has no common scale with the deliveries it is weighed against.)"""

    def __init__(self, model: Model, start: Start, dst: np.ndarray, dist: np.ndarray):
        self.y = None
        K, last = model.horizon, model.b_pos.shape[2] - 1
        ahead = last - K
        held = model.held0
        need = dst & ~held & (start.landing == 0)
        qs, ds = np.nonzero(need)
        if ahead == 0 or model.B is None or len(qs) == 0:
            return
        rows_c, rows_need, ent_row, ent_q, ent_g, ent_e = [], [], [], [], [], []
        nrows = 0
        for d in np.unique(ds):
            near = np.nonzero((dist[:, d] <= ahead) & (np.arange(len(dist)) != d))[0]
            cls, gs = [], []  # class c (v = K + 1 + c) and a GPU that could deliver by v
            for c in range(ahead):
                m = near[dist[near, d] <= c + 1]
                cls.append(np.full(len(m), c))
                gs.append(m)
            cls, gs = np.concatenate(cls), np.concatenate(gs)
            epoch = np.minimum(last, K + 1 + cls - dist[gs, d])
            for i in np.nonzero(ds == d)[0]:
                rows_c.append(np.arange(ahead))
                rows_need.append(np.full(ahead, i))
                ent_row.append(nrows + cls)
                ent_q.append(np.full(len(gs), qs[i]))
                ent_g.append(gs)
                ent_e.append(epoch)
                nrows += ahead
        c, group = np.concatenate(rows_c), np.concatenate(rows_need)
        er, eq, eg, ee = (np.concatenate(x) for x in (ent_row, ent_q, ent_g, ent_e))
        const = np.zeros(nrows)
        np.add.at(const, er[held[eq, eg]], 1.0)
        col = model.b_pos[eq, eg, ee]
        var = col >= 0
        self.m = sp.csr_matrix((np.ones(var.sum()), (er[var], col[var])), shape=(nrows, model.B.size))
        self.end = model.b_pos[qs, ds, last]  # B(q, d, K + A) of each need: a variable (d does not hold q)
        self.const, self.group, self.weight = const, group, COST_TO_GO * (ahead - c)
        self.y = cp.Variable(nrows, name="y", bounds=[0, 1])
        one = sp.csr_matrix((np.ones(nrows), (group, np.arange(nrows))), shape=(len(qs), nrows))
        delivered = sp.csr_matrix((np.ones(len(qs)), (np.arange(len(qs)), self.end)), shape=(len(qs), model.B.size))
        self.constraints = [self.y - self.m @ model.B <= const, one @ self.y + delivered @ model.B <= 1]

    def problem(self, model: Model) -> cp.Problem:
        if self.y is None:
            return model.problem
        return cp.Problem(cp.Minimize(model.problem.objective.expr - self.weight @ self.y),
                          model.problem.constraints + self.constraints)

    def warm(self, b: np.ndarray) -> np.ndarray:
        """y for holdings b: 1 at the earliest v some holder reaches (rows go earliest first),
        none for a need already delivered."""
        has = (self.m @ b + self.const >= 0.5) & (b[self.end] < 0.5)[self.group]
        idx = np.where(has, np.arange(len(has)), len(has))
        starts = np.nonzero(np.r_[True, self.group[1:] != self.group[:-1]])[0]
        first = np.minimum.reduceat(idx, starts)
        y = np.zeros(len(has))
        y[first[first < len(has)]] = 1.0
        return y


def set_values(problem: cp.Problem, values: dict) -> float:
    """Set the problem's variables to `values` (0 where none is given); the objective there."""
    for var in problem.variables():
        var.value = values.get(var, np.zeros(var.size))
    return float(problem.objective.value)


def warm_start(model: Model, topo: Topology, transfers: list[Transfer], ctg: CostToGo) -> dict:
    """Solver start from the greedy transfers (or, if they do not fit the model, from sending
    nothing: always feasible), with the cost-to-go at its value."""
    values = warm_values(model, topo, transfers) or warm_values(model, topo, [])
    if ctg.y is not None:
        values[ctg.y] = ctg.warm(values[model.B])
    return values
