"""The tuner's vocabulary: a candidate's result and the decision (settings are
:class:`~lightning_loadguard.meters.settings.LoaderSettings`, windows are
:class:`~lightning_loadguard.meters.window.WindowSnapshot`)."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, Literal

from lightning_loadguard.meters.settings import SWITCHABLE, LoaderSettings
from lightning_loadguard.model.capacity import WAIT_OK
from lightning_loadguard.model.noise import RESOLUTION
from lightning_loadguard.tuning.arms import Arm, gain, winnable


@dataclass(frozen=True)
class CandidateResult:
    """A probed setting and what it achieved.

    Attributes:
        setting: the loader settings.
        rate: sustained training steps per second (``None`` if the setting failed, or its window made no batch:
            served from batches made before it, the window says nothing of the rate).
        producer_rate: the producer's capacity in batches per second (``None`` if unmetered or failed).
        steps: steps the window ran (warm-up included).
        failed: why the setting failed, or ``None``.
        note: why it was tried.
    """

    setting: LoaderSettings
    rate: float | None
    producer_rate: float | None
    steps: int
    failed: str | None = None
    note: str = ""


TuneVerdict = Literal["improved", "compute_bound", "no_gain", "model_only", "not_tuned"]
"""What the auto-tuner concluded (see :class:`TuneDecision`); the diagnosis's verdicts are
:data:`lightning_loadguard.model.VERDICTS`."""

TUNE_VERDICTS: tuple[TuneVerdict, ...] = ("improved", "compute_bound", "no_gain", "model_only", "not_tuned")


@dataclass(frozen=True)
class TuneDecision:
    """What the auto-tuner chose for the train loader, and the evidence.

    Attributes:
        setting: the chosen settings; ``num_workers``, ``prefetch_factor`` (``None`` without workers),
            ``persistent_workers`` and ``pin_memory`` read them directly.
        throughput_before: sustained steps/s measured with the user's settings.
        throughput_after: sustained steps/s measured with the chosen settings (``None`` if not measured).
        bounded_by: the budget that limited the choice: ``"cores"``, ``"max_workers"``, ``"host_memory"``,
            ``"shm"``, ``"probe_budget"``, or ``None`` when nothing did.
        verdict: one of ``"improved"``, ``"compute_bound"`` (kept: the loop is not waiting for data),
            ``"no_gain"`` (kept: nothing measured faster; either kept setting, where its workers keep up, may still
            get the depth the reads' heavy tail asks for, ``reason`` says so), ``"model_only"`` (applied from the
            next epoch without comparing rates: where probing mid-epoch is unsafe, or where no window of the user's
            settings made a batch and only ``persistent_workers`` changes), ``"not_tuned"``.
        remaining_deficit: share of step throughput still lost to data wait after the choice (0 when the
            loop runs at its compute rate).
        reason: a sentence saying why.
        original: the user's settings.
        candidates: every probed setting with its result, in probing order (the user's first).
        probe_steps: steps run under probed settings other than the user's.
        probe_budget_steps: steps probing was allowed.
        probe_cost_s: time the probes cost over running those steps at the chosen setting's rate.
        retunes: how many times the tuner probed again after its first decision (``TuneOptions(retune=True)``);
            after a re-tune, ``throughput_before`` and the candidates are those of the latest probing, which
            started from the settings then running.
        retuned: why it probed again the latest time ("" for the first decision).

    Example:
        >>> d = TuneDecision.of(LoaderSettings(3, 2), throughput_before=10.0, throughput_after=30.0, verdict="improved")
        >>> d.num_workers, d.prefetch_factor, d.speedup
        (3, 2, 3.0)
    """

    setting: LoaderSettings
    throughput_before: float | None = None
    throughput_after: float | None = None
    bounded_by: str | None = None
    verdict: TuneVerdict = "not_tuned"
    remaining_deficit: float = 0.0
    reason: str = ""
    original: LoaderSettings = field(default_factory=LoaderSettings)
    candidates: tuple[CandidateResult, ...] = ()
    probe_steps: int = 0
    probe_budget_steps: int = 0
    probe_cost_s: float = 0.0
    retunes: int = 0
    retuned: str = ""

    @classmethod
    def of(cls, setting: LoaderSettings, **evidence: Any) -> TuneDecision:
        """A decision for ``setting``'s four settings (its batch size, which no decision changes, left out)."""
        return cls(LoaderSettings(**setting.fields()), **evidence)

    def with_setting(self, setting: LoaderSettings, **evidence: Any) -> TuneDecision:
        """This decision with ``setting`` (and ``evidence``) in place of its own."""
        return replace(self, setting=LoaderSettings(**setting.fields()), **evidence)

    @property
    def num_workers(self) -> int:
        return self.setting.num_workers

    @property
    def prefetch_factor(self) -> int | None:
        return self.setting.prefetch_factor

    @property
    def persistent_workers(self) -> bool:
        return self.setting.persistent_workers

    @property
    def pin_memory(self) -> bool:
        return self.setting.pin_memory

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
            chosen = " *" if c.setting.same_loader(self.setting) else ""
            note = c.failed or c.note
            lines.append(f"{c.setting.label + chosen:<36} {rate:>9} {producer:>13} {c.steps:>6}  {note}")
        lines.append("-" * 80)
        lines.append(f"decision: {self.setting.label} ({self.verdict}); {self.reason}")
        if self.retuned:
            lines.append(f"probed again (re-tune {self.retunes}) because {self.retuned}")
        # A re-tune measures the earlier choice first: its rows are the free ones.
        start = self.candidates[0].setting if self.retunes and self.candidates else self.original
        probed = sum(not c.setting.same_loader(start) for c in self.candidates)
        owner = "the earlier choice's" if self.retunes else "your settings'"
        free = f"{owner} rows are free" if len(self.candidates) - probed > 1 else f"{owner} row is free"
        lines.append(
            f"probe cost: {self.probe_steps} steps in the {probed} probed row{'' if probed == 1 else 's'} "
            f"({free}), of {self.probe_budget_steps} allowed; {self.probe_cost_s:.2f} s "
            "more than running those steps at the chosen setting's rate"
        )
        return "\n".join(lines)

    def to_dict(self) -> dict[str, Any]:
        """Plain data for a checkpoint (the form 0.1.0 wrote: settings as their four fields; a re-tuned decision adds
        ``retunes`` and ``retuned``)."""
        data = self.setting.fields() | {name: getattr(self, name) for name in self.__dataclass_fields__}
        del data["setting"]
        if not self.retunes:  # a first decision keeps the form 0.1.0 reads
            del data["retunes"], data["retuned"]
        data["original"] = self.original.to_dict()
        data["candidates"] = tuple(
            {name: getattr(c, name) for name in c.__dataclass_fields__} | {"setting": c.setting.to_dict()}
            for c in self.candidates
        )
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> TuneDecision:
        data = dict(data)
        data["setting"] = LoaderSettings(**{name: data.pop(name) for name in SWITCHABLE})
        data["original"] = LoaderSettings(**data.get("original", {}))
        data["candidates"] = tuple(
            CandidateResult(**{**c, "setting": LoaderSettings(**c["setting"])}) for c in data.get("candidates", ())
        )
        return cls(**data)


def start_names(retune: bool) -> tuple[str, str]:
    """What the notes call the settings the probing started from (``retune``: an earlier decision's), and the words
    for keeping them."""
    if retune:
        return "the earlier choice", "the earlier choice is kept"
    return "your settings", "your settings are kept"


def verdict_of(
    user: Arm, chosen: Arm, fastest: Arm, min_gain: float, *, retune: bool = False, for_tail: bool = False
) -> tuple[TuneVerdict, str, float]:
    """The verdict on keeping ``chosen``, the sentence that says why, and the share of the loop still lost to data
    wait (0 below :data:`~lightning_loadguard.model.capacity.WAIT_OK`). ``user``: the arm of the settings the
    probing started from (``retune``: an earlier decision's, not the user's); ``fastest``: the fastest arm that beat
    them, of which ``chosen`` is the roomiest alike; ``for_tail``: the decision adds batches in flight to ``chosen``
    for the reads' tail (:mod:`~lightning_loadguard.tuning.depth`), which the sentence says where it keeps them.

    Example:
        >>> from lightning_loadguard.meters.window import WindowSnapshot
        >>> ws = [WindowSnapshot(wait_s=(w,) * 8, step_s=(0.1,) * 8) for w in (0.1, 0.0)]
        >>> user, probed = Arm(LoaderSettings(), ws[0], 1), Arm(LoaderSettings(4), ws[1], 1)
        >>> verdict_of(user, probed, probed, 0.05)
        ('improved', '2.00x the steps/s of your settings', 0.0)
    """
    start, kept = start_names(retune)
    if for_tail:
        kept += ", with more batches in flight for the reads' tail"
    deficit = winnable(chosen)
    deficit = 0.0 if deficit < WAIT_OK else deficit
    # Without workers the loss is the main process's own loading, which the counts measured did not win back.
    lost = (
        f"loading in the main process still takes {deficit:.0%} of the loop's time"
        if chosen.setting.num_workers == 0
        else f"{deficit:.0%} of the step rate is still lost to data wait"
    )
    if chosen is user:
        if winnable(user) < WAIT_OK:
            return "compute_bound", "the loop runs at its compute rate; " + kept, deficit
        reason = f"no candidate measured at least {min_gain:.0%} faster, and by more than the noise; {kept}, and {lost}"
        return "no_gain", reason, deficit
    before, after = user.rate, chosen.rate
    reason = f"{after / before:.2f}x the steps/s of {start}" if before > 0 else f"faster than {start}"
    if chosen is not fastest:
        g, noise = gain(fastest, chosen)
        reason += (
            f"; {fastest.setting.label} read {g:.0%} faster, within the noise ({max(noise, RESOLUTION):.0%}): "
            "of the two, the one with more batches in flight, which absorbs what a window is too short to show"
        )
    if deficit > 0:
        reason += f"; {lost}"
    return "improved", reason, deficit
