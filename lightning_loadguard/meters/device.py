"""The accelerator's own timeline: device step time and device idle, read from events on the training stream.

On an asynchronous device (CUDA) the host queues kernels and moves on, so the host's clock says when work
was *launched*, not when it ran. This meter records a timing event on the training stream at four points of
every step and reads the device's timestamps once the device has passed them:

=====  ================================================  ==========================================
event  recorded on the host                              reached on the device
=====  ================================================  ==========================================
``F``  the loop starts fetching its batch                when everything queued before is done
``S``  the batch is in hand (before the copy)            when ``F`` is passed and ``S`` was launched
``C``  Lightning's ``batch_to_device`` has returned      when the copy ran
``E``  the step's work is launched (batch end)           when the step's kernels ran
=====  ================================================  ==========================================

Nothing is launched between ``F`` and ``S`` (the host is inside the fetch), so ``elapsed(F, S)`` is exactly
the part of the host's wait for data that the device could not fill with queued work: the **loader's**
idle. ``elapsed(E, F')`` from one step's end to the next fetch is the part of the host's other work
(callbacks, logging, a synchronising ``.item()``) that the device could not fill: the **loop's** idle (an
upper bound: device work launched in that span, by a later callback, counts in it too).
``elapsed(S, E)`` is the device step time, and ``elapsed(S, C)`` within it the copy to the device as the
device ran it. Loop idle, data idle and device step add up to the device's period ``elapsed(E, E')``.

Events come from a factory (``torch.cuda.Event(enable_timing=True)`` on CUDA, a simulated device in the
tests) and are recycled from a small pool. The meter never waits for the device: it asks ``query()`` once
per step and reads a step only when its last event has passed, usually a step or two later.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import Any, NamedTuple, Protocol

__all__ = ["DeviceEvent", "DeviceStep", "DeviceTimeline", "cuda_events"]


class DeviceEvent(Protocol):
    """What the meter needs of a timing event; ``torch.cuda.Event(enable_timing=True)`` has it."""

    def record(self) -> None:
        """Enqueue the event on the current (training) stream."""

    def query(self) -> bool:
        """Whether the device has passed the event (never blocks)."""
        ...

    def elapsed_time(self, end_event: Any) -> float:
        """Milliseconds on the device's clock from this event to ``end_event`` (both passed)."""
        ...


class DeviceStep(NamedTuple):
    """One training step on the device's clock, in seconds.

    ``data_idle_s`` and ``loop_idle_s`` precede the step: the device idle while the host fetched this
    step's batch, and from the previous step's end to that fetch.
    """

    step_s: float
    data_idle_s: float
    loop_idle_s: float
    copy_s: float

    @property
    def period_s(self) -> float:
        return self.loop_idle_s + self.data_idle_s + self.step_s

    @property
    def idle_s(self) -> float:
        return self.loop_idle_s + self.data_idle_s


class _Slot:
    """The events of one step; ``chained`` when the previous step's ``E`` is its anchor."""

    __slots__ = ("chained", "copied", "end", "fetch", "start")

    def __init__(self, chained: bool) -> None:
        self.chained = chained
        self.fetch: DeviceEvent | None = None
        self.start: DeviceEvent | None = None
        self.copied: DeviceEvent | None = None
        self.end: DeviceEvent | None = None

    def events(self) -> list[DeviceEvent]:
        return [e for e in (self.fetch, self.start, self.copied, self.end) if e is not None]


