"""PyTorch integration: the MSCCL runtimes' environment, and an executor of Programs over gloo.

Three parts.

1. **Loading by environment** (msccl-xml.md §12). `msccl_env(runtime, path, world_size)` returns
   exactly the variables a runtime documents, after checking the algorithm files' `<algo>` headers;
   `msccl_environment(...)` sets them for a `with` block and restores the previous environment;
   `export_lines(env)` gives shell `export` lines. Set them **before the first communicator
   exists**: before `init_process_group` and before the first collective (PyTorch creates NCCL
   communicators lazily unless `device_id` is passed).

   | runtime | variables |
   |---|---|
   | `executor` (Azure/msccl-executor-nccl) | `MSCCL_ALGO_DIR=DIR`, `MSCCL_ENABLE=1` |
   | `old` (microsoft/msccl, NCCL 2.12) | `MSCCL_XML_FILES=a.xml:b.xml` (at most 4), `NCCL_ALGO=MSCCL,RING,TREE` |
   | `rccl` (MSCCL inside RCCL) | `RCCL_MSCCL_ENABLE=1`, `RCCL_MSCCL_FORCE_ENABLE=1`, `MSCCL_ALGO_DIR=DIR` |

   The executor and RCCL parse **every regular file or symlink** in `MSCCL_ALGO_DIR`, and a file
   they cannot parse makes communicator creation fail: keep nothing else there (a manifest or a
   README belongs next to the directory, or in a subdirectory, which they skip).

2. **An executor over torch.distributed** (`execute`, one call per rank inside a gloo process
   group). It interprets this rank's thread blocks with the semantics of msccl-xml.md §3-§6: each
   tb runs its steps in order; the k-th send on a connection (rank -> peer, channel) pairs with
   the k-th receive of the peer's tb (one gloo tag per (src, dst, channel), so connections are
   separate FIFOs); a step with a dependency runs only after its target tb has published a step
   >= deps (tbs publish after steps with hasdep=1; nops never publish); reductions use the call's
   op; cnt > 1 moves cnt contiguous chunks as one message.

   Scheduling. gloo's point-to-point Work objects cannot be polled (is_completed() stays false
   until wait(); they have no future; and a wait that times out closes the connection pairs), so
   the tbs of a rank cannot be multiplexed by polling. Instead `prepare` runs the program's control
   once through the verifier's machine (compiler.verify_exec.Machine with unbounded connection
   slots), which yields one global order of all steps consistent with program order,
   dependencies and message order. Every rank runs its own steps in that order in one thread:
   receives are posted up front (irecv, in FIFO order per connection), sends are posted as isend
   without waiting, and a receive is waited for only when the global order has already placed its
   matching send, so a blocking wait never waits on this rank's own later work. A program that
   cannot complete (a missing receive, a dependency cycle) is refused by `prepare` with the
   verifier's message before anything is sent. Every wait is bounded by `timeout` (for the whole
   call); on expiry the error names the rank, tb, step and the message it waits for.

   The executor has no connection-slot limit (gloo buffers): a program that deadlocks only under
   the runtime's bounded slots (msccl-xml.md §7.5) runs here; `compiler.verify` checks that.

3. **Local runs** (`run_local`, `run_local_many`, `launch_local`): spawn N local processes
   (forkserver, gloo over 127.0.0.1, rendezvous through a TCPStore the parent owns, so no port
   race), run a program on seeded random integers (exact in floating point), compare with torch's
   own collective, report #wrong and the time. A run never hangs: every wait in the children is
   bounded, and the parent kills children that stop reporting.

GPU path (not exercised on CPU; this is what changes on CUDA):

* backend `nccl`, one process per GPU (`torchrun --nproc_per_node=N`), `torch.cuda.set_device
  (LOCAL_RANK)`. Our executor is not used: the MSCCL runtime executes the XML inside NCCL, and the
  ordinary torch call (`all_gather_into_tensor` / `all_gather_single`, `reduce_scatter_tensor`,
  `all_reduce`, ...) is what runs the algorithm.
* MSCCL is loaded through the environment: `msccl_env(...)` / `msccl_environment(...)` before
  `init_process_group` (and before any collective). PyTorch wheels load libnccl.so.2 from the
  nvidia-nccl package; force the MSCCL build with
  `LD_PRELOAD=<msccl-executor-nccl>/build/lib/libnccl.so.2` in the launch command (setting it
  inside Python is too late). Check `torch.cuda.nccl.version()` == (2, 23, 4) for the executor, and
  `NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,ENV` for the proof lines ("MSCCL: Setup Kernel finished"
  on every launch; `backends.bench.check_runtime` reads them).
* ROCm: preload an MSCCL-enabled librccl.so, runtime `rccl` (RCCL_MSCCL_FORCE_ENABLE=1 is needed
  for custom files). RCCL from ROCm 7.13 on has removed MSCCL.
* `all_to_all_single` on CUDA has used grouped send/recv, not ncclAllToAll: alltoall files may
  never be selected unless PyTorch is patched (msccl-xml.md §12.3).
"""

from __future__ import annotations

import datetime
import math
import os
import queue as queue_mod
import re
import shlex
import statistics
import time
import warnings
from collections import deque
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator

import torch
import torch.distributed as dist

from compiler.specs.collectives import canonical, inplace_alias
from compiler.specs.runtimes import NAMES
from compiler.specs.errors import CompileError
from compiler.fileio import read_input
from compiler.model.program import RECVS, SENDS, Program
from compiler.program.interpret import UNBOUNDED, trace
from compiler.program.rules import STRUCTURAL, static_findings
from compiler.program.semantics import connections, expected_chunks, root_candidates

__all__ = [
    "RUNTIMES", "ExecutionError", "AlgoHeader", "read_header", "algorithm_files", "msccl_env", "msccl_environment",
    "export_lines", "check_bands", "select_algorithm", "ExecPlan", "prepare", "execute", "RunResult", "run_local",
    "run_local_many", "launch_local", "make_input", "op_name",
]

RUNTIMES = NAMES
LEGACY_MAX_ALGOS = 4


class ExecutionError(CompileError):
    """A program that cannot run, or a run that failed: one line naming rank, tb and step."""


# ==== algorithm headers ==========================================================================

