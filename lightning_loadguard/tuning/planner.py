"""The tuner's plan: which setting to measure next, when to stop, and what to keep.

Plain Python, driven by measurements, so that every choice can be replayed in a unit test. The model in
:mod:`lightning_loadguard.model` proposes (workers by Little's law, prefetch depth by buffer replay); the
measurements decide. The user's own setting is measured first and is kept unless a candidate is measured
faster by at least ``TuneOptions.min_gain``.
"""

from __future__ import annotations

import math
import operator
from dataclasses import dataclass, replace
from statistics import fmean, stdev

from lightning_loadguard.meters.settings import DEFAULT_PREFETCH, LoaderSettings
from lightning_loadguard.meters.window import WindowSnapshot
from lightning_loadguard.model.budget import CORES, HostBudget
from lightning_loadguard.model.buffer import simulate_buffer
from lightning_loadguard.model.capacity import (
    REPLAY_MIN_STEPS,
    WAIT_OK,
    has_deficit,
    recommend_prefetch,
    workers_needed,
)
from lightning_loadguard.tuning.decision import CandidateResult, TuneDecision, TuneVerdict
from lightning_loadguard.tuning.options import TuneOptions, longest_probe

PROBE_BUDGET = "probe_budget"

PROFILE_LENGTH = 32
"""Per-batch production and step times (the latest, in order) replayed through the buffer model."""

STEP_SLOWDOWN = 0.1
"""Past the predicted core limit, a setting whose step's own time grew by more than 10 % over the fastest
measured step must measure faster than fewer workers by more than the windows' noise, not only by
``min_gain``: it took CPU from the training step, and only a gain the windows can tell from noise outweighs
that."""

NOISE_BLOCK_STEPS = 4
"""A window's noise is read from the rates of its consecutive blocks of this many steps."""

NOISE_SIGMAS = 2.0
"""Two rates closer than this many standard errors (of the two windows together) are not told apart."""

JUMP_CORES = 2
"""Where one more worker measured slower (the loop's threads won the cores) while the loader still lacks
production, one probe jumps to this many workers per predicted core (at most Little's law's count): CPU-bound
workers can win a share of the cores from the loop's threads that a single one cannot."""


@dataclass
class _Proposal:
    setting: LoaderSettings
    note: str
    bound: str | None = None
    verify: bool = False  # past the predicted core limit: measured before it is believed


def _profile(values: tuple[float, ...]) -> tuple[float, ...]:
    return values[-PROFILE_LENGTH:]


