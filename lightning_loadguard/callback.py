"""``LoadGuard``: the Lightning callback that wires the trainer's hooks to the meters and the loggers."""

from __future__ import annotations

import math
import time
import traceback
import weakref
from collections import deque
from collections.abc import Callable
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from lightning_utilities.core.rank_zero import rank_zero_warn
from typing_extensions import override

from lightning_loadguard import _lightning as _pl
from lightning_loadguard._patches import Patches
from lightning_loadguard._warnings import LoadGuardWarning, install_format
from lightning_loadguard.dashboard import custom_scalars_layout
from lightning_loadguard.meters.accelerator import GpuUtilization
from lightning_loadguard.meters.device import DeviceEvent, cuda_events
from lightning_loadguard.meters.host import host_key
from lightning_loadguard.meters.monitor import LoaderMonitor
from lightning_loadguard.meters.ranks import figure_row, figures_by_name, logging_pace, rank_figures, summarise
from lightning_loadguard.meters.settings import LoaderSettings
from lightning_loadguard.meters.window import WindowSnapshot
from lightning_loadguard.model.diagnosis import UNKNOWN_REACH, TunerReach, diagnose
from lightning_loadguard.model.findings import Diagnosis
from lightning_loadguard.model.stable import StableDiagnosis
from lightning_loadguard.report import format_summary, plain_text

if TYPE_CHECKING:
    import lightning.pytorch as pl

    from lightning_loadguard._tuner_adapter import TunerAdapter
    from lightning_loadguard.model.forecast import Forecast, ForecastFacts
    from lightning_loadguard.tuning import TuneDecision, TuneOptions

DEFAULT_WINDOW = 100
"""The longest default window (steps), and the window where the epoch's length is unknown."""

MIN_WINDOW = 10
"""The shortest default window (steps): fewer steps say more about noise than about the loader."""


