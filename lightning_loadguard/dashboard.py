"""The TensorBoard custom-scalars layout for LoadGuard's metrics (the Custom Scalars tab)."""

from __future__ import annotations

from typing import Any

METRICS: dict[str, str] = {
    "loadguard/wait_fraction": "share of loop time spent waiting for data (0..1), worst rank",
    "loadguard/data_wait_ms": "mean time a step blocked fetching its batch (ms)",
    "loadguard/step_ms": "mean time of the rest of the step: compute, transfer, callbacks (ms)",
    "loadguard/throughput": "batches per second the training loop achieved",
    "loadguard/consumer_rate": "batches per second the loop would reach if it never waited (1 / step time)",
    "loadguard/producer_rate": "batches per second the loader's workers can sustain (capacity)",
    "loadguard/ready_fraction": "share of fetches for which a batch was already waiting (0..1)",
    "loadguard/epoch_start_ms": "time to create the epoch's iterator: worker start-up (ms)",
    "loadguard/host_processes": "training processes (ranks) on this rank's host",
    "loadguard/host_workers": "loader worker processes on the host, summed over its training processes",
    "loadguard/host_prefetch_capacity": "batches the host's prefetch queues can hold, summed over its training "
    "processes",
    "loadguard/host_prefetch_queued": "batches made and waiting in the host's prefetch queues (window mean), "
    "summed over its training processes",
    "loadguard/inflight_host_mb": "bytes of the host's prefetch capacity: batch memory in flight on the host, "
    "summed over its training processes (MB)",
    "loadguard/queued_host_mb": "bytes of the batches queued on the host (MB)",
    "loadguard/inflight_budget_fraction": "in-flight batch memory as a share of the host's tighter budget, "
    "available RAM or free /dev/shm (0..1)",
    "loadguard/host_cores": "cores the host's training processes may use",
    "loadguard/host_available_mb": "the host's available RAM (MB)",
    "loadguard/shm_free_mb": "free space on the host's /dev/shm (MB)",
    "loadguard/hosts": "hosts the ranks run on (runs on several hosts only)",
    "loadguard/inflight_host_mb_max": "batch memory in flight on the busiest host (MB; runs on several hosts only)",
    "loadguard/inflight_budget_fraction_max": "the highest inflight_budget_fraction of any host (0..1; runs on "
    "several hosts only)",
    "loadguard/transfer_ms": "mean time from a batch's arrival to the start of its step: input conversion and "
    "the copy to the device (ms)",
    "loadguard/device_idle_fraction": "share of the accelerator's time idle between steps (0..1), on its own "
    "clock; accelerators only",
    "loadguard/device_data_idle_fraction": "share of the accelerator's time idle while the host waited for "
    "data (0..1): the loader's part of the idle",
    "loadguard/device_loop_idle_fraction": "share of the accelerator's time idle while the host was busy "
    "outside the fetch (0..1): the loop's part of the idle",
    "loadguard/device_step_ms": "mean step time on the accelerator's clock (ms)",
    "loadguard/device_transfer_ms": "mean copy of the batch to the accelerator, on its clock (ms)",
    "loadguard/gpu_util": "accelerator utilization from NVML (0..1), only where measurable",
    "loadguard/worst_rank": "the rank with the highest wait fraction (distributed runs only)",
    "loadguard/num_workers": "the train loader's num_workers during the window: a step where the auto-tuner "
    "switched settings",
    "loadguard/prefetch_factor": "the train loader's prefetch_factor during the window (0 without workers)",
    "loadguard/retunes": "times the auto-tuner probed again after its first decision (auto_tune only): a step "
    "where the host or the step changed",
}
"""The public metric names with their meaning and unit.

Example:
    >>> METRICS["loadguard/wait_fraction"]
    'share of loop time spent waiting for data (0..1), worst rank'
"""


def custom_scalars_layout() -> dict[str, dict[str, list[Any]]]:
    """Layout for ``SummaryWriter.add_custom_scalars``: rates, wait with readiness, memory vs budget.

    Example:
        >>> sorted(custom_scalars_layout()["LoadGuard"])[0]
        "1. Steps/s: achieved (throughput) vs the step's own rate (consumer_rate); the gap is data wait"
    """
    # One question per chart, its lines named in the title: TensorBoard draws a chart's lines in colours
    # that only its tooltip names, so a chart of three rates reads as one. Fractions and memory are charted
    # in the units that show a change (a share of a huge budget is a flat line at zero).
    return {
        "LoadGuard": {
            "1. Steps/s: achieved (throughput) vs the step's own rate (consumer_rate); the gap is data wait": [
                "Multiline",
                ["loadguard/throughput", "loadguard/consumer_rate"],
            ],
            "2. Can the loader keep up? Its capacity (producer_rate) vs the step's rate, batches/s": [
                "Multiline",
                ["loadguard/producer_rate", "loadguard/consumer_rate"],
            ],
            "3. Share of loop time waiting for data (0..1)": ["Multiline", ["loadguard/wait_fraction"]],
            "4. The loader's num_workers (a step where the tuner switched) and the tuner's re-tunes": [
                "Multiline",
                ["loadguard/num_workers", "loadguard/retunes"],
            ],
            "5. Share of fetches whose batch was ready (0..1), accelerator utilization": [
                "Multiline",
                ["loadguard/ready_fraction", "loadguard/gpu_util"],
            ],
            "6. Step anatomy (ms)": [
                "Multiline",
                [
                    "loadguard/data_wait_ms",
                    "loadguard/step_ms",
                    "loadguard/transfer_ms",
                    "loadguard/epoch_start_ms",
                    "loadguard/device_step_ms",
                    "loadguard/device_transfer_ms",
                ],
            ],
            "7. Device idle between steps (accelerators): total, waiting for data, waiting for the loop": [
                "Multiline",
                [
                    "loadguard/device_idle_fraction",
                    "loadguard/device_data_idle_fraction",
                    "loadguard/device_loop_idle_fraction",
                ],
            ],
            "8. Batch memory on the host (MB): the prefetch queues' capacity (inflight) and what is queued; the "
            "busiest host's": [
                "Multiline",
                ["loadguard/inflight_host_mb", "loadguard/queued_host_mb", "loadguard/inflight_host_mb_max"],
            ],
            "9. Host memory left: available RAM and free /dev/shm (MB)": [
                "Multiline",
                ["loadguard/host_available_mb", "loadguard/shm_free_mb"],
            ],
            "10. The host's loader workers and its usable cores": [
                "Multiline",
                ["loadguard/host_workers", "loadguard/host_cores"],
            ],
            "11. Batches on the host: the prefetch queues' capacity and what is queued": [
                "Multiline",
                ["loadguard/host_prefetch_capacity", "loadguard/host_prefetch_queued"],
            ],
        }
    }
