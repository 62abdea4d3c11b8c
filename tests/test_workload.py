"""Workloads by MWEM (``dpsql.calls.workload``, ``dpsql.mechanisms.mwem``): sensitivities by brute force,
the exponential mechanism's probabilities, the composition against the charge, the
multiplicative-weights update as post-processing, the measurement noise's scale, refusals,
the ledger and free repeats."""

from __future__ import annotations

import itertools
import json
import math
import shutil
from fractions import Fraction

import duckdb
import numpy as np
import pandas as pd
import pytest

import dpsql
import dpsql.mechanisms.mwem as mwem
import dpsql.calls.workload as workload_module
from dpsql.mechanisms.noise import SeededSource, _exponential_mechanism_draws
from dpsql.calls.workload_run import plan_workload

POLICY = """BUDGET EPSILON 100 DELTA 1e-3;
NEIGHBOURS {neighbours};
PRIVATE TABLE t (PRIVACY UNIT uid, MAX ROWS PER UNIT 2, a KEYS (1, 2), b KEYS ('x', 'y'), v BOUNDS 0 TO 9);
"""
QUERIES = [
    "SELECT COUNT(*) FROM t",
    "SELECT COUNT(*) FROM t WHERE a = 1",
    "SELECT 2 * COUNT(*) FILTER (WHERE b = 'x') - 3 * COUNT(*) FILTER (WHERE a = 2) AS d FROM t",
    "SELECT a, COUNT(*) - COUNT(*) FILTER (WHERE b = 'y') FROM t GROUP BY a",
    "SELECT COUNT(*) FILTER (WHERE a = 1) + COUNT(*) FILTER (WHERE a = 1 OR b = 'x') FROM t WHERE b IS NOT NULL",
    "SELECT b, a, COUNT(*) FROM t WHERE NOT a <> 2 GROUP BY a, b",
]
ROW_TYPES = list(itertools.product([1, 2, None], ["x", "y", "z"]))
"""Rows a unit may hold: every key, a value outside b's domain, a NULL."""


def base_frame() -> pd.DataFrame:
    rows = [(uid, a, b, 1) for uid, (a, b) in enumerate(ROW_TYPES * 2, start=1)]
    return pd.DataFrame(rows, columns=["uid", "a", "b", "v"]).astype({"a": "Int64"})


def connect(neighbours: str = "unbounded", frame: pd.DataFrame | None = None, **kwargs):
    con = duckdb.connect()
    con.register("frame", base_frame() if frame is None else frame)
    con.execute("CREATE TABLE t AS SELECT uid, a, b, v FROM frame")
    return con, dpsql.connect(con, policy=POLICY.format(neighbours=neighbours), ledger=":memory:", **kwargs)


def contributions(con, db, planned) -> list[np.ndarray]:
    """Each possible unit's contribution to the exact histogram, through the real bounded statement:
    hist(D + unit) - hist(D), for every unit of 1 to 3 rows (one more than MAX ROWS PER UNIT)."""
    from dpsql.calls.workload_run import exact_histogram

    def histogram() -> np.ndarray:
        db.refresh()
        rows = db._answerer.read_keys(db._executor._fetch(planned.statement), planned.histogram.query.keys)
        return exact_histogram(planned, rows)

    before = histogram()
    found = [np.zeros_like(before)]  # a unit none of whose rows is counted (the sensitivity rule's convention)
    for size in (1, 2, 3):
        for rows in itertools.combinations_with_replacement(ROW_TYPES, size):
            con.execute("DELETE FROM t WHERE uid = 999")
            con.executemany("INSERT INTO t VALUES (999, ?, ?, 1)", [list(r) for r in rows])
            found.append(histogram() - before)
    con.execute("DELETE FROM t WHERE uid = 999")
    return found


@pytest.fixture(scope="module", params=["unbounded", "bounded"])
def enumerated(request):
    """(neighbour relation, planned workload, exact histogram of D, every unit's contribution)."""
    from dpsql.calls.workload_run import exact_histogram

    con, db = connect(request.param)
    with db:
        planned = plan_workload(db.mechanism_context(), QUERIES, 1, None, 3)
        units = contributions(con, db, planned)
        rows = db._answerer.read_keys(db._executor._fetch(planned.statement), planned.histogram.query.keys)
    return request.param, planned, exact_histogram(planned, rows), units


