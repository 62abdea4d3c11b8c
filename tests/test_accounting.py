"""Privacy accounting: the three filters, their exact checks and safe roundings, the budget an
analyst sees, per-analyst budgets, free repeats and explain, end to end."""

from __future__ import annotations

import math
import sqlite3
from fractions import Fraction
from types import SimpleNamespace

import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import dpsql
from dpsql.budget.accounting import (
    ACCOUNTINGS,
    Spend,
    Tally,
    accountant_for,
    epsilon_of_rho,
    query_cost,
    rho_budget,
    show,
)
from dpsql.errors import BudgetExceeded, DPError, InternalError
from dpsql.mechanisms import noise
from dpsql.mechanisms.calibrate import rho_of, zcdp_delta
from dpsql.mechanisms.noise import SeededSource
from dpsql.answer.result import QueryCost

TOTAL = Spend(Fraction(1), Fraction(1, 10**6))
PURE = Spend(Fraction(1, 100))


def pure(epsilon) -> Spend:
    return Spend(Fraction(epsilon))


# -- the filters -------------------------------------------------------------------------------


def test_the_benchmark_counts():
    """Queries answered under (1, 1e-6) at per-query epsilon 0.01, 0.05, 0.1 (RESULTS.md)."""
    counts = {e: [accountant_for(a, TOTAL).answerable(pure(e)) for a in ACCOUNTINGS]
              for e in ("0.01", "0.05", "0.1")}
    assert counts == {"0.01": [100, 333, 487], "0.05": [20, 20, 20], "0.1": [10, 10, 10]}


def test_basic_is_exact_sequential_composition():
    basic = accountant_for("basic", TOTAL)
    assert basic.answerable(Spend(Fraction(1, 3))) == 3 and basic.answerable(pure("0.1")) == 10
    tally = Tally().add(pure("0.1"), 9)
    assert basic.admits(tally.add(pure("0.1"))) and not basic.admits(tally.add(pure("0.1") + PURE))
    account = basic.account(tally)
    assert account.spent == Spend(Fraction(9, 10), 0, Fraction(9, 200))
    assert account.remaining == Spend(Fraction(1, 10), Fraction(1, 10**6))


def wrrw_epsilon(sum_of_squares: float, delta_prime: float) -> float:
    """Independent float form of the WRRW23 filter's bound."""
    return math.sqrt(2 * math.log(1 / delta_prime) * sum_of_squares) + sum_of_squares / 2


def drv_epsilon(k: int, epsilon: float, delta_prime: float) -> float:
    """Dwork-Rothblum-Vadhan advanced composition for k queries fixed in advance."""
    return math.sqrt(2 * k * math.log(1 / delta_prime)) * epsilon + k * epsilon * math.expm1(epsilon)


COSTS = st.lists(st.tuples(st.sampled_from([1, 2, 5, 10, 20, 50]), st.booleans()),
                 min_size=1, max_size=40)


@settings(max_examples=80, deadline=None)
@given(COSTS)
def test_advanced_admits_only_what_the_filter_or_pure_basic_composition_allows(steps):
    advanced = accountant_for("advanced", TOTAL)
    tally = Tally()
    for hundredths, gaussian in steps:
        cost = Spend(Fraction(hundredths, 1000), Fraction(1, 10**9) if gaussian else 0)
        if not advanced.admits(tally.add(cost)):
            continue
        tally = tally.add(cost)
        by_filter = (wrrw_epsilon(float(tally.epsilon_squared), 5e-7) <= 1 + 1e-9
                     and tally.delta <= Fraction(1, 2 * 10**6))
        by_basic = tally.delta == 0 and tally.epsilon <= 1
        assert by_filter or by_basic
        assert advanced.admits(tally)  # what was admitted stays admitted (prefix-closed)
    if tally.entries:
        spent = advanced.account(tally).spent
        assert spent.epsilon <= 1 and spent.delta <= Fraction(1, 10**6)


