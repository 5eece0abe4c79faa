"""The training-side commands: env, run, library, bench (CPU, gloo)."""

import json
import re
import pytest

from backends.torch_dist import check_bands, msccl_env
from tests.conftest import run_cli


def test_library_bands_are_contiguous_and_every_file_verifies(tmp_path):
    proc = run_cli("library", "--hw", "hub-and-spoke:4", "--collectives", "allgather,allreduce", "--sizes", "1KB:4MB",
                   "--band-factor", "16", "--time-limit", "3", "-o", "lib", "--json", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    manifest = json.loads(proc.stdout)
    lib = tmp_path / "lib"
    assert json.loads((lib / "manifest" / "manifest.json").read_text()) == manifest
    for coll in ("allgather", "allreduce"):
        bands = sorted((e["min_bytes"], e["max_bytes"]) for e in manifest["algorithms"] if e["collective"] == coll)
        assert bands[0][0] == 1000 and bands[-1][1] == 4 * 10**6
        assert all(b[0] == a[1] + 1 for a, b in zip(bands, bands[1:]))  # no gap, no overlap
    assert check_bands(lib) == []  # the back end's own reading of the headers agrees
    for entry in manifest["algorithms"]:
        assert run_cli("verify", lib / entry["file"], "--runtime", "executor").returncode == 0
    # the environment loads exactly this directory
    env = run_cli("env", lib, "--runtime", "executor", "--world-size", "4")
    assert env.returncode == 0 and f"export MSCCL_ALGO_DIR={lib}" in env.stdout
    assert msccl_env("executor", lib, 4) == {"MSCCL_ALGO_DIR": str(lib), "MSCCL_ENABLE": "1"}
    wrong = run_cli("env", lib, "--runtime", "executor", "--world-size", "8")
    assert wrong.returncode == 2 and "does not match the world size 8" in wrong.stderr


@pytest.mark.long
def test_run_compares_with_torch_and_catches_a_broken_file(tmp_path):
    assert run_cli("allreduce", "--hw", "hub-and-spoke:4", "--method", "ring", "-o", "ar.xml", cwd=tmp_path).returncode == 0
    ok = run_cli("run", "ar.xml", "--nprocs", "4", "--size", "64KB", "--json", cwd=tmp_path)
    assert ok.returncode == 0, ok.stderr
    result = json.loads(ok.stdout)
    assert result["correct"] is True and result["wrong"] == 0 and result["time_s"] > 0 and result["verified"]
    assert ok.stderr == ""
    text = (tmp_path / "ar.xml").read_text()
    # correct data, but a file the old runtime never selects: run said "correct" and nothing else
    (tmp_path / "never.xml").write_text(re.sub(r'maxBytes="\d+"', 'maxBytes="0"', text))
    never = run_cli("run", "never.xml", "--nprocs", "4", "--size", "64KB", cwd=tmp_path)
    assert never.returncode == 0 and ": correct;" in never.stdout, never.stderr
    assert "warning: never.xml: correct as run, but verify finds 1 problem" in never.stderr
    assert "[old-runtime]" in never.stderr and never.stderr.count("\n") == 1
    # point the first plain receive at the neighbouring output chunk: data lands in the wrong place
    m = re.search(r'type="(r|rrc)" srcbuf="\w" srcoff="-?\d+" dstbuf="o" dstoff="(\d+)"', text)
    off = int(m.group(2))
    broken = text[:m.start(2)] + str((off + 1) % 4) + text[m.end(2):]
    (tmp_path / "bad.xml").write_text(broken)
    bad = run_cli("run", "bad.xml", "--nprocs", "4", "--size", "64KB", "--json", "--timeout", "20", cwd=tmp_path)
    assert bad.returncode != 0
    if bad.returncode == 1:
        assert json.loads(bad.stdout)["wrong"] > 0
    else:
        assert bad.stderr.count("\n") == 1


def test_run_refuses_a_world_size_mismatch(tmp_path):
    assert run_cli("allgather", "--hw", "hub-and-spoke:4", "-o", "ag.xml", cwd=tmp_path).returncode == 0
    proc = run_cli("run", "ag.xml", "--nprocs", "2", cwd=tmp_path)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1
    # refused from the file's header, before torch is imported (3 s), naming the file
    assert "--nprocs: 2 processes, but ag.xml is for ngpus=4" in proc.stderr, proc.stderr


def test_bench_command_prints_nccl_tests_columns(tmp_path):
    assert run_cli("allgather", "--hw", "hub-and-spoke:4", "-o", "ag.xml", cwd=tmp_path).returncode == 0
    proc = run_cli("bench", "allgather", "--xml", "ag.xml", "--sizes", "4KB:16KB", "--iters", "2", "--warmup", "1",
                   "--nprocs", "4", "-o", "b", "--no-plot", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "algbw" in proc.stdout and "#wrong" in proc.stdout
    data = json.loads((tmp_path / "b.json").read_text())
    assert data and (tmp_path / "b.csv").is_file()


def test_outputs_that_cannot_be_written_are_refused_before_any_work(tmp_path):
    """library -o on a file stopped on an internal NotADirectoryError; bench -o on a directory wrote
    hidden files into it (DIR/.json), and into a missing directory failed after the whole sweep."""
    (tmp_path / "afile").write_text("x")
    (tmp_path / "adir").mkdir()
    for args, needle in ((("library", "--hw", "dgx1", "--sizes", "1KB:4KB", "--collectives", "allgather", "-o", "afile"),
                          "-o: afile: exists and is not a directory"),
                         (("bench", "allreduce", "-o", "adir"), "-o: adir: is a directory; -o takes a file prefix"),
                         (("bench", "allreduce", "-o", "nodir/b"), "-o: nodir/b.json: directory 'nodir' does not exist")):
        proc = run_cli(*args, cwd=tmp_path)
        assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and needle in proc.stderr, (args, proc.stderr)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["adir", "afile"] and not list((tmp_path / "adir").iterdir())


def test_library_refuses_a_directory_with_a_file_it_did_not_write(tmp_path):
    """--force removed only the old XML files: a notes.txt stayed beside the library written, and
    `env` then refused the directory (the runtimes parse every regular file in it). Refused before
    planning, with or without --force, naming the file; nothing is removed."""
    lib = tmp_path / "lib"
    lib.mkdir()
    (lib / "old.xml").write_text("<algo/>")
    (lib / "notes.txt").write_text("my notes")
    for force in ((), ("--force",)):
        proc = run_cli("library", "--hw", "dgx1", "--collectives", "allgather", "--sizes", "1KB:4KB",
                       "--time-limit", "2", "-o", "lib", *force, cwd=tmp_path)
        assert proc.returncode == 2 and proc.stderr.count("\n") == 1, proc.stderr
        assert "-o: lib holds 'notes.txt', which is not one of the library's XML files" in proc.stderr
        assert "planned" not in proc.stdout
    assert sorted(p.name for p in lib.iterdir()) == ["notes.txt", "old.xml"]
