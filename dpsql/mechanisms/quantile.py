"""DP quantiles (and MIN, MAX) by the exponential mechanism over a public grid of edges.

Upstream SQL gives, per group, the counts of clamped values in ``B`` equal-width buckets of
[lower, upper]: bucket i = [lower + i·w, lower + (i+1)·w), w = (upper - lower)/B, the last one
closed. The candidates are the B + 1 edges e_j = lower + j·w, a public grid: the released value
is always one of them, whatever the data. With n = sum of the counts and c_j = counts[0] + ...
+ counts[j-1] (the values below edge j; c_0 = 0, c_B = n), the utility of edge j for the
quantile q is

    u(j) = -|c_j - q·n|,

and edge j is drawn with probability proportional to exp(epsilon·u(j) / (2·Delta_u)), which is
epsilon-DP for any Delta_u >= max |u(D, j) - u(D', j)| over neighbours D ~ D' and edges j
(McSherry & Talwar 2007). MIN is q = 0 and MAX is q = 1.

Precondition (made true upstream by MAX ROWS PER UNIT): one unit contributes m <= k values to
the group's histogram (k = ``rows_per_unit``; its values in other groups only lower m).

Unbounded neighbours (add or remove one unit with m <= k values): n moves by m and c_j by some
a in [0, m], so c_j - q·n moves by a - q·m, in [-q·m, (1-q)·m]:

    Delta_u = k · max(q, 1 - q).

Bounded neighbours (replace one unit's m values by m' values, m, m' <= k): c_j - q·n moves by
(b - q·m') - (a - q·m) with a in [0, m], b in [0, m'], so by at most (1-q)·m' + q·m <= k:

    Delta_u = k   (for every q).

Both bounds are reached (k values moved past one edge, away from q·n) when B >= 2; with a single
bucket the bounded one is only k·max(q, 1-q), and k is kept (it is the general bound). Note that
|u| is taken of a difference that can only move by the amounts above, so the absolute value
never enlarges the change. ``tests/test_quantile.py`` checks both facts over every neighbouring
pair of small multisets.

Accuracy (the EM utility theorem, Dwork & Roth Thm 3.11): with probability >= 1 - alpha the
chosen edge has |c_j - q·n| <= OPT + (2·Delta_u/epsilon)·(ln(B + 1) + ln(1/alpha)), where
OPT = min_i |c_i - q·n| is the grid's own error (at most the count of the bucket holding the
q-quantile), a bias like clamping and not part of the noise bound. For MIN and MAX the rank is
all that is guaranteed: every edge at or below the smallest value has the best utility (0), so
a released MIN has few values below it but may lie anywhere in [lower, true minimum]
(symmetrically for MAX).

A value interval (``release_interval``). A rank bound says nothing about values without
reading data, so part of the aggregate's own epsilon buys two more draws on the same
histogram, one per endpoint. Let R0 be an endpoint draw's own public rank bound
(``quantile_accuracy`` of ``endpoint_rule`` at ENDPOINT_ALPHA/2, uncapped, rounded up),
A = ceil(R0/2) and R = R0 + A (``endpoint_shift``). The lower endpoint aims at rank
t = q·n - R and scores edge j by how far t lies from the ranks of the bucket above it,

    u_low(j) = -dist(t, [c_j, c_{j+1}])      (j < B; [n, n] for j = B),

except that edge 0, the public lower bound, scores at least -A: u_low(0) = max(-A, ...). The
upper endpoint aims at t = q·n + R with the bucket below each edge ([c_{j-1}, c_j]; [0, 0] for
j = 0) and edge B, the upper bound, at least -A. dist(t, [a, b]) = max(a - t, 0, t - b) is
1-Lipschitz in (a - q·n, b - q·n), each of which moves between neighbours as c_j - q·n does,
and R, A are public: each endpoint utility has the quantile's Delta_u
(``tests/test_accuracy.py`` enumerates it).

Coverage. Let v be a q-quantile of the clamped values: #{x < v} <= q·n <= #{x <= v}. If the
lower endpoint misses (low > v), c_low = #{x < low} >= #{x <= v} >= q·n, so its score is at
most -(c_low - t) <= -R, while edge 0 scores at least -A: by the EM's tail bound (Dwork & Roth
Thm 3.11) that has probability at most (B + 1)·exp(-epsilon_e·(R - A)/(2·Delta_u)) =
ENDPOINT_ALPHA/2. Symmetrically for the upper endpoint (c_high <= #{x < v} <= q·n). So with
probability >= 1 - ENDPOINT_ALPHA, [low, high] holds every q-quantile of the histogram's
values, with no grid error: c_j counts the values below edge j exactly, and a heavy bucket
holding t scores 0. (The plain utility -|c_j - t| has the theorem only up to the grid's OPT,
which is large for heavy buckets and when t falls outside [0, n]: few values above a high
quantile, a small group. Measured: 15 misses in 400 for the 0.9-quantile of 200 values, and
coverage lost entirely on data with heavy buckets.) The bound's floor -A keeps it from taking
mass from good edges (it wins only when no edge scores above -A, e.g. q·n < R - A), at the
price of R = 1.5·R0. DuckDB's QUANTILE_CONT interpolates between two neighbouring values,
which can put it up to one value's gap outside.

The epsilon split is VALUE_SHARE for the value and the rest for the endpoints, halved between
two (MIN, q = 0, needs only the upper endpoint, its lower being the public lower bound; MAX only
the lower); the three draws compose to the aggregate's epsilon, so the query costs what it
did. The interval is clamped so low <= value <= high (post-processing).

Floats: the weights are computed exactly (integers) and rounded once, correctly, to float64
(a relative error 2**-53, so epsilon becomes at most epsilon·(1 + 2**-52)); the Gumbel-max
sampler adds at most 2**-38 to epsilon and a delta below (B + 1)·e**epsilon·2**-999
(``noise.exponential_mechanism`` quantifies both).

>>> rule = quantile_rule(0.5, Fraction(1), rows_per_unit=2, neighbours="unbounded",
...                      lower=Fraction(0), upper=Fraction(100), buckets=10)
>>> rule.utility_sensitivity
Fraction(1, 1)
>>> release_quantile([0, 0, 50, 100, 50, 0, 0, 0, 0, 0], rule, noise.SeededSource(3))
Fraction(40, 1)
>>> round(quantile_accuracy(rule, 200, 0.05), 2)
10.79
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass, replace
from fractions import Fraction
from typing import Sequence

import numpy as np

from dpsql.errors import InternalError
from dpsql.mechanisms import noise

__all__ = ["QuantileRule", "quantile_rule", "release_quantile", "quantile_accuracy", "release_interval",
           "value_rule", "endpoint_rule", "endpoint_shift", "bound_floor", "edge", "VALUE_SHARE", "ENDPOINT_ALPHA"]

MAX_BUCKETS = 2**20     # candidates are materialised; more would only cost time and ln(B+1)

VALUE_SHARE = Fraction(1, 2)
"""Share of a quantile aggregate's epsilon spent on the released value; the rest buys its
value interval's endpoints (a quarter each, or a half for MIN's or MAX's single endpoint).
Why half: the value's rank error doubles (against spending all epsilon on it), the price of
stating it in values at all; giving the endpoints less would widen the interval (R grows as
1/epsilon_e) more than it would narrow the value's error."""

