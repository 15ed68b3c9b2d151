"""What the three data-library examples share (``*_loader.py``): their arguments, a per-sample cost, a model that
records the samples it trains on, the Trainer they fit and the lines they print.

Each example keeps what is particular to its library: writing the data, reading it, and its datamodule or loader.
"""

from __future__ import annotations

import argparse

import torch
from lightning.pytorch import LightningDataModule, LightningModule, Trainer
from torch.utils.data import DataLoader

from lightning_loadguard import LoadGuard

FEATURES = 32


def arguments(
    description: str, workers: int | None, workers_help: str = "DataLoader workers"
) -> argparse.ArgumentParser:
    """``--samples``, ``--workers`` (default ``workers``) and ``--epochs``; an example may add its own."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--samples", type=int, default=512)
    parser.add_argument("--workers", type=int, default=workers, help=workers_help)
    parser.add_argument("--epochs", type=int, default=2)
    return parser


def augment(x: torch.Tensor) -> torch.Tensor:
    """A per-sample transform that costs CPU time, as decoding or augmenting does."""
    for _ in range(200):
        x = torch.tanh(x * 1.01)
    return x


class IndexRecorder(LightningModule):
    """A linear model on ``batch["x"]`` that records, epoch by epoch, the ``batch["index"]`` values it trains on."""

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


def fit(guard: LoadGuard, data: LightningDataModule | DataLoader, epochs: int) -> IndexRecorder:
    """Train an :class:`IndexRecorder` on ``data`` for ``epochs`` epochs on the CPU, with ``guard``."""
    model = IndexRecorder()
    trainer = Trainer(
        max_epochs=epochs,
        callbacks=[guard],
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        accelerator="cpu",
    )
    if isinstance(data, LightningDataModule):
        trainer.fit(model, datamodule=data)
    else:
        trainer.fit(model, train_dataloaders=data)
    return model


def report(guard: LoadGuard, model: IndexRecorder, samples: int) -> None:
    """Print what LoadGuard measured, diagnosed and decided, and whether every epoch saw every sample once."""
    print(f"wait fraction: {guard.metrics['loadguard/wait_fraction']:.2f}")
    if guard.diagnosis is not None:
        print(f"verdict: {guard.diagnosis.verdict}")
    if guard.decision is not None:
        print(f"auto-tune: {guard.decision.setting.label} ({guard.decision.verdict}): {guard.decision.reason}")
    every = all(sorted(epoch) == list(range(samples)) for epoch in model.seen)
    print(f"every sample exactly once in each of {len(model.seen)} epochs: {every}")
