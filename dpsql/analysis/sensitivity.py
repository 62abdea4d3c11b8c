"""Sensitivity rules: how far one privacy unit can move a vector of released sums.

Every released aggregate of dpsql is reduced to one shape, a *bounded sum*: each unit
contributes, to each group, the sum of at most ``b_g`` of its rows' values, where every row
value lies in the integer interval [lower, upper] and the rows granted over all groups add
up to at most ``k`` (``MAX ROWS PER UNIT``; 1 when each row is its own unit). A COUNT is the
bounded sum of row values in [0, 1]; an AVG releases a centred SUM and a COUNT.

The rewrite stage makes that precondition true on the data (see ``dpsql.backends.rewrite``): after it,
the contribution vector ``c`` of one unit over the groups satisfies

    c_g in b_g * [min(lower, 0), max(upper, 0)]   and   sum_g b_g <= k,

so ``c`` lies in ``k * conv({lower * e_g, upper * e_g, 0})`` (``e_g`` the unit vector of group
g). Write ``lo = min(lower, 0)``, ``hi = max(upper, 0)`` and ``m = max(-lo, hi)``.

Unbounded neighbours (add or remove one unit): the change is one contribution vector.
  * ungrouped: |c| <= k*m, so L1 = L2 = k*m;
  * grouped:   ||c||_1 <= k*m and ||c||_2 <= ||c||_1, so L1 = L2 = k*m.
Bounded neighbours (replace one unit's data): the change is ``c - c'`` of two such vectors;
its norm is convex, so its maximum is at a difference of two vertices k*(x e_g - y e_h):
  * ungrouped (one group): |c - c'| <= k*(hi - lo), so L1 = L2 = k*(hi - lo);
  * grouped: g != h gives L1 = k*(|x| + |y|) <= 2*k*m and L2 = k*sqrt(x^2 + y^2) <= sqrt(2)*k*m;
    g == h gives k*(hi - lo) in both norms. So L1 = max(2*k*m, k*(hi - lo)) = 2*k*m and
    L2 = max(sqrt(2)*k*m, k*(hi - lo)).
Each bound is reached (a unit with k rows at the extreme value, in one or two groups), so none
can be lowered; ``tests/test_sensitivity_oracle.py`` checks both facts by brute force.

L2 is kept squared, so that it stays an exact ``Fraction``.

>>> s = bounded_sum_sensitivity(0, 1, rows_per_unit=10, neighbours="bounded", grouped=True)
>>> s.l1, s.l2_squared
(Fraction(20, 1), Fraction(200, 1))
"""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction

from dpsql.errors import InternalError


@dataclass(frozen=True)
class Sensitivity:
    """How far one unit can move a released vector, in the vector's own integer units."""

    l1: Fraction
    """Largest L1 distance between the vector on neighbouring datasets."""
    l2_squared: Fraction
    """Square of the largest L2 distance (kept squared to stay exact)."""


def bounded_sum_sensitivity(
    lower: int | Fraction,
    upper: int | Fraction,
    *,
    rows_per_unit: int,
    neighbours: str,
    grouped: bool,
) -> Sensitivity:
    """Sensitivity of a bounded sum, for the precondition stated in the module docstring.

    >>> bounded_sum_sensitivity(0, 500, rows_per_unit=10, neighbours="unbounded", grouped=False).l1
    Fraction(5000, 1)
    >>> bounded_sum_sensitivity(-3, 5, rows_per_unit=2, neighbours="bounded", grouped=False).l1
    Fraction(16, 1)
    """
    lower, upper = Fraction(lower), Fraction(upper)
    if lower > upper:
        raise InternalError(f"bounds out of order: [{lower}, {upper}]")
    if rows_per_unit < 1:
        raise InternalError(f"rows per unit must be at least 1, got {rows_per_unit}")
    k = Fraction(rows_per_unit)
    lo, hi = min(lower, Fraction(0)), max(upper, Fraction(0))
    m = max(-lo, hi)
    if neighbours == "unbounded":
        return Sensitivity(l1=k * m, l2_squared=(k * m) ** 2)
    if neighbours != "bounded":
        raise InternalError(f"unknown neighbour relation {neighbours!r}")
    spread = k * (hi - lo)
    if not grouped:
        return Sensitivity(l1=spread, l2_squared=spread**2)
    return Sensitivity(l1=2 * k * m, l2_squared=max(2 * (k * m) ** 2, spread**2))


