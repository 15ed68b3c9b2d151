"""Trainer-level exact resume: the indices every training step saw, interrupted + resumed vs uninterrupted."""

from __future__ import annotations

import copy
import warnings
from pathlib import Path
from typing import Any

import pytest
import torch
from resume_harness import Data, run
from torch.utils.data import DataLoader

from lightning_loadguard.datamodule import STATE_KEY
from lightning_loadguard.position import PositionMismatchError

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")


def _resume(case: dict[str, Any], tmp_path: Path, stop_kind: str, stop_at: int) -> tuple[list[int], list[int]]:
    """(uninterrupted run's indices, interrupted run's + resumed run's indices)."""
    full, _, _ = run(case)
    ckpt = str(tmp_path / "stop.ckpt")
    before, _, _ = run(dict(case, stop_kind=stop_kind, stop_at=stop_at), ckpt_out=ckpt)
    if stop_kind == "mcp":
        ckpt = str(tmp_path / f"mcp-step={stop_at}.ckpt")
    after, _, _ = run(case, ckpt_in=ckpt)
    return full.seen, before.seen + after.seen


# n=20, batch 4: 5 batches an epoch, 2 epochs. Stops: before any step, mid epoch 0, on epoch 0's last batch,
# at epoch 0's end, mid epoch 1.
STOPS = [("start", 0), ("step", 2), ("step", 5), ("epoch_end", 0), ("step", 8)]


@pytest.mark.parametrize("stop_kind,stop_at", STOPS, ids=[f"{k}{v}" for k, v in STOPS])
@pytest.mark.parametrize(
    "sampler,shuffle",
    [("default", True), ("default", False), ("custom", True), ("distributed", True), ("batch_sampler", True)],
)
def test_resume_is_exact(sampler: str, shuffle: bool, stop_kind: str, stop_at: int, tmp_path: Path) -> None:
    case = {"n": 20, "batch_size": 4, "epochs": 2, "seed": 7, "sampler": sampler, "shuffle": shuffle}
    full, resumed = _resume(case, tmp_path, stop_kind, stop_at)
    assert resumed == full
    assert sorted(full[:20]) == sorted(full[20:]) == list(range(20))
    if shuffle:
        assert full[:20] != full[20:], "each epoch must have its own order"


