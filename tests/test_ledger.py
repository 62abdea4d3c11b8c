"""The budget ledger: exact sums, atomic refusals, durability, and no overspend under races
between threads, between processes, and across a SIGKILL mid-charge (invariants 2 and 8)."""

from __future__ import annotations

import json
import multiprocessing
import random
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from fractions import Fraction
from pathlib import Path

import pytest

from dpsql.budget.accounting import Tally, accountant_for
from dpsql.budget.ledger import Cancellation, Entry, Ledger, Spend
from dpsql.errors import BudgetExceeded, Cancelled, DPError, InternalError

REPO = Path(__file__).resolve().parents[1]
TENTH = Spend(Fraction(1, 10), Fraction(0))
ONE = Spend(Fraction(1), Fraction(0))

# The ledger needs only dpsql.errors. Child processes register a bare ``dpsql`` package so
# they start in tens of milliseconds instead of importing DuckDB and pandas through
# dpsql/__init__.py, which keeps the races tight and the file well under 30 seconds.
_LEDGER_ONLY = f"""
import sys, types
_package = types.ModuleType("dpsql")
_package.__path__ = [{str(REPO / "dpsql")!r}]
sys.modules["dpsql"] = _package
"""


def charge(ledger: Ledger, cost: Spend, total: Spend, **kwargs) -> int:
    kwargs.setdefault("sql", "SELECT COUNT(*) FROM t")
    kwargs.setdefault("options", {})
    return ledger.charge(cost, total, **kwargs)


def row_count(path: Path) -> int:
    with sqlite3.connect(path) as connection:
        return connection.execute("SELECT count(*) FROM entries").fetchone()[0]


# -- exact arithmetic and refusals -------------------------------------------------------


def test_spend_arithmetic_is_exact():
    total = Spend.zero()
    for _ in range(10):
        total = total + TENTH
    assert total == ONE and total.fits_in(ONE)
    assert Spend.ZERO == Spend(0, 0) and (ONE - TENTH).epsilon == Fraction(9, 10)
    assert not Spend(Fraction(0), Fraction(1, 10**6)).fits_in(ONE)
    with pytest.raises(TypeError, match="exact"):
        Spend(0.1, 0)


def test_ten_tenths_spend_exactly_one():
    with Ledger.open(None) as ledger:
        ids = [charge(ledger, TENTH, ONE) for _ in range(10)]
        assert ids == sorted(set(ids))
        assert ledger.spent() == ONE
        with pytest.raises(BudgetExceeded):
            charge(ledger, Spend(Fraction(1, 10**30), Fraction(0)), ONE)
        assert ledger.spent() == ONE


@pytest.mark.parametrize(
    "cost, words",
    [
        (Spend(Fraction(1, 2), Fraction(0)), ["epsilon 0.5", "only 0.2 remains", "0.3 short"]),
        (Spend(Fraction(1, 10), Fraction(3, 10**6)),
         ["delta 3e-6", "only 2e-6 remains", "1e-6 short"]),
    ],
)
def test_refusal_says_requested_remaining_difference_and_writes_nothing(tmp_path, cost, words):
    path = tmp_path / "ledger.db"
    total = Spend(Fraction(1), Fraction(2, 10**6))
    with Ledger.open(path) as ledger:
        charge(ledger, Spend(Fraction(8, 10), Fraction(0)), total)
        before = ledger.entries()
        with pytest.raises(BudgetExceeded) as refused:
            charge(ledger, cost, total, sql="SELECT 2", key="k")
        other = "delta" if words[0].startswith("epsilon") else "epsilon"
        assert other not in str(refused.value)  # only the exceeded part is named
        for word in words:
            assert word in str(refused.value)
        assert ledger.spent() == Spend(Fraction(8, 10), Fraction(0))
        assert ledger.entries().equals(before)
    assert row_count(path) == 1


def test_refusal_names_both_parts_when_both_are_short():
    with Ledger.open(None) as ledger, pytest.raises(BudgetExceeded) as refused:
        charge(ledger, Spend(Fraction(2), Fraction(1, 3)), ONE)
    message = str(refused.value)
    assert "epsilon 2 but only 1 remains (1 short)" in message
    assert "delta 1/3 (about 0.3333) but only 0 remains" in message


