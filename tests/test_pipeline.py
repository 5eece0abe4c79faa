"""compiler.pipeline, the one wiring of the stages, and every stage value's JSON round trip."""

import json

import pytest

from backends.msccl_xml import read_xml, to_xml
from compiler.analysis.bounds import Bound, lower_bound
from compiler.analysis.simulate import Metrics, simulate
from compiler.lowering.lower import LowerOptions
from compiler.model.demand import Demand, make_demand
from compiler.model.program import Program
from compiler.model.schedule import Schedule
from compiler.model.timing import TimeExpansion, expand
from compiler.model.topology import Topology
from compiler.pipeline import CompileOptions, LibraryOptions, compile, compile_schedule, library
from compiler.planners import PlanOptions
from compiler.program.verify import verify
from tests.conftest import run_cli


def test_compile_wires_every_stage_and_the_judges_agree(topo):
    t = topo("dgx1")
    result = compile(t, make_demand("allgather", 8, 2**20), CompileOptions(PlanOptions(method="ring")))
    assert result.verdict.ok and result.runtimes == ("old", "executor", "rccl")
    # independent judges: the simulator re-times the schedule, the verifier re-checks the program
    assert simulate(t, result.schedule, result.program.proto) == result.planned
    assert verify(read_xml(to_xml(result.program)), demand=result.demand.split(result.realisation.instances)).ok
    assert result.timing.finish_time_s > 0 and result.timing.ntransfers == len(result.schedule.transfers) * result.realisation.instances
    summary = result.summary()
    assert summary["verified"] and summary["xml"] == "allgather-dgx1.xml" and summary["method"] == "ring"
    assert summary["transfer_time_s"] == result.timing.finish_time_s


def test_compile_schedule_lowers_a_saved_schedule_to_the_same_program(topo, tmp_path):
    t = topo("dgx1")
    first = compile(t, make_demand("reduce_scatter", 8, 2**20), CompileOptions(PlanOptions(method="ring")))
    first.schedule.save(tmp_path / "s.json")
    again = compile_schedule(t, Schedule.load(tmp_path / "s.json"))
    assert to_xml(again.program) == to_xml(first.program)
    assert [f.spelling for f in again.files] == ["all", "old"]  # reduce-scatter: a twin for the old runtime
    ll = compile_schedule(t, Schedule.load(tmp_path / "s.json"), CompileOptions(lower=LowerOptions(proto="LL")))
    assert ll.program.proto == "LL" and ll.verdict.ok


def test_no_xml_and_runtime_targets(topo):
    t = topo("dgx-a100")
    plain = compile(t, make_demand("scatter", 8, 2**20), CompileOptions(PlanOptions(method="direct"), xml=False))
    assert plain.program is None and plain.summary()["xml"] is None
    scatter = compile(t, make_demand("scatter", 8, 2**20), CompileOptions(PlanOptions(method="direct")))
    assert scatter.runtimes == ("executor", "rccl") and scatter.verdict.ok


def test_library_plans_every_band_through_compile(topo):
    t = topo("fully-connected:4")
    lib = library(t, LibraryOptions(("allgather",), (1024, 64 * 1024), band_factor=8, method="direct"))
    names = [n for n, _ in lib.results]
    assert names == ["allgather-00-1.024KB-8.191KB.xml", "allgather-01-8.192KB-65.536KB.xml"]
    assert all(r.verdict.ok for _, r in lib.results)
    bands = [(e["min_bytes"], e["max_bytes"]) for e in lib.manifest["algorithms"]]
    assert bands == [(1024, 8191), (8192, 65536)]


def test_lower_command_writes_the_schedule_s_program(tmp_path):
    run = lambda *a: run_cli(*a, cwd=tmp_path)  # noqa: E731
    assert run("allreduce", "--hw", "dgx1", "--size", "1MB", "--method", "ring", "-o", "a.xml",
               "--schedule-out", "s.json").returncode == 0
    proc = run("lower", "s.json", "--hw", "dgx1", "-o", "b.xml", "--json")
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "a.xml").read_bytes() == (tmp_path / "b.xml").read_bytes()
    assert json.loads(proc.stdout)["verified"] is True
    wrong = run("lower", "s.json", "--hw", "dgx2")
    assert wrong.returncode == 2 and "planned for 'dgx1'" in wrong.stderr and wrong.stderr.count("\n") == 1
    missing = run("lower", "nope.json", "--hw", "dgx1")
    assert missing.returncode == 2 and "nope.json: no such schedule file" in missing.stderr


def test_every_stage_value_round_trips_through_json(topo):
    t = topo("dgx2", 2)
    demand = make_demand("allgather", t.ngpus, 2**20)
    result = compile(t, demand, CompileOptions(PlanOptions(method="hier")))
    through = lambda cls, value: cls.from_dict(json.loads(json.dumps(value.to_dict())))  # noqa: E731
    assert Topology.from_json(t.to_json()) == t
    assert through(Demand, demand) == demand
    te = expand(t, demand)
    assert through(TimeExpansion, te) == te
    assert Schedule.from_json(result.schedule.to_json()) == result.schedule
    m = result.planned
    assert Metrics.from_dict(json.loads(json.dumps(m.to_dict(per_transfer=True)))) == m
    b = lower_bound(t, "allgather", 2**20)
    assert through(Bound, b) == b
    p = Program.from_json(result.program.to_json())
    assert p == result.program and p.notes == result.program.notes and p.notes
