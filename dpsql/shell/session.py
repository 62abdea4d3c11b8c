"""What one input to the shell does, without a terminal: a dot command or SQL in, text out.

``handle_input`` is the whole shell minus prompt_toolkit: the interactive loop (``app.py``)
and the script runner (``run_script``, for ``dpsql shell DB < file.sql``) both call it.
SQL goes to ``db.sql`` one statement at a time; a refusal comes back as its error with a
caret under the position, and the shell carries on.
"""

from __future__ import annotations

from typing import Iterator

from sqlglot.dialects.duckdb import DuckDB
from sqlglot.errors import SqlglotError
from sqlglot.tokens import TokenType

from dpsql.errors import DPError
from dpsql.shell.budget import cost_line
from dpsql.shell.commands import CommandError, run_dot_command
from dpsql.shell.output import append_output
from dpsql.shell.render import (
    answer_from,
    bias_lines,
    number,
    render_answer,
    render_error,
    render_notes,
)
from dpsql.shell.state import ShellState

QUIT_WORDS = frozenset({"exit", "quit", "\\q"})
"""What people type to leave other shells; accepted here too."""


def handle_input(state: ShellState, text: str, *, split: bool = True) -> str:
    """Do what one accepted input asks and return what to print.

    An input of several lines holding dot commands (pasted, or ended with Esc Enter) runs as a
    script would, so a comment line above a dot command cannot turn it into SQL."""
    if split and any(line.strip().startswith(".") for line in text.strip().splitlines()[1:]):
        return "".join(handle_input(state, part, split=False) for part in inputs_of_script(text))
    stripped = text.strip()
    if not stripped:
        return ""
    if stripped.lower() in QUIT_WORDS:
        state.quit_requested = True
        return ""
    if stripped.startswith("."):
        return _run_command(state, stripped)
    if is_only_comments(text):  # `-- a note` on its own runs nothing, as in DuckDB's CLI
        return ""
    return "".join(run_sql(state, statement) for statement in split_statements(text))


def _run_command(state: ShellState, line: str) -> str:
    try:
        return run_dot_command(state, line)
    except CommandError as error:
        state.record_failure(error)
        return f"error: {error}\n"
    except DPError as error:
        state.record_failure(error)
        return render_error(error, color=state.color, surface="shell")


def run_sql(state: ShellState, sql: str) -> str:
    """Answer one statement under the state's epsilon and delta; show it and what it cost."""
    state.cancel_requested = False
    spent_before = state.db.budget.spent
    try:
        epsilon, delta = state.options_for(sql)
        result = state.db.sql(sql, epsilon=epsilon, delta=delta, **state.goal_for(sql))
        answer = answer_from(result)
    except KeyboardInterrupt:
        return _cancelled(state, spent_before)
    except DPError as error:
        if state.cancel_requested:  # DuckDB turns Ctrl-C into a failed query
            return _cancelled(state, spent_before)
        state.record_failure(error)
        return render_error(error, sql, color=state.color, surface="shell")
    except Exception as error:  # a bug (here or in a remote client) must not end a script; only its kind
        state.record_failure(error)
        return f"internal error ({type(error).__name__}); this is a bug, please report it\n"
    finally:
        state.refresh_budget()
    state.last_answer = answer
    footer = ((f"{answer.outside}\n" if answer.outside else "") + cost_line(answer, state.budget) + "\n"
              + bias_lines(answer) + render_notes(answer))
    if state.output is not None and state.output_identity is not None:  # .output sets both together
        try:
            append_output(state.output, render_answer(answer, state.mode, width=state.width, color=False),
                          state.output_identity)
        except DPError as error:
            return render_error(error, color=state.color) + footer
        except OSError as error:
            return f"error: cannot write {state.output}: {error.strerror or error}\n" + footer
        rows = len(answer.rows)
        return f"wrote {rows} row{'s' if rows != 1 else ''} to {state.output}\n" + footer
    return render_answer(answer, state.mode, width=state.width, color=state.color, max_rows=state.max_rows,
                         show_all=".maxrows 0 shows all") + footer


