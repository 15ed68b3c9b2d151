"""Run by test_tuning_ddp.py: a 2-rank CPU DDP fit with auto-tuning; each rank writes what it saw and decided.

An optional second argument makes LoadGuard's own work fail on rank 1 only: the tuner's at its second window,
``window`` (measuring it, before the ranks' gather) or ``record`` (planning, between the gather and the
broadcast); or ``summarise``, the reduction of the ranks' logged figures at its second logging step.
``rank_figures`` makes rank 1 read its host's free RAM and ``/dev/shm`` as 1 byte each, where rank 0 reads its
own, and each rank records what its planner planned from. ``retune``
instead runs test_retune_fit.py's phased data, heavy from the first epoch after the decision, for
:data:`RETUNE_EPOCHS` epochs: the tuner probes again.
"""

from __future__ import annotations

import json
import os
import sys
import warnings
from dataclasses import replace
from typing import Any

import torch
from pipelines import quiet_trainer
from torch.utils.data import DataLoader

from lightning_loadguard._lightning import pl
from lightning_loadguard.callback import LoadGuard
from lightning_loadguard.synthetic import TimedDataset, TimedModule, timed_loader
from lightning_loadguard.tuning.session import TuneOptions

RETUNE_EPOCHS = 8
"""A rank's epoch is 60 steps; at ``RETUNE_PROBE_SHARE`` a first tuning spans up to two of them, as a re-tune does
after the heavy phase's three changed windows: the first decision by the end of epoch 1, the heavy phase from epoch
2 at the latest, a re-tune decided by epoch 5 with time to spare on a busy machine. (At 0.2, test_retune_fit.py's
share, a tuning may span four epochs, a re-tune as many: five epochs left the heavy phase too few for both.)"""
RETUNE_PROBE_SHARE = 0.4


def _fail_on_rank_1(fault: str) -> None:
    if os.environ.get("LOCAL_RANK", "0") != "1":
        return
    from lightning_loadguard import callback
    from lightning_loadguard.meters.monitor import LoaderMonitor
    from lightning_loadguard.tuning.planner import Planner

    owner, name = {
        "window": (LoaderMonitor, "snapshot"),
        "record": (Planner, "record"),
        "summarise": (callback, "summarise"),
    }[fault]
    original = getattr(owner, name)
    calls = []

    def failing(*args: Any, **kwargs: Any) -> Any:
        if fault != "window" or kwargs.get("since") is not None:  # the tuner's windows, not the callback's
            calls.append(1)
            if len(calls) == 2:
                raise RuntimeError(f"{fault} fails on rank 1")
        return original(*args, **kwargs)

    setattr(owner, name, failing)


PLANNED: list[list[Any]] = []
"""Each window a planner recorded: its free RAM as read, what starting its workers cost and the probe's span."""


def _record_plans_and_empty_rank_1s_memory() -> None:
    from lightning_loadguard.meters.monitor import LoaderMonitor
    from lightning_loadguard.tuning.planner import Planner

    record = Planner.record

    def recorded(self: Planner, window: Any, *args: Any, **kwargs: Any) -> Any:
        PLANNED.append([window.host.available_ram_bytes, kwargs.get("startup_s"), kwargs.get("span_s")])
        return record(self, window, *args, **kwargs)

    Planner.record = recorded  # type: ignore[method-assign]
    if os.environ.get("LOCAL_RANK", "0") != "1":
        return

    snapshot = LoaderMonitor.snapshot

    def full_host(self: LoaderMonitor, *args: Any, **kwargs: Any) -> Any:
        window = snapshot(self, *args, **kwargs)
        return replace(window, host=replace(window.host, available_ram_bytes=1, shm_free_bytes=1))

    LoaderMonitor.snapshot = full_host  # type: ignore[method-assign]


def main(out: str, fault: str | None = None) -> None:
    warnings.simplefilter("ignore")
    pl.seed_everything(11, verbose=False)
    if fault == "retune":
        from test_retune_fit import BATCH, OPTIONS, STEP_S, HeavyFrom, PhasedDataset

        dataset = PhasedDataset()
        loader = DataLoader(dataset, batch_size=BATCH, shuffle=True, num_workers=1)
        options = replace(OPTIONS, probe_share=RETUNE_PROBE_SHARE)
        guard = LoadGuard(print_summary=False, auto_tune=options, log_every_n_steps=10)
        module = TimedModule(step_s=STEP_S)
        heavy = HeavyFrom(dataset, 1, guard, after_decision=True)
        trainer = quiet_trainer(max_epochs=RETUNE_EPOCHS, callbacks=[guard, heavy], devices=2, strategy="ddp")
    else:
        if fault == "rank_figures":
            _record_plans_and_empty_rank_1s_memory()
        elif fault is not None:
            from lightning_loadguard import LoadGuardWarning

            warnings.simplefilter("always", LoadGuardWarning)  # what the user is told is part of the check
            _fail_on_rank_1(fault)
        loader = timed_loader(TimedDataset(480, sample_s=0.003), batch_size=4, num_workers=1, shuffle=True)
        guard = LoadGuard(
            print_summary=False, auto_tune=TuneOptions(warmup_steps=2, window_steps=6, tune_persistent_workers=False)
        )
        module = TimedModule(step_s=0.004)
        trainer = quiet_trainer(max_epochs=2, callbacks=[guard], devices=2, strategy="ddp")
    calls = _count_gathers(guard, trainer)
    trainer.fit(module, loader)
    decision = guard.decision.to_dict() if guard.decision else None
    with open(f"{out}.rank{trainer.global_rank}", "w") as f:
        workers = trainer.train_dataloader.num_workers
        record = {"seen": module.seen, "decision": decision, "workers": workers, "calls": calls, "planned": PLANNED}
        json.dump(record, f)


def _count_gathers(guard: LoadGuard, trainer: Any) -> dict[str, int]:
    """Counts of the strategy's all_gathers, LoadGuard's logging steps and the tuner's windows on this rank."""
    calls = {"all_gather": 0, "logging_steps": 0, "windows": 0}
    assert guard._tuner is not None
    for owner, name, key in (
        (trainer.strategy, "all_gather", "all_gather"),
        (guard, "_publish", "logging_steps"),
        (guard._tuner._session, "_gathered_window", "windows"),
    ):
        original = getattr(owner, name)

        def counted(*args: Any, _original: Any = original, _key: str = key, **kwargs: Any) -> Any:
            calls[_key] += 1
            return _original(*args, **kwargs)

        setattr(owner, name, counted)
    return calls


if __name__ == "__main__":
    main(*sys.argv[1:3])
    # An initialized gloo group left to the interpreter's exit can abort the process (SIGABRT,
    # "terminate called without an active exception") after training has finished.
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()
