"""Intervals of the derived statistics (issue 37, item 2; ``dpsql.analysis.aggregates.intervals``):
coverage of the bounded truth over seeded releases, with a sound test (a correct implementation
fails it with probability < 1e-6) that an interval half as wide fails; the ratio's test inversion
alone; the box ranges by brute force; and the notes on undefined, clamped and uninformative values."""

from __future__ import annotations

import functools
import itertools
import math
from fractions import Fraction

import duckdb
import numpy as np
import pytest
from engine_oracle import sql_value

import dpsql
from dpsql.analysis.aggregates import family_of
from dpsql.analysis.aggregates.intervals import (
    Law,
    clamped_moments,
    correlation_bounds,
    product_range,
    ratio_interval,
    sample_factor_range,
    square_range,
    sum_critical,
    unclamped,
)
from dpsql.analysis.analyse import PrivacyOptions, analyse_query
from dpsql.analysis.check import check_query
from dpsql.analysis.plan import Plan, Release
from dpsql.backends.bounding import bounded_tables
from dpsql.backends.duckdb import Engine
from dpsql.backends.rewrite import rewrite_plan
from dpsql.mechanisms import noise
from dpsql.mechanisms.noise import SeededSource
from dpsql.policy.language import parse_policy
from dpsql.sql.names import table_key
from dpsql.sql.parse import parse

POLICY = """BUDGET EPSILON 1e16;
PRIVATE TABLE t (PRIVACY UNIT uid, MAX ROWS PER UNIT 3, y BOUNDS -4 TO 4, x BOUNDS 0 TO 8);"""

CALLS = ("AVG(y)", "VAR_POP(y)", "VARIANCE(y)", "STDDEV(y)", "CORR(y, x)", "COVAR_POP(y, x)", "COVAR_SAMP(y, x)",
         "REGR_SLOPE(y, x)", "REGR_INTERCEPT(y, x)", "REGR_R2(y, x)")
EPSILON = {"AVG(y)": 1, "VAR_POP(y)": 2, "VARIANCE(y)": 2, "STDDEV(y)": 2}
"""Per call, the epsilon its releases use (8 for the second moments: six measures share it)."""
NARROWER = {"AVG(y)": 2, "VAR_POP(y)": 2, "VARIANCE(y)": 2, "STDDEV(y)": 2, "COVAR_POP(y, x)": 2,
            "COVAR_SAMP(y, x)": 2, "CORR(y, x)": 2, "REGR_SLOPE(y, x)": 2, "REGR_INTERCEPT(y, x)": 5,
            "REGR_R2(y, x)": 2}
"""Per call, how much narrower an interval must miss too often: 2 where one pivot decides it (a
mean and one centred moment, each test close to exact; CORR's, REGR_R2's and REGR_SLOPE's own
pivots); REGR_INTERCEPT over-covers (a union bound over its slope and the means, then the worst
case of the formula over their box), by the factor given here, which this test pins so that a
wider construction fails it."""
UNIT_POLICY = """BUDGET EPSILON 1e16;
PRIVATE TABLE t (PRIVACY UNIT uid, MAX ROWS PER UNIT 10, y BOUNDS -4 TO 4, x BOUNDS 0 TO 8,
  y BOUNDS PER UNIT -6 TO 8, x BOUNDS PER UNIT 0 TO 16);"""
"""The per-unit model (item 1): each unit's totals of y, x, their squares and products clamped (x's
up to 3 rows of 8 reach 24 > 16; a sum of squares of x is clamped into [0, 16 * 8]), so the
bounded truth is the per-unit clamped statistics' (not any data set's); 10 rows per unit make it
the lower-noise model."""
UNIT_NARROWER = {"VARIANCE(y)": 2, "STDDEV(y)": 2, "COVAR_POP(y, x)": 2, "CORR(y, x)": 2.5, "REGR_SLOPE(y, x)": 2.5}
"""As NARROWER, for the per-unit model's uncentred statistics (the same pivots, in their own units)."""
TRIALS, ALPHA = 1000, 0.2
"""Releases per statistic, and the intervals' alpha: 80% intervals miss about 200 times."""


