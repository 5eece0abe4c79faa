"""The simulator against times computed by hand (b / bandwidth + alpha) and its refusals."""

import pytest

from compiler.model.demand import Chunk, Demand, make_demand
from compiler.specs.errors import CompileError
from compiler.model.profiles import compose, synthetic_profile
from compiler.model.schedule import Schedule, Transfer
from compiler.analysis.simulate import ScheduleError, simulate

MB = 10**6
SYN_BW, SYN_ALPHA = 25e9, 0.7e-6  # synthetic profiles: 25 GB/s links, 0.7 us per transfer


def schedule(demand, moves, topo_name="t"):
    """moves: (chunk, src, dst, path[, reduce[, group]]) in schedule order; epochs are only an order."""
    ts = []
    for i, m in enumerate(moves):
        c, s, d, p, *rest = m
        ts.append(Transfer(c, s, d, tuple(p), i, i + 1, *rest))
    return Schedule(demand, topo_name, tuple(ts), 1e-3, len(ts), "test")


def custom(ngpus, pairs, chunk_bytes, reduce=False):
    """Chunks as (sources, dests) tuples."""
    chunks = tuple(Chunk(i, tuple(s), tuple(d), tuple(range(len(s))), tuple(range(len(d))))
                   for i, (s, d) in enumerate(pairs))
    return Demand("custom", ngpus, chunks, chunk_bytes, int(chunk_bytes * len(pairs)), 1, reduce, None, 1, 1)


# ---- times by hand ------------------------------------------------------------------------------


def test_one_transfer_costs_bytes_over_bandwidth_plus_alpha(topo):
    t = topo("line:2")
    d = make_demand("broadcast", 2, 25 * MB)  # one 25 MB chunk: 1 ms at 25 GB/s
    m = simulate(t, schedule(d, [(0, 0, 1, (0, 1))]))
    assert m.finish_time_s == pytest.approx(1e-3 + SYN_ALPHA)
    assert m.starts == (0.0,) and m.ends[0] == pytest.approx(1e-3 + SYN_ALPHA)
    assert m.ntransfers == 1
    assert m.algbw == pytest.approx(25 * MB / (1e-3 + SYN_ALPHA))
    assert m.link_busy_max == pytest.approx(1e-3 / (1e-3 + SYN_ALPHA))
    assert m.output_buffer_bytes == 25 * MB and m.scratch_bytes == 0


def test_two_transfers_on_one_link_serialize(topo):
    t = topo("line:2")
    d = make_demand("broadcast", 2, 50 * MB, chunks=2)  # two 25 MB chunks
    m = simulate(t, schedule(d, [(0, 0, 1, (0, 1)), (1, 0, 1, (0, 1))]))
    assert m.starts == pytest.approx((0.0, 1e-3))
    assert m.finish_time_s == pytest.approx(2e-3 + SYN_ALPHA)


def test_parallel_links_carry_transfers_at_once(topo):
    t = topo("mi250")
    link = t.link(0, 1)
    assert link.count == 4 and link.bandwidth == 50e9
    d = custom(8, [((0,), (1,))] * 5, 50 * MB)  # 1 ms each
    m = simulate(t, schedule(d, [(c, 0, 1, (0, 1)) for c in range(5)]))
    assert m.starts == pytest.approx((0, 0, 0, 0, 1e-3))  # four slots, the fifth waits
    assert m.finish_time_s == pytest.approx(2e-3 + link.alpha)


def test_relay_stores_and_forwards(topo):
    t = topo("line:3")
    d = custom(3, [((0,), (2,))], 25 * MB)
    m = simulate(t, schedule(d, [(0, 0, 1, (0, 1)), (0, 1, 2, (1, 2))]))
    assert m.starts[1] == pytest.approx(1e-3 + SYN_ALPHA)
    assert m.finish_time_s == pytest.approx(2 * (1e-3 + SYN_ALPHA))
    assert m.scratch_bytes == 25 * MB  # rank 1 holds a chunk that is not in its output


def test_switch_path_pays_alpha_once(topo):
    t = topo("dgx2")
    sw = t.ngpus  # the NVSwitch
    d = custom(16, [((0,), (1,))], 125 * MB)  # 1 ms at 125 GB/s
    m = simulate(t, schedule(d, [(0, 0, 1, (0, sw, 1))]))
    assert m.finish_time_s == pytest.approx(1e-3 + 0.7e-6)  # 0.35 + 0.35 us, once: not 1.4 us


