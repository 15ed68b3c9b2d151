"""The tuner's core without a Trainer: options, budgets, windows, the plan and the decision."""

from __future__ import annotations

import math
import operator
from collections.abc import Callable
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lightning_loadguard.meters.ranks import WindowRanks
from lightning_loadguard.meters.settings import LoaderSettings
from lightning_loadguard.meters.window import HostFacts, WindowSnapshot, cpu_share
from lightning_loadguard.model.budget import HostBudget, host_budget
from lightning_loadguard.model.capacity import recommend_prefetch, replayed_wait
from lightning_loadguard.model.tail import Tail
from lightning_loadguard.tuning.arms import Arm, beats, gain
from lightning_loadguard.tuning.decision import TuneDecision
from lightning_loadguard.tuning.depth import model_only_decision, tail_widened
from lightning_loadguard.tuning.options import TuneOptions
from lightning_loadguard.tuning.persistence import WorkerStarts
from lightning_loadguard.tuning.planner import Planner
from lightning_loadguard.tuning.reach import span_choices, spanning_planner
from lightning_loadguard.tuning.watch import CoresUse

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
        ("retune", "yes", "True or False"),
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


def test_a_drawn_down_window_reads_the_workers_capacity_not_where_their_rounds_fell() -> None:
    # 8 workers at 0.4 s a batch make 20 a second, below the loop's 25: two windows of the same steady state that
    # caught 3 and 7 finished batches (where the workers' synchronized rounds fell) read the same 20.
    def window(made: int) -> WindowSnapshot:
        return replace(snapshot(10, 0.04, production_s=(0.4,) * made, made=made), settings=LoaderSettings(8))

    assert window(3).sustained_rate == pytest.approx(20.0)
    assert window(7).sustained_rate == pytest.approx(20.0)
    # Workers faster than the loop: the loop's own rate, as when the window made a batch per step.
    fast = replace(window(7), production_s=(0.1,) * 7)
    assert fast.sustained_rate == pytest.approx(25.0) == window(10).sustained_rate


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


# -- the plan: the procedure's parts (the whole is judged on simulated pipelines: test_tuning_sweep.py) ------


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


def test_an_arms_noise_is_read_from_its_blocks_and_a_window_without_blocks_is_not_trusted() -> None:
    steady = Arm(LoaderSettings(2), _blocky(50.0, 0.0, 0.01, 0.02), 1)
    swinging = Arm(LoaderSettings(3), _blocky(50.0, 0.2, 0.01, 0.02), 1)
    assert steady.error == pytest.approx(0.0, abs=1e-12) and 0.05 < swinging.error < 0.15
    assert Arm(LoaderSettings(), snapshot(1, 0.01), 1).error == math.inf  # a single step: no spread to read


def test_one_comparison_min_gain_and_the_noise() -> None:
    base = Arm(LoaderSettings(), _blocky(50.0, 0.0, 0.01, 0.02), 1)
    assert beats(Arm(LoaderSettings(2), _blocky(55.0, 0.0, 0.01, 0.02), 1), base, 0.05)
    assert not beats(Arm(LoaderSettings(2), _blocky(52.0, 0.0, 0.01, 0.02), 1), base, 0.05)  # under min_gain
    assert not beats(Arm(LoaderSettings(2), _blocky(55.0, 0.3, 0.01, 0.02), 1), base, 0.05)  # within the noise


def test_a_window_with_no_rate_divides_nothing_and_is_never_beaten() -> None:
    # A window in which no batch was made has a sustained rate of 0: every gain over it would be infinite.
    empty = Arm(LoaderSettings(), replace(snapshot(8, 0.01, mean_wait_s=0.01), batches_made=0), 1)
    assert empty.rate == 0.0 and empty.error == math.inf
    assert gain(Arm(LoaderSettings(2), _blocky(50.0, 0.0, 0.01, 0.02), 1), empty) == (0.0, math.inf)
    planner = Planner(LoaderSettings(1, 2), HostBudget(7, "cores"), FAST, epoch_steps=400)
    planner.record(replace(window(30.0, 0.010, 0.033), batches_made=0))
    planner.record(window(90.0, 0.010, 0.033))
    assert planner.decide().setting == LoaderSettings(1, 2)


def test_a_probe_costs_its_whole_span_its_switch_and_warm_up_included() -> None:
    # Your settings' windows are free however long they took; a probe's time is from the switch to its window's end.
    def probed(span_extra_s: float | None) -> Planner:
        planner = Planner(LoaderSettings(1, 2), HostBudget(7, "cores"), FAST, epoch_steps=400)
        assert planner.record(window(30.0, 0.010, 0.033), span_s=9.0) != LoaderSettings(1, 2)
        probe = window(90.0, 0.010, 0.033)
        planner.record(probe, span_s=None if span_extra_s is None else probe.loop_s + span_extra_s)
        return planner

    window_only, short, long = probed(None), probed(1.0), probed(3.0)
    assert short.probe_time_s == pytest.approx(window_only.probe_time_s + 1.0)
    assert long.probe_time_s == pytest.approx(window_only.probe_time_s + 3.0)
    assert long.decide().probe_cost_s == pytest.approx(short.decide().probe_cost_s + 2.0)


def test_compute_bound_keeps_the_settings_without_probing() -> None:
    # A window in which the loop hardly waited may have missed the bursts: your settings (free of probe steps)
    # are measured again, up to three windows, before the loop is called compute-bound.
    planner = Planner(LoaderSettings(2, 2), HostBudget(7, "cores"), FAST, epoch_steps=400)
    again = [planner.record(window(98.0, 0.010, 0.015)) for _ in range(3)]
    assert again == [LoaderSettings(2, 2), LoaderSettings(2, 2), None]
    decision = planner.decide()
    assert decision.verdict == "compute_bound" and decision.setting == LoaderSettings(2, 2)
    assert decision.probe_steps == 0 and decision.probe_cost_s == 0.0
    assert [c.note for c in decision.candidates][1:] == ["your settings measured again: the loop hardly waited"] * 2


@pytest.mark.parametrize(
    ("count", "said"), [(0, "the trainer has no train loader"), (2, "the trainer iterates 2 train loaders at once")]
)
def test_the_tuner_and_the_monitor_say_why_they_take_no_loader_list_but_one(count: int, said: str) -> None:
    from torch.utils.data import DataLoader

    from lightning_loadguard.meters.monitor import LoaderMonitor
    from lightning_loadguard.tuning.reach import tuner_reach

    loaders = [DataLoader(list(range(8))) for _ in range(count)]
    reach = tuner_reach(loaders, snapshot(4, 0.01), epoch_steps=8, max_epochs=None)
    assert (reach.acts, reach.reason) == (False, said)
    assert LoaderMonitor(window=8).attach(loaders) == said


def test_a_retune_calls_its_start_the_earlier_choice_and_frees_its_rows() -> None:
    # A re-tune starts from the setting an earlier decision chose; the decision keeps the user's settings as its
    # original (for a resume). Its notes and its table's cost line speak of the earlier choice, not "your settings".
    users, earlier = LoaderSettings(1, 2), LoaderSettings(4, 2)
    planner = Planner(earlier, HostBudget(7, "cores"), FAST, epoch_steps=400, retune=True)
    again = [planner.record(window(98.0, 0.010, 0.015)) for _ in range(3)]
    assert again == [earlier, earlier, None]
    decision = replace(planner.decide(), original=users, retunes=1, retuned="another job took the cores")
    assert decision.reason == "the loop runs at its compute rate; the earlier choice is kept"
    again_note = "the earlier choice measured again: the loop hardly waited"
    assert [c.note for c in decision.candidates][1:] == [again_note] * 2
    table = decision.table()
    assert "your settings" not in table, table
    assert "probe cost: 0 steps in the 0 probed rows (the earlier choice's rows are free)" in table, table
    first = Planner(users, HostBudget(7, "cores"), FAST, epoch_steps=400)
    assert first.record(window(98.0, 0.010, 0.015)) == users
    assert first.current_note == "your settings measured again: the loop hardly waited"


def test_a_burst_in_your_settings_second_window_opens_the_search() -> None:
    planner = Planner(LoaderSettings(2, 2), HostBudget(7, "cores"), FAST, epoch_steps=400)
    assert planner.record(window(98.0, 0.010, 0.015)) == LoaderSettings(2, 2)
    proposal = planner.record(window(40.0, 0.010, 0.060))  # the loop waited most of this window
    assert proposal is not None and proposal.num_workers > 2


def test_a_wait_that_went_to_waiting_for_a_core_is_not_a_loader_to_tune() -> None:
    # 12 % of the loop waits; the sampled fetches spent 90 % of theirs waiting for a core (a busy host).
    steps = FAST.window_steps
    assert steps is not None
    busy_host = replace(
        window(88.0, 0.010, 0.015),
        wait_queued_s=tuple(0.0012 if k % 4 == 0 else math.nan for k in range(steps)),
    )
    planner = Planner(LoaderSettings(2, 2), HostBudget(7, "cores"), FAST, epoch_steps=400)
    assert [planner.record(busy_host) for _ in range(3)][-1] is None
    assert planner.decide().verdict == "compute_bound" and planner.decide().probe_steps == 0
    # The same wait spent on the loader is worth probing.
    planner = Planner(LoaderSettings(2, 2), HostBudget(7, "cores"), FAST, epoch_steps=400)
    assert planner.record(window(88.0, 0.010, 0.015)) is not None


