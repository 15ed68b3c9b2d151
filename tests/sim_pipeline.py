"""A simulated training pipeline: torch's DataLoader and a training loop sharing a host's cores.

A test instrument for the tuner, written apart from :mod:`lightning_loadguard.model` (no Little's law, no
buffer replay): a discrete-event model of the loader as it runs, whose steady rates are the ground truth the
tuner's choices are scored against.

The loader, as torch runs it:

- batches go to the workers round robin and reach the loop in order; at most ``prefetch_factor`` batches per
  worker are outstanding (an index is handed out when the loop takes a batch); the sampler's epoch ends the
  hand-out;
- a new iterator forks its workers (CPU in the main process, per worker), each worker then starts up (its own
  CPU) before its first batch, and for a while after a restart batches cost more (caches, page faults: the
  loader settles);
- the main process takes each batch from its worker (the hand-over: CPU in the main process);
- ``persistent_workers`` keeps the workers across epochs; without it each epoch starts them again.

A batch costs waiting (I/O: no core) then CPU work, each drawn from a :class:`Cost` (constant, lognormal,
bursty, heavy-tailed). Cores are shared by processor sharing among every runnable thread: the busy workers'
CPU phases, the loop's threads (a step computing on the CPU with ``step_threads`` threads, the hand-over, an
in-process fetch) and other processes (``Host.others`` busy threads, plus a background load that changes at
random times: the noise). A step either computes on the CPU or waits on an accelerator (``device_s``, a
deadline from the step's start, as an asynchronous device runs beside the host's launches). A slow drift
scales every cost.

It cuts the same :class:`~lightning_loadguard.meters.window.WindowSnapshot` the monitor cuts (waits and steps
per step, per-batch busy, CPU and queued time of the producer, batches made in the window, whether each batch
was made when fetched, the loop's wait for a core), so the planner runs unchanged against it
(:func:`tune`).
"""

from __future__ import annotations

import heapq
import math
import random
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field, replace

from lightning_loadguard.meters.cpu import CpuUse
from lightning_loadguard.meters.settings import LoaderSettings
from lightning_loadguard.meters.window import HostFacts, WindowSnapshot
from lightning_loadguard.tuning.decision import TuneDecision
from lightning_loadguard.tuning.options import TuneOptions
from lightning_loadguard.tuning.planner import Planner
from lightning_loadguard.tuning.reach import span_choices, spanning_planner, tuner_budget

COST_KINDS = ("constant", "lognormal", "bursty", "pareto", "empirical")


@dataclass(frozen=True)
class Cost:
    """A per-batch cost in seconds.

    ``constant``: ``mean`` each. ``lognormal``: mean ``mean``, log-sd ``spread``. ``bursty``: ``mean``, and
    ``spread`` seconds more for a share ``burst`` of the batches. ``pareto``: heavy-tailed with mean ``mean``
    and tail index ``spread`` (> 1; smaller is heavier). ``empirical``: drawn from measured ``values``.
    """

    mean: float = 0.0
    kind: str = "constant"
    spread: float = 0.0
    burst: float = 0.0
    values: tuple[float, ...] = ()

    def __post_init__(self) -> None:
        if self.kind not in COST_KINDS:
            raise ValueError(f"Cost.kind must be one of {COST_KINDS}, got {self.kind!r}")
        if self.kind == "pareto" and self.spread <= 1:
            raise ValueError(f"a pareto Cost needs spread (tail index) > 1, got {self.spread!r}")

    @property
    def expected(self) -> float:
        if self.kind == "empirical":
            return math.fsum(self.values) / len(self.values)
        return self.mean + (self.spread * self.burst if self.kind == "bursty" else 0.0)

    def sampler(self, rng: random.Random) -> Callable[[], float]:
        mean, spread = self.mean, self.spread
        if self.kind == "empirical":
            values = self.values
            return lambda: rng.choice(values)
        if mean <= 0 and self.kind != "bursty":
            return lambda: 0.0
        if self.kind == "lognormal":
            mu = math.log(mean) - spread * spread / 2
            return lambda: rng.lognormvariate(mu, spread)
        if self.kind == "bursty":
            burst = self.burst
            return lambda: mean + (spread if rng.random() < burst else 0.0)
        if self.kind == "pareto":
            scale = mean * (spread - 1) / spread
            return lambda: scale * rng.paretovariate(spread)
        return lambda: mean