class Planner:
    """Chooses the settings to probe, one window at a time, and makes the decision.

    Call :meth:`record` with each window (a rank-combined :class:`WindowSnapshot` of :attr:`current`); it
    returns the next setting to measure, or ``None`` when done; then :meth:`decide`.

    Args:
        original: the user's settings (measured first).
        budget: the host budget of one training process.
        options: probe limits and thresholds.
        epoch_steps: steps in one epoch (the probe budget is a share of the epochs spanned).
        span_epochs: epochs the probing may span (a short epoch holds too few windows).
        pinning_helps: an accelerator exists that pinned host memory speeds transfers to.

    Example:
        An I/O-bound loader with 1 worker making a batch in 40 ms, and a 10 ms step:

        >>> p = Planner(LoaderSettings(1, 2), HostBudget(7), TuneOptions(), epoch_steps=400)
        >>> p.record(WindowSnapshot(wait_s=(0.03,) * 12, step_s=(0.01,) * 12, production_s=(0.04,) * 12,
        ...                         batches_made=12)).label
        'workers=5 prefetch=2'
    """

    def __init__(
        self,
        original: LoaderSettings,
        budget: HostBudget,
        options: TuneOptions,
        epoch_steps: int,
        *,
        pinning_helps: bool = False,
        span_epochs: int = 1,
    ) -> None:
        if span_epochs < 1:
            raise ValueError(f"span_epochs must be >= 1, got {span_epochs!r}")
        self.original = original
        self.budget = budget
        self.options = options
        self.epoch_steps = epoch_steps
        self.pinning_helps = pinning_helps
        self.span_epochs = span_epochs
        self.budget_steps = math.floor(options.probe_share * epoch_steps * span_epochs)
        # Sized for one epoch's budget: a window never spans an epoch's end, and more epochs buy more windows.
        self.window_steps = options.window_for(math.floor(options.probe_share * epoch_steps))
        self.window = options.warmup_steps + self.window_steps
        self.current = original
        self.current_note = "your settings"
        self.results: list[CandidateResult] = []
        self.measurements: dict[LoaderSettings, WindowSnapshot] = {}
        self.probe_steps = 0
        self.probe_time_s = 0.0
        self._bounds: set[str] = set()
        self._ran_out = False
        self._jumped = False
        self._jumped_over: tuple[int, int] | None = None  # the counts a jump went from and to, until bisected
        self._confirmed = False
        self._again: set[LoaderSettings] = set()
        self._thrice = False
        self._reference: WindowSnapshot | None = None  # the user's settings measured again, after the candidates
        self._run: WindowSnapshot | None = None  # the windows of :attr:`current` since its restart, as judged
        self._before_run: WindowSnapshot | None = None  # :attr:`current`'s windows before that restart
        self.continuing = False
        """Whether :attr:`current` is the setting just measured, measured again without a restart."""

    # -- schedule --------------------------------------------------------------------------------------

    def can_start(self) -> bool:
        """Whether the epochs spanned leave room to measure the user's setting and at least one candidate: a
        window within one epoch, the user's and a candidate's within the span, the candidate's within the
        probe budget."""
        return (
            longest_probe(self.options, self.window_steps) <= self.budget_steps
            and self.window <= self.epoch_steps
            and 2 * self.window <= self.epoch_steps * self.span_epochs
        )

    def record(self, window: WindowSnapshot, failed: str | None = None) -> LoaderSettings | None:
        """Store the window of :attr:`current` (``failed``: why the setting failed, if it did); return the next
        setting to measure (``None``: decide now)."""
        setting = self.current
        producer = self._producer_rate(setting, window)
        self.results.append(
            CandidateResult(
                setting=setting,
                rate=None if failed else window.sustained_rate,
                producer_rate=None if failed else producer,
                steps=self.steps_for(setting),
                failed=failed,
                note=self.current_note,
            )
        )
        if setting != self.original:
            self.probe_steps += self.steps_for(setting)
            self.probe_time_s += window.loop_s
        if not failed and setting == self.original and setting in self.measurements:
            self._reference = self._run = self._settled_run(window)
        elif not failed:
            self._measured(setting, window)
        elif setting == self.original:
            return None  # the user's own setting failing is the user's error to see, not ours to tune around
        proposal = self._propose()
        if proposal is None:
            return None
        # Past the predicted core limit only what was verified: this step, or a worker count that paid.
        verified = proposal.verify or any(
            s.num_workers >= proposal.setting.num_workers and self._paid(s, m) for s, m in self.measurements.items()
        )
        check = self.budget.breaks_wall if verified else self.budget.allows
        broken = check(proposal.setting)
        if broken is not None:
            # Only a variant of a setting already over budget (the user's own) can get here: never probe it.
            self._bounds.add(broken)
            return None
        again = proposal.setting == setting
        probing = proposal.setting != self.original  # the user's own settings cost the run nothing
        if probing and self.probe_steps + self.steps_for(proposal.setting, continuing=again) > self.budget_steps:
            self._ran_out = True
            # The probe budget is spent, not the run: the user's settings may still be measured again, free.
            base = self._baseline
            proposal = None if base is None else self._reference_again(base)
            if proposal is None:
                return None
            again = proposal.setting == setting
        if proposal.bound:
            self._bounds.add(proposal.bound)
        self.continuing = again and not failed
        self.current, self.current_note = proposal.setting, proposal.note
        return proposal.setting

    def _measured(self, setting: LoaderSettings, window: WindowSnapshot) -> None:
        """Store ``window`` of ``setting`` with the setting's earlier windows (see :meth:`_settled_run`)."""
        if not self.continuing:
            self._before_run = self.measurements.get(setting)
        self._run = self._settled_run(window)
        self.measurements[setting] = self._run if self._before_run is None else self._before_run.joined(self._run)

    def _settled_run(self, window: WindowSnapshot) -> WindowSnapshot:
        """The windows of :attr:`current` since its restart, ``window`` the latest, without those that were
        still settling (:func:`_settled_after`); the latest row's note says where windows were set aside.

        Measured again, one window of a few dozen steps is noisy and two together half as much (per root).
        But a loader may run below its steady rate for dozens of steps after its workers start: in
        benchmarks/restart_settling.py the first three 24-step windows of cpu_16ms_step_waits (2 workers)
        read 0.90 to 0.93 of the steady rate, the first two of cpu_transforms_torch_step 0.84 to 0.86 then
        0.89 (one tuning: 4 workers 47 then 62 steps/s, 73 in the steady state). Joined to a steady window,
        such a window pulls the setting below the user's settings, which were measured without a restart where
        they load in-process.
        """
        if not self.continuing or self._run is None:
            return window
        faster = _settled_after(self._run, window)
        if faster is None:
            return self._run.joined(window)
        gain, noise = faster
        last = self.results[-1]
        self.results[-1] = replace(
            last,
            note=f"{last.note}; {gain:.0%} faster than before, beyond the windows' noise ({noise:.0%}): "
            "the windows before, still settling after the restart, set aside",
        )
        return window

    def warmup_for(self, setting: LoaderSettings, *, continuing: bool | None = None) -> int:
        """Steps discarded after switching to ``setting``: ``warmup_steps``, or its batches in flight where more
        (the first fill is made while the new workers start, at no steady rate), at most ``warmup_steps`` plus
        half a window (see :func:`~lightning_loadguard.tuning.options.longest_probe`). A setting measured again
        while it runs (``continuing``; by default whether it is :attr:`current` and :attr:`continuing`) has
        started its workers and filled its buffer: ``warmup_steps``."""
        running = (self.continuing and setting == self.current) if continuing is None else continuing
        if (setting == self.original and setting not in self.measurements) or running:
            return self.options.warmup_steps
        fill = max(self.options.warmup_steps, setting.batches_in_flight)
        return min(fill, longest_probe(self.options, self.window_steps) - self.window_steps)

    def steps_for(self, setting: LoaderSettings, *, continuing: bool | None = None) -> int:
        """Steps one measurement of ``setting`` takes: its warm-up and the window."""
        return self.warmup_for(setting, continuing=continuing) + self.window_steps

    def note_budget_spent(self) -> None:
        """The epochs the probing may span are over: what was measured is all there is to decide on."""
        self._ran_out = True

    # -- proposals -------------------------------------------------------------------------------------

    def _producer_rate(self, setting: LoaderSettings, m: WindowSnapshot) -> float | None:
        if m.mean_production_s is None or m.mean_production_s <= 0:
            return None
        return max(1, setting.num_workers) / m.mean_production_s

    @property
    def _baseline(self) -> WindowSnapshot | None:
        """The user's settings as a candidate must beat them: where they were measured again after the
        candidates (:meth:`_reference_again`), the faster of their two windows."""
        first = self.measurements.get(self.original)
        if first is None or self._reference is None:
            return first
        return max(first, self._reference, key=lambda m: m.sustained_rate)

    def _best(self) -> tuple[LoaderSettings, WindowSnapshot] | None:
        """The fastest measured setting; past the predicted core limit only one that paid (see
        :meth:`_paid`)."""
        admitted = [(s, m) for s, m in self.measurements.items() if self._paid(s, m)]
        if not admitted:
            return None
        return max(admitted, key=lambda item: item[1].sustained_rate)

    def _past_limit(self, setting: LoaderSettings) -> bool:
        return self.budget.workers_bound == CORES and setting.num_workers > self.budget.max_workers

    def _paid(self, setting: LoaderSettings, m: WindowSnapshot) -> bool:
        """A setting past the predicted core limit counts when it measured ``min_gain`` faster than every
        setting with fewer workers (and by more than the windows' noise where the step's own time grew by more
        than ``STEP_SLOWDOWN``)."""
        return self._gain_short(setting, m) is None

    def _gain_short(self, setting: LoaderSettings, m: WindowSnapshot) -> float | None:
        """How much faster than the best with fewer workers ``setting`` had to measure and did not (the
        margin it was held to); ``None`` where it paid, or needed not."""
        if not self._past_limit(setting) or setting == self.original:
            return None
        if not any(s.num_workers < setting.num_workers for s in self.measurements):
            return None
        gained, noise = self._gained(setting, m)
        margin = max(self.options.min_gain, noise) if self._step_slowed(m) else self.options.min_gain
        return None if gained >= margin else margin

    def _gained(self, setting: LoaderSettings, m: WindowSnapshot) -> tuple[float, float]:
        """How much faster than the best with fewer workers ``setting`` measured, and the noise of that
        comparison (``NOISE_SIGMAS`` standard errors of the two); ``(0, 0)`` where none has fewer workers."""
        fewer = [o for s, o in self.measurements.items() if s.num_workers < setting.num_workers]
        if not fewer:
            return 0.0, 0.0
        rival = max(fewer, key=lambda o: o.sustained_rate)
        noise = _noise(m, rival)
        return m.sustained_rate / rival.sustained_rate - 1, noise

    def _verify_more(self, best: LoaderSettings, best_m: WindowSnapshot, target: _Proposal | None) -> _Proposal | None:
        """One worker past the predicted core limit, where the model wants more and the last one paid.

        Cores are a hypothesis (the loop's threads, the workers and other processes share them): the
        prediction says where to start measuring, the measurement says where to stop.
        """
        at_limit = target.bound == CORES if target is not None else self.budget.max_workers < 1
        if not at_limit or self.budget.workers_bound != CORES or best.num_workers < self.budget.max_workers:
            return None
        fewer = [(s, m) for s, m in self.measurements.items() if s.num_workers < best.num_workers]
        if fewer:
            previous = max(fewer, key=lambda item: item[0].num_workers)[1]
            if best_m.sustained_rate < previous.sustained_rate * (1 + self.options.min_gain):
                return None  # the last worker did not pay: the next one will not either
        workers = best.num_workers + 1
        if not self.budget.workers_verifiable(workers):
            return None
        note = f"past the predicted core limit of {self.budget.max_workers}: measured, not assumed"
        proposal = self._verified(best, workers, note)
        return None if proposal is None or self._tried(proposal.setting) else proposal

    def _jump(
        self, best: LoaderSettings, best_m: WindowSnapshot, slower: LoaderSettings, consumer: float
    ) -> _Proposal | None:
        """Once per search: past a worker count that measured slower than fewer, straight to ``JUMP_CORES``
        workers per predicted core (at most Little's law's count), where the producer still falls short.

        One more worker beside a step whose threads keep the cores busy gets little of them; several win a
        share by their number. Measured like any setting past the core limit: kept only if it pays.
        """
        if self._jumped or self.budget.workers_bound != CORES or best_m.mean_production_s is None:
            return None
        if not math.isfinite(consumer):
            return None
        wanted = workers_needed(best_m.mean_production_s, consumer)
        workers = min(wanted, self._furthest_past_limit())
        if workers <= slower.num_workers + 1 or not self.budget.workers_verifiable(workers):
            return None
        note = f"{_workers(slower.num_workers)} measured slower; {workers} may win the cores' share: measured"
        proposal = self._verified(best, workers, note)
        if proposal is None or self._tried(proposal.setting):
            return None
        self._jumped = True
        self._jumped_over = (slower.num_workers, workers)
        return proposal

    def _between_jumped(self, best: LoaderSettings, best_m: WindowSnapshot) -> _Proposal | None:
        """Once, where the jump's count is the best measured, or measured faster than the best without paying:
        the count halfway between it and the slower one it jumped from, which the jump left unmeasured.

        The jump's count is a guess at how many workers win the cores' share; beside a step whose threads
        share the cores, fewer may win as much and leave the step more (as measured by
        benchmarks/tune_pipelines.py's cpu_transforms_torch_step: 2 workers 78 steps/s, 4 workers 73). Where
        the jump read faster than the best but within its windows' noise, the count halfway is measured before
        the jump's second window (one run: 4 workers 8 % above in-process twice, unpaid, the probe budget then
        spent, and in-process kept at 0.74 of the grid's best, 2 workers). Where the jump's first window read it
        slower within their noise, its second comes first; where the two together read it faster, the count
        halfway comes before a third (another run: 4 workers 49, 64 and 54 steps/s, the budget then spent, and
        in-process kept at 0.79 of the grid's best, 2 workers).
        """
        if self._jumped_over is None:
            return None
        slower, jumped = self._jumped_over
        at_jump = [(s, m) for s, m in self.measurements.items() if s.num_workers == jumped]
        if not at_jump:
            return None
        jump, jump_m = max(at_jump, key=lambda item: item[1].sustained_rate)
        if jump != best and jump_m.sustained_rate <= best_m.sustained_rate:
            return None
        self._jumped_over = None
        middle = (slower + jumped) // 2
        if middle in (slower, jumped) or not self.budget.workers_verifiable(middle):
            return None
        note = f"between {_workers(slower)}, slower, and the jump to {jumped}: measured"
        proposal = self._verified(jump, middle, note)
        return None if proposal is None or self._tried(proposal.setting) else proposal

    def _verified(self, base: LoaderSettings, workers: int, note: str) -> _Proposal | None:
        """``workers`` past the predicted core limit, at one batch per worker (a depth deeper than torch's
        default, chosen by the user or by the buffer replay, is kept), as deep as memory allows.

        Past that limit the workers and the loop share the cores: ``workers`` batches in flight are already a
        buffer of that many, and each further batch a worker makes ahead of the step takes a core from it. In
        the steady state of benchmarks/tune_pipelines.py, prefetch 1 ran 1 to 3 % faster than torch's default
        of 2 at every worker count past the limit (cpu_16ms_step_waits: 2, 3 and 4 workers 79.2, 82.3, 79.5
        steps/s at prefetch 1 against 78.2, 80.6, 77.8 at 2), and the grid's best was at prefetch 1 on every
        pipeline whose workers outnumber the cores. Where bursts need more, the replay proposes it
        (:meth:`_deeper`).
        """
        deepest = self.budget.deepest_prefetch(workers, self.options.max_prefetch, pin_memory=base.pin_memory)
        prefetch = min(base.prefetch if base.prefetch > DEFAULT_PREFETCH else 1, deepest)
        if prefetch < 1:
            return None
        return _Proposal(replace(base, num_workers=workers, prefetch_factor=prefetch), note, verify=True)

    def _tried(self, setting: LoaderSettings) -> bool:
        return any(r.setting == setting for r in self.results)

    def _fastest_step_s(self) -> float | None:
        """The shortest measured step: the loop's own compute; longer ones include stalls behind contention."""
        steps = [m.mean_step_s for m in self.measurements.values() if m.mean_step_s > 0]
        return min(steps) if steps else None

    def _step_slowed(self, m: WindowSnapshot) -> bool:
        """Whether ``m``'s step took more than ``STEP_SLOWDOWN`` longer than the fastest measured step."""
        fastest = self._fastest_step_s()
        return fastest is not None and m.mean_step_s > fastest * (1 + STEP_SLOWDOWN)

    def _consumer_rate(self) -> float:
        fastest = self._fastest_step_s()
        return 1.0 / fastest if fastest is not None else math.inf

    def _propose(self) -> _Proposal | None:
        if self._reference is not None:
            return self._reference_settling()  # then the decision is made on the user's settings measured again
        base = self._baseline
        best = self._best()
        if base is None or best is None:
            return None
        best_setting, best_m = best
        if _winnable(best_setting, best_m) < WAIT_OK:
            return self._pinning(best_setting) or self._reference_again(base)
        return (
            self._measure_again(best_setting, best_m)
            or self._search(best_setting, best_m)
            or self._confirm(best_setting, best_m, base)
            or self._reference_again(base)
        )

    def _reference_again(self, base: WindowSnapshot) -> _Proposal | None:
        """Once, where the search is over and a candidate would replace the user's settings: the user's settings
        measured again, after every candidate.

        The windows of one run drift: the same setting, in 28-step windows along 200 steps without LoadGuard,
        read 125 steps/s first and 137 last (``cpu_transforms``), 53 and 56 (``jpeg_cnn``). Measured first, the
        user's settings would be judged on the run's slowest stretch, and a candidate measured later could gain
        by its place alone (``jpeg_cnn``: 4 workers measured 12 % above in-process, and ran 13 % below it in the
        steady state). Judged on the faster of their two windows, the user's settings lose no such comparison
        by where they were measured. Running them costs no probe steps: the run would have run them anyway, so
        they are measured also where the probe budget is spent.
        Not where the epochs the probing spans have no room left for the window: a fit that ends inside it
        would end undecided.
        """
        if not self._room_for(self.steps_for(self.original)):
            return None
        chosen, _, _ = self._replacement(base)
        if chosen == self.original:
            return None
        return _Proposal(self.original, "your settings again, after the candidates: the run's windows drift")

    def _reference_settling(self) -> _Proposal | None:
        """Once, where the user's settings start workers: the user's settings measured again after the candidates
        get a second window, while they run (no probe steps, like the first).

        Their first window after the restart may not have settled (:meth:`_settled_run`), and a candidate
        measured twice is judged without such a window: the user's settings get the same chance. Without
        workers nothing restarts. Not where the epochs the probing spans have no room left for the window.
        """
        # Two rows of the user's settings: their first window and the one after the candidates, nothing since.
        if self.original.num_workers < 1 or sum(1 for r in self.results if r.setting == self.original) != 2:
            return None
        if not self._room_for(self.steps_for(self.original, continuing=True)):
            return None
        return _Proposal(self.original, "your settings again, a second window while they run: a loader settles")

    def _room_for(self, steps: int) -> bool:
        """Whether the epochs the probing spans hold ``steps`` more after every window measured."""
        return sum(r.steps for r in self.results) + steps <= self.epoch_steps * self.span_epochs

    def _measure_again(self, best: LoaderSettings, best_m: WindowSnapshot) -> _Proposal | None:
        """The setting just measured, once more while it still runs, where its window could not tell it from
        the best: it measured faster but did not pay past the predicted core limit, or slower by less than
        the two windows' noise.

        Each window's noise is read from itself (the spread of its blocks' rates). On a host whose cores are
        shared by the step's threads and the workers, one window of a few dozen steps can read a good setting
        10 % low; measured again without a restart (its workers started, its buffer full) it costs
        ``warmup_steps`` and a window, and it is judged on both windows. Not a setting that, at the top of that
        noise, would still not beat the user's settings by ``min_gain``: the budget goes to settings that could.
        """
        last = self.results[-1]
        setting = last.setting
        m = self.measurements.get(setting)
        if last.failed or m is None or setting in (best, self.original):
            return None
        if setting in self._again:
            # Two windows of a jump that read it faster than the best: the count it passed over is measured before
            # a third window of the jump, which the search may still give it (:meth:`_confirm`).
            return self._between_jumped(best, best_m) or self._third_window(setting, m)
        if m.sustained_rate > best_m.sustained_rate:
            if self._paid(setting, m):
                return None
            # A jump that read faster but did not pay: the count it passed over first, which may pay where the
            # jump's own windows cannot tell it from noise.
            between = self._between_jumped(best, best_m)
            if between is not None:
                return between
            note = _unpaid_note(m, best_m)
        else:
            noise = _noise(m, best_m)
            if m.sustained_rate < best_m.sustained_rate * (1 - noise):
                return None
            base = self._baseline
            if base is not None and m.sustained_rate * (1 + noise) < base.sustained_rate * (1 + self.options.min_gain):
                return None  # however it read again, it would not replace the user's settings
            note = (
                f"measured again: {1 - m.sustained_rate / best_m.sustained_rate:.0%} below the best, "
                f"within the windows' noise ({noise:.0%})"
            )
        return self._second_window(setting, note)

    def _third_window(self, setting: LoaderSettings, m: WindowSnapshot) -> _Proposal | None:
        """Once per search, a third window for a setting whose two measured ``min_gain`` faster than fewer
        workers but, with a step that slowed (``STEP_SLOWDOWN``), not by more than their noise: where the step's
        threads and the workers share the cores, one window of the same workers may read 25 % below the
        next. Three windows together decide (their noise is smaller); none of a setting that gained less.
        """
        margin = self._gain_short(setting, m)
        gained, _ = self._gained(setting, m)
        if self._thrice or margin is None or gained < self.options.min_gain:
            return None
        self._thrice = True
        note = f"measured a third time: {gained:.0%} faster than fewer workers, within their noise ({margin:.0%})"
        return self._once_more(setting, note)

    def _second_window(self, setting: LoaderSettings, note: str) -> _Proposal:
        """``setting`` measured once more (never a third time)."""
        self._again.add(setting)
        return self._once_more(setting, note)

    def _once_more(self, setting: LoaderSettings, note: str) -> _Proposal:
        """``setting`` measured again while it runs; past the predicted core limit, as verified."""
        return _Proposal(setting, note, verify=setting.num_workers > self.budget.max_workers)

    def _confirm(self, best: LoaderSettings, best_m: WindowSnapshot, base: WindowSnapshot) -> _Proposal | None:
        """Once per search, where the search is over: one setting its window could not tell from the best,
        measured again.

        A setting that measured faster than the best but was not taken (past the predicted core limit, it
        did not pay), or a best that measured faster than the user's settings by less than ``min_gain`` or than
        the windows' noise (:meth:`_beats_yours`): one window of a few dozen steps on a busy host cannot separate
        them. The new window joins the first (the setting is judged on both); where the setting still runs, its
        workers are started and its buffer is full, so it costs only ``warmup_steps`` and a window. A best
        measured twice already gets its third window here, where the search has had none, and so does an unpaid
        jump measured twice, whose third window waited for the count it passed over (:meth:`_measure_again`).
        """
        if self._confirmed:
            return None
        faster = sorted(
            ((s, m) for s, m in self.measurements.items() if m.sustained_rate > best_m.sustained_rate),
            key=lambda item: item[1].sustained_rate,
            reverse=True,
        )
        unpaid = [(s, m) for s, m in faster if not self._paid(s, m)]
        once = [(s, m) for s, m in unpaid if s not in self._again]
        twice = [(s, m) for s, m in unpaid if s in self._again]
        if once:
            setting, m = once[0]
            note = _unpaid_note(m, best_m)
        elif twice and (third := self._third_window(*twice[0])):
            self._confirmed = True
            return third
        elif best != self.original and not self._beats_yours(best_m, base):
            gained = best_m.sustained_rate / base.sustained_rate - 1
            if best in self._again:
                if self._thrice or gained < self.options.min_gain:
                    return None
                self._confirmed = self._thrice = True
                note = f"measured a third time: {gained:.0%} above your settings, within the windows' noise"
                return self._once_more(best, note)
            setting, m = best, best_m
            note = f"measured again: {gained:.0%} above your settings"
        else:
            return None
        self._confirmed = True
        return self._second_window(setting, note)

    def _search(self, best_setting: LoaderSettings, best_m: WindowSnapshot) -> _Proposal | None:
        consumer = self._consumer_rate()
        last = self.results[-1].setting
        last_m = self.measurements.get(last)
        target = self._workers_for(best_setting, best_m, consumer)
        if (
            last_m is not None
            and last_m.sustained_rate < best_m.sustained_rate
            and last.num_workers > best_setting.num_workers
        ):
            if (
                target is not None
                and target.setting.num_workers > last.num_workers
                and last_m.sustained_rate >= best_m.sustained_rate * (1 - _noise(last_m, best_m))
                and not self._tried(target.setting)
            ):
                # Slower by less than the windows' noise, where the cores are predicted to hold the count the
                # model asks for, is no evidence of contention: that count is measured (bursty, one run: 3
                # workers' two windows 1.5 % below 2 workers' one, within their noise; the search went between
                # them, and 2 workers kept ran at 0.80 of the grid's best).
                return target
            # More workers measured slower (contention): look between the best and the last.
            middle = (best_setting.num_workers + last.num_workers) // 2
            if middle not in (best_setting.num_workers, last.num_workers):
                note = "between the best and a slower one"
                proposal = self._with_workers(best_setting, middle, best_m, note)
                if proposal is not None and proposal.bound == CORES and self.budget.workers_verifiable(middle):
                    # Both ends were measured: the core prediction does not cap a count between them.
                    proposal = self._verified(best_setting, middle, note) or proposal
                if proposal is not None and not self._tried(proposal.setting):
                    return proposal
            return (
                self._deeper(best_setting, best_m, consumer)
                or self._jump(best_setting, best_m, last, consumer)
                or self._pinning(best_setting)
            )
        if (
            target is not None
            and target.setting.num_workers > best_setting.num_workers
            and not self._tried(target.setting)
        ):
            return target
        # The count a jump passed over first: which worker count wins the cores is not a question of depth. Then
        # a deeper buffer (it costs memory only) before a worker past the predicted core limit (it may cost the
        # step).
        return (
            self._between_jumped(best_setting, best_m)
            or self._deeper(best_setting, best_m, consumer)
            or self._verify_more(best_setting, best_m, target)
            or self._pinning(best_setting)
        )

    def _workers_for(self, setting: LoaderSettings, m: WindowSnapshot, consumer: float) -> _Proposal | None:
        """Little's law on the measured production time: the workers that keep up with the consumer."""
        if m.mean_production_s is None or not math.isfinite(consumer):
            # Without producer metering, double the workers and let the measurement judge.
            wanted = max(1, 2 * setting.num_workers)
            note = "double the workers (producer not metered)"
        else:
            wanted = workers_needed(m.mean_production_s, consumer)
            note = f"Little's law: {m.mean_production_s * 1e3:.1f} ms/batch at {consumer:.1f} steps/s"
            replayed = self._replayed_workers(setting, m, wanted)
            if replayed > wanted:
                wanted, note = replayed, note + f", {replayed} to absorb the bursts (replay)"
            if wanted <= setting.num_workers:
                if setting.num_workers <= self.budget.max_workers and m.stall_fraction < WAIT_OK:
                    # Every batch the loop waited for was already made, by workers the cores are predicted to
                    # hold: it waits for the hand-over (the batch's way from the worker into the loop), which no
                    # further worker shortens. Past that prediction the workers and the loop share the cores,
                    # and one more worker shifts their shares: that is measured (see _verify_more).
                    return None
                # The model says enough, yet the loop waits: the per-batch time grew with contention; one more.
                wanted = setting.num_workers + 1
                note = "one more worker (measured rate below the model's)"
        return self._with_workers(setting, wanted, m, note)

    def _replayed_workers(self, setting: LoaderSettings, m: WindowSnapshot, start: int) -> int:
        """The fewest workers from ``start`` whose replayed wait is negligible: the mean hides bursts.

        Little's law sizes for the mean production time; with a few slow batches among fast ones, the workers
        that match the mean leave the loop waiting on every burst. Replaying the measured sequences through the
        buffer model finds the count that also absorbs them. Past a predicted core limit up to ``JUMP_CORES``
        workers per predicted core: the prediction caps the proposal (:meth:`_with_workers`) and measurements
        verify past it, but a replay stopped at it would read "no count absorbs the bursts" as "the count
        Little's law gave does" (bursty, one run: 3 cores predicted from the first window, the replay stopped
        at 3 gave Little's law's 2, and 2 workers were kept at 0.80 of the grid's best; where the first window
        predicted 5, the replay asked for 5).
        """
        production = self._burst_profile(setting, m)
        if not production or not _profile(m.step_s):
            return start
        budget = self.budget
        ceiling = self._furthest_past_limit() if budget.workers_bound == CORES else budget.max_workers
        steps = _profile(m.step_s)
        # Per-worker times: without workers the in-process fetch times are what one worker would take.
        for workers in range(max(1, start), max(1, ceiling) + 1):
            if not budget.workers_verifiable(workers) and workers > budget.max_workers:
                break
            if _replayed_wait(production, steps, workers, setting.prefetch) < WAIT_OK:
                return workers
        return max(1, start)

    def _furthest_past_limit(self) -> int:
        """The most workers measurements may lead to past a predicted core limit: ``JUMP_CORES`` per predicted
        core."""
        return JUMP_CORES * (self.budget.max_workers + 1)

    def _burst_profile(self, setting: LoaderSettings, m: WindowSnapshot) -> tuple[float, ...]:
        """The per-batch production times the replay sizes workers by: every batch measured at a setting the
        cores are predicted to hold, in the order measured; past that prediction, ``m``'s own latest.

        Bursts are rare batches, and one window of a few dozen may hold none (bursty, one sample in 29 taking
        60 ms more, batches of 4: one window of 24 batches in 30), and its replay alone then asks for no more
        workers. Where the cores hold the workers, a batch takes as long whichever setting made it, so every
        window measured is a sample of the same bursts. Past the prediction the workers wait for cores, and
        only the window's own times say how long.
        """
        held = max(1, self.budget.max_workers)
        if setting.num_workers > held:
            return _profile(m.production_s)
        pooled = tuple(t for s, o in self.measurements.items() if s.num_workers <= held for t in o.production_s)
        return pooled or _profile(m.production_s)

    def _with_workers(self, setting: LoaderSettings, workers: int, m: WindowSnapshot, note: str) -> _Proposal | None:
        bound = None
        if workers > self.budget.max_workers:
            workers, bound = self.budget.max_workers, self.budget.workers_bound
        if workers < 1:
            return None
        prefetch = setting.prefetch
        deepest = self.budget.deepest_prefetch(workers, self.options.max_prefetch, pin_memory=setting.pin_memory)
        while workers >= 1 and deepest < 1:
            workers -= 1
            bound = self.budget.memory_bound
            deepest = (
                self.budget.deepest_prefetch(workers, self.options.max_prefetch, pin_memory=setting.pin_memory)
                if workers
                else 0
            )
        if workers < 1:
            return None
        if prefetch > deepest:
            prefetch, bound = deepest, self.budget.memory_bound
        return _Proposal(replace(setting, num_workers=workers, prefetch_factor=prefetch), note, bound)

    def _deeper(self, setting: LoaderSettings, m: WindowSnapshot, consumer: float) -> _Proposal | None:
        """A deeper buffer, where the producer keeps up on average but bursts still stall the loop."""
        if setting.num_workers < 1 or not _profile(m.production_s) or not _profile(m.step_s):
            return None
        if has_deficit(_profile(m.production_s), _profile(m.step_s), setting.num_workers):
            return None  # a buffer postpones a deficit, never removes it
        if not self._wait_explained(setting, m):
            return None
        advice = recommend_prefetch(
            _profile(m.production_s),
            _profile(m.step_s),
            num_workers=setting.num_workers,
            deep_prefetch=self.options.max_prefetch,
        )
        current = setting.prefetch
        wanted = max(current + 1, advice.prefetch_factor) if advice is not None else 2 * current
        deepest = self.budget.deepest_prefetch(
            setting.num_workers, self.options.max_prefetch, pin_memory=setting.pin_memory
        )
        bound = None
        if wanted > deepest:
            wanted = deepest
            bound = self.budget.memory_bound if deepest < self.options.max_prefetch else None
        if wanted <= current:
            if bound:
                self._bounds.add(bound)
            return None
        proposal = _Proposal(replace(setting, prefetch_factor=wanted), "deeper buffer for bursts (replay)", bound)
        return None if self._tried(proposal.setting) else proposal

    def _wait_explained(self, setting: LoaderSettings, m: WindowSnapshot) -> bool:
        """Whether the buffer model, replaying the window's own production and step times at its depth,
        accounts for the wait it measured (within ``WAIT_OK``).

        A deeper buffer absorbs the bursts those times hold. Where the loop waited far more than they explain,
        the wait comes from what the per-batch times do not show (workers waiting for a core between batches
        on a busy host, the hand-over): no depth removes it, and probing depths would only spend the budget
        that more workers need.
        """
        replayed = _replayed_wait(_profile(m.production_s), _profile(m.step_s), setting.num_workers, setting.prefetch)
        return _winnable(setting, m) - replayed <= WAIT_OK

    def _pinning(self, setting: LoaderSettings) -> _Proposal | None:
        if not self.pinning_helps or setting.pin_memory or setting.num_workers < 1:
            return None
        proposal = _Proposal(replace(setting, pin_memory=True), "pinned memory for faster transfers")
        return None if self._tried(proposal.setting) else proposal

    # -- decision --------------------------------------------------------------------------------------

    def _beats_yours(self, m: WindowSnapshot, base: WindowSnapshot) -> bool:
        """Whether ``m`` measured faster than the user's settings by ``min_gain`` and by more than the two
        windows' noise: a gain the windows cannot tell from noise is no reason to change a user's settings."""
        margin = max(self.options.min_gain, _noise(m, base))
        return m.sustained_rate >= base.sustained_rate * (1 + margin)

    def _replacement(self, base: WindowSnapshot) -> tuple[LoaderSettings, WindowSnapshot, str]:
        """The setting to replace the user's, and why it rather than a faster one; the user's own (with
        ``base``) where none beats them (:meth:`_beats_yours`).

        Of the settings that beat the user's (and paid past the predicted core limit), those the fastest did not
        measure faster than by ``min_gain`` and by more than the windows' noise are alike as measured: the one
        with the fewest batches in flight (then workers) is kept, the one that costs the host least memory,
        processes and CPU. Never one the fastest beat by ``min_gain`` or more, however noisy the windows: the
        measured difference is still the best estimate of what the cheaper one would lose (bursty, where
        bursts swing the windows' blocks: 2 workers 15 % below 5 in windows whose noise read 15 %, and 25 %
        below the grid's best in the steady state).
        """
        winners = [
            (s, m)
            for s, m in self.measurements.items()
            if s != self.original and self._paid(s, m) and self._beats_yours(m, base)
        ]
        if not winners:
            return self.original, base, ""
        fastest, fastest_m = max(winners, key=lambda item: item[1].sustained_rate)
        top = fastest_m.sustained_rate
        alike = [
            (s, m)
            for s, m in winners
            if top <= m.sustained_rate * (1 + min(self.options.min_gain, _noise(m, fastest_m)))
        ]
        chosen, chosen_m = min(alike, key=lambda item: (item[0].batches_in_flight, item[0].num_workers))
        why = ""
        if chosen != fastest:
            more = "batches in flight" if fastest.batches_in_flight > chosen.batches_in_flight else "workers"
            why = (
                f"; {fastest.label} measured {top / chosen_m.sustained_rate - 1:.0%} faster, within the windows' "
                f"noise ({_noise(chosen_m, fastest_m):.0%}) and less than {self.options.min_gain:.0%}, "
                f"with more {more}"
            )
        return chosen, chosen_m, why

    def decide(self, *, startup_s: float | None = None, map_style: bool = True) -> TuneDecision:
        """The setting to keep: the user's, unless one measured faster by ``min_gain`` and by more than the
        windows' noise (see :meth:`_replacement`)."""
        base = self._baseline
        if base is None:
            return self._kept("not_tuned", "the user's setting could not be measured", None)
        before = base.sustained_rate
        chosen, chosen_m, why = self._replacement(base)
        after = chosen_m.sustained_rate
        deficit = _winnable(chosen, chosen_m)
        if deficit < WAIT_OK:
            deficit = 0.0
        bounded_by = self._bounded_by(chosen, deficit)
        if chosen == self.original:
            if _winnable(self.original, base) < WAIT_OK:
                verdict, reason = "compute_bound", "the loop runs at its compute rate; your settings are kept"
            else:
                verdict = "no_gain"
                reason = (
                    f"no candidate measured at least {self.options.min_gain:.0%} faster, and by more than the "
                    f"windows' noise; your settings are kept, and {deficit:.0%} of the step rate is still lost to "
                    "data wait"
                )
        else:
            verdict = "improved"
            reason = f"{after / before:.2f}x the steps/s of your settings{why}"
            if deficit > 0:
                reason += f"; {deficit:.0%} of the step rate is still lost to data wait"
        if bounded_by and deficit > 0:
            reason += f" (bounded by {bounded_by}{self._why_no_more(chosen, bounded_by)})"
        persistent = chosen.persistent_workers or self._persistent(chosen, after, startup_s, map_style)
        cost = max(0.0, self.probe_time_s - self.probe_steps / after) if after > 0 else self.probe_time_s
        return TuneDecision.of(
            replace(chosen, persistent_workers=persistent),
            throughput_before=before,
            throughput_after=after,
            bounded_by=bounded_by,
            verdict=verdict,
            remaining_deficit=deficit,
            reason=reason,
            original=self.original,
            candidates=tuple(self.results),
            probe_steps=self.probe_steps,
            probe_budget_steps=self.budget_steps,
            probe_cost_s=cost,
        )

    def _why_no_more(self, chosen: LoaderSettings, bounded_by: str) -> str:
        """Why the search did not try more workers than ``chosen``, in words."""
        more = [(s, m) for s, m in self.measurements.items() if s.num_workers > chosen.num_workers]
        if more:
            setting, m = min(more, key=lambda item: item[0].num_workers)
            chosen_m = self.measurements.get(chosen)
            fastest = self._fastest_step_s()
            if fastest is not None and self._step_slowed(m):
                return (
                    f": {_workers(setting.num_workers)} slowed the step itself to {m.mean_step_s * 1e3:.3g} ms "
                    f"(fastest {fastest * 1e3:.3g} ms)"
                )
            if chosen_m is not None:
                return (
                    f": {_workers(setting.num_workers)} measured {m.sustained_rate:.3g} steps/s against "
                    f"{chosen_m.sustained_rate:.3g}, less than {self.options.min_gain:.0%} more"
                )
        if bounded_by == CORES and chosen.num_workers >= self.budget.max_workers:
            return f": the last worker added paid less than {self.options.min_gain:.0%}, so no more were tried"
        return ""

    def _bounded_by(self, chosen: LoaderSettings, deficit: float) -> str | None:
        """The budget that stopped the search short of the compute rate, if any."""
        if deficit <= 0:
            return None
        budget = self.budget
        at_memory_wall = budget.max_in_flight is not None and chosen.batches_in_flight >= budget.max_in_flight
        if at_memory_wall and budget.memory_bound is not None:
            # Memory is a wall and cores a prediction: where both bind, no more workers could have been tried.
            return budget.memory_bound
        if chosen.num_workers >= budget.max_workers:
            # A core limit is a prediction the search verifies past: where the probe budget ran out first, that
            # is what stopped it.
            if budget.workers_bound == CORES and self._ran_out:
                return PROBE_BUDGET
            return budget.workers_bound
        if self.budget.memory_bound in self._bounds:
            return self.budget.memory_bound
        return PROBE_BUDGET if self._ran_out else None

    def _persistent(self, chosen: LoaderSettings, rate: float, startup_s: float | None, map_style: bool) -> bool:
        """Keep workers across epochs when starting them costs a measurable share of an epoch."""
        if not (self.options.tune_persistent_workers and map_style and chosen.num_workers > 0):
            return False
        if startup_s is None or rate <= 0:
            return False
        epoch_s = self.epoch_steps / rate
        return startup_s >= self.options.persistent_min_share * epoch_s

    def _kept(self, verdict: TuneVerdict, reason: str, before: float | None) -> TuneDecision:
        o = self.original
        return TuneDecision.of(
            o,
            throughput_before=before,
            throughput_after=before,
            verdict=verdict,
            reason=reason,
            original=o,
            candidates=tuple(self.results),
            probe_steps=self.probe_steps,
            probe_budget_steps=self.budget_steps,
        )


