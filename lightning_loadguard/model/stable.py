"""Stable verdicts: what the user is told changes only when a new diagnosis holds, with a margin.

Windows of a loop near a threshold land on either side of it by noise alone: a 5 % wait line crossed at
4.9 % and 5.1 %, a worker count rounded up from 1.99 or 2.01. Speaking each crossing would tell the user
to change a setting and change it back. :class:`StableDiagnosis` keeps the spoken diagnosis until another
one has been the raw verdict for ``hold`` consecutive windows, each time outweighing the spoken one by
``margin`` of loop time.
"""

from __future__ import annotations

from dataclasses import dataclass

from lightning_loadguard.model.capacity import BURST_MARGIN, WAIT_OK
from lightning_loadguard.model.findings import Diagnosis

HOLD_WINDOWS = 3
"""Consecutive windows a new verdict or recommended setting must hold before it is spoken."""

MARGIN = 0.01
"""Loop-time share by which a new dominant constraint must exceed the spoken one, in each of those windows."""

COUNT_MARGIN = 0.05
"""Relative distance past a rounding line that a new worker count must keep (see :func:`_count_moved`)."""

BASELINE = WAIT_OK
"""The severity a loss must reach to outrank a healthy (``compute_bound``) loop."""


def _advice(diagnosis: Diagnosis) -> tuple[object, ...]:
    """What the user would act on: the dominant verdict and the settings its finding recommends."""
    return diagnosis.findings[0].key()


def _loss(diagnosis: Diagnosis) -> float:
    """The share of loop time the worst listed constraint costs, or the loop's wait where none is listed."""
    losses = [f.severity for f in diagnosis.findings if f.verdict != "compute_bound"]
    wait = diagnosis.findings[0].evidence.get("wait_fraction", 0.0)
    return max([*losses, wait if isinstance(wait, float) else 0.0])


def _count_moved(raw: Diagnosis, spoken: Diagnosis, margin: float) -> bool:
    """Whether a new worker count is clear of the rounding line between it and the spoken count.

    The count is Little's law's busy workers rounded up: 1.98 asks for 2, 2.04 for 3. A change counts only
    when the busy-worker figure is ``COUNT_MARGIN`` past the line (above ``n x 1.05`` to go past ``n``).
    """
    new, old = raw.findings[0].evidence, spoken.findings[0].evidence
    wanted, had = new.get("workers_needed"), old.get("workers_needed")
    per_batch, rate = new.get("worker_time_s"), new.get("consumer_rate")
    if not all(isinstance(v, (int, float)) for v in (wanted, had, per_batch, rate)) or wanted == had:
        return True  # other advice than a worker count: only the hold applies
    busy = float(per_batch) * float(rate) * (1.0 + BURST_MARGIN)  # type: ignore[arg-type]
    if wanted > had:  # type: ignore[operator]
        return busy >= (float(wanted) - 1.0) * (1.0 + COUNT_MARGIN)  # type: ignore[arg-type]
    return busy <= float(wanted) * (1.0 - COUNT_MARGIN)  # type: ignore[arg-type]


def _clearly(raw: Diagnosis, spoken: Diagnosis, margin: float) -> bool:
    """Whether ``raw``'s verdict beats the ``spoken`` one by the margin, judged on ``raw``'s own figures."""
    if raw.verdict == spoken.verdict:
        return _count_moved(raw, spoken, margin)
    if raw.verdict == "compute_bound":
        return _loss(raw) <= BASELINE - margin
    severity = raw.findings[0].severity
    if spoken.verdict == "compute_bound":
        return severity >= BASELINE + margin
    old = raw.finding(spoken.verdict)
    return severity >= (old.severity if old is not None else 0.0) + margin