@pytest.mark.parametrize("epsilon", ["0.005", "0.01", "0.02"])
def test_advanced_filter_answers_at_least_what_drv_would_for_k_fixed_in_advance(epsilon):
    answered = accountant_for("advanced", TOTAL).answerable(pure(epsilon))
    k = 0
    while drv_epsilon(k + 1, float(epsilon), 5e-7) <= 1:
        k += 1
    assert answered >= k and answered > accountant_for("basic", TOTAL).answerable(pure(epsilon))


def test_the_rho_budget_is_the_tightest_conversion_that_holds():
    rho = rho_budget(Fraction(1), Fraction(1, 10**6))
    # calibrate.zcdp_delta is an independent search over the same CKS20 bound
    assert zcdp_delta(float(rho), 1.0) <= 1e-6 < zcdp_delta(float(rho) * 1.0001, 1.0)
    log_inverse = math.log(1e6)  # Bun-Steinke's rho + 2 sqrt(rho ln 1/delta) = epsilon is looser
    assert float(rho) > ((math.sqrt(log_inverse + 1) - math.sqrt(log_inverse))) ** 2 * 1.3
    assert 0.999 < float(epsilon_of_rho(rho, Fraction(1, 10**6))) <= 1
    assert epsilon_of_rho(Fraction(0), Fraction(1, 10**6)) == 0


def test_zcdp_costs_rho_exactly_and_converts_the_total():
    zcdp = accountant_for("zcdp", TOTAL)
    assert zcdp.total.rho == rho_budget(Fraction(1), Fraction(1, 10**6))
    gaussian = Spend(Fraction(1, 2), Fraction(1, 10**7), Fraction(1, 500))
    tally = Tally().add(gaussian, 3).add(pure("0.1"))
    assert tally.rho == Fraction(3, 500) + Fraction(1, 200)
    account = zcdp.account(tally)
    assert account.spent.rho == tally.rho and account.remaining.rho == zcdp.total.rho - tally.rho
    assert account.spent.epsilon == epsilon_of_rho(tally.rho, Fraction(1, 10**6))
    assert account.spent.epsilon < Fraction(17, 10)  # basic composition would say 1.6 + delta


@pytest.mark.parametrize("accounting", ACCOUNTINGS)
@pytest.mark.parametrize("history", [[], ["0.1"], ["0.3", "0.01", "0.2"], ["0.01"] * 50])
def test_remaining_epsilon_is_the_largest_next_pure_query_that_fits(accounting, history):
    accountant = accountant_for(accounting, TOTAL)
    tally = Tally()
    for epsilon in history:
        if accountant.admits(tally.add(pure(epsilon))):
            tally = tally.add(pure(epsilon))
    remaining = accountant.account(tally).remaining.epsilon
    assert remaining >= 0
    if remaining > 0:
        assert accountant.admits(tally.add(Spend(remaining)))
    assert not accountant.admits(tally.add(Spend(remaining * (1 + Fraction(1, 10**6)) + Fraction(1, 10**12))))


@pytest.mark.parametrize("accounting", ACCOUNTINGS)
def test_spent_is_a_valid_guarantee_and_never_above_the_total(accounting):
    accountant = accountant_for(accounting, TOTAL)
    tally = Tally().add(pure("0.01"), accountant.answerable(pure("0.01")))
    spent = accountant.account(tally).spent
    assert spent.epsilon <= 1 and spent.delta <= Fraction(1, 10**6)
    if accounting == "basic":
        assert spent.epsilon == 1
    else:  # sublinear: hundreds of queries of 0.01 for an epsilon of at most 1
        assert tally.entries > 300


