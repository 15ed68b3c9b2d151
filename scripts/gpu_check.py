"""Check LoadGuard's device timeline on a real CUDA device against pipelines of known timing.

    python scripts/gpu_check.py [--step-ms 25] [--steps 72]
    python scripts/gpu_check.py --simulate      # the same checks on the tests' simulated device, on a CPU

Runs in well under 3 minutes on one CUDA device. First it times a block of matrix products in isolation
with CUDA events (synchronised, nothing else running): that is the device step's truth ``T``. Then it
trains a real ``Trainer`` on the device with ``LoadGuard`` attached (its own CUDA events, as in any run),
where every training step runs that block, in three pipelines, and times LoadGuard's calls alone:

- ``slow loader``: each batch takes ``2 T`` to make in the training process. The device idles about half its
  time, all of it waiting for data; the host waits almost all of its time.
- ``host ahead``: every 4th batch takes ``2 T``, the others nothing, and a callback synchronises every 4
  steps (as a progress-bar refresh does). The host runs up to 3 steps ahead, so the device does not wait for
  data although the host does, about 40 % of its time.
- ``syncing callback``: a fast loader; a callback after LoadGuard synchronises after every step and then
  works ``T`` on the host. The device idles about half its time, all of it the loop's.
- ``no sync``: LoadGuard's meter around 48 steps launched with no synchronisation at all must let the host
  run ahead of the device (it never waits for the device), and its own host time per step (recording four
  events, one query, reading passed steps) must stay under 1 % of the step.

The truth for the idle is the script's own: ``1 - T / period``, with the period from host timestamps taken
in a separate callback at each batch start. Each figure is printed beside its truth and the host's figure
for the same quantity. Exit status: 0 all checks passed, 1 a figure missed its truth, 2 no CUDA device here
(nothing checked).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

NO_CUDA_EXIT = 2
_ROOT = Path(__file__).resolve().parents[1]
_SIZE = 4096  # large products: few launches per step, so 48 queued steps stay inside CUDA's launch queue


@dataclass
class Backend:
    """Where the steps run: the accelerator Lightning uses, a step's work, a synchronise, timing events."""

    name: str
    accelerator: str
    step_s: float  # the device time of one ``work()``, measured in isolation
    work: Callable[[], None]
    sync: Callable[[], None]
    events: Callable[[], Any]
    plug_events: bool  # whether LoadGuard is handed ``events`` (a CUDA run uses its own CUDA events)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--step-ms", type=float, default=25.0, help="device time of one training step")
    parser.add_argument("--steps", type=int, default=72, help="training steps per pipeline (>= 40)")
    parser.add_argument("--simulate", action="store_true", help="run on the tests' simulated device (CPU)")
    args = parser.parse_args(argv)
    if args.step_ms <= 0 or args.steps < 40:
        parser.error("--step-ms must be > 0 and --steps at least 40")
    sys.path.insert(0, str(_ROOT))
    if args.simulate:
        backend = _simulated(args.step_ms / 1e3)
    elif not torch.cuda.is_available():
        print(
            "gpu_check: no CUDA device here (torch.cuda.is_available() is False); nothing was checked. "
            "Run this script on a machine with a CUDA GPU, or with --simulate for the simulated device.",
            file=sys.stderr,
        )
        return NO_CUDA_EXIT
    else:
        backend = _cuda(args.step_ms / 1e3)
    print(f"{backend.name}; one step = {backend.step_s * 1e3:.2f} ms on the device (in isolation)")
    return check(backend, args.steps)


