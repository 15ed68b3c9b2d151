"""After a decision: whether the host or the step changed so much that the decision may no longer hold.

The tuner decides on the windows of its first epochs. Another job that takes the cores, a step that gets faster
or slower, a heavier data phase: each moves the rate the chosen setting sustains. :class:`DecisionWatch` reads
the windows the chosen setting runs after the decision. A window has changed when the share of the loop's time a
faster loader could win back (the planner's own reading of a window) grew over the decision's by ``min_gain`` and
by more than the window's noise (two standard errors of its blocks' shares, as :mod:`~lightning_loadguard.model.noise`
reads rates): the data side fell behind, whether the producer got slower (another job took the cores) or the step
got faster than it keeps up with, at a rate that moved or not. A step that got slower, or faster with the loader
keeping up, is not a change: no loader setting would win anything more. A change that holds over
:data:`HOLD_WINDOWS` windows in a row is a reason to probe again. Plain Python, driven by windows, like the
planner.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass
from statistics import stdev

from lightning_loadguard.meters.settings import LoaderSettings
from lightning_loadguard.meters.window import WindowSnapshot
from lightning_loadguard.model.capacity import WAIT_OK
from lightning_loadguard.model.noise import SIGMAS, block_shares
from lightning_loadguard.tuning.arms import Arm, winnable

HOLD_WINDOWS = 3
"""Windows in a row a change must show before the tuner probes again (``benchmarks/retune_sweep.py`` compares
this with 1 and 2: fewer re-tune on the noise of a shared host, and with more a change is found later)."""


@dataclass(frozen=True)
class WatchReference:
    """What the decision measured for the setting it chose: the rate it sustained, that rate's relative standard
    error, and the share of the loop's time a faster loader could still have won back."""

    setting: LoaderSettings
    rate: float
    error: float
    winnable: float = 0.0

    @classmethod
    def of(cls, arm: Arm) -> WatchReference:
        return cls(arm.setting, arm.rate, arm.error, winnable(arm))


@dataclass(frozen=True)
class HostChange:
    """A change the windows held: the reason the tuner probes again, in one sentence."""

    rate_before: float
    rate_now: float
    wait_now: float
    windows: int

    winnable_before: float = 0.0
    winnable_now: float = 0.0

    @property
    def reason(self) -> str:
        return (
            f"the share of the loop's time a faster loader could win back grew from {self.winnable_before:.0%} to "
            f"{self.winnable_now:.0%} over {self.windows} windows (the chosen setting ran {self.rate_before:.1f} "
            f"steps/s when decided, {self.rate_now:.1f} now, waiting for data {self.wait_now:.0%} of the time)"
        )


class DecisionWatch:
    """Reads the chosen setting's windows after the decision and says when to probe again.

    Args:
        reference: the decision's measurement of the setting it chose.
        min_gain: the tuner's ``min_gain``: the share a faster loader could win back must grow this much (and
            beyond the noise).
        hold: windows in a row the change must show.

    Example:
        The decision measured 50 steps/s; then another job takes the cores and the loop waits for data:

        >>> ref = WatchReference(LoaderSettings(2, 2), rate=50.0, error=0.01)
        >>> watch = DecisionWatch(ref, min_gain=0.05)
        >>> slow = WindowSnapshot(wait_s=(0.01,) * 16, step_s=(0.02,) * 16, settings=LoaderSettings(2, 2))
        >>> [watch.record(slow) is not None for _ in range(3)]
        [False, False, True]
        >>> change = watch.record(slow)
        >>> round(change.rate_now, 1), round(change.wait_now, 2), change.windows
        (33.3, 0.33, 3)
    """

    def __init__(self, reference: WatchReference, min_gain: float, hold: int = HOLD_WINDOWS) -> None:
        if hold < 1:
            raise ValueError(f"hold must be an integer >= 1, got {hold!r}")
        self.reference = reference
        self.min_gain = min_gain
        self.hold = hold
        self._recent: deque[WindowSnapshot] = deque(maxlen=hold)
        self._held = 0  # the latest windows in a row that changed

    def record(self, window: WindowSnapshot) -> HostChange | None:
        """One window of the chosen setting: the change, once it held over ``hold`` windows, else ``None``."""
        self._recent.append(window)
        self._held = self._held + 1 if self._changed(window) else 0
        if self._held < self.hold:
            return None
        loop = math.fsum(w.loop_s for w in self._recent)
        rate = sum(w.steps for w in self._recent) / loop if loop > 0 else 0.0
        wait = math.fsum(sum(w.wait_s) for w in self._recent) / loop if loop > 0 else 0.0
        winnable = math.fsum(self._winnable(w) * w.loop_s for w in self._recent) / loop if loop > 0 else 0.0
        return HostChange(self.reference.rate, rate, wait, self.hold, self.reference.winnable, winnable)

    def latest(self) -> WindowSnapshot | None:
        """The last ``hold`` windows read, joined (``None`` before the first): the running setting as it runs now."""
        if not self._recent:
            return None
        joined = self._recent[0]
        for window in list(self._recent)[1:]:
            joined = joined.joined(window)
        return joined

    def _winnable(self, window: WindowSnapshot) -> float:
        return winnable(Arm(self.reference.setting, window, 1))

    def _changed(self, window: WindowSnapshot) -> bool:
        """Whether the share of ``window``'s loop a faster loader could win back grew over the reference's by
        ``min_gain`` and beyond the window's noise (a window that measured no rate shows no change)."""
        if not window.measured_a_rate:
            return False
        winnable = self._winnable(window)
        grew = winnable - self.reference.winnable
        return winnable >= WAIT_OK and grew >= self.min_gain and grew > _share_noise(window)


def _share_noise(window: WindowSnapshot) -> float:
    """Two standard errors of a window's wait share, from its consecutive blocks' shares (infinite with fewer
    than two blocks: nothing says how far to trust it)."""
    shares = block_shares(window.wait_s, window.step_s)
    if len(shares) < 2:
        return math.inf
    return SIGMAS * stdev(shares) / math.sqrt(len(shares))
