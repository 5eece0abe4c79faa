import random
import re
from dataclasses import replace

import pytest

from compiler.model.demand import make_demand
from compiler.specs.errors import CompileError
from compiler.model.program import GpuProgram, Program, Step, ThreadBlock
from compiler.program.verify import Finding, Verdict, verify
from compiler.specs.runtimes import NAMES as RUNTIMES


# ---- builders ------------------------------------------------------------------------------------

def st(t, src="o-1", dst="o-1", cnt=1, dep=None, hasdep=False) -> Step:
    """st("s", src="o3", dst="o3", dep=(0, 1)): buffers and offsets written as "o3", "i0", "s-1"."""
    d = dep or (-1, -1)
    return Step(t, src[0], int(src[1:]), dst[0], int(dst[1:]), cnt, d[0], d[1], hasdep)


def tb(i, send=-1, recv=-1, steps=(), chan=0) -> ThreadBlock:
    return ThreadBlock(i, send, recv, chan, tuple(steps))


def prog(coll, n, nchunks, tbs_per_rank, i_chunks, o_chunks, s_chunks=0, **kw) -> Program:
    gpus = tuple(GpuProgram(r, i_chunks, o_chunks, s_chunks, tuple(tbs_per_rank[r])) for r in range(n))
    return Program(kw.pop("name", f"test_{coll}"), coll, n, nchunks, kw.pop("nchannels", 1), gpus, **kw)


def ring_allgather_2tb(n=4, **kw) -> Program:
    """msccl-xml.md §15 (for n=4 step for step): a receiver tb, and a sender tb that forwards what
    the receiver got through dependencies."""
    ranks = []
    for r in range(n):
        nxt, prv = (r + 1) % n, (r - 1) % n
        recv = [st("r", src=f"o{(r - 1 - k) % n}", dst=f"o{(r - 1 - k) % n}", hasdep=k < n - 2) for k in range(n - 1)]
        send = [st("cpy", src="i0", dst=f"o{r}"), st("s", src=f"o{r}", dst=f"o{r}")]
        send += [st("s", src=f"o{(r - 1 - k) % n}", dst=f"o{(r - 1 - k) % n}", dep=(0, k)) for k in range(n - 2)]
        ranks.append([tb(0, recv=prv, steps=recv), tb(1, send=nxt, steps=send)])
    return prog("allgather", n, n, ranks, 1, n, **kw)


def ring_allgather_1tb(n=4, **kw) -> Program:
    ranks = []
    for r in range(n):
        steps = [st("cpy", src="i0", dst=f"o{r}"), st("s", src=f"o{r}", dst=f"o{r}")]
        steps += [st("rcs", src=f"o{(r - 1 - k) % n}", dst=f"o{(r - 1 - k) % n}") for k in range(n - 2)]
        steps.append(st("r", src=f"o{(r + 1) % n}", dst=f"o{(r + 1) % n}"))
        ranks.append([tb(0, send=(r + 1) % n, recv=(r - 1) % n, steps=steps)])
    return prog("allgather", n, n, ranks, 1, n, **kw)


def direct_alltoall(n=4, f=1, **kw) -> Program:
    """tb 0 copies the rank's own block; one tb per peer sends to it, then receives from it (cnt = f)."""
    ranks = []
    for r in range(n):
        tbs = [tb(0, steps=[st("cpy", src=f"i{r * f}", dst=f"o{r * f}", cnt=f)])]
        for p in range(n):
            if p != r:
                tbs.append(tb(len(tbs), send=p, recv=p, steps=[st("s", src=f"i{p * f}", dst=f"o{r * f}", cnt=f),
                                                               st("r", src=f"i{r * f}", dst=f"o{p * f}", cnt=f)]))
        ranks.append(tbs)
    return prog("alltoall", n, n * f, ranks, n * f, n * f, **kw)


