"""Findings of a DuckDB user's first review: DuckDB spellings dpsql must accept or refuse well.

One test (or a few) per finding, each failing on the code before its fix.
"""

from __future__ import annotations

import io
import logging
import math

import duckdb
import pytest

import dpsql
from dpsql import cli
from dpsql.connection import Connection
from dpsql.errors import DPError, InternalFailure, UnsupportedQuery
from dpsql.shell import app as shell_app
from dpsql.shell.session import handle_input, run_script, split_statements
from dpsql.sql.parse import parse_query


def without_budget(text: str) -> list[str]:
    return [line for line in str(text).splitlines() if "budget" not in line and "remaining" not in line]


# -- count() is COUNT(*); other zero-argument aggregates are refused ------------------------------

def test_count_with_no_argument_is_count_star(db):
    explained = str(db.explain("SELECT count() FROM visits", epsilon=1)).replace("COUNT()", "COUNT(*)")
    assert without_budget(explained) == without_budget(db.explain("SELECT COUNT(*) FROM visits", epsilon=1))
    result = db.sql("SELECT count() FROM visits", epsilon=1)
    assert result.columns == ["count_star()"]  # DuckDB's name for it
    assert isinstance(result.fetchall()[0][0], int)
    grouped = db.sql("SELECT store, count() AS n FROM visits GROUP BY store ORDER BY n DESC", epsilon=1)
    assert grouped.columns == ["store", "n"]


@pytest.mark.parametrize("sql", [
    "SELECT AVG(n) FROM (SELECT user_id, count() AS n FROM visits GROUP BY user_id) s",
    "SELECT count() FILTER (WHERE amount > 10) FROM visits",
    "SELECT store, count() FROM visits GROUP BY store HAVING count() > 3 ORDER BY count() DESC",
    "SELECT count() FROM visits v JOIN stores s ON v.store = s.store",
])
def test_count_with_no_argument_wherever_count_star_goes(db, sql):
    star = sql.replace("count()", "COUNT(*)")
    assert without_budget(db.explain(sql, epsilon=0.5)) == without_budget(db.explain(star, epsilon=0.5))


@pytest.mark.parametrize("call", ["MIN()", "max()", "median()", "QUANTILE_CONT()", "sum()", "avg()", "stddev()"])
def test_other_aggregates_without_an_argument_are_refused(db, call):
    with pytest.raises(UnsupportedQuery):
        db.explain(f"SELECT {call} FROM visits", epsilon=1)


# -- nothing but a DPError escapes sql() and explain() ----------------------------------------------

@pytest.fixture
def broken(monkeypatch):
    """A bug in dpsql met by queries that hold 'broken': an AttributeError with a message."""
    original = Connection._prepare

    def prepare(self, sql, *arguments):
        if "broken" in sql:
            raise AttributeError("secret detail")
        return original(self, sql, *arguments)

    monkeypatch.setattr(Connection, "_prepare", prepare)


def test_a_bug_reaches_the_analyst_as_an_internal_failure(db, broken):
    for method in (db.sql, db.explain):
        with pytest.raises(InternalFailure) as failed:
            method("SELECT COUNT(*) AS broken FROM visits", epsilon=1)
        assert isinstance(failed.value, DPError)
        assert "AttributeError" in str(failed.value) and "secret" not in str(failed.value)
        assert failed.value.__cause__ is None and failed.value.__suppress_context__
    assert db.budget.spent.epsilon == 0


def test_a_shell_script_goes_on_after_an_internal_error(state, broken):
    printed = []
    failure = run_script(state, "SELECT COUNT(*) AS broken FROM visits;\nSELECT COUNT(*) AS n FROM visits;\n",
                         printed.append)
    assert "internal error (AttributeError)" in printed[0] and "Traceback" not in printed[0]
    assert len(printed) == 2 and "±" in printed[1]
    assert shell_app.script_exit_code(failure) == cli.EXIT_ERROR


