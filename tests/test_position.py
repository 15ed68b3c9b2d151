"""The Lightning-free position core: orders, shards, offsets and re-sharding, checked against full runs."""

from __future__ import annotations

import random

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from loader_fixtures import Alternating, StatefulStream
from torch.utils.data import DataLoader, DistributedSampler, IterableDataset, RandomSampler

from lightning_loadguard.position import (
    ConsumerCursor,
    LoaderPosition,
    PlannedBatchSampler,
    PlannedSampler,
    PositionMismatchError,
    StatefulIterableTap,
    make_resumable,
    planned_sampler,
    reshard_position,
    restart_iterator,
)
from lightning_loadguard.position.plan import seeded_iteration, shard


def _flat(batches: list[torch.Tensor]) -> list[int]:
    return [int(i) for b in batches for i in b]


def test_seeded_iteration_is_reproducible_and_leaves_global_rng_alone() -> None:
    sampler = RandomSampler(range(50))
    torch.manual_seed(123)
    before = torch.rand(1)
    torch.manual_seed(123)
    first = seeded_iteration(sampler, seed=5, epoch=2)
    assert torch.rand(1) == before
    assert first == seeded_iteration(sampler, seed=5, epoch=2)
    assert first != seeded_iteration(sampler, seed=5, epoch=3)
    assert sorted(first) == list(range(50))


def test_seeded_iteration_reseeds_a_sampler_generator_and_restores_it() -> None:
    gen = torch.Generator().manual_seed(1)
    sampler = RandomSampler(range(20), generator=gen)
    state = gen.get_state()
    a = seeded_iteration(sampler, seed=0, epoch=0)
    assert torch.equal(gen.get_state(), state)
    assert a == seeded_iteration(sampler, seed=0, epoch=0)


def test_seeded_iteration_covers_python_random() -> None:
    class PySampler:
        def __iter__(self):
            idx = list(range(30))
            random.shuffle(idx)
            return iter(idx)

    assert seeded_iteration(PySampler(), 1, 4) == seeded_iteration(PySampler(), 1, 4)


def test_each_epochs_order_is_the_sampler_seeded_from_seed_plus_epoch() -> None:
    # docs/resume.md: epoch e's order is the user's sampler iterated with torch's generator seeded from seed + e.
    # The truth is torch's own RandomSampler after torch.manual_seed(seed + e).
    n, seed = 17, 40
    loader = make_resumable(DataLoader(range(n), batch_size=1, shuffle=True), seed=seed)
    planned = planned_sampler(loader)
    orders = []
    for epoch in range(3):
        planned.set_epoch(epoch)
        torch.manual_seed(seed + epoch)
        expected = list(RandomSampler(range(n)))
        orders.append(_flat(list(loader)))
        assert orders[-1] == expected, epoch
    assert orders[0] != orders[1] != orders[2]


class _OwnGenerators:
    """A sampler drawing from generators it keeps as attributes: Python's, numpy's legacy and new, torch's."""

    def __init__(self) -> None:
        import numpy as np

        self.py = random.Random(1)
        self.legacy = np.random.RandomState(2)
        self.rng = np.random.default_rng(3)
        self.gen = torch.Generator().manual_seed(4)

    def __iter__(self):
        order = list(range(24))
        self.py.shuffle(order)
        order = [order[i] for i in self.legacy.permutation(24)]
        order = [order[i] for i in self.rng.permutation(24)]
        return iter([order[i] for i in torch.randperm(24, generator=self.gen).tolist()])


class _Wrapping:
    """A sampler that wraps another (as ``.sampler``) and draws only from that one's generators."""

    def __init__(self) -> None:
        self.sampler = _OwnGenerators()

    def __iter__(self):
        return iter(self.sampler)


def _states(sampler: _OwnGenerators) -> list[object]:
    import numpy as np

    return [
        sampler.py.getstate(),
        repr(sampler.legacy.get_state()),
        repr(sampler.rng.bit_generator.state),
        sampler.gen.get_state().tolist(),
        random.getstate(),
        repr(np.random.get_state()),
        torch.get_rng_state().tolist(),
    ]


