"""backends/bench.py: nccl-tests-style sweeps on CPU (gloo, 4 local processes, our executor),
JSON/CSV/PNG output, --baseline regression detection, runtime-log checks, library band selection."""

import csv
import json
import subprocess
import sys
from pathlib import Path

import pytest

from backends import bench
from backends.msccl_xml import to_xml
from compiler.model.demand import make_demand
from compiler.specs.errors import CompileError
from compiler.lowering.lower import LowerOptions, lower
from compiler.planners import PlanOptions, plan
from compiler.model.profiles import load_topology

REPO = Path(__file__).resolve().parents[1]
COLUMNS = ("size", "count", "type", "redop", "time", "algbw", "busbw", "#wrong")


def write_program(path: Path, coll: str, method: str, **kw) -> Path:
    topo = load_topology("hub-and-spoke:4")
    p = lower(plan(topo, make_demand(coll, 4, 4096), PlanOptions(method=method)), topo, LowerOptions(**kw))
    path.write_text(to_xml(p))
    return path


@pytest.fixture(scope="module")
def swept(tmp_path_factory):
    """One CLI sweep: allgather through a compiler-written XML, 1KB..4KB."""
    d = tmp_path_factory.mktemp("bench")
    xml = write_program(d / "ag.xml", "allgather", "ring")
    prefix = d / "ag"
    proc = subprocess.run([sys.executable, "-m", "backends.bench", "allgather", "--xml", str(xml), "--sizes",
                           "1KB:4KB", "--iters", "3", "--warmup", "1", "-o", str(prefix)],
                          capture_output=True, text=True, timeout=120, cwd=REPO)
    return d, xml, prefix, proc


