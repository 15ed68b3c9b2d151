"""lightning-loadguard: find out what limits your Lightning training.

Example:
    >>> from lightning_loadguard import LoadGuard
    >>> guard = LoadGuard(window=50)
"""

from lightning_loadguard.callback import LoadGuard
from lightning_loadguard.dashboard import METRICS, custom_scalars_layout
from lightning_loadguard.meters.window import HostFacts, LoaderSettings, WindowSnapshot

__all__ = ["METRICS", "HostFacts", "LoadGuard", "LoaderSettings", "WindowSnapshot", "custom_scalars_layout"]
__version__ = "0.1.0"
