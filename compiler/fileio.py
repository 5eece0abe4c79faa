"""Writing output files atomically: a reader never sees half a file, an error leaves none."""

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
