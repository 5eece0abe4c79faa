"""nccl-tests-style regression sweeps: torch's default collective and the MSCCL algorithm side by side.

For each size: time the default collective and the MSCCL algorithm, check both against the
expected result (computed locally from every rank's seeded input, as nccl-tests checks), and print
nccl-tests' columns (size, count, type, redop, time us, algbw GB/s, busbw GB/s, #wrong; size is
nccl-tests' S, algbw = S / time, busbw = algbw x the collective's factor, hardware.md §4). Results
go to JSON and CSV, algbw against size to a PNG (matplotlib, optional). `--baseline FILE` compares
with an earlier JSON and fails (exit status 1) on a drop in algbw beyond a tolerance, naming sizes.

Where the MSCCL side comes from:

* **CPU (gloo)**: our executor (`backends.torch_dist.execute`) interprets the XML over gloo. Both
  sides run in one launch. This tests correctness and the harness; the times are gloo's, not a GPU's.
* **GPUs (nccl)**: the ordinary torch call, with the MSCCL runtime loaded through the environment
  (`backends.torch_dist.msccl_env`); the runtime executes the XML. A process loads MSCCL once, at
  its first communicator, so one process measures one side: standalone, `sweep` runs two rounds of
  local processes (without and with the MSCCL variables; LD_PRELOAD of the executor's libnccl.so.2
  must be in the launching environment and is inherited); under torchrun, choose `--side default`
  or `--side msccl` per launch and merge with `--default-from FILE`. `--check-runtime` turns on
  NCCL's INFO log (NCCL_DEBUG=INFO, NCCL_DEBUG_SUBSYS=INIT,ENV, NCCL_DEBUG_FILE per process) and
  confirms from it that MSCCL really ran (`check_runtime`).

Calls are classified like the runtimes do (msccl-xml.md §10): torch's all_reduce, broadcast and
reduce are always in-place calls (send buffer = receive buffer), so their files need inplace=1;
allgather, reduce-scatter and alltoall are out-of-place unless `--inplace`.

With a library directory, each size uses the file the executor would select (`select_algorithm`:
coll, ngpus, call kind, minBytes <= S <= maxBytes, nchunksperloop dividing the element count);
sizes no file covers have no MSCCL column (the runtime falls back to NCCL there).

Launch: `python -m backends.bench allgather --xml ag.xml --sizes 1KB:1MB` (spawns --nprocs local
processes), or `torchrun --nnodes ... --nproc_per_node 8 -m backends.bench ...` (joins the group).
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import os
import re
import statistics
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import torch
import torch.distributed as dist

from compiler.analysis.bounds import busbw
from compiler.specs.collectives import canonical, inplace_alias
from compiler.specs.errors import CompileError
from compiler.fileio import atomic_write
from compiler.specs.units import parse_size

from . import torch_dist as td
from .bench_options import SIDES, configure

__all__ = ["SideResult", "BenchRow", "BenchResult", "parse_sizes", "sweep", "compare", "check_runtime",
           "expected_output", "default_side_env", "gpu_script", "configure", "run", "main"]

FORMAT = "msccl-compile/bench-v1"
NCCL_TYPE_NAMES = {"float32": "float", "float16": "half", "float64": "double", "bfloat16": "bfloat16",
                   "int32": "int32", "int64": "int64", "int8": "int8", "uint8": "uint8"}
INPLACE_CALLS = ("allreduce", "broadcast", "reduce")  # torch passes one buffer: always in place
MSCCL_ENV_VARS = ("MSCCL_ALGO_DIR", "MSCCL_ENABLE", "MSCCL_XML_FILES", "NCCL_ALGO", "RCCL_MSCCL_ENABLE",
                  "RCCL_MSCCL_FORCE_ENABLE")


# ==== results ====================================================================================

@dataclass(frozen=True)
class SideResult:
    time_us: float
    algbw_GBps: float
    busbw_GBps: float
    wrong: int


@dataclass(frozen=True)
class BenchRow:
    size_bytes: int  # nccl-tests' S, after rounding to whole chunks
    count: int  # elements, as nccl-tests prints it (per rank for allgather/reduce-scatter/alltoall)
    type: str
    redop: str
    default: SideResult | None = None
    msccl: SideResult | None = None
    algo: str | None = None  # the algorithm file (or program name) used for the MSCCL side
    requested_bytes: int = 0

    def side(self, name: str) -> SideResult | None:
        return getattr(self, name)


@dataclass(frozen=True)
class BenchResult:
    collective: str
    nprocs: int
    dtype: str
    op: str
    inplace: bool
    backend: str  # gloo | nccl
    msccl_source: str  # "executor (msccl-compile, CPU)" or "runtime executor" ...
    iters: int
    warmup: int
    rows: tuple[BenchRow, ...]
    notes: tuple[str, ...] = ()

    @property
    def wrong(self) -> int:
        return sum(s.wrong for r in self.rows for s in (r.default, r.msccl) if s is not None)

    def to_dict(self) -> dict:
        d = asdict(self)
        d["format"] = FORMAT
        return d

    @classmethod
    def from_dict(cls, d: dict) -> "BenchResult":
        if d.get("format") != FORMAT:
            raise CompileError(f"baseline: format {d.get('format')!r} is not {FORMAT!r}")
        rows = []
        for r in d["rows"]:
            sides = {k: SideResult(**r[k]) if r.get(k) else None for k in SIDES}
            rows.append(BenchRow(r["size_bytes"], r["count"], r["type"], r["redop"], sides["default"],
                                 sides["msccl"], r.get("algo"), r.get("requested_bytes", 0)))
        return cls(d["collective"], d["nprocs"], d["dtype"], d["op"], d["inplace"], d["backend"],
                   d["msccl_source"], d["iters"], d["warmup"], tuple(rows), tuple(d.get("notes", ())))

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, sort_keys=True)

    @classmethod
    def load(cls, path: str | os.PathLike) -> "BenchResult":
        try:
            return cls.from_dict(json.loads(Path(path).read_text(encoding="utf-8")))
        except FileNotFoundError:
            raise CompileError(f"{path}: no such file") from None
        except (json.JSONDecodeError, KeyError, TypeError) as e:
            raise CompileError(f"{path}: not a bench result: {type(e).__name__}: {e}") from None

    # ---- presentation ----

    def table(self) -> list[str]:
        """nccl-tests' columns, default and MSCCL side by side."""
        has = {s: any(r.side(s) for r in self.rows) for s in SIDES}
        head1 = f"#{'':>12} {'':>13} {'':>9} {'':>6}"
        head2 = f"#{'size':>12} {'count':>13} {'type':>9} {'redop':>6}"
        head3 = f"#{'(B)':>12} {'(elements)':>13} {'':>9} {'':>6}"
        titles = {"default": "default (torch)", "msccl": f"msccl ({self.msccl_source})"}
        for s in SIDES:
            if has[s]:
                head1 += f"  {titles[s]:<39}"
                head2 += f"  {'time':>9} {'algbw':>9} {'busbw':>9} {'#wrong':>7}"
                head3 += f"  {'(us)':>9} {'(GB/s)':>9} {'(GB/s)':>9} {'':>7}"
        if any(r.algo for r in self.rows):
            head2 += "  algo"
        lines = [head1.rstrip(), head2, head3.rstrip()]
        for r in self.rows:
            line = f" {r.size_bytes:>12} {r.count:>13} {r.type:>9} {r.redop:>6}"
            for s in SIDES:
                if not has[s]:
                    continue
                v = r.side(s)
                if v is None:
                    line += f"  {'-':>9} {'-':>9} {'-':>9} {'-':>7}"
                else:
                    line += f"  {v.time_us:>9.2f} {v.algbw_GBps:>9.4g} {v.busbw_GBps:>9.4g} {v.wrong:>7d}"
            if r.algo:
                line += f"  {r.algo}"
            lines.append(line)
        lines.append(f"# Out of bounds values : {self.wrong} {'OK' if self.wrong == 0 else 'FAILED'}")
        for s in SIDES:
            vals = [r.side(s).busbw_GBps for r in self.rows if r.side(s)]
            if vals:
                lines.append(f"# Avg bus bandwidth ({s}) : {statistics.fmean(vals):.4f}")
        lines += [f"# note: {n}" for n in self.notes]
        return lines

    def csv_text(self) -> str:
        buf = io.StringIO()
        w = csv.writer(buf, lineterminator="\n")
        cols = ["time_us", "algbw_GBps", "busbw_GBps", "wrong"]
        w.writerow(["size_bytes", "count", "type", "redop"] + [f"{s}_{c}" for s in SIDES for c in cols] + ["algo"])
        for r in self.rows:
            row = [r.size_bytes, r.count, r.type, r.redop]
            for s in SIDES:
                v = r.side(s)
                row += [getattr(v, c) for c in cols] if v else [""] * len(cols)
            w.writerow(row + [r.algo or ""])
        return buf.getvalue()

    def plot(self, path: str | os.PathLike) -> str | None:
        """algbw against size (PNG). Returns a note instead when matplotlib is missing."""
        try:
            import matplotlib
            matplotlib.use("Agg")
            import matplotlib.pyplot as plt
        except ImportError:
            return "matplotlib is not installed: no plot (pip install matplotlib)"
        fig, ax = plt.subplots(figsize=(7, 4.5))
        labels = {"default": "default (torch)", "msccl": f"msccl ({self.msccl_source})"}
        for s, marker in zip(SIDES, "os"):
            pts = [(r.size_bytes, r.side(s).algbw_GBps) for r in self.rows if r.side(s)]
            if pts:
                ax.plot([p[0] for p in pts], [p[1] for p in pts], marker=marker, label=labels[s])
        ax.set_xscale("log", base=2)
        ax.set_xlabel("size (bytes)")
        ax.set_ylabel("algbw (GB/s)")
        ax.set_title(f"{self.collective}, {self.nprocs} ranks, {self.dtype}, {self.backend}")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend()
        fig.tight_layout()
        png = io.BytesIO()
        fig.savefig(png, format="png", dpi=100)
        plt.close(fig)
        atomic_write(path, png.getvalue())
        return None

    def write(self, prefix: str | os.PathLike, plot: bool = True) -> list[str]:
        """PREFIX.json, PREFIX.csv and (with matplotlib) PREFIX.png. Returns notes."""
        prefix = str(prefix)
        atomic_write(prefix + ".json", self.to_json() + "\n")
        atomic_write(prefix + ".csv", self.csv_text())
        notes = []
        if plot:
            note = self.plot(prefix + ".png")
            if note:
                notes.append(note)
        return notes


