"""PyTorch integration: the MSCCL runtimes' environment, and an executor of Programs over gloo.

    env.py       the variables that make a runtime load a directory of algorithms (torch-free)
    headers.py   <algo> headers, library size bands, which file a runtime selects (torch-free)
    executor.py  execute(program, inputs): one rank's part of a call over torch.distributed
    launch.py    launch_local(worker, nprocs): local processes joined in one group
    reference.py seeded inputs, torch's own collective, expected outputs
    run.py       run_local(program, nprocs, size): run, compare with the reference, time

Importing this package imports no torch: each name below loads its module on first use, so the
environment helpers (`msccl-compile env`) stay fast and work without torch installed.
"""

from __future__ import annotations

from backends.lazy import lazy_names

_WHERE = dict(
    env=("RUNTIMES", "msccl_env", "msccl_environment", "patched_environ", "apply_environ", "export_lines",
         "algorithm_files", "check_header"),
    headers=("AlgoHeader", "read_header", "check_bands", "select_algorithm", "why_not_selected", "runtime_spec"),
    errors=("ExecutionError",),
    executor=("ExecPlan", "prepare", "execute", "op_name", "reduce_op", "collective_elems", "io_chunks", "OPS",
              "first_line"),
    launch=("launch_local",),
    reference=("make_input", "parse_dtype", "dtype_name", "torch_collective", "compared_ranks", "expected_output",
               "custom_input", "custom_wrong", "distinct_values", "SPREAD", "DTYPES"),
    run=("RunResult", "Job", "run_local", "run_local_many"),
)  # module -> the names it defines
__all__, __getattr__, __dir__ = lazy_names(__name__, _WHERE)
