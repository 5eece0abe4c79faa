"""The time-partitioned planner ("rounds", TE-CCL's A*; te-ccl-model.md §7): the MILP of milp.py
solved over a short window of epochs at a time instead of the whole horizon.

Each window starts from the state the windows before it left (milp.Start): which GPUs hold which
commodities, copies still in flight (they land as constants), and link capacity that flows of the
previous window still occupy across the boundary. A window has no "every demand met" constraint and
lets flows land after its end (the look-ahead); its objective is early delivery (as in the MILP),
plus a cost-to-go that rewards holding every still-needed chunk close to the GPUs that need it at
the window's end (cost_to_go.CostToGo), plus the MILP's small flow penalty. A GPU may send several
copies of one chunk through a switch in one epoch (milp.build(copies=True)), which matters at
coarse epochs.

The solver starts every window from a greedy list schedule (`greedy`), which also stands in for
the solver once the time limit is spent: a late window costs a fraction of a second, and a plan
whose limit ran out (a loaded machine, a slow import) still ends, late by its greedy windows. Windows
follow each other until every need is met; all windows' transfers, at absolute epochs, form the
schedule (pitfall #3 of te-ccl-model.md §8), ordered inside each epoch so that transfers sharing
a link do not queue behind each other (timexp.order_within_epochs). Under a symmetry the state
is that of the representatives' chunks and the images are mapped once at the end.
"""

from __future__ import annotations

import heapq
import math
import time
from dataclasses import replace

import numpy as np

from compiler.analysis.bounds import bound_for
from compiler.model.demand import Demand
from compiler.specs.errors import CompileError, InfeasibleError
from compiler.model.schedule import Schedule, Transfer
from compiler.model.timing import TimeExpansion, epochs_for, expand
from compiler.model.topology import Topology
from compiler.planners.registry import register
from compiler.planners.milp import Model, Start, build, extract, prune_useless
from compiler.planners.cost_to_go import CostToGo, set_values, warm_start
from compiler.planners.reductions import SYMMETRY, Orbits, Problem
from compiler.planners.options import PlanOptions
from compiler.planners.highs import solve
from compiler.planners.symmetry import Symmetry, rep_chunks
from compiler.planners.flows import INF, capacity_violations, distances, link_orbits, occupancy, order_within_epochs

MIN_WINDOW = 15  # epochs per window at least (TE-CCL's round length)
STALLS = 2  # windows in a row without progress before giving up
MAX_WINDOW_SHARE = 0.5  # no window may take more than this share of the time left
MIN_SOLVE = 1.0  # seconds: with less time left, a window keeps its greedy schedule without solving
# greedy tie-breaks, in epochs (together below one epoch, so they never trade real time):
LATE_HOLDER = 0.5  # times (epoch the sender got its copy) / (epochs so far): relay from long-held copies
NEW_PEER = 0.005  # a transfer between GPUs that have not exchanged data yet (peers cost thread blocks)


def window_length(te: TimeExpansion) -> int:
    """max(15, twice the largest arrival offset): a window is long enough for a slow transfer
    started in it to land inside it, and the look-ahead never reaches past the next window."""
    return max(MIN_WINDOW, 2 * max(te.arrival))


@register("rounds")
def plan(topo: Topology, demand: Demand, options: PlanOptions) -> Schedule:
    t0 = time.perf_counter()
    try:
        return plan_rounds(topo, demand, options)
    except InfeasibleError as e:
        # the greedy windows that stand in for the solver once the limit is spent serve needs only
        # from GPUs that hold the chunk, so they never relay through a GPU that does not need it
        # (a gather on DGX-1, an alltoall on a line): keep a baseline, as milp and lp do
        from compiler.planners.milp import keep_baseline
        return keep_baseline(e, topo, demand, options, t0)


def plan_rounds(topo: Topology, demand: Demand, options: PlanOptions, window: int | None = None) -> Schedule:
    """The rounds planner with an explicit window length (epochs; default window_length)."""
    t0 = time.perf_counter()
    te = expand(topo, demand, options.tau)
    length = window_length(te) if window is None else int(window)
    if length <= max(te.arrival):
        raise InfeasibleError(f"rounds: a window of {length} epochs is not longer than the slowest transfer "
                              f"({max(te.arrival)} epochs)")
    lower = max(1, epochs_for(bound_for(topo, demand).bandwidth_s, te.tau))
    return SYMMETRY.plan(Problem(topo, demand, options),
                          lambda reduced: _plan(topo, demand, options, te, length, lower, t0, reduced))


