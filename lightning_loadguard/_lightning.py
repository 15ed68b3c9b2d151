"""Everything that touches Lightning's internals, in one place, each with a fallback.

Works with the unified ``lightning`` package and with the standalone ``pytorch_lightning`` package. Each
internal says the Lightning versions whose sources were checked for it (the declared range is 2.5 to 2.6;
``tests/test_lightning_seam.py`` checks the installed one) and what LoadGuard does where it is missing. No
other module of the package touches a Lightning private name (the same test greps for them).
"""

from __future__ import annotations

import math
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

import torch

try:
    import lightning.pytorch as pl
except ImportError:  # pragma: no cover - the standalone package only
    import pytorch_lightning as pl  # type: ignore[no-redef]

from lightning_loadguard.position.state import PositionMismatchError

Callback = pl.Callback

_FETCH_ACTION_SUFFIX = "].train_dataloader_next"
_FETCH_ACTION_PREFIX = "[_TrainingEpochLoop"
FETCH_ACTION = f"{_FETCH_ACTION_PREFIX}{_FETCH_ACTION_SUFFIX}"
"""The profiler action that brackets each training fetch, as the user's own profiler reports it."""


_fetch_actions: dict[str, bool] = {}


def _is_fetch(action_name: str) -> bool:
    # Asked twice per training step for the same few names: remember the answer.
    known = _fetch_actions.get(action_name)
    if known is None:
        known = action_name.endswith(_FETCH_ACTION_SUFFIX) and action_name.startswith(_FETCH_ACTION_PREFIX)
        if len(_fetch_actions) < 256:
            _fetch_actions[action_name] = known
    return known


class FetchTimingProfiler:
    """Wraps the trainer's profiler to see exactly when the training loop fetches its batches.

    Lightning brackets every training fetch with ``profiler.start/stop("[_TrainingEpochLoop]
    .train_dataloader_next")``. Everything else goes to the user's profiler untouched; ``profile()``, which
    Lightning calls around every hook of every step, is the user's own bound method, so it costs nothing.

    The action name is ``f"[{type(self).__name__}].train_dataloader_next"`` in ``_TrainingEpochLoop`` in
    Lightning 2.0.0 to 2.6.6 (sources checked). Where it differs, no fetch is timed: the consumer's figures
    (wait, step, throughput) read "not measured", LoadGuard says so once at the end of the epoch, and the
    producer's are measured in the workers regardless.

    ``on_fetch_start`` and ``on_fetch_stop`` get the clock's reading. Nothing they raise reaches the loop (a
    ``StopIteration`` there would end Lightning's epoch): ``on_error`` hears of the first failure, and no fetch
    is timed from then on.
    """

    def __init__(
        self,
        inner: Any,
        on_fetch_start: Callable[[float], None],
        on_fetch_stop: Callable[[float], None],
        on_error: Callable[[Exception], None],
    ) -> None:
        object.__setattr__(self, "_inner", inner)
        object.__setattr__(self, "_on_fetch_start", on_fetch_start)
        object.__setattr__(self, "_on_fetch_stop", on_fetch_stop)
        object.__setattr__(self, "_on_error", on_error)
        # The default profiler's start and stop do nothing: calling them twice per step would be pure cost.
        object.__setattr__(self, "_delegate", type(inner) is not pl.profilers.PassThroughProfiler)
        object.__setattr__(self, "profile", inner.profile)

    @property
    def inner(self) -> Any:
        return self._inner

    @property  # type: ignore[misc]
    def __class__(self) -> type:
        """The user's profiler's class: ``isinstance(trainer.profiler, SimpleProfiler)`` in the user's code holds
        during fit as it does without LoadGuard (``isinstance`` consults ``__class__`` where the type differs)."""
        return type(self._inner)

    def start(self, action_name: str) -> None:
        if self._delegate:
            self._inner.start(action_name)
        # The cache read inline: the fetch's own name is known after its first step, and each call costs here.
        if (_fetch_actions.get(action_name) or _is_fetch(action_name)) and self._on_fetch_start is not None:
            try:
                self._on_fetch_start(time.perf_counter())
            except Exception as err:
                self._fail(err)

    def stop(self, action_name: str) -> None:
        now = None
        if (_fetch_actions.get(action_name) or _is_fetch(action_name)) and self._on_fetch_stop is not None:
            try:
                now = time.perf_counter()
            except Exception as err:
                self._fail(err)
        # The user's profiler ends the fetch right after this clock: what LoadGuard does with the reading (a
        # sampled system call among it, where a busy host may take the core) is not the fetch's.
        if self._delegate:
            self._inner.stop(action_name)
        if now is not None:
            try:
                self._on_fetch_stop(now)  # type: ignore[misc]
            except Exception as err:
                self._fail(err)

    def _fail(self, err: Exception) -> None:
        object.__setattr__(self, "_on_fetch_start", None)
        object.__setattr__(self, "_on_fetch_stop", None)
        self._on_error(err)

    def __getattr__(self, name: str) -> Any:
        if name in _PROXY_SLOTS:
            # copy and pickle build the proxy without __init__ and probe it before its state is back.
            raise AttributeError(name)
        return getattr(self._inner, name)

    def __setattr__(self, name: str, value: Any) -> None:
        setattr(self._inner, name, value)

    def __getstate__(self) -> dict[str, Any]:
        return dict(self.__dict__)

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)

    def __reduce_ex__(self, protocol: Any) -> tuple[Any, ...]:
        # Rebuilt as the proxy it is: pickle's default would take ``__class__``, the user's profiler's class.
        return _empty_fetch_timing_profiler, (), self.__getstate__()