_INT = re.compile(r"\s*([+-]?)(0[xX][0-9a-fA-F]+|0[0-7]*|[1-9][0-9]*)\s*\Z")
_ATTR = re.compile(r'([A-Za-z_][\w.-]*)\s*=\s*"([^"]*)"')
_HEADER_REQUIRED = {
    "executor": ("proto", "nchannels", "nchunksperloop", "ngpus", "coll", "inplace", "outofplace", "minBytes",
                 "maxBytes"),
    "rccl": ("proto", "nchannels", "nchunksperloop", "ngpus", "coll", "inplace", "outofplace", "minBytes",
             "maxBytes"),
    "old": ("name", "proto", "nchannels", "nchunksperloop", "ngpus", "coll", "inplace"),
}
_COLL_SPELLINGS = {  # msccl-xml.md §2.1
    "executor": ("allreduce", "allgather", "reduce", "broadcast", "alltoall", "reducescatter", "send", "recv",
                 "gather", "scatter", "alltoallv"),
    "rccl": ("allreduce", "allgather", "reduce", "broadcast", "alltoall", "reducescatter", "send", "recv",
             "gather", "scatter", "alltoallv"),
    "old": ("allreduce", "allgather", "reduce", "broadcast", "alltoall", "reduce_scatter", "custom"),
}


def _c_int(text: str) -> int | None:
    """An integer as C strtol(..., 0) reads it ("0x10" = 16, "010" = 8); None if it is not one."""
    m = _INT.match(text)
    if m is None:
        return None
    sign, digits = m.groups()
    base = 16 if digits[:2] in ("0x", "0X") else 8 if digits[0] == "0" and len(digits) > 1 else 10
    return int(digits, base) * (-1 if sign == "-" else 1)


@dataclass(frozen=True)
class AlgoHeader:
    """The `<algo>` element of an MSCCL XML file: what the runtimes read for selection."""
    path: str
    name: str
    coll: str  # the attribute as written ("reducescatter", "allgather", ...)
    collective: str  # canonical (compiler.collectives) or the attribute itself when it has none
    ngpus: int
    nchunksperloop: int
    nchannels: int
    proto: str
    inplace: bool
    outofplace: bool
    min_bytes: int
    max_bytes: int  # as written; 0 = no limit for executor/RCCL
    missing: tuple[str, ...] = ()  # attributes the file does not have (defaults used above)
    problems: tuple[str, ...] = ()  # things the runtimes' reader rejects (declaration, tabs)

    @property
    def label(self) -> str:
        return Path(self.path).name


def read_header(path: str | os.PathLike) -> AlgoHeader:
    """Reads only the `<algo ...>` start tag of an MSCCL XML file (the executor's first pass does
    the same). Raises CompileError if the file does not start with one."""
    p = Path(path)
    data = read_input(p, "algorithm file", limit=1 << 16)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise CompileError(f"{p}: not an MSCCL algorithm file (binary data)") from None
    problems = []
    rest = text.lstrip(" \r\n\t")
    if rest.startswith("<?xml"):
        problems.append("starts with an XML declaration, which the runtimes' reader rejects")
        end = rest.find("?>")
        rest = rest[end + 2:].lstrip(" \r\n\t") if end >= 0 else ""
    while rest.startswith("<!--"):
        end = rest.find("-->")
        rest = rest[end + 3:].lstrip(" \r\n\t") if end >= 0 else ""
    if not re.match(r"<algo[\s>/]", rest):
        first = rest[:40].splitlines()[0] if rest.strip() else "(empty)"
        raise CompileError(f"{p}: not an MSCCL algorithm file: it must start with <algo ...>, found {first!r}")
    end = rest.find(">")
    if end < 0:
        raise CompileError(f"{p}: algo: the <algo ...> start tag is not closed")
    tag = rest[:end]
    if "\n" in tag or "\r" in tag:
        problems.append("the <algo> start tag spans several lines, which the runtimes' reader rejects")
    if "\t" in text:
        problems.append("contains tabs, which the runtimes' reader rejects")
    attrs = dict(_ATTR.findall(tag))
    missing = tuple(a for a in ("name", "proto", "nchannels", "nchunksperloop", "ngpus", "coll", "inplace",
                                "outofplace", "minBytes", "maxBytes") if a not in attrs)

    def num(attr: str, default: int) -> int:
        if attr not in attrs:
            return default
        v = _c_int(attrs[attr])
        if v is None:
            raise CompileError(f"{p}: algo: {attr}: {attrs[attr]!r} is not an integer")
        return v

    coll = attrs.get("coll", "")
    try:
        collective = canonical(coll)
    except CompileError:
        collective = coll
    inplace = bool(num("inplace", 0))
    return AlgoHeader(
        path=str(p), name=attrs.get("name", ""), coll=coll, collective=collective, ngpus=num("ngpus", 0),
        nchunksperloop=num("nchunksperloop", 0), nchannels=num("nchannels", 0), proto=attrs.get("proto", ""),
        inplace=inplace, outofplace=bool(num("outofplace", int(not inplace))), min_bytes=num("minBytes", 0),
        max_bytes=num("maxBytes", 0), missing=missing, problems=tuple(problems))


def _check_runtime(runtime: str) -> None:
    if runtime not in RUNTIMES:
        raise CompileError(f"--runtime: {runtime!r} is not a runtime (known: {', '.join(RUNTIMES)})")


def _check_header(h: AlgoHeader, runtime: str, world_size: int | None) -> None:
    """What makes a runtime fail or never select the file, refused with one line."""
    if h.problems:
        raise CompileError(f"{h.path}: {h.problems[0]}")
    missing = [a for a in _HEADER_REQUIRED[runtime] if a in h.missing]
    if missing:
        raise CompileError(f"{h.path}: algo: attribute {missing[0]} is missing; the {runtime} runtime requires it "
                           f"(msccl-tools omits outofplace/minBytes/maxBytes: rewrite the file with msccl-compile)")
    if h.coll not in _COLL_SPELLINGS[runtime]:
        hint = ""
        if h.collective == "reduce_scatter":
            hint = f" (write it for --runtime {runtime}: reduce-scatter is spelled differently per runtime)"
        raise CompileError(f"{h.path}: algo: coll={h.coll!r} is not accepted by the {runtime} runtime{hint}")
    if world_size is not None and h.ngpus != world_size:
        raise CompileError(f"{h.path}: ngpus={h.ngpus} does not match the world size {world_size}")


def algorithm_files(path: str | os.PathLike, runtime: str = "executor") -> list[Path]:
    """The files a runtime would load from `path`. executor/rccl: every regular file or symlink in
    the directory (the runtime parses them all; a non-algorithm file is refused here because it
    would make communicator creation fail). old: the file itself, or the directory's *.xml files."""
    _check_runtime(runtime)
    p = Path(path)
    if not p.exists():
        raise CompileError(f"{p}: no such file or directory")
    if runtime in ("executor", "rccl"):
        if not p.is_dir():
            raise CompileError(f"{p}: the {runtime} runtime loads a directory (MSCCL_ALGO_DIR), not a file: put the "
                               f"algorithm in a directory of its own")
        files = sorted(e for e in p.iterdir() if e.is_symlink() or e.is_file())
        for f in files:
            if not f.name.endswith(".xml") or f.is_symlink() and not f.is_file():
                try:
                    read_header(f)
                except CompileError:
                    raise CompileError(f"{f}: not an MSCCL algorithm file, and the {runtime} runtime parses every "
                                       f"regular file in MSCCL_ALGO_DIR: move it out of {p}") from None
    else:
        if ":" in str(p.resolve()):
            raise CompileError(f"{p}: the path contains ':', which MSCCL_XML_FILES uses as its separator")
        files = [p] if p.is_file() else sorted(e for e in p.iterdir() if e.is_file() and e.name.endswith(".xml"))
    if not files:
        raise CompileError(f"{p}: holds no algorithm files")
    return files


