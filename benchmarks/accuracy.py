"""LoadGuard's figures against ground truth, for every standard scenario.

    python benchmarks/accuracy.py

Producer-bound, consumer-bound and bursty pipelines with known per-sample and per-step times, for
``num_workers`` 0, 1 and 2 and 4 with persistent workers off and on. Two truths side by side:

- known costs: capacity from the known production times; the wait fraction from replaying them through the
  bounded-buffer model against the known step time (production only: taking a made batch from a worker
  costs the consumer a little more, which only a run can tell). On a quiet machine LoadGuard's figures
  should sit near these: wait within 0.03 absolute where the handover is small, capacity within 10 %.
- the run's own clocks (what ``tests/test_accuracy.py`` asserts, also on a busy machine): each sample's
  production time stamped by the dataset, each fetch timed by Lightning's ``SimpleProfiler``, the loop by
  the module.
"""

from __future__ import annotations

import sys
import warnings
from pathlib import Path

from lightning_loadguard.report import render_table

# The pipelines with known timings and their expected figures live beside the tests.
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from pipelines import Observed, fit_scenario, standard_scenarios


def main() -> None:
    warnings.filterwarnings("ignore")
    rows = []
    worst_wait = worst_capacity = 0.0
    for workers in (0, 1, 2, 4):
        for persistent in (False, True) if workers else (False,):
            for scenario in standard_scenarios(workers, persistent):
                guard, module = fit_scenario(scenario)
                seen = Observed.of(module, workers, scenario.window)
                known_wait, known_capacity = scenario.expected_wait_fraction(), scenario.expected_capacity()
                wait = guard.metrics["loadguard/wait_fraction"]
                capacity = guard.metrics["loadguard/producer_rate"]
                worst_wait = max(worst_wait, abs(wait - known_wait))
                worst_capacity = max(worst_capacity, abs(capacity - known_capacity) / known_capacity)
                rows.append(
                    (
                        scenario.name,
                        str(workers),
                        "on" if scenario.persistent_workers else "off",
                        f"{known_wait:.3f}",
                        f"{seen.wait_fraction:.3f}",
                        f"{wait:.3f}",
                        f"{known_capacity:.1f}",
                        f"{seen.capacity:.1f}",
                        f"{capacity:.1f}",
                        f"{100 * (capacity - known_capacity) / known_capacity:+.1f} %",
                    )
                )
    headers = (
        "scenario",
        "workers",
        "persistent",
        "wait: known costs",
        "wait: run's clocks",
        "wait: LoadGuard",
        "capacity (b/s): known",
        "run's clocks",
        "LoadGuard",
        "vs known",
    )
    print(render_table("LoadGuard accuracy against known timings and against the run's own clocks", rows, headers))
    print(
        f"against known costs: worst wait-fraction error {worst_wait:.3f} (target 0.03, production only), "
        f"worst capacity error {100 * worst_capacity:.1f} % (target 10 %)"
    )


if __name__ == "__main__":
    main()
