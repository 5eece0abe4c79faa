"""Where one program stops being the fastest: the size bands of a library from the program timer's
crossovers (issue: library bands come from the model, not from fixed sizes).

A library first plans one program per coarse band; every program runs at any size, so each size
is then given to whichever of them the program timer says is fastest there. `crossover_bands`
times the programs on a grid of sizes (factor 2), merges neighbouring grid points with the same
winner into one band, and places each edge at the crossover found by bisection (to whole
elements) between the two grid points around it. A program that wins nowhere gets no band.
Near-ties do not cut bands: a band's program keeps a size unless another is more than 1 % faster
there (no sliver bands where two programs run level).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Sequence

from compiler.model.program import Program
from compiler.model.topology import Topology
from compiler.program.timing import time_program

GRID_FACTOR = 2
HYSTERESIS = 1.01  # a band's program keeps the next size unless another is over 1 % faster there


@dataclass(frozen=True)
class Band:
    lo: int  # inclusive
    hi: int  # inclusive
    program: int  # index of the fastest program
    runner_up: int | None  # the program fastest after it at the band's middle (None: only one)
    at: int = 0  # the band's middle (geometric, or as `middle` chose), where the times below are taken
    time_s: float = 0.0  # the program's time there
    runner_up_s: float | None = None  # the runner-up's time there


def size_grid(lo: int, hi: int, factor: int = GRID_FACTOR) -> list[int]:
    grid = [lo]
    while grid[-1] * factor < hi:
        grid.append(grid[-1] * factor)
    return grid + ([hi] if grid[-1] != hi else [])


def crossover_bands(programs: Sequence[Program], topo: Topology, lo: int, hi: int,
                    candidates: Callable[[int], Sequence[int]] | None = None,
                    grain: int = 1, middle: Callable[[int, int, int], int] | None = None) -> list[Band]:
    """Bands [lo..hi] -> the fastest program of `programs` there. candidates(size): the indices worth
    timing at a size (default: all); grain: band edges are multiples of it (whole elements per
    chunk for every program); middle(lo, hi, program): the size in a band where its figures are
    taken (default: the geometric middle)."""
    pick = candidates or (lambda size: range(len(programs)))
    cache: dict[tuple[int, int], float] = {}

    def time_of(i: int, size: int) -> float:
        if (i, size) not in cache:
            cache[(i, size)] = time_program(programs[i], topo, size).finish_time_s
        return cache[(i, size)]

    def ranked(size: int) -> list[int]:
        return sorted(pick(size), key=lambda i: (time_of(i, size), i))

    grid = size_grid(lo, hi)
    for i in range(len(programs)):  # program by program: the timer keeps only the last few programs' flattening
        for size in grid:
            if i in pick(size):
                time_of(i, size)
    edges = [lo]  # first size of each band
    owners = [ranked(lo)[0]]
    for k in range(1, len(grid)):
        best, size = ranked(grid[k])[0], grid[k]
        if best != owners[-1] and (owners[-1] not in pick(size)
                                   or time_of(owners[-1], size) > HYSTERESIS * time_of(best, size)):
            edges.append(_crossover(time_of, owners[-1], best, grid[k - 1], grid[k], grain))
            owners.append(best)
    spans = [(start, edges[n + 1] - 1 if n + 1 < len(edges) else hi, owner)
             for n, (start, owner) in enumerate(zip(edges, owners))]
    bands = []
    for start, end, owner in _merged([s for s in spans if s[1] >= s[0]]):
        mid = max(start, min(end, int(math.sqrt(start * end)) if middle is None else middle(start, end, owner)))
        others = [i for i in ranked(mid) if i != owner]
        runner = others[0] if others else None
        bands.append(Band(start, end, owner, runner, mid, time_of(owner, mid),
                          time_of(runner, mid) if runner is not None else None))
    return bands


def _crossover(time_of, before: int, after: int, a: int, b: int, grain: int) -> int:
    """The first multiple of grain in (a, b] from which `after` is faster than `before`, by
    bisection to the grain (program times are step functions of the size: whole iterations)."""
    lo, hi = a // grain, -(-b // grain)  # before wins at lo * grain (or lo is below the band), after at hi
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if time_of(after, mid * grain) < time_of(before, mid * grain):
            hi = mid
        else:
            lo = mid
    return min(b, max(a + 1, hi * grain))


def _merged(spans: list[tuple[int, int, int]]) -> list[tuple[int, int, int]]:
    """(lo, hi, program) spans with neighbours of one program joined."""
    out: list[tuple[int, int, int]] = []
    for lo, hi, owner in spans:
        if out and out[-1][2] == owner and out[-1][1] + 1 == lo:
            out[-1] = (out[-1][0], hi, owner)
        else:
            out.append((lo, hi, owner))
    return out
