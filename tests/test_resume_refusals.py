"""The resume cases docs/resume.md lists as refused, refused with the error it quotes (the position core)."""

from __future__ import annotations

from typing import Any

import pytest
from torch.utils.data import BatchSampler, DataLoader, IterableDataset, SequentialSampler

from lightning_loadguard.position import make_resumable


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
