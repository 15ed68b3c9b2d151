"""The consumer side: how long each training step waited for its batch, and how long the rest took.

A step's period runs from one fetch start to the next. The fetch itself is the data wait; the remainder,
less any time explicitly excluded (validation runs inside the epoch), is the step time. The meter takes
timestamps from its caller, so it is driven identically by a Trainer adapter and by a synthetic test.
"""

from __future__ import annotations

import math
import time
from collections import deque
from typing import Any, NamedTuple

from lightning_loadguard.meters.producer import _queued_seconds

_NAN = float("nan")


class StepRecord(NamedTuple):
    """One completed training step, in seconds (kept as a plain tuple until read)."""

    wait_s: float
    step_s: float
    transfer_s: float = float("nan")  # NaN: not timed on this step
    ready: bool | None = None
    buffer_level: int | None = None
    queued_s: float = float("nan")  # of the wait, time the loop's thread waited for a core (NaN: not sampled)
    cpu_s: float = float("nan")  # the loop thread's CPU time in the fetch, where it made the batch (NaN: not sampled)


class ConsumerMeter:
    """Records data wait and step time per training step over a rolling window.

    Example:
        >>> meter = ConsumerMeter(window=100)
        >>> meter.fetch_started(0.000); meter.fetch_finished(0.010)
        >>> meter.fetch_started(0.030); meter.fetch_finished(0.031)
        >>> meter.close_step(0.050)
        >>> [round(r.wait_s, 3) for r in meter.records()], [round(r.step_s, 3) for r in meter.records()]
        ([0.01, 0.001], [0.02, 0.019])
    """

    def __init__(self, window: int, core_wait_interval_s: float | None = None) -> None:
        if window < 1:
            raise ValueError(f"`window` must be a positive number of steps, got {window!r}.")
        if core_wait_interval_s is not None and not core_wait_interval_s >= 0:
            raise ValueError(
                "`core_wait_interval_s` must be None (never) or a number of seconds >= 0, "
                f"got {core_wait_interval_s!r}."
            )
        self.core_wait_interval_s = core_wait_interval_s
        """The calling thread's wait for a core during a fetch is read (Linux) on the first fetch that starts at
        least this long after the previous such read (0: every fetch; ``None``: never)."""
        self._next_core_wait = -math.inf
        self._queued_before: float | None = None
        self._records: deque[tuple[Any, ...]] = deque(maxlen=window)
        self._fetch_start: float | None = None
        self._fetch_end: float | None = None
        self._wait: float | None = None
        self._excluded = 0.0
        self._transfer = _NAN
        self._ready: bool | None = None
        self._level: int | None = None
        self._startup = 0.0
        self._queued = _NAN
        self.total_steps = 0
        self.total_wait_s = 0.0
        self.total_step_s = 0.0
        self.produced_on_demand = False
        """Whether each batch is made when asked for (``num_workers=0``): no fetch finds it made, none waits."""
        self.made_here = False
        """Whether each fetch makes its batch in this thread (``num_workers=0``) and is the making's only timer:
        a step's wait is then its batch's busy time, and its CPU time is read with its core wait. Set by the producer
        meter that reads the batches from the records (:meth:`ProducerMeter.made_by_loop`): nothing more per fetch."""
        self._cpu_before = _NAN
        self._cpu = _NAN

    def fetch_started(self, now: float) -> None:
        """The loop asked for its next batch: this closes the previous step."""
        # Runs on every step, with the caches cold from the step's own work: one call, plain tuples.
        wait = self._wait
        if self._fetch_end is not None and wait is not None:
            step = now - self._fetch_end - self._excluded
            step = step if step > 0.0 else 0.0
            self._records.append((wait, step, self._transfer, self._ready, self._level, self._queued, self._cpu))
            self.total_steps += 1
            self.total_wait_s += wait
            self.total_step_s += step
        self._fetch_start = now
        self._fetch_end = self._wait = None
        if self.produced_on_demand:
            self._ready, self._level = False, 0
        else:
            self._ready = self._level = None
        self._excluded = self._startup = 0.0
        self._transfer = self._queued = self._cpu = _NAN
        interval = self.core_wait_interval_s
        if interval is not None and now >= self._next_core_wait:
            self._next_core_wait = now + interval
            self._queued_before = _queued_seconds()
            if self.made_here:
                self._cpu_before = time.thread_time()

    def fetch_finished(self, now: float) -> None:
        if self._fetch_start is None:
            return
        wait = now - self._fetch_start - self._startup
        self._wait = wait = wait if wait > 0.0 else 0.0
        self._fetch_end = now
        before = self._queued_before
        if before is not None:
            self._queued_before = None
            if self.made_here:
                self._cpu, self._cpu_before = time.thread_time() - self._cpu_before, _NAN
            after = _queued_seconds()
            if after is not None:
                self._queued = max(0.0, after - before)

    @property
    def fetched(self) -> tuple[int, float]:
        """Fetches finished in all and the seconds they waited: the closed steps', and the latest fetch's while
        its step runs."""
        wait = self._wait
        if wait is None:
            return self.total_steps, self.total_wait_s
        return self.total_steps + 1, self.total_wait_s + wait

    @property
    def fetch_open(self) -> bool:
        """Whether a fetch has started and not finished."""
        return self._fetch_start is not None and self._fetch_end is None

    def fetch_observed(self, ready: bool | None, buffer_level: int | None, startup_s: float = 0.0) -> None:
        """What the loader knew at the moment of the fetch (from the producer side, if instrumented).

        ``startup_s`` is the part of this fetch spent waiting for the workers to start: it belongs to the
        epoch's start-up, reported on its own, not to the data wait.
        """
        self._ready = ready
        self._level = buffer_level
        self._startup = startup_s

    def step_started(self, now: float) -> None:
        """The step begins: the time since the batch arrived went to handing it to the step (transfer).

        Optional: a step it is not called on keeps its transfer unmeasured (NaN), not zero.
        """
        if self._fetch_end is not None:
            self._transfer = max(0.0, now - self._fetch_end)

    def exclude(self, seconds: float) -> None:
        """Time inside the current step that is not training (e.g. a validation run)."""
        self._excluded += seconds

    def close_step(self, now: float) -> None:
        """End the open step at ``now`` (the next fetch, or the end of the epoch)."""
        self.fetch_started(now)
        self._fetch_start = self._queued_before = None

    @property
    def last_period_s(self) -> float:
        """The latest completed step's period (its wait and its step), 0 before the first."""
        if not self._records:
            return 0.0
        last = self._records[-1]
        return last[0] + last[1]

    @property
    def window_steps(self) -> int:
        """Steps now in the window."""
        return len(self._records)

    def records(self) -> list[StepRecord]:
        return list(map(StepRecord._make, self._records))

    def columns(self, last: int | None = None) -> StepRecord:
        """The window's (or its ``last`` steps') records field by field: a tuple of values per field."""
        records = list(self._records) if last is None else list(self._records)[len(self._records) - last :]
        if not records:
            return StepRecord((), (), (), (), (), (), ())
        return StepRecord._make(zip(*records, strict=True))

    def resize(self, window: int) -> None:
        """Keep the latest ``window`` steps from now on (the window adapts to the epoch's length)."""
        if window < 1:
            raise ValueError(f"`window` must be a positive number of steps, got {window!r}.")
        self._records = deque(self._records, maxlen=window)

    def clear(self) -> None:
        """Forget the window (the loader changed); lifetime totals are kept."""
        self._records.clear()
