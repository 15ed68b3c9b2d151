"""The forecast against real runs: each what-if predicted from one 1-rank run, then run and measured.

    python benchmarks/forecast_check.py [--steps 240] [--only NAME ...] [--json FILE]

A 1-rank fit with LoadGuard attached measures the pipeline below; ``LoadGuard.forecast_facts()`` is all the forecast
gets. Each check then runs the what-if for real, without LoadGuard, in a process of its own (DDP on CPU for the
2 ranks, CPU affinity for the single core) and measures it with clocks of its own:

- throughput: steps over the wall time of the steady steps (the first ``WARMUP`` and the last ``TAIL`` left out),
  per rank (the mean of the ranks);
- wait fraction: the time the loop spends in the loader iterator's ``next`` (the fetch: the data wait as
  LoadGuard defines it), over the period. The time from the end of a step to the next batch's arrival in the module
  is shown beside it: it adds Lightning's loop code between the two, and under DDP Lightning's broadcast before each
  fetch, where a rank also waits for the others;
- in-flight memory: batches made (counted in each worker as its collate finishes) and not yet taken by the loop
  (counted in the module), read at the end of each step, times the batch's bytes, summed over the ranks: the mean
  against the forecast's queued bytes (the replay's mean buffer level), the most against the full queues (which
  no run may pass: ``OVER`` if one does).

The pipeline: each sample sleeps ``IO_S`` (a read) and computes ``CPU_S`` of CPU time (a transform); every
``BURST_EVERY``-th sample sleeps ``BURST_S`` more; batches of ``BATCH`` samples of ``FEATURES`` float32 values; a
step of ``STEP_S`` that waits (as on an accelerator); 2 workers, prefetch 2.

Where a check has more ranks, controls run after the checks: 1 and 2 ranks with batches made at no cost, the loader
never short (what 2 ranks lose there is DDP's own cost, which no 1-rank run shows: the 2-rank check is then also set
beside its forecast with that cost taken out), and two 1-rank runs of the measured settings at once (the same
processes on the same cores, not coupled by DDP).

On a shared host other work takes the cores in turns: the runs measure what it left them at the time. The table
says for each figure whether it met the goal (throughput within 10 %, wait within 0.05, memory within 10 %) and
whether the forecast's stated range covered it; the last column sets each check beside the measured run's settings
run again (the first check), where the host's drift between runs cancels.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from statistics import fmean
from typing import Any

IO_S = 0.001
CPU_S = 0.0005
BURST_EVERY = 32
BURST_S = 0.040
BATCH = 8
FEATURES = 32_768
STEP_S = 0.020
WORKERS = 2
PREFETCH = 2
WARMUP = 30
TAIL = 10

GOAL_THROUGHPUT = 0.10
GOAL_WAIT = 0.05
GOAL_MEMORY = 0.10


@dataclass(frozen=True)
class Config:
    """One run: how many ranks, on how many cores, with which loader and step."""

    ranks: int = 1
    cores: int | None = None  # CPUs of the affinity mask (None: all)
    workers: int = WORKERS
    prefetch: int = PREFETCH
    step_s: float = STEP_S
    free_batches: bool = False  # samples made at no cost: the loader is never short of a batch


@dataclass(frozen=True)
class Check:
    name: str
    what_if: dict[str, Any]
    config: Config = field(default_factory=Config)


BASELINE = Config()
CHECKS = (
    Check("as measured (run again)", {}, BASELINE),
    Check("2 ranks (DDP, same node)", {"ranks_per_node": 2}, Config(ranks=2)),
    Check("1 usable core of 2", {"usable_cores": 1.0}, Config(cores=1)),
    Check("step 2x faster", {"step_speedup": 2.0}, Config(step_s=STEP_S / 2)),
    Check("step 2x slower", {"step_speedup": 0.5}, Config(step_s=STEP_S * 2)),
    Check("1 worker", {"num_workers": 1}, Config(workers=1)),
    Check("4 workers", {"num_workers": 4}, Config(workers=4)),
    Check("prefetch 1", {"prefetch_factor": 1}, Config(prefetch=1)),
    Check("prefetch 6", {"prefetch_factor": 6}, Config(prefetch=6)),
)


# -- the measured run (a process of its own) ----------------------------------------------------------------------


def _run(config: Config, steps: int, out: str, guard: bool) -> None:
    """Train ``steps`` steps of the pipeline under ``config``; every rank writes its figures to ``out.rank<r>``."""
    import torch
    from torch.utils.data import DataLoader, Dataset, default_collate, get_worker_info

    from lightning_loadguard._lightning import pl

    torch.set_num_threads(1)

    class Pipeline(Dataset):
        def __init__(self, length: int) -> None:
            self.length = length

        def __len__(self) -> int:
            return self.length

        def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
            if config.free_batches:
                return torch.tensor(index), torch.zeros(FEATURES)
            time.sleep(IO_S + (BURST_S if index % BURST_EVERY == 0 else 0.0))
            end = time.thread_time() + CPU_S
            while time.thread_time() < end:
                pass
            return torch.tensor(index), torch.zeros(FEATURES)

    made = torch.zeros(config.workers + 1, dtype=torch.int64).share_memory_()

    class CountingCollate:
        """Counts each batch its process finishes, one slot per worker (no two processes write one slot)."""

        def __init__(self) -> None:
            self.slots: Any = None

        def __getstate__(self) -> dict[str, Any]:
            return {}

        def __call__(self, samples: list[Any]) -> Any:
            batch = default_collate(samples)
            if self.slots is None:
                self.slots = made.numpy()
            info = get_worker_info()
            self.slots[0 if info is None else info.id + 1] += 1
            return batch

    class Clocked(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.layer = torch.nn.Linear(FEATURES, 1)
            self.arrived: list[float] = []
            self.ended: list[float] = []
            self.ready: list[int] = []
            self.batch_bytes = 0

        def on_before_batch_transfer(self, batch: Any, dataloader_idx: int) -> Any:
            self.arrived.append(time.perf_counter())
            self.batch_bytes = sum(t.element_size() * t.nelement() for t in batch)
            return batch

        def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
            return self.layer(batch[1]).pow(2).mean()

        def on_train_batch_end(self, outputs: Any, batch: Any, batch_idx: int) -> None:
            remaining = self.arrived[-1] + config.step_s - time.perf_counter()
            if remaining > 0:
                time.sleep(remaining)
            # Made and not yet taken, as the loop is about to ask for its next batch.
            self.ready.append(int(made.sum()) - len(self.arrived))
            self.ended.append(time.perf_counter())

        def configure_optimizers(self) -> torch.optim.Optimizer:
            return torch.optim.SGD(self.parameters(), lr=0.01)

    fetches: list[float] = []

    class FetchClock:
        """The loader's iterator, each ``next`` timed: the fetch, as the training loop waits in it."""

        def __init__(self, iterator: Any) -> None:
            self.iterator = iterator

        def __iter__(self) -> FetchClock:
            return self

        def __next__(self) -> Any:
            started = time.perf_counter()
            batch = next(self.iterator)
            fetches.append(time.perf_counter() - started)
            return batch

    class ClockedLoader(DataLoader):
        def __iter__(self) -> Any:
            return FetchClock(super().__iter__())

    loader = ClockedLoader(
        Pipeline(steps * BATCH * config.ranks),
        batch_size=BATCH,
        num_workers=config.workers,
        prefetch_factor=config.prefetch if config.workers else None,
        collate_fn=CountingCollate(),
    )
    callbacks = []
    loadguard = None
    if guard:
        from lightning_loadguard import LoadGuard

        loadguard = LoadGuard(window=100, print_summary=False)
        callbacks.append(loadguard)
    trainer = pl.Trainer(
        accelerator="cpu",
        devices=config.ranks,
        strategy="ddp" if config.ranks > 1 else "auto",
        max_steps=steps,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        enable_checkpointing=False,
        callbacks=callbacks,
    )
    module = Clocked()
    trainer.fit(module, loader)
    first, last = WARMUP, len(module.ended) - TAIL
    periods = [module.ended[k] - module.ended[k - 1] for k in range(first, last)]
    gaps = [module.arrived[k] - module.ended[k - 1] for k in range(first, last)]
    result: dict[str, Any] = {
        "throughput": len(periods) / sum(periods),
        "wait_fraction": sum(fetches[first:last]) / sum(periods),
        "gap_fraction": sum(gaps) / sum(periods),
        "ready_max": max(module.ready[first:last]),
        "ready_mean": fmean(module.ready[first:last]),
        "batch_bytes": module.batch_bytes,
    }
    if loadguard is not None:
        result["facts"] = loadguard.forecast_facts().to_dict()
    Path(f"{out}.rank{trainer.global_rank}").write_text(json.dumps(result))
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()


