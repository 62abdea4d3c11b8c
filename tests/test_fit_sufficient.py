"""Linear fits from noisy sufficient statistics (dpsql.calls.fit_sufficient).

Privacy rests on one fact per statistic, each checked here by brute force through the fit's own
SQL on a tiny table: one unit's clamped total of statistic s lies in [lower_s, upper_s], so
adding or removing a unit moves s by at most max(|lower|, |upper|) and replacing one by at most
upper - lower (both reached, so a bound 1% smaller fails); and the noise drawn is the noise the
charge accounts for.
"""

from __future__ import annotations

import itertools
import math
from fractions import Fraction

import duckdb
import numpy as np
import pandas as pd
import pytest

import dpsql
import dpsql.calls.fit_sufficient
from dpsql.budget.accounting import epsilon_of_rho
from dpsql.calls.fit_sufficient import model_of, plan_sufficient, release_statistics, rows_rule_sensitivity
from dpsql.errors import InvalidParameter, UnsupportedQuery
from dpsql.mechanisms.noise import SeededSource

TINY = ("BUDGET EPSILON 1000 DELTA 1e-3; NEIGHBOURS {neighbours}; PRIVATE TABLE t (PRIVACY UNIT uid, "
        "MAX ROWS PER UNIT 3, x BOUNDS -1 TO 2{unit_x}, z BOUNDS 0 TO 10, y BOUNDS 0 TO 5{unit_y});")
UNIT_BOUNDS = (", x BOUNDS PER UNIT -1 TO 3", ", y BOUNDS PER UNIT 0 TO 6")

BASE = [(1, 0.5, 1.0, 1.0), (2, -1.0, 0.0, 0.0), (2, 2.0, 10.0, 5.0), (3, 1.0, 5.0, 2.5),
        (3, 1.5, 2.0, 4.0), (3, 0.0, 0.0, 0.5), (4, 2.0, 10.0, 0.0)]
"""(uid, x, z, y): four ordinary units, one to three rows each."""

ADVERSARIES = {
    10: [(10, "1e300", "1e300", "1e300")] * 5,                  # every column at its top, past k rows
    11: [(11, "-1e300", "-1e300", "-1e300")] * 5,               # every column at its bottom
    12: [(12, "2.0", "10.0", "0.0")] * 3,                       # x, z high, y low: negative cross products
    13: [(13, "-1.0", "0.0", "5.0")] * 3,                       # x low, y high
    14: [(14, "'NaN'", "1.0", "1.0"), (14, "'inf'", "'-inf'", "'inf'")],  # NaN dropped, infinities clamped
    15: [(15, "-1.0", "10.0", "5.0")] * 3,                      # x low, z high
    16: [(16, "2.0", "0.0", "5.0")] * 3,                        # x high, z low
}
"""Units an adversary would add, reaching each statistic's clamp from both sides."""


def tiny(neighbours: str = "UNBOUNDED", per_unit: bool = True, units: dict | None = None, rng: int = 3):
    con = duckdb.connect()
    con.execute("CREATE TABLE t (uid INTEGER, x DOUBLE, z DOUBLE, y DOUBLE)")
    con.executemany("INSERT INTO t VALUES (?, ?, ?, ?)", BASE)
    for unit_rows in (units or {}).values():
        for uid, x, z, y in unit_rows:
            con.execute(f"INSERT INTO t VALUES ({uid}, {x}, {z}, {y})")
    unit_x, unit_y = UNIT_BOUNDS if per_unit else ("", "")
    policy = TINY.format(neighbours=neighbours, unit_x=unit_x, unit_y=unit_y)
    return dpsql.connect(con, policy=policy, rng=SeededSource(rng))


def unit_totals(db, fit) -> dict[int, list[int]]:
    """Each unit's clamped totals, by the fit's own statement (unit ids added to its last layers)."""
    text = fit.statement.sql.replace("dp_fit_clamped AS (SELECT ", "dp_fit_clamped AS (SELECT dp_unit, ", 1)
    head, _ = text.rsplit(") SELECT ", 1)
    text = head + ") SELECT dp_unit, " + ", ".join(f"t{i}" for i in range(len(fit.statistics))) + " FROM dp_fit_clamped"
    rows = db._engine.fetch(text, db._executor.salt_for(fit.statement.needs_salt), bounded=fit.statement.bounded)
    return {int(r[0]): [int(v) for v in r[1:]] for r in rows}


