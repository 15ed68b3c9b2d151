"""Every private name of torch's ``DataLoader`` and its iterators that LoadGuard reads or writes, in one place.

Checked against the sources of ``torch/utils/data/dataloader.py`` and ``torch/utils/data/_utils/signal_handling.py``
in torch 2.1 to 2.13 (the declared range is ``torch>=2.1``; ``tests/test_torch_seam.py`` checks the installed
one and greps that no other module reads these names). Where one is missing, the caller's fallback applies:
readiness and the buffer level read "unknown", a worker's death is reported by torch as without LoadGuard, the
in-process fetch is timed around the loader rather than inside it.

The readers run on every fetch: they are attribute getters (no Python frame of their own) or one-line reads.
"""

from __future__ import annotations

import operator
from typing import Any

NEXT_DATA = "_next_data"
"""The iterator method that returns the next batch (``_BaseDataLoaderIter._next_data``): the loader probe wraps
it per iterator to see each fetch."""

RESET = "_reset"
"""The iterator method a persistent loader calls at each epoch's start (``_BaseDataLoaderIter._reset``)."""

GET_ITERATOR = "_get_iterator"
"""``DataLoader._get_iterator``: builds a new iterator (``iter()`` also caches it for persistent workers)."""

ITERATOR_ATTRIBUTES = (
    "_task_info",
    "_rcvd_idx",
    "_send_idx",
    "_workers",
    "_shutdown",
    "_worker_pids_set",
    "_shutdown_workers",
)
"""What a multi-process iterator is read for (``tests/test_torch_seam.py`` checks them on the installed torch)."""

IN_PROCESS_ATTRIBUTES = ("_dataset_fetcher", "_num_workers", "_num_yielded")
"""What a single-process iterator is read for."""

fetch_state = operator.attrgetter("_task_info", "_rcvd_idx", "_send_idx")
"""``(task_info, received, sent)`` of a multi-process iterator: the task table (index -> ``(worker,)`` while
outstanding, ``(worker, data)`` once arrived out of order), the next index the loop takes, the next index sent
to a worker."""


def workers(iterator: Any) -> list[Any] | None:
    """The iterator's worker processes, or ``None`` for an iterator without them (or of another kind)."""
    return getattr(iterator, "_workers", None)


def num_workers(iterator: Any) -> int:
    """The iterator's ``num_workers`` (0 where it has none)."""
    return getattr(iterator, "_num_workers", 0)


def in_process_fetcher(iterator: Any) -> Any:
    """The fetcher a single-process iterator makes each batch with (``fetcher.fetch(indices)``), else ``None``."""
    if num_workers(iterator):
        return None
    return getattr(iterator, "_dataset_fetcher", None)


def is_shut_down(iterator: Any) -> bool:
    """Whether the iterator's workers were shut down (``True`` where it cannot tell)."""
    return getattr(iterator, "_shutdown", True)


def shutdown_workers(iterator: Any) -> None:
    """Stop an iterator's worker processes now (torch's own ``__del__`` path; a no-op without workers)."""
    stop = getattr(iterator, "_shutdown_workers", None)
    if callable(stop):
        stop()


def batches_yielded(iterator: Any) -> int | None:
    """Batches a torch loader iterator handed out (``_BaseDataLoaderIter._num_yielded``), else ``None``."""
    return int(iterator._num_yielded) if is_loader_iterator(iterator) else None


def watch_worker_deaths(iterator: Any, watch: bool) -> bool:
    """Register (or unregister) the iterator's workers with torch's SIGCHLD handler; whether it changed.

    Raises ``AttributeError``, ``RuntimeError`` or ``ValueError`` where this torch differs.
    """
    from torch.utils.data._utils import signal_handling

    running = workers(iterator)
    if not running or is_shut_down(iterator):
        return False
    if not watch and iterator._worker_pids_set:
        signal_handling._remove_worker_pids(id(iterator))
        iterator._worker_pids_set = False
        return True
    if watch and not iterator._worker_pids_set:
        signal_handling._set_worker_pids(id(iterator), tuple(w.pid for w in running))
        iterator._worker_pids_set = True
        return True
    return False


def cached_iterator(loader: Any) -> Any:
    """The iterator a loader keeps for its persistent workers (``DataLoader._iterator``), or ``None``."""
    return loader.__dict__.get("_iterator")


def cache_iterator(loader: Any, iterator: Any) -> None:
    """Make ``iterator`` (or ``None``: forget it) the one the loader's next ``iter()`` reuses."""
    loader._iterator = iterator


def new_iterator(loader: Any) -> Any:
    """A new iterator of ``loader`` that the loader does not cache (``DataLoader._get_iterator``)."""
    return getattr(loader, GET_ITERATOR)()


def is_loader_iterator(value: Any) -> bool:
    """Whether ``value`` is one of torch's own loader iterators (``_BaseDataLoaderIter``)."""
    from torch.utils.data.dataloader import _BaseDataLoaderIter

    return isinstance(value, _BaseDataLoaderIter)


def fetcher_classes() -> tuple[type, ...]:
    """The classes whose ``fetch(indices)`` makes each batch inside a worker (``torch.utils.data._utils.fetch``)."""
    from torch.utils.data._utils import fetch as fetch_module

    return fetch_module._MapDatasetFetcher, fetch_module._IterableDatasetFetcher
