"""How fast a loader runs in the windows right after its workers start, against its steady rate.

The tuner measures each candidate in windows of 24 steps after a short warm-up (4 steps by default), right
after it restarts the loader with the candidate's workers. This script trains pipelines of
``benchmarks/tune_pipelines.py`` from a fresh start of their workers (a Lightning fit without LoadGuard) and
prints the rate of each 24-step window after the same warm-up, as a share of the steady rate (the mean over the
last windows of the fit), averaged over several fits. A window below 1.00 was measured before the loader had
settled.

Usage::

    python benchmarks/restart_settling.py             # the figures in benchmarks/RESULTS.md
    python benchmarks/restart_settling.py --fits 2    # quicker
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from pipelines import quiet_trainer
from tune_pipelines import Pipeline, loader, pipelines
from workloads import Stopwatch

WARMUP = 4
WINDOW = 24
WINDOWS = 8
STEADY_FROM = 5  # windows from here on are the steady state

CASES = {
    "cpu_transforms": (3, 1),
    "cpu_16ms_step_waits": (2, 1),
    "cpu_transforms_torch_step": (2, 1),
}


def window_rates(pipeline: Pipeline, workers: int, prefetch: int) -> list[float]:
    """Steps/s of each window after the warm-up, in one fit whose workers start with it."""
    steps = WARMUP + WINDOWS * WINDOW + 1
    watch = Stopwatch(WARMUP)  # the start of every step after the warm-up
    trainer = quiet_trainer(max_steps=steps, callbacks=[watch])
    trainer.fit(pipeline.module(), loader(pipeline, steps, workers, prefetch))
    starts = watch.starts
    return [WINDOW / (starts[(k + 1) * WINDOW] - starts[k * WINDOW]) for k in range(WINDOWS)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fits", type=int, default=6, help="fits per pipeline (default 6)")
    args = parser.parse_args()
    warnings.simplefilter("ignore")
    with tempfile.TemporaryDirectory() as tmp:
        chosen = {p.name: p for p in pipelines(Path(tmp)) if p.name in CASES}
        rows = []
        for name, (workers, prefetch) in CASES.items():
            shares: list[list[float]] = []
            for _ in range(args.fits):
                rates = window_rates(chosen[name], workers, prefetch)
                steady = statistics.fmean(rates[STEADY_FROM:])
                shares.append([r / steady for r in rates])
            rows.append((name, workers, prefetch, [statistics.fmean(s[k] for s in shares) for k in range(WINDOWS)]))
    print(
        f"\nmean over {args.fits} fits of each {WINDOW}-step window's rate after {WARMUP} steps of warm-up, as a "
        f"share of the mean of windows {STEADY_FROM + 1} to {WINDOWS} (steps after the workers start in brackets)"
    )
    header = " | ".join(f"{k + 1} ({WARMUP + k * WINDOW + 1}-{WARMUP + (k + 1) * WINDOW})" for k in range(STEADY_FROM))
    print(f"| pipeline | setting | {header} |")
    print("|---" * (STEADY_FROM + 2) + "|")
    for name, workers, prefetch, mean in rows:
        cells = " | ".join(f"{m:.3f}" for m in mean[:STEADY_FROM])
        print(f"| {name} | w={workers} p={prefetch} | {cells} |")


if __name__ == "__main__":
    main()
