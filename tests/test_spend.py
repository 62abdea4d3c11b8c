"""One way to spend (STYLE.md 16, ``dpsql.query.spend``): the spender owns lock, free repeat, charge,
run, release and record; no other module charges the ledger, and no mechanism reaches into the
connection's private attributes."""

from __future__ import annotations

import ast
import re
import threading
from fractions import Fraction
from pathlib import Path

import pandas as pd
import pytest

import dpsql
from dpsql.budget.accounting import Spend
from dpsql.errors import BudgetExceeded, InternalError
from dpsql.query.spend import Price

PACKAGE = Path(dpsql.__file__).resolve().parent
POLICY = "BUDGET EPSILON 2; PRIVATE TABLE t (PRIVACY UNIT uid, MAX ROWS PER UNIT 1);"


@pytest.fixture
def db():
    with dpsql.connect({"t": pd.DataFrame({"uid": range(10)})}, policy=POLICY) as connection:
        yield connection


def test_only_the_spender_charges_the_ledger():
    charging = set()
    for path in PACKAGE.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "charge":
                charging.add(str(path.relative_to(PACKAGE)))
    assert charging == {"query/spend.py"}


def test_no_module_reaches_into_the_connection():
    private = re.compile(r"\b(connection|conn|db|context|self\._db)\._[a-z]")
    found = [f"{path.relative_to(PACKAGE)}:{number}" for path in PACKAGE.rglob("*.py") if path.name != "connection.py"
             for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1) if private.search(line)]
    assert found == []


def test_a_repeat_is_replayed_free_without_running(db):
    spender = db.mechanism_context().spender
    price = Price(Spend(Fraction(1, 2), Fraction(0)), "TEST", {"epsilon": "1/2"}, key="test:1")
    runs = []

    def run(fetch):
        runs.append(1)
        return "released"

    first = spender.spend(price, run, str, lambda text: text)
    again = spender.spend(price, run, str, lambda text: text)
    assert (first.released, first.repeat, first.cost.epsilon) == ("released", False, Fraction(1, 2))
    assert (again.released, again.repeat, again.entry, again.cost.epsilon) == ("released", True, None, 0)
    assert runs == [1] and db.budget.spent.epsilon == Fraction(1, 2) == again.budget.spent.epsilon


def test_identical_requests_wait_for_each_other_and_are_charged_once(db):
    spender = db.mechanism_context().spender
    price = Price(Spend(Fraction(1, 2), Fraction(0)), "TEST", key="test:same")
    started, results = threading.Event(), []

    def slow(fetch):
        started.set()
        threading.Event().wait(0.2)
        return "once"

    thread = threading.Thread(target=lambda: results.append(spender.spend(price, slow, str, lambda t: t)))
    thread.start()
    started.wait()
    results.append(spender.spend(price, slow, str, lambda t: t))
    thread.join()
    assert sorted(r.repeat for r in results) == [False, True] and db.budget.spent.epsilon == Fraction(1, 2)


def test_a_refused_charge_runs_nothing(db):
    spender = db.mechanism_context().spender
    ran = []
    with pytest.raises(BudgetExceeded):
        spender.spend(Price(Spend(Fraction(3), Fraction(0)), "TEST"), lambda fetch: ran.append(1))
    assert ran == [] and db.budget.spent.epsilon == 0


def test_statements_handed_over_are_the_statements_priced(db):
    spender = db.mechanism_context().spender
    with pytest.raises(InternalError, match="priced at 2 statements hands over 0"):
        spender.spend_statements(Price(Spend(Fraction(1), Fraction(0)), "TEST", statements=2), [], lambda rows: rows)


def test_a_view_spends_as_its_analyst_with_the_same_locks(db):
    view = db.acting_for("alice").mechanism_context().spender
    spender = db.mechanism_context().spender
    assert (view.analyst, spender.analyst) == ("alice", None) and view._held is spender._held and view._guard is spender._guard
    view.spend(Price(Spend(Fraction(1, 4), Fraction(0)), "TEST"), lambda fetch: None)
    assert db.ledger()["analyst"].tolist() == ["alice"]


def test_a_quote_is_what_a_request_would_meet(db):
    quote = db.mechanism_context().spender.quote(Spend(Fraction(3), Fraction(0)), None)
    assert isinstance(quote.refusal, BudgetExceeded) and "it would be refused" in quote.text
    assert db.budget.spent.epsilon == 0


def test_requests_of_different_keys_never_wait_on_each_other(db):
    """Each repeat key has its own answer lock: 65 requests of distinct keys all run at once (with a
    fixed 64 locks picked by hash, two of them always shared one, and one waited out the other's
    whole run: an over-the-wire test saw one analyst's held query hold up another's)."""
    spender = db.mechanism_context().spender
    together = threading.Barrier(65, timeout=20)  # passes only when all 65 runs are inside at once
    failures: list = []

    def ask(number: int) -> None:
        price = Price(Spend(Fraction(1, 100), Fraction(0)), "TEST", {}, key=f"test:{number}")
        try:
            spender.spend(price, lambda fetch: together.wait(), str, lambda text: text)
        except Exception as error:  # noqa: BLE001 - the test reads it
            failures.append(error)

    threads = [threading.Thread(target=ask, args=(n,)) for n in range(65)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert failures == [] and db.budget.spent.epsilon == Fraction(65, 100)
