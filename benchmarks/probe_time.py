"""What probing costs in time, on hundreds of simulated pipelines: the probed epochs' time over the same steps at
your settings, and what a probe budget charged in time instead of steps would cost the choice.

``probe_share`` bounds the *steps* that run settings other than yours. A probed setting whose workers start slowly
(many of them on few or busy cores, each computing its first batch) or fill a deep buffer runs those steps slower
than yours, so probing can cost more of the probed epochs' time than that share. For each pipeline of the sweep
(tests/sim_sweep.py's generator), tuned on the simulator: the time from the fit's start to the decision, less the
same steps at your settings' rate over an epoch (the ground truth: their start and fill included), as a share of
the probed epochs' time at that rate; and the chosen setting's rate over the grid's best (as tune_sweep.py). Two
planners side by side: the tuner's (steps charged as steps), and one that charges each probe step at least the
time it took at the rate the loop ran your settings (so probing stops once it has spent ``probe_share`` of the
probed epochs' time).

Usage::

    python benchmarks/probe_time.py --jobs 2               # 500 pipelines (seeds 0..499)
    python benchmarks/probe_time.py --jobs 2 --first 500   # held out of the rules' development
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from statistics import median, quantiles

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from sim_pipeline import tune_sim
from sim_sweep import _Truth, generate, grid_best, map_seeds
from workloads import commit

from lightning_loadguard.tuning.options import TuneOptions
from lightning_loadguard.tuning.planner import Planner


class TimeCharged(Planner):
    """The tuner's planner, with each probe step charged at least the time it took at your settings' loop rate."""

    def spent_steps(self) -> float:
        user = self.arms.get(self.original)
        if user is None or user.window.loop_s <= 0:
            return float(self.probe_steps)
        return max(float(self.probe_steps), self.probe_time_s * user.window.steps / user.window.loop_s)


PLANNERS: dict[str, type[Planner]] = {"steps (the tuner)": Planner, "time charged": TimeCharged}


@dataclass(frozen=True)
class Row:
    name: str
    extra: dict[str, float]  # probing's extra time over the probed epochs' time at yours, by planner
    ratio: dict[str, float]  # chosen / best, over an epoch as training runs it


def _one(seed: int) -> Row | None:
    p = generate(seed)
    truth = _Truth(p)
    user_rate = truth(p.user)
    options = TuneOptions(max_workers=p.max_workers)
    chosen, extra = {}, {}
    for name, planner in PLANNERS.items():
        tuned, sim, plan = tune_sim(p, options, seed=seed, planner=planner)
        if tuned.decision is None or sim.consumed == 0:
            return None
        elapsed = sim.step_end[sim.consumed - 1]
        span_s = plan.span_epochs * p.epoch_steps / user_rate
        extra[name] = (elapsed - sim.consumed / user_rate) / span_s
        chosen[name] = tuned.chosen
    best = truth(max((grid_best(p, truth), p.user, *chosen.values()), key=truth))
    return Row(p.name, extra, {name: truth(s) / best for name, s in chosen.items()})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--count", type=int, default=500, help="pipelines (seeds first..first+count-1)")
    parser.add_argument("--first", type=int, default=0, help="the first seed (500: pipelines held out of seeds 0..499)")
    parser.add_argument("--jobs", type=int, default=1, help="processes")
    parser.add_argument("--worst", type=int, default=8, help="list the pipelines whose probing cost most")
    args = parser.parse_args()
    started = time.perf_counter()
    seeds = range(args.first, args.first + args.count)
    rows = [r for r in map_seeds(partial(_one), seeds, args.jobs) if r is not None]
    print(
        f"{args.count} pipelines (seeds {seeds.start} to {seeds.stop - 1}), {len(rows)} tuned, commit {commit()}, "
        f"{time.perf_counter() - started:.0f} s\n"
    )
    print(
        "| probe budget | tuned >= 0.95 x best | 1st percentile | extra time: median | 99th percentile | worst "
        "| over 20 % | over 50 % |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for name in PLANNERS:
        extra = sorted(r.extra[name] for r in rows)
        ratios = sorted(r.ratio[name] for r in rows)
        print(
            f"| {name} | {sum(x >= 0.95 for x in ratios) / len(ratios):.1%} | {quantiles(ratios, n=100)[0]:.3f} "
            f"| {median(extra):.3f} | {quantiles(extra, n=100)[98]:.3f} | {extra[-1]:.3f} "
            f"| {sum(x > 0.2 for x in extra) / len(extra):.1%} | {sum(x > 0.5 for x in extra) / len(extra):.1%} |"
        )
    first = next(iter(PLANNERS))
    print(f"\nprobing's extra time, worst {args.worst} under the tuner's budget:")
    print("| pipeline | " + " | ".join(f"{n}: extra, tuned / best" for n in PLANNERS) + " |")
    print("|---|" + "---|" * len(PLANNERS))
    for r in sorted(rows, key=lambda r: -r.extra[first])[: args.worst]:
        cells = " | ".join(f"{r.extra[n]:.3f}, {r.ratio[n]:.3f}" for n in PLANNERS)
        print(f"| {r.name} | {cells} |")


if __name__ == "__main__":
    main()
