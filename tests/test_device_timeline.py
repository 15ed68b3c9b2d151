"""The device timeline against a simulated asynchronous device whose work has known durations.

Each scenario drives the meters the way the Lightning adapter does (fetch, copy, step, callbacks) and
compares the device's figures with a truth the meters did not compute: the durations given to the device,
the test's own clock around the loop, the time a callback spent. Each also shows the host's figure for the
same quantity, and that it is wrong on an asynchronous device.
"""

from __future__ import annotations

import math
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from statistics import fmean, median
from typing import Any

import lightning.pytorch as pl
import pytest
import torch
from pipelines import LoopClock, quiet_trainer
from sim_device import SimDevice

from lightning_loadguard import TuneOptions
from lightning_loadguard.callback import LoadGuard
from lightning_loadguard.meters.consumer import ConsumerMeter
from lightning_loadguard.meters.device import DeviceTimeline
from lightning_loadguard.meters.window import HostFacts, LoaderSettings, WindowSnapshot
from lightning_loadguard.model.diagnosis import WAIT_OK, diagnose


@dataclass
class Run:
    host: WindowSnapshot
    device: WindowSnapshot
    timeline: DeviceTimeline
    wall_s: float
    steps: int
    syncs_in_loop: int
    fetch_started_at: list[float] = field(default_factory=list)

    @property
    def device_step_ms(self) -> float:
        # The median: a host preempted between recording a step's start and launching its work leaves the
        # device idle inside that step, which the device's clock rightly counts; the typical step is exact.
        return median(self.device.device_step_s) * 1e3

    def fraction(self, spans: tuple[float, ...]) -> float:
        return sum(spans) / self.device.device_period_s


def run_loop(
    device: SimDevice,
    steps: int,
    *,
    fetch_s: Callable[[int], float],
    kernel_s: float,
    copy_s: float = 0.0,
    pinned: bool = True,
    after_step: Callable[[int], None] | None = None,
    max_pending: int = 16,
) -> Run:
    """A training loop with an in-process loader (each fetch sleeps its production time)."""
    consumer = ConsumerMeter(window=steps)
    timeline = DeviceTimeline(device.event, window=steps, max_pending=max_pending)
    start = time.perf_counter()
    fetch_started_at = []
    for n in range(steps):
        fetch_started_at.append(time.perf_counter())
        consumer.fetch_started(fetch_started_at[-1])
        timeline.fetch_started()
        if fetch_s(n) > 0:
            time.sleep(fetch_s(n))
        consumer.fetch_finished(time.perf_counter())
        timeline.fetch_finished()
        device.copy(copy_s, pinned=pinned)
        timeline.batch_on_device()
        consumer.step_started(time.perf_counter())
        device.launch(kernel_s)
        timeline.step_ended()
        if after_step is not None:
            after_step(n)
    consumer.close_step(time.perf_counter())
    wall = time.perf_counter() - start
    syncs = device.total_syncs
    device.synchronize()  # the test's own wait, after the measured loop, so the last steps can be read
    timeline.poll()
    records = consumer.records()
    dev = timeline.records()
    host = WindowSnapshot(
        wait_s=tuple(r.wait_s for r in records),
        step_s=tuple(r.step_s for r in records),
        transfer_s=tuple(r.transfer_s for r in records),
        settings=LoaderSettings(num_workers=0),
        host=HostFacts(cpu_count=8),
    )
    on_device = WindowSnapshot(
        wait_s=host.wait_s,
        step_s=host.step_s,
        transfer_s=host.transfer_s,
        settings=host.settings,
        host=host.host,
        device_step_s=tuple(r.step_s for r in dev),
        device_data_idle_s=tuple(r.data_idle_s for r in dev),
        device_loop_idle_s=tuple(r.loop_idle_s for r in dev),
        device_copy_s=tuple(r.copy_s for r in dev),
    )
    return Run(host, on_device, timeline, wall, steps, syncs, fetch_started_at)