ENDPOINT_ALPHA = 0.05
"""The endpoints are drawn, at release time, for a 1 - ENDPOINT_ALPHA (95%) interval."""


@dataclass(frozen=True)
class QuantileRule:
    """How one DP quantile is released: the grid, the utility's sensitivity and epsilon."""

    q: float
    """The quantile level in [0, 1] (0 is MIN, 1 is MAX); used exactly, as the binary fraction it is."""
    epsilon: Fraction
    """Epsilon of this release."""
    rows_per_unit: int
    """k: the most values one unit contributes to the histogram."""
    neighbours: str
    """``"unbounded"`` (add or remove a unit) or ``"bounded"`` (replace one)."""
    lower: Fraction
    """The first edge of the grid (values are clamped into [lower, upper])."""
    upper: Fraction
    """The last edge of the grid."""
    buckets: int
    """B: the number of equal-width buckets; there are B + 1 candidate edges."""
    utility_sensitivity: Fraction
    """Delta_u: k·max(q, 1-q) unbounded, k bounded (module docstring)."""


def quantile_rule(q: float, epsilon: Fraction | int, rows_per_unit: int, neighbours: str,
                  lower: Fraction | int, upper: Fraction | int, buckets: int = 1024) -> QuantileRule:
    """Validate the parameters and derive the utility sensitivity.

    >>> quantile_rule(0.25, Fraction(1, 2), 3, "unbounded", 0, 10).utility_sensitivity
    Fraction(9, 4)
    >>> quantile_rule(0.25, Fraction(1, 2), 3, "bounded", 0, 10).utility_sensitivity
    Fraction(3, 1)
    """
    if isinstance(q, bool) or not isinstance(q, numbers.Real) or not 0 <= q <= 1:
        raise InternalError(f"a quantile level must be a number in [0, 1], got {q!r}")
    q = float(q)
    if isinstance(epsilon, bool) or not isinstance(epsilon, numbers.Rational) or not epsilon > 0:
        raise InternalError(f"epsilon must be a positive Fraction or int, got {epsilon!r}")
    if isinstance(rows_per_unit, bool) or not isinstance(rows_per_unit, numbers.Integral) or rows_per_unit < 1:
        raise InternalError(f"rows per unit must be an integer >= 1, got {rows_per_unit!r}")
    for name, bound in (("lower", lower), ("upper", upper)):
        if isinstance(bound, bool) or not isinstance(bound, numbers.Rational):
            raise InternalError(f"the {name} bound must be a Fraction or int, got {bound!r}")
    if not lower < upper:
        raise InternalError(f"quantile bounds must satisfy lower < upper, got [{lower}, {upper}]")
    if isinstance(buckets, bool) or not isinstance(buckets, numbers.Integral) or not 1 <= buckets <= MAX_BUCKETS:
        raise InternalError(f"buckets must be an integer in [1, 2**20], got {buckets!r}")
    k = Fraction(int(rows_per_unit))
    if neighbours == "unbounded":
        sensitivity = k * max(Fraction(q), 1 - Fraction(q))
    elif neighbours == "bounded":
        sensitivity = k
    else:
        raise InternalError(f"unknown neighbour relation {neighbours!r}")
    return QuantileRule(q=q, epsilon=Fraction(epsilon), rows_per_unit=int(rows_per_unit), neighbours=neighbours,
                        lower=Fraction(lower), upper=Fraction(upper), buckets=int(buckets),
                        utility_sensitivity=sensitivity)