class _State:
    """What the windows so far have done, per model commodity, at absolute epochs."""

    def __init__(self, topo: Topology, demand: Demand, sym: Symmetry | None):
        src, dst = demand.masks()
        self.chunk_ids = list(range(len(demand.chunks))) if sym is None else rep_chunks(demand, sym.reps)
        self.column = {c: q for q, c in enumerate(self.chunk_ids)}
        self.dst = dst[self.chunk_ids]
        self.held = src[self.chunk_ids].copy()
        self.landing = np.zeros(self.held.shape, dtype=np.int64)  # absolute epoch, 0 where none
        self.since = np.zeros(self.held.shape, dtype=np.int64)  # absolute epoch a holder got its copy
        self.load = np.zeros((len(topo.links), 0), dtype=np.int64)  # capacity used, absolute epochs
        self.link_images = None if sym is None else sym.link_perms
        self.pair = _pair_keys(topo, sym)
        self.peers = np.zeros(topo.ngpus ** 2, dtype=bool)  # connections used so far, by pair key

    def needs(self) -> int:
        return int((self.dst & ~self.held & (self.landing == 0)).sum())

    def start(self, t0: int, length: int) -> Start:
        """The state at epoch t0 as seen by a window of `length` epochs starting there."""
        landed = (self.landing > 0) & (self.landing <= t0)
        self.held |= landed
        self.landing[landed] = 0
        busy = np.zeros((self.load.shape[0], length), dtype=np.int64)
        part = self.load[:, t0:t0 + length]
        busy[:, :part.shape[1]] = part
        return Start(self.held.copy(), np.where(self.landing > 0, self.landing - t0, 0), busy)

    def advance(self, t0: int, length: int, model: Model, transfers: list[Transfer], te: TimeExpansion) -> int:
        """Record one window's transfers (absolute epochs); returns the chunks it delivered or set
        in flight."""
        done = 0
        for t in transfers:
            self.peers[self.pair[t.src, t.dst]] = True
            q = self.column[t.chunk]
            if not self.held[q, t.dst] and self.landing[q, t.dst] == 0:
                done += 1
                self.since[q, t.dst] = t.arrive
                if t.arrive <= t0 + length:
                    self.held[q, t.dst] = True
                else:
                    self.landing[q, t.dst] = t.arrive
        on = np.repeat(np.arange(len(model.flows)), np.rint(np.maximum(model.F.value, 0)).astype(np.int64))
        _, links, epoch, count = occupancy(model.flows.l[on], model.flows.k[on] + t0, te, self.link_images)
        late = epoch >= t0 + length
        if late.any():
            need = int(epoch[late].max()) + 1
            if need > self.load.shape[1]:
                self.load = np.pad(self.load, ((0, 0), (0, need - self.load.shape[1])))
            np.add.at(self.load, (links[late], epoch[late]), count[late])
        return done


def _pair_keys(topo: Topology, sym: Symmetry | None) -> np.ndarray:
    """(N, N) key of each GPU pair: the pairs of one orbit under the symmetry, whose transfers the
    mapping turns into the same connections, share a key."""
    n = topo.ngpus
    if sym is None:
        return np.arange(n * n).reshape(n, n)
    to_rep = np.zeros(n, dtype=np.int64)  # the group element taking each GPU to its representative
    for g, p in enumerate(sym.perms):
        hit = np.isin(p[:n], sym.reps)
        to_rep[hit] = g
    moved = sym.perms[to_rep][:, :n]  # row x: the GPUs as seen from x's representative
    return moved[np.arange(n), np.arange(n)][:, None] * n + moved


