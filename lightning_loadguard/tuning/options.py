"""What the auto-tuner may spend and change: :class:`TuneOptions`."""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from lightning_loadguard.model.budget import RAM_BUDGET_SHARE, SHM_BUDGET_SHARE

PROBE_SHARE = 0.2
"""Default share of the probed epochs' steps (epoch 0, or the first few when one is too short) that may run
under probed (not yet proven) settings."""

MIN_PROBE_WINDOW = 8
"""Shortest automatic measurement window, in steps."""

MAX_WINDOW = 24
"""Longest automatic measurement window: a few bursts of a bursty pipeline fall into it."""


def _int(name: str, value: object, low: int, high: int | None = None) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < low or (high is not None and value > high):
        allowed = f"an integer >= {low}" if high is None else f"an integer in [{low}, {high}]"
        raise ValueError(f"TuneOptions.{name} must be {allowed}, got {value!r}")


def _share(name: str, value: object, *, open_low: bool = True) -> None:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    ok = ok and (0 < value <= 1 if open_low else 0 <= value <= 1)  # type: ignore[operator]
    if not ok:
        allowed = "a number in (0, 1]" if open_low else "a number in [0, 1]"
        raise ValueError(f"TuneOptions.{name} must be {allowed}, got {value!r}")


@dataclass(frozen=True)
class TuneOptions:
    """Limits and knobs of ``LoadGuard(auto_tune=TuneOptions(...))``; ``auto_tune=True`` uses the defaults.

    Args:
        probe_share: share of the probed epochs' steps that may run under settings still being probed (the
            user's own settings, measured first, cost nothing). In (0, 1].
        memory_share: share of the host's available RAM that the in-flight batches of *all* training
            processes on the host may claim. In (0, 1].
        shm_share: share of free ``/dev/shm`` those batches may claim (worker batches travel through it).
            In (0, 1].
        max_workers: a hard cap on ``num_workers`` (``None``: only the host's cores per process bound it).
        max_prefetch: the deepest ``prefetch_factor`` tried. Integer >= 1.
        warmup_steps: steps discarded after each switch while new workers start and the buffer settles.
            Integer >= 1.
        window_steps: steps of each measurement window. Integer >= 4, or ``None``: as many as the probe
            budget holds with the warm-up (at least ``MIN_PROBE_WINDOW`` and at most ``MAX_WINDOW``), so that one
            candidate fits even a short epoch and longer epochs get steadier windows.
        min_gain: a candidate replaces the user's settings only when measured at least this much faster
            (relative), and by more than the windows' own noise, so run-to-run noise never passes for an
            improvement. In [0, 1].
        tune_persistent_workers: allow turning ``persistent_workers`` on when restarting workers each epoch
            costs a measurable share of the epoch. Every epoch's order stays the untuned run's; random
            draws made inside the workers continue across epochs instead of being reseeded (``False`` where
            that matters).
        persistent_min_share: the share of epoch time that restarting the workers (their start, and their
            warm-up past the window's pace but the first batch) must cost before persistent workers are chosen.
            In [0, 1].
        keep_random_draws: ``True`` for bit-identical data: where the dataset draws random numbers in the main
            process while loading (``num_workers=0`` and ``torch``, ``random`` or ``numpy.random`` in
            ``__getitem__`` or ``collate_fn``), loading stays there, so every random draw and every epoch's
            order are the untuned run's. ``False`` (default): such a loader is tuned like any other; epoch 0
            keeps the untuned samples and order, the draws moved into workers follow torch's worker seeding
            (as with ``num_workers`` changed by hand), and where the shuffle order is drawn from a stream
            those draws advanced, later epochs hold every sample once in another order (said once).
        retune: ``True`` (default): after deciding, keep watching the chosen setting's windows, and where the
            share of the loop a faster loader could win back grows by ``min_gain`` beyond the noise over several
            windows in a row (another job took the cores, the step got faster than the loader keeps up with),
            probe again from the running setting, as in epoch 0 (same samples, same order, the same probe share
            of the steps it spans). ``False``: decide once.
        retune_on_other_work: ``True``: with ``retune``, a window counts as changed too where the cores other
            work on the host used moved by a quarter of the cores you may use, onto full cores or off cores that
            were full at the decision (:mod:`~lightning_loadguard.tuning.watch`), which finds arrivals and
            departures that move the best setting with the loop's wait unchanged. ``False`` (default): most
            such moves leave the best setting where it is, and each re-tune's probes cost steps on cores that
            are full (``benchmarks/RESULTS.md`` has both).

    Example:
        >>> TuneOptions(probe_share=0.1, memory_share=0.25).probe_share
        0.1
        >>> TuneOptions(window_steps=2)
        Traceback (most recent call last):
        ...
        ValueError: TuneOptions.window_steps must be an integer >= 4, got 2
    """

    def window_for(self, budget_steps: int) -> int:
        """The measurement window for a probe budget of ``budget_steps`` steps: the longest whose candidate
        measurement (``warmup_steps``, up to half a window more for a first fill, and the window) fits the budget.

        Example:
            >>> TuneOptions().window_for(16), TuneOptions().window_for(120), TuneOptions(window_steps=6).window_for(120)
            (8, 24, 6)
        """
        if self.window_steps is not None:
            return self.window_steps
        return max(MIN_PROBE_WINDOW, min(MAX_WINDOW, (budget_steps - self.warmup_steps) * 2 // 3))

    probe_share: float = PROBE_SHARE
    memory_share: float = RAM_BUDGET_SHARE
    shm_share: float = SHM_BUDGET_SHARE
    max_workers: int | None = None
    max_prefetch: int = 8
    warmup_steps: int = 4
    window_steps: int | None = None
    min_gain: float = 0.05
    tune_persistent_workers: bool = True
    persistent_min_share: float = 0.02
    keep_random_draws: bool = False
    retune: bool = True
    retune_on_other_work: bool = False

    def __post_init__(self) -> None:
        _share("probe_share", self.probe_share)
        _share("memory_share", self.memory_share)
        _share("shm_share", self.shm_share)
        if self.max_workers is not None:
            _int("max_workers", self.max_workers, 0)
        _int("max_prefetch", self.max_prefetch, 1)
        _int("warmup_steps", self.warmup_steps, 1)
        if self.window_steps is not None:
            _int("window_steps", self.window_steps, 4)
        _share("min_gain", self.min_gain, open_low=False)
        _share("persistent_min_share", self.persistent_min_share, open_low=False)
        for name in ("tune_persistent_workers", "keep_random_draws", "retune", "retune_on_other_work"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"TuneOptions.{name} must be True or False, got {getattr(self, name)!r}")


def longest_probe(options: TuneOptions, window_steps: int) -> int:
    """Steps one candidate's measurement may take: a warm-up as long as its first fill (at most
    ``warmup_steps`` plus half a window), then the window."""
    return options.warmup_steps + window_steps // 2 + window_steps


def _fits(options: TuneOptions, epoch_steps: int) -> bool:
    budget = math.floor(options.probe_share * epoch_steps)
    window_steps = options.window_for(budget)
    window = options.warmup_steps + window_steps
    return longest_probe(options, window_steps) <= budget and 2 * window <= epoch_steps


def options_to_start(options: TuneOptions, epoch_steps: int) -> tuple[str, int] | None:
    """What would let the tuner measure your settings and one candidate in an epoch of ``epoch_steps`` steps.

    Returns the options as Python and the steps of each window they measure. Shorter windows first (they
    keep the probe share), then a larger probe share; ``None`` if nothing does (an epoch under 10 steps).

    Example:
        >>> options_to_start(TuneOptions(), 57)
        ('TuneOptions(warmup_steps=4, window_steps=4)', 8)
        >>> options_to_start(TuneOptions(), 30)
        ('TuneOptions(warmup_steps=4, window_steps=6, probe_share=0.44)', 10)
        >>> options_to_start(TuneOptions(), 14)
        ('TuneOptions(warmup_steps=1, window_steps=4, probe_share=0.5)', 5)
        >>> options_to_start(TuneOptions(), 8) is None
        True
    """
    candidates = [{"warmup_steps": w, "window_steps": n} for w in (options.warmup_steps, 2, 1) for n in (8, 6, 4)]
    for extra in candidates:
        trial = replace(options, **extra)
        if _fits(trial, epoch_steps):
            return _described(extra, trial)
    for extra in candidates:
        window = extra["warmup_steps"] + extra["window_steps"]
        if 2 * window > epoch_steps:
            continue
        longest = extra["warmup_steps"] + extra["window_steps"] // 2 + extra["window_steps"]
        share = math.ceil(100 * longest / epoch_steps) / 100
        if share <= 0.5:
            trial = replace(options, **extra, probe_share=share)
            if _fits(trial, epoch_steps):
                return _described({**extra, "probe_share": share}, trial)
    return None


def _described(extra: dict[str, float], trial: TuneOptions) -> tuple[str, int]:
    args = ", ".join(f"{k}={v}" for k, v in extra.items())
    return f"TuneOptions({args})", trial.warmup_steps + trial.window_for(0)
