"""README.md: every fenced block is classified, and the commands a CPU machine can run do run.

Convention: the line before every fenced code block is one HTML comment naming its kind:

* `<!-- main-command -->`  the quick start's install-and-run line. CI checks it in a fresh
  virtual environment; here the `pip install . &&` part counts as done and the rest is run.
* `<!-- test-command -->`  the command that runs this suite (`.ci/run` reads it); not run here.
* `<!-- cpu-example -->`   commands that run as written on a CPU machine; run here.
* `<!-- gpu-only -->`      commands that need GPUs and an MSCCL build of NCCL/RCCL; not run.
* `<!-- not-a-command -->` usage synopses, output tables, JSON examples, file layouts; not run
  (a JSON profile example is loaded as a profile, though).

How the commands run: the main command's remainder and the cpu-example blocks, in README order,
each as its own `bash -e -o pipefail` script, all in one fresh temporary directory, so a block can
use what an earlier one wrote (the quick start's `allgather-dgx2.xml`, the `algos/` library). That
directory stands in for the user's checkout after `pip install .`: it holds a copy of the repo's
`examples/` (which the install does not carry), the repo is on PYTHONPATH (what the install
provides), and `msccl-compile`, `torchrun` and `python` are shims to this interpreter, so the code
under test is this tree's whatever else is installed. Nothing is written into the checkout. Each
block must exit 0 and print no `msccl-compile: error`. The README's examples are chosen to be
quick (narrow size ranges, short time limits, 4 gloo processes): about two minutes on 2 cores.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
README = REPO / "README.md"
KINDS = ("main-command", "test-command", "cpu-example", "gpu-only", "not-a-command")
RUN_KINDS = ("main-command", "cpu-example")
MAIN_PREFIX = "pip install . && "
FENCE = re.compile(r"^(\s*)(```+)(.*)$")
MARKER = re.compile(r"^<!--\s*([a-z-]+)\s*-->$")


@dataclass(frozen=True)
class Block:
    kind: str | None  # None: no marker on the line before
    marker: str | None  # the comment that was there, if any
    info: str  # the fence's info string (json, ...)
    code: str
    line: int  # 1-based line of the opening fence


def parse_blocks(text: str) -> list[Block]:
    """Fenced code blocks of a Markdown text (backtick fences, indented ones in lists too), each
    with the HTML comment on the nearest non-blank line before it."""
    lines = text.split("\n")
    blocks, i = [], 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        indent, fence, info = m.group(1), m.group(2), m.group(3).strip()
        j = i + 1
        while j < len(lines) and not (lines[j].strip().startswith(fence) and lines[j].strip().strip("`") == ""):
            j += 1
        if j == len(lines):
            raise AssertionError(f"README.md:{i + 1}: code block never closed")
        body = [ln[len(indent):] if ln.startswith(indent) else ln.lstrip() for ln in lines[i + 1:j]]
        k = i - 1
        while k >= 0 and not lines[k].strip():
            k -= 1
        prev = lines[k].strip() if k >= 0 else ""
        mm = MARKER.match(prev)
        kind = mm.group(1) if mm and mm.group(1) in KINDS else None
        blocks.append(Block(kind, prev if prev.startswith("<!--") else None, info, "\n".join(body), i + 1))
        i = j + 1
    return blocks


@pytest.fixture(scope="module")
def blocks() -> list[Block]:
    return parse_blocks(README.read_text(encoding="utf-8"))


def test_every_block_is_classified(blocks):
    unmarked = [f"README.md:{b.line}: " + (f"unknown marker {b.marker}" if b.marker else "no marker")
                for b in blocks if b.kind is None]
    assert not unmarked, ("every fenced block needs one of " + ", ".join(f"<!-- {k} -->" for k in KINDS)
                          + " on the line before it:\n" + "\n".join(unmarked))
    kinds = [b.kind for b in blocks]
    assert kinds.count("main-command") == 1 and kinds.count("test-command") == 1
    assert any(b.kind == "cpu-example" for b in blocks)
    main = next(b for b in blocks if b.kind == "main-command")
    assert main.code.startswith(MAIN_PREFIX) and "\n" not in main.code.strip(), main.code


def test_ci_finds_the_test_command(blocks):
    """.ci/run takes the first line of the block after `<!-- test-command -->`."""
    text = README.read_text(encoding="utf-8").split("\n")
    at = text.index("<!-- test-command -->")
    assert text[at + 1].startswith("```")
    (test_block,) = [b for b in blocks if b.kind == "test-command"]
    assert text[at + 2] == test_block.code.strip() and "pytest" in test_block.code


def test_parse_blocks_reads_markers_and_indented_fences():
    text = ("<!-- cpu-example -->\n```\necho a\n```\n\n1. item\n\n   <!-- gpu-only -->\n   ```\n   x \\\n"
            "       y\n   ```\n\n```json\n{}\n```\n<!-- bogus -->\n```\nz\n```\n")
    got = [(b.kind, b.info, b.code, b.line) for b in parse_blocks(text)]
    assert got == [("cpu-example", "", "echo a", 2), ("gpu-only", "", "x \\\n    y", 9), (None, "json", "{}", 14),
                   (None, "", "z", 18)]


def test_json_profile_example_loads(blocks, tmp_path):
    from compiler.model.profiles import load_topology
    examples = [b for b in blocks if b.info == "json"]
    assert examples
    for b in examples:
        data = json.loads(b.code)
        path = tmp_path / f"{data['name']}.json"
        path.write_text(b.code)
        t = load_topology(str(path))
        assert t.ngpus == data["gpu"]["count"], f"README.md:{b.line}"


def _shims(bindir: Path) -> None:
    bindir.mkdir()
    py = shlex.quote(sys.executable)
    for name, target in (("msccl-compile", f"{py} -m compiler.cli"), ("torchrun", f"{py} -m torch.distributed.run"),
                         ("python", py), ("python3", py)):
        shim = bindir / name
        shim.write_text(f'#!/bin/sh\nexec {target} "$@"\n')
        shim.chmod(0o755)


@pytest.mark.long
def test_cpu_examples_run_as_written(blocks, tmp_path):
    pytest.importorskip("torch")
    work = tmp_path / "checkout"
    work.mkdir()
    shutil.copytree(REPO / "examples", work / "examples", ignore=shutil.ignore_patterns("__pycache__"))
    _shims(tmp_path / "bin")
    env = dict(os.environ)
    env["PATH"] = os.pathsep.join([str(tmp_path / "bin"), env.get("PATH", "")])
    env["PYTHONPATH"] = os.pathsep.join([str(REPO)] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    env.pop("MSCCL_COMPILE_DEBUG", None)
    timings = []
    for b in blocks:
        if b.kind not in RUN_KINDS:
            continue
        script = b.code.removeprefix(MAIN_PREFIX) if b.kind == "main-command" else b.code
        t0 = time.monotonic()
        proc = subprocess.run(["bash", "-e", "-o", "pipefail", "-c", script], cwd=work, env=env, capture_output=True,
                              text=True, timeout=300)
        timings.append(f"README.md:{b.line}: {time.monotonic() - t0:.1f} s")
        where = f"README.md:{b.line} ({b.kind}) exited {proc.returncode}:\n{script}\n--- stdout\n{proc.stdout[-3000:]}" \
                f"\n--- stderr\n{proc.stderr[-3000:]}"
        assert proc.returncode == 0, where
        assert "msccl-compile: error" not in proc.stderr and "Traceback" not in proc.stderr, where
    print("\n".join(timings))
    assert (work / "allgather-dgx2.xml").is_file()
