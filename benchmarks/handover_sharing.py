"""Taking a ready batch from a worker: by what the worker is doing at that moment and by torch's sharing strategy.

    python benchmarks/handover_sharing.py [--takes 200] [--rounds 2] [--fit-steps 150]

Table 1. One worker (prefetch 2) makes 4-sample batches of 10 ms each, computing in Python (``spin``) or
sleeping (``sleep``); the loop computes for a random 6 to 16 ms before each fetch, so some fetches find the
worker making the next batch and some find it idle. The worker writes, in shared memory, how many batches it
has made and whether it is making one now; the loop reads both just before each fetch and keeps the fetches
whose batch was already made (ready), by the worker's state. Means in ms, both sharing strategies side by side
in each round.

Table 2. The ``cpu_transforms`` pipeline of ``tune_pipelines.py`` (8 ms of Python CPU work a batch, a 6 ms
step that waits) in Lightning fits at 2 and 3 workers under each strategy, in turns: steps per second after a
warm-up, and the idle cores of the CPUs this process may use over the fit.

With ``file_descriptor`` (torch's default on Linux) each tensor's descriptor comes back from the worker's
sharer thread, a Python thread that must take its process's interpreter lock from the thread making the next
batch; ``file_system`` passes a file name instead.
"""

from __future__ import annotations

import argparse
import ctypes
import logging
import multiprocessing
import random
import statistics
import sys
import tempfile
import time
import warnings
from pathlib import Path

import torch
from torch.utils.data import DataLoader, Dataset

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from pipelines import quiet_trainer
from tune_pipelines import loader, pipelines
from workloads import Stopwatch, fed_length

from lightning_loadguard.meters.cpu import _busy_seconds, affinity_cpus
from lightning_loadguard.meters.settings import LoaderSettings
from lightning_loadguard.report import render_table
from lightning_loadguard.synthetic import _burn_cpu

STRATEGIES = ("file_descriptor", "file_system")
BATCH_S = 0.010


class _ReportingDataset(Dataset):
    """4-sample batches (``batch_size=None``) of ``BATCH_S``; counts batches made and flags the one in making."""

    def __init__(self, spin: bool) -> None:
        self.spin = spin
        self.made = multiprocessing.Value(ctypes.c_long, 0, lock=False)
        self.making = multiprocessing.Value(ctypes.c_int, 0, lock=False)

    def __len__(self) -> int:
        return 10**6

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        self.making.value = 1
        if self.spin:
            _burn_cpu(BATCH_S)
        else:
            time.sleep(BATCH_S)
        batch = torch.full((4,), index), torch.randn(4, 16)
        self.made.value += 1
        self.making.value = 0
        return batch


def _takes(strategy: str, spin: bool, takes: int, seed: int) -> dict[str, list[float]]:
    """Seconds of each fetch whose batch was made, keyed by the worker's state at the fetch."""
    torch.multiprocessing.set_sharing_strategy(strategy)
    dataset = _ReportingDataset(spin)
    iterator = iter(DataLoader(dataset, batch_size=None, num_workers=1, prefetch_factor=2))
    rng = random.Random(seed)
    out: dict[str, list[float]] = {"busy": [], "idle": []}
    for taken in range(takes + 5):
        _burn_cpu(rng.uniform(0.6, 1.6) * BATCH_S)
        ready, busy = dataset.made.value > taken, dataset.making.value == 1
        start = time.perf_counter()
        next(iterator)
        if taken >= 5 and ready:
            out["busy" if busy else "idle"].append(time.perf_counter() - start)
    del iterator
    return out


def _busy_clock() -> tuple[float, float]:
    """Now, and the CPU seconds this process's CPUs have spent not idle (LoadGuard's own reading)."""
    busy = _busy_seconds(affinity_cpus())
    assert busy is not None, "the host's CPU times cannot be read here"
    return time.perf_counter(), busy


def _fit_rate(strategy: str, workers: int, steps: int) -> tuple[float, float]:
    """Steps/s of a ``cpu_transforms`` fit and the host's idle cores over the measured steps."""
    torch.multiprocessing.set_sharing_strategy(strategy)
    with tempfile.TemporaryDirectory() as tmp:
        pipeline = {p.name: p for p in pipelines(Path(tmp))}["cpu_transforms"]
    settings = LoaderSettings(num_workers=workers, prefetch_factor=2)
    warmup = 20 + 2 * settings.batches_in_flight
    fed = loader(pipeline, fed_length(steps + warmup, settings), workers, 2)
    watch = Stopwatch(warmup)
    before = _busy_clock()
    quiet_trainer(max_steps=steps + warmup, callbacks=[watch]).fit(pipeline.module(), fed)
    after = _busy_clock()
    # The fit's own start-up is in the host's figure too: idle cores is a bound on the steady part's.
    return watch.rate, len(affinity_cpus()) - (after[1] - before[1]) / (after[0] - before[0])


def _ms(values: list[float]) -> str:
    return f"{statistics.fmean(values) * 1e3:.2f} ({len(values)})" if values else "-"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--takes", type=int, default=200, help="fetches per strategy and worker kind, per round")
    parser.add_argument("--rounds", type=int, default=2, help="rounds; each runs every case once, in turn")
    parser.add_argument("--fit-steps", type=int, default=150, help="measured steps per fit in table 2")
    args = parser.parse_args()
    warnings.simplefilter("ignore")
    logging.getLogger("lightning.pytorch").setLevel(logging.ERROR)
    takes: dict[tuple[str, bool], dict[str, list[float]]] = {}
    for round_ in range(args.rounds):
        for spin in (True, False):
            for strategy in STRATEGIES:
                got = _takes(strategy, spin, args.takes, seed=round_)
                cell = takes.setdefault((strategy, spin), {"busy": [], "idle": []})
                for state in cell:
                    cell[state].extend(got[state])
    rows = [
        [strategy, "spin" if spin else "sleep", _ms(cell["busy"]), _ms(cell["idle"])]
        for (strategy, spin), cell in sorted(takes.items(), key=lambda kv: (not kv[0][1], kv[0][0]))
    ]
    print(
        render_table(
            f"Fetching a made batch from 1 worker making {BATCH_S * 1e3:.0f} ms batches: mean ms (fetches)",
            rows,
            ("sharing strategy", "worker's work", "worker making the next", "worker idle"),
        )
    )
    rates: dict[tuple[str, int], list[tuple[float, float]]] = {}
    for _ in range(args.rounds):
        for workers in (2, 3):
            for strategy in STRATEGIES:
                rates.setdefault((strategy, workers), []).append(_fit_rate(strategy, workers, args.fit_steps))
    rows = [
        [
            strategy,
            str(workers),
            " ".join(f"{r:.1f}" for r, _ in got),
            " ".join(f"{i:.2f}" for _, i in got),
        ]
        for (strategy, workers), got in sorted(rates.items(), key=lambda kv: (kv[0][1], kv[0][0]))
    ]
    print()
    print(
        render_table(
            "cpu_transforms fits, by sharing strategy (one figure per round)",
            rows,
            ("sharing strategy", "workers", "steps/s", "idle cores"),
        )
    )


if __name__ == "__main__":
    main()
