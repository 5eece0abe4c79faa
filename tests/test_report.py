"""`msccl-compile report` and `--report`: one self-contained HTML page whose figures are embedded
and whose numbers are the timers' (checked against independent calls of the pipeline, the program
timer and the bound), plus the timeline replay it is drawn from."""

from __future__ import annotations

import base64
import json
import re
import shutil
import struct
import subprocess
import sys
import zlib
from html.parser import HTMLParser
from pathlib import Path

import numpy as np
import pytest

from compiler.analysis.bounds import lower_bound
from compiler.analysis.links import Costing
from compiler.analysis.simulate import program_floor, simulate
from compiler.analysis.timeline import critical_path, link_rows, program_timeline, schedule_timeline
from compiler.lowering.lower import LowerOptions
from compiler.model.demand import make_demand
from compiler.model.schedule import Schedule
from compiler.pipeline import CompileOptions, compile
from compiler.planners import PlanOptions
from compiler.program.timing import time_program
from compiler.specs.units import format_time
from tests.conftest import run_cli

REPO = Path(__file__).resolve().parents[1]
SIZE = 10**6
FIGURES = ("metrics", "links", "threadblocks", "waits")


# ---- helpers ----------------------------------------------------------------------------------------


def png_ok(data: bytes) -> bool:
    """A PNG by its own rules: signature, IHDR first, every chunk's CRC, IEND last."""
    if not data.startswith(b"\x89PNG\r\n\x1a\n"):
        return False
    pos, kinds = 8, []
    while pos < len(data):
        (length,) = struct.unpack(">I", data[pos:pos + 4])
        kind = data[pos + 4:pos + 8]
        body = data[pos + 8:pos + 8 + length]
        (crc,) = struct.unpack(">I", data[pos + 8 + length:pos + 12 + length])
        if zlib.crc32(kind + body) != crc:
            return False
        kinds.append(kind)
        pos += 12 + length
    return bool(kinds) and kinds[0] == b"IHDR" and kinds[-1] == b"IEND" and b"IDAT" in kinds


class Page(HTMLParser):
    """Tags with their attributes, ids, and the rows of every table by id."""

    def __init__(self, text: str):
        super().__init__(convert_charrefs=True)
        self.tags: list[tuple[str, dict]] = []
        self.ids: set[str] = set()
        self.tables: dict[str, list[list[tuple[str, dict]]]] = {}
        self._table: str | None = None
        self._cell: list | None = None
        self._text: list[str] = []
        self.feed(text)
        self.close()

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        self.tags.append((tag, a))
        if "id" in a:
            self.ids.add(a["id"])
        if tag == "table":
            self._table = a.get("id", f"table{len(self.tables)}")
            self.tables[self._table] = []
        elif tag == "tr" and self._table:
            self.tables[self._table].append([("row", a)])
        elif tag in ("td", "th") and self._table:
            self._cell, self._text = [a], []

    def handle_endtag(self, tag):
        if tag in ("td", "th") and self._cell is not None and self._table:
            self.tables[self._table][-1].append(("".join(self._text).strip(), self._cell[0]))
            self._cell = None
        elif tag == "table":
            self._table = None

    def handle_data(self, data):
        if self._cell is not None:
            self._text.append(data)

    def row(self, table: str, key: str) -> list[tuple[str, dict]]:
        found = [r for r in self.tables[table] if r[0][1].get("data-row") == key]
        assert len(found) == 1, (table, key, [r[0] for r in self.tables[table]])
        return found[0][2:]  # the cells after the row's label

    def images(self) -> dict[str, bytes]:
        out = {}
        for tag, a in self.tags:
            if tag == "img":
                src = a.get("src", "")
                assert src.startswith("data:image/png;base64,"), src[:60]
                out[a.get("id", "")] = base64.b64decode(src.split(",", 1)[1], validate=True)
        return out


def self_contained(text: str, page: Page) -> None:
    """Nothing the browser would fetch: no URL with a scheme or a network path, no scripts, no
    style sheets or fonts from elsewhere."""
    assert not re.search(r"https?://|//[a-z0-9.-]+\.[a-z]{2,}/", text, re.I)
    for tag, a in page.tags:
        assert tag not in ("script", "link", "iframe", "object", "embed"), tag
        for attr in ("src", "href", "data", "poster"):
            if attr in a:
                assert a[attr].startswith(("data:", "#")), (tag, attr, a[attr][:60])
    assert "@import" not in text and "url(" not in text


# ---- the CLI: a compile with --report, then the XML alone -------------------------------------------


