"""The msccl-compile command line: signals, the parser of every command, errors as one line.

Each command is a module of compiler/cli/commands (configure(parser), run(args)); every error a
user can cause is a CompileError, printed as one line with exit status 2.
"""

from __future__ import annotations

import os
import signal
import sys


def _exit_interrupted(signum=None, frame=None) -> None:
    """Ctrl-C or SIGTERM: staged outputs are already gone (fileio.outputs); leave now, without
    waiting for a solver thread or worker processes to wind down."""
    try:
        sys.stdout.flush()
    except (OSError, ValueError):
        pass
    print(f"{PROG}: interrupted", file=sys.stderr, flush=True)
    os._exit(130)


PROG = "msccl-compile"
AS_PROGRAM = (__name__ == "__main__" or os.path.basename(sys.argv[0]) == PROG
              or sys.argv[0].endswith(os.path.join("compiler", "cli", "__main__.py")))
if AS_PROGRAM:  # while the rest is imported, a signal just ends the process (main() then raises KeyboardInterrupt)
    signal.signal(signal.SIGINT, _exit_interrupted)
    signal.signal(signal.SIGTERM, _exit_interrupted)

import re  # noqa: E402
import threading  # noqa: E402

from compiler import __version__  # noqa: E402
from compiler.cli.commands import (bench, calibrate, collective, env, jobs, library, lower, profiles, replan,  # noqa: E402
                                   report, run, simulate, verify)
from compiler.cli.common import ArgumentError, Parser, Progress  # noqa: E402,F401  (Progress: tests)
from compiler.fileio import outputs  # noqa: E402
from compiler.specs.collectives import COLLECTIVES, CUSTOM, spellings  # noqa: E402
from compiler.specs.errors import CompileError  # noqa: E402

# name -> (configure(parser), help)
COMMANDS = {
    "lower": (lower.configure, lower.HELP),
    "env": (env.configure, env.HELP),
    "run": (run.configure, run.HELP),
    "library": (library.configure, library.HELP),
    "bench": (bench.configure, bench.HELP),
    "calibrate": (calibrate.configure, calibrate.HELP),
    "profiles": (profiles.configure_profiles, profiles.PROFILES_HELP),
    "bound": (profiles.configure_bound, profiles.BOUND_HELP),
    "verify": (verify.configure, verify.HELP),
    "simulate": (simulate.configure, simulate.HELP),
    "report": (report.configure, report.HELP),
    "jobs": (jobs.configure, jobs.HELP),
    "replan": (replan.configure, replan.HELP),
}

# compiler/ names the option fields it complains about (`chunks=0: must be >= 1`, "raise
# `time_limit`"); the command line says them as its flags
FIELD_FLAGS = {"chunks": "--chunks", "size": "--size", "root": "--root", "time_limit": "--time-limit",
               "max_horizon": "--max-horizon", "gap": "--gap", "instances": "--instances", "proto": "--proto",
               "runtime": "--runtime", "method": "--method", "name": "--name", "min_bytes": "--size-range",
               "max_bytes": "--size-range", "inplace": "--inplace", "multicast": "--multicast", "nodes": "--nodes",
               "demand": "--demand", "dtype": "--dtype", "objective": "--objective", "fail_link": "--fail-link",
               "degrade": "--degrade", "band_factor": "--band-factor", "sizes": "--sizes"}
_LEADING = re.compile(r"^([a-z_]+)(?:=([^:]*))?: ")
_QUOTED = re.compile(r"`([a-z_]+)(?:=([^`]*))?`")


def as_flags(message: str) -> str:
    """A compiler message with its field names said as this command line's flags."""
    def flag(m: re.Match, tail: str) -> str:
        name = FIELD_FLAGS.get(m.group(1))
        if name is None:
            return m.group(0)
        return name + (f" {m.group(2)}" if m.group(2) is not None else "") + tail
    message = _LEADING.sub(lambda m: flag(m, ": "), message, count=1)
    return _QUOTED.sub(lambda m: flag(m, ""), message)


