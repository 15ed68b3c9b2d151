"""The decision's watch on scripted windows: which changes make the tuner probe again, and after how many windows."""

from __future__ import annotations

from dataclasses import replace

import pytest

from lightning_loadguard.meters.cpu import CpuUse
from lightning_loadguard.meters.settings import LoaderSettings
from lightning_loadguard.meters.window import HostFacts, WindowSnapshot
from lightning_loadguard.tuning.watch import (
    FULL,
    HOLD_WINDOWS,
    HOST_MOVE,
    CoresUse,
    DecisionWatch,
    WatchReference,
)

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


# -- other work's cores ------------------------------------------------------------------------------------------

CORES = 8


def on_cores(w: WindowSnapshot, training: float, other: float, processes: int = 1) -> WindowSnapshot:
    """``w`` with a CPU reading: this process and its workers used ``training`` of ``CORES`` cores, other work
    ``other`` (the host's other training ranks, ``processes - 1`` of them, use what this one does)."""
    busy = min(float(CORES), training * processes + other)
    use = CpuUse(1.0, float(CORES), CORES, loop_cores=training / 2, worker_cores=training / 2, busy_cores=busy)
    return replace(w, cpu=use, host=HostFacts(cpu_count=CORES, processes_on_host=processes))


def _host_watch(other_before: float, busy_before: float, host_move: float | None = HOST_MOVE) -> DecisionWatch:
    reference = replace(REFERENCE, cores=CoresUse(other_before, busy_before))
    return DecisionWatch(reference, min_gain=0.05, host_move=host_move)


def _first_host_change(watch: DecisionWatch, windows: list[WindowSnapshot]) -> int | None:
    for k, w in enumerate(windows, 1):
        if watch.record(w) is not None:
            return k
    return None


def test_the_cores_reading_is_other_work_and_the_share_in_use() -> None:
    # 3 training ranks on the host, each using 1.5 cores; 2 cores of other work: 6.5 of 8 in use.
    use = CoresUse.of(on_cores(DECIDED, training=1.5, other=2.0, processes=3))
    assert use is not None
    assert use.other == pytest.approx(2.0) and use.busy_share == pytest.approx(6.5 / CORES)
    assert CoresUse.of(DECIDED) is None  # no CPU reading
    unread = replace(on_cores(DECIDED, 1.5, 2.0), cpu=CpuUse(1.0, 8.0, 8, 0.75, 0.75, busy_cores=None))
    assert CoresUse.of(unread) is None  # the system's times unread: other work is unknown


def test_work_that_arrives_on_full_cores_is_a_change_with_the_data_side_unchanged() -> None:
    # Decided on 6 of 8 cores in use, 1 of them other work; a job takes 3 cores more and fills them. The loop waits
    # no more than it did (the step and the loader slowed alike): the data side alone would not report it.
    watch = _host_watch(other_before=1.0, busy_before=6 / CORES)
    arrived = on_cores(window(0.03, 0.0), training=4.0, other=4.0)
    assert _first_host_change(watch, [arrived] * 10) == HOLD_WINDOWS
    change = watch.record(arrived)
    assert change is not None and change.other_work_moved and not change.on_data_side
    assert change.other_before == pytest.approx(1.0) and change.other_now == pytest.approx(4.0)
    assert change.reason.startswith("other work on the host went from 1.0 to 4.0 cores over 3 windows")
    assert _first_change([arrived] * 10) is None  # the same windows, no cores read at the decision
    unread = DecisionWatch(replace(REFERENCE, cores=CoresUse(1.0, 6 / CORES)), min_gain=0.05)
    assert _first_host_change(unread, [arrived] * 10) is None  # nor by default: the data side alone


def test_work_that_arrives_on_cores_with_room_is_not_a_change() -> None:
    # Other work took 3 cores more but the cores are not full: nothing was taken from the training run.
    watch = _host_watch(other_before=1.0, busy_before=4 / CORES)
    assert _first_host_change(watch, [on_cores(DECIDED, training=2.0, other=4.0)] * 10) is None  # 6 of 8 in use


def test_work_that_leaves_full_cores_is_a_change_and_leaving_free_cores_is_not() -> None:
    left = on_cores(DECIDED, training=4.0, other=1.0)
    assert _first_host_change(_host_watch(other_before=4.0, busy_before=1.0), [left] * 10) == HOLD_WINDOWS
    # The same departure from cores that were not full at the decision: the decision could count on them.
    assert _first_host_change(_host_watch(other_before=4.0, busy_before=0.8), [left] * 10) is None


def test_a_move_under_host_move_is_not_a_change() -> None:
    just_under = 1.0 + HOST_MOVE * CORES - 0.1
    watch = _host_watch(other_before=1.0, busy_before=1.0)
    assert _first_host_change(watch, [on_cores(DECIDED, training=8 - just_under, other=just_under)] * 10) is None
    over = 1.0 + HOST_MOVE * CORES + 0.1
    watch = _host_watch(other_before=1.0, busy_before=1.0)
    assert _first_host_change(watch, [on_cores(DECIDED, training=8 - over, other=over)] * 10) == HOLD_WINDOWS
    assert FULL < 1.0


def test_the_host_s_other_training_ranks_are_not_other_work() -> None:
    # 4 ranks on the host, each now using 1.9 cores where it used 1.0: the busy cores grew by 3.6, other work not.
    watch = _host_watch(other_before=0.2, busy_before=1.0)
    busier_ranks = on_cores(DECIDED, training=1.9, other=0.2, processes=4)
    assert _first_host_change(watch, [busier_ranks] * 10) is None


def test_a_move_must_hold_and_the_trigger_can_be_switched_off() -> None:
    arrived = on_cores(window(0.03, 0.0), training=4.0, other=4.0)
    before = on_cores(DECIDED, training=5.0, other=1.0)
    watch = _host_watch(other_before=1.0, busy_before=6 / CORES)
    assert _first_host_change(watch, [arrived, arrived, before] * 4) is None
    off = _host_watch(other_before=1.0, busy_before=6 / CORES, host_move=None)
    assert _first_host_change(off, [arrived] * 10) is None
    with pytest.raises(ValueError, match="host_move must be a share of the usable cores > 0, or None"):
        _host_watch(1.0, 1.0, host_move=0.0)


def test_a_change_on_both_sides_names_both() -> None:
    slower = window(0.02, 0.01)  # the loop now waits a third of its time
    watch = _host_watch(other_before=1.0, busy_before=6 / CORES)
    changes = [watch.record(on_cores(slower, training=4.0, other=1.0)) for _ in range(HOLD_WINDOWS)]
    assert changes[-1] is not None and changes[-1].on_data_side and not changes[-1].other_work_moved
    assert "grew from 0% to 33% over" in changes[-1].reason and "other work" not in changes[-1].reason
    watch = _host_watch(other_before=1.0, busy_before=6 / CORES)
    changes = [watch.record(on_cores(slower, training=4.0, other=4.0)) for _ in range(HOLD_WINDOWS)]
    assert changes[-1] is not None and changes[-1].on_data_side and changes[-1].other_work_moved
    assert "grew from 0% to 33%; other work on the host went from 1.0 to 4.0 cores over 3" in changes[-1].reason
