"""Re-tuning live: another job takes the cores in the middle of a fit.

A CPU-bound pipeline (each sample spins ``--sample-ms`` of the worker's CPU time) against a step that sleeps
(an accelerator's step, which leaves the cores to the loader). ``LoadGuard(auto_tune=...)`` decides in epoch 0
on a quiet host; from epoch ``--busy-from`` on, ``--spinners`` processes spin on every core. The same fit runs
twice, side by side in alternating rounds: with ``TuneOptions(retune=True)`` (the default) and with
``retune=False`` (the decision of the quiet host, kept). The table prints, per run, the first decision, the
re-tunes with their reason, the final setting, and the steps/s of the busy epochs after the re-tune's epoch, on the
benchmark's own clock. A second table prints what the decision's watch read of other work's cores, per epoch
(median and range over its windows), beside what the decision read: with ``--spinners 0`` and another job beside
it, how far a shared host's other work swings.

Usage::

    python benchmarks/retune_live.py                      # 2 rounds
    python benchmarks/retune_live.py --rounds 3 --spinners 2
"""

from __future__ import annotations

import argparse
import multiprocessing
import statistics
import sys
import time
import warnings
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from pipelines import quiet_trainer

from lightning_loadguard import LoadGuard, TuneOptions
from lightning_loadguard._lightning import pl
from lightning_loadguard.synthetic import TimedDataset, TimedModule, timed_loader
from lightning_loadguard.tuning import watch as watch_module


def _spin(stop: Any) -> None:
    while not stop.is_set():
        pass


class BusyFrom(pl.Callback):
    """Starts ``spinners`` spinning processes at the start of epoch ``epoch``; keeps the first decision and each
    epoch's steps/s on the benchmark's own clock."""

    def __init__(self, guard: LoadGuard, epoch: int, spinners: int) -> None:
        self.guard, self.epoch, self.spinners = guard, epoch, spinners
        self.first: Any = None
        self.rates: list[float] = []
        self._stop = multiprocessing.get_context("fork").Event()
        self._procs: list[Any] = []
        self.watched: WatchedCores | None = None

    def on_train_epoch_start(self, trainer: Any, pl_module: Any) -> None:
        if self.watched is not None:
            self.watched.epoch = trainer.current_epoch
        if trainer.current_epoch == self.epoch:
            ctx = multiprocessing.get_context("fork")
            self._procs = [ctx.Process(target=_spin, args=(self._stop,), daemon=True) for _ in range(self.spinners)]
            for p in self._procs:
                p.start()
        self._started, self._steps = time.perf_counter(), 0

    def on_train_batch_end(self, *args: Any) -> None:
        self._steps += 1

    def on_train_epoch_end(self, trainer: Any, pl_module: Any) -> None:
        self.rates.append(self._steps / (time.perf_counter() - self._started))
        if trainer.current_epoch == 0:
            self.first = self.guard.decision

    def stop(self) -> None:
        self._stop.set()
        for p in self._procs:
            p.join(5)


class WatchedCores:
    """Records, while installed, each window the decision's watch reads: the epoch, other work's cores, the share
    of the usable cores in use, and the window's span on the CPU meter's clock."""

    def __init__(self) -> None:
        self.windows: list[tuple[int, float, float, float]] = []
        self.reference: Any = None
        self.epoch = 0
        self._record = watch_module.DecisionWatch.record

    def __enter__(self) -> WatchedCores:
        recorder, record = self, self._record

        def recorded(watch: Any, window: Any) -> Any:
            use = watch_module.CoresUse.of(window)
            recorder.reference = watch.reference.cores
            if use is not None and window.cpu is not None:
                recorder.windows.append((recorder.epoch, use.other, use.busy_share, window.cpu.window_s))
            return record(watch, window)

        watch_module.DecisionWatch.record = recorded  # type: ignore[method-assign]
        return self

    def __exit__(self, *exc: object) -> None:
        watch_module.DecisionWatch.record = self._record  # type: ignore[method-assign]


