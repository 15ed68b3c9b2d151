"""LoadGuard never changes or breaks the training run: unusual loaders, copies, failures and random streams."""

from __future__ import annotations

import copy
import io
import multiprocessing
import pickle
import warnings
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import torch
from pipelines import quiet_trainer
from torch.utils.data import DataLoader, Dataset

from lightning_loadguard import LoadGuardWarning
from lightning_loadguard._lightning import FetchTimingProfiler, pl
from lightning_loadguard.callback import LoadGuard
from lightning_loadguard.synthetic import TimedDataset, TimedModule
from lightning_loadguard.tuning.session import TuneOptions

FAST = TuneOptions(warmup_steps=2, window_steps=6, tune_persistent_workers=False)


def train(
    make_loader: Callable[[], Any],
    guard: LoadGuard | None,
    *,
    epochs: int = 2,
    module: TimedModule | None = None,
    callbacks: list[Any] | None = None,
    said: list[str] | None = None,
) -> tuple[list[int], Any]:
    """The sample indices that reach ``training_step``, in order, and the trainer; ``said`` collects every
    LoadGuard warning the fit emitted, repeats included."""
    pl.seed_everything(5, verbose=False)
    module = module or TimedModule()
    trainer = quiet_trainer(max_epochs=epochs, callbacks=[*(callbacks or []), *([guard] if guard else [])])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("ignore")
        warnings.simplefilter("always", LoadGuardWarning)
        trainer.fit(module, make_loader())
    if said is not None:
        said.extend(str(w.message) for w in caught if issubclass(w.category, LoadGuardWarning))
    return module.seen, trainer


# -- a loader class with its own __iter__ ----------------------------------------------------------------


class Halved(DataLoader):
    """A common pattern: post-process every batch in a generator ``__iter__``."""

    def __iter__(self) -> Iterator[Any]:
        for index, features in super().__iter__():
            yield index, features * 0.5


class Mapped(DataLoader):
    def __iter__(self) -> Iterator[Any]:
        return map(lambda batch: (batch[0], batch[1] * 0.5), super().__iter__())


class Listed(DataLoader):
    def __iter__(self) -> Iterator[Any]:
        return iter(list(super().__iter__()))


def loader_of(cls: type[DataLoader], workers: int = 0, length: int = 48, **kwargs: Any) -> Callable[[], DataLoader]:
    return lambda: cls(
        TimedDataset(length), batch_size=4, shuffle=True, num_workers=workers, persistent_workers=workers > 0, **kwargs
    )


@pytest.mark.parametrize(
    ("cls", "workers"), [(Halved, 0), (Mapped, 0), (Listed, 0), (Halved, 2)], ids=["generator", "map", "list", "gen-2w"]
)
def test_a_loader_class_with_its_own_iter_trains_as_without_loadguard(cls: type[DataLoader], workers: int) -> None:
    make = loader_of(cls, workers)
    untouched, _ = train(make, None)
    guard = LoadGuard(print_summary=False)
    seen, trainer = train(make, guard)
    assert seen == untouched and len(seen) == 2 * 48
    assert type(trainer.train_dataloader) is cls
    # What iter() cannot show is said once; what the loader's iterator shows is still measured.
    assert any("epoch start-up is not measured" in note for note in guard._said)
    assert guard._monitor.total_batches_made >= 2 * 12
    assert guard.metrics["loadguard/wait_fraction"] >= 0


def test_a_loader_class_with_its_own_iter_trains_as_without_loadguard_under_auto_tune() -> None:
    make = loader_of(Halved, 0, length=160)
    untouched, _ = train(make, None, epochs=3)
    seen, _ = train(make, LoadGuard(print_summary=False, auto_tune=FAST), epochs=3)
    assert seen == untouched


# -- copies and pickles during fit -----------------------------------------------------------------------


class Copies(pl.Callback):
    """Copies and pickles what a user might, at the start of fit and mid-epoch; keeps each result or error."""

    def __init__(self) -> None:
        self.results: dict[str, Any] = {}

    def _try(self, name: str, action: Callable[[], Any]) -> None:
        try:
            self.results[name] = action()
        except Exception as err:  # each failure is reported by the test, all at once
            self.results[name] = err

    def on_fit_start(self, trainer: Any, pl_module: Any) -> None:
        self._try("deepcopy(callbacks)", lambda: copy.deepcopy(trainer.callbacks))
        self._try("torch.save(trainer)", lambda: _saved(trainer))

    def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        if trainer.global_step == 3:
            loader = trainer.train_dataloader
            self._try("pickle(loader)", lambda: pickle.loads(pickle.dumps(loader)))
            self._try("deepcopy(loader)", lambda: copy.deepcopy(loader))
            self._try("pickle(callbacks)", lambda: pickle.loads(pickle.dumps(trainer.callbacks)))


