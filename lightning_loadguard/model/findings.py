"""Typed results of a diagnosis: findings with their evidence and fix, and the report built from them."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

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
        fix: concrete settings or actions.
        summary: one readable sentence.

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
        return self.verdict, tuple(discrete)

    def to_text(self) -> str:
        """A markdown bullet with the summary, the fix and the evidence."""
        numbers = ", ".join(f"{name}={_number(value)}" for name, value in self.evidence.items())
        lines = [f"- **{self.verdict}** ({self.severity:.0%}): {self.summary}"]
        if self.fix:
            lines.append(f"  - fix: {self.fix}")
        if numbers:
            lines.append(f"  - evidence: {numbers}")
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
        - **compute_bound** (0%): Loader is fine.
    """

    verdict: Verdict
    findings: tuple[Finding, ...]
    draining: DrainAlarm | None = None

    def __post_init__(self) -> None:
        if not self.findings or self.findings[0].verdict != self.verdict:
            raise ValueError("findings must start with the finding whose verdict is the diagnosis's verdict")

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


def _number(value: float | int | str) -> str:
    if isinstance(value, float):
        return f"{value:.3g}"
    return str(value)