def msccl_env(runtime: str, path: str | os.PathLike, world_size: int | None = None) -> dict[str, str]:
    """The environment that makes `runtime` load the algorithms at `path` (a directory; for `old`
    also a single file), exactly the variables msccl-xml.md §12.1 documents. Every file's header is
    checked: readable `<algo>`, required attributes, the runtime's `coll` spelling, and `ngpus` ==
    `world_size` when given. Raises CompileError (one line) on any problem."""
    _check_runtime(runtime)
    files = algorithm_files(path, runtime)
    headers = []
    for f in files:
        try:
            h = read_header(f)
        except CompileError as e:
            if runtime in ("executor", "rccl"):
                raise CompileError(f"{e} (the {runtime} runtime parses every regular file in MSCCL_ALGO_DIR)") from None
            raise
        _check_header(h, runtime, world_size)
        headers.append(h)
    if runtime == "old":
        if len(files) > LEGACY_MAX_ALGOS:
            raise CompileError(f"{path}: {len(files)} algorithm files; the old runtime loads at most "
                               f"{LEGACY_MAX_ALGOS} (MSCCL_XML_FILES)")
        return {"MSCCL_XML_FILES": ":".join(str(f.resolve()) for f in files), "NCCL_ALGO": "MSCCL,RING,TREE"}
    directory = str(Path(path).resolve())
    if runtime == "executor":
        return {"MSCCL_ALGO_DIR": directory, "MSCCL_ENABLE": "1"}
    return {"RCCL_MSCCL_ENABLE": "1", "RCCL_MSCCL_FORCE_ENABLE": "1", "MSCCL_ALGO_DIR": directory}


@contextmanager
def msccl_environment(runtime: str, path: str | os.PathLike, world_size: int | None = None) -> Iterator[dict]:
    """Sets msccl_env(...) in os.environ for the block and restores the previous values (removing
    variables that were not set) on exit. Enter it before init_process_group."""
    env = msccl_env(runtime, path, world_size)
    with patched_environ(env):
        yield env


@contextmanager
def patched_environ(env: dict[str, str | None]) -> Iterator[None]:
    """os.environ with `env` applied (None unsets a variable) for the block; restored on exit."""
    saved = {k: os.environ.get(k) for k in env}
    _apply(env)
    try:
        yield
    finally:
        _apply(saved)


def _apply(env: dict[str, str | None]) -> None:
    for k, v in env.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v


def export_lines(env: dict[str, str]) -> list[str]:
    """Shell lines `export K=V` (V shell-quoted) for `msccl-compile env DIR --runtime ...`."""
    return [f"export {k}={shlex.quote(v)}" for k, v in env.items()]


def _headers(files) -> list[AlgoHeader]:
    if isinstance(files, (str, os.PathLike)):
        p = Path(files)
        files = sorted(e for e in p.iterdir() if e.is_file()) if p.is_dir() else [p]
    return [f if isinstance(f, AlgoHeader) else read_header(f) for f in files]


def check_bands(files, runtime: str = "executor") -> list[str]:
    """Problems with the size bands of a library: for each (collective, ngpus) and each call kind
    (out-of-place, in-place), the files' [minBytes, maxBytes] must not overlap and must be
    contiguous between the smallest and the largest band. `files`: paths, AlgoHeaders or one
    directory. executor/rccl read maxBytes inclusively (0 = no limit); old exclusively, where our
    writer's maxBytes = hi - 1 convention leaves a one-byte seam that is accepted."""
    _check_runtime(runtime)
    headers = _headers(files)
    out = []
    inf = math.inf
    for h in headers:
        if h.max_bytes and h.min_bytes > h.max_bytes:
            out.append(f"{h.label}: minBytes={h.min_bytes} is above maxBytes={h.max_bytes}")
    groups: dict[tuple, list[AlgoHeader]] = {}
    for h in headers:
        for kind, ok in (("out-of-place", h.outofplace), ("in-place", h.inplace)):
            if ok:
                groups.setdefault((h.collective, h.ngpus, kind), []).append(h)
    for (coll, ngpus, kind), hs in sorted(groups.items()):
        def hi(h: AlgoHeader) -> float:
            if runtime == "old":
                return (h.max_bytes - 1) if h.max_bytes else -1  # exclusive; 0 = never selected
            return h.max_bytes if h.max_bytes else inf
        hs = sorted(hs, key=lambda h: (h.min_bytes, hi(h), h.path))
        where = f"{coll} ngpus={ngpus} {kind}"
        for a, b in zip(hs, hs[1:]):
            ha = hi(a)
            if b.min_bytes <= ha:
                top = "no limit" if ha == inf else f"{int(ha)}"
                out.append(f"{where}: {a.label} [{a.min_bytes}, {top}] and {b.label} [{b.min_bytes}, "
                           f"{'no limit' if hi(b) == inf else int(hi(b))}] overlap")
            elif b.min_bytes > ha + 1 + (runtime == "old"):
                out.append(f"{where}: gap: no algorithm for {int(ha) + 1}..{b.min_bytes - 1} bytes between "
                           f"{a.label} and {b.label}")
    return out


def select_algorithm(files, collective: str, size_bytes: int, ngpus: int, itemsize: int = 4,
                     inplace: bool = False) -> AlgoHeader | None:
    """The file the executor would pick for a call (msccl-xml.md §12.2): in lexicographic path
    order, the first whose coll, ngpus, in-place kind and [minBytes, maxBytes] (inclusive, 0 = no
    limit) match and whose nchunksperloop divides the element count. None: NCCL's own algorithm."""
    coll = canonical(collective)
    elems = size_bytes // itemsize
    for h in sorted(_headers(files), key=lambda h: h.path):
        if h.collective != coll or h.ngpus != ngpus or not (h.inplace if inplace else h.outofplace):
            continue
        if size_bytes < h.min_bytes or (h.max_bytes and size_bytes > h.max_bytes):
            continue
        if h.nchunksperloop <= 0 or elems % h.nchunksperloop:
            continue
        return h
    return None


