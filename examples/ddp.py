"""LoadGuard under DDP: two CPU processes, one of them with a slower loader.

Run: ``python examples/ddp.py`` (CPU, gloo, about 20 s).

Each rank meters its own loader. Rank 1's samples cost six times rank 0's (a slower disk, a busier
host): through the gradient all-reduce every rank then runs at rank 1's pace. LoadGuard logs the worst
rank's wait, names it (``loadguard/worst_rank``), and sums the in-flight batch memory of the ranks that
share a host.
"""

from __future__ import annotations

import argparse
import os
import time
import warnings

import torch
from lightning.pytorch import LightningModule, Trainer
from torch.utils.data import DataLoader, Dataset

from lightning_loadguard import LoadGuard


class RankDependentReads(Dataset):
    """Samples that take ``read_s`` to load on rank 0 and ``slow_factor`` times that on the other ranks."""

    def __init__(self, length: int, read_s: float, slow_factor: float) -> None:
        self.length = length
        self.read_s = read_s
        self.slow_factor = slow_factor

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        # Loader workers have no process group; the launcher's LOCAL_RANK is in their environment.
        rank = int(os.environ.get("LOCAL_RANK", "0"))
        time.sleep(self.read_s * (self.slow_factor if rank > 0 else 1.0))
        x = torch.randn(16, generator=torch.Generator().manual_seed(index))
        return x, x.mean(dim=0, keepdim=True)


class Regressor(LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(16, 1)

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
        x, y = batch
        time.sleep(0.01)  # stands in for the compute
        return torch.nn.functional.mse_loss(self.layer(x), y)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.01)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", type=int, default=60, help="batches per rank and epoch")
    parser.add_argument("--epochs", type=int, default=2)
    args = parser.parse_args()
    warnings.filterwarnings("ignore", message=r".*does not have many workers.*")
    torch.set_num_threads(1)

    batch = 8
    dataset = RankDependentReads(2 * args.batches * batch, read_s=0.001, slow_factor=6.0)
    loader = DataLoader(dataset, batch_size=batch, num_workers=1)
    guard = LoadGuard(window=30)
    trainer = Trainer(
        strategy="ddp",
        accelerator="cpu",
        devices=2,
        max_epochs=args.epochs,
        callbacks=[guard],
        logger=False,
        log_every_n_steps=10,
        enable_checkpointing=False,
        enable_model_summary=False,
        enable_progress_bar=False,
    )
    trainer.fit(Regressor(), loader)
    if trainer.global_rank == 0:
        m = guard.metrics
        print(
            f"rank 0 of {trainer.world_size}: worst wait fraction {m['loadguard/wait_fraction']:.2f} on rank "
            f"{int(m.get('loadguard/worst_rank', 0))}; rank wait fractions "
            f"{[round(f, 2) for f in guard.snapshot.rank_wait_fractions] if guard.snapshot else '?'}"
        )
        if guard.diagnosis is not None:
            print(f"verdict: {guard.diagnosis.verdict}")


if __name__ == "__main__":
    main()
    # An initialized gloo group left to the interpreter's exit can abort the process (SIGABRT,
    # "terminate called without an active exception") after training has finished.
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()
