"""Change a ``DataLoader``'s worker settings mid-epoch without changing the sample order.

:func:`restart_iterator` is the one way the package restarts a loader from the consumer's place. It needs
what holds the loader's order:

- a loader built by :func:`~lightning_loadguard.position.make_resumable` plays an order that is a function of
  ``(seed, epoch)``: its :func:`~lightning_loadguard.position.planned_sampler` starts at any batch without
  reading the consumed ones;
- a user's own loader (e.g. ``shuffle=True`` drawing its permutation from the global random stream) has no
  such order to recompute, so :class:`OrderTap` stands in for its index sampler (its batch sampler, or its
  sampler without automatic batching), passes through exactly what the user's sampler yields, in the same
  calls, and remembers every batch of indices handed out in the current iterator's run (compactly:
  :class:`~lightning_loadguard.position.record.IndexRecord`); the batches the old
  workers had read ahead are replayed, then the same live sampler run continues.

Either way the running iterator is shut down, the new settings applied, and the new iterator's first batch
is the one after the last *consumed* batch. Creating the iterator draws a base seed from the loader's
``generator`` (the global random stream where it has none); that draw is undone, so the training run's
random streams (and every later epoch's permutation) stay what they would have been without the restart.

Example:
    >>> import torch
    >>> from torch.utils.data import DataLoader
    >>> _ = torch.manual_seed(0)
    >>> loader = DataLoader(list(range(12)), batch_size=3, shuffle=True)
    >>> tap = OrderTap.install(loader)
    >>> it = iter(loader); first = [next(it).tolist() for _ in range(2)]
    >>> it = restart_iterator(loader, tap, consumed=2, old_iterator=it, num_workers=0)
    >>> rest = [b.tolist() for b in it]
    >>> tap.remove(loader)
    >>> _ = torch.manual_seed(0)
    >>> first + rest == [b.tolist() for b in DataLoader(list(range(12)), batch_size=3, shuffle=True)]
    True
"""

from __future__ import annotations

import itertools
import random
import sys
import weakref
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import torch
from torch.utils.data import (
    BatchSampler,
    DataLoader,
    DistributedSampler,
    IterableDataset,
    RandomSampler,
    SequentialSampler,
    SubsetRandomSampler,
    WeightedRandomSampler,
)

from lightning_loadguard import _torch
from lightning_loadguard.meters.settings import DEFAULT_PREFETCH, SWITCHABLE
from lightning_loadguard.position.iterable import StatefulIterableTap
from lightning_loadguard.position.record import IndexRecord
from lightning_loadguard.position.sampler import PlannedBatchSampler, PlannedSampler

_TAP_ATTR = "_loadguard_order_tap"
_SEED_ATTR = "_loadguard_fresh_seed_draws"
_END_ATTR = "_loadguard_ends_at_length"


