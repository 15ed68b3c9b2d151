"""The meters as plain Python objects: no Trainer."""

from __future__ import annotations

import math
import multiprocessing
import os
import pickle
import socket
import time
import warnings
from dataclasses import replace
from statistics import fmean
from typing import Any

import numpy as np
import pytest
import torch
from pipelines import ClockedDataset, clocked_collate, quiet_trainer
from torch.utils.data import DataLoader

import lightning_loadguard.meters.producer as producer_module
from lightning_loadguard import LoadGuard
from lightning_loadguard.meters.consumer import ConsumerMeter
from lightning_loadguard.meters.host import HOST_KEY_ENV, batch_nbytes, host_facts, host_key, host_name
from lightning_loadguard.meters.loader_probe import LoaderProbe, instrument, restore
from lightning_loadguard.meters.monitor import QUEUE_SAMPLE_INTERVAL_S, LoaderMonitor
from lightning_loadguard.meters.producer import ProducerCounters, ProducerMeter
from lightning_loadguard.meters.ranks import (
    FIELDS,
    figure_row,
    figures_by_name,
    logging_pace,
    rank_figures,
    rank_rows,
    summarise,
)
from lightning_loadguard.meters.window import LoaderSettings, WindowSnapshot
from lightning_loadguard.synthetic import TimedDataset


def test_consumer_meter_splits_wait_and_step_and_excludes_validation() -> None:
    meter = ConsumerMeter(window=10)
    t = 0.0
    for _ in range(5):
        meter.fetch_started(t)
        meter.fetch_finished(t + 0.004)
        meter.exclude(0.010)  # a validation run inside the step
        t += 0.004 + 0.020 + 0.010
    meter.close_step(t)
    records = meter.records()
    assert len(records) == 5
    assert all(math.isclose(r.wait_s, 0.004) for r in records)
    assert all(math.isclose(r.step_s, 0.020) for r in records)
    assert math.isclose(meter.total_wait_s, 0.020)


def test_consumer_meter_window_is_rolling() -> None:
    meter = ConsumerMeter(window=3)
    for i in range(10):
        meter.fetch_started(float(i))
        meter.fetch_finished(i + 0.5)
    meter.close_step(10.0)
    assert len(meter.records()) == 3
    assert meter.total_steps == 10


