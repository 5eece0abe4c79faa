"""nccl-tests-style regression sweeps: torch's default collective and the MSCCL algorithm side by side.

    options.py     the command's options and --sizes (torch-free: every msccl-compile command builds them)
    results.py     BenchResult and its rows (frozen dataclasses), JSON, compare() with a baseline
    report.py      nccl-tests' table, CSV, PNG
    runtime_log.py check_runtime: did MSCCL run, from NCCL's log
    measure.py     inside the process group: checked and timed calls per size and side (typed payload)
    sweeper.py     sweep(): the cases, local processes or torchrun, GPU rounds; gpu_script
    cli.py         run(args), main()

Launch: `python -m backends.bench allgather --xml ag.xml --sizes 1KB:1MB` (spawns --nprocs local
processes), or `torchrun --nnodes ... --nproc_per_node 8 -m backends.bench ...` (joins the group).
Importing this package imports no torch; each name below loads its module on first use.
"""

from __future__ import annotations

from backends.lazy import lazy_names

_WHERE = dict(
    options=("SIDES", "RUNTIMES", "DEFAULT_RUNTIME", "configure", "parse_sizes"),
    results=("FORMAT", "SideResult", "BenchRow", "BenchResult", "compare"),
    runtime_log=("check_runtime",),
    measure=("Case", "SweepPlan", "Timing", "CaseTimings"),
    sweeper=("sweep", "cases", "default_side_env", "gpu_script", "MSCCL_ENV_VARS", "NCCL_TYPE_NAMES"),
    cli=("run", "main"),
)  # module -> the names it defines
__all__, __getattr__, __dir__ = lazy_names(__name__, _WHERE, {"expected_output": "backends.torch_dist.reference"})
