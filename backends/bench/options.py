"""The options of `msccl-compile bench` and `python -m backends.bench`, and the --sizes syntax.

Free of torch: every msccl-compile command builds the whole parser, and importing torch for it
would cost each command about two seconds.
"""

from __future__ import annotations

import argparse

from compiler.cli.common import within_a_week
from compiler.specs.collectives import COLLECTIVES
from compiler.specs.errors import CompileError
from compiler.specs.runtimes import DEFAULT as DEFAULT_RUNTIME, NAMES as RUNTIMES
from compiler.specs.units import parse_size

SIDES = ("default", "msccl")


def configure(p: argparse.ArgumentParser) -> None:
    """The bench options (shared by `msccl-compile bench` and `python -m backends.bench`)."""
    p.add_argument("collective", help=", ".join(COLLECTIVES))
    src = p.add_mutually_exclusive_group()
    src.add_argument("--xml", metavar="FILE", help="the MSCCL algorithm to compare")
    src.add_argument("--library", metavar="DIR", help="a library directory: per size the file whose band covers it")
    p.add_argument("--sizes", default="1KB:1MB", help="LO:HI (doubling), LO:HI:FACTOR, or a list (default 1KB:1MB)")
    p.add_argument("--iters", type=int, default=20, help="timed iterations per size (default 20)")
    p.add_argument("--warmup", type=int, default=5, help="untimed iterations per size (default 5)")
    p.add_argument("--nprocs", type=int, default=4, help="local processes when not under torchrun (default 4)")
    p.add_argument("--dtype", default="float32")
    p.add_argument("--op", default="sum", help="reduction: sum, prod, max, min")
    p.add_argument("--inplace", action="store_true", help="in-place calls for allgather/reduce_scatter/alltoall")
    p.add_argument("--runtime", default=DEFAULT_RUNTIME, choices=RUNTIMES, help="MSCCL runtime on GPUs")
    p.add_argument("--side", default="both", choices=("both",) + SIDES,
                   help="which side to measure (on GPUs under torchrun: one per launch)")
    p.add_argument("--default-from", metavar="FILE", help="take the default columns from an earlier JSON")
    p.add_argument("--device", choices=("cpu", "cuda"), help="default: cuda when available")
    p.add_argument("--timeout", type=within_a_week(1.0), default=60.0, help="seconds any one call may take (default 60)")
    p.add_argument("-o", "--output", metavar="PREFIX", help="write PREFIX.json, .csv, .png (default bench-COLL)")
    p.add_argument("--no-plot", action="store_true")
    p.add_argument("--baseline", metavar="FILE", help="an earlier JSON: exit 1 on a regression beyond --tolerance")
    p.add_argument("--tolerance", type=float, default=0.10, help="allowed algbw drop vs the baseline (default 0.10)")
    p.add_argument("--compare-side", default="msccl", choices=("both",) + SIDES,
                   help="which columns --baseline compares (default msccl)")
    p.add_argument("--check-runtime", action="store_true", help="on GPUs, confirm from NCCL's log that MSCCL ran")
    p.add_argument("--check-log", metavar="FILE", help="only read an NCCL log and say whether MSCCL ran")
    p.add_argument("--json", action="store_true", help="print the result as JSON instead of the table")


def parse_sizes(text: str) -> list[int]:
    """'1KB:1MB' (doubling, like nccl-tests -f 2), 'LO:HI:FACTOR', '4096,65536', or one size."""
    text = str(text).strip()
    if "," in text:
        return [parse_size(t, "--sizes") for t in text.split(",") if t.strip()]
    parts = text.split(":")
    if len(parts) == 1:
        return [parse_size(text, "--sizes")]
    if len(parts) not in (2, 3):
        raise CompileError(f"--sizes: {text!r} is not LO:HI, LO:HI:FACTOR or a list (example: 1KB:1GB)")
    lo, hi = parse_size(parts[0], "--sizes"), parse_size(parts[1], "--sizes")
    factor = 2
    if len(parts) == 3:
        try:
            factor = int(parts[2])
        except ValueError:
            factor = 0
        if factor < 2:
            raise CompileError(f"--sizes: factor {parts[2]!r} must be a whole number >= 2")
    if lo > hi:
        raise CompileError(f"--sizes: {text!r} has LO above HI")
    out = []
    s = lo
    while s <= hi:
        out.append(s)
        s *= factor
    return out
