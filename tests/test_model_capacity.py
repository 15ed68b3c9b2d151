"""Capacity arithmetic and the prefetch recommendation, against brute force and known timings.

The brute force replays a loader through ``buffer_oracle`` (an event simulation of torch's DataLoader written
in the tests), never through the package's own buffer model.
"""

from __future__ import annotations

import pytest
from buffer_oracle import brute_force_depth, loader_waits
from hypothesis import given, settings
from hypothesis import strategies as st

from lightning_loadguard.meters.window import HostFacts
from lightning_loadguard.model.budget import host_inflight_bytes, max_batches_in_flight, memory_budget, worker_budget
from lightning_loadguard.model.capacity import (
    PREFETCH_TOLERANCE,
    has_deficit,
    producer_capacity,
    recommend_prefetch,
    workers_needed,
)


def test_producer_capacity_counts_workers() -> None:
    assert producer_capacity([0.1, 0.3], num_workers=4) == pytest.approx(20.0)
    assert producer_capacity([0.25], num_workers=0) == pytest.approx(4.0)
    assert producer_capacity([0.0], num_workers=2) == float("inf")


def test_workers_needed_is_littles_law_with_margin() -> None:
    # 0.4 s per batch at 10 steps/s: 4 batches in flight, 4.8 with the margin.
    assert workers_needed(0.4, 10.0) == 5
    assert workers_needed(0.4, 10.0, burst_margin=0.0) == 4
    assert workers_needed(0.0, 10.0) == 0
    assert workers_needed(0.001, 10.0) == 1
    with pytest.raises(ValueError, match="consumer_rate"):
        workers_needed(0.4, 0.0)
    with pytest.raises(ValueError, match="mean_production_s"):
        workers_needed(-0.4, 1.0)


def test_worker_budget_keeps_a_core_per_process() -> None:
    assert worker_budget(HostFacts(cpu_count=2)) == 1
    assert worker_budget(HostFacts(cpu_count=16, processes_on_host=8)) == 1
    assert worker_budget(HostFacts(cpu_count=8, processes_on_host=8)) == 0
    assert worker_budget(HostFacts(cpu_count=96, processes_on_host=8)) == 11


def test_memory_is_counted_host_wide_against_ram_and_shm() -> None:
    assert host_inflight_bytes(1000, 8, 4) == 32_000
    host = HostFacts(cpu_count=8, processes_on_host=4, available_ram_bytes=100_000, shm_free_bytes=30_000)
    assert memory_budget(host) == 24_000
    assert memory_budget(host, uses_shm=False) == 50_000
    assert memory_budget(HostFacts(cpu_count=8)) is None
    assert max_batches_in_flight(1000, host) == 6
    with pytest.raises(ValueError, match="batch_bytes"):
        host_inflight_bytes(-1, 8, 4)


def test_no_depth_is_recommended_for_a_deficit() -> None:
    assert has_deficit([0.5], [0.1], num_workers=4)
    assert recommend_prefetch([0.5], [0.1], num_workers=4) is None


def test_bad_prefetch_arguments_raise() -> None:
    with pytest.raises(ValueError, match="num_workers"):
        recommend_prefetch([0.1], [0.1], num_workers=0)
    with pytest.raises(ValueError, match="tolerance"):
        recommend_prefetch([0.1], [0.1], num_workers=1, tolerance=-1.0)
    with pytest.raises(ValueError, match="deep_prefetch"):
        recommend_prefetch([0.1], [0.1], num_workers=1, deep_prefetch=0)


def test_steady_producer_needs_the_smallest_depth() -> None:
    advice = recommend_prefetch([0.1], [0.2], num_workers=2)
    assert advice is not None
    assert advice.prefetch_factor == 1
    assert advice.batches_in_flight == 2


def test_bursts_get_a_depth_that_absorbs_them() -> None:
    # Every 15th batch takes 1.5 s, 0.05 s otherwise; two workers; a 0.1 s step. (An odd period sends the
    # slow batch to each worker in turn; with an even one it would always land on the same worker.)
    prod = [0.05] * 14 + [1.5]
    advice = recommend_prefetch(prod, [0.1], num_workers=2)
    assert advice is not None
    assert abs(advice.prefetch_factor - brute_force_depth(prod, [0.1], 2, PREFETCH_TOLERANCE)) <= 1
    assert advice.expected_wait_s <= advice.optimum_wait_s + PREFETCH_TOLERANCE * 0.1
    shallow_waits, elapsed = loader_waits(prod, [0.1], workers=2, prefetch=1, steps=256)
    assert sum(shallow_waits) / elapsed > 0.2
    assert advice.expected_wait_fraction < 0.05


@settings(max_examples=20, deadline=None)
@given(
    st.lists(st.floats(0.001, 0.6), min_size=1, max_size=10),
    st.lists(st.floats(0.05, 0.3), min_size=1, max_size=6),
    st.integers(1, 4),
)
def test_recommendation_matches_brute_force(prod: list[float], step: list[float], workers: int) -> None:
    advice = recommend_prefetch(prod, step, num_workers=workers)
    if has_deficit(prod, step, workers):
        assert advice is None
        return
    assert advice is not None
    assert abs(advice.prefetch_factor - brute_force_depth(prod, step, workers, PREFETCH_TOLERANCE)) <= 1


def test_io_waiting_workers_fit_more_than_one_per_core() -> None:
    from lightning_loadguard.meters.window import HostFacts
    from lightning_loadguard.model.budget import worker_budget

    host = HostFacts(cpu_count=8, processes_on_host=2)
    assert worker_budget(host) == 3
    assert worker_budget(host, cpu_share=1.0) == 3
    assert worker_budget(host, cpu_share=0.5) == 6
    assert worker_budget(host, cpu_share=0.0) == 30  # never more than ten per spare core
    with pytest.raises(ValueError, match="cpu_share"):
        worker_budget(host, cpu_share=1.5)
