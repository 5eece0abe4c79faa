"""Reading input files with one-line errors, and writing output files atomically: a reader never
sees half a file, an error or an interrupt leaves none.

Inside `outputs()` (the CLI runs every command in one), `atomic_write` only stages a file next to
its target; the staged files replace their targets together when the block ends normally, with
SIGINT and SIGTERM held back for those few renames. An exception (an error, Ctrl-C) removes what
was staged, so a command that does not finish writes nothing. Outside `outputs()` a write is
immediate (library callers).

A target that is not a regular file (/dev/null, /dev/stdout, a FIFO; through a symlink too) is
written into, not replaced: renaming over it would put a regular file in place of the device (as
root, -o /dev/null did). A symlink to a regular file is replaced like a file (library --force
removes its links before writing files of the same names).
"""

from __future__ import annotations

import contextlib
import os
import signal
import stat
import tempfile
from pathlib import Path
from typing import Iterator

from compiler.specs.errors import CompileError

# one list per open outputs(): (temporary file, target) to rename, (None, target) to remove,
# (directory, None) made for the outputs and removed again on failure
_staged: list[list[tuple[str | None, Path | None]]] = []


def _where(path: str | os.PathLike) -> tuple[Path, Path]:
    target = Path(path)
    directory = target.parent if str(target.parent) else Path(".")
    if not directory.is_dir():
        raise CompileError(f"{path}: directory {str(directory)!r} does not exist")
    if target.is_dir():
        raise CompileError(f"{path}: is a directory, not a file")
    return target, directory


def _special(target: Path) -> bool:
    """An existing target that is not a regular file: a device, a FIFO, a socket (written into)."""
    try:
        mode = os.stat(target).st_mode
    except OSError:
        return False
    return not stat.S_ISREG(mode) and not stat.S_ISDIR(mode)


def _write_into(path: str | os.PathLike, target: Path, data: bytes) -> None:
    try:
        with open(target, "wb") as f:
            f.write(data)
    except OSError as e:
        raise CompileError(f"{path}: cannot write: {_reason(e)}") from None


def _reason(e: OSError) -> str:
    return e.strerror or str(e)


def _stage(path: str | os.PathLike, data: bytes) -> tuple[str, Path]:
    target, directory = _where(path)
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=directory)
    except OSError as e:
        raise CompileError(f"{path}: cannot write in {str(directory)!r}: {_reason(e)}") from None
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)
    except BaseException as e:
        _unlink(tmp)
        if isinstance(e, OSError):
            raise CompileError(f"{path}: cannot write: {_reason(e)}") from None
        raise
    return tmp, target


def _unlink(tmp: str) -> None:
    try:
        os.unlink(tmp)
    except OSError:
        pass


def _replace(tmp: str, target: Path) -> None:
    try:
        os.replace(tmp, target)
    except OSError as e:
        _unlink(tmp)
        raise CompileError(f"{target}: cannot write: {_reason(e)}") from None


def check_writable(path: str | os.PathLike, field: str = "", shown: str | os.PathLike | None = None) -> None:
    """Fail now, not after planning, where `path` cannot be written: a missing directory, a
    directory in its place, a file system that refuses new files (/proc, /sys, read-only). shown:
    the path the user gave, where `path` is a file inside it (an output directory's)."""
    where = f"{field}: " if field else ""
    if os.fspath(shown if shown is not None else path) == "-":  # the convention for stdout elsewhere
        raise CompileError(f"{where}'-' would write a file named '-': outputs are files (for the terminal, "
                           "give /dev/stdout)")
    try:
        target, directory = _where(path)
    except CompileError as e:
        raise CompileError(f"{where}{e}") from None
    if _special(target):  # written into, not replaced: no file is created beside it
        if not os.access(target, os.W_OK):
            raise CompileError(f"{where}{path}: the file exists and is not writable")
        return
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".probe", dir=directory)
    except OSError as e:
        raise CompileError(f"{where}{shown or path}: cannot create files in {str(directory)!r}: {_reason(e)}") from None
    os.close(fd)
    _unlink(tmp)
    if target.exists() and not os.access(target, os.W_OK):
        raise CompileError(f"{where}{path}: the file exists and is not writable")