def _plan(topo, demand, options, te, length, lower, t0, reduced: Orbits | None = None) -> Schedule:
    report = options.progress
    sym = reduced.sym if reduced is not None else None
    state = _State(topo, demand, sym)
    dist = distances(topo, te)[1]
    transfers: list[Transfer] = []
    epoch, windows, stalls, groups = 0, 0, 0, 0
    timed_out = False
    greedy_windows = 0
    while state.needs():
        left = options.left(t0)
        if options.max_horizon is not None and epoch >= options.max_horizon:
            raise InfeasibleError(f"rounds: {state.needs()} deliveries still outstanding after "
                                  f"max_horizon={options.max_horizon} epochs")
        model, found, how, solved, optimal = _window(topo, demand, options, te, state, dist, sym, epoch, length,
                                                     lower, left, windows + 1)
        if not solved:
            greedy_windows += 1
        timed_out |= not optimal
        last_group = max((t.group for t in found), default=-1)
        found = [replace(t, start=t.start + epoch, arrive=t.arrive + epoch, group=t.group + groups if t.group >= 0 else -1)
                 for t in found]
        groups += last_group + 1
        done = state.advance(epoch, length, model, found, te)
        transfers += found
        windows += 1
        if report:
            report(f"window {windows}: epochs {epoch}..{epoch + length - 1}, {done} deliveries, "
                   f"{state.needs()} outstanding ({how})")
        stalls = 0 if done else stalls + 1
        if stalls >= STALLS:
            raise InfeasibleError(f"rounds: no progress in {STALLS} windows in a row (epochs up to {epoch + length}); "
                                  f"{state.needs()} deliveries cannot be made")
        epoch += length
    transfers = prune_useless(transfers, demand)
    horizon = max((t.arrive for t in transfers), default=0)
    te = te.with_horizon(horizon, f"{windows} windows of {length} epochs")
    notes = [f"rounds: {windows} windows of {length} epochs (look-ahead {max(te.arrival)}), "
             f"{horizon} epochs of {te.tau * 1e6:.4g} us; lower bound {lower} epochs"
             + (f"; {greedy_windows} windows kept the greedy schedule (time limit)" if greedy_windows else "")]
    if reduced is not None:
        transfers, note = SYMMETRY.invert(reduced, topo, te, transfers, state.chunk_ids)
        notes.append(note)
    else:
        notes.append("no symmetry used")
        clash = capacity_violations(topo, te, transfers)
        if clash:  # the state carried between windows lost some link occupancy: a bug
            raise CompileError(f"rounds: the concatenated windows overload a link: {clash[0]} (please report)")
    status = "time_limit" if timed_out else "feasible"
    return Schedule(demand, topo.name, tuple(order_within_epochs(topo, transfers)), te.tau, horizon, "rounds",
                    status, None, time.perf_counter() - t0, notes=tuple(notes))


def _window(topo, demand, options, te, state: _State, dist, sym, epoch: int, length: int, lower: int, left: float,
            number: int) -> tuple[Model, list[Transfer], str, bool, bool]:
    """Window `number`, from the state at `epoch`: the greedy schedule, improved by the solver in
    its share of the `left` seconds where there is time. Returns (the window's model, its transfers
    at the window's own epochs, how it was solved, whether the solver found a solution (else the
    greedy schedule is kept), whether it proved it optimal)."""
    expected = max(1, math.ceil((lower - epoch) / length)) + 1
    share = min(left, max(left / expected, 1.0), max(MAX_WINDOW_SHARE * left, 1.0))
    start = state.start(epoch, length)
    try:
        model = build(topo, demand, te, length, options.multicast, sym=sym, start=start, copies=True)
    except InfeasibleError:
        raise InfeasibleError(f"rounds: no route reaches the {state.needs()} deliveries still outstanding "
                              f"after epoch {epoch}") from None
    ctg = CostToGo(model, start, state.dst, dist)
    problem = ctg.problem(model)
    warm = warm_start(model, topo, greedy(model, start, topo, te, state, epoch), ctg)
    first = set_values(problem, warm)  # the variables now hold the greedy schedule
    res = None
    if left > MIN_SOLVE:
        res = solve(problem, time_limit=share, gap=options.gap, warm=warm, verbose=options.verbose,
                    progress=options.progress, label=f"window {number}: ", deadline=options.deadline)
    if res is not None and res.has_solution:
        how = (f"{res.status}, {res.seconds:.1f} s, objective {res.objective:.6g} from the greedy's {first:.6g}, "
               f"bound {res.bound:.6g}")
        return model, extract(model, topo, te), how, True, res.status == "optimal"
    set_values(problem, warm)  # out of time: the window keeps its greedy schedule
    return model, extract(model, topo, te), f"greedy only, objective {first:.6g}", False, False


