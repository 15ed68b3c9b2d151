"""The producer side: how fast the loader's workers make batches, metered inside the workers.

Each worker times every batch it makes (dataset access plus collate, the work torch's fetcher does) and
writes the duration into a row of a shared-memory tensor that the main process reads. Idle time (a worker
blocked because the buffer is full) is never counted, so the capacity is right also when the consumer
never waits. With ``num_workers=0`` the same meter times the in-process fetch.

Each batch's CPU time (the worker thread's own) is kept beside its busy time: their ratio tells a worker
that waits on I/O (it needs no core of its own) from one that computes.

Row layout (float64): ``[batches_made, busy_seconds, durations[RING], finish_times[RING], cpu_seconds[RING]]``:
a single writer per row; the reader only looks at the ring entries the counter says were written, and merges
the rows in finishing order (``perf_counter`` is the system-wide monotonic clock on Linux).
"""

from __future__ import annotations

import contextlib
import time
import weakref
from collections import deque
from collections.abc import Callable
from statistics import fmean
from typing import Any

import torch

_RING = 256
_HEADER = 2


class ProducerCounters:
    """Per-worker production counters in shared memory (or plain memory for the in-process case)."""

    def __init__(self, num_workers: int) -> None:
        self.rows = max(1, num_workers)
        self.tensor = torch.zeros(self.rows, _HEADER + 3 * _RING, dtype=torch.float64)
        if num_workers > 0:
            self.tensor.share_memory_()

    def __getstate__(self) -> dict[str, Any]:
        # The numpy view is rebuilt in each process; the tensor travels through torch's shared memory.
        return {"rows": self.rows, "tensor": self.tensor}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.rows = state["rows"]
        self.tensor = state["tensor"]

    @property
    def array(self) -> Any:
        view = self.__dict__.get("_array")
        if view is None:
            view = self.__dict__["_array"] = self.tensor.numpy()
        return view

    def record(self, row: int, seconds: float, cpu_seconds: float | None = None, finished: float | None = None) -> None:
        data = self.array[row]
        count = int(data[0])
        slot = _HEADER + count % _RING
        data[slot] = seconds
        data[slot + _RING] = time.perf_counter() if finished is None else finished
        data[slot + 2 * _RING] = seconds if cpu_seconds is None else cpu_seconds
        data[1] += seconds
        # The count goes last: a reader never sees a slot before its duration is written.
        data[0] = count + 1


def _patch_fetchers(counters: ProducerCounters, row: int) -> None:
    """Time torch's fetchers in this worker process (a separate process: the patch stays here)."""
    from torch.utils.data._utils import fetch as fetch_module

    for cls in (fetch_module._MapDatasetFetcher, fetch_module._IterableDatasetFetcher):
        original = getattr(cls, "_loadguard_original_fetch", cls.fetch)

        def timed_fetch(self: Any, index: Any, _original: Callable[..., Any] = original) -> Any:
            start, cpu_start = time.perf_counter(), time.thread_time()
            batch = _original(self, index)
            counters.record(row, time.perf_counter() - start, time.thread_time() - cpu_start)
            return batch

        cls._loadguard_original_fetch = original  # type: ignore[attr-defined]
        cls.fetch = timed_fetch  # type: ignore[method-assign]


class WorkerMeter:
    """A ``worker_init_fn`` that installs the batch timer in each worker, then runs the user's own.

    Picklable, so it works with the ``spawn`` and ``forkserver`` start methods too.
    """

    def __init__(self, counters: ProducerCounters, user_init_fn: Callable[[int], Any] | None) -> None:
        self.counters = counters
        self.user_init_fn = user_init_fn

    def __call__(self, worker_id: int) -> None:
        # A torch without these internals still trains; only the producer side goes unmeasured.
        with contextlib.suppress(Exception):
            _patch_fetchers(self.counters, worker_id % self.counters.rows)
        if self.user_init_fn is not None:
            self.user_init_fn(worker_id)


