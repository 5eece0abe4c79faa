"""The judge of schedules: continuous time under the alpha-beta model (ARCHITECTURE.md, "Modelling rules").

Epochs play no part here except through the schedule order (the order of `Schedule.transfers`):
- a directed link with parallel count c serves at most c transfers at once, and gives its slots to
  transfers in schedule order (a transfer cannot take a slot before every earlier one has);
- a transfer of b bytes starts when its source holds the chunk and every link of its path has a free
  slot, holds those slots for b / (slowest bandwidth on the path) and delivers alpha (the path's sum,
  charged once) after that;
- transfers sharing a `group` >= 0 are one switch multicast: links an earlier member already holds
  are not taken again, and the branch point must be a switch marked multicast.

Holding: a source holds its chunk at t = 0; another rank holds it from the delivery of the first
transfer into it earlier in schedule order. Reductions follow the Schedule docstring: a rank's value
of a chunk is a set of contributions; a reduce transfer sends the sender's current value (its own
contribution plus earlier reduce transfers into it) and the receiver adds it; a copy replaces the
receiver's value; an `own` reduce transfer sends the sender's contribution alone, held from t = 0;
a `swap` one sends the value the sender had before the chunk's first swap transfer into it.
The value is ready at the latest delivery that shaped it.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass
from functools import lru_cache

from compiler.analysis.bounds import Bound, bound_for, busbw, lower_bound
from compiler.analysis.links import Costing, ideal_transfer, path_kind, runtime_floor
from compiler.model.demand import Demand
from compiler.specs.collectives import CUSTOM
from compiler.specs.errors import CompileError
from compiler.model.schedule import Schedule, Transfer, swap_groups
from compiler.model.topology import Topology
from compiler.gcpause import without_gc


class ScheduleError(CompileError):
    """A schedule that breaks causality, uses a path the topology lacks, or leaves a need unmet."""


@dataclass(frozen=True)
class Metrics:
    finish_time_s: float  # latest delivery that meets a need
    algbw: float  # demand.size_bytes / finish, B/s
    busbw: float  # nccl-tests bus bandwidth
    lower_bound_s: float
    bound_ratio: float  # lower bound / finish: 1.0 is optimal
    binding: str  # what sets the lower bound
    output_buffer_bytes: float  # per rank
    scratch_bytes: float  # per rank, worst rank: relayed chunks that are not in its output
    ntransfers: int
    link_busy_max: float  # highest (slot-seconds busy) / (count x finish) over links
    starts: tuple[float, ...] = ()  # per transfer, schedule order
    ends: tuple[float, ...] = ()  # per transfer: delivery time

    def to_dict(self, per_transfer: bool = False) -> dict:
        d = dict(self.__dict__)
        if per_transfer:
            d["starts"], d["ends"] = list(self.starts), list(self.ends)
        else:
            del d["starts"], d["ends"]
        return d

    @classmethod
    def from_dict(cls, d: dict) -> "Metrics":
        return cls(**{**d, "starts": tuple(d.get("starts", ())), "ends": tuple(d.get("ends", ()))})


def program_floor(topo: Topology, bound: Bound, proto: str | None = None) -> float:
    """The bound a program is held to: the alpha-beta bound plus what every program of the runtime
    cost model pays at least (links.runtime_floor); the alpha-beta bound without costs. proto: what
    every program of that protocol takes at least (no less than its ideal program, simulate)."""
    floor = runtime_floor(topo, bound.latency_s, bound.bandwidth_s, bound.alpha_s, bound.chain_s,
                          (bound.across_s, bound.across_alpha_s), proto)
    return bound.time_s if floor is None else max(bound.time_s, floor)


class Ideals:
    """Each protocol's ideal program time (simulate), simulated only when a question needs it: a
    protocol whose floor (program_floor) already answers is not simulated (one simulation of 1,024
    GPUs takes 8-9 s, and at 1 GB LL's and LL128's floors are above Simple's ideal program).
    eager: simulate every one now (cheap below LARGE programs, and their notes cite each ideal)."""

    def __init__(self, topology: Topology, schedule: Schedule, protos: tuple[str, ...], eager: bool = False):
        self.topology, self.schedule, self.protos = topology, schedule, protos
        bound = bound_of(topology, schedule.demand)
        self.floor = {p: program_floor(topology, bound, p) for p in protos}
        self.known: dict[str, float] = {}
        if eager:
            for p in protos:
                self[p]

    @classmethod
    def given(cls, times: dict[str, float]) -> "Ideals":
        """Ideals whose programs' times are known already (`times`): nothing is simulated."""
        ideals = cls.__new__(cls)
        ideals.topology = ideals.schedule = None
        ideals.protos, ideals.floor, ideals.known = tuple(times), dict(times), dict(times)
        return ideals

    def __getitem__(self, proto: str) -> float:
        if proto not in self.known:
            self.known[proto] = simulate(self.topology, self.schedule, proto).finish_time_s
        return self.known[proto]

    def at_least(self, proto: str) -> float:
        """Its ideal program's time where simulated, else its floor."""
        return self.known.get(proto, self.floor[proto])

    def below(self, proto: str, seconds: float) -> bool:
        """Whether its ideal program is faster than `seconds` (simulated only if its floor is)."""
        return self.at_least(proto) < seconds and self[proto] < seconds

    def ranked(self) -> tuple[str, ...]:
        """The protocols by ideal program, the best first: in the order of their floors, each
        simulated while its floor is below the best ideal so far; the rest follow by floor (their
        ideals are no better than the first's). Ties keep the order given."""
        order = sorted(self.protos, key=lambda p: (self.floor[p], self.protos.index(p)))
        for p in order:
            if self.known and self.floor[p] >= min(self.known.values()):
                break
            self[p]
        return tuple(sorted(self.protos, key=lambda p: (p not in self.known, self.at_least(p),
                                                         self.protos.index(p))))


def best_ideal(topology: Topology, schedule: Schedule, protos: tuple[str, ...]) -> Metrics:
    """The ideal program of the protocol whose ideal is fastest (the first of `protos` on a tie),
    simulating only the protocols whose floor leaves them in question (Ideals)."""
    return simulate(topology, schedule, Ideals(topology, schedule, protos).ranked()[0])


def bound_of(topo: Topology, demand: Demand) -> Bound:
    if demand.collective == CUSTOM:
        return _custom_bound(topo, demand)
    # the bound depends on the collective and size, not on how the buffer is cut into chunks
    return _standard_bound(topo, demand.collective, demand.size_bytes, demand.root)


@lru_cache(maxsize=64)
def _standard_bound(topo: Topology, collective: str, size: int, root: int | None) -> Bound:
    return lower_bound(topo, collective, size, root)


@lru_cache(maxsize=16)
def _custom_bound(topo: Topology, demand: Demand) -> Bound:
    return bound_for(topo, demand)


class _Paths:
    """Checked paths: (link ids, slowest bandwidth, alpha), computed once per distinct path."""

    def __init__(self, topo: Topology):
        self.topo = topo
        self.cache: dict[tuple[int, ...], tuple[tuple[int, ...], float, float]] = {}

    def get(self, i: int, t: Transfer) -> tuple[tuple[int, ...], float, float]:
        hit = self.cache.get(t.path)
        if hit is not None and t.path[0] == t.src and t.path[-1] == t.dst:
            return hit
        topo, p = self.topo, t.path
        where = f"{_where(i, t)}: path {list(p)}"
        if len(p) < 2 or p[0] != t.src or p[-1] != t.dst:
            raise ScheduleError(f"{where} does not run from rank {t.src} to rank {t.dst}")
        inner = [v for v in p[1:-1] if not 0 <= v < topo.nvertices or topo.is_gpu(v)]
        if inner:
            raise ScheduleError(f"{where} passes through vertex {inner[0]}, which is not a switch")
        missing = [(a, b) for a, b in zip(p, p[1:]) if not topo.has_link(a, b)]
        if missing:
            raise ScheduleError(f"{where} uses link {missing[0][0]}->{missing[0][1]}, which {topo.name} lacks")
        ids = topo.path_links(p)
        hit = (ids, min(topo.links[l].bandwidth for l in ids), sum(topo.links[l].alpha for l in ids))
        self.cache[p] = hit
        return hit


def _check_transfer(i: int, t: Transfer, demand: Demand, chunk_ids: set[int]) -> None:
    if t.chunk not in chunk_ids:
        raise ScheduleError(f"{_where(i, t)}: chunk {t.chunk} is not in the {demand.collective} demand")
    for r in (t.src, t.dst):
        if not 0 <= r < demand.ngpus:
            raise ScheduleError(f"{_where(i, t)}: rank {r} is out of range (0..{demand.ngpus - 1})")
    if t.src == t.dst:
        raise ScheduleError(f"{_where(i, t)}: sends to itself")
    if t.reduce and not demand.reduce:
        raise ScheduleError(f"{_where(i, t)}: reduce transfer in a non-reduction demand ({demand.collective})")
    if t.own and not (t.reduce and t.src in _chunk(demand, t.chunk).sources):
        raise ScheduleError(f"{_where(i, t)}: sends rank {t.src}'s own contribution, but "
                            + ("it is no reduce transfer" if not t.reduce else f"rank {t.src} does not contribute"))


def _chunk(demand: Demand, cid: int):
    c = demand.chunks[cid] if cid < len(demand.chunks) else None
    return c if c is not None and c.id == cid else next(c for c in demand.chunks if c.id == cid)


def _where(i: int, t: Transfer) -> str:
    return f"transfer {i}: chunk {t.chunk} {t.src}->{t.dst}"


def _ranks(mask: int) -> list[int]:
    return [r for r in range(mask.bit_length()) if mask >> r & 1]


_RECENT: dict = {}  # (ids of transfers, demand, topology; proto) -> (those values, Metrics)
RECENT = 8  # simulations remembered: auto, realise and compile ask for the same one at up to 1M transfers


@without_gc
def simulate(topology: Topology, schedule: Schedule, proto: str | None = None) -> Metrics:
    """Time `schedule` on `topology` (as the ideal program of MSCCL protocol `proto`, with the
    profile's runtime costs, compiler/analysis/links.py; alpha-beta alone without one); raise
    ScheduleError if it is not causal or not complete. The last RECENT results are remembered
    (by the identity of the frozen values they came from, which the memo keeps alive)."""
    key = (id(schedule.transfers), id(schedule.demand), id(topology), proto)
    hit = _RECENT.get(key)
    if hit is not None:
        return hit[1]
    m = _simulate(topology, schedule, proto)
    if len(_RECENT) >= RECENT:
        del _RECENT[next(iter(_RECENT))]
    _RECENT[key] = ((schedule.transfers, schedule.demand, topology), m)
    return m


def _simulate(topology: Topology, schedule: Schedule, proto: str | None) -> Metrics:
    demand, topo = schedule.demand, topology
    costing = Costing.of(topo, proto)
    if demand.ngpus != topo.ngpus:
        raise ScheduleError(f"schedule: demand has {demand.ngpus} ranks, {topo.name} has {topo.ngpus} GPUs")
    dests = {c.id: frozenset(c.dests) for c in demand.chunks}  # a tuple's `in` was a scan of up to 1,023 ranks
    chunk_ids = set(dests)
    nbytes = demand.chunk_bytes
    paths = _Paths(topo)

    # state[(chunk, rank)] = (contributions bitmask, ready time); for copies the mask is just 1
    state: dict[tuple[int, int], tuple[int, float]] = {}
    for c in demand.chunks:
        for s in c.sources:
            state[(c.id, s)] = (1 << s if demand.reduce else 1, 0.0)

    slots = [[0.0] * l.count for l in topo.links]  # heap of free times per parallel link
    last_take = [0.0] * len(topo.links)
    busy = [0.0] * len(topo.links)
    groups: dict[int, tuple[int, int, dict[int, float]]] = {}  # id -> (chunk, src, link -> start)
    relayed: list[set[int]] = [set() for _ in range(topo.ngpus)]
    starts, ends = [], []
    costs: dict[tuple[int, ...], tuple[float, float]] = {}  # per path: ideal_transfer's (hold, latency)
    _, broken = swap_groups(schedule.transfers)
    if broken is not None:
        t = schedule.transfers[broken]
        raise ScheduleError(f"{_where(broken, t)}: a swap transfer must be a reduce transfer of the sender's value, "
                            "and no other transfer of its chunk may come between the chunk's swap transfers")
    before_swap: dict[tuple[int, int], tuple[int, float] | None] = {}  # (chunk, rank) -> its value before the swap

    for i, t in enumerate(schedule.transfers):
        _check_transfer(i, t, demand, chunk_ids)
        ids, bw, alpha = paths.get(i, t)
        key = (t.chunk, t.src)
        held = (1 << t.src, 0.0) if t.own else before_swap[key] if t.swap and key in before_swap else state.get(key)
        if held is None or held[0] == 0:
            raise ScheduleError(f"transfer {i}: chunk {t.chunk} {t.src}->{t.dst}: rank {t.src} does not hold "
                                f"chunk {t.chunk} (no earlier transfer delivers it)")
        payload, ready = held

        take = ids
        if t.group >= 0:
            take, ready = _multicast_links(i, t, ids, groups, topo, ready)
        start = ready
        for l in take:
            start = max(start, last_take[l], slots[l][0])
        cost = costs.get(t.path)
        if cost is None:
            cost = costs[t.path] = ideal_transfer(costing, nbytes, bw, alpha, path_kind(topo, ids), nbytes)
        hold, latency = cost
        for l in take:
            heapq.heapreplace(slots[l], start + hold)
            last_take[l] = start
            busy[l] += hold
        if t.group >= 0:
            for l in take:
                groups[t.group][2][l] = start
        done = start + hold + latency
        starts.append(start)
        ends.append(done)

        if t.dst not in dests[t.chunk]:
            relayed[t.dst].add(t.chunk)
        key = (t.chunk, t.dst)
        before = state.get(key)
        if t.swap and key not in before_swap:
            before_swap[key] = before
        if not demand.reduce:
            if before is None:
                state[key] = (1, done)
        elif t.reduce:
            if before is not None and before[0] & payload:
                twice = _ranks(before[0] & payload)
                raise ScheduleError(f"transfer {i}: chunk {t.chunk} {t.src}->{t.dst}: rank {t.dst} would count "
                                    f"the contribution of rank {twice[0]} twice")
            state[key] = (payload, done) if before is None else (before[0] | payload, max(before[1], done))
        else:
            state[key] = (payload, done)

    finish = _finish_time(demand, state) + (costing.launch if schedule.transfers else 0.0)
    bound = bound_of(topo, demand)
    floor = bound.time_s if costing.proto is None else program_floor(topo, bound)
    link_busy = max((b / (l.count * finish) for b, l in zip(busy, topo.links)), default=0.0) if finish else 0.0
    algbw = demand.size_bytes / finish if finish > 0 else float("inf")
    return Metrics(
        finish_time_s=finish,
        algbw=algbw,
        busbw=busbw(demand.collective, demand.ngpus, algbw),
        lower_bound_s=floor,
        bound_ratio=floor / finish if finish > 0 else 1.0,
        binding=bound.binding,
        output_buffer_bytes=demand.output_chunks * nbytes,
        scratch_bytes=max((len(r) for r in relayed), default=0) * nbytes,
        ntransfers=len(schedule.transfers),
        link_busy_max=link_busy,
        starts=tuple(starts),
        ends=tuple(ends),
    )


def _multicast_links(i: int, t: Transfer, ids: tuple[int, ...], groups: dict, topo: Topology,
                     ready: float) -> tuple[tuple[int, ...], float]:
    """Links this group member must take itself, and its ready time (not before the shared part)."""
    if t.group not in groups:
        groups[t.group] = (t.chunk, t.src, {})
        return ids, ready
    chunk, src, held = groups[t.group]
    if (chunk, src) != (t.chunk, t.src):
        raise ScheduleError(f"transfer {i}: chunk {t.chunk} {t.src}->{t.dst}: multicast group {t.group} "
                            f"already carries chunk {chunk} from rank {src}")
    shared = 0
    while shared < len(ids) and ids[shared] in held:
        shared += 1
    if shared:
        branch = topo.links[ids[shared - 1]].dst
        if shared < len(ids) and not topo.switch(branch).multicast:
            raise ScheduleError(f"transfer {i}: chunk {t.chunk} {t.src}->{t.dst}: multicast group {t.group} "
                                f"branches at {topo.vertex_name(branch)}, which cannot multicast")
        ready = max([ready] + [held[l] for l in ids[:shared]])
    return ids[shared:], ready


def _finish_time(demand: Demand, state: dict[tuple[int, int], tuple[int, float]]) -> float:
    finish = 0.0
    for c in demand.chunks:
        full = sum(1 << s for s in c.sources) if demand.reduce else 1
        for d in c.dests:
            if not demand.reduce and d in c.sources:
                continue
            got = state.get((c.id, d))
            if got is None:
                raise ScheduleError(f"schedule: chunk {c.id} never reaches rank {d}")
            if got[0] != full:
                missing = _ranks(full & ~got[0])
                extra = _ranks(got[0] & ~full)
                what = (f"lacks the contribution of rank{'s' if len(missing) > 1 else ''} {missing}" if missing
                        else f"holds contributions from non-contributors {extra}")
                raise ScheduleError(f"schedule: chunk {c.id} at rank {d} {what}")
            finish = max(finish, got[1])
    return finish
