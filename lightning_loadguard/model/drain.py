"""The draining-buffer alarm: prefetch is hiding a deficit for now, and the stall is coming.

A full buffer in front of a slower producer shows no wait at all until it runs dry. Two signals give it
away before then: the buffer level falling steadily from fetch to fetch, and a producer rate below the
consumer rate while the level is still above zero.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Sequence
from dataclasses import dataclass
from statistics import fmean

DRAIN_MIN_DROP = 2.0
"""Batches the fitted level must fall across the window: the level moves by one with every take and
every arrival, so a smaller fall is indistinguishable from jitter."""

DRAIN_MIN_CORRELATION = 0.5
"""How straight the fall must be (minus the correlation of level with step index): "steadily", not a
single burst that the producer will make up."""

DRAIN_MIN_POINTS = 8
"""Fewest level readings a trend is fitted to."""


@dataclass(frozen=True)
class DrainAlarm:
    """The buffer is emptying; at this rate the loop starts to wait in ``steps_to_empty`` steps.

    Attributes:
        drain_rate: batches the buffer loses per step.
        level: batches waiting now (fitted, or the loader's depth when only rates are known).
        steps_to_empty: ``level / drain_rate``.
        source: ``"buffer_level"`` (the level trace) or ``"rates"`` (producer rate below consumer rate).

    Example:
        >>> DrainAlarm(drain_rate=0.25, level=6.0, steps_to_empty=24.0, source="buffer_level").summary()
        'The prefetch buffer is draining at 0.25 batches/step: 6 batches left, empty in about 24 steps.'
    """

    drain_rate: float
    level: float
    steps_to_empty: float
    source: str

    def summary(self) -> str:
        """One readable sentence."""
        bound = "at most " if self.source == "rates" else ""
        return (
            f"The prefetch buffer is draining at {self.drain_rate:.2g} batches/step: {bound}{self.level:.0f} "
            f"batches left, empty in about {bound}{self.steps_to_empty:.0f} steps."
        )


def drain_from_levels(levels: Sequence[int]) -> DrainAlarm | None:
    """An alarm when the level trace falls steadily and is not yet empty, else ``None``.

    The trend is a least-squares line through the readings; it must fall by at least ``DRAIN_MIN_DROP``
    batches across the trace with a correlation of at most ``-DRAIN_MIN_CORRELATION``.

    Example:
        >>> alarm = drain_from_levels([16 - k // 4 for k in range(40)])
        >>> round(alarm.drain_rate, 2), round(alarm.steps_to_empty)
        (0.25, 27)
        >>> drain_from_levels([4, 3, 4, 3, 4, 3, 4, 3, 4, 3]) is None
        True
    """
    n = len(levels)
    if n < DRAIN_MIN_POINTS:
        return None
    if min(levels) < 0:
        raise ValueError("levels must hold batch counts >= 0")
    mean_x, mean_y = (n - 1) / 2, fmean(levels)
    sxx = n * (n * n - 1) / 12  # the spread of 0, 1, ..., n - 1 about their mean
    syy = math.fsum((y - mean_y) ** 2 for y in levels)
    sxy = math.fsum(map(operator.mul, range(n), levels)) - mean_x * n * mean_y
    if syy == 0:
        return None
    slope = sxy / sxx
    correlation = sxy / math.sqrt(sxx * syy)
    now = mean_y + slope * (n - 1 - mean_x)
    if -slope * (n - 1) < DRAIN_MIN_DROP or correlation > -DRAIN_MIN_CORRELATION or now < 0.5:
        return None
    return DrainAlarm(drain_rate=-slope, level=now, steps_to_empty=now / -slope, source="buffer_level")


def drain_from_rates(producer_rate: float, consumer_rate: float, level: float) -> DrainAlarm | None:
    """An alarm when the producer is slower than the consumer while ``level`` batches still wait.

    Each step takes one batch and the producer adds ``producer_rate / consumer_rate`` of one.

    Example:
        >>> round(drain_from_rates(producer_rate=8.0, consumer_rate=10.0, level=8).steps_to_empty, 6)
        40.0
    """
    for name, value in (("producer_rate", producer_rate), ("consumer_rate", consumer_rate)):
        if not value > 0:
            raise ValueError(f"{name} must be > 0, got {value!r}")
    if not (level >= 0):
        raise ValueError(f"level must be >= 0, got {level!r}")
    rate = 1.0 - producer_rate / consumer_rate
    if rate <= 0 or level < 1 or math.isinf(consumer_rate):
        return None
    return DrainAlarm(drain_rate=rate, level=float(level), steps_to_empty=level / rate, source="rates")
