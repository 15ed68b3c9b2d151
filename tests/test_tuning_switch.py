"""Switching a plain DataLoader's worker settings mid-epoch keeps its own order and the global random stream."""

from __future__ import annotations

import pytest
import torch
from torch.utils.data import DataLoader, DistributedSampler

from lightning_loadguard.position.switch import OrderTap, apply_settings, restart_iterator


def _batches(iterator) -> list[list[int]]:
    return [b.tolist() for b in iterator]


def _reference(**kwargs) -> tuple[list[list[int]], list[list[int]], torch.Tensor]:
    torch.manual_seed(3)
    loader = DataLoader(list(range(60)), batch_size=4, shuffle=True, **kwargs)
    first, second = _batches(loader), _batches(loader)
    return first, second, torch.rand(3)


@pytest.mark.parametrize("start_workers", [0, 2])
def test_switches_keep_the_order_and_the_next_epochs(start_workers: int) -> None:
    first, second, after = _reference(num_workers=start_workers)
    torch.manual_seed(3)
    loader = DataLoader(list(range(60)), batch_size=4, shuffle=True, num_workers=start_workers)
    tap = OrderTap.install(loader)
    it = iter(loader)
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
