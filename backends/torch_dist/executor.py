"""An executor of Programs over torch.distributed (gloo): an interpreter client.

`execute` is one call per rank inside a gloo process group. What each step does is written once,
in compiler/program/semantics.py (`Interpreter.step`); this module gives it tensors: a window of
chunks is a slice of this rank's buffers, a reduction is the call's op, and cnt > 1 moves cnt
contiguous chunks as one message. Connections are separate FIFOs (one gloo tag per (src, dst,
channel)); the k-th send on a connection pairs with the k-th receive of the peer's tb.

Scheduling. gloo's point-to-point Work objects cannot be polled (is_completed() stays false until
wait(); they have no future; and a wait that times out closes the connection pairs), so the tbs
of a rank cannot be multiplexed by polling. Instead `prepare` runs the program once through the
verifier's machine (compiler.program.interpret.trace with unbounded connection slots), which
yields one global order of all steps consistent with program order, dependencies and message
order. Every rank runs its own steps in that order in one thread: receives are posted up front
(irecv, in FIFO order per connection), sends are posted as isend without waiting, and a receive
is waited for only when the global order has already placed its matching send, so a blocking
wait never waits on this rank's own later work. A program that cannot complete (a missing
receive, a dependency cycle) is refused by `prepare` with the verifier's message before anything
is sent. Every wait is bounded by `timeout` (for the whole call); on expiry the error names the
rank, tb, step and the message it waits for.

The executor has no connection-slot limit (gloo buffers): a program that deadlocks only under the
runtime's bounded slots (msccl-xml.md §7.5) runs here; `compiler.program.verify` checks that.

GPU path (not exercised on CPU; this is what changes on CUDA):

* backend `nccl`, one process per GPU (`torchrun --nproc_per_node=N`), `torch.cuda.set_device
  (LOCAL_RANK)`. This executor is not used: the MSCCL runtime executes the XML inside NCCL, and the
  ordinary torch call (the collective spec's `torch_call`) is what runs the algorithm.
* MSCCL is loaded through the environment: `msccl_env(...)` / `msccl_environment(...)` (env.py)
  before `init_process_group` (and before any collective). PyTorch wheels load libnccl.so.2 from
  the nvidia-nccl package; force the MSCCL build with
  `LD_PRELOAD=<msccl-executor-nccl>/build/lib/libnccl.so.2` in the launch command (setting it
  inside Python is too late). Check `torch.cuda.nccl.version()` == (2, 23, 4) for
  msccl-executor-nccl, and `NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,ENV` for the proof lines
  ("MSCCL: Setup Kernel finished" on every launch; `backends.bench.check_runtime` reads them).
* ROCm: preload an MSCCL-enabled librccl.so and select RCCL's dialect (RCCL_MSCCL_FORCE_ENABLE=1
  is needed for custom files). RCCL from ROCm 7.13 on has removed MSCCL.
* `all_to_all_single` on CUDA has used grouped send/recv, not ncclAllToAll: alltoall files may
  never be selected unless PyTorch is patched (msccl-xml.md §12.3).
"""

from __future__ import annotations

import datetime
import re
import time
from collections import deque
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any, Callable

import torch
import torch.distributed as dist

from compiler.model.program import Program
from compiler.program.interpret import UNBOUNDED, trace
from compiler.program.rules import STRUCTURAL, static_findings
from compiler.program.semantics import KINDS, Interpreter, io_chunks, layout, messages, publishes, waits
from compiler.specs.collectives import CUSTOM
from compiler.specs.errors import CompileError

from .errors import ExecutionError

OPS: dict[str, Callable] = {"sum": torch.add, "prod": torch.mul, "max": torch.maximum, "min": torch.minimum}
_OP_ALIASES = {"sum": "sum", "add": "sum", "prod": "prod", "product": "prod", "mul": "prod", "max": "max",
               "min": "min"}
FATAL = STRUCTURAL | {"buffer-size", "nchannels", "chan", "gpu-ids"}  # findings that stop a run
STOPS = ("deadlock", "unconsumed")  # what the unbounded run must not find


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


