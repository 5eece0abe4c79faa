"""Timelines for `msccl-compile report`: when each link is busy in a schedule and in a program, what
each thread block of a program does over time, and where the program waits.

Only the two timers' public outputs are read, never their insides:
- a schedule: simulate()'s Metrics (`starts`, `ends` per transfer in schedule order). A transfer
  holds the links of its path from its start for the hold of links.ideal_transfer and delivers at
  its end; a multicast member does not take again the links its group already holds.
- a program: time_program()'s trace of the kernel's first loop iteration, (rank, tb, step) ->
  (start, ready, hold end, done) of every send. A send holds the links of the topology's best
  path between its ranks from `start` to its hold end; its thread block moves on at `done` (the
  protocol's step latency later) and its data arrives alpha after that. The rest is replayed from
  the trace: messages are matched first in, first out per connection (src, dst, channel); a step
  is ready when its thread block's previous step is done, its dependency is done and (a receive)
  its message has arrived; a copy or local reduction holds its block for its bytes at the timer's
  local rate (Costing.local_rate), a nop takes no time.

The replay checks itself against the timer: every send's replayed ready time must be the trace's,
and the last arrival the timer's finish of the first iteration. `ProgramTimeline.mismatches` counts the sends where not
(a timer whose costs the replay does not know), and the report says so rather than guess.

A thread block's time splits into busy (holding links for a send, or copying), waiting for data (its message
or dependency), waiting for a link (ready, but every slot of a link on the path is taken) and done
(after its last step, until the program finishes); the four add up to the program's time.
"""

from __future__ import annotations

import math
from collections import defaultdict, deque
from dataclasses import dataclass

from compiler.analysis.links import Costing, ideal_transfer, path_kind
from compiler.analysis.simulate import Metrics
from compiler.model.program import RECVS, SENDS, Program
from compiler.model.schedule import Schedule
from compiler.model.topology import Topology
from compiler.program.timing import LOCALS, ProgramTiming, time_program

StepKey = tuple[int, int, int]  # (rank, tb id, step index)


@dataclass(frozen=True)
class Busy:
    """One hold of one link."""
    link: int
    start: float
    end: float
    src: int  # the sending rank
    dst: int  # the receiving rank
    what: str  # "transfer 12" (a schedule) or "rank 0 tb 2 step 5" (a program)


@dataclass(frozen=True)
class ScheduleTimeline:
    finish: float
    busy: tuple[Busy, ...]
    mismatches: int = 0  # transfers whose recomputed hold does not match the simulator's delivery


@dataclass(frozen=True)
class StepTime:
    rank: int
    tb: int
    step: int
    type: str
    peer: int  # the send peer of a send, the receive peer of a receive, -1 for local steps
    chan: int
    clock: float  # when the thread block's previous step was done
    ready: float  # when it could start: previous step, dependency and message all done
    start: float  # when it started (a send: when every link of its path had a free slot)
    end: float  # when it was done (a send: the protocol's step latency after its hold)
    waited_for: str  # what set `ready` when the step waited for data, else ""
    after: StepKey | None  # the step whose end set this one's start (critical path), None at t = 0
    links: tuple[int, ...] = ()  # a send's path
    link_wait_on: int | None = None  # a send that waited for a link: the link
    released: float | None = None  # a send: when its hold on the links ended (None: at `end`)

    @property
    def key(self) -> StepKey:
        return (self.rank, self.tb, self.step)

    @property
    def data_wait(self) -> float:
        return self.ready - self.clock

    @property
    def link_wait(self) -> float:
        return self.start - self.ready

    @property
    def busy(self) -> float:
        return self.end - self.start


@dataclass(frozen=True)
class TbTime:
    rank: int
    tb: int
    send: int
    recv: int
    chan: int
    nsteps: int
    busy: float
    data_wait: float
    link_wait: float
    done: float  # from its last step's end to the program's finish

    @property
    def label(self) -> str:
        return f"r{self.rank} tb{self.tb}"


@dataclass(frozen=True)
class ProgramTimeline:
    finish: float
    timing: ProgramTiming
    steps: dict[StepKey, StepTime]
    busy: tuple[Busy, ...]
    tbs: tuple[TbTime, ...]
    last: StepKey | None  # the step whose end (plus alpha, for a send) is the finish
    mismatches: int = 0  # sends whose replayed ready time is not the trace's (and a finish that differs)


