"""The forecast against figures worked out here by hand from the facts it is fed (never the package's own functions).

Steady-state truth for constant times: a step of ``x`` seconds plus a hand-over of ``h`` per fetch, ``W`` workers
taking ``y`` seconds per batch: each step's period is ``max(x + h, y / W)`` (the slower stage paces the loop, a
buffer of any depth hides nothing more), and the wait is that period less ``x``. Without workers the period is
``x + y``. Cores: ``r`` ranks each spending ``c`` CPU seconds per step can run at most ``A / (r c)`` steps/s on
``A`` free cores.
"""

from __future__ import annotations

import json
import math
from statistics import fmean, pstdev

import pytest
from buffer_oracle import brute_force_depth

from lightning_loadguard.meters.cpu import CpuUse
from lightning_loadguard.meters.settings import LoaderSettings
from lightning_loadguard.meters.window import HostFacts, WindowSnapshot
from lightning_loadguard.model.capacity import PREFETCH_TOLERANCE
from lightning_loadguard.model.forecast import (
    Estimate,
    Forecast,
    ForecastFacts,
    WhatIf,
    facts_from_window,
    forecast,
    parse_what_if,
)


def _facts(**overrides: object) -> ForecastFacts:
    base: dict[str, object] = dict(
        production_s=(0.016,) * 64,
        step_s=(0.020,) * 64,
        num_workers=1,
        prefetch_factor=2,
        cpu_share=1.0,
        batch_cpu_s=0.016,
        step_cpu_s=0.0,
        handover_s=0.0,
        usable_cores=8.0,
        host_cores=8,
    )
    base.update(overrides)
    return ForecastFacts(**base)  # type: ignore[arg-type]


def _steady(x: float, y: float, workers: int, h: float = 0.0) -> tuple[float, float]:
    """(throughput, wait fraction) of constant times, worked out by hand."""
    period = x + y if workers == 0 else max(x + h, y / workers)
    return 1.0 / period, (period - x) / period


@pytest.mark.parametrize(
    ("what_if", "x", "y", "workers"),
    [
        (WhatIf(), 0.020, 0.016, 1),  # as measured: the step paces the loop
        (WhatIf(step_speedup=2.0), 0.010, 0.016, 1),  # the worker cannot keep up
        (WhatIf(step_speedup=0.5), 0.040, 0.016, 1),
        (WhatIf(step_speedup=2.0, num_workers=2), 0.010, 0.016, 2),
        (WhatIf(num_workers=0), 0.020, 0.016, 0),  # loading in the loop: the two add up
        (WhatIf(batch_scale=2.0), 0.040, 0.032, 1),
        (WhatIf(batch_scale=2.0, step_speedup=4.0), 0.010, 0.032, 1),
    ],
)
def test_throughput_and_wait_match_the_steady_state_worked_out_by_hand(
    what_if: WhatIf, x: float, y: float, workers: int
) -> None:
    result = forecast(_facts(), what_if)
    rate, wait = _steady(x, y, workers)
    assert result.throughput.value == pytest.approx(rate, rel=1e-6)
    assert result.wait_fraction.value == pytest.approx(wait, abs=1e-6)
    # Constant times: no spread, no margin.
    assert result.throughput.margin == pytest.approx(0.0, abs=1e-9)


def test_the_hand_over_is_paid_on_every_fetch_and_counts_as_wait() -> None:
    result = forecast(_facts(handover_s=0.002))
    rate, wait = _steady(0.020, 0.016, 1, h=0.002)
    assert result.throughput.value == pytest.approx(rate, rel=1e-6)  # 1 / 22 ms
    assert result.wait_fraction.value == pytest.approx(wait, abs=1e-6)  # 2 / 22
    assert result.consumer_rate == pytest.approx(1 / 0.022)
    # A batch twice the size takes twice as long to hand over, as to make and to step on.
    doubled = forecast(_facts(handover_s=0.002), WhatIf(batch_scale=2.0))
    assert doubled.consumer_rate == pytest.approx(1 / (2 * 0.020 + 2 * 0.002))


