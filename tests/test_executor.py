"""The executor (``dpsql.executor``): charge first, then run, release and record; a failure after
the charge says only that the charged query failed."""

from __future__ import annotations

import pytest

from dpsql.backends.rewrite import BoundedStatement
from dpsql.errors import BudgetExceeded, QueryFailed
from dpsql.executor import COPY_FAILED, QUERY_FAILED, Executor


class FakeLedger:
    def __init__(self):
        self.charged, self.answers = [], {}

    def salt(self) -> bytes:
        return b"\x01\x02"

    def record_answer(self, entry: int, text: str) -> None:
        self.answers[entry] = text


class FakeEngine:
    def __init__(self, rows=None, error=None, fill_error=None):
        self.calls, self.rows, self.error = [], rows or [(7,)], error
        self.filled, self.fill_error = [], fill_error

    def fill_bounded(self, tables):
        self.filled.append(tuple(tables))
        if self.fill_error is not None:
            raise self.fill_error

    def fetch(self, sql, parameters=None, *, bounded=()):
        self.calls.append((sql, parameters, tuple(bounded)))
        if self.error is not None:
            raise self.error
        return self.rows


SALTED = BoundedStatement("SELECT salted", True, ("t",))
PLAIN = BoundedStatement("SELECT plain", False, ())


def charge_into(ledger: FakeLedger):
    def charge() -> int:
        ledger.charged.append(len(ledger.charged) + 1)
        return ledger.charged[-1]
    return charge


def test_statements_run_after_the_charge_with_their_salt_and_copies_and_the_release_is_recorded():
    ledger, engine = FakeLedger(), FakeEngine()
    released = Executor(ledger, engine).execute(charge_into(ledger), [SALTED, PLAIN],
                                                lambda fetched: sum(rows[0][0] for rows in fetched), str)
    assert released == 14 and ledger.charged == [1] and ledger.answers == {1: "14"}
    assert engine.calls == [("SELECT salted", {"salt": "0102"}, ("t",)), ("SELECT plain", None, ())]


def test_a_refused_charge_reads_nothing():
    ledger, engine = FakeLedger(), FakeEngine()

    def refused() -> int:
        raise BudgetExceeded("over budget")
    with pytest.raises(BudgetExceeded):
        Executor(ledger, engine).execute(refused, [PLAIN], lambda fetched: fetched, str)
    assert engine.calls == [] and ledger.answers == {}


@pytest.mark.parametrize("where", ["engine", "release"])
def test_a_failure_after_the_charge_says_only_that_the_charged_query_failed(where):
    secret = RuntimeError("value 'alice@example.com' of column email; salt 0102")
    ledger = FakeLedger()
    engine = FakeEngine(error=secret if where == "engine" else None)

    def release(fetched):
        raise secret
    with pytest.raises(QueryFailed) as failed:
        Executor(ledger, engine).execute(charge_into(ledger), [PLAIN], release, str)
    assert str(failed.value).startswith(QUERY_FAILED) and "alice" not in str(failed.value)
    assert failed.value.__cause__ is None and failed.value.__suppress_context__
    assert ledger.charged == [1] and ledger.answers == {}  # charged, and nothing kept as an answer


def test_an_adaptive_mechanism_runs_statements_chosen_from_earlier_results():
    ledger, engine = FakeLedger(), FakeEngine(rows=[(3,)])

    def run(fetch):
        first = fetch(PLAIN)[0][0]
        return [first, *(fetch(SALTED)[0][0] for _ in range(first))]
    released = Executor(ledger, engine).execute_adaptive(charge_into(ledger), run)
    assert released == [3, 3, 3, 3] and len(engine.calls) == 4 and ledger.answers == {}


def test_copies_are_built_before_the_charge():
    ledger, engine = FakeLedger(), FakeEngine()

    def charge() -> int:
        assert engine.filled == [("t",)], "the charge came before the copy was built"
        return charge_into(ledger)()
    Executor(ledger, engine).execute(charge, [SALTED, PLAIN, SALTED], lambda fetched: 0, str)
    assert engine.filled == [("t",)] and ledger.charged == [1]


def test_a_copy_that_cannot_be_built_charges_nothing_and_quotes_nothing():
    ledger = FakeLedger()
    engine = FakeEngine(fill_error=MemoryError("value 'alice@example.com' of column email"))
    with pytest.raises(QueryFailed) as failed:
        Executor(ledger, engine).execute(charge_into(ledger), [SALTED], lambda fetched: fetched, str)
    assert str(failed.value).startswith(COPY_FAILED) and "alice" not in str(failed.value)
    assert ledger.charged == [] and engine.calls == []


def test_a_first_query_whose_copy_fails_to_build_is_not_charged(monkeypatch):
    import duckdb

    import dpsql
    con = duckdb.connect()
    con.execute("CREATE TABLE t AS SELECT i AS uid, i % 7 AS x FROM range(100) r(i)")
    policy = "BUDGET EPSILON 10; PRIVATE TABLE t (PRIVACY UNIT uid, MAX ROWS PER UNIT 1);"
    with dpsql.connect(con, policy=policy) as db:  # copies built lazily, by the first query
        built = db._engine._build_copy

        def out_of_memory(*arguments):
            raise duckdb.OutOfMemoryException("could not allocate while reading a private row")
        monkeypatch.setattr(db._engine, "_build_copy", out_of_memory)
        with pytest.raises(QueryFailed, match="nothing was charged"):
            db.sql("SELECT COUNT(*) FROM t", epsilon=1)
        assert db.budget.spent.epsilon == 0 and len(db.ledger()) == 0
        monkeypatch.setattr(db._engine, "_build_copy", built)
        assert abs(db.sql("SELECT COUNT(*) FROM t", epsilon=5).fetchall()[0][0] - 100) < 20
        assert db.budget.spent.epsilon == 5
