"""Auto-tuning the train loader's worker settings in epoch 0 (``LoadGuard(auto_tune=True)``).

The core is plain Python: :mod:`~lightning_loadguard.tuning.options` (limits), :mod:`~.budget` (cores, memory
and ``/dev/shm`` per training process), :mod:`~.decision` (settings, windows, the decision) and
:mod:`~.planner` (which setting to measure next and what to keep). :mod:`~.session` is the thin Lightning
adapter that measures windows and switches the loader in place.

Example:
    >>> from lightning_loadguard.tuning import TuneOptions
    >>> TuneOptions(probe_share=0.1).probe_share
    0.1
"""

from lightning_loadguard.tuning.decision import TuneDecision
from lightning_loadguard.tuning.options import TuneOptions

__all__ = ["TuneDecision", "TuneOptions"]