def reduce_op(name: str):
    """torch.distributed's ReduceOp for an op_name."""
    return {"sum": dist.ReduceOp.SUM, "prod": dist.ReduceOp.PRODUCT, "max": dist.ReduceOp.MAX,
            "min": dist.ReduceOp.MIN}[name]


def collective_elems(p: Program, size_bytes: int, itemsize: int) -> tuple[int, int]:
    """(E, input elements per rank) for nccl-tests' size S = E * itemsize, E rounded down to a
    multiple of nchunksperloop. E = 0 when S is below one element per chunk. For a custom program
    with its demand, S is one chunk of the demand (as `msccl-compile custom --size`), which the
    program holds as demand.chunks_per_rank chunks; E is then nchunksperloop such chunks."""
    N = p.nchunksperloop
    n_in, _ = io_chunks(p)
    if p.collective == CUSTOM and p.demand is not None:
        ce = (size_bytes // itemsize) // p.demand.chunks_per_rank
        return ce * N, ce * n_in
    E = (size_bytes // itemsize) // N * N
    return E, E // N * n_in


# ---- the plan: checked once, with the global step order ------------------------------------------

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


def _refuse(p: Program, found: list) -> None:
    if found:
        more = f" (and {len(found) - 1} more)" if len(found) > 1 else ""
        raise ExecutionError(f"{p.name}: cannot run: {found[0].message}{more}")


@lru_cache(maxsize=64)
def _prepare(p: Program, inplace: bool) -> ExecPlan:
    fatal = static_findings(p, only=FATAL)
    if p.collective == CUSTOM and any(g.i_chunks <= 0 for g in p.gpus):
        raise ExecutionError(f"{p.name}: a custom collective needs i_chunks > 0 on every rank")
    if io_chunks(p)[0] <= 0:
        raise ExecutionError(f"{p.name}: cannot run: the input buffer has no chunks")
    _refuse(p, fatal)
    run = trace(p, inplace, slots=UNBOUNDED)  # gloo buffers: no slot limit
    _refuse(p, [f for f in run.findings if f.rule in STOPS])
    pos = [{tb.id: k for k, tb in enumerate(g.tbs)} for g in p.gpus]
    order: list[list[tuple[int, int]]] = [[] for _ in p.gpus]
    for rank, tid, s in run.order:
        order[rank].append((pos[rank][tid], s))
    msgs = messages(p)
    senders = {m.key: [(m.sender.id, i) for i, _ in m.sends] for m in msgs}
    receivers = {m.key: [(m.receiver.id, i) for i, _ in m.receives] for m in msgs}
    return ExecPlan(p, inplace, tuple(tuple(o) for o in order), tuple(f.message for f in run.findings),
                    senders, receivers)


# ---- one rank's buffers --------------------------------------------------------------------------

def _sentinel(n: int, dtype: torch.dtype, device) -> torch.Tensor:
    """Memory nothing has written yet: NaN for floats, the minimum for integers."""
    if dtype.is_floating_point or dtype.is_complex:
        return torch.full((n,), float("nan"), dtype=dtype, device=device)
    if dtype == torch.bool:
        return torch.zeros((n,), dtype=dtype, device=device)
    return torch.full((n,), torch.iinfo(dtype).min, dtype=dtype, device=device)


def _buffers(p: Program, rank: int, flat: torch.Tensor, ce: int, inplace: bool) -> dict[str, torch.Tensor]:
    """This rank's i, o and s buffers (chunks of `ce` elements) for a call on input `flat`, laid
    out as compiler.program.semantics.layout says: in place the view is a slice of the base."""
    g, (_, n_out) = p.gpus[rank], io_chunks(p)
    dtype, device = flat.dtype, flat.device
    lay = layout(p, rank, inplace)
    alias = lay.alias
    if inplace and alias is None:
        raise ExecutionError(f"{p.name}: {p.collective} has no in-place form (msccl-xml.md §10)")
    bufs = {"i": flat, "s": _sentinel(g.s_chunks * ce, dtype, device)}
    if alias is None:
        bufs["o"] = _sentinel(max(g.o_chunks, n_out) * ce, dtype, device)
        return bufs
    size = {b: lay.chunks[b] * ce for b in "io"}
    if alias.base == "o" and (alias.offset or size["o"] != flat.numel()):
        bufs["o"] = _sentinel(size["o"], dtype, device)  # the input is a window of a larger output
        bufs["o"][alias.offset * ce:alias.offset * ce + flat.numel()].copy_(flat)
    else:
        bufs[alias.base] = flat
    start = alias.offset * ce
    bufs[alias.view] = bufs[alias.base][start:start + size[alias.view]]
    return bufs


def _tag(src: int, dst: int, chan: int, n: int) -> int:
    """One gloo tag per connection (src -> dst, channel): separate FIFOs."""
    return (src * n + dst) * 64 + chan


def first_line(e: BaseException) -> str:
    """An exception's message in one line, without gloo's source-location prefix."""
    text = str(e).strip().splitlines()
    msg = text[0] if text else type(e).__name__
    msg = re.sub(r"^\[[^\]]*\]\s*", "", msg)  # drop gloo's "[file.cc:123]" prefix
    return msg.split(". This is typically")[0]


def _shares(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr()


# ---- the run -------------------------------------------------------------------------------------

def execute(program: Program | ExecPlan, inputs: torch.Tensor, op="sum", timeout: float = 30.0, *,
            inplace: bool = False, group=None) -> torch.Tensor:
    """Runs this rank's part of `program` inside an initialised gloo process group; call it on
    every rank. `inputs` is this rank's input buffer (i_chunks chunks; chunk = numel / i_chunks).
    Returns the output buffer (o_chunks chunks). In place (`inplace=True`) follows the MSCCL
    aliasing (msccl-xml.md §10, compiler.program.semantics.layout): allgather copies `inputs`
    into the output at rank*numel; reduce-scatter writes into `inputs` and returns its rank's
    slice; the others overwrite `inputs` and return it. `timeout` bounds the whole call
    (seconds); on expiry, or when a peer fails, raises ExecutionError naming the rank, tb, step
    and the message it waits for."""
    plan = program if isinstance(program, ExecPlan) else prepare(program, inplace)
    p = plan.program
    if not dist.is_available() or not dist.is_initialized():
        raise ExecutionError("execute: no process group: call torch.distributed.init_process_group first "
                             "(or use run_local)")
    backend = dist.get_backend(group)
    if backend != "gloo":
        raise ExecutionError(f"execute: interprets programs over gloo (CPU); with backend {backend!r} the MSCCL "
                             f"runtime executes them (load it with msccl_environment before init_process_group)")
    n = dist.get_world_size(group)
    if n != p.ngpus:
        raise ExecutionError(f"{p.name}: the program is for ngpus={p.ngpus}, the process group has {n} ranks")
    return _RankRun(plan, inputs, OPS[op_name(op)], timeout, inplace, group).run()


class _RankRun(Interpreter):
    """One rank's part of one call: the Interpreter's hooks over this rank's tensors, and the
    messages of its thread blocks over gloo."""

    def __init__(self, plan: ExecPlan, inputs: torch.Tensor, opf: Callable, timeout: float, inplace: bool, group):
        p = self.p = plan.program
        self.plan, self.opf, self.timeout, self.group = plan, opf, timeout, group
        self.n, self.rank = dist.get_world_size(group), dist.get_rank(group)
        n_in, self.n_out = io_chunks(p)
        numel = inputs.numel()
        if numel == 0 or numel % n_in:
            raise ExecutionError(f"{p.name}: rank {self.rank}: an input of {numel} elements does not divide into "
                                 f"{n_in} chunks")
        self.ce = numel // n_in
        if inplace and not inputs.is_contiguous():
            raise ExecutionError("execute: an in-place call needs a contiguous input")
        flat = inputs.reshape(-1) if inputs.is_contiguous() else inputs.contiguous().reshape(-1)
        self.bufs = _buffers(p, self.rank, flat, self.ce, inplace)
        self.deadline = time.monotonic() + timeout

    # ---- the Interpreter's hooks: a window is a slice of a buffer ----

    def read(self, buf: str, off: int, cnt: int) -> torch.Tensor:
        return self.bufs[buf][off * self.ce:(off + cnt) * self.ce]

    def write(self, buf: str, off: int, cnt: int, value: torch.Tensor) -> None:
        dst = self.read(buf, off, cnt)
        dst.copy_(value.clone() if _shares(value, dst) else value)  # a window of the same memory: read first

    def reduce(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return self.opf(a, b)

    # ---- messages ----

    def peer(self, r: int) -> int:
        group = self.group
        return r if group is None or group is dist.GroupMember.WORLD else dist.get_global_rank(group, r)

    def wait(self, work, where: str, what: str) -> None:
        left = self.deadline - time.monotonic()
        try:
            if left <= 0:
                raise TimeoutError("Timed out")
            work.wait(timeout=datetime.timedelta(seconds=left))
        except (RuntimeError, TimeoutError) as e:
            reason = (f"not done within the {self.timeout:g} s timeout" if "imed out" in str(e)
                      else f"failed: {first_line(e)}")
            raise ExecutionError(f"{self.p.name}: rank {self.rank} {where}: {what}: {reason}") from None

    def post_receives(self) -> dict[int, deque]:
        """Every receive of this rank, posted up front in FIFO order per connection."""
        recvq: dict[int, deque] = {}
        dtype, device = self.bufs["i"].dtype, self.bufs["i"].device
        for tb in self.p.gpus[self.rank].tbs:
            if tb.recv < 0:
                continue
            q = recvq[tb.id] = deque()
            for k, (tid, s) in enumerate(self.plan.receivers.get((tb.recv, self.rank, tb.chan), ())):
                buf = torch.empty(tb.steps[s].cnt * self.ce, dtype=dtype, device=device)
                q.append((s, k, buf, dist.irecv(buf, src=self.peer(tb.recv), group=self.group,
                                                tag=_tag(tb.recv, self.rank, tb.chan, self.n))))
        return recvq

    def run(self) -> torch.Tensor:
        """This rank's steps in the plan's global order; then every send is waited for."""
        p, rank, plan = self.p, self.rank, self.plan
        tbs = p.gpus[rank].tbs
        recvq = self.post_receives()
        sends, sent_count, published = [], {}, [-1] * len(tbs)
        ids = {tb.id: k for k, tb in enumerate(tbs)}
        for t, s in plan.order[rank]:
            tb = tbs[t]
            st = tb.steps[s]
            where = f"tb {tb.id} step {s} ({st.type})"
            if waits(st) and published[ids[st.depid]] < st.deps:
                raise ExecutionError(f"{p.name}: rank {rank} {where}: internal error: runs before tb {st.depid} "
                                     f"published step {st.deps}")
            kind, x = KINDS[st.type], None
            if kind.receives:
                _s, k, x, work = recvq[tb.id].popleft()
                stid, sstep = plan.senders[(tb.recv, rank, tb.chan)][k]
                self.wait(work, where, f"waits for message {k} from rank {tb.recv} on channel {tb.chan} "
                                       f"(sent by rank {tb.recv} tb {stid} step {sstep})")
            y = self.step(st, x)
            if kind.sends:
                y = y.clone() if any(_shares(y, b) for b in self.bufs.values()) else y  # sent later: a snapshot
                k = sent_count.get(tb.id, 0)
                sent_count[tb.id] = k + 1
                work = dist.isend(y.contiguous(), dst=self.peer(tb.send), group=self.group,
                                  tag=_tag(rank, tb.send, tb.chan, self.n))
                sends.append((work, y, where, tb, k))
            if publishes(st):
                published[t] = s
        for work, _y, where, tb, k in sends:
            rtid, rstep = plan.receivers[(rank, tb.send, tb.chan)][k]
            self.wait(work, where, f"message {k} to rank {tb.send} on channel {tb.chan} (received by rank {tb.send} "
                                   f"tb {rtid} step {rstep})")
        return self.bufs["o"][:self.n_out * self.ce]
