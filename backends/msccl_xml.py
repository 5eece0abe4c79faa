"""MSCCL algorithm XML: write a Program (portable subset, msccl-xml.md §16) and read one back.

Writing: templates/msccl.xml.j2 through Jinja2. No declaration, spaces only, one tag per line with
all its attributes, single spaces, double quotes, decimal integers without padding; `<algo>` carries
exactly name proto nchannels nchunksperloop ngpus coll inplace outofplace minBytes maxBytes; every
step all ten attributes with s = its position. The same Program always gives the same bytes.

`coll` per runtime: each dialect's spelling (compiler.specs.runtimes; reduce-scatter differs
between the old runtime and the others). `maxBytes`: Program.max_bytes = 0 means "no limit";
the runtimes disagree on 0 (executor/RCCL: no limit; legacy: never selected), so the writer puts
UNLIMITED_MAX_BYTES = 2**40 (1 TiB, more than any GPU holds; small enough that legacy's scratch
arithmetic maxBytes * s_chunks cannot overflow int64) and the reader maps that value back to 0.

A custom program carries its demand (its postcondition: which ranks must end with which chunks,
or sums) so that `verify`, `simulate` and `run` need nothing else: one comment line right after
the `<algo ...>` line, `<!-- msccl-compile demand {compact JSON} -->` (Demand.to_dict plus
"runtimes": those with coll=custom). A comment, because the runtimes' reader accepts comments
anywhere (msccl-xml.md §1; RCCL's shipped files start with one) and ignores their text; after
`<algo>` rather than before it, so the file still starts with `<algo ...>`, which the
executor/RCCL meta-data pass and simple header readers (torch_dist.read_header) look for. The JSON
holds only numbers, ranks and the word custom, so it can never contain "--" or end the comment early.
A program whose target runtimes are fewer than those with its `coll` (a DGX file is for the legacy
runtime and the executor, not RCCL) names them in a second comment line,
`<!-- msccl-compile runtimes old executor -->`, so that `verify` judges it for those; every other
program is written without any comment.

Reading (ours and other tools' files): lxml, no entities, no network. msccl-tools files lack
outofplace/minBytes/maxBytes: outofplace defaults to 1 - inplace, minBytes and maxBytes to 0.
Unknown elements (TACCL's `<copy>`) and attributes (`redop`) are ignored, with a note for elements;
`nthreads`, read by the old runtime only, is kept where that runtime would reject the file. The
demand comment is read before `<algo>` or directly inside it, for coll=custom only (noted and
ignored elsewhere: a standard collective's postcondition is the standard one).
Integers are read as the runtimes read them (C strtol base 0: "0x10" is 16, "010" is 8); any
spelling other than plain decimal is accepted with a warning in Program.notes. Everything else
malformed raises XmlError, one line naming the file, element, attribute and value.
"""

from __future__ import annotations

import json
import os
import re
from functools import lru_cache
from importlib import resources

import jinja2
from lxml import etree

from compiler.model.demand import Demand
from compiler.specs.errors import CompileError
from compiler.fileio import atomic_write, read_input
from compiler.model.program import BUFFERS, PROTOCOLS, STEP_TYPES, GpuProgram, Program, Step, ThreadBlock
from compiler.specs.collectives import CUSTOM
from compiler.specs.runtimes import (ALL, CHOICES, MAX_CHANNELS, MAX_CNT, coll_attribute, coll_attributes, collective_of,
                                    NAMES, narrower, target_runtimes)
from compiler.gcpause import without_gc

__all__ = ["XmlError", "to_xml", "save_xml", "read_xml", "XML_RUNTIMES", "UNLIMITED_MAX_BYTES"]

XML_RUNTIMES = CHOICES
DEMAND_TAG = "msccl-compile demand"  # starts the comment that carries a custom program's demand
RUNTIMES_TAG = "msccl-compile runtimes"  # starts the comment naming the runtimes a file is for
UNLIMITED_MAX_BYTES = 2 ** 40
MAX_CHANNEL_ID = MAX_CHANNELS  # the parsers reject chan < 0 or > 32
_NAME = re.compile(r"[^\s\"'<>&]{1,255}")
_INT = re.compile(r"\s*([+-]?)(0[xX][0-9a-fA-F]+|0[0-7]*|[1-9][0-9]*)\Z")
_STEP_ATTRS = ("s", "type", "srcbuf", "srcoff", "dstbuf", "dstoff", "cnt", "depid", "deps", "hasdep")


