"""nccl-tests-style regression sweeps: torch's default collective and the MSCCL algorithm side by side.

For each size: time the default collective and the MSCCL algorithm, check both against the
expected result (computed locally from every rank's seeded input, as nccl-tests checks), and
report nccl-tests' columns (size, count, type, redop, time us, algbw GB/s, busbw GB/s, #wrong;
size is nccl-tests' S, algbw = S / time, busbw = algbw x the collective's factor, hardware.md §4).

Where the MSCCL side comes from:

* **CPU (gloo)**: our executor (`backends.torch_dist.execute`) interprets the XML over gloo. Both
  sides run in one launch. This tests correctness and the harness; the times are gloo's, not a GPU's.
* **GPUs (nccl)**: the ordinary torch call, with the MSCCL runtime loaded through the environment
  (`backends.torch_dist.msccl_env`); the runtime executes the XML. A process loads MSCCL once, at
  its first communicator, so one process measures one side: standalone, `sweep` runs two rounds of
  local processes (without and with the MSCCL variables; LD_PRELOAD of the runtime's libnccl.so.2
  must be in the launching environment and is inherited); under torchrun, choose `--side default`
  or `--side msccl` per launch and merge with `--default-from FILE`. `--check-runtime` turns on
  NCCL's INFO log (NCCL_DEBUG=INFO, NCCL_DEBUG_SUBSYS=INIT,ENV, NCCL_DEBUG_FILE per process) and
  confirms from it that MSCCL really ran (`check_runtime`).

With a library directory, each size uses the file the runtime would select (`select_algorithm`:
coll, ngpus, call kind, minBytes <= S <= maxBytes, nchunksperloop dividing the element count);
sizes no file covers have no MSCCL column (the runtime falls back to NCCL there).
"""

from __future__ import annotations

import os
import shutil
import tempfile
from dataclasses import replace
from pathlib import Path

import torch
import torch.distributed as dist

from backends import torch_dist as td
from compiler.analysis.bounds import busbw
from compiler.program.semantics import root_of
from compiler.specs.collectives import SPECS, canonical
from compiler.specs.errors import CompileError
from compiler.specs.runtimes import DEFAULT, ENV_VARS

from .measure import Case, CaseTimings, SweepPlan, gather_verdicts, measure, worker
from .options import SIDES
from .results import BenchResult, BenchRow, SideResult
from .runtime_log import check_runtime

NCCL_TYPE_NAMES = {"float32": "float", "float16": "half", "float64": "double", "bfloat16": "bfloat16",
                   "int32": "int32", "int64": "int64", "int8": "int8", "uint8": "uint8"}
MSCCL_ENV_VARS = ENV_VARS  # every variable any runtime reads to load or skip MSCCL


def default_side_env(runtime: str) -> dict[str, str | None]:
    """The environment of the default side on GPUs: no MSCCL variables, and MSCCL switched off
    (a runtime may also look for algorithms next to its library when MSCCL_ALGO_DIR is unset).
    None = unset."""
    env: dict[str, str | None] = {k: None for k in MSCCL_ENV_VARS}
    env.update(td.runtime_spec(runtime).off)
    return env


def algo_dir_for(xml: str, runtime: str) -> tuple[str, str]:
    """(what to load, a temporary directory to remove): a directory holding only `xml` for a
    runtime that loads directories; the file itself for one that loads a list."""
    if not td.runtime_spec(runtime).loads_directory:
        return xml, ""
    d = tempfile.mkdtemp(prefix="msccl-algo-")
    os.symlink(os.path.abspath(xml), os.path.join(d, os.path.basename(xml)))
    return d, d


