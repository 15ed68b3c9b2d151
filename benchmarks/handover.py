"""Where a ready batch's fetch goes on a quiet and on a busy host: CPU, waiting for a core, blocked.

    python benchmarks/handover.py [--fetches 60] [--spinners 2]

Two workers make small batches far ahead of a 60 ms step that sleeps (as a step waits on an accelerator), so
every fetch finds its batch made. Around each fetch the training thread reads its own clocks: wall time,
CPU time (``time.thread_time``) and the time it spent runnable without a core (``/proc/thread-self/schedstat``,
the figure ``LoaderMonitor`` samples every 4th fetch). The same loop runs alone and then beside ``--spinners``
CPU-spinning processes, side by side in one run. The rest of the wall time is time blocked: the pickled batch
not yet in the pipe, its worker's feeder thread itself waiting for a core.

On a busy host the wait for a core is most of what a ready fetch gains; the diagnosis does not count it as the
hand-over's cost (``transfer_bound``), since no change to the batch's format removes it.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time

from torch.utils.data import DataLoader

from lightning_loadguard.meters.producer import _queued_seconds
from lightning_loadguard.report import render_table
from lightning_loadguard.synthetic import TimedDataset

STEP_S = 0.060
WARMUP = 5


def _measure(fetches: int) -> tuple[float, float, float]:
    """Mean wall, CPU and core-wait milliseconds of the ready fetches."""
    loader = DataLoader(
        TimedDataset(4 * (fetches + WARMUP), sample_s=0.002), batch_size=4, num_workers=2, persistent_workers=True
    )
    rows = []
    iterator = iter(loader)
    for index in range(fetches + WARMUP):
        wall, cpu, queued = time.perf_counter(), time.thread_time(), _queued_seconds()
        next(iterator)
        after = _queued_seconds()
        if index >= WARMUP and queued is not None and after is not None:
            rows.append((time.perf_counter() - wall, time.thread_time() - cpu, after - queued))
        time.sleep(STEP_S)
    if not rows:
        raise SystemExit("no /proc/thread-self/schedstat here: the wait for a core cannot be read")
    return tuple(statistics.fmean(r[k] for r in rows) * 1e3 for k in range(3))  # type: ignore[return-value]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fetches", type=int, default=60, help="ready fetches measured per host state")
    parser.add_argument("--spinners", type=int, default=2, help="CPU-spinning processes for the busy host")
    args = parser.parse_args()
    rows = []
    for spinners in (0, args.spinners):
        procs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(spinners)]
        try:
            time.sleep(0.2 if spinners else 0.0)
            wall, cpu, queued = _measure(args.fetches)
        finally:
            for proc in procs:
                proc.kill()
                proc.wait()
        rows.append(
            [f"{spinners}", f"{wall:.2f}", f"{cpu:.2f}", f"{queued:.2f}", f"{max(0.0, wall - cpu - queued):.2f}"]
        )
    title = f"Ready fetches of 4-sample batches, 2 workers, a {STEP_S * 1e3:.0f} ms sleeping step (means, ms)"
    headers = ("spinning processes", "wall", "CPU", "waiting for a core", "blocked")
    print(render_table(title, rows, headers, numbers=True))


if __name__ == "__main__":
    main()
