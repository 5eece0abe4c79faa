"""`msccl-compile bench COLLECTIVE ...`: nccl-tests-style sweeps (the torch back end)."""

from __future__ import annotations



HELP = "nccl-tests-style sweep: torch's collective and the MSCCL algorithm side by side"


def configure(p) -> None:
    from backends.bench.options import configure as bench_options  # torch-free: every command builds the parser
    bench_options(p)
    p.set_defaults(run=run)


def run(args) -> int:
    from backends import bench
    return bench.run(args)