def test_negative_costs_and_unstorable_options_are_bugs_not_refunds():
    with Ledger.open(None) as ledger:
        with pytest.raises(InternalError):
            charge(ledger, Spend(Fraction(-1), Fraction(0)), ONE)
        with pytest.raises(InternalError):
            charge(ledger, TENTH, ONE, options={"x": object()})
        with pytest.raises(InternalError):
            charge(ledger, Spend(Fraction(1, 10), Fraction(0), Fraction(-1)), ONE)
        assert ledger.spent() == Spend.ZERO and len(ledger.entries()) == 0


# -- accountants and per-analyst budgets, decided inside the charge -------------------------

TOTAL = Spend(Fraction(1), Fraction(1, 10**6))
# A Gaussian-like release: delta > 0 keeps every accountant on its own rule (no basic branch).
GAUSSIAN = Spend(Fraction(1, 20), Fraction(1, 10**9), Fraction(1, 1000))


@pytest.mark.parametrize("accounting", ["basic", "advanced", "zcdp"])
def test_the_accountant_decides_inside_the_charge(accounting):
    accountant = accountant_for(accounting, TOTAL)
    expected = accountant.answerable(GAUSSIAN)
    with Ledger.open(None) as ledger:
        for _ in range(expected):
            charge(ledger, GAUSSIAN, accountant)
        with pytest.raises(BudgetExceeded, match="in the total budget"):
            charge(ledger, GAUSSIAN, accountant)
        tally = ledger.tally()
        assert tally.entries == expected and accountant.admits(tally)
        assert tally.rho == expected * GAUSSIAN.rho  # exact, as charged
    assert {"basic": 20, "advanced": 13, "zcdp": 24}[accounting] == expected


def test_analyst_budgets_and_the_total_are_both_checked():
    total = accountant_for("basic", Spend(Fraction(1)))
    each = accountant_for("basic", Spend(Fraction(4, 10)))
    with Ledger.open(None) as ledger:
        for analyst in ("ann", "ann", "ann", "ann", "bob", "bob", "bob", "bob", "cy", "cy"):
            charge(ledger, TENTH, total, analyst=analyst, analyst_total=each)
        with pytest.raises(BudgetExceeded) as refused:
            charge(ledger, TENTH, total, analyst="ann", analyst_total=each)
        assert "the total budget" in str(refused.value)
    with Ledger.open(None) as ledger:
        for _ in range(4):
            charge(ledger, TENTH, total, analyst="ann", analyst_total=each)
        with pytest.raises(BudgetExceeded) as refused:
            charge(ledger, TENTH, total, analyst="ann", analyst_total=each)
        assert "only 0 remains (0.1 short), in analyst ann's budget" in str(refused.value)
        charge(ledger, TENTH, total, analyst="bob", analyst_total=each)  # bob's is his own
        charge(ledger, TENTH, total)  # the curator is held only to the total
        assert ledger.tally("ann").epsilon == Fraction(4, 10)
        assert ledger.tally().epsilon == Fraction(6, 10) and ledger.tally("eve") == Tally()