def _empty_fetch_timing_profiler() -> FetchTimingProfiler:
    return object.__new__(FetchTimingProfiler)


_PROXY_SLOTS = frozenset({"_inner", "_on_fetch_start", "_on_fetch_stop", "_on_error", "_delegate", "profile"})


def is_tensorboard_logger(logger: object) -> bool:
    """Whether ``logger`` is a ``TensorBoardLogger`` (or a subclass) of either Lightning distribution loaded.

    Public classes, no internals: a run may use ``pytorch_lightning``'s logger while this module imported
    ``lightning.pytorch`` (or the reverse), and the two classes are distinct.

    Example:
        >>> is_tensorboard_logger(pl.loggers.TensorBoardLogger("/tmp")), is_tensorboard_logger(object())
        (True, False)
    """
    classes = tuple(
        cls
        for cls in (getattr(sys.modules.get(name), "TensorBoardLogger", None) for name in _LOGGER_MODULES)
        if isinstance(cls, type)
    )
    return isinstance(logger, classes)


_LOGGER_MODULES = ("lightning.pytorch.loggers", "pytorch_lightning.loggers")


def log_text(loggers: Sequence[Any], tag: str, text: str, step: int) -> None:
    """``text`` under ``tag`` to every logger that takes text: TensorBoard's Text tab, and a one-cell table
    (column: the tag's last part) for a logger with ``log_text`` (Weights & Biases, ...). The loggers' own
    calls: a logger's failure is the user's to see.

    Example:
        >>> class Tables:
        ...     def log_text(self, key, columns, data, step): print(key, columns, data, step)
        >>> log_text([Tables(), object()], "loadguard/diagnosis", "Loader is fine.", 7)
        loadguard/diagnosis ['diagnosis'] [['Loader is fine.']] 7
    """
    for logger in loggers:
        if is_tensorboard_logger(logger):
            experiment = logger.experiment
            if hasattr(experiment, "add_text"):
                experiment.add_text(tag, text, global_step=step)
        elif callable(getattr(logger, "log_text", None)):
            logger.log_text(key=tag, columns=[tag.rsplit("/", 1)[-1]], data=[[text]], step=step)


def node_device_count(trainer: Any) -> int | None:
    """Devices of the trainer's accelerator on this node (``None`` on the CPU, where a node's size in ranks is the
    user's choice, or where the accelerator cannot count them).

    ``Accelerator.auto_device_count()``, public in Lightning 2.0 to 2.6 (sources checked).
    """
    if trainer.strategy.root_device.type == "cpu":
        return None
    try:
        count = int(type(trainer.accelerator).auto_device_count())
    except Exception:
        return None
    return count if count >= 1 else None


