"""The tuner's core without a Trainer: options, budgets, windows, the plan and the decision."""

from __future__ import annotations

import math
import statistics
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lightning_loadguard.meters.ranks import WindowRanks
from lightning_loadguard.meters.settings import LoaderSettings
from lightning_loadguard.meters.window import HostFacts, WindowSnapshot, cpu_share
from lightning_loadguard.model.budget import HostBudget, host_budget
from lightning_loadguard.tuning.decision import TuneDecision
from lightning_loadguard.tuning.options import TuneOptions
from lightning_loadguard.tuning.planner import JUMP_CORES, Planner, model_only_decision
from lightning_loadguard.tuning.session import _span_choices, _spanning_planner

FAST = TuneOptions(warmup_steps=2, window_steps=6)


def snapshot(
    steps: int,
    mean_step_s: float,
    *,
    mean_wait_s: float = 0.0,
    production_s: tuple[float, ...] = (),
    made: int | None = None,
) -> WindowSnapshot:
    """A window of ``steps`` equal steps and waits (the loop's time is ``steps x (step + wait)``)."""
    return WindowSnapshot(
        wait_s=(mean_wait_s,) * steps, step_s=(mean_step_s,) * steps, production_s=production_s, batches_made=made
    )


def window(rate: float, step_s: float, production_s: float | None, *, made: int | None = None) -> WindowSnapshot:
    steps = FAST.window_steps
    assert steps is not None
    return snapshot(
        steps,
        step_s,
        mean_wait_s=max(0.0, 1.0 / rate - step_s),
        production_s=(production_s,) * 8 if production_s else (),
        made=steps if made is None else made,
    )


# -- options -------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("field", "value", "allowed"),
    [
        ("probe_share", 0.0, "(0, 1]"),
        ("probe_share", 1.5, "(0, 1]"),
        ("memory_share", float("nan"), "(0, 1]"),
        ("shm_share", "half", "(0, 1]"),
        ("max_workers", -1, ">= 0"),
        ("max_prefetch", 0, ">= 1"),
        ("warmup_steps", True, ">= 1"),
        ("window_steps", 3, ">= 4"),
        ("min_gain", -0.1, "[0, 1]"),
        ("tune_persistent_workers", 1, "True or False"),
        ("persistent_min_share", 2, "[0, 1]"),
        ("keep_random_draws", "yes", "True or False"),
    ],
)
def test_options_name_the_field_and_allowed_values(field: str, value: object, allowed: str) -> None:
    with pytest.raises(
        ValueError,
        match=rf"TuneOptions\.{field} must be .*{allowed}".replace("(", r"\(")
        .replace(")", r"\)")
        .replace("[", r"\[")
        .replace("]", r"\]"),
    ):
        TuneOptions(**{field: value})


def test_default_options_are_valid() -> None:
    options = TuneOptions()
    assert options.probe_share == 0.2 and options.memory_share == 0.5
    assert options.keep_random_draws is False


# -- budgets -------------------------------------------------------------------------------------------


def test_host_budget_shares_memory_between_the_hosts_processes() -> None:
    host = HostFacts(cpu_count=16, processes_on_host=4, available_ram_bytes=800_000_000, shm_free_bytes=None)
    budget = host_budget(host, 10_000_000, ram_share=0.5, shm_share=0.8)
    assert budget.max_workers == 3 and budget.workers_bound == "cores"
    assert budget.max_in_flight == 10 and budget.memory_bound == "host_memory"
    assert budget.allows(LoaderSettings(3, 3)) is None and budget.allows(LoaderSettings(3, 4)) == "host_memory"
    assert budget.allows(LoaderSettings(4, 1)) == "cores"
    # The pinned copy of a batch is in flight too.
    assert budget.allows(LoaderSettings(2, 5)) is None
    assert budget.allows(LoaderSettings(2, 5, pin_memory=True)) == "host_memory"


def test_shm_bounds_when_it_is_the_smaller_limit() -> None:
    host = HostFacts(cpu_count=8, available_ram_bytes=10**12, shm_free_bytes=1_000_000)
    budget = host_budget(host, 100_000, ram_share=0.5, shm_share=0.8)
    assert (budget.max_in_flight, budget.memory_bound) == (8, "shm")


def test_user_cap_and_unknown_batch_size() -> None:
    budget = host_budget(HostFacts(cpu_count=64), None, max_workers=2)
    assert (budget.max_workers, budget.workers_bound, budget.max_in_flight) == (2, "max_workers", None)


def test_io_bound_workers_may_share_cores_but_cpu_bound_ones_may_not() -> None:
    host = HostFacts(cpu_count=2)
    io = host_budget(host, None, cpu_share=0.05, loop_cores=0.2)
    cpu = host_budget(host, None, cpu_share=0.98, loop_cores=0.2)
    assert io.max_workers == 10  # 10 per spare core at most; the loop keeps a core however little it uses
    assert cpu.max_workers == 1
    # Workers queueing for too few cores: their CPU share over busy time less queueing says they compute.
    saturated = cpu_share([0.3] * 3, [0.1] * 3, [0.2] * 3)
    assert host_budget(host, None, cpu_share=saturated, loop_cores=0.2).max_workers == 1


# -- windows -------------------------------------------------------------------------------------------


def test_a_draining_buffer_does_not_flatter_the_rate() -> None:
    drained = snapshot(12, 0.01, made=4)
    assert drained.sustained_rate == pytest.approx(4 / 0.12)
    filling = snapshot(12, 0.01, made=20)
    assert filling.sustained_rate == pytest.approx(100.0)


def _combine(windows: list[WindowSnapshot], failed: list[bool], steps: int = 6) -> tuple[WindowSnapshot, bool]:
    ranks = WindowRanks(steps=steps, production=12)
    rows = [ranks.row(w, failed=f) for w, f in zip(windows, failed, strict=True)]  # what the gather hands back
    assert len({len(row) for row in rows}) == 1 and not ranks.broken(rows)
    return ranks.combine(windows[0], rows)


def test_ranks_combine_to_the_slowest_producer_and_the_real_compute() -> None:
    fast = window(50.0, 0.010, 0.02)
    slow = window(40.0, 0.014, 0.05)
    combined, failed = _combine([fast, slow], [False, True])
    assert combined.mean_step_s == 0.010 and combined.mean_production_s == 0.05
    assert combined.mean_wait_s == slow.mean_wait_s and failed
    alone, failed_alone = _combine([fast], [False])
    assert alone.wait_s == fast.wait_s and alone.production_s == fast.production_s and not failed_alone


def test_rank_windows_keep_their_latest_part_and_leave_unknowns_unknown() -> None:
    long = WindowSnapshot(
        wait_s=(0.0,) * 6, step_s=(0.01,) * 6, production_s=tuple(float(v) for v in range(40)), batches_made=None
    )
    combined, failed = _combine([long, long], [False, False])
    assert combined.batches_made is None and not failed
    assert combined.production_s == tuple(float(v) for v in range(40 - 12, 40))
    unmetered = replace(long, production_s=())
    assert _combine([long, unmetered], [False, False])[0].production_s == ()


# -- the plan ------------------------------------------------------------------------------------------


def test_compute_bound_keeps_the_settings_without_probing() -> None:
    planner = Planner(LoaderSettings(2, 2), HostBudget(7, "cores"), FAST, epoch_steps=400)
    assert planner.record(window(98.0, 0.010, 0.015)) is None
    decision = planner.decide()
    assert decision.verdict == "compute_bound" and decision.setting == LoaderSettings(2, 2)
    assert decision.probe_steps == 0 and decision.probe_cost_s == 0.0


