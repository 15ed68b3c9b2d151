"""Combining the ranks' figures into what a user of a distributed run needs to see.

A slow rank stalls every other rank in the gradient all-reduce, so the loop's figures that matter are the worst
rank's; cores, memory and ``/dev/shm`` are a host's, so loader workers, prefetched batches and their bytes are
summed over the ranks of each host (:func:`host_figures`), each rank's from its own loader as it runs.

Why one ``all_gather`` of one row per rank, and not ``torchmetrics``: torchmetrics reduces each declared state
element-wise across the ranks, one collective per state (and, for ``"cat"`` states, a gather of their shapes
first). These figures do not reduce element-wise: the worst rank is *chosen* by one figure and its other figures
go with it; a host is a group of ranks, named by one figure, whose other figures are summed within the group;
the tuner's window keeps one rank's whole series of production times. So each rank packs all of its figures into
one fixed-length row of float64, every row is gathered in one collective (a :data:`Gather`: one per logging
step, one per tuning window), and plain arithmetic on the gathered rows, the same on every rank, chooses and
sums. NaN marks a figure a rank did not measure.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from statistics import fmean

import torch

from lightning_loadguard.meters.settings import LoaderSettings
from lightning_loadguard.meters.window import WindowSnapshot

Gather = Callable[[Sequence[float]], list[list[float]]]
"""The collective: every rank calls it at the same point with a row of the same length, and gets every rank's
row back (index = global rank)."""

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

_HOST_FIELDS = (
    "host_key",
    "workers",
    "prefetch_capacity",
    "prefetch_queued",
    "inflight_bytes",
    "queued_bytes",
    "host_cores",
    "host_available_mb",
    "shm_free_mb",
)

FIELDS: tuple[str, ...] = (*WORST_RANK_FIELDS, "gpu_util", *_HOST_FIELDS, "logging_step_ms")
"""Every figure a rank contributes at a logging step. ``logging_step_ms`` (LoadGuard's own CPU time on its
previous logging step) is not logged: every rank paces its logging steps by the costliest rank's."""

_NAN = float("nan")
_FIELD_SET = frozenset(FIELDS)
_PRODUCTION = ("production_s", "production_cpu_s", "production_queued_s")


@dataclass(frozen=True)
class HostFigures:
    """One host's figures over a logging window: each summed over the training processes (ranks) that name
    the host alike (see :func:`~lightning_loadguard.meters.host.host_name`), from each rank's own loader settings
    and measurements. A sum is ``None`` where a rank of the host did not measure its part.

    Attributes:
        processes: training processes (ranks) on the host.
        workers: loader worker processes of all of them.
        prefetch_capacity: batches their prefetch queues can hold (``num_workers x prefetch_factor`` per loader,
            + 1 with ``pin_memory``).
        prefetch_queued: batches made and waiting in those queues, each rank's mean over its window.
        inflight_bytes: bytes of ``prefetch_capacity`` batches (each rank's batch size in host memory).
        queued_bytes: bytes of the ``prefetch_queued`` batches.
        cores: cores the host's training processes may use (the most any of them may: they share the host's).
        available_mb: the host's available RAM (the lowest reading of its ranks).
        shm_free_mb: its free ``/dev/shm`` (the lowest reading).
    """

    processes: int
    workers: int | None = None
    prefetch_capacity: int | None = None
    prefetch_queued: float | None = None
    inflight_bytes: float | None = None
    queued_bytes: float | None = None
    cores: int | None = None
    available_mb: float | None = None
    shm_free_mb: float | None = None

    @property
    def budget_fraction(self) -> float | None:
        """``inflight_bytes`` as a share of the tighter of available RAM and free ``/dev/shm`` (worker batches
        pass through ``/dev/shm`` and land in RAM), or ``None`` where either side is unknown."""
        budgets = [v for v in (self.available_mb, self.shm_free_mb) if v is not None]
        if self.inflight_bytes is None or not budgets or min(budgets) <= 0:
            return None
        return self.inflight_bytes / 1e6 / min(budgets)


@dataclass(frozen=True)
class RankSummary:
    """The logged figures of every rank's figures, seen from one rank.

    Attributes:
        metrics: the ``loadguard/*`` figures by name.
        worst_rank: the rank whose loop figures are logged.
        rank_wait_fractions: every rank's wait share (index = global rank).
        host: this rank's host.
        hosts: hosts the ranks run on.
    """

    metrics: dict[str, float]
    worst_rank: int
    rank_wait_fractions: tuple[float, ...]
    host: HostFigures
    hosts: int

    @property
    def processes_on_host(self) -> int:
        return self.host.processes

    @property
    def inflight_host_bytes(self) -> float | None:
        return self.host.inflight_bytes


