"""The tuner's core without a Trainer: options, budgets, windows, the plan and the decision."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lightning_loadguard.meters.window import HostFacts
from lightning_loadguard.tuning.budget import Budget, cpu_worker_cap, host_budget
from lightning_loadguard.tuning.decision import PROFILE_LENGTH, Measurement, Setting, TuneDecision
from lightning_loadguard.tuning.options import TuneOptions
from lightning_loadguard.tuning.planner import Planner, model_only_decision

FAST = TuneOptions(warmup_steps=2, window_steps=6)


def window(rate: float, step_s: float, production_s: float | None, *, made: int | None = None, **kw) -> Measurement:
    steps = FAST.window_steps
    return Measurement(
        steps=steps,
        elapsed_s=steps / rate,
        made=steps if made is None else made,
        mean_step_s=step_s,
        mean_production_s=production_s,
        production_profile=(production_s,) * 8 if production_s else (),
        step_profile=(step_s,) * 8,
        mean_wait_s=max(0.0, 1.0 / rate - step_s),
        **kw,
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


# -- budgets -------------------------------------------------------------------------------------------


def test_host_budget_shares_memory_between_the_hosts_processes() -> None:
    host = HostFacts(cpu_count=16, processes_on_host=4, available_ram_bytes=800_000_000, shm_free_bytes=None)
    budget = host_budget(host, 10_000_000, memory_share=0.5, shm_share=0.8)
    assert budget.max_workers == 3 and budget.workers_bound == "cores"
    assert budget.max_in_flight == 10 and budget.memory_bound == "host_memory"
    assert budget.allows(3, 3) is None and budget.allows(3, 4) == "host_memory" and budget.allows(4, 1) == "cores"


def test_shm_bounds_when_it_is_the_smaller_limit() -> None:
    host = HostFacts(cpu_count=8, available_ram_bytes=10**12, shm_free_bytes=1_000_000)
    budget = host_budget(host, 100_000, memory_share=0.5, shm_share=0.8)
    assert (budget.max_in_flight, budget.memory_bound) == (8, "shm")


def test_user_cap_and_unknown_batch_size() -> None:
    budget = host_budget(HostFacts(cpu_count=64), None, memory_share=0.5, shm_share=0.8, max_workers=2)
    assert (budget.max_workers, budget.workers_bound, budget.max_in_flight) == (2, "max_workers", None)


def test_io_bound_workers_may_share_cores_but_cpu_bound_ones_may_not() -> None:
    host = HostFacts(cpu_count=2)
    io = host_budget(host, None, memory_share=0.5, shm_share=0.8, measured_workers=1, worker_cores=0.05, loop_cores=0.2)
    cpu = host_budget(
        host, None, memory_share=0.5, shm_share=0.8, measured_workers=1, worker_cores=0.98, loop_cores=0.2
    )
    assert io.max_workers == 14  # 8 per spare core at most, 1.8 spare cores
    assert cpu.max_workers == 1
    assert cpu_worker_cap(3, worker_cores=1.7, spare_cores=1.8) == 3  # saturated: never more


# -- windows -------------------------------------------------------------------------------------------


def test_a_draining_buffer_does_not_flatter_the_rate() -> None:
    drained = Measurement(steps=12, elapsed_s=0.12, made=4)
    assert drained.sustained_rate == pytest.approx(4 / 0.12)
    filling = Measurement(steps=12, elapsed_s=0.12, made=20)
    assert filling.sustained_rate == pytest.approx(100.0)


def test_ranks_combine_to_the_slowest_producer_and_the_real_compute() -> None:
    fast = window(50.0, 0.010, 0.02)
    slow = window(40.0, 0.014, 0.05, failed="BrokenPipeError")
    combined = Measurement.combine([fast, slow])
    assert combined.mean_step_s == 0.010 and combined.mean_production_s == 0.05
    assert combined.elapsed_s == slow.elapsed_s and combined.failed == "BrokenPipeError"
    assert Measurement.combine([fast]) is fast


def test_measurement_vector_round_trip() -> None:
    m = Measurement(
        steps=6,
        elapsed_s=0.3,
        made=None,
        mean_step_s=0.01,
        mean_production_s=0.02,
        production_profile=tuple(range(40)),
        step_profile=(0.01,),
        startup_s=0.2,
        worker_cores=0.5,
    )
    back = Measurement.from_vector(m.to_vector())
    assert back.made is None and back.loop_cores is None and back.worker_cores == 0.5
    assert back.production_profile == tuple(float(v) for v in range(40 - PROFILE_LENGTH, 40))
    assert back.failed is None and back.startup_s == 0.2


# -- the plan ------------------------------------------------------------------------------------------


def test_compute_bound_keeps_the_settings_without_probing() -> None:
    planner = Planner(Setting(2, 2), Budget(7, "cores"), FAST, epoch_steps=400)
    assert planner.record(window(98.0, 0.010, 0.015)) is None
    decision = planner.decide()
    assert decision.verdict == "compute_bound" and decision.setting == Setting(2, 2)
    assert decision.probe_steps == 0 and decision.probe_cost_s == 0.0


def test_a_slower_candidate_never_replaces_the_original() -> None:
    planner = Planner(Setting(1, 2), Budget(7, "cores"), FAST, epoch_steps=400)
    proposal = planner.record(window(30.0, 0.010, 0.033))
    assert proposal is not None and proposal.num_workers > 1
    # Contention: more workers measured slower, then the one between as well.
    while proposal is not None:
        proposal = planner.record(window(25.0, 0.010, 0.2))
    decision = planner.decide()
    assert decision.setting == Setting(1, 2) and decision.verdict == "no_gain"
    assert decision.throughput_after == decision.throughput_before
    assert decision.remaining_deficit == pytest.approx(0.7)


def test_within_noise_is_not_an_improvement() -> None:
    planner = Planner(Setting(1, 2), Budget(7, "cores"), FAST, epoch_steps=400)
    planner.record(window(30.0, 0.010, 0.033))
    planner.record(window(31.0, 0.010, 0.1))
    assert planner.decide().setting == Setting(1, 2)


def test_the_fastest_candidate_wins_and_the_deficit_left_is_reported() -> None:
    planner = Planner(Setting(0), Budget(3, "cores"), FAST, epoch_steps=400)
    proposal = planner.record(window(20.0, 0.010, 0.05))
    assert proposal == Setting(3, 2)  # Little's law asks for 6; the cores are predicted to allow 3
    # 3 workers paid: a fourth is measured past the predicted limit, and found no faster.
    assert planner.record(window(60.0, 0.010, 0.05)) == Setting(4, 2)
    assert planner.record(window(61.0, 0.010, 0.066)) is None
    decision = planner.decide()
    assert decision.verdict == "improved" and decision.num_workers == 3
    assert decision.remaining_deficit == pytest.approx(0.4) and decision.bounded_by == "cores"
    assert "4 workers measured 61 steps/s against 60, less than 5% more" in decision.reason
    assert decision.throughput_before == pytest.approx(20.0) and decision.throughput_after == pytest.approx(60.0)


def test_a_failed_candidate_is_never_chosen() -> None:
    planner = Planner(Setting(1, 2), Budget(7, "cores"), FAST, epoch_steps=400)
    proposal = planner.record(window(30.0, 0.010, 0.033))
    assert proposal is not None
    planner.record(window(99.0, 0.010, 0.033, failed="RuntimeError: worker killed"))
    decision = planner.decide()
    assert decision.num_workers == 1
    assert [c.failed for c in decision.candidates] == [None, "RuntimeError: worker killed"]


def test_bursts_get_a_deeper_buffer() -> None:
    planner = Planner(Setting(2, 2), Budget(2, "cores"), FAST, epoch_steps=400)
    bursty = Measurement(
        steps=6,
        elapsed_s=6 / 70,
        made=6,
        mean_step_s=0.01,
        mean_production_s=0.011,
        mean_wait_s=0.004,
        production_profile=(0.002,) * 7 + (0.07,),
        step_profile=(0.01,) * 8,
    )
    proposal = planner.record(bursty)
    assert proposal is not None and proposal.num_workers == 2 and proposal.prefetch_factor > 2


def test_the_probe_budget_is_a_share_of_the_epoch() -> None:
    planner = Planner(Setting(0), Budget(64, "cores"), FAST, epoch_steps=100)
    assert planner.budget_steps == 20 and planner.can_start()
    proposal = planner.record(window(10.0, 0.010, 0.1))
    rate = 10.0
    while proposal is not None:
        rate *= 1.5
        proposal = planner.record(window(rate, 0.010, 0.1))
    decision = planner.decide()
    assert decision.probe_steps <= decision.probe_budget_steps == 20
    assert decision.bounded_by == "probe_budget"
    assert not Planner(Setting(0), Budget(4, "cores"), FAST, epoch_steps=30).can_start()


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
    budget = Budget(max_workers, "cores", max_in_flight=max_in_flight, memory_bound="host_memory")
    original = Setting(start, 1 if start else None)
    planner = Planner(original, budget, FAST, epoch_steps=1000)
    proposal = planner.record(window(rates[0], step, production))
    measured = {original: rates[0]}
    for rate in rates[1:]:
        if proposal is None:
            break
        # Memory is a wall: never probed past. Cores are a prediction: one worker at a time past it, and
        # only after the most workers measured so far paid.
        assert budget.breaks_wall(proposal.num_workers, proposal.prefetch_factor) is None
        if budget.allows(proposal.num_workers, proposal.prefetch_factor) is not None:
            fewer = {s: r for s, r in measured.items() if s.num_workers < proposal.num_workers}
            assert not fewer or max(s.num_workers for s in fewer) == proposal.num_workers - 1
        measured[proposal] = rate
        proposal = planner.record(window(rate, step, production * max(1, proposal.num_workers)))
    decision = planner.decide()
    assert decision.throughput_after is not None and decision.throughput_before is not None
    assert decision.throughput_after >= decision.throughput_before
    assert decision.probe_steps <= decision.probe_budget_steps
    if decision.setting != original:
        assert decision.throughput_after >= decision.throughput_before * (1 + FAST.min_gain)


def test_iterable_datasets_only_get_a_deeper_buffer_from_the_model() -> None:
    bursty = Measurement(
        steps=6,
        elapsed_s=0.1,
        made=6,
        mean_step_s=0.01,
        mean_production_s=0.011,
        production_profile=(0.002,) * 7 + (0.07,),
        step_profile=(0.01,) * 8,
    )
    decision = model_only_decision(Setting(2, 2), Budget(8, "cores"), FAST, bursty, "iterable")
    assert decision.num_workers == 2 and decision.prefetch_factor > 2 and decision.verdict == "model_only"
    assert decision.throughput_after is None
    tight = Budget(8, "cores", max_in_flight=6, memory_bound="shm")
    bounded = model_only_decision(Setting(2, 2), tight, FAST, bursty, "iterable")
    assert bounded.prefetch_factor == 3 and bounded.bounded_by == "shm"


def test_decision_round_trips_through_plain_data() -> None:
    planner = Planner(Setting(0), Budget(3, "cores"), FAST, epoch_steps=400)
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
    planner = Planner(Setting(0), Budget(12, "cores"), FAST, epoch_steps=400)
    m = Measurement(
        steps=6,
        elapsed_s=0.3,
        made=6,
        mean_step_s=0.01,
        mean_production_s=sum(burst) / 8,
        mean_wait_s=0.04,
        production_profile=burst,
        step_profile=(0.01,) * 8,
    )
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
    planner = Planner(Setting(0), Budget(1, "cores"), FAST, epoch_steps=600)
    probed = _search(planner, measure, 0.016)
    assert probed[:3] == [0, 1, 2] and max(probed) == 3  # a deeper buffer for 2 workers may come first
    decision = planner.decide()
    assert decision.num_workers == 2 and decision.bounded_by == "cores"
    assert "3 workers measured 79 steps/s against 80" in decision.reason


def test_past_the_core_limit_a_worker_that_slows_the_step_is_not_kept() -> None:
    # The step computes on the CPU: the second worker raised throughput a little but took the step's core.
    measure = {0: (38.0, 0.010), 1: (60.0, 0.010), 2: (66.0, 0.013)}
    planner = Planner(Setting(0), Budget(1, "cores"), FAST, epoch_steps=600)
    assert _search(planner, measure, 0.016) == [0, 1, 2]
    decision = planner.decide()
    assert decision.num_workers == 1 and decision.bounded_by == "cores"
    assert "2 workers slowed the step itself to 13 ms" in decision.reason


def test_no_worker_past_the_limit_when_the_last_one_did_not_pay() -> None:
    measure = {1: (60.0, 0.010), 2: (61.0, 0.010)}
    planner = Planner(Setting(1, 2), Budget(2, "cores"), FAST, epoch_steps=600)
    assert _search(planner, measure, 0.030) == [1, 2]
    assert planner.decide().num_workers == 1


@pytest.mark.parametrize(
    "budget",
    [
        Budget(1, "cores", max_in_flight=1, memory_bound="shm"),  # 2 workers hold 2 batches at least
        Budget(1, "cores", user_max_workers=1),
        Budget(1, "max_workers"),
    ],
)
def test_memory_and_the_users_cap_are_walls_even_when_more_workers_would_pay(budget: Budget) -> None:
    measure = {0: (38.0, 0.010), 1: (60.0, 0.010), 2: (80.0, 0.010)}
    planner = Planner(Setting(0), budget, FAST, epoch_steps=600)
    probed = _search(planner, measure, 0.016)
    assert max(probed) == 1


def test_the_probe_cost_line_adds_up_with_the_table() -> None:
    measure = {0: (38.0, 0.010), 1: (60.0, 0.010), 2: (80.0, 0.010), 3: (79.0, 0.010)}
    planner = Planner(Setting(0), Budget(1, "cores"), FAST, epoch_steps=600)
    _search(planner, measure, 0.016)
    decision = planner.decide()
    probed_rows = decision.candidates[1:]
    assert decision.probe_steps == sum(c.steps for c in probed_rows)
    assert f"probe cost: {decision.probe_steps} steps in the {len(probed_rows)} probed rows" in decision.table()
