"""Which data training sees under auto-tuning, for datasets that draw random numbers while loading.

The contract (docs/tuning.md, "Which data training sees"): epoch 0 holds the untuned samples in the untuned
order; every later epoch holds every sample exactly once; later epochs keep the untuned order wherever it does
not depend on random draws the dataset made in the main process; draws in workers are seeded as torch seeds
them; ``TuneOptions(keep_random_draws=True)`` keeps every draw bit-identical by loading in the main process.

The tuner's windows are scripted here (a setting's rate is a function of its workers), so that every run makes
the same probes and decision: what is tested is which data reaches ``training_step``, not the measurement.
"""

from __future__ import annotations

import random
import time
import warnings
from collections.abc import Callable
from typing import Any

import pytest
import torch
from pipelines import quiet_trainer
from scripted_tuning import moved_to_workers, order_notes
from torch.utils.data import DataLoader, Dataset, DistributedSampler

from lightning_loadguard import LoadGuardWarning, ResumableLoaderMixin
from lightning_loadguard._lightning import pl
from lightning_loadguard.callback import LoadGuard
from lightning_loadguard.position.switch import RandomDrawWatch, order_streams
from lightning_loadguard.synthetic import TimedModule
from lightning_loadguard.tuning.session import TuneOptions

LENGTH = 192
BATCH = 4
OPTIONS = TuneOptions(warmup_steps=2, window_steps=6, tune_persistent_workers=False)


class Augmenting(Dataset):
    """Sleeps like I/O, then augments with draws from the main process's global streams named in ``streams``."""

    def __init__(self, length: int = LENGTH, streams: tuple[str, ...] = ("torch", "random")) -> None:
        self.length = length
        self.streams = streams

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        time.sleep(0.0005)
        drawn = [0.0, 0.0]
        if "torch" in self.streams:
            drawn[0] = float(torch.rand(()))
        if "random" in self.streams:
            drawn[1] = random.random()
        return torch.tensor(index), torch.tensor(drawn)


class Records(TimedModule):
    """Records the indices (``seen``) and each sample's augmentation draws (``drawn``) that reach the step."""

    def __init__(self) -> None:
        super().__init__(features=2)
        self.drawn: list[tuple[float, float]] = []

    def training_step(self, batch: Any, batch_idx: int) -> Any:
        self.drawn.extend((float(a), float(b)) for a, b in batch[1].tolist())
        return super().training_step(batch, batch_idx)


def run(
    make: Callable[[], Any],
    tune: TuneOptions | None,
    *,
    epochs: int = 3,
    seed: int = 5,
    workers_seeded: bool = False,
    said: list[str] | None = None,
) -> tuple[Records, LoadGuard | None, Any]:
    """A fit of ``make()``'s loader; ``said`` collects every LoadGuard warning it emitted, repeats included."""
    pl.seed_everything(seed, workers=workers_seeded, verbose=False)
    guard = LoadGuard(print_summary=False, auto_tune=tune) if tune is not None else None
    module = Records()
    trainer = quiet_trainer(max_epochs=epochs, callbacks=[guard] if guard else [])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("ignore")
        warnings.simplefilter("always", LoadGuardWarning)
        trainer.fit(module, make())
    if said is not None:
        said.extend(str(w.message) for w in caught if issubclass(w.category, LoadGuardWarning))
    return module, guard, trainer


def epochs_of(seen: list[int], length: int = LENGTH) -> list[list[int]]:
    return [seen[e : e + length] for e in range(0, len(seen), length)]


def shuffled(streams: tuple[str, ...] = ("torch", "random"), **kwargs: Any) -> Callable[[], DataLoader]:
    return lambda: DataLoader(Augmenting(streams=streams), batch_size=BATCH, shuffle=True, **kwargs)


# -- the order's own sources -------------------------------------------------------------------------------


