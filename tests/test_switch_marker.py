"""The tuner's switches are marked: a settings line in the logged metrics, a text marker, a line in the plot."""

from __future__ import annotations

import warnings
from pathlib import Path

from lightning.pytorch.loggers import TensorBoardLogger
from pipelines import quiet_trainer

from lightning_loadguard import LoadGuard, TuneOptions
from lightning_loadguard.cli._plot import switches
from lightning_loadguard.cli._runs import read_runs
from lightning_loadguard.synthetic import TimedDataset, TimedModule, timed_loader


def test_each_switch_of_the_loader_is_a_step_in_the_settings_line_and_a_text_marker(tmp_path: Path) -> None:
    # 12 ms of sleeping per batch in the training process against a 4 ms step: the tuner probes workers.
    loader = timed_loader(TimedDataset(4 * 200, sample_s=0.003), batch_size=4, num_workers=0)
    guard = LoadGuard(print_summary=False, log_every_n_steps=5, auto_tune=TuneOptions(warmup_steps=2, window_steps=6))
    logger = TensorBoardLogger(str(tmp_path), name="run")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        quiet_trainer(max_epochs=1, logger=logger, callbacks=[guard]).fit(TimedModule(0.004, record=False), loader)
    decision = guard.decision
    assert decision is not None and len(decision.candidates) >= 2
    run = read_runs(tmp_path)[-1]
    workers = run.scalars["loadguard/num_workers"]
    assert workers.values[0] == 0  # the user's settings first
    assert workers.values[-1] == decision.num_workers  # the decision last
    # The depth beside it: 0 while loading ran in the main process (no prefetch), the decision's last.
    prefetch = run.scalars["loadguard/prefetch_factor"]
    assert prefetch.values[0] == 0
    assert prefetch.values[-1] == (decision.prefetch_factor or 0)
    marks = switches(run)
    assert marks and marks[0][1].startswith("workers 0 -> ")
    _, text = run.texts["loadguard/loader_settings/text_summary"]
    assert "num_workers" in text and "->" in text