def _saved(trainer: Any) -> Any:
    buffer = io.BytesIO()
    torch.save(trainer, buffer)
    return torch.load(io.BytesIO(buffer.getvalue()), weights_only=False)


@pytest.mark.parametrize("tune", [False, True], ids=["plain", "auto_tune"])
def test_the_trainer_callbacks_and_loader_can_be_copied_and_pickled_during_fit(tune: bool) -> None:
    copies = Copies()
    make = loader_of(DataLoader, 0)
    guard = LoadGuard(print_summary=False, auto_tune=FAST if tune else False)
    seen, _ = train(make, guard, callbacks=[copies])
    assert len(seen) == 2 * 48
    failed = {name: repr(result)[:200] for name, result in copies.results.items() if isinstance(result, Exception)}
    assert not failed
    copied_guard = copies.results["deepcopy(callbacks)"][-1]
    assert isinstance(copied_guard, LoadGuard) and copied_guard is not guard
    assert copied_guard._trainer is None  # a copy of the callbacks is not a copy of the trainer
    # The trainer as it stood, profiler proxy included.
    assert isinstance(copies.results["torch.save(trainer)"].profiler, FetchTimingProfiler)
    for name in ("pickle(loader)", "deepcopy(loader)"):
        loader = copies.results[name]
        # The user's own class, without LoadGuard's attachments, yielding the same batches.
        assert type(loader) is DataLoader
        assert not [key for key in loader.__dict__ if key.startswith("_loadguard")]
        assert len(list(loader)) == 12
    assert isinstance(copies.results["pickle(callbacks)"][-1], LoadGuard)


# -- a fit that raises -----------------------------------------------------------------------------------


class Crashes(TimedModule):
    def training_step(self, batch: Any, batch_idx: int) -> Any:
        if self.current_epoch == 0 and batch_idx == 5:
            raise ValueError("the user's own error")
        return super().training_step(batch, batch_idx)


@pytest.mark.parametrize("tune", [False, True], ids=["plain", "auto_tune"])
def test_a_fit_that_raises_gets_every_change_undone(tune: bool) -> None:
    loader = loader_of(DataLoader, 0)()
    guard = LoadGuard(print_summary=False, auto_tune=FAST if tune else False)
    trainer = quiet_trainer(max_epochs=1, callbacks=[guard])
    user_profiler = trainer.profiler
    sampler_slot = loader.__dict__["batch_sampler"]
    with pytest.raises(ValueError, match="the user's own error"), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer.fit(Crashes(), loader)
    assert type(loader) is DataLoader
    assert trainer.profiler is user_profiler
    assert "_load_combined_loader_states" not in trainer.fit_loop.__dict__
    assert loader.__dict__["batch_sampler"] is sampler_slot
    assert not [key for key in loader.__dict__ if key.startswith("_loadguard")]
    pickle.dumps(loader)


# -- the order of every epoch under auto-tuning ----------------------------------------------------------


class Augmented(Dataset):
    """Draws its augmentation from torch's global random stream, as many datasets do."""

    def __init__(self, length: int, sample_s: float = 0.0) -> None:
        self.inner = TimedDataset(length, sample_s=sample_s)

    def __len__(self) -> int:
        return len(self.inner)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        sample, features = self.inner[index]
        return sample, features + torch.rand(1)


