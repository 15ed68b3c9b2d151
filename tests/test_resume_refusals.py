"""The resume cases docs/resume.md lists as refused, refused with the error it quotes.

The position core's refusals (what cannot be sharded over ranks), and every loader the mixin cannot position:
a fresh fit and a resume at an epoch's start run, a resume inside an epoch is refused before its first step
with an error that says what to do, unless ``allow_inexact_resume``.
"""

from __future__ import annotations

import math
import re
import warnings
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import pytest
import torch
from resume_harness import Batches, Data, Indexed, make_datamodule, run
from torch.utils.data import BatchSampler, DataLoader, IterableDataset, SequentialSampler

from lightning_loadguard.datamodule import STATE_KEY
from lightning_loadguard.position import LoaderPosition, PositionMismatchError, make_resumable
from lightning_loadguard.position.cursor import EpochCursor

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")

# 20 samples, batch 4: 5 batches an epoch; a checkpoint at global step 3 is 3 batches into epoch 0, at 7 two
# batches into epoch 1.
BASE = {"n": 20, "batch_size": 4, "epochs": 2, "seed": 9}
UNPOSITIONED = {
    "not_a_loader": r"returned a Batches, not a DataLoader.*Return a torch DataLoader",
    "subclass": r"GeneratorLoader \(a DataLoader subclass\).*Return a plain DataLoader",
    "plain_iterable": r"Stream is an IterableDataset without state_dict\(\).*Implement state_dict\(\)",
}


def _mid_epoch_checkpoint(case: dict[str, Any], tmp_path: Path, at: int = 3) -> str:
    ckpt = str(tmp_path / "mid.ckpt")
    before, _, _ = run(dict(case, stop_kind="step", stop_at=at), ckpt_out=ckpt)
    assert sum(i < 1000 for i in before.seen) == at * 4  # (the second of several loaders counts from 1000)
    return ckpt


@pytest.mark.parametrize("sampler", sorted(UNPOSITIONED))
def test_a_mid_epoch_resume_of_a_loader_the_mixin_cannot_position_is_refused(sampler: str, tmp_path: Path) -> None:
    case = dict(BASE, sampler=sampler)
    ckpt = _mid_epoch_checkpoint(case, tmp_path)
    with pytest.raises(PositionMismatchError, match=r"cannot resume inside epoch 0 exactly") as refused:
        run(case, ckpt_in=ckpt)
    message = str(refused.value)
    assert re.search(UNPOSITIONED[sampler], message), message
    assert "allow_inexact_resume = True" in message
    assert "checkpoint written at an epoch's end" in message


@pytest.mark.parametrize("sampler", ["subclass", "plain_iterable", "not_a_loader"])
def test_a_resume_at_an_epochs_start_runs_every_sample_once(sampler: str, tmp_path: Path) -> None:
    case = dict(BASE, sampler=sampler, epochs=3)
    ckpt = str(tmp_path / "end.ckpt")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        before, _, _ = run(dict(case, stop_kind="epoch_end", stop_at=0), ckpt_out=ckpt)
    # The fresh fit says once that its checkpoints resume exactly only at an epoch's start.
    assert sum("resuming inside an epoch will be refused" in str(w.message) for w in caught) == 1
    if sampler == "plain_iterable" and not hasattr(pl.Trainer(logger=False).fit_loop, "is_resuming"):
        # Lightning before 2.6 iterates the loader twice on this resume: the stream, which keeps its place, would
        # lose the batch the first iteration read ahead.
        with pytest.raises(PositionMismatchError, match=r"iterates the train loader twice .* Stream is an Iterab"):
            run(case, ckpt_in=ckpt)
        return
    after, _, _ = run(case, ckpt_in=ckpt)
    assert len(before.seen) == 20
    assert len(after.seen) == 40
    for epoch in range(2):
        assert sorted(after.seen[epoch * 20 : (epoch + 1) * 20]) == list(range(20))


@pytest.mark.parametrize("sampler", ["subclass", "plain_iterable", "not_a_loader"])
def test_allow_inexact_resume_continues_as_lightning_does(sampler: str, tmp_path: Path) -> None:
    case = dict(BASE, sampler=sampler)
    ckpt = _mid_epoch_checkpoint(case, tmp_path)
    # The truth: the same checkpoint resumed by the same datamodule without the mixin, i.e. by Lightning alone,
    # each from the same global random state (a shuffled loader's fresh iterator draws its order from it).
    torch.manual_seed(1)
    lightning, _, _ = run(dict(case, shape="without_mixin"), ckpt_in=ckpt)
    torch.manual_seed(1)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        after, _, _ = run(dict(case, allow_inexact=True), ckpt_in=ckpt)
    assert after.seen == lightning.seen
    # Not exact: the rest of epoch 0 is not what the uninterrupted run trained there.
    full, _, _ = run(case)
    assert after.seen != full.seen[12:]
    messages = [str(w.message) for w in caught]
    said = [m for m in messages if "allow_inexact_resume: not resuming inside epoch 0 exactly" in m]
    assert len(said) == 1, messages
    if sampler != "plain_iterable":  # Lightning warns only of a loader with a length
        assert any("dataloader is not resumable" in m for m in messages), "Lightning's own warning must still show"


