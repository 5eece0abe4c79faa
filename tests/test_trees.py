"""The trees planner: a multicast flow LP, spanning trees cut from its loads, chunks pipelined down
them. Judged by the cut bound, the simulator and the program timer, never by its own numbers."""

import time

import pytest

from compiler.analysis.bounds import bound_for
from compiler.analysis.simulate import bound_of, program_floor, simulate
from compiler.lowering.lower import LowerOptions
from compiler.model.demand import make_demand
from compiler.planners import PlanOptions, plan
from compiler.planners.auto import REFINEMENTS, TREE_PARTS, Search, candidates
from compiler.planners.trees import multicast_loads
from compiler.program.verify import verify
from compiler.realise import realise
from compiler.specs.errors import CompileError

GB = 10**9


def _allgather_loads(t):
    n = t.ngpus
    return multicast_loads(t, {s: 1.0 for s in range(n)}, {s: set(range(n)) - {s} for s in range(n)})


@pytest.mark.parametrize("hw", ["mi250", "dgx1"])
def test_the_multicast_flow_lp_is_a_lower_bound_at_least_the_cut_bound(topo, hw):
    """The LP's time (one unit of data per source, over the links' bandwidth) is a lower bound on any
    copy schedule; it can only be tighter than the cut bound. On MI250 they are equal (3.0 ms at
    1 GB): the loss of the old plans was in routing, not in a loose bound."""
    t = topo(hw)
    fluid, loads = _allgather_loads(t)
    top = max(l.bandwidth * l.count for l in t.links)
    fluid_s = fluid * (GB / t.ngpus) / top
    cut_s = bound_for(t, make_demand("allgather", t.ngpus, GB)).bandwidth_s
    assert fluid_s >= cut_s * (1 - 1e-6)
    if hw == "mi250":
        assert fluid_s == pytest.approx(cut_s, rel=1e-6)
    for s, load in loads.items():  # every load runs on a link of the topology, from the source outwards
        assert all(t.has_link(a, b) for a, b in load) and any(a == s for a, _ in load)


def test_trees_deliver_every_chunk_and_pipeline_toward_the_bound(topo):
    """MI250 allgather 1 GB: the simulator (which refuses a schedule that leaves a need undelivered)
    finds the trees schedule closer to the bound the more chunks it pipelines, past 0.9 at 16."""
    t = topo("mi250")
    ratios = []
    for chunks in (1, 4, 16):
        s = plan(t, make_demand("allgather", t.ngpus, GB, chunks), PlanOptions(method="trees"))
        assert s.planner == "trees"
        ratios.append(simulate(t, s, "Simple").bound_ratio)
    assert ratios == sorted(ratios) and ratios[-1] > 0.9


