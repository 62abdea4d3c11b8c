"""The executor (``dpsql.query.executor``): charge first, then run, release and record; a failure after
the charge says only that the charged query failed."""

from __future__ import annotations

import pytest

from dpsql.backends.rewrite import BoundedStatement
from dpsql.errors import BudgetExceeded, QueryFailed
from dpsql.query.executor import QUERY_FAILED, Executor


class FakeLedger:
    def __init__(self):
        self.charged, self.answers = [], {}

    def salt(self) -> bytes:
        return b"\x01\x02"

    def record_answer(self, entry: int, text: str) -> None:
        self.answers[entry] = text


class FakeEngine:
    timeout = 30.0  # the per-statement limit the executor bounds a request's time by

    def __init__(self, rows=None, error=None):
        self.calls, self.rows, self.error = [], rows or [(7,)], error

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
    released = Executor(ledger, engine).execute_adaptive(charge_into(ledger), run, statements=4)
    assert released == [3, 3, 3, 3] and len(engine.calls) == 4 and ledger.answers == {}