def test_host_ahead_with_a_bursty_loader_waits_but_the_device_never_idles() -> None:
    # Every 4th batch takes 60 ms to make; a .item() every 4 steps (a progress-bar refresh) lets the host
    # run up to 3 steps (120 ms of device work) ahead, which hides the slow batch from the device.
    device = SimDevice()
    run = run_loop(
        device,
        24,
        fetch_s=lambda n: 0.06 if n % 4 == 3 else 0.0,
        kernel_s=0.04,
        after_step=lambda n: device.item() if n % 4 == 3 else None,
    )
    assert len(run.device.device_step_s) == run.steps - 1  # every step after the first is read
    data_idle = run.fraction(run.device.device_data_idle_s)
    # The host waited for data a third of its time; the device idled for none of it.
    assert run.host.wait_fraction > 0.25
    assert data_idle < 0.02
    assert run.device.device_idle_fraction is not None and run.device.device_idle_fraction < run.host.wait_fraction / 3
    # The device's step is the kernels' 40 ms; the host's "step" is launches and a sync, 25 ms on average.
    assert 40.0 - 1e-6 <= run.device_step_ms < 45.0
    assert run.host.mean_step_s * 1e3 < 35.0
    # The failing case of the host's figures: they name a producer deficit that costs the device nothing.
    on_host = diagnose(run.host)
    assert on_host.verdict == "producer_deficit"
    on_device = diagnose(run.device)
    assert on_device.finding("producer_deficit") is None and on_device.finding("bursty") is None
    assert on_device.findings[-1].evidence["clock"] == "device"


def test_a_slow_loader_idles_the_device_by_the_deficit() -> None:
    # 50 ms to make a batch, 20 ms of device work: the device idles about 30 ms per step, the host waits 50.
    device = SimDevice()
    run = run_loop(device, 20, fetch_s=lambda n: 0.05, kernel_s=0.02)
    busy = 0.02
    truth_idle = run.wall_s / run.steps - busy  # the test's own clock less the known device work
    idle = run.device.device_idle_s / len(run.device.device_step_s)
    assert idle == pytest.approx(truth_idle, rel=0.15, abs=0.003)
    # All of it is the loader's: nothing else kept the device waiting.
    assert fmean(run.device.device_data_idle_s) > 0.9 * idle
    assert fmean(run.device.device_loop_idle_s) < 0.1 * idle
    assert 20.0 - 1e-6 <= run.device_step_ms < 25.0
    # The host's wait counts the 20 ms the device still had queued when the fetch began: 60 % too high.
    assert run.host.mean_wait_s > 1.3 * truth_idle
    d = diagnose(run.device)
    assert d.verdict == "producer_deficit"
    assert d.finding("producer_deficit").evidence["wait_fraction"] == pytest.approx(
        run.fraction(run.device.device_data_idle_s)
    )


def test_a_synchronising_callback_idles_the_device_and_the_idle_is_the_loops() -> None:
    # After each step a callback turns a tensor into a number (.item(): the host waits for the device),
    # then spends 30 ms on the host (logging). The device idles from the moment it drained until the host
    # comes back to fetch the next batch; the loader is instant.
    device = SimDevice()
    drained: list[float] = []

    def log_metrics(n: int) -> None:
        device.item()
        drained.append(device.drained_at())
        time.sleep(0.03)

    run = run_loop(device, 20, fetch_s=lambda n: 0.0, kernel_s=0.03, after_step=log_metrics)
    truth = fmean(f - d for d, f in zip(drained, run.fetch_started_at[1:], strict=False))
    loop_idle = fmean(run.device.device_loop_idle_s)
    assert loop_idle == pytest.approx(truth, rel=0.1, abs=0.002)
    assert loop_idle >= 0.03
    assert run.fraction(run.device.device_data_idle_s) < WAIT_OK
    assert run.fraction(run.device.device_loop_idle_s) > 0.3
    # The host's figures cannot show this: to the host those 30 ms are step time like any other.
    assert diagnose(run.host).finding("loop_overhead") is None
    d = diagnose(run.device)
    assert d.verdict == "loop_overhead"
    assert d.findings[0].evidence["loop_idle_ms"] == pytest.approx(loop_idle * 1e3)


