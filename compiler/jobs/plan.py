"""Several jobs planned together on one shared topology.

    plan_jobs(topology, jobs, JobsOptions) -> JobsResult

The method (a decomposition; a joint MILP over every job's chunks is far beyond two cores for a
cluster of 32 GPUs, see the README):
1. each job is planned alone on its view (compiler/jobs/view.py) with the pipeline (`auto` by
   default), lowered and verified: its program alone, and its time alone on the idle cluster;
   jobs whose views, collectives and sizes are the same share one plan;
2. naive: every job's alone program, all run together;
3. candidates: for each priority order, jobs are placed in turn on what the earlier ones left
   (compiler/jobs/timeline.py: each job's plan re-timed and re-routed on the shared links), and
   each later job's program is re-lowered from its re-timed schedule with gates that hold its
   sends back from the busy links as the plan timed them (compiler/jobs/gates.py), then verified;
4. every candidate, the naive way included, is timed by the program timer with all jobs running
   together (compiler/jobs/overlay.py), and the objective picks one: `weighted` the smallest
   weighted sum of the jobs' times, `fair` the largest min over jobs of (time alone / time shared).
The naive way is a candidate, so the joint plan is never worse than it by the same judge.
"""

from __future__ import annotations

import itertools
import time
from dataclasses import dataclass, field, replace

from compiler.jobs import OBJECTIVES
from compiler.jobs.gates import apply_gates, choose_gates
from compiler.jobs.overlay import Placed, run_together
from compiler.jobs.spec import JobSpec
from compiler.jobs.timeline import Timeline, place
from compiler.jobs.view import JobView, job_view
from compiler.lowering.lower import LowerOptions, lower, program_name
from compiler.model.demand import make_demand
from compiler.model.linknames import link_names
from compiler.model.program import Program
from compiler.model.schedule import Schedule
from compiler.model.topology import Topology
from compiler.pipeline import CompileOptions, Result, compile
from compiler.planners import PlanOptions
from compiler.program.timing import call_bytes
from compiler.program.verify import verify
from compiler.realise import aimed_runtime
from compiler.specs.errors import CompileError
from compiler.specs.runtimes import ALL

ALONE_SHARE = 0.45  # of the time limit for planning the jobs alone; the candidates take the rest
MAX_ORDERS = 6  # priority orders tried (every order for up to 3 jobs)


@dataclass(frozen=True)
class JobsOptions:
    objective: str = "weighted"
    method: str = "auto"
    time_limit: float = 60.0  # seconds for the whole plan
    runtime: str = ALL
    proto: str = "Simple"
    progress: object = None  # callable(str) or None


@dataclass(frozen=True)
class Candidate:
    label: str  # "naive" or the priority order, e.g. "tp0 > tp1"
    order: tuple[int, ...]  # job indices, highest priority first; () for naive
    programs: tuple[Program, ...]
    schedules: tuple[Schedule, ...]
    finish: tuple[float, ...]
    gates: tuple[int, ...]  # gates added per job
    notes: tuple[str, ...] = ()
    family: str = "alone"  # which of each job's plans (plan_variants) it runs
    used: tuple = ()  # per job: the Result (plan, program) it runs, before gates
    costed: bool = True  # timed under the runtime cost model (else in alpha-beta: overlay.run_together)


@dataclass(frozen=True)
class JobPlan:
    spec: JobSpec
    view: JobView
    alone: Result  # planned alone on its view
    program: Program  # the joint program (its alone program where the plan keeps it)
    schedule: Schedule  # the joint schedule (on the view)
    finish_s: float
    alone_s: float
    naive_s: float
    gates: int
    method: str  # the plan it runs jointly: planner/chunks per rank

    @property
    def slowdown(self) -> float:
        return self.finish_s / self.alone_s if self.alone_s > 0 else 1.0


@dataclass(frozen=True)
class JobsResult:
    topology: Topology
    objective: str
    jobs: tuple[JobPlan, ...]
    chosen: str  # label of the chosen candidate
    candidates: tuple[tuple[str, float, float], ...]  # (label, weighted sum, min alone/shared)
    shared: tuple[tuple[str, tuple[str, ...]], ...]  # (link name, jobs using it), links of two or more jobs
    plan_time_s: float
    notes: tuple[str, ...] = field(default=())

    def weighted(self, which: str) -> float:
        return sum(j.spec.weight * getattr(j, which) for j in self.jobs)


def _signature(view: JobView, spec: JobSpec) -> tuple:
    return (spec.collective, spec.size, spec.root, replace(view.topology, name=""))