@dataclass(frozen=True)
class LinkRow:
    """One link in the plan and in the program."""
    link: int
    name: str
    count: int
    plan_busy: float | None  # seconds during which it carries at least one transfer; None without a schedule
    plan_end: float | None  # when its last hold ends
    prog_busy: float  # seconds during which it carries at least one send (not summed over lanes)
    prog_end: float
    prog_wait: float  # seconds sends waited for this link
    prog_waits: int  # how many sends waited for it

    @property
    def late(self) -> float | None:
        """How much later the program is done with this link than the plan."""
        if self.plan_end is None:
            return None
        return self.prog_end - self.plan_end


def link_name(topo: Topology, link: int) -> str:
    l = topo.links[link]
    return f"{topo.vertex_name(l.src)}\u2192{topo.vertex_name(l.dst)}"


def _eps(scale: float) -> float:
    return 1e-9 * scale + 1e-18


# ---- schedules --------------------------------------------------------------------------------------


def schedule_timeline(topo: Topology, schedule: Schedule, metrics: Metrics,
                      protos: tuple[str | None, ...] = (None,)) -> ScheduleTimeline:
    """The link holds of `schedule` as the simulator timed it (metrics from simulate()). The hold is
    recomputed with the costs of the first of `protos` (None: alpha-beta) that reproduces every
    delivery time; with none, the first is used and the mismatches are counted."""
    transfers = schedule.transfers
    if len(metrics.starts) != len(transfers):
        raise ValueError("schedule_timeline: the metrics carry no per-transfer times for this schedule")
    nbytes = schedule.demand.chunk_bytes
    eps = _eps(metrics.finish_time_s)
    paths: dict[tuple[int, ...], tuple[tuple[int, ...], float, float, str]] = {}
    best: tuple[int, list[Busy]] | None = None
    for proto in protos:
        costing = Costing.of(topo, proto)
        busy: list[Busy] = []
        held: dict[int, set[int]] = defaultdict(set)
        bad = 0
        for i, (t, start, end) in enumerate(zip(transfers, metrics.starts, metrics.ends)):
            if t.path not in paths:
                ids = topo.path_links(t.path)
                paths[t.path] = (ids, min(topo.links[l].bandwidth for l in ids),
                                 sum(topo.links[l].alpha for l in ids), path_kind(topo, ids))
            ids, bw, alpha, kind = paths[t.path]
            hold, latency = ideal_transfer(costing, nbytes, bw, alpha, kind, nbytes)
            if abs(start + hold + latency - end) > eps:
                bad += 1
            take = ids
            if t.group >= 0:
                shared = 0
                while shared < len(ids) and ids[shared] in held[t.group]:
                    shared += 1
                take = ids[shared:]
                held[t.group].update(take)
            busy.extend(Busy(l, start, start + hold, t.src, t.dst, f"transfer {i}") for l in take)
        if best is None or bad < best[0]:
            best = (bad, busy)
        if bad == 0:
            break
    bad, busy = best if best is not None else (0, [])
    return ScheduleTimeline(metrics.finish_time_s, tuple(busy), bad)


# ---- programs ---------------------------------------------------------------------------------------