# -- the orchestration -------------------------------------------------------------------------------------------


def _measure(config: Config, steps: int, guard: bool = False) -> dict[str, Any]:
    """Run ``config`` in a process of its own; the ranks' figures combined (throughput per rank, memory summed)."""
    with tempfile.TemporaryDirectory() as tmp:
        out = str(Path(tmp) / "result")
        command = [sys.executable, __file__, "--run", json.dumps(config.__dict__), "--steps", str(steps), "--out", out]
        if guard:
            command.append("--guard")
        done = subprocess.run(command, capture_output=True, text=True, timeout=900, env=os.environ.copy())
        if done.returncode != 0:
            raise RuntimeError(f"the run {config} failed:\n{done.stderr[-3000:]}")
        ranks = [json.loads((Path(tmp) / f"result.rank{r}").read_text()) for r in range(config.ranks)]
    combined = {
        "throughput": fmean(r["throughput"] for r in ranks),
        "wait_fraction": fmean(r["wait_fraction"] for r in ranks),
        "gap_fraction": fmean(r["gap_fraction"] for r in ranks),
        "inflight_max": sum(r["ready_max"] * r["batch_bytes"] for r in ranks),
        "inflight_mean": sum(r["ready_mean"] * r["batch_bytes"] for r in ranks),
    }
    if guard:
        combined["facts"] = ranks[0]["facts"]
    return combined