def ring_reduce_scatter(n=4, **kw) -> Program:
    """Chunk d starts at rank d+1, picks up every rank's i[d] with rrs, ends at rank d with rrc."""
    ranks = []
    for r in range(n):
        steps = [st("s", src=f"i{(r - 1) % n}")]
        steps += [st("rrs", src=f"i{(r - 1 - k) % n}") for k in range(1, n - 1)]
        steps.append(st("rrc", src=f"i{r}", dst="o0"))
        ranks.append([tb(0, send=(r + 1) % n, recv=(r - 1) % n, steps=steps)])
    return prog("reduce_scatter", n, n, ranks, n, 1, **kw)


def ring_allreduce(n=4, **kw) -> Program:
    """Reduce-scatter with s/rrs/rrcs, then allgather with rcs/r, one tb per rank."""
    ranks = []
    for r in range(n):
        steps = [st("s", src=f"i{(r - 1) % n}")]
        steps += [st("rrs", src=f"i{(r - 1 - k) % n}") for k in range(1, n - 1)]
        steps.append(st("rrcs", src=f"i{r}", dst=f"o{r}"))
        steps += [st("rcs", src=f"o{(r - 1 - j) % n}", dst=f"o{(r - 1 - j) % n}") for j in range(n - 2)]
        steps.append(st("r", dst=f"o{(r + 1) % n}"))
        ranks.append([tb(0, send=(r + 1) % n, recv=(r - 1) % n, steps=steps)])
    return prog("allreduce", n, n, ranks, n, n, **kw)


def chain_broadcast(n=4, root=2, **kw) -> Program:
    ranks = []
    for r in range(n):
        k = (r - root) % n
        nxt, prv = (r + 1) % n, (r - 1) % n
        if k == 0:
            t = tb(0, send=nxt, steps=[st("cpy", src="i0", dst="o0"), st("s", src="o0", dst="o0")])
        elif k < n - 1:
            t = tb(0, send=nxt, recv=prv, steps=[st("rcs", src="o0", dst="o0")])
        else:
            t = tb(0, recv=prv, steps=[st("r", src="o0", dst="o0")])
        ranks.append([t])
    return prog("broadcast", n, 1, ranks, 1, 1, **kw)


def edit(p: Program, rank: int, tbid: int, steps=None, **tb_fields) -> Program:
    """A copy of `p` with one thread block's steps (a list) or fields replaced."""
    g = p.gpus[rank]
    tbs = list(g.tbs)
    t = tbs[tbid]
    tbs[tbid] = replace(t, steps=tuple(t.steps if steps is None else steps), **tb_fields)
    gpus = list(p.gpus)
    gpus[rank] = replace(g, tbs=tuple(tbs))
    return replace(p, gpus=tuple(gpus))


def add_tbs(p: Program, rank: int, *new) -> Program:
    gpus = list(p.gpus)
    gpus[rank] = replace(gpus[rank], tbs=gpus[rank].tbs + tuple(new))
    return replace(p, gpus=tuple(gpus))


def rules(v: Verdict) -> set[str]:
    return {f.rule for f in v.findings}


# ---- correct programs ----------------------------------------------------------------------------

@pytest.mark.parametrize("build", [ring_allgather_2tb, ring_allgather_1tb, direct_alltoall, ring_reduce_scatter,
                                   ring_allreduce, chain_broadcast])
@pytest.mark.parametrize("runtime", RUNTIMES + ("all",))
def test_correct_programs_pass(build, runtime):
    v = verify(build(), runtime)
    assert v.ok, v.summary()
    assert v.findings == () and v.summary() == "correct" and v.runtime == runtime


@pytest.mark.parametrize("build", [ring_allgather_2tb, ring_allgather_1tb, ring_reduce_scatter, ring_allreduce])
@pytest.mark.parametrize("n", [2, 3, 5, 8])
def test_ring_programs_other_sizes(build, n):
    assert verify(build(n)).ok


def test_allgather_with_explicit_demand():
    assert verify(ring_allgather_1tb(), demand=make_demand("allgather", 4, 1 << 20, 1)).ok