def rank_figures(
    snapshot: WindowSnapshot,
    host_key: float,
    gpu_util: float | None = None,
    loaders: Sequence[LoaderSettings] | None = None,
) -> dict[str, float]:
    """This rank's ``FIELDS`` from its window (NaN: not measured).

    Args:
        snapshot: the rank's window.
        host_key: the number naming the rank's host (:func:`~lightning_loadguard.meters.host.host_key`).
        gpu_util: the accelerator's utilization, where measured.
        loaders: the settings of every train loader the rank iterates (default: the window's one). With
            several, their workers and queues are counted, their bytes are not (the batch measured is theirs
            together).

    Example:
        >>> snap = WindowSnapshot(wait_s=(0.01, 0.03), step_s=(0.02, 0.02), batch_bytes=1000,
        ...                       settings=LoaderSettings(num_workers=2, prefetch_factor=3), buffer_level=(5, 6))
        >>> figures = rank_figures(snap, host_key=7.0)
        >>> figures["wait_fraction"], figures["workers"], figures["prefetch_capacity"], figures["queued_bytes"]
        (0.5, 2.0, 6.0, 5500.0)
        >>> figures["host_key"], math.isnan(figures["producer_rate"])
        (7.0, True)
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
        "host_key": host_key,
        **_loader_figures(snapshot, (snapshot.settings,) if loaders is None else tuple(loaders)),
        "host_cores": float(snapshot.host.cpu_count),
        "host_available_mb": opt(snapshot.host.available_ram_bytes, 1e-6),
        "shm_free_mb": opt(snapshot.host.shm_free_bytes, 1e-6),
    }


def _loader_figures(snapshot: WindowSnapshot, loaders: tuple[LoaderSettings, ...]) -> dict[str, float]:
    """Workers and prefetch queues of the rank's loaders: their capacity from the settings they run with, what
    is queued from the window's readings of the queue (nothing without workers)."""
    workers = sum(settings.num_workers for settings in loaders)
    capacity = sum(settings.batches_in_flight for settings in loaders)
    queued = inflight = queued_bytes = _NAN
    if workers == 0:
        queued = 0.0
    elif len(loaders) == 1 and snapshot.buffer_level:
        queued = fmean(snapshot.buffer_level)
    if len(loaders) == 1 or workers == 0:
        batch = snapshot.batch_bytes
        if batch is not None:
            inflight, queued_bytes = float(batch * capacity), batch * queued
    return {
        "workers": float(workers),
        "prefetch_capacity": float(capacity),
        "prefetch_queued": queued,
        "inflight_bytes": inflight,
        "queued_bytes": queued_bytes,
    }


def figure_row(values: dict[str, float]) -> list[float]:
    """A rank's figures by name as the row it hands to the gather (a missing figure: NaN).

    Example:
        >>> row = figure_row({"wait_fraction": 0.25})
        >>> len(row) == len(FIELDS), row[0], math.isnan(row[1])
        (True, 0.25, True)
    """
    unknown = set(values) - _FIELD_SET
    if unknown:
        raise ValueError(f"unknown rank figures {sorted(unknown)}; allowed: {', '.join(FIELDS)}")
    return [float(values.get(name, _NAN)) for name in FIELDS]


def figures_by_name(rows: Sequence[Sequence[float]]) -> dict[str, list[float]]:
    """Every rank's figures by name (index = global rank), from the gathered rows (:func:`figure_row`)."""
    if any(len(row) != len(FIELDS) for row in rows):
        raise ValueError(f"a rank's row holds {sorted({len(r) for r in rows})} figures, not {len(FIELDS)}")
    return dict(zip(FIELDS, map(list, zip(*rows, strict=True)), strict=True))


def rank_rows(values: dict[str, float]) -> dict[str, list[float]]:
    """One rank's figures in the form of :func:`figures_by_name`: a run with one process, without a
    collective."""
    return figures_by_name([figure_row(values)])


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
    """The :class:`LoggingPace` of every rank's figures (:func:`figures_by_name`).

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


def _rank_waits(ranks: dict[str, list[float]]) -> list[float]:
    """Each rank's share of time waiting for data. On accelerators the data wait that costs is the device's
    idle for data; the host's wait may overlap queued work. Every rank must have the device figure, or the ranks
    are compared on the host's clock."""
    device = ranks["device_data_idle_fraction"]
    return device if not any(math.isnan(v) for v in device) else ranks["wait_fraction"]


def _worst_rank(waits: list[float]) -> int:
    finite = [(w, r) for r, w in enumerate(waits) if not math.isnan(w)]
    return max(finite)[1] if finite else 0