def test_a_shell_script_goes_on_after_a_bug_in_the_shell(state, monkeypatch):
    calls = []

    def answer_from(result):
        calls.append(result)
        raise TypeError("a bug in rendering")

    monkeypatch.setattr("dpsql.shell.session.answer_from", answer_from)
    printed = []
    failure = run_script(state, "SELECT COUNT(*) FROM visits;\n.budget\n", printed.append)
    assert printed[0] == "internal error (TypeError); this is a bug, please report it\n"
    assert "remaining" in printed[1]
    assert shell_app.script_exit_code(failure) == cli.EXIT_ERROR


def test_the_cli_shell_reports_an_internal_error_and_runs_the_rest(shop, broken, capsys, monkeypatch):
    database, policy = shop
    monkeypatch.setattr("sys.stdin", io.StringIO("SELECT count() AS broken FROM visits;\n"
                                                 "SELECT COUNT(*) AS after_it FROM visits;\n"))
    code = cli.main(["shell", database, "--policy", policy])
    out = capsys.readouterr().out
    assert code == cli.EXIT_ERROR
    assert "internal error (AttributeError)" in out and "after_it" in out and "Traceback" not in out


# -- comment-only and empty statements are nothing to run -------------------------------------------

@pytest.mark.parametrize("sql", ["SELECT COUNT(*) FROM visits; -- all visits",
                                 "SELECT COUNT(*) FROM visits; /* a note */ ;",
                                 "SELECT COUNT(*) FROM visits;;",
                                 "-- counts\nSELECT COUNT(*) FROM visits;\n-- done\n"])
def test_a_trailing_comment_is_not_a_statement(db, sql):
    assert parse_query(sql).sql() == "SELECT COUNT(*) FROM visits"
    assert db.sql(sql, epsilon=1).columns == ["count_star()"]


def test_two_statements_and_no_statement_are_still_refused(db):
    with pytest.raises(UnsupportedQuery, match="found 2"):
        db.explain("SELECT COUNT(*) FROM visits; SELECT 1 -- two", epsilon=1)
    with pytest.raises(UnsupportedQuery, match="holds no statement"):
        db.explain("-- nothing; /* here */ ;", epsilon=1)


def test_a_shell_script_line_ending_in_a_comment_runs_once(state, shop, capsys, monkeypatch):
    assert split_statements("SELECT 1; -- January") == ["SELECT 1"]
    printed = []
    failure = run_script(state, "SELECT COUNT(*) FROM visits WHERE age > 30; -- older\n", printed.append)
    assert failure is None and "refused" not in "".join(printed) and "±" in printed[0]
    database, policy = shop
    monkeypatch.setattr("sys.stdin", io.StringIO("SELECT COUNT(*) FROM visits; -- all\n"))
    assert cli.main(["shell", database, "--policy", policy]) == cli.EXIT_OK
    assert "refused" not in capsys.readouterr().out
    assert cli.main(["query", database, "--policy", policy, "--epsilon", "0.1",
                     "SELECT COUNT(*) FROM visits; -- all"]) == cli.EXIT_OK


# -- EXPLAIN, DESCRIBE, SHOW, SUMMARIZE, PRAGMA: pointed hints, no sqlglot warnings -----------------

@pytest.mark.parametrize("sql, name, shell_hint", [
    ("EXPLAIN SELECT COUNT(*) FROM visits", "EXPLAIN", ".explain SELECT COUNT(*) FROM visits"),
    ("EXPLAIN ANALYZE SELECT COUNT(*) FROM visits", "EXPLAIN", ".explain SELECT COUNT(*) FROM visits"),
    ("DESCRIBE visits", "DESCRIBE", ".schema visits"),
    ("SUMMARIZE visits", "SUMMARIZE", ".schema visits"),
    ("SHOW TABLES", "SHOW", ".tables"),
    ("PRAGMA version", "PRAGMA", ".tables"),
])
def test_duckdb_statements_point_to_their_dpsql_equivalent(db, state, caplog, sql, name, shell_hint):
    with caplog.at_level(logging.DEBUG, logger="sqlglot"):
        with pytest.raises(UnsupportedQuery) as refused:
            db.sql(sql, epsilon=1)
    assert caplog.records == []  # no "Falling back to parsing as a 'Command'"
    assert refused.value.message.startswith(f"only queries can be run, not {name}")
    assert refused.value.hint_for("shell").startswith(shell_hint)
    python = refused.value.hint_for("python")
    assert "db.explain(" in python if name == "EXPLAIN" else "db." in python
    assert f"hint: {shell_hint}" in handle_input(state, sql + ";")


