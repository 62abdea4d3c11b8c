"""Online PMW (``db.pmw``, ``dpsql.calls.pmw``): charged once up front for the sparse vector, the
measurements and n̂; the sparse vector is given each query's hand-derived sensitivity; queries below
the threshold come from the synthetic data; after max_updates measurements every query is refused."""

from __future__ import annotations

from fractions import Fraction

import duckdb
import numpy as np
import pandas as pd
import pytest

import dpsql
import dpsql.calls.pmw as pmw_module
from dpsql.mechanisms.noise import SeededSource
from dpsql.mechanisms.sparse_vector import AboveThreshold

POLICY = """BUDGET EPSILON 100;
PRIVATE TABLE t (PRIVACY UNIT uid, MAX ROWS PER UNIT 2, a KEYS (1, 2), b KEYS ('x', 'y'), v BOUNDS 0 TO 9);
"""


def connect(**kwargs):
    rows = [(uid, 1 + uid % 2, "xy"[uid % 3 % 2], 1) for uid in range(200)] + [(7, 2, "x", 1)]
    con = duckdb.connect()
    con.register("frame", pd.DataFrame(rows, columns=["uid", "a", "b", "v"]))
    con.execute("CREATE TABLE t AS SELECT * FROM frame")
    return dpsql.connect(con, policy=POLICY, ledger=":memory:", **kwargs)


class Recorder:
    """Records the discrete Laplace scales and the sparse vector's tests of the session."""

    def __init__(self, monkeypatch):
        self.scales, self.tests = [], []
        laplace, test = pmw_module.noise.discrete_laplace, AboveThreshold.test

        def record_laplace(scale, size, source=None):
            self.scales.append(scale)
            return laplace(scale, size, source)

        def record_test(svt, value, threshold=None, sensitivity=None):
            self.tests.append((svt.epsilon, value, threshold, sensitivity))
            return test(svt, value, threshold, sensitivity)

        monkeypatch.setattr(pmw_module.noise, "discrete_laplace", record_laplace)
        monkeypatch.setattr(AboveThreshold, "test", record_test)


def test_charged_once_and_the_parts_add_up_to_the_charge(monkeypatch):
    recorder = Recorder(monkeypatch)
    with connect(rng=SeededSource(1)) as db:
        session = db.pmw("t", ["a", "b"], epsilon=Fraction(3, 2), max_updates=3, threshold=Fraction(1, 100))
        assert db.budget.spent.epsilon == Fraction(3, 2)
        answers = [session.answer(f"SELECT COUNT(*) FROM t WHERE a = {a}") for a in (1, 2)]
        answers.append(session.answer("SELECT COUNT(*) FILTER (WHERE b = 'x') - COUNT(*) FROM t"))
        assert db.budget.spent.epsilon == Fraction(3, 2) and all(a.cost.epsilon == 0 for a in answers)
        with pytest.raises(dpsql.BudgetExceeded, match="made its 3 updates"):
            session.answer("SELECT COUNT(*) FROM t WHERE b = 'y'")
        assert db.budget.spent.epsilon == Fraction(3, 2) and len(db.ledger()) == 1
    # a threshold of 0.01 rows: the uniform start is off by far more, so all three are measured
    assert [a.fetchall()[0][1] for a in answers] == [True, True, True] and session.updates_left == 0
    plan = session.plan
    reach = 2                                                     # two rows per unit, unbounded: by hand
    total = reach / recorder.scales[0]                            # n̂
    sparse = recorder.tests[0][0]                                 # the sparse vector's epsilon
    measured = sum(delta / scale for (_, _, _, delta), scale in zip(recorder.tests, recorder.scales[-3:]))
    assert [t[3] for t in recorder.tests] == [2, 2, 2]            # Δ = 2 for each (the combination: max|w| = 1)
    assert total + sparse + measured == plan.epsilon == Fraction(3, 2)   # three measurements of ε_m/3 each
    assert plan.cost.rho == (total ** 2 + sparse ** 2 + 3 * (plan.measure_epsilon / 3) ** 2) / 2


def test_below_the_threshold_the_synthetic_data_answers(monkeypatch):
    recorder = Recorder(monkeypatch)
    with connect(rng=SeededSource(2)) as db:
        session = db.pmw("t", ["a", "b"], epsilon=1, max_updates=2, threshold=10**6)
        answer = session.answer("SELECT COUNT(*) FROM t WHERE a = 1")
    value, measured = answer.fetchall()[0]
    assert not measured and len(recorder.scales) == 1             # n̂ only: nothing measured
    n_hat = session._state["total"]
    assert value == pytest.approx(n_hat * 2 / 5)                  # uniform over 2 x 2 cells + outside: a = 1 is 2 of 5
    truth, synthetic = recorder.tests[0][1], abs(Fraction(100) - Fraction(value))
    assert truth == synthetic                                     # the test is given |x - a|, x the exact count
    assert answer.accuracy()["answer"] > 10**6                    # threshold plus the noises' half-widths


