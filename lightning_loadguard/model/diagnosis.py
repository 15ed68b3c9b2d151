"""Diagnosis: from one window of measurements to the constraint that limits training, and its fix.

:func:`diagnose` applies one rule per verdict to a :class:`~lightning_loadguard.meters.window.WindowSnapshot`.
The rules judge sustained rates (the producer's measured busy time against the step time), not the
window's wait alone: a full buffer in front of a slow producer shows no wait until it is empty. The
thresholds are the module constants below.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from itertools import chain
from statistics import fmean, median

from lightning_loadguard.meters.settings import LoaderSettings
from lightning_loadguard.meters.window import WindowSnapshot
from lightning_loadguard.model import budget as hb
from lightning_loadguard.model import capacity as cap
from lightning_loadguard.model.buffer import steady_state_wait
from lightning_loadguard.model.contention import CoreCheck
from lightning_loadguard.model.drain import DrainAlarm, drain_from_levels, drain_from_rates
from lightning_loadguard.model.findings import VERDICTS, Diagnosis, Evidence, Finding, _plural
from lightning_loadguard.model.noise import BLOCK_STEPS as _BLOCK
from lightning_loadguard.model.noise import block_rates, comparison_noise, relative_error

__all__ = [
    "CERTAIN_GAIN",
    "EPOCH_START_SHARE",
    "MAX_EXTRA_WORKERS",
    "PACED_STEP_SHARE",
    "STRAGGLER_GAP",
    "TRANSFER_SHARE",
    "WAIT_OK",
    "Diagnosis",
    "Finding",
    "TunerReach",
    "diagnose",
]

WAIT_OK = cap.WAIT_OK

TRANSFER_SHARE = 0.2
"""Share of loop time in the host-to-device copy above which the copy itself is a constraint."""

EPOCH_START_SHARE = 0.05
"""Share of an epoch spent starting the loader's iterator (worker launch) that counts as a stall."""

STRAGGLER_GAP = 0.05
"""How far (in wait fraction) one rank must wait more than the median rank to be named: every other
rank loses that time in the gradient all-reduce."""

CORES_NO_GAIN = 0.02
"""Where the cores carry no more than this share above the throughput measured now, more workers are said to
gain nothing: within it the two rates are the same figure, measured twice."""

PACED_STEP_SHARE = 0.5
"""Share of steps that waited before the achieved rate is taken as the producer's rate, when the
producer is not instrumented: a loop that waits on most steps runs at the producer's pace."""

MAX_EXTRA_WORKERS = 8
"""Most workers beyond the current count tried in replays when depth alone cannot absorb bursts."""

CERTAIN_GAIN = 0.05
"""Least gain (relative steps/s) a worker or depth fix must be predicted to bring, and by more than the noise of
the windows it rests on, before LoadGuard states it as certain: the tuner keeps the user's settings below its
default ``min_gain`` (0.05) or within the windows' noise, and the advice says no more than a measurement could."""


@dataclass(frozen=True)
class TunerReach:
    """Whether ``LoadGuard(auto_tune=True)`` would measure another ``num_workers`` for this run's train loader.

    A fix that is a hypothesis says how to verify it; it offers the tuner only where the tuner would act.

    Attributes:
        acts: the tuner would probe worker counts for this loader (in this run, or in a run that adds it).
        reason: why it would not, in words, where it would not (``""``: not known, e.g. a window diagnosed
            without a trainer).
        chosen: the settings the tuner applied in this run (``None``: it has not decided).
        measured: each setting the tuner measured in this run with the steps/s of that window, in probing
            order. A fix that names one of them which the tuner measured and did not choose, while its choice
            runs, is a hypothesis: the run's only side-by-side measurement went the other way.

    Example:
        >>> TunerReach(False, "the train loader reads an IterableDataset").acts
        False
    """

    acts: bool
    reason: str = ""
    chosen: LoaderSettings | None = None
    measured: tuple[tuple[LoaderSettings, float], ...] = ()


UNKNOWN_REACH = TunerReach(False)
"""The tuner's reach where nothing says what it would do: the fix text then does not offer it."""

_WAITED = 0.01  # a wait shorter than 1 % of a step is timer noise, not a wait for the producer
_BUDGET_NAMES = {"ram_share": "available RAM", "shm_share": "free /dev/shm"}
_LOSSES = frozenset(
    {"producer_deficit", "bursty", "transfer_bound", "epoch_start_stall", "straggler_rank", "loop_overhead"}
)