def test_a_slower_candidate_never_replaces_the_original() -> None:
    planner = Planner(LoaderSettings(1, 2), HostBudget(7, "cores"), FAST, epoch_steps=400)
    proposal = planner.record(window(30.0, 0.010, 0.033))
    assert proposal is not None and proposal.num_workers > 1
    # Contention: more workers measured slower, then the ones between as well.
    while proposal is not None:
        proposal = planner.record(window(25.0, 0.010, 0.2))
    decision = planner.decide()
    assert decision.setting == LoaderSettings(1, 2) and decision.verdict == "no_gain"
    assert decision.throughput_after == decision.throughput_before
    assert decision.remaining_deficit == pytest.approx(0.7)


@pytest.mark.parametrize(
    ("user", "said"),
    [
        (LoaderSettings(0), "loading in the main process still takes 50% of the loop's time"),
        (LoaderSettings(1, 2), "50% of the step rate is still lost to data wait"),
    ],
)
def test_what_a_kept_setting_still_loses_is_named_for_where_loading_runs(user: LoaderSettings, said: str) -> None:
    # Every count measured no faster: without workers the loss is the main process's own loading, not a wait.
    planner = Planner(user, HostBudget(7, "cores"), FAST, epoch_steps=400)
    proposal = planner.record(window(50.0, 0.010, 0.010))
    while proposal is not None:
        proposal = planner.record(window(49.0, 0.010, 0.2))
    decision = planner.decide()
    assert decision.setting == user and decision.verdict == "no_gain"
    assert said in decision.reason, decision.reason


def test_within_noise_is_not_an_improvement() -> None:
    planner = Planner(LoaderSettings(1, 2), HostBudget(7, "cores"), FAST, epoch_steps=400)
    planner.record(window(30.0, 0.010, 0.033))
    planner.record(window(31.0, 0.010, 0.1))
    assert planner.decide().setting == LoaderSettings(1, 2)


def test_a_failed_candidate_is_never_chosen() -> None:
    planner = Planner(LoaderSettings(1, 2), HostBudget(7, "cores"), FAST, epoch_steps=400)
    proposal = planner.record(window(30.0, 0.010, 0.033))
    assert proposal is not None
    planner.record(window(99.0, 0.010, 0.033), failed="RuntimeError: worker killed")
    decision = planner.decide()
    assert decision.num_workers == 1
    assert [c.failed for c in decision.candidates][:2] == [None, "RuntimeError: worker killed"]


def test_the_search_starts_at_littles_law_and_grows_while_the_last_count_up_paid() -> None:
    # 40 ms per batch against a 10 ms step: Little's law (and its 20 % margin) asks for 5 workers. 5 paid, so
    # the count doubles (10); 10 did not pay min_gain, and the search goes between them (7, then 8).
    measure = {w: (95.5, 0.010) for w in range(6, 10)} | {0: (20.0, 0.010), 5: (95.0, 0.010), 10: (96.0, 0.010)}
    planner = Planner(LoaderSettings(0), HostBudget(16, "cores"), FAST, epoch_steps=2000)
    probed = _search(planner, measure, 0.040)
    assert probed[:4] == [0, 5, 10, 7], planner.decide().table()
    assert 5 <= planner.decide().num_workers <= 10


def test_the_search_grows_on_the_rates_as_measured_and_only_the_decision_asks_for_more_than_the_noise() -> None:
    # Noisy windows (blocks 30 % apart): 6 workers (Little's law) measured 25 % faster than your 2, within the
    # noise of one window each. The search goes on up all the same (12); your settings are kept unless a count
    # beats them beyond the noise.
    planner = Planner(LoaderSettings(2, 2), HostBudget(16, "cores"), NOISY, epoch_steps=2000)
    proposal = planner.record(_blocky(40.0, 0.3, 0.010, 0.05))
    assert proposal is not None and proposal.num_workers == 6
    proposal = planner.record(_blocky(50.0, 0.3, 0.010, 0.05))
    g, noise = gain(planner.arms[LoaderSettings(6, 2)], planner.arms[planner.original])
    assert 0.2 < g < noise
    assert proposal is not None and proposal.num_workers == 12, planner.results[-1].note
    assert planner.decide().setting == planner.original


def test_more_workers_measured_slower_send_the_search_between_them() -> None:
    # The step's threads and the workers share the cores: 8 workers (Little's law) measured slower than 4; the
    # counts between them are measured, and the fastest is kept.
    measure = {0: (30.0, 0.010), 4: (60.0, 0.010), 8: (40.0, 0.012), 6: (70.0, 0.010), 7: (66.0, 0.010)}
    planner = Planner(LoaderSettings(0), HostBudget(4, "cores"), FAST, epoch_steps=2000)
    probed = _search(planner, measure, 0.060)
    assert probed[:5] == [0, 4, 8, 6, 7], planner.decide().table()
    assert planner.decide().num_workers == 6


def test_where_more_did_not_pay_from_the_lowest_count_the_search_halves_it() -> None:
    # Your 4 workers run fastest: 8 (the count up), 6 and 5 (between) measured slower, so half as many are
    # measured (the hand-over or the cores the workers take from the step may cost more than they make).
    measure = {w: (38.0, 0.010) for w in range(17)} | {2: (30.0, 0.010), 4: (50.0, 0.010), 5: (45.0, 0.010)}
    measure |= {6: (40.0, 0.010)}
    planner = Planner(LoaderSettings(4, 2), HostBudget(16, "cores"), FAST, epoch_steps=2000)
    probed = _search(planner, measure, 0.040)
    assert probed[:5] == [4, 8, 6, 5, 2], planner.decide().table()
    assert planner.results[4].note == "the search: fewer workers, since more did not pay"
    assert planner.decide().num_workers == 4


def test_where_every_count_runs_alike_the_search_halves_down_to_loading_in_process() -> None:
    # Handing a batch over costs the loop 12 ms, making it in process 8 ms: every worker count runs alike (the
    # hand-over paces the loop), and more workers, one of them faster by a hair, did not pay; so the search halves
    # from the lowest count measured down to none (tests/sim_sweep.py's handover_bound-701: 0.88 of the best
    # without it, 1.00 with it). Here without the rule that tries no workers first (the test below).
    measure = {w: (45.0 + w * 1e-6, 0.010) for w in range(1, 9)} | {0: (55.0, 0.010)}
    halving = type("HalvingPlanner", (Planner,), {"rules": Planner.rules - {"main_process"}})
    planner = halving(LoaderSettings(4, 2), HostBudget(8, "cores"), FAST, epoch_steps=2000)
    probed = _search(planner, measure, 0.008)
    assert probed[:6] == [4, 8, 6, 2, 1, 0], planner.decide().table()
    assert planner.results[5].note == "the search: fewer workers, since more did not pay"
    assert planner.decide().num_workers == 0


def test_where_the_loop_waits_longer_per_batch_than_a_worker_makes_one_the_search_tries_no_workers_first() -> None:
    # The same loader: the loop waits 12 ms for each batch that a worker makes in 8 ms, so the wait is the hand-over,
    # which no worker count shortens; loading in the main process is measured right after your settings
    # (tests/sim_sweep.py's handover_bound-185, 4 workers on 2 cores: 0.77 of the best without it, 1.00 with it).
    measure = {w: (45.0 + w * 1e-6, 0.010) for w in range(1, 9)} | {0: (55.0, 0.010)}
    planner = Planner(LoaderSettings(4, 2), HostBudget(8, "cores"), FAST, epoch_steps=2000)
    probed = _search(planner, measure, 0.008)
    assert probed[:2] == [4, 0], planner.decide().table()
    assert planner.results[1].note.startswith("the search: in the main process")
    assert planner.decide().num_workers == 0
    # Where a worker takes longer to make a batch than the loop waits for one, more workers are the search's way.
    slower = Planner(LoaderSettings(4, 2), HostBudget(8, "cores"), FAST, epoch_steps=2000)
    assert _search(slower, measure, 0.020)[1] != 0


def test_where_one_more_worker_did_not_pay_twice_as_many_are_measured_once() -> None:
    # Three other processes keep two cores busy and the step computes on both: one worker beside in-process
    # loading wins nothing, two win a share of the cores (benchmarks/tune_pipelines.py's cpu_transforms_torch_step
    # live: 0, 1 slower, then 2 at 1.32 times yours, chosen; tests/test_tuning_rules.py has the sweep's pipeline).
    measure = {0: (14.0, 0.030), 1: (14.0, 0.030), 2: (20.0, 0.030), 3: (24.0, 0.030), 4: (26.0, 0.030)}
    measure |= {w: (30.0 + 0.1 * (w % 3), 0.030) for w in range(5, 33)}
    planner = Planner(LoaderSettings(0), HostBudget(1, "cores"), FAST, epoch_steps=2000)
    probed = _search(planner, measure, 0.040)
    assert probed[:3] == [0, 1, 2], planner.decide().table()
    assert planner.results[2].note == "the search: twice a count that did not pay"
    assert planner.decide().num_workers >= 3


