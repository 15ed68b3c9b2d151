"""The rare long batch: the upper tail of measured production times, and the buffer depth that absorbs it.

A window of a few dozen steps sees a few dozen batches; an epoch sees thousands, and where reads are heavy-tailed
(object storage, a network file system, a cache miss) the longest of thousands is many times the longest of a
few dozen. The mean and the replay of a window's own times cannot show that batch. Its tail can: the upper
quarter of the measured times is fitted as a Pareto tail (the Hill estimator), ``P(X > x) = share * (x /
threshold) ** -index``, and the wait it leaves is what a batch longer than the buffer's cover costs.

The cover: a batch is asked for when the batch ``num_workers * prefetch_factor`` places before it is taken, so
where the workers keep up it starts that many steps ahead of the loop, and the loop waits only for the part of it
longer than those steps. That is the buffer's whole job: absorbing variation where the workers keep up on average
(:func:`~lightning_loadguard.model.capacity.recommend_prefetch` declines a depth under a deficit, and so does
the tuner here).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace

TOP_SHARE = 0.25
"""The share of the measured times, the longest, that the tail is fitted to."""

MIN_TOP = 5
"""The fewest times a tail is fitted to (and twice as many measured at least)."""

TAIL_WAIT = 0.02
"""A depth absorbs the tail where the wait the tail leaves is under this share of the loop's time: below what
an epoch's rate varies from run to run (:data:`~lightning_loadguard.model.noise.RESOLUTION` is 1 %), yet a
fraction of the 5 % a window counts as waiting."""


@dataclass(frozen=True)
class Tail:
    """A Pareto upper tail: ``P(X > x) = share * (x / threshold_s) ** -index`` for ``x >= threshold_s``.

    Attributes:
        index: the tail index (> 0; smaller is heavier: under 2 the variance is infinite, under 1 the mean).
        threshold_s: where the tail starts, in seconds.
        share: the share of all times above ``threshold_s``.
        top: how many measured times the index was fitted to (``None``: given, not fitted).

    Example:
        >>> tail = Tail(index=2.0, threshold_s=0.1, share=0.25)
        >>> round(tail.excess_s(0.4), 5)  # E[max(0, X - 0.4 s)] = 0.25 * 0.1 * (0.4 / 0.1) ** -1 / 1
        0.00625
    """

    index: float
    threshold_s: float
    share: float
    top: int | None = None

    def heavier(self, standard_errors: float) -> Tail:
        """This tail with its index ``standard_errors`` standard errors lower: as heavy as the times it was fitted
        to allow at that confidence. Hill's estimate of ``1 / index`` from ``top`` times has a relative standard
        error of ``1 / sqrt(top)``; a tail given, not fitted, is returned as it is.

        Example:
            >>> round(Tail(index=3.0, threshold_s=0.1, share=0.25, top=100).heavier(2.0).index, 2)  # 3 / 1.2
            2.5
        """
        if not (math.isfinite(standard_errors) and standard_errors >= 0):
            raise ValueError(f"standard_errors must be a finite number >= 0, got {standard_errors!r}")
        if self.top is None:
            return self
        return replace(self, index=self.index / (1.0 + standard_errors / math.sqrt(self.top)))

    def share_beyond(self, time_s: float) -> float:
        """The share of all times longer than ``time_s``: ``share * (time_s / threshold_s) ** -index`` from the
        threshold on; below it the tail says only that it is at least ``share``, which is returned.

        Example:
            >>> Tail(index=2.0, threshold_s=0.1, share=0.25).share_beyond(0.5)  # 0.25 / 5 ** 2
            0.01
        """
        if not (math.isfinite(time_s) and time_s >= 0):
            raise ValueError(f"time_s must be a finite number >= 0, got {time_s!r}")
        return self.share * (max(time_s, self.threshold_s) / self.threshold_s) ** -self.index

    def excess_s(self, cover_s: float) -> float:
        """The expected part of one time beyond ``cover_s`` seconds, ``E[max(0, X - cover_s)]``, from the tail
        alone (for a cover below the threshold, the tail's part beyond the threshold and its share of the rest);
        infinite where ``index <= 1``."""
        if not (math.isfinite(cover_s) and cover_s >= 0):
            raise ValueError(f"cover_s must be a finite number >= 0, got {cover_s!r}")
        if self.index <= 1.0:
            return math.inf
        cover = max(cover_s, self.threshold_s)
        beyond = self.share * self.threshold_s * (cover / self.threshold_s) ** (1.0 - self.index) / (self.index - 1)
        return beyond + self.share * (cover - cover_s)


def fit_tail(times_s: Sequence[float], *, top_share: float = TOP_SHARE, min_top: int = MIN_TOP) -> Tail | None:
    """The Hill estimate of the upper tail of ``times_s``: the longest ``top_share`` of them (at least
    ``min_top``) against the next longest, the threshold. ``None`` with fewer than ``2 * min_top`` positive
    times, where the longest times are all equal (no tail to fit), or where the index fitted is 1 or less: such a
    tail has no mean, so the longest times are not a Pareto tail but a few slow reads of one length among fast
    ones (their depth is the buffer replay's to size, :func:`~lightning_loadguard.model.capacity.recommend_prefetch`).

    Example:
        Forty times at evenly spaced quantiles of a Pareto tail of index 3 from 0.1 s:

        >>> times = [0.1 * (1 - (k + 0.5) / 40) ** (-1 / 3) for k in range(40)]
        >>> tail = fit_tail(times)
        >>> round(tail.index, 1), round(tail.threshold_s, 3), tail.share
        (3.0, 0.156, 0.25)
        >>> fit_tail([0.2] * 40) is None
        True
        >>> fit_tail([0.001] * 36 + [0.1] * 4) is None  # one read in ten 100 times longer: index 0.54
        True
    """
    if not 0.0 < top_share < 1.0:
        raise ValueError(f"top_share must be within (0, 1), got {top_share!r}")
    if isinstance(min_top, bool) or not isinstance(min_top, int) or min_top < 1:
        raise ValueError(f"min_top must be an integer >= 1, got {min_top!r}")
    longest = sorted((t for t in times_s if math.isfinite(t) and t > 0), reverse=True)
    n = len(longest)
    top = max(min_top, int(n * top_share))
    if n < 2 * min_top or top >= n:
        return None
    threshold = longest[top]
    spread = math.fsum(math.log(t / threshold) for t in longest[:top])
    if spread <= 0 or top / spread <= 1.0:
        return None
    return Tail(index=top / spread, threshold_s=threshold, share=top / n, top=top)


def tail_wait(tail: Tail, *, batches_in_flight: int, period_s: float) -> float:
    """The share of the loop's time spent waiting for batches longer than the buffer's cover, ``batches_in_flight``
    steps of ``period_s`` each (one batch per step).

    Example:
        >>> tail = Tail(index=2.0, threshold_s=0.1, share=0.25)
        >>> round(tail_wait(tail, batches_in_flight=8, period_s=0.05), 4)  # cover 0.4 s: 6.25 ms a step of 50 ms
        0.1111
    """
    if not (math.isfinite(period_s) and period_s > 0):
        raise ValueError(f"period_s must be a finite number > 0, got {period_s!r}")
    excess = tail.excess_s(batches_in_flight * period_s)
    return excess / (period_s + excess) if math.isfinite(excess) else 1.0


def tail_covered(tail: Tail, *, batches_in_flight: int, period_s: float, wait: float = TAIL_WAIT) -> bool:
    """Whether ``batches_in_flight`` cover the tail: its wait (:func:`tail_wait`) under ``wait``, the share every
    depth and count the tuner sizes for the tail is held to.

    Example:
        >>> tail = Tail(index=2.0, threshold_s=0.1, share=0.25)
        >>> [tail_covered(tail, batches_in_flight=n, period_s=0.05) for n in (8, 64)]  # 11 % and 1.5 % waited
        [False, True]
    """
    return tail_wait(tail, batches_in_flight=batches_in_flight, period_s=period_s) < wait


def tail_depth(tail: Tail, *, num_workers: int, period_s: float, deepest: int, wait: float = TAIL_WAIT) -> int:
    """The fewest batches per worker (``prefetch_factor``, at most ``deepest``) whose cover leaves a tail wait
    (:func:`tail_wait`) under ``wait``; ``deepest`` where none does.

    Example:
        >>> tail = Tail(index=2.5, threshold_s=0.1, share=0.25)
        >>> tail_depth(tail, num_workers=4, period_s=0.05, deepest=8)  # 16 batches cover 0.8 s: 1.4 % waited
        4
        >>> tail_depth(Tail(index=1.1, threshold_s=0.1, share=0.25), num_workers=4, period_s=0.02, deepest=8)
        8
    """
    if isinstance(num_workers, bool) or not isinstance(num_workers, int) or num_workers < 1:
        raise ValueError(f"num_workers must be an integer >= 1, got {num_workers!r}")
    if isinstance(deepest, bool) or not isinstance(deepest, int) or deepest < 1:
        raise ValueError(f"deepest must be an integer >= 1, got {deepest!r}")
    for depth in range(1, deepest + 1):
        if tail_covered(tail, batches_in_flight=num_workers * depth, period_s=period_s, wait=wait):
            return depth
    return deepest
