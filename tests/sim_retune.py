"""Re-tuning on the simulator: a host change injected into a tuned run, found by the decision's watch and re-tuned.

For a pipeline of :func:`sim_sweep.generate`: tune it (:func:`sim_pipeline.tune_sim`), run the chosen setting
and feed :class:`~lightning_loadguard.tuning.watch.DecisionWatch` its windows (the planner's ``window_steps``
steps back to back, cut after ``warmup_steps`` at the decision and at each epoch's start, never across an epoch's
end; or, as :class:`~lightning_loadguard.tuning.session.TuningSession` reads them in a fit, at the logging steps:
:func:`logged_windows`). After :data:`PRE_WINDOWS` windows the host changes (:data:`CHANGES`: another job takes
cores, a job leaves, the step gets twice as fast or twice as slow); the windows from the change to the watch's
report are counted (at most :data:`WATCH_WINDOWS`). On a report a new planner starts from the running setting
where the session starts it (:func:`retune`), and its decision runs from then on (it replaces the running setting
only where it beats it). Scored against the changed pipeline's ground truth (:func:`sim_sweep.grid_best`): the
setting running after the procedure, and the old choice kept (no re-tune), over the new best. A control runs the
same pipelines without a change for :data:`WATCH_WINDOWS` windows: a report there is a re-tune the host's
background load and drift alone set off.
"""

from __future__ import annotations

import random
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, replace
from itertools import islice
from statistics import median, quantiles

from sim_pipeline import Sim, SimPipeline, drive, tune, tune_sim
from sim_sweep import _Truth, generate, grid_best

from lightning_loadguard.meters.settings import LoaderSettings
from lightning_loadguard.meters.window import WindowSnapshot
from lightning_loadguard.tuning.options import TuneOptions
from lightning_loadguard.tuning.planner import Planner
from lightning_loadguard.tuning.reach import PROBES_WANTED, span_choices, spanning_planner, tuner_budget
from lightning_loadguard.tuning.session import _WATCHED
from lightning_loadguard.tuning.watch import DecisionWatch, WatchReference

CHANGES = ("job_arrives", "job_leaves", "step_faster", "step_slower")
"""Another job takes ``k`` x the cores (k of 0.5, 1, 2); the competing jobs leave (where there were any); the
step (accelerator time and the loop's CPU work) takes half or twice as long."""

PRE_WINDOWS = 2
"""Windows of the unchanged host the watch reads before the change."""

WATCH_WINDOWS = 30
"""Windows read after the change (and in the control) before giving up."""

MATTERS = 0.95
"""A change matters where the old choice ran within this share of the best before it and runs below it after."""

WORSE = 0.03
"""A re-tune left the run worse than keeping the old choice when the rate it ends at is this much lower (the
ground truth's own spread is about 1 %, :data:`sim_sweep.BELOW_USER`)."""


def change(p: SimPipeline, rng: random.Random) -> tuple[str, SimPipeline]:
    """A change drawn for ``p``: its kind (of :data:`CHANGES`) and the changed pipeline."""
    kind = rng.choice([k for k in CHANGES if k != "job_leaves" or p.host.others > 0])
    if kind == "job_arrives":
        others = p.host.others + rng.choice((0.5, 1.0, 2.0)) * p.host.cores
        return kind, replace(p, host=replace(p.host, others=others))
    if kind == "job_leaves":
        return kind, replace(p, host=replace(p.host, others=0.0))
    factor = 0.5 if kind == "step_faster" else 2.0
    return kind, replace(p, device_s=p.device_s * factor, step_cpu_s=p.step_cpu_s * factor)


def watch_windows(sim: Sim, plan: Planner, warmup: int) -> Iterator[WindowSnapshot]:
    """Windows of the setting ``sim`` runs, as the session cuts them after the decision: ``warmup`` steps dropped
    after the decision and at each epoch's start, then windows of ``plan.window_steps`` back to back; the rest of
    an epoch that cannot hold one is run (a window never spans an epoch's end)."""
    epoch_steps = sim.p.epoch_steps
    warm = warmup
    while True:
        left = epoch_steps - sim.consumed % epoch_steps
        if warm + plan.window_steps > left:
            sim.run(left)
            warm = warmup
            continue
        sim.run(warm)
        mark = sim.consumed
        sim.run(plan.window_steps)
        warm = 0
        yield sim.window(mark)


