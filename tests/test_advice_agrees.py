"""The diagnosis and the tuner say the same thing: ``certain`` weighs the windows' noise as the tuner does, the
fix offers ``LoadGuard(auto_tune=True)`` only where the tuner would act, and the summary and the diagnosis
print one figure for the step's own rate."""

from __future__ import annotations

import math
import random
import re
import warnings
from typing import Any

import pytest
import torch
from pipelines import quiet_trainer
from torch.utils.data import DataLoader, IterableDataset

from lightning_loadguard._lightning import pl
from lightning_loadguard.callback import LoadGuard
from lightning_loadguard.meters.cpu import CpuUse
from lightning_loadguard.meters.window import HostFacts, LoaderSettings, WindowSnapshot
from lightning_loadguard.model.diagnosis import TunerReach, diagnose
from lightning_loadguard.synthetic import TimedDataset, TimedModule, timed_loader
from lightning_loadguard.tuning.options import TuneOptions
from lightning_loadguard.tuning.reach import tuner_reach

OFFER = "auto_tune=True"
FAST = TuneOptions(warmup_steps=2, window_steps=6, tune_persistent_workers=False)


IO_WORKERS = CpuUse(window_s=4.0, usable_cores=8.0, host_cores=8, loop_cores=0.2, worker_cores=0.0, busy_cores=0.4)


def in_process(loop_s: list[float], fetch_share: float = 0.5, cpu: CpuUse | None = IO_WORKERS) -> WindowSnapshot:
    """``num_workers=0``: each step's loop time ``loop_s[i]``, of which ``fetch_share`` waits for its batch (I/O:
    the cores carry the workers)."""
    waits = tuple(t * fetch_share for t in loop_s)
    steps = tuple(t * (1 - fetch_share) for t in loop_s)
    return WindowSnapshot(
        wait_s=waits,
        step_s=steps,
        settings=LoaderSettings(num_workers=0),
        host=HostFacts(cpu_count=8),
        production_s=waits,
        production_cpu_s=tuple(w * 0.01 for w in waits),
        cpu=cpu,
    )


def busy_host_spread(mean_s: float, steps: int, seed: int) -> list[float]:
    """Loop times a busy host gives one setting: blocks of steps that read from 2 to 25 steps/s (log-uniform
    around ``mean_s``), as the same setting did in side-by-side rounds on a shared machine."""
    rng = random.Random(seed)
    times: list[float] = []
    while len(times) < steps:
        rate = math.exp(rng.uniform(math.log(2.0), math.log(25.0)))
        times += [1.0 / rate] * 4
    scale = mean_s * len(times[:steps]) / sum(times[:steps])
    return [t * scale for t in times[:steps]]


# -- certain weighs the windows' noise ------------------------------------------------------------------------


@pytest.mark.parametrize("seed", range(5))
def test_a_fix_within_the_noise_of_a_busy_hosts_windows_is_a_hypothesis_and_certain_on_a_quiet_one(seed: int) -> None:
    # A wait of 12 % of loop time: moving the batch making to a worker aims for about 14 % more steps/s. Three
    # windows of 24 steps at the same setting, the same means, quiet or spread as a busy host spreads them.
    reach = TunerReach(True)
    quiet = [in_process([0.1] * 24, fetch_share=0.12) for _ in range(3)]
    noisy = [in_process(busy_host_spread(0.1, 24, seed * 10 + i), fetch_share=0.12) for i in range(3)]
    calm = diagnose(quiet[-1], quiet[:-1], tuner=reach)
    assert calm.verdict == "producer_deficit" and calm.recommended == {"num_workers": 1}
    assert calm.certain is True, calm.to_text()
    shaky = diagnose(noisy[-1], noisy[:-1], tuner=reach)
    assert shaky.verdict == "producer_deficit" and shaky.recommended == {"num_workers": 1}
    assert shaky.certain is False, shaky.to_text()
    fix = shaky.findings[0].fix
    assert "noisy" in fix and OFFER in fix


