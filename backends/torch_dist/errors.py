"""The torch back end's error (torch-free, so callers can catch it without importing torch)."""

from __future__ import annotations

from compiler.specs.errors import CompileError


class ExecutionError(CompileError):
    """A program that cannot run, or a run that failed: one line naming rank, tb and step."""