@pytest.mark.parametrize("wrapped", [False, True], ids=["own", "on_the_wrapped_sampler"])
def test_seeded_iteration_seeds_every_generator_attribute_and_restores_them(wrapped: bool) -> None:
    # docs/resume.md: a random.Random, RandomState, np.random.Generator or torch.Generator kept by the sampler or
    # by the sampler it wraps is seeded from (seed, epoch), and every state is put back afterwards.
    source = _Wrapping() if wrapped else _OwnGenerators()
    holder = source.sampler if wrapped else source
    before = _states(holder)
    first = seeded_iteration(source, seed=6, epoch=1)
    assert _states(holder) == before
    assert sorted(first) == list(range(24))
    assert first == seeded_iteration(source, seed=6, epoch=1)
    assert first != seeded_iteration(source, seed=6, epoch=2)
    # Not seeded, the same sampler draws another order each pass: the equality above is the seeding's.
    assert list(holder) != list(holder)


def test_a_user_distributed_sampler_is_widened_to_its_whole_permutation() -> None:
    # docs/resume.md: a DistributedSampler built for rank 1 of 2 is widened to its whole permutation first, then
    # sharded as DistributedSampler shards: the truth is torch's own DistributedSampler, for one and two ranks.
    ds = list(range(11))  # odd: the two-rank shards are padded
    user = DistributedSampler(ds, num_replicas=2, rank=1, shuffle=True, seed=5)
    for world, rank in ((1, 0), (2, 0), (2, 1)):
        loader = make_resumable(DataLoader(ds, batch_size=2, sampler=user), seed=0, rank=rank, world_size=world)
        planned = planned_sampler(loader)
        for epoch in (0, 3):
            planned.set_epoch(epoch)
            ref = DistributedSampler(ds, num_replicas=world, rank=rank, shuffle=True, seed=5)
            ref.set_epoch(epoch)
            assert _flat(list(loader)) == list(ref), (world, rank, epoch)
        if world == 1:
            assert sorted(planned.global_order(3)) == ds


def test_shard_matches_distributed_sampler() -> None:
    ds = list(range(23))
    for drop_last in (False, True):
        for world in (1, 2, 3, 4):
            ref = DistributedSampler(ds, num_replicas=world, rank=0, shuffle=True, seed=9, drop_last=drop_last)
            ref.set_epoch(3)
            wide = DistributedSampler(ds, num_replicas=1, rank=0, shuffle=True, seed=9)
            wide.set_epoch(3)
            order = list(wide)
            for rank in range(world):
                ref.rank = rank
                assert shard(order, world, rank, drop_tail=drop_last) == list(ref)


@pytest.mark.parametrize("world", [1, 2, 3])
@pytest.mark.parametrize("drop_last", [False, True])
def test_planned_sampler_offset_equals_tail_of_full_epoch(world: int, drop_last: bool) -> None:
    for rank in range(world):
        s = PlannedSampler(
            RandomSampler(range(29)),
            dataset_len=29,
            batch_size=4,
            seed=3,
            rank=rank,
            world_size=world,
            drop_last=drop_last,
        )
        s.set_epoch(2)
        full = list(s)
        for k in range(s.epoch_batches() + 1):
            s.start_at(epoch=2, batches_consumed=k)
            assert list(s) == full[k * 4 :]
        s.set_epoch(3)
        assert list(s) != full  # a new epoch, a new order


def test_planned_sampler_wraps_a_user_distributed_sampler() -> None:
    user = DistributedSampler(list(range(10)), num_replicas=1, rank=0, shuffle=True, seed=4)
    user.set_epoch(1)
    expected = list(user)
    s = PlannedSampler(user, dataset_len=10, batch_size=2, seed=4)
    s.set_epoch(1)
    assert list(s) == expected


