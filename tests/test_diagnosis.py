"""Diagnosis rules on synthetic windows with known timings (no Trainer)."""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lightning_loadguard.meters.window import HostFacts, LoaderSettings, WindowSnapshot
from lightning_loadguard.model import Diagnosis, diagnose
from lightning_loadguard.model.buffer import simulate_buffer
from lightning_loadguard.model.capacity import PREFETCH_TOLERANCE
from lightning_loadguard.model.drain import DrainAlarm, drain_from_levels

_BIG_HOST = HostFacts(cpu_count=32)


def _simulated(
    prod: list[float],
    step: float,
    workers: int,
    prefetch: int = 2,
    steps: int = 120,
    host: HostFacts = _BIG_HOST,
    **fields: object,
) -> WindowSnapshot:
    """A window whose waits and levels come from replaying known timings through the buffer model."""
    run = simulate_buffer(prod, [step], num_workers=workers, prefetch_factor=prefetch, steps=steps)
    return WindowSnapshot(
        wait_s=run.waits,
        step_s=(step,) * steps,
        settings=LoaderSettings(num_workers=workers, prefetch_factor=prefetch),
        host=host,
        buffer_level=run.levels if workers else None,
        production_s=tuple(prod[j % len(prod)] for j in range(steps)),
        **fields,  # type: ignore[arg-type]
    )


def test_fast_loader_is_compute_bound_with_its_headroom() -> None:
    d = diagnose(_simulated([0.1], 0.1, workers=4))
    assert d.verdict == "compute_bound"
    assert d.findings[0].evidence["headroom"] == pytest.approx(4.0)
    assert d.draining is None
    assert "not the constraint" in d.to_text()


def test_deficit_names_the_workers_needed_and_rules_out_prefetch() -> None:
    d = diagnose(_simulated([0.5], 0.1, workers=2))
    assert d.verdict == "producer_deficit"
    f = d.findings[0]
    assert f.evidence["workers_needed"] == 6  # 0.5 s x 10 batches/s = 5 in flight, + 20 % margin
    assert f.evidence["deficit_per_batch_s"] == pytest.approx(0.15)
    assert "num_workers=6" in f.fix
    assert "prefetch_factor is not the fix" in f.fix
    assert "recommended_prefetch_factor" not in f.evidence


def test_deficit_on_a_crowded_host_says_what_helps_instead() -> None:
    host = HostFacts(cpu_count=8, processes_on_host=4)
    d = diagnose(_simulated([0.5], 0.1, workers=1, host=host))
    f = d.finding("producer_deficit")
    assert f is not None
    assert f.evidence["worker_budget"] == 1
    assert "cannot give the 6 workers" in f.fix
    assert "cache" in f.fix


def test_in_process_loading_is_a_deficit_fixed_by_workers() -> None:
    d = diagnose(_simulated([0.05], 0.1, workers=0))
    assert d.verdict == "producer_deficit"
    assert d.findings[0].evidence["workers_needed"] == 1
    assert "num_workers=1" in d.findings[0].fix


