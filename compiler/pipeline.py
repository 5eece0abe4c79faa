"""The one wiring of the stages: plan, simulate, lower, verify, time the program.

    compile(topology, demand, options) -> Result
    compile_schedule(topology, schedule, options) -> Result    (a saved schedule: no planning)
    library(topology, LibraryOptions) -> Library                (one Result per collective and size band)

The command line, the benchmarks and the tests call these; none of them wires the stages again.
A Result holds every stage's value and says which files to write (`files`), but writes nothing:
rendering XML is the back end's (backends/msccl_xml.py), and the caller decides where output goes.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field, replace

from compiler.analysis.bounds import busbw, lower_bound
from compiler.analysis.crossovers import Band, crossover_bands
from compiler.analysis.simulate import Ideals, Metrics, best_ideal, bound_of, program_floor, simulate
from compiler.lowering.lower import LowerOptions, lower
from compiler.model.demand import Demand, demand_chunks, make_demand
from compiler.model.program import AUTO, Program
from compiler.model.schedule import Schedule
from compiler.model.topology import Topology
from compiler.planners import PlanOptions, plan
from compiler.planners.background import workers
from compiler.program.timing import ProgramTiming, time_program
from compiler.realise import Realisation, aimed_runtime, protocols, realise, size_of
from compiler.program.verify import Verdict, verify
from compiler.specs.collectives import CUSTOM, spec
from compiler.specs.errors import CompileError
from compiler.specs.runtimes import ALL, DEFAULT, RUNTIMES, target_runtimes, twin_runtime
from compiler.specs.units import format_size

PLAN_SHARE = 0.85  # of the time limit for planning when a program is written: realising it takes the rest
AUTO_PLAN_SHARE = 0.6  # auto's planning share: realising its best candidates to rank them takes up to PLAN_SHARE
PROBED_PLACEMENT = {"pace": False, "pair_peers": False, "rotate_slow": 2}  # a probe's second lowering: what wins
# most often where small sends are latency-bound (realise._placements; the turns apply only through a NIC)
STALL = 1.0  # a search auto cuts (the optimisers' candidates wait) also ends once it has gone this many times as long
# past its latest gain as it took to find it (realise's stall): DGX H100 x 4 allreduce 25 MB at 60 s, hier/8ch's search
# found its program 3.3 s in and ran 20 s more, hier/4ch's the rest, and hier/1ch, 0.782 of the floor against 0.684,
# was never judged
FINISH_BY = 1.1  # of the time limit by which the chosen program is verified and written too (realise's finish_by;
# the promise is 1.1 x the limit + 5 s, the 5 s for starting and ending the process): at 512 GPUs that takes 24 s
JUDGE_SHARE = 0.92  # of the time limit by which a candidate auto judges is realised (verifying and timing the
# chosen program take the rest: a judge that began just before PLAN_SHARE once ran to the limit, and writing on)
MULTICAST_SKIP = "switch multicast (NVLS) has no MSCCL XML form; plan without `multicast` to get XML"


@dataclass(frozen=True)
class CompileOptions:
    plan: PlanOptions = field(default_factory=PlanOptions)
    # protocol and instances auto (compiler/realise.py) unless fixed; its runtime is set from `runtime`
    lower: LowerOptions = field(default_factory=lambda: LowerOptions(proto=AUTO, instances=0))
    runtime: str = ALL  # the runtimes to write for: one, or all that have the collective
    xml: bool = True  # lower, verify and time a program (else plan and simulate only)
    output: str | None = None  # the XML's path (default: default_xml_name)
    finish_by: float | None = None  # time.perf_counter() value by which the program is to be verified and written


@dataclass(frozen=True)
class XmlFile:
    """A file to write: `program` as XML spelled for runtime `spelling`."""
    path: str
    program: Program
    spelling: str


@dataclass(frozen=True)
class Result:
    topology: Topology
    schedule: Schedule
    planned: Metrics  # the schedule's time: the simulator's ideal program of the program's protocol
    runtime: str = ALL  # as asked
    program: Program | None = None
    timing: ProgramTiming | None = None  # the program's time (what the user gets)
    verdict: Verdict | None = None
    runtimes: tuple[str, ...] = ()  # verified for
    files: tuple[XmlFile, ...] = ()
    skipped: str | None = None  # why there is no program
    realisation: Realisation | None = None  # how the program was chosen (protocol, instances)

    @property
    def demand(self) -> Demand:
        return self.schedule.demand  # as planned: auto may have cut chunks finer

    @property
    def notes(self) -> tuple[str, ...]:
        return self.schedule.notes + (self.realisation.notes() if self.realisation else ())

    @property
    def time_s(self) -> float:
        """What the user gets: the program's time, or the plan's where there is no program."""
        return self.timing.finish_time_s if self.timing else self.planned.finish_time_s

    @property
    def bound_ratio(self) -> float:
        t = self.time_s
        return self.planned.lower_bound_s / t if t > 0 else 1.0

    def summary(self) -> dict:
        """The figures every caller reports (the --json fields of a compile): the program's, with
        the plan's beside them as planned_*."""
        s, m, topo, demand = self.schedule, self.planned, self.topology, self.demand
        t = self.time_s
        algbw = per_second(demand.size_bytes, t)
        out = {
            "collective": demand.collective, "hw": topo.profile, "nodes": topo.nodes, "ngpus": topo.ngpus,
            "size_bytes": demand.size_bytes, "chunks": demand.chunks_per_rank, "method": s.planner,
            "status": s.status, "gap": s.gap, "solve_time_s": s.solve_time, "epochs": s.epochs, "epoch_s": s.tau,
            "transfer_time_s": t, "algbw_GBps": algbw / 1e9, "busbw_GBps": busbw(demand.collective, demand.ngpus,
                                                                                  algbw) / 1e9,
            "lower_bound_s": m.lower_bound_s, "bound_ratio": self.bound_ratio,
            "planned_transfer_time_s": m.finish_time_s, "planned_algbw_GBps": m.algbw / 1e9,
            "planned_busbw_GBps": m.busbw / 1e9, "planned_bound_ratio": m.bound_ratio,
            "output_buffer_bytes": m.output_buffer_bytes, "scratch_bytes": m.scratch_bytes,
            "ntransfers": len(s.transfers), "lp_value_s": s.lp_value, "notes": list(self.notes),
        }
        if self.skipped:
            out.update(xml=None, verified=None, xml_skipped=self.skipped)
        elif self.program is None:
            out.update(xml=None, verified=None)
        else:
            p = self.program
            out.update(xml=self.files[0].path, xml_files=[f.path for f in self.files], verified=self.verdict.ok,
                       runtime=self.runtime, verified_for=list(self.runtimes), nchannels=p.nchannels,
                       nthreadblocks_max=p.nthreadblocks_max, nsteps_max=p.nsteps_max, proto=p.proto,
                       instances=self.realisation.instances if self.realisation else None,
                       iterations=self.timing.iterations)
            if demand.collective != CUSTOM and self.realisation:  # the runtimes run it only at these sizes
                out["runs_at_multiples_of_bytes"] = p.nchunksperloop * self.realisation.element_bytes
        if demand.collective == CUSTOM:
            out["demand_chunks"], out["chunk_size_bytes"] = demand_chunks(demand)
        return out


