"""The MSCCL program IR: per rank, thread blocks with ordered steps. One-to-one with the XML.

Nops are explicit steps (as in the XML), step indices are positions, and every field the XML
carries is here, so writing and reading back gives the same value. What a step does is written
once, in compiler/program/semantics.py, whose users (the verifier, the torch executor) interpret
this IR; the step tables below are its vocabulary. The lowering produces it; backends/msccl_xml.py
turns it into text and back.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from compiler.model.demand import Demand

STEP_TYPES = ("s", "r", "rcs", "rrs", "rrc", "rrcs", "cpy", "re", "nop")
SENDS = frozenset({"s", "rcs", "rrs", "rrcs"})  # use the tb's send peer
RECVS = frozenset({"r", "rcs", "rrs", "rrc", "rrcs"})  # use the tb's recv peer
REDUCES = frozenset({"rrs", "rrc", "rrcs", "re"})
READS_SRC = frozenset({"s", "rrs", "rrc", "rrcs", "cpy", "re"})  # read local data at srcbuf/srcoff
WRITES_DST = frozenset({"r", "rcs", "rrc", "rrcs", "cpy", "re"})  # write local data at dstbuf/dstoff
BUFFERS = ("i", "o", "s")
PROTOCOLS = ("Simple", "LL", "LL128")
AUTO = "auto"  # a protocol or instance count left to the compiler: the fastest program under the cost model
SLOTS = {"Simple": 2, "LL": 8, "LL128": 8}  # transfers outstanding per connection (msccl-xml.md §7.5)

@dataclass(frozen=True)
class Step:
    type: str
    srcbuf: str = "o"
    srcoff: int = -1
    dstbuf: str = "o"
    dstoff: int = -1
    cnt: int = 1
    depid: int = -1
    deps: int = -1
    hasdep: bool = False

    def to_list(self) -> list:
        return [self.type, self.srcbuf, self.srcoff, self.dstbuf, self.dstoff, self.cnt, self.depid, self.deps,
                int(self.hasdep)]

    @classmethod
    def from_list(cls, x: list) -> "Step":
        t, sb, so, db, do, c, di, ds, h = x
        return cls(t, sb, int(so), db, int(do), int(c), int(di), int(ds), bool(h))


@dataclass(frozen=True)
class ThreadBlock:
    id: int
    send: int = -1  # peer rank this tb sends to, -1 for none
    recv: int = -1  # peer rank this tb receives from, -1 for none
    chan: int = 0
    steps: tuple[Step, ...] = ()


@dataclass(frozen=True)
class GpuProgram:
    rank: int
    i_chunks: int
    o_chunks: int
    s_chunks: int
    tbs: tuple[ThreadBlock, ...] = ()

    def chunks(self, buf: str) -> int:
        return {"i": self.i_chunks, "o": self.o_chunks, "s": self.s_chunks}[buf]


@dataclass(frozen=True)
class Program:
    name: str
    collective: str  # canonical name (compiler.specs.collectives) or custom
    ngpus: int
    nchunksperloop: int
    nchannels: int
    gpus: tuple[GpuProgram, ...]
    proto: str = "Simple"
    inplace: bool = False
    outofplace: bool = True
    min_bytes: int = 0
    max_bytes: int = 0  # 0: no upper limit where the runtime allows it; the writer makes it finite
    demand: Demand | None = None  # a custom collective's postcondition, in units of this program's chunks
    runtimes: tuple[str, ...] = ()  # the runtimes whose limits it keeps; (): unknown (every one with its coll)
    notes: tuple[str, ...] = field(default=(), compare=False)
    # what a file read from XML has that the runtimes' hand-written reader rejects or misreads (msccl-xml.md §1)
    syntax: tuple[str, ...] = field(default=(), compare=False)
    # the `coll` attribute as a file spelled it (reduce_scatter or reducescatter: each runtime takes one);
    # None for a program not read from XML
    coll_attribute: str | None = field(default=None, compare=False)
    # the largest `s` attribute a file gives a step where it is not the step's position (the parsers
    # range-check it: s < MAX_STEPS); -1 where all are positions or the program was not read from XML
    max_step_attribute: int = field(default=-1, compare=False)
    # what only the old runtime's parser makes of the file's attributes as written: an explicit
    # maxBytes="0" (never selected there, no limit elsewhere), an nthreads not a multiple of 32
    old_runtime_attributes: tuple[str, ...] = field(default=(), compare=False)

    @property
    def nthreadblocks_max(self) -> int:
        return max((len(g.tbs) for g in self.gpus), default=0)

    @property
    def nsteps_max(self) -> int:
        return max((len(tb.steps) for g in self.gpus for tb in g.tbs), default=0)

    @property
    def nsteps_total(self) -> int:
        return sum(len(tb.steps) for g in self.gpus for tb in g.tbs)

    def to_dict(self) -> dict:
        return {
            "format": "msccl-compile/program-v1",
            "name": self.name, "collective": self.collective, "ngpus": self.ngpus,
            "nchunksperloop": self.nchunksperloop, "nchannels": self.nchannels, "proto": self.proto,
            "inplace": self.inplace, "outofplace": self.outofplace,
            "min_bytes": self.min_bytes, "max_bytes": self.max_bytes,
            "demand": self.demand.to_dict() if self.demand is not None else None,
            "runtimes": list(self.runtimes),
            "notes": list(self.notes),
            "gpus": [
                {"rank": g.rank, "i_chunks": g.i_chunks, "o_chunks": g.o_chunks, "s_chunks": g.s_chunks,
                 "tbs": [{"id": tb.id, "send": tb.send, "recv": tb.recv, "chan": tb.chan,
                          "steps": [s.to_list() for s in tb.steps]} for tb in g.tbs]}
                for g in self.gpus
            ],
        }

    @classmethod
    def from_dict(cls, d: dict) -> "Program":
        return cls(
            name=d["name"], collective=d["collective"], ngpus=int(d["ngpus"]),
            nchunksperloop=int(d["nchunksperloop"]), nchannels=int(d["nchannels"]), proto=d["proto"],
            inplace=bool(d["inplace"]), outofplace=bool(d["outofplace"]),
            min_bytes=int(d["min_bytes"]), max_bytes=int(d["max_bytes"]),
            demand=Demand.from_dict(d["demand"]) if d.get("demand") is not None else None,
            runtimes=tuple(d.get("runtimes", ())),
            notes=tuple(d.get("notes", ())),
            gpus=tuple(
                GpuProgram(int(g["rank"]), int(g["i_chunks"]), int(g["o_chunks"]), int(g["s_chunks"]),
                           tuple(ThreadBlock(int(t["id"]), int(t["send"]), int(t["recv"]), int(t["chan"]),
                                             tuple(Step.from_list(s) for s in t["steps"])) for t in g["tbs"]))
                for g in d["gpus"]
            ),
        )

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> "Program":
        return cls.from_dict(json.loads(text))