def why_not_selected(files, collective: str, size_bytes: int, ngpus: int, itemsize: int = 4,
                     inplace: bool = False) -> str:
    """Why select_algorithm finds no file: the rule that removed the last candidates, with the
    files it removed (the runtime applies the same rules in the same order)."""
    coll = canonical(collective)
    elems = size_bytes // itemsize
    kind = "in-place" if inplace else "out-of-place"
    rules = (
        (f"no file is for {coll}", lambda h: h.collective == coll),
        (f"no {coll} file is for {ngpus} ranks", lambda h: h.ngpus == ngpus),
        (f"no {coll} file allows {kind} calls", lambda h: h.inplace if inplace else h.outofplace),
        (f"no {coll} file's minBytes..maxBytes covers {size_bytes} B",
         lambda h: h.min_bytes <= size_bytes and (not h.max_bytes or size_bytes <= h.max_bytes)),
        (f"the element count {elems} is not divisible by nchunksperloop",
         lambda h: h.nchunksperloop > 0 and elems % h.nchunksperloop == 0),
    )
    left = sorted(_headers(files), key=lambda h: h.path)
    for why, keep in rules:
        kept = [h for h in left if keep(h)]
        if not kept:
            if "divisible" in why:
                return f"{why} of " + ", ".join(f"{Path(h.path).name} ({h.nchunksperloop})" for h in left[:3])
            return why + (f" (closest: {', '.join(Path(h.path).name for h in left[:3])})" if left else "")
        left = kept
    return "a file covers it"


# ==== the executor ===============================================================================

_OPS: dict[str, Callable] = {"sum": torch.add, "prod": torch.mul, "max": torch.maximum, "min": torch.minimum}
_OP_ALIASES = {"sum": "sum", "add": "sum", "prod": "prod", "product": "prod", "mul": "prod", "max": "max",
               "min": "min"}
_FATAL_STATIC = STRUCTURAL | {"buffer-size", "nchannels", "chan", "gpu-ids"}


def op_name(op) -> str:
    """'sum' | 'prod' | 'max' | 'min' from a name or a torch.distributed.ReduceOp (MSCCL has no avg)."""
    if isinstance(op, str):
        key = op.strip().lower()
    else:
        key = {dist.ReduceOp.SUM: "sum", dist.ReduceOp.PRODUCT: "prod", dist.ReduceOp.MAX: "max",
               dist.ReduceOp.MIN: "min"}.get(op, str(op))
    if key not in _OP_ALIASES:
        raise CompileError(f"--op: {op!r} is not a reduction MSCCL runs (sum, prod, max, min)")
    return _OP_ALIASES[key]


def _reduce_op(name: str):
    return {"sum": dist.ReduceOp.SUM, "prod": dist.ReduceOp.PRODUCT, "max": dist.ReduceOp.MAX,
            "min": dist.ReduceOp.MIN}[name]


def io_chunks(p: Program) -> tuple[int, int]:
    """(input chunks, output chunks) of one rank's buffers (msccl-xml.md §4)."""
    exp = expected_chunks(p)
    if exp is not None:
        return exp
    return max((g.i_chunks for g in p.gpus), default=0), max((g.o_chunks for g in p.gpus), default=0)


