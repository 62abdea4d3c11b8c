"""The public API end to end: connect targets, results, budget, refusals, noise calibration."""

from __future__ import annotations

import hashlib
import math
from fractions import Fraction

import duckdb
import numpy as np
import pandas as pd
import pytest
from pums import POLICY_PATH, load_pums

import dpsql
from dpsql.mechanisms.noise import SeededSource

VISITS = pd.DataFrame({
    "uid": [1, 1, 1, 2, 3, 3, 4],
    "store": ["a", "a", "b", "b", "a", "zzz", "a"],
    "amount": [10.0, 20.0, None, 700.0, float("nan"), 5.0, 50.0],
})
STORES = pd.DataFrame({"store": ["a", "b", "c"], "city": ["x", "y", "y"]})
POLICY = """
BUDGET EPSILON 10 DELTA 1e-5;
QUERY EPSILON 1;
PRIVATE TABLE visits (PRIVACY UNIT uid, MAX ROWS PER UNIT 2, amount BOUNDS 0 TO 100,
                      store KEYS FROM stores.store);
PUBLIC TABLE stores;
"""


@pytest.fixture
def db():
    with dpsql.connect({"visits": VISITS, "stores": STORES}, policy=POLICY, rng=SeededSource(5)) as connection:
        yield connection


def test_grouped_query_releases_every_public_key_and_only_those(db):
    result = db.sql("SELECT store, COUNT(*) AS n FROM visits GROUP BY store")
    assert result.columns == ["store", "n"]
    assert sorted(row[0] for row in result.fetchall()) == ["a", "b", "c"]  # 'c' has no rows; 'zzz' is not public
    assert list(result.df().columns) == ["store", "n"]
    assert set(result.accuracy()) == {"n"}


def test_ungrouped_aggregate_returns_exactly_one_row_even_with_no_rows(db):
    result = db.sql("SELECT COUNT(*), SUM(amount), AVG(amount) FROM visits WHERE amount > 1000")
    assert len(result.fetchall()) == 1
    average = result.fetchone()[2]
    assert 0 <= average <= 100  # clamped into the bounds


def test_cost_budget_and_charging(db):
    before = db.budget.spent
    result = db.sql("SELECT COUNT(*) FROM visits", epsilon=0.25)
    assert result.cost.epsilon == Fraction(1, 4) and result.cost.delta == 0
    assert db.budget.spent.epsilon - before.epsilon == Fraction(1, 4)
    assert db.budget.remaining.epsilon == db.budget.total.epsilon - db.budget.spent.epsilon
    db.sql("SELECT COUNT(*) FROM visits")  # QUERY EPSILON 1 from the policy
    assert db.budget.spent.epsilon - before.epsilon == Fraction(5, 4)


def test_static_refusals_and_bad_parameters_charge_nothing(db):
    spent = db.budget.spent
    for sql in ("SELECT amount FROM visits", "SELECT SUM(uid) FROM visits", "DROP TABLE visits",
                "SELECT COUNT(*) FROM nowhere"):
        with pytest.raises(dpsql.UnsupportedQuery):
            db.sql(sql)
    for epsilon in (float("nan"), float("inf"), -1, 0, "abc", True, None if False else [1]):
        with pytest.raises(dpsql.InvalidParameter):
            db.sql("SELECT COUNT(*) FROM visits", epsilon=epsilon)
    for delta in (1, -1e-9, float("nan")):
        with pytest.raises(dpsql.InvalidParameter):
            db.sql("SELECT COUNT(*) FROM visits", delta=delta, noise="gaussian")
    with pytest.raises(dpsql.InvalidParameter):
        db.sql("SELECT COUNT(*) FROM visits", noise="gaussian")  # Gaussian needs delta > 0
    assert db.budget.spent == spent


