"""db.above_threshold and SELECT * FROM above_threshold(...): the sparse vector over a stream of
COUNT/SUM queries, charged once, on every surface (Python, SQL form, shell, CLI, server)."""

from __future__ import annotations

import json
import shutil
from fractions import Fraction

import pandas as pd
import pytest
from cli_run import run
from served import psql_lines, serve_shop

import dpsql
import dpsql.calls.above_threshold
from dpsql.calls.above_threshold import plan_stream
from dpsql.demo import SHOP_POLICY
from dpsql.errors import InvalidParameter, QueryFailed, UnsupportedQuery
from dpsql.mechanisms.noise import SeededSource
from dpsql.shell.session import handle_input
from dpsql.shell.state import new_state

POLICY = SHOP_POLICY.replace("BUDGET EPSILON 3.0", "BUDGET EPSILON 500")
AGES = [f"SELECT COUNT(*) FROM visits WHERE age > {age}" for age in (85, 80, 20, 18, 70)]


@pytest.fixture
def db(built):
    with dpsql.connect(str(built), policy=POLICY, ledger=":memory:", rng=SeededSource(11)) as connection:
        yield connection


def exact_count(db, sql: str) -> int:
    """The query's exact answer on the bounded copy (what the stream tests), for the test only."""
    stream = plan_stream(db.mechanism_context(), [sql], 0, 1)
    return int(db._engine.fetch(stream.queries[0].statement.sql, None, bounded=stream.queries[0].statement.bounded)
               [0][0] or 0)


def test_the_stream_is_charged_once_and_stops_after_max_above(db):
    """At epsilon 50 (c = 2) the noises' scales are 1/19.3 and 4/30.7 sensitivities (the sparse
    vector's docstring): a query 25 sensitivities from the threshold lands on the wrong side with
    probability below e^-90."""
    counts = [exact_count(db, q) for q in AGES]
    threshold = (counts[1] + counts[2]) // 2
    assert counts[1] + 250 < threshold < counts[2] - 250  # 25 sensitivities (10 rows per unit) each way
    assert max(counts[0], counts[1], counts[4]) < threshold - 250 and counts[3] > threshold + 250
    answer = db.above_threshold(AGES, threshold=threshold, epsilon=50, max_above=2)
    assert answer.columns == ["n", "query", "above"]
    assert [row[2] for row in answer.fetchall()] == [False, False, True, True, None]
    assert [row[1] for row in answer.fetchall()] == AGES
    assert db.budget.spent.epsilon == 50 and answer.cost.epsilon == 50
    assert any("the last query was not run" in note for note in answer.notes)
    ledger = db.ledger()  # one entry holds the whole stream and what it released
    assert len(ledger) == 1
    assert ledger["sql"].iloc[0] == f"ABOVE THRESHOLD {threshold} (at most 2 above) OF " + "; ".join(
        f"{i}. SELECT COUNT(*) FROM visits WHERE {age} < age" for i, age in enumerate((85, 80, 20, 18, 70), 1))


def test_an_identical_stream_is_a_free_repeat_of_the_same_release(db):
    first = db.above_threshold(AGES[:3], threshold=500, epsilon=1, values=True)
    again = db.above_threshold(AGES[:3], threshold=500, epsilon=1, values=True)
    assert again.cost.repeat and again.fetchall() == first.fetchall()
    assert db.budget.spent.epsilon == 2  # epsilon 1 for the stream, 1 for the values


def test_values_cost_their_own_epsilon_and_carry_their_interval(db):
    answer = db.above_threshold(AGES[2:4], threshold=0, epsilon=10, values=True, value_epsilon=Fraction(1, 2))
    assert answer.cost.epsilon == Fraction(21, 2)
    rows = answer.fetchall()
    assert rows[0][2] is True and isinstance(rows[0][3], int)
    frame = answer.accuracy_df()
    # discrete Laplace of scale 10 rows x 1 / (1/2) = 20: its 95% half-width, 60
    assert frame["value"].iloc[0] == 60


def test_zcdp_accounting_charges_rho_of_a_pure_mechanism(built):
    policy = POLICY.replace("NEIGHBOURS UNBOUNDED;", "NEIGHBOURS UNBOUNDED;\nACCOUNTING ZCDP;")
    with dpsql.connect(str(built), policy=policy, ledger=":memory:") as db:
        answer = db.above_threshold(AGES, threshold=100, epsilon=1, max_above=2, values=True, value_epsilon=2)
        assert answer.cost.rho == Fraction(1, 2) + 2 * (Fraction(2, 2) ** 2 / 2)


