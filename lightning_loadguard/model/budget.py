"""The host budget of one training process's loader: how many workers its cores carry, how many batches its
memory holds, and which limit binds.

Every training process on a host runs its own loader, so each gets its share of the host's cores and of the
memory that in-flight batches may claim across the host. The diagnosis (which recommends settings) and the
tuner (which applies them) both ask :func:`host_budget`, so they never disagree on the same measurements.

Inputs: :class:`~lightning_loadguard.meters.window.HostFacts` (cores, processes on the host, available RAM,
free ``/dev/shm``), the measured CPU share of a busy worker and the cores the training loop uses when known
(a window's :class:`~lightning_loadguard.meters.window.WindowSnapshot` carries both), the batch size in bytes
when known.
Output: a :class:`HostBudget`.

Budgets differ in kind: memory is a wall (crossing it kills the run), cores are a hypothesis (the loop's own
threads, the workers and other processes share them); the tuner verifies the core budget by measuring.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Literal

from lightning_loadguard.meters.settings import LoaderSettings
from lightning_loadguard.meters.window import HostFacts, WindowSnapshot
from lightning_loadguard.model.capacity import _count
from lightning_loadguard.model.contention import CoreCheck, check_cores

WorkersBound = Literal["cores", "max_workers"]
MemoryBound = Literal["host_memory", "shm"]

CORES: WorkersBound = "cores"
USER_CAP: WorkersBound = "max_workers"
HOST_MEMORY: MemoryBound = "host_memory"
SHM: MemoryBound = "shm"

LOOP_CORES = 1.0
"""Cores each training process keeps at least for its own loop (the step, collectives, the in-process fetch)."""

MIN_CPU_SHARE = 0.1
"""Workers are never assumed to need less than this share of a core while busy: at most ten workers per
spare core, however little CPU they use while waiting on I/O (each is a process with its own copy of the
dataset objects it touches)."""

RAM_BUDGET_SHARE = 0.5
"""Share of the host's available RAM that in-flight batches of all its processes may claim (tf.data's
autotuner budget)."""

SHM_BUDGET_SHARE = 0.8
"""Share of free ``/dev/shm`` that worker-to-trainer batches may claim; a full shm kills workers."""


@dataclass(frozen=True)
class HostBudget:
    """What one training process's loader may use.

    Attributes:
        max_workers: most loader workers predicted to fit (the cores' budget, or ``max_workers`` asked by the
            user).
        workers_bound: which limit set ``max_workers``: ``"cores"`` or ``"max_workers"``. A core limit is a
            prediction the tuner may verify past (see :meth:`workers_verifiable`); the user's cap is not.
        max_in_flight: most batches the loader may hold at once (``None``: batch size or memory unknown).
        memory_bound: which limit set ``max_in_flight`` (``"host_memory"`` or ``"shm"``), or ``None``.
        memory_bytes: the host-wide bytes that bound applies to, or ``None``.
        user_max_workers: the user's own cap, a wall even past a core limit.
    """

    max_workers: int
    workers_bound: WorkersBound = CORES
    max_in_flight: int | None = None
    memory_bound: MemoryBound | None = None
    memory_bytes: int | None = None
    user_max_workers: int | None = None

    def workers_verifiable(self, num_workers: int) -> bool:
        """Whether ``num_workers`` past :attr:`max_workers` may be measured: only past a predicted core limit,
        never past the user's cap.

        Example:
            >>> HostBudget(max_workers=1, workers_bound="cores", user_max_workers=4).workers_verifiable(2)
            True
            >>> HostBudget(max_workers=2, workers_bound="max_workers").workers_verifiable(3)
            False
        """
        if self.workers_bound != CORES:
            return num_workers <= self.max_workers
        return self.user_max_workers is None or num_workers <= self.user_max_workers

    def breaks_wall(self, settings: LoaderSettings) -> WorkersBound | MemoryBound | None:
        """Like :meth:`allows`, for the limits that may not even be measured: memory and the user's cap.

        Example:
            >>> budget = HostBudget(max_workers=1, max_in_flight=8, memory_bound="shm")
            >>> budget.breaks_wall(LoaderSettings(3, 2)), budget.breaks_wall(LoaderSettings(3, 4))
            (None, 'shm')
        """
        if not self.workers_verifiable(settings.num_workers):
            return self.workers_bound if self.workers_bound != CORES else USER_CAP
        return self._memory(settings)

    def _memory(self, settings: LoaderSettings) -> MemoryBound | None:
        if self.max_in_flight is not None and settings.batches_in_flight > self.max_in_flight:
            return self.memory_bound
        return None

    def allows(self, settings: LoaderSettings) -> WorkersBound | MemoryBound | None:
        """``None`` if the setting fits, else the name of the budget it breaks.

        Example:
            >>> budget = HostBudget(max_workers=3, max_in_flight=8, memory_bound="shm")
            >>> [budget.allows(LoaderSettings(w, p)) for w, p in ((4, 2), (3, 3), (2, 4))]
            ['cores', 'shm', None]
        """
        if settings.num_workers > self.max_workers:
            return self.workers_bound
        return self._memory(settings)

    def deepest_prefetch(self, num_workers: int, ceiling: int, *, pin_memory: bool = False) -> int:
        """The largest ``prefetch_factor`` up to ``ceiling`` that fits the memory budget (0 if none does).

        Example:
            >>> HostBudget(8, max_in_flight=9, memory_bound="shm").deepest_prefetch(2, 8, pin_memory=True)
            4
        """
        if num_workers <= 0 or self.max_in_flight is None:
            return ceiling
        slots = self.max_in_flight - (1 if pin_memory else 0)
        return max(0, min(ceiling, slots // num_workers))


def worker_budget(host: HostFacts, cpu_share: float | None = None, loop_cores: float | None = None) -> int:
    """Loader workers each training process can run without oversubscribing the host's cores.

    Each training process's share of the cores, less what its own loop keeps (``LOOP_CORES``, or more where
    ``loop_cores``, the measured CPU seconds per second of the training process, says its threads use more),
    goes to workers. A worker that spends most of its busy time waiting on I/O (``cpu_share``, its measured
    CPU time over busy time less the time it queued for a core) needs only that share of a core, so more of
    them fit.

    Example:
        >>> worker_budget(HostFacts(cpu_count=32, processes_on_host=4))
        7
        >>> worker_budget(HostFacts(cpu_count=32, processes_on_host=4), cpu_share=0.25)
        28
        >>> worker_budget(HostFacts(cpu_count=32, processes_on_host=4), loop_cores=3.0)  # intra-op threads
        5
    """
    if host.cpu_count < 1:
        raise ValueError(f"host.cpu_count must be >= 1, got {host.cpu_count!r}")
    if cpu_share is not None and not 0.0 <= cpu_share <= 1.0:
        raise ValueError(f"cpu_share must be within 0..1 or None, got {cpu_share!r}")
    if loop_cores is not None and not (math.isfinite(loop_cores) and loop_cores >= 0):
        raise ValueError(f"loop_cores must be a finite number >= 0 or None, got {loop_cores!r}")
    # A loop measured to use less than a core still keeps one: its latency, not its average use, paces the step.
    spare = max(0.0, host.cores_per_process - max(LOOP_CORES, loop_cores or 0.0))
    share = 1.0 if cpu_share is None else max(MIN_CPU_SHARE, cpu_share)
    return math.floor(spare / share + 1e-9)


def memory_limit(
    host: HostFacts,
    *,
    uses_shm: bool = True,
    ram_share: float = RAM_BUDGET_SHARE,
    shm_share: float = SHM_BUDGET_SHARE,
) -> tuple[int, MemoryBound] | None:
    """Host-wide bytes in-flight batches may claim and which memory sets it, or ``None`` when none is known.

    The smaller of ``ram_share`` of available RAM and (for worker processes, whose batches travel through
    ``/dev/shm``) ``shm_share`` of free shm.

    Example:
        >>> memory_limit(HostFacts(cpu_count=8, available_ram_bytes=16_000, shm_free_bytes=4_000))
        (3200, 'shm')
    """
    limits: list[tuple[int, MemoryBound]] = []
    if host.available_ram_bytes is not None:
        limits.append((int(host.available_ram_bytes * ram_share), HOST_MEMORY))
    if uses_shm and host.shm_free_bytes is not None:
        limits.append((int(host.shm_free_bytes * shm_share), SHM))
    return min(limits) if limits else None


def memory_budget(host: HostFacts, *, uses_shm: bool = True) -> int | None:
    """Bytes the host's in-flight batches may claim (see :func:`memory_limit`), or ``None`` when unknown.

    Example:
        >>> memory_budget(HostFacts(cpu_count=8, available_ram_bytes=16_000, shm_free_bytes=4_000))
        3200
    """
    limit = memory_limit(host, uses_shm=uses_shm)
    return None if limit is None else limit[0]


def host_inflight_bytes(batch_bytes: int, batches_in_flight: int, processes_on_host: int) -> int:
    """In-flight batch bytes summed over a host: every training process runs its own loader.

    Example:
        >>> host_inflight_bytes(50_000_000, batches_in_flight=8, processes_on_host=4)
        1600000000
    """
    return (
        _count("batch_bytes", batch_bytes)
        * _count("batches_in_flight", batches_in_flight)
        * _count("processes_on_host", processes_on_host)
    )


def host_budget(
    host: HostFacts,
    batch_bytes: int | None = None,
    *,
    cpu_share: float | None = None,
    loop_cores: float | None = None,
    max_workers: int | None = None,
    uses_shm: bool = True,
    ram_share: float = RAM_BUDGET_SHARE,
    shm_share: float = SHM_BUDGET_SHARE,
) -> HostBudget:
    """The budget of one training process on ``host``.

    Args:
        host: cores, training processes on the host, available RAM and free ``/dev/shm``.
        batch_bytes: bytes of one batch in host memory (``None``: memory is not budgeted).
        cpu_share: the measured CPU share of a busy worker (see :func:`worker_budget`), or ``None``.
        loop_cores: the measured cores the training process itself uses, or ``None``.
        max_workers: an extra cap on workers from the user.
        uses_shm: whether batches pass through ``/dev/shm`` (they do with worker processes).
        ram_share: share of available RAM for the in-flight batches of all processes on the host.
        shm_share: share of free ``/dev/shm`` for them.

    Example:
        Two processes on a 16-core host, 1 GB available, batches of 10 MB: 7 workers each, and 25 batches in
        flight per process (500 MB of RAM shared by two processes).

        >>> b = host_budget(HostFacts(16, 2, 1_000_000_000, None), 10_000_000)
        >>> b.max_workers, b.max_in_flight, b.memory_bound
        (7, 25, 'host_memory')
    """
    workers, bound = worker_budget(host, cpu_share, loop_cores), CORES
    if max_workers is not None and max_workers < workers:
        workers, bound = max_workers, USER_CAP
    limit = memory_limit(host, uses_shm=uses_shm, ram_share=ram_share, shm_share=shm_share)
    if batch_bytes is None or batch_bytes <= 0 or limit is None:
        return HostBudget(max_workers=workers, workers_bound=bound, user_max_workers=max_workers)
    memory_bytes, memory_bound = limit
    return HostBudget(
        max_workers=workers,
        workers_bound=bound,
        max_in_flight=memory_bytes // (batch_bytes * max(1, host.processes_on_host)),
        memory_bound=memory_bound,
        memory_bytes=memory_bytes,
        user_max_workers=max_workers,
    )


def snapshot_budget(snapshot: WindowSnapshot, **limits: Any) -> HostBudget:
    """The budget for the host and the measured figures of one window (``limits``: see :func:`host_budget`).

    The diagnosis and the tuner both budget a window through here, so the same measurements give the same
    budget.

    Example:
        >>> snap = WindowSnapshot(wait_s=(0.0,), step_s=(0.1,), host=HostFacts(cpu_count=8))
        >>> snapshot_budget(snap).max_workers, snapshot_budget(snap, max_workers=2).workers_bound
        (7, 'max_workers')
    """
    # The window's loop cores are not passed: without workers they include the batch making a fix moves to
    # workers, and whether the cores carry a fix is judged apart (model.contention) as a hypothesis to measure.
    return host_budget(snapshot.host, snapshot.batch_bytes, cpu_share=snapshot.cpu_share, **limits)


def snapshot_cores(snapshot: WindowSnapshot, *, target_rate: float) -> CoreCheck | None:
    """The host's CPU as measured over one window, projected to a loop running at ``target_rate`` steps/s with
    its batches made by workers: the cores the step's own threads and the workers would need against the cores
    this process may use less what other work used (``None`` where CPU use was not measured).

    Where the count of workers is a prediction (:func:`worker_budget`), this says whether the cores carry a fix
    for certain; the diagnosis states a fix as certain only where they do, and the tuner measures the rest.
    Other training ranks of the host are assumed to use what this one does (they apply the same fix), so they
    are counted as this process's, not as other work.

    Example:
        >>> from lightning_loadguard.meters.cpu import CpuUse
        >>> use = CpuUse(window_s=2.0, usable_cores=2.0, host_cores=2, loop_cores=1.5, worker_cores=0.0,
        ...              busy_cores=1.5)
        >>> snap = WindowSnapshot(wait_s=(0.03,) * 8, step_s=(0.03,) * 8, host=HostFacts(cpu_count=2),
        ...                       production_s=(0.03,) * 8, production_cpu_s=(0.03,) * 8, cpu=use)
        >>> snapshot_cores(snap, target_rate=1 / 0.03).fits
        False
    """
    cpu, batch_cpu = snapshot.cpu, snapshot.batch_cpu_s
    step_cpu, others = step_cpu_s(snapshot), other_cores(snapshot)
    if cpu is None or batch_cpu is None or step_cpu is None or others is None or not math.isfinite(target_rate):
        return None
    return check_cores(
        target_rate=target_rate,
        step_cpu_s=step_cpu,
        batch_cpu_s=batch_cpu,
        usable_cores=cpu.usable_cores,
        other_cores=others,
        processes_on_host=max(1, snapshot.host.processes_on_host),
        busy_now=None if cpu.busy_cores is None else cpu.usable_cores - cpu.spare_cores,
    )


def step_cpu_s(snapshot: WindowSnapshot) -> float | None:
    """CPU seconds the training process's threads spent per step over the window, batch making excluded (``None``
    where CPU use or, without workers, the batch's CPU was not measured).

    Example:
        >>> from lightning_loadguard.meters.cpu import CpuUse
        >>> use = CpuUse(window_s=1.0, usable_cores=2.0, host_cores=2, loop_cores=0.5, worker_cores=0.8)
        >>> snap = WindowSnapshot(wait_s=(0.0,) * 10, step_s=(0.1,) * 10, settings=LoaderSettings(2), cpu=use)
        >>> round(step_cpu_s(snap), 3)
        0.05
    """
    cpu = snapshot.cpu
    if cpu is None or snapshot.throughput <= 0:
        return None
    loop_per_step = cpu.loop_cores / snapshot.throughput
    if snapshot.settings.num_workers > 0:
        return loop_per_step
    # Without workers the loop's CPU holds the batch making, which a worker would take over.
    batch_cpu = snapshot.batch_cpu_s
    return None if batch_cpu is None else max(0.0, loop_per_step - batch_cpu)


def other_cores(snapshot: WindowSnapshot) -> float | None:
    """Cores of this process's CPUs that other work used over the window: other jobs, or the container's quota
    holding them back; the host's other training ranks (taken to use what this one does) are not other work.
    ``None`` where CPU use was not measured.

    Example:
        >>> from lightning_loadguard.meters.cpu import CpuUse
        >>> use = CpuUse(window_s=1.0, usable_cores=4.0, host_cores=4, loop_cores=0.5, worker_cores=1.0,
        ...              busy_cores=3.8)
        >>> host = HostFacts(cpu_count=4, processes_on_host=2)
        >>> snap = WindowSnapshot(wait_s=(0.0,), step_s=(0.1,), host=host, cpu=use)
        >>> round(other_cores(snap), 2)
        0.8
    """
    cpu = snapshot.cpu
    if cpu is None:
        return None
    used = cpu.usable_cores - cpu.spare_cores
    return max(0.0, used - cpu.training_cores * max(1, snapshot.host.processes_on_host))


def max_batches_in_flight(batch_bytes: int, host: HostFacts, *, uses_shm: bool = True) -> int | None:
    """Most batches each process's loader may hold within the memory budget, or ``None`` if unknown.

    Example:
        >>> max_batches_in_flight(100, HostFacts(cpu_count=8, processes_on_host=2, available_ram_bytes=4_000))
        10
    """
    _count("batch_bytes", batch_bytes)
    if batch_bytes == 0:
        return None
    return host_budget(host, batch_bytes, uses_shm=uses_shm).max_in_flight
