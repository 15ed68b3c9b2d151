"""Workloads the benchmarks share: JPEG decoding with PIL, and training steps that compute on the CPU.

- :func:`make_jpegs` writes JPEG files made locally with PIL (no download).
- :class:`JpegDataset` decodes them with PIL and augments (random crop, flip, resize), as an image
  pipeline's workers do; drawn from a generator seeded by the index, or (``global_random=True``) from Python's
  global ``random``, as a new user's ``__getitem__`` does.
- :class:`AugmentingDataset` does a known CPU time of work per sample and augments with draws from torch's and
  Python's global random streams (random crop, flip, noise).
- :class:`CpuModule` is a training step that computes on the CPU with torch's intra-op threads (a small CNN
  for images, an MLP for feature vectors), inside Lightning.
- :class:`Stopwatch` times a fit's steps per second after a warm-up.
- :class:`CountedDataset` counts the samples its workers finish, so that a rate can be held to what the
  loader sustained (a buffer that drains inside the measured steps makes them faster than the loader runs).
"""

from __future__ import annotations

import math
import random
import statistics
import subprocess
import time
from pathlib import Path
from typing import Any

import torch
from PIL import Image
from torch.utils.data import Dataset, get_worker_info

from lightning_loadguard._lightning import pl
from lightning_loadguard.meters.settings import LoaderSettings

IMAGE_SIZE = 160
CROP = 128
OUT = 64


def make_jpegs(directory: Path, count: int, size: int = IMAGE_SIZE, seed: int = 0) -> list[Path]:
    """``count`` JPEG files of ``size`` x ``size`` pixels: smooth colour fields with noise, quality 90."""
    directory.mkdir(parents=True, exist_ok=True)
    generator = torch.Generator().manual_seed(seed)
    paths = []
    for i in range(count):
        base = torch.rand(3, 8, 8, generator=generator)
        field = torch.nn.functional.interpolate(base[None], size=(size, size), mode="bilinear")[0]
        noisy = (field + 0.15 * torch.rand(3, size, size, generator=generator)).clamp(0, 1)
        pixels = (noisy.permute(1, 2, 0) * 255).to(torch.uint8).numpy()
        path = directory / f"img_{i:05d}.jpg"
        Image.fromarray(pixels).save(path, quality=90)
        paths.append(path)
    return paths


class JpegDataset(Dataset):
    """Decodes a JPEG with PIL and augments it: random crop, horizontal flip, resize, to a float tensor.

    The augmentation draws from a generator seeded by the index, so a sample is the same whatever process
    (or worker count) makes it; with ``global_random`` from Python's global ``random``, as most datasets do
    (with ``num_workers=0`` those draws advance the training process's own random stream).
    """

    def __init__(self, paths: list[Path], length: int, global_random: bool = False) -> None:
        self.paths = [str(p) for p in paths]
        self.length = length
        self.global_random = global_random

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        rng: Any = random if self.global_random else random.Random(index)
        with Image.open(self.paths[index % len(self.paths)]) as image:
            image = image.convert("RGB")
            left, top = rng.randrange(image.width - CROP + 1), rng.randrange(image.height - CROP + 1)
            image = image.crop((left, top, left + CROP, top + CROP))
            if rng.random() < 0.5:
                image = image.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
            image = image.resize((OUT, OUT), Image.Resampling.BILINEAR)
            pixels = torch.frombuffer(bytearray(image.tobytes()), dtype=torch.uint8)
        x = pixels.view(OUT, OUT, 3).permute(2, 0, 1).float().div_(255.0).sub_(0.5)
        return torch.tensor(index), x, torch.tensor(index % 10)


class AugmentingDataset(Dataset):
    """``sample_s`` of CPU time per sample (a decode's worth of work), then an augmentation drawn from the global
    random streams, as a typical ``__getitem__`` draws it: a random crop (``torch.randint``), a flip
    (Python's ``random``) and noise (``torch.rand``) on a 3 x 40 x 40 image, cropped to 32 x 32.
    """

    def __init__(self, length: int, sample_s: float = 0.002) -> None:
        self.length = length
        self.sample_s = sample_s

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        end = time.thread_time() + self.sample_s
        while time.thread_time() < end:
            pass
        image = torch.full((3, 40, 40), float(index % 255) / 255.0)
        top, left = torch.randint(0, 9, (2,)).tolist()
        image = image[:, top : top + 32, left : left + 32]
        if random.random() < 0.5:
            image = image.flip(-1)
        image = image + 0.05 * torch.rand(image.shape)
        return torch.tensor(index), image.reshape(-1)[:16].contiguous()


