"""How well and how fast `msccl-compile calibrate` finds runtime costs it is not shown.

For each case, programs are compiled on the stock profile, "measured" with the program timer under
hidden costs (the stock values moved: launch x 1.4, step latencies x 1.6, tb_GBps x 0.75, each
time times 1 + noise x sin(...)), and calibrated from the stock profile (on two nodes, from a
profile holding the hidden NVLink values, the network alone: the workflow the README gives).
Prints per protocol the error before and after (RMS of log(model / measured)), the error of the
hidden costs themselves (the noise's floor), the hidden and fitted launch and step latency, the
hidden and fitted lane counts (thread blocks a link carries at once), and the case's fit in seconds
(all its protocols).

    python benchmarks/calibrate.py [--noise 0.02] [--cases dgx-h100,mi250,dgx-h100x2]
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from backends.msccl_xml import read_xml
from compiler.analysis.calibrate import Measurement, fit, link_kinds, rms_log_error, with_cost
from compiler.analysis.links import Costing
from compiler.model.profiles import load_profile_doc, load_topology
from compiler.program.timing import time_program

CASES = {  # name -> (profile, nodes, (method, protocol) programs, the kinds fitted)
    "dgx-h100": ("dgx-h100", 1, [(m, p) for p in ("LL", "LL128", "Simple") for m in ("ring", "direct")], ("nvlink",)),
    "mi250": ("mi250", 1, [(m, p) for p in ("LL", "Simple") for m in ("ring", "relay")], ("xgmi",)),
    "dgx-h100x2": ("dgx-h100", 2, [("hier", "LL"), ("direct", "LL"), ("hier", "Simple"), ("ring", "Simple")],
                   ("network",)),
}
SIZES = [2 ** k for k in range(12, 29, 2)]  # 4 KB to 256 MB
MOVE = {"launch_us": 1.4, "step_us": 1.6, "tb_GBps": 0.75}


def hidden_doc(profile: str, nodes: int, protos: set[str]) -> dict:
    doc, _ = load_profile_doc(profile)
    topo = load_topology(profile, nodes)
    runtime = {"generation": topo.costs.generation, "protocols": {}}
    for p in protos:
        c = topo.costs.protocol(p)
        runtime["protocols"][p] = {
            "launch_us": c.launch * 1e6 * MOVE["launch_us"],
            "step_us": {k: c.step_time(k) * 1e6 * MOVE["step_us"] for k in link_kinds(topo)},
            "tb_GBps": {k: c.tb_rate(k) / 1e9 * MOVE["tb_GBps"] for k in link_kinds(topo)}}
    out = {**doc, "name": f"{doc['name']}-hidden", "runtime": runtime}
    out.pop("aliases", None)
    return out


def lanes(topo, proto: str, kind: str) -> int:
    costing = Costing.of(topo, proto)
    return min(costing.lanes(l.bandwidth, kind) for l in topo.links if (l.kind or "nvlink") == kind)


def run_case(name: str, noise: float, work: Path) -> list[str]:
    profile, nodes, programs, kinds = CASES[name]
    protos = {p for _, p in programs}
    hidden = hidden_doc(profile, nodes, protos)
    (work / "hidden.json").write_text(json.dumps(hidden))
    truth = load_topology(str(work / "hidden.json"), nodes)
    start = load_topology(profile, nodes)
    if kinds != tuple(link_kinds(start)):  # the other kinds as calibrated already: the hidden values
        known = json.loads(json.dumps(hidden))
        for p in known["runtime"]["protocols"].values():
            for field in ("step_us", "tb_GBps"):
                p[field] = {k: v for k, v in p[field].items() if k not in kinds}
        known["name"] = f"{load_profile_doc(profile)[0]['name']}-known"
        (work / "known.json").write_text(json.dumps(known))
        start = load_topology(str(work / "known.json"), nodes)
    ms = []
    for i, (method, proto) in enumerate(programs):
        xml = work / f"{name}-{method}-{proto}.xml"
        done = subprocess.run([sys.executable, "-m", "compiler.cli", "allgather", "--hw", profile, "--nodes", str(nodes),
                               "--method", method, "--proto", proto, "--instances", "1", "--size", "1MB",
                               "--time-limit", "10", "-o", str(xml)], capture_output=True, text=True)
        if done.returncode:
            raise SystemExit(f"{name}: {method}/{proto}: {done.stderr.strip()}")
        program = read_xml(xml)
        for j, size in enumerate(SIZES):
            t = time_program(program, truth, size).finish_time_s * (1 + noise * math.sin(3 * j + 7 * i))
            ms.append(Measurement(f"{xml.name} {size}", program, size, t))
    t0 = time.perf_counter()
    fits = fit(start, ms, kinds)
    took = time.perf_counter() - t0
    rows = []
    for f in fits:
        mine = [m for m in ms if m.program.proto == f.proto]
        measured = [m.time_s for m in mine]
        floor = rms_log_error(np.array([time_program(m.program, truth, m.size_bytes).finish_time_s for m in mine]),
                              np.array(measured))
        h = truth.costs.protocol(f.proto)
        fitted = with_cost(start, f.proto, f.after)
        for k in kinds:
            rows.append(f"{name:<11} {f.proto:<7} {k:<8} {f.rows:>4} {f.error_before:>7.3f} {f.error_after:>6.3f} "
                        f"{floor:>6.3f} {h.launch * 1e6:>7.3g} {f.after.launch * 1e6:>7.3g} "
                        f"{h.step_time(k) * 1e6:>6.3g} {f.after.step_time(k) * 1e6:>6.3g} "
                        f"{lanes(truth, f.proto, k):>6} {lanes(fitted, f.proto, k):>5} {took:>7.1f}")
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--noise", type=float, default=0.02)
    ap.add_argument("--cases", default=",".join(CASES))
    args = ap.parse_args(argv)
    print(f"# calibrate on {platform.node()} ({platform.machine()}, Python {platform.python_version()}); hidden costs: "
          f"launch x {MOVE['launch_us']}, step x {MOVE['step_us']}, tb_GBps x {MOVE['tb_GBps']}; noise {args.noise:g}")
    print(f"{'case':<11} {'proto':<7} {'kind':<8} {'rows':>4} {'before':>7} {'after':>6} {'floor':>6} "
          f"{'launch':>7} {'fit':>7} {'step':>6} {'fit':>6} {'lanes':>6} {'fit':>5} {'case s':>7}")
    with tempfile.TemporaryDirectory() as d:
        for name in args.cases.split(","):
            for row in run_case(name, args.noise, Path(d)):
                print(row, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