def test_shared_nic_serializes_two_gpus(topo):
    t = topo("dgx2", 2)
    assert t.nic_of(0) is t.nic_of(1)  # GPUs 0 and 1 share a 12.5 GB/s NIC
    d = custom(32, [((0,), (16,)), ((1,), (17,))], 12.5 * MB)  # 1 ms each through the NIC
    p0, p1 = t.best_path(0, 16), t.best_path(1, 17)
    assert set(p0[1:-1]) & set(p1[1:-1])
    m = simulate(t, schedule(d, [(0, 0, 16, p0), (1, 1, 17, p1)]))
    nic_alpha = 2.6e-6
    assert m.ends[0] == pytest.approx(1e-3 + nic_alpha)
    assert m.starts[1] == pytest.approx(1e-3)
    assert m.finish_time_s == pytest.approx(2e-3 + nic_alpha)


def test_link_follows_schedule_order_even_if_a_later_transfer_is_ready_first(topo):
    t = topo("line:3")
    d = custom(3, [((0,), (2,)), ((1,), (2,))], 25 * MB)
    hop = 1e-3 + SYN_ALPHA
    # chunk 1 is ready at rank 1 at t=0 but comes after chunk 0's relay in the schedule
    late = simulate(t, schedule(d, [(0, 0, 1, (0, 1)), (0, 1, 2, (1, 2)), (1, 1, 2, (1, 2))]))
    assert late.starts[2] == pytest.approx(hop + 1e-3)
    assert late.finish_time_s == pytest.approx(hop + 2e-3 + SYN_ALPHA)
    early = simulate(t, schedule(d, [(0, 0, 1, (0, 1)), (1, 1, 2, (1, 2)), (0, 1, 2, (1, 2))]))
    assert early.starts[1] == 0.0
    assert early.finish_time_s == pytest.approx(2 * hop)


def test_gpu_may_send_a_chunk_on_several_links_at_once(topo):
    t = topo("fully-connected:4")
    d = make_demand("broadcast", 4, 25 * MB)
    m = simulate(t, schedule(d, [(0, 0, r, (0, r)) for r in (1, 2, 3)]))
    assert m.starts == (0.0, 0.0, 0.0)
    assert m.finish_time_s == pytest.approx(1e-3 + SYN_ALPHA)


def _hub(multicast):
    doc = synthetic_profile("hub-and-spoke", 3, "test")
    doc["switches"][0]["multicast"] = multicast
    return compose(doc)


def test_multicast_group_occupies_shared_links_once():
    t = _hub(True)
    sw = t.ngpus
    d = custom(3, [((0,), (1, 2))], 25 * MB)
    one = simulate(t, schedule(d, [(0, 0, 1, (0, sw, 1), False, 7), (0, 0, 2, (0, sw, 2), False, 7)]))
    assert one.finish_time_s == pytest.approx(1e-3 + SYN_ALPHA)
    two = simulate(t, schedule(d, [(0, 0, 1, (0, sw, 1)), (0, 0, 2, (0, sw, 2))]))
    assert two.finish_time_s == pytest.approx(2e-3 + SYN_ALPHA)  # no group: GPU 0's uplink twice


def test_multicast_group_refused_at_a_switch_that_cannot_copy():
    t = _hub(False)
    sw = t.ngpus
    d = custom(3, [((0,), (1, 2))], 25 * MB)
    with pytest.raises(ScheduleError, match=r"transfer 1: .*branches at switch, which cannot multicast"):
        simulate(t, schedule(d, [(0, 0, 1, (0, sw, 1), False, 0), (0, 0, 2, (0, sw, 2), False, 0)]))


# ---- reductions ---------------------------------------------------------------------------------


def test_reduction_chain_accumulates_in_schedule_order(topo):
    t = topo("line:3")
    d = make_demand("reduce", 3, 25 * MB, root=0)
    m = simulate(t, schedule(d, [(0, 2, 1, (2, 1), True), (0, 1, 0, (1, 0), True)]))
    assert m.finish_time_s == pytest.approx(2 * (1e-3 + SYN_ALPHA))
    # rank 1 forwarding before it received rank 2's part leaves rank 0 without it
    with pytest.raises(ScheduleError, match=r"chunk 0 at rank 0 lacks the contribution of rank \[2\]"):
        simulate(t, schedule(d, [(0, 1, 0, (1, 0), True), (0, 2, 1, (2, 1), True)]))


def test_copy_of_a_reduced_chunk_replaces_the_receivers_value(topo):
    t = topo("line:2")
    d = make_demand("allreduce", 2, 50 * MB)  # chunks 0, 1, each contributed by both ranks
    m = simulate(t, schedule(d, [(0, 1, 0, (1, 0), True), (1, 0, 1, (0, 1), True),
                                 (0, 0, 1, (0, 1)), (1, 1, 0, (1, 0))]))
    assert m.finish_time_s == pytest.approx(2 * (1e-3 + SYN_ALPHA))


