"""Demands: which chunk starts where and which ranks must end with it.

A chunk is the unit the planners route. `sources` hold it at the start (for a reduction: the ranks
that contribute to it); `dests` must hold it (the full reduction) at the end. Buffer indices say
where the chunk lives in each source's input and each destination's output, in units of one chunk,
which is what the lowering needs. Several jobs can share one topology: each chunk names its job,
and `merge` joins demands on disjoint rank sets into one.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from compiler.specs.collectives import CUSTOM, spec
from compiler.specs.errors import DemandError
from compiler.specs.jsonkeys import DuplicateKey, loads, unique_keys

if TYPE_CHECKING:  # numpy is imported where masks() runs
    import numpy as np


@dataclass(frozen=True)
class Chunk:
    id: int
    sources: tuple[int, ...]
    dests: tuple[int, ...]
    src_index: tuple[int, ...]  # input-buffer index at each source, parallel to sources
    dst_index: tuple[int, ...]  # output-buffer index at each destination, parallel to dests
    job: int = 0


@dataclass(frozen=True)
class Demand:
    collective: str
    ngpus: int
    chunks: tuple[Chunk, ...]
    chunk_bytes: float
    size_bytes: int  # the size as nccl-tests counts it
    chunks_per_rank: int = 1
    reduce: bool = False
    root: int | None = None
    input_chunks: int = 0  # per-rank buffer sizes in chunks (MSCCL i_chunks / o_chunks)
    output_chunks: int = 0

    @property
    def ranks(self) -> tuple[int, ...]:
        return tuple(sorted({r for c in self.chunks for r in c.sources + c.dests}))

    @property
    def jobs(self) -> tuple[int, ...]:
        return tuple(sorted({c.job for c in self.chunks}))

    def needs(self) -> list[tuple[int, int]]:
        """(chunk id, rank) for every delivery the schedule must make."""
        return [(c.id, d) for c in self.chunks for d in c.dests if self.reduce or d not in c.sources]

    def masks(self) -> tuple[np.ndarray, np.ndarray]:
        """Boolean (chunks x ngpus) membership of sources and of destinations."""
        import numpy as np
        n = len(self.chunks)
        out = []
        for side in ("sources", "dests"):  # one fancy assignment over every (chunk, rank), not one per chunk
            lens = np.fromiter((len(getattr(c, side)) for c in self.chunks), dtype=np.int64, count=n)
            ranks = np.fromiter((r for c in self.chunks for r in getattr(c, side)), dtype=np.int64, count=int(lens.sum()))
            mask = np.zeros((n, self.ngpus), dtype=bool)
            mask[np.repeat(np.arange(n), lens), ranks] = True
            out.append(mask)
        return out[0], out[1]

    def split(self, parts: int) -> "Demand":
        """Each chunk becomes `parts` sub-chunks (buffer indices scale accordingly)."""
        if parts == 1:
            return self
        chunks = []
        for c in self.chunks:
            for p in range(parts):
                chunks.append(Chunk(c.id * parts + p, c.sources, c.dests,
                                    tuple(i * parts + p for i in c.src_index),
                                    tuple(i * parts + p for i in c.dst_index), c.job))
        return replace(self, chunks=tuple(chunks), chunk_bytes=self.chunk_bytes / parts,
                       chunks_per_rank=self.chunks_per_rank * parts,
                       input_chunks=self.input_chunks * parts, output_chunks=self.output_chunks * parts)

    # ---- JSON ---------------------------------------------------------------------------------

    def to_dict(self) -> dict:
        return {
            "collective": self.collective, "ngpus": self.ngpus, "chunk_bytes": self.chunk_bytes,
            "size_bytes": self.size_bytes, "chunks_per_rank": self.chunks_per_rank, "reduce": self.reduce,
            "root": self.root, "input_chunks": self.input_chunks, "output_chunks": self.output_chunks,
            "chunks": [[c.id, list(c.sources), list(c.dests), list(c.src_index), list(c.dst_index), c.job]
                       for c in self.chunks],
        }

    @classmethod
    def from_dict(cls, d: dict) -> "Demand":
        return cls(
            collective=d["collective"], ngpus=int(d["ngpus"]),
            chunks=tuple(Chunk(int(i), tuple(s), tuple(t), tuple(si), tuple(di), int(j))
                         for i, s, t, si, di, j in d["chunks"]),
            chunk_bytes=float(d["chunk_bytes"]), size_bytes=int(d["size_bytes"]),
            chunks_per_rank=int(d["chunks_per_rank"]), reduce=bool(d["reduce"]), root=d["root"],
            input_chunks=int(d["input_chunks"]), output_chunks=int(d["output_chunks"]),
        )


def _check(ngpus: int, size: int, chunks: int, root: int | None, collective: str) -> None:
    if ngpus < 2:
        raise DemandError(f"{collective}: needs at least 2 ranks, the topology has {ngpus}")
    if not isinstance(chunks, int) or chunks < 1:
        raise DemandError(f"chunks={chunks!r}: must be a whole number >= 1")
    if size <= 0:
        raise DemandError(f"size={size!r}: must be positive")
    if root is not None and not 0 <= root < ngpus:
        raise DemandError(f"root={root}: out of range (ranks 0..{ngpus - 1})")


def demand_counts(collective: str, ngpus: int, chunks: int = 1) -> tuple[int, int, int]:
    """(chunks, sources + destinations over all chunks, deliveries) of make_demand's result,
    without building it (memory is checked before a large demand is built): each count is a
    polynomial of degree <= 2 in the number of ranks, read off three small instances."""
    cs = spec(collective)

    def count(n: int) -> tuple[int, int, int]:
        shapes = list(cs.chunks(n, 1, 0))
        return (len(shapes), sum(len(s) + len(d) for s, d, _, _ in shapes),
                sum(len([x for x in d if cs.reduces or x not in s]) for s, d, _, _ in shapes))

    n = ngpus
    if n <= 16:
        return tuple(v * chunks for v in count(n))
    (x0, y0), (x1, y1), (x2, y2) = ((k, count(k)) for k in (4, 8, 16))
    lagrange = [((n - x1) * (n - x2)) / ((x0 - x1) * (x0 - x2)), ((n - x0) * (n - x2)) / ((x1 - x0) * (x1 - x2)),
                ((n - x0) * (n - x1)) / ((x2 - x0) * (x2 - x1))]
    return tuple(round(sum(w * y[i] for w, y in zip(lagrange, (y0, y1, y2)))) * chunks for i in range(3))


def make_demand(collective: str, ngpus: int, size_bytes: int, chunks: int = 1, root: int | None = None) -> Demand:
    """A standard collective (compiler.specs.collectives). `size_bytes` is nccl-tests' size:
    allgather the whole output, reduce_scatter the whole input, alltoall one rank's send buffer."""
    cs = spec(collective)
    if cs.rooted:
        root = 0 if root is None else root
    elif root not in (None, 0):
        raise DemandError(f"root={root}: {cs.name} has no root")
    else:
        root = None
    _check(ngpus, size_bytes, chunks, root, cs.name)
    i_ch, o_ch, size_ch = cs.chunk_counts(ngpus, chunks)
    out = tuple(Chunk(k, s, d, si, di) for k, (s, d, si, di) in enumerate(cs.chunks(ngpus, chunks, root)))
    return Demand(cs.name, ngpus, out, size_bytes / size_ch, size_bytes, chunks, cs.reduces, root, i_ch, o_ch)


