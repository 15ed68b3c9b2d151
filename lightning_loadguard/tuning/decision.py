"""The tuner's vocabulary: a loader setting, one measured window, a candidate's result and the decision."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, replace
from statistics import fmean
from typing import Any

PROFILE_LENGTH = 32
"""Per-batch production and step times kept per window (the latest, in order) for the buffer replay; a fixed
length so that ranks can exchange them in one collective."""


@dataclass(frozen=True)
class Setting:
    """The train loader settings the tuner chooses between.

    Example:
        >>> Setting(num_workers=4, prefetch_factor=2).label
        'workers=4 prefetch=2'
    """

    num_workers: int = 0
    prefetch_factor: int | None = None
    pin_memory: bool = False
    persistent_workers: bool = False

    @property
    def label(self) -> str:
        if self.num_workers == 0:
            text = "workers=0"
        else:
            text = f"workers={self.num_workers} prefetch={self.prefetch_factor or 2}"
        if self.pin_memory:
            text += " pinned"
        if self.persistent_workers:
            text += " persistent"
        return text

    @property
    def batches_in_flight(self) -> int:
        return self.num_workers * (self.prefetch_factor or 2) if self.num_workers > 0 else 0

    def loader_kwargs(self) -> dict[str, Any]:
        return {
            "num_workers": self.num_workers,
            "prefetch_factor": self.prefetch_factor if self.num_workers > 0 else None,
            "pin_memory": self.pin_memory,
        }


@dataclass(frozen=True)
class Measurement:
    """One measurement window of one setting (combined over ranks under DDP).

    Attributes:
        steps: training steps in the window.
        elapsed_s: wall time from the end of the step before the window to the end of its last step.
        made: batches the producer finished during the window (``None``: the producer is not metered).
        mean_step_s: mean consumer time per step (the step without its data wait).
        mean_production_s: mean busy time per batch of one producer (``None``: not metered).
        production_profile: the latest per-batch production times, in order (for the buffer replay).
        step_profile: the latest step times, in order.
        startup_s: seconds the switch to this setting took (shutting workers down, starting new ones).
        failed: why the setting failed (a worker crash, shared memory exhausted), or ``None``.
        mean_wait_s: mean data wait per step (the fetch, as the training loop saw it).
        worker_cores: cores the loader's worker processes used on average (CPU seconds per second).
        loop_cores: cores the training process itself used on average.
    """

    steps: int
    elapsed_s: float
    made: int | None = None
    mean_step_s: float = 0.0
    mean_production_s: float | None = None
    production_profile: tuple[float, ...] = ()
    step_profile: tuple[float, ...] = ()
    startup_s: float = 0.0
    failed: str | None = None
    mean_wait_s: float = 0.0
    worker_cores: float | None = None
    loop_cores: float | None = None

    @property
    def sustained_rate(self) -> float:
        """Steps per second the setting can keep up: a draining buffer does not count.

        A buffer filled before the window can serve steps faster than the producer makes batches, but only
        until it runs dry. Only batches both made and consumed in the window count; when the buffer was
        filling, the consumed steps count.

        Example:
            >>> Measurement(steps=20, elapsed_s=1.0, made=12).sustained_rate  # the buffer drained 8 batches
            12.0
        """
        if self.elapsed_s <= 0:
            return 0.0
        count = self.steps if self.made is None else min(self.steps, self.made)
        return count / self.elapsed_s

    @property
    def wait_share(self) -> float:
        """Share of the loop's time spent waiting for data: the throughput a faster loader could win back."""
        total = self.mean_wait_s + self.mean_step_s
        return self.mean_wait_s / total if total > 0 else 0.0

    @property
    def consumer_rate(self) -> float:
        """Steps per second if the loop never waited for data."""
        return 1.0 / self.mean_step_s if self.mean_step_s > 0 else math.inf

    @classmethod
    def combine(cls, ranks: list[Measurement]) -> Measurement:
        """One figure for all ranks: they step together, so the slowest producer and the longest window count.

        Under DDP a fast rank waits for a slow one inside the gradient all-reduce, which shows up as step
        time: the shortest step is the closest to the real compute.
        """
        if not ranks:
            raise ValueError("combine needs at least one rank's measurement")
        if len(ranks) == 1:
            return ranks[0]
        made = [m.made for m in ranks]
        production = [m.mean_production_s for m in ranks]
        worst = max(
            range(len(ranks)),
            key=lambda i: -1.0 if production[i] is None else production[i],  # type: ignore[operator]
        )
        failures = [m.failed for m in ranks if m.failed]
        return cls(
            steps=min(m.steps for m in ranks),
            elapsed_s=max(m.elapsed_s for m in ranks),
            made=None if any(v is None for v in made) else min(v for v in made if v is not None),
            mean_step_s=min(m.mean_step_s for m in ranks),
            mean_production_s=None if any(v is None for v in production) else production[worst],
            production_profile=ranks[worst].production_profile,
            step_profile=min(ranks, key=lambda m: m.mean_step_s).step_profile,
            startup_s=max(m.startup_s for m in ranks),
            failed=failures[0] if failures else None,
            mean_wait_s=max(m.mean_wait_s for m in ranks),
            worker_cores=_max_known([m.worker_cores for m in ranks]),
            loop_cores=_max_known([m.loop_cores for m in ranks]),
        )

    def to_vector(self) -> list[float]:
        """A fixed-length row for a collective (``-1`` marks unknown figures)."""
        return [
            float(self.steps),
            self.elapsed_s,
            -1.0 if self.made is None else float(self.made),
            self.mean_step_s,
            -1.0 if self.mean_production_s is None else self.mean_production_s,
            self.startup_s,
            1.0 if self.failed else 0.0,
            -1.0 if self.worker_cores is None else self.worker_cores,
            -1.0 if self.loop_cores is None else self.loop_cores,
            self.mean_wait_s,
            *_padded(self.production_profile),
            *_padded(self.step_profile),
        ]

    @classmethod
    def from_vector(cls, row: list[float], failed: str = "failed on another rank") -> Measurement:
        head, production, steps = row[:10], row[10 : 10 + PROFILE_LENGTH], row[10 + PROFILE_LENGTH :]
        return cls(
            steps=int(head[0]),
            elapsed_s=head[1],
            made=None if head[2] < 0 else int(head[2]),
            mean_step_s=head[3],
            mean_production_s=None if head[4] < 0 else head[4],
            production_profile=tuple(v for v in production if v >= 0),
            step_profile=tuple(v for v in steps if v >= 0),
            startup_s=head[5],
            failed=failed if head[6] > 0 else None,
            worker_cores=None if head[7] < 0 else head[7],
            loop_cores=None if head[8] < 0 else head[8],
            mean_wait_s=head[9],
        )


