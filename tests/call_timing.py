"""Timing every call of a function, less the calls inside it that are timed on their own: how the overhead test
(``tests/test_overhead.py``) and benchmark (``benchmarks/overhead.py``) tell LoadGuard's own time from the work it
wraps (the fetch, the making of a batch, the iterator's creation)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


def timed(
    function: Callable[..., Any],
    clock: Callable[[], float],
    record: Callable[[float], None],
    less: list[float] | None = None,
) -> Callable[..., Any]:
    """``function`` wrapped: each call's time on ``clock``, less what the cell ``less`` gained meanwhile (a region
    timed on its own, called from this one), goes to ``record``, also when the call raises.

    Example:
        >>> ticks = iter(range(0, 100, 10))
        >>> inner, seen = [0.0], []
        >>> def work() -> str:
        ...     inner[0] += 3.0  # a region inside, timed on its own
        ...     return "done"
        >>> timed(work, lambda: float(next(ticks)), seen.append, less=inner)()
        'done'
        >>> seen
        [7.0]
    """

    def call(*args: Any, **kwargs: Any) -> Any:
        before = less[0] if less is not None else 0.0
        start = clock()
        try:
            return function(*args, **kwargs)
        finally:
            inner = less[0] - before if less is not None else 0.0
            record(clock() - start - inner)

    return call


def adding_to(cell: list[float]) -> Callable[[float], None]:
    """A ``record`` for :func:`timed` that adds each call's time to ``cell[0]``."""

    def add(seconds: float) -> None:
        cell[0] += seconds

    return add


def summed(function: Callable[..., Any], clock: Callable[[], float]) -> tuple[Callable[..., Any], list[float]]:
    """``function`` wrapped, and the cell in which the time of all its calls on ``clock`` adds up."""
    total = [0.0]
    return timed(function, clock, adding_to(total)), total