class XmlError(CompileError):
    """An XML file we cannot write or read: one line naming file, element, attribute and value."""


# ---- writing ---------------------------------------------------------------------------------------


@lru_cache(maxsize=1)
def _template() -> jinja2.Template:
    text = resources.files("templates").joinpath("msccl.xml.j2").read_text(encoding="utf-8")
    env = jinja2.Environment(autoescape=False, trim_blocks=True, lstrip_blocks=True, keep_trailing_newline=True,
                             undefined=jinja2.StrictUndefined)
    return env.from_string(text)


def coll_name(collective: str, runtime: str) -> str:
    """The `coll` attribute for a runtime (reduce-scatter has no common spelling)."""
    if runtime not in XML_RUNTIMES:
        raise XmlError(f"runtime: {runtime!r} is not a runtime (known: {', '.join(XML_RUNTIMES)})")
    try:
        return coll_attribute(collective, runtime)
    except CompileError as e:
        raise XmlError(str(e)) from None


def _check_writable(p: Program) -> None:
    """What the text format itself needs; everything else is the verifier's job."""
    if not _NAME.fullmatch(p.name):
        raise XmlError(f"program: name {p.name!r} must be 1-255 characters without spaces, quotes, <, > or &")
    if p.proto not in PROTOCOLS:
        raise XmlError(f"program: proto {p.proto!r} is not one of {', '.join(PROTOCOLS)}")
    for g in p.gpus:
        for tb in g.tbs:
            for k, s in enumerate(tb.steps):
                if s.type not in STEP_TYPES or s.srcbuf not in BUFFERS or s.dstbuf not in BUFFERS:
                    raise XmlError(f"program: gpu {g.rank} tb {tb.id} step {k}: type/buffers "
                                   f"{s.type!r} {s.srcbuf!r} {s.dstbuf!r} cannot be written")


def demand_comment(p: Program) -> str:
    """The text of the comment that carries a custom program's demand, '' for every other program
    (their XML has no comment). One line: DEMAND_TAG, then the demand as compact JSON
    (Demand.to_dict, plus "runtimes": those with coll=custom)."""
    if p.demand is None or p.collective != CUSTOM:
        return ""
    doc = {**p.demand.to_dict(), "runtimes": list(target_runtimes(p.collective))}
    text = json.dumps(doc, separators=(",", ":"), sort_keys=True)
    if "--" in text:  # cannot end a comment early: the JSON holds numbers, ranks and the word custom
        raise XmlError(f"program: demand: {text[:60]!r} cannot be written inside an XML comment")
    return f"{DEMAND_TAG} {text}"


def runtimes_comment(p: Program) -> str:
    """The text of the comment that names the runtimes a program keeps the limits of, where they
    are fewer than those that have its collective (a DGX file targets the legacy runtime and the
    executor, not RCCL): '' otherwise, so such files are written as before."""
    if not narrower(p.collective, p.runtimes):
        return ""
    return f"{RUNTIMES_TAG} {' '.join(p.runtimes)}"


@without_gc
def to_xml(program: Program, runtime: str = ALL) -> str:
    """The portable-subset XML text of a Program (ends with a newline)."""
    coll = coll_name(program.collective, runtime)
    _check_writable(program)
    return _template().render(p=program, coll=coll, max_bytes=program.max_bytes or UNLIMITED_MAX_BYTES,
                              demand_comment=demand_comment(program), runtimes_comment=runtimes_comment(program))


def save_xml(program: Program, path: str | os.PathLike, runtime: str = ALL) -> None:
    atomic_write(path, to_xml(program, runtime))


# ---- reading ---------------------------------------------------------------------------------------


