"""Pipelines with known timings and the figures LoadGuard must report for them: the tests' oracle.

The package keeps only what its demo needs (``lightning_loadguard.synthetic``); the expected figures, the
scenario tables and the helpers that train on them live here, beside the tests (benchmarks import them too).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from torch.utils.data import DataLoader

from lightning_loadguard._lightning import pl
from lightning_loadguard.synthetic import TimedDataset, TimedModule, timed_loader


def _rebuild_slowly(items: tuple[Any, ...], seconds: float) -> SlowHandoverBatch:
    time.sleep(seconds)
    return SlowHandoverBatch(items, seconds)


class SlowHandoverBatch(tuple):  # type: ignore[type-arg]
    """A batch that costs ``seconds`` to unpickle: made quickly by a worker, slow to take in the trainer."""

    def __new__(cls, items: Any, seconds: float = 0.0) -> SlowHandoverBatch:
        batch = super().__new__(cls, items)
        batch.seconds = seconds  # type: ignore[attr-defined]
        return batch

    def __reduce__(self) -> tuple[Any, ...]:
        return _rebuild_slowly, (tuple(self), self.seconds)  # type: ignore[attr-defined]


class SlowHandoverCollate:
    """A ``collate_fn`` whose batches take ``seconds`` to hand from a worker to the training process.

    Example:
        >>> import torch
        >>> batch = SlowHandoverCollate(0.0)([(torch.tensor(0), torch.zeros(2))])
        >>> [tuple(t.shape) for t in batch]
        [(1,), (1, 2)]
    """

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds

    def __call__(self, samples: list[Any]) -> SlowHandoverBatch:
        from torch.utils.data import default_collate

        return SlowHandoverBatch(default_collate(samples), self.seconds)


@dataclass(frozen=True)
class Scenario:
    """A pipeline with known timings and the figures LoadGuard must report for it.

    The truth comes from the timings alone: each batch's production time is the sum of its samples' known
    costs (no shuffling, so batch ``j`` holds samples ``j*B .. j*B+B-1``), and the wait is what the
    bounded-buffer model gives when those times are replayed against the known step time.

    Example:
        >>> s = Scenario("producer_bound", num_workers=2, sample_s=0.015, step_s=0.012)
        >>> round(s.expected_capacity(), 2), round(s.expected_wait_fraction(), 2)
        (33.33, 0.59)
    """

    name: str
    num_workers: int
    sample_s: float
    step_s: float
    batch_size: int = 4
    batches_per_epoch: int = 28
    burst_every: int = 0
    burst_s: float = 0.0
    prefetch_factor: int = 2
    persistent_workers: bool = False
    window: int = 21

    def dataset(self) -> TimedDataset:
        return TimedDataset(
            self.batch_size * self.batches_per_epoch,
            sample_s=self.sample_s,
            burst_every=self.burst_every,
            burst_s=self.burst_s,
        )

    def loader(self) -> DataLoader:
        return timed_loader(
            self.dataset(),
            batch_size=self.batch_size,
            num_workers=self.num_workers,
            prefetch_factor=self.prefetch_factor if self.num_workers else None,
            persistent_workers=self.persistent_workers,
        )

    def batch_costs(self) -> list[float]:
        timing = self.dataset().timing
        size = self.batch_size
        return [sum(timing.cost(j * size + k) for k in range(size)) for j in range(self.batches_per_epoch)]

    def expected_capacity(self) -> float:
        """Batches per second all producers sustain: workers / mean batch production time."""
        costs = self.batch_costs()
        return max(1, self.num_workers) * len(costs) / sum(costs)

    def simulated_waits(self, receive_s: float = 0.0) -> tuple[float, ...]:
        """Per step of an epoch, the wait for the batch to be made (the receive cost excluded)."""
        from lightning_loadguard.model.buffer import simulate_buffer

        receive_s = receive_s if self.num_workers else 0.0
        run = simulate_buffer(
            self.batch_costs(),
            [self.step_s + receive_s],
            num_workers=self.num_workers,
            prefetch_factor=self.prefetch_factor,
            steps=self.batches_per_epoch,
            record_levels=False,
        )
        return run.waits

    def observed_receive_s(self, module: TimedModule) -> float:
        """What a fetch costs beyond making the batch, as the module's own clock saw it.

        With workers: the median gap between the end of a step and the next batch's arrival, over the last
        ``window`` steps on which the model says the batch was already made (taking it from the worker);
        ``0`` when every step waited (then the gap is all production). Without workers: the median of each
        fetch's gap less its batch's known production time (the loader's own work around the samples).
        """
        gaps = module.gaps[-self.window :]
        if not self.num_workers:
            costs = self.batch_costs()[-self.window :]
            extra = sorted(max(0.0, gap - cost) for gap, cost in zip(gaps, costs, strict=False))
            return extra[len(extra) // 2] if extra else 0.0
        waits = self.simulated_waits()[-self.window :]
        ready = sorted(gap for gap, wait in zip(gaps, waits, strict=False) if wait <= 1e-9)
        return ready[len(ready) // 2] if ready else 0.0

    def expected_wait_fraction(self, receive_s: float = 0.0) -> float:
        """Wait fraction over the last ``window`` steps of an epoch, from the bounded-buffer model.

        Args:
            receive_s: what each fetch costs beyond making the batch (see :meth:`observed_receive_s`): with
                workers, taking a made batch from one (unpickling, attaching shared memory), which also
                keeps the consumer busy between steps; without, the loader's own work around the samples.
                It is part of every fetch, so it counts as wait.
        """
        waits = [wait + receive_s for wait in self.simulated_waits(receive_s)[-self.window :]]
        return sum(waits) / (sum(waits) + self.step_s * len(waits))


def standard_scenarios(num_workers: int, persistent_workers: bool = False) -> list[Scenario]:
    """Producer-bound, consumer-bound and bursty pipelines, scaled so the regime holds for any worker count."""
    scale = max(1, num_workers)
    common = {"num_workers": num_workers, "persistent_workers": persistent_workers and num_workers > 0}
    return [
        Scenario("producer_bound", sample_s=0.0075 * scale, step_s=0.012, **common),
        Scenario("consumer_bound", sample_s=0.002 * scale, step_s=0.020, **common),
        # One slow batch in seven: a period prime to the worker counts, so the bursts rotate over the
        # workers as they do in a shuffled pipeline, and every 21-step window holds exactly three.
        Scenario("bursty", sample_s=0.001, burst_every=28, burst_s=0.100, step_s=0.020, **common),
    ]


def quiet_trainer(**overrides: Any) -> Any:
    """A CPU ``Trainer`` for measurements: no logger, progress bar, model summary or checkpoints.

    Example:
        >>> quiet_trainer(max_epochs=1).max_epochs
        1
    """
    settings: dict[str, Any] = {
        "logger": False,
        "enable_progress_bar": False,
        "enable_model_summary": False,
        "enable_checkpointing": False,
        "accelerator": "cpu",
        "devices": 1,
    }
    return pl.Trainer(**{**settings, **overrides})


def fit_scenario(scenario: Scenario, epochs: int = 2, **guard_kwargs: Any) -> tuple[Any, TimedModule]:
    """Train on the scenario's pipeline with a :class:`~lightning_loadguard.LoadGuard` attached.

    Returns the callback (its ``metrics`` hold the figures over the last ``scenario.window`` steps) and the
    module (its ``seen`` holds the sample order).
    """
    from lightning_loadguard.callback import LoadGuard

    guard_kwargs.setdefault("window", scenario.window)
    guard_kwargs.setdefault("print_summary", False)
    guard = LoadGuard(**guard_kwargs)
    module = TimedModule(step_s=scenario.step_s, features=scenario.dataset().features)
    quiet_trainer(max_epochs=epochs, callbacks=[guard]).fit(module, scenario.loader())
    return guard, module
