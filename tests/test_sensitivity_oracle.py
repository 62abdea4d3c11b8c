"""Brute-force oracles for every sensitivity rule (STYLE.md practice 8).

For each aggregate (COUNT(*), COUNT(x), SUM(x), AVG(x) = centred SUM + COUNT), grouped and
ungrouped, user-level and row-level, we run the *rewritten* SQL exactly on a small base
dataset and on every neighbour obtained by adding, removing or replacing one unit, where the
unit ranges over every multiset of up to k + 1 candidate rows (values at the bounds, outside
them, NULL, NaN, +-inf; keys inside and outside the public domain). The largest observed L1
and squared L2 change of each measure's vector must never exceed what ``analyse`` derived —
and must equal it, so the rule is not looser than it needs to be.

Under unbounded neighbours the change is result(D + u) - result(D); under bounded ones it is
result(D + u) - result(D + u') for every pair (u, u'), the replaced unit's slot being the same.
"""

from __future__ import annotations

import itertools
import math
from fractions import Fraction

import duckdb
import pytest

from dpsql.analyse import PrivacyOptions, analyse_query
from dpsql.check import check_query
from dpsql.engine import Engine
from dpsql.model import Bounds, ColumnRule, KeyDomain, Policy, PrivateTable, PublicTable
from dpsql.parse import parse_query
from dpsql.rewrite import rewrite_plan

NAN, INF = float("nan"), float("inf")
BASE_ROWS = [(1, "a", 1), (1, "b", 2), (2, "a", 3), (2, "a", 0), (2, "b", 1), (3, "b", 3)]
TESTED_UNIT = 99

CASES = {
    # name: (column type, bounds, candidate values, rows per unit, groups per unit, row level)
    "integer": ("INTEGER", (-2, 3), [-2, 3, None, 100], 2, None, False),
    "double": ("DOUBLE", (Fraction(1, 2), Fraction(5, 2)), [Fraction(1, 2), Fraction(5, 2), None, NAN, INF, -INF], 2, None, False),
    "one_group": ("INTEGER", (0, 4), [4, 0, None, -7], 2, 1, False),
    "row_level": ("INTEGER", (-2, 3), [-2, 3, None, 100, 1], 1, None, True),
}
QUERIES = {
    "count_star": "SELECT COUNT(*) FROM t",
    "count_x": "SELECT COUNT(x) FROM t",
    "sum": "SELECT SUM(x) FROM t",
    "avg": "SELECT AVG(x) FROM t",
    "count_star_grouped": "SELECT g, COUNT(*) FROM t GROUP BY g",
    "sum_grouped": "SELECT g, SUM(x) FROM t GROUP BY g",
    "avg_grouped": "SELECT g, AVG(x) FROM t GROUP BY g",
    "sum_expression_where": "SELECT g, SUM(2 * x - 1) FROM t WHERE x <> 1 GROUP BY g",
}


def _policy(case: str, neighbours: str) -> Policy:
    type_name, (lo, hi), _, k, groups, row_level = CASES[case]
    table = PrivateTable(
        name="t",
        unit=None if row_level else "uid",
        max_rows_per_unit=k,
        max_groups_per_unit=groups,
        columns=(
            ColumnRule("x", bounds=Bounds(Fraction(lo), Fraction(hi))),
            ColumnRule("g", keys=KeyDomain(table="keys", column="g")),
        ),
    )
    return Policy(budget_epsilon=Fraction(100), neighbours=neighbours, private_tables=(table,),
                  public_tables=(PublicTable("keys"),))


def _units(case: str) -> list[tuple]:
    """Every multiset of up to k + 1 candidate rows (one row when each row is a unit)."""
    _, _, values, k, _, row_level = CASES[case]
    candidates = [("a", v) for v in values] + [("b", values[0]), ("b", values[1]), ("c", values[1])]
    largest = 1 if row_level else k + 1
    units = []
    for size in range(largest + 1):
        units.extend(itertools.combinations_with_replacement(candidates, size))
    return units