def install_profiler(trainer: Any, proxy_factory: Callable[[Any], FetchTimingProfiler]) -> bool:
    if isinstance(trainer.profiler, FetchTimingProfiler):
        return False
    trainer.profiler = proxy_factory(trainer.profiler)
    return True


def uninstall_profiler(trainer: Any) -> None:
    if isinstance(trainer.profiler, FetchTimingProfiler):
        trainer.profiler = trainer.profiler.inner


class _LoadStatesThenNotify:
    """Stands in for ``FitLoop._load_combined_loader_states`` on one fit loop; a plain object, so the fit
    loop (and the trainer) can still be copied and pickled."""

    def __init__(self, fit_loop: Any, original: Callable[[Any], None], on_ready: Callable[[list[Any]], None]) -> None:
        self.fit_loop = fit_loop
        self.original = original
        self.on_ready = on_ready

    def __call__(self) -> None:
        self.original(self.fit_loop)
        combined = self.fit_loop._combined_loader
        if combined is not None:
            self.on_ready(list(combined.flattened))


def hook_loaders_ready(trainer: Any, on_ready: Callable[[list[Any]], None]) -> bool:
    """Call ``on_ready(loaders)`` each time the fit loop has built its train loaders, before ``iter()``.

    Lightning creates the epoch-0 iterator (and starts workers) inside ``FitLoop.setup_data`` right after
    restoring loader states; no public hook runs between the two. Returns ``False`` where that internal
    step does not exist (the caller then instruments at ``on_train_start``, one iterator later).

    Wraps ``FitLoop._load_combined_loader_states`` (Lightning 2.2.0 to 2.6.6, sources checked; absent in
    2.0 and 2.1) on the instance and reads ``fit_loop._combined_loader`` (2.0.0 to 2.6.6).
    """
    fit_loop = trainer.fit_loop
    original = getattr(type(fit_loop), "_load_combined_loader_states", None)
    if original is None:
        return False
    fit_loop._load_combined_loader_states = _LoadStatesThenNotify(fit_loop, original, on_ready)
    return True


def unhook_loaders_ready(trainer: Any) -> None:
    if isinstance(trainer.fit_loop.__dict__.get("_load_combined_loader_states"), _LoadStatesThenNotify):
        del trainer.fit_loop.__dict__["_load_combined_loader_states"]


def train_loaders(trainer: Any) -> list[Any]:
    """The fit loop's train loaders, from ``fit_loop._combined_loader`` (Lightning 2.0.0 to 2.6.6, sources
    checked). Where it is missing: none, so no loader is probed and producer capacity is not measured."""
    combined = getattr(trainer.fit_loop, "_combined_loader", None)
    return list(combined.flattened) if combined is not None else []


def gather_rows(trainer: Any, row: Sequence[float]) -> list[list[float]]:
    """Every rank's ``row`` of figures (equal lengths), by global rank, in one collective: the strategy's public
    ``all_gather`` (any strategy; the row travels as float64 on the strategy's device, as NCCL needs)."""
    strategy = trainer.strategy
    tensor = torch.tensor([float(v) for v in row], dtype=torch.float64, device=strategy.root_device)
    # Stacked by rank: (world, length), or the tensor itself where one process trains.
    gathered = strategy.all_gather(tensor)
    return gathered.reshape(int(trainer.world_size), len(row)).cpu().tolist()


def log_step(trainer: Any) -> int:
    """The step axis Lightning's own logged metrics use: ``epoch_loop._batches_that_stepped`` (Lightning 2.0.0
    to 2.6.6, sources checked), ``trainer.global_step`` where it is missing."""
    try:
        return int(trainer.fit_loop.epoch_loop._batches_that_stepped)
    except AttributeError:
        return int(trainer.global_step)


# --- Exact resume (ResumableLoaderMixin) --------------------------------------------------------------------
# Checked on Lightning 2.6.6 (installed) and 2.4.0 / 2.5.x (the range pyproject declares). Where an internal
# read here is missing, the accessor raises ``PositionMismatchError`` with the reason instead of guessing.

_PROGRESS_FIELDS = ("ready", "started", "processed", "completed")

NOT_RESUMABLE_WARNING = "You're resuming from a checkpoint that ended before the epoch ended and your dataloader is"
"""Start of the warning ``_TrainingEpochLoop.reset`` prints on a mid-epoch resume of a loader without
``state_dict`` (the same text on 2.4, 2.5 and 2.6)."""


