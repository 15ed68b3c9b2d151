"""End to end: two ranks (DDP on CPU, one node) forecast from a 1-rank run, then run and measured on their own clocks.

The runs are ``benchmarks/forecast_check.py``'s: the 1-rank run with LoadGuard attached gives the facts; the 2-rank
run and the 1-rank run again are measured without it. A shared host's load drifts between runs, so the throughput
is judged side by side with the rerun (the ratio of the two), within a sanity bound plus the drift the host showed
between the measured run and its rerun; the memory is counted, and cannot drift.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

STEPS = 160
SANITY = 0.35
"""Relative bound on the 2-rank throughput ratio against its forecast, fixed in advance."""
SANITY_WAIT = 0.15
"""Absolute bound on the 2-rank wait fraction against its forecast, fixed in advance."""


@pytest.mark.slow
def test_two_ranks_are_forecast_from_one() -> None:
    import forecast_check as fc

    from lightning_loadguard.model.forecast import ForecastFacts, WhatIf, forecast

    baseline = fc._measure(fc.BASELINE, STEPS, guard=True)
    facts = ForecastFacts.from_dict(baseline["facts"])
    as_measured, two = forecast(facts), forecast(facts, WhatIf(ranks_per_node=2))
    measured_two = fc._measure(fc.Config(ranks=2), STEPS)
    rerun = fc._measure(fc.BASELINE, STEPS)

    # Memory: both ranks' queues, each worker's prefetch slots of the batch the module saw.
    batch_bytes = fc.BATCH * (8 + 4 * fc.FEATURES)
    assert two.inflight_bytes is not None and two.inflight_bytes.value == 2 * fc.WORKERS * fc.PREFETCH * batch_bytes
    # What the run held: per rank the most batches made (counted in the workers' collate) and not yet taken (counted
    # in the module) at a step's end. The workers make a batch faster than the step on average, so each rank's
    # queues fill between the bursts, and a full queue is the count, not a bound: exactly the forecast's.
    assert measured_two["inflight_max"] == two.inflight_bytes.value

    drift = abs(rerun["throughput"] / baseline["throughput"] - 1.0)
    predicted = two.throughput.value / as_measured.throughput.value
    measured = measured_two["throughput"] / rerun["throughput"]
    # The accuracy goal (GOAL_THROUGHPUT, GOAL_WAIT) is benchmarks/forecast_check.py's, measured side by side on a
    # quiet machine; here a bound fixed in advance that a run alone on a shared host keeps (0.86 against 1.00 seen)
    # and a forecast that got the ranks' sharing wrong (one rank's rate halved, or doubled) does not.
    assert measured == pytest.approx(predicted, rel=SANITY + drift), (predicted, measured, drift)

    # DDP's own cost (its collectives, the lockstep) is not in a 1-rank run: the forecast bounds the wait from below
    # and says so, and the wait stays within the bound (the benchmark's figures: benchmarks/RESULTS.md).
    assert any("the wait as a lower one" in note for note in two.notes), two.notes
    assert (two.throughput.open_end, two.wait_fraction.open_end) == ("low", "high")
    wait_drift = abs(rerun["wait_fraction"] - baseline["wait_fraction"])
    assert measured_two["wait_fraction"] >= two.wait_fraction.value - SANITY_WAIT - wait_drift
    assert measured_two["wait_fraction"] <= two.wait_fraction.value + SANITY_WAIT + wait_drift