def per_second(nbytes: float, seconds: float) -> float:
    return nbytes / seconds if seconds > 0 else float("inf")


def default_xml_name(demand: Demand, topo: Topology) -> str:
    nodes = f"-n{topo.nodes}" if topo.nodes > 1 else ""
    return f"{demand.collective.replace('_', '-')}-{topo.profile.replace(':', '')}{nodes}.xml"


def compile(topology: Topology, demand: Demand, options: CompileOptions = CompileOptions()) -> Result:
    """Plan `demand` on `topology`, then everything compile_schedule does. With a program to write,
    auto judges its candidates by their realised programs (a candidate that cannot be lowered for
    the target runtimes is no candidate)."""
    judged: dict[int, tuple[Schedule, Realisation]] = {}
    plan_options = options.plan
    if options.xml and not options.plan.multicast:
        now = time.perf_counter()
        end = plan_options.deadline or now + plan_options.time_limit  # the promise, lowering included
        options = replace(options, plan=replace(plan_options, deadline=end),
                          finish_by=now + (end - now) * FINISH_BY)
        share = PLAN_SHARE if plan_options.method != "auto" else AUTO_PLAN_SHARE
        plan_options = replace(plan_options, deadline=now + (end - now) * share,
                               judge_until=now + (end - now) * PLAN_SHARE,
                               judge=lambda s, by=None: _judge(s, topology, options, judged,
                                                               min(now + (end - now) * JUDGE_SHARE, by or end),
                                                               STALL if by is not None else None),
                               probe=lambda s: _probe(s, topology, options))
    schedule = plan(topology, demand, plan_options)
    known = judged.get(id(schedule.transfers))
    return compile_schedule(topology, schedule, options, known[1] if known else None)


