"""Re-tuning inside a real fit: a data phase that gets heavier after the decision is probed again, in the untuned
order, and the faster setting it finds holds on the test's own clock."""

from __future__ import annotations

import multiprocessing
import time
import warnings
from pathlib import Path
from typing import Any

import pytest
import torch
from lightning.pytorch.loggers import TensorBoardLogger
from pipelines import quiet_trainer
from scripted_tuning import HeavierWhenTold
from torch.utils.data import DataLoader, Dataset, get_worker_info

from lightning_loadguard import LoadGuardWarning, ResumableLoaderMixin
from lightning_loadguard._lightning import pl
from lightning_loadguard.callback import LoadGuard
from lightning_loadguard.cli._runs import read_runs
from lightning_loadguard.synthetic import TimedModule
from lightning_loadguard.tuning import watch as watch_module
from lightning_loadguard.tuning.session import TuneOptions
from lightning_loadguard.tuning.watch import CoresUse

LIGHT_S, HEAVY_S = 0.00025, 0.025  # per sample, slept (I/O): 1 ms and 100 ms a batch of 4, on any host's cores
STEP_S = 0.01  # 100 steps/s: one worker keeps up with the light phase (1000 batches/s); the heavy one needs ten
LENGTH, BATCH = 480, 4  # 120 steps an epoch
HEAVY_CEILING = 1 / (BATCH * HEAVY_S)  # steps/s one worker sustains in the heavy phase, from the costs
OPTIONS = TuneOptions(warmup_steps=2, window_steps=6, tune_persistent_workers=False)


class PhasedDataset(Dataset):
    """Samples that cost ``LIGHT_S`` until :attr:`heavy` is set, then ``HEAVY_S``; the flag lives in shared
    memory, so workers that exist when it is set see it too."""

    def __init__(self, length: int = LENGTH) -> None:
        self.heavy = multiprocessing.get_context("fork").Value("b", 0)
        self.length = length

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        time.sleep(HEAVY_S if self.heavy.value else LIGHT_S)
        return torch.tensor(index), torch.zeros(16)


class HeavyFrom(pl.Callback):
    """Makes the data phase heavy from the start of ``epoch`` (``after_decision``: of the first epoch from ``epoch`` on
    that starts with a decision made, so that a first tuning spanning epochs never measures the heavy phase); keeps
    the decision the first epoch ended with, the last decision seen after each count of re-tunes, and the time each
    step ended (the test's own clock)."""

    def __init__(self, dataset: PhasedDataset, epoch: int, guard: LoadGuard, *, after_decision: bool = False) -> None:
        self.dataset, self.epoch, self.guard, self.after_decision = dataset, epoch, guard, after_decision
        self.first_decision: Any = None
        self.by_retunes: dict[int, Any] = {}
        self.ended: list[float] = []

    def on_train_epoch_start(self, trainer: Any, pl_module: Any) -> None:
        epoch = trainer.current_epoch
        if self.after_decision:
            due = 0 <= self.epoch <= epoch and self.guard.decision is not None and not self.dataset.heavy.value
        else:
            due = epoch == self.epoch  # a negative epoch: never
        if due:
            self.dataset.heavy.value = 1

    def on_train_batch_end(self, *args: Any) -> None:
        self.ended.append(time.perf_counter())
        if self.guard.decision is not None:
            self.by_retunes[self.guard.decision.retunes] = self.guard.decision

    def on_train_epoch_end(self, trainer: Any, pl_module: Any) -> None:
        if trainer.current_epoch == 0:
            self.first_decision = self.guard.decision

    def on_train_end(self, trainer: Any, pl_module: Any) -> None:
        self.trainer_loader = trainer.train_dataloader

    def rate_of_last(self, steps: int) -> float:
        return steps / (self.ended[-1] - self.ended[-1 - steps])