def test_workers_needed_follow_littles_law_with_a_fifth_spare() -> None:
    # A 10 ms step wants 100 batches/s; 16 ms per batch: 1.6 busy workers, x 1.2 = 1.92: 2 workers.
    assert forecast(_facts(), WhatIf(step_speedup=2.0)).workers_needed == 2
    # A 5 ms step: 3.2 busy, x 1.2 = 3.84: 4.
    assert forecast(_facts(), WhatIf(step_speedup=4.0)).workers_needed == 4


def test_the_prefetch_needed_absorbs_the_bursts_as_a_brute_force_replay_finds() -> None:
    # Every 15th batch takes 300 ms, the rest 10 ms, against a 20 ms step: the workers Little's law asks for keep
    # up on the mean, and the depth is the smallest whose replayed wait is near a deep buffer's (every depth
    # tried in an oracle written apart from the package).
    production = ([0.010] * 14 + [0.300]) * 8
    result = forecast(_facts(production_s=tuple(production), batch_cpu_s=0.029), WhatIf())
    workers = result.workers_needed
    assert workers >= 1 and result.prefetch_needed is not None
    truth = brute_force_depth(production, [0.020], workers, PREFETCH_TOLERANCE)
    assert abs(result.prefetch_needed - truth) <= 1, (result.prefetch_needed, truth, workers)
    # Constant batches need no depth beyond the smallest.
    assert forecast(_facts(), WhatIf(step_speedup=2.0)).prefetch_needed == 1


def test_ranks_that_want_more_cores_than_there_are_share_them() -> None:
    # Two ranks, two workers each computing 16 ms per batch, a step that waits on an accelerator (no CPU), on
    # 1 core and nothing else: it carries 1 / (2 x 0.016) = 31.25 steps/s per rank.
    facts = _facts(num_workers=2, usable_cores=1.0, host_cores=1)
    result = forecast(facts, WhatIf(ranks_per_node=2))
    carried = 1.0 / (2 * 0.016)
    assert result.throughput.value == pytest.approx(carried, rel=1e-3)
    assert result.wait_fraction.value == pytest.approx(1 - carried * 0.020, abs=1e-3)
    assert result.limited_by == "cores" and result.binds_first == "cores" and not result.holds
    assert result.loads["cores"] == pytest.approx(2 * 50 * 0.016 / 1.0)
    assert result.worker_processes == 4


# A busy host, as measured: one worker computing 16 ms per batch waited as long again for a core (half its busy
# time queued: the measured 32 ms batch), for a 20 ms step that waits on an accelerator; other work used 1.5 of
# the 2 cores. The worker used 0.5 cores (31.25 batches/s x 16 ms): the host was full. A runnable thread got half
# a core, so other work kept 1.5 x 2 = 3 threads runnable.
BUSY = dict(production_s=(0.032,) * 64, production_queued_share=0.5, usable_cores=2.0, host_cores=2, other_cores=1.5)


def test_on_a_busy_host_the_measured_run_is_forecast_as_measured() -> None:
    result = forecast(_facts(**BUSY))
    assert result.throughput.value == pytest.approx(1 / 0.032, rel=1e-3)
    assert result.slowdown == pytest.approx(2.0, rel=1e-3)


def test_more_ranks_on_a_busy_host_get_their_fair_share_of_the_cores() -> None:
    # Two workers and 3 other threads runnable on 2 cores: each gets 2 / 5 of a core, a 16 ms batch takes 40 ms.
    result = forecast(_facts(**BUSY), WhatIf(ranks_per_node=2))
    assert result.throughput.value == pytest.approx(1 / 0.040, rel=1e-3)
    assert result.wait_fraction.value == pytest.approx(1 - 0.020 / 0.040, abs=1e-3)
    assert result.limited_by == "cores"