@pytest.fixture(scope="module")
def pages(tmp_path_factory):
    d = tmp_path_factory.mktemp("report")
    first = run_cli("allgather", "--hw", "dgx-a100", "--size", "1MB", "-o", "a.xml", "--schedule-out", "s.json",
                    "--report", "compiled.html", "--json", cwd=d)
    assert first.returncode == 0, first.stderr
    second = run_cli("report", "a.xml", "--hw", "dgx-a100", "--size", "1MB", "-o", "bare.html", "--png", "figs",
                     "--json", cwd=d)
    assert second.returncode == 0, second.stderr
    return d, json.loads(first.stdout), json.loads(second.stdout)


def test_compile_report_is_one_self_contained_page(pages):
    d, out, _ = pages
    assert out["report"] == "compiled.html"
    text = (d / "compiled.html").read_text(encoding="utf-8")
    page = Page(text)
    self_contained(text, page)
    for section in ("metrics", "links", "threadblocks", "loss", "notes", "metrics-table", "links-table",
                    "critical-path"):
        assert section in page.ids, section
    # the late links' table, or the line that says no link is late (a program that keeps its plan)
    assert ("late-links" in page.ids) != ("No link is done later than planned" in text)
    images = page.images()
    assert set(images) == {f"fig-{n}" for n in FIGURES}
    assert all(png_ok(png) for png in images.values())
    assert "schedule and program side by side" in text


def test_compile_report_numbers_are_the_timers(pages):
    d, out, _ = pages
    page = Page((d / "compiled.html").read_text(encoding="utf-8"))
    from backends.msccl_xml import read_xml
    from compiler.model.profiles import load_topology
    topo = load_topology("dgx-a100")
    program = read_xml(d / "a.xml")
    program_s = time_program(program, topo, SIZE).finish_time_s
    planned_s = simulate(topo, Schedule.load(str(d / "s.json")), program.proto).finish_time_s
    ring = compile(topo, make_demand("allgather", 8, SIZE), CompileOptions(
        plan=PlanOptions(method="ring"), lower=LowerOptions(proto=program.proto, instances=0)))
    bound_s = program_floor(topo, lower_bound(topo, "allgather", SIZE))  # the bound of any program
    expected = {"plan": planned_s, "program": program_s, "ring-plan": ring.planned.finish_time_s,
                "ring-program": ring.timing.finish_time_s, "bound": bound_s}
    for key, seconds in expected.items():
        cells = page.row("metrics-table", key)
        assert cells[0][0] == format_time(seconds), (key, cells[0][0], seconds)
        assert float(cells[0][1]["data-seconds"]) == pytest.approx(seconds, rel=1e-12)
        assert cells[1][0] == f"{SIZE / seconds / 1e9:.2f}", key  # algbw
        assert cells[3][0] == f"{bound_s / seconds:.3f}", key  # of the bound
        assert cells[4][0] == f"{ring.timing.finish_time_s / seconds:.3f}", key  # ring / time
    assert out["transfer_time_s"] == pytest.approx(program_s)
    assert out["planned_transfer_time_s"] == pytest.approx(planned_s)
    text = (d / "compiled.html").read_text(encoding="utf-8")  # the headline states the loss against the plan
    assert f"The program takes {format_time(program_s)}, the plan {format_time(planned_s)}" in text
    assert len(page.tables["links-table"]) == 1 + len(topo.links)  # a header, then every link (all are used)


def test_bare_xml_report_and_png_dir(pages):
    d, _, out = pages
    text = (d / "bare.html").read_text(encoding="utf-8")
    page = Page(text)
    self_contained(text, page)
    keys = [r[0][1].get("data-row") for r in page.tables["metrics-table"][1:]]
    assert keys == ["program", "ring-plan", "ring-program", "bound"]  # no schedule for a bare file
    assert "Links: the program" in text and "side by side" not in text
    images = page.images()
    written = sorted(Path(p).name for p in out["written"] if p.endswith(".png"))
    assert written == sorted(f"{n}.png" for n in FIGURES)
    for name in FIGURES:  # the files are the page's figures, byte for byte
        png = (d / "figs" / f"{name}.png").read_bytes()
        assert png_ok(png) and png == images[f"fig-{name}"]