def test_query_sensitivities_are_the_largest_change_one_unit_makes(enumerated):
    neighbours, planned, _, units = enumerated
    changes = np.array([planned.workload.answers(c) for c in units])   # (units, scalar queries)
    if neighbours == "unbounded":
        largest = np.abs(changes).max(axis=0)
    else:
        largest = (changes.max(axis=0) - changes.min(axis=0))           # replace one unit by another
    assert [Fraction(int(v)) for v in largest] == list(planned.sensitivities)
    assert planned.workload.size == 1 + 1 + 1 + 2 + 1 + 4
    assert max(int(np.abs(c).sum()) for c in units) == planned.mwem.reach == 2


def test_check_sensitivity_is_check_grid_by_brute_force(enumerated):
    """The check S = max_j ceil(G·|a_j - x_j|/Δ_j) moves by at most G = CHECK_GRID between any two
    neighbours (every unit of the enumeration, both relations), for public answers a anywhere;
    G is reached, so a smaller sensitivity (the mutated bound G - 1) is exceeded."""
    neighbours, planned, exact, units = enumerated
    sensitivities = planned.sensitivities
    live = [j for j, d in enumerate(sensitivities) if d > 0]
    truths = [planned.workload.answers(exact + c) for c in units]
    if neighbours == "unbounded":
        pairs = [(truths[0], t) for t in truths[1:]]
    else:
        pairs = list(itertools.combinations(truths, 2))
    rng = np.random.default_rng(12)
    publics = [truths[0].astype(float)] + [truths[0] + rng.normal(0, 3, len(truths[0])) for _ in range(5)]
    largest = 0
    for values in publics:
        for here, there in pairs:
            moved = abs(mwem.check_statistic(list(values), here, sensitivities, live)
                        - mwem.check_statistic(list(values), there, sensitivities, live))
            largest = max(largest, moved)
    assert largest == mwem.CHECK_GRID


def test_total_and_outside_cell_follow_the_domain():
    con, db = connect()
    with db:
        planned = plan_workload(db.mechanism_context(), QUERIES, 1, None, 3)
        assert planned.workload.cells == 2 * 2 + 1
        rows = db._answerer.read_keys(db._executor._fetch(planned.statement), planned.histogram.query.keys)
        from dpsql.calls.workload_run import exact_histogram
        histogram = exact_histogram(planned, rows)
        frame = base_frame()
        assert int(histogram.sum()) == len(frame)
        inside = frame[frame.a.isin([1, 2]) & frame.b.isin(["x", "y"])]
        assert int(histogram[-1]) == len(frame) - len(inside)   # b = 'z' or a NULL: the outside cell
        answers = planned.workload.answers(histogram)
        assert answers[1] == int((frame.a == 1).sum() - ((frame.a == 1) & ~frame.b.isin(["x", "y"])).sum())


def test_selection_probabilities_on_a_tiny_example():
    """exp(ε₀·|a - x|/(2Δ)) normalised, checked against the sampler: 200,000 draws, Hoeffding at 1e-6."""
    plan = mwem.plan_mwem(Fraction(5, 2), Fraction(0), 1, 1, None)   # ε₀ = ε·(1 - 1/10 - 1/10)/2 = 1
    assert plan.select_epsilon == 1
    sensitivities = [Fraction(1), Fraction(2), Fraction(1), Fraction(0)]
    rounded = np.array([10, 14, 12, 0]) * mwem.SCORE_GRID
    truth = np.array([10, 12, 10, 0])                                      # scores 0, 1, 2 and a dead query
    weights = mwem.selection_log_weights(plan, sensitivities, rounded, truth)
    expected = np.exp([0, 0.5, 1.0]) / np.exp([0, 0.5, 1.0]).sum()
    draws = _exponential_mechanism_draws(weights, 200_000, SeededSource(3))
    frequencies = np.bincount(draws, minlength=4) / draws.size
    tolerance = math.sqrt(math.log(2 * 4 / 1e-6) / (2 * draws.size))   # 0.0063; doubling ε₀ moves p by 0.16
    assert np.all(np.abs(frequencies[:3] - expected) < tolerance) and frequencies[3] == 0


