"""Switching a plain DataLoader's worker settings mid-epoch keeps its own order and the global random stream."""

from __future__ import annotations

import tracemalloc
from typing import Any

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader, DistributedSampler

from lightning_loadguard.position.record import IndexRecord
from lightning_loadguard.position.switch import OrderTap, apply_settings, restart_iterator


def _batches(iterator) -> list[list[int]]:
    return [b.tolist() for b in iterator]


def _reference(**kwargs) -> tuple[list[list[int]], list[list[int]], torch.Tensor]:
    torch.manual_seed(3)
    loader = DataLoader(list(range(60)), batch_size=4, shuffle=True, **kwargs)
    first, second = _batches(loader), _batches(loader)
    return first, second, torch.rand(3)


def _tapped(workers: int) -> tuple[DataLoader, OrderTap, Any]:
    """The reference's loader, seeded alike, with a tap and a running iterator."""
    torch.manual_seed(3)
    loader = DataLoader(list(range(60)), batch_size=4, shuffle=True, num_workers=workers)
    tap = OrderTap.install(loader)
    return loader, tap, iter(loader)


@pytest.mark.parametrize("start_workers", [0, 2])
def test_switches_keep_the_order_and_the_next_epochs(start_workers: int) -> None:
    first, second, after = _reference(num_workers=start_workers)
    loader, tap, it = _tapped(start_workers)
    got = [next(it).tolist() for _ in range(3)]
    it = restart_iterator(loader, tap, 3, old_iterator=it, num_workers=2, prefetch_factor=3)
    got += [next(it).tolist() for _ in range(4)]
    it = restart_iterator(loader, tap, 7, old_iterator=it, num_workers=0)
    got += [next(it).tolist() for _ in range(2)]
    it = restart_iterator(loader, tap, 9, old_iterator=it, num_workers=1, prefetch_factor=2)
    got += _batches(it)
    tap.remove(loader)
    assert got == first
    assert _batches(loader) == second  # the next epoch draws the same permutation as without switching
    assert torch.equal(torch.rand(3), after)


@pytest.mark.parametrize(("start_workers", "new_workers"), [(1, 0), (0, 0), (1, 1), (0, 1)])
def test_a_restart_at_an_epochs_last_batch_that_is_never_read_leaves_the_next_epoch_whole(
    start_workers: int, new_workers: int
) -> None:
    # Lightning stops a sized loader at its length without another next(): a switch made after the epoch's last
    # batch builds an iterator the loop never reads. An in-process one had not started its run; the next epoch's
    # iter() continued the spent run and came back empty, silently losing the whole epoch.
    first, second, after = _reference(num_workers=start_workers)
    loader, tap, it = _tapped(start_workers)
    got = [next(it).tolist() for _ in range(15)]
    unread = restart_iterator(loader, tap, 15, old_iterator=it, num_workers=new_workers)
    assert _batches(loader) == second  # the next epoch, whole and in the untuned order
    del unread
    tap.remove(loader)
    assert got == first
    assert torch.equal(torch.rand(3), after)


def test_read_ahead_batches_are_replayed_not_lost() -> None:
    torch.manual_seed(0)
    loader = DataLoader(list(range(40)), batch_size=2, shuffle=True, num_workers=2, prefetch_factor=4)
    tap = OrderTap.install(loader)
    it = iter(loader)
    got = [next(it).tolist()]
    assert len(tap.drawn) > 1  # the workers read ahead of the consumer
    it = restart_iterator(loader, tap, 1, old_iterator=it, num_workers=1)
    got += _batches(it)
    assert sorted(i for batch in got for i in batch) == list(range(40))


def test_the_tap_is_transparent_to_code_that_inspects_the_loader() -> None:
    sampler = DistributedSampler(list(range(10)), num_replicas=2, rank=0, shuffle=True, seed=1)
    loader = DataLoader(list(range(10)), batch_size=2, sampler=sampler)
    original = loader.batch_sampler
    tap = OrderTap.install(loader)
    assert loader.batch_sampler is tap and tap.sampler is sampler and len(loader) == 3
    loader.batch_sampler.sampler.set_epoch(4)
    assert OrderTap.install(loader) is tap
    tap.remove(loader)
    assert loader.batch_sampler is original and sampler.epoch == 4
    with pytest.raises(ValueError, match="consumed must be in"):
        tap.resume_after(5)


