"""backends/torch_dist.py: MSCCL environment, header and band checks, and the executor over gloo
(4 local processes, CPU). Programs come from the real compiler (planner -> lowering -> XML -> reader)."""

import os
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from backends import torch_dist as td
from backends.msccl_xml import read_xml, to_xml
from compiler.model.demand import make_demand
from compiler.specs.errors import CompileError
from compiler.lowering.lower import LowerOptions, lower
from compiler.planners import PlanOptions, plan
from compiler.model.profiles import load_topology
from compiler.model.program import GpuProgram, Program, Step, ThreadBlock

REPO = Path(__file__).resolve().parents[1]
N = 4
SIZE = 4096  # bytes: 1024 float32 elements, 256 per chunk


# ---- programs -------------------------------------------------------------------------------------

def compiled(coll: str, method: str, **lower_kw) -> Program:
    """A program written by the compiler, through its XML (the files users load)."""
    topo = load_topology(f"hub-and-spoke:{N}")
    p = lower(plan(topo, make_demand(coll, N, SIZE), PlanOptions(method=method)), topo, LowerOptions(**lower_kw))
    return read_xml(to_xml(p))


@pytest.fixture(scope="module")
def programs():
    out = {(c, m): compiled(c, m) for c in ("allgather", "alltoall", "reduce_scatter", "allreduce")
           for m in ("ring", "direct")}
    out[("allreduce", "oneshot")] = compiled("allreduce", "oneshot", instances=2)
    return out


def ring_allgather_2tb(n: int = N) -> Program:
    """msccl-xml.md §15: a receiver tb and a sender tb per rank; forwards wait on receives."""
    gpus = []
    for r in range(n):
        nxt, prv = (r + 1) % n, (r - 1) % n
        recv = tuple(Step("r", "o", (r - 1 - k) % n, "o", (r - 1 - k) % n, 1, -1, -1, k < n - 2) for k in range(n - 1))
        send = (Step("cpy", "i", 0, "o", r),
                Step("s", "o", r, "o", r),
                *(Step("s", "o", (r - 1 - k) % n, "o", (r - 1 - k) % n, 1, 0, k) for k in range(n - 2)))
        gpus.append(GpuProgram(r, 1, n, 0, (ThreadBlock(0, -1, prv, 0, recv), ThreadBlock(1, nxt, -1, 0, send))))
    return Program("ring_allgather_2tb", "allgather", n, n, 1, tuple(gpus), inplace=True, outofplace=True,
                   max_bytes=1 << 30)


def xml_lines(p: Program) -> list[str]:
    return to_xml(p).splitlines()


def gpu_step_line(lines: list[str], rank: int, kind: str, k: int = 0) -> int:
    """Index of the k-th step of `kind` in <gpu id=rank>."""
    start = next(i for i, l in enumerate(lines) if f'<gpu id="{rank}"' in l)
    return [i for i, l in enumerate(lines) if i > start and f'type="{kind}"' in l][k]


# ---- the executor against torch's collectives ----------------------------------------------------

def test_compiler_programs_equal_torch_collectives(programs):
    progs = list(programs.values()) + [read_xml(to_xml(ring_allgather_2tb()))]
    t0 = time.monotonic()
    results = td.run_local_many(progs, N, SIZE, timeout=20, iters=2)
    assert time.monotonic() - t0 < 60
    for p, r in zip(progs, results):
        assert r.correct, r.summary()
        assert (r.wrong, r.first_wrong) == (0, None)
        assert r.collective == p.collective and r.nprocs == N and r.size_bytes == SIZE
        assert r.time_s > 0 and len(r.times_s) == 2


def test_in_place_calls(programs):
    usable = [p for p in programs.values() if p.inplace] + [ring_allgather_2tb()]
    assert {p.collective for p in usable} >= {"allgather", "reduce_scatter", "allreduce"}
    for p, r in zip(usable, td.run_local_many(usable, N, SIZE, inplace=True, timeout=20, iters=1)):
        assert r.correct and r.inplace, r.summary()


