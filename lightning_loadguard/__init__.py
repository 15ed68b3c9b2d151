"""lightning-loadguard: find out what limits your Lightning training.

The names exported here are the public API (``docs/api.md``); they keep their meaning across minor
releases. Subpackages and modules are internal and may change.

Example:
    >>> from lightning_loadguard import LoadGuard, TuneOptions
    >>> guard = LoadGuard(window=50, auto_tune=TuneOptions(probe_share=0.1))
"""

from lightning_loadguard._moved import moved_names
from lightning_loadguard.callback import LoadGuard
from lightning_loadguard.dashboard import METRICS, custom_scalars_layout
from lightning_loadguard.datamodule import ResumableLoaderMixin
from lightning_loadguard.model.findings import VERDICTS, Diagnosis, Finding
from lightning_loadguard.position import LoaderPosition, PositionMismatchError
from lightning_loadguard.tuning import TuneDecision, TuneOptions

__all__ = [
    "METRICS",
    "VERDICTS",
    "Diagnosis",
    "Finding",
    "LoadGuard",
    "LoaderPosition",
    "PositionMismatchError",
    "ResumableLoaderMixin",
    "TuneDecision",
    "TuneOptions",
    "custom_scalars_layout",
]
__version__ = "0.1.0"

_MEASUREMENT = "the type of LoadGuard.snapshot's raw measurements is internal and changes with the meters"
# Exported here in 0.1.0.
__getattr__ = moved_names(
    __name__,
    {
        "HostFacts": ("lightning_loadguard.meters.window:HostFacts", _MEASUREMENT),
        "LoaderSettings": ("lightning_loadguard.meters.window:LoaderSettings", _MEASUREMENT),
        "WindowSnapshot": ("lightning_loadguard.meters.window:WindowSnapshot", _MEASUREMENT),
    },
)