def test_selection_is_epsilon0_dp_over_every_neighbour(enumerated):
    """For a fixed synthetic histogram, every unit moves each selection probability by at most e^ε₀."""
    neighbours, planned, x, units = enumerated
    synthetic = np.full(x.size, x.sum() / x.size + 0.3)
    rounded = np.round(planned.workload.answers(synthetic) * mwem.SCORE_GRID).astype(np.int64)
    epsilon0 = float(planned.mwem.select_epsilon)

    def log_probabilities(histogram):
        weights = mwem.selection_log_weights(planned.mwem, planned.sensitivities, rounded,
                                             planned.workload.answers(histogram))
        live = np.isfinite(weights)
        return weights[live] - np.logaddexp.reduce(weights[live])

    with_unit = np.array([log_probabilities(x + c) for c in units])
    if neighbours == "bounded":   # D + c against D + d, for every pair of units
        worst = float(np.max(with_unit.max(axis=0) - with_unit.min(axis=0)))
    else:
        worst = float(np.max(np.abs(with_unit - log_probabilities(x))))
    assert 0 < worst <= epsilon0 * (1 + 1e-12)
    assert worst > epsilon0 / 2   # the scores do move by a whole sensitivity for some unit


class Recorder:
    """Wraps the samplers and the update MWEM calls, recording their arguments."""

    def __init__(self, monkeypatch):
        self.laplace, self.gaussian, self.selections, self.updates = [], [], [], []
        noise = mwem.noise
        laplace, gaussian, select = noise.discrete_laplace, noise.discrete_gaussian, noise.exponential_mechanism
        update = self.update = mwem.multiplicative_weights

        def record_laplace(scale, size, source=None):
            self.laplace.append(scale)
            return laplace(scale, size, source)

        def record_gaussian(sigma_sq, size, source=None):
            self.gaussian.append(sigma_sq)
            return gaussian(sigma_sq, size, source)

        def record_selection(weights, source=None):
            chosen = select(weights, source)
            self.selections.append((np.array(weights), chosen))
            return chosen

        def record_update(synthetic, measured, total, passes):
            self.updates.append((np.array(synthetic), [(np.array(w), v) for w, v in measured], total, passes))
            return update(synthetic, measured, total, passes)

        monkeypatch.setattr(noise, "discrete_laplace", record_laplace)
        monkeypatch.setattr(noise, "discrete_gaussian", record_gaussian)
        monkeypatch.setattr(noise, "exponential_mechanism", record_selection)
        monkeypatch.setattr(mwem, "multiplicative_weights", record_update)


def _effective_epsilon0(planned, weights, rounded_truth_gap) -> float:
    """ε₀ the log weights really use: max over queries of 2·w_s·Δ_s / |a_s - x_s|."""
    values = [2 * w * float(d) / g for w, d, g in zip(weights, planned.sensitivities, rounded_truth_gap)
              if g > 0 and math.isfinite(w)]
    return max(values)


def test_pure_composition_equals_the_charge(monkeypatch):
    recorder = Recorder(monkeypatch)
    con, db = connect(rng=SeededSource(5))
    with db:
        planned = plan_workload(db.mechanism_context(), QUERIES, Fraction(3, 2), None, 4)
        result = db.workload(QUERIES, epsilon=Fraction(3, 2), rounds=4)
        spent = db.budget.spent.epsilon
    reach = planned.mwem.reach
    # n̂, 4 measurements, then the check (sensitivity CHECK_GRID): every draw's ε, from its scale
    assert len(recorder.laplace) == 1 + 4 + 1 and len(recorder.selections) == 4 and not recorder.gaussian
    total = Fraction(reach) / recorder.laplace[0]
    check = mwem.CHECK_GRID / recorder.laplace[-1]
    assert check == Fraction(3, 2) * mwem.CHECK_SHARE
    total += check
    for (_, chosen), scale in zip(recorder.selections, recorder.laplace[1:-1]):
        total += planned.mwem.select_epsilon + planned.sensitivities[chosen] / scale
    assert total == result.cost.epsilon == spent == Fraction(3, 2)
    assert result.cost.rho == planned.mwem.rho == (Fraction(reach) / recorder.laplace[0]) ** 2 / 2 + check ** 2 / 2 \
        + 4 * (planned.mwem.select_epsilon ** 2 / 8 + planned.mwem.measure_epsilon ** 2 / 2)


