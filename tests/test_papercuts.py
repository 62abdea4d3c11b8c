"""Papercuts found on real data (issue 13, item 5) and identifiers as written (issue 15, item 4).

One test (or a few) per papercut, each failing on the code before its fix.
"""

from __future__ import annotations

import io
import re
from fractions import Fraction
from pathlib import Path

import duckdb
import pandas as pd
import pytest
from cli_run import run

import dpsql
from dpsql import cli
from dpsql.budget.accounting import Spend
from dpsql.demo import SHOP_POLICY, run_demo
from dpsql.errors import DPError, InvalidParameter, UnsupportedQuery
from dpsql.shell import app as shell_app
from dpsql.shell.render import Answer, render_answer, render_error
from dpsql.shell.session import (
    handle_input,
    inputs_of_script,
    run_script,
    statement_is_complete,
)
from dpsql.shell.state import new_state

GROUPED = "SELECT store, COUNT(*) AS n FROM visits GROUP BY store"


# -- 1. comments in the shell, and a script's exit status ----------------------------------------

def test_a_comment_line_does_not_swallow_the_next_dot_command():
    script = "-- what is left?\n.budget\n/* a note */\n.mode csv\n-- counts\nSELECT 1;\n"
    assert list(inputs_of_script(script)) == [".budget", ".mode csv", "-- counts\nSELECT 1;"]
    assert statement_is_complete("-- a note")  # at the prompt, Enter runs it (it does nothing)
    assert not statement_is_complete("/* an open comment")


def test_a_comment_alone_runs_nothing(state):
    assert handle_input(state, "-- just a note") == ""
    pasted = handle_input(state, "-- note\n.budget")  # pasted, or sent with Esc Enter
    assert "remaining" in pasted and "refused" not in pasted


def test_a_script_exits_with_the_code_of_its_first_refusal(state):
    printed = []
    failure = run_script(state, "SELECT nosuch FROM visits;\n.budget\nSELECT COUNT(*) FROM visits;\n",
                         printed.append)
    assert isinstance(failure, UnsupportedQuery)
    assert shell_app.script_exit_code(failure) == cli.EXIT_REFUSED
    assert len(printed) == 3 and "±" in printed[2]  # the script went on after the refusal


def test_bail_stops_a_script_at_its_first_failure(state):
    printed = []
    run_script(state, ".nosuch\nSELECT COUNT(*) FROM visits;\n", printed.append, bail=True)
    assert len(printed) == 1 and printed[0].startswith("error: unknown command")
    assert shell_app.script_exit_code(state.first_failure) == cli.EXIT_ERROR


def test_shell_script_from_the_cli_exits_non_zero_on_a_refusal(shop, capsys, monkeypatch):
    database, policy = shop
    monkeypatch.setattr("sys.stdin", io.StringIO("-- check\n.budget\nSELECT nosuch FROM visits;\n"))
    code, out, _ = run(capsys, "shell", database, "--policy", policy)
    assert code == cli.EXIT_REFUSED
    assert "remaining" in out and "unknown column nosuch" in out
    monkeypatch.setattr("sys.stdin", io.StringIO("SELECT COUNT(*) FROM visits;\n"))
    assert run(capsys, "shell", database, "--policy", policy)[0] == cli.EXIT_OK


# -- 2. the query's OPTIONS win over the session's .epsilon ------------------------------------

def test_session_epsilon_yields_to_the_querys_own_options(state):
    handle_input(state, ".epsilon 0.2")
    text = handle_input(state, "SELECT WITH DIFFERENTIAL_PRIVACY OPTIONS (epsilon = 0.5) COUNT(*) AS n FROM visits;")
    assert "given twice" not in text and "cost ε 0.5" in text
    assert "cost ε 0.2" in handle_input(state, "SELECT COUNT(*) AS m FROM visits;")
    explained = handle_input(state, ".explain SELECT WITH DIFFERENTIAL_PRIVACY OPTIONS (epsilon = 0.25) "
                                    "COUNT(*) FROM visits")
    assert "cost: epsilon 0.25" in explained