@functools.cache
def _rows() -> tuple[tuple[int, float | None, float], ...]:
    """400 units of 1 to 3 pairs on a 1/8 grid (exact on every measure's grid), a few outside the
    bounds (clamped) or NULL; every unit within its 3 rows."""
    rng = np.random.default_rng(7)
    rows = []
    for uid in range(400):
        for _ in range(int(rng.integers(1, 4))):
            x = float(rng.integers(-8, 72)) / 8
            y = float(np.round((0.6 * x - 2 + rng.normal(0, 1.2)) * 8)) / 8
            rows.append((uid, None if rng.random() < 0.05 else y, x))
    return tuple(rows)


@functools.cache
def _engine(policy_text: str = POLICY) -> Engine:
    con = duckdb.connect()
    con.execute("CREATE TABLE t (uid INTEGER, y DOUBLE, x DOUBLE)")
    con.execute("INSERT INTO t VALUES " + ", ".join(f"({u}, {sql_value(y)}, {sql_value(x)})" for u, y, x in _rows()))
    engine = Engine(con, owned=True, path=None)
    policy = parse_policy(policy_text)
    engine.prepare_bounding(bounded_tables(list(policy.private_tables), engine.catalog(), table_key), "salt")
    return engine


@functools.cache
def _exact(call: str, policy_text: str = POLICY, gaussian: bool = False) -> tuple[Plan, dict[str, int], float]:
    """The plan of ``SELECT call FROM t`` (discrete Laplace noise, or ``gaussian`` at delta 1e-6),
    its exact bounded measures (the bounded SQL run with no noise) and the bounded truth (the
    family's value of them)."""
    engine = _engine(policy_text)
    sql = f"SELECT {call} FROM t"
    policy = parse_policy(policy_text)
    query = check_query(parse(sql).tree, sql, policy, engine.catalog(), engine)
    options = (PrivacyOptions(epsilon=Fraction(EPSILON.get(call, 8)), delta=Fraction(1, 10**6), noise="gaussian")
               if gaussian else PrivacyOptions(epsilon=Fraction(EPSILON.get(call, 8))))
    plan = analyse_query(query, policy, options)
    statement = rewrite_plan(plan)
    parameters = {"salt": "salt"} if "$salt" in statement else None
    (row,) = engine.fetch(statement, parameters, bounded=plan.query.bounded)
    exact = {m.name: int(v or 0) for m, v in zip(plan.measures, row)}
    aggregate = plan.aggregates[0]
    measures = [plan.measure(name) for name in aggregate.measures]
    truth = family_of(aggregate).values(aggregate, measures, _release({k: [v] for k, v in exact.items()}))[0]
    return plan, exact, truth


def _release(noisy: dict[str, list[int]]) -> Release:
    rows = len(next(iter(noisy.values())))
    return Release(keys=((),) * rows, noisy={k: tuple(v) for k, v in noisy.items()})


def _binomial_tail(trials: int, p: float, at_least: int) -> float:
    """P(Binomial(trials, p) >= at_least), in log space."""
    logs = [math.lgamma(trials + 1) - math.lgamma(k + 1) - math.lgamma(trials - k + 1)
            + k * math.log(p) + (trials - k) * math.log1p(-p) for k in range(at_least, trials + 1)]
    top = max(logs)
    return math.exp(top) * sum(math.exp(v - top) for v in logs)


LIMIT = next(t for t in range(TRIALS + 1) if _binomial_tail(TRIALS, ALPHA, t) < 1e-6)
"""Misses at or above this many have probability < 1e-6 when coverage is at least 1 - ALPHA."""


def _misses(spans: list[tuple[float, float]], truth: float) -> int:
    # a NaN interval ("derived, no ±": a slope whose var_x may be 0) claims nothing, so misses nothing
    return sum(not (low <= truth <= high) for low, high in spans if not math.isnan(low))


def _narrowed(spans: list[tuple[float, float]], factor: float = 2) -> list[tuple[float, float]]:
    """Each interval ``factor`` times narrower about its centre."""
    cut = (1 - 1 / factor) / 2
    return [(low + (high - low) * cut, high - (high - low) * cut) for low, high in spans]


@pytest.mark.parametrize("call", CALLS)
def test_intervals_cover_the_bounded_truth_and_narrower_would_not(call):
    """1,000 releases of the bounded measures with the plan's own noise (seeded, the sampler's
    discrete Laplace): the 80% intervals miss the truth fewer than LIMIT times (P(Binomial(1000, 0.2)
    >= LIMIT) < 1e-6), and the same intervals NARROWER[call] times narrower (2 for AVG, VARIANCE and
    STDDEV) miss at least LIMIT times."""
    _check_coverage(call, POLICY, NARROWER[call])


