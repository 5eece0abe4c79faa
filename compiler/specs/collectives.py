"""What a collective is: one entry per collective, and the only place that knows them by name.

A `CollectiveSpec` holds the names a user may type, whether it has a root and reduces, nccl-tests'
bus-bandwidth factor, the chunk layout (how many chunk blocks the input, the output and the
nccl-tests size hold), the in-place aliasing of msccl-xml.md §10, the demand builder (which chunk
goes from where to where; the postcondition is the demand met), and the torch.distributed call
that computes the same result (for comparing and for bench's default side; it is handed the
`torch.distributed` module, so this module never imports torch), and whether torch passes that
call one buffer (then every call is in place).

Layout in blocks: a rank's buffers are cut into blocks of C chunks (C = chunks per rank); `inp`,
`out` and `size` say how many blocks the input, the output and nccl-tests' size hold: 1 or n (the
number of ranks). nchunksperloop of an MSCCL program is size * C for every standard collective.

Adding a collective touches this module (and its tests), nothing else.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Iterator

from compiler.specs.errors import DemandError

ALL, ONE = "n", "1"  # a buffer of n blocks (one per rank) or of one block

# (sources, dests, src_index, dst_index) of one chunk; model.demand turns them into Chunks
ChunkShape = tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...], tuple[int, ...]]


@dataclass(frozen=True)
class Alias:
    """In an in-place call, chunk k of buffer `view` is chunk `offset + k` of buffer `base`: the
    same memory. `base` is the whole buffer, `view` a window into it."""
    view: str
    base: str
    offset: int

    def map(self, slot: tuple[str, int]) -> tuple[str, int]:
        """A (buffer, chunk) slot named in `base` terms (slots of other buffers unchanged)."""
        return (self.base, self.offset + slot[1]) if slot[0] == self.view else slot


@dataclass(frozen=True)
class CollectiveSpec:
    name: str  # canonical, as the compiler spells it inside
    spellings: tuple[str, ...]  # what a user may type besides the name (any case)
    rooted: bool
    reduces: bool
    inp: str  # blocks in a rank's input: ALL (n) or ONE
    out: str  # blocks in a rank's output
    size: str  # blocks in nccl-tests' size S (allgather: the output; reduce-scatter: the input)
    bus: Callable[[int], float]  # nccl-tests' busbw / algbw for n ranks
    inplace: str | None  # "same" (one buffer), "input-in-output", "output-in-input"; None: no in-place form
    build: Callable[[int, int, int | None], Iterator[ChunkShape]]  # (n, chunks in the size, root) -> chunks
    # (dist, inp, out, n, rank, root, op, group) -> this rank's output, written into `out` (for a
    # one-buffer call `out` holds the input and is reduced or broadcast in place)
    torch_call: Callable | None = None
    phases: tuple[str, ...] = ()  # planned as these collectives one after the other (allreduce)
    flat: bool = False  # any number of chunks (not whole blocks): chunk k is the same slot on every rank
    one_buffer: bool = False  # torch's call takes one buffer (send = receive): always an in-place call
    torch_gpu_note: str = ""  # what to know about torch's call on CUDA when timing MSCCL against it

    def blocks(self, which: str, n: int) -> int:
        return n if {"inp": self.inp, "out": self.out, "size": self.size}[which] == ALL else 1

    def elements(self, which: str, n: int, size_elems: int) -> int:
        """Elements of buffer `which` ("inp", "out") of one rank for nccl-tests' size of
        `size_elems` elements."""
        if self.blocks(which, n) == self.blocks("size", n):
            return size_elems
        return size_elems // self.blocks("size", n) * self.blocks(which, n)

    @property
    def inplace_window(self) -> bool:
        """In place, one buffer is this rank's window of the other (allgather, reduce-scatter)."""
        return self.inplace in ("input-in-output", "output-in-input")

    def count_unit(self, n: int) -> int:
        """The size is a multiple of this many elements (whole blocks); nccl-tests' count is the
        size over it (elements per rank for allgather, reduce-scatter, alltoall, scatter, gather)."""
        return 1 if self.flat else self.blocks("size", n)

    def chunk_counts(self, n: int, C: int) -> tuple[int, int, int]:
        """(input, output, size) of one rank in chunks."""
        return self.blocks("inp", n) * C, self.blocks("out", n) * C, self.blocks("size", n) * C

    def alias(self, rank: int, i_chunks: int, o_chunks: int) -> Alias | None:
        """The runtimes' aliasing of an in-place call (msccl-xml.md §10): allgather i[j] is
        o[rank*f + j] (f = i_chunks); reduce_scatter o[j] is i[rank*f + j] (f = o_chunks); one
        buffer for allreduce, broadcast, reduce and alltoall; None without an in-place form."""
        if self.inplace == "same":
            return Alias("i", "o", 0)
        if self.inplace == "input-in-output":
            return Alias("i", "o", rank * i_chunks)
        if self.inplace == "output-in-input":
            return Alias("o", "i", rank * o_chunks)
        return None

    def chunks(self, n: int, C: int, root: int | None = None) -> Iterator[ChunkShape]:
        """The demand with C chunks per block (make_demand's chunks per rank)."""
        return self.build(n, self.blocks("size", n) * C, root)

    def fits(self, n: int, N: int) -> bool:
        """Whether nchunksperloop N is whole blocks for n ranks (always, for a flat collective)."""
        return self.flat or N % self.blocks("size", n) == 0

    def file_chunks(self, n: int, N: int, root: int | None = None) -> list[ChunkShape] | None:
        """The demand of an MSCCL file with nchunksperloop N (the size's chunks), None where N is
        not whole blocks (its postcondition is then undefined)."""
        return list(self.build(n, N, root)) if self.fits(n, N) else None

    def root_sends(self) -> bool:
        """A rooted collective whose root is the only source (broadcast, scatter), not the only
        destination (reduce, gather)."""
        return all(s == (0,) for s, _, _, _ in self.chunks(2, 1, 0))

    def defined_ranks(self, n: int, root: int | None) -> list[int]:
        """Ranks whose output the collective defines (reduce and gather: the root only)."""
        return sorted({d for _, ds, _, _ in self.chunks(n, 1, root) for d in ds})


