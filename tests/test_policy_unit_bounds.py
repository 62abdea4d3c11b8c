"""``col BOUNDS PER UNIT lo TO hi``: parsed, written back, and refused where it means nothing."""

from __future__ import annotations

from fractions import Fraction

import pytest

from dpsql.errors import PolicyError
from dpsql.policy.language import parse_policy, policy_to_text
from dpsql.policy.model import Bounds

FLIGHTS = ("BUDGET EPSILON 5; PRIVATE TABLE flights (PRIVACY UNIT tailnum, MAX ROWS PER UNIT 300, "
           "dep_delay BOUNDS -60 TO 360, dep_delay BOUNDS PER UNIT -3000 TO 6000.5);")


def test_bounds_per_unit_is_read_and_written_back():
    policy = parse_policy(FLIGHTS)
    rule = policy.table("flights").column("dep_delay")
    assert rule.bounds == Bounds(Fraction(-60), Fraction(360))
    assert rule.unit_bounds == Bounds(Fraction(-3000), Fraction(12001, 2))
    assert parse_policy(policy_to_text(policy)) == policy


@pytest.mark.parametrize("item,message,hint", [
    ("x BOUNDS 0 TO 1, x BOUNDS PER UNIT 5 TO 1", "reversed", "lower bound first"),
    ("x BOUNDS PER UNIT 1 TO 5", "no BOUNDS", "x BOUNDS lo TO hi"),
    ("x BOUNDS 0 TO 1, x BOUNDS PER UNIT 1 TO 5, x BOUNDS PER UNIT 1 TO 6", "BOUNDS PER UNIT twice", "keep only"),
])
def test_bounds_per_unit_refusals_name_the_item_and_the_fix(item, message, hint):
    with pytest.raises(PolicyError) as caught:
        parse_policy(f"BUDGET EPSILON 1; PRIVATE TABLE t (PRIVACY UNIT u, MAX ROWS PER UNIT 3, {item});")
    assert message in str(caught.value) and hint in (caught.value.hint or "")
    assert caught.value.line == 1 and caught.value.col > 50
