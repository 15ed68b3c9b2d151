"""The host's CPU, measured: the cores this process may use, and who used them over a window.

Two facts decide whether one more loader worker can get a core:

- **Cores this process may use**: its affinity mask, narrowed by its container's CPU quota (cgroup v2
  ``cpu.max``, v1 ``cpu.cfs_quota_us`` / ``cpu.cfs_period_us``). A pod limited to 4 CPUs on a 64-core node
  sees all 64 CPUs in its affinity mask; only the quota says 4.
- **Who used them over the last window**: the training process's own threads (the loop, torch's intra-op
  pool, the pin-memory thread), its loader workers (its child processes), and everything else on those CPUs
  (other jobs, and other training ranks of the same host, which a per-host reduction can separate out).

:class:`CpuSampler` reads these once per window (a few ``/proc`` reads), never per batch.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil

# Bound once: a test or tool that mocks `time.monotonic` to drive its own simulated clock must not see
# LoadGuard's reads advance it.
_monotonic = time.monotonic

MIN_WINDOW_S = 0.5
"""Shortest window a sample covers: the kernel counts CPU time in clock ticks (10 ms), so a shorter window
would misread by more than a few percent of a core."""

CGROUP_ROOT = "/sys/fs/cgroup"
PROC_CGROUP = "/proc/self/cgroup"


def affinity_cpus() -> tuple[int, ...]:
    """The CPUs this process may run on (all CPUs where the platform has no affinity mask)."""
    try:
        return tuple(sorted(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return tuple(range(psutil.cpu_count(logical=True) or 1))


def _cgroup_paths(proc_cgroup: str) -> dict[str, str]:
    """``/proc/self/cgroup`` as {controller: path}; the v2 unified hierarchy under the key ``""``."""
    paths: dict[str, str] = {}
    try:
        text = Path(proc_cgroup).read_text()
    except OSError:
        return paths
    for line in text.splitlines():
        parts = line.strip().split(":", 2)
        if len(parts) != 3:
            continue
        _, controllers, path = parts
        for name in controllers.split(",") if controllers else [""]:
            paths[name] = path
    return paths


def _ancestors(mount: Path, path: str) -> list[Path]:
    """``mount/path`` and each of its parents down to ``mount`` itself: a limit set on any of them applies.

    Inside a container the path named in ``/proc/self/cgroup`` may not exist under the mount (the container
    sees its own cgroup as the root); the mount itself is then the one to read.
    """
    parts = [p for p in path.strip("/").split("/") if p]
    return [mount.joinpath(*parts[:n]) for n in range(len(parts), -1, -1)]


def _read_v2(directory: Path) -> float | None:
    try:
        quota, *period = (directory / "cpu.max").read_text().split()
    except (OSError, ValueError):
        return None
    if quota == "max":
        return None
    try:
        return int(quota) / int(period[0] if period else 100_000)
    except (ValueError, ZeroDivisionError):
        return None


def _read_v1(directory: Path) -> float | None:
    try:
        quota = int((directory / "cpu.cfs_quota_us").read_text())
        period = int((directory / "cpu.cfs_period_us").read_text())
    except (OSError, ValueError):
        return None
    if quota <= 0 or period <= 0:
        return None  # -1: no quota
    return quota / period


def cgroup_cpu_limit(root: str = CGROUP_ROOT, proc_cgroup: str = PROC_CGROUP) -> float | None:
    """Cores the container's CPU quota allows (may be fractional), or ``None`` without a quota.

    Reads cgroup v2 ``cpu.max`` and v1 ``cpu.cfs_quota_us`` / ``cpu.cfs_period_us`` along this process's
    cgroup path; the tightest limit found counts.

    Example:
        >>> import tempfile, pathlib
        >>> root = pathlib.Path(tempfile.mkdtemp())
        >>> _ = (root / "cpu.max").write_text("250000 100000\\n")
        >>> _ = (root / "self_cgroup").write_text("0::/\\n")
        >>> cgroup_cpu_limit(str(root), str(root / "self_cgroup"))
        2.5
    """
    mount = Path(root)
    paths = _cgroup_paths(proc_cgroup)
    limits: list[float] = []
    if "" in paths:
        # v2: the unified hierarchy is mounted at the root itself (or under "unified" in hybrid mode).
        for base in (mount, mount / "unified"):
            limits += [v for d in _ancestors(base, paths[""]) if (v := _read_v2(d)) is not None]
    for controller in ("cpu", "cpu,cpuacct", "cpuacct,cpu"):
        if "cpu" not in paths:
            break
        base = mount / controller
        limits += [v for d in _ancestors(base, paths["cpu"]) if (v := _read_v1(d)) is not None]
    return min(limits) if limits else None


def usable_cores(root: str = CGROUP_ROOT, proc_cgroup: str = PROC_CGROUP) -> float:
    """Cores this process may use: its affinity mask, narrowed by its container's CPU quota.

    Example:
        >>> usable_cores() <= len(affinity_cpus())
        True
    """
    return cores_within(cgroup_cpu_limit(root, proc_cgroup))


def cores_within(quota: float | None) -> float:
    """Cores of this process's affinity mask, narrowed by a CPU quota of ``quota`` cores (``None``: none).

    Example:
        >>> cores_within(0.5)
        0.5
    """
    cpus = float(len(affinity_cpus()))
    return cpus if quota is None else min(cpus, quota)


def usable_cpu_count(root: str = CGROUP_ROOT, proc_cgroup: str = PROC_CGROUP) -> int:
    """Whole cores this process may use (at least 1): :func:`usable_cores` rounded down.

    Example:
        >>> usable_cpu_count() >= 1
        True
    """
    return whole_cores(usable_cores(root, proc_cgroup))


def whole_cores(cores: float) -> int:
    """Whole cores in a (possibly fractional) quota of cores, at least 1."""
    return max(1, math.floor(cores + 1e-9))


@dataclass(frozen=True)
class CpuReading:
    """CPU seconds spent up to one moment (:meth:`CpuSampler.read`): two readings give the cores used between them.

    Attributes:
        at: the monotonic clock's time of the reading.
        own_s: the training process's threads.
        workers_s: its loader workers, live and reaped.
        busy_s: every CPU of its affinity mask, not idle (``None`` where the system's times cannot be read).
    """

    at: float
    own_s: float
    workers_s: float
    busy_s: float | None


@dataclass(frozen=True)
class CpuUse:
    """Cores in use over one window (CPU seconds per second of wall time).

    Attributes:
        window_s: wall seconds the window spans.
        usable_cores: cores this process may use (affinity and quota).
        host_cores: CPUs in this process's affinity mask (what the rest of the host competes for).
        loop_cores: the training process's own threads (the loop, torch's intra-op pool, pin-memory).
        worker_cores: its loader workers (child processes).
        busy_cores: everything that ran on the affinity CPUs, this process and its workers included.

    Example:
        Two usable cores: the loop's threads used 1.2, the workers 0.5, another job 0.3.

        >>> use = CpuUse(1.0, 2.0, 2, loop_cores=1.2, worker_cores=0.5, busy_cores=2.0)
        >>> round(use.other_cores, 3), round(use.spare_cores, 3)
        (0.3, 0.0)
    """

    window_s: float
    usable_cores: float
    host_cores: int
    loop_cores: float
    worker_cores: float
    busy_cores: float | None = None

    @property
    def training_cores(self) -> float:
        return self.loop_cores + self.worker_cores

    @property
    def other_cores(self) -> float:
        """Cores everything else on this process's CPUs used (``0`` where system-wide use is unknown)."""
        if self.busy_cores is None:
            return 0.0
        return max(0.0, self.busy_cores - self.training_cores)

    def others_excluding(self, training_cores_on_host: float) -> float:
        """Cores used by non-training work, given what all training processes of this host used."""
        if self.busy_cores is None:
            return 0.0
        return max(0.0, self.busy_cores - max(training_cores_on_host, self.training_cores))

    @property
    def spare_cores(self) -> float:
        """Cores nobody used in the window: the smaller of the quota's and the CPUs' remainder."""
        quota_left = self.usable_cores - self.training_cores
        host_left = self.host_cores - (self.busy_cores if self.busy_cores is not None else self.training_cores)
        return max(0.0, min(quota_left, host_left))


