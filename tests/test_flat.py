"""Flat bounded statements (issue 26): each cheaper form gives exactly the measures of the form it
replaces, on shop-like data whose units are skewed well past the limits, with NULL, NaN, ±inf and
-0.0 amounts and keys outside the public domain.

Each test runs a query's exact measures (``tests/exact.py``: noise off) three ways on one
connection: as the rewrite now writes it, with one shortcut switched back to its older form, and
with every unit taken through the full per-unit layers (layer 3 of ``dpsql.backends.rewrite``, as
if the source could hold any number of rows per unit). A control shows the comparison has teeth:
with the groups limit dropped, the measures differ.
"""

from __future__ import annotations

from contextlib import contextmanager
from unittest import mock

import duckdb
import pytest
from exact import exact_run, fixed_salt
from sqlglot import exp

import dpsql
from dpsql.backends import rewrite
from dpsql.backends.render import render

POLICY = """
BUDGET EPSILON 1000 DELTA 0.5;
QUERY EPSILON 1;
PRIVATE TABLE visits (PRIVACY UNIT user_id, MAX ROWS PER UNIT 10, MAX GROUPS PER UNIT 2,
                      amount BOUNDS 0 TO 500, store KEYS FROM stores.store);
PUBLIC TABLE stores;
PUBLIC TABLE promos;
"""
SPECIAL = ["NULL", "'nan'", "'-nan'", "'inf'", "'-inf'", "'-0.0'", "0", "500", "500.5", "-3", "250.25"]
"""Amounts at and past every edge of the clamp, each the one row of units 200.. (so the copy keeps it)."""


@pytest.fixture(scope="module")
def db():
    con = duckdb.connect()
    con.execute("CREATE TABLE stores AS SELECT 's' || i AS store, 'c' || (i % 3) AS city FROM range(8) t(i)")
    # Two promotions per store: a join with it turns each kept row into 2 rows (multiplicity m = 2).
    con.execute("CREATE TABLE promos AS SELECT 's' || (i // 2) AS store, 'p' || (i % 5) AS promo FROM range(16) t(i)")
    # Units 0..59 with 1 to 59 rows (u^2 skew), stores s0..s9 (s8, s9 outside the domain), 40 zips.
    con.execute("""CREATE TABLE visits AS
        SELECT CAST(floor(60 * pow((hash(i) % 1000) / 1000.0, 2)) AS INTEGER) AS user_id,
               's' || (hash(i * 7 + 1) % 10) AS store, CAST((hash(i * 7 + 2) % 60000) / 100.0 AS DOUBLE) AS amount,
               CAST(hash(i * 7 + 3) % 40 AS VARCHAR) AS zip
        FROM range(900) t(i)""")
    values = ", ".join(f"({unit}, 's1', CAST({amount} AS DOUBLE), '7')" for unit, amount in enumerate(SPECIAL, 200))
    con.execute(f"INSERT INTO visits VALUES {values}")
    # Units of two rows in stores s0 and s3: three promotions (p0, p1, p2) after the join with promos.
    con.execute("INSERT INTO visits SELECT 100 + i, 's' || (3 * j), 10.0 * (j + 1), '1' "
                "FROM range(6) a(i), range(2) b(j)")
    with fixed_salt(), dpsql.connect(con, policy=POLICY) as connection:
        yield connection


QUERIES = {
    "COUNT": "SELECT COUNT(*) FROM visits WHERE amount > 10",
    "SUM": "SELECT SUM(amount) FROM visits",
    "AVG": "SELECT AVG(amount) FROM visits WHERE zip <> '3'",
    "GROUP BY public keys": "SELECT store, COUNT(*), SUM(amount) FROM visits GROUP BY store",
    "GROUP BY private keys": "SELECT WITH DIFFERENTIAL_PRIVACY OPTIONS (epsilon = 1, delta = 1e-6) "
                             "zip, COUNT(*), AVG(amount) FROM visits GROUP BY zip",
    "JOIN": "SELECT s.city, COUNT(*), SUM(v.amount) FROM visits AS v JOIN stores AS s ON v.store = s.store "
            "GROUP BY s.city",
    "JOIN, public side first": "SELECT v.store, COUNT(*) FROM stores AS s JOIN visits AS v ON v.store = s.store "
                               "WHERE v.amount > 100 GROUP BY v.store",
    "JOIN, multiplicity 2": "SELECT p.promo, SUM(v.amount) FROM visits AS v LEFT JOIN promos AS p "
                            "ON v.store = p.store GROUP BY p.promo",
}


def measures(db, sql: str) -> dict:
    run = exact_run(db, sql)
    assert run is not None
    return run.vectors


@contextmanager
def per_unit_layers():
    """Every unit through layer 3 in full: the rewrite as if the source were not a bounded copy."""
    with mock.patch.object(rewrite, "_rows_bounded_by_construction", lambda plan: False):
        yield


def least_greatest_clamp(value, low, high, floating):
    """The clamp as it was written before issue 26: a NULL (and NaN) test, then LEAST(GREATEST())."""
    missing = rewrite._is_null(value.copy())
    if floating:
        missing = exp.or_(missing, rewrite.is_nan(value.copy()), copy=False)
    return rewrite._null_or_clamped(missing, value, low, high)


@pytest.mark.parametrize("name", list(QUERIES))
def test_the_flat_statement_gives_exactly_the_per_unit_layers_measures(db, name):
    sql = QUERIES[name]
    flat = measures(db, sql)
    assert any(flat.values())
    with per_unit_layers():
        assert measures(db, sql) == flat
    with mock.patch.object(rewrite, "_compared_clamp", least_greatest_clamp):
        assert measures(db, sql) == flat