def test_zcdp_composition_equals_the_charge(monkeypatch):
    from dpsql.budget.accounting import epsilon_of_rho, rho_budget

    recorder = Recorder(monkeypatch)
    con, db = connect(rng=SeededSource(6))
    with db:
        planned = plan_workload(db.mechanism_context(), QUERIES, 1, Fraction(1, 10**6), 5)
        result = db.workload(QUERIES, epsilon=1, delta=Fraction(1, 10**6), rounds=5)
    assert len(recorder.gaussian) == 1 + 5 + 1 and not recorder.laplace
    reach = planned.mwem.reach
    rho = Fraction(reach) ** 2 / (2 * recorder.gaussian[0])
    rho += Fraction(mwem.CHECK_GRID) ** 2 / (2 * recorder.gaussian[-1])   # the check, drawn last
    for (_, chosen), sigma_sq in zip(recorder.selections, recorder.gaussian[1:-1]):
        rho += planned.mwem.select_epsilon ** 2 / 8 + planned.sensitivities[chosen] ** 2 / (2 * sigma_sq)
    assert rho == result.cost.rho == planned.mwem.rho <= rho_budget(Fraction(1), Fraction(1, 10**6))
    assert epsilon_of_rho(rho, Fraction(1, 10**6)) <= 1 == result.cost.epsilon
    assert result.cost.delta == Fraction(1, 10**6)


def test_selection_weights_scale_with_epsilon0(monkeypatch):
    """The first round's weights, recomputed from A_0 and the exact answers, use exactly ε₀."""
    recorder = Recorder(monkeypatch)
    con, db = connect(rng=SeededSource(7))
    with db:
        planned = plan_workload(db.mechanism_context(), QUERIES, 2, None, 2)
        rows = db._answerer.read_keys(db._executor._fetch(planned.statement), planned.histogram.query.keys)
        db.workload(QUERIES, epsilon=2, rounds=2)
    from dpsql.calls.workload_run import exact_histogram
    truth = planned.workload.answers(exact_histogram(planned, rows))
    total = recorder.updates[0][2]  # A_0 is uniform with mass n̂, which every update is given
    synthetic = np.full(planned.workload.cells, total / planned.workload.cells)
    rounded = np.round(planned.workload.answers(synthetic) * mwem.SCORE_GRID).astype(np.int64)
    gaps = np.abs(rounded - truth * mwem.SCORE_GRID) / mwem.SCORE_GRID
    weights, _ = recorder.selections[0]
    assert _effective_epsilon0(planned, weights, gaps) == pytest.approx(float(planned.mwem.select_epsilon), rel=1e-12)


def test_multiplicative_weights_is_given_released_values_only(monkeypatch):
    recorder = Recorder(monkeypatch)
    con, db = connect(rng=SeededSource(8))
    with db:
        planned = plan_workload(db.mechanism_context(), QUERIES, 1, None, 4)
        result = db.workload(QUERIES, epsilon=1, rounds=4)
        text = db._ledger.find_answer(planned.key)
    from dpsql.calls.workload_run import _decode
    release = _decode(text)
    assert release is not None and len(recorder.updates) == 4
    previous = np.full(planned.workload.cells, release.total / planned.workload.cells)
    for t, (synthetic, measured, total, passes) in enumerate(list(recorder.updates)):
        assert total == release.total                                        # n̂, released
        assert [v for _, v in measured] == [r.measured for r in release.rounds[:t + 1]]   # released measurements
        for (vector, _), done in zip(measured, release.rounds):
            assert np.array_equal(vector, planned.workload.vector(done.selected))          # public queries
        assert np.allclose(synthetic, previous)                              # the last synthetic histogram
        previous = recorder.update(synthetic, measured, total, passes)
    assert len(result.fetchall()) == planned.workload.size