def test_a_count_up_that_measured_slower_within_the_noise_is_measured_again_before_the_search_turns() -> None:
    # tests/sim_sweep.py's bursty-814: 2 workers ran 46 steps/s, 4 (59 in the steady state) 45.9 in one noisy
    # window, and the search went down with 90 % of the budget left. Here 5 workers first read 2 % slower than
    # 1 within the noise, then their steady 95.
    planner = Planner(LoaderSettings(1, 2), HostBudget(16, "cores"), FAST, epoch_steps=2000)
    up = planner.record(_blocky(50.0, 0.3, 0.010, 0.040))
    assert up is not None and up.num_workers > 1
    again = planner.record(_blocky(49.0, 0.3, 0.010, 0.040))
    assert again == up and planner.current_note == "the search: measured again, slower within the noise"
    following = planner.record(_blocky(95.0, 0.0, 0.010, 0.040))
    assert following is not None and following.num_workers > up.num_workers  # up again from the count it kept
    # Measured slower beyond the noise, a count is not measured again: the search turns at once.
    planner = Planner(LoaderSettings(1, 2), HostBudget(16, "cores"), FAST, epoch_steps=2000)
    up = planner.record(_blocky(50.0, 0.0, 0.010, 0.040))
    assert up is not None
    turned = planner.record(_blocky(40.0, 0.0, 0.010, 0.040))
    assert turned != up and "measured again" not in planner.current_note


def test_the_cores_prediction_is_where_the_search_starts_not_where_it_stops() -> None:
    # Little's law asks for 9 workers, the cores are predicted to hold 3: 3 first, then past the prediction
    # while each count up pays.
    measure = {w: (90.5, 0.010) for w in range(10, 19)} | {0: (12.0, 0.010), 3: (36.0, 0.010), 9: (90.0, 0.010)}
    planner = Planner(LoaderSettings(0), HostBudget(3, "cores"), FAST, epoch_steps=2000)
    probed = _search(planner, measure, 0.070)
    assert probed[:5] == [0, 3, 9, 18, 13], planner.decide().table()
    assert planner.decide().num_workers >= 9


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
    decision = planner.decide()
    assert decision.num_workers == 1 and decision.bounded_by in ("shm", "max_workers"), decision.table()


def test_bursts_get_the_depth_the_replay_asks_for() -> None:
    # One batch in eight takes 70 ms: the producer keeps up on average, and a deeper buffer absorbs the bursts.
    planner = Planner(LoaderSettings(2, 2), HostBudget(2, "max_workers"), FAST, epoch_steps=400)
    bursty = snapshot(6, 0.01, mean_wait_s=0.004, production_s=(0.002,) * 7 + (0.07,), made=6)
    proposal = planner.record(bursty)
    assert proposal is not None and proposal.num_workers == 2 and proposal.prefetch_factor > 2
    assert planner.current_note == "deeper buffer for bursts (replay)"
    advice = recommend_prefetch((0.002,) * 7 + (0.07,), (0.01,), num_workers=2, deep_prefetch=FAST.max_prefetch)
    assert advice is not None and proposal.prefetch_factor == advice.prefetch_factor


def test_bursts_ask_for_more_workers_than_the_mean_does() -> None:
    burst = (0.002,) * 7 + (0.2,)  # mean 26.75 ms: Little's law asks for 4 workers at 100 steps/s
    planner = Planner(LoaderSettings(0), HostBudget(12, "cores"), FAST, epoch_steps=400)
    m = snapshot(6, 0.01, mean_wait_s=0.04, production_s=burst, made=6)
    proposal = planner.record(m)
    assert proposal is not None and proposal.num_workers > 4
    # The count the replay gives: the fewest whose replayed wait is negligible.
    assert replayed_wait(burst, (0.01,), proposal.num_workers, 2) < 0.05
    assert replayed_wait(burst, (0.01,), proposal.num_workers - 1, 2) >= 0.05


def test_the_planner_and_the_model_replay_the_same_steps() -> None:
    # One replay for both: the depth recommend_prefetch gives is the first whose replayed_wait is within its
    # tolerance, whatever the length of the measured sequences.
    production = (0.004,) * 30 + (0.09,) * 3
    advice = recommend_prefetch(production, (0.01,), num_workers=2, deep_prefetch=8)
    assert advice is not None
    assert replayed_wait(production, (0.01,), 2, advice.prefetch_factor) == pytest.approx(advice.expected_wait_fraction)


def test_a_window_faster_beyond_the_noise_sets_aside_the_settling_ones_before_it() -> None:
    # A restart only ever slows the loop while it settles: the same rule for every arm. 4 workers read 47
    # steps/s right after their restart and 62 in the next window, beyond the two windows' noise: judged on 62.
    # A second window slower by as much is joined to the first.
    for second, judged in ((62.0, 62.0), (36.0, 2 / (1 / 47 + 1 / 36))):
        planner = Planner(LoaderSettings(0), HostBudget(8, "cores"), NOISY, epoch_steps=2000)
        planner.record(_blocky(40.0, 0.02, 0.0024, 0.0166))
        planner.current, planner.continuing = LoaderSettings(4, 2), False
        planner.record(_blocky(47.0, 0.02, 0.0024, 0.0166))
        planner.current, planner.continuing = LoaderSettings(4, 2), True
        planner.record(_blocky(second, 0.02, 0.0024, 0.0166))
        assert planner.measurements[LoaderSettings(4, 2)].sustained_rate == pytest.approx(judged)
        assert ("set aside" in planner.results[-1].note) == (second > 47.0)


def test_the_settling_rule_holds_for_your_settings_too() -> None:
    # docs/tuning.md: one settling rule "for every arm, the user's included". Your settings hardly waited in their
    # first window (96 steps/s against a 100 steps/s step), so they are measured again as they run (no restart);
    # the second window reads 100, beyond the noise of two steady windows: the first is set aside, and your arm
    # reads 100, not the two windows joined (97.96). A second window slower by as much is joined to the first.
    for second, judged in ((100.0, 100.0), (92.0, 2 / (1 / 96 + 1 / 92))):
        planner = Planner(LoaderSettings(2, 2), HostBudget(7, "cores"), FAST, epoch_steps=400)
        again = planner.record(window(96.0, 0.010, 0.015))
        assert again == planner.original and planner.continuing  # measured again without a restart
        planner.record(window(second, 0.010, 0.015))
        assert planner.measurements[planner.original].sustained_rate == pytest.approx(judged)
        assert ("set aside" in planner.results[-1].note) == (second > 96.0), planner.results[-1].note


def test_pinned_memory_is_probed_once_the_count_and_depth_have_nothing_new_to_measure() -> None:
    # docs/tuning.md: pinned memory is probed last; where it pays, the search goes on from the pinned setting.
    # Counts up to 10 pay (then flat); pinning pays ``pinned`` times. Scripted by the test, per setting.
    rates = {0: 20.0, 5: 82.0, 7: 84.0, 8: 85.0}

    def rate_of(setting: LoaderSettings, pinned: float) -> float:
        return rates.get(setting.num_workers, 85.0) * (pinned if setting.pin_memory else 1.0)

    for pinned in (1.0, 1.1):
        planner = Planner(LoaderSettings(0), HostBudget(16, "cores"), FAST, epoch_steps=4000, pinning_helps=True)
        proposals: list[tuple[LoaderSettings, str]] = []
        proposal = planner.record(window(20.0, 0.010, 0.040))
        while proposal is not None:
            assert len(proposals) < 50
            proposals.append((proposal, planner.current_note))
            proposal = planner.record(window(rate_of(proposal, pinned), 0.010, 0.040))
        first_pinned = next(k for k, (s, _) in enumerate(proposals) if s.pin_memory)
        assert first_pinned >= 3, proposals  # the counts were searched first
        after = proposals[first_pinned + 1 :]
        assert after, proposals
        if pinned == 1.0:
            # Pinning did not pay: nothing new follows it, only the contest's windows of settings measured before.
            assert all("measured again" in note for _, note in after), proposals
            assert not planner.decide().pin_memory
        else:
            # Pinning paid: the counts the search measures next are pinned ones, never an unpinned count again.
            new = [s for s, note in after if "measured again" not in note]
            assert new and all(s.pin_memory for s in new), proposals
            assert planner.decide().pin_memory


def test_max_prefetch_is_the_deepest_prefetch_factor_tried() -> None:
    # The buffer replay asks for prefetch 4 at 2 workers (bursts); max_prefetch=3 caps the depth probed at 3.
    burst = (0.002,) * 7 + (0.07,)
    advice = recommend_prefetch(burst, (0.01,), num_workers=2, deep_prefetch=8)
    assert advice is not None and advice.prefetch_factor > 3
    capped = TuneOptions(warmup_steps=2, window_steps=6, max_prefetch=3)
    planner = Planner(LoaderSettings(2, 2), HostBudget(2, "max_workers"), capped, epoch_steps=400)
    bursty = snapshot(6, 0.01, mean_wait_s=0.004, production_s=burst, made=6)
    proposal = planner.record(bursty)
    assert proposal == LoaderSettings(2, 3) and planner.current_note == "deeper buffer for bursts (replay)"
    # A search over counts from your own deeper buffer (prefetch 6): every setting probed is capped at 3.
    planner = Planner(LoaderSettings(1, 6), HostBudget(16, "cores"), capped, epoch_steps=2000)
    probed: list[LoaderSettings] = []
    proposal = planner.record(snapshot(6, 0.01, mean_wait_s=0.03, production_s=(0.01,) * 7 + (0.3,), made=6))
    while proposal is not None:
        assert len(probed) < 50
        probed.append(proposal)
        proposal = planner.record(snapshot(6, 0.01, mean_wait_s=0.03, production_s=(0.01,) * 7 + (0.3,), made=6))
    others = [s for s in probed if s != planner.original and s.num_workers > 0]
    assert others and all(s.prefetch <= 3 for s in others), probed
    assert planner.decide().setting == planner.original or planner.decide().prefetch_factor <= 3