def _terminate(signum, frame):
    raise KeyboardInterrupt


def build_parser() -> Parser:
    parser = Parser(prog=PROG, description="Plan GPU collectives as traffic engineering and emit MSCCL XML.")
    parser.add_argument("--version", action="version", version=f"{PROG} {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=Parser)
    for name, (configure, help_text) in COMMANDS.items():
        configure(sub.add_parser(name, help=help_text, description=help_text))
    aliases: dict[str, list[str]] = {}
    for alias, name in spellings().items():
        if alias != name:
            aliases.setdefault(name, []).append(alias)
    for name in COLLECTIVES + (CUSTOM,):
        help_text = f"plan {name} and write it" if name != CUSTOM else "plan a custom demand (--demand FILE)"
        collective.configure(sub.add_parser(name, aliases=aliases.get(name, []), help=help_text, description=help_text), name)
    return parser


def _unknown_command(argv: list[str]) -> str | None:
    first = next((a for a in argv if not a.startswith("-")), None)
    if first is None or first in COMMANDS:
        return None
    if first.lower() in spellings() or first == CUSTOM:
        return None
    return (f"unknown command or collective {first!r} "
            f"(collectives: {', '.join(COLLECTIVES)}; commands: {', '.join(c for c in COMMANDS if c not in COLLECTIVES)})")


def join_negative_values(argv: list[str]) -> list[str]:
    """`--size -1MB` as `--size=-1MB`: argparse would read -1MB as an option and say only
    "expected one argument"; joined, the value reaches its parser, which says what is wrong."""
    out: list[str] = []
    for a in argv:
        prev = out[-1] if out else ""
        if a[:1] == "-" and a[1:2].isdigit() or a[:2] == "-.":
            if prev.startswith("--") and "=" not in prev and len(prev) > 2:
                out[-1] = f"{prev}={a}"
                continue
        out.append(a)
    return out


def unrecognized(args, extra: list[str]) -> str:
    sub = getattr(args, "command", None) or getattr(args, "collective", None)
    where = f"{sub}: " if sub else ""
    why = ""
    if "--root" in extra and getattr(args, "collective", None):
        why = f" ({args.collective} has no root; broadcast, reduce, scatter and gather have one)"
    elif "--demand" in extra and getattr(args, "collective", None):
        why = " (--demand is for the custom collective)"
    return f"{where}unrecognized arguments: {' '.join(extra)}{why}"


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, _terminate)
        signal.signal(signal.SIGINT, signal.default_int_handler)  # even where the shell ignored it (cmd &)
    try:
        unknown = _unknown_command(argv)
        if unknown:
            raise ArgumentError(unknown)
        for i, a in enumerate(argv):  # collective names are case-insensitive (Allgather, ReduceScatter)
            if not a.startswith("-"):
                if a not in COMMANDS and a.lower() in spellings():
                    argv[i] = spellings()[a.lower()]
                break
        parser = build_parser()
        args, extra = parser.parse_known_args(join_negative_values(argv))
        if extra:
            raise ArgumentError(unrecognized(args, extra))
        if not getattr(args, "run", None):
            parser.print_help()
            return 2
        with outputs():  # files are written when the command finishes, or not at all
            return args.run(args) or 0
    except CompileError as e:
        print(f"{PROG}: error: {as_flags(str(e))}", file=sys.stderr)
        return e.exit_status
    except KeyboardInterrupt:
        _exit_interrupted()
    except BrokenPipeError:
        return 0
    except Exception as e:  # a bug, not bad input: one line unless asked for the traceback
        if os.environ.get("MSCCL_COMPILE_DEBUG"):
            raise
        print(f"{PROG}: internal error: {type(e).__name__}: {e} (set MSCCL_COMPILE_DEBUG=1 for the traceback)",
              file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
