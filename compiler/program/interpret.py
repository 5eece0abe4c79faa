"""Symbolic execution of a Program: the verifier's interpreter (a user of compiler/program/semantics.py).

Every thread block runs its steps in order. A step with cnt = c is c one-chunk sub-transfers (the
worst case of msccl-xml.md §5/§7.5). A connection (rank A -> B, channel c) is a FIFO holding at most
SLOTS[proto] messages: a send needs a free slot, a receive a message, rcs/rrs/rrcs both. A step
with a dependency waits until its target tb has published a step index >= deps; a tb publishes
after each step with hasdep=1 (nops never publish). The system is deterministic and monotone, so
running thread blocks from a work list until nothing can move decides deadlock for every
interleaving; whatever is still unfinished then is deadlocked.

Happens-before for the race check uses vector clocks: program order, dependency edges (the waiter
joins the target's clock as published) and message edges (the receiver joins the sender's clock as
sent). Two accesses to one chunk on one rank by different tbs, at least one a write, that are not
ordered that way are a race. Full clocks have one entry per thread block of the program and a join
per message, which is quadratic in the GPUs (hours at 512 GPUs), so `trace` first runs with local
clocks: one entry per thread block of the tb's own rank, joined on dependencies only (program order
and dependencies within a rank, a subset of happens-before). A run without races there has none
under the full relation either, and nothing else the run finds depends on the clocks; only a run
that reports a race is repeated with full clocks, whose verdict stands.

`trace(program, inplace, slots)` is the public entry: the findings, the final memory and the order
in which steps completed (the torch executor runs steps in that order, with slots=UNBOUNDED).
`traces` runs a program's out-of-place and in-place calls together: which steps can run, and so
the order and any deadlock, do not depend on the values they move, so one schedule drives both
calls' memories (the verifier's symbolic run, twice, was two thirds of verifying 512 GPUs).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

import numpy as np

from compiler.model.program import SLOTS, Program, ThreadBlock
from compiler.program.findings import Finding, finding
from compiler.program.symbols import Sparse
from compiler.program.semantics import KINDS, Interpreter, connections, layout, publishes, waits

UNBOUNDED = 1 << 62  # connection slots of a transport that buffers without limit (gloo)


def _ranks(rs: list[int]) -> str:
    rs = sorted(rs)
    if len(rs) > 2 and rs == list(range(rs[0], rs[-1] + 1)):
        return f"ranks {rs[0]}-{rs[-1]}"
    return ("rank " if len(rs) == 1 else "ranks ") + ", ".join(map(str, rs))


DENSE_BITS = 1 << 16  # ranks x input chunks up to which a symbol is one int (else symbols.Sparse)


class Encoding:
    """A symbolic chunk value is an int: bit (rank * width + index) set per contribution of input
    chunk i[index] of `rank`. Copies carry one bit; a reduction ORs them (after checking they are
    disjoint). 0 is data derived from an undefined read; None is memory never written. Beyond
    DENSE_BITS bits the values are compiler.program.symbols.Sparse, which act as those ints."""

    def __init__(self, width: int, ranks: int = 0):
        self.width = max(width, 1)
        self.sparse = ranks * self.width > DENSE_BITS

    def bit(self, rank: int, index: int):
        if self.sparse:
            return Sparse({index: 1 << rank})
        return 1 << (rank * self.width + index)

    def contributions(self, v) -> list[tuple[int, int]]:
        if isinstance(v, Sparse):
            return v.contributions()
        out = []
        while v:
            low = v & -v
            b = low.bit_length() - 1
            out.append(divmod(b, self.width))
            v ^= low
        return out

    def describe(self, v: int | None) -> str:
        if v is None:
            return "nothing (never written)"
        if v == 0:
            return "undefined data"
        cs = self.contributions(v)
        if len(cs) == 1:
            return f"rank {cs[0][0]}'s i[{cs[0][1]}]"
        idx = {j for _, j in cs}
        if len(idx) == 1:
            return f"the sum of i[{idx.pop()}] over {_ranks([r for r, _ in cs])}"
        return "the sum of " + " + ".join(f"rank {r}'s i[{j}]" for r, j in cs)


class _Conn:
    __slots__ = ("id", "key", "q", "cap", "sender", "receiver")

    def __init__(self, cid, key, cap, sender, receiver):
        self.id, self.key, self.cap, self.sender, self.receiver = cid, key, cap, sender, receiver
        self.q = deque()  # (one value per call, clock snapshot)


class _Tb:
    __slots__ = ("g", "rank", "tb", "steps", "out", "inc", "pc", "sub", "waited", "t", "vc", "pub", "pub_snap",
                 "blocked")

    def __init__(self, g, rank, tb: ThreadBlock, ntbs):
        self.g, self.rank, self.tb, self.steps = g, rank, tb, tb.steps
        self.out = self.inc = None
        self.pc = self.sub = 0
        self.waited = False  # the current step's dependency is satisfied
        self.t = 0  # own clock component: one tick per step or sub-transfer
        self.vc = np.zeros(ntbs, dtype=np.int64)  # what this tb knows of the others' clocks (own entry
        # unused); never changed in place once set (snapshots share it): a join makes a new one
        self.pub = -1  # last published step index
        self.pub_snap = None
        self.blocked = None  # wake key while blocked


class Call:
    """One call's memory (out of place or in place: the buffers alias differently) and what its run
    found. The order steps run in does not depend on the values they move, so one schedule serves
    every call of a program (Machine.calls); only memory and the findings about it are per call."""

    __slots__ = ("addrs", "enc", "mem", "last_w", "reads", "findings", "reported")

    def __init__(self, p: Program, inplace: bool):
        self.addrs, size, init, self.enc = initial_memory(p, inplace)
        self.mem = [None] * size
        for a, v in init:
            self.mem[a] = v
        self.last_w = [None] * size  # (g, t, pc) of the last write
        self.reads = [None] * size  # {g: (t, pc)} of reads since the last write
        self.findings: list[Finding] = []
        self.reported = set()  # (rule, rank, address): one finding per chunk


class Machine(Interpreter):
    """The symbolic machine: values are Encoding symbols, one per chunk; `read`, `write` and
    `reduce` (the Interpreter's hooks) act for the thread block `cur` on the memory of `call` and
    keep the clocks. A message carries one value per call."""

    def __init__(self, p: Program, conns: dict, calls: list[Call], slots: int | None = None, full_clocks: bool = True):
        self.p, self.calls = p, calls
        self.call = calls[0]  # the call whose memory the hooks act on
        self.full = full_clocks  # else local clocks: one entry per tb of the rank, no message edges
        self.tbs: list[_Tb] = []
        self.gidx = {}
        self.base = []  # per rank: the index of its first tb (a clock entry is g - base without full clocks)
        ntbs = sum(len(g.tbs) for g in p.gpus)
        for g in p.gpus:
            self.base.append(0 if full_clocks else len(self.tbs))
            for tb in g.tbs:
                self.gidx[(g.rank, tb.id)] = len(self.tbs)
                self.tbs.append(_Tb(len(self.tbs), g.rank, tb, ntbs if full_clocks else len(g.tbs)))
        self.conns = []
        cap = SLOTS[p.proto] if slots is None else slots
        for (a, b, c), (stb, rtb) in sorted(conns.items()):
            s, r = self.tbs[self.gidx[(a, stb.id)]], self.tbs[self.gidx[(b, rtb.id)]]
            conn = _Conn(len(self.conns), (a, b, c), cap, s, r)
            s.out = r.inc = conn
            self.conns.append(conn)
        self.waiters: dict = {}
        self.ready = deque()
        self.queued = [False] * len(self.tbs)
        self.cur: _Tb | None = None  # the tb whose step runs
        self.order: list[tuple[int, int, int]] = []  # (rank, tb id, step) as steps complete

    # ---- scheduling ----

    def wake(self, key):
        for g in self.waiters.pop(key, ()):
            if not self.queued[g]:
                self.queued[g] = True
                self.ready.append(g)

    def run(self) -> list[list[Finding]]:
        """Runs every thread block as far as it goes; the findings of each call."""
        self.ready.extend(range(len(self.tbs)))
        self.queued = [True] * len(self.tbs)
        while self.ready:
            g = self.ready.popleft()
            self.queued[g] = False
            tb = self.tbs[g]
            tb.blocked = self.advance(tb)
            if tb.blocked is not None:
                self.waiters.setdefault(tb.blocked, []).append(g)
        stuck = [tb for tb in self.tbs if tb.pc < len(tb.steps)]
        ends = [self.deadlock(tb) for tb in stuck]
        if not stuck:
            for c in self.conns:
                if c.q:
                    a, b, ch = c.key
                    ends.append(finding("unconsumed", f"{len(c.q)} messages to rank {b} on channel {ch} are "
                                                      f"never received", a, c.sender.tb.id))
        for call in self.calls:
            call.findings.extend(ends)
        return [call.findings for call in self.calls]

    # ---- clocks ----

    def join(self, tb: _Tb, snap):
        g2, t2, vc2 = snap
        g2 -= self.base[tb.rank]
        vc = tb.vc if vc2 is tb.vc else np.maximum(tb.vc, vc2)
        if vc[g2] < t2:
            if vc is tb.vc:
                vc = vc.copy()
            vc[g2] = t2
        tb.vc = vc

    def ordered(self, tb: _Tb, rec) -> bool:
        return rec[0] == tb.g or tb.vc[rec[0] - self.base[tb.rank]] >= rec[1]

    # ---- memory ----

    def _read1(self, c: Call, tb: _Tb, buf: str, off: int):
        a = c.addrs[tb.rank][buf][off]
        w = c.last_w[a]
        if w is not None and not self.ordered(tb, w):
            self.race(tb, buf, off, a, "reads", w, "writes")
        rd = c.reads[a]
        if rd is None:
            rd = c.reads[a] = {}
        rd[tb.g] = (tb.t, tb.pc)
        v = c.mem[a]
        if v is None:
            if ("undefined-read", tb.rank, a) not in c.reported:
                c.reported.add(("undefined-read", tb.rank, a))
                self.add("undefined-read", f"reads {buf}[{off}], which holds no data yet", tb)
            return 0
        return v

    def _write1(self, c: Call, tb: _Tb, buf: str, off: int, v):
        a = c.addrs[tb.rank][buf][off]
        w = c.last_w[a]
        if w is not None and not self.ordered(tb, w):
            self.race(tb, buf, off, a, "writes", w, "writes")
        rd = c.reads[a]
        if rd:
            base = self.base[tb.rank]
            for g, (t, pc) in rd.items():
                if g != tb.g and tb.vc[g - base] < t:
                    self.race(tb, buf, off, a, "writes", (g, t, pc), "reads")
                    break
        c.last_w[a] = (tb.g, tb.t, tb.pc)
        c.reads[a] = None
        c.mem[a] = v

    def _reduce1(self, tb: _Tb, x, y):
        if not x or not y:
            return 0  # undefined data stays undefined (reported where it was read)
        both = x & y
        c = self.call
        if both and ("double-count", tb.rank, tb.tb.id, tb.pc) not in c.reported:
            c.reported.add(("double-count", tb.rank, tb.tb.id, tb.pc))
            r, j = c.enc.contributions(both)[0]
            self.add("double-count", f"reduction counts rank {r}'s i[{j}] twice", tb)
        return x | y

    # ---- the Interpreter's hooks: a window of chunks is a list of symbols ----

    def read(self, buf: str, off: int, cnt: int) -> list:
        if cnt == 1:
            return [self._read1(self.call, self.cur, buf, off)]
        return [self._read1(self.call, self.cur, buf, off + k) for k in range(cnt)]

    def write(self, buf: str, off: int, cnt: int, vals: list) -> None:
        for k, v in enumerate(vals):
            self._write1(self.call, self.cur, buf, off + k, v)

    def reduce(self, xs: list, ys: list) -> list:
        return [self._reduce1(self.cur, x, y) for x, y in zip(xs, ys)]

    def same_memory(self, a, b) -> bool:
        addrs = self.call.addrs[self.cur.rank]
        return all(addrs[a[0]][a[1] + k] == addrs[b[0]][b[1] + k] for k in range(a[2]))

    # ---- reporting ----

    def add(self, rule: str, text: str, tb: _Tb):
        st = tb.steps[tb.pc]
        self.call.findings.append(finding(rule, text, tb.rank, tb.tb.id, tb.pc, st.type))

    def race(self, tb: _Tb, buf, off, a, what, other, other_what):
        reported = self.call.reported
        if ("race", tb.rank, a) in reported:
            return
        reported.add(("race", tb.rank, a))
        o = self.tbs[other[0]]
        self.add("race", f"{what} {buf}[{off}] while tb {o.tb.id} step {other[2]} ({o.steps[other[2]].type}) "
                         f"{other_what} it, and no dependency orders the two", tb)

    def state(self, tb: _Tb) -> str:
        if tb.pc >= len(tb.steps):
            return f"tb {tb.tb.id} has finished"
        return f"tb {tb.tb.id} is blocked at step {tb.pc} ({tb.steps[tb.pc].type})"

    def deadlock(self, tb: _Tb) -> Finding:
        kind, x = tb.blocked
        st = tb.steps[tb.pc]
        if kind == "f":
            t = self.tbs[x]
            why = (f"waits for tb {t.tb.id} to publish step {st.deps} (published so far: {t.pub}; "
                   f"{self.state(t)})")
        elif kind == "d":
            c = self.conns[x]
            why = (f"waits for a message from rank {c.key[0]} on channel {c.key[2]} "
                   f"(rank {c.key[0]} {self.state(c.sender)})")
        else:
            c = self.conns[x]
            why = (f"waits for a free slot to rank {c.key[1]} on channel {c.key[2]}: all {c.cap} {self.p.proto} "
                   f"slots are in flight (rank {c.key[1]} {self.state(c.receiver)})")
        sub = f" (sub-transfer {tb.sub + 1} of {st.cnt})" if st.cnt > 1 and kind != "f" else ""
        return finding("deadlock", why + sub, tb.rank, tb.tb.id, tb.pc, st.type)

    # ---- running thread blocks ----

    def finish_step(self, tb: _Tb, st):
        self.order.append((tb.rank, tb.tb.id, tb.pc))
        if publishes(st):
            tb.pub = tb.pc
            tb.pub_snap = (tb.g, tb.t, tb.vc)
            self.wake(("f", tb.g))
        tb.pc += 1
        tb.sub = 0
        tb.waited = False

    def advance(self, tb: _Tb):
        """Runs `tb` until it finishes (returns None) or blocks (returns what it waits for)."""
        steps = tb.steps
        self.cur = tb
        calls = self.calls
        while tb.pc < len(steps):
            st = steps[tb.pc]
            if not tb.waited:
                if waits(st):
                    target = self.tbs[self.gidx[(tb.rank, st.depid)]]
                    if target.pub < st.deps:
                        return ("f", target.g)
                    self.join(tb, target.pub_snap)
                tb.waited = True
            kind = KINDS[st.type]
            if kind.local:
                if kind.acts:
                    tb.t += 1
                    for self.call in calls:
                        self.step(st)
            else:
                recv, send = kind.receives, kind.sends
                inc, out = tb.inc, tb.out
                while tb.sub < st.cnt:  # one sub-transfer (one chunk) at a time: the slots bound chunks
                    if recv and not inc.q:
                        return ("d", inc.id)
                    if send and len(out.q) >= out.cap:
                        return ("s", out.id)
                    tb.t += 1
                    x = None
                    if recv:
                        x, snap = inc.q.popleft()
                        self.wake(("s", inc.id))
                        if snap is not None:
                            self.join(tb, snap)
                    y = []
                    for k, self.call in enumerate(calls):
                        y.append(self.step(st, x[k] if recv else None, tb.sub, 1))
                    if send:
                        out.q.append((y, (tb.g, tb.t, tb.vc) if self.full else None))
                        self.wake(("d", out.id))
                    tb.sub += 1
            self.finish_step(tb, st)
        return None


# ---- a call's memory and the public entry --------------------------------------------------------

def addresses(p: Program, inplace: bool):
    """Flat addresses of every (rank, buffer, chunk) and the input chunks per rank, for the buffers
    of compiler.program.semantics.layout: in place the view's chunks are addresses inside the base
    (a view chunk beyond the base gets an address of its own)."""
    addrs, n_in, nxt = [], [], 0
    for g in p.gpus:
        lay = layout(p, g.rank, inplace)
        size, alias = lay.chunks, lay.alias
        bufs = {}
        for b in "osi":
            if alias is not None and b == alias.view:
                continue
            bufs[b] = list(range(nxt, nxt + size[b]))
            nxt += size[b]
        if alias is not None:
            base = bufs[alias.base]
            view = []
            for k in range(size[alias.view]):
                j = alias.offset + k
                view.append(base[j] if 0 <= j < len(base) else nxt)
                nxt += not 0 <= j < len(base)
            bufs[alias.view] = view
        addrs.append(bufs)
        n_in.append(size["i"])
    return addrs, n_in, nxt


def initial_memory(p: Program, inplace: bool):
    """(addresses, memory size, initial contents, encoding) of a call of `p`: every rank's input
    chunk j holds the symbol of (rank, j)."""
    addrs, n_in, size = addresses(p, inplace)
    enc = Encoding(max(n_in, default=1), len(addrs))
    init = [(addrs[r]["i"][j], enc.bit(r, j)) for r in range(len(addrs)) for j in range(n_in[r])]
    return addrs, size, init, enc


@dataclass(frozen=True)
class Trace:
    """A symbolic run of one call: what went wrong, the final memory (symbols at the flat
    `addresses`), and the order steps completed in: (rank, tb id, step index)."""
    findings: tuple[Finding, ...]
    memory: list
    addresses: list[dict]
    encoding: Encoding
    order: tuple[tuple[int, int, int], ...]


def traces(p: Program, kinds: tuple[bool, ...], slots: int | None = None) -> list[Trace]:
    """Runs `p` once for each call kind in `kinds` (in place or not), with `slots` messages in flight
    per connection (default: the protocol's, SLOTS[proto]; UNBOUNDED for a transport that buffers
    them all). The calls share one schedule (Call): a program of a million steps is scheduled once."""
    conns = connections(p)
    calls = [Call(p, inplace) for inplace in kinds]
    m = Machine(p, conns, calls, slots, full_clocks=False)
    m.run()
    raced = [k for k, c in enumerate(calls) if any(f.rule == "race" for f in c.findings)]
    if raced:  # maybe ordered through another rank: judge those calls again with full clocks
        again = [Call(p, kinds[k]) for k in raced]
        Machine(p, conns, again, slots).run()
        for k, c in zip(raced, again):
            calls[k] = c
    order = tuple(m.order)
    return [Trace(tuple(c.findings), c.mem, c.addrs, c.enc, order) for c in calls]


def trace(p: Program, inplace: bool = False, slots: int | None = None) -> Trace:
    """Runs `p` as one call (in place or not): `traces` for one kind."""
    return traces(p, (inplace,), slots)[0]
