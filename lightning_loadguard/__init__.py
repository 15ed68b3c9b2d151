"""lightning-loadguard: find out what limits your Lightning training.

The names exported here are the public API (``docs/api.md``); they keep their meaning across minor
releases. Subpackages and modules are internal and may change.

Example:
    >>> from lightning_loadguard import LoadGuard, TuneOptions
    >>> guard = LoadGuard(window=50, auto_tune=TuneOptions(probe_share=0.1))
"""

import importlib
from typing import TYPE_CHECKING, Any

from lightning_loadguard._moved import moved_names
from lightning_loadguard._warnings import LoadGuardWarning
from lightning_loadguard.dashboard import METRICS, custom_scalars_layout
from lightning_loadguard.model.findings import VERDICTS, Diagnosis, Finding
from lightning_loadguard.model.forecast import Forecast, WhatIf
from lightning_loadguard.position import LoaderPosition, PositionMismatchError
from lightning_loadguard.position.plan import NonReproducibleOrderError
from lightning_loadguard.tuning import TuneDecision, TuneOptions

__all__ = [
    "METRICS",
    "VERDICTS",
    "Diagnosis",
    "Finding",
    "Forecast",
    "LoadGuard",
    "LoadGuardWarning",
    "LoaderPosition",
    "NonReproducibleOrderError",
    "PositionMismatchError",
    "ResumableLoaderMixin",
    "TuneDecision",
    "TuneOptions",
    "WhatIf",
    "custom_scalars_layout",
]
__version__ = "0.2.0.dev0"

if TYPE_CHECKING:
    from lightning_loadguard.callback import LoadGuard
    from lightning_loadguard.datamodule import ResumableLoaderMixin

# The Lightning adapters load on first use, so that the framework-agnostic core (meters, model, position,
# tuning) imports without Lightning.
_ADAPTERS = {"LoadGuard": "lightning_loadguard.callback", "ResumableLoaderMixin": "lightning_loadguard.datamodule"}

_MEASUREMENT = "the type of LoadGuard.snapshot's raw measurements is internal and changes with the meters"
# Exported here in 0.1.0.
_MOVED = {
    "HostFacts": ("lightning_loadguard.meters.window:HostFacts", _MEASUREMENT),
    "LoaderSettings": ("lightning_loadguard.meters.settings:LoaderSettings", _MEASUREMENT),
    "WindowSnapshot": ("lightning_loadguard.meters.window:WindowSnapshot", _MEASUREMENT),
}
_moved = moved_names(__name__, _MOVED)


def __getattr__(name: str) -> Any:
    if name in _ADAPTERS:
        value = getattr(importlib.import_module(_ADAPTERS[name]), name)
        globals()[name] = value
        return value
    return _moved(name)