def test_custom_program_needs_a_demand():
    p = replace(ring_allgather_1tb(), collective="custom")
    # legacy, the one runtime with coll="custom", reads both buffers as nchunksperloop chunks (§2.2)
    assert "buffer-size" in rules(verify(p, "old", demand=make_demand("allgather", 4, 1 << 20, 1)))
    p = replace(p, gpus=tuple(replace(g, i_chunks=4) for g in p.gpus))
    assert verify(p, "old", demand=make_demand("allgather", 4, 1 << 20, 1)).ok
    assert rules(verify(p, "old")) == {"postcondition"}
    assert "coll" in rules(verify(p, "executor", demand=make_demand("allgather", 4, 1 << 20, 1)))


def test_broadcast_root_inferred_or_given():
    assert verify(chain_broadcast(root=1)).ok
    wrong = make_demand("broadcast", 4, 1 << 20, 1, root=0)
    assert rules(verify(chain_broadcast(root=1), demand=wrong)) == {"postcondition"}


def test_inplace_allgather():
    # out-of-place style (cpy i -> o[r] first) is correct for both kinds of call
    assert verify(ring_allgather_1tb(inplace=True, outofplace=True)).ok
    # reading o[r] without copying i there is in-place only (msccl-xml.md §10)
    p = ring_allgather_1tb(inplace=True, outofplace=False)
    p = replace(p, gpus=tuple(replace(g, i_chunks=0, tbs=(replace(g.tbs[0], steps=g.tbs[0].steps[1:]),))
                              for g in p.gpus))
    assert verify(p).ok
    v = verify(replace(p, outofplace=True))
    assert not v.ok and "[in-place call]" not in v.findings[0].message
    assert {"undefined-read", "postcondition"} <= rules(v)


def test_inplace_alltoall_and_allreduce():
    assert verify(direct_alltoall(inplace=True)).ok  # each tb sends i[p] before overwriting o[p] = i[p]
    assert verify(ring_allreduce(inplace=True)).ok


def test_postcondition_wrong_destination():
    p = ring_allgather_1tb()
    steps = list(p.gpus[2].tbs[0].steps)
    steps[-1] = st("r", dst="o0")  # rank 2's last receive should go to o[3]
    v = verify(edit(p, 2, 0, steps))
    assert rules(v) == {"postcondition"}
    assert {f.rank for f in v.findings} == {2}
    f = next(f for f in v.findings if "o[3]" in f.message)
    assert f.message == "postcondition: rank 2: o[3] should hold rank 3's i[0], but holds nothing (never written)"


def test_wrong_collective_fails_postcondition():
    p = replace(ring_allgather_1tb(), collective="alltoall")
    assert "postcondition" in rules(verify(p)) or "buffer-size" in rules(verify(p))


# ---- mutations, each rejected by the right rule ---------------------------------------------------

def test_swapped_steps():
    p = ring_allgather_2tb()
    s = list(p.gpus[0].tbs[1].steps)
    s[2], s[3] = s[3], s[2]
    v = verify(edit(p, 0, 1, s))
    assert {"fifo-order", "postcondition"} <= rules(v)
    f = next(f for f in v.findings if f.rule == "fifo-order")
    assert (f.rank, f.tb, f.step) == (0, 1, 2)


def test_dependency_target_without_hasdep():
    p = ring_allgather_2tb()
    s = list(p.gpus[0].tbs[0].steps)
    s[0] = replace(s[0], hasdep=False)
    v = verify(edit(p, 0, 0, s))
    assert rules(v) == {"hasdep"}
    assert (v.findings[0].rank, v.findings[0].tb, v.findings[0].step) == (0, 1, 2)


def test_wrong_cnt_on_one_side():
    p = ring_allgather_2tb()
    s = list(p.gpus[0].tbs[1].steps)
    s[1] = replace(s[1], cnt=2)
    assert "cnt-mismatch" in rules(verify(edit(p, 0, 1, s)))


def test_missing_receive():
    p = ring_allgather_2tb()
    v = verify(edit(p, 1, 0, p.gpus[1].tbs[0].steps[:-1]))
    assert "fifo-count" in rules(v)
    assert "deadlock" not in rules(v)  # structural findings stop the execution


