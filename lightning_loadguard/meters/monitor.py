"""The loader monitor: the meters and the loader probe behind one object that produces window snapshots.

Plain Python, no framework: an adapter feeds it timestamps (fetch start and end, step start, excluded time)
and the train loader; anything that reasons about the measurements (the diagnosis, the tuner, the logged
metrics) reads :class:`~lightning_loadguard.meters.window.WindowSnapshot`\\ s from it. As Lightning's
``Throughput`` under its ``ThroughputMonitor`` callback: ``update`` calls, :meth:`LoaderMonitor.snapshot`,
:meth:`LoaderMonitor.reset`.

Example:
    >>> monitor = LoaderMonitor(window=10)
    >>> for start in (0.0, 0.1, 0.2):
    ...     monitor.fetch_started(start); monitor.fetch_finished(start + 0.02)
    >>> monitor.close_step(0.3)
    >>> snap = monitor.snapshot()
    >>> snap.steps, round(snap.wait_fraction, 2)
    (3, 0.2)
"""

from __future__ import annotations

import operator
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Any

from lightning_loadguard.meters.consumer import ConsumerMeter
from lightning_loadguard.meters.cpu import CpuReading, CpuSampler, CpuUse
from lightning_loadguard.meters.device import DeviceEvent, DeviceStep, DeviceTimeline
from lightning_loadguard.meters.host import MEMORY_REREAD_S, batch_layout, host_facts, sharing_strategy
from lightning_loadguard.meters.loader_probe import LoaderProbe, instrument, restore
from lightning_loadguard.meters.producer import SAMPLE_INTERVAL_S, ProducerMeter
from lightning_loadguard.meters.settings import LoaderSettings, settings_of
from lightning_loadguard.meters.window import WindowSnapshot

DEVICE_TIMELINE = "measuring the device timeline"
_CPU = "measuring the host's CPU use"

PRODUCER_WINDOWS = 4
"""Production is averaged over this many windows of batches: a burst every few dozen batches would otherwise
swing the capacity by a burst's share of one window."""

QUEUE_SAMPLE_INTERVAL_S = SAMPLE_INTERVAL_S
"""The loop thread's wait for a core during a fetch is read (two ``schedstat`` reads) on the first fetch that
starts at least this long after the previous read: on a busy host, a ready batch's hand-over also waits for a
core, which is not the hand-over's cost. Sampled in time, as the producers sample theirs: the read right after
a step, with the kernel's caches cold from the step, costs several microseconds, a share of a short step."""


@dataclass(frozen=True)
class WindowMark:
    """Where a window began: the time, the steps completed, the batches made by then, the batches the
    producer meter's window had taken in by then, and the CPU seconds spent by then (``None`` where unread)."""

    at: float
    steps: int
    batches: int
    entered: int
    cpu: CpuReading | None = None


def not_one_loader(loaders: list[Any]) -> str:
    """Why a list of train loaders other than exactly one cannot be measured or tuned as one loader."""
    if not loaders:
        return "the trainer has no train loader"
    return f"the trainer iterates {len(loaders)} train loaders at once"


