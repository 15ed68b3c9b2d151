"""After a decision: whether the host or the step changed so much that the decision may no longer hold.

The tuner decides on the windows of its first epochs. Another job that takes the cores, a step that gets faster or
slower, a heavier data phase: each moves the rate the chosen setting sustains. :class:`DecisionWatch` reads the
windows the chosen setting runs after the decision. A window has changed when the share of the loop's time a faster
loader could win back (the planner's own reading of a window) grew over the decision's by ``min_gain`` and by more
than the window's noise (two standard errors of its blocks' shares, as :mod:`~lightning_loadguard.model.noise` reads
rates): the data side fell behind, whether the producer got slower (another job took the cores) or the step got faster
than it keeps up with, at a rate that moved or not. A step that got slower, or faster with the loader keeping up, is
not a change: no loader setting would win anything more. With ``host_move`` (``TuneOptions.retune_on_other_work``), a
window has changed too where the cores other work used (:func:`~lightning_loadguard.model.budget.other_cores`) moved
by :data:`HOST_MOVE` of the cores this process may use or more: while the cores are full (:data:`FULL`) for work that
arrived, or where they were full at the decision for work that left. More work on full cores slows the workers and the
loop alike, so the share a faster loader could win back may not grow, while the best count of workers moves (down to
none where the hand-over is the cost); work that left frees cores the decision could not count on. A change that holds
over :data:`HOLD_WINDOWS` windows in a row is a reason to probe again. Plain Python, driven by windows, like the
planner.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass
from statistics import stdev

from lightning_loadguard.meters.settings import LoaderSettings
from lightning_loadguard.meters.window import WindowSnapshot
from lightning_loadguard.model.budget import other_cores
from lightning_loadguard.model.capacity import WAIT_OK
from lightning_loadguard.model.noise import SIGMAS, block_shares
from lightning_loadguard.tuning.arms import Arm, winnable

HOLD_WINDOWS = 3
"""Windows in a row a change must show before the tuner probes again (``benchmarks/retune_sweep.py`` compares
this with 1 and 2: fewer re-tune on the noise of a shared host, and with more a change is found later)."""

HOST_MOVE = 0.25
"""Share of the cores this process may use by which other work's cores must move for a window to count as changed
(``benchmarks/retune_sweep.py --host-move`` compares others: a smaller move re-tunes on a shared host's swings)."""

FULL = 0.9
"""Share of the cores this process may use, in use, above which they count as full: only then does other work
take cores from the training run."""


@dataclass(frozen=True)
class CoresUse:
    """What a window read of the cores: other work's cores, and the share of the usable cores in use."""

    other: float
    busy_share: float

    @classmethod
    def of(cls, window: WindowSnapshot) -> CoresUse | None:
        """The window's reading (``None`` where the window read no system-wide CPU use)."""
        cpu, other = window.cpu, other_cores(window)
        if cpu is None or other is None or cpu.busy_cores is None or cpu.usable_cores <= 0:
            return None
        return cls(other, (cpu.usable_cores - cpu.spare_cores) / cpu.usable_cores)


@dataclass(frozen=True)
class WatchReference:
    """What the decision measured for the setting it chose: the rate it sustained, that rate's relative standard
    error, the share of the loop's time a faster loader could still have won back, and the cores in use (``None``
    where unread)."""

    setting: LoaderSettings
    rate: float
    error: float
    winnable: float = 0.0
    cores: CoresUse | None = None

    @classmethod
    def of(cls, arm: Arm) -> WatchReference:
        return cls(arm.setting, arm.rate, arm.error, winnable(arm), CoresUse.of(arm.window))


@dataclass(frozen=True)
class HostChange:
    """A change the windows held: the reason the tuner probes again, in one sentence."""

    rate_before: float
    rate_now: float
    wait_now: float
    windows: int

    winnable_before: float = 0.0
    winnable_now: float = 0.0
    other_before: float | None = None
    other_now: float | None = None
    """Cores other work used when decided and now (``None`` where unread)."""
    on_data_side: bool = True
    """Whether some of the windows changed on the data side (the share a faster loader could win back grew)."""
    other_work_moved: bool = False
    """Whether some of them changed by the cores other work used."""

    @property
    def reason(self) -> str:
        parts = []
        if self.on_data_side or not self.other_work_moved:
            parts.append(
                f"the share of the loop's time a faster loader could win back grew from {self.winnable_before:.0%} "
                f"to {self.winnable_now:.0%}"
            )
        if self.other_work_moved and self.other_before is not None and self.other_now is not None:
            parts.append(f"other work on the host went from {self.other_before:.1f} to {self.other_now:.1f} cores")
        return (
            f"{'; '.join(parts)} over {self.windows} windows (the chosen setting ran {self.rate_before:.1f} steps/s "
            f"when decided, {self.rate_now:.1f} now, waiting for data {self.wait_now:.0%} of the time)"
        )


class DecisionWatch:
    """Reads the chosen setting's windows after the decision and says when to probe again.

    Args:
        reference: the decision's measurement of the setting it chose.
        min_gain: the tuner's ``min_gain``: the share a faster loader could win back must grow this much (and
            beyond the noise).
        hold: windows in a row the change must show.
        host_move: share of the usable cores by which other work's cores must move for a window to count as
            changed (:data:`HOST_MOVE` where ``TuneOptions.retune_on_other_work``; ``None``: the data side alone).

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

    def __init__(
        self, reference: WatchReference, min_gain: float, hold: int = HOLD_WINDOWS, host_move: float | None = None
    ) -> None:
        if hold < 1:
            raise ValueError(f"hold must be an integer >= 1, got {hold!r}")
        if host_move is not None and not host_move > 0:
            raise ValueError(f"host_move must be a share of the usable cores > 0, or None, got {host_move!r}")
        self.reference = reference
        self.min_gain = min_gain
        self.hold = hold
        self.host_move = host_move
        # The latest windows, each with whether it changed on the data side and by other work's cores.
        self._recent: deque[tuple[WindowSnapshot, bool, bool]] = deque(maxlen=hold)
        self._held = 0  # the latest windows in a row that changed

    def record(self, window: WindowSnapshot) -> HostChange | None:
        """One window of the chosen setting: the change, once it held over ``hold`` windows, else ``None``."""
        data_side, host = self._changes(window)
        self._recent.append((window, data_side, host))
        self._held = self._held + 1 if data_side or host else 0
        if self._held < self.hold:
            return None
        recent = [w for w, _, _ in self._recent]
        loop = math.fsum(w.loop_s for w in recent)
        rate = sum(w.steps for w in recent) / loop if loop > 0 else 0.0
        wait = math.fsum(sum(w.wait_s) for w in recent) / loop if loop > 0 else 0.0
        winnable = math.fsum(self._winnable(w) * w.loop_s for w in recent) / loop if loop > 0 else 0.0
        reference = self.reference.cores
        now = [use.other for use in map(CoresUse.of, recent) if use is not None]
        return HostChange(
            self.reference.rate,
            rate,
            wait,
            self.hold,
            self.reference.winnable,
            winnable,
            other_before=None if reference is None else reference.other,
            other_now=sum(now) / len(now) if now else None,
            on_data_side=any(data for _, data, _ in self._recent),
            other_work_moved=any(moved for _, _, moved in self._recent),
        )

    def latest(self) -> WindowSnapshot | None:
        """The last ``hold`` windows read, joined (``None`` before the first): the running setting as it runs now."""
        if not self._recent:
            return None
        windows = [w for w, _, _ in self._recent]
        joined = windows[0]
        for window in windows[1:]:
            joined = joined.joined(window)
        return joined

    def _winnable(self, window: WindowSnapshot) -> float:
        return winnable(Arm(self.reference.setting, window, 1))

    def _changes(self, window: WindowSnapshot) -> tuple[bool, bool]:
        """Whether ``window`` changed on the data side, and by the cores other work used (a window that measured
        no rate shows no change)."""
        if not window.measured_a_rate:
            return False, False
        return self._data_side_changed(window), self._host_changed(window)

    def _data_side_changed(self, window: WindowSnapshot) -> bool:
        """Whether the share of ``window``'s loop a faster loader could win back grew over the reference's by
        ``min_gain`` and beyond the window's noise."""
        winnable = self._winnable(window)
        grew = winnable - self.reference.winnable
        return winnable >= WAIT_OK and grew >= self.min_gain and grew > _share_noise(window)

    def _host_changed(self, window: WindowSnapshot) -> bool:
        """Whether other work's cores moved by ``host_move`` of the usable cores: up, onto full cores, or down,
        from cores full at the decision."""
        before, now, cpu, threshold = self.reference.cores, CoresUse.of(window), window.cpu, self.host_move
        if before is None or now is None or cpu is None or threshold is None:
            return False
        moved = (now.other - before.other) / cpu.usable_cores
        if moved >= threshold:
            return now.busy_share >= FULL
        return moved <= -threshold and before.busy_share >= FULL


def _share_noise(window: WindowSnapshot) -> float:
    """Two standard errors of a window's wait share, from its consecutive blocks' shares (infinite with fewer
    than two blocks: nothing says how far to trust it)."""
    shares = block_shares(window.wait_s, window.step_s)
    if len(shares) < 2:
        return math.inf
    return SIGMAS * stdev(shares) / math.sqrt(len(shares))