def test_connection_used_by_two_tbs_on_one_channel():
    p = add_tbs(ring_allgather_2tb(), 0, tb(2, send=1))
    assert "conn-unique" in rules(verify(p))
    # on another channel it is a separate connection, which rank 1 does not declare
    p = add_tbs(replace(ring_allgather_2tb(), nchannels=2), 0, tb(2, send=1, chan=1))
    assert rules(verify(p)) == {"conn-symmetry"}


def test_offset_past_the_buffer():
    p = ring_allgather_2tb()
    s = list(p.gpus[0].tbs[1].steps)
    s[0] = replace(s[0], cnt=2)  # i has 1 chunk
    v = verify(edit(p, 0, 1, s))
    assert "offset" in rules(v)
    assert "i[0:2]" in next(f.message for f in v.findings if f.rule == "offset")


def test_an_offset_out_of_range_says_which_way():
    """srcoff=-5 was said not to fit the XML's int16, which it does: it is negative."""
    p = ring_allgather_2tb()
    for off, why in ((-5, "srcoff=-5 is negative"), (40000, "srcoff=40000 is above the XML's int16 (32767)")):
        s = list(p.gpus[0].tbs[1].steps)
        s[0] = replace(s[0], srcoff=off)
        v = verify(edit(p, 0, 1, s))
        assert any(f.rule == "offset" and why in f.message for f in v.findings), [f.message for f in v.findings]


def test_nop_without_dependency():
    p = ring_allgather_2tb()
    s = list(p.gpus[0].tbs[1].steps)
    s.insert(2, st("nop", cnt=0))
    assert rules(verify(edit(p, 0, 1, s))) == {"nop-dep"}


def test_nop_chain_rules():
    p = ring_allgather_2tb()
    s = list(p.gpus[0].tbs[1].steps)
    ok = s[:2] + [st("nop", cnt=0, dep=(0, 0))] + s[2:]  # extra dependency before a step with its own
    assert verify(edit(p, 0, 1, ok)).ok
    bad = s[:2] + [st("nop", cnt=0, dep=(0, 0))] + [replace(s[2], depid=-1, deps=-1)] + s[3:]
    assert rules(verify(edit(p, 0, 1, bad))) == {"nop-chain"}
    trailing = s + [st("nop", cnt=0, dep=(0, 1))]
    assert rules(verify(edit(p, 0, 1, trailing))) == {"trailing-nop"}
    on_nop = s[:3] + [replace(s[3], depid=1, deps=0)]
    p2 = edit(edit(p, 0, 1, on_nop), 0, 0, [st("nop", cnt=0, dep=(1, 1))] + list(p.gpus[0].tbs[0].steps))
    assert "dep-on-nop" in rules(verify(p2)) or "dep-target" in rules(verify(p2))


def test_too_many_steps_for_executor_but_fine_for_old():
    p = ring_allgather_1tb()
    steps = [st("cpy", src="i0", dst="o0")] * 60 + list(p.gpus[0].tbs[0].steps)
    p = edit(p, 0, 0, steps)
    assert len(p.gpus[0].tbs[0].steps) == 65
    assert verify(p, "old").ok
    for runtime in ("executor", "rccl", "all"):
        v = verify(p, runtime)
        assert rules(v) == {"max-steps"}, runtime
        assert v.findings[0].rank == 0 and v.findings[0].tb == 0


def test_depid_128():
    p = ring_allgather_2tb()
    s = list(p.gpus[0].tbs[1].steps)
    p = edit(p, 0, 1, [replace(s[1], depid=128, deps=0)] + s[2:])
    filler = [tb(i) for i in range(2, 128)]
    p = add_tbs(p, 0, *filler, tb(128, steps=[replace(s[0], hasdep=True)]))
    assert len(p.gpus[0].tbs) == 129
    v = verify(p, "old")
    assert rules(v) == {"depid-range"}
    assert (v.findings[0].rank, v.findings[0].tb, v.findings[0].step) == (0, 1, 0)
    assert {"depid-range", "tb-count"} <= rules(verify(p, "rccl"))


