"""The cost of moving data, shared by the schedule simulator and the program timer (one model,
two inputs): the planned time is the time of the ideal program, the program time is what the
lowering achieved.

Without a protocol (`Costing()`), a transfer is alpha-beta: it holds its path's links for
bytes / bandwidth and arrives alpha later. With an MSCCL protocol, the runtime cost model of
model/costs.py adds to it:
- the wire carries `efficiency` of its bytes as payload (LL: half), so a transfer holds its links
  for bytes / (bandwidth x efficiency);
- a chunk larger than one kernel iteration's piece is moved in `iterations` pieces, and every
  piece costs a step's synchronisation (`step`, per link kind): the program timer charges the
  sending thread block a step before each piece it sends; the ideal program spreads a transfer
  over as many thread blocks as fill its path (`lanes`), so it pays alpha plus a step for each
  of ceil(iterations / lanes) pieces in a row;
- a call costs `launch` once;
- one thread block moves at most `tb_rate` bytes per second on a link of a kind: the program timer
  gives a link as many thread-block lanes as fit its bandwidth, the ideal program none of that
  limit (it has every channel it needs).
"""

from __future__ import annotations

from dataclasses import dataclass

from compiler.model.costs import ProtocolCost
from compiler.model.topology import Topology

NETWORK = "network"


@dataclass(frozen=True)
class Costing:
    proto: str | None = None  # None: alpha-beta alone
    cost: ProtocolCost | None = None

    @classmethod
    def of(cls, topo: Topology, proto: str | None) -> "Costing":
        if proto is None or topo.costs is None:
            return cls()
        return cls(proto, topo.costs.protocol(proto))

    @property
    def launch(self) -> float:
        return self.cost.launch if self.cost else 0.0

    @property
    def efficiency(self) -> float:
        return self.cost.efficiency if self.cost else 1.0

    def iterations(self, chunk_bytes: float) -> int:
        return self.cost.iterations(chunk_bytes) if self.cost else 1

    def calls(self, cnt: int, chunk_bytes: float) -> int:
        """Step synchronisations a step of `cnt` chunks pays per iteration (ProtocolCost.calls; 1 without costs)."""
        return self.cost.calls(cnt, chunk_bytes) if self.cost else 1

    def step(self, kind: str) -> float:
        return self.cost.step_time(kind) if self.cost else 0.0

    def tb_rate(self, kind: str) -> float:
        """Payload bytes/s of one thread block on a link of this kind (unbounded without costs)."""
        return self.cost.tb_rate(kind) if self.cost else float("inf")

    def local_rate(self, topo: Topology) -> float:
        """Bytes/s one thread block copies or reduces in its GPU's own memory (a cpy or re step):
        the fastest rate any protocol gives a block on the GPU's links inside the node (unbounded
        without costs). Local steps run on plain memory whatever the program's protocol, and one
        NVIDIA H200 block measured 48.6 GB/s copying and 30-39 GB/s summing against Hopper's
        Simple cap of 38.7 (runtimes.json, hopper), so a block's Simple rate stands for it."""
        if self.cost is None or topo.costs is None:
            return float("inf")
        kinds = {l.kind for l in topo.links if l.kind and l.kind != NETWORK} or {"nvlink"}
        return max(p.tb_rate(k) for _, p in topo.costs.protocols for k in kinds)

    def lanes(self, bandwidth: float, kind: str) -> int:
        """Thread blocks one parallel link carries at once at their full rate (at least one)."""
        return max(1, int(bandwidth * self.efficiency / self.tb_rate(kind) + 1e-9))


def protocol_names(topo: Topology) -> tuple[str | None, ...]:
    """The protocols a program on `topo` may use (None: alpha-beta, for a profile without costs)."""
    return topo.costs.names if topo.costs is not None else (None,)


def path_kind(topo: Topology, link_ids) -> str:
    """The kind whose costs a transfer pays: the network where it crosses one, else its first link's."""
    kinds = [topo.links[l].kind for l in link_ids]
    return NETWORK if NETWORK in kinds else (kinds[0] or "nvlink")


def ideal_transfer(costing: Costing, nbytes: float, bandwidth: float, alpha: float, kind: str,
                   chunk_bytes: float) -> tuple[float, float]:
    """(time the path's links are held, latency after that) of one transfer in the ideal program."""
    pieces = -(-costing.iterations(chunk_bytes) // costing.lanes(bandwidth, kind))
    return nbytes / (bandwidth * costing.efficiency), alpha + pieces * costing.step(kind)


def runtime_floor(topo: Topology, latency_s: float, bandwidth_s: float, alpha_s: float,
                  chain_s=None, across: tuple[float, float] = (0.0, 0.0), proto: str | None = None) -> float | None:
    """The least time any program can take under the runtime cost model, from an alpha-beta bound's
    parts: the best protocol's launch, its payload efficiency on the bandwidth term, and at least one
    step's synchronisation (every transfer pays one); chain_s(proto), where given, is the latency
    bound with every transfer of a chain paying its step (bounds.Bound.chain_s). across: (seconds,
    alpha) of the node cuts, whose last byte is carried by a transfer between nodes: it pays the
    network's step and at least that alpha after its bytes (bounds.across_nodes). proto: the least
    time of that protocol's programs instead. None without runtime costs."""
    if topo.costs is None:
        return None
    best = None
    for name in topo.costs.names if proto is None else (proto,):
        c = Costing.of(topo, name)
        step = min(v for _, v in c.cost.step)
        latency = latency_s + step if chain_s is None else max(latency_s + step, chain_s(name))
        bandwidth = bandwidth_s / c.efficiency + alpha_s + step
        if across[0] > 0:
            bandwidth = max(bandwidth, across[0] / c.efficiency + across[1] + c.step(NETWORK))
        t = c.launch + max(latency, bandwidth)
        best = t if best is None else min(best, t)
    return best