def test_budget_exceeded_releases_and_charges_nothing(db):
    db.sql("SELECT COUNT(*) FROM visits", epsilon=9)
    spent = db.budget.spent
    with pytest.raises(dpsql.BudgetExceeded) as caught:
        db.sql("SELECT COUNT(*) FROM visits", epsilon=2)
    assert "2" in str(caught.value) and "remains" in str(caught.value)
    assert db.budget.spent == spent


def test_public_query_is_exact_and_free(db):
    result = db.sql("SELECT city, COUNT(*) AS n FROM stores GROUP BY city ORDER BY city")
    assert result.fetchall() == [("x", 1), ("y", 2)]
    assert result.exact and result.cost.epsilon == 0 and result.accuracy() == {}
    assert db.budget.spent.epsilon == 0


def test_gaussian_noise_charges_delta(db):
    result = db.sql("SELECT SUM(amount) FROM visits", epsilon=1, delta=1e-6, noise="gaussian")
    assert result.cost.delta == Fraction(1, 10**6)
    assert "discrete Gaussian" in db.explain("SELECT SUM(amount) FROM visits", epsilon=1, delta=1e-6, noise="gaussian")


def test_order_by_and_limit_act_on_released_values(db):
    result = db.sql("SELECT store, COUNT(*) AS n FROM visits GROUP BY store ORDER BY n DESC, store LIMIT 2")
    rows = result.fetchall()
    assert len(rows) == 2 and rows[0][1] >= rows[1][1]
    assert len(result.accuracy_df()) == 2


def test_explain_reads_no_private_data_and_charges_nothing(db, monkeypatch):
    def no_data(*args, **kwargs):
        raise AssertionError("explain must not read data")

    monkeypatch.setattr(db._engine, "fetch", no_data)
    text = db.explain("SELECT store, AVG(amount) FROM visits GROUP BY store", epsilon=0.5)
    for fragment in ("L1 sensitivity", "discrete Laplace", "epsilon 0.25", "$salt", "remaining after"):
        assert fragment in text
    assert db.budget.spent.epsilon == 0


def test_a_failure_after_the_charge_is_generic_and_keeps_the_charge(db, monkeypatch):
    def failing(*args, **kwargs):
        raise RuntimeError("secret value 42 in user 7's row")

    monkeypatch.setattr(db._engine, "fetch", failing)
    with pytest.raises(dpsql.QueryFailed) as caught:
        db.sql("SELECT COUNT(*) FROM visits", epsilon=0.5)
    assert "42" not in str(caught.value) and caught.value.__cause__ is None
    assert db.budget.spent.epsilon == Fraction(1, 2)


def test_file_target_is_opened_read_only_and_the_ledger_persists(tmp_path):
    path = tmp_path / "shop.duckdb"
    with duckdb.connect(str(path)) as con:
        con.execute("CREATE TABLE visits AS SELECT * FROM VISITS")
        con.execute("CREATE TABLE stores AS SELECT * FROM STORES")
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    with dpsql.connect(path, policy=POLICY) as db:
        db.sql("SELECT COUNT(*) FROM visits", epsilon=0.5)
    with dpsql.connect(str(path), policy=POLICY) as db:
        assert db.budget.spent.epsilon == Fraction(1, 2)  # reconnecting sees what was spent
        db.store_policy()
    with dpsql.connect(str(path)) as db:  # the stored policy
        assert db.budget.spent.epsilon == Fraction(1, 2)
    assert hashlib.sha256(path.read_bytes()).hexdigest() == digest
    assert (tmp_path / "shop.duckdb.ledger").exists()


def test_open_duckdb_connection_target():
    con = duckdb.connect()
    con.execute("CREATE TABLE visits AS SELECT * FROM VISITS")
    con.execute("CREATE TABLE stores AS SELECT * FROM STORES")
    with dpsql.connect(con, policy=POLICY) as db:
        assert len(db.sql("SELECT store, SUM(amount) FROM visits GROUP BY store").fetchall()) == 3
    assert con.execute("SELECT COUNT(*) FROM visits").fetchone() == (7,)  # still usable: not ours to close


