"""LoadGuard's own work per training step, counted rather than timed: what a busy machine cannot fake.

``benchmarks/overhead.py`` times the cost and compares throughputs; these tests fail when the work itself
grows: more Python calls per step in LoadGuard's code, a file opened on the hot path, or the per-batch
system calls that measure CPU and core-queueing time no longer sampled.
"""

from __future__ import annotations

import os
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from lightning.pytorch import Callback
from pipelines import quiet_trainer

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
