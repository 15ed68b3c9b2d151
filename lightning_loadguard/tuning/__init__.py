"""Auto-tuning the train loader's worker settings in epoch 0 (``LoadGuard(auto_tune=True)``).

Plain Python, no Lightning: :mod:`~lightning_loadguard.tuning.options` (limits), :mod:`~.decision` (a
candidate's result and the decision), :mod:`~.planner` (which setting to measure next and what to keep) and
:mod:`~.session` (cuts windows from the loader monitor's snapshots and switches the loader in place, reaching
the training loop through a :class:`~.port.TrainerPort`; :mod:`~.reach`: what it can do before it probes). The
planner's parts: :mod:`~.arms` (a setting measured, the settling rule and the one comparison), :mod:`~.search`
(the worker count and depth to measure next), :mod:`~.depth` (the depth no window shows: the production times'
tail; the depth alone for an iterable dataset) and :mod:`~.persistence`. The host budget is
:mod:`lightning_loadguard.model.budget`, the same the diagnosis uses; the Lightning side is
``lightning_loadguard._tuner_adapter``.

Example:
    >>> from lightning_loadguard.tuning import TuneOptions
    >>> TuneOptions(probe_share=0.1).probe_share
    0.1
"""

from lightning_loadguard.tuning.decision import TuneDecision
from lightning_loadguard.tuning.options import TuneOptions

__all__ = ["TuneDecision", "TuneOptions"]
