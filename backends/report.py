"""The report page: one self-contained HTML file (templates/report.html.j2) showing what a schedule
and its MSCCL program do over time, and where the program loses time against the plan.

    report_for_result(result, lower_options)            a compile: schedule and program
    report_for_program(program, topology, size, source)  a bare XML file: the program alone
    write_report(report, html=PATH, png_dir=DIR)         the page and/or the figures alone

The page holds:
- metrics: the schedule's (planned) and the program's time, algbw and busbw, against the ring
  baseline compiled through the same pipeline (same collective, topology, size, protocol and
  runtimes; its instances searched for RING_SECONDS at most) and the program floor that compile's
  and simulate's `bound_ratio` divide by (compiler/analysis/bounds.py, simulate.program_floor);
- per link, when it is busy in the schedule and in the program, side by side (a Gantt chart);
- per rank, its thread blocks' busy and waiting time;
- where the program waits: per link, how much later than planned it is done and how long sends
  queued for it; the sends that waited longest for a link; the chain of steps that sets the finish.
The timelines come from compiler/analysis/timeline.py. Figures are matplotlib PNGs embedded as
data: URIs, the style sheet is inline: the page needs no network. matplotlib is an optional
extra (`report`): it is imported only here, and only when figures are drawn; `require_matplotlib`
says how to install it in one line.
"""

from __future__ import annotations

import base64
import io
import math
import os
from dataclasses import dataclass, field, replace
from importlib import resources

from compiler.analysis.simulate import bound_of, program_floor
from compiler.analysis.timeline import (LinkRow, ProgramTimeline, ScheduleTimeline, StepTime, critical_path,
                                        link_rows, program_timeline, schedule_timeline, worst_link_waits)
from compiler.fileio import atomic_write, make_directory
from compiler.model.program import Program
from compiler.model.topology import Topology
from compiler.specs.collectives import COLLECTIVES, CUSTOM, bus_factor
from compiler.specs.errors import CompileError
from compiler.specs.runtimes import ALL
from compiler.specs.units import format_size, format_time

PACKAGE = "msccl-compile"  # setup.py's name
EXTRA = "report"  # setup.py's extra that brings matplotlib
INSTALL_HINT = f'pip install "{PACKAGE}[{EXTRA}]"'
RING = "ring"  # the baseline planner
RING_SECONDS = 10.0  # the ring baseline's instance search (unbounded, it took 30 s on DGX H100 x 4)
FIGURES = ("metrics", "links", "threadblocks", "waits")  # file names of --png, in page order
MAX_LINK_ROWS = 64  # links drawn in the Gantt chart (beyond that: those that wait, then the busiest)
MAX_TB_ROWS = 128  # thread blocks drawn one per row; beyond that, one row per rank
TOP = 12  # rows of the "waits longest" tables


class ReportError(CompileError):
    pass