def _cuda(target_s: float) -> Backend:
    from lightning_loadguard.meters.device import cuda_events

    device = torch.device("cuda", torch.cuda.current_device())
    torch.cuda.set_device(device)
    a = torch.randn(_SIZE, _SIZE, device=device)
    b = torch.randn(_SIZE, _SIZE, device=device) / _SIZE**0.5

    def block(reps: int) -> Callable[[], None]:
        def run() -> None:
            x = a
            for _ in range(reps):
                x = x @ b

        return run

    def timed(reps: int, rounds: int) -> float:
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        samples = []
        for _ in range(rounds):
            torch.cuda.synchronize()
            start.record()
            block(reps)()
            end.record()
            end.synchronize()
            samples.append(start.elapsed_time(end) / 1e3)
        return statistics.median(samples)

    timed(4, 3)  # warm-up: cuBLAS initialisation
    reps = max(1, round(target_s / (timed(8, 5) / 8)))
    events = cuda_events(device)
    assert events is not None
    return Backend(
        name=f"{torch.cuda.get_device_name(device)}: {reps} products of {_SIZE}x{_SIZE} per step",
        accelerator="cuda",
        step_s=timed(reps, 10),
        work=block(reps),
        sync=torch.cuda.synchronize,
        events=events,
        plug_events=False,
    )


def _simulated(step_s: float) -> Backend:
    sys.path.insert(0, str(_ROOT / "tests"))
    from sim_device import SimDevice

    device = SimDevice()

    def work() -> None:
        device.launch(step_s)

    return Backend(
        name="simulated device (tests/sim_device.py)",
        accelerator="cpu",
        step_s=step_s,
        work=work,
        sync=device.synchronize,
        events=device.event,
        plug_events=True,
    )


Row = tuple[str, str, "float | None", float, float, float, bool]  # case, figure, host, device, truth, tol, ok


