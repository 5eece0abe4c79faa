"""Realise a schedule as the fastest program the runtimes accept: lower it with each protocol and
number of instances worth trying, time each program under the runtime cost model, keep the
fastest (the planned time is the ideal program's; this is what lowering achieves of it).

    realise(schedule, topology, options, runtime) -> Realisation

Protocols: the one asked for, or (`auto`) every protocol the profile enables (one that is BEHIND
times slower than the best at some number of instances is not lowered with more). Instances: the
number asked for, or (`auto`) 1, then the count that saturates the widest GPU link (its lanes + 1,
`saturating_counts`: the likeliest winner for large transfers), the counts that saturate the
other GPU links, largest first (the next likeliest where the first needs more thread blocks than
fit), then 2, 4, ... (`instance_order`). More instances give a transfer more thread blocks where
its link needs lanes to reach its bandwidth under the per-thread-block cap
(compiler/lowering/channels.lane_widths). The search goes on while a count still pays or the one
after it does (a step that splits chunks without filling a link can lose what the next one
gains) and while the runtimes' limits allow it; a count whose lowering would not finish in time
is passed over (a smaller one may still fit); it ends once a program is within `enough_s` (the
pipeline's --good-enough share of the program floor: no other could gain more than the rest), and,
given `stall` (auto's judging, where other candidates wait), once it has gone stall times as long
past its latest gain as that gain took to find.
Each count is lowered with lane-aware placement and, where it fits and time allows, first with
sends not paced at all (LowerOptions.pace off: small sends are latency-bound, and a paced link
serialises the step latencies the plan overlaps) and with one more run of sends in flight on each
paced link (LowerOptions.pace_ahead: 1, then 3 and 7 while a wider window pays), each with the
count's best protocol, then with every send and receive peer on a thread block of its own
(LowerOptions.pair_peers), with sends through a NIC gated by the receive planned just before them
(LowerOptions.gate_slow, where some path is slow), with a GPU pair's transfers over its
parallel links in turn across levels (LowerOptions.lanes_across, where that moves some transfer to
another lane and a chunk takes a thread block less than a step latency: MI250 reduce-scatter 10^6 B
milp/2ch at 5 instances, 54.1 -> 46.9 us with every peer on a block of its own; of 38 MI250 and
DGX-1 milp programs of 64 KB to 32 MB, 4 gained, all of them such; elsewhere it only cost lowering
time) and with every instance on its own channel
(LowerOptions.fit_lanes), then the best of each kind that paid together (`_placements`); from the
best, the descent and, where a path goes through a NIC, its connections on more channel groups in
turn, then with its send peers on blocks of their own (LowerOptions.fuse_slow, `_turns`), and, where
a chunk moves in less than a step latency on some link kind, its whole chunks over more channel
groups (LowerOptions.groups, `_spread`: a connection's block pays its steps' latencies one after
another), with the descent again where that paid. Where a
chunk takes several kernel iterations, one instance's placements wait until the other counts are
tried (more instances split such a chunk, and usually win), and are tried only if the most they
gained at another count would bring it within CONTENDS of the best; where a chunk moves in less
than one step latency on a thread block, the search skips the saturating counts. A count whose
lane-aware lowering needs more steps per thread block than the runtime allows is lowered with
every instance on its own channel, then also unpaced (fewer steps). A program of LARGE_PROGRAM
transfers or more is lowered at each count first with LEAD, every peer on a block of its own, one
more run in flight (3 where a chunk fits one kernel iteration), only the sends through a NIC
paced, and a NIC's connections on two channel groups in turn (where its blocks fit; what paid at
128 to 1,024 GPUs, where a single lowering can take the whole limit); it tries LEAD with the
other window (2 after 3, 3 after 1; from SPARE_CORE_PROGRAM transfers, where realise may use two
processes, lowered in a second one beside LEAD's first lowering, `_spare`), then pace_ahead
(k > 1), pair_peers and fit_lanes (k > 1), each keeping LEAD's NIC choices (where LEAD's blocks
fit at that count), then its sends unpaced where its chunks are latency-bound on some link kind
(first where on every kind; with each protocol whose ideal program beats its program), at its best count
only, in that order, after the search, and at one instance its whole chunks over more channel
groups (`_grouped`, with the run ahead of whichever LEAD window paid: where more
instances would split elements or not fit, a connection still gets several thread blocks); its
counts after the first are lowered for the first's fastest protocol only (at the first, from
AS_FIRST_PROGRAM transfers, another protocol only where its ideal program, plus what the first's
program lost to lowering scaled by their step latencies, would be faster), and its search runs to the deadline, not
SEARCH_SECONDS (one lowering and timing of 512 GPUs takes about 15 s). A limit that stops the
search is noted, never an error unless no program at all fits. One lowering serves every protocol
with the same connection slots (LL and LL128); the chosen program is verified by the caller.
"""

from __future__ import annotations

import copy
import time
from collections import OrderedDict
from dataclasses import dataclass, replace
from typing import Callable

from compiler.analysis.links import Costing, protocol_names
from compiler.analysis.simulate import Ideals
from compiler.lowering.channels import parallel_lanes
from compiler.lowering.lower import LowerOptions, TooManySteps, lower, transfer_levels
from compiler.model.demand import Demand, demand_chunks
from compiler.model.program import AUTO, PROTOCOLS, RECVS, SENDS, SLOTS, Program
from compiler.model.schedule import Schedule
from compiler.model.topology import Topology
from compiler.planners.background import Background
from compiler.program.timing import ProgramTiming, call_bytes, time_program
from compiler.specs.collectives import CUSTOM
from compiler.specs.errors import CompileError
from compiler.specs.runtimes import target_runtimes

MAX_INSTANCES = 32
PAYS = 0.98  # a doubling of instances must cut the time below this share of the best so far
PATIENCE = 2  # doublings in a row that do not pay before the search stops
BEHIND = 1.5  # a protocol this many times slower than the best at some instances is not tried with more
SEARCH_SECONDS = 30.0  # wall time after which no further doubling is tried (but for a LARGE_PROGRAM)
STALL_MIN_S = 5.0  # a search given `stall` goes on at least this long past its latest gain (a 10 s limit's
# searches are about that long: the stall is for the long ones)
STALL_LOWERING_S = 0.3  # nor is a search stalled whose first lowering and timing took less: it tries more in its
# time, and a gain late in its order is cheap to reach (DGX-2 x 2 allgather 16 MB: hier/2ch's 4 instances, 0.971 of
# the floor, came after its stall at 5 s: 0.957)
MAX_AHEAD = 7  # the widest pace_ahead window tried (1, then 3, then 7 while each pays)
MAX_TURNS = 8  # the most channel-group sets a NIC connection takes in turn in a small program's search (_placements)
MAX_GROUPS = 8  # the most channel groups one instance's whole chunks are spread over (_grouped)
SPREAD_GROUPS = (2, 3, 4, 6, 8)  # the channel groups a latency-bound small program's whole chunks are tried over (_spread)
CONTENDS = 1.2  # a count whose program is within this share of the best so far is tried with the pacing variants
LEAD = {"pair_peers": False, "pace_ahead": 1, "pace_fast": False, "rotate_slow": 2}  # a large program's first
# placement at each count (realise, _lead): pacing only the NICs (at 1,024 GPUs pacing the NVSwitch fan-out filled
# the XML node limit) and a NIC's connections on two channel groups in turn (chains forward to two peers)
IN_STEP = {"copies_apart": False}  # each copy first on its chunk's first send's block, the other sends waiting for it:
# timed with copies charged, DGX A100 x 16 allgather 1 GB at one instance took 4.977 ms so and 5.438 with copies apart
# (the sends, no longer in step, took the NICs in a worse order), and at 512 GPUs the waits' nops took LEAD past 64
# steps a block onto 2 channel groups (copies apart fit one: 0.741 of the floor, 0.939 so); elsewhere copies apart
# pay (DGX H100 x 2 allgather 256 MB at 4 instances: 626 us, 726 so; MI250 x 2 1 GB at one: 11.46 ms, 15.54 so). A
# large program tries it at one instance among its placements; from IN_STEP_PROGRAM transfers, where one lowering
# takes seconds and the limit leaves room for few, LEAD at one instance is lowered so (kept by every placement).
# What pays is the NIC sends' wait, not the copy: a NIC send of each kernel iteration then starts only once the
# copy's block has finished the iteration before, so the first sends of one iteration do not take the NIC ahead of
# the last of the one before (with the copy charged nothing, 4.873 ms at 128 GPUs). The copy's time in the first
# iteration is the cost; a free step to wait on would be a nop, and MSCCL lets no step wait on a nop (msccl-xml.md
# section 6), so the copy is the cheapest step there is. Finer chunks make it cheaper: hier/5ch's program, 4.935 ms
IN_STEP_PROGRAM = 40_000
AHEAD_IN_ONE_ITERATION = 3  # LEAD's runs ahead where a chunk fits one kernel iteration (_lead)
OTHER_WINDOW = {AHEAD_IN_ONE_ITERATION: 2, 1: AHEAD_IN_ONE_ITERATION}  # the window tried after LEAD's (_lead)
SPARE_CORE_PROGRAM = 40_000  # transfers from which LEAD's other window is lowered and timed in a second process
# beside LEAD's own, where realise may use two (below, auto's own second process may be planning beside it)
SPARE_PATIENCE = 1.5  # past the deadline, the spare is waited for until this many times LEAD's first lowering
AS_FIRST_PROGRAM = 40_000  # transfers from which a second protocol is lowered only where its ideal program, plus
# what the first's program lost to lowering scaled by their step latencies, would be faster (_time_all; one lowering
# takes tens of seconds; below, a first protocol far from its ideal, such as a ring alltoall in LL, is no guide to
# the others)
FINISH = 1.3  # verifying and writing a program (and simulating its schedule) take about this many times its
# lowering and timing (DGX H100 x 64 reduce-scatter 1 GB: 24 s after 19; DGX H100 x 8 allreduce 256 MB at 2
# instances: 4.5 s after 3.8)
GUESS_MOVES = 20_000  # moves (transfers x instances) up to which a count other than 1 is lowered past the deadline
LARGE_PROGRAM = 10_000  # transfers from which a protocol whose ideal program is no faster than a program
# already timed is not lowered and timed with several instances either (with one it never is: no one-instance
# program beats its ideal; with several, finer pieces can, a little, so below this they are all timed)