def distinct_outputs(outputs: list[tuple], inputs: list[tuple[str, str | os.PathLike | None]] = ()) -> None:
    """Fail now where two outputs are one file (the last written would silently replace the other,
    both reported as written) or an output is an input file (read, then overwritten). outputs:
    (the option that names it, the path or None where not given[, what the file is, where not the
    option's file]); inputs: (the option, or "" for the positional file, and the path)."""
    seen: dict[str, str] = {}
    for field, path in inputs:
        if path:
            seen.setdefault(os.path.realpath(path), f"the input {field}" if field else "the input file")
    for field, path, *what in outputs:
        if not path:
            continue
        key = os.path.realpath(path)
        if key in seen:
            raise CompileError(f"{field}: {path} is also {seen[key]}; give each output a path of its own")
        seen[key] = what[0] if what else f"{field}'s file"


def atomic_write(path: str | os.PathLike, text: str | bytes) -> None:
    data = text.encode("utf-8") if isinstance(text, str) else text
    target, _ = _where(path)
    removed = _staged and any(tmp is None and t == target for tmp, t in _staged[-1])  # library --force's links
    if _special(target) and not removed:  # /dev/null, /dev/stdout: written into when the outputs are committed
        if _staged:
            _staged[-1].append((_Into(path, data), target))
        else:
            _write_into(path, target, data)
        return
    staged = _stage(path, data)
    if _staged:
        _staged[-1].append(staged)
    else:
        _replace(*staged)


class _Into:
    """A write into a target that is not a regular file, waiting for the outputs' commit."""

    def __init__(self, path: str | os.PathLike, data: bytes):
        self.path, self.data = path, data


def remove_later(path: str | os.PathLike) -> None:
    """Remove `path` when the outputs are committed (at once outside outputs())."""
    if _staged:
        _staged[-1].append((None, Path(path)))
    else:
        Path(path).unlink(missing_ok=True)


def make_directory(path: str | os.PathLike) -> None:
    """mkdir -p, undone (when still empty) if the outputs are not committed."""
    target = Path(path)
    missing = [p for p in [target, *target.parents] if not p.exists()]
    try:
        target.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise CompileError(f"{path}: cannot create the directory: {_reason(e)}") from None
    if _staged:
        _staged[-1].extend((str(p), None) for p in missing)


def _abort(staged) -> None:
    for tmp, target in staged:
        if isinstance(tmp, str) and target is not None:
            _unlink(tmp)
    for tmp, target in staged:
        if target is None:
            try:
                os.rmdir(tmp)
            except OSError:
                pass


@contextlib.contextmanager
def outputs() -> Iterator[None]:
    """Every atomic_write (and remove_later) inside takes effect when the block ends normally,
    or not at all."""
    mine: list[tuple[str | None, Path | None]] = []
    _staged.append(mine)
    try:
        yield
    except BaseException:
        _abort(mine)
        raise
    finally:
        _staged.remove(mine)
    try:  # writes into devices and FIFOs first, interruptible (a FIFO's reader may never come)
        for tmp, target in mine:
            if isinstance(tmp, _Into):
                _write_into(tmp.path, target, tmp.data)
    except BaseException:
        _abort(mine)
        raise
    held = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})
    try:
        for i, (tmp, target) in enumerate(mine):
            if target is None or isinstance(tmp, _Into):
                continue
            try:
                if tmp is None:
                    target.unlink(missing_ok=True)
                else:
                    _replace(tmp, target)
            except (CompileError, OSError) as e:
                _abort(mine[i + 1:])
                raise CompileError(str(e)) from None
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, held)


def read_input(path: str | os.PathLike, what: str, error: type[CompileError] = CompileError,
               limit: int = -1) -> bytes:
    """The bytes of an input file (the first `limit` of them where limit >= 0); a missing file, a
    directory or another failure is `error` in one line naming the path and `what` it should be."""
    try:
        with open(path, "rb") as f:
            return f.read(limit)
    except FileNotFoundError:
        raise error(f"{path}: no such {what}") from None
    except IsADirectoryError:
        raise error(f"{path}: is a directory, not {'an' if what[0] in 'aeiouAEIOUX' else 'a'} {what}") from None
    except (OSError, TypeError, ValueError) as e:
        raise error(f"{path}: cannot read: {' '.join(str(getattr(e, 'strerror', None) or e).split())}") from None
