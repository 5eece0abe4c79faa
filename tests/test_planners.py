"""MILP, LP, reversal and auto, judged from outside: hand-computed optima, the simulator, the bound."""

import pytest

from compiler.analysis.bounds import bound_for
from compiler.model.demand import make_demand
from compiler.specs.errors import CompileError, InfeasibleError
from compiler.planners import PlanOptions, plan
from compiler.planners import milp
from compiler.model.profiles import compose, load_topology, synthetic_profile
from compiler.analysis.simulate import simulate
from compiler.model.timing import expand

GB = 10**9
FAST = PlanOptions(time_limit=30, warm_start=False)


def tiny(kind, n):
    return compose(synthetic_profile(kind, n, "test"))


def planned(topo, coll, chunks=1, method="milp", root=None, size=GB, **kw):
    demand = make_demand(coll, topo.ngpus, size, chunks, root)
    options = PlanOptions(method=method, time_limit=kw.pop("time_limit", 30), warm_start=kw.pop("warm_start", False), **kw)
    schedule = plan(topo, demand, options)
    return demand, schedule, simulate(topo, schedule)


# (topology, collective, chunks, optimal epochs): each worked out by hand from the links
KNOWN_OPTIMA = [
    ("fully-connected", 4, "allgather", 1, 1),  # every pair has its own link
    ("line", 4, "allgather", 1, 3),  # 3 chunks must cross the middle links one per epoch
    ("ring", 4, "allgather", 2, 3),  # 6 half-chunks arrive over 2 in-links
    ("star", 4, "allgather", 1, 3),  # a leaf's single link brings 3 chunks
    ("star", 4, "broadcast", 1, 2),  # from leaf 1: to the centre, then to the other leaves
    ("hub-and-spoke", 4, "alltoall", 1, 3),  # each GPU sends 3 chunks through one uplink
]


@pytest.mark.parametrize("kind,n,coll,chunks,epochs", KNOWN_OPTIMA, ids=[f"{k}{n}-{c}" for k, n, c, _, _ in KNOWN_OPTIMA])
def test_milp_finds_known_optima(kind, n, coll, chunks, epochs):
    topo = tiny(kind, n)
    root = 1 if coll == "broadcast" else None
    demand, s, m = planned(topo, coll, chunks, root=root)
    assert s.epochs == epochs
    assert s.status == "optimal"
    # the simulator agrees with the epoch count: every epoch is one chunk time on a 25 GB/s link
    chunk_time = demand.chunk_bytes / 25e9
    assert m.finish_time_s == pytest.approx(epochs * chunk_time, rel=1e-3)


def test_milp_schedules_are_complete_causal_and_never_below_the_bound():
    for name, coll, chunks in (("dgx2", "allgather", 1), ("dgx-a100", "allgather", 1), ("mi250", "allgather", 2),
                               ("dgx1", "broadcast", 2), ("mi300x", "alltoall", 1)):
        topo = load_topology(name)
        demand, s, m = planned(topo, coll, chunks)
        assert m.bound_ratio <= 1 + 1e-9
        assert len({(t.chunk, t.dst) for t in s.transfers}) == len(s.transfers)  # nobody receives twice
        if coll == "allgather":  # an allgather delivers exactly N(N-1)C chunks (te-ccl-model.md §3.2)
            assert len(s.transfers) == topo.ngpus * (topo.ngpus - 1) * chunks


def test_milp_never_slower_than_the_ring():
    for name, coll, chunks in (("ring:6", "allgather", 1), ("dgx1", "allgather", 2), ("mi250", "allgather", 1),
                               ("fully-connected:4", "alltoall", 2)):
        topo = load_topology(name)
        _, _, ring = planned(topo, coll, chunks, method="ring")
        _, _, exact = planned(topo, coll, chunks, method="milp")
        assert exact.finish_time_s <= ring.finish_time_s * (1 + 1e-6), name


def test_one_dgx2_allgather_reaches_the_bound():
    _, s, m = planned(load_topology("dgx2"), "allgather")
    assert m.bound_ratio >= 0.99


