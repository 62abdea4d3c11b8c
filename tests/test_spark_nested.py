"""Private tables with LIST, STRUCT and MAP columns on Spark (issue 22): the same answer as on
DuckDB, or a refusal before the charge that names the read.

Spark holds the same values (``dpsql.backends.spark.types.spark_type``: ARRAY, STRUCT, MAP), so a
query that only copies, counts or tests such a column for NULL answers as on DuckDB. Reading
inside one does not agree (DuckDB lists count from 1 and read NULL past the end, Spark's ``[]``
counts from 0 and fails; a struct field's type is not in the catalog dpsql types expressions
from), so it is refused by ``check_spark``, before anything is charged.
"""

from __future__ import annotations

import duckdb
import pytest
from engines import Engine

import dpsql
from dpsql.mechanisms.noise import SeededSource

pytestmark = [pytest.mark.spark, pytest.mark.spark_ci, pytest.mark.xdist_group("spark")]

POLICY = """BUDGET EPSILON 100; QUERY EPSILON 1;
PRIVATE TABLE t (PRIVACY UNIT uid, MAX ROWS PER UNIT 100, MAX GROUPS PER UNIT 100,
  x BOUNDS 0 TO 10, g KEYS ('a', 'b', 'c'));"""

ANSWERED = [
    "SELECT COUNT(*) AS n FROM t",
    "SELECT COUNT(*) AS n FROM t WHERE l IS NULL",
    "SELECT COUNT(*) AS n FROM t WHERE s IS NOT NULL AND m IS NOT NULL",
    "SELECT COUNT(DISTINCT l) AS n FROM t",
    "SELECT g, SUM(x) AS total FROM t WHERE l IS NOT NULL GROUP BY g",
]

REFUSED = [
    # (query, phrase of Spark's refusal)
    ("SELECT COUNT(*) AS n FROM t WHERE len(l) > 1", "inside lists, maps and structs"),
    ("SELECT COUNT(*) AS n FROM t WHERE array_length(l) > 1", "inside lists, maps and structs"),
    ("SELECT COUNT(*) AS n FROM t WHERE l[1] = 0", "inside lists, maps and structs"),
    ("SELECT COUNT(*) AS n FROM t WHERE list_contains(l, 2)", "inside lists, maps and structs"),
    ("SELECT COUNT(*) AS n FROM t WHERE s.a > 1", "struct field s.a"),
    ("SELECT g, COUNT(*) AS n FROM t WHERE s.b = 'x' GROUP BY g", "struct field s.b"),
    ("SELECT COUNT(*) AS n FROM t WHERE s['a'] > 1", "inside lists, maps and structs"),
    ("SELECT COUNT(*) AS n FROM t WHERE m['k'] = 1", "inside lists, maps and structs"),
]


def _data() -> duckdb.DuckDBPyConnection:
    con = duckdb.connect()
    con.execute("""CREATE TABLE t AS SELECT i % 20 AS uid, ['a', 'b', 'c'][i % 3 + 1] AS g, (i % 10)::DOUBLE AS x,
        CASE WHEN i % 7 = 0 THEN NULL ELSE range(i % 4)::INTEGER[] END AS l,
        {'a': (i % 5)::INTEGER, 'b': ['x', 'y'][i % 2 + 1]} AS s,
        MAP {'k': (i % 3)::INTEGER} AS m FROM range(200) r(i)""")
    return con


@pytest.fixture(scope="module")
def sides():
    spark = Engine("spark")
    duck_db = dpsql.connect(_data(), policy=POLICY, ledger=":memory:")
    spark_db = spark.connect(_data(), policy=POLICY)
    yield duck_db, spark_db
    duck_db.close()
    spark.close()


def _run(db, sql: str):
    db._rng = SeededSource(7)  # the same noise on both engines
    return db.sql(sql).fetchall()


@pytest.mark.parametrize("sql", ANSWERED)
def test_queries_that_do_not_read_inside_answer_as_on_duckdb(sides, sql):
    duck_db, spark_db = sides
    assert _run(spark_db, sql) == _run(duck_db, sql)


@pytest.mark.parametrize("sql, phrase", REFUSED, ids=[case[0] for case in REFUSED])
def test_reading_inside_is_refused_on_spark_before_the_charge(sides, sql, phrase):
    duck_db, spark_db = sides
    _run(duck_db, sql)  # DuckDB answers it
    spent = spark_db.budget.spent.epsilon
    with pytest.raises(dpsql.UnsupportedQuery) as refused:
        _run(spark_db, sql)
    assert phrase in str(refused.value) and "on Spark" in str(refused.value)
    assert refused.value.hint
    assert spark_db.budget.spent.epsilon == spent
