"""``unit_bounds_share``: bounds per unit chosen privately at query time (``dpsql.query.unit_bounds``).

The draw's own sensitivity is derived by brute force in ``tests/test_total_bound.py``; here: the
statement it reads counts what it says, the second step's sensitivity uses the drawn bound (the
oracle of ``tests/test_sensitivity_oracle.py`` on the replanned query), the ledger is charged the
query's epsilon once and the release's noise is the remaining share's, a repeat is free, and
what cannot apply is refused before the charge."""

from __future__ import annotations

import re
from fractions import Fraction

import numpy as np
import pandas as pd
import pytest
from test_sensitivity_oracle import UNIT_NOT_REACHABLE, Oracle, _check_exact, _models

import dpsql
from dpsql.analysis.analyse import PrivacyOptions, analyse_query
from dpsql.backends.rewrite import rewrite_plan
from dpsql.budget.accounting import query_cost
from dpsql.mechanisms.calibrate import laplace_scale
from dpsql.policy.model import Bounds
from dpsql.query.unit_bounds import with_unit_bounds

POLICY = """BUDGET EPSILON 20;
PRIVATE TABLE t (PRIVACY UNIT uid, MAX ROWS PER UNIT 20, MAX GROUPS PER UNIT 2,
  x BOUNDS -60 TO 360, y BOUNDS 0 TO 10, g KEYS ('a', 'b', 'c'));
PRIVATE TABLE r (PRIVACY UNIT ROW, x BOUNDS 0 TO 10);"""
SQL = "SELECT WITH DIFFERENTIAL_PRIVACY OPTIONS (unit_bounds_share = 0.2) g, AVG(x) AS a, SUM(x) AS s FROM t GROUP BY g"


def _frame(seed: int = 0, n: int = 600) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    return pd.DataFrame({"uid": rng.integers(0, 150, n), "g": rng.choice(["a", "b", "c"], n),
                         "x": rng.normal(20, 40, n).round(1), "y": rng.uniform(0, 10, n)})


def _db(frame: pd.DataFrame | None = None, budget: int = 20):
    frame = _frame() if frame is None else frame
    return dpsql.connect({"t": frame, "r": frame[["x"]].copy()},
                         policy=POLICY.replace("BUDGET EPSILON 20", f"BUDGET EPSILON {budget}"))


def _declared(lower: str, upper: str):
    """The same data under a policy declaring ``x BOUNDS PER UNIT lower TO upper``."""
    declared = POLICY.replace("x BOUNDS -60 TO 360", f"x BOUNDS -60 TO 360, x BOUNDS PER UNIT {lower} TO {upper}")
    return dpsql.connect({"t": _frame(), "r": _frame()[["x"]]}, policy=declared)


# -- the second step: its sensitivity uses the drawn bound ---------------------------------------

REPLANNED = {
    # (oracle case, SQL, drawn B, models of the measures at [-B, B])
    "sum": ("integer", "SELECT SUM(x) FROM t", 2, ("total",)),
    "sum_grouped": ("integer", "SELECT g, SUM(x) FROM t GROUP BY g", 2, ("total",)),
    "avg_grouped": ("integer", "SELECT g, AVG(x) FROM t GROUP BY g", 2, ("total", None)),
    "sum_one_group": ("one_group", "SELECT g, SUM(x) FROM t GROUP BY g", 3, ("total",)),
}


def _replanned_oracle(case: str, sql: str, bound: int) -> Oracle:
    """The oracle of ``sql`` under a policy with no BOUNDS PER UNIT, its plans replanned as
    ``unit_bounds_share`` replans them at a drawn bound B: [-B, B] (``with_unit_bounds``)."""
    oracle = Oracle(case, sql)
    lower = Fraction(0) if case == "one_group" else Fraction(-bound)  # one_group's rows are >= 0: [0, B]
    for relation, plan in list(oracle.plans.items()):
        assert _models(plan) == (None,) * len(plan.measures)  # no per-unit bound before the draw
        policy = Oracle.__init__.__globals__["_policy"](case, relation)
        query = with_unit_bounds(plan.query, {"x": Bounds(lower, Fraction(bound))})
        oracle.plans[relation] = analyse_query(query, policy, PrivacyOptions(epsilon=Fraction(1),
                                                                             delta=Fraction(1, 10**6)))
    oracle.sql = rewrite_plan(oracle.plans["unbounded"])
    return oracle


