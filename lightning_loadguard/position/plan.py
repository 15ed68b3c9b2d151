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
import sys
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


def _random_states(obj: object) -> list[Any]:
    """Random generators ``obj`` holds as attributes (its own, and those of a wrapped ``sampler``)."""
    found: dict[int, Any] = {}
    holders = [obj]
    inner = getattr(obj, "sampler", None)
    if inner is not None and inner is not obj:
        holders.append(inner)
    for holder in holders:
        for value in getattr(holder, "__dict__", {}).values():
            if isinstance(value, (torch.Generator, random.Random)) or _is_numpy_random(value):
                found[id(value)] = value
    return list(found.values())


def _is_numpy_random(value: object) -> bool:
    np = sys.modules.get("numpy")
    return np is not None and isinstance(value, (np.random.Generator, np.random.RandomState))


def _save_state(gen: Any) -> Any:
    if isinstance(gen, torch.Generator):
        return gen.get_state()
    if isinstance(gen, random.Random):
        return gen.getstate()
    if hasattr(gen, "bit_generator"):  # numpy Generator
        return gen.bit_generator.state
    return gen.get_state()  # numpy RandomState


def _seed(gen: Any, derived: int) -> None:
    if isinstance(gen, torch.Generator):
        gen.manual_seed(derived)
    elif isinstance(gen, random.Random):
        gen.seed(derived)
    elif hasattr(gen, "bit_generator"):
        gen.bit_generator.state = type(gen.bit_generator)(derived).state
    else:
        gen.seed(derived % 2**32)


def _restore_state(gen: Any, state: Any) -> None:
    if isinstance(gen, torch.Generator):
        gen.set_state(state)
    elif isinstance(gen, random.Random):
        gen.setstate(state)
    elif hasattr(gen, "bit_generator"):
        gen.bit_generator.state = state
    else:
        gen.set_state(state)


def seeded_iteration(source: Iterable[T], seed: int, epoch: int) -> list[T]:
    """Iterate ``source`` once with every random state it may draw from fixed by ``(seed, epoch)``.

    Samplers draw their randomness from torch's global generator (``RandomSampler`` without a generator),
    Python's ``random``, numpy's global ``np.random`` (which ``seed_everything`` seeds), or a generator they
    hold as an attribute (a ``torch.Generator``, ``random.Random``, ``np.random.Generator`` or
    ``RandomState``, on the sampler or on the ``sampler`` it wraps). All of them are seeded from
    ``epoch_seed(seed, epoch)`` for the duration of the iteration and restored afterwards, so the caller's
    random streams (and a sampler's own generator) are untouched and the same ``(seed, epoch)`` yields the
    same list in any process. ``set_epoch(epoch)`` is called first when the source has it
    (``DistributedSampler``). A source drawing from anything else is caught by :func:`reproducible_iteration`.

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
    owned = _random_states(source)
    saved = [_save_state(gen) for gen in owned]
    py_state = random.getstate()
    np = sys.modules.get("numpy")
    np_state = np.random.get_state() if np is not None else None
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(derived)
        random.seed(derived)
        if np is not None:
            np.random.seed(derived % 2**32)
        for gen in owned:
            _seed(gen, derived)
        try:
            return list(source)
        finally:
            random.setstate(py_state)
            if np is not None:
                np.random.set_state(np_state)
            for gen, state in zip(owned, saved, strict=True):
                _restore_state(gen, state)


class NonReproducibleOrderError(ValueError):
    """A sampler's order for one ``(seed, epoch)`` changes from one iteration to the next.

    A ``ValueError``, raised before the first step by :class:`~lightning_loadguard.ResumableLoaderMixin`: a
    resumed epoch could not continue such an order, so the run is refused rather than resumed onto other
    samples. The message names the sampler and the fix.

    Example:
        >>> import random
        >>> class Shuffled:
        ...     def __iter__(self): return iter(random.Random().sample(range(100), 100))
        >>> try:
        ...     reproducible_iteration(Shuffled(), seed=0, epoch=0)
        ... except NonReproducibleOrderError as err:
        ...     print(err)  # doctest: +ELLIPSIS
        Shuffled gave two different orders for the same seed and epoch (...
    """


def reproducible_iteration(source: Iterable[T], seed: int, epoch: int) -> list[T]:
    """:func:`seeded_iteration`, drawn twice: the order, proven to be a function of ``(seed, epoch)``.

    Raises:
        NonReproducibleOrderError: the two draws differ, so the order depends on something that is not
            seeded (an unseeded generator made inside ``__iter__``, a nested generator, a counter the
            sampler advances itself, the clock); a resumed epoch could not continue it.

    Example:
        >>> import itertools
        >>> class Counter:
        ...     def __init__(self): self.calls = itertools.count()
        ...     def __iter__(self): return iter([next(self.calls), 9])
        >>> reproducible_iteration(Counter(), seed=0, epoch=0)  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        lightning_loadguard.position.plan.NonReproducibleOrderError: Counter gave two different orders ...
    """
    first = seeded_iteration(source, seed, epoch)
    again = seeded_iteration(source, seed, epoch)
    if first != again:
        if len(first) == len(again):
            at = next(i for i, (a, b) in enumerate(zip(first, again, strict=True)) if a != b)
            where = f"they differ at position {at}"
        else:
            where = f"lengths {len(first)} and {len(again)}"
        raise NonReproducibleOrderError(
            f"{type(source).__qualname__} gave two different orders for the same seed and epoch ({where}): "
            "its randomness comes from something ResumableLoaderMixin cannot seed, so a resumed epoch would "
            "not continue the interrupted one. Fix: draw from torch's or Python's global generator, from "
            "numpy's np.random, or from a generator kept as an attribute of the sampler (torch.Generator, "
            "random.Random, np.random.Generator or RandomState), or derive the order from the epoch given to "
            "set_epoch()"
        )
    return first


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