def test_refusals_say_requested_remaining_difference_and_which_budget():
    tally = Tally().add(pure("0.1"), 9)
    with pytest.raises(BudgetExceeded) as refused:
        accountant_for("basic", TOTAL).check(tally, pure("0.3"), "analyst ann's budget")
    assert str(refused.value).startswith("this query needs epsilon 0.3 but only 0.1 remains "
                                         "(0.2 short), in analyst ann's budget")
    with pytest.raises(BudgetExceeded) as refused:
        accountant_for("advanced", TOTAL).check(tally, pure("0.3"), "the total budget")
    assert "needs epsilon 0.3 but only 0.1 remains (0.2 short)" in str(refused.value)
    zcdp_tally = Tally().add(pure("0.1"), 4)
    with pytest.raises(BudgetExceeded) as refused:
        accountant_for("zcdp", TOTAL).check(zcdp_tally.add(pure("0.5")), pure("0.2"), "the total budget")
    message = str(refused.value)
    assert message.startswith("this query needs rho 0.02 but only 0 remains (0.02 short) (a "
                              "pure-epsilon query may still spend epsilon 0.1), in the total budget")


def test_zcdp_cannot_add_up_releases_without_a_rho():
    unconverted = Spend(Fraction(1, 10), Fraction(1, 10**8))  # no rho, delta > 0
    assert Tally().add(unconverted).unconverted == 1
    with pytest.raises(DPError, match="cannot be bounded by zCDP"):
        accountant_for("zcdp", TOTAL).check(Tally(), unconverted, "the total budget")
    accountant_for("basic", TOTAL).check(Tally(), unconverted, "the total budget")  # fine there


def test_accountants_need_a_delta_and_a_known_name():
    for name in ("advanced", "zcdp"):
        with pytest.raises(InternalError):
            accountant_for(name, Spend(Fraction(1)))
    with pytest.raises(InternalError):
        accountant_for("rdp", TOTAL)


def test_query_cost_per_measure():
    def measure(noise, epsilon, delta=0, l2_squared=1, scale=1):
        return SimpleNamespace(noise=noise, epsilon=Fraction(epsilon), delta=Fraction(delta),
                               scale=Fraction(scale), sensitivity=SimpleNamespace(l2_squared=Fraction(l2_squared)))

    def plan(*measures, epsilon=None, delta=None):
        total_epsilon = sum((m.epsilon for m in measures), Fraction(0)) if epsilon is None else epsilon
        total_delta = sum((m.delta for m in measures), Fraction(0)) if delta is None else delta
        return SimpleNamespace(measures=measures, epsilon=Fraction(total_epsilon), delta=Fraction(total_delta))

    laplace = plan(measure("laplace", "0.05"), measure("laplace", "0.05"))
    assert query_cost(laplace) == Spend(Fraction(1, 10), 0, Fraction(1, 400))  # 2 * 0.05^2 / 2
    gaussian = plan(measure("gaussian", "0.5", "1e-7", l2_squared=4, scale=50), measure("none", "0.5"))
    assert query_cost(gaussian).rho == rho_of(Fraction(4), Fraction(50)) == Fraction(1, 25)
    selection = plan(measure("laplace", "0.5"), epsilon=1, delta=Fraction(1, 10**7))
    assert query_cost(selection).rho is None  # partition selection: (epsilon, delta) only
    extra = plan(measure("laplace", "0.5"), epsilon=1)
    assert query_cost(extra).rho == Fraction(1, 4)  # 0.5^2/2 + 0.5^2/2


def test_spend_and_query_cost_values():
    assert Spend(Fraction(1, 10), 0, Fraction(1, 200)) + Spend(Fraction(1, 10)) == Spend(Fraction(1, 5))
    assert QueryCost(Fraction(1, 10), 0, Fraction(1, 200), accounting="zcdp") == Spend(
        Fraction(1, 10), 0, Fraction(1, 200))
    assert repr(Spend(Fraction(1, 2))) == "Spend(epsilon=Fraction(1, 2), delta=Fraction(0, 1))"
    assert "advanced composition" in str(QueryCost(Fraction(1, 10), accounting="advanced"))
    assert show(Fraction(2, 3)) == "2/3 (about 0.6667)" and show(Fraction(1, 2**60)).startswith("8.67")
    with pytest.raises(TypeError):
        Spend(Fraction(1), rho=0.5)


# -- end to end ---------------------------------------------------------------------------------

