"""A short real fit with LoadGuard and a TensorBoardLogger: the logs the CLI and TensorBoard tests read."""

from __future__ import annotations

import warnings
from pathlib import Path

from lightning.pytorch import Trainer
from lightning.pytorch.loggers import TensorBoardLogger

from lightning_loadguard import LoadGuard
from lightning_loadguard.synthetic import TimedDataset, TimedModule, timed_loader

STEPS = 24
LOG_EVERY = 4


def fit_with_tensorboard(logdir: Path, name: str = "run") -> tuple[LoadGuard, dict[int, dict[str, float]]]:
    """Train ``STEPS`` steps on a producer-bound pipeline (one worker slower than the step), logging to ``logdir``.

    Returns the callback and the metrics handed to the logger, by step.
    """
    guard = LoadGuard(window=8, log_every_n_steps=LOG_EVERY, print_summary=False)
    loader = timed_loader(TimedDataset(STEPS * 4, sample_s=0.003), batch_size=4, num_workers=1)
    logger = TensorBoardLogger(save_dir=str(logdir), name=name)
    logged: dict[int, dict[str, float]] = {}
    write = logger.log_metrics

    def record(metrics: dict[str, float], step: int | None = None) -> None:
        logged[int(step or 0)] = dict(metrics)
        write(metrics, step)

    logger.log_metrics = record  # type: ignore[method-assign]
    trainer = Trainer(
        max_epochs=1,
        callbacks=[guard],
        logger=logger,
        log_every_n_steps=LOG_EVERY,
        enable_progress_bar=False,
        enable_model_summary=False,
        enable_checkpointing=False,
        accelerator="cpu",
        devices=1,
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer.fit(TimedModule(step_s=0.004, record=False), loader)
    logger.experiment.flush()
    return guard, logged
