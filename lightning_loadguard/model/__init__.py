"""The framework-agnostic core: bounded-buffer model, capacity arithmetic and diagnosis rules.

This namespace holds what the adapters use: :func:`diagnose` and its result types. The arithmetic lives in
its modules (:mod:`.buffer`, :mod:`.budget`, :mod:`.capacity`, :mod:`.drain`, :mod:`.tail`), which are internal.

Example:
    >>> from lightning_loadguard.model.capacity import recommend_prefetch
    >>> recommend_prefetch([0.05] * 7 + [0.6], [0.15], num_workers=1).prefetch_factor
    4
"""

from lightning_loadguard._moved import moved_names
from lightning_loadguard.model.diagnosis import diagnose
from lightning_loadguard.model.findings import VERDICTS, Diagnosis, Finding, Verdict

__all__ = ["VERDICTS", "Diagnosis", "Finding", "Verdict", "diagnose"]

# Exported here in 0.1.0.
__getattr__ = moved_names(
    __name__,
    {
        name: (f"{__name__}.{module}:{name}", f"it is internal; import it from {__name__}.{module} if you must")
        for module, names in {
            "buffer": ("BufferRun", "simulate_buffer", "steady_state_wait"),
            "budget": ("host_inflight_bytes", "max_batches_in_flight", "memory_budget", "worker_budget"),
            "capacity": ("PrefetchAdvice", "has_deficit", "producer_capacity", "recommend_prefetch", "workers_needed"),
            "drain": ("DrainAlarm", "drain_from_levels", "drain_from_rates"),
        }.items()
        for name in names
    },
)
