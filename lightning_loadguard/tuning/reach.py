"""What the tuner can do before it probes: the host budget it plans with, the train loaders it declines, the epochs
its probing spans, and (:func:`tuner_reach`) whether ``LoadGuard(auto_tune=...)`` would probe worker counts at
all, from the checks the session itself makes (the diagnosis's advice reads the same). Plain Python."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any

from torch.utils.data import DataLoader, IterableDataset

from lightning_loadguard.meters.monitor import not_one_loader
from lightning_loadguard.meters.settings import settings_of
from lightning_loadguard.meters.window import WindowSnapshot
from lightning_loadguard.model.budget import HostBudget, snapshot_budget
from lightning_loadguard.model.diagnosis import TunerReach
from lightning_loadguard.tuning.options import TuneOptions
from lightning_loadguard.tuning.planner import Planner
from lightning_loadguard.tuning.sharding import worker_sharding

MAX_SPAN_EPOCHS = 10
"""Most epochs the probing may span when one epoch is too short for it (the probe share of each stays the same: more
epochs delay the decision, they do not make probing cost more)."""

PROBES_WANTED = 5
"""Windows a span of several epochs is sized to hold, when one epoch holds fewer: your settings, the search's first
counts and a second window of the two that decide (with three, short epochs decided on single windows of a few
steps: ``benchmarks/RESULTS.md``, the tuner on simulated pipelines)."""


def span_choices(max_epochs: int | None) -> tuple[int, ...]:
    last = MAX_SPAN_EPOCHS if max_epochs is None or max_epochs < 1 else min(MAX_SPAN_EPOCHS, max_epochs)
    return tuple(range(1, last + 1))


def spanning_planner(make: Callable[[int], Planner], spans: tuple[int, ...]) -> Planner:
    """The fewest epochs whose probe budget holds ``PROBES_WANTED`` windows, or failing that the most the
    fit allows (a budget that holds one or two candidates decides on one or two)."""
    planners = [make(span) for span in spans]
    able = [p for p in planners if p.can_start()]
    roomy = [p for p in able if p.budget_steps >= PROBES_WANTED * p.window]
    return roomy[0] if roomy else (able or planners)[-1]


def tuner_budget(window: WindowSnapshot, options: TuneOptions, devices_on_host: int = 1) -> HostBudget:
    """The host budget the tuner plans with: the diagnosis's (:func:`~lightning_loadguard.model.budget.snapshot_budget`
    of the same window) under the user's limits.

    ``devices_on_host`` counts this node's training processes before the ranks' figures have said how many share
    the host.

    Example:
        >>> from lightning_loadguard.meters.window import HostFacts
        >>> window = WindowSnapshot(wait_s=(0.0,), step_s=(0.1,), host=HostFacts(cpu_count=16))
        >>> tuner_budget(window, TuneOptions()).max_workers, tuner_budget(window, TuneOptions(), 4).max_workers
        (15, 3)
    """
    processes = max(devices_on_host, window.host.processes_on_host)
    return snapshot_budget(
        replace(window, host=replace(window.host, processes_on_host=processes)),
        max_workers=options.max_workers,
        ram_share=options.memory_share,
        shm_share=options.shm_share,
    )


def loaders_declined(loaders: list[Any]) -> str | None:
    """Why the tuner cannot tune these train loaders at all, or ``None``."""
    if len(loaders) != 1:
        return not_one_loader(loaders)
    loader = loaders[0]
    if not isinstance(loader, DataLoader):
        return f"the train loader is a {type(loader).__name__}, not a torch DataLoader"
    if isinstance(loader.dataset, IterableDataset) and loader.num_workers == 0:
        sharding = worker_sharding(loader.dataset)
        if sharding is not None:
            return (
                f"the train loader reads {sharding}, in the main process; workers would change each epoch's "
                "order (which worker reads which shard, interleaved batch by batch) and without them no "
                "buffer exists to deepen. Set num_workers yourself (the order then follows it) and the "
                "prefetch depth can be tuned"
            )
        return (
            "the train loader reads an IterableDataset in the main process; more workers would each replay an "
            "unsharded dataset (duplicate samples) and no buffer exists to deepen"
        )
    return None


def tuner_reach(
    loaders: list[Any],
    window: WindowSnapshot,
    *,
    epoch_steps: int | None,
    max_epochs: int | None,
    devices_on_host: int = 1,
    options: TuneOptions | None = None,
) -> TunerReach:
    """Whether ``LoadGuard(auto_tune=options)`` would probe worker counts for these train loaders, in a fit that
    starts in epoch 0: the checks the tuner itself makes before it probes (the loaders' kind, the epoch's room
    for a candidate), from the same functions.

    Example:
        >>> from lightning_loadguard.meters.window import HostFacts
        >>> window = WindowSnapshot(wait_s=(0.01,), step_s=(0.01,), host=HostFacts(cpu_count=4))
        >>> loader = DataLoader(list(range(4000)), batch_size=4)
        >>> tuner_reach([loader], window, epoch_steps=1000, max_epochs=None).acts
        True
        >>> tuner_reach([loader], window, epoch_steps=10, max_epochs=1).reason
        'epochs of 10 steps leave no room to measure your settings and one candidate (max_epochs=1)'
    """
    options = options or TuneOptions()
    reason = loaders_declined(loaders)
    if reason is not None:
        return TunerReach(False, reason)
    loader = loaders[0]
    if isinstance(loader.dataset, IterableDataset) or epoch_steps is None:
        return TunerReach(
            False, "the train loader reads an IterableDataset: its num_workers is never changed, only its prefetch"
        )
    budget = tuner_budget(window, options, devices_on_host)
    original = settings_of(loader)

    def planner(span: int) -> Planner:
        return Planner(original, budget, options, epoch_steps, span_epochs=span)

    if not spanning_planner(planner, span_choices(max_epochs)).can_start():
        cap = f" (max_epochs={max_epochs})" if max_epochs is not None else ""
        return TunerReach(
            False, f"epochs of {epoch_steps} steps leave no room to measure your settings and one candidate{cap}"
        )
    return TunerReach(True)
