"""Merging sub-chunk moves into one step with cnt > 1.

With `instances` k, a transfer is k sub-chunk moves; lane-aware placement (channels.lane_widths)
puts runs of them on one channel when its link needs fewer than k lanes, so they are consecutive
sends of one thread block to one peer and consecutive receives of one thread block there, on
consecutive buffer offsets. Each such step pays the runtime's step latency; one step with cnt = r
pays it once per primitive call the host splits it into: once where the r sub-chunks fit one
kernel iteration's payload, r times where each fills one (msccl-xml.md section 5, Costing.calls),
so merging saves latency at small sizes and costs nothing at large ones. `merge_runs` merges a
run of plain sends (`s`) and the matching run of plain receives (`r`) when, on both sides, the
steps are adjacent in their thread block (nops between them aside), their offsets (local and
remote) follow each other, and every dependency of the later members (and of their nops) is on a
step emitted before the run's first member; those dependencies move onto the merged step (nops before it), and steps that waited on
a member wait on the merged step.

Why the order stays safe: steps are emitted in key order (DraftStep.seq), so the merged send sits
at the key of the run's first send and waits only on steps of smaller keys, the merged receive
likewise, and its message is the one its peer's merged send sends: every wait is still on an op
with a smaller key (compiler/lowering/lower.py, "Why the order is safe").
"""

from __future__ import annotations

from compiler.lowering.channels import Move
from compiler.lowering.codegen import UNUSED, DraftStep, RankCode

Dep = tuple[int, int]  # (tb, step) at one rank


def _run_deps(code: RankCode, tb: int, head: int, upto: int) -> list[Dep] | None:
    """The dependencies of steps head+1..upto of a thread block (nops and the step at upto), or
    None if one waits on a step emitted after the head (which would then wait out of key order)."""
    steps = code.tbs[tb].steps
    out = []
    for st in steps[head + 1:upto + 1]:
        if st.depid >= 0:
            if code.tbs[st.depid].steps[st.deps].seq >= steps[head].seq:
                return None
            out.append((st.depid, st.deps))
    return out


def _follows(a: DraftStep, b: DraftStep) -> bool:
    return (b.type == a.type and a.src[0] == b.src[0] and a.dst[0] == b.dst[0]
            and b.src[1] == a.src[1] + a.cnt and b.dst[1] == a.dst[1] + a.cnt)


def _adjacent(steps: list[DraftStep], a: int, b: int) -> bool:
    return b > a and all(st.type == "nop" for st in steps[a + 1:b])


def merge_runs(codes: list[RankCode], moves: list[Move], instances: int, max_cnt: int) -> None:
    """Merge, in place, runs of sub-chunk moves of one transfer (pos // instances) into one step."""
    if instances == 1:
        return
    heads: dict[tuple[int, int, int], int] = {}  # (rank, tb, step) -> the step it merges into (same tb)
    extra: dict[tuple[int, int, int], list[Dep]] = {}  # (rank, tb, head) -> dependencies it takes over
    moves = sorted(moves, key=lambda m: m.pos)
    for a, b in zip(moves, moves[1:]):
        if a.pos // instances != b.pos // instances or a.src != b.src or a.dst != b.dst or a.chan != b.chan:
            continue
        s_code, r_code = codes[a.src], codes[a.dst]
        (sa_tb, sa), (sb_tb, sb) = s_code.send_at[a.pos], s_code.send_at[b.pos]
        (ra_tb, ra), (rb_tb, rb) = r_code.recv_at[a.pos], r_code.recv_at[b.pos]
        if sa_tb != sb_tb or ra_tb != rb_tb:
            continue
        s_steps, r_steps = s_code.tbs[sa_tb].steps, r_code.tbs[ra_tb].steps
        if not (_adjacent(s_steps, sa, sb) and _adjacent(r_steps, ra, rb)):
            continue
        s_head = heads.get((a.src, sa_tb, sa), sa)
        r_head = heads.get((a.dst, ra_tb, ra), ra)
        sh, rh = s_steps[s_head], r_steps[r_head]
        if sh.type != "s" or rh.type != "r" or sh.cnt + s_steps[sb].cnt > max_cnt:
            continue
        if not (_follows(s_steps[sa], s_steps[sb]) and _follows(r_steps[ra], r_steps[rb])):
            continue
        s_deps = _run_deps(s_code, sa_tb, s_head, sb)
        r_deps = _run_deps(r_code, ra_tb, r_head, rb)
        if s_deps is None or r_deps is None:
            continue
        for rank, tb, head, first, last, deps in ((a.src, sa_tb, s_head, sa, sb, s_deps),
                                                   (a.dst, ra_tb, r_head, ra, rb, r_deps)):
            steps = codes[rank].tbs[tb].steps
            for i in range(first + 1, last + 1):
                heads[(rank, tb, i)] = head
            steps[head].cnt += steps[last].cnt
            extra.setdefault((rank, tb, head), []).extend(deps)
    if not heads:
        return
    for code in codes:
        _compact(code, heads, extra)


def _compact(code: RankCode, heads: dict[tuple[int, int, int], int],
             extra: dict[tuple[int, int, int], list[Dep]]) -> None:
    """Drop the merged steps (and their nops) of one rank, put the dependencies they had on nops
    before their head, and renumber what refers to steps."""
    rank = code.rank
    index: list[list[int]] = []
    for t, tb in enumerate(code.tbs):
        new, kept = [], []
        for i, st in enumerate(tb.steps):
            head = heads.get((rank, t, i))
            if head is not None:
                new.append(-1)  # filled below: the head's new index
                tb.steps[head].hasdep |= st.hasdep
                continue
            more = extra.get((rank, t, i))
            if more:
                deps: dict[int, int] = {}
                for d, k in more + ([(st.depid, st.deps)] if st.depid >= 0 else []):
                    if d != t:
                        deps[d] = max(deps.get(d, -1), k)
                order = sorted(deps.items())
                for d, k in order[:-1]:
                    kept.append(DraftStep("nop", UNUSED, UNUSED, 0, d, k, seq=st.seq))
                st.depid, st.deps = order[-1] if order else (-1, -1)
            new.append(len(kept))
            kept.append(st)
        for i, v in enumerate(new):
            if v < 0:
                new[i] = new[heads[(rank, t, i)]]
        index.append(new)
        tb.steps[:] = kept
    _renumber(code, index)


def _renumber(code: RankCode, index: list[list[int]]) -> None:
    for tb in code.tbs:
        for st in tb.steps:
            if st.depid >= 0:
                st.deps = index[st.depid][st.deps]
    for at in (code.send_at, code.recv_at):
        for pos, (t, i) in at.items():
            at[pos] = (t, index[t][i])
