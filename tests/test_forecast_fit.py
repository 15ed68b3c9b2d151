"""``LoadGuard.forecast`` after a real fit, the facts it logs for ``loadguard report --what-if``, and the summary's line
when the settings would not hold on the node's every device."""

from __future__ import annotations

from pathlib import Path

import pytest
from lightning.pytorch.loggers import TensorBoardLogger
from pipelines import quiet_trainer

from lightning_loadguard import Forecast, LoadGuard, cli
from lightning_loadguard import _lightning as _pl
from lightning_loadguard.cli._runs import read_runs
from lightning_loadguard.model.forecast import FACTS_TAG, ForecastFacts
from lightning_loadguard.synthetic import TimedDataset, TimedModule, timed_loader

SAMPLE_CPU_S = 0.002
BATCH = 4
FEATURES = 16


@pytest.fixture(scope="module")
def fitted(tmp_path_factory: pytest.TempPathFactory) -> tuple[LoadGuard, Path, str]:
    """A fit whose one worker computes 8 ms per batch for a 10 ms step, on a node said to hold 8 devices."""
    root = tmp_path_factory.mktemp("forecast")
    patch = pytest.MonkeyPatch()
    patch.setattr(_pl, "node_device_count", lambda trainer: 8)
    try:
        guard = LoadGuard(window=20, print_summary=False)
        dataset = TimedDataset(length=240, sample_s=SAMPLE_CPU_S, features=FEATURES, spin=True)
        trainer = quiet_trainer(
            max_steps=60, callbacks=[guard], log_every_n_steps=10, logger=TensorBoardLogger(str(root), name="run")
        )
        loader = timed_loader(dataset, batch_size=BATCH, num_workers=1)
        trainer.fit(TimedModule(step_s=0.010, features=FEATURES), loader)
    finally:
        patch.undo()
    return guard, root, guard.summary()


def test_forecast_reads_the_runs_own_settings_and_batch(fitted: tuple[LoadGuard, Path, str]) -> None:
    guard, _, _ = fitted
    facts = guard.forecast_facts()
    assert (facts.num_workers, facts.prefetch_factor, facts.batch_size, facts.ranks_per_node) == (1, 2, BATCH, 1)
    # Per sample an int64 index and FEATURES float32 values.
    assert facts.batch_bytes == BATCH * (8 + 4 * FEATURES)
    # Each batch burns BATCH x SAMPLE_CPU_S of the worker's CPU time, whatever the host's load (collate adds a bit).
    assert facts.batch_cpu_s == pytest.approx(BATCH * SAMPLE_CPU_S, rel=0.5)
    result = guard.forecast(ranks_per_node=8, num_workers=2)
    assert isinstance(result, Forecast)
    assert result.worker_processes == 16
    assert result.inflight_bytes is not None and result.inflight_bytes.value == 8 * 2 * 2 * facts.batch_bytes
    assert "LoadGuard forecast: ranks_per_node=8, num_workers=2" in str(result)


def test_bad_what_ifs_and_a_forecast_before_any_window_are_refused_clearly(
    fitted: tuple[LoadGuard, Path, str],
) -> None:
    guard, _, _ = fitted
    with pytest.raises(ValueError, match=r"^ranks_per_node must be .*integer >= 1; got 0"):
        guard.forecast(ranks_per_node=0)
    with pytest.raises(ValueError, match=r"^step_speedup must be .*> 0"):
        guard.forecast(step_speedup=-2.0)
    with pytest.raises(RuntimeError, match="no window yet"):
        LoadGuard().forecast(ranks_per_node=2)


def test_the_summary_says_the_settings_would_not_hold_on_every_device_of_the_node(
    fitted: tuple[LoadGuard, Path, str],
) -> None:
    guard, _, summary = fitted
    # Eight ranks each wanting about 0.8 of a core for their worker, on this host's cores: they cannot.
    assert "On all 8 devices of this node these settings would not hold" in summary
    assert "the first limit to bind is the cores" in summary
    expected = guard.forecast(ranks_per_node=8)
    assert not expected.holds and expected.binds_first == "cores"


def test_the_cpu_has_no_node_size_of_its_own() -> None:
    assert _pl.node_device_count(quiet_trainer(max_steps=1)) is None


def test_report_forecasts_from_the_facts_the_run_logged(
    fitted: tuple[LoadGuard, Path, str], capsys: pytest.CaptureFixture[str]
) -> None:
    guard, root, _ = fitted
    run = read_runs(root)[-1]
    logged = next(text for tag, (_, text) in run.texts.items() if tag.startswith(FACTS_TAG))
    facts, now = ForecastFacts.from_text(logged), guard.forecast_facts()
    assert (facts.num_workers, facts.batch_bytes, facts.ranks_per_node) == (now.num_workers, now.batch_bytes, 1)
    assert facts.production_s == pytest.approx(now.production_s, abs=1e-6)
    assert facts.step_s == pytest.approx(now.step_s, abs=1e-6)
    rc = cli.main(["report", str(root), "--what-if", "ranks_per_node=8,step_speedup=2", "--what-if", "num_workers=3"])
    out = capsys.readouterr().out
    assert rc == 0
    assert "LoadGuard forecast: ranks_per_node=8, step_speedup=2" in out
    assert "LoadGuard forecast: num_workers=3" in out
    # The logged facts give what the callback's own give (up to the log's rounding).
    figure = guard.forecast(ranks_per_node=8, step_speedup=2.0).throughput.value
    assert f"{figure:.3g}" in out


def test_report_refuses_a_bad_what_if_naming_the_argument(
    fitted: tuple[LoadGuard, Path, str], capsys: pytest.CaptureFixture[str]
) -> None:
    _, root, _ = fitted
    assert cli.main(["report", str(root), "--what-if", "ranks_per_node=eight"]) == 2
    assert "ranks_per_node must be training processes per node, an integer >= 1; got 'eight'" in capsys.readouterr().err
