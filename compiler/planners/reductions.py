"""Planning the reductions from their copy duals, and allreduce as two phases.

Reduce-scatter is the time reverse of an allgather (reduce of a broadcast): plan the dual demand on
the reversed topology, then turn every transfer around in time with reduce=True. A rank's reversed
send comes after the reversed sends of everyone it fed, so it forwards the sum of its subtree.
Allreduce is reduce-scatter (chunk k completes at its owner) followed by an allgather of the
reduced chunks, in one schedule.
"""

from __future__ import annotations

from dataclasses import replace

from compiler.model.demand import Chunk, Demand
from compiler.specs.errors import CompileError
from compiler.model.schedule import Schedule, Transfer
from compiler.model.topology import Topology


def dual_demand(demand: Demand) -> Demand:
    """The copy demand whose time reverse is `demand`: contributors become destinations."""
    if not demand.reduce:
        raise CompileError("dual_demand: only reductions have a copy dual")
    chunks = []
    for c in demand.chunks:
        if len(c.dests) != 1:
            raise CompileError(f"{demand.collective}: chunk {c.id} has several destinations; plan it as allreduce")
        chunks.append(Chunk(c.id, c.dests, c.sources, c.dst_index, c.src_index, c.job))
    return replace(demand, collective=f"dual-{demand.collective}", chunks=tuple(chunks), reduce=False,
                   input_chunks=demand.output_chunks, output_chunks=demand.input_chunks)


def reverse_schedule(dual: Schedule, demand: Demand, topo: Topology) -> Schedule:
    """Turn a schedule for the dual demand (planned on topo.reversed()) into one for `demand`."""
    if any(t.group >= 0 for t in dual.transfers):
        raise CompileError("multicast=True: reductions cannot use switch multicast in MSCCL; plan with multicast=False")
    k = dual.epochs
    transfers = [Transfer(t.chunk, t.dst, t.src, tuple(reversed(t.path)), k - t.arrive, k - t.start, True)
                 for t in dual.transfers]
    transfers.sort(key=lambda t: (t.start, t.arrive))
    return replace(dual, demand=demand, topology=topo.name, transfers=tuple(transfers),
                   notes=dual.notes + ("reduction planned as the time reverse of its copy dual",))


def allreduce_phases(demand: Demand) -> tuple[Demand, Demand]:
    """(reduce-scatter with chunk k owned by rank k mod N, allgather of the reduced chunks)."""
    n = demand.ngpus
    rs, ag = [], []
    for c in demand.chunks:
        owner = c.sources[c.id % len(c.sources)]
        idx = c.src_index[c.sources.index(owner)]
        rs.append(Chunk(c.id, c.sources, (owner,), c.src_index, (idx,), c.job))
        ag.append(Chunk(c.id, (owner,), c.dests, (idx,), c.dst_index, c.job))
    base = replace(demand, collective="reduce_scatter")
    return (replace(base, chunks=tuple(rs)),
            replace(demand, collective="allgather", chunks=tuple(ag), reduce=False))


def concatenate(first: Schedule, second: Schedule, demand: Demand) -> Schedule:
    """`second` after `first` (epochs shifted), as one schedule for `demand`."""
    shift = first.epochs
    moved = [replace(t, start=t.start + shift, arrive=t.arrive + shift) for t in second.transfers]
    return replace(first, demand=demand, transfers=first.transfers + tuple(moved), epochs=shift + second.epochs,
                   solve_time=first.solve_time + second.solve_time,
                   gap=max((g for g in (first.gap, second.gap) if g is not None), default=None),
                   status=first.status if first.status == second.status else "feasible",
                   notes=first.notes + second.notes)