class RecordsDraws(TimedModule):
    """Also records the augmentation each sample got (what a user can observe of the random stream)."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.features: list[list[float]] = []

    def training_step(self, batch: Any, batch_idx: int) -> Any:
        self.features.append(batch[1][:, 0].tolist())
        return super().training_step(batch, batch_idx)


def test_keep_random_draws_keeps_every_epochs_order_and_in_process_draws_of_an_augmenting_dataset() -> None:
    def make() -> DataLoader:
        return DataLoader(Augmented(240, sample_s=0.002), batch_size=4, shuffle=True)

    plain = RecordsDraws(step_s=0.002)
    untuned, _ = train(make, None, epochs=3, module=plain)
    tuned_module = RecordsDraws(step_s=0.002)
    guard = LoadGuard(print_summary=False, auto_tune=TuneOptions(keep_random_draws=True))
    said: list[str] = []
    tuned, trainer = train(make, guard, epochs=3, module=tuned_module, said=said)
    assert tuned == untuned
    assert tuned_module.features == plain.features
    assert trainer.train_dataloader.num_workers == 0
    assert guard.decision is not None and guard.decision.verdict == "model_only", guard.decision
    assert sum("keep_random_draws=True" in message for message in said) == 1, said


def test_persistent_workers_chosen_by_the_tuner_keep_every_epochs_order() -> None:
    def make() -> DataLoader:
        # I/O-bound: one worker makes a batch in 24 ms against a 4 ms step; three make it 3x as fast, a margin
        # no busy host's noise hides, so the tuner switches workers (and keeps them across epochs).
        return DataLoader(TimedDataset(96, sample_s=0.006), batch_size=4, shuffle=True, num_workers=1)

    # The default TuneOptions, but for an epoch short enough for a test. At most three workers: an 8-step
    # window that starts eight on a loaded 2-core host measures their start, not their rate.
    options = TuneOptions(warmup_steps=2, window_steps=4, probe_share=0.6, persistent_min_share=0.0, max_workers=3)
    assert options.tune_persistent_workers
    untuned, _ = train(make, None, epochs=4, module=TimedModule(step_s=0.004))
    guard = LoadGuard(print_summary=False, auto_tune=options)
    tuned, trainer = train(make, guard, epochs=4, module=TimedModule(step_s=0.004))
    assert guard.decision is not None and guard.decision.persistent_workers
    assert trainer.train_dataloader.persistent_workers
    for epoch in range(4):
        assert tuned[epoch * 96 : (epoch + 1) * 96] == untuned[epoch * 96 : (epoch + 1) * 96], epoch


def test_default_auto_tune_keeps_every_epochs_order() -> None:
    def make() -> DataLoader:
        return DataLoader(TimedDataset(480, sample_s=0.003), batch_size=4, shuffle=True, num_workers=1)

    untuned, _ = train(make, None, epochs=3, module=TimedModule(step_s=0.004))
    guard = LoadGuard(print_summary=False, auto_tune=True)
    tuned, _ = train(make, guard, epochs=3, module=TimedModule(step_s=0.004))
    assert guard.decision is not None and len(guard.decision.candidates) >= 2  # it switched settings mid-epoch
    for epoch in range(3):
        assert tuned[epoch * 480 : (epoch + 1) * 480] == untuned[epoch * 480 : (epoch + 1) * 480], epoch


# -- LoadGuard's own failures stay LoadGuard's; the user's stay the user's --------------------------------


def test_a_failure_on_the_fetch_path_never_reaches_training(monkeypatch: pytest.MonkeyPatch) -> None:
    from lightning_loadguard.meters import consumer, producer

    def broken(*args: Any) -> None:
        raise StopIteration  # would silently end the epoch if it escaped

    monkeypatch.setattr(consumer.ConsumerMeter, "fetch_started", broken)
    monkeypatch.setattr(consumer.ConsumerMeter, "fetch_observed", broken)
    monkeypatch.setattr(producer.ProducerCounters, "record", broken)
    make = loader_of(DataLoader, 0)
    untouched, _ = train(make, None)
    guard = LoadGuard(print_summary=False)
    seen, _ = train(make, guard)
    assert seen == untouched and len(seen) == 2 * 48
    assert any("timing the training loop's fetch failed" in note for note in guard._said)


def test_a_clock_that_stops_never_ends_an_epoch(monkeypatch: pytest.MonkeyPatch) -> None:
    """A mocked clock that runs out (as in tests that mock ``time.perf_counter`` with a short list of values)
    raises StopIteration inside LoadGuard's hooks; Lightning's epoch loop would take it for the data's end."""
    import time
    import types

    from lightning_loadguard import _lightning, callback
    from lightning_loadguard.meters import loader_probe

    make = loader_of(DataLoader, 0)
    untouched, _ = train(make, None)
    ticks = iter(range(40))
    stopping = types.SimpleNamespace(
        perf_counter=lambda: float(next(ticks)), thread_time=time.thread_time, monotonic=time.monotonic
    )
    for module in (callback, _lightning, loader_probe):
        monkeypatch.setattr(module, "time", stopping, raising=False)
    seen, _ = train(make, LoadGuard(print_summary=False))
    assert seen == untouched and len(seen) == 2 * 48


def test_a_failure_in_the_worker_side_timing_never_reaches_training(monkeypatch: pytest.MonkeyPatch) -> None:
    from lightning_loadguard.meters import producer

    monkeypatch.setattr(producer, "_queued_seconds", lambda: 1 / 0)
    make = loader_of(DataLoader, 2)
    untouched, _ = train(make, None)
    seen, _ = train(make, LoadGuard(print_summary=False))
    assert seen == untouched


class EndsEarly(Dataset):
    """The user's own loader errors pass through LoadGuard unchanged."""

    def __len__(self) -> int:
        return 16

    def __getitem__(self, index: int) -> Any:
        if index == 9:
            raise KeyError("the user's missing sample")
        return torch.tensor(index), torch.zeros(16)


@pytest.mark.parametrize("workers", [0, 2])
def test_the_users_loader_errors_pass_through_unchanged(workers: int) -> None:
    loader = DataLoader(EndsEarly(), batch_size=2, num_workers=workers)
    trainer = quiet_trainer(max_epochs=1, callbacks=[LoadGuard(print_summary=False)])
    with pytest.raises(KeyError, match="the user's missing sample"), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer.fit(TimedModule(), loader)


