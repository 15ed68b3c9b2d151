"""The window snapshot: everything the meters saw over the last N training steps of one rank.

It is the single hand-off between the instruments and everything that reasons about them (diagnosis,
tuning, logging). Plain data, no behaviour beyond derived figures, so that the model and the rules can be
unit-tested on synthetic snapshots.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from functools import cached_property
from itertools import compress
from statistics import fmean
from typing import Any

from lightning_loadguard.meters.cpu import CpuUse
from lightning_loadguard.meters.settings import LoaderSettings

__all__ = ["HostFacts", "LoaderSettings", "WindowSnapshot", "cpu_share"]


@dataclass(frozen=True)
class HostFacts:
    """What this host offers and what its training processes claim.

    Attributes:
        cpu_count: cores the host's training processes may use.
        processes_on_host: training processes (ranks) on the host.
        available_ram_bytes: its available RAM (``None``: not read).
        shm_free_bytes: its free ``/dev/shm`` (``None``: not read).
        workers_on_host: loader worker processes summed over the host's training processes, each rank's own
            count (``None``: not summed, as in one rank's window before the ranks' figures are combined).
    """

    cpu_count: int
    processes_on_host: int = 1
    available_ram_bytes: int | None = None
    shm_free_bytes: int | None = None
    workers_on_host: int | None = None

    @property
    def cores_per_process(self) -> float:
        return self.cpu_count / max(1, self.processes_on_host)


@dataclass(frozen=True)
class WindowSnapshot:
    """One rank's measurements over a rolling window of training steps (seconds unless stated).

    Attributes:
        wait_s: per step, the time the loop blocked fetching its batch.
        step_s: per step, the rest of the step (compute, transfer, callbacks; validation excluded).
        transfer_s: per step, the time spent moving the batch to the device (part of ``step_s``); NaN on the
            steps it was not timed on (the host's view times it on a sample of steps).
        wait_queued_s: per step, the part of ``wait_s`` the loop's thread spent waiting for a core (NaN where
            not sampled): on a busy host even taking a ready batch waits for a core.
        ready: per fetch, whether a batch was already waiting (``None`` where it cannot be known).
        buffer_level: per fetch, batches waiting in the loader's buffer (``None`` where unknown).
        production_s: per produced batch, the busy time of the worker that made it (fetch + collate),
            in completion order; empty when the producer is not instrumented.
        production_cpu_s: per produced batch (aligned with ``production_s``), the CPU time the producing
            thread spent; less than the busy time when the worker waits on I/O or for a core. NaN for the
            batches whose CPU time was not sampled.
        production_queued_s: per produced batch, the time the producing thread waited for a core (NaN where
            not sampled).
        producer_rate: sustainable batches/s of all workers together, or ``None`` if unmeasured.
        epoch_start_s: the iterator start-up time (worker launch) of recent epochs.
        batch_bytes: size of one batch in host memory, or ``None``.
        batch_tensors: tensors in one batch (each crosses from a worker on its own), or ``None``.
        sharing_strategy: how workers hand tensors to this process (``torch.multiprocessing``'s sharing
            strategy: ``"file_descriptor"``, ``"file_system"``), or ``None`` where not read.
        rank_wait_fractions: under DDP, every rank's wait fraction (index = global rank).
        inflight_host_bytes: in-flight batch bytes summed over this host's training processes.
        device_step_s: on an accelerator, per step, the step's time on the device's own clock (from the
            batch in hand to the end of the step's work); empty where there is no device timeline.
        device_data_idle_s: per device step, the device idle while the host waited for that step's batch.
        device_loop_idle_s: per device step, the device idle from the previous step's end to the fetch
            (callbacks, logging, synchronising calls).
        device_copy_s: per device step, the copy of the batch to the device as the device ran it.
        cpu: cores used over the window by the training process, its workers and other work, and the cores
            this process may use (``None`` where unmeasured).
        accelerator: whether the step runs on an accelerator (where a fix may move work to it).
        batches_made: batches the producer finished during the window, or ``None`` (a rolling window, or an
            unmetered producer).
    """

    wait_s: tuple[float, ...]
    step_s: tuple[float, ...]
    settings: LoaderSettings = field(default_factory=LoaderSettings)
    host: HostFacts = field(default_factory=lambda: HostFacts(cpu_count=1))
    transfer_s: tuple[float, ...] = ()
    wait_queued_s: tuple[float, ...] = ()
    ready: tuple[bool, ...] | None = None
    buffer_level: tuple[int, ...] | None = None
    production_s: tuple[float, ...] = ()
    production_cpu_s: tuple[float, ...] = ()
    production_queued_s: tuple[float, ...] = ()
    producer_rate: float | None = None
    epoch_start_s: tuple[float, ...] = ()
    batch_bytes: int | None = None
    batch_tensors: int | None = None
    sharing_strategy: str | None = None
    rank_wait_fractions: tuple[float, ...] = ()
    inflight_host_bytes: int | None = None
    producer_instrumented: bool = True
    device_step_s: tuple[float, ...] = ()
    device_data_idle_s: tuple[float, ...] = ()
    device_loop_idle_s: tuple[float, ...] = ()
    device_copy_s: tuple[float, ...] = ()
    cpu: CpuUse | None = None
    accelerator: bool = False
    batches_made: int | None = None

    @property
    def on_device(self) -> bool:
        """Whether the window holds figures from the accelerator's own timeline."""
        return bool(self.device_step_s)

    @property
    def device_period_s(self) -> float:
        """Device time the window's device steps span: steps and the idle before each."""
        return math.fsum(self.device_step_s) + self.device_idle_s

    @property
    def device_idle_s(self) -> float:
        return math.fsum(self.device_data_idle_s) + math.fsum(self.device_loop_idle_s)

    @property
    def device_idle_fraction(self) -> float | None:
        """Share of device time idle between steps (0..1), or ``None`` without a device timeline."""
        period = self.device_period_s
        return self.device_idle_s / period if self.on_device and period > 0 else None

    def device_view(self) -> WindowSnapshot:
        """This window as the accelerator saw it: the loop's wait and step on the device's clock.

        The data wait becomes the device's idle while the host fetched; the step becomes the device step
        plus the loop's idle (time the loop, not the loader, kept the device waiting); the transfer becomes
        the copy as the device ran it. Per-fetch readiness is dropped (the device's steps are read a few
        steps behind the host's, so the two do not align one to one). With ``num_workers=0`` the host's
        fetch times stay the production times. Without a device timeline the window is returned as is.

        Example:
            >>> snap = WindowSnapshot(wait_s=(0.02,) * 4, step_s=(0.001,) * 4,
            ...     device_step_s=(0.03,) * 4, device_data_idle_s=(0.0,) * 4, device_loop_idle_s=(0.002,) * 4)
            >>> round(snap.wait_fraction, 2), snap.device_view().wait_fraction, round(snap.device_view().mean_step_s, 3)
            (0.95, 0.0, 0.032)
        """
        if not self.on_device:
            return self
        production = self.production_s
        if self.settings.num_workers == 0 and not production:
            production = self.wait_s
        steps = tuple(s + loop for s, loop in zip(self.device_step_s, self.device_loop_idle_s, strict=True))
        return replace(
            self,
            wait_s=self.device_data_idle_s,
            step_s=steps,
            transfer_s=self.device_copy_s,
            wait_queued_s=(),
            ready=None,
            production_s=production,
        )

    def joined(self, later: WindowSnapshot) -> WindowSnapshot:
        """This window and a later one of the same setting, as one longer window.

        The per-step and per-batch sequences are concatenated and the batches made added up; everything
        measured once per window (host, CPU use, settings) is the later window's.

        Example:
            >>> a = WindowSnapshot(wait_s=(0.0,) * 10, step_s=(0.1,) * 10, batches_made=10)
            >>> b = WindowSnapshot(wait_s=(0.1,) * 10, step_s=(0.1,) * 10, batches_made=8)
            >>> round(a.joined(b).sustained_rate, 2)
            6.0
        """

        def both(a: tuple[Any, ...] | None, b: tuple[Any, ...] | None) -> tuple[Any, ...] | None:
            # Known over the whole span only where known in both windows.
            return None if a is None or b is None else a + b

        def optional(a: tuple[float, ...], b: tuple[float, ...]) -> tuple[float, ...]:
            return a + b if a and b else b

        def sampled(a: tuple[float, ...], a_len: int, b: tuple[float, ...], b_len: int) -> tuple[float, ...]:
            # Aligned with the steps or batches, NaN where not sampled.
            if not a and not b:
                return ()
            return (a if len(a) == a_len else (math.nan,) * a_len) + (b if len(b) == b_len else (math.nan,) * b_len)

        made = None
        if self.batches_made is not None and later.batches_made is not None:
            made = self.batches_made + later.batches_made
        made_a, made_b = len(self.production_s), len(later.production_s)
        return replace(
            later,
            wait_s=self.wait_s + later.wait_s,
            step_s=self.step_s + later.step_s,
            transfer_s=optional(self.transfer_s, later.transfer_s),
            wait_queued_s=sampled(self.wait_queued_s, self.steps, later.wait_queued_s, later.steps),
            ready=both(self.ready, later.ready),
            buffer_level=both(self.buffer_level, later.buffer_level),
            production_s=self.production_s + later.production_s,
            production_cpu_s=sampled(self.production_cpu_s, made_a, later.production_cpu_s, made_b),
            production_queued_s=sampled(self.production_queued_s, made_a, later.production_queued_s, made_b),
            device_step_s=optional(self.device_step_s, later.device_step_s),
            device_data_idle_s=optional(self.device_data_idle_s, later.device_data_idle_s),
            device_loop_idle_s=optional(self.device_loop_idle_s, later.device_loop_idle_s),
            device_copy_s=optional(self.device_copy_s, later.device_copy_s),
            batches_made=made,
        )

    @property
    def steps(self) -> int:
        return len(self.wait_s)

    @property
    def loop_s(self) -> float:
        return sum(self.wait_s) + sum(self.step_s)

    @property
    def wait_fraction(self) -> float:
        """Share of loop time spent waiting for data (0..1)."""
        total = self.loop_s
        return sum(self.wait_s) / total if total > 0 else 0.0

    @property
    def mean_wait_s(self) -> float:
        return fmean(self.wait_s) if self.wait_s else 0.0

    @property
    def mean_step_s(self) -> float:
        return fmean(self.step_s) if self.step_s else 0.0

    @property
    def mean_transfer_s(self) -> float:
        """The mean of the steps' transfers that were timed (0 where none was)."""
        timed = [t for t in self.transfer_s if t == t]
        return fmean(timed) if timed else 0.0

    @property
    def throughput(self) -> float:
        """Batches per second achieved by the loop."""
        total = self.loop_s
        return self.steps / total if total > 0 else 0.0

    @property
    def measured_a_rate(self) -> bool:
        """Whether the window says anything of the rate its loader sustains: it ran steps, and its producer made a
        batch in it (or its batches were not counted). Steps served only from batches made before the window
        (workers slower than the window is long) give :attr:`sustained_rate` 0, which is not the producer's rate.

        Example:
            >>> WindowSnapshot(wait_s=(0.0,) * 4, step_s=(0.1,) * 4, batches_made=0).measured_a_rate
            False
        """
        return self.loop_s > 0 and self.batches_made != 0

    @property
    def sustained_rate(self) -> float:
        """Steps per second the loader can keep up: a draining buffer does not count.

        A buffer filled before the window can serve steps faster than the producer makes batches, but only
        until it runs dry. Only batches both made and consumed in the window count; when the buffer was
        filling, the consumed steps count. With workers, the batches they made in a drawn-down window are a
        count of where their rounds fell (workers started together finish their batches together, and a window
        shorter than a round sees a phase of it, not a rate): their capacity counts instead, each worker making
        one batch per mean production time (Little's law), where the loop's own rate is not lower.

        Example:
            >>> WindowSnapshot(wait_s=(0.0,) * 20, step_s=(0.125,) * 20, batches_made=15).sustained_rate
            6.0
            >>> round(WindowSnapshot(wait_s=(0.0,) * 10, step_s=(0.05,) * 10, batches_made=8,
            ...     settings=LoaderSettings(31), production_s=(1.2,) * 8).sustained_rate, 1)  # 31 / 1.2 s, above 20
            20.0
            >>> WindowSnapshot(wait_s=(0.1,) * 10, step_s=(0.05,) * 10, batches_made=6,
            ...     settings=LoaderSettings(2), production_s=(0.5,) * 6).sustained_rate  # 2 / 0.5 s, below 6.7
            4.0
        """
        loop = self.loop_s
        if loop <= 0:
            return 0.0
        made = self.batches_made
        if made is None or made >= self.steps:
            return self.steps / loop
        workers = self.settings.num_workers
        production = self.mean_production_s
        if workers > 0 and production:
            return min(self.steps / loop, workers / production)
        return made / loop

    @property
    def consumer_rate(self) -> float:
        """Batches per second the loop would reach if it never waited for data."""
        mean = self.mean_step_s
        return 1.0 / mean if mean > 0 else float("inf")

    def core_wait_share(self, ready_only: bool = False) -> float:
        """Of the fetches whose wait for a core was sampled (those that found their batch made, with
        ``ready_only``), the share of their wait the loop's thread spent waiting for a core (0 where none).

        On a busy host the loop's thread, woken with its batch, may wait for a core before it can take it:
        that time is the host's contention, not the loader's or the hand-over's.

        Example:
            >>> nan = float("nan")
            >>> snap = WindowSnapshot(wait_s=(0.004, 0.002, 0.010), step_s=(0.01,) * 3,
            ...     wait_queued_s=(0.003, nan, 0.0), ready=(True, True, False))
            >>> snap.core_wait_share(), snap.core_wait_share(ready_only=True)
            (0.21428571428571427, 0.75)
        """
        ready = self.ready if ready_only and self.ready is not None else (True,) * len(self.wait_s)
        waited = queued = 0.0
        for wait, made, core in zip(self.wait_s, ready, self.wait_queued_s, strict=False):
            if made and core == core:  # NaN: not sampled
                waited += wait
                queued += min(core, wait)
        return queued / waited if waited > 0 else 0.0

    @property
    def ready_fraction(self) -> float | None:
        if not self.ready:
            return None
        return sum(self.ready) / len(self.ready)

    @property
    def ready_wait_s(self) -> float:
        """Seconds waited on fetches whose batch was already made (the hand-over); 0 where readiness was not
        measured for every fetch."""
        if self.ready is None or len(self.ready) != len(self.wait_s):
            return 0.0
        return math.fsum(compress(self.wait_s, self.ready))

    @property
    def stall_fraction(self) -> float:
        """Share of the loop's time waited on batches not yet made when fetched: what more production can win
        back (all of the wait where readiness was not measured: it cannot be told from the hand-over)."""
        loop = self.loop_s
        return max(0.0, self.wait_fraction - (self.ready_wait_s / loop if loop > 0 else 0.0))

    @property
    def mean_production_s(self) -> float | None:
        return fmean(self.production_s) if self.production_s else None

    @cached_property
    def cpu_share(self) -> float | None:
        """Share of a core the workers need while busy (see :func:`cpu_share`)."""
        return cpu_share(self.production_s, self.production_cpu_s, self.production_queued_s)

    @property
    def batch_cpu_s(self) -> float | None:
        """CPU seconds making one batch takes (the sampled batches' CPU share of their busy time, times the mean
        busy time), or ``None`` where unmeasured."""
        pairs = [(b, c) for b, c in zip(self.production_s, self.production_cpu_s, strict=False) if c == c]
        busy = sum(b for b, _ in pairs)
        if not pairs or busy <= 0:
            return None
        return sum(c for _, c in pairs) / busy * fmean(self.production_s)

    @property
    def inflight_bytes(self) -> int | None:
        """In-flight batch bytes of this rank's loader alone."""
        if self.batch_bytes is None:
            return None
        return self.batch_bytes * self.settings.batches_in_flight


def cpu_share(
    production_s: Sequence[float], production_cpu_s: Sequence[float], production_queued_s: Sequence[float]
) -> float | None:
    """Share of a core a producer needs while busy: 1 computes, near 0 waits on I/O (``None``: unmeasured).

    CPU time over busy time less the time spent queueing for a core, so that workers starved by too few
    cores still count as computing. Batches whose CPU time was not sampled (NaN) are left out.

    Example:
        >>> nan = float("nan")
        >>> cpu_share([0.5, 0.5], [0.25, 0.25], [0.0, 0.0]), cpu_share([0.1, 0.3], [0.05, nan], [0.05, nan])
        (0.5, 1.0)
    """
    queued = production_queued_s or (0.0,) * len(production_cpu_s)
    sampled = [
        (busy - wait, cpu)
        for busy, cpu, wait in zip(production_s, production_cpu_s, queued, strict=False)
        if cpu == cpu  # NaN: not sampled
    ]
    busy = sum(b for b, _ in sampled)
    if not sampled or busy <= 0:
        return None
    return min(1.0, sum(c for _, c in sampled) / busy)