def test_sweep_prints_columns_and_writes_files(swept):
    d, xml, prefix, proc = swept
    assert proc.returncode == 0, proc.stderr[-2000:]
    header = next(l for l in proc.stdout.splitlines() if "count" in l)
    assert all(c in header for c in COLUMNS)
    assert header.count("algbw") == 2  # default and msccl side by side
    assert "msccl (our executor, CPU)" in proc.stdout and "Out of bounds values : 0 OK" in proc.stdout
    data = json.loads(Path(f"{prefix}.json").read_text())
    assert data["format"] == bench.FORMAT and data["collective"] == "allgather" and data["nprocs"] == 4
    assert [r["size_bytes"] for r in data["rows"]] == [992, 2000, 4000]  # 1000 B rounded to whole chunks
    for r in data["rows"]:
        for side in ("default", "msccl"):
            assert r[side]["wrong"] == 0 and r[side]["algbw_GBps"] > 0 and r[side]["time_us"] > 0
        assert r["msccl"]["busbw_GBps"] == pytest.approx(r["msccl"]["algbw_GBps"] * 3 / 4)
        assert r["algo"] == "ag.xml" and r["type"] == "float" and r["redop"] == "none"
    rows = list(csv.DictReader(open(f"{prefix}.csv")))
    assert len(rows) == 3 and {"size_bytes", "default_algbw_GBps", "msccl_wrong", "algo"} <= set(rows[0])
    assert Path(f"{prefix}.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_baseline_regression_exits_nonzero(swept, tmp_path):
    d, xml, prefix, _ = swept
    base = json.loads(Path(f"{prefix}.json").read_text())
    for r in base["rows"]:
        r["msccl"]["algbw_GBps"] *= 1000
    fake = tmp_path / "fake.json"
    fake.write_text(json.dumps(base))
    out = tmp_path / "again"
    rc = bench.main(["allgather", "--xml", str(xml), "--sizes", "2KB:4KB", "--iters", "2", "--warmup", "0",
                     "-o", str(out), "--no-plot", "--baseline", str(fake)])
    assert rc == 1
    # the same run against itself as baseline passes with a generous tolerance
    rc = bench.main(["allgather", "--xml", str(xml), "--sizes", "2KB:4KB", "--iters", "2", "--warmup", "0",
                     "-o", str(out), "--no-plot", "--baseline", f"{out}.json", "--tolerance", "0.99"])
    assert rc == 0


def test_compare_names_sizes():
    def result(bw):
        rows = tuple(bench.BenchRow(s, s // 4, "float", "none", bench.SideResult(1.0, bw, bw, 0),
                                    bench.SideResult(1.0, bw, bw, 0)) for s in (1024, 2048))
        return bench.BenchResult("allgather", 4, "float32", "sum", False, "gloo", "x", 1, 0, rows)
    assert bench.compare(result(1.0), result(1.05)) == []
    got = bench.compare(result(1.0), result(2.0), 0.10)
    assert len(got) == 2 and got[0].startswith("size 1024 B: msccl algbw") and "50 % below" in got[0]
    assert len(bench.compare(result(1.0), result(2.0), 0.10, ("default", "msccl"))) == 4
    assert bench.compare(result(1.0), result(2.0), 0.6) == []
    again = bench.BenchResult.from_dict(json.loads(result(1.0).to_json()))
    assert again == result(1.0)


def test_library_names_why_no_file_is_selected(tmp_path):
    from backends import torch_dist as td
    topo = load_topology("hub-and-spoke:4")
    p = lower(plan(topo, make_demand("allgather", 4, 4096, chunks=2), PlanOptions(method="direct")), topo)
    (tmp_path / "ag.xml").write_text(to_xml(p))  # nchunksperloop 8
    files = td.algorithm_files(tmp_path)
    assert td.select_algorithm(files, "allgather", 4 * 36, 4) is None  # 36 elements: divisible by 4, not 8
    why = td.why_not_selected(files, "allgather", 4 * 36, 4)
    assert why == "the element count 36 is not divisible by nchunksperloop of ag.xml (8)"
    assert td.why_not_selected(files, "allgather", 4 * 32, 8).startswith("no allgather file is for 8 ranks")
    assert td.why_not_selected(files, "allreduce", 4 * 32, 4).startswith("no file is for allreduce")
    assert td.select_algorithm(files, "allgather", 4 * 32, 4) is not None


def test_library_picks_the_band_per_size(tmp_path):
    lib = tmp_path / "lib"
    lib.mkdir()
    write_program(lib / "ag_0_ring.xml", "allgather", "ring", max_bytes=4095)
    write_program(lib / "ag_1_direct.xml", "allgather", "direct", min_bytes=4096, max_bytes=16383)
    res = bench.sweep("allgather", [2048, 4096, 32768], library_dir=lib, iters=2, warmup=0, nprocs=4, timeout=20)
    assert [r.algo for r in res.rows] == ["ag_0_ring.xml", "ag_1_direct.xml", None]
    assert res.rows[2].msccl is None and res.rows[2].default is not None
    assert any("32768 B: no library file is selected (no allgather file's minBytes..maxBytes covers 32768 B"
               in n for n in res.notes)
    assert res.wrong == 0 and all(r.msccl.wrong == 0 for r in res.rows[:2])
    lines = res.table()
    assert lines[-1].startswith("# note:") and any(l.rstrip().endswith("ag_1_direct.xml") for l in lines)


def test_reductions_and_default_only(tmp_path):
    xml = write_program(tmp_path / "ar.xml", "allreduce", "ring")
    res = bench.sweep("allreduce", [4096], xml=xml, iters=1, warmup=0, nprocs=4, op="max", timeout=20,
                      check_log=True)
    assert any("MSCCL is not in the path on CPU" in n for n in res.notes)
    r = res.rows[0]
    assert r.redop == "max" and r.default.wrong == 0 and r.msccl.wrong == 0
    assert r.msccl.busbw_GBps == pytest.approx(r.msccl.algbw_GBps * 1.5)
    res = bench.sweep("reduce_scatter", [4096], iters=1, warmup=0, nprocs=4, timeout=20)
    assert res.rows[0].msccl is None and res.rows[0].default.wrong == 0
    with pytest.raises(CompileError, match="is a allreduce algorithm, not allgather"):
        bench.sweep("allgather", [4096], xml=xml, nprocs=4)


def test_bench_under_torchrun(tmp_path):
    xml = write_program(tmp_path / "a2a.xml", "alltoall", "direct")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=4", "-m",
           "backends.bench", "alltoall", "--xml", str(xml), "--sizes", "4KB", "--iters", "2", "--warmup", "0",
           "-o", str(tmp_path / "a2a"), "--no-plot", "--json"]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=120, cwd=REPO)
    assert out.returncode == 0, out.stderr[-2000:]
    data = json.loads(out.stdout)  # --json: stdout is the JSON alone (the files written are said on stderr)
    assert data["nprocs"] == 4 and data["rows"][0]["msccl"]["wrong"] == 0 and data["rows"][0]["default"]["wrong"] == 0


def test_plot_is_optional(monkeypatch, tmp_path):
    res = bench.BenchResult("allgather", 4, "float32", "sum", False, "gloo", "x", 1, 0,
                            (bench.BenchRow(1024, 64, "float", "none", bench.SideResult(1.0, 1.0, 0.75, 0)),))
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    notes = res.write(tmp_path / "r")
    assert notes == ["matplotlib is not installed: no plot (pip install matplotlib)"]
    assert (tmp_path / "r.json").exists() and (tmp_path / "r.csv").exists() and not (tmp_path / "r.png").exists()


def test_parse_sizes():
    assert bench.parse_sizes("1KB:8KB") == [1000, 2000, 4000, 8000]
    assert bench.parse_sizes("1KiB:16KiB:4") == [1024, 4096, 16384]
    assert bench.parse_sizes("4096,1MB") == [4096, 10**6]
    for bad in ("8KB:1KB", "1KB:8KB:1", "a:b:c:d", "lots"):
        with pytest.raises(CompileError, match="--sizes"):
            bench.parse_sizes(bad)


