"""Step 2 of the tuner's procedure: the worker count to measure next, and the depth at the search's best count.

The search reads the arms as measured (it only chooses what to measure; the decision alone asks for a win beyond
the noise): no workers where the loop waits longer per batch than a worker takes to make one (the hand-over); else
from the model's estimate (Little's law on the measured production time, raised to the count the buffer
replay of the bursts asks for), doubled while the last count up read ``min_gain`` faster than the one before, once
more at a count above the best that read slower only within the noise, between the best count and a slower one,
down by half where more did not pay, and once to twice a count that did not pay; at the search's best count, the
depth the buffer replay asks for, then pinned memory where an accelerator gains from it. Memory and the user's cap
clamp every setting (:attr:`Search.clamped` names the wall that last did); the cores' prediction is where the search
starts, not where it stops. Plain Python.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace

from lightning_loadguard.meters.settings import LoaderSettings
from lightning_loadguard.model.budget import CORES, HostBudget
from lightning_loadguard.model.capacity import WAIT_OK, recommend_prefetch, replayed_wait, workers_needed
from lightning_loadguard.tuning.arms import Arm, faster, profile, winnable, within_noise
from lightning_loadguard.tuning.options import TuneOptions

MAX_SEARCH_WORKERS = 256
"""The most workers the search proposes where no cap or wall says fewer (Little's law on a slow producer and a
fast step can ask for thousands)."""

MAX_REPLAYS = 48
"""Worker counts the search replays at most, per window, to find the one that absorbs the bursts."""


@dataclass
class Proposal:
    """A setting to measure next, and why (the note the decision's candidates keep)."""

    setting: LoaderSettings
    note: str


class Search:
    """The search over worker counts and depths (see the module's docstring), one proposal at a time.

    Args:
        budget: the host budget of one training process (its walls clamp every proposal).
        options: ``min_gain`` (what counts as paying) and ``max_prefetch``.
        rules: the planner's rules (:data:`~lightning_loadguard.tuning.planner.RULES`) the search follows.
        tried: whether a setting was measured already (nothing is proposed twice).
        pinning_helps: an accelerator exists that pinned host memory speeds transfers to.
        main_process: whether loading in the main process (``num_workers=0``) may be proposed.
    """

    def __init__(
        self,
        budget: HostBudget,
        options: TuneOptions,
        rules: frozenset[str],
        tried: Callable[[LoaderSettings], bool],
        *,
        pinning_helps: bool = False,
        main_process: bool = True,
    ) -> None:
        self.budget = budget
        self.options = options
        self.rules = rules
        self._tried = tried
        self.pinning_helps = pinning_helps
        self.main_process = main_process
        self.clamped: str | None = None
        """The wall (``max_workers`` or the memory bound) that last clamped a proposal, if any did."""

    def next(self, arms: Mapping[LoaderSettings, Arm]) -> Proposal | None:
        """The next worker count of the search, then the depth the replay asks for at its best count, then pinned
        memory where it may pay; ``None`` where the search has nothing new to measure."""
        best = max(arms.values(), key=lambda a: a.rate)
        counts: dict[int, Arm] = {}
        for arm in arms.values():
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
        paid = faster(best, counts[max(below)], self.options.min_gain) if below else winnable(best) >= WAIT_OK
        # Where the loop waits longer for each batch than a worker takes to make one, the wait is the hand-over of
        # made batches, which no count of workers shortens: loading in the main process has none.
        production = best.window.mean_production_s
        if "main_process" in self.rules and b > 0 and production and best.window.mean_wait_s > production:
            proposal = self._at(best.setting, 0, "the search: in the main process, the hand-over costing more")
            if proposal is not None:
                return proposal
        if not above and paid:
            target = max(2 * b, 1, self._estimate(best, arms) if "estimate" in self.rules else 0)
            proposal = self._at(best.setting, target, "the search: up from the best count")
            if proposal is not None:
                return proposal
        # A count above the best that measured slower once, but not beyond the noise, is measured again before the
        # search turns away from it, where the loop still waits.
        unsure = [w for w in above if counts[w].windows < 2 and within_noise(best, counts[w])]
        if unsure and winnable(best) >= WAIT_OK and "unsure" in self.rules:
            return Proposal(counts[min(unsure)].setting, "the search: measured again, slower within the noise")
        # Between the best and a slower neighbour, while they are more than a quarter apart (a worker or two among
        # many changes the rate by less than the windows can tell).
        bisect = "bisect" in self.rules
        if bisect and above and min(above) - b > max(1, b // 4):
            return self._at(best.setting, (b + min(above)) // 2, "the search: between the best and a slower count")
        if bisect and below and b - max(below) > max(1, b // 4) and not paid:
            return self._at(best.setting, (b + max(below)) // 2, "the search: between the best and a slower count")
        low = min(counts)
        if 0 < low < max(counts) and not faster(best, counts[low], self.options.min_gain) and "halve" in self.rules:
            # More did not pay from the lowest count measured (the best may be any of them, by less than min_gain):
            # half as many (the hand-over, or the cores the workers take from the step, may cost more than they make).
            return self._at(best.setting, low // 2, "the search: fewer workers, since more did not pay")
        if len(above) == 1 and winnable(best) >= WAIT_OK and "twice" in self.rules:
            # Once, where the loop still waits: twice the count that did not pay. Beside other processes or a
            # step's threads, twice as many workers may win a share of the cores that one more did not.
            far = self._at(best.setting, 2 * above[0], "the search: twice a count that did not pay")
            if far is not None:
                return far
        return (self._deeper(best) if "deeper" in self.rules else None) or self._pinning(best.setting)

    def _estimate(self, arm: Arm, arms: Mapping[LoaderSettings, Arm]) -> int:
        """Little's law on the arm's measured production time at the fastest step measured; where it exceeds
        the cores' prediction, the prediction (the search goes on past it only where the measurements say)."""
        production = arm.window.mean_production_s
        steps = [a.window.mean_step_s for a in arms.values() if a.window.mean_step_s > 0]
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
        production_profile, step_profile = profile(arm.window.production_s), profile(arm.window.step_s)
        for more in range(wanted, min(4 * wanted, self._ceiling(), wanted + MAX_REPLAYS - 1) + 1):
            if replayed_wait(production_profile, step_profile, more, arm.setting.prefetch) < WAIT_OK:
                return more
        return wanted

    def cap(self) -> int | None:
        """The wall on the worker count: the user's cap past a predicted core limit, else the budget's."""
        return self.budget.user_max_workers if self.budget.workers_bound == CORES else self.budget.max_workers

    def _ceiling(self) -> int:
        """The most workers any proposal may name: :meth:`_cap`, else :data:`MAX_SEARCH_WORKERS`."""
        cap = self.cap()
        return max(1, min(MAX_SEARCH_WORKERS, cap if cap is not None else MAX_SEARCH_WORKERS))

    def _at(self, base: LoaderSettings, workers: int, note: str) -> Proposal | None:
        """``base`` with ``workers``, clamped by the walls (memory, the user's cap); ``None`` where the clamp
        leaves nothing new."""
        cap = self.cap()
        if cap is not None and workers > cap:
            workers, self.clamped = cap, "max_workers"
        if workers < 1:
            setting = replace(base, num_workers=0, prefetch_factor=None, pin_memory=False)
            return None if self._tried(setting) or not self.main_process else Proposal(setting, note)
        deepest = self.budget.deepest_prefetch(workers, self.options.max_prefetch, pin_memory=base.pin_memory)
        while workers >= 1 and deepest < 1:
            workers -= 1
            self.clamped = self.budget.memory_bound
            deepest = self.budget.deepest_prefetch(workers, self.options.max_prefetch, pin_memory=base.pin_memory)
        if workers < 1:
            return None
        prefetch = min(base.prefetch, deepest)
        if prefetch < base.prefetch:
            self.clamped = self.budget.memory_bound
        setting = replace(base, num_workers=workers, prefetch_factor=prefetch)
        return None if self._tried(setting) else Proposal(setting, note)

    def _deeper(self, best: Arm) -> Proposal | None:
        """The depth the buffer replay asks for at the best count, where deeper than measured and memory holds
        it: the bursts a depth absorbs, where the producer keeps up on average."""
        setting, w = best.setting, best.window
        if setting.num_workers < 1 or winnable(best) < WAIT_OK or not w.production_s or not w.step_s:
            return None
        advice = recommend_prefetch(
            profile(w.production_s),
            profile(w.step_s),
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
            self.clamped = self.budget.memory_bound
        proposal = replace(setting, prefetch_factor=depth)
        if depth <= setting.prefetch or self._tried(proposal):
            return None
        return Proposal(proposal, "deeper buffer for bursts (replay)")

    def _pinning(self, setting: LoaderSettings) -> Proposal | None:
        if not self.pinning_helps or setting.pin_memory or setting.num_workers < 1:
            return None
        proposal = replace(setting, pin_memory=True)
        return None if self._tried(proposal) else Proposal(proposal, "pinned memory for faster transfers")