VISITS = pd.DataFrame({
    "uid": [1, 1, 2, 3, 3, 4, 5, 6],
    "store": ["a", "b", "a", "b", "b", "a", "c", "a"],
    "amount": [10.0, 20.0, 5.0, 70.0, 1.0, 50.0, 3.0, 8.0],
})
STORES = pd.DataFrame({"store": ["a", "b", "c"]})
TABLES = """
PRIVATE TABLE visits (PRIVACY UNIT uid, MAX ROWS PER UNIT 2, amount BOUNDS 0 TO 100,
                      store KEYS FROM stores.store);
PUBLIC TABLE stores;
"""


def connect(budget: str, *, ledger=None, analyst=None, seed=1):
    return dpsql.connect({"visits": VISITS, "stores": STORES}, policy=budget + TABLES,
                         ledger=ledger, analyst=analyst, rng=SeededSource(seed))


def distinct_counts(db, epsilon, limit=1000, **options):
    """Ask distinct queries (so none is a repeat) until refused; how many were answered."""
    for i in range(limit):
        try:
            db.sql(f"SELECT COUNT(*) FROM visits WHERE amount > {i}", epsilon=epsilon, **options)
        except BudgetExceeded as refused:
            return i, refused
    raise AssertionError("never refused")


def test_zcdp_end_to_end_charges_rho_and_reports_it():
    with connect("BUDGET EPSILON 1 DELTA 1e-6; ACCOUNTING ZCDP;") as db:
        count = db.sql("SELECT COUNT(*) FROM visits", epsilon=0.1)
        assert count.cost.rho == Fraction(1, 200) and count.cost.epsilon == Fraction(1, 10)
        assert "rho 0.005 under zero-concentrated DP" in str(count.cost)
        average = db.sql("SELECT AVG(amount) FROM visits", epsilon=0.1)  # two measures of 0.05
        assert average.cost.rho == Fraction(1, 400)
        gaussian = db.sql("SELECT SUM(amount) FROM visits", epsilon=0.5, delta=1e-7, noise="gaussian")
        assert 0 < gaussian.cost.rho < Fraction(1, 8)  # tighter than its (epsilon, delta) as pure
        budget = db.budget
        assert budget.accounting == "zcdp" and budget.total.rho == rho_budget(Fraction(1), Fraction(1, 10**6))
        assert budget.spent.rho == Fraction(1, 200) + Fraction(1, 400) + gaussian.cost.rho
        assert budget.remaining.rho == budget.total.rho - budget.spent.rho
        assert "rho" in str(budget) and "ZCDP accounting" in str(budget)
        assert db.ledger()["rho"].sum() == pytest.approx(float(budget.spent.rho))
        with pytest.raises(BudgetExceeded, match="needs rho .* in the total budget"):
            db.sql("SELECT COUNT(*) FROM visits", epsilon=0.9)


GAUSSIAN = {"delta": 1e-7, "noise": "gaussian"}


@pytest.mark.parametrize("accounting, epsilon, options, expected", [
    ("BASIC", 0.25, {}, 4), ("ADVANCED", 0.25, {}, 4), ("ZCDP", 0.25, {}, 4),
    ("ADVANCED", 0.1, GAUSSIAN, None), ("ZCDP", 0.5, GAUSSIAN, None),
])
def test_every_accountant_answers_what_it_promises_end_to_end(accounting, epsilon, options, expected):
    with connect(f"BUDGET EPSILON 1 DELTA 1e-6; ACCOUNTING {accounting};") as db:
        first = db.sql("SELECT COUNT(*) FROM visits WHERE amount > -1", epsilon=epsilon, **options)
        answered, refused = distinct_counts(db, epsilon, **options)
        if expected is None:  # Gaussian: the filter's own rule decides, not basic composition
            cost = Spend(first.cost.epsilon, first.cost.delta, first.cost.rho)
            expected = accountant_for(accounting.lower(), TOTAL).answerable(cost)
            assert expected > 1 and first.cost.rho < first.cost.epsilon ** 2 / 2
        assert answered + 1 == expected
        assert str(refused).endswith("in the total budget. Hint: ask for less, or raise the policy's budget: "
                                     "dpsql.init_policy(DB, POLICY, replace=True) keeps what was spent.")
        assert refused.hint_for("sql") == "ask for less, or ask the data curator for more budget"
        assert accountant_for(accounting.lower(), TOTAL).admits(db._ledger.tally())


