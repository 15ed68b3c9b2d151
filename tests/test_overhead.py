"""LoadGuard's own work per training step: counted, and timed in CPU time, which a busy machine cannot fake.

``benchmarks/overhead.py`` times the cost and compares throughputs; these tests fail when the work itself
grows: more Python calls per step in LoadGuard's code, a file opened on the hot path, the per-batch system
calls that measure CPU and core-queueing time no longer sampled, or LoadGuard's own CPU time per step past a
bound fixed in advance.
"""

from __future__ import annotations

import os
import statistics
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from call_timing import adding_to, summed, timed
from lightning.pytorch import Callback
from pipelines import quiet_trainer
from torch.utils.data import get_worker_info

import lightning_loadguard
from lightning_loadguard import LoadGuard
from lightning_loadguard.meters import producer
from lightning_loadguard.meters.monitor import QUEUE_SAMPLE_INTERVAL_S
from lightning_loadguard.meters.producer import SAMPLE_INTERVAL_S, ProducerCounters, _timed
from lightning_loadguard.synthetic import TimedDataset, TimedModule, timed_loader

_PACKAGE = str(Path(lightning_loadguard.__file__).parent)
# The pipeline's own code (its dataset and model) is not LoadGuard's work.
_PIPELINE = str(Path(lightning_loadguard.__file__).with_name("synthetic.py"))
# The calls that enter the kernel (or read a clock that may) on LoadGuard's side of a step.
_SYSTEM_CALLS = {os.open, os.pread, os.read, os.stat, time.thread_time, time.process_time, open}


class _Counter:
    """Counts, in this thread, calls into LoadGuard's Python code and the system calls made from it."""

    def __init__(self) -> None:
        self.python_calls = 0
        self.system_calls: Counter[str] = Counter()
        self.opened: list[str] = []
        self.names: Counter[str] = Counter()

    def profile(self, frame: Any, event: str, arg: Any) -> None:
        if event == "call":
            if frame.f_code.co_filename.startswith(_PACKAGE) and frame.f_code.co_filename != _PIPELINE:
                self.python_calls += 1
                self.names[frame.f_code.co_name] += 1
        elif event == "c_call" and arg in _SYSTEM_CALLS and frame.f_code.co_filename.startswith(_PACKAGE):
            self.system_calls[arg.__name__] += 1

    def audit(self, event: str, args: tuple[Any, ...]) -> None:
        if event == "open" and sys.getprofile() is not None:
            self.opened.append(str(args[0]))


class _CountBetween(Callback):
    """Counts from the start of step ``first`` to the start of step ``last``: whole steps, fetch included."""

    def __init__(self, counter: _Counter, first: int, last: int) -> None:
        self.counter, self.first, self.last = counter, first, last

    def on_train_batch_start(self, trainer: Any, pl_module: Any, batch: Any, batch_idx: int) -> None:
        if batch_idx == self.first:
            self.started = time.perf_counter()
            sys.setprofile(self.counter.profile)
        elif batch_idx == self.last:
            sys.setprofile(None)
            self.seconds = time.perf_counter() - self.started


_AUDIT: list[_Counter] = []


def _audit(event: str, args: tuple[Any, ...]) -> None:
    # An audit hook cannot be removed: one is installed for the session and forwards to the current test.
    if _AUDIT:
        _AUDIT[-1].audit(event, args)


sys.addaudithook(_audit)


@pytest.mark.parametrize("num_workers", [0, 2])
def test_a_training_step_costs_loadguard_few_calls_and_no_file_opens(num_workers: int) -> None:
    first, last = 10, 58
    counter = _Counter()
    _AUDIT.append(counter)
    try:
        # No logging step inside the counted steps: this is the cost every step pays.
        guard = LoadGuard(window=8, log_every_n_steps=1000, print_summary=False)
        between = _CountBetween(counter, first, last)
        trainer = quiet_trainer(max_steps=last + 4, callbacks=[guard, between])
        loader = timed_loader(TimedDataset(4 * (last + 4)), batch_size=4, num_workers=num_workers)
        trainer.fit(TimedModule(record=False), loader)
    finally:
        sys.setprofile(None)
        _AUDIT.remove(counter)
    steps = last - first
    assert counter.python_calls > 0  # the counter saw LoadGuard at work
    assert counter.opened == []
    # About 11 to 12.5 calls per step in either case (the sampled system calls go with the machine's speed):
    # the fetch's start and end, and the probe or the meter, on every step; the step's start hook on every
    # HOOKED_EVERY-th, its end hook on logging steps only (18 where both ran on every step).
    assert counter.python_calls / steps <= 14, counter.names.most_common(10)
    # With workers, the batches are made (and timed) in the workers; in-process, the meter samples: four
    # system calls per sample, at most one sample per interval. The loop's wait for a core is read at the
    # start and the end of the first fetch of each QUEUE_SAMPLE_INTERVAL_S.
    samples = between.seconds / SAMPLE_INTERVAL_S + 1
    core_waits = 2 * (between.seconds / QUEUE_SAMPLE_INTERVAL_S + 1)
    assert sum(counter.system_calls.values()) <= 4 * samples + core_waits, (counter.system_calls, between.seconds)


