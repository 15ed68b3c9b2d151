"""docs/loaders.md's known limit of Hugging Face streaming with a shuffle buffer, against the test's own clocks.

"each worker's iterator stalls 5.0 s once an epoch, with or without Lightning; LoadGuard shows it as data wait",
for the datasets release the sentence names. The stall is the release's own (a fixed sleep when the stream's
reading threads shut down, datasets' ``config.SLEEP_TIME_ON_THREADS_SHUTDOWN``): the truth here is when the batches
reached the loop and when each worker made them, never what LoadGuard computed.
"""

from __future__ import annotations

import importlib.metadata
import re
import time
import warnings
from itertools import pairwise
from pathlib import Path
from typing import Any

import pytest
from lightning.pytorch.loggers import Logger
from loader_libraries import FEATURES, build_loader, installed
from pipelines import ClockedModule, LoopClock, quiet_trainer

from lightning_loadguard import LoadGuard
from lightning_loadguard._lightning import pl

DOC = Path(__file__).parents[1] / "docs" / "loaders.md"
STALL_S = 5.0
# The loop takes the batches already queued while the workers sleep: it sees a little less than the sleep.
STALL_SEEN = (STALL_S - 0.5, STALL_S + 1.0)
STALLED = 1.0  # a gap longer than this is a stall: an ordinary batch takes milliseconds here
SAMPLES, BATCH, WORKERS, EPOCHS = 160, 4, 2, 2
STEPS = SAMPLES // BATCH


def _named_release() -> str:
    line = next(line for line in DOC.read_text().splitlines() if "HF streaming with a shuffle buffer" in line)
    found = re.search(r"datasets (\d+\.\d+\.\d+)", line)
    assert found, line
    return found.group(1)


def _needs_the_named_release() -> pytest.MarkDecorator:
    if not installed("hf_stream"):
        return pytest.mark.skip(reason="datasets is not installed")
    named, here = _named_release(), importlib.metadata.version("datasets")
    # The stall is one release's behaviour: against another, the sentence is not what is tested.
    return pytest.mark.skipif(here != named, reason=f"docs/loaders.md names datasets {named}; {here} is installed")


needs_the_named_release = _needs_the_named_release()


class Figures(Logger):
    """Every set of LoadGuard's figures logged, by step: one a window."""

    name, version = "figures", "0"

    def __init__(self) -> None:
        super().__init__()
        self.logged: list[tuple[int | None, dict[str, float]]] = []

    def log_metrics(self, metrics: dict[str, float], step: int | None = None) -> None:
        if "loadguard/data_wait_ms" in metrics:
            self.logged.append((step, dict(metrics)))

    def log_hyperparams(self, *args: object, **kwargs: object) -> None:
        pass


def _shuffled_stream(root: Path) -> Any:
    return build_loader("hf_stream", root, n=SAMPLES, batch_size=BATCH, shuffle=True, num_workers=WORKERS)


@pytest.mark.slow
@needs_the_named_release
def test_hf_stream_shuffle_buffer_stalls_once_an_epoch_and_loadguard_shows_it_as_data_wait(tmp_path: Path) -> None:
    pl.seed_everything(0, verbose=False)
    # A window of one epoch: the first logged window is epoch 0, the closing one the last epoch.
    guard = LoadGuard(window=STEPS, print_summary=False)
    clock, figures = LoopClock(), Figures()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # LoadGuard's advice on the draining buffer the stall causes
        trainer = quiet_trainer(max_epochs=EPOCHS, callbacks=[guard, clock], logger=figures)
        trainer.fit(ClockedModule(step_s=0.004, features=FEATURES), _shuffled_stream(tmp_path))
    assert len(clock.starts) == EPOCHS * STEPS

    stalls: list[tuple[int, float, float]] = []  # each epoch's stalled step, the gap before it, the usual gap
    for epoch in range(EPOCHS):
        starts = clock.starts[epoch * STEPS : (epoch + 1) * STEPS]
        gaps = [later - earlier for earlier, later in pairwise(starts)]
        stalled = [i for i, gap in enumerate(gaps) if gap > STALLED]
        assert len(stalled) == 1, [round(gap, 3) for gap in gaps]
        gap = gaps[stalled[0]]
        assert STALL_SEEN[0] <= gap <= STALL_SEEN[1], gap
        stalls.append((stalled[0] + 1, gap, max(g for i, g in enumerate(gaps) if i != stalled[0])))

    # The last epoch step by step: LoadGuard's wait on the step the stall delayed is the stall, less at most an
    # ordinary step's period; every other step of the epoch after its first (whose fetch waits for the new
    # workers, before the epoch's first batch start) waits no longer than an ordinary period.
    step, gap, usual = stalls[-1]
    assert guard.snapshot is not None and len(guard.snapshot.wait_s) == STEPS
    waits = guard.snapshot.wait_s
    assert gap - usual <= waits[step] <= gap, (waits[step], gap, usual)
    assert max(w for i, w in enumerate(waits) if i not in (0, step)) <= usual

    # Each epoch's figures as published (the first window logged, the closing one): the stall is in the wait.
    assert figures.logged, "no figures logged"
    for metrics, (_, gap, usual) in zip([figures.logged[0][1], guard.metrics], stalls, strict=True):
        assert metrics["loadguard/data_wait_ms"] / 1e3 * STEPS >= gap - usual, metrics["loadguard/data_wait_ms"]


@pytest.mark.slow
@needs_the_named_release
def test_without_lightning_each_worker_of_a_shuffled_hf_stream_stalls_once_an_epoch(tmp_path: Path) -> None:
    loader = _shuffled_stream(tmp_path)
    received: list[float] = []
    made: list[tuple[float, float]] = []  # per batch: its first sample started, the batch collated
    for batch in loader:
        received.append(time.perf_counter())
        made.append((float(batch[2][:, 0].min()), float(batch[3])))
    assert len(received) == STEPS
    gaps = [later - earlier for earlier, later in pairwise(received)]
    stalled = [gap for gap in gaps if gap > STALLED]
    assert len(stalled) == 1 and STALL_SEEN[0] <= stalled[0] <= STALL_SEEN[1], [round(g, 3) for g in gaps]

    # torch deals an iterable's batches to its workers in turn: worker w makes batches w, w + WORKERS, ... and is
    # sent the index of its next batch when the loop takes the one it made before the current one (two batches a
    # worker in flight). From the later of the batch's end and that moment, the worker had work: the time until
    # it started the next batch is its own (a lower bound: the loop takes a batch after its index is sent).
    for worker in range(WORKERS):
        own = list(range(worker, STEPS, WORKERS))
        pauses = [
            made[later][0] - max(made[earlier][1], received[earlier - WORKERS] if earlier >= WORKERS else 0.0)
            for earlier, later in pairwise(own)
        ]
        long = [pause for pause in pauses if pause > STALLED]
        assert len(long) == 1 and STALL_S - 0.1 <= long[0] <= STALL_SEEN[1], (worker, [round(p, 3) for p in pauses])