def _total(values: list[float]) -> float | None:
    """The sum, or ``None`` where a rank did not measure its part (a partial sum would pass for the host's)."""
    return None if not values or any(math.isnan(v) for v in values) else math.fsum(values)


def _lowest(values: list[float]) -> float | None:
    known = [v for v in values if not math.isnan(v)]
    return min(known) if known else None


def host_figures(ranks: dict[str, list[float]]) -> dict[float, HostFigures]:
    """Every host's :class:`HostFigures`, by host key, from every rank's figures (:func:`figures_by_name`).

    A rank whose host key is unknown (NaN) counts on no host.

    Example:
        Two ranks on host 1 (2 workers x prefetch 3, and 1 x 2), one on host 2:

        >>> rows = [{"host_key": 1.0, "workers": 2.0, "prefetch_capacity": 6.0, "inflight_bytes": 6e6},
        ...         {"host_key": 1.0, "workers": 1.0, "prefetch_capacity": 2.0, "inflight_bytes": 2e6},
        ...         {"host_key": 2.0, "workers": 1.0, "prefetch_capacity": 4.0, "inflight_bytes": 4e6}]
        >>> hosts = host_figures(figures_by_name([figure_row(row) for row in rows]))
        >>> one = hosts[1.0]
        >>> one.processes, one.workers, one.prefetch_capacity, one.inflight_bytes, hosts[2.0].workers
        (2, 3, 8, 8000000.0, 1)
    """
    members: dict[float, list[int]] = {}
    for rank, key in enumerate(ranks["host_key"]):
        if not math.isnan(key):
            members.setdefault(key, []).append(rank)
    hosts = {}
    for key, of_host in members.items():

        def column(name: str, of_host: list[int] = of_host) -> list[float]:
            return [ranks[name][rank] for rank in of_host]

        workers, capacity, cores = _total(column("workers")), _total(column("prefetch_capacity")), column("host_cores")
        known_cores = [v for v in cores if not math.isnan(v)]
        hosts[key] = HostFigures(
            processes=len(of_host),
            workers=None if workers is None else round(workers),
            prefetch_capacity=None if capacity is None else round(capacity),
            prefetch_queued=_total(column("prefetch_queued")),
            inflight_bytes=_total(column("inflight_bytes")),
            queued_bytes=_total(column("queued_bytes")),
            cores=round(max(known_cores)) if known_cores else None,
            available_mb=_lowest(column("host_available_mb")),
            shm_free_mb=_lowest(column("shm_free_mb")),
        )
    return hosts


HOST_METRICS: dict[str, str] = {
    "loadguard/host_processes": "processes",
    "loadguard/host_workers": "workers",
    "loadguard/host_prefetch_capacity": "prefetch_capacity",
    "loadguard/host_prefetch_queued": "prefetch_queued",
    "loadguard/inflight_host_mb": "inflight_bytes",
    "loadguard/queued_host_mb": "queued_bytes",
    "loadguard/inflight_budget_fraction": "budget_fraction",
    "loadguard/host_cores": "cores",
    "loadguard/host_available_mb": "available_mb",
    "loadguard/shm_free_mb": "shm_free_mb",
}
"""The logged figures of a rank's own host, by the :class:`HostFigures` attribute each comes from."""


