"""The auto-tuner's driver: measure windows in epoch 0, switch the loader in place, decide, apply.

:class:`TuningSession` counts steps, cuts measurement windows from the
:class:`~lightning_loadguard.meters.monitor.LoaderMonitor`'s snapshots, combines them across ranks, asks
the :class:`~lightning_loadguard.tuning.planner.Planner` what to measure next, and restarts the train
loader's iterator at the consumer's position with the next setting (:mod:`lightning_loadguard.position.switch`),
so epoch 0 sees the same samples in the same order. Plain Python: the training loop is reached through a
:class:`~lightning_loadguard.tuning.port.TrainerPort` (``lightning_loadguard._tuner_adapter`` implements it for
Lightning); what it can do before it probes is :mod:`lightning_loadguard.tuning.reach`.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import replace
from functools import partial
from typing import Any, NamedTuple, TypeVar

from torch.utils.data import DataLoader, IterableDataset

from lightning_loadguard.meters.monitor import LoaderMonitor, WindowMark
from lightning_loadguard.meters.ranks import WindowRanks
from lightning_loadguard.meters.settings import LoaderSettings, settings_of
from lightning_loadguard.meters.window import WindowSnapshot
from lightning_loadguard.model.budget import HostBudget
from lightning_loadguard.model.diagnosis import TunerReach
from lightning_loadguard.position.switch import (
    OrderTap,
    RandomDrawWatch,
    apply_settings,
    draw_seeds_like_fresh_iterators,
    end_runs_at_length,
    order_drawn_at_start,
    order_streams,
    restart_iterator,
    shutdown,
    stop_ending_at_length,
    stop_seed_draws,
    watch_worker_deaths,
    yielded,
)
from lightning_loadguard.tuning.arms import PROFILE_LENGTH
from lightning_loadguard.tuning.decision import TuneDecision
from lightning_loadguard.tuning.depth import model_only_decision
from lightning_loadguard.tuning.options import TuneOptions, options_to_start
from lightning_loadguard.tuning.planner import Planner
from lightning_loadguard.tuning.port import TrainerPort
from lightning_loadguard.tuning.reach import (
    MAX_SPAN_EPOCHS,
    PROBES_WANTED,
    loaders_declined,
    span_choices,
    spanning_planner,
    tuner_budget,
)
from lightning_loadguard.tuning.sharding import worker_sharding
from lightning_loadguard.tuning.watch import HOST_MOVE, CoresUse, DecisionWatch, HostChange, WatchReference

__all__ = ["TrainerPort", "TuneDecision", "TuneOptions", "TuningSession"]

T = TypeVar("T")

_STATE_VERSION = 1
_KEPT = ("no_gain", "compute_bound")  # the verdicts that tell the user "your settings are kept"
_WATCHED = ("improved", *_KEPT)  # the decisions a re-tune may revisit (probed, map-style)
_WATCHED_STEPS = 3


class _CannotSwitch(Exception):
    """The loop's iterator cannot be replaced (a condition of this trainer, not a fault)."""


class _Abandoned(Exception):
    """A step of the tuner failed on some rank; every rank learned so at the same point (see
    :meth:`TuningSession._together`) and stops tuning there."""

    def __init__(self, what: str, error: BaseException | None) -> None:
        if isinstance(error, _CannotSwitch):
            super().__init__(str(error))
            return
        where = f"{type(error).__name__}: {error}" if error is not None else "on another rank"
        super().__init__(f"{what} failed ({where})")


def _epochs(count: int) -> str:
    return "epoch" if count == 1 else f"{count} epochs"


def _what_starts(options: TuneOptions, epoch_steps: int) -> str:
    wanted = options_to_start(options, epoch_steps)
    if wanted is None:
        return "Epochs this short are not tuned: a smaller batch size gives more steps, or set the loader by hand."
    code, window = wanted
    return f"To tune it anyway: LoadGuard(auto_tune={code}), which measures windows of {window} steps (noisier)."


class _ProbeIterator:
    """The iterator the trainer fetches from while settings are probed; reverts when a probe fails.

    A worker that crashes or runs out of shared memory under a probed setting raises here, before its
    batch left the loader: the loader restarts at the fastest setting measured so far right after the batches already
    handed out, so no sample is lost or repeated.
    """

    def __init__(self, session: TuningSession, inner: Any, offset: int) -> None:
        self.session = session
        self.inner = inner
        self.offset = offset
        self.count = 0

    @property
    def yielded(self) -> int:
        return self.offset + self.count

    def __iter__(self) -> _ProbeIterator:
        return self

    def __next__(self) -> Any:
        try:
            batch = next(self.inner)
        except StopIteration:
            raise
        except Exception as err:
            target = self.session._fallback()
            if target is None:
                raise
            self.session._revert(self, err, target)
            batch = next(self.inner)
        self.count += 1
        return batch

    def _shutdown_workers(self) -> None:
        shutdown(self.inner)


