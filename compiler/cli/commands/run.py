"""`msccl-compile run FILE.xml --nprocs N`: execute a program on local gloo processes and check it."""

from __future__ import annotations

from compiler.cli.common import emit_json, positive_int, seconds, size_arg
from compiler.specs.errors import CompileError

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
    from backends.torch_dist.headers import read_header
    if importlib.util.find_spec("torch") is None:
        require_torch("run")
    # the file's ngpus against --nprocs before torch is imported (3 s here): the same check as run_local's
    h = read_header(args.file)
    if h.ngpus and h.ngpus != args.nprocs:
        raise CompileError(f"--nprocs: {args.nprocs} processes, but {args.file} is for ngpus={h.ngpus}")
    require_torch("run")
    from backends.torch_dist import parse_dtype, run_local
    result = run_local(args.file, args.nprocs, args.size, parse_dtype(args.dtype), seed=args.seed,
                       inplace=args.inplace, timeout=args.timeout, op=args.op, iters=args.iters)
    if args.json:
        emit_json(result.to_dict())
    else:
        print(result.summary())
    return 0 if result.correct else 1
