"""The producer side: how fast the loader's workers make batches, metered inside the workers.

Each worker times every batch it makes (dataset access plus collate, the work torch's fetcher does) and
writes the duration into a row of a shared-memory tensor that the main process reads. Idle time (a worker
blocked because the buffer is full) is never counted, so the capacity is right also when the consumer
never waits. With ``num_workers=0`` the in-process fetch is timed the same way until the loop's own fetch
timing, which runs anyway and brackets the making, takes over: the consumer meter's step records are then the
batches' records (:meth:`ProducerMeter.made_by_loop`), and nothing more runs per fetch.

Beside the busy time of a sample of the batches (one each ``SAMPLE_INTERVAL_S`` per producer) go their CPU
time (the worker thread's own) and, on Linux, the time the thread sat runnable waiting for a core
(``/proc/thread-self/schedstat``): CPU over busy-minus-queueing tells a worker that waits on I/O (it needs
no core of its own) from one that computes, also when too many workers queue for too few cores. Those are
NaN for the batches in between: reading them takes four system calls, which on every batch of a fast
pipeline would cost a percent of the step by themselves. Slow batches are each sampled.

Row layout (float64): ``[batches_made, busy_seconds, ready_at, durations[RING], finish_times[RING],
cpu_seconds[RING], queued_seconds[RING]]``; ``ready_at`` is when the worker finished starting up (its
``worker_init_fn`` included). A single writer per row; the reader only looks at the ring entries the counter
says were written, and merges the rows in finishing order (``perf_counter`` is the system-wide monotonic
clock on Linux).
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
import weakref
from collections import deque
from collections.abc import Callable
from statistics import fmean
from typing import TYPE_CHECKING, Any

import torch

from lightning_loadguard import _torch

if TYPE_CHECKING:
    from lightning_loadguard.meters.consumer import ConsumerMeter

_RING = 256
_HEADER = 3
_READY_AT = 2
_DURATION, _FINISHED, _CPU, _QUEUED = (_HEADER + k * _RING for k in range(4))
_SCHEDSTAT = "/proc/thread-self/schedstat"
_WIDTH = _HEADER + 4 * _RING
ROW_WIDTH = _WIDTH
"""Entries per row of :attr:`ProducerCounters.flat`; a row's first entry counts the batches it made."""
_NAN = float("nan")

SAMPLE_INTERVAL_S = 0.02
"""Each producer measures the CPU and core-queueing time of the first batch it starts at least this long
after its previous sample (or its start); every batch's busy time is measured."""


_schedstat_fds: dict[int, int] = {}


def _forget_schedstat_fds() -> None:
    # A forked child inherits the descriptors, but they still name its parent's threads.
    for fd in _schedstat_fds.values():
        if fd >= 0:
            with contextlib.suppress(OSError):
                os.close(fd)
    _schedstat_fds.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_schedstat_fds)


def _queued_seconds() -> float | None:
    """Seconds this thread has spent runnable but waiting for a core (Linux); ``None`` elsewhere.

    Called twice per batch: each thread keeps its own ``schedstat`` open and re-reads it with ``pread``
    (about a microsecond), where opening it anew costs tens of microseconds.
    """
    thread = threading.get_ident()
    fd = _schedstat_fds.get(thread)
    if fd is None:
        try:
            fd = os.open(_SCHEDSTAT, os.O_RDONLY)
        except (OSError, AttributeError):
            fd = -1  # no such file here: asked once per thread, not once per batch
        _schedstat_fds[thread] = fd
    if fd < 0:
        return None
    try:
        return int(os.pread(fd, 64, 0).split()[1]) / 1e9
    except (OSError, IndexError, ValueError, AttributeError):
        # The thread that opened it has ended and its identity was reused: open it again next time.
        _schedstat_fds.pop(thread, None)
        with contextlib.suppress(OSError):
            os.close(fd)
        return None


class ProducerCounters:
    """Per-worker production counters in shared memory (or plain memory for the in-process case)."""

    def __init__(self, num_workers: int) -> None:
        self.rows = max(1, num_workers)
        self.tensor = torch.zeros(self.rows, _HEADER + 4 * _RING, dtype=torch.float64)
        if num_workers > 0:
            self.tensor.share_memory_()
        self._view()

    def __getstate__(self) -> dict[str, Any]:
        # The views are rebuilt in each process; the tensor travels through torch's shared memory.
        return {"rows": self.rows, "tensor": self.tensor}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.rows = state["rows"]
        self.tensor = state["tensor"]
        self._view()

    def _view(self) -> None:
        self.array: Any = self.tensor.numpy()
        """The table as a numpy array, one row per producer."""
        # Element access through a memoryview costs tens of nanoseconds, through numpy hundreds.
        self.flat = memoryview(self.array.reshape(-1)).cast("B").cast("d")
        """The table as one flat run of float64 (row ``r`` starts at ``r * ROW_WIDTH``)."""

    def record(
        self,
        row: int,
        seconds: float,
        cpu_seconds: float = _NAN,
        queued_seconds: float = _NAN,
        finished: float | None = None,
    ) -> None:
        """One batch made by ``row``: its busy time, and its CPU and queueing time where sampled (else NaN)."""
        data = self.flat
        base = row * _WIDTH
        count = int(data[base])
        slot = base + count % _RING
        data[slot + _DURATION] = seconds
        data[slot + _FINISHED] = time.perf_counter() if finished is None else finished
        data[slot + _CPU] = cpu_seconds
        data[slot + _QUEUED] = queued_seconds
        data[base + 1] += seconds
        # The count goes last: a reader never sees a slot before its duration is written.
        data[base] = count + 1

    def mark_ready(self, row: int) -> None:
        self.array[row, _READY_AT] = time.perf_counter()

    def ready_at(self) -> float:
        """When the last of the workers finished starting up (0 before any did)."""
        return float(self.array[:, _READY_AT].max())

    def made(self, row: int) -> int:
        return int(self.flat[row * _WIDTH])