def _missing(what: str, err: BaseException) -> PositionMismatchError:
    return PositionMismatchError(
        f"this Lightning version ({pl.__version__}) keeps no {what} where versions 2.5-2.6 do ({err!r}); the "
        "loader position cannot be aligned with the trainer's, so exact resume is refused"
    )


def loaded_checkpoint(trainer: Any) -> dict[str, Any] | None:
    """The checkpoint the trainer is restoring (``None`` once restored or when not resuming).

    ``trainer._checkpoint_connector._loaded_checkpoint``: 2.4-2.6. Missing: ``PositionMismatchError``.
    """
    try:
        return trainer._checkpoint_connector._loaded_checkpoint or None
    except AttributeError as err:
        raise _missing("checkpoint being restored", err) from err


def batches_done_in_epoch(trainer: Any) -> int:
    """Batches the trainer counts as done in its current epoch (restored from a checkpoint when resuming).

    ``fit_loop.epoch_loop.batch_progress.current.processed``: 2.4-2.6. Missing: ``PositionMismatchError``.
    """
    try:
        return int(trainer.fit_loop.epoch_loop.batch_progress.current.processed)
    except AttributeError as err:
        raise _missing("batch progress", err) from err


def shift_restored_batch_count(trainer: Any, delta: int) -> None:
    """Move the batch count the trainer is about to restore by ``delta`` (a new world size's coordinates).

    The datamodule's state is loaded before the loops', so the loaded checkpoint can still be edited; the
    trainer then counts to the epoch's length exactly when the re-sharded remainder runs out. The layout
    ``ckpt["loops"]["fit_loop"]["epoch_loop.batch_progress"]["current"]`` is the one of 2.4-2.6.
    """
    if delta == 0:
        return
    try:
        loaded = loaded_checkpoint(trainer)
        current = loaded["loops"]["fit_loop"]["epoch_loop.batch_progress"]["current"]  # type: ignore[index]
        values = {f: int(current[f]) for f in _PROGRESS_FIELDS}
    except (KeyError, TypeError) as err:
        raise _missing("batch progress in the checkpoint", err) from err
    for name, value in values.items():
        current[name] = value + delta


def align_with_lightning_restart(trainer: Any) -> int:
    """Make Lightning 2.4 restore the loops as 2.5+ does; return how often it will start iterating the train
    loader before the first resumed training step.

    Two restart details changed, each detected by the attribute that came with it
    (``_TrainingEpochLoop.restarted_on_train_batch_end`` from 2.5, ``_FitLoop.is_resuming`` from 2.6; on 2.6,
    with both, this function changes nothing):

    - A checkpoint written in ``on_train_batch_end`` holds ``processed = completed + 1``. 2.5+ resumes after
      that batch, or in the next epoch when it was the epoch's last. 2.4 sets every batch counter back to
      ``completed``: it would train one batch more than the epoch has left. The counters are moved to what
      2.5 restores (:func:`_finish_saved_batch`) before the loops reset: in the checkpoint still being
      restored when the loader is built early (``estimated_stepping_batches`` in ``configure_optimizers``),
      else in the restored loops (writing ``_batches_that_stepped`` and ``fit_loop.restarting``).
    - Resumed at an epoch boundary after epoch 0, Lightning before 2.6 iterates the loader in ``setup_data``
      and again at the epoch's start, dropping what the first iterator fetched ahead; 2.6 keeps the first. A dataset
      whose state moves as it is read must then start both iterations from the saved state.
    """
    fit_loop = trainer.fit_loop
    epoch_loop = fit_loop.epoch_loop
    if trainer.ckpt_path is None:
        return 1
    modern_batch_end = hasattr(epoch_loop, "restarted_on_train_batch_end")
    modern_resume = hasattr(fit_loop, "is_resuming")
    if modern_batch_end and modern_resume:
        return 1
    pending = loaded_checkpoint(trainer)
    try:
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
        edited = not modern_batch_end and _finish_saved_batch(fit_state, trainer)
        if edited and not pending:
            fit_loop.epoch_progress.load_state_dict(fit_state["epoch_progress"])
            epoch_loop.batch_progress.load_state_dict(fit_state["epoch_loop.batch_progress"])
            epoch_loop._batches_that_stepped = fit_state["epoch_loop.state_dict"]["_batches_that_stepped"]
            # The setter decides again from the epoch counters whether an epoch is still unfinished.
            fit_loop.restarting = True
        if not modern_resume and _at_a_later_epochs_start(fit_state, fit_loop):
            return 2
    except (AttributeError, KeyError, TypeError) as err:
        raise _missing("loop progress", err) from err
    return 1


