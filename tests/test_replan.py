"""Link names and re-planning: a failed link is never used and a degraded one carries no more than
its new capacity (both judged by the schedule simulator on the changed topology), a change that cuts
a needed pair is refused naming it, and `profiles show` lists the names."""

import json
import re

import pytest

from backends.msccl_xml import read_xml
from compiler.analysis.simulate import ScheduleError, simulate
from compiler.model.linknames import degrade, fail, named_links, resolve
from compiler.model.schedule import Schedule
from compiler.program.timing import call_bytes, time_program
from compiler.program.verify import verify
from compiler.specs.errors import CompileError
from tests.conftest import run_cli


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """An allgather on dgx1 planned by the MILP and saved with --schedule-out."""
    tmp = tmp_path_factory.mktemp("replan")
    proc = run_cli("allgather", "--hw", "dgx1", "--size", "16MB", "--method", "milp", "--chunks", "1",
                   "--time-limit", "10", "--schedule-out", "old.json", "-o", "old.xml", cwd=tmp)
    assert proc.returncode == 0, proc.stderr
    return tmp


def replan_json(tmp, *args):
    proc = run_cli("replan", "old.json", "--hw", "dgx1", "--time-limit", "3", "--json", *args, cwd=tmp)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def test_failed_link_is_never_used(saved, topo):
    out = replan_json(saved, "--fail-link", "1-0", "-o", "fail.xml", "--schedule-out", "fail.json")
    old = Schedule.load(str(saved / "old.json"))
    assert any((0, 1) in zip(t.path, t.path[1:]) for t in old.transfers)  # the change broke something
    assert out["change"]["link"] == "0-1" and out["replan_time_s"] > 0 and out["verified"] is True
    assert out["old"]["time_on_changed_s"] is None and out["kept_transfers"] > 0
    dgx1 = topo("dgx1")
    changed = fail(dgx1, resolve(dgx1, "0-1", "fail_link"))
    new = Schedule.load(str(saved / "fail.json"))
    assert simulate(changed, new, out["proto"]).finish_time_s == pytest.approx(out["planned_transfer_time_s"])
    assert not any(set(zip(t.path, t.path[1:])) & {(0, 1), (1, 0)} for t in new.transfers)
    with pytest.raises(ScheduleError):
        simulate(changed, old)  # the judge does refuse a schedule that uses the failed link
    assert verify(read_xml(str(saved / "fail.xml"))).ok


def test_one_of_parallel_links_failed_is_checked_on_the_link_left(saved):
    """0-1 on DGX-1 is two NVLinks: with #2 failed the pair stays usable with one; the summary said
    nothing about the changed link (no check line), as if nothing had changed."""
    out = replan_json(saved, "--fail-link", "0-1#2")
    checks = out["checks"]["links"]
    assert sorted(checks) == ["gpu0->gpu1", "gpu1->gpu0"]
    assert all(c["count"] == 1 and not c["failed"] and c["within_capacity"] for c in checks.values())
    assert checks["gpu0->gpu1"]["transfers"] > 0


def test_degraded_link_carries_no_more_than_its_new_capacity(saved, topo):
    out = replan_json(saved, "--degrade", "0-4=0.25", "--schedule-out", "slow.json", "-o", "slow.xml")
    dgx1 = topo("dgx1")
    which = resolve(dgx1, "0-4", "degrade")
    changed = degrade(dgx1, which, 0.25, "degrade")
    assert changed.link(0, 4).bandwidth == pytest.approx(dgx1.link(0, 4).bandwidth / 4)
    new = Schedule.load(str(saved / "slow.json"))
    m = simulate(changed, new)
    for a, b in ((0, 4), (4, 0)):
        link = changed.link(a, b)
        spans = [(s, s + new.demand.chunk_bytes / changed.path_bandwidth(t.path))
                 for t, s in zip(new.transfers, m.starts) if (a, b) in zip(t.path, t.path[1:])]
        for s, _ in spans:  # at any moment, at most `count` transfers, each at most the new bandwidth
            assert sum(1 for x, y in spans if x <= s < y) <= link.count
        assert all(out["checks"]["links"][k]["within_capacity"] for k in out["checks"]["links"])
    assert out["transfer_time_s"] <= out["old"]["time_on_changed_s"] * 1.5