def _drop_position(src: str, dst: str) -> None:
    ckpt = torch.load(src, weights_only=False)
    del ckpt["Data"][STATE_KEY]
    if not ckpt["Data"]:
        del ckpt["Data"]
    torch.save(ckpt, dst)


def test_a_checkpoint_without_the_position_is_refused_mid_epoch(tmp_path: Path) -> None:
    ckpt, old = _mid_epoch_checkpoint(BASE, tmp_path, at=7), str(tmp_path / "old.ckpt")
    _drop_position(ckpt, old)
    with pytest.raises(PositionMismatchError, match=r"holds no train-loader position.*ResumableLoaderMixin"):
        run(BASE, ckpt_in=old)
    # Opted out: epoch 1 starts again from its first batch; the trainer still stops after its remaining 3.
    full, _, _ = run(BASE)
    after, _, _ = run(dict(BASE, allow_inexact=True), ckpt_in=old)
    assert after.seen == full.seen[20 : 20 + 12]


def test_a_checkpoint_without_the_position_resumed_at_an_epochs_start_runs(tmp_path: Path) -> None:
    # docs/resume.md: a checkpoint of an older run (no position) written at an epoch's end resumes: nothing is
    # refused and every later epoch holds every sample once.
    case = dict(BASE, epochs=3)
    ckpt, old = str(tmp_path / "end.ckpt"), str(tmp_path / "old.ckpt")
    before, _, _ = run(dict(case, stop_kind="epoch_end", stop_at=0), ckpt_out=ckpt)
    _drop_position(ckpt, old)
    assert STATE_KEY not in torch.load(old, weights_only=False).get("Data", {})
    after, _, _ = run(case, ckpt_in=old)
    assert len(before.seen) == 20
    assert len(after.seen) == 40
    for epoch in range(2):
        assert sorted(after.seen[epoch * 20 : (epoch + 1) * 20]) == list(range(20))


def test_several_loaders_from_a_checkpoint_without_the_position_are_refused_mid_epoch(tmp_path: Path) -> None:
    case = dict(BASE, sampler="dict")
    ckpt, old = _mid_epoch_checkpoint(case, tmp_path), str(tmp_path / "old.ckpt")
    _drop_position(ckpt, old)
    with pytest.raises(PositionMismatchError, match=r"inside epoch 0 exactly.*holds no train-loader position"):
        run(case, ckpt_in=old)