def test_reduction_counts_a_rank_twice():
    p = ring_reduce_scatter()
    s = list(p.gpus[0].tbs[0].steps) + [st("re", src="i0", dst="o0")]
    v = verify(edit(p, 0, 0, s))
    assert rules(v) == {"double-count"}
    assert "rank 0's i[0] twice" in v.findings[0].message


def test_reading_an_undefined_output_chunk():
    p = ring_allgather_2tb()
    v = verify(edit(p, 0, 1, p.gpus[0].tbs[1].steps[1:]))  # no cpy i -> o[0] before sending o[0]
    assert "undefined-read" in rules(v)
    f = next(f for f in v.findings if f.rule == "undefined-read")
    assert (f.rank, f.tb, f.step) == (0, 1, 0) and "o[0]" in f.message


def test_race_without_dependency():
    p = ring_allgather_2tb()
    s = list(p.gpus[0].tbs[1].steps)
    s[2] = replace(s[2], depid=-1, deps=-1)  # forwards o[3] without waiting for its receive
    assert "race" in rules(verify(edit(p, 0, 1, s)))


def copy_apart(reads: str) -> Program:
    """ring_allgather_1tb with each rank's copy i0 -> o[r] on a block of its own, unordered against the
    ring block, whose first send reads `reads` (i0 or o[r])."""
    p = ring_allgather_1tb(inplace=True, outofplace=True)
    for r in range(4):
        steps = list(p.gpus[r].tbs[0].steps)
        steps[1] = replace(steps[1], srcbuf=reads[0], srcoff=int(reads[1:]) if reads != "o" else r)
        p = add_tbs(edit(p, r, 0, steps[1:]), r, tb(1, steps=[steps[0]]))
    return p


def test_an_in_place_self_copy_races_with_nothing():
    """msccl-xml.md §10: called in place, an allgather's cpy i -> o[rank] copies a region onto itself.
    A send of i0 beside it, with no dependency, reads what is there either way: out of place they
    touch different buffers, and in place the copy moves nothing. Lowering relies on it (a send of
    the rank's own chunk does not wait for its copy). A send of o[rank] beside the copy races in the
    out-of-place call, where the copy writes what it reads."""
    v = verify(copy_apart("i0"))
    assert v.ok, v.summary()
    v = verify(copy_apart("o"))
    assert "race" in rules(v)
    assert any(f.rule == "race" and f.rank == 0 and "o[0]" in f.message for f in v.findings)


def test_write_write_race():
    p = ring_allgather_2tb()
    # tb 0 receives into o[1] at its step 2, which nothing orders against tb 1
    s = list(p.gpus[0].tbs[1].steps) + [st("cpy", src="i0", dst="o1")]
    v = verify(edit(p, 0, 1, s))
    assert "race" in rules(v)
    f = next(f for f in v.findings if f.rule == "race")
    assert f.rank == 0 and "o[1]" in f.message
    # writing o[3] instead is ordered: tb 1 step 2 waited for tb 0's receive into o[3]
    s[-1] = st("cpy", src="i0", dst="o3")
    assert rules(verify(edit(p, 0, 1, s))) == {"postcondition"}


def test_bounded_slots_deadlock_simple_but_not_ll():
    # two ranks that each first send cnt=3 to the other, then receive
    p = direct_alltoall(n=2, f=3)
    assert [x.type for x in p.gpus[0].tbs[1].steps] == ["s", "r"]
    v = verify(p)
    assert rules(v) == {"deadlock"}
    assert {(f.rank, f.tb, f.step) for f in v.findings} == {(0, 1, 0), (1, 1, 0)}
    assert "free slot" in v.findings[0].message and "2 Simple slots" in v.findings[0].message
    assert verify(replace(p, proto="LL")).ok
    assert verify(replace(p, proto="LL128")).ok