def _timed(
    fetch: Callable[..., Any],
    counters: ProducerCounters,
    row: int,
    on_error: Callable[[Exception], None] | None = None,
) -> Callable[..., Any]:
    """``fetch`` with each call's busy time recorded in ``row``; CPU and core-queueing time on a sample.

    The timing never reaches the data path: when it fails, ``on_error`` hears of it once and every later
    call is the plain ``fetch``; the fetch's own exceptions (``StopIteration`` ending an iterable dataset
    included) pass unchanged.
    """
    next_sample = time.perf_counter() + SAMPLE_INTERVAL_S
    broken = False

    def give_up(err: Exception) -> None:
        nonlocal broken
        broken = True
        if on_error is not None:
            with contextlib.suppress(Exception):
                on_error(err)

    def timed_fetch(*args: Any) -> Any:
        nonlocal next_sample
        if broken:
            return fetch(*args)
        try:
            start = time.perf_counter()
            sampled = start >= next_sample
            if sampled:
                queued_start = _queued_seconds()
                start, cpu_start = time.perf_counter(), time.thread_time()
        except Exception as err:
            give_up(err)
            return fetch(*args)
        batch = fetch(*args)
        try:
            end = time.perf_counter()
            if not sampled:
                counters.record(row, end - start, finished=end)
                return batch
            cpu = time.thread_time() - cpu_start
            queued_end = _queued_seconds()
            queued = queued_end - queued_start if queued_start is not None and queued_end is not None else 0.0
            counters.record(row, end - start, cpu, queued, finished=end)
            next_sample = end + SAMPLE_INTERVAL_S
        except Exception as err:
            give_up(err)
        return batch

    return timed_fetch


def _patch_fetchers(counters: ProducerCounters, row: int) -> None:
    """Time torch's fetchers in this worker process (a separate process: the patch stays here)."""
    for cls in _torch.fetcher_classes():
        original = getattr(cls, "_loadguard_original_fetch", cls.fetch)
        cls._loadguard_original_fetch = original  # type: ignore[attr-defined]
        cls.fetch = _timed(original, counters, row)  # type: ignore[method-assign]


class WorkerMeter:
    """A ``worker_init_fn`` that installs the batch timer in each worker, then runs the user's own.

    Picklable, so it works with the ``spawn`` and ``forkserver`` start methods too.
    """

    def __init__(self, counters: ProducerCounters, user_init_fn: Callable[[int], Any] | None) -> None:
        self.counters = counters
        self.user_init_fn = user_init_fn

    def __call__(self, worker_id: int) -> None:
        row = worker_id % self.counters.rows
        # A torch without these internals still trains; only the producer side goes unmeasured.
        with contextlib.suppress(Exception):
            _patch_fetchers(self.counters, row)
        if self.user_init_fn is not None:
            self.user_init_fn(worker_id)
        with contextlib.suppress(Exception):
            self.counters.mark_ready(row)


def time_in_process_fetch(
    fetcher: Any,
    counters: ProducerCounters,
    on_error: Callable[[Exception], None] | None,
    hand_over: Callable[[], bool],
) -> None:
    """With ``num_workers=0`` the main process is the producer: time its fetcher instance, until ``hand_over()``
    says, on some fetch, that the caller times it from now on (that fetch included): then the fetcher runs
    unwrapped.

    The wrapper holds the fetcher weakly: a reference cycle would keep the loader's iterator (and its
    resources) alive until the cyclic garbage collector runs, at some arbitrary later step.
    """
    fetch = type(fetcher).fetch
    owner = weakref.ref(fetcher)
    timed = _timed(lambda index: fetch(owner(), index), counters, 0, on_error)

    def timed_until_handed_over(index: Any) -> Any:
        current = owner()
        try:
            handed = hand_over()
        except Exception as err:
            handed = False
            if on_error is not None:
                with contextlib.suppress(Exception):
                    on_error(err)
        if not handed:
            return timed(index)
        current.__dict__.pop("fetch", None)
        return fetch(current, index)

    fetcher.fetch = timed_until_handed_over