def test_the_update_is_given_released_measurements_only(monkeypatch):
    calls = []
    update = pmw_module.multiplicative_weights

    def record(synthetic, measured, total, passes):
        calls.append(([v for _, v in measured], total))
        return update(synthetic, measured, total, passes)

    monkeypatch.setattr(pmw_module, "multiplicative_weights", record)
    with connect(rng=SeededSource(3)) as db:
        session = db.pmw("t", ["a"], epsilon=2, max_updates=2, threshold=Fraction(1, 100))
        first = session.answer("SELECT COUNT(*) FROM t WHERE a = 1").fetchall()[0][0]
        second = session.answer("SELECT COUNT(*) FROM t WHERE a = 2").fetchall()[0][0]
    assert calls == [([first], session._state["total"]), ([first, second], session._state["total"])]


@pytest.mark.parametrize("arguments, message", [
    ({"columns": ["v"]}, "column v has no KEYS domain"),
    ({"delta": 1e-6}, "pure epsilon-DP"),
    ({"max_updates": 0}, "max_updates"),
    ({"threshold": 0}, "threshold"),
    ({"table": "nope"}, "not a private table"),
    ({"epsilon": Fraction(1, 10**9), "max_updates": 1000}, "too small for a session"),
])
def test_refused_sessions_charge_nothing(arguments, message):
    with connect() as db:
        options = {"table": "t", "columns": ["a"], "epsilon": 1, "max_updates": 2, "threshold": 5, **arguments}
        with pytest.raises(dpsql.DPError, match=message):
            db.pmw(options.pop("table"), options.pop("columns"), **options)
        assert db.budget.spent.epsilon == 0


@pytest.mark.parametrize("query, message", [
    ("SELECT COUNT(*) FROM t WHERE b = 'x'", "the query reads b"),
    ("SELECT a, COUNT(*) FROM t GROUP BY a", "one count at a time"),
    ("SELECT SUM(v) FROM t", "counts rows only"),
    ("SELECT 100000000000 * COUNT(*) FROM t WHERE a = 1", "coefficients add up"),
])
def test_refused_queries_charge_nothing_more(query, message):
    with connect(rng=SeededSource(4)) as db:
        session = db.pmw("t", ["a"], epsilon=1, max_updates=2, threshold=5)
        with pytest.raises((dpsql.UnsupportedQuery, dpsql.InvalidParameter), match=message):
            session.answer(query)
        assert db.budget.spent.epsilon == 1 and session.updates_left == 2


def test_measured_answers_carry_their_noise_interval():
    with connect(rng=SeededSource(5)) as db:
        session = db.pmw("t", ["a"], epsilon=4, max_updates=1, threshold=Fraction(1, 100))
        answer = session.answer("SELECT COUNT(*) FROM t WHERE a = 1")
    value, measured = answer.fetchall()[0]
    assert measured
    scale = session.plan.measure_scale(Fraction(2))
    from dpsql.mechanisms.noise import discrete_laplace_halfwidth
    assert answer.accuracy()["answer"] == discrete_laplace_halfwidth(scale, 0.05)
    assert np.isfinite(value)


PMW_CALL = ("SELECT * FROM pmw({queries}, table = 't', columns = 'a, b', epsilon = 20, max_updates = 2, "
            "threshold = 0.01)")


def _call(*queries: str) -> str:
    return PMW_CALL.format(queries=", ".join(f"$${q}$$" for q in queries))