def diagnose(
    snapshot: WindowSnapshot,
    history: Sequence[WindowSnapshot] = (),
    *,
    steps_per_epoch: int | None = None,
    tuner: TunerReach = UNKNOWN_REACH,
) -> Diagnosis:
    """Name the constraint that limits the training loop's data path, with evidence and fixes.

    Args:
        snapshot: the latest window of measurements.
        history: earlier windows of this run, oldest first. Those with the same loader settings add their
            production and step times to the sustained rates and the buffer replay.
        steps_per_epoch: training batches per epoch, to weigh the iterator start-up against an epoch;
            without it the window stands in for the epoch (which overstates the start-up's share when
            the window is shorter than an epoch).
        tuner: whether ``LoadGuard(auto_tune=True)`` would measure worker counts for this loader; a fix that
            is a hypothesis offers the tuner to verify it only where it would (see :class:`TunerReach`).

    Returns:
        A :class:`Diagnosis` whose ``verdict`` is the most severe finding's (``compute_bound`` when
        nothing costs more than ``WAIT_OK``).

    On an accelerator (a snapshot with a device timeline) every rule judges the device's clock: the data
    wait is the device's idle during the fetch, the step is the device's step plus the loop's idle
    (:meth:`WindowSnapshot.device_view`), and the loop's idle gets its own rule (``loop_overhead``).

    Example:
        Two workers at 0.5 s per batch cannot feed a 0.1 s step (they make 4 batches/s, it takes 10):

        >>> from lightning_loadguard.meters.window import HostFacts, LoaderSettings
        >>> snap = WindowSnapshot(
        ...     wait_s=(0.15,) * 50, step_s=(0.1,) * 50, production_s=(0.5,) * 50,
        ...     settings=LoaderSettings(num_workers=2, prefetch_factor=2), host=HostFacts(cpu_count=16))
        >>> d = diagnose(snap)
        >>> d.verdict, d.finding("producer_deficit").evidence["workers_needed"]
        ('producer_deficit', 6)
    """
    if steps_per_epoch is not None and steps_per_epoch < 1:
        raise ValueError(f"steps_per_epoch must be >= 1 or None, got {steps_per_epoch!r}")
    if not snapshot.step_s:
        raise ValueError("snapshot.step_s must hold at least one step")
    loop = _loop_overhead(snapshot)
    facts = _gather(snapshot.device_view(), [h.device_view() for h in history], tuner)
    epoch = _epoch_start(facts, steps_per_epoch)
    speed = [f for rule in (_deficit, _bursty, _transfer, _straggler, _oversubscribed) if (f := rule(facts))]
    findings = [_against_the_tuner(f, facts) for f in [*speed, loop, epoch] if f is not None]
    # Memory is a wall, whatever the speed: the tuner's measured rates do not speak to it.
    memory = _memory(facts)
    if memory is not None:
        findings.append(memory)
    if facts.draining is None and not any(f.verdict in _LOSSES for f in findings):
        findings.append(_compute_bound(facts))
    findings.sort(key=lambda f: (-f.severity, VERDICTS.index(f.verdict)))
    if findings[0].severity < WAIT_OK:
        # Below WAIT_OK a warning is listed but does not outrank a healthy loop.
        bound = [f for f in findings if f.verdict == "compute_bound"]
        findings = bound + [f for f in findings if f.verdict != "compute_bound"]
    return Diagnosis(verdict=findings[0].verdict, findings=tuple(findings), draining=facts.draining)


@dataclass(frozen=True)
class _Facts:
    snap: WindowSnapshot
    workers: int
    prefetch: int
    production_s: tuple[float, ...]  # per batch, one worker's busy time (pooled over same-settings windows)
    step_s: tuple[float, ...]
    consumer_rate: float
    capacity: float | None  # batches/s of all workers together
    capacity_source: str
    stall_fraction: float  # loop share waited on fetches whose batch was not there yet
    ready_wait_fraction: float  # loop share waited on fetches whose batch was already there, less core waits
    ready_core_wait_fraction: float  # loop share those fetches spent waiting for a core (the host's contention)
    draining: DrainAlarm | None
    rate_noise: float  # relative difference two measurements of these settings cannot tell from noise
    tuner: TunerReach

    @property
    def headroom(self) -> float | None:
        return None if self.capacity is None else self.capacity / self.consumer_rate

    @property
    def mean_step_s(self) -> float:
        return fmean(self.step_s)


def _gather(snap: WindowSnapshot, history: Sequence[WindowSnapshot], tuner: TunerReach) -> _Facts:
    same = [h for h in history if h.settings == snap.settings] + [snap]
    # The windows' own spread, blocks of every window of these settings pooled: a drifting, busy host spreads
    # them both within a window and between windows. Noise of a comparison of two measurements alike.
    error = relative_error(
        list(chain.from_iterable(block_rates([w + s for w, s in zip(h.wait_s, h.step_s, strict=False)]) for h in same))
    )
    production = tuple(chain.from_iterable(h.production_s for h in same))
    steps = tuple(chain.from_iterable(h.step_s for h in same))
    workers = max(0, snap.settings.num_workers)
    prefetch = snap.settings.prefetch
    if workers == 0 and not production:
        production = snap.wait_s  # made in the training process: each fetch is one production
    consumer_rate = 1.0 / fmean(steps) if fmean(steps) > 0 else math.inf
    loop = snap.loop_s
    ready_wait = snap.ready_wait_s
    core_wait = ready_wait * snap.core_wait_share(ready_only=True) if ready_wait > 0 else 0.0
    capacity, source = _capacity(snap, production, workers)
    draining = drain_from_levels(snap.buffer_level) if snap.buffer_level else None
    if draining is not None and (capacity is None or capacity >= consumer_rate):
        # The level trace is the net rate itself; it outranks a busy-time figure that says otherwise.
        capacity, source = consumer_rate * (1.0 - draining.drain_rate), "buffer drain"
    elif draining is None and capacity is not None and workers > 0 and snap.wait_fraction < WAIT_OK:
        level = snap.buffer_level[-1] if snap.buffer_level else snap.settings.batches_in_flight
        draining = drain_from_rates(capacity, consumer_rate, level)
    if capacity is None and workers > 0 and _paced(snap):
        capacity, source = snap.throughput, "achieved throughput"
    return _Facts(
        snap=snap,
        workers=workers,
        prefetch=prefetch,
        production_s=production,
        step_s=steps,
        consumer_rate=consumer_rate,
        capacity=capacity,
        capacity_source=source,
        stall_fraction=snap.stall_fraction,
        ready_wait_fraction=(ready_wait - core_wait) / loop if loop > 0 else 0.0,
        ready_core_wait_fraction=core_wait / loop if loop > 0 else 0.0,
        draining=draining,
        rate_noise=comparison_noise(error, error),
        tuner=tuner,
    )