def test_start_offset_only_applies_to_its_epoch() -> None:
    s = PlannedSampler(RandomSampler(range(12)), dataset_len=12, batch_size=3, seed=0)
    s.set_epoch(1)
    full1 = list(s)
    s.start_at(epoch=0, batches_consumed=2)
    s.set_epoch(1)
    assert list(s) == full1


def test_resume_refuses_changed_dataset_and_batch_size() -> None:
    s = PlannedSampler(RandomSampler(range(12)), dataset_len=12, batch_size=3, seed=0)
    pos = s.position(0, 2)
    other = PlannedSampler(RandomSampler(range(13)), dataset_len=13, batch_size=3, seed=0)
    with pytest.raises(PositionMismatchError, match=r"dataset length changed.*12.*13"):
        other.resume(pos)
    other = PlannedSampler(RandomSampler(range(12)), dataset_len=12, batch_size=4, seed=0)
    with pytest.raises(PositionMismatchError, match="batch_size changed"):
        other.resume(pos)
    other = PlannedSampler(RandomSampler(range(12)), dataset_len=12, batch_size=3, seed=0, world_size=2)
    with pytest.raises(PositionMismatchError, match=r"world_size=1.*world_size=2"):
        other.resume(pos)


def test_state_versions_and_fields_are_checked() -> None:
    pos = LoaderPosition(epoch=1, batches_consumed=2, seed=1, dataset_len=4, batch_size=2)
    assert LoaderPosition.from_state_dict(pos.state_dict()) == pos
    bad = pos.state_dict() | {"version": 99}
    with pytest.raises(PositionMismatchError, match="version 99"):
        LoaderPosition.from_state_dict(bad)
    with pytest.raises(PositionMismatchError, match=r"unknown fields.*'bogus'"):
        LoaderPosition.from_state_dict(pos.state_dict() | {"bogus": 1})
    with pytest.raises(ValueError, match="batches_consumed must be >= 0"):
        LoaderPosition(batches_consumed=-1)


def _rank_layouts(n: int, b: int, world: int, seed: int, epoch: int, pos: LoaderPosition | None, drop_last: bool):
    out = []
    for rank in range(world):
        s = PlannedSampler(
            RandomSampler(range(n)),
            dataset_len=n,
            batch_size=b,
            seed=seed,
            rank=rank,
            world_size=world,
            drop_last=drop_last,
        )
        s.set_epoch(epoch)
        if pos is not None:
            s.resume(pos)
        idx = list(s)
        cut = len(idx) // b * b if drop_last else len(idx)
        out.append(idx[:cut])
    return out


