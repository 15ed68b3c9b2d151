"""A read-ahead cursor loses samples on resume; the consumer's cursor does not.

Run: ``python examples/exact_resume.py`` (CPU, a few seconds).

Both runs train on 40 indexed samples (batch 4, shuffled, 2 workers with prefetch 2), stop after 5 batches
and resume. The naive run stores what the *sampler* handed out, which is what the workers read ahead; the
mixin stores what ``training_step`` finished.
"""

from __future__ import annotations

import logging
import tempfile
import warnings
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import torch
from torch.utils.data import DataLoader, Dataset, Sampler

from lightning_loadguard import ResumableLoaderMixin

N, BATCH, STOP_AFTER = 40, 4, 5
warnings.filterwarnings("ignore")
# Lightning's banner lines would bury the comparison.
logging.getLogger("lightning.pytorch").setLevel(logging.ERROR)


class Indexed(Dataset):
    def __len__(self) -> int:
        return N

    def __getitem__(self, i: int) -> tuple[int, torch.Tensor]:
        return i, torch.tensor([float(i)])


class ReadAheadSampler(Sampler[int]):
    """Counts the indices it handed out: the producer's cursor, ahead of the training step."""

    def __init__(self, seed: int) -> None:
        self.order = torch.randperm(N, generator=torch.Generator().manual_seed(seed)).tolist()
        self.handed_out = 0

    def __iter__(self):
        for i in self.order[self.handed_out :]:
            self.handed_out += 1
            yield i

    def __len__(self) -> int:
        return N


class NaiveData(pl.LightningDataModule):
    """Saves the sampler's cursor, as a hand-written resumable sampler typically does."""

    def __init__(self) -> None:
        super().__init__()
        self.sampler = ReadAheadSampler(seed=0)

    def train_dataloader(self) -> DataLoader:
        return DataLoader(Indexed(), batch_size=BATCH, sampler=self.sampler, num_workers=2, prefetch_factor=2)

    def state_dict(self) -> dict[str, Any]:
        return {"handed_out": self.sampler.handed_out}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.sampler.handed_out = state["handed_out"]


class MixinData(ResumableLoaderMixin, pl.LightningDataModule):
    loader_seed = 0

    def train_dataloader(self) -> DataLoader:
        return DataLoader(Indexed(), batch_size=BATCH, shuffle=True, num_workers=2, prefetch_factor=2)


class Recorder(pl.LightningModule):
    def __init__(self, stop_and_save: str | None = None) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(1, 1)
        self.seen: list[int] = []
        self.stop_and_save = stop_and_save

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        self.seen.extend(int(i) for i in batch[0])
        return self.layer(batch[1]).sum()

    def on_train_batch_end(self, outputs: Any, batch: Any, batch_idx: int) -> None:
        if self.stop_and_save and self.global_step == STOP_AFTER:
            self.trainer.save_checkpoint(self.stop_and_save)
            self.trainer.should_stop = True

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.01)


def fit(data: pl.LightningDataModule, ckpt_out: str | None = None, ckpt_in: str | None = None) -> list[int]:
    trainer = pl.Trainer(
        max_epochs=1,
        accelerator="cpu",
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    model = Recorder(stop_and_save=ckpt_out)
    trainer.fit(model, datamodule=data, ckpt_path=ckpt_in)
    return model.seen


def compare(name: str, make: type[pl.LightningDataModule], tmp: Path) -> None:
    ckpt = str(tmp / f"{name}.ckpt")
    before = fit(make(), ckpt_out=ckpt)
    after = fit(make(), ckpt_in=ckpt)
    seen = before + after
    lost = sorted(set(range(N)) - set(seen))
    repeated = sorted({i for i in seen if seen.count(i) > 1})
    print(f"{name:>6}: {len(before)} samples before the stop, {len(after)} after the resume")
    print(f"        lost: {lost if lost else 'none'}")
    print(f"        seen twice: {repeated if repeated else 'none'}")


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        print(f"{N} samples, batch {BATCH}, 2 workers x prefetch 2, stop after {STOP_AFTER} batches, resume\n")
        compare("naive", NaiveData, Path(tmp))
        compare("mixin", MixinData, Path(tmp))


if __name__ == "__main__":
    main()
