"""A setting measured (an *arm*) and the one comparison every decision of the tuner makes.

An arm's windows, joined, give a sustained rate and its relative standard error (from the spread of their blocks'
rates, :mod:`lightning_loadguard.model.noise`), the rate bounded by what the host's cores can make and rated over an
epoch where its computing workers outnumber the cores; :func:`beats` compares two arms by a margin and the noise of
their difference; :func:`winnable` is the share of the loop's time a faster loader could still win back. The planner,
its search and the decision watch all read arms through these. Plain Python.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Callable
from dataclasses import dataclass
from functools import cached_property
from typing import Protocol

from lightning_loadguard.meters.settings import LoaderSettings
from lightning_loadguard.meters.window import WindowSnapshot
from lightning_loadguard.model.noise import BLOCK_STEPS, RESOLUTION, block_rates, comparison_noise, relative_error

PROFILE_LENGTH = 32
"""Per-batch production and step times (the latest, in order) replayed through the buffer model."""

COMPUTING = 0.5
"""Share of a core a worker needs while busy from which it computes rather than waits: past the cores, such workers
share them, and a batch takes longer the more workers there are (:attr:`Arm.epoch_steps`); below it, the reads'
tail sets the depth (:func:`~lightning_loadguard.tuning.depth.epoch_tail`)."""


@dataclass(frozen=True)
class Arm:
    """A setting and its measurement: the windows since its last restart that settled, joined.

    Example:
        >>> w = WindowSnapshot(wait_s=(0.0,) * 8, step_s=(0.1, 0.1, 0.1, 0.1, 0.125, 0.125, 0.125, 0.125))
        >>> arm = Arm(LoaderSettings(2, 2), w, 1)
        >>> round(arm.rate, 2), round(arm.error, 3)
        (8.89, 0.111)
    """

    setting: LoaderSettings
    window: WindowSnapshot
    windows: int
    cores_bound: bool = False
    """The rate is at most what the host's cores can make: :meth:`WindowSnapshot.batch_cpu_s` a batch on
    :attr:`HostFacts.cores_per_process` cores. A window shorter than the workers' round reads the round's phase, not
    their rate, and many computing workers' round is long."""
    epoch_steps: int | None = None
    """Steps in an epoch, where the rate counts each epoch's first batch: computing workers that outnumber the
    cores start every epoch making their first batches at once, on shared cores, and the loop waits one production
    time at that count (which grows with the count) that no window inside an epoch sees."""
    first_batch: bool = True
    """Whether the rate over an epoch counts the first batch of computing workers past the cores."""
    start_s: float | None = None
    """What starting the setting's workers was seen to cost, where they start anew at every epoch (with
    :attr:`epoch_steps`, counted in the rate over an epoch): no window inside an epoch sees it, and it grows with
    the count on busy cores."""

    @cached_property
    def rate(self) -> float:
        """Steps per second the setting sustains (:attr:`WindowSnapshot.sustained_rate`), at most what the cores
        can make (:attr:`cores_bound`), over an epoch where its computing workers outnumber the cores
        (:attr:`epoch_steps`).

        Example:
            Eight workers on 4 cores, 0.1 CPU-seconds a batch (0.2 s each, half of it queued for a core), read 60
            steps/s in a short window; the cores make 40; over a 100-step epoch, each starting with a 0.2 s batch, 37:

            >>> from dataclasses import replace
            >>> from lightning_loadguard.meters.window import HostFacts
            >>> w = WindowSnapshot(wait_s=(0.0,) * 12, step_s=(1 / 60,) * 12, settings=LoaderSettings(8),
            ...     host=HostFacts(cpu_count=4), production_s=(0.2,) * 12, production_cpu_s=(0.1,) * 12,
            ...     production_queued_s=(0.1,) * 12)
            >>> read = Arm(LoaderSettings(8), w, 1)
            >>> bound = replace(read, cores_bound=True)
            >>> [round(a.rate) for a in (read, bound, replace(bound, epoch_steps=100))]
            [60, 40, 37]
        """
        return self._rated[0]

    @cached_property
    def _rated(self) -> tuple[float, float | None, float | None, float | None]:
        """:attr:`rate`, the cores' bound where it lowered the window's reading, and where an epoch's start counts,
        the first batch's time and the workers' start."""
        w = self.window
        rate = w.sustained_rate
        workers = self.setting.num_workers
        if workers == 0 or rate <= 0:
            return rate, None, None, None
        cores = w.host.cores_per_process
        cpu = w.batch_cpu_s
        bound = cores / cpu if self.cores_bound and cpu else None
        if bound is not None and bound < rate:
            rate = bound
        else:
            bound = None
        share = w.cpu_share
        first = w.mean_production_s
        computing = share is not None and share >= COMPUTING
        if not (self.first_batch and self.epoch_steps and workers > cores and computing and first):
            first = None
        start = self.start_s if self.epoch_steps and self.start_s else None
        if first is None and start is None:
            return rate, bound, None, None
        per_epoch = (first or 0.0) + (start or 0.0)
        return 1.0 / (1.0 / rate + per_epoch / self.epoch_steps), bound, first, start

    @property
    def rating(self) -> str:
        """Why :attr:`rate` is not the window's reading, in the words of the decision's table (``""`` where it is).

        Example:
            >>> from lightning_loadguard.meters.window import HostFacts
            >>> w = WindowSnapshot(wait_s=(0.0,) * 12, step_s=(1 / 60,) * 12, settings=LoaderSettings(8),
            ...     host=HostFacts(cpu_count=4), production_s=(0.2,) * 12, production_cpu_s=(0.1,) * 12)
            >>> rating = Arm(LoaderSettings(8), w, 1, cores_bound=True, epoch_steps=100).rating
            >>> rating.split(": ", 1)[0]
            '; rated 37.04 steps/s'
            >>> rating.split(": ", 1)[1].split(", ")
            ['at most 40.00 (4 cores at 0.1 CPU-s a batch)', 'over a 100-step epoch whose first batch takes 0.2 s']
            >>> Arm(LoaderSettings(8), w, 1).rating  # the window's reading
            ''
        """
        rate, bound, first, start = self._rated
        parts = []
        if bound is not None:
            cores = self.window.host.cores_per_process
            parts.append(f"at most {bound:.2f} ({cores:g} cores at {self.window.batch_cpu_s:.3g} CPU-s a batch)")
        if first is not None or start is not None:
            costs = ([f"first batch takes {first:.3g} s"] if first is not None else []) + (
                [f"workers' start takes {start:.3g} s"] if start is not None else []
            )
            parts.append(f"over a {self.epoch_steps}-step epoch whose {' and '.join(costs)}")
        return f"; rated {rate:.2f} steps/s: " + ", ".join(parts) if parts else ""

    @property
    def error(self) -> float:
        """Relative standard error of :attr:`rate`, read as :mod:`lightning_loadguard.model.noise` reads it (from
        blocks of half the steps where fewer than two blocks fit); infinite where the window measured no rate
        (:attr:`WindowSnapshot.measured_a_rate`) or fewer than two blocks had one: nothing says how far to trust
        it."""
        w = self.window
        loop = list(map(operator.add, w.wait_s, w.step_s))
        rates = block_rates(loop, max(1, min(BLOCK_STEPS, len(loop) // 2)))
        if len(rates) < 2 or not w.measured_a_rate:
            return math.inf
        return relative_error(rates)


class Arms(dict[LoaderSettings, Arm]):
    """Every setting measured and its arm, kept as windows arrive, with the one settling rule: a window that a
    later one of the same run (no restart between) beats beyond the noise had not settled after the restart, and
    is set aside (``settle``: the rule is followed). A setting measured again after a restart joins its earlier
    arm. Every arm is rated alike (:attr:`Arm.cores_bound`, :attr:`Arm.epoch_steps`).

    Example:
        >>> arms, s = Arms(settle=True), LoaderSettings(2, 2)
        >>> slow, fast = (WindowSnapshot(wait_s=(0.0,) * 8, step_s=(t,) * 4 + (1.05 * t,) * 4) for t in (0.2, 0.1))
        >>> arms.join(s, slow, continuing=False), arms[s].windows
        ('', 1)
        >>> arms.join(s, fast, continuing=True).split(":")[0], arms[s].windows
        ('; 100% faster than before, beyond the noise (7%)', 1)
        >>> arms.join(s, fast, continuing=True), arms[s].windows
        ('', 2)
    """

    def __init__(
        self,
        *,
        settle: bool,
        cores_bound: bool = False,
        epoch_steps: int | None = None,
        first_batch: bool = True,
        start_cost: Callable[[LoaderSettings], float | None] | None = None,
    ) -> None:
        super().__init__()
        self.first_batch = first_batch
        self.settle = settle
        self.cores_bound = cores_bound
        self.epoch_steps = epoch_steps
        self.start_cost = start_cost
        """What starting a setting's workers costs at every epoch's start (``None`` where not seen, or where they
        are kept across epochs)."""
        self._since_restart: Arm | None = None  # the current setting's windows since its last restart
        self._before_restart: dict[LoaderSettings, Arm | None] = {}

    def join(self, setting: LoaderSettings, window: WindowSnapshot, *, continuing: bool) -> str:
        """Join ``window`` to ``setting``'s arm (``continuing``: measured again without a restart); a note where
        earlier windows were set aside as settling."""
        note = ""
        run = self._since_restart if continuing and self._since_restart is not None else None
        if run is None:
            self._before_restart[setting] = self.get(setting)
            run = self._arm(setting, window, 1)
        else:
            latest = self._arm(setting, window, 1)
            if self.settle and beats(latest, run, 0.0):
                g, noise = gain(latest, run)
                note = (
                    f"; {g:.0%} faster than before, beyond the noise ({noise:.0%}): the windows before, still "
                    "settling after the restart, set aside"
                )
                run = latest
            else:
                run = self._arm(setting, run.window.joined(window), run.windows + 1)
        self._since_restart = run
        before = self._before_restart.get(setting)
        self[setting] = (
            run
            if before is None
            else self._arm(setting, before.window.joined(run.window), before.windows + run.windows)
        )
        return note

    def _arm(self, setting: LoaderSettings, window: WindowSnapshot, windows: int) -> Arm:
        start = self.start_cost(setting) if self.start_cost is not None else None
        return Arm(
            setting,
            window,
            windows,
            cores_bound=self.cores_bound,
            epoch_steps=self.epoch_steps,
            first_batch=self.first_batch,
            start_s=start,
        )

    def restart(self) -> None:
        """The window just joined is set aside: the next one starts the current setting's run afresh."""
        self._since_restart = None


class Measured(Protocol):
    """A measured rate and its relative standard error (an :class:`Arm`, or figures kept from one)."""

    @property
    def rate(self) -> float: ...

    @property
    def error(self) -> float: ...


def gain(a: Measured, b: Measured) -> tuple[float, float]:
    """How much faster ``a`` measured than ``b`` (relative), and the noise of that difference
    (:func:`~lightning_loadguard.model.noise.comparison_noise`); infinite noise where ``b`` measured no rate.

    Example:
        >>> steady = WindowSnapshot(wait_s=(0.0,) * 8, step_s=(0.1,) * 8)
        >>> faster = WindowSnapshot(wait_s=(0.0,) * 8, step_s=(0.08,) * 8)
        >>> [round(x, 3) for x in gain(Arm(LoaderSettings(2), faster, 1), Arm(LoaderSettings(), steady, 1))]
        [0.25, 0.0]
    """
    if b.rate <= 0:
        return 0.0, math.inf
    return a.rate / b.rate - 1, comparison_noise(a.error, b.error)


def beats(a: Measured, b: Measured, margin: float) -> bool:
    """The one comparison: ``a`` faster than ``b`` by ``margin`` and by more than the noise."""
    g, noise = gain(a, b)
    return g >= margin and g > noise


def faster(a: Measured, b: Measured, margin: float) -> bool:
    """``a`` measured faster than ``b`` by ``margin``, whatever the noise (the search's reading, not a decision's)."""
    return gain(a, b)[0] >= margin


def within_noise(a: Measured, b: Measured) -> bool:
    """Whether ``b`` measured slower than ``a`` by less than the noise."""
    g, noise = gain(a, b)
    return g < noise


def roomiest(fastest: Arm, winners: list[Arm]) -> Arm:
    """Of the ``winners`` that ``fastest`` measured faster by no more than the noise (nor than
    :data:`~lightning_loadguard.model.noise.RESOLUTION`), the one with the most batches in flight: the windows
    cannot tell them apart, and over an epoch the larger buffer absorbs what a window is too short to show (a
    loader's rare long batches, its slow workers' rounds)."""

    def alike(arm: Arm) -> bool:
        g, noise = gain(fastest, arm)
        return g <= max(noise, RESOLUTION)

    def room(arm: Arm) -> tuple[int, bool, float]:
        # The workers' buffer (a pinned copy is no room), then unpinned: pinning is kept only where it paid.
        s = arm.setting
        return s.num_workers * s.prefetch, not s.pin_memory, arm.rate

    return max(filter(alike, winners), key=room, default=fastest)


def winnable(arm: Arm) -> float:
    """Share of the loop's time a faster loader could win back.

    The measured wait, less the part the loop's thread waited for a core (sampled: no loader setting wins
    that back); without workers at most the production time, which is all workers could hide. A buffer
    draining inside the window shows as a sustained rate below the loop's: that share counts too.
    """
    m = arm.window
    wait = m.wait_fraction * (1.0 - m.core_wait_share())
    if arm.setting.num_workers == 0 and m.mean_production_s is not None:
        production = m.mean_production_s
        wait = min(wait, production / (production + m.mean_step_s)) if production > 0 else 0.0
    draining = 1.0 - m.sustained_rate / m.throughput if m.throughput > 0 else 0.0
    return max(wait, draining)


def profile(values: tuple[float, ...]) -> tuple[float, ...]:
    """The latest :data:`PROFILE_LENGTH` of ``values``, in order: what the buffer replay reads."""
    return values[-PROFILE_LENGTH:]
