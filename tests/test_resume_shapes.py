"""Property: over DataModule shapes and over every way a run ends, a resumed run is exact.

Shapes: the mixin first, an override returning ``super().train_dataloader()`` (one and two levels), an override
not calling super, the mixin listed after a base that defines ``train_dataloader`` or after
``LightningDataModule``, and ``LightningDataModule.from_datasets``. Run ends: a kill at any step (checkpoint
from ``trainer.save_checkpoint`` or Lightning's step ``ModelCheckpoint``), ``max_steps`` and ``max_epochs``
(resumed from ``trainer.save_checkpoint()`` after fit, the step checkpoint or Lightning's epoch-end
checkpoint), chained up to three times. See ``resume_shapes.py``.
"""

from __future__ import annotations

import math
import tempfile
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, assume, event, example, given, settings
from hypothesis import strategies as st
from resume_shapes import run_chain

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")

SHAPES = [
    "plain",
    "override_super",
    "override_super_twice",
    "override_no_super",
    "mixin_after_base",
    "mixin_after_lightning",
    "from_datasets",
]
ENDS = {
    "kill": ["save", "step"],
    "max_steps": ["after_fit", "step", "epoch_end"],
    "max_epochs": ["after_fit", "epoch_end"],
}


def _segments(per_epoch: int, final: tuple[str, int], stops: list[tuple[str, float, int]]) -> list[dict[str, Any]]:
    """Segments in global steps: the final one ends at ``final``; each stop is (end, fraction of the run, source)."""
    kind, value = final
    total = value if kind == "max_steps" else value * per_epoch
    segments: list[dict[str, Any]] = []
    last = 0
    for end, fraction, source in sorted(stops, key=lambda s: s[1]):
        step = max(1, min(total - 1, round(fraction * total)))
        at: int = step
        if end == "max_epochs":
            at = max(1, round(step / per_epoch))
            step = at * per_epoch
        if not last < step < total:
            continue
        options = ENDS[end]
        segments.append({"end": end, "at": at, "ckpt": options[source % len(options)]})
        last = step
    segments.append({"end": kind, "at": value})
    return segments


def _check(
    shape: str,
    loader: str,
    n: int,
    batch_size: int,
    validate: bool,
    lightning_checkpoints: bool,
    final: tuple[str, int],
    stops: list[tuple[str, float, int]],
    tmp: Path,
) -> None:
    if shape == "from_datasets":
        loader = "default"  # Lightning builds the loader
    case = {
        "n": n,
        "batch_size": batch_size,
        "seed": 7,
        "shape": shape,
        "sampler": loader,
        "validate": validate,
        "lightning_checkpoints": lightning_checkpoints,
    }
    per_epoch = math.ceil(n / batch_size)
    segments = _segments(per_epoch, final, stops)
    assume(len(segments) > 1)
    with tempfile.TemporaryDirectory(dir=tmp) as example_dir:
        result = run_chain(case, segments, Path(example_dir))
    assume("no_checkpoint_at" not in result)
    assert result["reference"], "the uninterrupted run trained nothing"
    # Every shape and every way a fit ends resumes exactly: a refusal here is a case the mixin gave up on.
    assert "refused" not in result, f"{segments}: {result.get('refused')!r}"
    assert result["seen"] == result["reference"], segments
    event(f"exact after {len(segments) - 1} resumes")


LAYOUT = {
    "shape": st.sampled_from(SHAPES),
    "loader": st.sampled_from(["default", "custom", "dict"]),
    "n": st.integers(4, 17),
    "batch_size": st.integers(1, 4),
    "validate": st.booleans(),
    "lightning_checkpoints": st.booleans(),
    "final": st.one_of(
        st.tuples(st.just("max_steps"), st.integers(3, 24)), st.tuples(st.just("max_epochs"), st.integers(1, 3))
    ),
    "stops": st.lists(
        st.tuples(st.sampled_from(sorted(ENDS)), st.floats(0.0, 1.0), st.integers(0, 2)), min_size=1, max_size=3
    ),
}


