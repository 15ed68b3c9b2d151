"""Each rule of the tuner's procedure scored by the sweep without it: what the rule is worth.

For every rule named in ``lightning_loadguard.tuning.planner.RULES``, the pipelines of benchmarks/tune_sweep.py
are tuned by a planner that follows every rule but that one, beside the full planner, on the development seeds
(0 to 499) and on the held-out seeds (500 to 999), each pipeline's ground truth shared by all. A rule whose
removal lowers neither the share at 0.95 of the best nor the 1st percentile on either seed range does not earn
its place.

Usage::

    python benchmarks/tune_ablation.py --jobs 2                 # every rule, 500 + 500 pipelines
    python benchmarks/tune_ablation.py --count 100 --rules twice,halve
    python benchmarks/tune_ablation.py --jobs 2 --rules start_cost --no-persistent   # tune_persistent_workers=False
    python benchmarks/tune_ablation.py --jobs 2 --draws 3       # each pipeline tuned in 3 runs of independent noise
"""

from __future__ import annotations

import argparse
import sys
import time
from functools import partial
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from sim_sweep import FULL, Score, draw_seeds, generate, map_seeds, planner_without, score_planners, summary
from workloads import commit

from lightning_loadguard.tuning.planner import RULES


def _one(seed: int, rules: tuple[str, ...], persistent: bool = True, draws: int = 1) -> list[dict[str, Score]]:
    p, planners = generate(seed), {r: planner_without(r) for r in rules}
    return [score_planners(p, planners, seed=k, persistent=persistent) for k in draw_seeds(seed, draws)]


def _moved(scores: list[dict[str, Score]], rule: str) -> tuple[int, int]:
    """Pipelines at least 0.05 of the best lower, and higher, without ``rule`` than with every rule."""
    lower = sum(s[rule].ratio <= s[FULL].ratio - 0.05 for s in scores)
    higher = sum(s[rule].ratio >= s[FULL].ratio + 0.05 for s in scores)
    return lower, higher


def _most_lowered(scores: list[dict[str, Score]], rule: str) -> str:
    """The pipeline the rule's removal lowers most, and its tuned / best with and without the rule."""
    s = max(scores, key=lambda s: s[FULL].ratio - s[rule].ratio)
    if s[rule].ratio >= s[FULL].ratio:
        return "-"
    return f"{s[FULL].pipeline.name} {s[FULL].ratio:.2f} -> {s[rule].ratio:.2f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--count", type=int, default=500, help="pipelines per seed range")
    parser.add_argument(
        "--rules", default=",".join(sorted(RULES)), help="rules to remove, one at a time (comma-separated)"
    )
    parser.add_argument("--jobs", type=int, default=1, help="processes")
    parser.add_argument(
        "--draws",
        type=int,
        default=1,
        help="runs of independent noise each pipeline is tuned in (by every planner alike); shares are over every "
        "run, pipelines moved are counted per run",
    )
    parser.add_argument(
        "--no-persistent",
        action="store_true",
        help="tune with TuneOptions(tune_persistent_workers=False) (the grid's best may still be persistent)",
    )
    args = parser.parse_args()
    if args.draws < 1:
        parser.error(f"--draws must be an integer >= 1, got {args.draws}")
    rules = [r for r in args.rules.split(",") if r]
    unknown = sorted(set(rules) - RULES)
    if unknown:
        parser.error(f"--rules: unknown {', '.join(unknown)}; the rules are {', '.join(sorted(RULES))}")
    started = time.perf_counter()
    every = (FULL, *rules)
    run = partial(_one, rules=every, persistent=not args.no_persistent, draws=args.draws)
    dev, held = (
        [s for runs in map_seeds(run, seeds, args.jobs) for s in runs]
        for seeds in (range(args.count), range(500, 500 + args.count))
    )
    draws = f", each tuned in {args.draws} draws of noise: counts are runs" if args.draws > 1 else ""
    print(
        f"{args.count} + {args.count} pipelines (seeds 0 to {args.count - 1}, development; 500 to "
        f"{499 + args.count}, held out{draws}), commit {commit()}, {time.perf_counter() - started:.0f} s"
        + ("; tune_persistent_workers=False" if args.no_persistent else "")
        + "\n"
    )
    print(
        "| rule removed | >= 0.95 x best (dev / held out) | 1st percentile (dev / held out) "
        "| pipelines 0.05 lower / higher (dev; held out) | below yours (dev / held out) | probe steps / budget "
        "| most lowered without it |"
    )
    print("|---|---|---|---|---|---|---|")
    for rule in every:
        d, h = (summary(s[rule] for s in scores)["all"] for scores in (dev, held))
        moved = "-" if rule == FULL else "{} / {}; {} / {}".format(*_moved(dev, rule), *_moved(held, rule))
        lowered = "-" if rule == FULL else _most_lowered(dev + held, rule)
        print(
            f"| {rule} | {d['at_95']:.1%} / {h['at_95']:.1%} | {d['p1']:.3f} / {h['p1']:.3f} | {moved} "
            f"| {d['below_user']:.1%} / {h['below_user']:.1%} | {d['probe_share_of_budget']:.2f} | {lowered} |"
        )


if __name__ == "__main__":
    main()
