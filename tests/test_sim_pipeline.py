"""The pipeline simulator against rates that follow from its costs alone (the instrument the tuner is
scored with must itself be right)."""

from __future__ import annotations

from functools import partial

import pytest
from sim_pipeline import Cost, Host, Sim, SimPipeline, steady_rate, tune, tune_sim

from lightning_loadguard.meters.settings import LoaderSettings
from lightning_loadguard.tuning.planner import Planner


def _io(cores: int = 8, **kw: object) -> SimPipeline:
    return SimPipeline(
        "io", "io_bound", Host(cores=cores), io=Cost(0.02), step_cpu_s=0.0, device_s=0.005, handover_s=0.0, **kw
    )  # type: ignore[arg-type]


@pytest.mark.parametrize(("workers", "expected"), [(1, 50.0), (2, 100.0), (3, 150.0), (4, 200.0), (6, 200.0)])
def test_io_bound_workers_add_up_until_the_step_paces_the_loop(workers: int, expected: float) -> None:
    assert steady_rate(_io(), LoaderSettings(workers, 2)) == pytest.approx(expected, rel=0.01)


def test_without_workers_the_loop_makes_each_batch_then_steps() -> None:
    assert steady_rate(_io(), LoaderSettings(0)) == pytest.approx(1 / 0.025, rel=0.01)


def test_cpu_bound_workers_share_the_cores_with_the_loop() -> None:
    # 2 cores; a batch is 16 ms of CPU, a step 2 ms of CPU on 2 threads: 18 ms of CPU per step on 2 cores.
    p = SimPipeline(
        "cpu", "cpu_bound", Host(cores=2), cpu=Cost(0.016), step_cpu_s=0.002, step_threads=2, handover_s=0.0
    )
    assert steady_rate(p, LoaderSettings(0)) == pytest.approx(1 / 0.017, rel=0.01)
    for workers in (2, 4, 8):
        assert steady_rate(p, LoaderSettings(workers, 2)) == pytest.approx(2 / 0.018, rel=0.02)
    # One worker loses a share of its core to the step's two threads while the step runs.
    one = steady_rate(p, LoaderSettings(1, 2))
    assert 1 / 0.0175 < one < 1 / 0.016


def test_a_batch_made_in_a_worker_costs_its_sending_and_a_hand_over_its_wait() -> None:
    # One worker: 8 ms of CPU a batch and 2 ms to send it from the worker, against a 1 ms step: 100 batches/s.
    sent = SimPipeline(
        "cpu", "cpu_bound", Host(cores=4), cpu=Cost(0.008), step_cpu_s=0.0, device_s=0.001, worker_extra_s=0.002
    )
    assert steady_rate(sent, LoaderSettings(1, 2)) == pytest.approx(100.0, rel=0.01)
    # Made in the loop, the batch costs its 8 ms alone.
    assert steady_rate(sent, LoaderSettings(0)) == pytest.approx(1 / 0.009, rel=0.01)
    # 4 workers (200 batches/s) ahead of a 5 ms step: each step takes its batch in 0.3 ms of CPU and 1 ms of waiting.
    taken = SimPipeline(
        "io",
        "io_bound",
        Host(cores=8),
        io=Cost(0.02),
        step_cpu_s=0.0,
        device_s=0.005,
        handover_s=0.0003,
        handover_wait_s=0.001,
    )
    assert steady_rate(taken, LoaderSettings(4, 2)) == pytest.approx(1 / 0.0063, rel=0.01)


def test_other_processes_take_their_share_of_the_cores() -> None:
    p = SimPipeline(
        "cpu", "contended", Host(cores=2, others=2.0), cpu=Cost(0.01), step_cpu_s=0.0, handover_s=0.0, device_s=0.001
    )
    # 4 workers and 2 busy threads on 2 cores: the workers get 2/3 of the cores, 133 batches/s.
    assert steady_rate(p, LoaderSettings(4, 2)) == pytest.approx(2 * 4 / 6 / 0.01, rel=0.02)


def test_the_hand_over_bounds_the_loop_whatever_the_workers() -> None:
    p = SimPipeline(
        "handover", "handover_bound", Host(cores=16), io=Cost(0.001), step_cpu_s=0.0, device_s=0.002, handover_s=0.003
    )
    assert steady_rate(p, LoaderSettings(4, 2)) == pytest.approx(1 / 0.005, rel=0.01)
    assert steady_rate(p, LoaderSettings(12, 2)) == pytest.approx(1 / 0.005, rel=0.01)


def test_batches_arrive_in_order_and_at_most_prefetch_per_worker_are_outstanding() -> None:
    # Worker 0's batches are slow (a burst on every batch it makes is modelled by a bursty cost at share 1/2):
    # in-order delivery makes the loop wait for them even when the others are ready.
    p = _io(cores=8)
    sim = Sim(p, LoaderSettings(3, 2), seed=0)
    sim.run(50)
    window = sim.window(10)
    made_in_window = window.batches_made
    assert made_in_window is not None
    # Never more than workers x prefetch batches made ahead of the loop.
    assert sim._handed - sim.consumed <= 3 * 2
    assert all(r in (True, False) for r in sim.ready)


def test_a_restart_costs_the_loop_the_workers_start_up() -> None:
    p = _io(start_s=0.2)
    sim = Sim(p, LoaderSettings(2, 2), seed=0)
    sim.run(20)
    before = sim.now
    sim.switch(LoaderSettings(4, 2))
    sim.run(1)
    assert sim.now - before >= 0.2  # the next batch waits for the new workers to start


