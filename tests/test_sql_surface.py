"""The SQL analysts write, end to end: post-processing, new aggregates, private keys, options."""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pandas as pd
import pytest

import dpsql
from dpsql.mechanisms.noise import SeededSource

RNG = np.random.default_rng(4)
USERS = 400
VISITS = pd.DataFrame({
    "uid": np.repeat(np.arange(USERS), 3),
    "store": RNG.choice(["a", "b", "c"], USERS * 3),
    "amount": RNG.uniform(0, 100, USERS * 3).round(2),
    "zip": RNG.choice(["10001", "10002", "99999"], USERS * 3, p=[0.6, 0.399, 0.001]),
})
STORES = pd.DataFrame({"store": ["a", "b", "c", "d"], "city": ["x", "x", "y", "z"]})
PROMOS = pd.DataFrame({"store": ["a", "a", "b"], "promo": ["p1", "p2", "p3"]})
PLANS = pd.DataFrame({"uid": np.arange(USERS), "tier": RNG.choice(["free", "pro"], USERS)})
POLICY = """
BUDGET EPSILON 1000 DELTA 1e-3;
QUERY EPSILON 5;
PRIVATE TABLE visits (PRIVACY UNIT uid, MAX ROWS PER UNIT 3, MAX GROUPS PER UNIT 3,
                      amount BOUNDS 0 TO 100, store KEYS FROM stores.store);
PRIVATE TABLE plans (PRIVACY UNIT uid, MAX ROWS PER UNIT 1, tier KEYS ('free', 'pro'));
PUBLIC TABLE stores;
PUBLIC TABLE promos;
"""


@pytest.fixture
def db():
    tables = {"visits": VISITS, "stores": STORES, "promos": PROMOS, "plans": PLANS}
    with dpsql.connect(tables, policy=POLICY, rng=SeededSource(2)) as connection:
        yield connection


def exact(sql: str):
    import duckdb
    con = duckdb.connect()
    con.register("visits", VISITS)
    return con.execute(sql).fetchall()


def test_having_order_and_arithmetic_run_on_noisy_values(db):
    result = db.sql("SELECT store, COUNT(*) AS n, ROUND(SUM(amount) / COUNT(*), 1) AS mean FROM visits "
                    "GROUP BY store HAVING COUNT(*) > 10 ORDER BY n DESC")
    rows = result.fetchall()
    assert result.columns == ["store", "n", "mean"]
    assert {r[0] for r in rows} == {"a", "b", "c"}  # 'd' has no visits: its noisy count fails HAVING
    assert [r[1] for r in rows] == sorted((r[1] for r in rows), reverse=True)
    assert all(40 <= r[2] <= 60 for r in rows)
    accuracy = result.accuracy()  # 'mean' is derived: its interval by interval arithmetic
    assert set(accuracy) == {"n", "mean"} and 0 < accuracy["mean"] < 50
    spans = result.intervals()
    assert (spans["mean_low"] <= spans["mean"]).all() and (spans["mean"] <= spans["mean_high"]).all()


def test_filter_and_count_distinct_units(db):
    row = db.sql("SELECT COUNT(*) FILTER (WHERE amount > 50) AS high, COUNT(DISTINCT uid) AS people, "
                 "COUNT(*) AS visits FROM visits").fetchone()
    (true_high,), = exact("SELECT COUNT(*) FROM visits WHERE amount > 50")
    assert abs(row[0] - true_high) < 40 and abs(row[1] - USERS) < 40 and abs(row[2] - 3 * USERS) < 40


def test_variance_and_stddev_are_released_within_their_bounds(db):
    row = db.sql("SELECT VAR_POP(amount) AS v, STDDEV(amount) AS s FROM visits", epsilon=20).fetchone()
    (true_var,), = exact("SELECT VAR_POP(amount) FROM visits")
    assert 0 <= row[0] <= 2500 and 0 <= row[1] <= 50
    assert abs(row[0] - true_var) < 0.2 * true_var
    assert abs(row[1] - math.sqrt(true_var)) < 0.1 * math.sqrt(true_var)


def test_private_group_keys_pass_partition_selection_only_with_delta(db):
    with pytest.raises(dpsql.UnsupportedQuery) as caught:
        db.sql("SELECT zip, COUNT(*) FROM visits GROUP BY zip", delta=0)
    assert "KEYS" in caught.value.hint and "delta" in caught.value.hint
    result = db.sql("SELECT zip, COUNT(*) AS n FROM visits GROUP BY zip ORDER BY zip", delta=1e-6)
    keys = [r[0] for r in result.fetchall()]
    assert keys == ["10001", "10002"]  # the rare zip (a handful of people) is not released
    assert result.cost.delta == Fraction(1, 10**6)
    assert "partition selection" in db.explain("SELECT zip, COUNT(*) FROM visits GROUP BY zip", delta=1e-6)


