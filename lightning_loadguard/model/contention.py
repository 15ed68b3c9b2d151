"""Whether the host's cores can carry a fix: the loop's threads, the workers and other work, after the change.

More workers help only if cores are free for them. The training process's own threads (the step, torch's
intra-op pool) may already use every core, and other jobs on the host take their share. From one window's
measured CPU use this module projects the cores the loop and the workers would need at the rate the fix
aims for, and compares them with the cores this process may use less what everything else on the host used.
A fix that fits is stated as certain; one that does not is a hypothesis for the tuner to measure.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

IDLE_WORKERS = 0.1
"""Cores below which the workers' added CPU use does not compete: workers waiting on I/O need no core of
their own, even on a busy host."""

HEADROOM = 0.9
"""Share of the available cores a fix may plan to use: scheduling, Python's own threads and the jitter of
other work take the rest."""


@dataclass(frozen=True)
class CoreCheck:
    """The cores a fix needs against the cores there are (all in cores: CPU seconds per second).

    Attributes:
        needed_cores: the loop's threads plus the workers at the target rate.
        loop_cores: of which the training process's own threads (the step, without batch making).
        worker_cores: of which the workers (the batch making, moved out of the loop where it was in it).
        available_cores: cores this process may use, less what other work used.
        other_cores: what other work on the host used (other processes and other ranks).
        sustainable_rate: steps/s the available cores carry at the measured CPU per step and per batch.
        busy_now: cores everything used over the window (``None``: unknown); a host already this busy gives
            a new worker no core of its own, whatever the projection says (threads starved of cores use less
            CPU per step than they would take).
    """

    needed_cores: float
    loop_cores: float
    worker_cores: float
    available_cores: float
    other_cores: float
    sustainable_rate: float
    busy_now: float | None = None

    @property
    def saturated(self) -> bool:
        return self.busy_now is not None and self.busy_now >= HEADROOM * (self.available_cores + self.other_cores)

    @property
    def fits(self) -> bool:
        if self.worker_cores < IDLE_WORKERS:
            return True
        return not self.saturated and self.needed_cores <= HEADROOM * self.available_cores

    def sentence(self, rate: float) -> str:
        """The cores in words: what the fix needs and what there is."""
        others = f", other work {self.other_cores:.1f}" if self.other_cores >= 0.05 else ""
        if self.saturated and self.busy_now is not None:
            return (
                f"the cores this process may use are busy already ({self.busy_now:.1f} of "
                f"{self.available_cores + self.other_cores:.1f} used over the window{others})"
            )
        return (
            f"at {rate:.3g} steps/s the step's own threads need about {self.loop_cores:.1f} cores and the workers "
            f"{self.worker_cores:.1f}, {self.needed_cores:.1f} in all, where {self.available_cores:.1f} are "
            f"available (this process may use {self.available_cores + self.other_cores:.1f}{others})"
        )


def check_cores(
    *,
    target_rate: float,
    step_cpu_s: float,
    batch_cpu_s: float,
    usable_cores: float,
    other_cores: float,
    processes_on_host: int = 1,
    busy_now: float | None = None,
) -> CoreCheck:
    """The cores a loop running at ``target_rate`` needs, against what the host has left.

    Args:
        target_rate: steps/s the fix aims for (the loop's compute rate, when the fix removes the wait).
        step_cpu_s: CPU seconds the training process's threads spend per step, batch making excluded.
        batch_cpu_s: CPU seconds making one batch takes (in a worker, or in the loop without workers).
        usable_cores: cores this process may use (affinity and quota).
        other_cores: cores other work used over the window (other processes, and other training ranks of the
            host when ``processes_on_host`` is 1).
        processes_on_host: training processes on the host that apply the same fix at once (their use
            counted here, not in ``other_cores``).
        busy_now: cores used over the window by everything (this process, its workers, other work).

    Example:
        A step that computes on both cores of a 2-core host at 30 steps/s (66 ms of CPU per step) and 30 ms of
        JPEG decoding per batch: moving the decoding to a worker needs 3 cores.

        >>> c = check_cores(target_rate=30, step_cpu_s=0.066, batch_cpu_s=0.030, usable_cores=2, other_cores=0)
        >>> c.fits, round(c.needed_cores, 1), round(c.sustainable_rate, 1)
        (False, 2.9, 18.8)

        16 ms of CPU per batch against a 10 ms step that waits on an accelerator: 1.7 cores of 2.

        >>> check_cores(target_rate=100, step_cpu_s=0.001, batch_cpu_s=0.016, usable_cores=2, other_cores=0).fits
        True
    """
    for name, value in (("target_rate", target_rate), ("usable_cores", usable_cores)):
        if not (math.isfinite(value) and value > 0):
            raise ValueError(f"{name} must be a finite number > 0, got {value!r}")
    for name, value in (("step_cpu_s", step_cpu_s), ("batch_cpu_s", batch_cpu_s), ("other_cores", other_cores)):
        if not (math.isfinite(value) and value >= 0):
            raise ValueError(f"{name} must be a finite number >= 0, got {value!r}")
    processes = max(1, processes_on_host)
    loop = target_rate * step_cpu_s * processes
    workers = target_rate * batch_cpu_s * processes
    available = max(0.0, usable_cores - other_cores)
    per_step = (step_cpu_s + batch_cpu_s) * processes
    sustainable = HEADROOM * available / per_step if per_step > 0 else math.inf
    return CoreCheck(loop + workers, loop, workers, available, other_cores, sustainable, busy_now)
