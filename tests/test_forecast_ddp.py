"""End to end: two ranks (DDP on CPU, one node) forecast from a 1-rank run, then run and measured on their own clocks.

The runs are ``benchmarks/forecast_check.py``'s: the 1-rank run with LoadGuard attached gives the facts; the 2-rank
run and the 1-rank run again are measured without it. A shared host's load drifts between runs, so the throughput
is judged side by side with the rerun (the ratio of the two), within the goal plus the drift the host showed
between the measured run and its rerun; the memory is counted, and cannot drift.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

STEPS = 160


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
    assert 0 < measured_two["inflight_max"] <= two.inflight_bytes.value

    drift = abs(rerun["throughput"] / baseline["throughput"] - 1.0)
    predicted = two.throughput.value / as_measured.throughput.value
    measured = measured_two["throughput"] / rerun["throughput"]
    assert measured == pytest.approx(predicted, rel=fc.GOAL_THROUGHPUT + drift), (predicted, measured, drift)

    wait_drift = abs(rerun["wait_fraction"] - baseline["wait_fraction"])
    assert measured_two["wait_fraction"] == pytest.approx(two.wait_fraction.value, abs=fc.GOAL_WAIT + wait_drift)