def test_explicit_arguments_and_options_still_conflict(db):
    with pytest.raises(InvalidParameter, match="given twice") as refused:
        db.sql("SELECT WITH DIFFERENTIAL_PRIVACY OPTIONS (epsilon = 0.5) COUNT(*) FROM visits", epsilon=0.2)
    assert refused.value.hint_for("cli") == "give epsilon once, in the SQL or with --epsilon"


# -- 3. explain beyond the budget --------------------------------------------------------------

def test_explain_beyond_the_budget_says_refused_and_exits_3(shop, capsys):
    database, policy = shop
    code, out, _ = run(capsys, "explain", database, "SELECT SUM(amount) FROM visits", "--policy", policy,
                       "--epsilon", "5")
    assert code == cli.EXIT_OVER_BUDGET
    assert "it would be refused" in out and "remaining after" not in out
    assert not re.search(r"epsilon -\d", out)
    code, out, _ = run(capsys, "explain", database, "SELECT SUM(amount) FROM visits", "--policy", policy)
    assert code == cli.EXIT_OK and "remaining after: epsilon 2.9," in out


def test_explain_text_carries_its_refusal(db):
    assert db.explain("SELECT COUNT(*) FROM visits", epsilon=0.1).refused is None
    refused = db.explain("SELECT COUNT(*) FROM visits", epsilon=4).refused
    assert isinstance(refused, dpsql.BudgetExceeded) and "needs epsilon 4" in str(refused)


# -- 4. budgets in decimals --------------------------------------------------------------------

def test_budget_amounts_print_as_decimals(db):
    db.sql("SELECT COUNT(*) FROM visits", epsilon=Fraction(3, 10))
    assert str(db.budget.remaining) == "epsilon 2.7, delta 1e-6"
    assert "/" not in str(db.budget) and "Fraction" not in str(db.budget.spent)
    assert str(Spend(Fraction(7, 10))) == "epsilon 0.7, delta 0"
    assert repr(Spend(Fraction(7, 10))) == "Spend(epsilon=Fraction(7, 10), delta=Fraction(0, 1))"


# -- 5. explain in the column's units ----------------------------------------------------------

def explained_measures(db, sql: str, epsilon: str) -> list[str]:
    text = db.explain(sql, epsilon=epsilon)
    return [line.strip() for line in text.splitlines() if re.match(r"\s+m\d+:", line)]


def test_explain_shows_sensitivities_in_column_units(db):
    # visits: at most 10 rows per user, amount BOUNDS 0 TO 500, age BOUNDS 18 TO 90.
    # One user moves SUM(amount) by at most 10 * 500; a centred sum of amount (values minus
    # the midpoint 250) by 10 * 250; a sum of squared centred ages by 10 * 36**2.
    total, = explained_measures(db, "SELECT SUM(amount) FROM visits", "0.5")
    assert "row values in [0, 500]; rows model" in total and "L1 sensitivity 5000," in total
    assert "discrete Laplace, scale 10000 " in total  # 5000 / 0.5, in the column's units
    assert "grid" in total and "steps" in total  # the grid is still stated, labelled
    centred, count = explained_measures(db, "SELECT AVG(amount) FROM visits", "0.5")
    assert "L1 sensitivity 2500," in centred and "L1 sensitivity 10," in count
    squares = explained_measures(db, "SELECT VARIANCE(age) FROM visits", "0.5")[1]
    assert f"L1 sensitivity {10 * 36 ** 2} (squared units)" in squares