class OrderTap:
    """A transparent stand-in for a loader's index sampler that records the batches it hands out.

    Attribute reads (``sampler``, ``batch_size``, ``set_epoch`` ...) go to the user's object, so code that
    inspects the loader (Lightning sets the sampler's epoch through it) sees no difference.
    """

    def __init__(self, inner: Iterable[Any], attribute: str) -> None:
        self.inner = inner
        self.attribute = attribute
        self.recording = True
        self.drawn = IndexRecord()
        self._source: Iterator[Any] | None = None
        self._replay: list[Any] | None = None

    @classmethod
    def install(cls, loader: DataLoader) -> OrderTap:
        """Put a tap in front of ``loader``'s index sampler (before its next ``iter()``).

        Raises:
            TypeError: ``loader`` reads an ``IterableDataset`` (its order lives in the dataset, not in a
                sampler the main process draws from).
        """
        existing = loader.__dict__.get(_TAP_ATTR)
        if isinstance(existing, OrderTap):
            return existing
        if isinstance(loader.dataset, IterableDataset):
            raise TypeError("an IterableDataset's loader has no index sampler to record")
        attribute = "batch_sampler" if loader.batch_sampler is not None else "sampler"
        tap = cls(loader.__dict__[attribute], attribute)
        # DataLoader.__setattr__ refuses samplers after construction to protect live iterators; the tap is
        # installed before the iterator it serves exists and yields exactly what the original yields.
        loader.__dict__[attribute] = tap
        loader.__dict__[_TAP_ATTR] = tap
        return tap

    def remove(self, loader: DataLoader) -> None:
        """Give the loader its own sampler back; iterators that still hold the tap pass straight through."""
        self.recording = False
        self.drawn = IndexRecord()
        if loader.__dict__.get(_TAP_ATTR) is self:
            loader.__dict__[self.attribute] = self.inner
            del loader.__dict__[_TAP_ATTR]

    def resume_after(self, consumed: int) -> None:
        """Make the ``iter()`` calls until :meth:`resumed` continue the current run right after ``consumed``
        batches."""
        if not 0 <= consumed <= len(self.drawn):
            raise ValueError(f"consumed must be in [0, {len(self.drawn)}] (batches drawn so far), got {consumed}")
        if self._source is None:
            raise RuntimeError("no run to continue: the tapped sampler was never iterated")
        self._replay = self.drawn.since(consumed)

    def resumed(self) -> None:
        """The iterator that continues the run is built: later ``iter()`` calls start new runs.

        An iterator built after an epoch's last batch is never read (Lightning stops a sized loader at its length
        without another ``next()``); the next epoch's ``iter()`` must start the user's sampler afresh, not continue
        the spent run.
        """
        self._replay = None

    def __iter__(self) -> Iterator[Any]:
        # torch calls iter() on the index sampler twice when it builds a worker iterator and drops the first
        # result unstarted: every iter() until resumed() gets the replay, and the generators below act on their
        # first next(), never at creation.
        if self._replay is not None:
            assert self._source is not None
            return self._continue(self._replay, self._source)
        # The user's sampler is asked for a run exactly when the untuned loader would ask it.
        return self._record(iter(self.inner))

    def _record(self, source: Iterator[Any]) -> Iterator[Any]:
        self.drawn = IndexRecord()
        self._source = source
        for item in source:
            if self.recording:
                self.drawn.append(item)
            yield item

    def _continue(self, replay: list[Any], source: Iterator[Any]) -> Iterator[Any]:
        yield from replay
        for item in source:
            if self.recording:
                self.drawn.append(item)
            yield item

    def __len__(self) -> int:
        return len(self.inner)  # type: ignore[arg-type]

    def __getattr__(self, name: str) -> Any:
        if name in {"inner", "attribute", "recording", "drawn", "_source", "_replay"}:
            raise AttributeError(name)
        return getattr(self.inner, name)

    def __reduce__(self) -> tuple[Any, ...]:
        # A copy or pickle of the loader holds the user's own sampler (a live run cannot be copied).
        return _same, (self.inner,)


def _same(inner: Any) -> Any:
    return inner


class _StandIn:
    """A stand-in for a loader's index sampler kept for the rest of a fit: attribute reads, ``len`` and copies
    go to the user's object; ``active`` off makes it pass straight through."""

    _own = frozenset({"inner", "active"})

    def __init__(self, inner: Iterable[Any]) -> None:
        self.inner = inner
        self.active = True

    def __len__(self) -> int:
        return len(self.inner)  # type: ignore[arg-type]

    def __getattr__(self, name: str) -> Any:
        if name in self._own:
            raise AttributeError(name)
        return getattr(self.inner, name)

    def __reduce__(self) -> tuple[Any, ...]:
        return _same, (self.inner,)


class FreshSeedDraws(_StandIn):
    """A stand-in for a loader's index sampler that draws each epoch's worker base seed as torch would.

    torch draws a base seed for the workers from the loader's generator (the global random stream by
    default) every time it creates an iterator, right before the sampler's run starts; a persistent iterator
    is reset instead and draws nothing. A loader whose workers were made persistent therefore shifts the
    global stream by one draw per epoch, and a ``shuffle=True`` permutation drawn from it changes from the
    third epoch. Standing where torch asks for the sampler's run, this makes the same draw at the same point
    whenever a persistent iterator is reset, so every epoch's permutation (and every later random draw of the
    run) is what it would have been with fresh workers each epoch.
    """

    _own = frozenset({"inner", "active", "_loader"})

    def __init__(self, inner: Iterable[Any], loader: DataLoader) -> None:
        super().__init__(inner)
        self._loader = weakref.ref(loader)

    def __iter__(self) -> Iterator[Any]:
        loader = self._loader() if self.active else None
        if (
            loader is not None
            and loader.num_workers > 0
            and loader.persistent_workers
            # Set only once the persistent iterator exists: a new one draws its own seed while being built.
            and _torch.cached_iterator(loader) is not None
        ):
            torch.empty((), dtype=torch.int64).random_(generator=loader.generator)
        return iter(self.inner)