def _busy_seconds(cpus: tuple[int, ...]) -> float | None:
    """CPU seconds spent not idle, summed over ``cpus``, since boot."""
    try:
        per_cpu = psutil.cpu_times(percpu=True)
    except (psutil.Error, OSError):
        return None
    total = 0.0
    for index in cpus:
        if index >= len(per_cpu):
            continue
        times = per_cpu[index]
        idle = times.idle + getattr(times, "iowait", 0.0) + getattr(times, "steal", 0.0)
        total += sum(times) - idle - getattr(times, "guest", 0.0) - getattr(times, "guest_nice", 0.0)
    return total


class CpuSampler:
    """Samples CPU use once per window: this process, its workers, and the CPUs it runs on.

    The training process's CPU time covers all of its threads (torch's intra-op pool included); its
    workers' is that of the loader's live workers (every child process where the loader's are not known)
    plus what reaped children used, so workers that exited between two samples (a new epoch's iterator)
    still count.

    Example:
        >>> sampler = CpuSampler()
        >>> sampler.sample() is None  # the first call only starts the window
        True
        >>> _ = sum(i * i for i in range(100_000))
        >>> use = sampler.sample(min_window_s=0.0)
        >>> use is not None and use.loop_cores >= 0
        True
    """

    def __init__(
        self,
        cgroup_root: str = CGROUP_ROOT,
        proc_cgroup: str = PROC_CGROUP,
        worker_pids: Callable[[], list[int] | None] | None = None,
    ) -> None:
        self._process = psutil.Process()
        self._cpus = affinity_cpus()
        self._usable = usable_cores(cgroup_root, proc_cgroup)
        self._last: CpuReading | None = None
        self._worker_pids = worker_pids
        self._workers: dict[int, psutil.Process] = {}

    def __getstate__(self) -> dict[str, Any]:
        # A copy samples the process that holds it, from a fresh window.
        return {**self.__dict__, "_process": None, "_last": None, "_worker_pids": None, "_workers": {}}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._process = psutil.Process()

    def _children(self) -> list[psutil.Process]:
        """The live loader workers: from the loader's own list where known (a few ``/proc`` reads), else every
        child process (which lists every process on the host)."""
        pids = self._worker_pids() if self._worker_pids is not None else None
        if pids is None:
            return self._process.children(recursive=True)
        known = self._workers
        for pid in [pid for pid in known if pid not in pids]:
            del known[pid]
        for pid in pids:
            if pid not in known:
                try:
                    known[pid] = psutil.Process(pid)
                except psutil.Error:
                    continue
        return list(known.values())

    def read(self) -> CpuReading:
        """The CPU seconds spent so far (raises ``psutil.Error`` or ``OSError`` where ``/proc`` cannot be read)."""
        times = self._process.cpu_times()
        own = times.user + times.system
        # Children that ended were reaped by this process: their time is in its children's totals.
        workers = times.children_user + times.children_system
        for child in self._children():
            try:
                child_times = child.cpu_times()
            except psutil.Error:
                continue  # exited since the listing: counted with the reaped children once reaped
            workers += child_times.user + child_times.system
        return CpuReading(_monotonic(), own, workers, _busy_seconds(self._cpus))

    def reading(self) -> CpuReading | None:
        """:meth:`read`, or ``None`` where ``/proc`` cannot be read now."""
        try:
            return self.read()
        except (psutil.Error, OSError):
            return None

    def use_between(self, start: CpuReading, end: CpuReading, min_window_s: float = MIN_WINDOW_S) -> CpuUse | None:
        """The cores used from ``start`` to ``end`` (``None`` where they lie under ``min_window_s`` apart).

        Example:
            >>> sampler = CpuSampler()
            >>> start = sampler.read()
            >>> _ = sum(i * i for i in range(100_000))
            >>> use = sampler.use_between(start, sampler.read(), min_window_s=0.0)
            >>> use is not None and use.loop_cores >= 0
            True
        """
        seconds = end.at - start.at
        if seconds < min_window_s or seconds <= 0:
            return None
        busy = None if end.busy_s is None or start.busy_s is None else max(0.0, end.busy_s - start.busy_s) / seconds
        return CpuUse(
            window_s=seconds,
            usable_cores=self._usable,
            host_cores=len(self._cpus),
            loop_cores=max(0.0, end.own_s - start.own_s) / seconds,
            worker_cores=max(0.0, end.workers_s - start.workers_s) / seconds,
            busy_cores=busy,
        )

    def use_since(self, start: CpuReading, min_window_s: float = MIN_WINDOW_S) -> CpuUse | None:
        """The cores used from ``start`` to now (``None`` where that is under ``min_window_s``, checked before
        reading, or where ``/proc`` cannot be read)."""
        if _monotonic() - start.at < min_window_s:
            return None
        now = self.reading()
        return None if now is None else self.use_between(start, now, min_window_s)

    def sample(self, min_window_s: float = MIN_WINDOW_S) -> CpuUse | None:
        """The cores used since the previous sample, or ``None`` on the first call, when fewer than
        ``min_window_s`` seconds have passed (the window goes on), or when ``/proc`` cannot be read."""
        last = self._last
        if last is not None and _monotonic() - last.at < min_window_s:
            # Checked before reading: listing the workers reads /proc for every process on the host.
            return None
        now = self.reading()
        if now is None:
            return None
        last = self._last
        if last is not None and now.at - last.at < min_window_s:
            return None
        self._last = now
        return None if last is None else self.use_between(last, now, min_window_s)