def test_one_usable_core_keeps_other_work_at_its_share_of_each_cpu() -> None:
    # On 1 of the 2 CPUs other work keeps half its 3 threads: 1.5 of them and the worker share the core (1 / 2.5).
    result = forecast(_facts(**BUSY), WhatIf(usable_cores=1.0))
    assert result.throughput.value == pytest.approx(1 / (0.016 * 2.5), rel=1e-3)
    assert result.available_cores == pytest.approx(1.0 - 0.75)
    # A node of its own: no other work, the worker keeps up with the step.
    alone = forecast(_facts(**BUSY), WhatIf(other_cores=0.0))
    assert alone.throughput.value == pytest.approx(1 / 0.020, rel=1e-3)
    assert alone.slowdown == 1.0 and alone.limited_by == "step"


def test_a_computing_step_slows_with_the_loading_under_processor_sharing() -> None:
    # In-process loading on 1 core, two ranks: each step computes 20 ms and makes its batch (16 ms of CPU): the
    # core carries 1 / (2 x 0.036) = 13.9 steps/s per rank, and the wait keeps its share (both parts slow alike).
    facts = _facts(num_workers=0, step_cpu_s=0.020, usable_cores=1.0, host_cores=1)
    result = forecast(facts, WhatIf(ranks_per_node=2))
    assert result.throughput.value == pytest.approx(1 / (2 * 0.036), rel=1e-3)
    assert result.wait_fraction.value == pytest.approx(0.016 / 0.036, abs=1e-3)
    assert result.limited_by == "loading in the loop"


def test_the_hand_over_is_carried_into_a_what_if_slowed_with_the_cores_only() -> None:
    # forecast.md: the measured hand-over carries over, slowed by the cores' fair share (against the slow-down it
    # was measured at), never by the step's speed-up or the count of ranks.
    # A free node: 4 ranks of 2 workers (5.3 of the 8 cores busy), a step twice as fast: the 2 ms stays 2 ms.
    free = forecast(_facts(num_workers=2, handover_s=0.002), WhatIf(ranks_per_node=4, step_speedup=2.0))
    rate, wait = _steady(0.010, 0.016, 2, h=0.002)
    assert free.slowdown == 1.0
    assert free.throughput.value == pytest.approx(rate, rel=1e-6)  # 1 / 12 ms, not 1 / 11 ms nor 1 / 18 ms
    assert free.wait_fraction.value == pytest.approx(wait, abs=1e-6)
    # The busy host, measured at a slow-down of 2: two ranks, or one usable core, leave each thread 2 / 5 of a core
    # (s = 2.5: s (cores - training CPU) = other threads, with the workers' CPU 1 / s of a core each, as the tests
    # above work out); the hand-over takes 2 ms x 2.5 / 2, the step 10 ms (it waits on an accelerator).
    for what_if in (WhatIf(ranks_per_node=2, step_speedup=2.0), WhatIf(usable_cores=1.0, step_speedup=2.0)):
        busy = forecast(_facts(**BUSY, handover_s=0.002), what_if)
        assert busy.slowdown == pytest.approx(2.5, rel=1e-3), what_if
        assert busy.consumer_rate == pytest.approx(1 / (0.010 + 0.002 * 2.5 / 2), rel=1e-3), what_if
    # A 30 ms hand-over on the busy host paces two ranks: each loop takes 20 ms + s x 15 ms a step, each worker
    # 16 ms of CPU a batch, so s (2 - 2 x 0.016 / (0.020 + 0.015 s)) = 3: 0.030 s^2 - 0.037 s - 0.060 = 0.
    s = (0.037 + math.sqrt(0.037**2 + 4 * 0.030 * 0.060)) / (2 * 0.030)  # 2.16
    paced = forecast(_facts(**BUSY, handover_s=0.030), WhatIf(ranks_per_node=2))
    assert paced.slowdown == pytest.approx(s, rel=1e-3)
    assert paced.throughput.value == pytest.approx(1 / (0.020 + 0.015 * s), rel=1e-3)
    assert paced.wait_fraction.value == pytest.approx(0.015 * s / (0.020 + 0.015 * s), abs=1e-3)


