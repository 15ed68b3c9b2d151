"""Time to the first batch after resuming at 0 %, 50 % and 90 % of an epoch: planned start vs. naive replay.

Run: ``python benchmarks/resume_first_batch.py [--samples 4000] [--batch-size 20] [--sample-ms 0.5]``

The planned start (what ``ResumableLoaderMixin`` does on resume) skips the consumed batches in the index
order; the naive replay iterates the loader and throws the consumed batches away, loading every one of them.
Both use the same dataset (each sample costs a known time), loader settings and order.
"""

from __future__ import annotations

import argparse
import time

from torch.utils.data import DataLoader

from lightning_loadguard.position import make_resumable, planned_sampler, restart_iterator
from lightning_loadguard.synthetic import TimedDataset


def _loader(args: argparse.Namespace) -> DataLoader:
    dataset = TimedDataset(args.samples, sample_s=args.sample_ms / 1e3)
    plain = DataLoader(dataset, batch_size=args.batch_size, shuffle=True, num_workers=args.workers)
    return make_resumable(plain, seed=0)


def planned_first_batch(args: argparse.Namespace, consumed: int) -> tuple[float, int]:
    loader = _loader(args)
    start = time.perf_counter()
    batch = next(restart_iterator(loader, planned_sampler(loader), consumed))
    return time.perf_counter() - start, int(batch[0][0])


def replayed_first_batch(args: argparse.Namespace, consumed: int) -> tuple[float, int]:
    loader = _loader(args)
    start = time.perf_counter()
    it = iter(loader)
    for _ in range(consumed):
        next(it)
    batch = next(it)
    elapsed = time.perf_counter() - start
    del it
    return elapsed, int(batch[0][0])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=4000)
    parser.add_argument("--batch-size", type=int, default=20)
    parser.add_argument("--sample-ms", type=float, default=0.5, help="production cost of one sample")
    parser.add_argument("--workers", type=int, default=2)
    args = parser.parse_args()
    batches = -(-args.samples // args.batch_size)
    print(
        f"{args.samples} samples x {args.sample_ms} ms, batch {args.batch_size} ({batches} batches), "
        f"{args.workers} workers"
    )
    print(f"{'resume at':>10} {'consumed':>9} {'planned (s)':>12} {'replay (s)':>11} {'same batch':>11}")
    for fraction in (0.0, 0.5, 0.9):
        consumed = int(fraction * batches)
        planned, first_planned = planned_first_batch(args, consumed)
        replayed, first_replayed = replayed_first_batch(args, consumed)
        same = "yes" if first_planned == first_replayed else "NO"
        print(f"{fraction:>9.0%} {consumed:>9d} {planned:>12.3f} {replayed:>11.3f} {same:>11}")


if __name__ == "__main__":
    main()