def _judge(schedule: Schedule, topology: Topology, options: CompileOptions, judged: dict, by: float,
           stall: float | None = None) -> float:
    """The time of the program `schedule` realises by `by` (raises CompileError if none fits the runtimes);
    judged again (auto's `resume`), the faster realisation is kept. stall: realise's (where auto gives
    the search an end of its own, other candidates wait to be judged)."""
    r = realise(schedule, topology, options.lower, options.runtime, by,
                enough_time(topology, schedule, options.plan.good_enough), options.plan.element_bytes,
                workers(options.plan.workers), stall, options.finish_by)
    before = judged.get(id(schedule.transfers))
    if before is not None and before[1].timing.finish_time_s < r.timing.finish_time_s:
        r = before[1]
    judged[id(schedule.transfers)] = (schedule, r)  # the schedule keeps its transfers' id valid
    return r.timing.finish_time_s


def _probe(schedule: Schedule, topology: Topology, options: CompileOptions) -> float:
    """The time of the program `schedule` lowers to with one instance (or the instances asked for)
    and the protocol of its best ideal program (or the one asked for): the faster of the placement
    realise starts from and, where sends may go unpaced, of PROBED_PLACEMENT (a ranking, not a
    choice: DGX-2 x 2 allgather 1 MB, hier at 1, 2 and 4 chunks, probed 34.9, 49.5 and 58.0 us
    with the first alone, and realise made 31.9, 28.6 and 26.3 of them)."""
    lowering = options.lower if options.lower.instances else replace(options.lower, instances=1)
    if lowering.proto == AUTO:
        best = Ideals(topology, schedule, protocols(topology, AUTO)).ranked()[0]
        lowering = replace(lowering, proto=best)
    lowering = replace(lowering, runtime=aimed_runtime(schedule, options.runtime, topology.vendor))
    placements = [lowering] + ([replace(lowering, **PROBED_PLACEMENT)] if lowering.pace else [])
    times = []
    for placed in placements:
        try:
            program = lower(schedule, topology, placed)
        except CompileError:
            if placed is lowering:
                raise
            continue
        times.append(time_program(program, topology, size_of(schedule, program)).finish_time_s)
    return min(times)


def compile_schedule(topology: Topology, schedule: Schedule, options: CompileOptions = CompileOptions(),
                     realised: Realisation | None = None) -> Result:
    """Unless options.xml is off, realise the schedule as the fastest program for the runtimes its
    collective targets, verify it (an unverified program is a bug, raised as such) and time it;
    simulate the schedule as the ideal program of the same protocol (the planned time)."""
    if not options.xml or any(t.group >= 0 for t in schedule.transfers):
        planned = best_ideal(topology, schedule, protocols(topology, options.lower.proto))  # the best protocol's
        result = Result(topology, schedule, planned, options.runtime)
        return result if not options.xml else replace(result, skipped=MULTICAST_SKIP)
    r = realised or realise(schedule, topology, options.lower, options.runtime, options.plan.deadline,
                            enough_time(topology, schedule, options.plan.good_enough), options.plan.element_bytes,
                            workers(options.plan.workers), finish_by=options.finish_by)
    program = r.program
    runtimes = target_runtimes(schedule.demand.collective, options.runtime, topology.vendor)
    verdict = verify(program, options.runtime, demand=schedule.demand.split(r.instances), sms=topology.sms)
    if not verdict.ok:
        raise CompileError(f"internal: the lowered program failed verification for {'/'.join(runtimes)} "
                           f"({verdict.summary()}); please report this with the saved schedule")
    planned = simulate(topology, schedule, program.proto)
    path = options.output or default_xml_name(schedule.demand, topology)
    return Result(topology, schedule, planned, options.runtime, program, r.timing, verdict, runtimes,
                  xml_files(program, path, options.runtime, runtimes), realisation=r)


def enough_time(topology: Topology, schedule: Schedule, good_enough: float) -> float | None:
    """The program time at which no other program could gain more than 1 - good_enough: the
    program floor (what any program pays at least) over good_enough; None where the search is to
    use its whole time (good_enough of 1 or more)."""
    if good_enough >= 1:
        return None
    return program_floor(topology, bound_of(topology, schedule.demand)) / good_enough