def test_memory_is_every_ranks_full_queues_against_half_the_ram_and_most_of_the_shm() -> None:
    facts = _facts(batch_bytes=3_000_000, available_ram_bytes=400_000_000, shm_free_bytes=200_000_000)
    result = forecast(facts, WhatIf(ranks_per_node=8, num_workers=4, prefetch_factor=3, batch_scale=2.0))
    inflight = 8 * 4 * 3 * 6_000_000  # ranks x workers x prefetch x bytes: 576 MB
    assert result.inflight_bytes is not None and result.inflight_bytes.value == inflight
    assert result.loads["host_memory"] == pytest.approx(inflight / (0.5 * 400_000_000))
    assert result.loads["shm"] == pytest.approx(inflight / (0.8 * 200_000_000))
    assert result.binds_first == "shm" and not result.holds
    pinned = forecast(facts, WhatIf(num_workers=4, prefetch_factor=3, pin_memory=True))
    assert pinned.inflight_bytes is not None and pinned.inflight_bytes.value == (4 * 3 + 1) * 3_000_000
    # What the user says the node has replaces what this host had.
    roomy = forecast(
        facts,
        WhatIf(
            ranks_per_node=8,
            num_workers=4,
            prefetch_factor=3,
            shm_free_bytes=10**10,
            available_ram_bytes=10**10,
            usable_cores=64.0,
        ),
    )
    assert roomy.binds_first is None and roomy.holds


def test_in_flight_memory_is_counted_as_every_ranks_queue_capacity_and_a_pinned_copy_each() -> None:
    # forecast.md: counted, not estimated: ranks x workers x prefetch (+1 pinned) of the batch's bytes, with no
    # margin even where the run drifted, and nothing for the batch the loop holds.
    facts = _facts(step_s=tuple([0.015] * 8 + [0.025] * 8) * 4, batch_bytes=1_000_000)
    plain = forecast(facts, WhatIf(ranks_per_node=3, num_workers=4, prefetch_factor=2))
    assert plain.throughput.margin > 0
    assert plain.inflight_bytes == Estimate(3 * 4 * 2 * 1e6, 3 * 4 * 2 * 1e6, 3 * 4 * 2 * 1e6)
    pinned = forecast(facts, WhatIf(ranks_per_node=3, num_workers=4, prefetch_factor=2, pin_memory=True))
    assert pinned.inflight_bytes is not None and pinned.inflight_bytes.value == 3 * (4 * 2 + 1) * 1e6
    # What is queued on average never exceeds the capacity.
    assert plain.queued_bytes is not None and plain.queued_bytes.high <= plain.inflight_bytes.value


def test_a_real_loaders_made_batches_are_the_forecasts_in_flight_count_plus_the_one_the_loop_holds() -> None:
    # forecast.md: in-flight memory is the prefetch queues' capacity, and the batch the loop holds adds to it. A
    # torch DataLoader whose loop holds a batch: its workers make batches until the queues are full, then stop (a
    # worker collates only into the slot a taken batch freed, so that batch is within the capacity).
    import multiprocessing
    import time

    from torch.utils.data import DataLoader, default_collate

    made = multiprocessing.get_context("fork").Value("i", 0)

    def counted(samples: list[int]) -> object:
        batch = default_collate(samples)
        with made.get_lock():
            made.value += 1
        return batch

    def settled(count: int) -> int:
        deadline = time.monotonic() + 10.0
        while made.value < count and time.monotonic() < deadline:
            time.sleep(0.005)
        time.sleep(0.2)  # long enough for a worker to make one more tiny batch, were a slot free
        return int(made.value)

    workers, prefetch = 2, 3
    loader = DataLoader(
        [float(i) for i in range(64)],
        batch_size=4,
        num_workers=workers,
        prefetch_factor=prefetch,
        collate_fn=counted,
        multiprocessing_context="fork",
    )
    batches = iter(loader)
    try:
        held = next(batches)
        assert settled(workers * prefetch + 1) == workers * prefetch + 1
        held = next(batches)  # the first is let go; its slot is filled again
        assert settled(workers * prefetch + 2) == workers * prefetch + 2
    finally:
        del batches  # stops the workers
    batch_bytes = held.element_size() * held.numel()
    figure = forecast(_facts(batch_bytes=batch_bytes), WhatIf(num_workers=workers, prefetch_factor=prefetch))
    # The batches made and not yet taken are what the forecast counts in flight.
    assert figure.inflight_bytes is not None and figure.inflight_bytes.value == (made.value - 2) * batch_bytes


