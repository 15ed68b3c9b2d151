"""Building torch DataLoaders that play an epoch-deterministic order and can start from a consumer offset."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from torch.utils.data import BatchSampler, DataLoader, IterableDataset

from lightning_loadguard.position.iterable import StatefulIterableTap, is_stateful, unsaved_order
from lightning_loadguard.position.sampler import PlannedBatchSampler, PlannedSampler
from lightning_loadguard.position.state import STATE_VERSION, PositionMismatchError

# DataLoader arguments carried over verbatim when the sampler is replaced.
_CARRIED = (
    "num_workers",
    "collate_fn",
    "pin_memory",
    "timeout",
    "worker_init_fn",
    "multiprocessing_context",
    "generator",
    "persistent_workers",
    "pin_memory_device",
    "in_order",
)


_STATEFUL_DATALOADER = ("torchdata.stateful_dataloader", "StatefulDataLoader")


def rebuildable(loader: object) -> bool:
    """Whether :func:`make_resumable` can rebuild ``loader`` without losing an argument.

    A plain ``DataLoader``, and torchdata's ``StatefulDataLoader`` over a map-style dataset: its only extra
    argument (``snapshot_every_n_steps``) and its own state concern the position, which the rebuilt loader
    keeps by its order instead.
    """
    if type(loader) is DataLoader:
        return True
    cls = type(loader)
    return (
        cls.__module__.startswith(_STATEFUL_DATALOADER[0])
        and cls.__name__ == _STATEFUL_DATALOADER[1]
        and isinstance(loader, DataLoader)
        and not isinstance(loader.dataset, IterableDataset)
    )


def make_resumable(loader: DataLoader, *, seed: int, rank: int = 0, world_size: int = 1) -> DataLoader:
    """An equivalent ``DataLoader`` whose order is a function of ``(seed, epoch)`` and which can start mid-epoch.

    ``loader`` may be a plain ``DataLoader`` or torchdata's ``StatefulDataLoader`` over a map-style dataset
    (see :func:`rebuildable`); the result is always a plain ``DataLoader``. The dataset, batch size,
    ``drop_last``, collate function and worker settings are kept. The sampler becomes a
    :class:`PlannedSampler` (sharded over ``world_size`` ranks like ``DistributedSampler``); a custom batch
    sampler becomes a :class:`PlannedBatchSampler`; a stateful iterable dataset is wrapped in a
    :class:`StatefulIterableTap`.

    Raises:
        TypeError: ``loader`` is a ``DataLoader`` subclass (its extra arguments cannot be rebuilt) or an
            iterable dataset without ``state_dict()/load_state_dict()``.
        ValueError: a case whose position cannot be exact: a custom batch sampler or a stateful iterable
            dataset with ``world_size > 1``, a stateful iterable dataset read by worker processes, or one
            whose state leaves part of its order out (:func:`unsaved_order`).

    Example:
        >>> from torch.utils.data import DataLoader
        >>> plain = DataLoader(list(range(10)), batch_size=4, shuffle=True)
        >>> loader = make_resumable(plain, seed=0)
        >>> full = [b.tolist() for b in loader]
        >>> planned_sampler(loader).start_at(epoch=0, batches_consumed=1)
        >>> [b.tolist() for b in loader] == full[1:]
        True
    """
    if not rebuildable(loader):
        raise TypeError(
            f"loader must be a torch.utils.data.DataLoader (or torchdata's StatefulDataLoader over a map-style "
            f"dataset), got {type(loader).__qualname__}: a subclass may take arguments that cannot be read back "
            "to rebuild it"
        )
    if world_size < 1 or not 0 <= rank < world_size:
        raise ValueError(f"rank must be in [0, world_size={world_size}), got rank={rank}")
    kwargs: dict[str, Any] = {k: getattr(loader, k) for k in _CARRIED if hasattr(loader, k)}
    if loader.num_workers > 0:
        kwargs["prefetch_factor"] = loader.prefetch_factor
    dataset = loader.dataset

    if isinstance(dataset, IterableDataset):
        if not is_stateful(dataset):
            raise TypeError(
                f"{type(dataset).__name__} is an IterableDataset without state_dict()/load_state_dict(): "
                "where it stands cannot be stored"
            )
        unsaved = unsaved_order(dataset)
        if unsaved is not None:
            raise ValueError(
                f"{type(dataset).__name__} cannot be resumed exactly: {unsaved}. Shuffle a map-style "
                "dataset instead (DataLoader(dataset, shuffle=True)), or remove ResumableLoaderMixin to accept an "
                "inexact resume"
            )
        if world_size > 1:
            raise ValueError(
                "a stateful IterableDataset cannot be resumed exactly with world_size > 1: each rank's dataset "
                "has its own state and a checkpoint holds one"
            )
        if loader.num_workers > 0:
            raise ValueError(
                f"a stateful IterableDataset read by num_workers={loader.num_workers} worker processes cannot "
                "be resumed exactly: each worker holds a copy of the dataset whose state the main process "
                "cannot read. Use num_workers=0"
            )
        tap = StatefulIterableTap(dataset, loader.batch_size)
        return DataLoader(tap, batch_size=loader.batch_size, drop_last=loader.drop_last, **kwargs)

    batch_sampler = loader.batch_sampler
    if batch_sampler is not None and type(batch_sampler) is not BatchSampler:
        if world_size > 1:
            raise ValueError(
                f"a custom batch sampler ({type(batch_sampler).__qualname__}) cannot be sharded over "
                f"world_size={world_size} ranks exactly: its batches are not a sample order the ranks can split. "
                "Give the DataLoader a sampler and batch_size instead"
            )
        planned_batches = PlannedBatchSampler(batch_sampler, seed=seed)
        return DataLoader(dataset, batch_sampler=planned_batches, **kwargs)

    source = loader.sampler if batch_sampler is None else batch_sampler.sampler
    batch_size = 1 if loader.batch_size is None else loader.batch_size
    planned = PlannedSampler(
        source,
        dataset_len=len(dataset),  # type: ignore[arg-type]
        batch_size=batch_size,
        seed=seed,
        rank=rank,
        world_size=world_size,
        drop_tail=bool(getattr(source, "drop_last", False)),
        drop_last=loader.drop_last,
    )
    return DataLoader(dataset, batch_size=loader.batch_size, sampler=planned, drop_last=loader.drop_last, **kwargs)


def planned_sampler(loader: DataLoader) -> PlannedSampler | PlannedBatchSampler | StatefulIterableTap:
    """The object that holds ``loader``'s order (built by :func:`make_resumable`).

    Raises:
        TypeError: ``loader`` was not built by :func:`make_resumable`.
    """
    if isinstance(loader.dataset, StatefulIterableTap):
        return loader.dataset
    if isinstance(loader.batch_sampler, PlannedBatchSampler):
        return loader.batch_sampler
    if isinstance(loader.sampler, PlannedSampler):
        return loader.sampler
    raise TypeError("loader has no planned order; build it with make_resumable()")


@dataclass
class ConsumerCursor:
    """Counts what the consumer finished: the epoch and the batches of it that the training step completed.

    Call :meth:`consumed` after a batch's step finished (not when it was fetched) and :meth:`start_epoch`
    when an epoch begins. Its state is what a restart needs next to the loader's seed and layout.

    Example:
        >>> c = ConsumerCursor()
        >>> c.start_epoch(1); c.consumed(); c.consumed()
        >>> c.state_dict()
        {'epoch': 1, 'batches': 2, 'version': 1}
    """

    epoch: int = 0
    batches: int = 0

    def start_epoch(self, epoch: int) -> None:
        if epoch < 0:
            raise ValueError(f"epoch must be >= 0, got {epoch}")
        self.epoch = epoch
        self.batches = 0

    def consumed(self, batches: int = 1) -> None:
        if batches < 0:
            raise ValueError(f"batches must be >= 0, got {batches}")
        self.batches += batches

    def state_dict(self) -> dict[str, int]:
        return {"epoch": self.epoch, "batches": self.batches, "version": STATE_VERSION}

    def load_state_dict(self, state: dict[str, int]) -> None:
        if state.get("version") != STATE_VERSION:
            raise PositionMismatchError(
                f"cursor state has version {state.get('version')!r}; this release reads {STATE_VERSION} only"
            )
        missing = sorted({"epoch", "batches"} - set(state))
        if missing:
            raise PositionMismatchError(f"cursor state misses {missing}")
        self.epoch = int(state["epoch"])
        self.batches = int(state["batches"])
