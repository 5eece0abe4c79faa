"""`msccl-compile COLLECTIVE --hw NAME ...`: flags to options, compiler.pipeline.compile, files, summary."""

from __future__ import annotations

import math
import sys

from compiler.cli.common import (ArgumentError, PROG, Progress, add_hw, emit_json, load_topology, non_negative_float,
                                 positive_int, refuse_disabled_proto, refuse_foreign_runtime, seconds, share, size_arg,
                                 size_range_arg)
from compiler.model.program import AUTO, PROTOCOLS
from compiler.specs.collectives import CUSTOM, SPECS
from compiler.specs.runtimes import ALL, CHOICES
from compiler.specs.units import DTYPE_BYTES, format_size, format_time


def configure(p, name: str) -> None:
    from compiler.planners.registry import METHODS
    add_hw(p)
    p.add_argument("--size", type=size_arg, default=10**9,
                   help="buffer size as nccl-tests counts it (allgather: whole output; alltoall: whole send buffer); "
                        "B, KB/MB/GB, KiB/MiB/GiB (default 1GB)")
    p.add_argument("--chunks", type=positive_int, default=None,
                   help="chunks per rank (default: auto tries 1, 2, 4 and 8 and keeps the fastest; other methods 1)")
    if name in SPECS and SPECS[name].rooted:
        p.add_argument("--root", type=int, default=None, help="root rank (default 0)")
    p.add_argument("--dtype", choices=tuple(DTYPE_BYTES), default="float32",
                   help="element type: a chunk is whole elements (default float32)")
    p.add_argument("--method", choices=METHODS, default="auto")
    p.add_argument("--time-limit", type=seconds, default=60.0, metavar="S",
                   help="seconds for planning (default 60)")
    p.add_argument("--gap", type=non_negative_float, default=1e-4, metavar="G",
                   help="relative MIP gap to stop at (default 1e-4)")
    p.add_argument("--good-enough", type=share, default=0.98, metavar="R",
                   help="stop searching once a written program reaches this share of the lower bound: no other "
                        "could gain more than the rest (default 0.98; 1 uses the whole time limit)")
    p.add_argument("--workers", type=positive_int, default=0, metavar="N",
                   help="processes auto may use: 2 plans the optimisers beside the judging of the constructive "
                        "candidates, and from 40,000 transfers lowers a second placement beside the first "
                        "(default: MSCCL_COMPILE_WORKERS, else 2 where this process may run on two cores)")
    p.add_argument("--max-horizon", type=positive_int, default=None, metavar="K",
                   help="cap on epochs (the horizon is otherwise found from the lower bound)")
    p.add_argument("--multicast", action="store_true",
                   help="let switches marked multicast copy (NVLS); such schedules are simulated, not lowered")
    p.add_argument("--schedule-out", metavar="FILE", help="write the schedule as JSON (see `msccl-compile lower`)")
    add_report(p)
    if name == CUSTOM:
        p.add_argument("--demand", metavar="FILE", help="the demand: JSON {\"chunks\": [{\"from\": 0, \"to\": [1]}]}")
    p.add_argument("--verbose", action="store_true", help="forward the solver log to stderr")
    p.add_argument("-o", "--output", metavar="FILE", help="XML file to write (default COLLECTIVE-PROFILE[-nN].xml)")
    p.add_argument("--no-xml", action="store_true", help="plan and simulate only")
    add_lowering(p)
    p.add_argument("--json", action="store_true")
    p.set_defaults(run=run, collective=name, root=None, demand=None)


def add_lowering(p) -> None:
    """The options of lowering (shared with `msccl-compile lower`)."""
    p.add_argument("--proto", choices=PROTOCOLS + (AUTO,), default=AUTO,
                   help="MSCCL protocol (default auto: the fastest program under the profile's runtime cost model)")
    p.add_argument("--instances", type=instances_arg, default=0, metavar="N|auto",
                   help="copies of the algorithm on separate channels, each on 1/N of every chunk (default auto: "
                        "doubled while the program gets faster and the runtimes allow)")
    p.add_argument("--size-range", type=size_range_arg, metavar="LO:HI",
                   help="sizes [LO, HI) the runtime may use this file for (minBytes/maxBytes)")
    p.add_argument("--runtime", choices=CHOICES, default=ALL,
                   help="the runtime to write for, or all (default) that have the collective, within the strictest "
                        "of their limits")