def require_matplotlib() -> None:
    """One line and exit status 2 where matplotlib is missing (call before any long work)."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise ReportError(f"report: matplotlib is not installed; {INSTALL_HINT}") from None


# ---- what the page shows ----------------------------------------------------------------------------


@dataclass(frozen=True)
class MetricRow:
    key: str  # plan, program, ring-plan, ring-program, bound
    label: str
    time_s: float | None
    algbw: float | None = None  # B/s
    busbw: float | None = None
    bound_ratio: float | None = None  # bound / time
    vs_ring: float | None = None  # ring program time / time: > 1 is faster than ring
    note: str = ""


@dataclass(frozen=True)
class Report:
    title: str
    facts: tuple[tuple[str, str], ...]  # (what, value) lines of the header
    topology: Topology
    collective: str
    size_bytes: float  # the bytes algbw counts
    metrics: tuple[MetricRow, ...]
    program: ProgramTimeline | None
    plan: ScheduleTimeline | None
    links: tuple[LinkRow, ...]
    notes: tuple[str, ...] = ()
    planner_notes: tuple[str, ...] = ()
    waits: tuple[StepTime, ...] = field(default=(), compare=False)
    critical: tuple[StepTime, ...] = field(default=(), compare=False)

    @property
    def loss_s(self) -> float | None:
        """Program time minus planned time."""
        if self.program is None or self.plan is None:
            return None
        return self.program.finish - self.plan.finish


def _per_second(nbytes: float, seconds: float | None) -> float | None:
    if seconds is None:
        return None
    return nbytes / seconds if seconds > 0 else math.inf


def _row(key: str, label: str, time_s: float | None, collective: str, ngpus: int, nbytes: float,
         bound_s: float | None, note: str = "") -> MetricRow:
    algbw = _per_second(nbytes, time_s)
    busbw = None if algbw is None or collective == CUSTOM else algbw * bus_factor(collective, ngpus)
    ratio = bound_s / time_s if bound_s is not None and time_s else None
    return MetricRow(key, label, time_s, algbw, busbw, ratio, None, note)


def _with_vs_ring(rows: list[MetricRow]) -> tuple[MetricRow, ...]:
    ring = next((r.time_s for r in rows if r.key == "ring-program" and r.time_s), None)
    if ring is None:
        ring = next((r.time_s for r in rows if r.key == "ring-plan" and r.time_s), None)
    return tuple(replace(r, vs_ring=ring / r.time_s if ring and r.time_s else None) for r in rows)


def _ring_rows(topo: Topology, demand, lower_options, runtime: str, collective: str, nbytes: float,
               bound_s: float | None) -> tuple[list[MetricRow], str | None]:
    """The ring baseline for the same demand (a Demand, or a function that makes it), planned and
    lowered through the pipeline, its search over instances cut at RING_SECONDS."""
    import time
    from compiler.pipeline import CompileOptions, compile_schedule
    from compiler.planners import PlanOptions, plan
    try:
        schedule = plan(topo, demand() if callable(demand) else demand, PlanOptions(method=RING))
    except CompileError as e:
        return [], f"ring baseline: no schedule ({e})"
    options = CompileOptions(PlanOptions(method=RING, deadline=time.perf_counter() + RING_SECONDS),
                             replace(lower_options, name=None, min_bytes=0, max_bytes=0), runtime)
    note = None
    try:
        ring = compile_schedule(topo, schedule, options)
    except CompileError as e:
        ring, note = compile_schedule(topo, schedule, replace(options, xml=False)), f"ring baseline: no program ({e})"
    n = topo.ngpus
    rows = [_row("ring-plan", f"ring schedule (planned, {_chunks(schedule.demand)})", ring.planned.finish_time_s,
                 collective, n, nbytes, bound_s)]
    if ring.timing is not None:
        p = ring.program
        rows.append(_row("ring-program", f"ring program ({p.proto}, {ring.realisation.instances} instance"
                         f"{'s' if ring.realisation.instances > 1 else ''})", ring.timing.finish_time_s, collective,
                         n, nbytes, bound_s))
    return rows, note


def _chunks(demand) -> str:
    k = demand.chunks_per_rank
    return f"{k} chunk{'s' if k > 1 else ''} per rank"


def report_for_result(result, lower_options=None, with_ring: bool = True) -> Report:
    """The page of a compile (compiler.pipeline.Result): the schedule and, where one was written,
    its program. lower_options: the compile's, for the ring baseline (protocol, instances)."""
    from compiler.lowering.lower import LowerOptions
    from compiler.pipeline import demand_chunks
    from compiler.program.timing import call_bytes
    topo, schedule, planned, demand = result.topology, result.schedule, result.planned, result.demand
    collective, nbytes, n = demand.collective, demand.size_bytes, topo.ngpus
    lower_options = lower_options or LowerOptions()
    notes: list[str] = []
    plan = schedule_timeline(topo, schedule, planned,
                             (None,) + ((result.program.proto,) if result.program is not None else ()))
    if plan.mismatches:
        notes.append(f"{plan.mismatches} of {len(schedule.transfers)} transfers: the recomputed link hold does not "
                     "match the simulator's delivery time; the schedule's Gantt chart is approximate")
    program = None
    if result.program is not None:
        size = nbytes if collective != CUSTOM else call_bytes(result.program, demand_chunks(demand)[1])
        program = program_timeline(result.program, topo, size)
        if result.timing is not None and not math.isclose(program.finish, result.timing.finish_time_s,
                                                          rel_tol=1e-9, abs_tol=1e-15):
            notes.append(f"the program timed again takes {format_time(program.finish)}, the compile said "
                         f"{format_time(result.timing.finish_time_s)}")
    elif result.skipped:
        notes.append(f"no program: {result.skipped}")
    else:
        notes.append("no program (--no-xml): the schedule alone")
    bound_s = planned.lower_bound_s
    rows = [_row("plan", f"this schedule (planned, {schedule.planner}, {_chunks(demand)})", planned.finish_time_s,
                 collective, n, nbytes, bound_s)]
    if program is not None:
        rows.append(_row("program", "this program", program.finish, collective, n, nbytes, bound_s))
    if with_ring:
        from compiler.model.demand import make_demand
        ring_demand = demand if collective == CUSTOM else (lambda: make_demand(collective, n, nbytes, 1, demand.root))
        ring_rows, why = _ring_rows(topo, ring_demand, replace(lower_options, proto=(
            result.program.proto if result.program is not None else lower_options.proto)), result.runtime,
            collective, nbytes, bound_s)
        rows += ring_rows
        if why:
            notes.append(why)
    rows.append(_bound_row(bound_of(topo, demand), bound_s, collective, n, nbytes))
    facts = [("collective", collective), ("hardware", f"{topo.name} ({topo.ngpus} GPUs)"),
             ("size", _size_fact(demand)), ("planner", f"{schedule.planner} ({schedule.status})")]
    if result.program is not None:
        p = result.program
        facts += [("program", f"{p.proto}, {p.nchannels} channel{'s' if p.nchannels > 1 else ''}, up to "
                              f"{p.nthreadblocks_max} thread blocks per rank"),
                  ("written", ", ".join(f.path for f in result.files) or "-")]
    title = f"{collective} on {topo.name}, {format_size(nbytes)}"
    return _finish(Report(title, tuple(facts), topo, collective, nbytes, _with_vs_ring(rows), program, plan,
                          tuple(link_rows(topo, program, plan)), tuple(notes), tuple(schedule.notes)))


