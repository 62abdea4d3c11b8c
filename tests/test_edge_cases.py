"""Numeric edge cases keep differential privacy (issue 6, items 4 and 5).

The oracle: for a pair of neighbouring databases (one unit added), the exact bounded
aggregates dpsql computes may differ by at most the sensitivity its plan claims — in L1 over
all released cells — whatever odd values the unit brings: NULL, NaN, +-inf, huge and tiny
numbers, -0.0, millions of rows. Released values are finite, an ungrouped query gives one
row, and released reals lie on the plan's grid whatever the data.
"""

from __future__ import annotations

import math
import time
from fractions import Fraction

import numpy as np
import pandas as pd
import pytest

import dpsql
import dpsql.query.answering
from dpsql.mechanisms.noise import SeededSource

POLICY = """
BUDGET EPSILON 1000 DELTA 1e-3;
PRIVATE TABLE t (PRIVACY UNIT uid, MAX ROWS PER UNIT 3, MAX GROUPS PER UNIT 2,
                 x BOUNDS -10 TO 100, g KEYS ('a', 'b', 'c'));
"""
K, LOW, HIGH = 3, -10, 100

QUERIES = [
    "SELECT COUNT(*), COUNT(x), SUM(x), AVG(x), VARIANCE(x), COUNT(DISTINCT uid), "
    "SUM(CASE WHEN x > 50 THEN x ELSE -x END) FROM t",
    "SELECT g, COUNT(*), SUM(x), AVG(x), STDDEV(x) FROM t GROUP BY g",
]


def base(rows: int = 40, seed: int = 0) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    return pd.DataFrame({"uid": rng.integers(1, 15, rows), "g": rng.choice(["a", "b", "c"], rows),
                         "x": rng.uniform(-20, 120, rows)})


def with_unit(frame: pd.DataFrame, values: list, groups=("a",), uid: int = 999) -> pd.DataFrame:
    extra = pd.DataFrame({"uid": uid, "g": [groups[i % len(groups)] for i in range(len(values))],
                          "x": pd.array(values, dtype="float64")})
    return pd.concat([frame, extra], ignore_index=True)


class Capture:
    """The plan and exact bounded aggregates of every release (monkeypatched in)."""

    def __init__(self, monkeypatch):
        self.plans, self.exact = [], []
        release = dpsql.query.answering.release_measures

        def capture(plan, domain, exact, source=None, histograms=None):
            self.plans.append(plan)
            self.exact.append({tuple(r[:len(plan.query.keys)]): r[len(plan.query.keys):] for r in exact})
            return release(plan, domain, exact, source, histograms)

        monkeypatch.setattr(dpsql.query.answering, "release_measures", capture)


def exact_pair(monkeypatch, tmp_path, without: pd.DataFrame, with_: pd.DataFrame, sql: str):
    """(plan, exact without the unit, exact with it, released rows with it), with one salt
    (one ledger) and one plan; the second query differs in a no-op condition only, or it
    would be answered as a free repeat of the first."""
    capture = Capture(monkeypatch)
    results = []
    for i, frame in enumerate((without, with_)):
        with dpsql.connect({"t": frame}, policy=POLICY, ledger=tmp_path / "salt.ledger",
                           rng=SeededSource(i)) as db:
            variant = sql.replace(" FROM t", f" FROM t WHERE {i} = {i}")
            results.append(db.sql(variant, epsilon=1).fetchall())
    assert capture.plans[0].summed == capture.plans[1].summed or all(
        (a.grid, a.sensitivity) == (b.grid, b.sensitivity) for a, b in zip(capture.plans[0].summed, capture.plans[1].summed))
    return capture.plans[0], capture.exact[0], capture.exact[1], results[1]


def assert_within_sensitivity(plan, before: dict, after: dict) -> None:
    for index, measure in enumerate(plan.summed):
        change = sum(abs(int(after.get(key, (0,) * 9)[index] or 0) - int(before.get(key, (0,) * 9)[index] or 0))
                     for key in set(before) | set(after))
        assert change <= measure.sensitivity.l1, (measure.name, measure.kind, change, measure.sensitivity.l1)