def test_order_streams_names_where_each_loaders_order_is_drawn() -> None:
    data = Augmenting(8)
    assert order_streams(DataLoader(data, shuffle=True)) == {"torch"}
    assert order_streams(DataLoader(data, shuffle=True, generator=torch.Generator())) == set()
    assert order_streams(DataLoader(data)) == set()
    assert order_streams(DataLoader(data, sampler=DistributedSampler(data, num_replicas=1, rank=0))) == set()

    class OwnSampler(torch.utils.data.Sampler[int]):
        def __iter__(self) -> Any:
            return iter(random.sample(range(8), 8))

        def __len__(self) -> int:
            return 8

    assert order_streams(DataLoader(data, sampler=OwnSampler())) is None  # a kind not known: any stream


def test_the_watch_names_the_streams_the_fetches_drew_from() -> None:
    for streams in [("torch",), ("random",), ("torch", "random"), ()]:
        iterator = iter(DataLoader(Augmenting(8, streams=streams), batch_size=2))
        watch = RandomDrawWatch.install(iterator)
        assert watch is not None
        next(iterator)
        assert watch.streams == set(streams) and watch.drew == bool(streams)


# -- the contract, in a fit --------------------------------------------------------------------------------


@pytest.mark.usefixtures("scripted")
def test_a_shuffled_augmenting_loader_is_tuned_epoch_0_untuned_later_epochs_whole_said_once() -> None:
    untuned, _, _ = run(shuffled(), None)
    tuned, guard, trainer = run(shuffled(), OPTIONS)
    assert moved_to_workers(guard) and trainer.train_dataloader.num_workers > 0
    first, *later = epochs_of(tuned.seen)
    assert first == epochs_of(untuned.seen)[0]
    for epoch in later:
        assert sorted(epoch) == list(range(LENGTH))
    # The order of later epochs was drawn from the stream the in-process draws advanced: it differs, as said.
    assert epochs_of(tuned.seen)[1] != epochs_of(untuned.seen)[1]
    assert guard is not None and len(order_notes(guard)) == 1


@pytest.mark.usefixtures("scripted")
@pytest.mark.parametrize(
    "make",
    [
        pytest.param(
            lambda: DataLoader(
                Augmenting(), batch_size=BATCH, shuffle=True, generator=torch.Generator().manual_seed(3)
            ),
            id="loader_generator",
        ),
        pytest.param(
            lambda: DataLoader(
                Augmenting(), batch_size=BATCH, sampler=DistributedSampler(Augmenting(), 1, 0, shuffle=True, seed=3)
            ),
            id="distributed_sampler",
        ),
        pytest.param(shuffled(streams=("random",)), id="draws_only_from_python_random"),
    ],
)
def test_where_the_order_has_its_own_source_every_epoch_is_untuned(make: Callable[[], DataLoader]) -> None:
    untuned, _, _ = run(make, None)
    tuned, guard, _ = run(make, OPTIONS)
    assert moved_to_workers(guard)
    assert tuned.seen == untuned.seen
    assert guard is not None and not order_notes(guard)


class Resumable(ResumableLoaderMixin, pl.LightningDataModule):
    loader_seed = 3

    def train_dataloader(self) -> DataLoader:
        return DataLoader(Augmenting(), batch_size=BATCH, shuffle=True)


@pytest.mark.usefixtures("scripted")
def test_with_the_resume_mixin_every_epoch_is_untuned() -> None:
    def fit(tune: TuneOptions | None) -> tuple[Records, LoadGuard | None]:
        pl.seed_everything(5, verbose=False)
        guard = LoadGuard(print_summary=False, auto_tune=tune) if tune is not None else None
        module = Records()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            quiet_trainer(max_epochs=3, callbacks=[guard] if guard else []).fit(module, datamodule=Resumable())
        return module, guard

    untuned, _ = fit(None)
    tuned, guard = fit(OPTIONS)
    assert moved_to_workers(guard)
    assert tuned.seen == untuned.seen and len(tuned.seen) == 3 * LENGTH


