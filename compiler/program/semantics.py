"""What a Program means, written once: step semantics, dependencies, connections and the buffers
of a call (in-place aliasing). The symbolic verifier (compiler/program/interpret.py) and the
torch.distributed executor (backends/torch_dist/executor.py) are its users, in the torch.fx
manner: they subclass `Interpreter` and give it values (symbols, tensors); what each step type
does with them is `Interpreter.step`. (The program timer, compiler/program/timing.py, reads the
same step tables: SENDS and RECVS of compiler/model/program.py.)

Steps (msccl-xml.md §3-§6). A step with cnt = c covers chunks off..off+c-1 of its buffers. It
reads all its operands before it writes. Reductions combine (received or destination, local).

| type | receives | reads src | reduces | writes dst | sends |
|---|---|---|---|---|---|
| s | | yes | | | what it read |
| r | yes | | | what it received | |
| rcs | yes | | | what it received | what it received |
| rrs | yes | yes | received op src | | the reduction |
| rrc | yes | yes | received op src | the reduction | |
| rrcs | yes | yes | received op src | the reduction | the reduction |
| cpy | | yes | | what it read (nothing where src is dst: an in-place self-copy) | |
| re | | yes | dst op src | the reduction | |
| nop | | | | | |

Order. Every thread block runs its steps in order. A step with depid >= 0 waits until thread
block depid of its rank has published a step index >= deps; a thread block publishes after each
step with hasdep=1 (nops never publish). A connection is (sender rank, receiver rank, channel),
with one thread block at each end; the k-th send-type step on it pairs with the k-th receive-type
step, and messages are received in the order they were sent.

Buffers of a call. i (input), o (output) and s (scratch), in chunks as the file declares them. In
an in-place call the runtimes alias the input and the output (msccl-xml.md §10,
compiler.specs.collectives.Alias): the base buffer has at least the size §4 gives it, and the
view is a window into it.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from typing import Any, Iterator

from compiler.model.program import (READS_SRC, RECVS, REDUCES, SENDS, STEP_TYPES, WRITES_DST, Program, Step,
                                    ThreadBlock)
from compiler.specs.collectives import CUSTOM, SPECS, Alias, inplace_alias

NOP = "nop"


@dataclass(frozen=True)
class StepKind:
    """The table above, for one step type."""
    type: str
    receives: bool
    sends: bool
    reads_src: bool
    writes_dst: bool
    reduces: bool
    local: bool  # neither sends nor receives: runs without a connection (cpy, re, nop)
    acts: bool  # touches memory or a connection (everything but a nop)

    @classmethod
    def of(cls, t: str) -> "StepKind":
        receives, sends, reads, writes = t in RECVS, t in SENDS, t in READS_SRC, t in WRITES_DST
        return cls(t, receives, sends, reads, writes, t in REDUCES, not (receives or sends),
                   receives or sends or reads or writes)


KINDS: dict[str, StepKind] = {t: StepKind.of(t) for t in STEP_TYPES}


class Interpreter:
    """Runs steps over values the subclass defines (torch.fx's Interpreter, for MSCCL steps).

    A subclass gives `read(buf, off, cnt)` (the value of a window of chunks), `write(buf, off,
    cnt, value)` and `reduce(a, b)`; it moves messages itself and hands `step` what was
    received. `step` is the one definition of what each step type does."""

    def read(self, buf: str, off: int, cnt: int) -> Any:
        raise NotImplementedError

    def write(self, buf: str, off: int, cnt: int, value: Any) -> None:
        raise NotImplementedError

    def reduce(self, a: Any, b: Any) -> Any:
        raise NotImplementedError

    def same_memory(self, a: tuple[str, int, int], b: tuple[str, int, int]) -> bool:
        """Whether two windows (buffer, offset, count) are the same memory in this call (an
        in-place call aliases the input and the output). A copy between them writes what is there:
        the runtimes run it, and it races with nothing."""
        return False

    def step(self, st: Step, received: Any = None, first: int = 0, count: int | None = None) -> Any:
        """Runs chunks first..first+count-1 of `st` (default: all cnt of them) on `received` (for a
        receiving step: that many chunks from the peer). Returns what the step sends (None for a
        step that sends nothing)."""
        t = st.type
        m = st.cnt if count is None else count
        if t == NOP:
            return None
        src = (st.srcbuf, st.srcoff + first, m)
        dst = (st.dstbuf, st.dstoff + first, m)
        if t == "cpy":
            x = self.read(*src)
            if not self.same_memory(src, dst):  # an in-place call's self-copy moves nothing
                self.write(*dst, x)
            return None
        if t == "re":
            self.write(*dst, self.reduce(self.read(*dst), self.read(*src)))
            return None
        if t == "s":
            return self.read(*src)
        if t in ("r", "rcs"):
            self.write(*dst, received)
            return received if t == "rcs" else None
        if t in ("rrs", "rrc", "rrcs"):
            y = self.reduce(received, self.read(*src))  # the local operand is at src
            if t != "rrs":
                self.write(*dst, y)
            return y if t != "rrc" else None
        raise ValueError(f"step type {t!r} has no semantics (the verifier's step-type rule refuses it)")


# ---- order: dependencies and connections ---------------------------------------------------------

def publishes(st: Step) -> bool:
    """Whether finishing `st` publishes its index to the steps that depend on it."""
    return st.hasdep and st.type != NOP


def waits(st: Step) -> bool:
    """Whether `st` waits for another thread block (depid, deps) before it runs."""
    return st.depid >= 0


Connection = tuple[int, int, int]  # (sender rank, receiver rank, channel)


def thread_blocks(p: Program) -> Iterator[tuple[int, ThreadBlock]]:
    for g in p.gpus:
        for tb in g.tbs:
            yield g.rank, tb


def connections(p: Program) -> dict[Connection, tuple[ThreadBlock, ThreadBlock]]:
    """(sender rank, receiver rank, channel) -> (sender tb, receiver tb), where both ends are unique."""
    sends, recvs = defaultdict(list), defaultdict(list)
    for r, tb in thread_blocks(p):
        if tb.send >= 0:
            sends[(r, tb.send, tb.chan)].append(tb)
        if tb.recv >= 0:
            recvs[(tb.recv, r, tb.chan)].append(tb)
    return {k: (v[0], recvs[k][0]) for k, v in sends.items() if len(v) == 1 and len(recvs.get(k, ())) == 1}


@dataclass(frozen=True)
class Messages:
    """One connection's messages: the k-th of `sends` pairs with the k-th of `receives`, each a
    (step index, step) of its end's thread block."""
    key: Connection
    sender: ThreadBlock
    receiver: ThreadBlock
    sends: tuple[tuple[int, Step], ...]
    receives: tuple[tuple[int, Step], ...]


def messages(p: Program) -> list[Messages]:
    """Per connection (in key order), its send-type and receive-type steps."""
    return [Messages(key, stb, rtb,
                     tuple((i, st) for i, st in enumerate(stb.steps) if st.type in SENDS),
                     tuple((i, st) for i, st in enumerate(rtb.steps) if st.type in RECVS))
            for key, (stb, rtb) in sorted(connections(p).items())]


# ---- buffers of a call ---------------------------------------------------------------------------

def expected_chunks(p: Program) -> tuple[int, int] | None:
    """(i_chunks, o_chunks) that msccl-xml.md §4 prescribes for nchunksperloop N, None where it
    says nothing. custom (legacy only) has m = 1 for both buffers in legacy's check (§2.2)."""
    n, N = p.ngpus, p.nchunksperloop
    if p.collective == CUSTOM:
        return N, N
    cs = SPECS.get(p.collective)
    if cs is None or n < 1:
        return None
    size = cs.blocks("size", n)
    return N * cs.blocks("inp", n) // size, N * cs.blocks("out", n) // size


def io_chunks(p: Program) -> tuple[int, int]:
    """(input chunks, output chunks) of one rank's buffers: §4's, else the largest declared."""
    exp = expected_chunks(p)
    if exp is not None:
        return exp
    return max((g.i_chunks for g in p.gpus), default=0), max((g.o_chunks for g in p.gpus), default=0)


@dataclass(frozen=True)
class Layout:
    """One rank's buffers in a call: chunks of i, o and s, and in place the alias (view chunk k
    is base chunk alias.offset + k)."""
    chunks: dict[str, int]
    alias: Alias | None


def layout(p: Program, rank: int, inplace: bool) -> Layout:
    """Out of place the three buffers are separate, sized as declared. In place, with the
    collective's aliasing: the base has at least its §4 size, and so has the view (a view
    declared with 0 chunks, as msccl-tools writes it, still has its §4 size)."""
    g = p.gpus[rank]
    exp = expected_chunks(p)
    size = {b: max(g.chunks(b), 0) for b in "ios"}
    alias = inplace_alias(p.collective, g.rank, *exp) if inplace and exp else None
    if alias is not None:
        for b, want in zip("io", exp):
            size[b] = max(size[b], want)
    return Layout(size, alias)


def root_candidates(p: Program) -> list[int]:
    """Ranks in the order to try them as the root of a rooted program: for broadcast/scatter
    those that read their input, for reduce/gather those that write their output, then the rest."""
    reads_i, writes_o = [], []
    for g, tb, st in ((g, tb, st) for g in p.gpus for tb in g.tbs for st in tb.steps):
        if st.type in READS_SRC and st.srcbuf == "i" and g.rank not in reads_i:
            reads_i.append(g.rank)
        if st.type in WRITES_DST and st.dstbuf == "o" and g.rank not in writes_o:
            writes_o.append(g.rank)
    first = reads_i if SPECS[p.collective].root_sends() else writes_o
    if len(first) != 1:
        first = []  # no single rank stands out: try them in rank order
    return first + [r for r in range(p.ngpus) if r not in first]


def root_of(p: Program) -> int | None:
    """The root a rooted program is run with (the first candidate); None for the others."""
    cs = SPECS.get(p.collective)
    return root_candidates(p)[0] if cs is not None and cs.rooted else None