def time_in_process_fetch(fetcher: Any, counters: ProducerCounters) -> None:
    """With ``num_workers=0`` the main process is the producer: time its fetcher instance.

    The wrapper holds the fetcher weakly: a reference cycle would keep the loader's iterator (and its
    resources) alive until the cyclic garbage collector runs, at some arbitrary later step.
    """
    fetch = type(fetcher).fetch
    owner = weakref.ref(fetcher)

    def timed_fetch(index: Any) -> Any:
        start, cpu_start = time.perf_counter(), time.thread_time()
        batch = fetch(owner(), index)
        counters.record(0, time.perf_counter() - start, time.thread_time() - cpu_start)
        return batch

    fetcher.fetch = timed_fetch


class ProducerMeter:
    """Reads the counters and keeps a rolling window of per-batch production times.

    Capacity is ``active producers / mean busy time per batch``: ``num_workers`` processes working in
    parallel, or the main process alone when ``num_workers=0``.

    Example:
        >>> meter = ProducerMeter(window=64)
        >>> counters = meter.attach(num_workers=2)
        >>> for _ in range(4):
        ...     counters.record(0, 0.1); counters.record(1, 0.1)
        >>> meter.poll(); round(meter.capacity(), 6)
        20.0
    """

    def __init__(self, window: int) -> None:
        if window < 1:
            raise ValueError(f"`window` must be a positive number of batches, got {window!r}.")
        self._durations: deque[float] = deque(maxlen=window)
        self._cpu: deque[float] = deque(maxlen=window)
        self._counters: ProducerCounters | None = None
        self._seen: list[int] = []
        self._seen_busy: list[float] = []
        self.num_workers = 0
        self.total_batches = 0
        self.total_busy_s = 0.0

    @property
    def counters(self) -> ProducerCounters | None:
        return self._counters

    def attach(self, num_workers: int) -> ProducerCounters:
        """Fresh counters for a new set of workers (a new iterator or new settings)."""
        if self._counters is not None:
            self.poll()
        self._counters = ProducerCounters(num_workers)
        self._seen = [0] * self._counters.rows
        self._seen_busy = [0.0] * self._counters.rows
        if num_workers != self.num_workers:
            self._durations.clear()
            self._cpu.clear()
        self.num_workers = num_workers
        return self._counters

    def poll(self) -> None:
        """Move newly written durations from the counters into the window."""
        counters = self._counters
        if counters is None:
            return
        table = counters.array
        fresh: list[tuple[float, float, float]] = []
        for row in range(counters.rows):
            count = int(table[row, 0])
            busy = float(table[row, 1])
            self.total_busy_s += busy - self._seen_busy[row]
            self._seen_busy[row] = busy
            new = count - self._seen[row]
            if new <= 0:
                continue
            first = max(self._seen[row], count - _RING)
            slots = [_HEADER + i % _RING for i in range(first, count)]
            ends = [slot + _RING for slot in slots]
            cpus = [slot + 2 * _RING for slot in slots]
            fresh.extend(
                zip(table[row, ends].tolist(), table[row, slots].tolist(), table[row, cpus].tolist(), strict=True)
            )
            self.total_batches += new
            self._seen[row] = count
        fresh.sort()
        self._durations.extend(duration for _, duration, _ in fresh)
        self._cpu.extend(cpu for _, _, cpu in fresh)

    def durations(self) -> tuple[float, ...]:
        return tuple(self._durations)

    def cpu_durations(self) -> tuple[float, ...]:
        """Per batch in the window, the CPU time its producer spent (aligned with :meth:`durations`)."""
        return tuple(self._cpu)

    def capacity(self) -> float | None:
        """Sustainable batches per second of all producers together, or ``None`` before any batch."""
        if not self._durations:
            return None
        mean = fmean(self._durations)
        return max(1, self.num_workers) / mean if mean > 0 else None
