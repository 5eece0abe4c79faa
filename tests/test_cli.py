"""The command line end to end: plan, simulate, lower, verify, write; verify and simulate files."""

import json

import pytest

from compiler.analysis.simulate import simulate
from compiler.model.profiles import load_topology
from compiler.model.schedule import Schedule
from lxml import etree

from backends.msccl_xml import read_xml
from compiler.program.verify import verify
from tests.conftest import run_cli

ISSUE3_KEYS = {"collective", "hw", "nodes", "ngpus", "size_bytes", "chunks", "method", "status", "solve_time_s",
               "epochs", "transfer_time_s", "algbw_GBps", "busbw_GBps", "lower_bound_s", "bound_ratio",
               "output_buffer_bytes"}
ISSUE4_KEYS = {"xml", "nchannels", "nthreadblocks_max", "nsteps_max", "verified"}


def compile_json(tmp_path, *args):
    proc = run_cli(*args, "--json", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def test_allgather_dgx2_json_and_files(tmp_path):
    out = compile_json(tmp_path, "allgather", "--hw", "dgx2", "--schedule-out", "s.json")
    assert ISSUE3_KEYS | ISSUE4_KEYS <= set(out)
    assert out["ngpus"] == 16 and out["verified"] is True
    # the schedule in alpha-beta (the simulator, an independent judge) is optimal; the program and
    # the ideal program pay the runtime's launch and steps, so neither beats the bound of any program
    schedule = Schedule.load(tmp_path / "s.json")
    assert simulate(load_topology("dgx2"), schedule).bound_ratio >= 0.99
    assert 0 < out["bound_ratio"] <= 1 + 1e-9 and 0 < out["planned_bound_ratio"] <= 1 + 1e-9
    xml = tmp_path / out["xml"]
    assert xml.name == "allgather-dgx2.xml" and (tmp_path / "s.json").is_file()
    etree.fromstring(xml.read_bytes())
    program = read_xml(str(xml))
    assert verify(program).ok
    assert program.nthreadblocks_max == out["nthreadblocks_max"] and program.nsteps_max == out["nsteps_max"]
    # the simulate command times the written file like the compile command did
    sim = compile_json(tmp_path, "simulate", out["xml"], "--hw", "dgx2", "--size", "1GB")
    assert sim["time_s"] == pytest.approx(out["transfer_time_s"])
    assert "warning" not in sim  # the chunks of the written file are whole elements at the size it was compiled for
    # at a size that does not split into its chunks the runtimes would not run the file: the timer says so
    odd = run_cli("simulate", out["xml"], "--hw", "dgx2", "--size", "1000000004B", cwd=tmp_path)
    assert odd.returncode == 0 and "warning: --size 1000000004B is not whole 4-byte elements" in odd.stderr
    assert run_cli("verify", out["xml"], cwd=tmp_path).returncode == 0


NAMES = ["allgather", "alltoall", "reduce-scatter", "reduce_scatter", "reducescatter", "ReduceScatter",
         "allreduce", "broadcast", "reduce", "scatter", "gather"]


CASES = [(name, "hub-and-spoke:4") for name in NAMES] + \
    [(name, "mi250") for name in NAMES if name in ("allgather", "alltoall", "reduce-scatter", "allreduce", "broadcast",
                                                   "reduce", "scatter", "gather")]


@pytest.mark.parametrize("name,hw", CASES)
def test_every_collective_end_to_end(tmp_path, name, hw):
    """Every collective, each spelling on the small topology, each collective once on MI250."""
    # a short limit: what is checked is that every collective plans, lowers, verifies and writes, not
    # how good its program is (tests/test_program_costs.py and the benchmarks judge that)
    out = compile_json(tmp_path, name, "--hw", hw, "--size", "1MB", "--time-limit", "2", "-o", "a.xml")
    assert out["verified"] and out["xml"] == "a.xml"
    text = (tmp_path / "a.xml").read_text()
    etree.fromstring(text.encode())
    program = read_xml(text)
    for runtime in out["verified_for"]:
        # reduce-scatter's old runtime reads its own spelling, written beside (a.legacy.xml)
        legacy = out["collective"] == "reduce_scatter" and runtime == "old"
        assert verify(read_xml(tmp_path / "a.legacy.xml") if legacy else program, runtime).ok
    assert 0 < out["bound_ratio"] <= 1 + 1e-9
    if out["collective"] == "reduce_scatter" and "old" in out["verified_for"]:  # the old runtime runs on NVIDIA GPUs
        assert (tmp_path / "a.legacy.xml").is_file() and 'coll="reduce_scatter"' in (tmp_path / "a.legacy.xml").read_text()
        assert 'coll="reducescatter"' in text


@pytest.mark.parametrize("args", [
    ("allgather", "--hw", "mi250", "--size", "64MB", "--method", "milp", "--chunks", "2"),  # solved to optimality
    ("alltoall", "--hw", "dgx2", "--nodes", "2", "--size", "64MB", "--method", "lp"),  # symmetry, LP, rounding
], ids=["milp", "lp"])
def test_same_input_same_bytes(tmp_path, args):
    """Two runs in fresh processes write the same bytes (cases whose solver stops on optimality, not
    on a time limit: a time limit cuts the search wherever the clock says)."""
    for d in ("one", "two"):
        (tmp_path / d).mkdir()
        compile_json(tmp_path / d, *args, "-o", "f.xml", "--schedule-out", "s.json")
    for name in ("f.xml", "s.json"):
        one, two = (tmp_path / "one" / name).read_bytes(), (tmp_path / "two" / name).read_bytes()
        assert one == two if name == "f.xml" else json.loads(one)["transfers"] == json.loads(two)["transfers"]


def test_size_range_protocol_and_instances(tmp_path):
    out = compile_json(tmp_path, "allgather", "--hw", "dgx-a100", "--size-range", "1MB:64MB", "--proto", "LL",
                       "--instances", "2", "--time-limit", "3", "-o", "b.xml")
    root = etree.fromstring((tmp_path / "b.xml").read_bytes())
    assert root.get("minBytes") == "1000000" and root.get("maxBytes") == str(64 * 10**6 - 1)
    assert root.get("proto") == "LL" and out["nchannels"] >= 2


def test_verify_rejects_a_broken_file_and_names_the_rule(tmp_path):
    compile_json(tmp_path, "allgather", "--hw", "hub-and-spoke:4", "-o", "ok.xml")
    text = (tmp_path / "ok.xml").read_text()
    broken = text.replace('type="r"', 'type="s"', 1)
    (tmp_path / "bad.xml").write_text(broken)
    proc = run_cli("verify", "bad.xml", "--json", cwd=tmp_path)
    assert proc.returncode == 1
    report = json.loads(proc.stdout)
    assert not report["verified"] and report["findings"][0]["rule"]


def test_no_half_written_file_on_error(tmp_path):
    proc = run_cli("allgather", "--hw", "dgx2", "--max-horizon", "2", "--method", "milp", "-o", "x.xml", cwd=tmp_path)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1
    assert list(tmp_path.iterdir()) == []


ONE_FILE = [  # two outputs that are one file, or an output that is the input: the last write replaced the
    # other and both were reported written (a report's -o replaced the XML it read)
    (("allgather", "--hw", "dgx1", "--method", "ring", "-o", "a.xml", "--schedule-out", "a.xml"),
     "--schedule-out: a.xml is also -o's file"),
    (("allgather", "--hw", "dgx1", "--method", "ring", "-o", "a.xml", "--report", "./a.xml"), "--report: ./a.xml"),
    (("reduce_scatter", "--hw", "dgx1", "--method", "ring", "-o", "a.xml", "--schedule-out", "a.legacy.xml"),
     "the old runtime's twin of -o's file"),
    (("report", "in.xml", "--hw", "dgx1", "--size", "1MB", "-o", "in.xml"), "-o: in.xml is also the input file"),
    (("report", "in.xml", "--hw", "dgx1", "--size", "1MB", "-o", "r.html", "--png", "r.html"), "--png: r.html"),
    (("lower", "in.json", "--hw", "dgx1", "-o", "in.json"), "-o: in.json is also the input file"),
    (("replan", "in.json", "--hw", "dgx1", "--degrade", "0-4=0.5", "-o", "in.json"), "-o: in.json is also the input"),
    # and an -o that names no file written (it went unsaid, or fell back to the default name)
    (("allgather", "--hw", "dgx1", "--no-xml", "-o", "a.xml"), "-o: a.xml would not be written: --no-xml"),
    (("allgather", "--hw", "dgx1", "--method", "ring", "-o", ""), "-o: the path is empty"),
]


@pytest.mark.parametrize("args,needle", ONE_FILE, ids=[" ".join(a[:1] + a[-4:]) for a, _ in ONE_FILE])
def test_an_output_that_is_another_output_or_the_input_is_refused_before_any_work(tmp_path, args, needle):
    (tmp_path / "in.xml").write_text("<algo/>")  # refused before either is read
    (tmp_path / "in.json").write_text("{}")
    proc = run_cli(*args, cwd=tmp_path)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and needle in proc.stderr, proc.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.json", "in.xml"]
    assert (tmp_path / "in.xml").read_text() == "<algo/>" and (tmp_path / "in.json").read_text() == "{}"


@pytest.mark.parametrize("args,needle", [
    (("allgather", "--hw", "dgx2", "--proto", "LL256"), "--proto"),
    (("allgather", "--hw", "dgx2", "--size-range", "1GB:1MB"), "LO above HI"),
    (("allgather", "--hw", "dgx2", "--runtime", "nccl"), "--runtime"),
    # a runtime that does not run on the profile's GPUs: written and verified for a machine it cannot run on
    (("allgather", "--hw", "dgx1", "--runtime", "rccl"), "--runtime: rccl runs on amd GPUs, and dgx1's are nvidia"),
    (("library", "--hw", "mi250", "--runtime", "executor", "-o", "lib"), "executor runs on nvidia GPUs"),
    (("simulate", "missing.xml", "--hw", "dgx2"), "missing.xml: no such XML file"),
    (("lp-plan", "--hw", "dgx2"), "unknown command or collective"),
    (("alltoall", "--hw", "dgx2", "--method", "lp", "--chunks", "0"), "--chunks"),
    # 8 ranks x 13 chunks do not divide 10^9 bytes' 2.5e8 float32 elements: refused before any planning
    (("alltoall", "--hw", "dgx-a100", "--size", "1GB", "--instances", "13"), "--instances: 13 cuts"),
    (("allgather", "--hw", "dgx2", "--instances", "1000"), "--instances: 1000 needs 1000 channels; MSCCL allows 32"),
    # bands of factor 1 never reach HI: the command ran until it was killed
    (("library", "--hw", "dgx-a100", "--sizes", "1KB:1MB", "--band-factor", "1", "-o", "lib"),
     "--band-factor: '1' must be >= 2"),
    # a limit the platform's lock timeouts cannot hold: OverflowError after planning
    (("allgather", "--hw", "dgx2", "--time-limit", "inf"), "--time-limit: 'inf' is not a finite number"),
    (("allgather", "--hw", "dgx2", "--time-limit", "1e12"), "--time-limit: '1e12' must be <= 604800 (a week"),
    (("library", "--hw", "dgx2", "--time-limit", "nan", "-o", "lib"), "--time-limit: 'nan' is not a finite number"),
    (("bench", "allreduce", "--timeout", "-1"), "--timeout: '-1' must be >= 1"),
])
def test_cli_errors(tmp_path, args, needle):
    proc = run_cli(*args, cwd=tmp_path)
    assert proc.returncode == 2 and needle in proc.stderr and proc.stderr.count("\n") == 1, proc.stderr


def test_a_protocol_the_profile_does_not_enable_is_refused_before_planning(tmp_path, monkeypatch, capsys):
    """mi250's runtime enables Simple and LL: --proto LL128 was refused naming --runtime, and with
    --method auto only after every candidate was planned; every command taking --proto says so first."""
    import signal
    from compiler.cli.main import main
    monkeypatch.setattr(signal, "signal", lambda *a: None)  # main's handlers would be pytest's process's
    monkeypatch.chdir(tmp_path)  # in this process: five commands' imports in fresh ones took 8 s
    assert main(["allgather", "--hw", "mi250", "--method", "ring", "--size", "1MB", "--no-xml",
                 "--schedule-out", "s.json"]) == 0
    capsys.readouterr()
    (tmp_path / "jobs.json").write_text("{}")  # refused before it is read
    needle = "--proto: LL128 is not enabled on mi250 (its runtime has Simple, LL)"
    for args in (("allgather", "--method", "auto", "--size", "1MB", "--time-limit", "2", "-o", "x.xml"),
                 ("library", "--runtime", "rccl", "--time-limit", "2", "-o", "lib"),
                 ("jobs", "jobs.json", "--time-limit", "2", "-o", "out"), ("lower", "s.json", "-o", "x.xml"),
                 ("replan", "s.json", "--size", "2MB", "--time-limit", "2", "-o", "x.xml")):
        rc = main([*args, "--hw", "mi250", "--proto", "LL128"])
        err = capsys.readouterr().err
        assert rc == 2 and err.count("\n") == 1 and needle in err, (args, err)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["jobs.json", "s.json"]


def test_verbose_solver_log_goes_to_stderr(tmp_path):
    proc = run_cli("allgather", "--hw", "mi250", "--method", "milp", "--chunks", "2", "--verbose", "--json",
                   "--no-xml", cwd=tmp_path)
    assert proc.returncode == 0
    json.loads(proc.stdout)  # stdout holds the JSON and nothing else
    assert "MIP" in proc.stderr


def test_progress_reports_only_after_two_seconds(monkeypatch, capsys):
    import time
    import compiler.cli.main as cli
    clock = iter([0.0, 1.0, 3.0])
    monkeypatch.setattr(time, "perf_counter", lambda: next(clock))
    report = cli.Progress(True)
    report("early")
    report("horizon 30 epochs: feasible")
    err = capsys.readouterr().err
    assert "early" not in err and "horizon 30 epochs: feasible" in err and err.startswith("[   3.0s]")


def test_json_has_no_infinity_or_nan(capsys):
    from compiler.cli.common import emit_json
    emit_json({"algbw_GBps": float("inf"), "rows": [{"t": float("nan")}, (1.5, -float("inf"))], "n": 3})
    strict = json.loads(capsys.readouterr().out, parse_constant=lambda c: pytest.fail(f"{c} is not JSON"))
    assert strict == {"algbw_GBps": None, "rows": [{"t": None}, [1.5, None]], "n": 3}


def test_verify_and_simulate_print_what_the_reader_accepted_with_a_warning(tmp_path):
    """A step numbered off its position (the runtimes number steps by position: a dependency on it
    may misfire) was read with a note no command printed: verify said "correct", nothing else."""
    assert run_cli("allgather", "--hw", "dgx1", "--size", "1MB", "--method", "ring", "-o", "a.xml",
                   cwd=tmp_path).returncode == 0
    text = (tmp_path / "a.xml").read_text()
    assert text.count(' s="1" ') > 0
    (tmp_path / "b.xml").write_text(text.replace(' s="1" ', ' s="7" ', 1))
    for args in (("verify", "a.xml"), ("simulate", "a.xml", "--hw", "dgx1", "--size", "1MB")):
        assert run_cli(*args, cwd=tmp_path).stderr == ""  # our own files read without a warning
    for args in (("verify", "b.xml"), ("simulate", "b.xml", "--hw", "dgx1", "--size", "1MB")):  # report: simulate's
        proc = run_cli(*args, cwd=tmp_path)
        assert proc.returncode == 0, proc.stderr
        assert proc.stderr.count("\n") == 1 and 's="7" differs from its position 1' in proc.stderr, proc.stderr
    for args in (("verify", "b.xml", "--json"), ("simulate", "b.xml", "--hw", "dgx1", "--size", "1MB", "--json")):
        warned = json.loads(run_cli(*args, cwd=tmp_path).stdout)["reader_warnings"]
        assert len(warned) == 1 and "differs from its position" in warned[0]


def test_errors_in_a_schedule_or_program_file_name_the_file(tmp_path):
    """lower said "schedule: chunk 1 never reaches rank 0", and simulate and report "simulate: rank 0
    tb 0 step 0 can never run", without the file that has it."""
    assert run_cli("allgather", "--hw", "dgx1", "--size", "1MB", "--method", "ring", "-o", "a.xml",
                   "--schedule-out", "a.json", cwd=tmp_path).returncode == 0
    doc = json.loads((tmp_path / "a.json").read_text())
    (tmp_path / "drop.json").write_text(json.dumps({**doc, "transfers": doc["transfers"][1:]}))
    proc = run_cli("lower", "drop.json", "--hw", "dgx1", cwd=tmp_path)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1
    assert "error: drop.json: " in proc.stderr and "chunk" in proc.stderr, proc.stderr
    tree = etree.parse(str(tmp_path / "a.xml"))
    tbs = tree.getroot().find("gpu").findall("tb")
    for mine, other in ((tbs[0], tbs[1]), (tbs[1], tbs[0])):  # each first step waits for the other's: a cycle
        mine.find("step").attrib.update({"depid": other.get("id"), "deps": "0", "hasdep": "1"})
    tree.write(str(tmp_path / "cyc.xml"))
    for args in (("simulate", "cyc.xml", "--hw", "dgx1", "--size", "1MB"),
                 ("report", "cyc.xml", "--hw", "dgx1", "--size", "1MB", "--no-ring", "-o", "r.html")):
        proc = run_cli(*args, cwd=tmp_path)
        assert proc.returncode == 2 and proc.stderr.count("\n") == 1
        assert "error: cyc.xml: rank 0 tb 0 step 0 can never run" in proc.stderr, proc.stderr
    assert not (tmp_path / "r.html").exists()


def test_options_that_cannot_apply_are_said(tmp_path):
    """verify --demand on a file that is not custom judged the file against that demand (exit 1,
    a postcondition failure); --multicast on a profile with no multicast switch changed nothing, unsaid."""
    proc = run_cli("allgather", "--hw", "dgx1", "--size", "1MB", "--method", "ring", "--multicast", "-o", "a.xml",
                   cwd=tmp_path)
    assert proc.returncode == 0 and "warning: --multicast: dgx1 has no switch that multicasts" in proc.stderr
    (tmp_path / "d.json").write_text(json.dumps({"chunks": [{"from": 0, "to": [1]}]}))
    proc = run_cli("verify", "a.xml", "--demand", "d.json", cwd=tmp_path)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1
    assert "--demand: a.xml is coll=allgather, not custom" in proc.stderr, proc.stderr


def test_profiles_list_with_a_name_is_refused():
    # it listed every profile, the name unread
    proc = run_cli("profiles", "list", "dgx1")
    assert proc.returncode == 2 and "profiles show dgx1" in proc.stderr and proc.stdout == ""


def test_compile_says_which_sizes_the_runtimes_run_the_file_at(tmp_path):
    """The runtimes run a file only where its nchunksperloop divides the element count: 10 instances
    of DGX A100 allgather at 10^9 B (nchunksperloop 80) run at multiples of 320 B, not at 1 GiB,
    and the compile says so (a job whose tensors are powers of two got NCCL's own algorithm)."""
    args = ("allgather", "--hw", "dgx-a100", "--method", "direct", "--instances", "10", "--proto", "Simple")
    out = compile_json(tmp_path, *args, "--size", "1GB", "-o", "a.xml")
    root = etree.fromstring((tmp_path / "a.xml").read_bytes())
    assert out["runs_at_multiples_of_bytes"] == 4 * int(root.get("nchunksperloop")) == 320
    text = run_cli(*args, "--size", "1GB", "-o", "b.xml", cwd=tmp_path).stdout
    assert "multiple of 320B; not at 1GiB, the nearest power of two" in text
    assert (2**30 // 4) % int(root.get("nchunksperloop")) != 0  # what it says: 1 GiB is not run
    text = run_cli(*args[:-4], "--instances", "8", "--size", "1GiB", "-o", "c.xml", cwd=tmp_path).stdout
    assert "multiple of 256B: every power of two from 256B up" in text
