"""``ResumableLoaderMixin``: every checkpoint holds where the training step stands in the train loader.

Add it first in a LightningDataModule's bases; ``train_dataloader()`` keeps returning an ordinary
``DataLoader``. Works with ``lightning.pytorch`` or ``pytorch_lightning``, whichever is installed.
"""

from __future__ import annotations

import functools
import math
import os
import random
from collections.abc import Callable
from typing import Any

from torch.utils.data import DataLoader, IterableDataset

from lightning_loadguard.position import (
    LoaderPosition,
    PlannedBatchSampler,
    PlannedSampler,
    PositionMismatchError,
    StatefulIterableTap,
    is_stateful,
    make_resumable,
    planned_sampler,
    reshard_position,
)

try:
    from lightning.pytorch.utilities.rank_zero import rank_zero_warn
except ImportError:  # pragma: no cover - depends on which distribution is installed
    from pytorch_lightning.utilities.rank_zero import rank_zero_warn

STATE_KEY = "loadguard_loader_position"
"""Key of the position inside the datamodule's checkpoint state."""

_PROGRESS_FIELDS = ("ready", "started", "processed", "completed")


def _consumer_position(trainer: Any) -> tuple[int, int]:
    """(epoch, batches the training step finished in it), with a finished epoch reported as the next one.

    ``processed`` is the count the trainer restores (on Lightning 2.4 through
    :func:`_align_with_lightning_restart`); ``completed`` still lags by one inside ``on_train_batch_end``,
    where ``ModelCheckpoint`` saves.

    A loader without a length has no batch total to compare with; Lightning's fetcher reads one batch ahead
    of it and sets ``is_last_batch`` when that read found the loader exhausted, so once the flagged batch is
    processed the epoch is over, as Lightning >= 2.5 (and 2.4 through :func:`_finish_saved_batch`) restores it.
    """
    fit_loop = trainer.fit_loop
    epochs = fit_loop.epoch_progress.current
    if epochs.processed >= epochs.started:
        return epochs.processed, 0
    batches = fit_loop.epoch_loop.batch_progress
    consumed = batches.current.processed
    total = trainer.num_training_batches
    if total != math.inf and consumed >= total:
        return epochs.processed + 1, 0
    # Inside the last batch's ``training_step`` it is flagged but not yet processed (``started`` is ahead).
    if total == math.inf and batches.is_last_batch and consumed > 0 and consumed >= batches.current.started:
        return epochs.processed + 1, 0
    return epochs.processed, consumed


def _shift_restored_batch_count(trainer: Any, delta: int) -> None:
    """Move the batch count the trainer is about to restore by ``delta`` (a new world size's coordinates).

    The datamodule's state is loaded before the loops', so the loaded checkpoint can still be adjusted; the
    trainer then counts to the epoch's length exactly when the re-sharded remainder runs out.
    """
    if delta == 0:
        return
    try:
        loaded = trainer._checkpoint_connector._loaded_checkpoint
        current = loaded["loops"]["fit_loop"]["epoch_loop.batch_progress"]["current"]
        values = {f: int(current[f]) for f in _PROGRESS_FIELDS}
    except (AttributeError, KeyError, TypeError) as err:
        raise PositionMismatchError(
            "cannot continue the epoch with a different world size: the trainer's checkpoint has no "
            f"batch progress where this Lightning version is expected to keep it ({err!r})"
        ) from err
    for name, value in values.items():
        current[name] = value + delta


