"""`msccl-compile calibrate`: bench results "measured" on a profile whose runtime costs the fit is not
shown (the timer under hidden constants, with a few per cent of noise) must give back those
constants, and the written profile must time the measured programs as measured."""

import json
import math
from importlib import resources

import pytest

from backends.bench.results import BenchResult, BenchRow, SideResult
from backends.msccl_xml import read_xml, to_xml
from compiler.lowering.lower import LowerOptions, lower
from compiler.model.demand import make_demand
from compiler.model.profiles import load_topology
from compiler.planners import PlanOptions, plan
from compiler.program.timing import time_program
from compiler.specs.collectives import COLLECTIVES
from tests.conftest import run_cli

HIDDEN = {  # the GPUs' "true" costs; the stock hopper values are LL 6.6 us / 0.6 us / 12.9 GB/s, Simple 8.4 / 3.4 / 38.7
    "LL": {"launch_us": 9.0, "step_us": {"nvlink": 1.0}, "tb_GBps": {"nvlink": 10.0}},
    "Simple": {"launch_us": 12.0, "step_us": {"nvlink": 5.0}, "tb_GBps": {"nvlink": 30.0}},
}
SIZES = (4096, 65536, 1 << 20, 1 << 24, 1 << 28)
PORT_GBPS = 450  # one H100's NVLink bandwidth to the NVSwitch (hw_profiles/dgx-h100.json)
EFFICIENCY = {"LL": 0.5, "Simple": 1.0}


def lanes(proto: str, tb_GBps: float) -> int:
    return max(1, int(PORT_GBPS * EFFICIENCY[proto] / tb_GBps + 1e-9))


@pytest.fixture(scope="module")
def measured(tmp_path_factory):
    """(directory, the XML files, the bench results) of four programs on one DGX H100."""
    d = tmp_path_factory.mktemp("calibrate")
    doc = json.loads(resources.files("hw_profiles").joinpath("dgx-h100.json").read_text(encoding="utf-8"))
    doc.update(name="hidden", runtime={"generation": "hopper", "protocols": HIDDEN})
    doc.pop("aliases", None)
    (d / "hidden.json").write_text(json.dumps(doc))
    truth = load_topology(str(d / "hidden.json"))
    stock = load_topology("dgx-h100")
    results = []
    for method in ("ring", "direct"):
        schedule = plan(stock, make_demand("allgather", 8, 10**6), PlanOptions(method=method))
        for proto in HIDDEN:
            xml = d / f"ag-{method}-{proto}.xml"
            xml.write_text(to_xml(lower(schedule, stock, LowerOptions(proto=proto, instances=1))))
            program = read_xml(xml)
            rows = []
            for i, size in enumerate(SIZES):
                t = time_program(program, truth, size).finish_time_s * (1 + 0.02 * math.sin(3 * i + len(method)))
                rows.append(BenchRow(size, size // 32, "float32", "sum", None,
                                     SideResult(t * 1e6, size / t / 1e9, size / t / 1e9, 0), xml.name))
            # a row whose result was wrong: its time says nothing about the program and must be left out
            rows.append(BenchRow(1 << 22, 1 << 17, "float32", "sum", None, SideResult(1e6, 0.004, 0.004, 3), xml.name))
            result = d / f"bench-{method}-{proto}.json"
            result.write_text(BenchResult("allgather", 8, "float32", "sum", False, "nccl", "runtime executor", 20, 5,
                                          tuple(rows)).to_json())
            results.append(result)
    return d, results


def test_calibrate_recovers_the_hidden_costs(measured):
    d, results = measured
    out = d / "calibrated.json"
    r = run_cli("calibrate", *results, "--algos", d, "--hw", "dgx-h100", "-o", out, "--json")
    assert r.returncode == 0, r.stderr
    summary = json.loads(r.stdout)
    assert summary["rows"] == 20 and len(summary["notes"]) == 4  # the wrong rows, said and left out
    assert summary["error_before"] > 0.2 and summary["error_after"] < 0.03
    assert all(not p["outliers"] for p in summary["protocols"].values())
    written = json.loads(out.read_text())["runtime"]["protocols"]
    assert set(written) == set(HIDDEN)  # LL128 was not measured: the generation's values stand
    for proto in HIDDEN:
        found_the_hidden_costs(written, proto)
    # the written profile, loaded as any --hw file, times the programs as the GPUs did (within the noise)
    topo = load_topology(str(out))
    for result in results:
        for row in BenchResult.load(result).rows[:-1]:
            model = time_program(read_xml(d / row.algo), topo, row.size_bytes).finish_time_s * 1e6
            assert model == pytest.approx(row.msccl.time_us, rel=0.04), (result.name, row.size_bytes)