def test_rooted_collectives_use_the_inferred_root():
    topo = load_topology(f"hub-and-spoke:{N}")
    progs = [lower(plan(topo, make_demand(c, N, SIZE, root=root), PlanOptions(method="direct")), topo)
             for c, root in (("broadcast", 2), ("reduce", 1), ("scatter", 3), ("gather", 2))]
    results = td.run_local_many(progs, N, SIZE, timeout=20, iters=1)
    assert [r.root for r in results] == [2, 1, 3, 2]
    assert all(r.correct for r in results), [r.summary() for r in results]


def test_reduction_ops_and_dtypes(programs):
    progs = [programs[("allreduce", "ring")], programs[("reduce_scatter", "direct")]]
    for op, dtype in (("max", torch.int32), ("prod", torch.float64), ("min", torch.bfloat16)):
        for r in td.run_local_many(progs, N, SIZE, dtype=dtype, op=op, timeout=20, iters=1):
            assert r.correct and r.op == op and r.dtype == td.dtype_name(dtype), r.summary()


def test_size_rounded_down_to_whole_chunks(programs):
    r = td.run_local(programs[("allgather", "ring")], N, 4100, timeout=20, iters=1)
    assert r.correct and r.size_bytes == 4096
    assert any("rounded down from 4100 B to 4096 B" in n for n in r.notes)


# ---- broken programs: caught, never a hang -------------------------------------------------------

def test_dropped_receive_is_refused_before_running():
    lines = xml_lines(ring_allgather_2tb())
    del lines[gpu_step_line(lines, 1, "r", 2)]
    t0 = time.monotonic()
    with pytest.raises(td.ExecutionError, match=r"fifo-count: rank 0 tb 1: sends 3 messages to rank 1 .* receives 2"):
        td.run_local("\n".join(lines), N, SIZE, timeout=5)
    assert time.monotonic() - t0 < 5


def test_wrong_offset_gives_wrong_elements():
    lines = xml_lines(ring_allgather_2tb())
    i = gpu_step_line(lines, 2, "r", 0)  # rank 2 receives rank 1's chunk into o[1] ...
    assert 'dstoff="1"' in lines[i]
    lines[i] = lines[i].replace('dstoff="1"', 'dstoff="3"')  # ... now into o[3]
    r = td.run_local("\n".join(lines), N, SIZE, timeout=10, iters=1)
    assert not r.correct and r.wrong > 0
    assert r.first_wrong is not None and "WRONG" in r.summary()  # rank 2 forwards o[1] unwritten: 0, 1, 2 wrong


def test_dependency_cycle_is_refused():
    """Every rank waits for its first receive before sending its own chunk: a cycle around the ring."""
    p = ring_allgather_2tb()
    gpus = []
    for g in p.gpus:
        sender = g.tbs[1]
        steps = list(sender.steps)
        steps[1] = replace(steps[1], depid=0, deps=0)
        gpus.append(replace(g, tbs=(g.tbs[0], replace(sender, steps=tuple(steps)))))
    with pytest.raises(td.ExecutionError, match=r"cannot run: deadlock: rank 0 tb 0 step 0 \(r\): waits for a message from rank 3 on channel 0 "
                                                r"\(rank 3 tb 1 is blocked at step 1 \(s\)\)"):
        td.prepare(replace(p, gpus=tuple(gpus)))


def stalled_peer(rank, n, payload, emit):
    """Rank 3 never joins the program: the others must time out naming what they wait for."""
    p, timeout = payload
    if rank == 3:
        time.sleep(timeout + 1)
        return "absent"
    try:
        td.execute(p, td.make_input(rank, 256), timeout=timeout)
        return "finished"
    except td.ExecutionError as e:
        return str(e)


