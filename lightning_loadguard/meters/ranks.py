"""Combining the ranks' figures into what a user of a distributed run needs to see.

A slow rank stalls every other rank in the gradient all-reduce, so the figures that matter are the worst
rank's; memory is a per-host budget, so in-flight bytes are summed over the ranks of each host.

The figures are ``torchmetrics`` states synced by torchmetrics (with the strategy's ``all_gather`` as
``dist_sync_fn``, or torchmetrics' own gather under an initialised process group; a single process syncs
nothing). Most figures do not fit an element-wise reduction: the worst rank is *chosen* by one figure and its
other figures go with it, and hosts are groups of ranks; so every rank's row of figures is gathered
(``"cat"``, one collective per logging step) and the summary chooses. NaN marks a figure a rank did not
measure.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

import torch
from torchmetrics import Metric

from lightning_loadguard.meters.window import WindowSnapshot

WORST_RANK_FIELDS: tuple[str, ...] = (
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
)
"""Figures of the worst rank's loop, logged from that one rank so that they add up."""

_HOST_FIELDS = ("host_key", "inflight_bytes", "host_available_mb", "shm_free_mb")

FIELDS: tuple[str, ...] = (*WORST_RANK_FIELDS, "gpu_util", *_HOST_FIELDS, "logging_step_ms")
"""Every figure a rank contributes at a logging step. ``logging_step_ms`` (LoadGuard's own CPU time on its
previous logging step) is not logged: every rank paces its logging steps by the costliest rank's."""

_NAN = float("nan")
_FIELD_SET = frozenset(FIELDS)
_PRODUCTION = ("production_s", "production_cpu_s", "production_queued_s")

SyncFn = Callable[..., list[torch.Tensor]]


@dataclass(frozen=True)
class RankSummary:
    metrics: dict[str, float]
    worst_rank: int
    rank_wait_fractions: tuple[float, ...]
    inflight_host_bytes: float | None
    processes_on_host: int


def rank_figures(snapshot: WindowSnapshot, host_key: float, gpu_util: float | None = None) -> dict[str, float]:
    """This rank's ``FIELDS`` from its window (NaN: not measured).

    Example:
        >>> figures = rank_figures(WindowSnapshot(wait_s=(0.01, 0.03), step_s=(0.02, 0.02)), host_key=7.0)
        >>> round(figures["wait_fraction"], 3), figures["host_key"], math.isnan(figures["producer_rate"])
        (0.5, 7.0, True)
    """

    def opt(value: float | None, scale: float = 1.0) -> float:
        return _NAN if value is None else float(value) * scale

    steps = snapshot.steps
    # On an accelerator the loop's rates are the device's: the host's clock measures launches.
    loop = snapshot.device_view()
    device_steps = len(snapshot.device_step_s)
    period = snapshot.device_period_s

    def device_share(spans: tuple[float, ...]) -> float:
        return math.fsum(spans) / period if device_steps and period > 0 else _NAN

    def device_ms(spans: tuple[float, ...]) -> float:
        return math.fsum(spans) / device_steps * 1e3 if device_steps else _NAN

    return {
        "wait_fraction": snapshot.wait_fraction if steps else _NAN,
        "data_wait_ms": snapshot.mean_wait_s * 1e3 if steps else _NAN,
        "step_ms": snapshot.mean_step_s * 1e3 if steps else _NAN,
        "throughput": loop.throughput if loop.steps else _NAN,
        "consumer_rate": loop.consumer_rate if loop.steps and loop.mean_step_s > 0 else _NAN,
        "producer_rate": opt(snapshot.producer_rate),
        "ready_fraction": opt(snapshot.ready_fraction),
        "epoch_start_ms": opt(snapshot.epoch_start_s[-1] if snapshot.epoch_start_s else None, 1e3),
        "transfer_ms": snapshot.mean_transfer_s * 1e3 if steps else _NAN,
        "device_idle_fraction": opt(snapshot.device_idle_fraction),
        "device_data_idle_fraction": device_share(snapshot.device_data_idle_s),
        "device_loop_idle_fraction": device_share(snapshot.device_loop_idle_s),
        "device_step_ms": device_ms(snapshot.device_step_s),
        "device_transfer_ms": device_ms(snapshot.device_copy_s),
        "gpu_util": opt(gpu_util),
        "inflight_bytes": opt(snapshot.inflight_bytes),
        "host_key": host_key,
        "host_available_mb": opt(snapshot.host.available_ram_bytes, 1e-6),
        "shm_free_mb": opt(snapshot.host.shm_free_bytes, 1e-6),
    }


