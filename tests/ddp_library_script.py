"""Run by test_loader_libraries.py: a 2-rank CPU DDP fit of one data library's pipeline under LoadGuard with
auto-tuning, split between the ranks as the library documents it; each rank writes what it trained on, what
LoadGuard gathered and what the tuner decided.

    python ddp_library_script.py LIBRARY ROOT OUT   (ROOT: where the test wrote the library's files)
"""

from __future__ import annotations

import json
import sys
import warnings
from pathlib import Path
from typing import Any

import torch
from loader_libraries import FEATURES, build_loader
from pipelines import ClockedModule, quiet_trainer

from lightning_loadguard import LoadGuard, TuneOptions
from lightning_loadguard._lightning import pl

SAMPLES, BATCH, EPOCHS = 480, 4, 2


class EpochRecorder(ClockedModule):
    """Records, epoch by epoch, the sample indices this rank trained on."""

    def __init__(self) -> None:
        super().__init__(step_s=0.004, features=FEATURES)
        self.by_epoch: list[list[int]] = []

    def on_train_epoch_start(self) -> None:
        super().on_train_epoch_start()
        self.by_epoch.append([])

    def training_step(self, batch: Any, batch_idx: int) -> Any:
        self.by_epoch[-1].extend(int(i) for i in batch[0])
        return super().training_step(batch, batch_idx)


class LibraryData(pl.LightningDataModule):
    def __init__(self, library: str, root: Path) -> None:
        super().__init__()
        self.library, self.root = library, root

    def train_dataloader(self) -> Any:
        trainer = self.trainer
        assert trainer is not None
        return build_loader(
            self.library,
            self.root,
            n=SAMPLES,
            batch_size=BATCH,
            num_workers=2,
            sample_s=0.002,
            rank=(trainer.global_rank, trainer.world_size),
        )


def main(library: str, root: str, out: str) -> None:
    warnings.simplefilter("ignore")
    pl.seed_everything(3, verbose=False)
    guard = LoadGuard(
        window=10,
        print_summary=False,
        auto_tune=TuneOptions(warmup_steps=2, window_steps=6, tune_persistent_workers=False),
    )
    module = EpochRecorder()
    trainer = quiet_trainer(strategy="ddp", devices=2, max_epochs=EPOCHS, callbacks=[guard])
    trainer.fit(module, datamodule=LibraryData(library, Path(root)))
    snapshot, decision = guard.snapshot, guard.decision
    result = {
        "by_epoch": module.by_epoch,
        "rank_wait_fractions": list(snapshot.rank_wait_fractions) if snapshot is not None else None,
        "worst_rank": guard.metrics.get("loadguard/worst_rank"),
        "verdict": guard.diagnosis.verdict if guard.diagnosis is not None else None,
        "decision": None if decision is None else {"verdict": decision.verdict, "reason": decision.reason},
        "num_workers": trainer.train_dataloader.num_workers,
        "said": list(guard._said),
    }
    Path(f"{out}.rank{trainer.global_rank}").write_text(json.dumps(result))


if __name__ == "__main__":
    main(*sys.argv[1:4])
    # An initialized gloo group left to the interpreter's exit can abort the process after training finished.
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()
