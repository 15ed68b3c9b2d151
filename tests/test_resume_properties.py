"""Property: for any loader layout, loop setting and crash points, the trained samples are the uninterrupted run's.

Each example fits a tiny real Trainer (about 0.1 s a fit) without interruption, then again with crashes: at
each crash point the run saves a checkpoint and dies with an exception, and the next fit resumes from that
checkpoint. The indices every ``training_step`` saw, concatenated over the fits, must equal the
uninterrupted run's, sample by sample.
"""

from __future__ import annotations

import math
import warnings
from pathlib import Path
from typing import Any

import pytest
import torch
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from resume_harness import Data, Indexed, Recorder
from resume_shapes import quiet_trainer
from torch.utils.data import DataLoader

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")


class _Crash(RuntimeError):
    pass


class ValData(Data):
    def val_dataloader(self) -> DataLoader:
        return DataLoader(Indexed(2), batch_size=2)


class Crasher(Recorder):
    """Trains like ``Recorder``; once the whole run trained ``crash_at`` batches, saves a checkpoint at the next
    ``where`` (``batch_end`` or ``validation_end``) and raises."""

    def __init__(self, case: dict[str, Any], done_before: int, crash_at: int | None, where: str, path: str) -> None:
        super().__init__(case)
        self.batches = done_before
        self.crash_at = crash_at
        self.where = where
        self.path = path

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        self.batches += 1
        return super().training_step(batch, batch_idx)

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        pass

    def _crash_here(self, where: str) -> None:
        if where == self.where and self.crash_at is not None and self.batches >= self.crash_at:
            self.trainer.save_checkpoint(self.path)
            raise _Crash

    def on_train_batch_end(self, outputs: Any, batch: Any, batch_idx: int) -> None:
        self._crash_here("batch_end")

    def on_validation_end(self) -> None:
        self._crash_here("validation_end")


def _fit(case: dict[str, Any], loop: dict[str, Any], model: Recorder, ckpt: str | None) -> None:
    trainer = quiet_trainer(**loop)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer.fit(model, datamodule=ValData(case), ckpt_path=ckpt)


def _check(
    n: int,
    batch_size: int,
    drop_last: bool,
    limit: int | None,
    accumulate: int,
    val_every: float | int | None,
    epochs: int,
    crashes: list[tuple[int, str | float]],
    where: str,
    tmp: Path,
    several: bool = False,
) -> tuple[int, int]:
    """Train with the crashes, resume after each, and compare every sample trained with an uninterrupted run's;
    returns the crashes that happened and those planned (a crash point after which no validation ran leaves the
    run to finish)."""
    per_epoch = n // batch_size if drop_last else math.ceil(n / batch_size)
    assume(per_epoch >= 1)
    if limit is not None:
        per_epoch = min(per_epoch, limit)
    if isinstance(val_every, int):
        val_every = min(val_every, per_epoch)
    total = per_epoch * epochs
    assume(total >= 2)
    # A crash is (epoch, "last") on that epoch's last batch, or (epoch, f) after a fraction f of it.
    points = sorted(
        {
            max(
                1,
                min(total - 1, min(e, epochs - 1) * per_epoch + (per_epoch if at == "last" else round(at * per_epoch))),
            )
            for e, at in crashes
        }
    )
    case = {"n": n, "batch_size": batch_size, "drop_last": drop_last, "seed": 11}
    if several:  # a dict of two loaders, the second one half as long and cycled by Lightning
        case["sampler"] = "dict"
    loop = {
        "max_epochs": epochs,
        "limit_train_batches": limit if limit is not None else 1.0,
        "accumulate_grad_batches": accumulate,
        "val_check_interval": val_every if val_every is not None else 1.0,
    }
    full = Recorder(case)
    _fit(case, loop, full, None)
    assert len(full.seen) > 0
    seen: list[int] = []
    done = happened = 0
    ckpt: str | None = None
    for i, point in enumerate([*points, None]):
        path = str(tmp / f"crash{i}.ckpt")
        model = Crasher(case, done_before=done, crash_at=point, where=where, path=path)
        crashed = False
        try:
            _fit(case, loop, model, ckpt)
        except _Crash:
            ckpt, crashed = path, True
            happened += 1
        seen += model.seen
        done = model.batches
        if not crashed:  # no validation came after the crash point: the run finished
            break
    assert seen == full.seen
    return happened, len(points)


LAYOUT = {
    "n": st.integers(3, 23),
    "batch_size": st.integers(1, 5),
    "drop_last": st.booleans(),
    "limit": st.one_of(st.none(), st.integers(1, 6)),
    "accumulate": st.integers(1, 3),
    "val_every": st.one_of(st.none(), st.just(0.5), st.integers(1, 4)),
    "epochs": st.integers(1, 3),
    "crashes": st.lists(
        st.tuples(st.integers(0, 2), st.one_of(st.just("last"), st.floats(0.0, 1.0))), min_size=1, max_size=3
    ),
    "where": st.sampled_from(["batch_end", "validation_end"]),
    "several": st.booleans(),
}


# Sequences that went wrong when the position was read from Lightning's epoch counters, each run as written: every
# crash it plans must happen (a generated case may plan one after the last validation, and then finishes).
_CASE: dict[str, Any] = {
    "n": 20,
    "batch_size": 4,
    "drop_last": False,
    "limit": None,
    "accumulate": 1,
    "val_every": None,
    "where": "batch_end",
    "several": False,
}
EXAMPLES = {
    # A crash on an epoch's last batch, then one mid-epoch.
    "last_then_mid": {"epochs": 3, "crashes": [(0, "last"), (1, 0.5)]},
    "accumulated_validated_twice": {
        "accumulate": 2,
        "val_every": 0.5,
        "epochs": 3,
        "crashes": [(0, "last"), (1, "last"), (2, 0.4)],
    },
    # At the validation that follows an epoch's last batch (every 3rd batch of 6).
    "validation_after_the_last_batch": {
        "n": 6,
        "batch_size": 1,
        "val_every": 3,
        "epochs": 2,
        "crashes": [(0, "last")],
        "where": "validation_end",
    },
    "limited_dropping_validated": {
        "n": 17,
        "batch_size": 3,
        "drop_last": True,
        "limit": 4,
        "val_every": 2,
        "epochs": 3,
        "crashes": [(0, "last"), (1, 0.5)],
        "where": "validation_end",
    },
    "several_loaders": {"epochs": 2, "crashes": [(0, 0.6), (0, "last"), (1, 0.4)], "several": True},
}


@pytest.mark.parametrize("name", sorted(EXAMPLES))
def test_the_sequences_that_went_wrong_resume_exactly(tmp_path: Path, name: str) -> None:
    happened, planned = _check(**{**_CASE, **EXAMPLES[name]}, tmp=tmp_path)
    assert happened == planned, (happened, planned)


@settings(
    max_examples=8, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture]
)
@given(**LAYOUT)
def test_crashes_anywhere_resume_exactly(tmp_path: Path, **params: Any) -> None:
    _check(**params, tmp=tmp_path)


@pytest.mark.slow
@settings(
    max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture]
)
@given(**LAYOUT)
def test_crashes_anywhere_resume_exactly_many(tmp_path: Path, **params: Any) -> None:
    _check(**params, tmp=tmp_path)
