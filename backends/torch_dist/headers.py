"""The `<algo>` headers of MSCCL algorithm files, and what a runtime does with them: size bands
of a library (`check_bands`) and which file it selects for a call (`select_algorithm`,
msccl-xml.md §12.2); torch-free.
"""

from __future__ import annotations

import math
import os
import re
from dataclasses import dataclass
from pathlib import Path

from compiler.fileio import read_input
from compiler.specs.collectives import canonical
from compiler.specs.errors import CompileError
from compiler.specs.runtimes import DEFAULT, NAMES, RUNTIMES, RuntimeSpec

_INT = re.compile(r"\s*([+-]?)(0[xX][0-9a-fA-F]+|0[0-7]*|[1-9][0-9]*)\s*\Z")
_ATTR = re.compile(r'([A-Za-z_][\w.-]*)\s*=\s*"([^"]*)"')
_ALGO_ATTRS = ("name", "proto", "nchannels", "nchunksperloop", "ngpus", "coll", "inplace", "outofplace", "minBytes",
               "maxBytes")


def runtime_spec(runtime: str) -> RuntimeSpec:
    """The runtime's spec; CompileError naming --runtime for an unknown one."""
    if runtime not in RUNTIMES:
        raise CompileError(f"--runtime: {runtime!r} is not a runtime (known: {', '.join(NAMES)})")
    return RUNTIMES[runtime]


def _c_int(text: str) -> int | None:
    """An integer as C strtol(..., 0) reads it ("0x10" = 16, "010" = 8); None if it is not one."""
    m = _INT.match(text)
    if m is None:
        return None
    sign, digits = m.groups()
    base = 16 if digits[:2] in ("0x", "0X") else 8 if digits[0] == "0" and len(digits) > 1 else 10
    return int(digits, base) * (-1 if sign == "-" else 1)


@dataclass(frozen=True)
class AlgoHeader:
    """The `<algo>` element of an MSCCL XML file: what the runtimes read for selection."""
    path: str
    name: str
    coll: str  # the attribute as written, in the file's dialect
    collective: str  # canonical (compiler.collectives) or the attribute itself when it has none
    ngpus: int
    nchunksperloop: int
    nchannels: int
    proto: str
    inplace: bool
    outofplace: bool
    min_bytes: int
    max_bytes: int  # as written; 0 = no limit for executor/RCCL
    missing: tuple[str, ...] = ()  # attributes the file does not have (defaults used above)
    problems: tuple[str, ...] = ()  # things the runtimes' reader rejects (declaration, tabs)

    @property
    def label(self) -> str:
        return Path(self.path).name


def check_nprocs(nprocs: int, ngpus: int, label: str) -> None:
    """A program runs on as many processes as its ngpus (`run`'s check from the header, before torch
    is imported, and the executor's on the program read)."""
    if ngpus and nprocs != ngpus:
        raise CompileError(f"--nprocs: {nprocs} processes, but {label} is for ngpus={ngpus}")


def read_header(path: str | os.PathLike) -> AlgoHeader:
    """Reads only the `<algo ...>` start tag of an MSCCL XML file (the executor's first pass does
    the same). Raises CompileError if the file does not start with one."""
    p = Path(path)
    data = read_input(p, "algorithm file", limit=1 << 16)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise CompileError(f"{p}: not an MSCCL algorithm file (binary data)") from None
    problems = []
    rest = text.lstrip(" \r\n\t")
    if rest.startswith("<?xml"):
        problems.append("starts with an XML declaration, which the runtimes' reader rejects")
        end = rest.find("?>")
        rest = rest[end + 2:].lstrip(" \r\n\t") if end >= 0 else ""
    while rest.startswith("<!--"):
        end = rest.find("-->")
        rest = rest[end + 3:].lstrip(" \r\n\t") if end >= 0 else ""
    if not re.match(r"<algo[\s>/]", rest):
        first = rest[:40].splitlines()[0] if rest.strip() else "(empty)"
        raise CompileError(f"{p}: not an MSCCL algorithm file: it must start with <algo ...>, found {first!r}")
    end = rest.find(">")
    if end < 0:
        raise CompileError(f"{p}: algo: the <algo ...> start tag is not closed")
    tag = rest[:end]
    if "\n" in tag or "\r" in tag:
        problems.append("the <algo> start tag spans several lines, which the runtimes' reader rejects")
    if "\t" in text:
        problems.append("contains tabs, which the runtimes' reader rejects")
    attrs = dict(_ATTR.findall(tag))
    missing = tuple(a for a in _ALGO_ATTRS if a not in attrs)

    def num(attr: str, default: int) -> int:
        if attr not in attrs:
            return default
        v = _c_int(attrs[attr])
        if v is None:
            raise CompileError(f"{p}: algo: {attr}: {attrs[attr]!r} is not an integer")
        return v

    coll = attrs.get("coll", "")
    try:
        collective = canonical(coll)
    except CompileError:
        collective = coll
    inplace = bool(num("inplace", 0))
    return AlgoHeader(
        path=str(p), name=attrs.get("name", ""), coll=coll, collective=collective, ngpus=num("ngpus", 0),
        nchunksperloop=num("nchunksperloop", 0), nchannels=num("nchannels", 0), proto=attrs.get("proto", ""),
        inplace=inplace, outofplace=bool(num("outofplace", int(not inplace))), min_bytes=num("minBytes", 0),
        max_bytes=num("maxBytes", 0), missing=missing, problems=tuple(problems))