def test_a_candidates_warm_up_is_its_first_fill_up_to_half_a_window_more() -> None:
    # docs/tuning.md: warmup_steps, or a candidate's first fill where longer (its batches in flight: workers x
    # prefetch), at most half a window more; warmup_steps alone where it is measured again as it runs.
    options = TuneOptions(warmup_steps=4, window_steps=12)
    planner = Planner(LoaderSettings(0), HostBudget(16, "cores"), options, epoch_steps=4000)
    assert planner.warmup_for(LoaderSettings(1, 2)) == 4  # 2 batches in flight: the warm-up is longer
    assert planner.warmup_for(LoaderSettings(3, 2)) == 6  # 6 batches in flight
    assert planner.warmup_for(LoaderSettings(8, 4)) == 4 + 12 // 2  # 32 in flight: capped at half a window more
    assert planner.warmup_for(LoaderSettings(8, 4), continuing=True) == 4
    # The steps a probe of 8 x 4 costs: its capped warm-up and its window, counted against the budget.
    planner.record(window(20.0, 0.010, 0.040))
    planner.current, planner.continuing = LoaderSettings(8, 4), False
    planner.record(window(60.0, 0.010, 0.040))
    assert planner.results[-1].steps == 10 + 12 and planner.probe_steps == 22


def test_a_setting_replaces_yours_only_after_both_are_measured_again() -> None:
    # 5 workers read 70 % faster in one window: before they replace the user's settings, the user's are measured
    # again (free) and the 5 workers once more; the decision is made on both windows of each.
    planner = Planner(LoaderSettings(0), HostBudget(16, "cores"), FAST, epoch_steps=2000)
    measure = {w: (85.0 + 0.1 * w, 0.010) for w in range(5, 11)} | {0: (50.0, 0.010)}
    probed = _search(planner, measure, 0.040)
    assert probed.count(0) == 2, planner.decide().table()  # the user's settings measured again, free
    decision = planner.decide()
    assert decision.verdict == "improved" and 5 <= decision.num_workers <= 10
    assert decision.probe_steps <= decision.probe_budget_steps
    rows = [c.setting for c in decision.candidates]
    assert rows.count(decision.setting) >= 2


def test_no_setting_gets_more_than_three_windows() -> None:
    # Every other setting reads 6 % faster than yours, in 8-step windows whose two blocks run 20 % apart: more
    # windows could still tell them apart, and the budget (2,000-step epochs) holds far more than the decision
    # may use, yet yours (free) and the leader stop at three windows each.
    planner = Planner(LoaderSettings(2, 2), HostBudget(16, "cores"), FAST, epoch_steps=2000)
    counts: dict[LoaderSettings, int] = {}
    proposal: LoaderSettings | None = planner.original
    while proposal is not None:
        counts[proposal] = counts.get(proposal, 0) + 1
        assert sum(counts.values()) < 100
        rate = 50.0 if proposal == planner.original else 53.0
        proposal = planner.record(_blocky(rate, 0.2, 0.010, 0.040, steps=8))
    assert counts[planner.original] == 3 == max(counts.values()), counts  # docs/tuning.md: "each at most 3"
    assert sum(n == 3 for n in counts.values()) >= 2 and planner.probe_steps <= planner.budget_steps


def test_a_spent_probe_budget_still_measures_the_users_settings_again() -> None:
    # The budget holds one candidate: the user's settings, which cost no probe steps, get their second window.
    planner = Planner(LoaderSettings(0), HostBudget(8, "cores"), FAST, epoch_steps=70)
    assert planner.budget_steps == 14
    proposal = planner.record(window(30.0, 0.010, 0.040))
    assert proposal is not None and proposal.num_workers > 0
    assert planner.record(window(90.0, 0.010, 0.040)) == LoaderSettings(0)
    assert planner.record(window(31.0, 0.010, 0.040)) is None
    decision = planner.decide()
    assert decision.probe_steps <= decision.probe_budget_steps
    assert decision.throughput_before == pytest.approx(2 / (1 / 30 + 1 / 31))


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


def _never_worse(
    rates: list[float], spread: float, max_workers: int, max_in_flight: int, start: int
) -> tuple[LoaderSettings, LoaderSettings, dict[LoaderSettings, float]]:
    """Drive a planner over settings whose rates the test scripts (``rates``, picked by the setting: every window
    of a setting runs alike, its 4-step blocks ``spread`` apart), checking each proposal against the walls and the
    probe steps against the budget; the user's settings, the decision's and each setting's scripted rate."""
    options = NOISY
    epoch_steps = 2000
    budget = HostBudget(max_workers, "cores", max_in_flight=max_in_flight, memory_bound="host_memory")
    original = LoaderSettings(start, 1 if start else None)
    planner = Planner(original, budget, options, epoch_steps=epoch_steps)
    step_s, production_s = 0.001, 0.05

    def rate_of(setting: LoaderSettings) -> float:
        return rates[(7 * setting.num_workers + setting.prefetch) % len(rates)]

    truth: dict[LoaderSettings, float] = {}
    probe_windows = 0
    proposal: LoaderSettings | None = original
    while proposal is not None:
        # Memory is a wall: never probed past (the user's own settings, which the run would run anyway, aside).
        assert proposal == original or budget.breaks_wall(proposal) is None, proposal
        assert len(planner.results) < 100
        fed = _blocky(rate_of(proposal), spread, step_s, production_s)
        # The test's own reading of the window it made: steps over the loop's time.
        truth[proposal] = len(fed.step_s) / math.fsum(map(operator.add, fed.wait_s, fed.step_s))
        probe_windows += proposal != original
        proposal = planner.record(fed)
    # Each probe window costs at least the warm-up and the window: within probe_share of the epoch's steps.
    assert probe_windows * (options.warmup_steps + NOISY.window_steps) <= math.floor(0.2 * epoch_steps)
    return original, planner.decide().setting, truth


@settings(max_examples=60, deadline=None)
@given(
    rates=st.lists(st.floats(1.0, 500.0), min_size=1, max_size=10),
    spread=st.sampled_from([0.0, 0.1, 0.3]),
    max_workers=st.integers(0, 12),
    max_in_flight=st.integers(1, 64),
    start=st.integers(0, 4),
)
def test_never_breaks_a_wall_nor_the_budget_and_never_keeps_a_slower_setting(
    rates: list[float], spread: float, max_workers: int, max_in_flight: int, start: int
) -> None:
    original, chosen, truth = _never_worse(rates, spread, max_workers, max_in_flight, start)
    # Never worse, judged on the rates the test made each setting's windows at: a setting that replaces yours
    # runs at least min_gain faster (every window of it, so its arm too, whatever the settling rule set aside).
    if not chosen.same_loader(original):
        kept = next(s for s in truth if s.same_loader(chosen))
        assert truth[kept] >= truth[original] * (1 + NOISY.min_gain), (truth, chosen)


def test_a_setting_that_replaces_yours_is_the_fastest_measured_beyond_the_noise() -> None:
    # The never-worse check above, on an example that switches: every count from 1 up reads 2 to 5 times your 40
    # steps/s, in blocks 10 % apart; the decision is the fastest measured (truth: the test's own windows).
    original, chosen, truth = _never_worse([40.0, 80.0, 120.0, 160.0, 200.0], 0.1, 12, 64, 0)
    assert not chosen.same_loader(original), truth  # the branch the property guards ran
    assert truth[chosen] >= truth[original] * (1 + NOISY.min_gain)
    assert truth[chosen] == pytest.approx(max(truth.values())), (truth, chosen)
    # Within the noise (blocks 30 % apart, one window each at 6 % faster), the same scripted counts keep yours.
    original, chosen, truth = _never_worse([40.0, 42.4], 0.3, 12, 64, 0)
    assert max(truth.values()) > truth[original] * (1 + NOISY.min_gain) and chosen == original, truth


def _decide_scripted(
    rate_of: Callable[[LoaderSettings], float], spread: float, yours: tuple[float, ...] = (40.0,)
) -> TuneDecision:
    """Drive a planner from 1 worker over windows whose rates ``rate_of`` scripts (yours: ``yours``, window by
    window, the last one repeated), blocks ``spread`` apart; its decision."""
    planner = Planner(LoaderSettings(1, 2), HostBudget(64, "cores"), NOISY, epoch_steps=2000)
    proposal: LoaderSettings | None = planner.original
    visits = 0
    while proposal is not None:
        if proposal == planner.original:
            rate, visits = yours[min(visits, len(yours) - 1)], visits + 1
        else:
            rate = rate_of(proposal)
        proposal = planner.record(_blocky(rate, spread, 0.001, 0.05))
    return planner.decide()