def draw_seeds_like_fresh_iterators(loader: DataLoader) -> None:
    """Keep ``loader``'s random stream as without persistent workers (see :class:`FreshSeedDraws`).

    Call when persistent workers are turned on for a loader whose untuned run creates a fresh iterator each
    epoch; :func:`stop_seed_draws` undoes it. Workers that persist keep their own random streams across
    epochs (a fresh worker is reseeded each epoch): draws made inside workers still differ from epoch 1 on.
    """
    if not isinstance(loader.dataset, IterableDataset):
        _install(loader, _SEED_ATTR, lambda inner: FreshSeedDraws(inner, loader))


def stop_seed_draws(loader: DataLoader) -> None:
    """Undo :func:`draw_seeds_like_fresh_iterators`; iterators that still hold the stand-in pass through."""
    _uninstall(loader, _SEED_ATTR)


def _install(loader: DataLoader, key: str, make: Callable[[Any], _StandIn]) -> None:
    """Put the stand-in ``make`` builds in front of ``loader``'s index sampler, under its :class:`OrderTap` if
    any (so that iterators holding the tap and the loader after the tap's removal both go through it)."""
    if isinstance(loader.__dict__.get(key), _StandIn):
        return
    tap = loader.__dict__.get(_TAP_ATTR)
    if isinstance(tap, OrderTap):
        wrapper = make(tap.inner)
        tap.inner = wrapper
    else:
        attribute = "batch_sampler" if loader.batch_sampler is not None else "sampler"
        wrapper = make(loader.__dict__[attribute])
        loader.__dict__[attribute] = wrapper
    loader.__dict__[key] = wrapper


def _uninstall(loader: DataLoader, key: str) -> None:
    """Take the stand-in stored under ``key`` out of the chain in front of ``loader``'s index sampler."""
    wrapper = loader.__dict__.pop(key, None)
    if not isinstance(wrapper, _StandIn):
        return
    wrapper.active = False
    for attribute in ("batch_sampler", "sampler"):
        if loader.__dict__.get(attribute) is wrapper:
            loader.__dict__[attribute] = wrapper.inner
            return
        node = loader.__dict__.get(attribute)
        while isinstance(node, (OrderTap, _StandIn)):
            if node.inner is wrapper:
                node.inner = wrapper.inner
                return
            node = node.inner


class EndsAtLength(_StandIn):
    """A stand-in for a loader's index sampler that ends each run after ``len(inner)`` items without asking the
    user's sampler for one more.

    Lightning stops a sized loader after ``len(loader)`` batches: in the main process the sampler is never run
    to its end. Workers read ahead until the sampler is exhausted, and torch's ``RandomSampler`` draws once
    more from its generator when run out (its remainder permutation, empty or not): where that generator is the
    sampler's or the loader's own, every later epoch's order shifts. Installed on a loader whose untuned run
    loads in the main process, this keeps the sampler's generator where the untuned run leaves it; the items
    handed out are the same.
    """

    def __iter__(self) -> Iterator[Any]:
        source = iter(self.inner)  # when the untuned loader asks, as it asks
        if not self.active:
            return source
        return itertools.islice(source, len(self.inner))  # type: ignore[arg-type]


def end_runs_at_length(loader: DataLoader) -> bool:
    """Install :class:`EndsAtLength` on ``loader``; ``False`` where its index sampler has no length or it reads an
    ``IterableDataset``. :func:`stop_ending_at_length` undoes it."""
    attribute = "batch_sampler" if loader.batch_sampler is not None else "sampler"
    try:
        len(loader.__dict__[attribute])
    except TypeError:
        return False
    if isinstance(loader.dataset, IterableDataset):
        return False
    _install(loader, _END_ATTR, EndsAtLength)
    return True