def test_sqlglot_warnings_outside_dpsql_are_left_alone(caplog):
    import sqlglot

    with caplog.at_level(logging.WARNING, logger="sqlglot"):
        sqlglot.parse_one("EXPLAIN SELECT 1", read="duckdb")
    assert any("Falling back" in r.getMessage() for r in caplog.records)


# -- GROUP BY 1 in a per-unit subquery ----------------------------------------------------------------

@pytest.fixture
def spaced(tmp_path):
    path = tmp_path / "orders.duckdb"
    with duckdb.connect(str(path)) as con:
        con.execute('CREATE TABLE "Customer Orders" ("Customer ID" INTEGER, "Amount Paid" DOUBLE, region VARCHAR)')
        con.execute("""INSERT INTO "Customer Orders" VALUES (1, 10, 'n'), (1, 30, 'n'), (2, 20, 's')""")
    policy = ('BUDGET EPSILON 3; QUERY EPSILON 0.1; PRIVATE TABLE "Customer Orders" (PRIVACY UNIT "Customer ID", '
              """MAX ROWS PER UNIT 5, "Amount Paid" BOUNDS 0 TO 100, region KEYS ('n', 's'));""")
    with dpsql.connect(str(path), policy=policy, ledger=":memory:") as db:
        yield db


def test_group_by_ordinal_in_a_per_unit_subquery(spaced):
    named = 'SELECT AVG(n) FROM (SELECT "Customer ID", COUNT(*) n FROM "Customer Orders" GROUP BY "Customer ID") s'
    ordinal = 'SELECT AVG(n) FROM (SELECT "Customer ID", COUNT(*) n FROM "Customer Orders" GROUP BY 1) s'
    second = ('SELECT AVG(t) FROM (SELECT COUNT(*) n, "Customer ID", SUM("Amount Paid") t '
              'FROM "Customer Orders" GROUP BY 2) s')
    assert str(spaced.explain(ordinal)) == str(spaced.explain(named))  # same plan, same sensitivity
    assert "GROUP BY" in str(spaced.explain(second))
    spaced.sql(ordinal)


def test_a_per_unit_subquery_hint_quotes_the_unit(spaced):
    for sql in ['SELECT AVG(n) FROM (SELECT region, COUNT(*) n FROM "Customer Orders" GROUP BY region) s',
                'SELECT AVG(n) FROM (SELECT "Customer ID", COUNT(*) n FROM "Customer Orders" GROUP BY 2) s']:
        with pytest.raises(UnsupportedQuery) as refused:
            spaced.explain(sql)
        assert refused.value.hint.startswith('GROUP BY "Customer ID" in the subquery')


# -- the LOW findings ------------------------------------------------------------------------------------

def test_chart_follows_maxrows(state):
    handle_input(state, ".maxrows 2")
    handle_input(state, "SELECT store, COUNT(*) AS n FROM visits GROUP BY store;")
    stores = len(state.last_answer.rows)
    assert stores > 2
    drawn = handle_input(state, ".chart")
    bars = [line for line in drawn.splitlines()[1:] if "┤" in line or "█" in line]
    assert len(bars) == 2
    assert f"… {stores - 2} more rows ({stores} in all; .maxrows 0 shows all)" in drawn
    handle_input(state, ".maxrows 0")
    assert "more row" not in handle_input(state, ".chart")


