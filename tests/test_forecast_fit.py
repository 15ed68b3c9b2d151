"""``LoadGuard.forecast`` after a real fit, the facts it logs for ``loadguard report --what-if``, and the summary's line
when the settings would not hold on the node's every device."""

from __future__ import annotations

import multiprocessing
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from lightning.pytorch.loggers import TensorBoardLogger
from pipelines import quiet_trainer
from torch.utils.data import DataLoader, Dataset, IterableDataset, default_collate

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


class _Stream(IterableDataset):
    """Samples without a length: Lightning cannot tell the epoch's last batch but by fetching one ahead."""

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        for i in range(4000):
            yield torch.tensor(i), torch.zeros(FEATURES)


class _Indexed(Dataset):
    def __len__(self) -> int:
        return 4000

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        return torch.tensor(index), torch.zeros(FEATURES)


@pytest.mark.parametrize(("dataset", "ahead"), [(_Stream(), 1), (_Indexed(), 0)], ids=["no-length", "sized"])
def test_lightning_fetches_one_batch_ahead_of_the_forecasts_queues_only_for_a_loader_without_a_length(
    dataset: Dataset, ahead: int
) -> None:
    # forecast.md: the in-flight count is the queues' capacity; for a loader without a length Lightning holds one
    # more batch, fetched ahead to learn whether the current one is the last. The truth is the dataset's own
    # counters: batches made (counted in the workers' collate) less batches taken (counted in training_step, the
    # step's own batch included), at each step's end.
    made = multiprocessing.get_context("fork").Value("i", 0)

    def counted(samples: list[Any]) -> Any:
        batch = default_collate(samples)
        with made.get_lock():
            made.value += 1
        return batch

    class Counting(TimedModule):
        def __init__(self) -> None:
            super().__init__(step_s=0.03)  # long enough for the workers to refill every freed slot
            self.taken = self.batch_bytes = 0
            self.outstanding: list[int] = []

        def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
            self.taken += 1
            self.batch_bytes = sum(t.element_size() * t.nelement() for t in batch)
            return super().training_step(batch, batch_idx)

        def on_train_batch_end(self, outputs: Any, batch: Any, batch_idx: int) -> None:
            super().on_train_batch_end(outputs, batch, batch_idx)
            self.outstanding.append(made.value - self.taken)

    workers, prefetch = 2, 3
    loader = DataLoader(
        dataset,
        batch_size=BATCH,
        num_workers=workers,
        prefetch_factor=prefetch,
        collate_fn=counted,
        multiprocessing_context="fork",
    )
    guard, module = LoadGuard(window=4, print_summary=False), Counting()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        quiet_trainer(max_steps=12, callbacks=[guard]).fit(module, loader)
    assert len(module.outstanding) == 12
    # At most the queues and the batch fetched ahead; all of them once the workers caught up (a busy host may keep
    # a worker from refilling its slot by some step's end, never from every one).
    assert max(module.outstanding) == workers * prefetch + ahead, module.outstanding
    figure = guard.forecast().inflight_bytes
    assert module.batch_bytes == BATCH * (8 + 4 * FEATURES)
    assert figure is not None and figure.value == workers * prefetch * module.batch_bytes