def test_pageable_copy_blocks_the_host_but_the_device_sees_the_copy() -> None:
    # A 10 ms copy before a 30 ms step, a sync every 4 steps. Pageable: the host waits for the queue in front
    # of the copy (the previous step's kernels) and calls that "transfer"; pinned: the host sees no transfer.
    # The device's copy is 10 ms either way, a quarter of its time; pageable, the device also idles from the
    # copy's end until the blocked host wakes and launches the step, which the device's figure includes.
    def sync_every_4(device: SimDevice) -> Callable[[int], None]:
        return lambda n: device.item() if n % 4 == 3 else None

    figures = {}
    for pinned in (False, True):
        device = SimDevice()
        run = run_loop(
            device,
            16,
            fetch_s=lambda n: 0.0,
            kernel_s=0.03,
            copy_s=0.01,
            pinned=pinned,
            after_step=sync_every_4(device),
        )
        copy = median(run.device.device_copy_s)
        assert 0.010 - 1e-9 <= copy < (0.012 if pinned else 0.025)
        figures[pinned] = (fmean(run.host.transfer_s), copy, run)
        d = diagnose(run.device)
        assert d.verdict == "transfer_bound"
        assert d.findings[0].evidence["transfer_fraction"] >= 0.2
    assert figures[False][0] > 1.5 * figures[False][1]  # the host overstates the copy...
    assert figures[True][0] < 0.5 * figures[True][1]  # ...or does not see it at all
    assert diagnose(figures[True][2].host).finding("transfer_bound") is None


def test_reading_the_timeline_never_synchronises_the_device() -> None:
    # A fast loader and no sync in the loop: the host runs far ahead of the device. The meter must neither
    # wait for events (no synchronisation) nor read one the device has not passed (that would raise).
    device = SimDevice()
    run = run_loop(device, 30, fetch_s=lambda n: 0.0, kernel_s=0.01, max_pending=4)
    assert run.syncs_in_loop == 0
    assert run.wall_s < 0.5 * device.busy_s  # the host was never held back by the device
    assert run.timeline.skipped_steps > 0  # beyond 4 pending steps, steps go unmeasured rather than waited for
    assert run.timeline.events_made <= 4 * (4 + 2)  # the pool stays small and is reused
    assert device.queries <= 4 * run.steps  # about one query per step, plus the reads


def test_loadguards_timeline_leaves_a_step_unmeasured_once_the_host_is_16_steps_ahead() -> None:
    # docs/concepts.md: a step is left unmeasured when the host is more than 16 steps ahead of the device, never
    # waited for. The timeline LoadGuard attaches, driven by hand: each step queues 10 s of (simulated) work, so
    # the device passes none of them while the test runs.
    device = SimDevice()
    guard = LoadGuard()
    guard._monitor.attach_device(device.event)
    timeline = guard._monitor._timeline
    assert timeline is not None

    def step() -> None:
        timeline.fetch_started()
        timeline.fetch_finished()
        timeline.batch_on_device()
        device.launch(10.0)
        timeline.step_ended()

    for _ in range(16):
        step()
    assert (timeline.lag_steps, timeline.skipped_steps) == (16, 0)
    step()  # the 17th: 16 steps ahead already
    assert timeline.lag_steps == 16 and timeline.skipped_steps == 1
    step()  # and the 18th: each unmeasured step counts once (it begins at its fetch's start and again at its end)
    assert timeline.lag_steps == 16 and timeline.skipped_steps == 2
    assert device.total_syncs == 0


