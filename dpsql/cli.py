"""The ``dpsql`` command line.

Each subcommand is one ``Command`` in ``COMMANDS``: its name, a one-line help, an example
for ``--help``, a function that declares its arguments and a function that runs it and
returns an exit code. Errors become exit codes in one place, ``dpsql.errors.exit_code``. The commands
use only dpsql's public API (``dpsql.connect`` and what it returns) and the shell's renderer,
so ``dpsql query`` prints exactly what the shell would.

Answers go to standard output; what they cost and what remains go to standard error, so
``dpsql query DB "..." --format csv > out.csv`` writes only the data.

>>> main(["demo", "--help"])  # doctest: +ELLIPSIS
usage: dpsql demo [-h] [--dir DIR]
...
0
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import traceback
import warnings
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path
from typing import Any, Callable, Sequence

from dpsql.errors import EXIT_CODES as EXIT_CODES  # re-exported: readers of the command line look here
from dpsql.errors import (
    EXIT_ERROR,
    EXIT_OK,
    EXIT_OVER_BUDGET,
    EXIT_REFUSED,
    DPError,
    PolicyError,
    SecondBudget,
    SecondBudgetWarning,
    exit_code,
)

DEFAULT_MAX_ROWS = 40
"""Rows of an answer printed by default, as DuckDB's CLI shows 40."""

_EXIT_CODES_HELP = """\
exit codes:
  0  answered (success)
  1  any other error (bad arguments, policy errors, I/O, ...)
  2  the query was refused (nothing was charged); a shell script: a statement was refused
  3  the query would exceed the privacy budget (nothing was charged; explain: it would)"""
"""Every command's codes, for ``dpsql --help``; each command's ``--help`` lists its own (``Command.exits``)."""

ERRORS_ONLY = ((EXIT_OK, "success"), (EXIT_ERROR, "an error (bad arguments, policy errors, I/O, ...)"))
"""The exit codes of a command that answers no query."""
QUERY_EXITS = ((EXIT_OK, "answered"), (EXIT_ERROR, "any other error (bad arguments, policy errors, I/O, ...)"),
               (EXIT_REFUSED, "the query was refused (nothing was charged)"),
               (EXIT_OVER_BUDGET, "the query would exceed the privacy budget (nothing was charged)"))


def exit_codes_help(exits: Sequence[tuple[int, str]]) -> str:
    """The "exit codes:" block of a command's ``--help``.

    >>> print(exit_codes_help(ERRORS_ONLY))
    exit codes:
      0  success
      1  an error (bad arguments, policy errors, I/O, ...)
    """
    return "exit codes:\n" + "\n".join(f"  {code}  {meaning}" for code, meaning in exits)


@dataclass(frozen=True)
class Command:
    """One ``dpsql`` subcommand."""

    name: str
    """What the user types after ``dpsql``."""
    help: str
    """One line for the list of commands and the top of the command's ``--help``."""
    example: str
    """Example invocations shown at the end of the command's ``--help``."""
    add_arguments: Callable[[argparse.ArgumentParser], None]
    """Declares the command's arguments on its parser."""
    run: Callable[[argparse.Namespace], int]
    """Runs the command and returns its exit code; errors it raises are mapped by ``exit_code``."""
    exits: Sequence[tuple[int, str]] = ERRORS_ONLY
    """The exit codes it can end with and what each means there, for its ``--help``."""


# -- shared arguments and helpers ----------------------------------------------------------------

def _database_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("database", metavar="DB", help="a DuckDB database file (opened read-only)")


def _policy_argument(parser: argparse.ArgumentParser, *, required: bool = False) -> None:
    parser.add_argument(
        "--policy", metavar="P", required=required,
        help="the policy file" + ("" if required else
                                  " (default: the one stored with the ledger by `dpsql init`)"),
    )


def _privacy_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--epsilon", metavar="X", help="epsilon of the query (default: the policy's QUERY EPSILON)")
    parser.add_argument("--delta", metavar="Y", help="delta of the query (default: the policy's, usually 0)")


def _max_rows_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--max-rows", metavar="N", type=_whole_number, default=DEFAULT_MAX_ROWS,
                        help=f"rows of an answer the table and markdown formats print (default "
                             f"{DEFAULT_MAX_ROWS}, then a line saying how many more; 0 prints all; "
                             "csv and json print all)")