def release_quantile(bucket_counts: Sequence[int], rule: QuantileRule, source=None, shift: int = 0) -> Fraction:
    """The released edge lower + j·w, j drawn by the exponential mechanism for the target rank
    q·n + ``shift`` (a public integer; 0 for the quantile itself) with the rule's epsilon.

    >>> rule = quantile_rule(0, Fraction(1), 1, "bounded", 0, 8, buckets=8)
    >>> release_quantile([0] * 8, rule, noise.SeededSource(0)) in [Fraction(i) for i in range(9)]
    True
    """
    return edge(rule, noise.exponential_mechanism(_log_weights(bucket_counts, rule, shift), source))


def edge(rule: QuantileRule, j: int) -> Fraction:
    """The value of edge j of the rule's grid."""
    return rule.lower + j * (rule.upper - rule.lower) / rule.buckets


def _endpoints(rule: QuantileRule) -> int:
    """How many endpoints are drawn: one for MIN and MAX (the other is a public bound), else two."""
    return 1 if rule.q in (0.0, 1.0) else 2


def value_rule(rule: QuantileRule) -> QuantileRule:
    """The rule of the value draw: VALUE_SHARE of the aggregate's epsilon."""
    return replace(rule, epsilon=rule.epsilon * VALUE_SHARE)