def test_the_meter_steady_state_reads_each_step_once_with_few_events() -> None:
    device = SimDevice()
    run = run_loop(device, 40, fetch_s=lambda n: 0.002, kernel_s=0.001)
    assert run.syncs_in_loop == 0
    assert run.timeline.skipped_steps == 0
    assert len(run.timeline.records()) == run.steps - 1
    assert run.timeline.events_made <= 12


def test_break_chain_drops_the_idle_of_the_step_after_it() -> None:
    device = SimDevice()
    timeline = DeviceTimeline(device.event, window=10)
    for n in range(4):
        timeline.fetch_started()
        timeline.fetch_finished()
        timeline.batch_on_device()
        device.launch(0.001)
        timeline.step_ended()
        if n == 1:
            timeline.break_chain()  # e.g. validation ran here
            time.sleep(0.02)
    device.synchronize()
    timeline.poll()
    records = timeline.records()
    assert len(records) == 2  # step 0 has no predecessor, step 2 follows the break
    assert all(r.idle_s < 0.015 for r in records)


def test_device_timeline_refuses_bad_arguments() -> None:
    with pytest.raises(ValueError, match="window"):
        DeviceTimeline(SimDevice().event, window=0)
    with pytest.raises(ValueError, match="max_pending"):
        DeviceTimeline(SimDevice().event, window=3, max_pending=0)


# -- the Lightning adapter, with the simulated device where CUDA events would be ---------------------------


class _SleepyData(torch.utils.data.Dataset):
    def __init__(self, n: int, seconds: float) -> None:
        self.n, self.seconds = n, seconds

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> torch.Tensor:
        if self.seconds:
            time.sleep(self.seconds)
        return torch.ones(2)


class _DeviceModule(pl.LightningModule):
    """Each step queues ``kernel_s`` of work on the simulated device, as a CUDA model's step queues kernels."""

    def __init__(self, device: SimDevice, kernel_s: float) -> None:
        super().__init__()
        self.sim, self.kernel_s = device, kernel_s
        self.layer = torch.nn.Linear(2, 1)

    def training_step(self, batch: torch.Tensor, batch_idx: int) -> torch.Tensor:
        self.sim.launch(self.kernel_s)
        return self.layer(batch).sum()

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.01)


class _SyncingLogger(pl.Callback):
    """A callback listed after LoadGuard that reads a device value every ``every`` steps, then works on the host."""

    def __init__(self, device: SimDevice, host_s: float, every: int = 1) -> None:
        self.sim, self.host_s, self.every = device, host_s, every

    def on_train_batch_end(self, trainer: pl.Trainer, module: object, outputs: object, batch: object, i: int) -> None:
        if i % self.every == self.every - 1:
            self.sim.item()
            if self.host_s:
                time.sleep(self.host_s)


class _BurstyData(_SleepyData):
    def __getitem__(self, i: int) -> torch.Tensor:
        if i % 4 == 3:
            time.sleep(self.seconds)
        return torch.ones(2)


def _fit(
    device: SimDevice | None,
    fetch_s: float,
    kernel_s: float,
    *extra: pl.Callback,
    data: type[_SleepyData] = _SleepyData,
    steps: int = 26,
    before: tuple[pl.Callback, ...] = (),
    **guard_kwargs: Any,
) -> tuple[LoadGuard, float]:
    """Fit ``steps`` steps; returns the callback and the device's true idle share over its last window.

    ``extra`` callbacks are listed after LoadGuard, ``before`` ones before it."""
    guard = LoadGuard(window=12, log_every_n_steps=4, print_summary=False, **guard_kwargs)
    if device is not None:
        guard._device_events = device.event
    module = _DeviceModule(device or SimDevice(), kernel_s)
    loader = torch.utils.data.DataLoader(data(steps, fetch_s), batch_size=1)
    clock = LoopClock()
    quiet_trainer(max_epochs=1, callbacks=[*before, guard, *extra, clock]).fit(module, loader)
    return guard, 1.0 - kernel_s / clock.period(12)


