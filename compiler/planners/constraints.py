"""The constraint families of the time-expanded model (te-ccl-model.md §3.2): one function per
equation, each returning CVXPY constraints built from sparse matrices over the flow variables F
(chunk q starts crossing link l in epoch k, flows.Flows) and the holdings B (GPU g holds q at the
start of epoch k, located by b_pos), plus the early-delivery objective.

The MILP (milp.build) states all of them; the rounds planner's windows state them through
milp.build too. The fluid LP (lp.FluidModel) states its own conservation, capacity and demand
(fluid amounts per epoch, not binary holdings over a sliding window) and shares only the switch
equations, which are the same in both: what leaves a plain switch in an epoch entered it in that
epoch, and a network switch sends a node only what other nodes sent it.
"""

from __future__ import annotations

import numpy as np
import scipy.sparse as sp

from compiler.model.timing import TimeExpansion
from compiler.planners.flows import network_nodes, occupancy, rows_matrix


def buffer_equals_previous_plus_arrivals(flows, b_pos, l_dst, arrival, is_gpu, nf, nb, F, B, landing=None):
    """B(q,g,k) = B(q,g,k-1) + sum over links l into g of F(q, l, k - arrival[l])
    (+ 1 where a copy sent before the model lands: landing[q, g] == k)."""
    if B is None:
        return []
    q, g, k = np.nonzero(b_pos >= 0)
    rows = b_pos[q, g, k]
    prev = b_pos[q, g, k - 1]
    has_prev = prev >= 0
    into = is_gpu[l_dst[flows.l]]
    land = flows.k + arrival[flows.l]
    fq, fg, fk = flows.q[into], l_dst[flows.l][into], land[into]
    f_rows = b_pos[fq, fg, fk]
    f_cols = np.nonzero(into)[0]
    ok = f_rows >= 0  # arrivals at a source never happen (pruned); guard anyway
    mb = sp.csr_matrix((np.concatenate([np.ones(len(rows)), -np.ones(has_prev.sum())]),
                        (np.concatenate([rows, rows[has_prev]]), np.concatenate([rows, prev[has_prev]]))),
                       shape=(nb, nb))
    mf = sp.csr_matrix((-np.ones(ok.sum()), (f_rows[ok], f_cols[ok])), shape=(nb, nf))
    rhs = np.zeros(nb)
    if landing is not None:
        lq, lg = np.nonzero(landing > 0)
        rhs[b_pos[lq, lg, landing[lq, lg]]] = 1.0
    return [mb @ B + mf @ F == rhs]


def send_only_what_is_held(flows, b_pos, l_src, is_gpu, src, F, B, f_ub=None):
    """F(q,l,k) <= B(q,g,k) (times F's upper bound) for a link l out of GPU g that is not a
    source of q (copies are free)."""
    u = l_src[flows.l]
    sel = is_gpu[u]
    sel[sel] &= ~src[flows.q[sel], u[sel]]
    idx = np.nonzero(sel)[0]
    if len(idx) == 0:
        return []
    cols = b_pos[flows.q[idx], u[idx], flows.k[idx]]
    if np.any(cols < 0):  # sending in epoch 0 from a non-source: impossible
        bad = idx[cols < 0]
        return [F[bad] == 0] + send_rows(idx[cols >= 0], cols[cols >= 0], F, B, f_ub)
    return send_rows(idx, cols, F, B, f_ub)


def send_rows(idx, cols, F, B, f_ub=None):
    n = len(idx)
    if n == 0:
        return []
    sel = sp.csr_matrix((np.ones(n), (np.arange(n), idx)), shape=(n, F.size))
    scale = np.ones(n) if f_ub is None else f_ub[idx]
    held = sp.csr_matrix((scale, (np.arange(n), cols)), shape=(n, B.size))
    return [sel @ F <= held @ B]


def switch_forwards_what_enters(topo, flows, l_src, l_dst, is_gpu, multicast, F):
    """Cut-through switches: what leaves a switch in epoch k entered it in epoch k.
    Without copy: sum out = sum in. A multicast switch may copy: each out <= sum in."""
    nv = topo.nvertices
    nf = len(flows)
    copy = np.array([False] * topo.ngpus + [multicast and s.multicast for s in topo.switches])
    out_sw = ~is_gpu[l_src[flows.l]]
    in_sw = ~is_gpu[l_dst[flows.l]]
    cons = []
    key = lambda q, w, k: (q.astype(np.int64) * nv + w) * (flows.k.max() + 2) + k
    plain_out = out_sw & ~copy[l_src[flows.l]]
    plain_in = in_sw & ~copy[l_dst[flows.l]]
    if plain_out.any() or plain_in.any():
        o, i = np.nonzero(plain_out)[0], np.nonzero(plain_in)[0]
        rows = np.concatenate([key(flows.q[o], l_src[flows.l[o]], flows.k[o]), key(flows.q[i], l_dst[flows.l[i]], flows.k[i])])
        vals = np.concatenate([np.ones(len(o)), -np.ones(len(i))])
        m, _ = rows_matrix(rows, np.concatenate([o, i]), vals, nf)
        cons.append(m @ F == 0)
    if multicast and copy.any():
        o = np.nonzero(out_sw & copy[l_src[flows.l]])[0]
        i = np.nonzero(in_sw & copy[l_dst[flows.l]])[0]
        if len(o):
            okey = key(flows.q[o], l_src[flows.l[o]], flows.k[o])
            ikey = key(flows.q[i], l_dst[flows.l[i]], flows.k[i])
            order = np.argsort(ikey, kind="stable")
            ikey_sorted, i_sorted = ikey[order], i[order]
            lo = np.searchsorted(ikey_sorted, okey, "left")
            hi = np.searchsorted(ikey_sorted, okey, "right")
            r_out = np.arange(len(o))
            r_in = np.repeat(r_out, hi - lo)
            c_in = i_sorted[np.concatenate([np.arange(a, b) for a, b in zip(lo, hi)])] if len(o) else np.array([], int)
            m = sp.csr_matrix((np.concatenate([np.ones(len(o)), -np.ones(len(r_in))]),
                               (np.concatenate([r_out, r_in]), np.concatenate([o, c_in]))), shape=(len(o), nf))
            cons.append(m @ F <= 0)
    return cons