def test_the_margin_spans_two_standard_deviations_of_the_block_means() -> None:
    # Production drifts between 16 ms and 24 ms blocks (mean 20 ms); a 10 ms step: the worker paces the loop.
    production = tuple([0.016] * 8 + [0.024] * 8) * 4
    blocks = [fmean(production[i * 8 : (i + 1) * 8]) for i in range(8)]
    spread = pstdev(blocks) / fmean(production)  # 0.2
    result = forecast(_facts(production_s=production, step_s=(0.010,) * 64))
    mean = fmean(production)
    assert result.throughput.low == pytest.approx(1 / (mean * (1 + 2 * spread)), rel=0.02)
    assert result.throughput.high == pytest.approx(1 / (mean * (1 - 2 * spread)), rel=0.02)
    assert result.throughput.low < result.throughput.value < result.throughput.high
    assert result.wait_fraction.low < result.wait_fraction.value < result.wait_fraction.high


def test_the_margin_spans_two_standard_deviations_of_the_step_times_block_means() -> None:
    # The step drifts between 15 ms and 25 ms blocks (mean 20 ms, block means 5 ms apart from it: a spread of 0.25);
    # production is constant (no spread of its own) at 16 ms for one worker. Two standard deviations scale the
    # steps by 0.5 and by 1.5. At 0.5 every step (7.5 or 12.5 ms) is shorter than a batch: the worker paces the
    # loop at 1 / 16 ms, and each step waits 16 ms less its own, 6 ms of 16 on average. At 1.5 every step (22.5 or
    # 37.5 ms) outlasts a batch: the step paces at 1 / 30 ms and never waits.
    step = tuple([0.015] * 8 + [0.025] * 8) * 4
    facts = _facts(step_s=step)
    blocks = [fmean(step[i * 8 : (i + 1) * 8]) for i in range(8)]
    assert pstdev(blocks) / fmean(step) == pytest.approx(0.25)
    assert facts.production_spread == 0.0 and facts.other_cores_spread == 0.0  # the step's spread alone
    result = forecast(facts)
    assert result.throughput.low == pytest.approx(1 / 0.030, rel=1e-3)
    assert result.throughput.high == pytest.approx(1 / 0.016, rel=1e-3)
    assert result.wait_fraction.low == pytest.approx(0.0, abs=1e-3)
    assert result.wait_fraction.high == pytest.approx(0.006 / 0.016, abs=1e-3)


def test_the_margin_spans_two_standard_deviations_of_other_works_use_over_windows() -> None:
    # The busy host (BUSY above: 3 threads of other work at the measured slow-down of 2), with other work's use
    # spread by 0.25 of a core over the windows: two standard deviations are 0.5 of a core, 1 thread either way.
    # One worker computing 16 ms a batch on 2 cores with n other threads runs at s (2 - 1 / s) = n, i.e.
    # s = (n + 1) / 2: 2 threads give s = 1.5 (24 ms a batch, still slower than the 20 ms step: 1 / 24 ms, a wait
    # of 4 / 24); 4 threads give s = 2.5 (40 ms a batch: 1 / 40 ms, a wait of 20 / 40).
    facts = _facts(**BUSY, other_cores_spread=0.25)
    assert facts.production_spread == 0.0 and facts.step_spread == 0.0  # other work's spread alone
    result = forecast(facts)
    assert result.throughput.value == pytest.approx(1 / 0.032, rel=1e-3)  # as measured: 3 threads, s = 2
    assert result.throughput.low == pytest.approx(1 / 0.040, rel=1e-3)
    assert result.throughput.high == pytest.approx(1 / 0.024, rel=1e-3)
    assert result.wait_fraction.low == pytest.approx(0.004 / 0.024, abs=1e-3)
    assert result.wait_fraction.high == pytest.approx(0.020 / 0.040, abs=1e-3)
    # Where the user names the other work, there is no measured drift to span.
    named = forecast(facts, WhatIf(other_cores=1.5))
    assert named.throughput.low == named.throughput.value == named.throughput.high


