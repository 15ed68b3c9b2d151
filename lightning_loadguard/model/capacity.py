"""Capacity arithmetic: producer rates, workers needed and prefetch depth for bursts.

Host budgets (cores, memory) live in :mod:`lightning_loadguard.model.budget`.

Everything here is a pure function of measured figures, so that the diagnosis (and a tuner) can explain
each number it reports.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from statistics import fmean

from lightning_loadguard.model.buffer import BufferRun, simulate_buffer

BURST_MARGIN = 0.2
"""Extra producer capacity asked of :func:`workers_needed` beyond Little's law's mean figure.

Little's law sizes the workers for the mean production time; at exactly that size the buffer sits at
utilisation 1 and every burst becomes a stall. 20 % spare capacity keeps the steady-state wait of the
M/M/1/K estimate below 2 % of a step from a depth of 8 batches on.
"""

WAIT_OK = 0.05
"""Share of loop time spent waiting for data that counts as a constraint. Below 5 % the loader is not what
limits training (below run-to-run noise): the diagnosis names nothing, the tuner sees nothing to win, and a
fix is judged to have worked."""

PREFETCH_TOLERANCE = 0.01
"""A depth is deep enough when its replayed wait per step is within this share of a step of the
deep-buffer optimum: 1 % of step time is below what run-to-run noise shows."""

DEEP_PREFETCH = 32
"""Prefetch factor taken as "deep" when computing the optimum; also the largest depth recommended."""

REPLAY_MIN_STEPS = 256
"""Shortest replay: enough steps that the start-up fill (the same at every depth) does not dominate."""

REPLAY_CYCLES = 4
"""Times the longer measured sequence is replayed, so production and step times meet in new pairings."""


@dataclass(frozen=True)
class PrefetchAdvice:
    """The smallest prefetch depth that absorbs the measured bursts.

    Attributes:
        prefetch_factor: recommended ``prefetch_factor``.
        batches_in_flight: ``num_workers x prefetch_factor`` at that setting.
        expected_wait_s: replayed mean wait per step at that depth.
        expected_wait_fraction: replayed share of loop time spent waiting at that depth.
        optimum_wait_s: replayed mean wait per step with a deep buffer (``DEEP_PREFETCH``).
    """

    prefetch_factor: int
    batches_in_flight: int
    expected_wait_s: float
    expected_wait_fraction: float
    optimum_wait_s: float


def producer_capacity(production_s: Sequence[float], num_workers: int) -> float:
    """Sustainable batches per second of a loader: ``num_workers / mean production time``.

    With ``num_workers == 0`` batches are made in the training process, one at a time, so the figure is
    ``1 / mean``; such a producer never overlaps with the step.

    Example:
        >>> producer_capacity([0.2, 0.3], num_workers=4)
        16.0
    """
    mean = _mean_time("production_s", production_s)
    workers = _count("num_workers", num_workers)
    if mean == 0:
        return float("inf")
    return max(1, workers) / mean


def has_deficit(production_s: Sequence[float], step_s: Sequence[float], num_workers: int) -> bool:
    """Whether the producer is slower on average than the consumer (no buffer depth can hide that).

    Example:
        >>> has_deficit([0.5], [0.1], num_workers=4), has_deficit([0.3], [0.1], num_workers=4)
        (True, False)
    """
    capacity = producer_capacity(production_s, num_workers)
    return capacity * _mean_time("step_s", step_s) < 1.0


def workers_needed(mean_production_s: float, consumer_rate: float, *, burst_margin: float = BURST_MARGIN) -> int:
    """Workers that keep up with a consumer: Little's law plus a burst margin.

    Batches in flight = rate x time each spends being made, so hiding a production time ``P`` at a
    consumer rate ``C`` takes ``P x C`` busy workers; ``burst_margin`` adds spare capacity on top.

    Example:
        >>> workers_needed(0.3, consumer_rate=10.0)  # 3 busy workers, + 20 %
        4
    """
    if not (math.isfinite(mean_production_s) and mean_production_s >= 0):
        raise ValueError(f"mean_production_s must be a finite number >= 0, got {mean_production_s!r}")
    if not (consumer_rate > 0 and not math.isnan(consumer_rate)):
        raise ValueError(f"consumer_rate must be > 0, got {consumer_rate!r}")
    if not (math.isfinite(burst_margin) and burst_margin >= 0):
        raise ValueError(f"burst_margin must be a finite number >= 0, got {burst_margin!r}")
    if mean_production_s == 0:
        return 0
    busy = mean_production_s * consumer_rate * (1.0 + burst_margin)
    # Rounding noise must not turn an exact fit (e.g. 2.0000000001) into one more process.
    return max(1, math.ceil(busy - 1e-9))


def recommend_prefetch(
    production_s: Sequence[float],
    step_s: Sequence[float],
    *,
    num_workers: int,
    tolerance: float = PREFETCH_TOLERANCE,
    deep_prefetch: int = DEEP_PREFETCH,
) -> PrefetchAdvice | None:
    """The smallest ``prefetch_factor`` whose replayed wait is within ``tolerance`` of a deep buffer's.

    The measured production and step times are replayed through :func:`simulate_buffer` at each depth.
    Returns ``None`` when the producer is slower on average than the consumer: a buffer only postpones
    that stall, so no depth is worth recommending.

    Args:
        production_s: measured busy time per batch of one worker.
        step_s: measured consumer time per step.
        num_workers: workers the loader runs (>= 1).
        tolerance: allowed extra wait per step over the optimum, as a share of the mean step time.
        deep_prefetch: the depth taken as the optimum and the largest one recommended.

    Example:
        One batch in eight takes 0.6 s, the rest 0.05 s, and the step 0.15 s: capacity suffices on average,
        and a few batches of buffer absorb the slow one.

        >>> advice = recommend_prefetch([0.05] * 7 + [0.6], [0.15], num_workers=1)
        >>> advice.prefetch_factor, round(advice.expected_wait_s, 3)
        (4, 0.0)
        >>> recommend_prefetch([0.5], [0.1], num_workers=2) is None  # a deficit
        True
    """
    workers = _count("num_workers", num_workers)
    if workers < 1:
        raise ValueError(f"num_workers must be >= 1 for a prefetch depth, got {num_workers!r}")
    if not (math.isfinite(tolerance) and tolerance >= 0):
        raise ValueError(f"tolerance must be a finite number >= 0, got {tolerance!r}")
    if isinstance(deep_prefetch, bool) or not isinstance(deep_prefetch, int) or deep_prefetch < 1:
        raise ValueError(f"deep_prefetch must be an integer >= 1, got {deep_prefetch!r}")
    if has_deficit(production_s, step_s, workers):
        return None

    def replay(prefetch: int) -> tuple[float, float]:
        run = _replay(production_s, step_s, workers, prefetch)
        return run.mean_wait_s, run.wait_fraction

    optimum, _ = replay(deep_prefetch)
    allowed = optimum + tolerance * fmean(step_s)
    # The total wait never grows with depth, so the first depth within the allowance is found by bisection.
    low, high = 1, deep_prefetch
    while low < high:
        middle = (low + high) // 2
        if replay(middle)[0] <= allowed:
            high = middle
        else:
            low = middle + 1
    wait, fraction = replay(low)
    return PrefetchAdvice(
        prefetch_factor=low,
        batches_in_flight=workers * low,
        expected_wait_s=wait,
        expected_wait_fraction=fraction,
        optimum_wait_s=optimum,
    )


def replayed_wait(production_s: Sequence[float], step_s: Sequence[float], num_workers: int, prefetch: int) -> float:
    """The wait fraction the buffer model gives the measured production and step times at a setting: the same
    replay (length and all) that :func:`recommend_prefetch` sizes depths by.

    Example:
        One batch in eight takes 0.6 s, the rest 0.05 s, and the step 0.15 s: one batch in flight leaves the loop
        waiting a quarter of its time, four almost never.

        >>> [round(replayed_wait([0.05] * 7 + [0.6], [0.15], 1, depth), 2) for depth in (1, 4)]
        [0.27, 0.0]
    """
    return _replay(production_s, step_s, _count("num_workers", num_workers), prefetch).wait_fraction


def _replay(production_s: Sequence[float], step_s: Sequence[float], workers: int, prefetch: int) -> BufferRun:
    steps = max(REPLAY_MIN_STEPS, REPLAY_CYCLES * max(len(production_s), len(step_s)))
    return simulate_buffer(
        production_s, step_s, num_workers=workers, prefetch_factor=prefetch, steps=steps, record_levels=False
    )


def _mean_time(name: str, values: Sequence[float]) -> float:
    if not values:
        raise ValueError(f"{name} must hold at least one time, got an empty sequence")
    if not all(map(math.isfinite, values)) or min(values) < 0:
        raise ValueError(f"{name} must hold finite times >= 0")
    return fmean(values)


def _count(name: str, value: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{name} must be an integer >= 0, got {value!r}")
    return value