def test_candidates_are_judged_by_the_programs_they_become_and_the_fastest_is_written(saved, topo):
    """With the default lowering (--proto auto, --instances auto), every candidate is realised as
    compile_schedule would (it was lowered with proto 'auto' and 0 instances, which lower() refuses,
    so each was "not lowerable" and the first won): the chosen one's program is the fastest judged,
    and it is the program written (timed again from the XML on the changed topology)."""
    out = replan_json(saved, "--degrade", "0-4=0.25", "-o", "auto.xml", "--schedule-out", "auto.json")
    (chose,) = [n for n in out["notes"] if n.startswith("replan: chose ")]
    assert "not lowerable" not in chose
    label = chose[len("replan: chose "):].split(" by program time (", 1)[0]
    times = {c["label"]: c["program_time_s"] * 1e3 for c in out["candidates"] if c["program_time_s"] is not None}
    assert len(out["candidates"]) >= 3 and label in times
    assert times[label] == min(times.values())
    for c in out["candidates"]:  # one left unjudged could not beat the chosen program, or the time was up
        assert c["program_time_s"] is not None or c["why_not"].startswith("not judged: "), c
        ideal = re.fullmatch(r"not judged: ideal program ([0-9.e+-]+) ms", c["why_not"] or "")
        assert ideal is None or 0.9 * float(ideal[1]) >= min(times.values()), c
    assert out["transfer_time_s"] * 1e3 == pytest.approx(float(times[label]), rel=1e-3)
    dgx1 = topo("dgx1")
    changed = degrade(dgx1, resolve(dgx1, "0-4", "degrade"), 0.25, "degrade")
    program = read_xml(str(saved / "auto.xml"))
    timed = time_program(program, changed, call_bytes(program, out["size_bytes"])).finish_time_s
    assert timed == pytest.approx(out["transfer_time_s"], rel=1e-9)
    assert out["replan_time_s"] <= 1.1 * 3 + 1  # judging keeps to the limit (a second's slack for a loaded machine)


def test_a_change_that_disconnects_is_refused_naming_the_pair(tmp_path):
    proc = run_cli("allgather", "--hw", "dgx-a100", "--size", "1MB", "--method", "direct", "--schedule-out", "s.json",
                   "--no-xml", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    proc = run_cli("replan", "s.json", "--hw", "dgx-a100", "--fail-link", "3-nvswitch", "-o", "x.xml", cwd=tmp_path)
    assert proc.returncode == 2
    (line,) = proc.stderr.strip().splitlines()
    assert "--fail-link 3-nvswitch" in line and "rank 3" in line and "disconnects" in line
    assert not (tmp_path / "x.xml").exists()
    proc = run_cli("replan", "s.json", "--hw", "dgx-a100", "--fail-link", "3-9", cwd=tmp_path)
    assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1 and "no such link" in proc.stderr


def test_link_names_resolve_both_ways_and_parallel_links(topo):
    dgx2 = topo("dgx2", 2)
    assert resolve(dgx2, "nvswitch-19", "x").link.name == "19-nvswitch"
    assert resolve(dgx2, "network-nic2@1", "x").link.name == "nic2@1-netswitch"
    with pytest.raises(CompileError, match="ambiguous"):
        resolve(dgx2, "nic2-netswitch", "x")
    names = [n.name for n in named_links(dgx2)]
    assert len(names) == len(set(names)) == len(dgx2.links) // 2
    dgx1 = topo("dgx1")
    one = resolve(dgx1, "1-0#2", "fail_link")
    assert one.name == "0-1#2" and fail(dgx1, one).link(0, 1).count == 1
    with pytest.raises(CompileError, match="#1..#2"):
        resolve(dgx1, "0-1#3", "fail_link")


def test_profiles_show_lists_link_names(tmp_path):
    proc = run_cli("profiles", "show", "dgx2", "--nodes", "2", "--json", cwd=tmp_path)
    links = json.loads(proc.stdout)["topology"]["links"]
    first = links[0]
    assert {"name", "ends", "bandwidth", "alpha", "count"} <= set(first)
    assert {"3-nvswitch", "nic2@0-netswitch", "4-nic2"} <= {l["name"] for l in links}
    text = run_cli("profiles", "show", "dgx1", cwd=tmp_path).stdout
    assert "names:" in text and "0-1 (x2: 0-1#1..#2)" in text


def test_a_reduction_whose_planner_cannot_plan_the_changed_topology_is_planned_by_auto(tmp_path):
    """Reductions are planned afresh with the old planner; where it cannot plan on the changed topology
    (direct and hier need a one-transfer path between ranks, and a failed link can cut it while relays
    still connect every pair), replan used to stop with that planner's error."""
    proc = run_cli("allreduce", "--hw", "fully-connected:4", "--size", "64KiB", "--method", "direct", "--time-limit",
                   "3", "--workers", "1", "--schedule-out", "s.json", "--no-xml", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    proc = run_cli("replan", "s.json", "--hw", "fully-connected:4", "--fail-link", "0-1", "-o", "x.xml",
                   "--time-limit", "3", "--json", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["verified"] is True
    program = read_xml(str(tmp_path / "x.xml"))
    assert verify(program).ok
    peers = {(g.rank, tb.send) for g in program.gpus for tb in g.tbs} | {(g.rank, tb.recv) for g in program.gpus
                                                                           for tb in g.tbs}
    assert not peers & {(0, 1), (1, 0)}
