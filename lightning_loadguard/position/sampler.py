"""Samplers that replay an epoch-deterministic order from any consumed-batch offset.

Both samplers materialise the epoch's index order (integers only: no sample is read), so starting at 90 %
of an epoch costs what starting at 0 % costs.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable, Iterator, Sequence

from torch.utils.data import DistributedSampler, Sampler

from lightning_loadguard.position.cursor import EpochCursor
from lightning_loadguard.position.plan import (
    batch_count,
    consumed_prefix,
    reproducible_iteration,
    reshard_batches,
    seeded_iteration,
    shard,
    shard_len,
)
from lightning_loadguard.position.state import LoaderPosition, PositionMismatchError


def _global_source(sampler: Iterable[int]) -> Iterable[int]:
    """The single-process view of a sampler: a ``DistributedSampler`` is widened to the whole permutation.

    Its own sharding is redone by :func:`shard` (same padding rule), so the permutation is what must be
    shared between world sizes, not one rank's slice of it.
    """
    if isinstance(sampler, DistributedSampler) and not isinstance(sampler, PlannedSampler):
        wide = copy.copy(sampler)
        wide.num_replicas = 1
        wide.rank = 0
        wide.drop_last = False
        wide.num_samples = len(wide.dataset)  # type: ignore[arg-type]
        wide.total_size = wide.num_samples
        return wide
    return sampler


class PlannedSampler(DistributedSampler):  # type: ignore[type-arg]
    """A rank's share of an epoch-deterministic order, starting after the consumed batches.

    The global order of epoch ``e`` is ``source`` iterated once with its randomness seeded from
    ``(seed, e)`` (see :func:`~lightning_loadguard.position.plan.seeded_iteration`); a ``DistributedSampler``
    source is widened to its whole permutation first. Rank ``rank`` of ``world_size`` gets every
    ``world_size``-th position of it. ``__len__`` is always a whole epoch's share, so a loader's length does
    not change when it starts mid-epoch; only the iteration is shorter.

    It subclasses ``DistributedSampler`` because it already is one: frameworks that inject their own
    distributed sampler (Lightning's ``use_distributed_sampler``) leave it in place.

    Args:
        source: The sampler (or any iterable of dataset indices) that defines the global order.
        dataset_len: Length of the dataset the indices refer to.
        batch_size: Samples per batch, to turn a consumed-batch count into a sample offset.
        seed: Base seed of the epoch orders.
        rank: This process's rank.
        world_size: Number of ranks.
        drop_tail: Cut the order to a multiple of ``world_size`` instead of padding it.
        drop_last: The loader's ``drop_last`` (only used to count batches).

    Example:
        >>> from torch.utils.data import RandomSampler
        >>> s = PlannedSampler(RandomSampler(range(8)), dataset_len=8, batch_size=2, seed=0)
        >>> full = list(s)
        >>> s.start_at(epoch=0, batches_consumed=3)
        >>> list(s) == full[6:]
        True
    """

    def __init__(
        self,
        source: Iterable[int],
        *,
        dataset_len: int,
        batch_size: int,
        seed: int,
        rank: int = 0,
        world_size: int = 1,
        drop_tail: bool = False,
        drop_last: bool = False,
    ) -> None:
        # DistributedSampler.__init__ would query torch.distributed; the fields it defines are set here.
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        if world_size < 1 or not 0 <= rank < world_size:
            raise ValueError(f"rank must be in [0, world_size={world_size}), got rank={rank}")
        if dataset_len < 0:
            raise ValueError(f"dataset_len must be >= 0, got {dataset_len}")
        self.source = _global_source(source)
        self.dataset_len = dataset_len
        self.batch_size = batch_size
        self.seed = seed
        self.rank = rank
        self.num_replicas = world_size
        self.drop_tail = drop_tail
        self.drop_last = drop_last
        self.shuffle = True
        self.epoch = 0
        self.num_samples = shard_len(dataset_len, world_size, drop_tail)
        self.total_size = self.num_samples * world_size
        self.cursor: EpochCursor | None = None
        self._start: LoaderPosition | None = None
        self._cache: tuple[int, list[int]] | None = None
        self._proven = False

    @property
    def world_size(self) -> int:
        return self.num_replicas

    def set_epoch(self, epoch: int) -> None:
        """Select the epoch the next iteration plays (frameworks call this at every epoch start)."""
        if epoch < 0:
            raise ValueError(f"epoch must be >= 0, got {epoch}")
        self.epoch = epoch

    def start_at(self, epoch: int, batches_consumed: int) -> None:
        """Make the next iteration play ``epoch`` from right after ``batches_consumed`` batches."""
        self.resume(self.position(epoch=epoch, batches_consumed=batches_consumed))

    def resume(self, position: LoaderPosition) -> None:
        """Make the next iteration continue ``position`` (possibly taken under another world size).

        Raises:
            PositionMismatchError: the position was taken over a dataset of another length, with another
                batch size or ``drop_last``, or it uses a layout this world size cannot continue.
        """
        if position.dataset_len is not None and position.dataset_len != self.dataset_len:
            raise PositionMismatchError(
                f"dataset length changed: the position was taken over {position.dataset_len} samples, "
                f"the dataset now has {self.dataset_len}"
            )
        if position.batch_size is not None and position.batch_size != self.batch_size:
            raise PositionMismatchError(
                f"batch_size changed: the position counts batches of {position.batch_size}, "
                f"the loader now makes batches of {self.batch_size}"
            )
        if position.drop_last != self.drop_last:
            raise PositionMismatchError(
                f"drop_last changed from {position.drop_last} to {self.drop_last}: the remaining batches "
                "of the epoch would not match the stored count"
            )
        if position.drop_tail != self.drop_tail:
            raise PositionMismatchError(
                f"the sampler's drop_last changed from {position.drop_tail} to {self.drop_tail}"
            )
        if position.world_size != self.world_size:
            raise PositionMismatchError(
                f"the position was taken with world_size={position.world_size}, this sampler has "
                f"world_size={self.world_size}; convert it with reshard_position() first"
            )
        self.epoch = position.epoch
        self._start = position
        self.seed = position.seed

    def global_order(self, epoch: int) -> list[int]:
        """The whole epoch's index order before sharding (cached for the last epoch asked)."""
        if self._cache is None or self._cache[0] != epoch:
            # The first order a sampler makes is drawn twice: a source that cannot be seeded is refused
            # before the first batch instead of resuming into another order.
            draw = seeded_iteration if self._proven else reproducible_iteration
            order = [int(i) for i in draw(self.source, self.seed, epoch)]
            self._proven = True
            bad = next((i for i in order if not 0 <= i < self.dataset_len), None)
            if bad is not None:
                raise PositionMismatchError(
                    f"the sampler yielded index {bad}, outside the dataset of length {self.dataset_len}"
                )
            self._cache = (epoch, order)
        return self._cache[1]

    def layout(self, epoch: int, epoch_origin: int = 0) -> list[int]:
        """This rank's indices of ``epoch`` once ``epoch_origin`` positions of the global order are gone."""
        order = self.global_order(epoch)
        return shard(order[epoch_origin:], self.world_size, self.rank, self.drop_tail)

    def position(self, epoch: int, batches_consumed: int) -> LoaderPosition:
        """The position after ``batches_consumed`` batches of ``epoch`` in this sampler's current layout."""
        base = self._start if self._start is not None and self._start.epoch == epoch else None
        origin = base.epoch_origin if base else 0
        origin_batches = base.origin_batches if base else 0
        if batches_consumed < origin_batches:
            raise ValueError(f"batches_consumed={batches_consumed} is before the layout's start ({origin_batches})")
        layout_len = shard_len(self.dataset_len - origin, self.world_size, self.drop_tail)
        samples = min((batches_consumed - origin_batches) * self.batch_size, layout_len)
        return LoaderPosition(
            epoch=epoch,
            batches_consumed=batches_consumed,
            samples_consumed=samples,
            seed=self.seed,
            dataset_len=self.dataset_len,
            batch_size=self.batch_size,
            drop_last=self.drop_last,
            drop_tail=self.drop_tail,
            world_size=self.world_size,
            epoch_origin=origin,
            origin_batches=origin_batches,
        )

    def epoch_batches(self) -> int:
        """Batches per rank in a whole epoch (what a loader over this sampler reports as its length)."""
        return batch_count(self.num_samples, self.batch_size, self.drop_last)

    def __iter__(self) -> Iterator[int]:
        if self.cursor is not None:
            # The cursor, not the loop's set_epoch(), says which epoch is played and from where.
            self.epoch, batches = self.cursor.position
            base = self._start if self._start is not None and self._start.epoch == self.epoch else None
            origin, origin_batches = (base.epoch_origin, base.origin_batches) if base else (0, 0)
            return iter(self.layout(self.epoch, origin)[(batches - origin_batches) * self.batch_size :])
        start, self._start = self._start, None
        if start is not None and start.epoch == self.epoch:
            # Keep the layout's origin for position() until the epoch changes.
            self._start = start
            indices = self.layout(self.epoch, start.epoch_origin)
            return iter(indices[start.layout_batches * self.batch_size :])
        return iter(self.layout(self.epoch))

    def __len__(self) -> int:
        return self.num_samples


class _EpochRelay:
    """Forwards ``set_epoch`` to a batch plan.

    Lightning (and other loops) call ``set_epoch`` on ``loader.sampler`` and ``loader.batch_sampler.sampler``
    only, never on the batch sampler itself.
    """

    def __init__(self, owner: PlannedBatchSampler) -> None:
        self._owner = owner

    def set_epoch(self, epoch: int) -> None:
        self._owner.set_epoch(epoch)


class PlannedBatchSampler(Sampler[list[int]]):
    """A custom batch sampler replayed from a consumed-batch offset (single process only).

    The user's batch sampler is iterated once per epoch with its randomness seeded from ``(seed, epoch)``;
    iteration then skips the consumed batches without loading them. Batches may have any size.

    Example:
        >>> from torch.utils.data import BatchSampler, RandomSampler
        >>> class Pairs(BatchSampler): ...
        >>> s = PlannedBatchSampler(Pairs(RandomSampler(range(6)), 2, False), seed=3)
        >>> full = list(s)
        >>> s.start_at(epoch=0, batches_consumed=2)
        >>> list(s) == full[2:]
        True
    """

    def __init__(self, source: Iterable[Sequence[int]], *, seed: int) -> None:
        self.source = source
        self.seed = seed
        self.epoch = 0
        self.sampler = _EpochRelay(self)
        self.cursor: EpochCursor | None = None
        self._skip: tuple[int, int] | None = None
        self._cache: tuple[int, list[list[int]]] | None = None
        self._proven = False

    def set_epoch(self, epoch: int) -> None:
        """Select the epoch the next iteration plays."""
        if epoch < 0:
            raise ValueError(f"epoch must be >= 0, got {epoch}")
        self.epoch = epoch

    def start_at(self, epoch: int, batches_consumed: int) -> None:
        """Make the next iteration play ``epoch`` from right after ``batches_consumed`` batches."""
        if batches_consumed < 0:
            raise ValueError(f"batches_consumed must be >= 0, got {batches_consumed}")
        self.epoch = epoch
        self._skip = (epoch, batches_consumed)

    def batches(self, epoch: int) -> list[list[int]]:
        """The whole epoch's batches (cached for the last epoch asked)."""
        if self._cache is None or self._cache[0] != epoch:
            draw = seeded_iteration if self._proven else reproducible_iteration
            self._cache = (epoch, [list(b) for b in draw(self.source, self.seed, epoch)])
            self._proven = True
        return self._cache[1]

    def samples_in(self, epoch: int, batches_consumed: int) -> int:
        return sum(len(b) for b in self.batches(epoch)[:batches_consumed])

    def __iter__(self) -> Iterator[list[int]]:
        if self.cursor is not None:
            self.epoch, batches = self.cursor.position
            return iter(self.batches(self.epoch)[batches:])
        skip, self._skip = self._skip, None
        offset = skip[1] if skip is not None and skip[0] == self.epoch else 0
        return iter(self.batches(self.epoch)[offset:])

    def __len__(self) -> int:
        return len(self.source)  # type: ignore[arg-type]


def reshard_position(position: LoaderPosition, world_size: int) -> LoaderPosition:
    """Continue ``position`` with ``world_size`` ranks: the unconsumed rest of the epoch, exactly once.

    The samples all ranks consumed form a prefix of the epoch's global order; it becomes the new
    ``epoch_origin`` and the rest is sharded over the new ranks. ``batches_consumed`` is moved to where a
    whole epoch's batch count minus the remaining batches puts it, so a trainer that counts batches to the
    epoch's end stops exactly when the remaining samples run out. Subsequent epochs use the plain layout.

    Raises:
        PositionMismatchError: the position has no dataset length or batch size (an iterable dataset or a
            custom batch sampler), whose consumed part is not a prefix of a shardable order.

    Example:
        >>> p = LoaderPosition(epoch=1, batches_consumed=2, seed=0, dataset_len=40, batch_size=4, world_size=2)
        >>> q = reshard_position(p, world_size=1)
        >>> q.epoch_origin, q.batches_consumed, q.world_size
        (16, 4, 1)
    """
    if world_size < 1:
        raise ValueError(f"world_size must be >= 1, got {world_size}")
    if world_size == position.world_size:
        return position
    if position.dataset_len is None or position.batch_size is None:
        raise PositionMismatchError(
            f"cannot move a position from world_size={position.world_size} to {world_size}: only a map-style "
            "dataset batched with a fixed batch_size has a consumed part that other ranks can take over"
        )
    n = position.dataset_len
    consumed = consumed_prefix(
        position.epoch_origin,
        position.layout_batches,
        position.batch_size,
        position.world_size,
        n,
        drop_tail=position.drop_tail,
    )
    epoch_batches, remaining = reshard_batches(
        n=n,
        consumed=consumed,
        batch_size=position.batch_size,
        drop_last=position.drop_last,
        world_size=world_size,
        drop_tail=position.drop_tail,
    )
    start = epoch_batches - remaining
    return position.evolve(
        world_size=world_size,
        epoch_origin=consumed,
        origin_batches=start,
        batches_consumed=start,
        samples_consumed=0,
    )
