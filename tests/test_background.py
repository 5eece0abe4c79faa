"""auto's second process (compiler/planners/background.py): the optimisers are planned beside the
judging of the constructive candidates, their candidates come back and are judged like any other,
and nothing outlives the command."""

import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from compiler.model.demand import make_demand
from compiler.model.profiles import load_topology
from compiler.pipeline import CompileOptions, compile
from compiler.planners import PlanOptions
from compiler.planners.background import Background, workers
from compiler.specs.errors import CompileError


def test_the_target_runs_in_another_process_and_its_answer_comes_back():
    helper = Background.start(os.getpid, ())
    assert helper.result(time.perf_counter() + 60) not in (None, os.getpid())
    assert helper.process.poll() is not None


def test_its_exception_is_raised_here():
    helper = Background.start(load_topology, ("no-such-hw",))
    with pytest.raises(CompileError, match="unknown hardware profile 'no-such-hw'"):
        helper.result(time.perf_counter() + 60)


def test_an_answer_sent_in_time_is_kept_where_it_is_asked_for_late():
    """The second process answered (64 MB, more than a pipe holds) while this one was still busy
    past the deadline: the answer was read as it came, so asking late still gets it, at once."""
    helper = Background.start(bytes, (64 << 20,))
    t0 = time.perf_counter()
    while helper.process.poll() is None and time.perf_counter() - t0 < 30:  # it can end only once all is read
        time.sleep(0.05)
    asked = time.perf_counter()
    assert helper.result(asked - 60) == bytes(64 << 20)
    assert time.perf_counter() - asked < 5


def test_past_the_deadline_it_is_stopped_and_gives_nothing():
    helper = Background.start(time.sleep, (60,))
    t0 = time.perf_counter()
    assert helper.result(t0) is None
    assert time.perf_counter() - t0 < 10
    assert helper.process.poll() is not None


def test_workers_default_from_the_environment(monkeypatch):
    monkeypatch.setenv("MSCCL_COMPILE_WORKERS", "1")
    assert workers(0) == 1 and workers(2) == 2
    monkeypatch.setenv("MSCCL_COMPILE_WORKERS", "two")
    with pytest.raises(CompileError, match="MSCCL_COMPILE_WORKERS='two'"):
        workers(0)


def test_two_processes_find_the_program_one_finds(topo):
    """A model small enough to solve to optimality in both: the optimisers' candidates planned in
    the second process are judged, and the program is the one the single process writes."""
    t = topo("line:4")
    demand = make_demand("alltoall", 4, 100 * 10**6)
    results = {n: compile(t, demand, CompileOptions(PlanOptions(time_limit=20, refine=True, good_enough=1.0,
                                                                 workers=n)))
               for n in (1, 2)}
    for r in results.values():
        assert any("milp" in n for n in r.notes[:1]), r.notes
    assert not any("optimisers' process" in n for n in results[2].notes)  # it answered
    assert results[2].time_s == pytest.approx(results[1].time_s, rel=1e-9)


def test_the_optimisers_plan_here_where_a_second_process_could_not_start_in_time(topo):
    """A second process imports cvxpy (1.6 s) before it plans: with less than BESIDE_MIN_S left
    to the planning deadline auto plans the optimisers itself (a DGX A100 library at --time-limit 2
    waited 22 s of its 55 for answers past the deadline); with more, beside."""
    from compiler.planners.auto import BESIDE_MIN_S, Search
    t = topo("dgx-a100")
    demand = make_demand("allreduce", 8, 2 * 10**6)
    options = PlanOptions(time_limit=60, refine=True, workers=2)
    assert Search(t, options, time.perf_counter() + BESIDE_MIN_S - 0.1, (1,)).beside(demand) is None
    helper = Search(t, options, time.perf_counter() + BESIDE_MIN_S + 5, (1,)).beside(demand)
    assert helper is not None
    helper.stop()


