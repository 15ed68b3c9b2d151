"""The noise model's statistics against independent calculations (the standard library's exact ones)."""

from __future__ import annotations

import math
import random
import statistics

import pytest

from lightning_loadguard.model.noise import block_rates, comparison_noise, relative_error


def test_relative_error_is_the_standard_error_of_the_mean_over_the_mean() -> None:
    rng = random.Random(7)
    for _ in range(500):
        rates = [rng.lognormvariate(3.0, rng.uniform(0.0, 1.5)) for _ in range(rng.randint(2, 48))]
        expected = statistics.stdev(rates) / math.sqrt(len(rates)) / statistics.fmean(rates)
        assert relative_error(rates) == pytest.approx(expected, rel=1e-12)


@pytest.mark.parametrize("rates", [[], [5.0], [0.0, 0.0], [-1.0, 1.0]])
def test_relative_error_is_zero_where_no_mean_rate_is_read(rates: list[float]) -> None:
    assert relative_error(rates) == 0.0


def test_alike_rates_read_no_error() -> None:
    assert relative_error([12.5] * 9) == 0.0


def test_block_rates_count_whole_blocks_of_the_loop_time() -> None:
    loop = [0.1, 0.1, 0.2, 0.2, 0.05, 0.05, 0.05, 0.05, 0.3]  # the ninth step is not a whole block
    assert block_rates(loop) == pytest.approx([4 / 0.6, 4 / 0.2])
    assert block_rates(loop, block=2) == pytest.approx([10.0, 5.0, 20.0, 20.0])


def test_two_errors_combine_in_quadrature_at_two_sigmas() -> None:
    assert comparison_noise(0.03, 0.04) == pytest.approx(2 * 0.05)