@dataclass(frozen=True)
class Host:
    """The host the pipeline shares.

    Attributes:
        cores: cores this training process may use.
        others: threads of other processes that keep computing.
        background: mean threads of a background load that changes at random times (other users' work): the
            noise of a shared host. Each change draws a new level from an exponential with this mean.
        background_interval_s: mean time between changes of the background load.
        drift: relative amplitude of a slow sinusoidal drift of every cost.
        drift_period_s: its period.
    """

    cores: int
    others: float = 0.0
    background: float = 0.0
    background_interval_s: float = 0.2
    drift: float = 0.0
    drift_period_s: float = 30.0


@dataclass(frozen=True)
class SimPipeline:
    """A pipeline: the loader's per-batch costs, the loop's step, the host, the user's settings, the epoch.

    Attributes:
        io: per batch, the producer's wait (I/O: it takes no core).
        cpu: per batch, the producer's CPU work (fetch, transforms, collate).
        step_cpu_s: per step, the loop's CPU work (the framework's own, and a CPU step's compute).
        step_threads: threads that CPU work runs on (torch's intra-op pool for a CPU step).
        device_s: per step, the accelerator's time (0: the step computes on the CPU).
        after_cpu_s: per step, the loop's CPU work after the step (its bookkeeping before the next fetch).
        handover_s: main-process CPU to take one batch from a worker.
        handover_wait_s: of taking a batch from a worker, the wait beside that CPU (no core: the round trip for
            each tensor's descriptor to the worker's sharer thread).
        worker_extra_s: per batch made in a worker, its CPU beyond making it in the loop (sending it: pickling
            into shared memory on the worker's queue thread).
        fork_s: main-process CPU per worker a new iterator starts; start_s: each worker's own start-up CPU.
        settle: a restarted loader's extra cost share, decaying with ``settle_s``.
    """

    name: str
    family: str
    host: Host
    io: Cost = Cost()
    cpu: Cost = Cost()
    step_cpu_s: float = 0.001
    step_threads: float = 1.0
    device_s: float = 0.0
    after_cpu_s: float = 0.0
    handover_s: float = 0.0003
    handover_wait_s: float = 0.0
    worker_extra_s: float = 0.0
    fork_s: float = 0.003
    start_s: float = 0.02
    settle: float = 0.0
    settle_s: float = 1.0
    user: LoaderSettings = field(default_factory=LoaderSettings)
    epoch_steps: int = 600
    max_epochs: int | None = None
    batch_bytes: int | None = None
    ram_bytes: int | None = None
    shm_bytes: int | None = None
    max_workers: int | None = None

    def quiet(self) -> SimPipeline:
        """The same pipeline without drift (its steady state)."""
        return replace(self, host=replace(self.host, drift=0.0))


_IO, _BG, _DEVICE = 0, 1, 2
_INIT, _BATCH = 0, 1


