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

from lightning_loadguard.meters.producer import ProducerCounters, ProducerMeter, WorkerMeter, time_in_process_fetch

_PROBE_ATTR = "_loadguard_probe"
_BASE_ATTR = "_loadguard_probed_base"
_LEDGER_ATTR = "_loadguard_ledger"
_probed_classes: dict[type, type] = {}


class _EpochLedger:
    """Per epoch of one iterator: how many batches each worker had made at its start, and has handed over.

    Workers make their batches in order, and the consumer takes them in order, so the batch the consumer
    asks for next is already made exactly when its worker has made more than it has handed over.
    """

    def __init__(self, counters: ProducerCounters, fresh: bool) -> None:
        self.counters = counters
        rows = counters.rows
        self.base = [0] * rows if fresh else [counters.made(row) for row in range(rows)]
        self.received = [0] * rows
        self.started_at = time.perf_counter()
        self.first_fetch = True
        self.batches: int | None = None  # the epoch's length, once known

    def waiting(self, row: int) -> int:
        return self.counters.made(row) - self.base[row] - self.received[row]

    def waiting_by_row(self) -> list[int]:
        waiting = self.counters.made_by_row()
        base, received = self.base, self.received
        for row in range(len(waiting)):
            waiting[row] -= base[row] + received[row]
        return waiting


class LoaderProbe:
    """Connects an instrumented loader to the meters through callbacks.

    Args:
        producer: receives per-batch production times.
        on_epoch_start: called with the seconds ``iter(loader)`` took (starting the workers).
        on_fetch: called on every fetch with (was the batch already made?, batches made and waiting, seconds
            of this fetch spent waiting for the workers to finish starting up: the epoch's first fetch only).
    """

    def __init__(
        self,
        producer: ProducerMeter,
        on_epoch_start: Callable[[float], None],
        on_fetch: Callable[[bool | None, int | None, float], None],
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
        iterator.__dict__[_LEDGER_ATTR] = _EpochLedger(counters, fresh=True)
        self._observe(iterator, in_process=False)
        return iterator

    def begin_epoch(self, iterator: Any) -> None:
        """A persistent iterator was reset for a new epoch: its workers' counts carry on from here."""
        ledger = iterator.__dict__.get(_LEDGER_ATTR)
        if ledger is not None and not ledger.first_fetch:
            iterator.__dict__[_LEDGER_ATTR] = _EpochLedger(ledger.counters, fresh=False)

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
                on_fetch(False, 0, 0.0)
                return batch

        else:

            def next_data() -> Any:
                current = owner()
                ledger: _EpochLedger | None = current.__dict__.get(_LEDGER_ATTR)
                if ledger is None:
                    return next_data_of(current)
                row, ready, level = _peek(current, ledger)
                start = time.perf_counter()
                batch = next_data_of(current)
                startup = 0.0
                if ledger.first_fetch:
                    ledger.first_fetch = False
                    ready_at = ledger.counters.ready_at()
                    if ready_at >= ledger.started_at:
                        startup = min(max(0.0, ready_at - start), time.perf_counter() - start)
                if row is not None:
                    ledger.received[row] += 1
                on_fetch(ready, level, startup)
                return batch

        iterator._next_data = next_data


def _peek(iterator: Any, ledger: _EpochLedger) -> tuple[int | None, bool | None, int | None]:
    """The worker row of the batch asked for, whether it is made, and the batches made and waiting.

    The level is left unknown once every batch of the epoch has been asked of the workers: from there it
    can only fall, which is the epoch ending, not the buffer draining.
    """
    try:
        entry = iterator._task_info.get(iterator._rcvd_idx)
        waiting = ledger.waiting_by_row()
        row = None if entry is None else entry[0] % len(waiting)
        ready = None if row is None else len(entry) == 2 or waiting[row] > 0
        if ledger.batches is None:
            try:
                ledger.batches = len(iterator)
            except TypeError:  # an unsized iterable dataset: the epoch's end is not known in advance
                ledger.batches = -1
        more_to_send = ledger.batches < 0 or iterator._send_idx < ledger.batches
        level = None
        if more_to_send:
            level = 0
            for count in waiting:
                if count > 0:
                    level += count
        return row, ready, level
    except Exception:  # private internals of another torch version: readiness stays unknown
        return None, None, None


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
            probe.begin_epoch(iterator)
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