def compare(result: BenchResult, baseline: BenchResult, tolerance: float = 0.10,
            sides: tuple[str, ...] = ("msccl",)) -> list[str]:
    """Regressions: for each of `sides` and each size present in both runs, algbw below the
    baseline's x (1 - tolerance). With sides=("msccl",) and no msccl column in either run, the
    default side is compared instead."""
    if not 0 <= tolerance < 1:
        raise CompileError(f"--tolerance: {tolerance} must be in [0, 1)")
    if sides == ("msccl",) and not any(r.msccl for r in result.rows) and not any(r.msccl for r in baseline.rows):
        sides = ("default",)
    base = {r.size_bytes: r for r in baseline.rows}
    out = []
    for r in result.rows:
        b = base.get(r.size_bytes)
        if b is None:
            continue
        for s in sides:
            cur, old = r.side(s), b.side(s)
            if cur is None or old is None or old.algbw_GBps <= 0:
                continue
            if cur.algbw_GBps < old.algbw_GBps * (1 - tolerance):
                drop = 100 * (1 - cur.algbw_GBps / old.algbw_GBps)
                out.append(f"size {r.size_bytes} B: {s} algbw {cur.algbw_GBps:.4g} GB/s is {drop:.0f} % below the "
                           f"baseline's {old.algbw_GBps:.4g} GB/s (tolerance {tolerance * 100:.0f} %)")
    return out