def test_group_by_expression(db):
    result = db.sql("SELECT amount > 50 AS high, COUNT(*) AS n FROM visits GROUP BY amount > 50 ORDER BY high",
                    delta=1e-6)
    assert [r[0] for r in result.fetchall()] == [False, True]


def test_weights_split_epsilon_between_aggregates(db):
    text = db.explain("SELECT COUNT(*) AS n, SUM(amount) AS s FROM visits", epsilon=3, weights={"n": 2})
    assert "a0 = COUNT(*): count (m0); epsilon 2" in text and "a1 = SUM(amount): sum (m1); epsilon 1" in text
    with pytest.raises(dpsql.InvalidParameter):
        db.explain("SELECT COUNT(*) AS n FROM visits", weights={"nothing": 1})


def test_post_processing_sees_only_the_noisy_core(db):
    text = db.explain("SELECT store, COUNT(*) * 2 AS twice FROM visits GROUP BY store")
    assert "FROM dp_core" in text and "a0 * 2" in text


def test_distinct_over_released_rows(db):
    rows = db.sql("SELECT DISTINCT COUNT(*) > 0 AS any FROM visits GROUP BY store").fetchall()
    assert len(rows) <= 2


def test_quantiles_by_the_exponential_mechanism(db):
    result = db.sql("SELECT MEDIAN(amount) AS med, QUANTILE_CONT(amount, 0.9) AS p90, MIN(amount) AS lo, "
                    "MAX(amount) AS hi FROM visits", epsilon=40)
    med, p90, lo, hi = result.fetchone()
    (true_med, true_p90), = exact("SELECT MEDIAN(amount), QUANTILE_CONT(amount, 0.9) FROM visits")
    assert abs(med - true_med) < 5 and abs(p90 - true_p90) < 5
    assert 0 <= lo <= 5 and 95 <= hi <= 100
    widths = result.accuracy()  # value intervals, in the column's units: well inside [0, 100]
    assert set(widths) == {"med", "p90", "lo", "hi"} and all(0 < w < 50 for w in widths.values())
    spans = result.intervals().iloc[0]
    assert spans["lo_low"] == 0 and spans["hi_high"] == 100  # MIN's lower and MAX's upper: the bounds
    for name in ("med", "p90", "lo", "hi"):
        assert spans[f"{name}_low"] <= spans[name] <= spans[f"{name}_high"]
    grid = 100 / 1024
    assert all(abs(v / grid - round(v / grid)) < 1e-9 for v in (med, p90, lo, hi))  # outputs on the public grid


def test_grouped_quantile(db):
    rows = db.sql("SELECT store, MEDIAN(amount) FROM visits GROUP BY store ORDER BY store", epsilon=40).fetchall()
    assert [r[0] for r in rows] == ["a", "b", "c", "d"]
    assert all(30 <= r[1] <= 70 for r in rows[:3])


def test_bigquery_options_clause_means_the_same_as_arguments(db):
    sql = ("SELECT WITH DIFFERENTIAL_PRIVACY OPTIONS (epsilon = 0.5, delta = 1e-7, max_groups_contributed = 1, "
           "privacy_unit_column = uid) zip, COUNT(*) AS n FROM visits GROUP BY zip")
    result = db.sql(sql)
    assert result.cost.epsilon == Fraction(1, 2) and result.cost.delta == Fraction(1, 10**7)
    assert "at most 3 rows and 1 group per unit" in db.explain(sql)
    db.sql(sql, epsilon=0.5)  # the same value twice is fine
    with pytest.raises(dpsql.InvalidParameter) as caught:
        db.sql(sql, epsilon=0.4)
    assert (caught.value.line, caught.value.col) == (1, 43)
    with pytest.raises(dpsql.UnsupportedQuery):
        db.sql("SELECT WITH DIFFERENTIAL_PRIVACY OPTIONS (privacy_unit_column = store) COUNT(*) FROM visits")
    with pytest.raises(dpsql.UnsupportedQuery):
        db.sql("SELECT WITH DIFFERENTIAL_PRIVACY OPTIONS (nonsense = 1) COUNT(*) FROM visits")