class _OutOfTime(Exception):
    """A count's next placement would not be lowered by the deadline (realise's `attempt`)."""


@dataclass(frozen=True)
class Realisation:
    program: Program
    timing: ProgramTiming
    instances: int
    tried: tuple[tuple[str, int, float], ...]  # (proto, instances, program time) of every program timed
    stopped: str | None = None  # why the instances stopped doubling, where a limit stopped them
    enough: str | None = None  # where the search stopped early because a program was good enough
    passed: tuple[tuple[str, float, bool], ...] = ()  # (proto, ideal program time, whether simulated: else its
    # floor, which the ideal is no faster than) of protocols never lowered: their ideal program was no faster than a
    # program timed already
    uneven: tuple[int, ...] = ()  # instance counts left out: the size does not split into their chunks
    element_bytes: int = 4
    estimated: bool = False  # a protocol whose ideal is faster may have been passed over by what the first lost

    def notes(self) -> tuple[str, ...]:
        """The choice and the runner-up, as the summary prints them."""
        p, k = self.program.proto, self.instances
        ranked = sorted(self.tried, key=lambda t: t[2])
        if len(ranked) == 1 and not self.passed and not self.uneven:
            return ()
        best = ranked[0][2]
        runner = next((t for t in ranked[1:] if (t[0], t[1]) != (p, k)), None)
        line = f"program: {p} with {k} instance{'s' if k > 1 else ''} ({best * 1e6:.1f} us)"
        if runner is not None:
            line += f"; runner-up {runner[0]} with {runner[1]} ({runner[2] * 1e6:.1f} us, {runner[2] / best:.2f}x)"
        elif self.passed:
            q, x, simulated = min(self.passed, key=lambda px: px[1])
            why = "is no faster" if x >= best else "is faster, but a program had reached the target" if self.enough \
                else (f"is faster, but not with what {p}'s program lost to lowering, scaled by their step latencies; "
                      "or the time limit came first" if self.estimated else "is faster, but the time limit came first")
            line += f"; runner-up {q}, not lowered (its ideal program, {x * 1e6:.1f} us, {why})" if simulated else \
                f"; runner-up {q}, not lowered (its ideal program is at least its floor, {x * 1e6:.1f} us)"
        uneven = () if not self.uneven else (
            f"instances: {', '.join(map(str, self.uneven))} left out: the size is not whole {self.element_bytes}-byte "
            "elements in each of their chunks, and the runtimes would run NCCL's own algorithm instead",)
        return (line,) + ((f"instances: {self.stopped}",) if self.stopped else ()) \
            + ((f"instances: stopped early, {self.enough}",) if self.enough else ()) + uneven


def protocols(topology: Topology, proto: str) -> tuple[str, ...]:
    if proto != AUTO:
        return (proto,)
    return tuple(p or "Simple" for p in protocol_names(topology))


def size_of(schedule: Schedule, program: Program) -> float:
    """The size a program is timed at: the schedule's (a custom demand's per chunk, as call_bytes takes it)."""
    demand = schedule.demand
    if program.collective != CUSTOM:
        return demand.size_bytes
    return call_bytes(program, demand_chunks(demand)[1])


def aimed_runtime(schedule: Schedule, runtime: str, vendor: str | None = None) -> str:
    """Whose limits lowering respects: the one runtime the collective targets, else `runtime`."""
    runtimes = target_runtimes(schedule.demand.collective, runtime, vendor)
    return runtimes[0] if len(runtimes) == 1 else runtime


def divides(demand: Demand, instances: int, element_bytes: int) -> bool:
    """Whether the demand's size is whole elements in every chunk of its program with `instances`
    (E % nchunksperloop == 0): at a size that is not, the runtimes silently run NCCL's own
    algorithm instead (msccl-xml.md §4). A custom program's size is per chunk: always."""
    if demand.collective == CUSTOM:
        return True
    chunks = max(1, demand.input_chunks, demand.output_chunks) * instances  # nchunksperloop, as lower writes it
    return demand.size_bytes % (chunks * element_bytes) == 0


def uneven_instances(demand: Demand, instances: int, element_bytes: int) -> str:
    """The error for `--instances N` whose chunks split the demand's elements (divides)."""
    return (f"--instances: {instances} cuts the {demand.size_bytes} B buffer into chunks that split {element_bytes}-byte "
            "elements (nchunksperloop must divide its element count), so the runtimes would run NCCL's own algorithm "
            "instead; choose another count")


