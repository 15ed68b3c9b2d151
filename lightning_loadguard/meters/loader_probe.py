"""In-place instrumentation of one torch ``DataLoader``: epoch start-up, producer timing, readiness.

The loader keeps its identity, settings and sampler (so the data is untouched): only its class is
swapped for a subclass that times ``iter()``, hands each worker a timing ``worker_init_fn`` while the
iterator is created, and peeks at the iterator's buffer on each fetch. ``restore`` undoes it; a copy or
pickle of the loader is of the user's own class, without any of it.

The probe's own code never reaches the data path: a failure in it is reported once (``on_error``) and the
probe passes every fetch straight through from then on, while the loader's own exceptions, ``StopIteration``
included, pass unchanged.
"""

from __future__ import annotations

import time
import warnings
import weakref
from collections.abc import Callable
from typing import Any

from torch.utils.data import DataLoader

from lightning_loadguard import _torch
from lightning_loadguard.meters.producer import (
    ROW_WIDTH,
    ProducerCounters,
    ProducerMeter,
    WorkerMeter,
    time_in_process_fetch,
)

_PROBE_ATTR = "_loadguard_probe"
_BASE_ATTR = "_loadguard_probed_base"
_LEDGER_ATTR = "_loadguard_ledger"
_OWN_PREFIX = "_loadguard_"
_probed_classes: dict[type, type] = {}


class _EpochLedger:
    """Per epoch of one iterator: how many batches each worker had made at its start, and has handed over.

    Workers make their batches in order, and the consumer takes them in order, so the batch the consumer
    asks for next is already made exactly when its worker has made more than it has handed over.
    """

    def __init__(self, counters: ProducerCounters, fresh: bool) -> None:
        self.counters = counters
        self.flat = counters.flat
        rows = counters.rows
        self.fresh = fresh
        self.base = [0] * rows if fresh else [counters.made(row) for row in range(rows)]
        self.received = [0] * rows
        self.started_at = time.perf_counter()
        self.first_fetch = True
        self.batches: int | None = None  # the epoch's length, once known


