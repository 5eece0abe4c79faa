"""`msccl-compile env DIR --runtime NAME`: the variables that load a directory of algorithms."""

from __future__ import annotations

from compiler.cli.common import emit_json, positive_int
from compiler.specs.runtimes import DEFAULT, NAMES

HELP = "print the environment that loads a directory of algorithms into a runtime"


def configure(p) -> None:
    p.add_argument("path", metavar="DIR", help="algorithm directory (or files, for a runtime that loads a list)")
    p.add_argument("--runtime", choices=NAMES, default=DEFAULT)
    p.add_argument("--world-size", type=positive_int, help="refuse files for another GPU count")
    p.add_argument("--json", action="store_true")
    p.set_defaults(run=run)


def run(args) -> int:
    from backends.torch_dist import export_lines, msccl_env
    env = msccl_env(args.runtime, args.path, args.world_size)
    if args.json:
        emit_json(env)
    else:
        print("\n".join(export_lines(env)))
    return 0
