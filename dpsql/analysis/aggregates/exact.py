"""Exact arithmetic on columns of noisy integers, shared by the families' releases.

Each released value is the float of an exact rational (or an exact integer), as Fraction
arithmetic gives it: float(Fraction(n, d)) is n / d correctly rounded. A column is computed on
int64 when every numerator and denominator stays below 2**53 — both are then exact doubles and
one IEEE division rounds correctly — and otherwise on Python ints in object arrays, whose
int / int division also rounds correctly. Clamping after the rounding gives the same value as
clamping before it, since correct rounding is monotone.
"""

from __future__ import annotations

from fractions import Fraction
from typing import Sequence

import numpy as np

from dpsql.analysis.plan import Measure
from dpsql.mechanisms import noise

EXACT_DOUBLE = 2**53
"""Integers below this in magnitude are exact doubles (and far from int64 overflow)."""


def integers(values: Sequence[int]) -> np.ndarray:
    """Integers as int64, or as Python ints in an object array when one does not fit int64."""
    try:
        return np.array(values, dtype=np.int64)
    except OverflowError:
        return np.array([int(value) for value in values], dtype=object)


def magnitude(values: np.ndarray) -> int:
    """The largest absolute value, as a Python int (no int64 overflow), and at least 1: a bound
    built from magnitudes then also bounds the constants multiplied in (so NumPy never has to
    fit a too-large Python int into int64, even for an empty column)."""
    return max(-int(values.min()), int(values.max()), 1) if values.size else 1


def exact(values: np.ndarray, bound: int, limit: int = EXACT_DOUBLE) -> np.ndarray:
    """``values`` in a dtype that computes exactly when every intermediate is at most ``bound``
    in magnitude: int64 when ``bound`` is below ``limit``, else Python ints."""
    return values if bound < limit and values.dtype != object else values.astype(object)


def quotients(numerators: np.ndarray, denominators: np.ndarray | int) -> np.ndarray:
    """n / d per cell (d > 0), correctly rounded, as float(Fraction(n, d)) is. Operands come from
    ``exact``: Python ints (int / int rounds correctly), or int64 below 2**53 (exact doubles,
    so one IEEE division rounds correctly)."""
    result = numerators / denominators
    return result.astype(float) if result.dtype == object else result


def on_grid(units: np.ndarray, grid: Fraction) -> np.ndarray:
    """units * grid: integers on an integer grid, else floats."""
    p, q = grid.numerator, grid.denominator
    if q == 1:
        return exact(units, magnitude(units) * p, limit=2**63) * p
    return quotients(exact(units, max(magnitude(units) * p, q)) * p, q)


def noise_half_width(measure: Measure, alpha: float) -> int:
    """Half-width, in grid units, of the (1 - alpha) interval of the measure's noise."""
    if measure.noise == "none":
        return 0
    if measure.noise == "gaussian":
        return noise.discrete_gaussian_halfwidth(measure.scale, alpha)
    return noise.discrete_laplace_halfwidth(measure.scale, alpha)
