"""Planner-level rewrites, each a reduction in the cvxpy manner: `apply` turns a planning problem
into the problem(s) to plan instead and what `invert` needs; `invert` turns their schedules back
into a schedule of the original problem.

    TimeReverse      reduce_scatter / reduce -> the copy dual (contributors become destinations)
                     on the reversed topology; invert: every transfer turned around in time with
                     reduce=True. A rank's reversed send comes after the reversed sends of everyone
                     it fed, so it forwards the sum of its subtree.
    AllreducePhases  allreduce -> reduce-scatter (chunk k completes at its owner), then an
                     allgather of the reduced chunks; invert: the two schedules concatenated.
    Refine(parts)    every chunk cut into `parts` sub-chunks; invert: the identity (a schedule of
                     the finer demand is a schedule of the original).
    Symmetric        one representative per symmetry orbit; invert: the representatives' transfers
                     mapped onto every image, checked for link clashes.

registry.plan composes the first two (`plan_via`, for a planner that moves only copies: each
problem apply gives is planned through registry.plan again), auto applies refinement to its
candidates. The symmetric problem is not a (topology, demand) pair that any planner could take:
the representatives share every link's capacity with their images, which only the time-expanded
models state. So the planners that model it (milp, rounds) hand their planning function to
`Symmetric.plan`, which applies the reduction and falls back to the unreduced problem on a clash;
they call `invert` where their transfers are complete (before their own ordering). The LP takes
`orbits` and inverts its fluid routes (`Symmetric.invert_routes`) before rounding them.

The lowering's `instances` (k copies of the program on separate channels, each on 1/k of every
chunk) is not a planner rewrite: it splits the planned schedule's chunks while lowering and stays
in lowering/lower.py.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Callable, Generic, Protocol, TypeVar

from compiler.model.demand import Chunk, Demand
from compiler.model.schedule import Schedule, Transfer
from compiler.model.topology import Topology
from compiler.planners.options import PlanOptions
from compiler.specs.collectives import TWO_PHASES
from compiler.specs.errors import CompileError

if TYPE_CHECKING:  # numpy, and the symmetry search with it, load only where a symmetry is looked for
    import numpy as np

    from compiler.model.timing import TimeExpansion
    from compiler.planners.symmetry import Symmetry


@dataclass(frozen=True)
class Problem:
    """What a planner is asked: plan `demand` on `topology` under `options`."""
    topology: Topology
    demand: Demand
    options: PlanOptions


Inverse = TypeVar("Inverse")


class Reduction(Protocol, Generic[Inverse]):
    """A rewrite of a planning problem (TimeReverse, AllreducePhases, Refine)."""

    def apply(self, problem: Problem) -> tuple[tuple[Problem, ...], Inverse]:
        """The problems to plan instead, in the order they are planned, and what invert needs."""
        ...

    def invert(self, schedules: tuple[Schedule, ...], inverse: Inverse) -> Schedule:
        """One schedule of the original problem from the schedules of apply's problems."""
        ...


def plan_via(reduction: Reduction[Inverse], problem: Problem, plan: Callable[[Problem], Schedule]) -> Schedule:
    """Apply `reduction`, plan its problems one after the other with `plan`, invert."""
    problems, inverse = reduction.apply(problem)
    return reduction.invert(tuple(plan(p) for p in problems), inverse)


# ---- reductions as the time reverse of their copy dual -------------------------------------------


DUAL = "dual-"  # the collective name of a reduction's copy dual: dual-reduce, dual-reduce_scatter


