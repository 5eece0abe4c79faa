"""Node symmetry: a multi-node topology whose nodes are identical (the same links, bandwidths and
latencies between the same local GPUs, switches and NICs) and meet only at shared switches (the
network) has every permutation of its nodes as an automorphism. What depends only on the graph
(a path's alpha, a cut's capacity, an epoch count) is then the same for a node and its image, so
whole-topology tables are computed for node 0 and copied: at 1,024 GPUs, from a million GPU pairs
to eight thousand.

    node_symmetry(topo) -> NodeSymmetry | None
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from compiler.model.topology import Topology

MIN_GPUS = 64  # smaller topologies keep their all-pairs tables (cheap, and their outputs stay as they were)


@dataclass(frozen=True)
class NodeSymmetry:
    per: int  # GPUs per node
    nodes: int
    twin: tuple[int, ...]  # per link: the link of node 0 in its place (a shared link: itself)

    def gpu_swap(self, k: int) -> np.ndarray:
        """The GPU permutation that swaps node 0 and node k (an involution)."""
        perm = np.arange(self.per * self.nodes)
        zero, kth = np.arange(self.per), np.arange(k * self.per, (k + 1) * self.per)
        perm[zero], perm[kth] = kth, zero
        return perm

    def pattern(self, gpus) -> tuple:
        """A GPU set up to permutations of the nodes: the sorted local members of each node."""
        by_node: dict[int, list[int]] = {}
        for g in gpus:
            by_node.setdefault(g // self.per, []).append(g % self.per)
        return tuple(sorted(tuple(sorted(v)) for v in by_node.values()))


def node_symmetry(topo: Topology) -> NodeSymmetry | None:
    return _node_symmetry(topo) if topo.ngpus >= MIN_GPUS and topo.nodes > 1 else None


@lru_cache(maxsize=8)
def _node_symmetry(topo: Topology) -> NodeSymmetry | None:
    per, n = topo.gpus_per_node, topo.ngpus
    node_of, local = [], []
    counters: dict[int, int] = {}
    for v in range(topo.nvertices):
        if v < n:
            node_of.append(v // per)
            local.append(v % per)
        else:
            s = topo.switch(v)
            node_of.append(s.node)
            local.append(counters.get(s.node, 0))
            counters[s.node] = local[-1] + 1
    if len({counters.get(k, 0) for k in range(topo.nodes)}) > 1:
        return None
    kinds = [{} for _ in range(topo.nodes)]
    for v in range(n, topo.nvertices):
        s = topo.switch(v)
        if s.node >= 0:
            kinds[s.node][local[v]] = (s.kind, s.multicast)
    if any(k != kinds[0] for k in kinds):
        return None
    role = lambda v: ("shared", v) if node_of[v] < 0 else ("gpu" if v < n else "switch", local[v])
    signatures: list[dict] = [{} for _ in range(topo.nodes)]
    twin = list(range(len(topo.links)))
    owner = []
    for i, l in enumerate(topo.links):
        homes = {node_of[l.src], node_of[l.dst]} - {-1}
        if len(homes) > 1:
            return None  # a link between two nodes: not every permutation keeps it
        home = homes.pop() if homes else -1
        owner.append(home)
        if home >= 0:
            sig = (role(l.src), role(l.dst), l.bandwidth, l.alpha, l.count, l.kind)
            if sig in signatures[home]:
                return None
            signatures[home][sig] = i
    if any(s.keys() != signatures[0].keys() for s in signatures):
        return None
    for k in range(1, topo.nodes):
        for sig, i in signatures[k].items():
            twin[i] = signatures[0][sig]
    return NodeSymmetry(per, topo.nodes, tuple(twin))
