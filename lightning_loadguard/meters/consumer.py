"""The consumer side: how long each training step waited for its batch, and how long the rest took.

A step's period runs from one fetch start to the next. The fetch itself is the data wait; the remainder,
less any time explicitly excluded (validation runs inside the epoch), is the step time. The meter takes
timestamps from its caller, so it is driven identically by a Trainer adapter and by a synthetic test.
"""

from __future__ import annotations

from collections import deque
from typing import NamedTuple

_NAN = float("nan")


class StepRecord(NamedTuple):
    """One completed training step, in seconds (a tuple: one is made per step, so it must be cheap)."""

    wait_s: float
    step_s: float
    transfer_s: float = 0.0
    ready: bool | None = None
    buffer_level: int | None = None
    queued_s: float = float("nan")  # of the wait, time the loop's thread waited for a core (NaN: not sampled)


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

    def __init__(self, window: int) -> None:
        if window < 1:
            raise ValueError(f"`window` must be a positive number of steps, got {window!r}.")
        self._records: deque[StepRecord] = deque(maxlen=window)
        self._fetch_start: float | None = None
        self._fetch_end: float | None = None
        self._wait: float | None = None
        self._excluded = 0.0
        self._transfer = 0.0
        self._ready: bool | None = None
        self._level: int | None = None
        self._startup = 0.0
        self._queued = _NAN
        self.total_steps = 0
        self.total_wait_s = 0.0
        self.total_step_s = 0.0

    def fetch_started(self, now: float) -> None:
        """The loop asked for its next batch: this closes the previous step."""
        self.close_step(now)
        self._fetch_start = now

    def fetch_finished(self, now: float) -> None:
        if self._fetch_start is None:
            return
        self._wait = max(0.0, now - self._fetch_start - self._startup)
        self._fetch_end = now

    def fetch_observed(self, ready: bool | None, buffer_level: int | None, startup_s: float = 0.0) -> None:
        """What the loader knew at the moment of the fetch (from the producer side, if instrumented).

        ``startup_s`` is the part of this fetch spent waiting for the workers to start: it belongs to the
        epoch's start-up, reported on its own, not to the data wait.
        """
        self._ready = ready
        self._level = buffer_level
        self._startup = startup_s

    def fetch_queued(self, seconds: float) -> None:
        """Of this fetch's wait, ``seconds`` went to waiting for a core (sampled on some fetches only)."""
        self._queued = seconds

    def step_started(self, now: float) -> None:
        """The step begins: the time since the batch arrived went to handing it to the step (transfer)."""
        if self._fetch_end is not None:
            self._transfer = max(0.0, now - self._fetch_end)

    def exclude(self, seconds: float) -> None:
        """Time inside the current step that is not training (e.g. a validation run)."""
        self._excluded += seconds

    def close_step(self, now: float) -> None:
        """End the open step at ``now`` (the next fetch, or the end of the epoch)."""
        if self._fetch_end is not None and self._wait is not None:
            step = max(0.0, now - self._fetch_end - self._excluded)
            self._records.append(StepRecord(self._wait, step, self._transfer, self._ready, self._level, self._queued))
            self.total_steps += 1
            self.total_wait_s += self._wait
            self.total_step_s += step
        self._fetch_start = self._fetch_end = self._wait = None
        self._excluded = self._transfer = 0.0
        self._ready = self._level = None
        self._startup = 0.0
        self._queued = _NAN

    def records(self) -> list[StepRecord]:
        return list(self._records)

    def resize(self, window: int) -> None:
        """Keep the latest ``window`` steps from now on (the window adapts to the epoch's length)."""
        if window < 1:
            raise ValueError(f"`window` must be a positive number of steps, got {window!r}.")
        self._records = deque(self._records, maxlen=window)

    def clear(self) -> None:
        """Forget the window (the loader changed); lifetime totals are kept."""
        self._records.clear()
