"""The tuner's plan: which setting to measure next, when to stop, and what to keep.

One procedure (docs/tuning.md states it in five sentences):

1. Every setting measured is an *arm*: its windows, joined, give a sustained rate (where a window drew the
   buffer down, the workers' capacity: :attr:`WindowSnapshot.sustained_rate`) and a standard error (from
   the spread of their blocks' rates), at most what the host's cores make (:attr:`Arm.cores_bound`) and, where its
   computing workers outnumber the cores, over an epoch, its first batch included (:attr:`Arm.epoch_steps`); one
   settling rule holds for every arm, the user's included: a window a later one of the same run beats beyond the
   noise had not settled after the restart, and is set aside.
2. The worker count moves by one search, on the rates as measured (:mod:`~lightning_loadguard.tuning.search`):
   from the model's estimate, up while more paid, between the best and a slower count, down where more did not
   pay; at its best count, the depth the buffer replay asks for. Memory and the user's cap clamp every setting.
3. When the search has nothing new to measure, the next window goes to whichever arm could still change the
   decision (the leader, or the user's settings, which cost no probe steps, whichever has fewer windows).
4. One comparison decides: a setting beats another when it is faster by ``min_gain`` and by more than the noise
   (two standard errors of the difference, ``model.noise``); a setting replaces the user's only when it beats
   them: the fastest that does, or of those it read faster than by no more than the noise (nor 1 %), the one
   with the most batches in flight; where its workers keep up and mostly wait, at the depth whose buffer covers
   the tail fitted to every production time measured (:mod:`lightning_loadguard.model.tail`) over an epoch, and
   where the deepest depth does not and the workers persist, with up to twice the workers.
5. Probing stops when the probe budget is spent or no window could change the decision.

Plain Python, driven by measurements, so that every choice can be replayed in a unit test.
"""

from __future__ import annotations

import math
from dataclasses import replace

from lightning_loadguard.meters.settings import LoaderSettings
from lightning_loadguard.meters.window import WindowSnapshot
from lightning_loadguard.model.budget import CORES, HostBudget
from lightning_loadguard.model.capacity import WAIT_OK
from lightning_loadguard.tuning.arms import Arm, Arms, beats, gain, roomiest, winnable
from lightning_loadguard.tuning.decision import CandidateResult, TuneDecision, start_names, verdict_of
from lightning_loadguard.tuning.depth import epoch_tail, tail_deepened, tail_widened
from lightning_loadguard.tuning.options import TuneOptions, longest_probe
from lightning_loadguard.tuning.persistence import WorkerStarts
from lightning_loadguard.tuning.search import Proposal, Search

PROBE_BUDGET = "probe_budget"

MAX_WINDOWS = 3
"""Windows an arm is measured at most: a third halves the noise of one; more buy little for their steps."""

