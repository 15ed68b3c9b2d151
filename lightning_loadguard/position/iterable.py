"""Consumer-accurate positions for iterable datasets that can save and load their own state."""

from __future__ import annotations

import copy
from collections import OrderedDict
from collections.abc import Iterator
from typing import Any

from torch.utils.data import IterableDataset

from lightning_loadguard.position.state import PositionMismatchError


def is_stateful(dataset: object) -> bool:
    """Whether ``dataset`` follows the ``state_dict()`` / ``load_state_dict()`` protocol (torchdata's Stateful)."""
    return callable(getattr(dataset, "state_dict", None)) and callable(getattr(dataset, "load_state_dict", None))


def unsaved_order(dataset: object) -> str | None:
    """What of ``dataset``'s order its own ``state_dict()`` is known to leave out, or ``None``.

    Known case: a Hugging Face ``IterableDataset`` shuffled with a buffer (``.shuffle(buffer_size=...)``) saves
    where its source stands but not the buffer's content; restored, it refills the buffer from there, so the
    samples the buffer held are lost and the resumed order differs.

    Example:
        >>> unsaved_order([1, 2, 3]) is None
        True
    """
    pending = [getattr(dataset, "_ex_iterable", None)]
    for _ in range(256):
        if not pending:
            break
        node = pending.pop()
        if node is None:
            continue
        if type(node).__name__ == "BufferShuffledExamplesIterable":
            return (
                f"its shuffle buffer ({getattr(node, 'buffer_size', '?')} samples) is not part of its state_dict(), "
                "so a resumed epoch loses the samples the buffer held"
            )
        pending.append(getattr(node, "ex_iterable", None))
        pending.extend(getattr(node, "ex_iterables", None) or ())
    return None


class StatefulIterableTap(IterableDataset):  # type: ignore[type-arg]
    """Records a stateful iterable dataset's state at every batch boundary as the producer passes it.

    The producer runs ahead of the consumer (Lightning fetches one batch ahead when the loader has no
    length), so the dataset's state *now* is too far. The tap keeps the state after each produced batch;
    the state to save is the one at the number of batches the consumer finished. It works in the main
    process only (``num_workers=0``): worker processes hold copies of the dataset whose state the main
    process cannot read.

    Args:
        dataset: The stateful iterable dataset.
        batch_size: Samples per batch (``None`` when the loader does not batch).
        keep: How many batch boundaries to remember; the consumer never lags the producer by more than the
            loader's prefetch depth, so a small window suffices.

    Example:
        >>> class Count(IterableDataset):
        ...     def __init__(self): self.pos = 0
        ...     def __iter__(self):
        ...         while self.pos < 6:
        ...             self.pos += 1
        ...             yield self.pos - 1
        ...         self.pos = 0
        ...     def state_dict(self): return {"pos": self.pos}
        ...     def load_state_dict(self, s): self.pos = s["pos"]
        >>> tap = StatefulIterableTap(Count(), batch_size=2)
        >>> it = iter(tap); _ = [next(it) for _ in range(5)]
        >>> tap.state_at(2)
        {'pos': 4}
    """

    def __init__(self, dataset: Any, batch_size: int | None, keep: int = 256) -> None:
        if not is_stateful(dataset):
            raise TypeError(
                f"{type(dataset).__name__} has no state_dict()/load_state_dict(); its position cannot be stored"
            )
        if keep < 1:
            raise ValueError(f"keep must be >= 1, got {keep}")
        self.dataset = dataset
        self.batch_size = batch_size or 1
        self.keep = keep
        self._pending: tuple[Any, int, int] | None = None
        self._final: Any = None
        self._final_batches: int | None = None
        self._snapshots: OrderedDict[int, Any] = OrderedDict()

    def resume(self, dataset_state: Any, batches_consumed: int = 0, iterations: int = 1) -> None:
        """Load ``dataset_state`` into the dataset when the next iteration starts.

        ``batches_consumed`` is how many batches of the epoch that state already covers, so that
        :meth:`state_at` keeps counting batches from the epoch's start. ``iterations`` is how many of the
        next iterations start from that state: a loop that starts one iteration, reads ahead in it and drops
        it before taking a batch (Lightning 2.4 resuming at an epoch boundary) needs 2.
        """
        if batches_consumed < 0:
            raise ValueError(f"batches_consumed must be >= 0, got {batches_consumed}")
        if iterations < 1:
            raise ValueError(f"iterations must be >= 1, got {iterations}")
        self._pending = (dataset_state, batches_consumed, iterations)

    def _record(self, batches: int) -> None:
        self._snapshots[batches] = copy.deepcopy(self.dataset.state_dict())
        while len(self._snapshots) > self.keep:
            self._snapshots.popitem(last=False)

    def recorded(self, batches_consumed: int) -> bool:
        """Whether :meth:`state_at` knows the state after ``batches_consumed`` batches."""
        return batches_consumed in self._snapshots

    def state_at(self, batches_consumed: int) -> Any:
        """The dataset's state right after ``batches_consumed`` batches of the current iteration.

        Once the iteration ran to its end, the state after its last batch is :attr:`final_state`.

        Raises:
            PositionMismatchError: that boundary was not produced yet or fell out of the window.
        """
        if batches_consumed not in self._snapshots:
            have = (min(self._snapshots), max(self._snapshots)) if self._snapshots else None
            raise PositionMismatchError(
                f"no dataset state recorded after {batches_consumed} batches (recorded range: {have})"
            )
        return self._snapshots[batches_consumed]

    @property
    def final_state(self) -> Any:
        """The dataset's state once the last iteration ran to its end (``None`` while it has not).

        This is where the next epoch starts: a dataset that moves to its next epoch when exhausted has
        already done so.
        """
        return self._final

    @property
    def final_batches(self) -> int | None:
        """Batches the last iteration made in all, counted from the epoch's start (``None`` while it runs)."""
        return self._final_batches

    def __iter__(self) -> Iterator[Any]:
        produced = 0
        resumed = self._pending is not None
        if self._pending is not None:
            state, produced, left = self._pending
            self.dataset.load_state_dict(copy.deepcopy(state))
            self._pending = (state, produced, left - 1) if left > 1 else None
        self._final = None
        self._final_batches = None
        self._snapshots.clear()
        self._record(produced)
        in_batch = 0
        for item in self.dataset:
            in_batch += 1
            if in_batch == self.batch_size:
                produced += 1
                in_batch = 0
                # Taken before yielding: the state already counts this item, as the consumer will.
                self._record(produced)
            yield item
        if in_batch:
            produced += 1
        # The boundary after the last batch is re-recorded now that the dataset ran its own end-of-iteration
        # step (e.g. moving to its next epoch): a full last batch was recorded before that step, and restoring
        # that earlier state would replay an exhausted iteration instead of starting the next one.
        self._record(produced)
        self._final = self._snapshots[produced]
        self._final_batches = produced
        if resumed and self._pending is None:
            _forget_starting_state(self.dataset)


def _forget_starting_state(dataset: Any) -> None:
    """After the resumed iteration ran to its end, let the next one start as in a run never interrupted.

    A Hugging Face ``IterableDataset`` keeps the state it loaded as the start of every later iteration of the
    same ``epoch`` (its ``_starting_state_dict``); under Lightning, which never calls the dataset's
    ``set_epoch``, every later epoch would replay the resumed one's tail.
    """
    if getattr(dataset, "_starting_state_dict", None) is not None:
        dataset._starting_state_dict = None
