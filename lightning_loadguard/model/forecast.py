"""Forecast before you scale: what more ranks per node, fewer cores, a faster step or other loader settings would do.

From one run's measured facts (:class:`ForecastFacts`: per-batch production time and its CPU share, the step's
time and CPU, the hand-over of a ready batch, batch bytes, the host's cores, RAM and ``/dev/shm``) and a
:class:`WhatIf`, :func:`forecast` predicts per rank the throughput and wait fraction, the workers and prefetch
that would keep up, and node-wide the worker processes against the cores, the in-flight memory against RAM and
``/dev/shm``, and which limit binds first, each prediction with a margin from the measured spread.

The method, in three steps:

1. **Scale the measured times.** Each measured production time is multiplied by the batch scale ``b``; each
   step time by ``b / k`` (``k``: the step's speed-up), and the hand-over of a ready batch (its way from a
   worker into the loop) by ``b``.
2. **Replay them through the loader.** The scaled sequences run through the bounded-buffer model of a
   ``DataLoader`` (:func:`~lightning_loadguard.model.buffer.simulate_buffer`) at the what-if's workers and
   prefetch depth: its steady state gives the wait per step and the throughput, bursts included.
3. **Share the cores.** The node's CPU demand at that rate (every rank's step CPU and batch CPU per step) is set
   against the cores left by other work. Where it exceeds them, every CPU-bound part (a worker's busy time at its
   measured CPU share, the step at its CPU share) slows by one common factor, found by bisection, until the demand
   fits (processor sharing); the replay is run at that factor.

The margin of each prediction is the forecast again with the production and step times at two standard
deviations of their block means (the run's own drift, :func:`relative_spread`) and the other work at two standard
deviations of what it used per window: the smallest and the largest results bound the figure.

Example:
    A loader with one worker that spends 16 ms of CPU on each batch, feeding a 20 ms step that waits on an
    accelerator: with the step twice as fast, the worker cannot keep up.

    >>> facts = ForecastFacts(production_s=(0.016,) * 64, step_s=(0.020,) * 64, num_workers=1, prefetch_factor=2,
    ...     cpu_share=1.0, batch_cpu_s=0.016, step_cpu_s=0.001, usable_cores=2.0, host_cores=2)
    >>> now, faster = forecast(facts), forecast(facts, WhatIf(step_speedup=2.0))
    >>> round(now.throughput.value, 1), round(faster.throughput.value, 1), faster.limited_by
    (50.0, 62.5, 'workers')
    >>> faster.workers_needed
    2
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field, fields
from statistics import fmean, pstdev
from typing import Any, Literal

from lightning_loadguard.meters.settings import DEFAULT_PREFETCH, LoaderSettings
from lightning_loadguard.meters.window import HostFacts, WindowSnapshot
from lightning_loadguard.model import budget as hb
from lightning_loadguard.model import capacity as cap
from lightning_loadguard.model.buffer import simulate_buffer

Limit = Literal["step", "workers", "loading in the loop", "cores"]
NodeLimit = Literal["workers", "cores", "host_memory", "shm"]

SPREAD_BLOCKS = 8
"""Blocks a measured sequence is cut into for its spread: the standard deviation of the block means is the drift a
window of a similar length sees."""

MIN_BLOCK = 4
"""Fewest values per block; shorter sequences give fewer blocks (and with fewer than two, no spread)."""

MARGIN_SIGMAS = 2.0
"""Standard deviations of the measured spread the margin spans (about 95 % where the drift is normal)."""

REPLAY_STEPS = 512
"""Steps each replay runs (at least; four cycles of the longer measured sequence where that is more); the first
half fills the buffer and is left out, so the figures are the steady state's."""

KEPT_VALUES = 512
"""Most values of each measured sequence :class:`ForecastFacts` keeps (the latest): enough for the replay and the
spread, small enough to log."""

FACTS_TAG = "loadguard/forecast_facts"
"""The text tag LoadGuard logs a run's :class:`ForecastFacts` under at the end of fit (``loadguard report --what-if``
reads them back)."""

SLOWDOWN_TOLERANCE = 1e-4
"""The fair-share slow-down is found to this relative precision: far below what any measured figure resolves."""

_MAX_STRETCH = 1e4