def test_policy_is_checked_against_the_database():
    bad = POLICY.replace("amount BOUNDS", "amont BOUNDS")
    with pytest.raises(dpsql.PolicyError) as caught:
        dpsql.connect({"visits": VISITS, "stores": STORES}, policy=bad)
    assert caught.value.line == 4


def test_no_policy_anywhere_is_an_error():
    with pytest.raises(dpsql.PolicyError):
        dpsql.connect({"visits": VISITS})


def _discrete_laplace_variance(scale: float) -> float:
    p = math.exp(-1 / scale)
    return 2 * p / (1 - p) ** 2


def test_released_noise_has_the_analysed_scale_end_to_end():
    """One grouped query over 3,000 public keys gives 3,000 independent noise draws.

    COUNT per key, unbounded, k = 3 rows per unit: L1 = 3, so at epsilon 1 the noise is
    discrete Laplace with scale 3 (variance ~ 18). Two queries give 6,000 draws of the
    floored counts; 2 * mean(max(Z, 0)^2) estimates Var Z with relative standard error
    sqrt(2 * kurtosis - 1) / sqrt(n) = sqrt(11 / 6000) < 0.043. We allow 6 of them (26%), so a
    correct engine fails with probability far below 1e-6, while a factor-2 error in scale
    (variance x4 or /4) always fails.
    """
    keys = pd.DataFrame({"k": np.arange(3000)})
    rows = pd.DataFrame({"uid": [1, 2, 2, 3], "k": [5, 5, 6, 7]})
    policy = ("BUDGET EPSILON 10; PRIVATE TABLE t (PRIVACY UNIT uid, MAX ROWS PER UNIT 3, "
              "k KEYS FROM keys.k); PUBLIC TABLE keys;")
    exact = np.zeros(3000)
    exact[5], exact[6], exact[7] = 2, 1, 1
    draws = []
    with dpsql.connect({"t": rows, "keys": keys}, policy=policy, rng=SeededSource(11)) as db:
        for where in ("", "WHERE k >= 0"):  # two different queries: an identical one would be a free repeat
            released = db.sql(f"SELECT k, COUNT(*) FROM t {where} GROUP BY k ORDER BY k", epsilon=1).fetchall()
            draws.extend(np.array([r[1] for r in released]) - exact)
    draws = np.array(draws)[np.tile(exact == 0, 2)]
    # Counts are floored at 0, so a cell whose truth is 0 shows max(Z, 0): E[max(Z,0)^2] = E[Z^2]/2.
    observed = 2 * np.mean(draws**2)
    expected = _discrete_laplace_variance(3.0)
    assert abs(observed / expected - 1) < 0.26, (observed, expected)


def test_accuracy_interval_covers_the_noise():
    keys = pd.DataFrame({"k": np.arange(4000)})
    rows = pd.DataFrame({"uid": [1], "k": [0], "x": [1.0]})
    policy = ("BUDGET EPSILON 10; PRIVATE TABLE t (PRIVACY UNIT uid, MAX ROWS PER UNIT 1, "
              "x BOUNDS -5 TO 5, k KEYS FROM keys.k); PUBLIC TABLE keys;")
    with dpsql.connect({"t": rows, "keys": keys}, policy=policy, rng=SeededSource(3)) as db:
        result = db.sql("SELECT k, SUM(x) AS s FROM t GROUP BY k ORDER BY k", epsilon=1)
        values = np.array([r[1] for r in result.fetchall()])
        values[0] -= 1.0
        width = result.accuracy(alpha=0.05)["s"]
    inside = np.mean(np.abs(values) <= width)
    # Coverage is at least 95%; 4,000 cells put a correct engine 6 standard errors above 0.937.
    assert inside >= 0.95 - 6 * math.sqrt(0.05 * 0.95 / 4000)
    assert inside <= 0.999  # not absurdly wide either


