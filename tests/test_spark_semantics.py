"""On Spark, an analyst's SQL means what it means on DuckDB, or it is refused.

A differential test (``tests/spark_grid.py``): every construct ``check_spark`` accepts
(``tests/spark_cases.py``) is evaluated on a grid of values — NULL, zeros of both signs, the
integer types' extremes, NaN, infinities, empty and Unicode strings, month ends, leap days,
years 1 and 9999 — as DuckDB's ``TRY(...)`` on DuckDB and as ``total`` / ``agree`` on Spark,
and the results must be identical (and of the same type). Every refused construct has a test
showing the engines' differing answers (``tests/spark_pins.py``) and the refusal's message and
position; every rewrite, the answer the plain translation would have given.
"""

from __future__ import annotations

import time

import pytest
import sqlglot
from spark import session
from spark_cases import ACCEPTED, TABLES
from spark_grid import Grid, canonical
from spark_pins import ERROR, REFUSED, REFUSED_PUBLIC, REFUSED_UNMEASURED, REWRITTEN

from dpsql.backends.spark.check import check_spark
from dpsql.backends.spark.render import agree, column_types, total
from dpsql.errors import UnsupportedQuery
from dpsql.sql.parse import located, parse_query

pytestmark = pytest.mark.spark


@pytest.fixture(scope="module")
def grid():
    built = Grid(session())
    for name, columns in TABLES.items():
        built.table(name, columns)
    return built


@pytest.mark.spark_ci  # the CI subset's pin of what Spark evaluates on rows
@pytest.mark.parametrize("table", list(ACCEPTED))
def test_accepted_constructs_agree_on_the_grid(grid, table):
    assert grid.compare(table, ACCEPTED[table]) == []


def _same(found, expected) -> bool:
    return canonical(found) == canonical(expected)  # floats by their bits, True is not 1


def _refusal(sql: str, types: dict, private: bool = False) -> UnsupportedQuery:
    with pytest.raises(UnsupportedQuery) as refused:
        check_spark(parse_query(sql), types, private=private)
    return located(refused.value, sql)  # type: ignore[return-value]


@pytest.mark.parametrize("table, text, phrase, duck_sql, on_duckdb, on_spark", REFUSED,
                         ids=[case[1] for case in REFUSED])
def test_refused_construct_differs(grid, table, text, phrase, duck_sql, on_duckdb, on_spark):
    sql = f"SELECT {text} FROM {table}"
    refused = _refusal(sql, grid.types[table])
    assert phrase in refused.message, refused.message
    assert refused.node is not None and refused.line == 1 and refused.col is not None and refused.hint
    assert "on Spark" in str(refused)
    spark_sql = sqlglot.transpile(duck_sql, read="duckdb", write="spark")[0]
    assert _same(grid.duck_value(duck_sql), on_duckdb)
    assert _same(grid.spark_value(spark_sql), on_spark)


@pytest.mark.parametrize("table, sql, phrase, duck_sql, on_duckdb, on_spark", REFUSED_PUBLIC,
                         ids=[case[1] for case in REFUSED_PUBLIC])
def test_refused_public_query_differs(grid, table, sql, phrase, duck_sql, on_duckdb, on_spark):
    types = column_types(grid.types)
    assert phrase in _refusal(sql, types).message
    if "UNION" not in sql:
        check_spark(parse_query(sql), types, private=True)  # dpsql's own rewrite sums a private table
    spark_sql = sqlglot.transpile(duck_sql, read="duckdb", write="spark")[0]
    assert _same(grid.duck_value(duck_sql), on_duckdb)
    assert _same(grid.spark_value(spark_sql), on_spark)


@pytest.mark.parametrize("table, sql, phrase", REFUSED_UNMEASURED, ids=[case[1] for case in REFUSED_UNMEASURED])
def test_refused_unmeasured_construct(grid, table, sql, phrase):
    assert phrase in _refusal(sql, grid.types[table]).message


@pytest.mark.parametrize("pin", REWRITTEN, ids=[pin[0] for pin in REWRITTEN])
def test_rewritten_construct_differs_untranslated(grid, pin):
    duck_sql, on_duckdb, on_spark = pin[:3]
    spark_sql = pin[3] if len(pin) > 3 else sqlglot.transpile(duck_sql, read="duckdb", write="spark")[0]
    assert _same(grid.duck_value(duck_sql), on_duckdb)
    found = grid.spark_value(spark_sql)
    assert _same(found, on_spark) or (on_spark == ERROR and found == ERROR), found


