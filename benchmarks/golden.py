"""The outputs a reorganisation must keep: the XML, the --json summary and the saved schedule of a
fixed set of cases, written by the installed CLI in fresh processes.

    python benchmarks/golden.py write DIR      # before a change
    python benchmarks/golden.py check DIR      # after: byte-identical, or the differing files named

Every case stops on something other than the clock (optimality, a baseline, the bound reached), so
two runs of an unchanged compiler give the same bytes. Fields that are wall-clock measurements
(solve_time_s and the like) are dropped from the JSON before comparing; everything else counts.
"""

from __future__ import annotations

import argparse
import filecmp
import json
import subprocess
import sys
from pathlib import Path

CLI = [sys.executable, "-m", "compiler.cli"]
COLLECTIVES = ["allgather", "alltoall", "reduce_scatter", "allreduce", "broadcast", "reduce", "scatter", "gather"]
CASES: list[tuple[str, list[str]]] = (
    [(f"{c}-dgx-a100-1MB", [c, "--hw", "dgx-a100", "--size", "1MB", "--chunks", "1"]) for c in COLLECTIVES]
    + [(f"{c}-dgx2x2-{s}-{m}", [c, "--hw", "dgx2", "--nodes", "2", "--size", s, "--method", m])
       for c, methods in (("allgather", ("hier", "ring")), ("alltoall", ("lp", "ring")))
       for s in ("64KB", "1GB") for m in methods]
    + [("reduce_scatter-mi250-64MB-milp", ["reduce_scatter", "--hw", "mi250", "--size", "64MB", "--method", "milp",
                                           "--chunks", "2"]),
       ("allreduce-dgx2x2-ring-LL-2inst", ["allreduce", "--hw", "dgx2", "--nodes", "2", "--size", "1MB", "--method",
                                           "ring", "--proto", "LL", "--instances", "2"]),
       ("broadcast-dgx1-milp", ["broadcast", "--hw", "dgx1", "--size", "1MB", "--method", "milp", "--root", "3"])]
)
LIBRARY = ["library", "--hw", "dgx-a100", "--collectives", "allgather,allreduce", "--sizes", "1KB:16MB",
           "--band-factor", "16", "--method", "direct"]
CUSTOM = {"chunks": [{"from": 0, "to": [1, 2]}, {"from": 3, "to": [0]}, {"from": [1, 2, 3], "to": [0, 4]}]}
WALL_CLOCK = {"solve_time_s", "time_s_wall"}


def scrub(obj):
    """The JSON without wall-clock fields (and without the file paths of this run)."""
    if isinstance(obj, dict):
        return {k: scrub(v) for k, v in obj.items() if k not in WALL_CLOCK}
    if isinstance(obj, list):
        return [scrub(v) for v in obj]
    return obj


def run(args: list[str], cwd: Path) -> str:
    p = subprocess.run(CLI + args, capture_output=True, text=True, cwd=cwd)
    if p.returncode != 0:
        raise SystemExit(f"golden: {' '.join(args)}: exit {p.returncode}: {p.stderr.strip()}")
    return p.stdout


def write(out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    for name, args in CASES:
        text = run(args + ["-o", f"{name}.xml", "--schedule-out", f"{name}.schedule.json", "--json"], out)
        (out / f"{name}.json").write_text(json.dumps(scrub(json.loads(text)), indent=1, sort_keys=True) + "\n")
        schedule = json.loads((out / f"{name}.schedule.json").read_text())
        (out / f"{name}.schedule.json").write_text(json.dumps(scrub(schedule), sort_keys=True) + "\n")
        print(name, flush=True)
    (out / "demand.json").write_text(json.dumps(CUSTOM))
    for reduce in (False, True):
        (out / "demand.json").write_text(json.dumps({**CUSTOM, "reduce": reduce}))
        name = f"custom-dgx-a100-{'reduce' if reduce else 'copy'}"
        text = run(["custom", "--hw", "dgx-a100", "--demand", "demand.json", "--size", "64MB", "--method", "milp",
                    "-o", f"{name}.xml", "--json"], out)
        (out / f"{name}.json").write_text(json.dumps(scrub(json.loads(text)), indent=1, sort_keys=True) + "\n")
        print(name, flush=True)
    run(LIBRARY + ["-o", "library", "--force"], out)
    manifest = out / "library" / "manifest" / "manifest.json"
    manifest.write_text(json.dumps(scrub(json.loads(manifest.read_text())), indent=1, sort_keys=True) + "\n")
    print("library", flush=True)


def compare(a: Path, b: Path) -> list[str]:
    names = sorted({p.relative_to(a) for p in a.rglob("*") if p.is_file()} |
                   {p.relative_to(b) for p in b.rglob("*") if p.is_file()})
    return [str(n) for n in names if not ((a / n).is_file() and (b / n).is_file() and
                                           filecmp.cmp(a / n, b / n, shallow=False))]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("action", choices=("write", "check"))
    ap.add_argument("dir", type=Path)
    args = ap.parse_args(argv)
    if args.action == "write":
        write(args.dir)
        return 0
    import tempfile
    with tempfile.TemporaryDirectory() as fresh:
        write(Path(fresh))
        differ = compare(args.dir, Path(fresh))
    for name in differ:
        print(f"differs: {name}")
    print(f"{len(differ)} file(s) differ" if differ else "all outputs byte-identical")
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main())
