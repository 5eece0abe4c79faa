"""`msccl-compile simulate FILE.xml --hw NAME --size S`: time any MSCCL program under the program model."""

from __future__ import annotations

from compiler.cli.common import about, add_hw, busbw, emit_json, lower_bound, program_on, size_arg
from compiler.specs.collectives import COLLECTIVES, CUSTOM
from compiler.specs.units import format_size, format_time

HELP = "time an MSCCL XML file (ours or another tool's) under the runtime cost model"


def configure(p) -> None:
    p.add_argument("file", metavar="FILE.xml")
    add_hw(p)
    p.add_argument("--size", type=size_arg, default=10**9,
                   help="size as nccl-tests counts it; for a custom file, one chunk of its demand (default 1GB)")
    p.add_argument("--json", action="store_true")
    p.set_defaults(run=run)


def run(args) -> int:
    from compiler.pipeline import demand_chunks, per_second
    from compiler.program.timing import call_bytes, time_program
    program, topo, warning = program_on(args)
    with about(args.file):
        timing = time_program(program, topo, call_bytes(program, args.size))
    total, per_chunk = args.size, program.collective == CUSTOM and program.demand is not None
    if per_chunk:  # --size is one chunk of the demand
        total = args.size * demand_chunks(program.demand)[0]
    out = {"file": args.file, "hw": topo.profile, "nodes": topo.nodes, "ngpus": topo.ngpus,
           "collective": program.collective, "size_bytes": total, "time_s": timing.finish_time_s,
           "algbw_GBps": per_second(total, timing.finish_time_s) / 1e9, "ntransfers": timing.ntransfers}
    if program.collective in COLLECTIVES:
        from compiler.analysis.simulate import program_floor
        floor = program_floor(topo, lower_bound(topo, program.collective, args.size))  # as compile reports it
        out.update(busbw_GBps=busbw(program.collective, topo.ngpus, timing.algbw) / 1e9,
                   lower_bound_s=floor, bound_ratio=floor / timing.finish_time_s,
                   proto=program.proto, iterations=timing.iterations)
    if warning:
        out["warning"] = warning
    if program.notes:
        out["reader_warnings"] = list(program.notes)
    if args.json:
        emit_json(out)
        return 0
    at = format_size(args.size) + (" per chunk" if per_chunk else "")
    print(f"{args.file}: {program.collective} on {topo.name} ({topo.ngpus} GPUs) at {at}: "
          f"{format_time(timing.finish_time_s)}, algbw {out['algbw_GBps']:.2f} GB/s"
          + (f", busbw {out['busbw_GBps']:.2f} GB/s; {out['bound_ratio']:.3f} of the lower bound "
             f"{format_time(out['lower_bound_s'])}" if "bound_ratio" in out else ""))
    return 0