def test_a_position_no_loader_takes_is_refused_mid_epoch(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # train_dataloader replaced behind the mixin's back (not through setattr): the checkpoint's position
    # reaches no loader, and the first step inside the epoch stops the fit.
    ckpt = _mid_epoch_checkpoint(BASE, tmp_path)
    made = Data.__init__

    def bypass(self: Data, case: dict[str, Any]) -> None:
        made(self, case)
        self.__dict__["train_dataloader"] = lambda: Batches(DataLoader(Indexed(20), batch_size=4))

    monkeypatch.setattr(Data, "__init__", bypass)
    with pytest.raises(PositionMismatchError, match=r"never reached ResumableLoaderMixin"):
        run(BASE, ckpt_in=ckpt)


class _Counting(IterableDataset):
    """An iterable dataset that keeps its place (``state_dict``/``load_state_dict``)."""

    def __init__(self) -> None:
        self.next = 0

    def __iter__(self) -> Any:
        while self.next < 8:
            self.next += 1
            yield self.next - 1

    def state_dict(self) -> dict[str, int]:
        return {"next": self.next}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.next = state["next"]


class _Pairs(BatchSampler):
    """A custom batch sampler: its batches are no sample order ranks could split."""

    def __init__(self) -> None:
        super().__init__(SequentialSampler(range(8)), batch_size=2, drop_last=False)


def test_a_stateful_iterable_dataset_on_several_ranks_is_refused() -> None:
    loader = DataLoader(_Counting(), batch_size=2)
    assert make_resumable(loader, seed=0, world_size=1) is not None  # one rank: supported
    with pytest.raises(ValueError, match=r"stateful IterableDataset cannot be resumed exactly with world_size > 1"):
        make_resumable(loader, seed=0, rank=0, world_size=2)


def test_a_custom_batch_sampler_on_several_ranks_is_refused() -> None:
    loader = DataLoader(list(range(8)), batch_sampler=_Pairs())
    assert make_resumable(loader, seed=0, world_size=1) is not None  # one process: supported
    with pytest.raises(ValueError, match=r"a custom batch sampler \(_Pairs\) cannot be sharded over world_size=2"):
        make_resumable(loader, seed=0, rank=0, world_size=2)


@pytest.mark.parametrize("raised_by", ["the mixin", "the user's train_dataloader"])
def test_a_fit_refused_in_train_dataloader_leaves_torchs_loader_classes_as_they_were(raised_by: str) -> None:
    # Lightning patches DataLoader and BatchSampler while train_dataloader() runs and restores them only when it
    # returns: a refusal there left every later DataLoader of the process recording its arguments.
    from lightning_loadguard.synthetic import TimedModule

    before = {cls: dict(vars(cls)) for cls in (DataLoader, BatchSampler, _Pairs)}

    class Refused(Data):
        def train_dataloader(self) -> Any:
            if raised_by == "the mixin":
                return DataLoader(_Counting(), batch_size=2, num_workers=2)
            raise ValueError("no data today")

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer = pl.Trainer(max_steps=2, logger=False, enable_checkpointing=False, enable_progress_bar=False)
        with pytest.raises(ValueError, match=r"num_workers=2 worker processes|no data today"):
            trainer.fit(TimedModule(), datamodule=Refused({"n": 8, "batch_size": 2}))
    assert {cls: dict(vars(cls)) for cls in before} == before
    assert not any(name.startswith("_DataLoader__pl") or "__pl_" in name for name in vars(DataLoader(range(4))))


def test_a_loop_whose_count_disagrees_with_the_loaders_stops_before_the_step(monkeypatch: pytest.MonkeyPatch) -> None:
    # The loader's cursor misses one finished step (a hook that did not run): before the next step the loop's
    # batch_idx is one ahead of the loader's count, and the fit stops rather than train a sample out of order.
    counted = EpochCursor.consumed
    calls: list[int] = []

    def missing_the_second(self: EpochCursor, total: float = math.inf) -> None:
        calls.append(self.batches)
        if len(calls) != 2:
            counted(self, total)

    monkeypatch.setattr(EpochCursor, "consumed", missing_the_second)
    with pytest.raises(
        PositionMismatchError,
        match=r"about to train batch 2 of its epoch, the loader continues after 1 consumed batches of epoch 0",
    ):
        run(BASE)


def test_loader_position_is_the_consumers_place_and_what_the_checkpoint_stores(tmp_path: Path) -> None:
    assert make_datamodule(BASE).loader_position is None  # no loader built yet
    ckpt = str(tmp_path / "mid.ckpt")
    _, data, _ = run(dict(BASE, stop_kind="step", stop_at=7), ckpt_out=ckpt)
    position = data.loader_position
    assert position is not None and (position.epoch, position.batches_consumed) == (1, 2)  # 5 + 2 steps of 4
    stored = torch.load(ckpt, weights_only=False)["Data"][STATE_KEY]
    assert position == LoaderPosition.from_state_dict(stored)


def test_an_inexact_resume_without_the_position_takes_lightnings_batch_idx_as_its_count(tmp_path: Path) -> None:
    # docs/resume.md: from a checkpoint without the mixin's position the batch_idx check is skipped, and the mixin
    # counts from Lightning's batch_idx. Saved at global step 7 (epoch 1, 2 batches in), position dropped; the
    # opted-out resume trains one batch (step 8) and saves again: the loader restarted epoch 1, so the dataset
    # gave that step the order's batch 0, while Lightning counts 3 batches of epoch 1 done.
    ckpt, old, new = _mid_epoch_checkpoint(BASE, tmp_path, at=7), str(tmp_path / "old.ckpt"), str(tmp_path / "n.ckpt")
    _drop_position(ckpt, old)
    full, _, _ = run(BASE)
    inexact, _, _ = run(dict(BASE, allow_inexact=True, stop_kind="step", stop_at=8), ckpt_in=old, ckpt_out=new)
    assert inexact.seen == full.seen[20:24]
    stored = torch.load(new, weights_only=False)["Data"][STATE_KEY]
    assert (stored["epoch"], stored["batches_consumed"]) == (1, 3)
    # Resumed from that count, the run trains the order's batches 3 and 4: batches 1 and 2 are never trained,
    # which only a count taken from Lightning (not from the batches the loader gave) leaves out.
    after, _, _ = run(BASE, ckpt_in=new)
    assert after.seen == full.seen[32:40]


def test_an_inexact_resume_without_the_position_finishes_its_epoch_then_trains_the_next_in_order(
    tmp_path: Path,
) -> None:
    # The same opted-out resume run to the end of a third epoch: no PositionMismatchError from the batch_idx check
    # (Lightning's batch_idx starts at 2 while the loader restarted), epoch 1's 3 remaining steps get the order's
    # first 3 batches, and epoch 2, counted by the mixin from its start, is the uninterrupted run's.
    case = dict(BASE, epochs=3)
    ckpt, old = _mid_epoch_checkpoint(case, tmp_path, at=7), str(tmp_path / "old.ckpt")
    _drop_position(ckpt, old)
    full, _, _ = run(case)
    after, _, _ = run(dict(case, allow_inexact=True), ckpt_in=old)
    assert after.seen == full.seen[20:32] + full.seen[40:60]
