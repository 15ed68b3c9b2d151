"""The tuner's plan: which setting to measure next, when to stop, and what to keep.

One procedure (docs/tuning.md states it in five sentences):

1. Every setting measured is an *arm*: its windows, joined, give a sustained rate (where a window drew the
   buffer down, the workers' capacity: :attr:`WindowSnapshot.sustained_rate`) and a standard error (from
   the spread of their blocks' rates); one settling rule holds for every arm, the user's included: a window a
   later one of the same run beats beyond the noise had not settled after the restart, and is set aside.
2. The worker count moves by one search, on the rates as measured: from the model's estimate (Little's law on
   the measured production time, raised to the count the buffer replay of the bursts asks for), doubled while
   the last count up read ``min_gain`` faster than the one before, once more at a count above the best that read
   slower only within the noise, between the best count and a slower one, down by half where more did not pay,
   and once to twice a count that did not pay; at the search's best count, the depth the buffer replay asks for.
   Memory and the user's cap clamp every setting; the cores' prediction is where the search starts, not where it
   stops.
3. When the search has nothing new to measure, the next window goes to whichever arm could still change the
   decision (the leader, or the user's settings, which cost no probe steps, whichever has fewer windows).
4. One comparison decides: a setting beats another when it is faster by ``min_gain`` and by more than the noise
   (two standard errors of the difference, ``model.noise``); a setting replaces the user's only when it beats
   them: the fastest that does, or of those it read faster than by no more than the noise (nor 1 %), the one
   with the most batches in flight; where its workers keep up and mostly wait, at the depth whose buffer covers
   the tail fitted to every production time measured (:mod:`lightning_loadguard.model.tail`) over an epoch.
5. Probing stops when the probe budget is spent or no window could change the decision.

Plain Python, driven by measurements, so that every choice can be replayed in a unit test.
"""

from __future__ import annotations

import math
import operator
from dataclasses import dataclass, replace
from typing import Protocol

from lightning_loadguard.meters.settings import LoaderSettings
from lightning_loadguard.meters.window import WindowSnapshot
from lightning_loadguard.model.budget import CORES, HostBudget
from lightning_loadguard.model.capacity import WAIT_OK, has_deficit, recommend_prefetch, replayed_wait, workers_needed
from lightning_loadguard.model.noise import BLOCK_STEPS, RESOLUTION, block_rates, comparison_noise, relative_error
from lightning_loadguard.model.tail import Tail, fit_tail, tail_depth, tail_wait
from lightning_loadguard.tuning.decision import CandidateResult, TuneDecision
from lightning_loadguard.tuning.options import TuneOptions, longest_probe

PROBE_BUDGET = "probe_budget"

PROFILE_LENGTH = 32
"""Per-batch production and step times (the latest, in order) replayed through the buffer model."""

MAX_SEARCH_WORKERS = 256
"""The most workers the search proposes where no cap or wall says fewer (Little's law on a slow producer and a
fast step can ask for thousands)."""

MAX_REPLAYS = 48
"""Worker counts the search replays at most, per window, to find the one that absorbs the bursts."""

MAX_WINDOWS = 3
"""Windows an arm is measured at most: a third halves the noise of one; more buy little for their steps."""

TAIL_CPU_SHARE = 0.5
"""The tail's depth is for workers that mostly wait (on reads) while busy: below this share of a core. Workers that
compute would, with more batches in flight, all compute at once at an epoch's start and take the cores from the
batches the loop needs first (benchmarks/RESULTS.md, "What changed": the sweep without this gate)."""

RULES = frozenset(
    {
        "recheck",  # a loop that hardly waited is measured again, up to MAX_WINDOWS, before it is compute-bound
        "settle",  # a window a later one of the same run beats beyond the noise is set aside as settling
        "no_batch_again",  # a window in which no batch was made, and not read since its start, is measured again
        "estimate",  # the search starts at the model's estimate (else twice the user's count)
        "replay_scan",  # the estimate is raised to the count whose buffer replay absorbs the bursts
        "cores_first",  # where the estimate passes the cores' prediction, the prediction first
        "unsure",  # a count above the best that read slower within the noise is measured again
        "bisect",  # between the best count and a slower neighbour more than a quarter apart
        "halve",  # half the lowest count where more did not pay from it
        "twice",  # twice a count that did not pay, once, while the loop waits
        "deeper",  # at the best count, the depth the buffer replay asks for
        "contest",  # the leader or the user's settings measured again while they could change the decision
        "roomiest",  # of the winners that read alike (within the noise, nor 1 %), the most batches in flight
        "tail_depth",  # the chosen count's depth deepened to absorb the production times' fitted tail over an epoch
    }
)
"""The rules of the procedure, each named so that the sweep can be scored without it
(``benchmarks/tune_ablation.py``; ``tests/test_tuning_rules.py`` holds the rules the sweep cannot judge and why)."""


