"""Re-tuning on simulated host changes: windows to find the change, and the re-tuned rate over the new best.

Each pipeline of tests/sim_sweep.py's generator is tuned on the simulator, runs its chosen setting and, after two
windows, its host changes (another job takes cores, a job leaves, the step gets twice as fast or as slow): the
decision's watch (lightning_loadguard/tuning/watch.py) reads the windows, and on a report a new planner probes
again from the running setting (tests/sim_retune.py). Scored by steady rates on the changed pipeline: the setting
running after the procedure, the old choice kept and a fresh tuning of the changed pipeline, over the grid's best.
A change matters where the old choice ran within 0.95 of the best before it and below 0.95 after. A control runs
the same pipelines on an unchanged host: a report there is a false trigger. One row per ``hold`` (windows a change
must hold).

Usage::

    python benchmarks/retune_sweep.py                      # 500 pipelines, hold 1, 2 and 3
    python benchmarks/retune_sweep.py --count 100 --jobs 2 --hold 3
    python benchmarks/retune_sweep.py --log-every 50     # windows cut at a fit's logging steps, as the session does
    python benchmarks/retune_sweep.py --span rest        # re-tune over the rest of the epoch only
    python benchmarks/retune_sweep.py --host-move 0.25   # TuneOptions(retune_on_other_work=True)
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from functools import partial
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from sim_retune import PRE_WINDOWS, SPANS, WATCH_WINDOWS, Trial, by_kind, false_triggers, summary, trials
from sim_sweep import map_seeds
from workloads import commit

from lightning_loadguard.tuning.watch import HOST_MOVE

_SPAN_WORDS = {
    "session": "where the session re-tunes (the rest of the epoch where it holds five windows, else from the "
    "next epoch spanning as a first tuning)",
    "rest": "over the rest of the epoch",
    "next": "from the next epoch, spanning as a first tuning",
}


def _or_dash(value: float, spec: str) -> str:
    return "-" if math.isnan(value) else format(value, spec)


def _one(
    seed: int, holds: tuple[int, ...], span: str, every: int | None, host_move: float | None
) -> tuple[list[Trial], dict[int, bool]]:
    return (
        trials(seed, holds, span=span, every=every, host_move=host_move),
        false_triggers(seed, holds, every, host_move),
    )


def _host_move(text: str) -> float | None:
    if text == "off":
        return None
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not value > 0:
        raise argparse.ArgumentTypeError(f"--host-move must be a share of the usable cores > 0, or 'off', got {text!r}")
    return value


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--count", type=int, default=500, help="pipelines (seeds 0..count-1)")
    parser.add_argument("--jobs", type=int, default=1, help="processes")
    parser.add_argument("--hold", type=int, nargs="+", default=[1, 2, 3], help="the watch's hold windows to compare")
    parser.add_argument(
        "--span",
        choices=SPANS,
        default="session",
        help="where a re-tune probes: as the session does (default), over the rest of the epoch, or from the next "
        "epoch spanning as a first tuning",
    )
    parser.add_argument(
        "--log-every",
        type=int,
        default=None,
        help="cut the watch's windows at the logging steps of a fit that logs every N steps, as the session does "
        "(default: windows of the planner's length back to back)",
    )
    parser.add_argument(
        "--host-move",
        type=_host_move,
        default=None,
        help="the watch's trigger on other work's cores (TuneOptions.retune_on_other_work): the share of the usable "
        f"cores they must move by (the option's: {HOST_MOVE}), or 'off' (the default, as the option's default)",
    )
    parser.add_argument("--worst", type=int, default=10, help="list this many of the worst re-tuned trials")
    args = parser.parse_args()
    holds = tuple(args.hold)
    started = time.perf_counter()
    one = partial(_one, holds=holds, span=args.span, every=args.log_every, host_move=args.host_move)
    results = map_seeds(one, range(args.count), args.jobs)
    all_trials = [t for ts, _ in results for t in ts]
    controls = [c for _, c in results]
    tuned = len({t.pipeline.name for t in all_trials})
    print(
        f"{args.count} pipelines ({tuned} tuned), commit {commit()}, {time.perf_counter() - started:.0f} s; the change "
        f"after {PRE_WINDOWS} windows, at most {WATCH_WINDOWS} windows read after it and in the control; re-tunes "
        f"{_SPAN_WORDS[args.span]}; "
        + ("windows back to back" if args.log_every is None else f"windows cut at logging steps every {args.log_every}")
        + "; other work's cores "
        + ("not read" if args.host_move is None else f"a change where they move {args.host_move} of usable cores")
        + "\n"
    )
    figures = summary(all_trials, controls)
    print("Finding the change:\n")
    print(
        "| hold | trials | changes that matter | found | found where it matters | windows to find: median / p90 "
        "/ worst | reported before the change | false triggers (control) | re-tune could not start "
        "| too few windows |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    for hold, f in figures.items():
        print(
            f"| {hold} | {f['n']:.0f} | {f['matter']:.0f} | {f['detected']:.1%} | {f['detected_matter']:.1%} "
            f"| {f['windows_median']:.0f} / {f['windows_p90']:.0f} / {f['windows_worst']:.0f} | {f['early']:.1%} "
            f"| {f['false_triggers']:.1%} | {f['not_probed']:.1%} | {f['starved']:.1%} |"
        )
    print("\nWhere the run ends, over the changed pipeline's best:\n")
    print(
        "| hold | before the change >= 0.95 | re-tuned >= 0.95 | kept >= 0.95 | fresh tuning >= 0.95 "
        "| matters: re-tuned >= 0.95 | matters: fresh tuning >= 0.95 | re-tuned p1 | kept p1 | re-tuned median "
        "| kept median | re-tuned below kept |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for hold, f in figures.items():
        print(
            f"| {hold} | {f['before_95']:.1%} | {f['retuned_95']:.1%} | {f['kept_95']:.1%} | {f['fresh_95']:.1%} "
            f"| {f['matter_retuned_95']:.1%} | {f['matter_fresh_95']:.1%} | {f['retuned_p1']:.3f} "
            f"| {f['kept_p1']:.3f} | {f['retuned_median']:.3f} | {f['kept_median']:.3f} | {f['worse']:.1%} |"
        )
    print("\nBy change:\n")
    print(
        "| hold | change | trials | changes that matter | found where it matters | found | windows to find (median) "
        "| re-tuned >= 0.95 | kept >= 0.95 |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for (hold, kind), f in by_kind(all_trials).items():
        print(
            f"| {hold} | {kind} | {f['n']:.0f} | {f['matter']:.0f} | {_or_dash(f['detected_matter'], '.1%')} "
            f"| {f['detected']:.1%} | {_or_dash(f['windows_median'], '.0f')} "
            f"| {f['retuned_95']:.1%} | {f['kept_95']:.1%} |"
        )
    print(f"\nworst {args.worst} re-tuned (hold {holds[-1]}):\n")
    print("| pipeline | cores | epoch steps | change | chosen | after | best | found after | re-tuned | kept | fresh |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    last = [t for t in all_trials if t.hold == holds[-1]]
    for t in sorted(last, key=lambda t: t.retuned or 0.0)[: args.worst]:
        p = t.pipeline
        found = "-" if t.detected is None else str(t.detected)
        print(
            f"| {p.name} | {p.host.cores} | {p.epoch_steps} | {t.kind} | {t.chosen.label} | {t.final.label} "
            f"| {t.best.label if t.best else '-'} | {found}{'' if t.probed is not False else ' (no room)'} "
            f"| {t.retuned:.3f} | {t.kept:.3f} | {t.fresh:.3f} |"
        )


if __name__ == "__main__":
    main()