def test_bad_parameters_are_errors_never_refunds_under_every_accountant():
    for accounting in ACCOUNTINGS:
        with connect(f"BUDGET EPSILON 1 DELTA 1e-6; ACCOUNTING {accounting};") as db:
            for epsilon in (float("nan"), float("inf"), -0.1, 0, "x"):
                with pytest.raises(dpsql.InvalidParameter):
                    db.sql("SELECT COUNT(*) FROM visits", epsilon=epsilon)
            assert db.budget.spent.epsilon == 0 and len(db.ledger()) == 0


def test_analysts_have_their_own_budgets_and_see_only_their_own_entries(tmp_path):
    ledger = tmp_path / "shop.ledger"
    policy = "BUDGET EPSILON 1; BUDGET PER ANALYST EPSILON 0.5;"
    with connect(policy, ledger=ledger, analyst="alice") as alice, \
            connect(policy, ledger=ledger, analyst="bob") as bob, \
            connect(policy, ledger=ledger) as curator:
        alice.sql("SELECT COUNT(*) FROM visits", epsilon=0.3)
        with pytest.raises(BudgetExceeded) as refused:
            alice.sql("SELECT SUM(amount) FROM visits", epsilon=0.3)
        assert "needs epsilon 0.3 but only 0.2 remains (0.1 short), in analyst alice's budget" in str(
            refused.value)
        bob.sql("SELECT COUNT(*) FROM visits", epsilon=0.4)
        with pytest.raises(BudgetExceeded) as refused:  # bob has 0.1 of his own, the total 0.3
            curator.sql("SELECT SUM(amount) FROM visits", epsilon=0.4)
        assert "only 0.3 remains (0.1 short), in the total budget" in str(refused.value)
        assert alice.ledger()["analyst"].tolist() == ["alice"]
        assert bob.ledger()["analyst"].tolist() == ["bob"]
        assert curator.ledger()["analyst"].tolist() == ["alice", "bob"]
        budget = alice.budget
        assert budget.spent.epsilon == Fraction(7, 10)
        assert budget.analyst.owner == "alice" and budget.analyst.remaining.epsilon == Fraction(1, 5)
        assert "analyst alice:" in str(budget) and curator.budget.analyst is None
    with pytest.raises(dpsql.InvalidParameter):
        connect(policy, analyst="  ")


# -- free repeats ---------------------------------------------------------------------------


def test_an_identical_query_returns_the_stored_answer_for_free(monkeypatch):
    with connect("BUDGET EPSILON 1;") as db:
        first = db.sql("SELECT store, COUNT(*) AS n, AVG(amount) AS a FROM visits GROUP BY store ORDER BY n",
                       epsilon=0.3)
        spent = db.budget.spent

        def no_noise(*args, **kwargs):
            raise AssertionError("a repeat must never draw noise")

        monkeypatch.setattr(noise, "discrete_laplace", no_noise)
        monkeypatch.setattr(db._engine, "fetch", no_noise)
        variants = [
            "SELECT store, COUNT(*) AS n, AVG(amount) AS a FROM visits GROUP BY store ORDER BY n",
            "select Store, count(*) as visits, avg(V.amount) from Visits v group by store order by visits",
        ]
        for sql in variants:
            again = db.sql(sql, epsilon=0.3)
            assert again.fetchall() == first.fetchall()
            assert (again.accuracy_df().to_numpy() == first.accuracy_df().to_numpy())[:, 1:].all()
            assert again.cost == Spend.ZERO and again.cost.repeat and again.repeat
            assert "repeat" in str(again.cost) and "repeat, free" in repr(again)
        assert again.columns == ["Store", "visits", "avg(V.amount)"]  # this query's own names, as DuckDB names them
        assert db.budget.spent == spent and len(db.ledger()) == 1


