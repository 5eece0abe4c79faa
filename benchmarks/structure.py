"""Structure counts the reorganisation (issue 11) is judged by, measured on the source tree:
files that spell a collective's or a runtime's name as a string, modules over 400 lines,
functions over 60 lines, and import cycles between compiler/ and backends/ modules.

    python benchmarks/structure.py [--list]
"""

from __future__ import annotations

import argparse
import ast
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
COLLECTIVE = re.compile(r"""["'](allgather|alltoall|reduce_scatter|reducescatter|allreduce|broadcast|reduce|scatter|gather|custom)["']""")
RUNTIME = re.compile(r"""["'](executor|rccl|old)["']""")


def modules() -> list[Path]:
    return sorted(p for d in ("compiler", "backends") for p in (ROOT / d).rglob("*.py"))


def name_of(path: Path) -> str:
    rel = path.relative_to(ROOT).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imports(path: Path, known: set[str]) -> set[str]:
    """Modules of this tree that `path` imports (at module level or inside functions)."""
    tree = ast.parse(path.read_text())
    me = name_of(path)
    package = me if path.name == "__init__.py" else me.rpartition(".")[0]
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join(up + ([base] if base else []))
            names = [base] + [f"{base}.{a.name}" for a in node.names]
        else:
            continue
        for n in names:
            while n and n not in known:
                n = n.rpartition(".")[0]
            if n and n != me:
                out.add(n)
    return out


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index, low, stack, on, out, counter = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    sys.setrecursionlimit(10000)
    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def long_functions(path: Path, limit: int = 60) -> list[tuple[str, int]]:
    tree = ast.parse(path.read_text())
    return [(n.name, n.end_lineno - n.lineno + 1) for n in ast.walk(tree)
            if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.end_lineno - n.lineno + 1 > limit]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--list", action="store_true", help="name the files and functions behind each count")
    args = ap.parse_args(argv)
    mods = modules()
    known = {name_of(p) for p in mods}
    graph = {name_of(p): imports(p, known) for p in mods}
    coll = {p: len(COLLECTIVE.findall(p.read_text())) for p in mods}
    rt = {p: len(RUNTIME.findall(p.read_text())) for p in mods}
    big = {p: len(p.read_text().splitlines()) for p in mods if len(p.read_text().splitlines()) > 400}
    longf = {p: long_functions(p) for p in mods}
    rel = lambda p: str(p.relative_to(ROOT))  # noqa: E731
    print(f"files spelling a collective's name: {sum(1 for v in coll.values() if v)} "
          f"({sum(coll.values())} spellings)")
    if args.list:
        for p, n in sorted(coll.items(), key=lambda x: -x[1]):
            if n:
                print(f"  {n:4d} {rel(p)}")
    print(f"files spelling a runtime's name: {sum(1 for v in rt.values() if v)} ({sum(rt.values())} spellings)")
    if args.list:
        for p, n in sorted(rt.items(), key=lambda x: -x[1]):
            if n:
                print(f"  {n:4d} {rel(p)}")
    print(f"modules over 400 lines: {len(big)}" + (": " + ", ".join(f"{rel(p)} {n}" for p, n in big.items()) if big else ""))
    nlong = sum(len(v) for v in longf.values())
    print(f"functions over 60 lines: {nlong}")
    if args.list:
        for p, fs in longf.items():
            for f, n in fs:
                print(f"  {n:4d} {rel(p)}:{f}")
    cyc = cycles(graph)
    print(f"import cycles: {len(cyc)}" + ("".join(f"\n  {' <-> '.join(c)}" for c in cyc)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