def test_every_wait_times_out_with_rank_tb_step():
    t0 = time.monotonic()
    got = td.launch_local(stalled_peer, N, (ring_allgather_2tb(), 2.0), timeout=30)
    assert time.monotonic() - t0 < 20
    assert got[3] == "absent"
    assert "rank 0 tb 0 step 0 (r): waits for message 0 from rank 3 on channel 0 (sent by rank 3 tb 1 step 1)" \
        in got[0]
    assert got[0].endswith("not done within the 2 s timeout")
    for msg in got[1:3]:  # they time out too, or see rank 0 leave first
        assert ("not done within the 2 s timeout" in msg or "Connection closed" in msg) and " step " in msg


def test_local_run_user_errors(programs):
    p = programs[("allgather", "ring")]
    with pytest.raises(CompileError, match="--nprocs: 3 processes, but .* ngpus=4"):
        td.run_local(p, 3, SIZE)
    with pytest.raises(CompileError, match="below one float32 per chunk"):
        td.run_local(p, N, 8)
    with pytest.raises(CompileError, match="--op"):
        td.run_local(p, N, SIZE, op="avg")
    with pytest.raises(td.ExecutionError, match="no process group"):
        td.execute(p, torch.zeros(256))


# ---- environment ---------------------------------------------------------------------------------

@pytest.fixture()
def library(tmp_path):
    """Two allgather bands written by the compiler: [0, 65535] and [65536, no limit]."""
    d = tmp_path / "algos"
    d.mkdir()
    (d / "allgather_0_ring.xml").write_text(to_xml(compiled("allgather", "ring", max_bytes=65535)))
    (d / "allgather_1_direct.xml").write_text(to_xml(compiled("allgather", "direct", min_bytes=65536)))
    return d


def test_env_sets_exactly_the_documented_variables(library):
    d = str(library.resolve())
    assert td.msccl_env("executor", library, 4) == {"MSCCL_ALGO_DIR": d, "MSCCL_ENABLE": "1"}
    assert td.msccl_env("rccl", library, 4) == {"RCCL_MSCCL_ENABLE": "1", "RCCL_MSCCL_FORCE_ENABLE": "1",
                                                "MSCCL_ALGO_DIR": d}
    files = sorted(str(f.resolve()) for f in library.iterdir())
    assert td.msccl_env("old", library, 4) == {"MSCCL_XML_FILES": ":".join(files), "NCCL_ALGO": "MSCCL,RING,TREE"}
    assert td.msccl_env("old", files[0]) == {"MSCCL_XML_FILES": files[0], "NCCL_ALGO": "MSCCL,RING,TREE"}


def test_environment_is_restored(library, monkeypatch):
    monkeypatch.setenv("MSCCL_ENABLE", "0")
    monkeypatch.delenv("MSCCL_ALGO_DIR", raising=False)
    before = dict(os.environ)
    with td.msccl_environment("executor", library, 4) as env:
        assert os.environ["MSCCL_ALGO_DIR"] == env["MSCCL_ALGO_DIR"] and os.environ["MSCCL_ENABLE"] == "1"
        assert {k for k in os.environ if os.environ[k] != before.get(k)} == {"MSCCL_ALGO_DIR", "MSCCL_ENABLE"}
    assert dict(os.environ) == before
    with pytest.raises(RuntimeError):
        with td.msccl_environment("rccl", library):
            raise RuntimeError("boom")
    assert dict(os.environ) == before


def test_export_lines_quote_values(tmp_path):
    d = tmp_path / "my algos"
    d.mkdir()
    (d / "a.xml").write_text(to_xml(ring_allgather_2tb()))
    lines = td.export_lines(td.msccl_env("executor", d))
    assert lines == [f"export MSCCL_ALGO_DIR='{d.resolve()}'", "export MSCCL_ENABLE=1"]
    out = subprocess.run(["bash", "-c", "; ".join(lines) + '; printf %s "$MSCCL_ALGO_DIR"'], capture_output=True,
                         text=True)
    assert out.stdout == str(d.resolve())


def test_ngpus_mismatch_is_refused(library):
    with pytest.raises(CompileError, match=r"allgather_0_ring.xml: ngpus=4 does not match the world size 8$"):
        td.msccl_env("executor", library, 8)


