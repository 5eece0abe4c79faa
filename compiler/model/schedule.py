"""Schedules: what every planner returns and what the simulator and the lowering read.

A Transfer moves one chunk from one GPU to another along a path whose inner vertices are switches.
Epochs are the planner's clock; the simulator re-times transfers in continuous time and keeps only
their order. The order of `transfers` is the schedule order: links serve transfers in that order.

Reductions: a transfer with `reduce=True` carries the sender's partial sum (its own contribution
plus every reduce-transfer into it that comes earlier in the schedule) and the receiver adds it to
its own partial. A copy (`reduce=False`) of a reduction chunk replaces the receiver's value with
the sender's (allreduce's allgather phase). A reduce transfer with `own=True` carries the sender's
own contribution alone, read from its input, whatever it has received (one-shot allreduce: every
rank sends its input to every other rank, which adds them up; the schedule order cannot say that,
since each rank would have to send before any of the others' contributions reached it). A reduce
transfer with `swap=True` is one of a chunk's swap: ranks that send one another their partial sums
at once (the two GPUs of a rail in `swap`'s allreduce on two nodes), each carrying the sender's
value as it stood before the first swap transfer of that chunk into it, so each ends with the sum
of all. No other transfer of the chunk may come between its first and last swap transfer in the
schedule order (the lowering gives them one level, sends before receives).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace

from compiler.model.demand import Demand
from compiler.specs.errors import CompileError


@dataclass(frozen=True)
class Transfer:
    chunk: int  # Demand chunk id
    src: int  # sending rank
    dst: int  # receiving rank
    path: tuple[int, ...]  # vertex ids, src first, dst last
    start: int  # epoch the send starts
    arrive: int  # first epoch the chunk is usable at dst
    reduce: bool = False
    group: int = -1  # transfers with one group >= 0 share their common first links (switch multicast)
    own: bool = False  # a reduce transfer of the sender's own contribution only (module docstring)
    swap: bool = False  # a reduce transfer of the sender's value before the chunk's swap (module docstring)

    def to_list(self) -> list:
        out = [self.chunk, self.src, self.dst, list(self.path), self.start, self.arrive, int(self.reduce), self.group]
        if self.swap:
            return out + [int(self.own), 1]
        return out + [1] if self.own else out  # schedule files without own or swap transfers read as before

    @classmethod
    def from_list(cls, x: list) -> "Transfer":
        c, s, d, p, k, a, r, g, *flags = x
        return cls(int(c), int(s), int(d), tuple(int(v) for v in p), int(k), int(a), bool(r), int(g),
                   bool(flags and flags[0]), bool(len(flags) > 1 and flags[1]))


@dataclass(frozen=True)
class Schedule:
    demand: Demand
    topology: str  # Topology.name it was planned for
    transfers: tuple[Transfer, ...]
    tau: float  # seconds per epoch
    epochs: int  # horizon: every transfer arrives by this epoch
    planner: str  # "milp", "lp", "ring", "direct", ...
    status: str = "heuristic"  # "optimal", "time_limit", "gap_limit", "feasible", "heuristic"
    gap: float | None = None  # relative MIP gap when a solver stopped early
    solve_time: float = 0.0  # seconds of planning, model building included
    lp_value: float | None = None  # the LP relaxation's finish time (s), where an LP was solved
    notes: tuple[str, ...] = field(default=(), compare=False)

    @property
    def ngpus(self) -> int:
        return self.demand.ngpus

    def sorted(self) -> "Schedule":
        """Transfers in epoch order, ties kept in their current order."""
        return replace(self, transfers=tuple(sorted(self.transfers, key=lambda t: (t.start, t.arrive))))

    def with_notes(self, *notes: str) -> "Schedule":
        return replace(self, notes=self.notes + tuple(notes))

    def to_dict(self) -> dict:
        return {
            "format": "msccl-compile/schedule-v1",
            "topology": self.topology, "planner": self.planner, "status": self.status, "gap": self.gap,
            "solve_time_s": self.solve_time, "lp_value_s": self.lp_value, "tau_s": self.tau, "epochs": self.epochs,
            "notes": list(self.notes), "demand": self.demand.to_dict(),
            "transfers": [t.to_list() for t in self.transfers],
        }

    @classmethod
    def from_dict(cls, d: dict) -> "Schedule":
        return cls(
            demand=Demand.from_dict(d["demand"]), topology=d["topology"],
            transfers=tuple(Transfer.from_list(x) for x in d["transfers"]), tau=float(d["tau_s"]),
            epochs=int(d["epochs"]), planner=d["planner"], status=d["status"], gap=d["gap"],
            solve_time=float(d["solve_time_s"]), lp_value=d["lp_value_s"], notes=tuple(d["notes"]),
        )

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> "Schedule":
        return cls.from_dict(json.loads(text))

    def save(self, path: str) -> None:
        from compiler.fileio import atomic_write
        atomic_write(path, self.to_json() + "\n")

    @classmethod
    def load(cls, path: str) -> "Schedule":
        from compiler.fileio import read_input
        from compiler.specs.jsoncheck import schema_violation
        from compiler.specs.jsonkeys import loads
        try:
            d = loads(read_input(path, "schedule file").decode("utf-8"))
            if not isinstance(d, dict) or d.get("format") != "msccl-compile/schedule-v1":
                got = d.get("format") if isinstance(d, dict) else None
                raise CompileError(f"{path}: format: {got!r} is not msccl-compile/schedule-v1")
            why = schema_violation(d, SCHEDULE_SCHEMA, ENTRIES) or _bad_entry(d)
            if why is not None:
                raise CompileError(f"{path}: {why}")
            return cls.from_dict(d)
        except FileNotFoundError:
            raise CompileError(f"{path}: no such schedule file") from None
        except (json.JSONDecodeError, KeyError, TypeError, ValueError) as e:
            raise CompileError(f"{path}: not a valid schedule: {type(e).__name__}: {e}") from None


def _whole(*xs) -> bool:
    return all(type(x) is int and x >= 0 for x in xs)


def _bad_entry(d: dict) -> str | None:
    """What is wrong with the first transfer or demand chunk that is not whole numbers in their
    places (checked here, not in SCHEDULE_SCHEMA: a 512-GPU schedule has 260,000 transfers, which
    jsonschema takes most of a minute over), else None."""
    for i, x in enumerate(d["transfers"]):
        ok = isinstance(x, list) and 8 <= len(x) <= 10 and isinstance(x[3], list) and len(x[3]) >= 2 \
            and _whole(*x[:3], *x[3], x[4], x[5]) and x[4] <= x[5] and type(x[7]) is int and x[7] >= -1 \
            and all(type(f) is int and f in (0, 1) for f in (x[6], *x[8:]))
        if not ok:
            return (f"transfers[{i}]: {x!r} is not [chunk, src, dst, [path], start, arrive, reduce 0|1, group >= -1"
                    " (, own 0|1, swap 0|1)] of whole numbers with start <= arrive")
    for i, c in enumerate(d["demand"]["chunks"]):
        ok = isinstance(c, list) and len(c) == 6 and all(isinstance(v, list) for v in c[1:5]) \
            and _whole(c[0], *c[1], *c[2], *c[3], *c[4], c[5])
        if not ok:
            return f"demand.chunks[{i}]: {c!r} is not [id, [sources], [dests], [src index], [dst index], job] of whole numbers"
    return None


ENTRIES = frozenset({("transfers",), ("demand", "chunks")})  # what _bad_entry checks: whole numbers only
_WHOLE = {"type": "integer", "minimum": 0}
SCHEDULE_SCHEMA = {  # what Schedule.to_dict writes (transfers and demand chunks: _bad_entry)
    "type": "object",
    "required": ["demand", "epochs", "format", "gap", "lp_value_s", "notes", "planner", "solve_time_s", "status",
                 "tau_s", "topology", "transfers"],
    "properties": {
        "tau_s": {"type": "number", "exclusiveMinimum": 0}, "epochs": _WHOLE,
        "gap": {"type": ["number", "null"]}, "lp_value_s": {"type": ["number", "null"]},
        "solve_time_s": {"type": "number", "minimum": 0}, "notes": {"type": "array", "items": {"type": "string"}},
        "planner": {"type": "string"}, "status": {"type": "string"}, "topology": {"type": "string"},
        "transfers": {"type": "array"},
        "demand": {
            "type": "object",
            "required": ["chunk_bytes", "chunks", "chunks_per_rank", "collective", "input_chunks", "ngpus",
                         "output_chunks", "reduce", "root", "size_bytes"],
            "properties": {
                "collective": {"type": "string"}, "ngpus": {"type": "integer", "minimum": 2},
                "chunk_bytes": {"type": "number", "exclusiveMinimum": 0}, "size_bytes": {"type": "integer", "minimum": 1},
                "chunks_per_rank": {"type": "integer", "minimum": 1}, "reduce": {"type": "boolean"},
                "root": {"type": ["integer", "null"], "minimum": 0}, "input_chunks": _WHOLE, "output_chunks": _WHOLE,
                "chunks": {"type": "array", "minItems": 1},
            },
        },
    },
}


def swap_groups(transfers: tuple[Transfer, ...]) -> tuple[dict[int, list[int]], int | None]:
    """Each chunk's swap transfers (their indices, in schedule order), and the index of the first
    transfer that breaks the rule of the module docstring (a swap transfer that is no reduce transfer
    or also an `own` one, or one of a chunk whose swap another transfer of the chunk has interrupted;
    None where none does). Empty, at the cost of one pass, where no transfer swaps."""
    groups: dict[int, list[int]] = {}
    if not any(t.swap for t in transfers):
        return groups, None
    closed: set[int] = set()
    for i, t in enumerate(transfers):
        if t.swap:
            if not t.reduce or t.own or t.chunk in closed:
                return groups, i
            groups.setdefault(t.chunk, []).append(i)
        elif t.chunk in groups:
            closed.add(t.chunk)
    return groups, None