def _workers(count: int) -> str:
    return f"{count} worker" + ("" if count == 1 else "s")


def _unpaid_note(m: WindowSnapshot, best_m: WindowSnapshot) -> str:
    return f"measured again: {m.sustained_rate / best_m.sustained_rate - 1:.0%} above the best, unpaid"


def _replayed_wait(production_s: tuple[float, ...], step_s: tuple[float, ...], workers: int, prefetch: int) -> float:
    """The wait fraction the buffer model gives per-batch production and per-step times at a setting."""
    return simulate_buffer(
        production_s,
        step_s,
        num_workers=workers,
        prefetch_factor=prefetch,
        steps=REPLAY_MIN_STEPS,
        record_levels=False,
    ).wait_fraction


def _settled_after(earlier: WindowSnapshot, later: WindowSnapshot) -> tuple[float, float] | None:
    """How much faster ``later`` ran than ``earlier`` (windows of one setting, without a restart between
    them) and the two windows' noise, where it ran faster by more than that noise; ``None`` otherwise, or where
    either window is too short to read its noise from.

    A restart only ever slows the loop while it settles: a later window faster beyond the noise says the
    earlier one had not settled.
    """
    if min(earlier.steps, later.steps) < 2 * NOISE_BLOCK_STEPS:
        return None
    gain = later.sustained_rate / earlier.sustained_rate - 1 if earlier.sustained_rate > 0 else 0.0
    noise = _noise(later, earlier)
    return (gain, noise) if gain > noise else None


