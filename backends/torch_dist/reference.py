"""What a run must produce: seeded inputs, torch's own collective (the collective spec's
`torch_call`), and the expected output computed from every rank's input through the demand's
chunks (a standard collective's from its spec, a custom program's from the demand it carries).

Inputs are seeded random integers (exact in floating point). For a custom program every (rank,
input chunk) also gets an offset of SPREAD per pair, so that no two pairs share a value and a
chunk delivered to the wrong rank or offset never passes by chance; the offsets are left out where
the sums could stop being exact in the dtype, or for prod (the values would grow too fast), and
the run then says so in a note.

An output chunk must equal its chunk's input at a source (any of them for a copy chunk with
several holders, as the verifier accepts), or for a reduction the op over every contributor's
input chunk, in source order. Output chunks the demand does not name are not compared.
"""

from __future__ import annotations

import warnings
from functools import reduce
from typing import Callable

import torch
import torch.distributed as dist

from compiler.model.demand import Demand
from compiler.specs.collectives import SPECS
from compiler.specs.errors import CompileError

from .errors import ExecutionError
from .executor import OPS, reduce_op

SPREAD = 17  # values of one (rank, chunk) lie in [k*SPREAD - 8, k*SPREAD + 8]: disjoint for distinct k
_EXACT = {torch.float16: 2 ** 11, torch.bfloat16: 2 ** 8, torch.float32: 2 ** 24, torch.float64: 2 ** 53,
          torch.int8: 127, torch.uint8: 255, torch.int32: 2 ** 31 - 1, torch.int64: 2 ** 63 - 1}
DTYPES = {"float32": torch.float32, "float": torch.float32, "float64": torch.float64, "double": torch.float64,
          "float16": torch.float16, "half": torch.float16, "bfloat16": torch.bfloat16, "int32": torch.int32,
          "int": torch.int32, "int64": torch.int64, "int8": torch.int8, "uint8": torch.uint8}


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).replace("torch.", "")


def parse_dtype(name: str | torch.dtype) -> torch.dtype:
    """'float32', 'half', 'bfloat16', 'int32', ... -> torch.dtype."""
    if isinstance(name, torch.dtype):
        return name
    key = str(name).strip().lower().replace("torch.", "")
    if key not in DTYPES:
        raise CompileError(f"--dtype: {name!r} is not a data type (known: {', '.join(sorted(set(DTYPES)))})")
    return DTYPES[key]


def make_input(rank: int, numel: int, dtype: torch.dtype = torch.float32, seed: int = 0, op: str = "sum",
               device="cpu") -> torch.Tensor:
    """Seeded random integers (exact in floating point): -8..8, or for prod 1..3 in an integer type
    and -2, -1, 1, 2 in a floating one. A product of powers of two is exact in any order (each
    partial product is a power of two no larger than the whole), where 3^8 = 6561 is not exact
    in float16 or bfloat16 (nor 3^16 in float32): torch's reduction and the program's multiply in
    other orders, and the run called a correct program wrong."""
    gen = torch.Generator().manual_seed(seed * 1_000_003 + rank)
    if op == "prod" and (dtype.is_floating_point or dtype.is_complex):
        pick = torch.randint(0, 4, (numel,), generator=gen, dtype=torch.int64)
        return torch.tensor([-2, -1, 1, 2], dtype=torch.int64)[pick].to(dtype).to(device)
    lo, hi = (1, 4) if op == "prod" else (-8, 9)
    return torch.randint(lo, hi, (numel,), generator=gen, dtype=torch.int64).to(dtype).to(device)


# ---- torch's own collective ----------------------------------------------------------------------

def torch_collective(coll: str, inp: torch.Tensor, E: int, rank: int, n: int, root: int | None, op: str,
                     group=None) -> torch.Tensor:
    """The same collective through torch.distributed (the reference), for nccl-tests' size of E
    elements. Returns this rank's output (for reduce/gather meaningful on the root only)."""
    cs = SPECS.get(coll)
    if cs is None or cs.torch_call is None:
        raise ExecutionError(f"collective {coll!r} has no torch.distributed counterpart to compare with")
    out = inp.clone() if cs.one_buffer else inp.new_empty(cs.elements("out", n, E))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        return cs.torch_call(dist, inp, out, n, rank, root, reduce_op(op), group)