def instances_arg(text: str) -> int:
    """A whole number >= 1, or auto (0)."""
    return 0 if text == AUTO else positive_int(text)


def add_report(p) -> None:
    p.add_argument("--report", metavar="FILE.html",
                   help="also write an HTML page: links and thread blocks over time in the schedule and the program, "
                        "against ring and the lower bound (needs matplotlib)")


def write_report(result, args) -> None:
    """The --report page of a compile (with the ring baseline for the same demand)."""
    if args.report:
        from backends.report import report_for_result, write_report as write
        write(report_for_result(result, lower_options(args)), html=args.report)


def lower_options(args):
    from compiler.lowering.lower import LowerOptions
    lo, hi = args.size_range if args.size_range else (0, 0)
    return LowerOptions(proto=args.proto, instances=args.instances, min_bytes=lo, max_bytes=hi - 1 if hi else 0)


def run(args) -> int:
    from compiler.pipeline import CompileOptions, compile
    warnings: list[str] = []
    output_checks(args, warnings)
    if not args.no_xml:
        refuse_unsupported(args.collective, args.runtime)
    topo = load_topology(args.hw, args.nodes)
    refuse_foreign_runtime(args.runtime, topo)
    refuse_disabled_proto(args.proto, topo)
    demand = build_demand(args, topo, warnings)
    distinct_outputs(args, demand, topo)
    if args.multicast and not any(s.multicast for s in topo.switches):
        warnings.append(f"--multicast: {topo.name} has no switch that multicasts (a profile marks one \"multicast\": "
                        "true); planned without")
    if args.instances and not args.no_xml:
        check_instances(demand, args.instances, DTYPE_BYTES[args.dtype])
    for w in warnings:
        print(f"{PROG}: warning: {w}", file=sys.stderr)
    result = compile(topo, demand, CompileOptions(plan_options(args), lower_options(args), args.runtime,
                                                  xml=not args.no_xml, output=args.output))
    write(result, args.schedule_out)
    write_report(result, args)
    out = {**result.summary(), "requested_method": args.method, "schedule": args.schedule_out, "warnings": warnings,
           "report": args.report}
    if args.json:
        emit_json(out)
    else:
        print_summary(result, out, args.schedule_out)
        if args.report:
            print(f"report written to {args.report}")
    return 0


def write(result, schedule_out: str | None) -> None:
    """The result's XML files and, if asked for, its schedule (all at the end of the command)."""
    from backends.msccl_xml import save_xml
    for f in result.files:
        save_xml(f.program, f.path, f.spelling)
    if schedule_out:
        result.schedule.save(schedule_out)


