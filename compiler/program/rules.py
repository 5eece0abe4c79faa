"""The verifier's static rules: one function each, named after the rule id it reports. They check
what the runtime parsers check plus everything msccl-xml.md §13 says they do not: limits,
connections, FIFO pairing, dependencies and nops. Connections and message pairing are the
program's semantics (compiler/program/semantics.py); the rules only judge them.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Callable, Iterable

from compiler.model.program import BUFFERS, PROTOCOLS, READS_SRC, RECVS, SENDS, STEP_TYPES, WRITES_DST, Program, ThreadBlock
from compiler.program.findings import Finding, finding
from compiler.program.semantics import expected_chunks, messages, thread_blocks
from compiler.specs.collectives import SPECS, inplace_alias
from compiler.specs.runtimes import (ALL, MAX_CHANNELS, MAX_CNT, MAX_DEPID, MAX_NODES, MAX_OFFSET, MAX_TBS_PER_CHANNEL,
                                    NAMES, RUNTIMES, Limits, limits_for, target_runtimes)


def _tbs(p: Program) -> Iterable[tuple[int, ThreadBlock]]:
    return thread_blocks(p)


def _steps(p: Program):
    for g in p.gpus:
        for tb in g.tbs:
            for s, st in enumerate(tb.steps):
                yield g, tb, s, st


# ---- header rules --------------------------------------------------------------------------------

def syntax(p: Program, lim: Limits) -> list[Finding]:
    """What the file's text has that the runtimes' reader rejects or misreads (msccl-xml.md §1)."""
    return [finding("syntax", problem) for problem in p.syntax]


def proto(p: Program, lim: Limits) -> list[Finding]:
    if p.proto in PROTOCOLS:
        return []
    return [finding("proto", f"proto {p.proto!r} is not one of {', '.join(PROTOCOLS)}")]


def nchannels(p: Program, lim: Limits) -> list[Finding]:
    if 1 <= p.nchannels <= MAX_CHANNELS:
        return []
    return [finding("nchannels", f"nchannels={p.nchannels} must be in 1..{MAX_CHANNELS}")]


def nchunksperloop(p: Program, lim: Limits) -> list[Finding]:
    return [] if p.nchunksperloop >= 1 else [finding("nchunksperloop", f"nchunksperloop={p.nchunksperloop} < 1")]


def size_band(p: Program, lim: Limits) -> list[Finding]:
    """minBytes above a finite maxBytes: the old runtime's parser rejects the file and no runtime
    selects it for any size (msccl-xml.md §2.1, §13)."""
    if p.max_bytes and p.min_bytes > p.max_bytes:
        return [finding("size-band", f"minBytes={p.min_bytes} is above maxBytes={p.max_bytes}: the old runtime "
                                     "rejects the file and no runtime selects it for any size")]
    return []


def old_runtime_attributes(p: Program, lim: Limits) -> list[Finding]:
    """Attributes only the old runtime reads its own way (msccl-xml.md §2.1, §13)."""
    if "old" not in lim.runtimes:
        return []
    return [finding("old-runtime", problem) for problem in p.old_runtime_attributes]


def gpu_ids(p: Program, lim: Limits) -> list[Finding]:
    ranks = [g.rank for g in p.gpus]
    if p.ngpus >= 1 and ranks == list(range(p.ngpus)):
        return []
    return [finding("gpu-ids", f"gpu ids are {ranks[:8]}{'...' if len(ranks) > 8 else ''}, "
                               f"expected 0..{p.ngpus - 1} in order (ngpus={p.ngpus})")]


def inplace_flags(p: Program, lim: Limits) -> list[Finding]:
    if not (p.inplace or p.outofplace):
        return [finding("inplace-flags", "neither inplace nor outofplace is set: no call can use the algorithm")]
    if p.inplace and inplace_alias(p.collective, 0, 1, 1) is None:
        return [finding("inplace-flags", f"inplace=1, but {p.collective} has no in-place form (msccl-xml.md §10): "
                                         "an in-place call of it cannot be judged")]
    return []


def coll(p: Program, lim: Limits) -> list[Finding]:
    if p.collective not in lim.colls:
        return [finding("coll", f"collective {p.collective!r} is not accepted by the target runtime "
                                f"(accepted: {', '.join(sorted(lim.colls))})")]
    # as spelled in the file: reduce-scatter is reduce_scatter for the old runtime, reducescatter for the
    # others (msccl-xml.md §2.1); the parser of a runtime that does not take the spelling rejects the file
    refuse = [r for r in lim.runtimes if p.coll_attribute is not None and not RUNTIMES[r].parses(p.coll_attribute)]
    if refuse:
        takers = [r for r in NAMES if RUNTIMES[r].parses(p.coll_attribute)]
        return [finding("coll", f"coll={p.coll_attribute!r} is not accepted by the {'/'.join(refuse)} runtime"
                                f"{'s' if len(refuse) > 1 else ''} (it is {p.collective} as {'/'.join(takers)} "
                                f"spell{'' if len(takers) > 1 else 's'} it)")]
    return []


def buffer_size(p: Program, lim: Limits) -> list[Finding]:
    out = []
    cs = SPECS.get(p.collective)
    if cs is not None and p.ngpus > 0 and not cs.fits(p.ngpus, p.nchunksperloop):
        out.append(finding("buffer-size", f"{p.collective}: nchunksperloop={p.nchunksperloop} is not a multiple "
                                          f"of ngpus={p.ngpus}"))
    exp = expected_chunks(p)
    for g in p.gpus:
        for buf in BUFFERS:
            if g.chunks(buf) < 0:
                out.append(finding("buffer-size", f"{buf}_chunks={g.chunks(buf)} < 0", g.rank))
        # 0 is allowed: legacy skips the check, and msccl-tools writes i_chunks=0 for in-place allgather
        if exp is not None:
            for buf, want in zip("io", exp):
                if g.chunks(buf) not in (0, want):
                    out.append(finding("buffer-size", f"{buf}_chunks={g.chunks(buf)}, but {p.collective} with "
                                                      f"nchunksperloop={p.nchunksperloop} needs {want}", g.rank))
    return out


# ---- thread-block rules --------------------------------------------------------------------------

def tb_ids(p: Program, lim: Limits) -> list[Finding]:
    out = []
    for g in p.gpus:
        ids = sorted(tb.id for tb in g.tbs)
        if ids != list(range(len(ids))):
            dup = sorted({i for i in ids if ids.count(i) > 1})
            missing = sorted(set(range(len(ids))) - set(ids))
            what = f"duplicate ids {dup}" if dup else f"thread block {missing[0]} is missing"
            out.append(finding("tb-ids", f"tb ids must be 0..{len(ids) - 1} without gaps: {what}", g.rank))
    return out


def tb_count(p: Program, lim: Limits) -> list[Finding]:
    return [finding("tb-count", f"{len(g.tbs)} thread blocks; the runtime needs fewer than {lim.max_tbs}", g.rank)
            for g in p.gpus if len(g.tbs) >= lim.max_tbs]


def co_residency(p: Program, sms: int | None) -> list[Finding]:
    if sms is None:
        return []
    return [finding("co-residency", f"{len(g.tbs)} thread blocks are not all co-resident on {sms} SMs "
                                    f"(they spin-wait on each other)", g.rank)
            for g in p.gpus if len(g.tbs) >= sms]


def peer(p: Program, lim: Limits) -> list[Finding]:
    out = []
    for r, tb in _tbs(p):
        for kind, v in (("send", tb.send), ("recv", tb.recv)):
            if v != -1 and not (0 <= v < p.ngpus and v != r):
                out.append(finding("peer", f"{kind}={v} must be -1 or another rank in 0..{p.ngpus - 1}", r, tb.id))
    return out


def chan(p: Program, lim: Limits) -> list[Finding]:
    return [finding("chan", f"chan={tb.chan} must be in 0..{min(p.nchannels, MAX_CHANNELS + 1) - 1} "
                            f"(nchannels={p.nchannels})", r, tb.id)
            for r, tb in _tbs(p) if not 0 <= tb.chan < min(p.nchannels, MAX_CHANNELS + 1)]


def conn_unique(p: Program, lim: Limits) -> list[Finding]:
    out = []
    for g in p.gpus:
        for kind in ("send", "recv"):
            users = defaultdict(list)
            for tb in g.tbs:
                if getattr(tb, kind) >= 0:
                    users[(getattr(tb, kind), tb.chan)].append(tb.id)
            for (q, c), ids in sorted(users.items()):
                if len(ids) > 1:
                    out.append(finding("conn-unique", f"tbs {ids} all {kind} {'to' if kind == 'send' else 'from'} "
                                                      f"rank {q} on channel {c}; one tb per peer and channel",
                                       g.rank, ids[1]))
    return out


def channel_tbs(p: Program, lim: Limits) -> list[Finding]:
    out = []
    for g in p.gpus:
        for kind in ("send", "recv"):
            per = defaultdict(int)
            for tb in g.tbs:
                per[tb.chan] += getattr(tb, kind) >= 0
            out += [finding("channel-tbs", f"{k} tbs with a {kind} peer on channel {c} (at most "
                                           f"{MAX_TBS_PER_CHANNEL})", g.rank)
                    for c, k in sorted(per.items()) if k > MAX_TBS_PER_CHANNEL]
    return out


def conn_symmetry(p: Program, lim: Limits) -> list[Finding]:
    sends = {(r, tb.send, tb.chan): tb.id for r, tb in _tbs(p) if tb.send >= 0}
    recvs = {(tb.recv, r, tb.chan): tb.id for r, tb in _tbs(p) if tb.recv >= 0}
    out = []
    for (a, b, c), t in sorted(sends.items()):
        if (a, b, c) not in recvs:
            out.append(finding("conn-symmetry", f"sends to rank {b} on channel {c}, but rank {b} has no tb with "
                                                f"recv={a} chan={c}", a, t))
    for (a, b, c), t in sorted(recvs.items()):
        if (a, b, c) not in sends:
            out.append(finding("conn-symmetry", f"receives from rank {a} on channel {c}, but rank {a} has no tb with "
                                                f"send={b} chan={c}", b, t))
    return out


def max_steps(p: Program, lim: Limits) -> list[Finding]:
    out = [finding("max-steps", f"{len(tb.steps)} steps (nops included); the runtime allows {lim.max_steps}", r, tb.id)
           for r, tb in _tbs(p) if len(tb.steps) > lim.max_steps]
    if p.max_step_attribute >= lim.max_steps:  # the parsers range-check s itself (msccl-xml.md §2.4)
        out.append(finding("max-steps", f"a step is numbered s=\"{p.max_step_attribute}\"; the runtime's parser "
                                        f"allows s < {lim.max_steps}"))
    return out


def nodes(p: Program, lim: Limits) -> list[Finding]:
    out = []
    for g in p.gpus:
        k = 1 + p.ngpus + len(g.tbs) + sum(len(tb.steps) for tb in g.tbs)
        if k > MAX_NODES:
            out.append(finding("nodes", f"the file stores {k} XML nodes for this rank (1 + ngpus + tbs + steps); "
                                        f"the reader allows {MAX_NODES}", g.rank))
    return out


# ---- step rules ----------------------------------------------------------------------------------

def step_type(p: Program, lim: Limits) -> list[Finding]:
    out = []
    for g, tb, s, st in _steps(p):
        if st.type == "ra":
            out.append(finding("step-type", "type 'ra': legacy parses it but silently ends the thread block there",
                               g.rank, tb.id, s))
        elif st.type not in STEP_TYPES:
            out.append(finding("step-type", f"type {st.type!r} is not one of {' '.join(STEP_TYPES)}", g.rank, tb.id, s))
    return out


def buffer(p: Program, lim: Limits) -> list[Finding]:
    out = []
    for g, tb, s, st in _steps(p):
        for f, v in (("srcbuf", st.srcbuf), ("dstbuf", st.dstbuf)):
            if v not in BUFFERS:
                out.append(finding("buffer", f"{f}={v!r} must be i, o or s (nops included)", g.rank, tb.id, s, st.type))
    return out


def cnt(p: Program, lim: Limits) -> list[Finding]:
    out = []
    for g, tb, s, st in _steps(p):
        lo = 0 if st.type == "nop" else 1
        if not lo <= st.cnt <= MAX_CNT:
            out.append(finding("cnt", f"cnt={st.cnt} must be in {lo}..{MAX_CNT}", g.rank, tb.id, s, st.type))
    return out


def offset(p: Program, lim: Limits) -> list[Finding]:
    out = []
    for g, tb, s, st in _steps(p):
        for which, buf, off in (("src", st.srcbuf, st.srcoff), ("dst", st.dstbuf, st.dstoff)):
            used = st.type in (READS_SRC if which == "src" else WRITES_DST)
            if not -1 <= off <= MAX_OFFSET:
                why = f"is above the XML's int16 ({MAX_OFFSET})" if off > MAX_OFFSET else "is negative (-1: unused)"
                out.append(finding("offset", f"{which}off={off} {why}", g.rank, tb.id, s, st.type))
            elif used and buf in BUFFERS and st.cnt >= 1:
                n = g.chunks(buf)
                if off < 0 or off + st.cnt > n:
                    out.append(finding("offset", f"{which} {buf}[{off}:{off + st.cnt}] is outside {buf} "
                                                 f"({buf}_chunks={n})", g.rank, tb.id, s, st.type))
    return out


def no_peer(p: Program, lim: Limits) -> list[Finding]:
    out = []
    for g, tb, s, st in _steps(p):
        if st.type in SENDS and tb.send < 0:
            out.append(finding("no-peer", "sends, but the tb has send=-1", g.rank, tb.id, s, st.type))
        if st.type in RECVS and tb.recv < 0:
            out.append(finding("no-peer", "receives, but the tb has recv=-1", g.rank, tb.id, s, st.type))
    return out


_TABLE: list = [None, ()]  # the program last asked about (by identity; hashing one walks all of it) and its table


def _tbs_by_id(p: Program) -> tuple[dict, ...]:
    """Per rank: tb id -> tb (Program is frozen, so one table serves every rule that asks)."""
    if _TABLE[0] is not p:
        _TABLE[:] = [p, tuple({tb.id: tb for tb in g.tbs} for g in p.gpus)]
    return _TABLE[1]


def _dep_target(p: Program, rank: int, depid: int, deps: int):
    """The step a dependency names, or None."""
    if not 0 <= rank < len(p.gpus):
        return None
    tb = _tbs_by_id(p)[rank].get(depid)
    if tb is None or not 0 <= deps < len(tb.steps):
        return None
    return tb.steps[deps]


def dep_target(p: Program, lim: Limits) -> list[Finding]:
    out = []
    for g, tb, s, st in _steps(p):
        ids = _tbs_by_id(p)[g.rank]
        bad = None
        if st.depid == -1:
            if st.deps != -1:
                bad = f"deps={st.deps} without a depid"
        elif st.depid < -1:
            bad = f"depid={st.depid} must be -1 or a tb id"
        elif st.depid == tb.id:
            bad = "depends on its own thread block (program order already orders it; a later step hangs)"
        elif st.depid not in ids:
            bad = f"depid={st.depid}: this rank has no such thread block"
        elif not 0 <= st.deps < len(ids[st.depid].steps):
            bad = f"deps={st.deps}: tb {st.depid} has steps 0..{len(ids[st.depid].steps) - 1}"
        if bad:
            out.append(finding("dep-target", bad, g.rank, tb.id, s, st.type))
    return out


def depid_range(p: Program, lim: Limits) -> list[Finding]:
    return [finding("depid-range", f"depid={st.depid} does not fit the runtime's int8 (at most {MAX_DEPID})",
                    g.rank, tb.id, s, st.type) for g, tb, s, st in _steps(p) if st.depid > MAX_DEPID]


def hasdep(p: Program, lim: Limits) -> list[Finding]:
    out = []
    for g, tb, s, st in _steps(p):
        if st.depid >= 0 and st.depid != tb.id:
            t = _dep_target(p, g.rank, st.depid, st.deps)
            if t is not None and t.type != "nop" and not t.hasdep:
                out.append(finding("hasdep", f"waits for tb {st.depid} step {st.deps}, which has hasdep=0 "
                                             f"(never published: the wait hangs or ends late)",
                                   g.rank, tb.id, s, st.type))
    return out


def dep_on_nop(p: Program, lim: Limits) -> list[Finding]:
    out = []
    for g, tb, s, st in _steps(p):
        if st.depid >= 0 and st.depid != tb.id:
            t = _dep_target(p, g.rank, st.depid, st.deps)
            if t is not None and t.type == "nop":
                out.append(finding("dep-on-nop", f"waits for tb {st.depid} step {st.deps}, a nop (nops never "
                                                 f"publish their step)", g.rank, tb.id, s, st.type))
    return out


def nop_dep(p: Program, lim: Limits) -> list[Finding]:
    return [finding("nop-dep", "a nop without a dependency (it shifts every later step number)",
                    g.rank, tb.id, s, "nop")
            for g, tb, s, st in _steps(p) if st.type == "nop" and st.depid < 0]


def nop_chain(p: Program, lim: Limits) -> list[Finding]:
    out = []
    for g, tb, s, st in _steps(p):
        if s > 0 and st.type != "nop" and tb.steps[s - 1].type == "nop" and st.depid < 0:
            out.append(finding("nop-chain", "follows a nop but has no dependency of its own (the parser rejects it)",
                               g.rank, tb.id, s, st.type))
    return out


def trailing_nop(p: Program, lim: Limits) -> list[Finding]:
    return [finding("trailing-nop", "nops at the end of the tb are dropped by the parser, with their dependencies",
                    r, tb.id, len(tb.steps) - 1, "nop")
            for r, tb in _tbs(p) if tb.steps and tb.steps[-1].type == "nop"]


# ---- connection rules ----------------------------------------------------------------------------

def _pairs(p: Program):
    """Per connection, the k-th send-type step of the sender with the k-th recv-type step of the receiver."""
    for m in messages(p):
        yield m.key, m.sender, m.receiver, m.sends, m.receives


def fifo_count(p: Program, lim: Limits) -> list[Finding]:
    out = []
    for (a, b, c), stb, rtb, snd, rcv in _pairs(p):
        if len(snd) != len(rcv):
            out.append(finding("fifo-count", f"sends {len(snd)} messages to rank {b} on channel {c}, but rank {b} "
                                             f"tb {rtb.id} receives {len(rcv)}", a, stb.id))
    return out


def cnt_mismatch(p: Program, lim: Limits) -> list[Finding]:
    out = []
    for (a, b, c), stb, rtb, snd, rcv in _pairs(p):
        for k, ((i, s), (j, r)) in enumerate(zip(snd, rcv)):
            if s.cnt != r.cnt:
                out.append(finding("cnt-mismatch", f"message {k} to rank {b} channel {c} has cnt={s.cnt}, but its "
                                                   f"receive, rank {b} tb {rtb.id} step {j} ({r.type}), "
                                                   f"has cnt={r.cnt}", a, stb.id, i, s.type))
    return out


def fifo_order(p: Program, lim: Limits) -> list[Finding]:
    """Cross-checks each message through the remote-field convention (msccl-xml.md §3): a sender whose
    dst* is unused (`s`, `rrs`) names where the receiver stores it; an `r` names in src* where the
    sender read it. Fields left at -1 are not checked."""
    out = []
    for (a, b, c), stb, rtb, snd, rcv in _pairs(p):
        for k, ((i, s), (j, r)) in enumerate(zip(snd, rcv)):
            if s.type in ("s", "rrs") and s.dstoff >= 0 and r.type in WRITES_DST:
                if (s.dstbuf, s.dstoff) == (r.dstbuf, r.dstoff):
                    continue
                why = f"the send names destination {s.dstbuf}[{s.dstoff}], the receive writes {r.dstbuf}[{r.dstoff}]"
            elif r.type == "r" and r.srcoff >= 0 and s.type in ("s", "rcs"):
                sent = (s.srcbuf, s.srcoff) if s.type == "s" else (s.dstbuf, s.dstoff)  # rcs forwards what it stored
                if (r.srcbuf, r.srcoff) == sent:
                    continue
                why = f"the receive names source {r.srcbuf}[{r.srcoff}], the send reads {sent[0]}[{sent[1]}]"
            else:
                continue
            out.append(finding("fifo-order", f"message {k} to rank {b} channel {c} pairs with rank {b} tb {rtb.id} "
                                             f"step {j} ({r.type}), but {why}: steps out of order",
                               a, stb.id, i, s.type))
    return out


STATIC_RULES: tuple[Callable[[Program, Limits], list[Finding]], ...] = (
    syntax, proto, nchannels, nchunksperloop, size_band, old_runtime_attributes, gpu_ids, inplace_flags, coll, buffer_size,
    tb_ids, tb_count, peer, chan, conn_unique, channel_tbs, conn_symmetry, max_steps, nodes,
    step_type, buffer, cnt, offset, no_peer, dep_target, depid_range, hasdep, dep_on_nop, nop_dep, nop_chain,
    trailing_nop, fifo_count, cnt_mismatch, fifo_order,
)
# Findings that make symbolic execution meaningless (it would only repeat them as deadlocks).
STRUCTURAL = frozenset({"proto", "nchunksperloop", "gpu-ids", "tb-ids", "peer", "conn-unique", "conn-symmetry",
                        "step-type", "buffer", "cnt", "offset", "no-peer", "dep-target", "fifo-count", "cnt-mismatch"})


def declared_runtimes(p: Program) -> tuple[str, ...]:
    """The runtimes a file is for where it says so: those its runtimes comment names, else, where its
    `coll` is spelled as only some of the runtimes with its collective spell it (reduce_scatter: the
    old runtime; reducescatter: executor and RCCL), those; () where it does not say."""
    if p.runtimes or p.coll_attribute is None or p.collective not in SPECS:
        return p.runtimes
    takers = target_runtimes(p.collective)
    spelled = tuple(r for r in takers if RUNTIMES[r].parses(p.coll_attribute))
    return spelled if spelled and spelled != takers else ()


def static_findings(p: Program, runtime: str = ALL, only: frozenset[str] | None = None) -> list[Finding]:
    """The static rules' findings for `runtime` (ALL: the strictest over the runtimes the program
    declares, else those the collective targets); with `only`, just the findings of those rules."""
    lim = limits_for(runtime, p.collective, declared=declared_runtimes(p))
    return [f for rule in STATIC_RULES for f in rule(p, lim) if only is None or f.rule in only]