def _whole_number(text: str) -> int:
    if not text.isdigit():
        raise argparse.ArgumentTypeError(f"expected a whole number such as 40 (0: all rows), got {text!r}")
    return int(text)


def _analyst_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--analyst", metavar="NAME",
                        help="a label for the ledger and per-analyst budget; local use is the "
                             "curator's, so it is not checked (analysts are authenticated by `dpsql serve`)")


def _persist_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--persist-copies", action="store_true",
                        help="keep the bounded copies beside the ledger (DB.ledger.copies, owner-only) so later "
                             "calls reuse them; rebuilt when the data, policy or salt changed")


def _connect(args: argparse.Namespace, *, check: Callable[[Any], None] | None = None,
             keep_fresh: bool = False):
    """Open the database under the given (or stored) policy; policy errors show their line.

    A command that fails must leave no file behind, so a database without a ledger yet is
    first opened with a ledger in memory, and ``check`` (which raises what the command would
    refuse) runs on it: only then is the ledger file made. ``keep_fresh``: the command reads
    nothing and charges nothing (explain, budget), so the in-memory ledger serves it all and
    no file is made at all.
    """
    import dpsql

    analyst = getattr(args, "analyst", None)
    persist = bool(getattr(args, "persist_copies", False))  # with the ledger file only: never the trial's
    try:
        if _ledger_exists(args.database):
            return dpsql.connect(args.database, policy=args.policy, analyst=analyst, persist_copies=persist)
        trial = dpsql.connect(args.database, policy=args.policy, analyst=analyst, ledger=":memory:")
        if keep_fresh:
            return trial
        with trial:
            if check is not None:
                check(trial)
        return dpsql.connect(args.database, policy=args.policy, analyst=analyst, persist_copies=persist)
    except PolicyError as error:
        raise _ReportedError(error, _policy_text(args.policy)) from None


def _ledger_exists(database: str) -> bool:
    """Whether the ledger of ``database`` exists (where ``dpsql.connect`` puts it: beside a DuckDB
    file, where a Spark config's ``[spark] ledger`` says)."""
    from dpsql.connection import default_ledger

    path = Path(database)
    if not path.exists():
        return True
    ledger = default_ledger(database)
    return ledger is None or ledger.exists()


def _policy_text(policy: str | None) -> str | None:
    try:
        return Path(policy).read_text(encoding="utf-8") if policy else None
    except (OSError, ValueError):
        return None


class _ReportedError(Exception):
    """A DPError to print with a caret under its position in ``source``."""

    def __init__(self, error: DPError, source: str | None):
        super().__init__(str(error))
        self.error, self.source = error, source


def _report(error: DPError, source: str | None) -> int:
    from dpsql.shell.render import render_error

    sys.stderr.write(render_error(error, source, color=_colors(sys.stderr), surface="cli"))
    return exit_code(error)


def _colors(stream: Any) -> bool:
    return stream.isatty() and "NO_COLOR" not in os.environ


def _width() -> int:
    return shutil.get_terminal_size((120, 24)).columns


# -- the commands ------------------------------------------------------------------------------

def _query_arguments(parser: argparse.ArgumentParser) -> None:
    _database_argument(parser)
    parser.add_argument("sql", metavar="SQL", help="one SELECT statement")
    _policy_argument(parser)
    _privacy_arguments(parser)
    parser.add_argument("--format", choices=("table", "csv", "json", "markdown"), default="table",
                        help="how to print the answer (default: table); csv and json add a "
                             "<column>_halfwidth95 column beside each noisy one (\"derived, no ±\" where "
                             "none can be derived)")
    _bias_argument(parser)
    _accuracy_arguments(parser)
    _max_rows_argument(parser)
    _analyst_argument(parser)
    _persist_argument(parser)