def program_timeline(program: Program, topo: Topology, size_bytes: float) -> ProgramTimeline:
    """Time `program` (size_bytes: one call's bytes, as time_program takes them) with a trace and
    replay it into steps, link holds and thread-block totals. Long: the replay shares its state
    (sends, link holds, clocks) across four passes that are only ever run together."""
    trace: dict = {}
    timing = time_program(program, topo, size_bytes, trace)
    costing = Costing.of(topo, timing.proto)  # a link carries this many thread-block lanes at once
    finish = timing.finish_time_s
    local_hold = timing.chunk_bytes / timing.iterations / costing.local_rate(topo)  # per chunk of a cpy or re
    eps = _eps(finish)
    tbs = [(g.rank, tb) for g in program.gpus for tb in g.tbs]
    order = {(rank, tb.id): i for i, (rank, tb) in enumerate(tbs)}
    routes: dict[tuple[int, int], tuple[tuple[int, ...], float]] = {}

    def route(a: int, b: int) -> tuple[tuple[int, ...], float]:
        if (a, b) not in routes:
            p = topo.best_path(a, b)
            routes[(a, b)] = (topo.path_links(p), topo.path_alpha(p))
        return routes[(a, b)]

    # every send's hold, known from the trace alone
    sends: dict[StepKey, tuple[float, float, float, float]] = {}  # key -> (ready, start, hold end, done)
    by_conn: dict[tuple[int, int, int], list[StepKey]] = defaultdict(list)
    for rank, tb in tbs:
        for s, step in enumerate(tb.steps):
            if step.type not in SENDS:
                continue
            key = (rank, tb.id, s)
            got = trace.get(key)
            if got is None:
                raise ValueError(f"program_timeline: the timer's trace has no entry for send {key}")
            sends[key] = (float(got[1]), float(got[0]), float(got[2]), float(got[3]))
            by_conn[(rank, tb.send, tb.chan)].append(key)
    for keys in by_conn.values():  # the timer queues messages in the order it runs the sends
        keys.sort(key=lambda k: (sends[k][0], order[(k[0], k[1])], k[2]))

    # link holds, per link in start order
    busy: list[Busy] = []
    per_link: dict[int, list[tuple[float, float, StepKey]]] = defaultdict(list)
    tb_of = {(rank, tb.id): tb for rank, tb in tbs}
    for key, (ready, start, end, _) in sends.items():
        rank, tbid, s = key
        peer = tb_of[(rank, tbid)].send
        for l in route(rank, peer)[0]:
            busy.append(Busy(l, start, end, rank, peer, f"rank {rank} tb {tbid} step {s}"))
            per_link[l].append((start, end, key))
    for holds in per_link.values():
        holds.sort()

    def link_cause(key: StepKey, start: float, links: tuple[int, ...]) -> tuple[int | None, StepKey | None]:
        """The link whose slots were all taken just before `start`, and the send that freed one."""
        for l in links:
            held = [(a, b, k) for a, b, k in per_link[l] if k != key and a < start - eps and b > start - eps]
            link = topo.links[l]
            if len(held) >= link.count * costing.lanes(link.bandwidth, link.kind or "nvlink"):
                freed = min(held, key=lambda h: abs(h[1] - start))
                return l, freed[2]
        return None, None

    # replay every step in dependency order
    steps: dict[StepKey, StepTime] = {}
    done: dict[StepKey, float] = {}
    pc = [0] * len(tbs)
    clock = [0.0] * len(tbs)
    heads: dict[tuple[int, int, int], int] = defaultdict(int)
    waiting: dict[StepKey, list[int]] = defaultdict(list)
    pending = deque(i for i in range(len(tbs)) if tbs[i][1].steps)
    mismatches = 0
    while pending:
        i = pending.popleft()
        rank, tb = tbs[i]
        while pc[i] < len(tb.steps):
            s = pc[i]
            step = tb.steps[s]
            key = (rank, tb.id, s)
            ready, why, after = clock[i], "", ((rank, tb.id, s - 1) if s else None)
            if step.depid >= 0:
                dep = (rank, step.depid, step.deps)
                if dep not in done:
                    waiting[dep].append(i)
                    break
                if done[dep] > ready + eps:
                    ready, why, after = done[dep], f"its dependency (tb {step.depid} step {step.deps})", dep
            if step.type in RECVS:
                conn = (tb.recv, rank, tb.chan)
                queue = by_conn.get(conn, [])
                if heads[conn] >= len(queue):
                    raise ValueError(f"program_timeline: rank {rank} tb {tb.id} step {s} receives a message "
                                     "the trace never sends")
                msg = queue[heads[conn]]
                arrival = sends[msg][3] + route(tb.recv, rank)[1]
                if arrival > ready + eps:
                    ready, why, after = arrival, f"the message from rank {tb.recv} (ch {tb.chan})", msg
                heads[conn] += 1
            ready = max(ready, clock[i])
            links: tuple[int, ...] = ()
            wait_link = None
            if step.type in SENDS:
                traced_ready, start, _, end = sends[key]
                if abs(traced_ready - ready) > eps:
                    mismatches += 1
                links = route(rank, tb.send)[0]
                if start > ready + eps:
                    wait_link, freed = link_cause(key, start, links)
                    after = freed if freed is not None else after
            else:
                start = end = ready
                if step.type in LOCALS:
                    end = ready + step.cnt * local_hold
            peer = tb.send if step.type in SENDS else tb.recv if step.type in RECVS else -1
            steps[key] = StepTime(rank, tb.id, s, step.type, peer, tb.chan, clock[i], ready, start, end, why,
                                  after if (after is not None and start > 0) else None, links, wait_link,
                                  sends[key][2] if step.type in SENDS else None)
            done[key] = end
            clock[i] = end
            pc[i] += 1
            for j in waiting.pop(key, ()):
                pending.append(j)
    if len(steps) != sum(len(tb.steps) for _, tb in tbs):
        raise ValueError("program_timeline: the replay could not run every step (a dependency never done)")

    last, latest = None, 0.0
    for key, st in steps.items():
        t = st.end + (route(st.rank, st.peer)[1] if st.type in SENDS else 0.0)
        if last is None or t > latest:
            last, latest = key, t
    if abs(latest - timing.first_iteration_s) > eps:
        mismatches += 1

    totals = []
    for rank, tb in tbs:
        mine = [steps[(rank, tb.id, s)] for s in range(len(tb.steps))]
        end = mine[-1].end if mine else 0.0
        totals.append(TbTime(rank, tb.id, tb.send, tb.recv, tb.chan, len(mine),
                             busy=sum(st.busy for st in mine), data_wait=sum(st.data_wait for st in mine),
                             link_wait=sum(st.link_wait for st in mine), done=max(0.0, finish - end)))
    return ProgramTimeline(finish, timing, steps, tuple(busy), tuple(totals), last, mismatches)