def plan_alone(topo: Topology, jobs: tuple[JobSpec, ...], views: list[JobView], options: JobsOptions,
               deadline: float) -> list[Result]:
    """Each job planned alone on its view; identical jobs (view, collective, size) share a plan."""
    distinct = {_signature(v, j) for v, j in zip(views, jobs)}
    share = max(1.0, (deadline - time.perf_counter()) * ALONE_SHARE / len(distinct))
    done: dict[tuple, Result] = {}
    out = []
    for v, j in zip(views, jobs):
        key = _signature(v, j)
        if key not in done:
            if options.progress:
                options.progress(f"planning job {j.name} alone ({j.collective}, {j.ngpus} GPUs)")
            demand = make_demand(j.collective, j.ngpus, j.size, 1, j.root)
            plan = PlanOptions(method=options.method, time_limit=share, refine=True)
            done[key] = compile(v.topology, demand, CompileOptions(plan, LowerOptions(proto=options.proto),
                                                                   options.runtime))
        out.append(done[key])
    return out


VARIANT_METHOD = "hier"  # the other plan each job may run with when it shares the cluster
VARIANT_PARTS = (1, 2)  # ... at the alone plan's chunks per rank, times these


def plan_variants(jobs, views, alone: list[Result], options: JobsOptions) -> list[dict[str, Result]]:
    """Per job, the plans it may run with in a joint plan, by label (planner/chunks): `auto`'s, and
    the hierarchical baseline at the same and at twice its chunks per rank, where that applies (it
    sends each chunk across the network once and then fans it out, which leaves a job little
    to send on shared NICs late and gives a later job's gates receives to wait on)."""
    done: dict[tuple, dict[str, Result]] = {}
    out = []
    for v, j, r in zip(views, jobs, alone):
        key = _signature(v, j)
        if key not in done:
            found = {plan_label(r): r}
            for parts in VARIANT_PARTS:
                chunks = r.demand.chunks_per_rank * parts
                label = f"{VARIANT_METHOD}/{chunks}ch"
                if label in found:
                    continue
                try:
                    demand = make_demand(j.collective, j.ngpus, j.size, chunks, j.root)
                    if demand.chunk_bytes % 4:
                        continue
                    found[label] = compile(v.topology, demand, CompileOptions(
                        PlanOptions(method=VARIANT_METHOD, time_limit=10.0), LowerOptions(proto=options.proto),
                        options.runtime))
                except CompileError:
                    continue  # the baseline does not apply to this job (one node, a reduction, limits)
            done[key] = found
        out.append(done[key])
    return out


def _placed(job: JobSpec, view: JobView, program: Program) -> Placed:
    return Placed(program, view.ranks, call_bytes(program, job.size), job.start_s)


def _lower_gated(job: JobSpec, view: JobView, schedule: Schedule, gates_for, options: JobsOptions,
                 alone: Result) -> tuple[Program, int, str | None]:
    """The re-timed schedule lowered, gated and verified; the alone program where that fails."""
    try:
        where: dict = {}
        aimed = aimed_runtime(schedule, options.runtime, view.topology.vendor)
        program = lower(schedule, view.topology, LowerOptions(proto=options.proto, runtime=aimed), where)
        gates = gates_for(where)
        gated = apply_gates(program, gates)
        verdict = verify(gated, options.runtime, demand=schedule.demand, sms=view.topology.sms)
        if not verdict.ok:
            return alone.program, 0, f"{job.name}: gated program failed verification ({verdict.summary()}); kept alone"
        return gated, len(gates), None
    except CompileError as e:
        return alone.program, 0, f"{job.name}: could not re-lower ({e}); kept its alone program"


def priority_candidate(topo: Topology, jobs, views, plans: list[Result], order: tuple[int, ...],
                       options: JobsOptions, family: str = "alone", costed: bool = True) -> Candidate:
    """Jobs placed in `order` on what the earlier ones left; each later job that meets a busy link
    re-lowered from its re-timed schedule with gates (compiler/jobs/gates.py)."""
    timeline = Timeline(topo)
    programs: list[Program | None] = [None] * len(jobs)
    schedules: list[Schedule | None] = [None] * len(jobs)
    gates = [0] * len(jobs)
    notes = []
    busy: set[int] = set()
    for rank_in_order, j in enumerate(order):
        job, view = jobs[j], views[j]
        placement = place(timeline, view, plans[j].schedule, job.start_s)
        schedules[j] = placement.schedule
        if rank_in_order == 0 or not busy & placement.links:
            programs[j] = plans[j].program
        else:
            gates_for = lambda where, p=placement, v=view, b=frozenset(busy), s=job.start_s: \
                choose_gates(p, where, v, topo, b, s)  # noqa: E731
            programs[j], gates[j], note = _lower_gated(job, view, placement.schedule, gates_for, options, plans[j])
            if note:
                notes.append(note)
        busy |= placement.links
    placed = [_placed(job, view, p) for job, view, p in zip(jobs, views, programs)]
    timed = run_together(topo, placed, costed)
    label = " > ".join(jobs[j].name for j in order) + ("" if family == "alone" else f" ({family} plans)")
    return Candidate(label, order, tuple(programs), tuple(schedules), timed.finish, tuple(gates), tuple(notes), family,
                     tuple(plans), costed=timed.costed)


