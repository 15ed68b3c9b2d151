"""The batches of indices one sampler run handed out, held compactly.

Held as Python lists, each index costs a list slot and an int object in the main process, tens of bytes, so an
epoch of millions of samples holds hundreds of MB. Indices are held here as a flat machine-int array and the end
of each batch: 4 bytes per index while they fit in 32 bits. Anything
a sampler may yield besides a list of ints, or a bare int (a tuple, a tensor, numpy ints, a key), is kept as
the object itself from that point on, so what is played back is always exactly what was recorded, type
included.

Example:
    >>> record = IndexRecord()
    >>> for batch in ([4, 1, 7], [0, 2, 3], [5, 6]):
    ...     record.append(batch)
    >>> len(record), record.since(1)
    (3, [[0, 2, 3], [5, 6]])
"""

from __future__ import annotations

from array import array
from typing import Any


class IndexRecord:
    """Items appended in order, read back from any position as a list equal, item by item and type by type,
    to what was appended."""

    def __init__(self) -> None:
        self._values = array("i")
        self._ends = array("q")  # where each batch ends in _values; empty while items are bare ints
        self._batches: bool | None = None  # whether items are lists of ints (None: nothing recorded yet)
        self._items: list[Any] | None = None  # every item as recorded, once one did not fit the arrays

    def append(self, item: Any) -> None:
        if self._items is None and self._held_compactly(item):
            return
        if self._items is None:
            self._items = self.since(0)
        self._items.append(item)

    def _held_compactly(self, item: Any) -> bool:
        """Add ``item`` to the arrays where it is what they hold (a bare int, or a list of ints, as before)."""
        if type(item) is int:
            if self._batches is True or not self._extend([item]):
                return False
            self._batches = False
            return True
        if type(item) is not list or self._batches is False or not set(map(type, item)) <= {int}:
            return False
        if not self._extend(item):
            return False
        self._ends.append(len(self._values))
        self._batches = True
        return True

    def _extend(self, values: list[int]) -> bool:
        """Add ``values`` to the flat array, widened to 64 bits where they need it; False where they cannot fit."""
        try:
            self._values.fromlist(values)  # all or nothing, at C speed
            return True
        except OverflowError:
            if self._values.typecode == "q":
                return False
        self._values = array("q", self._values)
        return self._extend(values)

    def since(self, start: int) -> list[Any]:
        """The items from position ``start`` on."""
        if self._items is not None:
            return self._items[start:]
        if not self._batches:
            return self._values[start:].tolist()
        ends, values = self._ends, self._values
        return [values[ends[i - 1] if i else 0 : ends[i]].tolist() for i in range(start, len(ends))]

    def __len__(self) -> int:
        if self._items is not None:
            return len(self._items)
        return len(self._ends) if self._batches else len(self._values)