def gpu_script(collective: str, algos: str, runtime: str = DEFAULT, nproc: int = 8, sizes: str = "1KB:1GB",
               nccl_lib: str = "$HOME/msccl-executor-nccl/build/lib/libnccl.so.2", iters: int = 20,
               warmup: int = 5, out: str | None = None, baseline: str | None = None) -> str:
    """A bash script (templates/bench_gpu.sh.j2) that benchmarks on GPUs: checks the preloaded
    library, runs the default side, then the MSCCL side with --check-runtime and --default-from.
    `algos`: a library directory, or one XML file (--xml)."""
    import shlex
    from importlib import resources

    import jinja2

    coll = canonical(collective)
    td.runtime_spec(runtime)
    source = f"--library {shlex.quote(algos)}" if not str(algos).endswith(".xml") else f"--xml {shlex.quote(algos)}"
    disable = " ".join(f"{k}={v}" for k, v in default_side_env(runtime).items() if v is not None)
    text = resources.files("templates").joinpath("bench_gpu.sh.j2").read_text(encoding="utf-8")
    env = jinja2.Environment(autoescape=False, keep_trailing_newline=True, undefined=jinja2.StrictUndefined)
    return env.from_string(text).render(
        collective=coll, algos=algos, runtime=runtime, nproc=int(nproc), sizes=sizes, nccl_lib=nccl_lib,
        iters=int(iters), warmup=int(warmup), out=out or f"bench-{coll}", source=source, disable=disable,
        baseline=shlex.quote(baseline) if baseline else None)


# ---- the cases ------------------------------------------------------------------------------------

def _algorithms(coll: str, n: int, call_inplace: bool, xml, library_dir, runtime: str, notes: list[str]):
    """(the one program of --xml, the headers of --library): one of them, or neither."""
    from backends.msccl_xml import read_xml
    if xml is not None:
        single = read_xml(xml)
        if single.collective != coll:
            raise CompileError(f"--xml: {xml} is a {single.collective} algorithm, not {coll}")
        if single.ngpus != n:
            raise CompileError(f"--xml: {xml} has ngpus={single.ngpus}, but the run has {n} ranks")
        if not (single.inplace if call_inplace else single.outofplace):
            kind = "in-place" if call_inplace else "out-of-place"
            why = " (torch's all_reduce/broadcast/reduce are in-place calls)" if SPECS[coll].one_buffer else ""
            notes.append(f"{Path(str(xml)).name} is not marked usable for {kind} calls{why}: the runtime would not "
                         f"select it; the executor runs it anyway")
        return single, None
    if library_dir is not None:
        headers = [td.read_header(f) for f in td.algorithm_files(library_dir, runtime)]
        for problem in td.check_bands(headers, runtime):
            notes.append(f"library: {problem}")
        return None, headers
    return None, None


def cases(coll: str, sizes: list[int], n: int, itemsize: int, inplace: bool, xml, library_dir, runtime: str,
          notes: list[str]) -> tuple[Case, ...]:
    """Per size: the element count actually run and the algorithm for the MSCCL side."""
    from backends.msccl_xml import read_xml
    cs = SPECS[coll]
    call_inplace = inplace or cs.one_buffer
    single, headers = _algorithms(coll, n, call_inplace, xml, library_dir, runtime, notes)
    cache: dict[str, object] = {}
    out = []
    unit = cs.count_unit(n)
    for k, size in enumerate(sizes):
        E = size // itemsize // unit * unit
        algo, program = None, None
        if single is not None:
            N = single.nchunksperloop
            E = E // N * N
            algo, program = Path(str(xml)).name if not str(xml).lstrip().startswith("<") else single.name, single
        elif headers is not None:
            h = td.select_algorithm(headers, coll, E * itemsize, n, itemsize, call_inplace)
            if h is None:
                why = td.why_not_selected(headers, coll, E * itemsize, n, itemsize, call_inplace)
                notes.append(f"size {size} B: no library file is selected ({why}); the runtime would use NCCL's "
                             f"own algorithm: no msccl column")
            else:
                algo = h.label
                program = cache.get(h.path) or cache.setdefault(h.path, read_xml(h.path))
        if E == 0:
            raise CompileError(f"--sizes: {size} B is below one element per chunk for {coll} on {n} ranks")
        if E * itemsize != size:
            notes.append(f"size {size} B rounded down to {E * itemsize} B (whole chunks)")
        root = (root_of(program) if program is not None else 0) if cs.rooted else None
        out.append(Case(k, size, E, algo, program, root))
    return tuple(out)


