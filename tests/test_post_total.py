"""Post-processing runs after the charge, so it must not fail (DESIGN.md: nothing after the
charge may fail): an expression of released values that DuckDB cannot compute — an
overflowing cast, an integer division by a noisy zero — gives NULL in its row, in the select
list, HAVING and ORDER BY alike, and the accuracy intervals still see the expression as
written (``dpsql.analysis.aggregates.total_post`` wraps it in TRY only in the query it runs)."""

from __future__ import annotations

import math

import duckdb
import pytest

import dpsql
from dpsql.mechanisms.noise import SeededSource

POLICY = """BUDGET EPSILON 1000 DELTA 1e-3; QUERY EPSILON 1;
PRIVATE TABLE a (PRIVACY UNIT u, MAX ROWS PER UNIT 1, x BOUNDS -10 TO 10, g KEYS (0, 1));"""


def database() -> duckdb.DuckDBPyConnection:
    """Groups g = 0, 1 of 100 units each; every x is 10, so SUM(x) * 30 is about 30,000."""
    con = duckdb.connect()
    con.execute("CREATE TABLE a AS SELECT i AS u, i % 2 AS g, 10 AS x FROM range(200) t(i)")
    return con


def connect():
    return dpsql.connect(database(), policy=POLICY, rng=SeededSource(7))


@pytest.mark.parametrize("expression", ["CAST(SUM(x) * 30 AS TINYINT)", "CAST(SUM(x) AS DECIMAL(2, 0))",
                                        "CAST(COUNT(*) AS BIGINT) // 0", "CAST(COUNT(*) AS BIGINT) % 0",
                                        "CAST(SUM(x) AS BIGINT) * 9000000000000000000"])
def test_a_failing_expression_is_null_not_a_charged_failure(expression):
    with duckdb.connect() as plain, pytest.raises(duckdb.Error):  # DuckDB itself fails on it
        plain.execute(f"SELECT {expression} FROM (SELECT 10 AS x FROM range(200))").fetchall()
    with connect() as db:
        result = db.sql(f"SELECT g, {expression} AS v, COUNT(*) AS n FROM a GROUP BY g ORDER BY g", epsilon=1)
        rows = result.fetchall()
        assert [row[1] for row in rows] == [None, None]
        assert [row[2] for row in rows] == pytest.approx([100, 100], abs=20)  # the rest is released
        assert db.budget.spent.epsilon == 1


def test_having_and_order_by_never_fail_either():
    with connect() as db:
        having = db.sql("SELECT g, COUNT(*) AS n FROM a GROUP BY g HAVING CAST(SUM(x) * 30 AS TINYINT) > 0",
                        epsilon=1).fetchall()
        ordered = db.sql("SELECT g, COUNT(*) AS n FROM a GROUP BY g ORDER BY CAST(COUNT(*) AS BIGINT) // 0, g",
                         epsilon=1).fetchall()
        assert having == []  # NULL > 0 keeps no row
        assert [row[0] for row in ordered] == [0, 1]
        assert db.budget.spent.epsilon == 2


def test_intervals_still_see_round_and_cast():
    """The TRY is in the SQL only: accuracy derives each column's interval from the tree as
    written, so ROUND and CAST keep their intervals, and they cover the released value."""
    with connect() as db:
        result = db.sql("SELECT ROUND(SUM(x) / 7.0, 1) AS r, CAST(SUM(x) AS INTEGER) AS c FROM a", epsilon=1)
        value = result.fetchall()[0]
        intervals = result.intervals()
    for name, released in zip(("r", "c"), value):
        low, high = intervals[f"{name}_low"][0], intervals[f"{name}_high"][0]
        assert low is not None and low <= released <= high
        assert high - low < 200


def test_a_ratio_over_a_noisy_zero_is_null_with_a_note_not_inf_or_nan():
    """SUM/COUNT over a key without rows: the noisy COUNT comes out 0 (epsilon 500: a nonzero
    draw has probability below 1e-200), and DuckDB's 10/0 is inf, 0/0 and 10.0 % 0 NaN. Post-
    processing answers NULL instead, like SQL under TRY and like integer // and %: in the row,
    in HAVING and in the outside-domain cell; the cell has no interval, and a note says why."""
    policy = POLICY.replace("g KEYS (0, 1)", "g KEYS (0, 1, 2)").replace("EPSILON 1000", "EPSILON 5000")
    with dpsql.connect(database(), policy=policy, rng=SeededSource(7)) as db:
        result = db.sql("SELECT g, (SUM(x) + 1) / COUNT(*) AS r, SUM(x) / COUNT(*) AS z, "
                        "CAST(SUM(x) AS DOUBLE) % COUNT(*) AS m, COUNT(*) AS n FROM a GROUP BY g ORDER BY g",
                        epsilon=500)
        assert result.fetchall() == [(0, 1001 / 100, 10.0, 0.0, 100), (1, 1001 / 100, 10.0, 0.0, 100),
                                     (2, None, None, None, 0)]
        cells = result.intervals()
        assert math.isnan(cells["r_low"][2]) and math.isnan(cells["r_high"][2])  # no ±
        assert cells["r_low"][0] <= 10.01 <= cells["r_high"][0]
        assert ("r is NULL in 1 of 3 rows: its divisor, computed from noisy values, came out 0 there (a division "
                "by zero gives NULL, never ±inf)") in result.notes[0]
        assert result.outside_domain is not None and result.outside_domain.values["r"] is None
        having = db.sql("SELECT g FROM a GROUP BY g HAVING (SUM(x) + 1) / COUNT(*) > 5 ORDER BY g", epsilon=500)
        assert having.fetchall() == [(0,), (1,)]  # inf > 5 kept the empty key; NULL > 5 keeps no row
