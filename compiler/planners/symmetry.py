"""Symmetry: solve one representative source and map its schedule onto every other source.

We look for a group of topology automorphisms that acts freely on the GPUs (no element other than
the identity fixes a GPU), built from a small pool of generators that real systems have: shifting
whole nodes, rotating GPUs inside every node, and flipping bits of the local rank. Each candidate
is checked link by link, so a generator that is not an automorphism (a rotation that would split
a NIC pair, say) is not used. A generator is also refused when some link would be fixed by more
group elements than it has parallel links: the images of one send would then need that link at
the same moment (swapping the two GPUs of a shared NIC does this), which a symmetric schedule
cannot do. One representative GPU per orbit is planned; its chunks' schedule is mapped onto every
other GPU. Link capacity in the reduced model is summed over each link's preimages, so the mapped
schedule fits exactly (and is checked again after mapping).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from compiler.model.demand import Demand
from compiler.model.schedule import Transfer
from compiler.model.topology import Topology


@dataclass(frozen=True)
class Symmetry:
    perms: np.ndarray  # (group size, nvertices): vertex images, identity first
    link_perms: np.ndarray  # (group size, nlinks): link images
    reps: tuple[int, ...]  # one GPU per orbit
    generators: tuple[str, ...]

    @property
    def size(self) -> int:
        return len(self.perms)

    def describe(self) -> str:
        orbits = f", {len(self.reps)} representative GPUs" if len(self.reps) > 1 else ""
        return f"{' x '.join(self.generators)} ({self.size} elements{orbits})"


def _gpu_maps(topo: Topology) -> list[tuple[str, list[int]]]:
    n, per, nodes = topo.ngpus, topo.gpus_per_node, topo.nodes
    maps = []
    if nodes > 1:
        maps.append(("node shift", [(g + per) % n for g in range(n)]))
    for r in range(1, per):
        if per % r == 0:
            maps.append((f"rotate by {r}", [(g // per) * per + (g % per + r) % per for g in range(n)]))
    b = 1
    while b < per and per & (per - 1) == 0:
        maps.append((f"flip bit {b}", [(g // per) * per + ((g % per) ^ b) for g in range(n)]))
        b *= 2
    return maps


def _vertex_perm(topo: Topology, gpu_map: list[int]) -> np.ndarray | None:
    """Extend a GPU permutation to switches (matched by kind and GPU neighbours); None if the
    result is not an automorphism (some link does not map onto an equal link)."""
    n = topo.ngpus
    sig = {}
    for v in range(n, topo.nvertices):
        gpus = frozenset(topo.links[i].dst for i in topo.out_links(v) if topo.is_gpu(topo.links[i].dst)) | \
            frozenset(topo.links[i].src for i in topo.in_links(v) if topo.is_gpu(topo.links[i].src))
        sig[v] = (topo.switch(v).kind, gpus, tuple(sorted(topo.links[i].dst >= n for i in topo.out_links(v))))
    by_sig: dict = {}
    for v, s in sig.items():
        by_sig.setdefault(s, []).append(v)
    perm = np.empty(topo.nvertices, dtype=np.int64)
    perm[:n] = gpu_map
    for v, (kind, gpus, shape) in sig.items():
        image = (kind, frozenset(gpu_map[g] for g in gpus), shape)
        cands = by_sig.get(image, [])
        if len(cands) != 1:
            if not gpus and len(by_sig.get(sig[v], [])) == 1:
                perm[v] = v  # a lone switch without GPU neighbours (the network switch)
                continue
            return None
        perm[v] = cands[0]
    for l in topo.links:
        a, b = int(perm[l.src]), int(perm[l.dst])
        if not topo.has_link(a, b):
            return None
        m = topo.link(a, b)
        if (m.bandwidth, m.alpha, m.count) != (l.bandwidth, l.alpha, l.count):
            return None
    return perm


def _closure(gens: list[np.ndarray], nv: int) -> list[np.ndarray]:
    ident = np.arange(nv)
    seen = {ident.tobytes(): ident}
    frontier = [ident]
    while frontier:
        nxt = []
        for p in frontier:
            for g in gens:
                q = g[p]
                key = q.tobytes()
                if key not in seen:
                    seen[key] = q
                    nxt.append(q)
        frontier = nxt
    return list(seen.values())


def _acceptable(group: list[np.ndarray], topo: Topology) -> bool:
    """Free on GPUs, and no link fixed by more elements than it has parallel links."""
    n = topo.ngpus
    ident = np.arange(topo.nvertices)
    src = np.array([l.src for l in topo.links])
    dst = np.array([l.dst for l in topo.links])
    fixed = np.zeros(len(topo.links), dtype=np.int64)
    for g in group:
        if not np.array_equal(g, ident) and np.any(g[:n] == ident[:n]):
            return False
        fixed += (g[src] == src) & (g[dst] == dst)
    return bool(np.all(fixed <= np.array([l.count for l in topo.links])))


def find_symmetry(topo: Topology) -> Symmetry | None:
    """The largest group the generator pool gives that acts freely on the GPUs, or None."""
    chosen: list[np.ndarray] = []
    names: list[str] = []
    group = [np.arange(topo.nvertices)]
    for name, gmap in _gpu_maps(topo):
        perm = _vertex_perm(topo, gmap)
        if perm is None or any(np.array_equal(perm, g) for g in group):
            continue
        trial = _closure(chosen + [perm], topo.nvertices)
        if len(trial) > topo.ngpus or not _acceptable(trial, topo):
            continue
        chosen.append(perm)
        names.append(name)
        group = trial
    if len(group) < 2:
        return None
    group.sort(key=lambda g: (not np.array_equal(g, np.arange(topo.nvertices)), g.tolist()))
    perms = np.array(group)
    orbit_of = {}
    for g0 in range(topo.ngpus):
        if g0 not in orbit_of:
            for p in perms:
                orbit_of.setdefault(int(p[g0]), g0)
    reps = tuple(sorted(set(orbit_of.values())))
    link_perms = np.array([[topo.link_id(int(p[l.src]), int(p[l.dst])) for l in topo.links] for p in perms])
    return Symmetry(perms, link_perms, reps, tuple(names))


def chunk_images(sym: Symmetry, demand: Demand) -> np.ndarray | None:
    """(group size, rep chunks) ids of the images of the representatives' chunks, or None if the
    group does not map the demand onto itself (every chunk exactly once). Chunks with the same
    source and destinations are matched in buffer order."""
    if demand.reduce or any(len(c.sources) != 1 for c in demand.chunks):
        return None
    groups: dict[tuple, list[int]] = {}
    for c in sorted(demand.chunks, key=lambda c: (c.src_index[0], c.id)):
        groups.setdefault((c.sources[0], frozenset(c.dests)), []).append(c.id)
    position = {q: (k, j) for k, ids in groups.items() for j, q in enumerate(ids)}
    reps = rep_chunks(demand, sym.reps)
    images = np.empty((sym.size, len(reps)), dtype=np.int64)
    for g, p in enumerate(sym.perms):
        for col, q in enumerate(reps):
            (src, dests), j = position[q]
            target = groups.get((int(p[src]), frozenset(int(p[d]) for d in dests)))
            if target is None or j >= len(target):
                return None
            images[g, col] = target[j]
    if len(set(images.ravel().tolist())) != len(demand.chunks):
        return None
    return images


def rep_chunks(demand: Demand, reps=(0,)) -> list[int]:
    """Ids of the representatives' chunks, in the column order of chunk_images."""
    return sorted(c.id for c in demand.chunks if len(c.sources) == 1 and c.sources[0] in reps)


def map_transfers(sym: Symmetry, topo: Topology, transfers: list[Transfer], images: np.ndarray,
                  rep_ids: list[int]) -> list[Transfer]:
    """Every group element's image of the representative's transfers."""
    col = {q: j for j, q in enumerate(rep_ids)}
    out = []
    for g, p in enumerate(sym.perms):
        for t in transfers:
            path = tuple(int(p[v]) for v in t.path)
            out.append(Transfer(int(images[g, col[t.chunk]]), path[0], path[-1], path, t.start, t.arrive,
                                t.reduce, -1 if t.group < 0 else t.group * sym.size + g))
    return out