def even_below(c: int, fits: Callable[[int], bool]) -> int | None:
    """The largest count in (c/2, c] that fits (c itself where it does), or None: a saturating
    count the size does not divide gives way to the nearest one below it that it does (above it,
    more thread blocks and a longer lowering; beyond a factor 2, another step of the doublings)."""
    return next((d for d in range(c, c // 2, -1) if d > 1 and fits(d)), None)


def whole_counts(first: set[int], others: set[int], fits: Callable[[int], bool]) -> tuple[list[int], list[int]]:
    """instance_order of the saturating counts `first` and `others`, each count there that the size
    does not divide replaced by even_below (the doublings too: 10^6 B of float32 on MI250 has
    31,250-element chunks at one per rank, which 4, 8 and 16 do not split and 5 and 10 do; its
    allreduce stayed at 2 instances, 75.5 us, where 10 make 61.5), the counts that do not fit
    dropped; and the counts instance_order gives that do not fit."""
    order = [c if fits(c) else even_below(c, fits)
             for c in instance_order({even_below(c, fits) or 0 for c in first} - {0},
                                     {even_below(c, fits) or 0 for c in others} - {0})]
    return ([c for c in dict.fromkeys(order) if c is not None],
            [c for c in instance_order(first, others) if not fits(c)])


def realise(schedule: Schedule, topology: Topology, options: LowerOptions, runtime: str,
            deadline: float | None = None, enough_s: float | None = None, element_bytes: int = 4,
            workers: int = 1, stall: float | None = None, finish_by: float | None = None) -> Realisation:
    """finish_by: where given, the time by which the chosen program is also to be verified and written: no
    lowering starts that would end later than FINISH times the best program's lowering and timing before it.
    enough_s: a program time at which the search stops (no other can gain what is left to the bound).
    element_bytes: the data type's size; an instance count whose chunks would split elements at the
    schedule's size is not tried (divides), and one asked for is an error. workers: processes it may
    use (2: a program of SPARE_CORE_PROGRAM transfers or more has LEAD's other window lowered in a
    second process, `_spare`). stall: where given, the search also ends once it has gone
    max(STALL_MIN_S, stall x the seconds it took to find its fastest program) past that find, from
    its second instance count on, where its first lowering and timing took STALL_LOWERING_S or more
    (auto, where other candidates wait to be judged: the searches of a 32-GPU program ran their 30 s
    for gains they had found in the first 3 to 5; at one instance, the first count, the winner is
    rarely found: DGX H100 x 4 allreduce 256 MB's hier/8ch is 2 instances)."""
    spares: list[Background] = []
    try:
        return _realise(schedule, topology, options, runtime, deadline, enough_s, element_bytes,
                        spares if workers >= 2 else None, stall, finish_by)
    finally:
        for b in spares:
            b.stop()


def _realise(schedule: Schedule, topology: Topology, options: LowerOptions, runtime: str, deadline: float | None,
             enough_s: float | None, element_bytes: int, spares: list[Background] | None,
             stall: float | None = None, finish_by: float | None = None) -> Realisation:
    t0 = time.perf_counter()
    large = len(schedule.transfers) >= LARGE_PROGRAM
    as_first = len(schedule.transfers) >= AS_FIRST_PROGRAM
    # SEARCH_SECONDS bounds the search where each count is quick; a large program's counts and placements run to
    # the deadline (one lowering and timing of 256 GPUs took 12 s: 30 s left the second count out)
    limit_at = t0 + SEARCH_SECONDS if deadline is None else (deadline if large else min(deadline, t0 + SEARCH_SECONDS))
    stop_at = limit_at
    gained = t0  # when the search last found a faster program
    took: dict[int, float] = {}  # seconds the first protocol's lowering and timing took at each count

    def stalled_at() -> float:  # when the search ends for want of gains (stall; from its second count on, where a
        # lowering takes a while)
        if stall is None or len(took) < 2 or took[min(took)] < STALL_LOWERING_S:
            return limit_at
        return min(limit_at, gained + max(STALL_MIN_S, stall * (gained - t0)))
    protos = protocols(topology, options.proto)
    ideal: Ideals | None = None
    if len(protos) > 1:  # the protocol of the best ideal program first: it is the one kept when time runs out
        ideal = Ideals(topology, schedule, protos, eager=not large)
        protos = ideal.ranked()
    gated = not large and through_slow_paths(schedule, topology)
    across = not large and lanes_differ(schedule, topology)
    base = replace(options, runtime=aimed_runtime(schedule, runtime, topology.vendor))
    lead = _lead(schedule, topology, protos[0]) if large and options.pace else {}
    fixed = options.instances != 0
    if not divides(schedule.demand, 1, element_bytes):  # not whole elements of that size at all: count bytes
        element_bytes = 1
    fits = lambda k: divides(schedule.demand, k, element_bytes)  # noqa: E731
    if fixed and not fits(options.instances):
        raise CompileError(uneven_instances(schedule.demand, options.instances, element_bytes))
    counts = [options.instances] if fixed else [1]
    uneven: list[int] = []
    tried: list[tuple[str, int, float]] = []
    best: tuple[float, str, int, Program, ProgramTiming] | None = None
    stopped = enough = None
    # where the time limit has passed, one count is lowered: the likeliest winner, then one instance where it fails (only
    # where that lowering is short: DGX H100 x 8 direct, 4,032 transfers, failed at 10 instances on thread blocks after
    # 2.2 s, which took a 3 s limit's command to 8.1 s of the 8.3 promised)
    guess = None if fixed or time.perf_counter() < limit_at else \
        _out_of_time_count(schedule, topology, protos[0], fits)
    if guess is not None and guess * len(schedule.transfers) > GUESS_MOVES:
        guess = None
    if guess is not None:
        counts = [1, guess]
    misses = 0
    carry: dict = {}  # the placement options of the best program so far (a small program's next count starts there)
    led_at: dict[int, dict] = {}  # count -> the LEAD it lowered with (none where no LEAD fit: the plain placement)
    deferred: dict[str, tuple[Program, ProgramTiming]] | None = None  # one instance's programs, placements untried
    gain = 1.0  # the most the other placements sped up a count's program
    counts_first = counts[0]  # LEAD's other window at the first count is lowered beside the search (_spare)
    spare = _spare(schedule, topology, replace(base, instances=counts_first, proto=protos[0]),
                   _in_step_at(lead, schedule, counts_first), spares, stop_at)
    failed_s = 0.0  # the longest a failed lowering at the count in hand took

    def attempt(placed: LowerOptions, ideal_for: Ideals | None) -> dict[str, tuple[Program, ProgramTiming]]:
        """_time_all at `placed`; where a placement of this count already failed, begun only if one more
        lowering as long as that fits before stop_at (DGX H100 x 8 allreduce 256 MB, hier/4ch at 4 instances:
        LEAD paired failed on XML nodes after 9.4 s, ending 0.8 s before the deadline, and the plain placement,
        begun then, failed after 12 s more)."""
        nonlocal failed_s
        if failed_s and best is not None and time.perf_counter() + failed_s >= stop_at:
            raise _OutOfTime(placed.instances)
        began_try = time.perf_counter()
        try:
            return _time_all(schedule, topology, placed, protos, stop_at, ideal_for, enough_s, first, as_first, deadline)
        except CompileError:
            first.clear()
            failed_s = max(failed_s, time.perf_counter() - began_try)
            raise
    while counts:
        stop_at = stalled_at()  # past the first count and the likeliest winner after it
        if stop_at < limit_at and time.perf_counter() >= stop_at:
            stopped = stopped or "the search ended, as long again past its latest gain without a faster program"
            break
        k = counts.pop()
        began = time.perf_counter()
        failed_s = 0.0
        first: list[float] = []
        at_k = replace(base, instances=k)
        ideal_k = ideal if k == 1 or large else None
        try:
            try:
                timed = None
                # every peer on a block of its own and one more run in flight, if the blocks fit; else its peers
                # paired where they must be, with its NIC choices and window (DGX H100 x 8 allreduce 256 MB, hier/4ch
                # at 2 instances, where LEAD needs 132 blocks: 1467 us, the plain placement 2087, one instance 1546)
                # A small program's count starts from the placement of the best program so far (`carry`), if its
                # blocks fit; its own search then goes on from there and from the plain placement (_placements)
                start_k = None
                at_k_lead = _in_step_at(lead, schedule, k)
                hows = [at_k_lead, {**at_k_lead, "pair_peers": True}] if lead else [carry] if carry else []  # apart
                for how in hows:
                    led = replace(at_k, **how)
                    try:
                        timed = attempt(led, ideal_k)
                        if lead:
                            at_k = led
                            led_at[k] = how
                        else:
                            start_k = led
                        break
                    except CompileError:
                        pass
                if timed is None:
                    timed = attempt(at_k, ideal_k)
            except TooManySteps:
                # lane-aware placement puts a transfer's pieces on fewer channels, so more steps on each block, and
                # pacing adds nops: every instance on its own channel, then unpaced too, may fit the runtimes' steps
                # (neither gives a rank fewer thread blocks: a count with too many is not lowered again)
                for fewer in ({"fit_lanes": False}, {"fit_lanes": False, "pace": False}):
                    if k == 1 or all(getattr(at_k, key) == v for key, v in fewer.items()):
                        continue
                    try:
                        at_k = replace(base, instances=k, **fewer)
                        timed = attempt(at_k, ideal if large else None)
                        break
                    except CompileError:
                        continue
                else:
                    raise
        except _OutOfTime:
            left = [k] + sorted(c for c in counts if c > k)  # as long or longer to lower
            why = (f"the time limit left out {', '.join(map(str, left))} (a placement at {k} failed after "
                   f"{failed_s:.1f} s, and another as long would not end in time)")
            stopped = f"{stopped}; {why}" if stopped else why
            counts = [c for c in counts if c < k]
            continue
        except CompileError as e:
            if fixed or (best is None and not any(c < k for c in counts)):
                raise
            stopped = stopped or f"{k} would not fit ({e})"
            counts = [c for c in counts if c < k]  # more would not fit either
            continue
        took[k] = first[0]
        placement = None  # the options of the count's fastest program, where its placements were tried
        reached = enough_s is not None and _fastest_s(timed) <= enough_s
        if not fixed and k == 1 and _several_iterations(timed, topology):
            # a chunk of several kernel iterations gains from more instances, which split it: its other placements
            # at one instance wait until the other counts are tried (and are not needed where one reaches enough_s)
            deferred = timed
        else:
            plain_s = _fastest_s(timed)
            got, placement = _placements(timed, schedule, topology, at_k, large, gated, stop_at, began,
                                         best[0] * gain if best else None, enough_s, first[0], ideal, across,
                                         start_k)
            reached = got or reached
            gain = max(gain, plain_s / _fastest_s(timed))
        tried += [(p, k, t.finish_time_s) for p, (_, t) in timed.items()]
        p = _leader(timed)
        prog, timing = timed[p]
        protos = tuple(q for q in protos if q in timed and timed[q][1].finish_time_s <= BEHIND * timing.finish_time_s)
        if large:  # each lowering takes seconds to minutes: the counts after this one are lowered for its leader only
            protos = (p,)
        # a count below the best one is a fallback (fewer thread blocks), not a step further: no miss
        misses = 0 if best is None or timing.finish_time_s < PAYS * best[0] else misses + (k > best[2])
        if best is None or timing.finish_time_s < best[0]:
            best = (timing.finish_time_s, p, k, prog, timing)
            gained = time.perf_counter()
            carry = _carried(placement, base) if placement is not None and not large else {}
            if finish_by is not None:  # the best program's verifying and writing grow with its steps, as its lowering
                limit_at = min(limit_at, finish_by - FINISH * took[k])
                stop_at = min(stop_at, limit_at)
        if not fixed and k == 1:  # the rest, first the counts that saturate the fastest protocol's links
            # (where a chunk moves in less than one step latency on a thread block, bandwidth does not bind: no count
            # that saturates a link, only the doublings, which spread a thread block's serial steps over more blocks)
            counts, uneven = whole_counts(*((set(), set()) if _latency_bound(timing, topology) else
                                            (saturating_counts(topology, (p,)), saturating_counts(topology, protos))),
                                          fits)
            counts = counts[::-1]
        if reached and counts:
            enough = f"{k} reached the target ({best[0] * 1e6:.1f} us, within {enough_s * 1e6:.1f} us)"
            break
        if not counts or misses >= PATIENCE:
            break
        # lowering and timing grow with the instances; the first protocol (the best so far) is lowered and
        # timed at a count that is tried at all, the others only as time allows (_time_all)
        per = first[0] / k
        late = [c for c in counts if time.perf_counter() + per * c >= stop_at]
        if late:  # a count that would not finish in time is passed over; a smaller one may still pay
            why = "the time limit" if stop_at >= limit_at else "the search's end (as long again past its latest gain)"
            stopped = stopped or f"{why} left out {', '.join(map(str, sorted(late)))}"
            counts = [c for c in counts if c not in late]
        if not counts:
            break
    stop_at = stalled_at()
    if deferred is not None and enough is None and (enough_s is None or best[0] > enough_s) \
            and _fastest_s(deferred) / gain <= CONTENDS * best[0] \
            and (stop_at >= limit_at or time.perf_counter() < stop_at):
        _placements(deferred, schedule, topology, replace(base, instances=1), large, gated, stop_at,
                    time.perf_counter() - took[1], None, enough_s, took[1], ideal, across)
        q = _leader(deferred)
        prog, timing = deferred[q]
        tried = [t for t in tried if t[1] != 1] + [(p, 1, t.finish_time_s) for p, (_, t) in deferred.items()]
        if timing.finish_time_s < best[0]:
            best = (timing.finish_time_s, q, 1, prog, timing)
            gained = time.perf_counter()
    _, p, k, program, timing = best
    # a large program tries its other placements at its best count only, with LEAD's NIC choices: LEAD with the
    # other window, one more run in flight on paced links (k > 1: a transfer's runs start and end together, so its
    # lanes idle through the step latency), then every send and receive peer on a block of its own, then every
    # instance on its own channel; then those that paid alone, together (DGX H100 x 2 allgather 256 MB at 4
    # instances, before LEAD's NIC choices: 786 us, one more run 731, own channels 718, both 672: a chunk piece
    # that fills a kernel iteration gains nothing from a merged step, only blocks)
    # Where no LEAD fit at that count (its peers apart, or paired), its NIC choices and window are not tried either.
    # Then, where its chunks are latency-bound on some link kind, its sends unpaced, as a small program's
    # search does (first where they are on every kind), with every protocol whose known ideal program beats the
    # leader's program, best ideal first: MI250 x 16 alltoall 1 MB relay, where LEAD needs 174 blocks: LL 294 us
    # paced, 249 unpaced; Simple 439 paced, 208 unpaced. (At 1 GB on 128 to 512 GPUs unpaced never paid, and its
    # lowering added 9-16 s to the command.)
    paid: dict = {}  # the placements that beat the plain program alone, merged
    plain_s = timing.finish_time_s
    lead = led_at.get(k, {})
    pacing = {o: v for o, v in lead.items() if o in ("pace_fast", "rotate_slow", "copies_apart")}  # LEAD's choices stay
    window = [_other_window(lead)] if "pace_ahead" in lead else []
    unpaced_variant = {"pace": False}
    unpaced = [unpaced_variant] if options.pace and _latency_bound(timing, topology, every=False) else []
    early = _latency_bound(timing, topology)
    in_step = [{**lead, **IN_STEP}] if k == 1 and lead and "copies_apart" not in lead else []
    placements = ((unpaced if early else []) + window + in_step
                  + ([{"pace_ahead": 1}] if k > 1 and options.pace else [])
                  + ([] if lead.get("pair_peers") else [{"pair_peers": False}])  # paired: apart did not fit
                  + ([{"fit_lanes": False}] if k > 1 and options.fit_lanes else [])
                  + ([] if early else unpaced)) if large else []
    for variant in placements + [None]:
        if variant is None:  # then those together
            if len(paid) < 2:
                break
            variant = paid
        if enough is not None or (enough_s is not None and timing.finish_time_s <= enough_s):
            break
        own = {p: (program, timing)}
        timing_before = timing.finish_time_s
        # a stall ends the counts, not LEAD's search at the best count: where its chunks are not latency-bound, its
        # other window (LEAD's own is a rule read off measurements; from SPARE_CORE_PROGRAM transfers it is lowered
        # beside it) is tried whatever the stall (DGX H100 x 4 allreduce 256 MB: 1284 -> 1187 us; at 25 MB, where
        # the unpaced placement comes first, trying both took hier/8ch's judging 4 s longer, and hier/1ch's program,
        # the fastest, was then judged in fewer runs), the other placements while they pay; `_grouped` after the
        # loop keeps the stall's end
        stop_at = stalled_at()
        ends = limit_at if window and variant is window[0] and not early else stop_at
        if spare is not None and window and variant is window[0] and k == counts_first:
            mine = _take_spare(spare, took[k], own)  # lowered beside the search: waited for, not lowered again
        elif time.perf_counter() + took[k] >= ends:
            break
        else:
            placed = replace(base, instances=k, **{**pacing, **variant})
            only = _unpaced_contenders(p, timing, ideal) if variant is unpaced_variant else (p,)
            own.update({q: (program, timing) for q in only})  # each replaced only by a faster program
            mine = min(_keep_faster(own, schedule, topology, placed, ends, only).values(), default=None)
        if own[_leader(own)][1] is not timing:
            p = _leader(own)
            program, timing = own[p]
            tried.append((p, k, timing.finish_time_s))
            gained = time.perf_counter()
        if window and variant is window[0] and mine is not None and mine < plain_s:
            lead = variant  # the whole chunks are spread over channel groups with the window that paid (_grouped)
        if in_step and variant is in_step[0] and mine is not None and mine < timing_before:
            lead = {**lead, **IN_STEP}  # and with the copies that paid
        if mine is not None and mine < plain_s and variant is not paid:
            ahead = max(paid.get("pace_ahead", 0), variant.get("pace_ahead", 0))  # the wider window of those that paid
            paid = {**paid, **variant, **({"pace_ahead": ahead} if ahead else {})}
    if large and k == 1 and enough is None:
        program, timing = _grouped(program, timing, schedule, topology, replace(base, **lead), stop_at, took[1],
                                   enough_s, tried,
                                   apart_first=lead.get("pair_peers") is False or paid.get("pair_peers") is False)
    lowered = {q for q, _, _ in tried}
    if guess is not None:
        why = (f"the time limit had passed when lowering began: only {guess}, the count that saturates the widest "
               f"GPU link, was lowered" + ("" if k == guess else " (it did not fit: 1 instead)"))
        stopped = why if k == guess or not stopped else f"{why}; {stopped}"
    return Realisation(program, timing, k, tuple(tried), stopped, enough,
                       tuple((q, ideal.at_least(q), q in ideal.known) for q in ideal.protos if q not in lowered)
                       if ideal else (), tuple(uneven), element_bytes, as_first)


def _grouped(program: Program, timing: ProgramTiming, schedule: Schedule, topology: Topology, base: LowerOptions,
             stop_at: float, lowering_s: float, enough_s: float | None,
             tried: list[tuple[str, int, float]], apart_first: bool = True) -> tuple[Program, ProgramTiming]:
    """A large program at one instance (more would split elements, not fit, or lose): its whole
    chunks spread over 2, 4, ... MAX_GROUPS channel groups (LowerOptions.groups), with every send
    and receive peer on a block of its own and paired, the faster kept (apart_first: which of the
    two is lowered first, where time allows only one; apart blocks that do not fit are left out),
    while a step or the one after it pays (PATIENCE, as for instance counts: on MI250 x 16 allgather
    1 GB, 2 groups changed nothing against LEAD's rotation over two, and 4 took the program from
    14.4 to 11.5 ms). A connection then moves its chunks on a block per group side by side: at one
    instance a block per peer cannot fill an NVSwitch port under the per-block cap (DGX A100 x 16
    allgather 1 GB: 7 fan-out peers x 24 GB/s of 300). `base` carries the other placement options
    (realise passes LEAD's run ahead). Appends what it lowered to `tried`."""
    p = program.proto
    groups, misses = 2, 0
    while groups <= MAX_GROUPS and misses < PATIENCE:
        if (enough_s is not None and timing.finish_time_s <= enough_s) or time.perf_counter() + lowering_s >= stop_at:
            break
        own = {p: (program, timing)}
        for pair in ((False, True) if apart_first else (True, False)):
            if time.perf_counter() + lowering_s >= stop_at:
                break
            _keep_faster(own, schedule, topology, replace(base, instances=1, groups=groups, pair_peers=pair), stop_at)
        before = timing.finish_time_s
        if own[p][1].finish_time_s < before:
            program, timing = own[p]
            tried.append((p, 1, timing.finish_time_s))
        misses = misses + 1 if timing.finish_time_s >= PAYS * before else 0
        groups *= 2
    return program, timing


def _placements(timed: dict[str, tuple[Program, ProgramTiming]], schedule: Schedule, topology: Topology,
                options: LowerOptions, large: bool, gated: bool, stop_at: float, began: float,
                behind_s: float | None, enough_s: float | None, lowering_s: float,
                ideal: Ideals | None = None, across: bool = False, start: LowerOptions | None = None
                ) -> tuple[bool, LowerOptions]:
    """Try a count's other placements (_keep_faster) where time allows: the pacing ones first and
    with the count's best protocol and `_contenders` only (each is one more lowering; with every
    protocol they doubled the time auto spends judging a candidate, and it judged fewer; and the
    largest gains are theirs, where small sends are latency-bound; ideal: each protocol's ideal
    program, for _contenders). Unpaced sends first: where they beat the paced program, `_descend`
    and NIC turns (`_turns`) start from them at once, since the best program of a small count is
    nearly always unpaced and a deadline cuts what comes last. Then each other placement alone, the
    best of each kind that paid together (greedily on top of each other they lose where a first one
    that pays alone spoils a better second: pace_ahead before gate_slow), and the descent and turns
    again from a new best. A large program tries them at its best count only (realise). behind_s:
    the pacing placements are not tried for a count whose program is over CONTENDS times this (the
    best so far, scaled by the most placements gained at a count). Whether a program reached
    enough_s, and the placement of the fastest program. start: where `timed` was lowered with another
    placement than `options` (realise's carry: that of the best program at the counts before), the
    unpaced placement is tried on it first, then the plain one is lowered, and the other placements
    go on from that as without a start (DGX H100 x 8 allreduce 1 MB, hier/1ch: one instance's best
    had every peer apart; at 3 instances the plain placement made 68.9 us, peers apart 63.7, and apart
    and unpaced 39.5, which the search from the plain placement reached at its fifth lowering, after
    a stall had ended it; from the carried one, at its second)."""
    k = options.instances
    first = [({"pace": False}, True)] if options.pace and not large else []
    variants = ([({"pace": True, "pace_ahead": 1}, True)] if options.pace and not large else []) \
        + ([] if large else [({"pair_peers": False}, False)]) \
        + ([({"gate_slow": True}, True)] if gated and not large else []) \
        + ([({"lanes_across": True}, True)] if across and not large
           and _latency_bound(timed[_leader(timed)][1], topology) else []) \
        + ([({"fit_lanes": False}, False)] if k > 1 and options.fit_lanes and not large else [])
    plain_s = _fastest_s(timed)
    reached = enough_s is not None and plain_s <= enough_s
    paid: dict[str, tuple[float, dict]] = {}  # kind of placement -> (its best time, its options)
    started = start or options
    placed = {p: started for p in timed}  # the options each protocol's program was lowered with
    window_s = plain_s  # the last pacing window's time (no run ahead: the paced program's)
    lowered = {(p, started) for p in timed}  # (protocol, placement) tried, which _descend does not lower again
    settled: set[tuple[str, LowerOptions]] = set()  # where the descent and turns started or ended
    gained = 1.0  # the most a descent (with the turns) sped up the program it started from

    def kept(placement: LowerOptions, only: tuple[str, ...] | None) -> dict[str, float]:
        lowered.update((p, placement) for p in (only or tuple(timed)))
        return _kept(timed, placed, schedule, topology, placement, stop_at, only)

    def alone(variants: list[tuple[dict, bool]], at: LowerOptions = options) -> None:
        nonlocal reached, window_s
        for variant, best_only in variants:
            if reached or time.perf_counter() + (time.perf_counter() - began) >= stop_at:
                break
            leader = _leader(timed)
            if best_only and behind_s is not None and timed[leader][1].finish_time_s > CONTENDS * behind_s:
                continue  # a count this far behind is not worth another lowering
            if replace(at, **variant) == at:
                continue  # lowered already
            got = kept(replace(at, **variant),
                       _contenders(timed, leader, ideal if variant.get("pace") is False else None) if best_only
                       else None)
            kind = "pace" if "pace" in variant else next(iter(variant))
            mine = got.get(leader)
            if mine is not None and mine < min(plain_s, paid.get(kind, (plain_s,))[0]):
                paid[kind] = (mine, variant)
            if variant.get("pace_ahead") and mine is not None and mine < window_s:
                window_s = mine  # a window that paid: a wider one may pay more (small sends cover the step
                if variant["pace_ahead"] < MAX_AHEAD:  # latency in several runs)
                    variants.append(({"pace": True, "pace_ahead": 2 * variant["pace_ahead"] + 1}, True))
            reached = enough_s is not None and _fastest_s(timed) <= enough_s

    def from_best(proto: str | None = None) -> None:  # from `proto`'s program (default: the best one's)
        nonlocal reached, gained
        start = proto or _leader(timed)
        if large or reached or (start, placed[start]) in settled:
            return
        settled.add((start, placed[start]))
        start_s = timed[start][1].finish_time_s
        reached = _descend(timed, placed, schedule, topology, options, stop_at, lowering_s, behind_s, enough_s,
                           lowered, proto)
        if gated and not reached:
            reached = _turns(timed, placed, schedule, topology, stop_at, lowering_s, behind_s, enough_s, proto)
        lead = proto or _leader(timed)  # _spread lowers its protocol only: it stays the leader
        if not reached and _latency_bound(timed[lead][1], topology, every=False):
            spread_s = timed[lead][1].finish_time_s
            reached = _spread(timed, placed, schedule, topology, stop_at, lowering_s, behind_s, enough_s, across,
                              lowered, proto)
            if not reached and timed[lead][1].finish_time_s < PAYS * spread_s:
                # the groups' blocks change what pacing and pairing cost: descend again from them (MI250 x 2
                # allgather 10^6 B rounds/5ch: paced, peers paired, 8 groups 78.8 us; unpaced 61.7)
                reached = _descend(timed, placed, schedule, topology, options, stop_at, lowering_s, behind_s,
                                   enough_s, lowered, proto)
        end = proto or _leader(timed)
        settled.add((end, placed[end]))
        gained = max(gained, start_s / timed[end][1].finish_time_s)

    if started != options:
        alone(first, started)
        if not reached and time.perf_counter() + lowering_s < stop_at:
            plain_s = window_s = min(kept(options, None).values(), default=plain_s)
    else:
        alone(first)
    if not placed[_leader(timed)].pace:
        from_best()
    alone(variants)
    together = replace(options, **{key: v for _, variant in paid.values() for key, v in variant.items()})
    leader = _leader(timed)
    if len(paid) > 1 and not reached and (leader, together) not in lowered \
            and time.perf_counter() + lowering_s < stop_at:  # one lowering's time left
        kept(together, _contenders(timed, leader, None))
        reached = enough_s is not None and _fastest_s(timed) <= enough_s
    from_best()
    # a protocol of other connection slots (the descent lowers the leader's only) behind by less than a descent
    # gained, whose best placement no descent has started from: DGX A100 x 2 reduce-scatter 256 MB hier/4ch at 10
    # instances, unpaced LL128 led and descended from 881.4 to 817.5 us, while Simple with every instance on its
    # own channel (841.4) went on to 781.1 unpaced
    leader = _leader(timed)
    for p in sorted(timed, key=lambda q: timed[q][1].finish_time_s):
        if SLOTS[p] != SLOTS[leader] and timed[p][1].finish_time_s < gained * timed[leader][1].finish_time_s:
            from_best(p)
    return reached, placed[_leader(timed)]


def _turns(timed: dict[str, tuple[Program, ProgramTiming]], placed: dict[str, LowerOptions], schedule: Schedule,
           topology: Topology, stop_at: float, lowering_s: float, behind_s: float | None,
           enough_s: float | None, proto: str | None = None) -> bool:
    """The best placement so far (or `proto`'s) with a NIC connection's transfers on 2, 3, ...
    MAX_TURNS channel groups in turn, while a step pays: alone it rarely pays (paced or paired blocks
    keep the turns waiting); on the best placement, unpaced with every peer apart, DGX-2 x 2 allgather 1 MB
    hier/4ch went from 30.2 to 26.3 us and hier/8ch from 39.0 to 27.4 (2 turns) and 25.1 (3; 4:
    25.7). Where one more turn does not pay, the same turns with every NIC send peer on a block of
    its own (fuse_slow off), once, and the turns go on from there if that paid: alone, it seldom
    pays (the NIC's few blocks pay its step latency after each send either way), after the turns it
    can (DGX A100 x 2 reduce-scatter 1 MB, rounds/5ch at 5 instances: 22.4 us at 2 turns, 21.2 with
    the sends apart, 19.0 at 3 turns; a receive fused with the send of its sum out of the node waited
    for the NIC's step latency before the next receive). Whether a program reached enough_s."""
    reached = enough_s is not None and _fastest_s(timed) <= enough_s
    unfused = False  # whether fuse_slow off was tried

    def pays(leader: str, trial_options: LowerOptions, before: float) -> bool:
        trial = {leader: timed[leader]}
        _keep_faster(trial, schedule, topology, trial_options, stop_at)
        if trial[leader][1].finish_time_s >= PAYS * before:
            return False  # kept only where it pays: a tie in the last bits would change the file for nothing
        timed[leader], placed[leader] = trial[leader], trial_options
        return True

    while not reached and time.perf_counter() + lowering_s < stop_at:
        leader = proto or _leader(timed)
        before = timed[leader][1].finish_time_s
        if behind_s is not None and before > CONTENDS * behind_s:
            break  # a count this far behind is not worth another lowering
        at = placed[leader]
        more = replace(at, rotate_slow=at.rotate_slow + 1)
        turned = at.rotate_slow < MAX_TURNS and pays(leader, more, before)
        if not turned:
            if unfused or not at.fuse_slow or time.perf_counter() + lowering_s >= stop_at \
                    or not waits_behind_nic(timed[leader][0], topology):
                break
            unfused = True
            if not pays(leader, replace(at, fuse_slow=False), before):
                break
        reached = enough_s is not None and _fastest_s(timed) <= enough_s
    return reached


def _spread(timed: dict[str, tuple[Program, ProgramTiming]], placed: dict[str, LowerOptions], schedule: Schedule,
            topology: Topology, stop_at: float, lowering_s: float, behind_s: float | None, enough_s: float | None,
            across: bool, seen: set[tuple[str, LowerOptions]], proto: str | None = None) -> bool:
    """The best placement so far (or `proto`'s) with its whole chunks over SPREAD_GROUPS channel
    groups (LowerOptions.groups), while a count or the one after it pays (PATIENCE). Where a chunk
    moves in less than a step latency on some link kind, the steps a connection's thread block
    takes one after another pay their latencies one after another; more instances spread them only
    where they split chunks into whole elements, and multiply the steps. Groups give a connection
    a block per group for its whole chunks (MI250 x 2 allreduce 10^6 B, hier/5ch at one instance,
    where no other count splits elements: 209.3 us; 4 groups 152.2, 4 groups with lanes_across
    117.4; reduce-scatter 16 MB, hier/8ch at 2 instances, 184.3 -> 166.6). across: pairs
    run transfers over parallel links, and each count is also tried with their lanes taken in turn
    (the groups then spread a pair's transfers over its links too); where a placement with every peer
    apart needs more thread blocks than fit, with its peers paired. As the turns, it lowers the
    leader's protocol only: a protocol of the same slots that it sped up to within BEHIND would be
    lowered at every later count, and lead some (DGX-2 x 2 allreduce 10^6 B ring: LL led at 2
    instances, and the search ended at 4 with 324.5 us, where it went on to 14 and 200.0 before).
    seen: the (protocol, placement) pairs lowered already (grows). Whether a program reached
    enough_s."""
    reached = enough_s is not None and _fastest_s(timed) <= enough_s
    misses = 0
    for groups in SPREAD_GROUPS:
        if reached or misses >= PATIENCE or time.perf_counter() + lowering_s >= stop_at:
            break
        leader = proto or _leader(timed)
        before = timed[leader][1].finish_time_s
        if behind_s is not None and before > CONTENDS * behind_s:
            break  # a count this far behind is not worth another lowering
        at = placed[leader]
        if at.groups >= groups:
            continue
        trials = [replace(at, groups=groups)] + ([replace(at, groups=groups, lanes_across=True)]
                                                 if across and not at.lanes_across else [])
        while trials:
            trial = trials.pop(0)
            if (leader, trial) in seen or time.perf_counter() + lowering_s >= stop_at:
                continue
            seen.add((leader, trial))
            if not _kept(timed, placed, schedule, topology, trial, stop_at, (leader,)) and not trial.pair_peers:
                trials.insert(0, replace(trial, pair_peers=True))  # apart, its blocks do not fit: paired, they may
        misses = 0 if timed[leader][1].finish_time_s < PAYS * before else misses + 1  # only its program changes
        reached = enough_s is not None and _fastest_s(timed) <= enough_s
    return reached


def waits_behind_nic(program: Program, topology: Topology) -> bool:
    """Whether some thread block sends through a NIC and receives after such a send: that receive
    waits out the NIC's step latency (LowerOptions.fuse_slow gives the send peer a block of its own)."""
    fastest, slow = topology.fastest_bandwidth, {}
    for g in program.gpus:
        for tb in g.tbs:
            if tb.send < 0 or tb.recv < 0:
                continue
            key = (g.rank, tb.send)
            if key not in slow:
                slow[key] = topology.path_bandwidth(topology.best_path(g.rank, tb.send)) < fastest
            if not slow[key]:
                continue
            sends = [i for i, st in enumerate(tb.steps) if st.type in SENDS]
            if sends and any(st.type in RECVS for st in tb.steps[sends[0] + 1:]):
                return True
    return False


def _descend(timed: dict[str, tuple[Program, ProgramTiming]], placed: dict[str, LowerOptions], schedule: Schedule,
             topology: Topology, options: LowerOptions, stop_at: float, lowering_s: float, behind_s: float | None,
             enough_s: float | None, seen: set[tuple[str, LowerOptions]], proto: str | None = None) -> bool:
    """From the best placement so far, turn off one more of pacing, paired peers and lane-aware
    placement at a time while that pays (a small program's flags act together: each tried alone on
    the paced, paired program often does not pay where two together do; DGX H100 x 2 allgather 16 MB
    hier/2ch at 8 instances: unpaced 58.3 us, unpaced with every instance on its own channel 52.1,
    and every peer on its own block too 50.8). seen: the (protocol, placement) pairs lowered
    already (grows). proto: descend from this protocol's program (default: the fastest's, at each
    step). Whether a program reached enough_s."""
    flips = [("pace", False), ("pair_peers", False)] + ([("fit_lanes", False)] if options.instances > 1 else [])
    while time.perf_counter() + lowering_s < stop_at:
        leader = proto or _leader(timed)
        before = timed[leader][1].finish_time_s
        if behind_s is not None and before > CONTENDS * behind_s:
            break  # a count this far behind is not worth another lowering
        at = placed[leader]
        trials = [t for t in (replace(at, **{key: v}) for key, v in flips if getattr(at, key) != v)
                  if (leader, t) not in seen]
        if not trials:
            break
        for trial in trials:
            contenders = _contenders(timed, leader, None)
            seen.update((q, trial) for q in contenders)
            _kept(timed, placed, schedule, topology, trial, stop_at, contenders)
            if time.perf_counter() + lowering_s >= stop_at:
                break
        if timed[proto or _leader(timed)][1].finish_time_s >= PAYS * before:
            break  # one more step only where this one paid: ties in the last bits are not worth a lowering
    return enough_s is not None and _fastest_s(timed) <= enough_s


def _contenders(timed: dict[str, tuple[Program, ProgramTiming]], leader: str,
                ideal: Ideals | None) -> tuple[str, ...]:
    """The protocols a placement is tried with: the leader; those in `timed` that share its lowering
    (the same connection slots: LL and LL128), which costs a timing, not a lowering; and the others
    whose ideal program beats the leader's program, which costs one (`ideal`: realise gives it
    for the unpaced placement only; with every pacing window, DGX A100 x 2 allgather 16 MB's
    judging of hier/2ch took the time of hier/1ch's, a faster program). The leader's placement need
    not be theirs: DGX-2 x 2 alltoall direct, 256 KB: paced, LL's program beat LL128's (74.7 us
    against 92.5), unpaced LL128's is 43.0 us against LL's 53.8; 4 MB: paced, LL128's (361.9 us)
    beat Simple's (405.0), unpaced Simple's is 345.0, its ideal and the floor."""
    lead_s = timed[leader][1].finish_time_s
    return (leader,) + tuple(p for p in timed if p != leader and (
        SLOTS[p] == SLOTS[leader] or (ideal is not None and ideal.below(p, lead_s))))


def _kept(timed: dict[str, tuple[Program, ProgramTiming]], placed: dict[str, LowerOptions], schedule: Schedule,
          topology: Topology, options: LowerOptions, stop_at: float,
          only: tuple[str, ...] | None = None) -> dict[str, float]:
    """_keep_faster, recording in `placed` the options of each protocol's program it replaced."""
    before = {p: t for p, (_, t) in timed.items()}
    got = _keep_faster(timed, schedule, topology, options, stop_at, only)
    placed.update({p: options for p in got if timed[p][1] is not before[p]})
    return got


def _unpaced_contenders(leader: str, timing: ProgramTiming, ideal: Ideals | None) -> tuple[str, ...]:
    """The protocols a large program's unpaced placement is lowered with: the leader and those whose
    ideal program, where known, beats the leader's program, best ideal first (one lowering each, as
    time allows: the best bet first). Known only, unlike `_contenders` (Ideals.below simulates an
    ideal whose floor is below: one simulation of 1,024 GPUs takes 6-10 s)."""
    if ideal is None:
        return (leader,)
    others = [q for q in ideal.known if q != leader and ideal.known[q] < timing.finish_time_s]
    return tuple(sorted(others + [leader], key=lambda q: (ideal.known.get(q, float("inf")), q)))


def _carried(placement: LowerOptions, base: LowerOptions) -> dict:
    """The options of CARRIED in which `placement` differs from `base`."""
    return {f: getattr(placement, f) for f in CARRIED if getattr(placement, f) != getattr(base, f)}


CARRIED = ("pace", "pair_peers")  # not fit_lanes, pace_ahead, turns: they act on a count's runs and channel groups
# (DGX-2 x 2 allgather 64 KB, ring: 2 instances' best had every instance on its own channel; 4 instances started
# there made 95.6 us, where their own search, unpaced with two turns, made 59.9)


def _lead(schedule: Schedule, topology: Topology, proto: str) -> dict:
    """LEAD, with AHEAD_IN_ONE_ITERATION runs ahead where a chunk fits one kernel iteration of
    `proto` and 1 where it takes several: a rule read off measurements, not a model. DGX H100 x 64
    allgather 1 GB (2 MB chunks): 2.821 ms with 1, 2.787 with 3 (7: 2.881); reduce-scatter 2.998
    and 2.886. DGX A100 x 16 (8 MB): 0.965 of the bound with 1, 0.949 with 3; DGX H100 x 32 (4 MB),
    LEAD alone: 3.658 ms with 1, 3.825 with 3. At 1,024 GPUs (1 MB) neither wins clearly: 3 by
    0.5 % at 2^30 bytes, 1 by 2 % at 10^9."""
    d = schedule.demand
    chunk = d.size_bytes / max(1, d.ngpus * d.chunks_per_rank)
    if "pace_ahead" not in LEAD or Costing.of(topology, proto).iterations(chunk) > 1:
        return dict(LEAD)
    return {**LEAD, "pace_ahead": AHEAD_IN_ONE_ITERATION}


def _in_step_at(lead: dict, schedule: Schedule, k: int) -> dict:
    """LEAD as lowered at k instances: with its copies in step (IN_STEP) at one instance from
    IN_STEP_PROGRAM transfers."""
    return {**lead, **IN_STEP} if lead and k == 1 and len(schedule.transfers) >= IN_STEP_PROGRAM else lead


def _other_window(lead: dict) -> dict:
    """LEAD with the window tried after its own (OTHER_WINDOW): DGX H100 x 64 1 GB (2 MB chunks, LEAD
    runs 3 ahead), reduce-scatter 2.998, 2.858 and 2.886 ms with 1, 2 and 3; allgather 2.821, 2.819
    and 2.787; DGX H100 x 128 allgather (1 MB chunks) 2.991, 2.768 and 2.977."""
    return {**lead, "pace_ahead": OTHER_WINDOW[lead["pace_ahead"]]}


def lower_and_time(schedule: Schedule, topology: Topology, options: LowerOptions) -> tuple[Program, ProgramTiming]:
    program = lower(schedule, topology, options)
    return program, time_program(program, topology, size_of(schedule, program))


def _spare(schedule: Schedule, topology: Topology, options: LowerOptions, lead: dict,
           spares: list[Background] | None, stop_at: float) -> tuple[Background, float, float] | None:
    """LEAD's other window lowered and timed in a second process beside LEAD's own (one lowering and
    timing of 512 GPUs takes about 15 s, of 1,024 GPUs a minute and a half), where realise may use
    two processes and the program has SPARE_CORE_PROGRAM transfers or more."""
    if spares is None or "pace_ahead" not in lead or len(schedule.transfers) < SPARE_CORE_PROGRAM:
        return None
    spares.append(Background.start(lower_and_time, (schedule, topology, replace(options, **_other_window(lead)))))
    return spares[-1], time.perf_counter(), stop_at


def _take_spare(spare: tuple[Background, float, float], took_s: float,
                timed: dict[str, tuple[Program, ProgramTiming]]) -> float | None:
    """The time of the spare's program, kept in `timed` where it is the faster of its protocol;
    None where it sent none in time or its thread blocks did not fit. In time: by the deadline, or
    where LEAD's own first lowering (took_s) ran past it, as SPARE_PATIENCE times that from the
    spare's start (the two lowerings are alike: at 1,024 GPUs one takes a minute and a half, past
    a limit of a minute, and the other window made 0.967 of the floor where LEAD's made 0.899)."""
    background, started, stop_at = spare
    try:
        got = background.result(max(stop_at, started + SPARE_PATIENCE * took_s))
    except CompileError:
        return None
    if got is None:
        return None
    program, timing = got
    q = program.proto
    if q not in timed or timing.finish_time_s < timed[q][1].finish_time_s:
        timed[q] = got
    return timing.finish_time_s


def _leader(timed: dict[str, tuple[Program, ProgramTiming]]) -> str:
    """The protocol of the fastest program (ties: in PROTOCOLS order)."""
    return min(timed, key=lambda q: (timed[q][1].finish_time_s, PROTOCOLS.index(q)))


def _fastest_s(timed: dict[str, tuple[Program, ProgramTiming]]) -> float:
    return timed[_leader(timed)][1].finish_time_s


def _several_iterations(timed: dict[str, tuple[Program, ProgramTiming]], topology: Topology) -> bool:
    """Whether the fastest program's chunks take more than one kernel iteration of its protocol."""
    timing = timed[_leader(timed)][1]
    return Costing.of(topology, timing.proto).iterations(timing.chunk_bytes) > 1


def _out_of_time_count(schedule: Schedule, topology: Topology, proto: str, fits: Callable[[int], bool]) -> int | None:
    """The one instance count to lower where the search has no time for a second: where a chunk
    takes a thread block longer than a step latency on some link kind (bandwidth binds), the count
    that saturates the widest GPU link, as the search tries it second (DGX H100 x 2 allgather 1 GB at
    a 3 s limit: one instance made 6.59 ms against a plan of 1.96); None where one instance is as
    likely (latency-bound chunks)."""
    if Costing.of(topology, proto).cost is None or _chunks_latency_bound(schedule.demand.chunk_bytes, proto, topology):
        return None
    order, _ = whole_counts(saturating_counts(topology, (proto,)), set(), fits)
    return order[0] if order and order[0] > 1 else None


def _latency_bound(timing: ProgramTiming, topology: Topology, every: bool = True) -> bool:
    """Whether the program's chunks take a thread block less time than one step's latency on every
    link kind of the topology (its protocol's rates): splitting them over more instances cannot pay.
    every=False: on some link kind (a large program's sends may then gain from going unpaced)."""
    return _chunks_latency_bound(timing.chunk_bytes, timing.proto, topology, every)


def _chunks_latency_bound(chunk_bytes: float, proto: str, topology: Topology, every: bool = True) -> bool:
    costing = Costing.of(topology, proto)
    if costing.cost is None:
        return False
    kinds = {l.kind or "nvlink" for l in topology.links}
    return (all if every else any)(chunk_bytes / costing.tb_rate(kind) < costing.step(kind) for kind in kinds)


def through_slow_paths(schedule: Schedule, topology: Topology) -> bool:
    """Whether some transfer takes a path slower than the fastest link (through a NIC, where
    LowerOptions.gate_slow can order the ranks that share one)."""
    fastest, seen = topology.fastest_bandwidth, set()
    for t in schedule.transfers:
        if t.path not in seen:
            seen.add(t.path)
            if topology.path_bandwidth(t.path) < fastest:
                return True
    return False


def lanes_differ(schedule: Schedule, topology: Topology) -> bool:
    """Whether counting a GPU pair's lanes across levels (LowerOptions.lanes_across) puts some
    transfer on another of its parallel links' lanes than counting them per level does."""
    if all(link.count == 1 for link in topology.links):
        return False
    levels = transfer_levels(schedule)
    return parallel_lanes(schedule, topology, levels) != parallel_lanes(schedule, topology, levels, across=True)


def instance_order(first: set[int], others: set[int]) -> list[int]:
    """The instances tried after 1, in order: the count that saturates the widest GPU link under
    the fastest protocol so far (from `first`; the likeliest winner for a large transfer, tried
    early so a tight time limit still reaches it), that protocol's counts for its other GPU links,
    largest first (the next likeliest where the first needs more thread blocks than fit), then the
    doublings and the other protocols' saturating counts."""
    mine = sorted((c for c in first if 1 < c <= MAX_INSTANCES), reverse=True) or [2]
    rest = sorted({2 ** i for i in range(1, 6)} | {c for c in others if 1 < c <= MAX_INSTANCES})
    return mine + [c for c in rest if c not in mine]


def saturating_counts(topology: Topology, protos: tuple[str, ...]) -> set[int]:
    """Instances that give a transfer alone on a GPU's link one thread block more than the link's
    lanes (compiler/lowering/channels.lane_widths): a thread block pays the step latency after each
    step, so a link is full only while more thread blocks than lanes take turns on it."""
    out = set()
    for p in protos:
        costing = Costing.of(topology, p)
        out |= {costing.lanes(l.bandwidth, l.kind or "nvlink") + 1 for l in topology.links if topology.is_gpu(l.src)}
    return out


def _keep_faster(timed: dict[str, tuple[Program, ProgramTiming]], schedule: Schedule, topology: Topology,
                 options: LowerOptions, stop_at: float, only: tuple[str, ...] | None = None) -> dict[str, float]:
    """Replace a protocol's program in `timed` by one lowered with `options` where that is faster:
    every send and receive peer on a thread block of its own (pair_peers off: a block that both
    sends to and receives from a peer takes turns, which halves a busy NVSwitch fan-out; more
    blocks can also lose, where more of them than a link's lanes contend first come, first served),
    sends not paced (pace off: a paced link lets a send go only when the one before it is done, step
    latency included, which serialises latency-bound small transfers the plan overlaps), more runs
    in flight on paced links (pace_ahead: the lanes of a link whose runs start and end together
    idle through each step latency; the extra runs can also lose, taking a lane out of schedule
    order), sends through a NIC gated by the receive their rank is planned to have just before
    them (gate_slow: two ranks sharing a NIC take it first come, first served, out of the
    schedule's order, unless something makes the later one wait; the gate can also delay a send
    behind a receive that runs late), or every instance on its own channel (fit_lanes off: can beat
    lane-aware placement where step latency, not a link's lanes, limits a transfer), if the thread
    blocks fit. only: the protocols to try it with (default: every one in `timed`). Returns each
    one's time with `options` (none where the blocks do not fit)."""
    try:
        other = _time_all(schedule, topology, options, only or tuple(timed), stop_at)
    except CompileError:
        return {}
    for p, (prog, t) in other.items():
        if t.finish_time_s < timed[p][1].finish_time_s:
            timed[p] = (prog, t)
    return {p: t.finish_time_s for p, (_, t) in other.items()}


@dataclass(frozen=True)
class _Known:
    """A lowering and timing done before: the program and its timing, or the error lowering raised."""
    schedule: Schedule  # held, so that its transfers' id stays its own
    topology: Topology
    value: tuple[Program, ProgramTiming] | CompileError
    steps: int

    def result(self) -> tuple[Program, ProgramTiming]:
        if isinstance(self.value, CompileError):
            raise self.value
        return self.value


class _Lowered:
    """The programs realise lowered and timed, by schedule, topology and lowering options, so that
    realising a schedule again replays its search at no cost and goes on where its deadline cut it
    (auto resumes its best candidate's search in the time its judging left: `resume`). Programs of
    LARGE_PROGRAM transfers or more are not kept; past MEMO_STEPS steps the oldest go."""

    def __init__(self) -> None:
        self.known: OrderedDict[tuple, _Known] = OrderedDict()
        self.steps = 0

    def get(self, schedule: Schedule, topology: Topology, options: LowerOptions) -> _Known | None:
        hit = self.known.get((id(schedule.transfers), id(topology), options))
        if hit is None or hit.schedule.transfers is not schedule.transfers or hit.topology is not topology:
            return None
        return hit

    def put(self, schedule: Schedule, topology: Topology, options: LowerOptions,
            value: tuple[Program, ProgramTiming] | CompileError) -> None:
        if len(schedule.transfers) >= LARGE_PROGRAM:
            return
        steps = 0 if isinstance(value, CompileError) else value[0].nsteps_total
        key = (id(schedule.transfers), id(topology), options)
        if key in self.known:
            self.steps -= self.known.pop(key).steps
        self.known[key] = _Known(schedule, topology, value, steps)
        self.steps += steps
        while self.steps > MEMO_STEPS and len(self.known) > 1:
            self.steps -= self.known.popitem(last=False)[1].steps


MEMO_STEPS = 1_000_000  # program steps LOWERED keeps (a few hundred MB at most)
LOWERED = _Lowered()


def _step_scaled(topology: Topology, first: str, seconds: float) -> Callable[[str], float]:
    """protocol -> `seconds` (what the first protocol's program lost to lowering) times the ratio of
    its longest step latency to the first's."""
    step = lambda q: max(v for _, v in Costing.of(topology, q).cost.step)  # noqa: E731
    return lambda q: seconds * step(q) / step(first)


def _time_all(schedule: Schedule, topology: Topology, options: LowerOptions, protos: tuple[str, ...],
              stop_at: float, ideal: Ideals | None = None,
              enough_s: float | None = None, first: list[float] | None = None,
              as_first: bool = False, until: float | None = None) -> dict[str, tuple[Program, ProgramTiming]]:
    """Each protocol's program and its time; one lowering per distinct number of connection slots,
    the first always, another only if one more lowering as long as the first fits before stop_at.
    ideal: where given, a protocol whose ideal program is no faster than a program timed already
    is passed over (no program is faster than its ideal); with as_first (AS_FIRST_PROGRAM transfers
    or more, whose lowerings take tens of seconds), also one whose ideal program, plus the seconds
    the first protocol's program lost to lowering scaled by the two protocols' step latencies, is
    no faster: a program loses its time waiting on steps that its thread blocks serialise, so a
    protocol of shorter steps loses less (DGX H100 x 64 reduce-scatter: Simple's and LL128's
    programs were 1.067 and 1.065 x their ideals, and LL128's ideal, 2.881 ms, was just under
    Simple's program, 2.886: its 24 s of lowering and timing kept the second process's faster
    program from arriving by the limit; MI250 x 16 alltoall 1 MB: Simple's program lost 329 us to
    its ideal, 110 us, and LL, whose ideal is 175 us, was not lowered by the share Simple lost,
    where its program takes 294 us against Simple's 439). first: if given, gets the seconds the
    first protocol took (its lowering and timing: the least another count costs). until: lower's (a
    failure it cuts short is not kept in LOWERED)."""
    lowered: dict[int, Program] = {}
    out = {}
    t0 = time.perf_counter()
    lost = lambda q: 0.0  # noqa: E731  # what protocol q's program may lose to lowering, from the first's loss
    for p in protos:
        if ideal and out and (ideal.at_least(p) + lost(p) >= _fastest_s(out) or ideal[p] + lost(p) >= _fastest_s(out)):
            continue
        at = replace(options, proto=p)
        known = LOWERED.get(schedule, topology, at)
        if known is not None:
            out[p] = known.result()
        else:
            if SLOTS[p] not in lowered:
                if lowered and time.perf_counter() + (time.perf_counter() - t0) / len(lowered) > stop_at:
                    continue
                try:
                    lowered[SLOTS[p]] = lower(schedule, topology, at, until=until)
                except CompileError as e:
                    if not getattr(e, "cut", False):
                        LOWERED.put(schedule, topology, at, copy.copy(e))  # without its traceback's frames
                    raise
            program = replace(lowered[SLOTS[p]], proto=p)
            out[p] = (program, time_program(program, topology, size_of(schedule, program)))
            LOWERED.put(schedule, topology, at, out[p])
        if first is not None and not first:
            first.append(time.perf_counter() - t0)
        if as_first and ideal and len(out) == 1:
            lost = _step_scaled(topology, p, max(0.0, out[p][1].finish_time_s - ideal[p]))
        if enough_s is not None and out[p][1].finish_time_s <= enough_s:
            break
    return out