def test_settings_are_validated_and_applied_without_a_live_iterator() -> None:
    loader = DataLoader(list(range(8)), batch_size=2, num_workers=1, persistent_workers=True)
    it = iter(loader)
    next(it)
    apply_settings(loader, num_workers=2, prefetch_factor=3, persistent_workers=False)
    assert loader._iterator is None and (loader.num_workers, loader.prefetch_factor) == (2, 3)
    assert not loader.persistent_workers
    apply_settings(loader, num_workers=0)
    assert loader.prefetch_factor is None
    with pytest.raises(ValueError, match="cannot change"):
        apply_settings(loader, batch_size=4)
    with pytest.raises(ValueError, match="prefetch_factor"):
        apply_settings(loader, num_workers=1, prefetch_factor=0)


def _tap_holds(batches: int) -> int:
    """Bytes allocated and still held after the tap recorded an epoch of ``batches`` batches of 256 indices."""
    loader = DataLoader(range(batches * 256), batch_size=256, shuffle=True)
    tap = OrderTap.install(loader)
    tracemalloc.start()
    try:
        for _ in iter(loader._index_sampler):
            pass
        held, _ = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert len(tap.drawn) == batches
    return held


def test_the_tap_holds_an_epochs_indices_at_four_bytes_each() -> None:
    # docs/tuning.md: "4 bytes an index". The bytes each further index costs, between epochs of 200 and 1,000
    # batches of 256 (what does not grow with the epoch left out): 4, and a little for the array's growth. Python
    # lists would hold about 40 bytes an index, 8-byte integers 8.
    small, large = _tap_holds(200), _tap_holds(1_000)
    per_index = (large - small) / (800 * 256)
    assert 3.5 <= per_index <= 4.5, f"the tap holds {per_index:.2f} bytes an index"


@pytest.mark.parametrize(
    "items",
    [
        [[4, 1], [2**40, 3], []],  # past 32 bits
        [[1, 2], (3, 4), [5]],  # a tuple among lists
        [[1, np.int64(2)], [3]],  # numpy ints stay numpy ints
        [[True, 0], [1]],
        [torch.tensor([1, 2]), torch.tensor([3])],
        ["a", "b", "c"],  # keys, without automatic batching
        [7, 2, 2**70],
    ],
)
def test_the_record_plays_back_each_item_as_recorded_type_included(items: list) -> None:
    record = IndexRecord()
    for item in items:
        record.append(item)
    for start in range(len(items) + 1):
        got = record.since(start)
        assert len(got) == len(items) - start
        for played, recorded in zip(got, items[start:], strict=True):
            assert type(played) is type(recorded)
            if isinstance(recorded, torch.Tensor):
                assert torch.equal(played, recorded)
            else:
                assert played == recorded
            if isinstance(recorded, list):
                assert [type(v) for v in played] == [type(v) for v in recorded]


def test_a_switch_replays_a_custom_batch_samplers_own_items() -> None:
    class Pairs:
        """A batch sampler yielding tuples of numpy ints, as some bucketing samplers do."""

        def __iter__(self):
            order = torch.randperm(24).tolist()
            return iter(tuple(np.int64(i) for i in order[k : k + 3]) for k in range(0, 24, 3))

        def __len__(self) -> int:
            return 8

    seen: list[type] = []

    class Data(torch.utils.data.Dataset):
        def __getitem__(self, index):
            seen.append(type(index))
            return int(index)

        def __len__(self) -> int:
            return 24

    torch.manual_seed(5)
    expected = [b.tolist() for b in DataLoader(Data(), batch_sampler=Pairs())]
    seen.clear()
    torch.manual_seed(5)
    loader = DataLoader(Data(), batch_sampler=Pairs(), num_workers=0)
    tap = OrderTap.install(loader)
    it = iter(loader)
    got = [next(it).tolist() for _ in range(3)]
    it = restart_iterator(loader, tap, 2, old_iterator=it, num_workers=0)
    got = got[:2] + _batches(it)
    assert got == expected
    assert set(seen) == {np.int64}
