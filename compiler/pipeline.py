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
from dataclasses import dataclass, field, replace

from compiler.analysis.simulate import Metrics, simulate
from compiler.lowering.lower import LowerOptions, lower
from compiler.model.demand import Demand, make_demand
from compiler.model.program import Program
from compiler.model.schedule import Schedule
from compiler.model.topology import Topology
from compiler.planners import PlanOptions, plan
from compiler.program.timing import ProgramTiming, call_bytes, time_program
from compiler.program.verify import Verdict, verify
from compiler.specs.collectives import CUSTOM, spec
from compiler.specs.errors import CompileError
from compiler.specs.runtimes import ALL, DEFAULT, target_runtimes, twin_runtime
from compiler.specs.units import format_size

MULTICAST_SKIP = "switch multicast (NVLS) has no MSCCL XML form; plan without `multicast` to get XML"


@dataclass(frozen=True)
class CompileOptions:
    plan: PlanOptions = field(default_factory=PlanOptions)
    lower: LowerOptions = field(default_factory=LowerOptions)  # its runtime is set from `runtime`
    runtime: str = ALL  # the runtimes to write for: one, or all that have the collective
    xml: bool = True  # lower, verify and time a program (else plan and simulate only)
    output: str | None = None  # the XML's path (default: default_xml_name)


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
    planned: Metrics  # the schedule's time (the simulator)
    runtime: str = ALL  # as asked
    program: Program | None = None
    timing: ProgramTiming | None = None  # the program's time
    verdict: Verdict | None = None
    runtimes: tuple[str, ...] = ()  # verified for
    files: tuple[XmlFile, ...] = ()
    skipped: str | None = None  # why there is no program

    @property
    def demand(self) -> Demand:
        return self.schedule.demand  # as planned: auto may have cut chunks finer

    @property
    def notes(self) -> tuple[str, ...]:
        return self.schedule.notes

    def summary(self) -> dict:
        """The figures every caller reports (the --json fields of a compile)."""
        s, m, topo, demand = self.schedule, self.planned, self.topology, self.demand
        out = {
            "collective": demand.collective, "hw": topo.profile, "nodes": topo.nodes, "ngpus": topo.ngpus,
            "size_bytes": demand.size_bytes, "chunks": demand.chunks_per_rank, "method": s.planner,
            "status": s.status, "gap": s.gap, "solve_time_s": s.solve_time, "epochs": s.epochs, "epoch_s": s.tau,
            "transfer_time_s": m.finish_time_s, "algbw_GBps": m.algbw / 1e9, "busbw_GBps": m.busbw / 1e9,
            "lower_bound_s": m.lower_bound_s, "bound_ratio": m.bound_ratio,
            "output_buffer_bytes": m.output_buffer_bytes, "scratch_bytes": m.scratch_bytes,
            "ntransfers": len(s.transfers), "lp_value_s": s.lp_value, "notes": list(s.notes),
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
                       program_time_s=self.timing.finish_time_s,
                       program_algbw_GBps=per_second(demand.size_bytes, self.timing.finish_time_s) / 1e9)
        if demand.collective == CUSTOM:
            out["demand_chunks"], out["chunk_size_bytes"] = demand_chunks(demand)
        return out


def per_second(nbytes: float, seconds: float) -> float:
    return nbytes / seconds if seconds > 0 else float("inf")