@settings(max_examples=60, deadline=None)
@given(
    n=st.integers(1, 60),
    b=st.integers(1, 7),
    old=st.integers(1, 4),
    new=st.integers(1, 4),
    frac=st.floats(0, 1),
)
def test_reshard_covers_the_rest_of_the_epoch_exactly_once(n: int, b: int, old: int, new: int, frac: float) -> None:
    seed, epoch = 11, 2
    probe = PlannedSampler(RandomSampler(range(n)), dataset_len=n, batch_size=b, seed=seed, world_size=old)
    k = int(frac * probe.epoch_batches())
    probe.set_epoch(epoch)
    pos = probe.position(epoch, k)
    order = probe.global_order(epoch)
    consumed = [i for r in _rank_layouts(n, b, old, seed, epoch, None, False) for i in r[: k * b]]
    moved = reshard_position(pos, new)
    rest = [i for r in _rank_layouts(n, b, new, seed, epoch, moved, False) for i in r]
    # What the old ranks consumed is a prefix of the global order (padding aside, which repeats the order's
    # start as DistributedSampler does); the new ranks get exactly the real samples after it.
    prefix = min(n, min(k * b, -(-n // old)) * old)
    assert set(consumed) == set(order[:prefix])
    unseen = set(order[prefix:])
    assert unseen <= set(rest)
    repeated = [i for i in rest if i not in unseen]
    assert len(repeated) < new  # at most the padding that evens out the ranks
    if (n - prefix) % new == 0:
        assert sorted(rest) == sorted(order[prefix:])
    # The trainer's count ends exactly at the epoch's length when the new layout runs out.
    probe_new = PlannedSampler(RandomSampler(range(n)), dataset_len=n, batch_size=b, seed=seed, world_size=new)
    per_rank = len(_rank_layouts(n, b, new, seed, epoch, moved, False)[0])
    assert moved.batches_consumed + -(-per_rank // b) == probe_new.epoch_batches()
    assert len({len(r) for r in _rank_layouts(n, b, new, seed, epoch, moved, False)}) == 1


def test_reshard_two_to_one_continues_with_the_unseen_samples() -> None:
    n, b = 40, 4
    two = [
        PlannedSampler(RandomSampler(range(n)), dataset_len=n, batch_size=b, seed=0, rank=r, world_size=2)
        for r in range(2)
    ]
    seen = [i for s in two for i in list(s)[: 3 * b]]
    moved = reshard_position(two[0].position(0, 3), 1)
    one = PlannedSampler(RandomSampler(range(n)), dataset_len=n, batch_size=b, seed=0)
    one.resume(moved)
    rest = list(one)
    assert sorted(seen + rest) == list(range(n))
    assert moved.batches_consumed == 10 - len(rest) // b


def test_reshard_refuses_a_custom_batch_sampler_position() -> None:
    pos = LoaderPosition(epoch=0, batches_consumed=1, world_size=1)
    with pytest.raises(PositionMismatchError, match="world_size=1 to 2"):
        reshard_position(pos, 2)


def test_planned_batch_sampler_skips_consumed_batches() -> None:
    s = PlannedBatchSampler(Alternating(RandomSampler(range(11)), 2, False), seed=2)
    s.set_epoch(1)
    full = list(s)
    assert sorted(i for bt in full for i in bt) == list(range(11))
    for k in range(len(full) + 1):
        s.start_at(1, k)
        assert list(s) == full[k:]


@pytest.mark.parametrize("workers_before,workers_after", [(0, 2), (2, 0)])
def test_restart_changes_workers_without_skipping(workers_before: int, workers_after: int) -> None:
    ds = list(range(30))
    loader = make_resumable(DataLoader(ds, batch_size=4, shuffle=True, num_workers=workers_before), seed=7)
    full = _flat(list(loader))
    it = iter(loader)
    cursor = ConsumerCursor()
    got = []
    for _ in range(3):
        got.append(next(it))  # the workers have read further ahead than this
        cursor.consumed()
    order = planned_sampler(loader)
    it = restart_iterator(loader, order, cursor.batches, old_iterator=it, num_workers=workers_after, pin_memory=False)
    got.extend(it)
    assert _flat(got) == full
    assert loader.num_workers == workers_after


def test_restart_of_persistent_workers() -> None:
    loader = make_resumable(
        DataLoader(list(range(20)), batch_size=2, shuffle=True, num_workers=1, persistent_workers=True), seed=1
    )
    full = _flat(list(loader))
    it = iter(loader)
    first = [next(it) for _ in range(4)]
    rest = list(restart_iterator(loader, planned_sampler(loader), 4, old_iterator=it, num_workers=2, prefetch_factor=3))
    assert _flat(first + rest) == full


def test_restart_rejects_settings_torch_cannot_change() -> None:
    loader = make_resumable(DataLoader(list(range(8)), batch_size=2), seed=0)
    order = planned_sampler(loader)
    with pytest.raises(ValueError, match=r"cannot change \['batch_size'\]"):
        restart_iterator(loader, order, 1, batch_size=4)
    with pytest.raises(ValueError, match="num_workers must be an integer >= 0"):
        restart_iterator(loader, order, 1, num_workers=-1)
    with pytest.raises(ValueError, match="consumed must be >= 0"):
        restart_iterator(loader, order, -1)
    with pytest.raises(TypeError, match="make_resumable"):
        planned_sampler(DataLoader(list(range(8))))
    with pytest.raises(TypeError, match="OrderTap installed on the loader or its planned_sampler"):
        restart_iterator(loader, loader.batch_sampler, 1)  # type: ignore[arg-type]


def test_resume_iterator_of_0_1_0_still_works_with_a_warning() -> None:
    import lightning_loadguard.position as position

    loader = make_resumable(DataLoader(list(range(12)), batch_size=3, shuffle=True), seed=2)
    full = _flat(list(loader))
    with pytest.warns(DeprecationWarning, match="restart_iterator"):
        resume_iterator = position.resume_iterator
    assert _flat(list(resume_iterator(loader, 2, epoch=0, num_workers=0))) == full[6:]


def test_make_resumable_refuses_what_it_cannot_make_exact() -> None:
    class Plain(IterableDataset):
        def __iter__(self):
            return iter(range(4))

    with pytest.raises(TypeError, match="without state_dict"):
        make_resumable(DataLoader(Plain()), seed=0)
    with pytest.raises(ValueError, match=r"custom batch sampler.*world_size=2"):
        make_resumable(DataLoader(list(range(8)), batch_sampler=Alternating(range(8), 2, False)), seed=0, world_size=2)

    class Sub(DataLoader):
        pass

    with pytest.raises(TypeError, match=r"got .*Sub"):
        make_resumable(Sub(list(range(4))), seed=0)


def test_stateful_tap_state_follows_the_consumer_not_the_producer() -> None:
    stream = StatefulStream(10)
    order = [i for i, _ in StatefulStream(10)]
    tap = StatefulIterableTap(stream, batch_size=3)
    it = iter(tap)
    for _ in range(8):  # the producer is two samples into batch 3
        next(it)
    assert tap.state_at(2) == {"pos": 6, "epoch": 0}
    tap2 = StatefulIterableTap(StatefulStream(10), batch_size=3)
    tap2.resume(tap.state_at(2), batches_consumed=2)
    assert [i for i, _ in tap2] == order[6:]
    assert tap2.state_at(3) == {"pos": 9, "epoch": 0}
    assert tap2.final_state == {"pos": 0, "epoch": 1}
    with pytest.raises(PositionMismatchError, match="after 9 batches"):
        tap.state_at(9)


@pytest.mark.parametrize("n", [12, 11], ids=["full_last_batch", "partial_last_batch"])
def test_stateful_tap_state_after_the_last_batch_starts_the_next_epoch(n: int) -> None:
    # A full last batch's boundary is recorded before the stream notices its end; once the iteration is over,
    # the state after that batch must be the next epoch's start, not "epoch 0, exhausted".
    tap = StatefulIterableTap(StatefulStream(n), batch_size=3)
    assert len(list(tap)) == n
    assert tap.state_at(4) == tap.final_state == {"pos": 0, "epoch": 1}
    assert tap.state_at(3) == {"pos": 9, "epoch": 0}
    next_epoch = StatefulStream(n)
    next_epoch.epoch = 1
    tap2 = StatefulIterableTap(StatefulStream(n), batch_size=3)
    tap2.resume(tap.state_at(4), batches_consumed=4)
    assert [i for i, _ in tap2] == [i for i, _ in next_epoch]


def test_stateful_tap_refuses_workers() -> None:
    with pytest.raises(ValueError, match="num_workers=2"):
        make_resumable(DataLoader(StatefulStream(4), batch_size=2, num_workers=2), seed=0)


def test_cursor_state_round_trip_and_version() -> None:
    c = ConsumerCursor()
    c.start_epoch(3)
    c.consumed(4)
    d = ConsumerCursor()
    d.load_state_dict(c.state_dict())
    assert (d.epoch, d.batches) == (3, 4)
    with pytest.raises(PositionMismatchError, match="version 0"):
        d.load_state_dict({"epoch": 1, "batches": 1, "version": 0})
