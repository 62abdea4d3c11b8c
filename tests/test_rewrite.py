"""Golden rewrite fixtures: each input query's bounded SQL, as a reviewable diff.

``fixtures/rewrite/shop.sql`` holds ``input; expected;`` pairs over the shop schema and
policy. Set DPSQL_UPDATE_FIXTURES=1 to regenerate it after an intended change, then review
the diff. The pairs are also executed on a small shop database, so every golden is valid
DuckDB SQL.
"""

from __future__ import annotations

import os
from dataclasses import replace
from fractions import Fraction
from pathlib import Path

import duckdb
import pytest
from shop import SHOP, SHOP_CATALOG, attach_bounded_copies

from dpsql.analysis.analyse import PrivacyOptions, analyse_query
from dpsql.analysis.check import check_query
from dpsql.backends.render import render
from dpsql.backends.rewrite import clamp_inputs, rewrite_plan
from dpsql.demo import build_shop_database
from dpsql.sql.parse import parse_query

FIXTURE = Path(__file__).parent / "fixtures" / "rewrite" / "shop.sql"
INPUTS = [
    "SELECT COUNT(*) FROM visits",
    "SELECT SUM(amount) FROM visits WHERE age > 30",
    "SELECT store, COUNT(*), AVG(amount) FROM visits GROUP BY store",
    "SELECT COUNT(zip), SUM(CASE WHEN amount > 100 THEN age ELSE 0 END) FROM visits",
    "SELECT plan, COUNT(*) FROM users GROUP BY plan",
]


def bounded_sql(sql: str, delta: Fraction = Fraction(0)) -> str:
    query = check_query(parse_query(sql), sql, SHOP, SHOP_CATALOG)
    return rewrite_plan(analyse_query(query, SHOP, PrivacyOptions(epsilon=Fraction(1), delta=delta)))


def per_unit_layers_sql(sql: str, delta: Fraction = Fraction(0)) -> str:
    """The bounded SQL as if the source could hold any number of rows per unit: layer 3 in full."""
    query = check_query(parse_query(sql), sql, SHOP, SHOP_CATALOG)
    plan = analyse_query(query, SHOP, PrivacyOptions(epsilon=Fraction(1), delta=delta))
    return rewrite_plan(replace(plan, query=replace(plan.query, rows_per_unit=None)))


def read_pairs() -> list[tuple[str, str]]:
    chunks = [c.strip() for c in FIXTURE.read_text().split(";\n") if c.strip()]
    chunks = ["\n".join(line for line in c.splitlines() if not line.startswith("--")).strip() for c in chunks]
    return list(zip(chunks[0::2], chunks[1::2]))


def test_fixture_is_current():
    if os.environ.get("DPSQL_UPDATE_FIXTURES"):
        header = ("-- input; expected bounded SQL; (regenerate: DPSQL_UPDATE_FIXTURES=1 pytest tests/test_rewrite.py)"
                  "\n\n")
        FIXTURE.write_text(header + "\n\n".join(f"{q};\n{bounded_sql(q)};" for q in INPUTS) + "\n")
    pairs = read_pairs()
    assert [p[0] for p in pairs] == INPUTS
    for query, expected in pairs:
        assert bounded_sql(query) == expected, query


@pytest.fixture(scope="module")
def shop(tmp_path_factory):
    path = tmp_path_factory.mktemp("shop") / "shop.duckdb"
    build_shop_database(path, users=200)
    with duckdb.connect(str(path), read_only=True) as con:
        attach_bounded_copies(con)
        yield con


@pytest.mark.parametrize("query, expected", read_pairs())
def test_golden_sql_runs_on_duckdb(shop, query, expected):
    rows = shop.execute(expected, {"salt": "ab"} if "$salt" in expected else {}).fetchall()
    assert rows