def test_measurement_scale_is_derived_by_hand(monkeypatch):
    """A one-query workload on a tiny table: Δ = 2 (two rows per unit, unbounded) by hand, so the
    measurement's discrete Laplace scale is 2/ε₁ with ε₁ = ε·(1 - TOTAL_SHARE - CHECK_SHARE)/2, n̂'s is
    2/ε_n and the check's CHECK_GRID/ε_c."""
    recorder = Recorder(monkeypatch)
    frame = pd.DataFrame({"uid": [1, 2, 3], "a": [1, 2, 2], "b": ["x", "x", "y"], "v": [1, 1, 1]})
    con, db = connect(frame=frame, rng=SeededSource(9))
    with db:
        db.workload(["SELECT COUNT(*) FROM t WHERE a = 2"], epsilon=1, rounds=1)
    epsilon1 = (1 - mwem.TOTAL_SHARE - mwem.CHECK_SHARE) / 2
    assert recorder.laplace == [2 / mwem.TOTAL_SHARE, 2 / epsilon1, mwem.CHECK_GRID / mwem.CHECK_SHARE]


def test_ledger_records_the_workload_and_repeats_free():
    con, db = connect(rng=SeededSource(10))
    with db:
        first = db.workload(QUERIES, epsilon=1, rounds=3)
        spent = db.budget.spent.epsilon
        again = db.workload(QUERIES, epsilon=1, rounds=3)
        assert again.repeat and again.cost.epsilon == 0 and db.budget.spent.epsilon == spent == 1
        assert again.fetchall() == first.fetchall()
        assert again.accuracy() == first.accuracy()
        entries = db.ledger()
        assert len(entries) == 1 and "WHERE 1 = a" in entries["sql"].iloc[0]
        assert entries["answer"].iloc[0] is not None
        db.workload(QUERIES, epsilon=1, rounds=4)                  # other options: a new release, charged
        assert db.budget.spent.epsilon == 2


def test_charged_per_analyst():
    policy = POLICY.format(neighbours="unbounded") + "BUDGET PER ANALYST EPSILON 1;\n"
    con = duckdb.connect()
    con.register("frame", base_frame())
    con.execute("CREATE TABLE t AS SELECT * FROM frame")
    with dpsql.connect(con, policy=policy, ledger=":memory:", analyst="alice") as db:
        db.workload(QUERIES[:2], epsilon=Fraction(3, 4))
        assert db.budget.analyst.spent.epsilon == Fraction(3, 4)
        with pytest.raises(dpsql.BudgetExceeded):
            db.workload(QUERIES[2:], epsilon=Fraction(1, 2))
        assert db.budget.spent.epsilon == Fraction(3, 4)


def test_answers_and_intervals():
    con, db = connect(rng=SeededSource(11))
    with db:
        result = db.workload(QUERIES, epsilon=1, rounds=3)
    rows = result.fetchall()
    assert [r[0] for r in rows] == [1, 2, 3, 4, 4, 5, 6, 6, 6, 6]
    assert [r[1] for r in rows[3:5]] == ["a=1", "a=2"]
    assert rows[6][1] == "a=1, b='x'"
    cells = result.cells()["answer"]
    assert sum(r[3] for r in rows) >= 1
    for (query, cell, value, measured), (low, high, half) in zip(rows, cells):
        assert low <= value <= high
        assert half > 0 or (query, cell, value) in {(6, "a=1, b='x'", 0), (6, "a=1, b='y'", 0)}  # a = 1 is excluded
    assert result.accuracy(0.01)["answer"] > result.accuracy(0.2)["answer"]


