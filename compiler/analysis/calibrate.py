"""Fitting the runtime cost model to measured times.

Each measurement is one program at one size and the time the GPUs took for it (a row of `msccl-compile
bench`'s MSCCL side). Per protocol, the fit chooses the launch, the step latency of each link kind
and the thread blocks a link of each kind carries at once (tb_GBps) that make the program timer
agree with the measurements: least squares on the log of the time ratio, so a 2 us row counts as
much as a 2 ms one. The payload efficiency and the iteration size are facts of the protocols and
are kept.

The timer is a discrete-event simulation, and the error is far from smooth in its parameters (a
thread block count or a step latency reorders sends on a link), so the fit searches rather than
descends: the launch is added once to every program's time (timing.time_program), so it is solved
in one dimension over timings already taken; tb_GBps acts only through the whole number of blocks
a link carries at once (Costing.lanes), so those counts are enumerated; for each count the step
latencies are solved by Gauss-Newton (a program's time is linear in them while its critical path
holds) after a scan of each over a wide range (scan_steps). A parameter the measurements do not
decide (LL's tb_GBps from small sizes alone) stays at the profile's value: a small pull towards it
breaks the ties. Written by hand: no library fits a simulator's integer and piecewise-linear
parameters.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, replace

import numpy as np
from scipy.optimize import lsq_linear, minimize_scalar

from compiler.analysis.links import Costing
from compiler.model.costs import ProtocolCost
from compiler.model.program import Program
from compiler.model.topology import Topology
from compiler.specs.errors import CompileError

PULL = 1e-6  # weight of the pull towards the profile's values (per squared log ratio): breaks ties only
STEP_RANGE = (1e-9, 1e-2)  # seconds a step latency may take (the profile schema's 0-10,000 us, above zero)
LAUNCH_MAX = 1e-2  # seconds (the schema's 10,000 us)
TB_SPREAD = 8.0  # tb_GBps is searched within this factor of the profile's value
REFINE_SPREAD = 2.0  # and then within this factor of the grid's best (refine)
MOST_LANES = 64  # thread blocks one link may carry at once
PASSES = 2  # passes over the kinds at most (refine)
HALVINGS = 4  # of a Gauss-Newton step that does not lower the error
SOLVE_ROUNDS = 4  # Gauss-Newton rounds for the step latencies at most (one while lane counts are scanned)
LANE_GRID = 49  # lane-count combinations of the coarse grid over several kinds, about
ONE_KIND_GRID = 16  # and lane counts of the grid of one kind (all of them took 25 % longer for the same fits)
STARTS = 3  # the best grid points solved in full
STEP_SCAN, STEP_SPREAD = 17, 10.0  # step latencies tried from a lane count's start (scan_steps)
OUTLIER_SPREAD, OUTLIER_LEAST, OUTLIER_SHARE = 3.0, 0.1, 10  # a row left out of the fit (outliers)


@dataclass(frozen=True)
class Measurement:
    label: str  # where it came from, for messages and tables
    program: Program
    size_bytes: float  # one call's bytes, as the timer takes them
    time_s: float


@dataclass(frozen=True)
class ProtocolFit:
    proto: str
    before: ProtocolCost
    after: ProtocolCost
    rows: int
    error_before: float  # root mean square of log(model / measured)
    error_after: float
    decided: tuple[str, ...]  # the parameters the measurements moved ("launch_us", "step_us.nvlink", ...)
    outliers: tuple[str, ...] = ()  # the labels of the rows left out of the final fit (`outliers`)


def link_kinds(topo: Topology) -> tuple[str, ...]:
    return tuple(sorted({l.kind or "nvlink" for l in topo.links}))


def with_cost(topo: Topology, proto: str, cost: ProtocolCost) -> Topology:
    """`topo` with `proto`'s costs replaced (a new topology: the timer's route memo keys by identity)."""
    costs = topo.costs
    return replace(topo, costs=replace(costs, protocols=tuple((n, cost if n == proto else c)
                                                              for n, c in costs.protocols)))


def rms_log_error(model: np.ndarray, measured: np.ndarray) -> float:
    return float(np.sqrt(np.mean(np.log(model / measured) ** 2)))


class _Objective:
    """The loss of one protocol's parameters over its measurements, with the timings memoised by
    what they depend on (the step latencies and every link's lanes; the launch is added after)."""

    def __init__(self, topo: Topology, proto: str, prior: ProtocolCost, ms: list[Measurement], kinds: tuple[str, ...]):
        self.topo, self.proto, self.prior, self.ms, self.kinds = topo, proto, prior, ms, kinds
        self.measured = np.array([m.time_s for m in ms])
        self.memo: dict = {}

    def lanes_key(self, cost: ProtocolCost) -> tuple:
        costing = Costing(self.proto, cost)  # the timer's own count of lanes (analysis/links.py)
        return tuple(costing.lanes(l.bandwidth, l.kind or "nvlink") for l in self.topo.links)

    def bodies(self, cost: ProtocolCost) -> np.ndarray:
        """Each program's time without the launch."""
        from compiler.program.timing import time_program
        key = (cost.step, self.lanes_key(cost))
        if key not in self.memo:
            topo = with_cost(self.topo, self.proto, replace(cost, launch=0.0))
            try:
                self.memo[key] = np.array([time_program(m.program, topo, m.size_bytes).finish_time_s for m in self.ms])
            except CompileError as e:
                raise CompileError(f"calibrate: {e}") from None
        return self.memo[key]

    def pull(self, cost: ProtocolCost) -> float:
        p = self.prior
        pairs = [(cost.launch, p.launch)] + [(cost.step_time(k), p.step_time(k)) for k in self.kinds] \
            + [(cost.tb_rate(k), p.tb_rate(k)) for k in self.kinds]
        return PULL * sum(math.log(max(a, 1e-12) / max(b, 1e-12)) ** 2 for a, b in pairs)

    def best_launch(self, cost: ProtocolCost) -> tuple[float, ProtocolCost]:
        """(loss, cost with its best launch) for cost's other parameters."""
        body = self.bodies(cost)
        logm = np.log(self.measured)

        def loss(launch: float) -> float:
            return float(np.mean((np.log(body + launch) - logm) ** 2))
        hi = min(LAUNCH_MAX, float(self.measured.max()))
        r = minimize_scalar(loss, bounds=(0.0, hi), method="bounded", options={"xatol": 1e-10})
        launch = min((0.0, float(r.x), self.prior.launch if self.prior.launch <= hi else 0.0), key=loss)
        out = replace(cost, launch=launch)
        return loss(launch) + self.pull(out), out

    def error(self, cost: ProtocolCost) -> float:
        return rms_log_error(self.bodies(cost) + cost.launch, self.measured)


def _set(mapping: tuple[tuple[str, float], ...], kind: str, value: float) -> tuple[tuple[str, float], ...]:
    return tuple(sorted({**dict(mapping), kind: value}.items()))


def _lane_choices(topo: Topology, kind: str, eff: float, prior_rate: float, spread: float = TB_SPREAD) -> list[float]:
    """One tb rate per distinct lane count of the links of `kind`, within `spread` of the prior:
    the prior where it falls in the count's interval, else the interval's geometric middle (so that
    rounding the written value keeps the count)."""
    caps = sorted({l.bandwidth * eff for l in topo.links if (l.kind or "nvlink") == kind})
    lo, hi = prior_rate / spread, prior_rate * spread
    edges = sorted({c / n for c in caps for n in range(1, MOST_LANES + 1)} | {lo, hi, max(caps) * 2})
    out = []
    for a, b in zip(edges, edges[1:]):  # lanes are constant on (a, b]
        if b <= lo or a >= hi:
            continue
        out.append(prior_rate if a < prior_rate <= b else math.sqrt(a * b))
    return out


def solve_steps(obj: "_Objective", cost: ProtocolCost, rounds: int = SOLVE_ROUNDS) -> tuple[float, ProtocolCost]:
    """(loss, cost with the launch and step latencies that best explain the rows at cost's lanes).
    A program's time moves with a step latency by the number of that kind's steps on its critical
    path, so around the current latencies it is linear in them: Gauss-Newton on the relative error
    (scipy's bounded linear least squares, one timing per kind for the slopes), a few rounds. A
    kind no row depends on keeps its value (a weak row pulls it there)."""
    kinds, m = obj.kinds, obj.measured
    best = obj.best_launch(cost)
    for _ in range(rounds):
        base = obj.bodies(cost)
        slopes = []
        for k in kinds:
            step = cost.step_time(k)
            d = max(0.1 * step, 1e-8)
            slopes.append((obj.bodies(replace(cost, step=_set(cost.step, k, step + d))) - base) / d)
        now = np.array([cost.step_time(k) for k in kinds])
        keep = np.array([obj.prior.step_time(k) for k in kinds])
        a = np.column_stack([np.ones(len(m))] + slopes) / m[:, None]
        b = (m - base + sum(c * x for c, x in zip(slopes, now))) / m
        weak = np.sqrt(PULL) * np.diag(np.concatenate([[1 / max(obj.prior.launch, 1e-6)], 1 / np.maximum(keep, 1e-8)]))
        a = np.vstack([a, weak])
        b = np.concatenate([b, weak @ np.concatenate([[obj.prior.launch], keep])])
        lo = [0.0] + [STEP_RANGE[0]] * len(kinds)
        hi = [LAUNCH_MAX] + [STEP_RANGE[1]] * len(kinds)
        x = lsq_linear(a, b, bounds=(lo, hi)).x[1:]
        for _ in range(HALVINGS):  # where the critical paths change the step overshoots: shorten it
            cost = replace(cost, step=tuple(sorted({**dict(cost.step), **dict(zip(kinds, map(float, x)))}.items())))
            tried = obj.best_launch(cost)
            if tried[0] < best[0]:
                break
            x = (x + now) / 2
        else:
            break
        best, cost = tried, tried[1]
        if np.all(np.abs(x - now) <= 0.01 * now):
            break
    return best


def scan_steps(obj: "_Objective", cost: ProtocolCost) -> ProtocolCost:
    """cost with each kind's step latency, in turn, the best of STEP_SCAN values spread over STEP_SPREAD
    either side of the profile's (the launch solved for each), or its own. The error is not convex in
    a step latency where it reorders sends on a link (two DGX H100 nodes, LL, the network's step: 0.0038
    at 2.7 us, 0.0056 at 3.2, 0.0002 at 4.0, the hidden value), and the Gauss-Newton solve stops at
    the first dip."""
    best = obj.best_launch(cost)
    for k in obj.kinds:
        p = obj.prior.step_time(k)
        for v in np.geomspace(p / STEP_SPREAD, p * STEP_SPREAD, STEP_SCAN):
            tried = obj.best_launch(replace(best[1], step=_set(best[1].step, k, float(v))))
            if tried[0] < best[0]:
                best = tried
    return best[1]


def _coarse(choices: list[float], points: int) -> list[int]:
    """Indices of about `points` of `choices` (rates, ascending) spread evenly in log rate."""
    if len(choices) <= points:
        return list(range(len(choices)))
    logs = np.log(choices)
    marks = np.linspace(logs[0], logs[-1], points)
    return sorted({int(np.argmin(np.abs(logs - t))) for t in marks})


def _with_rates(cost: ProtocolCost, rates: dict[str, float]) -> ProtocolCost:
    return replace(cost, tb_bandwidth=tuple(sorted({**dict(cost.tb_bandwidth), **rates}.items())))


def _lowest(tried: list[tuple[float, ProtocolCost]], n: int = 1) -> list[ProtocolCost]:
    return [c for _, c in sorted(tried, key=lambda lc: lc[0])[:n]]


def refine(obj: "_Objective", topo: Topology, prior: ProtocolCost, best_loss: float,
           best: ProtocolCost) -> tuple[float, ProtocolCost]:
    """From the grid's best, per kind in turn: every lane count within REFINE_SPREAD of its own, the
    others held, each with one Gauss-Newton round from its latencies, the best of them solved in
    full; until a pass over the kinds gains nothing."""
    for _ in range(PASSES):
        start = best_loss
        for kind in obj.kinds:
            near = _lane_choices(topo, kind, prior.efficiency, best.tb_rate(kind), REFINE_SPREAD)
            tried = [solve_steps(obj, _with_rates(best, {kind: r}), 1) for r in near]
            loss, cost = solve_steps(obj, _lowest(tried)[0])
            if loss < best_loss - 1e-15:
                best_loss, best = loss, cost
        if best_loss > start * (1 - 1e-6) - 1e-15:
            break
    return best_loss, best


def fit_protocol(topo: Topology, proto: str, ms: list[Measurement], kinds: tuple[str, ...]) -> ProtocolFit:
    """The parameters of `proto` (for the link kinds `kinds`; the others' stay) that best explain
    `ms`, all of them `proto`'s programs. Each lane count is judged with the launch and step
    latencies solved for it: fewer lanes and a shorter step can explain the same rows as more lanes
    and a longer step. The error is far from smooth in the lane counts (two DGX H100 nodes, LL,
    with NVLink's hidden count 22: 0.013 at 22, 0.059 at 17 and 0.025 at 35), so a grid of counts
    within TB_SPREAD of the profile's (ONE_KIND_GRID of one kind, about LANE_GRID combinations of
    several) is tried and its STARTS best are solved in full. From the best, `refine`: the grid ranks counts by one Gauss-Newton round from the
    profile's latencies, and from the latencies found the counts near the best rank better (two
    DGX H100 nodes' LL network fit stopped at 3 lanes and 0.066 of error without it, where the
    hidden 4 give 0.010)."""
    prior = topo.costs.protocol(proto)
    obj = _Objective(topo, proto, prior, ms, kinds)
    choices = {k: _lane_choices(topo, k, prior.efficiency, prior.tb_rate(k)) for k in kinds}
    points = ONE_KIND_GRID if len(kinds) == 1 else max(3, round(LANE_GRID ** (1 / len(kinds))))
    picks = [dict(zip(kinds, pick)) for pick in
             itertools.product(*([choices[k][i] for i in _coarse(choices[k], points)] for k in kinds))]
    grid = [solve_steps(obj, _with_rates(prior, pick), 1) for pick in picks]
    finals = [solve_steps(obj, scan_steps(obj, start)) for start in _lowest(grid, STARTS)]
    best = refine(obj, topo, prior, *min(finals, key=lambda lc: lc[0]))[1]
    return ProtocolFit(proto, prior, best, len(ms), obj.error(prior), obj.error(best), _decided(obj, best))


def _decided(obj: _Objective, cost: ProtocolCost) -> tuple[str, ...]:
    """The parameters whose change by a quarter (a lane count's worth for tb) changes the fit's
    error: the others the measurements leave where the profile had them."""
    base = obj.error(cost)
    trials = [("launch_us", replace(cost, launch=cost.launch * 1.25 + 1e-7))]
    for k in obj.kinds:
        trials.append((f"step_us.{k}", replace(cost, step=_set(cost.step, k, cost.step_time(k) * 1.25 + 1e-8))))
        rates = [cost.tb_rate(k) * f for f in (0.5, 2.0)]
        trials += [(f"tb_GBps.{k}", replace(cost, tb_bandwidth=_set(cost.tb_bandwidth, k, r))) for r in rates]
    return tuple(dict.fromkeys(name for name, c in trials if abs(obj.error(c) - base) > 1e-4))


def fit(topo: Topology, ms: list[Measurement], kinds: tuple[str, ...] | None = None,
        progress=lambda message: None) -> tuple[ProtocolFit, ...]:
    """One ProtocolFit per protocol with measurements, in the profile's protocol order, of the
    parameters of `kinds` (default: every link kind of `topo`)."""
    kinds = kinds or link_kinds(topo)
    if topo.costs is None:
        raise CompileError(f"calibrate: {topo.name} has no runtime costs to fit")
    by_proto: dict[str, list[Measurement]] = {}
    for m in ms:
        if m.program.proto not in topo.costs.names:
            raise CompileError(f"{m.label}: the program's protocol {m.program.proto} has no costs in {topo.name} "
                               f"(has: {', '.join(topo.costs.names)})")
        by_proto.setdefault(m.program.proto, []).append(m)
    fits = []
    for p in (p for p in topo.costs.names if p in by_proto):
        progress(f"fitting {p}'s costs to {len(by_proto[p])} measurements")
        f = fit_protocol(topo, p, by_proto[p], kinds)
        odd = outliers(topo, f, by_proto[p])
        if odd:
            progress(f"fitting {p}'s costs again without {len(odd)} outlier(s)")
            kept = [m for m in by_proto[p] if m.label not in odd]
            f = replace(fit_protocol(topo, p, kept, kinds), outliers=odd)
        fits.append(f)
    return tuple(fits)


def outliers(topo: Topology, f: ProtocolFit, ms: list[Measurement]) -> tuple[str, ...]:
    """The rows the fit misses by far more than the others (a glitch in a measurement pulls a least
    squares fit towards it): |log(model / measured)| above OUTLIER_SPREAD robust standard deviations
    (1.4826 x the median, the normal's) and above OUTLIER_LEAST, at most one row in OUTLIER_SHARE
    (beyond that the model, not the rows, is what misses); () where none. Three, not the usual
    five: the glitch's pull raises the others' residuals too (one DGX H100 LL row measured 4x too
    slow among ten: it missed by 1.18, the median row by 0.2)."""
    from compiler.program.timing import time_program
    topo = with_cost(topo, f.proto, f.after)
    r = np.abs(np.log([time_program(m.program, topo, m.size_bytes).finish_time_s / m.time_s for m in ms]))
    cut = max(OUTLIER_SPREAD * 1.4826 * float(np.median(r)), OUTLIER_LEAST)
    far = [i for i in np.argsort(-r, kind="stable") if r[i] > cut]
    if not far or len(far) > len(ms) // OUTLIER_SHARE:
        return ()
    return tuple(ms[i].label for i in sorted(far))