@pytest.mark.parametrize("name", list(REPLANNED))
def test_the_replanned_query_moves_by_the_drawn_bounds_sensitivity(name):
    """At the drawn bound, every measure moves by at most — and, where the data can, exactly —
    what the analysis derived from that bound, under both neighbour relations."""
    case, sql, bound, models = REPLANNED[name]
    oracle = _replanned_oracle(case, sql, bound)
    assert all(_models(plan) == models for plan in oracle.plans.values())
    _check_exact(case, sql, name, UNIT_NOT_REACHABLE | {("sum_grouped", "bounded"), ("avg_grouped", "bounded")},
                 oracle=oracle)


@pytest.mark.parametrize("name", ["sum", "sum_grouped", "avg_grouped"])
def test_a_drawn_bound_one_percent_smaller_is_exceeded(name):
    case, sql, bound, _ = REPLANNED[name]
    oracle = _replanned_oracle(case, sql, bound)
    _check_exact(case, sql, name, UNIT_NOT_REACHABLE | {("sum_grouped", "bounded"), ("avg_grouped", "bounded")},
                 slack=Fraction(99, 100), oracle=oracle)


# -- the draws' statement -------------------------------------------------------------------------

def test_the_statement_counts_each_units_first_groups_totals_by_magnitude():
    """Against pandas: per (unit, group), the total of x clamped into its BOUNDS, bucketed by the
    candidates; a unit in three groups keeps two (MAX GROUPS PER UNIT), so its count is two."""
    rows = [(1, "a", 10.0), (1, "a", 500.0), (2, "b", -100.0), (2, "c", 3.0), (3, "a", 1.0), (3, "b", 2.0),
            (3, "c", 4.0), (4, "a", None)]
    frame = pd.DataFrame(rows, columns=["uid", "g", "x"]).assign(y=1.0)
    db = _db(frame)
    prepared = db._prepare(SQL, 1)
    auto = prepared.auto
    assert auto is not None and auto.groups_per_unit == 2 and [d.column for d in auto.draws] == ["x"]
    fetched = db._answerer.curator_rows(auto.statement, ())
    counts = {int(bucket): int(count) for measure, bucket, count in fetched}
    candidates = [float(c) for c in auto.draws[0].candidates]
    clamped = frame.assign(x=frame.x.clip(-60, 360))
    totals = clamped.groupby(["uid", "g"]).x.sum(min_count=1).fillna(0).abs()
    expected: dict[int, int] = {}
    for (uid, _), total in totals.items():
        if uid == 3:
            continue  # three groups: two of them are kept, in salted order
        bucket = next((i for i, c in enumerate(candidates) if total <= c), len(candidates))
        expected[bucket] = expected.get(bucket, 0) + 1
    unit3 = [next(i for i, c in enumerate(candidates) if v <= c) for v in (1.0, 2.0, 4.0)]
    assert sum(counts.values()) == sum(expected.values()) + 2
    for bucket, count in expected.items():
        assert counts.get(bucket, 0) - count in range(0, 3)
    assert sum(counts.get(b, 0) - expected.get(b, 0) for b in set(unit3)) == 2


# -- the charge, the noise, the repeat ------------------------------------------------------------

def test_one_charge_of_the_querys_epsilon_and_a_free_repeat():
    db = _db()
    before = db.budget.spent
    first = db.sql(SQL, epsilon=1)
    assert first.cost.epsilon == 1 and (db.budget.spent.epsilon - before.epsilon) == 1
    assert any("chosen privately at epsilon 0.2" in note and "x BOUNDS PER UNIT" in note for note in first.notes)
    again = db.sql(SQL, epsilon=1)
    assert again.cost.epsilon == 0 and (db.budget.spent.epsilon - before.epsilon) == 1
    assert again.fetchall() == first.fetchall()
    assert again.accuracy() == first.accuracy()
    other = db.sql(SQL.replace("0.2", "0.3"), epsilon=1)  # another share: another release, charged
    assert other.cost.epsilon == 1