def xml_files(program: Program, path: str, runtime: str, runtimes: tuple[str, ...]) -> tuple[XmlFile, ...]:
    """The XML spelled for its runtime (for several: the spelling they share), plus a twin for a
    runtime that spells the collective apart where "all" was asked for (the old runtime's
    reduce_scatter)."""
    files = [XmlFile(path, program, runtimes[0] if len(runtimes) == 1 else ALL)]
    twin = twin_runtime(program.collective, runtime, runtimes)
    if twin is not None:
        files.append(XmlFile(twin_path(path), program, twin))
    return tuple(files)


def twin_path(path: str) -> str:
    """Where xml_files writes the twin runtime's file of `path`."""
    return path[:-4] + ".legacy.xml" if path.endswith(".xml") else path + ".legacy"


# ---- libraries ----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class LibraryOptions:
    collectives: tuple[str, ...]
    sizes: tuple[int, int]  # [lo, hi], inclusive
    band_factor: int = 4
    method: str = "auto"
    time_limit: float = 10.0  # per band
    proto: str = "auto"  # or one protocol for every band
    runtime: str = DEFAULT
    progress: object = None


@dataclass(frozen=True)
class Library:
    results: tuple[tuple[str, Result], ...]  # (file name, result) per collective and band
    manifest: dict


def size_bands(lo: int, hi: int, factor: int) -> list[tuple[int, int]]:
    """[lo, hi] cut at lo * factor**k into inclusive bands [a, b] with no gap and no overlap."""
    if factor < 2:
        raise CompileError(f"band factor: {factor} must be at least 2 (each band spans a factor of sizes)")
    edges = [lo]
    while edges[-1] * factor < hi:
        edges.append(edges[-1] * factor)
    return [(a, (edges[i + 1] - 1) if i + 1 < len(edges) else hi) for i, a in enumerate(edges)]


def band_demand(topo: Topology, collective: str, a: int, b: int) -> Demand:
    """The demand a band is planned at: the power-of-two size nearest below its geometric middle
    (served_size). The runtimes run a file only at sizes that are whole elements in each of its
    chunks (msccl-xml.md §4), and callers' sizes are mostly powers of two times a few factors
    (nccl-tests doubles, DDP buckets 25 MiB, tensors have power-of-two dimensions): planned at
    such a size, auto's chunkings and realise's instance counts divide it (divides), so the program
    written runs at every power of two in its band from its nchunksperloop x 4 bytes up, where one
    planned at 10^6 B with 3 instances (nchunksperloop 24) ran at none."""
    return make_demand(collective, topo.ngpus, served_size(topo, collective, a, b, int(math.sqrt(a * max(a, b)))))


