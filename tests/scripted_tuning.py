"""The tuner with scripted windows: every run makes the same probes and decision, whatever the host.

A setting's rate is a function of its workers (one worker makes a batch in 12 ms against a 4 ms step), so a test
that patches :func:`scripted_window` in checks which data reaches ``training_step``, not the measurement.
"""

from __future__ import annotations

from typing import Any

from lightning_loadguard.callback import LoadGuard
from lightning_loadguard.meters.settings import settings_of
from lightning_loadguard.meters.window import HostFacts, WindowSnapshot
from lightning_loadguard.tuning.session import TuningSession

ORDER_NOTE = "later epochs hold every sample once in another order"
"""What the tuner says once where loading moved into workers reorders later epochs."""


def scripted_window(self: TuningSession, port: Any, start: Any) -> WindowSnapshot:
    """The window a setting measures where one worker makes a batch in 12 ms against a 4 ms step."""
    # Watching a decision a resumed fit applied, the session has no planner: the loader runs the setting.
    setting = self._planner.current if self._planner is not None else settings_of(self._loader)
    steps = self._window_steps if self._planner is not None else self._watch_steps
    production, step = 0.012, 0.004
    period = step + production if setting.num_workers == 0 else max(step, production / setting.num_workers)
    window = WindowSnapshot(
        wait_s=(period - step,) * steps,
        step_s=(step,) * steps,
        production_s=(production,) * steps,
        settings=setting,
        host=HostFacts(cpu_count=8),
        batches_made=steps,
    )
    return window


def moved_to_workers(guard: LoadGuard | None) -> bool:
    decision = guard.decision if guard is not None else None
    assert decision is not None, "the tuner decided nothing"
    return any(c.setting.num_workers > 0 for c in decision.candidates)


def order_notes(guard: LoadGuard) -> list[str]:
    return [note for note in guard._said if ORDER_NOTE in note]
