"""Re-tuning on 50 simulated pipelines (the first seeds of benchmarks/retune_sweep.py's sweep) whose host changes
after the decision, with the watch's own ``HOLD_WINDOWS``, scored against the changed pipeline's ground truth
(steady rates over 250 steps, where the full sweep takes 600): a regression check of the figures in
benchmarks/RESULTS.md, whose thresholds sit under this subset's own figures by a few pipelines."""

from __future__ import annotations

import os

import pytest
from sim_retune import CHANGES, Trial, false_triggers, summary, trials
from sim_sweep import map_seeds

from lightning_loadguard.tuning.watch import HOLD_WINDOWS, HOST_MOVE

SUBSET = 50
TRUTH_STEPS = 250
FOUND_WHERE_IT_MATTERS = 0.5  # measured 0.80: 4 of the 5 changes that left a choice within 0.95 of the best below it
GAIN_WHERE_IT_MATTERS = 0.05  # measured 0.13: the re-tuned rate less the old choice's, over the best, on those 5
FALSE_TRIGGERS = 0.2  # measured 0.02 (1 of 50 unchanged runs, over 30 windows each)
WORSE = 0.02  # measured 0.02 (handover_bound-41 on these 250-step truths, none on 600): at most one pipeline


def _run(seed: int) -> tuple[list[Trial], dict[int, bool]]:
    return trials(seed, (HOLD_WINDOWS,), truth_steps=TRUTH_STEPS), false_triggers(seed, (1, HOLD_WINDOWS))


def _run_reading_other_work(seed: int) -> tuple[list[Trial], dict[int, bool]]:
    return (
        trials(seed, (HOLD_WINDOWS,), truth_steps=TRUTH_STEPS, host_move=HOST_MOVE),
        false_triggers(seed, (HOLD_WINDOWS,), host_move=HOST_MOVE),
    )


@pytest.fixture(scope="module")
def runs() -> tuple[list[Trial], list[dict[int, bool]]]:
    each = map_seeds(_run, range(SUBSET), min(2, os.cpu_count() or 1))
    return [t for found, _ in each for t in found], [control for _, control in each]


@pytest.fixture(scope="module")
def figures(runs: tuple[list[Trial], list[dict[int, bool]]]) -> dict[str, float]:
    return summary(*runs)[HOLD_WINDOWS]


def test_the_subset_spans_every_change(runs: tuple[list[Trial], list[dict[int, bool]]]) -> None:
    assert {t.kind for t in runs[0]} == set(CHANGES)


def test_changes_that_matter_are_found_within_the_hold(figures: dict[str, float]) -> None:
    assert figures["detected_matter"] >= FOUND_WHERE_IT_MATTERS, figures
    assert figures["windows_median"] <= HOLD_WINDOWS + 1, figures


def test_an_unchanged_host_seldom_sets_off_a_re_tune(
    runs: tuple[list[Trial], list[dict[int, bool]]], figures: dict[str, float]
) -> None:
    assert figures["false_triggers"] <= FALSE_TRIGGERS, figures
    # The hold is what keeps them few: one window in a row reports the noise of a shared host several times as
    # often (9 of these 50, against 2 with the hold).
    controls = [c for c in runs[1] if c]
    single, held = sum(c[1] for c in controls), sum(c[HOLD_WINDOWS] for c in controls)
    assert single >= max(5, 2 * held), (single, held)


def test_re_tuning_is_never_worse_than_keeping_the_old_choice(figures: dict[str, float]) -> None:
    assert figures["worse"] <= WORSE, figures
    assert figures["retuned_95"] >= figures["kept_95"], figures
    assert figures["retuned_median"] >= figures["kept_median"] - 0.005, figures
    assert figures["retuned_p1"] >= figures["kept_p1"] - 0.005, figures


def test_re_tuning_wins_back_rate_where_the_change_matters(figures: dict[str, float]) -> None:
    assert figures["matter_gain"] >= GAIN_WHERE_IT_MATTERS, figures


def test_a_watch_blind_to_changes_fails_the_checks() -> None:
    blind = [
        t
        for seed in range(12)
        for t in trials(seed, (HOLD_WINDOWS,), min_gain=10.0, truth_steps=TRUTH_STEPS, host_move=None)
    ]
    figures = summary(blind, [])[HOLD_WINDOWS]
    assert figures["matter"] > 0, figures
    assert figures["detected_matter"] < FOUND_WHERE_IT_MATTERS, figures
    assert figures["matter_gain"] < GAIN_WHERE_IT_MATTERS, figures


@pytest.mark.slow
def test_reading_other_work_s_cores_finds_more_of_the_changes_that_matter(
    runs: tuple[list[Trial], list[dict[int, bool]]], figures: dict[str, float]
) -> None:
    # TuneOptions(retune_on_other_work=True): on this subset 5 of the 5 changes that matter found (4 without), 2 of
    # 50 unchanged runs reporting (1 without), 0.17 of the best won back on them (0.13).
    each = map_seeds(_run_reading_other_work, range(SUBSET), min(2, os.cpu_count() or 1))
    on = summary([t for found, _ in each for t in found], [c for _, c in each])[HOLD_WINDOWS]
    assert on["detected_matter"] > figures["detected_matter"], (on, figures)
    assert on["matter_gain"] > figures["matter_gain"], (on, figures)
    assert on["false_triggers"] <= FALSE_TRIGGERS and on["worse"] <= WORSE, on