def stop_ending_at_length(loader: DataLoader) -> None:
    """Undo :func:`end_runs_at_length`; iterators that still hold the stand-in pass straight through."""
    _uninstall(loader, _END_ATTR)


def shutdown(iterator: object) -> None:
    """Stop an iterator's worker processes now (torch's own ``__del__`` path; a no-op without workers)."""
    _torch.shutdown_workers(iterator)


def yielded(iterator: Any) -> int | None:
    """Batches a torch loader iterator handed out (what left the loader, never what workers read ahead).

    A torch iterator's own count (:func:`lightning_loadguard._torch.batches_yielded`); an iterator of another
    kind counts itself in ``yielded``; otherwise ``None``.
    """
    count = _torch.batches_yielded(iterator)
    if count is not None:
        return count
    count = getattr(iterator, "yielded", None)
    return int(count) if isinstance(count, int) else None


def watch_worker_deaths(iterator: object, watch: bool) -> bool:
    """Turn torch's asynchronous report of a dead worker off (or back on) for one iterator.

    torch raises "DataLoader worker exited unexpectedly" from its SIGCHLD handler, wherever the main thread
    happens to be (usually inside the training step), which no caller can catch and recover from. With the
    report off, the death surfaces inside ``next()`` instead, at torch's next status check (within
    ``MP_STATUS_CHECK_INTERVAL`` seconds), where a caller can restart the loader. Returns whether it changed.
    """
    try:
        return _torch.watch_worker_deaths(iterator, watch)
    except (AttributeError, RuntimeError, ValueError):  # another torch: keep its behaviour
        return False


def validate_settings(settings: dict[str, Any]) -> None:
    """Raise ``ValueError`` for a setting that cannot change on a built loader or is out of range."""
    unknown = sorted(set(settings) - set(SWITCHABLE))
    if unknown:
        raise ValueError(f"cannot change {unknown} on a built DataLoader; only {list(SWITCHABLE)} can change")
    workers = settings.get("num_workers")
    if workers is not None and (isinstance(workers, bool) or not isinstance(workers, int) or workers < 0):
        raise ValueError(f"num_workers must be an integer >= 0, got {workers!r}")
    prefetch = settings.get("prefetch_factor")
    if prefetch is not None and (isinstance(prefetch, bool) or not isinstance(prefetch, int) or prefetch < 1):
        raise ValueError(f"prefetch_factor must be None or an integer >= 1, got {prefetch!r}")


def apply_settings(loader: DataLoader, **settings: Any) -> None:
    """Set worker settings on a loader that has no live iterator (shut any down first).

    ``persistent_workers`` is refused by ``DataLoader.__setattr__`` after construction because a cached
    iterator would keep the old value; with the cached iterator gone, setting it is consistent.
    """
    validate_settings(settings)
    cached = _torch.cached_iterator(loader)
    if cached is not None:
        shutdown(cached)
        _torch.cache_iterator(loader, None)
    if "num_workers" in settings:
        loader.num_workers = settings["num_workers"]
    if loader.num_workers > 0:
        prefetch = settings.get("prefetch_factor", loader.prefetch_factor)
        loader.prefetch_factor = DEFAULT_PREFETCH if prefetch is None else prefetch
    else:
        loader.prefetch_factor = None
    if "pin_memory" in settings:
        loader.pin_memory = bool(settings["pin_memory"])
    if "persistent_workers" in settings:
        loader.__dict__["persistent_workers"] = bool(settings["persistent_workers"]) and loader.num_workers > 0