def _sync(metric: Metric, sync_fn: SyncFn | None, distributed: bool) -> None:
    metric.sync(dist_sync_fn=sync_fn, distributed_available=lambda: distributed)


class RankFigures(Metric):
    """One logging step's figures of every rank (``FIELDS``), combined into the logged metrics.

    All of a rank's figures travel as one row (one collective per logging step, whatever the number of
    figures); the rows of all ranks are gathered (``"cat"``, :meth:`gather`) and :func:`summarise` chooses
    from them.

    Example:
        >>> figures = RankFigures()
        >>> figures.update({"wait_fraction": 0.25, "host_key": 7.0, "inflight_bytes": 2e6})
        >>> summary = summarise(figures.gather(), this_rank=0)
        >>> summary.metrics["loadguard/wait_fraction"], summary.metrics["loadguard/inflight_host_mb"]
        (0.25, 2.0)
    """

    full_state_update = False

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(sync_on_compute=False, **kwargs)
        self.add_state("figures", default=torch.full((len(FIELDS),), _NAN, dtype=torch.float64), dist_reduce_fx="cat")

    def update(self, values: dict[str, float]) -> None:  # type: ignore[override]
        """This rank's figures by name (a missing or NaN figure was not measured)."""
        self.figures = torch.tensor(_row(values), dtype=torch.float64, device=self.device)

    def compute(self) -> dict[str, list[float]]:
        """Every rank's figures, by name (index = global rank)."""
        return self._by_name()

    def _by_name(self) -> dict[str, list[float]]:
        rows = self.figures.reshape(-1, len(FIELDS)).cpu().T.tolist()
        return dict(zip(FIELDS, rows, strict=True))

    def gather(self, sync_fn: SyncFn | None = None, world_size: int = 1) -> dict[str, list[float]]:
        """Every rank's figures by name (the collective: every rank must call this at the same step), and start
        afresh."""
        if world_size > 1:
            _sync(self, sync_fn, True)
        try:
            return self._by_name()
        finally:
            if self._is_synced:
                self.unsync()
            self.figures = torch.full((len(FIELDS),), _NAN, dtype=torch.float64, device=self.device)


def _row(values: dict[str, float]) -> list[float]:
    unknown = set(values) - _FIELD_SET
    if unknown:
        raise ValueError(f"unknown rank figures {sorted(unknown)}; allowed: {', '.join(FIELDS)}")
    return [float(values.get(name, _NAN)) for name in FIELDS]


@dataclass(frozen=True)
class LoggingPace:
    """What the logging cadence is paced from, read from every rank's figures: the same on every rank.

    Attributes:
        period_s: the step period (data wait and step) of the rank that waits most (NaN: not known).
        logging_step_s: the costliest rank's CPU time on its previous logging step (0: not known yet).
    """

    period_s: float
    logging_step_s: float


def logging_pace(ranks: dict[str, list[float]]) -> LoggingPace:
    """The :class:`LoggingPace` of every rank's figures (:meth:`RankFigures.gather`).

    Apart from the rest of the reduction (:func:`summarise`) and as plain arithmetic: which steps log must
    follow from what all ranks share, or they stop meeting in the gather.

    Example:
        >>> logging_pace(rank_rows({"wait_fraction": 0.5, "data_wait_ms": 4.0, "step_ms": 6.0, "logging_step_ms": 2.0}))
        LoggingPace(period_s=0.01, logging_step_s=0.002)
    """
    worst = _worst_rank(_rank_waits(ranks))
    period_ms = ranks["data_wait_ms"][worst] + ranks["step_ms"][worst]
    costs = [value for value in ranks["logging_step_ms"] if not math.isnan(value)]
    return LoggingPace(period_s=period_ms / 1e3, logging_step_s=max(costs) / 1e3 if costs else 0.0)


