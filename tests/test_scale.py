"""What makes large clusters tractable, checked on small ones: auto's scale rule, node symmetry
(the same tables as all pairs), and the whole pipeline where the symmetric tables are used.
Cluster-size timings are benchmarks/scale.py's."""

import numpy as np
import pytest

from compiler.analysis import bounds
from compiler.model import nodesym
from compiler.model.demand import make_demand
from compiler.model.timing import expand
from compiler.pipeline import CompileOptions, compile
from compiler.planners import PlanOptions, auto, plan

GB = 10**9


def test_auto_at_scale_plans_hier_only_and_says_why(topo, monkeypatch):
    monkeypatch.setattr(auto, "SCALE_DELIVERIES", 100)
    t = topo("dgx-h100", 2)
    s = plan(t, make_demand("allgather", t.ngpus, GB), PlanOptions(method="auto", refine=True))
    assert s.planner == "hier"
    left_out = next(n for n in s.notes if n.startswith("left out:"))
    for why in ("milp, lp and rounds (240 chunk deliveries", "direct (one thread block per peer", "ring (a 16-hop",
                "finer chunks"):
        assert why in left_out


def test_hier_is_planned_at_finer_chunks_where_the_optimisers_are_left_out(topo, monkeypatch):
    """Where a finer chunking has too many deliveries for the optimisers, hier is still planned at it
    (before, only ring, relay and trees were): where instances do not fit, finer chunks are what
    pipelines hier's fan-out (DGX A100 x 16 allgather 1 GB: hier/5ch 0.955 of the floor, hier/1ch
    0.947). Judged by the simulator: the plan auto keeps is faster than hier's whole chunks."""
    from compiler.analysis.simulate import simulate
    monkeypatch.setattr(auto, "SCALE_DELIVERIES", 300)  # 240 deliveries at whole chunks, 480 at 2x
    t = topo("dgx-h100", 2)
    d = make_demand("allgather", t.ngpus, GB)
    s = plan(t, d, PlanOptions(method="auto", refine=True, time_limit=10))
    left_out = next(n for n in s.notes if n.startswith("left out:"))
    assert "milp, lp and rounds (480 chunk deliveries" in left_out
    assert "hier/2ch" in s.notes[0] and s.demand.chunks_per_rank > 1
    whole = plan(t, d, PlanOptions(method="hier"))
    assert simulate(t, s).finish_time_s < simulate(t, whole).finish_time_s
    # but not an allreduce's (a reduce-scatter's and an allgather's steps: at 128 GPUs hier/5ch did not fit the SMs)
    s = plan(t, make_demand("allreduce", t.ngpus, GB), PlanOptions(method="auto", refine=True, time_limit=10))
    assert "hier/1ch" in s.notes[0] and "hier/2ch" not in s.notes[0]


def test_direct_that_a_rank_s_thread_blocks_cannot_hold_gives_way_to_relay(topo):
    """Where direct needs more thread blocks a rank than it may have (one per peer: DGX A100 x 16
    alltoall, 127 peers on 108 SMs, failed after six minutes with no candidate written), direct is
    no candidate and relay, whose hops between nodes keep to rail groups, is: here 15 peers on a GPU
    given 12 SMs. The program auto writes verifies and fits the SMs."""
    from dataclasses import replace
    t = replace(topo("dgx-h100", 2), sms=12)
    d = make_demand("alltoall", t.ngpus, 2**24)
    tried, skipped = auto.candidates(t, d, PlanOptions())
    assert "direct" not in tried and "relay" in tried
    assert any(s.startswith("direct (a rank needs about 15 thread blocks, one per peer; the GPU has 12 SMs")
               for s in skipped)
    r = compile(t, d, CompileOptions(PlanOptions(method="auto", time_limit=20), runtime="executor"))
    assert r.verdict.ok and r.schedule.planner == "relay"
    assert max(len(g.tbs) for g in r.program.gpus) <= 12
    assert "direct" in auto.candidates(topo("dgx-h100", 2), d, PlanOptions())[0]  # 132 SMs: direct fits


def test_auto_below_scale_is_unchanged(topo):
    t = topo("dgx-h100", 2)
    assert auto.at_scale(t, make_demand("allgather", t.ngpus, GB)) is None
    assert auto.at_scale(topo("dgx-h100", 1), make_demand("allgather", 8, GB)) is None


@pytest.mark.parametrize("name,nodes", [("dgx-h100", 2), ("dgx-a100", 2), ("dgx2", 2)])
def test_node_symmetry_gives_the_all_pairs_tables(topo, monkeypatch, name, nodes):
    t = topo(name, nodes)
    d = make_demand("allgather", t.ngpus, GB)
    monkeypatch.setattr(nodesym, "MIN_GPUS", 10**9)
    want = (bounds.alpha_distances(t), expand(t, d), bounds.cut_bound(t, bounds.Traffic.of(d)),
            bounds.group_bound(t, bounds.Traffic.of(d)))
    monkeypatch.setattr(nodesym, "MIN_GPUS", 1)
    nodesym._node_symmetry.cache_clear()
    assert nodesym.node_symmetry(t) is not None
    got = (bounds.alpha_distances(t), expand(t, d), bounds.cut_bound(t, bounds.Traffic.of(d)),
           bounds.group_bound(t, bounds.Traffic.of(d)))
    assert np.array_equal(got[0], want[0]) and got[1:] == want[1:]
    nodesym._node_symmetry.cache_clear()


def test_a_topology_with_unequal_nodes_is_not_node_symmetric(topo, monkeypatch):
    from dataclasses import replace
    t = topo("dgx-h100", 2)
    links = list(t.links)
    i = next(k for k, l in enumerate(links) if l.src == t.gpus_per_node and not t.is_gpu(l.dst))
    links[i] = replace(links[i], bandwidth=links[i].bandwidth / 2)  # one GPU of node 1 with a slower port
    monkeypatch.setattr(nodesym, "MIN_GPUS", 1)
    assert nodesym.node_symmetry(replace(t, links=tuple(links))) is None
    nodesym._node_symmetry.cache_clear()


@pytest.mark.parametrize("coll", ["allgather", "reduce_scatter"])
def test_pipeline_on_64_gpus_writes_a_verified_program(topo, coll):
    """dgx-h100 x 8: node symmetry on (>= 64 GPUs); hier planned, lowered, verified and timed, within
    a short limit (realise's instance search is what the default 60 s would spend)."""
    t = topo("dgx-h100", 8)
    r = compile(t, make_demand(coll, t.ngpus, GB), CompileOptions(PlanOptions(method="hier", time_limit=8),
                                                                  runtime="executor"))
    assert r.verdict.ok and r.program.ngpus == 64
    # no program beats the bound; it may beat its schedule's ideal program, which moves whole
    # chunks where instances cut each into pieces that pipeline across hops
    assert 0 < r.bound_ratio <= 1 + 1e-9 and 0 < r.planned.bound_ratio <= 1 + 1e-9