def iterates_twice_on_resume(trainer: Any) -> bool:
    """Whether this fit, resumed at an epoch's start after epoch 0, iterates the train loader twice before its
    first step (Lightning before 2.6 without ``_FitLoop.is_resuming``; see :func:`align_with_lightning_restart`):
    the batch the first iterator read ahead is lost where the dataset keeps its place between iterations."""
    fit_loop = trainer.fit_loop
    if trainer.ckpt_path is None or hasattr(fit_loop, "is_resuming"):
        return False
    pending = loaded_checkpoint(trainer)
    try:
        if pending:
            fit_state = pending.get("loops", {}).get("fit_loop")
            if fit_state is None:
                return False
        else:
            fit_state = {"epoch_progress": fit_loop.epoch_progress.state_dict()}
        return _at_a_later_epochs_start(fit_state, fit_loop)
    except (AttributeError, KeyError, TypeError) as err:
        raise _missing("loop progress", err) from err


def _at_a_later_epochs_start(fit_state: dict[str, Any], fit_loop: Any) -> bool:
    epochs = fit_state["epoch_progress"]["current"]
    at_epoch_boundary = epochs["ready"] == epochs["started"] == epochs["processed"]
    return at_epoch_boundary and epochs["processed"] > 0 and not fit_loop._iteration_based_training()


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


def put_callback_first(trainer: Any, callback: Any) -> None:
    """Insert ``callback`` at the head of ``trainer.callbacks`` (once), so its batch-end hook runs before any
    other callback's, ``ModelCheckpoint``'s included, and before the module's.

    ``Trainer.callbacks`` is a public list on 2.4-2.6 and each hook call iterates it afresh, so a callback
    added while the loaders are built receives every training hook from the first batch on.
    """
    if not any(c is callback for c in trainer.callbacks):
        trainer.callbacks.insert(0, callback)


def remove_callback(trainer: Any, callback: Any) -> None:
    """Take ``callback`` out of ``trainer.callbacks``; safe inside a hook (a new list is bound, the one being
    iterated is left intact)."""
    trainer.callbacks = [c for c in trainer.callbacks if c is not callback]


def silence_not_resumable_warning() -> Callable[[], None]:
    """Ignore exactly Lightning's "dataloader is not resumable" warning until the returned function is called."""
    import re
    import warnings

    # Matched by its exact text (any category: ``PossibleUserWarning`` lives in different modules in the
    # ``lightning`` and ``pytorch_lightning`` distributions).
    warnings.filterwarnings("ignore", message=re.escape(NOT_RESUMABLE_WARNING))
    entry = warnings.filters[0]

    def restore() -> None:
        if entry in warnings.filters:
            warnings.filters.remove(entry)
            mutated = getattr(warnings, "_filters_mutated", None)
            if callable(mutated):
                mutated()

    return restore


