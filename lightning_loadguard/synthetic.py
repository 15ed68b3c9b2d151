"""Synthetic pipelines with known timings, for ``loadguard demo`` and for trying LoadGuard out.

A :class:`TimedDataset` costs a known time per sample (sleeping, like I/O, or a known CPU time, like a CPU-bound
transform), optionally with periodic slow samples (bursts). A :class:`TimedModule` trains a tiny model
whose step takes a known time and records which samples reached ``training_step``.

Example:
    >>> ds = TimedDataset(length=8, sample_s=0.0, features=4)
    >>> index, x = ds[3]
    >>> int(index), tuple(x.shape)
    (3, (4,))
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils.data import DataLoader, Dataset

from lightning_loadguard._lightning import pl

_SLEEP_OVERSHOOT_S = 0.00012


def _burn_cpu(seconds: float) -> None:
    """Compute for ``seconds`` of this thread's CPU time, like a transform: a fixed amount of work, which takes
    longer than ``seconds`` of wall time while other processes hold the core (a spin to a wall-clock deadline
    would instead do less work the more it is preempted, and oversubscribed workers would look free)."""
    end = time.thread_time() + seconds
    while time.thread_time() < end:
        pass


def _busy(seconds: float, spin: bool) -> None:
    """Take ``seconds``: asleep (like I/O) or burning CPU (like a transform), to within microseconds."""
    if seconds <= 0:
        return
    end = time.perf_counter() + seconds
    if not spin and seconds > _SLEEP_OVERSHOOT_S:
        # Sleeping overshoots by a fraction of a millisecond; sleep short and spin the rest exactly.
        time.sleep(seconds - _SLEEP_OVERSHOOT_S)
    while time.perf_counter() < end:
        pass


@dataclass(frozen=True)
class Timing:
    """Per-sample production cost: ``sample_s`` each, and ``burst_s`` more for every ``burst_every``-th sample."""

    sample_s: float = 0.0
    burst_every: int = 0
    burst_s: float = 0.0
    spin: bool = False

    def cost(self, index: int) -> float:
        extra = self.burst_s if self.burst_every and index % self.burst_every == 0 else 0.0
        return self.sample_s + extra

    def mean_cost(self) -> float:
        return self.sample_s + (self.burst_s / self.burst_every if self.burst_every else 0.0)


class TimedDataset(Dataset):
    """A map-style dataset of ``(index, features)`` whose samples cost a known time to produce.

    Args:
        length: number of samples.
        sample_s: seconds each sample costs.
        features: size of the feature vector.
        burst_every: every ``burst_every``-th sample (by index) costs ``burst_s`` more (0: no bursts).
        burst_s: the extra cost of a slow sample.
        spin: compute instead of sleeping (a CPU-bound transform rather than I/O): each sample then costs
            ``sample_s`` (and ``burst_s``) of the worker's CPU time, and takes longer on a busy host.
    """

    def __init__(
        self,
        length: int,
        sample_s: float = 0.0,
        features: int = 16,
        burst_every: int = 0,
        burst_s: float = 0.0,
        spin: bool = False,
    ) -> None:
        if length < 1:
            raise ValueError(f"`length` must be >= 1, got {length!r}.")
        if sample_s < 0 or burst_s < 0:
            raise ValueError("`sample_s` and `burst_s` must be >= 0 seconds.")
        if burst_every < 0:
            raise ValueError(f"`burst_every` must be >= 0 (0: no bursts), got {burst_every!r}.")
        self.length = length
        self.features = features
        self.timing = Timing(sample_s, burst_every, burst_s, spin)

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        cost = self.timing.cost(index)
        if self.timing.spin:
            _burn_cpu(cost)
        else:
            _busy(cost, spin=False)
        generator = torch.Generator().manual_seed(index)
        return torch.tensor(index), torch.randn(self.features, generator=generator)

    def batch_cost(self, batch_size: int) -> float:
        """Mean production time of one batch of ``batch_size`` samples (excluding collate overhead)."""
        return batch_size * self.timing.mean_cost()


class TimedModule(pl.LightningModule):
    """A tiny regression model whose step takes ``step_s`` seconds; records the samples it sees.

    The step is timed from the moment the batch arrives (``on_before_batch_transfer``, right after the
    fetch) to the end of ``on_train_batch_end``, so Lightning's own per-step work is inside ``step_s``
    rather than added to it: the consumer's time per batch is known.

    Args:
        step_s: seconds from receiving a batch to the end of the step (sleep, like an accelerator step).
        features: input size, matching the dataset.
        record: keep the sample indices of every batch in ``self.seen`` (in order).
    """

    def __init__(self, step_s: float = 0.0, features: int = 16, record: bool = True, spin: bool = False) -> None:
        super().__init__()
        self.step_s = step_s
        self.spin = spin
        self.layer = torch.nn.Linear(features, 1)
        self.record = record
        self.seen: list[int] = []
        self.gaps: list[float] = []
        """Per step after an epoch's first: from the end of the previous step to this batch's arrival."""
        self._received_at = 0.0
        self._ended_at: float | None = None

    def on_train_epoch_start(self) -> None:
        self._ended_at = None

    def on_before_batch_transfer(self, batch: Any, dataloader_idx: int) -> Any:
        self._received_at = time.perf_counter()
        if self._ended_at is not None:
            self.gaps.append(self._received_at - self._ended_at)
        return batch

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        index, x = batch
        if self.record:
            self.seen.extend(int(i) for i in index)
        return self.layer(x).pow(2).mean()

    def on_train_batch_end(self, outputs: Any, batch: Any, batch_idx: int) -> None:
        _busy(self._received_at + self.step_s - time.perf_counter(), self.spin)
        self._ended_at = time.perf_counter()

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.01)


def timed_loader(
    dataset: Dataset,
    batch_size: int = 8,
    num_workers: int = 0,
    prefetch_factor: int | None = None,
    persistent_workers: bool = False,
    shuffle: bool = False,
    **kwargs: Any,
) -> DataLoader:
    """A DataLoader with the given settings (``prefetch_factor`` only where workers exist)."""
    if num_workers > 0 and prefetch_factor is not None:
        kwargs["prefetch_factor"] = prefetch_factor
    return DataLoader(
        dataset,
        batch_size=batch_size,
        num_workers=num_workers,
        persistent_workers=persistent_workers and num_workers > 0,
        shuffle=shuffle,
        **kwargs,
    )
