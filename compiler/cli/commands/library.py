"""`msccl-compile library --hw NAME -o DIR`: one verified XML per collective and size band, and a manifest."""

from __future__ import annotations

import json
import sys

from compiler.cli.common import (ArgumentError, Progress, add_hw, emit_json, load_topology, number,
                                 refuse_disabled_proto, refuse_foreign_runtime, seconds, size_range_arg)
from compiler.model.program import PROTOCOLS
from compiler.specs.errors import CompileError
from compiler.specs.runtimes import DEFAULT, NAMES
from compiler.specs.units import format_size

HELP = "plan a size-banded algorithm library for a system and write it as a directory"


def configure(p) -> None:
    add_hw(p)
    p.add_argument("--collectives", default="allgather,allreduce", help="comma-separated (default allgather,allreduce)")
    p.add_argument("--sizes", type=size_range_arg, default=(1024, 2**30), metavar="LO:HI",
                   help="range of sizes covered, inclusive (default 1KiB:1GiB)")
    p.add_argument("--band-factor", type=number(int, 2), default=4,
                   help="the bands planned span this factor of sizes (default 4); the bands written are where "
                        "their programs cross over under the program timer")
    p.add_argument("--method", default="auto")
    p.add_argument("--time-limit", type=seconds, default=10.0, metavar="S",
                   help="seconds of planning per band (default 10)")
    p.add_argument("--proto", choices=("auto",) + PROTOCOLS, default="auto",
                   help="auto (default): per band, the fastest program under the profile's runtime cost model")
    p.add_argument("--runtime", choices=NAMES, default=DEFAULT)
    p.add_argument("-o", "--output", required=True, metavar="DIR")
    p.add_argument("--force", action="store_true",
                   help="replace XML files already in DIR (a file of another kind is refused: the runtimes would "
                        "parse it)")
    p.add_argument("--json", action="store_true")
    p.set_defaults(run=run)


def run(args) -> int:
    from pathlib import Path

    from backends.msccl_xml import save_xml
    from compiler.fileio import atomic_write
    from compiler.pipeline import LibraryOptions, library, size_bands
    from compiler.specs.collectives import canonical
    from compiler.specs.runtimes import runtime
    topo = load_topology(args.hw, args.nodes)
    refuse_foreign_runtime(args.runtime, topo)
    refuse_disabled_proto(args.proto, topo)
    colls = tuple(canonical(c) for c in args.collectives.split(",") if c.strip())
    if not colls:
        raise ArgumentError("library: --collectives: give at least one, e.g. allgather,allreduce")
    most = runtime(args.runtime).max_algorithms
    files = len(size_bands(*args.sizes, args.band_factor)) * len(colls)
    if most is not None and files > most:
        raise ArgumentError(f"library: the {args.runtime} runtime loads at most {most} algorithms; {len(colls)} "
                            f"collective(s) x {files // len(colls)} bands = {files}; raise --band-factor or narrow "
                            "--sizes")
    out = Path(args.output)
    prepare_directory(out, args.force)

    def done(label, result):
        if not args.json:
            s, p = result.schedule, result.program
            print(f"planned {label} at {format_size(s.demand.size_bytes)}: {s.planner} with "
                  f"{s.demand.chunks_per_rank} chunk(s), {p.proto} x{result.realisation.instances}: program "
                  f"{result.summary()['algbw_GBps']:.2f} GB/s ({result.bound_ratio:.3f} of the bound; planned "
                  f"{result.planned.bound_ratio:.3f})", flush=True)

    lib = library(topo, LibraryOptions(colls, args.sizes, args.band_factor, args.method, args.time_limit, args.proto,
                                       args.runtime, Progress(sys.stderr.isatty())), done)
    for name, result in lib.results:
        for f in result.files:
            save_xml(f.program, str(out / f.path), f.spelling)
    atomic_write(out / "manifest" / "manifest.json", json.dumps(lib.manifest, indent=1) + "\n")
    if args.json:
        emit_json(lib.manifest)
    else:
        for e in lib.manifest["algorithms"]:
            other = e["runner_up"]
            beside = (f"; runner-up {other['method']}/{other['chunks']}ch/{other['proto']} x{other['instances']}: "
                      f"{other['slower']:.2f}x the time there" if other else "")
            print(f"{e['file']}: {format_size(e['min_bytes'])}..{format_size(e['max_bytes'])}, {e['method']} with "
                  f"{e['chunks']} chunk(s), {e['proto']} x{e['instances']}: {e['algbw_GBps']:.2f} GB/s at "
                  f"{format_size(e['at_bytes'])} ({e['bound_ratio']:.3f} of the bound){beside}")
        print(f"wrote {len(lib.results)} algorithm(s) to {out}/ and the manifest to {out}/manifest/manifest.json "
              f"(the runtime skips subdirectories); load with: msccl-compile env {out} --runtime {args.runtime}")
    return 0


def prepare_directory(out, force: bool) -> None:
    """DIR must hold no files the runtime would load besides ours: XML files, which --force replaces, and no
    other (the runtimes would parse it, and --force does not remove what it did not write)."""
    from compiler.fileio import check_writable, make_directory, remove_later
    if out.exists() and not out.is_dir():
        raise ArgumentError(f"-o: {out}: exists and is not a directory")
    # as backends/torch_dist/env.py's algorithm_files: a runtime that loads the directory parses every regular
    # file or symlink in it, and `env` refuses the directory for one that is not an algorithm (--force kept them)
    loaded = sorted(p for p in out.iterdir() if p.is_file() or p.is_symlink()) if out.exists() else []
    stray = next((p.name for p in loaded if not p.name.endswith(".xml")), None)
    if stray is not None:
        raise ArgumentError(f"-o: {out} holds {stray!r}, which is not one of the library's XML files: the runtimes "
                            "parse every regular file in the algorithm directory; move it out")
    if loaded and not force:
        raise ArgumentError(f"library: {out} already holds files; the runtime would load them all (use --force "
                            "to replace the directory's XML files)")
    try:
        make_directory(out / "manifest")
    except CompileError as e:
        raise CompileError(f"-o: {e}") from None
    check_writable(out / "manifest" / "manifest.json", "-o", out)
    if force:
        for f in loaded:
            remove_later(f)