def test_a_bare_files_page_holds_its_program_to_the_compiles_floor_and_ring(pages):
    """The same file at the same size: its time, the ring baseline and the floor every ratio divides
    by are the compile's, and `msccl-compile bound` prints that floor too."""
    d, out, _ = pages
    compiled = Page((d / "compiled.html").read_text(encoding="utf-8"))
    bare = Page((d / "bare.html").read_text(encoding="utf-8"))
    for key in ("program", "ring-program", "bound"):
        assert bare.row("metrics-table", key) == compiled.row("metrics-table", key), key
    assert float(bare.row("metrics-table", "bound")[0][1]["data-seconds"]) == pytest.approx(out["lower_bound_s"])
    bound = run_cli("bound", "allgather", "--hw", "dgx-a100", "--size", "1MB", "--json", cwd=d)
    assert bound.returncode == 0, bound.stderr
    b = json.loads(bound.stdout)
    assert b["program_floor_s"] == pytest.approx(out["lower_bound_s"], rel=1e-12)
    assert b["time_s"] < b["program_floor_s"]  # the alpha-beta bound, below what any program pays


def test_a_file_for_another_gpu_count_is_refused_in_one_line_naming_it(pages):
    d, _, _ = pages
    for command in (["report", "a.xml", "--hw", "dgx2", "--size", "1MB", "-o", "wrong.html"],
                    ["simulate", "a.xml", "--hw", "dgx2", "--size", "1MB"]):
        proc = run_cli(*command, cwd=d)
        assert proc.returncode == 2, proc.stderr
        assert proc.stderr == "msccl-compile: error: a.xml: ngpus=8, but --hw dgx2 has 16 GPUs\n", proc.stderr
    assert not (d / "wrong.html").exists()
    odd = run_cli("report", "a.xml", "--hw", "dgx-a100", "--size", "1000001B", "-o", "odd.html", cwd=d)
    assert odd.returncode == 0 and "is not whole 4-byte elements" in odd.stderr  # as simulate warns


def test_report_refuses_before_any_work(tmp_path):
    nothing = run_cli("report", "no.xml", "--hw", "dgx-a100", "--size", "1MB", cwd=tmp_path)
    assert nothing.returncode == 2 and "give -o FILE.html, --png DIR or both" in nothing.stderr
    (tmp_path / "f").write_text("x")
    bad = run_cli("report", "no.xml", "--hw", "dgx-a100", "--size", "1MB", "--png", "f", cwd=tmp_path)
    assert bad.returncode == 2 and "--png: f: exists and is not a directory" in bad.stderr
    assert bad.stderr.count("\n") == 1


def test_without_matplotlib_one_line_and_exit_2(tmp_path):
    code = ("import sys\nsys.modules['matplotlib'] = None\nimport compiler.cli.main as c\n"
            "rc = c.main(sys.argv[1:])\nassert 'matplotlib' not in sys.modules or sys.modules['matplotlib'] is None\n"
            "sys.exit(rc)\n")
    for args in (["report", "a.xml", "--hw", "dgx-a100", "--size", "1MB", "-o", "r.html"],
                 ["allgather", "--hw", "dgx-a100", "--size", "1MB", "--report", "r.html"]):
        proc = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, cwd=tmp_path,
                              timeout=120)
        assert proc.returncode == 2, proc.stderr
        assert proc.stderr.count("\n") == 1 and 'pip install "msccl-compile[report]"' in proc.stderr, proc.stderr
        assert not list(tmp_path.iterdir())  # refused before planning: no XML, no page


def test_install_hint_names_the_extra_in_setup_py():
    from backends.report import EXTRA, INSTALL_HINT, PACKAGE
    setup = (REPO / "setup.py").read_text(encoding="utf-8")
    assert re.search(rf'name="{re.escape(PACKAGE)}"', setup)
    assert re.search(rf'"{EXTRA}": \["matplotlib', setup)
    assert re.search(r'"test": \[[^\]]*"matplotlib', setup)  # CI installs the test extra
    assert INSTALL_HINT == f'pip install "{PACKAGE}[{EXTRA}]"'


# ---- the timelines, without matplotlib --------------------------------------------------------------


def test_timeline_replays_a_copy_before_a_send_as_the_timer_times_it(topo):
    """msccl-tools' form of an allgather's own chunk: cpy i -> o, then a send of o on the same block.
    The copy holds the block for its bytes at a block's rate, so the send starts when it is done,
    in the replay as in the timer (no mismatch), and the copy counts as the block's busy time."""
    from compiler.model.program import GpuProgram, Program, Step, ThreadBlock
    t = topo("fully-connected:2")
    gpus = (GpuProgram(0, 1, 2, 0, (ThreadBlock(0, send=1, steps=(Step("cpy", "i", 0, "o", 0), Step("s", "o", 0, "o", 0))),)),
            GpuProgram(1, 1, 2, 0, (ThreadBlock(0, recv=0, steps=(Step("r", "o", 0, "o", 0),)),)))
    program = Program("copy", "allgather", 2, 2, 1, gpus, proto="Simple")
    prog = program_timeline(program, t, 2 * 2**20)
    copy, send = prog.steps[(0, 0, 0)], prog.steps[(0, 0, 1)]
    rate = t.costs.protocol("Simple").tb_rate(t.links[0].kind)
    assert prog.mismatches == 0 and copy.busy == pytest.approx(2**20 / rate) and send.start == copy.end
    assert prog.tbs[0].busy == pytest.approx(copy.busy + send.busy)