class LoaderProbe:
    """Connects an instrumented loader to the meters through callbacks.

    Args:
        producer: receives per-batch production times.
        on_epoch_start: called with the seconds ``iter(loader)`` took (starting the workers).
        on_fetch: called on every fetch with (was the batch already made?, batches made and waiting, seconds
            of this fetch spent waiting for the workers to finish starting up: the epoch's first fetch only).
        on_error: called once with what failed and the exception, when the probe's own code fails (the
            probe then measures nothing more); a warning by default.
        on_startup: called, before ``on_fetch``, when a new iterator's workers have finished starting, with
            the seconds of its first fetch that went to waiting for them and the seconds from ``iter()``'s
            return to the last worker's start (what each epoch's fresh workers cost a loop that fetches at once;
            both 0 where they had started before ``iter()`` returned: their start lay in ``iter()``'s own time).
        on_in_process: where batches are made in this process (``num_workers=0``), called with ``True`` once
            the loop's own fetch timing is seen around the making (``fetch_open``): from then on each of the
            loop's fetches is a batch's making (:meth:`ProducerMeter.made_by_loop`), and torch's fetcher runs
            unwrapped; called with ``False`` where the probe times the making itself, or the workers do.
        fetch_open: whether the loop's fetch timing has a fetch open now (asked from inside the making).
    """

    def __init__(
        self,
        producer: ProducerMeter,
        on_epoch_start: Callable[[float], None],
        on_fetch: Callable[[bool | None, int | None, float], None],
        on_error: Callable[[str, Exception], None] | None = None,
        on_startup: Callable[[float, float], None] | None = None,
        on_in_process: Callable[[bool], None] | None = None,
        fetch_open: Callable[[], bool] | None = None,
    ) -> None:
        self.producer = producer
        self.on_in_process = on_in_process
        self.fetch_open = fetch_open
        self._loop_times_fetches = False
        self._in_process_counters: ProducerCounters | None = None  # the latest iterator's, made in process
        self.on_epoch_start = on_epoch_start
        self.on_fetch = on_fetch
        self.on_startup = on_startup
        self.on_error = on_error or _warn
        self.failed = False
        self._said_unmeasured = False
        self._iterator: weakref.ref[Any] | None = None

    def __getstate__(self) -> dict[str, Any]:
        # A copy is detached from the loader: it knows no iterator.
        return {**self.__dict__, "_iterator": None, "_in_process_counters": None}

    def worker_pids(self) -> list[int] | None:
        """Process ids of the latest iterator's workers ([] without workers), or ``None`` when unknown."""
        iterator = self._iterator() if self._iterator is not None else None
        if iterator is None:
            return None
        running = _torch.workers(iterator)
        if running is None:
            return [] if _torch.num_workers(iterator) == 0 else None
        return [w.pid for w in running if w.pid is not None]

    def fail(self, what: str, err: Exception) -> None:
        """The probe's own code raised: stop measuring, say so once; training goes on untouched."""
        if not self.failed:
            self.failed = True
            self._tell_in_process(False)
            self.on_error(what, err)

    def make_iterator(self, loader: DataLoader, create: Callable[[], Any]) -> Any:
        if self.failed:
            return create()
        workers = loader.num_workers
        user_init_fn = loader.worker_init_fn
        try:
            counters = self.producer.attach(workers)
            if workers > 0:
                loader.worker_init_fn = WorkerMeter(counters, user_init_fn)
        except Exception as err:
            self.fail("preparing the producer meter", err)
            return create()
        try:
            iterator = create()
        finally:
            if workers > 0:
                loader.worker_init_fn = user_init_fn
        try:
            self._iterator = weakref.ref(iterator)
            self._in_process_counters = counters if workers == 0 else None
            if workers == 0:
                # Each batch is made on demand: nothing is ever waiting, which the consumer knows without a peek.
                self._time_in_process(iterator, counters)
            else:
                self._tell_in_process(False)
                iterator.__dict__[_LEDGER_ATTR] = _EpochLedger(counters, fresh=True)
                self._observe(iterator)
                self._watch_resets(iterator)
        except Exception as err:
            self.fail("instrumenting the loader's iterator", err)
        return iterator

    def _tell_in_process(self, timed_by_loop: bool) -> None:
        if self.on_in_process is not None:
            self.on_in_process(timed_by_loop)

    def _time_in_process(self, iterator: Any, counters: ProducerCounters) -> None:
        """Time the batches an iterator without workers makes: inside torch's fetcher until a fetch is seen
        open in the loop's fetch timing around it, then by that timing alone, which runs on every step anyway
        (one timer instead of two; the fetcher unwrapped)."""
        if self._loop_times_fetches:
            self._tell_in_process(True)
            return
        self._tell_in_process(False)
        fetcher = _torch.in_process_fetcher(iterator)
        if fetcher is None:
            return
        fetch_open = self.fetch_open

        def hand_over() -> bool:
            if fetch_open is None or self.failed or not fetch_open():
                return False
            self._loop_times_fetches = True
            self._tell_in_process(True)
            return True

        time_in_process_fetch(fetcher, counters, lambda err: self.fail("timing the in-process fetch", err), hand_over)

    def fetch_timing_lost(self) -> None:
        """The loop's fetches are no longer timed: the making in process is timed inside the fetcher again."""
        self._loop_times_fetches = False
        self._tell_in_process(False)
        iterator = self._iterator() if self._iterator is not None else None
        counters = self._in_process_counters
        if iterator is None or counters is None or self.failed:
            return
        try:
            self._time_in_process(iterator, counters)
        except Exception as err:
            self.fail("timing the in-process fetch", err)

    def clock(self) -> float | None:
        """Now, or ``None`` once the probe failed (reading the clock is the probe's own code too)."""
        if self.failed:
            return None
        try:
            return time.perf_counter()
        except Exception as err:
            self.fail("measuring epoch start-up", err)
            return None

    def iterated(self, loader: DataLoader, result: object, started: float) -> None:
        """``iter(loader)``, started at ``started``, returned ``result``: an epoch starts."""
        if self.failed:
            return
        try:
            if _torch.is_loader_iterator(result):
                self.on_epoch_start(time.perf_counter() - started)
            elif not self._said_unmeasured:
                # The class's own __iter__ wraps torch's iterator (a generator, map(), ...): workers start
                # at its first next(), inside the epoch's first fetch, not inside iter().
                self._said_unmeasured = True
                self.on_error(
                    "measuring epoch start-up",
                    _Unmeasurable(
                        f"{type(loader).__name__}.__iter__ returns a {type(result).__name__}, not torch's loader "
                        "iterator, so the workers start inside the first fetch; epoch start-up is not measured "
                        "(producer capacity and readiness are)"
                    ),
                )
        except Exception as err:
            self.fail("measuring epoch start-up", err)

    def _watch_resets(self, iterator: Any) -> None:
        """A persistent iterator is reset for each new epoch: its workers' counts carry on from there.

        Hooked on the iterator's own ``_reset`` rather than on ``iter()``: a loader class whose ``__iter__``
        wraps torch's iterator never hands that iterator to ``iter()``'s caller.
        """
        reset_of = getattr(type(iterator), _torch.RESET)
        owner = weakref.ref(iterator)

        def reset(loader: Any, first_iter: bool = False) -> None:
            current = owner()
            reset_of(current, loader, first_iter)
            if self.failed:
                return
            try:
                ledger = current.__dict__.get(_LEDGER_ATTR)
                if ledger is not None and not ledger.first_fetch:
                    current.__dict__[_LEDGER_ATTR] = _EpochLedger(ledger.counters, fresh=False)
            except Exception as err:
                self.fail("starting a persistent iterator's epoch", err)

        setattr(iterator, _torch.RESET, reset)

    def _observe(self, iterator: Any) -> None:
        # Held weakly: a cycle through the iterator's own attribute would delay its shutdown (and its
        # workers' exit) to an arbitrary garbage collection, possibly inside a forked child process.
        next_data_of = getattr(type(iterator), _torch.NEXT_DATA)
        owner = weakref.ref(iterator)
        on_fetch = self.on_fetch

        def next_data() -> Any:
            current = owner()
            ledger: _EpochLedger | None = current.__dict__.get(_LEDGER_ATTR)
            if ledger is None or self.failed:
                return next_data_of(current)
            try:
                row, ready, level = _peek(current, ledger)
                start = time.perf_counter()
            except Exception as err:
                self.fail("observing the fetch", err)
                return next_data_of(current)
            batch = next_data_of(current)
            try:
                startup = 0.0
                if ledger.first_fetch:
                    startup = self._first_fetch(ledger, start)
                if row is not None:
                    ledger.received[row] += 1
                on_fetch(ready, level, startup)
            except Exception as err:
                self.fail("observing the fetch", err)
            return batch

        setattr(iterator, _torch.NEXT_DATA, next_data)

    def _first_fetch(self, ledger: _EpochLedger, start: float) -> float:
        """The epoch's first fetch, which began at ``start``, ended: the seconds of it that went to waiting for
        the workers to finish starting up."""
        ledger.first_fetch = False
        ready_at = ledger.counters.ready_at()
        if ready_at <= 0.0:
            return 0.0  # no worker said it started
        if ready_at < ledger.started_at:
            # Fresh workers forked first can finish starting before iter() has forked the last: a start, all of
            # it inside iter() (which the monitor times). Persistent workers' next epoch starts none.
            if ledger.fresh and self.on_startup is not None:
                self.on_startup(0.0, 0.0)
            return 0.0
        startup = min(max(0.0, ready_at - start), time.perf_counter() - start)
        if self.on_startup is not None:
            # The wait alone undercounts where the loop trained between iter() and this fetch (a switch
            # mid-epoch): the workers started in the background meanwhile.
            self.on_startup(startup, ready_at - ledger.started_at)
        return startup