def _capacity(snap: WindowSnapshot, production: tuple[float, ...], workers: int) -> tuple[float | None, str]:
    if production:
        return cap.producer_capacity(production, workers), "worker busy time"
    if snap.producer_rate is not None and snap.producer_rate > 0:
        return snap.producer_rate, "producer meter"
    return None, "unmeasured"


def _paced(snap: WindowSnapshot) -> bool:
    floor = _WAITED * snap.mean_step_s
    waited = sum(1 for w in snap.wait_s if w > floor)
    return snap.steps > 0 and waited / snap.steps >= PACED_STEP_SHARE and snap.wait_fraction >= WAIT_OK


def _rates(facts: _Facts) -> Evidence:
    evidence: Evidence = {
        "consumer_rate": facts.consumer_rate,
        "wait_fraction": facts.snap.wait_fraction,
        "num_workers": facts.workers,
    }
    if facts.snap.on_device:
        evidence["clock"] = "device"
    if facts.capacity is not None:
        evidence["producer_rate"] = facts.capacity
        if facts.workers > 0:
            # Without workers the batch is made between steps, never beside them: no headroom to speak of.
            evidence["headroom"] = facts.capacity / facts.consumer_rate
        evidence["capacity_source"] = facts.capacity_source
    cpu = facts.snap.cpu
    if cpu is not None:
        evidence |= {
            "usable_cores": cpu.usable_cores,
            "loop_cores": cpu.loop_cores,
            "worker_cores": cpu.worker_cores,
            "other_cores": cpu.other_cores,
        }
    return evidence


def _core_check(facts: _Facts) -> CoreCheck | None:
    """The cores the loop and its workers would need at the step's own rate, or ``None`` where unmeasured."""
    return hb.snapshot_cores(facts.snap, target_rate=facts.consumer_rate)


def _more_workers_certain(
    facts: _Facts, target_rate: float | None = None, now_rate: float | None = None
) -> tuple[bool, str]:
    """Whether more workers are a fix LoadGuard stands behind here, and if not, the sentence saying why.

    ``target_rate``: the steps/s the fix aims for (default: the step's own rate, the wait removed).
    ``now_rate``: the steps/s the settings hold (default: the window's throughput; a full buffer that
    drains holds up the throughput only until it is empty).
    """
    check = _core_check(facts)
    target = facts.consumer_rate if target_rate is None else target_rate
    now = facts.snap.throughput if now_rate is None else now_rate
    if check is None:
        return False, (
            " The host's CPU use was not measured, so whether the cores carry more workers is a prediction. "
            + _verify(facts)
        )
    if check.fits:
        return _beats_noise(facts, target, now)
    if check.sustainable_rate <= now * (1 + CORES_NO_GAIN):
        return False, (
            f" The loop and the workers compete for the same cores: {check.sentence(facts.consumer_rate)}; "
            f"the cores carry about {check.sustainable_rate:.3g} steps/s, no more than the "
            f"{now:.3g} the settings hold now, so more workers may well make the step slower. " + _verify(facts)
        )
    return False, (
        f" The loop and the workers compete for the same cores: {check.sentence(facts.consumer_rate)}. "
        "Fewer workers may be the most this host gives. " + _verify(facts)
    )


def _beats_noise(facts: _Facts, target_rate: float, now: float | None = None) -> tuple[bool, str]:
    """Whether the gain a fix aims for, from ``now`` steps/s (default: the window's throughput), beats
    ``CERTAIN_GAIN`` and the noise of the windows it rests on (the comparison the tuner makes before it replaces
    a setting), and if not, the sentence saying why."""
    now = facts.snap.throughput if now is None else now
    gain = target_rate / now - 1.0 if now > 0 else math.inf
    if gain >= max(CERTAIN_GAIN, facts.rate_noise):
        return True, ""
    if facts.rate_noise > CERTAIN_GAIN:
        why = (
            f"the windows it rests on are noisy: two measurements of these same settings may differ by "
            f"{facts.rate_noise:.0%} (twice the standard error of two, from the spread of their "
            f"{_plural(_BLOCK, 'step')} blocks), more than the {gain:.0%} the fix aims to gain"
        )
    else:
        why = f"the fix aims to gain {gain:.0%}, less than the {CERTAIN_GAIN:.0%} a measurement is asked to show"
    return False, f" A hypothesis on this host: {why}. " + _verify(facts)


