"""lightning-loadguard: find out what limits your Lightning training.

Example:
    >>> from lightning_loadguard import LoadGuard, TuneOptions
    >>> guard = LoadGuard(window=50, auto_tune=TuneOptions(probe_share=0.1))
"""

from lightning_loadguard.callback import LoadGuard
from lightning_loadguard.dashboard import METRICS, custom_scalars_layout
from lightning_loadguard.datamodule import ResumableLoaderMixin
from lightning_loadguard.meters.window import HostFacts, LoaderSettings, WindowSnapshot
from lightning_loadguard.model.findings import VERDICTS, Diagnosis, Finding
from lightning_loadguard.position import LoaderPosition, PositionMismatchError
from lightning_loadguard.tuning import TuneDecision, TuneOptions

__all__ = [
    "METRICS",
    "VERDICTS",
    "Diagnosis",
    "Finding",
    "HostFacts",
    "LoadGuard",
    "LoaderPosition",
    "LoaderSettings",
    "PositionMismatchError",
    "ResumableLoaderMixin",
    "TuneDecision",
    "TuneOptions",
    "WindowSnapshot",
    "custom_scalars_layout",
]
__version__ = "0.1.0"