def test_clamping_keeps_null_and_drops_nan():
    """Invariant 13: a bare LEAST/GREATEST clamp would turn NULL into a bound."""
    query = check_query(parse_query("SELECT SUM(amount) FROM visits"), "", SHOP, SHOP_CATALOG)
    plan = analyse_query(query, SHOP, PrivacyOptions(epsilon=Fraction(1)))
    clamped = render(clamp_inputs(plan.measures[0].argument, plan.measures[0].clamped_columns))
    values = duckdb.execute(
        f"SELECT {clamped} FROM (VALUES (NULL::DOUBLE), ('nan'::DOUBLE), ('inf'::DOUBLE), "
        "('-inf'::DOUBLE), (-0.0::DOUBLE), (250.5::DOUBLE), (9e300::DOUBLE)) AS t(amount)"
    ).fetchall()
    assert [v[0] for v in values] == [None, None, 500, 0, 0, 250.5, 500]


def test_conditions_see_raw_values_and_sums_see_clamped_ones():
    query = check_query(parse_query("SELECT SUM(CASE WHEN amount > 600 THEN amount ELSE 0 END) FROM visits"),
                        "", SHOP, SHOP_CATALOG)
    plan = analyse_query(query, SHOP, PrivacyOptions(epsilon=Fraction(1)))
    clamped = render(clamp_inputs(plan.measures[0].argument, plan.measures[0].clamped_columns))
    rows = duckdb.execute(f"SELECT {clamped} FROM (VALUES (700.0), (550.0)) AS t(amount)").fetchall()
    assert [r[0] for r in rows] == [500, 0]


def _raw_source(sql: str, table: str) -> str:
    """Generated SQL reading the raw table instead of its bounded copy: every unit's rows."""
    start = sql.index('"dp_bounding"')
    end = sql.index("WHERE NOT dp_pad", start) + len("WHERE NOT dp_pad")
    return sql[:start] + f'"{table}"' + sql[end:]


def test_light_units_get_exactly_what_the_window_would_grant(shop):
    """The light-unit shortcut (b = n for units within both limits) changes no result, on the
    raw table too (heavy units there: up to 40 rows)."""
    fast = _raw_source(per_unit_layers_sql("SELECT store, COUNT(*), AVG(amount) FROM visits GROUP BY store"), "visits")
    condition = "dp_total <= 10 AND dp_groups <= 5"  # the light units' condition (k = 10, l = 5)
    assert fast.count(condition) == 2
    windowed = fast.replace(condition, "FALSE").replace("NOT (FALSE)", "TRUE")
    assert windowed != fast
    salt = {"salt": "ab"}
    assert sorted(shop.execute(fast, salt).fetchall()) == sorted(shop.execute(windowed, salt).fetchall())


@pytest.mark.parametrize("query", [
    "SELECT store, COUNT(*), AVG(amount) FROM visits GROUP BY store",
    "SELECT store, SUM(age), COUNT(*) FROM visits WHERE age > 25 GROUP BY store",
])
def test_units_with_few_kept_rows_skip_the_group_window_and_keep_what_it_would(shop, query):
    """dp_limited: a unit keeping at most MAX GROUPS PER UNIT rows in the copy (l = 5) skips the
    window; with the shortcut switched off every unit goes through it, and the totals agree."""
    fast = bounded_sql(query)
    condition = "dp_unit_rows <= 5"
    assert fast.count(condition) == 2
    windowed = fast.replace(condition, "FALSE").replace("NOT (FALSE)", "TRUE")
    salt = {"salt": "ab"}
    assert sorted(shop.execute(fast, salt).fetchall()) == sorted(shop.execute(windowed, salt).fetchall())
    light = shop.execute('SELECT COUNT(*) FROM dp_bounding."dp_bounded_visits__user_id__10" '
                         "WHERE NOT dp_pad AND dp_unit_rows <= 5").fetchone()[0]
    assert light > 0  # the shortcut is taken by some units


def test_the_copy_keeps_each_units_kept_row_count(shop):
    rows = shop.execute('SELECT user_id, COUNT(*), MIN(dp_unit_rows), MAX(dp_unit_rows) FROM '
                        'dp_bounding."dp_bounded_visits__user_id__10" WHERE NOT dp_pad GROUP BY user_id').fetchall()
    assert rows and all(n == low == high for _, n, low, high in rows)
    pads = shop.execute('SELECT dp_unit_rows FROM dp_bounding."dp_bounded_visits__user_id__10" '
                        "WHERE dp_pad ORDER BY 1").fetchall()
    assert pads == [(0,), (10,)]  # statistics span 0..k whatever the data