@dataclass
class StableDiagnosis:
    """Holds the spoken diagnosis; a new one replaces it only after ``hold`` windows with a ``margin``.

    Call :meth:`update` with each window's raw diagnosis; it returns the diagnosis to report and sets
    :attr:`changed` when that one differs in what the user would act on. The reported diagnosis carries
    the latest figures whenever the raw verdict agrees with it.

    Example:
        Noise around the 5 % line: a transfer cost of 5.2 % and 4.8 % in turn is spoken once.

        >>> from lightning_loadguard.model.findings import Finding
        >>> ok = Diagnosis("compute_bound", (Finding("compute_bound", 0.0),))
        >>> slow = Diagnosis("transfer_bound", (Finding("transfer_bound", 0.052), Finding("compute_bound", 0.0)))
        >>> stable = StableDiagnosis()
        >>> spoken = [stable.update(d).verdict for d in [ok, slow, ok, slow, ok, slow, ok]]
        >>> set(spoken), stable.changes
        ({'compute_bound'}, 1)
    """

    hold: int = HOLD_WINDOWS
    margin: float = MARGIN
    spoken: Diagnosis | None = None
    changed: bool = False
    changes: int = 0
    _pending: str | None = None
    _count: int = 0
    _settled: bool = False

    def __post_init__(self) -> None:
        if isinstance(self.hold, bool) or not isinstance(self.hold, int) or self.hold < 1:
            raise ValueError(f"hold must be an integer >= 1 (windows), got {self.hold!r}")
        if not 0.0 <= self.margin < 1.0:
            raise ValueError(f"margin must be within [0, 1), got {self.margin!r}")

    def update(self, raw: Diagnosis, *, settled: bool = True, closing: bool = False) -> Diagnosis:
        """The diagnosis to report after this window.

        Args:
            raw: this window's diagnosis.
            settled: ``False`` while the window is not yet full: in the run's first steps such a diagnosis is
                provisional, reported as it is, and the first settled one replaces it without a hold; later
                (a window restarted after a switch of settings) it needs the hold like any other.
            closing: a closing report (an epoch's or the run's end): under the verdict that held, the advice
                comes from the most data, this window's; the verdict itself still needs the hold.
        """
        self.changed = False
        if self.spoken is None or not self._settled:
            # Before the first full window the figures are provisional and reported as they come; after it, a
            # window cut short (the loader switched settings and its window restarted) holds like any other.
            self._settled = settled
            if self.spoken is not None and _advice(raw) == _advice(self.spoken):
                self.spoken = raw
                return raw
            return self._speak(raw)
        if _advice(raw) == _advice(self.spoken) or (closing and raw.verdict == self.spoken.verdict):
            if _advice(raw) != _advice(self.spoken):
                return self._speak(raw)
            self._pending, self._count = None, 0
            self.spoken = raw  # the same advice with the latest figures
            return raw
        outweighs = _clearly(raw, self.spoken, self.margin)
        # Advice within one verdict may settle over the windows (a depth refined by more data): what must
        # hold is that the windows keep disagreeing with the spoken advice, under the same verdict.
        if not outweighs:
            self._pending, self._count = None, 0
        elif raw.verdict == self._pending:
            self._count += 1
        else:
            self._pending, self._count = raw.verdict, 1
        if self._count >= self.hold:
            return self._speak(raw)
        return self._held(raw)

    def _held(self, raw: Diagnosis) -> Diagnosis:
        """The spoken advice, with this window's figures for every finding it still shows.

        The dominant finding keeps the spoken advice (its latest figures where this window gives the same
        advice); a secondary finding is shown as this window measures it, or not at all where this window no
        longer finds it (an epoch's start-up stall seen in the first window is not repeated at the run's
        end); a finding the spoken diagnosis did not list waits for the hold like any new advice.
        """
        spoken = self.spoken
        assert spoken is not None
        dominant = raw.finding(spoken.verdict)
        if dominant is None or dominant.key() != spoken.findings[0].key():
            dominant = spoken.findings[0]
        rest = (raw.finding(f.verdict) for f in spoken.findings[1:])
        held = Diagnosis(spoken.verdict, (dominant, *(f for f in rest if f is not None)), raw.draining)
        self.spoken = held
        return held

    def _speak(self, raw: Diagnosis) -> Diagnosis:
        self.spoken = raw
        self.changed = True
        self.changes += 1
        self._pending, self._count = None, 0
        return raw
