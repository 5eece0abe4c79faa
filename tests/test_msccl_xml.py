"""MSCCL XML writer and reader: the portable subset, exact round trips, other tools' files, and one
clear line for every malformed input."""

import re

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from lxml import etree

from backends.msccl_xml import UNLIMITED_MAX_BYTES, XmlError, read_xml, save_xml, to_xml
from compiler.specs.errors import CompileError
from compiler.model.program import BUFFERS, PROTOCOLS, STEP_TYPES, GpuProgram, Program, Step, ThreadBlock

ALGO_ATTRS = ["name", "proto", "nchannels", "nchunksperloop", "ngpus", "coll", "inplace", "outofplace", "minBytes",
              "maxBytes"]
STEP_ATTRS = ["s", "type", "srcbuf", "srcoff", "dstbuf", "dstoff", "cnt", "depid", "deps", "hasdep"]


def small_program(collective="allgather", max_bytes=0, **kw) -> Program:
    """The §15 worked example's two-tb ring allgather on 4 GPUs."""
    gpus = []
    for r in range(4):
        prev, nxt = (r - 1) % 4, (r + 1) % 4
        rx = ThreadBlock(0, -1, prev, 0, tuple(
            Step("r", "o", (r - k) % 4, "o", (r - k) % 4, 1, -1, -1, k < 3) for k in (1, 2, 3)))
        tx = ThreadBlock(1, nxt, -1, 0, (
            Step("cpy", "i", 0, "o", r, 1), Step("s", "o", r, "o", r, 1),
            Step("s", "o", (r - 1) % 4, "o", (r - 1) % 4, 1, 0, 0), Step("s", "o", (r - 2) % 4, "o", (r - 2) % 4, 1, 0, 1)))
        gpus.append(GpuProgram(r, 1, 4, 0, (rx, tx)))
    return Program("ring_allgather_4gpu_2tb_deps", collective, 4, 4, 1, tuple(gpus), max_bytes=max_bytes, **kw)


# ---- writing ---------------------------------------------------------------------------------------


def test_worked_example_text():
    xml = to_xml(small_program(max_bytes=1073741824))
    lines = xml.splitlines()
    assert lines[0] == ('<algo name="ring_allgather_4gpu_2tb_deps" proto="Simple" nchannels="1" nchunksperloop="4" '
                        'ngpus="4" coll="allgather" inplace="0" outofplace="1" minBytes="0" maxBytes="1073741824">')
    assert lines[1] == '  <gpu id="0" i_chunks="1" o_chunks="4" s_chunks="0">'
    assert lines[2] == '    <tb id="0" send="-1" recv="3" chan="0">'
    assert lines[3] == ('      <step s="0" type="r" srcbuf="o" srcoff="3" dstbuf="o" dstoff="3" cnt="1" depid="-1" '
                        'deps="-1" hasdep="1"/>')
    assert lines[-1] == "</algo>" and xml.endswith("</algo>\n")


def test_portable_subset_rules():
    xml = to_xml(small_program())
    assert "\t" not in xml and not xml.startswith("<?xml") and "'" not in xml
    assert not re.search(r'="-?0[0-9]', xml)
    for line in xml.splitlines():
        assert line.count("<") == 1 and line.count(">") == 1, line
        assert not re.search(r"\S  ", line), line  # single spaces between attributes
        assert line == line.rstrip()
    root = etree.fromstring(xml.encode())
    assert list(root.attrib) == ALGO_ATTRS
    for step in root.iter("step"):
        assert list(step.attrib) == STEP_ATTRS
    for gpu in root.iter("gpu"):
        assert [int(tb.get("id")) for tb in gpu.iter("tb")] == list(range(len(gpu.findall("tb"))))
        for tb in gpu.iter("tb"):
            assert [int(s.get("s")) for s in tb.iter("step")] == list(range(len(tb.findall("step"))))


def test_max_bytes_zero_is_written_finite_and_read_back_as_zero():
    p = small_program()
    xml = to_xml(p)
    assert f'maxBytes="{UNLIMITED_MAX_BYTES}"' in xml
    assert read_xml(xml).max_bytes == 0
    assert read_xml(to_xml(small_program(max_bytes=12345))).max_bytes == 12345


@pytest.mark.parametrize("runtime,spelling", [("executor", "reducescatter"), ("rccl", "reducescatter"),
                                              ("all", "reducescatter"), ("old", "reduce_scatter")])
def test_reduce_scatter_spelling_per_runtime(runtime, spelling):
    p = small_program("reduce_scatter")
    xml = to_xml(p, runtime)
    assert f'coll="{spelling}"' in xml
    assert read_xml(xml) == p


