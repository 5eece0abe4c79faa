"""The verifier: proves a Program safe for the MSCCL runtimes and correct for its collective.

Two parts. The static rules (compiler/program/rules.py) check what the runtime parsers check plus
everything msccl-xml.md §13 says they do not. The dynamic part runs the program symbolically
(compiler/program/interpret.py, with bounded connection slots) and reports deadlocks, races,
reads of undefined data and double-counted reductions; the final output buffers are compared here
with the collective's postcondition.

Bad programs never raise: every problem is a Finding. Only a bad `runtime` argument raises.
"""

from __future__ import annotations

from dataclasses import dataclass

from compiler.model.demand import Chunk, Demand
from compiler.model.program import Program
from compiler.program.findings import Finding, finding
from compiler.program.interpret import Encoding, Trace, traces
from compiler.program.rules import STRUCTURAL, co_residency, declared_runtimes, static_findings
from compiler.program.semantics import expected_chunks, root_candidates
from compiler.specs.collectives import CUSTOM, SPECS
from compiler.specs.runtimes import ALL, judged_runtimes
from compiler.gcpause import without_gc

__all__ = ["Finding", "Verdict", "verify", "dynamic", "dynamic_calls", "postcondition", "standard_demand"]


@dataclass(frozen=True)
class Verdict:
    ok: bool
    findings: tuple[Finding, ...]
    runtime: str  # as asked
    runtimes: tuple[str, ...] = ()  # judged for: judged_runtimes(collective, runtime)

    def summary(self) -> str:
        if self.ok:
            return "correct"
        more = len(self.findings) - 1
        return self.findings[0].message + (f" (and {more} more)" if more else "")


@without_gc
def verify(program: Program, runtime: str = ALL, demand: Demand | None = None, sms: int | None = None) -> Verdict:
    """All static rules for `runtime` (a runtime's name, or ALL = the strictest over the runtimes
    the program declares it targets, else over those that have its collective, see
    `judged_runtimes`), then symbolic execution against
    the postcondition (`demand`, else the program's own demand, else the standard collective's):
    once as an out-of-place call and once as an in-place call, for each kind the header allows."""
    judged = judged_runtimes(program.collective, runtime, declared_runtimes(program))
    demand = demand if demand is not None else program.demand
    findings = static_findings(program, runtime)
    findings += co_residency(program, sms)
    if not any(f.rule in STRUCTURAL for f in findings):
        seen = set()
        kinds = ((False,) if program.outofplace or not program.inplace else ()) + ((True,) if program.inplace else ())
        try:
            runs = dynamic_calls(program, demand, kinds)
        except Exception as e:  # a verifier bug must not pass a program, nor crash the caller
            runs = [[finding("verifier-error", f"symbolic execution failed: {type(e).__name__}: {e}")]] * len(kinds)
        for inplace, got in zip(kinds, runs):
            for f in got:
                if f.message in seen:
                    continue
                seen.add(f.message)
                if inplace and program.outofplace:
                    f = Finding(f.rule, f.message + " [in-place call]", f.rank, f.tb, f.step)
                findings.append(f)
    return Verdict(not findings, tuple(findings), runtime, judged)


# ---- the postcondition ---------------------------------------------------------------------------

def dynamic(p: Program, demand: Demand | None, inplace: bool) -> list[Finding]:
    """Executes `p` as an in-place or out-of-place call and checks the postcondition: `demand`'s,
    or the standard collective's derived from the header (for a rooted one, the root that fits,
    trying first the rank that reads its input (broadcast, scatter) or writes its output (reduce, gather))."""
    return dynamic_calls(p, demand, (inplace,))[0]


def dynamic_calls(p: Program, demand: Demand | None, kinds: tuple[bool, ...]) -> list[list[Finding]]:
    """`dynamic` for each call kind in `kinds`, the calls run together (interpret.traces)."""
    return [_judged(p, demand, run) for run in traces(p, kinds)]


def _judged(p: Program, demand: Demand | None, run: Trace) -> list[Finding]:
    findings, mem, addrs, enc = list(run.findings), run.memory, run.addresses, run.encoding
    if any(f.rule == "deadlock" for f in findings):
        return findings  # the outputs of a run that did not finish say nothing more
    if demand is not None:
        return findings + postcondition(p, demand, mem, addrs, enc)
    if p.collective in SPECS and SPECS[p.collective].rooted:
        tried = []
        for root in root_candidates(p):
            got = postcondition(p, standard_demand(p, root), mem, addrs, enc)
            if not got:
                return findings
            tried.append(got)
        return findings + (tried[0] if tried else [])
    d = standard_demand(p)
    if d is None:
        why = ("a custom collective needs a demand to state its postcondition" if p.collective == CUSTOM else
               f"no postcondition for {p.collective!r} with ngpus={p.ngpus}, nchunksperloop={p.nchunksperloop}")
        return findings + [finding("postcondition", why)]
    return findings + postcondition(p, d, mem, addrs, enc)


def standard_demand(p: Program, root: int | None = None) -> Demand | None:
    """The postcondition of a standard collective from the header alone (msccl-xml.md §4)."""
    cs = SPECS.get(p.collective)
    shapes = cs.file_chunks(p.ngpus, p.nchunksperloop, root) if cs is not None and p.ngpus >= 1 else None
    if shapes is None:
        return None
    n_in, n_out = expected_chunks(p)
    chunks = tuple(Chunk(k, *shape) for k, shape in enumerate(shapes))
    return Demand(cs.name, p.ngpus, chunks, 1.0, p.nchunksperloop, max(1, p.nchunksperloop // cs.blocks("size", p.ngpus)),
                  cs.reduces, root, n_in, n_out)


def postcondition(p: Program, demand: Demand, mem: list, addrs: list[dict], enc: Encoding) -> list[Finding]:
    out = []
    for c in demand.chunks:
        for s, si in zip(c.sources, c.src_index):
            if not (0 <= s < p.ngpus and 0 <= si < enc.width):
                out.append(finding("postcondition", f"the demand's chunk {c.id} starts at rank {s} i[{si}], "
                                                    f"outside the program's buffers"))
        if demand.reduce:
            want = 0
            for s, si in zip(c.sources, c.src_index):
                want |= enc.bit(s, si)
            ok = {want}
        else:
            ok = {enc.bit(s, si) for s, si in zip(c.sources, c.src_index)}
        for d, di in zip(c.dests, c.dst_index):
            if not (0 <= d < len(addrs) and 0 <= di < len(addrs[d]["o"])):
                out.append(finding("postcondition", f"o[{di}] should receive chunk {c.id}, but rank {d} has "
                                                    f"o_chunks={len(addrs[d]['o']) if 0 <= d < len(addrs) else 0}", d))
                continue
            got = mem[addrs[d]["o"][di]]
            if got not in ok:
                want_s = " or ".join(sorted(enc.describe(v) for v in ok))
                out.append(finding("postcondition", f"{_out_name(p, addrs, d, di)} should hold {want_s}, but holds "
                                                    f"{enc.describe(got)}", d))
    return out


def _out_name(p: Program, addrs: list[dict], rank: int, k: int) -> str:
    """o[k], with the input chunk it is in place where the file declares no output (o_chunks=0)."""
    a = addrs[rank]["o"][k]
    if p.gpus[rank].o_chunks > 0 or a not in addrs[rank]["i"]:
        return f"o[{k}]"
    return f"o[{k}] (i[{addrs[rank]['i'].index(a)}] in place)"