def test_cyclic_dependency_deadlock():
    p = ring_allgather_2tb()
    r0 = list(p.gpus[0].tbs[0].steps)
    r0[0] = replace(r0[0], depid=1, deps=3)  # waits for tb 1's last send, which waits for tb 0's step 1
    s1 = list(p.gpus[0].tbs[1].steps)
    s1[3] = replace(s1[3], hasdep=True)
    v = verify(edit(edit(p, 0, 0, r0), 0, 1, s1))
    assert rules(v) == {"deadlock"}
    where = {(f.rank, f.tb, f.step) for f in v.findings}
    assert {(0, 0, 0), (0, 1, 2)} <= where
    assert "waits for tb 1 to publish step 3" in next(f.message for f in v.findings if f.tb == 0 and f.rank == 0)


# ---- limits and structure ------------------------------------------------------------------------

def test_co_residency():
    assert rules(verify(ring_allgather_2tb(), sms=2)) == {"co-residency"}
    assert verify(ring_allgather_2tb(), sms=3).ok


def test_structure_rules():
    p = ring_allgather_2tb()
    assert "tb-ids" in rules(verify(edit(p, 0, 1, id=5)))
    assert "peer" in rules(verify(edit(p, 0, 1, send=0)))
    assert "chan" in rules(verify(edit(p, 0, 1, chan=1)))
    assert "no-peer" in rules(verify(edit(p, 0, 0, list(p.gpus[0].tbs[0].steps) + [st("s", src="o0")])))
    assert "step-type" in rules(verify(edit(p, 0, 0, [st("ra")] + list(p.gpus[0].tbs[0].steps))))
    assert "buffer" in rules(verify(edit(p, 0, 1, [replace(p.gpus[0].tbs[1].steps[0], srcbuf="x")]
                                         + list(p.gpus[0].tbs[1].steps[1:]))))
    assert "cnt" in rules(verify(edit(p, 0, 1, [replace(p.gpus[0].tbs[1].steps[0], cnt=0)]
                                      + list(p.gpus[0].tbs[1].steps[1:]))))
    s = list(p.gpus[0].tbs[1].steps)
    s[2] = replace(s[2], depid=0, deps=7)
    assert "dep-target" in rules(verify(edit(p, 0, 1, s)))
    assert "proto" in rules(verify(replace(p, proto="ll")))
    assert "inplace-flags" in rules(verify(replace(p, outofplace=False)))
    assert "nchannels" in rules(verify(replace(p, nchannels=33)))
    assert "buffer-size" in rules(verify(replace(p, nchunksperloop=8)))


def test_tb_count_per_runtime():
    p = add_tbs(ring_allgather_1tb(), 0, *[tb(i) for i in range(1, 64)])  # 64 tbs on rank 0
    assert verify(p, "old").ok and verify(p, "executor").ok
    assert rules(verify(p, "rccl")) == rules(verify(p, "all")) == {"tb-count"}
    assert rules(verify(add_tbs(p, 0, *[tb(i) for i in range(64, 216)]), "old")) == {"tb-count"}


def test_node_limit():
    p = ring_allgather_1tb()
    filler = [tb(i, steps=[st("cpy", src="i0", dst="o0")] * 64) for i in range(1, 70)]
    v = verify(add_tbs(p, 0, *filler), "executor")
    assert "nodes" in rules(v)


def test_unknown_runtime_raises():
    with pytest.raises(CompileError):
        verify(ring_allgather_1tb(), "nccl")


def test_findings_are_one_line_and_name_the_rule():
    p = ring_allgather_2tb()
    s = list(p.gpus[0].tbs[0].steps)
    s[0] = replace(s[0], hasdep=False)
    v = verify(edit(p, 0, 0, s))
    f = v.findings[0]
    assert isinstance(f, Finding) and "\n" not in f.message
    assert f.message.startswith("hasdep: rank 0 tb 1 step 2 (s):")
    assert v.summary() == f.message


def test_summary_counts_more():
    v = verify(direct_alltoall(n=2, f=3))
    assert v.summary().endswith("(and 1 more)")


# ---- scale (speed is measured in benchmarks/pipeline.py) ------------------------------------------