@pytest.mark.parametrize("call", list(UNIT_NARROWER))
def test_per_unit_intervals_cover_the_bounded_truth_and_narrower_would_not(call):
    """The same under the per-unit model: its uncentred sums (v, v^2, v_x v_y, each unit's total
    clamped) go through the same pivots, and the intervals cover the per-unit clamped truth as
    closely (2 times narrower misses too often for VARIANCE, STDDEV and COVAR_POP)."""
    plan, _, _ = _exact(call, UNIT_POLICY)
    assert plan.aggregates[0].unit_model == "total", "the per-unit model is the one tested"
    assert not plan.measure(plan.aggregates[0].measures[0]).centred
    _check_coverage(call, UNIT_POLICY, UNIT_NARROWER[call])


def test_the_per_unit_clamps_bind_on_the_test_data():
    """The per-unit bounded truth is not the rows model's: some unit's totals are clamped."""
    for call in ("VARIANCE(y)", "CORR(y, x)"):
        assert abs(_exact(call, UNIT_POLICY)[2] - _exact(call)[2]) > 1e-3


@pytest.mark.parametrize("call", ["VARIANCE(y)", "CORR(y, x)", "REGR_SLOPE(y, x)"])
def test_per_unit_intervals_cover_under_gaussian_noise(call):
    """The pivots' critical values from discrete Gaussian laws (a query with delta): the same
    coverage, and 2 (VARIANCE) or 3 times narrower misses too often."""
    plan, _, _ = _exact(call, UNIT_POLICY, gaussian=True)
    assert {plan.measure(name).noise for name in plan.aggregates[0].measures} == {"gaussian"}
    _check_coverage(call, UNIT_POLICY, 2 if call == "VARIANCE(y)" else 3, gaussian=True)


def _check_coverage(call: str, policy: str, narrower: float, gaussian: bool = False) -> None:
    plan, exact, truth = _exact(call, policy, gaussian)
    aggregate = plan.aggregates[0]
    measures = [plan.measure(name) for name in aggregate.measures]
    source = SeededSource(17)
    draw = noise.discrete_gaussian if gaussian else noise.discrete_laplace
    noisy = {m.name: (exact[m.name] + draw(m.scale, TRIALS, source)).tolist() for m in measures}
    spans = family_of(aggregate).intervals(aggregate, measures, _release(noisy), ALPHA)
    assert not math.isnan(truth)
    stated = [s for s in spans if not math.isnan(s[0])]
    assert len(stated) > TRIALS * 0.9, "the intervals say something at this epsilon"
    assert _misses(spans, truth) < LIMIT
    assert _misses(_narrowed(spans, narrower), truth) >= LIMIT


@pytest.mark.parametrize("kind", ["laplace", "gaussian"])
def test_a_ratio_s_interval_covers_as_promised_and_no_more(kind):
    """The test inversion alone, with both noises at once (discrete Laplace, or discrete Gaussian
    of the same variance): 80% intervals of S/n from S' = S + e_S, n' = n + e_n miss fewer than
    LIMIT times in 1,000, and more than 150 (the construction is close to exact: a union bound
    over the two noises would miss about 60 times), and halved ones miss at least LIMIT times."""
    source = SeededSource(5)
    total, count = -3000, 400
    if kind == "laplace":
        law_sum, law_count = Law("laplace", Fraction(300)), Law("laplace", Fraction(8))
        sums = total + noise.discrete_laplace(law_sum.scale, TRIALS, source)
        counts = count + noise.discrete_laplace(law_count.scale, TRIALS, source)
    else:
        law_sum, law_count = Law("gaussian", Fraction(2 * 300**2)), Law("gaussian", Fraction(2 * 8**2))
        sums = total + noise.discrete_gaussian(law_sum.scale, TRIALS, source)
        counts = count + noise.discrete_gaussian(law_count.scale, TRIALS, source)
    spans = [ratio_interval(int(s), int(n), law_sum, law_count, Fraction(-20), Fraction(20), ALPHA)
             for s, n in zip(sums, counts)]
    misses = _misses(spans, total / count)
    assert 150 < misses < LIMIT
    assert _misses(_narrowed(spans), total / count) >= LIMIT