def test_your_settings_are_measured_again_while_the_leader_could_still_beat_them_by_min_gain() -> None:
    # Every candidate reads 103 steps/s; your first window 100, the next ones 85 (it caught a fast stretch). 3 %
    # is under min_gain, but within the noise of one window each (blocks 10 % apart): yours are measured again
    # (free of probe steps), and the candidates replace them.
    decision = _decide_scripted(lambda s: 103.0, 0.1, yours=(100.0, 85.0))
    notes = [c.note for c in decision.candidates if c.setting == decision.original]
    assert len(notes) >= 2 and "measured again" in notes[1], decision.table()
    assert decision.verdict == "improved", decision.table()
    # Where your windows hold their rate, the candidates' 3 % stays under min_gain and yours are kept.
    steady = _decide_scripted(lambda s: 103.0, 0.1, yours=(100.0,))
    assert steady.verdict == "no_gain" and steady.setting.same_loader(steady.original), steady.table()


def _roomiest_and_fastest(decision: TuneDecision) -> tuple[LoaderSettings, LoaderSettings]:
    measured = {c.setting for c in decision.candidates if c.setting != decision.original}
    assert len(measured) >= 2, measured  # there was a choice to make
    return max(measured, key=lambda s: s.batches_in_flight), min(measured, key=lambda s: s.batches_in_flight)


def test_of_settings_alike_within_the_noise_the_one_with_most_batches_in_flight_is_kept() -> None:
    # Every candidate reads 2.5 times your rate, the roomier a hair slower (0.01 % a batch in flight), in blocks 10 %
    # apart: the windows cannot tell them apart, and the one with most batches in flight is kept.
    decision = _decide_scripted(lambda s: 100.0 * (1 - 0.0001 * s.batches_in_flight), 0.1)
    roomiest, _ = _roomiest_and_fastest(decision)
    assert decision.setting.same_loader(roomiest), decision.table()
    assert "within the noise" in decision.reason and "more batches in flight" in decision.reason
    # In blocks that run alike the windows show no noise; rates within 1 % of each other are still alike.
    flat = _decide_scripted(lambda s: 100.0 * (1 - 0.00001 * s.batches_in_flight), 0.0)
    roomiest, _ = _roomiest_and_fastest(flat)
    assert flat.setting.same_loader(roomiest), flat.table()
    # Blocks that run alike, the roomier 0.1 % slower a batch in flight: slower beyond both, the fastest is kept.
    steady = _decide_scripted(lambda s: 100.0 * (1 - 0.001 * s.batches_in_flight), 0.0)
    _, fastest = _roomiest_and_fastest(steady)
    assert steady.setting.same_loader(fastest) and "batches in flight" not in steady.reason, steady.table()


def _sharing(workers: int, cores: int, cpu_s: float, read_rate: float, steps: int = 24) -> WindowSnapshot:
    """A window of ``workers`` making batches of ``cpu_s`` CPU-seconds on ``cores`` shared cores (each batch waits its
    share of the time for a core), the loop reading ``read_rate`` steps/s (what a window shorter than the workers'
    round may read), waiting for all but its 1 ms steps."""
    busy = max(1.0, workers / cores) * cpu_s
    return WindowSnapshot(
        wait_s=(1.0 / read_rate - 0.001,) * steps,
        step_s=(0.001,) * steps,
        settings=LoaderSettings(workers),
        host=HostFacts(cpu_count=cores),
        production_s=(busy,) * steps,
        production_cpu_s=(cpu_s,) * steps,
        production_queued_s=(busy - cpu_s,) * steps,
        batches_made=steps,
    )


def test_no_arm_reads_faster_than_the_hosts_cores_make_its_batches() -> None:
    # 4 cores make 40 batches/s at 0.1 CPU-seconds a batch, whatever the count; windows read each count's workers
    # finishing a batch every 0.1 s (the phase of their rounds, not their rate), past 40 steps/s where they outnumber
    # the cores. Every arm is rated at most 40, and so is the decision.
    cores, cpu_s = 4, 0.1
    planner = Planner(LoaderSettings(1, 2), HostBudget(64, "cores"), FAST, epoch_steps=2000)
    proposal: LoaderSettings | None = planner.original
    while proposal is not None:
        w = proposal.num_workers
        proposal = planner.record(_sharing(w, cores, cpu_s, read_rate=max(1, w) / cpu_s))
    assert any(a.window.sustained_rate > 1.5 * cores / cpu_s for a in planner.arms.values())  # the windows' reading
    assert all(a.rate <= cores / cpu_s * (1 + 1e-9) for a in planner.arms.values())
    decision = planner.decide()
    assert decision.throughput_after is not None and decision.throughput_after <= cores / cpu_s * (1 + 1e-9)
    # The table shows each window's reading; a row the bound lowered says what the decision rated it at, and why.
    for row in decision.candidates:
        bounded = row.rate is not None and row.rate > cores / cpu_s * 1.01
        assert ("at most 40.00 (4 cores at 0.1 CPU-s a batch)" in row.note) is bounded, (row, decision.table())
    # The bound reads what the batches cost: where no CPU time was sampled, the window's own reading stands.
    unsampled = replace(_sharing(16, cores, cpu_s, read_rate=160.0), production_cpu_s=())
    assert Arm(LoaderSettings(16), unsampled, 1, cores_bound=True).rate == pytest.approx(160.0)


def test_computing_workers_past_the_cores_are_rated_over_the_epoch_their_first_batches_included() -> None:
    # 16 computing workers on 4 cores take 0.4 s a batch, all starting each epoch at once: over a 40-step epoch at
    # 40 steps/s (1 s), the loop waits 0.4 s for the first batch: 40 steps in 1.4 s.
    past = Arm(LoaderSettings(16), _sharing(16, 4, 0.1, read_rate=40.0), 1, epoch_steps=40)
    assert past.rate == pytest.approx(40 / 1.4)
    assert past.rating == "; rated 28.57 steps/s: over a 40-step epoch whose first batch takes 0.4 s"  # the table's
    # Not where the workers fit the cores (their first batch takes as long at any count), nor where they wait on
    # I/O (their batches do not share the cores), nor without the epoch's length.
    within = Arm(LoaderSettings(4), _sharing(4, 4, 0.1, read_rate=40.0), 1, epoch_steps=40)
    reading = _sharing(16, 4, 0.1, read_rate=40.0)
    waiting = replace(reading, production_cpu_s=(0.01,) * reading.steps, production_queued_s=())
    assert within.rate == pytest.approx(40.0) and within.rating == ""
    assert Arm(LoaderSettings(16), waiting, 1, epoch_steps=40).rate == pytest.approx(40.0)
    assert Arm(LoaderSettings(16), reading, 1).rate == pytest.approx(40.0)


def test_workers_that_start_anew_each_epoch_are_rated_over_the_epoch_their_measured_start_included() -> None:
    # 16 computing workers on 4 cores, read at 40 steps/s; starting them was seen to take 0.6 s, paid at each of the
    # 40-step epochs where persistent workers are not chosen: 40 steps in 1 + 0.4 (first batch) + 0.6 s.
    reading = _sharing(16, 4, 0.1, read_rate=40.0)
    arm = Arm(LoaderSettings(16), reading, 1, epoch_steps=40, start_s=0.6)
    assert arm.rate == pytest.approx(40 / 2.0)
    assert arm.rating == (
        "; rated 20.00 steps/s: over a 40-step epoch whose first batch takes 0.4 s and workers' start takes 0.6 s"
    )
    assert Arm(LoaderSettings(4), _sharing(4, 4, 0.1, read_rate=40.0), 1, epoch_steps=40, start_s=0.6).rate == (
        pytest.approx(40 / 1.6)
    )
    # Paid only where persistent workers cannot be chosen: where they can, a start that costs a share of the epoch
    # turns them on.
    window = WindowSnapshot(wait_s=(0.0,) * 10, step_s=(0.1,) * 10)
    for tune_persistent, paid in ((False, 0.6), (True, None)):
        starts = WorkerStarts(TuneOptions(tune_persistent_workers=tune_persistent), epoch_steps=40)
        starts.record(LoaderSettings(16), window, startup_s=0.6)
        starts.record(LoaderSettings(8, persistent_workers=True), window, startup_s=0.6)
        assert starts.paid_each_epoch(LoaderSettings(16)) == paid
        assert starts.paid_each_epoch(LoaderSettings(8, persistent_workers=True)) is None


def test_without_persistent_workers_the_count_chosen_is_the_fastest_over_an_epoch_its_start_included() -> None:
    # Your 2 workers read 20 steps/s; every count above reads 24 (the step's rate). Starting w workers takes w / 2 s
    # at each 1000-step epoch's start, as the test's own costs say: over an epoch 4 workers make the most steps/s
    # (22.9; 8 make 21.9), though in the windows every count from 3 up reads alike.
    def epoch_rate(workers: int) -> float:
        return 1000 / (1000 / (20.0 if workers <= 2 else 24.0) + workers / 2)

    options = TuneOptions(tune_persistent_workers=False)
    planner = Planner(LoaderSettings(2), HostBudget(32, "cores"), options, epoch_steps=1000)
    proposal: LoaderSettings | None = planner.current
    while proposal is not None:
        w = proposal.num_workers
        wait = 1 / 20 - 1 / 24 if w <= 2 else 0.0
        window = WindowSnapshot(
            wait_s=(wait,) * 24, step_s=(1 / 24,) * 24, settings=proposal, production_s=(w / 20 * 0.9,) * 24
        )
        proposal = planner.record(window, startup_s=w / 2)
    decision = planner.decide()
    measured = {c.setting.num_workers for c in decision.candidates}
    assert len(measured) >= 3, decision.table()  # not vacuous: counts from 4 to 8 were measured
    assert epoch_rate(decision.num_workers) == max(map(epoch_rate, measured)), decision.table()
    for arm in planner.arms.values():
        assert arm.rate == pytest.approx(epoch_rate(arm.setting.num_workers))


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


