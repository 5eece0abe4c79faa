"""The hierarchical baseline for several nodes (NCCL's rail-aligned pattern): a chunk crosses the
network once per remote node, to the GPU with the same local rank (the same rail), and each GPU
that holds a chunk fans it out to the GPUs of its own node. Every cross-node byte moves once per
node, which is what the node cut asks for; the fan-out rides the fast intra-node fabric.

Transfers are list-scheduled in the epoch model like the other baselines: cross-node sends first,
by hop and then by node offset (nearest first, alternating directions), so that at every epoch the
GPUs of a rail all send to the node the same offset away and each receiving NIC gets one sender
(in order of the receiving GPU's id the nodes' orders differed, receivers were sent to twice at
once and some rails waited: DGX H100 x 64 allgather planned at 0.85 of the bound, now 0.98); then
each GPU's own chunk to its node in rotating rounds, then the fan-out of what arrived, in order of
arrival.

Sending every chunk straight to each remote node gives every GPU one network peer per remote node,
and one channel holds at most MAX_TBS_PER_CHANNEL thread blocks with a send peer (the fan-out
needs one per other GPU of the node). Beyond `network_peers` remote nodes the nodes a chunk must
reach along its rail (half of them forward from its home node, half backward) are cut into
network_peers // 2 runs of neighbouring nodes each way: the source sends to the first node of each
run, and each node of a run forwards to the next (same-rail GPUs). A chunk is then at most a run
deep in hops (each costs a network step), and the network carries the same bytes, once per node.

A node of few sources (a broadcast's root) deals its chunks over all its rails (spread_over_idle_rails),
on nodes without a link between every two GPUs (DGX-1, MI250) too: the root reaches a rail's GPU it has
no link to through another GPU, and the fan-out trees leave out the GPUs that have the chunk already
(_served_by_holders; a reduce is this broadcast reversed, where a second copy is a contribution counted
twice);
from three nodes on, its chunks may also go round every remote node one way along the rail, its rail's
chunks forward and backward in turn (ROUND): each byte leaves the node once, where chains each way send
it twice, in deeper chains that realise's instances pipeline.

On one node, for a few sources' copies (a broadcast; a reduce as its reverse), hier is what is left of
this: each source deals its chunks over the GPUs that are no source, which pass them on to the rest
(scatter then allgather, van de Geijn's broadcast). auto plans it on one switched node, where every
other method has the root send each byte once per GPU or is solved (DGX H100 broadcast 16 MB in 32
chunks: 0.75 of the floor, milp 0.64); on GPUs joined by direct links trees is that and more.

`swap` (plan_swap) is hier's allreduce on two nodes: a chunk's contributions are summed inside each
node on the GPU of one rail, and the two GPUs of that rail swap their sums over the network, where
hier (reduce-scatter then allgather, the registry's composition) crosses twice.
"""

from __future__ import annotations

import functools
import time
from collections import defaultdict
from dataclasses import replace

from compiler.model.demand import Demand
from compiler.specs.errors import CompileError
from compiler.model.schedule import Schedule
from compiler.model.timing import expand
from compiler.model.topology import Topology
from compiler.planners.registry import register
from compiler.planners.baselines import ListScheduler, one_transfer_path
from compiler.planners.trees import dealt, prune
from compiler.planners.options import PlanOptions
from compiler.gcpause import without_gc
from compiler.specs.runtimes import MAX_NODES, MAX_TBS_PER_CHANNEL


ROUND = -1  # _placed's chains for one chain through every remote node, each chunk one way, the ways in turn
PIPELINED_PIECES = 4  # the finer chunks hier's ways round the nodes are also compared at (plan)
CROWDED_CHAINS = 8  # chains each way where the GPUs alone take a quarter of a rank's XML nodes
TREE_PEERS = 4  # network peers a GPU has where its node's fan-out goes down trees (see network_peers)


