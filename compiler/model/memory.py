"""Memory: estimate what a command will need before allocating it, and refuse what this machine
cannot hold (a process killed by the kernel after minutes says nothing useful).

The estimates are coarse by design (they only have to separate "fits" from "does not fit by far")
and come from measured peaks (Python 3.11, dgx-a100 x 16: 128 GPUs, 16,256 deliveries):
- every ordered GPU pair: its routes, alpha distances and the bounds' tables, ~200 B;
- every demand chunk: ~300 B, plus 16 B per source and per destination;
- every delivery (a need a schedule must meet): ~20 kB through planning, lowering and the
  verifier (whose vector clocks grow with the number of thread blocks).
"""

from __future__ import annotations

import os

from compiler.specs.errors import CompileError

PAIR_BYTES = 200
CHUNK_BYTES = 300
ENDPOINT_BYTES = 16
DELIVERY_BYTES = 20_000
BASE_BYTES = 200 * 2**20  # the interpreter with numpy, scipy, cvxpy and highspy loaded


def available_bytes() -> int:
    """Memory this process may still take: MemAvailable, or physical memory where that is unknown."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError):
        return 1 << 62


def human(nbytes: float) -> str:
    for unit, f in (("PB", 1e15), ("TB", 1e12), ("GB", 1e9), ("MB", 1e6)):
        if nbytes >= f:
            return f"{nbytes / f:.3g} {unit}"
    return f"{nbytes / 1e3:.3g} kB"


def require(nbytes: float, what: str) -> None:
    """CompileError (one line, with the estimate) when `nbytes` exceed the memory available."""
    have = available_bytes()
    if BASE_BYTES + nbytes > have:
        raise CompileError(f"{what} needs about {human(BASE_BYTES + nbytes)} of memory; this machine has "
                           f"{human(have)} available")


def topology_bytes(ngpus: int, nlinks: int) -> float:
    return ngpus * ngpus * PAIR_BYTES + nlinks * 400


def demand_bytes(chunks: int, endpoints: int, deliveries: int) -> float:
    return chunks * CHUNK_BYTES + endpoints * ENDPOINT_BYTES + deliveries * DELIVERY_BYTES