def test_the_loops_wait_for_a_core_is_read_on_the_first_fetch_of_each_interval(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A fetch every quarter of the interval (times exact in binary): every 4th fetch is read, and its figure
    is what the thread's queueing counter moved during that fetch, not across the steps between reads."""
    reads = iter(float(i) for i in range(1000))
    monkeypatch.setattr("lightning_loadguard.meters.consumer._queued_seconds", lambda: next(reads))
    meter = ConsumerMeter(window=100, core_wait_interval_s=1.0)
    for i in range(40):
        meter.fetch_started(i * 0.25)
        meter.fetch_finished(i * 0.25 + 0.125)
    meter.close_step(10.0)
    queued = [r.queued_s for r in meter.records()]
    assert [i for i, q in enumerate(queued) if q == q] == list(range(0, 40, 4))
    assert {q for q in queued if q == q} == {1.0}  # each read pair: start, then end of the same fetch


def test_the_monitor_reads_the_loops_wait_for_a_core_on_the_first_fetch_of_each_20_ms(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """docs/troubleshooting.md: the loop's wait for a core during a fetch is read on the first fetch of each
    20 ms. Fetches every 0.7 ms on the test's clock: read on the first, then on the first 20 ms or more after
    the last read (at 20.3 ms, 40.6 ms, 60.9 ms): fetches 0, 29, 58 and 87. An interval of 19.6 ms or less, or
    of 20.3 ms or more, reads others."""
    monkeypatch.setattr("lightning_loadguard.meters.consumer._queued_seconds", lambda: 0.0)  # any host
    monitor = LoaderMonitor(window=128)
    start = 1000.0
    for i in range(90):
        monitor.fetch_started(start + i * 0.0007)
        monitor.fetch_finished(start + i * 0.0007 + 0.0001)
    monitor.close_step(start + 90 * 0.0007)
    queued_s = monitor.snapshot().wait_queued_s
    assert len(queued_s) == 90
    assert [i for i, q in enumerate(queued_s) if q == q] == [0, 29, 58, 87]  # the others are NaN


@pytest.mark.parametrize("interval", [-0.01, math.nan])
def test_the_consumer_meter_rejects_a_bad_core_wait_interval(interval: float) -> None:
    with pytest.raises(ValueError, match="core_wait_interval_s"):
        ConsumerMeter(window=10, core_wait_interval_s=interval)


@pytest.mark.parametrize("window", [0, -1])
def test_meters_reject_empty_windows(window: int) -> None:
    with pytest.raises(ValueError, match="window"):
        ConsumerMeter(window)
    with pytest.raises(ValueError, match="window"):
        ProducerMeter(window)


def test_producer_meter_reads_every_worker_and_survives_ring_wrap() -> None:
    meter = ProducerMeter(window=1000)
    counters = meter.attach(num_workers=3)
    for i in range(300):  # more than the ring holds: only the newest are kept, the totals stay exact
        counters.record(i % 3, 0.01 * (1 + i % 3))
    meter.poll()
    assert meter.total_batches == 300
    assert math.isclose(meter.total_busy_s, 100 * (0.01 + 0.02 + 0.03))
    assert math.isclose(meter.capacity(), 3 / 0.02, rel_tol=1e-6)


def test_producer_counters_travel_to_spawned_processes() -> None:
    counters = ProducerCounters(num_workers=2)
    clone = pickle.loads(pickle.dumps(counters))
    clone.record(1, 0.5)
    assert clone.array[1, 0] == 1


def _drain(loader: DataLoader) -> list[int]:
    return [int(i) for index, *_ in loader for i in index]


@pytest.mark.parametrize("num_workers", [0, 2])
def test_probe_meters_production_inside_workers_and_leaves_data_unchanged(num_workers: int) -> None:
    dataset = ClockedDataset(length=48, sample_s=0.005)
    plain = DataLoader(dataset, batch_size=4, num_workers=num_workers)
    expected = _drain(plain)

    producer = ProducerMeter(window=64)
    starts: list[float] = []
    fetches: list[tuple[bool | None, int | None, float]] = []
    probe = LoaderProbe(producer, starts.append, lambda *seen: fetches.append(seen))
    loader = DataLoader(dataset, batch_size=4, num_workers=num_workers, collate_fn=clocked_collate)
    assert instrument(loader, probe) is None
    assert type(loader).__name__ == "DataLoader" and isinstance(loader, DataLoader)
    got, made = [], []
    for index, _, stamps, collated in loader:
        got.extend(int(i) for i in index)
        made.append(float(collated - stamps[:, 0].min()))  # the dataset's and the collate's own clock
        time.sleep(0.03)  # a slow consumer: the workers idle on a full buffer, capacity must not drop
    producer.poll()
    assert got == expected
    # Workers' fetches are peeked at; an in-process one is made on demand, which needs no peek.
    assert len(starts) == 1 and len(fetches) == (12 if num_workers else 0)
    assert producer.total_batches == 12
    # The samples slept 5 ms each (4 a batch), longer when other processes held the cores: the truth is the
    # time each batch took as the dataset saw it, and waiting on a full buffer is no part of it.
    assert producer.capacity() == pytest.approx(max(1, num_workers) / fmean(made), rel=0.05)
    if num_workers:
        assert all(ready for ready, _, _ in fetches[2:])
        # Levels are known while the epoch still has batches to hand out, and never beyond the buffer.
        levels = [level for _, level, _ in fetches]
        assert levels[-1] is None and all(0 <= level <= 4 for level in levels[:6])
    restore(loader)
    assert type(loader) is DataLoader


def test_without_workers_the_loops_fetch_timing_takes_over_timing_the_making() -> None:
    # 2 ms of CPU per sample, 4 a batch: each batch costs the main thread 8 ms of CPU time.
    dataset = TimedDataset(length=48, sample_s=0.002, spin=True)
    expected = _drain(DataLoader(dataset, batch_size=4))
    producer = ProducerMeter(window=64)
    consumer = ConsumerMeter(window=64, core_wait_interval_s=0.0)

    def in_process(timed_by_loop: bool) -> None:
        producer.made_by_loop(consumer if timed_by_loop else None)

    probe = LoaderProbe(
        producer,
        lambda s: None,
        consumer.fetch_observed,
        on_in_process=in_process,
        fetch_open=lambda: consumer.fetch_open,
    )
    loader = DataLoader(dataset, batch_size=4)
    assert instrument(loader, probe) is None
    iterator = iter(loader)
    fetcher = iterator._dataset_fetcher
    got = [int(i) for i in next(iterator)[0]]  # outside any fetch of the loop: timed inside torch's fetcher
    assert "fetch" in fetcher.__dict__ and not consumer.made_here
    for _ in range(5):  # the loop's fetch timing around each: the first such fetch hands over
        consumer.fetch_started(time.perf_counter())
        got += [int(i) for i in next(iterator)[0]]
        consumer.fetch_finished(time.perf_counter())
    assert "fetch" not in fetcher.__dict__ and consumer.made_here
    probe.fetch_timing_lost()  # the loop's timing stopped: timed inside the fetcher again
    assert "fetch" in fetcher.__dict__ and not consumer.made_here
    got += [int(i) for batch in iterator for i in batch[0]]
    producer.poll()
    assert got == expected
    assert producer.total_batches == 12  # each batch counted once, by one of the two timers
    # Each loop fetch's step closes at the next fetch: the fifth's never does, its batch is counted but its
    # times are not in the window.
    assert len(producer.durations()) == 11
    cpu = [c for c in producer.cpu_durations() if c == c]
    # What the samples burned: on the loop's fetches (read on every one here) after the one that handed over
    # in its course, and on a sample of the others.
    assert len(cpu) >= 4 and min(cpu) >= 0.008 * 0.98
    # Within its own batch's busy time, less than the microseconds between the two clocks' reads.
    pairs = [(busy, c) for busy, c in zip(producer.durations(), producer.cpu_durations(), strict=True) if c == c]
    assert all(c <= busy + 50e-6 for busy, c in pairs), pairs
    restore(loader)


def test_without_workers_each_of_the_loops_fetches_is_a_batch_made() -> None:
    # Known waits on a synthetic clock: the truth is what was fed, not what either meter computed.
    consumer = ConsumerMeter(window=4)
    producer = ProducerMeter(window=16)
    producer.attach(num_workers=0)
    now = 0.0
    consumer.fetch_started(now)
    consumer.fetch_finished(now + 0.5)  # open when the loop takes over: made (and counted) before
    producer.made_by_loop(consumer)
    waits = [0.01 * (k + 1) for k in range(10)]
    for wait in waits:
        now += 1.0
        consumer.fetch_started(now)
        consumer.fetch_finished(now + wait)
    producer.poll()
    # Every fetch counts once it has its batch; the window takes the closed steps, up to the consumer's window.
    assert producer.total_batches == 10 and producer.total_busy_s == pytest.approx(sum(waits))
    assert producer.durations() == pytest.approx(waits[5:9]) and producer.entered == 4
    consumer.close_step(now + 1.0)
    producer.poll()
    assert producer.durations() == pytest.approx(waits[5:]) and producer.entered == 5
    assert producer.total_batches == 10
    producer.made_by_loop(None)  # the loader times its making again: the loop's fetches are no longer batches
    consumer.fetch_started(now + 2.0)
    consumer.fetch_finished(now + 2.5)
    consumer.close_step(now + 3.0)
    producer.poll()
    assert producer.total_batches == 10 and producer.entered == 5


def _probed(loader: DataLoader) -> list[tuple[bool | None, int | None, float]]:
    fetches: list[tuple[bool | None, int | None, float]] = []
    assert instrument(loader, LoaderProbe(ProducerMeter(8), lambda s: None, lambda *seen: fetches.append(seen))) is None
    return fetches


def test_readiness_is_the_asked_batch_not_any_batch() -> None:
    # Batch 0 (worker 0) is slow, batch 1 (worker 1) fast: when the consumer asks for batch 0, batch 1 is
    # already waiting in the queue, but the batch asked for is not.
    dataset = TimedDataset(length=16, sample_s=0.0, burst_every=1000, burst_s=0.3)
    loader = DataLoader(dataset, batch_size=4, num_workers=2)
    fetches = _probed(loader)
    iterator = iter(loader)
    time.sleep(0.15)
    list(iterator)
    assert [ready for ready, _, _ in fetches][:2] == [False, True]


def test_waiting_for_worker_start_up_is_not_data_wait() -> None:
    # Asked for at once, the first batch waits for the workers' 0.2 s start-up: that part is the epoch's
    # start, not data wait; no later fetch carries any.
    loader = DataLoader(TimedDataset(length=16), batch_size=4, num_workers=2, worker_init_fn=_slow_start)
    fetches = _probed(loader)
    list(loader)
    assert 0.1 <= fetches[0][2] <= 0.4
    assert all(startup == 0.0 for _, _, startup in fetches[1:])


def _slow_start(worker_id: int) -> None:
    time.sleep(0.2)


def test_the_workers_start_is_seen_whole_when_the_loop_trains_before_its_first_fetch() -> None:
    # A switch mid-epoch: the loop goes on training for 0.15 s after iter(), so the first fetch waits only for
    # the rest of the workers' 0.2 s start-up. The start each fresh epoch would cost is still the whole 0.2 s,
    # from the test's own clock around iter().
    starts: list[tuple[float, float]] = []
    probe = LoaderProbe(
        ProducerMeter(8), lambda s: None, lambda *seen: None, on_startup=lambda *seen: starts.append(seen)
    )
    loader = DataLoader(TimedDataset(length=16), batch_size=4, num_workers=2, worker_init_fn=_slow_start)
    assert instrument(loader, probe) is None
    before = time.perf_counter()
    iterator = iter(loader)
    in_iter = time.perf_counter() - before
    time.sleep(0.15)
    list(iterator)
    assert len(starts) == 1
    waited, started = starts[0]
    assert 0.2 - in_iter <= started <= 1.5
    assert waited <= started - 0.1


class _SlowToFork(DataLoader):
    """Its ``iter()`` returns 0.3 s after its workers were forked, as forking many on a busy host does."""

    def _get_iterator(self) -> Any:
        iterator = super()._get_iterator()
        time.sleep(0.3)
        return iterator


def test_workers_that_started_before_iter_returned_are_a_start_seen() -> None:
    # Workers that finish starting while iter() still forks the others: their start lies inside iter(), none
    # after it, and it is still a start (the monitor adds iter()'s own time). Not seeing it left persistent
    # workers off where forking alone outlasts a short epoch.
    starts: list[tuple[float, float]] = []
    probe = LoaderProbe(
        ProducerMeter(8), lambda s: None, lambda *seen: None, on_startup=lambda *seen: starts.append(seen)
    )
    loader = _SlowToFork(TimedDataset(length=16), batch_size=4, num_workers=2)
    assert instrument(loader, probe) is None
    assert len(list(loader)) == 4
    assert starts == [(0.0, 0.0)]


def test_probe_keeps_the_users_worker_init_fn() -> None:
    loader = DataLoader(TimedDataset(length=8), batch_size=2, num_workers=1, worker_init_fn=_mark_worker)
    probe = LoaderProbe(ProducerMeter(8), lambda s: None, lambda r, level, startup: None)
    assert instrument(loader, probe) is None
    assert len(list(loader)) == 4
    assert loader.worker_init_fn is _mark_worker


def _mark_worker(worker_id: int) -> None:
    torch.utils.data.get_worker_info().dataset.features = 16


def test_probe_refuses_what_it_cannot_instrument() -> None:
    probe = LoaderProbe(ProducerMeter(8), lambda s: None, lambda r, level, startup: None)
    assert "not a torch DataLoader" in instrument([1, 2, 3], probe)


def _gathered(rows: list[dict[str, float]]) -> dict[str, list[float]]:
    """What every rank holds after the gather: each rank's row, by global rank."""
    return figures_by_name([figure_row(values) for values in rows])


def test_rank_figures_take_the_worst_rank_and_sum_per_host() -> None:
    def rank(wait: float, host: float, nbytes: float) -> dict[str, float]:
        values = dict.fromkeys(FIELDS, 1.0)
        values.update(wait_fraction=wait, host_key=host, inflight_bytes=nbytes, gpu_util=float("nan"))
        values.update((name, float("nan")) for name in FIELDS if name.startswith("device_"))  # a CPU run
        return values

    ranks = _gathered([rank(0.1, 1, 2e6), rank(0.7, 1, 2e6), rank(0.2, 2, 1e6)])
    out = summarise(ranks, this_rank=0)
    assert out.worst_rank == 1
    assert out.metrics["loadguard/wait_fraction"] == 0.7
    assert out.metrics["loadguard/inflight_host_mb"] == 4.0  # host 1: two ranks of 2 MB
    assert out.metrics["loadguard/inflight_budget_fraction"] == 4.0  # against host 1's 1 MB budget
    assert out.processes_on_host == 2
    assert "loadguard/gpu_util" not in out.metrics
    with pytest.raises(ValueError, match="rank figures"):
        figure_row({"no_such_figure": 1.0})


def test_each_rank_reports_its_own_host_and_the_busiest_apart() -> None:
    """Two hosts, unevenly loaded: host 1 runs two ranks (2 workers x prefetch 3 and 1 x 2, batches of 1 MB),
    host 2 one (1 x 2, batches of 3 MB); each rank's host figures are its own host's sums."""
    settings = [(1.0, 2, 3, 1e6, 4000.0, 16), (1.0, 1, 2, 1e6, 3000.0, 16), (2.0, 1, 2, 3e6, 100.0, 8)]
    rows = []
    for key, workers, prefetch, batch, available_mb, cores in settings:
        rows.append(
            {
                "host_key": key,
                "workers": float(workers),
                "prefetch_capacity": float(workers * prefetch),
                "prefetch_queued": 1.5,
                "inflight_bytes": batch * workers * prefetch,
                "queued_bytes": batch * 1.5,
                "host_cores": float(cores),
                "host_available_mb": available_mb,
                "shm_free_mb": 1e5,
            }
        )
    ranks = _gathered(rows)
    first, second, third = (summarise(ranks, this_rank=rank) for rank in range(3))
    assert first.metrics == second.metrics  # the same host: the same figures
    one = first.metrics
    assert one["loadguard/host_processes"] == 2 and one["loadguard/host_workers"] == 3
    assert one["loadguard/host_prefetch_capacity"] == 8 and one["loadguard/host_prefetch_queued"] == 3.0
    assert one["loadguard/inflight_host_mb"] == 8.0 and one["loadguard/queued_host_mb"] == 3.0
    assert one["loadguard/host_cores"] == 16 and one["loadguard/host_available_mb"] == 3000.0
    assert one["loadguard/inflight_budget_fraction"] == pytest.approx(8.0 / 3000.0)
    two = third.metrics
    assert two["loadguard/host_processes"] == 1 and two["loadguard/host_workers"] == 1
    assert two["loadguard/host_prefetch_capacity"] == 2 and two["loadguard/inflight_host_mb"] == 6.0
    assert two["loadguard/host_cores"] == 8 and two["loadguard/inflight_budget_fraction"] == pytest.approx(0.06)
    assert third.inflight_host_bytes == 6e6 and third.host.workers == 1
    # The busiest host, named apart and alike on every rank: host 1 holds the most bytes, host 2 the most of
    # its budget.
    for out in (first, third):
        assert out.metrics["loadguard/hosts"] == 2
        assert out.metrics["loadguard/inflight_host_mb_max"] == 8.0
        assert out.metrics["loadguard/inflight_budget_fraction_max"] == pytest.approx(0.06)
    # On one host there is no busiest host to speak of.
    alone = summarise(_gathered(rows[:2]), this_rank=0).metrics
    assert "loadguard/hosts" not in alone and "loadguard/inflight_host_mb_max" not in alone
    # Where /dev/shm is the tighter budget (its lowest reading on the host: 1,500 MB against 3,000 MB of RAM), the
    # share is of it.
    tight = [dict(rows[0], shm_free_mb=2000.0), dict(rows[1], shm_free_mb=1500.0)]
    shm = summarise(_gathered(tight), this_rank=0).metrics
    assert shm["loadguard/shm_free_mb"] == 1500.0 and shm["loadguard/host_available_mb"] == 3000.0
    assert shm["loadguard/inflight_budget_fraction"] == pytest.approx(8.0 / 1500.0)


def test_a_host_sum_with_a_part_unmeasured_is_left_out() -> None:
    # Rank 1 has not sized a batch yet: half a sum would pass for the host's.
    rows = [
        {"host_key": 5.0, "workers": 2.0, "prefetch_capacity": 4.0, "inflight_bytes": 4e6},
        {"host_key": 5.0, "workers": 1.0, "prefetch_capacity": 2.0},
    ]
    metrics = summarise(_gathered(rows), this_rank=1).metrics
    assert metrics["loadguard/host_workers"] == 3 and "loadguard/inflight_host_mb" not in metrics
    # A rank whose host is not known (its figures failed) speaks of no host.
    unknown = summarise(_gathered([{"workers": 2.0}, rows[1]]), this_rank=0).metrics
    assert not any(name.startswith(("loadguard/host_", "loadguard/inflight_")) for name in unknown)


def test_a_ranks_figures_count_its_loaders_as_they_run() -> None:
    snap = WindowSnapshot(
        wait_s=(0.01,) * 4,
        step_s=(0.02,) * 4,
        batch_bytes=1000,
        buffer_level=(6, 5, 6, 7),
        settings=LoaderSettings(num_workers=2, prefetch_factor=3),
    )
    figures = rank_figures(snap, host_key=1.0)
    assert (figures["workers"], figures["prefetch_capacity"], figures["inflight_bytes"]) == (2, 6, 6000)
    assert (figures["prefetch_queued"], figures["queued_bytes"]) == (6.0, 6000.0)
    # In process nothing is prefetched; two loaders of one rank: their workers and queues add up, their bytes
    # are not known apart (the batch measured is theirs together).
    in_process = rank_figures(replace(snap, settings=LoaderSettings(), buffer_level=None), host_key=1.0)
    assert (in_process["workers"], in_process["prefetch_capacity"], in_process["prefetch_queued"]) == (0, 0, 0)
    two = rank_figures(snap, host_key=1.0, loaders=(LoaderSettings(2, 3), LoaderSettings(1, 4, pin_memory=True)))
    assert (two["workers"], two["prefetch_capacity"]) == (3, 11)
    assert math.isnan(two["inflight_bytes"]) and math.isnan(two["prefetch_queued"])


def test_every_rank_paces_its_logging_by_the_costliest_ranks_logging_step() -> None:
    """The cost travels with the figures and is reduced alike on every rank (the ranks must keep meeting in
    the collective on the same steps); it is not a logged metric."""
    gathered = _gathered([{"host_key": 1.0, "logging_step_ms": cost} for cost in (0.4, 1.5, float("nan"))])
    paced = []
    for this_rank in range(3):
        paced.append(logging_pace(gathered))
        assert not any("logging_step" in name for name in summarise(gathered, this_rank).metrics)
    assert [out.logging_step_s for out in paced] == [pytest.approx(0.0015)] * 3
    assert logging_pace(rank_rows({"host_key": 1.0})).logging_step_s == 0.0  # before any logging step: not known


def test_on_accelerators_ranks_are_compared_by_the_devices_idle_for_data() -> None:
    # Rank 0's device idles more, although its host waits less (rank 1's host waits while its device still
    # has work queued).
    rows = [
        {"wait_fraction": host_wait, "device_data_idle_fraction": device_idle, "host_key": 7.0}
        for host_wait, device_idle in ((0.1, 0.3), (0.5, 0.02))
    ]
    out = summarise(_gathered(rows), this_rank=0)
    assert out.worst_rank == 0 and out.rank_wait_fractions == (0.3, 0.02)


def test_a_single_process_without_a_process_group_combines_its_own_figures() -> None:
    out = summarise(rank_rows({"wait_fraction": 0.3, "gpu_util": 50.0, "host_key": 3.0}), this_rank=0)
    assert out.metrics["loadguard/wait_fraction"] == 0.3 and out.metrics["loadguard/gpu_util"] == 50.0
    assert out.processes_on_host == 1 and "loadguard/worst_rank" not in out.metrics
    assert "loadguard/gpu_util" not in summarise(rank_rows({"host_key": 3.0}), this_rank=0).metrics


def test_the_host_override_names_the_host_and_refuses_bad_values() -> None:
    assert host_name({}) == socket.gethostname()
    assert host_name({HOST_KEY_ENV: "pod-7.rack:2"}) == "pod-7.rack:2"
    assert host_key({HOST_KEY_ENV: "a"}) == host_key({HOST_KEY_ENV: "a"}) != host_key({HOST_KEY_ENV: "b"})
    assert host_key({}) == host_key({HOST_KEY_ENV: socket.gethostname()})
    for bad in ("", " ", "node 7", "-node", "n\n", "x" * 256, "nöde"):
        with pytest.raises(ValueError, match=f"^{HOST_KEY_ENV}=") as err:
            host_key({HOST_KEY_ENV: bad})
        assert "unset it" in str(err.value)


def test_the_host_override_accepts_1_to_255_of_letters_digits_and_the_four_marks() -> None:
    # docs/metrics.md: 1 to 255 letters, digits, ".", "_", ":" or "-", starting with a letter or digit; the
    # refusals (256 characters, a leading "-", a space, ...) are above.
    for good in ("a", "7", "x" * 255, "Node_7.rack:2-b", "9-a.b_c:d"):
        assert host_name({HOST_KEY_ENV: good}) == good
        assert host_key({HOST_KEY_ENV: good}) == host_key({HOST_KEY_ENV: good})
    for bad in ("_node", ".node", ":node", "x" * 256):
        with pytest.raises(ValueError, match=f"^{HOST_KEY_ENV}="):
            host_key({HOST_KEY_ENV: bad})


def test_a_bad_host_override_stops_the_fit_before_it_changes_anything(monkeypatch: pytest.MonkeyPatch) -> None:
    guard = LoadGuard()
    monkeypatch.setenv(HOST_KEY_ENV, "")
    # The trainer is never touched: the override is read first.
    with pytest.raises(ValueError, match=HOST_KEY_ENV):
        guard.setup(object(), object(), "fit")  # type: ignore[arg-type]
    assert guard._trainer is None and len(guard._patches) == 0


def test_batch_nbytes_and_host_facts() -> None:
    assert batch_nbytes((torch.zeros(8, 4), {"y": torch.zeros(8, dtype=torch.int64)})) == 8 * 4 * 4 + 8 * 8
    facts = host_facts(processes_on_host=4)
    assert facts.cpu_count >= 1 and facts.cores_per_process == facts.cpu_count / 4
    assert facts.available_ram_bytes and facts.available_ram_bytes > 0


def test_window_snapshot_figures() -> None:
    snap = WindowSnapshot(wait_s=(0.01, 0.03), step_s=(0.02, 0.02), settings=LoaderSettings(2, 3, pin_memory=True))
    assert snap.wait_fraction == pytest.approx(0.5)
    assert snap.throughput == pytest.approx(25.0)
    assert snap.consumer_rate == pytest.approx(50.0)
    assert snap.settings.batches_in_flight == 7
    assert LoaderSettings(num_workers=0).batches_in_flight == 0


# The line between the two is 0.5, "half a core": a computing worker read 0.698 in one CI run on a quiet host (its
# busy time also holds what the worker does around the transform), an I/O one stays near 0.
@pytest.mark.parametrize(("spin", "low", "high"), [(False, 0.0, 0.3), (True, 0.5, 1.0)])
def test_producer_tells_io_waiting_workers_from_computing_ones(spin: bool, low: float, high: float) -> None:
    producer = ProducerMeter(window=64)
    probe = LoaderProbe(producer, lambda s: None, lambda r, level, startup: None)
    loader = DataLoader(TimedDataset(32, sample_s=0.004, spin=spin), batch_size=4, num_workers=1)
    assert instrument(loader, probe) is None
    list(loader)
    producer.poll()
    durations, cpu, queued = producer.durations(), producer.cpu_durations(), producer.queued_durations()
    assert len(durations) == len(cpu) == len(queued) == 8
    # Time spent queueing for a core (other processes on a busy machine) is neither computing nor I/O.
    snapshot = WindowSnapshot(
        wait_s=(0.0,), step_s=(0.01,), production_s=durations, production_cpu_s=cpu, production_queued_s=queued
    )
    assert snapshot.cpu_share is not None and low <= snapshot.cpu_share <= high


def test_gpu_utilization_is_silent_on_cpu_and_reads_nvml_on_cuda(monkeypatch: pytest.MonkeyPatch) -> None:
    import sys
    import types

    from lightning_loadguard.meters.accelerator import GpuUtilization

    cpu = GpuUtilization(torch.device("cpu"))
    assert cpu.read() is None and cpu.unavailable == "not a CUDA device"

    calls: list[str] = []
    fake = types.SimpleNamespace(
        nvmlInit=lambda: calls.append("init"),
        nvmlDeviceGetHandleByUUID=lambda uuid: calls.append(uuid) or "handle",
        nvmlDeviceGetUtilizationRates=lambda handle: types.SimpleNamespace(gpu=87),
    )
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda index: types.SimpleNamespace(uuid="abc-123"))
    gpu = GpuUtilization(torch.device("cuda", 1))
    assert gpu.unavailable is None
    assert gpu.read() == pytest.approx(0.87)
    assert calls == ["init", "GPU-abc-123"]


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="needs CPU affinity (Linux)")
def test_the_loops_wait_for_a_core_during_a_fetch_is_what_its_thread_did_not_run() -> None:
    """Ground truth from another clock: a fetch that spins never blocks, so wall minus the thread's CPU time
    (``time.thread_time``) is time spent runnable without a core; a spinner on the same single CPU makes it
    about half the fetch. The monitor reads the thread's wait inside ``fetch_started`` and ``fetch_finished``, so the
    truth is bracketed: over the spin alone (inside those calls) and over the calls too (around them); on a busy host
    the thread can lose the core for a time slice between the two."""
    if producer_module._queued_seconds() is None:
        pytest.skip("no /proc/thread-self/schedstat here")
    before = os.sched_getaffinity(0)
    cpu = min(before)
    spinner = multiprocessing.get_context("fork").Process(target=_spin_on, args=(cpu,), daemon=True)
    os.sched_setaffinity(0, {cpu})
    spinner.start()
    try:
        monitor = LoaderMonitor(window=64)
        time.sleep(0.05)  # the spinner is running
        rows, around = [], []
        for _ in range(4):
            outer_wall, outer_cpu = time.perf_counter(), time.thread_time()
            monitor.fetch_started(time.perf_counter())
            wall0, cpu0 = time.perf_counter(), time.thread_time()
            # Each fetch outlasts the sampling interval: every one of them is read.
            end = wall0 + max(0.03, 1.5 * QUEUE_SAMPLE_INTERVAL_S)
            while time.perf_counter() < end:
                pass
            rows.append(time.perf_counter() - wall0 - (time.thread_time() - cpu0))
            monitor.fetch_finished(time.perf_counter())
            around.append(time.perf_counter() - outer_wall - (time.thread_time() - outer_cpu))
        monitor.close_step(time.perf_counter())
    finally:
        spinner.kill()
        spinner.join()
        os.sched_setaffinity(0, before)
    queued = monitor.snapshot().wait_queued_s
    sampled = [(q, inner, outer) for q, inner, outer in zip(queued, rows, around, strict=True) if q == q]
    assert len(sampled) == 4
    measured = sum(q for q, _, _ in sampled)
    inside, outside = sum(t for _, t, _ in sampled), sum(t for _, _, t in sampled)
    assert inside > 0.02  # the spinner did take the core (4 fetches of 30 ms, about half each)
    assert 0.85 * inside - 0.004 < measured < 1.15 * outside + 0.004, (measured, inside, outside)