def _accuracy_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--max-error", type=float, default=None, metavar="X",
                        help="refuse the query before anything is charged when an output's predicted 95%% ± "
                             "(explain shows it) is wider than X")
    parser.add_argument("--expected-rows", type=int, default=None, metavar="N",
                        help="the fewest values you expect in a group: --max-error judges AVG, VARIANCE and "
                             "other ratios at this count (without it they are refused)")


def _bias_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--report-bias", type=float, default=None, metavar="SHARE",
                        help="spend this share of the query's epsilon (e.g. 0.05) on a noisy estimate of "
                             "the rows its contribution limits dropped and the values they clamped")


def _query(args: argparse.Namespace) -> int:
    from dpsql.shell.budget import cost_line
    from dpsql.shell.render import answer_from, bias_lines, render_answer, render_notes

    def refuse_before_the_ledger(db) -> None:  # what explain refuses, sql refuses too
        refused = getattr(db.explain(args.sql, epsilon=args.epsilon, delta=args.delta, max_error=args.max_error,
                                     expected_rows=args.expected_rows), "refused", None)
        if refused is not None:
            raise refused

    try:
        db = _connect(args, check=refuse_before_the_ledger)
    except DPError as error:
        if isinstance(error, PolicyError):
            raise
        return _report(error, args.sql)
    with db:
        try:
            answer = answer_from(db.sql(args.sql, epsilon=args.epsilon, delta=args.delta,
                                        report_bias=args.report_bias, max_error=args.max_error,
                                        expected_rows=args.expected_rows))
        except DPError as error:
            return _report(error, args.sql)
        sys.stdout.write(render_answer(answer, args.format, width=_width(), color=_colors(sys.stdout),
                                       max_rows=args.max_rows, show_all="--max-rows 0 prints all"))
        sys.stdout.flush()
        if answer.outside:
            print(answer.outside, file=sys.stderr)
        print(cost_line(answer, db.budget), file=sys.stderr)
        sys.stderr.write(bias_lines(answer) + render_notes(answer))  # beside the cost: stdout stays the answer alone
    return EXIT_OK


def _explain_arguments(parser: argparse.ArgumentParser) -> None:
    _database_argument(parser)
    parser.add_argument("sql", metavar="SQL", help="one SELECT statement")
    _policy_argument(parser)
    _privacy_arguments(parser)
    _bias_argument(parser)
    _accuracy_arguments(parser)
    _analyst_argument(parser)  # whose synthetic tables the SQL names, and whose budget a refusal reads


def _explain(args: argparse.Namespace) -> int:
    with _connect(args, keep_fresh=True) as db:
        try:
            text = db.explain(args.sql, epsilon=args.epsilon, delta=args.delta, report_bias=args.report_bias,
                              max_error=args.max_error, expected_rows=args.expected_rows)
        except DPError as error:
            return _report(error, args.sql)
    print(text.rstrip("\n"))
    refused = getattr(text, "refused", None)  # over budget: the plan is shown, and the exit says so
    return EXIT_OK if refused is None else exit_code(refused)


def _suggest_arguments(parser: argparse.ArgumentParser) -> None:
    _database_argument(parser)
    parser.add_argument("table", metavar="TABLE", help="the private table to suggest bounds for")
    _policy_argument(parser)
    parser.add_argument("--epsilon", metavar="X", help="epsilon to spend (default: the policy's QUERY EPSILON)")
    parser.add_argument("--columns", metavar="A,B",
                        help="numeric columns to bound (default: the measure-like ones, not the unit, identifiers, "
                             "calendar parts or KEYS columns; the output names what was left out)")
    parser.add_argument("--group-by", metavar="COLUMN",
                        help="also suggest MAX GROUPS PER UNIT from the distinct values of COLUMN per unit")
    parser.add_argument("--unit", metavar="COLUMN",
                        help="before any policy exists: the table's privacy unit column; each run is charged "
                             "--epsilon in the database's ledger (what it records is said), so it can be repeated")
    _analyst_argument(parser)
    _persist_argument(parser)