def test_a_large_gain_stays_certain_beside_the_same_noise() -> None:
    # Two thirds of the loop waiting: the fix aims for 3x, far past any spread of these windows.
    noisy = [in_process(busy_host_spread(0.1, 24, i), fetch_share=0.67) for i in range(3)]
    assert diagnose(noisy[-1], noisy[:-1], tuner=TunerReach(True)).certain is True


# -- the fix offers the tuner only where it would act ----------------------------------------------------------

HYPOTHESIS = in_process([0.1] * 24, fetch_share=0.3, cpu=None)  # CPU unmeasured: the count is a hypothesis


def fix_for(reach: TunerReach) -> str:
    d = diagnose(HYPOTHESIS, tuner=reach)
    assert d.verdict == "producer_deficit" and d.certain is False
    return d.findings[0].fix


def test_where_the_tuner_acts_the_fix_offers_it() -> None:
    loader = DataLoader(TimedDataset(4000), batch_size=4)
    reach = tuner_reach([loader], HYPOTHESIS, epoch_steps=1000, max_epochs=None)
    assert reach.acts
    assert OFFER in fix_for(reach)


class Stream(IterableDataset):
    """100 samples of a :class:`TimedDataset`, streamed (not sharded by worker)."""

    def __iter__(self) -> Any:
        samples = TimedDataset(100, sample_s=0.002)
        return (samples[i] for i in range(len(samples)))


@pytest.mark.parametrize(
    ("loaders", "epoch_steps", "max_epochs", "why"),
    [
        pytest.param(
            [DataLoader(TimedDataset(40)), DataLoader(TimedDataset(40))], 40, None, "2 train loaders", id="two_loaders"
        ),
        pytest.param([range(40)], 40, None, "not a torch DataLoader", id="not_a_dataloader"),
        pytest.param([DataLoader(Stream())], None, None, "IterableDataset in the main process", id="iterable"),
        pytest.param(
            [DataLoader(Stream(), num_workers=1)], None, None, "num_workers is never changed", id="iterable_workers"
        ),
        pytest.param([DataLoader(TimedDataset(40))], 10, 1, "no room to measure", id="short_epochs"),
    ],
)
def test_where_the_tuner_declines_the_loader_the_fix_does_not_offer_it(
    loaders: list[Any], epoch_steps: int | None, max_epochs: int | None, why: str
) -> None:
    reach = tuner_reach(loaders, HYPOTHESIS, epoch_steps=epoch_steps, max_epochs=max_epochs)
    assert not reach.acts and why in reach.reason
    fix = fix_for(reach)
    assert OFFER not in fix and "side by side" in fix and why in fix


def fit(loader: DataLoader, tune: TuneOptions | bool, epochs: int = 1, **kwargs: Any) -> tuple[LoadGuard, Any]:
    pl.seed_everything(3, verbose=False)
    guard = LoadGuard(print_summary=False, auto_tune=tune, **kwargs)
    trainer = quiet_trainer(max_epochs=epochs, callbacks=[guard])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer.fit(TimedModule(step_s=0.004), loader)
    return guard, trainer


def reach_of(guard: LoadGuard, trainer: Any) -> TunerReach:
    batches = trainer.num_training_batches
    return guard._tuner_reach(trainer, int(batches) if math.isfinite(batches) else None)


@pytest.mark.parametrize(
    ("make", "epochs"),
    [
        pytest.param(lambda: timed_loader(TimedDataset(40, sample_s=0.002), batch_size=4), 1, id="short_epochs"),
        pytest.param(lambda: DataLoader(Stream(), batch_size=4), 1, id="iterable"),
    ],
)
def test_the_tuner_declines_exactly_where_the_fix_says_it_would(make: Any, epochs: int) -> None:
    # Without the tuner the fix's reach is predicted; with it the tuner's own run says the same.
    guard, trainer = fit(make(), False, epochs)
    predicted = reach_of(guard, trainer)
    tuned, tuned_trainer = fit(make(), FAST if epochs > 1 else TuneOptions(), epochs)
    assert not predicted.acts
    assert tuned.decision is None or tuned.decision.verdict == "model_only"
    assert not reach_of(tuned, tuned_trainer).acts


class Augmented(TimedDataset):
    def __getitem__(self, index: int) -> Any:
        sample, features = super().__getitem__(index)
        return sample, features + torch.rand(1)


