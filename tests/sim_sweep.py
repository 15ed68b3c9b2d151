"""Generated pipelines for the simulator, and the tuner's score on them against the simulator's ground truth.

:func:`generate` draws a pipeline of one of :data:`FAMILIES` from a seed: cores 1 to 64, 0 to several competing
processes, a shared host's background load and drift, epochs of 30 to 5,000 steps, the user's settings drawn
from what people set. :func:`score` tunes it (:func:`sim_pipeline.tune`) and compares the rate of the chosen
setting over an epoch as training runs it (:func:`sim_pipeline.epoch_rate`: each epoch's start and fill, then the
steady state) with the best of a grid and with the user's own settings.
"""

from __future__ import annotations

import math
import multiprocessing
import random
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from functools import partial
from statistics import fmean, quantiles
from typing import TypeVar

from sim_pipeline import Cost, Host, PlannerFactory, SimPipeline, epoch_rate, steady_rate, tune

from lightning_loadguard.meters.settings import LoaderSettings
from lightning_loadguard.meters.window import HostFacts
from lightning_loadguard.model.budget import host_budget
from lightning_loadguard.tuning.decision import CandidateResult
from lightning_loadguard.tuning.options import TuneOptions
from lightning_loadguard.tuning.planner import Planner

FAMILIES = ("io_bound", "cpu_bound", "compute_bound", "cpu_contended", "bursty", "handover_bound")

CORES = (1, 2, 2, 4, 4, 8, 8, 16, 32, 64)
"""Cores drawn from (small hosts are where the budget binds, so they are drawn more)."""

FULL = "(none)"
"""The name :func:`planner_without` takes for the planner that follows every rule."""

BELOW_USER = 0.03
"""A choice runs below the user's settings beyond noise when its rate is this much lower: the ground
truth's own spread (a 600-step run with stochastic costs and a background load) is about 1 %."""


_R = TypeVar("_R")


def map_seeds(run: Callable[[int], _R], seeds: Iterable[int], jobs: int) -> list[_R]:
    """``run`` on every seed, in ``jobs`` forked processes where more than one (the sweeps are plain Python, each
    seed's result its own: the same whatever the process)."""
    if jobs > 1:
        with multiprocessing.get_context("fork").Pool(jobs) as pool:
            return pool.map(run, seeds, chunksize=4)
    return [run(seed) for seed in seeds]


def planner_without(rule: str) -> type[Planner]:
    """A planner following every rule of :data:`~lightning_loadguard.tuning.planner.RULES` but ``rule``
    (:data:`FULL`: every rule)."""
    if rule == FULL:
        return Planner
    if rule not in Planner.rules:
        raise ValueError(f"rule must be one of {sorted(Planner.rules)}, got {rule!r}")
    return type(f"PlannerWithout_{rule}", (Planner,), {"rules": Planner.rules - {rule}})


def _log_uniform(rng: random.Random, low: float, high: float) -> float:
    return math.exp(rng.uniform(math.log(low), math.log(high)))


def _cost(rng: random.Random, mean: float) -> Cost:
    kind = rng.choice(("constant", "lognormal", "lognormal"))
    return Cost(mean, kind, spread=rng.uniform(0.1, 0.6) if kind == "lognormal" else 0.0)