def test_each_querys_sensitivity_is_the_most_one_unit_changes_it_by_brute_force():
    """Unit 1 has 5 rows (MAX ROWS PER UNIT 2) of x = 100 (BOUNDS 0 TO 10): removing any one
    unit moves COUNT(*) by at most 2 and SUM(x) by at most 20 on the bounded rows."""
    frame = pd.DataFrame({"uid": [1, 1, 1, 1, 1, 2, 3, 3], "x": [100, 100, 100, 100, 100, 4, -5, 7]})
    policy = "BUDGET EPSILON 9; PRIVATE TABLE t (PRIVACY UNIT uid, MAX ROWS PER UNIT 2, x BOUNDS 0 TO 10);"
    with dpsql.connect({"t": frame}, policy=policy) as db:
        stream = plan_stream(db.mechanism_context(), ["SELECT COUNT(*) FROM t", "SELECT SUM(x) FROM t"], 0, 1)
        bounded = frame.assign(x=frame["x"].clip(0, 10)).groupby("uid").head(2)
        for query, measure in zip(stream.queries, (lambda f: len(f), lambda f: f["x"].sum())):
            whole = measure(bounded)
            largest = max(abs(whole - measure(bounded[bounded["uid"] != unit])) for unit in bounded["uid"].unique())
            assert query.sensitivity * query.grid == largest


@pytest.mark.parametrize("queries, options, message", [
    (["SELECT store, COUNT(*) FROM visits GROUP BY store"], {}, "query 1 of the stream: it has a GROUP BY"),
    (["SELECT COUNT(*) FROM visits", "SELECT AVG(age) FROM visits"], {}, "query 2 of the stream: it is not a single"),
    (["SELECT COUNT(*) + 1 FROM visits"], {}, "query 1 of the stream: it is not a single COUNT or SUM"),
    (["SELECT COUNT(*) FROM stores"], {}, "reads no private data"),
    (["SELECT WITH DIFFERENTIAL_PRIVACY OPTIONS (epsilon = 9) COUNT(*) FROM visits"], {}, "sets its own epsilon"),
    (["SELECT COUNT(*) FROM visitz"], {}, "query 1 of the stream: unknown table visitz"),
    (["SELECT COUNT(*) FROM visits"], {"max_above": 2}, "max_above must be a whole number from 1 to"),
    (["SELECT COUNT(*) FROM visits"], {"threshold": float("nan")}, "threshold must be a finite number"),
    (["SELECT COUNT(*) FROM visits"], {"value_epsilon": 1}, "value_epsilon is given but values is not"),
    ([], {}, "needs a list of queries"),
])
def test_refusals_name_the_query_and_what_to_write(db, queries, options, message):
    with pytest.raises((UnsupportedQuery, InvalidParameter), match=message) as refused:
        db.above_threshold(queries, **{"threshold": 1, "epsilon": 1, **options})
    assert refused.value.hint
    assert db.budget.spent.epsilon == 0


def test_a_failure_after_the_charge_releases_nothing(db, monkeypatch):
    calls = []
    real = db._engine.fetch

    def failing(sql, parameters=None, **kwargs):
        calls.append(sql)
        if len(calls) == 2:
            raise RuntimeError("private value 12345 in an engine message")
        return real(sql, parameters, **kwargs)

    monkeypatch.setattr(db._engine, "fetch", failing)
    with pytest.raises(QueryFailed) as failed:
        db.above_threshold(AGES, threshold=10**6, epsilon=1)
    assert "12345" not in str(failed.value) and db.budget.spent.epsilon == 1


def test_the_sql_form_answers_and_explains_as_the_method(db):
    sql = ("SELECT * FROM above_threshold('SELECT COUNT(*) FROM visits WHERE age > 85', "
           "$$SELECT COUNT(*) FROM visits WHERE store = 'north'$$, threshold = 1000000, epsilon = 0.5, "
           "max_above => 1)")
    explained = db.explain(sql)
    assert "sparse vector (AboveThreshold" in explained and "2 queries" in explained
    assert "one unit changes it by at most 10" in explained and "cost: epsilon 0.5" in explained
    assert db.budget.spent.epsilon == 0
    answer = db.sql(sql)
    assert [row[2] for row in answer.fetchall()] == [False, False] and db.budget.spent.epsilon == Fraction(1, 2)
    with_default = db.sql(sql.replace(", epsilon = 0.5", ""), epsilon=Fraction(1, 4))  # .epsilon, --epsilon
    assert with_default.cost.epsilon == Fraction(1, 4)