def _verify(facts: _Facts) -> str:
    """How to verify a worker fix: the tuner where it would measure this loader, else by hand."""
    if facts.tuner.acts:
        return "LoadGuard(auto_tune=True) measures it and keeps your settings unless a candidate is faster."
    why = f" (the auto-tuner does not: {facts.tuner.reason})" if facts.tuner.reason else ""
    return f"Measure it before relying on it: a few hundred steps with each setting, side by side{why}."


def _worker_time(facts: _Facts) -> float:
    """One worker's mean time per batch."""
    if facts.production_s:
        return fmean(facts.production_s)
    assert facts.capacity is not None
    return max(1, facts.workers) / facts.capacity


def _deficit(facts: _Facts) -> Finding | None:
    host = facts.snap.host
    if math.isinf(facts.consumer_rate):
        return None  # steps of no measurable length: nothing to keep up with
    if facts.workers == 0:
        if facts.snap.wait_fraction < WAIT_OK:
            return None
        severity = facts.snap.wait_fraction
        why = "batches are made in the training process, so each step also waits for its batch"
    elif facts.capacity is not None and facts.capacity < facts.consumer_rate:
        severity = 1.0 - facts.capacity / facts.consumer_rate
        why = f"the loader makes {facts.capacity:.3g} batches/s but the step takes {facts.consumer_rate:.3g}/s"
    else:
        return None
    per_batch = _worker_time(facts)
    needed = cap.workers_needed(per_batch, facts.consumer_rate)
    budget = hb.snapshot_budget(facts.snap).max_workers
    evidence = _rates(facts) | {
        "worker_time_s": per_batch,
        "workers_needed": needed,
        "worker_budget": budget,
        "cores_per_process": host.cores_per_process,
    }
    fits_memory = _fits_memory(facts, needed * facts.prefetch)
    workers = needed if needed <= budget and fits_memory else min(needed, budget)
    # A full buffer hides the deficit until it drains: the gain is measured from the rate the workers hold.
    hidden = facts.draining is not None and facts.workers > 0 and facts.capacity is not None
    certain, caveat = _more_workers_certain(facts, now_rate=facts.capacity if hidden else None)
    if needed <= budget and fits_memory:
        fix = f"num_workers={needed} (now {facts.workers})."
    else:
        limits = []
        if needed > budget:
            limits.append(
                f"{host.cores_per_process:.3g} cores per training process allow {_plural(budget, 'worker')}"
                + _cpu_share_note(facts.snap.cpu_share)
            )
        if not fits_memory:
            limits.append(f"{needed * facts.prefetch} batches in flight per process exceed the memory budget")
        fix = (
            f"This host cannot give the {needed} workers needed ({'; '.join(limits)}). Use num_workers="
            f"{workers} and make each batch cheaper: lighter transforms, cache decoded samples, "
            f"{_move_work(facts)}, or run fewer training processes per host."
        )
    fix += caveat
    if facts.workers > 0:
        lag = 1.0 / facts.capacity - facts.mean_step_s if facts.capacity else 0.0
        evidence["deficit_per_batch_s"] = lag
        fix += (
            f" A deeper prefetch_factor is not the fix: with the producer slower on average the wait tends "
            f"to "
            f"{lag * 1e3:.3g} ms per batch however deep the buffer; prefetch only postpones it."
        )
    summary = f"Producer deficit: {why}; {_plural(needed, 'worker')} would keep up."
    recommended = {"num_workers": workers} if workers != facts.workers else {}
    return Finding(
        "producer_deficit", min(1.0, severity), evidence, fix, summary, recommended, certain and bool(recommended)
    )


def _move_work(facts: _Facts) -> str:
    """Where augmentation can go instead of the loader, on this machine."""
    if facts.snap.accelerator:
        return "move augmentation to the accelerator"
    return "do cheap augmentation on whole batches in the training step (vectorised) rather than per sample"


