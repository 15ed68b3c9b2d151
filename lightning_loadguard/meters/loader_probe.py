"""In-place instrumentation of one torch ``DataLoader``: epoch start-up, producer timing, readiness.

The loader keeps its identity, settings and sampler (so the data is untouched): only its class is
swapped for a subclass that times ``iter()``, hands each worker a timing ``worker_init_fn`` while the
iterator is created, and peeks at the iterator's buffer on each fetch. ``restore`` undoes it.
"""

from __future__ import annotations

import time
import weakref
from collections.abc import Callable
from typing import Any

from torch.utils.data import DataLoader

from lightning_loadguard.meters.producer import ProducerMeter, WorkerMeter, time_in_process_fetch

_PROBE_ATTR = "_loadguard_probe"
_BASE_ATTR = "_loadguard_probed_base"
_probed_classes: dict[type, type] = {}


class LoaderProbe:
    """Connects an instrumented loader to the meters through two callbacks.

    Args:
        producer: receives per-batch production times.
        on_epoch_start: called with the seconds ``iter(loader)`` took (worker start-up).
        on_fetch: called on every fetch with (batch already waiting?, batches waiting in the buffer).
    """

    def __init__(
        self,
        producer: ProducerMeter,
        on_epoch_start: Callable[[float], None],
        on_fetch: Callable[[bool | None, int | None], None],
    ) -> None:
        self.producer = producer
        self.on_epoch_start = on_epoch_start
        self.on_fetch = on_fetch

    def make_iterator(self, loader: DataLoader, create: Callable[[], Any]) -> Any:
        if loader.num_workers == 0:
            counters = self.producer.attach(0)
            iterator = create()
            fetcher = getattr(iterator, "_dataset_fetcher", None)
            if fetcher is not None:
                time_in_process_fetch(fetcher, counters)
            self._observe(iterator, in_process=True)
            return iterator
        counters = self.producer.attach(loader.num_workers)
        user_init_fn = loader.worker_init_fn
        loader.worker_init_fn = WorkerMeter(counters, user_init_fn)
        try:
            iterator = create()
        finally:
            loader.worker_init_fn = user_init_fn
        self._observe(iterator, in_process=False)
        return iterator

    def _observe(self, iterator: Any, in_process: bool) -> None:
        # Held weakly: a cycle through the iterator's own attribute would delay its shutdown (and its
        # workers' exit) to an arbitrary garbage collection, possibly inside a forked child process.
        next_data_of = type(iterator)._next_data
        owner = weakref.ref(iterator)
        on_fetch = self.on_fetch

        if in_process:

            def next_data() -> Any:
                batch = next_data_of(owner())
                # Produced on demand: nothing is ever waiting.
                on_fetch(False, 0)
                return batch

        else:

            def next_data() -> Any:
                current = owner()
                ready, level = _peek_buffer(current)
                batch = next_data_of(current)
                on_fetch(ready, level)
                return batch

        iterator._next_data = next_data


def _peek_buffer(iterator: Any) -> tuple[bool | None, int | None]:
    """Whether the next batch is already in the main process, and how many batches are waiting."""
    try:
        task_info = iterator._task_info
        stored = sum(1 for entry in task_info.values() if len(entry) == 2)
        queued = iterator._data_queue.qsize()
        entry = task_info.get(iterator._rcvd_idx)
        return (entry is not None and len(entry) == 2) or queued > 0, stored + queued
    except Exception:  # private internals of another torch version: readiness stays unknown
        return None, None


def _probed_class(cls: type) -> type:
    """A direct subclass of the loader's class (single inheritance keeps ``__class__`` assignable)."""
    probed = _probed_classes.get(cls)
    if probed is not None:
        return probed

    def __iter__(self: Any) -> Any:
        probe: LoaderProbe | None = self.__dict__.get(_PROBE_ATTR)
        start = time.perf_counter()
        iterator = super(probed, self).__iter__()
        if probe is not None:
            probe.on_epoch_start(time.perf_counter() - start)
        return iterator

    def _get_iterator(self: Any) -> Any:
        create = super(probed, self)._get_iterator
        probe: LoaderProbe | None = self.__dict__.get(_PROBE_ATTR)
        if probe is None:
            return create()
        return probe.make_iterator(self, create)

    probed = type(
        cls.__name__,
        (cls,),
        {"__iter__": __iter__, "_get_iterator": _get_iterator, "__module__": cls.__module__, _BASE_ATTR: cls},
    )
    probed.__qualname__ = cls.__qualname__
    _probed_classes[cls] = probed
    return probed


def _is_probed(loader: object) -> bool:
    return _BASE_ATTR in type(loader).__dict__


def instrument(loader: object, probe: LoaderProbe) -> str | None:
    """Instrument ``loader`` in place; returns why it cannot be, or ``None`` on success."""
    if not isinstance(loader, DataLoader):
        return f"the train loader is a {type(loader).__name__}, not a torch DataLoader"
    if _is_probed(loader):
        loader.__dict__[_PROBE_ATTR] = probe
        return None
    original = type(loader)
    try:
        loader.__class__ = _probed_class(original)
    except TypeError as err:
        return f"its class {original.__name__} cannot be extended ({err})"
    loader.__dict__[_PROBE_ATTR] = probe
    return None


def restore(loader: object) -> None:
    """Give the loader back its own class; a no-op for loaders that were never instrumented."""
    if _is_probed(loader):
        loader.__dict__.pop(_PROBE_ATTR, None)
        loader.__class__ = type(loader).__dict__[_BASE_ATTR]
