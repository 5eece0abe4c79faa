"""Local runs: spawn N local processes (gloo), run programs on seeded inputs, compare every defined
output with the reference (torch's own collective; for a custom program, what its demand
prescribes), and time the executor."""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass
from typing import Iterable

import torch
import torch.distributed as dist

from compiler.model.program import Program
from compiler.program.semantics import io_chunks, root_of
from compiler.specs.collectives import CUSTOM, SPECS, inplace_alias
from compiler.specs.errors import CompileError

from .executor import OPS, collective_elems, execute, op_name, prepare
from .headers import check_nprocs
from .launch import launch_local
from .reference import (compared_ranks, custom_input, custom_wrong, distinct_values, dtype_name, make_input,
                        torch_collective)


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
        per = " per chunk" if self.collective == CUSTOM else ""
        return (f"{self.name or self.collective}: {self.nprocs} ranks, {self.size_bytes} B{per} {self.dtype}"
                f"{' in place' if self.inplace else ''}: {verdict}; {self.time_s * 1e6:.1f} us")


@dataclass(frozen=True)
class Job:
    """One program for the workers: what to run and how to judge it."""
    index: int
    program: Program
    dtype: torch.dtype
    E: int  # nccl-tests' size in elements
    in_elems: int  # input elements per rank
    op: str
    root: int | None
    seed: int
    inplace: bool
    iters: int
    timeout: float
    distinct: bool  # custom inputs with an offset per (rank, chunk)


@dataclass(frozen=True)
class _Timed:
    wrong: int
    first: int | None
    times: tuple[float, ...]


def _load(xml_or_program) -> Program:
    if isinstance(xml_or_program, Program):
        return xml_or_program
    from backends.msccl_xml import read_xml
    return read_xml(xml_or_program)


def _standard_judge(j: Job, rank: int, n: int):
    """(this rank's input, judge(output) -> (wrong, first offset)) against torch's own collective."""
    p = j.program
    inp = make_input(rank, j.in_elems, j.dtype, j.seed, j.op)
    ref = torch_collective(p.collective, inp, j.E, rank, n, j.root, j.op)

    def judge(got: torch.Tensor) -> tuple[int, int | None]:
        if rank not in compared_ranks(p.collective, n, j.root):
            return 0, None
        bad = (got != ref) if got.shape == ref.shape else torch.ones(ref.numel(), dtype=torch.bool)
        wrong = int(bad.sum())
        return wrong, int(bad.nonzero()[0, 0]) if wrong else None
    return inp, judge


def _custom_judge(j: Job, rank: int, n: int):
    """(this rank's input, judge) against what the program's demand prescribes."""
    p = j.program
    n_in, _ = io_chunks(p)
    ce = j.in_elems // n_in
    inputs: dict[int, torch.Tensor] = {}

    def input_of(r: int) -> torch.Tensor:
        if r not in inputs:
            inputs[r] = custom_input(r, n_in, ce, j.dtype, j.seed, j.op, j.distinct)
        return inputs[r]
    return input_of(rank), lambda got: custom_wrong(p.demand, rank, got, input_of, OPS[j.op], ce)


def _run_jobs_worker(rank: int, n: int, jobs: list[Job], emit) -> list[_Timed]:
    """Per job: the reference (torch's collective, or a custom program's demand), then the program
    through execute()."""
    out = []
    for j in jobs:
        emit("progress", j.index)
        p = j.program
        inp, judge = (_custom_judge if p.collective == CUSTOM else _standard_judge)(j, rank, n)
        plan = prepare(p, j.inplace)
        times, wrong, first = [], 0, None
        for it in range(j.iters):
            x = inp.clone()
            dist.barrier()
            t0 = time.perf_counter()
            got = execute(plan, x, j.op, j.timeout, inplace=j.inplace)
            times.append(time.perf_counter() - t0)
            if it == 0:
                wrong, first = judge(got)
        out.append(_Timed(wrong, first, tuple(times)))
    return out


def run_local(xml_or_program, nprocs: int, size_bytes: int, dtype: torch.dtype = torch.float32, seed: int = 0,
              inplace: bool = False, timeout: float = 30.0, *, op="sum", iters: int = 3) -> RunResult:
    """Spawns `nprocs` local gloo processes, runs the program (a Program, an XML path or XML text)
    on seeded random data of nccl-tests' size `size_bytes` (rounded down to whole chunks; noted),
    compares every defined output with torch's own collective, and times the executor. A custom
    program is run on `size_bytes` per chunk of its demand, with inputs distinct per (rank, chunk),
    and compared with what its demand prescribes (reference.py). Raises CompileError for user
    errors (nprocs != ngpus, a custom file without its demand, a size below one element per chunk)
    and ExecutionError for a program that cannot run or a run that fails or times out."""
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
    jobs, metas = [], []
    for k, src in enumerate(programs):
        job, run_bytes, notes = _job(k, src, nprocs, size_bytes, dtype, seed, inplace, timeout, opn, iters)
        jobs.append(job)
        metas.append((job.program, run_bytes, job.root, notes))
    if not jobs:
        return []
    per_rank = launch_local(_run_jobs_worker, nprocs, jobs, timeout=timeout * (iters + 2))
    out = []
    for k, (p, run_bytes, root, notes) in enumerate(metas):
        rows = [per_rank[r][k] for r in range(nprocs)]
        wrong = sum(r.wrong for r in rows)
        first = next(((r, rows[r].first) for r in range(nprocs) if rows[r].first is not None), None)
        per_iter = [max(rows[r].times[i] for r in range(nprocs)) for i in range(iters)]
        out.append(RunResult(correct=wrong == 0, wrong=wrong, first_wrong=first,
                             time_s=float(statistics.median(per_iter)),
                             nprocs=nprocs, size_bytes=run_bytes, collective=p.collective, name=p.name,
                             dtype=dtype_name(dtype), op=opn, inplace=inplace, root=root, iters=iters,
                             times_s=tuple(per_iter), notes=tuple(notes)))
    return out


def _job(k: int, src, nprocs: int, size_bytes: int, dtype: torch.dtype, seed: int, inplace: bool, timeout: float,
         opn: str, iters: int) -> tuple[Job, int, list[str]]:
    """One program checked for a run: (the job, the size actually run, notes). Refuses what
    cannot run before any process starts."""
    p = _load(src)
    label = p.name if isinstance(src, (Program, bytes)) or str(src).lstrip().startswith("<") else str(src)
    notes = list(p.notes)
    custom = p.collective == CUSTOM
    if custom and p.demand is None:
        raise CompileError(f"{label}: coll=custom, but the file carries no demand (the <!-- msccl-compile "
                           f"demand --> comment msccl-compile custom writes): nothing says what is right")
    if not custom and p.collective not in SPECS:
        raise CompileError(f"{p.name}: collective {p.collective!r} has no torch.distributed counterpart "
                           f"to compare with")
    check_nprocs(nprocs, p.ngpus, p.name)
    itemsize = torch.empty((), dtype=dtype).element_size()
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
    root = root_of(p)
    prepare(p, inplace)  # refuse a program that cannot run before starting processes
    distinct = False
    if custom:
        distinct = distinct_values(p.demand, io_chunks(p)[0], dtype, opn)
        if not distinct:
            notes.append(f"inputs are seeded integers without an offset per (rank, chunk): {opn} in "
                         f"{dtype_name(dtype)} would not stay exact")
    job = Job(k, p, dtype, E, in_elems, opn, root, seed, inplace, iters, timeout, distinct)
    return job, run_bytes, notes
