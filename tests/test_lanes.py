"""Lane-aware lowering: instances cost thread blocks only where a link needs lanes (judged by the
program timer under the runtime cost model, never by wall clock)."""

from __future__ import annotations

import re
import time
from dataclasses import replace

import pytest

from backends.msccl_xml import to_xml
from compiler.analysis.simulate import Ideals, simulate
from compiler.lowering.codegen import pair_thread_blocks
from compiler.lowering.lower import LowerOptions, lower, runtime_limits
from compiler.model.demand import Chunk, Demand, make_demand
from compiler.model.schedule import Schedule, Transfer
from compiler.planners import PlanOptions
from compiler.planners.registry import get, plan
from compiler.program.timing import time_program
from compiler.program.verify import verify
from compiler.realise import instance_order, realise, saturating_counts, waits_behind_nic

MB = 1 << 20


def _custom(topo, hops, dests):
    """Rank 0 holds chunks 0..n-1 (16 MB each); chunk c goes to dests[c]; hops: (chunk, level)."""
    n = len(dests)
    chunks = tuple(Chunk(c, (0,), (dests[c],), (c,), (c,)) for c in range(n))
    d = Demand("custom", topo.ngpus, chunks, 16 * MB, n * 16 * MB, n, False, None, n, n)
    ts = tuple(Transfer(c, 0, dests[c], topo.best_path(0, dests[c]), lvl, lvl + 1) for c, lvl in hops)
    return d, Schedule(d, topo.name, ts, 1e-6, max(t.arrive for t in ts), "hand")


def _checked(s, topo, options):
    p = lower(s, topo, options)
    assert to_xml(p) == to_xml(lower(s, topo, options))  # byte-identical across runs
    verdict = verify(p, "old", s.demand.split(options.instances), topo.sms)  # only legacy takes coll="custom"
    assert verdict.ok, verdict.summary()
    assert max(len(g.tbs) for g in p.gpus) <= runtime_limits("executor", topo.sms).max_tbs
    return p, time_program(p, topo, s.demand.size_bytes).finish_time_s


def _mixed(topo):
    """Four chunks to rank 1 one after another (one connection on rank 0's NVSwitch port at each
    level: it needs all the port's lanes), then one chunk each to ranks 2..5 at one level (four
    connections share the port: one lane each)."""
    return _custom(topo, [(c, c) for c in range(4)] + [(c, 4) for c in range(4, 8)], [1, 1, 1, 1, 2, 3, 4, 5])


def test_instances_buy_lanes_only_where_the_link_needs_them(topo):
    t = topo("dgx2")
    d, s = _mixed(t)
    new, new_s = _checked(s, t, LowerOptions(instances=4))
    old, old_s = _checked(s, t, LowerOptions(instances=4, fit_lanes=False))
    g = new.gpus[0]
    assert sorted(tb.chan for tb in g.tbs if tb.send == 1) == [0, 1, 2, 3]
    for peer in (2, 3, 4, 5):  # one thread block, one step of all four sub-chunks, on both ends
        (tb,) = [tb for tb in g.tbs if tb.send == peer]
        assert [(st.type, st.cnt) for st in tb.steps] == [("s", 4)]
        (rtb,) = [tb for tb in new.gpus[peer].tbs if tb.recv == 0]
        assert [(st.type, st.cnt) for st in rtb.steps] == [("r", 4)]
    assert len(g.tbs) == 8 and len(old.gpus[0].tbs) == 20
    assert new_s < old_s
    # the old placement within the same thread blocks (8 on rank 0) has one instance: far slower
    one, one_s = _checked(s, t, LowerOptions(instances=1, fit_lanes=False))
    assert len(one.gpus[0].tbs) <= len(g.tbs) and new_s < 0.6 * one_s


def test_one_more_thread_block_than_lanes_realises_a_sequence_at_the_planned_time(topo):
    """A thread block pays the step latency after each step: a port is full only while more
    thread blocks than its lanes take turns on it, so lanes + 1 instances meet the plan."""
    t = topo("dgx2")
    d, s = _custom(t, [(c, c) for c in range(8)], [1] * 8)
    assert saturating_counts(t, ("Simple",)) == {5}  # 125 GB/s port, 26.5 GB/s per thread block: 4 lanes
    planned = simulate(t, s, "Simple").finish_time_s
    times = {k: _checked(s, t, LowerOptions(instances=k))[1] for k in (1, 4, 5)}
    assert times[5] < times[4] < times[1]
    assert times[5] <= 1.01 * planned < times[4]
    r = realise(s, t, LowerOptions(proto="Simple", instances=0), "old")  # --instances auto gets there
    assert 5 in {k for _, k, _ in r.tried} and r.timing.finish_time_s <= times[5]


def test_slow_receives_share_a_thread_block_only_with_sends_that_would_not_wait():
    sends, recvs, slow = {(0, 8), (0, 9)}, {(0, 8)}, frozenset({(0, 8)})
    alone = pair_thread_blocks(sends, recvs, {}, slow)
    assert (-1, 8, 0) in alone and len(alone) == 3
    paired = pair_thread_blocks(sends, recvs, {}, slow, lambda chan, d, r: False)
    assert (8, 8, 0) in paired and len(paired) == 2
    other = pair_thread_blocks(sends, recvs, {}, slow, lambda chan, d, r: d == 8)
    assert (9, 8, 0) in other and len(other) == 2


def test_every_gpu_link_s_saturating_count_comes_before_the_doublings(topo):
    """Where the NVSwitch port's count (lanes + 1) needs more thread blocks than fit, the NIC's
    is the next likeliest winner: it is tried before 2, 4, ... so a tight time limit reaches it."""
    t = topo("dgx-a100", 2)
    cost = t.costs.protocol("Simple")
    port = max(l.bandwidth for l in t.links if t.is_gpu(l.src) and l.kind != "network")
    nic = max(l.bandwidth for l in t.links if t.is_gpu(l.src) and l.kind == "network")
    counts = {int(port / cost.tb_rate("nvlink") + 1e-9) + 1, int(nic / cost.tb_rate("network") + 1e-9) + 1}
    assert saturating_counts(t, ("Simple",)) == counts
    order = instance_order(counts, counts)
    assert order[:2] == sorted(counts, reverse=True) and order[2:4] == [2, 4]


