"""Local multi-process launch: N processes on this machine joined in one process group (gloo over
127.0.0.1, or nccl with one GPU each), the rendezvous through a TCPStore this process owns (no
free-port race). A launch never hangs: every wait in the children is bounded, and the parent kills
children that stop reporting.
"""

from __future__ import annotations

import datetime
import os
import queue as queue_mod
import time
import warnings
from typing import Any, Callable

import torch
import torch.distributed as dist

from compiler.specs.errors import CompileError

from .env import patched_environ
from .errors import ExecutionError
from .executor import first_line

STARTUP_S = 60.0  # a child's first report may take this long on top of the timeout (imports, rendezvous)
PRELOAD = ["backends.torch_dist.launch", "backends.torch_dist.run"]  # imported once by the forkserver


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
        msg = str(e) if isinstance(e, CompileError) else f"{type(e).__name__}: {first_line(e)}"
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
        ctx.set_forkserver_preload(PRELOAD)
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
    try:
        results, errors = _supervise(procs, q, timeout)
    except BaseException:  # Ctrl-C, SIGTERM, a timeout: the children go at once, not after a join
        for proc in procs:
            if proc.is_alive():
                proc.kill()
        raise
    finally:
        _reap(procs)
        q.close()
    if errors:
        first = _best_error(errors)
        more = f" (and {len(errors) - 1} more ranks failed)" if len(errors) > 1 else ""
        raise ExecutionError(first + more)
    return [results[r] for r in range(nprocs)]


def _supervise(procs: list, q, timeout: float) -> tuple[dict[int, Any], dict[int, str]]:
    """Collects every rank's result or error; a rank that exits silently is an error, and ranks
    that report nothing for the watchdog's limit raise ExecutionError."""
    nprocs = len(procs)
    results: dict[int, Any] = {}
    errors: dict[int, str] = {}
    last = time.monotonic()
    limit = STARTUP_S + timeout
    dead_since: dict[int, float] = {}
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
    return results, errors


def _reap(procs: list) -> None:
    for proc in procs:
        proc.join(timeout=2.0)
    for proc in procs:
        if proc.is_alive():
            proc.kill()
            proc.join(timeout=2.0)


def _best_error(errors: dict[int, str]) -> str:
    """The most informative error: one that is not a consequence of another rank's failure."""
    def rank_of(item):
        r, msg = item
        secondary = ("timeout" in msg or "Connection closed" in msg or "closure" in msg or "exited" in msg)
        return (secondary, r)
    return sorted(errors.items(), key=rank_of)[0][1]