def test_the_release_is_drawn_at_the_remaining_share():
    """After the draw the query is planned at (1 - s)·epsilon: its measures' epsilons sum to it and
    each noise scale is its sensitivity over its epsilon; the whole costs epsilon. Its ± is that of
    the same query under a policy declaring the drawn bound, at (1 - s)·epsilon."""
    db = _db()
    prepared = db._prepare(SQL, 1)
    assert query_cost(prepared.plan).epsilon == 1
    assert sum(m.epsilon for m in prepared.plan.measures) == Fraction(4, 5)
    replanned = prepared.replan({"x": Fraction(500)})
    plan = replanned.plan
    assert sum(m.epsilon for m in plan.measures) == Fraction(4, 5) and query_cost(plan).epsilon == 1
    assert any(m.unit_bounds is not None for m in plan.measures)
    for measure in plan.measures:
        assert measure.scale == laplace_scale(measure.sensitivity.l1, measure.epsilon)
    declared = _declared("-500", "500")
    same = declared._prepare(SQL.replace("WITH DIFFERENTIAL_PRIVACY OPTIONS (unit_bounds_share = 0.2) ", ""),
                             Fraction(4, 5)).plan
    assert [(m.name, m.scale, m.unit_bounds) for m in same.measures] == \
        [(m.name, m.scale, m.unit_bounds) for m in plan.measures]


def test_the_answers_plus_minus_is_the_remaining_shares_at_the_drawn_bound():
    """The ± shown is that of the query under a policy declaring the drawn bound, at (1 - s)·epsilon:
    the release drew its noise from the replanned plan, not from the rows model priced before."""
    db = _db()
    res = db.sql(SQL, epsilon=1)
    note = next(n for n in res.notes if "chosen privately" in n)
    match = re.search(r"x BOUNDS PER UNIT (\S+) TO (\S+?),", note)
    assert match is not None
    lower, upper = match.groups()
    declared = _declared(lower, upper)
    plain = SQL.replace("WITH DIFFERENTIAL_PRIVACY OPTIONS (unit_bounds_share = 0.2) ", "")
    expected = declared.sql(plain, epsilon=Fraction(4, 5)).accuracy()
    # the SUM's ± is its noise's alone (an AVG's also depends on the released values, which differ)
    assert res.accuracy()["s"] == pytest.approx(expected["s"], rel=1e-9)


# -- refusals, before the charge ------------------------------------------------------------------

@pytest.mark.parametrize("sql, share, says", [
    ("SELECT g, COUNT(*) FROM t GROUP BY g", 0.2, "aggregates none"),
    ("SELECT SUM(x) FROM t", 0, "above 0 and below 1"),
    ("SELECT SUM(x) FROM t", 1, "above 0 and below 1"),
    ("SELECT WITH DIFFERENTIAL_PRIVACY OPTIONS (report_bias = 0.1) SUM(x) FROM t", 0.2, "bias report"),
])
def test_what_cannot_apply_is_refused_before_the_charge(sql, share, says):
    db = _db()
    before = db.budget.spent
    with pytest.raises(dpsql.DPError, match=says):
        db.sql(sql, epsilon=1, unit_bounds_share=share)
    with pytest.raises(dpsql.DPError, match=says):
        db.explain(sql, epsilon=1, unit_bounds_share=share)
    assert db.budget.spent.epsilon == before.epsilon


def test_a_row_level_table_gets_a_bound_on_each_rows_value():
    """Each row its own unit (one total each, l = 1): the draw chooses a tighter bound on a row's
    value, charged once like any other."""
    db = _db()
    prepared = db._prepare("SELECT SUM(x) FROM r", 1, unit_bounds_share=0.2)
    assert prepared.auto is not None and prepared.auto.groups_per_unit == 1
    assert prepared.auto.draws[0].candidates[-1] == 10  # one row's largest magnitude
    res = db.sql("SELECT SUM(x) FROM r", epsilon=1, unit_bounds_share=0.2)
    assert res.cost.epsilon == 1 and any("chosen privately" in note for note in res.notes)


