"""Where the consumer of a train loader stands, and how to continue from there.

Workers read ahead of the training step; the position that makes a restart exact is what the *consumer*
finished, never what the producer fetched. This package is plain torch (no Lightning): it makes an epoch's
order a function of ``(seed, epoch)``, stores the consumer's place in it (:class:`LoaderPosition`), starts a
loader right after that place without reading the consumed samples, and moves the rest of an epoch to
another number of ranks (:func:`reshard_position`).

Restarting a loader mid-epoch with other worker settings
---------------------------------------------------------
An auto-tuner that changes ``num_workers``, ``prefetch_factor`` or ``pin_memory`` mid-epoch needs two things:

(a) the consumer position: count batches whose step finished with a :class:`ConsumerCursor` (or read the
    trainer's own count); with a :class:`PlannedSampler`, ``sampler.position(epoch, batches)`` turns it into
    a storable :class:`LoaderPosition`;
(b) a new iterator from that offset: :func:`restart_iterator` shuts the old iterator's workers down, applies
    the new settings to the same ``DataLoader`` object, and returns an iterator whose first batch is the one
    after the last consumed batch, in the same order. For a loader built by :func:`make_resumable` the
    consumed batches are skipped in the index order, so nothing is loaded twice and nothing is lost; any
    other loader needs an :class:`OrderTap` installed before the epoch's ``iter()``.

Example::

    loader = make_resumable(DataLoader(ds, batch_size=32, shuffle=True, num_workers=2), seed=0)
    cursor = ConsumerCursor()
    it = iter(loader)
    for batch in it:
        step(batch)
        cursor.consumed()
        if cursor.batches == 100:
            break
    order = planned_sampler(loader)
    it = restart_iterator(loader, order, cursor.batches, old_iterator=it, num_workers=6, prefetch_factor=4)
    for batch in it:  # batch 101 of the epoch onwards
        step(batch)
        cursor.consumed()

Under Lightning the same call applies to ``trainer.train_dataloader`` (the loader the trainer iterates) with
``trainer.fit_loop.epoch_loop.batch_progress.current.processed`` as the consumed count.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from lightning_loadguard._moved import moved_names
from lightning_loadguard.position.iterable import StatefulIterableTap, is_stateful
from lightning_loadguard.position.loader import ConsumerCursor, make_resumable, planned_sampler
from lightning_loadguard.position.sampler import PlannedBatchSampler, PlannedSampler, reshard_position
from lightning_loadguard.position.state import LoaderPosition, PositionMismatchError
from lightning_loadguard.position.switch import OrderTap, restart_iterator

__all__ = [
    "ConsumerCursor",
    "LoaderPosition",
    "OrderTap",
    "PlannedBatchSampler",
    "PlannedSampler",
    "PositionMismatchError",
    "StatefulIterableTap",
    "is_stateful",
    "make_resumable",
    "planned_sampler",
    "reshard_position",
    "restart_iterator",
]


def _resume_iterator(
    loader: Any,
    batches_consumed: int,
    *,
    epoch: int | None = None,
    old_iterator: Iterator[Any] | None = None,
    **settings: Any,
) -> Iterator[Any]:
    order = planned_sampler(loader)
    if epoch is not None:
        order.set_epoch(epoch)
    return restart_iterator(loader, order, batches_consumed, old_iterator=old_iterator, **settings)


_INTERNAL = "internal to the package, no longer exported here"
# Importable from here in 0.1.0.
__getattr__ = moved_names(
    __name__,
    {
        "resume_iterator": (
            f"{__name__}:_resume_iterator",
            "use restart_iterator(loader, planned_sampler(loader), batches_consumed, ...)",
        ),
        "STATE_VERSION": (f"{__name__}.state:STATE_VERSION", _INTERNAL),
        "epoch_seed": (f"{__name__}.plan:epoch_seed", _INTERNAL),
        "pad_to_world": (f"{__name__}.plan:pad_to_world", _INTERNAL),
        "seeded_iteration": (f"{__name__}.plan:seeded_iteration", _INTERNAL),
        "shard": (f"{__name__}.plan:shard", _INTERNAL),
    },
)
