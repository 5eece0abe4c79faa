"""`msccl-compile verify FILE.xml`: the contract rules, bounded-slot deadlocks, the postcondition."""

from __future__ import annotations

from compiler.cli.common import ArgumentError, emit_json, positive_int, reader_warnings
from compiler.specs.collectives import CUSTOM
from compiler.specs.runtimes import ALL, CHOICES

HELP = "check an MSCCL XML file: contract rules, deadlock under bounded slots, the result"


def configure(p) -> None:
    p.add_argument("file", metavar="FILE.xml")
    p.add_argument("--runtime", choices=CHOICES, default=ALL)
    p.add_argument("--demand", metavar="FILE",
                   help="custom demand JSON (for coll=custom; overrides the demand the file carries)")
    p.add_argument("--max-findings", type=positive_int, default=20)
    p.add_argument("--json", action="store_true")
    p.set_defaults(run=run)


def run(args) -> int:
    from backends.msccl_xml import read_xml
    from compiler.model.demand import load_custom_demand
    from compiler.program.verify import verify
    program = read_xml(args.file)
    reader_warnings(program, syntax=False)  # its syntax problems are findings here
    demand = None
    if args.demand and program.collective != CUSTOM:
        raise ArgumentError(f"--demand: {args.file} is coll={program.collective}, not custom: its demand is the "
                            "collective's; --demand is for custom files")
    if args.demand:  # cut into the pieces the file's own demand has, if it has one
        pieces = program.demand.chunks_per_rank if program.demand is not None else 1
        demand = load_custom_demand(args.demand, program.ngpus, program.nchunksperloop, pieces)
    verdict = verify(program, args.runtime, demand=demand)
    judged = "/".join(verdict.runtimes)
    if judged != args.runtime:
        plural = "s" if len(verdict.runtimes) > 1 else ""
        judged += (f" (the runtime{plural} the file names)" if program.runtimes
                   else f" (the runtime{plural} with coll={program.coll_attribute or program.collective})")
    if args.json:
        emit_json({"file": args.file, "verified": verdict.ok, "runtime": args.runtime,
                   "runtimes": list(verdict.runtimes), "demand": "--demand" if args.demand else
                   "embedded" if program.demand is not None else None,
                   "collective": program.collective, "ngpus": program.ngpus, "reader_warnings": list(program.notes),
                   "findings": [{"rule": f.rule, "rank": f.rank, "tb": f.tb, "step": f.step, "message": f.message}
                                for f in verdict.findings]})
    else:
        if verdict.ok:
            print(f"{args.file}: correct for runtime {judged}: {program.collective}, {program.ngpus} GPUs, "
                  f"{program.nthreadblocks_max} thread blocks, {program.nsteps_max} steps per block at most")
        else:
            print(f"{args.file}: {len(verdict.findings)} problem{'s' if len(verdict.findings) > 1 else ''} "
                  f"for runtime {judged}")
            for f in verdict.findings[:args.max_findings]:
                print(f"  [{f.rule}] {f.message}")
            if len(verdict.findings) > args.max_findings:
                print(f"  ... and {len(verdict.findings) - args.max_findings} more (--json lists all)")
    return 0 if verdict.ok else 1