@pytest.mark.parametrize("size, chunks, ratio", [(1_024_000_000, 20, 0.95), (GB, 20, 0.9), (GB, 25, 0.95)])
def test_the_trees_program_reaches_095_of_the_program_floor_on_mi250(topo, size, chunks, ratio):
    """MI250 allgather: realise finds a program for RCCL that verifies, whose chunks are whole
    elements at the size, and that the timer puts at >= 0.95 of the program floor where the size
    splits evenly over 8 instances (20 chunks per rank at 1.024 x 10^9 bytes, 25 at 10^9; the
    rounds plan's program: 0.874). In 20 chunks at 10^9 bytes (2^7 x 5^9 float32 elements) 8
    instances would split elements, and the counts that divide reach about 0.92."""
    t = topo("mi250")
    d = make_demand("allgather", t.ngpus, size, chunks)
    s = plan(t, d, PlanOptions(method="trees"))
    r = realise(s, t, LowerOptions(proto="auto", instances=0), "rccl")
    assert verify(r.program, "rccl", d.split(r.instances), t.sms).ok
    assert (size // 4) % r.program.nchunksperloop == 0
    assert program_floor(t, bound_of(t, d)) / r.timing.finish_time_s >= ratio


def test_auto_plans_trees_only_where_they_apply(topo):
    """A candidate of auto for copies on one node of direct links, not for NVSwitch or several nodes,
    nor for a demand without copies."""
    assert "trees" in candidates(topo("mi250"), make_demand("allgather", 8, GB), PlanOptions())[0]
    assert "trees" not in candidates(topo("mi250"), make_demand("alltoall", 8, GB), PlanOptions())[0]
    assert "trees" not in candidates(topo("dgx2"), make_demand("allgather", 16, GB), PlanOptions())[0]
    assert "trees" not in candidates(topo("mi250", 2), make_demand("allgather", 16, GB), PlanOptions())[0]


@pytest.mark.parametrize("size, parts", [(GB, (25,)), (2**30, (16,)), (64 * 10**6, (16, 20, 25))])
def test_auto_plans_trees_at_the_chunkings_that_split_over_the_most_instances(topo, size, parts):
    """Beyond the common refinements, auto cuts chunks for trees into those of TREE_PARTS whose
    chunks split into whole float32 elements over the most instances (up to TREE_INSTANCES): at
    10^9 bytes only 25 per rank take 8 (20 take 5 at most: each would cost a judging for a worse
    program), at 2^30 only 16 are whole elements, at 64 MB all three take 8."""
    t = topo("mi250")
    search = Search(t, PlanOptions(), time.perf_counter() + 60, REFINEMENTS + TREE_PARTS, fine="trees")
    for n in range(len(search.refinements)):
        if not search.chunking(make_demand("allgather", t.ngpus, size), n, only=("trees",)):
            break
    assert sorted(p for p, m in search.planned if m == "trees") == sorted(REFINEMENTS + parts)


@pytest.mark.parametrize("hw,nodes,why", [("dgx2", 1, "through switches"), ("mi250", 2, "has 2")])
def test_trees_refuse_what_they_cannot_plan_with_a_clear_error(topo, hw, nodes, why):
    t = topo(hw, nodes)
    with pytest.raises(CompileError, match=f"trees: .*{why}"):
        plan(t, make_demand("allgather", t.ngpus, GB), PlanOptions(method="trees"))


def torus(rows: int, cols: int):
    from compiler.model.profiles import compose, synthetic_profile
    pairs = sorted({tuple(sorted((r * cols + c, r2 * cols + c2))) for r in range(rows) for c in range(cols)
                    for r2, c2 in ((r, (c + 1) % cols), ((r + 1) % rows, c))})
    doc = synthetic_profile("line", rows * cols, "torus")
    doc["links"] = [{"ends": list(p), "bandwidth_GBps": 50, "alpha_us": 1.0} for p in pairs]
    return compose({**doc, "name": f"torus{rows}x{cols}"})


def test_the_multicast_flow_lp_keeps_its_time_limit():
    t = torus(4, 8)  # 992 source-destination flows over 128 links: HiGHS took 108 s without a limit
    # the LP gets what is left of the limit when it starts (0.2 s or a little less)
    with pytest.raises(CompileError, match=r"^trees: the multicast flow LP .* did not finish within its 0\.(1\d*|2) s"):
        plan(t, make_demand("allgather", 32, 32 * 4000), PlanOptions(method="trees", time_limit=0.2))


def test_the_multicast_flow_lp_says_the_limit_it_had_not_the_time_left(monkeypatch):
    """Past the deadline the LP is given 0.1 s (the time left is negative): its error says 0.1 s, not
    the time left (auto on MI300X allreduce 16 MB at --time-limit 5 noted "did not finish within its
    -0.558 s")."""
    import scipy.optimize
    from types import SimpleNamespace
    given = {}

    def out_of_time(*args, options=None, **kwargs):
        given.update(options)
        return SimpleNamespace(status=1, message="time limit reached")
    monkeypatch.setattr(scipy.optimize, "linprog", out_of_time)
    with pytest.raises(CompileError, match=r"did not finish within its 0\.1 s"):
        multicast_loads(torus(2, 2), {0: 1.0}, {0: {1, 2, 3}}, time_limit=-0.558)
    assert given == {"time_limit": 0.1}


def test_auto_leaves_trees_out_where_their_lp_is_large_and_takes_relay_on_a_large_mesh(topo):
    big = torus(4, 8)
    tried, skipped = candidates(big, make_demand("allgather", 32, 32 * 4000), PlanOptions())
    assert "trees" not in tried and any(s.startswith("trees (its multicast flow LP has 126976") for s in skipped)
    assert "relay" in tried and "ring" in tried  # one node of 32 GPUs: the optimisers may not finish
    tried, skipped = candidates(topo("mi250"), make_demand("allgather", 8, 8 * 4000), PlanOptions())
    assert "trees" in tried and "relay" not in tried and "ring" in tried  # relay never won on one MI250
    assert "relay (ring and an optimiser are candidates)" in skipped
    tried, _ = candidates(topo("mi250", 2), make_demand("alltoall", 16, 16 * 4000), PlanOptions())
    assert "relay" in tried  # on several nodes a demand without copies goes through the NICs as direct's does
    tried, _ = candidates(topo("mi250", 2), make_demand("allgather", 16, 16 * 4000), PlanOptions())
    assert "relay" not in tried and "hier" in tried
