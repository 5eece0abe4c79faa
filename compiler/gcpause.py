"""Python's cyclic garbage collector paused while a pass builds millions of objects that form no
cycles (lowering's steps, the timer's events): each full collection walks every live object, so at
512 GPUs the collector was a third of lowering's time and found nothing to free."""

from __future__ import annotations

import gc
from functools import wraps
from typing import Callable, TypeVar

F = TypeVar("F", bound=Callable)


def without_gc(f: F) -> F:
    """`f` with the collector paused while it runs (and left as it was: nested calls keep it off)."""

    @wraps(f)
    def run(*args, **kwargs):
        if not gc.isenabled():
            return f(*args, **kwargs)
        gc.disable()
        try:
            return f(*args, **kwargs)
        finally:
            gc.enable()

    return run  # type: ignore[return-value]