def test_the_window_carries_the_batch_s_tensor_count_and_the_process_s_sharing_strategy() -> None:
    monitor = LoaderMonitor(window=8)
    batch = {"image": torch.zeros(4, 3), "labels": [torch.zeros(4), torch.zeros(4)], "name": ["a"] * 4}
    monitor.measure_batch(batch)
    before = torch.multiprocessing.get_sharing_strategy()
    other = next(s for s in sorted(torch.multiprocessing.get_all_sharing_strategies()) if s != before)
    try:
        torch.multiprocessing.set_sharing_strategy(other)
        snap = monitor.snapshot()
    finally:
        torch.multiprocessing.set_sharing_strategy(before)
    assert snap.batch_tensors == 3
    assert snap.batch_bytes == (12 + 4 + 4) * 4
    assert snap.sharing_strategy == other


def _spin_on(cpu: int) -> None:
    os.sched_setaffinity(0, {cpu})
    while True:
        pass


def test_a_step_whose_copy_was_not_timed_reads_nan_and_the_mean_leaves_it_out() -> None:
    meter = ConsumerMeter(window=10)
    meter.fetch_started(0.000)
    meter.fetch_finished(0.010)
    meter.step_started(0.012)  # this step's copy to the device: 2 ms
    meter.fetch_started(0.030)
    meter.fetch_finished(0.031)  # no step_started: the copy was not timed
    meter.close_step(0.050)
    columns = meter.columns()
    assert columns.transfer_s[0] == pytest.approx(0.002)
    assert math.isnan(columns.transfer_s[1])
    snapshot = WindowSnapshot(wait_s=columns.wait_s, step_s=columns.step_s, transfer_s=columns.transfer_s)
    assert snapshot.mean_transfer_s == pytest.approx(0.002)
    assert WindowSnapshot(wait_s=(0.01,), step_s=(0.02,), transfer_s=(math.nan,)).mean_transfer_s == 0.0