class _Reader:
    def __init__(self, label: str):
        self.label = label
        self.notes: list[str] = []
        # a step's attributes as written (all but s) -> its Step, for attributes that read with no note:
        # a program repeats few distinct steps (512 GPUs: 553,472 steps), and Steps are frozen, so one serves all
        self.known_steps: dict[tuple, Step] = {}
        self.max_s = -1  # the largest s attribute that is not its step's position
        self.syntax: list[str] = []  # what the runtimes' reader rejects or misreads (syntax_problems, attributes)

    def attributes(self, el, where: str) -> None:
        """More than MAX_ATTRIBUTES on an element: the runtimes' reader drops the rest silently."""
        if len(el.attrib) > MAX_ATTRIBUTES:
            dropped = list(el.attrib)[MAX_ATTRIBUTES:]
            self.syntax.append(f"{where}: {len(el.attrib)} attributes; the runtimes' reader keeps {MAX_ATTRIBUTES} "
                               f"and silently drops {', '.join(dropped)}")

    def fail(self, where: str, attr: str, problem: str) -> XmlError:
        return XmlError(f"{self.label}: {where}: {attr}: {problem}" if attr else f"{self.label}: {where}: {problem}")

    def text(self, el, where: str, attr: str, default: str | None = None) -> str:
        value = el.get(attr)
        if value is None:
            if default is None:
                raise self.fail(where, attr, "required attribute is missing")
            return default
        return value

    def int(self, el, where: str, attr: str, lo: int | None = None, hi: int | None = None,
            default: int | None = None) -> int:
        raw = el.get(attr)
        if raw is None:
            if default is None:
                raise self.fail(where, attr, "required attribute is missing")
            return default
        m = _INT.match(raw)
        if m is None:
            raise self.fail(where, attr, f"{raw!r} is not an integer")
        sign, digits = m.groups()
        base = 16 if digits[:2] in ("0x", "0X") else 8 if digits[0] == "0" and len(digits) > 1 else 10
        value = int(digits, base) * (-1 if sign == "-" else 1)
        if not -2 ** 63 <= value < 2 ** 63:
            raise self.fail(where, attr, f"{raw!r} is out of the 64-bit range")
        if raw != str(value):
            kind = {16: "hexadecimal", 8: "octal"}.get(base, "non-canonical")
            self.notes.append(f"{self.label}: {where}: {attr}={raw!r} reads as {value} ({kind}, as C strtol "
                              "base 0 reads it)")
        if (lo is not None and value < lo) or (hi is not None and value > hi):
            rng = f"{lo}..{hi}" if hi is not None else f">= {lo}"
            raise self.fail(where, attr, f"{raw!r} is out of range ({rng})")
        return value

    def flag(self, el, where: str, attr: str, default: int | None = None) -> bool:
        return bool(self.int(el, where, attr, 0, 1, default))

    def children(self, el, tag: str, where: str) -> list:
        out, ignored = [], {}
        for child in el:
            if not isinstance(child.tag, str):
                continue  # comments, processing instructions
            if child.tag == tag:
                out.append(child)
            else:
                ignored[child.tag] = ignored.get(child.tag, 0) + 1
        for name, n in sorted(ignored.items()):
            self.notes.append(f"{self.label}: {where}: ignored {n} <{name}> element{'s' if n > 1 else ''}")
        return out

    def step(self, el, where: str) -> tuple[int, Step]:
        self.attributes(el, where)
        for attr in _STEP_ATTRS:
            if el.get(attr) is None:
                raise self.fail(where, attr, "required attribute is missing")
        kind = el.get("type")
        if kind not in STEP_TYPES:
            raise self.fail(where, "type", f"{kind!r} is not a step type ({', '.join(STEP_TYPES)})")
        bufs = []
        for attr in ("srcbuf", "dstbuf"):
            if el.get(attr) not in BUFFERS:
                raise self.fail(where, attr, f"{el.get(attr)!r} is not a buffer (i, o, s)")
            bufs.append(el.get(attr))
        s = self.int(el, where, "s", 0)
        return s, Step(kind, bufs[0], self.int(el, where, "srcoff"), bufs[1], self.int(el, where, "dstoff"),
                       self.int(el, where, "cnt", 0, MAX_CNT), self.int(el, where, "depid", -1),
                       self.int(el, where, "deps", -1), self.flag(el, where, "hasdep"))

    def tb(self, el, rank: int, ngpus: int, position: int) -> ThreadBlock:
        where = f"gpu {rank} tb (position {position})"
        tid = self.int(el, where, "id", 0)
        where = f"gpu {rank} tb {tid}"
        self.attributes(el, where)
        peers = []
        for attr in ("send", "recv"):
            peer = self.int(el, where, attr, -1, ngpus - 1)
            if peer == rank:
                raise self.fail(where, attr, f"'{peer}' is the thread block's own rank")
            peers.append(peer)
        chan = self.int(el, where, "chan", 0, MAX_CHANNEL_ID)
        steps, known = [], self.known_steps
        for k, child in enumerate(self.children(el, "step", where)):
            raw = tuple(map(child.get, _STEP_ATTRS))
            step = known.get(raw[1:])
            if step is None or raw[0] != str(k):  # read it with every check (and note) spelled out
                notes = len(self.notes)
                s, step = self.step(child, f"{where} step {k}")
                if s != k:
                    self.max_s = max(self.max_s, s)
                    self.notes.append(f"{self.label}: {where} step {k}: s=\"{s}\" differs from its position {k}; "
                                      "the runtimes number steps by position, so dependencies on it may misfire")
                elif len(self.notes) == notes:
                    known[raw[1:]] = step
            steps.append(step)
        return ThreadBlock(tid, peers[0], peers[1], chan, tuple(steps))

    def gpu(self, el, ngpus: int, position: int) -> GpuProgram:
        rank = self.int(el, f"gpu (position {position})", "id", 0, ngpus - 1)
        where = f"gpu {rank}"
        self.attributes(el, where)
        sizes = [self.int(el, where, a, 0) for a in ("i_chunks", "o_chunks", "s_chunks")]
        tbs = sorted((self.tb(c, rank, ngpus, k) for k, c in enumerate(self.children(el, "tb", where))),
                     key=lambda t: t.id)
        for k, tb in enumerate(tbs):
            if tb.id != k:
                problem = "is defined twice" if tb.id < k else f"leaves thread block {k} missing (ids must be 0..n-1)"
                raise self.fail(f"{where} tb {tb.id}", "id", f"'{tb.id}' {problem}")
        return GpuProgram(rank, sizes[0], sizes[1], sizes[2], tuple(tbs))

    def program(self, root) -> Program:
        if root.tag != "algo":
            raise self.fail(f"<{root.tag}>", "", "the root element must be <algo>")
        w = "algo"
        self.attributes(root, w)
        proto = self.text(root, w, "proto")
        if proto not in PROTOCOLS:
            raise self.fail(w, "proto", f"{proto!r} is not a protocol ({', '.join(PROTOCOLS)})")
        coll = self.text(root, w, "coll")
        if collective_of(coll) is None:
            raise self.fail(w, "coll", f"{coll!r} is not a collective ({', '.join(coll_attributes())})")
        ngpus = self.int(root, w, "ngpus", 1)
        nchannels = self.int(root, w, "nchannels", 1, MAX_CHANNEL_ID + 1)
        nchunks = self.int(root, w, "nchunksperloop", 1)
        inplace = self.flag(root, w, "inplace")
        outofplace = self.flag(root, w, "outofplace", default=int(not inplace))
        min_bytes = self.int(root, w, "minBytes", 0, default=0)
        max_bytes = self.int(root, w, "maxBytes", 0, default=0)
        old_runtime = self.old_runtime_attributes(root, w, max_bytes)
        if max_bytes == UNLIMITED_MAX_BYTES:
            max_bytes = 0
        name = root.get("name", "")
        missing = [a for a in ("name", "outofplace", "minBytes", "maxBytes") if root.get(a) is None]
        if missing:  # name: the old runtime requires it; the others: the executor and RCCL (msccl-xml.md §2.1)
            needs = " and ".join(f"the {who} requires {', '.join(m for m in missing if (m == 'name') == old)}"
                                 for who, old in (("old runtime", True), ("executor", False))
                                 if any((m == "name") == old for m in missing))
            self.notes.append(f"{self.label}: algo: no {', '.join(missing)} (msccl-tools style): defaults used; "
                              f"{needs}")
        gpus: dict[int, GpuProgram] = {}
        for k, child in enumerate(self.children(root, "gpu", w)):
            g = self.gpu(child, ngpus, k)
            if g.rank in gpus:
                raise self.fail(f"gpu {g.rank}", "id", f"'{g.rank}' is defined twice")
            gpus[g.rank] = g
        for r in range(ngpus):
            if r not in gpus:
                raise self.fail(w, "ngpus", f"'{ngpus}' but there is no <gpu id=\"{r}\">")
        demand = self.demand(root, collective_of(coll), ngpus)
        runtimes = self.runtimes(root)
        return Program(name=name, collective=collective_of(coll), ngpus=ngpus, nchunksperloop=nchunks,
                       nchannels=nchannels, gpus=tuple(gpus[r] for r in range(ngpus)), proto=proto,
                       inplace=inplace, outofplace=outofplace, min_bytes=min_bytes, max_bytes=max_bytes,
                       demand=demand, runtimes=runtimes, notes=tuple(self.notes), syntax=tuple(self.syntax),
                       coll_attribute=coll,
                       max_step_attribute=self.max_s, old_runtime_attributes=old_runtime)

    def old_runtime_attributes(self, root, w: str, max_bytes: int) -> tuple[str, ...]:
        """msccl-xml.md §2.1/§13: the old runtime reads maxBytes="0" as "never selected" (the others
        as no limit) and rejects an nthreads that is not a multiple of 32 (the others do not read it)."""
        out = []
        if root.get("maxBytes") is not None and max_bytes == 0:
            out.append('maxBytes="0": the old runtime never selects the file (executor and RCCL read it as no '
                       f'limit; write {UNLIMITED_MAX_BYTES} for no limit everywhere)')
        nthreads = root.get("nthreads")
        if nthreads is not None:
            try:
                bad = self.int(root, w, "nthreads", 0) % 32 != 0
            except XmlError:
                bad = True
            if bad:
                out.append(f'nthreads="{nthreads}" is not a multiple of 32: the old runtime rejects the file')
        return tuple(out)

    def runtimes(self, root) -> tuple[str, ...]:
        """The runtimes comment (see `runtimes_comment`) before <algo> or directly inside it, if any."""
        comments = [c for c in list(root.itersiblings(preceding=True)) + list(root)
                    if c.tag is etree.Comment and (c.text or "").strip().startswith(RUNTIMES_TAG)]
        if not comments:
            return ()
        where, attr = "algo", f"<!-- {RUNTIMES_TAG} -->"
        if len(comments) > 1:
            raise self.fail(where, attr, f"appears {len(comments)} times; a file names its runtimes once")
        names = tuple(comments[0].text.strip()[len(RUNTIMES_TAG):].split())
        unknown = [n for n in names if n not in NAMES]
        if not names or unknown:
            raise self.fail(where, attr, f"{' '.join(unknown or names)!r} is not a list of runtimes "
                                         f"(known: {', '.join(NAMES)})")
        return names

    def demand(self, root, collective: str, ngpus: int) -> Demand | None:
        """The demand comment (see `demand_comment`) before <algo> or directly inside it, if any."""
        comments = [c for c in list(root.itersiblings(preceding=True)) + list(root)
                    if c.tag is etree.Comment and (c.text or "").strip().startswith(DEMAND_TAG)]
        if not comments:
            return None
        where, attr = "algo", f"<!-- {DEMAND_TAG} -->"
        if len(comments) > 1:
            raise self.fail(where, attr, f"appears {len(comments)} times; a file carries one demand")
        text = comments[0].text.strip()[len(DEMAND_TAG):].strip()
        if collective != CUSTOM:
            self.notes.append(f"{self.label}: algo: ignored the {DEMAND_TAG} comment: coll is {collective}, "
                              "whose postcondition is the standard one")
            return None
        try:
            d = Demand.from_dict(json.loads(text))
        except (ValueError, TypeError, KeyError) as e:
            raise self.fail(where, attr, f"{text[:60]!r} is not a demand ({type(e).__name__}: "
                                         f"{_one_line(str(e))[:80]})") from None
        problem = _demand_problem(d, ngpus)
        if problem:
            raise self.fail(where, attr, problem)
        return d