@pytest.mark.parametrize("query, message", [
    ("SELECT SUM(v) FROM t", "counts rows only"),
    ("SELECT COUNT(v) FROM t", "counts rows only"),
    ("SELECT COUNT(DISTINCT a) FROM t", "counts rows only"),
    ("SELECT COUNT(*) FROM t WHERE v = 1", "column v has no KEYS domain"),
    ("SELECT COUNT(*) FROM t WHERE uid = 1", "column uid has no KEYS domain"),
    ("SELECT COUNT(*) FROM t WHERE length(b) = 1", "is not allowed in a workload predicate"),
    ("SELECT COUNT(*) FROM t WHERE a IN (SELECT 1)", "is not allowed in a workload predicate"),
    ("SELECT COUNT(*) / 2 FROM t", "counts rows only"),
    ("SELECT COUNT(*) * COUNT(*) FROM t", "integer literals only"),
    ("SELECT a, COUNT(*) FROM t", "selects its GROUP BY columns"),
    ("SELECT COUNT(*), COUNT(*) FROM t", "one count"),
    ("SELECT COUNT(*) FROM t ORDER BY 1", "ORDER"),
    ("SELECT COUNT(*) FROM t JOIN t AS u ON t.a = u.a", "JOINS"),
    ("SELECT COUNT(*) FROM nope", "not a private table"),
    ("SELECT WITH DIFFERENTIAL_PRIVACY OPTIONS (epsilon = 1) COUNT(*) FROM t", "OPTIONS"),
    ("SELECT COUNT(*) FROM t WHERE a = 'x'", "cannot be evaluated on the KEYS domains"),
    ("SELECT COUNT(*) FROM t TABLESAMPLE POISSON (10 PERCENT)", "no TABLESAMPLE"),  # was dropped, charged in full
])
def test_refusals_charge_nothing(query, message):
    con, db = connect()
    with db:
        with pytest.raises(dpsql.DPError) as refused:
            db.workload(["SELECT COUNT(*) FROM t", query], epsilon=1)
        assert message in str(refused.value) and "query 2 of the workload" in str(refused.value)
        assert db.budget.spent.epsilon == 0 and len(db.ledger()) == 0


def test_refusal_positions_point_into_the_query():
    con, db = connect()
    with db, pytest.raises(dpsql.UnsupportedQuery) as refused:
        db.workload(["SELECT COUNT(*) FROM t WHERE v = 1"], epsilon=1)
    assert "(line 1, column 30)" in str(refused.value)


def test_too_large_a_domain_is_refused_saying_how_large(monkeypatch):
    monkeypatch.setattr(workload_module, "MAX_CELLS", 4)
    con, db = connect()
    with db:
        with pytest.raises(dpsql.UnsupportedQuery) as refused:
            db.workload(["SELECT a, b, COUNT(*) FROM t GROUP BY a, b"], epsilon=1)
        assert db.budget.spent.epsilon == 0
    text = str(refused.value)
    assert "5 cells (a (2) × b (2), plus one" in text and "MB" in text and "limit is 4 cells" in text


def test_other_refusals():
    con, db = connect()
    with db:
        for bad, message in [("SELECT COUNT(*) FROM t", "non-empty list"), ([], "non-empty list"),
                             ([1], "not an SQL string")]:
            with pytest.raises(dpsql.DPError, match=message):
                db.workload(bad, epsilon=1)
        with pytest.raises(dpsql.InvalidParameter, match="rounds"):
            db.workload(["SELECT COUNT(*) FROM t"], epsilon=1, rounds=0)
        with pytest.raises(dpsql.InvalidParameter, match="epsilon"):
            db.workload(["SELECT COUNT(*) FROM t"], epsilon=-1)
        with pytest.raises(dpsql.InvalidParameter, match="too small for 32 rounds"):
            db.workload(["SELECT 65536 * COUNT(*) FROM t"], epsilon=Fraction(1, 10**5), rounds=32)
        with pytest.raises(dpsql.UnsupportedQuery, match="0 whatever the data"):
            db.workload(["SELECT COUNT(*) FROM t WHERE a = 7"], epsilon=1)
        assert db.budget.spent.epsilon == 0