def test_a_wait_that_went_to_waiting_for_a_core_is_not_a_loader_to_tune() -> None:
    # 12 % of the loop waits; the sampled fetches spent 90 % of theirs waiting for a core (a busy host).
    steps = FAST.window_steps
    assert steps is not None
    busy_host = replace(
        window(88.0, 0.010, 0.015),
        wait_queued_s=tuple(0.0012 if k % 4 == 0 else math.nan for k in range(steps)),
    )
    planner = Planner(LoaderSettings(2, 2), HostBudget(7, "cores"), FAST, epoch_steps=400)
    assert planner.record(busy_host) is None
    assert planner.decide().verdict == "compute_bound"
    # The same wait spent on the loader is worth probing.
    planner = Planner(LoaderSettings(2, 2), HostBudget(7, "cores"), FAST, epoch_steps=400)
    assert planner.record(window(88.0, 0.010, 0.015)) is not None


def test_a_slower_candidate_never_replaces_the_original() -> None:
    planner = Planner(LoaderSettings(1, 2), HostBudget(7, "cores"), FAST, epoch_steps=400)
    proposal = planner.record(window(30.0, 0.010, 0.033))
    assert proposal is not None and proposal.num_workers > 1
    # Contention: more workers measured slower, then the one between as well.
    while proposal is not None:
        proposal = planner.record(window(25.0, 0.010, 0.2))
    decision = planner.decide()
    assert decision.setting == LoaderSettings(1, 2) and decision.verdict == "no_gain"
    assert decision.throughput_after == decision.throughput_before
    assert decision.remaining_deficit == pytest.approx(0.7)


def test_within_noise_is_not_an_improvement() -> None:
    planner = Planner(LoaderSettings(1, 2), HostBudget(7, "cores"), FAST, epoch_steps=400)
    planner.record(window(30.0, 0.010, 0.033))
    planner.record(window(31.0, 0.010, 0.1))
    assert planner.decide().setting == LoaderSettings(1, 2)


def test_the_fastest_candidate_wins_and_the_deficit_left_is_reported() -> None:
    planner = Planner(LoaderSettings(0), HostBudget(3, "cores"), FAST, epoch_steps=400)
    proposal = planner.record(window(20.0, 0.010, 0.05))
    assert proposal == LoaderSettings(3, 2)  # Little's law asks for 6; the cores are predicted to allow 3
    # 3 workers paid: a fourth is measured past the predicted limit (one batch each), and found no faster,
    # twice (a window that measured it faster than the best without paying gets one more).
    assert planner.record(window(60.0, 0.010, 0.05)) == LoaderSettings(4, 1)
    assert planner.record(window(61.0, 0.010, 0.066)) == LoaderSettings(4, 1)
    assert planner.continuing and planner.steps_for(LoaderSettings(4, 1)) == FAST.warmup_steps + planner.window_steps
    # The search is over and 3 workers would replace the user's settings: those are measured again, last.
    assert planner.record(window(61.0, 0.010, 0.066)) == LoaderSettings(0)
    assert planner.record(window(20.0, 0.010, 0.05)) is None
    decision = planner.decide()
    assert decision.verdict == "improved" and decision.num_workers == 3
    assert decision.remaining_deficit == pytest.approx(0.4) and decision.bounded_by == "cores"
    assert "4 workers measured 61 steps/s against 60, less than 5% more" in decision.reason
    assert decision.throughput_before == pytest.approx(20.0) and decision.throughput_after == pytest.approx(60.0)


def test_a_failed_candidate_is_never_chosen() -> None:
    planner = Planner(LoaderSettings(1, 2), HostBudget(7, "cores"), FAST, epoch_steps=400)
    proposal = planner.record(window(30.0, 0.010, 0.033))
    assert proposal is not None
    planner.record(window(99.0, 0.010, 0.033), failed="RuntimeError: worker killed")
    decision = planner.decide()
    assert decision.num_workers == 1
    assert [c.failed for c in decision.candidates] == [None, "RuntimeError: worker killed"]


def _bursty(rate: float, spread: float, bursts: tuple[int, ...], batches: int = 24) -> WindowSnapshot:
    """benchmarks/tune_pipelines.py's bursty as a window: 8 ms steps, batches of 2 ms but for one sample in 29,
    60 ms more (at the positions given), blocks of 4 steps swinging by ``spread``."""
    production = tuple(0.062 if i in bursts else 0.002 for i in range(batches))
    return replace(_blocky(rate, spread, 0.008, 0.0), production_s=production, batches_made=batches)


def test_the_replay_that_sizes_workers_for_bursts_looks_past_the_predicted_core_limit() -> None:
    # One run's first window predicted 3 cores: no count up to 3 absorbs the bursts, and a replay that stopped
    # there proposed Little's law's 2 (kept: 0.80 of the grid's best). The replay asks for 4; the prediction
    # caps the proposal at 3, and names the bound.
    planner = Planner(LoaderSettings(0), HostBudget(3, "cores"), NOISY, epoch_steps=600)
    proposal = planner.record(_bursty(65.0, 0.02, (5, 17)))
    assert proposal == LoaderSettings(3, 2), planner.current_note
    assert "4 to absorb the bursts (replay)" in planner.current_note


def test_more_workers_slower_within_the_noise_go_on_to_the_count_the_bursts_ask_for() -> None:
    # bursty, one run: 2 workers' one window held no burst (95 steps/s, 75 in the steady state), 3 workers'
    # two windows held six and read 1.5 % below it together, within their noise. Neither is evidence of
    # contention on a host predicted to hold more workers: every batch measured is a sample of the same
    # bursts, and the replay of them all asks for 4 workers, which are measured next (not a deeper buffer
    # for 2, which in the steady state ran at 0.87 of 4 workers).
    planner = Planner(LoaderSettings(2, 2), HostBudget(10, "cores"), NOISY, epoch_steps=600)
    assert planner.record(_bursty(94.6, 0.26, ())) == LoaderSettings(3, 2), planner.current_note
    assert planner.record(_bursty(87.8, 0.26, (3, 11, 20))) == LoaderSettings(3, 2), planner.current_note
    assert planner.current_note.startswith("measured again")
    assert planner.record(_bursty(99.2, 0.26, (2, 9, 19))) == LoaderSettings(4, 2), planner.current_note
    assert "to absorb the bursts (replay)" in planner.current_note


def test_bursts_get_a_deeper_buffer() -> None:
    # One batch in eight takes 70 ms: the replayed times account for the loop's wait, a buffer absorbs it.
    planner = Planner(LoaderSettings(2, 2), HostBudget(2, "cores"), FAST, epoch_steps=400)
    bursty = snapshot(6, 0.01, mean_wait_s=0.004, production_s=(0.002,) * 7 + (0.07,), made=6)
    proposal = planner.record(bursty)
    assert proposal is not None and proposal.num_workers == 2 and proposal.prefetch_factor > 2


def test_a_wait_the_measured_times_do_not_explain_gets_workers_not_a_deeper_buffer() -> None:
    # 2 workers at a steady 17 ms per batch against a 10 ms step: the replayed buffer keeps up, yet the loop
    # waited 30 % of its time (on a 2-core host the workers wait for a core between batches). No depth removes
    # a wait that is not a burst: the next probe is a third worker, past the predicted core limit.
    planner = Planner(LoaderSettings(1, 2), HostBudget(1, "cores"), FAST, epoch_steps=600)
    assert planner.record(window(53.0, 0.010, 0.017)) is not None
    steady = window(70.0, 0.010, 0.017)
    assert steady.wait_fraction > 0.25
    proposal = planner.record(steady)
    assert proposal is not None and (proposal.num_workers, proposal.prefetch) == (3, 1), planner.current_note


