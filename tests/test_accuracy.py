"""Accuracy in each column's own units (``dpsql.query.accuracy``, ``dpsql.mechanisms.quantile.release_interval``).

What is checked: interval arithmetic on hand-made cases and against DuckDB on sampled points;
the quantile value interval's endpoint utility by brute force over neighbouring multisets; the
interval's coverage by a binomial test; the union bound for post-processed columns; that the
shell, CLI (CSV/JSON), chart and server show the numbers ``accuracy_df`` gives; that a repeat
gives the same intervals.

Soundness: the coverage test is one-sided binomial at p < 1e-6 (a correct implementation fails
it with probability below 1e-6 per case), and it fails for every case when the endpoints'
shift R is shrunk to R/4. Everything else is deterministic (seeded).
"""

from __future__ import annotations

import itertools
import json
import math
from fractions import Fraction
from unittest import mock

import duckdb
import numpy as np
import pandas as pd
import pytest
import sqlglot
from scipy import stats

import dpsql
from dpsql.query.accuracy import aggregates_of, derive
from dpsql.mechanisms import quantile
from dpsql.mechanisms.noise import SeededSource
from dpsql.mechanisms.quantile import (
    ENDPOINT_ALPHA,
    VALUE_SHARE,
    _endpoint_log_weights,
    bound_floor,
    edge,
    endpoint_rule,
    endpoint_shift,
    quantile_accuracy,
    quantile_rule,
    release_interval,
    value_rule,
)
from dpsql.shell.chart import render_chart
from dpsql.shell.render import NO_INTERVAL, answer_from, render_answer

P_FAIL = 1e-6


# ---------------------------------------------------------------- interval arithmetic

def d(sql: str, **env):
    return derive(sqlglot.parse_one(sql, read="duckdb"), {k: tuple(map(float, v)) for k, v in env.items()})


def close(got, want):
    return got is not None and got[0] == pytest.approx(want[0], abs=1e-9) and got[1] == pytest.approx(want[1], abs=1e-9)


@pytest.mark.parametrize(("sql", "env", "want"), [
    ("a0 + 5", {"a0": (1, 3)}, (6, 8)),
    ("a0 - a1", {"a0": (1, 3), "a1": (10, 20)}, (-19, -7)),
    ("-a0", {"a0": (1, 3)}, (-3, -1)),
    ("a0 * -2", {"a0": (1, 3)}, (-6, -2)),
    ("a0 * a1", {"a0": (-1, 3), "a1": (-2, 5)}, (-6, 15)),
    ("a0 / 60", {"a0": (600, 1200)}, (10, 20)),
    ("a0 / a1", {"a0": (90, 110), "a1": (9, 11)}, (90 / 11, 110 / 9)),
    ("(a0 + 1) / a1", {"a0": (-10, 10), "a1": (-4, -2)}, (-5.5, 4.5)),
    ("ROUND(a0, 1)", {"a0": (4.44, 4.46)}, (4.4, 4.5)),
    ("ROUND(a0)", {"a0": (4.4, 4.6)}, (4, 5)),
    ("ROUND(a0, -2)", {"a0": (1234, 1290)}, (1200, 1300)),
    ("FLOOR(a0)", {"a0": (1.5, 2.5)}, (1, 2)),
    ("CEIL(a0)", {"a0": (1.5, 2.5)}, (2, 3)),
    ("ABS(a0)", {"a0": (-3, 2)}, (0, 3)),
    ("ABS(a0)", {"a0": (-3, -2)}, (2, 3)),
    ("CAST(a0 AS INTEGER)", {"a0": (1.2, 3.7)}, (1, 4)),
    ("CAST(a0 AS DECIMAL(10, 2))", {"a0": (1.234, 1.236)}, (1.23, 1.24)),
    ("CAST(a0 AS DOUBLE)", {"a0": (1.5, 2.5)}, (1.5, 2.5)),
    ("LEAST(a0, a1)", {"a0": (1, 5), "a1": (2, 3)}, (1, 3)),
    ("GREATEST(a0, 4)", {"a0": (1, 5)}, (4, 5)),
    ("SQRT(a0)", {"a0": (4, 9)}, (2, 3)),
    ("LN(a0)", {"a0": (1, math.e)}, (0, 1)),
    ("EXP(a0)", {"a0": (0, 1)}, (1, math.e)),
])
def test_interval_arithmetic_on_hand_made_cases(sql, env, want):
    got = d(sql, **env)
    assert close(got, want), (sql, got, want)
    assert got[0] <= want[0] and got[1] >= want[1]  # never narrower than the exact interval


