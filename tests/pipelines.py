"""Pipelines with known timings and the figures LoadGuard must report for them: the tests' oracle.

The package keeps only what its demo needs (``lightning_loadguard.synthetic``); the expected figures, the
scenario tables and the helpers that train on them live here, beside the tests (benchmarks import them too).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from statistics import fmean
from typing import Any

import torch
from torch.utils.data import DataLoader, default_collate, get_worker_info

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


class ClockedDataset(TimedDataset):
    """A :class:`TimedDataset` whose samples also carry when the producing process started and finished them.

    Each sample is ``(index, features, stamps)`` with ``stamps = [started, finished]`` read from
    ``time.perf_counter`` inside ``__getitem__`` (system-wide and monotonic on Linux, so a worker's stamps
    compare with the training process's). This is the dataset's own clock: the cost each item really had in
    this run, however much of it another process took.
    """

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:  # type: ignore[override]
        started = time.perf_counter()
        sample_index, features = super().__getitem__(index)
        return sample_index, features, torch.tensor([started, time.perf_counter()], dtype=torch.float64)


def clocked_collate(samples: list[Any]) -> list[Any]:
    """torch's ``default_collate``, then one more stamp: when the batch was finished, collate included.

    A batch is then ``[indices, features, stamps, collated]``; made in a worker, ``collated`` is read there.
    """
    batch = default_collate(samples)
    return [*batch, torch.tensor(time.perf_counter(), dtype=torch.float64)]


class ClockedModule(TimedModule):
    """A :class:`TimedModule` for :class:`ClockedDataset` batches that keeps its own clock of every step.

    Per step it records when the batch arrived (``on_before_batch_transfer``), when its step ended (end of
    ``on_train_batch_end``) and, from the batch's stamps (see :func:`clocked_collate`), when the first of its
    samples was started and when the batch was collated.
    """

    def __init__(self, step_s: float = 0.0, features: int = 16) -> None:
        super().__init__(step_s=step_s, features=features)
        self.steps: list[StepClock] = []
        self.fetch_s: list[float] = []
        """Per step, the fetch as timed by the trainer's ``SimpleProfiler`` (filled in by :func:`fit_scenario`)."""
        self.epoch_started: list[float] = []
        self._epoch = -1
        self._stamps: tuple[float, float] = (0.0, 0.0)

    def on_train_epoch_start(self) -> None:
        super().on_train_epoch_start()
        self._epoch += 1
        self.epoch_started.append(time.perf_counter())

    def on_before_batch_transfer(self, batch: Any, dataloader_idx: int) -> Any:
        batch = super().on_before_batch_transfer(batch, dataloader_idx)
        stamps = batch[2]
        self._stamps = (float(stamps[:, 0].min()), float(batch[3]))
        return batch

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        return super().training_step(batch[:2], batch_idx)

    def on_train_batch_end(self, outputs: Any, batch: Any, batch_idx: int) -> None:
        previous = self._ended_at
        super().on_train_batch_end(outputs, batch, batch_idx)
        assert self._ended_at is not None
        self.steps.append(
            StepClock(self._epoch, previous, self._received_at, self._ended_at, self._stamps[0], self._stamps[1])
        )


@dataclass(frozen=True)
class StepClock:
    """One training step as the module's and the dataset's own clocks saw it (``perf_counter`` seconds)."""

    epoch: int
    asked: float | None  # the previous step's end in this epoch: from here on the loop wanted this batch
    received: float
    ended: float
    made_from: float  # the first of the batch's samples was started
    made_to: float  # the batch was collated (its last sample finished, then the collate)

    @property
    def production_s(self) -> float:
        return self.made_to - self.made_from


@dataclass(frozen=True)
class Observed:
    """What a run's own clocks say over LoadGuard's window: the last ``window`` steps of the last epoch.

    None of it comes from LoadGuard: the steps from the module's clock, production from the dataset's.
    """

    capacity: float  # batches/s of all producers: workers / mean production time of every batch made
    fetch_s: tuple[float, ...]  # per step: the fetch, as Lightning's own SimpleProfiler timed it
    gap_s: tuple[float, ...]  # per step: from the end of the previous step to the batch's arrival
    period_s: tuple[float, ...]  # per step: from the end of the previous step to the end of this one
    production_wait_s: tuple[float, ...]  # per step: the part of the fetch before the batch's last sample was made
    made_before_asked: tuple[bool, ...]  # per step: the batch was finished before the loop wanted it
    # Per step: the batch was finished before its fetch began (on Lightning's profiler clock and the module's:
    # the fetch began no earlier than the batch's arrival less the fetch's length). Where the loop waits for a
    # core between a step's end and the next fetch (a busy host), batches finish in between: ready at the fetch,
    # which is where readiness is judged.
    made_before_fetched: tuple[bool, ...] | None = None

    @property
    def wait_fraction(self) -> float:
        """The share of loop time spent in fetches (each of which lies inside its gap between steps)."""
        return sum(self.fetch_s) / sum(self.period_s)

    @property
    def production_wait_fraction(self) -> float:
        """The share of loop time the batches themselves were late: a floor under any measured wait."""
        return sum(self.production_wait_s) / sum(self.period_s)

    @property
    def mean_step_s(self) -> float:
        """The loop's time per step outside the fetch."""
        return fmean(period - fetch for period, fetch in zip(self.period_s, self.fetch_s, strict=True))

    @property
    def throughput(self) -> float:
        return len(self.period_s) / sum(self.period_s)

    @property
    def ready_fraction(self) -> float:
        ready = self.made_before_asked if self.made_before_fetched is None else self.made_before_fetched
        return sum(ready) / len(ready)

    @classmethod
    def of(cls, module: ClockedModule, num_workers: int, window: int) -> Observed:
        steps = module.steps
        # Lightning's fetcher times exactly one fetch per step (a sized loader is never asked past its end).
        assert len(module.fetch_s) == len(steps), (len(module.fetch_s), len(steps))
        last = [k for k, s in enumerate(steps) if s.epoch == steps[-1].epoch and s.asked is not None][-window:]
        fetches = [module.fetch_s[k] for k in last]
        last = [steps[k] for k in last]
        return cls(
            capacity=max(1, num_workers) / fmean(s.production_s for s in steps),
            fetch_s=tuple(fetches),
            gap_s=tuple(s.received - s.asked for s in last),  # type: ignore[operator]
            period_s=tuple(s.ended - s.asked for s in last),  # type: ignore[operator]
            # A fetch cannot end before its batch's last sample is made. It began no later than its end (the
            # batch's arrival at the module) less its length, so this part of it was spent on production.
            production_wait_s=tuple(
                max(0.0, s.made_to - (s.received - fetch)) for s, fetch in zip(last, fetches, strict=True)
            ),
            made_before_asked=tuple(s.made_to <= s.asked for s in last),  # type: ignore[operator]
            made_before_fetched=tuple(s.made_to <= s.received - fetch for s, fetch in zip(last, fetches, strict=True)),
        )


@dataclass(frozen=True)
class Scenario:
    """A pipeline with known timings and the figures LoadGuard must report for it.

    The quiet-machine truth comes from the timings alone: each batch's production time is the sum of its
    samples' known costs (no shuffling, so batch ``j`` holds samples ``j*B .. j*B+B-1``), and the wait is
    what the bounded-buffer model gives when those times are replayed against the known step time. On a
    busy machine sleeps and spins overrun their known costs; there the truth is what the run's own clocks
    saw (:class:`Observed`).

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

    def dataset(self) -> ClockedDataset:
        return ClockedDataset(
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
            collate_fn=clocked_collate,
        )

    def batch_costs(self) -> list[float]:
        timing = self.dataset().timing
        size = self.batch_size
        return [sum(timing.cost(j * size + k) for k in range(size)) for j in range(self.batches_per_epoch)]

    def expected_capacity(self) -> float:
        """Batches per second all producers sustain: workers / mean batch production time."""
        costs = self.batch_costs()
        return max(1, self.num_workers) * len(costs) / sum(costs)

    def simulated_waits(self) -> tuple[float, ...]:
        """Per step of an epoch, the wait for the batch to be made, from the known costs alone."""
        from lightning_loadguard.model.buffer import simulate_buffer

        run = simulate_buffer(
            self.batch_costs(),
            [self.step_s],
            num_workers=self.num_workers,
            prefetch_factor=self.prefetch_factor,
            steps=self.batches_per_epoch,
            record_levels=False,
        )
        return run.waits

    def expected_wait_fraction(self) -> float:
        """Wait fraction over the last ``window`` steps of an epoch, from the known costs and the bounded-buffer
        model: production only. A real fetch also costs the handover (taking a made batch from a worker, the
        loader's own work around the samples), which only a run can tell; see :class:`Observed`."""
        waits = self.simulated_waits()[-self.window :]
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


FETCH_ACTION = "[_TrainingEpochLoop].train_dataloader_next"


def fit_scenario(scenario: Scenario, epochs: int = 2, **guard_kwargs: Any) -> tuple[Any, ClockedModule]:
    """Train on the scenario's pipeline with a :class:`~lightning_loadguard.LoadGuard` attached.

    Returns the callback (its ``metrics`` hold the figures over the last ``scenario.window`` steps) and the
    module (its ``steps`` hold the run's own clock of every step, its ``seen`` the sample order).
    """
    from lightning_loadguard.callback import LoadGuard

    guard_kwargs.setdefault("window", scenario.window)
    guard_kwargs.setdefault("print_summary", False)
    from lightning.pytorch.profilers import SimpleProfiler

    guard = LoadGuard(**guard_kwargs)
    module = ClockedModule(step_s=scenario.step_s, features=scenario.dataset().features)
    # Lightning's own profiler times every fetch too: LoadGuard's timing sits inside each of its intervals.
    profiler = SimpleProfiler()
    quiet_trainer(max_epochs=epochs, callbacks=[guard], profiler=profiler).fit(module, scenario.loader())
    module.fetch_s = list(profiler.recorded_durations[FETCH_ACTION])
    return guard, module


def leave_process_group() -> None:
    """End a DDP script's process group before the interpreter exits: an initialized gloo group left to the exit
    can abort the process (SIGABRT, "terminate called without an active exception") after training finished."""
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()


FETCH_APART_S = 0.0001  # the profiler's clock reads and LoadGuard's bookkeeping between the two intervals' ends
FETCHES_APART_MOST = 0.8  # a busy host may deschedule the loop between the two clocks on a few fetches, not most


def assert_fetches_nest_in_the_profilers(ours: tuple[float, ...], profiler: tuple[float, ...]) -> float:
    """Fetch by fetch, LoadGuard's wait lies inside the profiler's interval and, on most fetches, within
    ``FETCH_APART_S`` of it: the two clocks are read microseconds apart, unless the host takes the core between.

    Returns the mean time per fetch the profiler's interval holds beyond LoadGuard's."""
    assert len(ours) == len(profiler), (len(ours), len(profiler))
    gaps = [theirs - mine for mine, theirs in zip(ours, profiler, strict=True)]
    assert min(gaps) > -1e-6, gaps
    close = sum(gap < FETCH_APART_S for gap in gaps)
    assert close >= FETCHES_APART_MOST * len(gaps), gaps
    return sum(gaps) / len(gaps)


class LoopClock(pl.Callback):
    """Host timestamps at each batch start: the loop's period, on a clock no LoadGuard event touched."""

    def __init__(self) -> None:
        self.starts: list[float] = []

    def on_train_batch_start(self, *args: object) -> None:
        self.starts.append(time.perf_counter())

    def period(self, last: int) -> float:
        return (self.starts[-1] - self.starts[-1 - last]) / last


class MadeByWorkers(TimedDataset):
    """Each sample carries the ``num_workers`` of the iterator that made it (0: the training process), in its first
    feature: what a batch was made under, read from the batch itself."""

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        i, x = super().__getitem__(index)
        info = get_worker_info()
        x = x.clone()
        x[0] = float(info.num_workers if info is not None else 0)
        return i, x
