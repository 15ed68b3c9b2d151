"""litdata under LoadGuard: a dataset written with ``litdata.optimize``, read with ``StreamingDataLoader``.

Run: ``python examples/litdata_loader.py`` (CPU, about 15 s; needs the ``loaders`` extra, litdata installed
with ``--no-deps``). The chunks are written to a temporary directory first; nothing is downloaded.

What a user does: add ``ResumableLoaderMixin`` to the datamodule for an exact resume. The loader keeps its own
state, which Lightning saves in every checkpoint; the mixin leaves resuming to it and ends its restore mode
when the resumed epoch is over (without it, every later epoch continues the resumed one's position).
``auto_tune=True`` keeps ``num_workers`` (the chunks are split between the workers the loader was built with,
so the order depends on the count) and says so (docs/loaders.md).
"""

from __future__ import annotations

import argparse
import multiprocessing
import tempfile
from typing import Any

import litdata
import torch
from lightning.pytorch import LightningDataModule, LightningModule, Trainer

from lightning_loadguard import LoadGuard, ResumableLoaderMixin

FEATURES = 32


def sample(index: int) -> dict[str, Any]:
    return {"index": index, "x": torch.full((FEATURES,), float(index))}


class Augmented(litdata.StreamingDataset):
    """litdata's way to transform: a subclass whose ``__getitem__`` reads a sample, then works on it."""

    def __getitem__(self, index: Any) -> dict[str, Any]:
        item = super().__getitem__(index)
        x = item["x"]
        for _ in range(200):
            x = torch.tanh(x * 1.01)
        return {"index": item["index"], "x": x}


class LitData(ResumableLoaderMixin, LightningDataModule):
    def __init__(self, directory: str, workers: int) -> None:
        super().__init__()
        self.directory, self.workers = directory, workers

    def train_dataloader(self) -> litdata.StreamingDataLoader:
        dataset = Augmented(self.directory, shuffle=True, seed=0)
        return litdata.StreamingDataLoader(dataset, batch_size=8, num_workers=self.workers)


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
    parser.add_argument("--samples", type=int, default=512)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--epochs", type=int, default=2)
    args = parser.parse_args()

    with tempfile.TemporaryDirectory() as tmp:
        # optimize sets the process-wide start method (spawn unless told): DataLoader workers would then import
        # everything again at each epoch. Fork, torch's default on Linux, and put back what was set.
        before = multiprocessing.get_start_method(allow_none=True)
        litdata.optimize(
            fn=sample,
            inputs=list(range(args.samples)),
            output_dir=tmp,
            chunk_size=64,
            num_workers=1,
            start_method="fork",
        )
        multiprocessing.set_start_method(before, force=True)
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
        trainer.fit(model, datamodule=LitData(tmp, args.workers))

    print(f"wait fraction: {guard.metrics['loadguard/wait_fraction']:.2f}")
    if guard.diagnosis is not None:
        print(f"verdict: {guard.diagnosis.verdict}")
    if guard.decision is not None:
        print(f"auto-tune: {guard.decision.setting.label} ({guard.decision.verdict}): {guard.decision.reason}")
    every = all(sorted(epoch) == list(range(args.samples)) for epoch in model.seen)
    print(f"every sample exactly once in each of {len(model.seen)} epochs: {every}")


if __name__ == "__main__":
    main()