def assert_released_values_are_sane(rows: list[tuple]) -> None:
    for row in rows:
        for value in row:
            if isinstance(value, float):
                assert math.isfinite(value), row


ODD_UNITS = {
    "nulls": [None, None, None, None],
    "nan": [math.nan, math.nan, 5.0, math.nan],
    "infinities": [math.inf, -math.inf, math.inf, -math.inf],
    "huge": [1e308, -1e308, 1.7976931348623157e308, -1.7976931348623157e308],
    "tiny": [5e-324, -5e-324, 2.2250738585072014e-308, 1e-300],
    "negative zero": [-0.0, -0.0, 0.0, -0.0],
    "beyond bounds": [1e6, -1e6, 101.0, -10.5, 100.0, -10.0, 1e6],
    "mixed": [None, math.nan, math.inf, -0.0, 1e300, -1e-300, 42.0],
}


@pytest.mark.parametrize("values", list(ODD_UNITS.values()), ids=list(ODD_UNITS))
@pytest.mark.parametrize("sql", QUERIES)
def test_an_odd_unit_moves_exact_aggregates_at_most_by_the_sensitivity(values, sql, monkeypatch, tmp_path):
    frame = base()
    plan, before, after, released = exact_pair(monkeypatch, tmp_path, frame, with_unit(frame, values, ("a", "b", "c")), sql)
    assert_within_sensitivity(plan, before, after)
    assert_released_values_are_sane(released)


def test_a_unit_with_a_million_rows_counts_as_k_rows(monkeypatch, tmp_path):
    frame = base()
    heavy = pd.DataFrame({"uid": 7777, "g": "b", "x": np.full(1_000_000, 1e9)})
    started = time.perf_counter()
    plan, before, after, released = exact_pair(monkeypatch, tmp_path, frame, pd.concat([frame, heavy], ignore_index=True),
                                               "SELECT g, COUNT(*), SUM(x) FROM t GROUP BY g")
    assert time.perf_counter() - started < 30
    assert_within_sensitivity(plan, before, after)
    grid = plan.summed[1].grid
    assert after[("b",)][0] - before[("b",)][0] == K                  # counted as k rows, not a million
    assert (after[("b",)][1] - before[("b",)][1]) * grid == K * HIGH  # each clamped to the bound


def test_rows_without_a_unit_are_dropped_not_pooled(monkeypatch, tmp_path):
    frame = base()
    orphans = pd.DataFrame({"uid": pd.array([None] * 50, dtype="Int64"), "g": "a", "x": 100.0})
    plan, before, after, _ = exact_pair(monkeypatch, tmp_path, frame.astype({"uid": "Int64"}),
                                        pd.concat([frame.astype({"uid": "Int64"}), orphans], ignore_index=True),
                                        "SELECT COUNT(*), SUM(x) FROM t")
    assert before == after


@pytest.mark.parametrize("sql", QUERIES + ["SELECT MEDIAN(x), MIN(x), MAX(x) FROM t"])
def test_an_empty_table_gives_one_finite_row_or_every_public_key(sql):
    empty = pd.DataFrame({"uid": pd.array([], dtype="int64"), "g": pd.array([], dtype="string"),
                          "x": pd.array([], dtype="float64")})
    with dpsql.connect({"t": empty}, policy=POLICY, rng=SeededSource(0)) as db:
        rows = db.sql(sql, epsilon=1).fetchall()
    assert len(rows) == (3 if "GROUP BY" in sql else 1)
    assert_released_values_are_sane(rows)
    for row in rows:
        assert all(value is not None for value in row)