def _bursty(facts: _Facts) -> Finding | None:
    if facts.workers == 0 or facts.stall_fraction < WAIT_OK or facts.capacity is None:
        return None
    if facts.capacity < facts.consumer_rate:
        return None
    advice = _depth_advice(facts, facts.workers)
    if advice is None:
        return None
    evidence = _rates(facts) | {
        "stall_fraction": facts.stall_fraction,
        "prefetch_factor_now": facts.prefetch,
        "recommended_prefetch_factor": advice.prefetch_factor,
        "expected_wait_s": advice.expected_wait_s,
        "expected_wait_fraction": advice.expected_wait_fraction,
    }
    recommended: dict[str, int] = {}
    certain = True
    if advice.prefetch_factor <= facts.prefetch and advice.expected_wait_fraction < WAIT_OK:
        # The replay says the current depth absorbs the measured production: the stalls come from elsewhere.
        fix = (
            f"Not the prefetch depth: replaying the measured production and step times at prefetch_factor="
            f"{facts.prefetch} expects {advice.expected_wait_fraction:.1%} wait, yet {facts.stall_fraction:.1%} "
            "was measured. Look outside batch production: worker start-up at each epoch, the hand-over from the "
            "workers, or a resource the workers share (storage, network, a lock)."
        )
    elif advice.prefetch_factor > facts.prefetch and advice.expected_wait_fraction < WAIT_OK:
        recommended = {"prefetch_factor": advice.prefetch_factor}
        fix = (
            f"prefetch_factor={advice.prefetch_factor} (now {facts.prefetch}; {advice.batches_in_flight} "
            f"batches in flight): replaying the measured times expects {advice.expected_wait_s * 1e3:.3g} ms "
            f"wait per step ({advice.expected_wait_fraction:.1%} of loop time)."
        )
        certain, caveat = _beats_noise(facts, 1.0 / (facts.mean_step_s + advice.expected_wait_s))
        fix += caveat
    else:
        workers = _workers_for_bursts(facts)
        if workers is None:
            fix = (
                "Depth alone does not absorb these bursts and more workers would not either: make the slow "
                "batches cheaper (cache them, or even out sample sizes)."
            )
        else:
            evidence["workers_for_bursts"], extra = workers[0], workers[1]
            recommended = {"num_workers": workers[0], "prefetch_factor": extra.prefetch_factor}
            fix = (
                f"num_workers={workers[0]} with prefetch_factor={extra.prefetch_factor}: depth alone leaves "
                f"{advice.expected_wait_fraction:.1%} wait; with more workers the replay expects "
                f"{extra.expected_wait_fraction:.1%}."
            )
            certain, caveat = _more_workers_certain(facts, 1.0 / (facts.mean_step_s + extra.expected_wait_s))
            fix += caveat
    note = _memory_note(facts, evidence)
    limit = _batches_memory_holds(facts)
    workers = recommended.get("num_workers", facts.workers)
    if recommended and limit is not None and workers * recommended.get("prefetch_factor", facts.prefetch) > limit:
        # Memory is a wall: what it allows replaces what the replay asked for, whose gain, found for the deeper
        # buffer, no longer vouches for it.
        recommended = _within_memory(limit, workers)
        if workers != facts.workers and "num_workers" not in recommended:
            recommended = {"num_workers": workers, **recommended}
        depth = recommended.get("prefetch_factor", 0)
        if "num_workers" not in recommended and depth <= facts.prefetch:
            recommended = {}
        elif "num_workers" in recommended or workers != facts.workers or not facts.production_s:
            certain = False
        else:
            wait = cap.replayed_wait(facts.production_s, facts.step_s, workers, depth)
            certain, caveat = _beats_noise(facts, (1.0 - wait) / facts.mean_step_s)
            fix += caveat
        if not note:
            note = _memory_sentence(limit, workers)
    fix += note
    summary = (
        f"Bursts: the loader keeps up on average (headroom {facts.capacity / facts.consumer_rate:.3g}x) but "
        f"slow batches stall the step for {facts.stall_fraction:.1%} of loop time."
    )
    return Finding("bursty", min(1.0, facts.stall_fraction), evidence, fix, summary, recommended, certain)


def _depth_advice(facts: _Facts, workers: int) -> cap.PrefetchAdvice | None:
    if facts.production_s:
        return cap.recommend_prefetch(facts.production_s, facts.step_s, num_workers=workers)
    # Only rates are known: the closed-form estimate stands in for the replay.
    assert facts.capacity is not None
    per_worker = facts.capacity / max(1, facts.workers)
    x, y = facts.mean_step_s, 1.0 / (per_worker * workers)
    optimum = steady_state_wait(x, y, workers * cap.DEEP_PREFETCH)
    prefetch = next(
        (
            p
            for p in range(1, cap.DEEP_PREFETCH + 1)
            if steady_state_wait(x, y, workers * p) <= optimum + cap.PREFETCH_TOLERANCE * x
        ),
        cap.DEEP_PREFETCH,
    )
    wait = steady_state_wait(x, y, workers * prefetch)
    return cap.PrefetchAdvice(prefetch, workers * prefetch, wait, wait / (wait + x), optimum)


def _workers_for_bursts(facts: _Facts) -> tuple[int, cap.PrefetchAdvice] | None:
    limit = max(hb.snapshot_budget(facts.snap).max_workers, facts.workers)
    for workers in range(facts.workers + 1, min(limit, facts.workers + MAX_EXTRA_WORKERS) + 1):
        advice = _depth_advice(facts, workers)
        if advice is not None and advice.expected_wait_fraction < WAIT_OK:
            return workers, advice
    return None