def print_summary(result, out: dict, schedule_out: str | None) -> None:
    schedule, metrics, topo, demand = result.schedule, result.planned, result.topology, result.demand
    gap = f", gap {schedule.gap:.2%}" if schedule.gap is not None else ""
    print(f"{demand.collective} on {topo.name} ({topo.ngpus} GPUs), {size_line(demand)}")
    print(f"method {schedule.planner} ({schedule.status}{gap}), planned in {schedule.solve_time:.2f} s, "
          f"{len(schedule.transfers)} transfers over {schedule.epochs} epochs of {format_time(schedule.tau)}")
    if schedule.lp_value is not None:
        print(f"LP value {format_time(schedule.lp_value)}; rounded schedule below")
    what = "program" if result.program is not None else "plan"
    proto = f" ({out['proto']}, {out['instances']} instance{'s' if out['instances'] != 1 else ''})" \
        if result.program is not None else ""
    print(f"{what} time {format_time(out['transfer_time_s'])}{proto}: algbw {out['algbw_GBps']:.2f} GB/s, "
          f"busbw {out['busbw_GBps']:.2f} GB/s, {out['bound_ratio']:.3f} of the bound "
          f"({format_time(metrics.lower_bound_s)})")
    if result.program is not None:
        print(f"planned time {format_time(metrics.finish_time_s)} (the schedule as the ideal program): "
              f"algbw {metrics.algbw / 1e9:.2f} GB/s, {metrics.bound_ratio:.3f} of the bound")
    print(f"output buffer {format_size(metrics.output_buffer_bytes)} per rank"
          + (f", scratch {format_size(metrics.scratch_bytes)}" if metrics.scratch_bytes else ""))
    for note in result.notes:
        print(f"  {note}")
    if out.get("xml"):
        print(f"wrote {', '.join(out['xml_files'])} (verified for {'/'.join(out['verified_for'])}; {out['nchannels']} "
              f"channel{'s' if out['nchannels'] > 1 else ''}, up to {out['nthreadblocks_max']} thread blocks and "
              f"{out['nsteps_max']} steps per block)")
        if out.get("runs_at_multiples_of_bytes"):
            print(f"  {served_sizes(demand.size_bytes, out['runs_at_multiples_of_bytes'])}")
    elif out.get("xml_skipped"):
        print(f"no XML: {out['xml_skipped']}")
    if schedule_out:
        print(f"schedule written to {schedule_out}")


def served_sizes(size: int, grain: int) -> str:
    """Which buffer sizes the runtimes run the file at (whole elements in each of its chunks), with
    the power of two nearest `size` where that is not one of them (a job's tensors mostly are)."""
    power = 1 << max(0, round(math.log2(size)))
    said = f"the runtimes run it where the buffer is a multiple of {format_size(grain)}"
    if power % grain == 0:
        return f"{said}: every power of two from {binary_size(grain)} up"  # grain divides a power of two: is one
    return (f"{said}; not at {binary_size(power)}, the nearest power of two, where they run NCCL's own algorithm "
            f"(compile --size {binary_size(power)} for that size)")


def binary_size(power: int) -> str:
    """A power of two in B, KiB, MiB or GiB."""
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if power >= 1 << shift:
            return f"{power >> shift}{unit}"
    return f"{power}B"


def size_line(demand) -> str:
    """'1MB, 2 chunks per rank'; for a custom demand '64MB per chunk, 2 chunks (128MB in all)'."""
    from compiler.pipeline import demand_chunks
    k = demand.chunks_per_rank
    if demand.collective != CUSTOM:
        return f"{format_size(demand.size_bytes)}, {k} chunk{'s' if k > 1 else ''} per rank"
    n, each = demand_chunks(demand)
    cut = f", each cut into {k} pieces" if k > 1 else ""
    total = format_size(demand.size_bytes)
    return f"{format_size(each)} per chunk, {n} chunk{'s' if n > 1 else ''} ({total} in all){cut}"


def build_demand(args, topo, warnings: list[str]):
    from compiler.model.demand import demand_counts, load_custom_demand, make_demand
    if args.collective == CUSTOM:
        if not args.demand:
            raise ArgumentError("custom: --demand FILE is required")
        make = lambda size: load_custom_demand(args.demand, topo.ngpus, size, args.chunks or 1)  # noqa: E731
    else:
        require_memory(args.collective, topo.ngpus, *demand_counts(args.collective, topo.ngpus, args.chunks or 1))
        make = lambda size: make_demand(args.collective, topo.ngpus, size, args.chunks or 1, args.root)  # noqa: E731
    demand = make(args.size)
    size = whole_elements(demand, args.dtype, args.size)
    if size != args.size:
        warnings.append(f"--size {args.size}B rounded down to {size}B: each of its {round(args.size / demand.chunk_bytes)} "
                        f"chunks must hold whole {args.dtype} elements")
        demand = make(size)
    return demand


def check_instances(demand, instances: int, element_bytes: int) -> None:
    """--instances N that needs more channels than MSCCL has, or whose chunks would split elements at
    --size, before any planning (the runtimes would run NCCL's own algorithm at that size;
    compiler/realise.divides)."""
    from compiler.lowering.lower import too_many_instances
    from compiler.realise import divides, uneven_instances
    too_many = too_many_instances(instances)
    if too_many:
        raise ArgumentError(too_many)
    if not divides(demand, instances, element_bytes):
        raise ArgumentError(uneven_instances(demand, instances, element_bytes))