def test_a_ratio_s_interval_is_the_whole_range_when_the_count_is_noise_alone():
    law = Law("laplace", Fraction(50))
    assert ratio_interval(3, -2, law, law, Fraction(-10), Fraction(10), 0.05) == (-10.0, 10.0)


def _grid(low: float, high: float) -> list[float]:
    return list(np.linspace(low, high, 7))


def test_the_box_ranges_hold_every_point_of_their_boxes_and_are_reached():
    """square_range, product_range and correlation_bounds by brute force: every point of a grid
    over each box lands inside the stated range, and the range's ends are reached."""
    for low, high in [(-1.0, 2.0), (0.5, 3.0), (-3.0, -1.0)]:
        values = [m * m for m in _grid(low, high)] + [0.0] * (low <= 0 <= high)
        assert square_range(low, high) == (min(values), max(values))
    first, second = (-1.0, 0.5), (2.0, 3.0)
    values = [a * b for a in _grid(*first) for b in _grid(*second)]
    assert product_range(first, second) == (min(values), max(values))
    for cov, var_x, var_y in [((0.5, 0.8), (1.0, 2.0), (1.0, 4.0)), ((-0.9, -0.2), (0.5, 1.0), (1.0, 3.0)),
                              ((-0.3, 0.4), (0.5, 1.0), (0.8, 1.2))]:
        low, high = correlation_bounds(cov, var_x, var_y)
        values = [max(-1.0, min(1.0, c / math.sqrt(a * b)))
                  for c, a, b in itertools.product(_grid(*cov), _grid(*var_x), _grid(*var_y))]
        assert low <= min(values) and max(values) <= high
        assert min(values) - low < 1e-9 and high - max(values) < 1e-9
    assert sample_factor_range((1.0, 5.0)) == (1.25, 2.0)


def _clamp(value: float, low: float, high: float) -> float:
    return min(max(value, low), high)


@pytest.mark.parametrize("means", [((-1.0, 0.5), (0.2, 1.5)), ((1.0, 2.5), (-3.0, -1.0)), ((-2.5, 1.0), (0.5, 3.5))])
def test_clamped_moments_hold_the_values_clamps_by_brute_force(means):
    """clamped_moments against ``moments.moments``' clamps computed at every point of a grid over
    the box (means, and each moment k: the ratio k + m_u m_v clamped, less the clamped means'
    product, clamped again): every value lands inside, and the ends are reached. Spreads 2 and 3;
    some boxes cross them (the clamps bind), one lies inside (the second-order range)."""
    spreads = {"x": 2.0, "y": 3.0}
    box = {"x": means[0], "y": means[1], "cov": (-1.0, 6.5), "var_x": (-0.5, 2.0), "var_y": (1.0, 8.5)}
    out = clamped_moments(box, spreads)
    seen: dict[str, list[float]] = {"cov": [], "var_x": [], "var_y": []}
    for m_x, m_y in itertools.product(_grid(*box["x"]), _grid(*box["y"])):
        c_x, c_y = _clamp(m_x, -2, 2), _clamp(m_y, -3, 3)
        for k in _grid(*box["cov"]):
            seen["cov"].append(_clamp(_clamp(k + m_x * m_y, -6, 6) - c_x * c_y, -6, 6))
        for k in _grid(*box["var_x"]):
            seen["var_x"].append(_clamp(_clamp(k + m_x * m_x, 0, 4) - c_x * c_x, 0, 4))
        for k in _grid(*box["var_y"]):
            seen["var_y"].append(_clamp(_clamp(k + m_y * m_y, 0, 9) - c_y * c_y, 0, 9))
    for name, values in seen.items():
        low, high = out[name]
        assert low <= min(values) + 1e-12 and max(values) <= high + 1e-12, name
        if -2 <= means[0][0] and means[0][1] <= 2 and -3 <= means[1][0] and means[1][1] <= 3:
            assert min(values) - low < 1e-9 and high - max(values) < 1e-9, name  # inside: exact
    assert out["x"] == tuple(_clamp(end, -2, 2) for end in box["x"])


