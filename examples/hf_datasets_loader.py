"""Hugging Face ``datasets`` under LoadGuard: a map-style Arrow table, or a streaming dataset over Parquet files.

Run: ``python examples/hf_datasets_loader.py`` (map-style) or ``... --streaming`` (CPU, about 15 s; needs the
``loaders`` extra). The data is written to a temporary directory first; nothing is downloaded.

What a user does: nothing beyond the usual. ``LoadGuard()`` measures and diagnoses; ``auto_tune=True`` tunes a
map-style table like any Dataset and keeps a streaming one's ``num_workers`` (its shards are split between
workers, so the order depends on the count); ``ResumableLoaderMixin`` resumes both exactly, except a streaming
dataset read by workers or shuffled with a buffer, which it refuses at the first fit (docs/loaders.md).
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_DATASETS_OFFLINE", "1")

import datasets
import pyarrow as pa
import pyarrow.parquet as pq
import torch
from _loader_example import FEATURES, arguments, augment, fit, report
from lightning.pytorch import LightningDataModule
from torch.utils.data import DataLoader

from lightning_loadguard import LoadGuard, ResumableLoaderMixin


def write_parquet(directory: Path, samples: int, files: int = 4) -> list[str]:
    """``samples`` rows (an index and a feature vector) in ``files`` Parquet files: the streaming shards."""
    paths = []
    for f in range(files):
        rows = range(f * samples // files, (f + 1) * samples // files)
        path = directory / f"train-{f:02d}.parquet"
        pq.write_table(pa.table({"index": list(rows), "x": [[float(i)] * FEATURES for i in rows]}), path)
        paths.append(str(path))
    return paths


def transform(row: dict[str, Any]) -> dict[str, Any]:
    return {"index": row["index"], "x": augment(torch.as_tensor(row["x"], dtype=torch.float32))}


class HFData(ResumableLoaderMixin, LightningDataModule):
    def __init__(self, files: list[str], streaming: bool, workers: int) -> None:
        super().__init__()
        self.files, self.streaming, self.workers = files, streaming, workers

    def train_dataloader(self) -> DataLoader:
        if self.streaming:
            stream = datasets.load_dataset("parquet", data_files=self.files, split="train", streaming=True)
            return DataLoader(stream.map(transform).with_format("torch"), batch_size=8, num_workers=self.workers)
        table = datasets.load_dataset("parquet", data_files=self.files, split="train").with_format("torch")
        return DataLoader(table, batch_size=8, shuffle=True, num_workers=self.workers, collate_fn=_collate)


def _collate(rows: list[dict[str, Any]]) -> dict[str, Any]:
    return torch.utils.data.default_collate([transform(row) for row in rows])


def main() -> None:
    parser = arguments(__doc__.splitlines()[0], None, "DataLoader workers (default: 1 map-style, 0 streaming)")
    parser.add_argument("--streaming", action="store_true", help="stream the Parquet files (IterableDataset)")
    args = parser.parse_args()
    # A streaming dataset read by workers is not resumed exactly (each worker holds its own state): the mixin
    # refuses it, so the streaming example reads in the main process.
    workers = args.workers if args.workers is not None else (0 if args.streaming else 1)

    with tempfile.TemporaryDirectory() as tmp:
        files = write_parquet(Path(tmp), args.samples)
        guard = LoadGuard(auto_tune=True, print_summary=False)
        model = fit(guard, HFData(files, args.streaming, workers), args.epochs)

    report(guard, model, args.samples)


if __name__ == "__main__":
    main()
