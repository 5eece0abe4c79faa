"""The part of a sweep that runs inside a process group: for every case (size) and side, one
checked call, warm-up calls, then timed calls; the slowest rank's time and the wrong elements over
all ranks. The work is a typed payload (`SweepPlan`, `Case`) and comes back typed (`CaseTimings`).

Calls are classified like the runtimes do (msccl-xml.md §10): a collective whose torch call takes
one buffer (CollectiveSpec.one_buffer: all_reduce, broadcast, reduce) is always an in-place call,
so its files need inplace=1; the others are out-of-place unless the sweep asks for in-place calls.
"""

from __future__ import annotations

import time
import warnings
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable

import torch
import torch.distributed as dist

from backends import torch_dist as td
from compiler.model.program import Program
from compiler.specs.collectives import SPECS, CollectiveSpec, inplace_alias

from .options import SIDES
from .runtime_log import check_runtime, own_log_path, read_logs


@dataclass(frozen=True)
class Case:
    """One size of a sweep: the element count run and the algorithm of the MSCCL side."""
    index: int
    requested: int  # bytes asked for
    E: int  # nccl-tests' size in elements, after rounding to whole chunks
    algo: str | None = None  # file name or program name; None: no MSCCL side at this size
    program: Program | None = None  # for the executor (CPU)
    root: int | None = None


@dataclass(frozen=True)
class SweepPlan:
    """What every rank runs: the cases and how."""
    collective: str
    dtype: torch.dtype
    op: str
    device: str
    iters: int
    warmup: int
    timeout: float
    inplace: bool
    backend: str  # gloo | nccl
    seed: int
    cases: tuple[Case, ...]
    sides: tuple[str, ...] = SIDES
    check_log_dir: str | None = None  # read the ranks' NCCL logs from here (rank 0)

    @property
    def spec(self) -> CollectiveSpec:
        return SPECS[self.collective]

    @property
    def call_inplace(self) -> bool:
        return self.inplace or self.spec.one_buffer


@dataclass(frozen=True)
class Timing:
    time_s: float  # the slowest rank's mean time per call
    wrong: int  # elements that differ from the expected output, over all ranks


@dataclass(frozen=True)
class CaseTimings:
    default: Timing | None = None
    msccl: Timing | None = None

    def merged(self, other: "CaseTimings") -> "CaseTimings":
        """These timings with the sides `other` measured."""
        return replace(self, **{s: getattr(other, s) for s in SIDES if getattr(other, s) is not None})


@dataclass(frozen=True)
class WorkerResult:
    rows: tuple[CaseTimings, ...]
    log: str | None = None  # the ranks' NCCL logs, where the plan asked for them


def _torch_call(cs: CollectiveSpec, inplace: bool, rank: int, n: int, root: int | None, op: str, group=None):
    """A function(work_in, out) -> output running torch's collective the way nccl-tests would time
    it (no copies inside the timed call). In place, the input or the output is this rank's window
    of the one buffer (msccl-xml.md §10); a one-buffer call works on its input."""
    rop = td.reduce_op(op)
    windowed = inplace and cs.inplace_window

    def window(x: torch.Tensor) -> torch.Tensor:
        """This rank's slice of the whole buffer x in an in-place call (counted in elements)."""
        m = x.numel() // n
        start = inplace_alias(cs.name, rank, m, m).offset
        return x[start:start + m]

    def call(x: torch.Tensor, out: torch.Tensor | None) -> torch.Tensor:
        if cs.one_buffer:
            return cs.torch_call(dist, x, x, n, rank, root, rop, group)
        if windowed:  # x is the whole buffer: the output holds the input (or the other way round)
            inp, o = (window(x), x) if cs.alias(rank, 1, 1).view == "i" else (x, window(x))
            return cs.torch_call(dist, inp, o, n, rank, root, rop, group)
        return cs.torch_call(dist, x, out, n, rank, root, rop, group)
    return call


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def _side(plan: SweepPlan, case: Case, side: str, inp: torch.Tensor, rank: int, n: int, group):
    """(fresh() -> a new working buffer, run_once(buffer) -> output) for one side of one case."""
    cs, E, m = plan.spec, case.E, inp.numel()
    if side == "default" or plan.backend == "nccl":  # torch's call (on GPUs the runtime runs the XML)
        out_elems = cs.elements("out", n, E)
        tcall = _torch_call(cs, plan.call_inplace, rank, n, case.root, plan.op, group)
        alias = cs.alias(rank, m, out_elems) if plan.call_inplace else None
        if alias is not None and alias.base == "o" and (alias.offset or out_elems != m):
            def fresh(x=inp):  # the input is a window of the output
                buf = torch.empty(out_elems, dtype=plan.dtype, device=plan.device)
                buf[alias.offset:alias.offset + m].copy_(x)
                return buf
        else:
            def fresh(x=inp):
                return x.clone()
        out = torch.empty(out_elems, dtype=plan.dtype, device=plan.device)
        return fresh, lambda x: tcall(x, out)
    prepared = td.prepare(case.program, plan.call_inplace)
    return (lambda x=inp: x.clone(),
            lambda x: td.execute(prepared, x, plan.op, plan.timeout, inplace=plan.call_inplace, group=group))


