"""Host budgets: cores, available RAM and /dev/shm, and the size of a batch in host memory."""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import socket
import time
from collections.abc import Mapping
from typing import Any

import psutil
import torch
from lightning_utilities.core.apply_func import apply_to_collection

from lightning_loadguard.meters.cpu import cgroup_cpu_limit, cores_within, whole_cores
from lightning_loadguard.meters.window import HostFacts

# Bound once (as in meters/cpu.py): a test or tool that mocks `time.monotonic` to drive its own simulated clock
# must not see LoadGuard's reads advance it.
_monotonic = time.monotonic


def shm_free_bytes(path: str = "/dev/shm") -> int | None:
    """Free bytes of the shared-memory mount that worker processes hand batches through."""
    try:
        return shutil.disk_usage(path).free
    except OSError:
        return None


QUOTA_REREAD_S = 30.0
"""How long the container's CPU quota (a dozen small cgroup file reads) is taken as known before it is read
again; the affinity mask (one system call) is read each time."""

MEMORY_REREAD_S = 1.0
"""How long a reading of available RAM and free /dev/shm serves a rolling window (a tenth of a millisecond
per reading, which a logging step every 50 short steps would pay every 0.1 s)."""

_quota_read: list[Any] = []  # [when read, cores the quota allows or None]
_memory_read: list[Any] = []  # [when read, available RAM bytes, free /dev/shm bytes or None]


def _usable_cpu_count() -> int:
    now = _monotonic()
    if not _quota_read or now - _quota_read[0] >= QUOTA_REREAD_S:
        _quota_read[:] = [now, cgroup_cpu_limit()]
    return whole_cores(cores_within(_quota_read[1]))


def host_facts(processes_on_host: int = 1, max_age_s: float = 0.0) -> HostFacts:
    """This host's cores (the quota re-read every ``QUOTA_REREAD_S``), available RAM and free /dev/shm (read
    anew unless a reading under ``max_age_s`` old exists)."""
    now = _monotonic()
    if not _memory_read or now - _memory_read[0] >= max_age_s:
        _memory_read[:] = [now, int(psutil.virtual_memory().available), shm_free_bytes()]
    return HostFacts(
        cpu_count=_usable_cpu_count(),
        processes_on_host=processes_on_host,
        available_ram_bytes=_memory_read[1],
        shm_free_bytes=_memory_read[2],
    )


HOST_KEY_ENV = "LOADGUARD_HOST_KEY"
"""The environment variable that names the host a training process counts on, in place of its hostname."""

_HOST_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:-]{0,254}")


def host_name(environ: Mapping[str, str] | None = None) -> str:
    """The name of the host this process counts on: ``LOADGUARD_HOST_KEY`` where set, else the hostname.

    Ranks of one name share its cores, memory and ``/dev/shm`` in LoadGuard's counts. Containers or pods on one
    machine with their own hostnames count apart (each within its own limits); set the variable to the same
    value in each to count them together, or to different values to count apart processes that share a
    hostname. Read where the process runs, when a fit starts.

    Raises:
        ValueError: the variable is set but empty, or is not 1 to 255 letters, digits, ``.``, ``_``, ``:`` or
            ``-`` starting with a letter or digit.

    Example:
        >>> host_name({"LOADGUARD_HOST_KEY": "rack3-node07"})
        'rack3-node07'
        >>> host_name({"LOADGUARD_HOST_KEY": "node 7"})
        Traceback (most recent call last):
        ...
        ValueError: LOADGUARD_HOST_KEY='node 7' is not a host name: ...
    """
    environ = os.environ if environ is None else environ
    value = environ.get(HOST_KEY_ENV)
    if value is None:
        return socket.gethostname()
    if not _HOST_NAME.fullmatch(value):
        raise ValueError(
            f"{HOST_KEY_ENV}={value!r} is not a host name: give 1 to 255 letters, digits, '.', '_', ':' or '-', "
            f"starting with a letter or digit (training processes with the same value count as one host), or "
            f"unset it to group them by hostname."
        )
    return value


def host_key(environ: Mapping[str, str] | None = None) -> int:
    """A number naming this process's host (:func:`host_name`), equal on all of its processes: the ranks are
    grouped by host with it. 52 bits of a hash, exact as a float64 in the ranks' gather.

    Example:
        >>> host_key({"LOADGUARD_HOST_KEY": "a"}) == host_key({"LOADGUARD_HOST_KEY": "a"}) < 2**52
        True
    """
    digest = hashlib.blake2b(host_name(environ).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") & (2**52 - 1)


def batch_layout(batch: Any) -> tuple[int, int]:
    """Bytes of all tensors (and numpy arrays) in a batch of any nesting, and how many tensors it holds: each
    crosses from a worker to the loop as a storage of its own in shared memory, at a cost per tensor.

    Example:
        >>> batch_layout({"x": torch.zeros(4, 3), "y": [torch.zeros(4, dtype=torch.int64), torch.zeros(2)]})
        (88, 3)
    """
    sizes: list[int] = []

    def count(tensor: Any) -> Any:
        sizes.append(int(tensor.element_size() * tensor.nelement()))
        return tensor

    apply_to_collection(batch, torch.Tensor, count)
    tensors = len(sizes)
    try:
        import numpy as np

        apply_to_collection(batch, np.ndarray, lambda array: sizes.append(int(array.nbytes)))
    except ImportError:
        pass
    return sum(sizes), tensors


def batch_nbytes(batch: Any) -> int:
    """Bytes of all tensors (and numpy arrays) in a batch of any nesting.

    Example:
        >>> batch_nbytes({"x": torch.zeros(4, 3), "y": [torch.zeros(4, dtype=torch.int64)]})
        80
    """
    return batch_layout(batch)[0]


def sharing_strategy() -> str:
    """How this process's tensors reach another process (``torch.multiprocessing``'s sharing strategy), which
    workers forked from it inherit."""
    return torch.multiprocessing.get_sharing_strategy()
