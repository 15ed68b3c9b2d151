"""Auto-tuning: LoadGuard measures the loader, tries better settings mid-epoch and keeps the fastest.

Run: ``python examples/auto_tune.py`` (CPU, about 15 s).

The loader starts with PyTorch's default ``num_workers=0``: each 30 ms step first waits about 45 ms for its
batch. With ``auto_tune`` LoadGuard measures those settings, probes candidates within a share of epoch 0,
switches the loader at the training step's position (no sample skipped or repeated) and keeps the setting
that measured fastest.
"""

from __future__ import annotations

import argparse
import time
import warnings

import torch
from lightning.pytorch import LightningModule, Trainer
from torch.utils.data import DataLoader, Dataset

from lightning_loadguard import LoadGuard, TuneOptions


class SlowReads(Dataset):
    """Samples that each take ``read_s`` to read, asleep like file reads."""

    def __init__(self, length: int, read_s: float) -> None:
        self.length, self.read_s = length, read_s

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int) -> tuple[int, torch.Tensor]:
        time.sleep(self.read_s)
        return index, torch.randn(16)


class Model(LightningModule):
    """A tiny regression whose step takes ``step_s``; records the samples it trains on."""

    def __init__(self, step_s: float) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(16, 1)
        self.step_s = step_s
        self.seen: list[int] = []

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
        index, x = batch
        self.seen.extend(int(i) for i in index)
        time.sleep(self.step_s)
        return self.layer(x).pow(2).mean()

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.01)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", type=int, default=150, help="batches per epoch")
    parser.add_argument("--epochs", type=int, default=2)
    args = parser.parse_args()
    warnings.filterwarnings("ignore", message=r".*does not have many workers.*")

    dataset = SlowReads(args.batches * 8, read_s=0.045 / 8)  # 45 ms a batch of 8
    module = Model(step_s=0.030)
    guard = LoadGuard(window=30, auto_tune=TuneOptions(probe_share=0.5, max_workers=4))
    trainer = Trainer(
        max_epochs=args.epochs,
        callbacks=[guard],
        logger=False,
        accelerator="cpu",
        devices=1,
        enable_checkpointing=False,
        enable_model_summary=False,
    )
    trainer.fit(module, DataLoader(dataset, batch_size=8, shuffle=True))

    decision = guard.decision
    if decision is None:
        print("no decision: see the note above for why")
        return
    print(decision.table())
    print(f"\nwait fraction now: {guard.metrics['loadguard/wait_fraction']:.2f}")
    per_epoch = len(dataset)
    epochs = [sorted(module.seen[e * per_epoch : (e + 1) * per_epoch]) for e in range(args.epochs)]
    exact = all(seen == list(range(per_epoch)) for seen in epochs)
    print(f"every sample exactly once per epoch across the switches: {exact}")


if __name__ == "__main__":
    main()
