"""The Lightning side of the auto-tuner: measure windows in epoch 0, switch the loader in place, apply.

``LoadGuard(auto_tune=True)`` creates one :class:`TuningSession`. It only wires the trainer to the core
(:mod:`lightning_loadguard.tuning.planner`): it counts steps, cuts measurement windows, exchanges them
between ranks, and restarts the train loader's iterator at the consumer's position with the next setting
(:mod:`lightning_loadguard.position.switch`), so epoch 0 sees the same samples in the same order.
"""

from __future__ import annotations

import time
from dataclasses import replace
from typing import TYPE_CHECKING, Any

import psutil
import torch
from lightning_utilities.core.rank_zero import rank_zero_info
from torch.utils.data import DataLoader, IterableDataset

from lightning_loadguard.meters.host import host_facts
from lightning_loadguard.position.switch import (
    OrderTap,
    RandomDrawWatch,
    apply_settings,
    draw_seeds_like_fresh_iterators,
    restart_iterator,
    shutdown,
    stop_seed_draws,
    watch_worker_deaths,
)
from lightning_loadguard.tuning import _trainer_access as access
from lightning_loadguard.tuning.budget import Budget, host_budget
from lightning_loadguard.tuning.decision import Measurement, Setting, TuneDecision, mean_or_none, profile
from lightning_loadguard.tuning.options import TuneOptions, options_to_start
from lightning_loadguard.tuning.planner import Planner, model_only_decision

if TYPE_CHECKING:
    from lightning_loadguard.callback import LoadGuard

__all__ = ["TuneDecision", "TuneOptions", "TuningSession"]

_STATE_VERSION = 1
_WATCHED_STEPS = 3


def _what_starts(options: TuneOptions, epoch_steps: int) -> str:
    wanted = options_to_start(options, epoch_steps)
    if wanted is None:
        return "Epochs this short are not tuned: a smaller batch size gives more steps, or set the loader by hand."
    code, window = wanted
    return f"To tune it anyway: LoadGuard(auto_tune={code}), which measures windows of {window} steps (noisier)."


def setting_of(loader: DataLoader) -> Setting:
    workers = int(loader.num_workers)
    return Setting(
        num_workers=workers,
        prefetch_factor=(loader.prefetch_factor or 2) if workers > 0 else None,
        pin_memory=bool(loader.pin_memory),
        persistent_workers=bool(loader.persistent_workers),
    )


def _worker_cpu_seconds(trainer: Any) -> float | None:
    """CPU seconds used so far by the worker processes of the iterator the trainer fetches from."""
    iterator, _ = access.train_iterator(trainer)
    if isinstance(iterator, _ProbeIterator):
        iterator = iterator.inner
    workers = getattr(iterator, "_workers", None)
    if not workers:
        return None
    total = 0.0
    try:
        for worker in workers:
            times = psutil.Process(worker.pid).cpu_times()
            total += times.user + times.system
    except (psutil.Error, AttributeError, TypeError):
        return None
    return total


