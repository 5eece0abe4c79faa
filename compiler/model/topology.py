"""The network as the planners see it: GPUs, buffer-less switches and directed links, in SI units.

Vertices 0..ngpus-1 are the GPUs (vertex id = rank); switches follow. A switch is anything that
forwards without storing: an NVSwitch, the transmit or receive side of a NIC, a network switch.
A GPU-to-GPU transfer follows a path whose inner vertices are all switches (cut-through).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from functools import cached_property

from compiler.model.costs import RuntimeCosts

SWITCH_KINDS = ("switch", "nic", "network")


@dataclass(frozen=True)
class Switch:
    name: str
    multicast: bool = False
    kind: str = "switch"  # "switch" (NVSwitch-like), "nic" (one direction of a NIC), "network"
    node: int = -1  # the node it belongs to; -1 for the network switch


@dataclass(frozen=True)
class Link:
    src: int
    dst: int
    bandwidth: float  # bytes/s of one parallel link, one direction
    alpha: float  # seconds; a transfer pays the sum over its path, once
    count: int = 1  # parallel links; each carries one transfer at a time
    kind: str = ""  # nvlink, xgmi, pcie or network: which runtime costs apply (model/costs.py)

    @property
    def capacity(self) -> float:
        return self.bandwidth * self.count


@dataclass(frozen=True)
class Nic:
    node: int
    index: int  # NIC number inside its node
    gpus: tuple[int, ...]  # global ranks it serves (shared bandwidth)
    bandwidth: float
    alpha: float
    tx: int = -1  # vertex ids of its transmit/receive sides; -1 on a single node
    rx: int = -1


@dataclass(frozen=True)
class Topology:
    name: str
    ngpus: int
    gpus_per_node: int
    switches: tuple[Switch, ...]
    links: tuple[Link, ...]
    nics: tuple[Nic, ...] = ()
    profile: str = ""
    vendor: str = "other"
    gpu_model: str = ""
    sms: int = 0  # SMs/CUs per GPU: caps co-resident thread blocks
    sources: tuple[tuple[str, str], ...] = field(default=(), compare=False)
    costs: RuntimeCosts | None = field(default=None, compare=False)  # the runtimes' costs (model/costs.py)

    # ---- vertices -------------------------------------------------------------------------

    @property
    def nodes(self) -> int:
        return self.ngpus // self.gpus_per_node

    @property
    def nvertices(self) -> int:
        return self.ngpus + len(self.switches)

    def is_gpu(self, v: int) -> bool:
        return 0 <= v < self.ngpus

    def switch(self, v: int) -> Switch:
        return self.switches[v - self.ngpus]

    def vertex_name(self, v: int) -> str:
        return f"gpu{v}" if self.is_gpu(v) else self.switch(v).name

    def vertex_id(self, name: str) -> int:
        return self._vertex_ids[name]

    @cached_property
    def _vertex_ids(self) -> dict[str, int]:
        return {self.vertex_name(v): v for v in range(self.nvertices)}

    def node_of(self, rank: int) -> int:
        return rank // self.gpus_per_node

    # ---- links ----------------------------------------------------------------------------

    @cached_property
    def _link_index(self) -> dict[tuple[int, int], int]:
        return {(l.src, l.dst): i for i, l in enumerate(self.links)}

    def link_id(self, src: int, dst: int) -> int:
        return self._link_index[(src, dst)]

    def link(self, src: int, dst: int) -> Link:
        return self.links[self._link_index[(src, dst)]]

    def has_link(self, src: int, dst: int) -> bool:
        return (src, dst) in self._link_index

    @cached_property
    def _out(self) -> tuple[tuple[int, ...], ...]:
        out: list[list[int]] = [[] for _ in range(self.nvertices)]
        for i, l in enumerate(self.links):
            out[l.src].append(i)
        return tuple(tuple(x) for x in out)

    @cached_property
    def _in(self) -> tuple[tuple[int, ...], ...]:
        inn: list[list[int]] = [[] for _ in range(self.nvertices)]
        for i, l in enumerate(self.links):
            inn[l.dst].append(i)
        return tuple(tuple(x) for x in inn)

    def out_links(self, v: int) -> tuple[int, ...]:
        return self._out[v]

    def in_links(self, v: int) -> tuple[int, ...]:
        return self._in[v]

    def egress(self, gpu: int) -> float:
        """Bytes/s a GPU can push into the fabric (sum over its out-links)."""
        return sum(self.links[i].capacity for i in self._out[gpu])

    def ingress(self, gpu: int) -> float:
        return sum(self.links[i].capacity for i in self._in[gpu])

    @property
    def fastest_bandwidth(self) -> float:
        """Bandwidth of the fastest single link: one chunk on it defines the epoch."""
        return max(l.bandwidth for l in self.links)

    # ---- GPU-to-GPU paths through switches ------------------------------------------------

    @cached_property
    def _paths(self) -> tuple[dict[int, tuple[tuple[int, ...], ...]], ...]:
        result = []
        for src in range(self.ngpus):
            found: dict[int, list[tuple[int, ...]]] = {}
            stack = [(src,)]
            while stack:
                path = stack.pop()
                for li in self._out[path[-1]]:
                    nxt = self.links[li].dst
                    if nxt in path:
                        continue
                    if self.is_gpu(nxt):
                        if nxt != src and not (self.node_of(nxt) == self.node_of(src) and
                                               any(self.switch(v).kind == "network" for v in path[1:])):
                            found.setdefault(nxt, []).append(path + (nxt,))
                    else:
                        stack.append(path + (nxt,))
            result.append({d: tuple(sorted(ps, key=lambda p: (len(p), p))) for d, ps in sorted(found.items())})
        return tuple(result)

    def paths(self, src: int, dst: int) -> tuple[tuple[int, ...], ...]:
        """Every route of one GPU-to-GPU transfer (inner vertices are switches), shortest first.
        Two GPUs of one node never talk through the network switch (a NIC round trip that no
        collective library uses); they may still relay through other GPUs."""
        return self._paths[src].get(dst, ())

    def neighbours(self, gpu: int) -> tuple[int, ...]:
        """GPUs one transfer away (directly or through switches)."""
        return tuple(self._paths[gpu])

    @cached_property
    def _path_links(self) -> dict[tuple[int, ...], tuple[int, ...]]:
        return {}  # path -> its links, as asked (planners and timers ask once per transfer)

    def path_links(self, path: tuple[int, ...]) -> tuple[int, ...]:
        known = self._path_links.get(path)
        if known is None:
            known = self._path_links[path] = tuple(self._link_index[(a, b)] for a, b in zip(path, path[1:]))
        return known

    def path_bandwidth(self, path: tuple[int, ...]) -> float:
        return min(self.links[i].bandwidth for i in self.path_links(path))

    def path_alpha(self, path: tuple[int, ...]) -> float:
        return sum(self.links[i].alpha for i in self.path_links(path))

    def best_path(self, src: int, dst: int) -> tuple[int, ...]:
        """The route with the highest bandwidth, then the lowest latency, then the fewest hops."""
        return min(self.paths(src, dst), key=lambda p: (-self.path_bandwidth(p), self.path_alpha(p), len(p), p))

    def transfer_time(self, src: int, dst: int, nbytes: float) -> float:
        p = self.best_path(src, dst)
        return nbytes / self.path_bandwidth(p) + self.path_alpha(p)

    # ---- whole-graph views ------------------------------------------------------------------

    def reversed(self) -> "Topology":
        """Every link turned around (time reversal: reduce-scatter is a reversed allgather)."""
        links = tuple(sorted((Link(l.dst, l.src, l.bandwidth, l.alpha, l.count, l.kind) for l in self.links),
                             key=lambda l: (l.src, l.dst)))
        return replace(self, links=links)

    def to_networkx(self):
        import networkx as nx
        g = nx.DiGraph()
        for v in range(self.nvertices):
            g.add_node(v, name=self.vertex_name(v), gpu=self.is_gpu(v))
        for l in self.links:
            g.add_edge(l.src, l.dst, capacity=l.capacity, bandwidth=l.bandwidth, alpha=l.alpha, count=l.count)
        return g

    def gpus_connected(self) -> bool:
        """Every GPU can reach every other GPU."""
        import networkx as nx
        g = self.to_networkx()
        reach = nx.descendants(g, 0) | {0} if self.ngpus else set()
        back = nx.ancestors(g, 0) | {0} if self.ngpus else set()
        return all(r in reach and r in back for r in range(self.ngpus))

    def nic_of(self, gpu: int) -> Nic | None:
        for nic in self.nics:
            if gpu in nic.gpus:
                return nic
        return None

    # ---- JSON -------------------------------------------------------------------------------

    def to_dict(self) -> dict:
        return {
            "name": self.name,
            "profile": self.profile,
            "vendor": self.vendor,
            "gpu_model": self.gpu_model,
            "sms": self.sms,
            "ngpus": self.ngpus,
            "gpus_per_node": self.gpus_per_node,
            "switches": [{"name": s.name, "multicast": s.multicast, "kind": s.kind, "node": s.node} for s in self.switches],
            "links": [[l.src, l.dst, l.bandwidth, l.alpha, l.count, l.kind] for l in self.links],
            "nics": [
                {"node": n.node, "index": n.index, "gpus": list(n.gpus), "bandwidth": n.bandwidth,
                 "alpha": n.alpha, "tx": n.tx, "rx": n.rx}
                for n in self.nics
            ],
            "sources": dict(self.sources),
            "runtime": self.costs.to_dict() if self.costs is not None else None,
        }

    @classmethod
    def from_dict(cls, d: dict) -> "Topology":
        return cls(
            name=d["name"],
            ngpus=int(d["ngpus"]),
            gpus_per_node=int(d["gpus_per_node"]),
            switches=tuple(Switch(s["name"], bool(s["multicast"]), s["kind"], int(s["node"])) for s in d["switches"]),
            links=tuple(Link(int(x[0]), int(x[1]), float(x[2]), float(x[3]), int(x[4]), str(x[5]) if len(x) > 5 else "")
                        for x in d["links"]),
            nics=tuple(
                Nic(int(n["node"]), int(n["index"]), tuple(n["gpus"]), float(n["bandwidth"]), float(n["alpha"]),
                    int(n["tx"]), int(n["rx"]))
                for n in d["nics"]
            ),
            profile=d.get("profile", ""),
            vendor=d.get("vendor", "other"),
            gpu_model=d.get("gpu_model", ""),
            sms=int(d.get("sms", 0)),
            sources=tuple(sorted(d.get("sources", {}).items())),
            costs=RuntimeCosts.from_dict(d["runtime"]) if d.get("runtime") else None,
        )

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=1, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> "Topology":
        return cls.from_dict(json.loads(text))
