"""Bench results: frozen dataclasses, their JSON (format msccl-compile/bench-v1) and the regression
comparison with an earlier run; torch-free. Presentation (table, CSV, plot) is report.py."""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass

from compiler.specs.errors import CompileError

from .options import SIDES

FORMAT = "msccl-compile/bench-v1"


def read_bench_json(path: str | os.PathLike) -> dict:
    """A bench result file's JSON object, its format checked (BenchResult.load and calibrate read
    it): one line naming `path` for a directory, bytes that are not UTF-8, JSON too deep or another
    format."""
    from compiler.fileio import read_input
    from compiler.specs.jsonkeys import loads
    try:
        d = loads(read_input(path, "bench result").decode("utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise CompileError(f"{path}: not a bench result (not JSON: {e})") from None
    if not isinstance(d, dict) or d.get("format") != FORMAT:
        found = d.get("format") if isinstance(d, dict) else None
        raise CompileError(f"{path}: format: {found!r} is not {FORMAT!r} (a bench result's JSON)")
    return d


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
        """One line naming `path` for whatever is wrong with it (a directory, bytes that are not UTF-8,
        JSON too deep or of the wrong shape were internal errors, after the sweep)."""
        d = read_bench_json(path)
        try:
            return cls.from_dict(d)
        except (KeyError, TypeError, AttributeError, ValueError) as e:
            raise CompileError(f"{path}: not a bench result: {type(e).__name__}: {e}") from None

    # ---- presentation (report.py) ----

    def table(self) -> list[str]:
        """nccl-tests' columns, default and MSCCL side by side."""
        from .report import table
        return table(self)

    def csv_text(self) -> str:
        from .report import csv_text
        return csv_text(self)

    def plot(self, path: str | os.PathLike) -> str | None:
        """algbw against size (PNG). Returns a note instead when matplotlib is missing."""
        from .report import plot
        return plot(self, path)

    def write(self, prefix: str | os.PathLike, plot: bool = True) -> list[str]:
        """PREFIX.json, PREFIX.csv and (with matplotlib) PREFIX.png. Returns notes."""
        from .report import write
        return write(self, prefix, plot)


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
