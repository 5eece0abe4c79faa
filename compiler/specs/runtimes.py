"""What an MSCCL runtime accepts: one entry per runtime dialect, and the only place that knows them
by name (msccl-xml.md §2, §11, §12).

A `RuntimeSpec` holds the runtime's limits, the collectives its `coll` attribute accepts and how it
spells them, the `<algo>` attributes it requires, how many files it loads and the environment that
makes it load them. The limits every dialect shares (channels, cnt, offsets, XML nodes) are module
constants. `target_runtimes` is the one rule for which runtimes a file of a collective is written
and verified for; lowering, the XML writer, the verifier, `env`, `library` and `bench` read it.

Adding a dialect touches this module (and its tests), nothing else.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

from compiler.specs.collectives import CUSTOM, SPECS
from compiler.specs.errors import CompileError

ALL = "all"  # every runtime that has the collective, within the strictest of their limits

# limits of every MSCCL dialect (msccl-xml.md §2, §11, §16)
MAX_CHANNELS = 32
MAX_TBS_PER_CHANNEL = 32  # thread blocks with a send (and with a recv) peer on one channel
MAX_CNT = 71
MAX_DEPID = 127  # stored as int8
MAX_NODES = 4095  # 1 + ngpus + thread blocks + steps, per rank
MAX_OFFSET = 32767  # offsets are int16


@dataclass(frozen=True)
class RuntimeSpec:
    name: str  # as users select it: --runtime NAME
    title: str  # the project it is
    max_steps: int  # steps per thread block, nops included
    max_tbs: int  # thread blocks per rank must stay below this
    colls: dict[str, str]  # collective -> its `coll` attribute in this dialect
    other_colls: tuple[str, ...] = ()  # `coll` values it parses that we never write
    required: tuple[str, ...] = ()  # <algo> attributes it requires
    max_algorithms: int | None = None  # files it loads at most
    loads_directory: bool = True  # parses every regular file in MSCCL_ALGO_DIR (else a list of files)
    environment: Callable[[str, list[str]], dict[str, str]] = field(default=lambda d, files: {}, compare=False)
    off: dict[str, str] = field(default_factory=dict)  # variables that switch it off (bench's default side)
    max_bytes_inclusive: bool = True  # selects a file for sizes up to maxBytes inclusive (else below it)
    vendors: tuple[str, ...] = ("nvidia", "amd")  # GPU vendors whose GPUs it runs on

    def accepts(self, collective: str) -> bool:
        return collective in self.colls

    def parses(self, attribute: str) -> bool:
        """Whether its reader takes `coll` = attribute (ours or one we never write)."""
        return attribute in self.colls.values() or attribute in self.other_colls

    @property
    def allowed_tbs(self) -> int:
        return self.max_tbs - 1


_STANDARD = {"allreduce": "allreduce", "allgather": "allgather", "reduce": "reduce", "broadcast": "broadcast",
             "alltoall": "alltoall", "reduce_scatter": "reducescatter"}
_ALGO_ATTRS = ("proto", "nchannels", "nchunksperloop", "ngpus", "coll", "inplace", "outofplace", "minBytes",
               "maxBytes")

RUNTIMES: dict[str, RuntimeSpec] = {r.name: r for r in (
    RuntimeSpec("old", "microsoft/msccl (old)", 256, 216,
                {**_STANDARD, "reduce_scatter": "reduce_scatter", CUSTOM: CUSTOM},
                required=("name", "proto", "nchannels", "nchunksperloop", "ngpus", "coll", "inplace"),
                max_algorithms=4, loads_directory=False, max_bytes_inclusive=False,
                environment=lambda d, files: {"MSCCL_XML_FILES": ":".join(files), "NCCL_ALGO": "MSCCL,RING,TREE"},
                vendors=("nvidia",)),
    RuntimeSpec("executor", "msccl-executor-nccl", 64, 1024, {**_STANDARD, "gather": "gather", "scatter": "scatter"},
                other_colls=("send", "recv", "alltoallv"), required=_ALGO_ATTRS,
                environment=lambda d, files: {"MSCCL_ALGO_DIR": d, "MSCCL_ENABLE": "1"},
                off={"MSCCL_ENABLE": "0"}, vendors=("nvidia",)),
    RuntimeSpec("rccl", "RCCL", 64, 64, {**_STANDARD, "gather": "gather", "scatter": "scatter"},
                other_colls=("send", "recv", "alltoallv"), required=_ALGO_ATTRS,
                environment=lambda d, files: {"RCCL_MSCCL_ENABLE": "1", "RCCL_MSCCL_FORCE_ENABLE": "1",
                                              "MSCCL_ALGO_DIR": d},
                off={"RCCL_MSCCL_ENABLE": "0"}, vendors=("amd",)),
)}
NAMES = tuple(RUNTIMES)
DEFAULT = "executor"  # where one runtime must be chosen (library, env, bench): the maintained one
CHOICES = (ALL,) + NAMES  # what --runtime takes where a file may target several
OTHER_COLLS = tuple(sorted({c for r in RUNTIMES.values() for c in r.other_colls}))
ENV_VARS = tuple(sorted({k for r in RUNTIMES.values() for k in (*r.environment(".", []), *r.off)}))


def runtime(name: str) -> RuntimeSpec:
    if name not in RUNTIMES:
        raise CompileError(f"runtime: {name!r} is not a runtime (known: {', '.join(CHOICES)})")
    return RUNTIMES[name]


def target_runtimes(collective: str, requested: str = ALL, vendor: str | None = None) -> tuple[str, ...]:
    """The runtimes a program of `collective` is written and verified for: with "all", every
    runtime whose `coll` attribute accepts the collective and that runs on the hardware's GPUs
    (`vendor`: nvidia, amd; None or other: any vendor, as for a file read without its hardware);
    otherwise the one requested, refused when it has no such collective. The one rule that
    compile, verify and library apply. Why by vendor: RCCL (63 thread blocks) cannot run on a DGX
    and NCCL's MSCCL builds cannot run on an MI250, so neither's limits bind the other's files."""
    if requested == ALL:
        takers = tuple(r for r in NAMES if RUNTIMES[r].accepts(collective)) or NAMES
        native = tuple(r for r in takers if vendor in RUNTIMES[r].vendors)
        return native or takers
    spec = runtime(requested)
    if not spec.accepts(collective):
        takers = [r for r in NAMES if RUNTIMES[r].accepts(collective)]
        raise CompileError(f"runtime: {requested} ({spec.title}) has no coll={collective}"
                           + (f"; use {' or '.join(takers)}" if takers else ""))
    return (requested,)