def test_32_rank_ring_allgather():
    p = ring_allgather_2tb(32, inplace=True, outofplace=True)
    assert p.nsteps_total == 32 * 63
    v = verify(p)
    assert v.ok, v.summary()


def test_random_mutations_never_raise():
    rng = random.Random(7)
    builders = [ring_allgather_2tb, ring_allgather_1tb, direct_alltoall, ring_reduce_scatter, ring_allreduce]
    vals = [-2, -1, 0, 1, 2, 3, 127, 128, 40000]
    for _ in range(300):
        p = rng.choice(builders)()
        r = rng.randrange(p.ngpus)
        t = rng.randrange(len(p.gpus[r].tbs))
        s = list(p.gpus[r].tbs[t].steps)
        k = rng.randrange(len(s))
        field = rng.choice(["type", "srcoff", "dstoff", "cnt", "depid", "deps", "hasdep", "drop", "swap"])
        if field == "type":
            s[k] = replace(s[k], type=rng.choice(["s", "r", "rcs", "rrs", "rrc", "rrcs", "cpy", "re", "nop", "ra"]))
        elif field == "hasdep":
            s[k] = replace(s[k], hasdep=not s[k].hasdep)
        elif field == "drop":
            del s[k]
        elif field == "swap":
            j = rng.randrange(len(s))
            s[k], s[j] = s[j], s[k]
        else:
            s[k] = replace(s[k], **{field: rng.choice(vals)})
        v = verify(edit(p, r, t, s), rng.choice(RUNTIMES + ("all",)))
        assert v.ok == (not v.findings) and isinstance(v.summary(), str)


def test_order_through_another_rank_is_no_race():
    """Rank 0's tb 1 rewrites o[0] after tb 0 wrote it, ordered only through rank 1 (tb 0 sends,
    rank 1 answers, tb 1 receives): the local clocks see a race, the full ones clear it."""
    from compiler.program.interpret import Call, Machine
    from compiler.program.semantics import connections
    ranks = [[tb(0, send=1, steps=[st("cpy", src="i0", dst="o0"), st("s", src="o0", dst="o0")]),
              tb(1, recv=1, steps=[st("r", src="o1", dst="o1"), st("cpy", src="o0", dst="o0")])],
             [tb(0, send=0, recv=0, steps=[st("r", src="o0", dst="o0"), st("cpy", src="i0", dst="o1"),
                                           st("s", src="o1", dst="o1")])]]
    p = prog("allgather", 2, 2, ranks, 1, 2)
    local, = Machine(p, connections(p), [Call(p, False)], full_clocks=False).run()
    assert {f.rule for f in local} == {"race"}
    assert verify(p).ok


def test_calls_run_together_find_what_each_finds_alone():
    """traces runs the out-of-place and in-place calls on one schedule: for correct programs, a race
    (judged again with full clocks), a deadlock and reads of undefined data in one call only, each
    call's findings, memory and order are those of a run of its own."""
    from compiler.program.interpret import trace, traces
    p = ring_allgather_2tb()
    racy = list(p.gpus[0].tbs[1].steps)
    racy[2] = replace(racy[2], depid=-1, deps=-1)  # forwards o[3] without waiting for its receive
    in_place_only = ring_allgather_1tb(inplace=True, outofplace=False)
    in_place_only = replace(in_place_only, gpus=tuple(
        replace(g, i_chunks=0, tbs=(replace(g.tbs[0], steps=g.tbs[0].steps[1:]),)) for g in in_place_only.gpus))
    cases = [p, ring_reduce_scatter(), ring_allreduce(), edit(p, 0, 1, racy), direct_alltoall(n=2, f=3),
             replace(in_place_only, outofplace=True)]
    seen = set()
    for p in cases:
        both = traces(p, (False, True))
        for got, inplace in zip(both, (False, True)):
            alone = trace(p, inplace)
            assert (got.findings, got.memory, got.order) == (alone.findings, alone.memory, alone.order)
            seen |= {f.rule for f in got.findings}
    assert {"race", "deadlock", "undefined-read"} <= seen