# ==== runtime log ================================================================================

_SETUP = re.compile(r"MSCCL: Setup Kernel finished")
_ALGO_DIR = re.compile(r"Using MSCCL Algo files from\s*(\S*)")
_CONNECTED = re.compile(r"Connected (\d+) MSCCL algorithms")
_PARSED = re.compile(r"Parsed MSCCL Algorithm (\S+) successfully")
_VERSION = re.compile(r"NCCL version (\d+\.\d+\.\d+)")


def check_runtime(log_text: str) -> tuple[bool, str]:
    """Reads NCCL's INFO log (NCCL_DEBUG=INFO, NCCL_DEBUG_SUBSYS=INIT,ENV; msccl-xml.md §12.2) and
    says whether MSCCL ran: the executor and RCCL print "MSCCL: Setup Kernel finished" on every
    launch of an MSCCL algorithm; legacy MSCCL prints "Connected N MSCCL algorithms" at init (it
    has no per-launch line, so that proves loading, not use)."""
    launches = len(_SETUP.findall(log_text))
    dirs = sorted(set(_ALGO_DIR.findall(log_text)))
    connected = [int(x) for x in _CONNECTED.findall(log_text)]
    versions = sorted(set(_VERSION.findall(log_text)))
    ver = f" (NCCL {', '.join(versions)})" if versions else ""
    if "MSCCL doesn't support multiple GPUs in one process" in log_text:
        return False, ("MSCCL did not run: it turns itself off when one process drives several GPUs; use one "
                       "process per GPU (torchrun --nproc_per_node=N)" + ver)
    if launches:
        src = f" from {dirs[0]}" if dirs else ""
        return True, f"MSCCL ran: {launches} kernel launches of MSCCL algorithms{src}{ver}"
    if connected and max(connected) > 0:
        return True, (f"legacy MSCCL loaded {max(connected)} algorithms{ver}; it prints no per-launch line, so "
                      f"this proves loading, not that a call used one")
    if dirs or connected:
        where = f" from {dirs[0]}" if dirs else ""
        return False, (f"MSCCL did not run: the runtime looked for algorithms{where} but no launch used one "
                       f"(check coll, ngpus = world size, minBytes..maxBytes, the in-place flags and that "
                       f"nchunksperloop divides the element count){ver}")
    if not log_text.strip() or "NCCL INFO" not in log_text:
        return False, ("MSCCL did not run, or the log does not show it: no NCCL INFO lines (set NCCL_DEBUG=INFO "
                       "NCCL_DEBUG_SUBSYS=INIT,ENV before the process starts)")
    return False, ("MSCCL did not run: NCCL logged no MSCCL line; the libnccl in use is not MSCCL-enabled "
                   f"(LD_PRELOAD the executor's build/lib/libnccl.so.2; check torch.cuda.nccl.version()){ver}")


# ==== sizes and expectations =====================================================================

def parse_sizes(text: str) -> list[int]:
    """'1KB:1MB' (doubling, like nccl-tests -f 2), 'LO:HI:FACTOR', '4096,65536', or one size."""
    text = str(text).strip()
    if "," in text:
        return [parse_size(t, "--sizes") for t in text.split(",") if t.strip()]
    parts = text.split(":")
    if len(parts) == 1:
        return [parse_size(text, "--sizes")]
    if len(parts) not in (2, 3):
        raise CompileError(f"--sizes: {text!r} is not LO:HI, LO:HI:FACTOR or a list (example: 1KB:1GB)")
    lo, hi = parse_size(parts[0], "--sizes"), parse_size(parts[1], "--sizes")
    factor = 2
    if len(parts) == 3:
        try:
            factor = int(parts[2])
        except ValueError:
            factor = 0
        if factor < 2:
            raise CompileError(f"--sizes: factor {parts[2]!r} must be a whole number >= 2")
    if lo > hi:
        raise CompileError(f"--sizes: {text!r} has LO above HI")
    out = []
    s = lo
    while s <= hi:
        out.append(s)
        s *= factor
    return out


