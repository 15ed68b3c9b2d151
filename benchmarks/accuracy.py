"""LoadGuard's figures against ground truth, for every standard scenario.

    python benchmarks/accuracy.py

Producer-bound, consumer-bound and bursty pipelines with known per-sample and per-step times, for
``num_workers`` 0, 1, 2 and 4 with persistent workers off and on. The truth: capacity from the known
production times; the wait fraction from replaying those times through the bounded-buffer model, plus the
per-fetch receive cost the module's own clock saw. Targets: wait fraction within 0.03 absolute, producer
capacity within 10 % relative.
"""

from __future__ import annotations

import sys
import warnings
from pathlib import Path

from lightning_loadguard.report import render_table

# The pipelines with known timings and their expected figures live beside the tests.
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from pipelines import fit_scenario, standard_scenarios


def main() -> None:
    warnings.filterwarnings("ignore")
    rows = []
    worst_wait = worst_capacity = 0.0
    for workers in (0, 1, 2, 4):
        for persistent in (False, True) if workers else (False,):
            for scenario in standard_scenarios(workers, persistent):
                guard, module = fit_scenario(scenario)
                truth_wait = scenario.expected_wait_fraction(receive_s=scenario.observed_receive_s(module))
                truth_capacity = scenario.expected_capacity()
                wait = guard.metrics["loadguard/wait_fraction"]
                capacity = guard.metrics["loadguard/producer_rate"]
                wait_error = abs(wait - truth_wait)
                capacity_error = abs(capacity - truth_capacity) / truth_capacity
                worst_wait = max(worst_wait, wait_error)
                worst_capacity = max(worst_capacity, capacity_error)
                rows.append(
                    (
                        scenario.name,
                        str(workers),
                        "on" if scenario.persistent_workers else "off",
                        f"{truth_wait:.3f}",
                        f"{wait:.3f}",
                        f"{wait_error:.3f}",
                        f"{truth_capacity:.1f}",
                        f"{capacity:.1f}",
                        f"{100 * capacity_error:.1f} %",
                    )
                )
    headers = (
        "scenario",
        "workers",
        "persistent",
        "wait truth",
        "wait measured",
        "abs error",
        "capacity truth (b/s)",
        "capacity measured",
        "rel error",
    )
    print(render_table("LoadGuard accuracy against known timings", rows, headers))
    print(f"worst wait-fraction error {worst_wait:.3f} (target 0.03); worst capacity error "
          f"{100 * worst_capacity:.1f} % (target 10 %)")


if __name__ == "__main__":
    main()
