"""WebDataset under LoadGuard: tar shards split between DataLoader workers.

Run: ``python examples/webdataset_loader.py`` (CPU, about 10 s; needs the ``loaders`` extra). The shards are
written to a temporary directory first; nothing is downloaded.

What a user does: nothing beyond the usual. ``LoadGuard()`` measures and diagnoses; ``auto_tune=True`` keeps
``num_workers`` (the pipeline's ``split_by_worker`` gives each worker its own shards, so the order depends on
the count) and says so. A WebDataset pipeline keeps no state: ``ResumableLoaderMixin`` cannot resume it
exactly and says so at the first fit (docs/loaders.md).
"""

from __future__ import annotations

import argparse
import io
import tempfile
from pathlib import Path
from typing import Any

import torch
import webdataset as wds
from lightning.pytorch import LightningModule, Trainer
from torch.utils.data import DataLoader

from lightning_loadguard import LoadGuard

FEATURES = 32


def write_shards(directory: Path, samples: int, shards: int = 4) -> list[str]:
    """``samples`` samples (an index and a feature tensor) in ``shards`` tar files."""
    urls = []
    for s in range(shards):
        url = str(directory / f"train-{s:04d}.tar")
        with wds.TarWriter(url) as sink:
            for i in range(s * samples // shards, (s + 1) * samples // shards):
                buffer = io.BytesIO()
                torch.save(torch.full((FEATURES,), float(i)), buffer)
                sink.write({"__key__": f"{i:06d}", "index.cls": i, "x.pth": buffer.getvalue()})
        urls.append(url)
    return urls


def augment(sample: dict[str, Any]) -> tuple[int, torch.Tensor]:
    """A per-sample transform that costs CPU time, as decoding or augmenting does."""
    x = sample["x.pth"]
    for _ in range(200):
        x = torch.tanh(x * 1.01)
    return sample["index.cls"], x


class Model(LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(FEATURES, 1)
        self.seen: list[list[int]] = []

    def on_train_epoch_start(self) -> None:
        self.seen.append([])

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
        index, x = batch
        self.seen[-1].extend(int(i) for i in index)
        return self.layer(x).pow(2).mean()

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.01)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=512)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--epochs", type=int, default=2)
    args = parser.parse_args()

    with tempfile.TemporaryDirectory() as tmp:
        urls = write_shards(Path(tmp), args.samples)
        pipeline = wds.WebDataset(urls, shardshuffle=False, empty_check=False).decode().map(augment)
        loader = DataLoader(pipeline, batch_size=8, num_workers=args.workers)
        guard = LoadGuard(auto_tune=True, print_summary=False)
        model = Model()
        trainer = Trainer(
            max_epochs=args.epochs,
            callbacks=[guard],
            logger=False,
            enable_checkpointing=False,
            enable_progress_bar=False,
            enable_model_summary=False,
            accelerator="cpu",
        )
        trainer.fit(model, loader)

    print(f"wait fraction: {guard.metrics['loadguard/wait_fraction']:.2f}")
    if guard.diagnosis is not None:
        print(f"verdict: {guard.diagnosis.verdict}")
    if guard.decision is not None:
        print(f"auto-tune: {guard.decision.setting.label} ({guard.decision.verdict}): {guard.decision.reason}")
    every = all(sorted(epoch) == list(range(args.samples)) for epoch in model.seen)
    print(f"every sample exactly once in each of {len(model.seen)} epochs: {every}")


if __name__ == "__main__":
    main()