def _align_with_lightning_restart(trainer: Any) -> int:
    """Make an older Lightning restore the loops as Lightning >= 2.5 does; return how often it will start
    iterating the train loader before the first resumed training step.

    Two restart details changed in 2.5, each detected by the attribute that came with it:

    - A checkpoint written in ``on_train_batch_end`` holds ``processed = completed + 1``. Lightning >= 2.5
      (``restarted_on_train_batch_end``) resumes after that batch, or in the next epoch when it was the
      epoch's last. Lightning 2.4 sets every batch counter back to ``completed``: it runs one batch more than
      the epoch has left, which the resumed loader can only fill from the next epoch's order, and it never
      reaches ``is_last_batch``, so the epoch-end validation is skipped. The counters are moved to what 2.5
      restores (:func:`_finish_saved_batch`) before the loops reset: in the checkpoint still being restored
      when the loader is built early (``estimated_stepping_batches`` in ``configure_optimizers``), else in
      the restored loops.
    - Resumed at an epoch boundary after epoch 0, Lightning 2.4 iterates the loader in ``setup_data`` and
      again at the epoch's start, dropping what the first iterator fetched ahead; Lightning >= 2.5
      (``is_resuming``) keeps the first. A dataset whose state moves as it is read must then start both
      iterations from the saved state.
    """
    fit_loop = trainer.fit_loop
    epoch_loop = fit_loop.epoch_loop
    if trainer.ckpt_path is None:
        return 1
    pending = trainer._checkpoint_connector._loaded_checkpoint
    if pending:
        fit_state = pending.get("loops", {}).get("fit_loop")
        if fit_state is None:
            return 1
    else:
        fit_state = {
            "epoch_progress": fit_loop.epoch_progress.state_dict(),
            "epoch_loop.batch_progress": epoch_loop.batch_progress.state_dict(),
            "epoch_loop.state_dict": {"_batches_that_stepped": epoch_loop._batches_that_stepped},
        }
    edited = not hasattr(epoch_loop, "restarted_on_train_batch_end") and _finish_saved_batch(fit_state, trainer)
    if edited and not pending:
        fit_loop.epoch_progress.load_state_dict(fit_state["epoch_progress"])
        epoch_loop.batch_progress.load_state_dict(fit_state["epoch_loop.batch_progress"])
        epoch_loop._batches_that_stepped = fit_state["epoch_loop.state_dict"]["_batches_that_stepped"]
        # The setter decides again from the epoch counters whether an epoch is still unfinished.
        fit_loop.restarting = True
    epochs = fit_state["epoch_progress"]["current"]
    at_epoch_boundary = epochs["ready"] == epochs["started"] == epochs["processed"]
    if (
        not hasattr(fit_loop, "is_resuming")
        and at_epoch_boundary
        and epochs["processed"] > 0
        and not fit_loop._iteration_based_training()
    ):
        return 2
    return 1


def _finish_saved_batch(fit_state: dict[str, Any], trainer: Any) -> bool:
    """Edit a fit loop's state (the checkpoint's layout) as if ``on_train_batch_end`` had returned.

    Returns whether anything changed: only a state saved inside ``on_train_batch_end`` is edited.
    """
    batches = fit_state["epoch_loop.batch_progress"]
    current = batches["current"]
    if current["processed"] != current["completed"] + 1:
        return False
    done = current["processed"]
    last = bool(batches["is_last_batch"])
    for part in ("current", "total"):
        batches[part]["completed"] = batches[part]["processed"]
    # The batch stepped the optimizer unless it accumulated; Lightning counts it in ``on_advance_end``.
    stepped = done % trainer.accumulate_grad_batches == 0 or (
        last and not trainer.strategy.handles_gradient_accumulation
    )
    loop_state = fit_state.setdefault("epoch_loop.state_dict", {})
    if stepped and "_batches_that_stepped" in loop_state:
        loop_state["_batches_that_stepped"] += 1
    if last:
        # Restore into the next epoch as an epoch-end checkpoint does: the finished epoch's end hooks and
        # validation are not run again, as on Lightning >= 2.5.
        for part in ("current", "total"):
            epochs = fit_state["epoch_progress"][part]
            epochs["processed"] = epochs["completed"] = epochs["started"]
        current.update(ready=0, started=0, processed=0, completed=0)
        batches["is_last_batch"] = False
    return True