def run(retune: bool, args: argparse.Namespace) -> dict[str, Any]:
    pl.seed_everything(0, verbose=False)
    dataset = TimedDataset(args.steps * 4, sample_s=args.sample_ms / 1000, spin=True)
    loader = timed_loader(dataset, batch_size=4, num_workers=1, shuffle=True)
    options = TuneOptions(
        retune=retune, tune_persistent_workers=args.tune_persistent, retune_on_other_work=args.other_work
    )
    guard = LoadGuard(print_summary=False, auto_tune=options, log_every_n_steps=args.log_every)
    busy = BusyFrom(guard, args.busy_from, args.spinners)
    module = TimedModule(step_s=args.step_ms / 1000, record=False)
    watched = WatchedCores()
    busy.watched = watched
    try:
        with warnings.catch_warnings(), watched:
            warnings.simplefilter("ignore")
            quiet_trainer(max_epochs=args.epochs, callbacks=[guard, busy]).fit(module, loader)
    finally:
        busy.stop()
    decision = guard.decision
    return {
        "first": busy.first.setting.label if busy.first is not None else "-",
        "final": decision.setting.label if decision is not None else "-",
        "retunes": decision.retunes if decision is not None else 0,
        "why": decision.retuned if decision is not None else "",
        "rates": busy.rates,
        "watched": watched,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--busy-from", type=int, default=1)
    parser.add_argument("--spinners", type=int, default=2)
    parser.add_argument("--steps", type=int, default=300, help="steps per epoch")
    parser.add_argument("--sample-ms", type=float, default=2.0, help="CPU ms each sample spins (4 per batch)")
    parser.add_argument("--step-ms", type=float, default=4.0, help="the step's sleep")
    parser.add_argument("--log-every", type=int, default=10)
    parser.add_argument(
        "--tune-persistent",
        action="store_true",
        help="let the tuner turn persistent workers on (default off: each epoch starts its workers anew)",
    )
    parser.add_argument(
        "--other-work",
        action="store_true",
        help="TuneOptions(retune_on_other_work=True): the watch reads other work's cores too",
    )
    args = parser.parse_args()
    results: dict[bool, list[dict[str, Any]]] = {True: [], False: []}
    for _ in range(args.rounds):
        for retune in (True, False):
            results[retune].append(run(retune, args))
    settled = slice(args.busy_from + 1, None)  # the busy epochs after the one the change started in
    print(
        f"{'retune':<7} {'round':>5} {'epoch 0 decision':<24} {'final':<24} {'retunes':>7} {'busy steps/s':>12}  reason"
    )
    for retune, rows in results.items():
        for k, r in enumerate(rows):
            busy = statistics.fmean(r["rates"][settled]) if r["rates"][settled] else float("nan")
            print(f"{retune!s:<7} {k:>5} {r['first']:<24} {r['final']:<24} {r['retunes']:>7} {busy:>12.1f}  {r['why']}")
            print(f"{'':<13} steps/s by epoch: {', '.join(f'{x:.1f}' for x in r['rates'])}")
    on = [statistics.fmean(r["rates"][settled]) for r in results[True]]
    off = [statistics.fmean(r["rates"][settled]) for r in results[False]]
    ratios = [a / b for a, b in zip(on, off, strict=True)]
    print(
        f"busy epochs, retune=True / retune=False by round: {', '.join(f'{x:.3f}' for x in ratios)}; "
        f"median {statistics.median(ratios):.3f}"
    )
    print("\nother work's cores the watch read, by epoch: median [min..max] (windows; median share of cores in use)")
    for retune, rows in results.items():
        for k, r in enumerate(rows):
            watched = r["watched"]
            ref = watched.reference
            decided = "-" if ref is None else f"{ref.other:.2f} ({ref.busy_share:.0%} in use)"
            cells = []
            for epoch in range(args.epochs):
                w = [x for x in watched.windows if x[0] == epoch]
                if w:
                    other = [x[1] for x in w]
                    cells.append(
                        f"e{epoch}: {statistics.median(other):.2f} [{min(other):.2f}..{max(other):.2f}] "
                        f"({len(w)}; {statistics.median(x[2] for x in w):.0%})"
                    )
            print(f"{retune!s:<7} {k:>5} decided {decided}; " + "; ".join(cells))


if __name__ == "__main__":
    main()
