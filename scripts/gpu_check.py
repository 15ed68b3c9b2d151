"""Check LoadGuard's device timeline on a real CUDA device against pipelines of known timing.

    python scripts/gpu_check.py [--step-ms 25] [--steps 72]

Runs in well under 3 minutes on one CUDA device. First it times a block of matrix products in isolation
with CUDA events (synchronised, nothing else running): that is the device step's truth ``T``. Then it
trains a real ``Trainer`` on the device with ``LoadGuard`` attached, where every training step runs that
block, in four pipelines:

- ``slow loader``: each batch takes ``2 T`` to make in the training process. The device idles about half its
  time, all of it waiting for data; the host waits almost all of its time.
- ``host ahead``: every 4th batch takes ``2 T``, the others nothing, and a callback synchronises every 4
  steps (as a progress-bar refresh does). The host runs up to 3 steps ahead, so the device never waits for
  data although the host does, about 40 % of its time.
- ``syncing callback``: a fast loader; a callback after LoadGuard synchronises after every step and then
  works ``T`` on the host. The device idles about half its time, all of it the loop's.
- ``no sync``: LoadGuard's own calls, around ``3 x 16`` steps launched with no synchronisation at all, must
  let the host run ahead of the device (they never wait for it).

The truth for the idle is the script's own: ``1 - T x steps per second``, with the step rate from host
timestamps taken in a separate callback. Each figure is printed beside its truth and the host's figure for
the same quantity; the script exits 1 if any figure misses its truth, 2 if there is no CUDA device here.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch

NO_CUDA_EXIT = 2


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--step-ms", type=float, default=25.0, help="device time of one training step")
    parser.add_argument("--steps", type=int, default=72, help="training steps per pipeline")
    args = parser.parse_args(argv)
    if args.step_ms <= 0 or args.steps < 40:
        parser.error("--step-ms must be > 0 and --steps at least 40")
    if not torch.cuda.is_available():
        print(
            "gpu_check: no CUDA device here (torch.cuda.is_available() is False); nothing was checked. "
            "Run this script on a machine with a CUDA GPU.",
            file=sys.stderr,
        )
        return NO_CUDA_EXIT
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    return _check(args.step_ms / 1e3, args.steps)


def _check(target_s: float, steps: int) -> int:
    import lightning.pytorch as pl

    from lightning_loadguard import LoadGuard
    from lightning_loadguard.meters.device import DeviceTimeline, cuda_events

    device = torch.device("cuda", torch.cuda.current_device())
    torch.cuda.set_device(device)
    reps, step_s = _calibrate(device, target_s)
    print(f"device: {torch.cuda.get_device_name(device)}; one step = {reps} matrix products = "
          f"{step_s * 1e3:.2f} ms on the device (CUDA events, in isolation)")
    rows: list[tuple[str, str, float | None, float, float, float, bool]] = []  # case, figure, host, device, truth

    class Block(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.register_buffer("a", torch.randn(_SIZE, _SIZE))
            self.register_buffer("b", torch.randn(_SIZE, _SIZE) / _SIZE**0.5)

        def forward(self) -> torch.Tensor:
            x = self.a
            for _ in range(reps):
                x = x @ self.b
            return x

    class Module(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.block = Block()
            self.layer = torch.nn.Linear(4, 1)

        def training_step(self, batch: torch.Tensor, batch_idx: int) -> torch.Tensor:
            with torch.no_grad():
                self.block()
            return self.layer(batch).sum()

        def configure_optimizers(self) -> Any:
            return torch.optim.SGD(self.layer.parameters(), lr=0.0)

    class Data(torch.utils.data.Dataset):
        def __init__(self, sleep: Any) -> None:
            self.sleep = sleep

        def __len__(self) -> int:
            return steps

        def __getitem__(self, i: int) -> torch.Tensor:
            seconds = self.sleep(i)
            if seconds > 0:
                time.sleep(seconds)
            return torch.ones(4)

    class Clock(pl.Callback):
        """Host timestamps at each batch start: the step rate, independent of any event."""

        def __init__(self) -> None:
            self.starts: list[float] = []

        def on_train_batch_start(self, *args: Any) -> None:
            self.starts.append(time.perf_counter())

        def period(self, last: int) -> float:
            gaps = [b - a for a, b in zip(self.starts[-last - 1 :], self.starts[-last:], strict=False)]
            return statistics.fmean(gaps)

    class Sync(pl.Callback):
        def __init__(self, every: int, host_s: float) -> None:
            self.every, self.host_s = every, host_s

        def on_train_batch_end(self, trainer: Any, *args: Any) -> None:
            if (trainer.global_step) % self.every == 0:
                torch.cuda.synchronize()
                if self.host_s:
                    time.sleep(self.host_s)

    window = min(24, steps // 3)

    def fit(sleep: Any, *extra: pl.Callback) -> tuple[LoadGuard, float]:
        guard = LoadGuard(window=window, log_every_n_steps=window, print_summary=False)
        clock = Clock()
        trainer = pl.Trainer(
            accelerator="cuda", devices=1, max_epochs=1, logger=False, enable_progress_bar=False,
            enable_model_summary=False, enable_checkpointing=False, callbacks=[guard, *extra, clock],
        )
        loader = torch.utils.data.DataLoader(Data(sleep), batch_size=1)
        trainer.fit(Module(), loader)
        truth_idle = max(0.0, 1.0 - step_s / clock.period(window))
        return guard, truth_idle

    def row(case: str, name: str, host: float | None, device_value: float, truth: float, tol: float) -> None:
        rows.append((case, name, host, device_value, truth, tol, abs(device_value - truth) <= tol))

    def fact(case: str, name: str, host: float | None, ok: bool) -> None:
        rows.append((case, name, host, float("nan"), float("nan"), float("nan"), ok))

    def verdict(case: str, guard: LoadGuard, expected: str) -> None:
        found = guard.diagnosis.verdict if guard.diagnosis is not None else None
        fact(case, f"verdict {found} (expected {expected})", None, found == expected)

    step_ms, wait = step_s * 1e3, "loadguard/wait_fraction"

    # 1. Slow loader: all the device's idle is the loader's.
    case = "slow loader"
    guard, truth = fit(lambda i: 2 * step_s)
    m = guard.metrics
    row(case, "device idle fraction", m[wait], m["loadguard/device_idle_fraction"], truth, 0.08)
    row(case, "data idle fraction", m[wait], m["loadguard/device_data_idle_fraction"], truth, 0.1)
    row(case, "device step ms", m["loadguard/step_ms"], m["loadguard/device_step_ms"], step_ms, 0.15 * step_ms)
    verdict(case, guard, "producer_deficit")

    # 2. Host ahead by up to 3 steps, bursty loader: the host waits, the device does not.
    case = "host ahead"
    guard, truth = fit(lambda i: 2 * step_s if i % 4 == 3 else 0.0, Sync(4, 0.0))
    m = guard.metrics
    row(case, "data idle fraction", m[wait], m["loadguard/device_data_idle_fraction"], 0.0, 0.05)
    row(case, "device idle fraction", None, m["loadguard/device_idle_fraction"], truth, 0.08)
    row(case, "device step ms", m["loadguard/step_ms"], m["loadguard/device_step_ms"], step_ms, 0.15 * step_ms)
    fact(case, "the host's wait fraction > 0.2 (its figure is wrong)", m[wait], m[wait] > 0.2)

    # 3. A synchronising callback that then works T on the host: the idle is the loop's.
    case = "syncing callback"
    guard, truth = fit(lambda i: 0.0, Sync(1, step_s))
    m = guard.metrics
    row(case, "loop idle fraction", None, m["loadguard/device_loop_idle_fraction"], truth, 0.08)
    row(case, "data idle fraction", m[wait], m["loadguard/device_data_idle_fraction"], 0.0, 0.05)
    verdict(case, guard, "loop_overhead")

    # 4. LoadGuard's calls never wait for the device: 48 steps launched back to back outrun it.
    events = cuda_events(device)
    assert events is not None
    timeline = DeviceTimeline(events, window=64)
    block = Block().to(device)
    torch.cuda.synchronize()
    began = time.perf_counter()
    for _ in range(48):
        timeline.fetch_started()
        timeline.fetch_finished()
        timeline.batch_on_device()
        block()
        timeline.step_ended()
    host_s = time.perf_counter() - began
    torch.cuda.synchronize()
    device_s = time.perf_counter() - began
    fact("no sync", f"host {host_s * 1e3:.0f} ms < half the device's {device_s * 1e3:.0f} ms", None,
         host_s < 0.5 * device_s)

    misses = 0
    print(f"\n{'pipeline':<18} {'figure':<52} {'host':>8} {'device':>8} {'truth':>8} {'tol':>6}  ok")
    for case, name, host, dev, truth, tol, ok in rows:
        misses += not ok
        host_text = f"{host:8.3f}" if host is not None else " " * 8
        numbers = f"{dev:8.3f} {truth:8.3f} {tol:6.3f}" if dev == dev else " " * 24
        print(f"{case:<18} {name:<52} {host_text} {numbers}  {'yes' if ok else 'MISS'}")
    print(f"\n{len(rows) - misses}/{len(rows)} checks passed")
    return 1 if misses else 0


_SIZE = 4096


def _calibrate(device: torch.device, target_s: float) -> tuple[int, float]:
    """Matrix products per step to take about ``target_s`` on the device, and the time they take."""
    a = torch.randn(_SIZE, _SIZE, device=device)
    b = torch.randn(_SIZE, _SIZE, device=device) / _SIZE**0.5

    def timed(reps: int, rounds: int) -> float:
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        samples = []
        for _ in range(rounds):
            x = a
            torch.cuda.synchronize()
            start.record()
            for _ in range(reps):
                x = x @ b
            end.record()
            end.synchronize()
            samples.append(start.elapsed_time(end) / 1e3)
        return statistics.median(samples)

    timed(4, 3)  # warm-up: cuBLAS initialisation
    one = timed(8, 5) / 8
    reps = max(1, round(target_s / one))
    return reps, timed(reps, 10)


if __name__ == "__main__":
    sys.exit(main())