def logged_windows(sim: Sim, plan: Planner, warmup: int, every: int) -> Iterator[WindowSnapshot]:
    """Windows as the session cuts them in a fit, where it reads them at the logging steps alone (every ``every``
    steps of the fit: Lightning's ``log_every_n_steps``): the first mark at a logging step ``warmup`` steps after
    the decision and into the epoch, a window cut at the first logging step ``plan.window_steps`` or more after the
    mark, the next marked there; a new epoch marks afresh. Ends where three epochs in a row held no window (the
    logging steps frame none in an epoch this short)."""
    epoch_steps = sim.p.epoch_steps
    start = sim.consumed + warmup
    epoch, mark, cut, empty = (sim.consumed - 1) // epoch_steps, None, True, 0
    while empty < 3:
        sim.run((sim.consumed // every + 1) * every - sim.consumed)
        ended = (sim.consumed - 1) // epoch_steps  # the epoch of the step that just ended
        in_epoch = sim.consumed - ended * epoch_steps
        if ended != epoch:
            empty = 0 if cut else empty + 1
            epoch, mark, cut = ended, None, False
        if mark is None:
            if in_epoch >= warmup and sim.consumed >= start:
                mark = sim.consumed
        elif sim.consumed - mark >= plan.window_steps:
            window = sim.window(mark)
            mark, cut = sim.consumed, True
            yield window


@dataclass
class _Run:
    """A tuned run at its decision, the chosen setting running, and the windows the watch will read."""

    sim: Sim
    plan: Planner
    chosen: LoaderSettings
    reference: WatchReference
    windows: Iterator[WindowSnapshot]
    options: TuneOptions


def _tuned_run(p: SimPipeline, seed: int, every: int | None = None) -> _Run | None:
    """``p`` tuned, its chosen setting running and watched as the session watches it (``every``: at the logging
    steps of a fit that logs every ``every`` steps, :func:`logged_windows`; ``None``: windows of the planner's
    length back to back, :func:`watch_windows`); ``None`` where the session watches nothing (not tuned, or a
    verdict it does not revisit)."""
    options = TuneOptions(max_workers=p.max_workers)
    tuned, sim, plan = tune_sim(p, options, seed=seed)
    decision = tuned.decision
    if decision is None or decision.verdict not in _WATCHED:
        return None
    arm = plan.arm_of(decision.setting)  # as the session watches it
    if arm is None:
        return None
    if sim.settings != decision.setting:
        sim.switch(decision.setting)
    if every is None:
        windows = watch_windows(sim, plan, options.warmup_steps)
    else:
        windows = logged_windows(sim, plan, options.warmup_steps, every)
    return _Run(sim, plan, decision.setting, WatchReference.of(arm), windows, options)


SPANS = ("session", "rest", "next")
"""Where a re-tune probes: ``session`` as :class:`~lightning_loadguard.tuning.session.TuningSession` does (over the
rest of the epoch the change was found in where that holds as many candidates as a first tuning wants, else from
the next epoch over as many epochs as a first tuning would span); ``rest``: over the rest of that epoch, or of the
first epoch whose rest holds a candidate; ``next``: from the next epoch, spanning as a first tuning."""


def retune(
    sim: Sim,
    running: LoaderSettings,
    latest: WindowSnapshot,
    options: TuneOptions,
    *,
    span: str = "session",
    every: int | None = None,
) -> LoaderSettings | None:
    """Probe again from ``running`` (where: ``span``, one of :data:`SPANS`); where it cannot start yet, tried again
    at the next logging step (``every``; ``None``: at the next epoch's start), for at most two epochs. The setting
    it decides on (``running`` where nothing beats it), or ``None`` where none started."""
    if span not in SPANS:
        raise ValueError(f"span must be one of {SPANS}, got {span!r}")
    epoch_steps = sim.p.epoch_steps
    budget = tuner_budget(latest, options)
    found_in = sim.consumed // epoch_steps
    deadline = sim.consumed + 2 * epoch_steps
    while sim.consumed < deadline:
        rest = epoch_steps - sim.consumed % epoch_steps

        def over(epochs: int, rest: int = rest) -> Planner:
            return Planner(running, budget, options, rest, span_epochs=epochs)

        plan: Planner | None = None
        if span == "rest":
            plan = over(1)
        elif sim.consumed // epoch_steps == found_in:
            if span == "session":
                plan = over(1)
                if plan.budget_steps < PROBES_WANTED * plan.window:
                    plan = None
        else:
            plan = spanning_planner(over, span_choices(sim.p.max_epochs))
            if not plan.can_start():
                return None
        if plan is not None and plan.can_start():
            if span == "session":
                # As the session: the windows that showed the change are the running setting's first measurement.
                following = plan.record(latest, startup_s=sim.startup_s or None)
                if following is None:
                    return plan.decide().setting
                if not plan.continuing:
                    sim.switch(following)
            return drive(sim, plan, options).chosen
        if span == "rest" and rest == epoch_steps:
            return None
        sim.run(rest if every is None else (sim.consumed // every + 1) * every - sim.consumed)
    return None


@dataclass(frozen=True)
class Trial:
    """One pipeline, one change, one ``hold``: when the watch reported it and where the run ended.

    ``detected``: windows from the change to the report (``None``: none within :data:`WATCH_WINDOWS`); ``early``: the
    watch reported before the change (a false trigger, then set aside); ``probed``: whether the re-tune could start
    (``None``: nothing found); ``starved``: the watch got fewer windows than :data:`WATCH_WINDOWS` and found nothing
    (an epoch too short for the logging steps to frame a window); ``kept`` and ``retuned``: steady rates on the
    changed pipeline of the old choice and of the setting running after the procedure, over the changed pipeline's
    best; ``fresh``: a first tuning of the changed pipeline from the user's settings, over the same best (what the
    planner reaches with a fit's whole probing span); ``before``: the old choice on the pipeline before the change,
    over its best then; ``None`` where not scored.
    """

    pipeline: SimPipeline
    kind: str
    hold: int
    chosen: LoaderSettings
    final: LoaderSettings
    detected: int | None
    early: bool
    probed: bool | None
    starved: bool
    kept: float | None = None
    retuned: float | None = None
    fresh: float | None = None
    best: LoaderSettings | None = None
    before: float | None = None

    @property
    def matters(self) -> bool:
        """The change left a choice that ran within :data:`MATTERS` of the best below it."""
        return self.before is not None and self.kept is not None and self.before >= MATTERS > self.kept


def trials(
    seed: int,
    holds: Iterable[int],
    *,
    min_gain: float | None = None,
    truth_steps: int | None = 600,
    span: str = "session",
    every: int | None = None,
    host_move: float | None = None,
) -> list[Trial]:
    """The trials of pipeline ``seed`` (one per ``hold``, each its own run from the fit's start: the same until
    the watch differs), scored over ``truth_steps`` steady steps (``None``: not scored). ``min_gain``: the
    watch's, where not the tuner's; ``span`` and ``every``: see :func:`retune` and :func:`_tuned_run`; ``host_move``:
    the watch's (:class:`~lightning_loadguard.tuning.watch.DecisionWatch`; ``None``, as the session's default
    ``TuneOptions.retune_on_other_work=False``, reads the data side alone)."""
    p = generate(seed)
    kind, changed = change(p, random.Random(seed * 7919 + 11))
    changed = replace(changed, name=p.name)
    runs: list[tuple[int, LoaderSettings, LoaderSettings, int | None, bool, bool | None, bool]] = []
    for hold in holds:
        run = _tuned_run(p, seed, every)
        if run is None:
            return []
        watch = DecisionWatch(run.reference, run.options.min_gain if min_gain is None else min_gain, hold, host_move)
        early = False
        for _ in range(PRE_WINDOWS):
            first = next(run.windows, None)
            if first is not None and watch.record(first) is not None:
                early = True
                watch = DecisionWatch(run.reference, watch.min_gain, hold, host_move)
        run.sim.p = changed
        detected, final, probed, read = None, run.chosen, None, 0
        for count, window in zip(range(1, WATCH_WINDOWS + 1), run.windows, strict=False):
            read = count
            if watch.record(window) is not None:
                detected = count
                latest = watch.latest()
                assert latest is not None
                after = retune(run.sim, run.sim.settings, latest, run.options, span=span, every=every)
                probed, final = after is not None, after or run.chosen
                break
        runs.append((hold, run.chosen, final, detected, early, probed, detected is None and read < WATCH_WINDOWS))
    if truth_steps is None:
        return [Trial(p, kind, *r) for r in runs]
    fresh = tune(changed, TuneOptions(max_workers=p.max_workers), seed=seed).chosen
    # A host change lands mid-epoch and the re-tune serves the rest of the run: scored by the steady state.
    truth = _Truth(changed, truth_steps, per_epoch=False)
    # The grid need not hold the settings the runs ended on: the best is the fastest of them all.
    best = max((grid_best(changed, truth), fresh, *(r[1] for r in runs), *(r[2] for r in runs)), key=truth)
    top = truth(best)
    earlier = _Truth(p, truth_steps, per_epoch=False)
    before = earlier(runs[0][1]) / max(earlier(grid_best(p, earlier)), earlier(runs[0][1]))
    return [Trial(p, kind, *r, truth(r[1]) / top, truth(r[2]) / top, truth(fresh) / top, best, before) for r in runs]


def false_triggers(
    seed: int, holds: Iterable[int], every: int | None = None, host_move: float | None = None
) -> dict[int, bool]:
    """The control: pipeline ``seed`` tuned and run :data:`WATCH_WINDOWS` windows on an unchanged host; for each
    ``hold``, whether a watch reported a change (empty where the pipeline was not tuned or not watched)."""
    run = _tuned_run(generate(seed), seed, every)
    if run is None:
        return {}
    watches = {h: DecisionWatch(run.reference, run.options.min_gain, h, host_move) for h in holds}
    fired = dict.fromkeys(watches, False)
    for window in islice(run.windows, WATCH_WINDOWS):
        for hold, watch in watches.items():
            fired[hold] = fired[hold] or watch.record(window) is not None
    return fired


def _p(values: list[float], q: int) -> float:
    """The ``q``-th percentile of ``values`` (the value itself where only one)."""
    ordered = sorted(values)
    return quantiles(ordered, n=100, method="inclusive")[q - 1] if len(ordered) > 1 else ordered[0]


def summary(all_trials: Iterable[Trial], controls: Iterable[dict[int, bool]]) -> dict[int, dict[str, float]]:
    """By ``hold``: trials, changes that matter, detection rates (all, where it matters), windows to detect (median,
    90th percentile, worst), reports before the change, re-tunes that could not start (of those found), watches starved
    of windows, false-trigger rate of the control, and the re-tuned and kept ratios (share >= 0.95, 1st percentile,
    median, share re-tuned below kept beyond :data:`WORSE`; where it matters, re-tuned and a fresh tuning >= 0.95,
    and the mean of re-tuned less kept)."""
    all_trials = list(all_trials)
    controls = [c for c in controls if c]
    out: dict[int, dict[str, float]] = {}
    for hold in sorted({t.hold for t in all_trials}):
        group = [t for t in all_trials if t.hold == hold]
        matter = [t for t in group if t.matters]
        found = [t.detected for t in group if t.detected is not None]
        figures = {
            "n": len(group),
            "matter": len(matter),
            "detected": len(found) / len(group),
            "detected_matter": sum(t.detected is not None for t in matter) / len(matter) if matter else 1.0,
            "windows_median": median(found) if found else float("nan"),
            "windows_p90": _p([float(w) for w in found], 90) if found else float("nan"),
            "windows_worst": max(found) if found else float("nan"),
            "early": sum(t.early for t in group) / len(group),
            "not_probed": sum(t.probed is False for t in group) / len(found) if found else 0.0,
            "starved": sum(t.starved for t in group) / len(group),
            "false_triggers": sum(c[hold] for c in controls if hold in c) / len(controls) if controls else 0.0,
        }
        scored = [t for t in group if t.kept is not None and t.retuned is not None]
        if scored:
            retuned = [t.retuned for t in scored]
            kept = [t.kept for t in scored]
            figures |= {
                "retuned_95": sum(r >= 0.95 for r in retuned) / len(scored),
                "retuned_p1": _p(retuned, 1),  # type: ignore[arg-type]
                "retuned_median": median(retuned),  # type: ignore[type-var]
                "kept_95": sum(k >= 0.95 for k in kept) / len(scored),
                "before_95": sum(t.before >= 0.95 for t in scored) / len(scored),  # type: ignore[operator]
                "kept_p1": _p(kept, 1),  # type: ignore[arg-type]
                "kept_median": median(kept),  # type: ignore[type-var]
                "worse": sum(t.retuned < t.kept * (1 - WORSE) for t in scored) / len(scored),  # type: ignore[operator]
                "matter_retuned_95": sum(t.retuned >= 0.95 for t in matter) / len(matter) if matter else 1.0,  # type: ignore[operator]
                "matter_gain": sum(t.retuned - t.kept for t in matter) / len(matter) if matter else 0.0,  # type: ignore[operator]
                "matter_fresh_95": sum(t.fresh >= 0.95 for t in matter) / len(matter) if matter else 1.0,  # type: ignore[operator]
                "fresh_95": sum(t.fresh >= 0.95 for t in scored) / len(scored),  # type: ignore[operator]
            }
        out[hold] = figures
    return out


def by_kind(all_trials: Iterable[Trial]) -> dict[tuple[int, str], dict[str, float]]:
    """By ``hold`` and change: trials, changes that matter and the share found, detection rate, median windows to
    detect, re-tuned and kept >= 0.95."""
    groups: dict[tuple[int, str], list[Trial]] = {}
    for t in all_trials:
        groups.setdefault((t.hold, t.kind), []).append(t)
    out = {}
    for key, group in sorted(groups.items()):
        found = [t.detected for t in group if t.detected is not None]
        scored = [t for t in group if t.kept is not None]
        matter = [t for t in group if t.matters]
        out[key] = {
            "n": len(group),
            "matter": len(matter),
            "detected_matter": sum(t.detected is not None for t in matter) / len(matter) if matter else float("nan"),
            "detected": len(found) / len(group),
            "windows_median": median(found) if found else float("nan"),
            "retuned_95": sum(t.retuned >= 0.95 for t in scored) / len(scored) if scored else float("nan"),  # type: ignore[operator]
            "kept_95": sum(t.kept >= 0.95 for t in scored) / len(scored) if scored else float("nan"),  # type: ignore[operator]
        }
    return out
