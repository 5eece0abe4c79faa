"""The options of `msccl-compile bench`: kept importable here for older callers; they live in
backends/bench/options.py (torch-free)."""

from backends.bench.options import DEFAULT_RUNTIME, RUNTIMES, SIDES, configure, parse_sizes

__all__ = ["DEFAULT_RUNTIME", "RUNTIMES", "SIDES", "configure", "parse_sizes"]
