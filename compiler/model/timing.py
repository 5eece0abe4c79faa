"""Time expansion: epochs, per-link occupancy and delay, and the horizon.

The epoch tau is the time one chunk takes on the fastest link, raised where alpha would otherwise
span too many epochs (tiny chunks: the problem is then about latency, not bandwidth). A link whose
bandwidth is below the fastest carries a chunk over several epochs (its window); a link with count
c carries up to c chunks at once. Switches are cut-through: a GPU-to-GPU transfer occupies every
link of its path in the same epochs and is usable at the destination `arrival` epochs after it
starts, where arrival = the path's window + its alpha in whole epochs (alpha charged once).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from compiler.model.demand import Demand
from compiler.model.nodesym import node_symmetry
from compiler.model.topology import Topology

ALPHA_THRESHOLD = 0.1  # alpha below this fraction of an epoch costs no epoch (TE-CCL's theta)
MAX_ALPHA_EPOCHS = 6  # tau grows until the cheapest transfer's alpha spans at most this many epochs
EPS = 1e-9


def epochs_for(seconds: float, tau: float) -> int:
    """Whole epochs that cover `seconds`."""
    return max(0, math.ceil(seconds / tau - EPS))


def delay_epochs(alpha: float, tau: float) -> int:
    return 0 if alpha <= ALPHA_THRESHOLD * tau else epochs_for(alpha, tau)


@dataclass(frozen=True)
class TimeExpansion:
    tau: float
    chunk_bytes: float
    window: tuple[int, ...]  # per link: epochs one chunk occupies it
    capacity: tuple[int, ...]  # per link: chunks it carries at once (over its window)
    arrival: tuple[int, ...]  # per link into a GPU: epochs from start to usable there; 0 into a switch
    horizon: int
    horizon_reason: str = ""

    def to_dict(self) -> dict:
        return {"tau_s": self.tau, "chunk_bytes": self.chunk_bytes, "window": list(self.window),
                "capacity": list(self.capacity), "arrival": list(self.arrival), "horizon": self.horizon,
                "horizon_reason": self.horizon_reason}

    @classmethod
    def from_dict(cls, d: dict) -> "TimeExpansion":
        return cls(float(d["tau_s"]), float(d["chunk_bytes"]), tuple(d["window"]), tuple(d["capacity"]),
                   tuple(d["arrival"]), int(d["horizon"]), d.get("horizon_reason", ""))

    def with_horizon(self, horizon: int, reason: str) -> "TimeExpansion":
        return replace(self, horizon=int(horizon), horizon_reason=reason)

    def path_arrival(self, topo: Topology, path: tuple[int, ...]) -> int:
        """Epochs from start to usable at the end of `path` (the last link's arrival)."""
        return self.arrival[topo.link_id(path[-2], path[-1])]

    def path_window(self, topo: Topology, path: tuple[int, ...]) -> int:
        return max(self.window[i] for i in topo.path_links(path))


def _senders(topo: Topology) -> range:
    """The GPUs whose paths stand for all: node 0's where the nodes are symmetric (model/nodesym.py)."""
    return range(topo.gpus_per_node) if node_symmetry(topo) is not None else range(topo.ngpus)


def choose_tau(topo: Topology, chunk_bytes: float) -> float:
    tau = chunk_bytes / topo.fastest_bandwidth
    alphas = [topo.path_alpha(p) for s in _senders(topo) for d in topo.neighbours(s) for p in topo.paths(s, d)[:1]]
    positive = [a for a in alphas if a > 0]
    if positive and min(positive) / tau > MAX_ALPHA_EPOCHS:
        tau = min(positive) / MAX_ALPHA_EPOCHS
    return tau


def expand(topo: Topology, demand: Demand, tau: float | None = None, horizon: int = 0,
           reason: str = "") -> TimeExpansion:
    chunk = demand.chunk_bytes
    tau = choose_tau(topo, chunk) if tau is None else tau
    window, capacity = [], []
    for l in topo.links:
        w = max(1, math.ceil(chunk / (l.bandwidth * tau) - EPS))
        window.append(w)
        capacity.append(max(1, math.floor(l.count * w * l.bandwidth * tau / chunk + EPS)))
    arrival = [0] * len(topo.links)
    sym = node_symmetry(topo)
    for s in range(topo.ngpus):
        for d in topo.neighbours(s):
            if sym is not None and d >= sym.per:
                continue  # the links into node 0's GPUs stand for every node's
            for p in topo.paths(s, d):
                ids = topo.path_links(p)
                a = max(window[i] for i in ids) + delay_epochs(topo.path_alpha(p), tau)
                arrival[ids[-1]] = max(arrival[ids[-1]], a)
    if sym is not None:
        arrival = [arrival[t] for t in sym.twin]
    return TimeExpansion(tau, chunk, tuple(window), tuple(capacity), tuple(arrival), horizon, reason)