def _compile_beside_a_second_process(tmp_path, mark: str) -> subprocess.Popen:
    """A compile with two processes, once its second process runs (it carries MSCCL_TEST_MARK=mark),
    in tmp_path/out with its temporary files in tmp_path/tmp."""
    for d in ("out", "tmp"):
        (tmp_path / d).mkdir()
    env = {**os.environ, "MSCCL_TEST_MARK": mark, "MSCCL_COMPILE_WORKERS": "2", "TMPDIR": str(tmp_path / "tmp")}
    p = subprocess.Popen([sys.executable, "-m", "compiler.cli", "allgather", "--hw", "dgx2", "--nodes", "2",
                          "--size", "1MB", "-o", "x.xml"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True, cwd=tmp_path / "out", env=env)
    deadline = time.perf_counter() + 60
    while not _marked(mark, p.pid) and time.perf_counter() < deadline:
        time.sleep(0.2)
    if not _marked(mark, p.pid):
        p.kill()
        pytest.fail("the second process never started")
    return p


def test_an_interrupt_leaves_no_second_process(tmp_path):
    mark = uuid.uuid4().hex
    p = _compile_beside_a_second_process(tmp_path, mark)
    try:
        p.send_signal(signal.SIGINT)
        _, err = p.communicate(timeout=30)
    finally:
        p.kill()
    assert p.returncode == 130 and "Traceback" not in err, err
    time.sleep(0.5)
    assert not _marked(mark, p.pid)
    assert list((tmp_path / "out").iterdir()) == [] and list((tmp_path / "tmp").iterdir()) == []


def test_a_killed_first_process_takes_the_second_with_it(tmp_path):
    """SIGKILL runs no handler and no finally: the second process must end by itself (it planned on
    to its deadline, holding the caller's stderr open, before it asked the kernel to end it too), and
    leave nothing behind (its work came in a temporary file, left there where the kill came first)."""
    mark = uuid.uuid4().hex
    p = _compile_beside_a_second_process(tmp_path, mark)
    try:
        p.kill()
        p.communicate(timeout=30)  # the pipes close once no process holds them
    finally:
        p.kill()
    deadline = time.perf_counter() + 10
    while _marked(mark, p.pid) and time.perf_counter() < deadline:
        time.sleep(0.1)
    assert not _marked(mark, p.pid)
    assert list((tmp_path / "tmp").iterdir()) == []


def _marked(mark: str, parent: int) -> bool:
    """Whether a process other than `parent` carries MSCCL_TEST_MARK=mark (the second process inherits it)."""
    for d in Path("/proc").iterdir():
        if not d.name.isdigit() or int(d.name) == parent:
            continue
        try:
            if f"MSCCL_TEST_MARK={mark}".encode() in (d / "environ").read_bytes().split(b"\0"):
                return True
        except OSError:
            continue
    return False


def test_a_silent_second_process_is_not_waited_for_past_the_judging_it_leaves(topo):
    """The optimisers' process sent nothing by the planning deadline (at a short limit on a busy
    machine its cvxpy import alone outlasts it): auto waits for it at most GRACE_SHARE of the time
    left to judge_until, not GRACE_S whatever the limit, so that time still judges candidates
    (relay, planned where no optimiser planned). MI250 reduce 256 KB at --time-limit 5 on two busy
    cores: the 2 s wait ran past judge_until, nothing more was judged, and trees/2ch was written at
    59 us where relay's program is 41 us."""
    from compiler.planners.auto import Search
    t = topo("dgx1")
    now = time.perf_counter()
    options = PlanOptions(time_limit=5, judge=lambda s, by=None: 0.0, judge_until=now + 1.0)
    search = Search(t, options, now, (1,))
    helper = Background.start(time.sleep, (60,))
    search.add(helper)
    assert time.perf_counter() - now < 1.0  # was GRACE_S, 2 s: past judge_until
    assert search.failed == ["the optimisers' process (no answer by the time limit)"]
    assert helper.process.poll() is not None