class _Unmeasurable(Exception):
    """Not a failure: a figure the loader's shape does not allow measuring."""


def _warn(what: str, err: Exception) -> None:
    warnings.warn(f"LoadGuard: {what} failed and is skipped from now on ({type(err).__name__}: {err}).", stacklevel=2)


def _peek(iterator: Any, ledger: _EpochLedger) -> tuple[int | None, bool | None, int | None]:
    """The worker row of the batch asked for, whether it is made, and the batches made and waiting.

    The level is left unknown once every batch of the epoch has been asked of the workers: from there it
    can only fall, which is the epoch ending, not the buffer draining. Runs on every fetch: one pass over the
    workers' counters, no calls of its own.
    """
    try:
        task_info, received_index, sent = _torch.fetch_state(iterator)
        entry = task_info.get(received_index)
        flat, base, received = ledger.flat, ledger.base, ledger.received
        row = None if entry is None else entry[0] % len(base)
        level = 0
        ready: bool | None = None
        for worker in range(len(base)):
            waiting = int(flat[worker * ROW_WIDTH]) - base[worker] - received[worker]
            if waiting > 0:
                level += waiting
            if worker == row:
                ready = len(entry) == 2 or waiting > 0
        if ledger.batches is None:
            try:
                ledger.batches = len(iterator)
            except TypeError:  # an unsized iterable dataset: the epoch's end is not known in advance
                ledger.batches = -1
        if ledger.batches >= 0 and sent >= ledger.batches:
            return row, ready, None
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
        start = probe.clock() if probe is not None else None
        iterator = super(probed, self).__iter__()
        if probe is not None and start is not None:
            probe.iterated(self, iterator, start)
        return iterator

    def _get_iterator(self: Any) -> Any:
        create = getattr(super(probed, self), _torch.GET_ITERATOR)
        probe: LoaderProbe | None = self.__dict__.get(_PROBE_ATTR)
        if probe is None:
            return create()
        return probe.make_iterator(self, create)

    probed = type(
        cls.__name__,
        (cls,),
        {
            "__iter__": __iter__,
            _torch.GET_ITERATOR: _get_iterator,
            "__reduce_ex__": _reduce_to_base,
            "__module__": cls.__module__,
            _BASE_ATTR: cls,
        },
    )
    probed.__qualname__ = cls.__qualname__
    _probed_classes[cls] = probed
    return probed


def _reduce_to_base(self: Any, protocol: int) -> Any:
    """Copies and pickles of an instrumented loader are of the user's own class, without LoadGuard's state."""
    base = type(self).__dict__[_BASE_ATTR]
    getstate = getattr(base, "__getstate__", None)
    if getstate is not None and getstate is not getattr(object, "__getstate__", None):
        state = getstate(self)
    else:
        state = dict(self.__dict__)
    if isinstance(state, dict):
        state = {key: value for key, value in state.items() if not key.startswith(_OWN_PREFIX)}
    return _new, (base,), state


def _new(cls: type) -> Any:
    return cls.__new__(cls)


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
