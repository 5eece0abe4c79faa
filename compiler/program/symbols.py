"""Sparse symbols for the verifier's Encoding (compiler/program/interpret.py) where one int per
value would be too big: a reduce-scatter on 512 GPUs has 512 input chunks per rank, and a bit per
(rank, chunk) makes every input symbol an int of 262,144 bits (4 GB for the inputs alone). A
`Sparse` value keeps, per input chunk index, the mask of ranks whose chunk it holds; it behaves as
the int would under |, &, truth and equality (0 is the empty value).
"""

from __future__ import annotations


class Sparse:
    __slots__ = ("parts", "_hash")

    def __init__(self, parts: dict[int, int]):
        self.parts = parts  # chunk index -> mask of ranks; no zero masks
        self._hash = None

    def __bool__(self) -> bool:
        return bool(self.parts)

    def __or__(self, other):
        if isinstance(other, int) and other == 0:
            return self
        if not isinstance(other, Sparse):
            return NotImplemented
        out = dict(self.parts)
        for j, m in other.parts.items():
            out[j] = out.get(j, 0) | m
        return Sparse(out)

    __ror__ = __or__

    def __and__(self, other):
        if isinstance(other, int) and other == 0:
            return 0
        if not isinstance(other, Sparse):
            return NotImplemented
        out = {j: m & other.parts[j] for j, m in self.parts.items() if j in other.parts and m & other.parts[j]}
        return Sparse(out) if out else 0

    __rand__ = __and__

    def __eq__(self, other) -> bool:
        if isinstance(other, int):
            return other == 0 and not self.parts
        return isinstance(other, Sparse) and self.parts == other.parts

    def __hash__(self) -> int:
        if self._hash is None:
            self._hash = hash(frozenset(self.parts.items())) if self.parts else 0
        return self._hash

    def contributions(self) -> list[tuple[int, int]]:
        """(rank, index) per contribution, ordered as the int's bits would be (rank, then index)."""
        out = []
        for j, m in self.parts.items():
            while m:
                low = m & -m
                out.append((low.bit_length() - 1, j))
                m ^= low
        return sorted(out)