def repair_restored_progress(trainer: Any, epoch: int, batches: int) -> None:
    """Edit the fit loop's progress in the checkpoint being restored so that it agrees with the loader
    position ``(epoch, batches)`` the datamodule stored (the consumer's own count).

    The counters are set to what an uninterrupted process writes at the same place (``ready == started ==
    epoch + 1``, ``processed == completed == epoch`` inside an epoch; all four ``== epoch`` at its start), in
    three cases Lightning 2.5 and 2.6 restore wrongly (checked on 2.6.6):

    - A fit cut short by ``max_steps`` counts its unfinished epoch as processed. Resumed as written, a fit
      without ``max_steps`` starts a new epoch (the rest of the cut one is never trained), and one with
      ``max_steps`` continues the epoch with the trainer's epoch count one ahead of the data's for the rest of
      the run (a later ``max_epochs`` then stops one epoch early).
    - After a resume from a checkpoint written on an epoch's last batch, the epoch progress keeps
      ``ready``/``started`` one behind ``processed`` for the rest of that process. A checkpoint written later in
      that process, mid-epoch or on the next last batch, makes the trainer take the epoch for finished.
    - A checkpoint written at an epoch's end (``ModelCheckpoint`` in ``on_train_epoch_end``, or
      ``trainer.save_checkpoint`` after fit) keeps that epoch's batch counters; a fit with ``max_steps`` restarts
      the epoch loop from them and trains "batch N" of the next epoch.

    A checkpoint whose counters already agree with the position is not changed.

    Raises:
        PositionMismatchError: the checkpoint's batch count inside the epoch is not the position's, or its loop
            progress is not where Lightning 2.4-2.6 keep it.
    """
    pending = loaded_checkpoint(trainer)
    if not pending or "loops" not in pending:
        return
    try:
        fit_state = pending["loops"]["fit_loop"]
        epochs = fit_state["epoch_progress"]
        batch_progress = fit_state["epoch_loop.batch_progress"]
        in_batch = batch_progress["current"]
        processed = int(epochs["current"]["processed"])
        started = int(epochs["current"]["started"])
        saved_in_batch_end = in_batch["processed"] == in_batch["completed"] + 1
        if batches > 0 and processed in (epoch, epoch + 1) and int(in_batch["processed"]) != batches:
            raise PositionMismatchError(
                f"the checkpoint's loop state counts {in_batch['processed']} batches done in epoch {epoch}, its "
                f"loader position {batches}: they were not written by the same step, so where the epoch "
                "continues is unknown"
            )
        now = epochs["current"]
        if batches > 0 and processed > epoch:
            # Cut short by max_steps and saved after it (after fit, or by the epoch-end checkpoint of the cut
            # epoch): the epoch is unfinished, whatever the loop counts.
            _set_epoch_counters(epochs, ready=epoch + 1, done=epoch)
            return
        inside = batches > 0 and epoch == processed
        on_last = batches == 0 and epoch == processed + 1 and saved_in_batch_end and batch_progress["is_last_batch"]
        ended = (
            batches == 0
            and not saved_in_batch_end
            and int(in_batch["processed"]) > 0
            and processed >= epoch
            and int(now["ready"]) <= processed
            and int(now["started"]) <= processed
            and int(now["completed"]) in (processed - 1, processed)
        )
        if ended:
            # Saved at the end of the epoch before the loader's, possibly in a process whose counters lag or
            # lead (above). The epoch's batches are all done: none is in flight, whatever a resume in the
            # process that saved left in the totals (a completed count one behind makes Lightning finish a
            # batch again).
            _set_epoch_counters(epochs, ready=epoch, done=epoch)
            total = batch_progress["total"]
            for name in _PROGRESS_FIELDS:
                in_batch[name] = 0
                total[name] = total["processed"]
            batch_progress["is_last_batch"] = False
            return
        for part in ("current", "total"):
            counts = epochs[part]
            if counts["processed"] > counts["started"]:
                counts["ready"] = counts["started"] = counts["processed"]
            elif (inside or on_last) and started == processed and counts["started"] == counts["processed"]:
                counts["ready"] = counts["started"] = counts["processed"] + 1
    except (KeyError, TypeError) as err:
        raise _missing("loop progress in the checkpoint", err) from err


def _set_epoch_counters(epochs: dict[str, Any], ready: int, done: int) -> None:
    """``ready`` and ``started`` epochs begun, ``done`` processed and completed, in the current and total counts."""
    for part in ("current", "total"):
        counts = epochs[part]
        counts["ready"] = counts["started"] = ready
        counts["processed"] = counts["completed"] = done


# -- the train iterator, for the tuner's in-place loader switch ---------------------------------------------
# Checked on Lightning 2.0 to 2.6.6: the fit loop iterates the train loader through
# ``fit_loop._combined_loader`` (a ``CombinedLoader`` whose ``_iterator`` is a mode iterator holding one
# iterator per loader in ``.iterators``); the fetcher calls ``next()`` on the combined loader, which calls
# ``next()`` on ``iterators[i]``. Replacing ``iterators[0]`` is the smallest change that makes the next fetch
# come from a new loader iterator; nothing else holds the old one. Where the structure differs (another
# version), ``train_iterator`` returns why, and the tuner does not tune and says so.


