"""The pipeline simulator (tests/sim_pipeline.py) against the live pipelines of benchmarks/tune_pipelines.py.

For each live pipeline this script

1. measures its costs in isolation, never its rates per setting: each batch's wall and CPU time made in
   process (the waiting is the difference), the training loop's own CPU per step and the step's time and CPU
   (a fit without workers, its batches' measured cost taken out), the hand-over of a batch from a worker (a
   fit with one worker whose batches are always ready), a worker's start-up (``iter()`` and the first batch);
   and the host's background load before and after (one spinning process per core: each gets
   ``cores / (cores + others)`` of a core);
2. measures the steady rate of every setting of a small grid live, in Lightning fits (as tune_pipelines.py
   does), with each fit's 4-step block rates' spread;
3. builds a :class:`SimPipeline` from the costs of step 1 alone and compares its steady rates per setting with
   step 2's, and the best setting of each.

Usage::

    python benchmarks/sim_validate.py --live sim_live.json   # measure (minutes of CPU) and save
    python benchmarks/sim_validate.py --load sim_live.json   # compare a saved measurement again
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import statistics
import sys
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any

from torch.utils.data import DataLoader

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from pipelines import quiet_trainer
from sim_pipeline import Cost, Host, SimPipeline, steady_rate
from tune_pipelines import Pipeline, loader, pipelines
from workloads import Stopwatch, fed_length

from lightning_loadguard._lightning import pl
from lightning_loadguard.meters.settings import LoaderSettings
from lightning_loadguard.synthetic import TimedDataset, TimedModule

GRID = [(0, None), (1, 2), (2, 2), (3, 2), (4, 2), (6, 2), (1, 4), (2, 4), (3, 4), (4, 4), (6, 4)]
STEPS, WARMUP = 100, 20
BLOCK = 4


class _CpuClock(pl.Callback):
    """Per step after ``warmup``: the wall time, the process's CPU time (a CPU step's intra-op threads
    included) and the loop thread's (``loop_cpu``: a worker-fed loader's queue feeder thread runs beside the
    loop, off its path)."""

    def __init__(self, warmup: int) -> None:
        self.warmup = warmup
        self.start: tuple[float, float, float] | None = None

    def on_train_batch_start(self, trainer: Any, pl_module: Any, batch: Any, batch_idx: int) -> None:
        if batch_idx == self.warmup:
            self.start = (time.perf_counter(), time.process_time(), time.thread_time())

    def on_train_end(self, trainer: Any, pl_module: Any) -> None:
        assert self.start is not None
        steps = trainer.global_step - self.warmup
        self.wall = (time.perf_counter() - self.start[0]) / steps
        self.cpu = (time.process_time() - self.start[1]) / steps
        self.loop_cpu = (time.thread_time() - self.start[2]) / steps


def _clocked_fit(
    module: pl.LightningModule, fed: DataLoader, steps: int = 150, warmup: int = 20, *also: pl.Callback
) -> _CpuClock:
    clock = _CpuClock(warmup)
    quiet_trainer(max_steps=steps + warmup, callbacks=[clock, *also]).fit(module, fed)
    return clock


def _batch_costs(pipeline: Pipeline, batches: int) -> tuple[list[float], list[float]]:
    """Per batch made in process: the waiting (wall less CPU) and the CPU time."""
    fed = loader(pipeline, batches, 0, None)
    it = iter(fed)
    io, cpu = [], []
    for _ in range(batches):
        w0, c0 = time.perf_counter(), time.thread_time()
        next(it)
        c, w = time.thread_time() - c0, time.perf_counter() - w0
        cpu.append(c)
        io.append(max(0.0, w - c))
    return io, cpu


def _worker_batch(pipeline: Pipeline, batches: int = 120) -> float:
    """Mean seconds one worker takes per batch, running flat out (prefetch 4, the loop only taking batches):
    making a batch in a worker costs more than in the loop, by its sending (pickling into shared memory on the
    worker's queue thread: 2.1 ms a batch here beside a transform that spins in Python, 0.3 ms beside one that
    sleeps)."""
    fed = loader(pipeline, batches + 24, 1, 4)
    it = iter(fed)
    for _ in range(8):
        next(it)
    t0 = time.perf_counter()
    for _ in range(batches):
        next(it)
    return (time.perf_counter() - t0) / batches


def _spin(seconds: float) -> float:
    w0, c0 = time.perf_counter(), time.thread_time()
    while time.perf_counter() - w0 < seconds:
        pass
    return (time.thread_time() - c0) / (time.perf_counter() - w0)


def _background(cores: int, seconds: float = 0.5) -> float:
    """Threads of other work runnable now: one spinning process per core each gets ``cores / (cores +
    others)`` of a core."""
    with multiprocessing.get_context("fork").Pool(cores) as pool:
        shares = pool.map(_spin, [seconds] * cores)
    return max(0.0, cores / statistics.fmean(shares) - cores)


def _loop_costs() -> dict[str, float]:
    """The Lightning loop's CPU per step around a paced 10 ms step and a trivial batch (split into the part
    inside the step and the part after it), the hand-over of a batch from a worker, and a worker's start-up.

    CPU times, which other work on the host does not stretch; where only a wall time says it (the part of the
    loop outside a paced step, the start-up), the quickest of many, which other work stretched least. The loop
    and the hand-over are both measured around the same paced step: a thread that wakes from a sleep takes more
    CPU for the same code (about 0.9 ms a step more here after a 5 ms sleep than with none), so a hand-over taken
    as the difference to a fit without a sleep would hold that too.
    """
    trivial = TimedDataset(400 * 4, 0.0)
    it = iter(DataLoader(trivial, batch_size=4, shuffle=True))
    c0 = time.thread_time()
    for _ in range(200):
        next(it)
    fetch_cpu = (time.thread_time() - c0) / 200
    watch = Stopwatch(20)
    paced = _clocked_fit(
        TimedModule(0.010, record=False), DataLoader(trivial, batch_size=4, shuffle=True), 150, 20, watch
    )
    total = max(0.0, paced.loop_cpu - fetch_cpu)
    periods = sorted(b - a for a, b in zip(watch.starts, watch.starts[1:], strict=False))
    after = min(total, max(0.0, periods[len(periods) // 10] - 0.010 - fetch_cpu))
    fed_watch = Stopwatch(20)
    fed = _clocked_fit(
        TimedModule(0.010, record=False),
        DataLoader(trivial, batch_size=4, shuffle=True, num_workers=1),
        150,
        20,
        fed_watch,
    )
    # The hand-over's CPU, and its wall time beside it (the quickest periods of the two paced fits: the fetch
    # lies outside the step's 10 ms), the rest waiting: with torch's default ``file_descriptor`` sharing each
    # tensor's descriptor comes back from the worker's sharer thread in a round trip.
    handover = max(0.0001, fed.loop_cpu - total)
    fed_periods = sorted(b - a for a, b in zip(fed_watch.starts, fed_watch.starts[1:], strict=False))
    handover_wall = fed_periods[len(fed_periods) // 10] - periods[len(periods) // 10] + fetch_cpu
    handover_wait = max(0.0, handover_wall - handover)
    starts = []
    for _ in range(3):
        t0 = time.perf_counter()
        it = iter(DataLoader(trivial, batch_size=4, num_workers=4))
        t1 = time.perf_counter()
        next(it)
        starts.append((t1 - t0, time.perf_counter() - t1))
        del it
    return {
        "inside": total - after,
        "after": after,
        "handover": handover,
        "handover_wait": handover_wait,
        "fork": min(s[0] for s in starts) / 4,
        "start": min(s[1] for s in starts),
        "fetch": fetch_cpu,
    }


def _step_costs(pipeline: Pipeline, io: list[float], cpu: list[float]) -> tuple[float, float]:
    """A CPU step's CPU time and threads: a fit without workers, the batches' measured cost taken out."""
    fed = loader(pipeline, 200, 0, None)
    clock = _clocked_fit(pipeline.module(), fed)
    step_wall = max(1e-4, clock.wall - statistics.fmean(io) - statistics.fmean(cpu))
    step_cpu = max(1e-4, clock.cpu - statistics.fmean(cpu))
    return step_cpu, max(1.0, step_cpu / step_wall)


def _live_rate(pipeline: Pipeline, key: tuple[int, int | None]) -> tuple[float, float]:
    """The steady rate of a Lightning fit at ``key`` (as tune_pipelines.steady_rate) and the relative spread of
    its 4-step block rates."""
    workers, prefetch = key
    settings = LoaderSettings(num_workers=workers, prefetch_factor=prefetch)
    warmup = WARMUP + 2 * settings.batches_in_flight
    fed = loader(pipeline, fed_length(STEPS + warmup, settings), workers, prefetch, counted=True)
    watch = Stopwatch(warmup, counted=fed.dataset, batch_size=pipeline.batch_size)  # type: ignore[arg-type]
    quiet_trainer(max_steps=STEPS + warmup, callbacks=[watch]).fit(pipeline.module(), fed)
    starts = watch.starts
    blocks = [BLOCK / (starts[i + BLOCK] - starts[i]) for i in range(0, len(starts) - BLOCK, BLOCK)]
    return watch.rate, statistics.stdev(blocks) / statistics.fmean(blocks)


def measure(out: Path) -> None:
    warnings.simplefilter("ignore")
    cores = len(os.sched_getaffinity(0))
    record: dict[str, Any] = {"cores": cores, "loop": _loop_costs(), "pipelines": {}}
    print("loop:", {k: round(v * 1e3, 3) for k, v in record["loop"].items()}, "ms", flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        for pipeline in pipelines(Path(tmp)):
            io, cpu = _batch_costs(pipeline, 120)
            entry: dict[str, Any] = {"io": io, "cpu": cpu, "background": [_background(cores)]}
            entry["worker_batch"] = _worker_batch(pipeline)
            if pipeline.cpu_step is not None:
                entry["step_cpu"], entry["step_threads"] = _step_costs(pipeline, io, cpu)
            rates = {}
            for key in GRID:
                rates[f"{key[0]},{key[1]}"] = _live_rate(pipeline, key)
            entry["rates"] = rates
            entry["background"].append(_background(cores))
            record["pipelines"][pipeline.name] = entry
            print(pipeline.name, {k: round(v[0], 1) for k, v in rates.items()}, flush=True)
    out.write_text(json.dumps(record))


def sim_pipeline(name: str, pipeline: Pipeline, record: dict[str, Any]) -> SimPipeline:
    """The simulated pipeline built from the isolated costs of ``record``."""
    loop = record["loop"]
    entry = record["pipelines"][name]
    background = statistics.fmean(entry["background"])
    io = Cost(kind="empirical", values=tuple(entry["io"]))
    cpu = Cost(kind="empirical", values=tuple(entry["cpu"]))
    if pipeline.cpu_step is not None:
        step_cpu, threads, device = entry["step_cpu"], entry["step_threads"], 0.0
        after = 0.0
    else:
        step_cpu, threads, device = loop["inside"], 1.0, pipeline.step_s
        after = loop["after"]
    return SimPipeline(
        name,
        "live",
        Host(cores=record["cores"], background=background, background_interval_s=0.1),
        io=io,
        cpu=cpu,
        step_cpu_s=step_cpu,
        step_threads=threads,
        device_s=device,
        after_cpu_s=after,
        handover_s=loop["handover"],
        handover_wait_s=loop.get("handover_wait", 0.0),
        worker_extra_s=max(
            0.0, entry.get("worker_batch", 0.0) - statistics.fmean(entry["io"]) - statistics.fmean(entry["cpu"])
        ),
        fork_s=loop["fork"],
        start_s=loop["start"],
    )


def compare(record: dict[str, Any]) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        by_name = {p.name: p for p in pipelines(Path(tmp))}
    loop = record["loop"]
    print(
        f"host: {record['cores']} cores; loop CPU per step {loop['inside'] * 1e3:.2f} + {loop['after'] * 1e3:.2f} ms, "
        f"hand-over {loop['handover'] * 1e3:.2f} ms CPU + {loop.get('handover_wait', 0) * 1e3:.2f} ms waiting, "
        f"fork {loop['fork'] * 1e3:.1f} ms/worker, "
        f"worker start-up {loop['start'] * 1e3:.0f} ms\n"
    )
    keys = [f"{w},{p}" for w, p in GRID]
    print("live / simulated steps/s per setting (workers,prefetch):\n")
    print("| pipeline | " + " | ".join(keys) + " |")
    print("|---" * (len(keys) + 1) + "|")
    summary = []
    within = total = 0
    for name, entry in record["pipelines"].items():
        sim = sim_pipeline(name, by_name[name], record)
        live = {k: v[0] for k, v in entry["rates"].items()}
        simulated = {}
        for key in keys:
            w, p = key.split(",")
            settings = LoaderSettings(int(w), None if p == "None" else int(p))
            simulated[key] = steady_rate(sim, settings, steps=1000)
            total += 1
            within += abs(simulated[key] / live[key] - 1) <= 0.10
        cells = " | ".join(f"{live[k]:.1f} / {simulated[k]:.1f}" for k in keys)
        print(f"| {name} | {cells} |")
        best_live = max(live, key=live.__getitem__)
        best_sim = max(simulated, key=simulated.__getitem__)
        summary.append((name, best_live, best_sim, live[best_sim] / live[best_live], sim.host.background))
    print(f"\nsimulated within 10 % of live: {within} of {total}")
    print("\n| pipeline | live best | simulated best | live rate of the simulated best / live best | background |")
    print("|---|---|---|---|---|")
    for name, best_live, best_sim, ratio, background in summary:
        print(f"| {name} | {best_live} | {best_sim} | {ratio:.2f} | {background:.2f} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--live", type=Path, help="measure live and save to this file")
    parser.add_argument("--load", type=Path, help="compare a saved measurement")
    parser.add_argument("--loop-again", action="store_true", help="measure the loop's costs again into --load")
    args = parser.parse_args()
    if args.loop_again and args.load:
        warnings.simplefilter("ignore")
        record = json.loads(args.load.read_text())
        record["loop"] = _loop_costs()
        args.load.write_text(json.dumps(record))
    if args.live:
        measure(args.live)
    path = args.live or args.load
    if path is None:
        parser.error("give --live FILE or --load FILE")
    compare(json.loads(path.read_text()))


if __name__ == "__main__":
    main()