# ---- demand builders: (n ranks, chunks in nccl-tests' size, root) -> chunks -----------------------
# (for all but allreduce the size is whole blocks of C = total / blocks chunks each)

def _allgather(n, total, root):
    everyone, C = tuple(range(n)), total // n
    for s in range(n):
        for c in range(C):
            yield (s,), everyone, (c,), (s * C + c,) * n


def _alltoall(n, total, root):
    C = total // n
    for s in range(n):
        for d in range(n):
            for c in range(C):
                yield (s,), (d,), (d * C + c,), (s * C + c,)


def _reduce_scatter(n, total, root):
    everyone, C = tuple(range(n)), total // n
    for d in range(n):
        for c in range(C):
            yield everyone, (d,), (d * C + c,) * n, (c,)


def _allreduce(n, total, root):  # any number of chunks: chunk k is slot k everywhere
    everyone = tuple(range(n))
    for k in range(total):
        yield everyone, everyone, (k,) * n, (k,) * n


def _broadcast(n, total, root):
    for c in range(total):
        yield (root,), tuple(range(n)), (c,), (c,) * n


def _reduce(n, total, root):
    for c in range(total):
        yield tuple(range(n)), (root,), (c,) * n, (c,)


def _scatter(n, total, root):  # size = the root's whole send buffer
    C = total // n
    for d in range(n):
        for c in range(C):
            yield (root,), (d,), (d * C + c,), (c,)


def _gather(n, total, root):  # size = the root's whole receive buffer
    C = total // n
    for s in range(n):
        for c in range(C):
            yield (s,), (root,), (c,), (s * C + c,)


# ---- torch.distributed counterparts (the reference, and bench's default side) ---------------------

_NEWER = {"all_gather_into_tensor": "all_gather_single", "reduce_scatter_tensor": "reduce_scatter_single"}
_OLDER = {"all_gather_into_tensor": "_all_gather_base", "reduce_scatter_tensor": "_reduce_scatter_base"}


def _call(dist, name: str):
    """all_gather_into_tensor / reduce_scatter_tensor under the names newer releases use, else
    under their older names."""
    for candidate in (_NEWER[name], name, _OLDER[name]):
        fn = getattr(dist, candidate, None)
        if fn is not None:
            return fn
    raise AttributeError(f"torch.distributed has no {name}")


def _t_allgather(dist, inp, out, n, rank, root, op, group):
    _call(dist, "all_gather_into_tensor")(out, inp, group=group)
    return out


def _t_alltoall(dist, inp, out, n, rank, root, op, group):
    dist.all_to_all_single(out, inp, group=group)
    return out


def _t_reduce_scatter(dist, inp, out, n, rank, root, op, group):
    _call(dist, "reduce_scatter_tensor")(out, inp, op=op, group=group)
    return out


