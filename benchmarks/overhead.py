"""LoadGuard's cost on a fast pipeline, for ``num_workers`` 0, 1 and 2: with it against without it, and its
own time per step by where it runs.

    python benchmarks/overhead.py [--rounds 8] [--steps 400] [--workers 0 1 2] [--paired-steps 2000]

The pipeline: a step that spins for 2 ms, samples that cost nothing beyond making the tensors. Goal: without
/ with >= 0.99.

The verdict is the first table. Each fit switches LoadGuard on or off at random for every step
(:class:`_Alternate`): the steps of one fit share the machine's drift, which moves whole fits by several
percent from one to the next on a shared machine. It gives LoadGuard's cost on a plain step, the logging
step's extra, their sum over a run, and the ratio of the step period without LoadGuard to the period with
it. It counts what timing LoadGuard's own functions cannot: the caches its code and data take from the
step's, the work Lightning does for it. Beside each such fit runs one with the same draw in which nothing is
switched (LoadGuard on for every step): its plain-step figure is what a cost of 0 reads, the instrument's
own error on this machine, in the same run.

The second table is the plain comparison: each round trains the pipeline once without and once with
``LoadGuard`` (``--steps`` steps), in alternating order, over the wall time and over step periods clipped
at twice their median. On a shared machine its ratios move by more than the 1 % they are meant to show.

The third times LoadGuard's own code directly, in the same kind of run: every hook and profiler call it adds,
the loader probe's own work around each fetch (the fetch itself excluded), the producer meter around each
batch inside each worker (with ``num_workers=0`` the profiler proxy's fetch timing times the making, and its
row holds that; the producer meter's row only the fetches before it took over), the logging steps and the
per-epoch iterator set-up, per step (see ``_OwnTime`` for how contention is kept out of the figures): where
the time goes. Lightning's dispatch of LoadGuard's hooks is not in it, and each call is timed at its median:
the sum is below the first table's cost.
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
import warnings
import weakref
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from lightning.pytorch import Callback
from torch.utils.data import get_worker_info

from lightning_loadguard import LoadGuard
from lightning_loadguard.report import render_table
from lightning_loadguard.synthetic import TimedDataset, TimedModule, _busy, timed_loader

# The pipelines with known timings and their expected figures live beside the tests.
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from call_timing import adding_to, summed, timed
from pipelines import quiet_trainer

sys.path.insert(0, str(Path(__file__).resolve().parent))
from workloads import Stopwatch

STEP_S = 0.002
_MAX_WORKERS = 16
_WORKER_RING = 4096


class _FixedStep(TimedModule):
    """A step of fixed length, so that anything a callback adds shows up in the throughput."""

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        _busy(STEP_S, spin=True)
        return super().training_step(batch, batch_idx)

    def on_train_batch_end(self, outputs: Any, batch: Any, batch_idx: int) -> None:
        pass


def _fit(with_guard: bool, steps: int, workers: int, callbacks: list[Callback] | None = None) -> tuple[float, float]:
    """Steps per second, over the wall time and with clipped periods (see ``workloads.Stopwatch``)."""
    watch = Stopwatch(warmup=min(50, steps // 4))
    extra: list[Callback] = [LoadGuard(print_summary=False)] if with_guard else []
    _train(steps, workers, [watch, *extra, *(callbacks or [])])
    return watch.rate, watch.clipped_rate


def _train(steps: int, workers: int, callbacks: list[Callback]) -> None:
    """The fast pipeline, ``steps`` steps: samples that cost nothing to make, a 2 ms step."""
    loader = timed_loader(
        TimedDataset(steps * 4, sample_s=0.0),
        batch_size=4,
        num_workers=workers,
        prefetch_factor=4 if workers else None,
    )
    quiet_trainer(max_steps=steps, callbacks=callbacks).fit(_FixedStep(record=False), loader)


class _OwnTime:
    """LoadGuard's own time during one fit, by where it runs.

    Per-call regions (a hook, the work around one fetch) last microseconds: each call is timed on the wall
    clock and the figure is the median call times the calls per step, so the rare call during which another
    process held the core does not count. Regions that run rarely and long (a logging step's window and
    diagnosis, an epoch's iterator set-up) are timed in the CPU time of their thread and spread over the steps.
    Worker processes write their per-batch times into a shared-memory table (one row per worker, a single
    writer each), inherited when the workers fork.
    """

    def __init__(self) -> None:
        self.calls: dict[str, list[float]] = {}
        self.cpu: dict[str, float] = {}
        self.workers = torch.zeros(_MAX_WORKERS, _WORKER_RING + 1, dtype=torch.float64).share_memory_()
        self._undo: list[Callable[[], None]] = []

    def add(self, label: str, seconds: float) -> None:
        self.calls.setdefault(label, []).append(seconds)

    def add_cpu(self, label: str, seconds: float) -> None:
        self.cpu[label] = self.cpu.get(label, 0.0) + seconds

    def per_step_us(self, steps: int) -> dict[str, float]:
        figures = {label: statistics.median(times) * len(times) / steps * 1e6 for label, times in self.calls.items()}
        figures.update({label: seconds / steps * 1e6 for label, seconds in self.cpu.items()})
        return figures

    def worker_batch_us(self) -> float:
        times = [t for row in self.workers.tolist() for t in row[1 : 1 + min(int(row[0]), _WORKER_RING)]]
        return statistics.median(times) * 1e6 if times else 0.0

    def patch(self, owner: Any, name: str, value: Any) -> None:
        original = owner.__dict__[name] if isinstance(owner, type) else getattr(owner, name)
        setattr(owner, name, value)
        self._undo.append(lambda: setattr(owner, name, original))

    def restore(self) -> None:
        for undo in reversed(self._undo):
            undo()
        self._undo.clear()

    def time_calls(self, owner: Any, name: str, label: str, cpu: bool = False, less: list[float] | None = None) -> None:
        """Time every call of ``owner.name`` in the main process: the whole call, less the wall time ``less``
        gained meanwhile (a region timed on its own, called from this one)."""
        clock = time.thread_time if cpu else time.perf_counter
        add = self.add_cpu if cpu else self.add
        self.patch(owner, name, timed(getattr(owner, name), clock, lambda seconds: add(label, seconds), less))

    def wall_total(self, owner: Any, name: str) -> list[float]:
        """The wall time of every call of ``owner.name`` so far, added up in the returned cell."""
        counted, total = summed(getattr(owner, name), time.perf_counter)
        self.patch(owner, name, counted)
        return total

    def install(self) -> None:
        from lightning_loadguard import _lightning
        from lightning_loadguard.meters import loader_probe, producer

        publishing = self.wall_total(LoadGuard, "_publish")
        self.time_calls(LoadGuard, "_publish", "logging steps: window, diagnosis, logs", cpu=True)
        # The hooks less the logging step's work, which is its own row.
        for name in ("on_train_batch_start", "on_train_batch_end"):
            self.time_calls(LoadGuard, name, f"LoadGuard.{name}", less=publishing)
        # The whole start/stop: the wrapped profiler's own (PassThroughProfiler: nothing) is included.
        for name in ("start", "stop"):
            self.time_calls(_lightning.FetchTimingProfiler, name, f"profiler proxy {name}() around each fetch")
        self._own_around_fetch(producer)
        self._own_around_next_data(loader_probe)
        self._own_around_iterator(loader_probe)

    def _own_around_fetch(self, producer: Any) -> None:
        """The producer meter's timing of each batch, less the fetch it times."""
        make_timed = producer._timed
        own = self

        def per_batch(seconds: float) -> None:
            worker = get_worker_info()
            if worker is None:
                own.add("producer meter per batch (in-process fetch)", seconds)
                return
            table = own.workers[worker.id % _MAX_WORKERS]
            made = int(table[0])
            if made < _WORKER_RING:
                table[1 + made] = seconds
                table[0] = made + 1

        def measuring(fetch: Callable[..., Any], counters: Any, row: int, *rest: Any) -> Callable[..., Any]:
            fetch_timed, inner = summed(fetch, time.perf_counter)
            return timed(make_timed(fetch_timed, counters, row, *rest), time.perf_counter, per_batch, inner)

        self.patch(producer, "_timed", measuring)

    def _own_around_next_data(self, loader_probe: Any) -> None:
        """The probe's work around each fetch from workers (readiness, buffer level, start-up), less the fetch
        itself (an in-process fetch is made on demand: nothing to peek at)."""
        from torch.utils.data import dataloader

        inner = [0.0]  # the wall time of every fetch, in either kind of iterator
        for cls in (dataloader._SingleProcessDataLoaderIter, dataloader._MultiProcessingDataLoaderIter):
            self.patch(cls, "_next_data", timed(cls._next_data, time.perf_counter, adding_to(inner)))

        observe = loader_probe.LoaderProbe._observe
        own = self

        def around(seconds: float) -> None:
            own.add("loader probe around each fetch", seconds)

        def observing(probe: Any, iterator: Any) -> None:
            observe(probe, iterator)
            iterator._next_data = timed(iterator._next_data, time.perf_counter, around, inner)

        self.patch(loader_probe.LoaderProbe, "_observe", observing)

    def _own_around_iterator(self, loader_probe: Any) -> None:
        """Per epoch: fresh counters, the workers' timing hook, the iterator's instrumentation."""
        make_iterator = loader_probe.LoaderProbe.make_iterator
        own = self

        def setting_up(seconds: float) -> None:
            own.add_cpu("iterator set-up per epoch", seconds)

        def measuring(probe: Any, loader: Any, create: Callable[[], Any]) -> Any:
            timed_create, inner = summed(create, time.thread_time)
            return timed(make_iterator, time.thread_time, setting_up, inner)(probe, loader, timed_create)

        self.patch(loader_probe.LoaderProbe, "make_iterator", measuring)


_HOOKS = ("on_train_batch_start", "on_train_batch_end")
_RUNS = object()  # a hook with no instance attribute over it: Lightning calls the method


class _Switch:
    """One attribute LoadGuard set on an object of the fit (a bound hook, the fetch timing), which can be
    taken off for a step and put back."""

    def __init__(self, owner: Any, name: str) -> None:
        self.owner = weakref.ref(owner)
        self.name = name
        self.value = owner.__dict__[name]

    def set(self, on: bool) -> None:
        owner = self.owner()
        if owner is None:
            return
        if on:
            setattr(owner, self.name, self.value)
        else:
            owner.__dict__.pop(self.name, None)


class _Alternate(Callback):
    """LoadGuard on or off at random for each step of one fit: the step periods of both.

    A fit's speed on a shared machine drifts by several percent from one fit to the next, far more than the
    1 % to be shown; the steps of one fit share that drift. Everything LoadGuard does in the main process on
    a step is switched per step: Lightning's dispatch of its two hooks (set to ``None``, which Lightning
    skips), the trainer's profiler (the proxy or the user's own; the proxy's fetch timing also times the
    making of an in-process batch) and, with workers, the loader probe around each fetch. Its logging steps
    are on. Placed last, this callback's ``on_train_batch_end`` ends each period and sets the next step's
    state; the switching costs
    alike both ways. The steps are drawn at random, not alternated: a fixed pattern would line up with
    anything periodic in the loop (a garbage collection every other step reads as 8 us per step with
    nothing switched). Work in the worker processes (the producer meter there) runs on every batch, ahead
    of the loop, and is not in these figures. The steps LoadGuard is off for are taken out of its figures,
    so that it sees the period of a step as it is and paces its hooks and logging as in a plain fit.
    """

    def __init__(self, guard: LoadGuard, warmup: int, switch: bool = True) -> None:
        self.guard = guard
        self.warmup = warmup
        self.switch = switch
        """``False``: the steps are drawn and labelled alike, but LoadGuard stays on for every one of them; the
        figures then read the instrument's own zero (a cost of 0 measured the same way)."""
        self.periods: list[tuple[float, bool, bool]] = []
        """Per step after the warm-up: its period, whether LoadGuard was on, and whether it logged."""
        self.fetch_timing: _Switch | None = None
        self._on = True
        self._logged = False
        self._last: float | None = None
        self._proxy: Any = None
        self._draw = random.Random(0)
        self.missed = 0
        """Steps that logged where none was expected, or the reverse (none where the cadence is followed)."""
        self._expected = False
        self._hooks: dict[str, Any] = {}
        publish = guard._publish

        def publishing(*args: Any, **kwargs: Any) -> Any:
            self._logged = True
            return publish(*args, **kwargs)

        guard._publish = publishing  # type: ignore[method-assign]

    def on_train_start(self, trainer: Any, pl_module: Any) -> None:
        self._proxy = trainer.profiler

    def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        now = time.perf_counter()
        if self._last is not None and batch_idx > self.warmup:
            self.periods.append((now - self._last, self._on, self._logged))
            self.missed += self._expected != self._logged
        if self._last is not None and self.switch and not self._on:
            # LoadGuard did not see this step's fetch: to it, the step it last saw lasts until its next fetch.
            # Taken out of that, as a validation run would be, it sees its steps' periods as they are, which
            # set how often its hooks run and it logs (HOOKED_INTERVAL_S, LOGGING_SHARE).
            self.guard._monitor.exclude(now - self._last)
        self._logged = False
        # In one epoch LoadGuard's logging step counter is the batch index (LoadGuard._should_log).
        after = batch_idx + 2
        logs = (self.guard._every and after % self.guard._every == 0) or after == self.guard.window
        self._expected = bool(logs)
        self._set(trainer, on=self._expected or self._draw.random() < 0.5)
        self._last = time.perf_counter()

    def on_train_end(self, trainer: Any, pl_module: Any) -> None:
        self._set(trainer, on=True)

    def _set(self, trainer: Any, on: bool) -> None:
        """LoadGuard on or off for the next step. Its own hooks rest on most steps (``HOOKED_EVERY``): their
        state is kept while it is off and given back, so its steps run as they would in a plain fit. Its
        countdown to the next hooked step sees only its own steps: a logging step is made a hooked one."""
        guard = self.guard
        if not self.switch:
            self._on = on
            return
        if on and not self._on:
            for hook, value in self._hooks.items():
                if value is _RUNS:
                    guard.__dict__.pop(hook, None)
                else:
                    setattr(guard, hook, value)
        elif not on and self._on:
            self._hooks = {hook: guard.__dict__.get(hook, _RUNS) for hook in _HOOKS}
            for hook in _HOOKS:
                setattr(guard, hook, None)
        if on and self._expected:
            guard._quiet_fetches = 0
            guard._hooks_on()
        self._on = on
        trainer.profiler = self._proxy if on else self._proxy.inner
        if self.fetch_timing is not None:
            self.fetch_timing.set(on)

    def figures(self) -> dict[str, float]:
        """Microseconds per step: LoadGuard's cost on a plain step, on a logging step beyond that, and over
        a run where it is always on (its logging steps come at the cadence of such a run: all fall on steps
        where it is on, and it sees its steps' periods as they are); and the step period without it.

        Each period is capped at twice the median first (a step during which another process held the core
        lasts several periods); a logging step stays under the cap.
        """
        cap = 2 * statistics.median(p for p, _, _ in self.periods)

        def mean(on: bool, logged: bool) -> float:
            return statistics.fmean(min(p, cap) for p, o, lg in self.periods if o == on and lg == logged)

        off = mean(False, False)
        plain = mean(True, False) - off
        logging = mean(True, True) - mean(True, False)
        logged = sum(lg for _, _, lg in self.periods) / len(self.periods)
        return {
            "off": off * 1e6,
            "plain": plain * 1e6,
            "logging": logging * 1e6,
            "cost": (plain + logging * logged) * 1e6,
            "logging steps": logged,
        }


def _capture_fetch_timing(alternate: _Alternate, own: _OwnTime) -> None:
    """Hands ``alternate`` the attribute that times each fetch from workers, when LoadGuard sets it on the
    epoch's iterator (loader probe). Without workers the loop's fetch timing, switched with the profiler, also
    times the making (see :func:`_fetch_timing_found`)."""
    from lightning_loadguard.meters import loader_probe

    observe = loader_probe.LoaderProbe._observe

    def observing(probe: Any, iterator: Any) -> None:
        observe(probe, iterator)
        alternate.fetch_timing = _Switch(iterator, "_next_data")

    own.patch(loader_probe.LoaderProbe, "_observe", observing)


def _fetch_timing_found(alternate: _Alternate, guard: LoadGuard, workers: int) -> bool:
    """Whether LoadGuard timed the fetches where :class:`_Alternate` switches them: the loader probe's
    attribute, or without workers the profiler proxy alone (the making handed over to it: no timer left inside
    torch's fetcher)."""
    if workers > 0:
        return alternate.fetch_timing is not None
    return bool(guard._monitor._probe._loop_times_fetches)


def _alternated(steps: int, workers: int, switch: bool = True) -> dict[str, float]:
    """LoadGuard's cost per step from one fit with it on and off on random steps (:class:`_Alternate`);
    with ``switch=False``, the same fit and draw with LoadGuard on throughout: the instrument's zero."""
    undo = _OwnTime()
    guard = LoadGuard(print_summary=False)
    alternate = _Alternate(guard, warmup=min(50, steps // 4), switch=switch)
    _capture_fetch_timing(alternate, undo)
    try:
        _train(steps, workers, [guard, alternate])
    finally:
        undo.restore()
    if not _fetch_timing_found(alternate, guard, workers) or alternate.missed:
        raise RuntimeError("LoadGuard's fetch timing or logging steps are not where this benchmark expects them")
    return alternate.figures()


def _own_cost(steps: int, workers: int) -> tuple[dict[str, float], float, float]:
    """Microseconds per step in the main process by place, per batch inside each worker, and the run's mean
    step period (the timers included)."""
    own = _OwnTime()
    own.install()
    try:
        rate, _ = _fit(True, steps, workers)
    finally:
        own.restore()
    return own.per_step_us(steps), own.worker_batch_us(), 1e6 / rate


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--steps", type=int, default=400)
    parser.add_argument("--workers", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--paired-steps", type=int, default=2000, help="steps of each fit with LoadGuard switched")
    args = parser.parse_args()
    warnings.filterwarnings("ignore")
    for workers in args.workers:
        _fit(False, 50, workers)  # warm imports and caches

    rows = []
    fits = max(1, args.rounds // 2)
    for workers in args.workers:
        runs, zeros = [], []
        for _ in range(fits):
            runs.append(_alternated(args.paired_steps, workers))
            zeros.append(_alternated(args.paired_steps, workers, switch=False)["plain"])
        cost = [r["cost"] for r in runs]
        ratio = [r["off"] / (r["off"] + r["cost"]) for r in runs]
        rows.append(
            (
                str(workers),
                f"{statistics.median(r['off'] for r in runs) / 1e3:.2f}",
                f"{statistics.median(r['plain'] for r in runs):.0f}",
                f"{statistics.median(zeros):+.0f} ({min(zeros):+.0f}..{max(zeros):+.0f})",
                f"{statistics.median(r['logging'] for r in runs):.0f}",
                f"{statistics.median(cost):.0f} ({min(cost):.0f}..{max(cost):.0f})",
                f"{statistics.median(ratio):.4f} ({min(ratio):.3f}..{max(ratio):.3f})",
            )
        )
    headers = (
        "workers",
        "step period without (ms)",
        "cost, plain step (us)",
        "nothing switched (us, range)",
        "more, logging step (us)",
        "cost per step (us, range)",
        "ratio without / with (range)",
    )
    title = (
        f"LoadGuard on and off on random steps of one fit: {STEP_S * 1e3:.0f} ms steps, "
        f"{fits} fits of {args.paired_steps} steps each and as many with nothing switched, goal ratio >= 0.99"
    )
    print(render_table(title, rows, headers))

    ratios: dict[tuple[int, str], list[float]] = {(w, kind): [] for w in args.workers for kind in ("wall", "clip")}
    rates: dict[tuple[int, bool], list[float]] = {(w, flag): [] for w in args.workers for flag in (False, True)}
    for round_ in range(args.rounds):
        for workers in args.workers:
            order = (False, True) if (round_ + workers) % 2 == 0 else (True, False)
            got = {flag: _fit(flag, args.steps, workers) for flag in order}
            for flag, (rate, _) in got.items():
                rates[workers, flag].append(rate)
            ratios[workers, "wall"].append(got[True][0] / got[False][0])
            ratios[workers, "clip"].append(got[True][1] / got[False][1])

    rows = []
    for workers in args.workers:
        a, b = statistics.median(rates[workers, False]), statistics.median(rates[workers, True])
        wall, clip = ratios[workers, "wall"], ratios[workers, "clip"]
        rows.append(
            (
                str(workers),
                f"{a:.1f}",
                f"{b:.1f}",
                f"{statistics.median(wall):.4f} ({min(wall):.3f}..{max(wall):.3f})",
                f"{statistics.median(clip):.4f} ({min(clip):.3f}..{max(clip):.3f})",
                f"{(1 / b - 1 / a) * 1e6:+.0f}",
            )
        )
    headers = (
        "workers",
        "steps/s without",
        "steps/s with",
        "ratio, wall time (range)",
        "ratio, clipped periods (range)",
        "cost per step (us)",
    )
    title = f"Whole fits with and without LoadGuard: {STEP_S * 1e3:.0f} ms steps, {args.rounds} alternated rounds"
    print(render_table(title, rows, headers))

    rows = []
    for workers in args.workers:
        main_us, worker_us, period_us = _own_cost(args.steps, workers)
        for label, us in sorted(main_us.items(), key=lambda item: -item[1]):
            rows.append((str(workers), "main process", label, f"{us:.1f}"))
        total = sum(main_us.values())
        # Against the same run's step period: a machine that runs slow for a while slows both alike.
        share = f"{total:.1f} = {100 * total / period_us:.2f} % of the run's {period_us / 1e3:.2f} ms period"
        rows.append((str(workers), "main process", "total", share))
        if workers:
            rows.append((str(workers), "each worker", "producer meter per batch", f"{worker_us:.1f}"))
    headers = ("workers", "runs in", "where", "us per step")
    title = "LoadGuard's own time per step, timed directly (goal: main-process total < 1 % of the step period)"
    print(render_table(title, rows, headers))


if __name__ == "__main__":
    main()
