"""The torch back end's error (torch-free, so callers can catch it without importing torch)."""

from __future__ import annotations

from compiler.specs.errors import CompileError


class ExecutionError(CompileError):
    """A program that cannot run, or a run that failed: one line naming rank, tb and step."""


def require_torch(command: str) -> None:
    """One line and exit status 2 where torch (the `torch` extra) is missing, before any work (the
    command imports torch next anyway)."""
    try:
        import torch  # noqa: F401
    except ImportError:
        raise ExecutionError(f'{command}: torch is not installed; pip install "msccl-compile[torch]" '
                             "(it pins torch==2.13.0, the CPU build on a machine without CUDA)") from None