def restart_iterator(
    loader: DataLoader,
    order: OrderTap | PlannedSampler | PlannedBatchSampler,
    consumed: int,
    *,
    old_iterator: Iterator[Any] | None = None,
    **settings: Any,
) -> Iterator[Any]:
    """A new iterator over ``loader`` whose first batch is the one after ``consumed`` batches of the current run.

    Args:
        loader: the loader to restart; its settings change in place.
        order: what holds ``loader``'s order: the :class:`OrderTap` installed on it, or, for a loader built
            by :func:`~lightning_loadguard.position.make_resumable`, its
            :func:`~lightning_loadguard.position.planned_sampler` (which plays its current ``epoch``; call
            its ``set_epoch`` first for another).
        consumed: batches the training step finished since the run (the epoch) began, across any earlier
            restarts; batches the old workers read ahead beyond it are not lost.
        old_iterator: the running iterator, whose workers are shut down first.
        settings: ``num_workers``, ``prefetch_factor``, ``pin_memory``, ``persistent_workers``.

    The loader's ``generator`` (the global torch random state where it has none) is the same afterwards as
    before.

    Raises:
        ValueError: a setting torch cannot change on a built loader, a value out of range, or ``consumed``
            outside the run.
        TypeError: ``order`` holds no restartable order (a stateful iterable dataset's loader restarts from
            a stored dataset state instead).

    Example:
        >>> from torch.utils.data import DataLoader
        >>> from lightning_loadguard.position import make_resumable, planned_sampler
        >>> loader = make_resumable(DataLoader(list(range(12)), batch_size=3, shuffle=True), seed=1)
        >>> it = iter(loader); first = [next(it).tolist() for _ in range(2)]
        >>> rest = restart_iterator(loader, planned_sampler(loader), 2, old_iterator=it, num_workers=0)
        >>> sorted(sum(first + [b.tolist() for b in rest], [])) == list(range(12))
        True
    """
    validate_settings(settings)
    if isinstance(order, OrderTap):
        order.resume_after(consumed)
    elif isinstance(order, (PlannedSampler, PlannedBatchSampler)):
        if consumed < 0:
            raise ValueError(f"consumed must be >= 0, got {consumed}")
        order.start_at(order.epoch, consumed)
    elif isinstance(order, StatefulIterableTap):
        raise TypeError(
            "an iterable dataset's loader restarts from a stored dataset state, not a batch offset; "
            "call StatefulIterableTap.resume(tap.state_at(consumed)) and iterate again"
        )
    else:
        raise TypeError(
            f"order must be the OrderTap installed on the loader or its planned_sampler(), got {type(order).__name__}"
        )
    if old_iterator is not None:
        shutdown(old_iterator)
    apply_settings(loader, **settings)
    # torch draws the workers' base seed from the loader's own generator where it has one (which then also
    # orders a shuffle=True loader), else from the global stream: whichever it is, the draw is undone.
    generator = loader.generator if isinstance(loader.generator, torch.Generator) else None
    state = generator.get_state() if generator is not None else torch.get_rng_state()
    try:
        # _get_iterator, not iter(): the caller owns this mid-epoch iterator; a persistent loader caches
        # it below so the next epoch reuses its workers as usual.
        iterator = _torch.new_iterator(loader)
    finally:
        if isinstance(order, OrderTap):
            order.resumed()
        if generator is not None:
            generator.set_state(state)
        else:
            torch.set_rng_state(state)
    if loader.persistent_workers and loader.num_workers > 0:
        _torch.cache_iterator(loader, iterator)
    return iterator


STREAMS = ("torch", "random", "numpy")
"""The main process's global random streams, by name: torch's CPU generator, Python's ``random``, NumPy's."""


def _global_random_states() -> tuple[Any, ...]:
    """The main process's global random streams, in the order of :data:`STREAMS` (NumPy's only if loaded)."""
    numpy = sys.modules.get("numpy")
    numpy_state = numpy.random.get_state()[1].tobytes() if numpy is not None else None
    return torch.get_rng_state(), random.getstate(), numpy_state


def _moved_streams(a: tuple[Any, ...], b: tuple[Any, ...]) -> set[str]:
    same = (torch.equal(a[0], b[0]), a[1] == b[1], a[2] == b[2])
    return {name for name, unchanged in zip(STREAMS, same, strict=True) if not unchanged}


