"""The tuner on hundreds of simulated pipelines: tuned / best rate, by family.

Each pipeline comes from tests/sim_sweep.py's seeded generator (I/O-bound, CPU-bound, compute-bound,
CPU-contended, bursty, hand-over-bound; 1 to 64 cores; 0 to several competing processes; epochs of 30 to 5,000
steps) and is tuned on the simulator (tests/sim_pipeline.py); the chosen setting's rate over an epoch as training
runs it (its start and the buffer's fill included, so persistent workers count) is compared with the best of a
grid and with the user's settings, all simulated (the ground truth).

Usage::

    python benchmarks/tune_sweep.py                   # 500 pipelines (seeds 0..499)
    python benchmarks/tune_sweep.py --count 100 --worst 10
    python benchmarks/tune_sweep.py --jobs 2          # in parallel processes
    python benchmarks/tune_sweep.py --first 500       # seeds 500..999, held out of the rules' development
    python benchmarks/tune_sweep.py --truth-seeds 4   # each setting's rate the mean of 4 runs
    python benchmarks/tune_sweep.py --truth steady    # the steady state of one endless epoch instead
    python benchmarks/tune_sweep.py --measured        # also: the search's reach and the ranking's, apart
    python benchmarks/tune_sweep.py --draws 3         # each pipeline tuned in 3 runs of independent noise
"""

from __future__ import annotations

import argparse
import sys
import time
from functools import partial
from itertools import pairwise
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from sim_sweep import Score, draw_seeds, generate, map_seeds, score_draws, search_table, summary, table
from workloads import commit


def _one(
    seed: int, draws: int = 1, truth_seeds: int = 1, per_epoch: bool = True, measured: bool = False
) -> list[Score]:
    return score_draws(
        generate(seed), draw_seeds(seed, draws), truth_seeds=truth_seeds, per_epoch=per_epoch, measured=measured
    )


def _by_draw(runs: list[list[Score]]) -> str:
    """Each draw's share at >= 0.95 of the best, and how many pipelines reach it in every draw, in some, in none."""
    shares = [sum(run[k].ratio >= 0.95 for run in runs) / len(runs) for k in range(len(runs[0]))]
    met = [sum(s.ratio >= 0.95 for s in run) for run in runs]
    every, none = sum(m == len(run) for m, run in zip(met, runs, strict=True)), met.count(0)
    return (
        f"tuned >= 0.95 x best in each draw: {', '.join(f'{x:.1%}' for x in shares)}; pipelines at it in every "
        f"draw: {every}, in some: {len(runs) - every - none}, in none: {none}"
    )


def _histogram(scores: list[Score]) -> str:
    edges = [0.0, 0.5, 0.8, 0.9, 0.95, 0.98, 1.0001]
    counts = [sum(lo <= s.ratio < hi for s in scores) for lo, hi in pairwise(edges)]
    labels = ["< 0.5", "0.5-0.8", "0.8-0.9", "0.9-0.95", "0.95-0.98", ">= 0.98"]
    return "  ".join(f"{label}: {count}" for label, count in zip(labels, counts, strict=True))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--count", type=int, default=500, help="pipelines (seeds first..first+count-1)")
    parser.add_argument("--first", type=int, default=0, help="the first seed (500: pipelines held out of seeds 0..499)")
    parser.add_argument("--truth-seeds", type=int, default=1, help="simulated runs averaged for each setting's rate")
    parser.add_argument(
        "--truth",
        choices=("epoch", "steady"),
        default="epoch",
        help="each setting's rate over an epoch as training runs it (its start and fill included), or in the "
        "steady state of one endless epoch",
    )
    parser.add_argument(
        "--measured",
        action="store_true",
        help="also rate every setting the planner measured: how often the best of them is within 0.95 of the "
        "best (the search's reach) and the choice within 0.95 of it (the ranking's)",
    )
    parser.add_argument(
        "--draws",
        type=int,
        default=1,
        help="runs of independent noise (background load, drift, costs) each pipeline is tuned in, each scored "
        "against the same truth; the table's shares are over every run",
    )
    parser.add_argument("--jobs", type=int, default=1, help="processes")
    parser.add_argument("--worst", type=int, default=15, help="list this many of the worst pipelines")
    args = parser.parse_args()
    if args.draws < 1:
        parser.error(f"--draws must be an integer >= 1, got {args.draws}")
    started = time.perf_counter()
    seeds = range(args.first, args.first + args.count)
    one = partial(
        _one, draws=args.draws, truth_seeds=args.truth_seeds, per_epoch=args.truth == "epoch", measured=args.measured
    )
    runs = map_seeds(one, seeds, args.jobs)
    scores = [s for run in runs for s in run]
    draws = f", each tuned in {args.draws} draws of noise: the table counts runs" if args.draws > 1 else ""
    print(
        f"{args.count} pipelines (seeds {seeds.start} to {seeds.stop - 1}{draws}; truth: each setting's {args.truth} "
        f"rate, the mean of {args.truth_seeds} runs), commit {commit()}, {time.perf_counter() - started:.0f} s\n"
    )
    figures = summary(scores)
    print(table(figures))
    if args.draws > 1:
        print(f"\n{_by_draw(runs)}")
    if args.measured:
        print(f"\n{search_table(figures)}")
    print(f"\ntuned / best: {_histogram(scores)}")
    if args.worst < 1:
        return
    print(f"\nworst {args.worst}:")
    print(
        "| pipeline | cores | epoch steps | yours | chosen | best | tuned / best | yours / best | verdict "
        "| probe steps |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    for s in sorted(scores, key=lambda s: s.ratio)[: args.worst]:
        p = s.pipeline
        print(
            f"| {p.name} | {p.host.cores} | {p.epoch_steps} | {p.user.label} | {s.chosen.label} | {s.best.label} "
            f"| {s.ratio:.3f} | {s.user_rate / s.best_rate:.3f} | {s.verdict} | {s.probe_steps} / {s.budget_steps} |"
        )


if __name__ == "__main__":
    main()
