import pytest

from compiler.model.demand import load_custom_demand, make_demand, merge, on_ranks
from compiler.specs.collectives import canonical
from compiler.specs.errors import DemandError
from compiler.planners import PlanOptions, plan
from compiler.model.profiles import load_topology
from compiler.analysis.simulate import simulate


def test_standard_demands_have_the_msccl_buffer_layout():
    ag = make_demand("allgather", 4, 4000, 2)
    assert len(ag.chunks) == 8 and ag.chunk_bytes == 500
    c = ag.chunks[3]  # rank 1, its second chunk
    assert c.sources == (1,) and c.src_index == (1,) and c.dst_index == (3,) * 4
    a2a = make_demand("alltoall", 4, 4000)
    assert {(c.sources[0], c.dests[0], c.src_index[0], c.dst_index[0]) for c in a2a.chunks if c.sources == (1,)} == \
        {(1, d, d, 1) for d in range(4)}
    rs = make_demand("reduce_scatter", 4, 4000)
    assert rs.reduce and all(c.sources == (0, 1, 2, 3) and len(c.dests) == 1 for c in rs.chunks)
    assert (rs.input_chunks, rs.output_chunks) == (4, 1)
    assert canonical("ReduceScatter") == canonical("reduce-scatter") == "reduce_scatter"


def test_split_refines_every_chunk():
    d = make_demand("allgather", 4, 4000).split(3)
    assert d.chunks_per_rank == 3 and len(d.chunks) == 12 and d.chunk_bytes == pytest.approx(1000 / 3)
    assert sorted(c.dst_index[0] for c in d.chunks) == list(range(12))


def test_two_jobs_share_one_topology():
    topo = load_topology("dgx2")
    job_a = on_ranks(make_demand("allgather", 4, 4 * 10**6), [0, 1, 2, 3], 16)
    job_b = on_ranks(make_demand("alltoall", 4, 4 * 10**6), [8, 9, 10, 11], 16)  # same chunk size
    both = merge([job_a, job_b])
    assert both.jobs == (0, 1) and both.ranks == (0, 1, 2, 3, 8, 9, 10, 11)
    s = plan(topo, both, PlanOptions(method="direct"))
    m = simulate(topo, s)  # every need of both jobs met, causally
    assert {t.src for t in s.transfers} <= set(both.ranks)
    assert m.finish_time_s > 0


def test_custom_demand_file(tmp_path):
    path = tmp_path / "d.json"
    path.write_text('{"chunks": [{"from": 0, "to": [1, 2]}, {"from": [1, 2], "to": [3]}], "reduce": false}')
    d = load_custom_demand(str(path), 4, 1000, chunks=2)
    assert len(d.chunks) == 4 and d.chunk_bytes == 500
    path.write_text('{"chunks": [{"from": 9, "to": [1]}]}')
    with pytest.raises(DemandError, match=r"chunks\[0\]\.from: 9 is not a rank"):
        load_custom_demand(str(path), 4, 1000)
    path.write_text('{"chunks": [], "extra": 1}')
    with pytest.raises(DemandError):
        load_custom_demand(str(path), 4, 1000)
    # "yes" read as true (a reduction planned, written and verified); a job of "abc" was an internal ValueError
    for doc, needle in (('{"chunks": [{"from": 0, "to": [1]}], "reduce": "yes"}', "reduce: 'yes' must be true or false"),
                        ('{"chunks": [{"from": 0, "to": [1], "job": "abc"}]}', "chunks[0].job: 'abc' is not a job"),
                        ('{"chunks": [{"from": 0, "to": [1], "job": 1.5}]}', "chunks[0].job: 1.5 is not a job")):
        path.write_text(doc)
        with pytest.raises(DemandError) as e:
            load_custom_demand(str(path), 4, 1000)
        assert str(e.value) == f"{path}: {needle}" + (" number (0, 1, ...)" if "job" in needle else "")


def test_on_ranks_checks_the_ranks():
    with pytest.raises(DemandError, match="distinct ranks"):
        on_ranks(make_demand("allgather", 2, 100), [0, 0], 4)