class RandomDrawWatch:
    """Tells which of the main process's global random streams the loader's in-process fetches draw from.

    With ``num_workers=0`` a dataset that augments with ``torch.rand`` (or ``random``, ``numpy.random``) in
    ``__getitem__`` advances the training run's own random stream. Fetching those batches in worker processes
    instead changes those draws (as any change of ``num_workers`` does), and where the loader's order is
    drawn from a stream they advanced (:func:`order_streams`: a ``shuffle=True`` loader without a generator
    draws each epoch's permutation from torch's), it changes the later epochs' order too. Only the fetch
    itself is watched (the training step's own draws, e.g. dropout, happen between fetches).
    """

    def __init__(self) -> None:
        self.streams: set[str] = set()
        self.watching = True

    @property
    def drew(self) -> bool:
        """Whether any watched fetch drew from a global random stream."""
        return bool(self.streams)

    @classmethod
    def install(cls, iterator: object) -> RandomDrawWatch | None:
        """Watch the fetches of an in-process torch iterator; ``None`` for any other iterator."""
        fetcher = _torch.in_process_fetcher(iterator)
        if fetcher is None:
            return None
        watch = cls()
        fetch = fetcher.fetch

        def watched_fetch(*args: Any) -> Any:
            if not watch.watching or len(watch.streams) == len(STREAMS):
                return fetch(*args)
            before = _global_random_states()
            batch = fetch(*args)
            watch.streams |= _moved_streams(before, _global_random_states())
            return batch

        fetcher.fetch = watched_fetch
        return watch


_DRAWS_FROM_TORCH = (RandomSampler, SubsetRandomSampler, WeightedRandomSampler)


def order_streams(loader: DataLoader) -> frozenset[str] | None:
    """The main process's global random streams ``loader``'s order is drawn from (:data:`STREAMS` names).

    Empty where the order has its own source: no shuffle, a sampler or loader with its own ``generator``,
    ``DistributedSampler`` (seed and epoch), the resume mixin's planned order (seed and epoch). ``{"torch"}``
    for torch's random samplers without a generator (``shuffle=True``), which draw each epoch's seed from
    torch's global generator. ``None`` for a sampler of a kind not known here: it may draw from any stream.

    Example:
        >>> import torch
        >>> order_streams(DataLoader(range(8), shuffle=True))
        frozenset({'torch'})
        >>> order_streams(DataLoader(range(8), shuffle=True, generator=torch.Generator()))
        frozenset()
    """
    attribute = "batch_sampler" if loader.batch_sampler is not None else "sampler"
    return _streams_of(loader.__dict__[attribute])


def order_drawn_at_start(loader: DataLoader) -> bool:
    """Whether each run of ``loader``'s sampler draws from a random source as it starts (``True`` for a sampler
    of a kind not known here).

    A loader with workers starts its sampler's run as its iterator is built (the workers' first indices), one
    in the main process at the first batch. Where the loop builds an iterator it drops unread, only the former
    draws for it, and every later run's order moves; a fixed order (``SequentialSampler``,
    ``DistributedSampler``'s seed and epoch, the resume mixin's planned order) is the same either way.

    Example:
        >>> order_drawn_at_start(DataLoader(range(8), shuffle=True)), order_drawn_at_start(DataLoader(range(8)))
        (True, False)
    """
    if isinstance(loader.dataset, IterableDataset):
        return False
    attribute = "batch_sampler" if loader.batch_sampler is not None else "sampler"
    return _draws_at_start(loader.__dict__[attribute])


def _draws_at_start(sampler: object) -> bool:
    return not _fixed_order(_order_source(sampler))


def _order_source(sampler: object) -> object:
    """The sampler that orders ``sampler``'s runs: the package's stand-ins and a plain ``BatchSampler`` looked
    through."""
    while True:
        if isinstance(sampler, (OrderTap, _StandIn)):
            sampler = sampler.inner
        elif type(sampler) is BatchSampler:
            sampler = sampler.sampler
        else:
            return sampler


def _fixed_order(sampler: object) -> bool:
    """Whether ``sampler`` orders its runs from no random source (its seed and epoch, or none)."""
    fixed = type(sampler) in (SequentialSampler, DistributedSampler)
    return fixed or isinstance(sampler, (PlannedSampler, PlannedBatchSampler))


def _streams_of(sampler: object) -> frozenset[str] | None:
    sampler = _order_source(sampler)
    kind = type(sampler)
    if _fixed_order(sampler):
        return frozenset()
    if kind in _DRAWS_FROM_TORCH:
        return frozenset() if sampler.generator is not None else frozenset({"torch"})  # type: ignore[attr-defined]
    return None