def test_join_with_a_public_table_groups_by_its_public_columns(db):
    rows = db.sql("SELECT s.city, COUNT(*) AS n FROM visits v JOIN stores s ON v.store = s.store "
                  "GROUP BY s.city ORDER BY s.city").fetchall()
    assert [r[0] for r in rows] == ["x", "y", "z"]  # the public domain of stores.city, z included
    (true_x,), = exact("SELECT COUNT(*) FROM visits WHERE store IN ('a', 'b')")
    assert abs(rows[0][1] - true_x) < 30


def test_a_public_key_present_twice_doubles_rows_per_unit(db):
    text = db.explain("SELECT COUNT(*) FROM visits v JOIN promos p ON v.store = p.store")
    assert "at most 6 rows" in text


def test_join_of_two_private_tables_on_the_unit(db):
    rows = db.sql("SELECT p.tier, COUNT(*) AS n FROM visits v JOIN plans p ON v.uid = p.uid "
                  "GROUP BY p.tier ORDER BY p.tier").fetchall()
    assert [r[0] for r in rows] == ["free", "pro"]
    assert abs(sum(r[1] for r in rows) - 3 * USERS) < 60


def test_per_unit_subquery_and_cte(db):
    (mean,), = db.sql("SELECT AVG(n) FROM (SELECT uid, COUNT(*) AS n FROM visits GROUP BY uid) AS per_user").fetchall()
    assert abs(mean - 3) < 0.2
    (total,), = db.sql("WITH spend AS (SELECT uid, SUM(amount) AS s FROM visits GROUP BY uid) "
                       "SELECT SUM(s) FROM spend", epsilon=20).fetchall()
    (true_total,), = exact("SELECT SUM(amount) FROM visits")
    assert abs(total - true_total) < 0.02 * true_total


def test_union_all_adds_rows_per_unit(db):
    text = db.explain("SELECT COUNT(*) FROM (SELECT uid, amount FROM visits UNION ALL "
                      "SELECT uid, amount FROM visits WHERE amount > 50) AS u")
    assert "at most 6 rows" in text
    (n,), = db.sql("SELECT COUNT(*) FROM (SELECT uid, amount FROM visits UNION ALL "
                   "SELECT uid, amount FROM visits WHERE amount > 50) AS u").fetchall()
    (extra,), = exact("SELECT COUNT(*) FROM visits WHERE amount > 50")
    assert abs(n - (3 * USERS + extra)) < 60


def test_clamp_states_bounds_in_sql(db):
    with pytest.raises(dpsql.UnsupportedQuery):
        db.sql("SELECT SUM(uid) FROM visits")  # no bounds for uid
    (total,), = db.sql("SELECT SUM(CLAMP(uid, 0, 10)) AS s FROM visits", epsilon=50).fetchall()
    (true_total,), = exact("SELECT SUM(LEAST(uid, 10)) FROM visits")
    assert abs(total - true_total) < 60
    text = db.explain("SELECT AVG(CLAMP(amount, 10, 20)) FROM visits")
    assert "clamped to [10, 20]" in text
    # per-unit totals, clamped by the analyst before the outer average
    (mean,), = db.sql("SELECT AVG(CLAMP(s, 0, 150)) FROM (SELECT uid, SUM(amount) AS s FROM visits GROUP BY uid) AS t",
                      epsilon=20).fetchall()
    assert 100 < mean <= 150
    with pytest.raises(dpsql.UnsupportedQuery):
        db.sql("SELECT SUM(CLAMP(amount, 10, amount)) FROM visits")


def test_count_distinct_values(db):
    (n,), = db.sql("SELECT COUNT(DISTINCT zip) FROM visits", epsilon=20).fetchall()
    assert abs(n - 3) <= 2
    rows = db.sql("SELECT store, COUNT(DISTINCT uid) AS people, COUNT(DISTINCT zip) AS zips FROM visits "
                  "GROUP BY store ORDER BY store", epsilon=20).fetchall()
    assert len(rows) == 4 and all(r[2] <= 10 for r in rows)


def test_date_parts_have_calendar_bounds(db):
    assert "row values in [1, 12]" in db.explain("SELECT AVG(EXTRACT(month FROM DATE '2025-01-01' + CAST(uid AS INTEGER))) FROM visits")
    with pytest.raises(dpsql.UnsupportedQuery) as caught:
        db.explain("SELECT SUM(year(DATE '2025-01-01' + CAST(uid AS INTEGER))) FROM visits")
    assert "CLAMP" in caught.value.hint


