"""Typed results of a diagnosis: findings with their evidence and fix, and the report built from them."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from lightning_loadguard.model.drain import DrainAlarm

Verdict = Literal[
    "compute_bound",
    "producer_deficit",
    "bursty",
    "epoch_start_stall",
    "transfer_bound",
    "host_oversubscribed",
    "straggler_rank",
    "memory_risk",
    "loop_overhead",
]

VERDICTS: tuple[Verdict, ...] = (
    "memory_risk",
    "producer_deficit",
    "straggler_rank",
    "host_oversubscribed",
    "bursty",
    "transfer_bound",
    "loop_overhead",
    "epoch_start_stall",
    "compute_bound",
)
"""Every verdict, in the order that breaks ties between findings of equal severity.

Example:
    >>> VERDICTS[0], VERDICTS[-1]
    ('memory_risk', 'compute_bound')
"""

Evidence = dict[str, float | int | str]

_SEVERITY_WORDS = {
    "memory_risk": "of the memory budget",
    "host_oversubscribed": "of busy workers without a core",
}

# How an evidence figure reads in a sentence: its words and how its value is written (with its unit).
_MS = ("ms", lambda v: f"{v * 1e3:.3g} ms")
_SHARE = ("share", lambda v: f"{v:.1%}")
_EVIDENCE_WORDS: dict[str, tuple[str, Any]] = {
    "consumer_rate": ("the step alone runs at", lambda v: f"{v:.3g} steps/s"),
    "producer_rate": ("the loader can make", lambda v: f"{v:.3g} batches/s"),
    "headroom": ("which is", lambda v: f"{v:.3g}x what the step takes"),
    "wait_fraction": ("the loop waits for data", lambda v: f"{v:.1%} of its time"),
    "stall_fraction": ("fetches whose batch was not ready stall", lambda v: f"{v:.1%} of loop time"),
    "worker_time_s": ("one batch takes a worker", _MS[1]),
    "deficit_per_batch_s": ("the wait per batch tends to", _MS[1]),
    "ready_fetch_s": ("taking a ready batch costs", _MS[1]),
    "batch_tensors": ("a batch holds", lambda v: f"{v:.0f} tensors"),
    "ready_core_wait_fraction": (
        "waiting for a core while taking ready batches (not counted)",
        lambda v: f"{v:.1%} of loop time",
    ),
    "epoch_start_s": ("starting the loader takes", lambda v: f"{v:.3g} s per epoch"),
    "epoch_s": ("an epoch takes", lambda v: f"{v:.3g} s"),
    "expected_wait_s": ("the replay expects a wait of", lambda v: f"{v * 1e3:.3g} ms per step"),
    "transfer_fraction": ("the copy to the device takes", lambda v: f"{v:.1%} of loop time"),
    "inflight_host_bytes": ("batches in flight on this host hold", lambda v: f"{v / 2**20:.3g} MiB"),
    "loop_cores": ("the training process's own threads use", lambda v: f"{v:.2g} cores"),
    "worker_cores": ("its workers use", lambda v: f"{v:.2g} cores"),
    "other_cores": ("other work on the host uses", lambda v: f"{v:.2g} cores"),
    "usable_cores": ("this process may use", lambda v: f"{v:.3g} cores"),
}


def _plural(count: int, noun: str) -> str:
    """``1 worker``, ``2 workers``.

    Example:
        >>> _plural(1, "worker"), _plural(3, "worker")
        ('1 worker', '3 workers')
    """
    return f"{count} {noun}" + ("" if count == 1 else "s")


def evidence_sentence(evidence: Evidence) -> str:
    """The measured figures of a finding in words with units (the machine-readable ones stay on ``evidence``).

    Example:
        >>> evidence_sentence({"consumer_rate": 25.0, "worker_time_s": 0.034, "workers_needed": 2})
        'The step alone runs at 25 steps/s; one batch takes a worker 34 ms.'
    """
    parts = [
        f"{_EVIDENCE_WORDS[k][0]} {_EVIDENCE_WORDS[k][1](float(v))}"
        for k, v in evidence.items()
        if k in _EVIDENCE_WORDS and isinstance(v, (int, float)) and not isinstance(v, bool)
    ]
    if not parts:
        return ""
    text = "; ".join(parts) + "."
    return text[0].upper() + text[1:]


@dataclass(frozen=True)
class Finding:
    """One constraint the measurements show, with the numbers behind it and what to do.

    Attributes:
        verdict: one of :data:`VERDICTS`.
        severity: 0..1; for constraints that cost time, the share of loop time they cost (or will cost,
            for a deficit a buffer still hides); for ``memory_risk`` the share of the memory budget used;
            for ``host_oversubscribed`` the share of busy worker processes without a core. ``compute_bound``
            is 0.
        evidence: the measured and derived numbers. Integers are settings and counts (workers, depths,
            ranks) and make up :meth:`key`; floats are measurements.
        fix: concrete settings or actions, in words.
        summary: one readable sentence.
        recommended: the ``DataLoader`` keyword arguments the fix sets (``{}`` when nothing in the loader should
            change: a code change, or nothing at all).
        certain: whether LoadGuard stands behind the fix on this host: ``False`` where it rests on a prediction
            the measurements cannot confirm (e.g. more workers where the loop's threads and the workers compete
            for the same cores, or a gain within the noise of the windows it rests on); then the fix says how to
            verify it (``LoadGuard(auto_tune=True)`` where the tuner would measure this loader, else by hand).

    Example:
        >>> f = Finding("compute_bound", 0.0, {"headroom": 2.5}, "Nothing to change.", "Loader is fine.")
        >>> f.key()
        ('compute_bound', ())
    """

    verdict: Verdict
    severity: float
    evidence: Evidence = field(default_factory=dict)
    fix: str = ""
    summary: str = ""
    recommended: dict[str, Any] = field(default_factory=dict)
    certain: bool = True

    def __post_init__(self) -> None:
        if self.verdict not in VERDICTS:
            raise ValueError(f"verdict must be one of {', '.join(VERDICTS)}, got {self.verdict!r}")
        if not 0.0 <= self.severity <= 1.0:
            raise ValueError(f"severity must be within 0..1, got {self.severity!r}")

    def key(self) -> tuple[str, tuple[tuple[str, int | str], ...]]:
        """What identifies this finding across windows: its verdict and its discrete evidence."""
        discrete = sorted(
            (name, value)
            for name, value in self.evidence.items()
            if isinstance(value, (int, str)) and not isinstance(value, bool)
        )
        recommended = tuple(sorted((f"recommended:{k}", str(v)) for k, v in self.recommended.items()))
        return self.verdict, tuple(discrete) + recommended

    def to_text(self) -> str:
        """A markdown bullet: the summary, the fix (said to be a hypothesis where it is one) and the figures."""
        if self.verdict == "compute_bound":
            head = f"- **{self.verdict}**: {self.summary}"
        else:
            head = f"- **{self.verdict}** ({self.severity:.0%} {_SEVERITY_WORDS.get(self.verdict, 'of loop time')}): "
            head += self.summary
        lines = [head]
        if self.fix:
            label = "fix" if self.certain else "fix (a hypothesis on this host)"
            lines.append(f"  - {label}: {self.fix}")
        figures = evidence_sentence(self.evidence)
        if figures:
            lines.append(f"  - measured: {figures}")
        return "\n".join(lines)


@dataclass(frozen=True)
class Diagnosis:
    """The dominant constraint of a training loop's data path, with every current finding.

    Attributes:
        verdict: the dominant finding's verdict.
        findings: all findings, the dominant first, then by falling severity.
        draining: an alarm when the prefetch buffer is emptying, else ``None``.

    The callback should speak only when :meth:`key` changes; measurements drift from window to window,
    the verdicts and recommended settings do not.

    Example:
        >>> d = Diagnosis("compute_bound", (Finding("compute_bound", 0.0, summary="Loader is fine."),))
        >>> print(d.to_text())
        **Data path: compute_bound**
        - **compute_bound**: Loader is fine.
    """

    verdict: Verdict
    findings: tuple[Finding, ...]
    draining: DrainAlarm | None = None

    def __post_init__(self) -> None:
        if not self.findings or self.findings[0].verdict != self.verdict:
            raise ValueError("findings must start with the finding whose verdict is the diagnosis's verdict")

    @property
    def recommended(self) -> dict[str, Any]:
        """``DataLoader`` keyword arguments the dominant finding recommends (``{}``: nothing in the loader).

        Example:
            >>> Diagnosis("compute_bound", (Finding("compute_bound", 0.0),)).recommended
            {}
        """
        return dict(self.findings[0].recommended)

    @property
    def certain(self) -> bool:
        """Whether LoadGuard stands behind :attr:`recommended` on this host (``False``: a hypothesis to measure)."""
        return self.findings[0].certain

    def finding(self, verdict: Verdict) -> Finding | None:
        """The finding with this verdict, if there is one."""
        return next((f for f in self.findings if f.verdict == verdict), None)

    def key(self) -> tuple[object, ...]:
        """Equal for two diagnoses that would tell the user the same thing."""
        return self.verdict, tuple(sorted(f.key() for f in self.findings)), self.draining is not None

    def to_text(self) -> str:
        """A compact markdown report (TensorBoard text, the end-of-fit print)."""
        lines = [f"**Data path: {self.verdict}**"]
        lines += [f.to_text() for f in self.findings]
        if self.draining is not None:
            lines.append(f"- **draining**: {self.draining.summary()}")
        return "\n".join(lines)
