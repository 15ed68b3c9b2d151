"""LoadGuard's cost on a fast pipeline: throughput with and without it, alternated in one run.

    python benchmarks/overhead.py [--rounds 12] [--steps 400]

Each round trains the same fast pipeline (a step of about 2 ms, batches made by one worker ahead of need)
once without and once with ``LoadGuard``, in alternating order, and compares steps per second between
the 50th step and ``on_train_end``. The machine is noisy, so the verdict is the median over the rounds of
each round's ratio. Goal: the median ratio is at least 0.99.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
import warnings
from pathlib import Path
from typing import Any

import torch
from lightning.pytorch import Callback

from lightning_loadguard import LoadGuard
from lightning_loadguard.report import render_table
from lightning_loadguard.synthetic import TimedDataset, TimedModule, _busy, timed_loader

# The pipelines with known timings and their expected figures live beside the tests.
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from pipelines import quiet_trainer

STEP_S = 0.002


class _FixedStep(TimedModule):
    """A step of fixed length, so that anything a callback adds shows up in the throughput."""

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        _busy(STEP_S, spin=True)
        return super().training_step(batch, batch_idx)

    def on_train_batch_end(self, outputs: Any, batch: Any, batch_idx: int) -> None:
        pass


class _Stopwatch(Callback):
    """Steps per second after a warm-up (worker start-up and first-batch effects left out)."""

    def __init__(self, warmup: int) -> None:
        self.warmup = warmup

    def on_train_batch_start(self, trainer: Any, pl_module: Any, batch: Any, batch_idx: int) -> None:
        if batch_idx == self.warmup:
            self.start = time.perf_counter()

    def on_train_end(self, trainer: Any, pl_module: Any) -> None:
        self.rate = (trainer.global_step - self.warmup) / (time.perf_counter() - self.start)


def _rate(with_guard: bool, steps: int) -> float:
    watch = _Stopwatch(warmup=min(50, steps // 4))
    callbacks: list[Callback] = [watch] + ([LoadGuard(print_summary=False)] if with_guard else [])
    trainer = quiet_trainer(max_steps=steps, callbacks=callbacks)
    loader = timed_loader(TimedDataset(steps * 4, sample_s=0.0), batch_size=4, num_workers=1, prefetch_factor=4)
    trainer.fit(_FixedStep(record=False), loader)
    return watch.rate


def _hot_path_cost(steps: int) -> dict[str, float]:
    """Microseconds per step spent inside LoadGuard's per-step code, timed directly in one run.

    Every per-step entry point (hooks, profiler calls, the loader probe's look at the buffer) is wrapped
    in a timer; the wrappers' own cost (about a microsecond each) is included, so the figure errs high. It
    is far less noisy than comparing two throughputs. ``on_train_batch_end`` carries the logging steps'
    work (window, diagnosis, logging) spread over all steps.
    """
    from lightning_loadguard import _lightning
    from lightning_loadguard.meters import loader_probe

    totals: dict[str, float] = {}
    originals: list[tuple[Any, str, Any]] = []

    def wrap(owner: Any, name: str, label: str) -> None:
        original = getattr(owner, name)
        totals[label] = 0.0

        def timed(*args: Any, **kwargs: Any) -> Any:
            start = time.perf_counter()
            try:
                return original(*args, **kwargs)
            finally:
                totals[label] += time.perf_counter() - start

        originals.append((owner, name, original))
        setattr(owner, name, timed)

    # The outermost entry points only (the fetch callbacks run inside the profiler's start and stop).
    for name in ("on_train_batch_start", "on_train_batch_end", "_on_fetch_observed"):
        wrap(LoadGuard, name, f"LoadGuard.{name}")
    for name in ("start", "stop"):
        wrap(_lightning.FetchTimingProfiler, name, f"profiler.{name} (fetch timing included)")
    wrap(loader_probe, "_peek", "loader probe: batch readiness and level")
    try:
        _rate(True, steps)
    finally:
        for owner, name, original in reversed(originals):
            setattr(owner, name, original)
    return {label: seconds / steps * 1e6 for label, seconds in totals.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=12)
    parser.add_argument("--steps", type=int, default=400)
    args = parser.parse_args()
    warnings.filterwarnings("ignore")
    _rate(False, 50)  # warm imports and caches
    ratios, without, with_ = [], [], []
    for round_ in range(args.rounds):
        order = (False, True) if round_ % 2 == 0 else (True, False)
        rates = {flag: _rate(flag, args.steps) for flag in order}
        without.append(rates[False])
        with_.append(rates[True])
        ratios.append(rates[True] / rates[False])
    rows = [
        (f"round {i + 1}", f"{a:.1f}", f"{b:.1f}", f"{b / a:.4f}", f"{(1 / b - 1 / a) * 1e6:+.0f}")
        for i, (a, b) in enumerate(zip(without, with_, strict=True))
    ]
    a, b = statistics.median(without), statistics.median(with_)
    rows.append(("median", f"{a:.1f}", f"{b:.1f}", f"{statistics.median(ratios):.4f}", f"{(1 / b - 1 / a) * 1e6:+.0f}"))
    headers = ("", "steps/s without", "steps/s with LoadGuard", "ratio", "cost per step (us)")
    print(render_table(f"LoadGuard overhead: {STEP_S * 1e3:.0f} ms steps, goal ratio >= 0.99", rows, headers))
    costs = _hot_path_cost(args.steps)
    per_step_us = 1e6 / a
    rows = [(label, f"{us:.1f}") for label, us in sorted(costs.items(), key=lambda item: -item[1])]
    total = sum(costs.values())
    rows.append(("total", f"{total:.1f} us = {100 * total / per_step_us:.2f} % of a {per_step_us:.0f} us step"))
    print(render_table("LoadGuard's own time per training step, timed directly", rows, ("where", "us per step")))


if __name__ == "__main__":
    main()