@pytest.mark.parametrize("name", ["GROUP BY public keys", "GROUP BY private keys", "JOIN", "JOIN, multiplicity 2"])
def test_the_comparison_fails_when_the_groups_limit_is_dropped(db, name):
    """Control: these units touch more than MAX GROUPS PER UNIT groups, so a statement without the
    groups limit gives other measures (and a test comparing forms would catch it)."""
    sql = QUERIES[name]
    limited = measures(db, sql)
    with mock.patch.object(rewrite, "_groups_bounded_by_construction", lambda plan, keys: True):
        assert measures(db, sql) != limited


def clamped_both_ways(type_name: str) -> list[tuple]:
    """(new text, new type, old text, old type) of the special values clamped into [0, 500]."""
    column, low, high = exp.column("x"), rewrite._number(0), rewrite._number(500)
    new = render(rewrite._compared_clamp(column.copy(), low.copy(), high.copy(), floating=True))
    old = render(least_greatest_clamp(column.copy(), low.copy(), high.copy(), floating=True))
    rows = ", ".join(f"(CAST({v} AS {type_name}))" for v in SPECIAL + ["1e30", "-1e-30", "499.99"])
    return duckdb.connect().execute(f"SELECT CAST({new} AS VARCHAR), typeof({new}), CAST({old} AS VARCHAR), "
                                    f"typeof({old}) FROM (VALUES {rows}) AS t(x)").fetchall()


def test_the_compared_clamp_of_a_double_is_the_least_greatest_one_bit_for_bit():
    """NULL and NaN (either sign) stay NULL, ±inf become the bounds, -0.0 keeps its sign, and the
    result has the same type."""
    got = clamped_both_ways("DOUBLE")
    assert [(a, b) for a, b, _, _ in got] == [(c, d) for _, _, c, d in got]
    assert ("-0.0", "DOUBLE") in [(a, b) for a, b, _, _ in got]


def test_a_float_keeps_least_greatest_whose_clamp_drops_the_sign_of_zero():
    got = clamped_both_ways("FLOAT")
    assert ("-0.0", "0.0") in [(a, c) for a, _, c, _ in got]  # why clamp_column takes comparisons for DOUBLE only
    query = "SELECT SUM(CASE WHEN amount > 1 THEN amount ELSE 0 END) FROM t"
    con = duckdb.connect()
    con.execute("CREATE TABLE t AS SELECT range AS uid, CAST(range AS FLOAT) AS amount FROM range(5)")
    policy = "BUDGET EPSILON 10; PRIVATE TABLE t (PRIVACY UNIT uid, MAX ROWS PER UNIT 1, amount BOUNDS 0 TO 9);"
    with dpsql.connect(con, policy=policy) as floats:
        assert "LEAST(GREATEST(\"amount\", 0), 9)" in floats.explain(query, epsilon=1)


def test_the_compared_clamp_of_a_grid_value_is_the_least_greatest_one():
    con = duckdb.connect()
    column, low, high = exp.column("x"), rewrite._number(-7), rewrite._number(2**40)
    new = render(rewrite._compared_clamp(column.copy(), low.copy(), high.copy(), floating=False))
    old = render(least_greatest_clamp(column.copy(), low.copy(), high.copy(), floating=False))
    values = ["NULL", "-9223372036854775808", "-8", "-7", "0", str(2**40), str(2**40 + 1), "9223372036854775807"]
    rows = ", ".join(f"(CAST({v} AS BIGINT))" for v in values)
    got = con.execute(f"SELECT {new}, typeof({new}), {old}, typeof({old}) FROM (VALUES {rows}) AS t(x)").fetchall()
    assert [(a, b) for a, b, _, _ in got] == [(c, d) for _, _, c, d in got]


def test_a_join_that_multiplies_rows_takes_fewer_units_past_the_window(db):
    """With m = 2 a unit with r kept rows has up to 2r joined rows, so only units with at most
    floor(l / m) = 1 kept row skip the window; skipping it at l kept rows (as for a plain read)
    would let a unit keep up to 4 groups, and the measures show it."""
    sql = QUERIES["JOIN, multiplicity 2"]
    statement = rewrite_sql(db, sql)
    assert "dp_unit_rows <= 1" in statement and "dp_unit_rows <= 2" not in statement
    right = measures(db, sql)
    with mock.patch.object(rewrite, "_with_unit_rows", careless):
        assert "dp_unit_rows <= 2" in rewrite_sql(db, sql)
        assert measures(db, sql) != right


def careless(plan):
    """``_with_unit_rows`` ignoring the join's multiplicity: light at MAX GROUPS PER UNIT kept rows."""
    found = ORIGINAL_WITH_UNIT_ROWS(plan)
    return None if found is None else (found[0], plan.query.rule.groups_per_unit)


ORIGINAL_WITH_UNIT_ROWS = rewrite._with_unit_rows


def rewrite_sql(db, sql: str) -> str:
    """The bounded statement of ``sql`` (the plan ``exact_run`` releases from)."""
    run = exact_run(db, sql)
    assert run is not None
    return rewrite.rewrite_plan(run.plan)


@pytest.mark.parametrize("sql", [
    "SELECT s.city, COUNT(*) FROM visits AS v JOIN stores AS s ON v.store = s.store GROUP BY s.city",
    "SELECT SUM(amount) FROM visits",
])
def test_joins_of_a_copy_with_a_public_table_carry_the_units_kept_rows(db, sql):
    statement = rewrite_sql(db, sql)
    assert ("dp_unit_rows <= 2" in statement) == ("GROUP BY" in sql)