def test_directory_with_other_files_is_refused(library):
    (library / "manifest.json").write_text("{}")
    with pytest.raises(CompileError, match=r"manifest.json: not an MSCCL algorithm file.*move it out"):
        td.msccl_env("executor", library)
    assert len(td.msccl_env("old", library)["MSCCL_XML_FILES"].split(":")) == 2  # legacy loads only the list


def test_runtime_specific_refusals(tmp_path, library):
    assert "manifest" not in str(td.msccl_env("executor", library))
    with pytest.raises(CompileError, match="loads a directory"):
        td.msccl_env("executor", next(library.iterdir()))
    many = tmp_path / "many"
    many.mkdir()
    for k in range(5):
        (many / f"a{k}.xml").write_text(to_xml(ring_allgather_2tb()))
    with pytest.raises(CompileError, match="5 algorithm files; the old runtime loads at most 4"):
        td.msccl_env("old", many)
    rs = tmp_path / "rs"
    rs.mkdir()
    (rs / "rs.xml").write_text(to_xml(compiled("reduce_scatter", "ring"), "executor"))
    assert td.msccl_env("executor", rs, 4)
    with pytest.raises(CompileError, match="coll='reducescatter' is not accepted by the old runtime"):
        td.msccl_env("old", rs / "rs.xml")
    bare = tmp_path / "bare"
    bare.mkdir()
    text = to_xml(ring_allgather_2tb()).replace(' minBytes="0"', "")
    (bare / "a.xml").write_text(text)
    with pytest.raises(CompileError, match="attribute minBytes is missing"):
        td.msccl_env("executor", bare)
    assert td.msccl_env("old", bare / "a.xml")
    (bare / "a.xml").write_text('<?xml version="1.0"?>\n' + to_xml(ring_allgather_2tb()))
    with pytest.raises(CompileError, match="XML declaration"):
        td.msccl_env("executor", bare)
    with pytest.raises(CompileError, match="--runtime"):
        td.msccl_env("nccl", library)


# ---- headers, bands and selection ----------------------------------------------------------------

def header(tmp_path, name, lo, hi, coll="allgather", ngpus=4, inplace=0, outofplace=1, nchunks=4) -> Path:
    f = tmp_path / name
    f.write_text(f'<algo name="{name}" proto="Simple" nchannels="1" nchunksperloop="{nchunks}" ngpus="{ngpus}" '
                 f'coll="{coll}" inplace="{inplace}" outofplace="{outofplace}" minBytes="{lo}" maxBytes="{hi}">\n'
                 f'</algo>\n')
    return f


def test_read_header_reads_only_the_algo_tag(tmp_path):
    f = header(tmp_path, "x.xml", "0x10", "010")
    h = td.read_header(f)
    assert (h.collective, h.ngpus, h.nchunksperloop, h.min_bytes, h.max_bytes) == ("allgather", 4, 4, 16, 8)
    (tmp_path / "y.xml").write_text("<!-- licence -->\n" + to_xml(compiled("reduce_scatter", "direct")))
    assert td.read_header(tmp_path / "y.xml").collective == "reduce_scatter"