def test_a_different_epsilon_or_analyst_is_charged_afresh(tmp_path):
    ledger = tmp_path / "shop.ledger"
    with connect("BUDGET EPSILON 5;", ledger=ledger, seed=2) as db:
        first = db.sql("SELECT COUNT(*) FROM visits WHERE amount > 4", epsilon=0.5)
        second = db.sql("SELECT COUNT(*) FROM visits WHERE amount > 4", epsilon=0.25)
        assert second.cost.epsilon == Fraction(1, 4) and not second.repeat
    with connect("BUDGET EPSILON 5;", ledger=ledger, analyst="ann", seed=3) as ann:
        assert not ann.sql("SELECT COUNT(*) FROM visits WHERE amount > 4", epsilon=0.5).repeat
    with connect("BUDGET EPSILON 5;", ledger=ledger, seed=4) as db:  # a restart
        again = db.sql("SELECT COUNT(*) FROM visits WHERE 4 < amount", epsilon=0.5)
        assert again.repeat and again.fetchall() == first.fetchall()
        assert db.budget.spent.epsilon == Fraction(5, 4)
    with connect("BUDGET EPSILON 6;", ledger=ledger) as db:  # another policy: a new question
        assert not db.sql("SELECT COUNT(*) FROM visits WHERE amount > 4", epsilon=0.5).repeat


def test_a_repeat_is_free_even_with_the_budget_spent():
    with connect("BUDGET EPSILON 1; ACCOUNTING BASIC;") as db:
        first = db.sql("SELECT SUM(amount) FROM visits", epsilon=1)
        with pytest.raises(BudgetExceeded):
            db.sql("SELECT COUNT(*) FROM visits", epsilon=0.1)
        assert db.sql("SELECT SUM(amount) FROM visits", epsilon=1).fetchall() == first.fetchall()


def test_an_answer_that_cannot_be_given_back_exactly_is_charged_again(tmp_path):
    ledger = tmp_path / "shop.ledger"
    with connect("BUDGET EPSILON 5;", ledger=ledger) as db:
        db.sql("SELECT COUNT(*) FROM visits", epsilon=0.5)
    with sqlite3.connect(ledger) as connection:
        connection.execute("UPDATE entries SET answer = 'not json'")
    with connect("BUDGET EPSILON 5;", ledger=ledger) as db:
        again = db.sql("SELECT COUNT(*) FROM visits", epsilon=0.5)
        assert not again.repeat and db.budget.spent.epsilon == 1


def test_public_queries_are_free_and_say_so():
    with connect("BUDGET EPSILON 1;") as db:
        result = db.sql("SELECT COUNT(*) FROM stores")
        assert result.exact and result.cost == Spend.ZERO and "public" in str(result.cost)


# -- explain ------------------------------------------------------------------------------------


def test_explain_shows_cost_and_what_remains_in_the_accountants_terms(monkeypatch):
    with connect("BUDGET EPSILON 1 DELTA 1e-6; ACCOUNTING ZCDP;") as db:
        monkeypatch.setattr(db._engine, "fetch", lambda *a, **k: pytest.fail("explain read data"))
        text = db.explain("SELECT COUNT(*) FROM visits", epsilon=0.1)
        after = accountant_for("zcdp", TOTAL).account(Tally().add(Spend(Fraction(1, 10), 0, Fraction(1, 200))))
        assert "accounting: ZCDP (zero-concentrated DP)" in text and "rho 0.005" in text
        assert f"remaining after: epsilon {float(after.remaining.epsilon):.6g}" in text
        assert "it would be refused" not in text and db.budget.spent.epsilon == 0
        refused = db.explain("SELECT COUNT(*) FROM visits", epsilon=1.5)
        assert "it would be refused: this query needs rho 1.125 but only 0.024356" in refused
        monkeypatch.undo()
        db.sql("SELECT COUNT(*) FROM visits", epsilon=0.1)
        assert "repeat: this query was answered before" in db.explain("select count(*) from visits", epsilon=0.1)