def generate(seed: int) -> SimPipeline:
    """The pipeline of ``seed``: family ``FAMILIES[seed % 6]``, the rest drawn from ``seed``."""
    rng = random.Random(seed)
    family = FAMILIES[seed % len(FAMILIES)]
    cores = rng.choice(CORES)
    others = 0.0
    if family == "cpu_contended" or rng.random() < 0.2:
        others = float(rng.choice((1, 1, 2, 3, 4))) * max(1, cores // 4)
    host = Host(
        cores=cores,
        others=others,
        background=rng.uniform(0.0, 0.25) * cores,
        background_interval_s=rng.uniform(0.05, 0.5),
        drift=rng.uniform(0.0, 0.1),
        drift_period_s=rng.uniform(10.0, 60.0),
    )
    step = _log_uniform(rng, 0.003, 0.05)
    device, step_cpu, threads = step, rng.uniform(0.0003, 0.002), 1.0
    cpu_step = family == "cpu_contended" or (family == "compute_bound" and rng.random() < 0.5)
    if cpu_step:
        threads = float(min(cores, rng.choice((1, 2, 4, 8, 16, 32, 64))))
        device, step_cpu = 0.0, step * threads
    # Workers the pipeline needs to keep up (about one to three per core, at most 40), then the costs that need them.
    need = _log_uniform(rng, 0.5, max(1.5, min(40.0, 3.0 * cores)))
    io = Cost()
    cpu = _cost(rng, rng.uniform(0.0002, 0.002))
    handover = rng.uniform(0.0001, 0.0006)
    if family == "io_bound":
        io = _cost(rng, need * step)
    elif family in ("cpu_bound", "cpu_contended"):
        cpu = _cost(rng, need * step * rng.uniform(0.6, 1.0))
        io = _cost(rng, need * step * rng.uniform(0.0, 0.4))
    elif family == "compute_bound":
        io = _cost(rng, step * rng.uniform(0.05, 0.5))
    elif family == "bursty":
        base = need * step * rng.uniform(0.3, 0.7)
        if rng.random() < 0.5:
            share = rng.uniform(0.03, 0.2)
            io = Cost(base, "bursty", spread=need * step * rng.uniform(1.0, 4.0), burst=share)
        else:
            io = Cost(need * step, "pareto", spread=rng.uniform(2.0, 3.5))  # a finite variance
    elif family == "handover_bound":
        handover = rng.uniform(0.6, 1.2) * step
        io = _cost(rng, step * rng.uniform(0.5, 3.0))
    user = rng.choice(
        (
            LoaderSettings(0),
            LoaderSettings(0),
            LoaderSettings(1, 2),
            LoaderSettings(2, 2),
            LoaderSettings(4, 2),
            LoaderSettings(max(1, cores - 1), 2),
            LoaderSettings(8, 4),
        )
    )
    batch_bytes = ram = shm = None
    if rng.random() < 0.2:
        # Memory that holds a few batches in flight: a wall the tuner must not cross.
        batch_bytes = 10_000_000
        ram = int(2 * batch_bytes * rng.uniform(3, 24))
        shm = ram
    return SimPipeline(
        name=f"{family}-{seed}",
        family=family,
        host=host,
        io=io,
        cpu=cpu,
        step_cpu_s=step_cpu,
        step_threads=threads,
        device_s=device,
        handover_s=handover,
        settle=rng.uniform(0.0, 0.15),
        settle_s=rng.uniform(0.3, 1.5),
        user=user,
        epoch_steps=int(_log_uniform(rng, 30, 5000)),
        batch_bytes=batch_bytes,
        ram_bytes=ram,
        shm_bytes=shm,
    )


@dataclass(frozen=True)
class Score:
    """One pipeline tuned: the rates of the chosen, the user's and the best setting (ground truth)."""

    pipeline: SimPipeline
    chosen: LoaderSettings
    best: LoaderSettings
    chosen_rate: float
    user_rate: float
    best_rate: float
    probe_steps: int
    budget_steps: int
    verdict: str
    measured_best_rate: float | None = None
    """The best rate among the settings the planner measured (each with persistent workers and without), where
    asked for: what a choice that ranked its measurements by the truth would reach."""

    @property
    def ratio(self) -> float:
        return self.chosen_rate / self.best_rate

    @property
    def search_ratio(self) -> float | None:
        """The best measured setting's rate over the best: what the search left unvisited."""
        return None if self.measured_best_rate is None else self.measured_best_rate / self.best_rate

    @property
    def choice_ratio(self) -> float | None:
        """The chosen setting's rate over the best measured one: what ranking the windows lost."""
        return None if self.measured_best_rate is None else self.chosen_rate / self.measured_best_rate

    @property
    def below_user(self) -> bool:
        return self.chosen_rate < self.user_rate * (1 - BELOW_USER)

    @property
    def over_budget(self) -> bool:
        return self.probe_steps > self.budget_steps


@dataclass
class _Truth:
    """Each setting's rate, simulated once and kept: over an epoch as training runs it (:func:`epoch_rate`:
    the epoch's start and fill included, so ``persistent_workers`` counts), or with ``per_epoch=False`` in
    the steady state inside one endless epoch (:func:`steady_rate`)."""

    pipeline: SimPipeline
    steps: int = 600
    seeds: int = 1  # runs averaged per setting: a heavy-tailed cost needs several for a steady rate within 10 %
    per_epoch: bool = True
    rates: dict[LoaderSettings, float] = field(default_factory=dict)
    steady: dict[LoaderSettings, float] = field(default_factory=dict)

    def __call__(self, settings: LoaderSettings) -> float:
        w = settings.num_workers
        key = LoaderSettings(w, settings.prefetch if w else None, bool(w and settings.persistent_workers))
        if not self.per_epoch:
            return self._steady(replace(key, persistent_workers=False))
        if key not in self.rates:
            steady = partial(self._steady, replace(key, persistent_workers=False))
            runs = (
                epoch_rate(self.pipeline, key, steps=self.steps, seed=k, steady=steady)
                for k in range(1, self.seeds + 1)
            )
            self.rates[key] = fmean(runs)
        return self.rates[key]

    def _steady(self, key: LoaderSettings) -> float:
        if key not in self.steady:
            runs = (steady_rate(self.pipeline, key, steps=self.steps, seed=k) for k in range(1, self.seeds + 1))
            self.steady[key] = fmean(runs)
        return self.steady[key]


def _allowed(p: SimPipeline, settings: LoaderSettings) -> bool:
    """Whether the tuner may choose ``settings``: within the memory walls and the user's cap."""
    host = HostFacts(p.host.cores, available_ram_bytes=p.ram_bytes, shm_free_bytes=p.shm_bytes)
    budget = host_budget(host, p.batch_bytes, max_workers=p.max_workers)
    if budget.max_in_flight is not None and settings.batches_in_flight > budget.max_in_flight:
        return False
    return p.max_workers is None or settings.num_workers <= p.max_workers


def grid_best(p: SimPipeline, truth: _Truth) -> LoaderSettings:
    """The best setting of a grid: every worker count of a ladder (up to four per core, and 128) at depth 2
    (or the deepest memory allows), then depths 1, 2, 4 and 8 at the three best counts; where the truth runs
    epochs, each with persistent workers and without."""
    ladder = [0, 1, 2, 3, 4, 5, 6, 8, 10, 12, 16, 20, 24, 32, 48, 64, 96, 128]
    top = min(128, 4 * p.host.cores + 4)
    counts = [w for w in ladder if w <= top]
    kept = (False, True) if truth.per_epoch else (False,)
    rated: dict[LoaderSettings, float] = {}
    for w in counts:
        for depth in (2, 1) if w else (None,):
            s = LoaderSettings(w, depth)
            if _allowed(p, s):
                for persistent in kept if w else (False,):
                    variant = replace(s, persistent_workers=persistent)
                    rated[variant] = truth(variant)
                break
    best_counts = sorted(rated, key=rated.__getitem__, reverse=True)[:3]
    for s in best_counts:
        if s.num_workers == 0:
            continue
        for depth in (1, 2, 4, 8):
            d = replace(s, prefetch_factor=depth)
            if _allowed(p, d):
                rated[d] = truth(d)
    return max(rated, key=rated.__getitem__)


DRAW_STRIDE = 100_000
"""Tune seeds of one pipeline's noise draws are its seed plus multiples of this (past every pipeline seed drawn)."""


def draw_seeds(seed: int, draws: int) -> list[int]:
    """The tune seeds of ``draws`` noise draws of pipeline ``seed``: the first is ``seed`` itself."""
    return [seed + k * DRAW_STRIDE for k in range(draws)]


def score(
    p: SimPipeline,
    *,
    seed: int = 0,
    planner: PlannerFactory = Planner,
    truth_steps: int = 600,
    truth_seeds: int = 1,
    per_epoch: bool = True,
    measured: bool = False,
) -> Score:
    """Tune ``p`` on the simulator and score the choice against the ground truth (rates over ``truth_steps``
    steps, the mean of ``truth_seeds`` runs; per epoch, or with ``per_epoch=False`` in the steady state);
    ``measured``: also rate every setting the planner measured (:attr:`Score.measured_best_rate`)."""
    return score_draws(
        p,
        [seed],
        planner=planner,
        truth_steps=truth_steps,
        truth_seeds=truth_seeds,
        per_epoch=per_epoch,
        measured=measured,
    )[0]


def score_draws(
    p: SimPipeline,
    seeds: Iterable[int],
    *,
    planner: PlannerFactory = Planner,
    truth_steps: int = 600,
    truth_seeds: int = 1,
    per_epoch: bool = True,
    measured: bool = False,
) -> list[Score]:
    """:func:`score` for each tune seed of ``seeds`` (the run's noise drawn anew: background load, drift,
    costs), on one ground truth."""
    truth = _Truth(p, truth_steps, truth_seeds, per_epoch)
    return [_scored(p, truth, planner, seed, measured=measured) for seed in seeds]


def score_planners(
    p: SimPipeline,
    planners: Mapping[str, PlannerFactory],
    *,
    seed: int = 0,
    truth_steps: int = 600,
    truth_seeds: int = 1,
    per_epoch: bool = True,
    measured: bool = False,
    persistent: bool = True,
) -> dict[str, Score]:
    """:func:`score` for each of ``planners`` on one ground truth (each setting's rate simulated once);
    ``persistent``: ``TuneOptions.tune_persistent_workers``."""
    truth = _Truth(p, truth_steps, truth_seeds, per_epoch)
    return {
        name: _scored(p, truth, planner, seed, measured=measured, persistent=persistent)
        for name, planner in planners.items()
    }


def _scored(
    p: SimPipeline, truth: _Truth, planner: PlannerFactory, seed: int, *, measured: bool, persistent: bool = True
) -> Score:
    options = TuneOptions(max_workers=p.max_workers, tune_persistent_workers=persistent)
    tuned = tune(p, options, seed=seed, planner=planner)
    d = tuned.decision
    tried = _measured_settings(d.candidates if d else (), p.user) if measured else []
    # The grid need not hold the user's settings nor the chosen ones: the best is the fastest of the three.
    best = max((grid_best(p, truth), p.user, tuned.chosen, *tried), key=truth)
    return Score(
        pipeline=p,
        chosen=tuned.chosen,
        best=best,
        chosen_rate=truth(tuned.chosen),
        user_rate=truth(p.user),
        best_rate=truth(best),
        probe_steps=d.probe_steps if d else 0,
        budget_steps=d.probe_budget_steps if d else 0,
        verdict=d.verdict if d else "not_tuned",
        measured_best_rate=max(map(truth, tried)) if tried else None,
    )


def _measured_settings(candidates: Iterable[CandidateResult], user: LoaderSettings) -> list[LoaderSettings]:
    """The settings measured (the user's at least), each with persistent workers and without: persistence is
    decided after probing, so a ranking by the truth would choose it too."""
    tried = {c.setting for c in candidates if not c.failed} | {user}
    return sorted(
        {replace(s, persistent_workers=k) for s in tried for k in ((False, True) if s.num_workers else (False,))},
        key=lambda s: s.label,
    )


def summary(scores: Iterable[Score]) -> dict[str, dict[str, float]]:
    """By family and over all: count, share at >= 0.95 of the best, 1st percentile and worst of tuned / best,
    share below the user's settings beyond noise, share over the probe budget, probe steps over budget."""
    scores = list(scores)
    groups: dict[str, list[Score]] = {"all": scores}
    for s in scores:
        groups.setdefault(s.pipeline.family, []).append(s)
    out = {}
    for name, group in groups.items():
        ratios = sorted(s.ratio for s in group)
        p1 = quantiles(ratios, n=100, method="inclusive")[0] if len(ratios) > 1 else ratios[0]
        spent = [s.probe_steps / s.budget_steps for s in group if s.budget_steps]
        out[name] = {
            "n": len(group),
            "at_95": sum(r >= 0.95 for r in ratios) / len(group),
            "p1": p1,
            "worst": ratios[0],
            "median": ratios[len(ratios) // 2],
            "below_user": sum(s.below_user for s in group) / len(group),
            "over_budget": sum(s.over_budget for s in group) / len(group),
            "probe_share_of_budget": sum(spent) / len(spent) if spent else 0.0,
        }
        searched = [(s.search_ratio, s.choice_ratio) for s in group if s.search_ratio is not None]
        if searched:
            out[name]["search_at_95"] = sum(r >= 0.95 for r, _ in searched) / len(searched)
            out[name]["choice_at_95"] = sum(c is not None and c >= 0.95 for _, c in searched) / len(searched)
    return out


def table(figures: dict[str, dict[str, float]]) -> str:
    """``summary``'s figures as a Markdown table."""
    rows = [
        "| family | pipelines | tuned >= 0.95 x best | 1st percentile | worst | median | below yours | over budget "
        "| probe steps / budget |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    order = ["all", *FAMILIES]
    for name in [n for n in order if n in figures]:
        f = figures[name]
        rows.append(
            f"| {name} | {f['n']:.0f} | {f['at_95']:.1%} | {f['p1']:.3f} | {f['worst']:.3f} | {f['median']:.3f} "
            f"| {f['below_user']:.1%} | {f['over_budget']:.1%} | {f['probe_share_of_budget']:.2f} |"
        )
    return "\n".join(rows)


def search_table(figures: dict[str, dict[str, float]]) -> str:
    """Where the loss is, from ``summary``'s figures of scores made with ``measured=True``: the share of pipelines
    whose best measured setting is within 0.95 of the best (the search's reach) and whose choice is within 0.95 of
    the best measured (the ranking's)."""
    rows = [
        "| family | tuned >= 0.95 x best | best measured >= 0.95 x best | tuned >= 0.95 x best measured |",
        "|---|---|---|---|",
    ]
    for name in [n for n in ("all", *FAMILIES) if n in figures and "search_at_95" in figures[n]]:
        f = figures[name]
        rows.append(f"| {name} | {f['at_95']:.1%} | {f['search_at_95']:.1%} | {f['choice_at_95']:.1%} |")
    return "\n".join(rows)