def test_with_a_device_timeline_the_transfer_is_timed_on_every_step() -> None:
    """docs/metrics.md: on an accelerator's timeline ``transfer_ms`` is timed on every step (the host's view times it
    on a sample of steps)."""
    guard, _ = _fit(SimDevice(), 0.01, 0.005)
    transfers = guard.snapshot.transfer_s
    assert len(transfers) == 12, transfers
    assert not any(math.isnan(t) for t in transfers), transfers


def test_trainer_with_a_simulated_device_measures_the_loaders_idle_on_the_device() -> None:
    device = SimDevice()
    guard, truth = _fit(device, 0.04, 0.015)
    m = guard.metrics
    # 40 ms per batch against 15 ms of device work: the device idles about 25 of every 40 ms, waiting for data.
    assert m["loadguard/device_idle_fraction"] == pytest.approx(truth, abs=0.08)
    assert m["loadguard/device_data_idle_fraction"] > 0.85 * m["loadguard/device_idle_fraction"]
    assert m["loadguard/wait_fraction"] > m["loadguard/device_data_idle_fraction"] + 0.15  # the host's figure
    assert guard.snapshot is not None
    assert 15.0 - 1e-6 <= median(guard.snapshot.device_step_s) * 1e3 < 20.0
    # The logged step and copy on the device's clock: the 15 ms of work (a mean: a first step may run longer), and
    # no copy (this module moves nothing to the device).
    assert 15.0 - 1e-6 <= m["loadguard/device_step_ms"] < 20.0
    assert m["loadguard/device_transfer_ms"] == pytest.approx(0.0, abs=1.0)
    assert m["loadguard/consumer_rate"] < 1 / 0.015  # from the device's step, not the host's launches
    # docs/concepts.md: throughput = steps / the device's period, here the 40 ms fetch's pace on the test's clock
    # (the true idle share is 1 - 15 ms / period).
    assert m["loadguard/throughput"] == pytest.approx((1.0 - truth) / 0.015, rel=0.15)
    assert guard.diagnosis is not None and guard.diagnosis.verdict == "producer_deficit"
    assert device.total_syncs == 0  # measuring added no synchronisation to any step


def test_trainer_with_a_simulated_device_names_a_syncing_callback_as_loop_overhead() -> None:
    device = SimDevice()
    guard, truth = _fit(device, 0.0, 0.02, _SyncingLogger(device, 0.02))
    m = guard.metrics
    assert m["loadguard/device_loop_idle_fraction"] == pytest.approx(truth, abs=0.08)
    assert m["loadguard/device_loop_idle_fraction"] > 0.3
    assert m["loadguard/device_data_idle_fraction"] < WAIT_OK
    assert guard.diagnosis is not None and guard.diagnosis.verdict == "loop_overhead"
    # The fix is in the loop's code (the .item() each step), not in the loader's settings.
    overhead = guard.diagnosis.findings[0]
    assert overhead.recommended == {} and ".item()" in overhead.fix and "log_every_n_steps" in overhead.fix
    assert device.syncs["item"] == 26  # the callback's own, one per step; LoadGuard added none
    # docs/concepts.md: consumer_rate = 1 / (device step + loop idle). No data idle here, so that is the loop's
    # own pace on the test's clock (1 - truth of each period is the 20 ms step).
    assert m["loadguard/consumer_rate"] == pytest.approx((1.0 - truth) / 0.02, rel=0.15)