def test_a_spread_over_half_the_mean_takes_the_low_times_to_zero_not_below() -> None:
    # Production drifts between 5 ms and 35 ms blocks (mean 20 ms, spread 0.75): two standard deviations below
    # the mean is less than no time. The fast end is batches made at no cost, where the 10 ms step paces the loop
    # (1 / 10 ms); the slow end scales every batch by 2.5 (12.5 or 87.5 ms, each slower than the step): the one
    # worker paces the loop at its mean, 1 / 50 ms. Forecasting a negative time raised ValueError here before.
    production = tuple([0.005] * 8 + [0.035] * 8) * 4
    result = forecast(_facts(production_s=production, step_s=(0.010,) * 64, batch_cpu_s=0.020))
    assert result.throughput.low == pytest.approx(1 / 0.050, rel=1e-3)
    assert result.throughput.high == pytest.approx(1 / 0.010, rel=1e-3)
    assert result.wait_fraction.low == pytest.approx(0.0, abs=1e-3)


def test_the_settings_hold_only_while_the_wait_stays_below_five_percent() -> None:
    # Nothing binds: one worker makes a batch in 16 ms for a 20 ms step (a load of about 0.7), the cores are
    # barely used and memory is not counted. The hand-over alone sets the wait: h / (20 ms + h). 1 ms waits
    # 1 / 21 = 4.8 % of the time, 1.1 ms waits 1.1 / 21.1 = 5.2 %.
    for handover, wait, holds in ((0.0010, 1 / 21, True), (0.0011, 1.1 / 21.1, False)):
        result = forecast(_facts(handover_s=handover))
        assert result.wait_fraction.value == pytest.approx(wait, abs=1e-6)
        assert max(result.loads.values()) < 1 and result.binds_first is None, result.loads
        assert result.holds is holds, (handover, result.wait_fraction.value)
    assert "the loop waits for data" in forecast(_facts(handover_s=0.0011)).sentence()


def test_facts_are_read_from_a_window_as_measured() -> None:
    # Two workers; fetches 1, 3 and 4 found their batch made (waits 2, 4, 6 ms): a hand-over of 4 ms.
    use = CpuUse(window_s=1.0, usable_cores=2.0, host_cores=2, loop_cores=0.2, worker_cores=1.0, busy_cores=1.9)
    snap = WindowSnapshot(
        wait_s=(0.002, 0.030, 0.004, 0.006),
        step_s=(0.020,) * 4,
        settings=LoaderSettings(num_workers=2, prefetch_factor=3, batch_size=16),
        host=HostFacts(cpu_count=2, processes_on_host=1, available_ram_bytes=10**9, shm_free_bytes=10**8),
        ready=(True, False, True, True),
        production_s=(0.040, 0.040),
        production_cpu_s=(0.020, 0.020),
        batch_bytes=1234,
        cpu=use,
    )
    facts = facts_from_window(snap)
    assert facts.handover_s == pytest.approx(0.004)
    assert facts.cpu_share == pytest.approx(0.5) and facts.batch_cpu_s == pytest.approx(0.020)
    period = (0.042 + 0.080) / 4  # the window's loop time per step
    assert facts.step_cpu_s == pytest.approx(0.2 * period)
    assert facts.other_cores == pytest.approx(1.9 - 1.2)
    assert (facts.num_workers, facts.prefetch_factor, facts.batch_size, facts.batch_bytes) == (2, 3, 16, 1234)
    assert facts.throughput == pytest.approx(1 / period)
    # Through a log and back: the same facts.
    assert ForecastFacts.from_dict(json.loads(json.dumps(facts.to_dict()))) == facts


