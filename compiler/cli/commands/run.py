"""`msccl-compile run FILE.xml --nprocs N`: execute a program on local gloo processes and check it."""

from __future__ import annotations

import sys

from compiler.cli.common import PROG, emit_json, positive_int, seconds, size_arg

HELP = "run an XML on N local processes (gloo) and compare with torch's own collective (custom: its demand)"


def configure(p) -> None:
    p.add_argument("file", metavar="FILE.xml")
    p.add_argument("--nprocs", type=positive_int, required=True)
    p.add_argument("--size", type=size_arg, default=2**20,
                   help="size as nccl-tests counts it; for a custom file, one chunk of its demand (default 1MiB)")
    p.add_argument("--dtype", default="float32")
    p.add_argument("--op", default="sum", choices=("sum", "prod", "max", "min"))
    p.add_argument("--inplace", action="store_true", help="call the collective in place")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--iters", type=positive_int, default=3)
    p.add_argument("--timeout", type=seconds, default=60.0, help="seconds per run")
    p.add_argument("--json", action="store_true")
    p.set_defaults(run=run)


def run(args) -> int:
    import importlib.util
    from backends.torch_dist.errors import require_torch
    from backends.torch_dist.headers import check_nprocs, read_header
    if importlib.util.find_spec("torch") is None:
        require_torch("run")
    check_nprocs(args.nprocs, read_header(args.file).ngpus, args.file)  # before torch is imported (3 s here)
    require_torch("run")
    from backends.torch_dist import parse_dtype, run_local
    result = run_local(args.file, args.nprocs, args.size, parse_dtype(args.dtype), seed=args.seed,
                       inplace=args.inplace, timeout=args.timeout, op=args.op, iters=args.iters)
    problems = verify_problems(args.file) if result.correct else None
    if problems:
        print(f"{PROG}: warning: {problems}", file=sys.stderr)
    if args.json:
        emit_json({**result.to_dict(), "verified": None if problems is None else not problems})
    else:
        print(result.summary())
    return 0 if result.correct else 1


def verify_problems(path: str) -> str:
    """What `verify` finds in a file whose run was correct ("" where nothing): a run executes one
    order of the steps on gloo, so it cannot show the runtimes' rules, races or other orders' deadlocks."""
    from backends.msccl_xml import read_xml
    from compiler.program.verify import verify
    verdict = verify(read_xml(path))
    if verdict.ok:
        return ""
    n, first = len(verdict.findings), verdict.findings[0]
    return (f"{path}: correct as run, but verify finds {n} problem{'s' if n > 1 else ''} for runtime "
            f"{'/'.join(verdict.runtimes)} that one run on gloo cannot show (the first: [{first.rule}] "
            f"{first.message}); see msccl-compile verify {path}")