def summed(db, fit) -> list[int]:
    statement = fit.statement
    row = db._engine.fetch(statement.sql, db._executor.salt_for(statement.needs_salt), bounded=statement.bounded)[0]
    return [int(v or 0) for v in row]


def claimed(statistic, neighbours: str) -> int:
    """The sensitivity the test derives itself from the clamp: max(|lo|, |hi|) or hi - lo, with 0 in."""
    low, high = min(statistic.lower, 0), max(statistic.upper, 0)
    return max(-low, high) if neighbours == "UNBOUNDED" else high - low


@pytest.mark.parametrize("per_unit", [True, False])
@pytest.mark.parametrize("neighbours", ["UNBOUNDED", "BOUNDED"])
def test_neighbouring_tables_move_each_statistic_by_at_most_its_sensitivity(neighbours, per_unit):
    """Brute force over every neighbour within the candidate units, through the real rewritten SQL:
    each statistic moves by at most its analysed sensitivity, which is reached (so a bound 1%
    smaller fails), and the statement's sums are the sums of the units' clamped totals."""
    db = tiny(neighbours, per_unit, ADVERSARIES)
    fit = plan_sufficient(db.mechanism_context(), "SELECT x, z, y FROM t", target="y", epsilon=1, delta=1e-6)
    # n, x, z, y, x*x, x*z, z*z, x*y, z*y: z has no BOUNDS PER UNIT
    assert [s.unit_bounded for s in fit.statistics] == [False, per_unit, False, per_unit, per_unit, False, False,
                                                         per_unit, False]
    totals = unit_totals(db, fit)
    assert set(totals) == {1, 2, 3, 4, *ADVERSARIES}
    assert summed(db, fit) == [sum(column) for column in zip(*totals.values())]
    base = [u for u in totals if u < 10]
    if neighbours == "UNBOUNDED":
        moves = [np.array(totals[u], dtype=object) for u in totals]
    else:
        moves = [np.array(totals[a], dtype=object) - np.array(totals[b], dtype=object)
                 for a, b in itertools.product(totals, totals) if a != b]
        # a replaced unit may also be one whose rows are all dropped (NaN): its totals are 0
        moves += [np.array(totals[u], dtype=object) for u in totals]
    for index, statistic in enumerate(fit.statistics):
        analysed = statistic.sensitivity
        assert analysed == claimed(statistic, neighbours)
        worst = max(abs(int(move[index])) for move in moves)
        assert worst <= analysed, statistic.name
        assert worst > Fraction(99, 100) * analysed, (statistic.name, worst, analysed)  # tight
        # never above the rows rule (k rows, each within its bounds), up to the coarse grid's step
        rows_rule = rows_rule_sensitivity(statistic, fit.fitted, 3, neighbours.lower())
        assert analysed <= rows_rule.l1 + 2


def test_the_per_unit_bounds_narrow_the_clamps():
    """With BOUNDS PER UNIT the sums of x and y and their squares are clamped tighter than by
    3 rows × their (centred) bounds; the derived square bound is max|unit total| × max|row value|."""
    with_bounds, without = (plan_sufficient(tiny(per_unit=flag).mechanism_context(), "SELECT x, z, y FROM t",
                                            target="y", epsilon=1, delta=1e-6) for flag in (True, False))
    for a, b in zip(with_bounds.statistics, without.statistics):
        if a.unit_bounded and (len(a.factors) == 1 or a.factors[0] == a.factors[1]):
            assert a.sensitivity * a.scale < b.sensitivity * b.scale
        # (a cross product may not narrow at k = 3: sqrt(6 * 30) > 3 * 1.5 * 2.5, nor with z uncentred)
    x = with_bounds.fitted[0]
    square = next(s for s in with_bounds.statistics if s.factors == (0, 0))
    grid_squared = x.grid ** 2
    assert square.upper * square.scale * grid_squared <= 3 * 2  # max|T| 3 × max|x| 2
    assert square.upper * square.scale * grid_squared > Fraction(3 * 2 * 99, 100)