# ---- comparisons ------------------------------------------------------------------------------------


def link_rows(topo: Topology, program: ProgramTimeline | None, plan: ScheduleTimeline | None) -> list[LinkRow]:
    """Every link either side uses, in link order."""
    def sums(busy):  # per link: seconds with at least one hold (holds overlap: lanes, parallel links), last end
        holds: dict[int, list[tuple[float, float]]] = defaultdict(list)
        for b in busy:
            holds[b.link].append((b.start, b.end))
        total: dict[int, float] = {}
        last: dict[int, float] = {}
        for link, spans in holds.items():
            covered, reach = 0.0, -math.inf
            for start, end in sorted(spans):
                if end > reach:
                    covered += end - max(start, reach)
                    reach = end
            total[link], last[link] = covered, reach
        return total, last

    p_busy, p_end = sums(program.busy) if program else ({}, {})
    s_busy, s_end = sums(plan.busy) if plan else ({}, {})
    wait: dict[int, float] = defaultdict(float)
    waits: dict[int, int] = defaultdict(int)
    for st in (program.steps.values() if program else ()):
        if st.link_wait_on is not None:
            wait[st.link_wait_on] += st.link_wait
            waits[st.link_wait_on] += 1
    rows = []
    for l in sorted(set(p_busy) | set(s_busy)):
        rows.append(LinkRow(l, link_name(topo, l), topo.links[l].count,
                            s_busy.get(l, 0.0) if plan else None, s_end.get(l, 0.0) if plan else None,
                            p_busy.get(l, 0.0), p_end.get(l, 0.0), wait.get(l, 0.0), waits.get(l, 0)))
    return rows


def worst_link_waits(program: ProgramTimeline, n: int = 12) -> list[StepTime]:
    """The sends that waited longest for a link while ready."""
    waited = [st for st in program.steps.values() if st.link_wait > _eps(program.finish)]
    return sorted(waited, key=lambda st: (-st.link_wait, st.key))[:n]


def critical_path(program: ProgramTimeline, limit: int = 40) -> list[StepTime]:
    """The chain of steps that sets the finish time, first to last: from the step that finishes
    last, back through whatever made each one start when it did (its thread block's previous
    step, its dependency, the message it waited for, or the send that freed its link). Steps that
    neither waited nor took time are left out; at most `limit` steps, the last ones."""
    chain: list[StepTime] = []
    key = program.last
    seen = set()
    while key is not None and key not in seen:
        seen.add(key)
        st = program.steps[key]
        chain.append(st)
        key = st.after
    chain.reverse()
    eps = _eps(program.finish)
    kept = [st for st in chain if st.busy > eps or st.link_wait > eps or st.data_wait > eps]
    return kept[-limit:]
