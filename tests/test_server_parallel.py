"""The server answers sessions side by side (issue 26, item 4): statements of different threads
overlap in DuckDB, a deadline stops only its own statement, every answer is charged to its own
analyst, a shared budget is never overspent by a race, the worker pool serves analysts in turn,
and a replaced policy lets the queries already running finish on the connection they began on.

No test here times anything: a statement is held in place by a gate (a Python function DuckDB
calls, or a wrapped ``fetch``) until the test has seen what must happen meanwhile.
"""

from __future__ import annotations

import collections
import re
import threading
import time
from fractions import Fraction

import duckdb
import pytest

import dpsql
from dpsql.backends.duckdb import Engine
from dpsql.demo import SHOP_POLICY
from dpsql.errors import QueryFailed
from dpsql.server.answers import SharedDatabase
from dpsql.server.pool import FairPool

WAIT = 30  # seconds: only reached when the behaviour under test is broken


class Gate:
    """Wraps a ``fetch``: the first call waits until ``open()``; later calls pass at once."""

    def __init__(self, fetch):
        self._fetch = fetch
        self._lock = threading.Lock()
        self._first = True
        self.entered = threading.Event()
        self._opened = threading.Event()

    def __call__(self, *arguments, **options):
        with self._lock:
            mine, self._first = self._first, False
        if mine:
            self.entered.set()
            assert self._opened.wait(WAIT), "the gate was never opened"
        return self._fetch(*arguments, **options)

    def open(self) -> None:
        self._opened.set()


def in_thread(function, *arguments) -> tuple[threading.Thread, dict]:
    """``function(*arguments)`` started in a thread; its result or error lands in the dict."""
    outcome: dict = {}

    def run() -> None:
        try:
            outcome["result"] = function(*arguments)
        except BaseException as error:  # noqa: BLE001 - the test reads it
            outcome["error"] = error

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, outcome


# -- the engine: one cursor per statement ------------------------------------------------------

@pytest.fixture
def held():
    """A DuckDB connection with ``dp_wait(x)``, which returns x once ``release`` is set."""
    connection = duckdb.connect()
    release = threading.Event()

    def dp_wait(x: int) -> int:
        release.wait(WAIT)
        return x

    connection.create_function("dp_wait", dp_wait)
    yield connection, release
    release.set()
    connection.close()


def test_a_statement_runs_while_another_threads_statement_is_still_running(held):
    connection, release = held
    engine = Engine(connection, owned=False, path=None)
    thread, outcome = in_thread(engine.fetch, "SELECT dp_wait(7)")
    try:
        assert engine.fetch("SELECT 42") == [(42,)]  # under one engine-wide lock, this waited forever
        assert thread.is_alive() and not outcome
    finally:
        release.set()
        thread.join(WAIT)
    assert outcome == {"result": [(7,)]}


def test_a_public_relation_being_stored_does_not_hold_up_other_statements(held):
    """A join's public side is stored before the charge (``Engine.materialise``), outside the
    engine's lock: a costly one held every session's statements for its whole time limit."""
    connection, release = held
    engine = Engine(connection, owned=False, path=None)
    thread, outcome = in_thread(engine.materialise, "SELECT dp_wait(7) AS x")
    try:
        assert engine.fetch("SELECT 42") == [(42,)]
        assert thread.is_alive() and not outcome
    finally:
        release.set()
        thread.join(WAIT)
    name = outcome["result"]
    assert engine.materialise("SELECT dp_wait(7) AS x") == name  # stored once
    assert engine.fetch(f'SELECT x FROM dp_bounding.main."{name}"') == [(7,)]


def test_a_deadline_interrupts_its_own_statement_and_no_other(held):
    """Each statement runs on its own cursor, and ``interrupt()`` on a cursor stops that
    cursor's statement only: a query stopped by its time limit leaves another running."""
    connection, release = held
    patient = Engine(connection, owned=False, path=None, query_timeout=WAIT)
    hasty = Engine(connection, owned=False, path=None, query_timeout=0.2)
    thread, outcome = in_thread(patient.fetch, "SELECT dp_wait(7)")
    try:
        with pytest.raises(QueryFailed, match="time limit"):
            hasty.fetch("SELECT SUM(i) FROM range(100000000000) AS t(i)")  # hours, were it not stopped
        assert thread.is_alive() and not outcome
    finally:
        release.set()
        thread.join(WAIT)
    assert outcome == {"result": [(7,)]}


# -- the shared database: views per analyst, one ledger ----------------------------------------

def shared_database(shop, policy: str = SHOP_POLICY, reopen=None) -> SharedDatabase:
    database, _ = shop
    return SharedDatabase(dpsql.connect(database, policy, eager_bounding=True), reopen)


def answer_as(shared: SharedDatabase, analyst: str, sql: str):
    return shared.run(analyst, lambda db: db.sql(sql))


