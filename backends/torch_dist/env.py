"""Loading MSCCL algorithms by environment (msccl-xml.md §12); torch-free.

`msccl_env(runtime, path, world_size)` returns exactly the variables a runtime documents (its
`RuntimeSpec.environment`, compiler/specs/runtimes.py), after checking the algorithm files'
`<algo>` headers; `msccl_environment(...)` sets them for a `with` block and restores the previous
environment; `export_lines(env)` gives shell `export` lines. Set them **before the first
communicator exists**: before `init_process_group` and before the first collective (PyTorch
creates NCCL communicators lazily unless `device_id` is passed).

A runtime that loads a directory (`MSCCL_ALGO_DIR`) parses **every regular file or symlink** in
it, and a file it cannot parse makes communicator creation fail: keep nothing else there (a
manifest or a README belongs next to the directory, or in a subdirectory, which it skips).
"""

from __future__ import annotations

import os
import shlex
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from compiler.specs.errors import CompileError
from compiler.specs.runtimes import DEFAULT, NAMES, spelled_apart

from .headers import AlgoHeader, read_header, runtime_spec

RUNTIMES = NAMES


def check_header(h: AlgoHeader, runtime: str, world_size: int | None) -> None:
    """What makes a runtime fail or never select the file, refused with one line."""
    spec = runtime_spec(runtime)
    if h.problems:
        raise CompileError(f"{h.path}: {h.problems[0]}")
    missing = [a for a in spec.required if a in h.missing]
    if missing:
        raise CompileError(f"{h.path}: algo: attribute {missing[0]} is missing; the {runtime} runtime requires it "
                           f"(msccl-tools omits outofplace/minBytes/maxBytes: rewrite the file with msccl-compile)")
    if not spec.parses(h.coll):
        hint = ""
        if spec.accepts(h.collective) and spelled_apart(h.collective):
            hint = (f" (write it for --runtime {runtime}: {h.collective.replace('_', '-')} is spelled differently "
                    f"per runtime)")
        raise CompileError(f"{h.path}: algo: coll={h.coll!r} is not accepted by the {runtime} runtime{hint}")
    if world_size is not None and h.ngpus != world_size:
        raise CompileError(f"{h.path}: ngpus={h.ngpus} does not match the world size {world_size}")


def algorithm_files(path: str | os.PathLike, runtime: str = DEFAULT) -> list[Path]:
    """The files a runtime would load from `path`. One that loads a directory: every regular file
    or symlink in it (the runtime parses them all; a non-algorithm file is refused here because
    it would make communicator creation fail). One that loads a list: the file itself, or the
    directory's *.xml files."""
    spec = runtime_spec(runtime)
    p = Path(path)
    if not p.exists():
        raise CompileError(f"{p}: no such file or directory")
    if spec.loads_directory:
        if not p.is_dir():
            raise CompileError(f"{p}: the {runtime} runtime loads a directory (MSCCL_ALGO_DIR), not a file: put the "
                               f"algorithm in a directory of its own")
        files = sorted(e for e in p.iterdir() if e.is_symlink() or e.is_file())
        for f in files:
            if not f.name.endswith(".xml") or f.is_symlink() and not f.is_file():
                try:
                    read_header(f)
                except CompileError:
                    raise CompileError(f"{f}: not an MSCCL algorithm file, and the {runtime} runtime parses every "
                                       f"regular file in MSCCL_ALGO_DIR: move it out of {p}") from None
    else:
        if ":" in str(p.resolve()):
            raise CompileError(f"{p}: the path contains ':', which MSCCL_XML_FILES uses as its separator")
        files = [p] if p.is_file() else sorted(e for e in p.iterdir() if e.is_file() and e.name.endswith(".xml"))
    if not files:
        raise CompileError(f"{p}: holds no algorithm files")
    return files


def msccl_env(runtime: str, path: str | os.PathLike, world_size: int | None = None) -> dict[str, str]:
    """The environment that makes `runtime` load the algorithms at `path` (a directory; for a
    runtime that loads a list also a single file), exactly the variables msccl-xml.md §12.1
    documents. Every file's header is checked: readable `<algo>`, required attributes, the
    runtime's `coll` spelling, and `ngpus` == `world_size` when given. Raises CompileError (one
    line) on any problem."""
    spec = runtime_spec(runtime)
    files = algorithm_files(path, runtime)
    for f in files:
        try:
            h = read_header(f)
        except CompileError as e:
            if spec.loads_directory:
                raise CompileError(f"{e} (the {runtime} runtime parses every regular file in MSCCL_ALGO_DIR)") from None
            raise
        check_header(h, runtime, world_size)
    if spec.max_algorithms is not None and len(files) > spec.max_algorithms:
        raise CompileError(f"{path}: {len(files)} algorithm files; the {runtime} runtime loads at most "
                           f"{spec.max_algorithms} (MSCCL_XML_FILES)")
    directory = str(Path(path).resolve())
    return spec.environment(directory, [str(f.resolve()) for f in files])


@contextmanager
def msccl_environment(runtime: str, path: str | os.PathLike, world_size: int | None = None) -> Iterator[dict]:
    """Sets msccl_env(...) in os.environ for the block and restores the previous values (removing
    variables that were not set) on exit. Enter it before init_process_group."""
    env = msccl_env(runtime, path, world_size)
    with patched_environ(env):
        yield env


@contextmanager
def patched_environ(env: dict[str, str | None]) -> Iterator[None]:
    """os.environ with `env` applied (None unsets a variable) for the block; restored on exit."""
    saved = {k: os.environ.get(k) for k in env}
    apply_environ(env)
    try:
        yield
    finally:
        apply_environ(saved)


def apply_environ(env: dict[str, str | None]) -> None:
    """Sets each variable of `env` in os.environ (None: unsets it)."""
    for k, v in env.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v


def export_lines(env: dict[str, str]) -> list[str]:
    """Shell lines `export K=V` (V shell-quoted) for `msccl-compile env DIR --runtime ...`."""
    return [f"export {k}={shlex.quote(v)}" for k, v in env.items()]