def orders(jobs: tuple[JobSpec, ...], alone_s: list[float]) -> list[tuple[int, ...]]:
    """Smith's rule first (weight / time alone, highest first: the order that minimises a weighted
    sum of completion times on one shared resource), then every other order for up to 3 jobs,
    else weight alone and the reverses."""
    n = len(jobs)
    smith = tuple(sorted(range(n), key=lambda j: (-jobs[j].weight / max(alone_s[j], 1e-12), j)))
    if n <= 3:
        return list(dict.fromkeys([smith] + list(itertools.permutations(range(n)))))[:MAX_ORDERS]
    heavy = tuple(sorted(range(n), key=lambda j: (-jobs[j].weight, j)))
    return list(dict.fromkeys([smith, heavy, smith[::-1], heavy[::-1]]))


def score(objective: str, jobs, finish, alone_s) -> tuple[float, float]:
    weighted = sum(j.weight * f for j, f in zip(jobs, finish))
    fairness = min((a / f if f > 0 else 1.0) for a, f in zip(alone_s, finish))
    return (weighted, -fairness) if objective == "weighted" else (-fairness, weighted)


def shared_links(topo: Topology, jobs, views, programs) -> tuple[tuple[str, tuple[str, ...]], ...]:
    """Named links that the programs of two or more jobs use (their connections' routes)."""
    names = link_names(topo)
    users: dict[str, list[str]] = {}
    for job, view, p in zip(jobs, views, programs):
        mine = set()
        for g in p.gpus:
            for tb in g.tbs:
                if tb.send >= 0:
                    path = topo.best_path(view.ranks[g.rank], view.ranks[tb.send])
                    mine |= {names[l] for l in topo.path_links(path)}
        for name in mine:
            users.setdefault(name, []).append(job.name)
    return tuple((n, tuple(u)) for n, u in sorted(users.items()) if len(u) > 1)


def best_alone(topo: Topology, jobs, views, variants: list[dict[str, Result]],
               costed: bool = True) -> tuple[list[Result], list[float], bool]:
    """Per job, the plan that is fastest on an idle cluster (its "alone" plan) and that time, and
    whether every such time is under the runtime cost model."""
    plans, times, all_costed = [], [], True
    for j, v, found in zip(jobs, views, variants):
        runs = [run_together(topo, [_placed(j, v, r.program)], costed) for r in found.values()]
        all_costed &= all(x.costed for x in runs)
        t, _, r = min(((x.finish[0], k, r) for k, (x, r) in enumerate(zip(runs, found.values()))), key=lambda x: x[:2])
        plans.append(r)
        times.append(max(t, 1e-12))
    return plans, times, all_costed


def together(label: str, topo, jobs, views, plans: list[Result], family: str = "alone",
             costed: bool = True) -> Candidate:
    """Every job on the given plans, run together with no priority."""
    timed = run_together(topo, [_placed(j, v, r.program) for j, v, r in zip(jobs, views, plans)], costed)
    notes = () if timed.agrees else (f"{label}: the per-job times read from the program timer's trace do not add up "
                                     f"to its finish ({timed.makespan:.6g} s); the timer's cost model may have changed",)
    return Candidate(label, (), tuple(r.program for r in plans), tuple(r.schedule for r in plans), timed.finish,
                     (0,) * len(jobs), notes, family=family, used=tuple(plans), costed=timed.costed)


def priority_candidates(topo, jobs, views, variants, alone, alone_s, options, deadline,
                        costed: bool = True) -> tuple[list, list[str]]:
    """For each priority order (Smith's rule first) and family of plans, a gated candidate, while
    one like the slowest so far still fits before the deadline (at least one is always tried)."""
    out, skipped, slowest = [], [], 0.0
    for order in orders(jobs, alone_s):
        for family, plans in plan_families(variants, alone):
            what = f"priority {' > '.join(jobs[j].name for j in order)} with {family} plans"
            if out and time.perf_counter() + slowest > deadline:
                skipped.append(what)
                continue
            if options.progress:
                options.progress(f"candidate: {what}")
            started = time.perf_counter()
            out.append(priority_candidate(topo, jobs, views, plans, order, options, family, costed))
            slowest = max(slowest, time.perf_counter() - started)
    return out, skipped