def test_unwritable_programs_and_runtimes():
    with pytest.raises(XmlError, match=r"runtime: .\w*. is not a runtime"):
        to_xml(small_program(), "nccl")
    with pytest.raises(XmlError, match="name"):
        to_xml(Program('a"b', "allgather", 1, 1, 1, ()))
    with pytest.raises(XmlError, match="collective"):
        to_xml(Program("x", "allpairs", 1, 1, 1, ()))


def test_save_xml_is_atomic_and_reads_back(tmp_path):
    p = small_program()
    path = tmp_path / "ag.xml"
    save_xml(p, path)
    assert path.read_text() == to_xml(p)
    assert read_xml(path) == p and read_xml(str(path)) == p
    assert [f.name for f in tmp_path.iterdir()] == ["ag.xml"]
    with pytest.raises(CompileError, match="does not exist"):
        save_xml(p, tmp_path / "missing" / "ag.xml")


# ---- round trips -----------------------------------------------------------------------------------

ints = st.integers(min_value=-1, max_value=40)


@st.composite
def programs(draw):
    ngpus = draw(st.integers(1, 4))
    gpus = []
    for r in range(ngpus):
        tbs = []
        for t in range(draw(st.integers(0, 3))):
            peers = st.sampled_from([-1] + [q for q in range(ngpus) if q != r])
            steps = tuple(Step(draw(st.sampled_from(STEP_TYPES)), draw(st.sampled_from(BUFFERS)), draw(ints),
                               draw(st.sampled_from(BUFFERS)), draw(ints), draw(st.integers(0, 71)), draw(ints),
                               draw(ints), draw(st.booleans()))
                          for _ in range(draw(st.integers(0, 4))))
            tbs.append(ThreadBlock(t, draw(peers), draw(peers), draw(st.integers(0, 32)), steps))
        gpus.append(GpuProgram(r, draw(st.integers(0, 9)), draw(st.integers(0, 9)), draw(st.integers(0, 9)),
                               tuple(tbs)))
    coll = draw(st.sampled_from(["allgather", "alltoall", "reduce_scatter", "allreduce", "broadcast", "reduce",
                                 "gather", "scatter", "custom"]))
    name = draw(st.from_regex(r"[A-Za-z0-9._:+@-]{1,20}", fullmatch=True))
    return Program(name, coll, ngpus, draw(st.integers(1, 64)), draw(st.integers(1, 33)), tuple(gpus),
                   draw(st.sampled_from(PROTOCOLS)), draw(st.booleans()), draw(st.booleans()),
                   draw(st.integers(0, 2 ** 40 - 1)), draw(st.integers(0, 2 ** 40 - 1)))


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(programs(), st.sampled_from(["executor", "rccl", "old"]))
def test_round_trip_any_program(p, runtime):
    xml = to_xml(p, runtime)
    assert xml == to_xml(p, runtime)
    assert read_xml(xml) == p
    assert read_xml(xml.encode()) == p


# ---- other tools' files ----------------------------------------------------------------------------

MSCCL_TOOLS = """<!-- written by hand in the style of msccl-tools ir_to_xml and TACCL -->
<algo name="taccl_rs" nchunksperloop="2" nchannels="1" inplace="1" ngpus="2" proto="LL" coll="reduce_scatter" redop="nop" nthreads="512">
  <gpu id="0" i_chunks="2" o_chunks="1" s_chunks="1">
    <copy i_off="0" o_off="0"/>
    <tb id="1" send="-1" recv="1" chan="0">
      <step s="0" type="rrc" srcbuf="i" srcoff="0" dstbuf="o" dstoff="0" cnt="1" depid="-1" deps="-1" hasdep="0"></step>
    </tb>
    <tb id="0" send="1" recv="-1" chan="0">
      <step s="0" type="s" srcbuf="i" srcoff="0x1" dstbuf="o" dstoff="0" cnt="1" depid="-1" deps="-1" hasdep="0"/>
    </tb>
  </gpu>
  <gpu id="1" i_chunks="2" o_chunks="1" s_chunks="0">
    <tb id="0" send="0" recv="0" chan="0">
      <step s="0" type="s" srcbuf="i" srcoff="0" dstbuf="o" dstoff="0" cnt="1" depid="-1" deps="-1" hasdep="0"/>
      <step s="1" type="rrc" srcbuf="i" srcoff="01" dstbuf="o" dstoff="0" cnt="1" depid="-1" deps="-1" hasdep="0"/>
    </tb>
    <copy i_off="1" o_off="0"/>
  </gpu>
</algo>
"""


