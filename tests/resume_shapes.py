"""Chains of fits over every DataModule shape and every way a fit can end, each resumed from a checkpoint.

A chain is a list of segments; each segment is one fit of a new Trainer, model and datamodule that resumes from
the checkpoint the previous segment left. A segment ends by

- ``kill``: the run dies after global step ``at`` (an exception raised in the module's ``on_train_batch_end``,
  after the checkpoint it names was written: ``save``, the module's ``trainer.save_checkpoint``, or ``step``,
  Lightning's own ``ModelCheckpoint(every_n_train_steps=1)``);
- ``max_steps``: the fit stops at ``max_steps=at`` (``max_epochs=-1``); the next segment resumes from
  ``trainer.save_checkpoint()`` after fit (``after_fit``), from the step checkpoint (``step``), or from Lightning's
  epoch-end ``ModelCheckpoint()`` checkpoint (``epoch_end``), which describes the truncated epoch;
- ``max_epochs``: the fit stops at ``max_epochs=at``; resumed from ``after_fit`` or ``epoch_end``.

The last segment runs to the chain's end (``max_steps`` or ``max_epochs``). The indices every training step saw,
over all segments, must be the uninterrupted run's; a segment may instead refuse to start with a clear error
(before its first training step), and what was trained before it must then be a prefix of the uninterrupted run.
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from resume_harness import Recorder, make_datamodule

from lightning_loadguard import NonReproducibleOrderError
from lightning_loadguard.position import PositionMismatchError

REFUSALS = (PositionMismatchError, NonReproducibleOrderError, ValueError)


class Killed(RuntimeError):
    """Stands for SIGKILL inside one process: the fit ends right here, nothing after it runs."""


class ChainModel(Recorder):
    """Records the indices of every training step; dies after global step ``kill_at`` when told."""

    def __init__(self, case: dict[str, Any], kill_at: int | None, save_to: str | None) -> None:
        super().__init__(case)
        self.kill_at = kill_at
        self.save_to = save_to

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        pass

    def on_train_batch_end(self, outputs: Any, batch: Any, batch_idx: int) -> None:
        if self.kill_at is not None and self.global_step == self.kill_at:
            if self.save_to is not None:
                self.trainer.save_checkpoint(self.save_to)
            raise Killed


def quiet_trainer(callbacks: list[pl.Callback] | None = None, **limits: Any) -> pl.Trainer:
    """A CPU Trainer without logger, progress bar or sanity check; checkpointing only with ``callbacks``."""
    return pl.Trainer(
        accelerator="cpu",
        logger=False,
        enable_checkpointing=bool(callbacks),
        callbacks=callbacks or [],
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
        **limits,
    )


def _limits(segment: dict[str, Any]) -> dict[str, int]:
    if segment["end"] == "max_epochs":
        return {"max_epochs": segment["at"], "max_steps": -1}
    return {"max_epochs": -1, "max_steps": segment["at"]}


def fit_segment(
    case: dict[str, Any], segment: dict[str, Any], final: dict[str, Any], ckpt_in: str | None, tmp: Path
) -> tuple[list[int], str | None, BaseException | None]:
    """One fit: the indices it trained, the checkpoint the next segment resumes from, and a refusal if any."""
    kill = segment["end"] == "kill"
    source = segment.get("ckpt")
    steps = ModelCheckpoint(dirpath=str(tmp / "steps"), filename="{step}", every_n_train_steps=1, save_top_k=-1)
    epochs = ModelCheckpoint(dirpath=str(tmp / "epochs"), filename="{epoch}-{step}", save_top_k=-1)
    callbacks = [steps, epochs] if case.get("lightning_checkpoints") or source in ("step", "epoch_end") else []
    trainer = quiet_trainer(callbacks=callbacks, **_limits(final if kill or segment is final else segment))
    save_to = str(tmp / "killed.ckpt") if kill and source == "save" else None
    model = ChainModel(case, segment["at"] if kill else None, save_to)
    refused: BaseException | None = None
    killed = False
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            trainer.fit(model, datamodule=make_datamodule(case), ckpt_path=ckpt_in)
        except Killed:
            killed = True
        except REFUSALS as err:
            refused = err
    if refused is not None or segment is final or (kill and not killed):
        # A kill that never came: the fit ended first, and the chain ends with it.
        return model.seen, None, refused
    if source == "save":
        out: str | None = save_to
    elif source == "after_fit":
        out = str(tmp / "after_fit.ckpt")
        trainer.save_checkpoint(out)
    else:
        out = (steps if source == "step" else epochs).best_model_path or None
    return model.seen, out, None


def reference(case: dict[str, Any], final: dict[str, Any]) -> list[int]:
    trainer = quiet_trainer(**_limits(final))
    model = ChainModel(case, None, None)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer.fit(model, datamodule=make_datamodule(case))
    return model.seen


def run_chain(case: dict[str, Any], segments: list[dict[str, Any]], tmp: Path) -> dict[str, Any]:
    """Every segment in turn. Returns the reference, what the chain trained, where it was refused and why."""
    torch.manual_seed(0)
    full = reference(case, segments[-1])
    seen: list[int] = []
    ckpt: str | None = None
    for i, segment in enumerate(segments):
        got, ckpt_out, refused = fit_segment(case, segment, segments[-1], ckpt, tmp / f"seg{i}")
        if refused is not None:
            return {"reference": full, "seen": seen, "refused_at": i, "refused": refused, "trained_in_refused": got}
        seen += got
        if i < len(segments) - 1 and ckpt_out is None:
            if segment["end"] == "kill":
                return {"reference": full, "seen": seen}
            return {"reference": full, "seen": seen, "no_checkpoint_at": i}
        ckpt = ckpt_out
    return {"reference": full, "seen": seen}