class Sim:
    """One training process running ``pipeline`` under ``settings``; :meth:`run` advances it by steps.

    Example:
        >>> p = SimPipeline("io", "io_bound", Host(cores=4), io=Cost(0.02), device_s=0.01)
        >>> sim = Sim(p, LoaderSettings(4, 2), seed=0)
        >>> sim.run(200); round(sim.rate_since(100), 1)  # 4 workers make 200 batches/s: the loop sets the rate,
        97.1
        >>> round(1 / (0.01 + p.handover_s), 1)  # a 10 ms step and the 0.3 ms hand-over of each batch
        97.1
    """

    def __init__(self, pipeline: SimPipeline, settings: LoaderSettings, seed: int = 0) -> None:
        self.p = pipeline
        # One stream per source of chance: two settings run with one seed see the same background load at the
        # same times and the same sequence of costs (common random numbers: their difference is less noisy). None
        # is random.Random(seed), the stream sim_sweep.generate(seed) draws the pipeline from: the drift's phase
        # drawn from it followed the pipeline's core count (both read its first word).
        self._load_rng = random.Random(seed * 7919 + 1)
        self._io = pipeline.io.sampler(random.Random(seed * 7919 + 2))
        self._cpu = pipeline.cpu.sampler(random.Random(seed * 7919 + 3))
        host = pipeline.host
        self.cores = float(host.cores)
        self._drift_phase = random.Random(seed * 7919 + 4).uniform(0, 2 * math.pi)
        self.now = 0.0
        self._vt = 0.0  # the virtual time: CPU seconds one runnable worker thread has received
        self._seq = 0
        self._cpu_heap: list[tuple[float, int, int, int, int]] = []
        self._timed: list[tuple[float, int, int, int, int]] = []
        self._workers_on_cpu = 0
        self._background = 0.0
        self._main_threads = 0.0
        self._main_left = 0.0
        self._main_waiting: int | None = None  # batch index the loop waits for
        self.settings = settings
        self._gen = 0
        self._restarted_at = 0.0
        # per step
        self.wait_s: list[float] = []
        self.start_wait_s: list[float] = []  # each step's wait for its workers' start, kept out of ``wait_s``
        self.step_s: list[float] = []
        self.ready: list[bool | None] = []
        self.queued_s: list[float] = []
        self.step_end: list[float] = []
        # CPU-seconds received so far by the loop's threads, the workers and other work (the host's other
        # processes and its background load), and their totals at each step's end: what psutil reads live.
        self._cpu_used = [0.0, 0.0, 0.0]
        self.cpu_at_end: list[tuple[float, ...]] = []
        # per batch made, in completion order
        self.made_at: list[float] = []
        self.made_busy: list[float] = []
        self.made_cpu: list[float] = []
        self.made_queued: list[float] = []
        self._made: set[int] = set()
        self.consumed = 0  # batches the loop took (global index of the next one)
        self.epoch = 0
        self.startup_s = 0.0
        if host.background > 0:
            self._schedule(0.0, _BG)
        self._main = self._loop()
        self._target = 0
        self._pending_restart: LoaderSettings | None = settings
        self._request: tuple = next(self._main)

    # -- public -----------------------------------------------------------------------------------------

    def run(self, steps: int) -> None:
        """Advance by ``steps`` training steps."""
        self._target = self.consumed + steps
        self._serve()

    def switch(self, settings: LoaderSettings) -> None:
        """A new iterator with ``settings`` from the next step on (the tuner's restart at the loop's position)."""
        self._pending_restart = settings

    def rate_since(self, step: int) -> float:
        """Steps per second from the end of step ``step - 1`` to the last step."""
        start = self.step_end[step - 1] if step > 0 else 0.0
        return (len(self.step_end) - step) / (self.step_end[-1] - start)

    def window(self, first_step: int, cpu_count: int | None = None) -> WindowSnapshot:
        """The monitor's window over the steps from ``first_step`` to the last."""
        p = self.p
        t0 = self.step_end[first_step - 1] if first_step > 0 else 0.0
        t1 = self.step_end[-1]
        lo = _bisect(self.made_at, t0)
        hi = _bisect(self.made_at, t1)
        settings = self.settings
        ready = tuple(self.ready[first_step:])
        return WindowSnapshot(
            wait_s=tuple(self.wait_s[first_step:]),
            step_s=tuple(self.step_s[first_step:]),
            settings=settings,
            host=HostFacts(
                cpu_count=cpu_count or p.host.cores,
                available_ram_bytes=p.ram_bytes,
                shm_free_bytes=p.shm_bytes,
            ),
            wait_queued_s=tuple(self.queued_s[first_step:]),
            ready=None if settings.num_workers == 0 else ready,  # type: ignore[arg-type]
            production_s=tuple(self.made_busy[lo:hi]),
            production_cpu_s=tuple(self.made_cpu[lo:hi]),
            production_queued_s=tuple(self.made_queued[lo:hi]),
            batch_bytes=p.batch_bytes,
            batches_made=hi - lo,
            cpu=self._cpu_use(first_step, t0, cpu_count or p.host.cores),
        )

    def _cpu_use(self, first_step: int, t0: float, cores: int) -> CpuUse | None:
        """Cores used over the steps from ``first_step`` (whose window starts at ``t0``) to the last, as the monitor's
        CPU meter reads them."""
        span = self.step_end[-1] - t0
        if span <= 0:
            return None
        start = self.cpu_at_end[first_step - 1] if first_step > 0 else (0.0, 0.0, 0.0)
        loop, workers, others = (b - a for a, b in zip(start, self.cpu_at_end[-1], strict=True))
        return CpuUse(span, float(cores), cores, loop / span, workers / span, (loop + workers + others) / span)

    # -- the event loop -----------------------------------------------------------------------------------

    def _schedule(self, at: float, kind: int, a: int = 0, b: int = 0) -> None:
        self._seq += 1
        heapq.heappush(self._timed, (at, self._seq, kind, a, b))

    def _share(self) -> float:
        runnable = self._workers_on_cpu + self._main_threads + self.p.host.others + self._background
        return 1.0 if runnable <= self.cores else self.cores / runnable

    def _drift(self) -> float:
        host = self.p.host
        if not host.drift:
            return 1.0
        return 1.0 + host.drift * math.sin(2 * math.pi * self.now / host.drift_period_s + self._drift_phase)

    def _serve(self) -> None:
        """Run events until the loop has finished its target step."""
        while True:
            req = self._request
            kind = req[0]
            if kind == "cpu":
                self._main_threads, self._main_left = req[2], req[1]
                self._advance_until_main_cpu()
            elif kind == "until":
                self._advance_until(req[1])
            elif kind == "batch":
                self._main_waiting = req[1]
                while req[1] not in self._made:
                    self._event()
                self._main_waiting = None
            elif kind == "pause" and self.consumed >= self._target:
                return
            self._request = self._main.send(None)

    def _advance_until_main_cpu(self) -> None:
        while self._main_left > 1e-12:
            self._event(main=True)
        self._main_threads = 0.0
        self._main_left = 0.0

    def _advance_until(self, at: float) -> None:
        self._schedule(at, _DEVICE)
        self._device_done = False
        while not self._device_done:
            self._event()

    def _event(self, main: bool = False) -> None:
        """Advance to the next event and handle it."""
        share = self._share()
        heap = self._cpu_heap
        gen = self._gen
        while heap and heap[0][3] != gen:
            heapq.heappop(heap)
        t = math.inf
        which = 0
        if heap:
            t = self.now + (heap[0][0] - self._vt) / share
            which = 1
        if main:
            tm = self.now + self._main_left / (self._main_threads * share)
            if tm <= t:
                t, which = tm, 2
        if self._timed and self._timed[0][0] < t:
            t, which = self._timed[0][0], 3
        if t == math.inf:
            raise RuntimeError("the simulated loop waits for nothing that can happen")
        dt = t - self.now
        if dt > 0:
            self._vt += share * dt
            used = self._cpu_used
            used[0] += self._main_threads * share * dt
            used[1] += self._workers_on_cpu * share * dt
            used[2] += (self.p.host.others + self._background) * share * dt
            if main:
                self._main_left -= self._main_threads * share * dt
            self.now = t
        if which == 1:
            _, _, slot, _, job = heapq.heappop(heap)
            self._workers_on_cpu -= 1
            if job == _BATCH:
                self._batch_made(slot)
            else:
                self._worker_ready[slot] = True
                self._ready_at = self.now
                self._worker_next(slot)
        elif which == 2:
            self._main_left = 0.0
        elif which == 3:
            _, _, kind, a, b = heapq.heappop(self._timed)
            if kind == _IO:
                if b == self._gen:
                    self._on_cpu(a, self._batch_cpu[a], _BATCH)
            elif kind == _BG:
                host = self.p.host
                self._background = self._load_rng.expovariate(1.0 / host.background)
                self._schedule(self.now + self._load_rng.expovariate(1.0 / host.background_interval_s), _BG)
            else:
                self._device_done = True

    # -- workers ------------------------------------------------------------------------------------------

    def _on_cpu(self, slot: int, work: float, job: int) -> None:
        self._workers_on_cpu += 1
        self._seq += 1
        heapq.heappush(self._cpu_heap, (self._vt + work, self._seq, slot, self._gen, job))

    def _start_workers(self, settings: LoaderSettings) -> None:
        self._gen += 1
        self._workers_on_cpu = 0
        self.settings = settings
        self._restarted_at = self.now
        workers = settings.num_workers
        self._queues: list[deque[int]] = [deque() for _ in range(workers)]
        self._worker_ready = [False] * workers
        self._busy_batch = [-1] * workers
        self._batch_start = [0.0] * workers
        self._batch_cpu = [0.0] * workers
        self._batch_io = [0.0] * workers
        self._made = {i for i in self._made if i < self.consumed}
        self._first = self.consumed  # round robin from this batch
        self._handed = self.consumed
        self._ready_at = -1.0  # when the latest worker finished starting
        self._first_fetch = True
        for slot in range(workers):
            self._on_cpu(slot, self.p.start_s, _INIT)
        for _ in range(workers * settings.prefetch):
            self._hand_out()

    def _epoch_end(self) -> int:
        # The loop's epoch, not the one the batches taken so far reach: the take of an epoch's last batch must
        # not hand the next epoch's first index to a worker before the loop starts that epoch.
        return (self.epoch + 1) * self.p.epoch_steps

    def _hand_out(self) -> None:
        """The next index to its worker, within the epoch."""
        index = self._handed
        if index >= self._epoch_end():
            return
        self._handed += 1
        slot = (index - self._first) % self.settings.num_workers
        self._queues[slot].append(index)
        if self._worker_ready[slot] and self._busy_batch[slot] < 0:
            self._worker_next(slot)

    def _settling(self) -> float:
        if not self.p.settle:
            return 1.0
        return 1.0 + self.p.settle * math.exp(-(self.now - self._restarted_at) / self.p.settle_s)

    def _worker_next(self, slot: int) -> None:
        queue = self._queues[slot]
        if not queue:
            self._busy_batch[slot] = -1
            return
        index = queue.popleft()
        factor = self._drift() * self._settling()
        self._busy_batch[slot] = index
        self._batch_start[slot] = self.now
        io = self._io() * factor
        cpu = self._cpu() * factor + self.p.worker_extra_s
        self._batch_cpu[slot] = cpu
        self._batch_io[slot] = io
        if io > 0:
            self._schedule(self.now + io, _IO, slot, self._gen)
        else:
            self._on_cpu(slot, cpu, _BATCH)

    def _batch_made(self, slot: int) -> None:
        index = self._busy_batch[slot]
        self._made.add(index)
        busy = self.now - self._batch_start[slot]
        cpu = self._batch_cpu[slot]
        self.made_at.append(self.now)
        self.made_busy.append(busy)
        self.made_cpu.append(cpu)
        self.made_queued.append(max(0.0, busy - self._batch_io[slot] - cpu))
        self._worker_next(slot)

    # -- the training loop --------------------------------------------------------------------------------

    def _loop(self):
        while True:
            # Read at each step: a host change swaps ``self.p`` mid-run (a step that got faster or slower).
            p = self.p
            step_cpu, threads, device, after = p.step_cpu_s, p.step_threads, p.device_s, p.after_cpu_s
            epoch = self.consumed // p.epoch_steps
            if epoch != self.epoch:
                # The epoch's end: without persistent workers the next epoch starts its own; persistent ones
                # are handed the new epoch's first indices, round robin from the first worker again.
                self.epoch = epoch
                if self.settings.num_workers and not self.settings.persistent_workers:
                    self._pending_restart = self._pending_restart or self.settings
                elif self.settings.num_workers:
                    self._first = self.consumed
                    for _ in range(self.settings.num_workers * self.settings.prefetch):
                        self._hand_out()
            if self._pending_restart is not None:
                settings, self._pending_restart = self._pending_restart, None
                started = self.now
                if self.settings.num_workers or settings.num_workers:
                    yield ("cpu", p.fork_s * (settings.num_workers + self.settings.num_workers), 1.0)
                self.startup_s = self.now - started
                self._start_workers(settings)
            t0 = self.now
            queued = 0.0
            start_wait = 0.0  # the first fetch's wait for its workers' start: the epoch's start, not data wait
            if self.settings.num_workers == 0:
                factor = self._drift()
                io = self._io() * factor
                cpu = self._cpu() * factor
                if io > 0:
                    yield ("until", self.now + io)
                tc = self.now
                if cpu > 0:
                    yield ("cpu", cpu, 1.0)
                queued = max(0.0, self.now - tc - cpu)
                ready: bool | None = None
                self.made_at.append(self.now)
                self.made_busy.append(self.now - t0)
                self.made_cpu.append(cpu)
                self.made_queued.append(queued)
            else:
                index = self.consumed
                ready = index in self._made
                if not ready:
                    yield ("batch", index)
                if self._first_fetch:
                    # As the loader probe measures it: from the workers' start to the last one's being ready.
                    self._first_fetch = False
                    self.startup_s += max(0.0, self._ready_at - t0)
                    start_wait = min(max(0.0, self._ready_at - t0), self.now - t0)
                if p.handover_wait_s > 0:
                    yield ("until", self.now + p.handover_wait_s)
                th = self.now
                yield ("cpu", p.handover_s, 1.0)
                queued = max(0.0, self.now - th - p.handover_s)
                self._made.discard(index)
            self.consumed += 1
            if self.settings.num_workers:
                self._hand_out()
            wait = self.now - t0 - start_wait
            ts = self.now
            if step_cpu > 0:
                yield ("cpu", step_cpu * self._drift(), threads)
            if device > 0 and self.now < ts + device:
                yield ("until", ts + device)
            if after > 0:
                yield ("cpu", after, 1.0)
            self.wait_s.append(wait)
            self.start_wait_s.append(start_wait)
            self.step_s.append(self.now - ts)
            self.ready.append(ready)
            self.queued_s.append(queued)
            self.step_end.append(self.now)
            self.cpu_at_end.append(tuple(self._cpu_used))
            yield ("pause",)

    _worker_ready: list[bool] = []
    _batch_cpu: list[float] = []