def _max_known(values: list[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return max(known) if known else None


def _same_loader(a: Setting, b: Setting) -> bool:
    return replace(a, persistent_workers=False) == replace(b, persistent_workers=False)


def _padded(values: tuple[float, ...]) -> list[float]:
    tail = list(values[-PROFILE_LENGTH:])
    return tail + [-1.0] * (PROFILE_LENGTH - len(tail))


def profile(values: list[float] | tuple[float, ...]) -> tuple[float, ...]:
    """The latest ``PROFILE_LENGTH`` values, in order."""
    return tuple(values[-PROFILE_LENGTH:])


@dataclass(frozen=True)
class CandidateResult:
    """A probed setting and what it achieved.

    Attributes:
        setting: the loader settings.
        rate: sustained training steps per second (``None`` if the setting failed).
        producer_rate: the producer's capacity in batches per second (``None`` if unmetered or failed).
        steps: steps the window ran (warm-up included).
        failed: why the setting failed, or ``None``.
        note: why it was tried.
    """

    setting: Setting
    rate: float | None
    producer_rate: float | None
    steps: int
    failed: str | None = None
    note: str = ""


VERDICTS = ("improved", "compute_bound", "no_gain", "model_only", "not_tuned")


@dataclass(frozen=True)
class TuneDecision:
    """What the auto-tuner chose for the train loader, and the evidence.

    Attributes:
        num_workers: chosen ``num_workers``.
        prefetch_factor: chosen ``prefetch_factor`` (``None`` without workers).
        persistent_workers: chosen ``persistent_workers``.
        pin_memory: chosen ``pin_memory``.
        throughput_before: sustained steps/s measured with the user's settings.
        throughput_after: sustained steps/s measured with the chosen settings (``None`` if not measured).
        bounded_by: the budget that limited the choice: ``"cores"``, ``"max_workers"``, ``"host_memory"``,
            ``"shm"``, ``"probe_budget"``, or ``None`` when nothing did.
        verdict: one of ``"improved"``, ``"compute_bound"`` (kept: the loop is not waiting for data),
            ``"no_gain"`` (kept: nothing measured faster), ``"model_only"`` (applied from the next epoch
            without a measurement, where probing mid-epoch is unsafe), ``"not_tuned"``.
        remaining_deficit: share of step throughput still lost to data wait after the choice (0 when the
            loop runs at its compute rate).
        reason: a sentence saying why.
        original: the user's settings.
        candidates: every probed setting with its result, in probing order (the user's first).
        probe_steps: steps run under probed settings other than the user's.
        probe_budget_steps: steps probing was allowed.
        probe_cost_s: time the probes cost over running those steps at the chosen setting's rate.

    Example:
        >>> d = TuneDecision(num_workers=3, prefetch_factor=2, persistent_workers=False, pin_memory=False,
        ...                  throughput_before=10.0, throughput_after=30.0, verdict="improved")
        >>> d.speedup
        3.0
    """

    num_workers: int
    prefetch_factor: int | None
    persistent_workers: bool
    pin_memory: bool
    throughput_before: float | None = None
    throughput_after: float | None = None
    bounded_by: str | None = None
    verdict: str = "not_tuned"
    remaining_deficit: float = 0.0
    reason: str = ""
    original: Setting = field(default_factory=Setting)
    candidates: tuple[CandidateResult, ...] = ()
    probe_steps: int = 0
    probe_budget_steps: int = 0
    probe_cost_s: float = 0.0

    @property
    def setting(self) -> Setting:
        return Setting(self.num_workers, self.prefetch_factor, self.pin_memory, self.persistent_workers)

    @property
    def speedup(self) -> float | None:
        if not self.throughput_before or self.throughput_after is None:
            return None
        return self.throughput_after / self.throughput_before

    def table(self) -> str:
        """The candidates and their measured throughput, as a fixed-width text table."""
        lines = [
            f"{'setting':<36} {'steps/s':>9} {'producer b/s':>13} {'steps':>6}  note",
            "-" * 80,
        ]
        for c in self.candidates:
            rate = "failed" if c.failed else f"{c.rate:.2f}" if c.rate is not None else "-"
            producer = f"{c.producer_rate:.2f}" if c.producer_rate is not None else "-"
            # Persistence is decided after probing; the probed row is the chosen one whatever it says.
            chosen = " *" if _same_loader(c.setting, self.setting) else ""
            note = c.failed or c.note
            lines.append(f"{c.setting.label + chosen:<36} {rate:>9} {producer:>13} {c.steps:>6}  {note}")
        lines.append("-" * 80)
        lines.append(f"decision: {self.setting.label} ({self.verdict}); {self.reason}")
        probed = len(self.candidates) - 1 if self.candidates else 0
        lines.append(
            f"probe cost: {self.probe_steps} steps in the {probed} probed row{'' if probed == 1 else 's'} "
            f"(your settings' row is free), of {self.probe_budget_steps} allowed; {self.probe_cost_s:.2f} s "
            "more than running those steps at the chosen setting's rate"
        )
        return "\n".join(lines)

    def to_dict(self) -> dict[str, Any]:
        """Plain data for a checkpoint."""
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> TuneDecision:
        data = dict(data)
        data["original"] = Setting(**data.get("original", {}))
        data["candidates"] = tuple(
            CandidateResult(**{**c, "setting": Setting(**c["setting"])}) for c in data.get("candidates", ())
        )
        return cls(**data)


def mean_or_none(values: list[float] | tuple[float, ...]) -> float | None:
    return fmean(values) if values else None