@pytest.mark.parametrize(
    ("yours", "probed"), [(LoaderSettings(1, 2), LoaderSettings(2, 1)), (LoaderSettings(1, 4), LoaderSettings(2, 4))]
)
def test_a_worker_count_past_the_core_limit_is_probed_at_one_batch_per_worker(
    yours: LoaderSettings, probed: LoaderSettings
) -> None:
    # Past the predicted core limit each batch made ahead of the step takes a core from it: the next count
    # starts at one batch per worker (torch's default depth of 2 was chosen for no host), unless the depth was
    # chosen deeper than that (by the user, or by the buffer replay), which is kept.
    planner = Planner(yours, HostBudget(1, "cores"), FAST, epoch_steps=600)
    proposal = planner.record(window(53.0, 0.010, 0.017))
    assert proposal == probed, planner.current_note
    assert planner.current_note.startswith("past the predicted core limit of 1")


def test_the_count_a_jump_passed_over_is_measured_before_a_deeper_buffer_for_the_jump() -> None:
    # 1 worker read below in-process, and the jump to 4 workers (one batch each) 30 % above it, in a window
    # whose bursts the buffer replay would absorb at prefetch 2. Which worker count wins the cores is not a
    # question of depth: 2 workers, which the jump passed over, are measured first, then the deeper buffer.
    planner = Planner(LoaderSettings(0), HostBudget(1, "cores"), FAST, epoch_steps=600)
    assert planner.record(window(55.0, 0.0024, 0.0166)) == LoaderSettings(1, 2)
    assert planner.record(window(41.0, 0.0024, 0.0166)) == LoaderSettings(4, 1)
    steps, step_s = FAST.window_steps, 0.010
    assert steps is not None
    bursty = snapshot(steps, step_s, mean_wait_s=1 / 72.0 - step_s, production_s=(0.002,) * 7 + (0.07,), made=steps)
    assert planner.record(bursty) == LoaderSettings(2, 1), planner.current_note
    assert planner.current_note.startswith("between 1 worker, slower, and the jump to 4")
    assert planner.record(window(60.0, 0.0024, 0.0166)) == LoaderSettings(4, 2)
    assert planner.current_note == "deeper buffer for bursts (replay)"


def test_a_wait_for_batches_already_made_gets_no_more_workers() -> None:
    # 4 workers make a batch in 16 ms each (250 batches/s) for a loop that runs 190 steps/s at most, yet it
    # waits 13 % of its time: on batches already waiting when fetched, i.e. for the hand-over from the
    # workers. No further worker shortens that; the same wait on batches not yet made asks for one more.
    def measured(ready: bool) -> WindowSnapshot:
        steps = FAST.window_steps
        assert steps is not None
        return replace(window(165.0, 0.0053, 0.016), ready=(ready,) * steps)

    for ready, more in ((True, False), (False, True)):
        planner = Planner(LoaderSettings(0), HostBudget(8, "cores"), FAST, epoch_steps=600)
        assert planner.record(window(47.0, 0.0053, 0.016)) == LoaderSettings(4, 2)
        proposal = planner.record(measured(ready))
        assert (proposal is not None and proposal.num_workers == 5) is more, planner.current_note
        decision = planner.decide() if proposal is None else None
        assert decision is None or decision.setting == LoaderSettings(4, 2)


def test_a_setting_measured_again_is_judged_on_both_windows() -> None:
    # 3 workers measured 2.5 % above 2 (past the predicted core limit, short of the 5 % that pays), then
    # 6 %: the lucky second window alone would pay; both together (4 %) do not.
    planner = Planner(LoaderSettings(1, 2), HostBudget(1, "cores"), FAST, epoch_steps=600)
    rates = {1: [60.0, 60.0], 2: [80.0], 3: [82.0, 85.0]}
    proposal = planner.record(window(rates[1][0], 0.010, 0.017))
    probed = []
    while proposal is not None:
        probed.append(proposal.num_workers)
        rate = rates[proposal.num_workers].pop(0)
        proposal = planner.record(window(rate, 0.010, 0.017 * proposal.num_workers / 2))
    assert probed == [2, 3, 3, 1, 1]  # then the user's settings again, after the candidates, in two windows
    decision = planner.decide()
    assert decision.num_workers == 2, decision.table()
    assert "3 workers measured 83.5 steps/s against 80" in decision.reason


def test_a_spent_probe_budget_still_measures_the_users_settings_again_before_they_are_replaced() -> None:
    # 3 workers measured 1 % above 2, unpaid: a second window of them no longer fits the probe budget (24
    # steps), but the user's settings cost no probe steps and are measured again, last, as in a search that
    # ended on its own.
    planner = Planner(LoaderSettings(1, 2), HostBudget(1, "cores"), FAST, epoch_steps=120)
    rates = {1: [60.0, 66.0, 66.0], 2: [80.0], 3: [81.0]}
    proposal = planner.record(window(rates[1].pop(0), 0.010, 0.017))
    probed = []
    while proposal is not None:
        probed.append(proposal.num_workers)
        proposal = planner.record(window(rates[proposal.num_workers].pop(0), 0.010, 0.0085 * proposal.num_workers))
    assert probed == [2, 3, 1, 1] and planner.probe_steps <= planner.budget_steps
    decision = planner.decide()
    assert decision.num_workers == 2 and decision.bounded_by == "probe_budget", decision.table()
    assert decision.throughput_before == pytest.approx(66.0)  # the faster of the user's two windows


def test_a_candidate_that_closes_the_wait_replaces_the_users_settings_only_after_they_are_measured_again() -> None:
    planner = Planner(LoaderSettings(0), HostBudget(8, "cores"), FAST, epoch_steps=600)
    candidate = planner.record(window(50.0, 0.010, 0.010))
    assert candidate is not None and candidate.num_workers > 0
    assert planner.record(window(99.0, 0.010, 0.010)) == LoaderSettings(0)  # no wait left: the search is over
    assert planner.record(window(52.0, 0.010, 0.010)) is None
    decision = planner.decide()
    assert decision.setting == candidate and decision.throughput_before == pytest.approx(52.0)
    # Where the epoch has no room left for that window, the decision is made without it (a fit that ended
    # inside it would end undecided).
    whole_epoch = TuneOptions(warmup_steps=2, window_steps=6, probe_share=1.0)
    short = Planner(LoaderSettings(0), HostBudget(8, "cores"), whole_epoch, epoch_steps=24)
    assert short.record(window(50.0, 0.010, 0.010)) == candidate
    assert short.record(window(99.0, 0.010, 0.010)) is None
    assert short.decide().setting == candidate


def test_two_windows_joined_are_one_window_of_both() -> None:
    nan = math.nan
    first = WindowSnapshot(
        wait_s=(0.01, 0.02),
        step_s=(0.1, 0.1),
        wait_queued_s=(0.001, nan),
        ready=(True, False),
        production_s=(0.05,),
        production_cpu_s=(0.04,),
        batches_made=1,
    )
    later = WindowSnapshot(
        wait_s=(0.03,),
        step_s=(0.2,),
        production_s=(0.06, 0.07),
        batches_made=2,
        settings=LoaderSettings(2, 4),
    )
    joined = first.joined(later)
    assert joined.wait_s == (0.01, 0.02, 0.03) and joined.step_s == (0.1, 0.1, 0.2)
    assert joined.batches_made == 3 and joined.production_s == (0.05, 0.06, 0.07)
    assert joined.ready is None  # not known for the later window's fetches
    assert joined.wait_queued_s[:1] == (0.001,) and all(math.isnan(v) for v in joined.wait_queued_s[1:])
    assert joined.production_cpu_s[0] == 0.04 and all(math.isnan(v) for v in joined.production_cpu_s[1:])
    assert joined.settings == LoaderSettings(2, 4)
    assert joined.sustained_rate == pytest.approx(3 / (0.06 + 0.4))


