"""docs/troubleshooting.md's promises, each checked in a real fit against what the test itself counts."""

from __future__ import annotations

import csv
import warnings
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from lightning.pytorch.loggers import CSVLogger, TensorBoardLogger
from pipelines import MadeByWorkers, quiet_trainer
from torch.utils.data import DataLoader

from lightning_loadguard import LoadGuard
from lightning_loadguard._lightning import pl
from lightning_loadguard.synthetic import TimedDataset, TimedModule, timed_loader
from lightning_loadguard.tuning.planner import Planner
from lightning_loadguard.tuning.session import TuneOptions


def _fit(guard: LoadGuard | None, module: TimedModule, loader: Any, **trainer_kwargs: Any) -> Any:
    trainer_kwargs.setdefault("max_epochs", 1)
    trainer = quiet_trainer(callbacks=[guard] if guard is not None else [], **trainer_kwargs)
    trainer.fit(module, loader)
    return trainer


# -- "a DataLoader class Python will not let it extend" -----------------------------------------------------------


class _RegisteredLoader(DataLoader):
    """A loader class whose subclasses must name their registry key: Python refuses a subclass without one."""

    def __init_subclass__(cls, *, registry_key: str, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)


def test_a_loader_class_python_will_not_extend_is_measured_from_the_consumer_with_pythons_reason() -> None:
    # Python's own reason, from Python: the subclass LoadGuard would need, made here without LoadGuard.
    with pytest.raises(TypeError) as refused:
        type("Probed", (_RegisteredLoader,), {})
    reason = str(refused.value)
    assert "registry_key" in reason

    def seen(guard: LoadGuard | None) -> list[int]:
        pl.seed_everything(5, verbose=False)
        module = TimedModule()
        _fit(guard, module, _RegisteredLoader(TimedDataset(48), batch_size=4, shuffle=True))
        return module.seen

    plain = seen(None)
    guard = LoadGuard(window=4, log_every_n_steps=4, print_summary=False)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        guarded = seen(guard)
    ours = [str(w.message) for w in caught if "LoadGuard" in str(w.message)]
    assert len(ours) == 1, ours
    assert f"its class _RegisteredLoader cannot be extended ({reason})" in ours[0]
    assert "producer capacity, readiness and epoch start-up are not measured" in ours[0]
    # Training is unaffected: the same samples in the same (shuffled) order, all of them.
    assert len(plain) == 48 and guarded == plain
    # The consumer side is still measured; the producer side is not.
    assert "loadguard/wait_fraction" in guard.metrics and "loadguard/step_ms" in guard.metrics
    assert "loadguard/producer_rate" not in guard.metrics


# -- "a run shorter than one window may end without a logged point" -----------------------------------------------


class _LogsItsLoss(TimedModule):
    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        loss = super().training_step(batch, batch_idx)
        self.log("loss", loss)
        return loss