def network_peers(topo: Topology) -> int:
    """Network peers a GPU may send to: the thread blocks with a send peer one channel holds
    (MAX_TBS_PER_CHANNEL), less one per other GPU of its node (the fan-out's peers); fewer where
    the GPUs take a quarter of the XML nodes a rank may have (1 + GPUs + thread blocks + steps
    <= MAX_NODES). At 1,024 GPUs 24 peers left the steps one node short while every link was
    paced; with only the NICs paced (realise's LEAD) 16 fit, and they beat 8 (chains of 16 nodes
    pay a step latency per hop: 0.866 of the bound) and 24 (0.862): 0.891."""
    peers = max(2, MAX_TBS_PER_CHANNEL - (topo.gpus_per_node - 1))
    if nodes_need_trees(topo):
        # the thread blocks of a rank (RCCL's 63 on MI250) hold its network peers, its tree neighbours and their
        # channel groups, times the instances; per-link bandwidth inside the node needs the instances. MI250 allgather
        # 2^30 B, hier/1ch at 8, 16 and 32 nodes: 7, 15 and 16 peers made 0.902, 0.668 (one instance fit) and 0.719
        # of the bound; 8 peers -, 0.811 and 0.762; 4 peers 0.932, 0.808 and 0.849. At 10^9 B, where one instance is
        # all the elements allow at 16 and 32 nodes: 0.661 and 0.736; 0.666 and 0.775; 0.621 and 0.848
        return min(peers, TREE_PEERS)
    return min(peers, 2 * CROWDED_CHAINS) if 4 * topo.ngpus >= MAX_NODES else peers


def nodes_need_trees(topo: Topology) -> bool:
    """Whether a node's GPUs are not all joined by direct links (MI250, DGX-1), so that hier's fan-out
    inside a node goes down trees (fan_out_on_trees) rather than straight to each GPU, and a source
    reaches some GPUs of its node only through others (_middles)."""
    per = topo.gpus_per_node
    return not all(topo.paths(a, b) for a in range(per) for b in range(per) if a != b)