def test_the_probe_budget_is_a_share_of_the_epoch() -> None:
    planner = Planner(LoaderSettings(0), HostBudget(64, "cores"), FAST, epoch_steps=100)
    assert planner.budget_steps == 20 and planner.can_start()
    proposal = planner.record(window(10.0, 0.010, 0.1))
    rate = 10.0
    while proposal is not None:
        rate *= 1.5
        proposal = planner.record(window(rate, 0.010, 0.1))
    decision = planner.decide()
    assert decision.probe_steps <= decision.probe_budget_steps == 20
    assert decision.bounded_by == "probe_budget"
    assert not Planner(LoaderSettings(0), HostBudget(4, "cores"), FAST, epoch_steps=30).can_start()


@settings(max_examples=60, deadline=None)
@given(
    rates=st.lists(st.floats(1.0, 500.0), min_size=1, max_size=8),
    production=st.floats(0.001, 0.5),
    step=st.floats(0.001, 0.1),
    max_workers=st.integers(0, 12),
    max_in_flight=st.integers(1, 64),
    start=st.integers(0, 4),
)
def test_never_breaks_a_budget_and_never_measured_slower(
    rates: list[float], production: float, step: float, max_workers: int, max_in_flight: int, start: int
) -> None:
    budget = HostBudget(max_workers, "cores", max_in_flight=max_in_flight, memory_bound="host_memory")
    original = LoaderSettings(start, 1 if start else None)
    planner = Planner(original, budget, FAST, epoch_steps=1000)
    proposal = planner.record(window(rates[0], step, production))
    measured = {original: rates[0]}
    # The truth each window was made from (a window's loop cannot outrun its step), apart from the planner's view.
    fed: dict[LoaderSettings, list[float]] = {original: [min(rates[0], 1 / step)]}
    jumps = 0
    for rate in rates[1:]:
        if proposal is None:
            break
        # Memory is a wall: never probed past. Cores are a prediction: one worker at a time past it, and
        # only after the most workers measured so far paid; once per search, a jump past a slower count.
        assert budget.breaks_wall(proposal) is None
        new_count = all(s.num_workers != proposal.num_workers for s in measured)
        if budget.allows(proposal) is not None and new_count:  # a deeper buffer or pinning adds no worker
            fewer = {s: r for s, r in measured.items() if s.num_workers < proposal.num_workers}
            if fewer and max(s.num_workers for s in fewer) != proposal.num_workers - 1:
                between = planner.current_note == "between the best and a slower one"
                if between or "slower, and the jump to" in planner.current_note:
                    # Both ends measured: a count between them, never outside.
                    assert any(s.num_workers > proposal.num_workers for s in measured)
                else:
                    jumps += 1
                    assert jumps == 1 and "may win the cores' share" in planner.current_note
                    assert proposal.num_workers <= JUMP_CORES * (max_workers + 1)
        measured[proposal] = rate
        fed.setdefault(proposal, []).append(min(rate, 1 / step))
        proposal = planner.record(window(rate, step, production * max(1, proposal.num_workers)))
    decision = planner.decide()
    assert decision.probe_steps <= decision.probe_budget_steps
    # Never worse, judged on the rates the windows were made from: a setting kept is one fed faster than the
    # original, by at least min_gain.
    if decision.setting != original:
        fed_mean = {setting: statistics.fmean(values) for setting, values in fed.items()}
        assert fed_mean[decision.setting] >= fed_mean[original] * (1 + FAST.min_gain), (fed, decision.table())


def test_iterable_datasets_only_get_a_deeper_buffer_from_the_model() -> None:
    bursty = snapshot(6, 0.01, production_s=(0.002,) * 7 + (0.07,), made=6)
    decision = model_only_decision(LoaderSettings(2, 2), HostBudget(8, "cores"), FAST, bursty, "iterable")
    assert decision.num_workers == 2 and decision.prefetch_factor > 2 and decision.verdict == "model_only"
    assert decision.throughput_after is None
    tight = HostBudget(8, "cores", max_in_flight=6, memory_bound="shm")
    bounded = model_only_decision(LoaderSettings(2, 2), tight, FAST, bursty, "iterable")
    assert bounded.prefetch_factor == 3 and bounded.bounded_by == "shm"


def test_decision_round_trips_through_plain_data() -> None:
    planner = Planner(LoaderSettings(0), HostBudget(3, "cores"), FAST, epoch_steps=400)
    planner.record(window(20.0, 0.010, 0.05))
    planner.record(window(60.0, 0.010, 0.05))
    decision = planner.decide(startup_s=1.0)
    back = TuneDecision.from_dict(decision.to_dict())
    assert back == decision
    assert "workers=3 prefetch=2 *" in decision.table() and "probe cost" in decision.table()
    assert back.persistent_workers  # 1 s to start workers is far more than 2 % of a 7 s epoch
    assert math.isclose(back.speedup or 0, 3.0)


def test_bursts_ask_for_more_workers_than_the_mean_does() -> None:
    burst = (0.002,) * 7 + (0.2,)  # mean 26.75 ms: Little's law asks for 4 workers at 100 steps/s
    planner = Planner(LoaderSettings(0), HostBudget(12, "cores"), FAST, epoch_steps=400)
    m = snapshot(6, 0.01, mean_wait_s=0.04, production_s=burst, made=6)
    proposal = planner.record(m)
    assert proposal is not None and proposal.num_workers > 4
    assert "bursts" in planner.current_note


# -- cores: a prediction to verify; memory and the user's cap: walls ----------------------------------


def _search(planner: Planner, measure: dict[int, tuple[float, float]], production_s: float) -> list[int]:
    """Drive the planner with known (steps/s, step time) per worker count; the counts it probed, in order."""
    probed = [planner.original.num_workers]
    rate, step = measure[planner.original.num_workers]
    proposal = planner.record(window(rate, step, production_s))
    while proposal is not None:
        probed.append(proposal.num_workers)
        rate, step = measure[proposal.num_workers]
        proposal = planner.record(window(rate, step, production_s))
    return probed


def test_a_second_worker_past_the_predicted_core_limit_is_measured_and_kept_when_it_pays() -> None:
    # 16 ms of CPU per batch in the workers, a 10 ms step that waits like an accelerator, 2 cores: the
    # model predicts room for 1 worker beside the loop; 2 workers measured 1.3x of 1, 3 no faster than 2.
    measure = {0: (38.0, 0.010), 1: (60.0, 0.010), 2: (80.0, 0.010), 3: (79.0, 0.010)}
    planner = Planner(LoaderSettings(0), HostBudget(1, "cores"), FAST, epoch_steps=600)
    probed = _search(planner, measure, 0.016)
    assert probed[:4] == [0, 1, 2, 3]  # the steady 16 ms batches explain no wait: no deeper buffer first
    decision = planner.decide()
    assert decision.num_workers == 2 and decision.bounded_by == "cores"
    assert "3 workers measured 79 steps/s against 80" in decision.reason


def test_past_the_core_limit_a_worker_that_slows_the_step_must_pay_more_than_the_windows_noise() -> None:
    # The step computes on the CPU: the second worker raised throughput 8 % but took the step's core. Windows
    # whose 4-step blocks swing by 20 % cannot tell 8 % from noise, measured three times alike.
    steady = 0.016
    windows = {
        0: [_blocky(38.0, 0.02, 0.010, steady)],
        1: [_blocky(60.0, 0.02, 0.010, steady)],
        2: [_blocky(65.0, 0.2, 0.013, steady)],
    }
    planner = Planner(LoaderSettings(0), HostBudget(1, "cores"), NOISY, epoch_steps=1000)
    probed = _noisy_search(planner, windows)
    assert probed.count(2) == 3, probed  # measured again, and a third time: never a fourth
    decision = planner.decide()
    assert decision.num_workers == 1 and decision.bounded_by == "cores"
    assert "2 workers slowed the step itself to 13 ms" in decision.reason