def _t_allreduce(dist, inp, out, n, rank, root, op, group):
    dist.all_reduce(out, op=op, group=group)
    return out


def _t_broadcast(dist, inp, out, n, rank, root, op, group):
    dist.broadcast(out, src=root, group=group)
    return out


def _t_reduce(dist, inp, out, n, rank, root, op, group):
    dist.reduce(out, dst=root, op=op, group=group)
    return out


def _t_scatter(dist, inp, out, n, rank, root, op, group):
    dist.scatter(out, list(inp.chunk(n)) if rank == root else None, src=root, group=group)
    return out


def _t_gather(dist, inp, out, n, rank, root, op, group):
    dist.gather(inp, list(out.chunk(n)) if rank == root else None, dst=root, group=group)
    return out


def _minus_one(n: int) -> float:
    return (n - 1) / n


SPECS: dict[str, CollectiveSpec] = {s.name: s for s in (
    CollectiveSpec("allgather", ("all_gather", "all-gather"), False, False, ONE, ALL, ALL, _minus_one,
                   "input-in-output", _allgather, _t_allgather),
    CollectiveSpec("alltoall", ("all_to_all", "all-to-all", "a2a"), False, False, ALL, ALL, ALL, _minus_one,
                   "same", _alltoall, _t_alltoall,
                   torch_gpu_note="PyTorch's all_to_all_single has used grouped send/recv on CUDA, not "
                                  "ncclAllToAll: an alltoall file may never be selected (msccl-xml.md §12.3)"),
    CollectiveSpec("reduce_scatter", ("reducescatter", "reduce-scatter"), False, True, ALL, ONE, ALL, _minus_one,
                   "output-in-input", _reduce_scatter, _t_reduce_scatter),
    CollectiveSpec("allreduce", ("all_reduce", "all-reduce"), False, True, ALL, ALL, ALL, lambda n: 2 * (n - 1) / n,
                   "same", _allreduce, _t_allreduce, phases=("reduce_scatter", "allgather"), flat=True,
                   one_buffer=True),
    CollectiveSpec("broadcast", ("bcast",), True, False, ONE, ONE, ONE, lambda n: 1.0, "same", _broadcast,
                   _t_broadcast, one_buffer=True),
    CollectiveSpec("reduce", (), True, True, ONE, ONE, ONE, lambda n: 1.0, "same", _reduce, _t_reduce,
                   one_buffer=True),
    CollectiveSpec("scatter", (), True, False, ALL, ONE, ALL, _minus_one, None, _scatter, _t_scatter),
    CollectiveSpec("gather", (), True, False, ONE, ALL, ALL, _minus_one, None, _gather, _t_gather),
)}
CUSTOM = "custom"  # a demand from a file: no spec, its chunks are the demand itself
TWO_PHASES = SPECS["allreduce"].phases  # how any reduction to several ranks is planned: reduce, then copy out
COLLECTIVES = tuple(SPECS)
_SPELLINGS = {k: s.name for s in SPECS.values() for k in (s.name, *s.spellings)}


def canonical(name: str) -> str:
    """'ReduceScatter', 'reduce-scatter', 'reducescatter' -> 'reduce_scatter' (msccl-tools spellings too)."""
    key = name.strip().lower()
    if key == CUSTOM:  # not a spec: a demand file, which only `msccl-compile custom --demand FILE` reads
        raise DemandError(f"collective: {name!r} is a demand read from a file (msccl-compile custom --demand FILE), "
                          f"not one this takes (known: {', '.join(COLLECTIVES)})")
    if key not in _SPELLINGS:
        raise DemandError(f"collective: {name!r} is not a collective (known: {', '.join(COLLECTIVES)}, {CUSTOM})")
    return _SPELLINGS[key]


def spec(name: str) -> CollectiveSpec:
    return SPECS[canonical(name)]


def spellings() -> dict[str, str]:
    """Every accepted spelling -> the canonical name."""
    return dict(_SPELLINGS)


def bus_factor(collective: str, n: int) -> float:
    """nccl-tests' busbw / algbw; 1 for a custom demand."""
    return SPECS[collective].bus(n) if collective in SPECS else 1.0


def inplace_alias(collective: str, rank: int, i_chunks: int, o_chunks: int) -> Alias | None:
    """The aliasing of an in-place call of `collective` (None for custom and those without one)."""
    return SPECS[collective].alias(rank, i_chunks, o_chunks) if collective in SPECS else None
