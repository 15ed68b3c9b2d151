"""The bounded-buffer model: known timings, validation and the physics as properties."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lightning_loadguard.model.buffer import simulate_buffer, steady_state_wait

_times = st.lists(st.floats(min_value=0.001, max_value=1.0), min_size=1, max_size=12)
_workers = st.integers(min_value=1, max_value=6)
_prefetch = st.integers(min_value=1, max_value=6)
_steps = st.integers(min_value=1, max_value=120)


def _replayed_mean(times: list[float], n: int) -> float:
    return math.fsum(times[j % len(times)] for j in range(n)) / n


def test_in_process_loading_waits_for_every_batch() -> None:
    run = simulate_buffer([0.05, 0.15], [0.1], num_workers=0, steps=4)
    assert run.waits == (0.05, 0.15, 0.05, 0.15)
    assert run.levels == (0, 0, 0, 0)
    assert run.elapsed_s == pytest.approx(0.8)


def test_spare_capacity_waits_only_for_the_first_batch() -> None:
    run = simulate_buffer([0.3], [0.2], num_workers=2, prefetch_factor=2, steps=100)
    assert run.waits[0] == pytest.approx(0.3)
    assert max(run.waits[1:]) == pytest.approx(0.0)
    assert run.throughput == pytest.approx(100 / (0.3 + 100 * 0.2))


def test_deficit_wait_tends_to_production_minus_step() -> None:
    # Two workers at 0.5 s make one batch per 0.25 s; a 0.1 s step then waits 0.15 s per batch.
    run = simulate_buffer([0.5], [0.1], num_workers=2, prefetch_factor=8, steps=400)
    # Both workers finish together, so the waits alternate (0.3, 0): judge the mean of the tail.
    assert sum(run.waits[-100:]) / 100 == pytest.approx(0.15)
    assert run.throughput == pytest.approx(4.0, rel=0.01)


def test_one_slow_batch_in_eight_is_absorbed_by_depth() -> None:
    # Mean production 0.119 s < 0.15 s step: capacity suffices, only the 0.6 s batch stalls.
    prod = [0.05] * 7 + [0.6]
    shallow = simulate_buffer(prod, [0.15], num_workers=1, prefetch_factor=1, steps=400)
    deep = simulate_buffer(prod, [0.15], num_workers=1, prefetch_factor=8, steps=400)
    assert shallow.mean_wait_s > 0.04
    assert deep.mean_wait_s < 0.001


def test_levels_never_exceed_depth_and_fill_when_producer_is_fast() -> None:
    run = simulate_buffer([0.01], [0.1], num_workers=2, prefetch_factor=3, steps=50)
    assert max(run.levels) <= 6
    assert run.levels[-1] == 6  # the slot freed by each take is refilled within the step


def test_levels_can_be_skipped() -> None:
    run = simulate_buffer([0.01], [0.1], num_workers=2, steps=5, record_levels=False)
    assert run.levels == ()
    assert run.steps == 5


@pytest.mark.parametrize(
    ("kwargs", "name"),
    [
        ({"production_s": [], "step_s": [0.1], "num_workers": 1}, "production_s"),
        ({"production_s": [-0.1], "step_s": [0.1], "num_workers": 1}, "production_s"),
        ({"production_s": [0.1], "step_s": [float("nan")], "num_workers": 1}, "step_s"),
        ({"production_s": [0.1], "step_s": [0.1], "num_workers": -1}, "num_workers"),
        ({"production_s": [0.1], "step_s": [0.1], "num_workers": 1, "prefetch_factor": 0}, "prefetch_factor"),
        ({"production_s": [0.1], "step_s": [0.1], "num_workers": 1, "steps": 0}, "steps"),
    ],
)
def test_bad_input_names_the_argument(kwargs: dict, name: str) -> None:
    with pytest.raises(ValueError, match=name):
        simulate_buffer(**kwargs)


def test_steady_state_wait_limits() -> None:
    assert steady_state_wait(0.1, 0.2, 10_000) == pytest.approx(0.1)
    assert steady_state_wait(0.1, 0.1, 9) == pytest.approx(0.1 / 10)
    assert steady_state_wait(0.1, 0.2, 0) == pytest.approx(0.2)
    assert steady_state_wait(0.2, 0.1, 100_000) == 0.0
    assert steady_state_wait(0.2, 0.0, 3) == 0.0
    with pytest.raises(ValueError, match="depth"):
        steady_state_wait(0.1, 0.1, -1)
    with pytest.raises(ValueError, match="step_s"):
        steady_state_wait(0.0, 0.1, 1)


@settings(max_examples=60, deadline=None)
@given(st.floats(0.01, 1.0), st.floats(0.01, 1.0), st.integers(0, 60))
def test_steady_state_wait_never_grows_with_depth(x: float, y: float, n: int) -> None:
    assert steady_state_wait(x, y, n + 1) <= steady_state_wait(x, y, n) + 1e-12


def test_with_spare_capacity_each_slot_of_depth_halves_the_wait_when_the_producer_is_twice_as_fast() -> None:
    # A 0.2 s step fed at 0.1 s a batch: the buffer is empty with probability (1 - 2) / (1 - 2^(n+1)), so the wait
    # is 0.1 / (2^(n+1) - 1): 0.1, 0.1/3, 0.1/7, ... worked out by hand from the queue's formula.
    for depth in range(12):
        assert steady_state_wait(0.2, 0.1, depth) == pytest.approx(0.1 / (2 ** (depth + 1) - 1))


@settings(max_examples=60, deadline=None)
@given(st.floats(0.01, 1.0), st.floats(0.01, 0.99), st.integers(0, 60))
def test_with_spare_capacity_the_wait_falls_geometrically_with_the_depth(x: float, speed: float, n: int) -> None:
    # docs/concepts.md: with y < x each further slot of depth cuts the wait by at least the factor y / x (a linear
    # fall would not: its last slots cut it by far less).
    y = x * speed
    deeper, now = steady_state_wait(x, y, n + 1), steady_state_wait(x, y, n)
    assert now > 0
    assert deeper <= now * (y / x) * (1 + 1e-9) + 1e-300


@settings(max_examples=80, deadline=None)
@given(_times, _times, _workers, _prefetch, _steps)
def test_throughput_never_exceeds_the_slowest_stage(
    prod: list[float], step: list[float], workers: int, prefetch: int, n: int
) -> None:
    run = simulate_buffer(prod, step, num_workers=workers, prefetch_factor=prefetch, steps=n)
    consumer_rate = 1.0 / _replayed_mean(step, n)
    producer_capacity = workers / _replayed_mean(prod, n)
    assert run.throughput <= min(consumer_rate, producer_capacity) * (1 + 1e-9)


@settings(max_examples=80, deadline=None)
@given(_times, _times, st.integers(0, 6), _prefetch, _steps)
def test_a_deeper_buffer_never_increases_the_total_wait(
    prod: list[float], step: list[float], workers: int, prefetch: int, n: int
) -> None:
    shallow = simulate_buffer(prod, step, num_workers=workers, prefetch_factor=prefetch, steps=n)
    deeper = simulate_buffer(prod, step, num_workers=workers, prefetch_factor=prefetch + 1, steps=n)
    assert deeper.total_wait_s <= shallow.total_wait_s + 1e-9


@settings(max_examples=80, deadline=None)
@given(_times, _times, _workers, st.sampled_from([1, 2, 4, 16, 64]), st.integers(10, 200))
def test_no_depth_hides_a_deficit(prod: list[float], step: list[float], workers: int, prefetch: int, n: int) -> None:
    # The consumer cannot finish before the busiest worker has made its share of the n batches, so
    # elapsed >= sum(production) / W, and elapsed = sum(step) + total wait. Measured against the means
    # of the batches actually replayed the bound is exact: there is no transient to allow for beyond
    # float rounding (against the sequences' own means a partial last cycle could shift it).
    deficit = _replayed_mean(prod, n) / workers - _replayed_mean(step, n)
    run = simulate_buffer(prod, step, num_workers=workers, prefetch_factor=prefetch, steps=n)
    assert run.mean_wait_s >= deficit - 1e-9


@settings(max_examples=200, deadline=None)
@given(_times, _times, _workers, _prefetch, _steps)
def test_the_replay_matches_an_event_simulation_of_torchs_loader(
    prod: list[float], step: list[float], workers: int, prefetch: int, steps: int
) -> None:
    from buffer_oracle import loader_waits

    waits, end = loader_waits(prod, step, workers=workers, prefetch=prefetch, steps=steps)
    run = simulate_buffer(prod, step, num_workers=workers, prefetch_factor=prefetch, steps=steps)
    assert run.waits == pytest.approx(waits, abs=1e-9)
    assert run.elapsed_s == pytest.approx(end, abs=1e-9)