def test_a_tuner_that_kept_random_draws_or_decided_is_not_offered_again() -> None:
    # keep_random_draws: the tuner keeps loading in the main process; the advice does not send the user to it.
    loader = DataLoader(Augmented(240, sample_s=0.002), batch_size=4, shuffle=True)
    guard, trainer = fit(loader, TuneOptions(warmup_steps=2, window_steps=6, keep_random_draws=True))
    reach = reach_of(guard, trainer)
    assert not reach.acts and "keep_random_draws=True" in reach.reason
    assert OFFER not in fix_for(reach)
    # A tuner that decided in this run: the fix says what it chose instead of offering it again.
    loader = timed_loader(TimedDataset(240, sample_s=0.003), batch_size=4, num_workers=1, shuffle=True)
    guard, trainer = fit(loader, FAST)
    assert guard.decision is not None
    reach = reach_of(guard, trainer)
    assert not reach.acts and guard.decision.setting.label in reach.reason
    assert OFFER not in fix_for(reach)
    # What it measured goes with it, so that no fix names a setting it measured slower as certain.
    assert reach.chosen == guard.decision.setting
    assert reach.measured == tuple((c.setting, c.rate) for c in guard.decision.candidates if c.rate is not None)
    assert len(reach.measured) >= 2


def test_a_tuner_that_stopped_is_not_offered_again(monkeypatch: pytest.MonkeyPatch) -> None:
    from lightning_loadguard.tuning.planner import Planner

    def broken(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("broken")

    monkeypatch.setattr(Planner, "record", broken)
    guard, trainer = fit(timed_loader(TimedDataset(240, sample_s=0.003), batch_size=4, num_workers=1), FAST)
    reach = reach_of(guard, trainer)
    assert guard.decision is None and not reach.acts and "stopped" in reach.reason
    assert OFFER not in fix_for(reach)


def test_a_run_resumed_in_a_later_epoch_without_a_decision_is_not_offered_the_tuner(tmp_path: Any) -> None:
    loader = timed_loader(TimedDataset(120, sample_s=0.001), batch_size=4)
    pl.seed_everything(3, verbose=False)
    first = quiet_trainer(max_epochs=1, default_root_dir=tmp_path)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        first.fit(TimedModule(step_s=0.002), loader)
    ckpt = tmp_path / "one.ckpt"
    first.save_checkpoint(ckpt)
    guard = LoadGuard(print_summary=False, auto_tune=FAST)
    trainer = quiet_trainer(max_epochs=2, callbacks=[guard])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer.fit(TimedModule(step_s=0.002), loader, ckpt_path=str(ckpt))
    reach = reach_of(guard, trainer)
    assert not reach.acts and "later epoch" in reach.reason
    assert OFFER not in fix_for(reach)


# -- one figure for the step's own rate ------------------------------------------------------------------------


def test_the_summary_and_the_diagnosis_print_one_figure_for_the_steps_own_rate() -> None:
    # In-process loading on a step whose length changes between windows: the diagnosis pools the windows of the
    # same settings, the last window alone would read another figure.
    class Slowing(TimedModule):
        def training_step(self, batch: Any, batch_idx: int) -> Any:
            self.step_s = 0.002 if batch_idx < 60 else 0.008
            return super().training_step(batch, batch_idx)

    loader = timed_loader(TimedDataset(480, sample_s=0.001), batch_size=4)
    guard = LoadGuard(print_summary=False, window=20, log_every_n_steps=20)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        quiet_trainer(max_epochs=1, callbacks=[guard]).fit(Slowing(step_s=0.002), loader)
    text = guard.summary()
    figures = re.findall(r"step alone[^0-9]*([0-9.]+) steps/s", text, flags=re.I)
    assert len(figures) >= 2, text
    assert len(set(figures)) == 1, text
    assert "consumer rate" not in text
    # docs/verdicts.md: the summary prints the same figures as the diagnosis under the same names: the step's own
    # rate, the loader's rate and the wait, each in the summary's "(as diagnosed)" row and in the finding's text.
    assert guard.diagnosis is not None
    said = guard.diagnosis.to_text()
    for name, unit in [("the step alone", "steps/s"), ("the loader can make", "batches/s")]:
        row = re.search(rf"{name}[^\n]*?\(as diagnosed\)\W*([0-9.]+) {unit}", text)
        assert row is not None, text
        assert re.search(rf"{name}[a-z ]* {re.escape(row.group(1))} {unit}", said, flags=re.I), (row.group(1), said)
    wait = re.search(r"the loop waits for data \(as diagnosed\)\W*([0-9.]+%)", text)
    assert wait is not None, text
    assert f"the loop waits for data {wait.group(1)} of its time" in said, said


# -- certain asks the gain the tuner asks ------------------------------------------------------------------------


def test_the_least_gain_a_certain_fix_needs_is_the_tuners_default_min_gain_of_five_percent() -> None:
    from lightning_loadguard.model.diagnosis import CERTAIN_GAIN

    # docs/verdicts.md: CERTAIN_GAIN is the tuner's default min_gain, 5 %.
    assert CERTAIN_GAIN == TuneOptions().min_gain == 0.05


def _two_io_workers(capacity: float, *, wait_s: float, prefetch: int) -> WindowSnapshot:
    """A quiet window (every step alike: no noise) of two workers making ``capacity`` batches/s for a 0.1 s step,
    waiting on I/O (the cores carry more of them); each step waited ``wait_s``."""
    return WindowSnapshot(
        wait_s=(wait_s,) * 24,
        step_s=(0.1,) * 24,
        settings=LoaderSettings(num_workers=2, prefetch_factor=prefetch),
        host=HostFacts(cpu_count=8),
        production_s=(2 / capacity,) * 24,
        production_cpu_s=(0.002,) * 24,
        cpu=IO_WORKERS,
    )


@pytest.mark.parametrize(("capacity", "certain"), [(9.7, False), (9.4, True)])
def test_a_worker_fix_aiming_for_less_than_five_percent_is_a_hypothesis_even_on_a_quiet_host(
    capacity: float, certain: bool
) -> None:
    # Two workers make `capacity` batches/s in steady state for a 0.1 s step: each step waits 1/capacity - 0.1 s.
    # More workers aim for the step's own 10 steps/s: 10 / 9.7 - 1 = 3.1 %, 10 / 9.4 - 1 = 6.4 %. The windows
    # are quiet (every step alike: no noise) and the workers wait on I/O (the cores carry them).
    d = diagnose(_two_io_workers(capacity, wait_s=1 / capacity - 0.1, prefetch=2), tuner=TunerReach(True))
    assert d.verdict == "producer_deficit" and d.recommended == {"num_workers": 3}, d.to_text()
    assert d.certain is certain, d.to_text()
    fix = d.findings[0].fix
    # A hypothesis says why, and offers the measurement that verifies it; a certain fix needs neither.
    assert ("aims to gain 3%, less than the 5% a measurement is asked to show" in fix) is not certain, fix
    assert (OFFER in fix) is not certain, fix


@pytest.mark.parametrize(("capacity", "certain"), [(9.7, False), (8.0, True)])
def test_a_deficit_still_hidden_by_a_full_buffer_aims_for_the_gain_from_the_rate_the_workers_hold(
    capacity: float, certain: bool
) -> None:
    # Two I/O-bound workers make `capacity` batches/s for a 0.1 s step, but the buffer filled at start-up still
    # serves every fetch: no wait yet. Once it drains, the loop runs at `capacity`: more workers aim for the step's
    # 10 steps/s from there, 10 / 8 - 1 = 25 % (certain) or 10 / 9.7 - 1 = 3 % (a hypothesis), not the 0 % the
    # window's own throughput would give.
    d = diagnose(_two_io_workers(capacity, wait_s=0.0, prefetch=4), tuner=TunerReach(True))
    assert d.verdict == "producer_deficit" and d.draining is not None, d.to_text()
    assert d.recommended == {"num_workers": 3}, d.to_text()
    assert d.certain is certain, d.to_text()
    fix = d.findings[0].fix
    assert "aims to gain 0%" not in fix, fix
    assert ("aims to gain 3%, less than the 5% a measurement is asked to show" in fix) is not certain, fix
