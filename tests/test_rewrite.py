"""Golden rewrite fixtures: each input query's bounded SQL, as a reviewable diff.

``fixtures/rewrite/shop.sql`` holds ``input; expected;`` pairs over the shop schema and
policy. Set DPSQL_UPDATE_FIXTURES=1 to regenerate it after an intended change, then review
the diff. The pairs are also executed on a small shop database, so every golden is valid
DuckDB SQL.
"""

from __future__ import annotations

import os
from fractions import Fraction
from pathlib import Path

import duckdb
import pytest

from dpsql.analyse import PrivacyOptions, analyse_query
from dpsql.check import check_query
from dpsql.demo import build_shop_database
from dpsql.parse import parse_query
from dpsql.rewrite import clamp_inputs, rewrite_plan
from shop import SHOP, SHOP_CATALOG

FIXTURE = Path(__file__).parent / "fixtures" / "rewrite" / "shop.sql"
INPUTS = [
    "SELECT COUNT(*) FROM visits",
    "SELECT SUM(amount) FROM visits WHERE age > 30",
    "SELECT store, COUNT(*), AVG(amount) FROM visits GROUP BY store",
    "SELECT COUNT(zip), SUM(CASE WHEN amount > 100 THEN age ELSE 0 END) FROM visits",
    "SELECT plan, COUNT(*) FROM users GROUP BY plan",
]


def bounded_sql(sql: str) -> str:
    query = check_query(parse_query(sql), sql, SHOP, SHOP_CATALOG)
    return rewrite_plan(analyse_query(query, SHOP, PrivacyOptions(epsilon=Fraction(1)), sql))


def read_pairs() -> list[tuple[str, str]]:
    chunks = [c.strip() for c in FIXTURE.read_text().split(";\n") if c.strip()]
    chunks = ["\n".join(line for line in c.splitlines() if not line.startswith("--")).strip() for c in chunks]
    return list(zip(chunks[0::2], chunks[1::2]))


def test_fixture_is_current():
    if os.environ.get("DPSQL_UPDATE_FIXTURES"):
        header = "-- input; expected bounded SQL; (regenerate: DPSQL_UPDATE_FIXTURES=1 pytest tests/test_rewrite.py)\n\n"
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
        yield con


@pytest.mark.parametrize("query, expected", read_pairs())
def test_golden_sql_runs_on_duckdb(shop, query, expected):
    rows = shop.execute(expected, {"salt": "ab"} if "$salt" in expected else {}).fetchall()
    assert rows


def test_clamping_keeps_null_and_drops_nan():
    """Invariant 13: a bare LEAST/GREATEST clamp would turn NULL into a bound."""
    query = check_query(parse_query("SELECT SUM(amount) FROM visits"), "", SHOP, SHOP_CATALOG)
    plan = analyse_query(query, SHOP, PrivacyOptions(epsilon=Fraction(1)))
    clamped = clamp_inputs(plan.measures[0].argument, plan.measures[0].clamped_columns).sql(dialect="duckdb")
    values = duckdb.execute(
        f"SELECT {clamped} FROM (VALUES (NULL::DOUBLE), ('nan'::DOUBLE), ('inf'::DOUBLE), "
        "('-inf'::DOUBLE), (-0.0::DOUBLE), (250.5::DOUBLE), (9e300::DOUBLE)) AS t(amount)"
    ).fetchall()
    assert [v[0] for v in values] == [None, None, 500, 0, 0, 250.5, 500]


def test_conditions_see_raw_values_and_sums_see_clamped_ones():
    query = check_query(parse_query("SELECT SUM(CASE WHEN amount > 600 THEN amount ELSE 0 END) FROM visits"),
                        "", SHOP, SHOP_CATALOG)
    plan = analyse_query(query, SHOP, PrivacyOptions(epsilon=Fraction(1)))
    clamped = clamp_inputs(plan.measures[0].argument, plan.measures[0].clamped_columns).sql(dialect="duckdb")
    rows = duckdb.execute(f"SELECT {clamped} FROM (VALUES (700.0), (550.0)) AS t(amount)").fetchall()
    assert [r[0] for r in rows] == [500, 0]


def test_light_units_get_exactly_what_the_window_would_grant(shop):
    """The light-unit shortcut (b = n for units within both limits) changes no result."""
    for query in ("SELECT store, COUNT(*), AVG(amount) FROM visits GROUP BY store",
                  "SELECT plan, COUNT(*) FROM users GROUP BY plan"):
        fast = bounded_sql(query)
        light = next(line for line in fast.splitlines() if "FROM dp_sizes WHERE dp_total" in line)
        condition = light.split("WHERE ", 1)[1]
        windowed = fast.replace(condition, "FALSE").replace("NOT (FALSE)", "TRUE")
        assert windowed != fast
        salt = {"salt": "ab"}
        assert sorted(shop.execute(fast, salt).fetchall()) == sorted(shop.execute(windowed, salt).fetchall())
