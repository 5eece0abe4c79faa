"""Reading input files with one-line errors, and writing output files atomically: a reader never
sees half a file, an error leaves none."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from .errors import CompileError


def atomic_write(path: str | os.PathLike, text: str) -> None:
    target = Path(path)
    directory = target.parent if str(target.parent) else Path(".")
    if not directory.is_dir():
        raise CompileError(f"{path}: directory {str(directory)!r} does not exist")
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=directory)
    try:
        with os.fdopen(fd, "w", encoding="utf-8", newline="\n") as f:
            f.write(text)
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)
        os.replace(tmp, target)
    except OSError as e:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise CompileError(f"{path}: cannot write: {e.strerror or e}") from None


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