def _headers(files) -> list[AlgoHeader]:
    if isinstance(files, (str, os.PathLike)):
        p = Path(files)
        files = sorted(e for e in p.iterdir() if e.is_file()) if p.is_dir() else [p]
    return [f if isinstance(f, AlgoHeader) else read_header(f) for f in files]


def check_bands(files, runtime: str = DEFAULT) -> list[str]:
    """Problems with the size bands of a library: for each (collective, ngpus) and each call kind
    (out-of-place, in-place), the files' [minBytes, maxBytes] must not overlap and must be
    contiguous between the smallest and the largest band. `files`: paths, AlgoHeaders or one
    directory. Most runtimes read maxBytes inclusively (0 = no limit); the old one exclusively
    (RuntimeSpec.max_bytes_inclusive), where our writer's maxBytes = hi - 1 convention leaves a
    one-byte seam that is accepted."""
    inclusive = runtime_spec(runtime).max_bytes_inclusive
    headers = _headers(files)
    out = []
    inf = math.inf
    for h in headers:
        if h.max_bytes and h.min_bytes > h.max_bytes:
            out.append(f"{h.label}: minBytes={h.min_bytes} is above maxBytes={h.max_bytes}")
    groups: dict[tuple, list[AlgoHeader]] = {}
    for h in headers:
        for kind, ok in (("out-of-place", h.outofplace), ("in-place", h.inplace)):
            if ok:
                groups.setdefault((h.collective, h.ngpus, kind), []).append(h)
    for (coll, ngpus, kind), hs in sorted(groups.items()):
        def hi(h: AlgoHeader) -> float:
            if not inclusive:
                return (h.max_bytes - 1) if h.max_bytes else -1  # exclusive; 0 = never selected
            return h.max_bytes if h.max_bytes else inf
        hs = sorted(hs, key=lambda h: (h.min_bytes, hi(h), h.path))
        where = f"{coll} ngpus={ngpus} {kind}"
        for a, b in zip(hs, hs[1:]):
            ha = hi(a)
            if b.min_bytes <= ha:
                top = "no limit" if ha == inf else f"{int(ha)}"
                out.append(f"{where}: {a.label} [{a.min_bytes}, {top}] and {b.label} [{b.min_bytes}, "
                           f"{'no limit' if hi(b) == inf else int(hi(b))}] overlap")
            elif b.min_bytes > ha + 1 + (not inclusive):
                out.append(f"{where}: gap: no algorithm for {int(ha) + 1}..{b.min_bytes - 1} bytes between "
                           f"{a.label} and {b.label}")
    return out


def select_algorithm(files, collective: str, size_bytes: int, ngpus: int, itemsize: int = 4,
                     inplace: bool = False) -> AlgoHeader | None:
    """The file the executor would pick for a call (msccl-xml.md §12.2): in lexicographic path
    order, the first whose coll, ngpus, in-place kind and [minBytes, maxBytes] (inclusive, 0 = no
    limit) match and whose nchunksperloop divides the element count. None: NCCL's own algorithm."""
    coll = canonical(collective)
    elems = size_bytes // itemsize
    for h in sorted(_headers(files), key=lambda h: h.path):
        if h.collective != coll or h.ngpus != ngpus or not (h.inplace if inplace else h.outofplace):
            continue
        if size_bytes < h.min_bytes or (h.max_bytes and size_bytes > h.max_bytes):
            continue
        if h.nchunksperloop <= 0 or elems % h.nchunksperloop:
            continue
        return h
    return None


def why_not_selected(files, collective: str, size_bytes: int, ngpus: int, itemsize: int = 4,
                     inplace: bool = False) -> str:
    """Why select_algorithm finds no file: the rule that removed the last candidates, with the
    files it removed (the runtime applies the same rules in the same order)."""
    coll = canonical(collective)
    elems = size_bytes // itemsize
    kind = "in-place" if inplace else "out-of-place"
    rules = (
        (f"no file is for {coll}", lambda h: h.collective == coll),
        (f"no {coll} file is for {ngpus} ranks", lambda h: h.ngpus == ngpus),
        (f"no {coll} file allows {kind} calls", lambda h: h.inplace if inplace else h.outofplace),
        (f"no {coll} file's minBytes..maxBytes covers {size_bytes} B",
         lambda h: h.min_bytes <= size_bytes and (not h.max_bytes or size_bytes <= h.max_bytes)),
        (f"the element count {elems} is not divisible by nchunksperloop",
         lambda h: h.nchunksperloop > 0 and elems % h.nchunksperloop == 0),
    )
    left = sorted(_headers(files), key=lambda h: h.path)
    for why, keep in rules:
        kept = [h for h in left if keep(h)]
        if not kept:
            if "divisible" in why:
                return f"{why} of " + ", ".join(f"{Path(h.path).name} ({h.nchunksperloop})" for h in left[:3])
            return why + (f" (closest: {', '.join(Path(h.path).name for h in left[:3])})" if left else "")
        left = kept
    return "a file covers it"