@pytest.mark.parametrize(
    ("arguments", "named"),
    [
        ({"ranks_per_node": 0}, "ranks_per_node"),
        ({"ranks_per_node": 2.5}, "ranks_per_node"),
        ({"step_speedup": 0.0}, "step_speedup"),
        ({"step_speedup": math.inf}, "step_speedup"),
        ({"batch_scale": -1.0}, "batch_scale"),
        ({"usable_cores": 0}, "usable_cores"),
        ({"num_workers": -1}, "num_workers"),
        ({"prefetch_factor": 0}, "prefetch_factor"),
        ({"pin_memory": "yes"}, "pin_memory"),
        ({"shm_free_bytes": -5}, "shm_free_bytes"),
    ],
)
def test_bad_what_if_values_are_refused_naming_the_argument_and_what_it_allows(
    arguments: dict[str, object], named: str
) -> None:
    with pytest.raises(ValueError, match=rf"^{named} must be .+; got "):
        WhatIf(**arguments)  # type: ignore[arg-type]


def test_the_command_line_form_parses_and_refuses_by_name() -> None:
    parsed = parse_what_if("ranks_per_node=8, step_speedup=2,shm_free_bytes=1.5G,pin_memory=true")
    assert parsed == WhatIf(ranks_per_node=8, step_speedup=2.0, shm_free_bytes=1_500_000_000, pin_memory=True)
    assert parse_what_if("available_ram_bytes=2Gi").available_ram_bytes == 2 * 2**30
    # api.md and forecast.md: byte counts with K, M, G, T (powers of 1000) or Ki, Mi, Gi, Ti (of 1024).
    assert parse_what_if("shm_free_bytes=64K").shm_free_bytes == 64_000
    assert parse_what_if("shm_free_bytes=512M").shm_free_bytes == 512_000_000
    assert parse_what_if("available_ram_bytes=2T").available_ram_bytes == 2_000_000_000_000
    assert parse_what_if("available_ram_bytes=1.5T").available_ram_bytes == 1_500_000_000_000
    assert parse_what_if("shm_free_bytes=3Ki,available_ram_bytes=1Ti") == WhatIf(
        shm_free_bytes=3 * 1024, available_ram_bytes=1024**4
    )
    with pytest.raises(ValueError, match="unknown what-if argument 'ranks'; allowed: ranks_per_node"):
        parse_what_if("ranks=8")
    with pytest.raises(ValueError, match=r"ranks_per_node must be .*integer >= 1; got 'eight'"):
        parse_what_if("ranks_per_node=eight")
    with pytest.raises(ValueError, match="not name=value"):
        parse_what_if("step_speedup")
    with pytest.raises(ValueError, match="given twice"):
        parse_what_if("num_workers=1,num_workers=2")


def test_the_table_names_every_figure_and_what_binds() -> None:
    text = str(forecast(_facts(batch_bytes=10**6, available_ram_bytes=10**9), WhatIf(step_speedup=2.0)))
    for row in (
        "throughput per rank",
        "wait fraction",
        "workers needed per rank",
        "in-flight memory on node",
        "binds first",
        "the workers' capacity",
    ):
        assert row in text, row


def test_queued_memory_is_the_full_queues_when_the_step_paces_and_none_when_the_workers_do() -> None:
    facts = _facts(batch_bytes=1_000_000)
    paced_by_step = forecast(facts, WhatIf(ranks_per_node=2, prefetch_factor=3))
    # The worker runs ahead until its 3 slots hold made batches: every fetch finds all of them waiting.
    assert paced_by_step.queued_bytes is not None and paced_by_step.queued_bytes.value == pytest.approx(2 * 3 * 1e6)
    paced_by_worker = forecast(facts, WhatIf(step_speedup=2.0))
    # A 10 ms step against 16 ms batches: every fetch waits for a batch not yet made.
    assert paced_by_worker.queued_bytes is not None and paced_by_worker.queued_bytes.value == pytest.approx(0.0)
    assert paced_by_worker.inflight_bytes is not None and paced_by_worker.inflight_bytes.value == 2 * 1e6