@pytest.mark.parametrize(("sql", "env"), [
    ("a0 / a1", {"a0": (1, 2), "a1": (-1, 3)}),            # a divisor that may be 0
    ("a0 / a1", {"a0": (1, 2), "a1": (0, 3)}),
    ("SQRT(a0)", {"a0": (-1, 4)}),                          # outside the domain
    ("LN(a0)", {"a0": (0, 4)}),
    ("CASE WHEN a0 > 1 THEN 1 ELSE 0 END", {"a0": (0, 4)}),
    ("a0 > 5", {"a0": (0, 4)}),
    ("CAST(a0 AS VARCHAR)", {"a0": (0, 4)}),
    ("a0 + g0", {"a0": (0, 4)}),                            # a key inside: not an interval
    ("a0 % 3", {"a0": (0, 4)}),
    ("a0 + 1", {"a0": (math.nan, math.nan)}),               # an aggregate with no interval
    ("EXP(a0)", {"a0": (0, 1e6)}),                          # overflows
])
def test_no_interval_where_none_is_sound(sql, env):
    assert d(sql, **env) is None


EXPRESSIONS = ["a0 / a1", "ROUND(a0 / a1, 1)", "(a0 - a1) * 3 + 1", "ABS(a0) / 60", "CAST(a0 AS INTEGER)",
               "GREATEST(a0, a1) - LEAST(a0, a1)", "SQRT(ABS(a0)) + FLOOR(a1)", "ROUND(a0 * a1, -1)",
               "CAST(a0 / 7 AS DECIMAL(12, 3))", "-(a0) / -a1", "LOG(a1)", "LN(a1)", "LOG10(a1) + LOG2(a1)",
               "LOG(2, a1)", "EXP(a1 / 10)", "ROUND(a0)", "CEIL(a0 / 3) - FLOOR(a1 * 2)"]


@pytest.mark.parametrize("sql", EXPRESSIONS)
def test_interval_holds_duckdbs_value_at_sampled_points(sql):
    rng = np.random.default_rng(abs(hash(sql)) % 2**32)   # the cases, not noise
    con = duckdb.connect()
    for _ in range(30):
        box = {}
        for name in ("a0", "a1"):
            low = float(rng.uniform(-50, 50)) if name == "a0" else float(rng.uniform(0.5, 30))
            box[name] = (low, low + float(rng.uniform(0, 20)))
        interval = derive(sqlglot.parse_one(sql, read="duckdb"), box)
        assert interval is not None
        points = [tuple(corner) for corner in itertools.product(*box.values())]
        points += [tuple(rng.uniform(*box[n]) for n in box) for _ in range(20)]
        for a0, a1 in points:
            value = con.execute(f"SELECT CAST({sql} AS DOUBLE) FROM (SELECT ?::DOUBLE AS a0, ?::DOUBLE AS a1)",
                                [a0, a1]).fetchone()[0]
            assert interval[0] <= value <= interval[1], (sql, box, (a0, a1), value, interval)


def test_aggregates_of_counts_each_once():
    assert aggregates_of(sqlglot.parse_one("a0 / a1 + a0 * g0")) == ["a0", "a1"]


# ---------------------------------------------------------------- the endpoint utility's sensitivity

REST = 4


def multisets(buckets: int, max_total: int) -> np.ndarray:
    rows = [c for c in itertools.product(range(max_total + 1), repeat=buckets) if sum(c) <= max_total]
    return np.array(rows, dtype=np.int64).reshape(-1, buckets)


def neighbour_pairs(buckets: int, k: int, neighbours: str):
    rest, unit = multisets(buckets, REST), multisets(buckets, k)
    if neighbours == "unbounded":
        d0 = np.repeat(rest, len(unit), axis=0)
        return d0, d0 + np.tile(unit, (len(rest), 1))
    d0 = np.repeat(rest, len(unit) ** 2, axis=0)
    first = np.tile(np.repeat(unit, len(unit), axis=0), (len(rest), 1))
    second = np.tile(np.tile(unit, (len(unit), 1)), (len(rest), 1))
    return d0 + first, d0 + second


def endpoint_utilities(counts: np.ndarray, q: float, shift: int, floor: int, side: str) -> np.ndarray:
    """Per row and edge: -dist(t, ranks of the bucket above (low) or below (high) the edge), with
    t = q n -/+ shift, and the public bound's edge at least -floor (an independent reading of
    the module docstring of dpsql.mechanisms.quantile)."""
    below = np.concatenate([np.zeros((len(counts), 1), dtype=np.int64), np.cumsum(counts, axis=1)], axis=1)
    n = below[:, -1:]
    if side == "low":
        t, lo, hi = q * n - shift, below, np.concatenate([below[:, 1:], n], axis=1)
    else:
        t, lo, hi = q * n + shift, np.concatenate([np.zeros_like(n), below[:, :-1]], axis=1), below
    u = -np.maximum(np.maximum(lo - t, 0), t - hi)
    anchor = 0 if side == "low" else -1
    u[:, anchor] = np.maximum(u[:, anchor], -floor)
    return u