class ResumableLoaderMixin:
    """Store the consumer's train-loader position in every checkpoint and resume right after it.

    The train loader's order becomes a function of ``(seed, epoch)``: its sampler (or batch sampler) is
    replayed with seeded randomness, sharded over the ranks like ``DistributedSampler``. A checkpoint holds
    the epoch, the batches and samples ``training_step`` finished, the seed, the dataset length, the batch
    size and the world size. On resume the loader starts right after the last finished batch; the consumed
    part is skipped in the index order, never loaded.

    Handled: map-style datasets with the default, a custom or a ``DistributedSampler`` (sharded by the mixin,
    so Lightning does not inject its own), custom batch samplers on one process, any ``num_workers`` (it may
    change between runs), persistent workers, ``limit_train_batches``, ``estimated_stepping_batches``, a
    different world size on resume (the rest of the epoch is re-sharded), and iterable datasets with
    ``state_dict()/load_state_dict()`` read with ``num_workers=0`` on one process.
    Refused with an error: a changed dataset length, batch size or ``drop_last``; a state of another
    version; a custom batch sampler on several ranks; a world-size change combined with
    ``limit_train_batches``. An iterable dataset without state gets one warning and resumes from its start.

    Attributes:
        loader_seed: Base seed of the epoch orders. ``None`` takes ``PL_GLOBAL_SEED`` (set by
            ``seed_everything``) or draws one on rank 0; it is stored in checkpoints either way.

    Example::

        class Data(ResumableLoaderMixin, LightningDataModule):
            def train_dataloader(self):
                return DataLoader(self.train_set, batch_size=32, shuffle=True, num_workers=4)

        trainer.fit(model, datamodule=Data(), ckpt_path="last.ckpt")  # continues mid-epoch, exactly
    """

    loader_seed: int | None = None

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        # A subclass's own definitions shadow the mixin's, so they are wrapped where they are defined.
        for name, wrap in (
            ("train_dataloader", _wrap_train_dataloader),
            ("state_dict", _wrap_state_dict),
            ("load_state_dict", _wrap_load_state_dict),
        ):
            fn = cls.__dict__.get(name)
            if fn is not None and not getattr(fn, "_loadguard_wrapped", False):
                setattr(cls, name, wrap(fn))

    def state_dict(self) -> dict[str, Any]:
        state: dict[str, Any] = dict(super().state_dict())  # type: ignore[misc]
        return self._loadguard_add_state(state)

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        super().load_state_dict(self._loadguard_take_state(state_dict))  # type: ignore[misc]

    @property
    def loader_position(self) -> LoaderPosition | None:
        """The consumer's position in the train loader now (``None`` before a loader was built)."""
        loader = getattr(self, "_loadguard_loader", None)
        trainer = getattr(self, "trainer", None)
        if loader is None or trainer is None:
            return None
        return self._loadguard_position(loader, trainer)

    def _loadguard_warn_once(self, key: str, message: str) -> None:
        warned: set[str] = self.__dict__.setdefault("_loadguard_warned", set())
        if key not in warned:
            warned.add(key)
            rank_zero_warn(message)

    def _loadguard_position(self, loader: DataLoader, trainer: Any) -> LoaderPosition:
        epoch, consumed = _consumer_position(trainer)
        order = planned_sampler(loader)
        if isinstance(order, PlannedSampler):
            return order.position(epoch, consumed)
        seed = self.__dict__["_loadguard_seed"]
        if isinstance(order, PlannedBatchSampler):
            return LoaderPosition(
                epoch=epoch,
                batches_consumed=consumed,
                samples_consumed=order.samples_in(epoch, consumed),
                seed=seed,
                dataset_len=len(loader.dataset),  # type: ignore[arg-type]
            )
        assert isinstance(order, StatefulIterableTap)
        # A finished epoch is stored as the next one's start: the dataset's state after its end.
        dataset_state = order.state_at(consumed) if consumed else order.final_state
        return LoaderPosition(
            epoch=epoch,
            batches_consumed=consumed,
            samples_consumed=consumed * (loader.batch_size or 1),
            seed=seed,
            batch_size=loader.batch_size,
            drop_last=loader.drop_last,
            dataset_state=dataset_state,
        )

    def _loadguard_add_state(self, state: dict[str, Any]) -> dict[str, Any]:
        loader = self.__dict__.get("_loadguard_loader")
        trainer = getattr(self, "trainer", None)
        if loader is not None and trainer is not None:
            state[STATE_KEY] = self._loadguard_position(loader, trainer).state_dict()
        elif (pending := self.__dict__.get("_loadguard_loaded")) is not None:
            state[STATE_KEY] = pending.state_dict()
        return state

    def _loadguard_take_state(self, state_dict: dict[str, Any]) -> dict[str, Any]:
        rest = dict(state_dict)
        raw = rest.pop(STATE_KEY, None)
        self.__dict__["_loadguard_state_seen"] = True
        if raw is None:
            return rest
        position = LoaderPosition.from_state_dict(raw)
        trainer = getattr(self, "trainer", None)
        if trainer is not None and position.world_size != trainer.world_size:
            if trainer.limit_train_batches not in (None, 1.0):
                raise PositionMismatchError(
                    f"cannot continue an epoch started with world_size={position.world_size} on "
                    f"world_size={trainer.world_size} with limit_train_batches={trainer.limit_train_batches}: "
                    "the limit counts batches per rank, so the samples the old run left out of the epoch are "
                    "not the ones the new run would leave out"
                )
            moved = reshard_position(position, trainer.world_size)
            _shift_restored_batch_count(trainer, moved.batches_consumed - position.batches_consumed)
            position = moved
        self.__dict__["_loadguard_loaded"] = position
        return rest

    def _loadguard_seed_for(self, trainer: Any, loaded: LoaderPosition | None) -> int:
        if loaded is not None:
            seed = loaded.seed
        elif (known := self.__dict__.get("_loadguard_seed")) is not None:
            seed = known
        elif self.loader_seed is not None:
            seed = int(self.loader_seed)
        elif "PL_GLOBAL_SEED" in os.environ:
            seed = int(os.environ["PL_GLOBAL_SEED"])
        else:
            seed = random.SystemRandom().randrange(2**63)
            if trainer.world_size > 1:
                # Every rank must shard the same order; without a global seed only rank 0's draw counts.
                seed = int(trainer.strategy.broadcast(seed, src=0))
        self.__dict__["_loadguard_seed"] = seed
        return seed

    def _loadguard_adapt(self, loader: Any) -> Any:
        trainer = getattr(self, "trainer", None)
        if trainer is None:
            return loader
        if not isinstance(loader, DataLoader):
            self._loadguard_warn_once(
                "type",
                f"train_dataloader() returned a {type(loader).__qualname__}, not a DataLoader: "
                "ResumableLoaderMixin cannot store its position and a resumed epoch will not be exact",
            )
            return loader
        if isinstance(loader.dataset, IterableDataset) and not is_stateful(loader.dataset):
            self._loadguard_warn_once(
                "iterable",
                f"{type(loader.dataset).__qualname__} is an IterableDataset without state_dict()/"
                "load_state_dict(): exact resume is impossible, a resumed epoch starts the dataset from its "
                "beginning. Implement those two methods (torchdata's Stateful protocol) or use a map-style "
                "dataset",
            )
            return loader
        iterations = _align_with_lightning_restart(trainer)
        loaded = self.__dict__.pop("_loadguard_loaded", None)
        seed = self._loadguard_seed_for(trainer, loaded)
        made = make_resumable(loader, seed=seed, rank=trainer.global_rank, world_size=trainer.world_size)
        order = planned_sampler(made)
        if loaded is not None:
            if isinstance(order, PlannedSampler):
                order.resume(loaded)
            elif isinstance(order, PlannedBatchSampler):
                if loaded.dataset_len != len(made.dataset):  # type: ignore[arg-type]
                    raise PositionMismatchError(
                        f"dataset length changed: the position was taken over {loaded.dataset_len} samples, "
                        f"the dataset now has {len(made.dataset)}"  # type: ignore[arg-type]
                    )
                order.start_at(loaded.epoch, loaded.batches_consumed)
            elif loaded.dataset_state is not None:
                order.resume(loaded.dataset_state, loaded.batches_consumed, iterations=iterations)
        elif trainer.ckpt_path and not self.__dict__.get("_loadguard_state_seen"):
            self._loadguard_warn_once(
                "missing",
                f"the checkpoint {trainer.ckpt_path} holds no train-loader position (written without "
                f"ResumableLoaderMixin or by an older run): epoch {trainer.current_epoch} restarts from its "
                "first batch, and the trainer still counts the batches it had finished in it",
            )
            if isinstance(order, (PlannedSampler, PlannedBatchSampler)):
                order.set_epoch(trainer.current_epoch)
        self.__dict__["_loadguard_loader"] = made
        return made


def _mark(fn: Callable[..., Any]) -> Callable[..., Any]:
    fn._loadguard_wrapped = True  # type: ignore[attr-defined]
    return fn


def _wrap_train_dataloader(fn: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(fn)
    def train_dataloader(self: ResumableLoaderMixin) -> Any:
        return self._loadguard_adapt(fn(self))

    return _mark(train_dataloader)


def _wrap_state_dict(fn: Callable[..., dict[str, Any]]) -> Callable[..., dict[str, Any]]:
    @functools.wraps(fn)
    def state_dict(self: ResumableLoaderMixin) -> dict[str, Any]:
        return self._loadguard_add_state(dict(fn(self)))

    return _mark(state_dict)


def _wrap_load_state_dict(fn: Callable[..., None]) -> Callable[..., None]:
    @functools.wraps(fn)
    def load_state_dict(self: ResumableLoaderMixin, state_dict: dict[str, Any]) -> None:
        fn(self, self._loadguard_take_state(state_dict))

    return _mark(load_state_dict)
