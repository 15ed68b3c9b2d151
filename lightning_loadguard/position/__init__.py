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
(b) a new iterator from that offset: :func:`resume_iterator` shuts the old iterator's workers down, applies
    the new settings to the same ``DataLoader`` object, and returns an iterator whose first batch is the one
    after the last consumed batch, in the same order. Consumed batches are skipped in the index order, so
    nothing is loaded twice and nothing is lost.

Example::

    loader = make_resumable(DataLoader(ds, batch_size=32, shuffle=True, num_workers=2), seed=0)
    cursor = ConsumerCursor()
    it = iter(loader)
    for batch in it:
        step(batch)
        cursor.consumed()
        if cursor.batches == 100:
            break
    it = resume_iterator(loader, cursor.batches, old_iterator=it, num_workers=6, prefetch_factor=4)
    for batch in it:  # batch 101 of the epoch onwards
        step(batch)
        cursor.consumed()

Under Lightning the same call applies to ``trainer.train_dataloader`` (the loader the trainer iterates) with
``trainer.fit_loop.epoch_loop.batch_progress.current.processed`` as the consumed count.
"""

from lightning_loadguard.position.iterable import StatefulIterableTap, is_stateful
from lightning_loadguard.position.loader import ConsumerCursor, make_resumable, planned_sampler, resume_iterator
from lightning_loadguard.position.plan import epoch_seed, pad_to_world, seeded_iteration, shard
from lightning_loadguard.position.sampler import PlannedBatchSampler, PlannedSampler, reshard_position
from lightning_loadguard.position.state import STATE_VERSION, LoaderPosition, PositionMismatchError

__all__ = [
    "STATE_VERSION",
    "ConsumerCursor",
    "LoaderPosition",
    "PlannedBatchSampler",
    "PlannedSampler",
    "PositionMismatchError",
    "StatefulIterableTap",
    "epoch_seed",
    "is_stateful",
    "make_resumable",
    "pad_to_world",
    "planned_sampler",
    "reshard_position",
    "resume_iterator",
    "seeded_iteration",
    "shard",
]