def test_a_draining_buffer_with_no_wait_is_not_compute_bound() -> None:
    # The buffer filled during start-up and now loses a batch every 4 steps; the window saw no wait.
    levels = tuple(16 - k // 4 for k in range(40))
    snap = WindowSnapshot(
        wait_s=(0.0,) * 40,
        step_s=(0.1,) * 40,
        settings=LoaderSettings(num_workers=4, prefetch_factor=4),
        host=_BIG_HOST,
        buffer_level=levels,
        producer_instrumented=False,
    )
    d = diagnose(snap)
    assert d.verdict == "producer_deficit"
    assert d.draining is not None
    assert d.draining.drain_rate == pytest.approx(0.25, abs=0.01)
    assert d.draining.steps_to_empty == pytest.approx(27, abs=2)
    assert d.findings[0].evidence["capacity_source"] == "buffer drain"
    assert "draining" in d.to_text()


def test_a_measured_deficit_behind_a_full_buffer_raises_the_alarm_from_rates() -> None:
    snap = WindowSnapshot(
        wait_s=(0.0,) * 30,
        step_s=(0.1,) * 30,
        settings=LoaderSettings(num_workers=2, prefetch_factor=4),
        host=_BIG_HOST,
        production_s=(0.25,) * 30,  # 8 batches/s against 10/s
    )
    d = diagnose(snap)
    assert d.verdict == "producer_deficit"
    assert d.draining is not None and d.draining.source == "rates"
    assert d.draining.drain_rate == pytest.approx(0.2)
    assert d.draining.steps_to_empty == pytest.approx(8 / 0.2)


def test_bursts_get_the_depth_the_replay_finds() -> None:
    prod = [0.05] * 14 + [1.5]  # every 15th batch is slow; capacity is ample on average
    d = diagnose(_simulated(prod, 0.1, workers=2, prefetch=1, steps=150))
    assert d.verdict == "bursty"
    f = d.findings[0]
    depth = f.evidence["recommended_prefetch_factor"]
    assert isinstance(depth, int)
    waits = [
        simulate_buffer(prod, [0.1], num_workers=2, prefetch_factor=p, steps=600, record_levels=False).mean_wait_s
        for p in range(1, 33)
    ]
    optimum = next(p for p, w in enumerate(waits, 1) if w <= waits[-1] + PREFETCH_TOLERANCE * 0.1)
    assert abs(depth - optimum) <= 1
    assert f.evidence["expected_wait_fraction"] < 0.05
    assert f"prefetch_factor={depth}" in f.fix


def test_bursts_depth_cannot_absorb_ask_for_workers() -> None:
    # Every 16th batch is slow and batches go round-robin, so with 2 workers the slow one always lands on
    # worker 1, which then falls behind (1.85 s per 1.6 s of steps) however deep the buffer. A third worker
    # spreads the slow batches over all workers.
    prod = [0.05] * 15 + [1.5]
    d = diagnose(_simulated(prod, 0.1, workers=2, prefetch=1, steps=160))
    f = d.finding("bursty")
    assert f is not None
    assert f.evidence["workers_for_bursts"] == 3
    assert "num_workers=3" in f.fix


def test_epoch_start_stall_recommends_persistent_workers() -> None:
    snap = _simulated([0.1], 0.1, workers=4, epoch_start_s=(2.0, 2.2))
    d = diagnose(snap, steps_per_epoch=100)
    assert d.verdict == "epoch_start_stall"
    assert "persistent_workers=True" in d.findings[0].fix
    assert d.findings[0].evidence["epoch_start_s"] == pytest.approx(2.1)


def _ready_batches_taking_20_ms(**fields: object) -> WindowSnapshot:
    """Four workers keep every batch made ahead of a 100 ms step; taking one still costs 20 ms."""
    base = WindowSnapshot(
        wait_s=(0.02,) * 50,
        step_s=(0.1,) * 50,
        settings=LoaderSettings(num_workers=4),
        host=_BIG_HOST,
        ready=(True,) * 50,
        production_s=(0.1,) * 50,
    )
    return replace(base, **fields)  # type: ignore[arg-type]


@pytest.mark.parametrize(("accelerator", "words"), [(True, "converted on the accelerator"), (False, "collate_fn")])
def test_the_hand_over_fix_names_where_the_batch_is_made_compact_here(accelerator: bool, words: str) -> None:
    finding = diagnose(_ready_batches_taking_20_ms(accelerator=accelerator)).finding("transfer_bound")
    assert finding is not None
    assert words in finding.fix, finding.fix
    assert ("uint8" in finding.fix) is accelerator, finding.fix


def test_ready_batches_that_still_cost_time_are_transfer_bound() -> None:
    d = diagnose(_ready_batches_taking_20_ms())
    assert d.verdict == "transfer_bound"
    assert d.findings[0].evidence["ready_wait_fraction"] == pytest.approx(0.02 / 0.12)
    assert d.finding("bursty") is None


@pytest.mark.parametrize(
    ("tensors", "strategy", "by_name"),
    [(2, "file_descriptor", True), (None, "file_descriptor", True), (96, "file_system", False), (2, None, False)],
)
def test_a_costly_hand_over_names_the_sharing_strategy_where_torch_s_default_round_trips_each_tensor(
    tensors: int | None, strategy: str | None, by_name: bool
) -> None:
    snap = _ready_batches_taking_20_ms(batch_tensors=tensors, sharing_strategy=strategy)
    finding = diagnose(snap).finding("transfer_bound")
    assert finding is not None and finding.recommended == {}
    # The batch's format is named either way: a few tensors can still cost their unpickling.
    assert "a few large contiguous tensors" in finding.fix, finding.fix
    assert ("set_sharing_strategy('file_system')" in finding.fix) is by_name, finding.fix
    assert finding.evidence.get("batch_tensors") == tensors
    assert finding.evidence.get("sharing_strategy") == ("file_descriptor" if by_name else None)
    if tensors is not None:
        assert f"a batch holds {tensors} tensors" in finding.to_text()
        # A batch of another shape is the same finding (the text is logged again only where the finding changes).
        other = diagnose(replace(snap, batch_tensors=tensors + 1)).finding("transfer_bound")
        assert other is not None and other.key() == finding.key()


def test_loading_in_process_is_never_told_to_change_how_workers_share_tensors() -> None:
    snap = WindowSnapshot(
        wait_s=(0.02,) * 50,
        step_s=(0.1,) * 50,
        settings=LoaderSettings(num_workers=0),
        host=_BIG_HOST,
        transfer_s=(0.05,) * 50,
        accelerator=True,
        batch_tensors=2,
        sharing_strategy="file_descriptor",
    )
    finding = diagnose(snap).finding("transfer_bound")
    assert finding is not None and "set_sharing_strategy" not in finding.fix, finding.fix


@pytest.mark.parametrize(("core_wait", "verdict"), [(0.0, "transfer_bound"), (0.018, "compute_bound")])
def test_a_ready_batch_taken_late_for_want_of_a_core_is_not_a_hand_over_cost(core_wait: float, verdict: str) -> None:
    # Every 4th fetch is sampled; the rest are NaN. With 18 of its 20 ms spent waiting for a core, taking a
    # ready batch costs 2 ms of its own: 1.8 % of loop time, under WAIT_OK.
    nan = float("nan")
    snap = WindowSnapshot(
        wait_s=(0.02,) * 48,
        step_s=(0.1,) * 48,
        wait_queued_s=tuple(core_wait if i % 4 == 0 else nan for i in range(48)),
        settings=LoaderSettings(num_workers=4),
        host=_BIG_HOST,
        ready=(True,) * 48,
        production_s=(0.1,) * 48,
    )
    d = diagnose(snap)
    assert d.verdict == verdict, d.to_text()
    if core_wait:
        assert d.finding("transfer_bound") is None
        assert d.finding("producer_deficit") is None and d.finding("bursty") is None


def test_too_many_workers_for_the_cores() -> None:
    host = HostFacts(cpu_count=8, processes_on_host=2)
    d = diagnose(_simulated([0.7], 0.1, workers=8, host=host))
    f = d.finding("host_oversubscribed")
    assert f is not None
    assert f.evidence["worker_budget"] == 3
    assert "num_workers=3" in f.fix


def test_the_hosts_workers_are_the_ranks_own_counts_summed() -> None:
    # This rank runs 4 workers, the host's other rank 1 (summed: 5), on 4 cores: 4 x 2 processes would say 8.
    host = HostFacts(cpu_count=4, processes_on_host=2, workers_on_host=5)
    f = diagnose(_simulated([0.7], 0.1, workers=4, host=host)).finding("host_oversubscribed")
    assert f is not None and f.evidence["workers_on_host"] == 5
    assert f.summary.startswith("Host oversubscribed: 5 worker processes of 2 training processes on 4 cores")
    # The same rank beside a host whose other rank runs no workers: 4 on 4 cores is not oversubscribed.
    fits = replace(host, workers_on_host=4)
    assert diagnose(_simulated([0.7], 0.1, workers=4, host=fits)).finding("host_oversubscribed") is None


def test_the_straggler_rank_is_named() -> None:
    snap = _simulated([0.1], 0.1, workers=4, rank_wait_fractions=(0.01, 0.02, 0.31, 0.01))
    d = diagnose(snap)
    assert d.verdict == "straggler_rank"
    assert d.findings[0].evidence["rank"] == 2
    assert "rank 2" in d.findings[0].summary


def test_memory_risk_counts_the_host() -> None:
    host = HostFacts(cpu_count=32, processes_on_host=4, available_ram_bytes=8 * 2**30, shm_free_bytes=64 * 2**30)
    snap = _simulated([0.1], 0.1, workers=4, prefetch=8, host=host, batch_bytes=2**27)
    d = diagnose(snap)  # 128 MiB x 32 in flight x 4 processes = 16 GiB against 8 GiB available
    assert d.verdict == "memory_risk"
    assert d.findings[0].evidence["inflight_host_bytes"] == 16 * 2**30
    assert "prefetch_factor=" in d.findings[0].fix


def test_key_ignores_drift_but_not_a_new_verdict() -> None:
    a = diagnose(_simulated([0.5], 0.1, workers=2))
    b = diagnose(_simulated([0.5001], 0.1001, workers=2))
    c = diagnose(_simulated([0.1], 0.1, workers=4))
    assert a.key() == b.key()
    assert a.key() != c.key()
    assert isinstance(a, Diagnosis) and a.findings[0] is a.finding("producer_deficit")


def test_history_with_the_same_settings_adds_samples() -> None:
    old = _simulated([0.5], 0.1, workers=2)
    new = _simulated([0.3], 0.1, workers=2)
    other = _simulated([5.0], 0.1, workers=3)
    worker_time = diagnose(new, [other, old]).finding("producer_deficit")
    assert worker_time is not None
    assert worker_time.evidence["worker_time_s"] == pytest.approx(0.4)


def test_steps_of_no_length_have_nothing_to_keep_up_with() -> None:
    snap = WindowSnapshot(wait_s=(0.0,) * 10, step_s=(0.0,) * 10, production_s=(0.1,) * 10)
    assert diagnose(snap).verdict == "compute_bound"


def test_bad_arguments_raise() -> None:
    with pytest.raises(ValueError, match="steps_per_epoch"):
        diagnose(_simulated([0.1], 0.1, workers=1), steps_per_epoch=0)
    with pytest.raises(ValueError, match="levels"):
        drain_from_levels([-1] * 10)


@settings(max_examples=40, deadline=None)
@given(
    st.floats(0.11, 1.0),
    st.integers(1, 4),
    st.integers(1, 8),
    st.integers(5, 60),
)
def test_a_deficit_is_never_called_compute_bound(per_batch: float, workers: int, prefetch: int, n: int) -> None:
    # Whatever the window saw (here: no wait at all, as while a full buffer drains), a producer slower
    # than the step is a deficit, and no depth is recommended for it.
    # All workers together make one batch per `per_batch` seconds, slower than the 0.1 s step.
    production = per_batch * workers
    snap = WindowSnapshot(
        wait_s=(0.0,) * n,
        step_s=(0.1,) * n,
        settings=LoaderSettings(num_workers=workers, prefetch_factor=prefetch),
        host=_BIG_HOST,
        production_s=(production,) * n,
    )
    d = diagnose(snap)
    assert d.verdict == "producer_deficit"
    assert all("recommended_prefetch_factor" not in f.evidence for f in d.findings)


def test_stalls_the_replay_cannot_explain_are_not_blamed_on_prefetch() -> None:
    from lightning_loadguard.meters.window import HostFacts, LoaderSettings, WindowSnapshot
    from lightning_loadguard.model import diagnose

    # Two workers at 10 ms a batch feed a 20 ms step easily, yet every tenth fetch stalls 60 ms.
    waits = tuple(0.06 if i % 10 == 0 else 0.0 for i in range(100))
    snap = WindowSnapshot(
        wait_s=waits,
        step_s=(0.02,) * 100,
        ready=tuple(w == 0.0 for w in waits),
        production_s=(0.01,) * 100,
        settings=LoaderSettings(num_workers=2, prefetch_factor=2),
        host=HostFacts(cpu_count=8),
    )
    finding = diagnose(snap).finding("bursty")
    assert finding is not None
    assert "Not the prefetch depth" in finding.fix
    assert finding.evidence["recommended_prefetch_factor"] <= 2


def test_findings_of_equal_severity_are_ordered_as_the_verdict_table(monkeypatch: pytest.MonkeyPatch) -> None:
    # docs/verdicts.md: ties are broken in the table's order (VERDICTS), whatever order the rules run in. The
    # rules are replaced by ones returning fixed findings, the later rule's verdict earlier in the table.
    from lightning_loadguard.model import diagnosis as rules
    from lightning_loadguard.model.findings import VERDICTS, Finding

    first, second = "transfer_bound", "producer_deficit"
    assert VERDICTS.index(second) < VERDICTS.index(first)
    monkeypatch.setattr(rules, "_deficit", lambda facts: Finding(first, 0.4))
    monkeypatch.setattr(rules, "_transfer", lambda facts: Finding(second, 0.4))
    for name in ("_bursty", "_straggler", "_oversubscribed", "_memory"):
        monkeypatch.setattr(rules, name, lambda facts: None)
    d = diagnose(_simulated([0.01], 0.1, workers=2))
    assert [f.verdict for f in d.findings][:2] == [second, first] and d.verdict == second


# -- docs/verdicts.md: what a finding's severity is, checked against figures worked out by hand ------------------


@pytest.mark.parametrize(
    ("accelerator", "where"),
    [(True, "move augmentation to the accelerator"), (False, "augmentation on whole batches in the training step")],
)
def test_a_deficit_the_host_cannot_staff_says_where_augmentation_can_go_on_this_machine(
    accelerator: bool, where: str
) -> None:
    # 0.5 s a batch against a 0.1 s step needs 6 workers; 2 cores allow one.
    snap = _simulated([0.5], 0.1, workers=1, host=HostFacts(cpu_count=2), accelerator=accelerator)
    finding = diagnose(snap).finding("producer_deficit")
    assert finding is not None and "cannot give the 6 workers needed" in finding.fix, finding
    assert where in finding.fix, finding.fix


def test_the_diagnosis_tells_something_new_when_a_count_changes_not_when_only_its_figures_move() -> None:
    """docs/verdicts.md: the text is logged again when the verdicts, the recommended settings, a count among the
    evidence or a draining alarm change (``Diagnosis.key``), not on every window's new figures."""
    needs_6 = diagnose(_simulated([0.5], 0.1, workers=2))
    also_6 = diagnose(_simulated([0.49], 0.1, workers=2))  # 0.49 x 10 x 1.2 = 5.9: still 6 workers
    needs_7 = diagnose(_simulated([0.55], 0.1, workers=2))  # 6.6: 7 workers
    assert [d.findings[0].evidence["workers_needed"] for d in (needs_6, also_6, needs_7)] == [6, 6, 7]
    assert needs_6.findings[0].severity != also_6.findings[0].severity  # the figures moved
    assert needs_6.key() == also_6.key()
    assert needs_6.key() != needs_7.key()
    assert needs_6.draining is None
    alarmed = replace(needs_6, draining=DrainAlarm(0.25, 6.0, 24.0, "buffer_level"))
    assert alarmed.key() != needs_6.key()


def test_a_deficits_severity_is_the_share_of_loop_time_its_steady_wait_takes() -> None:
    # Two workers at 0.5 s a batch make 4 batches/s; the 0.1 s step would take 10. Once the buffer is empty every
    # step waits 0.25 - 0.1 = 0.15 s of a 0.25 s loop: 60 % of loop time.
    waiting = diagnose(_simulated([0.5], 0.1, workers=2)).finding("producer_deficit")
    assert waiting is not None and waiting.severity == pytest.approx(0.15 / 0.25)
    # Behind a full buffer (no wait yet) the severity is what the deficit will cost: 8 batches/s against 10 leave
    # 0.125 - 0.1 = 0.025 s of each 0.125 s loop waiting.
    hidden = WindowSnapshot(
        wait_s=(0.0,) * 30,
        step_s=(0.1,) * 30,
        settings=LoaderSettings(num_workers=2, prefetch_factor=4),
        host=_BIG_HOST,
        production_s=(0.25,) * 30,
    )
    finding = diagnose(hidden).finding("producer_deficit")
    assert hidden.wait_fraction == 0.0 and finding is not None
    assert finding.severity == pytest.approx(0.025 / 0.125)
    # Loading in the training process: the wait measured, 20 ms of each 120 ms loop.
    in_process = WindowSnapshot(wait_s=(0.02,) * 30, step_s=(0.1,) * 30, host=_BIG_HOST)
    loaded = diagnose(in_process).finding("producer_deficit")
    assert loaded is not None and loaded.severity == pytest.approx(0.02 / 0.12)


def test_the_measured_losses_severity_is_their_share_of_loop_time() -> None:
    # Taking a ready batch costs 20 ms of each 120 ms loop.
    handover = diagnose(_ready_batches_taking_20_ms()).finding("transfer_bound")
    assert handover is not None and handover.severity == pytest.approx(0.02 / 0.12)
    # A 2.1 s start-up (mean of 2.0 and 2.2) before 100 steps of 0.1 s that never wait: 2.1 s of a 12.1 s epoch.
    started = WindowSnapshot(
        wait_s=(0.0,) * 50,
        step_s=(0.1,) * 50,
        settings=LoaderSettings(num_workers=4),
        host=_BIG_HOST,
        production_s=(0.1,) * 50,
        epoch_start_s=(2.0, 2.2),
    )
    start = diagnose(started, steps_per_epoch=100).finding("epoch_start_stall")
    assert start is not None and start.severity == pytest.approx(2.1 / 12.1)
    # One rank waits 31 % of its loop, the median rank 1.5 %: every other rank loses the difference.
    straggler = diagnose(_simulated([0.1], 0.1, workers=4, rank_wait_fractions=(0.01, 0.02, 0.31, 0.01)))
    named = straggler.finding("straggler_rank")
    assert named is not None and named.severity == pytest.approx(0.31 - 0.015)


@pytest.mark.parametrize(
    ("ram_gib", "shm_gib", "severity"),
    [(40, 20, 16 / 20), (24, 64, 16 / 24)],  # shm the higher share, then RAM
    ids=["shm", "ram"],
)
def test_memory_risks_severity_is_the_higher_of_its_shares_of_ram_and_shm(
    ram_gib: int, shm_gib: int, severity: float
) -> None:
    # 128 MiB x 4 workers x 8 deep x 4 processes = 16 GiB in flight.
    host = HostFacts(
        cpu_count=32, processes_on_host=4, available_ram_bytes=ram_gib * 2**30, shm_free_bytes=shm_gib * 2**30
    )
    snap = _simulated([0.1], 0.1, workers=4, prefetch=8, host=host, batch_bytes=2**27)
    finding = diagnose(snap).finding("memory_risk")
    assert finding is not None and finding.severity == pytest.approx(severity)


def test_oversubscriptions_severity_is_the_share_of_workers_beyond_the_cores_weighted_by_their_busy_time() -> None:
    # 2 processes x 8 workers = 16 on 8 cores: half of them have no core. 8 workers at 0.7 s a batch make 11.4
    # batches/s for a loop that takes 10: busy 0.7 x 10 / 8 = 87.5 % of the time.
    host = HostFacts(cpu_count=8, processes_on_host=2)
    finding = diagnose(_simulated([0.7], 0.1, workers=8, host=host)).finding("host_oversubscribed")
    assert finding is not None and finding.severity == pytest.approx((1 - 8 / 16) * 0.875)
    # Workers that compute a quarter of their busy time count a quarter of a core each: 16 x 0.25 = 4 of 3 cores.
    small = HostFacts(cpu_count=3, processes_on_host=2)
    snap = _simulated([0.7], 0.1, workers=8, host=small, production_cpu_s=(0.175,) * 120)
    io = diagnose(snap).finding("host_oversubscribed")
    assert snap.cpu_share == pytest.approx(0.25)
    assert io is not None and io.severity == pytest.approx((1 - 3 / 4) * 0.875)


@pytest.mark.parametrize(("production_s", "verdict"), [(0.36, "compute_bound"), (0.45, "host_oversubscribed")])
def test_a_warning_under_five_percent_of_loop_time_does_not_outrank_a_healthy_loop(
    production_s: float, verdict: str
) -> None:
    # 9 busy workers on 8 cores: a ninth of them without a core, weighted by how busy they are (9 workers at
    # `production_s` against a 0.1 s step): 0.36 s gives 0.4 busy, 4.4 % of loop time; 0.45 s, 0.5 busy, 5.6 %.
    busy = production_s * 10 / 9
    d = diagnose(_simulated([production_s], 0.1, workers=9, host=HostFacts(cpu_count=8)))
    warning = d.finding("host_oversubscribed")
    assert warning is not None and warning.severity == pytest.approx(busy / 9)
    assert d.verdict == verdict, d.to_text()
    # Listed either way, behind the verdict when it costs less than 5 %.
    assert [f.verdict for f in d.findings] == sorted(
        ["compute_bound", "host_oversubscribed"], key=lambda v: v != verdict
    )


def test_bursts_that_neither_depth_nor_the_workers_the_cores_allow_absorb_are_told_to_make_slow_batches_cheaper() -> (
    None
):
    # The pattern of test_bursts_depth_cannot_absorb_ask_for_workers: a third worker would absorb it, but 3 cores
    # allow a process 2 workers (a core is the loop's), and 2 already run.
    prod = [0.05] * 15 + [1.5]
    d = diagnose(_simulated(prod, 0.1, workers=2, prefetch=1, steps=160, host=HostFacts(cpu_count=3)))
    f = d.finding("bursty")
    assert f is not None
    assert f.evidence["expected_wait_fraction"] >= 0.05  # depth alone leaves the wait
    assert "workers_for_bursts" not in f.evidence
    assert f.recommended == {}
    assert "make the slow batches cheaper" in f.fix, f.fix