def test_double_counted_contribution_is_refused(topo):
    t = topo("line:2")
    d = make_demand("reduce_scatter", 2, 50 * MB)
    twice = r"transfer 1: chunk 0 1->0: rank 0 would count the contribution of rank 1 twice"
    with pytest.raises(ScheduleError, match=twice):
        simulate(t, schedule(d, [(0, 1, 0, (1, 0), True), (0, 1, 0, (1, 0), True), (1, 0, 1, (0, 1), True)]))


def test_reduce_transfer_in_a_copy_demand_is_refused(topo):
    t = topo("line:2")
    d = make_demand("broadcast", 2, 25 * MB)
    with pytest.raises(ScheduleError, match=r"transfer 0: .*reduce transfer in a non-reduction demand"):
        simulate(t, schedule(d, [(0, 0, 1, (0, 1), True)]))


# ---- refusals -----------------------------------------------------------------------------------


def test_forwarding_before_holding_is_a_causality_violation(topo):
    t = topo("line:3")
    d = custom(3, [((0,), (2,))], 25 * MB)
    with pytest.raises(ScheduleError, match=r"^transfer 0: chunk 0 1->2: rank 1 does not hold chunk 0"):
        simulate(t, schedule(d, [(0, 1, 2, (1, 2)), (0, 0, 1, (0, 1))]))


def test_unmet_need_is_named(topo):
    t = topo("fully-connected:4")
    d = make_demand("allgather", 4, 4 * MB)  # chunk s starts at rank s
    full = [(s, s, r, (s, r)) for s in range(4) for r in range(4) if r != s]
    assert simulate(t, schedule(d, full)).finish_time_s == pytest.approx(MB / SYN_BW + SYN_ALPHA)  # three links at once
    missing = [m for m in full if (m[0], m[2]) != (2, 1)]
    with pytest.raises(ScheduleError, match=r"^schedule: chunk 2 never reaches rank 1$"):
        simulate(t, schedule(d, missing))


@pytest.mark.parametrize("path,why", [
    ((0, 2), r"uses link 0->2, which line:3 lacks"),
    ((0, 1, 2), r"passes through vertex 1, which is not a switch"),
    ((1, 2), r"does not run from rank 0 to rank 2"),
])
def test_bad_paths_are_refused(topo, path, why):
    t = topo("line:3")
    d = custom(3, [((0,), (2,))], 25 * MB)
    with pytest.raises(ScheduleError, match=r"^transfer 0: chunk 0 0->2: path .*" + why):
        simulate(t, schedule(d, [(0, 0, 2, path)]))


def test_unknown_chunk_is_refused(topo):
    t = topo("line:2")
    d = make_demand("broadcast", 2, 25 * MB)
    with pytest.raises(ScheduleError, match=r"chunk 5 is not in the broadcast demand"):
        simulate(t, schedule(d, [(5, 0, 1, (0, 1))]))


def test_schedule_error_is_a_one_line_compile_error(topo):
    t = topo("line:3")
    d = custom(3, [((0,), (2,))], 25 * MB)
    with pytest.raises(CompileError) as e:
        simulate(t, schedule(d, [(0, 1, 2, (1, 2))]))
    assert "\n" not in str(e.value)


# ---- swaps ----------------------------------------------------------------------------------------


def test_a_swap_sends_each_rank_the_others_value_before_the_swap(topo):
    """Two ranks that swap their partial sums both end with the sum; the same two reduce transfers
    without `swap` count the first one's contribution twice; a swap interrupted by another transfer
    of its chunk, or a swap that is no reduce transfer, is refused."""
    from dataclasses import replace
    t = topo("line:3")
    d = custom(3, [((0, 1, 2), (0, 1, 2))], MB, reduce=True)
    up = (0, 2, 1, (2, 1), True)  # rank 2 adds its contribution into rank 1 first
    pair = [(0, 0, 1, (0, 1), True, -1, False, True), (0, 1, 0, (1, 0), True, -1, False, True)]
    down = (0, 1, 2, (1, 2))
    s = schedule(d, [up] + pair + [down])
    m = simulate(t, s)
    assert m.finish_time_s > 0
    with pytest.raises(ScheduleError, match="twice"):
        simulate(t, replace(s, transfers=tuple(replace(x, swap=False) for x in s.transfers)))
    with pytest.raises(ScheduleError, match="swap"):
        simulate(t, schedule(d, [up, pair[0], down, pair[1]]))
    with pytest.raises(ScheduleError, match="swap"):
        simulate(t, schedule(d, [up, (0, 0, 1, (0, 1), False, -1, False, True), pair[1], down]))
    assert [Transfer.from_list(x.to_list()) for x in s.transfers] == list(s.transfers)