@pytest.mark.parametrize("sql, message", [
    ("SELECT * FROM above_threshold('SELECT COUNT(*) FROM visits', threshold = 1) WHERE above",
     "must be selected from alone, found WHERE"),
    ("SELECT * FROM above_threshold('SELECT COUNT(*) FROM visits', threshold = 1, limit_to = 2)",
     "has no option limit_to"),
    ("SELECT * FROM above_threshold('SELECT COUNT(*) FROM visits', threshold = 1, threshold = 2)",
     "given the option threshold twice"),
    ("SELECT * FROM above_threshold(threshold = 1, 'SELECT COUNT(*) FROM visits')", "queries come before its options"),
    ("SELECT * FROM above_threshold(42, threshold = 1)", "takes its queries as string literals"),
    ("SELECT * FROM above_threshold('SELECT COUNT(*) FROM visits')", "needs a threshold"),
])
def test_the_sql_form_refuses_what_it_cannot_read(db, sql, message):
    with pytest.raises((UnsupportedQuery, InvalidParameter), match=message) as refused:
        db.sql(sql)
    assert refused.value.hint and db.budget.spent.epsilon == 0


def test_the_shell_and_the_cli_answer_the_sql_form(db, built, tmp_path, capsys):
    sql = "SELECT * FROM above_threshold('SELECT COUNT(*) FROM visits WHERE age > 20', threshold = 0, epsilon = 20)"
    shown = handle_input(new_state(db, width=100, color=False), sql + ";")
    assert "│ above │" in shown and "│ true  │" in shown and "cost ε 20, δ 0" in shown
    database = tmp_path / "shop.duckdb"
    database.write_bytes(built.read_bytes())
    (tmp_path / "shop.policy").write_text(POLICY)
    code, out, err = run(capsys, "query", str(database), sql, "--policy", str(tmp_path / "shop.policy"),
                         "--format", "json")
    assert code == 0, err
    assert json.loads(out) == [{"n": 1, "query": "SELECT COUNT(*) FROM visits WHERE age > 20", "above": True}]
    code, out, err = run(capsys, "explain", str(database), sql.replace(", epsilon = 20", ""), "--policy",
                         str(tmp_path / "shop.policy"), "--epsilon", "0.3")
    assert code == 0 and "cost: epsilon 0.3, delta 0, charged once for the whole stream" in out


@pytest.mark.skipif(shutil.which("psql") is None, reason="psql is not installed")
def test_psql_calls_it_through_the_server_charged_to_the_analyst(built, tmp_path):
    server = serve_shop(built, tmp_path, POLICY, "alice", "alice-secret")
    try:
        sql = ("SELECT * FROM above_threshold('SELECT COUNT(*) FROM visits WHERE age > 20', "
               "'SELECT COUNT(*) FROM visits WHERE age > 30', threshold = 0, epsilon = 20)")
        lines, shown = psql_lines(server, "alice", "alice-secret", sql, "SHOW ledger")
    finally:
        server.stop()
        server.thread.join(10)
    assert "1|SELECT COUNT(*) FROM visits WHERE age > 20|t" in lines, shown
    assert "2|SELECT COUNT(*) FROM visits WHERE age > 30|" in lines  # not run: the stream stopped
    assert any("|alice|ABOVE THRESHOLD 0 (at most 1 above) OF 1. SELECT COUNT(*)" in line for line in lines)


def test_the_shell_completes_mechanisms_after_from():
    from dpsql.shell.complete import complete
    offered = [(s.text, s.detail) for s in complete("SELECT * FROM abo", {"visits": ["age"]})]
    assert offered == [("above_threshold(", "mechanism: many queries")]


def test_a_sampled_query_is_refused_in_a_stream_before_the_charge(db):
    """A stream's charge is not amplified, and its fetches carry no sample key: refused, not a
    charged failure."""
    with pytest.raises(UnsupportedQuery, match="query 2 of the stream: it samples its table"):
        db.above_threshold(["SELECT COUNT(*) FROM visits",
                            "SELECT COUNT(*) FROM visits TABLESAMPLE POISSON (10 PERCENT)"], threshold=1, epsilon=1)
    assert db.budget.spent.epsilon == 0


def test_a_stored_stream_is_each_analysts_own_and_follows_each_querys_options(built, tmp_path):
    """The stream's key is its queries' own repeat keys (options, policy, analyst): another
    analyst, or a query with other contribution options, is a new release, charged."""
    ledger = tmp_path / "shop.ledger"
    stream = ["SELECT COUNT(*) FROM visits WHERE age > 40"]
    with dpsql.connect(str(built), policy=POLICY, ledger=ledger, analyst="alice") as alice:
        first = alice.above_threshold(stream, threshold=0, epsilon=1, values=True)
        assert not first.cost.repeat and alice.above_threshold(stream, threshold=0, epsilon=1, values=True).cost.repeat
        limited = alice.above_threshold(
            ["SELECT WITH DIFFERENTIAL_PRIVACY OPTIONS (max_rows_contributed = 1) COUNT(*) FROM visits WHERE age > 40"],
            threshold=0, epsilon=1, values=True)
        assert not limited.cost.repeat
        assert limited.accuracy_df()["value"].iloc[0] * 5 < first.accuracy_df()["value"].iloc[0]
    with dpsql.connect(str(built), policy=POLICY, ledger=ledger, analyst="bob") as bob:
        assert "asked before" not in bob.explain(
            "SELECT * FROM above_threshold('SELECT COUNT(*) FROM visits WHERE age > 40', threshold = 0, "
            "epsilon = 1, values = true)")
        assert not bob.above_threshold(stream, threshold=0, epsilon=1, values=True).cost.repeat
        assert bob.ledger()["epsilon"].tolist() == [2.0]  # bob's own entry, charged to bob