@pytest.mark.usefixtures("scripted")
def test_a_loader_that_already_had_workers_keeps_every_epochs_order() -> None:
    make = shuffled(num_workers=1)
    untuned, _, _ = run(make, None)
    tuned, guard, trainer = run(make, OPTIONS)
    assert guard is not None and guard.decision is not None and trainer.train_dataloader.num_workers > 1
    assert tuned.seen == untuned.seen
    assert not order_notes(guard)


@pytest.mark.usefixtures("scripted")
def test_worker_draws_are_seeded_as_torch_seeds_them_so_seeded_runs_repeat() -> None:
    # seed_everything(..., workers=True): two runs that make the same decision see the same data, draws included.
    first, guard, _ = run(shuffled(), OPTIONS, seed=7, workers_seeded=True)
    again, guard_again, _ = run(shuffled(), OPTIONS, seed=7, workers_seeded=True)
    assert moved_to_workers(guard) and guard_again is not None
    decisions = [g.decision for g in (guard, guard_again)]
    assert all(d is not None for d in decisions)
    assert len({(d.setting, tuple(c.setting for c in d.candidates)) for d in decisions if d is not None}) == 1
    assert first.seen == again.seen and first.drawn == again.drawn
    other, _, _ = run(shuffled(), OPTIONS, seed=8, workers_seeded=True)
    assert other.drawn != first.drawn


@pytest.mark.usefixtures("scripted")
def test_after_tuning_worker_draws_are_torchs_own_at_the_chosen_num_workers() -> None:
    # docs/tuning.md: draws made in workers "are seeded as torch seeds them". Truth: torch's own seeding, in untuned
    # runs. Your loader has a worker, so every draw is made in workers (torch and Python random, reseeded by torch
    # from the iterator's base seed plus the worker's id). Epoch 0 runs your 1 worker up to the first probe, as the
    # untuned run at 1 does; epoch 1, at the chosen count, holds what an untuned run at that count gets, draws
    # included.
    tuned, guard, trainer = run(shuffled(num_workers=1), OPTIONS, epochs=2)
    assert guard is not None and guard.decision is not None
    chosen = guard.decision.num_workers
    assert chosen > 1 and trainer.train_dataloader.num_workers == chosen, guard.decision.table()
    at_chosen, _, _ = run(shuffled(num_workers=chosen), None, epochs=2)
    at_yours, _, _ = run(shuffled(num_workers=1), None, epochs=2)
    first_window = OPTIONS.warmup_steps * BATCH  # the steps before any probe could switch, at your 1 worker
    assert tuned.drawn[:first_window] == at_yours.drawn[:first_window]
    assert tuned.seen[:LENGTH] == at_yours.seen[:LENGTH]
    assert tuned.seen[LENGTH:] == at_chosen.seen[LENGTH:]
    assert tuned.drawn[LENGTH:] == at_chosen.drawn[LENGTH:]
    # Not vacuous: the draws depend on the worker count (which worker, seeded how, made each sample).
    assert at_chosen.drawn[LENGTH:] != at_yours.drawn[LENGTH:]


@pytest.mark.usefixtures("scripted")
def test_keep_random_draws_keeps_loading_in_the_main_process_and_every_draw() -> None:
    untuned, _, _ = run(shuffled(), None)
    said: list[str] = []
    options = TuneOptions(warmup_steps=2, window_steps=6, keep_random_draws=True)
    tuned, guard, trainer = run(shuffled(), options, said=said)
    assert guard is not None and guard.decision is not None and not moved_to_workers(guard)
    assert guard.decision.verdict == "model_only", guard.decision.table()
    assert trainer.train_dataloader.num_workers == 0
    assert tuned.seen == untuned.seen and tuned.drawn == untuned.drawn
    # docs/tuning.md: "said once", over the fit's three epochs (every warning counted, repeats included).
    assert sum("keep_random_draws=True" in message for message in said) == 1, said