def test_unknown_types_are_refused():
    """Without a column's type, anything whose Spark form depends on it is refused."""
    for text in ("a + 1", "CAST(a AS INTEGER)", "a = b", "round(a)"):
        message = _refusal(f"SELECT COUNT(*) FROM t WHERE {text} IS NULL", {}).message
        assert "cannot tell the type of a" in message
    check_spark(parse_query("SELECT COUNT(*) FROM t WHERE a IS NULL AND b LIKE 'x%'"), {"b": "VARCHAR"})


def test_names_a_query_gives_columns_are_typed():
    """Table aliases, subquery and CTE outputs carry their types into the outer query."""
    types = {"t.a": "INTEGER", "a": "INTEGER", "u.a": "INTEGER"}
    for sql in ("SELECT COUNT(*) FROM (SELECT a + 1 AS x FROM t) s WHERE x > 5 AND s.x // 2 < 9",
                "WITH c AS (SELECT a // 2 AS h FROM t) SELECT SUM(h * 2) FROM c",
                "SELECT COUNT(*) FROM t AS v JOIN u ON v.a = u.a WHERE v.a * 2 > 1",
                "SELECT a FROM t UNION ALL SELECT a + 1 FROM u"):
        check_spark(parse_query(sql), types)


def test_agree_is_idempotent():
    tree = parse_query("SELECT CAST(a AS INTEGER) // 2, dayofweek(d) FROM t WHERE s LIKE 'x%' ORDER BY d")
    types = {"a": "DOUBLE", "d": "DATE", "s": "VARCHAR"}
    once = agree(tree, types)
    assert agree(once, types).sql(dialect="spark") == once.sql(dialect="spark")


def test_private_query_post_processing_runs_on_duckdb(grid):
    """A private query's outer expressions combine released values on DuckDB: not checked here;
    its row-level parts are."""
    types = {"a": "DOUBLE", "s": "VARCHAR"}
    post = "SELECT round(AVG(a), 2) AS m FROM t GROUP BY s HAVING exp(COUNT(*)) > 1 ORDER BY ln(m)"
    check_spark(parse_query(post), types, private=True)
    _refusal(post, types)
    for row_level in ("SELECT SUM(CAST(s AS INTEGER)) FROM t", "SELECT COUNT(*) FROM t WHERE upper(s) = 'A'",
                      "SELECT upper(s), COUNT(*) FROM t GROUP BY 1",
                      "SELECT COUNT(*) FILTER (WHERE round(a, 1) > 0) FROM t"):
        _refusal(row_level, types, private=True)


def test_total_is_refused_when_too_long():
    """``total`` repeats each fallible step's operands in its failure condition; a private query
    whose row-level expression would need too much of that is refused before the charge."""
    long_sum = " + ".join(["a"] * 120)
    message = _refusal(f"SELECT SUM({long_sum}) FROM t", {"a": "INTEGER"}, private=True).message
    assert "too long to make total on Spark" in message
    check_spark(parse_query(f"SELECT SUM({long_sum}) FROM t"), {"a": "DOUBLE"}, private=True)  # DOUBLEs cannot fail


def test_order_by_puts_nulls_last(grid):
    for direction in ("", " DESC"):
        sql = f"SELECT a FROM g_date WHERE b IS NULL ORDER BY a{direction}"
        check_spark(parse_query(sql), grid.types["g_date"])
        on_duckdb = grid.duck.sql(sql).fetchall()
        on_spark = grid.spark.sql(agree(parse_query(sql), grid.types["g_date"]).sql(dialect="spark")).collect()
        assert [tuple(row) for row in on_spark] == on_duckdb
        assert on_duckdb[-1] == (None,)