def _cnn() -> torch.nn.Module:
    return torch.nn.Sequential(
        torch.nn.Conv2d(3, 8, 3, stride=2, padding=1),
        torch.nn.ReLU(),
        torch.nn.Conv2d(8, 16, 3, stride=2, padding=1),
        torch.nn.ReLU(),
        torch.nn.Conv2d(16, 32, 3, stride=2, padding=1),
        torch.nn.ReLU(),
        torch.nn.AdaptiveAvgPool2d(1),
        torch.nn.Flatten(),
        torch.nn.Linear(32, 10),
    )


def _mlp(features: int, hidden: int) -> torch.nn.Module:
    return torch.nn.Sequential(
        torch.nn.Linear(features, hidden),
        torch.nn.ReLU(),
        torch.nn.Linear(hidden, hidden),
        torch.nn.ReLU(),
        torch.nn.Linear(hidden, 1),
    )


class CpuModule(pl.LightningModule):
    """A training step that computes on the CPU with torch's intra-op threads, inside Lightning.

    Args:
        kind: ``"cnn"`` for ``(index, image, label)`` batches, ``"mlp"`` for ``(index, features)`` ones.
        features: input size of the MLP; hidden: its width (sets the step's cost).
    """

    def __init__(self, kind: str, features: int = 16, hidden: int = 1024) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.kind = kind
        self.model = _cnn() if kind == "cnn" else _mlp(features, hidden)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        if self.kind == "cnn":
            _, x, y = batch
            return torch.nn.functional.cross_entropy(self.model(x), y)
        _, x = batch
        return self.model(x).pow(2).mean()

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.model.parameters(), lr=0.01)


class CountedDataset(Dataset):
    """``dataset`` whose finished samples are counted, one shared slot per worker (and one for the main
    process): no two processes write the same slot, so no count is lost without a lock."""

    def __init__(self, dataset: Dataset, max_workers: int) -> None:
        self.dataset = dataset
        self.counts = torch.zeros(max_workers + 1, dtype=torch.int64).share_memory_()
        self._slots: Any = None  # a numpy view, made in each process: a count through it costs nanoseconds

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_slots": None}

    def __len__(self) -> int:
        return len(self.dataset)  # type: ignore[arg-type]

    def __getitem__(self, index: int) -> Any:
        sample = self.dataset[index]
        if self._slots is None:
            self._slots = self.counts.numpy()
        info = get_worker_info()
        self._slots[0 if info is None else info.id + 1] += 1
        return sample

    def finished(self) -> int:
        """Samples finished so far, over all processes."""
        return int(self.counts.sum())


def fed_length(steps: int, settings: LoaderSettings) -> int:
    """Batches a loader needs for a fit of ``steps`` measured by :class:`Stopwatch` with ``counted``: the fit's
    steps and every batch the workers may have in flight at its last one, so that they make batches at the
    loop's pace to the end."""
    return steps + settings.batches_in_flight


class Stopwatch(pl.Callback):
    """Steps per second after a warm-up (worker start-up and first-batch effects left out), two ways.

    ``rate``: steps over the wall time; with ``counted`` (the fit's dataset) and ``batch_size``, at most the
    batches its workers finished over the same time, so that a buffer filled before the warm-up ended and
    drained inside the measured steps does not count as speed; the loader must then hold at least its batches in
    flight beyond the fit's last step (:func:`fed_length`), or the workers stop at the sampler's end while the
    loop still takes the batches they made early, and a deep buffer reads slower than it runs by ``in flight /
    steps``. ``clipped_rate``: each step's period (batch
    start to batch start) capped at twice the median period first. A step during which another process held
    the core, or the VM paused, lasts several periods; LoadGuard's own slowest steps (a logging step: about a
    millisecond) stay under the cap, so the capped rate still counts them.
    """

    def __init__(self, warmup: int, counted: CountedDataset | None = None, batch_size: int = 1) -> None:
        self.warmup = warmup
        self.counted = counted
        self.batch_size = batch_size
        self.starts: list[float] = []
        self.finished_at_start = 0

    def on_train_batch_start(self, trainer: Any, pl_module: Any, batch: Any, batch_idx: int) -> None:
        if batch_idx >= self.warmup:
            if not self.starts and self.counted is not None:
                self.finished_at_start = self.counted.finished()
            self.starts.append(time.perf_counter())

    def on_train_end(self, trainer: Any, pl_module: Any) -> None:
        end = time.perf_counter()
        self.rate = (trainer.global_step - self.warmup) / (end - self.starts[0])
        if self.counted is not None:
            made = (self.counted.finished() - self.finished_at_start) / self.batch_size
            self.rate = min(self.rate, made / (end - self.starts[0]))
        periods = [b - a for a, b in zip(self.starts, [*self.starts[1:], end], strict=True)]
        cap = 2 * statistics.median(periods)
        self.clipped_rate = len(periods) / math.fsum(min(p, cap) for p in periods)


def commit() -> str:
    """The commit checked out, as a results table names it."""
    return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
