"""LoadGuard's warnings: their own category, shown as a sentence without the internal file and line.

Python shows a warning with the file and line that raised it; for LoadGuard's messages that is a line inside
this package, which tells a user nothing. :class:`LoadGuardWarning` is shown as ``LoadGuardWarning: ...``;
every other warning keeps the format in place before (Lightning installs its own), and filters work as usual
(``warnings.filterwarnings("ignore", category=LoadGuardWarning)``).
"""

from __future__ import annotations

import warnings
from typing import Any


class LoadGuardWarning(UserWarning):
    """A measurement LoadGuard cannot make, a setting it cannot tune, or advice worth a warning.

    Each is said once per run, as a sentence; training goes on.

    Example:
        >>> import warnings
        >>> from lightning_loadguard import LoadGuardWarning
        >>> warnings.filterwarnings("ignore", category=LoadGuardWarning)  # silence LoadGuard's warnings only
    """


def _wrapping(previous: Any) -> Any:
    def format_warning(
        message: Any, category: type[Warning], filename: str, lineno: int, line: str | None = None
    ) -> str:
        if isinstance(category, type) and issubclass(category, LoadGuardWarning):
            return f"{category.__name__}: {message}\n"
        return previous(message, category, filename, lineno, line)

    format_warning._loadguard = True  # type: ignore[attr-defined]
    return format_warning


def install_format() -> None:
    """Show :class:`LoadGuardWarning` as a sentence, outermost: a formatter installed later (Lightning's, when
    it is imported after this package) would otherwise show LoadGuard's file and line. Called before each
    warning; the formatter in place stays the one every other warning goes through."""
    if not getattr(warnings.formatwarning, "_loadguard", False):
        warnings.formatwarning = _wrapping(warnings.formatwarning)


install_format()
