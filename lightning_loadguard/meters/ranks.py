"""Combining the ranks' figures into what a user of a distributed run needs to see.

A slow rank stalls every other rank in the gradient all-reduce, so the figures that matter are the worst
rank's; memory is a per-host budget, so in-flight bytes are summed over the ranks of each host.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

FIELDS: tuple[str, ...] = (
    "wait_fraction",
    "data_wait_ms",
    "step_ms",
    "throughput",
    "consumer_rate",
    "producer_rate",
    "ready_fraction",
    "epoch_start_ms",
    "transfer_ms",
    "device_idle_fraction",
    "device_data_idle_fraction",
    "device_loop_idle_fraction",
    "device_step_ms",
    "device_transfer_ms",
    "gpu_util",
    "inflight_bytes",
    "host_key",
    "host_available_mb",
    "shm_free_mb",
)
"""The per-rank vector that every rank contributes at a logging step (NaN: not measured)."""

# The first ones describe the worst rank's loop; they are logged from that one rank so that they add up.
_WORST_RANK_FIELDS = FIELDS[: FIELDS.index("device_transfer_ms") + 1]


@dataclass(frozen=True)
class RankSummary:
    metrics: dict[str, float]
    worst_rank: int
    rank_wait_fractions: tuple[float, ...]
    inflight_host_bytes: float | None
    processes_on_host: int


def combine_ranks(rows: Sequence[Sequence[float]], this_rank: int = 0) -> RankSummary:
    """Reduce one row per rank (in ``FIELDS`` order) to the logged metrics.

    Example:
        >>> nan = float("nan")
        >>> device = [nan] * 5  # a CPU run: no device timeline
        >>> fast = [0.1, 1, 9, 100, 110, 200, 1, 5, 0, *device, nan, 1e6, 7, 1000, 500]
        >>> slow = [0.5, 5, 5, 100, 200, 100, 0, 5, 0, *device, nan, 1e6, 7, 1000, 500]
        >>> out = combine_ranks([fast, slow])
        >>> out.worst_rank, out.metrics["loadguard/wait_fraction"], out.metrics["loadguard/inflight_host_mb"]
        (1, 0.5, 2.0)

        On accelerators the ranks are compared by the device's idle for data: rank 0's device idles more,
        although its host waits less (rank 1's host waits while its device still has work queued).

        >>> fast[9:11], slow[9:11] = [0.3, 0.3], [0.02, 0.02]
        >>> out = combine_ranks([fast, slow])
        >>> out.worst_rank, out.rank_wait_fractions
        (0, (0.3, 0.02))
    """
    if not rows:
        raise ValueError("`rows` must hold at least one rank's figures.")
    index = {name: i for i, name in enumerate(FIELDS)}
    # On accelerators the data wait that costs is the device's idle for data; the host's wait may overlap
    # queued work. Every rank must have the device figure, or the ranks are compared on the host's clock.
    device = [row[index["device_data_idle_fraction"]] for row in rows]
    waits = device if not any(math.isnan(v) for v in device) else [row[index["wait_fraction"]] for row in rows]
    finite = [(w, r) for r, w in enumerate(waits) if not math.isnan(w)]
    worst = max(finite)[1] if finite else 0
    metrics: dict[str, float] = {}
    for name in _WORST_RANK_FIELDS:
        value = rows[worst][index[name]]
        if not math.isnan(value):
            metrics[f"loadguard/{name}"] = float(value)

    utils = [row[index["gpu_util"]] for row in rows if not math.isnan(row[index["gpu_util"]])]
    if utils:
        metrics["loadguard/gpu_util"] = sum(utils) / len(utils)

    per_host: dict[float, float] = {}
    budget_mb: dict[float, float] = {}
    ranks_per_host: dict[float, int] = {}
    for row in rows:
        key = row[index["host_key"]]
        ranks_per_host[key] = ranks_per_host.get(key, 0) + 1
        nbytes = row[index["inflight_bytes"]]
        if not math.isnan(nbytes):
            per_host[key] = per_host.get(key, 0.0) + nbytes
        # Worker batches pass through /dev/shm and land in RAM: the tighter of the two bounds them.
        budgets = [row[index[name]] for name in ("host_available_mb", "shm_free_mb")]
        budgets = [value for value in budgets if not math.isnan(value)]
        if budgets:
            budget_mb[key] = min([budget_mb.get(key, math.inf), *budgets])
    inflight = max(per_host.values()) if per_host else None
    if inflight is not None:
        metrics["loadguard/inflight_host_mb"] = inflight / 1e6
    shares = [per_host[key] / 1e6 / budget_mb[key] for key in per_host if budget_mb.get(key, 0) > 0]
    if shares:
        metrics["loadguard/inflight_budget_fraction"] = max(shares)
    for name in ("host_available_mb", "shm_free_mb"):
        values = [row[index[name]] for row in rows if not math.isnan(row[index[name]])]
        if values:
            metrics[f"loadguard/{name}"] = min(values)
    if len(rows) > 1:
        metrics["loadguard/worst_rank"] = float(worst)
    own_host = rows[min(this_rank, len(rows) - 1)][index["host_key"]]
    return RankSummary(
        metrics=metrics,
        worst_rank=worst,
        rank_wait_fractions=tuple(float(w) for w in waits),
        inflight_host_bytes=inflight,
        processes_on_host=ranks_per_host.get(own_host, 1),
    )