@pytest.mark.parametrize(("interval_s", "sampled"), [(3600.0, 0), (0.0, 64)])
def test_the_producer_meter_samples_its_system_calls(
    interval_s: float, sampled: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(producer, "SAMPLE_INTERVAL_S", interval_s)
    counters = ProducerCounters(0)
    fetch = _timed(lambda index: index, counters, 0)
    counter = _Counter()
    sys.setprofile(counter.profile)
    try:
        for index in range(64):
            fetch(index)
    finally:
        sys.setprofile(None)
    # Busy time for every batch; CPU and queueing time (two reads each side of the fetch) for the sampled.
    assert counters.made(0) == 64
    assert sum(counter.system_calls.values()) == 4 * sampled, counter.system_calls
    assert counter.python_calls <= 4 * 64 + 2 * sampled
    cpu = counters.array[0, producer._CPU : producer._CPU + 64]
    assert int((cpu == cpu).sum()) == sampled  # the others are NaN: not sampled


class _OwnCpu:
    """LoadGuard's own CPU time in the training process, region by region, each less the user's work it wraps.

    Thread CPU time (``time.thread_time``) of the hooks (logging steps included), the profiler proxy's start
    and stop around each fetch, the loader probe's work around each fetch and the producer meter around each
    in-process batch (each less the fetch or the making it wraps) and the per-epoch iterator set-up (less the
    iterator's creation): a busy host delays these regions but does not add to their CPU time. Reading a
    thread's CPU clock is a system call (about a microsecond) and the proxy is called for every profiler action
    Lightning records, dozens a step: the cost of an empty timed region, measured here first, is taken off each
    call of a region (only that: the inner regions' readings stay in, so the figure errs high).
    """

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.seconds: dict[str, list[float]] = {}
        self._patch = monkeypatch.setattr
        self.clock_s = self._empty_region_s()

    @staticmethod
    def _empty_region_s() -> float:
        def region() -> None:
            start = time.thread_time()
            try:
                pass
            finally:
                spent[0] += time.thread_time() - start

        spent = [0.0]
        rounds = []
        for _ in range(5):
            begun = time.thread_time()
            for _ in range(2000):
                region()
            rounds.append((time.thread_time() - begun) / 2000)
        return min(rounds)

    def add(self, label: str, seconds: float) -> None:
        self.seconds.setdefault(label, []).append(seconds - self.clock_s)

    def per_step_us(self, steps: int) -> dict[str, float]:
        """Per region: its median call times its calls, per step (a call the kernel interrupted, whose CPU time
        then holds the switch and the caches refilled after it, does not set the figure)."""
        return {
            label: round(max(0.0, statistics.median(calls)) * len(calls) / steps * 1e6, 1)
            for label, calls in self.seconds.items()
        }

    def timed(self, function: Any, label: str, less: list[float] | None = None) -> Any:
        """``function`` with each call's CPU time, less what ``less`` gained meanwhile, added to ``label``."""
        return timed(function, time.thread_time, lambda seconds: self.add(label, seconds), less)

    def region(self, owner: Any, name: str, label: str) -> None:
        self._patch(owner, name, self.timed(getattr(owner, name), label))

    def install(self) -> None:
        from torch.utils.data import dataloader

        from lightning_loadguard import _lightning
        from lightning_loadguard.meters import loader_probe

        for name in ("on_train_batch_start", "on_train_batch_end", "on_train_epoch_end"):
            self.region(LoadGuard, name, name)
        for name in ("start", "stop"):
            self.region(_lightning.FetchTimingProfiler, name, "fetch timing")
        fetch = [0.0]  # the CPU time of every fetch, in either kind of iterator
        for cls in (dataloader._SingleProcessDataLoaderIter, dataloader._MultiProcessingDataLoaderIter):
            self._patch(cls, "_next_data", timed(cls._next_data, time.thread_time, adding_to(fetch)))
        observe = loader_probe.LoaderProbe._observe

        def observing(probe: Any, iterator: Any) -> None:
            observe(probe, iterator)
            iterator._next_data = self.timed(iterator._next_data, "loader probe", less=fetch)

        self._patch(loader_probe.LoaderProbe, "_observe", observing)
        make_timed = producer._timed

        def measured(fetch_batch: Any, counters: Any, row: int, *rest: Any) -> Any:
            making, made = summed(fetch_batch, time.thread_time)
            meter = make_timed(making, counters, row, *rest)
            timed_meter = self.timed(meter, "producer meter", less=made)

            def outer(*args: Any) -> Any:
                if get_worker_info() is not None:
                    return meter(*args)  # in a worker: its cost is the worker's (the test below)
                return timed_meter(*args)

            return outer

        self._patch(producer, "_timed", measured)
        make_iterator = loader_probe.LoaderProbe.make_iterator

        def setting_up(probe: Any, loader: Any, create: Any) -> Any:
            timed_create, created = summed(create, time.thread_time)
            return self.timed(make_iterator, "iterator set-up", less=created)(probe, loader, timed_create)

        self._patch(loader_probe.LoaderProbe, "make_iterator", setting_up)


# LoadGuard's promise is under 1 % of the step time. Its own CPU time per step, logging steps included, is held
# to that share of a 20 ms step whatever the host's load: on a 2-core machine at a load of 10 it measured about
# 30 us in-process and 85 us with 2 workers (code run once a step, beside other processes, runs with cold
# caches). benchmarks/overhead.py measures the cost against the step itself, on shorter steps.
OWN_CPU_PER_STEP_S = 200e-6


@pytest.mark.parametrize("num_workers", [0, 2])
def test_loadguards_own_cpu_time_per_step_stays_within_its_share(
    num_workers: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    own = _OwnCpu(monkeypatch)
    own.install()
    steps = 400
    guard = LoadGuard(print_summary=False)
    trainer = quiet_trainer(max_steps=steps, max_epochs=2, log_every_n_steps=10, callbacks=[guard])
    loader = timed_loader(TimedDataset(4 * steps // 2), batch_size=4, num_workers=num_workers)
    trainer.fit(TimedModule(step_s=0.002, record=False), loader)
    assert trainer.global_step == steps and guard.metrics  # two epochs, and LoadGuard logged its figures
    # Every region was seen at work (a renamed one would silently count nothing).
    expected = {"fetch timing", "on_train_batch_start", "on_train_batch_end", "iterator set-up"}
    expected |= {"loader probe"} if num_workers else set()
    assert expected <= set(own.seconds), own.seconds
    figures = own.per_step_us(steps)
    assert sum(figures.values()) <= OWN_CPU_PER_STEP_S * 1e6, (figures, own.clock_s)


@pytest.mark.parametrize("num_workers", [0, 2])
def test_a_logging_step_costs_at_most_two_milliseconds_of_cpu(
    num_workers: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """docs/api.md: LoadGuard's logging steps cost "up to 2 ms of CPU each, on a core of its own". Timed here, on
    the test's own clock (``time.thread_time`` around each ``_publish``: the window, the diagnosis, the combining,
    the logs), at the trainer's default cadence (every 50 steps) with the largest default window (100 steps): the
    cheapest of them at most 2 ms. The cheapest, since contention inflates a thread's CPU time too (caches and
    cores shared), and the spinning processes beside CI's timing tests would move a median."""
    spent: list[float] = []
    publish = LoadGuard._publish

    def timed_publish(self: LoadGuard, trainer: Any, log: bool = True, **kwargs: Any) -> None:
        started = time.thread_time()
        try:
            publish(self, trainer, log, **kwargs)
        finally:
            if log:
                spent.append(time.thread_time() - started)

    monkeypatch.setattr(LoadGuard, "_publish", timed_publish)
    steps = 800
    guard = LoadGuard(window=100, log_every_n_steps=50, print_summary=False)
    trainer = quiet_trainer(max_steps=steps, callbacks=[guard])
    loader = timed_loader(TimedDataset(4 * steps), batch_size=4, num_workers=num_workers)
    trainer.fit(TimedModule(step_s=0.0005, record=False), loader)
    # Every 50th step, and the first full window (step 100, also a 50th): the first holds one-off imports.
    assert len(spent) == steps // 50, spent
    cheapest_ms = min(spent[1:]) * 1e3
    assert cheapest_ms <= 2.0, sorted(round(s * 1e3, 2) for s in spent)


def test_the_producer_meter_samples_one_batch_each_20_ms(monkeypatch: pytest.MonkeyPatch) -> None:
    """docs/troubleshooting.md: a batch's CPU and core-queueing time is read on one batch each 20 ms per
    producer. On the test's own clock (the meter's ``perf_counter``): the meter made at 0, a batch begun every
    0.7 ms from 0.7 ms on. The first read is the first batch begun 20 ms or more after 0 (the 29th, at 20.3 ms),
    each next one the first begun 20 ms or more after the last read (40.6 ms, 60.9 ms): batches 28, 57 and 86
    counted from 0. An interval of 19.6 ms or less, or of 20.3 ms or more, reads others."""
    from types import SimpleNamespace

    clock = [0.0]
    monkeypatch.setattr(producer, "time", SimpleNamespace(perf_counter=lambda: clock[0], thread_time=time.thread_time))
    counters = ProducerCounters(0)
    fetch = _timed(lambda index: index, counters, 0)
    for index in range(90):
        clock[0] = (index + 1) * 0.0007
        fetch(index)
    assert counters.made(0) == 90
    cpu = counters.array[0, producer._CPU : producer._CPU + 90]
    sampled = [index for index in range(90) if cpu[index] == cpu[index]]  # the others are NaN
    assert sampled == [28, 57, 86]
