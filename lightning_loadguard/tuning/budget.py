"""Host budgets for loader settings: cores per training process, in-flight memory and ``/dev/shm``.

Every training process on a host runs its own loader, so each process gets its share: of the cores (one
kept for its own loop) and of the memory that in-flight batches may claim across the host.
"""

from __future__ import annotations

from dataclasses import dataclass

from lightning_loadguard.meters.window import HostFacts
from lightning_loadguard.model.capacity import worker_budget

CORES = "cores"
HOST_MEMORY = "host_memory"
SHM = "shm"
USER_CAP = "max_workers"


@dataclass(frozen=True)
class Budget:
    """What one training process's loader may use.

    Attributes:
        max_workers: most loader workers predicted to fit (cores per process less one, and
            ``TuneOptions.max_workers``).
        workers_bound: which limit set ``max_workers`` (``"cores"`` or ``"max_workers"``). A core limit is
            a prediction the tuner may verify past (see :meth:`workers_verifiable`); the user's cap is not.
        max_in_flight: most batches the loader may hold at once (``None``: batch size or memory unknown).
        memory_bound: which limit set ``max_in_flight`` (``"host_memory"`` or ``"shm"``), or ``None``.
        memory_bytes: the host-wide bytes that bound applies to, or ``None``.
        user_max_workers: the user's own cap (``TuneOptions.max_workers``), a wall even past a core limit.
    """

    max_workers: int
    workers_bound: str
    max_in_flight: int | None = None
    memory_bound: str | None = None
    memory_bytes: int | None = None
    user_max_workers: int | None = None

    def workers_verifiable(self, num_workers: int) -> bool:
        """Whether ``num_workers`` past :attr:`max_workers` may be measured: only past a predicted core limit,
        never past the user's cap.

        Example:
            >>> Budget(max_workers=1, workers_bound="cores", user_max_workers=4).workers_verifiable(2)
            True
            >>> Budget(max_workers=2, workers_bound="max_workers").workers_verifiable(3)
            False
        """
        if self.workers_bound != CORES:
            return num_workers <= self.max_workers
        return self.user_max_workers is None or num_workers <= self.user_max_workers

    def breaks_wall(self, num_workers: int, prefetch_factor: int | None) -> str | None:
        """Like :meth:`allows`, for the limits that may not even be measured: memory and the user's cap.

        Example:
            >>> Budget(max_workers=1, workers_bound="cores", max_in_flight=8, memory_bound="shm").breaks_wall(3, 2)
            >>> Budget(max_workers=1, workers_bound="cores", max_in_flight=8, memory_bound="shm").breaks_wall(3, 4)
            'shm'
        """
        if not self.workers_verifiable(num_workers):
            return self.workers_bound if self.workers_bound != CORES else USER_CAP
        return self._memory(num_workers, prefetch_factor)

    def _memory(self, num_workers: int, prefetch_factor: int | None) -> str | None:
        if self.max_in_flight is None or num_workers <= 0:
            return None
        return self.memory_bound if num_workers * (prefetch_factor or 2) > self.max_in_flight else None

    def allows(self, num_workers: int, prefetch_factor: int | None) -> str | None:
        """``None`` if the setting fits, else the name of the budget it breaks.

        Example:
            >>> Budget(max_workers=3, workers_bound="cores", max_in_flight=8, memory_bound="shm").allows(4, 2)
            'cores'
            >>> Budget(max_workers=7, workers_bound="cores", max_in_flight=8, memory_bound="shm").allows(4, 4)
            'shm'
        """
        if num_workers > self.max_workers:
            return self.workers_bound
        return self._memory(num_workers, prefetch_factor)

    def deepest_prefetch(self, num_workers: int, ceiling: int) -> int:
        """The largest ``prefetch_factor`` up to ``ceiling`` that fits the memory budget (0 if none does)."""
        if num_workers <= 0:
            return ceiling
        if self.max_in_flight is None:
            return ceiling
        return max(0, min(ceiling, self.max_in_flight // num_workers))


WORKERS_PER_CORE = 8
"""Most workers per spare core even when they barely use CPU (waiting on I/O): each is a process with its
own copy of the dataset objects it touches."""

SATURATED = 0.9
"""Workers using this share of the spare cores already are taken to be CPU-bound: no more are allowed."""


def cpu_worker_cap(num_workers: int, worker_cores: float, spare_cores: float) -> int:
    """Workers that fit the spare cores, scaling the cores ``num_workers`` workers were measured to use.

    A worker waiting on I/O uses a sliver of a core, so the cores of a process can carry more of them than
    it has cores; CPU-bound workers get one core each. Measured use grows linearly with workers until the
    cores saturate; at saturation (contended workers each use less) the measured count is the cap.

    Example:
        >>> cpu_worker_cap(2, worker_cores=0.1, spare_cores=1.5)  # I/O-bound: 0.05 cores each
        12
        >>> cpu_worker_cap(2, worker_cores=1.45, spare_cores=1.5)  # the spare cores are saturated
        2
    """
    ceiling = max(1, int(WORKERS_PER_CORE * spare_cores))
    if num_workers < 1 or spare_cores <= 0:
        return 0
    if worker_cores >= SATURATED * spare_cores:
        return num_workers
    per_worker = max(worker_cores / num_workers, 1.0 / WORKERS_PER_CORE)
    return max(num_workers, min(ceiling, int(spare_cores / per_worker)))


def host_budget(
    host: HostFacts,
    batch_bytes: int | None,
    *,
    memory_share: float,
    shm_share: float,
    max_workers: int | None = None,
    measured_workers: int = 0,
    worker_cores: float | None = None,
    loop_cores: float | None = None,
) -> Budget:
    """The budget of one training process on ``host``.

    Args:
        host: cores, training processes on the host, available RAM and free ``/dev/shm``.
        batch_bytes: bytes of one batch in host memory (``None``: memory is not budgeted, say so).
        memory_share: share of available RAM for the in-flight batches of all processes on the host.
        shm_share: share of free ``/dev/shm`` for them (worker batches pass through it).
        max_workers: an extra cap on workers from the user.
        measured_workers: workers running when ``worker_cores`` was measured.
        worker_cores: cores those workers used; with ``loop_cores`` (the training process's own use) it
            lets workers that wait on I/O share cores (see :func:`cpu_worker_cap`).
        loop_cores: cores the training process used.

    Example:
        Two processes on a 16-core host, 1 GB available, batches of 10 MB: 7 workers each, and 25 batches in
        flight per process (500 MB of RAM shared by two processes).

        >>> b = host_budget(HostFacts(16, 2, 1_000_000_000, None), 10_000_000, memory_share=0.5, shm_share=0.8)
        >>> b.max_workers, b.max_in_flight, b.memory_bound
        (7, 25, 'host_memory')
    """
    workers = worker_budget(host)
    bound = CORES
    if measured_workers > 0 and worker_cores is not None and loop_cores is not None:
        spare = host.cores_per_process - loop_cores
        workers = max(workers, cpu_worker_cap(measured_workers, worker_cores, spare))
    if max_workers is not None and max_workers < workers:
        workers, bound = max_workers, USER_CAP
    limits: list[tuple[int, str]] = []
    if host.available_ram_bytes is not None:
        limits.append((int(host.available_ram_bytes * memory_share), HOST_MEMORY))
    if host.shm_free_bytes is not None:
        limits.append((int(host.shm_free_bytes * shm_share), SHM))
    if batch_bytes is None or batch_bytes <= 0 or not limits:
        return Budget(max_workers=workers, workers_bound=bound, user_max_workers=max_workers)
    memory_bytes, memory_bound = min(limits)
    per_batch_on_host = batch_bytes * max(1, host.processes_on_host)
    return Budget(
        max_workers=workers,
        workers_bound=bound,
        max_in_flight=memory_bytes // per_batch_on_host,
        memory_bound=memory_bound,
        memory_bytes=memory_bytes,
        user_max_workers=max_workers,
    )
