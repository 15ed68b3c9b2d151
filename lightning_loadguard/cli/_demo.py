"""``loadguard demo``: a synthetic pipeline that loads each batch in the training process, in series with its
step, trained with LoadGuard."""

from __future__ import annotations

import logging
import warnings
from pathlib import Path
from typing import Any

from typing_extensions import override

from lightning_loadguard._lightning import pl
from lightning_loadguard.callback import LoadGuard
from lightning_loadguard.cli import CommandError
from lightning_loadguard.dashboard import METRICS
from lightning_loadguard.report import format_diagnosis, format_number, metric_unit, plain_text, render_table
from lightning_loadguard.synthetic import TimedDataset, TimedModule, timed_loader

"""Where ``loadguard demo`` writes its TensorBoard logs unless ``--logdir`` says otherwise."""

DEMO_LOAD_MS = 30.0
"""Time the demo's loader takes to make one batch (sleeping, like reading files)."""

DEMO_STEP_MS = 40.0
"""Time the demo's training step takes."""

_BATCH = 8
_WINDOW = 40
_LOG_EVERY = 10


class _Timeline(pl.Callback):
    """Keeps every window LoadGuard publishes, to show the run's first and last figures."""

    def __init__(self, guard: LoadGuard) -> None:
        self.guard = guard
        self.windows: list[dict[str, float]] = []
        self._last: dict[str, float] | None = None

    @override
    def on_train_batch_end(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        metrics = self.guard.metrics
        if metrics and metrics is not self._last:
            self._last = metrics
            self.windows.append(dict(metrics))


def _comparison(first: dict[str, float], last: dict[str, float]) -> str:
    names = [n for n in METRICS if n in first or n in last]
    rows = [[n, format_number(first.get(n)), format_number(last.get(n)), metric_unit(n)] for n in names]
    return render_table("First window vs last window", rows, ["metric", "first", "last", "unit"], numbers=True)


def run_demo(logdir: Path, *, auto_tune: bool, epochs: int, batches: int, progress: bool) -> None:
    """Train the demo pipeline with LoadGuard and print its summary, diagnosis and (with ``auto_tune``) the fix.

    Raises:
        CommandError: ``logdir`` exists and is not a directory.
    """
    if logdir.exists() and not logdir.is_dir():
        raise CommandError(f"--logdir {logdir} exists and is not a directory")
    # The demo's story is told by LoadGuard; Lightning's own hint about num_workers would pre-empt it.
    warnings.filterwarnings("ignore", message=r".*does not have many workers.*")
    warnings.filterwarnings("ignore", message=r".*`isinstance\(treespec, LeafSpec\)`.*")
    logging.getLogger("lightning.pytorch").setLevel(logging.WARNING)

    dataset = TimedDataset(batches * _BATCH, sample_s=DEMO_LOAD_MS / 1e3 / _BATCH)
    loader = timed_loader(dataset, batch_size=_BATCH, num_workers=0)
    module = TimedModule(step_s=DEMO_STEP_MS / 1e3, features=dataset.features, record=False)
    guard = LoadGuard(window=_WINDOW, log_every_n_steps=_LOG_EVERY, print_summary=False, auto_tune=auto_tune)
    timeline = _Timeline(guard)
    logger = pl.loggers.TensorBoardLogger(save_dir=str(logdir), name="demo")

    print(
        f"LoadGuard demo: each batch takes {DEMO_LOAD_MS:.0f} ms to load and each training step "
        f"{DEMO_STEP_MS:.0f} ms to compute.\nThe loader runs with num_workers=0 (PyTorch's default), so "
        f"every step also waits for its batch to be made. {epochs} epoch(s) x {batches} batches"
        f"{', auto-tuning on' if auto_tune else ''}.\n"
    )
    trainer = pl.Trainer(
        max_epochs=epochs,
        callbacks=[guard, timeline],
        logger=logger,
        log_every_n_steps=_LOG_EVERY,
        accelerator="cpu",
        devices=1,
        enable_checkpointing=False,
        enable_model_summary=False,
        enable_progress_bar=progress,
    )
    trainer.fit(module, loader)

    diagnosis = guard.diagnosis
    summary = guard.summary()
    if diagnosis is not None:
        # The summary ends with the diagnosis as text; the demo shows it as a table instead.
        summary = summary.removesuffix("\n\n" + plain_text(diagnosis.to_text()))
    print("\n" + summary)
    if diagnosis is not None:
        print("\n" + format_diagnosis(diagnosis))
    if auto_tune:
        if guard.decision is None:
            print("\nThe auto-tuner made no decision in this run (too few steps?).")
        else:
            print("\nAuto-tuner decision:\n" + guard.decision.table())
        if len(timeline.windows) >= 2:
            print("\n" + _comparison(timeline.windows[0], timeline.windows[-1]))
    logger.experiment.flush()
    print(
        f"\nTensorBoard logs: {Path(logger.log_dir).resolve()}\n"
        f"  see them:   tensorboard --logdir {logdir}   (Custom Scalars tab: LoadGuard)\n"
        f"  or:         loadguard report {logdir} --plot loadguard.png"
    )
    if not auto_tune:
        print("  the fix:    loadguard demo --auto-tune")