def summarise(ranks: dict[str, list[float]], this_rank: int = 0) -> RankSummary:
    """The logged figures of every rank's figures (:func:`figures_by_name`, or :func:`rank_rows` for one
    process), seen from ``this_rank``: the worst rank's loop, ``this_rank``'s host, and where the ranks span
    several hosts, the most any host holds.

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
    hosts = host_figures(ranks)
    keys = ranks["host_key"]
    own_key = keys[min(this_rank, len(keys) - 1)]
    own = hosts.get(own_key, HostFigures(processes=1))
    for metric, attribute in HOST_METRICS.items() if own_key in hosts else ():
        value = getattr(own, attribute)
        if value is not None:
            metrics[metric] = value / 1e6 if metric.endswith("_mb") and attribute.endswith("_bytes") else value
    if len(hosts) > 1:
        metrics["loadguard/hosts"] = float(len(hosts))
        inflight = [h.inflight_bytes for h in hosts.values()]
        if all(v is not None for v in inflight):
            metrics["loadguard/inflight_host_mb_max"] = max(inflight) / 1e6  # type: ignore[type-var]
        shares = [h.budget_fraction for h in hosts.values()]
        if all(v is not None for v in shares):
            metrics["loadguard/inflight_budget_fraction_max"] = max(shares)  # type: ignore[type-var]
    if len(waits) > 1:
        metrics["loadguard/worst_rank"] = float(worst)
    metrics = {name: float(value) for name, value in metrics.items()}
    return RankSummary(
        metrics=metrics,
        worst_rank=worst,
        rank_wait_fractions=tuple(float(w) for w in waits),
        host=own,
        hosts=len(hosts),
    )


class WindowRanks:
    """One tuning window of every rank, combined into the window the tuner judges a setting by.

    The ranks step together, so a setting is as fast as its slowest producer: the combined window takes the
    production times of the rank with the slowest producer, the waits of the rank that waited most, and the
    step times of the rank with the shortest step (under DDP a fast rank waits for a slow one inside the
    gradient all-reduce, which shows up as step time: the shortest is the closest to the real compute). The
    fewest batches made count; a failure on any rank fails the window. The host's CPU figures stay this
    rank's (the ranks of one host measured the same host).

    Each rank's window travels as one row (:meth:`row`: the batches made, two flags, the waits, the step times
    and the production series, each padded to a fixed length with NaN), so a window costs one collective.

    Args:
        steps: the window's length in steps (equal on every rank); longer sequences keep their latest part.
        production: how many of each rank's latest production times travel.

    Example:
        >>> local = WindowSnapshot(wait_s=(0.01,) * 4, step_s=(0.02,) * 4, production_s=(0.05,) * 6, batches_made=6)
        >>> window = WindowRanks(steps=4, production=8)
        >>> rows = [window.row(local, failed=False)]  # the gather, on one process
        >>> window.broken(rows)
        False
        >>> combined, failed = window.combine(local, rows)
        >>> combined.batches_made, combined.production_s == local.production_s, failed
        (6, True, False)
    """

    def __init__(self, steps: int, production: int) -> None:
        self.steps = steps
        self.production = production
        self._spans = (("wait_s", steps), ("step_s", steps), *((name, production) for name in _PRODUCTION))

    def row(self, window: WindowSnapshot | None, failed: bool) -> list[float]:
        """This rank's row: ``window`` (``None``: measuring it failed here, and every rank stops, see
        :meth:`broken`) and whether the setting failed on this rank. A rank without a measured producer leaves
        the batches made unknown (+inf)."""
        if window is None:
            return [math.inf, 0.0, 1.0, *[_NAN] * sum(length for _, length in self._spans)]
        made = math.inf if window.batches_made is None else float(window.batches_made)
        row = [made, 1.0 if failed else 0.0, 0.0]
        for name, length in self._spans:
            tail = [float(v) for v in getattr(window, name)[-length:]] if length else []
            row += [_NAN] * (length - len(tail)) + tail
        return row

    def broken(self, rows: Sequence[Sequence[float]]) -> bool:
        """Whether measuring the window failed on any rank (the same answer on every rank)."""
        return any(row[2] > 0 for row in rows)

    def combine(self, local: WindowSnapshot, rows: Sequence[Sequence[float]]) -> tuple[WindowSnapshot, bool]:
        """The combined window of every rank's row (index = global rank), and whether any rank failed."""
        table = torch.tensor(rows, dtype=torch.float64).reshape(len(rows), -1)
        columns: dict[str, torch.Tensor] = {}
        at = 3
        for name, length in self._spans:
            columns[name] = table[:, at : at + length]
            at += length
        wait = _known(_pick(columns["wait_s"], largest=True))
        step = _known(_pick(columns["step_s"], largest=False))
        n = min(len(wait), len(step))
        production = columns["production_s"]
        metered = bool(production.shape[1]) and not bool(torch.isnan(production).all(dim=1).any())
        if metered:
            worst = int(torch.nanmean(production, dim=1).argmax())
            # NaN pads a short row; a CPU time may also be NaN (not sampled): keep the rows aligned.
            made = ~torch.isnan(production[worst])
            picked = {name: tuple(columns[name][worst][made].tolist()) for name in _PRODUCTION}
        else:
            picked = dict.fromkeys(_PRODUCTION, ())
        fewest = float(table[:, 0].min())
        combined = replace(
            local,
            wait_s=wait[len(wait) - n :],
            step_s=step[len(step) - n :],
            transfer_s=(),
            wait_queued_s=(),
            ready=None,
            buffer_level=None,
            **picked,
            batches_made=None if math.isinf(fewest) else int(fewest),
        )
        return combined, bool(float(table[:, 1].max()) > 0)


def _pick(rows: torch.Tensor, *, largest: bool) -> torch.Tensor:
    means = torch.nanmean(rows, dim=1)
    means = torch.where(torch.isnan(means), torch.full_like(means, -math.inf if largest else math.inf), means)
    return rows[int(means.argmax() if largest else means.argmin())]


def _known(row: torch.Tensor) -> tuple[float, ...]:
    return tuple(row[~torch.isnan(row)].tolist())
