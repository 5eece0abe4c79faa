"""Bench results for people: nccl-tests' table, CSV, and algbw against size as a PNG (matplotlib,
optional). Each function takes a BenchResult (results.py; its methods call these)."""

from __future__ import annotations

import csv
import io
import os
import statistics
from typing import TYPE_CHECKING

from compiler.fileio import atomic_write

from .options import SIDES

if TYPE_CHECKING:
    from .results import BenchResult


def table(result: "BenchResult") -> list[str]:
    """nccl-tests' columns, default and MSCCL side by side."""
    has = {s: any(r.side(s) for r in result.rows) for s in SIDES}
    head1 = f"#{'':>12} {'':>13} {'':>9} {'':>6}"
    head2 = f"#{'size':>12} {'count':>13} {'type':>9} {'redop':>6}"
    head3 = f"#{'(B)':>12} {'(elements)':>13} {'':>9} {'':>6}"
    titles = {"default": "default (torch)", "msccl": f"msccl ({result.msccl_source})"}
    for s in SIDES:
        if has[s]:
            head1 += f"  {titles[s]:<39}"
            head2 += f"  {'time':>9} {'algbw':>9} {'busbw':>9} {'#wrong':>7}"
            head3 += f"  {'(us)':>9} {'(GB/s)':>9} {'(GB/s)':>9} {'':>7}"
    if any(r.algo for r in result.rows):
        head2 += "  algo"
    lines = [head1.rstrip(), head2, head3.rstrip()]
    for r in result.rows:
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
    lines.append(f"# Out of bounds values : {result.wrong} {'OK' if result.wrong == 0 else 'FAILED'}")
    for s in SIDES:
        vals = [r.side(s).busbw_GBps for r in result.rows if r.side(s)]
        if vals:
            lines.append(f"# Avg bus bandwidth ({s}) : {statistics.fmean(vals):.4f}")
    lines += [f"# note: {n}" for n in result.notes]
    return lines


def csv_text(result: "BenchResult") -> str:
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    cols = ["time_us", "algbw_GBps", "busbw_GBps", "wrong"]
    w.writerow(["size_bytes", "count", "type", "redop"] + [f"{s}_{c}" for s in SIDES for c in cols] + ["algo"])
    for r in result.rows:
        row = [r.size_bytes, r.count, r.type, r.redop]
        for s in SIDES:
            v = r.side(s)
            row += [getattr(v, c) for c in cols] if v else [""] * len(cols)
        w.writerow(row + [r.algo or ""])
    return buf.getvalue()


def plot(result: "BenchResult", path: str | os.PathLike) -> str | None:
    """algbw against size (PNG). Returns a note instead when matplotlib is missing."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "matplotlib is not installed: no plot (pip install matplotlib)"
    fig, ax = plt.subplots(figsize=(7, 4.5))
    labels = {"default": "default (torch)", "msccl": f"msccl ({result.msccl_source})"}
    for s, marker in zip(SIDES, "os"):
        pts = [(r.size_bytes, r.side(s).algbw_GBps) for r in result.rows if r.side(s)]
        if pts:
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker=marker, label=labels[s])
    ax.set_xscale("log", base=2)
    ax.set_xlabel("size (bytes)")
    ax.set_ylabel("algbw (GB/s)")
    ax.set_title(f"{result.collective}, {result.nprocs} ranks, {result.dtype}, {result.backend}")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    fig.tight_layout()
    png = io.BytesIO()
    fig.savefig(png, format="png", dpi=100)
    plt.close(fig)
    atomic_write(path, png.getvalue())
    return None


def write(result: "BenchResult", prefix: str | os.PathLike, with_plot: bool = True) -> list[str]:
    """PREFIX.json, PREFIX.csv and (with matplotlib) PREFIX.png. Returns notes."""
    prefix = str(prefix)
    atomic_write(prefix + ".json", result.to_json() + "\n")
    atomic_write(prefix + ".csv", csv_text(result))
    notes = []
    if with_plot:
        note = plot(result, prefix + ".png")
        if note:
            notes.append(note)
    return notes