def test_explain_sensitivity_is_the_largest_change_one_unit_makes():
    """Brute force on a tiny table: remove each unit in turn; the largest change of SUM(x) over
    the bounded rows equals the L1 sensitivity explain states in x's units."""
    frame = pd.DataFrame({"u": [1, 1, 1, 2, 3, 3], "x": [0.75, 2.5, 2.5, 1.25, 2.5, 0.5]})
    policy = "BUDGET EPSILON 10; PRIVATE TABLE t (PRIVACY UNIT u, MAX ROWS PER UNIT 3, x BOUNDS 0 TO 2.5);"
    with dpsql.connect({"t": frame}, policy=policy) as db:
        line, = explained_measures(db, "SELECT SUM(x) FROM t", "1")
    stated = float(re.search(r"L1 sensitivity ([\d.]+),", line).group(1))
    largest = max(frame[frame.u == unit].x.clip(0, 2.5).sum() for unit in frame.u.unique())
    # The bound covers any unit's 3 rows at the upper bound; this data reaches it (unit 1: 5.75
    # of 7.5), and no unit can exceed it.
    assert largest <= stated == 3 * 2.5


# -- 6. plurals --------------------------------------------------------------------------------

def test_one_group_is_singular(tmp_path):
    frame = pd.DataFrame({"u": [1, 2], "k": ["a", "b"]})
    policy = "BUDGET EPSILON 1; PRIVATE TABLE t (PRIVACY UNIT u, MAX ROWS PER UNIT 1, MAX GROUPS PER UNIT 1, k KEYS ('a'));"
    with dpsql.connect({"t": frame}, policy=policy) as db:
        text = db.explain("SELECT k, COUNT(*) FROM t GROUP BY k", epsilon=1)
        assert "at most 1 row and 1 group per unit" in text and "1 listed public key" in text
        assert "1 groups" not in text and "1 rows" not in text
        state = new_state(db)
        assert "at most 1 row and 1 group per unit" in handle_input(state, ".tables")
        result = db.sql("SELECT k, COUNT(*) FROM t GROUP BY k", epsilon=1)
        assert "\n1 row\n" in repr(result) and "1 rows" not in repr(result)


# -- 7 and 14. unknown names and identifiers as written ----------------------------------------

@pytest.fixture
def spaced(tmp_path):
    """A file whose table and columns have spaces and capitals."""
    path = tmp_path / "orders.duckdb"
    with duckdb.connect(str(path)) as con:
        con.execute('CREATE TABLE "Customer Orders" ("Customer ID" INTEGER, "Amount Paid" DOUBLE, '
                    '"Store Name" VARCHAR, Region VARCHAR)')
        con.execute("""INSERT INTO "Customer Orders" VALUES (1, 10, 'A', 'n'), (2, 20, 'B', 's')""")
    policy = ('BUDGET EPSILON 3; QUERY EPSILON 0.1; PRIVATE TABLE "Customer Orders" (PRIVACY UNIT "Customer ID", '
              """MAX ROWS PER UNIT 5, "Amount Paid" BOUNDS 0 TO 100, "Store Name" KEYS ('A', 'B'));""")
    with dpsql.connect(str(path), policy=policy, ledger=":memory:") as db:
        yield db


def refusal(db, sql: str) -> UnsupportedQuery:
    with pytest.raises(UnsupportedQuery) as refused:
        db.explain(sql)
    return refused.value


def test_an_unknown_column_suggests_the_nearest_as_written(spaced):
    error = refusal(spaced, 'SELECT SUM("Amount Pad") FROM "Customer Orders"')
    assert error.message == 'unknown column "Amount Pad"'
    assert error.hint.startswith('did you mean "Amount Paid"?')
    assert '"Customer ID"' in error.hint and "customer id" not in error.hint
    error = refusal(spaced, 'SELECT COUNT(*) FROM "Customer Order"')
    assert error.message == 'unknown table "Customer Order"' and 'did you mean "Customer Orders"?' in error.hint


