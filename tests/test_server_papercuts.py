"""The server's smaller findings (issue 23, item 8): what an analyst reads names nothing of the
server and gives away nothing of the other analysts; ``dpsql_cost`` never describes an answer
it does not belong to; EXPLAIN is short in psql; the catalog names the database served.
"""

from __future__ import annotations

import json
import os
import shutil
import sqlite3
import subprocess

import pytest
from served import serve_shop

from dpsql.budget import ledger as ledger_module
from dpsql.demo import SHOP_POLICY
from dpsql.server.session import FREE, UNANSWERED
from dpsql.server.users import add_user

psycopg = pytest.importorskip("psycopg")

PSQL = shutil.which("psql")
PASSWORDS = {"alice": "alice-secret", "bob": "bob-secret"}
POLICY = SHOP_POLICY.replace("BUDGET EPSILON 3.0", "BUDGET EPSILON 50")


@pytest.fixture(scope="module")
def served(built, tmp_path_factory):
    directory = tmp_path_factory.mktemp("papercuts")
    server = serve_shop(built, directory, POLICY, "alice", PASSWORDS["alice"])
    add_user(directory / "users", "bob", PASSWORDS["bob"])
    yield server, directory
    server.stop()
    server.thread.join(10)


@pytest.fixture(scope="module")
def server(served):
    return served[0]


def connect(server, user="alice"):
    return psycopg.connect(host="127.0.0.1", port=server.port, dbname="shop", user=user, password=PASSWORDS[user],
                           connect_timeout=5, autocommit=True)


def psql(server, *commands: str, user: str = "alice") -> subprocess.CompletedProcess:
    environment = {**os.environ, "PGPASSWORD": PASSWORDS[user], "PGCONNECT_TIMEOUT": "5"}
    arguments = [PSQL, "-h", "127.0.0.1", "-p", str(server.port), "-U", user, "-d", "shop", "-X", "-A",
                 "-v", "ON_ERROR_STOP=0"]
    for command in commands:
        arguments += ["-c", command]
    return subprocess.run(arguments, env=environment, capture_output=True, text=True, timeout=60)


def test_show_ledger_numbers_each_analysts_own_entries_from_one(server):
    """The ledger's ids count everyone's queries: their gaps told an analyst how many the others
    asked in between. Each analyst sees 1, 2, 3 ... over their own entries only."""
    with connect(server, "alice") as alice, connect(server, "bob") as bob:
        for i, connection in enumerate((alice, bob, bob, alice, bob, alice)):
            connection.execute(f"SELECT COUNT(*) FROM visits WHERE amount > {i}")
        for connection, name, own in ((alice, "alice", 3), (bob, "bob", 3)):
            cursor = connection.execute("SHOW ledger")
            columns = [column.name for column in cursor.description]
            rows = cursor.fetchall()
            assert [row[columns.index("id")] for row in rows] == list(range(1, len(rows) + 1))
            assert {row[columns.index("analyst")] for row in rows} == {name} and len(rows) >= own
    everyone = server.shared.run(None, lambda db: db.ledger())
    assert len(everyone) >= 6  # the ledger itself keeps its global ids, for the curator
    assert list(everyone["id"]) == sorted(everyone["id"]) and everyone["id"].is_unique


def test_dpsql_cost_is_replaced_on_every_statement(server):
    """After an answer, a refusal, a SET or a catalog look-up, ``dpsql_cost`` describes that
    statement, never the answer before it."""
    with connect(server) as connection:
        cost = lambda: json.loads(connection.info.parameter_status("dpsql_cost"))  # noqa: E731
        connection.execute("SELECT COUNT(*) AS n FROM visits WHERE amount > 100").fetchall()
        answered = cost()
        assert answered["epsilon"] != "0" and "halfwidth95" in answered
        with pytest.raises(psycopg.errors.FeatureNotSupported):
            connection.execute("SELECT COUNT(*) OVER () FROM visits")
        assert cost() == json.loads(UNANSWERED)
        connection.execute("SELECT COUNT(*) AS n FROM visits WHERE amount > 101").fetchall()
        assert cost()["epsilon"] != "0"
        connection.execute("SET dpsql.intervals = off")
        assert cost() == json.loads(FREE)
        connection.execute("SELECT COUNT(*) AS n FROM visits WHERE amount > 102").fetchall()
        with pytest.raises(psycopg.errors.UndefinedColumn):
            connection.execute("SELECT nope FROM visits")
        assert cost() == json.loads(UNANSWERED)
        with pytest.raises(psycopg.errors.SyntaxError):  # refused before reaching dpsql
            connection.execute("SELECT 1; SELECT 2")
        assert cost() == json.loads(UNANSWERED)