def test_census_sample_end_to_end():
    con = duckdb.connect()
    load_pums(con)
    with dpsql.connect(con, policy=POLICY_PATH, rng=SeededSource(8)) as db:
        per_unit = "SELECT COUNT(*) AS n FROM pums GROUP BY pid"
        bounded = con.execute(f"SELECT SUM(LEAST(n, 3)) FROM ({per_unit})").fetchone()[0]
        count = db.sql("SELECT COUNT(*) FROM pums")
        width = count.accuracy(alpha=1e-9)["count_star()"]
        assert abs(count.fetchone()[0] - bounded) <= width  # at most 3 of a person's 1-4 rows count
        by_sex = db.sql("SELECT sex, AVG(age) FROM pums GROUP BY sex", epsilon=2).fetchall()
        assert [row[0] for row in by_sex] == [0, 1]
        assert all(0 <= row[1] <= 100 for row in by_sex)
        income = db.sql("SELECT educ, SUM(income) FROM pums WHERE age >= 18 GROUP BY educ").fetchall()
        assert len(income) == 16


def test_a_failing_public_query_is_a_clear_refusal(db):
    with pytest.raises(dpsql.UnsupportedQuery) as caught:
        db.sql("SELECT day FROM stores")
    assert "day" in str(caught.value)


def test_private_tables_are_read_through_a_bounded_copy_rebuilt_on_refresh():
    """dpsql.backends.bounding: the copy keeps min(rows, k) rows of each unit and no NULL unit; it is
    built on first use and rebuilt after refresh()."""
    con = duckdb.connect()
    con.execute("CREATE TABLE visits AS SELECT * FROM VISITS")
    con.execute("INSERT INTO visits VALUES (NULL, 'a', 1.0)")
    con.execute("CREATE TABLE stores AS SELECT * FROM STORES")
    copy = ('SELECT uid, COUNT(*) FROM dp_bounding."dp_bounded_visits__uid__2" WHERE NOT dp_pad '
            'GROUP BY uid ORDER BY uid')
    with dpsql.connect(con, policy=POLICY) as db:
        assert con.execute(copy).fetchall() == []  # nothing read before the first query
        db.sql("SELECT COUNT(*) FROM visits", epsilon=0.1)
        assert con.execute(copy).fetchall() == [(1, 2), (2, 1), (3, 2), (4, 1)]
        con.execute("INSERT INTO visits VALUES (5, 'a', 1.0), (5, 'b', 2.0), (5, 'c', 3.0)")
        db.sql("SELECT SUM(amount) FROM visits", epsilon=0.1)
        assert con.execute(copy).fetchall()[-1] == (4, 1)  # the copy is as the data was
        db.refresh()
        db.sql("SELECT COUNT(*) FROM visits", epsilon=0.2)  # not a repeat: runs
        assert con.execute(copy).fetchall()[-1] == (5, 2)


def test_max_rows_contributed_can_lower_the_policy_limit_but_not_raise_it(db):
    lowered = db.sql("SELECT WITH DIFFERENTIAL_PRIVACY OPTIONS (max_rows_contributed = 1) COUNT(*) FROM visits",
                     epsilon=0.1)
    assert len(lowered.fetchall()) == 1
    with pytest.raises(dpsql.UnsupportedQuery) as refused:
        db.sql("SELECT WITH DIFFERENTIAL_PRIVACY OPTIONS (max_rows_contributed = 3) COUNT(*) FROM visits",
               epsilon=0.1)
    assert "can lower that, not raise it" in refused.value.message and refused.value.col > 0


# -- one prepare() for sql() and explain() (issue 14) ------------------------------------------