@pytest.mark.parametrize("hw,method", [("dgx-a100", "auto"), ("dgx1", "ring")])
def test_timeline_replays_the_timer(topo, hw, method):
    t = topo(hw)
    result = compile(t, make_demand("allgather", t.ngpus, SIZE), CompileOptions(plan=PlanOptions(method=method)))
    prog = program_timeline(result.program, t, SIZE)
    plan = schedule_timeline(t, result.schedule, result.planned, (result.program.proto,))
    assert prog.mismatches == 0 and plan.mismatches == 0
    assert prog.finish == result.timing.finish_time_s
    for tb in prog.tbs:  # busy + waiting + done is the program's time for every thread block
        assert tb.busy + tb.data_wait + tb.link_wait + tb.done == pytest.approx(prog.finish, rel=1e-9)
    lanes = Costing.of(t, result.program.proto).lanes
    for timeline, per_link in ((prog, lanes), (plan, lambda bw, kind: 1)):
        # no link carries more holds at once than it has parallel links (the program: thread-block lanes)
        for l, link in enumerate(t.links):
            events = sorted([(b.start, 1) for b in timeline.busy if b.link == l]
                            + [(b.end, -1) for b in timeline.busy if b.link == l])
            level = peak = 0
            for _, step in events:
                level += step
                peak = max(peak, level)
            assert peak <= link.count * per_link(link.bandwidth, link.kind), (hw, l, peak)
    sends = [s for s in prog.steps.values() if s.type in ("s", "rcs", "rrs", "rrcs")]
    assert len(sends) == result.timing.ntransfers
    rows = link_rows(t, prog, plan)
    grid = np.linspace(0.0, prog.finish, 20001)  # busy: the time a link carries anything, measured on a grid
    step = grid[1] - grid[0]
    for r in rows:
        holds = [(b.start, b.end) for b in prog.busy if b.link == r.link]
        covered = np.zeros(grid.shape, dtype=bool)
        for start, end in holds:
            covered |= (grid >= start) & (grid < end)
        assert r.prog_busy <= r.prog_end + 1e-15
        assert r.prog_busy == pytest.approx(covered.sum() * step, abs=(2 * len(holds) + 2) * step), r.name
    chain = critical_path(prog)
    assert chain and chain[-1].key == prog.last
    # each sets the next one's start: by its end, or (a send that freed a link) by its hold's end
    assert all((a.released if b.link_wait_on is not None and a.released is not None else a.end) <= b.start + 1e-15
               for a, b in zip(chain, chain[1:]))


def test_schedule_only_page_renders(topo):
    """--no-xml: the page shows the schedule alone (no thread blocks, no program to compare)."""
    from backends.report import figures, render_html, report_for_result
    t = topo("dgx-a100")
    result = compile(t, make_demand("allgather", 8, SIZE), CompileOptions(xml=False))
    r = report_for_result(result, with_ring=False)
    assert r.program is None and r.plan is not None
    text = render_html(r, figures(r))
    page = Page(text)
    self_contained(text, page)
    assert set(page.images()) == {"fig-metrics", "fig-links"}
    assert "threadblocks" not in page.ids and "Links: the schedule" in text


@pytest.mark.skipif(shutil.which("chromium") is None, reason="headless chromium is not installed")
def test_chromium_renders_the_page_offline(pages, tmp_path):
    d, _, _ = pages
    shot = tmp_path / "shot.png"
    proc = subprocess.run(["chromium", "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                           "--proxy-server=127.0.0.1:9", "--host-resolver-rules=MAP * ~NOTFOUND",
                           "--hide-scrollbars", "--window-size=1200,1600", f"--screenshot={shot}",
                           (d / "compiled.html").as_uri()], capture_output=True, text=True, timeout=90)
    assert proc.returncode == 0 and shot.is_file(), proc.stderr[-2000:]
    assert png_ok(shot.read_bytes())
    import matplotlib.image
    pixels = matplotlib.image.imread(str(shot))
    colours = {tuple(p) for p in pixels[::8, ::8].reshape(-1, pixels.shape[-1]).round(2).tolist()}
    assert len(colours) > 20  # figures drawn, not a blank or error page
