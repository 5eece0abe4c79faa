"""The rounds (time-partitioned, A*-style) planner, judged from outside: the simulator, the bound,
the ring baseline, and the concatenation of its windows."""

import pytest

from compiler.model.demand import make_demand
from compiler.planners import PlanOptions, plan
from compiler.planners.rounds import plan_rounds, window_length
from compiler.planners.flows import capacity_violations
from compiler.model.profiles import compose, load_topology, synthetic_profile
from compiler.analysis.simulate import simulate
from compiler.model.timing import expand

GB = 10**9


def rounds(topo, coll, chunks=1, time_limit=20, window=None, root=None, **kw):
    demand = make_demand(coll, topo.ngpus, GB, chunks, root)
    options = PlanOptions(method="rounds", time_limit=time_limit, **kw)
    schedule = plan_rounds(topo, demand, options, window) if window else plan(topo, demand, options)
    return demand, schedule, simulate(topo, schedule)


def windows_of(schedule):
    return int(schedule.notes[0].split("rounds: ")[1].split(" windows")[0])


def test_window_is_at_least_15_epochs_and_twice_the_slowest_arrival():
    for name, nodes in (("dgx2", 1), ("dgx2", 2), ("dgx-a100", 2)):
        topo = load_topology(name, nodes)
        te = expand(topo, make_demand("allgather", topo.ngpus, GB))
        assert window_length(te) == max(15, 2 * max(te.arrival))
    assert window_length(expand(load_topology("dgx2", 2), make_demand("allgather", 32, GB))) == 20  # IB: 10 epochs


@pytest.mark.parametrize("name,chunks", [("ring:6", 1), ("dgx1", 2), ("mi250", 1), ("dgx2", 1)])
def test_complete_causal_within_the_bound_and_never_slower_than_the_ring(name, chunks):
    topo = load_topology(name)
    demand, s, m = rounds(topo, "allgather", chunks)  # simulate() raises on an incomplete or acausal schedule
    assert s.planner == "rounds" and s.status in ("feasible", "time_limit")
    assert m.bound_ratio <= 1 + 1e-9
    assert len(s.transfers) == topo.ngpus * (topo.ngpus - 1) * chunks  # every need met once, nothing relayed twice
    ring = simulate(topo, plan(topo, demand, PlanOptions(method="ring")))
    assert m.finish_time_s <= ring.finish_time_s * (1 + 1e-6)


def test_all_windows_are_concatenated_with_absolute_epochs():
    # te-ccl-model.md §8 pitfall 3: TE-CCL wrote out only the last round
    topo = load_topology("dgx2")
    demand, s, m = rounds(topo, "allgather", chunks=2)  # 30 epochs: more than one 15-epoch window
    length = window_length(expand(topo, demand))
    assert s.epochs > length
    n = windows_of(s)
    assert n >= 2
    for w in range(n - 1):  # every window but possibly the last (look-ahead) starts transfers
        assert any(w * length <= t.start < (w + 1) * length for t in s.transfers), w
    assert len(s.transfers) == 16 * 15 * 2
    assert len({(t.chunk, t.dst) for t in s.transfers}) == len(s.transfers)
    assert m.bound_ratio >= 0.95


def test_slow_transfers_in_flight_across_windows_keep_capacity():
    # a 5 GB/s link holds a chunk for 5 epochs; 6-epoch windows force copies in flight and link
    # occupancy across every boundary, without symmetry so the state covers every chunk
    prof = synthetic_profile("line", 3, "test")
    prof["links"][0]["bandwidth_GBps"] = 5  # GPU 0 <-> GPU 1: 4 chunks one way, 2 the other
    topo = compose(prof)
    demand, s, m = rounds(topo, "allgather", 2, window=6, symmetry=False)
    te = expand(topo, demand)
    assert max(te.window) == 5 and windows_of(s) >= 3
    assert s.epochs >= 20 and m.bound_ratio <= 1 + 1e-9
    assert any(t.start // 6 != t.arrive // 6 and t.arrive % 6 for t in s.transfers)  # landed in a later window
    assert capacity_violations(topo, te, s.transfers) == []
    assert len(s.transfers) == 3 * 2 * 2
    assert "no symmetry used" in s.notes


def test_multi_node_with_symmetry():
    topo = load_topology("dgx2", 2)
    demand, s, m = rounds(topo, "allgather", time_limit=30)
    assert any(n.startswith("symmetry:") for n in s.notes)
    assert len(s.transfers) == 32 * 31
    assert m.bound_ratio >= 0.95  # the bound cannot quite be reached (IB chunk times); the MILP reaches 0.983


def test_reductions_and_demands_without_copies_go_through_the_normal_dispatch():
    topo = load_topology("dgx1")
    _, s, m = rounds(topo, "reduce_scatter", 2)
    assert all(t.reduce for t in s.transfers) and m.bound_ratio <= 1 + 1e-9
    _, s, m = rounds(load_topology("mi300x"), "alltoall")
    assert m.bound_ratio <= 1 + 1e-9 and s.planner == "rounds"


def test_an_exhausted_time_limit_still_ends_with_greedy_windows():
    """A limit spent before the first window (a loaded machine, a slow import) gives a complete
    schedule from the greedy windows alone, judged by the simulator, with the bound above it."""
    topo = load_topology("dgx2", 2)
    demand, s, m = rounds(topo, "allgather", time_limit=0.01)  # simulate() raises if incomplete
    windows = windows_of(s)
    assert s.status == "time_limit" and f"{windows} windows kept the greedy schedule" in s.notes[0]
    assert 0 < m.bound_ratio <= 1 + 1e-9


def test_greedy_windows_that_cannot_relay_keep_a_baseline():
    """DGX-1's GPU 2 has no link to three GPUs: a gather to it needs relays through GPUs that do
    not need the chunks, which the greedy windows (out of time) never send, so rounds stalled
    ("no progress in 2 windows in a row; 3 deliveries cannot be made") where it promises to end.
    It now keeps a baseline, as milp and lp do."""
    topo = load_topology("dgx1")
    demand = make_demand("gather", 8, 10**6, 1, 2)
    s = plan(topo, demand, PlanOptions(method="rounds", time_limit=0.01))
    assert any("kept the" in n and "baseline" in n for n in s.notes)
    assert 0 < simulate(topo, s).bound_ratio <= 1 + 1e-9
    with pytest.raises(Exception, match="no progress"):
        plan(topo, demand, PlanOptions(method="rounds", time_limit=0.01, fallback=False))