@dataclass(frozen=True)
class ForecastFacts:
    """What one run measured that a forecast needs (seconds unless stated; one rank's view).

    Build it from a window of measurements with :func:`facts_from_window`; :meth:`to_dict` / :meth:`from_dict`
    carry it through a log.

    Attributes:
        production_s: per batch, the busy time of the worker that made it (the loop's fetch without workers).
        step_s: per step, the loop's time outside the fetch.
        num_workers, prefetch_factor, pin_memory: the loader's settings while measured.
        cpu_share: share of a core a busy worker computes (0..1); ``None``: unmeasured, taken as 1.
        batch_cpu_s: CPU seconds making one batch takes; ``None``: the busy time times ``cpu_share``.
        step_cpu_s: CPU seconds the training process spends per step, batch making excluded (``None``: unmeasured,
            taken as 0: the step is assumed to wait on an accelerator).
        handover_s: the mean wait of a fetch whose batch was already made (``None``: not measured, taken as 0).
        batch_bytes: one batch in host memory (``None``: memory is not forecast).
        batch_size: samples per batch, where known.
        ranks_per_node: training processes on the host while measured.
        usable_cores: cores each process could use (affinity and quota).
        host_cores: CPUs of the affinity mask (the ones other work shares).
        other_cores: cores other work used on them (other jobs; not this run's ranks).
        other_cores_spread: the standard deviation of ``other_cores`` over the windows measured.
        production_queued_share: the share of the workers' busy time they spent waiting for a core.
        workers_on_host, inflight_host_bytes: loader workers and in-flight batch bytes summed over the host's ranks,
            each rank's own (``None``: not summed); a forecast that keeps the loader settings scales these, so ranks
            with settings of their own count as they ran.
        available_ram_bytes, shm_free_bytes: the host's memory while measured.
        throughput, wait_fraction: what the loop achieved while measured (steps/s per rank, 0..1).
    """

    production_s: tuple[float, ...]
    step_s: tuple[float, ...]
    num_workers: int = 0
    prefetch_factor: int = DEFAULT_PREFETCH
    pin_memory: bool = False
    cpu_share: float | None = None
    batch_cpu_s: float | None = None
    step_cpu_s: float | None = None
    handover_s: float | None = None
    batch_bytes: int | None = None
    batch_size: int | None = None
    ranks_per_node: int = 1
    usable_cores: float = 1.0
    host_cores: int = 1
    other_cores: float = 0.0
    other_cores_spread: float = 0.0
    production_queued_share: float = 0.0
    workers_on_host: int | None = None
    inflight_host_bytes: int | None = None
    available_ram_bytes: int | None = None
    shm_free_bytes: int | None = None
    throughput: float | None = None
    wait_fraction: float | None = None

    def __post_init__(self) -> None:
        for name in ("production_s", "step_s"):
            values = getattr(self, name)
            if not values or not all(math.isfinite(v) and v >= 0 for v in values):
                raise ValueError(f"ForecastFacts.{name} must hold at least one finite time >= 0, got {values!r}")
        if self.num_workers < 0 or self.prefetch_factor < 1:
            raise ValueError(
                f"ForecastFacts needs num_workers >= 0 and prefetch_factor >= 1, got {self.num_workers!r} and "
                f"{self.prefetch_factor!r}"
            )
        if not (self.usable_cores > 0 and self.host_cores >= 1 and self.ranks_per_node >= 1):
            raise ValueError("ForecastFacts needs usable_cores > 0, host_cores >= 1 and ranks_per_node >= 1")

    @property
    def settings(self) -> LoaderSettings:
        return LoaderSettings(self.num_workers, self.prefetch_factor, pin_memory=self.pin_memory)

    @property
    def worker_cpu_share(self) -> float:
        """The share of a core a busy worker computes, 1 where unmeasured (the cautious assumption)."""
        return 1.0 if self.cpu_share is None else min(1.0, max(0.0, self.cpu_share))

    @property
    def batch_cpu(self) -> float:
        """CPU seconds per batch: measured, else the mean busy time at the worker's CPU share."""
        if self.batch_cpu_s is not None:
            return self.batch_cpu_s
        return fmean(self.production_s) * self.worker_cpu_share

    @property
    def measured_slowdown(self) -> float:
        """How much slower the workers' CPU-bound work ran than with a core always there (1: never waited).

        Example:
            >>> ForecastFacts(production_s=(0.04,), step_s=(0.01,), cpu_share=1.0,
            ...     production_queued_share=0.5).measured_slowdown
            2.0
        """
        queued = min(0.99, max(0.0, self.production_queued_share))
        computing = self.worker_cpu_share * (1.0 - queued)
        return 1.0 + queued / computing if computing > 0 else 1.0

    @property
    def production_spread(self) -> float:
        return relative_spread(self.production_s)

    @property
    def step_spread(self) -> float:
        return relative_spread(self.step_s)

    def to_dict(self) -> dict[str, Any]:
        """Plain data (JSON-ready) that :meth:`from_dict` reads back."""
        data = asdict(self)
        data["production_s"] = [round(v, 7) for v in self.production_s]
        data["step_s"] = [round(v, 7) for v in self.step_s]
        return data

    def to_text(self) -> str:
        """The facts as a JSON block (markdown, for a logger's text tab); :meth:`from_text` reads it back."""
        return "```json\n" + json.dumps(self.to_dict(), separators=(",", ":")) + "\n```"

    @classmethod
    def from_text(cls, text: str) -> ForecastFacts:
        """The facts :meth:`to_text` wrote (the fence around them optional).

        Raises:
            ValueError: the text holds no such facts.
        """
        body = text.strip().removeprefix("```json").removesuffix("```").strip()
        try:
            data = json.loads(body)
        except json.JSONDecodeError as err:
            raise ValueError(f"the logged forecast facts are not JSON ({err})") from None
        if not isinstance(data, dict):
            raise ValueError("the logged forecast facts are not a JSON object")
        return cls.from_dict(data)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ForecastFacts:
        """The facts :meth:`to_dict` wrote; fields it does not know are refused by name."""
        known = {f.name for f in fields(cls)}
        unknown = set(data) - known
        if unknown:
            raise ValueError(f"unknown forecast facts {sorted(unknown)}; known: {', '.join(sorted(known))}")
        values = dict(data)
        for name in ("production_s", "step_s"):
            values[name] = tuple(float(v) for v in values.get(name, ()))
        return cls(**values)


