"""Packages whose names load their module on first use (so importing them imports no torch)."""

from __future__ import annotations

import importlib
from typing import Callable


def lazy_names(package: str, where: dict[str, tuple[str, ...]],
               elsewhere: dict[str, str] | None = None) -> tuple[list[str], Callable, Callable]:
    """(__all__, __getattr__, __dir__) for `package`: where maps each submodule to the names it
    defines; elsewhere maps a name to the full module that defines it."""
    module_of = {name: f"{package}.{module}" for module, names in where.items() for name in names}
    module_of.update(elsewhere or {})
    names = sorted(module_of)

    def __getattr__(name: str):
        if name not in module_of:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(module_of[name]), name)
        setattr(importlib.import_module(package), name, value)
        return value

    def __dir__() -> list[str]:
        return sorted(set(vars(importlib.import_module(package))) | set(names))

    return names, __getattr__, __dir__
