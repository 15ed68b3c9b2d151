"""After a decision: whether the host or the step changed so much that the decision may no longer hold.

The tuner decides on the windows of its first epochs. Another job that takes the cores, a step that gets faster
or slower, a heavier data phase: each moves the rate the chosen setting sustains. :class:`DecisionWatch` reads
the windows the chosen setting runs after the decision and asks the tuner's one comparison
(:func:`~lightning_loadguard.tuning.planner.beats`) of each against the decision's own measurement. A window has
changed when its rate moved beyond ``min_gain`` and the noise *and* the share of the loop's time a faster loader
could win back grew by at least ``min_gain`` over the decision's: the data side fell behind (a slower producer, or
a faster step it no longer keeps up with). A step that got slower, or faster with the loader keeping up, is not
a change: no loader setting would win anything more. A change that holds over :data:`HOLD_WINDOWS` windows in a
row, in one direction, is a reason to probe again. Plain Python, driven by windows, like the planner.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from lightning_loadguard.meters.settings import LoaderSettings
from lightning_loadguard.meters.window import WindowSnapshot
from lightning_loadguard.model.capacity import WAIT_OK
from lightning_loadguard.tuning.planner import Arm, _winnable, beats

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
        return cls(arm.setting, arm.rate, arm.error, _winnable(arm))


@dataclass(frozen=True)
class HostChange:
    """A change the windows held: the reason the tuner probes again, in one sentence."""

    rate_before: float
    rate_now: float
    wait_now: float
    windows: int

    @property
    def reason(self) -> str:
        direction = "fell" if self.rate_now < self.rate_before else "rose"
        return (
            f"the chosen setting's rate {direction} from {self.rate_before:.1f} to {self.rate_now:.1f} steps/s over "
            f"{self.windows} windows while the loop waited for data {self.wait_now:.0%} of its time"
        )


class DecisionWatch:
    """Reads the chosen setting's windows after the decision and says when to probe again.

    Args:
        reference: the decision's measurement of the setting it chose.
        min_gain: the tuner's ``min_gain``: a rate must move at least this much (and beyond the noise).
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
        self.windows = 0
        """Windows read so far."""
        self._run: list[Arm] = []
        self._direction = 0

    def record(self, window: WindowSnapshot) -> HostChange | None:
        """One window of the chosen setting: the change, once it held over ``hold`` windows, else ``None``."""
        self.windows += 1
        arm = Arm(self.reference.setting, window, 1)
        direction = self._moved(arm)
        if direction == 0 or direction != self._direction:
            self._run = []
        self._direction = direction
        if direction == 0:
            return None
        self._run.append(arm)
        if len(self._run) < self.hold:
            return None
        runs = self._run[-self.hold :]
        loop = math.fsum(a.window.loop_s for a in runs)
        rate = sum(a.window.steps for a in runs) / loop if loop > 0 else 0.0
        wait = math.fsum(sum(a.window.wait_s) for a in runs) / loop if loop > 0 else 0.0
        return HostChange(self.reference.rate, rate, wait, self.hold)

    def _moved(self, arm: Arm) -> int:
        """+1 (faster) or -1 (slower) where ``arm`` moved from the reference beyond ``min_gain`` and the noise
        while the share a loader could win back grew by ``min_gain``; 0 otherwise."""
        winnable = _winnable(arm)
        if winnable < max(WAIT_OK, self.reference.winnable + self.min_gain) or not math.isfinite(arm.error):
            return 0
        if beats(arm, self.reference, self.min_gain):
            return 1
        if beats(self.reference, arm, self.min_gain):
            return -1
        return 0
