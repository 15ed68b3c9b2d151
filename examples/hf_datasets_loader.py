"""Hugging Face ``datasets`` under LoadGuard: a map-style Arrow table, or a streaming dataset over Parquet files.

Run: ``python examples/hf_datasets_loader.py`` (map-style) or ``... --streaming`` (CPU, about 15 s; needs the
``loaders`` extra). The data is written to a temporary directory first; nothing is downloaded.

What a user does: nothing beyond the usual. ``LoadGuard()`` measures and diagnoses; ``auto_tune=True`` tunes a
map-style table like any Dataset and keeps a streaming one's ``num_workers`` (its shards are split between
workers, so the order depends on the count); ``ResumableLoaderMixin`` resumes both exactly, except a streaming
dataset read by workers or shuffled with a buffer, which it refuses at the first fit (docs/loaders.md).
"""

from __future__ import annotations

import argparse
import os
import tempfile
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_DATASETS_OFFLINE", "1")

import datasets
import pyarrow as pa
import pyarrow.parquet as pq
import torch
from lightning.pytorch import LightningDataModule, LightningModule, Trainer
from torch.utils.data import DataLoader

from lightning_loadguard import LoadGuard, ResumableLoaderMixin

FEATURES = 32


def write_parquet(directory: Path, samples: int, files: int = 4) -> list[str]:
    """``samples`` rows (an index and a feature vector) in ``files`` Parquet files: the streaming shards."""
    paths = []
    for f in range(files):
        rows = range(f * samples // files, (f + 1) * samples // files)
        path = directory / f"train-{f:02d}.parquet"
        pq.write_table(pa.table({"index": list(rows), "x": [[float(i)] * FEATURES for i in rows]}), path)
        paths.append(str(path))
    return paths


def augment(row: dict[str, Any]) -> dict[str, Any]:
    """A per-sample transform that costs CPU time, as decoding or augmenting does."""
    x = torch.as_tensor(row["x"], dtype=torch.float32)
    for _ in range(200):
        x = torch.tanh(x * 1.01)
    return {"index": row["index"], "x": x}


class HFData(ResumableLoaderMixin, LightningDataModule):
    def __init__(self, files: list[str], streaming: bool, workers: int) -> None:
        super().__init__()
        self.files, self.streaming, self.workers = files, streaming, workers

    def train_dataloader(self) -> DataLoader:
        if self.streaming:
            stream = datasets.load_dataset("parquet", data_files=self.files, split="train", streaming=True)
            return DataLoader(stream.map(augment).with_format("torch"), batch_size=8, num_workers=self.workers)
        table = datasets.load_dataset("parquet", data_files=self.files, split="train").with_format("torch")
        return DataLoader(table, batch_size=8, shuffle=True, num_workers=self.workers, collate_fn=_collate)


def _collate(rows: list[dict[str, Any]]) -> dict[str, Any]:
    return torch.utils.data.default_collate([augment(row) for row in rows])


class Model(LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(FEATURES, 1)
        self.seen: list[list[int]] = []

    def on_train_epoch_start(self) -> None:
        self.seen.append([])

    def training_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> torch.Tensor:
        self.seen[-1].extend(int(i) for i in batch["index"])
        return self.layer(batch["x"]).pow(2).mean()

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.01)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--streaming", action="store_true", help="stream the Parquet files (IterableDataset)")
    parser.add_argument("--samples", type=int, default=512)
    parser.add_argument(
        "--workers", type=int, default=None, help="DataLoader workers (default: 1 map-style, 0 streaming)"
    )
    parser.add_argument("--epochs", type=int, default=2)
    args = parser.parse_args()
    # A streaming dataset read by workers is not resumed exactly (each worker holds its own state): the mixin
    # refuses it, so the streaming example reads in the main process.
    workers = args.workers if args.workers is not None else (0 if args.streaming else 1)

    with tempfile.TemporaryDirectory() as tmp:
        files = write_parquet(Path(tmp), args.samples)
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
        trainer.fit(model, datamodule=HFData(files, args.streaming, workers))

    print(f"wait fraction: {guard.metrics['loadguard/wait_fraction']:.2f}")
    if guard.diagnosis is not None:
        print(f"verdict: {guard.diagnosis.verdict}")
    if guard.decision is not None:
        print(f"auto-tune: {guard.decision.setting.label} ({guard.decision.verdict}): {guard.decision.reason}")
    every = all(sorted(epoch) == list(range(args.samples)) for epoch in model.seen)
    print(f"every sample exactly once in each of {len(model.seen)} epochs: {every}")


if __name__ == "__main__":
    main()
