"""Two versions of the auto-tuner on the same pipelines, their decisions measured side by side.

Each version (a source tree of this package, e.g. one ``git archive`` of an earlier commit, and this one) tunes
epoch 0 of each pipeline of ``tune_pipelines.py`` in its own process, from ``num_workers=0``; then the settings
the two chose, and a small grid of worker counts, are measured in alternating rounds in this process (steps/s of
a Lightning fit without LoadGuard after a warm-up, as ``tune_pipelines.py`` measures them), each figure the
median over the rounds.

Usage::

    git archive 2ed99ea | tar -x -C /tmp/before
    python benchmarks/tune_before_after.py --before /tmp/before --only jpeg_new_user augmenting
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from tune_pipelines import Key, _load, label, pipelines, rotated_rounds, steady_rate, tune

ROOT = Path(__file__).resolve().parents[1]


def _decided(name: str, epoch_steps: int) -> None:
    """Tune one pipeline with the package on ``sys.path`` and print the decision as JSON (child process)."""
    warnings.simplefilter("ignore")
    with tempfile.TemporaryDirectory() as tmp:
        pipeline = next(p for p in pipelines(Path(tmp)) if p.name == name)
        decision = tune(pipeline, epoch_steps)
    data = {"key": [0, None], "verdict": "not tuned", "reason": ""}
    if decision is not None:
        data = {
            "key": [decision.num_workers, decision.prefetch_factor],
            "verdict": decision.verdict,
            "reason": decision.reason,
        }
    print("DECISION " + json.dumps(data))


def _tune_with(tree: Path, name: str, epoch_steps: int) -> dict[str, object]:
    env = {**os.environ, "PYTHONPATH": str(tree)}
    command = [sys.executable, __file__, "--decide", name, "--epoch-steps", str(epoch_steps)]
    out = subprocess.run(command, env=env, capture_output=True, text=True, check=True, cwd=tree).stdout
    line = next(x for x in out.splitlines() if x.startswith("DECISION "))
    return json.loads(line[len("DECISION ") :])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", type=Path, help="source tree of the earlier version")
    parser.add_argument("--only", nargs="*", default=["jpeg_new_user", "augmenting"], help="pipeline names")
    parser.add_argument("--rounds", type=int, default=5, help="alternating measurement rounds")
    parser.add_argument("--steps", type=int, default=150, help="measured steps per setting and round")
    parser.add_argument("--epoch-steps", type=int, default=600, help="steps of the tuned epoch")
    parser.add_argument("--decide", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.decide:
        _decided(args.decide, args.epoch_steps)
        return
    if args.before is None:
        parser.error("--before is required")
    warnings.simplefilter("ignore")
    print(f"load average before: {_load()}", flush=True)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for pipeline in (p for p in pipelines(Path(tmp)) if p.name in args.only):
            before = _tune_with(args.before.resolve(), pipeline.name, args.epoch_steps)
            after = _tune_with(ROOT, pipeline.name, args.epoch_steps)
            keys: list[Key] = [(0, None), (1, 2), (2, 2), (3, 2), (4, 2)]
            chosen = [tuple(before["key"]), tuple(after["key"])]  # type: ignore[arg-type]
            keys += [k for k in chosen if k not in keys]  # type: ignore[misc]
            runs = rotated_rounds(keys, args.rounds, lambda k, p=pipeline: steady_rate(p, k, args.steps, 20))
            rate = {k: statistics.median(v) for k, v in runs.items()}
            rows.append(_row(pipeline.name, before, after, rate))
            print(f"{pipeline.name}: done (load {_load()})\n{rows[-1]}", flush=True)
            print(f"  before: {before['reason']}\n  after:  {after['reason']}", flush=True)
    print(f"\nsteps/s, median of {args.rounds} alternating rounds of {args.steps} steps; load average: {_load()}")
    print(
        "| pipeline | before: decision | before: steps/s | after: decision | after: steps/s | after / before "
        "| grid w=0..4 (p=2) |"
    )
    print("|---" * 7 + "|")
    print("\n".join(rows))


def _row(name: str, before: dict[str, object], after: dict[str, object], rate: dict[Key, float]) -> str:
    b, a = tuple(before["key"]), tuple(after["key"])  # type: ignore[call-overload]
    grid = ", ".join(f"{label(k)} {rate[k]:.1f}" for k in rate if k[0] <= 4 and k[1] in (None, 2))
    return (
        f"| {name} | {label(b)} ({before['verdict']}) | {rate[b]:.1f} | {label(a)} ({after['verdict']}) "
        f"| {rate[a]:.1f} | {rate[a] / rate[b]:.2f} | {grid} |"
    )


if __name__ == "__main__":
    main()
