"""The noise of measured rates: how far apart two measurements of the same setting may read by chance.

A window's steps are not independent (a busy core slows several in a row), so its noise is read from the
rates of consecutive blocks of ``BLOCK_STEPS`` steps, as the tuner reads it: the standard error of their mean,
relative to it. Two rates closer than ``SIGMAS`` standard errors of the two together are not told apart.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from statistics import fmean

BLOCK_STEPS = 4
"""A window's noise is read from the rates of its consecutive blocks of this many steps."""

SIGMAS = 2.0
"""Two rates closer than this many standard errors (of the two together) are not told apart."""

RESOLUTION = 0.01
"""Two settings' rates closer than this share are taken as alike by the tuner's choice between settings that both
beat yours, whatever their windows' blocks say: a window whose blocks run alike (a step bound by the accelerator, a
full buffer) shows no spread, yet an epoch's rate varies about 1 % from run to run."""


def block_rates(loop_s: Sequence[float], block: int = BLOCK_STEPS) -> list[float]:
    """Steps/s of each whole block of ``block`` consecutive steps, from each step's loop time (wait + step).

    Example:
        >>> block_rates([0.1] * 8 + [0.2] * 3)
        [10.0, 10.0]
    """
    return [block / t for b in range(len(loop_s) // block) if (t := math.fsum(loop_s[b * block : (b + 1) * block])) > 0]


def block_shares(wait_s: Sequence[float], step_s: Sequence[float], block: int = BLOCK_STEPS) -> list[float]:
    """The share of the loop's time each whole block of ``block`` consecutive steps waited for data.

    Example:
        >>> block_shares([0.0] * 4 + [0.1] * 4, [0.1] * 8)
        [0.0, 0.5]
    """
    shares = []
    for b in range(len(wait_s) // block):
        wait = math.fsum(wait_s[b * block : (b + 1) * block])
        loop = wait + math.fsum(step_s[b * block : (b + 1) * block])
        if loop > 0:
            shares.append(wait / loop)
    return shares


def relative_error(rates: Sequence[float]) -> float:
    """Standard error of the mean of ``rates``, relative to it (0 for fewer than two rates).

    Example:
        >>> round(relative_error([9.0, 11.0, 9.0, 11.0]), 3)
        0.058
    """
    n, mean = len(rates), fmean(rates) if rates else 0.0
    if n < 2 or mean <= 0:
        return 0.0
    # In floats: statistics.stdev's exact arithmetic costs about 0.1 ms a call, and the tuner reads this at
    # every comparison of two settings.
    return math.sqrt(math.fsum((r - mean) ** 2 for r in rates) / (n - 1) / n) / mean


def comparison_noise(*errors: float) -> float:
    """The relative difference two measurements with these relative errors cannot tell from noise.

    Example:
        >>> round(comparison_noise(0.03, 0.04), 3)
        0.1
    """
    return SIGMAS * math.hypot(*errors)
