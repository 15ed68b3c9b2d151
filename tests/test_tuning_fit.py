"""Auto-tuning inside real Trainer fits: order, never worse, budgets, resume, iterable datasets and faults."""

from __future__ import annotations

import functools
import multiprocessing
import os
import random
import re
import time
import warnings
from dataclasses import replace
from pathlib import Path
from statistics import fmean
from typing import Any

import pytest
import torch
from pipelines import FETCH_ACTION, MadeByWorkers, quiet_trainer
from scripted_tuning import scripted_window, window_of
from torch.utils.data import DataLoader, IterableDataset, get_worker_info

from lightning_loadguard._lightning import pl
from lightning_loadguard.callback import LoadGuard
from lightning_loadguard.meters import monitor as monitor_module
from lightning_loadguard.meters.host import host_facts
from lightning_loadguard.meters.settings import settings_of
from lightning_loadguard.meters.window import HostFacts, WindowSnapshot
from lightning_loadguard.model.capacity import WAIT_OK
from lightning_loadguard.synthetic import TimedDataset, TimedModule, timed_loader
from lightning_loadguard.tuning import session as session_module
from lightning_loadguard.tuning.session import TuneOptions

FAST = TuneOptions(warmup_steps=2, window_steps=6, tune_persistent_workers=False)