def test_the_option_in_sql_is_placed_and_explained():
    db = _db()
    with pytest.raises(dpsql.DPError) as refused:
        db.sql("SELECT WITH DIFFERENTIAL_PRIVACY OPTIONS (unit_bounds_share = 0.2)\n g, COUNT(*) FROM t GROUP BY g",
               epsilon=1)
    assert refused.value.line == 1 and refused.value.col is not None
    text = str(db.explain(SQL, epsilon=1))
    assert "EXPLAIN cannot state them before the charge" in text
    assert "chosen privately at epsilon 0.2" in text and "costs epsilon 1," in text
    assert db.budget.spent.epsilon == 0


def test_the_noise_drawn_is_the_one_stated():
    """The released noise has the law of the plan it is stated from (the replanned one): 1,000
    units with one row y = 5 each (no drawn bound reaches below 5 at this epsilon: candidates
    under 5 are 990 ranks from the target, exp(-990/4) of the weight; a higher bound clamps
    nothing), so the truth is exactly 5,000 and value - 5,000 is Laplace(b), b = half-width /
    ln 20. Over 300 answers the mean of |z| (an Exp(1) mean: 1, sd 0.058) lies in [0.7, 1.4]
    except with probability < 1e-6; noise drawn at twice or half the stated scale (mean 2 or
    0.5) fails it, and so does a release from the rows plan stated at the drawn bound."""
    frame = pd.DataFrame({"uid": range(1000), "g": "a", "x": 0.0, "y": 5.0})
    db = _db(frame, budget=1000)
    sql = "SELECT WITH DIFFERENTIAL_PRIVACY OPTIONS (unit_bounds_share = 0.5) SUM(y) AS s FROM t"
    magnitudes, per_unit = [], 0
    for i in range(300):
        res = db.sql(sql, epsilon=Fraction(10**9 + i, 10**9))  # a new epsilon each time: no free repeat
        per_unit += "per-unit model answered" in next(n for n in res.notes if "chosen privately" in n)
        value, half = res.fetchall()[0][0], res.accuracy()["s"]
        magnitudes.append(abs(value - 5000) / (half / np.log(20)))
    # B = 200 (the cap: rows model kept) has weight about 0.08 against the target's 1, so most answers
    # use the per-unit model; fewer than 100 of 300 would take a probability far below 1e-6
    assert per_unit >= 100
    assert 0.7 <= float(np.mean(magnitudes)) <= 1.4


def test_the_replanned_query_never_costs_more_rho_than_was_charged():
    """An attacker's review: the charge is priced before the draw (the rows model), the noise drawn
    from the plan re-planned at the drawn bound, whose Gaussian sigma^2 rounded differently: under
    ACCOUNTING ZCDP its rho exceeded the charge by up to ~1e-8 of it. Now it never does."""
    import numpy as np
    import pandas as pd

    from dpsql.budget.accounting import query_cost

    policy = ("BUDGET EPSILON 1000 DELTA 1e-3; ACCOUNTING ZCDP; PRIVATE TABLE t (PRIVACY UNIT uid, "
              "MAX ROWS PER UNIT 20, MAX GROUPS PER UNIT 2, x BOUNDS -60 TO 360, y BOUNDS 0 TO 10, "
              "g KEYS ('a', 'b', 'c'));")
    rng = np.random.default_rng(0)
    frame = pd.DataFrame({"uid": rng.integers(0, 50, 200), "g": rng.choice(["a", "b", "c"], 200),
                          "x": rng.normal(20, 40, 200).round(1), "y": rng.uniform(0, 10, 200)})
    over = 0
    with dpsql.connect({"t": frame}, policy=policy) as db:
        for sql in ("SELECT g, SUM(x) AS s, AVG(y) AS a FROM t GROUP BY g", "SELECT VARIANCE(x) AS v FROM t"):
            for epsilon, share in ((50, Fraction(1, 2)), (1, Fraction(1, 10)), (Fraction(1, 20), Fraction(9, 10))):
                prepared = db._prepare(sql, epsilon, 1e-6, "gaussian", unit_bounds_share=share)
                charged = prepared.priced.cost
                for bound in prepared.auto.draws[0].candidates[::3]:
                    again = prepared.replan({draw.column: bound for draw in prepared.auto.draws})
                    spent = query_cost(again.plan)
                    assert spent.epsilon == charged.epsilon and spent.delta == charged.delta
                    over += spent.rho > charged.rho
    assert over == 0
