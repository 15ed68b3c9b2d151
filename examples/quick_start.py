"""Quick start: add ``LoadGuard()`` to a Trainer and read what limits training.

Run: ``python examples/quick_start.py`` (CPU, about 15 s), then ``tensorboard --logdir quick_start_logs``
or ``loadguard report quick_start_logs``.

The dataset below stands in for one whose samples are slow to read (files on a network disk): 2 ms a
sample, 64 ms a batch, on one worker, for a step of about 20 ms.
"""

from __future__ import annotations

import argparse
import time

import torch
from lightning.pytorch import LightningModule, Trainer
from lightning.pytorch.loggers import TensorBoardLogger
from torch.utils.data import DataLoader, Dataset

from lightning_loadguard import LoadGuard


class SlowReads(Dataset):
    """Samples that take ``read_s`` each to load, like files on a slow disk."""

    def __init__(self, length: int, read_s: float = 0.002) -> None:
        self.length = length
        self.read_s = read_s

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        time.sleep(self.read_s)
        x = torch.randn(32, generator=torch.Generator().manual_seed(index))
        return x, x.sum(dim=0, keepdim=True)


class Regressor(LightningModule):
    def __init__(self, step_s: float = 0.02) -> None:
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1))
        self.step_s = step_s

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
        x, y = batch
        loss = torch.nn.functional.mse_loss(self.net(x), y)
        time.sleep(self.step_s)  # stands in for a larger model's compute
        self.log("loss", loss)
        return loss

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.Adam(self.parameters(), lr=1e-3)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", type=int, default=120, help="batches per epoch")
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--logdir", default="quick_start_logs")
    args = parser.parse_args()

    loader = DataLoader(SlowReads(args.batches * 32), batch_size=32, shuffle=True, num_workers=1)
    guard = LoadGuard(window=40)  # the only change a training script needs
    trainer = Trainer(
        max_epochs=args.epochs,
        callbacks=[guard],
        logger=TensorBoardLogger(args.logdir, name="quick_start"),
        log_every_n_steps=10,
        accelerator="cpu",
        devices=1,
        enable_checkpointing=False,
        enable_model_summary=False,
    )
    trainer.fit(Regressor(), loader)  # LoadGuard prints its summary and diagnosis at the end of fit

    # The same figures and verdict, in code:
    print(f"wait fraction: {guard.metrics['loadguard/wait_fraction']:.2f}")
    if guard.diagnosis is not None:
        finding = guard.diagnosis.findings[0]
        print(f"verdict: {guard.diagnosis.verdict}\nfix: {finding.fix}")


if __name__ == "__main__":
    main()
