"""The interactive shell: completion, dot commands, rendering, and the shell end to end.

Three layers, as the shell is built:
- pure functions (completion, rendering, charts, statement splitting), no database;
- each dot command and SQL input through ``handle_input`` on the demo database, no terminal;
- the prompt_toolkit loop driven through a pipe input, and once through a real
  pseudo-terminal with pexpect. Every driven test has a deadline, so none can hang.
"""

from __future__ import annotations

import io
import json
import os
import re
import signal
import sys
import threading
import time
from contextlib import contextmanager
from fractions import Fraction
from pathlib import Path
from types import SimpleNamespace

import pytest

import dpsql
from dpsql.demo import SHOP_POLICY, build_shop_database
from dpsql.errors import QueryFailed, UnsupportedQuery
from dpsql.shell import app as shell_app
from dpsql.shell.budget import budget_meter, cost_line, render_budget, rho_of
from dpsql.shell.chart import ChartError, _bar_cells, chart_columns, render_chart
from dpsql.shell.commands import REGISTRY, completion_arguments, help_text
from dpsql.shell.complete import SQLCompleter, complete
from dpsql.shell.render import Answer, caret_lines, render_answer, render_error
from dpsql.shell.session import (
    handle_input,
    inputs_of_script,
    run_script,
    split_statements,
    statement_is_complete,
)
from dpsql.shell.state import new_state

CATALOG = {
    "visits": ["user_id", "day", "store", "amount", "age", "zip"],
    "users": ["user_id", "country", "plan", "signup"],
    "stores": ["store", "city", "size"],
}
GROUPED = "SELECT plan, COUNT(*) AS users FROM users GROUP BY plan ORDER BY plan;"
NOISY = re.compile(r"\d ± \d")


def texts(text_before_cursor: str, after: str = "", **kwargs) -> list[str]:
    return [s.text for s in complete(text_before_cursor, CATALOG, text_after_cursor=after, **kwargs)]