def test_check_runtime():
    executor = ("host:1:1 [0] NCCL INFO NCCL version 2.23.4+cuda12.4\n"
                "MSCCL: INFO Using MSCCL Algo files from /algos\n"
                "host:1:1 [0] NCCL INFO MSCCL: Initialization finished\n"
                "host:1:9 [0] NCCL INFO MSCCL: Setup Kernel finished, smem 1024\n" * 3)
    ran, msg = bench.check_runtime(executor)
    assert ran and "3 kernel launches" in msg and "/algos" in msg and "2.23.4" in msg
    ran, msg = bench.check_runtime("x NCCL INFO NCCL version 2.23.4\nMSCCL: INFO Using MSCCL Algo files from /a\n")
    assert not ran and msg.startswith("MSCCL did not run") and "minBytes" in msg
    ran, msg = bench.check_runtime("x NCCL INFO NCCL version 2.21.5+cuda12.4\nx NCCL INFO Channel 00/24\n")
    assert not ran and "not MSCCL-enabled" in msg and "LD_PRELOAD" in msg
    ran, msg = bench.check_runtime("")
    assert not ran and "NCCL_DEBUG=INFO" in msg
    ran, msg = bench.check_runtime("x NCCL INFO Connected 2 MSCCL algorithms\n")
    assert ran and "legacy" in msg
    ran, msg = bench.check_runtime("x NCCL INFO MSCCL doesn't support multiple GPUs in one process\n")
    assert not ran and "one process per GPU" in msg


def test_check_log_option(tmp_path, capsys):
    log = tmp_path / "nccl.log"
    log.write_text("h NCCL INFO MSCCL: Setup Kernel finished, smem 0\n")
    assert bench.main(["allgather", "--check-log", str(log)]) == 0
    assert "MSCCL ran" in capsys.readouterr().out
    log.write_text("h NCCL INFO NCCL version 2.21.5\n")
    assert bench.main(["allgather", "--check-log", str(log)]) == 1


def test_gpu_script_renders_valid_bash(tmp_path):
    text = bench.gpu_script("ReduceScatter", "/data/my algos", runtime="rccl", nproc=8, sizes="1MB:1GB",
                            baseline="prev.json")
    script = tmp_path / "run.sh"
    script.write_text(text)
    assert subprocess.run(["bash", "-n", str(script)]).returncode == 0
    assert "--library '/data/my algos' --runtime rccl" in text and "RCCL_MSCCL_ENABLE=0" in text
    assert "--side default" in text and "--check-runtime --default-from" in text and "--baseline prev.json" in text
    assert "-m backends.bench reduce_scatter" in text
    assert "--xml ag.xml" in bench.gpu_script("allgather", "ag.xml")


def test_default_side_switches_msccl_off():
    env = bench.default_side_env("executor")
    assert env["MSCCL_ENABLE"] == "0" and env["MSCCL_ALGO_DIR"] is None and env["MSCCL_XML_FILES"] is None
    assert bench.default_side_env("rccl")["RCCL_MSCCL_ENABLE"] == "0"
    assert all(v is None for v in bench.default_side_env("old").values())


def test_cli_parser_does_not_import_torch():
    """Every msccl-compile command builds the bench parser; its options live in a torch-free module."""
    from backends import bench_options, torch_dist
    assert bench_options.RUNTIMES == torch_dist.RUNTIMES and bench.SIDES == bench_options.SIDES
    code = ("import sys; from compiler.cli.main import build_parser; build_parser(); "
            "assert 'torch' not in sys.modules, 'building the parser imported torch'")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=REPO)


def test_without_torch_run_and_bench_say_so_in_one_line(tmp_path):
    """`pip install .` brings no torch: run and bench name the extra (exit 2, one line, no traceback),
    while bench --check-log, which needs no torch, still works."""
    xml = write_program(tmp_path / "ag.xml", "allgather", "ring")
    (tmp_path / "nccl.log").write_text("NCCL INFO MSCCL: Initialized\n")
    code = ("import sys\nsys.modules['torch'] = None\nimport compiler.cli.main as c\n"
            "sys.exit(c.main(sys.argv[1:]))\n")
    for args in (["run", str(xml), "--nprocs", "2"], ["bench", "allgather", "--xml", str(xml), "--nprocs", "2"]):
        proc = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, cwd=REPO,
                              timeout=120)
        assert proc.returncode == 2, proc.stderr
        assert proc.stderr.count("\n") == 1, proc.stderr
        assert f'{args[0]}: torch is not installed; pip install "msccl-compile[torch]"' in proc.stderr
    log = subprocess.run([sys.executable, "-c", code, "bench", "allgather", "--check-log", str(tmp_path / "nccl.log")],
                         capture_output=True, text=True, cwd=REPO, timeout=120)
    assert "torch" not in log.stderr, log.stderr