def endpoint_rule(rule: QuantileRule) -> QuantileRule:
    """The rule of one endpoint draw: the rest of the epsilon, split between the endpoints.

    >>> rule = quantile_rule(0.5, Fraction(1), 1, "bounded", 0, 8, buckets=8)
    >>> value_rule(rule).epsilon + 2 * endpoint_rule(rule).epsilon
    Fraction(1, 1)
    """
    return replace(rule, epsilon=rule.epsilon * (1 - VALUE_SHARE) / _endpoints(rule))


def endpoint_shift(rule: QuantileRule) -> int:
    """R = R0 + A: R0 an endpoint draw's public rank bound at ENDPOINT_ALPHA/2 (uncapped),
    rounded up, and A = ``bound_floor`` (module docstring)."""
    return _rank_bound(rule) + bound_floor(rule)


def bound_floor(rule: QuantileRule) -> int:
    """A = ceil(R0/2): the public bound's edge scores at least -A in an endpoint draw."""
    return (_rank_bound(rule) + 1) // 2


def _rank_bound(rule: QuantileRule) -> int:
    return math.ceil(quantile_accuracy(endpoint_rule(rule), math.inf, ENDPOINT_ALPHA / 2))


def release_interval(bucket_counts: Sequence[int], rule: QuantileRule, source=None) -> tuple[int, int, int]:
    """Edge indices (value, low, high) of a quantile released with its value interval.

    ``rule`` carries the aggregate's whole epsilon; the value is drawn with ``value_rule``,
    each endpoint with ``endpoint_rule`` aiming at rank q·n ∓ R (module docstring). The endpoints
    are clamped so low <= value <= high.

    >>> rule = quantile_rule(0.5, Fraction(1), 1, "bounded", 0, 100, buckets=100)
    >>> value, low, high = release_interval([1] * 100, rule, noise.SeededSource(1))
    >>> low <= value <= high
    True
    """
    counts = _check_counts(bucket_counts, rule.buckets)
    value = noise.exponential_mechanism(_log_weights(counts, value_rule(rule)), source)
    low = 0 if rule.q == 0.0 else noise.exponential_mechanism(_endpoint_log_weights(counts, rule, "low"), source)
    high = rule.buckets if rule.q == 1.0 else noise.exponential_mechanism(
        _endpoint_log_weights(counts, rule, "high"), source)
    return value, min(low, value), max(high, value)


def quantile_accuracy(rule: QuantileRule, n_released: float, alpha: float) -> float:
    """A rank error bound r: with probability >= 1 - alpha, |c_j - q·n| <= OPT + r.

    r = (2·Delta_u/epsilon)·(ln(B + 1) + ln(1/alpha)), in values (ranks), not in the column's
    units, rounded up. It is capped at max(q, 1 - q)·n_released, the largest rank error any
    edge can have when the group holds n_released values; since n_released is normally a noisy
    count, the capped figure is an estimate (pass ``math.inf`` for the uncapped bound). OPT,
    the grid's own error, is not included (module docstring).

    >>> rule = quantile_rule(0.5, Fraction(1), 1, "bounded", 0, 1, buckets=99)
    >>> round(quantile_accuracy(rule, math.inf, 0.01), 3)
    18.421
    >>> quantile_accuracy(rule, 10, 0.01)
    5.0
    """
    if isinstance(alpha, bool) or not isinstance(alpha, numbers.Real) or not 0 < alpha < 1:
        raise InternalError(f"alpha must be in (0, 1), got {alpha!r}")
    if isinstance(n_released, bool) or not isinstance(n_released, numbers.Real) or math.isnan(n_released):
        raise InternalError(f"n_released must be a number, got {n_released!r}")
    scale = float(2 * rule.utility_sensitivity / rule.epsilon)
    bound = scale * (math.log(rule.buckets + 1) - math.log(alpha)) * (1 + 2**-48)   # rounded up
    return min(bound, max(rule.q, 1 - rule.q) * max(float(n_released), 0.0))


