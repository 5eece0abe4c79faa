"""A Finding: one problem the verifier found in a program, in one line naming the rule, rank,
thread block and step. The static rules (rules.py) and the symbolic run (interpret.py) report them."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Finding:
    rule: str  # short stable id: "fifo-order", "cnt-mismatch", "hasdep", "deadlock", "postcondition", ...
    message: str  # one line naming the rule, rank, thread block and step
    rank: int = -1
    tb: int = -1
    step: int = -1


def finding(rule: str, text: str, rank: int = -1, tb: int = -1, step: int = -1, stype: str = "") -> Finding:
    where = []
    if rank >= 0:
        where.append(f"rank {rank}")
    if tb >= 0:
        where.append(f"tb {tb}")
    if step >= 0:
        where.append(f"step {step}" + (f" ({stype})" if stype else ""))
    loc = " ".join(where)
    return Finding(rule, f"{rule}: {loc}: {text}" if loc else f"{rule}: {text}", rank, tb, step)