@pytest.mark.parametrize("sql", [
    "SELECT COUNT(*) FROM visits WHERE store > 5",
    "SELECT store, COUNT(*) FROM visits WHERE store + 1 > 2 GROUP BY store",
])
def test_explain_refuses_what_sql_refuses_for_a_query_that_does_not_bind(db, sql):
    with pytest.raises(dpsql.UnsupportedQuery) as explained:
        db.explain(sql)
    with pytest.raises(dpsql.UnsupportedQuery) as run:
        db.sql(sql)
    assert str(explained.value) == str(run.value) and "does not bind" in str(run.value)
    assert db.budget.spent.epsilon == 0


@pytest.mark.parametrize("accounting", ["BASIC", "ADVANCED", "ZCDP"])
def test_explain_shows_what_the_accountant_says_remains_after_the_query(accounting):
    from dpsql.answer.explain import _num

    policy = POLICY.replace("QUERY EPSILON 1;", f"QUERY EPSILON 1; ACCOUNTING {accounting};")
    with dpsql.connect({"visits": VISITS, "stores": STORES}, policy=policy, rng=SeededSource(5)) as db:
        for epsilon in (0.5, 0.25):
            sql = f"SELECT COUNT(*), SUM(amount) FROM visits WHERE amount > {epsilon}"
            explained = str(db.explain(sql, epsilon=epsilon))
            db.sql(sql, epsilon=epsilon)
            remaining = db.budget.remaining
            assert f"remaining after: epsilon {_num(remaining.epsilon)}, delta {_num(remaining.delta)}" in explained


PREPARED_QUERIES = [
    ("SELECT COUNT(*) FROM visits", {}),
    ("SELECT store, COUNT(*) AS n, AVG(amount) FROM visits GROUP BY store ORDER BY n DESC", {"epsilon": 0.5}),
    ("SELECT store, SUM(amount) AS s FROM visits GROUP BY store", {"weights": {"s": 2}, "report_bias": True}),
    ("SELECT WITH DIFFERENTIAL_PRIVACY OPTIONS (epsilon = 0.5, max_rows_contributed = 1) COUNT(*) FROM visits", {}),
    ("SELECT uid % 3 AS k, COUNT(*) FROM visits GROUP BY k", {"delta": 1e-6}),
    ("SELECT store FROM visits GROUP BY store", {}),
    ("SELECT city, COUNT(*) FROM stores GROUP BY city", {}),
]


@pytest.mark.parametrize("sql, arguments", PREPARED_QUERIES)
def test_a_cached_prepared_query_is_exactly_the_one_recomputed(db, sql, arguments):
    first = db._prepare(sql, *(arguments.get(name) for name in
                               ("epsilon", "delta", "noise", "weights", "report_bias")))
    db.sql(sql, **arguments)  # running it must not change what was kept
    kept = db._prepare(sql, *(arguments.get(name) for name in ("epsilon", "delta", "noise", "weights", "report_bias")))
    assert kept is first
    db.refresh()  # forgets what was prepared
    again = db._prepare(sql, *(arguments.get(name) for name in ("epsilon", "delta", "noise", "weights", "report_bias")))
    assert again is not first and again == first


