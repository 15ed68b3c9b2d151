"""Everything that touches Lightning's internals, in one place, each with a fallback.

Works with the unified ``lightning`` package and with the standalone ``pytorch_lightning`` package.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

try:
    import lightning.pytorch as pl
except ImportError:  # pragma: no cover - the standalone package only
    import pytorch_lightning as pl  # type: ignore[no-redef]

Callback = pl.Callback

_FETCH_ACTION_SUFFIX = "].train_dataloader_next"
_FETCH_ACTION_PREFIX = "[_TrainingEpochLoop"


_fetch_actions: dict[str, bool] = {}


def _is_fetch(action_name: str) -> bool:
    # Asked twice per training step for the same few names: remember the answer.
    known = _fetch_actions.get(action_name)
    if known is None:
        known = action_name.endswith(_FETCH_ACTION_SUFFIX) and action_name.startswith(_FETCH_ACTION_PREFIX)
        if len(_fetch_actions) < 256:
            _fetch_actions[action_name] = known
    return known


class FetchTimingProfiler:
    """Wraps the trainer's profiler to see exactly when the training loop fetches its batches.

    Lightning brackets every training fetch with ``profiler.start/stop("[_TrainingEpochLoop]
    .train_dataloader_next")``. Everything else goes to the user's profiler untouched; ``profile()``, which
    Lightning calls around every hook of every step, is the user's own bound method, so it costs nothing.
    """

    def __init__(
        self, inner: Any, on_fetch_start: Callable[[float], None], on_fetch_stop: Callable[[float], None]
    ) -> None:
        object.__setattr__(self, "_inner", inner)
        object.__setattr__(self, "_on_fetch_start", on_fetch_start)
        object.__setattr__(self, "_on_fetch_stop", on_fetch_stop)
        object.__setattr__(self, "profile", inner.profile)

    @property
    def inner(self) -> Any:
        return self._inner

    def start(self, action_name: str) -> None:
        self._inner.start(action_name)
        if _is_fetch(action_name):
            self._on_fetch_start(time.perf_counter())

    def stop(self, action_name: str) -> None:
        if _is_fetch(action_name):
            self._on_fetch_stop(time.perf_counter())
        self._inner.stop(action_name)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    def __setattr__(self, name: str, value: Any) -> None:
        setattr(self._inner, name, value)


def install_profiler(trainer: Any, proxy_factory: Callable[[Any], FetchTimingProfiler]) -> bool:
    if isinstance(trainer.profiler, FetchTimingProfiler):
        return False
    trainer.profiler = proxy_factory(trainer.profiler)
    return True


def uninstall_profiler(trainer: Any) -> None:
    if isinstance(trainer.profiler, FetchTimingProfiler):
        trainer.profiler = trainer.profiler.inner


def hook_loaders_ready(trainer: Any, on_ready: Callable[[list[Any]], None]) -> bool:
    """Call ``on_ready(loaders)`` each time the fit loop has built its train loaders, before ``iter()``.

    Lightning creates the epoch-0 iterator (and starts workers) inside ``FitLoop.setup_data`` right after
    restoring loader states; no public hook runs between the two. Returns ``False`` where that internal
    step does not exist (the caller then instruments at ``on_train_start``, one iterator later).
    """
    fit_loop = trainer.fit_loop
    original = getattr(type(fit_loop), "_load_combined_loader_states", None)
    if original is None:
        return False

    def load_states_then_notify() -> None:
        original(fit_loop)
        combined = fit_loop._combined_loader
        if combined is not None:
            on_ready(list(combined.flattened))

    fit_loop._load_combined_loader_states = load_states_then_notify
    return True


def unhook_loaders_ready(trainer: Any) -> None:
    trainer.fit_loop.__dict__.pop("_load_combined_loader_states", None)


def train_loaders(trainer: Any) -> list[Any]:
    combined = getattr(trainer.fit_loop, "_combined_loader", None)
    return list(combined.flattened) if combined is not None else []


def should_log(trainer: Any) -> bool:
    """Lightning's own decision to log on this training step (``log_every_n_steps``).

    The same rule as ``_LoggerConnector.should_update_logs`` for the fit loop, read directly: this runs on
    every step, and the property walks the trainer's loops.
    """
    every = trainer.log_every_n_steps
    if not every:
        return False
    try:
        step = trainer.fit_loop.epoch_loop._batches_that_stepped + 1
    except AttributeError:
        step = trainer.global_step + 1
    return step % every == 0 or bool(trainer.should_stop)


def log_step(trainer: Any) -> int:
    """The step axis Lightning's own logged metrics use."""
    try:
        return int(trainer.fit_loop.epoch_loop._batches_that_stepped)
    except AttributeError:
        return int(trainer.global_step)
