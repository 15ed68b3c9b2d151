"""The changes LoadGuard makes to the user's objects during a fit, each recorded with its undo.

One place undoes them all, in reverse order, whichever way the fit ends: its ``teardown`` or, when the fit
raises (Lightning then skips ``teardown``), ``on_exception``. A copy or pickle of the registry is empty: the
patches belong to the objects of the fit that made them.

Example:
    >>> patches = Patches()
    >>> target = {"profiler": "user's"}
    >>> target["profiler"] = "proxy"; patches.add("the profiler", target.update, {"profiler": "user's"})
    >>> patches.undo_all(), target
    ([], {'profiler': "user's"})
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


class Patches:
    """A stack of applied changes, each with the call that reverts it."""

    def __init__(self) -> None:
        self._undo: list[tuple[str, Callable[..., Any], tuple[Any, ...]]] = []

    def add(self, what: str, undo: Callable[..., Any], *args: Any) -> None:
        """Record a change just made; ``undo(*args)`` reverts it (and is harmless if already reverted)."""
        self._undo.append((what, undo, args))

    def undo_all(self) -> list[tuple[str, Exception]]:
        """Revert every recorded change, newest first; returns those whose undo failed (the rest are undone)."""
        failed: list[tuple[str, Exception]] = []
        while self._undo:
            what, undo, args = self._undo.pop()
            try:
                undo(*args)
            except Exception as err:
                failed.append((what, err))
        return failed

    def __len__(self) -> int:
        return len(self._undo)

    def __getstate__(self) -> dict[str, Any]:
        return {"_undo": []}
