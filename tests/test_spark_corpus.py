"""The analyst corpus on both engines: the same refusals, the same answers (issue 22, "one contract").

Every query of ``fixtures/corpus`` runs on DuckDB and on Spark over the same rows (Spark reads them
as temporary views, ``tests/engines.py``), under the corpus policies with MAX ROWS PER UNIT and MAX
GROUPS PER UNIT raised past what any unit has. Then no unit is cut, the bounded copies of the
two engines hold the same rows whatever their keyed hashes (which differ: DuckDB's ``hash``
chain, Spark's ``xxhash64``), every exact measure is the same, and with the same noise seed the
released answers must agree: the same refusal (class and message), or the same columns, keys
and values (floats to 1e-9 relative: the engines sum in different orders). Cutting, the part
that differs, is tested on Spark on its own (``tests/test_spark_engine.py``).

Two kinds of query are compared otherwise. A query using a construct Spark evaluates differently
(``SPARK_REFUSES``; each difference is pinned in ``tests/spark_pins.py``) is refused on Spark
before any charge and answered on DuckDB (on a connection of its own, so the two ledgers stay
alike). A query whose OPTIONS cut units by a salted choice (``SALTED``) keeps different rows
on each engine, whose hashes differ: there the keys must agree, and each released column's
total, which the choice does not change (each unit counted once in all), up to the rounding of
each released value.

Spark runs about a second per answered query, so by default a representative subset runs: every
refusal (most are static and cost no Spark job) and every fourth answer by a stable hash of its
name; ``DPSQL_SPARK_FULL=1`` runs them all.
"""

from __future__ import annotations

import decimal
import math
import os
import re
import zlib

import pytest
from engines import Engine
from exact import fixed_salt
from test_corpus import CORPORA, CORPUS, FILES, Query, census_connection, shop_policy

import dpsql
from dpsql.demo import build_shop_database
from dpsql.mechanisms.noise import SeededSource

pytestmark = [pytest.mark.spark, pytest.mark.xdist_group("spark")]

FULL = os.environ.get("DPSQL_SPARK_FULL") == "1"
SPARK_REFUSES = {
    "shop:answer:western zips by numeric value (a failing cast must not error)": "parse text differently",
    "shop:answer:visits per month as YYYY-MM text": "strftime's format codes",
}
"""Corpus queries Spark refuses (the construct named, with the measured difference) and DuckDB answers."""
SALTED = {"shop:answer:each visitor counted in one store only"}
"""Corpus queries whose OPTIONS cut units by a salted choice, which differs between the engines."""
WIDE = 100_000
"""MAX ROWS / GROUPS PER UNIT in the compared policies: beyond any unit of either database."""


def widened(policy: str) -> str:
    """``policy`` with every per-unit limit raised to ``WIDE`` (so no copy cuts a unit)."""
    policy = re.sub(r"MAX ROWS PER UNIT \d+", f"MAX ROWS PER UNIT {WIDE}", policy)
    return re.sub(r"MAX GROUPS PER UNIT \d+", f"MAX GROUPS PER UNIT {WIDE}", policy)


def _chosen(query: Query) -> bool:
    return FULL or query.label == "refuse" or zlib.crc32(query.id.encode()) % 4 == 0


def _in_ci(query: Query) -> bool:
    """The part `make test` runs too: every other refusal and one answer in eight (by name)."""
    return zlib.crc32(query.id.encode()) % (2 if query.label == "refuse" else 8) == 0


def _params():
    for name in FILES:
        for query in CORPORA[name]:
            if _chosen(query):
                yield pytest.param(query, id=query.id, marks=[pytest.mark.spark_ci] if _in_ci(query) else [])