def check_one(check: Check, facts: Any, steps: int) -> dict[str, Any]:
    """The forecast of ``check`` from ``facts`` and the run that measures it, as one row of figures."""
    from lightning_loadguard.model.forecast import WhatIf, forecast

    predicted = forecast(facts, WhatIf(**check.what_if))
    measured = _measure(check.config, steps)
    return {"check": check.name, "predicted": predicted, "measured": measured}


def _row(result: dict[str, Any], rerun: dict[str, Any] | None) -> list[str]:
    f, m = result["predicted"], result["measured"]
    rate, wait = f.throughput, f.wait_fraction
    rate_err = m["throughput"] / rate.value - 1.0
    wait_err = m["wait_fraction"] - wait.value
    assert f.inflight_bytes is not None and f.queued_bytes is not None
    full, queued = f.inflight_bytes.value, f.queued_bytes
    queued_err = m["inflight_mean"] / queued.value - 1.0 if queued.value else m["inflight_mean"] / batch_bytes(f)

    def verdict(met: bool, covered: bool) -> str:
        return "goal" if met else ("in range" if covered else "MISS")

    cells = [
        result["check"],
        f"{rate.value:.1f} ({rate.range_text(1)})",
        f"{m['throughput']:.1f}",
        f"{rate_err:+.0%} {verdict(abs(rate_err) <= GOAL_THROUGHPUT, rate.covers(m['throughput']))}",
        f"{wait.value:.2f} ({wait.range_text(2)})",
        f"{m['wait_fraction']:.2f}",
        f"{wait_err:+.2f} {verdict(abs(wait_err) <= GOAL_WAIT, wait.covers(m['wait_fraction']))}",
        f"{m['gap_fraction']:.2f}",
        f"{queued.value / 1e6:.1f} ({queued.low / 1e6:.1f}..{queued.high / 1e6:.1f})",
        f"{m['inflight_mean'] / 1e6:.1f}",
        f"{queued_err:+.0%} {verdict(abs(queued_err) <= GOAL_MEMORY, queued.covers(m['inflight_mean']))}",
        f"{full / 1e6:.1f} / {m['inflight_max'] / 1e6:.1f}" + ("" if m["inflight_max"] <= full else " OVER"),
    ]
    if rerun is not None:
        # Side by side with the measured run's settings run again: the host's drift between runs cancels.
        predicted = rate.value / rerun["predicted"].throughput.value
        measured = m["throughput"] / rerun["measured"]["throughput"]
        cells.append(f"{predicted:.2f} / {measured:.2f} ({measured / predicted - 1:+.0%})")
    return cells


HEADERS = (
    "check",
    "steps/s: forecast (range)",
    "measured",
    "error",
    "wait: forecast (range)",
    "measured",
    "error",
    "step end to batch",
    "MB queued (mean): forecast (range)",
    "measured",
    "error",
    "MB full queues / most held",
    "steps/s over the rerun's: forecast / measured",
)


def batch_bytes(f: Any) -> float:
    """One batch's bytes on the node's scale of a forecast (a relative error against an empty queue)."""
    return f.inflight_bytes.value / max(1, f.settings.batches_in_flight * f.ranks_per_node)


