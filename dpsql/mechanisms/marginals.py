"""Noisy marginals of the bounded copy: what one unit can move, the Gaussian measurement, and the
exponential mechanism's choice of a marginal (the shared steps of AIM and MST,
``dpsql.mechanisms.aim`` and ``dpsql.mechanisms.mst``). Pure: no SQL, no ledger.

Sensitivity. A marginal over columns C is the vector of row counts per cell of C's domain (every
cell public: KEYS values, a numeric column's bins, and a NULL cell). The rows counted are those of
the table's bounded copy (``dpsql.backends.bounding``): at most k = MAX ROWS PER UNIT rows per unit,
whatever the data. Each row adds 1 to exactly one cell of every marginal, so one unit's part of a
marginal is a vector c >= 0 with sum(c) <= k. Hence:

* add/remove one unit (x' = x ± c): ||c||₂ <= ||c||₁ <= k, reached by k rows in one cell:
  Δ₂ = k, Δ₁ = k;
* replace one unit (x' = x - c + c', c and c' as above): ||c' - c||₂² = ||c||² + ||c'||² - 2c·c'
  <= k² + k² (c·c' >= 0), reached by k rows in one cell replaced by k rows in another:
  Δ₂ = √2·k, Δ₁ = 2k.

The total row count (the 0-way marginal) moves by at most k either way. ``tests/test_synthesize.py``
checks every one by enumerating units on a tiny table, through the real statement.

Measurement: the exact counts plus discrete Gaussian noise of variance σ² = Δ₂² / (2ρ), which is
ρ-zCDP (Canonne, Kamath, Steinke 2020). Choice: the exponential mechanism (McSherry & Talwar 2007)
at ε over scores of sensitivity Δ_q, drawing r with probability ∝ exp(ε·q_r / (2Δ_q)); it is
ε-bounded-range, hence ε²/8-zCDP (Cesar & Rogers 2021, Lemma 3.2 / Thm 3.3). Scores compare an
exact marginal with a public estimate rounded to a multiple of 2**-``SCORE_BITS``, in exact int64
(``l1_distance``), so float rounding cannot move a score by more than its sensitivity.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction

import numpy as np

from dpsql.mechanisms import noise

SCORE_BITS = 20
"""Public estimates are rounded to multiples of 2**-SCORE_BITS before an exact score is computed."""


def marginal_l2_squared(reach: int, neighbours: str) -> int:
    """Δ₂² of one marginal (module docstring): k² (add/remove) or 2k² (replace one unit)."""
    return reach * reach * (2 if neighbours == "bounded" else 1)


def marginal_l1(reach: int, neighbours: str) -> int:
    """Δ₁ of one marginal: k (add/remove) or 2k (replace one unit): what a score moves by."""
    return reach * (2 if neighbours == "bounded" else 1)


def count_l2_squared(reach: int) -> int:
    """Δ₂² of the total row count: k² under either relation (|a - b| <= k for a, b in [0, k])."""
    return reach * reach


def gaussian_sigma_sq(l2_squared: int | Fraction, rho: Fraction) -> Fraction:
    """The variance σ² = Δ₂² / (2ρ) of a ρ-zCDP Gaussian measurement."""
    return Fraction(l2_squared) / (2 * rho)


def sqrt_down(value: Fraction, bits: int = 52) -> Fraction:
    """A rational at most √value, within a relative 2**-bits of it (an ε whose ε²/8 may not exceed
    the ρ it is given).

    >>> root = sqrt_down(Fraction(2))
    >>> root * root <= 2 < (root + Fraction(1, 2**50)) ** 2
    True
    """
    if value <= 0:
        return Fraction(0)
    scale = 1 << bits
    # isqrt(v·s²) / s: the floor of √v on the grid 1/s, exact integer arithmetic.
    return Fraction(math.isqrt(value.numerator * scale * scale // value.denominator), scale)


def selection_rho(epsilon: Fraction) -> Fraction:
    """The zCDP cost ε²/8 of an exponential mechanism at ε (bounded range)."""
    return epsilon * epsilon / 8


def selection_epsilon(rho: Fraction) -> Fraction:
    """The largest rational ε (rounded down) whose ε²/8 is at most ``rho``."""
    return sqrt_down(8 * rho)


@dataclass(frozen=True)
class Measurement:
    """One noisy marginal (or the count, over no columns)."""

    clique: tuple[str, ...]
    """Its columns, in the domain's order (empty: the row count)."""
    values: np.ndarray
    """The noisy counts per cell (row-major over the clique's columns)."""
    sigma_sq: Fraction
    """The variance of each cell's discrete Gaussian noise."""
    rho: Fraction
    """What the measurement spent (Δ₂² / (2σ²))."""
    selection_rho: Fraction = Fraction(0)
    """What choosing it spent (the exponential mechanism's ε²/8; 0 when it was not chosen)."""

    @property
    def sigma(self) -> float:
        return math.sqrt(self.sigma_sq)


def measure(clique: tuple[str, ...], exact: np.ndarray, l2_squared: int, rho: Fraction, source,
            selection: Fraction = Fraction(0)) -> Measurement:
    """``exact`` counts plus discrete Gaussian noise for ρ-zCDP at sensitivity √``l2_squared``."""
    sigma_sq = gaussian_sigma_sq(l2_squared, rho)
    noisy = np.asarray(exact, dtype=np.int64) + noise.discrete_gaussian(sigma_sq, int(np.size(exact)), source)
    return Measurement(clique, noisy.astype(np.float64), sigma_sq, rho, selection)


def on_score_grid(estimate: np.ndarray) -> np.ndarray:
    """A public estimate as int64 multiples of 2**-SCORE_BITS (its cells must be below 2**42)."""
    return np.rint(np.asarray(estimate, dtype=np.float64) * (1 << SCORE_BITS)).astype(np.int64)


def l1_distance(exact: np.ndarray, estimate_grid: np.ndarray) -> Fraction:
    """||exact - estimate||₁, exact: ``exact`` int64 counts, ``estimate_grid`` from ``on_score_grid``.
    Moves by at most ||c||₁ when ``exact`` moves by c (the triangle inequality, with no rounding)."""
    scaled = np.asarray(exact, dtype=np.int64) << SCORE_BITS
    total = int(np.abs(scaled - estimate_grid).sum(dtype=np.int64))
    return Fraction(total, 1 << SCORE_BITS)


def choose(scores: list[Fraction], sensitivity: Fraction, epsilon: Fraction, source) -> int:
    """The exponential mechanism at ``epsilon`` over ``scores`` of ``sensitivity``: index r with
    probability ∝ exp(ε·q_r / (2Δ_q)). Each log weight is one correctly rounded quotient of exact
    rationals (relative error 2**-53: ε becomes at most ε(1 + 2**-52), ``noise.exponential_mechanism``)."""
    # No shift by the largest score here: each weight is then the intended ε·q/(2Δ) within a relative
    # 2**-53, the precondition of the sampler's analysis (which subtracts the maximum itself, exactly).
    weights = np.array([float(epsilon * q / (2 * sensitivity)) for q in scores])
    return noise.exponential_mechanism(weights, source)
