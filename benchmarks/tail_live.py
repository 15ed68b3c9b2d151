"""The tail's depth live: heavy-tailed reads tuned in a real fit, then run at every depth of the chosen count.

Each sample is a read that waits a Pareto-distributed time (``--index``, mean ``--mean-ms``; drawn from the sample's
index, so every setting reads the same times) against a step that waits ``--step-ms`` (an accelerator's step).
A window of a few dozen reads rarely shows the longest an epoch meets, and the in-order hand-over stalls on a slow
read once the batches ahead of it run out; the tuner sizes the depth from the tail fitted to the reads it measured
(rule ``tail_depth``, and ``tail_workers`` where the deepest depth is not enough), without a window of its own.

The cases: ``capped`` (at most your 4 workers, so only the depth can cover the tail) and ``free`` (any count),
each tuned in a fit of one ``--epoch-steps`` epoch, where the depth is the tail's to set; and ``walled``
(``max_prefetch=2``, so the deepest depth cannot cover it), tuned over 10 epochs of ``--short-epoch-steps``, where
restarting the workers costs enough of an epoch to make them persistent and ``tail_workers`` may add workers. For
each case the script

1. tunes with ``LoadGuard(auto_tune=...)``, starting from 4 workers at depth 2 (yours), and reads the decision;
2. measures steps/s (``tune_pipelines.steady_rate``: a Lightning fit without LoadGuard, after a warm-up, held to
   the batches the workers finished) of the chosen setting, of yours, and of depths 1, 2, 4, 8 and 16 at the chosen
   count (``walled``: counts 4, 6, 8, 12 and 16 at depth 2), in alternating rounds (the order rotated), each
   setting's figure the median over the rounds.

"chosen / best" is the chosen setting against the fastest measured; "chosen / yours" against your 4 workers at
depth 2. The goal: the chosen setting within 0.95 of the best, and never slower than yours beyond the rounds'
spread.

Usage::

    python benchmarks/tail_live.py                      # every case, 3 rounds
    python benchmarks/tail_live.py --rounds 1 --steps 600 --cases walled
"""

from __future__ import annotations

import argparse
import bisect
import random
import re
import statistics
import sys
import time
import warnings
from pathlib import Path

import torch
from torch.utils.data import Dataset

from lightning_loadguard import TuneOptions

sys.path.insert(0, str(Path(__file__).resolve().parent))
from tune_pipelines import Pipeline, rotated_rounds, steady_rate, tune
from workloads import commit

DEPTHS = (1, 2, 4, 8, 16)
COUNTS = (4, 6, 8, 12, 16)
YOURS = (4, 2)


