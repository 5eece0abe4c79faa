"""`msccl-compile calibrate RESULT.json ... --algos DIR --hw NAME -o PROFILE.json`: fit the runtime
cost model to what `msccl-compile bench` measured on real GPUs (compiler/analysis/calibrate.py) and
write a profile whose runtime section carries the fitted values; `--hw PROFILE.json` on any later
command then plans, chooses and reports with them."""

from __future__ import annotations

import copy
import json
import math
import sys
from pathlib import Path

from compiler.cli.common import ArgumentError, Progress, add_hw, emit_json
from compiler.model.costs import LINK_KINDS
from compiler.specs.errors import CompileError

HELP = "fit the runtime cost model to bench results measured on GPUs and write a calibrated profile"


def configure(p) -> None:
    p.add_argument("results", nargs="+", metavar="RESULT.json",
                   help="bench results (`msccl-compile bench ... -o PREFIX` writes PREFIX.json) whose msccl column "
                        "was measured on the GPUs of --hw")
    p.add_argument("--algos", nargs="+", required=True, metavar="DIR|FILE.xml",
                   help="the XML files the bench ran: library directories or files (the results' algo column "
                        "names them)")
    add_hw(p)
    p.add_argument("--kinds", nargs="+", choices=LINK_KINDS, metavar="KIND",
                   help="the link kinds whose step_us and tb_GBps to fit (default: every kind of one node; on "
                        "several nodes, network alone: calibrate one node first and pass its profile as --hw; "
                        "fitting the kinds together is slower and less well posed, as they trade with each other)")
    p.add_argument("-o", "--output", metavar="PROFILE.json",
                   help="the calibrated profile to write (default PROFILE-calibrated.json)")
    p.add_argument("--json", action="store_true")
    p.set_defaults(run=run)


def algorithm_files(paths: list[str]) -> dict[str, Path]:
    """File name -> path of every XML file under `paths` (directories: their *.xml)."""
    out: dict[str, Path] = {}
    for spec in paths:
        p = Path(spec)
        if p.is_dir():
            files = sorted(p.glob("*.xml"))
        elif p.is_file():
            files = [p]
        else:
            raise ArgumentError(f"--algos: {spec}: no such file or directory")
        for f in files:
            seen = out.setdefault(f.name, f)
            if seen != f and seen.read_bytes() != f.read_bytes():
                raise ArgumentError(f"--algos: two different files are named {f.name} ({seen} and {f}): the bench "
                                    "results name files by name alone")
    return out


