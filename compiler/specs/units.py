"""Parsing and printing sizes. Inside the compiler everything is SI: bytes, seconds, bytes/s."""

import re

from compiler.specs.errors import CompileError

_FACTORS = {
    "": 1, "B": 1,
    "K": 10**3, "KB": 10**3, "M": 10**6, "MB": 10**6, "G": 10**9, "GB": 10**9, "T": 10**12, "TB": 10**12,
    "KIB": 2**10, "MIB": 2**20, "GIB": 2**30, "TIB": 2**40,
}
_SIZE = re.compile(r"^\s*([+-]?[0-9]+(?:\.[0-9]*)?(?:[eE][0-9]+)?)\s*([A-Za-z]*)\s*$")


# element sizes of the types a collective may carry (nccl-tests' -d); a chunk is whole elements
DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2, "float64": 8, "int8": 1, "uint8": 1, "int32": 4,
               "int64": 8}


MAX_BYTES = 2**53  # sizes are timed as floats, exact integers up to here; no GPU buffer comes near it


def parse_size(text: str, field: str = "--size") -> int:
    """'1GB' -> 10**9, '4KiB' -> 4096, '512' -> 512. Decimal units as nccl-tests and TE-CCL use them."""
    where = f"{field}: " if field else ""
    m = _SIZE.match(str(text))
    unit = m.group(2).upper() if m else None
    if not m or unit not in _FACTORS:
        raise CompileError(f"{where}{text!r} is not a size (examples: 1GB, 256MiB, 4096)")
    value = float(m.group(1)) * _FACTORS[unit]
    if not value <= MAX_BYTES:  # inf from 1e400 too (an OverflowError further on)
        raise CompileError(f"{where}{text!r} is above 2^53 bytes (about 9e15), beyond any GPU buffer")
    if value <= 0:
        raise CompileError(f"{where}{text!r} must be positive (a buffer of at least one element)")
    if value != int(value):
        raise CompileError(f"{where}{text!r} is not a whole number of bytes")
    return int(value)


def parse_size_range(text: str, field: str = "--sizes") -> tuple[int, int]:
    """'1KB:1GB' -> (1000, 10**9)."""
    where = f"{field}: " if field else ""
    parts = str(text).split(":")
    if len(parts) != 2:
        raise CompileError(f"{where}{text!r} is not a range LO:HI (example: 1KB:1GB)")
    lo, hi = parse_size(parts[0], field), parse_size(parts[1], field)
    if lo > hi:
        raise CompileError(f"{where}{text!r} has LO above HI")
    return lo, hi


def format_size(nbytes: float) -> str:
    for unit, f in (("GB", 1e9), ("MB", 1e6), ("KB", 1e3)):
        if nbytes >= f:
            v = nbytes / f
            return f"{v:.0f}{unit}" if v == int(v) else f"{v:.6g}{unit}"
    return f"{nbytes:.0f}B"


def format_time(seconds: float) -> str:
    if seconds >= 1:
        return f"{seconds:.3f} s"
    if seconds >= 1e-3:
        return f"{seconds * 1e3:.3f} ms"
    return f"{seconds * 1e6:.2f} us"