def _cancelled(state: ShellState, spent_before) -> str:
    state.refresh_budget()
    charged = state.budget.spent.epsilon - spent_before.epsilon
    if charged > 0:
        return (f"cancelled: epsilon {number(charged)} was already charged and no answer was "
                "released\n")
    return "cancelled before anything was charged\n"


# -- statements --------------------------------------------------------------------------------

def split_statements(text: str) -> list[str]:
    """The statements of ``text``, split at semicolons outside strings and comments; empty and
    comment-only ones (``SELECT 1; -- note``) are nothing to run, so they are left out.

    >>> split_statements("SELECT ';' AS s; SELECT 2 -- done;\\n;")
    ["SELECT ';' AS s", 'SELECT 2 -- done;']
    >>> split_statements("SELECT 1; -- January")
    ['SELECT 1']
    """
    try:
        tokens = DuckDB().tokenize(text)
    except SqlglotError:  # unfinished: the engine will say where
        return [text.strip()]
    statements, start = [], 0
    for token in tokens:
        if token.token_type == TokenType.SEMICOLON:
            statements.append(text[start:token.start])
            start = token.end + 1
    statements.append(text[start:])
    return [s.strip() for s in statements if s.strip() and not is_only_comments(s)]


def statement_is_complete(text: str) -> bool:
    """True when Enter should run the input: it ends with ``;``, or is a dot command.

    >>> statement_is_complete("SELECT COUNT(*)\\nFROM visits")
    False
    >>> statement_is_complete("SELECT ';'; -- a comment")
    True
    >>> statement_is_complete(".tables")
    True
    """
    stripped = text.strip()
    if not stripped or stripped.startswith(".") or stripped.lower() in QUIT_WORDS:
        return True
    try:
        tokens = DuckDB().tokenize(text)
    except SqlglotError:  # an open string or comment: the statement goes on
        return False
    # Comments alone are complete too: they run nothing, and must not hold the next dot command.
    return not tokens or tokens[-1].token_type == TokenType.SEMICOLON


def is_only_comments(text: str) -> bool:
    """True when ``text`` holds comments and blanks only (nothing to run).

    >>> is_only_comments("-- totals per store\\n/* by day */"), is_only_comments("-- x\\nSELECT 1;")
    (True, False)
    """
    try:
        return not DuckDB().tokenize(text)
    except SqlglotError:  # an unclosed comment or string: not finished yet
        return False


def inputs_of_script(script: str) -> Iterator[str]:
    """The inputs a script holds, as if typed one after another at the prompt.

    >>> list(inputs_of_script(".mode csv\\nSELECT 1\\n  AS one;\\n.budget\\n"))
    ['.mode csv', 'SELECT 1\\n  AS one;', '.budget']
    """
    pending: list[str] = []
    for line in script.splitlines():
        if line.strip().startswith(".") and (not pending or is_only_comments("\n".join(pending))):
            pending = []  # comments before a dot command are notes: they must not swallow it
            yield line.strip()
            continue
        if not pending and not line.strip():
            continue
        pending.append(line)
        text = "\n".join(pending)
        if statement_is_complete(text) and not is_only_comments(text):  # a comment stays with its SQL
            yield "\n".join(pending)
            pending = []
    if pending and "\n".join(pending).strip():
        yield "\n".join(pending)


def run_script(state: ShellState, script: str, write, *, bail: bool = False) -> BaseException | None:
    """Run every input of ``script`` in order, passing what each prints to ``write``; return the
    first refusal or error (``None`` if every input succeeded). ``bail`` stops at that first one,
    as DuckDB's ``-bail`` does; otherwise the script goes on, as DuckDB's CLI does by default."""
    for text in inputs_of_script(script):
        try:
            reply = handle_input(state, text)
        except Exception as error:  # a bug must not end the script; its message may hold anything, so only its kind
            state.record_failure(error)
            reply = f"internal error ({type(error).__name__}); this is a bug, please report it\n"
        write(reply)
        if state.quit_requested or (bail and state.first_failure is not None):
            break
    return state.first_failure
