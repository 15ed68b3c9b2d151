"""The framework-agnostic core: bounded-buffer model, capacity arithmetic and diagnosis rules.

Example:
    >>> from lightning_loadguard.model import recommend_prefetch
    >>> recommend_prefetch([0.05] * 7 + [0.6], [0.15], num_workers=1).prefetch_factor
    4
"""

from lightning_loadguard.model.buffer import BufferRun, simulate_buffer, steady_state_wait
from lightning_loadguard.model.capacity import (
    PrefetchAdvice,
    has_deficit,
    host_inflight_bytes,
    max_batches_in_flight,
    memory_budget,
    producer_capacity,
    recommend_prefetch,
    worker_budget,
    workers_needed,
)
from lightning_loadguard.model.diagnosis import diagnose
from lightning_loadguard.model.drain import DrainAlarm, drain_from_levels, drain_from_rates
from lightning_loadguard.model.findings import VERDICTS, Diagnosis, Finding, Verdict

__all__ = [
    "VERDICTS",
    "BufferRun",
    "Diagnosis",
    "DrainAlarm",
    "Finding",
    "PrefetchAdvice",
    "Verdict",
    "diagnose",
    "drain_from_levels",
    "drain_from_rates",
    "has_deficit",
    "host_inflight_bytes",
    "max_batches_in_flight",
    "memory_budget",
    "producer_capacity",
    "recommend_prefetch",
    "simulate_buffer",
    "steady_state_wait",
    "worker_budget",
    "workers_needed",
]
