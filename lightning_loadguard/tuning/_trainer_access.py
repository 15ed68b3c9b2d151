"""The few Lightning internals the tuner reads or replaces, each checked, each with a stated fallback.

Lightning 2.x iterates the train loader through ``fit_loop._combined_loader`` (a ``CombinedLoader`` whose
``_iterator`` is a mode iterator holding one iterator per loader in ``.iterators``); the fetcher calls
``next()`` on the combined loader, which calls ``next()`` on ``iterators[i]``. Replacing ``iterators[0]``
is the smallest change that makes the next fetch come from a new loader iterator; nothing else holds the
old one. Where the structure differs, the tuner does not tune and says why.
"""

from __future__ import annotations

import math
from typing import Any

from torch.utils.data.dataloader import _BaseDataLoaderIter


def _slot(trainer: Any) -> list[Any] | str:
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
    slot = _slot(trainer)
    if isinstance(slot, str):
        return None, slot
    return slot[0], None


def replace_train_iterator(trainer: Any, old: Any, new: Any) -> None:
    """Make the trainer's next fetch come from ``new``."""
    slot = _slot(trainer)
    if isinstance(slot, str) or slot[0] is not old:
        raise RuntimeError("the trainer's train iterator changed under the tuner")
    slot[0] = new


def yielded(iterator: Any) -> int | None:
    """Batches a torch loader iterator handed out (what left the loader, never what workers read ahead)."""
    if isinstance(iterator, _BaseDataLoaderIter):
        return int(iterator._num_yielded)
    count = getattr(iterator, "yielded", None)
    return int(count) if isinstance(count, int) else None


def epoch_steps(trainer: Any, loader: Any) -> int | None:
    """Steps of the current epoch (the loader's length under ``limit_train_batches``), or ``None``."""
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
    """Steps the training loop finished in the current epoch."""
    try:
        return int(trainer.fit_loop.epoch_loop.batch_progress.current.processed)
    except AttributeError:
        return 0