# Issue 28, case 1: an override returning super().train_dataloader(), killed mid-epoch 1, then mid-epoch 2.
HIERARCHY_KILLED_TWICE = {"shape": "override_super", "n": 20, "batch_size": 4, "final": ("max_epochs", 3)}
HIERARCHY_KILLED_TWICE["stops"] = [("kill", 0.45, 0), ("kill", 0.8, 0)]
# Issue 28, case 2: max_steps ends the fit inside epoch 1 (batch 6 of 14), Lightning's checkpoints in the run,
# trainer.save_checkpoint() after fit, then a larger max_steps.
AFTER_FIT = {"shape": "plain", "n": 27, "batch_size": 2, "lightning_checkpoints": True, "final": ("max_steps", 36)}
AFTER_FIT["stops"] = [("max_steps", 20 / 36, 0)]
FROM_DATASETS = {"shape": "from_datasets", "n": 10, "batch_size": 3, "validate": True, "final": ("max_epochs", 3)}
FROM_DATASETS["stops"] = [("kill", 0.5, 1), ("max_epochs", 0.7, 1)]
AFTER_LIGHTNING = {"shape": "mixin_after_lightning", "loader": "dict", "n": 9, "batch_size": 2}
AFTER_LIGHTNING.update(final=("max_steps", 12), stops=[("kill", 0.3, 0), ("max_steps", 0.6, 0)])
# Killed on epoch 0's last batch; the resumed process (whose epoch counters lag) ends by max_epochs and saves after
# fit; a larger max_steps continues from there.
LAST_BATCH_THEN_MAX_EPOCHS = {"shape": "plain", "n": 4, "batch_size": 1, "final": ("max_steps", 19)}
LAST_BATCH_THEN_MAX_EPOCHS["stops"] = [("kill", 0.236, 0), ("max_epochs", 0.94, 0)]
# A truncated epoch's epoch-end checkpoint, finished and killed on its last batch, then max_epochs with the epoch-end
# checkpoint (its batch totals one behind), then a larger max_steps.
CHAINED_EPOCH_ENDS = {"shape": "plain", "n": 7, "batch_size": 4, "final": ("max_steps", 6)}
CHAINED_EPOCH_ENDS["stops"] = [("max_steps", 0.0, 2), ("kill", 0.26, 0), ("max_epochs", 0.56, 1)]
# A max_steps stop on epoch 0's last batch (9 of 9), saved after fit by a process resumed from an after-fit
# checkpoint (whose trainer counted the cut epoch 0 as processed), then a larger max_steps.
MAX_STEPS_ON_THE_LAST_BATCH = {"shape": "plain", "n": 17, "batch_size": 2, "final": ("max_steps", 14)}
MAX_STEPS_ON_THE_LAST_BATCH["stops"] = [("max_steps", 0.0, 0), ("max_steps", 0.625, 0)]
# A max_steps stop mid-epoch 0, resumed from the cut epoch's epoch-end checkpoint by a fit with max_epochs alone.
TRUNCATED_THEN_MAX_EPOCHS = {"shape": "plain", "n": 9, "batch_size": 2, "final": ("max_epochs", 2)}
TRUNCATED_THEN_MAX_EPOCHS["stops"] = [("max_steps", 0.2, 2)]
DEFAULTS = {"loader": "default", "validate": False, "lightning_checkpoints": False}


@settings(
    max_examples=6, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture]
)
@given(**LAYOUT)
@example(**{**DEFAULTS, **HIERARCHY_KILLED_TWICE})
@example(**{**DEFAULTS, **AFTER_FIT})
@example(**{**DEFAULTS, **FROM_DATASETS})
@example(**{**DEFAULTS, **AFTER_LIGHTNING})
@example(**{**DEFAULTS, **LAST_BATCH_THEN_MAX_EPOCHS})
@example(**{**DEFAULTS, **CHAINED_EPOCH_ENDS})
@example(**{**DEFAULTS, **MAX_STEPS_ON_THE_LAST_BATCH})
@example(**{**DEFAULTS, **MAX_STEPS_ON_THE_LAST_BATCH, "final": ("max_epochs", 3)})
@example(**{**DEFAULTS, **TRUNCATED_THEN_MAX_EPOCHS})
def test_every_shape_and_run_end_resumes_exactly(tmp_path: Path, **params: Any) -> None:
    _check(**params, tmp=tmp_path)


@pytest.mark.slow
@settings(
    max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture]
)
@given(**LAYOUT)
def test_every_shape_and_run_end_resumes_exactly_many(tmp_path: Path, **params: Any) -> None:
    _check(**params, tmp=tmp_path)