def test_bands_contiguous_and_disjoint(tmp_path, library):
    assert td.check_bands(library) == []
    ok = [header(tmp_path, "a.xml", 0, 1023), header(tmp_path, "b.xml", 1024, 65535),
          header(tmp_path, "c.xml", 65536, 0), header(tmp_path, "r.xml", 0, 0, coll="allreduce")]
    assert td.check_bands(ok) == []
    gap = [header(tmp_path, "d.xml", 0, 1023), header(tmp_path, "e.xml", 2048, 4095)]
    assert td.check_bands(gap) == ["allgather ngpus=4 out-of-place: gap: no algorithm for 1024..2047 bytes "
                                   "between d.xml and e.xml"]
    over = [header(tmp_path, "f.xml", 0, 4096), header(tmp_path, "g.xml", 4096, 8191)]
    assert td.check_bands(over) == ["allgather ngpus=4 out-of-place: f.xml [0, 4096] and g.xml [4096, 8191] overlap"]
    unlimited = [header(tmp_path, "h.xml", 0, 0), header(tmp_path, "i.xml", 1024, 2047)]
    assert "overlap" in td.check_bands(unlimited)[0]
    kinds = [header(tmp_path, "j.xml", 0, 1023, inplace=1, outofplace=0), header(tmp_path, "k.xml", 0, 1023)]
    assert td.check_bands(kinds) == []  # one file per call kind: no overlap
    assert td.check_bands([header(tmp_path, "l.xml", 10, 5)]) == ["l.xml: minBytes=10 is above maxBytes=5"]
    # legacy: exclusive maxBytes; the writer's hi - 1 convention leaves a one-byte seam, accepted
    legacy = [header(tmp_path, "m.xml", 0, 1023), header(tmp_path, "n.xml", 1024, 2048)]
    assert td.check_bands(legacy, "old") == []


def test_select_algorithm(tmp_path):
    files = [header(tmp_path, "a.xml", 0, 1023), header(tmp_path, "b.xml", 1024, 0, nchunks=8),
             header(tmp_path, "c.xml", 0, 0, inplace=1, outofplace=0)]
    pick = lambda size, **kw: getattr(td.select_algorithm(files, "allgather", size, 4, **kw), "label", None)  # noqa
    assert pick(512) == "a.xml" and pick(1024) == "b.xml" and pick(1 << 20) == "b.xml"
    assert pick(1024 + 16) is None  # 260 elements do not divide into 8 chunks: NCCL's own algorithm
    assert pick(512, inplace=True) == "c.xml"
    assert td.select_algorithm(files, "allgather", 512, 8) is None


# ---- the DDP example -----------------------------------------------------------------------------

@pytest.mark.long
def test_train_ddp_example_under_torchrun(library):
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=4",
           str(REPO / "examples" / "train_ddp.py"), "--algos", str(library), "--steps", "4", "--hidden", "32"]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=120, cwd=REPO)
    assert out.returncode == 0, out.stderr[:3000]
    assert f"export MSCCL_ALGO_DIR={library.resolve()}" in out.stdout
    assert "MSCCL is not in the path" in out.stdout
    assert "parameters identical on all ranks: True" in out.stdout


def test_train_ddp_names_the_fix_for_a_gpu_count_mismatch(library):
    import argparse
    import importlib.util
    spec = importlib.util.spec_from_file_location("train_ddp", REPO / "examples" / "train_ddp.py")
    train_ddp = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(train_ddp)
    args = argparse.Namespace(algos=str(library), runtime="executor")
    hint = train_ddp.library_hint(args, 8)
    assert "library is for 4 GPUs, this job has 8 ranks" in hint and "--nproc_per_node=4" in hint
    assert train_ddp.library_hint(args, 4) == ""


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
def test_prod_inputs_multiply_exactly_in_any_order(dtype):
    """`run --op prod` compares the program's products with torch's, which multiply in other
    orders: 3^8 is not exact in float16 or bfloat16 (nor 3^16 in float32), and a correct MI250
    reduce-scatter ran WRONG (1236 elements in bfloat16). The inputs must multiply exactly in any
    order on up to 16 ranks."""
    xs = [td.make_input(r, 4096, dtype, seed=0, op="prod") for r in range(16)]
    forward, backward, pairs = xs[0].clone(), xs[-1].clone(), []
    for x in xs[1:]:
        forward = forward * x
    for x in reversed(xs[:-1]):
        backward = backward * x
    halves = [xs[k] * xs[k + 1] for k in range(0, 16, 2)]
    while len(halves) > 1:
        halves = [halves[k] * halves[k + 1] for k in range(0, len(halves), 2)]
    assert torch.equal(forward, backward) and torch.equal(forward, halves[0])
    assert not torch.any(xs[0] == 0) and len(torch.unique(xs[0])) > 1