def test_iterable_datasets_only_get_a_deeper_buffer_from_the_model() -> None:
    bursty = snapshot(6, 0.01, production_s=(0.002,) * 7 + (0.07,), made=6)
    decision = model_only_decision(LoaderSettings(2, 2), HostBudget(8, "cores"), FAST, bursty, "iterable")
    assert decision.num_workers == 2 and decision.prefetch_factor > 2 and decision.verdict == "model_only"
    assert decision.throughput_after is None
    tight = HostBudget(8, "cores", max_in_flight=6, memory_bound="shm")
    bounded = model_only_decision(LoaderSettings(2, 2), tight, FAST, bursty, "iterable")
    assert bounded.prefetch_factor == 3 and bounded.bounded_by == "shm"


def test_tune_persistent_workers_false_never_turns_them_on() -> None:
    # Starting the workers costs 1 s of a 7 s epoch: persistent workers are chosen unless the option forbids them.
    decided = {}
    for allowed in (True, False):
        options = replace(FAST, tune_persistent_workers=allowed, persistent_min_share=0.0)
        planner = Planner(LoaderSettings(0), HostBudget(3, "cores"), options, epoch_steps=400)
        planner.record(window(20.0, 0.010, 0.05))
        planner.record(window(60.0, 0.010, 0.05), startup_s=1.0)
        decided[allowed] = planner.decide()
    assert decided[True].num_workers == decided[False].num_workers == 3
    assert decided[True].persistent_workers and not decided[False].persistent_workers


@pytest.mark.parametrize(("startup_s", "persistent"), [(0.5, True), (0.01, False)])
def test_kept_settings_get_persistent_workers_where_their_own_start_costs_a_share_of_the_epoch(
    startup_s: float, persistent: bool
) -> None:
    # The loop runs at its compute rate (100 steps/s, a 4 s epoch): the settings are kept. Starting the user's
    # two workers costs 0.5 s of each epoch (12 %), or 0.01 s (0.25 %, under persistent_min_share's 2 %).
    planner = Planner(LoaderSettings(2, 2), HostBudget(7, "cores"), FAST, epoch_steps=400)
    assert [planner.record(window(100.0, 0.010, 0.005), startup_s=startup_s) for _ in range(3)][-1] is None
    decision = planner.decide()
    assert decision.verdict == "compute_bound"
    assert (decision.num_workers, decision.prefetch_factor) == (2, 2)
    assert decision.persistent_workers is persistent
    assert ("persistent_workers turned on" in decision.reason) is persistent
    assert not planner.decide(map_style=False).persistent_workers


@pytest.mark.parametrize(("startup_s", "verdict"), [(0.5, "model_only"), (0.002, "not_tuned")])
def test_where_no_window_of_yours_made_a_batch_only_persistent_workers_may_change(
    startup_s: float, verdict: str
) -> None:
    # 40 workers over 30-step epochs: every window is served from batches made before it, so nothing has a rate.
    # At the windows' pace (50 steps/s) an epoch's rest takes 0.6 s: a 0.5 s start is far over 2 % of it, 2 ms under.
    planner = Planner(LoaderSettings(40, 2), HostBudget(64, "cores"), FAST, epoch_steps=30, span_epochs=5)
    unrated = window(50.0, 0.010, None, made=0)
    assert all(planner.record(unrated, startup_s=startup_s) == planner.original for _ in range(5))
    planner.note_budget_spent()  # the span of 5 epochs ended, each measuring your settings again
    decision = planner.decide()
    assert decision.verdict == verdict and decision.throughput_before is None
    assert decision.setting == replace(planner.original, persistent_workers=verdict == "model_only")
    assert ("its steps 0.6 s" in decision.reason) is (verdict == "model_only")


def test_persistent_workers_are_weighed_by_the_chosen_settings_own_start() -> None:
    # The chosen setting's workers took 1 s to start (a 7 s epoch); the setting probed after it, slower, took
    # 1 ms. The choice is weighed by its own start, not by the latest one seen.
    planner = Planner(LoaderSettings(0), HostBudget(3, "cores"), FAST, epoch_steps=400)
    chosen = planner.record(window(20.0, 0.010, 0.05))
    after = planner.record(window(60.0, 0.010, 0.05), startup_s=1.0)
    assert chosen is not None and after is not None and after.num_workers not in (0, chosen.num_workers)
    planner.record(window(30.0, 0.010, 0.05), startup_s=0.001)
    decision = planner.decide()
    assert decision.num_workers == chosen.num_workers and decision.persistent_workers


@pytest.mark.parametrize(("settling_s", "persistent"), [(0.3, True), (0.0, False)])
def test_a_restart_costs_the_loop_its_warm_ups_time_past_the_windows_pace_less_the_first_batch(
    settling_s: float, persistent: bool
) -> None:
    # The workers start in 50 ms, under 2 % of a 400-step epoch at 60 steps/s (6.7 s); their warm-up then runs
    # `settling_s` slower than the window's pace, besides the first batch (50 ms), which persistent workers make at
    # each epoch's start too. Persistent workers are chosen where what the restart cost passes 2 % of the epoch.
    planner = Planner(LoaderSettings(0), HostBudget(3, "cores"), FAST, epoch_steps=400)
    chosen = planner.record(window(20.0, 0.010, 0.05))
    assert chosen is not None and chosen.num_workers > 0
    probe = window(60.0, 0.010, 0.05)
    warm = planner.warmup_for(chosen, continuing=False)
    paced_s = probe.loop_s * (1 + warm / probe.steps)
    planner.record(probe, startup_s=0.05, span_s=paced_s + 0.05 + settling_s)
    decision = planner.decide()
    assert decision.num_workers == chosen.num_workers and decision.persistent_workers is persistent


def test_decision_round_trips_through_plain_data() -> None:
    planner = Planner(LoaderSettings(0), HostBudget(3, "cores"), FAST, epoch_steps=400)
    planner.record(window(20.0, 0.010, 0.05))
    planner.record(window(60.0, 0.010, 0.05), startup_s=1.0)
    decision = planner.decide()
    back = TuneDecision.from_dict(decision.to_dict())
    assert back == decision
    assert "workers=3 prefetch=2 *" in decision.table() and "probe cost" in decision.table()
    assert back.persistent_workers  # 1 s to start workers is far more than 2 % of a 7 s epoch
    assert math.isclose(back.speedup or 0, 3.0)


def test_the_probe_cost_line_adds_up_with_the_table() -> None:
    measure = {w: (78.0, 0.010) for w in range(3, 9)} | {0: (38.0, 0.010), 1: (60.0, 0.010), 2: (80.0, 0.010)}
    planner = Planner(LoaderSettings(0), HostBudget(1, "cores"), FAST, epoch_steps=600)
    _search(planner, measure, 0.016)
    decision = planner.decide()
    probed_rows = [c for c in decision.candidates if c.setting != LoaderSettings(0)]
    assert decision.probe_steps == sum(c.steps for c in probed_rows)
    # The user's settings cost no probe steps.
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


def test_a_0_1_0_checkpoint_loads_without_a_watch_and_a_watched_one_keeps_its_reference() -> None:
    from lightning_loadguard.callback import LoadGuard

    guard = LoadGuard(auto_tune=True)
    guard.load_state_dict({"tuner": _STATE_0_1_0})
    assert guard.state_dict()["tuner"] == _STATE_0_1_0  # nothing the checkpoint did not hold is made up
    watched = {**_STATE_0_1_0, "watch": {"rate": 60.0, "error": 0.02, "winnable": 0.1, "window_steps": 12}}
    again = LoadGuard(auto_tune=True)
    again.load_state_dict({"tuner": watched})
    assert again.state_dict()["tuner"] == watched
    kept = again._tuner._session._reference if again._tuner is not None else None
    assert kept is not None and kept.cores is None  # stored before the cores were: watched on the data side alone
    torn = LoadGuard(auto_tune=True)  # a measurement cut short loads as none: the decision applies, unwatched
    torn.load_state_dict({"tuner": {**_STATE_0_1_0, "watch": {"rate": 60.0}}})
    assert torn.state_dict()["tuner"] == _STATE_0_1_0
    # The cores the decision read (kept since the watch reads other work's cores) come back with it.
    with_cores = {**watched, "watch": {**watched["watch"], "cores": {"other": 1.5, "busy_share": 0.95}}}
    cores = LoadGuard(auto_tune=True)
    cores.load_state_dict({"tuner": with_cores})
    assert cores.state_dict()["tuner"] == with_cores
    reference = cores._tuner._session._reference if cores._tuner is not None else None
    assert reference is not None and reference.cores == CoresUse(1.5, 0.95)
    torn_cores = LoadGuard(auto_tune=True)
    torn_cores.load_state_dict({"tuner": {**watched, "watch": {**watched["watch"], "cores": {"other": 1.5}}}})
    assert torn_cores.state_dict()["tuner"] == _STATE_0_1_0