@pytest.mark.parametrize("sql, arguments, message", [
    ("SELECT WITH DIFFERENTIAL_PRIVACY OPTIONS (epsilon = 0.01) * FROM above_threshold('SELECT COUNT(*) FROM "
     "visits', threshold = 1)", {}, "takes its options inside its call"),
    ("SELECT * EXCLUDE (n) FROM above_threshold('SELECT COUNT(*) FROM visits', threshold = 1)", {},
     "must be selected from alone"),
    ("SELECT * FROM above_threshold('SELECT COUNT(*) FROM visits', threshold = 1) AS a(x, y, z)", {},
     "cannot be renamed here"),
    ("SELECT * FROM above_threshold('SELECT COUNT(*) FROM visits', threshold = 1e)", {}, "is not a number: 1e"),
    ("SELECT * FROM above_threshold('SELECT COUNT(*) FROM visits', threshold = 1, epsilon = 0.3)",
     {"epsilon": 0.05}, "epsilon is given twice: 0.3 in the call and 0.05 as an argument"),
    ("SELECT * FROM above_threshold('SELECT COUNT(*) FROM visits HAVING COUNT(*) > 5', threshold = 1)", {},
     "it post-processes its answer \\(HAVING\\)"),
    ("SELECT * FROM above_threshold('SELECT COUNT(*) FROM visits LIMIT 0', threshold = 1)", {},
     "it post-processes its answer \\(LIMIT\\)"),
    ("SELECT * FROM above_threshold('SELECT WITH DIFFERENTIAL_PRIVACY OPTIONS (report_bias = 0.1) COUNT(*) "
     "FROM visits', threshold = 1)", {}, "sets its own report_bias"),
    ("SELECT * FROM above_threshold('SELECT COUNT(*) FROM visits', threshold = 1, epsilon = 0.000000001)", {},
     "too small for a stream"),
])
def test_what_the_attack_review_sent_is_refused_before_the_charge(db, sql, arguments, message):
    with pytest.raises((UnsupportedQuery, InvalidParameter), match=message):
        db.sql(sql, **arguments)
    assert db.budget.spent.epsilon == 0


def test_a_delta_beside_a_pure_streams_call_is_no_refusal(db):
    """The shell's .delta or --delta: a pure mechanism spends none of it."""
    answer = db.sql("SELECT * FROM above_threshold('SELECT COUNT(*) FROM visits', threshold = 1)",
                    epsilon=0.5, delta=1e-6)
    assert answer.cost.epsilon == Fraction(1, 2) and answer.cost.delta == 0


def test_a_shape_refusal_comes_before_any_query_is_planned(db, monkeypatch):
    """A long stream whose last query is malformed is refused without planning the others (the
    server answers one statement at a time: planning hundreds would stall it for nothing)."""
    planned = []
    real = db._prepare
    monkeypatch.setattr(db, "_prepare", lambda *a, **k: planned.append(a[0]) or real(*a, **k))
    with pytest.raises(UnsupportedQuery, match="query 300 of the stream: it has a GROUP BY"):
        db.above_threshold(["SELECT COUNT(*) FROM visits"] * 299 + ["SELECT COUNT(*) FROM visits GROUP BY store"],
                           threshold=1, epsilon=1)
    assert planned == []


def test_a_stream_with_values_says_its_whole_cost_before_and_after(db):
    """``epsilon = 0.5, values = true`` charges 1 (the values' epsilon defaults to epsilon): the
    explanation and the answer say the total and how it splits, not only the charged figure."""
    sql = ("SELECT * FROM above_threshold('SELECT COUNT(*) FROM visits WHERE age > 85', threshold = 1000000, "
           "epsilon = 0.5, values = true)")
    split = ("(0.5 for the sparse vector + 0.5 for the values of the queries above: value_epsilon, "
             "by default the same as epsilon)")
    assert f"cost: epsilon 1 {split}, delta 0" in db.explain(sql)
    released = db.sql(sql)
    assert f"epsilon 1 in all {split}" in released.notes and released.cost.epsilon == 1
    assert not any("value_epsilon" in note for note in db.above_threshold(AGES, threshold=10, epsilon=1).notes)
