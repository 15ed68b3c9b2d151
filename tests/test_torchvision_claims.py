"""docs/loaders.md on torchvision's random augmentations drawn inside workers, checked in a fit.

"inside workers they follow torch's worker seeding, as with any change of ``num_workers``": a loader that already
has workers, tuned, trains on the untuned samples in the untuned order; its augmentations are the untuned run's
until the first switch, an untuned run's at the chosen worker count in every later epoch, and in between what
torch's worker seeding gives: each worker of each iterator seeded with its own seed (recorded inside the worker),
the iterator's batches dealt to its workers in turn, each worker augmenting its batches in the order it got them.
That last truth is replayed in the test's process by calling the same dataset under those seeds.
"""

from __future__ import annotations

import os
import time
import warnings
from pathlib import Path
from typing import Any

import pytest
import torch
from loader_libraries import build_loader
from pipelines import quiet_trainer
from test_loader_libraries import AUGMENTED, SCRIPTED, AugmentationRecorder, _epochs, _library
from torch.utils.data import get_worker_info

from lightning_loadguard import LoadGuard, TuneOptions
from lightning_loadguard._lightning import pl
from lightning_loadguard.tuning import session

WORKERS = 1  # workers from the start: every draw of the untuned run is a worker's
BATCH = 4  # build_loader's batch size
EPOCHS = 3

Segment = tuple[int, int, list[int]]
"""One iterator's run inside an epoch: the epoch's batch it started at, its worker count, each worker's seed."""


class SeedLog:
    """``worker_init_fn`` that appends each worker's count, id and torch seed to a file, stamped.

    torch has seeded the worker's streams before it calls this, and writing draws nothing from them.
    """

    def __init__(self, path: Path) -> None:
        self.path = path

    def __call__(self, worker_id: int) -> None:
        info = get_worker_info()
        assert info is not None
        line = f"{time.perf_counter()!r} {info.num_workers} {info.id} {info.seed}\n".encode()
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT)
        try:
            os.write(fd, line)
        finally:
            os.close(fd)

    def iterators(self) -> list[tuple[int, list[int]]]:
        """Each worker iterator's count and seeds, in the order they started.

        Iterators never overlap (the tuner shuts one down before it starts the next; Lightning makes a fresh one
        each epoch), so the stamps put each iterator's workers together.
        """
        rows = sorted(
            (float(stamp), int(count), int(worker), int(seed))  # a seed has 64 bits: never through a float
            for stamp, count, worker, seed in (line.split() for line in self.path.read_text().splitlines())
        )
        found: list[tuple[int, list[int]]] = []
        while rows:
            count = rows[0][1]
            group, rows = rows[:count], rows[count:]
            assert sorted(r[2] for r in group) == list(range(count)), group
            assert {r[1] for r in group} == {count}, group
            found.append((count, [r[3] for r in sorted(group, key=lambda r: r[2])]))
        return found


def _fit(
    library: str, files: Path, num_workers: int, tune: TuneOptions | None, log: Path, switches: list[tuple[int, int]]
) -> tuple[AugmentationRecorder, LoadGuard | None, list[list[Segment]], Any]:
    """A fit as ``test_loader_libraries._fit_augmented``'s, with workers; returns each epoch's worker iterators."""
    loader = build_loader(
        library, files / library, n=AUGMENTED, shuffle=True, num_workers=num_workers, worker_init_fn=SeedLog(log)
    )
    switches.clear()
    pl.seed_everything(5, verbose=False)
    guard = LoadGuard(print_summary=False, auto_tune=tune) if tune is not None else None
    module = AugmentationRecorder()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torchvision's notice that its decoders move to TorchCodec
        quiet_trainer(max_epochs=EPOCHS, callbacks=[guard] if guard else []).fit(module, loader)
    iterators = SeedLog(log).iterators()
    # Epoch 0 runs the user's iterator, then one per switch; each later epoch one fresh iterator.
    assert len(iterators) == 1 + len(switches) + EPOCHS - 1, (iterators, switches)
    starts = [0] + [consumed for consumed, _ in switches]
    assert [count for count, _ in iterators[1 : 1 + len(switches)]] == [count for _, count in switches]
    epoch_0 = [(start, count, seeds) for start, (count, seeds) in zip(starts, iterators, strict=False)]
    later = [[(0, count, seeds)] for count, seeds in iterators[1 + len(switches) :]]
    return module, guard, [epoch_0, *later], loader.dataset