def test_a_column_hint_never_offers_the_column_it_refuses():
    """Attack a1 finding 4e: "unknown column sz" listed sz among the available columns, because
    the hint listed every table's columns while the qualifier named a table without it. A
    qualified miss now lists its own table's columns and says which table has the name; a bare
    name two joined tables both have is ambiguous, not unknown."""
    visits = pd.DataFrame({"uid": [1, 2], "store": ["A", "B"], "amount": [1.0, 2.0]})
    stores = pd.DataFrame({"store": ["A", "B"], "sz": [1, 2]})
    policy = """BUDGET EPSILON 1; QUERY EPSILON 0.1; PRIVATE TABLE visits (PRIVACY UNIT uid, MAX ROWS PER UNIT 1,
        amount BOUNDS 0 TO 10); PUBLIC TABLE stores;"""
    with dpsql.connect({"visits": visits, "stores": stores}, policy=policy) as db:
        error = refusal(db, "SELECT SUM(unnamed_subquery.sz) AS n FROM (SELECT uid, amount, store FROM visits) "
                            "JOIN (SELECT store, sz FROM stores) USING (store)")
        assert error.message == "unknown column unnamed_subquery.sz: unnamed_subquery has no column sz"
        assert error.hint == ("sz is a column of unnamed_subquery2; the columns of unnamed_subquery are: "
                              "amount, store, uid")
        assert (error.line, error.col) == (1, 12)
        error = refusal(db, "SELECT SUM(v.sz) AS n FROM visits AS v JOIN stores AS s ON v.store = s.store")
        assert error.message == "unknown column v.sz: v has no column sz"
        assert error.hint == "sz is a column of s; the columns of v are: amount, store, uid"
        grouped = "SELECT store, COUNT(*) AS n FROM visits AS v JOIN stores AS s ON v.store = s.store GROUP BY store"
        error = refusal(db, grouped)
        assert error.message == "column store is ambiguous: s and v both have it"
        assert error.hint == "qualify it: s.store or v.store"
        assert (error.line, error.col) == (1, grouped.rindex("store") + 1)  # GROUP BY is bound first
        error = refusal(db, "SELECT SUM(v.amout) AS n FROM visits AS v JOIN stores AS s ON v.store = s.store")
        assert error.hint == "did you mean amount? The columns of v are: amount, store, uid"
        error = refusal(db, "SELECT SUM(nosuch) AS n FROM visits AS v JOIN stores AS s ON v.store = s.store")
        assert error.message == "unknown column nosuch" and "nosuch" not in error.hint


def test_a_long_column_list_is_not_dumped():
    frame = pd.DataFrame({"u": [1]} | {f"column_{i}": [1.0] for i in range(30)})
    with dpsql.connect({"t": frame}, policy="BUDGET EPSILON 1; PRIVATE TABLE t (PRIVACY UNIT u, MAX ROWS PER UNIT 1);") as db:
        error = refusal(db, "SELECT COUNT(colum_17) FROM t")
    assert error.hint == "did you mean column_17 or column_7 or column_1?"  # 31 names: the nearest only
    with dpsql.connect({"t": frame}, policy="BUDGET EPSILON 1; PRIVATE TABLE t (PRIVACY UNIT u, MAX ROWS PER UNIT 1);") as db:
        error = refusal(db, "SELECT COUNT(zzz) FROM t")
    assert "none of the 31 columns is close" in error.hint


def test_refusals_and_hints_keep_quoted_names_quoted(spaced):
    cases = {
        'SELECT "Amount Paid" FROM "Customer Orders"': ['column "Amount Paid" is neither', 'GROUP BY "Amount Paid"'],
        'SELECT COUNT(*) FROM "Customer Orders" GROUP BY "Customer ID"': ['GROUP BY the privacy unit "Customer ID"'],
        'SELECT SUM("Store Name") FROM "Customer Orders"': ['column "Store Name" has no BOUNDS',
                                                           '`"Store Name" BOUNDS lo TO hi`', 'CLAMP("Store Name", lo, hi)'],
    }
    for sql, fragments in cases.items():
        error = refusal(spaced, sql)
        for fragment in fragments:
            assert fragment in str(error), (sql, str(error))
        assert not re.search(r"\b(amount paid|customer id|store name)\b", str(error)), str(error)