def _bound_row(bound, floor_s: float, collective: str, n: int, nbytes: float) -> MetricRow:
    """The floor every ratio divides by: the alpha-beta bound, plus what every program pays under the
    runtime cost model where that is more."""
    label = f"lower bound ({bound.binding})"
    if floor_s > bound.time_s * (1 + 1e-9):
        label = (f"program floor (the alpha-beta bound, {format_time(bound.time_s)}, plus what every program pays "
                 f"under the runtime cost model; binding: {bound.binding})")
    algbw = _per_second(nbytes, floor_s)
    return MetricRow("bound", label, floor_s, algbw, None if collective == CUSTOM else algbw * bus_factor(collective, n),
                     1.0)


def _size_fact(demand) -> str:
    from compiler.pipeline import demand_chunks
    if demand.collective != CUSTOM:
        return f"{format_size(demand.size_bytes)}, {_chunks(demand)}"
    count, each = demand_chunks(demand)
    return f"{format_size(each)} per chunk, {count} chunks ({format_size(demand.size_bytes)} in all)"


def report_for_program(program: Program, topo: Topology, size: int, source: str, with_ring: bool = True) -> Report:
    """The page of an MSCCL program read from a file (size: as `msccl-compile simulate --size`
    takes it: nccl-tests' size, or one chunk of a custom program's demand)."""
    from compiler.analysis.bounds import lower_bound
    from compiler.lowering.lower import LowerOptions
    from compiler.model.demand import make_demand
    from compiler.pipeline import demand_chunks
    from compiler.program.timing import call_bytes
    collective, n = program.collective, topo.ngpus
    nbytes = size
    if collective == CUSTOM and program.demand is not None:
        nbytes = size * demand_chunks(program.demand)[0]
    timeline = program_timeline(program, topo, call_bytes(program, size))
    notes = ["a bare program: there is no schedule to compare with; compile with --report to see both"]
    bound, bound_s = None, None
    if collective in COLLECTIVES:  # the floor compile and simulate divide by
        bound = lower_bound(topo, collective, size)
        bound_s = program_floor(topo, bound)
    rows = [_row("program", "this program", timeline.finish, collective, n, nbytes, bound_s)]
    if with_ring and collective in COLLECTIVES:
        ring_rows, why = _ring_rows(topo, lambda: make_demand(collective, n, size),
                                    LowerOptions(proto=program.proto, instances=0), ALL, collective, nbytes, bound_s)
        rows += ring_rows
        if why:
            notes.append(why)
    elif with_ring:
        notes.append("no ring baseline or lower bound for a custom demand read from a file")
    if bound is not None:
        rows.append(_bound_row(bound, bound_s, collective, n, nbytes))
    at = format_size(size) + (" per chunk" if collective == CUSTOM and program.demand is not None else "")
    facts = (("file", source), ("collective", collective), ("hardware", f"{topo.name} ({topo.ngpus} GPUs)"),
             ("size", at), ("program", f"{program.proto}, {program.nchannels} channel"
                                       f"{'s' if program.nchannels > 1 else ''}, up to {program.nthreadblocks_max} "
                                       "thread blocks per rank"))
    title = f"{os.path.basename(source)}: {collective} on {topo.name}, {at}"
    return _finish(Report(title, facts, topo, collective, nbytes, _with_vs_ring(rows), timeline, None,
                          tuple(link_rows(topo, timeline, None)), tuple(notes), tuple(program.notes)))