def judged_runtimes(collective: str, requested: str = ALL, declared: tuple[str, ...] = ()) -> tuple[str, ...]:
    """The runtimes a program is judged for: the one asked for (whose coll rule then reports a
    collective it lacks), or with "all" those the file declares it targets (its runtimes comment),
    else those the collective targets on any vendor."""
    if requested != ALL:
        return (runtime(requested).name,)
    return declared or target_runtimes(collective)


def narrower(collective: str, runtimes: tuple[str, ...]) -> bool:
    """Whether `runtimes` leave out some runtime that has the collective (a file must then say
    which it targets, or a reader would judge it for all of them)."""
    return bool(runtimes) and set(runtimes) != set(target_runtimes(collective))


@dataclass(frozen=True)
class Limits:
    """The strictest limits over some runtimes (one runtime: its own)."""
    runtimes: tuple[str, ...]
    max_steps: int
    max_tbs: int  # thread blocks per rank must stay below this
    colls: frozenset[str]  # collectives all of them accept
    tb_reason: str  # the runtime that sets max_tbs, in words

    @property
    def label(self) -> str:
        return "/".join(self.runtimes)

    def blocks(self, sms: int = 0) -> int:
        """Thread blocks a rank may have: below max_tbs and, where sms > 0, below the SM count (all
        blocks must be co-resident)."""
        return min(self.max_tbs, sms) - 1 if sms > 0 else self.max_tbs - 1

    def blocks_reason(self, sms: int = 0) -> str:
        """What sets blocks(sms), in words: the GPU's SMs where they are fewer than the runtimes allow,
        else the runtime."""
        return self.tb_reason if self.blocks(sms) == self.blocks() else \
            f"the GPU has {sms} SMs and all thread blocks must be co-resident"


def limits(runtimes: tuple[str, ...]) -> Limits:
    specs = [runtime(r) for r in runtimes]
    tightest = min(specs, key=lambda s: (s.max_tbs, s.name))
    return Limits(tuple(s.name for s in specs), min(s.max_steps for s in specs), tightest.max_tbs,
                  frozenset.intersection(*(frozenset(s.colls) for s in specs)),
                  f"{tightest.name} allows {tightest.allowed_tbs}")


def limits_for(requested: str, collective: str | None = None, vendor: str | None = None,
               declared: tuple[str, ...] = ()) -> Limits:
    """A runtime's limits; "all": the strictest over the runtimes a file declares (`declared`), else
    those `collective` targets on `vendor`'s GPUs (over every runtime when no collective is given)."""
    if requested == ALL:
        if declared:
            return limits(declared)
        return limits(target_runtimes(collective, ALL, vendor) if collective else NAMES)
    return limits((runtime(requested).name,))


def coll_attribute(collective: str, name: str) -> str:
    """How runtime `name` spells `collective` in the `coll` attribute ("all": executor's spelling,
    which RCCL shares; the old runtime gets a file of its own)."""
    spec = RUNTIMES["executor" if name == ALL else runtime(name).name]
    if collective in spec.colls:
        return spec.colls[collective]
    for other in RUNTIMES.values():
        if collective in other.colls:
            return other.colls[collective]
    if collective in OTHER_COLLS:
        return collective
    raise CompileError(f"program: collective {collective!r} has no MSCCL name "
                       f"(known: {', '.join(sorted({c for r in RUNTIMES.values() for c in r.colls}))})")


def collective_of(attribute: str) -> str | None:
    """The collective a `coll` attribute names in any dialect (kept verbatim for those we never
    write, such as send); None: no dialect has it."""
    for spec in RUNTIMES.values():
        for coll, spelled in spec.colls.items():
            if spelled == attribute:
                return coll
    return attribute if attribute in OTHER_COLLS else None


def coll_attributes() -> tuple[str, ...]:
    """Every `coll` value some dialect parses."""
    return tuple(sorted({v for r in RUNTIMES.values() for v in r.colls.values()} | set(OTHER_COLLS)))


def spelled_apart(collective: str) -> bool:
    """Whether the dialects that have `collective` spell its `coll` attribute differently."""
    return len({r.colls[collective] for r in RUNTIMES.values() if collective in r.colls}) > 1


def twin_runtime(collective: str, requested: str, targets: tuple[str, ...]) -> str | None:
    """The runtime among `targets` that needs a file of its own where "all" writes one for several:
    the old one spells reduce-scatter apart (reduce_scatter, not reducescatter). None: one file
    serves all."""
    if requested != ALL:
        return None
    for name in targets:
        if len(targets) > 1 and RUNTIMES[name].colls[collective] != coll_attribute(collective, ALL):
            return name
    return None


assert set(_STANDARD) <= set(SPECS)