def test_reads_msccl_tools_style_files():
    p = read_xml(MSCCL_TOOLS)
    assert (p.name, p.collective, p.proto, p.ngpus, p.nchunksperloop) == ("taccl_rs", "reduce_scatter", "LL", 2, 2)
    assert p.inplace and not p.outofplace and (p.min_bytes, p.max_bytes) == (0, 0)
    g0 = p.gpus[0]
    assert [tb.id for tb in g0.tbs] == [0, 1] and (g0.tbs[0].send, g0.tbs[1].recv) == (1, 1)
    assert g0.tbs[0].steps[0].srcoff == 1  # 0x1, hexadecimal as strtol base 0 reads it
    assert p.gpus[1].tbs[0].steps[1].srcoff == 1  # 01, octal
    notes = " ".join(p.notes)
    assert "<copy>" in notes and "hexadecimal" in notes and "octal" in notes and "minBytes" in notes
    assert read_xml(to_xml(p)) == p  # ours again, now with every attribute


def test_reads_reducescatter_and_custom_spellings():
    base = to_xml(small_program())
    for written, canonical in (("reducescatter", "reduce_scatter"), ("reduce_scatter", "reduce_scatter"),
                               ("custom", "custom"), ("allreduce", "allreduce")):
        assert read_xml(base.replace('coll="allgather"', f'coll="{written}"')).collective == canonical


def test_notes_for_what_the_runtimes_reject():
    xml = '<?xml version="1.0"?>\n' + to_xml(small_program()).replace("  <gpu", "\t<gpu", 1)
    syntax = " ".join(read_xml(xml).syntax)  # verify's findings (and the other commands' warnings)
    assert "declaration" in syntax and "a tab" in syntax
    shifted = to_xml(small_program()).replace('<step s="1"', '<step s="7"', 1)
    assert any("differs from its position" in n for n in read_xml(shifted).notes)


def test_equal_steps_read_as_one_step_and_each_odd_spelling_keeps_its_note():
    """The reader serves a step it has read to the same attributes again (Steps are frozen), but
    never past a note: each step spelled in hexadecimal gets its own."""
    text = to_xml(small_program())
    p = read_xml(text)
    steps = [s for g in p.gpus for tb in g.tbs for s in tb.steps]
    assert len({id(s) for s in steps}) < len(steps) and p == small_program()
    hexed = read_xml(text.replace('cnt="1"', 'cnt="0x1"'))
    assert hexed.gpus == p.gpus
    assert sum("hexadecimal" in n for n in hexed.notes) == len(steps) == text.count('cnt="1"')


# ---- malformed input -------------------------------------------------------------------------------

GOOD = to_xml(small_program())


def _mutate(old: str, new: str, count: int = 1) -> str:
    assert old in GOOD, old
    return GOOD.replace(old, new, count)


MALFORMED = [
    ("<algo", "not well-formed XML", lambda: GOOD[:-20]),
    ("root", "must be <algo>", lambda: "<algorithm/>"),
    ("empty", "", lambda: ""),
    ("missing step attribute", "gpu 0 tb 0 step 0: cnt: required attribute is missing",
     lambda: _mutate(' cnt="1"', "")),
    ("missing algo attribute", "algo: nchunksperloop: required attribute is missing",
     lambda: _mutate(' nchunksperloop="4"', "")),
    ("non-integer", "gpu 0 tb 0 step 1: srcoff: 'two' is not an integer",
     lambda: _mutate('<step s="1" type="r" srcbuf="o" srcoff="2"', '<step s="1" type="r" srcbuf="o" srcoff="two"')),
    ("bad octal", "'08' is not an integer", lambda: _mutate('i_chunks="1"', 'i_chunks="08"')),
    ("step type", "gpu 0 tb 0 step 0: type: 'ra' is not a step type", lambda: _mutate('type="r"', 'type="ra"')),
    ("buffer", "gpu 0 tb 0 step 0: srcbuf: 'x' is not a buffer", lambda: _mutate('srcbuf="o"', 'srcbuf="x"')),
    ("tb gap", "gpu 0 tb 2: id: '2' leaves thread block 1 missing",
     lambda: _mutate('<tb id="1" send="1"', '<tb id="2" send="1"')),
    ("tb twice", "gpu 0 tb 0: id: '0' is defined twice", lambda: _mutate('<tb id="1" send="1"', '<tb id="0" send="1"')),
    ("gpu twice", "gpu 0: id: '0' is defined twice", lambda: _mutate('<gpu id="2"', '<gpu id="0"')),
    ("gpu missing", "no <gpu id=\"3\">", lambda: GOOD[:GOOD.index('  <gpu id="3"')] + "</algo>\n"),
    ("gpu out of range", "gpu (position 3): id: '9' is out of range", lambda: _mutate('<gpu id="3"', '<gpu id="9"')),
    ("proto", "algo: proto: 'simple' is not a protocol", lambda: _mutate('proto="Simple"', 'proto="simple"')),
    ("coll", "algo: coll: 'allpairs' is not a collective", lambda: _mutate('coll="allgather"', 'coll="allpairs"')),
    ("hasdep", "hasdep: '2' is out of range", lambda: _mutate('hasdep="1"', 'hasdep="2"')),
    ("self peer", "gpu 0 tb 1: send: '0' is the thread block's own rank",
     lambda: _mutate('<tb id="1" send="1"', '<tb id="1" send="0"')),
    ("peer range", "gpu 0 tb 0: recv: '4' is out of range", lambda: _mutate('recv="3"', 'recv="4"')),
    ("chan", "gpu 0 tb 0: chan: '33' is out of range", lambda: _mutate('chan="0"', 'chan="33"')),
    ("cnt", "gpu 0 tb 0 step 0: cnt: '72' is out of range", lambda: _mutate('cnt="1"', 'cnt="72"')),
    ("negative size", "gpu 0: s_chunks: '-1' is out of range", lambda: _mutate('s_chunks="0"', 's_chunks="-1"')),
    ("huge", "out of the 64-bit range", lambda: _mutate('minBytes="0"', 'minBytes="99999999999999999999"')),
    ("entity", "", lambda: '<!DOCTYPE a [<!ENTITY e SYSTEM "file:///etc/passwd">]><algo name="&e;"/>'),
    ("binary", "", lambda: "\x00\x01\x02garbage"),
    ("nul byte", "not well-formed XML", lambda: GOOD.replace('<tb id="1"', '<tb\x00 id="1"', 1)),
]


