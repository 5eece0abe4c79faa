"""Custom demands end to end: plan, lower, verify, write (the demand travels in the XML), verify,
simulate and run the written file with no extra flags; reductions; refusals for runtimes without
coll="custom". Judges: the verifier (symbolic postcondition), the schedule simulator and the torch
executor against what the demand prescribes."""

import json
from dataclasses import replace

import pytest

from backends.msccl_xml import XmlError, read_xml, to_xml
from compiler.model.demand import load_custom_demand
from compiler.lowering.lower import LowerOptions, lower
from compiler.planners import PlanOptions, plan
from compiler.model.program import Program
from compiler.analysis.simulate import simulate
from compiler.program.verify import verify
from tests.conftest import run_cli

REDUCTIONS = {
    # the README's example with "reduce": true: one contributor per chunk (planned "within 0 epochs" before)
    "one-contributor": {"chunks": [{"from": 0, "to": [1, 2]}, {"from": 3, "to": [0]}], "reduce": True},
    "one-destination": {"chunks": [{"from": [0, 1, 2], "to": [3]}, {"from": [1, 2, 3], "to": [0]}], "reduce": True},
    "several-destinations": {"chunks": [{"from": [0, 1, 2], "to": [3]}, {"from": [1, 2, 3], "to": [0, 2]},
                                        {"from": [0, 1], "to": [0]}], "reduce": True},
}
HW = "fully-connected:4"
COPY = {"chunks": [{"from": 0, "to": [2]}, {"from": 1, "to": [2, 3]}]}


def demand_file(tmp_path, doc, name="d.json"):
    path = tmp_path / name
    path.write_text(json.dumps(doc))
    return path


def compiled(tmp_path, topo, doc, method, name="d.json") -> Program:
    demand = load_custom_demand(str(demand_file(tmp_path, doc, name)), topo.ngpus, 1 << 20)
    schedule = plan(topo, demand, PlanOptions(method=method, time_limit=20, refine=False))
    simulate(topo, schedule)  # refuses a schedule that leaves a need unmet
    return lower(schedule, topo, LowerOptions(runtime="old"))


@pytest.mark.parametrize("method", ["milp", "rounds", "ring", "direct"])
@pytest.mark.parametrize("name", REDUCTIONS)
def test_reduction_demands_plan_lower_and_verify(tmp_path, topo, name, method):
    program = compiled(tmp_path, topo(HW), REDUCTIONS[name], method)
    assert program.demand is not None and program.demand.reduce
    v = verify(read_xml(to_xml(program, "old")))  # the written file, judged with the demand it carries
    assert v.ok and v.runtimes == ("old",), v.summary()


def test_reductions_run_to_the_full_sum(tmp_path, topo):
    from backends.torch_dist import run_local_many
    programs = [compiled(tmp_path, topo(HW), doc, "milp", f"{k}.json") for k, doc in enumerate(REDUCTIONS.values())]
    for op in ("sum", "max"):
        for r in run_local_many(programs, 4, 1 << 12, op=op, iters=1):
            assert r.correct, r.summary()


def test_demand_travels_with_the_program(tmp_path, topo):
    p = compiled(tmp_path, topo(HW), REDUCTIONS["several-destinations"], "milp")
    xml = to_xml(p, "old")
    lines = xml.splitlines()
    assert lines[0].startswith("<algo ") and lines[1].startswith("  <!-- msccl-compile demand {")
    assert xml.count("<!--") == 1 and '"runtimes":["old"]' in lines[1]
    assert read_xml(xml) == p and read_xml(xml).demand == p.demand
    assert Program.from_json(p.to_json()) == p
    moved = xml.replace(lines[1] + "\n", "").replace("<algo ", lines[1].strip() + "\n<algo ", 1)
    assert read_xml(moved).demand == p.demand  # before <algo> is read too
    standard = replace(p, collective="allreduce", demand=None)
    assert "<!--" not in to_xml(standard)
    assert read_xml(xml.replace('coll="custom"', 'coll="allreduce"')).demand is None  # only custom files carry one


@pytest.mark.parametrize("edit,needle", [
    (lambda t: t.replace('"ngpus":4', '"ngpus":5'), "ngpus 5 does not match"),
    (lambda t: t.replace('"reduce":false', '"reduce":fals'), "is not a demand (JSONDecodeError"),
    (lambda t: t.replace('"chunks":', '"chunkz":'), "is not a demand (KeyError"),
    (lambda t: t.replace('"chunks":[[0,[', '"chunks":[[0,[9,', 1), "chunk 0"),
    (lambda t: t.replace("-->", "-->\n  <!-- msccl-compile demand {} -->", 1), "appears 2 times"),
])
def test_bad_demand_comment_is_one_line(tmp_path, topo, edit, needle):
    p = compiled(tmp_path, topo(HW), COPY, "direct")
    path = tmp_path / "bad.xml"
    path.write_text(edit(to_xml(p, "old")))
    with pytest.raises(XmlError) as e:
        read_xml(str(path))
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith(f"{path}: algo: <!-- msccl-compile demand -->:") and needle in msg
    proc = run_cli("verify", str(path), cwd=tmp_path)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr


def test_custom_file_verify_simulate_run_without_flags(tmp_path):
    demand_file(tmp_path, COPY)
    proc = run_cli("custom", "--hw", HW, "--demand", "d.json", "--size", "64MB", "--method", "milp",
                   "--chunks", "2", "-o", "c.xml", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "64MB per chunk, 2 chunks (128MB in all), each cut into 2 pieces" in proc.stdout.splitlines()[0]
    out = json.loads(run_cli("custom", "--hw", HW, "--demand", "d.json", "--size", "64MB", "--method", "milp",
                             "--chunks", "2", "-o", "c.xml", "--json", cwd=tmp_path).stdout)
    assert (out["size_bytes"], out["chunk_size_bytes"], out["demand_chunks"]) == (128 * 10**6, 64 * 10**6, 2)
    assert out["verified_for"] == ["old"]
    proc = run_cli("verify", "c.xml", cwd=tmp_path)
    assert proc.returncode == 0 and "correct for runtime old" in proc.stdout, proc.stdout + proc.stderr
    sim = json.loads(run_cli("simulate", "c.xml", "--hw", HW, "--size", "64MB", "--json", cwd=tmp_path).stdout)
    assert sim["time_s"] == pytest.approx(out["transfer_time_s"]) and sim["size_bytes"] == 128 * 10**6
    proc = run_cli("run", "c.xml", "--nprocs", "4", "--size", "64KB", "--iters", "1", cwd=tmp_path)
    assert proc.returncode == 0 and ": correct;" in proc.stdout, proc.stdout + proc.stderr
    # --demand still overrides the embedded demand
    demand_file(tmp_path, {"chunks": [{"from": 0, "to": [3]}, {"from": 1, "to": [2, 3]}]}, "other.json")
    proc = run_cli("verify", "c.xml", "--demand", "other.json", cwd=tmp_path)
    assert proc.returncode == 1 and "[postcondition]" in proc.stdout


def test_wrong_custom_program_is_named(tmp_path, topo):
    from backends.torch_dist import run_local
    p = compiled(tmp_path, topo(HW), COPY, "direct")
    g = p.gpus[2]  # rank 2 receives chunk 0 into o[0] and chunk 1 into o[1]: swap them
    swapped = [replace(tb, steps=tuple(replace(s, dstoff=1 - s.dstoff) if s.type in ("r", "rcs") and s.dstbuf == "o"
                                       else s for s in tb.steps)) for tb in g.tbs]
    bad = replace(p, gpus=p.gpus[:2] + (replace(g, tbs=tuple(swapped)),) + p.gpus[3:])
    (tmp_path / "bad.xml").write_text(to_xml(bad, "old"))
    proc = run_cli("verify", "bad.xml", cwd=tmp_path)
    assert proc.returncode == 1
    assert "[postcondition] postcondition: rank 2: o[0] should hold rank 0's i[0]" in proc.stdout
    r = run_local(str(tmp_path / "bad.xml"), 4, 1 << 12, iters=1)
    assert not r.correct and r.first_wrong == (2, 0), r.summary()


@pytest.mark.parametrize("runtime", ["executor", "rccl"])
def test_runtimes_without_custom_refuse_up_front(tmp_path, runtime):
    proc = run_cli("custom", "--hw", HW, "--demand", "missing.json", "--runtime", runtime, "-o", "c.xml",
                   cwd=tmp_path)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1, proc.stderr
    assert f"--runtime: {runtime} cannot run custom" in proc.stderr and "old" in proc.stderr
    assert list(tmp_path.iterdir()) == []  # refused before reading the demand, planning or writing


def test_run_refuses_custom_without_its_demand(tmp_path, topo):
    p = compiled(tmp_path, topo(HW), COPY, "direct")
    (tmp_path / "c.xml").write_text(to_xml(replace(p, demand=None), "old"))
    proc = run_cli("run", "c.xml", "--nprocs", "4", cwd=tmp_path)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and "carries no demand" in proc.stderr


@pytest.mark.parametrize("doc", [{"chunks": [{"from": 0, "to": [0]}]},
                                 {"chunks": [{"from": 1, "to": [1]}], "reduce": True}])
def test_a_demand_that_moves_nothing_is_refused_in_one_line(tmp_path, doc):
    """Its program would take no time: an infinite algbw, and JSON with Infinity in it."""
    (tmp_path / "d.json").write_text(json.dumps(doc))
    proc = run_cli("custom", "--hw", "dgx-a100", "--demand", "d.json", "--json", cwd=tmp_path)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1, proc.stderr
    assert "d.json: chunks: no chunk has to move" in proc.stderr
    assert [p.name for p in tmp_path.iterdir()] == ["d.json"]
    moving = {"chunks": doc["chunks"] + [{"from": 0, "to": [1]}], "reduce": doc.get("reduce", False)}
    (tmp_path / "d.json").write_text(json.dumps(moving))  # one chunk that moves: planned as before
    assert run_cli("custom", "--hw", "dgx-a100", "--demand", "d.json", "--no-xml", cwd=tmp_path).returncode == 0