def demand_chunks(demand: Demand) -> tuple[int, float]:
    """(chunks of a custom demand as its file lists them, bytes of each): the planners may have
    cut each into demand.chunks_per_rank pieces."""
    n = max(1, len(demand.chunks) // demand.chunks_per_rank)
    each = demand.size_bytes / n
    return n, int(each) if float(each).is_integer() else each


def default_xml_name(demand: Demand, topo: Topology) -> str:
    nodes = f"-n{topo.nodes}" if topo.nodes > 1 else ""
    return f"{demand.collective.replace('_', '-')}-{topo.profile.replace(':', '')}{nodes}.xml"


def compile(topology: Topology, demand: Demand, options: CompileOptions = CompileOptions()) -> Result:
    """Plan `demand` on `topology`, then everything compile_schedule does."""
    return compile_schedule(topology, plan(topology, demand, options.plan), options)


def compile_schedule(topology: Topology, schedule: Schedule, options: CompileOptions = CompileOptions()) -> Result:
    """Simulate the schedule; unless options.xml is off, lower it for the runtimes its collective
    targets, verify the program (an unverified program is a bug, raised as such) and time it."""
    planned = simulate(topology, schedule)
    result = Result(topology, schedule, planned, options.runtime)
    if not options.xml:
        return result
    if any(t.group >= 0 for t in schedule.transfers):
        return replace(result, skipped=MULTICAST_SKIP)
    program, verdict, runtimes = lower_verified(schedule, topology, options.lower, options.runtime)
    path = options.output or default_xml_name(schedule.demand, topology)
    size = schedule.demand.size_bytes
    if program.collective == CUSTOM:
        size = call_bytes(program, demand_chunks(schedule.demand)[1])
    return replace(result, program=program, verdict=verdict, runtimes=runtimes,
                   files=xml_files(program, path, options.runtime, runtimes),
                   timing=time_program(program, topology, size))


def lower_verified(schedule: Schedule, topology: Topology, options: LowerOptions,
                   runtime: str) -> tuple[Program, Verdict, tuple[str, ...]]:
    """Lower within the limits of the runtimes the collective targets and verify for them."""
    runtimes = target_runtimes(schedule.demand.collective, runtime)
    aimed = runtimes[0] if len(runtimes) == 1 else runtime  # custom: the old runtime's limits
    program = lower(schedule, topology, replace(options, runtime=aimed))
    verdict = verify(program, runtime, demand=schedule.demand.split(options.instances), sms=topology.sms)
    if not verdict.ok:
        raise CompileError(f"internal: the lowered program failed verification for {'/'.join(runtimes)} "
                           f"({verdict.summary()}); please report this with the saved schedule")
    return program, verdict, runtimes


def xml_files(program: Program, path: str, runtime: str, runtimes: tuple[str, ...]) -> tuple[XmlFile, ...]:
    """The XML spelled for its runtime (for several: the spelling they share), plus a twin for a
    runtime that spells the collective apart where "all" was asked for (the old runtime's
    reduce_scatter)."""
    files = [XmlFile(path, program, runtimes[0] if len(runtimes) == 1 else ALL)]
    twin = twin_runtime(program.collective, runtime)
    if twin is not None:
        legacy = path[:-4] + ".legacy.xml" if path.endswith(".xml") else path + ".legacy"
        files.append(XmlFile(legacy, program, twin))
    return tuple(files)


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
    edges = [lo]
    while edges[-1] * factor < hi:
        edges.append(edges[-1] * factor)
    return [(a, (edges[i + 1] - 1) if i + 1 < len(edges) else hi) for i, a in enumerate(edges)]


def band_protocol(topo: Topology, hi: int) -> str:
    """LL for small messages, LL128 for medium ones where NCCL trusts it (NVLink), Simple above."""
    if hi <= 256 * 1024:
        return "LL"
    if hi <= 4 * 1024 * 1024 and topo.vendor == "nvidia":
        return "LL128"
    return "Simple"


def band_demand(topo: Topology, collective: str, a: int, b: int) -> Demand:
    """The demand a band is planned at: its geometric middle, rounded to whole 4-byte elements per chunk."""
    size = int(math.sqrt(a * max(a, b)))
    n_chunks = spec(collective).blocks("size", topo.ngpus)
    return make_demand(collective, topo.ngpus, max(n_chunks * 4, size - size % (n_chunks * 4)))


def library(topo: Topology, options: LibraryOptions, done=None) -> Library:
    """One verified program per collective and size band; `done(name, result)` is told of each."""
    bands = size_bands(*options.sizes, options.band_factor)
    results, entries = [], []
    for coll in options.collectives:
        for i, (a, b) in enumerate(bands):
            demand = band_demand(topo, coll, a, b)
            proto = band_protocol(topo, b) if options.proto == "auto" else options.proto
            name = f"{coll.replace('_', '-')}-{i:02d}-{format_size(a)}-{format_size(b)}.xml"
            lower_options = LowerOptions(proto=proto, min_bytes=a, max_bytes=b, runtime=options.runtime,
                                         name=f"{coll}-{topo.name}-{format_size(a)}-{format_size(b)}")
            plan_options = PlanOptions(method=options.method, time_limit=options.time_limit, refine=True,
                                       progress=options.progress)
            result = compile(topo, demand, CompileOptions(plan_options, lower_options, options.runtime,
                                                          output=name))
            results.append((name, result))
            entries.append(manifest_entry(name, coll, a, b, demand.size_bytes, proto, result))
            if done is not None:
                done(name, result)
    manifest = {"format": "msccl-compile/library-v1", "hw": topo.profile, "nodes": topo.nodes, "ngpus": topo.ngpus,
                "runtime": options.runtime, "sizes": list(options.sizes), "algorithms": entries}
    return Library(tuple(results), manifest)


def manifest_entry(name: str, coll: str, a: int, b: int, size: int, proto: str, result: Result) -> dict:
    s, m, p = result.schedule, result.planned, result.program
    return {"file": name, "collective": coll, "min_bytes": a, "max_bytes": b, "planned_at_bytes": size,
            "method": s.planner, "chunks": s.demand.chunks_per_rank, "proto": proto,
            "time_s": m.finish_time_s, "algbw_GBps": m.algbw / 1e9,
            "bound_ratio": m.bound_ratio, "why": list(s.notes[:2]),
            "inplace": p.inplace, "outofplace": p.outofplace}
