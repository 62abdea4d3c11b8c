"""Partition selection: which private GROUP BY keys may be released.

A group is released only if a noisy count of the distinct privacy units in it reaches a
threshold (Korolova, Kenthapadi, Mishra, Ntoulas 2009, "Releasing search queries and clicks
privately", WWW; Wilson, Zhang, Lam, Desfontaines, Simmons-Marengo, Gipson 2020, "Differentially
private SQL with bounded user contribution", PoPETs, Section 3 and Appendix). The output is the
set of released keys, nothing else; their aggregates are noised and charged separately.

Precondition (made true upstream by MAX GROUPS PER UNIT): each unit is counted in at most
``l`` groups, and ``unit_counts`` lists exactly the groups with at least one unit (a group with
count 0 may be listed only if its presence is public, e.g. a declared key).

Mechanism: release group g when c_g + Z_g >= tau, Z_g i.i.d. discrete Laplace with
P(z) ∝ p**|z|, p = exp(-1/t), and

    t   = L1 / epsilon,   L1 = l (unbounded neighbours) or 2·l (bounded neighbours),
    tau = 1 + m,          m  = the smallest integer with l · P(Z >= m) <= delta,

where P(Z >= m) = p**m / (1 + p) for m >= 1, so (the usual case) m = ceil(t·ln(l / (delta·(1 + p)))).
Equivalently tau is the smallest integer with l · P(1 + Z >= tau) <= delta.

Why (epsilon, delta)-DP. Let D ~ D', H the groups present in both, A (in D only) and A' (in
D' only). A group present on one side only holds no unit but the one that changed, so its
count there is exactly 1, and that unit is in at most l groups: |A|, |A'| <= l.
  * Unbounded (D' = D plus one unit): A is empty. On H the counts move by at most 1 in at
    most l groups, L1 <= l; bounded (one unit replaced): -1 in up to l groups and +1 in up to
    l others, L1 <= 2·l. With t = L1/epsilon the released subset of H is epsilon-DP.
  * A group of A' is released with probability P(1 + Z >= tau), so none of them is, except
    with probability 1 - q' <= l · P(1 + Z >= tau) <= delta (union bound); the same for A.
  * For a set S of outputs, let S_H be its members that are subsets of H, a and a' the
    probabilities that the released part of H lies in S_H on D and on D' (a <= e**epsilon·a'),
    and q, q' the probabilities that no group of A, of A', is released. Then
    P[M(D) in S] <= a·q + (1 - q) and P[M(D') in S] >= a'·q', so
    P[M(D) in S] - e**epsilon·P[M(D') in S] <= min(1, e**epsilon·a')·q + (1 - q) - e**epsilon·a'·q',
    which is at most max(1 - q, 1 - q') <= delta whatever a'. Swap D and D' for the other way.
How delta splits: none of it goes to the groups of H (pure epsilon there); all of it covers
the groups on one side only. Under bounded neighbours the groups that vanish (A) and those that
appear (A') do not add up: the bound is the larger of the two failure probabilities, never
their sum, so the same ``l · P(1 + Z >= tau) <= delta`` holds for both relations; only the
noise scale doubles. ``tests/test_selection.py`` checks this by brute force over every output
set.

Exactness: epsilon, delta and the scale are Fractions; the scale is the one the sampler really
uses (``noise.discrete_laplace_sampled_scale``, rounded up if its terms are large), because a
larger scale raises the one-sided release probability. The tail is evaluated with 60-digit
decimals; a case within a relative 1e-30 of the bound counts as failing it, so tau can only be
one too large (safe), never too small.

>>> rule = selection_rule(Fraction(1), Fraction(1, 10**6), groups_per_unit=1, neighbours="unbounded")
>>> rule.scale, rule.threshold
(Fraction(1, 1), 15)
>>> select_partitions([1, 40, 3], rule, noise.SeededSource(0)).tolist()
[False, True, False]
"""

from __future__ import annotations

import decimal
import math
import numbers
from dataclasses import dataclass
from fractions import Fraction
from typing import Sequence

import numpy as np

from dpsql.errors import InternalError
from dpsql.mechanisms import noise
from dpsql.mechanisms.calibrate import laplace_scale

__all__ = ["SelectionRule", "selection_rule", "select_partitions", "release_probability"]

_DIGITS = 60                    # decimal digits of the tail computation
_SLACK = decimal.Decimal("1e-30")   # relative margin below delta that a tail must clear


@dataclass(frozen=True)
class SelectionRule:
    """How partition selection releases keys: noise scale, threshold and what they guarantee."""

    scale: Fraction
    """Discrete Laplace scale t of the noisy unit counts (as sampled: never below L1/epsilon)."""
    threshold: int
    """A group is released when its unit count plus noise is at least this (tau)."""
    epsilon: Fraction
    """Epsilon of the selection."""
    delta: Fraction
    """Delta of the selection: bounds l · P(1 + Z >= threshold)."""
    groups_per_unit: int
    """l: the most groups one unit is counted in."""
    neighbours: str
    """``"unbounded"`` (add or remove a unit) or ``"bounded"`` (replace one)."""


