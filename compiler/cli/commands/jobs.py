"""`msccl-compile jobs JOBS.json --hw NAME [--nodes N] [--objective weighted|fair] -o DIR`: several
jobs planned together on one shared cluster (compiler/jobs/plan.py); one verified XML per job, for
its own communicator, and DIR/manifest/jobs.json with each job's time jointly, alone and naive."""

from __future__ import annotations

import os
import sys

from compiler.cli.common import (ArgumentError, Progress, add_hw, emit_json, load_topology, refuse_disabled_proto,
                                 seconds)
from compiler.model.program import PROTOCOLS
from compiler.specs.runtimes import ALL, CHOICES
from compiler.specs.units import format_size, format_time

HELP = "plan several jobs' collectives together on a shared cluster and write one XML per job"
MANIFEST = os.path.join("manifest", "jobs.json")


def configure(p) -> None:
    from compiler.jobs import OBJECTIVES
    from compiler.planners.registry import METHODS
    p.add_argument("jobs", metavar="JOBS.json",
                   help='{"jobs": [{"name", "collective", "ranks": [GPUs of the composed topology], "size", '
                        '"weight", "start_us"}]}')
    add_hw(p)
    p.add_argument("--objective", choices=OBJECTIVES, default="weighted",
                   help="weighted: least weighted sum of the jobs' times (default); fair: the largest least "
                        "(time alone / time shared) over jobs")
    p.add_argument("-o", "--output", metavar="DIR", required=True, help="directory for the XML files and the manifest")
    p.add_argument("--method", choices=METHODS, default="auto", help="planner for each job alone (default auto)")
    p.add_argument("--time-limit", type=seconds, default=60.0, metavar="S",
                   help="seconds for the whole plan (default 60)")
    p.add_argument("--proto", choices=PROTOCOLS, default="Simple", help="MSCCL protocol (default Simple)")
    p.add_argument("--runtime", choices=CHOICES, default=ALL, help="the runtime to write for (default all)")
    p.add_argument("--json", action="store_true")
    p.set_defaults(run=run)


def check_output_dir(path: str) -> None:
    from compiler.fileio import check_writable
    if os.path.exists(path) and not os.path.isdir(path):
        raise ArgumentError(f"-o: {path}: exists and is not a directory")
    parent = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(parent):
        raise ArgumentError(f"-o: {path}: directory {parent!r} does not exist")
    check_writable(os.path.join(path if os.path.isdir(path) else parent, ".probe"), "-o", path)


def run(args) -> int:
    from compiler.jobs.plan import JobsOptions, plan_jobs
    from compiler.jobs.spec import load_jobs
    check_output_dir(args.output)
    topo = load_topology(args.hw, args.nodes)
    refuse_disabled_proto(args.proto, topo)
    jobs = load_jobs(args.jobs, topo)
    result = plan_jobs(topo, jobs, JobsOptions(args.objective, args.method, args.time_limit, args.runtime, args.proto,
                                               Progress(sys.stderr.isatty())))
    out = write(result, args.output, args.runtime)
    if args.json:
        emit_json(out)
    else:
        print_summary(result, out)
    return 0


def manifest(result, files: dict[str, list[str]], runtimes: dict[str, list[str]]) -> dict:
    topo = result.topology
    jobs = []
    for j in result.jobs:
        s = j.spec
        jobs.append({"name": s.name, "collective": s.collective, "ranks": list(s.ranks), "ngpus": s.ngpus,
                     "communicator": "rank i is the i-th smallest GPU of ranks (as torch.distributed.new_group)",
                     "size_bytes": s.size, "weight": s.weight, "start_us": s.start_s * 1e6, "plan": j.method,
                     "gates": j.gates, "finish_s": j.finish_s, "alone_s": j.alone_s, "naive_s": j.naive_s,
                     "slowdown": j.slowdown, "xml": files[s.name][0], "xml_files": files[s.name],
                     "verified_for": runtimes[s.name]})
    return {
        "format": "msccl-compile/jobs-v1", "hw": topo.profile, "nodes": topo.nodes, "ngpus": topo.ngpus,
        "objective": result.objective, "chosen": result.chosen, "plan_time_s": result.plan_time_s,
        "weighted_sum_s": result.weighted("finish_s"), "naive_weighted_sum_s": result.weighted("naive_s"),
        "alone_weighted_sum_s": result.weighted("alone_s"),
        "judge": "program timer (compiler/program/timing.py) on every job's program overlaid on the shared "
                 "topology; alone: each job's alone plan by itself; naive: every job's alone plan, all together",
        "jobs": jobs,
        "shared_links": [{"link": name, "jobs": list(users)} for name, users in result.shared],
        "candidates": [{"plan": label, "weighted_sum_s": w, "min_alone_over_shared": f}
                       for label, w, f in result.candidates],
        "notes": list(result.notes),
    }


def write(result, directory: str, runtime: str) -> dict:
    """Every job's XML and the manifest (staged: all of them, or none)."""
    import json

    from backends.msccl_xml import save_xml
    from compiler.fileio import atomic_write, make_directory
    from compiler.pipeline import xml_files
    make_directory(os.path.join(directory, "manifest"))
    files, runtimes = {}, {}
    for j in result.jobs:
        judged = j.program.runtimes
        xmls = xml_files(j.program, os.path.join(directory, f"{j.spec.name}.xml"), runtime, judged)
        for f in xmls:
            save_xml(f.program, f.path, f.spelling)
        files[j.spec.name] = [f.path for f in xmls]
        runtimes[j.spec.name] = list(judged)
    # the manifest names its files within DIR, as the library's does (it moves with the directory);
    # the summary names them as the command line gave DIR
    inside = {name: [os.path.relpath(f, directory) for f in paths] for name, paths in files.items()}
    path = os.path.join(directory, MANIFEST)
    atomic_write(path, json.dumps(manifest(result, inside, runtimes), indent=1, sort_keys=True) + "\n")
    return {**manifest(result, files, runtimes), "manifest": path}


def print_summary(result, out: dict) -> None:
    topo = result.topology
    print(f"{len(result.jobs)} jobs on {topo.name} ({topo.ngpus} GPUs), objective {result.objective}: "
          f"chose {result.chosen}, planned in {result.plan_time_s:.1f} s")
    rows = [("job", "GPUs", "weight", "size", "plan", "jointly", "alone", "naive", "slowdown", "xml")]
    for j in result.jobs:
        plan = j.method + (f" +{j.gates} gates" if j.gates else "")
        rows.append((j.spec.name, str(j.spec.ngpus), f"{j.spec.weight:g}", format_size(j.spec.size), plan,
                     format_time(j.finish_s), format_time(j.alone_s), format_time(j.naive_s), f"{j.slowdown:.2f}",
                     out["jobs"][result.jobs.index(j)]["xml"]))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for r in rows:
        print("  ".join(c.ljust(w) if i in (0, 4, 9) else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths))))
    joint, naive = out["weighted_sum_s"], out["naive_weighted_sum_s"]
    print(f"weighted sum: jointly {format_time(joint)}, naive {format_time(naive)} ({joint / naive:.3f} of naive), "
          f"alone {format_time(out['alone_weighted_sum_s'])}")
    if result.shared:
        names = [n for n, _ in result.shared]
        print(f"shared links ({len(names)}): {', '.join(names[:8])}{', ...' if len(names) > 8 else ''}")
    for note in result.notes:
        print(f"  {note}")
    print(f"wrote {len(result.jobs)} XML files and {out['manifest']}")