def test_a_syncing_callback_listed_before_loadguard_counts_as_the_devices_step_time() -> None:
    # docs/concepts.md: callbacks listed before LoadGuard run before its step end, so their sync and the host work
    # after it (20 ms, the device drained and idle) are in the device step, not in the loop's idle.
    device = SimDevice()
    guard, _ = _fit(device, 0.0, 0.02, before=(_SyncingLogger(device, 0.02),))
    m = guard.metrics
    assert device.syncs["item"] == 26
    assert m["loadguard/device_step_ms"] >= 20 + 20 - 1e-6, m
    # Listed after it, the same callback idles the loop for more than 30 % of the device's time
    # (test_trainer_with_a_simulated_device_names_a_syncing_callback_as_loop_overhead).
    assert m["loadguard/device_loop_idle_fraction"] < 0.15, m
    assert guard.diagnosis is not None and guard.diagnosis.finding("loop_overhead") is None


class _CopyingModule(_DeviceModule):
    """Each batch's copy to the device queues ``copy_s`` on the simulated device (pinned, non-blocking)."""

    copy_s = 0.01

    def transfer_batch_to_device(self, batch: Any, device: torch.device, dataloader_idx: int) -> Any:
        self.sim.copy(self.copy_s, pinned=True)
        return super().transfer_batch_to_device(batch, device, dataloader_idx)


def test_the_logged_device_transfer_is_the_mean_copy_as_the_device_ran_it() -> None:
    # docs/concepts.md: device_transfer_ms = mean copy. A 10 ms copy, a 15 ms step, a 30 ms loader: the device has
    # drained before each copy, so it runs each copy in exactly its 10 ms.
    device = SimDevice()
    guard = LoadGuard(window=12, log_every_n_steps=4, print_summary=False)
    guard._device_events = device.event
    loader = torch.utils.data.DataLoader(_SleepyData(26, 0.03), batch_size=1)
    quiet_trainer(max_epochs=1, callbacks=[guard]).fit(_CopyingModule(device, 0.015), loader)
    m = guard.metrics
    assert 10.0 - 1e-6 <= m["loadguard/device_transfer_ms"] < 15.0, m
    assert device.total_syncs == 0  # a pinned copy, and LoadGuard added no synchronisation


