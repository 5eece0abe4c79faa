"""What every command shares: the parser that fails in one line, argument types, JSON output,
progress reports, and the loaders imported only when a command runs (`msccl-compile --help`
stays free of numpy, scipy, networkx, jsonschema and torch)."""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import sys
import time
from typing import TYPE_CHECKING

from compiler.specs.errors import CompileError
from compiler.specs.units import parse_size, parse_size_range

if TYPE_CHECKING:
    from compiler.model.topology import Topology

PROG = "msccl-compile"


class ArgumentError(CompileError):
    pass


class Parser(argparse.ArgumentParser):
    """argparse, but a usage error is one line and exit status 2."""

    def error(self, message):  # noqa: D401 - argparse API
        sub = self.prog[len(PROG):].strip()
        raise ArgumentError(f"{sub}: {message}" if sub else message)


def add_hw(p) -> None:
    p.add_argument("--hw", required=True, metavar="NAME|FILE", help="hardware profile name, NAME:N, or a profile JSON file")
    p.add_argument("--nodes", type=positive_int, default=1, help="number of nodes (default 1)")


def number(kind, minimum, maximum=None, why=""):
    """An argparse type: `kind` (int or float), finite, no smaller than `minimum` (and no larger
    than `maximum`, where given, for the reason `why`), with a one-line error."""
    def parse(text: str):
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"{text!r} is not a {'whole number' if kind is int else 'number'}") from None
        if not math.isfinite(value):
            raise argparse.ArgumentTypeError(f"{text!r} is not a finite number")
        if not value >= minimum:
            raise argparse.ArgumentTypeError(f"{text!r} must be >= {minimum}")
        if maximum is not None and value > maximum:
            raise argparse.ArgumentTypeError(f"{text!r} must be <= {maximum:g}{why}")
        return value
    return parse


positive_int = number(int, 1)
non_negative_float = number(float, 0.0)


def within_a_week(minimum: float):
    """An argparse type for a time limit or timeout in seconds: the deadlines become lock and process
    timeouts, which the platform caps (--time-limit 1e12 stopped with an OverflowError after planning)."""
    return number(float, minimum, 7 * 24 * 3600.0, " (a week, in seconds)")


seconds = within_a_week(0.0)


def share(text: str) -> float:
    """An argparse type: a share of the lower bound, in [0, 1] (95 is refused, not read as 95 %)."""
    value = non_negative_float(text)
    if not value <= 1:
        percent = f" ({value / 100:g} for {value:g} %)" if 10 <= value <= 100 else ""
        raise argparse.ArgumentTypeError(f"{text!r} must be a share of the lower bound, at most 1{percent}")
    return value


