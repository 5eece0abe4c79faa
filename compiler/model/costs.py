"""The runtime cost model: what an MSCCL runtime adds to alpha-beta (runtime-costs.md).

Per protocol: a fixed cost per call (`launch`), a cost per step and hop (`step`, by link kind), the
payload one thread block moves per second on a link (`tb_bandwidth`, by link kind: one thread
block cannot fill an NVSwitch port, which is why programs use several channels), the payload
share of the bytes on the wire (`efficiency`: LL carries 8 of 16 bytes), and the payload of one
chunk per loop iteration of the MSCCL kernel (`iteration_bytes`: a larger chunk is pipelined over
several iterations, and every step of a thread block runs once per iteration).

The numbers come from hw_profiles/runtimes.json (one entry per GPU generation, each constant
with its source), overridden by a profile's own `runtime` section. Units are SI inside.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from importlib import resources

from compiler.specs.errors import ProfileError

LINK_KINDS = ("nvlink", "xgmi", "pcie", "network")
PROTOCOL_NAMES = ("Simple", "LL", "LL128")
DEFAULT_GENERATION = {"nvidia": "ampere", "amd": "cdna2", "other": "generic"}
DEFAULT_GPU_LINK = {"nvidia": "nvlink", "amd": "xgmi", "other": "nvlink"}


MAX_COUNT = 71  # the most chunks one primitive call moves (the executor's clamp of maxAllowedCount)


@dataclass(frozen=True)
class ProtocolCost:
    launch: float  # seconds, once per call
    step: tuple[tuple[str, float], ...]  # (link kind, seconds per step and hop)
    tb_bandwidth: tuple[tuple[str, float], ...]  # (link kind, payload bytes/s of one thread block)
    efficiency: float  # payload / wire bytes
    iteration_bytes: int  # payload of one chunk per loop iteration

    def step_time(self, kind: str) -> float:
        return dict(self.step).get(kind, max(v for _, v in self.step))

    def tb_rate(self, kind: str) -> float:
        return dict(self.tb_bandwidth).get(kind, min(v for _, v in self.tb_bandwidth))

    def iterations(self, chunk_bytes: float) -> int:
        """Loop iterations of the MSCCL kernel for chunks of this size."""
        return max(1, math.ceil(chunk_bytes / self.iteration_bytes - 1e-9))

    def calls(self, cnt: int, chunk_bytes: float) -> int:
        """Primitive calls (each a step's synchronisation) a step of `cnt` chunks makes per loop
        iteration: the host lets one call move maxAllowedCount = clamp(iteration payload / chunk
        bytes, 1, MAX_COUNT) chunks, so where a chunk fills an iteration, every chunk of the step is
        a call of its own (msccl-xml.md section 5)."""
        per_call = min(MAX_COUNT, max(1, int(self.iteration_bytes // max(chunk_bytes, 1e-9))))
        return -(-cnt // per_call)


@dataclass(frozen=True)
class RuntimeCosts:
    generation: str
    protocols: tuple[tuple[str, ProtocolCost], ...]
    sources: tuple[tuple[str, str], ...] = field(default=(), compare=False)

    def protocol(self, name: str) -> ProtocolCost:
        found = dict(self.protocols).get(name)
        if found is None:
            raise ProfileError(f"runtime: protocol {name!r} has no costs (has: {', '.join(self.names)})")
        return found

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(n for n, _ in self.protocols)

    def to_dict(self) -> dict:
        return {"generation": self.generation, "sources": dict(self.sources), "protocols": {
            n: {"launch_us": p.launch * 1e6, "step_us": {k: v * 1e6 for k, v in p.step},
                "tb_GBps": {k: v / 1e9 for k, v in p.tb_bandwidth}, "efficiency": p.efficiency,
                "iteration_bytes": p.iteration_bytes} for n, p in self.protocols}}

    @classmethod
    def from_dict(cls, d: dict) -> "RuntimeCosts":
        return cls(d["generation"], tuple((n, _protocol(n, p, "runtime")) for n, p in d["protocols"].items()),
                   tuple(sorted(d.get("sources", {}).items())))


def _table() -> dict:
    return json.loads(resources.files("hw_profiles").joinpath("runtimes.json").read_text(encoding="utf-8"))


def _merge(base: dict, over: dict) -> dict:
    out = dict(base)
    for k, v in over.items():
        out[k] = _merge(base[k], v) if isinstance(v, dict) and isinstance(base.get(k), dict) else v
    return out


def generation_doc(name: str, origin: str) -> dict:
    """A generation's entry with what it inherits filled in."""
    gens = _table()["generations"]
    if name not in gens:
        raise ProfileError(f"{origin}: runtime.generation: {name!r} is not a GPU generation "
                           f"(known: {', '.join(gens)})")
    doc = gens[name]
    if "inherits" in doc:
        parent = generation_doc(doc["inherits"], origin)
        doc = _merge(parent, {k: v for k, v in doc.items() if k != "inherits"})
    return doc


def _protocol(name: str, p: dict, origin: str) -> ProtocolCost:
    try:
        return ProtocolCost(float(p["launch_us"]) * 1e-6,
                            tuple(sorted((k, float(v) * 1e-6) for k, v in p["step_us"].items())),
                            tuple(sorted((k, float(v) * 1e9) for k, v in p["tb_GBps"].items())),
                            float(p["efficiency"]), int(p["iteration_bytes"]))
    except (KeyError, TypeError, ValueError) as e:
        raise ProfileError(f"{origin}: runtime.protocols.{name}: {e} is missing or not a number") from None


def runtime_costs(profile: dict, origin: str) -> RuntimeCosts:
    """The costs of a profile: its generation's, with the profile's own values over them."""
    section = profile.get("runtime", {})
    generation = section.get("generation", DEFAULT_GENERATION[profile.get("vendor", "other")])
    doc = _merge(generation_doc(generation, origin), {k: v for k, v in section.items() if k != "generation"})
    protocols = tuple((n, _protocol(n, doc["protocols"][n], origin)) for n in PROTOCOL_NAMES
                      if n in doc["protocols"] and n in section.get("protocols_enabled", PROTOCOL_NAMES))
    return RuntimeCosts(generation, protocols, tuple(sorted(doc.get("sources", {}).items())))
