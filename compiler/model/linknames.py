"""Links by the names a person types: `3-nvswitch`, `nic2@0-netswitch`, `0-1`, `0-1#2`.

A named link is a physical link: both directions of a duplex cable, and for a NIC both its halves
(the transmit side towards the network, the receive side back), so `nic2@0-netswitch` names the
NIC's uplink in both directions and `4-nic2` the GPU's attachment to it. Ends are spelled:
- a GPU by its rank (`3`);
- a switch by its name (`nvswitch`, `nvswitch@1` where nodes are composed); next to a GPU the node
  is implied and left out (`3-nvswitch`, `19-nvswitch`);
- a NIC as `nicK` (`nicK@N` where nodes are composed, left out next to a GPU), both halves as one;
- the network switch as `netswitch` (`network` is accepted too).
A bundle of parallel links (count > 1) is one name; `NAME#i` (i = 1..count) names one of them.

`resolve` reads a typed name (either order of ends, a node suffix left out where it is unambiguous);
`fail` and `degrade` return the changed topology. Errors name the flag's field and value.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace

from compiler.model.topology import Link, Topology
from compiler.specs.errors import CompileError

NETSWITCH = "netswitch"
_NIC_HALF = re.compile(r"^(nic[0-9]+)\.(?:tx|rx)(@[0-9]+)?$")


@dataclass(frozen=True)
class NamedLink:
    name: str
    ends: tuple[str, str]
    links: tuple[int, ...]  # directed link ids of the topology (one or two)
    bandwidth: float  # bytes/s of one parallel link, one direction
    alpha: float  # seconds, one direction
    count: int
    kind: str

    def to_dict(self) -> dict:
        return {"name": self.name, "ends": list(self.ends), "bandwidth": self.bandwidth, "alpha": self.alpha,
                "count": self.count, "kind": self.kind, "directed": len(self.links) == 1}


def vertex_label(topo: Topology, v: int, beside_gpu: bool = False) -> str:
    """The name a person types for vertex v (`beside_gpu`: the node suffix is implied)."""
    if topo.is_gpu(v):
        return str(v)
    sw = topo.switch(v)
    if sw.kind == "network":
        return NETSWITCH
    name = sw.name
    m = _NIC_HALF.match(name)
    if m:
        name = m.group(1) + (m.group(2) or "")
    return name.split("@")[0] if beside_gpu else name


def _ends(topo: Topology, link: Link) -> tuple[str, str]:
    """Both ends' names, in naming order: GPUs first (lower rank first), the network switch last."""
    gpu_end = topo.is_gpu(link.src) or topo.is_gpu(link.dst)
    a, b = (vertex_label(topo, v, gpu_end) for v in (link.src, link.dst))

    def order(v: int) -> tuple:
        if topo.is_gpu(v):
            return (0, v)
        return (2, 0) if topo.switch(v).kind == "network" else (1, v)
    return (a, b) if order(link.src) <= order(link.dst) else (b, a)


def named_links(topo: Topology) -> tuple[NamedLink, ...]:
    """Every physical link of the topology, in the order of its first directed link."""
    groups: dict[tuple[str, str], list[int]] = {}
    for i, l in enumerate(topo.links):
        groups.setdefault(_ends(topo, l), []).append(i)
    out = []
    for ends, ids in groups.items():
        first = topo.links[ids[0]]
        out.append(NamedLink(f"{ends[0]}-{ends[1]}", ends, tuple(ids), first.bandwidth, first.alpha, first.count,
                             first.kind))
    return tuple(out)


def link_names(topo: Topology) -> dict[int, str]:
    """Directed link id -> the name of the physical link it belongs to."""
    return {i: n.name for n in named_links(topo) for i in n.links}


@dataclass(frozen=True)
class Resolved:
    link: NamedLink
    parallel: int | None = None  # 1..count: one link of a bundle, None: the whole bundle

    @property
    def name(self) -> str:
        return self.link.name + (f"#{self.parallel}" if self.parallel else "")