WHAT_IF_ARGUMENTS: dict[str, str] = {
    "ranks_per_node": "training processes per node, an integer >= 1",
    "usable_cores": "cores each process may use (affinity and quota), a number > 0",
    "other_cores": "cores other work takes of them, a number >= 0 (default: the measured share)",
    "available_ram_bytes": "available host RAM in bytes, an integer >= 0 (K, M, G, T suffixes in the command)",
    "shm_free_bytes": "free /dev/shm in bytes, an integer >= 0 (K, M, G, T suffixes in the command)",
    "step_speedup": "k: the step takes 1/k of its measured time, a number > 0 (2: twice as fast, 0.5: half)",
    "batch_scale": "b: batches b times as large (production, step and bytes scale by b), a number > 0",
    "num_workers": "loader workers per rank, an integer >= 0",
    "prefetch_factor": "batches each worker keeps in flight, an integer >= 1",
    "pin_memory": "whether batches are pinned, true or false",
}
"""Every argument of a :class:`WhatIf`, with its allowed values (the text bad input is refused with)."""


@dataclass(frozen=True)
class WhatIf:
    """A change to forecast; every ``None`` keeps the measured value.

    Attributes: see :data:`WHAT_IF_ARGUMENTS`.

    Example:
        >>> WhatIf(ranks_per_node=8, step_speedup=2.0).label
        'ranks_per_node=8, step_speedup=2'
        >>> WhatIf(num_workers=-1)
        Traceback (most recent call last):
        ...
        ValueError: num_workers must be loader workers per rank, an integer >= 0; got -1
    """

    ranks_per_node: int | None = None
    usable_cores: float | None = None
    other_cores: float | None = None
    available_ram_bytes: int | None = None
    shm_free_bytes: int | None = None
    step_speedup: float = 1.0
    batch_scale: float = 1.0
    num_workers: int | None = None
    prefetch_factor: int | None = None
    pin_memory: bool | None = None

    def __post_init__(self) -> None:
        def bad(name: str) -> ValueError:
            return ValueError(f"{name} must be {WHAT_IF_ARGUMENTS[name]}; got {getattr(self, name)!r}")

        def integer(value: Any) -> bool:
            return isinstance(value, int) and not isinstance(value, bool)

        def number(value: Any) -> bool:
            return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)

        for name, least in (
            ("ranks_per_node", 1),
            ("num_workers", 0),
            ("prefetch_factor", 1),
            ("available_ram_bytes", 0),
            ("shm_free_bytes", 0),
        ):
            value = getattr(self, name)
            if value is not None and not (integer(value) and value >= least):
                raise bad(name)
        for name in ("usable_cores", "step_speedup", "batch_scale"):
            value = getattr(self, name)
            if value is not None and not (number(value) and value > 0):
                raise bad(name)
        if self.other_cores is not None and not (number(self.other_cores) and self.other_cores >= 0):
            raise bad("other_cores")
        if self.pin_memory is not None and not isinstance(self.pin_memory, bool):
            raise bad("pin_memory")

    @property
    def label(self) -> str:
        """The changes, as ``name=value`` (``as measured`` where there are none)."""
        parts = []
        for f in fields(self):
            value = getattr(self, f.name)
            if value is not None and value != f.default:
                parts.append(f"{f.name}={value:g}" if isinstance(value, float) else f"{f.name}={value}")
        return ", ".join(parts) or "as measured"


@dataclass(frozen=True)
class Estimate:
    """A predicted figure with the range its margin spans (``low <= value <= high``).

    ``open_end`` names the end the margin cannot place: a cost the measured run could not see (named in the
    forecast's notes) moves the figure past it by an amount nothing measured bounds. ``low`` and ``high`` stay what
    the measured spread gives; the range covers any figure beyond the open end.

    Example:
        >>> e = Estimate(10.0, 9.0, 10.5)
        >>> e.margin, e.covers(9.2), e.covers(11.0)
        (1.0, True, False)
        >>> at_most = Estimate(10.0, 9.0, 10.5, open_end="low")
        >>> at_most.covers(7.0), at_most.covers(11.0), at_most.margin
        (True, False, inf)
    """

    value: float
    low: float
    high: float
    open_end: Literal["low", "high"] | None = None

    def __post_init__(self) -> None:
        if self.open_end not in (None, "low", "high"):
            raise ValueError(f"Estimate.open_end must be None, 'low' or 'high', got {self.open_end!r}")

    @property
    def margin(self) -> float:
        """The larger distance from the value to either end of its range (infinite with an open end)."""
        if self.open_end is not None:
            return math.inf
        return max(self.value - self.low, self.high - self.value)

    def covers(self, measured: float) -> bool:
        """Whether ``measured`` lies in the range (past an open end counts as in it)."""
        return (self.open_end == "low" or self.low <= measured) and (self.open_end == "high" or measured <= self.high)

    def range_text(self, digits: int = 3) -> str:
        """The range in words: ``low..high``, or ``at most high`` / ``at least low`` with an open end.

        Example:
            >>> Estimate(45.6, 45.2, 45.9, open_end="low").range_text(), Estimate(0.06, 0.05, 0.07).range_text(2)
            ('at most 45.9', '0.05..0.07')
        """
        if self.open_end == "low":
            return f"at most {_num(self.high, digits)}"
        if self.open_end == "high":
            return f"at least {_num(self.low, digits)}"
        return f"{_num(self.low, digits)}..{_num(self.high, digits)}"


