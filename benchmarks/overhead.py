"""LoadGuard's cost on a fast pipeline: throughput with and without it, alternated in one run.

    python benchmarks/overhead.py [--rounds 6] [--steps 400]

Each round trains the same fast pipeline (a step of about 2 ms, batches made by one worker ahead of need)
once without and once with ``LoadGuard``, in alternating order, and compares steps per second between
``on_train_start`` and ``on_train_end``. Goal: the median ratio is at least 0.99.
"""

from __future__ import annotations

import argparse
import statistics
import time
import warnings
from typing import Any

import torch
from lightning.pytorch import Callback, Trainer

from lightning_loadguard import LoadGuard
from lightning_loadguard.report import render_table
from lightning_loadguard.synthetic import TimedDataset, TimedModule, _busy, timed_loader

STEP_S = 0.002


class _FixedStep(TimedModule):
    """A step of fixed length, so that anything a callback adds shows up in the throughput."""

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        _busy(STEP_S, spin=True)
        return super().training_step(batch, batch_idx)

    def on_train_batch_end(self, outputs: Any, batch: Any, batch_idx: int) -> None:
        pass


class _Stopwatch(Callback):
    def on_train_start(self, trainer: Any, pl_module: Any) -> None:
        self.start = time.perf_counter()

    def on_train_end(self, trainer: Any, pl_module: Any) -> None:
        self.rate = trainer.global_step / (time.perf_counter() - self.start)


def _rate(with_guard: bool, steps: int) -> float:
    watch = _Stopwatch()
    callbacks: list[Callback] = [watch] + ([LoadGuard(print_summary=False)] if with_guard else [])
    trainer = Trainer(
        max_steps=steps,
        callbacks=callbacks,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        enable_checkpointing=False,
        accelerator="cpu",
        devices=1,
    )
    loader = timed_loader(TimedDataset(steps * 4, sample_s=0.0), batch_size=4, num_workers=1, prefetch_factor=4)
    trainer.fit(_FixedStep(record=False), loader)
    return watch.rate


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=6)
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

if __name__ == "__main__":
    main()