def test_empty_groups_and_all_null_columns_are_released_like_any_other():
    frame = pd.DataFrame({"uid": [1, 2, 3], "g": ["a", "a", "a"], "x": pd.array([None] * 3, dtype="float64")})
    with dpsql.connect({"t": frame}, policy=POLICY, rng=SeededSource(0)) as db:
        rows = db.sql("SELECT g, COUNT(x), SUM(x), AVG(x), MEDIAN(x) FROM t GROUP BY g", epsilon=1).fetchall()
    assert sorted(row[0] for row in rows) == ["a", "b", "c"]      # 'b' and 'c' have no rows at all
    assert_released_values_are_sane(rows)
    for _, count, total, average, median in rows:
        assert count >= 0 and LOW <= average <= HIGH and LOW <= median <= HIGH


def test_keys_outside_the_domain_and_null_keys_are_not_released():
    frame = pd.DataFrame({"uid": [1, 2, 3, 4], "g": ["a", None, "zzz", "A"], "x": [1.0, 2.0, 3.0, 4.0]})
    with dpsql.connect({"t": frame}, policy=POLICY, rng=SeededSource(0)) as db:
        keys = [row[0] for row in db.sql("SELECT g, COUNT(*) FROM t GROUP BY g", epsilon=1).fetchall()]
    assert sorted(keys) == ["a", "b", "c"]


def test_extreme_integers_and_decimals_are_clamped_exactly(monkeypatch, tmp_path):
    policy = "BUDGET EPSILON 100; PRIVATE TABLE t (PRIVACY UNIT ROW, i BOUNDS -5 TO 5, d BOUNDS 0 TO 1);"
    frame = pd.DataFrame({"i": np.array([2**63 - 1, -2**63, 3, 0], dtype="int64"),
                          "d": [0.5, 2.0, -1.0, 0.25]})
    capture = Capture(monkeypatch)
    with dpsql.connect({"t": frame}, policy=policy, rng=SeededSource(0)) as db:
        rows = db.sql("SELECT SUM(i), SUM(d), SUM(i * 2 + 1) FROM t", epsilon=1).fetchall()
    plan, exact = capture.plans[0], capture.exact[0][()]
    assert exact[0] * plan.summed[0].grid == 5 - 5 + 3 + 0
    assert exact[1] * plan.summed[1].grid == Fraction(1, 2) + 1 + 0 + Fraction(1, 4)
    assert exact[2] * plan.summed[2].grid == 11 - 9 + 7 + 1
    assert_released_values_are_sane(rows)


# ------------------------------------------------------------------------------------------
# Item 5: released reals lie on a fixed grid whatever the data; sums are fixed point.

def test_released_sums_lie_on_the_plans_grid_for_neighbouring_data(monkeypatch, tmp_path):
    frame = base()
    odd = with_unit(frame, [0.1, 1 / 3, math.pi, 1e-9], ("a",))
    sql = "SELECT SUM(x) AS s, SUM(x / 3) AS third FROM t"
    grids = set()
    capture = Capture(monkeypatch)
    for run in range(6):
        for index, data in enumerate((frame, odd)):
            with dpsql.connect({"t": data}, policy=POLICY, rng=SeededSource(100 * run + index)) as db:
                (total, third), = db.sql(sql, epsilon=1).fetchall()
            plan = capture.plans[-1]
            grids.add(tuple(m.grid for m in plan.summed))
            for value, measure in zip((total, third), plan.summed):
                steps = Fraction(value) / measure.grid
                assert steps.denominator == 1, f"{value!r} is not a multiple of the grid {measure.grid}"
    assert len(grids) == 1, "the grid depends on the data"


def test_released_quantiles_are_edges_of_a_public_grid():
    frame = base()
    edges = {Fraction(LOW) + i * Fraction(HIGH - LOW, 1024) for i in range(1025)}
    for seed, data in enumerate((frame, with_unit(frame, [math.pi] * 3))):
        with dpsql.connect({"t": data}, policy=POLICY, rng=SeededSource(seed)) as db:
            for row in db.sql("SELECT MEDIAN(x), QUANTILE_CONT(x, 0.9), MIN(x) FROM t", epsilon=1).fetchall():
                assert all(Fraction(v) in edges for v in row), row
