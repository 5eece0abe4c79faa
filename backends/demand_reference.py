"""The reference for running a custom program (its demand, not a torch collective, says what is right).

Inputs: every (rank, input chunk) gets its own seeded values: random integers (as
`torch_dist.make_input`) plus an offset of 17 per (rank, chunk) pair, so that no two pairs share a
value and a chunk delivered to the wrong rank or offset never passes by chance. The offsets are
left out where the sums could stop being exact in the dtype, or for prod (the values would grow
too fast); the values are then plain seeded integers and the run says so in a note.

Outputs: each destination's output chunk must equal its chunk's input at a source (any of them
for a copy chunk with several holders, as the verifier accepts), or for a reduction the op over
every contributor's input chunk. Output chunks the demand does not name are not compared.
"""

from __future__ import annotations

from functools import reduce

import torch

from compiler.model.demand import Demand

SPREAD = 17  # values of one (rank, chunk) lie in [k*SPREAD - 8, k*SPREAD + 8]: disjoint for distinct k
_EXACT = {torch.float16: 2 ** 11, torch.bfloat16: 2 ** 8, torch.float32: 2 ** 24, torch.float64: 2 ** 53,
          torch.int8: 127, torch.uint8: 255, torch.int32: 2 ** 31 - 1, torch.int64: 2 ** 63 - 1}


def distinct_values(demand: Demand, n_in: int, dtype: torch.dtype, op: str) -> bool:
    """Whether offsets per (rank, chunk) keep every value and every sum exact in `dtype`."""
    if op == "prod":
        return False
    largest = (demand.ngpus * n_in + 1) * SPREAD + 8
    fan_in = max((len(c.sources) for c in demand.chunks), default=1) if demand.reduce else 1
    return largest * fan_in <= _EXACT.get(dtype, 0)


def custom_input(rank: int, n_in: int, ce: int, dtype: torch.dtype, seed: int, op: str, distinct: bool,
                 device="cpu") -> torch.Tensor:
    """Rank `rank`'s input buffer: n_in chunks of ce elements."""
    from backends.torch_dist import make_input
    x = make_input(rank, n_in * ce, dtype, seed, op, device)
    if distinct:
        k = torch.arange(n_in, device=device).repeat_interleave(ce) + rank * n_in + 1
        x = x + (k * SPREAD).to(dtype)
    return x


def custom_wrong(demand: Demand, rank: int, got: torch.Tensor, input_of, opf, ce: int) -> tuple[int, int | None]:
    """(wrong elements, offset of the first) in `rank`'s output `got` against the demand.
    input_of(r) gives rank r's input buffer; opf is the reduction (torch.add, ...)."""
    wrong, first = 0, None
    for c in demand.chunks:
        for d, di in zip(c.dests, c.dst_index):
            if d != rank:
                continue
            parts = [input_of(s)[si * ce:(si + 1) * ce] for s, si in zip(c.sources, c.src_index)]
            wants = [reduce(opf, parts)] if demand.reduce else parts
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