@dataclass(frozen=True)
class Arm:
    """A setting and its measurement: the windows since its last restart that settled, joined.

    Example:
        >>> w = WindowSnapshot(wait_s=(0.0,) * 8, step_s=(0.1, 0.1, 0.1, 0.1, 0.125, 0.125, 0.125, 0.125))
        >>> arm = Arm(LoaderSettings(2, 2), w, 1)
        >>> round(arm.rate, 2), round(arm.error, 3)
        (8.89, 0.111)
    """

    setting: LoaderSettings
    window: WindowSnapshot
    windows: int

    @property
    def rate(self) -> float:
        return self.window.sustained_rate

    @property
    def error(self) -> float:
        """Relative standard error of :attr:`rate`, read as :mod:`lightning_loadguard.model.noise` reads it (from
        blocks of half the steps where fewer than two blocks fit); infinite where the window measured no rate
        (:attr:`WindowSnapshot.measured_a_rate`) or fewer than two blocks had one: nothing says how far to trust
        it."""
        w = self.window
        loop = list(map(operator.add, w.wait_s, w.step_s))
        rates = block_rates(loop, max(1, min(BLOCK_STEPS, len(loop) // 2)))
        if len(rates) < 2 or not w.measured_a_rate:
            return math.inf
        return relative_error(rates)


class Measured(Protocol):
    """A measured rate and its relative standard error (an :class:`Arm`, or figures kept from one)."""

    @property
    def rate(self) -> float: ...

    @property
    def error(self) -> float: ...


def gain(a: Measured, b: Measured) -> tuple[float, float]:
    """How much faster ``a`` measured than ``b`` (relative), and the noise of that difference
    (:func:`~lightning_loadguard.model.noise.comparison_noise`); infinite noise where ``b`` measured no rate.

    Example:
        >>> steady = WindowSnapshot(wait_s=(0.0,) * 8, step_s=(0.1,) * 8)
        >>> faster = WindowSnapshot(wait_s=(0.0,) * 8, step_s=(0.08,) * 8)
        >>> [round(x, 3) for x in gain(Arm(LoaderSettings(2), faster, 1), Arm(LoaderSettings(), steady, 1))]
        [0.25, 0.0]
    """
    if b.rate <= 0:
        return 0.0, math.inf
    return a.rate / b.rate - 1, comparison_noise(a.error, b.error)


def beats(a: Measured, b: Measured, margin: float) -> bool:
    """The one comparison: ``a`` faster than ``b`` by ``margin`` and by more than the noise."""
    g, noise = gain(a, b)
    return g >= margin and g > noise


def _faster(a: Measured, b: Measured, margin: float) -> bool:
    """``a`` measured faster than ``b`` by ``margin``, whatever the noise (the search's reading, not a decision's)."""
    return gain(a, b)[0] >= margin


def _within_noise(a: Measured, b: Measured) -> bool:
    """Whether ``b`` measured slower than ``a`` by less than the noise."""
    g, noise = gain(a, b)
    return g < noise


@dataclass
class _Proposal:
    setting: LoaderSettings
    note: str


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
        self.retune = retune
        self.current_note = self._start
        self.results: list[CandidateResult] = []
        self.arms: dict[LoaderSettings, Arm] = {}
        self.probe_steps = 0
        self.probe_time_s = 0.0
        self.continuing = False
        """Whether :attr:`current` is the setting just measured, measured again without a restart."""
        self._since_restart: Arm | None = None  # the current setting's windows since its last restart
        self._before_restart: dict[LoaderSettings, Arm] = {}
        self._ran_out = False
        self._clamped: str | None = None
        self._startups: dict[LoaderSettings, float] = {}
        self._loop_s: dict[LoaderSettings, tuple[int, float]] = {}  # steps and loop time of every window, rated or not
        self.chosen: Arm | None = None
        """The arm the latest decision rests on (its depth may be deeper: :meth:`_tail`)."""

    @property
    def measurements(self) -> dict[LoaderSettings, WindowSnapshot]:
        """Every setting measured and its windows, joined (the settling ones set aside)."""
        return {s: a.window for s, a in self.arms.items()}

    # -- schedule --------------------------------------------------------------------------------------

    @property
    def _start(self) -> str:
        """What the notes call :attr:`original`."""
        return "the earlier choice" if self.retune else "your settings"

    @property
    def _start_kept(self) -> str:
        return "the earlier choice is kept" if self.retune else "your settings are kept"

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

    def record(
        self, window: WindowSnapshot, failed: str | None = None, *, startup_s: float | None = None
    ) -> LoaderSettings | None:
        """Store the window of :attr:`current` (``failed``: why the setting failed, if it did; ``startup_s``: what
        starting its workers cost, where it was seen); return the next setting to measure (``None``: decide now)."""
        setting = self.current
        note = self.current_note
        if startup_s is not None and not failed:
            self._startups[setting] = startup_s
        if not failed and window.steps:
            steps, loop_s = self._loop_s.get(setting, (0, 0.0))
            self._loop_s[setting] = (steps + window.steps, loop_s + window.loop_s)
        if (
            not failed
            and window.steps
            and not window.measured_a_rate
            and "no_batch_again" in self.rules
            and self._measure_again(setting, window)
        ):
            return setting
        if not failed:
            note += self._measured(setting, window)
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
            self.probe_time_s += window.loop_s
        if failed and setting == self.original:
            return None  # the user's own setting failing is the user's error to see, not ours to tune around
        proposal = self._next()
        if proposal is None:
            return None
        again = proposal.setting == setting and not failed
        self.continuing = again
        self.current, self.current_note = proposal.setting, proposal.note
        return proposal.setting

    def _measure_again(self, setting: LoaderSettings, window: WindowSnapshot) -> bool:
        """Set ``window`` aside, as a window still settling, where the budget holds another of ``setting`` (its
        steps are spent all the same); else it is judged on what it showed, as any window."""
        spent = self.steps_for(setting) if setting != self.original else 0
        self.probe_steps += spent
        if not self._affordable(setting):
            self.probe_steps -= spent  # counted with the window, in :meth:`record`
            return False
        self.probe_time_s += window.loop_s if spent else 0.0
        self._since_restart = None
        self.continuing = True
        self.current_note = self.current_note.split("; ")[0] + "; its first window made no batch"
        return True

    def _measured(self, setting: LoaderSettings, window: WindowSnapshot) -> str:
        """Join ``window`` to the setting's arm; a note where earlier windows were set aside as settling."""
        note = ""
        run = self._since_restart if self.continuing and self._since_restart is not None else None
        if run is None:
            self._before_restart[setting] = self.arms.get(setting)  # type: ignore[assignment]
            run = Arm(setting, window, 1)
        else:
            latest = Arm(setting, window, 1)
            if "settle" in self.rules and beats(latest, run, 0.0):
                g, noise = gain(latest, run)
                note = (
                    f"; {g:.0%} faster than before, beyond the noise ({noise:.0%}): the windows before, still "
                    "settling after the restart, set aside"
                )
                run = latest
            else:
                run = Arm(setting, run.window.joined(window), run.windows + 1)
        self._since_restart = run
        before = self._before_restart.get(setting)
        self.arms[setting] = (
            run if before is None else Arm(setting, before.window.joined(run.window), before.windows + run.windows)
        )
        return note

    # -- what next -------------------------------------------------------------------------------------

    def _next(self) -> _Proposal | None:
        user = self.arms.get(self.original)
        if user is None:
            return None
        if _winnable(user) < WAIT_OK and len(self.arms) == 1:
            # One window in which the loop hardly waited may have missed the bursts; the user's settings cost no
            # probe steps, so they are measured again before the loop is called compute-bound.
            if user.windows < MAX_WINDOWS and self._affordable(self.original) and "recheck" in self.rules:
                return _Proposal(self.original, f"{self._start} measured again: the loop hardly waited")
            return None  # the loop runs at its compute rate: nothing to win
        search = self._search()
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
        again = setting == self.current
        steps = self.steps_for(setting, continuing=again)
        if sum(r.steps for r in self.results) + steps > self.epoch_steps * self.span_epochs:
            return False
        return setting == self.original or self.probe_steps + steps <= self.budget_steps

    def leader(self) -> Arm:
        """The fastest arm measured."""
        return max(self.arms.values(), key=lambda a: a.rate)

    def _search(self) -> _Proposal | None:
        """The next worker count of the search, then the depth the replay asks for at its best count."""
        best = self.leader()
        counts: dict[int, Arm] = {}
        for arm in self.arms.values():
            w = arm.setting.num_workers
            if w not in counts or arm.rate > counts[w].rate:
                counts[w] = arm
        best = counts[best.setting.num_workers]
        b = best.setting.num_workers
        above = [w for w in counts if w > b]
        below = [w for w in counts if w < b]
        # Up, while the last count up paid (read ``min_gain`` faster: where workers share the cores with the step,
        # more of them may win more of the cores, which no wait shows); from the user's settings where the loop
        # waits. From the model's estimate, at least twice as many. The search reads the rates as measured: it only
        # chooses what to measure next, and the decision alone asks for a win beyond the noise.
        paid = _faster(best, counts[max(below)], self.options.min_gain) if below else _winnable(best) >= WAIT_OK
        if not above and paid:
            target = max(2 * b, 1, self._estimate(best) if "estimate" in self.rules else 0)
            proposal = self._at(best.setting, target, "the search: up from the best count")
            if proposal is not None:
                return proposal
        # A count above the best that measured slower once, but not beyond the noise, is measured again before the
        # search turns away from it, where the loop still waits.
        unsure = [w for w in above if counts[w].windows < 2 and _within_noise(best, counts[w])]
        if unsure and _winnable(best) >= WAIT_OK and "unsure" in self.rules:
            return _Proposal(counts[min(unsure)].setting, "the search: measured again, slower within the noise")
        # Between the best and a slower neighbour, while they are more than a quarter apart (a worker or two among
        # many changes the rate by less than the windows can tell).
        bisect = "bisect" in self.rules
        if bisect and above and min(above) - b > max(1, b // 4):
            return self._at(best.setting, (b + min(above)) // 2, "the search: between the best and a slower count")
        if bisect and below and b - max(below) > max(1, b // 4) and not paid:
            return self._at(best.setting, (b + max(below)) // 2, "the search: between the best and a slower count")
        low = min(counts)
        if 0 < low < max(counts) and not _faster(best, counts[low], self.options.min_gain) and "halve" in self.rules:
            # More did not pay from the lowest count measured (the best may be any of them, by less than min_gain):
            # half as many (the hand-over, or the cores the workers take from the step, may cost more than they make).
            return self._at(best.setting, low // 2, "the search: fewer workers, since more did not pay")
        if len(above) == 1 and _winnable(best) >= WAIT_OK and "twice" in self.rules:
            # Once, where the loop still waits: twice the count that did not pay. Beside other processes or a
            # step's threads, twice as many workers may win a share of the cores that one more did not.
            far = self._at(best.setting, 2 * above[0], "the search: twice a count that did not pay")
            if far is not None:
                return far
        return (self._deeper(best) if "deeper" in self.rules else None) or self._pinning(best.setting)

    def _estimate(self, arm: Arm) -> int:
        """Little's law on the arm's measured production time at the fastest step measured; where it exceeds
        the cores' prediction, the prediction (the search goes on past it only where the measurements say)."""
        production = arm.window.mean_production_s
        steps = [a.window.mean_step_s for a in self.arms.values() if a.window.mean_step_s > 0]
        if production is None or not steps:
            return 2 * max(1, arm.setting.num_workers)
        wanted = min(workers_needed(production, 1.0 / min(steps)), self._ceiling())
        if (
            "cores_first" in self.rules
            and self.budget.workers_bound == CORES
            and wanted > self.budget.max_workers >= arm.setting.num_workers + 1
        ):
            return self.budget.max_workers
        # The mean hides bursts: the fewest workers from Little's law's count whose replayed wait is negligible (a
        # scan, not a bisection: a periodic burst can fall on the same workers at one count and not at the next),
        # over at most MAX_REPLAYS counts, so that a window's cost stays bounded however far Little's law points.
        if "replay_scan" not in self.rules:
            return wanted
        production_profile, step_profile = _profile(arm.window.production_s), _profile(arm.window.step_s)
        for more in range(wanted, min(4 * wanted, self._ceiling(), wanted + MAX_REPLAYS - 1) + 1):
            if replayed_wait(production_profile, step_profile, more, arm.setting.prefetch) < WAIT_OK:
                return more
        return wanted

    def _cap(self) -> int | None:
        """The wall on the worker count: the user's cap past a predicted core limit, else the budget's."""
        return self.budget.user_max_workers if self.budget.workers_bound == CORES else self.budget.max_workers

    def _ceiling(self) -> int:
        """The most workers any proposal may name: :meth:`_cap`, else :data:`MAX_SEARCH_WORKERS`."""
        cap = self._cap()
        return max(1, min(MAX_SEARCH_WORKERS, cap if cap is not None else MAX_SEARCH_WORKERS))

    def _at(self, base: LoaderSettings, workers: int, note: str) -> _Proposal | None:
        """``base`` with ``workers``, clamped by the walls (memory, the user's cap); ``None`` where the clamp
        leaves nothing new."""
        cap = self._cap()
        if cap is not None and workers > cap:
            workers, self._clamped = cap, "max_workers"
        if workers < 1:
            setting = replace(base, num_workers=0, prefetch_factor=None, pin_memory=False)
            return None if self._tried(setting) else _Proposal(setting, note)
        deepest = self.budget.deepest_prefetch(workers, self.options.max_prefetch, pin_memory=base.pin_memory)
        while workers >= 1 and deepest < 1:
            workers -= 1
            self._clamped = self.budget.memory_bound
            deepest = self.budget.deepest_prefetch(workers, self.options.max_prefetch, pin_memory=base.pin_memory)
        if workers < 1:
            return None
        prefetch = min(base.prefetch, deepest)
        if prefetch < base.prefetch:
            self._clamped = self.budget.memory_bound
        setting = replace(base, num_workers=workers, prefetch_factor=prefetch)
        return None if self._tried(setting) else _Proposal(setting, note)

    def _deeper(self, best: Arm) -> _Proposal | None:
        """The depth the buffer replay asks for at the best count, where deeper than measured and memory holds
        it: the bursts a depth absorbs, where the producer keeps up on average."""
        setting, w = best.setting, best.window
        if setting.num_workers < 1 or _winnable(best) < WAIT_OK or not w.production_s or not w.step_s:
            return None
        advice = recommend_prefetch(
            _profile(w.production_s),
            _profile(w.step_s),
            num_workers=setting.num_workers,
            deep_prefetch=self.options.max_prefetch,
        )
        if advice is None or advice.prefetch_factor <= setting.prefetch:
            return None
        deepest = self.budget.deepest_prefetch(
            setting.num_workers, self.options.max_prefetch, pin_memory=setting.pin_memory
        )
        depth = min(advice.prefetch_factor, deepest)
        if depth < advice.prefetch_factor:
            self._clamped = self.budget.memory_bound
        proposal = replace(setting, prefetch_factor=depth)
        if depth <= setting.prefetch or self._tried(proposal):
            return None
        return _Proposal(proposal, "deeper buffer for bursts (replay)")

    def _pinning(self, setting: LoaderSettings) -> _Proposal | None:
        if not self.pinning_helps or setting.pin_memory or setting.num_workers < 1:
            return None
        proposal = replace(setting, pin_memory=True)
        return None if self._tried(proposal) else _Proposal(proposal, "pinned memory for faster transfers")

    def _contest(self, *, users_only: bool = False) -> _Proposal | None:
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
                return _Proposal(arm.setting, (f"{self._start} " if arm is user else "") + note)
        return None

    def _tried(self, setting: LoaderSettings) -> bool:
        return any(r.setting == setting for r in self.results)

    # -- decision --------------------------------------------------------------------------------------

    def decide(self, *, map_style: bool = True) -> TuneDecision:
        """The setting to keep: the fastest that beats the user's settings (:func:`beats` by ``min_gain``), or of
        those it read faster than by no more than the noise (nor 1 %) the one with the most batches in flight
        (:meth:`_roomiest`), else the user's; with persistent workers where starting that setting's own workers
        was seen to cost ``persistent_min_share`` of an epoch (``map_style``: the dataset is map-style)."""
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
            return self._persistent_only(unmeasured, map_style)
        others = [a for a in self.arms.values() if a.setting != self.original]
        winners = [a for a in others if beats(a, user, self.options.min_gain)]
        fastest = max(winners, key=lambda a: a.rate) if winners else user
        chosen = self._roomiest(fastest, winners)
        before, after = user.rate, chosen.rate
        deficit = _winnable(chosen)
        deficit = 0.0 if deficit < WAIT_OK else deficit
        bounded_by = self._bounded_by(chosen.setting) if deficit > 0 else None
        # Without workers the loss is the main process's own loading, which the counts measured did not win back.
        lost = (
            f"loading in the main process still takes {deficit:.0%} of the loop's time"
            if chosen.setting.num_workers == 0
            else f"{deficit:.0%} of the step rate is still lost to data wait"
        )
        if chosen is user:
            if _winnable(user) < WAIT_OK:
                verdict, reason = "compute_bound", "the loop runs at its compute rate; " + self._start_kept
            else:
                verdict = "no_gain"
                reason = (
                    f"no candidate measured at least {self.options.min_gain:.0%} faster, and by more than the "
                    f"noise; {self._start_kept}, and {lost}"
                )
        else:
            verdict = "improved"
            reason = (
                f"{after / before:.2f}x the steps/s of {self._start}" if before > 0 else f"faster than {self._start}"
            )
            if chosen is not fastest:
                g, noise = gain(fastest, chosen)
                reason += (
                    f"; {fastest.setting.label} read {g:.0%} faster, within the noise ({max(noise, RESOLUTION):.0%}): "
                    "of the two, the one with more batches in flight, which absorbs what a window is too short to show"
                )
            if deficit > 0:
                reason += f"; {lost}"
        if bounded_by:
            reason += f" (bounded by {bounded_by})"
        setting = chosen.setting
        tail = self._tail(chosen) if chosen is not user else None
        if tail is not None:
            deepest = self.budget.deepest_prefetch(
                setting.num_workers, self.options.max_prefetch, pin_memory=setting.pin_memory
            )
            depth = (
                tail_depth(tail, num_workers=setting.num_workers, period_s=1.0 / after, deepest=deepest)
                if deepest > setting.prefetch
                else setting.prefetch
            )
            if depth > setting.prefetch:
                waits = [
                    tail_wait(tail, batches_in_flight=setting.num_workers * d, period_s=1.0 / after)
                    for d in (setting.prefetch, depth)
                ]
                reason += (
                    f"; prefetch_factor={depth} (measured at {setting.prefetch}): by the production times' tail "
                    f"(index {tail.index:.1f}), reads longer than the batches in flight cover would leave the loop "
                    f"waiting {waits[0]:.1%} of an epoch ({waits[1]:.1%} at {depth}), which no window is long "
                    "enough to show"
                )
                setting = replace(setting, prefetch_factor=depth)
        self.chosen = chosen
        persistent = setting.persistent_workers
        if not persistent and self._persistent(chosen.setting, after, map_style):
            persistent = True
            if chosen is user:
                startup = self._startups[chosen.setting]
                reason += f"; persistent_workers turned on: {_start_against_steps(startup, self.epoch_steps / after)}"
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

    def _roomiest(self, fastest: Arm, winners: list[Arm]) -> Arm:
        """Of the ``winners`` that ``fastest`` measured faster by no more than the noise (nor than
        :data:`~lightning_loadguard.model.noise.RESOLUTION`), the one with the most batches in flight: the windows
        cannot tell them apart, and over an epoch the larger buffer absorbs what a window is too short to show (a
        loader's rare long batches, its slow workers' rounds)."""
        if "roomiest" not in self.rules:
            return fastest

        def alike(arm: Arm) -> bool:
            g, noise = gain(fastest, arm)
            return g <= max(noise, RESOLUTION)

        def room(arm: Arm) -> tuple[int, bool, float]:
            # The workers' buffer (a pinned copy is no room), then unpinned: pinning is kept only where it paid.
            s = arm.setting
            return s.num_workers * s.prefetch, not s.pin_memory, arm.rate

        return max(filter(alike, winners), key=room, default=fastest)

    def _tail(self, chosen: Arm) -> Tail | None:
        """The tail of every production time measured with workers (a window holds a few dozen; the tail needs all
        of them), where the chosen setting's workers keep up in its window and mostly wait while busy
        (:data:`TAIL_CPU_SHARE`): the buffer it sizes absorbs variation, never a deficit."""
        s, w = chosen.setting, chosen.window
        share = w.cpu_share
        if (
            "tail_depth" not in self.rules
            or s.num_workers < 1
            or chosen.rate <= 0
            or share is None
            or share >= TAIL_CPU_SHARE
            or not (w.production_s and w.step_s)
            or has_deficit(w.production_s, w.step_s, s.num_workers)
        ):
            return None
        return fit_tail([t for a in self.arms.values() if a.setting.num_workers for t in a.window.production_s])

    def _persistent_only(self, unmeasured: TuneDecision, map_style: bool) -> TuneDecision:
        """No rate of the user's setting (its windows made no batch, as where its workers outnumber an epoch's
        steps): persistent workers all the same where their own start costs ``persistent_min_share`` of an epoch
        at the loop's pace in those windows. Workers that stay save each epoch's start and keep every epoch's samples
        and order (draws inside them go on across epochs, as the session says)."""
        steps, loop_s = self._loop_s.get(self.original, (0, 0.0))
        if not (steps and loop_s > 0 and not self.original.persistent_workers):
            return unmeasured
        pace = steps / loop_s
        if not self._persistent(self.original, pace, map_style):
            return unmeasured
        return unmeasured.with_setting(
            replace(self.original, persistent_workers=True),
            verdict="model_only",
            reason=(
                f"no window of {self._start} made a batch, so no rate was compared; persistent_workers turned on: "
                + _start_against_steps(self._startups[self.original], self.epoch_steps / pace)
            ),
        )

    def _bounded_by(self, chosen: LoaderSettings) -> str | None:
        """The limit that stopped the search short of the compute rate: a wall it was clamped by, else the
        probe budget where that ran out."""
        budget = self.budget
        if budget.max_in_flight is not None and chosen.batches_in_flight >= budget.max_in_flight:
            return budget.memory_bound
        if self._clamped is not None:
            return self._clamped
        if self._ran_out:
            return PROBE_BUDGET
        if budget.workers_bound == CORES and chosen.num_workers >= budget.max_workers:
            return CORES
        return None

    def _persistent(self, chosen: LoaderSettings, rate: float, map_style: bool) -> bool:
        """Keep workers across epochs when starting them costs a measurable share of an epoch."""
        if not (self.options.tune_persistent_workers and map_style and chosen.num_workers > 0):
            return False
        startup_s = self._startups.get(chosen)
        if startup_s is None or rate <= 0:
            return False
        return startup_s >= self.options.persistent_min_share * self.epoch_steps / rate


def _start_against_steps(startup_s: float, steps_s: float) -> str:
    return f"starting the workers takes {startup_s:.2f} s at each epoch's start, its steps {steps_s:.1f} s"


def _profile(values: tuple[float, ...]) -> tuple[float, ...]:
    return values[-PROFILE_LENGTH:]


def _producer_rate(setting: LoaderSettings, m: WindowSnapshot) -> float | None:
    if m.mean_production_s is None or m.mean_production_s <= 0:
        return None
    return max(1, setting.num_workers) / m.mean_production_s


def _winnable(arm: Arm) -> float:
    """Share of the loop's time a faster loader could win back.

    The measured wait, less the part the loop's thread waited for a core (sampled: no loader setting wins
    that back); without workers at most the production time, which is all workers could hide. A buffer
    draining inside the window shows as a sustained rate below the loop's: that share counts too.
    """
    m = arm.window
    wait = m.wait_fraction * (1.0 - m.core_wait_share())
    if arm.setting.num_workers == 0 and m.mean_production_s is not None:
        production = m.mean_production_s
        wait = min(wait, production / (production + m.mean_step_s)) if production > 0 else 0.0
    draining = 1.0 - m.sustained_rate / m.throughput if m.throughput > 0 else 0.0
    return max(wait, draining)


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
    return kept.with_setting(
        replace(original, prefetch_factor=wanted),
        throughput_after=None,
        bounded_by=budget.memory_bound if wanted < advice.prefetch_factor else None,
        reason=reason + f"; prefetch_factor {current} -> {wanted} (buffer replay), from the next epoch",
    )