def network_sends_a_node_what_other_nodes_sent(topo, flows, l_src, l_dst, F):
    """No round trip through the network: what a network switch sends into node X in epoch k, per
    chunk, is at most what the other nodes sent it then (topology.paths: two GPUs of one node never
    talk through the network). With the switch's conservation this is Hall's condition for pairing
    every copy that leaves with one that entered from another node (milp.extract pairs them so)."""
    net, node = network_nodes(topo)
    out = np.nonzero(net[l_src[flows.l]])[0]
    if not len(out):
        return []
    into = np.nonzero(net[l_dst[flows.l]])[0]
    nv, kk = topo.nvertices, int(flows.k.max()) + 2
    at = lambda idx, w: (flows.q[idx].astype(np.int64) * nv + w) * kk + flows.k[idx]  # noqa: E731 (chunk, switch, epoch)
    sent_from: dict[int, list[tuple[int, int]]] = {}
    for i, key, x in zip(into, at(into, l_dst[flows.l[into]]), node[l_src[flows.l[into]]]):
        sent_from.setdefault(int(key), []).append((int(i), int(x)))
    rows, cols, vals = [], [], []
    for o, key, x in zip(out, at(out, l_src[flows.l[out]]), node[l_dst[flows.l[out]]]):
        row = int(key) * (topo.nodes + 1) + int(x)
        rows.append(row), cols.append(int(o)), vals.append(1.0)
        for i, y in sent_from.get(int(key), ()):
            if y != x:
                rows.append(row), cols.append(i), vals.append(-1.0)
    # a row lists an incoming flow once per outgoing flow into that node: the duplicates sum, so keep them once
    entries = dict.fromkeys(zip(rows, cols, vals))
    r, c, v = (np.array(z) for z in zip(*entries))
    m, _ = rows_matrix(r, c, v, len(flows))
    return [m @ F <= 0]


def link_capacity_over_window(flows, te: TimeExpansion, horizon, F, link_images=None, busy=None):
    """For every link and epoch: chunks started in the last window[l] epochs <= capacity[l], less
    what `busy` (links, horizon) says earlier flows outside the model still hold there.
    With a symmetry, a flow on link l loads the image of l under every group element; the rows of
    the links of one orbit are then identical and only the orbit's first link has one."""
    cap = np.array(te.capacity)
    idx, links, epoch, count = occupancy(flows.l, flows.k, te, link_images)
    keep = epoch < horizon
    idx, links, epoch, count = idx[keep], links[keep], epoch[keep], count[keep]
    rows = links.astype(np.int64) * (horizon + 1) + epoch
    m, keys = rows_matrix(rows, idx, count.astype(float), len(flows))
    limit = cap[keys // (horizon + 1)].astype(float)
    if busy is not None:
        limit -= busy[keys // (horizon + 1), keys % (horizon + 1)]
    load = np.asarray(m.sum(axis=1)).ravel()
    tight = load > limit  # rows that can never be exceeded are left out
    if not tight.any():
        return []
    return [m[tight] @ F <= limit[tight]]


def every_destination_holds_by_horizon(src, dst, b_pos, horizon, B):
    """B(q,d,K) = 1 for every destination d of q that is not a source of q (all demand met)."""
    q, g = np.nonzero(dst & ~src)
    cols = b_pos[q, g, horizon]
    return [B[cols] == 1] if len(cols) else []


def early_delivery(src, dst, b_pos, horizon, nb, B):
    """Sum over needed (chunk, rank) of the epochs it is held: minimising its negative makes
    every delivery as early as possible (the sum of arrival epochs, te-ccl-model.md §3.3)."""
    q, g = np.nonzero(dst & ~src)
    cols = b_pos[q, g, 1:].ravel()
    w = np.zeros(nb)
    w[cols[cols >= 0]] = 1.0
    return w @ B
