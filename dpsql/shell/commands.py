"""Dot commands, in the DuckDB CLI's style, each declared once in ``REGISTRY``.

A command is a function of (state, argument text) that returns what to print; it needs no
terminal, so each is tested by calling it. ``@dot_command`` records its name, arguments and
one line of help; ``.help`` and the completion of command names are generated from that.

>>> print(help_text().splitlines()[0])  # doctest: +NORMALIZE_WHITESPACE
.budget   what has been spent and what remains
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path
from typing import Callable

from dpsql.errors import DPError
from dpsql.shell.budget import render_budget
from dpsql.shell.chart import ChartError, render_chart
from dpsql.shell.complete import DotArgument
from dpsql.shell.output import create_output, refuse_output
from dpsql.shell.render import MODES, first_rows, number, render_error, render_rows
from dpsql.shell.state import ShellState
from dpsql.sql.types import holds_lists, implied_domain


@dataclass(frozen=True)
class DotCommand:
    """One dot command."""

    name: str
    """What the analyst types, with its dot: ``.schema``."""
    arguments: str
    """Its arguments as shown in ``.help``: ``[TABLE]``."""
    help: str
    """One line for ``.help``."""
    run: Callable[[ShellState, str], str]
    """Does the command and returns what to print."""
    completes: DotArgument
    """What its argument completes to."""
    aliases: tuple[str, ...] = ()
    """Other names it answers to."""


REGISTRY: dict[str, DotCommand] = {}
"""Every dot command by name, in the order they were declared."""


class CommandError(Exception):
    """A dot command could not do what was asked; the message says what to type instead."""


def dot_command(name: str, arguments: str = "", *, help: str, completes: DotArgument = DotArgument("none"),
                aliases: tuple[str, ...] = ()):
    """Declare the decorated function as the dot command ``name``."""
    def register(run: Callable[[ShellState, str], str]) -> Callable[[ShellState, str], str]:
        REGISTRY[name] = DotCommand(name, arguments, help, run, completes, aliases)
        return run
    return register


def find_command(name: str) -> DotCommand | None:
    """The command called ``name`` (or one of its aliases), case-insensitively."""
    name = name.lower()
    return next((c for c in REGISTRY.values() if name == c.name or name in c.aliases), None)


def run_dot_command(state: ShellState, line: str) -> str:
    """Run one dot-command line, e.g. ``.schema visits``."""
    name, _, argument = line.strip().partition(" ")
    command = find_command(name)
    if command is None:
        close = difflib.get_close_matches(name.lower(), list(REGISTRY), n=1)
        suggestion = f"did you mean {close[0]}? " if close else ""
        raise CommandError(f"unknown command {name}; {suggestion}.help lists the commands")
    return command.run(state, argument.strip())


def completion_arguments() -> dict[str, DotArgument]:
    """Each command name and alias -> what its argument completes to, for the completer."""
    arguments = {}
    for command in REGISTRY.values():
        for name in (command.name, *command.aliases):
            arguments[name] = command.completes
    return arguments


def help_text() -> str:
    """The help screen, generated from the registry."""
    commands = sorted(REGISTRY.values(), key=lambda c: c.name)
    usages = [f"{c.name} {c.arguments}".strip() for c in commands]
    width = max(len(u) for u in usages) + 2
    lines = [f"{usage:<{width}}{c.help}" for usage, c in zip(usages, commands)]
    lines += [
        "",
        "SQL: end a statement with ; to run it (Enter before that starts a new line; Esc Enter runs",
        "the input as it is). Noisy values read value ± the half-width of their 95% noise interval,",
        "or value [low, high] where the interval is cut to what the policy allows (a count is at least 0).",
        "Keys: Tab completes, Ctrl-C cancels the input or a running query, Ctrl-D leaves.",
    ]
    return "\n".join(lines) + "\n"


# -- the commands ------------------------------------------------------------------------------

@dot_command(".help", "[COMMAND]", help="list the commands, or explain one",
             completes=DotArgument("command"))
def show_help(state: ShellState, argument: str) -> str:
    if not argument:
        return help_text()
    command = find_command(argument if argument.startswith(".") else "." + argument)
    if command is None:
        raise CommandError(f"no command {argument}; .help lists them")
    doc = (command.run.__doc__ or "").strip()
    usage = f"{command.name} {command.arguments}".strip()
    return f"{usage}\n  {command.help}\n" + (f"\n{doc}\n" if doc else "")


@dot_command(".tables", help="the tables you may query: private, public, and your synthetic tables")
def show_tables(state: ShellState, argument: str) -> str:
    rows = [(name, *_describe_table(state, name)) for name in state.db.tables()] + _synthetic_rows(state)
    return render_rows(["table", "kind", "limits"], rows, width=state.width, color=state.color)


def _synthetic_rows(state: ShellState) -> list[tuple[str, str, str]]:
    """Your own synthetic tables (``db.synthetic_tables()``: free, here and at a server), or none
    where the server has no such listing."""
    try:
        listed = state.db.synthetic_tables()
    except DPError:
        return []
    return [(name, "synthetic", f"yours: {str(method).upper()} over {source}; read exactly, at no cost")
            for name, method, source in zip(listed["name"], listed["method"], listed["source"])]


@dot_command(".schema", "[TABLE]", help="columns, types and policy rules (bounds, keys) of the tables",
             completes=DotArgument("table"))
def show_schema(state: ShellState, argument: str) -> str:
    """Bounds say what SUM and AVG clamp a column to; keys are the public values GROUP BY releases."""
    tables = [argument] if argument else state.db.tables()
    parts = []
    for table in tables:
        columns = state.db.columns(table)  # refuses an undeclared table
        declaration = state.db.policy.table(table)
        kind, limits = _describe_table(state, table)
        rows = [(column, type_, _column_rule(declaration, column, type_)) for column, type_ in columns.items()]
        title = f"{declaration.name}: {kind}" + (f", {limits}" if limits else "")
        parts.append(title + "\n" + render_rows(["column", "type", "policy"], rows,
                                                width=state.width, color=state.color))
    return "\n".join(parts)


@dot_command(".policy", help="the privacy policy, in dpsql's policy language")
def show_policy(state: ShellState, argument: str) -> str:
    return state.db.policy_text().rstrip("\n") + "\n"


@dot_command(".budget", help="what has been spent and what remains")
def show_budget(state: ShellState, argument: str) -> str:
    state.refresh_budget()
    return render_budget(state.budget, width=state.width, color=state.color)


@dot_command(".ledger", "[N]", help="the last N charges to the budget (default 20)")
def show_ledger(state: ShellState, argument: str) -> str:
    """Every charge stays in the ledger file beside the database, whoever made it."""
    limit = _positive_int(argument, "N") if argument else 20
    frame = state.db.ledger()
    if len(frame) == 0:
        return "no charges yet: the whole budget remains\n"
    # Columns may be added by newer accountants; show the known ones that exist.
    shown = [c for c in ("id", "time", "analyst", "epsilon", "delta", "rho", "sql") if c in frame.columns]
    rows = []
    for record in frame.tail(limit)[shown].itertuples(index=False, name=None):
        cells = dict(zip(shown, record))
        cells["time"] = str(cells.get("time", ""))[:19].replace("T", " ")
        cells["sql"] = " ".join(str(cells.get("sql", "")).split())
        for key in ("epsilon", "delta", "rho"):
            if key in cells:
                cells[key] = "" if cells[key] is None or cells[key] != cells[key] else number(cells[key])
        cells["analyst"] = cells.get("analyst") or ""
        rows.append(tuple(str(cells[c]) for c in shown))
    more = len(frame) - limit
    note = f"({more} earlier charge{'s' if more != 1 else ''} not shown; .ledger {len(frame)} shows all)\n" \
        if more > 0 else ""
    return render_rows(shown, rows, width=state.width, color=state.color, wrap_last=True) + note


@dot_command(".explain", "SQL", help="what a query would run and cost; reads no data, spends nothing",
             completes=DotArgument("sql"))
def explain(state: ShellState, argument: str) -> str:
    sql = argument.strip().removesuffix(";")
    if not sql:
        raise CommandError("give a query: .explain SELECT COUNT(*) FROM visits")
    epsilon, delta = state.options_for(sql)
    try:
        text = state.db.explain(sql, epsilon=epsilon, delta=delta, **state.goal_for(sql))
        if getattr(text, "refused", None) is not None:  # a script's exit code says so too
            state.record_failure(text.refused)
        return text.rstrip("\n") + "\n"
    except DPError as error:
        state.record_failure(error)
        return render_error(error, sql, color=state.color, surface="shell")


@dot_command(".epsilon", "[X|default]", help="epsilon of the next queries (default: the policy's)")
def set_epsilon(state: ShellState, argument: str) -> str:
    if argument:
        state.epsilon = None if argument.lower() == "default" else _privacy_parameter(argument, "epsilon")
    if state.epsilon is not None:
        return f"next queries: epsilon {number(state.epsilon)}\n"
    default = state.db.policy.query_epsilon
    if default is None:
        return "next queries: no epsilon set and the policy sets no QUERY EPSILON; set one with .epsilon 0.1\n"
    return f"next queries: epsilon {number(default)} (the policy's QUERY EPSILON)\n"


@dot_command(".delta", "[X|default]", help="delta of the next queries (default: the policy's)")
def set_delta(state: ShellState, argument: str) -> str:
    if argument:
        state.delta = None if argument.lower() == "default" else _privacy_parameter(argument, "delta")
    if state.delta is not None:
        return f"next queries: delta {number(state.delta)}\n"
    return f"next queries: delta {number(state.db.policy.query_delta)} (the policy's default)\n"


@dot_command(".max_error", "[X [N]|off]",
             help="refuse, before the charge, a query whose predicted 95% ± is wider than X; "
                  "a ratio (AVG...) is judged at N values per group")
def set_max_error(state: ShellState, argument: str) -> str:
    """``.max_error 5`` refuses the next queries whose outputs' predicted ± (``.explain`` shows it)
    is wider than 5, before anything is charged; ``.max_error 5 10000`` judges AVG, VARIANCE and
    the like as if each group held at least 10000 values (without it they are refused: their ±
    depends on a count that is private until released); ``.max_error off`` turns it off."""
    parts = argument.split()
    if parts and parts[0].lower() == "off" and len(parts) == 1:
        state.max_error, state.expected_rows = None, None
    elif parts:
        if len(parts) > 2:
            raise CommandError("give .max_error X, .max_error X N or .max_error off")
        try:
            value = Fraction(parts[0])
        except (ValueError, ZeroDivisionError):
            raise CommandError(f"X must be a number such as 5, got {parts[0]!r}") from None
        if value <= 0:
            raise CommandError(f"X must be greater than 0, got {parts[0]}")
        if len(parts) == 2 and not (parts[1].isdigit() and int(parts[1]) >= 1):
            raise CommandError(f"N must be a whole number of values per group such as 10000, got {parts[1]!r}")
        state.max_error = value
        state.expected_rows = int(parts[1]) if len(parts) == 2 else None
    if state.max_error is None:
        return "next queries: no max_error (any predicted ± is accepted)\n"
    rows = "" if state.expected_rows is None else \
        f"; ratios judged at {state.expected_rows:,} values per group"
    return (f"next queries: refused before the charge when a predicted 95% ± is wider than "
            f"{number(state.max_error)}{rows}\n")


@dot_command(".mode", "[" + "|".join(MODES) + "]", help="how answers are shown",
             completes=DotArgument("choice", MODES))
def set_mode(state: ShellState, argument: str) -> str:
    if argument:
        if argument.lower() not in MODES:
            raise CommandError(f"unknown mode {argument}; choose one of {', '.join(MODES)}")
        state.mode = argument.lower()
    return f"mode {state.mode}\n"


@dot_command(".maxrows", "[N]", help="rows of an answer shown on the screen (default 40; 0 shows all)")
def set_max_rows(state: ShellState, argument: str) -> str:
    """Tables and markdown show the first N rows and say how many more there are; csv, json and
    .output files always get every row."""
    if argument:
        if not argument.isdigit():
            raise CommandError(f"N must be a whole number (0 shows all rows), got {argument!r}")
        state.max_rows = int(argument)
    shown = "all rows" if state.max_rows == 0 else f"at most {state.max_rows} row{'s' if state.max_rows != 1 else ''}"
    return f"answers show {shown}\n"


@dot_command(".output", "[FILE]", help="write answers to a new FILE; with no FILE, back to the screen")
def set_output(state: ShellState, argument: str) -> str:
    """FILE must be new (or one this session created): never the database, its ledger, policy
    files, or files named like them beside the ledger."""
    if not argument:
        state.output, state.output_identity = None, None
        return "answers go to the screen\n"
    path = Path(argument).expanduser()
    refuse_output(path, state.output_rules, state.created_outputs)  # a DPError says why
    try:
        identity = create_output(path, state.created_outputs)
    except FileExistsError:
        raise CommandError(f"cannot write {path}: it was created by someone else meanwhile; "
                           "choose a new file") from None
    except OSError as error:
        raise CommandError(f"cannot write {path}: {error.strerror or error}") from None
    state.output, state.output_identity = path, identity
    state.created_outputs = state.created_outputs | {identity}
    return f"answers go to {path}\n"


@dot_command(".chart", "[COLUMN]", help="draw the last answer as a bar chart with 95% error bars")
def chart(state: ShellState, argument: str) -> str:
    """Needs a result with one numeric column (or name the one to draw); `.mode chart` draws every answer."""
    if state.last_answer is None:
        raise CommandError("no answer to draw yet: run a grouped query first, e.g. "
                           "SELECT plan, COUNT(*) AS users FROM users GROUP BY plan;")
    try:
        shown, more = first_rows(state.last_answer, state.max_rows, ".maxrows 0 shows all")
        return render_chart(shown, argument or None, width=state.width, color=state.color) + more
    except ChartError as why:
        raise CommandError(f"cannot chart the last answer: {why}") from None


@dot_command(".quit", help="leave the shell (so do Ctrl-D and .exit)", aliases=(".exit",))
def quit_shell(state: ShellState, argument: str) -> str:
    state.quit_requested = True
    return ""


# -- helpers -----------------------------------------------------------------------------------

def _describe_table(state: ShellState, name: str) -> tuple[str, str]:
    """("private" or "public", its contribution limits)."""
    declaration = state.db.policy.table(name)
    if not hasattr(declaration, "unit"):
        return "public", "read exactly, at no cost"
    unit = "each row is its own unit" if declaration.unit is None else f"privacy unit {declaration.unit}"
    rows = declaration.max_rows_per_unit
    limits = f"{unit}; at most {rows} row{'s' if rows != 1 else ''}"
    if declaration.max_groups_per_unit is not None:
        groups = declaration.groups_per_unit
        limits += f" and {groups} group{'s' if groups != 1 else ''}"
    return "private", limits + " per unit"


def _column_rule(declaration, column: str, type_name: str = "") -> str:
    if not hasattr(declaration, "unit"):
        return ""
    if declaration.unit is not None and declaration.unit.lower() == column.lower():
        return "privacy unit"
    rule = declaration.column(column)
    implied = implied_domain(type_name)
    if holds_lists(type_name):  # the bounded copy keeps this many elements of each list or map
        return f"lists: first {declaration.list_length} elements (MAX LIST LENGTH)"
    if type_name.upper() in ("VARCHAR", "BLOB", "JSON"):  # the bounded copy cuts longer strings
        cut = f"first {declaration.string_length} characters (MAX STRING LENGTH)"
        return "; ".join([_column_rule(declaration, column), cut] if rule is not None and rule.key_domain is not None
                         else [cut])
    if rule is None or rule.key_domain is None and rule.bounds is None:
        # An ENUM's values and BOOLEAN's are schema: GROUP BY releases them all, no KEYS line needed.
        return f"keys: every value of its type ({len(implied)})" if implied is not None else ""
    parts = []
    if rule.bounds is not None:
        parts.append(f"bounds {number(rule.bounds.lower)} to {number(rule.bounds.upper)}")
    if rule.keys is not None:
        if rule.keys.values is not None:
            parts.append("keys " + ", ".join(repr(v) for v in rule.keys.values))
        else:
            parts.append(f"keys from {rule.keys.table}.{rule.keys.column}")
    if rule.local is not None:
        parts.append(f"randomized response at epsilon {number(rule.local.epsilon)} over "
                     + ", ".join(repr(v) for v in rule.local.domain))
    return "; ".join(parts)


def _privacy_parameter(text: str, name: str) -> Fraction:
    """A typed epsilon or delta as an exact Fraction (the engine checks it against the policy)."""
    try:
        value = Fraction(text)
    except (ValueError, ZeroDivisionError):
        raise CommandError(f"{name} must be a number such as 0.1, got {text!r}") from None
    if name == "epsilon" and value <= 0:
        raise CommandError(f"epsilon must be greater than 0, got {text}")
    if name == "delta" and not 0 <= value < 1:
        raise CommandError(f"delta must be at least 0 and below 1, got {text}")
    return value


def _positive_int(text: str, name: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise CommandError(f"{name} must be a whole number above 0, got {text!r}")
    return int(text)