def served_size(topo: Topology, collective: str, a: int, b: int, near: int, grain: int = 4) -> int:
    """The size of [a, b] nearest `near` (below it first) that is the collective's unit (a rank's
    block count x 4 bytes: the output of allgather, one element of allreduce) times a power of two
    and a multiple of `grain` (whole elements in every chunk of a program); the largest multiple of
    the unit and grain not above `near`, where the band holds none."""
    unit = spec(collective).blocks("size", topo.ngpus) * 4
    step = math.lcm(unit, grain)
    ladder = [unit << j for j in range(max(0, (b // unit).bit_length()))]
    fits = [s for s in ladder if a <= s <= b and s % grain == 0]
    if fits:
        return max((s for s in fits if s <= near), default=min(fits))
    return max(step, near - near % step)


def library(topo: Topology, options: LibraryOptions, done=None) -> Library:
    """One verified program per collective and size band. Each coarse band (`size_bands`) is
    planned and realised at its middle (`done(label, result)` is told of each); then every size is
    given to the fastest of those programs by the program timer, so the bands written are the
    model's crossovers (compiler/analysis/crossovers.py) and a program that wins nowhere is not
    written."""
    bands = size_bands(*options.sizes, options.band_factor)
    results, entries = [], []
    for coll in options.collectives:
        planned = []
        for a, b in bands:
            demand = band_demand(topo, coll, a, b)
            lower_options = LowerOptions(proto=options.proto, instances=0, min_bytes=a, max_bytes=b,
                                         runtime=options.runtime)
            plan_options = PlanOptions(method=options.method, time_limit=options.time_limit, refine=True,
                                       progress=options.progress)
            result = compile(topo, demand, CompileOptions(plan_options, lower_options, options.runtime,
                                                          output=f"{coll}-{format_size(a)}-{format_size(b)}"))
            planned.append(result)
            if done is not None:
                done(f"{coll} {format_size(a)}..{format_size(b)}", result)
        for name, result, entry in _banded(topo, coll, planned, options):
            results.append((name, result))
            entries.append(entry)
    too_many(options, results)
    manifest = {"format": "msccl-compile/library-v1", "hw": topo.profile, "nodes": topo.nodes, "ngpus": topo.ngpus,
                "runtime": options.runtime, "sizes": list(options.sizes), "bands": "program timer crossovers",
                "algorithms": entries}
    return Library(tuple(results), manifest)


def too_many(options: LibraryOptions, results: list[tuple[str, Result]]) -> None:
    """Refuse a library of more files than its runtime loads (the old one: 4). The CLI checks the bands
    planned before planning, but the files are the crossover bands, which can be more (a program
    that wins on both sides of another's band)."""
    most = RUNTIMES[options.runtime].max_algorithms if options.runtime in RUNTIMES else None
    files = sum(len(r.files) for _, r in results)
    if most is not None and files > most:
        per = ", ".join(f"{c} {sum(len(r.files) for _, r in results if r.demand.collective == c)}"
                        for c in options.collectives)
        raise CompileError(f"library: the {options.runtime} runtime loads at most {most} algorithms, and the "
                           f"programs planned cross over into {files} bands ({per}); raise `band_factor` or narrow "
                           "`sizes`")


def _banded(topo: Topology, coll: str, planned: list[Result], options: LibraryOptions):
    """(file name, result, manifest entry) per band of the crossovers among `planned`."""
    programs = [r.program for r in planned]
    grain = math.lcm(*(p.nchunksperloop for p in programs)) * 4  # whole float32 elements in every chunk
    lo, hi = options.sizes
    same = [replace(p, min_bytes=0, max_bytes=0) for p in programs]
    distinct = sorted({same.index(p) for p in same})  # two bands that planned one program share its first copy
    # every program at every size (DGX A100 allgather: the program planned at 512 MB is 5 % faster at 16 MB than
    # the one planned there; comparing a band's own and its neighbours' programs alone gave 16 MB to the latter)
    # a band's figures are taken at a size its program runs at (whole elements in each of its chunks)
    def middle(a: int, b: int, owner: int) -> int:
        return served_size(topo, coll, a, b, int(math.sqrt(a * b)), 4 * programs[owner].nchunksperloop)
    for n, band in enumerate(crossover_bands(programs, topo, lo, hi, lambda size: distinct, grain, middle)):
        result = planned[band.program]
        a, b = band.lo, band.hi
        name = f"{coll.replace('_', '-')}-{n:02d}-{format_size(a)}-{format_size(b)}.xml"
        program = replace(result.program, min_bytes=a, max_bytes=b,
                          name=f"{coll}-{topo.name}-{format_size(a)}-{format_size(b)}")
        banded = replace(result, program=program, files=xml_files(program, name, options.runtime, result.runtimes))
        yield name, banded, manifest_entry(name, coll, banded, planned, band)


def manifest_entry(name: str, coll: str, result: Result, planned: list[Result], band: Band) -> dict:
    """A band's figures are its program's at the band's middle (protocol and instances chosen by the
    cost model), the runner-up's there beside them (both as crossover_bands timed them), and the
    plan's at the size it was planned for."""
    s, m, p, topo = result.schedule, result.planned, result.program, result.topology
    a, b, mid, t = band.lo, band.hi, band.at, band.time_s
    bound = program_floor(topo, lower_bound(topo, coll, mid))
    entry = {"file": name, "collective": coll, "min_bytes": a, "max_bytes": b, "at_bytes": mid,
             "method": s.planner, "chunks": s.demand.chunks_per_rank, "proto": p.proto,
             "instances": result.realisation.instances, "nchunksperloop": p.nchunksperloop, "time_s": t, "algbw_GBps": per_second(mid, t) / 1e9,
             "bound_ratio": bound / t if t > 0 else 1.0,
             "planned_at_bytes": s.demand.size_bytes, "planned_time_s": m.finish_time_s,
             "planned_bound_ratio": m.bound_ratio, "runner_up": None,
             "why": list(result.notes[:2]) + list(result.realisation.notes()[:1]),
             "inplace": p.inplace, "outofplace": p.outofplace}
    if band.runner_up is not None:
        other, t2 = planned[band.runner_up], band.runner_up_s
        entry["runner_up"] = {"method": other.schedule.planner, "chunks": other.schedule.demand.chunks_per_rank,
                              "proto": other.program.proto, "instances": other.realisation.instances,
                              "planned_at_bytes": other.schedule.demand.size_bytes, "time_s": t2,
                              "slower": t2 / t if t > 0 else 1.0}
    return entry