def test_markdown_escapes_a_pipe_in_values(shop, capsys):
    database, policy = shop
    code = cli.main(["query", database, "--policy", policy, "--format", "markdown",
                     "SELECT 'p|q' AS \"a|b\", store FROM stores LIMIT 2"])
    table = [line for line in capsys.readouterr().out.splitlines() if line.startswith("|")]
    assert code == cli.EXIT_OK and len(table) == 4
    assert table[0].startswith("| a\\|b ") and table[2].startswith("| p\\|q ")
    assert all(line.replace("\\|", "").count("|") == 3 for line in table)  # two cells a row


@pytest.mark.parametrize("sql, written", [
    ("SELECT approx_count_distinct(user_id) FROM visits", "APPROX_COUNT_DISTINCT(...)"),
    ("SELECT COUNT(*) FROM visits WHERE random() < 0.5", "RANDOM(...)"),
    ("SELECT bool_or(amount > 1) FROM visits", "BOOL_OR(...)"),
    ("SELECT string_agg(store, ',') FROM visits", "STRING_AGG(...)"),
    ("SELECT list(amount) FROM visits", "LIST(...)"),
    ("SELECT QUANTILE_DISC(amount, 0.5) FROM visits", "QUANTILE_DISC(...)"),
    ("SELECT COUNT(*) FROM visits WHERE regexp_matches(store, 'a')", "REGEXP_MATCHES(...)"),
])
def test_refusals_name_functions_as_written(db, sql, written):
    with pytest.raises(UnsupportedQuery) as refused:
        db.explain(sql, epsilon=1)
    assert written in refused.value.message
    start = sql.lower().index(written[:-5].lower()) + 1
    assert (refused.value.line, refused.value.col) == (1, start)


def test_a_caret_under_a_call_with_doubled_parentheses(db):
    with pytest.raises(UnsupportedQuery) as refused:
        db.explain("SELECT string_agg((store), ',') FROM visits", epsilon=1)
    assert refused.value.col == 8


def test_accuracy_of_an_empty_answer_is_nan_like_accuracy_df(db):
    result = db.sql("SELECT store, COUNT(*) AS n FROM visits GROUP BY store HAVING COUNT(*) < -1000000", epsilon=1)
    assert result.fetchall() == []
    accuracy = result.accuracy()
    assert list(accuracy) == ["n"] and math.isnan(accuracy["n"])
    assert len(result.accuracy_df()) == 0


def test_lateral_column_aliases_are_post_processing(db):
    result = db.sql("SELECT store, COUNT(*) AS n, n * 2 AS m, m + 1 AS k FROM visits GROUP BY store ORDER BY m",
                    epsilon=1)
    assert result.columns == ["store", "n", "m", "k"]
    rows = result.fetchall()
    assert all(m == 2 * n and k == m + 1 for _, n, m, k in rows)
    accuracy = result.accuracy()
    assert accuracy["m"] == pytest.approx(2 * accuracy["n"]) and accuracy["k"] == pytest.approx(accuracy["m"])
    explained = str(db.explain("SELECT COUNT(*) AS n, n * 2 FROM visits", epsilon=1))
    assert "COUNT(*)" in explained and "epsilon 1" in explained


@pytest.mark.parametrize("sql, message", [
    ("SELECT COUNT(*) AS n, SUM(n) FROM visits", "unknown column n"),  # not inside an aggregate
    ("SELECT n * 2, COUNT(*) AS n FROM visits", "unknown column n"),  # only earlier items
    ("SELECT COUNT(*) AS n FROM visits WHERE n > 1", "unknown column n"),  # not in WHERE
    ("SELECT COUNT(*) AS amount, amount * 2 FROM visits", "column amount is neither aggregated"),  # a column wins
])
def test_lateral_aliases_stay_in_the_select_list(db, sql, message):
    with pytest.raises(UnsupportedQuery, match=message):
        db.explain(sql, epsilon=1)