@pytest.mark.parametrize("neighbours", ["UNBOUNDED", "BOUNDED"])
def test_the_noise_drawn_is_the_noise_the_charge_accounts_for(monkeypatch, neighbours):
    """Every discrete Gaussian the fit draws, recorded: sum_s Delta_s^2 / (2 sigma_s^2), with
    Delta_s derived by the test from the clamps, is the charged rho, which converts to the
    (epsilon, delta) asked for. A sigma off by any factor fails."""
    drawn = []
    original = dpsql.calls.fit_sufficient.discrete_gaussian

    def recording(sigma_squared, size, source=None):
        drawn.append((Fraction(sigma_squared), size))
        return original(sigma_squared, size, source)

    monkeypatch.setattr(dpsql.calls.fit_sufficient, "discrete_gaussian", recording)
    db = tiny(neighbours)
    model = db.fit("SELECT x, z, y FROM t", target="y", epsilon=2, delta=1e-6, method="sufficient")
    assert model.method == "sufficient"
    fit = plan_sufficient(db.mechanism_context(), "SELECT x, z, y FROM t", target="y", epsilon=2, delta=1e-6)
    assert len(drawn) == len(fit.statistics) == 9 and all(size == 1 for _, size in drawn)
    rho = sum(Fraction(claimed(s, neighbours) ** 2) / (2 * sigma) for s, (sigma, _) in zip(fit.statistics, drawn))
    assert rho == model.cost.rho
    assert epsilon_of_rho(rho, Fraction(1, 10**6)) <= 2 < epsilon_of_rho(rho * Fraction(101, 100), Fraction(1, 10**6))
    assert model.cost.epsilon == 2 and db.budget.spent.epsilon == 2


def test_the_noise_has_the_stated_variance():
    """4,000 releases of the statistics from their exact values: each statistic's noise has the
    stated variance (sample variance within 16% of sigma^2: a correct sampler fails with
    probability below 1e-6, a sigma^2 off by a factor 2 always)."""
    db = tiny()
    fit = plan_sufficient(db.mechanism_context(), "SELECT x, z, y FROM t", target="y", epsilon=1, delta=1e-6)
    exact = summed(db, fit)
    source = SeededSource(11)
    draws = np.array([release_statistics(fit, exact, source) for _ in range(4000)], dtype=float) - np.array(exact)
    for index, statistic in enumerate(fit.statistics):
        ratio = float(np.mean(draws[:, index] ** 2)) / float(statistic.sigma_squared)
        assert 0.84 < ratio < 1.16, (statistic.name, ratio)


def synthetic(units: int = 3000, rows: int = 4, seed: int = 0) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    x = rng.uniform(-10, 10, size=units * rows)
    return pd.DataFrame({"uid": np.repeat(np.arange(units), rows), "x": x,
                         "y": 2 * x + 1 + rng.normal(0, 2, size=units * rows)})


SYNTHETIC = ("BUDGET EPSILON 100 DELTA 1e-4; PRIVATE TABLE t (PRIVACY UNIT uid, MAX ROWS PER UNIT 50, "
             "x BOUNDS -10 TO 10, y BOUNDS -25 TO 25, x BOUNDS PER UNIT -40 TO 40, y BOUNDS PER UNIT -100 TO 100);")
"""Units of 4 rows under a limit of 50: the per-unit bounds, not 50 rows, bound a unit's totals."""


def test_the_bootstrap_interval_covers_the_noise_free_fit():
    """300 releases of one synthetic fit at epsilon 1 (exact statistics computed once, fresh noise
    each time): the stated 95% interval of the slope holds the noise-free slope in at least 85% of
    them (at a true 95% coverage, 85% or fewer happens with probability below 1e-9), and the slope
    is within 0.2 of the noise-free slope every time (its noise sd is about 0.02)."""
    frame = synthetic()
    with dpsql.connect({"t": frame}, policy=SYNTHETIC) as db:
        fit = plan_sufficient(db.mechanism_context(), "SELECT x, y FROM t", target="y", epsilon=1, delta=1e-6)
        exact = summed(db, fit)
    truth = model_of(fit, exact, None, None, None).coefficients["x"]
    source = SeededSource(12)
    covered = 0
    for _ in range(300):
        model = model_of(fit, release_statistics(fit, exact, source), None, None, None)
        low, high, _ = model.result.cells(0.05)["coefficient"][1]
        covered += low <= truth <= high
        assert abs(model.coefficients["x"] - truth) < 0.2
    assert abs(truth - 2) < 0.05 and all(s.unit_bounded for s in fit.statistics if s.factors)
    assert covered >= 255