def _fit(
    tune: bool | TuneOptions,
    *,
    heavy_from: int = 1,
    step_s: float = STEP_S,
    # Heavy from epoch 1: on a busy host the change can be found only late in it, and the re-tune then probes over
    # epoch 2 and decides at its end; a fourth epoch leaves room for that.
    epochs: int = 4,
    max_steps: int = -1,
    logger: Any = False,
    length: int = LENGTH,
    reload: int = 0,
    said: list[str] | None = None,
    extra: list[pl.Callback] | None = None,
) -> tuple[list[int], LoadGuard, HeavyFrom]:
    """A fit of the phased dataset; ``said`` collects every LoadGuard warning, repeats included."""
    pl.seed_everything(5, verbose=False)
    dataset = PhasedDataset(length)
    loader = DataLoader(dataset, batch_size=BATCH, shuffle=True, num_workers=1)
    # The watch reads a window at each logging step: every 10 steps, so that three fit in an epoch of 120.
    guard = LoadGuard(print_summary=False, auto_tune=tune, log_every_n_steps=10)
    clock = HeavyFrom(dataset, heavy_from, guard)
    module = TimedModule(step_s=step_s)
    trainer = quiet_trainer(
        max_epochs=epochs,
        max_steps=max_steps,
        callbacks=[guard, clock, *(extra or [])],
        logger=logger,
        reload_dataloaders_every_n_epochs=reload,
    )
    with warnings.catch_warnings(record=said is not None) as caught:
        warnings.simplefilter("ignore")
        warnings.simplefilter("always", LoadGuardWarning)  # what the user is told is part of the check
        trainer.fit(module, loader)
    if said is not None and caught is not None:
        said.extend(str(w.message) for w in caught if issubclass(w.category, LoadGuardWarning))
    return module.seen, guard, clock


@pytest.mark.slow
@pytest.mark.parametrize(
    "options",
    [
        pytest.param(OPTIONS, id="fresh-workers"),
        # Persistent workers chosen on the re-tune keep the later epochs' orders too (the seed draws torch skips).
        pytest.param(TuneOptions(warmup_steps=2, window_steps=6, persistent_min_share=0.0), id="persistent"),
    ],
)
def test_a_heavier_data_phase_is_probed_again_in_the_untuned_order_and_runs_faster(
    tmp_path: Path, options: TuneOptions
) -> None:
    # The order does not depend on the timings: the untuned reference runs light and without a step.
    untuned, _, _ = _fit(False, heavy_from=-1, step_s=0.0)
    # The clock check below needs a first decision the heavy phase outruns by far: one whose workers sustain
    # under 70 % of the step's rate there. On a busy host the light phase's probing can choose many workers
    # (its loop waited on the host, not the loader); such a fit is run again, at most three times.
    for attempt in range(3):
        said: list[str] = []
        logger = TensorBoardLogger(str(tmp_path), name="run", version=attempt)
        seen, guard, clock = _fit(options, logger=logger, said=said)
        first = clock.first_decision  # the light phase's decision, which the heavy phase outran
        if first is not None and 1.3 * first.num_workers * HEAVY_CEILING < 0.7 / STEP_S:
            break
    assert seen == untuned  # every epoch's samples and order, re-tune included
    decision = guard.decision
    assert decision is not None
    assert decision.retunes >= 1, decision.table()
    # docs/tuning.md: "The console says why once", per re-tune: one warning each, none repeated (one more where a
    # re-tune was still probing when the fit ended).
    assert guard._tuner is not None
    under_way = guard._tuner._session._previous is not None
    why = [message for message in said if "auto-tuning probes again:" in message]
    assert len(why) == decision.retunes + under_way, (why, decision.table())
    assert "could win back grew" in decision.retuned, decision.retuned
    # Said where the user looks: the dashboard's re-tune line steps up, the table says why.
    run = next(r for r in read_runs(tmp_path) if Path(r.path).name == f"version_{attempt}")
    retunes = run.scalars["loadguard/retunes"].values
    assert retunes[0] == 0 and retunes[-1] == decision.retunes
    _, table = run.texts["loadguard/auto_tune/text_summary"]
    assert "probed again (re-tune" in table
    assert decision.original.num_workers == 1  # the user's settings, which a resume checks the loader against
    assert first is not None and first.retunes == 0
    assert decision.num_workers > first.num_workers, (first.table(), decision.table())
    # README: it probes again "from the running setting": the last re-tune's first row is the setting decided before
    # it (the first decision's, or on a busy host an earlier re-tune's).
    before = clock.by_retunes[decision.retunes - 1]
    running = decision.candidates[0].setting
    assert (running.num_workers, running.prefetch_factor) == (before.num_workers, before.prefetch_factor), (
        before.table(),
        decision.table(),
    )
    # The test's own clock: the fit's last steps against the most the first decision's workers sustain in the
    # heavy phase, by the costs (a sleep overruns, never underruns).
    ceiling = first.num_workers * HEAVY_CEILING
    assert 1.3 * ceiling < 0.7 / STEP_S, ("every run's first decision had many workers", first.table())
    assert clock.rate_of_last(30) > 1.3 * ceiling, (clock.rate_of_last(30), first.table(), decision.table())