def test_a_capitalised_unit_is_a_unit_not_a_row_level_table(spaced):
    assert 'privacy unit: "Customer ID", at most 5 rows' in spaced.explain('SELECT COUNT(*) FROM "Customer Orders"')
    a = pd.DataFrame({"Uid": [1, 2], "x": [1.0, 2.0]})
    b = pd.DataFrame({"Uid": ["1", "2"], "y": [1.0, 2.0]})
    policy = ('BUDGET EPSILON 1; PRIVATE TABLE a (PRIVACY UNIT "Uid", MAX ROWS PER UNIT 2); '
              'PRIVATE TABLE b (PRIVACY UNIT "Uid", MAX ROWS PER UNIT 2);')
    with dpsql.connect({"a": a, "b": b}, policy=policy) as db:
        # Units of different types must not be joined (an implicit cast could merge units).
        error = refusal(db, "SELECT COUNT(*) FROM a JOIN b ON a.uid = b.uid")
        assert "privacy units of different types" in error.message


# -- 8. hints in each surface's own syntax -----------------------------------------------------

def test_hints_use_the_syntax_of_the_surface(built):
    policy = SHOP_POLICY.replace("QUERY EPSILON 0.1;\n", "")
    with dpsql.connect(str(built), policy=policy, ledger=":memory:") as db:
        with pytest.raises(InvalidParameter) as refused:
            db.sql("SELECT COUNT(*) FROM visits")
    error = refused.value
    assert error.hint.startswith("pass epsilon=0.1")
    assert error.hint_for("cli").startswith("give --epsilon 0.1")
    assert error.hint_for("shell").startswith("set .epsilon 0.1")
    assert error.hint_for("sql").startswith("write SELECT WITH DIFFERENTIAL_PRIVACY OPTIONS (epsilon = 0.1)")
    assert "hint: set .epsilon 0.1" in render_error(error, surface="shell")
    assert "epsilon=" not in render_error(error, surface="cli")


def test_cli_hints_show_cli_syntax(shop, capsys, tmp_path):
    database, _ = shop
    code, _, err = run(capsys, "query", database, "SELECT COUNT(*) FROM visits")
    assert code == cli.EXIT_ERROR and "give --policy FILE" in err and "policy='" not in err
    bare = tmp_path / "bare.policy"
    bare.write_text(SHOP_POLICY.replace("QUERY EPSILON 0.1;\n", ""), encoding="utf-8")
    code, _, err = run(capsys, "query", database, "SELECT COUNT(*) FROM visits", "--policy", str(bare))
    assert "give --epsilon 0.1" in err and "epsilon=0.1" not in err
    code, _, err = run(capsys, "query", database, "SELECT day, COUNT(*) FROM visits GROUP BY day", "--policy",
                       str(bare), "--epsilon", "0.1")
    assert "give --delta 1e-7" in err and "delta=" not in err


# -- 9. dpsql demo keeps a stored policy -------------------------------------------------------

def test_rerunning_the_demo_keeps_the_stored_policy(tmp_path, capsys):
    directory = tmp_path / "demo"
    run_demo(directory, io.StringIO())
    database, policy = str(directory / "shop.duckdb"), str(directory / "shop.policy")
    assert run(capsys, "init", database, "--policy", policy)[0] == cli.EXIT_OK
    out = io.StringIO()
    run_demo(directory, out)
    assert "kept from before" in out.getvalue()
    code, out, _ = run(capsys, "budget", database)  # no --policy: the stored one is still there
    assert code == cli.EXIT_OK and "remaining" in out
    with dpsql.connect(database) as db:
        assert db.budget.spent.epsilon > 0  # the new ledger holds the demo's own charges only
        assert db.budget.spent.epsilon < 3


# -- 10. no ledger file from a failed command --------------------------------------------------

