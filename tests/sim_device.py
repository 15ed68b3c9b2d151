"""A simulated asynchronous accelerator: one stream, work of known duration, events on the device's clock.

It behaves like a CUDA stream seen from the host:

- ``launch(seconds)`` queues work and returns at once; the stream runs its queue in order, one item at a
  time, each starting when the previous one is done and it has been launched.
- ``synchronize()`` (and ``item()``, a tensor turned into a Python number) blocks the host until the stream
  has drained.
- ``copy(seconds, pinned=...)``: a pinned, non-blocking copy is queued like a kernel; a copy from pageable
  memory blocks the host until it ran (it waits for the work queued before it).
- ``event()`` makes an event with ``record()``, ``query()``, ``elapsed_time()``, ``synchronize()`` like
  ``torch.cuda.Event(enable_timing=True)``; ``elapsed_time`` on an event not yet passed raises, as CUDA does.
- ``queue_depth`` bounds the launched-but-unfinished items: launching into a full queue blocks the host.

The stream's timeline is computed, not slept: an item starts at ``max(its launch time, the end of the item
before)`` and ends its known duration later, on the host's ``perf_counter`` clock. A busy test machine can
delay the host (as on a real machine) but never stretches the device's work, so the device's figures have
an exact truth. The host blocks (sync, full queue, pageable copy) by sleeping until the computed time.
Every host block is counted in ``syncs`` by its cause.
"""

from __future__ import annotations

import time
from collections import Counter, deque


class SimDevice:
    def __init__(self, queue_depth: int = 1024) -> None:
        self.queue_depth = queue_depth
        self._free_at = 0.0  # when the stream finishes everything launched so far
        self._ends: deque[float] = deque()  # end times of launched items, for the queue bound
        self.syncs: Counter[str] = Counter()
        self.queries = 0
        self.busy_s = 0.0  # total duration of launched work

    # -- the host's side ----------------------------------------------------------------------------

    def launch(self, seconds: float) -> float:
        """Queue work of ``seconds`` on the stream; returns (without waiting) when it will be done."""
        now = time.perf_counter()
        while self._ends and self._ends[0] <= now:
            self._ends.popleft()
        if len(self._ends) >= self.queue_depth:
            self.syncs["full launch queue"] += 1
            _sleep_until(self._ends[0])
            now = time.perf_counter()
            self._ends.popleft()
        start = max(now, self._free_at)
        self._free_at = start + seconds
        self._ends.append(self._free_at)
        self.busy_s += seconds
        return self._free_at

    def copy(self, seconds: float, *, pinned: bool) -> None:
        """Copy a batch to the device: queued if pinned, otherwise the host waits for it."""
        done = self.launch(seconds)
        if not pinned:
            self.syncs["pageable copy"] += 1
            _sleep_until(done)

    def synchronize(self) -> None:
        self.syncs["synchronize"] += 1
        _sleep_until(self._free_at)

    def item(self) -> float:
        """A device tensor turned into a Python number: the host waits for the stream to drain."""
        self.syncs["item"] += 1
        _sleep_until(self._free_at)
        return 0.0

    def drained_at(self) -> float:
        return self._free_at

    def event(self) -> SimEvent:
        return SimEvent(self)

    @property
    def total_syncs(self) -> int:
        return sum(self.syncs.values())


class SimEvent:
    """A timing event on the simulated stream."""

    def __init__(self, device: SimDevice) -> None:
        self._device = device
        self.time: float | None = None

    def record(self) -> None:
        self.time = self._device.launch(0.0)

    def query(self) -> bool:
        self._device.queries += 1
        return self.time is not None and time.perf_counter() >= self.time

    def synchronize(self) -> None:
        self._device.syncs["event synchronize"] += 1
        if self.time is not None:
            _sleep_until(self.time)

    def elapsed_time(self, end_event: SimEvent) -> float:
        if self.time is None or end_event.time is None:
            raise RuntimeError("Both events must be recorded before calculating elapsed time.")
        if not (self.query() and end_event.query()):
            raise RuntimeError("CUDA error: device not ready")
        return (end_event.time - self.time) * 1e3


def _sleep_until(when: float) -> None:
    while (left := when - time.perf_counter()) > 0:
        time.sleep(left)
