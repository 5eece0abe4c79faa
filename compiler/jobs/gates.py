"""Gates: dependencies that make a lower-priority job's program hold back from links a
higher-priority job uses, as the joint plan timed it.

A program runs each step as soon as its data and its thread block allow; a send of a chunk the GPU
holds from the start has no reason to wait. When the joint plan delays such a send (because a
link of its route is busy with a higher-priority job), the program would not: it would take the
link at once. A gate makes the send wait for a receive at the same rank that the plan completes
no later than the send starts (the latest such), so the runtime really holds back, on its own
data, with no clock. Only receives whose step comes earlier in the lowering's global order
(a smaller level) are used: every wait is then on an earlier op, so the lowering's deadlock-freedom
argument (compiler/lowering/lower.py) still holds; the verifier checks the result anyway.

A gate on a step that has no dependency becomes its dependency; otherwise a nop before it carries
the gate (MSCCL steps have one dependency each).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from compiler.jobs.timeline import Holdings, Placement
from compiler.jobs.view import JobView
from compiler.lowering.lower import transfer_levels
from compiler.model.program import GpuProgram, Program, Step, ThreadBlock
from compiler.model.topology import Topology

EPS = 1e-9


@dataclass(frozen=True)
class Gate:
    rank: int
    tb: int  # the gated send's thread block
    step: int
    wait_tb: int  # the receive it waits for
    wait_step: int


def held_at(placement: Placement, release: float) -> list[float]:
    """Per transfer: when its source held the value it sends, as placed."""
    s = placement.schedule
    holdings = Holdings(s.demand, release)
    out = []
    for t, end in zip(s.transfers, placement.ends):
        out.append(holdings.held(t))
        holdings.delivered(t, end)
    return out


def choose_gates(placement: Placement, where: dict, view: JobView, topo: Topology, busy: set[int],
                 release: float) -> list[Gate]:
    """A gate for each send the plan delayed on a link of `busy` (links of higher-priority jobs),
    where some earlier receive at its rank lands late enough to hold it back."""
    s = placement.schedule
    levels = transfer_levels(s)
    held = held_at(placement, release)
    into: dict[int, list[int]] = {}
    for k, t in enumerate(s.transfers):
        into.setdefault(t.dst, []).append(k)
    gates, last = [], {}
    for i, t in enumerate(s.transfers):
        start = placement.starts[i]
        if start <= held[i] + EPS or not busy & set(topo.path_links(view.to_global(t.path))):
            continue
        (rank, tb, step), _ = where[i]
        best = None
        for k in into.get(t.src, ()):
            (_, (_, rtb, rstep)) = where[k]
            end = placement.ends[k]
            if rtb == tb or levels[k] >= levels[i] or end > start + EPS or end <= held[i] + EPS:
                continue
            if best is None or end > best[0]:
                best = (end, rtb, rstep)
        if best is None or best[0] <= last.get((rank, tb), (-1.0, -1))[0] + EPS:
            continue
        if last.get((rank, tb), (-1.0, -1))[1] > step:
            continue  # a later step of this tb already waits longer
        last[(rank, tb)] = (best[0], step)
        gates.append(Gate(rank, tb, step, best[1], best[2]))
    return gates


def apply_gates(program: Program, gates: list[Gate]) -> Program:
    """The program with each gate as a dependency (or a nop carrying it)."""
    by_rank: dict[int, list[Gate]] = {}
    for g in gates:
        by_rank.setdefault(g.rank, []).append(g)
    gpus = []
    for gp in program.gpus:
        mine = by_rank.get(gp.rank)
        gpus.append(_gate_rank(gp, mine) if mine else gp)
    return replace(program, gpus=tuple(gpus))


def _gate_rank(gp: GpuProgram, gates: list[Gate]) -> GpuProgram:
    steps = {tb.id: tb.steps for tb in gp.tbs}
    wait = {(g.tb, g.step): (g.wait_tb, g.wait_step) for g in gates}
    nops: dict[int, set[int]] = {}  # tb -> positions of steps that get a nop (carrying the gate) before them
    for tb, k in wait:
        if steps[tb][k].depid >= 0:
            nops.setdefault(tb, set()).add(k)

    def new_index(tb: int, k: int) -> int:
        return k + sum(1 for p in nops.get(tb, ()) if p <= k)

    published = set(wait.values())
    tbs = []
    for tb in gp.tbs:
        out = []
        for k, st in enumerate(tb.steps):
            if st.depid >= 0:
                st = replace(st, deps=new_index(st.depid, st.deps))
            if (tb.id, k) in published:
                st = replace(st, hasdep=True)
            if (tb.id, k) in wait:
                wt, ws = wait[(tb.id, k)]
                if k in nops.get(tb.id, ()):
                    out.append(Step("nop", "o", -1, "o", -1, 0, wt, new_index(wt, ws), False))
                else:
                    st = replace(st, depid=wt, deps=new_index(wt, ws))
            out.append(st)
        tbs.append(ThreadBlock(tb.id, tb.send, tb.recv, tb.chan, tuple(out)))
    return replace(gp, tbs=tuple(tbs))