def test_a_failed_command_leaves_no_ledger(shop, capsys, tmp_path):
    database, policy = shop
    ledger = Path(database + ".ledger")
    bad = tmp_path / "bad.policy"
    bad.write_text("BUDGET EPSILON 1; PRIVATE TABLE nope (PRIVACY UNIT x);", encoding="utf-8")
    for argv, code in (
        (["query", database, "SELECT nosuch FROM visits", "--policy", policy], cli.EXIT_REFUSED),
        (["query", database, "SELECT COUNT(*) FROM visits", "--policy", policy, "--epsilon", "50"],
         cli.EXIT_OVER_BUDGET),
        (["query", database, "SELECT COUNT(*) FROM visits", "--policy", str(bad)], cli.EXIT_ERROR),
        (["query", database, "SELECT COUNT(*) FROM visits"], cli.EXIT_ERROR),
        (["init", database, "--policy", str(bad)], cli.EXIT_ERROR),
        (["explain", database, "SELECT COUNT(*) FROM visits", "--policy", policy], cli.EXIT_OK),
        (["budget", database, "--policy", policy], cli.EXIT_OK),
    ):
        assert run(capsys, *argv)[0] == code, argv
        assert not ledger.exists(), argv
    assert run(capsys, "query", database, "SELECT COUNT(*) FROM visits", "--policy", policy)[0] == cli.EXIT_OK
    assert ledger.exists()  # a charge is recorded, of course
    assert run(capsys, "query", database, "SELECT nosuch FROM visits", "--policy", policy)[0] == cli.EXIT_REFUSED
    assert ledger.exists()


# -- 11. --max-rows and .maxrows ---------------------------------------------------------------

def test_max_rows_cuts_tables_and_says_how_many_more():
    answer = Answer(["k", "n"], [(f"key{i}", i) for i in range(50)], half_widths={"n": [1.0] * 50})
    text = render_answer(answer, "table", max_rows=40, show_all="--max-rows 0 prints all")
    assert "key39" in text and "key40" not in text
    assert text.rstrip().endswith("… 10 more rows (50 in all; --max-rows 0 prints all)")
    assert "key49" in render_answer(answer, "table", max_rows=0)
    assert render_answer(answer, "csv", max_rows=5).count("\n") == 51  # data formats keep every row


def test_cli_and_shell_limit_rows(shop, capsys, state):
    database, policy = shop
    code, out, _ = run(capsys, "query", database, GROUPED, "--policy", policy, "--max-rows", "5")
    assert code == cli.EXIT_OK and "… 7 more rows (12 in all; --max-rows 0 prints all)" in out
    code, out, _ = run(capsys, "query", database, GROUPED, "--policy", policy, "--max-rows", "0")
    assert "more rows" not in out and "12 rows" in out
    assert run(capsys, "query", database, GROUPED, "--policy", policy, "--max-rows", "-1")[0] == cli.EXIT_ERROR
    assert handle_input(state, ".maxrows 3") == "answers show at most 3 rows\n"
    assert "… 9 more rows (12 in all; .maxrows 0 shows all)" in handle_input(state, GROUPED + ";")
    assert handle_input(state, ".maxrows 0") == "answers show all rows\n"
    assert handle_input(state, ".maxrows x").startswith("error: N must be a whole number")


def test_one_row_is_one_row_not_one_rows(state):
    """Every count of rows the shell says agrees with its number (issue 35: "1 rows")."""
    assert handle_input(state, ".maxrows 1") == "answers show at most 1 row\n"
    assert "… 11 more rows (12 in all; .maxrows 0 shows all)" in handle_input(state, GROUPED + ";")
    assert "\n1 row\n" in handle_input(state, "SELECT COUNT(*) AS n FROM visits;")


# -- 12. a file open in this process with other settings ---------------------------------------

def test_a_file_open_with_other_settings_says_close_it_or_pass_it(shop):
    database, policy = shop
    other = duckdb.connect(database)  # read-write: another configuration of the same file
    try:
        with pytest.raises(DPError, match="already open in this process") as refused:
            dpsql.connect(database, policy=policy)
        assert "close that connection first, or pass it" in refused.value.hint
        with dpsql.connect(other, policy=policy, ledger=":memory:") as db:  # passing it works
            assert db.tables()
    finally:
        other.close()


# -- 13. numeric edge paths are refusals -------------------------------------------------------