class LoaderMonitor:
    """Owns the consumer meter, the producer meter, the loader probe and the device timeline of one training
    process.

    Per step, an adapter calls ``fetch_started(now)`` when the loop asks for its next batch (this closes the
    previous step), ``fetch_finished(now)`` when it has it, ``step_started(now)`` first in the step (the
    batch was handed to the device: ``now`` read after the device was told) and :meth:`step_ended`. Look the
    first three up on each call: they are bound anew when a device timeline is attached.

    Args:
        window: steps in the rolling window of :meth:`snapshot`.
        guarded: runs ``fn(*args)`` for a measurement named ``what`` and returns ``None`` when it failed (now
            or before): the device timeline is then left off. By default failures propagate.
        on_error: told what failed and why when the loader probe's own code fails inside the loader.
    """

    fetch_started: Callable[[float], None]
    fetch_finished: Callable[[float], None]
    step_started: Callable[[float], None]

    def __init__(
        self,
        window: int,
        guarded: Callable[..., Any] | None = None,
        on_error: Callable[[str, Exception], None] | None = None,
    ) -> None:
        self.window = window
        self._guarded = guarded or _unguarded
        self._timeline: DeviceTimeline | None = None
        self._cpu = CpuSampler(worker_pids=self._worker_pids)
        self._cpu_use: CpuUse | None = None
        self.accelerator = False
        """Whether the step runs on an accelerator."""
        self._consumer = ConsumerMeter(window, core_wait_interval_s=QUEUE_SAMPLE_INTERVAL_S)
        self._bind_updates()
        self._producer = ProducerMeter(PRODUCER_WINDOWS * window)
        # The consumer hears of each fetch directly: the probe's call runs on every step.
        self._probe = LoaderProbe(
            self._producer,
            self._epoch_started,
            self._consumer.fetch_observed,
            on_error,
            self._startup_observed,
            self._in_process,
            self._fetch_open,
        )
        self._epoch_start_s: deque[float] = deque(maxlen=16)
        self._worker_starts = 0
        self._worker_start_s = 0.0
        self._iter_s = 0.0
        self._iterator_mark: WindowMark | None = None
        self._loader: Any = None
        self.settings = LoaderSettings()
        """The train loader's settings as last read."""
        self._several: tuple[LoaderSettings, ...] = ()
        self.producer_instrumented = False
        """Whether production is metered inside the loader (else only the loop's side is)."""
        self.batch_bytes: int | None = None
        """Bytes of the latest measured batch in host memory."""
        self.batch_tensors: int | None = None
        """Tensors in the latest measured batch."""
        self.processes_on_host = 1
        """Training processes on this host (known once the ranks' figures were combined)."""
        self.on_settings_changed: Callable[[LoaderSettings], None] | None = None
        """Called with the settings before, when :meth:`loader_changed` finds them changed."""

    def resize(self, window: int) -> None:
        """A new window length (the windows keep their latest figures)."""
        if window == self.window:
            return
        self.window = window
        self._consumer.resize(window)
        self._producer.resize(PRODUCER_WINDOWS * window)
        if self._timeline is not None:
            self._timeline.resize(window)

    def __getstate__(self) -> dict[str, Any]:
        # A copy is detached from the fit: it keeps the figures, not the loader or the device's events.
        state = dict(self.__dict__)
        state.update(_loader=None, producer_instrumented=False, _timeline=None)
        return state

    # -- update ----------------------------------------------------------------------------------------

    def _bind_updates(self) -> None:
        # Without a device timeline the per-step updates go straight to the consumer meter: they run on every
        # step with the caches cold from the step's own work, where each call level costs microseconds.
        direct = self._timeline is None
        self.fetch_started = self._consumer.fetch_started if direct else self._fetch_started_on_device
        self.fetch_finished = self._consumer.fetch_finished if direct else self._fetch_finished_on_device
        self.step_started = self._consumer.step_started if direct else self._step_started_on_device

    def _fetch_started_on_device(self, now: float) -> None:
        self._consumer.fetch_started(now)
        self._device(DeviceTimeline.fetch_started)

    def _fetch_finished_on_device(self, now: float) -> None:
        self._device(DeviceTimeline.fetch_finished)
        self._consumer.fetch_finished(now)

    def _step_started_on_device(self, now: float) -> None:
        self._device(DeviceTimeline.batch_on_device)
        self._consumer.step_started(now)

    @property
    def on_device_timeline(self) -> bool:
        """Whether the accelerator's timeline is read: it needs :meth:`step_started` and :meth:`step_ended`
        on every step."""
        return self._timeline is not None

    def step_ended(self) -> None:
        """The step's work was launched (call first, before anything that may wait for the device)."""
        if self._timeline is not None:
            self._device(DeviceTimeline.step_ended)

    def break_chain(self) -> None:
        """Something that is not the training loop runs next (validation, the epoch's end)."""
        if self._timeline is not None:
            self._device(DeviceTimeline.break_chain)

    def exclude(self, seconds: float) -> None:
        """Time inside the current step that is not training (a validation run)."""
        self._consumer.exclude(seconds)

    def close_step(self, now: float) -> None:
        """End the open step (the epoch ended)."""
        self._consumer.close_step(now)

    def measure_batch(self, batch: Any) -> None:
        """Size a batch in host memory (for the memory budget)."""
        size, tensors = batch_layout(batch)
        if size:
            self.batch_bytes, self.batch_tensors = size, tensors

    def _epoch_started(self, seconds: float) -> None:
        self._epoch_start_s.append(seconds)
        self._iter_s = seconds
        self._iterator_mark = self.mark()

    def _startup_observed(self, waited_s: float, started_s: float) -> None:
        self._worker_starts += 1
        self._worker_start_s = started_s
        if self._epoch_start_s:
            self._epoch_start_s[-1] += waited_s

    # -- the loader ------------------------------------------------------------------------------------

    @property
    def loader(self) -> Any:
        """The instrumented train loader, or ``None``."""
        return self._loader

    def attach(self, loaders: list[Any]) -> str | None:
        """Instrument the train loader; returns why the producer side cannot be measured, or ``None``."""
        if len(loaders) == 1 and loaders[0] is self._loader:
            return None
        self.detach()
        self._several = tuple(settings_of(loader) for loader in loaders) if len(loaders) > 1 else ()
        if len(loaders) != 1:
            return not_one_loader(loaders)
        loader = loaders[0]
        reason = instrument(loader, self._probe)
        self.settings = settings_of(loader)
        if reason is not None:
            return reason
        self._loader = loader
        self.producer_instrumented = True
        self._consumer.produced_on_demand = self.settings.num_workers == 0
        return None

    @property
    def loaders_settings(self) -> tuple[LoaderSettings, ...]:
        """The settings of every train loader the trainer iterates (of one: :attr:`settings`, as it runs)."""
        return self._several or (self.settings,)

    def detach(self) -> None:
        """Give the loader back its own class."""
        if self._loader is not None:
            restore(self._loader)
            self._loader = None
        self.producer_instrumented = False
        self._consumer.produced_on_demand = False
        self._in_process(False)

    def _in_process(self, timed_by_loop: bool) -> None:
        # Without workers the loop's fetch makes the batch: the consumer's timing of it is the production's.
        self._producer.made_by_loop(self._consumer if timed_by_loop else None)

    def _fetch_open(self) -> bool:
        return self._consumer.fetch_open

    def fetch_timing_lost(self) -> None:
        """The loop's fetches are no longer timed (the adapter stopped calling :attr:`fetch_started`): a batch
        made in process is timed inside the loader again."""
        self._probe.fetch_timing_lost()

    def loader_changed(self, loader: Any) -> None:
        """The loader's settings changed in place: the windows start afresh for the new settings."""
        before, self.settings = self.settings, settings_of(loader)
        self._consumer.produced_on_demand = self.producer_instrumented and self.settings.num_workers == 0
        if self.settings != before and self.on_settings_changed is not None:
            self.on_settings_changed(before)
        # The switch restarts the workers between two steps: that gap is not the loop's.
        self.break_chain()
        self.reset()

    # -- the device ------------------------------------------------------------------------------------

    def attach_device(self, new_event: Callable[[], DeviceEvent] | None) -> None:
        """Read the accelerator's own timeline through ``new_event`` (``None``: there is none)."""
        self._timeline = DeviceTimeline(new_event, self.window) if new_event is not None else None
        self._bind_updates()

    def _device(self, call: Callable[[DeviceTimeline], Any]) -> None:
        timeline = self._timeline
        if timeline is not None and self._guarded(DEVICE_TIMELINE, _ran, call, timeline) is None:
            self._timeline = None  # failed: the host's figures stand alone from now on

    def _worker_pids(self) -> list[int] | None:
        return self._probe.worker_pids() if self._loader is not None else None

    def sample_cpu(self) -> None:
        """Read the host's CPU use (at the start of fit, and with each rolling snapshot)."""
        self._cpu_use = self._guarded(_CPU, self._cpu.sample) or self._cpu_use

    def _cpu_reading(self) -> CpuReading | None:
        return self._guarded(_CPU, self._cpu.reading)

    def _cpu_since(self, start: CpuReading | None) -> CpuUse | None:
        """The cores used since ``start``, where it was read and lies ``MIN_WINDOW_S`` back or more."""
        return None if start is None else self._guarded(_CPU, self._cpu.use_since, start)

    def _device_records(self) -> list[DeviceStep]:
        self._device(DeviceTimeline.poll)
        return self._timeline.records() if self._timeline is not None else []

    # -- snapshot --------------------------------------------------------------------------------------

    def mark(self) -> WindowMark:
        """The start of a window for :meth:`snapshot` ``(since=...)``."""
        producer = self._producer
        producer.poll()
        return WindowMark(
            time.perf_counter(),
            self._consumer.total_steps,
            producer.total_batches,
            producer.entered,
            self._cpu_reading(),
        )

    def snapshot(self, since: WindowMark | None = None) -> WindowSnapshot:
        """This process's measurements: over the rolling window, or over the steps completed since ``since``.

        With ``since`` the producer's figures are the batches made since then (``batches_made`` counts them),
        so a buffer that drains during the window does not pass for production, and the cores used are those
        since then (where it lies ``MIN_WINDOW_S`` back or more, else the latest rolling window's).
        """
        producer = self._producer
        producer.poll()
        consumer = self._consumer
        last = None if since is None else max(0, min(consumer.window_steps, consumer.total_steps - since.steps))
        steps = consumer.columns(last)
        count = len(steps.wait_s)
        metered = self.producer_instrumented
        durations, cpu, queued = producer.durations(), producer.cpu_durations(), producer.queued_durations()
        made: int | None = None
        if since is not None:
            made = producer.total_batches - since.batches
            keep = len(durations) - min(len(durations), max(0, producer.entered - since.entered))
            durations, cpu, queued = durations[keep:], cpu[keep:], queued[keep:]
        device = self._device_records()
        cpu_use = None
        if since is None:
            self.sample_cpu()
        else:
            cpu_use = self._cpu_since(since.cpu)
            # The device's steps are read a step or two behind the host's; with under half of them the window
            # stays on the host's clock.
            device = device[-count:] if count else []
            device = device if len(device) >= count / 2 else []
        ready = tuple(filter(_known, steps.ready))
        # Levels are unknown at an epoch's tail (the sampler is spent): the trend is judged on the rest.
        levels = tuple(filter(_known, steps.buffer_level))
        return WindowSnapshot(
            wait_s=steps.wait_s,
            step_s=steps.step_s,
            transfer_s=steps.transfer_s,
            wait_queued_s=steps.queued_s,
            settings=self.settings,
            # A rolling window may take a reading of memory up to a second old; a probe's is read anew.
            host=host_facts(self.processes_on_host, max_age_s=MEMORY_REREAD_S if since is None else 0.0),
            ready=ready if len(ready) == count and ready else None,
            buffer_level=levels if len(levels) >= count // 2 and levels else None,
            production_s=durations if metered else (),
            production_cpu_s=cpu if metered else (),
            production_queued_s=queued if metered else (),
            producer_rate=producer.capacity() if metered and since is None else None,
            epoch_start_s=tuple(self._epoch_start_s),
            batch_bytes=self.batch_bytes,
            batch_tensors=self.batch_tensors,
            sharing_strategy=sharing_strategy(),
            producer_instrumented=metered,
            batches_made=made if metered else None,
            device_step_s=tuple(r.step_s for r in device),
            device_data_idle_s=tuple(r.data_idle_s for r in device),
            device_loop_idle_s=tuple(r.loop_idle_s for r in device),
            device_copy_s=tuple(r.copy_s for r in device),
            cpu=cpu_use or self._cpu_use,
            accelerator=self.accelerator,
        )

    def reset(self) -> None:
        """Forget the rolling window (lifetime totals are kept)."""
        self._consumer.clear()
        if self._timeline is not None:
            self._timeline.clear()

    # -- lifetime totals -------------------------------------------------------------------------------

    @property
    def epoch_start_s(self) -> tuple[float, ...]:
        """Iterator start-up times of recent epochs."""
        return tuple(self._epoch_start_s)

    @property
    def worker_starts(self) -> tuple[int, float]:
        """How many iterators' workers were seen to finish starting, and the latest one's seconds from
        ``iter()``'s return to its last worker's start (time ``iter()`` does not hold: the workers start in
        the background, and an epoch's first fetch waits for them)."""
        return self._worker_starts, self._worker_start_s

    @property
    def iterator_mark(self) -> WindowMark | None:
        """Where the latest ``iter(loader)`` (an epoch's start) left the meters, for :meth:`snapshot`."""
        return self._iterator_mark

    @property
    def iter_s(self) -> float:
        """Seconds the latest ``iter(loader)`` took (forking its workers)."""
        return self._iter_s

    @property
    def total_steps(self) -> int:
        return self._consumer.total_steps

    @property
    def last_period_s(self) -> float:
        """The latest completed step's period, 0 before the first."""
        return self._consumer.last_period_s

    @property
    def total_wait_s(self) -> float:
        return self._consumer.total_wait_s

    @property
    def total_step_s(self) -> float:
        return self._consumer.total_step_s

    @property
    def total_batches_made(self) -> int:
        return self._producer.total_batches

    @property
    def total_busy_s(self) -> float:
        return self._producer.total_busy_s


_known = partial(operator.is_not, None)


def _unguarded(what: str, fn: Callable[..., Any], *args: Any) -> Any:
    return fn(*args)


def _ran(call: Callable[[DeviceTimeline], Any], timeline: DeviceTimeline) -> bool:
    call(timeline)
    return True