def _endpoint_log_weights(bucket_counts: Sequence[int], rule: QuantileRule, side: str) -> np.ndarray:
    """The log weights of an endpoint draw (module docstring), exact as ``_log_weights``'s, with
    ``endpoint_rule(rule)``'s epsilon; ``rule`` is the aggregate's, ``side`` "low" or "high"."""
    counts = _check_counts(bucket_counts, rule.buckets)
    a, b = rule.q.as_integer_ratio()
    below = [0]
    for count in counts:
        below.append(below[-1] + count)
    n = below[-1]
    shift, floor = endpoint_shift(rule), bound_floor(rule)
    if side == "low":
        target = a * n - shift * b                                  # b·t
        ranges = list(zip(below, below[1:] + [n]))                  # the bucket above each edge
        anchor = 0
    else:
        target = a * n + shift * b
        ranges = list(zip([0] + below[:-1], below))                 # the bucket below each edge
        anchor = rule.buckets
    gaps = [max(low * b - target, 0, target - high * b) for low, high in ranges]   # b·dist(t, range)
    gaps[anchor] = min(gaps[anchor], floor * b)
    return _weights_of(gaps, endpoint_rule(rule), b)


def _weights_of(gaps: list[int], rule: QuantileRule, b: int) -> np.ndarray:
    """-(gap - best)·epsilon/(2·Delta_u·b) per edge, each correctly rounded: one IEEE division of
    exact doubles when every numerator and the denominator are below 2**53, else Python's
    int / int (which also rounds correctly)."""
    best = min(gaps)
    coefficient = rule.epsilon / (2 * rule.utility_sensitivity * b)
    num, den = coefficient.numerator, coefficient.denominator
    if (max(gaps) - best) * num < 2**53 and den < 2**53:
        return -(np.array(gaps, dtype=np.int64) - best) * num / den   # int64 products below 2**53: exact
    huge = den * 10**300      # a weight below -1e300 has probability 0 in any float: -inf
    return np.array([-((gap - best) * num) / den if (gap - best) * num < huge else -math.inf
                     for gap in gaps], dtype=np.float64)


def _log_weights(bucket_counts: Sequence[int], rule: QuantileRule, shift: int = 0) -> np.ndarray:
    """epsilon·(u(j) - max u)/(2·Delta_u) for each edge, each computed exactly and rounded once,
    for u(j) = -|c_j - (q·n + shift)| (``shift`` a public integer, 0 for the quantile itself).

    With q = a/b exactly (b a power of two), |c_j - q·n - s| = |c_j·b - a·n - s·b| / b in
    integers, so each weight is one correctly rounded integer division (Python's int / int).
    """
    counts = _check_counts(bucket_counts, rule.buckets)
    if isinstance(shift, bool) or not isinstance(shift, numbers.Integral):
        raise InternalError(f"a target shift must be an integer, got {shift!r}")
    a, b = rule.q.as_integer_ratio()
    below = [0]
    for count in counts:
        below.append(below[-1] + count)
    target = a * below[-1] + int(shift) * b
    gaps = [abs(c * b - target) for c in below]                  # b·|c_j - q·n|
    return _weights_of(gaps, rule, b)


def _check_counts(bucket_counts: Sequence[int], buckets: int) -> list[int]:
    values = list(bucket_counts)
    if len(values) != buckets:
        raise InternalError(f"expected {buckets} bucket counts, got {len(values)}")
    if any(isinstance(c, (bool, np.bool_)) or not isinstance(c, numbers.Integral) or c < 0 for c in values):
        raise InternalError("bucket counts must be integers >= 0")
    return [int(c) for c in values]