def test_past_the_core_limit_a_gain_the_windows_tell_from_noise_pays_though_the_step_slowed() -> None:
    measure = {0: (38.0, 0.010), 1: (60.0, 0.010), 2: (65.0, 0.013), 3: (64.0, 0.014)}
    planner = Planner(LoaderSettings(0), HostBudget(1, "cores"), FAST, epoch_steps=600)
    assert _search(planner, measure, 0.016)[:3] == [0, 1, 2]
    assert planner.decide().num_workers == 2


def test_where_one_more_worker_is_slower_a_jump_finds_the_workers_that_win_the_cores() -> None:
    # A torch-threaded step (2.4 ms) on 2 cores and 16.6 ms of CPU per batch: 1 worker beside the step's
    # threads measured slower than loading in-process, 4 won enough of the cores to beat both (as measured by
    # benchmarks/tune_pipelines.py's cpu_transforms_torch_step: 55, 41 and 80 steps/s).
    measure = {0: (55.0, 0.0024), 1: (41.0, 0.0024), 4: (80.0, 0.0035), 2: (72.0, 0.003), 5: (78.0, 0.0036)}
    planner = Planner(LoaderSettings(0), HostBudget(1, "cores"), FAST, epoch_steps=600)
    probed = _search(planner, measure, 0.0166)
    assert probed[:4] == [0, 1, 4, 2]  # and the count the jump passed over
    decision = planner.decide()
    assert decision.num_workers == 4 and decision.verdict == "improved"


def test_the_count_a_jump_passed_over_is_measured_and_kept_where_it_is_faster() -> None:
    # cpu_transforms_torch_step with the rates steady_rate measured side by side (sustained: held to the batches
    # the workers finished): in-process 56, 1 worker 48, 2 workers 78, 4 workers 73 steps/s.
    measure = {0: (56.0, 0.0017), 1: (48.0, 0.0030), 4: (73.0, 0.0035), 2: (78.0, 0.0032), 3: (71.0, 0.0034)}
    planner = Planner(LoaderSettings(0), HostBudget(1, "cores"), FAST, epoch_steps=600)
    probed = _search(planner, measure, 0.0166)
    assert probed[:4] == [0, 1, 4, 2]
    assert planner.results[3].note == "between 1 worker, slower, and the jump to 4: measured"
    assert 5 not in probed  # 4 measured slower than 2: no more past it
    assert planner.decide().num_workers == 2


def test_a_jump_that_does_not_pay_keeps_the_best_measured() -> None:
    measure = {0: (55.0, 0.0024), 1: (41.0, 0.0024), 4: (50.0, 0.0035), 2: (45.0, 0.003)}
    planner = Planner(LoaderSettings(0), HostBudget(1, "cores"), FAST, epoch_steps=600)
    probed = _search(planner, measure, 0.0166)
    assert probed[:3] == [0, 1, 4] and probed.count(4) == 1
    assert planner.decide().num_workers == 0