def _finish(r: Report) -> Report:
    notes = list(r.notes)
    if r.program is not None:
        if r.program.mismatches:
            notes.append(f"{r.program.mismatches} sends: the replay of the program timer's trace does not reproduce "
                         "its ready times (a cost the replay does not know); waits are approximate")
        return replace(r, notes=tuple(notes), waits=tuple(worst_link_waits(r.program, TOP)),
                       critical=tuple(critical_path(r.program)))
    return r


# ---- figures ----------------------------------------------------------------------------------------


def _unit(seconds: float) -> tuple[str, float]:
    for name, f in (("s", 1.0), ("ms", 1e-3), ("us", 1e-6)):
        if seconds >= f:
            return name, f
    return "ns", 1e-9


def _png(fig) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100, bbox_inches="tight", metadata={"Software": None})
    return buf.getvalue()


def _rank_colors(n: int):
    from matplotlib import colormaps
    cmap = colormaps["tab20"] if n > 10 else colormaps["tab10"]
    return [cmap(i % cmap.N) for i in range(max(n, 1))]


def _lanes(busy, count: int) -> list[int]:
    """A lane (one of `count` parallel links) per hold in start order, each a free one."""
    free = [-math.inf] * max(count, 1)
    out = []
    for b in busy:
        lane = min(range(len(free)), key=lambda k: (free[k] > b.start + 1e-18, free[k]))
        free[lane] = b.end
        out.append(lane)
    return out


SHORT = {"plan": "this schedule (planned)", "program": "this program", "ring-plan": "ring schedule (planned)",
         "ring-program": "ring program", "bound": "lower bound"}