# ---- the sweep ------------------------------------------------------------------------------------

def _check_arguments(xml, library_dir, iters: int, warmup: int, sizes, sides) -> None:
    if xml is not None and library_dir is not None:
        raise CompileError("bench: give --xml or --library, not both")
    if iters < 1 or warmup < 0:
        raise CompileError(f"--iters/--warmup: {iters}/{warmup}: need iters >= 1 and warmup >= 0")
    if not sizes:
        raise CompileError("--sizes: no sizes")
    bad = [s for s in sides if s not in SIDES]
    if bad or not sides:
        raise CompileError(f"--side: {bad[0] if bad else ''!r} is not a side ({', '.join(SIDES)}, both)")


def _where(nprocs: int, device: str | None) -> tuple[bool, int, str, str]:
    """(inside a process group already, ranks, backend, device)."""
    if dist.is_available() and dist.is_initialized():
        backend = dist.get_backend()
        return True, dist.get_world_size(), backend, "cuda" if backend == "nccl" else "cpu"
    if device is None:
        device = "cuda" if torch.cuda.is_available() else "cpu"
    return False, nprocs, "nccl" if device.startswith("cuda") else "gloo", device


def sweep(collective: str, sizes: list[int], xml: str | os.PathLike | None = None,
          library_dir: str | os.PathLike | None = None, iters: int = 20, warmup: int = 5, nprocs: int = 4, *,
          dtype: torch.dtype | str = torch.float32, op: str = "sum", inplace: bool = False, timeout: float = 60.0,
          runtime: str = DEFAULT, sides: tuple[str, ...] = SIDES, seed: int = 0, device: str | None = None,
          check_log: bool = False) -> BenchResult:
    """Times torch's default collective and the MSCCL algorithm (`xml`, or per size from
    `library_dir`) for each size. Inside an initialised process group (torchrun) it runs on the
    existing group (every rank must call it; all get the result); otherwise it spawns `nprocs`
    local processes. device: "cpu" (gloo, our executor) or "cuda" (nccl, the MSCCL runtime through
    the environment); default cuda when available and no group exists yet."""
    coll = canonical(collective)
    _check_arguments(xml, library_dir, iters, warmup, sizes, sides)
    dt, opn = td.parse_dtype(dtype), td.op_name(op)
    in_group, n, backend, device = _where(nprocs, device)
    notes: list[str] = []
    itemsize = torch.empty((), dtype=dt).element_size()
    todo = cases(coll, list(sizes), n, itemsize, inplace, xml, library_dir, runtime, notes)
    if not any(c.algo for c in todo):
        sides = tuple(s for s in sides if s != "msccl")
        if xml is None and library_dir is None:
            notes.append("no --xml or --library: default side only")
    gpu = backend == "nccl"
    if gpu and SPECS[coll].torch_gpu_note:
        notes.append(SPECS[coll].torch_gpu_note)
    if gpu:
        notes.append(f"torch.cuda.nccl.version() = {'.'.join(map(str, torch.cuda.nccl.version()))}")
    plan = SweepPlan(coll, dt, opn, device, iters, warmup, timeout, inplace, backend, seed, todo, tuple(sides))
    if in_group:
        if gpu and len(sides) > 1:
            raise CompileError("bench: on GPUs a process loads MSCCL once, so one launch measures one side: run "
                               "with --side default, then with --side msccl (and --default-from the first JSON)")
        rows, log = measure(plan, dist.get_rank(), n), None
        if check_log and gpu:
            log = gather_verdicts(n)
    elif not gpu:
        got = td.launch_local(worker, n, plan, timeout=_watchdog(plan))[0]
        rows, log = got.rows, got.log
    else:
        rows, log = _gpu_rounds(plan, n, runtime, xml, library_dir, check_log)
    if check_log:
        notes += _log_notes(log, gpu)
    return _result(plan, rows, n, itemsize, runtime if gpu else None, notes)