@pytest.mark.slow
def test_retune_false_decides_once() -> None:
    # Fifty steps of the heavy phase: three logging windows after the warm-up, where the re-tuning fit probes again.
    options = TuneOptions(warmup_steps=2, window_steps=6, tune_persistent_workers=False, retune=False)
    seen, guard, _ = _fit(options, epochs=2, max_steps=LENGTH // BATCH + 50)
    decision = guard.decision
    assert decision is not None
    assert decision.retunes == 0 and decision.retuned == ""
    assert "probed again" not in decision.table()
    assert len(seen) == LENGTH + 50 * BATCH


class OtherWorkFrom(pl.Callback):
    """Other work on the host, as the decision's watch reads it: none until epoch ``epoch`` starts, then
    ``OTHER_CORES`` on full cores. Keeps each window the watch read, with its CPU reading."""

    def __init__(self, epoch: int) -> None:
        self.epoch, self.busy = epoch, False
        self.windows: list[Any] = []

    def on_train_epoch_start(self, trainer: Any, pl_module: Any) -> None:
        self.busy = self.busy or trainer.current_epoch >= self.epoch

    def cores_of(self, window: Any) -> CoresUse:
        self.windows.append(window)
        return CoresUse(OTHER_CORES, 1.0) if self.busy else CoresUse(0.0, 0.5)


OTHER_CORES = 8.0


@pytest.mark.slow
@pytest.mark.parametrize("on", [True, False])
def test_other_work_taking_the_cores_is_probed_again_where_retune_on_other_work_is_on(
    monkeypatch: pytest.MonkeyPatch, on: bool
) -> None:
    # Only the cores other work used change, so that the test's own load does not decide: what the CPU meter reads
    # on this host is replaced by a scripted host, and the watch's data side is held still (the data phase stays
    # light, but a busy host makes the loop wait, a data-side change that re-tunes whatever this option says; the
    # heavier-phase test above checks that side).
    other = OtherWorkFrom(epoch=1)
    monkeypatch.setattr(watch_module.CoresUse, "of", classmethod(lambda cls, window: other.cores_of(window)))
    monkeypatch.setattr(watch_module.DecisionWatch, "_data_side_changed", lambda self, window: False)
    options = TuneOptions(warmup_steps=2, window_steps=6, tune_persistent_workers=False, retune_on_other_work=on)
    pl.seed_everything(5, verbose=False)
    untuned, _, _ = _fit(False, heavy_from=-1, step_s=0.0, epochs=3)
    said: list[str] = []
    seen, guard, _ = _fit(options, heavy_from=-1, epochs=3, said=said, extra=[other])
    assert seen == untuned  # every epoch's samples and order, re-tune included
    decision = guard.decision
    assert decision is not None
    # The watch read windows that carry the CPU meter's reading of their own span.
    read = [w for w in other.windows if w.cpu is not None]
    assert read, "the watch read no window with a CPU reading"
    if not on:
        assert decision.retunes == 0, decision.table()
        return
    assert decision.retunes >= 1, decision.table()
    assert "other work on the host went from 0.0 to 8.0 cores over 3 windows" in decision.retuned, decision.retuned
    assert "could win back grew" not in decision.retuned, decision.retuned
    assert any("other work on the host went from" in message for message in said), said


class PhasedData(ResumableLoaderMixin, pl.LightningDataModule):
    """The phased dataset behind the resume mixin, shuffled from ``loader_seed``."""

    def __init__(self, dataset: PhasedDataset) -> None:
        super().__init__()
        self.dataset = dataset
        self.loader_seed = 7

    def train_dataloader(self) -> DataLoader:
        return DataLoader(self.dataset, batch_size=BATCH, shuffle=True, num_workers=1)


class HeavyOnResume(HeavyFrom):
    """Also heavy from the first step of a fit resumed inside or after ``epoch`` (Lightning does not start an
    epoch it resumes in the middle of); stops the fit with a checkpoint after global step ``stop``, with ``stop=0``
    on the first step whose decision is a re-tune's (right after it switched the loader), or with
    ``stop=EPOCH_AFTER`` 60 steps into the epoch after that step's."""

    def __init__(self, dataset: PhasedDataset, epoch: int, guard: LoadGuard, stop: int | None, ckpt: Path) -> None:
        super().__init__(dataset, epoch, guard)
        self.stop, self.ckpt = stop, ckpt
        self.decision_at_stop: Any = None
        self.retuned_in: int | None = None  # the epoch the first re-tuned decision was seen in

    def on_train_start(self, trainer: Any, pl_module: Any) -> None:
        if trainer.current_epoch >= self.epoch >= 0:
            self.dataset.heavy.value = 1

    def on_train_batch_end(self, trainer: Any, *args: Any) -> None:
        super().on_train_batch_end(trainer, *args)
        decision = self.guard.decision
        retunes = decision.retunes if decision is not None else 0
        if retunes and self.retuned_in is None:
            self.retuned_in = trainer.current_epoch
        an_epoch_after = (
            self.stop == EPOCH_AFTER
            and self.retuned_in is not None
            and trainer.current_epoch == self.retuned_in + 1
            and trainer.global_step % (LENGTH // BATCH) == 60
        )
        if (
            self.stop is not None
            and not trainer.should_stop
            and (trainer.global_step == self.stop or (self.stop == 0 and retunes) or an_epoch_after)
        ):
            self.decision_at_stop = decision
            trainer.save_checkpoint(self.ckpt)
            trainer.should_stop = True


EPOCH_AFTER = -1


def _resumable_fit(
    ckpt: Path,
    tune: bool | TuneOptions,
    heavy_from: int,
    stop: int | None = None,
    resume: bool = False,
    epochs: int = 4,
) -> tuple[list[int], HeavyOnResume]:
    pl.seed_everything(5, verbose=False)
    dataset = PhasedDataset()
    guard = LoadGuard(print_summary=False, auto_tune=tune, log_every_n_steps=10)
    clock = HeavyOnResume(dataset, heavy_from, guard, stop, ckpt)
    module = TimedModule(step_s=STEP_S if tune else 0.0)
    trainer = quiet_trainer(max_epochs=epochs, callbacks=[guard, clock])  # four by default: as in _fit
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer.fit(module, datamodule=PhasedData(dataset), ckpt_path=str(ckpt) if resume else None)
    return module.seen, clock


@pytest.mark.parametrize(
    "stop",
    [
        pytest.param(0, id="right-after-the-re-tune-switched", marks=pytest.mark.slow),
        # A re-tune that starts at an epoch's start may span two epochs and decide in the second: a fifth epoch
        # leaves room for the one after it.
        pytest.param(EPOCH_AFTER, id="mid-way-through-the-next-epoch", marks=pytest.mark.slow),
    ],
)
def test_a_fit_stopped_after_a_re_tune_resumes_with_no_sample_skipped_or_repeated(tmp_path: Path, stop: int) -> None:
    ckpt = tmp_path / "retuned.ckpt"
    epochs = 5 if stop == EPOCH_AFTER else 4
    untuned, _ = _resumable_fit(ckpt, False, heavy_from=-1, epochs=epochs)
    first, clock = _resumable_fit(ckpt, OPTIONS, heavy_from=1, stop=stop, epochs=epochs)
    assert clock.decision_at_stop.retunes >= 1  # not vacuous: the fit was stopped with a re-tuned decision,
    assert len(first) % LENGTH, len(first)  # inside an epoch
    rest, _ = _resumable_fit(ckpt, OPTIONS, heavy_from=1, resume=True, epochs=epochs)
    assert first + rest == untuned


@pytest.mark.slow  # 20 s, three fits (one heavy at one worker); a fresh fit's re-tune is in the default run
def test_a_fit_resumed_onto_a_heavier_data_phase_probes_the_stored_decision_again(tmp_path: Path) -> None:
    # The first fit decides on the light phase and stops mid-way through epoch 1; the resumed one runs heavy from
    # its first step, as after a move to a slower host. It watches the stored decision against what the decision
    # measured, probes again, and keeps every sample once in the untuned order.
    # Where the host's load makes the watch's 6-step windows noisier than the change (docs/tuning.md, Limits), the
    # pair of fits is run again, once; the order holds in every run.
    ckpt = tmp_path / "light.ckpt"
    untuned, _ = _resumable_fit(ckpt, False, heavy_from=-1)
    for attempt in range(2):
        first, clock = _resumable_fit(ckpt, OPTIONS, heavy_from=-1, stop=LENGTH // BATCH + 30)
        stored = clock.decision_at_stop
        assert stored is not None and len(first) == LENGTH + 30 * BATCH
        rest, resumed = _resumable_fit(ckpt, OPTIONS, heavy_from=1, resume=True)
        assert first + rest == untuned
        decision = resumed.guard.decision
        if decision.retunes > stored.retunes or attempt:
            break
    assert decision.retunes > stored.retunes, (stored.table(), decision.table())
    assert decision.num_workers > stored.num_workers, (stored.table(), decision.table())
    assert decision.original.num_workers == 1  # the user's settings, for the next resume


def test_a_watch_that_fails_stops_watching_says_so_once_and_training_goes_on(monkeypatch: pytest.MonkeyPatch) -> None:
    from lightning_loadguard.tuning.watch import DecisionWatch

    def fails(self: DecisionWatch, window: Any) -> None:
        raise RuntimeError("no window today")

    monkeypatch.setattr(DecisionWatch, "record", fails)
    said_first = "auto-tuning stops watching its decision: reading a window failed"
    with pytest.warns(LoadGuardWarning, match=said_first) as said:
        seen, guard, _ = _fit(OPTIONS, epochs=2, max_steps=LENGTH // BATCH + 50)
    assert sum("stops watching" in str(w.message) for w in said) == 1
    assert guard.decision is not None and guard.decision.retunes == 0
    assert len(seen) == LENGTH + 50 * BATCH


@pytest.mark.slow
def test_loaders_rebuilt_while_probing_spans_epochs_stop_it_and_give_back_the_users_settings() -> None:
    # 40-step epochs and windows of 14 steps: probing spans epochs, and reload_dataloaders_every_n_epochs=1 builds
    # the loaders again (here the same loader object, as when one is passed to fit) with a probe still running.
    options = TuneOptions(warmup_steps=2, window_steps=12, probe_share=0.5, tune_persistent_workers=False)
    untuned, _, _ = _fit(False, heavy_from=-1, step_s=0.0, length=160, reload=1)
    with pytest.warns(LoadGuardWarning, match="the loop built new train loaders while it probed") as said:
        seen, guard, clock = _fit(options, heavy_from=0, length=160, reload=1)
    assert sum("auto-tuning" in str(w.message) for w in said) == 1, [str(w.message) for w in said]
    assert seen == untuned
    assert guard.decision is None
    loader = clock.trainer_loader
    assert (loader.num_workers, loader.prefetch_factor) == (1, 2)  # the user's, not the probe's


@pytest.mark.slow
def test_a_loader_rebuilt_each_epoch_is_watched_again_and_probed_again() -> None:
    untuned, _, _ = _fit(False, heavy_from=-1, step_s=0.0, epochs=4, reload=1)
    seen, guard, _ = _fit(OPTIONS, heavy_from=1, epochs=4, reload=1)
    assert seen == untuned
    assert guard.decision is not None and guard.decision.retunes >= 1, guard.decision


# -- re-tunes on scripted windows: which batches each setting made, from the batches themselves ------------------

SCRIPTED_LENGTH = 1200  # 300 steps an epoch: at 40 %, its rest after the first decision holds a re-tune's windows
SCRIPTED_OPTIONS = TuneOptions(
    warmup_steps=2, window_steps=8, max_workers=8, tune_persistent_workers=False, probe_share=0.4
)


class MadeUnder(Dataset):
    """Samples carrying the ``num_workers`` and ``prefetch_factor`` of the iterator whose worker made them (0 and 0:
    the training process), read in the worker from the loader as it was when that iterator forked it; once
    ``failing`` is set (shared memory, seen by live workers), a worker under any count but ``kept`` raises."""

    def __init__(self, length: int = SCRIPTED_LENGTH) -> None:
        self.length = length
        self.loader: DataLoader | None = None
        context = multiprocessing.get_context("fork")
        self.failing, self.kept = context.Value("b", 0), context.Value("i", -1)

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        info = get_worker_info()
        workers = info.num_workers if info is not None else 0
        if self.failing.value and workers != self.kept.value:
            raise RuntimeError(f"simulated: a worker failed under num_workers={workers}")
        prefetch = self.loader.prefetch_factor if info is not None and self.loader is not None else 0
        x = torch.zeros(16)
        x[0], x[1] = float(workers), float(prefetch or 0)
        return torch.tensor(index), x


class Phases(pl.Callback):
    """Tells the scripted windows the data got heavier on the step the first decision appears; records, per step
    trained, the (num_workers, prefetch_factor) that made its batch (the batches' own record), the step the
    console said a re-tune began and the step its decision appeared; with ``fail_after_retune``, makes every
    count but the first decision's fail from the step after the re-tune's decision."""

    def __init__(self, guard: LoadGuard, script: HeavierWhenTold, dataset: MadeUnder, fail_after_retune: bool) -> None:
        self.guard, self.script, self.dataset, self.fail_after_retune = guard, script, dataset, fail_after_retune
        self.made: list[tuple[int, int]] = []
        self.first: Any = None
        self.first_at: int | None = None  # steps trained when the first decision appeared
        self.began_at: int | None = None  # steps trained when the console said the re-tune began
        self.retuned: Any = None
        self.retuned_at: int | None = None

    def on_train_batch_start(self, trainer: Any, pl_module: Any, batch: Any, batch_idx: int) -> None:
        made = {(int(w), int(p)) for w, p in batch[1][:, :2].tolist()}
        assert len(made) == 1, made
        self.made.append(made.pop())

    def on_train_batch_end(self, trainer: Any, *args: Any) -> None:
        decision, steps = self.guard.decision, len(self.made)
        if decision is not None and self.first is None:
            self.first, self.first_at = decision, steps
            self.script.heavy = True
            self.dataset.kept.value = decision.num_workers
        if self.began_at is None and any("auto-tuning probes again" in said for said in self.guard._said):
            self.began_at = steps
        if decision is not None and decision.retunes and self.retuned is None:
            self.retuned, self.retuned_at = decision, steps
            if self.fail_after_retune:
                self.dataset.failing.value = 1


def _scripted_retune(
    monkeypatch: pytest.MonkeyPatch, *, fail_after_retune: bool = False, epochs: int = 1, length: int = SCRIPTED_LENGTH
) -> tuple[list[int], LoadGuard, Phases, Any]:
    """A fit of :class:`MadeUnder` (4 per batch, one worker, shuffled) whose scripted data phase gets heavier when
    the first decision appears: the watch finds it three logging windows later and the tuner probes again."""
    script = HeavierWhenTold(monkeypatch)
    pl.seed_everything(5, verbose=False)
    dataset = MadeUnder(length)
    loader = dataset.loader = DataLoader(dataset, batch_size=BATCH, shuffle=True, num_workers=1)
    guard = LoadGuard(print_summary=False, auto_tune=SCRIPTED_OPTIONS, log_every_n_steps=10)
    phases = Phases(guard, script, dataset, fail_after_retune)
    module = TimedModule(step_s=0.0)
    trainer = quiet_trainer(max_epochs=epochs, callbacks=[guard, phases])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer.fit(module, loader)
    return module.seen, guard, phases, trainer


def _untuned_order(epochs: int = 1, length: int = SCRIPTED_LENGTH) -> list[int]:
    pl.seed_everything(5, verbose=False)
    dataset = MadeUnder(length)
    module = TimedModule(step_s=0.0)
    trainer = quiet_trainer(max_epochs=epochs)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer.fit(module, DataLoader(dataset, batch_size=BATCH, shuffle=True, num_workers=1))
    return module.seen


def _probed_again_by_the_batches(phases: Phases) -> list[tuple[int, int]]:
    """The settings that made the batches trained while the re-tune probed (from the step the console said it
    began to the step its decision appeared), by the batches' own record."""
    assert phases.began_at is not None and phases.retuned_at is not None
    return phases.made[phases.began_at : phases.retuned_at]


def test_a_re_tune_within_the_epoch_probes_a_share_of_the_steps_left_in_it(monkeypatch: pytest.MonkeyPatch) -> None:
    # docs/tuning.md, Re-tuning: "over the rest of the epoch where that holds five windows ... with the same
    # probe share". The test's own count: the steps the epoch had left when the console said the re-tune began.
    seen, guard, phases, _ = _scripted_retune(monkeypatch)
    assert seen == _untuned_order()
    decision = phases.retuned
    assert decision is not None and phases.began_at is not None, guard.decision and guard.decision.table()
    epoch_steps = SCRIPTED_LENGTH // BATCH
    left = epoch_steps - phases.began_at
    assert decision.probe_budget_steps == int(SCRIPTED_OPTIONS.probe_share * left), (left, decision.table())
    # Five windows fit in that budget: the case where the re-tune stays in the epoch.
    assert decision.probe_budget_steps >= 5 * (SCRIPTED_OPTIONS.warmup_steps + SCRIPTED_OPTIONS.window_steps)
    running = (phases.first.num_workers, phases.first.prefetch_factor)
    probed = [made for made in _probed_again_by_the_batches(phases) if made != running]
    assert 0 < len(probed) <= decision.probe_budget_steps, (len(probed), decision.table())
    assert decision.probe_steps <= decision.probe_budget_steps
    assert phases.retuned_at < epoch_steps  # decided within the epoch it began in


def test_the_re_tuned_setting_failing_later_goes_back_to_the_setting_before_the_re_tune(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # docs/tuning.md, Faults: in a re-tune, a chosen setting that fails later in its epoch goes back to the setting
    # probing started from (the first decision's), not the user's, and the decision names it.
    seen, guard, phases, trainer = _scripted_retune(monkeypatch, fail_after_retune=True)
    assert seen == _untuned_order()  # no sample lost or repeated across the failure
    first, retuned, decision = phases.first, phases.retuned, guard.decision
    assert first is not None and retuned is not None and decision is not None
    assert retuned.num_workers != first.num_workers != decision.original.num_workers, retuned.table()
    assert phases.dataset.failing.value == 1 and phases.retuned_at is not None
    after = phases.made[phases.retuned_at :]
    assert after and after[-1] == (first.num_workers, first.prefetch_factor), after
    assert (retuned.num_workers, retuned.prefetch_factor) in after, after  # the chosen setting ran before failing
    assert decision.setting.same_loader(first.setting) and decision.verdict == "no_gain", decision.table()
    assert decision.reason.endswith(f"{first.setting.label} is back"), decision.reason
    assert "your settings are back" not in decision.reason
    assert trainer.train_dataloader.num_workers == first.num_workers


def test_a_re_tune_whose_step_fails_keeps_and_stores_the_earlier_decision(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    # docs/troubleshooting.md: after a failed re-tune the message names the earlier decision's setting, which is
    # kept (the loader goes back to it from the same batch) and stored in the checkpoint.
    from lightning_loadguard.tuning.planner import Planner

    record = Planner.record
    calls: list[int] = []

    def fails_in_the_re_tune(self: Planner, *args: Any, **kwargs: Any) -> Any:
        if self.original.num_workers != 1:  # the re-tune's planner starts from the first decision, not yours
            calls.append(1)
            if len(calls) == 2:  # after its first candidate's window: the loader runs that candidate
                raise RuntimeError("broken")
        return record(self, *args, **kwargs)

    monkeypatch.setattr(Planner, "record", fails_in_the_re_tune)
    seen, guard, phases, trainer = _scripted_retune(monkeypatch)
    assert seen == _untuned_order()
    first = phases.first
    assert first is not None and first.num_workers != 1 and len(calls) == 2, first and first.table()
    said = [line for line in guard._said if "auto-tuning stopped" in line]
    assert said == [
        f"auto-tuning stopped: planning the next probe failed (RuntimeError: broken). {first.setting.label} is kept; "
        "training is not affected."
    ], said
    assert guard.decision == first
    began = phases.began_at
    assert began is not None
    candidate = [m for m in phases.made[began:] if m != (first.num_workers, first.prefetch_factor)]
    assert candidate, phases.made[began:]  # the failure came while a candidate ran
    assert phases.made[-1] == (first.num_workers, first.prefetch_factor)
    assert trainer.train_dataloader.num_workers == first.num_workers
    path = tmp_path / "after.ckpt"
    trainer.save_checkpoint(path)
    state = torch.load(path, weights_only=False)["callbacks"]
    stored = next(v for k, v in state.items() if k.startswith("LoadGuard"))["tuner"]["decision"]
    assert stored == first.to_dict()
