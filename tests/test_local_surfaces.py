"""Randomized-response columns on every surface (issue 24, items 4-7): the LOCAL RR policy through
``dpsql init`` and ``dpsql query``, a de-biased count over the PostgreSQL wire (``dpsql serve``),
and the central path on Spark, which needs nothing new: its counting query is an ordinary one.
"""

from __future__ import annotations

import duckdb
import pytest
from cli_run import run

import dpsql
from dpsql.answer.table import supported_decimals
from dpsql.mechanisms.randomized_response import randomized_response
from dpsql.mechanisms.noise import SeededSource

POLICY = """BUDGET EPSILON 5; NEIGHBOURS BOUNDED; QUERY EPSILON 1;
PRIVATE TABLE survey (PRIVACY UNIT ROW, age BOUNDS 0 TO 100,
                      ans LOCAL RR EPSILON 1 DOMAIN ('yes', 'no', 'maybe'));
"""
GROUPED = "SELECT ans, COUNT(*) AS n FROM survey GROUP BY ans"


def reports() -> list[str]:
    true = ["yes"] * 120 + ["no"] * 60 + ["maybe"] * 20
    return randomized_response(true, epsilon=1, domain=["yes", "no", "maybe"], source=SeededSource(2))


@pytest.fixture()
def survey_db(tmp_path):
    path = tmp_path / "survey.duckdb"
    with duckdb.connect(str(path)) as con:
        con.execute("CREATE TABLE survey (rid INTEGER, ans VARCHAR, age INTEGER)")
        con.executemany("INSERT INTO survey VALUES (?, ?, ?)", [(i, a, 20 + i % 60) for i, a in enumerate(reports())])
    (tmp_path / "survey.policy").write_text(POLICY)
    return path, tmp_path / "survey.policy"


def test_init_then_query_answers_free_from_the_stored_policy(survey_db, capsys):
    database, policy = survey_db
    code, out, _ = run(capsys, "init", str(database), "--policy", str(policy), "--estimate-epsilon", "0")
    assert code == 0
    code, out, err = run(capsys, "query", str(database), GROUPED)
    assert code == 0 and "yes" in out and "±" in out
    assert "randomized response" in out + err
    code, out, _ = run(capsys, "explain", str(database), GROUPED)
    assert code == 0 and "path: free" in out
    with dpsql.connect(str(database)) as db:
        assert db.budget.spent.epsilon == 0 and "LOCAL RR EPSILON 1" in db.policy_text()


def test_served_count_is_de_biased_over_the_wire(survey_db, tmp_path):
    psycopg = pytest.importorskip("psycopg")
    from dpsql.server import start_in_thread
    from dpsql.server.users import add_user

    database, policy = survey_db
    add_user(tmp_path / "users", "alice", "alice-secret")
    server = start_in_thread(database, users=tmp_path / "users", policy=policy, port=0, ledger=tmp_path / "ledger")
    try:
        with psycopg.connect(host="127.0.0.1", port=server.port, dbname="survey", user="alice",
                             password="alice-secret", connect_timeout=5, autocommit=True) as con:
            rows = con.execute(GROUPED).fetchall()
            central = con.execute("SELECT COUNT(*) AS n FROM survey WHERE age > 40 AND ans = 'yes'").fetchall()
            shown = con.execute("SELECT WITH DIFFERENTIAL_PRIVACY OPTIONS (intervals = true) ans, COUNT(*) AS n "
                                "FROM survey GROUP BY ans")
            names, widened = [d.name for d in shown.description], shown.fetchall()
        with dpsql.connect(str(database), ledger=":memory:", policy=policy) as db:  # beside the served budget
            answer = db.sql(GROUPED)
            expected, halves = answer.fetchall(), answer.accuracy_df()["n"].tolist()
            spent = db.budget.spent.epsilon
    finally:
        server.stop()
        server.thread.join(10)
    assert [r[0] for r in rows] == ["yes", "no", "maybe"] and spent == 0
    # sent to the digits its ± supports (issue 37), as the shell shows it
    assert [float(r[1]) for r in rows] == pytest.approx(
        [round(n, supported_decimals(half)) for (_, n), half in zip(expected, halves)])
    assert len(central) == 1
    assert names == ["ans", "n", "n_low", "n_high"] and [float(r[1]) for r in widened] == [
        float(r[1]) for r in rows] and all(float(r[2]) < float(r[1]) < float(r[3]) for r in widened)


@pytest.mark.spark
def test_spark_answers_the_central_and_the_free_path():
    from spark import session

    spark = session()
    rows = [(i, a, 20 + i % 60) for i, a in enumerate(reports())]
    frame = spark.createDataFrame(rows, "rid INT, ans STRING, age INT")
    frame.createOrReplaceTempView("survey")
    unbounded = POLICY.replace("NEIGHBOURS BOUNDED", "NEIGHBOURS UNBOUNDED")
    with dpsql.connect(spark, policy=unbounded, ledger=":memory:", rng=SeededSource(1)) as db:
        result = db.sql(GROUPED, epsilon=1)
        assert result.cost.epsilon == 1 and [r[0] for r in result.fetchall()] == ["yes", "no", "maybe"]
        assert "(charged)" in result.notes[0] and result.accuracy()["n"] > 0
    with dpsql.connect(spark, policy=POLICY, ledger=":memory:") as db:   # free: the exact counts, read back
        free = db.sql(GROUPED)
    with dpsql.connect({"survey": frame.toPandas()}, policy=POLICY) as db:
        local = db.sql(GROUPED).fetchall()
    assert free.cost.epsilon == 0 and [r[0] for r in free.fetchall()] == [r[0] for r in local]
    assert [r[1] for r in free.fetchall()] == pytest.approx([r[1] for r in local])


def test_the_catalog_descriptions_say_how_the_column_was_collected():
    """psql's \\d (the server's catalog comments) and the shell's .schema describe the column."""
    from dpsql.policy.language import parse_policy
    from dpsql.server.described import described
    from dpsql.shell.commands import _column_rule

    policy = parse_policy(POLICY)
    _, columns = described(policy)["survey"]
    assert columns["ans"] == "randomized response at epsilon 1 over 'yes', 'no', 'maybe'"
    shown = _column_rule(policy.table("survey"), "ans", "VARCHAR")
    assert "randomized response at epsilon 1 over 'yes', 'no', 'maybe'" in shown and "MAX STRING LENGTH" in shown