def test_default_rounds_rule():
    assert mwem.default_rounds(1, Fraction(1)) == 1
    assert mwem.default_rounds(100, Fraction(1)) == 8
    assert mwem.default_rounds(100, Fraction(27)) == 24
    assert mwem.default_rounds(10**6, Fraction(1000)) == 32
    assert mwem.default_rounds(100, Fraction(1, 100)) == 4


# -- the SQL form, on every surface --------------------------------------------------------------

SHOP_WORKLOAD = ("SELECT * FROM workload('SELECT plan, COUNT(*) FROM users GROUP BY plan', "
                 "'SELECT COUNT(*) FROM users WHERE country = ''US''', epsilon = 2, rounds = 3)")


def shop_policy():
    from dpsql.demo import SHOP_POLICY
    return SHOP_POLICY.replace("BUDGET EPSILON 3.0", "BUDGET EPSILON 50")


def test_the_sql_form_is_the_method(built):
    with dpsql.connect(str(built), policy=shop_policy(), ledger=":memory:", rng=SeededSource(12)) as db:
        answer = db.sql(SHOP_WORKLOAD)
        assert answer.columns == ["query", "cell", "answer", "measured"] and answer.cost.epsilon == 2
        assert [r[:2] for r in answer.fetchall()] == [(1, "plan='free'"), (1, "plan='plus'"), (1, "plan='pro'"),
                                                      (2, None)]
        method = db.workload(["SELECT plan, COUNT(*) FROM users GROUP BY plan",
                              "SELECT COUNT(*) FROM users WHERE country = 'US'"], epsilon=2, rounds=3)
        assert method.repeat and method.fetchall() == answer.fetchall()   # the same workload: free
        text = db.explain(SHOP_WORKLOAD)
        assert "MWEM workload: 2 queries, 4 answers, over 19 cells (plan (3) × country (6)" in text
        assert "asked before" in text
        with pytest.raises(dpsql.UnsupportedQuery, match="has no option"):
            db.sql(SHOP_WORKLOAD.replace("rounds", "round"))
        assert db.budget.spent.epsilon == 2


def test_the_shell_and_the_cli_answer_the_sql_form(built, tmp_path, capsys):
    from cli_run import run as run_cli

    from dpsql.shell.session import handle_input
    from dpsql.shell.state import new_state

    with dpsql.connect(str(built), policy=shop_policy(), ledger=":memory:", rng=SeededSource(13)) as db:
        shown = handle_input(new_state(db, width=100, color=False), SHOP_WORKLOAD + ";")
    assert "│ measured │" in shown and "plan='pro'" in shown and "cost ε 2, δ 0" in shown
    database = tmp_path / "shop.duckdb"
    database.write_bytes(built.read_bytes())
    (tmp_path / "shop.policy").write_text(shop_policy())
    code, out, err = run_cli(capsys, "query", str(database), SHOP_WORKLOAD, "--policy", str(tmp_path / "shop.policy"),
                             "--format", "json")
    assert code == 0, err
    assert [(r["query"], r["cell"]) for r in json.loads(out)] == [(1, "plan='free'"), (1, "plan='plus'"),
                                                                   (1, "plan='pro'"), (2, None)]


@pytest.mark.skipif(shutil.which("psql") is None, reason="psql is not installed")
def test_psql_calls_it_through_the_server_charged_to_the_analyst(built, tmp_path):
    from served import psql_lines, serve_shop

    server = serve_shop(built, tmp_path, shop_policy(), "alice", "alice-secret")
    try:
        lines, shown = psql_lines(server, "alice", "alice-secret", SHOP_WORKLOAD, "SHOW ledger")
    finally:
        server.stop()
        server.thread.join(10)
    assert any(line.startswith("1|plan='pro'|") for line in lines), shown
    assert any(line.startswith("2||") for line in lines)
    assert any("|alice|WORKLOAD MWEM" in line for line in lines), shown


