"""Planning one job on what the jobs before it left: its transfers placed in continuous time on the
shared links, each at the earliest moment every link of a route is free for as long as it needs.

This is the decomposition the joint planner uses (compiler/jobs/plan.py): jobs in priority order,
each job's own plan (chunks, relays, schedule order) kept, its transfers re-timed and, where the
view offers several routes, re-routed onto the one that delivers first. The times follow the
schedule simulator's model (a transfer holds its route's links for bytes / the slowest bandwidth
and delivers the route's alpha later; a link with parallel count c carries c transfers at once);
unlike the simulator, a later transfer may use a gap an earlier one left (the links are shared with
other jobs, whose order no schedule fixes).
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from dataclasses import dataclass, replace

from compiler.jobs.view import JobView
from compiler.model.demand import Demand
from compiler.model.schedule import Schedule, Transfer
from compiler.model.topology import Topology

EPS = 1e-12


class Timeline:
    """Busy intervals per directed link of the shared topology, sorted by start."""

    def __init__(self, topo: Topology):
        self.topo = topo
        self.starts: list[list[float]] = [[] for _ in topo.links]
        self.ends: list[list[float]] = [[] for _ in topo.links]
        self.longest = [0.0] * len(topo.links)

    def _blocked_until(self, link: int, start: float, hold: float) -> float | None:
        """None if `link` has a free slot over [start, start + hold), else a later start to try."""
        starts, ends = self.starts[link], self.ends[link]
        lo = bisect_left(starts, start - self.longest[link] - EPS)
        hi = bisect_left(starts, start + hold - EPS)
        over = [ends[i] for i in range(lo, hi) if ends[i] > start + EPS]
        if len(over) < self.topo.links[link].count:
            return None
        return min(over)

    def earliest(self, links: tuple[int, ...], start: float, hold: float) -> float:
        moved = True
        while moved:
            moved = False
            for l in links:
                later = self._blocked_until(l, start, hold)
                if later is not None:
                    start, moved = later, True
        return start

    def take(self, links: tuple[int, ...], start: float, hold: float) -> None:
        for l in links:
            i = bisect_right(self.starts[l], start)
            self.starts[l].insert(i, start)
            self.ends[l].insert(i, start + hold)
            self.longest[l] = max(self.longest[l], hold)


@dataclass(frozen=True)
class Placement:
    """A job's transfers on the shared links: its schedule re-timed (and perhaps re-routed) in
    the job's own epochs, and per transfer its start and delivery in seconds."""
    schedule: Schedule
    starts: tuple[float, ...]
    ends: tuple[float, ...]
    links: frozenset[int]  # shared-topology links the job uses


class Holdings:
    """When each rank holds the value a transfer of a job's schedule sends, transfer by transfer in
    schedule order (the rules of compiler/model/schedule.py, in seconds): a source holds its chunk
    from `release`, as it holds an own contribution; another rank from the delivery that shaped its
    value; a swap sends the value its sender had before the chunk's swap reached it."""

    def __init__(self, demand: Demand, release: float):
        self.reduce, self.release = demand.reduce, release
        self.ready = {(c.id, s): release for c in demand.chunks for s in c.sources}
        self.before_swap: dict[tuple[int, int], float] = {}

    def held(self, t: Transfer) -> float:
        key = (t.chunk, t.src)
        if t.own:
            return self.release
        if t.swap and key in self.before_swap:
            return self.before_swap[key]
        return self.ready.get(key, self.release)

    def delivered(self, t: Transfer, end: float) -> None:
        key, ready = (t.chunk, t.dst), self.ready
        if t.swap and key not in self.before_swap:
            self.before_swap[key] = ready.get(key, self.release)
        if not self.reduce:
            ready[key] = min(ready.get(key, end), end)
        elif t.reduce:
            ready[key] = max(ready.get(key, self.release), end)
        else:
            ready[key] = end


def place(timeline: Timeline, view: JobView, schedule: Schedule, release: float, reroute: bool = True) -> Placement:
    """Place `schedule` (planned on the job's view) after the timeline's transfers, from `release`."""
    topo, local, demand = timeline.topo, view.topology, schedule.demand
    holdings = Holdings(demand, release)
    placed: list[tuple[float, float, int, Transfer]] = []
    used: set[int] = set()
    for i, t in enumerate(schedule.transfers):
        at = holdings.held(t)
        routes = local.paths(t.src, t.dst) if reroute else (t.path,)
        best = None
        for path in routes or (t.path,):
            g = view.to_global(path)
            links = topo.path_links(g)
            hold = demand.chunk_bytes / topo.path_bandwidth(g)
            start = timeline.earliest(links, at, hold)
            end = start + hold + topo.path_alpha(g)
            if best is None or end < best[0] - EPS:
                best = (end, start, hold, links, path)
        end, start, hold, links, path = best
        timeline.take(links, start, hold)
        used.update(links)
        holdings.delivered(t, end)
        placed.append((start, end, i, replace(t, path=path)))
    if not demand.reduce:  # a reduction keeps its order: it says which partials a transfer carries
        placed.sort(key=lambda x: (x[0], x[2]))
    tau = schedule.tau
    transfers = []
    for start, end, _, t in placed:
        k = int(round((start - release) / tau))
        transfers.append(replace(t, start=k, arrive=max(k + 1, int(round((end - release) / tau)))))
    epochs = max((t.arrive for t in transfers), default=0)
    retimed = replace(schedule, transfers=tuple(transfers), epochs=epochs)
    return Placement(retimed, tuple(p[0] for p in placed), tuple(p[1] for p in placed), frozenset(used))