def test_calibrate_same_input_same_bytes(measured, tmp_path):
    d, results = measured
    simple = [r for r in results if r.name == "bench-direct-Simple.json"]  # the quickest to fit
    outs = [tmp_path / "a.json", tmp_path / "b.json"]
    for out in outs:
        assert run_cli("calibrate", *simple, "--algos", d, "--hw", "dgx-h100", "-o", out).returncode == 0
    assert outs[0].read_bytes() == outs[1].read_bytes()


def found_the_hidden_costs(written: dict, proto: str) -> None:
    got, hidden = written[proto], HIDDEN[proto]
    assert got["launch_us"] == pytest.approx(hidden["launch_us"], rel=0.05), proto
    assert got["step_us"]["nvlink"] == pytest.approx(hidden["step_us"]["nvlink"], rel=0.12), proto
    assert lanes(proto, got["tb_GBps"]["nvlink"]) == lanes(proto, hidden["tb_GBps"]["nvlink"]), proto


@pytest.mark.long
def test_calibrate_leaves_out_a_glitched_row(measured, tmp_path):
    """One LL row measured four times too slow (a hiccup on the GPUs) would pull a least-squares
    fit; it is named, left out, and the hidden costs are found from the others."""
    d, results = measured
    ll = [r for r in results if r.name.endswith("-LL.json")]
    doc = json.loads(ll[0].read_text())
    doc["rows"][2]["msccl"]["time_us"] *= 4
    glitched = tmp_path / ll[0].name
    glitched.write_text(json.dumps(doc))
    out = tmp_path / "calibrated.json"
    r = run_cli("calibrate", glitched, ll[1], "--algos", d, "--hw", "dgx-h100", "-o", out, "--json")
    assert r.returncode == 0, r.stderr
    summary = json.loads(r.stdout)
    row = f"{glitched.name} {doc['rows'][2]['size_bytes']} B {doc['rows'][2]['algo']}"
    assert summary["protocols"]["LL"]["outliers"] == [row], json.dumps(summary["measurements"])
    assert any(n.startswith(f"{row}: left out of LL's fit") for n in summary["notes"])
    found_the_hidden_costs(json.loads(out.read_text())["runtime"]["protocols"], "LL")


def _one_row(d, name="one.json", **change):
    doc = json.loads(BenchResult("allgather", 8, "float32", "sum", False, "nccl", "runtime executor", 20, 5, (
        BenchRow(65536, 2048, "float32", "sum", None, SideResult(20.0, 3.2, 2.8, 0), "ag-ring-LL.xml"),)).to_json())
    for path, value in change.items():
        *keys, last = path.split("__")
        node = doc
        for k in keys:
            node = node[int(k)] if k.isdigit() else node[k]
        node[int(last) if last.isdigit() else last] = value
    (d / name).write_text(json.dumps(doc))
    return d / name


@pytest.mark.parametrize("change, says", [
    ({"nprocs": 16}, "one.json: nprocs: 16 ranks ran it, but dgx-h100 has 8 GPUs"),
    ({"rows__0__algo": "missing.xml"}, "one.json: rows[0].algo: 'missing.xml' is not among the --algos files"),
    ({"rows__0__msccl__time_us": -1}, "one.json: rows[0].msccl.time_us: -1 is not a positive finite number"),
    ({"rows__0": "x"}, "one.json: rows[0]: 'x' is not an object"),
    ({"rows__0__algo": ["a"]}, "one.json: rows[0].algo: ['a'] is not among the --algos files"),
    ({"format": "nccl-tests"}, "one.json: format: 'nccl-tests' is not 'msccl-compile/bench-v1' (a bench result's JSON)"),
    ({"collective": "sendrecv"}, "one.json: collective: 'sendrecv' is not one of " + ", ".join(COLLECTIVES)),
    ({"collective": "alltoall"}, "one.json: rows[0].algo: ag-ring-LL.xml is a program of allgather, the "
                                 "result of 'alltoall'"),
])
def test_calibrate_refuses_bad_results_in_one_line(measured, tmp_path, change, says):
    d, _ = measured
    out = tmp_path / "p.json"
    r = run_cli("calibrate", _one_row(tmp_path, **change), "--algos", d, "--hw", "dgx-h100", "-o", out)
    assert r.returncode == 2 and r.stdout == ""
    assert r.stderr.strip().endswith(says) and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert not out.exists()


def test_calibrate_kinds_must_be_the_profiles(measured, tmp_path):
    d, results = measured
    r = run_cli("calibrate", results[0], "--algos", d, "--hw", "dgx-h100", "--kinds", "network", "-o", tmp_path / "p.json")
    assert r.returncode == 2 and r.stderr.strip().endswith(
        "--kinds: network: dgx-h100 has no network links (has: nvlink)"), r.stderr
    assert not (tmp_path / "p.json").exists()