def _transfer(facts: _Facts) -> Finding | None:
    snap = facts.snap
    copy_share = snap.mean_transfer_s * snap.steps / snap.loop_s if snap.loop_s > 0 else 0.0
    handover = facts.ready_wait_fraction >= WAIT_OK
    copy = copy_share >= TRANSFER_SHARE
    if not (handover or copy):
        return None
    ready = [w for w, r in zip(snap.wait_s, snap.ready or (), strict=False) if r]
    evidence: Evidence = {
        "ready_wait_fraction": facts.ready_wait_fraction,
        "transfer_fraction": copy_share,
        "pin_memory": int(snap.settings.pin_memory),
    }
    if snap.ready_fraction is not None:
        evidence["ready_fraction"] = snap.ready_fraction
    if ready:
        total = facts.ready_wait_fraction + facts.ready_core_wait_fraction
        evidence["ready_fetch_s"] = fmean(ready) * (facts.ready_wait_fraction / total if total > 0 else 1.0)
    if facts.ready_core_wait_fraction > 0:
        evidence["ready_core_wait_fraction"] = facts.ready_core_wait_fraction
    if snap.batch_tensors is not None:
        # A measurement, not a setting: a float stays out of the finding's key, which a batch of another shape
        # would otherwise change.
        evidence["batch_tensors"] = float(snap.batch_tensors)
    by_descriptor = handover and facts.workers > 0 and snap.sharing_strategy == "file_descriptor"
    if by_descriptor:
        evidence["sharing_strategy"] = "file_descriptor"
    actions = []
    if handover:
        actions.append(
            "the batch was already made, so the cost is in handing it over: return a few large contiguous "
            "tensors (not many small ones or Python objects)"
            + (
                " and compact dtypes (uint8, fp16) converted on the accelerator"
                if snap.accelerator
                else ", stacked in the workers' collate_fn"
            )
        )
        if by_descriptor:
            actions.append(
                "torch.multiprocessing.set_sharing_strategy('file_system') at the start of the script, before "
                "the loader starts its workers: each tensor then reaches the loop by its file's name, without "
                "the round trip to its worker that torch's default (file_descriptor) makes per tensor, which "
                "waits while that worker's Python makes the next batch (a process killed outright may leave "
                "its files in /dev/shm until torch's shared-memory manager removes them)"
            )
    recommended: dict[str, bool] = {}
    if copy:
        pin = "" if snap.settings.pin_memory else "pin_memory=True and "
        if snap.accelerator and not snap.settings.pin_memory:
            recommended = {"pin_memory": True}
        actions.append(f"the copy to the device takes {copy_share:.0%}: {pin}.to(device, non_blocking=True)")
    summary = (
        f"Transfer-bound: with batches ready, handing them over and copying them costs "
        f"{facts.ready_wait_fraction + copy_share:.1%} of loop time."
    )
    severity = min(1.0, facts.ready_wait_fraction + copy_share)
    fix = "; ".join(actions)
    return Finding("transfer_bound", severity, evidence, fix[0].upper() + fix[1:] + ".", summary, recommended)


def _epoch_start(facts: _Facts, steps_per_epoch: int | None) -> Finding | None:
    snap = facts.snap
    if not snap.epoch_start_s or snap.steps == 0 or facts.workers == 0:
        return None
    if snap.settings.persistent_workers and len(snap.epoch_start_s) <= 1:
        return None  # persistent workers start once: the first epoch's start-up is not paid again
    start = fmean(snap.epoch_start_s)
    per_step = snap.loop_s / snap.steps
    epoch = per_step * (steps_per_epoch if steps_per_epoch is not None else snap.steps)
    share = start / (start + epoch) if start + epoch > 0 else 0.0
    if share < EPOCH_START_SHARE:
        return None
    evidence: Evidence = {"epoch_start_s": start, "epoch_s": epoch, "epoch_start_share": share}
    recommended: dict[str, bool] = {}
    if snap.settings.persistent_workers:
        fix = (
            "persistent_workers is already on, so the start-up is not worker launch: look at the sampler's "
            "and dataset's per-epoch set-up (shuffling a large index, re-opening files)."
        )
    else:
        evidence["recommended_persistent_workers"] = 1
        recommended = {"persistent_workers": True}
        fix = f"persistent_workers=True: workers then start once, saving about {start:.3g} s per epoch."
    summary = f"Epoch-start stall: starting the loader takes {start:.3g} s, {share:.1%} of each epoch."
    return Finding("epoch_start_stall", min(1.0, share), evidence, fix, summary, recommended)


def _straggler(facts: _Facts) -> Finding | None:
    fractions = facts.snap.rank_wait_fractions
    if len(fractions) < 2:
        return None
    rank = max(range(len(fractions)), key=fractions.__getitem__)
    worst, typical = fractions[rank], median(fractions)
    if worst < WAIT_OK or worst - typical < STRAGGLER_GAP:
        return None
    evidence: Evidence = {"rank": rank, "rank_wait_fraction": worst, "median_wait_fraction": typical}
    fix = (
        f"Look at rank {rank}'s host and shard: its cores and disk (other jobs, a slower node), uneven "
        "sample sizes in its shard; give that host more loader workers or balance the shards."
    )
    summary = (
        f"Straggler: rank {rank} waits for data {worst:.1%} of the time (median rank {typical:.1%}); every "
        "rank waits for it in the gradient all-reduce."
    )
    return Finding("straggler_rank", min(1.0, worst - typical), evidence, fix, summary)


def _against_the_tuner(finding: Finding, facts: _Facts) -> Finding:
    """``finding``, made a hypothesis where its fix names a setting the tuner measured in this run and did not
    choose while its choice runs, with the two measured rates in its text."""
    chosen, measured, now = facts.tuner.chosen, facts.tuner.measured, facts.snap.settings
    if not finding.recommended or chosen is None or not now.same_loader(chosen):
        return finding
    fields = {k: v for k, v in finding.recommended.items() if k in LoaderSettings.__dataclass_fields__}
    if not fields:
        return finding
    target = replace(now, **fields)
    if target.num_workers == 0:
        target = replace(target, prefetch_factor=None)
    target_rates = [rate for setting, rate in measured if setting.same_loader(target)]
    chosen_rates = [rate for setting, rate in measured if setting.same_loader(chosen)]
    if target.same_loader(chosen) or not target_rates or not chosen_rates:
        return finding
    measured_here = (
        f" The auto-tuner measured {target.label} in this run at {fmean(target_rates):.1f} steps/s against "
        f"{fmean(chosen_rates):.1f} at {chosen.label}, and chose the latter: measure both again side by side "
        "before changing it."
    )
    return replace(finding, fix=finding.fix + measured_here, certain=False)