def _suggest(args: argparse.Namespace) -> int:
    from dpsql.curator.suggest_text import suggestion_text
    from dpsql.shell.budget import remaining_text

    before_policy = args.unit is not None
    if before_policy:
        if args.policy is not None or args.epsilon is None:
            print("dpsql: --unit stands in for a policy: give --epsilon and no --policy", file=sys.stderr)
            return EXIT_ERROR
        try:
            asked = Fraction(args.epsilon)
        except (ValueError, ZeroDivisionError):
            asked = Fraction(0)
        if asked <= 0:
            print(f"dpsql: --epsilon must be a positive number, got {args.epsilon!r}", file=sys.stderr)
            return EXIT_ERROR
        spent = _spent_before_policy(args)
        if spent is None:
            print("dpsql: a policy is stored with this database: leave out --unit; the suggestion is then charged "
                  "to the stored policy's budget", file=sys.stderr)
            return EXIT_ERROR
        args.policy = _before_policy(args.table, args.unit, spent + asked)
    columns = None if args.columns is None else [c.strip() for c in args.columns.split(",") if c.strip()]
    with _connect(args) as db:
        try:
            suggestion = db.suggest_bounds(args.table, epsilon=args.epsilon, columns=columns, group_by=args.group_by)
        except DPError as error:
            return _report(error, None)
        declared = db.policy.table(args.table)
        unit = None if declared.row_level else declared.unit
        spent = suggestion["epsilon_split"]["total"]
        sys.stdout.write(suggestion_text(declared.name, unit, suggestion, spent))
        if before_policy:
            print(f"cost ε {spent:g} · charged to the ledger beside {args.database}, which records ε "
                  f"{float(db.budget.spent.epsilon):g} spent on suggestions before any policy; run it again at any "
                  f"epsilon (each run is charged and recorded); a policy stored later with `dpsql init` counts what "
                  f"was spent against its BUDGET", file=sys.stderr)
        else:
            print(f"cost ε {spent:g} · remaining {remaining_text(db.budget)}", file=sys.stderr)
    return EXIT_OK


def _before_policy(table: str, unit: str, budget: Fraction) -> str:
    """The stand-in policy of a suggestion before any policy exists: the table's unit, and a budget
    of what the ledger has spent so far plus this suggestion's epsilon, so every run is charged
    and recorded in the database's ledger and none is refused for a budget nobody set."""
    from dpsql.policy.language import policy_to_text
    from dpsql.policy.model import Policy, PrivateTable

    return policy_to_text(Policy(budget_epsilon=budget, private_tables=(PrivateTable(table, unit, 1),)))


def _spent_before_policy(args: argparse.Namespace) -> Fraction | None:
    """The epsilon the database's ledger has recorded (0 without a ledger, which is then made by
    the suggestion itself); ``None`` when a policy is stored with it (no stand-in may replace it)."""
    import dpsql

    if not Path(args.database).exists() or not _ledger_exists(args.database):
        return Fraction(0)
    try:
        with dpsql.connect(args.database, policy=None) as stored:
            del stored
        return None
    except PolicyError:
        pass  # none stored: read what was spent under a stand-in that spends nothing
    with dpsql.connect(args.database, policy=_before_policy(args.table, args.unit, Fraction(1))) as db:
        return Fraction(db.budget.spent.epsilon)


def _budget_arguments(parser: argparse.ArgumentParser) -> None:
    _database_argument(parser)
    _policy_argument(parser)


def _budget(args: argparse.Namespace) -> int:
    from dpsql.shell.budget import render_budget

    with _connect(args, keep_fresh=True) as db:
        sys.stdout.write(render_budget(db.budget, width=_width(), color=_colors(sys.stdout)))
    return EXIT_OK


def _init_arguments(parser: argparse.ArgumentParser) -> None:
    _database_argument(parser)
    _policy_argument(parser, required=True)
    parser.add_argument("--replace", action="store_true",
                        help="replace a different stored policy; what was spent, the salt and the "
                             "ledger's history are kept, and the change is recorded in the ledger")
    parser.add_argument("--estimate-epsilon", metavar="X",
                        help="epsilon per private table for a DP estimate of the share of its rows MAX ROWS PER "
                             "UNIT drops, charged once and shown in every answer's limits line (default: the "
                             "policy's QUERY EPSILON; 0: none; a table with an estimate for its limit is skipped)")
    parser.add_argument("--separate-budget", action="store_true",
                        help="keep this database's ledger as a second budget on purpose, though another ledger "
                             "already accounts for the tables the policy protects (refused without it: one "
                             "dataset, one budget)")


