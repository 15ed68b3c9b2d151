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

from lightning_loadguard._lightning import (
    align_with_lightning_restart,
    batches_done_in_epoch,
    iterates_twice_on_resume,
    put_callback_first,
    remove_callback,
    repair_restored_progress,
    restore_loader_classes,
    shift_restored_batch_count,
    silence_not_resumable_warning,
)
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
from lightning_loadguard.position.cursor import EpochCursor
from lightning_loadguard.position.loader import rebuildable

try:
    import lightning.pytorch as pl
    from lightning.pytorch import Callback
    from lightning.pytorch.utilities import CombinedLoader
    from lightning.pytorch.utilities.rank_zero import rank_zero_warn
except ImportError:  # pragma: no cover - depends on which distribution is installed
    import pytorch_lightning as pl  # type: ignore[no-redef]
    from pytorch_lightning import Callback  # type: ignore[assignment]
    from pytorch_lightning.utilities import CombinedLoader  # type: ignore[assignment]
    from pytorch_lightning.utilities.rank_zero import rank_zero_warn
from typing_extensions import override

STATE_KEY = "loadguard_loader_position"
"""Key of the position inside the datamodule's checkpoint state."""


class _ConsumerHooks(Callback):
    """Reports every finished training batch and every epoch start to the mixin that owns the train loader.

    Put at the head of the trainer's callbacks, so its ``on_train_batch_end`` has counted the batch before
    any callback (``ModelCheckpoint``) or the module saves a checkpoint in the same hook.
    """

    def __init__(self, owner: ResumableLoaderMixin) -> None:
        self.owner = owner

    def _mine(self, trainer: pl.Trainer) -> bool:
        return trainer.datamodule is self.owner

    @override
    def on_train_epoch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self._mine(trainer):
            self.owner._loadguard_epoch_started()

    @override
    def on_train_batch_start(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        if self._mine(trainer):
            self.owner._loadguard_before_batch(trainer, batch_idx)

    @override
    def on_train_batch_end(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        if self._mine(trainer):
            self.owner._loadguard_after_batch(trainer)

    @override
    def teardown(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        self.owner._loadguard_release()

    @override
    def on_exception(self, trainer: pl.Trainer, pl_module: pl.LightningModule, exception: BaseException) -> None:
        self.owner._loadguard_release()


def _several_loaders(loader: object) -> str | None:
    """A description of ``loader`` when it combines several loaders (Lightning's CombinedLoader)."""
    if isinstance(loader, CombinedLoader):
        return f"a CombinedLoader of {len(loader.flattened)}"
    if isinstance(loader, dict):
        return f"a dict of {len(loader)} ({', '.join(map(repr, loader))})"
    if isinstance(loader, (list, tuple)):
        return f"a {type(loader).__name__} of {len(loader)}"
    return None


def _part_seed(seed: int, index: int) -> int:
    """The base seed of the ``index``-th of several loaders: their orders differ, each reproducible."""
    return (seed + 1_000_003 * index) % 2**63


class _Part:
    """One of several train loaders: its rebuilt loader and the consumer's cursor in its passes."""

    def __init__(self, loader: DataLoader, cursor: EpochCursor) -> None:
        self.loader = loader
        self.cursor = cursor

    def position(self) -> LoaderPosition:
        order = planned_sampler(self.loader)
        epoch, batches = self.cursor.position
        if isinstance(order, PlannedSampler):
            return order.position(epoch, batches)
        assert isinstance(order, PlannedBatchSampler)
        return LoaderPosition(
            epoch=epoch,
            batches_consumed=batches,
            samples_consumed=order.samples_in(epoch, batches),
            seed=order.seed,
            dataset_len=len(self.loader.dataset),  # type: ignore[arg-type]
        )


class _SeveralPositions:
    """The stored position of several train loaders: the epoch's batch count and each loader's position."""

    def __init__(self, raw: dict[str, Any], combined: tuple[int, int], loaders: dict[str, LoaderPosition]) -> None:
        self.raw = raw
        self.combined = combined
        self.loaders = loaders

    @classmethod
    def from_state(cls, raw: dict[str, Any], trainer: Any) -> _SeveralPositions:
        try:
            combined = (int(raw["combined"]["epoch"]), int(raw["combined"]["batches"]))
            loaders = {str(k): LoaderPosition.from_state_dict(v) for k, v in raw["loaders"].items()}
        except (KeyError, TypeError, ValueError) as err:
            raise PositionMismatchError(f"the stored position of several loaders is incomplete ({err!r})") from err
        if trainer is not None:
            worlds = {p.world_size for p in loaders.values()}
            if worlds != {trainer.world_size}:
                raise PositionMismatchError(
                    f"several loaders were positioned with world_size={sorted(worlds)}, this run has "
                    f"world_size={trainer.world_size}: only a single loader's epoch can be re-sharded"
                )
            repair_restored_progress(trainer, *combined)
        return cls(raw, combined, loaders)


class ResumableLoaderMixin:
    """Store the consumer's train-loader position in every checkpoint and resume right after it.

    The train loader's order becomes a function of ``(seed, epoch)``: its sampler (or batch sampler) is
    replayed with seeded randomness, sharded over the ranks like ``DistributedSampler``. A checkpoint holds
    the epoch, the batches and samples ``training_step`` finished, the seed, the dataset length, the batch
    size and the world size. On resume the loader starts right after the last finished batch; the consumed
    part is skipped in the index order, never loaded.

    The position is the mixin's own count of batches whose training step finished (a callback it puts
    first in ``trainer.callbacks``), checked against Lightning's batch index before every step; Lightning's
    epoch counters, which go wrong after some resumes, are repaired in the checkpoint being restored instead
    of trusted.

    Handled: map-style datasets with the default, a custom (torch, Python or numpy randomness) or a
    ``DistributedSampler`` (sharded by the mixin, so Lightning does not inject its own), custom batch
    samplers on one process, torchdata's ``StatefulDataLoader`` over a map-style dataset, a dict or list of
    such loaders (each continued at its own place), any
    ``num_workers`` (it may change between runs), persistent workers, ``limit_train_batches``,
    ``accumulate_grad_batches``, ``val_check_interval``, ``estimated_stepping_batches``, several crashes in a
    row, a larger ``max_steps`` after a fit that ended mid-epoch, a different world size on resume (the rest
    of the epoch is re-sharded), and iterable datasets with ``state_dict()/load_state_dict()`` read with
    ``num_workers=0`` on one process. The position is applied once, by the outermost ``train_dataloader``,
    whatever the class hierarchy: overrides calling ``super()`` or not, the mixin listed after another base,
    ``LightningDataModule.from_datasets``. Refused with an error: a changed dataset length, batch size or
    ``drop_last``; a state of another version; a sampler whose order cannot be reproduced; a
    ``CombinedLoader``; a custom batch sampler on several ranks; a world-size change combined with
    ``limit_train_batches`` or with several loaders. A loader the mixin cannot position (not a
    ``DataLoader``, a ``DataLoader`` subclass, an ``IterableDataset`` without state) and a checkpoint without
    the mixin's state run from an epoch's start; a resume inside an epoch is refused at its first step, unless
    ``allow_inexact_resume``. A loader keeping its own state over an iterable dataset is resumed by that state.
    docs/resume.md has the table.

    Attributes:
        loader_seed: Base seed of the epoch orders. ``None`` takes ``PL_GLOBAL_SEED`` (set by
            ``seed_everything``) or draws one on rank 0; it is stored in checkpoints either way.
        allow_inexact_resume: ``False`` (default): a resume inside an epoch that the mixin cannot make exact
            is refused with ``PositionMismatchError``. ``True``: it goes on as Lightning does without the mixin
            (the loader used as is, a fresh iterator), with one warning; samples may repeat or be skipped.

    Example::

        class Data(ResumableLoaderMixin, LightningDataModule):
            def train_dataloader(self):
                return DataLoader(self.train_set, batch_size=32, shuffle=True, num_workers=4)

        trainer.fit(model, datamodule=Data(), ckpt_path="last.ckpt")  # continues mid-epoch, exactly
    """

    loader_seed: int | None = None
    allow_inexact_resume: bool = False

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        # What the class resolves each name to is wrapped: its own definition, one inherited from a base listed
        # before the mixin (LightningDataModule's state_dict when the mixin comes after it), or an already
        # wrapped one (left as is). An override calling super() reaches a wrapped base method too: the
        # wrappers act once per outermost call (_Once), so the position is applied exactly once.
        for name, wrap in _WRAPPERS.items():
            fn = getattr(cls, name, None)
            if callable(fn) and not getattr(fn, "_loadguard_wrapped", False):
                setattr(cls, name, wrap(fn))

    def __setattr__(self, name: str, value: Any) -> None:
        # LightningDataModule.from_datasets sets train_dataloader on the instance: wrapped like a method.
        if name in _WRAPPERS and callable(value) and not getattr(value, "_loadguard_wrapped", False):
            value = _bind_wrapper(self, name, value)
        super().__setattr__(name, value)

    def state_dict(self) -> dict[str, Any]:
        state: dict[str, Any] = dict(super().state_dict())  # type: ignore[misc]
        return self._loadguard_add_state(state)

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        super().load_state_dict(self._loadguard_take_state(state_dict))  # type: ignore[misc]

    state_dict._loadguard_wrapped = True  # type: ignore[attr-defined]
    load_state_dict._loadguard_wrapped = True  # type: ignore[attr-defined]

    @property
    def loader_position(self) -> LoaderPosition | None:
        """The consumer's position in the train loader now (``None`` before a loader was built, and for
        several loaders, whose positions are in the checkpoint)."""
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
        epoch, consumed = self.__dict__["_loadguard_cursor"].position
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
        # At an epoch's start the state is the one the dataset reached at the previous epoch's end (it may
        # have moved itself to its next epoch there), or the new iteration's first boundary.
        if consumed == 0 and order.final_state is not None:
            dataset_state = order.final_state
        else:
            dataset_state = order.state_at(consumed) if consumed or order.recorded(0) else None
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
        parts = self.__dict__.get("_loadguard_parts")
        if parts is not None and trainer is not None:
            epoch, batches = self.__dict__["_loadguard_cursor"].position
            state[STATE_KEY] = {
                "combined": {"epoch": epoch, "batches": batches},
                "loaders": {str(key): part.position().state_dict() for key, part in parts.items()},
            }
        elif loader is not None and trainer is not None:
            state[STATE_KEY] = self._loadguard_position(loader, trainer).state_dict()
        elif (pending := self.__dict__.get("_loadguard_loaded")) is not None:
            state[STATE_KEY] = pending.state_dict() if isinstance(pending, LoaderPosition) else pending.raw
        return state

    def _loadguard_take_state(self, state_dict: dict[str, Any]) -> dict[str, Any]:
        rest = dict(state_dict)
        raw = rest.pop(STATE_KEY, None)
        self.__dict__["_loadguard_state_seen"] = True
        if raw is None:
            return rest
        if isinstance(raw, dict) and "loaders" in raw:
            self.__dict__["_loadguard_loaded"] = _SeveralPositions.from_state(raw, getattr(self, "trainer", None))
            if getattr(self, "trainer", None) is not None:
                self._loadguard_attach(self.trainer)
            return rest
        position = LoaderPosition.from_state_dict(raw)
        trainer = getattr(self, "trainer", None)
        if trainer is not None:
            repair_restored_progress(trainer, position.epoch, position.batches_consumed)
        if trainer is not None and position.world_size != trainer.world_size:
            if trainer.limit_train_batches not in (None, 1.0):
                raise PositionMismatchError(
                    f"cannot continue an epoch started with world_size={position.world_size} on "
                    f"world_size={trainer.world_size} with limit_train_batches={trainer.limit_train_batches}: "
                    "the limit counts batches per rank, so the samples the old run left out of the epoch are "
                    "not the ones the new run would leave out"
                )
            moved = reshard_position(position, trainer.world_size)
            shift_restored_batch_count(trainer, moved.batches_consumed - position.batches_consumed)
            position = moved
        self.__dict__["_loadguard_loaded"] = position
        if trainer is not None:
            # Checked at the first step even if train_dataloader() never reaches the mixin.
            self._loadguard_attach(trainer)
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
        if isinstance(loader, (dict, list, tuple)) and loader:
            return self._loadguard_adapt_several(loader, trainer)
        several = _several_loaders(loader)
        if several is not None:
            raise ValueError(
                f"train_dataloader() returned {several} loaders: ResumableLoaderMixin continues several "
                "loaders only as a dict or list (Lightning's default mode, max_size_cycle), since a "
                "CombinedLoader's mode cannot be read back to rebuild it. Return the dict or list of loaders "
                "instead, or remove ResumableLoaderMixin to train without exact resume"
            )
        if not isinstance(loader, DataLoader):
            return self._loadguard_unpositioned(
                loader,
                trainer,
                f"train_dataloader() returned a {type(loader).__qualname__}, not a DataLoader, whose position "
                "ResumableLoaderMixin cannot store",
                "Return a torch DataLoader from train_dataloader()",
            )
        if is_stateful(loader) and not rebuildable(loader):
            return self._loadguard_keep_stateful(loader, trainer)
        if not rebuildable(loader):
            return self._loadguard_unpositioned(
                loader,
                trainer,
                f"train_dataloader() returned a {type(loader).__qualname__} (a DataLoader subclass), which "
                "ResumableLoaderMixin cannot rebuild with a resumable order (its own arguments cannot be read "
                "back), so it is used as is",
                "Return a plain DataLoader (the mixin rebuilds it exactly)",
            )
        if isinstance(loader.dataset, IterableDataset) and not is_stateful(loader.dataset):
            if not self.allow_inexact_resume and iterates_twice_on_resume(trainer):
                raise PositionMismatchError(
                    f"cannot resume at the start of epoch {trainer.current_epoch} exactly from "
                    f"{trainer.ckpt_path}: Lightning {pl.__version__} iterates the train loader twice when a fit "
                    f"resumes at an epoch's start after epoch 0 (2.6 once), and "
                    f"{type(loader.dataset).__qualname__} is an IterableDataset without state_dict()/"
                    "load_state_dict(): where it keeps its place between iterations, the batch the first "
                    "iteration read ahead is never trained. Implement state_dict()/load_state_dict() on the "
                    "dataset (the mixin then starts both iterations from the saved state), use Lightning 2.6, "
                    "or set allow_inexact_resume = True on the DataModule to continue as Lightning does"
                )
            return self._loadguard_unpositioned(
                loader,
                trainer,
                f"{type(loader.dataset).__qualname__} is an IterableDataset without state_dict()/"
                "load_state_dict(): where it stands cannot be stored, and a resumed epoch would start the "
                "dataset from its beginning",
                "Implement state_dict()/load_state_dict() on the dataset (torchdata's Stateful protocol, read "
                "with num_workers=0) or use a map-style dataset",
            )
        self.__dict__.pop("_loadguard_why_unpositioned", None)
        iterations = align_with_lightning_restart(trainer)
        loaded = self.__dict__.pop("_loadguard_loaded", None)
        seed = self._loadguard_seed_for(trainer, loaded)
        made = make_resumable(loader, seed=seed, rank=trainer.global_rank, world_size=trainer.world_size)
        order = planned_sampler(made)
        cursor = self._loadguard_cursor_for(trainer, loaded)
        if loaded is not None:
            if isinstance(order, PlannedSampler):
                order.resume(loaded)
            elif isinstance(order, PlannedBatchSampler):
                if loaded.dataset_len != len(made.dataset):  # type: ignore[arg-type]
                    raise PositionMismatchError(
                        f"dataset length changed: the position was taken over {loaded.dataset_len} samples, "
                        f"the dataset now has {len(made.dataset)}"  # type: ignore[arg-type]
                    )
            elif loaded.dataset_state is not None:
                order.resume(loaded.dataset_state, loaded.batches_consumed, iterations=iterations)
            if loaded.batches_consumed > 0 and "_loadguard_restore_warnings" not in self.__dict__:
                # The mixin guarantees this mid-epoch resume; Lightning's warning that it is unreliable is not.
                self.__dict__["_loadguard_restore_warnings"] = silence_not_resumable_warning()
        elif trainer.ckpt_path and not self.__dict__.get("_loadguard_state_seen"):
            # Refused at the first step if the trainer continues inside an epoch (_loadguard_first_batch); with
            # allow_inexact_resume the epoch restarts from its first batch while the trainer counts on.
            self.__dict__["_loadguard_why_unpositioned"] = _no_position(trainer.ckpt_path)
            self.__dict__["_loadguard_unchecked"] = True
        if isinstance(order, (PlannedSampler, PlannedBatchSampler)):
            order.cursor = cursor
        self.__dict__["_loadguard_loader"] = made
        self._loadguard_attach(trainer)
        return made

    def _loadguard_attach(self, trainer: Any) -> None:
        """Put the consumer hooks first in the trainer's callbacks (once)."""
        hooks = self.__dict__.setdefault("_loadguard_hooks", _ConsumerHooks(self))
        put_callback_first(trainer, hooks)

    def _loadguard_unpositioned(self, loader: Any, trainer: Any, why: str, fix: str) -> Any:
        """Use ``loader`` as is: a fresh fit and a resume at an epoch's start run; a resume inside an epoch is
        refused at its first step (``_loadguard_first_batch``) unless ``allow_inexact_resume`` is set."""
        self.__dict__["_loadguard_why_unpositioned"] = (why, fix)
        # A loaded position does not apply to this loader, and must not pass on to this run's checkpoints.
        for name in ("_loadguard_loader", "_loadguard_parts", "_loadguard_loaded", "_loadguard_cursor_trainer"):
            self.__dict__.pop(name, None)
        self.__dict__.pop("_loadguard_cursor", None)
        if not self.allow_inexact_resume:
            self._loadguard_warn_once(
                "unpositioned",
                f"{why}: checkpoints of this run resume exactly only at an epoch's start, and resuming inside an "
                f"epoch will be refused. {fix}",
            )
        self._loadguard_attach(trainer)
        return loader

    def _loadguard_first_batch(self, trainer: Any, batch_idx: int) -> None:
        """Refuse a resumed fit whose first step is inside an epoch while no loader continues it exactly.

        Lightning's batch index of the first step after restoring a checkpoint says where it continues: past
        0, it trains the rest of an epoch, from a loader the mixin could not position (or never saw).

        Raises:
            PositionMismatchError: that case, unless ``allow_inexact_resume`` is set (then one warning).
        """
        if batch_idx == 0 or not trainer.ckpt_path:
            return
        why_fix = self.__dict__.get("_loadguard_why_unpositioned")
        if why_fix is None and self.__dict__.get("_loadguard_cursor_trainer") is trainer:
            return
        why, fix = why_fix or (
            "train_dataloader() never reached ResumableLoaderMixin (it was replaced after the class was made)",
            "Define train_dataloader on the DataModule class",
        )
        message = (
            f"cannot resume inside epoch {trainer.current_epoch} exactly (the trainer continues at its batch "
            f"{batch_idx} from {trainer.ckpt_path}): {why}. {fix}; or resume from a checkpoint written at an "
            "epoch's end; or set allow_inexact_resume = True on the DataModule to continue as Lightning does, "
            "not exactly"
        )
        if not self.allow_inexact_resume:
            raise PositionMismatchError(message)
        self._loadguard_warn_once("inexact", message.replace("cannot resume", "allow_inexact_resume: not resuming"))

    def _loadguard_adapt_several(self, loaders: dict[Any, Any] | list[Any] | tuple[Any, ...], trainer: Any) -> Any:
        """Position every loader of a dict or list (Lightning combines them, cycling the shorter ones).

        Each loader gets its own order and cursor: a shorter loader that runs out starts its next pass, as
        Lightning restarts it, and a pass cut by the epoch's end is left for the next one, as a new epoch
        restarts every loader. A checkpoint holds the epoch's batch count and every loader's position.
        """
        items = list(loaders.items()) if isinstance(loaders, dict) else list(enumerate(loaders))
        for key, child in items:
            if (
                not isinstance(child, DataLoader)
                or not rebuildable(child)
                or isinstance(child.dataset, IterableDataset)
            ):
                raise ValueError(
                    f"train_dataloader() returned several loaders, and loader {key!r} is a "
                    f"{type(child).__qualname__} over {type(getattr(child, 'dataset', None)).__qualname__}: "
                    "ResumableLoaderMixin continues several loaders only when each is a plain DataLoader over a "
                    "map-style dataset. Return one loader, or remove ResumableLoaderMixin to train without "
                    "exact resume"
                )
        loaded = self.__dict__.pop("_loadguard_loaded", None)
        if loaded is not None and not isinstance(loaded, _SeveralPositions):
            raise PositionMismatchError(
                f"the checkpoint holds the position of one train loader, train_dataloader() now returns {len(items)}"
            )
        if loaded is not None and set(loaded.loaders) != {str(key) for key, _ in items}:
            raise PositionMismatchError(
                f"the checkpoint holds positions of the train loaders {sorted(loaded.loaders)}, "
                f"train_dataloader() now returns {sorted(str(key) for key, _ in items)}"
            )
        first = next(iter(loaded.loaders.values())) if loaded is not None else None
        seed = self._loadguard_seed_for(trainer, first)
        old_parts: dict[Any, _Part] = self.__dict__.get("_loadguard_parts") or {}
        same_fit = self.__dict__.get("_loadguard_cursor_trainer") is trainer
        parts: dict[Any, _Part] = {}
        for index, (key, child) in enumerate(items):
            made = make_resumable(
                child, seed=_part_seed(seed, index), rank=trainer.global_rank, world_size=trainer.world_size
            )
            order = planned_sampler(made)
            position = loaded.loaders[str(key)] if loaded is not None else None
            if position is not None:
                if isinstance(order, PlannedSampler):
                    order.resume(position)
                cursor = EpochCursor(position.epoch, position.batches_consumed)
            elif same_fit and key in old_parts:
                cursor = old_parts[key].cursor
            else:
                cursor = EpochCursor(trainer.current_epoch, 0)
            order.cursor = cursor  # type: ignore[union-attr]
            parts[key] = _Part(made, cursor)
        if loaded is not None:
            self.__dict__["_loadguard_cursor"] = EpochCursor(*loaded.combined)
            if loaded.combined[1] > 0 and "_loadguard_restore_warnings" not in self.__dict__:
                self.__dict__["_loadguard_restore_warnings"] = silence_not_resumable_warning()
        elif not same_fit or "_loadguard_cursor" not in self.__dict__:
            self.__dict__["_loadguard_cursor"] = EpochCursor(trainer.current_epoch, 0)
        self.__dict__["_loadguard_cursor_trainer"] = trainer
        self.__dict__["_loadguard_parts"] = parts
        self.__dict__.pop("_loadguard_loader", None)
        self.__dict__.pop("_loadguard_why_unpositioned", None)
        if loaded is None and trainer.ckpt_path and not self.__dict__.get("_loadguard_state_seen"):
            self.__dict__["_loadguard_why_unpositioned"] = _no_position(trainer.ckpt_path)
        self._loadguard_attach(trainer)
        made_loaders = [part.loader for part in parts.values()]
        if isinstance(loaders, dict):
            return dict(zip(parts, made_loaders, strict=True))
        return type(loaders)(made_loaders)

    def _loadguard_keep_stateful(self, loader: DataLoader, trainer: Any) -> DataLoader:
        """Leave a loader that keeps its own position (litdata's StreamingDataLoader, torchdata's
        StatefulDataLoader over an iterable dataset) to that state, which Lightning saves in every checkpoint.
        Replacing its sampler would position it twice, and its workers' dataset state is out of the mixin's
        reach.

        Raises:
            PositionMismatchError: resuming mid-epoch without a length: Lightning reads such a loader one
                batch ahead of the training step, and the state it saves counts that batch as consumed.
        """
        try:
            sized = len(loader) >= 0
        except TypeError:
            sized = False
        if not sized and trainer.ckpt_path and batches_done_in_epoch(trainer) > 0:
            raise PositionMismatchError(
                f"cannot resume {type(loader).__qualname__} mid-epoch exactly: it has no length, so Lightning "
                "fetches one batch ahead of the training step and the loader state in the checkpoint already "
                "counts that batch, which the resumed run would skip. Give the dataset a __len__, resume from a "
                "checkpoint written at an epoch's end, or remove ResumableLoaderMixin to accept the skip"
            )
        self._loadguard_warn_once(
            "stateful",
            f"{type(loader).__qualname__} keeps its own position (state_dict()/load_state_dict()): "
            "ResumableLoaderMixin leaves resuming to that state, which Lightning saves in every checkpoint",
        )
        # The loader positions itself: a position loaded from the checkpoint is not the mixin's to apply, and
        # the first-step check has nothing to refuse.
        for name in ("_loadguard_loader", "_loadguard_parts", "_loadguard_loaded", "_loadguard_why_unpositioned"):
            self.__dict__.pop(name, None)
        self.__dict__.pop("_loadguard_cursor", None)
        self.__dict__["_loadguard_cursor_trainer"] = trainer
        if trainer.ckpt_path and isinstance(getattr(loader, "restore", None), bool):
            # litdata's StreamingDataLoader sets `restore` when its state is loaded and clears it only when an
            # epoch's iterator runs to its end, which Lightning never asks of a loader with a length: every
            # later epoch would then continue the resumed one's position instead of starting afresh.
            self.__dict__["_loadguard_restoring"] = (loader, trainer.current_epoch)
            put_callback_first(trainer, self.__dict__.setdefault("_loadguard_hooks", _ConsumerHooks(self)))
        return loader

    def _loadguard_cursor_for(self, trainer: Any, loaded: LoaderPosition | None) -> EpochCursor:
        """The cursor of this fit: a loaded position starts it; a loader rebuilt during the fit keeps it."""
        cursor: EpochCursor | None = self.__dict__.get("_loadguard_cursor")
        if loaded is not None:
            cursor = EpochCursor(loaded.epoch, loaded.batches_consumed)
        elif cursor is None or self.__dict__.get("_loadguard_cursor_trainer") is not trainer:
            cursor = EpochCursor(trainer.current_epoch, 0)
        self.__dict__["_loadguard_cursor"] = cursor
        self.__dict__["_loadguard_cursor_trainer"] = trainer
        return cursor

    def _loadguard_epoch_started(self) -> None:
        restoring = self.__dict__.get("_loadguard_restoring")
        trainer = getattr(self, "trainer", None)
        if restoring is not None and trainer is not None and trainer.current_epoch > restoring[1]:
            restoring[0].restore = False
            del self.__dict__["_loadguard_restoring"]
        if (cursor := self.__dict__.get("_loadguard_cursor")) is not None:
            if self.__dict__.pop("_loadguard_unchecked", False):
                cursor.batches = 0
            cursor.epoch_started()
        for part in (self.__dict__.get("_loadguard_parts") or {}).values():
            part.cursor.epoch_started()

    def _loadguard_before_batch(self, trainer: Any, batch_idx: int) -> None:
        self._loadguard_release_warnings()
        if self.__dict__.get("_loadguard_first_checked") is not trainer:
            self.__dict__["_loadguard_first_checked"] = trainer
            self._loadguard_first_batch(trainer, batch_idx)
        cursor = self.__dict__.get("_loadguard_cursor")
        if cursor is None:
            return
        if self.__dict__.get("_loadguard_unchecked"):
            cursor.batches = batch_idx
            return
        loader = self.__dict__.get("_loadguard_loader")
        if loader is not None and isinstance(planned_sampler(loader), StatefulIterableTap):
            # An unsized loader's epoch ends when it runs out, not at a batch count: the trainer's index may
            # run on from the previous epoch (Lightning 2.5+ after a checkpoint on the last batch) unharmed.
            return
        cursor.check_next(batch_idx)

    def _loadguard_after_batch(self, trainer: Any) -> None:
        cursor = self.__dict__.get("_loadguard_cursor")
        parts = self.__dict__.get("_loadguard_parts")
        if cursor is not None and parts is not None:
            epoch = cursor.epoch
            cursor.consumed(trainer.num_training_batches)
            # Each loader gave one batch (max_size_cycle); one that ran out starts its next pass.
            for part in parts.values():
                part.cursor.consumed(len(part.loader))
                if cursor.epoch != epoch:
                    # The epoch is over for every loader: a cut pass is not continued, as the next epoch
                    # restarts every loader (also when a resume skips the next on_train_epoch_start).
                    part.cursor.epoch_started()
            return
        loader = self.__dict__.get("_loadguard_loader")
        if cursor is None or loader is None:
            return
        total: float = trainer.num_training_batches
        order = planned_sampler(loader)
        if isinstance(order, StatefulIterableTap):
            # An unsized loader's epoch is over when its iteration ran out and every batch it made was trained.
            total = order.final_batches if order.final_batches is not None else math.inf
        cursor.consumed(total)

    def _loadguard_release_warnings(self) -> None:
        restore = self.__dict__.pop("_loadguard_restore_warnings", None)
        if restore is not None:
            restore()

    def _loadguard_release(self) -> None:
        self._loadguard_release_warnings()
        hooks = self.__dict__.get("_loadguard_hooks")
        trainer = getattr(self, "trainer", None)
        if hooks is not None and trainer is not None:
            remove_callback(trainer, hooks)


def _no_position(ckpt_path: str) -> tuple[str, str]:
    """Why a resume from ``ckpt_path`` cannot be positioned, and the fix."""
    return (
        f"the checkpoint {ckpt_path} holds no train-loader position (written without ResumableLoaderMixin, or by "
        "an older run)",
        "Resume from a checkpoint written at an epoch's end, or by a run with ResumableLoaderMixin",
    )


class _Once:
    """Counts nested calls of one wrapped hook on one datamodule: only the outermost call adds the mixin's work.

    An override that returns ``super().train_dataloader()`` runs two wrapped functions; the inner one returns
    the user's loader untouched and the outer one positions whatever the override finally returns.
    """

    def __init__(self, owner: Any, name: str) -> None:
        self.depths: dict[str, int] = owner.__dict__.setdefault("_loadguard_depths", {})
        self.name = name

    def __enter__(self) -> bool:
        depth = self.depths.get(self.name, 0)
        self.depths[self.name] = depth + 1
        return depth == 0

    def __exit__(self, *exc: object) -> None:
        self.depths[self.name] -= 1


def _mark(fn: Callable[..., Any]) -> Callable[..., Any]:
    fn._loadguard_wrapped = True  # type: ignore[attr-defined]
    return fn


def _wrap_train_dataloader(fn: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(fn)
    def train_dataloader(self: ResumableLoaderMixin, *args: Any, **kwargs: Any) -> Any:
        outermost = False
        try:
            with _Once(self, "train_dataloader") as outermost:
                loader = fn(self, *args, **kwargs)
            return self._loadguard_adapt(loader) if outermost else loader
        except BaseException:
            if outermost:
                # Lightning restores the loader classes it patched for this call only when the call returns.
                restore_loader_classes()
            raise

    return _mark(train_dataloader)


def _wrap_state_dict(fn: Callable[..., dict[str, Any]]) -> Callable[..., dict[str, Any]]:
    @functools.wraps(fn)
    def state_dict(self: ResumableLoaderMixin, *args: Any, **kwargs: Any) -> dict[str, Any]:
        with _Once(self, "state_dict") as outermost:
            state = fn(self, *args, **kwargs)
        return self._loadguard_add_state(dict(state)) if outermost else state

    return _mark(state_dict)


def _wrap_load_state_dict(fn: Callable[..., None]) -> Callable[..., None]:
    @functools.wraps(fn)
    def load_state_dict(self: ResumableLoaderMixin, state_dict: dict[str, Any], *args: Any, **kwargs: Any) -> None:
        with _Once(self, "load_state_dict") as outermost:
            fn(self, self._loadguard_take_state(state_dict) if outermost else state_dict, *args, **kwargs)

    return _mark(load_state_dict)


_WRAPPERS: dict[str, Callable[[Callable[..., Any]], Callable[..., Any]]] = {
    "train_dataloader": _wrap_train_dataloader,
    "state_dict": _wrap_state_dict,
    "load_state_dict": _wrap_load_state_dict,
}


def _bind_wrapper(owner: Any, name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
    """The wrapper of ``name`` around ``fn``, a function set on the ``owner`` instance (called without self)."""
    wrapped = _WRAPPERS[name](lambda _self, *args, **kwargs: fn(*args, **kwargs))

    @functools.wraps(fn)
    def bound(*args: Any, **kwargs: Any) -> Any:
        return wrapped(owner, *args, **kwargs)

    return _mark(bound)
