"""The analyst corpus on both engines: the same refusals, the same answers (issue 22, "one contract").

Every query of ``fixtures/corpus`` runs on DuckDB and on Spark over the same rows (Spark reads them
as temporary views, ``tests/engines.py``), under the corpus policies with MAX ROWS PER UNIT and MAX
GROUPS PER UNIT raised past what any unit has. Then no unit is cut, the bounded copies of the
two engines hold the same rows whatever their keyed hashes (which differ: DuckDB's ``hash``
chain, Spark's ``xxhash64``), every exact measure is the same, and with the same noise seed the
released answers must agree: the same refusal (class and message), or the same columns, keys
and values (floats to 1e-9 relative: the engines sum in different orders). Cutting, the part
that differs, is tested on Spark on its own (``tests/test_spark_engine.py``).

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
    """file -> (DuckDB connection, Spark connection), each under the widened policy with a fixed salt."""
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
                            dpsql.connect(session, policy=policies[name], ledger=":memory:"))
    yield opened
    for duck_db, spark_db in opened.values():
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
    duck_db, spark_db = sides[query.file]
    duck, spark = _outcome(duck_db, query), _outcome(spark_db, query)
    assert spark[:2] == duck[:2], f"DuckDB: {duck}\nSpark: {spark}"
    if duck[0] == "refused":
        assert spark[2] == duck[2]
        return
    duck_rows, spark_rows = duck[2], spark[2]
    assert len(spark_rows) == len(duck_rows), f"DuckDB: {duck_rows}\nSpark: {spark_rows}"
    for duck_row, spark_row in zip(duck_rows, spark_rows):
        assert all(_same_value(a, b) for a, b in zip(duck_row, spark_row)), f"DuckDB: {duck_row}\nSpark: {spark_row}"