class TuningSession:
    """Tunes the train loader's worker settings during epoch 0 (created by ``LoadGuard``; not used directly).

    Args:
        options: the limits of the tuner.
        monitor: the meters the windows are read from (shared with whatever else reads them).
        say: reports a condition to the user once.
    """

    def __init__(self, options: TuneOptions, monitor: LoaderMonitor, say: Callable[[str], None]) -> None:
        self.options = options
        self.monitor = monitor
        self._say = say
        self._port: TrainerPort | None = None
        self.decision: TuneDecision | None = None
        self._restored = False
        self._active = False
        self._loader: DataLoader | None = None
        self._tap: OrderTap | None = None
        self._planner: Planner | None = None
        self._iterable = False
        self._good: LoaderSettings | None = None
        self._step = 0
        self._window_start: WindowMark | None = None
        self._switch_started = 0.0
        self._startup_s = 0.0
        self._opened: WindowMark | None = None  # where the latest switch's iterator started (None: no switch yet)
        self._worker_starts_at_switch = 0
        self._fault: str | None = None
        self._budget: HostBudget | None = None
        self._window: WindowSnapshot | None = None
        self._epoch = self._first_epoch = 0
        self._stand_ins: list[DataLoader] = []  # loaders given stand-ins for the fit (undone in teardown)
        self._draws: RandomDrawWatch | None = None
        self._order_note: str | None = None  # said once, when loading first moves into workers
        self._declined: str | None = None  # why this fit's tuner does not probe worker counts
        self._broken: tuple[str, BaseException] | None = None  # a step of this rank failed (see _together)
        # After a decision (TuneOptions.retune): the chosen setting's windows, read at the calls after it.
        self._decision_watch: DecisionWatch | None = None
        self._reference: WatchReference | None = None  # the decision's own measurement, kept in checkpoints
        self._watch_steps = 0  # steps of each window watched, as the decision's windows
        self._watch_mark: WindowMark | None = None
        self._watch_epoch = 0
        self._watch_from = 0  # the monitor's step count from which the running setting has settled
        self._retune_due = False  # a change held (on some rank) and the re-tune has not started yet
        self._previous: TuneDecision | None = None  # the decision a re-tune under way started from
        self._retune_reason = ""
        self._due_epoch = 0  # the epoch the change the session is about to probe was found in
        self._rebuilt_midway = False  # this fit rebuilt its loaders while probing: no more probing in it

    def __getstate__(self) -> dict[str, Any]:
        # A copy is detached from the fit: no loader, no recorded order, no probing in progress.
        state = dict(self.__dict__)
        state.update(
            _loader=None,
            _tap=None,
            _active=False,
            _stand_ins=[],
            _draws=None,
            _port=None,
            _broken=None,
            _order_note=None,
            _decision_watch=None,
            _watch_mark=None,
            _retune_due=False,
            _previous=None,
        )
        return state

    # -- the training loop's events --------------------------------------------------------------------

    def on_loaders_ready(self, port: TrainerPort, loaders: list[Any]) -> None:
        """The loop built its train loaders and has not started their iterator yet."""
        self._port = port
        if self._active:
            self._stop_for_new_loaders()
        if self.decision is not None:
            due = self._retune_due, self._due_epoch, self._retune_reason
            self._stop_probing()  # the loop built new loaders: the watched one, and its recorded order, are gone
            self._apply_decision(loaders)
            if not self._rebuilt_midway and self._watch_again(port, loaders):
                # A change found late in an epoch is probed from the next epoch's start, rebuilt loaders or not.
                self._retune_due, self._due_epoch, self._retune_reason = due
            return
        if self._rebuilt_midway:
            return
        self._stop_probing()
        try:
            self._together(port, "setting up the probes", lambda: self._start(port, loaders))
        except _Abandoned as stop:
            self._abandon(port, stop)

    def _start(self, port: TrainerPort, loaders: list[Any]) -> None:
        self._broken = None
        self._declined = None
        reason = self._cannot_tune(port, loaders)
        if reason is not None:
            self._declined = reason
            self._say(f"auto-tuning is off: {reason}.")
            self.decision = None
            return
        loader = loaders[0]
        steps = port.epoch_steps(loader)
        self._loader = loader
        self._iterable = isinstance(loader.dataset, IterableDataset)
        original = settings_of(loader)
        main_process = _main_process_keeps_order(port, loader)
        if original.num_workers == 0 and not main_process:
            self._declined = f"{_SIDE_KEPT}, and loading in the main process leaves no setting to probe"
            self._say(f"auto-tuning is off: {self._declined}.")
            self.decision = None
            return
        self._good = original
        self._budget = self._host_budget(port)
        # Without a length (an iterable dataset) only the user's window is measured: size it as for 10 windows.
        planner_steps = steps if steps is not None else 10 * (self.options.warmup_steps + self.options.window_for(0))
        consumed = port.consumed_in_epoch()
        epochs = span_choices(port.max_epochs) if consumed == 0 and not self._iterable else (1,)

        def planner(span: int) -> Planner:
            assert self._budget is not None
            steps_left = max(0, planner_steps - consumed)
            return Planner(
                original,
                self._budget,
                self.options,
                steps_left,
                pinning_helps=port.pinning_helps,
                span_epochs=span,
                main_process=main_process,
            )

        self._planner = spanning_planner(planner, epochs)
        if not self._iterable and not self._planner.can_start():
            window = self._planner.window
            span = self._planner.span_epochs
            capped = port.max_epochs is not None and span == port.max_epochs < MAX_SPAN_EPOCHS
            self._declined = f"epochs of {planner_steps} steps leave no room to measure your settings and one candidate"
            self._say(
                f"auto-tuning is off: epochs have {planner_steps} steps; measuring your settings and one candidate "
                f"takes 2 x {window} steps, with at most {self._planner.budget_steps} steps of probing "
                f"(probe_share={self.options.probe_share}) over the first {_epochs(span)} it may span"
                + (
                    f" (max_epochs={port.max_epochs}; more epochs would let it span up to {MAX_SPAN_EPOCHS})"
                    if capped
                    else ""
                )
                + ". "
                + _what_starts(self.options, planner_steps)
            )
            return
        if not self._iterable:
            self._tap = OrderTap.install(loader)
            if original.num_workers == 0:
                self._end_runs_at_length(loader)
        self._active = True
        self._epoch = self._first_epoch = port.current_epoch
        self._step = 0
        span = self._planner.span_epochs
        spans = f", probing over the first {_epochs(span)} ({planner_steps} steps each)" if span > 1 else ""
        self._progress(f"measuring your settings ({original.label}){spans}")

    @property
    def probing(self) -> bool:
        """Whether probing is under way (or its order tap still listens for the rest of the decision's epoch):
        every step counts. Watching the decision reads windows at the calls it gets (logging steps)."""
        return self._active or (self._tap is not None and self._decision_watch is None)

    def on_train_batch_end(self, port: TrainerPort, logging_step: bool = False) -> None:
        """A training step ended (``logging_step``: one of the logging steps, which every rank calls on)."""
        self._port = port
        try:
            self._advance(port, logging_step)
        except _Abandoned as stop:
            self._abandon(port, stop)

    def _advance(self, port: TrainerPort, logging_step: bool = False) -> None:
        if not self._active:
            if self._decision_watch is not None:
                if logging_step:
                    self._watch_decision(port)
            elif self._tap is not None and port.current_epoch != self._epoch:
                self._stop_probing()
            return
        if port.current_epoch != self._epoch and not self._epoch_turned(port):
            return
        self._step += 1
        warmup = self._warmup_steps
        try:
            self._watch(port, warmup)
        except Exception as err:
            # A step without a collective: every rank learns of it at the window's end (see _together).
            self._broken = self._broken or ("watching the steps", err)
        if self._step == warmup + self._window_steps:
            self._end_window(port)

    def _watch(self, port: TrainerPort, warmup: int) -> None:
        if self._step == 1 and self._planner is not None and not self._planner.measurements:
            # The user's in-process fetches are watched for draws from the run's random streams, during the
            # warm-up steps only: the watch's own cost stays out of the measured window.
            self._draws = RandomDrawWatch.install(port.train_iterator()[0])
        elif self._draws is not None and self._step >= max(warmup, _WATCHED_STEPS):
            self._draws.watching = False
        if self._step == warmup:
            self._window_start = self.monitor.mark()

    def _epoch_turned(self, port: TrainerPort) -> bool:
        """The new epoch's first step ran while probing: the open window is dropped (its steps count as probing
        under a candidate), and probing goes on with the setting the budget left still holds
        (:meth:`Planner.after_epoch_end`): the running one, its window counting this step, else another from the
        next step; or the tuner decides when the span is over or none fits. Whether the step counts in a window."""
        planner = self._planner
        assert planner is not None
        self._epoch = port.current_epoch
        running = planner.current
        if running != planner.original:
            planner.probe_steps += self._step
        self._step = 0
        self._window_start = None
        if self._epoch - self._first_epoch >= planner.span_epochs:
            planner.note_budget_spent()
            following = None
        else:
            following = self._together(port, "planning the next probe", lambda: planner.after_epoch_end(ran=1))
        if following is None:
            # The tap stays for this epoch: a failure of the chosen setting can still go back mid-epoch.
            self._finish(port, self._together(port, "deciding", self._decide))
            return False
        if following != running:
            self._go_on(port, None, following)
            return False
        self._progress(f"epoch {self._epoch}: measuring {running.label} again from the epoch's start")
        return True

    def teardown(self) -> None:
        """Fit ended: give the loader its own sampler back if epoch 0 did not finish."""
        self._restore_start_settings()
        self._stop_probing()
        self._rebuilt_midway = False
        while self._stand_ins:
            loader = self._stand_ins.pop()
            stop_seed_draws(loader)
            stop_ending_at_length(loader)
        self._port = None

    def state_dict(self) -> dict[str, Any]:
        decision = self.decision.to_dict() if self.decision else None
        state: dict[str, Any] = {"version": _STATE_VERSION, "decision": decision}
        reference = self._reference
        if self.decision is not None and reference is not None:
            state["watch"] = {
                "rate": reference.rate,
                "error": reference.error,
                "winnable": reference.winnable,
                "window_steps": self._watch_steps,
            }
            if reference.cores is not None:
                state["watch"]["cores"] = {"other": reference.cores.other, "busy_share": reference.cores.busy_share}
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state.get("version") != _STATE_VERSION or state.get("decision") is None:
            return
        self.decision = TuneDecision.from_dict(state["decision"])
        self._restored = True
        watch = state.get("watch")  # absent from checkpoints of 0.1.0 and of decisions not watched
        self._reference = None
        try:
            self._reference = WatchReference(
                self.decision.setting,
                float(watch["rate"]),
                float(watch["error"]),
                float(watch["winnable"]),
                _stored_cores(watch.get("cores")),
            )
            self._watch_steps = int(watch["window_steps"])
        except (KeyError, TypeError, ValueError, AttributeError):
            self._reference = None  # no measurement to watch against: the decision is applied, not watched

    # -- windows ---------------------------------------------------------------------------------------

    def _end_window(self, port: TrainerPort) -> None:
        """The window is over: combine the ranks' figures, plan, agree, and switch to the next setting.

        Under DDP the ranks meet in the tuner's collectives (the window's gather, the broadcasts of the figures
        planned from, of the next setting and of the decision) in the same order; the local work between them runs
        through :meth:`_together`, so that a failure on one rank stops every rank at the same point instead of
        leaving the others waiting in the next collective.
        """
        planner = self._planner
        assert planner is not None
        now = time.perf_counter()
        start = self._window_start
        # On an accelerator a setting is judged by the device's idle: a pinned copy lets the host run ahead,
        # which the host's own clock does not show.
        local, rows = self._gathered_window(port, lambda: self._measured(port, start))
        drew = reorders = False
        if not planner.measurements and not self._iterable:  # the user's own settings, measured first
            drew, reorders = self._in_process_draws()
            if port.world_size > 1:
                drew = port.any_rank(drew)
                reorders = drew and port.any_rank(reorders)

        self._plan_window(port, local, rows, now, drew, reorders)

    def _plan_window(
        self,
        port: TrainerPort,
        local: WindowSnapshot,
        rows: list[list[float]] | None,
        ended: float,
        drew: bool = False,
        reorders: bool = False,
    ) -> None:
        """Combine the ranks' rows of the window that ended at ``ended``, plan from them, agree and go on."""
        planner = self._planner
        assert planner is not None

        def figures() -> _PlanFigures:
            combined, failed_elsewhere = (local, False) if rows is None else self._window_ranks().combine(local, rows)
            span = ended - self._switch_started if planner.current != planner.original else None
            return _PlanFigures(combined, failed_elsewhere, self._startup_cost_s(), span)

        plan_figures = self._together(port, "combining the ranks' windows", figures)
        if port.world_size > 1:
            # Every rank's planner must take the same steps (where windows end, whether a setting restarts, when to
            # decide), so every rank plans from rank 0's figures: the host readings and worker starts in them are
            # each rank's own.
            plan_figures = port.broadcast(plan_figures)
        plan = partial(self._plan, port, plan_figures, drew, reorders)
        self._go_on(port, *self._together(port, "planning the next probe", plan))

    def _go_on(self, port: TrainerPort, final: TuneDecision | None, next_setting: LoaderSettings | None) -> None:
        """A window was planned: finish with ``final``, or agree on the next setting and switch to it."""
        planner = self._planner
        assert planner is not None
        if final is not None:
            self._finish(port, final)
            return
        next_setting = self._agree(port, next_setting)
        if next_setting is None:
            self._finish(port, self._together(port, "deciding", self._decide))
            return
        planner.current = next_setting
        self._together(port, "switching the loader", lambda: self._probe(port, next_setting))

    def _in_process_draws(self) -> tuple[bool, bool]:
        """Whether the user's in-process fetches drew from the main process's global random streams, and
        whether the loader's order is drawn from one of those they drew from (or from a stream not known)."""
        draws = self._draws
        if draws is None or not draws.drew or self._loader is None:
            return False, False
        streams = order_streams(self._loader)
        return True, streams is None or bool(streams & draws.streams)

    def _plan(
        self, port: TrainerPort, figures: _PlanFigures, drew: bool, reorders: bool
    ) -> tuple[TuneDecision | None, LoaderSettings | None]:
        """The window recorded: a decision made without probing, or the next setting to measure (``None``:
        decide)."""
        planner = self._planner
        assert planner is not None
        combined = figures.combined
        failed = self._fault or ("failed on another rank" if figures.failed_elsewhere else None)
        if not failed:
            # The cores are budgeted with the latest good window's CPU figures, as the diagnosis does.
            self._window = combined
        # The batch size is known once a batch went by: the memory budget can be set now.
        planner.budget = self._budget = self._host_budget(port)
        if self._iterable:
            return self._model_only(combined), None
        if drew and self.options.keep_random_draws:
            reason = (
                "the dataset draws from the main process's global random stream while loading (torch, random "
                "or numpy in __getitem__ or collate) and TuneOptions(keep_random_draws=True) keeps those draws "
                "bit-identical, so loading stays in the main process"
            )
            self._say(f"auto-tuning keeps num_workers=0: {reason}.")
            self._declined = reason
            return self._model_only(combined, reason), None
        if reorders:
            self._order_note = (
                "auto-tuning loads in workers although the dataset draws random numbers in the main process, "
                "from the stream the shuffle order is drawn from, so epoch 0 keeps the untuned order and later "
                "epochs hold every sample once in another order (TuneOptions(keep_random_draws=True) keeps "
                "loading in the main process and every draw as without tuning)."
            )
        next_setting = planner.record(combined, failed=failed, startup_s=figures.startup_s, span_s=figures.span_s)
        if not failed:
            self._good = max(
                ((s, m.sustained_rate) for s, m in planner.measurements.items()), key=lambda item: item[1]
            )[0]
        return None, next_setting

    def _decide(self) -> TuneDecision:
        assert self._planner is not None
        return self._planner.decide(map_style=True)

    def _startup_cost_s(self) -> float | None:
        """What starting the running setting's workers costs a loop at each epoch's start (what persistent
        workers save): the switch to it (or the user's own ``iter()``), and the workers' own start after it;
        ``None`` where no start of them was seen."""
        starts, latest = self.monitor.worker_starts
        if starts <= self._worker_starts_at_switch:
            return None
        opened = self._startup_s if self._opened is not None else self.monitor.iter_s
        return opened + latest

    def _probe(self, port: TrainerPort, setting: LoaderSettings) -> None:
        """Measure ``setting`` next: switch the loader to it, or go on where it is measured again as it runs."""
        planner = self._planner
        assert planner is not None
        spends = planner.steps_for(setting) if setting != planner.original else 0  # your settings' windows are free
        self._progress(
            f"probing {setting.label} ({planner.current_note}); probe steps "
            f"{planner.probe_steps + spends}/{planner.budget_steps} of "
            + (f"the first {planner.span_epochs} epochs" if planner.span_epochs > 1 else f"epoch {self._first_epoch}")
        )
        if planner.continuing:
            self._switch_started = time.perf_counter()  # measured again as it runs: no restart
        else:
            self._switch(port, setting)
        self._step = 0

    def _together(self, port: TrainerPort, what: str, step: Callable[[], T]) -> T:
        """``step``, local work between two of the tuner's collectives, run on every rank; where it failed on
        any rank, every rank raises :class:`_Abandoned` here, at the same point.

        A rank that stopped tuning alone would leave the others waiting in the next collective for good (a
        hang, not an error). One flag per step, gathered only where several processes train.
        """
        error: BaseException | None = None
        result: Any = None
        if self._broken is not None:  # failed on an earlier step of this rank
            what, error = self._broken
        else:
            try:
                result = step()
            except Exception as err:
                error = err
        failed = error is not None
        if port.world_size > 1:
            failed = port.any_rank(failed)
        if failed:
            raise _Abandoned(what, error)
        return result

    def _abandon(self, port: TrainerPort, stop: _Abandoned) -> None:
        """Every rank stops tuning where a step failed on one: the user's settings come back, from the same
        batch, and no collective of the tuner follows."""
        self._active = False
        self._broken = None
        self.decision, self._previous = self._previous, None
        kept = "Your settings are kept" if self.decision is None else f"{self.decision.setting.label} is kept"
        loader, planner = self._loader, self._planner
        try:
            if loader is not None and planner is not None and self._tap is not None:
                original = planner.original
                if not settings_of(loader).same_loader(original):
                    planner.current = original
                    self._switch(port, original)
        except Exception as err:
            running = settings_of(loader).label if loader is not None else "the loader's setting"
            kept = f"Going back to your settings failed too ({type(err).__name__}: {err}), so {running} runs on"
        finally:
            self._stop_probing()
        self._declined = f"it stopped in this run ({stop})"
        self._say(f"auto-tuning stopped: {stop}. {kept}; training is not affected.")

    def _window_ranks(self) -> WindowRanks:
        steps = self._window_steps
        return WindowRanks(steps=steps, production=max(2 * steps, PROFILE_LENGTH))

    def _measured(self, port: TrainerPort, start: WindowMark | None) -> WindowSnapshot:
        """This rank's window since ``start``; where no batch was made in it, since the running iterator started
        (its warm-up and first fill included), if that came after a restart (a switch, or an epoch's start)."""
        if start is None:
            raise RuntimeError("the window's start was not marked")
        window = self.monitor.snapshot(since=start).device_view()
        planner = self._planner
        if window.steps and not window.measured_a_rate and planner is not None and not planner.continuing:
            # Served from batches made before the window: its rate says nothing. What the loop got from the
            # setting since its workers started is a rate, and the one a short epoch runs at.
            marks = (m for m in (self._opened, self.monitor.iterator_mark) if m is not None)
            opened = max(marks, key=lambda mark: mark.steps, default=None)
            if opened is not None and opened.steps < start.steps:
                window = self.monitor.snapshot(since=opened).device_view()
        return window

    def _gathered_window(
        self, port: TrainerPort, measure: Callable[[], WindowSnapshot]
    ) -> tuple[WindowSnapshot, list[list[float]] | None]:
        """This rank's window (``measure``) and (where several processes train) every rank's row of it, in one
        collective.

        The row also says whether the setting failed here and whether measuring failed here (now, or a step
        since the last collective: see :meth:`_together`); where it did on any rank, every rank raises
        :class:`_Abandoned` here, at the same point, after the gather.
        """
        what, error, local = "measuring the window", None, None
        if self._broken is not None:
            what, error = self._broken
        else:
            try:
                local = measure()
            except Exception as err:
                error = err
        if port.world_size <= 1:
            if error is not None or local is None:
                raise _Abandoned(what, error)
            return local, None
        ranks = self._window_ranks()
        try:
            row = ranks.row(local, failed=self._fault is not None)
        except Exception as err:
            error, local = error or err, None
            row = ranks.row(None, failed=False)
        rows = port.gather_rows(row)
        if local is None or ranks.broken(rows):
            raise _Abandoned(what, error)
        return local, rows

    def _agree(self, port: TrainerPort, setting: LoaderSettings | None) -> LoaderSettings | None:
        # The ranks computed the same plan from the same gathered figures; rank 0's word settles any drift.
        if port.world_size <= 1:
            return setting
        return port.broadcast(setting)

    # -- switching -------------------------------------------------------------------------------------

    def _switch(self, port: TrainerPort, setting: LoaderSettings) -> None:
        assert self._loader is not None and self._tap is not None
        old, reason = port.train_iterator()
        if old is None:
            raise _CannotSwitch(reason or "the train iterator cannot be replaced")
        consumed = yielded(old)
        if consumed is None:
            raise _CannotSwitch("the train iterator does not say how many batches it handed out")
        if self._order_note is not None and setting.num_workers > 0:
            self._say(self._order_note)
            self._order_note = None
        self._switch_started = time.perf_counter()
        self._worker_starts_at_switch = self.monitor.worker_starts[0]
        self._fault = None
        inner = old.inner if isinstance(old, _ProbeIterator) else old
        try:
            new_inner = restart_iterator(
                self._loader, self._tap, consumed, old_iterator=inner, **setting.loader_kwargs()
            )
        except Exception as err:
            # Workers that cannot even start (no shm, no processes) fail the candidate before it runs.
            self._fault = f"{type(err).__name__}: {err}"
            assert self._good is not None
            new_inner = restart_iterator(self._loader, self._tap, consumed, **self._good.loader_kwargs())
        self._startup_s = time.perf_counter() - self._switch_started
        # Under any setting but the user's, a dead worker must surface inside next(), where the wrapper reverts.
        watch_worker_deaths(new_inner, watch=setting == self._planner.original if self._planner else True)
        wrapper = _ProbeIterator(self, new_inner, consumed)
        port.replace_train_iterator(old, wrapper)
        self.monitor.loader_changed(self._loader)
        self._opened = self.monitor.mark()

    @property
    def _warmup_steps(self) -> int:
        if self._planner is None:
            return self.options.warmup_steps
        return self._planner.warmup_for(self._planner.current)

    @property
    def _window_steps(self) -> int:
        assert self._planner is not None
        return self._planner.window_steps

    def _fallback(self) -> LoaderSettings | None:
        """The setting to go back to when the loader fails now, or ``None`` to let the error through.

        While probing: the fastest setting measured so far. After the decision, for the rest of the epoch: the
        setting probing started from (the user's own, under which the run would have been without tuning; in a
        re-tune, the one before it).
        """
        if self._tap is None or self._loader is None or self._planner is None or self._good is None:
            return None
        if self._active:
            return self._good if self._planner.current != self._good else None
        original = self._planner.original
        current = settings_of(self._loader)
        if (current.num_workers, current.prefetch_factor, current.pin_memory) == (
            original.num_workers,
            original.prefetch_factor,
            original.pin_memory,
        ):
            return None
        return original

    def _revert(self, wrapper: _ProbeIterator, err: BaseException, target: LoaderSettings) -> None:
        """A setting failed inside the loader: continue at ``target`` from the same batch."""
        assert self._loader is not None and self._tap is not None and self._planner is not None
        message = str(err).strip()
        self._fault = f"{type(err).__name__}: {message.splitlines()[-1] if message else ''}"
        self._progress(f"{settings_of(self._loader).label} failed ({self._fault}); back to {target.label}")
        wrapper.inner = restart_iterator(
            self._loader, self._tap, wrapper.yielded, old_iterator=wrapper.inner, **target.loader_kwargs()
        )
        watch_worker_deaths(wrapper.inner, watch=True)
        self.monitor.loader_changed(self._loader)
        if not self._active and self.decision is not None:
            original = self._planner.original
            self._loader.__dict__["persistent_workers"] = original.persistent_workers and original.num_workers > 0
            self.decision = self.decision.with_setting(
                original,
                throughput_after=self.decision.throughput_before,
                verdict="no_gain",
                reason=f"the chosen setting failed after probing ({self._fault}); "
                + ("your settings are back" if not self.decision.retunes else f"{original.label} is back"),
            )

    # -- the end ---------------------------------------------------------------------------------------

    def _model_only(self, window: WindowSnapshot, reason: str | None = None) -> TuneDecision:
        assert self._good is not None and self._budget is not None
        return model_only_decision(
            self._good,
            self._budget,
            self.options,
            window,
            reason or self._iterable_reason(),
        )

    def _iterable_reason(self) -> str:
        assert self._loader is not None
        sharding = worker_sharding(self._loader.dataset)
        if sharding is None:
            return (
                "an IterableDataset restarts from its beginning when its workers change and may not shard by "
                "worker, so num_workers is not changed and nothing is probed mid-epoch"
            )
        return (
            f"the train loader reads {sharding}: each epoch's order depends on num_workers (which worker reads "
            "which shard, interleaved batch by batch), so num_workers is kept and nothing is probed mid-epoch; "
            "the prefetch depth, which leaves the order alone, is chosen from the model for the next epoch"
        )

    def _finish(self, port: TrainerPort, decision: TuneDecision) -> None:
        previous = self._previous
        if previous is not None:  # a re-tune: the user's settings stay the decision's original, for a resume
            decision = replace(
                decision, original=previous.original, retunes=previous.retunes + 1, retuned=self._retune_reason
            )
        decision = self._agree_decision(port, decision)
        self._together(port, "applying the decision", lambda: self._apply_now(port, decision))

    def _apply_now(self, port: TrainerPort, decision: TuneDecision) -> None:
        loader = self._loader
        assert loader is not None and self._planner is not None
        chosen = replace(decision.setting, persistent_workers=loader.persistent_workers)
        if self._iterable:
            if decision.prefetch_factor != loader.prefetch_factor and not loader.persistent_workers:
                # Read when the next epoch's iterator starts; this epoch's workers keep their depth.
                loader.prefetch_factor = decision.prefetch_factor
        elif settings_of(loader) != chosen:
            self._planner.current = chosen
            self._switch(port, chosen)
        if decision.persistent_workers != loader.persistent_workers and loader.num_workers > 0:
            # Takes effect when this epoch's iterator ends: the next epoch starts workers that stay.
            loader.__dict__["persistent_workers"] = decision.persistent_workers
            self._keep_seed_draws(loader, decision)
        # The recorded order stays until epoch 0 ends: a failure of the chosen setting can still go back.
        self._active = False
        self._previous = None
        self.decision = decision
        self._report(port, decision)
        self._start_watching(decision)

    def _agree_decision(self, port: TrainerPort, decision: TuneDecision) -> TuneDecision:
        if port.world_size <= 1:
            return decision
        return TuneDecision.from_dict(port.broadcast(decision.to_dict()))

    def _restore_start_settings(self) -> None:
        """Probing ends early: the loader gets back the settings probing started from (the user's, or on a re-tune
        the decision's)."""
        if self._active and self._loader is not None and self._planner is not None:
            original = self._planner.original
            apply_settings(
                self._loader,
                num_workers=original.num_workers,
                prefetch_factor=original.prefetch_factor,
                pin_memory=original.pin_memory,
                persistent_workers=original.persistent_workers,
            )

    def _stop_for_new_loaders(self) -> None:
        """The loop built new train loaders while probing spanned epochs (``reload_dataloaders_every_n_epochs``):
        the probes were of a loader that is gone, so probing stops for the rest of the fit and the run goes on with
        what it had before probing began. Every rank builds its loaders at the same epoch start."""
        self._restore_start_settings()
        self.decision, self._previous = self._previous, None
        self._stop_probing()
        self._rebuilt_midway = True
        kept = "your settings are kept" if self.decision is None else f"{self.decision.setting.label} is kept"
        self._declined = "the loop built new train loaders while it probed"
        self._say(
            "auto-tuning stopped: the loop built new train loaders while it probed over several epochs "
            f"(reload_dataloaders_every_n_epochs); {kept} for the rest of this fit."
        )

    def _stop_probing(self) -> None:
        self._active = False
        self._stop_watching()
        if self._tap is not None and self._loader is not None:
            self._tap.remove(self._loader)
        self._tap = None

    # -- after the decision: watching it, and probing again --------------------------------------------

    def _start_watching(self, decision: TuneDecision) -> None:
        """Watch the chosen setting's windows where it was probed (``TuneOptions.retune``); the order tap stays
        so that a re-tune can restart the loader mid-epoch as the first probing did."""
        planner = self._planner
        self._reference = None
        if not self._watchable(decision) or self._tap is None or planner is None:
            return
        arm = planner.arm_of(decision.setting)
        if arm is None:
            return
        self._reference, self._watch_steps = WatchReference.of(arm), planner.window_steps
        self._watch_from_now()

    def _watchable(self, decision: TuneDecision) -> bool:
        """Whether ``decision`` is one a re-tune may revisit, with re-tuning on."""
        return self.options.retune and decision.verdict in _WATCHED

    def _watch_from_now(self) -> None:
        assert self._reference is not None
        host_move = HOST_MOVE if self.options.retune_on_other_work else None
        self._decision_watch = DecisionWatch(self._reference, self.options.min_gain, host_move=host_move)
        self._watch_mark = None
        self._watch_from = self.monitor.total_steps + self.options.warmup_steps

    def _watch_again(self, port: TrainerPort, loaders: list[Any]) -> bool:
        """New train loaders under a decision made earlier (a resumed fit, or loaders the loop rebuilt): watch the
        decision against what it measured when it decided, where the loader runs it. A resume on a slower host,
        or onto a heavier data phase, is then probed again as a change in the same fit would be. Whether it
        watches."""
        decision = self.decision
        if decision is None or self._reference is None or not self._watchable(decision):
            return False
        if loaders_declined(loaders) is not None or isinstance(loaders[0].dataset, IterableDataset):
            return False
        loader = loaders[0]
        if port.epoch_steps(loader) is None:
            return False
        if not settings_of(loader).same_loader(decision.setting):
            return False  # the stored decision was not applied (the loader's own settings changed since)
        self._loader, self._iterable, self._planner = loader, False, None
        self._tap = OrderTap.install(loader)
        self._watch_from_now()
        return True

    def _stop_watching(self) -> None:
        self._decision_watch = None
        self._watch_mark = None
        self._retune_due = False

    def _watch_decision(self, port: TrainerPort) -> None:
        """A logging step after the decision (every rank calls here on the same steps, while other calls depend on
        each rank's step times): cut the chosen setting's window where one is complete,
        and probe again where a change held (on every rank where one saw it)."""
        watch = self._decision_watch
        assert watch is not None
        change: HostChange | None = None
        error: Exception | None = None
        try:
            change = self._read_watch_window(port, watch, self._watch_steps)
        except Exception as err:  # every rank still reaches the collectives below, then all stop watching
            error = err
        failed = error is not None
        due = change is not None
        if port.world_size > 1:
            failed = port.any_rank(failed)
            due = not failed and port.any_rank(due)
        if failed:
            self._stop_watching()
            where = f"{type(error).__name__}: {error}" if error is not None else "on another rank"
            self._say(
                f"auto-tuning stops watching its decision: reading a window failed ({where}); "
                f"{settings_of(self._loader).label if self._loader is not None else 'the loader'} runs on."
            )
            return
        if due and not self._retune_due:
            self._retune_due, self._due_epoch = True, port.current_epoch
            self._retune_reason = change.reason if change is not None else "the windows changed on another rank"
        if not self._retune_due:
            return
        # The windows that showed the change measured the running setting as it runs now (mid-epoch, settled):
        # they are its first measurement, where an epoch's start would catch its workers starting up.
        running = watch.latest()
        try:
            if self._together(port, "setting up the re-tune", lambda: self._start_retune(port)) and running:
                self._plan_running(port, running)
        except _Abandoned as stop:
            self._abandon(port, stop)

    def _read_watch_window(self, port: TrainerPort, watch: DecisionWatch, steps: int) -> HostChange | None:
        """Cut the running setting's window where one of ``steps`` steps is complete, and read it."""
        total = self.monitor.total_steps
        if port.current_epoch != self._watch_epoch:
            self._watch_epoch, self._watch_mark = port.current_epoch, None  # a window never spans an epoch's end
        if self._watch_mark is None:
            if port.consumed_in_epoch() >= self.options.warmup_steps and total >= self._watch_from:
                self._watch_mark = self.monitor.mark()
            return None
        if total - self._watch_mark.steps < steps:
            return None
        window = self._measured(port, self._watch_mark)
        self._watch_mark = self.monitor.mark()
        return watch.record(window)

    def _plan_running(self, port: TrainerPort, running: WindowSnapshot) -> None:
        """The re-tune's first window: the running setting's windows the watch read (combined across ranks)."""
        local, rows = self._gathered_window(port, lambda: running)
        self._plan_window(port, local, rows, time.perf_counter())

    def _start_retune(self, port: TrainerPort) -> bool:
        """Probe again from the running setting: over the rest of the epoch the change was found in where that
        holds as many candidates as a first tuning wants, else from the next epoch's start over as many epochs as
        a first tuning would span (the change stays due until then). Whether it started."""
        loader, decision = self._loader, self.decision
        assert self._retune_due and loader is not None and decision is not None
        steps = port.epoch_steps(loader)
        if steps is None:
            self._stop_watching()
            return False
        current = settings_of(loader)
        budget = self._budget = self._host_budget(port)
        left = max(0, steps - port.consumed_in_epoch())

        main_process = _main_process_keeps_order(port, loader)

        def planner_over(span: int) -> Planner:
            return Planner(
                current,
                budget,
                self.options,
                left,
                pinning_helps=port.pinning_helps,
                span_epochs=span,
                retune=True,
                main_process=main_process,
            )

        if port.current_epoch == self._due_epoch:
            planner = planner_over(1)
            if not (planner.can_start() and planner.budget_steps >= PROBES_WANTED * planner.window):
                return False
        else:
            remaining = None if port.max_epochs is None else max(1, port.max_epochs - port.current_epoch)
            planner = spanning_planner(planner_over, span_choices(remaining))
            if not planner.can_start():
                self._stop_watching()
                reason = self._retune_reason
                self._say(f"auto-tuning does not probe again although {reason}: the epochs left hold no candidate.")
                return False
        self._stop_watching()
        self._previous = decision
        self._planner = planner
        self._good = current
        self._fault = None  # a probe of the first tuning that failed is not the running setting's failure
        self._active = True
        self._epoch = self._first_epoch = port.current_epoch
        self._step = 0
        self._window_start = None
        self._say(f"auto-tuning probes again: {self._retune_reason}.")
        span = planner.span_epochs
        over = f"epochs {self._epoch} to {self._epoch + span - 1}" if span > 1 else f"the rest of epoch {self._epoch}"
        self._progress(f"probing from {current.label}, as the watch measured it, over {over}")
        return True

    def _report(self, port: TrainerPort, decision: TuneDecision) -> None:
        if port.global_rank != 0:
            return
        table = decision.table()
        port.info(f"LoadGuard auto-tune:\n{table}")
        # Markdown renders a code block in TensorBoard's text tab, keeping the columns aligned.
        port.log_text("loadguard/auto_tune", "    " + table.replace("\n", "\n    "))

    # -- helpers ---------------------------------------------------------------------------------------

    def _apply_decision(self, loaders: list[Any]) -> None:
        decision = self.decision
        assert decision is not None
        if len(loaders) != 1 or not isinstance(loaders[0], DataLoader):
            return
        loader = loaders[0]
        current = settings_of(loader)
        applied = (decision.num_workers, decision.prefetch_factor, decision.persistent_workers)
        if (current.num_workers, current.prefetch_factor, current.persistent_workers) == applied:
            return
        if current != decision.original:
            self._say(
                f"the stored auto-tune decision ({decision.setting.label}) was made for {decision.original.label}, "
                f"but the train loader now has {current.label}: your settings are kept."
            )
            return
        crosses = (decision.num_workers == 0) != (current.num_workers == 0)
        if crosses and self._port is not None and not _main_process_keeps_order(self._port, loader):
            self._say(f"the stored auto-tune decision ({decision.setting.label}) is not applied: {_SIDE_KEPT}.")
            return
        apply_settings(
            loader,
            num_workers=decision.num_workers,
            prefetch_factor=decision.prefetch_factor,
            pin_memory=decision.pin_memory,
            persistent_workers=decision.persistent_workers,
        )
        self._keep_seed_draws(loader, decision)
        if decision.original.num_workers == 0 and decision.num_workers > 0:
            self._end_runs_at_length(loader)
        if self._restored:
            self._progress(f"applied the stored decision: {decision.setting.label}")

    def _end_runs_at_length(self, loader: DataLoader) -> None:
        # Workers read ahead to the sampler's end, which the untuned run in the main process never asks for.
        if end_runs_at_length(loader) and loader not in self._stand_ins:
            self._stand_ins.append(loader)

    def _keep_seed_draws(self, loader: DataLoader, decision: TuneDecision) -> None:
        # Persistent workers where the user's loader starts fresh ones each epoch: keep the epochs' orders.
        if decision.persistent_workers and not decision.original.persistent_workers:
            draw_seeds_like_fresh_iterators(loader)
            if loader not in self._stand_ins:
                self._stand_ins.append(loader)
            self._say(
                "auto-tuning turned persistent_workers on: every epoch keeps its samples and order, but random "
                "numbers drawn inside the workers (augmentations in __getitem__ or collate_fn) go on from one "
                "epoch to the next instead of being reseeded, as with persistent_workers=True set by hand "
                "(TuneOptions(tune_persistent_workers=False) keeps fresh workers)."
            )

    def _cannot_tune(self, port: TrainerPort, loaders: list[Any]) -> str | None:
        reason = loaders_declined(loaders)
        if reason is None and port.current_epoch != 0:
            return "tuning runs in epoch 0, and this run starts in a later epoch without a stored decision"
        return reason

    def reach(self) -> TunerReach | None:
        """What this fit's tuner does about worker counts: it probes them now, or why it does not (it declined,
        stopped, or decided already); ``None`` before it started."""
        if self._declined is not None:
            return TunerReach(False, self._declined)
        if self.decision is not None:
            d = self.decision
            measured = tuple((c.setting, c.rate) for c in d.candidates if c.rate is not None)
            reason = f"it measured this loader in this run and chose {d.setting.label} ({d.verdict})"
            return TunerReach(False, reason, chosen=d.setting, measured=measured)
        if self._active:
            return TunerReach(True)
        return None

    def _host_budget(self, port: TrainerPort) -> HostBudget:
        # Before the first window: the host's facts as now, no CPU figures yet.
        return tuner_budget(self._window or self.monitor.snapshot(), self.options, port.devices_on_host)

    def _progress(self, message: str) -> None:
        if self._port is not None:
            self._port.info(f"LoadGuard auto-tune: {message}")