def test_a_locked_ledger_answers_lock_not_available_naming_no_file(built, tmp_path, monkeypatch):
    """Another process holding the ledger's write lock past dpsql's wait is SQLSTATE 55P03, said
    as it is: not "feature not supported", not SQLite's "database is locked" (the analyst's data
    is not locked), and not the ledger's path."""
    monkeypatch.setattr(ledger_module, "BUSY_TIMEOUT_SECONDS", 0.5)  # read when the ledger opens
    server = serve_shop(built, tmp_path, POLICY, "alice", PASSWORDS["alice"])
    try:
        holder = sqlite3.connect(tmp_path / "ledger", isolation_level=None)
        holder.execute("BEGIN IMMEDIATE")
        try:
            with connect(server) as connection:
                with pytest.raises(psycopg.errors.LockNotAvailable) as raised:
                    connection.execute("SELECT COUNT(*) FROM visits")
                text = f"{raised.value.diag.message_primary} {raised.value.diag.message_hint}"
                assert "privacy ledger is locked by another process" in text and "nothing was charged" in text
                assert str(tmp_path) not in text and "ledger at" not in text and "database is locked" not in text
                assert json.loads(connection.info.parameter_status("dpsql_cost")) == json.loads(UNANSWERED)
                holder.execute("ROLLBACK")
                assert connection.execute("SELECT COUNT(*) FROM visits").fetchall()  # answered once released
        finally:
            holder.close()
    finally:
        server.stop()
        server.thread.join(10)


@pytest.mark.skipif(PSQL is None, reason="psql is not installed")
def test_explain_in_psql_is_a_summary_and_verbose_adds_the_sql_that_runs(server):
    query = "SELECT store, COUNT(*) AS n, AVG(amount) AS a FROM visits GROUP BY store"
    done = psql(server, f"EXPLAIN {query}", f"EXPLAIN VERBOSE {query}",
                "EXPLAIN (VERBOSE) SELECT MEDIAN(age) FROM visits",
                "EXPLAIN (VERBOSE false) SELECT MEDIAN(age) FROM visits")
    assert done.returncode == 0 and "ERROR" not in done.stderr, done.stderr
    plans = done.stdout.split("QUERY PLAN\n")[1:]
    short, verbose, median, median_short = (plan.splitlines() for plan in plans)
    assert len(short) < 30 < len(verbose)
    assert any("L1 sensitivity" in line for line in short) and any(line.startswith("limits:") for line in short)
    assert not any("SELECT" in line for line in short) and "EXPLAIN VERBOSE adds the SQL that runs" in short[-2]
    assert "bounded SQL ($salt is a secret per-database salt):" in verbose and "GROUP BY" in "\n".join(verbose)
    assert "bounded SQL of m0, run on its own (the quantile's histogram):" in median
    assert "dp_none" not in "\n".join(median) and not any("SELECT" in line for line in median_short)
    assert str(server.settings.users_path.parent) not in done.stdout + done.stderr


def test_the_interval_notice_lists_every_row_keyed_by_its_keys():
    """The notice listed the first 10 rows and said "… 6 more rows" (issue 37): the small groups,
    where the interval matters most, were the ones cut."""
    from dpsql.server.intervals import notice

    class Answer:
        columns = ["store", "n"]
        rows = [(f"s{i}", i) for i in range(25)] + [(None, 3)]

        def __iter__(self):
            return iter(self.rows)

    found = {"n": [(i - 1.0, i + 2.0, 1.5) for i in range(25)] + [(0.0, 6.0, 3.0)]}  # asymmetric: by row
    shown = notice(Answer(), found)
    lines = shown.splitlines()
    assert lines[1].split() == ["store", "|", "n"]
    assert [line.split(" | ")[0].strip() for line in lines[2:]] == [f"s{i}" for i in range(25)] + ["NULL"]
    assert [line.split(" | ")[1] for line in lines[2:]] == \
        [f"[{i - 1}, {i + 2}]" for i in range(25)] + ["[0, 6]"]  # a count's: whole numbers
    assert "more row" not in shown and "OPTIONS" not in shown