RULES = frozenset(
    {
        "recheck",  # a loop that hardly waited is measured again, up to MAX_WINDOWS, before it is compute-bound
        "settle",  # a window a later one of the same run beats beyond the noise is set aside as settling
        "cores_bound",  # an arm's rate is at most what the host's cores make at its CPU-seconds a batch
        "epoch_start",  # computing workers past the cores are rated over an epoch, its first batch included
        "start_cost",  # workers that start anew each epoch are rated over an epoch, their measured start included
        "no_batch_again",  # a window in which no batch was made, and not read since its start, is measured again
        "estimate",  # the search starts at the model's estimate (else twice the user's count)
        "replay_scan",  # the estimate is raised to the count whose buffer replay absorbs the bursts
        "cores_first",  # where the estimate passes the cores' prediction, the prediction first
        "unsure",  # a count above the best that read slower within the noise is measured again
        "bisect",  # between the best count and a slower neighbour more than a quarter apart
        "halve",  # half the lowest count where more did not pay from it
        "main_process",  # no workers, where the loop waits longer per batch than a worker takes to make one
        "twice",  # twice a count that did not pay, once, while the loop waits
        "deeper",  # at the best count, the depth the buffer replay asks for
        "contest",  # the leader or the user's settings measured again while they could change the decision
        "roomiest",  # of the winners that read alike (within the noise, nor 1 %), the most batches in flight
        "tail_depth",  # the chosen count's depth deepened to absorb the production times' fitted tail over an epoch
        "tail_workers",  # persistent workers, up to twice the count, where the deepest depth leaves the tail uncovered
    }
)
"""The rules of the procedure, each named so that the sweep can be scored without it
(``benchmarks/tune_ablation.py``; ``tests/test_tuning_rules.py`` holds the rules the sweep cannot judge and why)."""


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
        retune: ``original`` is the setting an earlier decision chose, not the user's (the notes say so).
        pinning_helps: an accelerator exists that pinned host memory speeds transfers to.
        main_process: whether loading in the main process (``num_workers=0``) may be probed.

    Example:
        An I/O-bound loader with 1 worker making a batch in 40 ms, and a 10 ms step:

        >>> p = Planner(LoaderSettings(1, 2), HostBudget(7), TuneOptions(), epoch_steps=400)
        >>> p.record(WindowSnapshot(wait_s=(0.03,) * 12, step_s=(0.01,) * 12, production_s=(0.04,) * 12,
        ...                         batches_made=12)).label
        'workers=5 prefetch=2'
    """

    rules: frozenset[str] = RULES
    """The rules this planner follows (:data:`RULES`; a subclass with fewer scores a rule's worth)."""

    def __init__(
        self,
        original: LoaderSettings,
        budget: HostBudget,
        options: TuneOptions,
        epoch_steps: int,
        *,
        pinning_helps: bool = False,
        span_epochs: int = 1,
        retune: bool = False,
        main_process: bool = True,
    ) -> None:
        if span_epochs < 1:
            raise ValueError(f"span_epochs must be >= 1, got {span_epochs!r}")
        self.original = original
        self.options = options
        self._search = Search(
            budget, options, self.rules, self._tried, pinning_helps=pinning_helps, main_process=main_process
        )
        self.epoch_steps = epoch_steps
        self.pinning_helps = pinning_helps
        self.span_epochs = span_epochs
        self.budget_steps = math.floor(options.probe_share * epoch_steps * span_epochs)
        # Sized for one epoch's budget: a window never spans an epoch's end, and more epochs buy more windows.
        self.window_steps = options.window_for(math.floor(options.probe_share * epoch_steps))
        self.window = options.warmup_steps + self.window_steps
        self.current = original
        self.retune = retune
        self.current_note = self._start
        self.results: list[CandidateResult] = []
        self._starts = WorkerStarts(options, epoch_steps)
        self.arms = Arms(
            settle="settle" in self.rules,
            cores_bound="cores_bound" in self.rules,
            epoch_steps=epoch_steps if {"epoch_start", "start_cost"} & self.rules else None,
            first_batch="epoch_start" in self.rules,
            start_cost=self._starts.paid_each_epoch if "start_cost" in self.rules else None,
        )
        self.probe_steps = 0
        self.probe_time_s = 0.0
        self._spent_s = 0.0  # the time the window being recorded took, its switch and warm-up included
        self.continuing = False
        """Whether :attr:`current` is the setting just measured, measured again without a restart."""
        # The setting whose workers run: measured again, it needs no restart.
        self._running: LoaderSettings | None = original
        self._ran_out = False
        self.chosen: Arm | None = None
        """The arm the latest decision rests on (its depth may be deeper: :func:`~.depth.tail_deepened`)."""

    @property
    def budget(self) -> HostBudget:
        """The host budget of one training process (the session renews it with each window's facts)."""
        return self._search.budget

    @budget.setter
    def budget(self, budget: HostBudget) -> None:
        self._search.budget = budget

    @property
    def measurements(self) -> dict[LoaderSettings, WindowSnapshot]:
        """Every setting measured and its windows, joined (the settling ones set aside)."""
        return {s: a.window for s, a in self.arms.items()}

    # -- schedule --------------------------------------------------------------------------------------

    @property
    def _start(self) -> str:
        """What the notes call :attr:`original`."""
        return start_names(self.retune)[0]

    def can_start(self) -> bool:
        """Whether the epochs spanned leave room to measure the user's setting and at least one candidate: a
        window within one epoch, the user's and a candidate's within the span, the candidate's within the
        probe budget."""
        return (
            longest_probe(self.options, self.window_steps) <= self.budget_steps
            and self.window <= self.epoch_steps
            and 2 * self.window <= self.epoch_steps * self.span_epochs
        )

    def warmup_for(self, setting: LoaderSettings, *, continuing: bool | None = None) -> int:
        """Steps discarded before a window of ``setting``: ``warmup_steps`` where it runs already (measured
        again), else its batches in flight where more (the first fill is made while the workers start, at the
        fit's start as at a restart), at most ``warmup_steps`` plus half a window."""
        running = (self.continuing and setting == self.current) if continuing is None else continuing
        if running:
            return self.options.warmup_steps
        fill = max(self.options.warmup_steps, setting.batches_in_flight)
        return min(fill, longest_probe(self.options, self.window_steps) - self.window_steps)

    def steps_for(self, setting: LoaderSettings, *, continuing: bool | None = None) -> int:
        """Steps one measurement of ``setting`` takes: its warm-up and the window."""
        return self.warmup_for(setting, continuing=continuing) + self.window_steps

    def note_budget_spent(self) -> None:
        """The epochs the probing may span are over: what was measured is all there is to decide on."""
        self._ran_out = True

    def after_epoch_end(self, ran: int = 0) -> LoaderSettings | None:
        """An epoch's end dropped the open window of :attr:`current` (its steps spent), and ``ran`` steps of the next
        epoch ran under it: the setting to measure from there, :attr:`current` where its measurement (those steps
        its warm-up) still fits the probe budget (your settings cost none), else the next the procedure asks for
        that fits (your settings measured again, where they could change the decision); ``None``: decide on what
        was measured."""
        self.continuing, self._running = False, None  # the next epoch starts its iterator afresh
        if self.current == self.original or self.spent_steps() + self.steps_for(self.current) <= self.budget_steps:
            return self.current
        self.probe_steps += ran
        proposal = self._next()
        if proposal is None:
            self.note_budget_spent()
            return None
        self.current, self.current_note = proposal.setting, proposal.note
        return proposal.setting

    def record(
        self,
        window: WindowSnapshot,
        failed: str | None = None,
        *,
        startup_s: float | None = None,
        span_s: float | None = None,
    ) -> LoaderSettings | None:
        """Store the window of :attr:`current` (``failed``: why the setting failed, if it did; ``startup_s``: what
        starting its workers cost, where it was seen; ``span_s``: the time from the switch to it, or from the
        previous window's end where it ran on, to this window's end, its restart and warm-up included, else the
        window's own); return the next setting to measure (``None``: decide now)."""
        setting = self.current
        self._spent_s = window.loop_s if span_s is None else span_s
        note = self.current_note
        self._running = setting
        if not failed:
            self._starts.record(setting, window, startup_s, self._restart_cost(window, startup_s, span_s))
        if (
            not failed
            and window.steps
            and not window.measured_a_rate
            and "no_batch_again" in self.rules
            and self._measure_again(setting, window)
        ):
            return setting
        if not failed:
            note += self.arms.join(setting, window, continuing=self.continuing)
            note += self.arms[setting].rating  # the decision reads the arm's rate, not this row's reading
        blank = not failed and not window.measured_a_rate
        if blank:
            note += "; its window made no batch (served from batches made before it)"
        self.results.append(
            CandidateResult(
                setting=setting,
                rate=None if failed or blank else window.sustained_rate,
                producer_rate=None if failed else _producer_rate(setting, window),
                steps=self.steps_for(setting),
                failed=failed,
                note=note,
            )
        )
        if setting != self.original:
            self.probe_steps += self.steps_for(setting)
            self.probe_time_s += self._spent_s
        if failed and setting == self.original:
            return None  # the user's own setting failing is the user's error to see, not ours to tune around
        proposal = self._next()
        if proposal is None:
            return None
        again = proposal.setting == setting and not failed
        self.continuing = again
        self.current, self.current_note = proposal.setting, proposal.note
        return proposal.setting

    def _restart_cost(self, window: WindowSnapshot, startup_s: float | None, span_s: float | None) -> float | None:
        """What restarting :attr:`current`'s workers cost the loop, where a restart was seen (``startup_s``): the
        probe's span less its warm-up's and window's steps at the window's pace, less the first batch, which
        workers that persist make at each epoch's start too (their start, and their settling in the warm-up); at
        least ``startup_s``, the start alone."""
        if startup_s is None or span_s is None or not window.steps or self.continuing:
            return startup_s
        warm = self.warmup_for(self.current, continuing=False)
        paced = window.loop_s * (1 + warm / window.steps)
        return max(startup_s, span_s - paced - (window.mean_production_s or 0.0))

    def _measure_again(self, setting: LoaderSettings, window: WindowSnapshot) -> bool:
        """Set ``window`` aside, as a window still settling, where the budget holds another of ``setting`` (its
        steps are spent all the same); else it is judged on what it showed, as any window."""
        spent = self.steps_for(setting) if setting != self.original else 0
        self.probe_steps += spent
        if not self._affordable(setting):
            self.probe_steps -= spent  # counted with the window, in :meth:`record`
            return False
        self.probe_time_s += self._spent_s if spent else 0.0
        self.arms.restart()
        self.continuing = True
        self.current_note = self.current_note.split("; ")[0] + "; its first window made no batch"
        return True

    # -- what next -------------------------------------------------------------------------------------

    def _next(self) -> Proposal | None:
        user = self.arms.get(self.original)
        if user is None:
            return None
        if winnable(user) < WAIT_OK and len(self.arms) == 1:
            # One window in which the loop hardly waited may have missed the bursts; the user's settings cost no
            # probe steps, so they are measured again before the loop is called compute-bound.
            if user.windows < MAX_WINDOWS and self._affordable(self.original) and "recheck" in self.rules:
                return Proposal(self.original, f"{self._start} measured again: the loop hardly waited")
            return None  # the loop runs at its compute rate: nothing to win
        search = self._search.next(self.arms)
        if search is not None:
            if self._affordable(search.setting):
                return search
            self._ran_out = True
        if "contest" not in self.rules:
            return None
        contest = self._contest()
        if contest is not None and not self._affordable(contest.setting):
            contest = self._contest(users_only=True)  # the user's settings cost no probe steps
        return contest if contest is not None and self._affordable(contest.setting) else None

    def _affordable(self, setting: LoaderSettings) -> bool:
        """Within the probe budget (the user's settings cost none) and the steps the span has left."""
        again = setting == self._running
        steps = self.steps_for(setting, continuing=again)
        if sum(r.steps for r in self.results) + steps > self.epoch_steps * self.span_epochs:
            return False
        return setting == self.original or self.spent_steps() + steps <= self.budget_steps

    def spent_steps(self) -> float:
        """What probing has spent of :attr:`budget_steps`: its steps (a probe that runs slower than yours, its
        workers' start or a fill on busy cores, takes more time than its steps; ``benchmarks/probe_time.py``
        measures how much, and what charging that time would cost the choice)."""
        return float(self.probe_steps)

    def leader(self) -> Arm:
        """The fastest arm measured."""
        return max(self.arms.values(), key=lambda a: a.rate)

    def _contest(self, *, users_only: bool = False) -> Proposal | None:
        """The window that could still change the decision: between the user's settings and the leader of the
        others, where the leader's gain, give or take the noise, reaches ``min_gain`` and is not yet beyond the
        noise (or would replace the user's settings measured only once): the one of the two with fewer windows
        (the user's on a tie: they cost no probe steps), each at most ``MAX_WINDOWS``."""
        user = self.arms[self.original]
        others = [a for a in self.arms.values() if a.setting != self.original]
        if not others:
            return None
        rival = max(others, key=lambda a: a.rate)
        g, noise = gain(rival, user)
        if g + noise < self.options.min_gain:
            return None  # the user's settings stay whatever more windows say
        if beats(rival, user, self.options.min_gain) and user.windows > 1 and rival.windows > 1:
            return None  # decided: the rival replaces them
        if users_only and user.windows > 1:
            return None
        arms = [user] if users_only else sorted((user, rival), key=lambda a: (a.windows, a is not user))
        for arm in arms:
            if arm.windows < MAX_WINDOWS:
                note = f"measured again: {g:.0%} between the two, noise {noise:.0%}"
                return Proposal(arm.setting, (f"{self._start} " if arm is user else "") + note)
        return None

    def arm_of(self, setting: LoaderSettings) -> Arm | None:
        """The arm a decision for ``setting`` rests on, to watch it by: the arm of the same loader, else :attr:`chosen`
        where ``setting`` only adds batches in flight to it (the depth or the persistent workers the tail asked
        for, :mod:`~lightning_loadguard.tuning.depth`); ``None`` where no such arm measured a rate."""
        arm = next((a for a in self.arms.values() if a.setting.same_loader(setting)), self.chosen)
        if arm is None or arm.rate <= 0:
            return None
        measured = arm.setting
        if setting.num_workers < measured.num_workers or setting.prefetch < measured.prefetch:
            return None
        return arm

    def _tried(self, setting: LoaderSettings) -> bool:
        return any(r.setting == setting for r in self.results)

    # -- decision --------------------------------------------------------------------------------------

    def decide(self, *, map_style: bool = True) -> TuneDecision:
        """The setting to keep: the fastest that beats the user's settings (:func:`beats` by ``min_gain``), or of
        those it read faster than by no more than the noise (nor 1 %) the one with the most batches in flight
        (:func:`~lightning_loadguard.tuning.arms.roomiest`), else the user's; at the depth the production times'
        tail asks for (:mod:`~lightning_loadguard.tuning.depth`); with persistent workers where starting that
        setting's own workers was seen to cost ``persistent_min_share`` of an epoch (``map_style``: the dataset
        is map-style); persistent, with the workers the tail asks for where the deepest depth falls short."""
        user = self.arms.get(self.original)
        if user is None:
            unmeasured = TuneDecision.of(
                self.original,
                verdict="not_tuned",
                reason="the user's setting could not be measured",
                original=self.original,
                candidates=tuple(self.results),
                probe_steps=self.probe_steps,
                probe_budget_steps=self.budget_steps,
            )
            return self._starts.persistent_only(unmeasured, self.original, self._start, map_style)
        others = [a for a in self.arms.values() if a.setting != self.original]
        winners = [a for a in others if beats(a, user, self.options.min_gain)]
        fastest = max(winners, key=lambda a: a.rate) if winners else user
        chosen = roomiest(fastest, winners) if "roomiest" in self.rules else fastest
        before, after = user.rate, chosen.rate
        setting, deepened, widened, persisted = chosen.setting, "", "", ""
        tail = epoch_tail(chosen, self.arms.values()) if "tail_depth" in self.rules else None
        if tail is not None:
            setting, deepened = tail_deepened(tail, setting, self.budget, self.options, after)
        self.chosen = chosen
        persistent = setting.persistent_workers
        if not persistent and self._starts.persistent(chosen.setting, after, map_style):
            persistent = True
            if chosen is user:
                persisted = "; persistent_workers turned on: " + self._starts.against_steps(chosen.setting, after)
        if persistent and tail is not None and "tail_workers" in self.rules:
            setting, widened = tail_widened(tail, setting, self.budget, after)
        verdict, reason, deficit = verdict_of(
            user, chosen, fastest, self.options.min_gain, retune=self.retune, for_tail=bool(deepened or widened)
        )
        bounded_by = self._bounded_by(chosen.setting) if deficit > 0 else None
        if bounded_by:
            reason += f" (bounded by {bounded_by})"
        reason += deepened + persisted + widened
        cost = max(0.0, self.probe_time_s - self.probe_steps / after) if after > 0 else self.probe_time_s
        return TuneDecision.of(
            replace(setting, persistent_workers=persistent),
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

    def _bounded_by(self, chosen: LoaderSettings) -> str | None:
        """The limit that stopped the search short of the compute rate: a wall it was clamped by, else the
        probe budget where that ran out."""
        budget = self.budget
        if budget.max_in_flight is not None and chosen.batches_in_flight >= budget.max_in_flight:
            return budget.memory_bound
        if self._search.clamped is not None:
            return self._search.clamped
        if self._ran_out:
            return PROBE_BUDGET
        if budget.workers_bound == CORES and chosen.num_workers >= budget.max_workers:
            return CORES
        return None


def _producer_rate(setting: LoaderSettings, m: WindowSnapshot) -> float | None:
    if m.mean_production_s is None or m.mean_production_s <= 0:
        return None
    return max(1, setting.num_workers) / m.mean_production_s