def _watchdog(plan: SweepPlan) -> float:
    """Seconds a size may take: two sides, each call bounded."""
    return 2 * plan.timeout * (plan.iters + plan.warmup + 2) + 10


def _gpu_rounds(plan: SweepPlan, n: int, runtime: str, xml, library_dir, check_log: bool):
    """Standalone on GPUs: one round of local processes per side (a process loads MSCCL once)."""
    rows = [CaseTimings() for _ in plan.cases]
    log, cleanup = None, []
    try:
        for side in plan.sides:
            env = default_side_env(runtime) if side == "default" else {k: None for k in MSCCL_ENV_VARS}
            pl = replace(plan, sides=(side,))
            if side == "msccl":
                if xml is not None:
                    path, tmp = algo_dir_for(str(xml), runtime)
                    cleanup.append(tmp)
                else:
                    path = str(library_dir)
                env.update(td.msccl_env(runtime, path, n))
                if check_log:
                    logdir = tempfile.mkdtemp(prefix="msccl-log-")
                    cleanup.append(logdir)
                    env.update({"NCCL_DEBUG": os.environ.get("NCCL_DEBUG", "INFO"),
                                "NCCL_DEBUG_SUBSYS": os.environ.get("NCCL_DEBUG_SUBSYS", "INIT,ENV"),
                                "NCCL_DEBUG_FILE": os.path.join(logdir, "nccl.%h.%p.log")})
                    pl = replace(pl, check_log_dir=logdir)
            got = td.launch_local(worker, n, pl, timeout=_watchdog(plan), env=env, backend="nccl")[0]
            log = got.log if got.log is not None else log
            rows = [r.merged(g) for r, g in zip(rows, got.rows)]
    finally:
        for d in cleanup:
            if d:
                shutil.rmtree(d, ignore_errors=True)
    return tuple(rows), log


def _log_notes(log, gpu: bool) -> list[str]:
    """What --check-runtime says: verdicts gathered from every rank (torchrun), or read from the log."""
    if isinstance(log, tuple):
        ran, msg = log
    elif log is None:
        return ["check-runtime: MSCCL is not in the path on CPU (gloo): the msccl columns come from "
                "msccl-compile's executor" if not gpu else
                "check-runtime: no log collected here; pass the NCCL log to check_runtime"]
    else:
        ran, msg = check_runtime(log)
    return [f"check-runtime: {msg}"] + ([] if ran else ["check-runtime: FAILED"])


def _result(plan: SweepPlan, rows, n: int, itemsize: int, runtime: str | None, notes: list[str]) -> BenchResult:
    """nccl-tests' figures per case. `runtime`: the one that ran the MSCCL side on GPUs (None: our
    executor on CPU)."""
    cs = plan.spec
    redop = plan.op if cs.reduces else "none"
    name = td.dtype_name(plan.dtype)
    out_rows = []
    for c, r in zip(plan.cases, rows):
        S = c.E * itemsize
        sides = {}
        for s in SIDES:
            t = getattr(r, s)
            if t is not None:
                algbw = S / t.time_s / 1e9 if t.time_s > 0 else 0.0
                sides[s] = SideResult(t.time_s * 1e6, algbw, busbw(plan.collective, n, algbw), t.wrong)
        out_rows.append(BenchRow(S, c.E // cs.count_unit(n), NCCL_TYPE_NAMES.get(name, name), redop,
                                 sides.get("default"), sides.get("msccl"), c.algo, c.requested))
    source = f"{runtime} runtime" if runtime is not None else "our executor, CPU"
    return BenchResult(plan.collective, n, name, plan.op, plan.inplace, plan.backend, source, plan.iters,
                       plan.warmup, tuple(out_rows), tuple(notes))