class _PlanFigures(NamedTuple):
    """What the planner records of a window: the ranks' combined window, whether the setting failed on another
    rank, what starting its workers cost and the probe's span (see :meth:`Planner.record`)."""

    combined: WindowSnapshot
    failed_elsewhere: bool
    startup_s: float | None
    span_s: float | None


_SIDE_KEPT = (
    "the loop builds each epoch's iterator twice where it reloads the loaders and drops the first unread "
    "(reload_dataloaders_every_n_epochs), and the shuffle order is drawn as a run of the sampler starts: as the "
    "iterator is built where workers load, at the first batch in the main process, so moving loading across "
    "num_workers=0 would change later epochs' order"
)


def _main_process_keeps_order(port: TrainerPort, loader: DataLoader) -> bool:
    """Whether moving ``loader``'s loading across ``num_workers=0`` keeps every epoch's order (see
    :func:`~lightning_loadguard.position.switch.order_drawn_at_start`): the loop drops no iterator unread, or the
    order is drawn from nothing as a run starts."""
    return not (port.drops_unread_iterators and order_drawn_at_start(loader))


def _stored_cores(stored: Any) -> CoresUse | None:
    """The decision's reading of the cores, as a checkpoint stored it (absent from those before it was kept: the
    watch then reads the data side alone)."""
    if stored is None:
        return None
    return CoresUse(float(stored["other"]), float(stored["busy_share"]))