def test_horizon_grows_from_the_bound_until_feasible():
    topo = load_topology("dgx1")
    demand = make_demand("broadcast", 8, GB, 4, root=0)
    te = expand(topo, demand)
    lower = max(1, -(-int(bound_for(topo, demand).bandwidth_s * 1e9) // int(te.tau * 1e9)))
    s = plan(topo, demand, PlanOptions(method="milp", time_limit=30, warm_start=False))
    assert s.epochs > lower  # the bound's horizon was too short
    # judged independently: one epoch less is infeasible, the chosen horizon is feasible
    from compiler.planners.highs import solve
    below = milp.build(topo, demand, te, s.epochs - 1, False)
    assert not solve(below.problem, time_limit=30).has_solution
    assert "infeasible" in s.notes[0]


def test_max_horizon_below_the_bound_is_a_clear_error():
    topo = load_topology("dgx2")
    with pytest.raises(InfeasibleError, match="max_horizon=3 epochs is below the lower bound of 15"):
        planned(topo, "allgather", max_horizon=3)


def test_reductions_are_time_reversed_duals():
    topo = load_topology("dgx-a100")
    for coll in ("reduce_scatter", "reduce", "allreduce"):
        demand, s, m = planned(topo, coll, root=2 if coll == "reduce" else None)
        assert all(t.reduce for t in s.transfers) or coll == "allreduce"
        assert m.bound_ratio <= 1 + 1e-9
    _, s, m = planned(topo, "reduce_scatter")
    assert m.bound_ratio >= 0.99  # reversed optimal allgather is optimal on a switch


def test_lp_rounding_meets_every_demand_and_reports_both_values():
    for name in ("mi250", "dgx1", "hub-and-spoke:4"):
        topo = load_topology(name)
        for coll in ("alltoall", "scatter", "gather"):
            demand, s, m = planned(topo, coll, method="lp", root=0 if coll != "alltoall" else None)
            assert s.lp_value is not None and s.lp_value > 0
            # the LP is fluid: its value is never above what an executable schedule achieves
            assert s.lp_value <= m.finish_time_s * (1 + 1e-9)
            assert s.lp_value >= bound_for(topo, demand).bandwidth_s * (1 - 1e-6)
            assert m.bound_ratio <= 1 + 1e-9


def test_the_lp_horizon_search_starts_where_the_farthest_pair_can_first_be_reached():
    """DGX-2 x 2 alltoall 16 KB is bound by alpha, not bandwidth: the LP one epoch short of its
    reach (the flows' own distances) is infeasible, so the search starts at the reach, not at the
    bandwidth bound's far shorter horizon, and still ends at a feasible one."""
    from compiler.planners.lp import FluidModel, fluid_expansion, reach_epochs
    topo = load_topology("dgx2", 2)
    demand = make_demand("alltoall", topo.ngpus, 16 * 10**3)
    te = fluid_expansion(topo, demand, bound_for(topo, demand).time_s)
    reach = reach_epochs(topo, demand, te)
    assert reach > bound_for(topo, demand).bandwidth_s / te.tau
    assert not FluidModel(topo, demand, te, reach - 1).solve(30, False).has_solution
    _, s, m = planned(topo, "alltoall", method="lp", size=16 * 10**3)
    tried = next(n for n in s.notes if "horizons tried" in n).split("horizons tried ")[1].split(", ")
    assert int(tried[0]) == reach and s.lp_value >= reach * te.tau * (1 - 1e-9)


def test_the_lp_tries_a_horizon_whose_model_fits_the_time_left_and_no_other(monkeypatch):
    """With under half a second left, DGX-1 alltoall's LP (2168 flow variables, about 0.2 s) is
    still solved: a fixed half-second floor left it out at --time-limit 5 in about half the runs,
    and auto wrote ring's program at 0.42 of the floor instead of lp's at 0.82. DGX-2 x 2's (12408
    flows, about 2 s) is refused with a second left, before its model is built: it could only
    end past the deadline."""
    import time
    from compiler.planners import lp
    dgx1 = load_topology("dgx1")
    small = make_demand("alltoall", dgx1.ngpus, 32 * 10**6)
    plan(dgx1, small, PlanOptions(method="lp", time_limit=30))  # cvxpy and HiGHS loaded: what is timed is the LP
    tried = []
    init = lp.FluidModel.__init__
    monkeypatch.setattr(lp.FluidModel, "__init__", lambda self, *a, **k: tried.append(a) or init(self, *a, **k))
    try:  # solved in about 0.2 s on a quiet machine; on a loaded one it may run out of its 0.45 s, but it is tried
        s = plan(dgx1, small, PlanOptions(method="lp", time_limit=30, deadline=time.perf_counter() + 0.45,
                                          fallback=False))
        assert s.status == "rounded" and simulate(dgx1, s).bound_ratio > 0.7
    except InfeasibleError as e:
        assert "stopped without a solution" in str(e), e
    assert tried
    built = []
    monkeypatch.setattr(lp.FluidModel, "__init__", lambda self, *a, **k: built.append(a))
    dgx2 = load_topology("dgx2", 2)
    with pytest.raises(InfeasibleError, match="no horizon tried: 12408 flow variables"):
        plan(dgx2, make_demand("alltoall", dgx2.ngpus, GB), PlanOptions(method="lp", time_limit=30,
                                                                        deadline=time.perf_counter() + 1.0,
                                                                        fallback=False))
    assert not built


def test_an_allreduce_past_its_deadline_gives_its_phases_no_time_not_less():
    """A failure of the reduce-scatter phase names its time limit: 0, not a negative one."""
    import time
    from compiler.planners.reductions import AllreducePhases, Problem
    t = tiny("fully-connected", 4)
    options = PlanOptions(method="milp", time_limit=5, deadline=time.perf_counter() - 0.3, fallback=False)
    (first, second), _ = AllreducePhases().apply(Problem(t, make_demand("allreduce", 4, GB), options))
    assert first.options.time_limit == 0.0 and first.options.deadline <= time.perf_counter()
    with pytest.raises(InfeasibleError, match="time_limit=0 s"):
        plan(t, make_demand("allreduce", 4, GB), options)


def test_lp_refuses_copies():
    with pytest.raises(CompileError, match="lp: allgather copies chunks"):
        planned(load_topology("dgx2"), "allgather", method="lp")


@pytest.mark.parametrize("coll", ["reduce", "reduce_scatter"])
def test_lp_refuses_reductions_in_words_a_user_knows(coll):
    """A reduction reaches the LP as its copy dual: the error named it "dual-reduce" and said it
    copies chunks; it says the reduction sums chunks, which the LP cannot plan, and what can."""
    with pytest.raises(CompileError) as e:
        planned(load_topology("dgx1"), coll, method="lp", size=2**20)
    assert str(e.value).startswith(f"lp: {coll} sums chunks from several ranks, which the LP cannot plan")
    assert "`method=milp`, ring or auto" in str(e.value) and "dual" not in str(e.value)


def test_auto_explains_its_choice_and_is_the_fastest_candidate():
    topo = load_topology("mi250")
    demand, s, m = planned(topo, "allgather", method="auto", time_limit=30)
    assert s.notes[0].startswith("auto chose ")
    _, _, ring = planned(topo, "allgather", method="ring")
    assert m.finish_time_s <= ring.finish_time_s


def test_auto_solves_in_windows_when_the_exact_model_fails(monkeypatch):
    from compiler.planners.registry import PLANNERS

    def too_big(topo, demand, options):
        raise InfeasibleError("milp: no schedule found (test)")

    monkeypatch.setitem(PLANNERS, "milp", too_big)
    topo = load_topology("dgx1")
    demand, s, m = planned(topo, "allgather", method="auto", time_limit=20, refine=False)
    assert "milp at 1x: milp: no schedule found (test)" in " ".join(s.notes)
    assert "rounds" in s.notes[0]  # a candidate the simulator judged
    _, _, ring = planned(topo, "allgather", method="ring")
    assert m.finish_time_s <= ring.finish_time_s


def test_auto_plans_relay_where_the_optimisers_it_was_left_out_for_plan_nothing(monkeypatch):
    """On one DGX-1 relay is left out where ring and an optimiser are candidates; where the
    optimisers then plan nothing (here they fail; at --time-limit 2 the limit came first), relay
    is planned after all: ring/1ch, all that was left at 2 s, was written at 0.195 of the floor,
    relay's program is 0.452. Where the LP plans, relay stays out."""
    from compiler.planners.auto import RELAY_FOR_OPTIMISERS
    from compiler.planners.registry import PLANNERS, get

    def fails(topo, demand, options):
        raise InfeasibleError("no schedule (test)")

    topo = load_topology("dgx1")
    _, s, _ = planned(topo, "alltoall", method="auto", time_limit=20, refine=False, size=32 * 10**6)
    assert s.planner == "lp" and RELAY_FOR_OPTIMISERS in " ".join(s.notes)
    for method in ("lp", "milp", "rounds"):
        get(method)
        monkeypatch.setitem(PLANNERS, method, fails)
    _, s, m = planned(topo, "alltoall", method="auto", time_limit=20, refine=False, size=32 * 10**6)
    assert s.planner == "relay" and RELAY_FOR_OPTIMISERS not in " ".join(s.notes)
    _, _, ring = planned(topo, "alltoall", method="ring", size=32 * 10**6)
    assert m.finish_time_s < 0.5 * ring.finish_time_s


def test_auto_cuts_chunks_into_the_nearest_count_of_whole_elements(monkeypatch):
    """10^6 bytes of int8 on DGX-2 x 2: chunks of 31,250 bytes, which 4 and 8 sub-chunks would split.
    auto tries 5 and 10 instead (the nearest counts that do not), rather than stopping at 2; a size
    every count divides keeps 1, 2, 4, 8, and one none divides keeps the count (to say why)."""
    from compiler.planners.auto import REFINEMENTS, whole_parts
    from compiler.planners.registry import PLANNERS
    assert [whole_parts(31_250, p, 1) for p in REFINEMENTS] == [1, 2, 5, 10]
    assert [whole_parts(1 << 15, p, 4) for p in REFINEMENTS] == list(REFINEMENTS)
    assert whole_parts(31, 2, 1) == 2  # 31 bytes: no count in (1, 4) divides them

    def refused(topo, demand, options):
        raise InfeasibleError("no schedule (test)")
    for method in ("milp", "rounds"):
        monkeypatch.setitem(PLANNERS, method, refused)
    topo = load_topology("dgx2", 2)
    s = plan(topo, make_demand("allgather", topo.ngpus, 10**6),
             PlanOptions(method="auto", time_limit=20, element_bytes=1, refine=True))
    notes = " ".join(s.notes)
    assert "hier/5ch" in notes and "hier/10ch" in notes and "not whole" not in notes


def test_auto_goes_past_a_chunking_that_splits_elements_to_one_that_does_not(monkeypatch):
    """10^6 bytes of float32 on DGX H100 x 2: chunks of 62,500 bytes (15,625 elements), which 2
    sub-chunks would split; the 4x and 8x refinements become 5x (whole_parts). auto says why it
    leaves 2x out and still plans 5x, rather than stopping at the first chunking that splits."""
    from compiler.planners.auto import REFINEMENTS, whole_parts
    from compiler.planners.registry import PLANNERS
    assert [whole_parts(62_500, p, 4) for p in REFINEMENTS] == [1, 2, 5, 5]

    def refused(topo, demand, options):
        raise InfeasibleError("no schedule (test)")
    for method in ("milp", "rounds", "lp"):
        monkeypatch.setitem(PLANNERS, method, refused)
    topo = load_topology("dgx-h100", 2)
    s = plan(topo, make_demand("allgather", topo.ngpus, 10**6), PlanOptions(method="auto", time_limit=20, refine=True))
    notes = " ".join(s.notes)
    assert "2x finer chunks (31250 B is not whole 4-byte elements)" in notes and "hier/5ch" in notes


def test_impossible_demands_are_clear_errors(tmp_path):
    import json
    from tests.conftest import run_cli
    one_way = {**synthetic_profile("line", 3, "t"), "name": "oneway",
               "links": [{"ends": [0, 1], "bandwidth_GBps": 1, "alpha_us": 1, "duplex": False},
                         {"ends": [1, 2], "bandwidth_GBps": 1, "alpha_us": 1}]}
    path = tmp_path / "oneway.json"
    path.write_text(json.dumps(one_way))
    proc = run_cli("allgather", "--hw", path)
    assert proc.returncode == 2 and "disconnected GPUs" in proc.stderr, proc.stderr
    assert proc.stderr.count("\n") == 1
    for args, needle in ((("broadcast", "--hw", "dgx2", "--root", "16"), "--root 16: out of range"),
                         (("allgather", "--hw", "dgx2", "--size", "0"), "must be positive"),
                         (("allgather", "--hw", "dgx2", "--root", "1"), "--root 1 (allgather has no root")):
        proc = run_cli(*args)
        assert proc.returncode == 2 and needle in proc.stderr and proc.stderr.count("\n") == 1, proc.stderr


@pytest.mark.parametrize("method", ["milp", "rounds", "auto"])
def test_reduction_with_single_contributors_plans(method):
    """A reduction chunk whose only contributor is its owner has nothing to reduce-scatter: that
    phase moves nothing and must not be planned over 0 epochs (it was an error for the MILP)."""
    from compiler.model.demand import Chunk, Demand
    from compiler.lowering.lower import LowerOptions, lower
    from compiler.program.verify import verify
    topo = tiny("ring", 4)
    # the README's custom example with "reduce": true: every chunk has one contributor
    chunks = (Chunk(0, (0,), (1, 2), (0,), (0, 0)), Chunk(1, (3,), (0,), (0,), (0,)))
    demand = Demand("custom", 4, chunks, 1e6, int(2e6), 1, True, None, 1, 1)
    schedule = plan(topo, demand, PlanOptions(method=method, time_limit=10, refine=False))
    assert simulate(topo, schedule).finish_time_s > 0  # the simulator refuses unmet needs
    v = verify(lower(schedule, topo, LowerOptions(runtime="old")), "old", demand)
    assert v.ok, v.summary()  # every destination ends with the full sum of its chunk


def test_auto_says_a_reason_shared_by_candidates_once():
    from compiler.planners.auto import WRITTEN, _same_reasons_once
    why = "--instances: 7 cuts the buffer into chunks that split 4-byte elements"
    failed = [f"milp at 2x{WRITTEN}{why}", "lp: no schedule within 9 epochs", f"milp at 4x{WRITTEN}{why}",
              f"hier at 1x{WRITTEN}rank 0 needs 99 thread blocks"]
    said = _same_reasons_once(failed)
    assert said == [f"milp at 2x, milp at 4x{WRITTEN}{why}", "lp: no schedule within 9 epochs",
                    f"hier at 1x{WRITTEN}rank 0 needs 99 thread blocks"]
    assert "; ".join(said).count(why) == 1


def test_no_copy_leaves_a_node_through_the_network_and_comes_back(topo):
    """The network constraint refuses a chunk sent into the network by node 0 and out of it into
    node 0 again (topology.paths never offers that route), and allows the same copy into node 1;
    extraction re-pairs two such round trips of one chunk and epoch into two crossings."""
    import numpy as np
    from compiler.model.schedule import Transfer
    from compiler.planners.constraints import network_sends_a_node_what_other_nodes_sent
    from compiler.planners.flows import Flows, link_ends
    t = topo("dgx-h100", 2)
    v = t.vertex_id
    link = lambda a, b: next(i for i, l in enumerate(t.links) if (l.src, l.dst) == (v(a), v(b)))  # noqa: E731
    l_src, l_dst = link_ends(t)
    for into, ok in (("nic1.rx@0", False), ("nic1.rx@1", True)):
        ls = [link("gpu0", "nic0.tx@0"), link("nic0.tx@0", "network"), link("network", into)]
        flows = Flows(np.zeros(3, dtype=np.int64), np.array(ls), np.zeros(3, dtype=np.int64))
        (m,) = network_sends_a_node_what_other_nodes_sent(t, flows, l_src, l_dst, np.ones(3))
        assert bool(np.all(m)) == ok, into
    te = expand(t, make_demand("broadcast", 16, 2**20, 1, 0))
    route = lambda *names: tuple(v(n) for n in names)  # noqa: E731
    loops = [Transfer(0, 0, 1, route("gpu0", "nic0.tx@0", "network", "nic1.rx@0", "gpu1"), 0, 1),
             Transfer(0, 8, 9, route("gpu8", "nic0.tx@1", "network", "nic1.rx@1", "gpu9"), 0, 1)]
    fixed = milp._without_round_trips(loops, t, te)
    assert [(x.src, x.dst) for x in fixed] == [(0, 9), (8, 1)]
    assert all(x.path in t.paths(x.src, x.dst) and x.arrive == x.start + te.path_arrival(t, x.path) for x in fixed)


def test_the_lp_route_walk_never_comes_back_through_the_network(topo):
    """The LP's flows summed over epochs: rank 0's data into the network from node 0 and out of it
    into node 0 and into node 1. Its route to rank 9 crosses; its route to rank 1 does not come back
    through the network (topology.paths has no such route: lowering refuses it) but goes the direct
    way inside node 0 (the old walk routed it gpu0 -> network -> gpu1)."""
    from types import SimpleNamespace
    import numpy as np
    from compiler.planners import lp
    from compiler.planners.flows import Flows
    t = topo("dgx-h100", 2)
    v = t.vertex_id
    link = lambda a, b: next(i for i, l in enumerate(t.links) if (l.src, l.dst) == (v(a), v(b)))  # noqa: E731
    ls = [link("gpu0", "nic0.tx@0"), link("nic0.tx@0", "network"), link("network", "nic1.rx@0"),
          link("nic1.rx@0", "gpu1"), link("network", "nic1.rx@1"), link("nic1.rx@1", "gpu9")]
    flows = Flows(np.zeros(6, dtype=np.int64), np.array(ls), np.zeros(6, dtype=np.int64))
    amount = np.zeros((1, t.ngpus))
    amount[0, [1, 9]] = 1.0
    model = SimpleNamespace(flows=flows, f=SimpleNamespace(value=np.array([2.0, 2.0, 1.0, 1.0, 1.0, 1.0])),
                            sources=np.array([0]), amount=amount, horizon=4, sym=None)
    got = lp.routes(model, t)
    assert [p for p, _, _ in got[(0, 9)]] == [tuple(v(n) for n in ("gpu0", "nic0.tx@0", "network", "nic1.rx@1", "gpu9"))]
    ((to_1, chunks, _),) = got[(0, 1)]
    assert v("network") not in to_1 and to_1 in t.paths(0, 1) and chunks == 1.0


@pytest.mark.parametrize("method", ["milp", "lp"])
def test_an_optimiser_out_of_time_keeps_a_baseline_where_direct_does_not_reach(method):
    """On a line no GPU pair but neighbours is one transfer apart and no ring runs through it:
    `direct`, `ring` and `hier` all refuse, so an optimiser out of time used to fail ("direct:
    rank 5 cannot reach rank 0") where the README promises it keeps the best baseline; `relay`
    plans there."""
    topo = tiny("line", 6)
    demand, s, m = planned(topo, "alltoall", method=method, size=10**6, time_limit=0.01)
    assert s.planner == "relay"
    assert any("kept the relay baseline" in n for n in s.notes)
    assert 0 < m.bound_ratio <= 1 + 1e-9


def test_auto_plans_a_quick_constructive_candidate_in_the_last_second(topo):
    """With less than a second of planning left, auto left out every candidate after the first, the
    constructive ones too, which plan in milliseconds: a 2-GPU allreduce of 4 KB at 0.9 s kept
    direct (its ideal program 9.5 us) and left out oneshot (8.2 us, the floor). An optimiser still
    needs its second; a constructive method needs twice the longest constructive plan so far."""
    from compiler.analysis.simulate import simulate
    t = topo("line:2")
    demand = make_demand("allreduce", 2, 4000)
    s = plan(t, demand, PlanOptions(method="auto", time_limit=0.9))
    assert s.planner == "oneshot" and not any("oneshot at 1x (time limit reached)" in n for n in s.notes), s.notes
    direct = plan(t, demand, PlanOptions(method="direct"))
    assert simulate(t, s).finish_time_s < simulate(t, direct).finish_time_s  # the judge: oneshot is faster