def test_persistent_workers_skip_the_start_up_at_each_epoch() -> None:
    fresh = _io(start_s=0.2, epoch_steps=50)
    kept = SimPipeline(**{**fresh.__dict__, "user": LoaderSettings(2, 2, persistent_workers=True)})
    a = Sim(fresh, LoaderSettings(2, 2), seed=0)
    b = Sim(kept, LoaderSettings(2, 2, persistent_workers=True), seed=0)
    a.run(200)
    b.run(200)
    assert a.now - b.now == pytest.approx(3 * 0.2, rel=0.2)  # three more start-ups


def test_persistent_workers_start_each_epoch_as_the_first_without_the_start_up() -> None:
    # Each epoch hands its first indices round robin from the first worker once the loop starts it, never to a
    # worker still finishing the epoch before: the second epoch's waits are the first's, without the start-up
    # (which, as the monitor does, is kept apart from the data wait).
    p = _io(start_s=0.05, epoch_steps=40)
    p = SimPipeline(**{**p.__dict__, "io": Cost(0.5)})
    sim = Sim(p, LoaderSettings(8, 2, persistent_workers=True), seed=0)
    sim.run(80)
    first, second = sim.wait_s[:40], sim.wait_s[40:]
    assert sim.start_wait_s[0] == pytest.approx(0.05, abs=0.002) and not any(sim.start_wait_s[1:])
    assert second == pytest.approx(first, abs=0.002)


def test_the_window_is_what_the_monitor_cuts() -> None:
    sim = Sim(_io(), LoaderSettings(2, 2), seed=0)
    sim.run(40)
    window = sim.window(16)
    assert window.steps == 24
    assert window.sustained_rate == pytest.approx(100.0, rel=0.02)
    assert window.mean_production_s == pytest.approx(0.02, rel=0.01)
    assert window.cpu_share is not None and window.cpu_share < 0.1  # waiting on I/O, not computing


def test_the_planner_runs_unchanged_against_it() -> None:
    p = SimPipeline("io", "io_bound", Host(cores=8), io=Cost(0.02), device_s=0.005, epoch_steps=600)
    tuned = tune(p, seed=0)
    assert tuned.decision is not None and tuned.decision.verdict == "improved"
    assert steady_rate(p, tuned.chosen) > 3 * steady_rate(p, p.user)


def test_on_an_accelerator_pinned_memory_is_probed_with_workers_and_on_the_cpu_never() -> None:
    # I/O-bound: where the search has nothing new to measure at its best count, that count with pinned memory.
    p = SimPipeline("io", "io_bound", Host(cores=8), io=Cost(0.02), device_s=0.005, epoch_steps=2000)
    _, _, on_accelerator = tune_sim(p, seed=0, planner=partial(Planner, pinning_helps=True))
    pinned = [s for s in on_accelerator.arms if s.pin_memory]
    assert pinned, list(on_accelerator.arms)
    assert all(s.num_workers >= 1 for s in pinned)
    # Without an accelerator, never.
    _, _, on_cpu = tune_sim(p, seed=0)
    assert not any(s.pin_memory for s in on_cpu.arms)


def test_the_windows_cpu_reading_counts_the_cpu_seconds_the_known_costs_spend() -> None:
    # The loop makes its batches itself on 4 cores, 10 ms of CPU each, and steps for 2 ms of CPU; one thread of other
    # work computes throughout, on a core of its own (the host is never oversubscribed).
    alone = SimPipeline(
        "in_process", "cpu_bound", Host(cores=4, others=1.0), cpu=Cost(0.010), step_cpu_s=0.002, device_s=0.005
    )
    sim = Sim(alone, LoaderSettings(0))
    sim.run(20)
    mark = sim.consumed
    sim.run(100)
    use = sim.window(mark).cpu
    assert use is not None and use.usable_cores == 4
    assert use.loop_cores * use.window_s == pytest.approx(100 * (0.010 + 0.002))
    assert use.worker_cores == 0 and use.other_cores == pytest.approx(1.0)
    # Four workers at 20 ms of CPU a batch on 2 cores beside two threads of other work: every core busy throughout,
    # the workers' CPU the batches they made in the window (give or take the four in progress at its edges).
    crowded = SimPipeline(
        "crowded", "cpu_bound", Host(cores=2, others=2.0), cpu=Cost(0.020), step_cpu_s=0.0005, device_s=0.002
    )
    sim = Sim(crowded, LoaderSettings(4, 2))
    sim.run(20)
    mark = sim.consumed
    sim.run(100)
    window = sim.window(mark)
    use = window.cpu
    assert use is not None and use.busy_cores == pytest.approx(2.0)
    assert window.batches_made is not None
    assert use.worker_cores * use.window_s == pytest.approx(window.batches_made * 0.020, abs=4 * 0.020)
    assert 0.5 < use.other_cores < 2.0  # the other work's share of two cores among its two threads and the rest


def test_the_drift_phase_a_run_draws_does_not_follow_the_pipelines_core_count() -> None:
    # The sweep tunes pipeline `seed` with tune seed `seed`: a phase drawn from random.Random(seed), the stream the
    # generator draws the pipeline from, followed its core count (on 64 cores it never fell below 3.5 rad), so each
    # core count met the host's drift at much the same point of its probing.
    from sim_sweep import generate

    phases: dict[int, list[float]] = {}
    for seed in range(400):
        p = generate(seed)
        phases.setdefault(p.host.cores, []).append(Sim(p, p.user, seed=seed)._drift_phase)
    for cores, drawn in phases.items():
        assert len(drawn) >= 30 and min(drawn) < 1.0 and max(drawn) > 5.3, (cores, min(drawn), max(drawn))