def size_range_arg(text: str) -> tuple[int, int]:
    try:
        return parse_size_range(text, field="")
    except CompileError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def size_arg(text: str) -> int:
    try:
        return parse_size(text, field="")
    except CompileError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def finite(obj):
    """obj with every infinite or NaN float as None: json.dumps would write Infinity and NaN, which
    are not JSON (jq and most parsers refuse them)."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: finite(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [finite(v) for v in obj]
    return obj


def emit_json(obj) -> None:
    print(json.dumps(finite(obj), indent=2, sort_keys=True, allow_nan=False))


def load_topology(spec: str, nodes: int = 1) -> "Topology":
    from compiler.model.profiles import load_topology as load
    return load(spec, nodes)


@contextlib.contextmanager
def about(path: str):
    """Errors of the work on the file `path` (timing it, drawing it) name it, where they do not already."""
    try:
        yield
    except CompileError as e:
        if str(e).startswith(str(path)):
            raise
        error = CompileError(f"{path}: {e}")
        error.exit_status = e.exit_status
        raise error from None


def refuse_foreign_runtime(runtime: str, topo: "Topology") -> None:
    """One line where the runtime asked for does not run on the profile's GPUs (RCCL on a DGX, NCCL's
    MSCCL builds on an MI250): its file would be written and verified for a machine it cannot run on."""
    from compiler.specs.runtimes import ALL, RUNTIMES
    if runtime == ALL or topo.vendor not in ("nvidia", "amd") or topo.vendor in RUNTIMES[runtime].vendors:
        return
    others = [r for r in RUNTIMES if topo.vendor in RUNTIMES[r].vendors]
    raise ArgumentError(f"--runtime: {runtime} runs on {' and '.join(RUNTIMES[runtime].vendors)} GPUs, and "
                        f"{topo.profile}'s are {topo.vendor}; use --runtime {', '.join(others)} or all")


def refuse_disabled_proto(proto: str, topo: "Topology") -> None:
    """One line where --proto names a protocol the profile's runtime section does not enable (LL128 on
    mi250): planning went on, and failed only once every candidate was lowered, naming --runtime."""
    names = topo.costs.names if topo.costs is not None else None
    if proto == "auto" or names is None or proto in names:
        return
    raise ArgumentError(f"--proto: {proto} is not enabled on {topo.profile} (its runtime has {', '.join(names)})")


READER_WARNINGS = 5  # a file's reader warnings printed at most (the rest counted)


def reader_warnings(program, syntax: bool = True) -> list[str]:
    """What reading the file accepted with a warning (a step's s off its position, ignored elements,
    msccl-tools defaults, strtol spellings: backends/msccl_xml.py) and, with `syntax`, what the runtimes'
    reader would reject in its text (verify says that as findings), printed on stderr, the first
    READER_WARNINGS of them; all returned (for --json)."""
    notes = list(program.notes) + (list(program.syntax) if syntax else [])
    for n in notes[:READER_WARNINGS]:
        print(f"{PROG}: warning: {n}", file=sys.stderr)
    if len(notes) > READER_WARNINGS:
        print(f"{PROG}: warning: ... and {len(notes) - READER_WARNINGS} more (--json lists all)", file=sys.stderr)
    return notes


def program_on(args):
    """(program, topology) of a command that times FILE.xml on --hw/--nodes at --size: a file for
    another GPU count is refused naming both, and a size the file's chunks cannot split into whole
    4-byte elements is warned about (the runtimes would not use the file at that size)."""
    from backends.msccl_xml import read_xml
    from compiler.specs.collectives import CUSTOM
    program = read_xml(args.file)
    topo = load_topology(args.hw, args.nodes)
    reader_warnings(program)
    if program.ngpus != topo.ngpus:
        raise ArgumentError(f"{args.file}: ngpus={program.ngpus}, but --hw {args.hw}"
                            f"{f' --nodes {args.nodes}' if args.nodes > 1 else ''} has {topo.ngpus} GPUs")
    warning = None
    if program.collective != CUSTOM and args.size % (program.nchunksperloop * 4):
        warning = (f"--size {args.size}B is not whole 4-byte elements in each of the file's {program.nchunksperloop} "
                   "chunks (nchunksperloop): the runtimes would run NCCL's own algorithm at this size")
        print(f"{PROG}: warning: {warning}", file=sys.stderr)
    return program, topo, warning


def lower_bound(topo, collective, size, root=None):
    from compiler.analysis.bounds import lower_bound as bound
    return bound(topo, collective, size, root)


def busbw(collective: str, ngpus: int, algbw: float) -> float:
    from compiler.analysis.bounds import busbw as bus
    return bus(collective, ngpus, algbw)


class Progress:
    """One-line progress reports on stderr, only when stderr is a terminal and after a few seconds."""

    def __init__(self, enabled: bool):
        self.enabled = enabled
        self.t0 = time.perf_counter()

    def __call__(self, message: str) -> None:
        elapsed = time.perf_counter() - self.t0
        if self.enabled and elapsed >= 2.0:
            print(f"[{elapsed:6.1f}s] {message}", file=sys.stderr, flush=True)