def table(title: str, rows: list[list[str]]) -> str:
    """A fixed-width table (markdown: it goes into benchmarks/RESULTS.md as printed)."""
    headers = list(HEADERS[: max(len(row) for row in rows)])
    body = [headers, *rows]
    widths = [max(len(line[i]) for line in body) for i in range(len(headers))]
    lines = [title, ""]
    for n, line in enumerate(body):
        lines.append("| " + " | ".join(cell.ljust(w) for cell, w in zip(line, widths, strict=True)) + " |")
        if n == 0:
            lines.append("|" + "|".join("-" * (w + 2) for w in widths) + "|")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=240, help="steps per run (default 240)")
    parser.add_argument("--only", nargs="*", help="checks to run, by the start of their name")
    parser.add_argument("--json", help="also write the figures to this file")
    parser.add_argument("--run", help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    parser.add_argument("--guard", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.run:
        config = Config(**json.loads(args.run))
        if config.cores is not None:
            os.sched_setaffinity(0, sorted(os.sched_getaffinity(0))[: config.cores])
        _run(config, args.steps, args.out, args.guard)
        return

    from lightning_loadguard.model.forecast import ForecastFacts

    started = time.perf_counter()
    baseline = _measure(BASELINE, args.steps, guard=True)
    facts = ForecastFacts.from_dict(baseline["facts"])
    checks = [c for c in CHECKS if not args.only or any(c.name.startswith(o) for o in args.only)]
    results = []
    rows = []
    rerun = None
    for check in checks:
        results.append(check_one(check, facts, args.steps))
        if check.config == BASELINE and not check.what_if:
            rerun = results[-1]
        rows.append(_row(results[-1], rerun))
        print(" | ".join(rows[-1]), flush=True)
    print(
        f"Measured run (1 rank, {WORKERS} workers, prefetch {PREFETCH}, {STEP_S * 1e3:.0f} ms step): "
        f"{baseline['throughput']:.1f} steps/s, wait {baseline['wait_fraction']:.2f}; other work on the host used "
        f"{facts.other_cores:.2f} of {facts.usable_cores:g} cores, and CPU-bound work ran "
        f"{facts.measured_slowdown:.2f}x slower than on free cores"
    )
    ddp_cost, apart = None, []
    ranked = [r for c, r in zip(checks, results, strict=True) if c.config.ranks > 1]
    if ranked:
        # DDP's own cost per step, which a 1-rank run cannot show: the ranks' collectives (Lightning's broadcast
        # before each fetch, the gradient all-reduce) and the lockstep they hold the ranks in, with the loader never
        # short.
        alone = _measure(Config(free_batches=True), args.steps)
        together = _measure(Config(ranks=2, free_batches=True), args.steps)
        # The same processes, not coupled: two 1-rank runs of the measured settings at once.
        with ThreadPoolExecutor(2) as pool:
            apart = list(pool.map(lambda _: _measure(BASELINE, args.steps), range(2)))
        ddp_cost = together["throughput"] / alone["throughput"]
        wait_cost = together["wait_fraction"] - alone["wait_fraction"]
        line = (
            f"DDP's own cost: with batches made at no cost (the loader never short), 2 ranks ran "
            f"{together['throughput']:.1f} steps/s against 1 rank's {alone['throughput']:.1f} ({ddp_cost:.2f}x), "
            f"waiting {together['wait_fraction']:.2f} of the time in the fetch against {alone['wait_fraction']:.2f}"
        )
        if rerun is not None:
            check = ranked[0]
            measured = check["measured"]["throughput"] / rerun["measured"]["throughput"]
            predicted = check["predicted"].throughput.value / rerun["predicted"].throughput.value
            line += (
                f"; the 2-rank check with that cost taken out: steps/s over its rerun {measured / ddp_cost:.2f} "
                f"(forecast {predicted:.2f}), wait {check['measured']['wait_fraction'] - wait_cost:.2f} "
                f"(forecast {check['predicted'].wait_fraction.value:.2f})"
            )
        print(line)
        rates = " and ".join(f"{r['throughput']:.1f}" for r in apart)
        waits = " and ".join(f"{r['wait_fraction']:.2f}" for r in apart)
        line = f"Not coupled: two 1-rank runs of the measured settings at once ran {rates} steps/s, waiting {waits}"
        if rerun is not None:
            line += f" (one alone: {rerun['measured']['throughput']:.1f}, {rerun['measured']['wait_fraction']:.2f})"
        print(line)
    spent = time.perf_counter() - started
    print(table(f"Forecast from that run vs measured ({args.steps} steps a run, {spent:.0f} s)", rows))
    if args.json:
        rows = [
            {
                "check": r["check"],
                "measured": r["measured"],
                "throughput": r["predicted"].throughput.__dict__,
                "wait_fraction": r["predicted"].wait_fraction.__dict__,
                "inflight_bytes": r["predicted"].inflight_bytes.value,
                "queued_bytes": r["predicted"].queued_bytes.__dict__,
            }
            for r in results
        ]
        Path(args.json).write_text(
            json.dumps({"baseline": baseline, "results": rows, "ddp_cost": ddp_cost, "apart": apart}, indent=1)
        )


if __name__ == "__main__":
    main()