def check(backend: Backend, steps: int) -> int:
    """Run the pipelines on ``backend``, print every figure against its truth; 1 on any miss, else 0."""
    import lightning.pytorch as pl

    from lightning_loadguard import LoadGuard
    from lightning_loadguard.meters.device import DeviceTimeline

    step_s = backend.step_s
    window = min(24, steps // 3)
    rows: list[Row] = []

    class Module(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.layer = torch.nn.Linear(4, 1)

        def training_step(self, batch: torch.Tensor, batch_idx: int) -> torch.Tensor:
            backend.work()
            return self.layer(batch).sum()

        def configure_optimizers(self) -> Any:
            return torch.optim.SGD(self.parameters(), lr=0.0)

    class Data(torch.utils.data.Dataset):
        def __init__(self, sleep: Callable[[int], float]) -> None:
            self.sleep = sleep

        def __len__(self) -> int:
            return steps

        def __getitem__(self, i: int) -> torch.Tensor:
            if (seconds := self.sleep(i)) > 0:
                time.sleep(seconds)
            return torch.ones(4)

    class Clock(pl.Callback):
        """Host timestamps at each batch start: the loop's period, from a clock no event touched."""

        def __init__(self) -> None:
            self.starts: list[float] = []

        def on_train_batch_start(self, *args: Any) -> None:
            self.starts.append(time.perf_counter())

        def period(self, last: int) -> float:
            return (self.starts[-1] - self.starts[-1 - last]) / last

    class Sync(pl.Callback):
        def __init__(self, every: int, host_s: float) -> None:
            self.every, self.host_s = every, host_s

        def on_train_batch_end(self, trainer: Any, module: Any, outputs: Any, batch: Any, i: int) -> None:
            if i % self.every == self.every - 1:
                backend.sync()
                if self.host_s:
                    time.sleep(self.host_s)

    def fit(sleep: Callable[[int], float], *extra: pl.Callback) -> tuple[dict[str, float], str | None, float]:
        guard = LoadGuard(window=window, log_every_n_steps=window, print_summary=False)
        if backend.plug_events:
            guard._device_events = backend.events
        clock = Clock()
        trainer = pl.Trainer(
            accelerator=backend.accelerator,
            devices=1,
            max_epochs=1,
            logger=False,
            enable_progress_bar=False,
            enable_model_summary=False,
            enable_checkpointing=False,
            callbacks=[guard, *extra, clock],
        )
        # Pinned batches: Lightning's non_blocking copy is then queued like a kernel and never holds the host.
        pin = backend.accelerator == "cuda"
        trainer.fit(Module(), torch.utils.data.DataLoader(Data(sleep), batch_size=1, pin_memory=pin))
        verdict = guard.diagnosis.verdict if guard.diagnosis is not None else None
        return guard.metrics, verdict, max(0.0, 1.0 - step_s / clock.period(window))

    def row(case: str, name: str, host: float | None, device: float | None, truth: float, tol: float) -> None:
        value = float("nan") if device is None else device
        rows.append((case, name, host, value, truth, tol, abs(value - truth) <= tol))

    def fact(case: str, name: str, host: float | None, ok: bool) -> None:
        rows.append((case, name, host, float("nan"), float("nan"), float("nan"), ok))

    step_ms, wait = step_s * 1e3, "loadguard/wait_fraction"

    case = "slow loader"  # all the device's idle is the loader's
    m, verdict, truth = fit(lambda i: 2 * step_s)
    row(case, "device idle fraction", m.get(wait), m.get("loadguard/device_idle_fraction"), truth, 0.08)
    row(case, "data idle fraction", m.get(wait), m.get("loadguard/device_data_idle_fraction"), truth, 0.1)
    row(case, "device step ms", m.get("loadguard/step_ms"), m.get("loadguard/device_step_ms"), step_ms, 0.15 * step_ms)
    fact(case, f"verdict {verdict} (expected producer_deficit)", None, verdict == "producer_deficit")

    case = "host ahead"  # bursty loader, host up to 3 steps ahead: the host waits, the device does not
    m, verdict, truth = fit(lambda i: 2 * step_s if i % 4 == 3 else 0.0, Sync(4, 0.0))
    row(case, "data idle fraction", m.get(wait), m.get("loadguard/device_data_idle_fraction"), 0.0, 0.05)
    row(case, "device idle fraction", None, m.get("loadguard/device_idle_fraction"), truth, 0.08)
    row(case, "device step ms", m.get("loadguard/step_ms"), m.get("loadguard/device_step_ms"), step_ms, 0.15 * step_ms)
    fact(case, "the host's wait fraction > 0.2 (its figure is wrong)", m.get(wait), m.get(wait, 0.0) > 0.2)
    fact(case, f"verdict {verdict} (not producer_deficit)", None, verdict not in (None, "producer_deficit"))

    case = "syncing callback"  # a sync then T of host work after every step: the idle is the loop's
    m, verdict, truth = fit(lambda i: 0.0, Sync(1, step_s))
    row(case, "loop idle fraction", None, m.get("loadguard/device_loop_idle_fraction"), truth, 0.08)
    row(case, "data idle fraction", m.get(wait), m.get("loadguard/device_data_idle_fraction"), 0.0, 0.05)
    fact(case, f"verdict {verdict} (expected loop_overhead)", None, verdict == "loop_overhead")

    timeline = DeviceTimeline(backend.events, window=64)  # the meter alone: it never waits for the device
    backend.sync()
    began = time.perf_counter()
    metering = 0.0
    for _ in range(48):
        t0 = time.perf_counter()
        timeline.fetch_started()
        timeline.fetch_finished()
        timeline.batch_on_device()
        t1 = time.perf_counter()
        backend.work()
        t2 = time.perf_counter()
        timeline.step_ended()
        metering += t1 - t0 + time.perf_counter() - t2
    host_s = time.perf_counter() - began
    backend.sync()
    device_s = time.perf_counter() - began
    fact(
        "no sync",
        f"host {host_s * 1e3:.0f} ms < half the device's {device_s * 1e3:.0f} ms",
        None,
        host_s < 0.5 * device_s,
    )
    per_step = metering / 48
    fact("no sync", f"meter's host time {per_step * 1e6:.0f} us/step < 1 % of the step", None, per_step < 0.01 * step_s)

    misses = 0
    print(f"\n{'pipeline':<18} {'figure':<52} {'host':>8} {'device':>8} {'truth':>8} {'tol':>6}  ok")
    for case, name, host, device, truth, tol, ok in rows:
        misses += not ok
        host_text = f"{host:8.3f}" if host is not None else " " * 8
        numbers = f"{device:8.3f} {truth:8.3f} {tol:6.3f}" if truth == truth else " " * 24
        print(f"{case:<18} {name:<52} {host_text} {numbers}  {'yes' if ok else 'MISS'}")
    print(f"\n{len(rows) - misses}/{len(rows)} checks passed")
    return 1 if misses else 0


if __name__ == "__main__":
    sys.exit(main())
