"""Brute force for the per-unit contribution rule (``unit_total_sensitivity``).

A tiny world: G groups, one unit's contribution vector has at most l non-zero entries, each an
integer total in [lower, upper] (the rewrite clamps each per-(unit, group) total there). Every
vector is enumerated; the largest L1 and squared L2 distance of one vector from zero
(unbounded: add or remove the unit) or between two vectors (bounded: replace it) must equal the
rule's value, so the rule is neither loose nor, above all, too small.
"""

from __future__ import annotations

import itertools
from fractions import Fraction

import pytest

from dpsql.analysis.sensitivity import unit_total_sensitivity


def _vectors(lower: int, upper: int, groups: int, per_unit: int) -> list[tuple[int, ...]]:
    values = sorted({0, *range(lower, upper + 1)})  # 0: no rows in that group
    return [v for v in itertools.product(values, repeat=groups) if sum(1 for x in v if x) <= per_unit]


def _worst(vectors, neighbours: str) -> tuple[int, int]:
    pairs = ([(v, (0,) * len(v)) for v in vectors] if neighbours == "unbounded"
             else itertools.product(vectors, repeat=2))
    l1 = l2 = 0
    for a, b in pairs:
        l1 = max(l1, sum(abs(x - y) for x, y in zip(a, b)))
        l2 = max(l2, sum((x - y) ** 2 for x, y in zip(a, b)))
    return l1, l2


@pytest.mark.parametrize("neighbours", ["unbounded", "bounded"])
@pytest.mark.parametrize("lower,upper", [(0, 3), (-2, 3), (-3, -1), (1, 2), (-1, 1)])
@pytest.mark.parametrize("per_unit", [1, 2, 3])
def test_unit_total_rule_is_exact_by_brute_force(neighbours, lower, upper, per_unit):
    # Grouped: enough groups that two units can touch disjoint ones (2l <= G).
    groups = 2 * per_unit
    l1, l2 = _worst(_vectors(lower, upper, groups, per_unit), neighbours)
    rule = unit_total_sensitivity(lower, upper, groups_per_unit=per_unit, neighbours=neighbours, grouped=True)
    assert (rule.l1, rule.l2_squared) == (Fraction(l1), Fraction(l2))


@pytest.mark.parametrize("neighbours", ["unbounded", "bounded"])
@pytest.mark.parametrize("lower,upper", [(0, 3), (-2, 3), (-3, -1), (1, 2), (2, 2)])
def test_ungrouped_unit_total_rule_is_exact_by_brute_force(neighbours, lower, upper):
    l1, l2 = _worst(_vectors(lower, upper, 1, 1), neighbours)
    rule = unit_total_sensitivity(lower, upper, groups_per_unit=5, neighbours=neighbours, grouped=False)
    assert (rule.l1, rule.l2_squared) == (Fraction(l1), Fraction(l2))


def test_a_bound_one_percent_smaller_fails_the_oracle():
    # The oracle can fail: the worst case it finds is above 99% of the rule, in both norms.
    rule = unit_total_sensitivity(-2, 3, groups_per_unit=2, neighbours="bounded", grouped=True)
    l1, l2 = _worst(_vectors(-2, 3, 4, 2), "bounded")
    assert l1 > rule.l1 * Fraction(99, 100) and l2 > rule.l2_squared * Fraction(99, 100)