def greedy(model: Model, start: Start, topo: Topology, te: TimeExpansion, state: _State, t0: int) -> list[Transfer]:
    """A quick schedule for one window (list scheduling, the solver's starting point): needs
    (chunk q, GPU d) are served in order of their earliest possible arrival, each by the route
    and start epoch that minimise arrival + the route's link time (epochs each link is tied up
    per chunk, so a bottleneck link is spent only where it gains time), within free capacity;
    ties go to senders that have held the chunk longest (chains of relays gather the latency the
    epochs round away), then to pairs of GPUs that already exchange data (each peer costs thread
    blocks in the lowering).
    A GPU that will hold q serves later needs from the epoch its copy lands. The plan runs one
    window beyond this one, of which only the transfers that start in this window are kept: a
    need that is better served early in the next window is left to it rather than sent at the
    end of this one along a worse route.
    (Over 60 lines: one list-scheduling loop over shared arrays, the link load, who holds what
    from when, the estimates and the heap, which every step reads and updates.)"""
    table, dist = distances(topo, te)
    K = model.horizon
    H = 2 * K  # planned epochs (the next window too)
    nl = len(topo.links)
    window, cap = np.array(te.window), np.array(te.capacity)
    dst, pair, peers = state.dst, state.pair, state.peers.copy()
    orbit, mult = link_orbits(state.link_images, nl)  # one load row per orbit; a flow on l loads it mult[l] times
    load = np.zeros((nl, H), dtype=np.int64)
    load[orbit, :K] = start.busy[orbit]
    big = INF
    ready = np.where(start.held, 0, np.where(start.landing > 0, start.landing, big))
    age = np.where(start.held, state.since - t0, ready)  # epoch each holder got its copy (may be < 0)
    need = dst & ~start.held & (start.landing == 0)
    links = table.links
    hop_ok = links >= 0
    cost = np.where(hop_ok, (window / cap)[links], 0.0).sum(axis=1)
    by_last = np.argsort(table.last, kind="stable")
    bounds = np.searchsorted(table.last[by_last], np.arange(topo.ngpus + 1))
    epochs = np.arange(H)
    est = np.full(need.shape, big, dtype=np.int64)
    qs, ds = np.nonzero(need)
    if len(qs):
        est[qs, ds] = np.minimum((ready[:, :, None] + dist[None]).min(axis=1), big)[qs, ds]
    heap = [(float(est[q, d]), int(q), int(d)) for q, d in zip(qs, ds) if est[q, d] < big]
    heapq.heapify(heap)
    done = np.zeros(need.shape, dtype=bool)
    used = np.zeros((len(need), nl, H), dtype=bool)
    single = model.upper == 1  # links that start one copy of q per epoch at most (F binary)
    out = []
    while heap:
        key, q, d = heapq.heappop(heap)
        if done[q, d]:
            continue
        ps = by_last[bounds[d]:bounds[d + 1]]
        first = ready[q, table.first[ps]]
        ps, first = ps[first < H], first[first < H]
        if len(ps) == 0:
            continue
        free = _free_starts(links[ps], load, orbit, mult, cap, window, used[q], single)
        free &= epochs[None, :] >= first[:, None]
        ok = free.any(axis=1)
        if not ok.any():
            continue
        s = np.where(ok, free.argmax(axis=1), H)
        fresh = ~peers[pair[table.first[ps], d]]
        late = LATE_HOLDER * (age[q, table.first[ps]] + t0) / (t0 + H)
        score = np.where(ok, s + table.arrival[ps] + cost[ps] + late + NEW_PEER * fresh, np.inf)
        best = int(np.argmin(score))
        if heap and score[best] > heap[0][0] + 1e-9:
            heapq.heappush(heap, (float(score[best]), q, d))
            continue
        p, k = int(ps[best]), int(s[best])
        arrive = k + int(table.arrival[p])
        path = [int(l) for l in links[p] if l >= 0]
        for l in path:
            load[orbit[l], k:min(k + window[l], H)] += mult[l]
            used[q, l, k] = True
        done[q, d] = True
        ready[q, d] = age[q, d] = arrive
        peers[pair[table.first[p], d]] = True
        if k < K:
            vertices = (topo.links[path[0]].src,) + tuple(topo.links[l].dst for l in path)
            out.append(Transfer(model.chunk_ids[q], vertices[0], d, vertices, k, arrive))
        closer = need[q] & ~done[q] & (arrive + dist[d] < est[q])
        for d2 in np.nonzero(closer)[0]:
            est[q, d2] = arrive + dist[d, d2]
            heapq.heappush(heap, (float(est[q, d2]), q, int(d2)))
    return out


def _free_starts(paths: np.ndarray, load: np.ndarray, orbit: np.ndarray, mult: np.ndarray, cap: np.ndarray,
                 window: np.ndarray, used: np.ndarray, single: np.ndarray) -> np.ndarray:
    """(paths, H) bool: the epochs in which a copy of one chunk may start along each path (rows of
    link ids, -1 padded): every link has room for it over its window under `load` (links, H; per
    orbit), and no link that starts one copy per epoch (`single`) already carries this chunk then
    (`used`, links x H)."""
    H = load.shape[1]
    epochs = np.arange(H)
    free = np.ones((len(paths), H), dtype=bool)
    for h in range(paths.shape[1]):
        l = paths[:, h]
        on = l >= 0
        if not on.any():
            continue
        lo = l[on]
        blocked = (load[orbit[lo]] + mult[lo, None] > cap[lo, None]).astype(np.int64)
        cum = np.concatenate([np.zeros((len(lo), 1), dtype=np.int64), np.cumsum(blocked, axis=1)], axis=1)
        end = np.minimum(epochs[None, :] + window[lo, None], H)
        free[on] &= ((np.take_along_axis(cum, end, axis=1) - cum[:, :H]) == 0) & ~(used[lo] & single[lo, None])
    return free