def figure_metrics(r: Report):
    from matplotlib.figure import Figure
    rows = [m for m in r.metrics if m.time_s is not None]
    unit, f = _unit(max(m.time_s for m in rows))
    fig = Figure(layout="constrained", figsize=(8, 0.45 * len(rows) + 1.2))
    ax = fig.subplots()
    colors = {"plan": "#4c72b0", "program": "#dd8452", "ring-plan": "#8fa8cf", "ring-program": "#eab38f",
              "bound": "#55a868"}
    ys = range(len(rows))
    ax.barh(list(ys), [m.time_s / f for m in rows], color=[colors.get(m.key, "#999999") for m in rows])
    for y, m in zip(ys, rows):
        ax.text(m.time_s / f, y, f" {format_time(m.time_s)}", va="center", fontsize=8)
    ax.set_yticks(list(ys), [SHORT.get(m.key, m.label) for m in rows], fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel(f"time ({unit})")
    ax.set_xlim(0, max(m.time_s for m in rows) / f * 1.25)
    ax.set_title("time of one call")
    return fig


def _link_order(r: Report) -> tuple[list[int], int]:
    rows = list(r.links)
    if len(rows) > MAX_LINK_ROWS:
        # the links where the program waits or is late first (where the time goes), then the busiest
        rows = sorted(rows, key=lambda x: (-(x.prog_wait + max(x.late or 0.0, 0.0)),
                                           -max(x.prog_busy, x.plan_busy or 0.0), x.link))[:MAX_LINK_ROWS]
        rows.sort(key=lambda x: x.link)
    return [x.link for x in rows], len(r.links)


def figure_links(r: Report):
    from matplotlib.figure import Figure
    from matplotlib.patches import Patch
    links, total = _link_order(r)
    panels = []
    if r.plan is not None:
        panels.append(("schedule (planned)", r.plan.busy, r.plan.finish))
    if r.program is not None:
        panels.append(("program", r.program.busy, r.program.finish))
    end = max(p[2] for p in panels)
    unit, f = _unit(end)
    colors = _rank_colors(r.topology.ngpus)
    row_of = {l: i for i, l in enumerate(links)}
    fig = Figure(layout="constrained", figsize=(5.5 * len(panels) + 2.5, 0.26 * len(links) + 1.8))
    axes = fig.subplots(1, len(panels), sharey=True, squeeze=False)[0]
    for ax, (title, busy, finish) in zip(axes, panels):
        per_link: dict[int, list] = {}
        for b in busy:
            if b.link in row_of:
                per_link.setdefault(b.link, []).append(b)
        for l, holds in per_link.items():
            holds.sort(key=lambda b: (b.start, b.end))
            count = r.topology.links[l].count
            lanes = _lanes(holds, count)
            h = 0.8 / max(count, 1)
            for lane in range(max(count, 1)):
                mine = [b for b, k in zip(holds, lanes) if k == lane]
                if mine:
                    ax.broken_barh([(b.start / f, (b.end - b.start) / f) for b in mine],
                                   (row_of[l] - 0.4 + lane * h, h * 0.92),
                                   facecolors=[colors[b.src % len(colors)] for b in mine],
                                   edgecolor="white", linewidth=0.3)
        ax.axvline(finish / f, color="black", linestyle="--", linewidth=0.8)
        ax.set_title(f"{title}: {format_time(finish)}", fontsize=10)
        ax.set_xlim(0, end / f * 1.02)
        ax.set_xlabel(f"time ({unit})")
        ax.grid(axis="x", alpha=0.3)
    from compiler.analysis.timeline import link_name
    axes[0].set_yticks(range(len(links)), [link_name(r.topology, l) for l in links], fontsize=7)
    axes[0].set_ylim(len(links) - 0.5, -0.5)
    shown = "" if len(links) == total else f" ({len(links)} of {total} links: where it waits, then the busiest)"
    fig.suptitle(f"when each link is busy{shown}; colour: sending rank", fontsize=10)
    n = r.topology.ngpus
    if n <= 20:
        fig.legend(handles=[Patch(color=colors[k], label=f"rank {k}") for k in range(n)], loc="outside lower center",
                   ncol=min(n, 10), fontsize=7, frameon=False)
    return fig


TB_PARTS = (("busy", "busy (sending)", "#4c72b0"), ("data_wait", "waiting for data", "#dd8452"),
            ("link_wait", "waiting for a link", "#c44e52"), ("done", "done", "#dddddd"))


def tb_rows(r: Report) -> tuple[list[str], list[dict[str, float]], bool]:
    """(labels, {part: seconds} per row, per_rank): one row per thread block, or the mean over each
    rank's thread blocks where there are more than MAX_TB_ROWS."""
    tbs = r.program.tbs
    if len(tbs) <= MAX_TB_ROWS:
        return ([t.label for t in tbs], [{k: getattr(t, k) for k, _, _ in TB_PARTS} for t in tbs], False)
    labels, values = [], []
    for rank in sorted({t.rank for t in tbs}):
        mine = [t for t in tbs if t.rank == rank]
        labels.append(f"rank {rank} ({len(mine)} tbs)")
        values.append({k: sum(getattr(t, k) for t in mine) / len(mine) for k, _, _ in TB_PARTS})
    return labels, values, True


def figure_threadblocks(r: Report):
    from matplotlib.figure import Figure
    labels, values, per_rank = tb_rows(r)
    unit, f = _unit(r.program.finish)
    fig = Figure(layout="constrained", figsize=(9, 0.2 * len(labels) + 1.6))
    ax = fig.subplots()
    left = [0.0] * len(labels)
    ys = list(range(len(labels)))
    for key, label, color in TB_PARTS:
        widths = [v[key] / f for v in values]
        ax.barh(ys, widths, left=left, color=color, label=label, height=0.8)
        left = [a + b for a, b in zip(left, widths)]
    ax.set_yticks(ys, labels, fontsize=6 if len(labels) > 40 else 8)
    ax.set_ylim(len(labels) - 0.5, -0.5)
    ax.set_xlabel(f"time ({unit})")
    ax.set_xlim(0, r.program.finish / f * 1.01)
    ax.legend(loc="lower center", bbox_to_anchor=(0.5, 1.0), ncol=4, fontsize=8, frameon=False)
    fig.suptitle("thread blocks: " + ("mean over each rank's thread blocks" if per_rank else "one row each"),
                 fontsize=10)
    return fig


def figure_waits(r: Report):
    from matplotlib.figure import Figure
    rows = [x for x in r.links if x.prog_wait > 0 or (x.late or 0) > 0]
    rows = sorted(rows, key=lambda x: (-(x.late or 0.0), -x.prog_wait, x.link))[:20]
    fig = Figure(layout="constrained", figsize=(8, 0.3 * max(len(rows), 1) + 1.6))
    ax = fig.subplots()
    if not rows:
        none = "no send waited for a link" + (" and no link is done later than planned" if r.plan else "")
        ax.text(0.5, 0.5, none, ha="center", va="center", transform=ax.transAxes)
        ax.set_axis_off()
        return fig
    unit, f = _unit(max(max(x.prog_wait, x.late or 0.0) for x in rows))
    ys = list(range(len(rows)))
    h = 0.4 if r.plan is not None else 0.8
    if r.plan is not None:
        ax.barh([y - h / 2 for y in ys], [max(x.late or 0.0, 0.0) / f for x in rows], height=h, color="#8172b3",
                label="done later than planned")
    ax.barh([y + (h / 2 if r.plan is not None else 0) for y in ys], [x.prog_wait / f for x in rows], height=h,
            color="#c44e52", label="sends waiting for it (sum)")
    ax.set_yticks(ys, [x.name for x in rows], fontsize=7)
    ax.set_ylim(len(rows) - 0.5, -0.5)
    ax.set_xlabel(f"time ({unit})")
    ax.legend(fontsize=8, loc="lower right")
    ax.set_title("links where the program loses time" + (" against the plan" if r.plan is not None else ""),
                 fontsize=10)
    return fig


def figures(r: Report) -> dict[str, bytes]:
    """name -> PNG bytes, in FIGURES order (those the report has data for)."""
    require_matplotlib()  # figures are drawn on matplotlib.figure.Figure: no pyplot, no GUI backend
    out: dict[str, bytes] = {}
    draw = {"metrics": figure_metrics, "links": figure_links, "threadblocks": figure_threadblocks,
            "waits": figure_waits}
    for name in FIGURES:
        if name in ("threadblocks", "waits") and r.program is None:
            continue
        if name == "links" and not r.links:
            continue
        out[name] = _png(draw[name](r))
    return out


# ---- the page ---------------------------------------------------------------------------------------


def _template():
    import jinja2
    text = resources.files("templates").joinpath("report.html.j2").read_text(encoding="utf-8")
    env = jinja2.Environment(autoescape=True, trim_blocks=True, lstrip_blocks=True, undefined=jinja2.StrictUndefined)
    env.filters["t"] = lambda s: "-" if s is None else format_time(s)
    env.filters["gbps"] = lambda b: "-" if b is None else ("inf" if math.isinf(b) else f"{b / 1e9:.2f}")
    env.filters["ratio"] = lambda x: "-" if x is None else f"{x:.3f}"
    env.filters["pct"] = lambda x: "-" if x is None else f"{x:.1%}"
    return env.from_string(text)


def _step_label(st: StepTime) -> str:
    return f"rank {st.rank} tb {st.tb} step {st.step}"


def render_html(r: Report, figs: dict[str, bytes]) -> str:
    from compiler.analysis.timeline import link_name
    images = {name: "data:image/png;base64," + base64.b64encode(png).decode("ascii") for name, png in figs.items()}
    tb_labels, tb_values, per_rank = tb_rows(r) if r.program is not None else ([], [], False)
    ranks = []
    if r.program is not None:
        for rank in sorted({t.rank for t in r.program.tbs}):
            ranks.append((rank, [t for t in r.program.tbs if t.rank == rank]))
    waits = [dict(step=_step_label(st), type=st.type, chan=st.chan, ready=st.ready, start=st.start,
                  wait=st.link_wait, link=link_name(r.topology, st.link_wait_on) if st.link_wait_on is not None
                  else "-") for st in r.waits]
    critical = [dict(step=_step_label(st), type=st.type, chan=st.chan, start=st.start, end=st.end,
                     data_wait=st.data_wait, link_wait=st.link_wait, busy=st.busy,
                     why="; ".join(x for x in (
                         f"waited {format_time(st.data_wait)} for {st.waited_for}" if st.waited_for else "",
                         f"waited {format_time(st.link_wait)} for link "
                         f"{link_name(r.topology, st.link_wait_on)}" if st.link_wait_on is not None else "")
                         if x)) for st in r.critical]
    late_links = sorted((x for x in r.links if (x.late or 0) > 0 or x.prog_wait > 0),
                        key=lambda x: (-(x.late or 0.0), -x.prog_wait, x.link))[:TOP]
    return _template().render(
        r=r, images=images, captions=captions(r), per_rank=per_rank, ranks=ranks, waits=waits,
        critical=critical, late_links=late_links, tb_parts=TB_PARTS,
        finish=r.program.finish if r.program is not None else None,
        plan_finish=r.plan.finish if r.plan is not None else None)


def captions(r: Report) -> dict[str, str]:
    plan, program = r.plan is not None, r.program is not None
    shown = ", ".join(x for x in ("this schedule as planned" if plan else "", "its program" if plan and program else
                                  "this program" if program else "") if x)
    sides = ("in the schedule as the simulator times it and in the program as the program timer times it" if plan
             and program else "in the program as the program timer times it" if program else
             "in the schedule as the simulator times it")
    return {
        "metrics": f"Time of one call: {shown}, the ring baseline and the lower bound.",
        "links": "When each link is busy (one row per directed link, a parallel link split into lanes), "
                 f"{sides}; the dashed line is the finish.",
        "threadblocks": "Each thread block's time: busy sending, waiting for its message or dependency, waiting for "
                        "a link while ready, and done before the program finishes.",
        "waits": ("Links where the program loses time: how much later than planned the program is done with the "
                  "link, and how long its sends queued for it while ready." if plan else
                  "Links the program's sends queue for while ready, and for how long in all."),
    }


def write_report(r: Report, html: str | os.PathLike | None = None,
                 png_dir: str | os.PathLike | None = None) -> list[str]:
    """Write the page and/or the figures (DIR/NAME.png, FIGURES); returns the paths written
    (through compiler.fileio: inside outputs(), all at the end or none)."""
    figs = figures(r)
    written = []
    if html is not None:
        atomic_write(html, render_html(r, figs))
        written.append(str(html))
    if png_dir is not None:
        check_png_dir(png_dir)
        make_directory(png_dir)
        for name, png in figs.items():
            path = os.path.join(png_dir, f"{name}.png")
            atomic_write(path, png)
            written.append(path)
    return written


def check_png_dir(path: str | os.PathLike, field: str = "--png") -> None:
    if os.path.exists(path) and not os.path.isdir(path):
        raise ReportError(f"{field}: {path}: exists and is not a directory")