def _blocky(rate: float, spread: float, step_s: float, production_s: float, steps: int = 24) -> WindowSnapshot:
    """A window at ``rate`` steps/s on average whose blocks of 4 steps run alternately ``spread`` faster and
    slower (a host whose cores the step's threads and the workers share)."""
    periods = []
    for block in range(steps // 4):
        block_rate = rate * (1 + spread if block % 2 == 0 else 1 - spread)
        periods += [1.0 / block_rate] * 4
    scale = steps / rate / math.fsum(periods)  # the blocks' harmonic mean is not ``rate``: rescaled to it
    return WindowSnapshot(
        wait_s=tuple(max(0.0, p * scale - step_s) for p in periods),
        step_s=(step_s,) * steps,
        production_s=(production_s,) * 8,
        batches_made=steps,
    )


NOISY = TuneOptions(warmup_steps=4, window_steps=24)


def _per_count(spec: dict[int, list[tuple[float, float, float]]]) -> dict[int, list[WindowSnapshot]]:
    """Windows per worker count, each from (steps/s, spread of its 4-step blocks, step seconds), 16.6 ms
    batches (cpu_transforms_torch_step's)."""
    return {w: [_blocky(rate, spread, step, 0.0166) for rate, spread, step in runs] for w, runs in spec.items()}


def _noisy_search(planner: Planner, windows: dict[int, list[WindowSnapshot]]) -> list[int]:
    """Drive the planner with each worker count's windows in turn (the last one again once they run out)."""

    def next_window(workers: int) -> WindowSnapshot:
        queue = windows[workers]
        return queue.pop(0) if len(queue) > 1 else queue[0]

    probed = [planner.original.num_workers]
    proposal = planner.record(next_window(planner.original.num_workers))
    while proposal is not None:
        probed.append(proposal.num_workers)
        proposal = planner.record(next_window(proposal.num_workers))
    return probed


def _search_past_a_jump(
    four: list[tuple[float, float, float]], more: dict[int, tuple[float, float, float]]
) -> tuple[Planner, list[int]]:
    """The cpu_transforms_torch_step search (in-process 55 steps/s, 1 worker 41, 16.6 ms per batch) on one
    predicted core, with 4 workers' windows and one window for each further count as given (rate, spread of
    the blocks, step time)."""
    steady = 0.0166
    windows = {0: [_blocky(55.0, 0.02, 0.0024, steady)], 1: [_blocky(41.0, 0.02, 0.0024, steady)]}
    windows[4] = [_blocky(*w, steady) for w in four]
    windows.update({workers: [_blocky(*w, steady)] for workers, w in more.items()})
    planner = Planner(LoaderSettings(0), HostBudget(1, "cores"), NOISY, epoch_steps=1000)
    return planner, _noisy_search(planner, windows)


def test_a_jump_read_low_within_its_windows_noise_is_measured_again_at_once() -> None:
    # The cpu_transforms_torch_step case: 4 workers beside the step's torch threads read 50 steps/s in one
    # window whose 4-step blocks swing by 20 %, against 55 for loading in-process; measured again, 70.
    planner, probed = _search_past_a_jump(
        four=[(50.0, 0.2, 0.0024), (70.0, 0.2, 0.0024)], more={5: (60.0, 0.2, 0.0030), 2: (45.0, 0.02, 0.0024)}
    )
    assert probed[:4] == [0, 1, 4, 4]
    assert "below the best, within the windows' noise" in planner.results[3].note
    # 70 is 40 % above 50, beyond the two windows' noise (25 %): the first window, right after the restart,
    # had not settled, and the setting is judged on the second (in the steady state 4 workers ran at 73).
    assert "still settling after the restart, set aside" in planner.results[3].note
    assert planner.measurements[LoaderSettings(4, 1)].sustained_rate == pytest.approx(70.0)
    decision = planner.decide()
    assert decision.num_workers == 4 and decision.verdict == "improved", decision.table()


@pytest.mark.parametrize(("third", "kept"), [(62.0, 0), (75.0, 4)])
def test_a_best_twice_within_the_windows_noise_of_yours_gets_a_third_window(third: float, kept: int) -> None:
    # 4 workers read 54 then 63 (blocks swinging by 20 %, the two within their noise of each other): 6 %
    # above in-process, within the noise. Once the search is over, a steady third window decides: at 62 the
    # three still cannot tell, at 75 they can.
    windows = _per_count(
        {
            0: [(55.0, 0.02, 0.0024)],
            1: [(41.0, 0.02, 0.0024)],
            4: [(54.0, 0.2, 0.0024), (63.0, 0.2, 0.0024), (third, 0.02, 0.0024)],
            5: [(40.0, 0.02, 0.0030)],
            2: [(45.0, 0.02, 0.0024)],
        }
    )
    planner = Planner(LoaderSettings(0), HostBudget(1, "cores"), NOISY, epoch_steps=1000)
    # Where 4 workers would replace in-process loading, in-process is measured again, last.
    assert _noisy_search(planner, windows) == [0, 1, 4, 4, 2, 5, 4] + ([0] if kept else [])
    third_window = [r for r in planner.results if r.setting == LoaderSettings(4, 1)][-1]
    assert third_window.note.startswith("measured a third time: 6% above your settings")
    assert planner.decide().num_workers == kept, planner.decide().table()


@pytest.mark.parametrize(("again", "kept"), [(56.0, 0), (48.0, 4)])
def test_the_users_settings_measured_again_last_are_judged_on_their_faster_window(again: float, kept: int) -> None:
    # jpeg_cnn as the tuner saw it in one run: in-process 50.8 steps/s in the run's first window, 4 workers
    # 55 and 58 later. The run's windows drift upward (the same setting read 53 first and 56 last), and in the
    # steady state 4 workers ran 13 % below in-process. Measured again after the candidates, in-process reads
    # 56: no candidate beats it. Where it reads lower again, the first window stands and 4 workers are kept.
    windows = _per_count(
        {
            0: [(50.8, 0.02, 0.0024), (again, 0.02, 0.0024)],
            1: [(40.7, 0.02, 0.0024)],
            4: [(55.3, 0.02, 0.0024), (58.3, 0.02, 0.0024)],
            5: [(40.0, 0.02, 0.0030)],
            2: [(45.0, 0.02, 0.0024)],
        }
    )
    planner = Planner(LoaderSettings(0), HostBudget(1, "cores"), NOISY, epoch_steps=1000)
    probed = _noisy_search(planner, windows)
    assert 4 in probed and probed[-1] == 0 and probed.count(0) == 2, probed
    decision = planner.decide()
    assert decision.num_workers == kept, decision.table()
    assert decision.throughput_before == pytest.approx(max(50.8, again), rel=0.01)
    assert decision.probe_steps == sum(c.steps for c in decision.candidates if c.setting != LoaderSettings(0))


@pytest.mark.parametrize(("second", "kept"), [(56.0, 4), (75.0, 1)])
def test_the_users_settings_with_workers_get_a_second_window_once_measured_again(second: float, kept: int) -> None:
    # The user's 1 worker read 50 steps/s at the epoch's start and 50 again after the candidates (4 workers: 60),
    # each right after its workers started. A second window while they run reads ``second``, beyond the two
    # windows' noise of the first either way (their blocks are steady), which is set aside: at 56 the candidate
    # still wins by 7 %, at 75 the user's settings are kept.
    windows = {
        1: [_blocky(r, s, 0.005, 0.016) for r, s in [(50.0, 0.05), (50.0, 0.05), (second, 0.02)]],
        **{w: [_blocky(60.0, 0.02, 0.005, 0.016)] for w in range(2, 9)},
    }
    planner = Planner(LoaderSettings(1, 2), HostBudget(4, "cores"), NOISY, epoch_steps=1000)
    assert _noisy_search(planner, windows) == [1, 4, 5, 5, 1, 1]
    assert "a second window while they run" in planner.results[-1].note
    decision = planner.decide()
    assert decision.num_workers == kept and decision.throughput_before == pytest.approx(second), decision.table()


def _windows_at(rates: dict[int, float], spreads: dict[int, float], others: float) -> dict[int, list[WindowSnapshot]]:
    """A window per worker count 0 to 8 (16 ms batches, a 5 ms step): ``rates`` and ``spreads`` where given,
    ``others`` steps/s with blocks 3 % apart elsewhere."""
    return {
        w: [_blocky(rates.get(w, others), spreads.get(w, 0.03), 0.005, 0.016)] for w in range(9)
    }


def test_a_gain_within_the_windows_noise_keeps_the_users_settings_and_one_beyond_it_does_not() -> None:
    # 2 workers 10 % above in-process: in windows whose 4-step blocks swing by 30 % that is noise, in steady
    # windows a gain.
    for spread, expected in ((0.3, 0), (0.02, 2)):
        planner = Planner(LoaderSettings(0), HostBudget(4, "cores"), NOISY, epoch_steps=1000)
        _noisy_search(planner, _windows_at({0: 100.0, 2: 110.0}, {2: spread}, others=90.0))
        assert LoaderSettings(2, 2) in planner.measurements
        assert planner.decide().num_workers == expected, planner.decide().table()


def test_of_settings_the_windows_cannot_tell_apart_the_fewest_batches_in_flight_are_kept() -> None:
    # io_bound as the tuner measured it: 4, 5 and 6 workers at 168 to 169 steps/s, against a steady state where
    # each worker past 3 costs about 1 % (benchmarks/tune_pipelines.py, side by side: 163.5, 161.0, 158.5).
    planner = Planner(LoaderSettings(0), HostBudget(6, "cores"), NOISY, epoch_steps=1000)
    _noisy_search(planner, _windows_at({0: 47.0, 4: 167.9, 5: 168.4, 6: 169.2}, {}, others=160.0))
    decision = planner.decide()
    assert {4, 6} <= {r.setting.num_workers for r in planner.results}, decision.table()
    assert decision.num_workers == 4 and decision.verdict == "improved", decision.table()
    assert "workers=6 prefetch=2 measured 1% faster, within the windows' noise" in decision.reason
    assert "with more batches in flight" in decision.reason


def test_a_setting_the_fastest_beat_by_min_gain_is_never_kept_for_its_fewer_batches_however_noisy() -> None:
    # bursty as the tuner measured it: bursts swing the windows' 4-step blocks, so 5 workers 18 % above 4 are
    # within the windows' noise. The measured difference is still the best estimate of what the cheaper one
    # loses (in the steady state it lost 25 %): the fastest is kept where it beat the cheaper by min_gain.
    planner = Planner(LoaderSettings(0), HostBudget(6, "cores"), NOISY, epoch_steps=1000)
    _noisy_search(planner, _windows_at({0: 64.6, 4: 92.7, 5: 109.6}, {4: 0.3, 5: 0.3}, others=90.0))
    decision = planner.decide()
    assert {4, 5} <= {r.setting.num_workers for r in planner.results}, decision.table()
    assert decision.num_workers == 5 and "with more batches in flight" not in decision.reason, decision.table()


def test_a_window_slower_by_more_than_its_noise_is_not_measured_again() -> None:
    steady = 0.0166
    windows = {
        0: [_blocky(55.0, 0.02, 0.0024, steady)],
        1: [_blocky(41.0, 0.02, 0.0024, steady)],
        4: [_blocky(40.0, 0.02, 0.0024, steady)],
        2: [_blocky(45.0, 0.02, 0.0024, steady)],
    }
    planner = Planner(LoaderSettings(0), HostBudget(1, "cores"), NOISY, epoch_steps=1000)
    probed = _noisy_search(planner, windows)
    assert probed[:3] == [0, 1, 4] and probed.count(4) == 1
    assert planner.decide().num_workers == 0


def test_no_worker_past_the_limit_when_the_last_one_did_not_pay() -> None:
    measure = {1: (60.0, 0.010), 2: (61.0, 0.010)}
    planner = Planner(LoaderSettings(1, 2), HostBudget(2, "cores"), FAST, epoch_steps=600)
    assert _search(planner, measure, 0.030) == [1, 2, 2]  # within noise of yours: measured again, alike
    assert planner.decide().num_workers == 1


def test_a_setting_its_first_window_could_not_tell_from_the_best_is_measured_again_once() -> None:
    # cpu_transforms_torch_step as the tuner saw it in one run: 4 workers' first window (started cold beside
    # the step's threads) 53 steps/s against 52 in-process, short of the margin a setting past the core
    # limit must pay; the same 4 workers, warm, ran at 67 steps/s in the steady state. Measured again at once,
    # the warm window joins the cold one (together 14 % over in-process, past the doubled margin); it pays.
    planner = Planner(LoaderSettings(0), HostBudget(1, "cores"), FAST, epoch_steps=600)
    assert planner.record(window(52.0, 0.0026, 0.0164)) == LoaderSettings(1, 2)
    assert planner.record(window(41.0, 0.0113, 0.0196)) == LoaderSettings(4, 1)
    planner.record(window(53.0, 0.0137, 0.031))
    # A setting that read faster and did not pay is measured again, but a jump's count passed over comes first.
    assert planner.current == LoaderSettings(2, 1), planner.current_note
    assert planner.record(window(45.0, 0.0130, 0.031)) == LoaderSettings(4, 1)
    assert planner.current_note.startswith("measured again")
    proposal = planner.record(window(67.0, 0.0120, 0.031))
    while proposal is not None:
        assert proposal != LoaderSettings(4, 1)
        proposal = planner.record(window(50.0, 0.0130, 0.031))
    decision = planner.decide()
    assert decision.num_workers == 4 and decision.verdict == "improved", decision.table()
    assert [c.setting.num_workers for c in decision.candidates[:5]] == [0, 1, 4, 2, 4]
    assert decision.probe_steps == sum(c.steps for c in decision.candidates if c.setting != LoaderSettings(0))


def test_a_jump_that_read_faster_without_paying_has_the_count_it_passed_over_measured_first() -> None:
    # cpu_transforms_torch_step in one run: 1 worker read below in-process (55) twice, 4 workers 59 then 68,
    # 8 % above in-process over the two, in windows too noisy to pay; the probe budget was then spent, and
    # in-process was kept at 0.74 of the grid's best (2 workers, 80 steps/s in the steady state).
    windows = _per_count(
        {
            0: [(54.6, 0.02, 0.0019)],
            1: [(48.8, 0.3, 0.0075), (45.4, 0.3, 0.0075)],
            4: [(59.2, 0.25, 0.0050), (68.0, 0.25, 0.0050)],
            2: [(72.0, 0.05, 0.0030)],
            3: [(70.0, 0.05, 0.0040)],
        }
    )
    planner = Planner(LoaderSettings(0), HostBudget(1, "cores"), NOISY, epoch_steps=600)
    probed = _noisy_search(planner, windows)
    assert probed[:5] == [0, 1, 1, 4, 2], probed
    assert planner.results[4].note == "between 1 worker, slower, and the jump to 4: measured"
    decision = planner.decide()
    assert decision.num_workers == 2 and decision.verdict == "improved", decision.table()


def test_a_jump_whose_two_windows_read_faster_without_paying_has_the_count_it_passed_over_measured() -> None:
    # 4 workers' first window read below in-process within its noise, the second above: together 1 % faster,
    # with a step slowed past the margin, unpaid. The count the jump passed over is measured (2 workers,
    # 64 steps/s, kept), not left behind because the jump's first window read slow.
    planner, probed = _search_past_a_jump(
        four=[(50.0, 0.25, 0.0040), (62.0, 0.25, 0.0040)], more={3: (58.0, 0.2, 0.0035), 2: (64.0, 0.02, 0.0026)}
    )
    assert probed[:5] == [0, 1, 4, 4, 2], probed
    assert planner.results[4].note == "between 1 worker, slower, and the jump to 4: measured"
    assert planner.decide().setting == LoaderSettings(2, 1), planner.decide().table()


@pytest.mark.parametrize(("two", "kept"), [(68.0, 2), (45.0, 0)])
def test_a_jump_measured_twice_has_the_count_it_passed_over_measured_before_a_third_window(
    two: float, kept: int
) -> None:
    # cpu_transforms_torch_step in one run: in-process 52 steps/s, 1 worker 37 (the step slowed to 8 ms), 4
    # workers 49 then 64 (blocks so uneven that the two could not be told apart), 6 % above in-process together;
    # a third window of 4 workers read 54, the probe budget was spent, and in-process was kept at 0.79 of the
    # grid's best (2 workers, 68 steps/s). The count the jump passed over is measured instead of that window.
    windows = _per_count(
        {
            0: [(52.3, 0.02, 0.0025)],
            1: [(37.4, 0.1, 0.0081)],
            4: [(48.6, 0.45, 0.0040), (64.5, 0.25, 0.0040), (53.6, 0.1, 0.0040)],
            2: [(two, 0.05, 0.0030)],
        }
    )
    planner = Planner(LoaderSettings(0), HostBudget(1, "cores"), NOISY, epoch_steps=600)
    probed = _noisy_search(planner, windows)
    assert probed[:5] == [0, 1, 4, 4, 2], planner.decide().table()
    assert "set aside" not in planner.results[3].note  # the case the settling rule does not cover
    assert planner.results[4].note == "between 1 worker, slower, and the jump to 4: measured"
    decision = planner.decide()
    assert decision.num_workers == kept, decision.table()
    assert decision.probe_steps <= decision.probe_budget_steps == 120


@pytest.mark.parametrize(
    "budget",
    [
        HostBudget(1, "cores", max_in_flight=1, memory_bound="shm"),  # 2 workers hold 2 batches at least
        HostBudget(1, "cores", user_max_workers=1),
        HostBudget(1, "max_workers"),
    ],
)
def test_memory_and_the_users_cap_are_walls_even_when_more_workers_would_pay(budget: HostBudget) -> None:
    measure = {0: (38.0, 0.010), 1: (60.0, 0.010), 2: (80.0, 0.010)}
    planner = Planner(LoaderSettings(0), budget, FAST, epoch_steps=600)
    probed = _search(planner, measure, 0.016)
    assert max(probed) == 1


def test_the_probe_cost_line_adds_up_with_the_table() -> None:
    measure = {0: (38.0, 0.010), 1: (60.0, 0.010), 2: (80.0, 0.010), 3: (79.0, 0.010)}
    planner = Planner(LoaderSettings(0), HostBudget(1, "cores"), FAST, epoch_steps=600)
    _search(planner, measure, 0.016)
    decision = planner.decide()
    probed_rows = [c for c in decision.candidates if c.setting != LoaderSettings(0)]
    assert decision.probe_steps == sum(c.steps for c in probed_rows)
    # The user's settings, measured first and again after the candidates, cost no probe steps.
    assert [c.setting for c in decision.candidates].count(LoaderSettings(0)) == 2
    assert (
        f"probe cost: {decision.probe_steps} steps in the {len(probed_rows)} probed rows (your settings' rows are free)"
        in decision.table()
    )


# What 0.1.0 wrote into a checkpoint (``LoadGuard.state_dict()["tuner"]``), verbatim.
_STATE_0_1_0 = {
    "version": 1,
    "decision": {
        "num_workers": 3, "prefetch_factor": 2, "persistent_workers": True, "pin_memory": False,
        "throughput_before": 20.0, "throughput_after": 60.0, "bounded_by": "cores", "verdict": "improved",
        "remaining_deficit": 0.4, "reason": "3.00x",
        "original": {"num_workers": 0, "prefetch_factor": None, "pin_memory": False, "persistent_workers": False},
        "candidates": (
            {"setting": {"num_workers": 0, "prefetch_factor": None, "pin_memory": False, "persistent_workers": False},
             "rate": 20.0, "producer_rate": 20.0, "steps": 8, "failed": None, "note": "your settings"},
            {"setting": {"num_workers": 3, "prefetch_factor": 2, "pin_memory": False, "persistent_workers": False},
             "rate": 60.0, "producer_rate": 60.0, "steps": 8, "failed": None, "note": "Little"},
        ),
        "probe_steps": 8, "probe_budget_steps": 80, "probe_cost_s": 0.1,
    },
}  # fmt: skip


def test_a_decision_saved_by_0_1_0_loads_and_saves_the_same() -> None:
    decision = TuneDecision.from_dict(_STATE_0_1_0["decision"])
    assert decision.setting == LoaderSettings(3, 2, persistent_workers=True)
    assert decision.original == LoaderSettings(0) and decision.candidates[1].setting == LoaderSettings(3, 2)
    assert decision.to_dict() == _STATE_0_1_0["decision"]


@pytest.mark.parametrize(("max_epochs", "span"), [(None, 5), (4, 2), (1, 1), (200, 5)])
def test_a_short_epoch_spans_the_fewest_epochs_that_hold_the_probes(max_epochs: int | None, span: int) -> None:
    # 40-step epochs, windows of 12 steps: one epoch's 20 % (8 steps) holds none, two (16) one, five (40) three.
    def make(epochs: int) -> Planner:
        return Planner(LoaderSettings(0), HostBudget(8, "cores"), TuneOptions(), epoch_steps=40, span_epochs=epochs)

    planner = _spanning_planner(make, _span_choices(max_epochs))
    assert planner.window == 12 and planner.span_epochs == span
    assert planner.can_start() == (span > 1)
    assert planner.budget_steps == int(0.2 * 40 * span)


def test_a_long_epoch_is_probed_within_epoch_0() -> None:
    def make(epochs: int) -> Planner:
        return Planner(LoaderSettings(0), HostBudget(8, "cores"), TuneOptions(), epoch_steps=300, span_epochs=epochs)

    assert _spanning_planner(make, _span_choices(None)).span_epochs == 1


def test_between_a_best_and_a_slower_jump_the_core_prediction_does_not_cap_the_count() -> None:
    # The jump to 4 measured slower than loading in-process, 1 slower still: 2, between them, is measured.
    measure = {0: (45.0, 0.0024), 1: (33.0, 0.0024), 4: (38.0, 0.0025), 2: (50.0, 0.0024), 3: (44.0, 0.0024)}
    planner = Planner(LoaderSettings(0), HostBudget(1, "cores"), FAST, epoch_steps=600)
    probed = _search(planner, measure, 0.0165)
    assert probed[:4] == [0, 1, 4, 2]
    assert planner.decide().num_workers == 2


def _jump_windows(*four: float) -> dict[int, list[WindowSnapshot]]:
    """cpu_transforms_torch_step as one run of benchmarks/tune_pipelines.py saw it: in-process 49 steps/s, 1
    worker 41, 4 workers (the step's own time grown from 2.4 to 3.5 ms) at the rates ``four`` in their windows,
    blocks swinging by 20 %."""
    steady = 0.0166
    return {
        0: [_blocky(49.0, 0.02, 0.0024, steady)],
        1: [_blocky(41.0, 0.02, 0.0024, steady)],
        4: [_blocky(r, 0.2, 0.0035, steady) for r in four],
        5: [_blocky(50.0, 0.2, 0.0040, steady)],
        2: [_blocky(45.0, 0.02, 0.0024, steady)],
    }


def test_a_gain_between_the_margins_after_two_windows_gets_a_third() -> None:
    # Two windows, 48 and 56 steps/s (within their noise of each other), together 5.5 % over in-process: past
    # min_gain (5 %) but short of the windows' noise a step that slowed must pay. A third decides; at 62 (within
    # the noise of the two before it, so joined to them) it carries the three to 12 %.
    planner = Planner(LoaderSettings(0), HostBudget(1, "cores"), NOISY, epoch_steps=1000)
    probed = _noisy_search(planner, _jump_windows(48.0, 56.0, 62.0))
    # The two windows read 4 workers faster than in-process: 2, which the jump passed over, is measured first.
    assert probed[:6] == [0, 1, 4, 4, 2, 4]
    assert "measured a third time" in planner.results[5].note
    decision = planner.decide()
    assert decision.num_workers == 4, decision.table()
    assert decision.throughput_after == pytest.approx(72 / (24 / 48 + 24 / 56 + 24 / 62), rel=1e-6)


def test_a_third_window_that_reads_low_again_keeps_the_margin() -> None:
    planner = Planner(LoaderSettings(0), HostBudget(1, "cores"), NOISY, epoch_steps=1000)
    probed = _noisy_search(planner, _jump_windows(48.0, 56.0, 47.0))
    assert probed == [0, 1, 4, 4, 2, 4]
    assert planner.decide().num_workers == 0


@pytest.mark.parametrize(("first", "second", "judged"), [(47.0, 62.0, 62.0), (48.0, 36.0, 2 / (1 / 48 + 1 / 36))])
def test_a_window_faster_beyond_the_noise_sets_aside_the_settling_ones_before_it(
    first: float, second: float, judged: float
) -> None:
    # The run _jump_windows records: 4 workers read 47 steps/s right after their restart and 62 in the next
    # window, 32 % faster where the two windows' noise is 25 %. A loader settles after its workers start; the
    # first window had not, and the setting is judged on the second (in the steady state it ran at 73, against
    # 55 in-process). A restart only ever slows the loop: a second window slower by as much is joined.
    planner = Planner(LoaderSettings(0), HostBudget(1, "cores"), NOISY, epoch_steps=1000)
    probed = _noisy_search(planner, _jump_windows(first, second))
    assert probed[:4] == [0, 1, 4, 4]
    assert planner.measurements[LoaderSettings(4, 1)].sustained_rate == pytest.approx(judged)
    assert ("set aside" in planner.results[3].note) == (second > first)
    assert planner.decide().num_workers == (4 if second > first else 0), planner.decide().table()


def test_a_setting_that_could_not_beat_yours_at_the_top_of_its_noise_is_not_measured_again() -> None:
    # cpu_transforms_torch_step: 1 worker beside the step's threads read 20 % below in-process, in a window
    # whose blocks swing by 30 %. Within that noise of the best, but even at its top not 5 % above in-process:
    # a second window could not make it the one kept, so the budget goes to the jump instead.
    windows = _per_count(
        {
            0: [(55.0, 0.02, 0.0017)],
            1: [(44.0, 0.3, 0.0030)],
            4: [(73.0, 0.02, 0.0035)],
            2: [(78.0, 0.02, 0.0032)],
            3: [(71.0, 0.02, 0.0034)],
        }
    )
    planner = Planner(LoaderSettings(0), HostBudget(1, "cores"), NOISY, epoch_steps=1000)
    assert _noisy_search(planner, windows)[:4] == [0, 1, 4, 2]
    assert planner.decide().num_workers == 2, planner.decide().table()


def test_a_window_that_failed_to_measure_on_one_rank_is_broken_on_every_rank() -> None:
    ranks = WindowRanks(steps=6, production=12)
    good, lost = ranks.row(window(50.0, 0.010, 0.02), failed=False), ranks.row(None, failed=False)
    assert len(good) == len(lost)  # every rank still meets the others in the gather, with a row of one length
    assert ranks.broken([good, lost]) and ranks.broken([lost, good]) and not ranks.broken([good, good])