def distinct_units_sensitivity(*, groups_per_unit: int, neighbours: str, grouped: bool) -> Sensitivity:
    """Sensitivity of per-group counts of distinct units (COUNT(DISTINCT unit), and the counts
    partition selection thresholds).

    Precondition (made true by the rewrite): a unit adds exactly 1 to the count of each group
    it keeps rows in, and keeps rows in at most ``l = groups_per_unit`` groups. So its
    contribution vector is 0/1 with at most l ones.
      * ungrouped: the one count moves by at most 1 under either relation (a replaced unit
        leaves, its replacement may or may not arrive): L1 = L2 = 1;
      * grouped, unbounded: at most l entries move by 1: L1 = l, L2 = sqrt(l);
      * grouped, bounded: the leaving unit's l groups drop by 1 and the arriving unit's l
        groups rise by 1; where they overlap the changes cancel: L1 = 2l, L2 = sqrt(2l).

    >>> s = distinct_units_sensitivity(groups_per_unit=3, neighbours="bounded", grouped=True)
    >>> s.l1, s.l2_squared
    (Fraction(6, 1), Fraction(6, 1))
    """
    if groups_per_unit < 1:
        raise InternalError(f"groups per unit must be at least 1, got {groups_per_unit}")
    if neighbours not in ("unbounded", "bounded"):
        raise InternalError(f"unknown neighbour relation {neighbours!r}")
    if not grouped:
        return Sensitivity(l1=Fraction(1), l2_squared=Fraction(1))
    moved = Fraction(groups_per_unit * (2 if neighbours == "bounded" else 1))
    return Sensitivity(l1=moved, l2_squared=moved)


def unit_total_sensitivity(lower: int | Fraction, upper: int | Fraction, *, groups_per_unit: int,
                           neighbours: str, grouped: bool) -> Sensitivity:
    """Sensitivity of a sum of per-unit totals (the per-unit contribution model).

    Precondition (made true by the rewrite): each unit's total in each group, summed over its
    rows, is clamped into [lower, upper], and a unit touches at most ``l = groups_per_unit``
    groups (1 when ungrouped). Its contribution vector has at most l non-zero entries, each in
    [lo, hi] = [min(lower, 0), max(upper, 0)]; write m = max(-lo, hi).
      * unbounded: one such vector: L1 = l*m, L2 = sqrt(l)*m;
      * bounded, ungrouped: one entry moves from one total to another: L1 = L2 = hi - lo;
      * bounded, grouped: with j of the leaving unit's groups shared with the arriving one's,
        L1 = j*(hi - lo) + 2*(l - j)*m <= 2*l*m and L2^2 = j*(hi - lo)^2 + 2*(l - j)*m^2, linear
        in j, so at most max(2*l*m^2, l*(hi - lo)^2).
    Each bound is reached (units at the extreme totals, in disjoint or the same groups).

    Whenever the rows' own bounds hold too (at most k rows in [L, U] per unit), both this and
    ``bounded_sum_sensitivity`` bound the same vector, so the smaller of the two is sound.

    >>> s = unit_total_sensitivity(-100, 600, groups_per_unit=3, neighbours="unbounded", grouped=True)
    >>> s.l1, s.l2_squared
    (Fraction(1800, 1), Fraction(1080000, 1))
    >>> unit_total_sensitivity(-100, 600, groups_per_unit=3, neighbours="bounded", grouped=False).l1
    Fraction(700, 1)
    """
    lower, upper = Fraction(lower), Fraction(upper)
    if lower > upper:
        raise InternalError(f"bounds out of order: [{lower}, {upper}]")
    if groups_per_unit < 1:
        raise InternalError(f"groups per unit must be at least 1, got {groups_per_unit}")
    if neighbours not in ("unbounded", "bounded"):
        raise InternalError(f"unknown neighbour relation {neighbours!r}")
    lo, hi = min(lower, Fraction(0)), max(upper, Fraction(0))
    m = max(-lo, hi)
    groups = Fraction(groups_per_unit if grouped else 1)
    if neighbours == "unbounded":
        return Sensitivity(l1=groups * m, l2_squared=groups * m * m)
    if not grouped:
        return Sensitivity(l1=hi - lo, l2_squared=(hi - lo) ** 2)
    return Sensitivity(l1=2 * groups * m, l2_squared=max(2 * groups * m * m, groups * (hi - lo) ** 2))