def test_the_hosts_own_sums_scale_with_the_ranks_where_the_settings_are_kept() -> None:
    # Measured on 2 ranks of one host: 2 workers x prefetch 3 and 1 x prefetch 2: 3 workers, 8 batches of 1 MB.
    facts = _facts(
        ranks_per_node=2,
        num_workers=2,
        prefetch_factor=3,
        batch_bytes=10**6,
        workers_on_host=3,
        inflight_host_bytes=8 * 10**6,
    )
    doubled = forecast(facts, WhatIf(ranks_per_node=4))
    assert doubled.worker_processes == 6
    assert doubled.inflight_bytes is not None and doubled.inflight_bytes.value == 16 * 10**6
    # New settings are every rank's: 4 ranks x 1 worker x prefetch 2.
    uniform = forecast(facts, WhatIf(ranks_per_node=4, num_workers=1, prefetch_factor=2))
    assert uniform.worker_processes == 4
    assert uniform.inflight_bytes is not None and uniform.inflight_bytes.value == 8 * 10**6


def test_a_worker_count_short_of_the_step_binds_first_at_the_step_over_their_capacity() -> None:
    # Twice as fast a step (10 ms) wants 100 batches/s; one worker makes a batch in 16 ms, 62.5 a second.
    f = forecast(_facts(), WhatIf(step_speedup=2.0))
    assert f.loads["workers"] == pytest.approx((1 / 0.010) / (1 / 0.016))
    assert f.binds_first == "workers" and f.limited_by == "workers"
    assert f.throughput.value == pytest.approx(_steady(0.010, 0.016, 1)[0], rel=0.02)


def test_a_faster_step_is_taken_to_need_that_much_less_cpu() -> None:
    # Half the step's 20 ms computes on a core; twice as fast, at the 100 steps/s two workers keep up with, the
    # loop's thread uses 5 ms of CPU a step: half a core.
    f = forecast(_facts(step_cpu_s=0.010, num_workers=2), WhatIf(step_speedup=2.0))
    assert f.throughput.value == pytest.approx(_steady(0.010, 0.016, 2)[0], rel=0.02)
    assert f.loop_cores == pytest.approx(100 * 0.005, rel=0.02)


def test_more_ranks_than_measured_leave_the_throughput_open_below_and_the_wait_above() -> None:
    # DDP's collectives and lockstep are in a step measured on as many ranks, not in one measured on fewer.
    def said(f: Forecast) -> bool:
        return any(
            note.startswith("DDP's own cost per step")
            and "throughput as an upper bound and the wait as a lower one" in note
            for note in f.notes
        )

    def open_ended(f: Forecast) -> bool:
        # The ranges say it too: any throughput under the forecast's and any wait over it is in them.
        rate, wait = f.throughput, f.wait_fraction
        if (rate.open_end, wait.open_end) == ("low", "high"):
            assert rate.covers(0.5 * rate.low) and not rate.covers(1.5 * rate.high)
            assert wait.covers(1.0) and not wait.covers(wait.low - 0.01)
            assert "(at most" in str(f) and "(at least" in str(f)
            return True
        assert (rate.open_end, wait.open_end) == (None, None)
        assert not rate.covers(0.5 * rate.low) and "(at most" not in str(f)
        return False

    for facts, what_if, added in (
        (_facts(), WhatIf(ranks_per_node=4), True),
        (_facts(ranks_per_node=2), WhatIf(ranks_per_node=4), True),
        (_facts(), WhatIf(), False),
        (_facts(), WhatIf(num_workers=8), False),  # more processes than cores, one rank: no DDP
        (_facts(ranks_per_node=4), WhatIf(ranks_per_node=4), False),
        (_facts(ranks_per_node=4), WhatIf(ranks_per_node=2), False),
    ):
        f = forecast(facts, what_if)
        assert said(f) is added and open_ended(f) is added, what_if


def test_a_run_without_workers_forecasts_workers_from_the_loops_fetch_and_says_so() -> None:
    # Measured in process: each fetch took 16 ms; two workers making a batch in that time keep up with a 20 ms step.
    f = forecast(_facts(num_workers=0, handover_s=None), WhatIf(num_workers=2))
    assert "measured without workers: a worker is taken to make a batch in the time the loop's fetch took" in f.notes
    assert f.throughput.value == pytest.approx(_steady(0.020, 0.016, 2)[0], rel=0.02)
    assert f.wait_fraction.value == pytest.approx(0.0, abs=0.01)