class _HoldsAnArray(torch.utils.data.Dataset):
    """Sample ``i`` is ``(i, 16 zeros)``, whatever array the dataset holds besides (a worker's copy of it)."""

    def __init__(self, n: int, held_bytes: int) -> None:
        self.n = n
        self.held = np.ones(held_bytes, dtype=np.uint8)

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        return torch.tensor(i), torch.zeros(16)


def test_the_inflight_host_count_holds_batches_not_the_workers_copies_of_the_dataset() -> None:
    # docs/concepts.md: worker copies of the dataset are not in the host counts. Two fits with the same loader
    # settings and batch size, over a dataset holding 50 MB and one holding 1 byte: the same in-flight figure,
    # batches in flight x the batch's bytes (the test's own count: 2 workers x prefetch 2, batches of 8 samples,
    # each an int64 index and 16 float32 zeros).
    from lightning_loadguard.synthetic import TimedModule

    batch_bytes = 8 * 8 + 8 * 16 * 4
    figures = []
    for held in (50_000_000, 1):
        guard = LoadGuard(window=4, print_summary=False)
        trainer = quiet_trainer(max_epochs=1, callbacks=[guard])
        loader = DataLoader(_HoldsAnArray(64, held), batch_size=8, num_workers=2, prefetch_factor=2)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            trainer.fit(TimedModule(), loader)
        figures.append(guard.metrics["loadguard/inflight_host_mb"])
    assert figures[0] == figures[1] == pytest.approx(2 * 2 * batch_bytes / 1e6)