def _count(coll: str, E: int, n: int) -> int:
    return E // n if coll in ("allgather", "reduce_scatter", "alltoall", "scatter", "gather") else E


def _per_rank_multiple(coll: str, n: int) -> int:
    return n if coll in ("allgather", "reduce_scatter", "alltoall", "scatter", "gather") else 1


def _input_elems(coll: str, E: int, n: int) -> int:
    return E // n if coll in ("allgather", "gather") else E


def expected_output(coll: str, rank: int, n: int, E: int, root: int | None, op: str, dtype: torch.dtype,
                    seed: int, device="cpu") -> torch.Tensor | None:
    """What this rank's output must be, computed from every rank's seeded input (None where the
    collective defines no output for this rank)."""
    m = _input_elems(coll, E, n)
    inp = lambda r: td.make_input(r, m, dtype, seed, op, device)  # noqa: E731
    red = {"sum": torch.add, "prod": torch.mul, "max": torch.maximum, "min": torch.minimum}[op]
    c = E // n

    def reduced(sl: slice | None):
        acc = None
        for r in range(n):
            x = inp(r) if sl is None else inp(r)[sl]
            acc = x.clone() if acc is None else red(acc, x)
        return acc

    if coll in ("allgather", "gather"):
        return torch.cat([inp(r) for r in range(n)]) if coll == "allgather" or rank == root else None
    if coll == "alltoall":
        return torch.cat([inp(s)[rank * c:(rank + 1) * c] for s in range(n)])
    if coll == "reduce_scatter":
        return reduced(slice(rank * c, (rank + 1) * c))
    if coll == "allreduce":
        return reduced(None)
    if coll == "reduce":
        return reduced(None) if rank == root else None
    if coll == "broadcast":
        return inp(root)
    if coll == "scatter":
        return inp(root)[rank * c:(rank + 1) * c]
    raise CompileError(f"bench: no expectation for collective {coll!r}")


# ==== the sweep ==================================================================================

@dataclass
class _Case:
    index: int
    requested: int
    E: int
    algo: str | None = None  # file path or program name
    program: object = None  # Program for the executor (CPU)
    root: int | None = None