def _demand_problem(d: Demand, ngpus: int) -> str:
    """What makes an embedded demand unusable for this file, '' if nothing."""
    if d.ngpus != ngpus:
        return f"ngpus {d.ngpus} does not match the file's ngpus={ngpus}"
    for c in d.chunks:
        ranks_ok = all(isinstance(r, int) and 0 <= r < ngpus for r in c.sources + c.dests)
        index_ok = all(isinstance(i, int) and i >= 0 for i in c.src_index + c.dst_index)
        if not (ranks_ok and index_ok and c.sources and c.dests and len(c.sources) == len(c.src_index)
                and len(c.dests) == len(c.dst_index)):
            return f"chunk {c.id}: {[list(c.sources), list(c.dests), list(c.src_index), list(c.dst_index)]} " \
                   f"is not [sources, destinations, input indices, output indices] of ranks 0..{ngpus - 1}"
    return ""


def _source(source: str | bytes | os.PathLike) -> tuple[str, bytes]:
    """(label for messages, raw bytes): XML text is recognised by its leading '<'."""
    if isinstance(source, bytes):
        return "<xml>", source
    if isinstance(source, str) and source.lstrip().startswith("<"):
        return "<xml>", source.encode("utf-8")
    return str(source), read_input(source, "XML file", XmlError)