@pytest.mark.parametrize(("var_x", "free"), [((0.5, 2.0), True), ((0.5, 3.9), False)])
def test_a_box_no_clamp_binds_in_leaves_every_value_its_own(var_x, free):
    """``unclamped`` (the pivots of CORR and REGR_SLOPE then test the values' own truth): where it
    says so, the clamps leave every point of a grid over the box unchanged; var_x up to 3.9 with
    |m_x| up to 0.5 lets k + m_x^2 pass s_x^2 = 4, and it says so."""
    spreads = {"x": 2.0, "y": 3.0}
    box = {"x": (-0.5, 0.5), "y": (0.5, 1.0), "cov": (-1.0, 2.0), "var_x": var_x, "var_y": (1.0, 5.0)}
    assert unclamped(box, spreads) == free
    changed = False
    for m_x, m_y in itertools.product(_grid(*box["x"]), _grid(*box["y"])):
        for k in _grid(*box["cov"]):
            changed |= _clamp(_clamp(k + m_x * m_y, -6, 6) - m_x * m_y, -6, 6) != pytest.approx(k)
        for k in _grid(*box["var_x"]):
            changed |= _clamp(_clamp(k + m_x * m_x, 0, 4) - m_x * m_x, 0, 4) != pytest.approx(k)
        for k in _grid(*box["var_y"]):
            changed |= _clamp(_clamp(k + m_y * m_y, 0, 9) - m_y * m_y, 0, 9) != pytest.approx(k)
    assert changed != free


def test_the_critical_value_of_a_sum_of_noises_is_its_quantile():
    """sum_critical against the exact quantile of one discrete Laplace (30 at scale 10, 95%) and,
    for a weighted sum of three, against 200,000 seeded draws: the share of |sum| above t is below
    0.05 + 5.3 standard errors (a correct t fails with probability < 1e-7), and t is no more than
    3% above the simulated quantile."""
    assert 30 <= sum_critical(((Law("laplace", Fraction(10)), 1.0),), 0.05) < 30.1
    terms = ((Law("laplace", Fraction(40)), 1.0), (Law("laplace", Fraction(5)), 7.0),
             (Law("gaussian", Fraction(900)), 0.5))
    t = sum_critical(terms, 0.05)
    source = SeededSource(9)
    size = 200_000
    draws = (noise.discrete_laplace(Fraction(40), size, source)
             + 7.0 * noise.discrete_laplace(Fraction(5), size, source)
             + 0.5 * noise.discrete_gaussian(Fraction(900), size, source))
    quantile = float(np.quantile(np.abs(draws), 0.95))
    assert np.mean(np.abs(draws) > t) < 0.05 + 5.3 * math.sqrt(0.05 * 0.95 / size) and t < quantile * 1.03


# -- notes on undefined, clamped and uninformative values ---------------------------------------

NOTES_POLICY = """BUDGET EPSILON 1e6;
PRIVATE TABLE t (PRIVACY UNIT uid, MAX ROWS PER UNIT 3, y BOUNDS -4 TO 4, x BOUNDS 0 TO 8);"""


def test_an_uninformative_or_undefined_value_carries_a_note_saying_why():
    """At a small epsilon CORR comes back NaN or ±1, and its interval is all of [-1, 1]: each answer
    says why, and says to raise epsilon or narrow the bounds when the interval spans it all."""
    import pandas as pd

    frame = {"t": pd.DataFrame(list(_rows()), columns=["uid", "y", "x"])}
    seen = set()
    with dpsql.connect(frame, policy=NOTES_POLICY, ledger=":memory:", rng=SeededSource(2)) as db:
        for run in range(16):
            result = db.sql(f"SELECT CORR(y, x) AS c, AVG(y) AS a FROM t WHERE {run} = {run}", epsilon=0.3)
            (corr, _), = result.fetchall()
            notes = " ".join(result.notes)
            if corr is None or math.isnan(corr):
                assert "c is NaN" in notes and "≤ 0" in notes
                seen.add("nan")
            elif abs(corr) == 1:
                assert "c is exactly" in notes and "clamped" in notes
                seen.add("one")
            low, high = result.intervals()[["c_low", "c_high"]].iloc[0]
            if low <= -1 and high >= 1:
                assert "c's 95% interval spans all it can be ([-1, 1]) in the row shown: uninformative: raise ε or " \
                       "narrow the bounds" in notes
                seen.add("whole")
            else:
                assert "c's 95% interval" not in notes
            assert ("a's 95% interval" in notes) == (result.intervals()["a_high"].iloc[0] >= 4 and
                                                     result.intervals()["a_low"].iloc[0] <= -4)
    assert seen == {"nan", "one", "whole"}
