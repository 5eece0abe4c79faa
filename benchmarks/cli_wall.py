"""Whole-command wall times: start-up (`msccl-compile --help` beside Python's own start) and the
--time-limit promise (every method returns within 1.1 x limit + 5 s, keeping the best schedule).

    python benchmarks/cli_wall.py [--repeats 7] [--limit 60] [--quick]

Each case runs the installed CLI in a fresh process, as a user would; times are medians of
--repeats runs for start-up, single runs for the planning cases (each takes up to its limit).
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

CLI = [sys.executable, "-m", "compiler.cli"]
# (collective, hw, nodes, size, method); the first is the case (98.6 s for a 60 s limit before)
CASES = [
    ("alltoall", "dgx2", 2, "1MB", "auto"),
    ("allgather", "dgx2", 2, "1MB", "auto"),
    ("allgather", "dgx2", 2, "1MB", "milp"),
    ("allgather", "dgx2", 2, "1MB", "rounds"),
    ("alltoall", "dgx2", 2, "1MB", "lp"),
    ("allgather", "dgx-a100", 8, "1GB", "auto"),
]


def wall(cmd: list[str], cwd: str) -> tuple[float, int, str]:
    t0 = time.perf_counter()
    p = subprocess.run(cmd, capture_output=True, text=True, cwd=cwd)
    return time.perf_counter() - t0, p.returncode, (p.stderr.strip().splitlines() or [""])[-1]


def startup(repeats: int, cwd: str) -> dict:
    python = statistics.median(wall([sys.executable, "-c", "pass"], cwd)[0] for _ in range(repeats))
    helps = statistics.median(wall(CLI + ["--help"], cwd)[0] for _ in range(repeats))
    probe = subprocess.run([sys.executable, "-c", "import sys, compiler.cli as c; c.build_parser(); "
                            "print(sorted(m for m in ('torch', 'numpy', 'scipy', 'cvxpy', 'networkx') "
                            "if m in sys.modules))"], capture_output=True, text=True, cwd=cwd)
    return {"python_s": python, "help_s": helps, "help_minus_python_s": helps - python,
            "heavy_modules_at_help": probe.stdout.strip()}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--limit", type=float, default=60.0, help="--time-limit of the planning cases (default 60)")
    ap.add_argument("--quick", action="store_true", help="start-up only")
    ap.add_argument("--json", help="write the results as JSON")
    args = ap.parse_args(argv)
    out = {"machine": platform.node(), "python": platform.python_version()}
    with tempfile.TemporaryDirectory() as cwd:
        s = startup(args.repeats, cwd)
        out["startup"] = s
        print(f"# start-up on {platform.node()} ({platform.machine()}, Python {platform.python_version()}), "
              f"median of {args.repeats}")
        print(f"python -c pass {s['python_s']:.3f} s; msccl-compile --help {s['help_s']:.3f} s "
              f"(+{s['help_minus_python_s']:.3f} s); heavy modules imported for --help: {s['heavy_modules_at_help']}")
        if args.quick:
            return 0
        print(f"\n# --time-limit {args.limit:g}: whole-command wall time against the promise 1.1 x limit + 5 s")
        print(f"{'case':<44} {'method':<7} {'wall s':>7} {'limit':>6} {'promise':>8}  result")
        rows = []
        promise = 1.1 * args.limit + 5
        for coll, hw, nodes, size, method in CASES:
            cmd = CLI + [coll, "--hw", hw, "--nodes", str(nodes), "--size", size, "--method", method,
                         "--time-limit", str(args.limit), "-o", str(Path(cwd) / "out.xml")]
            t, rc, last = wall(cmd, cwd)
            ok = t <= promise and rc == 0
            rows.append({"case": f"{coll} {hw} x{nodes} {size}", "method": method, "wall_s": t,
                         "limit_s": args.limit, "promise_s": promise, "returncode": rc, "kept": ok, "last_line": last})
            print(f"{coll + ' ' + hw + ' x' + str(nodes) + ' ' + size:<44} {method:<7} {t:>7.1f} {args.limit:>6g} "
                  f"{promise:>8.1f}  {'ok' if ok else 'BROKEN'}{'' if rc == 0 else ' (exit ' + str(rc) + ': ' + last + ')'}",
                  flush=True)
        out["time_limits"] = rows
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
