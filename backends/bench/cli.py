"""The bench command: `msccl-compile bench ...` and `python -m backends.bench ...` (standalone, or
under torchrun, where each rank joins the group). Runs the options of options.configure; prints
nccl-tests' table (or JSON), writes PREFIX.json, .csv, .png, and compares with a baseline."""

from __future__ import annotations

import argparse
import datetime
import os
import sys
import tempfile
from dataclasses import replace
from pathlib import Path

from backends.torch_dist.errors import require_torch
from compiler.specs.errors import CompileError

from .options import SIDES, configure, parse_sizes
from .results import BenchResult, compare
from .runtime_log import check_runtime


def _under_torchrun() -> bool:
    return all(k in os.environ for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK"))


def _join_torchrun(args, sides: tuple[str, ...]) -> None:
    """Under torchrun: the environment of this launch's side (before the first communicator),
    then the process group."""
    import torch
    import torch.distributed as dist

    from backends import torch_dist as td

    from .sweeper import algo_dir_for, default_side_env
    world = int(os.environ["WORLD_SIZE"])
    gpu = args.device != "cpu" and torch.cuda.is_available()
    if gpu:
        torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
        if sides == ("default",):
            td.apply_environ(default_side_env(args.runtime))
        elif "msccl" in sides and len(sides) == 1 and (args.xml or args.library):
            path = args.library or algo_dir_for(args.xml, args.runtime)[0]
            os.environ.update(td.msccl_env(args.runtime, path, world))  # before the first communicator
        if args.check_runtime:  # NCCL reads these at its first communicator too
            os.environ.setdefault("NCCL_DEBUG", "INFO")
            os.environ.setdefault("NCCL_DEBUG_SUBSYS", "INIT,ENV")
            os.environ.setdefault("NCCL_DEBUG_FILE", os.path.join(tempfile.gettempdir(),
                                                                  "msccl-bench-nccl.%h.%p.log"))
    dist.init_process_group("nccl" if gpu else "gloo", timeout=datetime.timedelta(seconds=args.timeout * 4))


def _measure(args, sizes: list[int], sides: tuple[str, ...]) -> tuple[int, BenchResult]:
    """(this rank, the sweep's result), joining (and leaving) torchrun's group where needed."""
    import torch.distributed as dist

    from .sweeper import sweep
    created = False
    if _under_torchrun() and not dist.is_initialized():
        _join_torchrun(args, sides)
        created = True
    try:
        rank = dist.get_rank() if dist.is_initialized() else 0
        result = sweep(args.collective, sizes, xml=args.xml, library_dir=args.library, iters=args.iters,
                       warmup=args.warmup, nprocs=args.nprocs, dtype=args.dtype, op=args.op, inplace=args.inplace,
                       timeout=args.timeout, runtime=args.runtime, sides=sides, device=args.device,
                       check_log=args.check_runtime)
    finally:
        if created:
            dist.barrier()  # nobody tears down while a peer still talks to it
            dist.destroy_process_group()
    return rank, result


def _regressions(args, result: BenchResult, baseline: BenchResult) -> int:
    """Exit status of the --baseline comparison (1: a regression beyond the tolerance)."""
    csides = SIDES if args.compare_side == "both" else (args.compare_side,)
    regressions = compare(result, baseline, args.tolerance, csides)
    for line in regressions:
        print(f"# REGRESSION: {line}", file=sys.stderr)
    if not regressions:
        print(f"# no regression beyond {args.tolerance * 100:.0f} % against {args.baseline}",
              file=sys.stderr if args.json else sys.stdout)
        return 0
    sizes_s = ", ".join(sorted({ln.split(":")[0].removeprefix("size ") for ln in regressions}, key=lambda x:
                               int(x.split()[0])))
    print(f"# regression beyond {args.tolerance * 100:.0f} % at sizes {sizes_s}", file=sys.stderr)
    return 1


def _load(flag: str, path: str | None) -> BenchResult | None:
    if not path:
        return None
    try:
        return BenchResult.load(path)
    except CompileError as e:
        raise CompileError(f"{flag}: {e}") from None


def _check_prefix(prefix: str, collective: str) -> None:
    """-o names files PREFIX.json, .csv and .png: refused before measuring where they cannot be
    written there (a directory wrote hidden files into it; a missing one failed after the sweep)."""
    from compiler.fileio import check_writable
    if prefix.endswith(("/", os.sep)) or os.path.isdir(prefix):
        raise CompileError(f"-o: {prefix}: is a directory; -o takes a file prefix "
                           f"(e.g. {os.path.join(prefix, 'bench-' + collective)})")
    check_writable(prefix + ".json", "-o")


def run(args) -> int:
    """Runs the options of `configure`. Exit status 0, or 1 on #wrong > 0, a regression, or
    MSCCL not running under --check-runtime; CompileError for user errors."""
    if args.check_log:
        try:
            text = Path(args.check_log).read_text(errors="replace")
        except OSError as e:
            raise CompileError(f"--check-log: {args.check_log}: {e.strerror or e}") from None
        ran, msg = check_runtime(text)
        print(msg)
        return 0 if ran else 1
    sizes = parse_sizes(args.sizes)
    sides = SIDES if args.side == "both" else (args.side,)
    if not 0 <= args.tolerance < 1:
        raise CompileError(f"--tolerance: {args.tolerance} must be in [0, 1)")
    if args.output:
        _check_prefix(args.output, args.collective)
    # read before measuring: a bad file failed after the sweep, as an internal error, its results unwritten
    baseline, default_from = (_load(flag, path) for flag, path in (("--baseline", args.baseline),
                                                                   ("--default-from", args.default_from)))
    require_torch("bench")
    rank, result = _measure(args, sizes, sides)
    if rank != 0:
        return 0
    if default_from is not None:
        earlier = {r.size_bytes: r for r in default_from.rows}
        result = replace(result, rows=tuple(replace(r, default=earlier[r.size_bytes].default)
                                            if r.size_bytes in earlier and r.default is None else r
                                            for r in result.rows))
    prefix = args.output or f"bench-{result.collective}"
    notes = result.write(prefix, plot=not args.no_plot)
    if args.json:
        print(result.to_json())
    else:
        print(f"# msccl-compile bench: {result.collective}, {result.nprocs} ranks, {result.backend}, "
              f"iters {result.iters}, warmup {result.warmup}")
        print("\n".join(result.table()))
    info = sys.stderr if args.json else sys.stdout  # --json: stdout is the JSON alone
    for n_ in notes:
        print(f"# note: {n_}", file=info)
    print(f"# wrote {prefix}.json, {prefix}.csv" + ("" if notes or args.no_plot else f", {prefix}.png"), file=info)
    status = 0
    if result.wrong:
        print(f"# FAILED: {result.wrong} wrong elements", file=sys.stderr)
        status = 1
    if baseline is not None and _regressions(args, result, baseline):
        status = 1
    if args.check_runtime and any(n_ == "check-runtime: FAILED" for n_ in result.notes):
        status = 1
    return status


def main(argv: list[str] | None = None) -> int:
    from . import __doc__ as doc
    parser = argparse.ArgumentParser(prog="python -m backends.bench", description=doc.splitlines()[0])
    configure(parser)
    args = parser.parse_args(argv)
    try:
        return run(args)
    except CompileError as e:
        print(f"bench: error: {e}", file=sys.stderr)
        return e.exit_status