@pytest.mark.parametrize("sql, why", [
    ("SELECT SUM(amount * 1e308 * 10) FROM visits", "too large for this epsilon"),
    ("SELECT AVG(amount * 1e308 * 10) FROM visits", "too large for this epsilon"),
    ("SELECT MEDIAN(amount * 1e308 * 10) FROM visits", "too large: their buckets"),
    ("SELECT SUM(amount * 1e-320) FROM visits", "too small"),
    ("SELECT MEDIAN(amount * 1e-320) FROM visits", "too small"),
    ("SELECT VARIANCE(amount * 1e200) FROM visits", "squared values"),  # used to fail after its charge
    ("SELECT AVG(amount * 1e305) FROM visits", "too large for this epsilon"),
    ("SELECT SUM(amount / 1e-310) FROM visits", "too large for this epsilon"),
])
def test_values_beyond_a_double_are_refused_before_the_charge(db, sql, why):
    spent = db.budget.spent
    for ask in (db.explain, db.sql):
        with pytest.raises(UnsupportedQuery, match=why) as refused:
            ask(sql, epsilon=0.01)
        assert refused.value.line == 1
    assert db.budget.spent == spent


def test_large_but_representable_values_still_run(db):
    assert db.sql("SELECT STDDEV(amount * 1e150) AS s FROM visits", epsilon=0.5).fetchall()[0][0] is not None
    assert db.sql("SELECT AVG(amount * 1e305) AS a FROM visits", epsilon=1).fetchall()[0][0] is not None
    assert "L2 sensitivity" in db.explain("SELECT VARIANCE(amount * 1e100) FROM visits", epsilon=0.5)


def test_policy_errors_keep_quoted_names_quoted(tmp_path):
    path = tmp_path / "orders.duckdb"
    with duckdb.connect(str(path)) as con:
        con.execute('CREATE TABLE "Customer Orders" ("Customer ID" INTEGER, "Store Name" VARCHAR)')
    head = 'BUDGET EPSILON 1; PRIVATE TABLE "Customer Orders" (PRIVACY UNIT "Customer ID", MAX ROWS PER UNIT 1, '
    with pytest.raises(dpsql.PolicyError) as refused:
        dpsql.connect(str(path), policy=head + '"Store Nam" KEYS (\'A\'));', ledger=":memory:")
    assert 'table "Customer Orders" has no column "Store Nam"' in str(refused.value)
    with pytest.raises(dpsql.PolicyError) as refused:
        dpsql.connect(str(path), policy=head + '"Store Name" BOUNDS 0 TO 1);', ledger=":memory:")
    assert '"Customer Orders"."Store Name" is VARCHAR' in str(refused.value)
    assert '`"Store Name" KEYS' in refused.value.hint


def test_a_column_list_in_a_table_alias_is_refused_not_ignored():
    """DuckDB renames a table's columns by position (``p AS q(m, k)``); the rewrite would not
    carry the renames, so the same SQL would mean another join than DuckDB's: refused."""
    visits = pd.DataFrame({"uid": range(10), "x": [1.0] * 10})
    p = pd.DataFrame({"k": range(10), "m": [7] * 10})
    policy = "BUDGET EPSILON 10; PRIVATE TABLE visits (PRIVACY UNIT uid, MAX ROWS PER UNIT 1); PUBLIC TABLE p;"
    with dpsql.connect({"visits": visits, "p": p}, policy=policy) as db:
        for sql in ("SELECT COUNT(*) FROM visits v JOIN p AS q(m, k) ON v.uid = q.k",
                    "SELECT COUNT(*) FROM visits AS v(x, uid) WHERE uid = 5",
                    "SELECT COUNT(*) FROM visits v JOIN (SELECT * FROM p) AS q(m, k) ON v.uid = q.k"):
            with pytest.raises(dpsql.UnsupportedQuery, match="a column list in the alias") as refused:
                db.sql(sql, epsilon=1)
            assert refused.value.col is not None and "rename in a subquery" in refused.value.hint
        assert db.budget.spent.epsilon == 0
        assert db.sql("SELECT * FROM p AS q(m, k) WHERE m = 0").fetchall() == [(0, 7)]  # public: DuckDB's own