@pytest.mark.parametrize("size,bandwidth_bound", [(2**30, True), (2**14, False)])
def test_past_the_time_limit_the_one_count_lowered_is_the_likeliest_winner(topo, size, bandwidth_bound):
    """Where lowering begins after the deadline, one count is lowered: for chunks that a thread block
    takes longer than a step latency to move, the widest link's saturating count, faster than one
    instance (measured by lowering both here); for latency-bound chunks, one instance."""
    t = topo("dgx-h100", 2)
    s = plan(t, make_demand("allgather", 16, size), PlanOptions(method="hier"))
    r = realise(s, t, LowerOptions(proto="Simple", instances=0), "all", deadline=time.perf_counter() - 1)
    assert verify(r.program, "all", s.demand.split(r.instances), t.sms).ok
    assert len({k for _, k, _ in r.tried}) == 1  # one count
    if bandwidth_bound:
        widest = max(saturating_counts(t, ("Simple",)))  # or the largest count above half of it that splits elements
        assert widest / 2 < r.instances <= widest and (size // 16) % (4 * r.instances) == 0
        assert "only %d, the count that saturates the widest GPU link" % r.instances in r.stopped
        one = time_program(lower(s, t, LowerOptions(proto="Simple")), t, size).finish_time_s
        assert r.timing.finish_time_s < 0.5 * one
    else:
        assert r.instances == 1 and (r.stopped is None or "only" not in r.stopped)


def _placement_wins(s, topo, base: LowerOptions, note: str, gain: float, **variant):
    """Lower `s` with `base` and with `variant` on top: the variant's program verifies, says `note`
    (the base's does not), is timed at most `gain` x the base's, and realise (base's protocol and
    instances) keeps it, or a program faster still. Returns the two programs."""
    plain = lower(s, topo, base)
    other = lower(s, topo, replace(base, **variant))
    assert verify(other, "all", s.demand.split(base.instances), topo.sms).ok
    assert any(note in n for n in other.notes) and not any(note in n for n in plain.notes)
    fast = time_program(other, topo, s.demand.size_bytes).finish_time_s
    assert fast < gain * time_program(plain, topo, s.demand.size_bytes).finish_time_s
    r = realise(s, topo, base, "all")
    assert r.timing.finish_time_s <= fast * 1.0001
    assert any(note in n for n in r.program.notes) or r.timing.finish_time_s < 0.99 * fast
    return plain, other


def test_a_peer_s_two_directions_get_thread_blocks_of_their_own_where_that_is_faster(topo):
    """Direct allgather on one DGX A100 node, 1 GB: a thread block that both sends to and receives
    from a peer takes turns between the two; with every send and receive peer on a block of its
    own the timer finds the program faster, it verifies, and realise keeps it."""
    t = topo("dgx-a100")
    s = get("direct")(t, make_demand("allgather", t.ngpus, 1 << 30), PlanOptions())
    paired, own = _placement_wins(s, t, LowerOptions(proto="Simple"), "a thread block of its own", 0.8,
                                  pair_peers=False)
    assert to_xml(own) == to_xml(lower(s, t, LowerOptions(proto="Simple", pair_peers=False)))
    assert any(tb.send >= 0 and tb.recv >= 0 for g in paired.gpus for tb in g.tbs)
    assert all(tb.send < 0 or tb.recv < 0 for g in own.gpus for tb in g.tbs)


def test_one_more_run_in_flight_on_paced_links_where_that_is_faster(topo):
    """DGX H100 x 2 hier allgather 256 MB at 4 instances: a transfer's runs on a link start and end
    together, so its lanes idle through each step latency; one more run in flight (pace_ahead)
    covers it. The timer finds that program faster, it verifies, the note says so, and realise
    keeps a program at least as fast (it widens the window while that pays: 3 more runs here; it is
    a variant it tries, not a rule: on DGX H100 x 4 it is slower; and since the eighteenth session
    unpaced sends with every peer on a block of its own beat it: 636 us against 729). Blocks
    numbered by peer id: in ring order (the default) the blocks that start together already pair
    up so that the lanes idle less, and one more run gains under 1 % here."""
    t = topo("dgx-h100", 2)
    s = get("hier")(t, make_demand("allgather", t.ngpus, 1 << 28), PlanOptions())
    _placement_wins(s, t, LowerOptions(proto="Simple", instances=4, ring_ids=False), "of sends in flight", 0.95,
                    pace_ahead=1)


def test_a_connection_through_a_nic_takes_channel_groups_in_turn_where_that_is_faster(topo):
    """DGX H100 x 2 ring allgather 256 MB: each ring crosses a NIC to one peer, send after send,
    on one thread block, which pays the step latency after each send while its lanes idle (at
    1,024 GPUs a chain's forwards to the next node each way left every NIC fed by two blocks in
    turn). With rotate_slow=2 the connection's transfers take two channels in turn, so two
    blocks alternate on it: the program verifies, says so, and the timer finds it faster. Only the
    connections through a NIC changed channels; on one node (no slow path) nothing changes."""
    t = topo("dgx-h100", 2)
    s = get("ring")(t, make_demand("allgather", t.ngpus, 1 << 28), PlanOptions())
    plain, plain_s = _checked(s, t, LowerOptions(proto="Simple"))
    turns, turns_s = _checked(s, t, LowerOptions(proto="Simple", rotate_slow=2))
    assert turns_s < 0.9 * plain_s
    assert any("2 channel groups in turn" in n for n in turns.notes)
    per = t.gpus_per_node

    def chans(p, nic):
        return sorted({(g.rank, tb.send, tb.chan) for g in p.gpus for tb in g.tbs
                       if tb.send >= 0 and (tb.send // per != g.rank // per) == nic})
    assert chans(plain, False) == chans(turns, False)
    nic = chans(turns, True)
    assert nic and {(r, p) for r, p, _ in nic} == {(r, p) for r, p, _ in chans(plain, True)}
    assert len(nic) == 2 * len(chans(plain, True))
    one = topo("dgx-h100")
    s1 = get("ring")(one, make_demand("allgather", one.ngpus, 1 << 28), PlanOptions())
    assert [g.tbs for g in lower(s1, one, LowerOptions(rotate_slow=2)).gpus] == [g.tbs for g in lower(s1, one).gpus]


def test_sends_through_a_shared_nic_wait_for_their_planned_turn_where_that_is_faster(topo):
    """DGX-2 x 2 alltoall (LP plan), 1 GB, LL128 at 4 instances: two GPUs share each NIC, and a
    program lets them take it first come, first served, out of the order the plan timed. Gating
    each send through a NIC on the receive its rank is planned to have just before it restores
    about that order: the timer finds the program faster, it verifies, the note says so, and
    realise keeps it."""
    t = topo("dgx2", 2)
    s = get("lp")(t, make_demand("alltoall", t.ngpus, 1 << 30), PlanOptions(time_limit=30))
    _placement_wins(s, t, LowerOptions(proto="LL128", instances=4), "through a NIC waits", 0.95, gate_slow=True)


def test_a_pair_s_transfers_take_its_parallel_links_in_turn_across_levels_where_that_is_faster(topo):
    """MI250 reduce-scatter (milp, two chunks per rank), 10^6 B, Simple, every peer on a block of
    its own: GCD pairs joined by several Infinity Fabric links have a lane per link, numbered per
    data-dependency level, so a pair's one transfer of each level always takes lane 0 and queues
    behind the last on one thread block (a step latency each). Taking the lanes in turn across
    levels, the timer finds the program faster, it verifies, says so, and realise keeps it."""
    t = topo("mi250")
    s = plan(t, make_demand("reduce_scatter", t.ngpus, 10**6, 2), PlanOptions(method="milp", time_limit=20))
    assert s.planner == "milp"
    _placement_wins(s, t, LowerOptions(proto="Simple", pair_peers=False), "parallel links in turn", 0.9,
                    lanes_across=True)


def test_unpaced_sends_where_the_links_are_latency_bound(topo):
    """DGX-2 x 2 direct alltoall, 1 KB, LL: each rank sends 16 messages of a few bytes through its
    NIC. Paced, each waits for the one before it, step latency included (2.7 us each); the plan
    overlaps them. Unpaced, the program is several times faster, verifies, says so, and realise
    keeps it, also with the instances left to it."""
    t = topo("dgx2", 2)
    s = get("direct")(t, make_demand("alltoall", t.ngpus, 896), PlanOptions())
    _, unpaced = _placement_wins(s, t, LowerOptions(proto="LL"), "not paced", 0.5, pace=False)
    # with the instances (and protocol) left to it, realise tries one instance's placements after the
    # other counts, and still finds it
    r = realise(s, t, LowerOptions(proto="auto", instances=0), "all")
    assert r.timing.finish_time_s <= time_program(unpaced, t, s.demand.size_bytes).finish_time_s * 1.0001


def test_placements_that_pay_are_kept_together(topo):
    """DGX-2 x 2 hier allgather, 1 MB in 2 chunks, LL at 1 instance: unpaced sends and every peer on
    a block of its own each beat the plain program, and together they beat either alone; realise
    tries each on top of those that paid, so it keeps both (it verifies, and both notes say so)."""
    t = topo("dgx2", 2)
    s = get("hier")(t, make_demand("allgather", t.ngpus, 10**6, 2), PlanOptions())
    size = s.demand.size_bytes
    alone = {kw: time_program(lower(s, t, LowerOptions(proto="LL", **{kw: False})), t, size).finish_time_s
             for kw in ("pace", "pair_peers")}
    plain = time_program(lower(s, t, LowerOptions(proto="LL")), t, size).finish_time_s
    both = lower(s, t, LowerOptions(proto="LL", pace=False, pair_peers=False))
    together = time_program(both, t, size).finish_time_s
    assert max(alone.values()) < plain and together < min(alone.values())
    r = realise(s, t, LowerOptions(proto="LL", instances=1), "all")
    assert r.timing.finish_time_s <= together * 1.0001
    assert verify(r.program, "all", s.demand, t.sms).ok
    assert any("not paced" in n for n in r.program.notes)
    assert any("a thread block of its own" in n for n in r.program.notes)


def test_placements_that_pay_only_together_are_found_from_the_best_one(topo):
    """DGX H100 x 2 hier allgather, 16 MB in 2 chunks, LL128 at 8 instances: lane-aware placement
    off does not pay alone (paced), so it was never tried with the placements that did; yet with
    unpaced sends and every peer on a block of its own it gives the fastest of the eight placements
    (the program timer judges every one), well ahead of those two alone together; realise finds it
    from the best placement so far, and it verifies."""
    t = topo("dgx-h100", 2)
    s = get("hier")(t, make_demand("allgather", t.ngpus, 16 * 10**6, 2), PlanOptions())
    size = s.demand.size_bytes
    at = LowerOptions(proto="LL128", instances=8)
    timed = {(pace, pair, fit): time_program(lower(s, t, replace(at, pace=pace, pair_peers=pair, fit_lanes=fit)),
                                             t, size).finish_time_s
             for pace in (True, False) for pair in (True, False) for fit in (True, False)}
    plain = timed[True, True, True]
    assert timed[True, True, False] >= plain
    assert timed[False, False, False] == min(timed.values()) < 0.95 * timed[False, False, True]
    r = realise(s, t, at, "all")
    assert r.timing.finish_time_s <= timed[False, False, False] * 1.0001
    assert verify(r.program, "all", s.demand.split(8), t.sms).ok


def test_the_descent_from_unpaced_sends_comes_before_the_paced_placements(topo, monkeypatch):
    """DGX-2 x 2 hier allgather, 1 MB in 2 chunks, LL at 1 instance: unpaced sends beat the paced
    program, and with every peer on a block of its own they beat both. realise lowers that
    combination (the descent from the unpaced program) before any runs-ahead window, which rarely
    wins once unpaced sends have, so a deadline cuts the window and not the combination; the
    window is still tried after, and the program is at least as fast as the combination."""
    import compiler.realise as R
    t = topo("dgx2", 2)
    s = get("hier")(t, make_demand("allgather", t.ngpus, 10**6, 2), PlanOptions())
    lowered = []
    real = R.lower
    monkeypatch.setattr(R, "lower", lambda sch, tp, o, **k: lowered.append(o) or real(sch, tp, o, **k))
    r = realise(s, t, LowerOptions(proto="LL", instances=1), "all")
    order = [(o.pace, o.pair_peers, o.pace_ahead) for o in lowered]
    assert (False, False, 0) in order and (True, True, 1) in order
    assert order.index((False, False, 0)) < order.index((True, True, 1))
    size = s.demand.size_bytes
    both = time_program(lower(s, t, LowerOptions(proto="LL", pace=False, pair_peers=False)), t, size).finish_time_s
    assert r.timing.finish_time_s <= both * 1.0001
    assert verify(r.program, "all", s.demand, t.sms).ok


def test_each_count_starts_from_the_placement_of_the_best_program_so_far(topo, monkeypatch):
    """DGX H100 x 2 hier allgather, 1 MB in 1 chunk, LL, instances searched: where the best program
    so far (judged here by the program timer, independently of realise) is unpaced or has every
    peer apart, the next count's first lowering is that placement, so that a search cut short (a
    stall, a deadline) still reaches it and the unpaced placement on top of it; the plain placement
    is still lowered at that count; the program is at least as fast as every program lowered and
    verifies."""
    import compiler.realise as R
    t = topo("dgx-h100", 2)
    s = get("hier")(t, make_demand("allgather", t.ngpus, 999_936, 1), PlanOptions())
    size = s.demand.size_bytes
    lowered = []
    real = R.lower

    def record(sch, tp, o, **k):
        program = real(sch, tp, o, **k)
        lowered.append((o, time_program(program, tp, size).finish_time_s))
        return program
    monkeypatch.setattr(R, "lower", record)
    r = realise(s, t, LowerOptions(proto="LL", instances=0), "all")
    assert verify(r.program, "all", s.demand.split(r.instances), t.sms).ok
    assert r.timing.finish_time_s <= min(sec for _, sec in lowered) * 1.0001
    counts = [o.instances for o, _ in lowered]
    starts = [i for i, k in enumerate(counts) if i == 0 or counts[i - 1] != k]
    carried = 0
    for i, j in zip(starts, starts[1:]):
        best, _ = min(lowered[:i], key=lambda x: x[1]) if i else (None, None)
        if best is None or (best.pace and best.pair_peers) or j - i < 2:
            continue
        first = lowered[i][0]
        assert (first.pace, first.pair_peers) == (best.pace, best.pair_peers)
        assert any(o.pace and o.pair_peers for o, _ in lowered[i + 1:j])  # the plain placement too
        carried += 1
    assert carried >= 2


@pytest.mark.parametrize("failed_s, retried", [(400.0, False), (100.0, True)])
def test_a_count_tries_another_placement_only_where_one_as_long_as_its_failure_fits(topo, monkeypatch, failed_s,
                                                                                      retried):
    """DGX H100 x 2 hier allgather 1 MB, LL, instances searched, 600 s to search: the first lowering at the second
    count fails (as one whose thread blocks need more steps than the runtimes allow does) after `failed_s` seconds of
    realise's clock. Another placement of that count (every instance on its own channel) is lowered after it only
    where one more lowering that long ends before the deadline; otherwise the count is left out, saying so, and the
    program (verified) is from the other counts."""
    import types

    import compiler.realise as R
    from compiler.lowering.codegen import TooManySteps
    monkeypatch.setattr(R, "SEARCH_SECONDS", 600.0)
    skew = [0.0]
    monkeypatch.setattr(R, "time", types.SimpleNamespace(perf_counter=lambda: time.perf_counter() + skew[0]))
    t = topo("dgx-h100", 2)
    s = get("hier")(t, make_demand("allgather", t.ngpus, 999_936, 1), PlanOptions())
    lowered, failed = [], []
    real = R.lower

    def lower_or_fail(sch, tp, o, **k):
        if o.instances > 1 and not failed:
            failed.append(o.instances)
            skew[0] += failed_s
            raise TooManySteps("lowering: rank 0 thread block 3 needs 65 steps; the runtimes allow 64")
        lowered.append(o.instances)
        return real(sch, tp, o, **k)
    monkeypatch.setattr(R, "lower", lower_or_fail)
    r = realise(s, t, LowerOptions(proto="LL", instances=0), "all", deadline=time.perf_counter() + 600.0)
    k = failed[0]
    assert (k in lowered) == retried
    if not retried:
        assert f"the time limit left out {k}" in r.stopped and r.instances != k
    assert verify(r.program, "all", s.demand.split(r.instances), t.sms).ok


def test_no_count_is_lowered_where_the_best_program_could_not_then_be_verified_and_written_in_time(topo, monkeypatch):
    """DGX H100 x 2 hier allgather 1 MB, LL, instances searched: given a time by which the chosen program
    is also to be verified and written (finish_by), realise starts no lowering that would end later than
    FINISH times the best program's lowering and timing before it. With that time already near, only the
    first count is lowered; with it far, the search goes on to other counts as without it. Either way the
    program is the fastest lowered (by the program timer) and verifies."""
    import compiler.realise as R
    t = topo("dgx-h100", 2)
    s = get("hier")(t, make_demand("allgather", t.ngpus, 999_936, 1), PlanOptions())
    real = R.lower
    for near, counts_above_one in ((True, False), (False, True)):
        lowered = []

        def record(sch, tp, o, **k):
            program = real(sch, tp, o, **k)
            lowered.append((o.instances, time_program(program, tp, s.demand.size_bytes).finish_time_s))
            return program
        monkeypatch.setattr(R, "lower", record)
        monkeypatch.setattr(R, "LOWERED", R._Lowered())  # lowered again, not replayed
        now = time.perf_counter()
        r = realise(s, t, LowerOptions(proto="LL", instances=0), "all", deadline=now + 600,
                    finish_by=now + (0.0 if near else 600.0))
        assert any(k > 1 for k, _ in lowered) == counts_above_one
        assert r.timing.finish_time_s <= min(sec for _, sec in lowered) * 1.0001
        assert verify(r.program, "all", s.demand.split(r.instances), t.sms).ok


@pytest.mark.long
def test_a_protocol_close_behind_the_leader_gets_its_own_descent(topo, monkeypatch):
    """DGX A100 x 2 hier reduce-scatter, 256 MB in 4 chunks, at 10 instances: unpaced, LL128 leads
    Simple, so the descent from the unpaced program lowers LL128 (and LL) only; Simple with every
    instance on its own channel comes close behind that descent's best, and unpaced it beats every
    LL128 placement the descent tried. realise descends from Simple too, and its program is at
    least that fast (the program timer judges each; it verifies). Its search is given all the time
    it needs: on a slower machine its 30 s stopped it before Simple's descent."""
    import compiler.realise as R
    monkeypatch.setattr(R, "SEARCH_SECONDS", 600.0)
    t = topo("dgx-a100", 2)
    s = plan(t, make_demand("reduce_scatter", t.ngpus, 256 * 10**6, 4), PlanOptions(method="hier"))
    size = s.demand.size_bytes
    at = LowerOptions(instances=10, pace=False)

    def timed(proto, **kw):
        return time_program(lower(s, t, replace(at, proto=proto, **kw)), t, size).finish_time_s
    assert timed("LL128") < timed("Simple")
    simple = timed("Simple", fit_lanes=False)
    assert simple < 0.97 * timed("LL128", fit_lanes=False)
    r = realise(s, t, LowerOptions(proto="auto", instances=10), "all")
    assert r.timing.finish_time_s <= simple * 1.0001
    assert verify(r.program, "all", s.demand.split(10), t.sms).ok


def test_a_nic_connection_takes_turns_on_top_of_the_best_small_placement(topo, monkeypatch):
    """DGX-2 x 2 hier allgather, 1 MB in 4 chunks, LL at 1 instance: a GPU's quarter chunks cross
    its NIC on one thread block, which pays 2.7 us of step latency after each. Alone, taking channel
    groups in turn changes nothing (paced or paired blocks keep the turns waiting); on the best
    placement, unpaced with every peer apart, two turns beat it by over 10 %. realise tries the
    turns on its best placement and keeps them (the program verifies and says so); without that
    stage (MAX_TURNS 1) the whole chunks over channel groups (_spread) give the NIC connection
    several blocks too and reach it; without both, its program is slower."""
    import compiler.realise as R
    t = topo("dgx2", 2)
    s = get("hier")(t, make_demand("allgather", t.ngpus, 999_936, 4), PlanOptions())  # 1 MB in whole float32
    size = s.demand.size_bytes

    def timed(**kw):
        return time_program(lower(s, t, LowerOptions(proto="LL", **kw)), t, size).finish_time_s
    assert timed(rotate_slow=2) >= 0.99 * timed()
    best = timed(pace=False, pair_peers=False)
    turns = timed(pace=False, pair_peers=False, rotate_slow=2)
    assert turns < 0.9 * best
    r = realise(s, t, LowerOptions(proto="LL", instances=1), "all")
    assert r.timing.finish_time_s <= turns * 1.0001
    assert verify(r.program, "all", s.demand, t.sms).ok
    assert any("channel groups in turn" in n for n in r.program.notes)
    monkeypatch.setattr(R, "MAX_TURNS", 1)
    spread = realise(s, t, LowerOptions(proto="LL", instances=1), "all")
    assert spread.timing.finish_time_s <= turns * 1.0001
    assert any("channel groups, a thread block per group" in n for n in spread.program.notes)
    monkeypatch.setattr(R, "SPREAD_GROUPS", ())
    without = realise(s, t, LowerOptions(proto="LL", instances=1), "all")
    assert without.timing.finish_time_s > 1.05 * r.timing.finish_time_s


def test_nic_sends_on_blocks_of_their_own_let_a_reduce_scatter_meet_its_plan(topo):
    """DGX A100 x 2 hier reduce-scatter, 10^6 B in 5 chunks, LL at 5 instances: each node sums its
    GPUs' contributions, and a rail GPU sends each sum through its NIC fused with the receive of the
    last contribution (rrs). Its block pays the NIC's step latency after each such send, so the
    receive of the next sum waits that out. With fuse_slow off every NIC send peer has a block of
    its own (no receive peer: no rrs): on the best placement with three turns, over 10 % faster,
    within 1.05 x the plan. realise finds it after the turns stop paying, the program verifies and
    says so (none of its other placements reaches that: 22.4 us against 19.0)."""
    t = topo("dgx-a100", 2)
    s = plan(t, make_demand("reduce_scatter", t.ngpus, 10**6, 5), PlanOptions(method="hier"))
    size, per = s.demand.size_bytes, t.gpus_per_node

    def lowered(**kw):
        p = lower(s, t, LowerOptions(proto="LL", instances=5, pace=False, pair_peers=False, rotate_slow=3, **kw))
        return p, time_program(p, t, size).finish_time_s
    fused, fused_s = lowered()
    apart, apart_s = lowered(fuse_slow=False)
    assert apart_s < 0.9 * fused_s
    nic = [(g.rank, tb) for g in apart.gpus for tb in g.tbs if tb.send >= 0 and tb.send // per != g.rank // per]
    assert nic and all(tb.recv < 0 and all(st.type == "s" for st in tb.steps) for _, tb in nic)
    assert any(st.type == "rrs" for g in fused.gpus for tb in g.tbs for st in tb.steps)
    assert waits_behind_nic(fused, t) and not waits_behind_nic(apart, t)
    assert verify(apart, "all", s.demand.split(5), t.sms).ok
    assert apart_s <= 1.05 * simulate(t, s, proto="LL").finish_time_s
    r = realise(s, t, LowerOptions(proto="LL", instances=5), "all")
    assert r.timing.finish_time_s <= apart_s * 1.0001
    assert any("NIC has a thread block of its own" in n for n in r.program.notes)
    assert verify(r.program, "all", s.demand.split(5), t.sms).ok


def test_latency_bound_chunks_spread_over_channel_groups(topo):
    """MI250 x 2 hier allreduce, 10^6 B in 5 chunks per rank, Simple at one instance (5 instances
    need more steps per block than RCCL allows, and no other count splits 3,125-element chunks into
    whole elements): a 12.5 KB chunk takes a thread block 0.5 us against a 2.7 us xGMI step, and a
    connection's block takes up to 50 steps one after another. Over 4 channel groups, with each
    pair's parallel links taken in turn, its steps run on several blocks side by side: the timer
    finds it far faster than any placement over one group (pacing, peer pairing, lanes), it
    verifies, and realise finds it and says so."""
    t = topo("mi250", 2)
    s = plan(t, make_demand("allreduce", t.ngpus, 10**6, 5), PlanOptions(method="hier"))
    size, chunks = s.demand.size_bytes, s.demand.split(1)

    def timed(**kw):
        p = lower(s, t, LowerOptions(proto="Simple", **kw))
        return p, time_program(p, t, size).finish_time_s
    one_group = min(timed(pace=pace, pair_peers=pair, lanes_across=across)[1]
                    for pace in (True, False) for pair in (True, False) for across in (True, False))
    spread, spread_s = timed(groups=4, pace=False, pair_peers=False, lanes_across=True)
    assert spread_s < 0.7 * one_group
    assert spread.nchunksperloop == timed()[0].nchunksperloop
    assert verify(spread, "all", chunks, t.sms).ok
    r = realise(s, t, LowerOptions(proto="Simple", instances=1), "all")
    assert r.timing.finish_time_s <= spread_s * 1.0001
    assert time_program(r.program, t, size).finish_time_s == r.timing.finish_time_s
    assert any("channel groups" in n for n in r.program.notes)
    assert verify(r.program, "all", chunks, t.sms).ok


def test_a_wider_run_ahead_window_is_tried_while_it_pays(topo):
    """DGX H100 x 2 direct alltoall, 1 MiB, LL at 1 instance: each rank's sends through its NIC
    hold the link for little more than the step latency after each, so one more run in flight beats
    the paced program, three more beat one, and unpaced sends lose to three (they take the
    receiving NICs out of the planned order). realise widens the window while it pays and keeps
    the program with three."""
    t = topo("dgx-h100", 2)
    s = get("direct")(t, make_demand("alltoall", t.ngpus, 1 << 20), PlanOptions())
    size = s.demand.size_bytes
    def timed(**kw):
        return time_program(lower(s, t, LowerOptions(proto="LL", **kw)), t, size).finish_time_s
    one, three = timed(pace_ahead=1), timed(pace_ahead=3)
    assert three < one < timed() and three < timed(pace=False)
    r = realise(s, t, LowerOptions(proto="LL", instances=1), "all")
    assert r.timing.finish_time_s <= three * 1.0001
    assert any("3 more runs of sends in flight" in n for n in r.program.notes)


def test_one_instance_placements_wait_for_the_counts_that_split_large_chunks(topo, monkeypatch):
    """DGX-2 x 2 hier allgather, 1 GB (7.8 MB chunks, several Simple iterations each): more instances
    split the chunks, and the saturating count (6; 5, the even count below it, at 10^9 bytes)
    reaches the pipeline's target, so realise lowers no other placement at one instance; the
    program is the same one."""
    import compiler.realise as R
    from compiler.pipeline import enough_time
    t = topo("dgx2", 2)
    s = get("hier")(t, make_demand("allgather", t.ngpus, 10**9, 4), PlanOptions())
    lowered = []
    real = R.lower
    monkeypatch.setattr(R, "lower", lambda sch, tp, o, **k: lowered.append(o) or real(sch, tp, o, **k))
    target = enough_time(t, s, 0.98)
    r = realise(s, t, LowerOptions(proto="auto", instances=0), "all", enough_s=target)
    assert r.instances > 1 and r.timing.finish_time_s <= target
    assert not [o for o in lowered if o.instances == 1 and (not o.pace or o.pace_ahead or not o.pair_peers)]
    assert r.timing.finish_time_s < min(x for p, k, x in r.tried if k == 1)


def test_whole_chunks_over_channel_groups_where_instances_cannot_split_them(topo, monkeypatch):
    """DGX A100 x 4 hier allgather, 1 GB at one instance (as at 128 GPUs, where only counts that
    split 10^9 bytes' elements would split chunks): each GPU fans 4 chunks out to each of 7 peers,
    one thread block per peer at 24 GB/s, 168 of the NVSwitch port's 300 GB/s. Spread over 2 channel
    groups, a peer's chunks move on 2 blocks side by side: nchunksperloop is unchanged, the program
    verifies and the timer finds it faster; realise tries it for a large program at one instance
    and keeps it (the note says so)."""
    import compiler.realise as R
    t = topo("dgx-a100", 4)
    s = get("hier")(t, make_demand("allgather", t.ngpus, 10**9), PlanOptions())
    one, one_s = _checked(s, t, LowerOptions(proto="Simple"))
    two, two_s = _checked(s, t, LowerOptions(proto="Simple", groups=2))
    assert two.nchunksperloop == one.nchunksperloop
    chans = {tb.chan for tb in two.gpus[0].tbs if tb.send == 1}
    assert len(chans) == 2 and len({tb.chan for tb in one.gpus[0].tbs if tb.send == 1}) == 1
    assert two_s < 0.9 * one_s
    monkeypatch.setattr(R, "LARGE_PROGRAM", len(s.transfers))  # the variants of a large program, at this size
    r = realise(s, t, LowerOptions(proto="Simple", instances=1), "all")
    assert r.timing.finish_time_s <= two_s * 1.0001
    assert any("channel groups, a thread block per group" in n for n in r.program.notes)
    assert verify(r.program, "all", s.demand, t.sms).ok


def test_channel_groups_are_tried_past_a_doubling_that_does_not_pay(topo, monkeypatch):
    """MI250 x 2 hier allgather 1 GB at one instance, as a large program: 4 groups of whole chunks
    are faster than LEAD alone by more than a tenth. Where 2 groups change nothing (MI250 x 16, as
    _grouped says: 14.4 ms at 2, 11.5 at 4), realise goes on to 4 groups, as the instance search
    goes on past one count that does not pay, and keeps a program as fast, which verifies. Here 2
    groups pay too since sends stopped waiting for their own chunk's copy to the output (15.67 ->
    12.54 ms), so the test makes their lowering change nothing."""
    import compiler.realise as R
    t = topo("mi250", 2)
    s = get("hier")(t, make_demand("allgather", t.ngpus, 10**9), PlanOptions())
    lead = replace(LowerOptions(proto="Simple"), **R.LEAD)
    _, lead_s = _checked(s, t, lead)
    _, four_s = _checked(s, t, replace(lead, groups=4))
    assert four_s < 0.9 * lead_s
    real = R._keep_faster
    monkeypatch.setattr(R, "_keep_faster", lambda own, *a, **k: None if a[2].groups == 2 else real(own, *a, **k))
    monkeypatch.setattr(R, "LARGE_PROGRAM", len(s.transfers))
    r = realise(s, t, LowerOptions(proto="Simple", instances=1), "all")
    assert r.timing.finish_time_s <= four_s * 1.0001
    groups = [int(m.group(1)) for n in r.program.notes for m in [re.search(r"over (\d+) channel groups", n)] if m]
    assert groups and groups[0] >= 4
    assert verify(r.program, "all", s.demand, t.sms).ok


def test_a_large_program_tries_the_placement_that_pays_at_scale_first(topo, monkeypatch):
    """A large program's first lowering at a count is LEAD (what pays at scale): every peer on a
    block of its own, one more run in flight (chunks of several kernel iterations), only the sends
    through a NIC paced and a NIC's connections on two channel groups in turn. Its other
    placements are tried at its best count only, where each lowering of 256 GPUs takes seconds,
    keeping LEAD's NIC choices: LEAD with 3 runs in flight, one more run in flight alone, peers
    apart alone, every instance on its own channel. DGX H100 x 2 hier allgather 256 MB at 4
    instances, with the large-program path: LEAD beats one more run in flight and own channels
    the old way (pacing the NVSwitch fan-out costs more than it orders), and realise keeps a
    program faster still (own channels on top of LEAD's NIC choices)."""
    import compiler.realise as R
    t = topo("dgx-h100", 2)
    s = get("hier")(t, make_demand("allgather", t.ngpus, 1 << 28), PlanOptions())

    def timed(**o):
        return time_program(lower(s, t, LowerOptions(proto="Simple", instances=4, **o)), t,
                            s.demand.size_bytes).finish_time_s
    plain, ring = timed(ring_ids=False), timed()
    ahead, own, lead = timed(pace_ahead=1), timed(fit_lanes=False), timed(**R.LEAD)
    assert ring < plain and ahead < ring and own < ring and lead < min(ahead, own)
    monkeypatch.setattr(R, "LARGE_PROGRAM", len(s.transfers))
    lowered = []
    real = R.lower
    monkeypatch.setattr(R, "lower", lambda sch, tp, o, **k: lowered.append(o) or real(sch, tp, o, **k))
    r = R.realise(s, t, LowerOptions(proto="Simple", instances=4), "all")
    assert r.timing.finish_time_s < lead * 0.9999
    assert all(o.ring_ids for o in lowered) and verify(r.program, "all", s.demand.split(4), t.sms).ok
    kinds = [(o.pace_ahead, o.fit_lanes, o.pair_peers) for o in lowered]
    assert kinds[:2] == [(1, True, False), (3, True, False)]  # LEAD (16 MB chunks), then LEAD 3 runs ahead
    assert all((o.pace_fast, o.rotate_slow) == (False, 2) for o in lowered)
    assert kinds.index((1, True, True)) < kinds.index((0, True, False)) < kinds.index((0, False, True))
    assert any("only sends over slow paths are paced" in n for n in r.program.notes)


def test_a_large_program_s_other_window_is_lowered_on_the_second_core(topo, monkeypatch):
    """From SPARE_CORE_PROGRAM transfers, with two workers, LEAD's other window is lowered and timed
    in a second process while this one lowers LEAD, and realise keeps the faster: one lowering of
    512 GPUs takes ~25 s, and the default limit leaves room for one. Here LEAD stands in with
    peers paired and its other window with them apart (DGX H100 x 2 hier allgather 16 MB: 127 against
    97 us): with two workers this process does not lower the other window where it tries it, yet
    keeps its program; with one it lowers it itself, to the same time."""
    import compiler.realise as R
    t = topo("dgx-h100", 2)
    s = get("hier")(t, make_demand("allgather", t.ngpus, 1 << 24), PlanOptions())
    monkeypatch.setattr(R, "LARGE_PROGRAM", len(s.transfers))
    monkeypatch.setattr(R, "SPARE_CORE_PROGRAM", len(s.transfers))
    monkeypatch.setattr(R, "LEAD", {"pace_ahead": 1})
    monkeypatch.setattr(R, "_other_window", lambda lead: {**lead, "pace_ahead": 3, "pair_peers": False})
    lead_s = time_program(lower(s, t, LowerOptions(proto="Simple", pace_ahead=3)), t, s.demand.size_bytes)
    other_s = time_program(lower(s, t, LowerOptions(proto="Simple", pace_ahead=3, pair_peers=False)), t,
                           s.demand.size_bytes)
    assert other_s.finish_time_s < 0.9 * lead_s.finish_time_s
    started, lowered, real = [], [], R.lower
    monkeypatch.setattr(R, "lower", lambda sch, tp, o, **k: lowered.append(o) or real(sch, tp, o, **k))
    start = R.Background.start
    monkeypatch.setattr(R.Background, "start", lambda f, a: started.append(a[2]) or start(f, a))
    by, here = {}, {}
    for n in (2, 1):
        lowered.clear()
        r = R.realise(s, t, LowerOptions(proto="Simple", instances=1), "all", workers=n)
        by[n] = r.timing.finish_time_s
        assert verify(r.program, "all", s.demand, t.sms).ok
        here[n] = sum(o == started[0] for o in lowered)
    assert [(o.pace_ahead, o.pair_peers, o.instances) for o in started] == [(3, False, 1)]
    assert here[1] == here[2] + 1  # lowered here with one worker, beside with two
    assert by[2] == by[1] <= other_s.finish_time_s * 1.0001


def test_a_large_program_passes_over_a_protocol_its_lowering_would_not_make_faster(topo):
    """From AS_FIRST_PROGRAM transfers a lowering takes tens of seconds: a second protocol is lowered
    only where its ideal program, plus the seconds the first protocol's program lost to lowering
    scaled by their step latencies, would be faster than that program. Here the first (Simple) is
    given an ideal 1.5 x below its program: LL128 with an ideal just under Simple's program is
    lowered by a smaller program and passed over by a larger one; with an ideal 1.2 x below it, the
    larger one lowers it too (Simple's share of loss would have put it at 1.25 x Simple's program,
    but LL128's steps are shorter, and MI250 x 16 alltoall 1 MB's LL program was 1.5 x faster than
    the Simple one whose share of loss had passed it over)."""
    import compiler.realise as R
    from compiler.analysis.links import Costing
    t = topo("dgx-h100", 2)
    s = get("hier")(t, make_demand("allgather", t.ngpus, 1 << 24), PlanOptions())
    program_s = time_program(lower(s, t, LowerOptions(proto="Simple")), t, s.demand.size_bytes).finish_time_s
    step = {p: max(v for _, v in Costing.of(t, p).cost.step) for p in ("Simple", "LL128")}
    lost = (program_s - program_s / 1.5) * step["LL128"] / step["Simple"]
    options, far = LowerOptions(proto="Simple"), time.perf_counter() + 600
    near = Ideals.given({"Simple": program_s / 1.5, "LL128": program_s - lost / 2})
    small = R._time_all(s, t, options, ("Simple", "LL128"), far, near)
    large = R._time_all(s, t, options, ("Simple", "LL128"), far, near, as_first=True)
    assert set(small) == {"Simple", "LL128"} and set(large) == {"Simple"}
    assert large["Simple"][1].finish_time_s == small["Simple"][1].finish_time_s == program_s
    faster = Ideals.given({"Simple": program_s / 1.5, "LL128": program_s / 1.2})
    assert program_s / 1.2 + lost < program_s <= program_s / 1.2 * 1.5  # lowered now, passed over by the share
    assert set(R._time_all(s, t, options, ("Simple", "LL128"), far, faster, as_first=True)) == {"Simple", "LL128"}


def test_ring_ids_lay_out_every_rank_s_thread_blocks_alike(topo):
    """Thread blocks numbered (by default) by peer in ring order from their rank: on a plan
    symmetric under a shift by whole nodes, the ranks a shift maps onto each other have the same
    blocks, read as peer offsets, so blocks ready at once (taken in id order) pair up alike on
    every rank's NIC and meet at the receivers as the plan has them. DGX
    H100 x 4 hier allgather 256 MB with every peer on a block of its own and one more run in
    flight: by peer id each rank's network sends paired up differently; in ring order the program
    is faster, and it is the same program otherwise (it verifies, same steps per block)."""
    t = topo("dgx-h100", 4)
    s = get("hier")(t, make_demand("allgather", t.ngpus, 1 << 28), PlanOptions())
    lead = dict(proto="Simple", pair_peers=False, pace_ahead=1)
    by_id, by_id_s = _checked(s, t, LowerOptions(**lead, ring_ids=False))
    ring, ring_s = _checked(s, t, LowerOptions(**lead))
    n = t.ngpus

    def layout(p, r):
        return [((tb.send - r) % n if tb.send >= 0 else -1, (tb.recv - r) % n if tb.recv >= 0 else -1, tb.chan)
                for tb in p.gpus[r].tbs]
    per = t.gpus_per_node
    assert all(layout(ring, r) == layout(ring, r % per) for r in range(n))
    assert any(layout(by_id, r) != layout(by_id, r % per) for r in range(n))
    assert sorted(len(tb.steps) for g in ring.gpus for tb in g.tbs) == \
        sorted(len(tb.steps) for g in by_id.gpus for tb in g.tbs)
    assert ring_s < 0.9 * by_id_s


def test_a_large_program_whose_lead_placement_cannot_be_lowered_falls_back_to_the_plain_one(topo, monkeypatch):
    """Where LEAD's lowering fails (its blocks would not fit; here an impossible placement stands in
    for that), realise lowers the count's plain placement instead of giving up on the count."""
    import compiler.realise as R
    t = topo("dgx-h100", 2)
    s = get("hier")(t, make_demand("allgather", t.ngpus, 1 << 28), PlanOptions())
    monkeypatch.setattr(R, "LARGE_PROGRAM", len(s.transfers))
    monkeypatch.setattr(R, "LEAD", {"pair_peers": False, "groups": 0})  # lower() rejects groups=0
    r = R.realise(s, t, LowerOptions(proto="Simple", instances=1), "all")
    plain = time_program(lower(s, t, LowerOptions(proto="Simple")), t, s.demand.size_bytes).finish_time_s
    assert r.timing.finish_time_s <= plain * 1.0001 and verify(r.program, "all", s.demand, t.sms).ok


def test_a_large_program_tries_its_sends_unpaced_with_each_protocol_whose_ideal_beats_its_program(topo, monkeypatch):
    """DGX-2 x 2 direct alltoall 256 KiB at one instance, as a large program whose LEAD placement
    cannot be lowered (an impossible placement stands in for LEAD's blocks not fitting, as on MI250
    x 16 alltoall 1 MB, where they are 174 of RCCL's 63). Paced, LL's program leads (74.7 us); no
    protocol's comes near the best unpaced one (LL128, 43.0; Simple 46.0 where paced it is 246.1).
    realise tries the unpaced placement with the leader and every protocol whose ideal program
    beats the leader's program, and keeps the fastest, which verifies (before, a large program
    never tried its sends unpaced: LL paced)."""
    import compiler.realise as R
    t = topo("dgx2", 2)
    size = 262144
    s = get("direct")(t, make_demand("alltoall", t.ngpus, size), PlanOptions())

    def timed(proto, **kw):
        return time_program(lower(s, t, LowerOptions(proto=proto, **kw)), t, size).finish_time_s
    protos = ("Simple", "LL", "LL128")
    unpaced = min(timed(p, pace=False) for p in protos)
    assert unpaced < 0.8 * min(timed(p) for p in protos)
    monkeypatch.setattr(R, "LARGE_PROGRAM", len(s.transfers))
    monkeypatch.setattr(R, "LEAD", {"pair_peers": False, "groups": 0})  # lower() rejects groups=0
    r = R.realise(s, t, LowerOptions(proto="auto", instances=1), "all")
    assert r.timing.finish_time_s <= unpaced * 1.0001
    assert verify(r.program, "all", s.demand, t.sms).ok


@pytest.mark.parametrize("size, paced_best, unpaced_best", [(262144, "LL", "LL128"), (4 * 10**6, "LL128", "Simple")])
def test_a_placement_is_tried_with_the_protocols_that_might_beat_the_leader(topo, size, paced_best, unpaced_best):
    """DGX-2 x 2 direct alltoall. 256 KiB: paced, LL's program beats LL128's; unpaced, LL128's beats
    LL's by a fifth (LL and LL128 share one lowering: trying both costs a timing). 4 MB: paced,
    LL128's beats Simple's; unpaced, Simple's (whose ideal program is faster than LL128's program)
    beats it. realise tries the unpaced placement with those protocols too, not the leader alone,
    and keeps the faster one, which verifies."""
    t = topo("dgx2", 2)
    s = get("direct")(t, make_demand("alltoall", t.ngpus, size), PlanOptions())

    def timed(proto, **kw):
        return time_program(lower(s, t, LowerOptions(proto=proto, **kw)), t, size).finish_time_s
    assert timed(paced_best) < timed(unpaced_best)
    unpaced = timed(unpaced_best, pace=False)
    assert unpaced < 0.96 * timed(paced_best, pace=False)
    r = realise(s, t, LowerOptions(proto="auto", instances=0), "all")
    assert r.program.proto == unpaced_best and r.timing.finish_time_s <= unpaced * 1.0001
    assert verify(r.program, "all", s.demand, t.sms).ok


def test_where_no_doubling_splits_whole_elements_a_count_below_one_does(topo):
    """DGX H100 x 2 hier allgather, 10^6 B of float32: chunks of 15,625 elements, which 2, 4, 8,
    16 and 32 instances would split (the runtimes would run NCCL's own algorithm). realise tries
    5 (the nearest below 8 that divides) and keeps it: its program verifies and beats one instance's
    best by over a fifth."""
    t = topo("dgx-h100", 2)
    s = get("hier")(t, make_demand("allgather", t.ngpus, 10**6), PlanOptions())
    r = realise(s, t, LowerOptions(proto="auto", instances=0), "all")
    assert r.instances == 5
    assert r.timing.finish_time_s < 0.8 * min(x for _, k, x in r.tried if k == 1)
    assert verify(r.program, "all", s.demand.split(5), t.sms).ok