def test_public_aggregates_agree(grid):
    sql = ("SELECT SUM(a), COUNT(a), COUNT(DISTINCT a), MIN(a), MAX(b), SUM(CAST(b AS DECIMAL(22,2))), AVG(a), "
           "AVG(b) FILTER (WHERE b > 0) FROM g_big")
    check_spark(parse_query(sql), grid.types["g_big"])
    on_duckdb = grid.duck.sql(sql).fetchall()[0]
    on_spark = tuple(grid.spark.sql(agree(parse_query(sql), grid.types["g_big"]).sql(dialect="spark")).collect()[0])
    assert [int(v) if not isinstance(v, str) else v for v in on_spark[:5]] == list(on_duckdb[:5])
    assert str(on_spark[5]) == str(on_duckdb[5])
    assert _same(on_spark[6:], on_duckdb[6:])  # AVG of BIGINTs past 2^63 in sum: to the last bit


def test_scalar_subqueries_take_their_item_type(grid):
    """A public scalar subquery compared has its one select item's type (TINYINT's a - 1 fails at
    -128 on both engines; FLOATs compare as FLOATs). Elsewhere, or a DATE, it stays refused: Spark's
    rewrites may bind it in a lambda, where Spark refuses subqueries."""
    for table, sql in [("g_tiny", "SELECT COUNT(*) FROM g_tiny WHERE a - 1 < (SELECT min(a) FROM g_tiny)"),
                       ("g_tiny", "SELECT COUNT(*) FROM g_tiny WHERE (SELECT max(b) FROM g_tiny) > a"),
                       ("g_int", "SELECT COUNT(*) FROM g_int WHERE a - 1 >= (SELECT max(b) FROM g_int)"),
                       ("g_flt", "SELECT COUNT(*) FROM g_flt WHERE a < (SELECT max(b) FROM g_flt)"),
                       ("g_dec", "SELECT COUNT(*) FROM g_dec WHERE a BETWEEN (SELECT min(b) FROM g_dec) AND 1"),
                       ("g_int", "SELECT COUNT(*) FROM g_int WHERE a > (SELECT AVG(b) FROM g_int)"),
                       ("g_big", "SELECT COUNT(*) FROM g_big WHERE a / 3 < (SELECT AVG(b) FROM g_big)")]:
        check_spark(parse_query(sql), grid.types[table])
        on_duckdb = grid.duck_value(sql)
        on_spark = grid.spark_value(agree(parse_query(sql), grid.types[table]).sql(dialect="spark"))
        assert on_spark == on_duckdb, (sql, on_duckdb, on_spark)
    assert grid.duck_value("SELECT COUNT(*) FROM g_tiny WHERE a - 1 < (SELECT min(a) FROM g_tiny)") == ERROR
    for table, sql in [("g_dbl", "SELECT COUNT(*) FROM g_dbl WHERE a > (SELECT AVG(b) FROM g_dbl)"),
                       ("g_int", "SELECT COUNT(*) FROM g_int WHERE a >= (SELECT max(b) FROM g_int) - 1"),
                       ("g_date", "SELECT COUNT(*) FROM g_date WHERE a > (SELECT min(b) FROM g_date)")]:
        assert "cannot tell the type" in _refusal(sql, grid.types[table]).message, sql


def test_like_costs_linear_time_on_spark(grid):
    """Spark's own LIKE backtracks: '%a%a%b' took ~150 ms per 1,000-character row here, and each
    further '%' multiplies that by the length, so one unit's long value could be timed. The
    rewritten pattern matches each piece once, as DuckDB does."""
    rows = "SELECT repeat('a', 20000) AS s FROM range(40)"
    text = "s LIKE '%a%a%a%a%a%b' OR s LIKE '%a_a%a_a%a%c'"
    written = total(sqlglot.parse_one(text, dialect="duckdb"), {"s": "VARCHAR"}).sql(dialect="spark")
    started = time.monotonic()
    assert grid.spark.sql(f"SELECT count_if({written}) FROM ({rows})").collect()[0][0] == 0
    assert time.monotonic() - started < 30


def test_total_is_null_exactly_where_duckdb_try_is(grid):
    """``total`` makes the whole expression NULL where any step DuckDB evaluates fails, as
    DuckDB's TRY does (AND, OR, IN are not short-circuited; CASE and COALESCE are)."""
    written = total(sqlglot.parse_one("b = 0 OR a // b > 0", dialect="duckdb"), grid.types["g_int"])
    found = grid.spark.sql(f"SELECT {written.sql(dialect='spark')} FROM g_int WHERE a = 1 AND b = 0").collect()
    assert [tuple(row) for row in found] == [(None,)]