@pytest.mark.parametrize("query", [q for q in INPUTS if "users" not in q] + [
    "SELECT COUNT(DISTINCT store), MEDIAN(amount) FROM visits WHERE age < 60",
    "SELECT SUM(amount), VARIANCE(age), COUNT(*) FROM visits WHERE store = 'north'",
])
def test_bounded_copies_change_no_result_of_the_per_unit_bounding(shop, query):
    """On the bounded copy (at most k rows of a unit) the per-unit layers keep every row, so
    reading the raw table bounded per query and reading the copy give the same exact totals
    when the raw table is replaced by the copy: the shortcut totals equal the full layers."""
    sql, full = bounded_sql(query), per_unit_layers_sql(query)
    assert "dp_units" in full or full == sql == "SELECT 1 AS dp_none"
    assert _totals(shop, sql) == _totals(shop, full)


@pytest.mark.parametrize("query", [
    "SELECT zip, COUNT(*), SUM(amount) FROM visits GROUP BY zip",
    "SELECT zip, AVG(amount), VARIANCE(age) FROM visits WHERE age > 25 GROUP BY zip",
    "SELECT store, COUNT(DISTINCT user_id), SUM(age) FROM visits GROUP BY store",
    "SELECT COUNT(DISTINCT user_id), AVG(amount) FROM visits",
])
def test_totals_summed_per_unit_first_equal_the_per_unit_layers(shop, query):
    """Counting distinct units (partition selection, COUNT(DISTINCT unit)) on a bounded copy sums
    each measure per (unit, group) first, then per group: exactly the totals and unit counts
    of the full per-unit layers."""
    delta = Fraction(1, 10**6)
    sql, full = bounded_sql(query, delta), per_unit_layers_sql(query, delta)
    assert "COUNT(DISTINCT" not in sql and "GROUP BY dp_unit" in sql and "dp_units" in full
    assert _totals(shop, sql) == _totals(shop, full)


def _totals(shop, sql: str) -> list[tuple]:
    """Rows as the release reads them: a missing total (NULL) is 0."""
    return sorted(tuple(0 if v is None else v for v in row) for row in shop.execute(sql, _salt(sql)).fetchall())


def _salt(sql: str) -> dict:
    return {"salt": "ab"} if "$salt" in sql else {}


def test_bounded_copy_keeps_min_of_rows_and_k_for_each_unit_chosen_by_its_own_rows(shop):
    """Invariant 5 for the copy: each unit keeps min(n, k) of its rows, and which ones does not
    change when other units' rows are removed."""
    counts = shop.execute(
        'SELECT r.user_id, r.n, COALESCE(b.n, 0) FROM (SELECT user_id, COUNT(*) AS n FROM visits '
        'WHERE user_id IS NOT NULL GROUP BY ALL) AS r LEFT JOIN (SELECT user_id, COUNT(*) AS n FROM '
        'dp_bounding."dp_bounded_visits__user_id__10" WHERE NOT dp_pad GROUP BY ALL) AS b USING (user_id)').fetchall()
    assert any(n > 10 for _, n, _ in counts)
    assert all(kept == min(n, 10) for _, n, kept in counts)
    kept = shop.execute('SELECT * FROM dp_bounding."dp_bounded_visits__user_id__10" '
                        'WHERE user_id % 2 = 0 AND NOT dp_pad ORDER BY ALL').fetchall()
    path = shop.execute("SELECT path FROM duckdb_databases() WHERE database_name = current_database()").fetchone()[0]
    with duckdb.connect() as alone:  # only the even units: the same rows survive for each
        alone.execute(f"ATTACH '{path}' AS shop (READ_ONLY)")
        alone.execute("CREATE TABLE visits AS SELECT * FROM shop.visits WHERE user_id % 2 = 0")
        alone.execute("CREATE TABLE users AS SELECT * FROM shop.users")
        attach_bounded_copies(alone)
        again = alone.execute('SELECT * FROM dp_bounding."dp_bounded_visits__user_id__10" '
                              'WHERE NOT dp_pad ORDER BY ALL').fetchall()
    assert len(again) > 100 and again == kept