def test_a_workload_reading_no_column_has_one_cell():
    con, db = connect(rng=SeededSource(14))
    with db:
        planned = plan_workload(db.mechanism_context(), ["SELECT COUNT(*) FROM t", "SELECT 3 * COUNT(*) - COUNT(*) FROM t"], 1, None, 2)
        assert planned.workload.cells == 1 and list(planned.sensitivities) == [2, 4]
        answer = db.workload(["SELECT COUNT(*) FROM t", "SELECT 3 * COUNT(*) - COUNT(*) FROM t"], epsilon=1)
    assert len(answer.fetchall()) == 2


# -- the attack review's integer overflow (helper-26) --------------------------------------------


def test_a_coefficient_sum_beyond_the_limit_is_refused_before_the_charge():
    con, db = connect()
    with db:
        k = workload_module.MAX_COEFFICIENTS
        with pytest.raises(dpsql.UnsupportedQuery, match=f"add up \\(in absolute value\\) to more than {k}"):
            db.workload([f"SELECT {k} * COUNT(*) FILTER (WHERE a = 1) - COUNT(*) FILTER (WHERE a = 2) FROM t"],
                        epsilon=1)
        assert db.budget.spent.epsilon == 0
        db.workload([f"SELECT {k // 2} * COUNT(*) FILTER (WHERE a = 1) - {k // 2} * COUNT(*) FROM t"], epsilon=1)


def test_exact_answers_do_not_wrap_around_whatever_the_counts():
    """Counts near 2^62 times the largest coefficients: the answers equal Python's integers (the
    int64 products wrapped around at 2^63 before, and flipped the selection score's sign)."""
    k = workload_module.MAX_COEFFICIENTS
    bases = np.array([[k, -k, 0, 1], [1, 1, 1, 1]], dtype=np.int64)
    work = mwem.Workload(bases, np.array([[0, 0, 0, 0], [0, 0, 0, 0]]), (1,))
    histogram = np.array([2 ** 62 - 1, 3, 2 ** 61, 2 ** 62 + 5], dtype=np.int64)
    assert work.answers(histogram).tolist() == [k * (2 ** 62 - 1) - 3 * k + 0 + 2 ** 62 + 5]


def test_neighbouring_selection_scores_differ_by_one_sensitivity_even_past_int64():
    """|a - x|/Δ must be 1-Lipschitz in x for the exponential mechanism's guarantee: checked at
    distances of 2^43 and more (where int64 arithmetic wrapped) and beyond the score's cap."""
    plan = mwem.plan_mwem(Fraction(1), Fraction(0), 1, 1, None)
    step = plan.select_epsilon / 2  # the log weight's change for one sensitivity
    for distance in (2 ** 43, 2 ** 63 // mwem.SCORE_GRID, 2 ** 70, mwem.SCORE_CAP - 1, mwem.SCORE_CAP + 3):
        here, there = (mwem.selection_log_weights(plan, [Fraction(1)], [0], [x]) for x in (distance, distance + 1))
        assert 0 <= there[0] - here[0] <= float(step) * (1 + 1e-9)
        assert here[0] > 0


def test_rounds_and_their_memory_are_bounded_before_the_charge():
    con, db = connect()
    with db:
        with pytest.raises(dpsql.InvalidParameter, match="rounds must be a whole number from 1 to 1000"):
            db.workload(["SELECT COUNT(*) FROM t WHERE a = 1"], epsilon=1, rounds=10 ** 11)
        assert db.budget.spent.epsilon == 0


def test_a_keys_column_named_cell_is_the_policys_own_column():
    """The public table of cells indexed its rows by a column named cell, which shadowed a policy
    column of that name (helper-26): cell = 10 was refused as 'always 0'."""
    frame = pd.DataFrame({"uid": range(30), "cell": [10, 20, 30] * 10})
    policy = "BUDGET EPSILON 5; PRIVATE TABLE t (PRIVACY UNIT uid, MAX ROWS PER UNIT 1, cell KEYS (10, 20, 30));"
    with dpsql.connect({"t": frame}, policy=policy, rng=SeededSource(1)) as db:
        planned = plan_workload(db.mechanism_context(), ["SELECT COUNT(*) FROM t WHERE cell = 10"], Fraction(1), None, 1)
        assert planned.workload.vector(0).tolist() == [1, 0, 0, 0]