def _cpu_share_note(cpu_share: float | None) -> str:
    if cpu_share is None:
        return ""
    return f" (workers compute {cpu_share:.0%} of their busy time)"


def _oversubscribed(facts: _Facts) -> Finding | None:
    host = facts.snap.host
    procs = max(1, host.processes_on_host)
    # Summed from every rank's own count where the ranks' figures were combined; in one rank's window alone
    # the host's other ranks are taken to run what this one does.
    total = host.workers_on_host if host.workers_on_host is not None else facts.workers * procs
    # Workers waiting on I/O hold no core: count each at the CPU share of its busy time.
    cpu_share = 1.0 if facts.snap.cpu_share is None else facts.snap.cpu_share
    if total * cpu_share <= host.cpu_count:
        return None
    # Idle workers do not contend for cores: weigh by how busy the producer is.
    busy = 1.0 if facts.capacity is None else min(1.0, facts.consumer_rate / facts.capacity)
    severity = (1.0 - host.cpu_count / (total * cpu_share)) * busy
    budget = hb.snapshot_budget(facts.snap).max_workers
    evidence: Evidence = {
        "num_workers": facts.workers,
        "workers_on_host": total,
        "processes_on_host": procs,
        "cpu_count": host.cpu_count,
        "worker_budget": budget,
        "worker_busy_share": busy,
        "worker_cpu_share": cpu_share,
    }
    fewer = max(1, budget)
    summary = (
        f"Host oversubscribed: {_plural(total, 'worker process')} of {_plural(procs, 'training process')} "
        f"on {host.cpu_count} cores."
    ).replace("processs", "processes")
    fix, recommended, certain = _fewer_workers(facts, fewer, evidence)
    return Finding("host_oversubscribed", min(1.0, severity), evidence, fix, summary, recommended, certain)


def _fewer_workers(facts: _Facts, fewer: int, evidence: Evidence) -> tuple[str, dict[str, int], bool]:
    """The fix for too many workers (its text, its settings, whether it is certain): the ``fewer`` the cores
    carry, unless even their ceiling is below the rate the loop sustains now (a worker makes a batch no faster
    than its CPU time), where that many would slow the run whatever the contention costs: then the fewest whose
    ceiling reaches that rate, as a hypothesis, or none at all."""
    batch_cpu, now = facts.snap.batch_cpu_s, facts.snap.sustained_rate
    ceiling = fewer / batch_cpu if batch_cpu else math.inf
    if fewer >= facts.workers or ceiling >= now:
        fix = f"num_workers={fewer} (now {facts.workers}): more workers than cores slow the step they feed."
        # Fewer workers is a fix only where they were measured to compute (not to wait on I/O).
        return fix, {"num_workers": fewer}, facts.snap.cpu_share is not None
    evidence["fewer_workers_ceiling"] = ceiling
    least = math.ceil(now * batch_cpu - 1e-9)  # the fewest whose ceiling reaches today's rate
    short = (
        f"the {_plural(fewer, 'worker')} the cores carry would make at most {ceiling:.3g} batches/s "
        f"(a batch takes {batch_cpu * 1e3:.3g} ms of CPU), below the {now:.3g} steps/s the loop sustains now"
    )
    cheaper = (
        "The cores are short for this pipeline: make each batch cheaper (lighter transforms, cached decoded "
        "samples, batch-level augmentation in the step) or give the job more cores."
    )
    if least >= facts.workers:
        return f"Keep num_workers={facts.workers}: {short}, so fewer workers would slow this run. {cheaper}", {}, True
    fix = (
        f"num_workers={least} (now {facts.workers}), the fewest that could make the batches the loop takes now: "
        f"{short}. Whether {least} beats {facts.workers} on these cores is not known: measure both side by side. "
        + cheaper
    )
    return fix, {"num_workers": least}, False