class FailsFromEpochOne(Dataset):
    """Sample 9 raises from the epoch :attr:`failing` is set in (shared memory: workers see it too)."""

    def __init__(self) -> None:
        self.failing = multiprocessing.get_context("fork").Value("b", 0)

    def __len__(self) -> int:
        return 192

    def __getitem__(self, index: int) -> Any:
        if self.failing.value and index == 9:
            raise KeyError("the user's missing sample")
        return torch.tensor(index), torch.zeros(16)


class FailFromEpochOne(pl.Callback):
    def __init__(self, dataset: FailsFromEpochOne) -> None:
        self.dataset = dataset

    def on_train_epoch_start(self, trainer: Any, pl_module: Any) -> None:
        self.dataset.failing.value = int(trainer.current_epoch >= 1)


@pytest.mark.usefixtures("scripted")
def test_a_loader_error_after_the_decision_passes_through_unchanged() -> None:
    # Decided in epoch 0 (loading moved into workers); from epoch 1 Lightning makes the iterators, and the user's
    # error reaches them as torch raises it.
    dataset = FailsFromEpochOne()
    guard = LoadGuard(print_summary=False, auto_tune=FAST)
    trainer = quiet_trainer(max_epochs=2, callbacks=[guard, FailFromEpochOne(dataset)])
    with pytest.raises(KeyError, match="the user's missing sample"), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer.fit(TimedModule(), DataLoader(dataset, batch_size=4, shuffle=True))
    assert guard.decision is not None and guard.decision.num_workers > 0
    assert trainer.current_epoch == 1


class StepTakesTheIterator(TimedModule):
    def training_step(self, dataloader_iter: Iterator[Any]) -> torch.Tensor:  # type: ignore[override]
        batch, batch_idx, _ = next(dataloader_iter)
        return super().training_step(batch, batch_idx)


def test_a_step_that_takes_the_loader_iterator_is_not_tuned_and_says_why() -> None:
    # The iterator the tuner would replace is the step's own: tuning stops before any switch, said once.
    module = StepTakesTheIterator()
    guard = LoadGuard(print_summary=False, auto_tune=FAST)
    seen, _ = train(
        lambda: DataLoader(TimedDataset(800, sample_s=0.0005), batch_size=4), guard, epochs=1, module=module
    )
    assert guard.decision is None
    assert [n for n in guard._said if "dataloader_iter" in n] == [
        "auto-tuning stopped: training_step takes the loader iterator itself (dataloader_iter), so it cannot be "
        "swapped. Your settings are kept; training is not affected."
    ]
    assert seen == list(range(800))


class StrictLogger(pl.loggers.CSVLogger):
    """A user's logger whose own check fails on LoadGuard's metrics (or any unexpected metric)."""

    def log_metrics(self, metrics: dict[str, float], step: int | None = None) -> None:
        assert all(not key.startswith("loadguard/") for key in metrics), "unexpected metric"
        super().log_metrics(metrics, step)


def test_a_loggers_own_failure_reaches_the_user(tmp_path: Any) -> None:
    trainer = quiet_trainer(
        max_epochs=1, logger=StrictLogger(tmp_path), log_every_n_steps=2, callbacks=[LoadGuard(print_summary=False)]
    )
    with pytest.raises(AssertionError, match="unexpected metric"), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer.fit(TimedModule(), loader_of(DataLoader, 0)())


class _OwnProfiler(pl.profilers.SimpleProfiler):
    """A user's profiler subclass."""


@pytest.mark.parametrize(
    ("profiler", "kinds"),
    [
        (None, (pl.profilers.PassThroughProfiler, pl.profilers.Profiler)),
        (_OwnProfiler(), (_OwnProfiler, pl.profilers.SimpleProfiler, pl.profilers.Profiler)),
    ],
)
def test_the_users_callbacks_see_their_own_profiler_during_fit(profiler: Any, kinds: tuple[type, ...]) -> None:
    seen: list[tuple[bool, ...]] = []

    class Checks(pl.Callback):
        def on_train_batch_end(self, trainer: Any, *args: Any) -> None:
            seen.append(tuple(isinstance(trainer.profiler, kind) for kind in kinds))

    guard = LoadGuard(print_summary=False)
    trainer = quiet_trainer(max_steps=6, callbacks=[Checks(), guard], profiler=profiler)
    trainer.fit(TimedModule(record=False), DataLoader(TimedDataset(24), batch_size=4))
    assert len(seen) == 6 and all(all(row) for row in seen), seen
    # LoadGuard was timing the fetches through its wrapper meanwhile.
    assert guard.metrics["loadguard/data_wait_ms"] > 0
