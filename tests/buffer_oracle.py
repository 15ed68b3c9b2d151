"""An event-driven simulation of torch's multi-process DataLoader feeding a loop: the tests' oracle.

Written from torch's ``_MultiProcessingDataLoaderIter`` (``torch/utils/data/dataloader.py``), not from the
package: at ``iter()`` the loader hands ``num_workers x prefetch_factor`` batch indices to the workers in
turn; each time the loop takes a batch it hands out one more, to the next worker in turn; each worker makes
its batches one after another in the order it got them; the loop takes batches strictly in order and steps
after each. Time moves from event to event (a worker finishes, the loop asks for its next batch), so
nothing here is a closed-form recurrence to be shared with the code under test.
"""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Sequence


def loader_waits(
    production_s: Sequence[float], step_s: Sequence[float], *, workers: int, prefetch: int, steps: int
) -> tuple[list[float], float]:
    """Per step, how long the loop waited for its batch, and the time the last step ended.

    Batch ``j`` takes ``production_s[j % len]`` to make, step ``k`` takes ``step_s[k % len]``.
    """
    assert workers >= 1 and prefetch >= 1 and steps >= 1
    queues: list[deque[int]] = [deque() for _ in range(workers)]
    busy = [False] * workers
    ready: set[int] = set()
    events: list[tuple[float, int, str, int]] = []  # (time, tie-break, kind, batch or worker)
    order = 0
    issued = 0
    waits: list[float] = []
    asked_at: float | None = None  # when the loop asked for batch len(waits), if it is still waiting

    def push(time: float, kind: str, what: int) -> None:
        nonlocal order
        heapq.heappush(events, (time, order, kind, what))
        order += 1

    def start_next(worker: int, now: float) -> None:
        if queues[worker] and not busy[worker]:
            batch = queues[worker].popleft()
            busy[worker] = True
            push(now + production_s[batch % len(production_s)], "made", batch)

    def issue(now: float) -> None:
        nonlocal issued
        worker = issued % workers
        queues[worker].append(issued)
        issued += 1
        start_next(worker, now)

    def take(batch: int, now: float, asked: float) -> None:
        waits.append(now - asked)
        issue(now)
        push(now + step_s[batch % len(step_s)], "ask", batch + 1)

    for _ in range(workers * prefetch):
        issue(0.0)
    push(0.0, "ask", 0)
    end = 0.0
    while events:
        now, _, kind, what = heapq.heappop(events)
        if kind == "made":
            ready.add(what)
            worker = what % workers
            busy[worker] = False
            start_next(worker, now)
            if asked_at is not None and what == len(waits):
                asked, asked_at = asked_at, None
                take(what, now, asked)
        elif what == steps:  # the loop asks past its last step: the run is over
            end = now
            break
        elif what in ready:
            take(what, now, now)
        else:
            asked_at = now
    return waits, end


def brute_force_depth(prod: Sequence[float], step: Sequence[float], workers: int, tolerance: float) -> int:
    """The smallest prefetch depth (of 1 to 32, every one replayed) whose mean wait is within ``tolerance`` of a
    mean step of the deepest's."""
    steps = max(256, 4 * max(len(prod), len(step)))
    waits = [sum(loader_waits(prod, step, workers=workers, prefetch=p, steps=steps)[0]) / steps for p in range(1, 33)]
    allowed = waits[-1] + tolerance * sum(step) / len(step)
    return next(p for p, w in enumerate(waits, start=1) if w <= allowed)