def test_the_comparison_catches_a_plain_loader(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Without the mixin's loader the same comparison fails: the check above is not vacuous.
    monkeypatch.setattr(Data, "_loadguard_adapt", lambda self, loader: loader)
    case = {"n": 40, "batch_size": 4, "epochs": 2, "seed": 7}
    full, resumed = _resume(case, tmp_path, "step", 13)
    assert resumed != full


@pytest.mark.parametrize("persistent", [False, True])
def test_resume_with_workers(persistent: bool, tmp_path: Path) -> None:
    case = {"n": 24, "batch_size": 4, "epochs": 2, "seed": 1, "workers": 2, "persistent": persistent}
    full, resumed = _resume(case, tmp_path, "step", 8)
    assert resumed == full


@pytest.mark.parametrize("workers_before,workers_after", [(0, 2), (2, 0)])
def test_resume_with_another_num_workers(workers_before: int, workers_after: int, tmp_path: Path) -> None:
    case = {"n": 24, "batch_size": 4, "epochs": 2, "seed": 1}
    full, _, _ = run(case)
    ckpt = str(tmp_path / "w.ckpt")
    before, _, _ = run(dict(case, workers=workers_before, stop_kind="step", stop_at=4), ckpt_out=ckpt)
    after, _, _ = run(dict(case, workers=workers_after), ckpt_in=ckpt)
    assert before.seen + after.seen == full.seen


def test_resume_with_other_worker_settings(tmp_path: Path) -> None:
    # docs/resume.md: num_workers, prefetch_factor, persistent_workers and pin_memory may differ between the
    # saving and the resuming run. Saved with 2 workers, prefetch 2, fresh each epoch, pin_memory; resumed with
    # 3, prefetch 4, persistent, no pin_memory (on a CPU-only host torch warns and does not pin: the loader
    # argument still differs, which is what the position must not depend on).
    case = {"n": 24, "batch_size": 4, "epochs": 2, "seed": 1}
    full, _, _ = run(case)
    ckpt = str(tmp_path / "s.ckpt")
    saved = dict(case, workers=2, prefetch=2, pin_memory=True, stop_kind="step", stop_at=4)
    before, data, _ = run(saved, ckpt_out=ckpt)
    assert data.trainer.train_dataloader.pin_memory
    after, _, _ = run(dict(case, workers=3, prefetch=4, persistent=True), ckpt_in=ckpt)
    assert before.seen + after.seen == full.seen


@pytest.mark.parametrize("drop_last", [False, True])
@pytest.mark.parametrize("stop_at", [3, 10, 12])
def test_odd_dataset_sizes(drop_last: bool, stop_at: int, tmp_path: Path) -> None:
    # 37 samples, batch 4: 10 batches (last holds 1) or 9 with drop_last.
    case = {"n": 37, "batch_size": 4, "epochs": 2, "seed": 2, "drop_last": drop_last}
    full, resumed = _resume(case, tmp_path, "step", stop_at)
    assert resumed == full
    per_epoch = 36 if drop_last else 37
    assert len(full) == 2 * per_epoch


def test_model_checkpoint_every_n_train_steps(tmp_path: Path) -> None:
    case = {"n": 28, "batch_size": 4, "epochs": 2, "seed": 4}
    full, resumed = _resume(case, tmp_path, "mcp", 9)
    assert resumed == full


def test_resume_twice_in_a_row(tmp_path: Path) -> None:
    case = {"n": 28, "batch_size": 4, "epochs": 3, "seed": 4}
    full, _, _ = run(case)
    first, second = str(tmp_path / "a.ckpt"), str(tmp_path / "b.ckpt")
    a, _, _ = run(dict(case, stop_kind="step", stop_at=3), ckpt_out=first)
    b, _, _ = run(dict(case, stop_kind="step", stop_at=10), ckpt_out=second, ckpt_in=first)
    c, _, _ = run(case, ckpt_in=second)
    assert a.seen + b.seen + c.seen == full.seen


def test_estimated_stepping_batches_in_configure_optimizers(tmp_path: Path) -> None:
    case = {"n": 24, "batch_size": 4, "epochs": 2, "seed": 3, "read_stepping": True}
    full, _, _ = run(case)
    ckpt = str(tmp_path / "stop.ckpt")
    before, _, _ = run(dict(case, stop_kind="step", stop_at=8), ckpt_out=ckpt)
    after, _, _ = run(case, ckpt_in=ckpt)
    assert before.seen + after.seen == full.seen
    # The estimate read in configure_optimizers, in the fresh and in the resumed fit: 24 samples in batches of 4,
    # 6 steps an epoch, 2 epochs (the test's own count).
    assert full.stepping_batches == after.stepping_batches == 12


def test_limit_train_batches(tmp_path: Path) -> None:
    case = {"n": 40, "batch_size": 4, "epochs": 3, "seed": 3, "limit": 6}
    for stop_at in (3, 6, 8):
        full, resumed = _resume(case, tmp_path, "step", stop_at)
        assert resumed == full
        assert len(full) == 3 * 6 * 4


@pytest.mark.parametrize("stop_at", [2, 7])
def test_resumed_epoch_ends_as_without_the_interruption(stop_at: int, tmp_path: Path) -> None:
    # The batch the checkpoint was saved in counts as finished on every Lightning version: the resumed epoch
    # still ends with its validation, and the step counters end where the uninterrupted run's do.
    case = {"n": 20, "batch_size": 4, "epochs": 2, "seed": 7, "validate": True}
    full, _, full_trainer = run(case)
    ckpt = str(tmp_path / "v.ckpt")
    before, _, _ = run(dict(case, stop_kind="step", stop_at=stop_at), ckpt_out=ckpt)
    after, _, trainer = run(case, ckpt_in=ckpt)
    assert before.seen + after.seen == full.seen
    assert full.validated == [0, 1]
    assert after.validated == full.validated[stop_at // 5 :]
    assert trainer.global_step == full_trainer.global_step == 10
    steps = trainer.fit_loop.epoch_loop._batches_that_stepped
    assert steps == full_trainer.fit_loop.epoch_loop._batches_that_stepped == 10


def test_seed_is_drawn_once_and_stored(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # A test before this one may have called seed_everything, which leaves PL_GLOBAL_SEED set: without it the seed
    # is drawn, and only the stored one can give the resumed run the same order.
    monkeypatch.delenv("PL_GLOBAL_SEED", raising=False)
    case = {"n": 20, "batch_size": 4, "epochs": 2}
    ckpt = str(tmp_path / "s.ckpt")
    before, _, _ = run(dict(case, stop_kind="step", stop_at=7), ckpt_out=ckpt)
    # docs/resume.md names the place, so it is spelled out here rather than read from the package.
    stored = torch.load(ckpt, weights_only=False)["Data"]["loadguard_loader_position"]
    assert (stored["epoch"], stored["batches_consumed"], stored["samples_consumed"]) == (1, 2, 8)
    assert (stored["dataset_len"], stored["batch_size"], stored["world_size"]) == (20, 4, 1)
    after, _, _ = run(case, ckpt_in=ckpt)
    full, _, _ = run(dict(case, seed=stored["seed"]))
    assert before.seen + after.seen == full.seen


@pytest.mark.parametrize(("global_seed", "loader_seed", "stored_seed"), [("11", None, 11), ("11", 3, 3)])
def test_the_seed_is_loader_seed_else_pl_global_seed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, global_seed: str, loader_seed: int | None, stored_seed: int
) -> None:
    """docs/resume.md: the seed is ``loader_seed`` where the datamodule sets it, else ``PL_GLOBAL_SEED``."""
    monkeypatch.setenv("PL_GLOBAL_SEED", global_seed)
    case = {"n": 20, "batch_size": 4, "epochs": 2, "seed": loader_seed}
    ckpt = str(tmp_path / "s.ckpt")
    run(dict(case, stop_kind="step", stop_at=3), ckpt_out=ckpt)
    assert torch.load(ckpt, weights_only=False)["Data"]["loadguard_loader_position"]["seed"] == stored_seed


@pytest.mark.parametrize("stop_kind,stop_at", [("step", 5), ("epoch_end", 0)], ids=["last_batch", "epoch_end"])
def test_a_finished_epoch_is_stored_as_the_next_ones_start(stop_kind: str, stop_at: int, tmp_path: Path) -> None:
    # docs/resume.md, "What is stored": 20 samples in batches of 4 make 5 batches; after epoch 0's fifth (the
    # test's own count) or at its end, the checkpoint holds epoch 1, nothing consumed.
    case = {"n": 20, "batch_size": 4, "epochs": 2, "seed": 7}
    ckpt = str(tmp_path / "end.ckpt")
    before, _, _ = run(dict(case, stop_kind=stop_kind, stop_at=stop_at), ckpt_out=ckpt)
    assert sorted(before.seen) == list(range(20))
    stored = torch.load(ckpt, weights_only=False)["Data"][STATE_KEY]
    assert (stored["epoch"], stored["batches_consumed"], stored["samples_consumed"]) == (1, 0, 0)


def _repairs(monkeypatch: pytest.MonkeyPatch) -> list[tuple[Any, Any]]:
    """Every call of the counter repair while a checkpoint is restored: (loop state before, after)."""
    from lightning_loadguard import _lightning, datamodule

    calls: list[tuple[Any, Any]] = []
    repair = datamodule.repair_restored_progress

    def watched(trainer: Any, epoch: int, batches: int) -> None:
        loops = (_lightning.loaded_checkpoint(trainer) or {}).get("loops")
        before = copy.deepcopy(loops)
        repair(trainer, epoch, batches)
        calls.append((before, copy.deepcopy(loops)))

    monkeypatch.setattr(datamodule, "repair_restored_progress", watched)
    return calls


@pytest.mark.parametrize("stop_at", [3, 7])
def test_a_checkpoint_whose_counters_are_consistent_is_not_changed(
    stop_at: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # docs/resume.md: written mid-epoch by a fresh, uninterrupted process, Lightning's counters already agree with
    # the position, and the repair leaves the checkpoint's loop state as written.
    case = {"n": 20, "batch_size": 4, "epochs": 2, "seed": 7}
    ckpt = str(tmp_path / "mid.ckpt")
    run(dict(case, stop_kind="step", stop_at=stop_at), ckpt_out=ckpt)
    calls = _repairs(monkeypatch)
    run(case, ckpt_in=ckpt)
    assert len(calls) == 1 and calls[0][0] is not None
    assert calls[0][1] == calls[0][0]


def test_a_checkpoint_whose_counters_are_wrong_is_changed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # The control for the test above: after a fit max_steps cut mid-epoch, Lightning counts the epoch processed,
    # and the watched repair does change the loop state.
    case = {"n": 20, "batch_size": 4, "epochs": 2, "seed": 7}
    ckpt = str(tmp_path / "cut.ckpt")
    _, _, trainer = run(dict(case, max_steps=7))
    trainer.save_checkpoint(ckpt)
    calls = _repairs(monkeypatch)
    run(case, ckpt_in=ckpt)
    assert len(calls) == 1 and calls[0][0] is not None
    assert calls[0][1] != calls[0][0]


def test_stateful_iterable_resumes_at_the_consumer(tmp_path: Path) -> None:
    # Unsized: Lightning fetches one batch ahead, which must not count as consumed.
    case = {"n": 22, "batch_size": 4, "epochs": 2, "sampler": "stateful_iterable"}
    for stop_kind, stop_at in (("step", 3), ("step", 8), ("epoch_end", 0)):
        full, resumed = _resume(case, tmp_path, stop_kind, stop_at)
        assert resumed == full


@pytest.mark.parametrize("n", [24, 22], ids=["full_last_batch", "partial_last_batch"])
def test_stateful_iterable_checkpoint_on_the_epochs_last_batch(n: int, tmp_path: Path) -> None:
    # Step 6 is epoch 0's 6th and last batch. When it is full, the dataset has not yet noticed it is exhausted
    # while the consumer finishes that batch; the resumed run must still see all of epoch 1.
    case = {"n": n, "batch_size": 4, "epochs": 2, "sampler": "stateful_iterable"}
    full, resumed = _resume(case, tmp_path, "step", 6)
    assert resumed == full
    assert len(full) == 2 * n
    assert sorted(full[:n]) == sorted(full[n:]) == list(range(n))
    # A finished epoch is stored as the next one's start, as for a loader with a length.
    stored = torch.load(tmp_path / "stop.ckpt", weights_only=False)["Data"][STATE_KEY]
    assert (stored["epoch"], stored["batches_consumed"]) == (1, 0)
    assert stored["dataset_state"] == {"pos": 0, "epoch": 1}


def test_iterable_with_workers_is_refused() -> None:
    case = {"n": 12, "batch_size": 4, "epochs": 1, "sampler": "stateful_iterable", "workers": 2}
    # docs/resume.md quotes the error: the whole wording, not just the setting it names.
    with pytest.raises(
        ValueError, match=r"a stateful IterableDataset read by num_workers=2 worker processes cannot be resumed exactly"
    ):
        run(case)


def _without_position(src: str, dst: str, **changes: Any) -> None:
    ckpt = torch.load(src, weights_only=False)
    if changes:
        ckpt["Data"][STATE_KEY].update(changes)
    else:
        del ckpt["Data"][STATE_KEY]
        if not ckpt["Data"]:
            del ckpt["Data"]
    torch.save(ckpt, dst)


@pytest.mark.parametrize(
    "change,message",
    [
        ({"dataset_len": 21}, r"dataset length changed.*21 samples.*now has 20"),
        ({"version": 99}, r"version 99"),
        ({"written_by_a_later_release": 1}, r"unknown fields \['written_by_a_later_release'\]"),
    ],
)
def test_bad_position_is_refused(change: dict[str, int], message: str, tmp_path: Path) -> None:
    case = {"n": 20, "batch_size": 4, "epochs": 2, "seed": 9}
    ckpt, bad = str(tmp_path / "p.ckpt"), str(tmp_path / "bad.ckpt")
    run(dict(case, stop_kind="step", stop_at=3), ckpt_out=ckpt)
    _without_position(ckpt, bad, **change)
    with pytest.raises(PositionMismatchError, match=message):
        run(case, ckpt_in=bad)


def test_changed_batch_size_is_refused(tmp_path: Path) -> None:
    case = {"n": 20, "batch_size": 4, "epochs": 2, "seed": 9}
    ckpt = str(tmp_path / "p.ckpt")
    run(dict(case, stop_kind="step", stop_at=3), ckpt_out=ckpt)
    with pytest.raises(PositionMismatchError, match=r"batch_size changed.*batches of 4.*batches of 5"):
        run(dict(case, batch_size=5), ckpt_in=ckpt)


def test_changed_drop_last_is_refused(tmp_path: Path) -> None:
    # docs/resume.md: dataset_len, batch_size and drop_last are checked on resume; 22 samples in batches of 4 leave
    # a short last batch that drop_last=True would drop, so the batches left would not be the ones counted.
    case = {"n": 22, "batch_size": 4, "epochs": 2, "seed": 9}
    ckpt = str(tmp_path / "p.ckpt")
    run(dict(case, stop_kind="step", stop_at=3), ckpt_out=ckpt)
    with pytest.raises(PositionMismatchError, match=r"drop_last changed from False to True"):
        run(dict(case, drop_last=True), ckpt_in=ckpt)


def test_outside_a_trainer_the_loader_is_untouched() -> None:
    data = Data({"n": 8, "batch_size": 2})
    assert type(data.train_dataloader()) is DataLoader
    assert data.state_dict() == {}


def test_works_with_the_pytorch_lightning_package(tmp_path: Path) -> None:
    ptl = pytest.importorskip("pytorch_lightning")
    from loader_fixtures import PyShuffle
    from resume_harness import Indexed

    from lightning_loadguard.datamodule import ResumableLoaderMixin

    class PtlData(ResumableLoaderMixin, ptl.LightningDataModule):
        loader_seed = 3

        def train_dataloader(self) -> DataLoader:
            return DataLoader(Indexed(12), batch_size=3, sampler=PyShuffle(12))

    class PtlModel(ptl.LightningModule):
        def __init__(self, stop: str | None = None) -> None:
            super().__init__()
            self.layer = torch.nn.Linear(1, 1)
            self.seen: list[int] = []
            self.stop = stop

        def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
            self.seen.extend(int(i) for i in batch[0])
            return self.layer(batch[1]).sum()

        def on_train_batch_end(self, outputs: Any, batch: Any, batch_idx: int) -> None:
            if self.stop and self.global_step == 6:
                self.trainer.save_checkpoint(self.stop)
                self.trainer.should_stop = True

        def configure_optimizers(self) -> torch.optim.Optimizer:
            return torch.optim.SGD(self.parameters(), lr=0.1)

    def fit(stop: str | None = None, ckpt: str | None = None) -> list[int]:
        trainer = ptl.Trainer(
            max_epochs=2,
            logger=False,
            enable_checkpointing=False,
            enable_progress_bar=False,
            enable_model_summary=False,
        )
        model = PtlModel(stop)
        trainer.fit(model, datamodule=PtlData(), ckpt_path=ckpt)
        return model.seen

    path = str(tmp_path / "ptl.ckpt")
    assert fit(stop=path) + fit(ckpt=path) == fit()


def test_a_sampler_whose_order_cannot_be_reproduced_is_refused_before_training() -> None:
    case = {"n": 12, "batch_size": 4, "epochs": 1, "sampler": "unseeded"}
    # NonReproducibleOrderError, a ValueError.
    with pytest.raises(ValueError, match=r"UnseededShuffle gave two different orders.*Fix: draw"):
        run(case)


@pytest.mark.parametrize("kind,stop_at", [("dict", 2), ("list", 3), ("dict", 5), ("list", 7)])
def test_several_train_loaders_resume_exactly(kind: str, stop_at: int, tmp_path: Path) -> None:
    # 20 and 10 samples, batch 4: 5 and 3 batches, the second loader cycled (its pass ends at steps 3, 6).
    case = {"n": 20, "batch_size": 4, "epochs": 2, "seed": 7, "sampler": kind}
    full, resumed = _resume(case, tmp_path, "step", stop_at)
    assert resumed == full
    # Epoch 0 gives the short loader a whole pass and 2 batches (8 samples) of the next; epoch 1 restarts it.
    short = [i - 1000 for i in full if i >= 1000]
    assert len(short) == 2 * (10 + 8)
    assert sorted(short[:10]) == sorted(short[18:28]) == list(range(10))
    assert short[:10] != short[18:28], "each pass has its own order"


def test_a_combined_loader_is_refused_at_fit_start() -> None:
    case = {"n": 12, "batch_size": 4, "epochs": 1, "sampler": "combined"}
    with pytest.raises(ValueError, match=r"returned a CombinedLoader of 2 loaders.*Return the dict or list"):
        run(case)


@pytest.mark.parametrize(
    "sampler,named",
    [("dict_with_stream", r"loader 'b' is a DataLoader over Stream"), ("list_with_subclass", r"loader 1 is a Gene")],
)
def test_several_loaders_one_not_a_plain_map_style_loader_are_refused_at_fit_start(sampler: str, named: str) -> None:
    case = {"n": 12, "batch_size": 4, "epochs": 1, "seed": 7, "sampler": sampler}
    with pytest.raises(ValueError, match=named + r".*continues several loaders only when each is a plain DataLoader"):
        run(case)


def _not_resumable_warnings(caught: list[warnings.WarningMessage]) -> list[str]:
    return [str(w.message) for w in caught if "dataloader is not resumable" in str(w.message)]


@pytest.mark.parametrize("sampler", ["default", "subclass"])
def test_lightning_not_resumable_warning_only_when_the_order_is_not_guaranteed(sampler: str, tmp_path: Path) -> None:
    case = {"n": 20, "batch_size": 4, "epochs": 2, "seed": 7, "sampler": sampler, "allow_inexact": True}
    ckpt = str(tmp_path / "w.ckpt")
    run(dict(case, stop_kind="step", stop_at=7), ckpt_out=ckpt)
    filters_before = list(warnings.filters)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        run(case, ckpt_in=ckpt)
        assert warnings.filters[1:] == filters_before, "the silencing filter must not outlive the resume"
    if sampler == "default":
        assert _not_resumable_warnings(caught) == []
    else:
        # A DataLoader subclass (its __iter__ a generator) trains as is where the datamodule opted out of
        # exact resume: Lightning's warning and the mixin's both show.
        assert len(_not_resumable_warnings(caught)) == 1
        assert any("GeneratorLoader (a DataLoader subclass)" in str(w.message) for w in caught)


def test_stateful_loader_without_length_is_refused_mid_epoch(tmp_path: Path) -> None:
    pytest.importorskip("torchdata")
    case = {"n": 22, "batch_size": 4, "epochs": 2, "sampler": "stateful_iterable_loader"}
    ckpt = str(tmp_path / "s.ckpt")
    before, _, _ = run(dict(case, stop_kind="step", stop_at=2), ckpt_out=ckpt)
    assert len(before.seen) == 8
    with pytest.raises(PositionMismatchError, match=r"fetches one batch ahead.*Give the dataset a __len__"):
        run(case, ckpt_in=ckpt)


@pytest.mark.parametrize("epochs", [3, 2])
def test_fit_without_max_steps_from_a_truncated_epoch_finishes_it(epochs: int, tmp_path: Path) -> None:
    # max_steps=7 ends the fit after 2 of epoch 1's 5 batches; the checkpoint counts 2 epochs done. Resumed as
    # written, Lightning would start epoch 2 and drop the other 3 (max_epochs=3), or end the fit at once without
    # them (max_epochs=2): the mixin restores the counters of an uninterrupted process at that batch.
    case = {"n": 20, "batch_size": 4, "epochs": epochs, "seed": 7}
    full, _, whole = run(case)
    ckpt = str(tmp_path / "t.ckpt")
    before, _, trainer = run(dict(case, max_steps=7))
    trainer.save_checkpoint(ckpt)
    assert len(before.seen) == 7 * 4
    after, _, resumed = run(case, ckpt_in=ckpt)
    assert before.seen + after.seen == full.seen
    assert (resumed.current_epoch, resumed.global_step) == (whole.current_epoch, whole.global_step)


@pytest.mark.parametrize("stop_at", [3, 5, 8])
def test_loaders_rebuilt_every_epoch_keep_the_position(stop_at: int, tmp_path: Path) -> None:
    # reload_dataloaders_every_n_epochs=1 calls train_dataloader() again at every epoch start.
    case = {"n": 20, "batch_size": 4, "epochs": 3, "seed": 7, "reload": 1, "workers": 1}
    full, resumed = _resume(case, tmp_path, "step", stop_at)
    assert resumed == full
    assert full[:20] != full[20:40] != full[40:]


@pytest.mark.slow
def test_auto_tune_switching_settings_keeps_the_resumed_order(tmp_path: Path) -> None:
    # The tuner restarts the train loader mid-epoch with other worker settings; the mixin's cursor says
    # where each restarted iterator continues, before and after a resume.
    import time

    from resume_harness import Indexed

    from lightning_loadguard import LoadGuard, TuneOptions

    class Slow(Indexed):
        def __getitem__(self, i: int) -> Any:
            time.sleep(0.008)
            return super().__getitem__(i)

    class SlowData(Data):
        def train_dataloader(self) -> DataLoader:
            return DataLoader(Slow(self.case["n"]), batch_size=4, shuffle=True, num_workers=1)

    guards: list[Any] = []

    def fit(tune: bool, stop: int | None = None, ckpt_in: str | None = None) -> list[int]:
        import lightning.pytorch as pl
        from resume_harness import Recorder

        case = {"n": 400, "batch_size": 4, "epochs": 2, "seed": 3, "stop_kind": "step" if stop else None}
        case["stop_at"] = stop
        options = TuneOptions(warmup_steps=2, window_steps=6, tune_persistent_workers=False) if tune else False
        trainer = pl.Trainer(
            max_epochs=2,
            accelerator="cpu",
            logger=False,
            enable_checkpointing=False,
            enable_progress_bar=False,
            enable_model_summary=False,
            callbacks=[LoadGuard(print_summary=False, auto_tune=options)],
        )
        guards.append(trainer.callbacks[0])
        model = Recorder(case, ckpt=str(tmp_path / "t.ckpt") if stop else None)
        trainer.fit(model, datamodule=SlowData(case), ckpt_path=ckpt_in)
        return model.seen

    untuned = fit(False)
    assert fit(True) == untuned
    assert fit(True, stop=130) + fit(True, ckpt_in=str(tmp_path / "t.ckpt")) == untuned
    # Not vacuous: in the whole run and in the one stopped at step 130, the tuner did restart the loader
    # mid-epoch with other worker counts (a 32 ms batch from one worker leaves the loop waiting); which
    # setting it keeps after that is the tuner's business.
    for guard in guards[1:3]:
        decision = guard.decision
        assert decision is not None and decision.probe_steps > 0, decision
        assert {c.setting.num_workers for c in decision.candidates} - {1}, decision