@pytest.mark.parametrize("case,expected,make", MALFORMED, ids=[m[0] for m in MALFORMED])
def test_malformed_files_give_one_line(tmp_path, case, expected, make):
    path = tmp_path / "bad.xml"
    path.write_bytes(make().encode("utf-8"))
    with pytest.raises(XmlError) as e:
        read_xml(path)
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith(str(path) + ": ")
    assert expected in msg


def test_missing_path_and_directory(tmp_path):
    with pytest.raises(XmlError, match="no such XML file"):
        read_xml(tmp_path / "nope.xml")
    with pytest.raises(XmlError, match="directory"):
        read_xml(tmp_path)


@settings(max_examples=300, deadline=None)
@given(st.data())
def test_reader_never_crashes_on_mutated_files(data):
    text = GOOD
    for _ in range(data.draw(st.integers(1, 4))):
        i = data.draw(st.integers(0, len(text)))
        j = data.draw(st.integers(i, min(len(text), i + 12)))
        text = text[:i] + data.draw(st.text(alphabet='<>/="-0123456789xabcdefgirstuv \n\t', max_size=8)) + text[j:]
    try:
        p = read_xml(text.encode())
    except XmlError as e:
        assert "\n" not in str(e)
    else:
        assert isinstance(p, Program)


@pytest.mark.parametrize("spelling,accepted", [("reduce_scatter", ("old",)), ("reducescatter", ("executor", "rccl"))])
def test_verify_judges_the_reduce_scatter_spelling_as_written(spelling, accepted):
    """msccl-tools writes coll="reduce_scatter", which only the old runtime parses; the executor's and
    RCCL's parsers take only "reducescatter" (msccl-xml.md §2.1, §13): verify for a runtime whose parser
    rejects the file's spelling must fail, and --runtime all judges the file for those that take it."""
    from compiler.program.verify import verify
    from tests.test_verify import ring_reduce_scatter
    xml = to_xml(ring_reduce_scatter(), "old").replace('coll="reduce_scatter"', f'coll="{spelling}"')
    p = read_xml(xml)
    for runtime in ("old", "executor", "rccl"):
        v = verify(p, runtime)
        if runtime in accepted:
            assert v.ok, v.summary()
        else:
            assert not v.ok and [f.rule for f in v.findings] == ["coll"] and spelling in v.findings[0].message
    v = verify(p)
    assert v.ok and v.runtimes == accepted


def test_verify_refuses_a_step_number_beyond_the_parsers_range():
    """The parsers range-check the s attribute (0 <= s < 64 executor/RCCL, < 256 legacy, msccl-xml.md
    §2.4) whatever the step's position: s="70" is read with a warning, and verify must refuse it
    for the executor and RCCL (the legacy parser takes it)."""
    from compiler.program.verify import verify
    xml = to_xml(small_program()).replace('<step s="3" type="s" srcbuf="o" srcoff="2"',
                                          '<step s="70" type="s" srcbuf="o" srcoff="2"', 1)
    p = read_xml(xml)
    assert any('s="70"' in n for n in p.notes)
    for runtime in ("executor", "rccl", "all"):
        v = verify(p, runtime)
        assert not v.ok and [f.rule for f in v.findings] == ["max-steps"] and 's="70"' in v.findings[0].message
    assert verify(p, "old").ok
    assert verify(read_xml(to_xml(small_program())), "executor").ok