def _is_zero(text: str | None) -> bool:
    """``--estimate-epsilon 0``: no estimate (anything else is checked as an epsilon)."""
    try:
        return text is not None and float(text) == 0
    except ValueError:
        return False


def _init(args: argparse.Namespace) -> int:
    import dpsql
    from dpsql.backends.spark.config import is_spark_config
    from dpsql.connection import default_ledger
    from dpsql.shell.budget import remaining_text

    if args.estimate_epsilon is not None and not _is_zero(args.estimate_epsilon):
        try:
            valid = 0 < float(args.estimate_epsilon) < float("inf")
        except ValueError:
            valid = False
        if not valid:  # refused before the policy is stored
            print(f"dpsql: --estimate-epsilon must be a number above 0 (or 0 for no estimate), "
                  f"got {args.estimate_epsilon}", file=sys.stderr)
            return EXIT_ERROR
    try:  # checks the policy against the database, then stores it
        if not _ledger_exists(args.database):  # a refusal must leave no ledger file behind
            dpsql.init_policy(args.database, args.policy, ledger=":memory:")
        with warnings.catch_warnings(record=True) as warned:  # a separate budget: said below, on stdout
            warnings.simplefilter("always", SecondBudgetWarning)
            change = dpsql.init_policy(args.database, args.policy, replace=args.replace,
                                       separate_budget=args.separate_budget)
    except SecondBudget:
        raise  # not the policy text's fault: no caret under it
    except PolicyError as error:
        raise _ReportedError(error, _policy_text(args.policy)) from None
    separate = [f"{warning.message}." for warning in warned if issubclass(warning.category, SecondBudgetWarning)]
    estimated = []
    with dpsql.connect(args.database) as db:
        if not _is_zero(args.estimate_epsilon):
            try:
                found = db.estimate_limits(args.estimate_epsilon, only_missing=True)
                estimated = [f"{name}: limits drop {drop} (ε {float(drop.epsilon):g} of the budget, once)"
                             for name, drop in found.items()]
            except DPError as error:
                estimated = [f"the share of rows the limits drop was not estimated: {error}"]
        budget = db.budget
    where = f"{args.database}.ledger" if not is_spark_config(args.database) else str(default_ledger(args.database))
    if change is None:
        done = f"The policy is checked against {args.database}; it is the one stored with its ledger ({where})."
    elif change.old is None:
        done = (f"The policy is checked against {args.database} and stored with its ledger ({where});\n"
                "later commands on this database need no --policy, and any other policy is refused.")
    else:
        done = (f"The policy stored with {where} is replaced (recorded in the ledger at {change.time});\n"
                "what was spent, the salt and the ledger's history are kept.")
    print(f"{done} Budget: {remaining_text(budget)} remaining.")
    for line in separate + estimated:
        print(line)
    return EXIT_OK


def _shell_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("database", metavar="DB",
                        help="a DuckDB database file (opened read-only), or a dpsql server's "
                             "postgresql://user@host:port/db URL")
    _policy_argument(parser)
    _analyst_argument(parser)
    _persist_argument(parser)
    _max_rows_argument(parser)
    parser.add_argument("--bail", action="store_true",
                        help="a script stops at its first refused or failed statement (as DuckDB's -bail); "
                             "without it the script goes on, and the exit code is still that of the first failure")


def _shell(args: argparse.Namespace) -> int:
    from dpsql.shell import run_shell
    from dpsql.shell.remote import connect_remote, is_url, shown_url

    if is_url(args.database):  # an analyst at a server: the server has the policy and says who they are
        if args.policy or args.analyst:
            raise DPError("--policy and --analyst do not apply to a server",
                          hint="the server's policy rules, and you are the user you log in as")
        with connect_remote(args.database) as db:
            return run_shell(db, name=shown_url(args.database), bail=args.bail, max_rows=args.max_rows)
    with _connect(args) as db:
        return run_shell(db, name=args.database, bail=args.bail, max_rows=args.max_rows)