def _torch_call(coll: str, inplace: bool, rank: int, n: int, root: int | None, op: str, group=None):
    """A function(work_in) -> output running torch's collective the way nccl-tests would time it
    (no copies inside the timed call). `inplace` aliases buffers as msccl-xml.md §10 classifies."""
    from compiler.specs.collectives import _call
    rop = td.reduce_op(op)
    ag = _call(dist, "all_gather_into_tensor")
    rs = _call(dist, "reduce_scatter_tensor")

    def window(x: torch.Tensor) -> torch.Tensor:
        """This rank's slice of the whole buffer x in an in-place call (compiler.model.demand.inplace_alias,
        counted in elements)."""
        m = x.numel() // n
        start = inplace_alias(coll, rank, m, m).offset
        return x[start:start + m]

    def call(x: torch.Tensor, out: torch.Tensor | None) -> torch.Tensor:
        if coll == "allgather":
            if inplace:  # x is the whole output; this rank's slice is the input
                ag(x, window(x), group=group)
                return x
            ag(out, x, group=group)
            return out
        if coll == "reduce_scatter":
            if inplace:  # x is the whole input; this rank's slice is the output
                rs(window(x), x, op=rop, group=group)
                return window(x)
            rs(out, x, op=rop, group=group)
            return out
        if coll == "alltoall":
            dist.all_to_all_single(out, x, group=group)
            return out
        if coll == "allreduce":
            dist.all_reduce(x, op=rop, group=group)
            return x
        if coll == "broadcast":
            dist.broadcast(x, src=root, group=group)
            return x
        if coll == "reduce":
            dist.reduce(x, dst=root, op=rop, group=group)
            return x
        if coll == "scatter":
            dist.scatter(out, list(x.chunk(n)) if rank == root else None, src=root, group=group)
            return out
        if coll == "gather":
            parts = list(out.chunk(n)) if rank == root else None
            dist.gather(x, parts, dst=root, group=group)
            return out
        raise CompileError(f"bench: collective {coll!r} has no torch.distributed call")
    return call


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def _bench_cases(payload: dict, rank: int, n: int, group=None, emit=None) -> list[dict]:
    """Runs inside a process group: every case, both requested sides. Returns rows (same on all
    ranks). `emit("progress", k)` at each size keeps launch_local's watchdog (per size) alive."""
    import warnings
    warnings.simplefilter("ignore", FutureWarning)
    coll, dtype, op, device = payload["collective"], payload["dtype"], payload["op"], payload["device"]
    iters, warmup, timeout = payload["iters"], payload["warmup"], payload["timeout"]
    call_inplace = payload["inplace"] or coll in INPLACE_CALLS
    rows = []
    for case in payload["cases"]:
        if emit is not None:
            emit("progress", case.index)
        E, root = case.E, case.root
        m = _input_elems(coll, E, n)
        seed = payload["seed"] + case.index
        inp = td.make_input(rank, m, dtype, seed, op, device)
        want = expected_output(coll, rank, n, E, root, op, dtype, seed, device)
        out_elems = {"allgather": E, "gather": E, "alltoall": E}.get(coll, E // n)
        row = {}
        for side in payload["sides"]:
            if side == "msccl" and case.algo is None:
                continue
            torch_side = side == "default" or payload["backend"] == "nccl"
            if torch_side:
                tcall = _torch_call(coll, call_inplace, rank, n, root, op, group)
                if coll == "allgather" and call_inplace:
                    def fresh(x=inp):
                        buf = torch.empty(E, dtype=dtype, device=device)
                        start = inplace_alias(coll, rank, m, E).offset
                        buf[start:start + m].copy_(x)
                        return buf
                else:
                    def fresh(x=inp):
                        return x.clone()
                out = torch.empty(out_elems, dtype=dtype, device=device)

                def run_once(x, out=out, tcall=tcall):
                    return tcall(x, out)
            else:
                plan = td.prepare(case.program, call_inplace)

                def fresh(x=inp):
                    return x.clone()

                def run_once(x, plan=plan):
                    return td.execute(plan, x, op, timeout, inplace=call_inplace, group=group)
            got = run_once(fresh())
            _sync(device)
            wrong = 0
            if want is not None:
                got = got.reshape(-1)[:want.numel()]
                wrong = int((got != want).sum()) if got.shape == want.shape else want.numel()
            x = fresh()
            for _ in range(warmup):
                run_once(x)
            _sync(device)
            dist.barrier(group=group)
            t0 = time.perf_counter()
            for _ in range(iters):
                run_once(x)
            _sync(device)
            dt = (time.perf_counter() - t0) / iters
            red_dev = device if payload["backend"] == "nccl" else "cpu"
            stats = torch.tensor([dt, float(wrong)], dtype=torch.float64, device=red_dev)
            tmax = stats[:1].clone()
            dist.all_reduce(tmax, op=dist.ReduceOp.MAX, group=group)
            wsum = stats[1:].clone()
            dist.all_reduce(wsum, group=group)
            row[side] = (float(tmax.item()), int(wsum.item()))
        rows.append(row)
    return rows


def _bench_worker(rank: int, n: int, payload: dict, emit) -> list[dict] | None:
    rows = _bench_cases(payload, rank, n, emit=emit)
    if payload.get("check_log_dir"):
        return {"rows": rows, "log": _read_logs(payload["check_log_dir"])} if rank == 0 else None
    return rows if rank == 0 else None


def _own_log_path() -> str | None:
    """This process's NCCL_DEBUG_FILE, with NCCL's %h (host) and %p (pid) expanded."""
    import socket
    pattern = os.environ.get("NCCL_DEBUG_FILE")
    return pattern.replace("%h", socket.gethostname()).replace("%p", str(os.getpid())) if pattern else None


def _gather_verdicts(n: int) -> tuple[bool, str]:
    """Every rank reads its own NCCL log; rank 0 gets (ran everywhere, one line)."""
    path = _own_log_path()
    text = ""
    if path:
        try:
            text = Path(path).read_text(errors="replace")
        except OSError:
            pass
    verdicts = [None] * n
    dist.all_gather_object(verdicts, check_runtime(text))
    missing = [r for r, (ran, _) in enumerate(verdicts) if not ran]
    if not missing:
        return True, f"all {n} ranks: {verdicts[0][1]}"
    return False, f"ranks {missing}: {verdicts[missing[0]][1]}"


def _read_logs(directory: str) -> str:
    out = []
    for f in sorted(Path(directory).glob("nccl.*.log")):
        try:
            out.append(f.read_text(errors="replace"))
        except OSError:
            pass
    return "\n".join(out)


def _cases(coll: str, sizes: list[int], n: int, itemsize: int, inplace: bool, xml, library_dir, runtime: str,
           notes: list[str]) -> list[_Case]:
    """Per size: the element count actually run and the algorithm for the MSCCL side."""
    from backends.msccl_xml import read_xml
    call_inplace = inplace or coll in INPLACE_CALLS
    headers = None
    single = None
    if xml is not None:
        single = read_xml(xml)
        if single.collective != coll:
            raise CompileError(f"--xml: {xml} is a {single.collective} algorithm, not {coll}")
        if single.ngpus != n:
            raise CompileError(f"--xml: {xml} has ngpus={single.ngpus}, but the run has {n} ranks")
        if not (single.inplace if call_inplace else single.outofplace):
            kind = "in-place" if call_inplace else "out-of-place"
            why = " (torch's all_reduce/broadcast/reduce are in-place calls)" if coll in INPLACE_CALLS else ""
            notes.append(f"{Path(str(xml)).name} is not marked usable for {kind} calls{why}: the runtime would not "
                         f"select it; the executor runs it anyway")
    elif library_dir is not None:
        headers = [td.read_header(f) for f in td.algorithm_files(library_dir, runtime)]
        for problem in td.check_bands(headers, runtime):
            notes.append(f"library: {problem}")
    cache: dict[str, object] = {}
    cases = []
    unit = _per_rank_multiple(coll, n)
    for k, size in enumerate(sizes):
        E = size // itemsize // unit * unit
        algo, program = None, None
        if single is not None:
            N = single.nchunksperloop
            E = E // N * N
            algo, program = Path(str(xml)).name if not str(xml).lstrip().startswith("<") else single.name, single
        elif headers is not None:
            h = td.select_algorithm(headers, coll, E * itemsize, n, itemsize, call_inplace)
            if h is None:
                why = td.why_not_selected(headers, coll, E * itemsize, n, itemsize, call_inplace)
                notes.append(f"size {size} B: no library file is selected ({why}); the runtime would use NCCL's "
                             f"own algorithm: no msccl column")
            else:
                algo = h.label
                program = cache.get(h.path) or cache.setdefault(h.path, read_xml(h.path))
        if E == 0:
            raise CompileError(f"--sizes: {size} B is below one element per chunk for {coll} on {n} ranks")
        if E * itemsize != size:
            notes.append(f"size {size} B rounded down to {E * itemsize} B (whole chunks)")
        root = None
        if coll in ("broadcast", "reduce", "scatter", "gather"):
            from compiler.program.semantics import root_candidates
            root = root_candidates(program)[0] if program is not None else 0
        cases.append(_Case(k, size, E, algo, program, root))
    return cases


def default_side_env(runtime: str) -> dict[str, str | None]:
    """The environment of the default side on GPUs: no MSCCL variables, and MSCCL switched off
    (the executor and RCCL also look for algorithms next to their library when MSCCL_ALGO_DIR is
    unset). None = unset."""
    env: dict[str, str | None] = {k: None for k in MSCCL_ENV_VARS}
    if runtime == "executor":
        env["MSCCL_ENABLE"] = "0"
    elif runtime == "rccl":
        env["RCCL_MSCCL_ENABLE"] = "0"
    return env


def gpu_script(collective: str, algos: str, runtime: str = "executor", nproc: int = 8, sizes: str = "1KB:1GB",
               nccl_lib: str = "$HOME/msccl-executor-nccl/build/lib/libnccl.so.2", iters: int = 20,
               warmup: int = 5, out: str | None = None, baseline: str | None = None) -> str:
    """A bash script (templates/bench_gpu.sh.j2) that benchmarks on GPUs: checks the preloaded
    library, runs the default side, then the MSCCL side with --check-runtime and --default-from.
    `algos`: a library directory, or one XML file (--xml)."""
    import shlex
    from importlib import resources

    import jinja2

    coll = canonical(collective)
    td.runtime_spec(runtime)
    source = f"--library {shlex.quote(algos)}" if not str(algos).endswith(".xml") else f"--xml {shlex.quote(algos)}"
    disable = " ".join(f"{k}={v}" for k, v in default_side_env(runtime).items() if v is not None)
    text = resources.files("templates").joinpath("bench_gpu.sh.j2").read_text(encoding="utf-8")
    env = jinja2.Environment(autoescape=False, keep_trailing_newline=True, undefined=jinja2.StrictUndefined)
    return env.from_string(text).render(
        collective=coll, algos=algos, runtime=runtime, nproc=int(nproc), sizes=sizes, nccl_lib=nccl_lib,
        iters=int(iters), warmup=int(warmup), out=out or f"bench-{coll}", source=source, disable=disable,
        baseline=shlex.quote(baseline) if baseline else None)


def _algo_dir_for(xml: str, runtime: str) -> tuple[str, str]:
    """A directory holding only `xml` (the executor and RCCL load directories); for old, the file."""
    if runtime == "old":
        return xml, ""
    d = tempfile.mkdtemp(prefix="msccl-algo-")
    os.symlink(os.path.abspath(xml), os.path.join(d, os.path.basename(xml)))
    return d, d


def sweep(collective: str, sizes: list[int], xml: str | os.PathLike | None = None,
          library_dir: str | os.PathLike | None = None, iters: int = 20, warmup: int = 5, nprocs: int = 4, *,
          dtype: torch.dtype | str = torch.float32, op: str = "sum", inplace: bool = False, timeout: float = 60.0,
          runtime: str = "executor", sides: tuple[str, ...] = SIDES, seed: int = 0, device: str | None = None,
          check_log: bool = False) -> BenchResult:
    """Times torch's default collective and the MSCCL algorithm (`xml`, or per size from
    `library_dir`) for each size. Inside an initialised process group (torchrun) it runs on the
    existing group (every rank must call it; all get the result); otherwise it spawns `nprocs`
    local processes. device: "cpu" (gloo, our executor) or "cuda" (nccl, the MSCCL runtime through
    the environment); default cuda when available and no group exists yet."""
    coll = canonical(collective)
    if xml is not None and library_dir is not None:
        raise CompileError("bench: give --xml or --library, not both")
    if iters < 1 or warmup < 0:
        raise CompileError(f"--iters/--warmup: {iters}/{warmup}: need iters >= 1 and warmup >= 0")
    if not sizes:
        raise CompileError("--sizes: no sizes")
    bad = [s for s in sides if s not in SIDES]
    if bad or not sides:
        raise CompileError(f"--side: {bad[0] if bad else ''!r} is not a side ({', '.join(SIDES)}, both)")
    dt = td.parse_dtype(dtype)
    opn = td.op_name(op)
    in_group = dist.is_available() and dist.is_initialized()
    if in_group:
        n = dist.get_world_size()
        backend = dist.get_backend()
        device = "cuda" if backend == "nccl" else "cpu"
    else:
        n = nprocs
        if device is None:
            device = "cuda" if torch.cuda.is_available() else "cpu"
        backend = "nccl" if device.startswith("cuda") else "gloo"
    notes: list[str] = []
    itemsize = torch.empty((), dtype=dt).element_size()
    cases = _cases(coll, list(sizes), n, itemsize, inplace, xml, library_dir, runtime, notes)
    has_msccl = any(c.algo for c in cases)
    if not has_msccl:
        sides = tuple(s for s in sides if s != "msccl")
        if xml is None and library_dir is None:
            notes.append("no --xml or --library: default side only")
    gpu = backend == "nccl"
    source = f"{runtime} runtime" if gpu else "our executor, CPU"
    if gpu and coll == "alltoall":
        notes.append("PyTorch's all_to_all_single has used grouped send/recv on CUDA, not ncclAllToAll: an "
                     "alltoall file may never be selected (msccl-xml.md §12.3)")
    if gpu:
        notes.append(f"torch.cuda.nccl.version() = {'.'.join(map(str, torch.cuda.nccl.version()))}")
    payload = {"collective": coll, "dtype": dt, "op": opn, "device": device, "iters": iters, "warmup": warmup,
               "timeout": timeout, "inplace": inplace, "backend": backend, "seed": seed, "cases": cases}
    per_case = 2 * timeout * (iters + warmup + 2) + 10  # watchdog per size: two sides, each call bounded
    log_text = None
    if in_group:
        if gpu and len(sides) > 1:
            raise CompileError("bench: on GPUs a process loads MSCCL once, so one launch measures one side: run "
                               "with --side default, then with --side msccl (and --default-from the first JSON)")
        rows = _bench_cases({**payload, "sides": sides}, dist.get_rank(), n)
        if check_log and gpu:
            log_text = _gather_verdicts(n)
    elif not gpu:
        rows = td.launch_local(_bench_worker, n, {**payload, "sides": sides}, timeout=per_case)[0]
    else:
        rows = [{} for _ in cases]
        cleanup = []
        try:
            for side in sides:
                env = default_side_env(runtime) if side == "default" else {k: None for k in MSCCL_ENV_VARS}
                pl = {**payload, "sides": ("msccl",) if side == "msccl" else ("default",)}
                if side == "msccl":
                    if xml is not None:
                        path, tmp = _algo_dir_for(str(xml), runtime)
                        cleanup.append(tmp)
                    else:
                        path = str(library_dir)
                    env.update(td.msccl_env(runtime, path, n))
                    if check_log:
                        logdir = tempfile.mkdtemp(prefix="msccl-log-")
                        cleanup.append(logdir)
                        env.update({"NCCL_DEBUG": os.environ.get("NCCL_DEBUG", "INFO"),
                                    "NCCL_DEBUG_SUBSYS": os.environ.get("NCCL_DEBUG_SUBSYS", "INIT,ENV"),
                                    "NCCL_DEBUG_FILE": os.path.join(logdir, "nccl.%h.%p.log")})
                        pl["check_log_dir"] = logdir
                got = td.launch_local(_bench_worker, n, pl, timeout=per_case, env=env, backend="nccl")[0]
                if isinstance(got, dict):
                    log_text = got["log"]
                    got = got["rows"]
                for r, g in zip(rows, got):
                    r.update(g)
        finally:
            import shutil
            for d in cleanup:
                if d:
                    shutil.rmtree(d, ignore_errors=True)
    if check_log:
        if isinstance(log_text, tuple):  # verdicts gathered from every rank (torchrun)
            ran_all, msg = log_text
            notes.append(f"check-runtime: {msg}")
            if not ran_all:
                notes.append("check-runtime: FAILED")
        elif log_text is None:
            notes.append("check-runtime: MSCCL is not in the path on CPU (gloo): the msccl columns come from "
                         "msccl-compile's executor" if not gpu else
                         "check-runtime: no log collected here; pass the NCCL log to check_runtime")
        else:
            ran, msg = check_runtime(log_text)
            notes.append(f"check-runtime: {msg}")
            if not ran:
                notes.append("check-runtime: FAILED")
    out_rows = []
    redop = opn if coll in ("allreduce", "reduce_scatter", "reduce") else "none"
    tname = NCCL_TYPE_NAMES.get(td.dtype_name(dt), td.dtype_name(dt))
    for c, r in zip(cases, rows):
        S = c.E * itemsize
        sides_res = {}
        for s, (t, wrong) in r.items():
            algbw = S / t / 1e9 if t > 0 else 0.0
            sides_res[s] = SideResult(t * 1e6, algbw, busbw(coll, n, algbw), wrong)
        out_rows.append(BenchRow(S, _count(coll, c.E, n), tname, redop, sides_res.get("default"),
                                 sides_res.get("msccl"), c.algo, c.requested))
    return BenchResult(coll, n, td.dtype_name(dt), opn, inplace, backend, source, iters, warmup, tuple(out_rows),
                       tuple(notes))


# ==== command line ===============================================================================

def _under_torchrun() -> bool:
    return all(k in os.environ for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK"))


def run(args) -> int:
    """Runs the options of `configure`. Exit status 0, or 1 on #wrong > 0, a regression, or
    MSCCL not running under --check-runtime; CompileError for user errors."""
    if args.check_log:
        try:
            text = Path(args.check_log).read_text(errors="replace")
        except OSError as e:
            raise CompileError(f"--check-log: {args.check_log}: {e.strerror or e}") from None
        ran, msg = check_runtime(text)
        print(msg)
        return 0 if ran else 1
    sizes = parse_sizes(args.sizes)
    sides = SIDES if args.side == "both" else (args.side,)
    if not 0 <= args.tolerance < 1:
        raise CompileError(f"--tolerance: {args.tolerance} must be in [0, 1)")
    rank = 0
    created = False
    if _under_torchrun() and not dist.is_initialized():
        import datetime
        world = int(os.environ["WORLD_SIZE"])
        gpu = args.device != "cpu" and torch.cuda.is_available()
        if gpu:
            torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
            if sides == ("default",):
                for k, v in default_side_env(args.runtime).items():
                    os.environ.pop(k, None) if v is None else os.environ.__setitem__(k, v)
            elif "msccl" in sides and len(sides) == 1 and (args.xml or args.library):
                path = args.library or _algo_dir_for(args.xml, args.runtime)[0]
                os.environ.update(td.msccl_env(args.runtime, path, world))  # before the first communicator
            if args.check_runtime:  # NCCL reads these at its first communicator too
                os.environ.setdefault("NCCL_DEBUG", "INFO")
                os.environ.setdefault("NCCL_DEBUG_SUBSYS", "INIT,ENV")
                os.environ.setdefault("NCCL_DEBUG_FILE", os.path.join(tempfile.gettempdir(),
                                                                      "msccl-bench-nccl.%h.%p.log"))
        dist.init_process_group("nccl" if gpu else "gloo", timeout=datetime.timedelta(seconds=args.timeout * 4))
        created = True
    try:
        if dist.is_initialized():
            rank = dist.get_rank()
        result = sweep(args.collective, sizes, xml=args.xml, library_dir=args.library, iters=args.iters,
                       warmup=args.warmup, nprocs=args.nprocs, dtype=args.dtype, op=args.op, inplace=args.inplace,
                       timeout=args.timeout, runtime=args.runtime, sides=sides, device=args.device,
                       check_log=args.check_runtime)
    finally:
        if created:
            dist.barrier()  # nobody tears down while a peer still talks to it
            dist.destroy_process_group()
    if rank != 0:
        return 0
    if args.default_from:
        earlier = {r.size_bytes: r for r in BenchResult.load(args.default_from).rows}
        result = replace(result, rows=tuple(replace(r, default=earlier[r.size_bytes].default)
                                            if r.size_bytes in earlier and r.default is None else r
                                            for r in result.rows))
    prefix = args.output or f"bench-{result.collective}"
    notes = result.write(prefix, plot=not args.no_plot)
    if args.json:
        print(result.to_json())
    else:
        print(f"# msccl-compile bench: {result.collective}, {result.nprocs} ranks, {result.backend}, "
              f"iters {result.iters}, warmup {result.warmup}")
        print("\n".join(result.table()))
    for n_ in notes:
        print(f"# note: {n_}")
    print(f"# wrote {prefix}.json, {prefix}.csv" + ("" if notes or args.no_plot else f", {prefix}.png"))
    status = 0
    if result.wrong:
        print(f"# FAILED: {result.wrong} wrong elements", file=sys.stderr)
        status = 1
    if args.baseline:
        csides = SIDES if args.compare_side == "both" else (args.compare_side,)
        regressions = compare(result, BenchResult.load(args.baseline), args.tolerance, csides)
        for line in regressions:
            print(f"# REGRESSION: {line}", file=sys.stderr)
        if regressions:
            sizes_s = ", ".join(sorted({ln.split(":")[0].removeprefix("size ") for ln in regressions}, key=lambda x:
                                       int(x.split()[0])))
            print(f"# regression beyond {args.tolerance * 100:.0f} % at sizes {sizes_s}", file=sys.stderr)
            status = 1
        else:
            print(f"# no regression beyond {args.tolerance * 100:.0f} % against {args.baseline}")
    if args.check_runtime and any(n_ == "check-runtime: FAILED" for n_ in result.notes):
        status = 1
    return status


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m backends.bench", description=__doc__.splitlines()[0])
    configure(parser)
    args = parser.parse_args(argv)
    try:
        return run(args)
    except CompileError as e:
        print(f"bench: error: {e}", file=sys.stderr)
        return e.exit_status


if __name__ == "__main__":
    sys.exit(main())