def _memory(facts: _Facts) -> Finding | None:
    snap, host = facts.snap, facts.snap.host
    inflight = snap.inflight_host_bytes
    if inflight is None and snap.batch_bytes is not None:
        inflight = hb.host_inflight_bytes(
            snap.batch_bytes, snap.settings.batches_in_flight, max(1, host.processes_on_host)
        )
    if not inflight:
        return None
    shares = {}
    if host.available_ram_bytes:
        shares["ram_share"] = inflight / host.available_ram_bytes
    if facts.workers > 0 and host.shm_free_bytes:
        shares["shm_share"] = inflight / host.shm_free_bytes
    at_risk = shares.get("ram_share", 0.0) >= hb.RAM_BUDGET_SHARE or (
        shares.get("shm_share", 0.0) >= hb.SHM_BUDGET_SHARE
    )
    if not at_risk:
        return None
    evidence: Evidence = {"inflight_host_bytes": inflight, **shares}
    fix = "Fewer batches in flight: " + _memory_note(facts, evidence, always=True).strip()
    limit = evidence.get("max_batches_in_flight")
    recommended: dict[str, int] = {}
    if isinstance(limit, int) and facts.workers > 0:
        recommended = _within_memory(limit, facts.workers)
    summary = (
        f"Memory risk: {inflight / 2**30:.3g} GiB of batches in flight across the host's processes "
        f"({', '.join(f'{v:.0%} of {_BUDGET_NAMES[k]}' for k, v in shares.items())})."
    )
    return Finding("memory_risk", min(1.0, max(shares.values())), evidence, fix, summary, recommended)


def _batches_memory_holds(facts: _Facts) -> int | None:
    """Batches in flight per process the host's memory holds (``None``: unknown, or loading in process)."""
    if facts.snap.batch_bytes is None or facts.workers == 0:
        return None
    return hb.max_batches_in_flight(facts.snap.batch_bytes, facts.snap.host)


def _within_memory(limit: int, workers: int) -> dict[str, int]:
    """The loader settings that keep at most ``limit`` batches in flight: the deepest prefetch for ``workers``,
    else as many workers as batches, one each.

    Example:
        >>> _within_memory(10, 4), _within_memory(3, 4)
        ({'prefetch_factor': 2}, {'num_workers': 3, 'prefetch_factor': 1})
    """
    most = limit // workers
    return {"prefetch_factor": most} if most >= 1 else {"num_workers": max(1, limit), "prefetch_factor": 1}


def _fits_memory(facts: _Facts, batches_in_flight: int) -> bool:
    if facts.snap.batch_bytes is None:
        return True
    limit = hb.max_batches_in_flight(facts.snap.batch_bytes, facts.snap.host, uses_shm=facts.workers > 0)
    return limit is None or batches_in_flight <= limit


def _memory_note(facts: _Facts, evidence: Evidence, *, always: bool = False) -> str:
    limit = _batches_memory_holds(facts)
    if limit is None:
        return ""
    wanted = evidence.get("recommended_prefetch_factor", facts.prefetch)
    if not always and isinstance(wanted, int) and facts.workers * wanted <= limit:
        return ""
    evidence["max_batches_in_flight"] = limit
    return _memory_sentence(limit, facts.workers)


def _memory_sentence(limit: int, workers: int) -> str:
    """What :func:`_within_memory` allows ``workers``, in words."""
    allowed = _within_memory(limit, workers)
    if "num_workers" in allowed:
        return (
            f" Memory allows at most {limit} batches in flight per process: num_workers={allowed['num_workers']} "
            "with prefetch_factor=1."
        )
    return f" Memory allows at most prefetch_factor={allowed['prefetch_factor']} with {_plural(workers, 'worker')}."


def _loop_overhead(snap: WindowSnapshot) -> Finding | None:
    if not snap.on_device:
        return None
    period = snap.device_period_s
    loop_idle = math.fsum(snap.device_loop_idle_s)
    share = loop_idle / period if period > 0 else 0.0
    if share < WAIT_OK:
        return None
    steps = len(snap.device_step_s)
    evidence: Evidence = {
        "loop_idle_fraction": share,
        "loop_idle_ms": loop_idle / steps * 1e3,
        "device_step_ms": math.fsum(snap.device_step_s) / steps * 1e3,
        "data_idle_fraction": math.fsum(snap.device_data_idle_s) / period if period > 0 else 0.0,
        "clock": "device",
    }
    fix = (
        "Between steps the host does work the device cannot overlap: find it in the callbacks' and the "
        "module's on_train_batch_end, logging, the progress bar and checkpoint saving. Values turned into "
        "Python numbers (.item(), .cpu(), prog_bar=True, a metric computed on every step) make the host wait "
        "for the device and then leave it idle: log every few steps (log_every_n_steps, on_step=False), keep "
        "running values as device tensors, and move host-side work off the step."
    )
    summary = (
        f"Loop overhead: the device idles {loop_idle / steps * 1e3:.3g} ms per step ({share:.1%} of its time) "
        "while the host is busy outside the data fetch."
    )
    return Finding("loop_overhead", min(1.0, share), evidence, fix, summary)


def _compute_bound(facts: _Facts) -> Finding:
    evidence = _rates(facts)
    if facts.capacity is not None and facts.workers == 0:
        detail = (
            f"making each batch in the loop takes {1e3 / facts.capacity:.3g} ms, "
            f"{facts.snap.wait_fraction:.1%} of loop time"
        )
    elif facts.capacity is not None:
        detail = (
            f"the loader can make {facts.capacity:.3g} batches/s, "
            f"{facts.capacity / facts.consumer_rate:.3g}x the {facts.consumer_rate:.3g}/s the step takes"
        )
    else:
        detail = f"the loop waits for data {facts.snap.wait_fraction:.1%} of the time"
    return Finding(
        "compute_bound",
        0.0,
        evidence,
        "Nothing to change in the loader; speed up the step itself.",
        f"Compute-bound: the loader is not the constraint; {detail}.",
    )