def test_the_cache_changes_no_answer_charge_refusal_or_repeat(tmp_path):
    import shutil

    with dpsql.connect({"visits": VISITS, "stores": STORES}, policy=POLICY, ledger=tmp_path / "a.ledger"):
        pass  # a ledger with its salt, copied so that both runs bound the same rows
    shutil.copy(tmp_path / "a.ledger", tmp_path / "b.ledger")
    sql = "SELECT store, COUNT(*) AS n FROM visits GROUP BY store"
    runs = []
    for ledger, keeps in (("a.ledger", True), ("b.ledger", False)):
        with dpsql.connect({"visits": VISITS, "stores": STORES}, policy=POLICY, ledger=tmp_path / ledger,
                           rng=SeededSource(5), separate_budget=True) as db:  # a copy: a second budget
            seen = []
            for epsilon in (0.5, 0.25, 0.5, 0.25):  # one text, two plans, then both repeated
                if not keeps:
                    db._preparer.clear()
                result = db.sql(sql, epsilon=epsilon)
                seen.append((result.fetchall(), result.cost.epsilon))
            for _ in range(2):  # a refusal is recomputed each time, with its position
                with pytest.raises(dpsql.UnsupportedQuery, match=r"nonsense is not allowed.*line 2, column 19"):
                    db.sql("SELECT COUNT(*)\nFROM visits WHERE nonsense(amount) > 1")
            runs.append((seen, db.budget.spent))
    assert runs[0] == runs[1]
    seen, spent = runs[0]
    assert [cost for _, cost in seen] == [Fraction(1, 2), Fraction(1, 4), 0, 0] and spent.epsilon == Fraction(3, 4)
    assert seen[2][0] == seen[0][0] and seen[3][0] == seen[1][0]  # repeats: the stored answers, never a fresh draw


def test_noise_is_drawn_afresh_for_a_cached_plan(db):
    sql = "SELECT COUNT(*) FROM visits"
    answers = {db.sql(sql, epsilon=Fraction(1, n)).fetchone()[0] for n in range(2, 12)}
    assert len(answers) > 1


@pytest.mark.parametrize("sql, arguments", [q for q in PREPARED_QUERIES if "FROM visits" in q[0] and "OPTIONS" not in q[0]])
def test_a_bounded_statement_kept_across_epsilons_is_the_one_the_rewrite_gives(db, sql, arguments):
    """The bounded statement is kept per (text, measure shapes), not per epsilon: for every
    epsilon it must be exactly what rewriting that epsilon's plan gives, core types included."""
    from dpsql.backends.rewrite import rewrite_statement

    for epsilon in (0.5, 0.01, 3, 0.5, 1e-3):
        prepared = db._prepare(sql, epsilon, *(arguments.get(name) for name in ("delta", "noise", "weights",
                                                                               "report_bias")))
        if prepared.priced is None:
            continue
        fresh = rewrite_statement(prepared.plan)
        assert prepared.priced.bounded == fresh
        assert prepared.priced.core_types == db._preparer.core_types(prepared.plan, fresh)


def test_zcdp_refuses_partition_selection_in_sql_and_explain_alike():
    """Partition selection has no rho, so ACCOUNTING ZCDP cannot add it up: sql() and explain()
    refuse it the same way (one prepare), and nothing is charged."""
    policy = POLICY.replace("QUERY EPSILON 1;", "QUERY EPSILON 1; ACCOUNTING ZCDP;")
    with dpsql.connect({"visits": VISITS, "stores": STORES}, policy=policy, rng=SeededSource(5)) as db:
        sql = "SELECT uid % 3 AS k, COUNT(*) FROM visits GROUP BY k"  # no KEYS domain: selection
        refusals = []
        for ask in (db.explain, db.sql):
            with pytest.raises(dpsql.UnsupportedQuery, match="ACCOUNTING ZCDP cannot add up") as refused:
                ask(sql, delta=1e-6)
            refusals.append(str(refused.value))
        assert refusals[0] == refusals[1]
        assert db.budget.spent.epsilon == 0
        db.sql("SELECT store, COUNT(*) FROM visits GROUP BY store")  # a KEYS domain: no selection, answered


@pytest.mark.parametrize("accounting, shows_rho", [("BASIC", False), ("ADVANCED", False), ("ZCDP", True)])
def test_explain_names_rho_only_under_zcdp(accounting, shows_rho):
    policy = POLICY.replace("QUERY EPSILON 1;", f"QUERY EPSILON 1; ACCOUNTING {accounting};")
    with dpsql.connect({"visits": VISITS, "stores": STORES}, policy=policy) as db:
        text = str(db.explain("SELECT COUNT(*) FROM visits", epsilon=0.5))
        assert ("rho" in text.split("accounting:")[1]) is shows_rho