def whole_elements(demand, dtype: str, size: int) -> int:
    """The largest size <= `size` whose chunks hold whole elements; an error below one element
    per chunk (the runtime splits a buffer into nchunksperloop pieces of whole elements)."""
    elem = DTYPE_BYTES[dtype]
    pieces = round(size / demand.chunk_bytes)
    least = pieces * elem
    if size < least:
        raise ArgumentError(f"--size: {format_size(size)} is below the minimum of {least}B for {demand.collective} on "
                            f"{demand.ngpus} GPUs: {pieces} chunks of at least one {elem}-byte {dtype} element")
    return size - size % least


def plan_options(args):
    from compiler.planners import PlanOptions
    return PlanOptions(method=args.method, time_limit=args.time_limit, gap=args.gap, max_horizon=args.max_horizon,
                       good_enough=args.good_enough, workers=args.workers,
                       multicast=args.multicast, verbose=args.verbose, refine=args.chunks is None,
                       element_bytes=DTYPE_BYTES[args.dtype],
                       progress=Progress(sys.stderr.isatty() and not args.verbose))


def refuse_unsupported(collective: str, runtime: str) -> None:
    """One line, before planning, when the runtime asked for has no `coll` for the collective."""
    from compiler.specs.runtimes import runtime as runtime_spec, target_runtimes
    if runtime == ALL or runtime_spec(runtime).accepts(collective):
        return
    has = ", ".join(target_runtimes(collective))
    why = (f"only the {has} runtime has coll=\"{CUSTOM}\"" if collective == CUSTOM
           else f"its coll attribute has no {collective}")
    raise ArgumentError(f"--runtime: {runtime} cannot run {collective}: {why}; use --runtime {has} or all")


def require_memory(collective: str, ngpus: int, chunks: int, endpoints: int, deliveries: int) -> None:
    from compiler.model import memory
    memory.require(memory.demand_bytes(chunks, endpoints, deliveries),
                   f"{collective} on {ngpus:,} GPUs ({deliveries:,} deliveries)")


def distinct_outputs(args, demand, topo) -> None:
    """No two of the files the command writes are one (-o's XML and its twin, --schedule-out, --report)."""
    from compiler.fileio import distinct_outputs as distinct
    from compiler.pipeline import default_xml_name, twin_path
    from compiler.specs.runtimes import target_runtimes, twin_runtime
    xml = twin = None
    if not args.no_xml:
        xml = args.output or default_xml_name(demand, topo)
        runtimes = target_runtimes(demand.collective, args.runtime, topo.vendor)
        if twin_runtime(demand.collective, args.runtime, runtimes) is not None:
            twin = twin_path(xml)
    distinct([("-o", xml), ("-o", twin, "the old runtime's twin of -o's file"), ("--schedule-out", args.schedule_out),
              ("--report", args.report)], [("--demand", getattr(args, "demand", None))])


def output_checks(args, warnings: list[str]) -> None:
    """What can be known before planning: the files can be written, the size fits the range."""
    from compiler.fileio import check_writable
    if args.output == "":
        raise ArgumentError("-o: the path is empty")
    if args.no_xml and args.output:
        raise ArgumentError(f"-o: {args.output} would not be written: --no-xml writes no XML; give one or the other")
    if not args.no_xml and args.output:
        check_writable(args.output, "-o")
    if args.schedule_out:
        check_writable(args.schedule_out, "--schedule-out")
    if args.report:
        from compiler.cli.commands.report import check_outputs
        check_outputs(args.report, None, "--report")
    if args.size_range and not args.size_range[0] <= args.size < args.size_range[1]:
        lo, hi = args.size_range
        warnings.append(f"--size {format_size(args.size)} is outside --size-range {format_size(lo)}:{format_size(hi)}: "
                        "the runtime will not use this file for the size it was planned for")
