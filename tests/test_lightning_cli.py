"""LoadGuard configured like any callback through ``LightningCLI``: from YAML and from the command line."""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import pytest
from lightning.pytorch.cli import LightningCLI
from torch.utils.data import DataLoader

from lightning_loadguard import LoadGuard
from lightning_loadguard.synthetic import TimedDataset, TimedModule, timed_loader

_TRAINER_ARGS = [
    "--trainer.max_epochs=1",
    "--trainer.accelerator=cpu",
    "--trainer.devices=1",
    "--trainer.logger=false",
    "--trainer.enable_checkpointing=false",
    "--trainer.enable_progress_bar=false",
    "--trainer.enable_model_summary=false",
]


class TinyModel(TimedModule):
    """A timed module that brings its own small train loader."""

    def train_dataloader(self) -> DataLoader:
        return timed_loader(TimedDataset(32, sample_s=0.0005, features=self.layer.in_features), batch_size=4)


def _run(args: list[str]) -> LightningCLI:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return LightningCLI(TinyModel, args=args, save_config_kwargs={"overwrite": True})


def _guards(cli: LightningCLI) -> list[Any]:
    return [cb for cb in cli.trainer.callbacks if isinstance(cb, LoadGuard)]


def _fit_from_yaml(tmp_path: Path, init_args: str) -> Any:
    """The LoadGuard a fit configured by YAML gets, with ``init_args`` (YAML lines at its indentation)."""
    config = tmp_path / "config.yaml"
    config.write_text(
        "trainer:\n  callbacks:\n    - class_path: lightning_loadguard.LoadGuard\n      init_args:\n" + init_args
    )
    cli = _run(["fit", f"--config={config}", *_TRAINER_ARGS, f"--trainer.default_root_dir={tmp_path}"])
    (guard,) = _guards(cli)
    return guard


def test_loadguard_from_yaml(tmp_path: Path) -> None:
    guard = _fit_from_yaml(tmp_path, "        window: 6\n        log_every_n_steps: 2\n        print_summary: false\n")
    assert (guard.window, guard.log_every_n_steps, guard.print_summary) == (6, 2, False)
    assert guard.metrics["loadguard/step_ms"] > 0
    assert guard.diagnosis is not None


def test_auto_tune_true_in_the_yaml_turns_the_tuner_on_for_the_fit(tmp_path: Path) -> None:
    # troubleshooting.md's YAML, as printed there: `auto_tune: true` reaches LoadGuard as True and its tuner
    # looks at the fit's loader. Its 8-step epochs are too short to probe, and only a tuner says so.
    guard = _fit_from_yaml(tmp_path, "        window: 50\n        auto_tune: true\n")
    assert guard.window == 50 and guard.auto_tune is True
    assert "auto-tuning is off: epochs have 8 steps" in guard.summary()
    # Without it, no tuner and nothing said about tuning.
    plain = _run(["fit", *_TRAINER_ARGS, f"--trainer.default_root_dir={tmp_path}", "--trainer.callbacks+=LoadGuard"])
    (untuned,) = _guards(plain)
    assert untuned.auto_tune is False and "auto-tuning" not in untuned.summary()


def test_loadguard_from_the_command_line(tmp_path: Path) -> None:
    cli = _run(
        [
            "fit",
            *_TRAINER_ARGS,
            f"--trainer.default_root_dir={tmp_path}",
            "--trainer.callbacks+=LoadGuard",
            "--trainer.callbacks.window=5",
            "--trainer.callbacks.print_summary=false",
        ]
    )
    (guard,) = _guards(cli)
    assert (guard.window, guard.log_every_n_steps) == (5, None)
    assert guard.metrics["loadguard/wait_fraction"] >= 0


def test_bad_values_are_refused_by_the_parser(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        _run(["fit", *_TRAINER_ARGS, "--trainer.callbacks+=LoadGuard", "--trainer.callbacks.window=many"])
    assert "window" in capsys.readouterr().err


def test_loadguard_in_the_printed_config(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        _run(["fit", *_TRAINER_ARGS, "--trainer.callbacks+=LoadGuard", "--print_config"])
    out = capsys.readouterr().out
    assert "class_path: lightning_loadguard.LoadGuard" in out
    assert "window: null" in out and "auto_tune: false" in out  # null: the window adapts to the epoch
