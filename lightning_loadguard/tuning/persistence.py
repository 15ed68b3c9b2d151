"""Persistent workers, where starting a setting's own workers was seen to cost a share of an epoch.

Workers that stay save each epoch's start and keep every epoch's samples and order (draws inside them go on across
epochs, as the session says). Weighed on the chosen setting's own start, at the loop's pace. Plain Python.
"""

from __future__ import annotations

from dataclasses import replace

from lightning_loadguard.meters.settings import LoaderSettings
from lightning_loadguard.meters.window import WindowSnapshot
from lightning_loadguard.tuning.decision import TuneDecision
from lightning_loadguard.tuning.options import TuneOptions


class WorkerStarts:
    """What starting each setting's workers cost where it was seen, and the steps and loop time of its windows.

    Example:
        >>> starts = WorkerStarts(TuneOptions(), epoch_steps=100)
        >>> starts.record(LoaderSettings(4), WindowSnapshot(wait_s=(0.0,) * 10, step_s=(0.1,) * 10), startup_s=2.0)
        >>> starts.persistent(LoaderSettings(4), rate=10.0, map_style=True)  # 2 s against an epoch of 10 s
        True
    """

    def __init__(self, options: TuneOptions, epoch_steps: int) -> None:
        self.options = options
        self.epoch_steps = epoch_steps
        self._startups: dict[LoaderSettings, float] = {}
        self._restarts: dict[LoaderSettings, float] = {}  # the start, and the settling it was seen to cost the loop
        self._loop_s: dict[LoaderSettings, tuple[int, float]] = {}  # steps and loop time of every window, rated or not

    def record(
        self, setting: LoaderSettings, window: WindowSnapshot, startup_s: float | None, restart_s: float | None = None
    ) -> None:
        """A window of ``setting`` that did not fail, what starting its workers cost where it was seen (``startup_s``),
        and what restarting them cost the loop (``restart_s``, at least the start: their warm-up past the window's pace
        too, but the first batch; the start where not given). Persistence is weighed by the restart; a rate over an
        epoch (:meth:`paid_each_epoch`) by the start alone, the same reading for every setting, yours included, whose
        windows have no probe's span."""
        if startup_s is not None:
            self._startups[setting] = startup_s
            self._restarts[setting] = startup_s if restart_s is None else restart_s
        if window.steps:
            steps, loop_s = self._loop_s.get(setting, (0, 0.0))
            self._loop_s[setting] = (steps + window.steps, loop_s + window.loop_s)

    def persistent(self, chosen: LoaderSettings, rate: float, map_style: bool) -> bool:
        """Keep workers across epochs when restarting them costs ``persistent_min_share`` of an epoch at ``rate``."""
        if not (self.options.tune_persistent_workers and map_style and chosen.num_workers > 0):
            return False
        restart_s = self._restarts.get(chosen)
        if restart_s is None or rate <= 0:
            return False
        return restart_s >= self.options.persistent_min_share * self.epoch_steps / rate

    def paid_each_epoch(self, setting: LoaderSettings) -> float | None:
        """What starting ``setting``'s workers was seen to cost, where they start anew at every epoch's start: not
        persistent, and not to be made so (``tune_persistent_workers=False``; ``None`` where unseen or not paid).
        Where persistent workers may be chosen, a start that costs a share of the epoch turns them on, and one that
        does not costs under ``persistent_min_share``: no ranking is changed for it.

        Example:
            >>> starts = WorkerStarts(TuneOptions(tune_persistent_workers=False), epoch_steps=100)
            >>> starts.record(LoaderSettings(4), WindowSnapshot(wait_s=(0.0,) * 10, step_s=(0.1,) * 10), startup_s=0.5)
            >>> starts.paid_each_epoch(LoaderSettings(4)), starts.paid_each_epoch(LoaderSettings(2))
            (0.5, None)
        """
        start = self._startups.get(setting)
        if start is None or setting.num_workers == 0 or setting.persistent_workers:
            return None
        return None if self.options.tune_persistent_workers else start

    def against_steps(self, setting: LoaderSettings, rate: float) -> str:
        """What restarting ``setting``'s workers costs against an epoch's steps at ``rate``, in words."""
        restart_s, steps_s = self._restarts[setting], self.epoch_steps / rate
        return f"restarting the workers costs {restart_s:.2f} s at each epoch's start, its steps {steps_s:.1f} s"

    def persistent_only(
        self, unmeasured: TuneDecision, original: LoaderSettings, start: str, map_style: bool
    ) -> TuneDecision:
        """No rate of ``original`` (its windows made no batch, as where its workers outnumber an epoch's steps):
        persistent workers all the same where their own start costs ``persistent_min_share`` of an epoch at the
        loop's pace in those windows (``start``: what the reason calls ``original``)."""
        steps, loop_s = self._loop_s.get(original, (0, 0.0))
        if not (steps and loop_s > 0 and not original.persistent_workers):
            return unmeasured
        pace = steps / loop_s
        if not self.persistent(original, pace, map_style):
            return unmeasured
        return unmeasured.with_setting(
            replace(original, persistent_workers=True),
            verdict="model_only",
            reason=(
                f"no window of {start} made a batch, so no rate was compared; persistent_workers turned on: "
                + self.against_steps(original, pace)
            ),
        )
