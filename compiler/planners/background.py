"""A second process for auto: while the first realises and times the constructive candidates'
programs (pure Python, one core), the second plans the optimisers' candidates (model building and
HiGHS) on the other core, to the same deadline, and sends them back.

The second process is a fresh interpreter (`python -m compiler.planners.background PARENT_PID`)
that reads its work, pickled, from its stdin and writes the answer, pickled, to its stdout (no file:
one would outlive a first process killed before the second read it); not
multiprocessing, whose start methods either fork (the first process may hold HiGHS's solver
threads, which a forked child inherits without the threads) or import the caller's main module
again (a script without a `__main__` guard would compile twice).
"""

from __future__ import annotations

import os
import pickle
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from compiler.specs.errors import CompileError

ENV = "MSCCL_COMPILE_WORKERS"
GRACE_S = 2.0  # past the deadline, how long the first process waits for the answer (the solver is cancelled
# at the deadline; what is left is sending the candidates back)


def workers(asked: int) -> int:
    """Processes auto may use: `asked`, else MSCCL_COMPILE_WORKERS, else 2 where this process may
    run on two cores or more (auto has two parts to overlap), else 1."""
    if asked:
        return asked
    env = os.environ.get(ENV, "").strip()
    if env:
        if not env.isdigit() or int(env) < 1:
            raise CompileError(f"{ENV}={env!r}: expected a whole number of processes >= 1")
        return int(env)
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return 2 if cores >= 2 else 1


def picklable(value: Any) -> Any:
    """`value` where it can travel to the second process, else None (a progress callback may be a closure)."""
    try:
        pickle.dumps(value)
        return value
    except Exception:
        return None


@dataclass
class Background:
    """`target(*args)` running in a second process. Its answer is read as it is written, by a thread
    of this process: an answer larger than the pipe's buffer (a candidate's schedule) would otherwise
    hold the second process until `result` reads it, and one sent in time would be lost where this
    process asks late (its own judging ran over: DGX-1 alltoall 32 MB at 10 s, whose optimisers
    answered 3 s before their deadline, wrote ring at 0.51 of the floor where lp's program is 0.96)."""
    process: subprocess.Popen
    answer: list[bytes] = field(default_factory=list)
    reader: threading.Thread | None = None

    def __post_init__(self) -> None:
        if self.process.stdout is not None and self.reader is None:
            self.reader = threading.Thread(target=lambda: self.answer.append(self.process.stdout.read()), daemon=True)
            self.reader.start()

    @classmethod
    def start(cls, target: Callable, args: tuple) -> Background:
        work = pickle.dumps((target, args), protocol=pickle.HIGHEST_PROTOCOL)
        # this process's import path, so that the second finds the same compiler (a script may have set it)
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
        process = subprocess.Popen([sys.executable, "-m", __name__, str(os.getpid())],
                                   stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env)
        # written by a thread: the work may be more than the pipe holds, and the second process reads it
        # only once its interpreter has started
        threading.Thread(target=_send, args=(process.stdin, work), daemon=True).start()
        return cls(process)

    def result(self, deadline: float, grace: float = GRACE_S) -> Any:
        """What target returned; None where it had not sent it all by deadline + grace (GRACE_S), nor
        by now (or died). Its exception, raised here, where it raised one. The process is stopped either way."""
        try:
            if self.reader is not None:
                self.reader.join(timeout=max(0.0, deadline + grace - time.perf_counter()))
            if not self.answer:
                return None
            ok, value = pickle.loads(self.answer[0])
        except (pickle.UnpicklingError, EOFError, ValueError):
            return None
        finally:
            self.stop()
        if not ok:
            raise value
        return value

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait()
        if self.reader is not None:
            self.reader.join()  # the pipe's writer is gone: the read ends
        if self.process.stdout is not None:
            self.process.stdout.close()


def _send(pipe, work: bytes) -> None:
    try:
        pipe.write(work)
    except (BrokenPipeError, ValueError, OSError):  # the second process ended (or was stopped) before it read it all
        pass
    finally:
        try:
            pipe.close()  # the file is closed even where flushing what is left fails
        except OSError:
            pass


def _die_with(parent: int) -> None:
    """Be killed when the first process ends, however it ends (Linux's PR_SET_PDEATHSIG; elsewhere
    the first process's stop is all there is). Its own stop cannot cover every case: an interrupt
    that lands while this process is being started, before the first holds its handle, exits the
    first at once (os._exit runs no finally), and this one planned on to its deadline, holding the
    caller's stderr open (a CI run's interrupt test waited 30 s on it)."""
    try:
        import ctypes
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # 1: PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        return
    if os.getppid() != parent:  # it ended before the request was made
        os._exit(0)


def _serve(parent: int) -> None:
    _die_with(parent)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the first process too, which stops this one
    out = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)  # nothing but the answer on the pipe, whatever writes to stdout (a solver's banner)
    try:
        target, args = pickle.load(sys.stdin.buffer)
        devnull = os.open(os.devnull, os.O_RDONLY)  # nothing else is read from the first process (a solver's prompt)
        os.dup2(devnull, 0)
        os.close(devnull)
        value = (True, target(*args))
    except Exception as e:  # a bug: the first process reports it
        value = (False, e if picklable(e) is not None else RuntimeError(f"{type(e).__name__}: {e}"))
    try:
        pickle.dump(value, out, protocol=pickle.HIGHEST_PROTOCOL)
        out.close()
    except BrokenPipeError:  # the first process is gone (killed outright): nobody to answer, nothing to flush
        os._exit(0)


if __name__ == "__main__":
    _serve(int(sys.argv[1]))