def test_bounded_copy_padding_rows_span_every_column_type_and_leave_statistics_nothing_to_prune(shop):
    """dpsql.backends.bounding: two padding rows at each type's extremes, so DuckDB cannot answer a
    filter from column statistics (an empty result without a scan would say no row matches)."""
    pads = shop.execute('SELECT * EXCLUDE (dp_pad) FROM dp_bounding."dp_bounded_visits__user_id__10" '
                        'WHERE dp_pad ORDER BY user_id').fetchall()
    assert len(pads) == 2
    low, high = pads
    assert low[0] == -2**31 and high[0] == 2**31 - 1  # user_id INTEGER
    assert low[3] == float("-inf") and high[3] == float("inf")  # amount DOUBLE
    assert low[2] == "" and high[2] == "\U0010FFFF" * 2  # store VARCHAR
    plan = shop.execute('EXPLAIN SELECT COUNT(*) FROM (SELECT "user_id" FROM '
                        'dp_bounding."dp_bounded_visits__user_id__10" WHERE NOT dp_pad) '
                        "WHERE COALESCE(TRY(user_id = 2000000000), FALSE)").fetchall()[0][1]
    assert "EMPTY_RESULT" not in plan.upper().replace(" ", "_")
    raw = shop.execute("EXPLAIN SELECT COUNT(*) FROM visits WHERE COALESCE(TRY(user_id = 2000000000), FALSE)"
                       ).fetchall()[0][1]
    assert "EMPTY_RESULT" in raw.upper().replace(" ", "_")  # what the padding prevents


def test_analysis_writes_no_engine_sql_and_the_salt_comes_from_the_tree():
    """A relation's source is built of engine-neutral pieces: a private table is a
    ``CopiedTable`` the backend names, and a truncation before a join on the unit orders by a
    ``SaltedHash``, so a statement over it asks for the salt from its tree alone."""
    from dpsql.analysis.joins import _truncated
    from dpsql.analysis.relation import Relation
    from dpsql.analysis.stability import TABLE, Step
    from dpsql.policy.model import PrivateTable
    from dpsql.sql.pieces import bounded_read, needs_salt

    source = bounded_read("sales.visits", "uid", 2, None, None, ["uid", "amount"])
    assert not needs_salt(source)
    assert render(source) == ('SELECT "uid", "amount" FROM "dp_bounding"."main"."dp_bounded_sales__visits__uid__2" '
                              "WHERE NOT dp_pad")
    rule = PrivateTable(name="sales.visits", unit="uid", max_rows_per_unit=2)
    unheld = Step(TABLE, "sales.visits", 2, None, None, "nothing holds its rows per unit")
    relation = Relation(source, rule, {"uid": "INTEGER", "amount": "DOUBLE"}, label="sales.visits",
                        bounded=frozenset({"sales.visits"}), stability=(unheld,))
    truncated = _truncated(relation).sql
    assert needs_salt(truncated)
    # the DOUBLE by its exact text (-0.0 and 0.0 apart), the INTEGER unit as it is
    amount = ("(CASE WHEN \"amount\" IS NULL THEN 'N' ELSE CAST(STRLEN(CAST(\"amount\" AS TEXT)) AS TEXT) || ':' || "
              "CAST(\"amount\" AS TEXT) END) COLLATE \"binary\"")
    assert render(truncated) == (
        'SELECT * EXCLUDE (dp_n) FROM (SELECT *, ROW_NUMBER() OVER (PARTITION BY "uid" ORDER BY '
        'HASH(XOR(HASH(XOR(HASH($salt), HASH("uid"))), HASH(' + amount + '))), "uid", ' + amount + ') AS dp_n FROM '
        '(SELECT "uid", "amount" FROM "dp_bounding"."main"."dp_bounded_sales__visits__uid__2" WHERE NOT dp_pad) '
        'AS dp_t) WHERE dp_n <= 2')