class DeviceTimeline:
    """Device step time and device idle per training step, from events read lazily.

    Args:
        new_event: makes a timing event; called only while the pool grows.
        window: steps kept for the rolling figures.
        max_pending: steps whose events may wait to be passed by the device. When the host runs further
            ahead, the next step is not measured (the chain restarts after it) rather than waiting.

    Example:
        A device whose clock the example sets by hand: each event is passed when it is recorded.

        >>> class Clock:
        ...     now = 0.0
        >>> class Event:
        ...     def record(self): self.t = Clock.now
        ...     def query(self): return True
        ...     def elapsed_time(self, end): return (end.t - self.t) * 1e3
        >>> timeline = DeviceTimeline(Event, window=10)
        >>> for step in range(3):  # fetch 10 ms, copy 2 ms, step 30 ms, callbacks 5 ms
        ...     timeline.fetch_started(); Clock.now += 0.010
        ...     timeline.fetch_finished(); Clock.now += 0.002
        ...     timeline.batch_on_device(); Clock.now += 0.028
        ...     timeline.step_ended(); Clock.now += 0.005
        >>> [round(v * 1e3, 3) for v in timeline.records()[-1]]
        [30.0, 10.0, 5.0, 2.0]
    """

    def __init__(self, new_event: Callable[[], DeviceEvent], window: int, max_pending: int = 16) -> None:
        if window < 1:
            raise ValueError(f"`window` must be a positive number of steps, got {window!r}.")
        if max_pending < 1:
            raise ValueError(f"`max_pending` must be a positive number of steps, got {max_pending!r}.")
        self._new_event = new_event
        self._max_pending = max_pending
        self._free: list[DeviceEvent] = []
        self._made = 0
        self._records: deque[DeviceStep] = deque(maxlen=window)
        self._pending: deque[_Slot] = deque()  # closed steps, oldest first, not yet read
        self._anchor: _Slot | None = None  # the last step read: its ``E`` precedes the next step
        self._open: _Slot | None = None
        self._chained = False  # whether the next step continues the one before it
        self._skipping = False
        self.skipped_steps = 0
        self.total_steps = 0
        self.total_step_s = 0.0
        self.total_idle_s = 0.0

    def resize(self, window: int) -> None:
        """Keep the latest ``window`` device steps from now on."""
        if window < 1:
            raise ValueError(f"`window` must be a positive number of steps, got {window!r}.")
        self._records = deque(self._records, maxlen=window)

    # -- marks on the host's timeline ----------------------------------------------------------------

    def fetch_started(self) -> None:
        """The loop asks for its next batch: everything the previous step launched is queued before this."""
        slot = self._begin()
        if slot is not None and slot.fetch is None:
            slot.fetch = self._record()

    def fetch_finished(self) -> None:
        """The batch is in hand; the copy to the device comes next."""
        slot = self._open if self._open is not None and self._open.start is None else self._begin()
        if slot is not None:
            slot.start = self._record()

    def batch_on_device(self) -> None:
        """The copy to the device has been launched (Lightning's ``batch_to_device`` returned)."""
        slot = self._open
        if slot is not None and slot.start is not None and slot.copied is None:
            slot.copied = self._record()

    def step_ended(self) -> None:
        """The step's work is launched; read whatever earlier steps the device has passed."""
        slot = self._open
        self._open = None
        self._skipping = False
        if slot is not None and slot.start is not None:
            slot.end = self._record()
            self._pending.append(slot)
            self._chained = True
        else:
            self._chained = False
            self._release(slot)
        self.poll()

    def break_chain(self) -> None:
        """What the loop runs next is not a training step (validation, an epoch's end, a loader switch).

        The next step's idle is not measured: the device time until it is someone else's.
        """
        self._chained = False
        self._skipping = False
        if self._open is not None and self._open.start is None:
            self._release(self._open)
            self._open = None

    # -- reading -------------------------------------------------------------------------------------

    def poll(self) -> None:
        """Read every closed step the device has passed, in order, without waiting."""
        while self._pending and self._pending[0].end is not None and self._pending[0].end.query():
            self._read(self._pending.popleft())

    def records(self) -> list[DeviceStep]:
        return list(self._records)

    def clear(self) -> None:
        """Forget the window; lifetime totals are kept."""
        self._records.clear()

    @property
    def events_made(self) -> int:
        """Timing events created so far: the pool's size."""
        return self._made

    @property
    def lag_steps(self) -> int:
        """Closed steps the device has not passed yet: how far the host runs ahead, at least."""
        return len(self._pending)

    # -- internals -----------------------------------------------------------------------------------

    def _begin(self) -> _Slot | None:
        if self._open is not None:
            # A fetch without a step end (the loop skipped the batch, or an exception): drop that step.
            self._release(self._open)
            self._open = None
            self._chained = False
        if len(self._pending) >= self._max_pending:
            self.poll()
        if len(self._pending) >= self._max_pending:
            # The host is further ahead than the pool covers: this step goes unmeasured, nothing waits. A step
            # begins at its fetch's start and again at its end: it counts once.
            if not self._skipping:
                self.skipped_steps += 1
            self._skipping = True
            self._chained = False
            return None
        self._skipping = False
        self._open = _Slot(self._chained)
        return self._open

    def _record(self) -> DeviceEvent:
        if self._free:
            event = self._free.pop()
        else:
            event = self._new_event()
            self._made += 1
        event.record()
        return event

    def _release(self, slot: _Slot | None) -> None:
        if slot is not None:
            self._free.extend(slot.events())

    def _read(self, slot: _Slot) -> None:
        anchor, self._anchor = self._anchor, slot
        assert slot.start is not None and slot.end is not None
        if slot.chained and anchor is not None and anchor.end is not None and slot.fetch is not None:
            step = slot.start.elapsed_time(slot.end) / 1e3
            copy = slot.start.elapsed_time(slot.copied) / 1e3 if slot.copied is not None else 0.0
            record = DeviceStep(
                step_s=max(0.0, step),
                data_idle_s=max(0.0, slot.fetch.elapsed_time(slot.start) / 1e3),
                loop_idle_s=max(0.0, anchor.end.elapsed_time(slot.fetch) / 1e3),
                copy_s=max(0.0, copy),
            )
            self._records.append(record)
            self.total_steps += 1
            self.total_step_s += record.step_s
            self.total_idle_s += record.idle_s
        self._release(anchor)


def cuda_events(device: Any) -> Callable[[], DeviceEvent] | None:
    """The event factory for a CUDA training device, or ``None`` where the host's clock is the device's.

    Events are recorded on the current stream of the current device, which is the training device once
    the strategy has set it up.

    Example:
        >>> import torch
        >>> cuda_events(torch.device("cpu")) is None
        True
    """
    import torch

    if getattr(device, "type", None) != "cuda" or not torch.cuda.is_available():
        return None
    return lambda: torch.cuda.Event(enable_timing=True)