def test_a_run_shorter_than_one_window_logs_no_point_yet_keeps_its_figures_and_summary(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    step_s = 0.005
    guard = LoadGuard(window=50)
    module = _LogsItsLoss(step_s=step_s)
    trainer = _fit(
        guard,
        module,
        timed_loader(TimedDataset(80), batch_size=4),  # 20 steps
        logger=CSVLogger(str(tmp_path), name="run"),
        log_every_n_steps=1,
    )
    printed = capsys.readouterr().out
    with open(Path(trainer.logger.log_dir) / "metrics.csv", newline="") as file:
        rows = list(csv.DictReader(file))
    # The logger did log: every step's loss, 20 of them, and nothing of LoadGuard's.
    assert len(rows) == 20 and all(row["loss"] for row in rows)
    assert "loss" in rows[0] and not [name for name in rows[0] if name.startswith("loadguard/")], list(rows[0])
    # guard.metrics holds the figures of the steps the run had: each step took at least the module's own step_s.
    assert guard.snapshot is not None and guard.snapshot.steps == 20
    assert guard.metrics["loadguard/wait_fraction"] >= 0
    assert guard.metrics["loadguard/step_ms"] >= step_s * 1e3
    # The end-of-fit summary is printed, with the same figures.
    throughput = guard.metrics["loadguard/throughput"]
    assert f"{throughput:.1f} steps/s" in printed, printed


# -- "on global rank 0, at the start of training" ------------------------------------------------------------------


def test_the_custom_scalars_layout_is_written_once_before_the_first_batch_and_only_on_global_rank_0(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from torch.utils.tensorboard import SummaryWriter

    events: list[str] = []
    write = SummaryWriter.add_custom_scalars

    def recorded(self: Any, layout: Any) -> None:
        events.append("layout")
        write(self, layout)

    monkeypatch.setattr(SummaryWriter, "add_custom_scalars", recorded)

    class Batches(TimedModule):
        def on_train_batch_start(self, batch: Any, batch_idx: int) -> None:
            events.append("batch")

    logger = TensorBoardLogger(str(tmp_path), name="run")
    assert isinstance(logger.experiment, SummaryWriter)  # the writer the count is taken on
    _fit(LoadGuard(window=4, print_summary=False), Batches(), timed_loader(TimedDataset(32), 4), logger=logger)
    assert events.count("layout") == 1 and events.count("batch") == 8, events
    assert events.index("layout") < events.index("batch")
    # The rank is the trainer's global one: another rank's trainer writes nothing through the same logger.
    events.clear()
    guard = LoadGuard(print_summary=False)
    guard._add_dashboard(SimpleNamespace(global_rank=1, loggers=[logger]))
    assert events == []
    guard._add_dashboard(SimpleNamespace(global_rank=0, loggers=[logger]))
    assert events == ["layout"]


# -- "nothing new is stored as a decision: the run resumes untuned" -----------------------------------------------


class _MadeByRecorder(pl.Callback):
    """The ``num_workers`` each trained batch was made under, read from the batch."""

    def __init__(self) -> None:
        self.made_by: list[set[float]] = []

    def on_train_batch_start(self, trainer: Any, pl_module: Any, batch: Any, batch_idx: int) -> None:
        self.made_by.append(set(batch[1][:, 0].tolist()))


_OPTIONS = TuneOptions(warmup_steps=2, window_steps=6, tune_persistent_workers=False)


class _StopAt(pl.Callback):
    """Saves a checkpoint at the end of step ``step`` and stops the fit there."""

    def __init__(self, step: int, path: Path) -> None:
        self.step, self.path = step, path

    def on_train_batch_end(self, trainer: Any, *args: Any) -> None:
        if trainer.global_step == self.step:
            trainer.save_checkpoint(self.path)
            trainer.should_stop = True


def _fit_made_by(
    guard: LoadGuard, length: int, epochs: int, root: Path, ckpt_path: Path | None = None, stop: _StopAt | None = None
) -> tuple[Any, _MadeByRecorder]:
    """A fit on batches of 8 ms for a 4 ms step, with the user's one worker (shuffled, always the same order)."""
    pl.seed_everything(11, verbose=False)
    loader = timed_loader(MadeByWorkers(length, sample_s=0.002), batch_size=4, num_workers=1, shuffle=True)
    recorder = _MadeByRecorder()
    callbacks = [guard, recorder] + ([stop] if stop is not None else [])
    trainer = quiet_trainer(max_epochs=epochs, callbacks=callbacks, default_root_dir=root)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer.fit(TimedModule(step_s=0.004), loader, ckpt_path=None if ckpt_path is None else str(ckpt_path))
    return trainer, recorder


def _stopped_tuning(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Planning after the first candidate's window fails, once: a probe has run, no decision is made yet."""
    original = Planner.record
    calls: list[int] = []

    def failing(self: Planner, *args: Any, **kwargs: Any) -> Any:
        calls.append(1)
        if len(calls) == 2:
            raise RuntimeError("broken")
        return original(self, *args, **kwargs)

    monkeypatch.setattr(Planner, "record", failing)
    return calls


def _stored_decision(path: Path) -> Any:
    stored = torch.load(path, weights_only=False)["callbacks"]
    (state,) = [value for key, value in stored.items() if key.startswith("LoadGuard")]
    return state["tuner"]["decision"]


def test_after_the_tuners_own_step_fails_no_decision_is_stored_and_a_resume_from_a_later_epoch_runs_untuned(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls = _stopped_tuning(monkeypatch)
    broken = LoadGuard(print_summary=False, auto_tune=_OPTIONS)
    trainer, first = _fit_made_by(broken, 320, epochs=1, root=tmp_path)
    monkeypatch.undo()
    assert len(calls) == 2 and "auto-tuning stopped: planning the next probe failed" in broken.summary()
    # It did probe before it failed: batches made under another num_workers than the user's 1.
    assert any(made != {1.0} for made in first.made_by), first.made_by
    path = tmp_path / "stopped.ckpt"
    trainer.save_checkpoint(path)
    assert _stored_decision(path) is None

    resumed = LoadGuard(print_summary=False, auto_tune=_OPTIONS)
    trainer, second = _fit_made_by(resumed, 320, epochs=2, root=tmp_path, ckpt_path=path)
    assert trainer.current_epoch == 2 and len(second.made_by) == 80  # epoch 1 ran, in full
    # Untuned: every batch of the resumed epoch made by the user's one worker, and no decision.
    assert all(made == {1.0} for made in second.made_by), second.made_by
    assert resumed.decision is None and trainer.train_dataloader.num_workers == 1


def test_after_the_tuners_own_step_fails_a_resume_within_epoch_0_tunes_afresh(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # troubleshooting.md: no decision is stored, and a run resumed within epoch 0 is a run that has not tuned yet.
    calls = _stopped_tuning(monkeypatch)
    path = tmp_path / "stopped.ckpt"
    broken = LoadGuard(print_summary=False, auto_tune=_OPTIONS)
    _, first = _fit_made_by(broken, 640, epochs=1, root=tmp_path, stop=_StopAt(40, path))
    monkeypatch.undo()
    assert len(calls) == 2 and broken.decision is None and len(first.made_by) == 40
    assert _stored_decision(path) is None

    resumed = LoadGuard(print_summary=False, auto_tune=_OPTIONS)
    _, second = _fit_made_by(resumed, 640, epochs=1, root=tmp_path, ckpt_path=path)
    assert len(second.made_by) == 160 - 40  # the rest of epoch 0
    # Probed again: batches of the resumed rest of epoch 0 made under other num_workers than the user's.
    assert any(made != {1.0} for made in second.made_by), second.made_by
    assert resumed.decision is not None