def test_sparse_symbols_judge_as_the_ints_do(monkeypatch):
    """Past DENSE_BITS (large reduce-scatters) symbols are symbols.Sparse: the same verdicts."""
    import compiler.program.interpret as interpret
    p = ring_reduce_scatter()
    bad = edit(p, 0, 0, list(p.gpus[0].tbs[0].steps) + [st("re", src="i0", dst="o0")])
    dense = [verify(x) for x in (p, bad, ring_allgather_2tb())]
    monkeypatch.setattr(interpret, "DENSE_BITS", 0)
    sparse = [verify(x) for x in (p, bad, ring_allgather_2tb())]
    assert [v.findings for v in sparse] == [v.findings for v in dense]
    assert sparse[0].ok and not sparse[1].ok


def test_min_bytes_above_max_bytes_is_refused():
    """msccl-xml.md §2.1/§13: the old runtime's parser rejects minBytes > maxBytes, and no runtime
    selects such a file for any size; a finite band in order (or maxBytes=0, no limit) is fine."""
    p = ring_allgather_2tb()
    assert verify(replace(p, min_bytes=10**6, max_bytes=10**5)).findings[0].rule == "size-band"
    assert not verify(replace(p, min_bytes=10**6, max_bytes=10**5), "executor").ok
    assert verify(replace(p, min_bytes=10**6, max_bytes=0)).ok
    assert verify(replace(p, min_bytes=10**5, max_bytes=10**6)).ok


def test_text_the_runtimes_reader_rejects_is_a_finding_not_a_warning():
    """The runtimes read XML with NCCL's small hand-written reader (msccl-xml.md §1): an XML
    declaration, a tab, a start tag across lines and a single-quoted value are parse errors or
    misreadings there, and a 17th attribute is silently dropped (here maxBytes, which the executor
    requires). lxml reads all of them; verify called such files correct (two with a warning)."""
    from backends.msccl_xml import read_xml, to_xml
    text = to_xml(ring_allgather_2tb())
    assert read_xml(text).syntax == () and verify(read_xml(text)).ok  # our writer's text
    head = text[:text.index(">")]
    broken = {
        "declaration": '<?xml version="1.0"?>\n' + text,
        "tab": text.replace('  <gpu id="1"', '\t<gpu id="1"', 1),
        "across lines": text.replace(' proto=', '\n proto=', 1),
        "single quotes": text.replace('<gpu id="1"', "<gpu id='1'", 1),
        "17 attributes": text.replace(head, head.replace(" minBytes", "".join(f' x{k}="0"' for k in range(7))
                                                         + " minBytes"), 1),
    }
    for what, bad in broken.items():
        assert bad != text, what
        v = verify(read_xml(bad))
        assert not v.ok and [f.rule for f in v.findings] == ["syntax"], (what, v.findings)
    assert "drops maxBytes" in verify(read_xml(broken["17 attributes"])).findings[0].message


def test_attributes_only_the_old_runtime_reads_its_own_way():
    """msccl-xml.md §2.1/§13: the old runtime never selects a file with maxBytes="0" (the others read
    it as no limit) and rejects an nthreads that is not a multiple of 32 (the others do not read it).
    verify called both files correct for every runtime."""
    from backends.msccl_xml import read_xml, to_xml
    text = to_xml(ring_allgather_2tb())
    ours = read_xml(text)
    zero = read_xml(re.sub(r'maxBytes="\d+"', 'maxBytes="0"', text))
    threads = read_xml(text.replace("<algo ", '<algo nthreads="100" ', 1))
    assert verify(ours, "old").ok and verify(read_xml(text.replace("<algo ", '<algo nthreads="0x40" ', 1)), "old").ok
    for p in (zero, threads):
        assert [f.rule for f in verify(p, "old").findings] == ["old-runtime"]
        assert verify(p, "executor").ok
    assert "never selects" in verify(zero, "old").findings[0].message
    assert "multiple of 32" in verify(threads).findings[0].message  # all runtimes: the old one among them