@pytest.fixture(scope="module")
def shop_path(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("shop") / "shop.duckdb"
    build_shop_database(path)
    return path


@pytest.fixture
def db(shop_path):
    with dpsql.connect(str(shop_path), policy=SHOP_POLICY, ledger=":memory:") as connection:
        yield connection


@pytest.fixture
def state(db):
    return new_state(db, width=100, color=False)


# -- completion (pure) -------------------------------------------------------------------------

def test_completes_table_names_after_from_join_and_comma():
    assert texts("SELECT COUNT(*) FROM vi") == ["visits"]
    assert texts("select count(*) from VIS") == ["visits"]
    assert texts("SELECT COUNT(*) FROM visits JOIN st") == ["stores"]
    assert texts("SELECT COUNT(*) FROM visits, u") == ["users"]
    assert set(texts("SELECT COUNT(*) FROM ")) == set(CATALOG)


def test_completes_columns_of_the_tables_in_the_query():
    # The FROM clause may come after the cursor.
    assert texts("SELECT am", " FROM visits") == ["amount"]
    assert texts("SELECT plan, COUNT(*) FROM users WHERE C") == ["country", "COUNT(", "COVAR_POP(", "COVAR_SAMP(",
                                                                  "CORR(", "CAST(", "CEIL(", "COALESCE(", "CASE"]
    grouped = texts("SELECT COUNT(*) FROM visits GROUP BY ")
    assert grouped[:6] == CATALOG["visits"] and "city" not in grouped
    assert texts("SELECT COUNT(*) FROM users GROUP BY pl") == ["plan"]
    assert "plan" in texts("SELECT COUNT(*) FROM users ORDER BY ")
    assert "amount" in texts("SELECT COUNT(*) FROM visits WHERE amount > 5 AND ")


def test_completes_qualified_columns_through_aliases():
    assert texts("SELECT v.", " FROM visits v") == CATALOG["visits"]
    assert texts("SELECT v.st", " FROM visits AS v") == ["store"]
    assert texts("SELECT 1 FROM visits v JOIN stores s ON v.store = s.") == CATALOG["stores"]
    assert texts("SELECT stores.c") == ["city"]


def test_offers_dp_functions_and_keywords_in_the_typed_case():
    assert texts("SELECT SU", " FROM visits") == ["SUM("]
    assert texts("SELECT av", " FROM visits") == ["avg("]
    assert texts("sel") == ["select"]
    assert texts("SEL") == ["SELECT"]
    assert "GROUP BY" in texts("SELECT COUNT(*) FROM visits ")
    assert texts("SELECT COUNT(*) FROM visits gr") == ["group by"]
    assert next(s for s in complete("SELECT C", CATALOG) if s.text == "COUNT(").detail == "DP aggregate"


def test_no_suggestions_inside_strings_comments_or_after_limit():
    assert texts("SELECT COUNT(*) FROM visits WHERE store = 'Ba") == []
    assert texts("SELECT COUNT(*) FROM visits -- a note about vis") == []
    assert texts("SELECT COUNT(*) FROM visits LIMIT ") == []
    assert texts("SELECT COUNT(*) AS ") == []


def test_only_the_statement_at_the_cursor_counts():
    assert texts("SELECT 1 FROM stores; SELECT COUNT(*) FROM users WHERE ci") == []
    assert texts("SELECT c", " FROM users; SELECT 1 FROM stores")[0] == "country"


def test_completes_dot_commands_and_their_arguments():
    commands = completion_arguments()
    assert texts(".sc", dot_commands=commands) == [".schema"]
    assert texts(".e", dot_commands=commands) == [".epsilon", ".exit", ".explain"]
    assert texts(".schema vi", dot_commands=commands) == ["visits"]
    assert texts(".mode c", dot_commands=commands) == ["csv", "chart"]
    assert texts(".help sch", dot_commands=commands) == ["schema"]
    assert texts(".explain SELECT COUNT(*) FROM us", dot_commands=commands) == ["users"]
    assert texts(".quit x", dot_commands=commands) == []


def test_completion_never_raises_on_odd_input():
    for text in ["", " ", "(", ")", "'", '"', "SELECT ((", "SELECT 1.2.3", "SELECT \"we", "/*",
                 "SELECT *", ".", ". ", "SELECT a.b.c.", "FROM", "JOIN JOIN ,", "SELECT $x"]:
        complete(text, CATALOG, text_after_cursor=")", dot_commands=completion_arguments())


def test_completer_adapter_yields_prompt_toolkit_completions():
    from prompt_toolkit.document import Document

    completer = SQLCompleter(CATALOG, completion_arguments())
    completions = list(completer.get_completions(Document("SELECT COUNT(*) FROM vis"), None))
    assert [(c.text, c.start_position) for c in completions] == [("visits", -3)]
    (column,) = completer.get_completions(Document("SELECT ci FROM stores", cursor_position=9), None)
    assert column.text == "city" and column.display_meta_text == "stores"


# -- rendering (pure) --------------------------------------------------------------------------

ANSWER = Answer(["plan", "users", "avg_age"], [("free", 1186, 45.123), ("plus", 598, None)],
                half_widths={"users": [30.0, 30.0], "avg_age": [0.35, 1.2]},
                cost_epsilon=Fraction(1, 10))


def test_table_shows_every_noisy_value_with_its_half_width():
    table = render_answer(ANSWER, "table", width=80)
    assert "│ free │ 1,186 ± 30 │ 45.12 ± 0.35 │" in table
    assert "│ plus │   598 ± 30 │         NULL │" in table
    assert table.endswith("2 rows\n")
    assert "±" not in render_answer(Answer(["city", "n"], [("Boston", 3)], exact=True), "table")


def test_csv_json_and_markdown_modes():
    assert render_answer(ANSWER, "csv").splitlines() == [
        "plan,users,users_halfwidth95,avg_age,avg_age_halfwidth95",
        "free,1186,30.0,45.123,0.35",
        "plus,598,30.0,,1.2",
    ]
    records = json.loads(render_answer(ANSWER, "json"))
    assert records[1] == {"plan": "plus", "users": 598, "users_halfwidth95": 30.0,
                          "avg_age": None, "avg_age_halfwidth95": 1.2}
    markdown = render_answer(ANSWER, "markdown").splitlines()
    assert markdown[1].startswith("|------|") and markdown[1].endswith(":|")
    assert markdown[2] == "| free | 1,186 ± 30 | 45.12 ± 0.35 |"


def test_error_shows_a_caret_under_its_position_in_multi_line_sql():
    sql = "SELECT store,\n       COUNT(*)\nFROM visits\nGROUP BY zip"
    error = UnsupportedQuery("GROUP BY zip: the column has no public KEYS domain",
                             line=4, col=10, hint="declare zip KEYS (...)")
    lines = render_error(error, sql).splitlines()
    assert lines == [
        "refused: GROUP BY zip: the column has no public KEYS domain",
        "LINE 4: GROUP BY zip",
        "                 ^",
        "hint: declare zip KEYS (...)",
        "(nothing was read or charged)",
    ]
    assert "LINE" not in render_error(UnsupportedQuery("does not parse"), sql)
    assert "\x1b[" in render_error(error, sql, color=True)


def test_caret_stays_under_its_column_in_a_long_line():
    sql = "SELECT " + ", ".join(f"COUNT(*) AS c{i}" for i in range(40)) + ", oops FROM visits"
    col = sql.index("oops") + 1
    source, caret = caret_lines(sql, 1, col)
    assert len(source) < 130
    assert source[len(caret) - 1:].startswith("oops")
    assert caret_lines(sql, 2, 1) is None and caret_lines(sql, None, None) is None


def test_budget_meter_and_a_rho_read_defensively():
    budget = SimpleNamespace(total=SimpleNamespace(epsilon=Fraction(3), delta=Fraction(0)),
                             spent=SimpleNamespace(epsilon=Fraction(3, 4), delta=Fraction(0)),
                             remaining=SimpleNamespace(epsilon=Fraction(9, 4), delta=Fraction(0)))
    assert budget_meter(budget, 4) == "budget ε ███░ 2.25 of 3 left"
    assert rho_of(budget) is None
    for part, rho in (("total", 1), ("spent", 0.25), ("remaining", 0.75)):
        setattr(getattr(budget, part), "rho", rho)
    assert rho_of(budget) == (1, 0.25, 0.75)
    assert budget_meter(budget, 4).endswith("· ρ 0.75 of 1 left")
    budget.spent.rho = budget.remaining.rho = None  # nothing spent yet under zCDP
    assert rho_of(budget) == (1, 0, 1)


def test_budget_of_an_analyst_and_of_a_sublinear_accountant(state):
    def spend(epsilon, delta=Fraction(0)):
        return SimpleNamespace(epsilon=Fraction(epsilon), delta=delta)

    mine = SimpleNamespace(total=spend(1), spent=spend(Fraction(1, 4)), remaining=spend(Fraction(3, 4)),
                           owner="ada")
    budget = SimpleNamespace(total=spend(3), spent=spend(1), remaining=spend(2), accounting="advanced",
                             analyst=mine)
    text = render_budget(budget)
    assert "advanced accounting" in text
    assert "your own budget (ada):" in text and re.search(r"epsilon +1 +0.25 +0.75", text)
    answer = Answer(["n"], [(5,)], half_widths={"n": [1.0]}, cost_epsilon=Fraction(1, 10))
    assert "remaining ε 2 of 3 · yours ε 0.75 of 1" in cost_line(answer, budget)


def test_chart_draws_bars_with_error_bars():
    answer = Answer(["plan", "users"], [("free", 1200), ("plus", 600), ("pro", None)],
                    half_widths={"users": [100.0, 100.0, 100.0]})
    lines = render_chart(answer, width=60).splitlines()
    assert lines[0].startswith("users by plan")
    free, plus, pro = lines[1:4]
    assert free.startswith("free  ███") and free.endswith("1,200 ± 100")
    assert "▒" in plus and "┤" in plus
    assert pro.startswith("pro") and pro.endswith("NULL")
    assert free.index("┤") > plus.index("┤")  # bars are to scale
    assert lines[4].split() == ["0", "1,300"]


def test_chart_shows_intervals_that_reach_below_zero():
    assert _bar_cells(zero=3, end=5, low=1, high=7, width=8) == " ├─▒▒─┤ "
    answer = Answer(["store", "n"], [("a", 5), ("b", 40)], half_widths={"n": [20.0, 20.0]})
    a = render_chart(answer, width=60).splitlines()[1]
    assert "├" in a and "┤" in a


def test_chart_needs_one_numeric_column_or_a_name():
    two = Answer(["store", "n", "total"], [("a", 1, 2.0)], half_widths={"n": [1.0], "total": [1.0]})
    with pytest.raises(ChartError, match="name one"):
        chart_columns(two)
    assert chart_columns(two, "TOTAL") == (["store"], "total")
    with pytest.raises(ChartError, match="not a numeric column"):
        chart_columns(two, "store")
    with pytest.raises(ChartError, match="no rows"):
        chart_columns(Answer(["n"], []))
    exact = Answer(["city", "stores"], [("Boston", 3)], exact=True)
    assert chart_columns(exact) == (["city"], "stores")


# -- statements and scripts (pure) -------------------------------------------------------------

def test_statements_end_at_semicolons_outside_strings_and_comments():
    assert not statement_is_complete("SELECT COUNT(*)\nFROM visits")
    assert not statement_is_complete("SELECT ';")
    assert not statement_is_complete("SELECT 1 /* ; */")
    assert statement_is_complete("SELECT 1 /* ; */ ;")
    assert statement_is_complete("  .budget")
    assert statement_is_complete("")
    assert split_statements("SELECT 1;\nSELECT ';' AS s ; ;") == ["SELECT 1", "SELECT ';' AS s"]


def test_a_script_is_read_as_typed_inputs():
    script = "-- a comment\nSELECT 1\n  AS one;\n\n.mode csv\nSELECT 2; SELECT 3;\nSELECT 4"
    assert list(inputs_of_script(script)) == [
        "-- a comment\nSELECT 1\n  AS one;", ".mode csv", "SELECT 2; SELECT 3;", "SELECT 4"]


# -- every input, on the demo database, without a terminal -------------------------------------

def test_grouped_query_shows_values_with_plus_minus_cost_and_remaining_budget(state):
    output = handle_input(state, GROUPED)
    assert re.search(r"│ free +│ +[\d,]+ ± \d+ │", output)
    assert "3 rows" in output
    assert "cost ε 0.1, δ 0 · remaining ε 2.9 of 3, δ 1e-06 of 1e-06" in output
    assert state.last_answer.columns == ["plan", "users"]
    assert state.budget.spent.epsilon == Fraction(1, 10)


def test_public_query_is_exact_and_free(state):
    output = handle_input(state, "SELECT city, COUNT(*) AS n FROM stores GROUP BY city ORDER BY city;")
    assert "│ Boston  │ 3 │" in output and "±" not in output
    assert "exact: public tables only, no cost" in output
    assert state.budget.spent.epsilon == 0


def test_refused_query_shows_a_caret_and_the_shell_goes_on(state):
    output = handle_input(state, "SELECT user_id,\n       amount\n  FROM visits;")
    lines = output.splitlines()
    assert lines[0].startswith("refused: ") and "user_id" in lines[0]
    assert lines[1:3] == ["LINE 1: SELECT user_id,", "               ^"]
    assert "nothing was read or charged" in output and state.budget.spent.epsilon == 0
    assert not state.quit_requested
    assert NOISY.search(handle_input(state, GROUPED))


def test_two_statements_in_one_input_each_answer(state):
    output = handle_input(state, "SELECT COUNT(*) AS n FROM visits; SELECT SUM(amount) AS total FROM visits;")
    assert output.count("cost ε 0.1") == 2
    assert state.budget.spent.epsilon == Fraction(2, 10)


def test_help_is_generated_from_the_registry(state):
    text = handle_input(state, ".help")
    assert text == help_text()
    for command in REGISTRY.values():
        assert re.search(rf"^{re.escape(command.name)} .*{re.escape(command.help)}$", text, re.M)
    for name in (".help", ".tables", ".schema", ".policy", ".budget", ".ledger", ".explain",
                 ".epsilon", ".delta", ".mode", ".output", ".chart", ".quit"):
        assert name in REGISTRY
    assert handle_input(state, ".help schema").startswith(".schema [TABLE]\n")
    assert "error: no command" in handle_input(state, ".help nope")


def test_unknown_command_suggests_the_nearest(state):
    assert handle_input(state, ".schem") == \
        "error: unknown command .schem; did you mean .schema? .help lists the commands\n"


def test_tables_and_schema_show_the_policy(state):
    tables = handle_input(state, ".tables")
    assert re.search(r"visits +private +privacy unit user_id; at most 10 rows and 5 groups per unit", tables)
    assert re.search(r"stores +public +read exactly, at no cost", tables)
    schema = handle_input(state, ".schema visits")
    assert schema.startswith("visits: private, privacy unit user_id")
    assert re.search(r"amount +DOUBLE +bounds 0 to 500", schema)
    assert re.search(r"store +VARCHAR +keys from stores.store", schema)
    assert re.search(r"user_id +INTEGER +privacy unit", schema)
    assert "keys 'free', 'plus', 'pro'" in handle_input(state, ".schema users")
    assert handle_input(state, ".schema").count(": p") == 3
    unknown = handle_input(state, ".schema nope")
    assert unknown.startswith("refused: ") and "nope" in unknown


def test_policy_shows_the_policy_text(state):
    assert "PRIVATE TABLE visits (" in handle_input(state, ".policy")


def test_budget_and_ledger_follow_the_charges(state):
    assert re.search(r"epsilon +3 +0 +3", handle_input(state, ".budget"))
    assert handle_input(state, ".ledger") == "no charges yet: the whole budget remains\n"
    handle_input(state, GROUPED)
    budget = handle_input(state, ".budget")
    assert re.search(r"epsilon +3 +0.1 +2.9", budget)
    assert "budget ε ███████████████████░ 2.9 of 3 left" in budget
    ledger = handle_input(state, ".ledger")
    charge = next(line for line in ledger.splitlines() if line.startswith("1 "))
    assert re.search(r" 0\.1 +0 ", charge) and "SELECT" in charge
    handle_input(state, "SELECT COUNT(*) AS n FROM visits;")
    assert "1 earlier charge not shown" in handle_input(state, ".ledger 1")
    assert handle_input(state, ".ledger none").startswith("error: N must be a whole number")


def test_explain_costs_nothing_and_shows_refusals_with_a_caret(state):
    text = handle_input(state, ".explain SELECT AVG(amount) FROM visits;")
    assert "SELECT" in text and "epsilon" in text
    assert state.budget.spent.epsilon == 0
    refused = handle_input(state, ".explain SELECT amount FROM visits").splitlines()
    assert refused[1:3] == ["LINE 1: SELECT amount FROM visits", "               ^"]
    assert handle_input(state, ".explain").startswith("error: give a query")


def test_epsilon_and_delta_set_the_next_queries(state):
    assert handle_input(state, ".epsilon") == "next queries: epsilon 0.1 (the policy's QUERY EPSILON)\n"
    assert handle_input(state, ".epsilon 0.5") == "next queries: epsilon 0.5\n"
    assert "cost ε 0.5" in handle_input(state, GROUPED)
    assert "epsilon 0.5, delta 0" in handle_input(state, ".explain SELECT COUNT(*) FROM visits")
    for bad in ("0", "-1", "nan", "inf", "x"):
        assert handle_input(state, f".epsilon {bad}").startswith("error: epsilon must be")
    assert handle_input(state, ".epsilon default").endswith("(the policy's QUERY EPSILON)\n")
    assert state.epsilon is None
    assert handle_input(state, ".delta 1e-7") == "next queries: delta 1e-07\n"
    assert state.delta == Fraction(1, 10**7)
    assert handle_input(state, ".delta 1").startswith("error: delta must be at least 0 and below 1")
    handle_input(state, ".epsilon 100")
    refused = handle_input(state, GROUPED)
    assert refused.startswith("over budget: ") and "epsilon 100" in refused


def test_mode_switches_the_output_format(state):
    assert handle_input(state, ".mode") == "mode table\n"
    assert handle_input(state, ".mode csv") == "mode csv\n"
    assert handle_input(state, GROUPED).startswith("plan,users,users_halfwidth95\nfree,")
    handle_input(state, ".mode json")
    text = handle_input(state, GROUPED)
    end = text.index("\n]") + 2
    answer, footer = text[:end], text[end:]  # the footer follows the JSON
    records = json.loads(answer)
    assert "limits: at most" in footer
    assert "no cost" in footer  # the same query again: its earlier answer, for free
    assert [r["plan"] for r in records] == ["free", "plus", "pro"]
    handle_input(state, ".mode markdown")
    assert handle_input(state, GROUPED).startswith("| plan | ")
    handle_input(state, ".mode chart")
    assert handle_input(state, GROUPED).startswith("users by plan")
    assert "(no chart: the result has no numeric column" in \
        handle_input(state, "SELECT store FROM stores ORDER BY store LIMIT 2;")
    assert handle_input(state, ".mode bars").startswith("error: unknown mode bars; choose one of table")


def test_output_writes_answers_to_a_file(state, tmp_path):
    target = tmp_path / "answers.csv"
    handle_input(state, ".mode csv")
    assert handle_input(state, f".output {target}") == f"answers go to {target}\n"
    screen = handle_input(state, GROUPED)
    assert screen.startswith(f"wrote 3 rows to {target}\n") and "\ncost ε 0.1" in screen
    assert target.read_text().startswith("plan,users,users_halfwidth95\n")
    assert handle_input(state, ".output") == "answers go to the screen\n"
    assert NOISY.search(handle_input(state, ".mode table") + handle_input(state, GROUPED))
    assert target.read_text().count("plan,users") == 1
    assert handle_input(state, f".output {tmp_path}/missing/x.csv").startswith("error: cannot write")


def test_chart_draws_the_last_answer(state):
    assert handle_input(state, ".chart").startswith("error: no answer to draw yet")
    handle_input(state, GROUPED)
    chart = handle_input(state, ".chart").splitlines()
    assert chart[0] == "users by plan  (█ value, ▒─┤ 95% interval)"
    assert [line.split()[0] for line in chart[1:4]] == ["free", "plus", "pro"]
    assert all("█" in line and NOISY.search(line) for line in chart[1:4])
    handle_input(state, "SELECT store, COUNT(*) AS n, AVG(amount) AS a FROM visits GROUP BY store;")
    assert "name one, e.g. .chart n" in handle_input(state, ".chart")
    assert handle_input(state, ".chart a").startswith("a by store")


def test_quit_and_exit_end_the_session(state):
    assert handle_input(state, ".quit") == "" and state.quit_requested
    for words in (".exit", "quit", "exit", "\\q"):
        state.quit_requested = False
        handle_input(state, words)
        assert state.quit_requested


class _Interrupting:
    """A connection whose queries are interrupted by Ctrl-C (a real SIGINT), after a charge or not."""

    def __init__(self, db, *, charge: bool, duckdb_style: bool = False):
        self._db, self._charge, self._duckdb_style = db, charge, duckdb_style

    def __getattr__(self, name):
        return getattr(self._db, name)

    def sql(self, sql, **options):
        if self._charge:
            self._db.sql("SELECT COUNT(*) FROM visits", epsilon=0.25)
        try:
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(5)  # the signal interrupts this
        except KeyboardInterrupt:
            if not self._duckdb_style:
                raise
            # DuckDB turns an interrupt into a query error, which the engine reports as a failure.
            raise QueryFailed("the query failed while running; its cost was charged") from None
        raise AssertionError("Ctrl-C did not interrupt the query")


@pytest.mark.parametrize("charge, duckdb_style, expected", [
    (False, False, "cancelled before anything was charged\n"),
    (True, False, "cancelled: epsilon 0.25 was already charged and no answer was released\n"),
    (True, True, "cancelled: epsilon 0.25 was already charged and no answer was released\n"),
])
def test_ctrl_c_cancels_the_running_query_not_the_shell(db, charge, duckdb_style, expected):
    state = new_state(_Interrupting(db, charge=charge, duckdb_style=duckdb_style))
    handler = signal.getsignal(signal.SIGINT)
    started = time.monotonic()
    with shell_app.ctrl_c_cancels(state):
        assert handle_input(state, GROUPED) == expected
    assert time.monotonic() - started < 4
    assert signal.getsignal(signal.SIGINT) is handler


def test_run_script_stops_at_quit(state):
    printed = []
    run_script(state, ".mode csv\nSELECT COUNT(*) AS n\nFROM visits;\n.quit\nSELECT 1;\n", printed.append)
    assert printed[0] == "mode csv\n" and printed[1].startswith("n,n_halfwidth95\n")
    assert len(printed) == 3


# -- the prompt_toolkit loop, driven through a pipe --------------------------------------------

@contextmanager
def deadline(seconds: float):
    """Fail (rather than hang) if the block takes longer than ``seconds``."""
    def give_up(signum, frame):
        raise TimeoutError(f"the shell did not finish within {seconds} s")

    previous = signal.signal(signal.SIGALRM, give_up)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def drive(db, keystrokes: list[str], *, history=None, seconds: float = 20) -> str:
    """Type ``keystrokes`` into the shell, each chunk once the prompt has redrawn; return its output.

    Waiting for a redraw makes a Tab arrive alone, as a person's would, so its completion
    is computed before the next keys.
    """
    from prompt_toolkit.input import create_pipe_input
    from prompt_toolkit.output import DummyOutput

    class RedrawSignallingOutput(DummyOutput):
        def __init__(self):
            super().__init__()
            self.redrawn = threading.Event()

        def flush(self):
            self.redrawn.set()

    out, output = io.StringIO(), RedrawSignallingOutput()
    with create_pipe_input() as pipe:
        def type_keys():
            for chunk in keystrokes:
                output.redrawn.wait(timeout=5)
                time.sleep(0.05)
                output.redrawn.clear()
                try:
                    pipe.send_text(chunk)
                except (OSError, ValueError):  # the shell has already left
                    return

        typist = threading.Thread(target=type_keys, daemon=True)
        typist.start()
        with deadline(seconds):
            assert shell_app.run_shell(db, name="shop.duckdb", input=pipe, output=output, out=out,
                                       history=history, color=False) == 0
        typist.join(timeout=5)
    return out.getvalue()


def test_a_newcomer_session_end_to_end(db, tmp_path):
    history = tmp_path / "history"
    output = drive(db, [
        "SELECT pl",  # a column of users, before FROM is typed: Tab completes it
        "\t",
        ", COUNT(*) AS users\r",  # Enter without ; continues the statement
        "FROM us",
        "\t",
        " GROUP BY plan ORDER BY plan;\r",
        ".chart\r",
        "SELECT user_id FROM visits;\r",
        "SELECT COUNT(*) FROM vis",  # Ctrl-C at the prompt drops the input
        "\x03",
        ".budget\r",
        "\x04",  # Ctrl-D leaves
    ], history=history)
    assert output.startswith("dpsql shell on shop.duckdb. Tables: visits, users (private), stores")
    assert re.search(r"│ free +│ +[\d,]+ ± \d+ │", output)
    assert "cost ε 0.1, δ 0 · remaining ε 2.9 of 3" in output
    assert "users by plan  (█ value, ▒─┤ 95% interval)" in output
    assert "refused: " in output
    assert "LINE 1: SELECT user_id FROM visits\n               ^\n" in output
    assert re.search(r"epsilon +3 +0.1 +2.9", output)
    assert db.budget.spent.epsilon == Fraction(1, 10)  # the dropped input never ran
    saved = history.read_text()
    assert "+SELECT plan, COUNT(*) AS users\n+FROM users GROUP BY plan ORDER BY plan;" in saved


def test_quit_command_and_escape_enter_in_the_loop(db):
    output = drive(db, [".mode csv\r", "SELECT COUNT(*) AS n FROM visits", "\x1b\r", ".quit\r",
                        "SELECT 1;\r"])
    assert "mode csv\n" in output
    assert re.search(r"n,n_halfwidth95\n-?\d+,\d", output)  # Esc Enter ran it without ;
    assert output.count("cost ε") == 1


def test_ctrl_c_during_a_query_keeps_the_shell_running(db):
    output = drive(_Interrupting(db, charge=False), [GROUPED + "\r", ".budget\r", "\x04"])
    assert "cancelled before anything was charged" in output
    assert re.search(r"epsilon +3 +0 +3", output)


class _Broken:
    """A connection with a bug: its queries raise something that is not a DPError."""

    def __init__(self, db):
        self._db = db

    def __getattr__(self, name):
        return getattr(self._db, name)

    def sql(self, sql, **options):
        raise RuntimeError("secret 42")


def test_a_bug_is_reported_without_its_message_and_the_shell_goes_on(db):
    output = drive(_Broken(db), [GROUPED + "\r", ".tables\r", "\x04"])
    assert "internal error (RuntimeError); this is a bug, please report it" in output
    assert "secret" not in output
    assert "read exactly, at no cost" in output


def test_toolbar_shows_the_budget_meter_and_the_next_query(state):
    style, meter = shell_app.toolbar(state)[0]
    assert style == "class:meter.ok"
    assert meter.strip() == "budget ε ████████████████████ 3 of 3 left · δ 1e-06 of 1e-06 left"
    handle_input(state, ".epsilon 2.5")
    handle_input(state, GROUPED)
    handle_input(state, ".mode csv")
    parts = shell_app.toolbar(state)
    assert parts[0][0] == "class:meter.low"
    assert parts[1][1] == " · next query ε 2.5 · mode csv "


def test_long_answers_go_through_the_pager(tmp_path, monkeypatch):
    paged = tmp_path / "paged.txt"
    monkeypatch.setenv("PAGER", f"sh -c 'cat > {paged}'")
    out = io.StringIO()
    shell_app._show("a\nb\nc\n", out, page=True, rows=24)
    assert out.getvalue() == "a\nb\nc\n" and not paged.exists()
    long_text = "".join(f"row {i}\n" for i in range(50))
    shell_app._show(long_text, out, page=True, rows=24)
    assert paged.read_text() == long_text
    monkeypatch.setenv("PAGER", "")
    assert shell_app.pager_command() is None


def test_history_location_comes_from_the_environment(monkeypatch, tmp_path):
    monkeypatch.setenv("DPSQL_HISTORY", str(tmp_path / "h"))
    assert shell_app.history_path() == tmp_path / "h"
    monkeypatch.delenv("DPSQL_HISTORY")
    assert shell_app.history_path() == Path("~/.dpsql_history").expanduser()


# -- a real pseudo-terminal --------------------------------------------------------------------

def test_shell_in_a_real_terminal(shop_path, tmp_path):
    pexpect = pytest.importorskip("pexpect")
    database = tmp_path / "shop.duckdb"
    database.write_bytes(shop_path.read_bytes())
    policy = tmp_path / "shop.policy"
    policy.write_text(SHOP_POLICY)
    environment = {**os.environ, "DPSQL_HISTORY": str(tmp_path / "history"), "PAGER": "cat",
                   "TERM": "xterm", "PYTHONPATH": os.pathsep.join(sys.path)}
    environment.pop("NO_COLOR", None)
    child = pexpect.spawn(sys.executable, ["-m", "dpsql.cli", "shell", str(database), "--policy", str(policy)],
                          env=environment, encoding="utf-8", timeout=15, dimensions=(40, 110))
    cursor_position_request = re.compile(re.escape("\x1b[6n"))

    def expect(pattern):
        # prompt_toolkit asks where the cursor is (to size its menus and toolbar); answer as a terminal would.
        while child.expect([cursor_position_request, pattern]) == 0:
            child.send("\x1b[1;1R")

    try:
        expect("dpsql>")
        expect("budget ε █+ 3 of 3 left")  # the toolbar
        child.send("SELECT plan, COUNT(*) AS users FROM us")
        time.sleep(0.3)
        child.send("\t")  # completes "users"
        time.sleep(0.3)
        child.send(" GROUP BY plan ORDER BY plan;\r")
        expect(r"free[^\n]*\d ± \d")
        expect(r"cost ε 0\.1, δ 0 · remaining ε 2\.9 of 3")
        expect("dpsql>")
        child.send(".budget\r")
        expect(r"epsilon\S*\s+\S*3\S*\s+\S*0\.1\S*\s+\S*2\.9")
        expect("dpsql>")
        child.send(".quit\r")
        child.expect(pexpect.EOF)
    finally:
        child.close(force=True)
    assert child.exitstatus == 0
    assert "SELECT plan, COUNT(*) AS users FROM users GROUP BY plan" in (tmp_path / "history").read_text()