@pytest.mark.parametrize("accounting", ["advanced", "zcdp"])
def test_threads_racing_per_analyst_budgets_never_overspend(tmp_path, accounting):
    total = accountant_for(accounting, TOTAL)
    each = accountant_for(accounting, Spend(Fraction(1, 2), Fraction(1, 10**6)))
    ledgers = [Ledger.open(tmp_path / "ledger.db") for _ in range(3)]
    barrier = threading.Barrier(12)
    won: dict[str, list[int]] = {}
    failures: list[BaseException] = []

    def spend(ledger: Ledger, analyst: str) -> None:
        barrier.wait()
        while True:
            try:
                won.setdefault(analyst, []).append(
                    charge(ledger, GAUSSIAN, total, analyst=analyst, analyst_total=each))
            except BudgetExceeded:
                return
            except BaseException as failure:  # noqa: BLE001 - reported by the test
                failures.append(failure)
                return

    workers = [threading.Thread(target=spend, args=(ledgers[i % 3], f"a{i % 6}"))
               for i in range(12)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    assert not failures, failures
    tally = ledgers[0].tally()
    assert tally.entries == total.answerable(GAUSSIAN) and total.admits(tally)
    for analyst, ids in won.items():
        assert len(ids) <= each.answerable(GAUSSIAN)
        assert each.admits(ledgers[1].tally(analyst)) and ledgers[2].tally(analyst).entries == len(ids)
    for ledger in ledgers:
        ledger.close()


# -- persistence, salt, answers, entries ----------------------------------------------------


def test_spent_and_salt_survive_reopening(tmp_path):
    path = tmp_path / "ledger.db"
    with Ledger.open(path) as ledger:
        for _ in range(3):
            charge(ledger, Spend(Fraction(1, 3), Fraction(1, 10**7)),
                   Spend(Fraction(1), Fraction(1, 10**6)), analyst="ann")
        charge(ledger, TENTH, Spend(Fraction(2), Fraction(1)), analyst="bob")
        salt = ledger.salt()
    with Ledger.open(str(path)) as ledger:
        assert ledger.spent() == Spend(Fraction(11, 10), Fraction(3, 10**7))
        assert ledger.spent("ann") == Spend(Fraction(1), Fraction(3, 10**7))
        assert ledger.spent("bob") == TENTH and ledger.spent("eve") == Spend.ZERO
        assert ledger.salt() == salt and len(salt) == 32 and isinstance(salt, bytes)
        with pytest.raises(BudgetExceeded):  # reconnecting does not reset the budget
            charge(ledger, TENTH, Spend(Fraction(11, 10), Fraction(1)))


def test_in_memory_ledgers_are_independent():
    with Ledger.open(None) as first, Ledger.open(None) as second:
        charge(first, TENTH, ONE)
        assert second.spent() == Spend.ZERO
        assert first.salt() != second.salt() and first.salt() == first.salt()


def test_salt_is_the_same_across_processes(tmp_path):
    path = tmp_path / "ledger.db"
    script = _LEDGER_ONLY + (f"from dpsql.budget.ledger import Ledger\n"
                             f"print(Ledger.open({str(path)!r}).salt().hex())")
    salts = {_run_python(script).strip() for _ in range(2)}
    with Ledger.open(path) as ledger:
        assert salts == {ledger.salt().hex()}


def test_answers_are_found_by_key_most_recent_first():
    with Ledger.open(None) as ledger:
        first = charge(ledger, TENTH, ONE, key="q1")
        assert ledger.find_answer("q1") is None
        ledger.record_answer(first, '{"n": 41}')
        second = charge(ledger, TENTH, ONE, key="q1")
        assert ledger.find_answer("q1") == '{"n": 41}'  # the second has no answer yet
        ledger.record_answer(second, '{"n": 43}')
        assert ledger.find_answer("q1") == '{"n": 43}' and ledger.find_answer("q2") is None
        ledger.record_answer(second, '{"n": 43}')  # idempotent
        with pytest.raises(InternalError):  # a released answer is never replaced
            ledger.record_answer(second, '{"n": 0}')
        with pytest.raises(InternalError):
            ledger.record_answer(999, "{}")


def _trace(ledger: Ledger) -> list[str]:
    """Every statement the ledger's connection runs from now on."""
    statements: list[str] = []
    ledger._connection.set_trace_callback(statements.append)
    return statements


def _assert_charges_fsync(statements: list[str]) -> None:
    """Every transaction sets synchronous=FULL itself, and begins and commits at it."""
    level = None  # whatever ran before the trace started does not count
    for statement in statements:
        if statement.startswith("PRAGMA synchronous ="):
            level = statement.split("=")[1].strip()
        if statement in ("BEGIN IMMEDIATE", "COMMIT"):
            assert level == "FULL", statements


def test_charges_commit_with_fsync_and_answers_without(tmp_path):
    """Every charge commits at synchronous=FULL (fsync'ed before charge() returns), whatever
    ran before it; an answer is one UPDATE at NORMAL, outside any transaction."""
    with Ledger.open(tmp_path / "ledger.db") as ledger:
        statements = _trace(ledger)
        first = charge(ledger, TENTH, ONE, key="q")
        ledger.record_answer(first, "[[1]]")
        ledger.record_answer(first, "[[1]]")  # idempotent, and writes nothing
        for wrong in ((first, "[[2]]"), (999, "[[3]]")):
            with pytest.raises(InternalError):
                ledger.record_answer(*wrong)
            charge(ledger, TENTH, ONE)
        ledger.salt()
        _assert_charges_fsync(statements)
        assert statements.count("BEGIN IMMEDIATE") == 4  # three charges and the salt
        assert sum(s.startswith("UPDATE") for s in statements) == 4  # one per record_answer
        assert ledger.find_answer("q") == "[[1]]" and ledger.spent() == TENTH + TENTH + TENTH


def test_an_answer_waits_for_the_write_lock_or_fails_clearly(tmp_path, monkeypatch):
    import dpsql.budget.ledger

    path = tmp_path / "ledger.db"
    with Ledger.open(path) as ledger:
        entry_id = charge(ledger, TENTH, ONE, key="q")
        holder = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        holder.execute("BEGIN IMMEDIATE")
        release = threading.Timer(0.3, holder.execute, ("ROLLBACK",))
        started = time.monotonic()
        release.start()
        ledger.record_answer(entry_id, "[[1]]")  # waits for the lock, then writes
        assert time.monotonic() - started >= 0.25
        release.join()
        assert ledger.find_answer("q") == "[[1]]"
        holder.close()
    monkeypatch.setattr(dpsql.budget.ledger, "BUSY_TIMEOUT_SECONDS", 0.2)
    with Ledger.open(path) as ledger:
        entry_id = charge(ledger, TENTH, ONE, key="r")
        holder = sqlite3.connect(path, isolation_level=None)
        holder.execute("BEGIN IMMEDIATE")
        with pytest.raises(DPError, match="could not record an answer.*locked"):
            ledger.record_answer(entry_id, "[[2]]")
        holder.execute("ROLLBACK")
        holder.close()
        assert ledger.find_answer("r") is None and ledger.spent() == TENTH + TENTH  # charged
        statements = _trace(ledger)
        charge(ledger, TENTH, ONE)  # after a failed answer, still fsync'ed
        _assert_charges_fsync(statements)


def test_entries_frame_and_entry(tmp_path):
    options = {"epsilon": Fraction(1, 10), "delta": Fraction(0), "noise": "laplace"}
    with Ledger.open(tmp_path / "ledger.db") as ledger:
        assert list(ledger.entries().columns) == [
            "id", "time", "analyst", "sql", "options", "epsilon", "delta", "rho", "answer"]
        entry_id = charge(ledger, Spend(Fraction(1, 10), Fraction(1, 10**6), Fraction(1, 400)),
                          Spend(Fraction(1), Fraction(1, 10**5)),
                          sql="SELECT 1", options=options, analyst="ann")
        charge(ledger, TENTH, Spend(Fraction(1), Fraction(1, 10**5)), analyst="bob")
        ledger.record_answer(entry_id, "[[1]]")
        frame = ledger.entries()
        row = frame.iloc[0]
        assert row["options"] == '{"delta":"0/1","epsilon":"1/10","noise":"laplace"}'
        assert row["epsilon"] == 0.1 and row["delta"] == 1e-6 and row["answer"] == "[[1]]"
        assert row["rho"] == 0.0025 and frame["rho"].isna().tolist() == [False, True]
        assert ledger.entries("ann")["analyst"].tolist() == ["ann"]
        assert ledger.entries("bob")["analyst"].tolist() == ["bob"] and len(ledger.entries("x")) == 0
        assert row["time"].endswith("+00:00") and row["analyst"] == "ann"
        assert str(frame["epsilon"].dtype) == "float64"
        entry = ledger.entry(entry_id)
        assert isinstance(entry, Entry) and entry.cost.delta == Fraction(1, 10**6)
        assert entry.cost.rho == Fraction(1, 400) and ledger.entry(2).cost.rho is None
        assert json.loads(row["options"]) == entry.options and ledger.entry(99) is None


def test_entries_cannot_be_deleted_or_rewritten(tmp_path):
    path = tmp_path / "ledger.db"
    with Ledger.open(path) as ledger:
        charge(ledger, TENTH, ONE)
    with sqlite3.connect(path) as connection:
        for statement in ("DELETE FROM entries", "UPDATE entries SET epsilon = '0/1'"):
            with pytest.raises(sqlite3.IntegrityError, match="permanent|append-only"):
                connection.execute(statement)


def test_unusable_paths_are_clear_errors(tmp_path):
    with pytest.raises(DPError, match="cannot open the ledger at .*writable path"):
        Ledger.open(tmp_path / "missing" / "ledger.db")
    not_sqlite = tmp_path / "notes.txt"
    not_sqlite.write_text("hello, this is not a database" * 100)
    not_sqlite.chmod(0o600)  # the curator's alone, as a ledger must be (tests/test_secret_files.py)
    with pytest.raises(DPError, match="cannot open the ledger"):
        Ledger.open(not_sqlite)
    other = tmp_path / "other.db"
    with sqlite3.connect(other) as connection:
        connection.execute("CREATE TABLE t (x)")
    other.chmod(0o600)
    with pytest.raises(DPError, match="not a dpsql ledger"):
        Ledger.open(other)
    ledger = Ledger.open(None)
    ledger.close()
    with pytest.raises(InternalError, match="closed"):
        ledger.spent()


def test_a_charge_that_cannot_get_the_write_lock_fails_and_writes_nothing(tmp_path, monkeypatch):
    import dpsql.budget.ledger

    monkeypatch.setattr(dpsql.budget.ledger, "BUSY_TIMEOUT_SECONDS", 0.2)
    path = tmp_path / "ledger.db"
    with Ledger.open(path) as ledger:
        holder = sqlite3.connect(path, isolation_level=None)
        holder.execute("BEGIN IMMEDIATE")
        with pytest.raises(DPError, match="locked; nothing was charged") as failed:
            charge(ledger, TENTH, ONE)
        assert not isinstance(failed.value, BudgetExceeded)
        holder.execute("ROLLBACK")
        holder.close()
        assert ledger.spent() == Spend.ZERO and charge(ledger, TENTH, ONE) == 1


def test_a_cancel_while_a_charge_waits_for_the_lock_rolls_it_back_and_one_after_it_commits_leaves_it(tmp_path):
    """A cancel that arrives while the charge waits for SQLite's write lock is honoured once it
    has the lock: rolled back, ``Cancelled``, nothing written. One after the commit changes
    nothing: the entry stays, ``charged`` says so, and a later charge of the same call says that
    what it charged before stays charged."""
    path = tmp_path / "ledger.db"
    with Ledger.open(path) as ledger:
        waiting = threading.Event()
        ledger._connection.set_trace_callback(lambda sql: waiting.set() if sql == "BEGIN IMMEDIATE" else None)
        holder = sqlite3.connect(path, isolation_level=None)
        holder.execute("BEGIN IMMEDIATE")
        cancel = Cancellation()
        failed: list[BaseException] = []

        def charging() -> None:
            try:
                charge(ledger, TENTH, ONE, cancel=cancel)
            except BaseException as error:  # noqa: BLE001 - the test reads it
                failed.append(error)

        thread = threading.Thread(target=charging, daemon=True)
        thread.start()
        assert waiting.wait(30)  # past the first check: waiting for the lock
        cancel.request()
        holder.execute("ROLLBACK")
        thread.join(30)
        assert len(failed) == 1 and isinstance(failed[0], Cancelled) and "nothing was charged" in str(failed[0])
        assert not cancel.charged and row_count(path) == 0 and ledger.spent() == Spend.ZERO
        ledger._connection.set_trace_callback(None)
        holder.close()

        after = Cancellation()
        entry_id = charge(ledger, TENTH, ONE, cancel=after)
        after.request()
        assert after.charged and ledger.entry(entry_id) is not None and ledger.spent() == TENTH
        with pytest.raises(Cancelled, match="what it had charged before stays charged"):
            charge(ledger, TENTH, ONE, cancel=after)
        assert row_count(path) == 1


def test_file_is_in_wal_mode_with_a_schema_version(tmp_path):
    path = tmp_path / "ledger.db"
    Ledger.open(path).close()
    with sqlite3.connect(path) as connection:
        assert connection.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        assert connection.execute(
            "SELECT value FROM meta WHERE key = 'schema_version'").fetchone()[0] == 1
        columns = {row[1] for row in connection.execute("PRAGMA table_info(entries)")}
        assert {"epsilon", "delta", "rho", "key", "answer"} <= columns


# -- races ------------------------------------------------------------------------------


def _race_threads(ledgers: list[Ledger], threads: int) -> list[int]:
    barrier = threading.Barrier(threads)
    won: list[int] = []
    failures: list[BaseException] = []

    def spend(ledger: Ledger) -> None:
        barrier.wait()
        while True:
            try:
                won.append(charge(ledger, TENTH, ONE))
            except BudgetExceeded:
                return
            except BaseException as failure:  # noqa: BLE001 - reported by the test
                failures.append(failure)
                return

    workers = [threading.Thread(target=spend, args=(ledgers[i % len(ledgers)],))
               for i in range(threads)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    assert not failures, failures
    return won


def test_sixteen_threads_spend_exactly_the_budget_in_memory():
    with Ledger.open(None) as ledger:
        won = _race_threads([ledger], 16)
        assert len(won) == 10 and len(set(won)) == 10 and ledger.spent() == ONE


def test_sixteen_threads_over_four_connections_spend_exactly_the_budget(tmp_path):
    ledgers = [Ledger.open(tmp_path / "ledger.db") for _ in range(4)]
    won = _race_threads(ledgers, 16)
    assert len(won) == 10 and len(set(won)) == 10
    assert all(ledger.spent() == ONE for ledger in ledgers)
    for ledger in ledgers:
        ledger.close()


# Run by each racing process with ``path``, ``barrier`` and ``results`` as its globals:
# charge 1/10 of a budget of 3 until refused, then report the ids it won.
_SPEND_UNTIL_REFUSED = _LEDGER_ONLY + """
from fractions import Fraction
from dpsql.errors import BudgetExceeded
from dpsql.budget.ledger import Ledger, Spend
won = []
try:
    with Ledger.open(path) as ledger:
        barrier.wait()
        while True:
            try:
                won.append(ledger.charge(Spend(Fraction(1, 10)), Spend(Fraction(3)),
                                         sql="SELECT 1", options={}))
            except BudgetExceeded:
                break
except BaseException as failure:
    results.put(repr(failure))
else:
    results.put(won)
"""


def test_four_processes_never_overspend(tmp_path):
    path = str(tmp_path / "ledger.db")
    Ledger.open(path).close()
    context = multiprocessing.get_context("spawn")
    barrier, results = context.Barrier(4), context.Queue()
    shared = {"path": path, "barrier": barrier, "results": results}
    processes = [context.Process(target=exec, args=(_SPEND_UNTIL_REFUSED, shared))
                 for _ in range(4)]
    for process in processes:
        process.start()
    won = [results.get(timeout=60) for _ in processes]
    assert all(isinstance(ids, list) for ids in won), won
    for process in processes:
        process.join(timeout=60)
        assert process.exitcode == 0
    ids = [entry_id for ids in won for entry_id in ids]
    assert len(ids) == 30 and len(set(ids)) == 30
    with Ledger.open(path) as ledger:
        assert ledger.spent() == Spend(Fraction(3), Fraction(0))
    assert row_count(Path(path)) == 30


# Like _SPEND_UNTIL_REFUSED, under a named accountant, as one analyst with a budget of its own.
_SPEND_AS_ANALYST = _LEDGER_ONLY + """
from fractions import Fraction
from dpsql.budget.accounting import accountant_for
from dpsql.errors import BudgetExceeded
from dpsql.budget.ledger import Ledger, Spend
won = []
cost = Spend(Fraction(1, 20), Fraction(1, 10**9), Fraction(1, 1000))
total = accountant_for(accounting, Spend(Fraction(1), Fraction(1, 10**6)))
each = accountant_for(accounting, Spend(Fraction(11, 20), Fraction(1, 10**6)))
try:
    with Ledger.open(path) as ledger:
        barrier.wait()
        while True:
            try:
                won.append(ledger.charge(cost, total, sql="SELECT 1", options={},
                                         analyst=analyst, analyst_total=each))
            except BudgetExceeded:
                break
except BaseException as failure:
    results.put(repr(failure))
else:
    results.put((analyst, won))
"""


def test_processes_racing_under_zcdp_with_analyst_budgets_never_overspend(tmp_path):
    path = str(tmp_path / "ledger.db")
    Ledger.open(path).close()
    context = multiprocessing.get_context("spawn")
    barrier, results = context.Barrier(4), context.Queue()
    processes = [context.Process(target=exec, args=(_SPEND_AS_ANALYST, {
        "path": path, "barrier": barrier, "results": results, "accounting": "zcdp",
        "analyst": f"a{i % 3}"})) for i in range(4)]
    for process in processes:
        process.start()
    won = [results.get(timeout=60) for _ in processes]
    assert all(isinstance(item, tuple) for item in won), won
    for process in processes:
        process.join(timeout=60)
        assert process.exitcode == 0
    total = accountant_for("zcdp", TOTAL)
    each = accountant_for("zcdp", Spend(Fraction(11, 20), Fraction(1, 10**6)))
    per_analyst = {}
    for analyst, ids in won:
        per_analyst[analyst] = per_analyst.get(analyst, 0) + len(ids)
    with Ledger.open(path) as ledger:
        tally = ledger.tally()
        # three analysts of 7 each would be 21, but the total admits 24: every analyst is full
        assert each.answerable(GAUSSIAN) == 7 and total.answerable(GAUSSIAN) == 24
        assert per_analyst == {"a0": 7, "a1": 7, "a2": 7} and tally.entries == 21
        assert total.admits(tally) and all(each.admits(ledger.tally(a)) for a in per_analyst)


def test_a_forked_child_reopens_the_file_and_cannot_use_a_memory_ledger(tmp_path):
    context = multiprocessing.get_context("fork")
    with Ledger.open(tmp_path / "ledger.db") as on_file, Ledger.open(None) as in_memory:
        charge(on_file, TENTH, ONE)
        for ledger, expected in ((on_file, int), (in_memory, str)):
            results = context.Queue()

            def in_child(ledger=ledger, results=results) -> None:
                try:
                    results.put(charge(ledger, TENTH, ONE))
                except DPError as refused:
                    results.put(str(refused))

            child = context.Process(target=in_child)
            child.start()
            answer = results.get(timeout=30)
            child.join(timeout=30)
            assert isinstance(answer, expected), answer
        assert "forked" in answer and in_memory.spent() == Spend.ZERO
        assert on_file.spent() == TENTH + TENTH and charge(on_file, TENTH, ONE) == 3


# -- crashes ----------------------------------------------------------------------------

_CHARGE_FOREVER = _LEDGER_ONLY + """
from fractions import Fraction
from dpsql.budget.ledger import Ledger, Spend
ledger = Ledger.open(sys.argv[1])
cost, total = Spend(Fraction(1, 1000)), Spend(Fraction(10**6))
while True:
    entry_id = ledger.charge(cost, total, sql="SELECT 1", options={"round": sys.argv[2]})
    print(entry_id, flush=True)
"""


def _run_python(script: str, *args: str, **popen) -> str | subprocess.Popen:
    """Run ``script`` in a fresh interpreter: started (with ``popen`` arguments) or to its end."""
    command = [sys.executable, "-c", script, *args]
    if popen:
        return subprocess.Popen(command, **popen)
    return subprocess.run(command, check=True, capture_output=True, text=True).stdout


def test_sigkill_while_charging_loses_no_committed_charge(tmp_path):
    path = tmp_path / "ledger.db"
    rng = random.Random(20240601)
    reported: list[int] = []
    for round_number in range(6):
        child = _run_python(_CHARGE_FOREVER, str(path), str(round_number),
                            stdout=subprocess.PIPE, text=True)
        reported.append(int(child.stdout.readline()))  # it is charging now
        time.sleep(rng.uniform(0.0, 0.25))
        child.send_signal(signal.SIGKILL)
        child.wait()
        reported += [int(line) for line in child.stdout.read().split()]
        child.stdout.close()

        with sqlite3.connect(path) as connection:
            assert connection.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
            ids = {row[0] for row in connection.execute("SELECT id FROM entries")}
        assert set(reported) <= ids  # every charge the child saw committed is there
        with Ledger.open(path) as ledger:
            spent = ledger.spent()
        assert spent == Spend(Fraction(len(ids), 1000))
        # at most one charge per round committed without being reported (killed between
        # COMMIT and print): the ledger may hold more than was used, never less
        assert len(reported) <= len(ids) <= len(reported) + round_number + 1
        assert spent.fits_in(Spend(Fraction(10**6)))
    assert len(reported) > 12


# Charges a small zCDP budget (two analysts' own, and the total), records each answer, then
# reports the entry id: an id printed is an answer the analyst saw.
_CHARGE_AND_ANSWER = _LEDGER_ONLY + """
from fractions import Fraction
from dpsql.budget.accounting import accountant_for
from dpsql.errors import BudgetExceeded
from dpsql.budget.ledger import Ledger, Spend
ledger = Ledger.open(sys.argv[1])
cost = Spend(Fraction(1, 100), Fraction(1, 10**9), Fraction(1, 20000))
total = accountant_for("zcdp", Spend(Fraction(1, 2), Fraction(1, 10**6)))
each = accountant_for("zcdp", Spend(Fraction(2, 5), Fraction(1, 10**6)))
n = 0
while True:
    analyst = ("ann", "bob")[n % 2]
    n += 1
    try:
        entry_id = ledger.charge(cost, total, sql="SELECT 1", options={}, analyst=analyst,
                                 analyst_total=each, key=f"{sys.argv[2]}-{n}")
    except BudgetExceeded:
        print("full", flush=True)
        break
    ledger.record_answer(entry_id, f"[[{entry_id}]]")
    print(entry_id, flush=True)
"""


def test_sigkill_in_a_loop_never_loses_a_seen_answer_nor_overspends(tmp_path):
    """Kill a charging process at random moments until its small budget is gone: after every
    kill the file is intact, every answer seen is charged and stored, and no budget — the
    total or an analyst's — is exceeded; in the end exactly the admissible charges exist."""
    path = tmp_path / "ledger.db"
    total = accountant_for("zcdp", Spend(Fraction(1, 2), Fraction(1, 10**6)))
    each = accountant_for("zcdp", Spend(Fraction(2, 5), Fraction(1, 10**6)))
    cost = Spend(Fraction(1, 100), Fraction(1, 10**9), Fraction(1, 20000))
    rng = random.Random(20240602)
    seen: list[int] = []
    full = False
    for round_number in range(9):  # eight kills at random moments, then a run to the end
        child = _run_python(_CHARGE_AND_ANSWER, str(path), str(round_number),
                            stdout=subprocess.PIPE, text=True)
        first = child.stdout.readline().strip()
        if first != "full" and round_number < 8:
            time.sleep(rng.uniform(0.0, 0.04))
            child.send_signal(signal.SIGKILL)
        child.wait()
        lines = [first, *child.stdout.read().split()]
        child.stdout.close()
        full = full or "full" in lines
        seen += [int(line) for line in lines if line.isdigit()]
        with sqlite3.connect(path) as connection:
            assert connection.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
            answers = dict(connection.execute("SELECT id, answer FROM entries"))
        assert all(answers[i] == f"[[{i}]]" for i in seen)  # seen: charged and stored
        with Ledger.open(path) as ledger:
            assert total.admits(ledger.tally()) and ledger.tally().entries == len(answers)
            assert each.admits(ledger.tally("ann")) and each.admits(ledger.tally("bob"))
    assert full, "the last round runs until the budget is gone"
    with Ledger.open(path) as ledger:
        assert ledger.tally().entries == total.answerable(cost)
