"""A bound per unit chosen by DP: a quantile of the magnitudes of per-(unit, group) totals.

For an aggregated column with row bounds [lo, hi], each (unit, group) of a query has a total
T = Σ v' of its kept rows' values clamped into [lo, hi]. The per-unit contribution model clamps
T into [-B, B] (or [0, B] when lo ≥ 0, [-B, 0] when hi ≤ 0): its noise depends on B alone
(``dpsql.analysis.sensitivity.unit_total_sensitivity``: l·max(|L|, |U|)), so one draw of B, a
quantile of the magnitudes |T|, is all the noise needs; the clamp moves only the totals with
|T| > B, the share this module states.

The draw is the exponential mechanism over public candidates ``candidates_below(cap)``
(m·10^e below the cap, then the cap k·max(|lo|, |hi|) itself, beyond which no total of at most
k kept rows can lie), with the utility of ``dpsql.curator.suggest_quantiles.pick_quantile``:

    u(c_i) = -max(q·n - rank(c_i), rank(c_{i-1}) - q·n, 0),   rank(c_{-1}) = 0,

rank(c) the totals with |T| ≤ c and n all totals (both private). It is 0 only at the first
candidate reaching rank q·n, and falls on both sides.

**Sensitivity.** One unit has at most l totals (l = the groups it may touch: MAX GROUPS PER UNIT,
or 1 without GROUP BY; the statement keeps each unit's first l groups). Write a = q·n -
rank(c_i), b = rank(c_{i-1}) - q·n. Adding a unit with t ≤ l totals moves n by t and each rank
by r ∈ [0, t]: a by q·t - r ∈ [-(1-q)·t, q·t], b by r' - q·t ∈ [-q·t, (1-q)·t]; removing it
is the reverse. Replacing it (bounded neighbours) moves each rank by at most l and n not at all:
a and b by at most l. max(a, b, 0) moves by at most what a and b move, so Δu = l, reached when
bounded. ``tests/test_total_bound.py`` checks it over every neighbouring pair of small data.

**What is stated.** When the cap holds every total (it does: a unit's kept rows are at most k),
the best utility is 0, and by the EM's utility theorem, with probability ≥ 1 - α, the drawn c_i
has q·n - rank(c_i) ≤ d = 2·l·ln(N/α)/ε (N candidates): at most (1 - q)·n + d totals have |T|
beyond the bound. ``stated_excess`` is d, a public number (ε, l, N and α are).
"""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np

from dpsql.mechanisms.noise import exponential_mechanism

MANTISSAS = (Fraction(1), Fraction(3, 2), Fraction(2), Fraction(3), Fraction(5), Fraction(7))
"""The candidates are m·10^e for these m: about 6 a decade, each within 1.5x of the next."""
QUANTILE = Fraction(99, 100)
"""The quantile of the totals' magnitudes each draw aims at."""
ALPHA = Fraction(1, 40)
"""The stated share holds with probability at least 1 - this (97.5%)."""


def candidates_below(cap: Fraction, smallest: Fraction = Fraction(1, 1000)) -> tuple[Fraction, ...]:
    """The public candidates of a bound: m·10^e (``MANTISSAS``) from ``smallest`` up to below
    ``cap``, then ``cap`` itself (the largest magnitude a total can have).

    >>> [str(c) for c in candidates_below(Fraction(25), Fraction(1))]
    ['1', '3/2', '2', '3', '5', '7', '10', '15', '20', '25']
    """
    cap, smallest = Fraction(cap), Fraction(smallest)
    if cap <= 0:
        raise ValueError("a bound's cap must be positive")
    found = []
    exponent = math.floor(math.log10(smallest)) - 1
    while True:
        decade = Fraction(10) ** exponent
        values = [m * decade for m in MANTISSAS if smallest <= m * decade < cap]
        found += values
        if decade * MANTISSAS[0] >= cap:
            break
        exponent += 1
    return tuple(sorted(set(found))) + (cap,)


def rank_gaps(ranks, total: int, quantile: Fraction) -> tuple[list[int], int]:
    """-u(c_i) of each candidate (module docstring), exactly: integers ``gaps`` and the scale b
    they are multiplied by (q = a/b). ``ranks[i]``: the totals at or below candidate i.

    >>> rank_gaps([10, 50, 100, 100], 100, Fraction(2, 5))
    ([150, 0, 50, 300], 5)
    """
    q = Fraction(quantile)
    a, b = q.numerator, q.denominator
    target = a * int(total)
    gaps, before = [], 0
    for rank in ranks:
        gaps.append(max(target - b * int(rank), b * before - target, 0))
        before = int(rank)
    return gaps, b


def utility(ranks, total: int, quantile: Fraction) -> list[Fraction]:
    """u(c_i) of each candidate, exact (for the sensitivity oracle).

    >>> utility([1, 3], 3, Fraction(1, 2))
    [Fraction(-1, 2), Fraction(0, 1)]
    """
    gaps, scale = rank_gaps(ranks, total, quantile)
    return [Fraction(-gap, scale) for gap in gaps]


LOG_WEIGHT_FLOOR = Fraction(10**6)
"""Log weights are clipped at minus this: ``exponential_mechanism`` never picks a candidate more than
~700 below the best, so the clip changes no draw, and the floats stay finite."""


def draw_total_bound(ranks, total: int, epsilon: Fraction, groups_per_unit: int,
                     quantile: Fraction = QUANTILE, source=None) -> int:
    """Index of the candidate drawn by the exponential mechanism at ``epsilon``, its utility's
    sensitivity ``groups_per_unit`` (l: module docstring); ``ranks`` as in ``rank_gaps``.

    >>> from dpsql.mechanisms.noise import SeededSource
    >>> draw_total_bound([10, 50, 100, 100], 100, Fraction(50), 1, Fraction(2, 5), SeededSource(0))
    1
    """
    if groups_per_unit < 1 or epsilon <= 0:
        raise ValueError("a draw needs epsilon > 0 and at least one group per unit")
    gaps, scale = rank_gaps(ranks, total, quantile)
    best = min(gaps)
    coefficient = Fraction(epsilon) / (2 * groups_per_unit * scale)
    # each log weight exact until one rounding to float, as pick_quantile computes its own; clipped
    # at -LOG_WEIGHT_FLOOR (a 1-Lipschitz clip of the utility keeps its sensitivity, and no weight that
    # far below the best can win), so no epsilon and no count of totals can overflow the float (an
    # attacker's review: at epsilon 1e305 the charged draw failed or not with the number of totals)
    weights = np.array([float(max(-(gap - best) * coefficient, -LOG_WEIGHT_FLOOR)) for gap in gaps],
                       dtype=np.float64)
    return int(exponential_mechanism(weights, source))


def stated_excess(epsilon: Fraction, candidates: int, groups_per_unit: int, alpha: Fraction = ALPHA) -> float:
    """d: with probability ≥ 1 - ``alpha`` at most (1 - q)·n + d totals lie beyond the drawn
    bound (module docstring), rounded up.

    >>> stated_excess(Fraction(1, 10), 40, 3, Fraction(1, 40))
    443
    """
    return math.ceil(2 * groups_per_unit * math.log(candidates / float(alpha)) / float(epsilon))