@pytest.fixture(scope="module")
def sides(tmp_path_factory):
    """file -> (DuckDB connection, Spark connection, DuckDB data, policy), each connection under the
    widened policy with a fixed salt."""
    shop = tmp_path_factory.mktemp("spark-corpus") / "shop.duckdb"
    build_shop_database(shop, users=300)
    census = census_connection()
    policies = {"shop.sql": widened(shop_policy()),
                "census.sql": widened((CORPUS / "census.policy").read_text(encoding="utf-8"))}
    spark = Engine("spark")
    session = spark.load(str(shop))
    spark.load(census, forget=False)  # the census tables beside the shop's: no name is shared
    opened = {}
    with fixed_salt():
        for name, duck_data in (("shop.sql", str(shop)), ("census.sql", census)):
            opened[name] = (dpsql.connect(duck_data, policy=policies[name], ledger=":memory:"),
                            dpsql.connect(session, policy=policies[name], ledger=":memory:"), duck_data, policies[name])
    yield opened
    for duck_db, spark_db, _, _ in opened.values():
        duck_db.close()
        spark_db.close()
    spark.close()
    census.close()


def _outcome(db, query: Query):
    """What ``db`` does with ``query`` under the query's own seed: ("refused", class, message) or
    ("answered", columns, rows)."""
    db._rng = SeededSource(zlib.crc32(query.id.encode()))
    try:
        result = db.sql(query.sql, **query.options)
    except dpsql.DPError as error:
        return ("refused", type(error).__name__, str(error))
    return ("answered", list(result.columns), result.fetchall())


def _same_value(a, b) -> bool:
    if isinstance(a, float) or isinstance(b, float):
        if a is None or b is None:
            return a is b
        a, b = float(a), float(b)
        if math.isnan(a) or math.isnan(b):
            return math.isnan(a) and math.isnan(b)
        return a == b or abs(a - b) <= 1e-9 * max(abs(a), abs(b))
    if isinstance(a, decimal.Decimal) or isinstance(b, decimal.Decimal):
        return a is not None and b is not None and decimal.Decimal(a) == decimal.Decimal(b)
    return a == b and type(a) is type(b)


@pytest.mark.parametrize("query", list(_params()))
def test_both_engines_agree(query: Query, sides):
    duck_db, spark_db, duck_data, policy = sides[query.file]
    if query.id in SPARK_REFUSES:
        return _refused_on_spark_only(query, spark_db, duck_data, policy)
    duck, spark = _outcome(duck_db, query), _outcome(spark_db, query)
    if query.id in SALTED:
        return _same_totals(duck, spark)
    assert spark[:2] == duck[:2], f"DuckDB: {duck}\nSpark: {spark}"
    if duck[0] == "refused":
        assert spark[2] == duck[2]
        return
    duck_rows, spark_rows = duck[2], spark[2]
    assert len(spark_rows) == len(duck_rows), f"DuckDB: {duck_rows}\nSpark: {spark_rows}"
    for duck_row, spark_row in zip(duck_rows, spark_rows):
        assert all(_same_value(a, b) for a, b in zip(duck_row, spark_row)), f"DuckDB: {duck_row}\nSpark: {spark_row}"


def _refused_on_spark_only(query: Query, spark_db, duck_data, policy: str) -> None:
    spark = _outcome(spark_db, query)
    assert spark[:2] == ("refused", "UnsupportedQuery"), spark
    assert "not supported on Spark" in spark[2] and SPARK_REFUSES[query.id] in spark[2], spark[2]
    with fixed_salt(), dpsql.connect(duck_data, policy=policy, ledger=":memory:") as alone:
        assert _outcome(alone, query)[0] == "answered"


def _same_totals(duck, spark) -> None:
    """Both answered with the same columns and keys (the first column), and each numeric column's
    total within one per row: the exact totals are equal, the noise is the same under one seed,
    and each released value is rounded on its own."""
    assert duck[0] == spark[0] == "answered" and duck[1] == spark[1], f"DuckDB: {duck}\nSpark: {spark}"
    duck_rows, spark_rows = duck[2], spark[2]
    assert sorted(r[0] for r in duck_rows) == sorted(r[0] for r in spark_rows)
    for column in range(1, len(duck[1])):
        totals = [sum(row[column] for row in rows) for rows in (duck_rows, spark_rows)]
        assert abs(totals[0] - totals[1]) <= len(duck_rows), (duck[1][column], totals)