def _bisect(values: list[float], x: float) -> int:
    """Index of the first value > ``x`` in sorted ``values``."""
    lo, hi = 0, len(values)
    while lo < hi:
        mid = (lo + hi) // 2
        if values[mid] <= x:
            lo = mid + 1
        else:
            hi = mid
    return lo


# -- ground truth ------------------------------------------------------------------------------------------


def settled(pipeline: SimPipeline, settings: LoaderSettings, *, seed: int = 1) -> Sim:
    """A simulation of ``settings`` run past its workers' start and first fill, inside one endless epoch (no
    epoch's end restarts the workers later on)."""
    sim = Sim(replace(pipeline, epoch_steps=10**9), settings, seed=seed)
    sim.run(20 + 2 * settings.batches_in_flight)
    return sim


def steady_rate(pipeline: SimPipeline, settings: LoaderSettings, *, steps: int = 600, seed: int = 1) -> float:
    """Steps per second of ``settings`` in the steady state: a long run within one epoch, without drift,
    after the workers started and the buffer filled (the background load, a stationary noise, stays)."""
    sim = settled(pipeline.quiet(), settings, seed=seed)
    warm = sim.consumed
    sim.run(steps)
    return sim.rate_since(warm)


def epoch_rate(
    pipeline: SimPipeline,
    settings: LoaderSettings,
    *,
    steps: int = 600,
    seed: int = 1,
    steady: Callable[[], float] | None = None,
) -> float:
    """Steps per second of ``settings`` over an epoch as training runs it, past the fit's first: its start (the
    workers started again, or persistent ones handed the new epoch with their queues empty), the buffer's fill,
    then the steady state. An epoch of at most ``steps`` steps is simulated whole, enough of them for ``steps``
    steps; of a longer one the first ``steps`` steps are, and the rest runs at :func:`steady_rate` (or at what
    ``steady`` returns: the steady rate of ``settings`` known already).

    Example:
        >>> p = SimPipeline("io", "io_bound", Host(cores=8), io=Cost(0.2), device_s=0.01, epoch_steps=40)
        >>> steady, fresh = steady_rate(p, LoaderSettings(40, 2)), epoch_rate(p, LoaderSettings(40, 2))
        >>> round(steady), fresh < 0.75 * steady  # a 200 ms read at each 40-step epoch's start: a fifth of it
        (97, True)
    """
    head = min(pipeline.epoch_steps, steps)
    sim = Sim(replace(pipeline.quiet(), epoch_steps=head), settings, seed=seed)
    sim.run(head)
    epochs = -(-steps // head)
    start = sim.consumed
    sim.run(epochs * head)
    epoch_s = head / sim.rate_since(start)
    rest = pipeline.epoch_steps - head
    if rest:
        rate = steady() if steady else steady_rate(pipeline, settings, steps=steps, seed=seed)
        epoch_s += rest / rate
    return pipeline.epoch_steps / epoch_s


# -- the tuner against the simulator -----------------------------------------------------------------------


@dataclass(frozen=True)
class Tuned:
    """A tuning run on the simulator: the decision, and the steps and time it spanned."""

    decision: TuneDecision | None
    chosen: LoaderSettings
    steps: int
    windows: int


PlannerFactory = Callable[..., Planner]


def tune(
    pipeline: SimPipeline,
    options: TuneOptions | None = None,
    *,
    seed: int = 0,
    planner: PlannerFactory = Planner,
) -> Tuned:
    """The planner driven as :class:`~lightning_loadguard.tuning.session.TuningSession` drives it, on the
    simulated pipeline from the fit's start: the user's settings first, the probing spanning the fewest epochs
    whose budget holds enough candidates (:func:`drive`)."""
    return tune_sim(pipeline, options, seed=seed, planner=planner)[0]


def tune_sim(
    pipeline: SimPipeline,
    options: TuneOptions | None = None,
    *,
    seed: int = 0,
    planner: PlannerFactory = Planner,
) -> tuple[Tuned, Sim, Planner]:
    """:func:`tune`, the simulation it ran (at the decision, the last setting probed still running) and the
    planner that decided."""
    options = options or TuneOptions(max_workers=pipeline.max_workers)
    user = pipeline.user
    sim = Sim(pipeline, user, seed=seed)
    first = WindowSnapshot(
        wait_s=(),
        step_s=(),
        host=HostFacts(pipeline.host.cores, available_ram_bytes=pipeline.ram_bytes, shm_free_bytes=pipeline.shm_bytes),
    )
    budget = tuner_budget(first, options)
    epoch_steps = pipeline.epoch_steps

    def make(span: int) -> Planner:
        return planner(user, budget, options, epoch_steps, span_epochs=span)

    plan = spanning_planner(make, span_choices(pipeline.max_epochs))
    if not plan.can_start():
        return Tuned(None, user, 0, 0), sim, plan
    return drive(sim, plan, options), sim, plan


def drive(sim: Sim, plan: Planner, options: TuneOptions) -> Tuned:
    """Drive ``plan`` on ``sim`` from where it runs ``plan.original``, as the session drives it: windows cut after
    each setting's warm-up, the host budget re-read from the latest window, a restart for every setting not
    measured again as it runs, an open window dropped at an epoch's end, the decision at the end of the probing
    span (the end of the ``plan.span_epochs``-th epoch from the one it starts in: a re-tune's planner, sized to the
    rest of that epoch, may start mid-epoch) or where the planner has nothing left to measure."""
    epoch_steps = sim.p.epoch_steps
    start = sim.consumed
    span_end = (start // epoch_steps + plan.span_epochs) * epoch_steps
    windows = 0
    decision: TuneDecision | None = None
    opened = start  # the step the running iterator's first batch went to (a switch's, or an epoch's start)
    while decision is None:
        warm, steps = plan.warmup_for(plan.current), plan.window_steps
        left = epoch_steps - sim.consumed % epoch_steps
        if warm + steps > left:
            # The window would cross the epoch's end: dropped; probing goes on from the next epoch's start.
            sim.run(left)
            if plan.current != plan.original:
                plan.probe_steps += left
            if sim.consumed >= span_end:
                plan.note_budget_spent()
                decision = plan.decide()
            else:
                following = plan.after_epoch_end()
                if following is None:
                    decision = plan.decide()
                elif following != sim.settings:
                    sim.switch(following)
            opened = sim.consumed  # the next epoch starts its iterator (its workers again, unless persistent)
            continue
        began = sim.step_end[-1] if sim.step_end else 0.0  # the switch, or the previous window's end
        sim.run(warm)
        mark = sim.consumed
        sim.run(steps)
        window = sim.window(mark)
        if window.steps and not window.measured_a_rate and not plan.continuing:
            # As the session: no batch made in the window, so the setting is read over all it ran since its start.
            window = sim.window(opened)
        windows += 1
        plan.budget = tuner_budget(window, options)
        span = sim.step_end[-1] - began if plan.current != plan.original else None
        following = plan.record(window, startup_s=sim.startup_s or None, span_s=span)
        if following is None:
            decision = plan.decide()
        elif not plan.continuing:
            sim.switch(following)
            opened = sim.consumed
    return Tuned(decision, decision.setting, sim.consumed - start, windows)
