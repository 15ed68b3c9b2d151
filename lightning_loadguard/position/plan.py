"""Epoch-deterministic orders and their shards: pure functions of (seed, epoch, layout), no torch loaders.

The global order of an epoch is a list of dataset indices. A world of ``W`` ranks shards it the way
``torch.utils.data.DistributedSampler`` does: pad (or cut) it to a multiple of ``W`` and give rank ``r`` the
positions ``r, r + W, r + 2W, ...``. Because ranks step in lock-step, after ``k`` batches of ``B`` samples on
every rank the consumed part of the epoch is exactly the first ``k * B * W`` positions of the global order,
so the rest can be handed to any other number of ranks without a sample seen twice or missed.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Iterable, Sequence
from typing import Any, TypeVar

import torch

T = TypeVar("T")

_SEED_MODULUS = 2**63


def epoch_seed(seed: int, epoch: int) -> int:
    """The seed of one epoch's order, ``seed + epoch`` as ``DistributedSampler`` uses it.

    Example:
        >>> epoch_seed(10, 3)
        13
    """
    if epoch < 0:
        raise ValueError(f"epoch must be >= 0, got {epoch}")
    return (seed + epoch) % _SEED_MODULUS


def seeded_iteration(source: Iterable[T], seed: int, epoch: int) -> list[T]:
    """Iterate ``source`` once with every random state it may draw from fixed by ``(seed, epoch)``.

    Samplers draw their randomness from torch's global generator (``RandomSampler`` without a generator),
    from their own ``generator`` attribute, or from Python's ``random``. All three are seeded from
    ``epoch_seed(seed, epoch)`` for the duration of the iteration and restored afterwards, so the caller's
    random streams are untouched and the same ``(seed, epoch)`` yields the same list in any process.
    ``set_epoch(epoch)`` is called first when the source has it (``DistributedSampler``).

    Example:
        >>> from torch.utils.data import RandomSampler
        >>> s = RandomSampler(range(6))
        >>> seeded_iteration(s, seed=1, epoch=0) == seeded_iteration(s, seed=1, epoch=0)
        True
    """
    set_epoch: Callable[[int], Any] | None = getattr(source, "set_epoch", None)
    if callable(set_epoch):
        set_epoch(epoch)
    derived = epoch_seed(seed, epoch)
    own = getattr(source, "generator", None)
    own_state = own.get_state() if isinstance(own, torch.Generator) else None
    py_state = random.getstate()
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(derived)
        random.seed(derived)
        if isinstance(own, torch.Generator):
            own.manual_seed(derived)
        try:
            return list(source)
        finally:
            random.setstate(py_state)
            if isinstance(own, torch.Generator) and own_state is not None:
                own.set_state(own_state)


def pad_to_world(order: Sequence[T], world_size: int, drop_tail: bool) -> list[T]:
    """Make ``len(order)`` a multiple of ``world_size`` as ``DistributedSampler`` does.

    With ``drop_tail`` the tail is cut; otherwise the order is extended with its own beginning (repeated
    as often as needed), so every rank gets the same number of samples.

    Example:
        >>> pad_to_world([5, 6, 7], 2, drop_tail=False)
        [5, 6, 7, 5]
        >>> pad_to_world([5, 6, 7], 2, drop_tail=True)
        [5, 6]
    """
    if world_size < 1:
        raise ValueError(f"world_size must be >= 1, got {world_size}")
    n = len(order)
    if drop_tail:
        return list(order[: (n // world_size) * world_size])
    total = math.ceil(n / world_size) * world_size
    padded = list(order)
    while len(padded) < total and n > 0:
        padded.extend(order[: total - len(padded)])
    return padded


def shard(order: Sequence[T], world_size: int, rank: int, drop_tail: bool = False) -> list[T]:
    """Rank ``rank``'s part of ``order``: positions ``rank, rank + W, ...`` of the padded order.

    Example:
        >>> shard(list(range(10)), world_size=3, rank=1)
        [1, 4, 7, 0]
    """
    if not 0 <= rank < world_size:
        raise ValueError(f"rank must be in [0, world_size={world_size}), got {rank}")
    return pad_to_world(order, world_size, drop_tail)[rank::world_size]


def shard_len(n: int, world_size: int, drop_tail: bool = False) -> int:
    """``len(shard(...))`` for an order of length ``n``, without building it."""
    return n // world_size if drop_tail else math.ceil(n / world_size)


def batch_count(samples: int, batch_size: int, drop_last: bool) -> int:
    """Batches a loader makes from ``samples`` samples.

    Example:
        >>> batch_count(10, 4, drop_last=False), batch_count(10, 4, drop_last=True)
        (3, 2)
    """
    return samples // batch_size if drop_last else math.ceil(samples / batch_size)


def consumed_prefix(
    epoch_origin: int, layout_batches: int, batch_size: int, world_size: int, n: int, drop_tail: bool
) -> int:
    """Positions of the epoch's global order that every rank together has consumed.

    ``layout_batches`` batches of ``batch_size`` on each of ``world_size`` ranks cover the first
    ``layout_batches * batch_size * world_size`` positions of the order that follows ``epoch_origin``;
    positions past the real order (padding) are not counted, so the result never exceeds ``n``.

    Example:
        >>> consumed_prefix(0, 3, 4, 2, n=40, drop_tail=False)
        24
    """
    remaining = n - epoch_origin
    per_rank = shard_len(remaining, world_size, drop_tail)
    taken = min(layout_batches * batch_size, per_rank) * world_size
    return min(n, epoch_origin + taken)


def reshard_batches(
    *,
    n: int,
    consumed: int,
    batch_size: int,
    drop_last: bool,
    world_size: int,
    drop_tail: bool = False,
) -> tuple[int, int]:
    """For a new world size: batches per rank of a whole epoch, and of what is left after ``consumed``.

    Returns ``(epoch_batches, remaining_batches)``; the difference is where the trainer's batch count must
    stand so that it reaches the epoch's length exactly when the remaining samples run out.

    Example:
        >>> reshard_batches(n=40, consumed=16, batch_size=4, drop_last=False, world_size=2)
        (5, 3)
    """
    if not 0 <= consumed <= n:
        raise ValueError(f"consumed must be in [0, n={n}], got {consumed}")
    epoch_batches = batch_count(shard_len(n, world_size, drop_tail), batch_size, drop_last)
    remaining = batch_count(shard_len(n - consumed, world_size, drop_tail), batch_size, drop_last)
    return epoch_batches, min(epoch_batches, remaining)