MAX_ATTRIBUTES = 16  # the runtimes' reader keeps this many attributes of an element, silently dropping the rest
_TAG_ACROSS_LINES = re.compile(rb"<[A-Za-z][^<>\n\r]*[\n\r][^<>]*>")
_SINGLE_QUOTED = re.compile(rb"<[A-Za-z][^<>]*?=[ ]*'")


def syntax_problems(data: bytes) -> list[str]:
    """What XML allows and the runtimes' hand-written reader rejects or misreads (msccl-xml.md §1):
    an XML declaration, tabs, a start tag across lines, single-quoted values (each at its first line)."""
    def line(at: int) -> int:
        return data.count(b"\n", 0, at) + 1
    out = []
    if data.lstrip().startswith(b"<?xml"):
        out.append("starts with an XML declaration, which the runtimes' reader rejects")
    tab = data.find(b"\t")
    if tab >= 0:
        out.append(f"line {line(tab)}: a tab, which the runtimes' reader rejects (indent with spaces)")
    # fast path: where every newline follows a '>', no start tag spans lines (our files: one tag per line)
    m = None if data.count(b"\n") == data.count(b">\n") else _TAG_ACROSS_LINES.search(data)
    if m:
        out.append(f"line {line(m.start())}: a start tag across lines, which the runtimes' reader rejects (a tag "
                   "and its attributes on one line)")
    m = _SINGLE_QUOTED.search(data) if b"'" in data else None
    if m:
        out.append(f"line {line(m.start())}: a value in single quotes, which the runtimes' reader reads up to the "
                   "next double quote")
    return out


def read_xml(source: str | bytes | os.PathLike) -> Program:
    """A Program from an MSCCL XML file (path) or text. Raises XmlError on anything malformed."""
    label, data = _source(source)
    reader = _Reader(label)
    reader.syntax = syntax_problems(data)
    parser = etree.XMLParser(resolve_entities=False, no_network=True, load_dtd=False, remove_comments=False,
                             remove_pis=True, huge_tree=False)
    try:
        root = etree.fromstring(data, parser)
    except etree.XMLSyntaxError as e:
        raise XmlError(f"{label}: line {e.lineno}: not well-formed XML: {_one_line(e.msg)}") from None
    except (ValueError, TypeError) as e:
        raise XmlError(f"{label}: not XML: {_one_line(str(e))}") from None
    if root is None:
        raise XmlError(f"{label}: empty document")
    try:
        return reader.program(root)
    except XmlError:
        raise
    except (ValueError, TypeError, KeyError, IndexError, AttributeError, OverflowError, RecursionError) as e:
        raise XmlError(f"{label}: cannot read: {type(e).__name__}: {_one_line(str(e))}") from None


def _one_line(text: str) -> str:
    return " ".join(str(text).split())