@pytest.mark.parametrize(("max_epochs", "span"), [(None, 8), (4, 4), (1, 1), (200, 8), (6, 6)])
def test_a_short_epoch_spans_the_fewest_epochs_that_hold_five_windows_or_the_most_allowed(
    max_epochs: int | None, span: int
) -> None:
    # 40-step epochs, windows of 12 steps: one epoch's 20 % (8 steps) holds none, two (16) one, eight (64) five.
    def make(epochs: int) -> Planner:
        return Planner(LoaderSettings(0), HostBudget(8, "cores"), TuneOptions(), epoch_steps=40, span_epochs=epochs)

    planner = spanning_planner(make, span_choices(max_epochs))
    assert planner.window == 12 and planner.span_epochs == span
    assert planner.can_start() == (span > 1)
    assert planner.budget_steps == int(0.2 * 40 * span)


@pytest.mark.parametrize(("epoch_steps", "span"), [(700, 1), (500, 2), (300, 3)])
def test_an_epoch_whose_budget_holds_five_windows_is_probed_within_epoch_0(epoch_steps: int, span: int) -> None:
    # Windows of 28 steps (4 of warm-up): five need 140 steps of probing, 20 % of 700.
    def make(epochs: int) -> Planner:
        return Planner(
            LoaderSettings(0), HostBudget(8, "cores"), TuneOptions(), epoch_steps=epoch_steps, span_epochs=epochs
        )

    assert spanning_planner(make, span_choices(None)).span_epochs == span


def test_a_window_that_failed_to_measure_on_one_rank_is_broken_on_every_rank() -> None:
    ranks = WindowRanks(steps=6, production=12)
    good, lost = ranks.row(window(50.0, 0.010, 0.02), failed=False), ranks.row(None, failed=False)
    assert len(good) == len(lost)  # every rank still meets the others in the gather, with a row of one length
    assert ranks.broken([good, lost]) and ranks.broken([lost, good]) and not ranks.broken([good, good])