def selection_rule(epsilon: Fraction, delta: Fraction, groups_per_unit: int, neighbours: str) -> SelectionRule:
    """The scale and smallest threshold making selection (epsilon, delta)-DP (module docstring).

    >>> r = selection_rule(Fraction(1, 2), Fraction(1, 10**7), groups_per_unit=5, neighbours="bounded")
    >>> r.scale, r.threshold
    (Fraction(20, 1), 343)
    """
    epsilon = _check_fraction(epsilon, "epsilon")
    delta = _check_fraction(delta, "delta")
    if delta >= 1:
        raise InternalError(f"partition selection needs delta < 1, got {delta}")
    if isinstance(groups_per_unit, bool) or not isinstance(groups_per_unit, numbers.Integral) \
            or groups_per_unit < 1:
        raise InternalError(f"groups per unit must be an integer >= 1, got {groups_per_unit!r}")
    groups_per_unit = int(groups_per_unit)
    if neighbours == "unbounded":
        l1 = groups_per_unit
    elif neighbours == "bounded":
        l1 = 2 * groups_per_unit
    else:
        raise InternalError(f"unknown neighbour relation {neighbours!r}")
    scale = noise.discrete_laplace_sampled_scale(laplace_scale(Fraction(l1), epsilon))
    return SelectionRule(scale=scale, threshold=1 + _smallest_passing_m(scale, delta, groups_per_unit),
                         epsilon=epsilon, delta=delta, groups_per_unit=groups_per_unit, neighbours=neighbours)


def select_partitions(unit_counts: Sequence[int], rule: SelectionRule, source=None) -> np.ndarray:
    """Boolean mask of the groups released: unit count + discrete Laplace noise >= threshold.

    All the noise is drawn in one batch (``noise.discrete_laplace``), one draw per group.

    >>> rule = selection_rule(Fraction(1), Fraction(1, 10**6), groups_per_unit=2, neighbours="unbounded")
    >>> select_partitions([], rule).tolist()
    []
    """
    counts = _check_counts(unit_counts)
    noisy = counts + noise.discrete_laplace(rule.scale, counts.size, source)
    return noisy >= rule.threshold


def release_probability(count: int, rule: SelectionRule) -> float:
    """P(count + Z >= threshold), exactly up to the final rounding to float.

    >>> rule = selection_rule(Fraction(1), Fraction(1, 10**6), groups_per_unit=1, neighbours="unbounded")
    >>> release_probability(1, rule) <= 1e-6 < release_probability(2, rule)
    True
    """
    if isinstance(count, bool) or not isinstance(count, numbers.Integral):
        raise InternalError(f"a unit count must be an integer, got {count!r}")
    with decimal.localcontext(_context()):
        return float(_tail(rule.scale, rule.threshold - int(count)))


# ---------------------------------------------------------------- exact tails

def _context() -> decimal.Context:
    return decimal.Context(prec=_DIGITS, Emin=decimal.MIN_EMIN, Emax=decimal.MAX_EMAX)


def _tail(scale: Fraction, m: int) -> decimal.Decimal:
    """P(Z >= m) for discrete Laplace Z of scale t: p**m/(1+p) for m >= 1, else 1 - P(Z >= 1-m)."""
    t = decimal.Decimal(scale.numerator) / decimal.Decimal(scale.denominator)
    p = (-1 / t).exp()
    if m >= 1:
        return (-decimal.Decimal(m) / t).exp() / (1 + p)
    return 1 - (-decimal.Decimal(1 - m) / t).exp() / (1 + p)


def _smallest_passing_m(scale: Fraction, delta: Fraction, groups_per_unit: int) -> int:
    """The smallest integer m with l · P(Z >= m) <= delta, with a margin in the safe direction."""
    with decimal.localcontext(_context()):
        bound = decimal.Decimal(delta.numerator) / decimal.Decimal(delta.denominator) * (1 - _SLACK)

        def passes(m: int) -> bool:
            return groups_per_unit * _tail(scale, m) <= bound

        t = float(scale)
        # ln(delta) from its numerator and denominator: float(delta) underflows to 0 below
        # ~5e-324 (and math.log(0) raises). The estimate only seeds the exact search below.
        log_delta = math.log(delta.numerator) - math.log(delta.denominator)
        estimate = t * (math.log(groups_per_unit) - log_delta - math.log1p(math.exp(-1 / t)))
        m = max(1, math.ceil(estimate)) if math.isfinite(estimate) else 1
        while not passes(m):            # the float estimate is off by a step at most, usually
            m += 1
        while passes(m - 1):
            m -= 1
        return m


def _check_fraction(x: Fraction | int, name: str) -> Fraction:
    if isinstance(x, bool) or not isinstance(x, numbers.Rational) or not x > 0:
        raise InternalError(f"{name} must be a positive Fraction or int, got {x!r}")
    return Fraction(x)


def _check_counts(unit_counts: Sequence[int]) -> np.ndarray:
    values = list(unit_counts)
    if any(isinstance(c, (bool, np.bool_)) or not isinstance(c, numbers.Integral) or c < 0 for c in values):
        raise InternalError("unit counts must be integers >= 0")
    if values and max(values) >= 2**62:
        raise InternalError("a unit count does not fit int64")
    return np.array(values, dtype=np.int64)
