"""Run by test_tuning_ddp.py: a 2-rank CPU DDP fit with auto-tuning; each rank writes what it saw and decided."""

from __future__ import annotations

import json
import sys
import warnings

import torch
from pipelines import quiet_trainer

from lightning_loadguard._lightning import pl
from lightning_loadguard.callback import LoadGuard
from lightning_loadguard.synthetic import TimedDataset, TimedModule, timed_loader
from lightning_loadguard.tuning.session import TuneOptions


def main(out: str) -> None:
    warnings.simplefilter("ignore")
    pl.seed_everything(11, verbose=False)
    loader = timed_loader(TimedDataset(480, sample_s=0.003), batch_size=4, num_workers=1, shuffle=True)
    guard = LoadGuard(
        print_summary=False, auto_tune=TuneOptions(warmup_steps=2, window_steps=6, tune_persistent_workers=False)
    )
    module = TimedModule(step_s=0.004)
    trainer = quiet_trainer(max_epochs=2, callbacks=[guard], devices=2, strategy="ddp")
    trainer.fit(module, loader)
    decision = guard.decision.to_dict() if guard.decision else None
    with open(f"{out}.rank{trainer.global_rank}", "w") as f:
        json.dump({"seen": module.seen, "decision": decision, "workers": trainer.train_dataloader.num_workers}, f)


if __name__ == "__main__":
    main(sys.argv[1])
    # An initialized gloo group left to the interpreter's exit can abort the process (SIGABRT,
    # "terminate called without an active exception") after training has finished.
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()
