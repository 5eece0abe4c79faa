"""compiler.gcpause: the cyclic collector is off inside a paused pass and as it was after."""

from __future__ import annotations

import gc

import pytest

from compiler.gcpause import without_gc


@pytest.fixture(autouse=True)
def collector_on():
    was = gc.isenabled()
    gc.enable()
    yield
    (gc.enable if was else gc.disable)()


def test_the_collector_is_off_inside_and_back_on_after_a_return_or_a_raise():
    seen = []

    @without_gc
    def work(fail: bool) -> str:
        seen.append(gc.isenabled())
        if fail:
            raise ValueError("bad input")
        return "done"

    assert work(False) == "done"
    assert gc.isenabled()
    with pytest.raises(ValueError):
        work(True)
    assert gc.isenabled() and seen == [False, False]


def test_a_nested_pass_leaves_the_collector_off_for_the_outer_one_and_a_caller_s_choice_stands():
    @without_gc
    def inner() -> bool:
        return gc.isenabled()

    @without_gc
    def outer() -> tuple[bool, bool]:
        return inner(), gc.isenabled()

    assert outer() == (False, False) and gc.isenabled()
    gc.disable()
    assert inner() is False and not gc.isenabled()  # one the caller turned off stays off