def fit(
    loader: DataLoader,
    tune: bool | TuneOptions,
    *,
    step_s: float = 0.004,
    epochs: int = 2,
    callbacks: list[Any] | None = None,
    ckpt_path: str | None = None,
    root: Path | None = None,
    module: TimedModule | None = None,
    val_loader: DataLoader | None = None,
    **trainer_kwargs: Any,
) -> tuple[list[int], LoadGuard, Any]:
    pl.seed_everything(11, verbose=False)
    guard = LoadGuard(print_summary=False, auto_tune=tune)
    module = module or TimedModule(step_s=step_s)
    trainer = quiet_trainer(
        max_epochs=epochs, callbacks=[guard, *(callbacks or [])], default_root_dir=root, **trainer_kwargs
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer.fit(module, loader, val_loader, ckpt_path=ckpt_path)
    return module.seen, guard, trainer


def io_bound(workers: int = 1, length: int = 480, **kwargs: Any) -> DataLoader:
    """A loader that makes a batch in 12 ms per worker, against a 4 ms step: workers help."""
    pl.seed_everything(11, verbose=False)
    return timed_loader(TimedDataset(length, sample_s=0.003), batch_size=4, num_workers=workers, shuffle=True, **kwargs)


class EpochRates(pl.Callback):
    """Each epoch's steps per second, on the test's own clock (from the epoch's start to its end)."""

    def __init__(self) -> None:
        self.rates: list[float] = []

    def on_train_epoch_start(self, trainer: Any, pl_module: Any) -> None:
        self._started, self._steps = time.perf_counter(), 0

    def on_train_batch_end(self, *args: Any) -> None:
        self._steps += 1

    def on_train_epoch_end(self, trainer: Any, pl_module: Any) -> None:
        self.rates.append(self._steps / (time.perf_counter() - self._started))


# 120-step epochs: at 35 %, epoch 0's probe budget (42 steps) holds five 8-step windows, so probing ends in it.
EPOCH_0_ALONE = replace(FAST, probe_share=0.35)


def test_epochs_see_the_untuned_order_while_settings_switch() -> None:
    untuned_clock, tuned_clock = EpochRates(), EpochRates()
    untuned, _, _ = fit(io_bound(), False, callbacks=[untuned_clock])
    tuned, guard, trainer = fit(io_bound(), EPOCH_0_ALONE, callbacks=[tuned_clock])
    decision = guard.decision
    assert decision is not None and len(decision.candidates) >= 2  # settings really switched mid-epoch
    # Whether a 42-step budget tells the candidates apart depends on the host's load (beside five other test
    # suites, 1 and 4 workers both read 61 steps/s: the loop's own CPU paced both); whether the tuner chooses
    # well is judged on simulated pipelines (tests/test_tuning_sweep.py), the order here.
    assert decision.verdict in ("improved", "no_gain"), decision.table()
    assert decision.verdict == "no_gain" or decision.num_workers > 1
    half = len(untuned) // 2
    assert tuned[:half] == untuned[:half]
    assert tuned[half:] == untuned[half:]
    assert trainer.train_dataloader.num_workers == decision.num_workers
    assert decision.probe_steps <= decision.probe_budget_steps == 42
    # Never worse, on the test's own clock: the second epoch, run wholly at the kept setting, against the
    # untuned run's second epoch. On a quiet host the gain is large (one worker sleeping 12 ms a batch against a
    # 4 ms step); on a saturated one the loop's own CPU paces both runs alike. Two runs one after the other see
    # the host's load drift, so the bound, fixed here, allows 10 %, and a miss is measured again (both runs).
    ratios = [tuned_clock.rates[1] / untuned_clock.rates[1]]
    while ratios[-1] < 0.9 and len(ratios) < 3:
        untuned_clock, tuned_clock = EpochRates(), EpochRates()
        fit(io_bound(), False, callbacks=[untuned_clock])
        fit(io_bound(), EPOCH_0_ALONE, callbacks=[tuned_clock])
        ratios.append(tuned_clock.rates[1] / untuned_clock.rates[1])
    assert ratios[-1] >= 0.9, f"tuned / untuned steps per second, each measured pair: {ratios}"


def test_a_setting_measured_again_runs_on_without_a_restart_in_the_untuned_order(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from lightning_loadguard.tuning import planner as planner_module
    from lightning_loadguard.tuning import search as search_module
    from lightning_loadguard.tuning.search import Proposal

    def two_workers_once(self: Any, arms: Any) -> Any:
        yours = next(iter(arms))  # measured first
        return None if len(arms) > 1 else Proposal(replace(yours, num_workers=2), "a candidate")

    contest = planner_module.Planner._contest

    def the_candidate_again_first(self: Any, *, users_only: bool = False) -> Any:
        if len(self.results) == 2:
            return Proposal(self.results[-1].setting, "measured again")
        return contest(self, users_only=users_only)

    monkeypatch.setattr(search_module.Search, "next", two_workers_once)
    monkeypatch.setattr(planner_module.Planner, "_contest", the_candidate_again_first)
    # Whether 2 workers still wait 5 % of the time depends on the host's load: the search goes on either way.
    monkeypatch.setattr(planner_module, "winnable", lambda arm: 1.0)
    restarts: list[dict[str, Any]] = []
    restart = session_module.restart_iterator

    def counted_restart(*args: Any, **kwargs: Any) -> Any:
        restarts.append(kwargs)
        return restart(*args, **kwargs)

    monkeypatch.setattr(session_module, "restart_iterator", counted_restart)
    untuned, _, _ = fit(io_bound(), False)
    tuned, guard, _ = fit(io_bound(), FAST)
    decision = guard.decision
    assert decision is not None
    # Then the user's settings again (their workers restart), as the contest between the two asks.
    assert [c.setting.num_workers for c in decision.candidates][:4] == [1, 2, 2, 1], decision.table()
    assert decision.candidates[2].steps == FAST.warmup_steps + FAST.window_steps  # warm: no refill
    assert [k.get("num_workers") for k in restarts][:2] == [2, 1]  # measured again without a restart
    assert tuned == untuned


def _main_process_wins(self: Any, port: Any, start: Any) -> WindowSnapshot:
    """Scripted windows where the hand-over costs more than loading: with workers the loop waits 8 ms for a batch a
    worker made in 1 ms (the search then probes the main process), which loads it in 1 ms beside a 4 ms step."""
    setting = self._planner.current if self._planner is not None else settings_of(self._loader)
    steps = self._window_steps if self._planner is not None else self._watch_steps
    wait = 0.001 if setting.num_workers == 0 else 0.008
    return WindowSnapshot(
        wait_s=(wait,) * steps,
        step_s=(0.004,) * steps,
        production_s=(0.001,) * steps,
        settings=setting,
        host=HostFacts(cpu_count=8),
        batches_made=steps,
    )


def _shuffled(steps: int, workers: int = 1) -> DataLoader:
    """A shuffled loader of ``steps`` batches of 4 that hardly costs anything to make."""
    pl.seed_everything(11, verbose=False)
    return timed_loader(TimedDataset(4 * steps, sample_s=0.0001), batch_size=4, num_workers=workers, shuffle=True)


@pytest.mark.parametrize(("workers", "reload"), [(1, 0), (1, 1), (0, 0), (0, 1)])
def test_reloaded_loaders_keep_loading_on_their_side_of_num_workers_0_and_every_epochs_order(
    monkeypatch: pytest.MonkeyPatch, workers: int, reload: int
) -> None:
    # Where Lightning reloads the loaders it builds each later epoch's iterator twice and drops the first unread. A
    # loader with workers starts its shuffle's run (a draw from torch's stream) as the iterator is built, one in the
    # main process at the first batch: across num_workers=0 the draws differ, and so would every later order. The
    # scripted windows make the other side of num_workers=0 faster than the user's.
    monkeypatch.setattr(session_module.TuningSession, "_measured", _main_process_wins if workers else scripted_window)

    untuned, _, _ = fit(_shuffled(120, workers), False, step_s=0.001, reload_dataloaders_every_n_epochs=reload)
    tuned, guard, _ = fit(_shuffled(120, workers), FAST, step_s=0.001, reload_dataloaders_every_n_epochs=reload)
    assert tuned == untuned
    decision = guard.decision
    if not reload:  # where nothing is dropped unread, the other side is chosen
        assert decision is not None and (decision.num_workers == 0) != (workers == 0), decision and decision.table()
    elif workers:
        assert decision is not None and len(decision.candidates) >= 2, decision and decision.table()
        assert all(c.setting.num_workers > 0 for c in decision.candidates), decision.table()
    else:
        assert decision is None
        assert any(n.startswith("auto-tuning is off: the loop builds each epoch's iterator twice") for n in guard._said)


@functools.cache
def _untuned(steps: int) -> list[int]:
    """What three epochs of :func:`_shuffled` train without tuning."""
    return fit(_shuffled(steps), False, step_s=0.001, epochs=3)[0]


def test_a_switch_at_an_epochs_last_step_leaves_the_next_epoch_whole(monkeypatch: pytest.MonkeyPatch) -> None:
    # With 24 steps an epoch the scripted windows end the user's settings' window on epoch 0's last step and the
    # search switches to the main process there: Lightning never reads the new iterator (it stops a sized loader at
    # its length). The next epoch once continued its spent run and trained nothing (a whole epoch lost, silently).
    monkeypatch.setattr(session_module.TuningSession, "_measured", _main_process_wins)
    switch = session_module.TuningSession._switch
    at_last_step: list[bool] = []

    def recorded(self: Any, port: Any, setting: Any) -> None:
        at_last_step.append(port.consumed_in_epoch() == port.epoch_steps(self._loader))
        switch(self, port, setting)

    monkeypatch.setattr(session_module.TuningSession, "_switch", recorded)

    tuned, guard, _ = fit(_shuffled(24), FAST, step_s=0.001, epochs=3)
    assert any(at_last_step), at_last_step  # the case under test happened
    assert tuned == _untuned(24)
    assert guard.decision is not None and guard.decision.num_workers == 0, guard.decision


@pytest.mark.slow
def test_every_epoch_length_around_the_tuners_windows_keeps_every_sample_and_order(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Scripted windows make every fit take the same steps: over epochs of 8 to 40 steps, windows, switches (to the
    # main process and back to workers) and the decision land on every step of an epoch, its first and last
    # included (the test above, at 24 steps, is one). Before the order tap bound its replay to the restart's own
    # iterators, 24 and 34 steps lost an epoch.
    monkeypatch.setattr(session_module.TuningSession, "_measured", _main_process_wins)
    changed = []
    for steps in range(8, 41):
        tuned, guard, _ = fit(_shuffled(steps), FAST, step_s=0.001, epochs=3)
        if tuned != _untuned(steps):
            changed.append((steps, guard.decision and guard.decision.table()))
    assert not changed, changed


def test_a_stored_decision_across_num_workers_0_is_not_applied_where_the_loop_reloads_the_loaders(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr(session_module.TuningSession, "_measured", _main_process_wins)
    _, first, trainer = fit(io_bound(), FAST, epochs=1, root=tmp_path)
    assert first.decision is not None and first.decision.num_workers == 0, first.decision
    path = str(tmp_path / "tuned.ckpt")
    trainer.save_checkpoint(path)
    at_start = _WorkersAtStart()
    _, resumed, _ = fit(
        io_bound(), FAST, callbacks=[at_start], ckpt_path=path, root=tmp_path, reload_dataloaders_every_n_epochs=1
    )
    assert at_start.workers == 1
    said = [n for n in resumed._said if "the stored auto-tune decision (workers=0) is not applied" in n]
    assert len(said) == 1 and "reload_dataloaders_every_n_epochs" in said[0], sorted(resumed._said)


def test_compute_bound_keeps_the_settings_and_says_so() -> None:
    # Making a batch takes about 0.1 ms against a 100 ms step: compute-bound by design. Whether a run really was
    # is read on the user's own profiler (Lightning times each fetch for it): a busy host can make even this
    # loop wait, and then "no_gain" is the right answer. Such a run is measured again; a compute-bound one must
    # be called so. Beside spinning processes each fetch after the sleeping step waits for a core: the step is long
    # so that this wait stays a small share of the loop.
    from lightning.pytorch.profilers import SimpleProfiler

    observed = []
    for _ in range(3):
        profiler = SimpleProfiler()
        loader = timed_loader(TimedDataset(240, sample_s=0.0), batch_size=4, num_workers=0)
        _, guard, trainer = fit(loader, FAST, step_s=0.1, epochs=1, profiler=profiler)
        fetches = profiler.recorded_durations[FETCH_ACTION]
        observed.append(sum(fetches) / (sum(fetches) + 0.1 * len(fetches)))
        if observed[-1] < WAIT_OK / 2:
            break
    if observed[-1] >= WAIT_OK / 2:
        # No run was compute-bound by the profiler's clock (a host this busy makes the fetch itself wait): nothing
        # here to call so. The verdict on such runs is no_gain's, checked where the loop waits.
        pytest.skip(f"the host made every run wait: wait fractions {observed}")
    decision = guard.decision
    assert decision is not None and decision.verdict == "compute_bound", decision and decision.table()
    # Your settings alone were measured (again, while the loop hardly waited): nothing was probed.
    assert {c.setting for c in decision.candidates} == {decision.original} and decision.probe_steps == 0
    assert trainer.train_dataloader.num_workers == 0


@pytest.mark.parametrize(
    ("share", "in_flight", "wall"),
    [
        ({}, 6, "host_memory"),  # memory_share=0.5 of twelve batches' RAM
        ({"memory_share": 0.25}, 3, "host_memory"),
        ({"shm_share": 0.5}, 6, "shm"),  # RAM to spare, twelve batches' /dev/shm free
    ],
    ids=["memory_share-default", "memory_share-0.25", "shm_share-0.5"],
)
def test_a_small_memory_budget_is_never_broken(
    monkeypatch: pytest.MonkeyPatch, share: dict[str, float], in_flight: int, wall: str
) -> None:
    batch_bytes = 4 * (8 + 16 * 4)  # index (int64) and 16 float32 features per sample
    small = 2 * 6 * batch_bytes  # twelve batches: the share of it is the wall, in batches in flight

    def tiny_host(processes: int = 1, max_age_s: float = 0.0) -> HostFacts:
        real = host_facts(processes, max_age_s)
        if wall == "shm":
            return HostFacts(real.cpu_count, processes, available_ram_bytes=10**12, shm_free_bytes=small)
        return HostFacts(real.cpu_count, processes, available_ram_bytes=small, shm_free_bytes=None)

    monkeypatch.setattr(monitor_module, "host_facts", tiny_host)
    loader = timed_loader(TimedDataset(480, sample_s=0.01), batch_size=4, num_workers=1, shuffle=True)
    _, guard, _ = fit(loader, replace(FAST, **share), step_s=0.002, epochs=1)
    decision = guard.decision
    assert decision is not None
    assert all(c.setting.batches_in_flight <= in_flight for c in decision.candidates), decision.table()
    assert decision.setting.batches_in_flight <= in_flight
    assert decision.bounded_by == wall, decision.table()


def test_the_decision_is_restored_and_applied_without_probing(tmp_path: Path) -> None:
    # The precondition, a decision that changed the settings, is the host's to give: 6-step windows on a busy host
    # can spread by more than the 3 workers win (noise 31 % against 18 % in one run beside under-load), and the
    # tuner then rightly keeps yours. Such a first fit is run again, at most three times.
    for _ in range(3):
        _, first, trainer = fit(io_bound(), FAST, epochs=1, root=tmp_path)
        decision = first.decision
        assert decision is not None
        if decision.num_workers > 1:
            break
    assert decision.num_workers > 1, decision.table()
    path = str(tmp_path / "tuned.ckpt")
    trainer.save_checkpoint(path)

    class SettingsAtStart(pl.Callback):
        workers: int | None = None

        def on_train_start(self, trainer: Any, pl_module: Any) -> None:
            self.workers = trainer.train_dataloader.num_workers

    seen_at_start = SettingsAtStart()
    _, resumed, _ = fit(io_bound(), FAST, epochs=2, callbacks=[seen_at_start], ckpt_path=path, root=tmp_path)
    assert resumed.decision == decision  # the stored one: no new candidates were probed
    assert seen_at_start.workers == decision.num_workers


class Unsharded(IterableDataset):
    """Every worker replays the whole range: more workers would duplicate samples."""

    def __init__(self, length: int) -> None:
        self.length = length

    def __iter__(self):
        for i in range(self.length):
            yield torch.tensor(i), torch.zeros(16)


def test_iterable_datasets_keep_their_workers() -> None:
    loader = DataLoader(Unsharded(240), batch_size=4, num_workers=1)
    seen, guard, trainer = fit(loader, FAST, epochs=2)
    decision = guard.decision
    assert decision is not None and decision.verdict == "model_only"
    assert decision.num_workers == 1 and trainer.train_dataloader.num_workers == 1
    assert sorted(seen) == sorted(list(range(240)) * 2)  # nothing duplicated, nothing lost
    assert "IterableDataset" in decision.reason

    loader = DataLoader(Unsharded(240), batch_size=4, num_workers=0)
    _, guard, _ = fit(loader, FAST, epochs=1)
    assert guard.decision is None
    assert any("IterableDataset" in note and "duplicate" in note for note in guard._said)


class FailsUnderOtherWorkerCounts(TimedDataset):
    """Raises in a worker whenever the loader runs with a worker count other than one (a probed setting)."""

    def __getitem__(self, index: int):
        info = get_worker_info()
        if info is not None and info.num_workers != 1:
            raise RuntimeError("simulated: unable to write to file </torch_123>: No space left on device")
        return super().__getitem__(index)


def test_a_failing_probe_reverts_and_no_sample_is_lost() -> None:
    def loader() -> DataLoader:
        pl.seed_everything(11, verbose=False)
        return DataLoader(FailsUnderOtherWorkerCounts(480, sample_s=0.003), batch_size=4, num_workers=1, shuffle=True)

    untuned, _, _ = fit(loader(), False)
    tuned, guard, trainer = fit(loader(), FAST)
    decision = guard.decision
    assert decision is not None
    failures = [c.failed for c in decision.candidates if c.failed]
    assert failures and "No space left on device" in failures[0]
    assert decision.num_workers == 1 and trainer.train_dataloader.num_workers == 1
    assert tuned == untuned


@pytest.mark.parametrize(
    ("step", "name", "fails_at"),
    [
        ("watching the steps", "watch", 1),
        pytest.param("planning the next probe", "record", 2, marks=pytest.mark.slow),
        pytest.param("deciding", "decide", 1, marks=pytest.mark.slow),
    ],
)
def test_a_tuner_step_that_fails_puts_the_users_settings_back_in_the_untuned_order(
    monkeypatch: pytest.MonkeyPatch, step: str, name: str, fails_at: int
) -> None:
    # The tuner's own code fails: on a step between windows (watching the in-process draws), while a candidate
    # runs (planning after its window), or at the end (deciding). Training goes on at the user's settings from
    # the same batch, said once, and no decision is stored.
    from lightning_loadguard.tuning.planner import Planner

    owner: Any = session_module.RandomDrawWatch if name == "watch" else Planner
    attribute = "install" if name == "watch" else name
    original = getattr(owner, attribute)
    calls: list[int] = []

    def failing(*args: Any, **kwargs: Any) -> Any:
        calls.append(1)
        if len(calls) == fails_at:
            raise RuntimeError("broken")
        return original(*args, **kwargs)

    untuned, _, _ = fit(io_bound(), False)
    monkeypatch.setattr(owner, attribute, staticmethod(failing) if name == "watch" else failing)
    tuned, guard, trainer = fit(io_bound(), FAST)
    said = [line for line in guard.summary().splitlines() if "auto-tuning" in line]
    assert len(said) == 1, said
    assert f"auto-tuning stopped: {step} failed (RuntimeError: broken). Your settings are kept" in said[0]
    assert guard.decision is None and trainer.train_dataloader.num_workers == 1
    assert tuned == untuned


def test_the_candidate_table_goes_to_tensorboard(tmp_path: Path) -> None:
    from lightning.pytorch.loggers import TensorBoardLogger
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    logger = TensorBoardLogger(tmp_path, name="tb", version=0)
    _, _, trainer = fit(timed_loader(TimedDataset(240), batch_size=4), FAST, epochs=1, logger=logger)
    trainer.logger.experiment.flush()
    events = EventAccumulator(str(tmp_path / "tb" / "version_0"), size_guidance={"tensors": 0})
    events.Reload()
    assert "loadguard/auto_tune/text_summary" in events.Tags()["tensors"]
    text = events.Tensors("loadguard/auto_tune/text_summary")[0].tensor_proto.string_val[0].decode()
    assert "your settings" in text and "probe cost" in text


class SlowValidation(TimedModule):
    """Validation runs every 5 training steps and takes 50 ms: windows must not count it as loop time.

    Keeps its own clock of the epoch (first batch to last step's end) and of every validation run.
    """

    def __init__(self, step_s: float) -> None:
        super().__init__(step_s=step_s)
        self.validation_s: list[float] = []
        self.span: list[float] = []

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        time.sleep(0.05)

    def on_validation_start(self) -> None:
        self._validation_started = time.perf_counter()

    def on_validation_end(self) -> None:
        self.validation_s.append(time.perf_counter() - self._validation_started)

    def on_train_batch_end(self, outputs: Any, batch: Any, batch_idx: int) -> None:
        super().on_train_batch_end(outputs, batch, batch_idx)
        self.span = [self.span[0] if self.span else self._received_at, time.perf_counter()]


def test_validation_inside_the_epoch_does_not_count_as_loop_time() -> None:
    module = SlowValidation(step_s=0.008)
    _, guard, _ = fit(
        timed_loader(TimedDataset(240), batch_size=4),
        FAST,
        epochs=1,
        module=module,
        val_loader=timed_loader(TimedDataset(4), batch_size=4),
        val_check_interval=5,
        limit_val_batches=1,
        num_sanity_val_steps=0,
    )
    decision = guard.decision
    # Quiet, the fetch is under 5 % of the loop (compute_bound); on a busy host a descheduled fetch may make it a
    # probe (no_gain). Either way the user's window is the one judged here.
    assert decision is not None, guard.summary()
    # One 50 ms validation in every 5 steps of 8 ms (longer where other processes take the cores) would cut
    # the rate by about half. By the module's own clock, the rate without validation and the rate with it:
    # the measured rate must be the first, so nearer to it than to the second.
    steps = len(module.seen) // 4
    with_validation = steps / (module.span[1] - module.span[0])
    without = steps / (module.span[1] - module.span[0] - sum(module.validation_s))
    assert decision.throughput_before is not None
    assert decision.throughput_before > (with_validation + without) / 2, (decision.throughput_before, without)


class DiesUnderOtherWorkerCounts(TimedDataset):
    """A worker process dies (as if killed) after a few samples whenever the loader runs with a worker count
    other than one, while probing (``after_decision`` False) or once the tuner decided (True; a callback sets
    ``decided``, in shared memory): by then the training loop is busy in a step, where torch reports dead
    workers from its SIGCHLD handler unless told otherwise."""

    made = 0

    def __init__(self, after_decision: bool) -> None:
        super().__init__(480, sample_s=0.003)
        self.after_decision = after_decision
        self.decided = multiprocessing.get_context("fork").Value("b", 0)

    def __getitem__(self, index: int):
        info = get_worker_info()
        if info is not None and info.num_workers != 1 and bool(self.decided.value) == self.after_decision:
            type(self).made += 1
            if self.made > 2:
                os._exit(1)
        return super().__getitem__(index)


class _Decided(pl.Callback):
    def __init__(self, dataset: DiesUnderOtherWorkerCounts) -> None:
        self.dataset = dataset

    def on_train_batch_end(self, trainer: Any, *args: Any) -> None:
        guard = next(c for c in trainer.callbacks if isinstance(c, LoadGuard))
        if guard.decision is not None:
            self.dataset.decided.value = 1


@pytest.mark.slow
@pytest.mark.usefixtures("scripted")
@pytest.mark.parametrize("after_decision", [False, True], ids=["during-a-probe", "after-the-decision"])
def test_a_killed_worker_during_a_probe_reverts_and_no_sample_is_lost(after_decision: bool) -> None:
    # Scripted windows choose 4 workers (8 probed too). The workers of other counts than your 1 die while probing
    # (each such candidate is marked failed), or once the decision is made (it is undone). torch reports the death
    # as the worker having exited, or as the connection to it reset, by timing.
    def loader(dataset: DiesUnderOtherWorkerCounts) -> DataLoader:
        pl.seed_everything(11, verbose=False)
        return DataLoader(dataset, batch_size=4, num_workers=1, shuffle=True)

    untuned, _, _ = fit(loader(DiesUnderOtherWorkerCounts(after_decision)), False, epochs=1)
    dataset = DiesUnderOtherWorkerCounts(after_decision)
    tuned, guard, trainer = fit(loader(dataset), FAST, epochs=1, callbacks=[_Decided(dataset)])
    decision = guard.decision
    assert decision is not None and decision.num_workers == 1 and trainer.train_dataloader.num_workers == 1
    died = re.compile("exited unexpectedly|Connection reset")
    failed = [c for c in decision.candidates if c.failed]
    if after_decision:
        assert not failed and dataset.decided.value == 1, decision.table()
        assert "the chosen setting failed after probing" in decision.reason and died.search(decision.reason)
    else:
        assert failed and all(c.setting.num_workers != 1 and died.search(c.failed) for c in failed), decision.table()
        assert decision.verdict == "no_gain", decision.table()
    assert tuned == untuned


def test_a_short_epoch_says_what_would_tune_it_and_those_options_do() -> None:
    # 40 steps an epoch: the default windows (12 steps, 8 of probing allowed) do not fit.
    _, guard, _ = fit(io_bound(length=160), True, epochs=1)
    assert guard.decision is None
    message = next(m for m in guard.summary().splitlines() if "auto-tuning is off" in m)
    code = message.split("LoadGuard(auto_tune=")[1].split("), which")[0]
    options = eval(code, {"TuneOptions": TuneOptions})  # the message's own Python, as a user would paste it
    order, guard, _ = fit(io_bound(length=160), options, epochs=1)
    decision = guard.decision
    assert decision is not None and len(decision.candidates) >= 2, message
    assert decision.probe_steps <= decision.probe_budget_steps
    untuned, _, _ = fit(io_bound(length=160), False, epochs=1)
    assert order == untuned


def test_short_epochs_are_tuned_across_the_first_epochs_in_the_untuned_order() -> None:
    # 40 steps an epoch: epoch 0's probe share (8 steps) holds no 12-step window; two epochs' share (16) holds one,
    # and none of the four the fit runs holds five: the probing spans all four (32 steps).
    untuned, _, _ = fit(io_bound(length=160), False, epochs=4)
    tuned, guard, trainer = fit(io_bound(length=160), True, epochs=4)
    decision = guard.decision
    assert decision is not None and len(decision.candidates) >= 2, guard.summary()
    assert decision.probe_budget_steps == int(0.2 * 40 * 4)
    assert decision.probe_steps <= decision.probe_budget_steps
    # Probed with other settings across the epochs' boundaries; whether they measured faster depends on what
    # else the host runs (beside two spinning processes, 3 sleeping workers once read 4 % over 1), the order not.
    assert any(c.setting.num_workers > 1 for c in decision.candidates), decision.table()
    assert decision.verdict in ("improved", "no_gain"), decision.table()
    assert tuned == untuned  # every epoch, across the switches and the epoch boundaries
    assert trainer.train_dataloader.num_workers == decision.num_workers


@pytest.mark.slow  # 8 s of 16 workers starting; test_tuning_core.py weighs their start on figures by default
def test_workers_whose_start_outweighs_a_short_epoch_are_kept_and_the_epochs_run_faster() -> None:
    # 16 workers over 30-step epochs, each worker starting in 0.5 s (asleep, as a slow import or file open is):
    # every fresh epoch waits for that, its steps take about 0.2 s. Whatever the probes read of the counts (here
    # the windows are mostly served from batches made before them), persistent workers are turned on, and the
    # epochs after the decision run at least 1.8 times the first two, on the test's own clock: without the start
    # they take at most 0.2 / 0.7 of the time on a quiet host, and sleeping costs no core on a busy one.
    loader = timed_loader(
        TimedDataset(120, sample_s=0.01), batch_size=4, num_workers=16, shuffle=True, worker_init_fn=_slow_start
    )
    rates = EpochRates()
    _, guard, trainer = fit(loader, TuneOptions(), epochs=8, callbacks=[rates])
    decision = guard.decision
    assert decision is not None and decision.verdict != "not_tuned", decision and decision.table()
    assert decision.persistent_workers and trainer.train_dataloader.persistent_workers, decision.table()
    assert "persistent_workers turned on" in decision.reason or decision.num_workers != 16, decision.table()
    assert len(rates.rates) == 8
    before, after = fmean(rates.rates[:2]), fmean(rates.rates[-3:])
    assert after >= 1.8 * before, (rates.rates, decision.table())


class _PauseEachEpoch(pl.Callback):
    """Sleeps ``pause_s`` after each epoch's second step: the workers fill the buffer meanwhile."""

    def __init__(self, pause_s: float) -> None:
        self.pause_s = pause_s

    def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        if batch_idx == 1:
            time.sleep(self.pause_s)


@pytest.mark.slow  # 16 s: three 3 s pauses; test_tuning_sweep.py reads such windows on the simulator by default
def test_a_window_served_from_a_full_buffer_is_read_since_its_iterator_started(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # 16 workers make a batch in 0.5 s each; the loop pauses 3 s after each epoch's second step, so the buffer is
    # full when the window starts, and the window's 4 ms steps are all served from it before a worker makes
    # another (10 steps in 0.5 s: beside a second run of the suite, 0.2 s batches were too short for that once):
    # the window says nothing of the rate. Where it is a setting's first since its restart, it is read
    # over all that setting ran since its iterator started (the workers' start kept out): the steps, the pause
    # among them. Known costs bound that rate for your settings, whose iterator is the epoch's: at most n steps
    # in the pause plus 4 ms each, at least a quarter of n in the pause, the first batch's 0.5 s and the steps
    # (0, the window's own reading, fails). A probed setting's iterator starts at its switch, mid-epoch, whose
    # cost is not known here: at most one step per 4 ms. A window measured again joins the ones before it.
    step_s, pause_s, batch_s = 0.004, 3.0, 0.5
    reads: list[tuple[WindowSnapshot, WindowSnapshot]] = []
    measured = session_module.TuningSession._measured

    def spied(self: Any, port: Any, start: Any) -> WindowSnapshot:
        planner = self._planner
        read = measured(self, port, start)
        if planner is not None and not planner.continuing:  # measured again, a window joins the ones before it
            reads.append((self.monitor.snapshot(since=start).device_view(), read))
        return read

    monkeypatch.setattr(session_module.TuningSession, "_measured", spied)
    loader = timed_loader(TimedDataset(160, sample_s=batch_s / 4), batch_size=4, num_workers=16, shuffle=True)
    yours = settings_of(loader)
    options = TuneOptions(warmup_steps=2, window_steps=8)
    _, guard, _ = fit(loader, options, step_s=step_s, epochs=3, callbacks=[_PauseEachEpoch(pause_s)])
    assert guard.decision is not None, guard.decision
    served = [(window, read) for window, read in reads if window.steps and not window.measured_a_rate]
    first = [(w.steps, w.batches_made, w.settings) for w, _ in reads]
    assert any(read.settings == yours for _, read in served), first  # the case this test is about happened
    for window, read in served:
        assert read.steps > window.steps and read.measured_a_rate, (window.steps, read.steps, read.batches_made)
        if read.settings != yours:
            assert read.sustained_rate <= 1 / step_s, read
            continue
        fastest = read.steps / (pause_s + read.steps * step_s)
        assert fastest >= read.sustained_rate >= read.steps / (pause_s + batch_s + read.steps * step_s) / 4, read


@pytest.mark.parametrize("allowed", [True, False])
def test_a_decision_that_keeps_your_settings_turns_on_only_their_persistent_workers(
    monkeypatch: pytest.MonkeyPatch, allowed: bool, tmp_path: Path
) -> None:
    # Every setting measures alike, so nothing beats yours; worker start-up counts at any share of an epoch, so
    # your own workers' start turns persistent workers on, where the options allow it, and nothing else changes;
    # a resumed fit applies the stored decision to the loader before its first iterator.
    def alike(self: Any, port: Any, start: Any) -> WindowSnapshot:
        steps = self._window_steps
        window = WindowSnapshot(
            wait_s=(0.004,) * steps,
            step_s=(0.004,) * steps,
            production_s=(0.016,) * steps,
            settings=self._planner.current,
            host=HostFacts(cpu_count=8),
            batches_made=steps,
        )
        return window

    monkeypatch.setattr(session_module.TuningSession, "_measured", alike)
    # Starting any setting's workers takes 10 ms: this host's own start costs, which a busy host stretches, would
    # otherwise rate the settings apart over an epoch where persistent workers cannot be chosen.
    monkeypatch.setattr(session_module.TuningSession, "_startup_cost_s", lambda self: 0.01)
    options = replace(FAST, tune_persistent_workers=allowed, persistent_min_share=0.0)
    _, guard, trainer = fit(io_bound(), options, root=tmp_path)
    decision = guard.decision
    assert decision is not None and decision.verdict == "no_gain", decision and decision.table()
    assert decision.original.num_workers > 0 and not decision.original.persistent_workers
    assert decision.setting == replace(decision.original, persistent_workers=allowed)
    assert ("persistent_workers turned on" in decision.reason) is allowed
    assert sum("turned persistent_workers on" in said for said in guard._said) == int(allowed)
    assert trainer.train_dataloader.persistent_workers is allowed
    assert settings_of(trainer.train_dataloader) == replace(decision.original, persistent_workers=allowed)
    path = str(tmp_path / "kept.ckpt")
    trainer.save_checkpoint(path)
    at_start: list[bool] = []

    class PersistentAtStart(pl.Callback):
        def on_train_start(self, trainer: Any, pl_module: Any) -> None:
            at_start.append(trainer.train_dataloader.persistent_workers)

    _, resumed, _ = fit(io_bound(), options, epochs=3, callbacks=[PersistentAtStart()], ckpt_path=path, root=tmp_path)
    assert resumed.decision == decision and at_start == [allowed]


class _ProbedSteps(pl.Callback):
    """Steps trained, before the tuner's first decision, on a batch made under another ``num_workers`` than the
    user's: the probing as the loop lived it, counted apart from the tuner's own figures."""

    def __init__(self, guard: LoadGuard, user_workers: int) -> None:
        self.guard, self.user_workers, self.steps = guard, user_workers, 0

    def on_train_batch_start(self, trainer: Any, pl_module: Any, batch: Any, batch_idx: int) -> None:
        if self.guard.decision is None and set(batch[1][:, 0].tolist()) != {float(self.user_workers)}:
            self.steps += 1


@pytest.mark.usefixtures("scripted")
@pytest.mark.parametrize(("limit", "epoch_steps"), [(None, 200), (40, 40)])
def test_the_probe_budget_is_a_share_of_the_epoch_the_trainer_runs(limit: int | None, epoch_steps: int) -> None:
    # docs/architecture.md: the epoch's steps are the trainer's (limit_train_batches), not the loader's length.
    options = TuneOptions(warmup_steps=2, window_steps=6, tune_persistent_workers=False)
    guard = LoadGuard(print_summary=False, auto_tune=options)
    probed = _ProbedSteps(guard, user_workers=0)
    trainer = quiet_trainer(max_epochs=3, callbacks=[guard, probed], limit_train_batches=limit or 1.0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer.fit(TimedModule(), DataLoader(MadeByWorkers(800), batch_size=4))
    decision = guard.decision
    assert decision is not None and trainer.num_training_batches == epoch_steps
    spans = [span for span in (1, 2, 3) if decision.probe_budget_steps == int(options.probe_share * epoch_steps * span)]
    assert spans, (decision.probe_budget_steps, epoch_steps)
    # docs/tuning.md, "within probe_share": the steps the loop trained under other settings, counted from the
    # batches themselves, stay within the budget (a share of the epochs probing spanned), and they are the
    # decision's own count.
    assert 0 < probed.steps <= decision.probe_budget_steps, (probed.steps, decision.probe_budget_steps)
    assert decision.probe_steps == probed.steps


def _slow_start(worker_id: int) -> None:
    time.sleep(0.5)


@pytest.mark.slow
def test_workers_that_take_long_to_start_are_kept_across_epochs() -> None:
    # Each worker starts in 0.5 s (its init function) after a fork that takes milliseconds; an epoch runs
    # about 5 s. The start-up the tuner weighs is the fork and the workers' start after it, however much of it
    # the loop trained through, so the init alone makes it more than persistent_min_share of an epoch. The
    # first decision is the one checked (no re-tune after it). Persistence is weighed whatever the verdict: on a
    # busy host the counts can measure apart by less than the noise, and the start cost still holds.
    pl.seed_everything(11, verbose=False)
    loader = timed_loader(
        TimedDataset(4000, sample_s=0.003), batch_size=4, num_workers=1, shuffle=True, worker_init_fn=_slow_start
    )
    options = replace(FAST, tune_persistent_workers=True, retune=False)
    _, guard, trainer = fit(loader, options)
    decision = guard.decision
    assert decision is not None and decision.verdict in ("improved", "no_gain"), decision and decision.table()
    assert guard._tuner is not None
    assert guard._tuner._session._startup_cost_s() >= 0.5
    assert decision.persistent_workers and trainer.train_dataloader.persistent_workers


class _FailsUnder(MadeByWorkers):
    """Each sample carries the ``num_workers`` that made it; raises in a worker under ``fail_under`` workers, or,
    once ``failing`` (shared memory, seen by live workers) is set, under any count but ``kept``."""

    def __init__(self, fail_under: int = -1, kept: int = 1) -> None:
        super().__init__(480, sample_s=0.0005)  # scripted windows: the timing is not what is tested
        self.fail_under, self.kept = fail_under, kept
        self.failing = multiprocessing.get_context("fork").Value("b", 0)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        info = get_worker_info()
        workers = info.num_workers if info is not None else 0
        if workers == self.fail_under or (self.failing.value and workers != self.kept):
            raise RuntimeError(f"simulated: a worker failed under num_workers={workers}")
        return super().__getitem__(index)


class _MadeByPerStep(pl.Callback):
    """The ``num_workers`` that made each batch trained, in order (the batches' own record); with ``fail_after``
    set, makes the dataset fail from the first step after the tuner's decision."""

    def __init__(self, guard: LoadGuard | None = None, fail_after: _FailsUnder | None = None) -> None:
        self.guard, self.fail_after = guard, fail_after
        self.made: list[int] = []

    def on_train_batch_start(self, trainer: Any, pl_module: Any, batch: Any, batch_idx: int) -> None:
        workers = set(batch[1][:, 0].tolist())
        assert len(workers) == 1
        self.made.append(int(workers.pop()))

    def on_train_batch_end(self, *args: Any) -> None:
        if self.fail_after is not None and self.guard is not None and self.guard.decision is not None:
            self.fail_after.failing.value = 1


def _failing_loader(dataset: _FailsUnder) -> DataLoader:
    pl.seed_everything(11, verbose=False)
    return DataLoader(dataset, batch_size=4, num_workers=1, shuffle=True)


@pytest.mark.usefixtures("scripted")
def test_a_failing_probe_restarts_at_the_fastest_setting_measured_so_far(monkeypatch: pytest.MonkeyPatch) -> None:
    # Scripted windows: your 1 worker, then 4 (three times as fast), then 8, whose workers raise. The loader goes
    # on at 4 workers, the fastest measured so far, not at yours: the batch the loop trains right after the switch
    # to 8 was made by 4 workers (the batches' own record).
    untuned, _, _ = fit(_failing_loader(_FailsUnder(fail_under=8)), False, epochs=1)
    made = _MadeByPerStep()
    restarts: list[tuple[int | None, int]] = []
    restart = session_module.restart_iterator

    def recorded(*args: Any, **kwargs: Any) -> Any:
        restarts.append((kwargs.get("num_workers"), len(made.made)))
        return restart(*args, **kwargs)

    monkeypatch.setattr(session_module, "restart_iterator", recorded)
    tuned, guard, _ = fit(_failing_loader(_FailsUnder(fail_under=8)), FAST, epochs=1, callbacks=[made])
    decision = guard.decision
    assert decision is not None
    failed = [c for c in decision.candidates if c.failed]
    assert [c.setting.num_workers for c in failed] == [8], decision.table()
    at = next(steps for workers, steps in restarts if workers == 8)
    assert made.made[at - 1] == 4 and made.made[at] == 4, (made.made, restarts)
    assert tuned == untuned


@pytest.mark.usefixtures("scripted")
def test_the_chosen_setting_failing_later_in_its_epoch_goes_back_to_yours() -> None:
    # Scripted windows choose 4 workers; from the step after the decision, every count but your 1 raises. The loader
    # goes back to your settings from the same batch, the decision says so, and no sample is lost or repeated.
    untuned, _, _ = fit(_failing_loader(_FailsUnder()), False, epochs=1)
    dataset = _FailsUnder()
    guard_box: list[LoadGuard] = []

    class FindsTheGuard(pl.Callback):  # the guard is made inside fit(): found on the trainer
        def on_train_start(self, trainer: Any, pl_module: Any) -> None:
            guard_box.append(next(c for c in trainer.callbacks if isinstance(c, LoadGuard)))
            made.guard = guard_box[0]

    made = _MadeByPerStep(fail_after=dataset)
    tuned, guard, trainer = fit(_failing_loader(dataset), FAST, epochs=1, callbacks=[FindsTheGuard(), made])
    decision = guard.decision
    assert decision is not None and dataset.failing.value == 1
    assert any(c.setting.num_workers == 4 for c in decision.candidates), decision.table()
    assert decision.verdict == "no_gain" and "the chosen setting failed after probing" in decision.reason
    assert "your settings are back" in decision.reason, decision.reason
    assert 4 in made.made and made.made[-1] == 1 and trainer.train_dataloader.num_workers == 1
    assert tuned == untuned


class _WorkersAtStart(pl.Callback):
    def __init__(self) -> None:
        self.workers: int | None = None

    def on_train_start(self, trainer: Any, pl_module: Any) -> None:
        self.workers = trainer.train_dataloader.num_workers


@pytest.mark.usefixtures("scripted")
def test_a_resumed_loader_whose_settings_changed_keeps_them_and_says_why(tmp_path: Path) -> None:
    _, first, trainer = fit(io_bound(), FAST, epochs=1, root=tmp_path)
    decision = first.decision
    assert decision is not None and decision.original.num_workers == 1 and decision.num_workers not in (1, 2)
    path = str(tmp_path / "tuned.ckpt")
    trainer.save_checkpoint(path)
    at_start = _WorkersAtStart()
    _, resumed, _ = fit(io_bound(workers=2), FAST, callbacks=[at_start], ckpt_path=path, root=tmp_path)
    assert at_start.workers == 2  # the loader's own settings, not the decision's
    said = [n for n in resumed._said if "was made for workers=1 prefetch=2" in n]
    assert len(said) == 1 and "your settings are kept" in said[0], sorted(resumed._said)


@pytest.mark.usefixtures("scripted")
def test_a_0_1_0_checkpoint_applies_its_decision_and_does_not_watch_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A checkpoint from 0.1.0 stores the decision without what it measured (no "watch"): the resumed fit applies
    # it before the first iterator and never reads a window against it. The same checkpoint with its watch kept
    # is watched (the control: the watch does run in such a resume).
    from lightning_loadguard.tuning.watch import DecisionWatch

    reads: list[int] = []
    record = DecisionWatch.record

    def counted(self: Any, window: Any) -> Any:
        reads.append(1)
        return record(self, window)

    monkeypatch.setattr(DecisionWatch, "record", counted)
    _, first, trainer = fit(io_bound(), FAST, epochs=1, root=tmp_path)
    assert first.decision is not None
    watched = str(tmp_path / "watched.ckpt")
    trainer.save_checkpoint(watched)
    checkpoint = torch.load(watched, weights_only=False)
    key = next(k for k in checkpoint["callbacks"] if k.startswith("LoadGuard"))
    state = checkpoint["callbacks"][key]["tuner"]
    assert "watch" in state
    old = {"version": state["version"], "decision": dict(state["decision"], num_workers=3, prefetch_factor=2)}
    checkpoint["callbacks"][key]["tuner"] = old
    from_0_1_0 = str(tmp_path / "from_0_1_0.ckpt")
    torch.save(checkpoint, from_0_1_0)
    reads.clear()
    at_start = _WorkersAtStart()
    # The watch reads a window at each logging step: the trainer logs often enough for it in either resume.
    often = {"epochs": 2, "root": tmp_path, "log_every_n_steps": 5}
    _, resumed, _ = fit(io_bound(), FAST, callbacks=[at_start], ckpt_path=from_0_1_0, **often)
    assert at_start.workers == 3 and resumed.decision is not None and resumed.decision.num_workers == 3
    assert reads == [] and resumed.decision.retunes == 0
    assert not any("probes again" in n for n in resumed._said)
    fit(io_bound(), FAST, ckpt_path=watched, **often)
    assert reads, "the watched checkpoint's resume read no window: the control did not run"


def _starts_slowly(worker_id: int) -> None:
    time.sleep(0.25)


class _StepClock(pl.Callback):
    """Per step trained: when it ended (after LoadGuard's hook, so a switch it made counts in its step), the
    ``num_workers`` that made its batch (the batches' own record), and whether a decision existed then."""

    def __init__(self) -> None:
        self.ended: list[float] = []
        self.made: list[int] = []
        self.decided: list[bool] = []

    def on_train_batch_start(self, trainer: Any, pl_module: Any, batch: Any, batch_idx: int) -> None:
        workers = set(batch[1][:, 0].tolist())
        assert len(workers) == 1
        self.made.append(int(workers.pop()))

    def on_train_batch_end(self, trainer: Any, *args: Any) -> None:
        self.ended.append(time.perf_counter())
        guard = next(c for c in trainer.callbacks if isinstance(c, LoadGuard))
        self.decided.append(guard.decision is not None)


def test_the_probe_cost_is_the_probed_steps_time_over_the_chosen_rate_on_the_tests_clock() -> None:
    # docs/tuning.md, Probe cost: the table ends with the time the probe steps cost over running them at the chosen
    # setting's rate. Every worker takes 0.25 s to start, so each probe's switch costs a clear share of that time.
    # The test's own figure: the probed steps' durations, minus the probe steps at the rate the chosen setting ran
    # the second epoch at. Lightning fetches a batch one step ahead, so step k's duration (its wait included) goes
    # to the setting that made batch k + 1.
    clock = _StepClock()
    pl.seed_everything(11, verbose=False)
    loader = DataLoader(
        MadeByWorkers(480, sample_s=0.003), batch_size=4, num_workers=1, shuffle=True, worker_init_fn=_starts_slowly
    )
    options = replace(FAST, retune=False)
    _, guard, _ = fit(loader, options, callbacks=[clock])
    decision = guard.decision
    assert decision is not None and decision.probe_steps > 0, decision and decision.table()
    epoch = 480 // 4
    assert len(clock.ended) == 2 * epoch and all(clock.decided[epoch:])
    user = decision.original.num_workers
    # Step i ran from the end of step i - 1 to its own; it is probing where the decision did not exist at its end
    # and the batch it fetched ahead, i + 1, was made under another count than yours.
    probed = sum(
        clock.ended[i] - clock.ended[i - 1]
        for i in range(1, epoch)
        if not clock.decided[i] and clock.made[i + 1] != user
    )
    steady = [clock.ended[i] - clock.ended[i - 1] for i in range(epoch + 5, 2 * epoch)]  # past its workers' start
    assert set(clock.made[epoch:]) == {decision.num_workers}
    rate = len(steady) / sum(steady)
    own = probed - decision.probe_steps / rate
    assert own > 0.25, (own, decision.table())  # at least one worker start: the figure is not noise
    assert abs(decision.probe_cost_s - own) <= 0.5 * own + 0.1, (decision.probe_cost_s, own, decision.table())
    assert f"; {decision.probe_cost_s:.2f} s more than running those steps at the chosen setting's rate" in (
        decision.table()
    )


class _BurstyShards(IterableDataset):
    """Shards by worker through ``get_worker_info()``; every 8th sample a worker makes takes 20 ms (a burst). Each
    sample carries the ``num_workers`` and ``prefetch_factor`` of the iterator whose worker made it, read in the
    worker from the loader as it was when that iterator forked it."""

    def __init__(self, length: int) -> None:
        self.length = length
        self.loader: DataLoader | None = None

    def __iter__(self) -> Any:
        info = get_worker_info()
        assert info is not None and self.loader is not None, "read by workers only"
        for made, i in enumerate(range(info.id, self.length, info.num_workers)):
            if made % 8 == 7:
                time.sleep(0.02)
            x = torch.zeros(16)
            x[0], x[1] = float(info.num_workers), float(self.loader.prefetch_factor)
            yield torch.tensor(i), x


def _bursty_window(self: Any, port: Any, start: Any) -> WindowSnapshot:
    """Scripted: a 10 ms step, and batches made in 4 ms but every 8th in 80 ms; the buffer replay wants depth 4."""
    steps = 40
    return WindowSnapshot(
        wait_s=(0.0,) * steps,
        step_s=(0.01,) * steps,
        production_s=tuple(0.08 if k % 8 == 7 else 0.004 for k in range(steps)),
        settings=self._planner.current,
        host=HostFacts(cpu_count=8),
        batches_made=steps,
    )


def test_an_iterable_with_workers_gets_the_deeper_prefetch_from_the_next_epoch_and_keeps_its_workers(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # docs/tuning.md (IterableDataset) and docs/loaders.md (tune): only the prefetch depth may change, applied from
    # the next epoch (model_only). By the batches' own record: epoch 0 made at your depth, epoch 1 at the
    # decision's, every batch by your two workers, every sample once per epoch.
    monkeypatch.setattr(session_module.TuningSession, "_measured", _bursty_window)
    length = 160
    dataset = _BurstyShards(length)
    loader = dataset.loader = DataLoader(dataset, batch_size=4, num_workers=2)
    made = _MadeByPerStep()
    made_prefetch: list[int] = []

    class Prefetch(pl.Callback):
        def on_train_batch_start(self, trainer: Any, pl_module: Any, batch: Any, batch_idx: int) -> None:
            depths = set(batch[1][:, 1].tolist())
            assert len(depths) == 1
            made_prefetch.append(int(depths.pop()))

    seen, guard, trainer = fit(loader, FAST, epochs=2, callbacks=[made, Prefetch()])
    decision = guard.decision
    assert decision is not None and decision.verdict == "model_only", decision and decision.table()
    assert decision.prefetch_factor is not None and decision.prefetch_factor > 2, decision.table()
    assert decision.num_workers == 2 and trainer.train_dataloader.num_workers == 2
    epoch = length // 4
    assert len(made_prefetch) == len(made.made) == 2 * epoch
    assert set(made_prefetch[:epoch]) == {2}, made_prefetch  # your depth all through epoch 0
    assert set(made_prefetch[epoch:]) == {decision.prefetch_factor}, made_prefetch
    assert set(made.made) == {2}
    assert sorted(seen[: 4 * epoch]) == sorted(seen[4 * epoch :]) == list(range(length))


class TailedReads(torch.utils.data.Dataset):
    """A sample index and 16 zeros, read in 1 ms."""

    def __init__(self, length: int) -> None:
        self.length = length

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        time.sleep(0.001)
        return torch.tensor(index), torch.zeros(16)


def tailed_window(session: Any, port: Any, start: Any) -> WindowSnapshot:
    """The window a setting measures where each worker reads a batch in a Pareto-distributed time (index 1.5, mean
    10 ms: most under 5 ms, one in a hundred over 70 ms) waiting, not computing, against a 4 ms step; the draws are
    seeded by the windows measured before, so every run measures alike. A window of a few dozen reads shows the tail
    and rarely its longest, and a live fit on a loaded host reads the tail lighter than it is (reads cut at a
    window's end are in no window), so the figures are scripted and the loader, its switches and its order are
    real."""
    planner = session._planner
    setting = planner.current if planner is not None else settings_of(session._loader)
    steps = session._window_steps if planner is not None else session._watch_steps
    draws = random.Random(len(planner.results) if planner is not None else -1)
    production = tuple((0.01 / 3) * (1 - draws.random()) ** (-1 / 1.5) for _ in range(steps))
    return window_of(setting, steps, production, cpu_share=0.01)


@pytest.mark.slow  # the depth itself is test_tuning_core's; this is the fit that applies it
def test_heavy_tailed_reads_run_at_the_depth_the_tail_asks_for_in_the_untuned_order(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Your reads in the main process; at most 4 workers, which keep up with the step (400 reads/s): the tail of the
    # reads measured asks for more than their 8 batches in flight.
    monkeypatch.setattr(session_module.TuningSession, "_measured", tailed_window)
    options = TuneOptions(warmup_steps=2, window_steps=12, tune_persistent_workers=False, max_workers=4)

    def loader() -> DataLoader:
        pl.seed_everything(11, verbose=False)
        return DataLoader(TailedReads(400), batch_size=1, num_workers=0, shuffle=True)

    untuned, _, _ = fit(loader(), False)
    tuned, guard, trainer = fit(loader(), options)
    decision = guard.decision
    assert decision is not None and decision.verdict == "improved", decision and decision.table()
    measured = {c.setting.prefetch_factor for c in decision.candidates if c.setting.num_workers == decision.num_workers}
    assert decision.prefetch_factor > max(measured) and "tail" in decision.reason, decision.table()
    assert trainer.train_dataloader.prefetch_factor == decision.prefetch_factor
    assert trainer.train_dataloader.num_workers == decision.num_workers
    assert tuned == untuned  # both epochs: the switch to the deeper buffer mid-epoch loses and repeats nothing
    assert guard._tuner is not None and guard._tuner._session._reference is not None  # the decision is watched