class ParetoReads(Dataset):
    """Samples whose read waits a Pareto-distributed time of the given index and mean, drawn from the sample's
    index.

    Example:
        >>> reads = ParetoReads(1000, mean_s=0.0, index=1.5)
        >>> reads[3][0].item(), len(reads)
        (3, 1000)
    """

    def __init__(self, length: int, mean_s: float, index: float, features: int = 16) -> None:
        if index <= 1:
            raise ValueError(f"index must be > 1 (a tail with a mean), got {index}")
        self.length, self.index, self.features = length, index, features
        self.scale_s = mean_s * (index - 1) / index

    def __len__(self) -> int:
        return self.length

    def read_s(self, index: int) -> float:
        """The wait of sample ``index``'s read."""
        return self.scale_s * (1 - random.Random(index).random()) ** (-1 / self.index)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        time.sleep(self.read_s(index))
        return torch.tensor(index), torch.randn(self.features, generator=torch.Generator().manual_seed(index))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mean-ms", type=float, default=10.0, help="mean read time")
    parser.add_argument("--index", type=float, default=1.5, help="the reads' Pareto index (> 1)")
    parser.add_argument("--step-ms", type=float, default=4.0, help="the step's wait")
    parser.add_argument("--epoch-steps", type=int, default=1000, help="epoch 0's steps, where the tuner probes")
    parser.add_argument("--steps", type=int, default=1500, help="steps measured per setting and round")
    parser.add_argument("--rounds", type=int, default=3, help="alternating measurement rounds")
    parser.add_argument("--short-epoch-steps", type=int, default=150, help="the walled case's epochs")
    parser.add_argument(
        "--cases", nargs="*", default=["capped", "free", "walled"], choices=["capped", "free", "walled"]
    )
    args = parser.parse_args()
    warnings.simplefilter("ignore")
    pipeline = Pipeline(
        "pareto_reads",
        lambda length: ParetoReads(length, args.mean_ms / 1000, args.index),
        batch_size=1,
        step_s=args.step_ms / 1000,
    )
    reads = ParetoReads(100_000, args.mean_ms / 1000, args.index)
    ascending = sorted(reads.read_s(i) for i in range(reads.length))
    print(
        f"commit {commit()}; reads: mean {args.mean_ms} ms, Pareto index {args.index} (of 100,000: longest "
        f"{1000 * ascending[-1]:.0f} ms, 100th longest {1000 * ascending[-100]:.0f} ms); step {args.step_ms} ms; "
        f"{args.steps} steps a setting, median of {args.rounds} rounds",
        flush=True,
    )
    for case in args.cases:
        if case == "walled":
            options, epoch_steps, epochs = TuneOptions(max_prefetch=2), args.short_epoch_steps, 10
        else:
            options, epoch_steps, epochs = TuneOptions(max_workers=4 if case == "capped" else None), args.epoch_steps, 1
        decision = tune(pipeline, epoch_steps, options, start=YOURS, epochs=epochs)
        if decision is None:
            print(f"\n{case}: not tuned")
            continue
        count = decision.num_workers
        chosen = (count, decision.prefetch_factor if count else None)
        others = [(c, 2) for c in COUNTS] if case == "walled" else [(count, d) for d in DEPTHS if count]
        keys = list(dict.fromkeys([chosen, YOURS, *others]))
        runs = rotated_rounds(keys, args.rounds, lambda k: steady_rate(pipeline, k, args.steps, warmup=20))
        rate = {k: statistics.median(v) for k, v in runs.items()}
        best = max(keys, key=rate.__getitem__)
        print(f"\n{case}: {decision.verdict}, {decision.reason}")
        print("| setting | steps/s (median) | rounds | / best |")
        print("|---|---|---|---|")
        for key in keys:
            mark = " (chosen)" if key == chosen else " (yours)" if key == YOURS else ""
            rounds = " ".join(f"{v:.1f}" for v in runs[key])
            print(f"| w={key[0]} p={key[1]}{mark} | {rate[key]:.1f} | {rounds} | {rate[key] / rate[best]:.3f} |")
        print(
            f"chosen / best: {rate[chosen] / rate[best]:.3f} (goal >= 0.95); chosen / yours: "
            f"{rate[chosen] / rate[YOURS]:.3f}; probe steps {decision.probe_steps} / {decision.probe_budget_steps}",
            flush=True,
        )
        # The odds the reason states, from the tail fitted to the reads measured, against the dataset's own reads.
        stated = re.findall(r"1 (?:read )?in ([\d,]+)(?: outlasts)? the ([\d.]+) (ms|s) that", decision.reason)
        if "tail (index" in decision.reason and not stated:
            raise SystemExit(f"{case}: the reason names a tail but no odds this script reads: {decision.reason}")
        for odds, span, unit in dict.fromkeys(stated):
            cover = float(span) / (1000 if unit == "ms" else 1)
            past = max(1, len(ascending) - bisect.bisect_right(ascending, cover))
            truth = f"{len(ascending) / past:,.0f}"
            print(f"reads past {span} {unit}: the reason's tail 1 in {odds}; the dataset's 1 in {truth}")
        print(decision.table())


if __name__ == "__main__":
    main()