def load_custom_demand(path: str, ngpus: int, chunk_bytes: int, chunks: int = 1) -> Demand:
    """A demand from JSON: {"chunks": [{"from": 0, "to": [1, 2]}, ...], "reduce": false}.
    `from` may be a list (several holders, or contributors when reduce is true); buffer indices
    default to the order of appearance at each rank. --size is the size of one chunk."""
    from compiler.fileio import read_input
    raw = read_input(path, "demand file", DemandError)
    try:
        doc = loads(raw.decode("utf-8"), object_pairs_hook=unique_keys)
    except DuplicateKey as e:
        raise DemandError(f"{path}: {e}") from None
    except json.JSONDecodeError as e:
        raise DemandError(f"{path}: not valid JSON: line {e.lineno} column {e.colno}: {e.msg}") from None
    except UnicodeDecodeError as e:
        raise DemandError(f"{path}: not valid JSON: {e}") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("chunks"), list) or not doc["chunks"]:
        raise DemandError(f"{path}: chunks: must be a non-empty list of {{\"from\": rank, \"to\": [ranks]}}")
    unknown = set(doc) - {"chunks", "reduce", "ngpus", "name"}
    if unknown:
        raise DemandError(f"{path}: {sorted(unknown)[0]}: unknown field (allowed: chunks, reduce, ngpus, name)")
    if "ngpus" in doc and doc["ngpus"] != ngpus:
        raise DemandError(f"{path}: ngpus: {doc['ngpus']!r} does not match the topology's {ngpus} GPUs")
    _check(ngpus, chunk_bytes, chunks, None, CUSTOM)
    reduce = doc.get("reduce", False)
    if not isinstance(reduce, bool):  # "yes" or "false" would read as true
        raise DemandError(f"{path}: reduce: {reduce!r} must be true or false")
    in_next = [0] * ngpus
    out_next = [0] * ngpus
    out: list[Chunk] = []
    for i, c in enumerate(doc["chunks"]):
        if not isinstance(c, dict) or set(c) - {"from", "to", "job"} or "from" not in c or "to" not in c:
            raise DemandError(f"{path}: chunks[{i}]: {c!r} must be {{\"from\": rank(s), \"to\": [ranks], \"job\": n}}")
        job = c.get("job", 0)
        if not isinstance(job, int) or isinstance(job, bool) or job < 0:
            raise DemandError(f"{path}: chunks[{i}].job: {job!r} is not a job number (0, 1, ...)")
        src = c["from"] if isinstance(c["from"], list) else [c["from"]]
        dst = c["to"] if isinstance(c["to"], list) else [c["to"]]
        for field, ranks in (("from", src), ("to", dst)):
            if not ranks:
                raise DemandError(f"{path}: chunks[{i}].{field}: is empty")
            for r in ranks:
                if not isinstance(r, int) or isinstance(r, bool) or not 0 <= r < ngpus:
                    raise DemandError(f"{path}: chunks[{i}].{field}: {r!r} is not a rank (0..{ngpus - 1})")
            if len(set(ranks)) != len(ranks):
                raise DemandError(f"{path}: chunks[{i}].{field}: {ranks!r} repeats a rank")
        for p in range(chunks):
            si = []
            for r in src:
                si.append(in_next[r])
                in_next[r] += 1
            di = []
            for r in dst:
                di.append(out_next[r])
                out_next[r] += 1
            out.append(Chunk(len(out), tuple(src), tuple(dst), tuple(si), tuple(di), job))
    demand = Demand(CUSTOM, ngpus, tuple(out), chunk_bytes / chunks, chunk_bytes * len(doc["chunks"]),
                    chunks, reduce, None, max(in_next), max(out_next))
    if moves_nothing(demand):  # its program would take no time: algbw infinite, nothing to compare or bench
        raise DemandError(f"{path}: chunks: no chunk has to move (every rank in \"to\" holds it already"
                          + (", as its only contributor" if reduce else "") + "): there is nothing to plan")
    return demand