def rank_rows(values: dict[str, float]) -> dict[str, list[float]]:
    """One rank's figures in the form of :meth:`RankFigures.gather`: a run with one process, without a
    collective."""
    return {name: [value] for name, value in zip(FIELDS, _row(values), strict=True)}


def _rank_waits(ranks: dict[str, list[float]]) -> list[float]:
    """Each rank's share of time waiting for data. On accelerators the data wait that costs is the device's
    idle for data; the host's wait may overlap queued work. Every rank must have the device figure, or the ranks
    are compared on the host's clock."""
    device = ranks["device_data_idle_fraction"]
    return device if not any(math.isnan(v) for v in device) else ranks["wait_fraction"]


def _worst_rank(waits: list[float]) -> int:
    finite = [(w, r) for r, w in enumerate(waits) if not math.isnan(w)]
    return max(finite)[1] if finite else 0


def summarise(ranks: dict[str, list[float]], this_rank: int = 0) -> RankSummary:
    """The logged figures of every rank's figures (:meth:`RankFigures.gather`, or :func:`rank_rows` for one
    process), seen from ``this_rank``.

    Example:
        >>> summarise(rank_rows({"wait_fraction": 0.25, "host_key": 7.0})).metrics["loadguard/wait_fraction"]
        0.25
    """
    gpu = [value for value in ranks["gpu_util"] if not math.isnan(value)]
    waits = _rank_waits(ranks)
    worst = _worst_rank(waits)
    metrics: dict[str, float] = {}
    for name in WORST_RANK_FIELDS:
        value = ranks[name][worst]
        if not math.isnan(value):
            metrics[f"loadguard/{name}"] = float(value)
    if gpu:
        metrics["loadguard/gpu_util"] = math.fsum(gpu) / len(gpu)

    per_host: dict[float, float] = {}
    budget_mb: dict[float, float] = {}
    ranks_per_host: dict[float, int] = {}
    for rank, key in enumerate(ranks["host_key"]):
        ranks_per_host[key] = ranks_per_host.get(key, 0) + 1
        nbytes = ranks["inflight_bytes"][rank]
        if not math.isnan(nbytes):
            per_host[key] = per_host.get(key, 0.0) + nbytes
        # Worker batches pass through /dev/shm and land in RAM: the tighter of the two bounds them.
        budgets = [ranks[name][rank] for name in ("host_available_mb", "shm_free_mb")]
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
        values = [value for value in ranks[name] if not math.isnan(value)]
        if values:
            metrics[f"loadguard/{name}"] = min(values)
    if len(waits) > 1:
        metrics["loadguard/worst_rank"] = float(worst)
    keys = ranks["host_key"]
    own_host = keys[min(this_rank, len(keys) - 1)]
    return RankSummary(
        metrics=metrics,
        worst_rank=worst,
        rank_wait_fractions=tuple(float(w) for w in waits),
        inflight_host_bytes=inflight,
        processes_on_host=ranks_per_host.get(own_host, 1),
    )


