"""Many threads and many connections in one process spend one budget exactly (issue 12, item 4).

DuckDB keeps one instance per file per process, and dpsql's bounded copies live in an
in-memory database attached to that instance, so every connection on one file shares them
(``dpsql.backends.duckdb``); the ledger is one SQLite file that many connections open at once
(``dpsql.budget.ledger``). Contention may make a query wait, never fail: a charge is followed by an
answer, and the budget ends spent to the last tenth, not beyond.
"""

from __future__ import annotations

import collections
import multiprocessing
import sqlite3
import threading
import time
from fractions import Fraction
from pathlib import Path

import pytest

import dpsql
from dpsql.budget import ledger as ledger_module
from dpsql.budget.accounting import Spend
from dpsql.budget.ledger import Ledger
from dpsql.demo import SHOP_POLICY

THREADS = 16
QUERIES_PER_THREAD = 3
POLICY = SHOP_POLICY.replace("BUDGET EPSILON 3.0", "BUDGET EPSILON 1.6")


@pytest.fixture
def shop(built, tmp_path) -> Path:
    """A fresh copy of the database: no ledger yet, so the first connects also create it."""
    path = tmp_path / "shop.duckdb"
    path.write_bytes(built.read_bytes())
    return path


def spend_from_threads(connect) -> collections.Counter:
    """Each of THREADS threads gets a connection from ``connect`` (at the same moment) and
    asks QUERIES_PER_THREAD distinct queries of epsilon 0.1 (distinct, so none is a free
    repeat); returns how each query ended."""
    outcomes: collections.Counter = collections.Counter()
    lock = threading.Lock()
    start = threading.Barrier(THREADS)

    def record(outcome: str) -> None:
        with lock:
            outcomes[outcome] += 1

    def work(thread: int) -> None:
        start.wait()
        try:
            db = connect()
        except Exception as error:  # any failure to connect is a failure of this test
            record(f"connect failed: {type(error).__name__}: {error}")
            return
        for query in range(QUERIES_PER_THREAD):
            sql = (f"SELECT COUNT(*) AS n, SUM(amount) AS s FROM visits "
                   f"WHERE age > {thread * QUERIES_PER_THREAD + query}")
            try:
                db.sql(sql, epsilon=0.1)
                record("answered")
            except dpsql.BudgetExceeded:
                record("over budget")
            except Exception as error:
                record(f"{type(error).__name__}: {error}")

    threads = [threading.Thread(target=work, args=(i,)) for i in range(THREADS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=300)
    return outcomes


def assert_spent_exactly(shop: Path, outcomes: collections.Counter) -> None:
    assert outcomes == {"answered": 16, "over budget": THREADS * QUERIES_PER_THREAD - 16}, outcomes
    with dpsql.connect(shop, policy=POLICY) as db:
        assert db.budget.spent.epsilon == Fraction(8, 5)
        charges = db.ledger()
        assert len(charges) == 16 and charges["answer"].notna().all()  # every charge answered


def test_sixteen_threads_on_one_connection_spend_the_budget_exactly(shop):
    with dpsql.connect(shop, policy=POLICY) as db:
        outcomes = spend_from_threads(lambda: db)
    assert_spent_exactly(shop, outcomes)


def test_sixteen_connections_to_one_file_spend_the_budget_exactly(shop):
    opened, lock = [], threading.Lock()

    def connect():
        db = dpsql.connect(shop, policy=POLICY)
        with lock:
            opened.append(db)
        return db

    try:
        outcomes = spend_from_threads(connect)
    finally:
        for db in opened:
            db.close()
    assert len(opened) == THREADS
    assert_spent_exactly(shop, outcomes)


def test_connections_on_one_file_share_the_bounded_copies_and_build_each_once(shop, monkeypatch):
    from dpsql.backends import bounding

    built = []
    original = bounding.fill_sql
    monkeypatch.setattr("dpsql.backends.duckdb.fill_sql", lambda table: built.append(table.name) or original(table))
    with dpsql.connect(shop, policy=POLICY) as first, dpsql.connect(shop, policy=POLICY) as second:
        first.sql("SELECT COUNT(*) FROM visits", epsilon=0.1)
        second.sql("SELECT COUNT(*) FROM visits WHERE age > 30", epsilon=0.1)
        assert built == ["dp_bounded_visits__user_id__10"]
        second.refresh()  # the data changed: rebuilt once more, for both
        first.sql("SELECT COUNT(*) FROM visits WHERE age > 40", epsilon=0.1)
        second.sql("SELECT COUNT(*) FROM visits WHERE age > 50", epsilon=0.1)
        assert built == ["dp_bounded_visits__user_id__10"] * 2


def test_a_closed_and_reopened_file_builds_its_copies_again(shop):
    """DuckDB drops an instance when its last connection closes: the copies go with it, and
    the next connection must not believe they are still there."""
    for age in (30, 40):
        with dpsql.connect(shop, policy=POLICY) as db:
            assert db.sql(f"SELECT COUNT(*) AS n FROM visits WHERE age > {age}", epsilon=0.1).fetchall()


class _BusyOnce:
    """A connection whose journal-mode switch finds the file locked a few times first, as
    SQLite reports it (at once, without its busy handler) while another opener converts it."""

    def __init__(self, connection: sqlite3.Connection, failures: int):
        self.connection, self.failures, self.tries = connection, failures, 0

    def execute(self, statement: str, *args):
        if statement.startswith("PRAGMA journal_mode"):
            self.tries += 1
            if self.tries <= self.failures:
                raise sqlite3.OperationalError("database is locked")
        return self.connection.execute(statement, *args)


def test_switching_a_new_ledger_to_wal_waits_out_other_openers(tmp_path):
    connection = sqlite3.connect(tmp_path / "new.ledger")
    busy = _BusyOnce(connection, failures=3)
    ledger_module._use_wal(busy)
    assert busy.tries == 4
    assert connection.execute("PRAGMA journal_mode").fetchone() == ("wal",)
    connection.close()


def test_a_ledger_that_stays_locked_is_reported_after_the_busy_timeout(tmp_path, monkeypatch):
    monkeypatch.setattr(ledger_module, "BUSY_TIMEOUT_SECONDS", 0.05)
    connection = sqlite3.connect(tmp_path / "new.ledger")
    with pytest.raises(sqlite3.OperationalError, match="locked"):
        ledger_module._use_wal(_BusyOnce(connection, failures=10**9))
    connection.close()


def _open_and_charge(path: str, start: float) -> str:
    while time.time() < start:
        pass
    try:
        with Ledger.open(path) as ledger:
            ledger.salt()
            ledger.charge(Spend(Fraction(1, 10)), Spend(Fraction(100)), sql="SELECT 1", options={})
        return "ok"
    except Exception as error:
        return repr(error)


def test_processes_opening_one_new_ledger_at_once_all_succeed(tmp_path):
    """Every process creating the same ledger at the same moment opens it and charges it."""
    context = multiprocessing.get_context("fork")
    with context.Pool(8) as pool:
        for trial in range(6):
            path = str(tmp_path / f"fresh{trial}.ledger")
            start = time.time() + 0.2
            results = pool.starmap(_open_and_charge, [(path, start)] * 8)
            assert results == ["ok"] * 8
            with Ledger.open(path) as ledger:
                assert ledger.spent().epsilon == Fraction(8, 10)


def test_a_charge_waits_for_another_writer_instead_of_failing(tmp_path):
    """SQLite's busy timeout: a charge while another connection holds the write lock waits
    for it (up to BUSY_TIMEOUT_SECONDS) and then commits."""
    path = tmp_path / "held.ledger"
    with Ledger.open(path) as ledger:
        assert ledger._connect().execute("PRAGMA busy_timeout").fetchone() == (
            int(ledger_module.BUSY_TIMEOUT_SECONDS * 1000),)
        holder = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        holder.execute("BEGIN IMMEDIATE")
        release = threading.Timer(0.5, lambda: holder.execute("COMMIT"))
        release.start()
        started = time.monotonic()
        ledger.charge(Spend(Fraction(1, 10)), Spend(Fraction(1)), sql="SELECT 1", options={})
        assert time.monotonic() - started >= 0.4
        release.join()
        holder.close()
        assert ledger.spent().epsilon == Fraction(1, 10)


def test_one_new_query_sent_from_many_threads_at_once_is_charged_once(shop):
    """Identical queries racing on one connection: one is answered fresh and charged, the others
    wait for it and get its stored answer back as free repeats (none is charged again)."""
    answers: list = []
    lock = threading.Lock()
    with dpsql.connect(shop, policy=POLICY) as db:
        start = threading.Barrier(8)

        def ask() -> None:
            start.wait()
            result = db.sql("SELECT store, COUNT(*) AS n FROM visits GROUP BY store", epsilon=0.1)
            with lock:
                answers.append((result.fetchall(), result.cost.epsilon))

        threads = [threading.Thread(target=ask) for _ in range(8)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=300)
        assert len(answers) == 8
        assert sorted(cost for _, cost in answers) == [0] * 7 + [Fraction(1, 10)]
        assert len({tuple(rows) for rows, _ in answers}) == 1
        assert db.budget.spent.epsilon == Fraction(1, 10)
