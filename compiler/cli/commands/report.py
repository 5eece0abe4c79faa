"""`msccl-compile report FILE.xml --hw NAME --size S -o report.html [--png DIR]`: one self-contained
HTML page of what an MSCCL program does over time (backends/report.py); `--report FILE.html` on a
compile writes the same page with the schedule beside the program.

matplotlib (the `report` extra) is imported only when a report is written, never at start-up."""

from __future__ import annotations

from compiler.cli.common import ArgumentError, about, add_hw, emit_json, program_on, size_arg
from compiler.specs.units import format_time

HELP = "write one self-contained HTML page showing when an MSCCL XML file's links and thread blocks are busy"


def configure(p) -> None:
    p.add_argument("file", metavar="FILE.xml")
    add_hw(p)
    p.add_argument("--size", type=size_arg, required=True,
                   help="size as nccl-tests counts it; for a custom file, one chunk of its demand")
    p.add_argument("-o", "--output", metavar="FILE.html", help="the HTML page to write")
    p.add_argument("--png", metavar="DIR", help="write the figures alone as DIR/NAME.png")
    p.add_argument("--no-ring", action="store_true", help="leave out the ring baseline (it is planned and lowered)")
    p.add_argument("--json", action="store_true")
    p.set_defaults(run=run)


def check_outputs(html: str | None, png_dir: str | None, html_flag: str = "-o") -> None:
    """What can fail before any work: matplotlib missing, outputs that cannot be written."""
    from backends.report import check_png_dir, require_matplotlib
    from compiler.fileio import check_writable
    require_matplotlib()
    if html:
        check_writable(html, html_flag)
    if png_dir:
        check_png_dir(png_dir)


def run(args) -> int:
    if not args.output and not args.png:
        raise ArgumentError("report: nothing to write: give -o FILE.html, --png DIR or both")
    from compiler.fileio import distinct_outputs
    distinct_outputs([("-o", args.output), ("--png", args.png)], [("", args.file)])
    check_outputs(args.output, args.png)
    from backends.report import report_for_program, write_report
    program, topo, _ = program_on(args)
    with about(args.file):
        report = report_for_program(program, topo, args.size, args.file, with_ring=not args.no_ring)
    written = write_report(report, args.output, args.png)
    out = summary(report, written)
    if args.json:
        emit_json({"file": args.file, **out, **({"reader_warnings": list(program.notes)} if program.notes else {})})
    else:
        print(line(report, written))
    return 0


def summary(report, written: list[str]) -> dict:
    return {"written": written, "notes": list(report.notes),
            "metrics": {m.key: {"label": m.label, "time_s": m.time_s} for m in report.metrics}}


def line(report, written: list[str]) -> str:
    times = ", ".join(f"{m.key} {format_time(m.time_s)}" for m in report.metrics if m.time_s is not None)
    return f"wrote {', '.join(written)} ({times})"