def _noise(m: WindowSnapshot, other: WindowSnapshot) -> float:
    """The relative difference of two windows' rates that they cannot tell from noise: ``NOISE_SIGMAS``
    standard errors of the two together."""
    return NOISE_SIGMAS * math.hypot(_rate_error(m), _rate_error(other))


def _rate_error(m: WindowSnapshot) -> float:
    """Relative standard error of a window's rate, from the rates of its blocks of ``NOISE_BLOCK_STEPS`` steps
    (0 where the window holds fewer than two blocks)."""
    blocks = m.steps // NOISE_BLOCK_STEPS
    if blocks < 2:
        return 0.0
    loop = list(map(operator.add, m.wait_s, m.step_s))
    rates = [
        NOISE_BLOCK_STEPS / t
        for b in range(blocks)
        if (t := math.fsum(loop[b * NOISE_BLOCK_STEPS : (b + 1) * NOISE_BLOCK_STEPS])) > 0
    ]
    if len(rates) < 2:
        return 0.0
    return stdev(rates) / math.sqrt(len(rates)) / fmean(rates)


def _winnable(setting: LoaderSettings, m: WindowSnapshot) -> float:
    """Share of the loop's time a faster loader could win back.

    The measured wait also holds the loop's own fetch overhead, which no loader setting removes, and on a
    busy host the loop's thread waiting for a core (sampled), which more workers would only add to. Without
    workers the batch is made inside the wait, so what workers could hide is at most the production time.
    """
    wait = m.wait_fraction * (1.0 - m.core_wait_share())
    if setting.num_workers == 0 and m.mean_production_s is not None:
        production = m.mean_production_s
        return min(wait, production / (production + m.mean_step_s)) if production > 0 else 0.0
    return wait


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
    if original.num_workers < 1 or not _profile(window.production_s) or not _profile(window.step_s):
        return kept
    advice = recommend_prefetch(
        _profile(window.production_s),
        _profile(window.step_s),
        num_workers=original.num_workers,
        deep_prefetch=options.max_prefetch,
    )
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
    return replace(
        kept,
        prefetch_factor=wanted,
        throughput_after=None,
        bounded_by=budget.memory_bound if wanted < advice.prefetch_factor else None,
        reason=reason + f"; prefetch_factor {current} -> {wanted} (buffer replay), from the next epoch",
    )