def _number(value, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        raise CompileError(f"{where}: {value!r} is not a positive finite number")
    return float(value)


def measurements(results: list[str], files: dict[str, Path], topo) -> tuple[list, list[str]]:
    """(Measurement per usable row, notes on the rows left out)."""
    from backends.bench.results import read_bench_json
    from backends.msccl_xml import read_xml
    from compiler.analysis.calibrate import Measurement
    from compiler.program.timing import call_bytes
    from compiler.specs.collectives import COLLECTIVES
    programs, out, notes = {}, [], []
    for path in results:
        doc = read_bench_json(path)
        coll, nprocs = doc.get("collective"), doc.get("nprocs")
        if coll not in COLLECTIVES:
            raise CompileError(f"{path}: collective: {coll!r} is not one of {', '.join(COLLECTIVES)}")
        if nprocs != topo.ngpus:
            raise CompileError(f"{path}: nprocs: {nprocs!r} ranks ran it, but {topo.name} has {topo.ngpus} GPUs")
        if doc.get("backend") != "nccl":
            notes.append(f"{path}: backend {doc.get('backend')!r}: measured without NCCL (not on GPUs?)")
        rows = doc.get("rows")
        if not isinstance(rows, list):
            raise CompileError(f"{path}: rows: {rows!r} is not a list")
        for i, row in enumerate(rows):
            where = f"{path}: rows[{i}]"
            if not isinstance(row, dict):
                raise CompileError(f"{where}: {row!r} is not an object")
            side, algo = row.get("msccl"), row.get("algo")
            if not side or not algo:
                continue  # no MSCCL side at this size: NCCL's own algorithm ran
            if not isinstance(side, dict):
                raise CompileError(f"{where}.msccl: {side!r} is not an object")
            if side.get("wrong"):
                notes.append(f"{where}: left out: {side.get('wrong')} wrong elements (a wrong result's time is no "
                             "measure of the program)")
                continue
            seconds = _number(side.get("time_us"), f"{where}.msccl.time_us") * 1e-6
            size = _number(row.get("size_bytes"), f"{where}.size_bytes")
            if not isinstance(algo, str) or algo not in files:
                raise CompileError(f"{where}.algo: {algo!r} is not among the --algos files")
            program = programs.get(algo) or programs.setdefault(algo, read_xml(files[algo]))
            if program.ngpus != topo.ngpus:
                raise CompileError(f"{files[algo]}: ngpus={program.ngpus}, but {topo.name} has {topo.ngpus} GPUs")
            if program.collective != coll:
                raise CompileError(f"{where}.algo: {algo} is a program of {program.collective}, the result "
                                   f"of {coll!r}")
            out.append(Measurement(f"{Path(path).name} {int(size)} B {algo}", program, call_bytes(program, size),
                                   seconds))
    if not out:
        raise CompileError("calibrate: no row of " + ", ".join(results) + " has a measured msccl column")
    return out, notes


def fitted_kinds(asked: list[str] | None, topo) -> tuple[str, ...]:
    from compiler.analysis.calibrate import link_kinds
    has = link_kinds(topo)
    for k in asked or ():
        if k not in has:
            raise ArgumentError(f"--kinds: {k}: {topo.name} has no {k} links (has: {', '.join(has)})")
    if asked:
        return tuple(sorted(set(asked)))
    return ("network",) if topo.nodes > 1 and "network" in has else has


def _significant(x: float, digits: int = 4) -> float:
    return float(f"{x:.{digits}g}")


def calibrated_doc(doc: dict, topo, fits, results: list[str], kinds: tuple[str, ...]) -> dict:
    """The profile `doc` with the fitted values in its runtime section (four significant digits)."""
    out = copy.deepcopy(doc)
    out["name"] = doc["name"] if doc["name"].endswith("-calibrated") else f"{doc['name']}-calibrated"
    out.pop("aliases", None)
    runtime = out.setdefault("runtime", {})
    runtime.setdefault("generation", topo.costs.generation)
    protocols = runtime.setdefault("protocols", {})
    for f in fits:
        entry = protocols.setdefault(f.proto, {})
        entry["launch_us"] = _significant(f.after.launch * 1e6)
        entry["step_us"] = {**entry.get("step_us", {}), **{k: _significant(f.after.step_time(k) * 1e6) for k in kinds}}
        entry["tb_GBps"] = {**entry.get("tb_GBps", {}), **{k: _significant(f.after.tb_rate(k) / 1e9) for k in kinds}}
    said = "; ".join(f"{f.proto}: {f.rows} rows{f' ({len(f.outliers)} outliers left out)' if f.outliers else ''}, "
                     f"{', '.join(f.decided) or 'nothing'} fitted" for f in fits)
    out["sources"] = {**doc["sources"], f"runtime (calibrated: {', '.join(kinds)})": (
        f"msccl-compile calibrate from {', '.join(Path(r).name for r in results)} on {topo.name}: {said}; the "
        "other values as before")}
    return out


def run(args) -> int:
    import numpy as np

    from compiler.analysis.calibrate import fit, rms_log_error
    from compiler.fileio import atomic_write, check_writable
    from compiler.model.profiles import compose, load_profile_doc, load_topology, validate_profile
    from compiler.program.timing import time_program
    topo = load_topology(args.hw, args.nodes)
    doc, _ = load_profile_doc(args.hw)
    output = args.output or f"{doc['name']}-calibrated.json"
    check_writable(output, "-o")
    kinds = fitted_kinds(args.kinds, topo)
    ms, notes = measurements(args.results, algorithm_files(args.algos), topo)
    fits = fit(topo, ms, kinds, Progress(sys.stderr.isatty() and not args.json))
    notes += [f"{label}: left out of {f.proto}'s fit: the first fit missed it by far more than the other rows"
              for f in fits for label in f.outliers]
    new = validate_profile(calibrated_doc(doc, topo, fits, args.results, kinds), output)
    written = compose(new, args.nodes)  # the rows timed again with the values as written (rounded)
    measured = np.array([m.time_s for m in ms])
    before = np.array([time_program(m.program, topo, m.size_bytes).finish_time_s for m in ms])
    after = np.array([time_program(m.program, written, m.size_bytes).finish_time_s for m in ms])
    atomic_write(output, json.dumps(new, indent=2) + "\n")
    summary = {
        "profile": output, "hw": topo.name, "rows": len(ms), "notes": notes,
        "error_before": rms_log_error(before, measured), "error_after": rms_log_error(after, measured),
        "protocols": {f.proto: {"rows": f.rows, "fitted": list(f.decided), "outliers": list(f.outliers),
                                "before": _params(f.before, kinds),
                                "after": _params(dict(written.costs.protocols)[f.proto], kinds)}
                      for f in fits},
        "measurements": [{"row": m.label, "proto": m.program.proto, "measured_us": m.time_s * 1e6,
                          "model_before_us": b * 1e6, "model_after_us": a * 1e6}
                         for m, b, a in zip(ms, before, after)]}
    if args.json:
        emit_json(summary)
        return 0
    _print(summary)
    return 0


def _params(cost, kinds) -> dict:
    return {"launch_us": cost.launch * 1e6, "step_us": {k: cost.step_time(k) * 1e6 for k in kinds},
            "tb_GBps": {k: cost.tb_rate(k) / 1e9 for k in kinds}}


def _print(s: dict) -> None:
    print(f"calibrated {s['hw']} from {s['rows']} measurements: the program timer's error (RMS of log(model / "
          f"measured)) {s['error_before']:.3f} -> {s['error_after']:.3f}")
    for proto, p in s["protocols"].items():
        b, a = p["before"], p["after"]
        parts = [f"launch_us {b['launch_us']:.4g} -> {a['launch_us']:.4g}"]
        for k in a["step_us"]:
            parts.append(f"step_us.{k} {b['step_us'][k]:.4g} -> {a['step_us'][k]:.4g}")
            parts.append(f"tb_GBps.{k} {b['tb_GBps'][k]:.4g} -> {a['tb_GBps'][k]:.4g}")
        fitted = ", ".join(p["fitted"]) or "nothing"
        print(f"  {proto} ({p['rows']} rows; the measurements decide {fitted}): " + ", ".join(parts))
    print(f"  {'row':<44} {'proto':<6} {'measured us':>12} {'model before':>12} {'after':>10}")
    for m in s["measurements"]:
        print(f"  {m['row']:<44} {m['proto']:<6} {m['measured_us']:>12.4g} {m['model_before_us']:>12.4g} "
              f"{m['model_after_us']:>10.4g}")
    for n in s["notes"]:
        print(f"  note: {n}")
    print(f"wrote {s['profile']} (use it as --hw {s['profile']})")