def plan_families(variants: list[dict[str, Result]], alone: list[Result]) -> list[tuple[str, list[Result]]]:
    """("alone", every job's alone plan), then each label with every job on its plan of that label
    (its alone plan where it has none), leaving out repeats."""
    out, seen = [], set()
    for family in ["alone"] + list(dict.fromkeys(f for v in variants for f in v)):
        plans = [a if family == "alone" else v.get(family, a) for v, a in zip(variants, alone)]
        key = tuple(id(r) for r in plans)
        if key not in seen:
            seen.add(key)
            out.append((family, plans))
    return out


def own_name(program: Program, job: JobSpec, view: JobView, used: Result) -> Program:
    """The program under its job's name: identical jobs share one plan, lowered on the first one's view."""
    return replace(program, name=program_name(job.collective, view.topology.name, used.schedule.planner))


def plan_jobs(topo: Topology, jobs: tuple[JobSpec, ...], options: JobsOptions = JobsOptions()) -> JobsResult:
    if options.objective not in OBJECTIVES:
        raise CompileError(f"objective={options.objective!r}: not one of {', '.join(OBJECTIVES)}")
    t0 = time.perf_counter()
    deadline = t0 + options.time_limit
    views = [job_view(topo, j.ranks, j.name) for j in jobs]
    auto = plan_alone(topo, jobs, views, options, deadline)
    if any(r.program is None for r in auto):
        raise CompileError("jobs: a job's plan has no program (" + (auto[0].skipped or "no XML") + ")")
    variants = plan_variants(jobs, views, auto, options) if len(jobs) > 1 else [{"auto": r} for r in auto]

    def evaluate(costed: bool) -> tuple:
        alone, alone_s, alone_costed = best_alone(topo, jobs, views, variants, costed)
        naive = together("naive", topo, jobs, views, alone, costed=costed)
        candidates, skipped = [naive], []
        if len(jobs) > 1:
            candidates += [together(f"together ({f} plans)", topo, jobs, views, plans, f, costed)
                           for f, plans in plan_families(variants, alone)[1:]]
            more, skipped = priority_candidates(topo, jobs, views, variants, alone, alone_s, options, deadline, costed)
            candidates += more
        return alone, alone_s, naive, candidates, skipped, alone_costed and all(c.costed for c in candidates)

    # an overlay that can only be timed in alpha-beta (a late job; protocols or chunk sizes that differ) has every
    # figure timed so, the times alone too (a job is never late for itself), or a slowdown would compare two models
    costed = not any(j.start_s > 0 for j in jobs)  # a late job's overlays are alpha-beta: no costed pass first
    alone, alone_s, naive, candidates, skipped, all_costed = evaluate(costed)
    if costed and not all_costed:
        alone, alone_s, naive, candidates, skipped, _ = evaluate(False)
    costed = costed and all_costed
    best = min(candidates, key=lambda c: (score(options.objective, jobs, c.finish, alone_s), c.order != ()))
    plans = tuple(JobPlan(j, v, r, own_name(best.programs[i], j, v, best.used[i]), best.schedules[i], best.finish[i],
                          alone_s[i], naive.finish[i], best.gates[i], plan_label(best.used[i]))
                  for i, (j, v, r) in enumerate(zip(jobs, views, alone)))
    table = tuple((c.label, *_scores(jobs, c.finish, alone_s)) for c in candidates)
    notes = tuple(dict.fromkeys(n for c in candidates for n in c.notes))
    if skipped:
        notes += (f"time limit reached; not tried: {'; '.join(skipped)}",)
    if not costed:
        why = ("a job starts late" if any(j.start_s > 0 for j in jobs)
               else "the jobs' programs differ in protocol or chunk size")
        notes += (f"times in alpha-beta, not under the runtime cost model ({why}): they leave out the launch and "
                  "step latencies, so `simulate` of a job's file alone reports more",)
    return JobsResult(topo, options.objective, plans, best.label, table,
                      shared_links(topo, jobs, views, best.programs), time.perf_counter() - t0, notes)


def plan_label(r: Result) -> str:
    return f"{r.schedule.planner}/{r.demand.chunks_per_rank}ch"


def _scores(jobs, finish, alone_s) -> tuple[float, float]:
    w, f = score("weighted", jobs, finish, alone_s)
    return w, -f