def moves_nothing(demand: Demand) -> bool:
    """No chunk has to travel: every destination holds its chunk already (for a reduction, it is
    the chunk's only contributor). A phase of a reduction can be like that (a chunk with one
    contributor needs no reduce-scatter), and no planner has a horizon of 0 epochs."""
    return all(set(c.dests) <= set(c.sources) and (not demand.reduce or len(c.sources) == 1) for c in demand.chunks)


def on_ranks(demand: Demand, ranks: list[int], ngpus: int) -> Demand:
    """The same collective run by a subset of a larger system's ranks: rank i becomes ranks[i]."""
    if len(ranks) != demand.ngpus or len(set(ranks)) != len(ranks) or not all(0 <= r < ngpus for r in ranks):
        raise DemandError(f"ranks: {ranks!r} must be {demand.ngpus} distinct ranks of 0..{ngpus - 1}")
    chunks = tuple(replace(c, sources=tuple(ranks[r] for r in c.sources), dests=tuple(ranks[r] for r in c.dests))
                   for c in demand.chunks)
    return replace(demand, ngpus=ngpus, chunks=chunks, root=None if demand.root is None else ranks[demand.root])


def merge(demands: list[Demand]) -> Demand:
    """Several jobs on one topology: chunk ids renumbered, job ids kept distinct."""
    if not demands:
        raise DemandError("merge: no demand given")
    first = demands[0]
    chunks: list[Chunk] = []
    for job, d in enumerate(demands):
        if d.ngpus != first.ngpus or d.chunk_bytes != first.chunk_bytes or d.reduce != first.reduce:
            raise DemandError("merge: jobs must share the topology, the chunk size and reduction kind")
        for c in d.chunks:
            chunks.append(replace(c, id=len(chunks), job=job))
    return replace(first, collective=CUSTOM, chunks=tuple(chunks),
                   size_bytes=sum(d.size_bytes for d in demands),
                   input_chunks=max(d.input_chunks for d in demands),
                   output_chunks=max(d.output_chunks for d in demands))


def demand_chunks(demand: Demand) -> tuple[int, float]:
    """(chunks of a custom demand as its file lists them, bytes of each): the planners may have
    cut each into demand.chunks_per_rank pieces."""
    n = max(1, len(demand.chunks) // demand.chunks_per_rank)
    each = demand.size_bytes / n
    return n, int(each) if float(each).is_integer() else each