def test_the_sql_form_opens_a_session_once_and_continues_it_for_free():
    """The shell's, CLI's and psql's PMW: the first call is charged for the whole session, a
    later call with the same options continues it at no cost, and after max_updates measurements
    the rest are NULL with a note. At epsilon 20 the sparse vector's noises are below one
    sensitivity (2 rows) in scale; the uniform start is off by 10 and more sensitivities on a = 1
    and on b = 'x' (2/3 of the rows), so both are measured but with probability below e^-15."""
    with connect(rng=SeededSource(2)) as db:
        explained = db.explain(_call("SELECT COUNT(*) FROM t WHERE a = 1"))
        assert "no session is open: this call opens one, charged epsilon 20 once" in explained
        first = db.sql(_call("SELECT COUNT(*) FROM t WHERE a = 1"))
        assert first.cost.epsilon == 20 and db.budget.spent.epsilon == 20
        assert first.columns == ["n", "query", "answer", "measured"] and first.fetchall()[0][3] is True
        assert "a session is open" in db.explain(_call("SELECT COUNT(*) FROM t WHERE b = 'x'"))
        more = db.sql(_call("SELECT COUNT(*) FROM t WHERE b = 'x'", "SELECT COUNT(*) FROM t WHERE b = 'y'"))
        assert more.cost.epsilon == 0 and db.budget.spent.epsilon == 20
        rows = more.fetchall()
        assert rows[0][3] is True and rows[1][2] is None and rows[1][3] is None
        assert any("has made all its updates (2): from query 2 on" in note for note in more.notes)
        other = db.sql(_call("SELECT COUNT(*) FROM t WHERE a = 1").replace("epsilon = 20", "epsilon = 21"))
        assert other.cost.epsilon == 21 and db.budget.spent.epsilon == 41  # other options: a new session


def test_the_sql_form_needs_the_sessions_table_and_columns():
    with connect() as db:
        with pytest.raises(dpsql.InvalidParameter, match="needs the session's table and its KEYS columns"):
            db.sql("SELECT * FROM pmw('SELECT COUNT(*) FROM t', epsilon = 1, threshold = 5)")
        assert db.budget.spent.epsilon == 0


def test_psql_continues_an_analysts_session_across_connections(built, tmp_path):
    """Through dpsql serve: the session lives with the analyst's connection in the server, so a
    second client connection continues it, charged nothing more."""
    psycopg = pytest.importorskip("psycopg")
    from served import serve_shop

    from dpsql.demo import SHOP_POLICY
    server = serve_shop(built, tmp_path, SHOP_POLICY.replace("BUDGET EPSILON 3.0", "BUDGET EPSILON 50"), "alice",
                        "alice-secret")
    sql = ("SELECT * FROM pmw('SELECT COUNT(*) FROM users WHERE plan = ''free''', table = 'users', "
           "columns = 'plan', epsilon = 2, max_updates = 3, threshold = 5)")
    try:
        spent = []
        for _ in range(2):
            with psycopg.connect(host="127.0.0.1", port=server.port, dbname="shop", user="alice",
                                 password="alice-secret", autocommit=True) as connection:
                assert len(connection.execute(sql).fetchall()) == 1
                spent.append(connection.execute("SHOW budget").fetchall())
    finally:
        server.stop()
        server.thread.join(10)
    assert spent[0] == spent[1]  # the second connection's queries cost nothing
    assert spent[0][0][2] == pytest.approx(2.0)  # (scope, total, spent, remaining, ...): the session's 2


def test_the_sql_forms_queries_are_checked_before_a_session_is_charged():
    with connect() as db:
        with pytest.raises(dpsql.UnsupportedQuery, match="query 2 of the call: a workload counts rows only"):
            db.sql(_call("SELECT COUNT(*) FROM t WHERE a = 1", "SELECT SUM(v) FROM t"))
        assert db.budget.spent.epsilon == 0
        with pytest.raises(dpsql.InvalidParameter, match="max_updates must be a whole number from 1 to 10000"):
            db.pmw("t", ["a"], epsilon=1, max_updates=50_000, threshold=5)
        assert db.budget.spent.epsilon == 0


def test_a_session_is_pure_epsilon_dp_under_a_policy_with_a_query_delta():
    """PMW is pure epsilon-DP: a policy's QUERY DELTA was taken as its delta and the session refused,
    leaving the SQL form (which has no delta option) unusable under such a policy (a served
    attacker's review). An explicit delta > 0 is still refused."""
    rows = [(uid, 1 + uid % 2, "xy"[uid % 3 % 2], 1) for uid in range(200)]
    con = duckdb.connect()
    con.register("frame", pd.DataFrame(rows, columns=["uid", "a", "b", "v"]))
    con.execute("CREATE TABLE t AS SELECT * FROM frame")
    policy = POLICY.replace("BUDGET EPSILON 100;", "BUDGET EPSILON 100 DELTA 1e-5; QUERY EPSILON 1 DELTA 1e-7;")
    with dpsql.connect(con, policy=policy, ledger=":memory:", rng=SeededSource(2)) as db:
        answered = db.sql(_call("SELECT COUNT(*) FROM t WHERE a = 1"))
        assert answered.cost.epsilon == 20 and answered.cost.delta == 0
        with pytest.raises(dpsql.InvalidParameter, match="pure epsilon-DP"):
            db.pmw("t", ["a"], epsilon=1, delta=1e-7)