def _demo_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--dir",
        metavar="DIR",
        default=None,
        help="where to write shop.duckdb, shop.policy and the ledger (default: ./demo-data)",
    )


def _demo(args: argparse.Namespace) -> int:
    from dpsql.demo import run_demo

    run_demo(args.dir, sys.stdout)
    return EXIT_OK


def _serve_arguments(parser: argparse.ArgumentParser) -> None:
    from dpsql.server.commands import serve_arguments

    serve_arguments(parser)


def _serve(args: argparse.Namespace) -> int:
    from dpsql.server.commands import serve

    return serve(args)


def _user_arguments(parser: argparse.ArgumentParser) -> None:
    from dpsql.server.commands import user_arguments

    user_arguments(parser)


def _user(args: argparse.Namespace) -> int:
    from dpsql.server.commands import user

    return user(args)


COMMANDS: tuple[Command, ...] = (
    Command(
        name="shell",
        help="explore a database interactively: completion, answers with ±, a budget meter",
        example="  dpsql shell demo-data/shop.duckdb --policy demo-data/shop.policy\n"
                "  dpsql shell shop.duckdb --analyst ada       # after `dpsql init`\n"
                "  dpsql shell shop.duckdb < queries.sql       # run a script\n"
                "  dpsql shell postgresql://alice@127.0.0.1:5433/shop   # at a `dpsql serve` server\n\n"
                "The history is kept in $DPSQL_HISTORY (default ~/.dpsql_history; empty: none).",
        add_arguments=_shell_arguments,
        run=_shell,
        exits=((EXIT_OK, "the session ended (a script: every statement was answered)"),
               (EXIT_ERROR, "an error (bad arguments, policy errors, I/O, ...; a script: its first failure)"),
               (EXIT_REFUSED, "a script's statement was refused (the first failure's code)"),
               (EXIT_OVER_BUDGET, "a script's statement would exceed the privacy budget (the first failure's code)")),
    ),
    Command(
        name="query",
        help="answer one SQL query with differential privacy and print it",
        example="  dpsql query shop.duckdb \"SELECT store, COUNT(*) AS n FROM visits GROUP BY store\" "
                "--epsilon 0.5\n"
                "  dpsql query shop.duckdb \"SELECT AVG(amount) AS a FROM visits\" --format json",
        add_arguments=_query_arguments,
        run=_query,
        exits=QUERY_EXITS,
    ),
    Command(
        name="explain",
        help="show what a query would run and cost, without reading data or spending budget",
        example="  dpsql explain shop.duckdb \"SELECT AVG(amount) FROM visits\" --epsilon 0.2",
        add_arguments=_explain_arguments,
        run=_explain,
        exits=((EXIT_OK, "explained; the budget can pay for the query"), QUERY_EXITS[1], QUERY_EXITS[2],
               (EXIT_OVER_BUDGET, "the query would exceed the privacy budget (the plan is shown all the same)")),
    ),
    Command(
        name="suggest",
        help="suggest MAX ROWS PER UNIT and column BOUNDS for a private table, by DP (charged)",
        example="  dpsql suggest shop.duckdb visits --epsilon 0.5\n"
                "  dpsql suggest flights.duckdb flights --unit tailnum --epsilon 1 --columns dep_delay,distance",
        add_arguments=_suggest_arguments,
        run=_suggest,
        exits=((EXIT_OK, "suggested (charged)"), QUERY_EXITS[1],
               (EXIT_REFUSED, "the request was refused (nothing was charged)"),
               (EXIT_OVER_BUDGET, "it would exceed the privacy budget (nothing was charged)")),
    ),
    Command(
        name="budget",
        help="show the privacy budget: total, spent and remaining",
        example="  dpsql budget shop.duckdb",
        add_arguments=_budget_arguments,
        run=_budget,
    ),
    Command(
        name="init",
        help="check a policy against a database and store it with the ledger",
        example="  dpsql init shop.duckdb --policy shop.policy\n"
                "  dpsql query shop.duckdb \"SELECT COUNT(*) FROM visits\"   # no --policy needed now\n"
                "  dpsql init shop.duckdb --policy shop-v2.policy --replace   # change it; spending is kept",
        add_arguments=_init_arguments,
        run=_init,
    ),
    Command(
        name="serve",
        help="serve a database to analysts over the PostgreSQL protocol (psql, psycopg, pandas, BI tools)",
        example="  dpsql user add users.txt alice                 # prompts for alice's password\n"
                "  dpsql serve shop.duckdb --users users.txt --port 5433\n"
                "  psql postgresql://alice@127.0.0.1:5433/shop   # as alice, charged to her budget",
        add_arguments=_serve_arguments,
        run=_serve,
    ),
    Command(
        name="user",
        help="manage the analysts a server lets in: add, remove, list (SCRAM verifiers, no passwords)",
        example="  dpsql user add users.txt alice\n"
                "  echo \"$PASSWORD\" | dpsql user add users.txt bob --password-stdin\n"
                "  dpsql user list users.txt\n  dpsql user remove users.txt bob",
        add_arguments=_user_arguments,
        run=_user,
        exits=((EXIT_OK, "success"), (EXIT_ERROR, "an error (bad arguments, a users file that cannot be read or "
                                                  "written, passwords that differ, ...)")),
    ),
    Command(
        name="demo",
        help="build a sample shop database and run example queries on it",
        example="  dpsql demo\n  dpsql demo --dir /tmp/shop",
        add_arguments=_demo_arguments,
        run=_demo,
    ),
)
"""Every subcommand, in the order ``--help`` lists them."""


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of ``dpsql`` with one subparser per entry of ``COMMANDS``."""
    parser = argparse.ArgumentParser(
        prog="dpsql",
        description="Differentially private SQL over DuckDB.",
        epilog="example:\n  dpsql demo\n  dpsql shell demo-data/shop.duckdb --policy demo-data/shop.policy\n\n"
               + _EXIT_CODES_HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"dpsql {package_version()}")
    subparsers = parser.add_subparsers(title="commands", dest="command", metavar="COMMAND")
    for command in COMMANDS:
        sub = subparsers.add_parser(
            command.name,
            help=command.help,
            description=command.help[:1].upper() + command.help[1:] + ".",
            epilog=f"example:\n{command.example}\n\n{exit_codes_help(command.exits)}",
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )
        command.add_arguments(sub)
        sub.set_defaults(run=command.run)
    return parser


def package_version() -> str:
    """The installed package's version, or ``dpsql.__version__`` when run from a source tree.

    >>> package_version() == __import__("dpsql").__version__
    True
    """
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("dpsql")
    except PackageNotFoundError:
        from dpsql import __version__

        return __version__


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``dpsql`` with ``argv`` (default: the process arguments) and return the exit code."""
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exit_:
        # argparse exits 2 on bad usage; 2 means "refused" here, so bad usage is 1.
        return EXIT_OK if exit_.code in (0, None) else EXIT_ERROR
    if getattr(args, "run", None) is None:
        parser.print_help(sys.stderr)
        return EXIT_ERROR
    try:
        return args.run(args)
    except _ReportedError as reported:
        return _report(reported.error, reported.source)
    except DPError as error:
        print(f"dpsql: {error.text_for('cli')}", file=sys.stderr)
        return exit_code(error)
    except OSError as error:
        print(f"dpsql: {error}", file=sys.stderr)
        return EXIT_ERROR
    except KeyboardInterrupt:  # Ctrl-C outside the shell's prompt (a command, a script)
        print("dpsql: interrupted", file=sys.stderr)
        return EXIT_ERROR
    except Exception:
        traceback.print_exc()
        print("dpsql: internal error (this is a bug, please report it)", file=sys.stderr)
        return EXIT_ERROR


if __name__ == "__main__":
    sys.exit(main())
