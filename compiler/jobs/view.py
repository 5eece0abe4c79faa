"""A job's view of the shared topology: its own GPUs, numbered as its communicator numbers them
(ascending global rank), and the switches and NICs of the nodes it spans, with the same links.

A job is planned and lowered on its view, so its schedule relays only through its own GPUs (a job's
program runs on its ranks alone) and its XML has `ngpus` = the job's size. Every route of the view is
a route of the shared topology: `to_global` maps vertices back for timing on the shared links.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from compiler.model.topology import Link, Nic, Topology


@dataclass(frozen=True)
class JobView:
    topology: Topology
    ranks: tuple[int, ...]  # global rank of communicator rank i
    vertex: tuple[int, ...]  # global vertex id of each vertex of the view

    def to_global(self, path: tuple[int, ...]) -> tuple[int, ...]:
        return tuple(self.vertex[v] for v in path)


def job_view(topo: Topology, ranks: tuple[int, ...], name: str) -> JobView:
    """The view of `ranks` (ascending, the same number on every node they span: see jobs/spec.py)."""
    nodes = sorted({topo.node_of(r) for r in ranks})
    local_node = {n: i for i, n in enumerate(nodes)}
    keep_sw = [v for v in range(topo.ngpus, topo.nvertices) if _kept(topo, v, ranks, nodes)]
    vertex = tuple(ranks) + tuple(keep_sw)
    new = {g: i for i, g in enumerate(vertex)}
    links = tuple(sorted((Link(new[l.src], new[l.dst], l.bandwidth, l.alpha, l.count, l.kind)
                          for l in topo.links if l.src in new and l.dst in new), key=lambda l: (l.src, l.dst)))
    switches = tuple(replace(topo.switch(v), node=local_node.get(topo.switch(v).node, -1)) for v in keep_sw)
    nics = tuple(Nic(local_node[n.node], n.index, tuple(new[g] for g in n.gpus if g in new), n.bandwidth, n.alpha,
                     new.get(n.tx, -1), new.get(n.rx, -1))
                 for n in topo.nics if any(g in new for g in n.gpus))
    view = replace(topo, name=f"{topo.name}/{name}", ngpus=len(ranks), gpus_per_node=len(ranks) // len(nodes),
                   switches=switches, links=links, nics=nics)
    return JobView(view, tuple(ranks), vertex)


def _kept(topo: Topology, v: int, ranks: tuple[int, ...], nodes: list[int]) -> bool:
    """Switches of the job's nodes that touch one of its GPUs or another switch (the network switch,
    NVSwitches, the NICs of its GPUs)."""
    sw = topo.switch(v)
    if sw.kind == "network":
        return len(nodes) > 1
    if sw.node not in nodes:
        return False
    if sw.kind != "nic":
        return True
    return any(topo.links[i].dst in ranks for i in topo.out_links(v)) or \
        any(topo.links[i].src in ranks for i in topo.in_links(v))
