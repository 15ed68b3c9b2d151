"""The decision's watch on scripted windows: which changes make the tuner probe again, and after how many windows."""

from __future__ import annotations

from dataclasses import replace

import pytest

from lightning_loadguard.meters.settings import LoaderSettings
from lightning_loadguard.meters.window import WindowSnapshot
from lightning_loadguard.tuning.watch import HOLD_WINDOWS, DecisionWatch, WatchReference

SETTING = LoaderSettings(2, 2)
STEPS = 16


def window(step_s: float, wait_s: float, burst_s: float = 0.0) -> WindowSnapshot:
    """A window of ``STEPS`` steps; ``burst_s`` more wait in each step of its last 4-step block only."""
    waits = tuple(wait_s + (burst_s if k >= STEPS - 4 else 0.0) for k in range(STEPS))
    return WindowSnapshot(wait_s=waits, step_s=(step_s,) * STEPS, settings=SETTING)


# Decided at 50 steps/s, compute-bound: a 20 ms step and no wait.
DECIDED = window(0.02, 0.0)
REFERENCE = WatchReference(SETTING, rate=DECIDED.sustained_rate, error=0.01, winnable=0.0)


def _first_change(windows: list[WindowSnapshot], **kwargs: float) -> int | None:
    watch = DecisionWatch(REFERENCE, min_gain=0.05, **kwargs)  # type: ignore[arg-type]
    for k, w in enumerate(windows, 1):
        if watch.record(w) is not None:
            return k
    return None


def test_a_slower_producer_is_a_change_after_the_hold() -> None:
    # Another job took the cores: the loop now waits 10 ms for every batch.
    assert _first_change([window(0.02, 0.01)] * 10) == HOLD_WINDOWS


def test_a_faster_step_the_loader_no_longer_keeps_up_with_is_a_change() -> None:
    # The step got twice as fast; the loader makes a batch every 15 ms, so the loop waits 5 ms a step.
    watch = DecisionWatch(REFERENCE, min_gain=0.05)
    changes = [watch.record(window(0.01, 0.005)) for _ in range(HOLD_WINDOWS)]
    assert changes[-1] is not None and changes[-1].rate_now > REFERENCE.rate
    assert "grew from 0% to 33%" in changes[-1].reason


def test_a_faster_step_at_an_unchanged_rate_is_a_change() -> None:
    # Decided compute-bound at 50 steps/s with a loader that makes 50 batches/s; the step now takes 10 ms, so the
    # loop waits the other 10: the rate is the same, the loader is what holds it now.
    assert _first_change([window(0.01, 0.01)] * 10) == HOLD_WINDOWS


def test_a_slower_or_faster_step_that_the_loader_keeps_up_with_is_not() -> None:
    assert _first_change([window(0.04, 0.0)] * 10) is None  # slower step: no loader setting helps it
    assert _first_change([window(0.01, 0.0002)] * 10) is None  # faster step, the loader keeps up


def test_a_wait_no_larger_than_at_the_decision_is_not_a_change() -> None:
    # Decided with 20 % of the loop still waiting (the best the budget found); the step got slower since.
    decided = window(0.02, 0.005)
    reference = WatchReference(SETTING, decided.sustained_rate, 0.01, winnable=decided.wait_fraction)
    watch = DecisionWatch(reference, min_gain=0.05)
    assert all(watch.record(window(0.03, 0.006)) is None for _ in range(10))


def test_moves_within_the_noise_or_min_gain_are_not_changes() -> None:
    # 4 % slower with a 4 % wait: under min_gain, and under WAIT_OK.
    assert _first_change([window(0.0204, 0.0008)] * 10) is None
    # A fifth of the loop waiting, all of it in one block of four: beyond min_gain, not beyond the noise.
    assert _first_change([window(0.02, 0.0, burst_s=0.02)] * 10) is None
    assert _first_change([window(0.02, 0.005)] * 10) == HOLD_WINDOWS  # the same share, steady: a change


def test_a_change_must_hold_in_windows_in_a_row() -> None:
    slower, steady = window(0.02, 0.01), window(0.02, 0.0)
    assert _first_change([slower, slower, steady] * 4) is None
    assert _first_change([slower, steady, slower, slower, slower]) == 5
    assert _first_change([slower] * 4, hold=1) == 1


def test_the_hold_is_validated() -> None:
    with pytest.raises(ValueError, match="hold must be an integer >= 1"):
        DecisionWatch(REFERENCE, min_gain=0.05, hold=0)


def test_a_window_that_measured_no_rate_is_no_change() -> None:
    # Steps served only from batches made before the window: its wait says nothing of the producer, however long.
    empty = replace(window(0.02, 0.01), batches_made=0)
    assert not empty.measured_a_rate
    assert _first_change([empty] * 10) is None
    assert _first_change([window(0.02, 0.01), window(0.02, 0.01), empty] * 3) is None  # and it breaks a hold
