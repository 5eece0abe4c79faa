"""`msccl-compile lower SCHEDULE.json --hw NAME -o FILE.xml`: lower and verify a saved schedule (the
partner of --schedule-out), so one plan can be written for several runtimes or protocols."""

from __future__ import annotations

from compiler.cli.commands.collective import (add_lowering, add_report, lower_options, print_summary,
                                              refuse_unsupported, write, write_report)
from compiler.cli.common import (ArgumentError, about, add_hw, emit_json, load_topology, refuse_disabled_proto,
                                 refuse_foreign_runtime)

HELP = "lower and verify a schedule saved with --schedule-out, and write its XML"


def configure(p) -> None:
    p.add_argument("schedule", metavar="SCHEDULE.json")
    add_hw(p)
    p.add_argument("-o", "--output", metavar="FILE", help="XML file to write (default COLLECTIVE-PROFILE[-nN].xml)")
    add_lowering(p)
    add_report(p)
    p.add_argument("--json", action="store_true")
    p.set_defaults(run=run)


def saved_schedule(args, check: bool = False):
    """(schedule, topology) of `args.schedule` on --hw/--nodes, refused where they differ or the
    runtime does not take the collective."""
    from compiler.model.schedule import Schedule
    schedule = Schedule.load(args.schedule)
    refuse_unsupported(schedule.demand.collective, args.runtime)
    topo = load_topology(args.hw, args.nodes)
    refuse_foreign_runtime(args.runtime, topo)
    refuse_disabled_proto(args.proto, topo)
    if schedule.topology != topo.name:
        raise ArgumentError(f"{args.schedule}: topology: the schedule was planned for {schedule.topology!r}, "
                            f"--hw {args.hw} --nodes {args.nodes} is {topo.name!r}")
    if check:  # a transfer out of range or a chunk that never arrives, said with the file that has it (lower's
        # own run says it when lowering meets it: at 1,024 GPUs this simulation takes seconds)
        from compiler.analysis.simulate import simulate
        with about(args.schedule):
            simulate(topo, schedule)
    return schedule, topo


def run(args) -> int:
    from compiler.fileio import check_writable, distinct_outputs
    from compiler.pipeline import CompileOptions, compile_schedule
    distinct_outputs([("-o", args.output), ("--report", args.report)], [("", args.schedule)])
    if args.output:
        check_writable(args.output, "-o")
    if args.report:
        from compiler.cli.commands.report import check_outputs
        check_outputs(args.report, None, "--report")
    schedule, topo = saved_schedule(args)
    with about(args.schedule):
        result = compile_schedule(topo, schedule, CompileOptions(lower=lower_options(args), runtime=args.runtime,
                                                                 output=args.output))
    write(result, None)
    write_report(result, args)
    out = {**result.summary(), "schedule": args.schedule, "report": args.report}
    if args.json:
        emit_json(out)
    else:
        print_summary(result, out, None)
        if args.report:
            print(f"report written to {args.report}")
    return 0