def _train_iterator_slot(trainer: Any) -> list[Any] | str:
    fit_loop = trainer.fit_loop
    fetcher = getattr(fit_loop, "_data_fetcher", None)
    if fetcher is not None and type(fetcher).__name__ == "_DataLoaderIterDataFetcher":
        return "training_step takes the loader iterator itself (dataloader_iter), so it cannot be swapped"
    combined = getattr(fit_loop, "_combined_loader", None)
    mode_iterator = getattr(combined, "_iterator", None)
    iterators = getattr(mode_iterator, "iterators", None)
    if not isinstance(iterators, list) or len(iterators) != 1:
        return "the trainer's train iterator has an unknown structure (Lightning version?)"
    if fetcher is not None and getattr(fetcher, "iterator", combined) is not combined:
        return "the trainer's data fetcher does not read the combined loader (Lightning version?)"
    return iterators


def train_iterator(trainer: Any) -> tuple[Any | None, str | None]:
    """The loader iterator the trainer fetches from, or ``None`` and why it cannot be replaced."""
    slot = _train_iterator_slot(trainer)
    if isinstance(slot, str):
        return None, slot
    return slot[0], None


def replace_train_iterator(trainer: Any, old: Any, new: Any) -> None:
    """Make the trainer's next fetch come from ``new`` (written: ``_combined_loader._iterator.iterators[0]``)."""
    slot = _train_iterator_slot(trainer)
    if isinstance(slot, str) or slot[0] is not old:
        raise RuntimeError("the trainer's train iterator changed under the tuner")
    slot[0] = new


def epoch_steps(trainer: Any, loader: Any) -> int | None:
    """Steps of the current epoch (the loader's length under ``limit_train_batches``), or ``None``.

    Reads ``fit_loop._combined_loader.limits`` (Lightning 2.0 to 2.6.6); without it the loader's length.
    """
    try:
        length = len(loader)
    except TypeError:
        return None
    combined = getattr(trainer.fit_loop, "_combined_loader", None)
    limits = getattr(combined, "limits", None)
    limit = limits[0] if isinstance(limits, list) and len(limits) == 1 else None
    if isinstance(limit, (int, float)) and math.isfinite(limit):
        length = min(length, int(limit))
    return length


def consumed_in_epoch(trainer: Any) -> int:
    """Steps the training loop finished in the current epoch (public progress counters; 0 where missing)."""
    try:
        return int(trainer.fit_loop.epoch_loop.batch_progress.current.processed)
    except AttributeError:
        return 0


# -- the loader classes Lightning patches while train_dataloader() runs ---------------------------------------
# Checked on Lightning 2.4 to 2.6.6: ``_DataConnector``'s ``_request_dataloader`` calls the hook inside
# ``_replace_dunder_methods(DataLoader, "dataset")`` and ``_replace_dunder_methods(BatchSampler)``, context
# managers that restore ``__init__``, ``__setattr__`` and ``__delattr__`` after their ``yield`` without a
# ``finally``. An exception raised by the hook (a refusal among them) leaves both classes and every subclass
# patched for the rest of the process: each later DataLoader records its arguments in ``__pl_saved_*``
# attributes, and a second patch stacks on the first.
_PATCHED_DUNDERS = ("__setattr__", "__delattr__", "__init__")


def restore_loader_classes() -> None:
    """Undo Lightning's patches of ``DataLoader`` and ``BatchSampler`` (and their subclasses), as the context
    managers would on a normal return; nothing happens where none is in place."""
    from torch.utils.data import BatchSampler, DataLoader

    for base in (DataLoader, BatchSampler):
        for cls in _with_subclasses(base):
            for name in _PATCHED_DUNDERS:
                saved = f"__old{name}"
                if saved in cls.__dict__:
                    setattr(cls, name, cls.__dict__[saved])
                    delattr(cls, saved)


def _with_subclasses(cls: type) -> set[type]:
    found = {cls}
    for sub in cls.__subclasses__():
        found |= _with_subclasses(sub)
    return found