@pytest.mark.parametrize("neighbours", ["unbounded", "bounded"])
@pytest.mark.parametrize("q", [0, 0.25, 0.5, 1])
def test_endpoint_utility_sensitivity_is_the_quantiles(q, neighbours):
    # The endpoints aim at a public shift of q n and floor the public bound's edge at a public
    # -A: the largest change one unit makes is the quantile's own Delta_u, and it is reached.
    for k, buckets in itertools.product((1, 2, 3), (2, 3)):
        rule = quantile_rule(q, Fraction(1), k, neighbours, 0, 1, buckets=buckets)
        d0, d1 = neighbour_pairs(buckets, k, neighbours)
        largest = 0.0
        for side, shift, floor in itertools.product(("low", "high"), (0, 1, 2, 7), (0, 1, 3)):
            change = np.abs(endpoint_utilities(d0, q, shift, floor, side) - endpoint_utilities(d1, q, shift, floor, side))
            largest = max(largest, float(np.max(change)))
        assert Fraction(largest) <= rule.utility_sensitivity
        if buckets > 1 and (neighbours == "unbounded" or k > 1):
            assert Fraction(largest) == rule.utility_sensitivity


def test_endpoint_weights_are_the_utility_exactly():
    rule = quantile_rule(0.3, Fraction(7, 10), 3, "unbounded", 0, 1, buckets=5)
    counts = np.array([[4, 0, 9, 2, 7], [0, 0, 0, 0, 1], [30, 0, 0, 0, 0]])
    shift, floor = endpoint_shift(rule), bound_floor(rule)
    scale = endpoint_rule(rule).epsilon / (2 * rule.utility_sensitivity)
    for side in ("low", "high"):
        for row, u in zip(counts, endpoint_utilities(counts, Fraction(0.3), shift, floor, side)):
            want = [float(scale * (Fraction(x) - max(u))) for x in u]   # u is exact: Fractions of dyadic q
            assert _endpoint_log_weights(row.tolist(), rule, side).tolist() == want


def test_the_three_draws_spend_the_aggregates_epsilon():
    for q in (0, 0.3, 1):
        rule = quantile_rule(q, Fraction(3, 7), 2, "unbounded", 0, 10, buckets=16)
        ends = 1 if q in (0, 1) else 2
        assert value_rule(rule).epsilon + ends * endpoint_rule(rule).epsilon == rule.epsilon
        assert value_rule(rule).epsilon == rule.epsilon * VALUE_SHARE
        r0 = math.ceil(quantile_accuracy(endpoint_rule(rule), math.inf, ENDPOINT_ALPHA / 2))
        assert bound_floor(rule) == math.ceil(r0 / 2) and endpoint_shift(rule) == r0 + bound_floor(rule)


# ---------------------------------------------------------------- coverage of the value interval

def light_counts(n: int, buckets: int = 1024) -> list[int]:
    """n values in distinct buckets: no heavy bucket (a fixed dataset, not noise)."""
    chosen = np.random.default_rng(11).choice(buckets, n, replace=False)
    return np.bincount(chosen, minlength=buckets).tolist()


