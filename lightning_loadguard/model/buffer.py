"""A bounded-buffer model of a DataLoader feeding a training loop.

Two tools answer "how much will the loop wait for data":

- :func:`simulate_buffer` replays measured per-batch production times and per-step consumer times through
  the same mechanism as torch's multi-process ``DataLoader``: batch ``i`` goes to worker ``i mod W``, a
  worker makes its batches in order, at most ``D = W x prefetch_factor`` batches are outstanding (issued but
  not yet taken), one new batch is issued each time the consumer takes one, and the consumer takes batches
  strictly in order.
- :func:`steady_state_wait` is the closed-form M/M/1/K-style estimate (the one tf.data's autotuner uses)
  for when only mean times are known.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from lightning_loadguard.meters.settings import DEFAULT_PREFETCH


@dataclass(frozen=True)
class BufferRun:
    """The outcome of one simulated run (times in seconds).

    Attributes:
        waits: per step, how long the consumer blocked before its batch was there.
        levels: per step, batches already made and waiting at the moment the consumer asked (``()`` when
            levels were not recorded; always 0 without workers).
        elapsed_s: time from the start until the last step finished.
        num_workers: workers simulated.
        prefetch_factor: batches each worker may have outstanding.
    """

    waits: tuple[float, ...]
    levels: tuple[int, ...]
    elapsed_s: float
    num_workers: int
    prefetch_factor: int

    @property
    def steps(self) -> int:
        return len(self.waits)

    @property
    def total_wait_s(self) -> float:
        return math.fsum(self.waits)

    @property
    def mean_wait_s(self) -> float:
        return self.total_wait_s / self.steps if self.steps else 0.0

    @property
    def throughput(self) -> float:
        """Batches per second the loop achieved over the whole run."""
        return self.steps / self.elapsed_s if self.elapsed_s > 0 else float("inf")

    @property
    def wait_fraction(self) -> float:
        """Share of the run the consumer spent waiting (0..1)."""
        return self.total_wait_s / self.elapsed_s if self.elapsed_s > 0 else 0.0


def simulate_buffer(
    production_s: Sequence[float],
    step_s: Sequence[float],
    *,
    num_workers: int,
    prefetch_factor: int = DEFAULT_PREFETCH,
    steps: int | None = None,
    record_levels: bool = True,
) -> BufferRun:
    """Replay production and step times through a ``DataLoader``-shaped bounded buffer.

    Args:
        production_s: busy time to make each batch (batch ``j`` uses ``production_s[j % len]``).
        step_s: consumer time of each step after it has its batch (replayed cyclically too).
        num_workers: loader workers; ``0`` makes batches in the consumer's process, so each step waits
            for the whole production of its batch.
        prefetch_factor: outstanding batches per worker (ignored when ``num_workers == 0``).
        steps: steps to simulate; by default ``max(len(production_s), len(step_s))``.
        record_levels: also record the buffer level at every fetch (costs ``O(depth)`` per step).

    Returns:
        A :class:`BufferRun`.

    Raises:
        ValueError: on empty or negative times, ``num_workers < 0``, ``prefetch_factor < 1`` or
            ``steps < 1``.

    Example:
        Two workers at 0.3 s per batch keep up with a 0.2 s step (capacity 6.7/s > 5/s); only the first
        batch is waited for:

        >>> run = simulate_buffer([0.3], [0.2], num_workers=2, prefetch_factor=2, steps=50)
        >>> round(run.waits[0], 3), round(max(run.waits[5:]), 3)
        (0.3, 0.0)

        Without workers every step waits for its batch:

        >>> simulate_buffer([0.3], [0.2], num_workers=0, steps=3).waits
        (0.3, 0.3, 0.3)
    """
    prod = _checked_times("production_s", production_s)
    step = _checked_times("step_s", step_s)
    if isinstance(num_workers, bool) or not isinstance(num_workers, int) or num_workers < 0:
        raise ValueError(f"num_workers must be an integer >= 0, got {num_workers!r}")
    if isinstance(prefetch_factor, bool) or not isinstance(prefetch_factor, int) or prefetch_factor < 1:
        raise ValueError(f"prefetch_factor must be an integer >= 1, got {prefetch_factor!r}")
    n = max(len(prod), len(step)) if steps is None else steps
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"steps must be an integer >= 1 or None, got {steps!r}")
    if num_workers == 0:
        return _simulate_in_process(prod, step, n, record_levels)
    return _simulate_workers(prod, step, n, num_workers, prefetch_factor, record_levels)


def steady_state_wait(step_s: float, production_s: float, depth: int) -> float:
    """Expected wait per step of a buffered stage in steady state (M/M/1/K-style).

    With consumer time ``x = step_s``, producer time ``y = production_s`` per batch (of the producer as a
    whole, i.e. ``1 / capacity``) and a buffer of ``n = depth`` batches, the buffer is empty with
    probability ``p = (1 - x/y) / (1 - (x/y)^(n+1))`` and the wait is ``p * y``. When ``y > x`` the wait
    tends to ``y - x`` however deep the buffer; when ``y < x`` it falls geometrically with depth.

    Args:
        step_s: mean consumer time per step, > 0.
        production_s: mean producer time per batch, >= 0.
        depth: buffer depth in batches, >= 0.

    Example:
        >>> round(steady_state_wait(0.1, 0.2, 1000), 3)  # a deficit: no depth hides it
        0.1
        >>> steady_state_wait(0.2, 0.1, 8) < 0.001  # spare capacity: a small buffer suffices
        True
    """
    if not (math.isfinite(step_s) and step_s > 0):
        raise ValueError(f"step_s must be a finite number > 0, got {step_s!r}")
    if not (math.isfinite(production_s) and production_s >= 0):
        raise ValueError(f"production_s must be a finite number >= 0, got {production_s!r}")
    if isinstance(depth, bool) or not isinstance(depth, int) or depth < 0:
        raise ValueError(f"depth must be an integer >= 0, got {depth!r}")
    if production_s == 0:
        return 0.0
    rho = step_s / production_s
    k = depth + 1
    if math.isclose(rho, 1.0, rel_tol=1e-12):
        p_empty = 1.0 / k
    elif rho < 1.0:
        p_empty = (1.0 - rho) / (1.0 - rho**k)
    else:
        # Rewritten in powers of 1/rho so that a deep buffer with spare capacity cannot overflow.
        inv_k = rho ** (-k) if k * math.log(rho) < 700 else 0.0
        p_empty = (rho - 1.0) * inv_k / (1.0 - inv_k)
    return p_empty * production_s


def _checked_times(name: str, values: Sequence[float]) -> tuple[float, ...]:
    times = tuple(float(v) for v in values)
    if not times:
        raise ValueError(f"{name} must hold at least one time, got an empty sequence")
    for v in times:
        if not (math.isfinite(v) and v >= 0):
            raise ValueError(f"{name} must hold finite times >= 0, got {v!r}")
    return times


def _simulate_in_process(prod: tuple[float, ...], step: tuple[float, ...], n: int, record_levels: bool) -> BufferRun:
    waits = tuple(prod[k % len(prod)] for k in range(n))
    elapsed = math.fsum(waits) + math.fsum(step[k % len(step)] for k in range(n))
    levels = (0,) * n if record_levels else ()
    return BufferRun(waits=waits, levels=levels, elapsed_s=elapsed, num_workers=0, prefetch_factor=1)


def _simulate_workers(
    prod: tuple[float, ...],
    step: tuple[float, ...],
    n: int,
    workers: int,
    prefetch: int,
    record_levels: bool,
) -> BufferRun:
    depth = workers * prefetch
    finish: list[float] = []  # finish[j]: when batch j is ready
    take: list[float] = []  # take[k]: when the consumer got batch k
    waits: list[float] = []
    levels: list[int] = []
    request = 0.0
    for k in range(n):
        # Batches issued by now are those below k + depth: batch j >= depth was issued when batch
        # j - depth was taken, and every take up to k - 1 is known, so their finish times are fixed.
        while len(finish) < k + depth:
            j = len(finish)
            issued = take[j - depth] if j >= depth else 0.0
            start = max(issued, finish[j - workers]) if j >= workers else issued
            finish.append(start + prod[j % len(prod)])
        if record_levels:
            levels.append(sum(1 for j in range(k, k + depth) if finish[j] <= request))
        got = max(request, finish[k])
        waits.append(got - request)
        take.append(got)
        request = got + step[k % len(step)]
    return BufferRun(
        waits=tuple(waits),
        levels=tuple(levels),
        elapsed_s=request,
        num_workers=workers,
        prefetch_factor=prefetch,
    )