def _worker_seeding(dataset: Any, order: list[int], segments: list[Segment]) -> list[tuple[float, ...]]:
    """The augmented features torch's worker seeding gives each sample of an epoch read in ``order``.

    An iterator with ``n`` workers deals its ``j``-th batch to worker ``j % n``, and a worker augments its batches
    in the order dealt, from the stream torch seeded it with; a switch's iterator starts at the switch's batch.
    """
    batches = [order[b : b + BATCH] for b in range(0, len(order), BATCH)]
    expected: list[tuple[float, ...] | None] = [None] * len(order)
    ends = [start for start, _, _ in segments[1:]] + [len(batches)]
    for (start, count, seeds), end in zip(segments, ends, strict=True):
        for worker, seed in enumerate(seeds):
            with torch.random.fork_rng():
                torch.manual_seed(seed)
                for batch in range(start + worker, end, count):
                    for place, index in enumerate(batches[batch]):
                        expected[batch * BATCH + place] = tuple(dataset[index]["features"].tolist())
    assert all(e is not None for e in expected)
    return expected  # type: ignore[return-value]


@pytest.fixture
def switches(monkeypatch: pytest.MonkeyPatch) -> list[tuple[int, int]]:
    """The tuner's restarts in the fit under way: the epoch's batch each starts at and its worker count."""
    made: list[tuple[int, int]] = []
    restart = session.restart_iterator

    def recorded(loader: Any, order: Any, consumed: int, **settings: Any) -> Any:
        made.append((consumed, settings["num_workers"]))
        return restart(loader, order, consumed, **settings)

    monkeypatch.setattr(session, "restart_iterator", recorded)
    return made


@pytest.mark.slow
@pytest.mark.usefixtures("scripted")
@pytest.mark.parametrize("library", [_library("torchvision")])
def test_augmentations_drawn_in_workers_follow_torchs_worker_seeding_when_the_tuner_changes_num_workers(
    library: str, tmp_path: Path, switches: list[tuple[int, int]]
) -> None:
    files = tmp_path / "files"
    untuned, _, untuned_iterators, dataset = _fit(library, files, WORKERS, None, tmp_path / "untuned", switches)
    tuned, guard, tuned_iterators, _ = _fit(library, files, WORKERS, SCRIPTED, tmp_path / "tuned", switches)
    assert guard is not None and guard.decision is not None
    chosen = guard.decision.setting.num_workers
    assert chosen != WORKERS and switches and all(count > 0 for _, count in switches), (chosen, switches)
    at_chosen, _, _, _ = _fit(library, files, chosen, None, tmp_path / "at_chosen", switches)

    # The samples and their order are the untuned run's, every epoch (the order is drawn in the main process).
    assert tuned.seen == untuned.seen == at_chosen.seen
    assert all(sorted(epoch) == list(range(AUGMENTED)) for epoch in _epochs(tuned.seen))
    orders, untuned_drawn, tuned_drawn = _epochs(tuned.seen), _epochs(untuned.augmented), _epochs(tuned.augmented)
    # The replay is torch's seeding: it gives every augmentation of the untuned run.
    for order, segments, drawn in zip(orders, untuned_iterators, untuned_drawn, strict=True):
        assert _worker_seeding(dataset, order, segments) == drawn
    # The same worker count and seed (the user's iterator, up to the first switch): the same augmentations.
    first_switch = tuned_iterators[0][1][0] * BATCH
    assert tuned_drawn[0][:first_switch] == untuned_drawn[0][:first_switch]
    # Every augmentation of the tuned run, the probes' included, is what torch's seeding of its workers gives.
    for order, segments, drawn in zip(orders, tuned_iterators, tuned_drawn, strict=True):
        assert _worker_seeding(dataset, order, segments) == drawn
    # After epoch 0 the draws are those of any run at the chosen count, and the count changed them.
    assert tuned_drawn[1:] == _epochs(at_chosen.augmented)[1:]
    assert all(t != u for t, u in zip(tuned_drawn[1:], untuned_drawn[1:], strict=True))