class _ProbeIterator:
    """The iterator the trainer fetches from while settings are probed; reverts when a probe fails.

    A worker that crashes or runs out of shared memory under a probed setting raises here, before its
    batch left the loader: the loader restarts at the last good setting right after the batches already
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
        guard: the callback whose meters the windows are read from.
    """

    def __init__(self, options: TuneOptions, guard: LoadGuard) -> None:
        self.options = options
        self.guard = guard
        self.decision: TuneDecision | None = None
        self._restored = False
        self._active = False
        self._loader: DataLoader | None = None
        self._tap: OrderTap | None = None
        self._planner: Planner | None = None
        self._iterable = False
        self._good: Setting | None = None
        self._step = 0
        self._window_start: tuple[float, int] | None = None
        self._switch_started = 0.0
        self._startup_s = 0.0
        self._fault: str | None = None
        self._budget: Budget | None = None
        self._cpu_start: tuple[float, float | None] = (0.0, None)
        self._cpu_evidence: tuple[int, float, float] | None = None
        self._epoch = 0
        self._seeded: list[DataLoader] = []
        self._draws: RandomDrawWatch | None = None

    def __getstate__(self) -> dict[str, Any]:
        # A copy is detached from the fit: no loader, no recorded order, no probing in progress.
        state = dict(self.__dict__)
        state.update(_loader=None, _tap=None, _active=False, _seeded=[], _draws=None)
        return state

    # -- Lightning hooks -------------------------------------------------------------------------------

    def on_loaders_ready(self, trainer: Any, loaders: list[Any]) -> None:
        if self.decision is not None:
            self._apply_decision(loaders)
            return
        self._stop_probing()
        reason = self._cannot_tune(trainer, loaders)
        if reason is not None:
            self._say(f"auto-tuning is off: {reason}.")
            self.decision = None
            return
        loader = loaders[0]
        steps = access.epoch_steps(trainer, loader)
        self._loader = loader
        self._iterable = isinstance(loader.dataset, IterableDataset)
        original = setting_of(loader)
        self._good = original
        self._budget = self._host_budget(trainer)
        # Without a length (an iterable dataset) only the user's window is measured: size it as for 10 windows.
        planner_steps = steps if steps is not None else 10 * (self.options.warmup_steps + self.options.window_for(0))
        self._planner = Planner(
            original,
            self._budget,
            self.options,
            max(0, planner_steps - access.consumed_in_epoch(trainer)),
            pinning_helps=trainer.strategy.root_device.type == "cuda",
        )
        if not self._iterable and not self._planner.can_start():
            window = self._planner.window
            self._say(
                f"auto-tuning is off: epoch 0 has {planner_steps} steps; measuring your settings and one candidate "
                f"takes 2 x {window} steps, with at most {self._planner.budget_steps} steps of probing "
                f"(probe_share={self.options.probe_share}). "
                + _what_starts(self.options, planner_steps)
            )
            return
        if not self._iterable:
            self._tap = OrderTap.install(loader)
        self._active = True
        self._epoch = trainer.current_epoch
        self._step = 0
        self._progress(f"measuring your settings ({original.label})")

    def on_train_batch_end(self, trainer: Any) -> None:
        if not self._active:
            if self._tap is not None and trainer.current_epoch != self._epoch:
                self._stop_probing()
            return
        self._step += 1
        warmup = self.options.warmup_steps
        if self._step == 1 and self._planner is not None and not self._planner.measurements:
            # The user's in-process fetches are watched for draws from the run's random streams, during the
            # warm-up steps only: the watch's own cost stays out of the measured window.
            self._draws = RandomDrawWatch.install(access.train_iterator(trainer)[0])
        elif self._draws is not None and self._step >= max(warmup, _WATCHED_STEPS):
            self._draws.watching = False
        if self._step == warmup:
            self.guard._producer.poll()
            self._window_start = (time.perf_counter(), self.guard._producer.total_batches)
            self._cpu_start = (time.process_time(), _worker_cpu_seconds(trainer))
        elif self._step == warmup + self._window_steps:
            self._end_window(trainer)

    def teardown(self) -> None:
        """Fit ended: give the loader its own sampler back if epoch 0 did not finish."""
        self._stop_probing()
        while self._seeded:
            stop_seed_draws(self._seeded.pop())

    def state_dict(self) -> dict[str, Any]:
        return {"version": _STATE_VERSION, "decision": self.decision.to_dict() if self.decision else None}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state.get("version") != _STATE_VERSION or state.get("decision") is None:
            return
        self.decision = TuneDecision.from_dict(state["decision"])
        self._restored = True

    # -- windows ---------------------------------------------------------------------------------------

    def _end_window(self, trainer: Any) -> None:
        assert self._planner is not None and self._window_start is not None
        now = time.perf_counter()
        start, made_before = self._window_start
        producer = self.guard._producer
        producer.poll()
        metered = self.guard._producer_instrumented
        window_steps = self._window_steps
        records = self.guard._consumer.records()[-window_steps:]
        steps = [r.step_s for r in records]
        waits = [r.wait_s for r in records]
        full = len(records) == window_steps
        device = self.guard._device_window(window_steps)
        if device is not None:
            # On an accelerator a setting is judged by the device's idle: a pinned copy lets the host run
            # ahead, which the host's own clock does not show.
            (steps, waits), full = device, True
        loop_cpu, workers_cpu = time.process_time(), _worker_cpu_seconds(trainer)
        elapsed = now - start
        loop_s = (sum(steps) + sum(waits)) * window_steps / max(1, len(steps))
        worker_cores = None
        if workers_cpu is not None and self._cpu_start[1] is not None and elapsed > 0:
            worker_cores = (workers_cpu - self._cpu_start[1]) / elapsed
        durations = list(producer.durations())[-window_steps:] if metered else []
        local = Measurement(
            steps=window_steps,
            # The loop's own time (validation runs inside the epoch are excluded by the consumer meter).
            elapsed_s=loop_s if full else elapsed,
            made=(producer.total_batches - made_before) if metered else None,
            mean_step_s=mean_or_none(steps) or 0.0,
            mean_production_s=mean_or_none(durations),
            production_profile=profile(durations),
            step_profile=profile(steps),
            startup_s=self._startup_s,
            failed=self._fault,
            mean_wait_s=mean_or_none(waits) or 0.0,
            worker_cores=worker_cores,
            loop_cores=(loop_cpu - self._cpu_start[0]) / elapsed if elapsed > 0 else None,
        )
        combined = self._combine(trainer, local)
        workers = self._planner.current.num_workers
        if not combined.failed and combined.loop_cores is not None:
            if workers > 0 and combined.worker_cores is not None:
                self._cpu_evidence = (workers, combined.worker_cores, combined.loop_cores)
            elif workers == 0 and self._cpu_evidence is None and combined.mean_production_s:
                # In-process loading: the loop's CPU seconds over the seconds spent making batches bound the CPU
                # share of one busy worker (the step's own CPU counts against it: pessimistic). The loop's cores
                # include the fetch too, so the spare cores are underestimated rather than over.
                making_s = combined.mean_production_s * combined.steps
                share = min(1.0, combined.loop_cores * combined.elapsed_s / making_s)
                self._cpu_evidence = (1, share, combined.loop_cores)
        planner = self._planner
        # The batch size is known once a batch went by: the memory budget can be set now.
        planner.budget = self._budget = self._host_budget(trainer)
        if self._iterable:
            self._finish(trainer, self._model_only(combined))
            return
        if not planner.measurements:  # the user's own settings, measured first
            drew = self._draws is not None and self._draws.drew
            if trainer.world_size > 1:
                drew = trainer.strategy.reduce_boolean_decision(drew, all=False)
            if drew:
                reason = (
                    "the dataset draws from the main process's global random stream while loading (torch, random "
                    "or numpy in __getitem__ or collate); loading in workers would change those draws and every "
                    "later epoch's shuffle order, so loading stays in the main process"
                )
                self._say(f"auto-tuning keeps num_workers=0: {reason}.")
                self._finish(trainer, self._model_only(combined, reason))
                return
        span = now - self._switch_started if self._planner.current != self._planner.original else 0.0
        next_setting = planner.record(combined)
        if span:
            planner.probe_time_s += span - combined.elapsed_s  # switch and warm-up cost time too
        if not combined.failed:
            self._good = max(
                ((s, m.sustained_rate) for s, m in planner.measurements.items()), key=lambda item: item[1]
            )[0]
        next_setting = self._agree(trainer, next_setting)
        if next_setting is not None:
            planner.current = next_setting
        if next_setting is None:
            self._finish(trainer, planner.decide(startup_s=self._startup_s or None, map_style=True))
            return
        self._progress(
            f"probing {next_setting.label} ({planner.current_note}); probe steps "
            f"{planner.probe_steps + planner.window}/{planner.budget_steps} of epoch 0"
        )
        self._switch(trainer, next_setting)
        self._step = 0

    def _combine(self, trainer: Any, local: Measurement) -> Measurement:
        if trainer.world_size <= 1:
            return local
        row = torch.tensor(local.to_vector(), dtype=torch.float64, device=trainer.strategy.root_device)
        rows = trainer.strategy.all_gather(row).reshape(trainer.world_size, -1).cpu().tolist()
        ranks = [Measurement.from_vector(r) for r in rows]
        ranks[trainer.global_rank] = local
        combined = Measurement.combine(ranks)
        if combined.failed is None and any(r.failed for r in ranks):
            combined = Measurement(**{**combined.__dict__, "failed": "failed on another rank"})
        return combined

    def _agree(self, trainer: Any, setting: Setting | None) -> Setting | None:
        # The ranks computed the same plan from the same gathered figures; rank 0's word settles any drift.
        if trainer.world_size <= 1:
            return setting
        return trainer.strategy.broadcast(setting, src=0)

    # -- switching -------------------------------------------------------------------------------------

    def _switch(self, trainer: Any, setting: Setting, *, cached_fault: bool = False) -> None:
        assert self._loader is not None and self._tap is not None
        old, reason = access.train_iterator(trainer)
        if old is None:
            self._say(f"auto-tuning stopped: {reason}.")
            self._stop_probing()
            return
        consumed = access.yielded(old)
        if consumed is None:
            self._say("auto-tuning stopped: the train iterator does not say how many batches it handed out.")
            self._stop_probing()
            return
        self._switch_started = time.perf_counter()
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
        access.replace_train_iterator(trainer, old, wrapper)
        self.guard._loader_changed(self._loader)

    @property
    def _window_steps(self) -> int:
        assert self._planner is not None
        return self._planner.window_steps

    def _fallback(self) -> Setting | None:
        """The setting to go back to when the loader fails now, or ``None`` to let the error through.

        While probing: the best setting measured so far. After the decision, for the rest of epoch 0: the
        user's own settings, under which the run would have been without tuning.
        """
        if self._tap is None or self._loader is None or self._planner is None or self._good is None:
            return None
        if self._active:
            return self._good if self._planner.current != self._good else None
        original = self._planner.original
        current = setting_of(self._loader)
        if (current.num_workers, current.prefetch_factor, current.pin_memory) == (
            original.num_workers,
            original.prefetch_factor,
            original.pin_memory,
        ):
            return None
        return original

    def _revert(self, wrapper: _ProbeIterator, err: BaseException, target: Setting) -> None:
        """A setting failed inside the loader: continue at ``target`` from the same batch."""
        assert self._loader is not None and self._tap is not None and self._planner is not None
        message = str(err).strip()
        self._fault = f"{type(err).__name__}: {message.splitlines()[-1] if message else ''}"
        self._progress(f"{setting_of(self._loader).label} failed ({self._fault}); back to {target.label}")
        wrapper.inner = restart_iterator(
            self._loader, self._tap, wrapper.yielded, old_iterator=wrapper.inner, **target.loader_kwargs()
        )
        watch_worker_deaths(wrapper.inner, watch=True)
        self.guard._loader_changed(self._loader)
        if not self._active and self.decision is not None:
            original = self._planner.original
            self._loader.__dict__["persistent_workers"] = original.persistent_workers and original.num_workers > 0
            self.decision = replace(
                self.decision,
                num_workers=original.num_workers,
                prefetch_factor=original.prefetch_factor,
                pin_memory=original.pin_memory,
                persistent_workers=original.persistent_workers,
                throughput_after=self.decision.throughput_before,
                verdict="no_gain",
                reason=f"the chosen setting failed after probing ({self._fault}); your settings are back",
            )

    # -- the end ---------------------------------------------------------------------------------------

    def _model_only(self, measurement: Measurement, reason: str | None = None) -> TuneDecision:
        assert self._good is not None and self._budget is not None
        return model_only_decision(
            self._good,
            self._budget,
            self.options,
            measurement,
            reason
            or "an IterableDataset restarts from its beginning when its workers change and may not shard by worker, "
            "so num_workers is not changed and nothing is probed mid-epoch",
        )

    def _finish(self, trainer: Any, decision: TuneDecision) -> None:
        decision = self._agree_decision(trainer, decision)
        loader = self._loader
        assert loader is not None and self._planner is not None
        chosen = Setting(decision.num_workers, decision.prefetch_factor, decision.pin_memory, loader.persistent_workers)
        if self._iterable:
            if decision.prefetch_factor != loader.prefetch_factor and not loader.persistent_workers:
                # Read when the next epoch's iterator starts; this epoch's workers keep their depth.
                loader.prefetch_factor = decision.prefetch_factor
        elif setting_of(loader) != chosen:
            self._planner.current = chosen
            self._switch(trainer, chosen)
        if decision.persistent_workers != loader.persistent_workers and loader.num_workers > 0:
            # Takes effect when this epoch's iterator ends: the next epoch starts workers that stay.
            loader.__dict__["persistent_workers"] = decision.persistent_workers
            self._keep_seed_draws(loader, decision)
        # The recorded order stays until epoch 0 ends: a failure of the chosen setting can still go back.
        self._active = False
        self.decision = decision
        self._report(trainer, decision)

    def _agree_decision(self, trainer: Any, decision: TuneDecision) -> TuneDecision:
        if trainer.world_size <= 1:
            return decision
        return TuneDecision.from_dict(trainer.strategy.broadcast(decision.to_dict(), src=0))

    def _stop_probing(self) -> None:
        self._active = False
        if self._tap is not None and self._loader is not None:
            self._tap.remove(self._loader)
        self._tap = None

    def _report(self, trainer: Any, decision: TuneDecision) -> None:
        if trainer.global_rank != 0:
            return
        table = decision.table()
        rank_zero_info(f"LoadGuard auto-tune:\n{table}")
        step = int(getattr(trainer, "global_step", 0))
        for logger in trainer.loggers:
            experiment = getattr(logger, "experiment", None)
            add_text = getattr(experiment, "add_text", None)
            if callable(add_text):
                # Markdown renders a code block in TensorBoard's text tab, keeping the columns aligned.
                add_text("loadguard/auto_tune", "    " + table.replace("\n", "\n    "), step)

    # -- helpers ---------------------------------------------------------------------------------------

    def _apply_decision(self, loaders: list[Any]) -> None:
        decision = self.decision
        assert decision is not None
        if len(loaders) != 1 or not isinstance(loaders[0], DataLoader):
            return
        loader = loaders[0]
        current = setting_of(loader)
        if current.num_workers == decision.num_workers and current.prefetch_factor == decision.prefetch_factor:
            return
        if current != decision.original:
            self._say(
                f"the stored auto-tune decision ({decision.setting.label}) was made for {decision.original.label}, "
                f"but the train loader now has {current.label}: your settings are kept."
            )
            return
        apply_settings(
            loader,
            num_workers=decision.num_workers,
            prefetch_factor=decision.prefetch_factor,
            pin_memory=decision.pin_memory,
            persistent_workers=decision.persistent_workers,
        )
        self._keep_seed_draws(loader, decision)
        if self._restored:
            self._progress(f"applied the stored decision: {decision.setting.label}")

    def _keep_seed_draws(self, loader: DataLoader, decision: TuneDecision) -> None:
        # Persistent workers where the user's loader starts fresh ones each epoch: keep the epochs' orders.
        if decision.persistent_workers and not decision.original.persistent_workers:
            draw_seeds_like_fresh_iterators(loader)
            self._seeded.append(loader)

    def _cannot_tune(self, trainer: Any, loaders: list[Any]) -> str | None:
        if len(loaders) != 1:
            return f"the trainer iterates {len(loaders)} train loaders at once"
        loader = loaders[0]
        if not isinstance(loader, DataLoader):
            return f"the train loader is a {type(loader).__name__}, not a torch DataLoader"
        if trainer.current_epoch != 0:
            return "tuning runs in epoch 0, and this run starts in a later epoch without a stored decision"
        if isinstance(loader.dataset, IterableDataset) and loader.num_workers == 0:
            return (
                "the train loader reads an IterableDataset in the main process; more workers would each replay an "
                "unsharded dataset (duplicate samples) and no buffer exists to deepen"
            )
        return None

    def _host_budget(self, trainer: Any) -> Budget:
        processes = max(int(getattr(trainer, "num_devices", 1) or 1), int(self.guard._processes_on_host))
        batch_bytes = self.guard._batch_bytes
        workers, worker_cores, loop_cores = self._cpu_evidence or (0, None, None)
        return host_budget(
            host_facts(processes),
            batch_bytes,
            memory_share=self.options.memory_share,
            shm_share=self.options.shm_share,
            max_workers=self.options.max_workers,
            measured_workers=workers,
            worker_cores=worker_cores,
            loop_cores=loop_cores,
        )

    def _say(self, message: str) -> None:
        self.guard._say_once(message)

    def _progress(self, message: str) -> None:
        rank_zero_info(f"LoadGuard auto-tune: {message}")