def adaptive_window(steps_per_epoch: float) -> int:
    """The default window for an epoch of ``steps_per_epoch`` steps: half of it, within 10 and 100 steps.

    Example:
        >>> adaptive_window(57), adaptive_window(1000), adaptive_window(12), adaptive_window(float("inf"))
        (28, 100, 10, 100)
    """
    if not math.isfinite(steps_per_epoch) or steps_per_epoch <= 0:
        return DEFAULT_WINDOW
    return max(MIN_WINDOW, min(DEFAULT_WINDOW, int(steps_per_epoch) // 2))


HOOKED_EVERY = 4
"""LoadGuard's ``on_train_batch_start`` runs on every this many steps (on short steps, on one step each
``HOOKED_INTERVAL_S``) and on every logging step, its ``on_train_batch_end`` on logging steps only; the steps
between skip them. Lightning's dispatch of a hook (a profiler context) and the hook's own reads of the trainer
cost more, on short steps, than the fetch timing that measures the data wait; the copy to the device is timed
on this sample of steps. With an accelerator's timeline, or while the tuner probes, both run on every step;
where batches accumulate, the start hook runs more often near a logging step (see ``LoadGuard._rest_hooks``)."""

HOOKED_INTERVAL_S = 0.05
"""Where ``HOOKED_EVERY`` steps take less than this, the hooks rest for as many steps as last this long (at the
latest step's period): their cost per second of training stays bounded however short the steps."""

LOGGING_SHARE = 0.0005
"""Where LoadGuard follows the trainer's logging cadence, its logging steps (the window, the diagnosis, the
collective, the logs: up to 2 ms of CPU) take at most this share of the training's time: on
steps so short that they would take more, it logs on every k-th of the trainer's logging steps, at the smallest
k that keeps within it (paced by the costliest rank's latest logging step, the same on every rank), and on at
least one in ``MAX_LOGGING_STRIDE``."""

MAX_LOGGING_STRIDE = 8
"""At most this many of the trainer's logging steps pass between two of LoadGuard's (when it follows the
trainer): on the shortest steps its figures keep coming, at some cost over ``LOGGING_SHARE``."""

_HOOKS = ("on_train_batch_start", "on_train_batch_end")
_NAN = float("nan")
_FETCH_TIMING = "timing the training loop's fetch"
_STEP_TIMING = "timing the training step"


def _print_on_rank_zero(trainer: Any, text: str) -> None:
    # Printed, not logged: Python's logging shows INFO only where the user configured it.
    if trainer.global_rank == 0:
        print(text, flush=True)


class LoadGuard(_pl.Callback):
    """Measures what limits training: the wait for data, the loader's capacity and the host's budgets.

    Add it to any Trainer; nothing else changes. Every ``log_every_n_steps`` it logs, on Lightning's own
    step axis and over a rolling window of ``window`` steps (producer capacity over the last
    ``4 x window`` batches made), the metrics listed in
    :data:`lightning_loadguard.dashboard.METRICS` to every logger of the trainer. With a
    ``TensorBoardLogger`` it also adds a ready-made Custom Scalars dashboard. At the end of fit it prints a
    summary (also without any logger).

    Args:
        window: steps in the rolling window the figures are computed over; ``None`` (the default): half an
            epoch, at least 10 and at most 100 steps, so that the first figures arrive within the first epoch
            whatever its length.
        log_every_n_steps: how often to log; ``None`` follows the trainer's ``log_every_n_steps``, but no more
            often than every ``window // 2`` steps (each figure spans the window). Besides, the
            first full window is logged as soon as it is full.
        print_summary: print the diagnosis after the first epoch, a draining alarm when one is raised, and
            the summary table at the end of fit (on global rank 0); ``False`` prints nothing.
        auto_tune: ``True``, a :class:`~lightning_loadguard.tuning.options.TuneOptions`, or ``False``: choose
            the train loader's ``num_workers``, ``prefetch_factor``, ``persistent_workers`` (and ``pin_memory``
            on an accelerator) during epoch 0 (the first few epochs when one is too short); see
            ``docs/tuning.md``.

    Example:
        >>> from lightning.pytorch import Trainer
        >>> guard = LoadGuard()
        >>> trainer = Trainer(callbacks=[guard], logger=False, enable_progress_bar=False)  # doctest: +SKIP
        >>> trainer.fit(model, datamodule)  # doctest: +SKIP
        >>> guard.metrics["loadguard/wait_fraction"]  # doctest: +SKIP
        0.62
    """

    _device_events: Callable[[], DeviceEvent] | None = None
    """Where the device's timing events come from; ``None`` picks CUDA events on a CUDA device (tests plug in
    a simulated device here)."""

    # Per-batch hooks LoadGuard has no use for. Lightning calls a callback's hook only where it is callable
    # (``_call_callback_hooks``, sources 2.5.0 and 2.6.6 checked; ``tests/test_lightning_seam.py`` checks the
    # installed one), so these cost no dispatch: each would open a profiler context and read the callback's
    # state key on every step, which on short steps costs more than all of LoadGuard's own work.
    on_before_backward = None  # type: ignore[assignment]
    on_after_backward = None  # type: ignore[assignment]
    on_before_optimizer_step = None  # type: ignore[assignment]
    on_before_zero_grad = None  # type: ignore[assignment]
    on_validation_batch_start = None  # type: ignore[assignment]
    on_validation_batch_end = None  # type: ignore[assignment]
    on_test_batch_start = None  # type: ignore[assignment]
    on_test_batch_end = None  # type: ignore[assignment]
    on_predict_batch_start = None  # type: ignore[assignment]
    on_predict_batch_end = None  # type: ignore[assignment]

    def __init__(
        self,
        window: int | None = None,
        log_every_n_steps: int | None = None,
        print_summary: bool = True,
        auto_tune: bool | TuneOptions = False,
    ) -> None:
        if window is not None and (not isinstance(window, int) or isinstance(window, bool) or window < 2):
            raise ValueError(
                f"`window` must be None (adapt to the epoch) or an integer >= 2 (steps in the rolling window), "
                f"got {window!r}."
            )
        if log_every_n_steps is not None and (
            not isinstance(log_every_n_steps, int) or isinstance(log_every_n_steps, bool) or log_every_n_steps < 1
        ):
            raise ValueError(
                f"`log_every_n_steps` must be None (follow the trainer) or an integer >= 1, got {log_every_n_steps!r}."
            )
        if not isinstance(print_summary, bool):
            raise ValueError(f"`print_summary` must be True or False, got {print_summary!r}.")
        if auto_tune is not False:
            # Imported only when asked for: a plain LoadGuard never loads the tuner.
            from lightning_loadguard._tuner_adapter import TunerAdapter
            from lightning_loadguard.tuning import TuneOptions

            if not isinstance(auto_tune, (bool, TuneOptions)):
                raise ValueError(f"`auto_tune` must be True, False or a TuneOptions, got {auto_tune!r}.")
        self._window_given = window is not None
        self.window = window if window is not None else DEFAULT_WINDOW
        self.log_every_n_steps = log_every_n_steps
        self.print_summary = print_summary
        self._monitor = LoaderMonitor(self.window, guarded=self._guarded, on_error=self._switch_off)
        self._monitor.on_settings_changed = self._settings_changed
        self._measure_batch = True
        self._log_due = False
        self._every = 0  # steps between logging steps, known from on_train_start
        self._logging_step_s = _NAN  # LoadGuard's CPU time on its latest logging step
        self._quiet_fetches = 0  # fetches until the per-step hooks run again (0: they run)
        self._own_hooks_overridden = any(getattr(type(self), h) is not getattr(LoadGuard, h) for h in _HOOKS)
        self._logged_step: int | None = None
        self._validation_start: float | None = None
        self._gpu: GpuUtilization | None = None
        self._said: set[str] = set()
        self._switched_off: set[str] = set()
        self._host_key = _NAN  # read where the rank runs, when its fit starts (setup)
        # Weak: a callback that holds its trainer would make every copy or pickle of the callbacks carry it.
        self._trainer: weakref.ref[Any] | None = None
        self._patches = Patches()
        self.auto_tune = auto_tune
        self._tuner: TunerAdapter | None = None
        if auto_tune is not False:
            options = TuneOptions() if auto_tune is True else auto_tune
            self._tuner = TunerAdapter(options, self._monitor, self._say_once)
        self.metrics: dict[str, float] = {}
        """The figures of the latest logging step, by metric name."""
        self.snapshot: WindowSnapshot | None = None
        """This rank's latest window of measurements (with the ranks' combined figures filled in)."""
        self.diagnosis: Diagnosis | None = None
        """The current diagnosis: ``diagnosis.verdict`` names the dominant constraint, with all findings."""
        self._history: deque[tuple[int, WindowSnapshot]] = deque(maxlen=5)
        self._stable = StableDiagnosis()
        self._unlogged_change = False
        self._reach: tuple[Any, TunerReach] | None = None  # the tuner's reach for the loaders it was asked for
        self._node_forecast: Forecast | None = None  # the node's every device, where it has more than the run uses

    # -- plumbing --------------------------------------------------------------------------------------

    def _say_once(self, message: str) -> None:
        if message not in self._said:
            self._said.add(message)
            install_format()
            rank_zero_warn(f"LoadGuard: {message}", category=LoadGuardWarning)

    def _guarded(self, what: str, fn: Any, *args: Any) -> Any:
        """Run a measurement step; a failure is reported once and never reaches the training run."""
        if what in self._switched_off:
            return None
        try:
            return fn(*args)
        except Exception as err:
            self._switch_off(what, err)
            return None

    def _switch_off(self, what: str, err: Exception) -> None:
        """LoadGuard's own ``what`` failed: say so once and skip it from now on."""
        frames = traceback.extract_tb(err.__traceback__)
        # The function, not the file: a user reports it; a path into the package tells them nothing.
        where = f", in {frames[-1].name}" if frames else ""
        if frames or not str(err):
            self._say_once(
                f"{what} failed and is skipped from now on ({type(err).__name__}: {err}{where}). "
                "Training is not affected."
            )
        else:  # a figure that cannot be measured for this loader, not a failure
            self._say_once(f"{err}.")
        self._switched_off.add(what)

    # -- loaders ---------------------------------------------------------------------------------------

    def _on_loaders_ready(self, loaders: list[Any]) -> None:
        trainer = self._trainer() if self._trainer is not None else None
        if self._tuner is not None and trainer is not None:
            # A decision restored from a checkpoint applies before the first iterator starts its workers.
            self._guarded("auto-tuning", self._tuner.on_loaders_ready, trainer, loaders)
        self._guarded("instrumenting the train loader", self._instrument, loaders)

    def _settings_changed(self, before: LoaderSettings) -> None:
        """The loader's settings were changed in place (the tuner switched them)."""
        trainer = self._trainer() if self._trainer is not None else None
        if trainer is not None:
            self._guarded("marking the loader's switch", self._mark_switch, trainer, before)

    def _instrument(self, loaders: list[Any]) -> None:
        reason = self._monitor.attach(loaders)
        if reason is not None:
            self._say_once(
                f"{reason}; producer capacity, readiness and epoch start-up are not measured. "
                "Data wait and step time are (from the training loop)."
            )

    # -- hooks -----------------------------------------------------------------------------------------

    @override
    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        if stage != "fit":
            return
        # Here, in the process that trains: a callback built elsewhere and shipped to the ranks counts on the host
        # it runs on. A malformed LOADGUARD_HOST_KEY is refused before anything is changed.
        self._host_key = float(host_key())
        self._trainer = weakref.ref(trainer)
        # Every change to the user's objects is recorded with its undo, for teardown and on_exception alike.
        self._patches.add("the train loader's class", self._monitor.detach)
        if self._tuner is not None:
            self._patches.add("the auto-tuner's hold on the loader", self._tuner.teardown)
        # The device first: the fetch timing below binds the monitor's updates as they are with it.
        self._monitor.attach_device(self._device_events or cuda_events(trainer.strategy.root_device))
        if _pl.install_profiler(trainer, self._fetch_timing_profiler):
            self._patches.add("the trainer's profiler", _pl.uninstall_profiler, trainer)
        if _pl.hook_loaders_ready(trainer, self._on_loaders_ready):
            self._patches.add("the fit loop's loader hook", _pl.unhook_loaders_ready, trainer)
        self._monitor.accelerator = trainer.strategy.root_device.type != "cpu"
        self._gpu = GpuUtilization(trainer.strategy.root_device)
        if self._gpu.unavailable and trainer.strategy.root_device.type == "cuda":
            self._say_once(f"accelerator utilization is not measured: {self._gpu.unavailable}.")

    @override
    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if not self._window_given:
            self._adapt_window(trainer.num_training_batches)
        self._every = self._log_every(trainer)
        if self._monitor.loader is None:
            # Without the pre-iterator hook the first iterator already exists: the next one is measured.
            self._on_loaders_ready(_pl.train_loaders(trainer))
        self._add_dashboard(trainer)
        # The host's CPU is read once per logged window, from here on.
        self._monitor.sample_cpu()

    def _adapt_window(self, steps_per_epoch: float) -> None:
        """The default window: half an epoch, within ``MIN_WINDOW`` and ``DEFAULT_WINDOW`` steps."""
        window = adaptive_window(steps_per_epoch)
        if window == self.window:
            return
        self.window = window
        self._monitor.resize(window)

    def _fetch_timing_profiler(self, inner: Any) -> _pl.FetchTimingProfiler:
        # Called with the clock's reading: the proxy guards them.
        return _pl.FetchTimingProfiler(
            inner, self._fetch_started, self._monitor.fetch_finished, self._fetch_timing_failed
        )

    def _fetch_started(self, now: float) -> None:
        self._monitor.fetch_started(now)
        if self._quiet_fetches:
            self._quiet_fetches -= 1
            if not self._quiet_fetches:
                self._hooks_on()

    def _hooks_on(self) -> None:
        for hook in _HOOKS:
            self.__dict__.pop(hook, None)

    def _rest_hooks(self, step: int) -> None:
        """Leave the per-step hooks off until the next step that needs them (``HOOKED_EVERY``,
        ``HOOKED_INTERVAL_S``).

        Lightning calls a callback's hook only where it is callable, and reads it afresh on every step; the
        fetch timing, which runs on every step, counts the fetches and puts them back. Counted in fetches,
        the next logging step is never passed: the logging step counter moves at most once per fetch (once
        per optimizer step where batches accumulate, so there the hooks come back early). ``step`` is the
        logging step counter of this step, plus one.
        """
        if self._monitor.on_device_timeline or (self._tuner is not None and self._tuner.every_step):
            return
        if self._own_hooks_overridden:
            return  # a subclass's own per-step hook runs on every step, as it expects
        if self._monitor.total_steps == 0 or _FETCH_TIMING in self._switched_off:
            return  # no fetch is timed (yet, or any more): nothing would wake them
        fetches = HOOKED_EVERY
        period = self._monitor.last_period_s
        if period * HOOKED_EVERY < HOOKED_INTERVAL_S and period > 0:
            fetches = math.ceil(HOOKED_INTERVAL_S / period)
        if self.window > step:
            fetches = min(fetches, self.window - step)
        if self._every:
            fetches = min(fetches, self._every - step % self._every)
        if fetches > 1:
            self._quiet_fetches = fetches
            for hook in _HOOKS:
                setattr(self, hook, None)

    def _fetch_timing_failed(self, err: Exception) -> None:
        self._switch_off(_FETCH_TIMING, err)
        self._quiet_fetches = 0
        self._hooks_on()
        self._guarded("timing the in-process fetch", self._monitor.fetch_timing_lost)

    def _add_dashboard(self, trainer: Any) -> None:
        if trainer.global_rank != 0:
            return
        layout = self._guarded("building the TensorBoard dashboard", custom_scalars_layout)
        if layout is None:
            return
        for logger in trainer.loggers:
            if not _pl.is_tensorboard_logger(logger):
                continue
            # The logger's own call: its failure reaches the user as any logger failure would.
            experiment = logger.experiment
            if hasattr(experiment, "add_custom_scalars"):
                experiment.add_custom_scalars(layout)

    @override
    def on_validation_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if not trainer.sanity_checking:
            self._validation_start = self._guarded(_STEP_TIMING, time.perf_counter)
            self._guarded(_STEP_TIMING, self._monitor.break_chain)

    @override
    def on_validation_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        started, self._validation_start = self._validation_start, None
        if started is not None:
            self._guarded(_STEP_TIMING, lambda: self._monitor.exclude(time.perf_counter() - started))

    @override
    def on_train_batch_start(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        # First: Lightning's batch_to_device has just launched the copy. From the batch's arrival to here:
        # input conversion and the copy to the device.
        if _STEP_TIMING not in self._switched_off:
            try:
                self._monitor.step_started(time.perf_counter())
            except Exception as err:
                self._switch_off(_STEP_TIMING, err)
        # Decided once per step: Lightning's logging step counter moves only after on_train_batch_end.
        step = _pl.log_step(trainer) + 1
        self._log_due = self._should_log(step)
        if self._measure_batch or self._log_due:
            self._measure_batch = False
            self._guarded("measuring the batch size in bytes", self._monitor.measure_batch, batch)
        else:
            # Nothing for on_train_batch_end to do on this step: it rests from now on, unless the step needs it.
            self._guarded("resting the per-step hooks", self._rest_hooks, step)

    @override
    def on_train_batch_end(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        # First, before any logging here or in later callbacks can make the host wait for the device.
        if _STEP_TIMING not in self._switched_off:
            try:
                self._monitor.step_ended()
            except Exception as err:
                self._switch_off(_STEP_TIMING, err)
        logging_step = self._log_due
        if logging_step:
            self._log_due = False
            self._publish(trainer)
        if self._tuner is not None:
            self._guarded("auto-tuning", self._tuner.on_train_batch_end, trainer, logging_step)
        self._guarded("resting the per-step hooks", self._rest_hooks, _pl.log_step(trainer) + 1)

    @override
    def on_train_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._guarded(_STEP_TIMING, lambda: self._monitor.close_step(time.perf_counter()))
        self._guarded(_STEP_TIMING, self._monitor.break_chain)
        if self._monitor.total_steps == 0 and _pl.consumed_in_epoch(trainer) > 0:
            self._say_once(
                f"no fetch of the training loop was seen (Lightning's profiler action {_pl.FETCH_ACTION} never "
                "ran: a training_step that takes the dataloader iterator, or another Lightning version), so data "
                "wait, step time and throughput are not measured; producer capacity still is. Training is not "
                "affected."
            )
        if trainer.current_epoch == 0:
            # The first epoch's verdict, once, while there is still time to act on it.
            self._publish(trainer, log=False)
            if self.print_summary and self.diagnosis is not None:
                text = plain_text(self.diagnosis.to_text())
                _print_on_rank_zero(trainer, f"LoadGuard after the first epoch:\n{text}")

    @override
    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        # The closing figures, on every rank (the ranks' figures are combined collectively). A step on which
        # training was told to stop is logged, as Lightning logs it; it may have run without the hooks.
        stopped_at = _pl.log_step(trainer) - 1
        log = self._stopping(trainer) and self._logged_step != stopped_at
        self._publish(trainer, log=log, closing=True, step=stopped_at)
        self._guarded("forecasting the node", self._forecast_at_end, trainer, stopped_at)
        if trainer.world_size > 1:
            # The closing gather can be the run's last collective: a rank that leaves it and exits while another
            # still receives its part aborts that one at exit (ddp_spawn on gloo: "terminate called without an
            # active exception", and the parent's fit raises). All ranks leave together.
            self._guarded("ending the closing collective", trainer.strategy.barrier, "loadguard_closing")

    @override
    def on_fit_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self.print_summary and trainer.global_rank == 0:
            summary = self._guarded("printing the summary", self.summary)
            if summary:
                _print_on_rank_zero(trainer, summary)

    @override
    def state_dict(self) -> dict[str, Any]:
        return {"tuner": self._tuner.state_dict()} if self._tuner is not None else {}

    @override
    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        if self._tuner is not None and "tuner" in state_dict:
            self._tuner.load_state_dict(state_dict["tuner"])

    @property
    def decision(self) -> TuneDecision | None:
        """The auto-tuner's outcome (``None`` without ``auto_tune`` or before it decided)."""
        return self._tuner.decision if self._tuner is not None else None

    @override
    def teardown(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        if stage == "fit":
            self._undo_patches()

    @override
    def on_exception(self, trainer: pl.Trainer, pl_module: pl.LightningModule, exception: BaseException) -> None:
        # Lightning skips teardown when fit raises: the user's loader, profiler and fit loop are theirs again.
        self._undo_patches()

    def _undo_patches(self) -> None:
        self._trainer = None
        self._quiet_fetches = 0
        self._hooks_on()
        for what, err in self._patches.undo_all():
            self._switch_off(f"restoring {what}", err)

    def __getstate__(self) -> dict[str, Any]:
        # A copy is detached from the fit: it keeps the settings and the figures, not the trainer (the monitor
        # leaves the loader and the device's events behind itself).
        state = {k: v for k, v in self.__dict__.items() if k not in _HOOKS}  # its hooks, awake
        # An NVML handle belongs to its process, the host key to the host the copy's fit runs on.
        state.update(_trainer=None, _gpu=None, _quiet_fetches=0, _host_key=_NAN)
        return state

    # -- figures ---------------------------------------------------------------------------------------

    def _should_log(self, step: int) -> bool:
        if step == self.window:
            return True  # the first full window, early in a run whatever the logging cadence
        # Not the step training was told to stop on: the ranks' hooks may rest differently there, and a publish
        # on one rank only would leave the ranks' collectives unpaired. on_train_end logs that step.
        return bool(self._every) and step % self._every == 0

    def _stopping(self, trainer: Any) -> bool:
        """Lightning also logs the step on which training was told to stop (``_LoggerConnector
        .should_update_logs``): so does LoadGuard where it follows the trainer."""
        return self.log_every_n_steps is None and bool(self._every) and bool(trainer.should_stop)

    def _pace_logging(self, trainer: Any, ranks: dict[str, list[float]]) -> None:
        """The next logging steps, within ``LOGGING_SHARE`` of the training's time. From figures every rank
        has alike (the gathered ones), by plain arithmetic that is never switched off: the ranks keep reaching
        the collective on the same steps."""
        if self.log_every_n_steps is not None or not self._every:
            return
        pace = logging_pace(ranks)
        every = self._log_every(trainer)
        if pace.logging_step_s > 0 and pace.period_s > 0:
            stride = math.ceil(pace.logging_step_s / (LOGGING_SHARE * pace.period_s * every))
            every *= min(max(1, stride), MAX_LOGGING_STRIDE)
        if every != self._every and self._quiet_fetches:
            # A rest was counted to the old cadence's next logging step, and its length to this rank's own step
            # period: the new cadence's may come first, and the ranks would no longer meet on the same steps.
            self._quiet_fetches = 0
            self._hooks_on()
        self._every = every

    def _log_every(self, trainer: Any) -> int:
        """Steps between logging steps: the user's, else the trainer's but no fewer than half a window.

        Each figure spans the window: logging it every step of a ``log_every_n_steps=1`` trainer would repeat
        the same steps, at a cost (a window, a diagnosis, a collective) that short steps would feel.
        """
        if self.log_every_n_steps is not None:
            return self.log_every_n_steps
        every = int(trainer.log_every_n_steps or 0)
        return max(every, self.window // 2) if every else 0

    def _local_figures(self, snapshot: WindowSnapshot) -> dict[str, float]:
        gpu = self._gpu.read() if self._gpu is not None else None
        return rank_figures(snapshot, self._host_key, gpu, self._monitor.loaders_settings)

    def _gathered(self, trainer: Any, row: list[float]) -> dict[str, list[float]] | None:
        """Every rank's figures, gathered (one collective); never switched off (see :meth:`_guarded`): a rank
        that left the collective alone would leave the others waiting in it for good. A failure is said once,
        and the next logging step gathers again, as every rank does."""
        try:
            return figures_by_name(_pl.gather_rows(trainer, row))
        except Exception as err:
            self._say_once(
                f"gathering the ranks' figures failed ({type(err).__name__}: {err}); they are gathered again at the "
                "next logging step. Training is not affected."
            )
            return None

    def _publish(self, trainer: Any, log: bool = True, closing: bool | None = None, step: int | None = None) -> None:
        """The window's figures, diagnosis and (where ``log``) logs at ``step`` (default: the trainer's).

        ``closing`` (default: where not logged): the run's last figures, spoken whatever the hysteresis holds.
        """
        started = time.thread_time()
        try:
            self._publish_window(trainer, log, closing, step)
        finally:
            self._logging_step_s = time.thread_time() - started

    def _publish_window(self, trainer: Any, log: bool, closing: bool | None, step: int | None) -> None:
        snapshot = self._guarded("building the measurement window", self._monitor.snapshot)
        figures = self._guarded("summarising the window", self._local_figures, snapshot) if snapshot else None
        figures = figures or {"host_key": self._host_key}
        figures["logging_step_ms"] = self._logging_step_s * 1e3
        row = self._guarded("passing the window to the ranks", figure_row, figures)
        row = row or figure_row({"host_key": self._host_key})
        if trainer.world_size == 1:
            ranks = self._guarded("combining the ranks' figures", figures_by_name, [row])
        else:
            # Every rank reaches the collective on the same steps whatever happened locally, before or after.
            ranks = self._gathered(trainer, row)
        if ranks is None:
            return
        # Which steps log next follows from the gathered figures alone (plain arithmetic: it fails on every rank
        # or on none), whatever fails on this rank below.
        self._guarded("pacing the logging", self._pace_logging, trainer, ranks)
        combined = self._guarded("combining the ranks' figures", summarise, ranks, trainer.global_rank)
        if combined is None:
            return
        self._monitor.processes_on_host = combined.processes_on_host
        self.metrics = combined.metrics
        if snapshot is not None:
            own = combined.host
            # The diagnosis judges this rank's host by the figures summed over its ranks.
            host = replace(
                snapshot.host,
                processes_on_host=own.processes,
                workers_on_host=own.workers,
                cpu_count=own.cores if own.cores is not None else snapshot.host.cpu_count,
            )
            inflight = own.inflight_bytes
            self.snapshot = replace(
                snapshot,
                host=host,
                rank_wait_fractions=combined.rank_wait_fractions,
                inflight_host_bytes=int(inflight) if inflight is not None else None,
            )
        if self.snapshot is not None and self.snapshot.steps:
            self._guarded("diagnosing", self._diagnose, trainer, not log if closing is None else closing)
        if not log:
            return
        metrics = {k: v for k, v in combined.metrics.items() if not math.isnan(v)}
        # The settings the window ran with: where the auto-tuner switched, this line steps.
        settings = self._monitor.settings
        metrics["loadguard/num_workers"] = float(settings.num_workers)
        metrics["loadguard/prefetch_factor"] = float(settings.prefetch_factor or 0)
        decision = self.decision
        if decision is not None:
            metrics["loadguard/retunes"] = float(decision.retunes)
        step = _pl.log_step(trainer) if step is None else step
        self._logged_step = step
        for logger in trainer.loggers:
            # The logger's own call: its failure reaches the user exactly as a Lightning-logged metric's would.
            logger.log_metrics(metrics, step)
        if self.diagnosis is not None and self._unlogged_change:
            self._unlogged_change = False
            self._log_diagnosis(trainer, step)

    def _diagnose(self, trainer: Any, closing: bool = False) -> None:
        snapshot = self.snapshot
        assert snapshot is not None
        batches = trainer.num_training_batches
        steps_per_epoch = int(batches) if math.isfinite(batches) and batches > 0 else None
        # Earlier windows feed the sustained rates; only those that end before the current one begins, so no
        # step counts twice. Their production times are left out: the current window already spans several.
        now = self._monitor.total_steps
        earlier = tuple(past for steps, past in self._history if now - steps >= self.window)
        # What is reported changes only when a new verdict holds over several windows (hysteresis).
        reach = self._guarded("asking what the auto-tuner would do", self._tuner_reach, trainer, steps_per_epoch)
        raw = diagnose(snapshot, earlier, steps_per_epoch=steps_per_epoch, tuner=reach or UNKNOWN_REACH)
        self.diagnosis = self._stable.update(raw, settled=snapshot.steps >= self.window, closing=closing)
        self._unlogged_change = self._unlogged_change or self._stable.changed
        if not self._history or now - self._history[-1][0] >= self.window:
            stripped = replace(snapshot, production_s=(), production_cpu_s=(), production_queued_s=())
            self._history.append((now, stripped))

    def _tuner_reach(self, trainer: Any, steps_per_epoch: int | None) -> TunerReach:
        """Whether ``auto_tune=True`` would probe worker counts for this fit's train loader: this fit's tuner where
        it started, else the checks it makes before probing (the fix text offers it only where it would)."""
        if self._tuner is not None:
            reach = self._tuner.reach()
            if reach is not None:
                return reach
        from lightning_loadguard.tuning.reach import tuner_reach

        loaders = _pl.train_loaders(trainer)
        key = (tuple(map(id, loaders)), steps_per_epoch)
        if self._reach is None or self._reach[0] != key:
            assert self.snapshot is not None
            options = self._tuner.options if self._tuner is not None else None
            max_epochs = trainer.max_epochs if trainer.max_epochs is not None and trainer.max_epochs >= 0 else None
            found = tuner_reach(
                loaders,
                self.snapshot,
                epoch_steps=steps_per_epoch,
                max_epochs=max_epochs,
                devices_on_host=int(trainer.num_devices or 1),
                options=options,
            )
            self._reach = (key, found)
        return self._reach[1]

    def _mark_switch(self, trainer: Any, before: LoaderSettings) -> None:
        """A text marker at the step where the loader's settings changed (TensorBoard's Text tab, or a table)."""
        if trainer.global_rank != 0:
            return
        now = self._monitor.settings
        text = (
            f"step {_pl.log_step(trainer)}: num_workers {before.num_workers} -> {now.num_workers}, "
            f"prefetch_factor {before.prefetch_factor or '-'} -> {now.prefetch_factor or '-'}"
        )
        _pl.log_text(trainer.loggers, "loadguard/loader_settings", text, _pl.log_step(trainer))

    def _log_diagnosis(self, trainer: Any, step: int) -> None:
        diagnosis = self.diagnosis
        assert diagnosis is not None
        text = self._guarded("writing the diagnosis", diagnosis.to_text)
        if text is None:
            return
        if diagnosis.draining is not None and self.print_summary:
            # Printed with the rest of LoadGuard's output: print_summary=False prints nothing.
            draining = self._guarded("writing the diagnosis", diagnosis.draining.summary)
            if draining:
                _print_on_rank_zero(trainer, f"LoadGuard: {draining}")
        _pl.log_text(trainer.loggers, "loadguard/diagnosis", text, step)

    # -- reporting -------------------------------------------------------------------------------------

    def summary(self) -> str:
        """A readable table of what was measured: the latest window and the whole run."""
        monitor = self._monitor
        text = format_summary(
            metrics=self.metrics,
            settings=monitor.settings,
            total_steps=monitor.total_steps,
            total_wait_s=monitor.total_wait_s,
            total_step_s=monitor.total_step_s,
            total_batches_made=monitor.total_batches_made,
            total_busy_s=monitor.total_busy_s,
            epoch_start_s=monitor.epoch_start_s,
            notes=sorted(self._said),
            stated=_stated_figures(self.diagnosis),
        )
        if self.diagnosis is not None:
            text += "\n\n" + plain_text(self.diagnosis.to_text())
        node = self._node_forecast
        if node is not None and not node.holds:
            text += (
                f"\n\nOn all {node.ranks_per_node} devices of this node these settings would not hold: "
                f"{node.sentence()} (LoadGuard.forecast; docs/forecast.md)"
            )
        return text

    # -- forecast --------------------------------------------------------------------------------------

    def forecast(
        self,
        *,
        ranks_per_node: int | None = None,
        usable_cores: float | None = None,
        other_cores: float | None = None,
        available_ram_bytes: int | None = None,
        shm_free_bytes: int | None = None,
        step_speedup: float = 1.0,
        batch_scale: float = 1.0,
        num_workers: int | None = None,
        prefetch_factor: int | None = None,
        pin_memory: bool | None = None,
    ) -> Forecast:
        """What more ranks per node, other cores or memory, a faster or slower step, larger batches or other loader
        settings would do, predicted from this run's latest window (every argument left out keeps the measured
        value; see ``docs/forecast.md`` for the method and its limits).

        Args:
            ranks_per_node: training processes per node.
            usable_cores: cores each process may use; other_cores: cores other work takes of them (default: the
                share other work took here).
            available_ram_bytes, shm_free_bytes: the node's available RAM and free ``/dev/shm``.
            step_speedup: the step takes ``1 / step_speedup`` of its measured time (2: twice as fast).
            batch_scale: batches this many times as large (production, step and bytes scale with it).
            num_workers, prefetch_factor, pin_memory: the loader's settings per rank.

        Raises:
            ValueError: an argument out of range (the message names it and what it allows).
            RuntimeError: no window was measured yet.

        Example:
            >>> trainer.fit(model, datamodule)  # doctest: +SKIP
            >>> print(guard.forecast(ranks_per_node=8, step_speedup=2.0))  # doctest: +SKIP
        """
        from lightning_loadguard.model.forecast import WhatIf, forecast

        what_if = WhatIf(
            ranks_per_node=ranks_per_node,
            usable_cores=usable_cores,
            other_cores=other_cores,
            available_ram_bytes=available_ram_bytes,
            shm_free_bytes=shm_free_bytes,
            step_speedup=step_speedup,
            batch_scale=batch_scale,
            num_workers=num_workers,
            prefetch_factor=prefetch_factor,
            pin_memory=pin_memory,
        )
        return forecast(self.forecast_facts(), what_if)

    def forecast_facts(self) -> ForecastFacts:
        """The measured facts :meth:`forecast` starts from (the latest window; what ``loadguard report
        --what-if`` reads from the logs).

        Raises:
            RuntimeError: no window was measured yet.
        """
        from lightning_loadguard.model.forecast import facts_from_window

        if self.snapshot is None or not self.snapshot.steps:
            raise RuntimeError(
                "LoadGuard has measured no window yet: forecast after fit, or once its first window was logged"
            )
        earlier = [past for _, past in self._history]
        return facts_from_window(self.snapshot, earlier, batch_size=self._monitor.settings.batch_size)

    def _forecast_at_end(self, trainer: Any, step: int) -> None:
        """The facts logged for ``loadguard report --what-if``; the forecast at the node's every device."""
        from lightning_loadguard.model.forecast import FACTS_TAG, WhatIf, forecast

        if self.snapshot is None or not self.snapshot.steps:
            return
        facts = self.forecast_facts()
        if trainer.global_rank == 0:
            for logger in trainer.loggers:
                experiment = getattr(logger, "experiment", None)
                if _pl.is_tensorboard_logger(logger) and hasattr(experiment, "add_text"):
                    experiment.add_text(FACTS_TAG, facts.to_text(), global_step=step)
        devices = _pl.node_device_count(trainer)
        if devices is not None and devices > facts.ranks_per_node:
            self._node_forecast = forecast(facts, WhatIf(ranks_per_node=devices))


def _stated_figures(diagnosis: Diagnosis | None) -> dict[str, float]:
    """The rates and wait the diagnosis states (its dominant finding's first), for the summary to print the same."""
    stated: dict[str, float] = {}
    for finding in reversed(diagnosis.findings if diagnosis is not None else ()):
        for name in ("consumer_rate", "producer_rate", "wait_fraction"):
            value = finding.evidence.get(name)
            if isinstance(value, float) and math.isfinite(value):
                stated[name] = value
    return stated
