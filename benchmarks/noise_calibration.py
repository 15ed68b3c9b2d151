"""How well one window's own noise estimate predicts how far windows of the same setting read apart.

The tuner reads a window's noise from the spread of its 4-step blocks' rates (``Arm.error``). What a comparison
needs is how far a second window of the same setting, measured later, could read from the first. On the
simulator both are known: for each pipeline of tests/sim_sweep.py's generator and two settings (the user's, and
twice their workers), ``--windows`` independent runs each cut one window after the warm-up, inside an epoch, as
the tuner cuts a probe's; the spread of their rates (coefficient of variation) is the truth, and the median of
their block estimates is compared with it. A ratio of 1 is a calibrated estimate; below 1 the tuner trusts a
window too far, above 1 too little.

Usage::

    python benchmarks/noise_calibration.py                  # 300 pipelines, 16 windows of 32 steps each
    python benchmarks/noise_calibration.py --steps 96
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from sim_pipeline import SimPipeline, settled
from sim_sweep import generate
from workloads import commit

from lightning_loadguard.meters.settings import LoaderSettings
from lightning_loadguard.tuning.arms import Arm


def _ratio(pipeline: SimPipeline, setting: LoaderSettings, windows: int, steps: int) -> float | None:
    """Median block estimate over the windows' true spread; ``None`` where the setting's rate does not vary."""
    rates, estimates = [], []
    for k in range(windows):
        sim = settled(pipeline, setting, seed=1000 + k)  # drift and background load kept, as the tuner meets them
        mark = sim.consumed
        sim.run(steps)
        arm = Arm(setting, sim.window(mark), 1)
        rates.append(arm.rate)
        estimates.append(arm.error)
    if min(rates) <= 0:
        return None
    spread = statistics.stdev(rates) / statistics.fmean(rates)
    return statistics.median(estimates) / spread if spread > 1e-9 else None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--count", type=int, default=300, help="pipelines (seeds 0..count-1)")
    parser.add_argument("--windows", type=int, default=16, help="independent windows per setting")
    parser.add_argument("--steps", type=int, default=32, help="steps per window")
    args = parser.parse_args()
    by_family: dict[str, list[float]] = {}
    for seed in range(args.count):
        pipeline = generate(seed)
        user = pipeline.user
        for setting in {user, LoaderSettings(max(1, 2 * user.num_workers), 2)}:
            ratio = _ratio(pipeline, setting, args.windows, args.steps)
            if ratio is not None:
                by_family.setdefault(pipeline.family, []).append(ratio)
                by_family.setdefault("all", []).append(ratio)
    print(f"{args.count} pipelines, {args.windows} windows of {args.steps} steps per setting, commit {commit()}\n")
    print("| family | settings | median estimate / spread | 10th percentile | 90th percentile | under half |")
    print("|---|---|---|---|---|---|")
    for family in ["all", *sorted(f for f in by_family if f != "all")]:
        ratios = sorted(by_family[family])
        deciles = statistics.quantiles(ratios, n=10) if len(ratios) > 1 else [ratios[0]] * 9
        under = sum(r < 0.5 for r in ratios) / len(ratios)
        print(
            f"| {family} | {len(ratios)} | {statistics.median(ratios):.2f} | {deciles[0]:.2f} | {deciles[-1]:.2f} "
            f"| {under:.0%} |"
        )


if __name__ == "__main__":
    main()
