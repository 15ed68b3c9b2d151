"""The batches in flight where no window can set them: the depth, and past the deepest the persistent workers, that
the tail of every production time measured asks for over an epoch; and the depth alone where the loader cannot be
restarted to probe (an iterable dataset).

A window holds a few dozen reads, an epoch thousands: with a heavy tail, the longest of thousands is many times the
longest of a few dozen, and the buffer that covers it is sized from the tail fitted to every production time measured
(:mod:`lightning_loadguard.model.tail`) at its index's lower bound (:data:`TAIL_ERRORS`), never to hide a deficit.
Plain Python.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import replace

from lightning_loadguard.meters.settings import LoaderSettings
from lightning_loadguard.meters.window import WindowSnapshot
from lightning_loadguard.model.budget import HostBudget
from lightning_loadguard.model.capacity import has_deficit, recommend_prefetch
from lightning_loadguard.model.tail import TAIL_WAIT, Tail, fit_tail, tail_covered, tail_depth
from lightning_loadguard.tuning.arms import COMPUTING, Arm, profile
from lightning_loadguard.tuning.decision import CandidateResult, TuneDecision
from lightning_loadguard.tuning.options import TuneOptions

TAIL_ERRORS = 2.0
"""The buffer is sized for the tail at its index's lower bound, this many standard errors heavier than fitted
(:meth:`~lightning_loadguard.model.tail.Tail.heavier`; two, as every comparison of the tuner reads noise). The
wait beyond a cover of many reads grows with the tail's heaviness by a power a fit to a few dozen of the longest
reads cannot pin (the wait beyond a cover ``c`` times the tail's scale goes as ``c ** (1 - index)``), and
the two errors are not alike: too shallow a buffer stalls the loop each time the tail comes, too deep a one holds
a few batches more of memory, within the host's budget."""


def epoch_tail(chosen: Arm, arms: Iterable[Arm]) -> Tail | None:
    """The tail of every production time measured with workers in ``arms`` (a window holds a few dozen; the tail
    needs all of them), where the ``chosen`` setting's workers keep up in its window and mostly wait while busy
    (below :data:`~lightning_loadguard.tuning.arms.COMPUTING`): the buffer it sizes absorbs variation, never a
    deficit. Workers that compute would, with more batches in flight, all compute at once at an epoch's start and
    take the cores from the batches the loop needs first (benchmarks/RESULTS.md, "What changed": the sweep without
    this gate)."""
    s, w = chosen.setting, chosen.window
    share = w.cpu_share
    if (
        s.num_workers < 1
        or chosen.rate <= 0
        or share is None
        or share >= COMPUTING
        or not (w.production_s and w.step_s)
        or has_deficit(w.production_s, w.step_s, s.num_workers)
    ):
        return None
    return fit_tail([t for a in arms if a.setting.num_workers for t in a.window.production_s])


def tail_deepened(
    tail: Tail, setting: LoaderSettings, budget: HostBudget, options: TuneOptions, rate: float
) -> tuple[LoaderSettings, str]:
    """``setting`` at the depth ``tail`` asks for at ``rate`` steps/s (within memory and ``max_prefetch``), and the
    words the decision's reason adds; ``setting`` and ``""`` where no deeper depth is asked for or fits."""
    deepest = budget.deepest_prefetch(setting.num_workers, options.max_prefetch, pin_memory=setting.pin_memory)
    if deepest <= setting.prefetch:
        return setting, ""
    bound, workers, period = tail.heavier(TAIL_ERRORS), setting.num_workers, 1.0 / rate
    depth = tail_depth(bound, num_workers=workers, period_s=period, deepest=deepest)
    if depth <= setting.prefetch:
        return setting, ""
    reason = (
        f"; prefetch_factor={depth} (measured at {setting.prefetch}): the reads' times have a heavy tail, whose "
        f"longest an epoch meets and no window is long enough to show; by the tail ({_fitted(tail)}), "
        f"{_outlasting(tail, workers * setting.prefetch, period)}, "
        f"{_outlasting(tail, workers * depth, period, again=True)}; the depth is the fewest batches per worker, at "
        f"most {deepest}, whose cover leaves the tail {TAIL_ERRORS:g} standard errors heavier (index "
        f"{bound.index:.1f}) an expected wait under {TAIL_WAIT:.0%} of the loop's time (a model: not measured)"
    )
    return replace(setting, prefetch_factor=depth), reason


def tail_widened(tail: Tail, setting: LoaderSettings, budget: HostBudget, rate: float) -> tuple[LoaderSettings, str]:
    """``setting`` with the fewest workers, up to twice its count, whose batches in flight at its depth cover the
    tail (as :func:`tail_deepened` sizes it) where its depth alone does not, and the words the decision's reason
    adds; ``setting`` and ``""`` where the depth covers the tail or no more workers fit the host's budget.

    For workers that persist: a worker that mostly waits costs its start once and a few batches of memory, while
    one started anew each epoch pays its start every epoch (``benchmarks/RESULTS.md``: the sweep with and without).
    Twice the count is the search's own step up (:mod:`~lightning_loadguard.tuning.search`), here taken unmeasured:
    the tail, fitted to the reads of every count measured, not a window, says what more workers buy.
    """
    bound, period = tail.heavier(TAIL_ERRORS), 1.0 / rate
    workers, depth = setting.num_workers, setting.prefetch
    if workers < 1 or tail_covered(bound, batches_in_flight=workers * depth, period_s=period):
        return setting, ""
    widened = setting
    for more in range(workers + 1, 2 * workers + 1):
        candidate = replace(setting, num_workers=more)
        if budget.allows(candidate) is not None:
            break
        widened = candidate
        if tail_covered(bound, batches_in_flight=more * depth, period_s=period):
            break
    if widened is setting:
        return setting, ""
    reason = (
        f"; num_workers={widened.num_workers} (measured at {workers}): at prefetch_factor={depth}, by the reads' "
        f"tail ({_fitted(tail)}), {_outlasting(tail, workers * depth, period)}, "
        f"{_outlasting(tail, widened.num_workers * depth, period, again=True)} with {widened.num_workers} "
        "persistent workers, which mostly wait"
    )
    return widened, reason


def _fitted(tail: Tail) -> str:
    """The tail in words: its index, and how many reads it was fitted to."""
    return f"index {tail.index:.1f}" + (f", fitted to the {tail.top} longest reads" if tail.top else "")


def _outlasting(tail: Tail, batches_in_flight: int, period_s: float, *, again: bool = False) -> str:
    """How often ``tail`` puts a read past the time ``batches_in_flight`` cover at ``period_s`` a step, in words: the
    chance a read stalls the loop, which is robust where the fitted index is near 1 and the expected wait is not."""
    cover = batches_in_flight * period_s
    # Where the tail starts past the cover, it bounds the chance from below only.
    bound = "more than " if cover < tail.threshold_s else ""
    odds = f"{bound}1 {'' if again else 'read '}in {1.0 / tail.share_beyond(cover):,.0f}"
    span = f"{cover * 1000:.0f} ms" if cover < 1.0 else f"{cover:.1f} s"
    if again:
        return f"{odds} the {span} that {batches_in_flight} cover"
    return f"{odds} outlasts the {span} that {batches_in_flight} batches in flight cover"


def model_only_decision(
    original: LoaderSettings, budget: HostBudget, options: TuneOptions, window: WindowSnapshot, reason: str
) -> TuneDecision:
    """A decision without probing, where restarting the loader mid-epoch is unsafe (an iterable dataset).

    Only the buffer depth may change (more workers would each replay an unsharded dataset): the depth the
    buffer replay recommends for the measured times, applied from the next epoch.
    """
    result = CandidateResult(original, window.sustained_rate, None, window.steps, None, "your settings")
    kept = TuneDecision.of(
        original,
        throughput_before=window.sustained_rate,
        throughput_after=window.sustained_rate,
        verdict="model_only",
        reason=reason + "; the settings are kept",
        original=original,
        candidates=(result,),
    )
    production, steps = profile(window.production_s), profile(window.step_s)
    if original.num_workers < 1 or not production or not steps:
        return kept
    advice = recommend_prefetch(production, steps, num_workers=original.num_workers, deep_prefetch=options.max_prefetch)
    current = original.prefetch
    if advice is None:
        return replace(
            kept,
            reason=reason + "; the producer is slower than the loop on average, which no buffer "
            "depth fixes; the settings are kept",
        )
    deepest = budget.deepest_prefetch(original.num_workers, options.max_prefetch, pin_memory=original.pin_memory)
    wanted = min(advice.prefetch_factor, deepest)
    if wanted <= current:
        return kept
    return kept.with_setting(
        replace(original, prefetch_factor=wanted),
        throughput_after=None,
        bounded_by=budget.memory_bound if wanted < advice.prefetch_factor else None,
        reason=reason + f"; prefetch_factor {current} -> {wanted} (buffer replay), from the next epoch",
    )