@register("hier")
@without_gc
def plan(topo: Topology, demand: Demand, options: PlanOptions) -> Schedule:
    started = time.perf_counter()
    if topo.nodes < 2 and not spreads(topo, demand):
        raise CompileError(f"hier: on one node it plans a few sources' copies (broadcast; reduce as its reverse), "
                           f"not {demand.collective}: the hierarchical baseline needs several nodes ({topo.name} has "
                           "1); use method='direct' on one node")
    if demand.reduce or all(len(c.dests) <= 1 for c in demand.chunks) and demand.root is None:
        raise CompileError(f"hier: plans copies to many ranks (allgather, broadcast) or a root's chunks (scatter, "
                           f"gather), not {demand.collective}")
    nodes, n, peers = topo.nodes, topo.ngpus, network_peers(topo)
    rail = spread_over_idle_rails(demand, topo.gpus_per_node)
    whole = all(set(c.dests) | set(c.sources) == set(range(n)) and len(c.sources) == 1 for c in demand.chunks)
    if whole and nodes - 1 > peers:  # chains, within the network peers a GPU has room for
        tried = list(dict.fromkeys([peers // 2] + ([1, ROUND] if rail else [])))
    elif whole and rail and nodes > 2:
        # a node of few sources sends each chunk to every remote node (quick where latency binds), or down one chain
        # of nodes each way (its rails would otherwise carry every byte once per remote node: DGX H100 x 8 broadcast
        # 32 MB, 0.167 of the bound straight, 0.404 in chains; 64 KB, 0.774 straight, 0.410 in chains), or each chunk
        # around every node one way (ROUND): the sooner
        tried = [0, 1, ROUND]
    else:
        tried = [0]
    plans = {chains: _placed(topo, demand, options, rail, chains, started) for chains in tried}
    if ROUND in plans:
        # going round is a deeper chain than one each way, which realise's instances pipeline (each cuts every chunk
        # into pieces): it stands in for the chains each way where its plan with PIPELINED_PIECES times finer chunks
        # is the sooner (by their plans as they are, at DGX H100 x 8 broadcast 1 GB in 32 chunks, chains each way
        # were the sooner, and their program took 5.503 ms where going round took 3.866)
        fine = demand.split(PIPELINED_PIECES)
        fine_rail = spread_over_idle_rails(fine, topo.gpus_per_node)
        ahead = [_placed(topo, fine, options, fine_rail, chains, started) for chains in (1, ROUND)]
        del plans[1 if ahead[1].epochs < ahead[0].epochs else ROUND]
    best = min(plans.values(), key=lambda s: s.epochs)  # the first on a tie
    return replace(best, solve_time=time.perf_counter() - started) if ROUND in tried else best


def _placed(topo: Topology, demand: Demand, options: PlanOptions, rail: dict[int, tuple[int, int]], chains: int,
            started: float) -> Schedule:
    """hier's schedule with `chains` chains of nodes each way along the rails (0: straight to each remote node;
    ROUND: one chain through every remote node, a rail's chunks forward and backward in turn)."""
    per, nodes, n = topo.gpus_per_node, topo.nodes, topo.ngpus
    ls = ListScheduler(topo, demand, expand(topo, demand, tau=options.tau))
    length = -(-(nodes // 2) // max(1, chains))  # nodes per chain
    cross, local, fanout, first = [], [], [], []
    nic_load: dict[tuple[int, int], int] = defaultdict(int)  # (node, local rank) -> chunks its rail carries
    ways: dict[tuple[int, int], int] = defaultdict(int)  # (node, local rank) -> chunks it sent round so far
    lones = 0
    trees = nodes_need_trees(topo)
    for c in demand.chunks:
        s = c.sources[0]
        home = s // per
        wanted = {d for d in c.dests if d not in c.sources}
        across, at_home = rail.get(c.id, (s % per, s % per))
        lone = next(iter(wanted)) if len(wanted) == 1 and next(iter(wanted)) // per != home else None
        if lone is not None:  # one remote destination (scatter, gather): on the source's rail or the destination's,
            # whichever NICs carry fewer chunks so far (a root's rail would otherwise carry all of them); the GPU on
            # that rail at the other end relays it inside its node
            ends = lambda r: max(nic_load[(home, r)], nic_load[(lone // per, r)])  # noqa: E731
            # the destination's rail only where the source reaches its GPU in one transfer (on nodes without
            # direct links between some GPUs, MI250 and DGX-1, it may not: the source's own rail needs no hop)
            rails = [r for r in (s % per, lone % per) if r == s % per or not trees or topo.paths(s, home * per + r)]
            across = at_home = min(rails, key=ends)
            nic_load[(home, across)] += 1
            nic_load[(lone // per, across)] += 1
            lones += 1
        out, hub = home * per + across, home * per + at_home  # the GPUs that send it across and fan it out at home
        back_round = ways[(home, across)] % 2 == 1  # ROUND: this chunk goes round backward
        ways[(home, across)] += 1
        for g in dict.fromkeys((out, hub)):
            if g != s:  # over direct paths: a source on DGX-1 or MI250 reaches some GPUs of its node through others
                stops = (s, *(_middles(topo, s, g, c.id) if trees and not topo.paths(s, g) else ()), g)
                first += [(c.id, x, y) for x, y in zip(stops, stops[1:])]
                wanted.difference_update(stops[1:])  # the GPUs it passes on the way hold it too
        for node in range(nodes):
            members = [g for g in range(node * per, (node + 1) * per) if g in wanted]
            if not members:
                continue
            if node == home:
                if hub != s:  # another GPU fans it out at home: the source sends it once inside its node
                    fanout += [(c.id, hub, d) for d in members]
                else:
                    local += [((d - s) % per, c.id, s, d) for d in members]
                continue
            relay = node * per + out % per
            if relay not in wanted and lone is None:
                relay = min(members, key=lambda g: ((g - node * per - out % per) % per, g))
            hops, sender = (node - home) % nodes, out
            if chains == ROUND:
                hops = (home - node) % nodes if back_round else hops
                if hops > 1:
                    sender = (relay + per) % n if back_round else (relay - per) % n
            elif chains:  # half the nodes forward along the rail, half backward, each half in `chains` chains
                back = hops > nodes // 2
                k = nodes - hops if back else hops  # distance from home, 1..
                hops = (k - 1) % length + 1  # place in its chain
                if hops > 1:  # from the same-rail GPU one node nearer home
                    sender = (relay + per) % n if back else (relay - per) % n
            off = (node - home) % nodes
            cross.append((hops, min(off, nodes - off), off, out % per, c.id, sender, relay))
            fanout += [(c.id, relay, d) for d in members if d != relay]
    path = functools.cache(lambda a, b: one_transfer_path(topo, a, b, "hier"))  # a million transfers, fewer pairs
    for chunk, a, b in first:
        ls.add(chunk, a, b, path(a, b))
    for *_, chunk, a, b in sorted(cross):
        ls.add(chunk, a, b, path(a, b))
    inside = "then fans out inside each node"
    if not nodes_need_trees(topo):
        for _, chunk, a, b in sorted(local):
            ls.add(chunk, a, b, path(a, b))
        ready = ls.ready
        fanout.sort(key=lambda f: (ready.get((f[0], f[1]), 0), (f[2] - f[1]) % n, f[0]))
        for chunk, a, b in fanout:
            ls.add(chunk, a, b, path(a, b))
    else:
        inside = fan_out_on_trees(topo, ls, [(c, s, d) for _, c, s, d in local] + fanout)
    peers = network_peers(topo)
    why = (f"{nodes - 1} remote nodes are more than the {peers} network peers a GPU has room for"
           if nodes - 1 > peers else "a source's node would otherwise send every byte once per remote node")
    how = (f"in {chains} chains of up to {length} nodes each way along its rail (same-rail "
           f"GPUs; {why})" if chains > 0 else "to the same-rail GPU")
    if chains == ROUND:
        how = (f"round every remote node along its rail (same-rail GPUs), one way, its rail's chunks in turn forward "
               f"and backward, so that each byte leaves its node once ({why})")
    if lones:
        how = ("on the source's or the destination's rail, whichever NICs carry fewer chunks so far, the GPU on that "
               "rail relaying it inside its node where it is neither")
    elif first:
        how += (f"; {len({g for *_, g in first})} GPUs that are no source send their node's chunks across on "
                "their own rails and fan them out at home, each chunk sent to one of them by its source")
    if nodes == 1:
        return ls.schedule("hier", started, ("hier on one node: each source deals its chunks over the GPUs that are no "
                                             "source, one to each in turn, and each passes the chunks it got on to "
                                             "the rest (scatter then allgather)",))
    return ls.schedule("hier", started, (f"hier: each chunk crosses the network once per remote node, {how}, "
                                         f"{inside}",))


def _shortest_routes(topo: Topology, a: int, b: int) -> list[tuple[int, ...]]:
    """Every shortest route of GPUs from a to b inside their node over direct GPU-to-GPU paths, in order."""
    base, per = a - a % topo.gpus_per_node, topo.gpus_per_node
    routes, frontier = [], [(a,)]
    while frontier and not routes:
        frontier = [r + (g,) for r in frontier for g in range(base, base + per)
                    if g not in r and topo.paths(r[-1], g)]
        routes = [r for r in frontier if r[-1] == b]
    if not routes:
        raise CompileError(f"hier: GPU {a} cannot reach GPU {b} inside its node; use another method (auto plans "
                           "the others)")
    return routes


def _middles(topo: Topology, a: int, b: int, chunk: int) -> tuple[int, ...]:
    """The GPUs chunk `chunk` passes from a to b where they have no direct path: one of their
    shortest routes, the routes taken by chunks in turn so that the hops share the links."""
    routes = _shortest_routes(topo, a, b)
    return routes[chunk % len(routes)][1:-1]


def swap_applies(topo: Topology, demand: Demand) -> str | None:
    """Why `swap` cannot plan `demand` on `topo` (None where it can): it plans an allreduce of every
    rank's buffer on two nodes whose GPUs are all joined by direct links."""
    n = topo.ngpus
    if not demand.reduce or not all(len(c.sources) == n and len(c.dests) == n for c in demand.chunks):
        return f"plans allreduce (every rank's buffer summed on every rank), not {demand.collective}"
    if topo.nodes != 2:
        return f"plans two nodes ({topo.name} has {topo.nodes})"
    if nodes_need_trees(topo):
        return f"needs a direct link between every two GPUs of a node ({topo.name} has none between some)"
    return None


@register("swap")
@without_gc
def plan_swap(topo: Topology, demand: Demand, options: PlanOptions) -> Schedule:
    """Allreduce on two nodes in one network crossing: chunk c belongs to rail c mod (GPUs a node);
    every GPU adds its contribution into the GPU of the chunk's rail in its node (in rounds, a rail's
    chunks in turn), the two GPUs of the rail swap their nodes' partial sums (Transfer.swap) and
    each fans the sum out inside its node. hier's reduce-scatter then allgather sends as many bytes
    through each NIC but crosses twice, one node's partial to the owner and the sum back (DGX H100
    x 2 allreduce 1 MB: a crossing is about 7 us of the program's 27.5). Where a node's GPUs are a
    power of two, the GPUs of a round pair off (local ranks XOR r), so that a GPU sends to the peer
    it receives from in the same round and the thread block the lowering gives the two directions
    does not hold one up behind the other (in rotating rounds a GPU receives from a peer per - 2r
    rounds apart from sending to it: DGX A100 x 2 allreduce 25 MB swap/5ch, unpaced LL128 at 5
    instances, 248 -> 180 us)."""
    started = time.perf_counter()
    why = swap_applies(topo, demand)
    if why is not None:
        raise CompileError(f"swap: {why}")
    per, nodes = topo.gpus_per_node, topo.nodes
    ls = ListScheduler(topo, demand, expand(topo, demand, tau=options.tau))
    path = functools.cache(lambda a, b: one_transfer_path(topo, a, b, "swap"))
    on_rail: dict[int, list[int]] = defaultdict(list)  # local rank -> the chunks its rail holds, in order
    for c in demand.chunks:
        on_rail[c.id % per].append(c.id)
    depth = max(map(len, on_rail.values()))
    holder = lambda c, node: node * per + c % per  # noqa: E731
    if per & (per - 1) == 0:  # in round r GPUs pair off (local rank XOR r): each sends to the peer it receives from
        peer = lambda local, r: local ^ r  # noqa: E731
    else:
        peer = lambda local, r: (local + r) % per  # noqa: E731
    for j in range(depth):  # the j-th chunk of every rail, so that the rails' swaps start one after the other
        for r in range(1, per):
            for g in range(nodes * per):
                rail = on_rail[peer(g % per, r)]
                if j < len(rail):
                    ls.add(rail[j], g, holder(rail[j], g // per), path(g, holder(rail[j], g // per)), reduce=True)
    for j in range(depth):
        for rail in on_rail.values():
            if j < len(rail):
                a, b = holder(rail[j], 0), holder(rail[j], 1)
                ls.add_swap(rail[j], [(a, b, path(a, b)), (b, a, path(b, a))])
    fanout = [(c.id, holder(c.id, node), node * per + peer(c.id % per, r), r)
              for c in demand.chunks for node in range(nodes) for r in range(1, per)]
    ready = ls.ready
    fanout.sort(key=lambda f: (ready[(f[0], f[1])], f[3], f[0], f[1]))
    for chunk, a, b, _ in fanout:
        ls.add(chunk, a, b, path(a, b))
    return ls.schedule("swap", started, ("swap: every GPU adds each chunk into the GPU of the chunk's rail in its "
                                         "node, the two nodes' GPUs of that rail swap their partial sums over the "
                                         "network (one crossing), and each fans the sum out inside its node",))


def spreads(topo: Topology, demand: Demand) -> bool:
    """Whether hier sends some chunks across on the rails of GPUs that are no source (spread_over_idle_rails);
    on one node, whether it plans the demand at all (its sources deal their chunks over the other GPUs)."""
    return (not demand.reduce and any(len(c.dests) > 1 for c in demand.chunks)
            and bool(spread_over_idle_rails(demand, topo.gpus_per_node)))


def spread_over_idle_rails(demand: Demand, per: int) -> dict[int, tuple[int, int]]:
    """chunk id -> (the local rank whose rail carries it across the network, the one that fans it
    out inside its home node), for the chunks of a node where some of its GPUs are no source (a
    broadcast's root would otherwise send every byte through its one NIC: DGX H100 x 2 broadcast
    32 MB, hier/8ch, 0.154 of the bound): each source keeps its own rail and shares the idle ones,
    its chunks dealt over them in turn, and a GPU on an idle rail fans out at home what it sends
    across. A chunk is only dealt to GPUs that want it (every such demand sends it to them anyway).
    The chunks a source keeps on its own rail are fanned out at home by the idle GPUs in turn too,
    so that the source sends each chunk once inside its node, not to every GPU (the root of a
    broadcast of 32 chunks on DGX H100: 32 sends instead of 56). Empty where every GPU is a source."""
    sources: dict[int, list[int]] = defaultdict(list)  # node -> its local ranks that are a source, in order
    for c in demand.chunks:
        r = c.sources[0]
        if r % per not in sources[r // per]:
            sources[r // per].append(r % per)
    out: dict[int, tuple[int, int]] = {}
    dealt_to: dict[int, int] = defaultdict(int)  # source rank -> its chunks dealt so far
    for node, own in sources.items():
        idle = [g for g in range(per) if g not in own]
        if not idle:
            continue
        rails = {g: [g] + idle[i::len(own)] for i, g in enumerate(own)}  # the idle rails dealt among the sources
        for c in demand.chunks:
            s = c.sources[0]
            if s // per != node:
                continue
            usable = [g for g in rails[s % per] if g == s % per or node * per + g in c.dests]
            across = usable[dealt_to[s] % len(usable)]
            helpers = usable[1:] or [across]
            out[c.id] = (across, across if across != s % per else helpers[dealt_to[s] // len(usable) % len(helpers)])
            dealt_to[s] += 1
    return out


def _served_by_holders(root: int, edges: list[tuple[int, int]], held: set[int],
                       reach: set[int]) -> list[tuple[int, int]]:
    """A tree's edges (pruned to `reach`) less those into a GPU of `held` (it has the chunk already:
    a broadcast's chunk on its way from the root to the GPU that sends it across), which sends its
    own subtree, and less the branches that led only to one. Receiving a chunk twice is waste in a
    copy and a contribution counted twice in its time-reversed reduction."""
    if not held:
        return edges
    cut = [(x, y) for x, y in edges if y not in held]  # the tree falls apart into one rooted at each holder
    keep = {e for r in (root, *sorted(held)) for e in prune(r, cut, reach)}
    return [e for e in edges if e in keep]


def fan_out_on_trees(topo: Topology, ls: ListScheduler, sends: list[tuple[int, int, int]]) -> str:
    """Where a node's GPUs are not all joined by direct links (MI250's Infinity Fabric, DGX-1's
    hybrid cube mesh), each (chunk, holder, destination) of `sends` inside a node goes down a tree
    of the node rooted at the holder, as the trees planner cuts them from the multicast flow LP
    over one node's links (trees.dealt), the same for every node (the nodes are alike): each chunk
    a holder fans out to the tree of that holder that keeps its busiest link least busy, pruned
    to the chunk's destinations; hops in order of the chunk's arrival at its holder, then depth.
    Says how, for the notes."""
    per = topo.gpus_per_node
    wanted: dict[tuple[int, int], set[int]] = defaultdict(set)  # (chunk, holder) -> its node's destinations
    for chunk, a, b in sends:
        wanted[(chunk, a)].add(b)
    items = sorted(wanted)
    by_root: dict[int, list[int]] = defaultdict(list)  # local rank -> the items it fans out
    dests: dict[int, set[int]] = defaultdict(set)  # local rank -> local destinations
    for i, (chunk, a) in enumerate(items):
        by_root[a % per].append(i)
        dests[a % per] |= {b % per for b in wanted[(chunk, a)]}
    node = [l for l in topo.links if l.src < per and l.dst < per and topo.is_gpu(l.src) and topo.is_gpu(l.dst)]
    if not node:  # a switched node that lost a GPU's port (DGX-2 with 3-nvswitch failed): no trees to cut
        a, b = next((a, b) for a in range(per) for b in range(per) if a != b and not topo.paths(a, b))
        raise CompileError(f"hier: GPU {a} cannot reach GPU {b} inside its node in one transfer, and the node has no "
                           "direct GPU links to fan out over; use another method (auto plans the others)")
    _, trees, which = dealt(topo, by_root, dests, over=node)
    hops = []
    for i, (chunk, a) in enumerate(items):
        root, base = a % per, a - a % per
        reach = {b - base for b in wanted[(chunk, a)]}
        edges = prune(root, list(trees[root][which[i]][0]), reach)
        depth = {root: 0}
        for x, y in edges:
            depth[y] = depth[x] + 1
        held = {y for _, y in edges if (chunk, base + y) in ls.ready}
        for x, y in _served_by_holders(root, edges, held, reach - held):
            hops.append((ls.ready[(chunk, a)], depth[x], (y - x) % per, chunk, base + x, base + y))
    for *_, chunk, x, y in sorted(hops):
        ls.add(chunk, x, y, (x, y))
    return (f"then fans out inside each node down trees of its links ({sum(map(len, trees.values()))} from the "
            "multicast flow LP of one node; not every pair of its GPUs has a direct link)")