class _EpochGap(pl.Callback):
    """The host works ``seconds`` at each epoch's start, with nothing queued on the device."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds

    def on_train_epoch_start(self, trainer: pl.Trainer, module: object) -> None:
        time.sleep(self.seconds)


def test_the_first_step_of_each_epoch_has_no_idle_figure() -> None:
    # Two epochs of 13 steps; 100 ms of host work before each epoch, the device idle throughout.
    device = SimDevice()
    guard = LoadGuard(window=24, log_every_n_steps=4, print_summary=False)
    guard._device_events = device.event
    loader = torch.utils.data.DataLoader(_SleepyData(13, 0.03), batch_size=1)
    quiet_trainer(max_epochs=2, callbacks=[guard, _EpochGap(0.1)]).fit(_DeviceModule(device, 0.015), loader)
    timeline = guard._monitor._timeline
    assert timeline is not None and timeline.skipped_steps == 0
    # 26 steps, less the first of each epoch: 24 measured, read or still to be read (read once the device passed).
    assert timeline.total_steps + timeline.lag_steps == 2 * 12
    snapshot = guard.snapshot
    assert snapshot is not None and len(snapshot.device_step_s) >= 12
    # The gap before epoch 1 is in no step's idle.
    assert max(snapshot.device_loop_idle_s) + max(snapshot.device_data_idle_s) < 0.1


def test_on_mps_or_xla_the_device_clock_is_not_read(monkeypatch: pytest.MonkeyPatch) -> None:
    # docs/concepts.md: only CUDA's timing events are read; Apple's MPS and XLA/TPU report the host's figures (the
    # callback attaches no timeline where this gives None: test_on_cpu_the_device_metrics_are_absent).
    from lightning_loadguard.meters.device import cuda_events

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)  # as on a machine with CUDA beside them
    assert cuda_events(torch.device("mps")) is None
    assert cuda_events(torch.device("xla")) is None
    assert cuda_events(torch.device("cpu")) is None
    assert cuda_events(torch.device("cuda")) is not None  # where it does read the device's clock


def test_the_tuner_judges_settings_by_the_devices_idle() -> None:
    # Host ahead with a bursty in-process loader: the host waits ~30 % of its time, the device never idles
    # (150 ms of queued work hide each 60 ms batch).
    # On the device's clock there is nothing to win, so the tuner keeps the settings without probing; the
    # host's clock would have sent it probing worker counts.
    options = TuneOptions(warmup_steps=3, window_steps=8, probe_share=0.5, tune_persistent_workers=False)
    device = SimDevice()
    guard, _ = _fit(
        device, 0.06, 0.05, _SyncingLogger(device, 0.0, every=4), data=_BurstyData, steps=48, auto_tune=options
    )
    assert guard.decision is not None
    assert guard.decision.verdict == "compute_bound"
    # Only the user's own setting was measured (again, while its windows showed nothing to win): nothing probed.
    assert {c.setting for c in guard.decision.candidates} == {guard.decision.original}
    assert guard.decision.probe_steps == 0
    assert guard.decision.throughput_before is not None
    assert guard.decision.throughput_before < 1.02 / 0.05  # never above the device's own rate
    assert guard.metrics["loadguard/wait_fraction"] > 0.15  # what the host's clock says


class _ValidatingModule(_DeviceModule):
    def validation_step(self, batch: torch.Tensor, batch_idx: int) -> None:
        self.sim.launch(0.05)  # validation keeps the device busy, then the host waits for it
        self.sim.item()


def test_validation_inside_the_epoch_is_not_the_loops_idle() -> None:
    # Validation every 6 steps takes 2 x 50 ms of device time and a sync; it runs between two training steps.
    # Counted in the span after it, it would look like 100 ms of loop idle against 20 ms steps.
    device = SimDevice()
    guard = LoadGuard(window=12, log_every_n_steps=4, print_summary=False)
    guard._device_events = device.event
    train = torch.utils.data.DataLoader(_SleepyData(30, 0.0), batch_size=1)
    val = torch.utils.data.DataLoader(_SleepyData(2, 0.0), batch_size=1)
    trainer = quiet_trainer(max_epochs=1, callbacks=[guard], val_check_interval=6, num_sanity_val_steps=0)
    trainer.fit(_ValidatingModule(device, 0.02), train, val)
    assert device.syncs["item"] == 2 * 5  # validation ran 5 times inside the epoch
    assert guard.snapshot is not None and len(guard.snapshot.device_step_s) >= 6
    assert max(guard.snapshot.device_loop_idle_s) < 0.05
    assert guard.metrics["loadguard/device_loop_idle_fraction"] < WAIT_OK


def test_on_cpu_the_device_metrics_are_absent() -> None:
    guard, _ = _fit(None, 0.0, 0.0)
    assert "loadguard/step_ms" in guard.metrics
    assert not any(name.startswith("loadguard/device_") for name in guard.metrics)
    assert guard.snapshot is not None and not guard.snapshot.on_device


_GPU_CHECK = Path(__file__).resolve().parents[1] / "scripts" / "gpu_check.py"


@pytest.mark.skipif(torch.cuda.is_available(), reason="the check runs for real where CUDA exists")
def test_gpu_check_says_clearly_that_it_needs_a_cuda_device() -> None:
    done = subprocess.run([sys.executable, str(_GPU_CHECK)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 2
    assert "no CUDA device" in done.stderr and "nothing was checked" in done.stderr


@pytest.mark.slow
def test_gpu_check_passes_its_own_checks_on_the_simulated_device() -> None:
    # The script's pipelines, truths and tolerances, run against the simulated device instead of CUDA.
    done = subprocess.run(
        [sys.executable, str(_GPU_CHECK), "--simulate", "--steps", "48"], capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "checks passed" in done.stdout and "MISS" not in done.stdout