def _ring_span(row: Any, base: int, first: int, end: int) -> list[float]:
    """Entries ``first`` to ``end`` (exclusive, counted from the start) of the ring at ``base`` in ``row``:
    one or two slices, not an index per entry."""
    start, stop = base + first % _RING, base + (end - 1) % _RING + 1
    if stop > start:
        return row[start:stop].tolist()
    return row[start : base + _RING].tolist() + row[base:stop].tolist()


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
        self._queued: deque[float] = deque(maxlen=window)
        self._counters: ProducerCounters | None = None
        self._seen: list[int] = []
        self._seen_busy: list[float] = []
        self.num_workers = 0
        self.total_batches = 0
        self.total_busy_s = 0.0
        self.entered = 0
        """Batches entered into the window in all: fewer than :attr:`total_batches` where some were made
        between two polls further apart than the counters' ring or the loop's window."""
        self._loop: ConsumerMeter | None = None
        self._loop_fetched = self._loop_recorded = 0
        self._loop_wait_s = 0.0

    def resize(self, window: int) -> None:
        """Keep the latest ``window`` batches from now on."""
        if window < 1:
            raise ValueError(f"`window` must be a positive number of batches, got {window!r}.")
        self._durations = deque(self._durations, maxlen=window)
        self._cpu = deque(self._cpu, maxlen=window)
        self._queued = deque(self._queued, maxlen=window)

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
            self._queued.clear()
        self.num_workers = num_workers
        return self._counters

    def made_by_loop(self, consumer: ConsumerMeter | None) -> None:
        """From now on (``None``: no longer) each fetch ``consumer`` times is a batch made in this process, its
        wait the batch's busy time: the loop's fetch makes it (``num_workers=0``) and no timer inside the loader
        runs any more. The consumer is told (``ConsumerMeter.made_here``): it then reads each sampled fetch's
        CPU time.

        Read on :meth:`poll`: every fetch finished goes into the totals; the closed steps' waits, the latest up
        to the consumer's window, into this window (all of them where polled at least once a window).
        """
        self._take_from_loop()
        if self._loop is not None:
            self._loop.made_here = False
        self._loop = consumer
        if consumer is not None:
            consumer.made_here = True
            self._loop_fetched, self._loop_wait_s = consumer.fetched
            self._loop_recorded = self._loop_fetched

    def _take_from_loop(self) -> None:
        consumer = self._loop
        if consumer is None:
            return
        fetched, waited = consumer.fetched
        if fetched > self._loop_fetched:
            self.total_batches += fetched - self._loop_fetched
            self.total_busy_s += waited - self._loop_wait_s
            self._loop_fetched, self._loop_wait_s = fetched, waited
        new = consumer.total_steps - self._loop_recorded
        if new > 0:
            steps = consumer.columns(min(new, consumer.window_steps))
            self._enter(steps.wait_s, steps.cpu_s, steps.queued_s)
            self._loop_recorded = consumer.total_steps

    def poll(self) -> None:
        """Move newly written durations from the counters (and the loop's fetches, :meth:`made_by_loop`) into
        the window."""
        self._poll_counters()
        self._take_from_loop()  # after the counters: their batches were made before the loop took over

    def _poll_counters(self) -> None:
        counters = self._counters
        if counters is None:
            return
        table = counters.array
        fresh: list[tuple[float, float, float, float]] = []
        for row in range(counters.rows):
            count = int(table[row, 0])
            busy = float(table[row, 1])
            self.total_busy_s += busy - self._seen_busy[row]
            self._seen_busy[row] = busy
            new = count - self._seen[row]
            if new <= 0:
                continue
            first = max(self._seen[row], count - _RING)
            columns = [_ring_span(table[row], base, first, count) for base in (_FINISHED, _DURATION, _CPU, _QUEUED)]
            fresh.extend(zip(*columns, strict=True))
            self.total_batches += new
            self._seen[row] = count
        fresh.sort()
        if fresh:
            _, durations, cpu, queued = zip(*fresh, strict=True)
            self._enter(durations, cpu, queued)

    def _enter(self, durations: tuple[float, ...], cpu: tuple[float, ...], queued: tuple[float, ...]) -> None:
        """Batches into the window, oldest first: their busy, CPU and core-wait times."""
        self.entered += len(durations)
        self._durations.extend(durations)
        self._cpu.extend(cpu)
        self._queued.extend(queued)

    def durations(self) -> tuple[float, ...]:
        return tuple(self._durations)

    def cpu_durations(self) -> tuple[float, ...]:
        """Per batch in the window, the CPU time its producer spent (aligned with :meth:`durations`; NaN where
        not sampled)."""
        return tuple(self._cpu)

    def queued_durations(self) -> tuple[float, ...]:
        """Per batch in the window, the time its producer waited for a core (aligned with :meth:`durations`;
        NaN where not sampled)."""
        return tuple(self._queued)

    def capacity(self) -> float | None:
        """Sustainable batches per second of all producers together, or ``None`` before any batch."""
        if not self._durations:
            return None
        mean = fmean(self._durations)
        return max(1, self.num_workers) / mean if mean > 0 else None