def compared_ranks(coll: str, n: int, root: int | None) -> list[int]:
    """Ranks whose output the collective defines."""
    return SPECS[coll].defined_ranks(n, root)


# ---- expected outputs from the demand's chunks ---------------------------------------------------

def _wants(sources, src_index, reduces: bool, input_of, opf, ce: int) -> list[torch.Tensor]:
    """The values an output chunk may hold: any source's input chunk, or the reduction over all."""
    parts = [input_of(s)[si * ce:(si + 1) * ce] for s, si in zip(sources, src_index)]
    return [reduce(opf, parts)] if reduces else parts


def expected_output(coll: str, rank: int, n: int, E: int, root: int | None, op: str, dtype: torch.dtype,
                    seed: int, device="cpu") -> torch.Tensor | None:
    """What this rank's output must be, computed from every rank's seeded input (None where the
    collective defines no output for this rank)."""
    cs = SPECS.get(coll)
    if cs is None:
        raise CompileError(f"bench: no expectation for collective {coll!r}")
    m = cs.elements("inp", n, E)
    inputs: dict[int, torch.Tensor] = {}

    def input_of(r: int) -> torch.Tensor:
        if r not in inputs:
            inputs[r] = make_input(r, m, dtype, seed, op, device)
        return inputs[r]

    blocks = 1 if cs.flat else cs.blocks("size", n)  # one chunk per block
    ce = E // blocks
    got = {}
    for sources, dests, src_index, dst_index in cs.build(n, blocks, root):
        for d, di in zip(dests, dst_index):
            if d == rank:
                got[di] = _wants(sources, src_index, cs.reduces, input_of, OPS[op], ce)[0]
    return torch.cat([got[k] for k in sorted(got)]) if got else None


def distinct_values(demand: Demand, n_in: int, dtype: torch.dtype, op: str) -> bool:
    """Whether offsets per (rank, chunk) keep every value and every sum exact in `dtype`."""
    if op == "prod":
        return False
    largest = (demand.ngpus * n_in + 1) * SPREAD + 8
    fan_in = max((len(c.sources) for c in demand.chunks), default=1) if demand.reduce else 1
    return largest * fan_in <= _EXACT.get(dtype, 0)


def custom_input(rank: int, n_in: int, ce: int, dtype: torch.dtype, seed: int, op: str, distinct: bool,
                 device="cpu") -> torch.Tensor:
    """Rank `rank`'s input buffer for a custom program: n_in chunks of ce elements."""
    x = make_input(rank, n_in * ce, dtype, seed, op, device)
    if distinct:
        k = torch.arange(n_in, device=device).repeat_interleave(ce) + rank * n_in + 1
        x = x + (k * SPREAD).to(dtype)
    return x


def custom_wrong(demand: Demand, rank: int, got: torch.Tensor, input_of, opf: Callable,
                 ce: int) -> tuple[int, int | None]:
    """(wrong elements, offset of the first) in `rank`'s output `got` against the demand.
    input_of(r) gives rank r's input buffer; opf is the reduction (torch.add, ...)."""
    wrong, first = 0, None
    for c in demand.chunks:
        for d, di in zip(c.dests, c.dst_index):
            if d != rank:
                continue
            wants = _wants(c.sources, c.src_index, demand.reduce, input_of, opf, ce)
            out = got[di * ce:(di + 1) * ce]
            if out.numel() != ce:
                bad = torch.ones(ce, dtype=torch.bool)
            else:
                bad = min((out != w for w in wants), key=lambda b: int(b.sum()))
            k = int(bad.sum())
            if k:
                wrong += k
                at = di * ce + int(bad.nonzero()[0, 0])
                first = at if first is None else min(first, at)
    return wrong, first