@dataclass(frozen=True)
class Forecast:
    """What a :class:`WhatIf` is predicted to do, per rank and node-wide (rates in steps/s of one rank).

    Attributes:
        what_if: the change forecast.
        settings: the loader settings forecast (per rank).
        ranks_per_node, usable_cores, available_cores: training processes per node; cores each may use; cores
            left to training after other work.
        throughput: steps/s per rank, with its margin; open below (:attr:`Estimate.open_end`) where ranks are
            added to those measured: DDP's collectives are not in the measured step.
        wait_fraction: share of the loop's time spent waiting for data (0..1), with its margin; open above where
            ranks are added.
        consumer_rate: steps/s the loop would reach never waiting (the step and the hand-over, at ``slowdown``).
        producer_rate: batches/s the workers make (``None`` without workers), at the cores' slow-down.
        core_rate: steps/s per rank the cores carry at the node's CPU per step.
        slowdown: the factor the CPU-bound parts slow by for the cores to carry the demand (1: they carry it).
        limited_by: what sets the throughput: ``"step"``, ``"workers"``, ``"loading in the loop"`` or ``"cores"``.
        workers_needed: workers per rank that keep up with the step (Little's law with the burst margin) at the
            slow-down forecast.
        prefetch_needed: the smallest prefetch depth that absorbs the bursts at ``workers_needed`` (``None``: no
            depth helps, or the cores cannot carry the step's rate).
        worker_processes: loader workers on the node.
        worker_cores: cores the node's workers use at the forecast rate; loop_cores: the ranks' own threads.
        inflight_bytes: the node's batches in flight at full prefetch queues (``None``: batch size unknown): the
            memory the budgets must hold.
        queued_bytes: of it, what is actually queued on average: the batches made and waiting when a loop asks
            (the replay's buffer level), node-wide.
        ram_budget_bytes, shm_budget_bytes: the shares of available RAM and free ``/dev/shm`` in-flight batches
            may claim (``None``: unknown, or no workers for shm).
        loads: each limit's load at the step's own rate (>= 1: it binds): the workers' (the step's rate over their
            capacity, both with a core always there), the cores' (the node's CPU demand over the cores other work
            left), the RAM budget's and the shm budget's.
        binds_first: the limit with the highest load where one is >= 1, else ``None``.
        holds: the settings keep up (wait below ``WAIT_OK``) and every limit has room.
        notes: what was assumed for lack of a measurement.
        measured_throughput, measured_wait_fraction: the run's own figures the facts came from.

    Example:
        >>> f = guard.forecast(ranks_per_node=8, step_speedup=2.0)  # doctest: +SKIP
        >>> f.throughput.value, f.throughput.low, f.wait_fraction.value, f.binds_first  # doctest: +SKIP
        (31.2, 29.8, 0.38, 'cores')
        >>> print(f)  # doctest: +SKIP
    """

    what_if: WhatIf
    settings: LoaderSettings
    ranks_per_node: int
    usable_cores: float
    available_cores: float
    throughput: Estimate
    wait_fraction: Estimate
    consumer_rate: float
    producer_rate: float | None
    core_rate: float
    slowdown: float
    limited_by: Limit
    workers_needed: int
    prefetch_needed: int | None
    worker_processes: int
    worker_cores: float
    loop_cores: float
    inflight_bytes: Estimate | None
    queued_bytes: Estimate | None
    ram_budget_bytes: int | None
    shm_budget_bytes: int | None
    loads: dict[str, float] = field(default_factory=dict)
    binds_first: NodeLimit | None = None
    holds: bool = True
    notes: tuple[str, ...] = ()
    measured_throughput: float | None = None
    measured_wait_fraction: float | None = None

    def sentence(self) -> str:
        """One line: whether the settings hold, and if not, what binds."""
        head = (
            f"{self.what_if.label}: {self.throughput.value:.3g} steps/s per rank, wait {self.wait_fraction.value:.2f}"
        )
        if self.holds:
            return f"{head}; the settings hold."
        if self.binds_first is not None:
            load = self.loads[self.binds_first]
            why = f"the first limit to bind is {_LIMIT_NAMES[self.binds_first]} (load {load:.2f})"
        else:
            why = f"the loop waits for data ({self.limited_by})"
        fix = ""
        if self.binds_first in (None, "workers") and self.core_rate >= self.consumer_rate:
            fix = f"; num_workers={self.workers_needed} would keep up"
        return f"{head}: {why}{fix}."

    def __str__(self) -> str:
        rows: list[tuple[str, str, str]] = [
            ("throughput per rank (steps/s)", _num(self.measured_throughput), _est(self.throughput)),
            ("wait fraction", _num(self.measured_wait_fraction, 3), _est(self.wait_fraction, 3)),
            ("step's own rate (steps/s)", "", _num(self.consumer_rate)),
            ("workers' capacity (batches/s)", "", _num(self.producer_rate)),
            ("cores carry (steps/s per rank)", "", _num(self.core_rate)),
            ("CPU-bound work slowed by", "", f"{self.slowdown:.3g}x (waiting for a core)"),
            ("limited by", "", self.limited_by),
            ("workers needed per rank", "", f"{self.workers_needed}"),
            ("prefetch needed", "", "-" if self.prefetch_needed is None else f"{self.prefetch_needed}"),
            ("worker processes on node", "", f"{self.worker_processes} on {self.usable_cores:g} cores"),
            (
                "cores used: loops + workers",
                "",
                f"{self.loop_cores:.2f} + {self.worker_cores:.2f} of {self.available_cores:.2f} left by other work",
            ),
            (
                "in-flight memory on node (MB)",
                "",
                "-" if self.inflight_bytes is None else f"{self.inflight_bytes.value / 1e6:.3g} at full queues",
            ),
            (
                "  of it queued on average (MB)",
                "",
                "-"
                if self.queued_bytes is None
                else _est(
                    Estimate(
                        *(v / 1e6 for v in (self.queued_bytes.value, self.queued_bytes.low, self.queued_bytes.high))
                    )
                ),
            ),
            ("RAM / shm budget (MB)", "", f"{_mb(self.ram_budget_bytes)} / {_mb(self.shm_budget_bytes)}"),
        ]
        rows += [(f"load: {_LIMIT_NAMES[name]}", "", f"{load:.2f}") for name, load in self.loads.items()]
        rows.append(("binds first", "", "nothing" if self.binds_first is None else _LIMIT_NAMES[self.binds_first]))
        width = max(len(r[0]) for r in rows)
        title = (
            f"LoadGuard forecast: {self.what_if.label} ({_ranks(self.ranks_per_node)} per node, {self.settings.label})"
        )
        lines = [title, "-" * len(title), f"{'':<{width}}  {'measured':>10}  forecast (range)"]
        lines += [f"{name:<{width}}  {now:>10}  {then}" for name, now, then in rows]
        lines.append(self.sentence())
        lines += [f"note: {note}" for note in self.notes]
        return "\n".join(lines)