def test_a_per_unit_subquery_over_a_row_level_table_is_refused_with_the_right_advice():
    frame = pd.DataFrame({"user_id": [1, 1, 2], "amount": [1.0, 2.0, 3.0]})
    policy = "BUDGET EPSILON 5; PRIVATE TABLE visits (PRIVACY UNIT ROW, amount BOUNDS 0 TO 5);"
    with dpsql.connect({"visits": frame}, policy=policy) as db:
        with pytest.raises(dpsql.UnsupportedQuery) as refused:
            db.sql("SELECT AVG(n) AS a FROM (SELECT user_id, COUNT(*) AS n FROM visits GROUP BY user_id) AS t",
                   epsilon=0.1)
        assert "each row of visits is its own unit" in refused.value.message
        assert "GROUP BY" not in refused.value.hint and refused.value.line == 1
        assert db.budget.spent.epsilon == 0


def test_hour_minute_second_and_contains_are_allowed_like_their_peers(db):
    """hour()/minute()/second() are date parts like month() (calendar bounds 0-23, 0-59);
    contains() is a needle search like starts_with, its needle a short literal."""
    stamp = "(TIMESTAMP '2025-01-01 00:00:00' + uid * INTERVAL 7 MINUTE)"
    for part, bounds in (("hour", "[0, 23]"), ("minute", "[0, 59]"), ("second", "[0, 59]")):
        assert f"row values in {bounds}" in db.explain(f"SELECT AVG({part}({stamp})) FROM visits")
    sql = f"SELECT COUNT(*) AS n FROM visits WHERE hour({stamp}) = 3 AND minute({stamp}) < 30 AND contains(zip, '99')"
    (n,), = db.sql(sql, epsilon=50).fetchall()
    truth = exact(sql)[0][0]
    assert abs(n - truth) <= 40  # scale 3/50 per count: far inside
    with pytest.raises(dpsql.UnsupportedQuery, match="the pattern of .* must be a string literal"):
        db.explain("SELECT COUNT(*) FROM visits WHERE contains(zip, store)")


def test_boolean_and_temporal_columns_get_advice_that_works():
    frame = pd.DataFrame({"uid": [1, 2, 3], "paid": [True, False, None],
                          "ordered": pd.to_datetime(["2025-01-01", "2025-02-01", "2025-03-01"])})
    policy = "BUDGET EPSILON 10; QUERY EPSILON 1; PRIVATE TABLE t (PRIVACY UNIT uid, MAX ROWS PER UNIT 2);"
    with dpsql.connect({"t": frame}, policy=policy, rng=SeededSource(1)) as db:
        assert "row values in [0, 1]" in db.explain("SELECT SUM(paid::INT) FROM t")
        with pytest.raises(dpsql.UnsupportedQuery) as caught:
            db.explain("SELECT SUM(paid + 0) FROM t")
        assert "is BOOLEAN" in str(caught.value) and "SUM(paid::INT)" in caught.value.hint
        assert "BOUNDS" not in caught.value.hint
        with pytest.raises(dpsql.UnsupportedQuery) as caught:
            db.explain("SELECT MIN(ordered) FROM t")
        assert "not a number" in str(caught.value) and "hour(ordered)" in caught.value.hint
        assert "unbounded" not in str(caught.value) and "BOUNDS lo" not in caught.value.hint


@pytest.mark.parametrize("function, largest", [("VAR_SAMP", 100 ** 2 / 2), ("VAR_POP", 100 ** 2 / 4),
                                               ("STDDEV_SAMP", 100 / math.sqrt(2)), ("STDDEV_POP", 100 / 2)])
def test_a_variance_with_a_noisy_count_below_two_has_the_whole_range_as_its_interval(db, function, largest):
    """Released as 0 when the noisy count is at most 1; the truth can then be anything the bounds
    allow: (hi - lo)^2 / 4, and twice that for the sample form (two values, one at each bound)."""
    from dpsql.analysis.aggregates.registry import family_of
    from dpsql.analysis.plan import Release

    plan = db._prepare(f"SELECT {function}(amount) FROM visits", 1, 0, "laplace", None, False).plan
    (aggregate,) = plan.aggregates
    measures = [plan.measure(name) for name in aggregate.measures]
    release = Release(((),), {m.name: (1,) for m in measures})
    assert float(aggregate.upper - aggregate.lower) == 100  # visits' amount BOUNDS 0 TO 100 here
    assert family_of(aggregate).half_widths(aggregate, measures, release, 0.05) == [pytest.approx(largest)]