class Oracle:
    """Runs one query's rewritten SQL on datasets and returns each measure's exact vector."""

    def __init__(self, case: str, sql: str):
        self.case = case
        type_name = CASES[case][0]
        self.connection = duckdb.connect()
        self.connection.execute(f"CREATE TABLE t (uid INTEGER, g VARCHAR, x {type_name})")
        self.connection.execute("CREATE TABLE keys AS SELECT * FROM (VALUES ('a'), ('b')) AS k(g)")
        self.engine = Engine(self.connection, owned=True, path=None)
        catalog = self.engine.catalog()
        self.plans = {}
        for neighbours in ("unbounded", "bounded"):
            policy = _policy(case, neighbours)
            query = check_query(parse_query(sql), sql, policy, catalog)
            self.plans[neighbours] = analyse_query(query, policy, PrivacyOptions(epsilon=Fraction(1)))
        plan = self.plans["unbounded"]
        self.sql = rewrite_plan(plan)
        self.keys = [("a",), ("b",)] if plan.query.keys else [()]

    def run(self, unit_rows: tuple) -> list[tuple[int, ...]]:
        row_level = CASES[self.case][5]
        return self.run_rows([(TESTED_UNIT + (i if row_level else 0), g, x) for i, (g, x) in enumerate(unit_rows)])

    def run_rows(self, extra_rows: list[tuple]) -> list[tuple[int, ...]]:
        rows = list(BASE_ROWS) + list(extra_rows)
        values = ", ".join(f"({_sql_value(u)}, '{g}', {_sql_value(x)})" for u, g, x in rows)
        self.connection.execute(f"DELETE FROM t; INSERT INTO t VALUES {values}")
        exact = self.engine.fetch(self.sql, {"salt": "fixed-test-salt"} if "$salt" in self.sql else None)
        width = len(self.keys[0])
        by_key = {tuple(r[:width]): r[width:] for r in exact}
        measures = len(self.plans["unbounded"].measures)
        return [tuple(int(by_key.get(key, (0,) * measures)[m] or 0) for key in self.keys) for m in range(measures)]


def _sql_value(x) -> str:
    if x is None:
        return "NULL"
    if isinstance(x, float) and not math.isfinite(x):
        return f"'{x}'::DOUBLE"
    return repr(float(x)) if isinstance(x, Fraction) else repr(x)


def _distance(a: tuple[int, ...], b: tuple[int, ...]) -> tuple[int, int]:
    diffs = [x - y for x, y in zip(a, b)]
    return sum(abs(d) for d in diffs), sum(d * d for d in diffs)


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("query", list(QUERIES))
def test_analysed_sensitivity_is_exact_by_brute_force(case, query):
    oracle = Oracle(case, QUERIES[query])
    results = [oracle.run(unit) for unit in _units(case)]
    empty = oracle.run(())
    for index, measure in enumerate(oracle.plans["unbounded"].measures):
        vectors = [r[index] for r in results]
        unbounded = [_distance(v, empty[index]) for v in vectors]
        bounded = [_distance(v, w) for v, w in itertools.combinations(set(vectors), 2)]
        for relation, observed in (("unbounded", unbounded), ("bounded", bounded)):
            analysed = oracle.plans[relation].measures[index].sensitivity
            worst_l1 = max(d[0] for d in observed)
            worst_l2 = max(d[1] for d in observed)
            label = f"{case}/{query}/{measure.name}/{relation}"
            assert worst_l1 <= analysed.l1, f"{label}: a unit moved L1 by {worst_l1} > {analysed.l1}"
            assert worst_l2 <= analysed.l2_squared, f"{label}: L2^2 {worst_l2} > {analysed.l2_squared}"
            assert worst_l1 == analysed.l1, f"{label}: L1 bound {analysed.l1} is loose (worst {worst_l1})"
            assert worst_l2 == analysed.l2_squared, f"{label}: L2^2 bound loose ({worst_l2})"


def test_bounded_grouped_histogram_is_twice_the_unbounded_one():
    """DP-NOTES: a histogram of counts has L1 sensitivity 1 unbounded and 2 bounded (k = 1)."""
    oracle = Oracle("row_level", QUERIES["count_star_grouped"])
    assert oracle.plans["unbounded"].measures[0].sensitivity.l1 == 1
    assert oracle.plans["bounded"].measures[0].sensitivity.l1 == 2
    assert math.isclose(float(oracle.plans["bounded"].measures[0].sensitivity.l2_squared), 2)


def test_which_rows_survive_does_not_depend_on_row_order():
    """Invariant 5: bounding depends only on the unit's own rows and the salt."""
    oracle = Oracle("one_group", QUERIES["sum_grouped"])
    unit = (("a", 4), ("b", 4), ("a", 0), ("b", 0), ("a", 4))
    first = oracle.run(unit)
    for permutation in itertools.islice(itertools.permutations(unit), 0, 120, 7):
        assert oracle.run(permutation) == first


def test_rows_without_a_unit_are_dropped_not_pooled():
    """Rows whose unit is NULL belong to nobody the engine can bound. Pooled into one
    pseudo-unit, they would let one person (whose rows lack an id) move a mixed-sign sum by
    k * (hi - lo) > k * max(|lo|, |hi|), the unbounded sensitivity; so they are dropped."""
    oracle = Oracle("integer", QUERIES["sum"])
    without = oracle.run_rows([(None, "a", -2), (None, "a", -2)])
    with_person = oracle.run_rows([(None, "a", -2), (None, "a", -2), (None, "a", 3), (None, "a", 3)])
    assert with_person == without == oracle.run_rows([])