class WindowRanks(Metric):
    """One tuning window of every rank, combined into the window the tuner judges a setting by.

    The ranks step together, so a setting is as fast as its slowest producer: the combined window takes the
    production times of the rank with the slowest producer, the waits of the rank that waited most, and the
    step times of the rank with the shortest step (under DDP a fast rank waits for a slow one inside the
    gradient all-reduce, which shows up as step time: the shortest is the closest to the real compute). The
    fewest batches made count; a failure on any rank fails the window. The host's CPU figures stay this
    rank's (the ranks of one host measured the same host).

    Args:
        steps: the window's length in steps (equal on every rank); longer sequences keep their latest part.
        production: how many of each rank's latest production times travel.

    Example:
        >>> local = WindowSnapshot(wait_s=(0.01,) * 4, step_s=(0.02,) * 4, production_s=(0.05,) * 6, batches_made=6)
        >>> window = WindowRanks(steps=4, production=8)
        >>> window.update(local, failed=False)
        >>> combined, failed = window.combine(local)
        >>> combined.batches_made, combined.production_s == local.production_s, failed
        (6, True, False)
    """

    full_state_update = False

    def __init__(self, steps: int, production: int, **kwargs: Any) -> None:
        super().__init__(sync_on_compute=False, **kwargs)
        self.steps = steps
        self.production = production
        self.add_state("made", default=torch.tensor(math.inf, dtype=torch.float64), dist_reduce_fx="min")
        self.add_state("failed", default=torch.tensor(0.0, dtype=torch.float64), dist_reduce_fx="max")
        for name, length in (("wait_s", steps), ("step_s", steps)):
            self.add_state(name, default=torch.full((length,), _NAN, dtype=torch.float64), dist_reduce_fx="cat")
        for name in _PRODUCTION:
            self.add_state(name, default=torch.full((production,), _NAN, dtype=torch.float64), dist_reduce_fx="cat")

    def update(self, window: WindowSnapshot, failed: bool) -> None:  # type: ignore[override]
        """This rank's window (a rank without a measured producer leaves ``made`` unknown: +inf)."""
        if window.batches_made is not None:
            self.made = torch.tensor(float(window.batches_made), dtype=torch.float64, device=self.device)
        self.failed = torch.tensor(1.0 if failed else 0.0, dtype=torch.float64, device=self.device)
        for name, length in (("wait_s", self.steps), ("step_s", self.steps)):
            setattr(self, name, self._padded(getattr(window, name), length))
        for name in _PRODUCTION:
            setattr(self, name, self._padded(getattr(window, name), self.production))

    def _padded(self, values: Sequence[float], length: int) -> torch.Tensor:
        row = torch.full((length,), _NAN, dtype=torch.float64, device=self.device)
        tail = list(values[-length:]) if length else []
        if tail:
            row[length - len(tail) :] = torch.tensor(tail, dtype=torch.float64, device=self.device)
        return row

    def compute(self) -> dict[str, torch.Tensor]:
        """Every rank's rows (one per rank) and the reduced figures."""
        rows = {name: getattr(self, name).reshape(-1, self.steps) for name in ("wait_s", "step_s")}
        for name in _PRODUCTION:
            rows[name] = getattr(self, name).reshape(-1, self.production)
        rows["made"], rows["failed"] = self.made, self.failed
        return rows

    def combine(
        self, local: WindowSnapshot, sync_fn: SyncFn | None = None, world_size: int = 1
    ) -> tuple[WindowSnapshot, bool]:
        """Sync the ranks' windows (every rank at the same step) and return the combined one, and whether any
        rank failed."""
        _sync(self, sync_fn, world_size > 1)
        try:
            rows = {name: value.cpu() for name, value in self.compute().items()}
        finally:
            if self._is_synced:
                self.unsync()
            self.reset()
        wait = _known(_pick(rows["wait_s"], largest=True))
        step = _known(_pick(rows["step_s"], largest=False))
        n = min(len(wait), len(step))
        production = rows["production_s"]
        metered = bool(production.shape[1]) and not bool(torch.isnan(production).all(dim=1).any())
        if metered:
            worst = int(torch.nanmean(production, dim=1).argmax())
            # NaN pads a short row; a CPU time may also be NaN (not sampled): keep the rows aligned.
            made = ~torch.isnan(production[worst])
            picked = {name: tuple(rows[name][worst][made].tolist()) for name in _PRODUCTION}
        else:
            picked = dict.fromkeys(_PRODUCTION, ())
        made = float(rows["made"])
        combined = replace(
            local,
            wait_s=wait[len(wait) - n :],
            step_s=step[len(step) - n :],
            transfer_s=(),
            wait_queued_s=(),
            ready=None,
            buffer_level=None,
            **picked,
            batches_made=None if math.isinf(made) else int(made),
        )
        return combined, bool(float(rows["failed"]) > 0)


def _pick(rows: torch.Tensor, *, largest: bool) -> torch.Tensor:
    means = torch.nanmean(rows, dim=1)
    means = torch.where(torch.isnan(means), torch.full_like(means, -math.inf if largest else math.inf), means)
    return rows[int(means.argmax() if largest else means.argmin())]


def _known(row: torch.Tensor) -> tuple[float, ...]:
    return tuple(row[~torch.isnan(row)].tolist())
