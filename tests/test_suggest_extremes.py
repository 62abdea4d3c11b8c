"""No value of any numeric type makes ``suggest_bounds`` fail (``dpsql.curator.suggest_quantiles``
compares in DOUBLE and sums per-unit totals as DECIMAL(38, 6) of clamped values), and comparing
in DOUBLE keeps the buckets exact at the edges."""

from __future__ import annotations

from fractions import Fraction

import duckdb
import pytest

import dpsql
from dpsql.backends.render import render
from dpsql.backends.rewrite import literal
from dpsql.curator.suggest import _identity, _table, is_integer_type, value_candidates
from dpsql.curator.suggest_quantiles import SHARE_SCALE, ranks_from, shares_select
from dpsql.mechanisms.noise import SeededSource

# -- no value fails the suggestion -----------------------------------------------------------

def _decimal_extremes(precision: int, scale: int) -> list[str]:
    """The largest magnitude, the largest power of ten and the smallest nonzero one, both signs."""
    nines = "9" * (precision - scale) + ("." + "9" * scale if scale else "")
    power = "1" + "0" * (precision - scale - 1) if precision > scale else "0." + "9" * scale
    smallest = "0." + "0" * (scale - 1) + "1" if scale else "1"
    return [v for m in (nines, power, smallest) for v in (m, "-" + m)]


EXTREMES = {
    **{f"DECIMAL(38,{s})": _decimal_extremes(38, s) for s in (0, 2, 10, 37, 38)},
    "DECIMAL(18,2)": _decimal_extremes(18, 2)[:4],
    "HUGEINT": [str(2**127 - 1), str(-(2**127)), str(10**38)],
    "UHUGEINT": [str(2**128 - 1), str(2**127)],
    "BIGINT": [str(2**63 - 1), str(-(2**63))],
    "UBIGINT": [str(2**64 - 1)],
    "DOUBLE": ["inf", "-inf", "nan", "1.7976931348623157e308", "-1.7976931348623157e308", "5e-324"],
    "FLOAT": ["inf", "nan", "-3.4028235e38"],
}
"""Values at the ends of each numeric type's range, as text cast to the type."""


@pytest.mark.parametrize("type_name", sorted(EXTREMES))
def test_no_value_of_any_numeric_type_makes_a_suggestion_fail(type_name):
    """Neighbouring databases: 300 ordinary units, and the same with one unit added holding an
    extreme value of the column's type (twice, and once beside a NULL). The suggestion runs on
    both: a failure (charged, nothing released) would tell whether that unit exists. A
    row-level table holding every extreme at once (each row its own unit) too."""
    values = [f"CAST('{extreme}' AS {type_name})" for extreme in EXTREMES[type_name]]
    background = f"SELECT i % 300 AS uid, CAST((i % 50) * 0.01 AS {type_name}) AS x FROM range(1500) t(i)"
    tables = ["t0", *(f"t{i + 1}" for i in range(len(values)))]
    policy = "BUDGET EPSILON 1000; PRIVATE TABLE r (PRIVACY UNIT ROW); " + " ".join(
        f"PRIVATE TABLE {table} (PRIVACY UNIT uid, MAX ROWS PER UNIT 5);" for table in tables)
    connection = duckdb.connect()
    for table, value in zip(tables, [None, *values]):
        connection.execute(f"CREATE TABLE {table} AS {background}")
        if value is not None:
            connection.execute(f"INSERT INTO {table} VALUES (-1, {value}), (-1, {value}), (-1, NULL)")
    rows = ", ".join(f"({value})" for value in values)
    connection.execute(f"CREATE TABLE r AS SELECT x FROM t0 UNION ALL SELECT * FROM (VALUES {rows})")
    with dpsql.connect(connection, policy=policy, rng=SeededSource(1)) as db:
        for table in [*tables, "r"]:
            suggestion = db.suggest_bounds(table, epsilon=10)  # enough for the per-unit totals to be read too
            assert list(suggestion["bounds"]) == ["x"], (table, suggestion)
            assert table == "r" or suggestion["unit_bounds"]["x"] is not None, (table, suggestion)
        assert db.budget.spent.epsilon == 10 * (len(tables) + 1)


@pytest.mark.parametrize("type_name, step", [("DECIMAL(18,4)", Fraction(1, 10**4)),
                                             ("DECIMAL(38,20)", Fraction(1, 10**5)),
                                             ("DECIMAL(38,37)", Fraction(1, 10**15)), ("BIGINT", Fraction(1)),
                                             ("UHUGEINT", Fraction(1)), ("DOUBLE", Fraction(1, 2**10))])
def test_values_at_and_beside_the_edges_fall_in_their_exact_bins(type_name, step):
    """Comparing in DOUBLE keeps the bins exact for values at an edge and a step beside it (a
    value within a DOUBLE's rounding of an edge, beyond 15 significant digits, may not be)."""
    edges = value_candidates(is_integer_type(type_name))
    fits = (lambda v: abs(v) < 10) if type_name == "DECIMAL(38,37)" else \
        (lambda v: v >= 0) if type_name.startswith("U") else (lambda v: True)
    values = sorted(v for v in {v for e in edges[::5] for v in (e - step, e, e + step)} if fits(v))
    rows = ", ".join(f"({i}, CAST('{literal(v)}' AS {type_name}))" for i, v in enumerate(values))
    connection = duckdb.connect()
    connection.execute(f"CREATE TABLE t AS SELECT * FROM (VALUES {rows}) AS v(uid, x)")
    tree = shares_select(_table("t"), _identity("uid", {"uid": "INTEGER"}), "x", edges)
    *at_most, total = ranks_from(connection.execute(render(tree)).fetchall(), len(edges))
    assert total == len(values) * SHARE_SCALE
    assert at_most == [sum(v <= e for v in values) * SHARE_SCALE for e in edges]


@pytest.mark.parametrize("victim", [None, 5.0, 1e31, 1e33, 1e300])
def test_one_units_huge_value_never_decides_whether_a_charged_suggestion_fails(victim):
    """An attacker's review: with declared BOUNDS beyond 1e32 (kept by suggest), the per-unit totals'
    exact DECIMAL cast overflowed on one unit's value, so success or failure told that value."""
    import duckdb

    import dpsql

    con = duckdb.connect()
    con.execute("CREATE TABLE t (uid INTEGER, x DOUBLE)")
    con.execute("INSERT INTO t SELECT i % 50, (i % 7)::DOUBLE FROM range(200) r(i)")
    if victim is not None:
        con.execute(f"INSERT INTO t VALUES (999, {victim})")
    policy = "BUDGET EPSILON 100; PRIVATE TABLE t (PRIVACY UNIT uid, MAX ROWS PER UNIT 5, x BOUNDS -1e40 TO 1e40);"
    with dpsql.connect(con, policy=policy) as db:
        out = db.suggest_bounds("t", epsilon=1, columns=["x"])
    assert out["bounds"]["x"] is not None