_LIMIT_NAMES = {"workers": "the workers' capacity", "cores": "the cores", "host_memory": "host RAM", "shm": "/dev/shm"}


def _ranks(count: int) -> str:
    return f"{count} rank" if count == 1 else f"{count} ranks"


def _num(value: float | None, digits: int = 3) -> str:
    return "-" if value is None else f"{value:.{digits}g}" if digits == 3 else f"{value:.{digits}f}"


def _est(estimate: Estimate, digits: int = 3) -> str:
    return f"{_num(estimate.value, digits)} ({estimate.range_text(digits)})"


def _mb(value: int | None) -> str:
    return "-" if value is None else f"{value / 1e6:,.0f}"


def relative_spread(values: Sequence[float], blocks: int = SPREAD_BLOCKS, min_block: int = MIN_BLOCK) -> float:
    """The standard deviation of the means of up to ``blocks`` consecutive blocks, over the mean (0 where fewer
    than two blocks of ``min_block`` values fit, or the mean is 0).

    Example:
        >>> relative_spread([1.0] * 16 + [3.0] * 16, blocks=2)
        0.5
        >>> relative_spread([1.0, 2.0, 3.0])
        0.0
    """
    count = min(blocks, len(values) // max(1, min_block))
    mean = fmean(values) if values else 0.0
    if count < 2 or mean <= 0:
        return 0.0
    size = len(values) // count
    means = [fmean(values[i * size : (i + 1) * size]) for i in range(count)]
    return pstdev(means) / mean


def facts_from_window(
    snapshot: WindowSnapshot, earlier: Iterable[WindowSnapshot] = (), batch_size: int | None = None
) -> ForecastFacts:
    """The facts of one window of measurements (``earlier``: windows before it, for the spread of other work).

    The window's production times, their CPU share and CPU per batch, its step times, the step's CPU per step and
    the cores other work used (as the core check reads them, :func:`~lightning_loadguard.model.budget.step_cpu_s`
    and :func:`~lightning_loadguard.model.budget.other_cores`), the mean wait of a fetch whose batch was already
    made, the batch's bytes and the host's.

    Raises:
        ValueError: the window holds no step.
    """
    if not snapshot.steps:
        raise ValueError("the window holds no step: nothing to forecast from")
    settings = snapshot.settings
    production = snapshot.production_s
    if settings.num_workers == 0 and not production:
        production = snapshot.wait_s  # made in the training process: each fetch is one production
    handover = None
    if settings.num_workers > 0 and snapshot.ready is not None and any(snapshot.ready):
        handover = snapshot.ready_wait_s / sum(snapshot.ready)
    cpu = snapshot.cpu
    other_now = hb.other_cores(snapshot)
    others = [value for w in (*earlier, snapshot) if (value := hb.other_cores(w)) is not None]
    spread = pstdev(others) if len(others) > 1 else 0.0
    host = snapshot.host
    sampled = [
        (busy, queued)
        for busy, queued in zip(production, snapshot.production_queued_s, strict=False)
        if queued == queued
    ]  # NaN: not sampled
    busy = math.fsum(b for b, _ in sampled)
    queued_share = min(1.0, math.fsum(q for _, q in sampled) / busy) if busy > 0 else 0.0
    return ForecastFacts(
        production_s=tuple(production[-KEPT_VALUES:]) or snapshot.wait_s[-KEPT_VALUES:],
        step_s=tuple(snapshot.step_s[-KEPT_VALUES:]),
        num_workers=settings.num_workers,
        prefetch_factor=settings.prefetch,
        pin_memory=settings.pin_memory,
        cpu_share=snapshot.cpu_share,
        batch_cpu_s=snapshot.batch_cpu_s,
        step_cpu_s=hb.step_cpu_s(snapshot),
        handover_s=handover,
        batch_bytes=snapshot.batch_bytes,
        batch_size=batch_size if batch_size is not None else settings.batch_size,
        ranks_per_node=max(1, host.processes_on_host),
        usable_cores=cpu.usable_cores if cpu is not None else float(host.cpu_count),
        host_cores=cpu.host_cores if cpu is not None else host.cpu_count,
        other_cores=other_now or 0.0,
        other_cores_spread=spread,
        production_queued_share=queued_share,
        workers_on_host=host.workers_on_host,
        inflight_host_bytes=snapshot.inflight_host_bytes,
        available_ram_bytes=host.available_ram_bytes,
        shm_free_bytes=host.shm_free_bytes,
        throughput=snapshot.throughput,
        wait_fraction=snapshot.wait_fraction,
    )


@dataclass(frozen=True)
class _Case:
    """Everything one replay needs, the what-if applied (times at no wait for a core)."""

    production_s: tuple[float, ...]
    step_s: tuple[float, ...]  # as measured, at the measured slow-down
    handover_s: float
    workers: int
    prefetch: int
    worker_share: float  # CPU share of a worker's busy time
    step_share: float  # CPU share of the step's time
    measured_slowdown: float  # the slow-down the measured step ran at
    cpu_per_step: float  # CPU seconds per step of one rank (step and batch)
    ranks: int
    cores: float
    other_threads: float  # other work's runnable threads on those cores


@dataclass(frozen=True)
class _Outcome:
    throughput: float
    wait_fraction: float
    slowdown: float
    producer_rate: float | None
    queued: float  # mean batches made and waiting when the loop asks


def _replay(case: _Case, slowdown: float, levels: bool = False) -> tuple[float, float, float]:
    """Steady-state throughput, wait fraction and (with ``levels``) mean batches made and waiting when the loop
    asks, of the loop with its CPU-bound parts slowed by ``slowdown``."""
    production = [y * (1.0 + case.worker_share * (slowdown - 1.0)) for y in case.production_s]
    relative = slowdown / case.measured_slowdown
    # The hand-over is the loop thread's work, and on a busy host mostly its wait for a core: it slows as a whole.
    handover = case.handover_s * relative
    steps = [x * (1.0 + case.step_share * (relative - 1.0)) + handover for x in case.step_s]
    n = max(REPLAY_STEPS, 4 * max(len(production), len(steps)))
    run = simulate_buffer(
        production, steps, num_workers=case.workers, prefetch_factor=case.prefetch, steps=n, record_levels=levels
    )
    start = n // 2
    waited = math.fsum(run.waits[start:])
    stepped = math.fsum(steps[k % len(steps)] for k in range(start, n))
    period = waited + stepped
    count = n - start
    queued = fmean(run.levels[start:]) if levels else math.nan
    if period <= 0:
        return math.inf, 0.0, queued
    return count / period, (waited + count * handover) / period, queued


def _outcome(case: _Case) -> _Outcome:
    """The replay at the slow-down the scheduler's fair share gives.

    A runnable thread gets ``cores / runnable`` of a core where more threads are runnable than there are cores:
    the CPU-bound parts slow by ``s = runnable / cores``. The training threads are runnable ``s`` times their CPU
    use ``t`` (in cores), other work's threads ``n`` throughout, so ``s = (n + s t) / cores``, i.e.
    ``s (cores - t) = n``; ``t`` falls as ``s`` grows (the replay runs slower), so the root is found by bisection.
    """

    def gap(slowdown: float) -> float:
        rate = _replay(case, slowdown)[0]
        return slowdown * (case.cores - case.ranks * rate * case.cpu_per_step) - case.other_threads

    slowdown = 1.0
    if case.cpu_per_step > 0 and gap(1.0) < 0:
        low, high = 1.0, 2.0
        while gap(high) < 0 and high < _MAX_STRETCH:
            low, high = high, high * 2
        while high - low > SLOWDOWN_TOLERANCE * low:
            middle = (low + high) / 2
            if gap(middle) < 0:
                low = middle
            else:
                high = middle
        slowdown = high
    rate, wait, queued = _replay(case, slowdown, levels=True)
    producer = None
    if case.workers > 0:
        busy = fmean(case.production_s) * (1.0 + case.worker_share * (slowdown - 1.0))
        producer = case.workers / busy if busy > 0 else math.inf
    return _Outcome(rate, wait, slowdown, producer, queued)


def _consumer_rate(case: _Case, slowdown: float) -> float:
    """Steps/s of the loop never waiting for data: the step and the hand-over, at ``slowdown``."""
    relative = slowdown / case.measured_slowdown
    period = fmean(case.step_s) * (1.0 + case.step_share * (relative - 1.0)) + case.handover_s * relative
    return 1.0 / period if period > 0 else math.inf


def forecast(facts: ForecastFacts, what_if: WhatIf | None = None) -> Forecast:
    """What ``what_if`` would do, predicted from ``facts`` (see the module's docstring for the method).

    Example:
        Two ranks where one ran, each with two workers that compute every batch (16 ms), on 2 cores: the workers
        alone would need 1.6 cores at the step's rate, and the ranks' own threads 0.2 more.

        >>> facts = ForecastFacts(production_s=(0.016,) * 64, step_s=(0.020,) * 64, num_workers=2,
        ...     cpu_share=1.0, batch_cpu_s=0.016, step_cpu_s=0.002, usable_cores=2.0, host_cores=2)
        >>> f = forecast(facts, WhatIf(ranks_per_node=2, num_workers=2))
        >>> f.worker_processes, round(f.loads["cores"], 2), f.binds_first, round(f.throughput.value, 1)
        (4, 0.9, None, 50.0)
    """
    what_if = what_if or WhatIf()
    notes: list[str] = []
    ranks = what_if.ranks_per_node or facts.ranks_per_node
    usable = what_if.usable_cores if what_if.usable_cores is not None else facts.usable_cores
    # Other work keeps its share of each of the host's CPUs; its threads want what they used, times the slow-down
    # they ran at (they waited for a core as the workers did).
    cpu_part = min(1.0, usable / facts.host_cores)
    measured = facts.measured_slowdown
    if what_if.other_cores is not None:
        other_used, other_threads, other_spread = what_if.other_cores, what_if.other_cores, 0.0
    else:
        other_used = facts.other_cores * cpu_part
        other_threads = other_used * measured
        other_spread = MARGIN_SIGMAS * facts.other_cores_spread * cpu_part * measured
    settings = LoaderSettings(
        num_workers=facts.num_workers if what_if.num_workers is None else what_if.num_workers,
        prefetch_factor=what_if.prefetch_factor or facts.prefetch_factor,
        pin_memory=facts.pin_memory if what_if.pin_memory is None else what_if.pin_memory,
    )
    k, b = what_if.step_speedup, what_if.batch_scale
    step_cpu = facts.step_cpu_s
    if step_cpu is None:
        step_cpu = 0.0
        notes.append("the step's CPU use was not measured: it is taken to use no core (a step on an accelerator)")
    if facts.cpu_share is None:
        notes.append("the workers' CPU share was not measured: each busy worker is taken to use a whole core")
    handover = facts.handover_s
    if settings.num_workers > 0 and handover is None:
        handover = 0.0
        notes.append("the hand-over of a ready batch was not measured (no worker run with batches ready): taken as 0")
    elif settings.num_workers == 0:
        handover = 0.0
    batch_cpu = facts.batch_cpu
    if facts.num_workers == 0 and settings.num_workers > 0:
        notes.append("measured without workers: a worker is taken to make a batch in the time the loop's fetch took")
    step_mean = fmean(facts.step_s)
    step_share = min(1.0, step_cpu / step_mean) if step_mean > 0 else 0.0
    available = max(0.05 * usable, usable - other_used)
    if usable - other_used < 0.05 * usable:
        notes.append("other work used the cores' whole share in the measured window: 5 % of them is taken as left")
    unseen_collectives = ranks > facts.ranks_per_node and ranks > 1
    if unseen_collectives:
        notes.append(
            "DDP's own cost per step is not in a step measured on fewer ranks: the gradient all-reduce and "
            "Lightning's broadcast before each fetch, which hold the ranks in lockstep (there, each rank's fetch of "
            "a ready batch was measured slower: benchmarks/RESULTS.md); read the throughput as an upper bound and "
            "the wait as a lower one (their ranges are open below and above)"
        )
    # Production as it would run with a core always there.
    unqueued = 1.0 - facts.production_queued_share

    def case(production_scale: float, step_scale: float, other_delta: float) -> _Case:
        return _Case(
            production_s=tuple(y * unqueued * b * production_scale for y in facts.production_s),
            step_s=tuple(x * b / k * step_scale for x in facts.step_s),
            handover_s=(handover or 0.0) * b,
            workers=settings.num_workers,
            prefetch=settings.prefetch,
            worker_share=facts.worker_cpu_share,
            step_share=step_share,
            measured_slowdown=measured,
            cpu_per_step=(step_cpu / k + batch_cpu * production_scale) * b,
            ranks=ranks,
            cores=usable,
            other_threads=max(0.0, other_threads + other_delta),
        )

    central = case(1.0, 1.0, 0.0)
    main = _outcome(central)
    p, s = MARGIN_SIGMAS * facts.production_spread, MARGIN_SIGMAS * facts.step_spread
    # A spread over half the mean puts the low corner's times below zero: no time is shorter than none.
    corners = [main] + [
        _outcome(case(max(0.0, 1.0 + dp), max(0.0, 1.0 + ds), do))
        for dp in (-p, p)
        for ds in (-s, s)
        for do in (-other_spread, other_spread)
        if (dp, ds, do) != (0.0, 0.0, 0.0)
    ]
    rates = [c.throughput for c in corners]
    waits = [c.wait_fraction for c in corners]

    consumer_rate = _consumer_rate(central, main.slowdown)
    core_rate = available / (ranks * central.cpu_per_step) if central.cpu_per_step > 0 else math.inf
    # A worker's time per batch at the slow-down forecast; the workers' capacity with a core always there.
    busy = fmean(central.production_s) * (1.0 + central.worker_share * (main.slowdown - 1.0))
    unhindered = settings.num_workers / fmean(central.production_s) if fmean(central.production_s) > 0 else math.inf
    slowed = main.slowdown > 1.0 + 1e-6
    if settings.num_workers == 0:
        limited: Limit = "loading in the loop"
    elif main.producer_rate is not None and main.producer_rate < consumer_rate:
        limited = "cores" if slowed and unhindered >= _consumer_rate(central, 1.0) else "workers"
    else:
        limited = "cores" if slowed and (step_share > 0 or central.handover_s > 0) else "step"
    needed = cap.workers_needed(busy, consumer_rate) if math.isfinite(consumer_rate) else 0
    prefetch_needed = None
    if needed >= 1 and core_rate >= consumer_rate:
        advice = cap.recommend_prefetch(central.production_s, central.step_s, num_workers=needed)
        prefetch_needed = advice.prefetch_factor if advice is not None else None

    # With the loader's settings kept, the host's own sums scale with the ranks (ranks may differ in their settings).
    same_loader = what_if.num_workers is None and what_if.prefetch_factor is None and what_if.pin_memory is None
    worker_processes = settings.num_workers * ranks
    if same_loader and facts.workers_on_host is not None:
        worker_processes = round(facts.workers_on_host * ranks / facts.ranks_per_node)
    rate = main.throughput
    worker_cores = ranks * rate * batch_cpu * b if settings.num_workers > 0 else 0.0
    loop_cores = ranks * rate * (step_cpu / k * b + (0.0 if settings.num_workers > 0 else batch_cpu * b))
    loads: dict[str, float] = {}
    # Each limit's load at the step's own rate: the demand, not the rate left once the cores slowed the step (at
    # that rate the cores suffice by construction).
    own_rate = _consumer_rate(central, 1.0)
    if settings.num_workers > 0:
        # The count of workers against the step, with a core always there: the cores' share is the cores' load.
        loads["workers"] = own_rate / unhindered
    if central.cpu_per_step > 0 and math.isfinite(own_rate):
        loads["cores"] = ranks * own_rate * central.cpu_per_step / available

    inflight = queued = ram_budget = shm_budget = None
    if facts.batch_bytes:
        batch_bytes = round(facts.batch_bytes * b)
        nbytes = hb.host_inflight_bytes(batch_bytes, settings.batches_in_flight, ranks)
        if same_loader and facts.inflight_host_bytes is not None:
            nbytes = round(facts.inflight_host_bytes * b * ranks / facts.ranks_per_node)
        inflight = Estimate(float(nbytes), float(nbytes), float(nbytes))
        levels = [c.queued * batch_bytes * ranks for c in corners]
        queued = Estimate(levels[0], min(levels), max(levels))
        ram = what_if.available_ram_bytes if what_if.available_ram_bytes is not None else facts.available_ram_bytes
        shm = what_if.shm_free_bytes if what_if.shm_free_bytes is not None else facts.shm_free_bytes
        ram_limit = hb.memory_limit(HostFacts(cpu_count=1, available_ram_bytes=ram))
        shm_limit = hb.memory_limit(HostFacts(cpu_count=1, shm_free_bytes=shm), uses_shm=settings.num_workers > 0)
        ram_budget = ram_limit[0] if ram_limit else None
        shm_budget = shm_limit[0] if shm_limit else None
        for name, limit in (("host_memory", ram_budget), ("shm", shm_budget)):
            if limit is not None:
                loads[name] = nbytes / limit if limit > 0 else math.inf
    binding = max(loads, key=loads.__getitem__) if loads and max(loads.values()) >= 1.0 else None
    return Forecast(
        what_if=what_if,
        settings=settings,
        ranks_per_node=ranks,
        usable_cores=usable,
        available_cores=available,
        throughput=Estimate(rate, min(rates), max(rates), open_end="low" if unseen_collectives else None),
        wait_fraction=Estimate(
            main.wait_fraction, min(waits), max(waits), open_end="high" if unseen_collectives else None
        ),
        consumer_rate=consumer_rate,
        producer_rate=main.producer_rate,
        core_rate=core_rate,
        slowdown=main.slowdown,
        limited_by=limited,
        workers_needed=needed,
        prefetch_needed=prefetch_needed,
        worker_processes=worker_processes,
        worker_cores=worker_cores,
        loop_cores=loop_cores,
        inflight_bytes=inflight,
        queued_bytes=queued,
        ram_budget_bytes=ram_budget,
        shm_budget_bytes=shm_budget,
        loads=loads,
        binds_first=binding,  # type: ignore[arg-type]
        holds=binding is None and main.wait_fraction < cap.WAIT_OK,
        notes=tuple(notes),
        measured_throughput=facts.throughput,
        measured_wait_fraction=facts.wait_fraction,
    )


def parse_what_if(text: str) -> WhatIf:
    """A :class:`WhatIf` from ``name=value,name=value`` (the ``--what-if`` of ``loadguard report``).

    Byte counts take a K, M, G or T suffix (powers of 1000, ``Gi`` for 2**30).

    Example:
        >>> parse_what_if("ranks_per_node=8,step_speedup=2,shm_free_bytes=2G").label
        'ranks_per_node=8, shm_free_bytes=2000000000, step_speedup=2'
        >>> parse_what_if("ranks=8")  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        ValueError: unknown what-if argument 'ranks'; allowed: ranks_per_node, usable_cores, ...
    """
    allowed = ", ".join(WHAT_IF_ARGUMENTS)
    values: dict[str, Any] = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        name, sep, raw = part.partition("=")
        name, raw = name.strip(), raw.strip()
        if not sep or not name:
            raise ValueError(f"what-if {part!r} is not name=value; allowed names: {allowed}")
        if name not in WHAT_IF_ARGUMENTS:
            raise ValueError(f"unknown what-if argument {name!r}; allowed: {allowed}")
        if name in values:
            raise ValueError(f"what-if argument {name!r} is given twice")
        values[name] = _parse_value(name, raw)
    return WhatIf(**values)


_SUFFIXES = {"k": 10**3, "m": 10**6, "g": 10**9, "t": 10**12, "ki": 2**10, "mi": 2**20, "gi": 2**30, "ti": 2**40}
_FIELD_TYPES = {f.name: f.type for f in fields(WhatIf)}


def _parse_value(name: str, raw: str) -> Any:
    bad = ValueError(f"{name} must be {WHAT_IF_ARGUMENTS[name]}; got {raw!r}")
    kind = str(_FIELD_TYPES[name])
    if kind.startswith("bool"):
        if raw.lower() in ("true", "1", "yes"):
            return True
        if raw.lower() in ("false", "0", "no"):
            return False
        raise bad
    if kind.startswith("int"):
        text = raw.lower().removesuffix("b")
        scale = 1
        for suffix in sorted(_SUFFIXES, key=len, reverse=True):
            if name.endswith("_bytes") and text.endswith(suffix):
                text, scale = text[: -len(suffix)], _SUFFIXES[suffix]
                break
        try:
            number = float(text) * scale
        except ValueError:
            raise bad from None
        if not math.isfinite(number) or number != int(number):
            raise bad
        return int(number)
    try:
        return float(raw)
    except ValueError:
        raise bad from None