@pytest.mark.parametrize("arguments, error, message", [
    (dict(model="logistic", method="sufficient"), InvalidParameter, "linear models only"),
    (dict(method="sufficient", steps=10), InvalidParameter, "gradient descent's options"),
    (dict(method="newton"), InvalidParameter, "method must be"),
    (dict(sql="SELECT x, y FROM t TABLESAMPLE POISSON (20 PERCENT)", method="sufficient"), UnsupportedQuery,
     "saves it nothing"),
])
def test_refusals_name_the_construct_and_charge_nothing(arguments, error, message):
    db = tiny()
    with pytest.raises(error) as refused:
        db.fit(**{"sql": "SELECT x, z, y FROM t", "target": "y", "epsilon": 1, "delta": 1e-6, **arguments})
    assert message in str(refused.value) and refused.value.hint
    assert db.budget.spent.epsilon == 0


def test_the_method_is_chosen_and_the_same_fit_again_is_free():
    """auto: sufficient statistics when every column reads its BOUNDS PER UNIT (x and y here) or a
    unit has one row; descent when a column (z) is bounded by its rows alone, or when asked."""
    db = tiny()
    first = db.fit("SELECT x, y FROM t", target="y", epsilon=1, delta=1e-6)
    again = db.fit("SELECT x, y FROM t", target="y", epsilon=1, delta=1e-6)
    assert first.method == "sufficient" and again.cost.repeat and again.coefficients == first.coefficients
    assert again.result.cells()["coefficient"] == first.result.cells()["coefficient"]
    assert db.ledger()["sql"].iloc[0].startswith("FIT LINEAR y ON x (sufficient statistics) OF ")
    assert db.fit("SELECT x, z, y FROM t", target="y", epsilon=1, delta=1e-6).method == "gradient"
    assert db.fit("SELECT x, y FROM t", target="y", epsilon=1, delta=1e-6, steps=3).method == "gradient"
    assert db.fit("SELECT x, z, y > 2 AS y FROM t", target="y", model="logistic", epsilon=1,
                  delta=1e-6).method == "gradient"
    call = "SELECT * FROM fit('SELECT x, z, y FROM t', target = 'y', epsilon = 900, delta = 1e-6, method = 'sufficient')"
    text = str(db.explain(call))
    assert "least squares on noisy sufficient statistics" in text and "sigma" in text
    answer = db.sql(call)
    assert [row[0] for row in answer.fetchall()] == ["intercept", "x", "z"]
    assert all(math.isfinite(half) for half in answer.accuracy_df()["coefficient"])


def test_at_a_huge_epsilon_the_fit_is_least_squares_on_the_clamped_rows():
    """With noise far below one step, the solve retraces numpy's least squares on the same rows
    (every unit's totals within its clamps: no per-unit bounds, 3 rows per unit)."""
    frame = synthetic(units=500, rows=3)
    policy = ("BUDGET EPSILON 1e12 DELTA 1e-4; PRIVATE TABLE t (PRIVACY UNIT uid, MAX ROWS PER UNIT 3, "
              "x BOUNDS -10 TO 10, y BOUNDS -25 TO 25);")
    with dpsql.connect({"t": frame}, policy=policy, rng=SeededSource(4)) as db:
        model = db.fit("SELECT x, y FROM t", target="y", epsilon=1e11, delta=1e-6, method="sufficient")
    x, y = frame["x"].clip(-10, 10).to_numpy(), frame["y"].clip(-25, 25).to_numpy()
    slope, intercept = np.polyfit(x, y, 1)
    assert model.coefficients["x"] == pytest.approx(slope, abs=1e-4)
    assert model.intercept == pytest.approx(intercept, abs=1e-3)
    assert "ridge" not in " ".join(model.result.notes)


def test_a_release_that_needed_a_ridge_states_no_interval():
    """Four units at epsilon 0.05: the noisy X'X is nowhere near positive definite, a ridge is
    added (said in a note) and no ± is stated, since the ridge's bias is not in the bootstrap."""
    db = tiny()
    model = db.fit("SELECT x, z, y FROM t", target="y", epsilon=0.05, delta=1e-6, method="sufficient")
    assert any("ridge" in note and "no ± is stated" in note for note in model.result.notes)
    assert all(math.isnan(half) for half in model.result.accuracy_df()["coefficient"])
    assert all(math.isfinite(v) for v in [model.intercept, *model.coefficients.values()])