def _time(plan: SweepPlan, fresh: Callable, run_once: Callable, want: torch.Tensor | None, group) -> Timing:
    """One checked call, the warm-up, the timed calls; reduced over the ranks."""
    got = run_once(fresh())
    _sync(plan.device)
    wrong = 0
    if want is not None:
        got = got.reshape(-1)[:want.numel()]
        wrong = int((got != want).sum()) if got.shape == want.shape else want.numel()
    x = fresh()
    for _ in range(plan.warmup):
        run_once(x)
    _sync(plan.device)
    dist.barrier(group=group)
    t0 = time.perf_counter()
    for _ in range(plan.iters):
        run_once(x)
    _sync(plan.device)
    dt = (time.perf_counter() - t0) / plan.iters
    red_dev = plan.device if plan.backend == "nccl" else "cpu"
    stats = torch.tensor([dt, float(wrong)], dtype=torch.float64, device=red_dev)
    tmax = stats[:1].clone()
    dist.all_reduce(tmax, op=dist.ReduceOp.MAX, group=group)
    wsum = stats[1:].clone()
    dist.all_reduce(wsum, group=group)
    return Timing(float(tmax.item()), int(wsum.item()))


def measure(plan: SweepPlan, rank: int, n: int, group=None, emit=None) -> tuple[CaseTimings, ...]:
    """Runs inside a process group: every case, every side the plan asks for. The same timings
    on all ranks. `emit("progress", k)` at each size keeps launch_local's watchdog alive."""
    warnings.simplefilter("ignore", FutureWarning)
    rows = []
    for case in plan.cases:
        if emit is not None:
            emit("progress", case.index)
        seed = plan.seed + case.index
        inp = td.make_input(rank, plan.spec.elements("inp", n, case.E), plan.dtype, seed, plan.op, plan.device)
        want = td.expected_output(plan.collective, rank, n, case.E, case.root, plan.op, plan.dtype, seed,
                                  plan.device)
        got = {}
        for side in plan.sides:
            if side == "msccl" and case.algo is None:
                continue
            fresh, run_once = _side(plan, case, side, inp, rank, n, group)
            got[side] = _time(plan, fresh, run_once, want, group)
        rows.append(CaseTimings(**got))
    return tuple(rows)


def worker(rank: int, n: int, plan: SweepPlan, emit) -> WorkerResult | None:
    """launch_local's worker: the timings (and the NCCL logs) from rank 0."""
    rows = measure(plan, rank, n, emit=emit)
    if rank != 0:
        return None
    return WorkerResult(rows, read_logs(plan.check_log_dir) if plan.check_log_dir else None)


def gather_verdicts(n: int) -> tuple[bool, str]:
    """Every rank reads its own NCCL log; rank 0 gets (ran everywhere, one line)."""
    path = own_log_path()
    text = ""
    if path:
        try:
            text = Path(path).read_text(errors="replace")
        except OSError:
            pass
    verdicts = [None] * n
    dist.all_gather_object(verdicts, check_runtime(text))
    missing = [r for r, (ran, _) in enumerate(verdicts) if not ran]
    if not missing:
        return True, f"all {n} ranks: {verdicts[0][1]}"
    return False, f"ranks {missing}: {verdicts[missing[0]][1]}"