def test_a_long_query_does_not_hold_up_another_analysts(shop):
    shared = shared_database(shop)
    try:
        engine = shared._connection._engine
        engine.fetch = gate = Gate(engine.fetch)
        thread, outcome = in_thread(answer_as, shared, "alice", "SELECT COUNT(*) AS n FROM visits WHERE age > 30")
        assert gate.entered.wait(WAIT)
        try:  # alice's query is charged and held inside the engine: bob's is answered meanwhile
            assert answer_as(shared, "bob", "SELECT COUNT(*) AS n FROM visits WHERE age > 40").fetchall()
            assert thread.is_alive() and not outcome
        finally:
            gate.open()
            thread.join(WAIT)
        assert outcome["result"].fetchall()
    finally:
        shared.close()


ANALYSTS = 8
QUERIES = 4


def test_under_concurrency_each_answer_is_charged_to_its_own_analyst(shop):
    policy = SHOP_POLICY.replace("BUDGET EPSILON 3.0", "BUDGET EPSILON 100").replace(
        "QUERY EPSILON 0.1;", "QUERY EPSILON 0.1;\nBUDGET PER ANALYST EPSILON 1;")
    shared = shared_database(shop, policy)
    start = threading.Barrier(ANALYSTS)
    failures: list = []

    def ask(index: int) -> None:
        start.wait()
        for number in range(QUERIES):
            try:  # the analyst's own number in the SQL: the ledger entry says whose it is
                _, budget = shared.run(f"a{index}", lambda db: (
                    db.sql(f"SELECT COUNT(*) AS n FROM visits WHERE age > {10 * index + number}"), db.budget))
                # The budget read in the same call is the analyst's own, after their own queries only.
                assert budget.analyst.owner == f"a{index}"
                assert budget.analyst.spent.epsilon == Fraction(number + 1, 10)
            except BaseException as error:  # noqa: BLE001 - reported below
                failures.append(error)

    try:
        threads = [threading.Thread(target=ask, args=(i,)) for i in range(ANALYSTS)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(WAIT * 4)
        assert not failures
        ledger = shared.run(None, lambda db: db.ledger())
    finally:
        shared.close()
    assert len(ledger) == ANALYSTS * QUERIES
    for analyst, sql in zip(ledger["analyst"], ledger["sql"]):  # normalised: "... WHERE 31 < age"
        (bound,) = re.findall(r"\b(\d+) < age", sql)
        assert analyst == f"a{int(bound) // 10}", (analyst, sql)
    assert collections.Counter(ledger["analyst"]) == {f"a{i}": QUERIES for i in range(ANALYSTS)}


def test_many_analysts_racing_for_the_last_of_the_budget_never_overspend_it(shop):
    """A total of 1.0 and sixteen analysts each asking for 0.3 at once: three are answered
    (0.9), the other thirteen refused, and the ledger holds exactly the three."""
    policy = SHOP_POLICY.replace("BUDGET EPSILON 3.0", "BUDGET EPSILON 1.0")
    shared = shared_database(shop, policy)
    start = threading.Barrier(16)
    outcomes: collections.Counter = collections.Counter()
    lock = threading.Lock()

    def ask(index: int) -> None:
        start.wait()
        try:
            shared.run(f"a{index}", lambda db: db.sql(f"SELECT COUNT(*) AS n FROM visits WHERE age > {index}",
                                                      epsilon=0.3))
            outcome = "answered"
        except dpsql.BudgetExceeded:
            outcome = "refused"
        except BaseException as error:  # noqa: BLE001 - counted, and fails the test below
            outcome = repr(error)
        with lock:
            outcomes[outcome] += 1

    try:
        threads = [threading.Thread(target=ask, args=(i,)) for i in range(16)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(WAIT * 4)
        spent = shared.run(None, lambda db: db.budget.spent.epsilon)
        charges = shared.run(None, lambda db: db.ledger())
    finally:
        shared.close()
    assert outcomes == {"answered": 3, "refused": 13}, outcomes
    assert spent == Fraction(9, 10) and len(charges) == 3


def test_a_replaced_policy_lets_running_queries_finish_on_the_old_connection(shop, tmp_path):
    """A reload while a query is held in the engine: new calls run under the new policy, the
    held one finishes (it was charged before the replacement) on the connection it began on,
    and that connection is closed only then."""
    database, _ = shop
    bigger = SHOP_POLICY.replace("BUDGET EPSILON 3.0", "BUDGET EPSILON 100")
    dpsql.init_policy(database, SHOP_POLICY)
    shared = SharedDatabase(dpsql.connect(database, None, eager_bounding=True),
                            lambda: dpsql.connect(database, None, eager_bounding=True))
    try:
        old = shared._connection
        old._engine.fetch = gate = Gate(old._engine.fetch)
        thread, outcome = in_thread(answer_as, shared, "alice", "SELECT COUNT(*) AS n FROM visits WHERE age > 30")
        assert gate.entered.wait(WAIT)
        try:
            dpsql.init_policy(database, bigger, replace=True)
            assert shared.run("bob", lambda db: db.budget.total.epsilon) == 100  # reloaded for bob
            assert shared.generation == 1 and shared._connection is not old
            assert not old._engine._closed  # alice's query still reads through it
        finally:
            gate.open()
            thread.join(WAIT)
        assert outcome["result"].fetchall() and old._engine._closed
    finally:
        shared.close()


def test_over_the_wire_one_sessions_held_query_does_not_hold_up_anothers(shop, tmp_path):
    """The whole path: two psycopg sessions, the server's pool and the shared database."""
    psycopg = pytest.importorskip("psycopg")
    from dpsql.server import start_in_thread
    from dpsql.server.users import add_user

    database, policy = shop
    for name in ("alice", "bob"):
        add_user(tmp_path / "users", name, f"{name}-secret")
    server = start_in_thread(database, users=tmp_path / "users", policy=policy, port=0, workers=2)

    def ask(name: str, sql: str):
        with psycopg.connect(host="127.0.0.1", port=server.port, dbname="shop", user=name,
                             password=f"{name}-secret", connect_timeout=5, autocommit=True) as connection:
            return connection.execute(sql).fetchall()

    try:
        engine = server.shared._connection._engine
        engine.fetch = gate = Gate(engine.fetch)
        thread, outcome = in_thread(ask, "alice", "SELECT COUNT(*) AS n FROM visits WHERE age > 30")
        assert gate.entered.wait(WAIT)
        try:
            assert len(ask("bob", "SELECT COUNT(*) AS n FROM visits WHERE age > 40")) == 1
            assert thread.is_alive() and not outcome
        finally:
            gate.open()
            thread.join(WAIT)
        assert len(outcome["result"]) == 1
    finally:
        server.stop()
        server.thread.join(WAIT)


# -- the pool: analysts in turn ----------------------------------------------------------------

def test_the_pool_serves_analysts_in_turn_so_a_busy_one_starves_no_other():
    pool = FairPool(1)
    ran: list[str] = []
    started, gate = threading.Event(), threading.Event()
    try:
        pool.submit("busy", lambda: started.set() or gate.wait(WAIT))  # holds the one worker
        assert started.wait(WAIT)
        for _ in range(10):
            pool.submit("busy", ran.append, "busy")
        late = pool.submit("quiet", ran.append, "quiet")
        assert pool.waiting() == 11
        gate.set()
        late.result(WAIT)
    finally:
        gate.set()
        pool.shutdown()
    assert ran.index("quiet") == 1  # after one of busy's, not after all ten
    assert ran.count("busy") == 10  # shutting down finishes what was submitted


def test_the_pool_runs_calls_of_different_analysts_at_once():
    pool = FairPool(2)
    both = threading.Barrier(2, timeout=WAIT)  # passes only when two calls run at the same time
    try:
        futures = [pool.submit(name, both.wait) for name in ("alice", "bob")]
        assert sorted(f.result(WAIT) for f in futures) == [0, 1]
    finally:
        pool.shutdown()


def test_one_analyst_never_holds_every_worker():
    """A stream or fit is one call that keeps its worker for up to the request limit: with two
    workers an analyst runs one call at a time, so another's statement is answered meanwhile (a
    served attacker's review: bob's one-statement query waited out alice's 110-query streams)."""
    pool = FairPool(2)
    gate, ran = threading.Event(), []
    try:
        holding = pool.submit("alice", lambda: gate.wait(WAIT) and ran.append("alice 1"))
        queued = pool.submit("alice", ran.append, "alice 2")
        pool.submit("bob", ran.append, "bob").result(WAIT)  # alice's second call did not take the other worker
        assert ran == ["bob"] and not queued.done()
        gate.set()
        holding.result(WAIT), queued.result(WAIT)
    finally:
        gate.set()
        pool.shutdown()
    assert ran == ["bob", "alice 1", "alice 2"]


def test_a_single_worker_still_serves_one_analyst_alone():
    pool = FairPool(1)
    try:
        assert [pool.submit("alice", abs, -n).result(WAIT) for n in range(3)] == [0, 1, 2]
    finally:
        pool.shutdown()


def test_a_call_cancelled_before_it_starts_never_runs():
    pool = FairPool(1)
    gate, ran = threading.Event(), []
    try:
        pool.submit("a", gate.wait, WAIT)
        waiting = pool.submit("b", ran.append, "b")
        assert waiting.cancel()
        gate.set()
        pool.submit("c", time.sleep, 0).result(WAIT)
    finally:
        gate.set()
        pool.shutdown()
    assert ran == []


def test_a_statement_queued_when_its_user_is_removed_is_refused_when_a_worker_takes_it():
    """The removed-user check runs again when a worker takes the statement: one that waited
    behind others was answered and charged after the curator had removed its user."""
    import asyncio

    from dpsql.server.session import Session, run
    from dpsql.server.statements import Statement

    class QueueingServer:
        names = {"erin"}

        def user_names(self):
            return self.names

        async def answer(self, statement, analyst, function):
            self.names = set()  # the curator removes erin while the statement waits its turn
            return function(statement, analyst, None)

    outcome = asyncio.run(run(QueueingServer(), Session("erin", 1), Statement("query", "SELECT COUNT(*) FROM visits")))
    assert outcome.sqlstate == "28000" and "removed" in outcome.message