def _matches(typed: str, label: str) -> bool:
    typed = NETSWITCH if typed == "network" else typed
    return typed == label or ("@" not in typed and typed == label.split("@")[0])


def resolve(topo: Topology, text: str, field: str) -> Resolved:
    """The named link `text` stands for (ends in either order, a node suffix left out where the
    other end implies it or only one node has such a link)."""
    typed = text.strip().lower()
    parallel = None
    m = re.fullmatch(r"(.+)#([0-9]+)", typed)
    if m:
        typed, parallel = m.group(1), int(m.group(2))
    links = named_links(topo)
    exact = [n for n in links if typed in (n.name.lower(), f"{n.ends[1]}-{n.ends[0]}".lower())]
    found = exact or [n for n in links if _split_matches(typed, n)]
    if not found:
        near = [n.name for n in links if any(e.split("@")[0] in typed for e in n.ends if not e.isdigit())][:4]
        hint = f" (for example {', '.join(near)})" if near else f" (e.g. {links[0].name}; `profiles show` lists them)"
        raise CompileError(f"{field}={text}: no such link in {topo.name}{hint}")
    if len(found) > 1:
        raise CompileError(f"{field}={text}: ambiguous in {topo.name}: {', '.join(n.name for n in found[:4])}")
    link = found[0]
    if parallel is not None and not 1 <= parallel <= link.count:
        raise CompileError(f"{field}={text}: {link.name} has {link.count} parallel link"
                           f"{'s' if link.count > 1 else ''} (#1..#{link.count})")
    return Resolved(link, parallel if link.count > 1 else None)


def _split_matches(typed: str, n: NamedLink) -> bool:
    for i in range(1, len(typed)):
        if typed[i] != "-":
            continue
        a, b = typed[:i], typed[i + 1:]
        if (_matches(a, n.ends[0]) and _matches(b, n.ends[1])) or (_matches(b, n.ends[0]) and _matches(a, n.ends[1])):
            return True
    return False


def fail(topo: Topology, which: Resolved) -> Topology:
    """The topology without the link (a whole bundle), or with one parallel link fewer."""
    ids = set(which.link.links)
    if which.parallel is not None:
        links = tuple(replace(l, count=l.count - 1) if i in ids else l for i, l in enumerate(topo.links))
    else:
        links = tuple(l for i, l in enumerate(topo.links) if i not in ids)
    return replace(topo, links=links)


def degrade(topo: Topology, which: Resolved, fraction: float, field: str) -> Topology:
    """The topology with the link's bandwidth scaled to `fraction` of what it was (both directions)."""
    if not 0 < fraction <= 1:
        raise CompileError(f"{field}={which.name}={fraction:g}: the share of bandwidth left must be in (0, 1] "
                           "(use --fail-link for 0)")
    if which.parallel is not None:
        raise CompileError(f"{field}={which.name}={fraction:g}: one link of a bundle cannot run at its own speed "
                           f"in this model; degrade the whole {which.link.name} or fail {which.name}")
    ids = set(which.link.links)
    links = tuple(replace(l, bandwidth=l.bandwidth * fraction) if i in ids else l for i, l in enumerate(topo.links))
    return replace(topo, links=links)


def disconnected_pair(topo: Topology, needs: list[tuple[tuple[int, ...], int]]) -> tuple[int, int] | None:
    """A (source, destination) pair of ranks no chain of transfers connects, among `needs`
    ((holders of a chunk, a rank that needs it)): every holder is cut off from the rank. GPUs may
    relay (store and forward); switches only forward within one transfer."""
    reach: dict[int, set[int]] = {}

    def reachable(s: int) -> set[int]:
        if s not in reach:
            seen, stack = {s}, [s]
            while stack:
                u = stack.pop()
                for v in topo.neighbours(u):
                    if v not in seen:
                        seen.add(v)
                        stack.append(v)
            reach[s] = seen
        return reach[s]

    for holders, d in needs:
        if not any(d in reachable(s) for s in holders):
            return holders[0], d
    return None
