"""The tuner with scripted windows: every run makes the same probes and decision, whatever the host.

A setting's rate is a function of its workers (one worker makes a batch in 12 ms against a 4 ms step), so a test
that patches :func:`scripted_window` in checks which data reaches ``training_step``, not the measurement.
"""

from __future__ import annotations

from statistics import fmean
from typing import Any

import pytest

from lightning_loadguard.callback import LoadGuard
from lightning_loadguard.meters.settings import LoaderSettings, settings_of
from lightning_loadguard.meters.window import HostFacts, WindowSnapshot
from lightning_loadguard.tuning.session import TuningSession

ORDER_NOTE = "later epochs hold every sample once in another order"
"""What the tuner says once where loading moved into workers reorders later epochs."""


def scripted_window(self: TuningSession, port: Any, start: Any) -> WindowSnapshot:
    """The window a setting measures where one worker makes a batch in 12 ms against a 4 ms step."""
    # Watching a decision a resumed fit applied, the session has no planner: the loader runs the setting.
    setting = self._planner.current if self._planner is not None else settings_of(self._loader)
    steps = self._window_steps if self._planner is not None else self._watch_steps
    return window_of(setting, steps, production=0.012)


def window_of(
    setting: LoaderSettings, steps: int, production: float | tuple[float, ...], *, cpu_share: float | None = None
) -> WindowSnapshot:
    """``steps`` steps of 4 ms where each worker of ``setting`` makes a batch in ``production`` seconds (or in each
    of those times, one per step: the loop waits by their mean); ``cpu_share``: the share of each batch's time its
    worker computed, where the window says."""
    step = 0.004
    times = production if isinstance(production, tuple) else (production,) * steps
    mean = fmean(times)
    period = step + mean if setting.num_workers == 0 else max(step, mean / setting.num_workers)
    cpu = {} if cpu_share is None else {"production_cpu_s": tuple(cpu_share * t for t in times)}
    return WindowSnapshot(
        wait_s=(period - step,) * steps,
        step_s=(step,) * steps,
        production_s=times,
        production_queued_s=(0.0,) * steps if cpu else (),
        settings=setting,
        host=HostFacts(cpu_count=8),
        batches_made=steps,
        **cpu,
    )


def moved_to_workers(guard: LoadGuard | None) -> bool:
    decision = guard.decision if guard is not None else None
    assert decision is not None, "the tuner decided nothing"
    return any(c.setting.num_workers > 0 for c in decision.candidates)


def order_notes(guard: LoadGuard) -> list[str]:
    return [note for note in guard._said if ORDER_NOTE in note]


class HeavierWhenTold:
    """Scripted windows (as :func:`scripted_window`) whose batches cost ``light_s`` a worker (6 ms: two workers keep
    up with the 4 ms step), and ``heavy_s`` (24 ms: six do) once :attr:`heavy` is set: a heavier data phase after
    the decision, which the watch finds and a re-tune probes, alike in every run. While the decision is watched,
    the window is the setting the loader runs."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, light_s: float = 0.006, heavy_s: float = 0.024) -> None:
        self.heavy, self.light_s, self.heavy_s = False, light_s, heavy_s
        script = self

        def measured(session: TuningSession, port: Any, start: Any) -> WindowSnapshot:
            production = script.heavy_s if script.heavy else script.light_s
            if session._active and session._planner is not None:
                return window_of(session._planner.current, session._window_steps, production)
            assert session._loader is not None
            return window_of(settings_of(session._loader), session._watch_steps, production)

        monkeypatch.setattr(TuningSession, "_measured", measured)