def collective_elems(p: Program, size_bytes: int, itemsize: int) -> tuple[int, int]:
    """(E, input elements per rank) for nccl-tests' size S = E * itemsize, E rounded down to a
    multiple of nchunksperloop. E = 0 when S is below one element per chunk. For a custom program
    with its demand, S is one chunk of the demand (as `msccl-compile custom --size`), which the
    program holds as demand.chunks_per_rank chunks; E is then nchunksperloop such chunks."""
    N = p.nchunksperloop
    n_in, _ = io_chunks(p)
    if p.collective == "custom" and p.demand is not None:
        ce = (size_bytes // itemsize) // p.demand.chunks_per_rank
        return ce * N, ce * n_in
    E = (size_bytes // itemsize) // N * N
    return E, E // N * n_in


@dataclass(frozen=True)
class ExecPlan:
    """A program checked for execution, with the global order its steps run in: order[rank] is
    this rank's (tb position, step index) list."""
    program: Program
    inplace: bool
    order: tuple[tuple[tuple[int, int], ...], ...]
    warnings: tuple[str, ...] = ()
    senders: Any = field(default=None, compare=False, repr=False)  # (src, dst, chan) -> [(tb id, step)]
    receivers: Any = field(default=None, compare=False, repr=False)  # (src, dst, chan) -> [(tb id, step)]


def prepare(program: Program, inplace: bool = False) -> ExecPlan:
    """Checks that `program` can execute and fixes the global step order (see the module doc).
    Raises ExecutionError with the verifier's one-line finding for a structural problem (broken
    connections, FIFO counts, cnt mismatch, offsets, buffer sizes) or a program that cannot
    complete (deadlock, messages never received). Cached per (program, inplace)."""
    return _prepare(program, bool(inplace))


@lru_cache(maxsize=64)
def _prepare(p: Program, inplace: bool) -> ExecPlan:
    fatal = static_findings(p, only=_FATAL_STATIC)
    if p.collective == "custom" and any(g.i_chunks <= 0 for g in p.gpus):
        raise ExecutionError(f"{p.name}: a custom collective needs i_chunks > 0 on every rank")
    n_in, n_out = io_chunks(p)
    if n_in <= 0:
        raise ExecutionError(f"{p.name}: cannot run: the input buffer has no chunks")
    if fatal:
        more = f" (and {len(fatal) - 1} more)" if len(fatal) > 1 else ""
        raise ExecutionError(f"{p.name}: cannot run: {fatal[0].message}{more}")
    m = trace(p, inplace, slots=UNBOUNDED)  # gloo buffers: no slot limit
    findings = m.findings
    stop = [f for f in findings if f.rule in ("deadlock", "unconsumed")]
    if stop:
        more = f" (and {len(stop) - 1} more)" if len(stop) > 1 else ""
        raise ExecutionError(f"{p.name}: cannot run: {stop[0].message}{more}")
    pos = [{tb.id: k for k, tb in enumerate(g.tbs)} for g in p.gpus]
    order: list[list[tuple[int, int]]] = [[] for _ in p.gpus]
    for rank, tid, s in m.order:
        order[rank].append((pos[rank][tid], s))
    senders, receivers = {}, {}
    for key, (stb, rtb) in connections(p).items():
        senders[key] = [(stb.id, i) for i, st in enumerate(stb.steps) if st.type in SENDS]
        receivers[key] = [(rtb.id, i) for i, st in enumerate(rtb.steps) if st.type in RECVS]
    return ExecPlan(p, inplace, tuple(tuple(o) for o in order), tuple(f.message for f in findings),
                    senders, receivers)


def _sentinel(n: int, dtype: torch.dtype, device) -> torch.Tensor:
    """Memory nothing has written yet: NaN for floats, the minimum for integers."""
    if dtype.is_floating_point or dtype.is_complex:
        return torch.full((n,), float("nan"), dtype=dtype, device=device)
    if dtype == torch.bool:
        return torch.zeros((n,), dtype=dtype, device=device)
    return torch.full((n,), torch.iinfo(dtype).min, dtype=dtype, device=device)


def _tag(src: int, dst: int, chan: int, n: int) -> int:
    """One gloo tag per connection (src -> dst, channel): separate FIFOs."""
    return (src * n + dst) * 64 + chan


def _first_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    msg = text[0] if text else type(e).__name__
    msg = re.sub(r"^\[[^\]]*\]\s*", "", msg)  # drop gloo's "[file.cc:123]" prefix
    return msg.split(". This is typically")[0]


def _buffers(p: Program, rank: int, flat: torch.Tensor, ce: int, inplace: bool) -> dict[str, torch.Tensor]:
    """This rank's i, o and s buffers (chunks of `ce` elements) for a call on input `flat`. In
    place, the aliasing of compiler.model.demand.inplace_alias: the view is a slice of the base,
    which has at least its msccl-xml.md §4 size (so a view declared with 0 chunks still works)."""
    g, (n_in, n_out) = p.gpus[rank], io_chunks(p)
    dtype, device = flat.dtype, flat.device
    bufs = {"i": flat, "s": _sentinel(g.s_chunks * ce, dtype, device)}
    alias = inplace_alias(p.collective, rank, n_in, n_out) if inplace else None
    if inplace and alias is None:
        raise ExecutionError(f"{p.name}: {p.collective} has no in-place form (msccl-xml.md §10)")
    if alias is None:
        bufs["o"] = _sentinel(max(g.o_chunks, n_out) * ce, dtype, device)
        return bufs
    size = {"i": max(g.i_chunks, n_in) * ce, "o": max(g.o_chunks, n_out) * ce}
    if alias.base == "o" and (alias.offset or size["o"] != flat.numel()):
        bufs["o"] = _sentinel(size["o"], dtype, device)  # the input is a window of a larger output
        bufs["o"][alias.offset * ce:alias.offset * ce + flat.numel()].copy_(flat)
    else:
        bufs[alias.base] = flat
    start = alias.offset * ce
    bufs[alias.view] = bufs[alias.base][start:start + size[alias.view]]
    return bufs


def execute(program: Program | ExecPlan, inputs: torch.Tensor, op="sum", timeout: float = 30.0, *,
            inplace: bool = False, group=None) -> torch.Tensor:
    """Runs this rank's part of `program` inside an initialised gloo process group; call it on
    every rank. `inputs` is this rank's input buffer (i_chunks chunks; chunk = numel / i_chunks).
    Returns the output buffer (o_chunks chunks). In place (`inplace=True`) follows the MSCCL
    aliasing (msccl-xml.md §10, compiler.model.demand.inplace_alias; see `_buffers`): allgather
    copies `inputs` into the output at rank*numel; reduce-scatter writes into `inputs` and returns
    its rank's slice; the others overwrite `inputs` and return it. `timeout` bounds the whole call
    (seconds); on expiry, or when a peer fails, raises ExecutionError naming the rank, tb, step and
    the message it waits for."""
    plan = program if isinstance(program, ExecPlan) else prepare(program, inplace)
    p = plan.program
    if not dist.is_available() or not dist.is_initialized():
        raise ExecutionError("execute: no process group: call torch.distributed.init_process_group first "
                             "(or use run_local)")
    backend = dist.get_backend(group)
    if backend != "gloo":
        raise ExecutionError(f"execute: interprets programs over gloo (CPU); with backend {backend!r} the MSCCL "
                             f"runtime executes them (load it with msccl_environment before init_process_group)")
    n, rank = dist.get_world_size(group), dist.get_rank(group)
    if n != p.ngpus:
        raise ExecutionError(f"{p.name}: the program is for ngpus={p.ngpus}, the process group has {n} ranks")
    opf = _OPS[op_name(op)]
    g = p.gpus[rank]
    n_in, n_out = io_chunks(p)
    numel = inputs.numel()
    if numel == 0 or numel % n_in:
        raise ExecutionError(f"{p.name}: rank {rank}: an input of {numel} elements does not divide into "
                             f"{n_in} chunks")
    ce = numel // n_in
    dtype, device = inputs.dtype, inputs.device
    if inplace and not inputs.is_contiguous():
        raise ExecutionError("execute: an in-place call needs a contiguous input")
    flat = inputs.reshape(-1) if inputs.is_contiguous() else inputs.contiguous().reshape(-1)
    bufs = _buffers(p, rank, flat, ce, inplace)

    def view(buf: str, off: int, cnt: int) -> torch.Tensor:
        return bufs[buf][off * ce:(off + cnt) * ce]

    def peer(r: int) -> int:
        return r if group is None or group is dist.GroupMember.WORLD else dist.get_global_rank(group, r)

    deadline = time.monotonic() + timeout

    def wait(work, where: str, what: str) -> None:
        left = deadline - time.monotonic()
        try:
            if left <= 0:
                raise TimeoutError("Timed out")
            work.wait(timeout=datetime.timedelta(seconds=left))
        except (RuntimeError, TimeoutError) as e:
            reason = (f"not done within the {timeout:g} s timeout" if "imed out" in str(e)
                      else f"failed: {_first_line(e)}")
            raise ExecutionError(f"{p.name}: rank {rank} {where}: {what}: {reason}") from None

    tbs = g.tbs
    recvq: dict[int, deque] = {}
    for tb in tbs:
        if tb.recv < 0:
            continue
        q = recvq[tb.id] = deque()
        key = (tb.recv, rank, tb.chan)
        for k, (tid, s) in enumerate(plan.receivers.get(key, ())):
            st = tb.steps[s]
            buf = torch.empty(st.cnt * ce, dtype=dtype, device=device)
            q.append((s, k, buf, dist.irecv(buf, src=peer(tb.recv), group=group, tag=_tag(tb.recv, rank, tb.chan, n))))
    sends = []
    sent_count: dict[int, int] = {}
    published = [-1] * len(tbs)
    ids = {tb.id: k for k, tb in enumerate(tbs)}
    for t, s in plan.order[rank]:
        tb = tbs[t]
        st = tb.steps[s]
        typ = st.type
        where = f"tb {tb.id} step {s} ({typ})"
        if st.depid >= 0 and published[ids[st.depid]] < st.deps:
            raise ExecutionError(f"{p.name}: rank {rank} {where}: internal error: runs before tb {st.depid} "
                                 f"published step {st.deps}")
        x = y = None
        if typ in RECVS:
            s2, k, x, work = recvq[tb.id].popleft()
            key = (tb.recv, rank, tb.chan)
            stid, sstep = plan.senders[key][k]
            wait(work, where, f"waits for message {k} from rank {tb.recv} on channel {tb.chan} "
                              f"(sent by rank {tb.recv} tb {stid} step {sstep})")
        if typ == "nop":
            pass
        elif typ == "cpy":
            src = view(st.srcbuf, st.srcoff, st.cnt)
            view(st.dstbuf, st.dstoff, st.cnt).copy_(src.clone() if st.srcbuf == st.dstbuf or inplace else src)
        elif typ == "re":
            d = view(st.dstbuf, st.dstoff, st.cnt)
            d.copy_(opf(d, view(st.srcbuf, st.srcoff, st.cnt)))
        elif typ == "s":
            y = view(st.srcbuf, st.srcoff, st.cnt).clone()
        elif typ == "r":
            view(st.dstbuf, st.dstoff, st.cnt).copy_(x)
        elif typ == "rcs":
            view(st.dstbuf, st.dstoff, st.cnt).copy_(x)
            y = x
        else:  # rrs, rrc, rrcs: the local operand is at src
            y = opf(x, view(st.srcbuf, st.srcoff, st.cnt))
            if typ != "rrs":
                view(st.dstbuf, st.dstoff, st.cnt).copy_(y)
        if typ in SENDS:
            k = sent_count.get(tb.id, 0)
            sent_count[tb.id] = k + 1
            work = dist.isend(y.contiguous(), dst=peer(tb.send), group=group, tag=_tag(rank, tb.send, tb.chan, n))
            sends.append((work, y, where, tb, k))
        if st.hasdep and typ != "nop":
            published[t] = s
    for work, _y, where, tb, k in sends:
        key = (rank, tb.send, tb.chan)
        rtid, rstep = plan.receivers[key][k]
        wait(work, where, f"message {k} to rank {tb.send} on channel {tb.chan} (received by rank {tb.send} tb "
                          f"{rtid} step {rstep})")
    return bufs["o"][:n_out * ce]


# ==== local runs =================================================================================

@dataclass(frozen=True)
class RunResult:
    correct: bool
    wrong: int  # elements that differ from torch's collective, over the ranks compared
    first_wrong: tuple[int, int] | None  # (rank, element offset in the output) of the first one
    time_s: float  # median over iterations of the slowest rank's executor wall time
    nprocs: int
    size_bytes: int  # nccl-tests' size actually run (after rounding); custom: one chunk of the demand
    collective: str
    name: str = ""
    dtype: str = "float32"
    op: str = "sum"
    inplace: bool = False
    root: int | None = None
    iters: int = 1
    times_s: tuple[float, ...] = ()
    notes: tuple[str, ...] = ()

    def to_dict(self) -> dict:
        d = dict(self.__dict__)
        d["first_wrong"] = list(self.first_wrong) if self.first_wrong else None
        d["times_s"] = list(self.times_s)
        d["notes"] = list(self.notes)
        return d

    def summary(self) -> str:
        if self.correct:
            verdict = "correct"
        else:
            r, off = self.first_wrong
            verdict = f"WRONG: {self.wrong} elements differ; first at rank {r} output element {off}"
        per = " per chunk" if self.collective == "custom" else ""
        return (f"{self.name or self.collective}: {self.nprocs} ranks, {self.size_bytes} B{per} {self.dtype}"
                f"{' in place' if self.inplace else ''}: {verdict}; {self.time_s * 1e6:.1f} us")


def make_input(rank: int, numel: int, dtype: torch.dtype = torch.float32, seed: int = 0, op: str = "sum",
               device="cpu") -> torch.Tensor:
    """Seeded random integers (exact in floating point): -8..8, or 1..3 for prod."""
    gen = torch.Generator().manual_seed(seed * 1_000_003 + rank)
    lo, hi = (1, 4) if op == "prod" else (-8, 9)
    return torch.randint(lo, hi, (numel,), generator=gen, dtype=torch.int64).to(dtype).to(device)


def _collective_fn(name: str):
    """torch.distributed's collective, preferring the names newer releases use."""
    new = {"all_gather_into_tensor": "all_gather_single", "reduce_scatter_tensor": "reduce_scatter_single"}
    fn = getattr(dist, new.get(name, name), None) or getattr(dist, name)
    return fn


def torch_collective(coll: str, inp: torch.Tensor, E: int, rank: int, n: int, root: int | None, op: str,
                     group=None) -> torch.Tensor:
    """The same collective through torch.distributed (the reference, and bench's default side).
    Returns this rank's output (for reduce/gather meaningful on the root only)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        if coll == "allgather":
            out = torch.empty(E, dtype=inp.dtype, device=inp.device)
            _collective_fn("all_gather_into_tensor")(out, inp, group=group)
        elif coll == "alltoall":
            out = torch.empty(E, dtype=inp.dtype, device=inp.device)
            dist.all_to_all_single(out, inp, group=group)
        elif coll == "reduce_scatter":
            out = torch.empty(E // n, dtype=inp.dtype, device=inp.device)
            _collective_fn("reduce_scatter_tensor")(out, inp, op=_reduce_op(op), group=group)
        elif coll == "allreduce":
            out = inp.clone()
            dist.all_reduce(out, op=_reduce_op(op), group=group)
        elif coll == "broadcast":
            out = inp.clone()
            dist.broadcast(out, src=root, group=group)
        elif coll == "reduce":
            out = inp.clone()
            dist.reduce(out, dst=root, op=_reduce_op(op), group=group)
        elif coll == "scatter":
            out = torch.empty(E // n, dtype=inp.dtype, device=inp.device)
            dist.scatter(out, list(inp.chunk(n)) if rank == root else None, src=root, group=group)
        elif coll == "gather":
            parts = [torch.empty_like(inp) for _ in range(n)] if rank == root else None
            dist.gather(inp, parts, dst=root, group=group)
            out = torch.cat(parts) if rank == root else inp.new_empty(0)
        else:
            raise ExecutionError(f"collective {coll!r} has no torch.distributed counterpart to compare with")
    return out


def compared_ranks(coll: str, n: int, root: int | None) -> list[int]:
    """Ranks whose output the collective defines."""
    return [root] if coll in ("reduce", "gather") else list(range(n))


def _child(rank: int, nprocs: int, port: int, worker: Callable, payload, timeout: float, q,
           backend: str = "gloo") -> None:
    """Entry of a local process: join the group, run worker(rank, nprocs, payload, emit), report."""
    code = 0
    try:
        torch.set_num_threads(1)
        warnings.simplefilter("ignore", FutureWarning)
        store = dist.TCPStore("127.0.0.1", port, is_master=False, timeout=datetime.timedelta(seconds=max(timeout, 30)))
        if backend == "nccl":
            torch.cuda.set_device(rank % torch.cuda.device_count())
        dist.init_process_group(backend, store=store, rank=rank, world_size=nprocs,
                                timeout=datetime.timedelta(seconds=timeout))

        def emit(kind: str, data=None) -> None:
            q.put((kind, rank, data))

        result = worker(rank, nprocs, payload, emit)
        q.put(("done", rank, result))
    except BaseException as e:  # noqa: BLE001 - everything goes back to the parent as one line
        msg = str(e) if isinstance(e, CompileError) else f"{type(e).__name__}: {_first_line(e)}"
        q.put(("error", rank, msg))
        code = 1
    finally:
        try:
            q.close()
            q.join_thread()
        finally:
            os._exit(code)  # gloo may hold unmatched work after a failure: never wait in teardown


def launch_local(worker: Callable, nprocs: int, payload=None, timeout: float = 60.0,
                 start_method: str = "forkserver", env: dict[str, str | None] | None = None,
                 backend: str = "gloo") -> list:
    """Runs worker(rank, nprocs, payload, emit) in `nprocs` local processes joined in a gloo group
    (127.0.0.1; the rendezvous store lives in this process, so no free-port race). `worker` must be
    a module-level function; `emit(kind, data)` sends progress back ("progress" restarts the
    watchdog). Returns the workers' results by rank. Raises ExecutionError with the first rank's
    error, or when a rank stops reporting for `timeout` seconds (its processes are killed).
    `env`: variables for the children, None to unset one (implies start_method "spawn", which
    starts fresh interpreters that see it). `backend` "nccl" puts rank r on GPU r % device_count."""
    import torch.multiprocessing as mp

    if nprocs < 1:
        raise CompileError(f"--nprocs: {nprocs} must be >= 1")
    if env or backend != "gloo":
        start_method = "spawn"
    ctx = mp.get_context(start_method)
    if start_method == "forkserver":
        ctx.set_forkserver_preload(["backends.torch_dist"])
    store = dist.TCPStore("127.0.0.1", 0, None, True, datetime.timedelta(seconds=max(timeout, 30)),
                          wait_for_workers=False)
    q = ctx.Queue()
    procs = []
    with patched_environ(env or {}):  # spawned children read the environment at start
        for r in range(nprocs):
            proc = ctx.Process(target=_child, args=(r, nprocs, store.port, worker, payload, timeout, q, backend),
                               daemon=True)
            proc.start()
            procs.append(proc)
    results: dict[int, Any] = {}
    errors: dict[int, str] = {}
    startup = 60.0
    last = time.monotonic()
    limit = startup + timeout
    dead_since: dict[int, float] = {}
    try:
        while len(results) + len(errors) < nprocs:
            try:
                kind, rank, data = q.get(timeout=0.1)
            except queue_mod.Empty:
                now = time.monotonic()
                for r, proc in enumerate(procs):
                    if r in results or r in errors or proc.exitcode is None:
                        continue
                    dead_since.setdefault(r, now)
                    if now - dead_since[r] > 2.0:
                        errors[r] = f"rank {r} exited with status {proc.exitcode} without a result"
                if now - last > limit:
                    missing = [r for r in range(nprocs) if r not in results and r not in errors]
                    raise ExecutionError(f"local run: ranks {missing} reported nothing for {limit:.0f} s; "
                                         f"processes killed")
                continue
            last = time.monotonic()
            limit = timeout + 10.0
            if kind == "done":
                results[rank] = data
            elif kind == "error":
                errors[rank] = data
    except BaseException:  # Ctrl-C, SIGTERM, a timeout: the children go at once, not after a join
        for proc in procs:
            if proc.is_alive():
                proc.kill()
        raise
    finally:
        for proc in procs:
            proc.join(timeout=2.0)
        for proc in procs:
            if proc.is_alive():
                proc.kill()
                proc.join(timeout=2.0)
        q.close()
    if errors:
        first = _best_error(errors)
        more = f" (and {len(errors) - 1} more ranks failed)" if len(errors) > 1 else ""
        raise ExecutionError(first + more)
    return [results[r] for r in range(nprocs)]


def _best_error(errors: dict[int, str]) -> str:
    """The most informative error: one that is not a consequence of another rank's failure."""
    def rank_of(item):
        r, msg = item
        secondary = ("timeout" in msg or "Connection closed" in msg or "closure" in msg or "exited" in msg)
        return (secondary, r)
    return sorted(errors.items(), key=rank_of)[0][1]


def _load(xml_or_program) -> Program:
    if isinstance(xml_or_program, Program):
        return xml_or_program
    from backends.msccl_xml import read_xml
    return read_xml(xml_or_program)


def _standard_judge(j: dict, rank: int, n: int):
    """(this rank's input, judge(output) -> (wrong, first offset)) against torch's own collective."""
    p: Program = j["program"]
    inp = make_input(rank, j["in_elems"], j["dtype"], j["seed"], j["op"])
    ref = torch_collective(p.collective, inp, j["E"], rank, n, j["root"], j["op"])

    def judge(got: torch.Tensor) -> tuple[int, int | None]:
        if rank not in compared_ranks(p.collective, n, j["root"]):
            return 0, None
        bad = (got != ref) if got.shape == ref.shape else torch.ones(ref.numel(), dtype=torch.bool)
        wrong = int(bad.sum())
        return wrong, int(bad.nonzero()[0, 0]) if wrong else None
    return inp, judge


def _custom_judge(j: dict, rank: int, n: int):
    """(this rank's input, judge) against what the program's demand prescribes."""
    from backends.demand_reference import custom_input, custom_wrong
    p: Program = j["program"]
    n_in, _ = io_chunks(p)
    ce = j["in_elems"] // n_in
    inputs: dict[int, torch.Tensor] = {}

    def input_of(r: int) -> torch.Tensor:
        if r not in inputs:
            inputs[r] = custom_input(r, n_in, ce, j["dtype"], j["seed"], j["op"], j["distinct"])
        return inputs[r]
    return input_of(rank), lambda got: custom_wrong(p.demand, rank, got, input_of, _OPS[j["op"]], ce)


def _run_jobs_worker(rank: int, n: int, jobs: list[dict], emit) -> list[dict]:
    """Per job: the reference (torch's collective, or a custom program's demand), then the program
    through execute()."""
    out = []
    for j in jobs:
        emit("progress", j["index"])
        p: Program = j["program"]
        inp, judge = (_custom_judge if p.collective == "custom" else _standard_judge)(j, rank, n)
        plan = prepare(p, j["inplace"])
        times, wrong, first = [], 0, None
        for it in range(j["iters"]):
            x = inp.clone()
            dist.barrier()
            t0 = time.perf_counter()
            got = execute(plan, x, j["op"], j["timeout"], inplace=j["inplace"])
            times.append(time.perf_counter() - t0)
            if it == 0:
                wrong, first = judge(got)
        out.append({"wrong": wrong, "first": first, "times": times})
    return out


def run_local(xml_or_program, nprocs: int, size_bytes: int, dtype: torch.dtype = torch.float32, seed: int = 0,
              inplace: bool = False, timeout: float = 30.0, *, op="sum", iters: int = 3) -> RunResult:
    """Spawns `nprocs` local gloo processes, runs the program (a Program, an XML path or XML text)
    on seeded random data of nccl-tests' size `size_bytes` (rounded down to whole chunks; noted),
    compares every defined output with torch's own collective, and times the executor. A custom
    program is run on `size_bytes` per chunk of its demand, with inputs distinct per (rank, chunk),
    and compared with what its demand prescribes (backends/demand_reference.py). Raises
    CompileError for user errors (nprocs != ngpus, a custom file without its demand, a size below
    one element per chunk) and ExecutionError for a program that cannot run or a run that fails or
    times out."""
    return run_local_many([xml_or_program], nprocs, size_bytes, dtype, seed, inplace, timeout, op=op,
                          iters=iters)[0]


def run_local_many(programs: Iterable, nprocs: int, size_bytes: int, dtype: torch.dtype = torch.float32,
                   seed: int = 0, inplace: bool = False, timeout: float = 30.0, *, op="sum",
                   iters: int = 3) -> list[RunResult]:
    """run_local for several programs in one set of processes (one start-up). Stops at the first
    failure (ExecutionError naming the program)."""
    opn = op_name(op)
    if iters < 1:
        raise CompileError(f"--iters: {iters} must be >= 1")
    if timeout <= 0:
        raise CompileError(f"--timeout: {timeout} must be positive")
    itemsize = torch.empty((), dtype=dtype).element_size()
    jobs, metas = [], []
    for k, src in enumerate(programs):
        p = _load(src)
        label = p.name if isinstance(src, (Program, bytes)) or str(src).lstrip().startswith("<") else str(src)
        notes = list(p.notes)
        custom = p.collective == "custom"
        if custom and p.demand is None:
            raise CompileError(f"{label}: coll=custom, but the file carries no demand (the <!-- msccl-compile "
                               f"demand --> comment msccl-compile custom writes): nothing says what is right")
        if not custom and p.collective not in ("allgather", "alltoall", "reduce_scatter", "allreduce",
                                               "broadcast", "reduce", "scatter", "gather"):
            raise CompileError(f"{p.name}: collective {p.collective!r} has no torch.distributed counterpart "
                               f"to compare with")
        if nprocs != p.ngpus:
            raise CompileError(f"--nprocs: {nprocs} processes, but {p.name} is for ngpus={p.ngpus}")
        E, in_elems = collective_elems(p, size_bytes, itemsize)
        per = p.demand.chunks_per_rank if custom else p.nchunksperloop  # program chunks in size_bytes
        per_text = f"{'pieces per demand chunk' if custom else 'nchunksperloop'}={per}"
        if E == 0:
            raise CompileError(f"--size: {size_bytes} B is below one {dtype_name(dtype)} per chunk: {p.name} needs "
                               f"at least {per * itemsize} B ({per_text})")
        run_bytes = E // p.nchunksperloop * per * itemsize
        if run_bytes != size_bytes:
            notes.append(f"size rounded down from {size_bytes} B to {run_bytes} B (a multiple of {per_text} "
                         f"elements of {itemsize} B)")
        if inplace and inplace_alias(p.collective, 0, 1, 1) is None:
            raise CompileError(f"{label}: coll={p.collective}: has no in-place form (--inplace)")
        if not inplace and not p.outofplace:
            raise CompileError(f"{label}: outofplace=0: the file is for in-place calls only; run it with --inplace")
        if inplace and not p.inplace:
            notes.append(f"{p.name} is not marked inplace=1: running it in place anyway")
        root = root_candidates(p)[0] if p.collective in ("broadcast", "reduce", "scatter", "gather") else None
        prepare(p, inplace)  # refuse a program that cannot run before starting processes
        distinct = False
        if custom:
            from backends.demand_reference import distinct_values
            distinct = distinct_values(p.demand, io_chunks(p)[0], dtype, opn)
            if not distinct:
                notes.append(f"inputs are seeded integers without an offset per (rank, chunk): {opn} in "
                             f"{dtype_name(dtype)} would not stay exact")
        jobs.append({"index": k, "program": p, "dtype": dtype, "E": E, "in_elems": in_elems, "op": opn,
                     "root": root, "seed": seed, "inplace": inplace, "iters": iters, "timeout": timeout,
                     "distinct": distinct})
        metas.append((p, run_bytes, root, notes))
    if not jobs:
        return []
    per_rank = launch_local(_run_jobs_worker, nprocs, jobs, timeout=timeout * (iters + 2))
    out = []
    for k, (p, run_bytes, root, notes) in enumerate(metas):
        rows = [per_rank[r][k] for r in range(nprocs)]
        wrong = sum(r["wrong"] for r in rows)
        first = next(((r, rows[r]["first"]) for r in range(nprocs) if rows[r]["first"] is not None), None)
        per_iter = [max(rows[r]["times"][i] for r in range(nprocs)) for i in range(iters)]
        out.append(RunResult(correct=wrong == 0, wrong=wrong, first_wrong=first,
                             time_s=float(statistics.median(per_iter)),
                             nprocs=nprocs, size_bytes=run_bytes, collective=p.collective, name=p.name,
                             dtype=dtype_name(dtype), op=opn, inplace=inplace, root=root, iters=iters,
                             times_s=tuple(per_iter), notes=tuple(notes)))
    return out


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).replace("torch.", "")


_DTYPES = {"float32": torch.float32, "float": torch.float32, "float64": torch.float64, "double": torch.float64,
           "float16": torch.float16, "half": torch.float16, "bfloat16": torch.bfloat16, "int32": torch.int32,
           "int": torch.int32, "int64": torch.int64, "int8": torch.int8, "uint8": torch.uint8}


def parse_dtype(name: str | torch.dtype) -> torch.dtype:
    """'float32', 'half', 'bfloat16', 'int32', ... -> torch.dtype."""
    if isinstance(name, torch.dtype):
        return name
    key = str(name).strip().lower().replace("torch.", "")
    if key not in _DTYPES:
        raise CompileError(f"--dtype: {name!r} is not a data type (known: {', '.join(sorted(set(_DTYPES)))})")
    return _DTYPES[key]
