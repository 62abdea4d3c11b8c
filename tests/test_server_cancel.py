"""A PostgreSQL cancel request (psql's Ctrl-C, psycopg's ``cancel_safe``) and the charge (issue
35, item 5): a statement cancelled before its charge commits — even while it waits for the
ledger's lock — is neither charged nor answered; one cancelled after its charge stays charged
and its answer is withheld. Either way the 57014 comes once the call has decided, and says which.

No test here times anything: the ledger's lock, held by the test, or a gate on the engine's
``fetch`` holds the statement in place until the cancel has been processed (libpq's cancel
returns once the server has closed the cancel connection, after handling it).
"""

from __future__ import annotations

import sqlite3
import threading

import pytest
from served import serve_shop

import dpsql
from dpsql.budget.ledger import Cancellation
from dpsql.demo import SHOP_POLICY
from dpsql.errors import Cancelled

psycopg = pytest.importorskip("psycopg")

WAIT = 30  # seconds: only reached when the behaviour under test is broken
POLICY = SHOP_POLICY.replace("BUDGET EPSILON 3.0 DELTA 1e-6", "BUDGET EPSILON 50 DELTA 1e-3")
PASSWORD = "alice-secret"


@pytest.fixture(scope="module")
def served(built, tmp_path_factory):
    directory = tmp_path_factory.mktemp("cancel")
    server = serve_shop(built, directory, POLICY, "alice", PASSWORD)
    yield server, directory / "ledger"
    server.stop()
    server.thread.join(WAIT)


def connect(server):
    return psycopg.connect(host="127.0.0.1", port=server.port, dbname="shop", user="alice", password=PASSWORD,
                           connect_timeout=5, autocommit=True)


def entries(ledger_path) -> int:
    """The ledger's entries, read from the file itself (a WAL reader waits for no writer)."""
    with sqlite3.connect(ledger_path) as reader:
        return reader.execute("SELECT count(*) FROM entries").fetchone()[0]


def asked(connection, sql: str) -> tuple[threading.Thread, dict]:
    """``sql`` sent on ``connection`` from a thread; its rows or its error land in the dict."""
    outcome: dict = {}

    def run() -> None:
        try:
            outcome["rows"] = connection.execute(sql).fetchall()
        except psycopg.Error as error:
            outcome["error"] = error

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, outcome


def test_a_query_cancelled_while_it_waits_for_the_ledgers_lock_is_neither_charged_nor_answered(served):
    server, ledger_path = served
    ledger = server.shared._connection._ledger
    waiting = threading.Event()  # the worker has begun the charge's transaction: it waits for the lock
    ledger._connection.set_trace_callback(lambda sql: waiting.set() if sql == "BEGIN IMMEDIATE" else None)
    holder = sqlite3.connect(ledger_path, isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")  # another process holds the ledger's write lock
    try:
        before = entries(ledger_path)
        with connect(server) as connection:
            spent = connection.execute("SHOW budget").fetchall()
            thread, outcome = asked(connection, "SELECT COUNT(*) FROM visits WHERE age > 33")
            assert waiting.wait(WAIT)
            connection.cancel_safe(timeout=5)
            assert thread.is_alive() and not outcome  # the reply waits for the call to decide
            holder.execute("ROLLBACK")  # the lock clears: the charge must not happen now
            thread.join(WAIT)
            assert "rows" not in outcome
            error = outcome["error"]
            assert isinstance(error, psycopg.errors.QueryCanceled)
            assert "nothing was charged" in error.diag.message_primary
            assert entries(ledger_path) == before
            assert connection.execute("SHOW budget").fetchall() == spent
            assert connection.execute("SELECT 1").fetchone() == (1,)  # the session goes on
    finally:
        ledger._connection.set_trace_callback(None)
        holder.close()


def test_a_query_cancelled_after_its_charge_stays_charged_and_its_answer_is_withheld(served):
    server, ledger_path = served
    engine = server.shared._connection._engine
    fetch = engine.fetch
    reading = threading.Event()
    go_on = threading.Event()

    def gate(*arguments, **options):  # the charge has committed: the statement reads the data
        reading.set()
        assert go_on.wait(WAIT)
        return fetch(*arguments, **options)

    engine.fetch = gate
    try:
        before = entries(ledger_path)
        with connect(server) as connection:
            thread, outcome = asked(connection, "SELECT COUNT(*) FROM visits WHERE age > 44")
            assert reading.wait(WAIT)
            assert entries(ledger_path) == before + 1
            connection.cancel_safe(timeout=5)
            go_on.set()
            thread.join(WAIT)
            assert "rows" not in outcome
            error = outcome["error"]
            assert isinstance(error, psycopg.errors.QueryCanceled)
            assert "stays charged" in error.diag.message_primary
            assert entries(ledger_path) == before + 1
            assert connection.execute("SELECT 1").fetchone() == (1,)
    finally:
        go_on.set()
        engine.fetch = fetch


CALLS = ("SELECT COUNT(*) FROM visits WHERE age > 55",
         "SELECT * FROM above_threshold('SELECT COUNT(*) FROM visits WHERE age > 20', threshold = 0, epsilon = 1)",
         "SELECT * FROM workload('SELECT plan, COUNT(*) FROM users GROUP BY plan', epsilon = 2, rounds = 2)",
         "SELECT * FROM pmw('SELECT COUNT(*) FROM users WHERE plan = ''free''', table = 'users', "
         "columns = 'plan', epsilon = 2, max_updates = 3, threshold = 5)",
         "SELECT * FROM fit('SELECT age, amount FROM visits', target = 'amount', epsilon = 1, delta = 1e-6, "
         "steps = 3)")


@pytest.mark.parametrize("sql", CALLS, ids=["query", "above_threshold", "workload", "pmw", "fit"])
def test_every_mechanism_an_analyst_reaches_honours_a_cancel_before_its_charge(built, sql):
    with dpsql.connect(str(built), policy=POLICY, ledger=":memory:") as db:
        cancel = Cancellation()
        cancel.request()
        with pytest.raises(Cancelled, match="nothing was charged"):
            db.acting_for("alice", cancel).sql(sql)
        assert db.budget.spent.epsilon == 0 and not cancel.charged
        db.acting_for("alice", Cancellation()).sql(sql)  # not cancelled: answered and charged
        assert db.budget.spent.epsilon > 0