@pytest.mark.parametrize("cap", [None, 12])
def test_a_producer_thousands_of_times_slower_than_the_step_costs_a_few_replays(
    cap: int | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Little's law asks for 500 workers (0.5 s a batch against a 1 ms step); searching every count up to four times
    # that by buffer replay took minutes inside one training step.
    from lightning_loadguard.tuning import search as search_module

    replays: list[int] = []

    def never_absorbed(*args: object) -> float:
        replays.append(1)
        return 1.0  # bursts no count absorbs: the scan's longest path

    monkeypatch.setattr(search_module, "replayed_wait", never_absorbed)
    budget = HostBudget(2, "cores", user_max_workers=cap)
    planner = Planner(LoaderSettings(1, 2), budget, FAST, epoch_steps=400)
    proposal = planner.record(window(2.0, 0.001, 0.5))
    assert proposal is not None
    assert proposal.num_workers <= (cap or search_module.MAX_SEARCH_WORKERS)
    assert len(replays) <= search_module.MAX_REPLAYS


def test_a_window_that_made_no_batch_is_shown_without_a_rate_and_joins_its_arm() -> None:
    # Measured again without a restart where the budget holds no further window, a window served from the batches
    # made before it says nothing of the rate: its row shows none (not 0 steps/s, which a reader takes for a dead
    # setting) and says why; the arm is the windows joined, so its rate is what the steps of both took.
    planner = Planner(LoaderSettings(1, 2), HostBudget(16, "cores"), FAST, epoch_steps=400)
    probe = planner.record(window(10.0, 0.010, 0.100))
    assert probe is not None
    planner.record(window(20.0, 0.010, 0.100))
    planner.continuing = True
    planner.current = probe
    planner.probe_steps = planner.budget_steps
    served = replace(window(80.0, 0.010, 0.100), batches_made=0)
    planner.record(served)
    row = planner.results[-1]
    assert row.setting == probe and row.rate is None and "made no batch" in row.note, row
    first = window(20.0, 0.010, 0.100)
    assert planner.arms[probe].windows == 2
    assert planner.arms[probe].rate == pytest.approx(first.steps / (first.loop_s + served.loop_s), rel=0.01)


def test_a_probe_whose_window_made_no_batch_is_measured_again_not_judged_at_zero() -> None:
    # Many fresh workers on slow batches: the probe's window can end before any of their next batches is made
    # (the loop only took what they made during the warm-up). That says nothing of the setting's rate.
    planner = Planner(LoaderSettings(1, 2), HostBudget(16, "cores"), FAST, epoch_steps=400)
    probe = planner.record(window(10.0, 0.010, 0.100))
    assert probe is not None and probe.num_workers > 1
    again = planner.record(replace(window(80.0, 0.010, 0.100), batches_made=0))
    assert again == probe and "its first window made no batch" in planner.current_note
    assert probe not in planner.arms  # nothing recorded at 0 steps/s
    planner.record(window(80.0, 0.010, 0.100))
    assert planner.arms[probe].rate == pytest.approx(80.0, rel=0.01)
    while (step := planner.record(window(80.0 if planner.current == probe else 10.0, 0.010, 0.100))) is not None:
        assert step is not None
    assert planner.decide().setting.num_workers >= probe.num_workers


# -- the tail's depth -------------------------------------------------------------------------------------


def _pareto_times(index: float, mean_s: float, count: int) -> tuple[float, ...]:
    """``count`` times at evenly spaced quantiles of a Pareto tail of ``index`` with mean ``mean_s`` (a heavy-tailed
    read: the longest of them many times the mean), in an order that spreads the long ones."""
    scale = mean_s * (index - 1) / index
    times = [scale * (1 - (k + 0.5) / count) ** (-1 / index) for k in range(count)]
    return tuple(times[(k * 7) % count] for k in range(count))


def _decide_on_times(
    production_s: tuple[float, ...],
    cpu_share: float,
    candidates: float,
    budget: HostBudget,
    original: LoaderSettings | None = None,
) -> tuple[Planner, TuneDecision]:
    """Drive a planner from ``original`` (else 1 worker at depth 2): your windows read 40 steps/s, every other setting
    ``candidates``, the loop's step 10 ms; each window's workers made ``production_s``, ``cpu_share`` of it on a
    core. The planner and its decision."""
    planner = Planner(original or LoaderSettings(1, 2), budget, NOISY, epoch_steps=2000)
    proposal: LoaderSettings | None = planner.original
    while proposal is not None:
        rate = 40.0 if proposal == planner.original else candidates
        steps = NOISY.window_steps
        assert steps is not None
        proposal = planner.record(
            WindowSnapshot(
                wait_s=(max(0.0, 1 / rate - 0.01),) * steps,
                step_s=(0.01,) * steps,
                production_s=production_s,
                production_cpu_s=tuple(t * cpu_share for t in production_s),
                batches_made=steps,
            )
        )
    return planner, planner.decide()


def test_a_heavy_tailed_read_gets_the_depth_its_tail_asks_for_at_the_chosen_count() -> None:
    # Reads of 50 ms on average with a Pareto tail of index 2.2, on workers that wait (2 % on a core), a 10 ms step:
    # a window of 24 steps sees none of the reads an epoch of 2,000 meets (1 in 1,000 takes over 20 x the mean), so
    # every count that keeps up reads alike. At the chosen count the depth is the one whose cover leaves the
    # expected wait of the true tail (its index and scale, not the fit) under 2 %.
    heavy = _pareto_times(2.2, 0.05, 24)
    planner, decision = _decide_on_times(heavy, 0.02, 100.0, HostBudget(64, "cores"))
    assert planner.chosen is not None and decision.verdict == "improved", decision.table()
    measured, workers = planner.chosen.setting.prefetch, decision.num_workers
    assert decision.prefetch_factor > measured, decision.table()
    assert "tail" in decision.reason and f"measured at {measured}" in decision.reason
    # The reason states the odds of a read outlasting each cover, and that they are a model's.
    assert "1 read in " in decision.reason and "outlasts the " in decision.reason and "a model" in decision.reason

    def true_wait(depth: int) -> float:  # E[max(0, X - cover)] of the Pareto itself, cover = depth x workers x 10 ms
        scale, cover = 0.05 * 1.2 / 2.2, depth * workers * 0.01
        return scale**2.2 * cover ** (1 - 2.2) / 1.2 / 0.01

    assert true_wait(decision.prefetch_factor) < 0.03 and true_wait(measured) > 0.02, decision.table()
    # The same reads computed (90 % on a core): more batches in flight would compute at once at an epoch's start.
    _, computed = _decide_on_times(heavy, 0.9, 100.0, HostBudget(64, "cores"))
    assert "tail" not in computed.reason and any(c.setting.same_loader(computed.setting) for c in computed.candidates)
    # Reads without a tail (all 50 ms): the depth measured.
    _, steady = _decide_on_times((0.05,) * 24, 0.02, 100.0, HostBudget(64, "cores"))
    assert steady.verdict == "improved" and "tail" not in steady.reason, steady.table()
    assert any(c.setting.same_loader(steady.setting) for c in steady.candidates)
    # Your settings kept (nothing read faster), their one worker short of the loop (20 batches/s against 100): kept as
    # they are, since no buffer hides a deficit.
    _, kept = _decide_on_times(heavy, 0.02, 40.0, HostBudget(64, "cores"))
    assert kept.setting.same_loader(kept.original), kept.table()
    # Memory holds 24 batches in flight: the depth stops at the wall.
    walled = HostBudget(64, "cores", max_in_flight=24, memory_bound="host_memory")
    _, at_wall = _decide_on_times(heavy, 0.02, 100.0, walled)
    assert at_wall.setting.batches_in_flight <= 24, at_wall.table()


def test_kept_settings_whose_workers_keep_up_get_the_depth_the_reads_tail_asks_for() -> None:
    # Your 16 workers keep up with a 10 ms step (reads of 50 ms on average: 320 batches/s against 100), so the loop
    # does not wait in any window and nothing is probed; an epoch of 2,000 steps still meets reads 20 x the mean,
    # longer than 32 batches in flight cover (320 ms). Your count is kept at the depth the tail asks for; where the
    # workers compute, or where the reads have no tail, your settings are kept as they are.
    steps = NOISY.window_steps
    assert steps is not None

    def decide(production_s: tuple[float, ...], cpu_share: float) -> TuneDecision:
        planner = Planner(LoaderSettings(16, 2), HostBudget(64, "cores"), NOISY, epoch_steps=2000)
        proposal: LoaderSettings | None = planner.original
        while proposal is not None:
            assert proposal == planner.original  # the loop does not wait: only your settings are measured
            proposal = planner.record(
                WindowSnapshot(
                    wait_s=(0.0,) * steps,
                    step_s=(0.01,) * steps,
                    production_s=production_s,
                    production_cpu_s=tuple(t * cpu_share for t in production_s),
                    batches_made=steps,
                )
            )
        return planner.decide()

    def true_wait(depth: int) -> float:  # the Pareto's own E[max(0, X - cover)], cover = depth x 16 workers x 10 ms
        scale, cover = 0.05 * 1.2 / 2.2, depth * 16 * 0.01
        return scale**2.2 * cover ** (1 - 2.2) / 1.2 / 0.01

    heavy = _pareto_times(2.2, 0.05, 24)
    deepened = decide(heavy, 0.02)
    assert deepened.verdict == "compute_bound" and deepened.num_workers == 16, deepened.table()
    assert deepened.prefetch_factor > 2 and "tail" in deepened.reason and "measured at 2" in deepened.reason
    assert true_wait(deepened.prefetch_factor) < 0.03 < true_wait(2), deepened.table()
    # The reason says your settings are kept with more in flight, not kept as they were.
    kept = "your settings are kept, with more batches in flight for the reads' tail; prefetch_factor="
    assert kept in deepened.reason, deepened.reason
    computed = decide(heavy, 0.9)
    assert computed.setting.same_loader(computed.original) and "tail" not in computed.reason, computed.table()
    steady = decide((0.05,) * 24, 0.02)
    assert steady.setting.same_loader(steady.original) and "tail" not in steady.reason, steady.table()
    assert steady.reason.endswith("your settings are kept"), steady.reason


def _workers_covering(index: float, threshold_s: float, share: float, period_s: float, depth: int) -> int:
    """The fewest workers whose ``depth`` batches each, one per step of ``period_s``, cover a Pareto tail (``share``
    of the reads from ``threshold_s`` on, of ``index``) so that the loop waits under 2 % of its time, solved in closed
    form: ``E[max(0, X - c)] = share * threshold * (c / threshold) ** (1 - index) / (index - 1)`` at most
    ``period * 0.02 / 0.98``."""
    excess = period_s * 0.02 / 0.98
    cover = threshold_s * (excess * (index - 1) / (share * threshold_s)) ** (1 / (1 - index))
    return math.ceil(cover / (period_s * depth))


def test_persistent_workers_grow_to_the_count_whose_batches_in_flight_cover_the_tail_the_depth_cannot() -> None:
    # A Pareto tail of index 3 from 100 ms (a quarter of the reads), a 10 ms step, depth 8: 8 workers hold 64 batches
    # (0.64 s), which leaves about 3 % waited; the closed form asks for 10.
    tail, period = Tail(index=3.0, threshold_s=0.1, share=0.25), 0.01
    needed = _workers_covering(3.0, 0.1, 0.25, period, 8)
    assert needed == 10
    widened, reason = tail_widened(tail, LoaderSettings(8, 8, persistent_workers=True), HostBudget(64, "cores"), 100.0)
    assert widened == LoaderSettings(needed, 8, persistent_workers=True)
    assert "num_workers=10 (measured at 8)" in reason and "by the reads' tail (index 3.0)" in reason
    odds = [f"{1 / tail.share_beyond(n * 8 * period):,.0f}" for n in (8, 10)]  # covers of 0.64 s and 0.8 s
    assert f"1 read in {odds[0]} outlasts the 640 ms that 64 batches" in reason
    assert f"1 in {odds[1]} the 800 ms that 80 cover with 10 persistent workers" in reason
    # Enough workers already: nothing changes, nothing is said.
    covered = LoaderSettings(needed, 8, persistent_workers=True)
    assert tail_widened(tail, covered, HostBudget(64, "cores"), 100.0) == (covered, "")
    # A tail of index 2 asks for 154 workers: twice the count measured, no more (a step the search would measure).
    heavier = Tail(index=2.0, threshold_s=0.1, share=0.25)
    assert _workers_covering(2.0, 0.1, 0.25, period, 8) == 154
    doubled, _ = tail_widened(heavier, LoaderSettings(4, 8, persistent_workers=True), HostBudget(64, "cores"), 100.0)
    assert doubled.num_workers == 8
    # The host's walls hold: the cores' budget, and memory for every worker's depth (72 batches: 9 workers at 8).
    walled, _ = tail_widened(tail, LoaderSettings(8, 8, persistent_workers=True), HostBudget(9, "cores"), 100.0)
    assert walled.num_workers == 9
    memory = HostBudget(64, "cores", max_in_flight=72, memory_bound="host_memory")
    at_memory, _ = tail_widened(tail, LoaderSettings(8, 8, persistent_workers=True), memory, 100.0)
    assert at_memory.num_workers == 9 and at_memory.batches_in_flight <= 72
    full = HostBudget(64, "cores", max_in_flight=64, memory_bound="host_memory")
    assert tail_widened(tail, LoaderSettings(8, 8, persistent_workers=True), full, 100.0)[1] == ""


def test_the_tail_adds_workers_only_where_they_persist() -> None:
    # The heavy-tailed read above with a heavier tail (index 1.8): the chosen count's deepest depth leaves it
    # uncovered. Your workers persist, and so do the candidates: the count grows past any measured. Where they start
    # anew each epoch, each extra worker's start would come back every epoch: the count measured, at its depth.
    heavy = _pareto_times(1.8, 0.05, 24)
    persistent = LoaderSettings(1, 2, persistent_workers=True)
    planner, grown = _decide_on_times(heavy, 0.02, 100.0, HostBudget(64, "cores"), persistent)
    assert planner.chosen is not None and grown.persistent_workers, grown.table()
    measured = planner.chosen.setting.num_workers
    assert grown.num_workers > measured and f"num_workers={grown.num_workers} (measured at {measured})" in grown.reason
    assert grown.prefetch_factor == 8 and grown.num_workers <= 2 * measured, grown.table()
    assert planner.arm_of(grown.setting) is planner.chosen  # re-tuning watches it by the count it measured
    planner, kept = _decide_on_times(heavy, 0.02, 100.0, HostBudget(64, "cores"))
    assert planner.chosen is not None and not kept.persistent_workers, kept.table()
    assert kept.num_workers == planner.chosen.setting.num_workers and kept.prefetch_factor == 8, kept.table()


def test_an_epoch_end_that_leaves_the_planned_candidate_no_room_measures_your_free_settings_again() -> None:
    # docs/tuning.md, Next window: an epoch's end dropped the open window, and the probe budget's rest no longer
    # holds the candidate planned (its steps, and the one step of the new epoch run under it, are spent); the
    # next window the procedure asks for that fits is your settings' second (they cost no probe steps), since a
    # setting replaces yours measured only once; where the candidate still fits, it is measured from there.
    def planned() -> tuple[Planner, LoaderSettings]:
        planner = Planner(LoaderSettings(0), HostBudget(8, "cores"), FAST, epoch_steps=40, span_epochs=4)
        first = planner.record(window(20.0, 0.010, 0.05))
        assert first is not None and first != planner.original
        second = planner.record(window(60.0, 0.010, 0.05))
        assert second is not None and second not in (planner.original, first)
        return planner, second

    planner, candidate = planned()
    planner.probe_steps = planner.budget_steps - planner.steps_for(candidate)  # the drop left exactly its room
    assert planner.after_epoch_end(ran=1) == candidate == planner.current
    assert planner.probe_steps == planner.budget_steps - planner.steps_for(candidate)  # its window holds the step

    planner, candidate = planned()
    spent = planner.probe_steps = planner.budget_steps - planner.steps_for(candidate) + 1
    assert planner.after_epoch_end(ran=1) == planner.original == planner.current
    assert planner.probe_steps == spent + 1 and not planner.continuing
    assert "your settings measured again" in planner.current_note
    planner.record(window(20.0, 0.010, 0.05))
    decision = planner.decide()
    assert decision.verdict == "improved" and decision.probe_steps <= decision.probe_budget_steps

    planner, candidate = planned()
    planner.probe_steps = planner.budget_steps - planner.steps_for(candidate) + 1
    # Your settings measured as often as an arm is: no window that fits could change the decision.
    planner.arms[planner.original] = replace(planner.arms[planner.original], windows=3)
    assert planner.after_epoch_end(ran=1) is None
    decision = planner.decide()
    assert decision.bounded_by == "probe_budget" and decision.probe_steps <= decision.probe_budget_steps
