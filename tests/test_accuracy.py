"""LoadGuard's figures against ground truth: pipelines whose production and step times are known."""

from __future__ import annotations

import pytest
from pipelines import Scenario, fit_scenario, standard_scenarios

WAIT_TOLERANCE = 0.03  # absolute
CAPACITY_TOLERANCE = 0.10  # relative

_CASES = [
    pytest.param(scenario, id=f"{scenario.name}-w{workers}-{'persistent' if persistent else 'fresh'}")
    for workers in (0, 1, 2, 4)
    for persistent in ((False, True) if workers else (False,))
    for scenario in standard_scenarios(workers, persistent)
]


@pytest.mark.parametrize("scenario", _CASES)
def test_wait_fraction_and_capacity_match_the_truth(scenario: Scenario) -> None:
    guard, module = fit_scenario(scenario)
    # Taking a made batch from a worker costs the main process about a millisecond (torch's queue and
    # shared-memory handover): part of the real wait. The module's own clock measures it in this run.
    truth_wait = scenario.expected_wait_fraction(receive_s=scenario.observed_receive_s(module))
    metrics = guard.metrics
    assert metrics["loadguard/wait_fraction"] == pytest.approx(truth_wait, abs=WAIT_TOLERANCE)
    assert metrics["loadguard/producer_rate"] == pytest.approx(scenario.expected_capacity(), rel=CAPACITY_TOLERANCE)
    assert metrics["loadguard/step_ms"] == pytest.approx(scenario.step_s * 1e3, rel=0.10)
    # The loop's rate can never beat the slower of its two sides.
    slower_side = min(metrics["loadguard/consumer_rate"], scenario.expected_capacity())
    assert metrics["loadguard/throughput"] <= slower_side * 1.1
    if scenario.num_workers:
        assert metrics["loadguard/epoch_start_ms"] >= 0
        if scenario.name == "consumer_bound":
            assert metrics["loadguard/ready_fraction"] > 0.9
    else:
        assert metrics["loadguard/ready_fraction"] == 0.0
