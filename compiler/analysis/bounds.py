"""Lower bounds on a collective's time: the latency bound and the cut bound.

Cut bound: for any set A of GPUs, the data that must leave A (a chunk held in A that some rank
outside A needs; for a reduction, a chunk to which A contributes that a rank outside A needs) must
cross every vertex cut separating A from the other GPUs, so T >= data(A) / mincut(A -> rest),
where switches may fall on either side (the min cut chooses). Small topologies are searched
exhaustively over all vertex sets; large ones over structured families (single GPUs, NIC groups,
packages, whole nodes and the worst sets of one node), each evaluated with an exact max-flow.

Group bound: the GPUs of a group B (one GPU, the GPUs that share a NIC, a package) must together
receive what each of them lacks, through their own in-links, at no more than the max flow into B.
This is where a shared NIC counts once, not once per GPU.

Latency: every pair that must communicate pays at least the cheapest chain of transfers between
them, and the last byte of the bandwidth-bound phase is delivered at least one alpha later. Under
the runtime cost model every transfer of the chain also pays its step latency (`chains_s`, per
protocol; analysis/links.runtime_floor makes the program floor of it); across nodes a copy
demand's chain is also at least the lesser of a relay (two transfers) and sending every remote
copy directly through the sources' own links (`relayed_or_direct_s`).
AllReduce with point-to-point algorithms = reduce-scatter + allgather (hardware.md §3.1).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import numpy as np
from scipy.sparse import csr_matrix
from scipy.sparse.csgraph import connected_components, dijkstra, maximum_flow, shortest_path

from compiler.model.demand import Demand, make_demand
from compiler.specs.collectives import bus_factor, spec
from compiler.specs.errors import DemandError
from compiler.model.nodesym import node_symmetry
from compiler.model.topology import Topology

EXACT_MAX_VERTICES = 18  # 2^18 vertex sets: well under a second with numpy
CAP_UNIT = 1e6  # max-flow runs on integer MB/s
INT32_MAX = 2**31 - 1
COARSE_UNITS = 2**30  # a flow network's links' capacity in all, in units, where MB/s would not fit int32


@dataclass(frozen=True)
class Bound:
    collective: str
    size_bytes: int
    time_s: float  # max(latency_s, bandwidth_s + alpha_s)
    bandwidth_s: float
    latency_s: float
    alpha_s: float
    binding: str  # the constraint that sets bandwidth_s
    method: str  # "exhaustive cuts" or "structured cuts"
    # per protocol of the runtime cost model: the latency bound where every transfer of a chain
    # also pays its step latency (by the kind of link it crosses); empty without runtime costs
    chains_s: tuple[tuple[str, float], ...] = ()
    # the cut bound of whole nodes alone, and the least alpha of a transfer between nodes, where
    # every such transfer crosses a network link (`across_nodes`; runtime_floor adds the network's
    # step to it); 0 on one node
    across_s: float = 0.0
    across_alpha_s: float = 0.0

    def to_dict(self) -> dict:
        return dict(self.__dict__)

    @classmethod
    def from_dict(cls, d: dict) -> "Bound":
        return cls(**{**d, "chains_s": tuple((p, t) for p, t in d.get("chains_s", ()))})

    def chain_s(self, proto: str) -> float:
        """The latency bound of programs of `proto` (latency_s where no costs apply)."""
        return dict(self.chains_s).get(proto, self.latency_s)


# ---- traffic ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Traffic:
    src: np.ndarray  # (chunks, ngpus) bool: holds / contributes
    dst: np.ndarray  # (chunks, ngpus) bool: must end with it
    nbytes: np.ndarray  # (chunks,)
    reduce: bool

    @classmethod
    def of(cls, demand: Demand) -> "Traffic":
        src, dst = demand.masks()
        return cls(src, dst, np.full(len(demand.chunks), demand.chunk_bytes), demand.reduce).merged()

    def merged(self) -> "Traffic":
        """Chunks with the same holders and the same destinations as one row with their bytes
        summed: every bound is a sum over such rows, and an alltoall cut into C chunks then costs
        n^2 rows, not n^2 C."""
        n = self.src.shape[1]
        # rows packed into bytes (big-endian bits keep the rows' order) and compared as one value each: np.unique
        # over 2n bool columns compared column by column (MI250 x 16 alltoall in 4 chunks: 7.9 s, 0.3 s packed)
        packed = np.packbits(np.concatenate([self.src, self.dst], axis=1), axis=1)
        keys = np.ascontiguousarray(packed).view(np.dtype((np.void, packed.shape[1]))).ravel()
        uniq, inverse = np.unique(keys, return_inverse=True)
        rows = np.unpackbits(uniq.view(np.uint8).reshape(len(uniq), packed.shape[1]), axis=1, count=2 * n)
        rows = rows.astype(bool)
        nbytes = np.bincount(inverse.ravel(), weights=self.nbytes, minlength=len(rows))
        return Traffic(rows[:, :n], rows[:, n:], nbytes, self.reduce)

    def leaving(self, inside: np.ndarray) -> np.ndarray:
        """Bytes that must leave each GPU set; `inside` is (sets, ngpus) bool. A copy chunk must
        leave only if every holder is inside (else an outside holder can serve the outside); a
        reduction must, if any contribution is inside."""
        n = inside.shape[1]
        if n <= 62:  # as bit masks over the distinct GPU sets, a block of sets at a time
            bits = np.left_shift(np.int64(1), np.arange(n, dtype=np.int64))
            sets, back = np.unique(inside.astype(np.int64) @ bits, return_inverse=True)
            src, dst = (self.src.astype(np.int64) @ bits)[None, :], (self.dst.astype(np.int64) @ bits)[None, :]
            out = np.empty(len(sets))
            for lo in range(0, len(sets), 2048):
                ins = sets[lo:lo + 2048, None]
                from_inside = (ins & src) != 0 if self.reduce else (src & ~ins) == 0
                out[lo:lo + 2048] = (from_inside & ((dst & ~ins) != 0)) @ self.nbytes
            return out[back.ravel()]
        a = inside.astype(np.float64)
        if self.reduce:
            from_inside = (a @ self.src.T) > 0
        else:
            from_inside = ((1.0 - a) @ self.src.T) == 0
        wanted_outside = ((1.0 - a) @ self.dst.T) > 0
        return (from_inside & wanted_outside) @ self.nbytes

    def need_in(self) -> np.ndarray:
        """Bytes each GPU must receive at least."""
        if self.reduce:
            others = self.src.sum(axis=1, keepdims=True) - self.src > 0
            return (self.dst & others).T @ self.nbytes
        return (self.dst & ~self.src).T @ self.nbytes

    def need_out(self) -> np.ndarray:
        """Bytes each GPU must send at least."""
        elsewhere = self.dst.sum(axis=1, keepdims=True) - self.dst > 0
        if self.reduce:
            return (self.src & elsewhere).T @ self.nbytes
        sole = self.src & (self.src.sum(axis=1, keepdims=True) == 1)
        return (sole & elsewhere).T @ self.nbytes

    def pairs(self) -> np.ndarray:
        """(ngpus, ngpus) bool: s must get data to d."""
        p = (self.src.T.astype(np.float64) @ self.dst.astype(np.float64)) > 0  # BLAS: an integer product took
        # seconds at 1,024 GPUs; sums of 0/1 products are exact in float64
        np.fill_diagonal(p, False)
        return p


# ---- max flow -----------------------------------------------------------------------------------


class _FlowNet:
    """The topology as an integer-capacity graph with a super source and sink appended."""

    def __init__(self, topo: Topology, split: tuple[int, ...] = (), gpus: set[int] | None = None):
        """gpus: where given, the only GPUs links may start or end at (others are not passed through)."""
        self.topo = topo
        v = topo.nvertices
        # a GPU in `split` gets a separate in-side vertex: links into it end there
        self.in_side = {g: v + k for k, g in enumerate(split)}
        self.nv = v + len(split) + 2
        self.source, self.sink = self.nv - 2, self.nv - 1
        rows, cols, links = [], [], []
        for l in topo.links:
            if gpus is not None and any(topo.is_gpu(x) and x not in gpus for x in (l.src, l.dst)):
                continue
            rows.append(l.src)
            cols.append(self.in_side.get(l.dst, l.dst))
            links.append(l.capacity)
        # scipy's max-flow takes int32 capacities (int64 ones give a flow of 0), and the sources' and sinks'
        # edges carry the sum: where MB/s would pass that, a coarser unit
        self.unit = CAP_UNIT
        caps = [max(1, round(c / self.unit)) for c in links]
        if sum(caps) + 1 > INT32_MAX:
            self.unit = sum(links) / COARSE_UNITS
            caps = [max(1, round(c / self.unit)) for c in links]
        self.rows, self.cols, self.caps = rows, cols, caps
        self.inf = int(sum(caps)) + 1

    def flow(self, sources, sinks) -> float:
        rows = self.rows + [self.source] * len(sources) + list(sinks)
        cols = self.cols + list(sources) + [self.sink] * len(sinks)
        caps = self.caps + [self.inf] * (len(sources) + len(sinks))
        m = csr_matrix((np.array(caps, dtype=np.int32), (rows, cols)), shape=(self.nv, self.nv))
        m.sum_duplicates()
        return maximum_flow(m, self.source, self.sink).flow_value * self.unit


def min_cut(topo: Topology, inside) -> float:
    """Least capacity leaving any vertex set that holds the GPUs `inside` and no other GPU."""
    inside = set(inside)
    return _FlowNet(topo).flow(sorted(inside), [g for g in range(topo.ngpus) if g not in inside])


# ---- cut families -------------------------------------------------------------------------------


def _exhaustive_cuts(topo: Topology) -> tuple[np.ndarray, np.ndarray]:
    """For every GPU subset (as a bitmask), the least out-capacity over switch placements."""
    n, v = topo.ngpus, topo.nvertices
    masks = np.arange(1 << v, dtype=np.int64)
    cap = np.zeros(1 << v)
    for l in topo.links:
        leaving = ((masks >> l.src) & 1).astype(bool) & ~((masks >> l.dst) & 1).astype(bool)
        cap += leaving * l.capacity
    gpu_part = masks & ((1 << n) - 1)
    best = np.full(1 << n, np.inf)
    np.minimum.at(best, gpu_part, cap)
    subsets = np.arange(1, (1 << n) - 1, dtype=np.int64)
    inside = ((subsets[:, None] >> np.arange(n)) & 1).astype(bool)
    return inside, best[subsets]


def _node_topology(topo: Topology) -> Topology:
    """Node 0 alone (its GPUs and own switches), for finding the worst intra-node sets."""
    n = topo.gpus_per_node
    keep = list(range(n)) + [topo.ngpus + i for i, s in enumerate(topo.switches) if s.kind == "switch" and s.node == 0]
    new = {old: k for k, old in enumerate(keep)}
    from compiler.model.topology import Link
    links = tuple(Link(new[l.src], new[l.dst], l.bandwidth, l.alpha, l.count, l.kind)
                  for l in topo.links if l.src in new and l.dst in new)
    return Topology(topo.name + "-node", n, n, tuple(topo.switches[k - topo.ngpus] for k in keep[n:]), links)


def _groups(topo: Topology) -> list[tuple[int, ...]]:
    """GPU groups that share a resource: a NIC, or a package (the pairs with the most parallel links)."""
    groups = {tuple(sorted(nic.gpus)) for nic in topo.nics if len(nic.gpus) > 1}
    direct = [l for l in topo.links if topo.is_gpu(l.src) and topo.is_gpu(l.dst)]
    if direct:
        most = max(l.count for l in direct)
        if most > 1:
            groups |= {tuple(sorted((l.src, l.dst))) for l in direct if l.count == most}
    return sorted(groups)


def _structured_sets(topo: Topology, traffic: Traffic, worst: int = 12) -> list[tuple[int, ...]]:
    n, per = topo.ngpus, topo.gpus_per_node
    sets: set[tuple[int, ...]] = set()
    sets |= {(g,) for g in range(n)}
    sets |= set(_groups(topo))
    nodes = topo.nodes
    for k in range(1, nodes):
        sets.add(tuple(range(k * per)))
    for node in range(nodes):
        sets.add(tuple(range(node * per, (node + 1) * per)))
    if nodes > 1 and per > 1:
        # the worst sets inside one node, judged on the node alone, then placed in every node
        local = _node_topology(topo)
        if local.nvertices <= EXACT_MAX_VERTICES and local.gpus_connected():
            inside, cap = _exhaustive_cuts(local)
            sub = Traffic(traffic.src[:, :per], traffic.dst[:, :per], traffic.nbytes, traffic.reduce).merged()
            ratio = sub.leaving(inside) / cap
            for idx in np.argsort(-ratio, kind="stable")[:worst]:
                members = tuple(int(g) for g in np.flatnonzero(inside[idx]))
                for node in range(nodes):
                    sets.add(tuple(node * per + g for g in members))
    if nodes == 1:  # on several nodes the exhaustive cuts of one node find its sparse sets (above)
        sets |= _balls(topo)
    full = set(range(n))
    sets |= {tuple(sorted(full - set(s))) for s in list(sets)}
    return sorted(s for s in sets if 0 < len(s) < n)


def _balls(topo: Topology) -> set[tuple[int, ...]]:
    """The balls of the GPUs within r one-transfer hops of a GPU, or of two GPUs a direct link
    joins, for every r short of the whole: the sparse cuts of a mesh without switches (the middle
    of a line, half a ring), which single GPUs, packages and nodes miss. Through switches every
    GPU is one hop away: none."""
    balls: set[tuple[int, ...]] = set()
    seeds = {(g,) for g in range(topo.ngpus)} | {tuple(sorted((l.src, l.dst))) for l in topo.links
                                                 if topo.is_gpu(l.src) and topo.is_gpu(l.dst)}
    for seed in sorted(seeds):
        ball, frontier = set(seed), set(seed)
        balls.add(seed)
        while frontier and len(ball) < topo.ngpus:
            frontier = {u for v in frontier for u in topo.neighbours(v)} - ball
            ball |= frontier
            if frontier and len(ball) < topo.ngpus:
                balls.add(tuple(sorted(ball)))
    return balls


def _describe(topo: Topology, members) -> str:
    members = sorted(members)
    n, per = topo.ngpus, topo.gpus_per_node
    rest = sorted(set(range(n)) - set(members))
    whole = [k for k in range(topo.nodes) if set(range(k * per, (k + 1) * per)) <= set(members)]
    if topo.nodes > 1 and len(members) == len(whole) * per:
        return f"node{'s' if len(whole) > 1 else ''} {','.join(map(str, whole))}"
    if len(members) <= len(rest):
        return "GPUs {" + ",".join(map(str, members)) + "}"
    return "all GPUs but {" + ",".join(map(str, rest)) + "}"


def cut_bound(topo: Topology, traffic: Traffic) -> tuple[float, str, str]:
    """(seconds, binding set, method)."""
    if topo.nvertices <= EXACT_MAX_VERTICES:
        inside, cap = _exhaustive_cuts(topo)
        method = "exhaustive cuts"
    else:
        sets = _structured_sets(topo, traffic)
        inside = np.zeros((len(sets), topo.ngpus), dtype=bool)
        for i, s in enumerate(sets):
            inside[i, list(s)] = True
        net, sym, seen = _FlowNet(topo), node_symmetry(topo), {}

        def cut(s: tuple[int, ...]) -> float:  # the same for every image of s under node permutations
            key = sym.pattern(s) if sym is not None else s
            if key not in seen:
                seen[key] = net.flow(list(s), sorted(set(range(topo.ngpus)) - set(s)))
            return seen[key]
        cap = np.array([cut(s) for s in sets])
        method = "structured cuts"
    data = traffic.leaving(inside)
    with np.errstate(divide="ignore", invalid="ignore"):
        t = np.where(data > 0, data / cap, 0.0)
    if not np.all(np.isfinite(t)):
        bad = inside[int(np.argmax(~np.isfinite(t)))]
        raise DemandError(f"demand: {_describe(topo, np.flatnonzero(bad))} cannot send what others need (no link leaves them)")
    i = int(np.argmax(t))
    members = np.flatnonzero(inside[i])
    return float(t[i]), f"cut: {_describe(topo, members)} -> rest, {cap[i] / 1e9:.4g} GB/s", method


@lru_cache(maxsize=8)
def network_between_nodes(topo: Topology) -> bool:
    """Whether every transfer between two nodes crosses a network link: no path joins GPUs of two
    nodes without a network switch, and every link into or out of one is of the network kind."""
    network = {topo.ngpus + i for i, s in enumerate(topo.switches) if s.kind == "network"}
    edge = [l.kind for l in topo.links if l.src in network or l.dst in network]
    if topo.nodes < 2 or not edge or any(k != "network" for k in edge):
        return False
    keep = [l for l in topo.links if l.src not in network and l.dst not in network]
    graph = csr_matrix((np.ones(len(keep)), ([l.src for l in keep], [l.dst for l in keep])),
                       shape=(topo.nvertices, topo.nvertices))
    _, label = connected_components(graph, directed=False)
    nodes_of = {}
    for g in range(topo.ngpus):
        nodes_of.setdefault(label[g], set()).add(topo.node_of(g))
    return all(len(n) == 1 for n in nodes_of.values())


def across_nodes(topo: Topology, traffic: Traffic) -> float:
    """The cut bound of single nodes alone (what must leave or enter a node over its max flow to
    the rest), where every transfer between nodes crosses a network link (network_between_nodes),
    else 0: the last byte over such a cut is a transfer between nodes, which pays the network's
    step latency under the runtime cost model (links.runtime_floor), where the cut bound's other
    sets may be crossed by transfers inside a node."""
    if not network_between_nodes(topo):
        return 0.0
    per, net, sym, seen = topo.gpus_per_node, _FlowNet(topo), node_symmetry(topo), {}
    worst = 0.0
    for node in range(topo.nodes):
        members = tuple(range(node * per, (node + 1) * per))
        inside = np.zeros((2, topo.ngpus), dtype=bool)
        inside[0, list(members)] = True  # what leaves the node
        inside[1] = ~inside[0]  # what enters it
        for row, data in enumerate(traffic.leaving(inside)):
            if data <= 0:
                continue
            key = (sym.pattern(members) if sym is not None else members, row)  # alike under node permutations
            if key not in seen:
                seen[key] = net.flow(np.flatnonzero(inside[row]).tolist(), np.flatnonzero(~inside[row]).tolist())
            worst = max(worst, float(data) / seen[key])
    return worst


def group_bound(topo: Topology, traffic: Traffic) -> tuple[float, str]:
    """Ingress and egress of single GPUs and of GPU groups that share a NIC or a package."""
    need_in, need_out = traffic.need_in(), traffic.need_out()
    best, why = 0.0, ""
    back, sym, seen = topo.reversed(), node_symmetry(topo), {}
    for group in [(g,) for g in range(topo.ngpus)] + _groups(topo):
        key = sym.pattern(group) if sym is not None else group
        if key not in seen:  # the same for every image of the group under node permutations
            into = _FlowNet(topo, split=group)
            others = [g for g in range(topo.ngpus) if g not in group]
            out = _FlowNet(back, split=group)
            seen[key] = (into.flow(others + list(group), [into.in_side[g] for g in group]),
                         out.flow(others + list(group), [out.in_side[g] for g in group]))
        cap_in, cap_out = seen[key]
        for need, cap, word in ((need_in, cap_in, "into"), (need_out, cap_out, "out of")):
            data = float(sum(need[g] for g in group))
            if data <= 0:
                continue
            if cap <= 0:
                raise DemandError(f"demand: GPU{'s' if len(group) > 1 else ''} {list(group)} must move data but has no link {word} it")
            if data / cap > best:
                best = data / cap
                label = f"GPU {group[0]}" if len(group) == 1 else "GPUs {" + ",".join(map(str, group)) + "} together"
                why = f"{word} {label}, {cap / 1e9:.4g} GB/s"
    return best, why


_BANDWIDTH_CACHE: dict = {}


def _bandwidth_bounds(topo: Topology, traffic: Traffic) -> tuple:
    """cut_bound and group_bound, remembered per topology and merged traffic: the same demand cut
    into finer chunks (auto's refinements) merges to the same rows."""
    key = (topo, traffic.src.tobytes(), traffic.dst.tobytes(), traffic.nbytes.tobytes(), traffic.reduce,
           traffic.src.shape)
    if key not in _BANDWIDTH_CACHE:
        if len(_BANDWIDTH_CACHE) >= 64:
            _BANDWIDTH_CACHE.clear()
        _BANDWIDTH_CACHE[key] = cut_bound(topo, traffic) + group_bound(topo, traffic) + (across_nodes(topo, traffic),)
    return _BANDWIDTH_CACHE[key]


def alpha_distances(topo: Topology, steps: tuple[float, float] = (0.0, 0.0)) -> np.ndarray:
    """Cheapest total alpha of a chain of transfers between every two GPUs (inf if unreachable);
    with `steps` (within a node, across nodes), each transfer of the chain also pays that."""
    n = topo.ngpus
    sym = node_symmetry(topo)
    w = _one_transfer(topo)
    if any(steps):
        node = np.arange(n) // topo.gpus_per_node
        w = w + np.where(node[:, None] == node[None, :], steps[0], steps[1])
    dense = np.where(np.isfinite(w), w + 1e-30, 0.0)  # zero means "no edge" to csgraph
    if sym is None:
        return shortest_path(csr_matrix(dense), directed=True)
    graph = csr_matrix(dense)
    first = shortest_path(graph, directed=True, indices=np.arange(sym.per))  # node 0's rows stand for all
    out = np.empty((n, n))
    out[:sym.per] = first
    for k in range(1, sym.nodes):
        perm = sym.gpu_swap(k)
        out[k * sym.per:(k + 1) * sym.per] = first[:, perm]
    return out


@lru_cache(maxsize=8)
def _one_transfer(topo: Topology) -> np.ndarray:
    """(ngpus, ngpus): the least alpha of one transfer between two GPUs (inf where none), computed
    once per topology (the latency bound and each protocol's chains read it)."""
    if node_symmetry(topo) is not None:
        return _one_transfer_alphas(topo)
    n = topo.ngpus
    w = np.full((n, n), np.inf)
    for s in range(n):
        for d in topo.neighbours(s):
            w[s, d] = min(topo.path_alpha(p) for p in topo.paths(s, d))
    return w


def _one_transfer_alphas(topo: Topology) -> np.ndarray:
    """(ngpus, ngpus): the least alpha of one transfer (a path through switches only; two GPUs of
    one node never through the network), by Dijkstra from every GPU on a graph where GPUs only
    send or only receive (each is split in two), with and without the network switches."""
    n, v = topo.ngpus, topo.nvertices
    network = {topo.ngpus + i for i, s in enumerate(topo.switches) if s.kind == "network"}

    def distances(skip) -> np.ndarray:
        rows, cols, alphas = [], [], []
        for l in topo.links:
            if l.src in skip or l.dst in skip:
                continue
            rows.append(l.src)
            cols.append(v + l.dst if l.dst < n else l.dst)  # into a GPU: its receiving half
            alphas.append(l.alpha + 1e-300)  # an explicit zero would be no edge
        g = csr_matrix((alphas, (rows, cols)), shape=(v + n, v + n))
        return dijkstra(g, directed=True, indices=np.arange(n))[:, v:]

    w = distances(network)
    same = np.arange(n)[:, None] // topo.gpus_per_node == np.arange(n)[None, :] // topo.gpus_per_node
    w = np.where(same, w, distances(set()) if network else w)
    np.fill_diagonal(w, np.inf)
    return w


def bound_for(topo: Topology, demand: Demand) -> Bound:
    traffic = Traffic.of(demand)
    bw_cut, why_cut, method, bw_grp, why_grp, across = _bandwidth_bounds(topo, traffic)
    bw, why = (bw_cut, why_cut) if bw_cut >= bw_grp else (bw_grp, why_grp)
    dist = alpha_distances(topo)
    pairs = traffic.pairs()
    if np.any(pairs & ~np.isfinite(dist)):
        s, d = (int(x[0]) for x in np.nonzero(pairs & ~np.isfinite(dist)))
        raise DemandError(f"demand: rank {d} needs data from rank {s} but no path connects them")
    latency = float(dist[pairs].max()) if pairs.any() else 0.0
    alpha = float(dist[pairs].min()) if pairs.any() else 0.0
    chained = {p: alpha_distances(topo, hop_steps(topo, p)) for p in (topo.costs.names if topo.costs is not None else ())}
    relayed = relayed_or_direct_s(topo, traffic, chained)
    chains = tuple((p, max(float(d[pairs].max()) if pairs.any() else 0.0, relayed.get(p, 0.0)))
                   for p, d in chained.items())
    node = np.arange(topo.ngpus) // topo.gpus_per_node
    between = node[:, None] != node[None, :]
    across_alpha = float(dist[between].min()) if across > 0 else 0.0
    return Bound(demand.collective, demand.size_bytes, max(latency, bw + alpha), bw, latency, alpha, why, method,
                 chains, across, across_alpha)


RELAY_MAX_GPUS = 128  # relayed_or_direct_s compares every two-transfer chain: n^3 sums


def relayed_or_direct_s(topo: Topology, traffic: Traffic, chained: dict[str, np.ndarray]) -> dict[str, float]:
    """Per protocol of `chained` (its cheapest chains between GPUs, every transfer paying its step:
    alpha_distances), the latency bound of its programs from one choice every copy demand across nodes makes:
    either some chunk reaches a GPU of another node through a relay (a chain of two transfers or
    more, each paying its alpha and step), or every such delivery is one transfer from the chunk's
    only holder, through switches alone. Then each group of GPUs (one GPU, or those sharing a NIC
    or a package) sends its chunks once per remote destination, through its own links to the
    other nodes, and the last of those holds ends no earlier than those bytes at that bandwidth
    (the protocol's payload share), a step and an alpha before it arrives. So T >= the lesser of
    the two (the launch is runtime_floor's). The usual chain bound counts one transfer per pair:
    at small sizes on DGX-2 x 2 an allgather relays to save its NICs and pays two hops, or sends
    direct and pays the NICs 16 times over. Whichever it is, every GPU also receives the remote
    bytes it needs directly or through relays of its node (_fan_in_s), so T is at least that too.
    Empty where it does not apply (one node, reductions, over RELAY_MAX_GPUS GPUs, a multicast
    network switch)."""
    from compiler.analysis.links import Costing
    n, per = topo.ngpus, topo.gpus_per_node
    if topo.nodes < 2 or traffic.reduce or n > RELAY_MAX_GPUS or topo.costs is None:
        return {}
    if any(s.multicast for s in topo.switches if s.kind == "network"):
        return {}  # one send could reach several nodes
    node = np.arange(n) // per
    same = node[:, None] == node[None, :]
    sole = traffic.src.sum(axis=1) == 1  # chunk rows whose only holder is their source
    src = np.argmax(traffic.src, axis=1)
    remote = traffic.dst & ~traffic.src & (node[None, :] != node[src][:, None]) & sole[:, None]
    if not remote.any():
        return {}
    cross = np.zeros((n, n), dtype=bool)
    rows, dests = np.nonzero(remote)
    cross[src[rows], dests] = True
    one = _one_transfer(topo)
    out_bytes = np.bincount(src[rows], weights=traffic.nbytes[rows], minlength=n)
    in_bytes = np.bincount(dests, weights=traffic.nbytes[rows], minlength=n)
    worst, sym = 0.0, node_symmetry(topo)
    into: dict[int, float] = {}  # GPU -> switched max flow into it from the other nodes
    for group in [(g,) for g in range(n)] + _groups(topo):
        data = (out_bytes[list(group)].sum(), in_bytes[list(group)].sum())
        if max(data) <= 0:
            continue
        key = (topo, sym.pattern(group) if sym is not None else group)  # the same for every image of the group
        if key not in _SWITCHED:
            others = [g for g in range(n) if node[g] != node[group[0]]]
            if len(_SWITCHED) >= 4096:
                _SWITCHED.clear()
            _SWITCHED[key] = (_switched_flow(topo, group, others), _switched_flow(topo, others, group))
        for bytes_, cap in zip(data, _SWITCHED[key]):
            if bytes_ > 0 and cap > 0:
                worst = max(worst, bytes_ / cap)
        if len(group) == 1 and data[1] > 0:
            into[group[0]] = _SWITCHED[key][1]
    ingress = np.bincount([l.dst for l in topo.links if l.dst < n],
                          weights=[l.capacity for l in topo.links if l.dst < n], minlength=n)
    alphas = {}  # GPU -> (least alpha of a transfer into it from another node, of a relay chain into it)
    for g in into:
        remote, mates = node != node[g], (node == node[g]) & (np.arange(n) != g)
        relay = float(one[np.ix_(remote, mates)].min() + one[mates, g].min()) if mates.any() else np.inf
        alphas[g] = (float(one[remote, g].min()), relay)
    out = {}
    for proto, chains in chained.items():
        inside, across = hop_steps(topo, proto)
        w = one + np.where(same, inside, across)
        d = chains.copy()
        np.fill_diagonal(d, np.inf)  # the relay is not the destination
        relayed = np.min(w[:, :, None] + d[None, :, :], axis=1)  # s -> x, then x ~> d: two transfers or more
        efficiency = Costing.of(topo, proto).efficiency
        direct_s = worst / efficiency + across + float(one[cross].min())
        fan_in = max((_fan_in_s(in_bytes[g], into[g], ingress[g], *alphas[g], efficiency, inside, across)
                      for g in into), default=0.0)
        out[proto] = float(max(min(relayed[cross].min(), direct_s), fan_in))
    return out


def _fan_in_s(nbytes: float, direct_cap: float, ingress: float, direct_alpha: float, relay_alpha: float,
              efficiency: float, inside: float, across: float) -> float:
    """The least time (launch aside) in which a GPU g receives the `nbytes` it needs from chunks
    whose only holder is on another node. Each byte enters g either directly from the other nodes
    through switches alone (at most direct_cap bytes/s, the switched max flow into g; the last such
    transfer pays an alpha, at least direct_alpha, and a step across), or through a relay h on g's
    node, which holds none of it before one transfer across has arrived (an alpha and a step after
    time 0); g's links in (ingress bytes/s in all) carry those bytes after that, and the last pays
    an alpha and a step inside (relay_alpha: the two alphas). Any split of the bytes between the
    two ways leaves the later one no sooner than this. DGX-2 x 2 allgather 256 KB in LL: 16 chunks
    of 8 KB, through one 12.5 GB/s NIC link from 5.3 us on, or the NVSwitch port from 6.6 us on."""
    rate, ingress = direct_cap * efficiency, ingress * efficiency
    direct_at, relay_at = direct_alpha + across, relay_alpha + across + inside
    all_direct = direct_at + nbytes / rate if rate > 0 else np.inf
    all_relayed = relay_at + nbytes / ingress if ingress > 0 else np.inf
    best = min(all_direct, all_relayed)
    if rate > 0 and ingress > 0 and np.isfinite(relay_at):  # the split where both ways end together
        u = (relay_at - direct_at + nbytes / ingress) / (1 / rate + 1 / ingress)
        if 0 < u < nbytes:
            best = min(best, direct_at + u / rate)
    return float(best) if np.isfinite(best) else 0.0


def _switched_flow(topo: Topology, sources, sinks) -> float:
    """Max flow from GPUs `sources` to GPUs `sinks` through switches only (one transfer's path
    never passes through another GPU)."""
    return _FlowNet(topo, gpus=set(sources) | set(sinks)).flow(list(sources), list(sinks))


_SWITCHED: dict = {}  # (topology, GPU group up to node symmetry) -> switched flows out of it and into it


def hop_steps(topo: Topology, proto: str) -> tuple[float, float]:
    """The least step latency a transfer of `proto` pays (program/timing.py charges the kind of the
    link it crosses, links.path_kind): within a node, the cheapest kind but the network's (two GPUs
    of one node never talk through it); across nodes, the network's where every link into or out
    of the network switches is a network link and no path joins two nodes outside them
    (network_between_nodes)."""
    cost = topo.costs.protocol(proto)
    kinds = dict(cost.step)
    inside = min((v for k, v in kinds.items() if k != "network"), default=min(kinds.values()))
    across = kinds["network"] if "network" in kinds and network_between_nodes(topo) else min(kinds.values())
    return inside, across


def lower_bound(topo: Topology, collective: str, size_bytes: int, root: int | None = None) -> Bound:
    """Bound for a standard collective on `topo`; size as nccl-tests counts it."""
    demand = make_demand(collective, topo.ngpus, size_bytes, 1, root)
    phases = spec(demand.collective).phases
    if not phases:
        return bound_for(topo, demand)
    # a collective planned in phases (allreduce: reduce-scatter then allgather) moves the data of each
    parts = [bound_for(topo, make_demand(p, topo.ngpus, size_bytes)) for p in phases]
    last = parts[-1]
    bw = sum(b.bandwidth_s for b in parts)
    return Bound(demand.collective, size_bytes, max(last.latency_s, bw + last.alpha_s), bw, last.latency_s,
                 last.alpha_s, " + ".join(f"{p.replace('_', '-')} ({b.binding})" for p, b in zip(phases, parts)),
                 last.method, last.chains_s, sum(b.across_s for b in parts), last.across_alpha_s)


def busbw(collective: str, ngpus: int, algbw: float) -> float:
    """nccl-tests' bus bandwidth (doc/PERFORMANCE.md)."""
    return algbw * bus_factor(collective, ngpus)