def heavy_counts(n: int, buckets: int = 1024) -> list[int]:
    """n values on 12 distinct buckets: every bucket holding values is heavy."""
    chosen = np.random.default_rng(12).choice(np.arange(0, buckets, buckets // 12)[:12], n)
    return np.bincount(chosen, minlength=buckets).tolist()


def misses(counts: list[int], rule, trials: int, shrink: float = 1.0) -> int:
    """Seeded releases whose interval misses the true q-quantile (the smallest value with at
    least q·n values at or below it; values sit at bucket midpoints)."""
    values = np.repeat(np.arange(len(counts)) + 0.5, counts) * float(rule.upper - rule.lower) / rule.buckets
    true = np.quantile(values, rule.q, method="inverted_cdf")
    shift = quantile.endpoint_shift
    with mock.patch.object(quantile, "endpoint_shift", lambda r: math.ceil(shift(r) * shrink)):
        count = 0
        for seed in range(trials):
            value, low, high = release_interval(counts, rule, SeededSource(seed))
            assert low <= value <= high
            count += not (edge(rule, low) <= true <= edge(rule, high))
    return count


COVERAGE = [(0.1, Fraction(1), 20), (0.9, Fraction(1), 20), (0.9, Fraction(1), 50), (0.1, Fraction(1, 2), 100)]


@pytest.mark.parametrize(("q", "epsilon", "n"), COVERAGE + [pytest.param(*case, marks=pytest.mark.slow) for case in [
    (0.5, Fraction(1), 200), (0, Fraction(1), 50), (1, Fraction(2), 900)]])
def test_quantile_interval_covers_the_true_quantile(q, epsilon, n):
    # Each release misses with probability <= 0.05 (module docstring of dpsql.mechanisms.quantile: the
    # anchored endpoint utilities put every missing edge at least R below the best).
    trials = 300
    rule = quantile_rule(q, epsilon, 1, "unbounded", 0, 1024, buckets=1024)
    for counts in (light_counts(n), heavy_counts(n)):
        missed = misses(counts, rule, trials)
        assert stats.binom.sf(missed - 1, trials, ENDPOINT_ALPHA) >= P_FAIL, missed


@pytest.mark.parametrize(("q", "epsilon", "n"), COVERAGE)
def test_coverage_test_fails_with_a_shrunk_shift(q, epsilon, n):
    trials = 300
    rule = quantile_rule(q, epsilon, 1, "unbounded", 0, 1024, buckets=1024)
    missed = misses(light_counts(n), rule, trials, shrink=0.25)
    assert stats.binom.sf(missed - 1, trials, ENDPOINT_ALPHA) < P_FAIL, missed


# ---------------------------------------------------------------- end to end

RNG = np.random.default_rng(3)
N = 3000
TRIPS = pd.DataFrame({"uid": np.arange(N) // 2, "delay": np.clip(RNG.normal(5, 40, N), -60, 300).round(1),
                      "origin": RNG.choice(["EWR", "JFK", "LGA"], N)})
POLICY = """BUDGET EPSILON 100; QUERY EPSILON 1;
PRIVATE TABLE trips (PRIVACY UNIT uid, MAX ROWS PER UNIT 2, delay BOUNDS -60 TO 300,
                     origin KEYS ('EWR', 'JFK', 'LGA'));"""
QUERY = ("SELECT origin, COUNT(*) AS n, MEDIAN(delay) AS med, MIN(delay) AS lo, ROUND(AVG(delay), 1) AS mean, "
         "SUM(delay) / 60 AS hours, SUM(delay) / COUNT(*) AS ratio, "
         "CASE WHEN COUNT(*) > 10 THEN 'many' ELSE 'few' END AS size FROM trips GROUP BY origin ORDER BY origin")


@pytest.fixture
def db():
    with dpsql.connect({"trips": TRIPS}, policy=POLICY, rng=SeededSource(4)) as connection:
        yield connection


def test_every_noisy_column_has_an_accuracy_in_its_units(db):
    result = db.sql(QUERY)
    accuracy = result.accuracy()
    assert set(accuracy) == {"n", "med", "lo", "mean", "hours", "ratio", "size"}  # not the key
    assert math.isnan(accuracy["size"])                                            # CASE: derived, no ±
    for name in ("n", "med", "lo", "mean", "hours", "ratio"):
        assert 0 < accuracy[name] < 360, name  # a value's interval, not a rank: within the bounds' span
    spans = result.intervals()
    for name in ("med", "lo", "mean", "hours", "ratio"):
        assert (spans[f"{name}_low"] <= spans[name]).all() and (spans[name] <= spans[f"{name}_high"]).all()
    assert (spans["lo_low"] == -60).all()                       # MIN's lower endpoint is the public bound
    cells = result.accuracy_df()
    assert cells["origin"].isna().all() and cells["size"].isna().all()
    assert accuracy["med"] == cells["med"].max()
    truth = TRIPS.groupby("origin").delay.median()               # the true medians, inside (a sanity check)
    assert all(lo <= truth[o] <= hi for o, lo, hi in zip(spans["origin"], spans["med_low"], spans["med_high"]))


def test_quantile_interval_is_the_95_percent_one(db):
    result = db.sql("SELECT MEDIAN(delay) AS med FROM trips")
    assert result.accuracy(0.1) == result.accuracy(0.05)        # conservative above 0.05
    assert math.isnan(result.accuracy(0.01)["med"])             # not known below
    assert result.intervals(0.01)[["med_low", "med_high"]].isna().all(axis=None)


def test_a_post_processed_column_takes_each_aggregate_at_alpha_over_j(db):
    result = db.sql("SELECT COUNT(*) AS n, SUM(delay) AS s, SUM(delay) / COUNT(*) AS r, SUM(delay) / 60 AS h "
                    "FROM trips")
    (n, s, r, h), = result.fetchall()
    for alpha in (0.05, 0.2):
        spans = result.intervals(alpha).iloc[0]
        n2, s2 = result.intervals(alpha / 2).iloc[0][["n_low", "n_high"]], result.intervals(alpha / 2).iloc[0][["s_low", "s_high"]]
        quotients = [a / b for a in s2 for b in n2]
        assert spans["r_low"] <= min(quotients) and spans["r_high"] >= max(quotients)
        assert spans["r_low"] == pytest.approx(min(quotients)) and spans["r_high"] == pytest.approx(max(quotients))
        assert spans["h_low"] == pytest.approx(spans["s_low"] / 60) and spans["h_high"] == pytest.approx(spans["s_high"] / 60)
        assert result.accuracy(alpha)["h"] == pytest.approx(result.accuracy(alpha)["s"] / 60)


def test_a_divisor_interval_holding_zero_gives_no_interval():
    frame = pd.DataFrame({"uid": [1], "x": [1.0]})
    policy = "BUDGET EPSILON 10; PRIVATE TABLE t (PRIVACY UNIT uid, MAX ROWS PER UNIT 1, x BOUNDS 0 TO 10);"
    with dpsql.connect({"t": frame}, policy=policy, rng=SeededSource(1)) as db:
        result = db.sql("SELECT SUM(x) / COUNT(*) AS r FROM t", epsilon=0.1)
        assert math.isnan(result.accuracy()["r"])   # one row, noise of a few dozen: the count may be 0


def test_a_repeat_gives_the_same_intervals(db):
    first = db.sql(QUERY)
    again = db.sql(QUERY)
    assert again.repeat and again.fetchall() == first.fetchall()
    pd.testing.assert_frame_equal(again.intervals(), first.intervals())
    pd.testing.assert_frame_equal(again.accuracy_df(0.2), first.accuracy_df(0.2))


def test_distinct_rows_have_no_interval(db):
    result = db.sql("SELECT DISTINCT ROUND(COUNT(*), -3) AS n FROM trips GROUP BY origin")
    assert all(math.isnan(v) for v in result.accuracy().values()) and set(result.accuracy()) == {"n"}


def test_explain_states_the_quantile_split(db):
    text = db.explain("SELECT MEDIAN(delay) FROM trips")
    assert "the value with 0.5 of its epsilon" in text and "two endpoints" in text
    assert "upper endpoint" in db.explain("SELECT MIN(delay) FROM trips")


# ---------------------------------------------------------------- the same numbers everywhere

def test_shell_csv_json_and_chart_show_accuracy_df(db):
    result = db.sql(QUERY)
    answer = answer_from(result)
    cells = result.accuracy_df()
    for name in ("n", "med", "mean", "ratio"):
        assert answer.half_widths[name] == pytest.approx(cells[name].tolist())
    records = json.loads(render_answer(answer, "json"))
    for record, (_, row) in zip(records, cells.iterrows()):
        assert record["med_halfwidth95"] == pytest.approx(row["med"])
        assert record["hours_halfwidth95"] == pytest.approx(row["hours"])
        assert record["size_halfwidth95"] == NO_INTERVAL
    csv_text = render_answer(answer, "csv")
    assert "size_halfwidth95" in csv_text.splitlines()[0] and NO_INTERVAL in csv_text
    table = render_answer(answer, "table", width=200)
    assert f"({NO_INTERVAL})" in table and ("±" in table or " [" in table)
    spans = result.intervals()
    assert answer.intervals["med"] == list(zip(spans["med_low"], spans["med_high"]))
    chart = render_chart(answer, "med")
    assert "95% interval" in chart


def test_chart_draws_an_asymmetric_interval():
    from dpsql.shell.render import Answer
    answer = Answer(["k", "m"], [("a", 10.0), ("b", 10.0)], half_widths={"m": [8.0, 8.0]},
                    intervals={"m": [(9.0, 18.0), (2.0, 11.0)]})
    lines = render_chart(answer, "m", width=60).splitlines()[1:3]
    # Row a's interval starts near the value and runs right; row b's runs left of it.
    a, b = lines
    assert a.index("┤") > b.index("┤") and a.count("▒") < b.count("▒")


def test_server_detail_marks_no_interval_as_null(db):
    from dpsql.server.answers import cost_detail
    detail = json.loads(cost_detail(db.sql(QUERY)))
    assert detail["halfwidth95"]["size"] is None and detail["halfwidth95"]["med"] > 0
