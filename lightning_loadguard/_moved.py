"""Names that left a public namespace keep working for a while, with a ``DeprecationWarning`` that says where to go."""

from __future__ import annotations

import importlib
import warnings
from collections.abc import Callable
from typing import Any


def moved_names(module: str, moved: dict[str, tuple[str, str]]) -> Callable[[str], Any]:
    """A module-level ``__getattr__`` for ``module``'s former names.

    Args:
        module: the module whose namespace the names left (its ``__name__``).
        moved: for each former name, where it lives now (``"package.module:attribute"``) and what to tell
            the user instead.

    Example:
        >>> __getattr__ = moved_names("pkg", {"old": ("math:pi", "use math.pi")})
        >>> import warnings
        >>> with warnings.catch_warnings(record=True) as caught:
        ...     warnings.simplefilter("always")
        ...     value = __getattr__("old")
        >>> round(value, 2), str(caught[0].message)
        (3.14, 'pkg.old is deprecated: use math.pi')
    """

    def __getattr__(name: str) -> Any:
        if name not in moved:
            raise AttributeError(f"module {module!r} has no attribute {name!r}")
        target, advice = moved[name]
        warnings.warn(f"{module}.{name} is deprecated: {advice}", DeprecationWarning, stacklevel=2)
        where, _, attribute = target.partition(":")
        return getattr(importlib.import_module(where), attribute)

    return __getattr__