def dual_demand(demand: Demand) -> Demand:
    """The copy demand whose time reverse is `demand`: contributors become destinations."""
    if not demand.reduce:
        raise CompileError("dual_demand: only reductions have a copy dual")
    chunks = []
    for c in demand.chunks:
        if len(c.dests) != 1:
            raise CompileError(f"{demand.collective}: chunk {c.id} has several destinations; plan it as allreduce")
        chunks.append(Chunk(c.id, c.dests, c.sources, c.dst_index, c.src_index, c.job))
    return replace(demand, collective=f"{DUAL}{demand.collective}", chunks=tuple(chunks), reduce=False,
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


@dataclass(frozen=True)
class TimeReverse:
    """A reduction whose chunks each complete at one rank, planned as its copy dual in reverse."""

    def apply(self, problem: Problem) -> tuple[tuple[Problem, ...], Problem]:
        dual = Problem(problem.topology.reversed(), dual_demand(problem.demand), problem.options)
        return (dual,), problem

    def invert(self, schedules: tuple[Schedule, ...], original: Problem) -> Schedule:
        (dual,) = schedules
        return reverse_schedule(dual, original.demand, original.topology)


# ---- allreduce as reduce-scatter then allgather --------------------------------------------------


def allreduce_phases(demand: Demand) -> tuple[Demand, Demand]:
    """(reduce-scatter with chunk k owned by rank k mod N, allgather of the reduced chunks)."""
    rs, ag = [], []
    for c in demand.chunks:
        owner = c.sources[c.id % len(c.sources)]
        idx = c.src_index[c.sources.index(owner)]
        rs.append(Chunk(c.id, c.sources, (owner,), c.src_index, (idx,), c.job))
        ag.append(Chunk(c.id, (owner,), c.dests, (idx,), c.dst_index, c.job))
    reduce, copy = TWO_PHASES
    return (replace(demand, collective=reduce, chunks=tuple(rs)),
            replace(demand, collective=copy, chunks=tuple(ag), reduce=False))


def concatenate(first: Schedule, second: Schedule, demand: Demand) -> Schedule:
    """`second` after `first` (epochs shifted), as one schedule for `demand`."""
    shift = first.epochs
    moved = [replace(t, start=t.start + shift, arrive=t.arrive + shift) for t in second.transfers]
    return replace(first, demand=demand, transfers=first.transfers + tuple(moved), epochs=shift + second.epochs,
                   solve_time=first.solve_time + second.solve_time,
                   gap=max((g for g in (first.gap, second.gap) if g is not None), default=None),
                   status=first.status if first.status == second.status else "feasible",
                   notes=first.notes + second.notes)


@dataclass(frozen=True)
class AllreducePhases:
    """A reduction whose chunks complete at several ranks: reduce-scatter, then allgather.
    The reduce-scatter phase gets half the time left before options.deadline (which must be set:
    registry.plan sets it), so that it cannot take it all; the allgather phase the rest."""

    def apply(self, problem: Problem) -> tuple[tuple[Problem, ...], Demand]:
        rs, ag = allreduce_phases(problem.demand)
        options = problem.options
        # the reduce-scatter phase may not take it all; none where the deadline has passed (a failure then said
        # "time_limit=-0.15 s")
        half = max(0.0, options.deadline - time.perf_counter()) / 2
        first = replace(options, deadline=time.perf_counter() + half, time_limit=min(options.time_limit, half))
        return (Problem(problem.topology, rs, first), Problem(problem.topology, ag, options)), problem.demand

    def invert(self, schedules: tuple[Schedule, ...], demand: Demand) -> Schedule:
        first, second = schedules
        return concatenate(first, second, demand)


def for_reduction(demand: Demand) -> TimeReverse | AllreducePhases:
    """How a planner that moves only copies plans the reduction `demand`."""
    return AllreducePhases() if any(len(c.dests) > 1 for c in demand.chunks) else TimeReverse()


def copy_demand(demand: Demand) -> Demand:
    """The copy demand an optimiser sees for `demand`: itself, a reduction's copy dual, or
    allreduce's allgather phase (its reduce-scatter phase is the dual of a demand of that size)."""
    if not demand.reduce:
        return demand
    return allreduce_phases(demand)[1] if any(len(c.dests) > 1 for c in demand.chunks) else dual_demand(demand)


# ---- finer chunks --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Refine:
    """Every chunk cut into `parts` sub-chunks (pipelining, finer epochs)."""
    parts: int

    def apply(self, problem: Problem) -> tuple[tuple[Problem, ...], None]:
        return (replace(problem, demand=problem.demand.split(self.parts)),), None

    def invert(self, schedules: tuple[Schedule, ...], inverse: None = None) -> Schedule:
        (fine,) = schedules
        return fine  # a schedule of the finer demand moves every byte of the original


# ---- symmetry ------------------------------------------------------------------------------------


Routes = dict[tuple[int, int], list[tuple[tuple[int, ...], float, float]]]  # the LP's, see lp.routes


class SymmetryClash(Exception):
    """The mapped schedule overloads a link (cannot happen with exact orbit capacities)."""


@dataclass(frozen=True)
class Orbits:
    """A problem reduced by a symmetry: only the representatives' chunks are planned (their ids,
    symmetry.rep_chunks, are the columns of `images`); every link's capacity is shared with the
    images of all of them."""
    sym: Symmetry
    images: np.ndarray  # (group size, representatives' chunks): the chunk id of each image


def orbits(topo: Topology, demand: Demand) -> Orbits | None:
    """The topology's symmetry where it maps the demand onto itself, else None."""
    from compiler.planners.symmetry import chunk_images, find_symmetry
    sym = find_symmetry(topo)
    images = chunk_images(sym, demand) if sym is not None else None
    return Orbits(sym, images) if images is not None else None


@dataclass(frozen=True)
class Symmetric:
    """Plan one representative per orbit of the topology's symmetry (options.symmetry), not with
    switch multicast (options.multicast)."""

    def apply(self, problem: Problem) -> Orbits | None:
        options = problem.options
        return orbits(problem.topology, problem.demand) if options.symmetry and not options.multicast else None

    def invert(self, reduced: Orbits, topo: Topology, te: TimeExpansion, transfers: list[Transfer],
               chunk_ids: list[int]) -> tuple[list[Transfer], str]:
        """The representatives' transfers (of chunks chunk_ids, planned on `te`) mapped onto every
        GPU, checked against link capacity (raises SymmetryClash), and a note saying what was solved."""
        from compiler.planners.flows import capacity_violations
        from compiler.planners.symmetry import map_transfers
        sym = reduced.sym
        transfers = map_transfers(sym, topo, transfers, reduced.images, chunk_ids)
        clash = capacity_violations(topo, te, transfers)
        if clash:
            raise SymmetryClash(clash[0])
        who = "GPU 0's chunks" if sym.reps == (0,) else f"the chunks of GPUs {', '.join(map(str, sym.reps))}"
        return transfers, f"symmetry: solved {who} and mapped them by {sym.describe()}"

    def plan(self, problem: Problem, planner: Callable[[Orbits | None], Schedule]) -> Schedule:
        """planner(reduced) where the reduction applies, and planner(None) otherwise or when
        planner's invert finds that the mapped schedule overloads a link."""
        reduced = self.apply(problem)
        if reduced is not None:
            try:
                return planner(reduced)
            except SymmetryClash as clash:
                return planner(None).with_notes(f"symmetric solution overloaded {clash}; solved without symmetry")
        return planner(None)

    @staticmethod
    def invert_routes(sym: Symmetry, routes: Routes) -> Routes:
        """The LP's routes of the representative sources, {(source, dest): [(vertex path, amount,
        when)]}, mapped onto every source."""
        mapped: dict[tuple[int, int], list] = {}
        for p in sym.perms:
            for (s, d), options in routes.items():
                mapped[(int(p[s]), int(p[d]))] = [(tuple(int(p[v]) for v in path), v, w) for path, v, w in options]
        return mapped


SYMMETRY = Symmetric()
