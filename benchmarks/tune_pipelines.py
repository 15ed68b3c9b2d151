"""Auto-tuned loader settings against the defaults, Lightning's suggestion and an exhaustive grid.

For each synthetic pipeline (known per-sample cost, known step time) this script

1. trains epoch 0 with ``LoadGuard(auto_tune=True)`` starting from ``num_workers=0`` and reads the decision
   and the probe cost;
2. measures the steady-state throughput (steps/s after a warm-up, over a fixed number of steps, the step
   emulated by sleeping ``step_s`` like an accelerator step) of: the tuned setting, ``num_workers=0``,
   Lightning's suggestion ``cpu_count // processes_per_host - 1`` with the default prefetch, and every point
   of a grid over ``num_workers`` and ``prefetch_factor``; all in the same run, the same way.

Usage::

    python benchmarks/tune_pipelines.py            # the table in docs/tuning.md
    python benchmarks/tune_pipelines.py --quick    # fewer steps and grid points
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import warnings
from dataclasses import dataclass
from itertools import product
from pathlib import Path

from lightning_loadguard._lightning import pl
from lightning_loadguard.callback import LoadGuard
from lightning_loadguard.synthetic import TimedDataset, TimedModule, _busy, timed_loader
from lightning_loadguard.tuning.decision import TuneDecision
from lightning_loadguard.tuning.options import TuneOptions

# The pipelines with known timings and their expected figures live beside the tests.
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from pipelines import quiet_trainer


@dataclass(frozen=True)
class Pipeline:
    name: str
    sample_s: float
    step_s: float
    spin: bool = False
    burst_every: int = 0
    burst_s: float = 0.0
    batch_size: int = 4

    def dataset(self, length: int) -> TimedDataset:
        return TimedDataset(
            length, sample_s=self.sample_s, spin=self.spin, burst_every=self.burst_every, burst_s=self.burst_s
        )


PIPELINES = [
    Pipeline("io_bound", sample_s=0.004, step_s=0.005),
    Pipeline("cpu_transforms", sample_s=0.002, step_s=0.006, spin=True),
    Pipeline("bursty", sample_s=0.0005, step_s=0.008, burst_every=29, burst_s=0.06),
    Pipeline("compute_bound", sample_s=0.0002, step_s=0.010),
]


def steady_rate(pipeline: Pipeline, workers: int, prefetch: int | None, steps: int, warmup: int) -> float:
    """Steps/s of a loop that takes ``step_s`` per batch, after ``warmup`` steps (workers started, buffer settled)."""
    loader = timed_loader(
        pipeline.dataset((steps + warmup) * pipeline.batch_size),
        batch_size=pipeline.batch_size,
        num_workers=workers,
        prefetch_factor=prefetch,
        shuffle=True,
    )
    iterator = iter(loader)
    for _ in range(warmup):
        next(iterator)
        _busy(pipeline.step_s, spin=False)
    start = time.perf_counter()
    for _ in range(steps):
        next(iterator)
        _busy(pipeline.step_s, spin=False)
    rate = steps / (time.perf_counter() - start)
    del iterator
    return rate


def tune(pipeline: Pipeline, epoch_steps: int) -> TuneDecision | None:
    pl.seed_everything(0, verbose=False)
    loader = timed_loader(
        pipeline.dataset(epoch_steps * pipeline.batch_size), batch_size=pipeline.batch_size, shuffle=True
    )
    guard = LoadGuard(print_summary=False, auto_tune=TuneOptions())
    trainer = quiet_trainer(max_epochs=1, callbacks=[guard])
    trainer.fit(TimedModule(step_s=pipeline.step_s, record=False), loader)
    return guard.decision


def label(workers: int, prefetch: int | None) -> str:
    return "w=0" if workers == 0 else f"w={workers} p={prefetch or 2}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer steps and grid points")
    args = parser.parse_args()
    warnings.simplefilter("ignore")
    steps, warmup, epoch_steps = (60, 10, 300) if args.quick else (200, 20, 600)
    workers_grid = [0, 1, 2, 4] if args.quick else [0, 1, 2, 3, 4, 6]
    prefetch_grid = [1, 2, 4]
    cores = os.cpu_count() or 1
    suggestion = max(1, cores // 1 - 1)  # Lightning's hint: cpu_count // processes_per_host - 1
    rows = []
    for pipeline in PIPELINES:
        decision = tune(pipeline, epoch_steps)
        grid = {}
        for workers, prefetch in product(workers_grid, prefetch_grid):
            key = (workers, prefetch if workers else None)
            if key not in grid:
                grid[key] = steady_rate(pipeline, *key, steps=steps, warmup=warmup)
        zero = grid[(0, None)]
        lightning = grid.get((suggestion, 2)) or steady_rate(pipeline, suggestion, 2, steps, warmup)
        best_key = max(grid, key=grid.__getitem__)
        if decision is None:
            tuned_key, tuned = (0, None), zero
        else:
            tuned_key = (decision.num_workers, decision.prefetch_factor)
            tuned = steady_rate(pipeline, *tuned_key, steps=steps, warmup=warmup)
        rows.append((pipeline.name, zero, lightning, best_key, grid[best_key], tuned_key, tuned, decision))
        print(f"{pipeline.name}: done", flush=True)

    print()
    print(f"host: {cores} cores, 1 training process; steps/s over {steps} steps after {warmup} of warm-up")
    header = (
        f"| pipeline | w=0 | Lightning (w={suggestion}, p=2) | grid best | tuned | tuned / grid best "
        "| verdict | probe steps / budget | probe cost |"
    )
    print(header)
    print("|---" * 9 + "|")
    for name, zero, lightning, best_key, best, tuned_key, tuned, decision in rows:
        probe = f"{decision.probe_steps} / {decision.probe_budget_steps}" if decision else "-"
        cost = f"{decision.probe_cost_s:.2f} s" if decision else "-"
        verdict = decision.verdict if decision else "not tuned"
        print(
            f"| {name} | {zero:.1f} | {lightning:.1f} | {best:.1f} ({label(*best_key)}) "
            f"| {tuned:.1f} ({label(*tuned_key)}) | {tuned / best:.2f} | {verdict} | {probe} | {cost} |"
        )


if __name__ == "__main__":
    main()
