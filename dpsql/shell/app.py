"""The interactive shell on prompt_toolkit: the prompt, its keys, toolbar, history and pager.

Everything a command or query does is in ``session.handle_input``; this module only reads
input and shows output. Enter runs the input once it ends with ``;`` (or is a dot command)
and starts a new line otherwise; Ctrl-C clears the input at the prompt and cancels a
running query; Ctrl-D on an empty prompt leaves.
"""

from __future__ import annotations

import os
import shlex
import shutil
import signal
import subprocess
import sys
import threading
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterator, TextIO

from dpsql.errors import exit_code
from dpsql.shell.budget import (
    analyst_budget,
    budget_meter,
    left_fraction,
    remaining_text,
)
from dpsql.shell.commands import completion_arguments
from dpsql.shell.complete import SQLCompleter
from dpsql.shell.render import number
from dpsql.shell.session import handle_input, run_script, statement_is_complete
from dpsql.shell.state import ShellState, new_state

if TYPE_CHECKING:  # prompt_toolkit is imported when a prompt is opened
    from prompt_toolkit.formatted_text import StyleAndTextTuples

HISTORY_ENV = "DPSQL_HISTORY"
"""Where the shell keeps its history; set it empty to keep none. Default ``~/.dpsql_history``."""

DEFAULT_HISTORY = "~/.dpsql_history"

PROMPT = "dpsql> "
CONTINUATION = "...> "

STYLE = {
    "bottom-toolbar": "noreverse bg:#303030 #d0d0d0",
    "meter.ok": "bg:#303030 ansigreen",
    "meter.low": "bg:#303030 ansiyellow",
    "meter.empty": "bg:#303030 ansired bold",
}


def history_path(environ: Any = os.environ) -> Path | None:
    """The history file: ``$DPSQL_HISTORY`` when set (empty: none), else ``~/.dpsql_history``.

    >>> history_path({"DPSQL_HISTORY": "/tmp/h"})
    PosixPath('/tmp/h')
    >>> history_path({"DPSQL_HISTORY": ""}) is None
    True
    """
    value = environ.get(HISTORY_ENV)
    if value is None:
        return Path(DEFAULT_HISTORY).expanduser()
    return Path(value).expanduser() if value.strip() else None


def run_shell(db: Any, *, name: str = "", input: Any = None, output: Any = None,
              out: TextIO | None = None, history: Path | None | str = "default",
              color: bool | None = None, bail: bool = False, max_rows: int | None = None) -> int:
    """Run the shell on ``db`` until .quit or Ctrl-D; return the exit code.

    ``input``/``output`` are prompt_toolkit's (tests pass a pipe input and a dummy output);
    ``out`` receives answers. When standard input is not a terminal, it is read as a script:
    every statement runs (with ``bail``, up to the first refusal or error), and the exit code
    is that of the first refusal or error, as ``dpsql query`` would exit on it (0 if none).
    ``max_rows``: rows of an answer shown on the screen (0: all; default 40, as ``.maxrows``).
    """
    out = sys.stdout if out is None else out
    if color is None:
        color = _is_terminal(out) and "NO_COLOR" not in os.environ
    state = new_state(db, color=color)
    if max_rows is not None:
        state.max_rows = max_rows
    if input is None and not sys.stdin.isatty():
        state.width = shutil.get_terminal_size((120, 24)).columns
        failure = run_script(state, sys.stdin.read(), out.write, bail=bail)
        out.flush()
        return script_exit_code(failure)

    session = _prompt_session(state, input, output, history)
    out.write(welcome_text(state, name))
    out.flush()
    while not state.quit_requested:
        try:
            text = session.prompt()
        except KeyboardInterrupt:  # Ctrl-C at the prompt drops the input, not the shell
            continue
        except EOFError:  # Ctrl-D
            break
        size = session.output.get_size()
        state.width = size.columns
        with ctrl_c_cancels(state):
            try:
                reply = handle_input(state, text)
            except KeyboardInterrupt:
                reply = "cancelled\n"
            except Exception as error:  # a bug must not end the session; its message may hold anything: only its kind
                reply = f"internal error ({type(error).__name__}); this is a bug, please report it\n"
        _show(reply, out, page=_is_terminal(out) and state.output is None, rows=size.rows)
    return 0


def script_exit_code(failure: BaseException | None) -> int:
    """A script's exit code: 0 when every input succeeded, else the code ``dpsql query`` gives
    the first refusal or error (2 refused, 3 over budget, 1 anything else, such as a bad
    dot command).

    >>> from dpsql.errors import UnsupportedQuery
    >>> script_exit_code(None), script_exit_code(UnsupportedQuery("no")), script_exit_code(ValueError())
    (0, 2, 1)
    """
    if failure is None:
        return 0
    return exit_code(failure)


def welcome_text(state: ShellState, name: str = "") -> str:
    """What the shell says when it starts: the tables, the budget, how to begin."""
    db = state.db
    private = [t for t in db.tables() if db.policy.is_private(t)]
    public = [t for t in db.tables() if not db.policy.is_private(t)]
    tables = ", ".join(filter(None, [
        f"{', '.join(private)} (private)" if private else "",
        f"{', '.join(public)} (public, exact and free)" if public else "",
    ]))
    default = db.policy.query_epsilon
    cost = (f"each query costs epsilon {number(default)} unless you set .epsilon"
            if default is not None else "set the epsilon of your queries with .epsilon 0.1")
    where = f" on {name}" if name else ""
    return (f"dpsql shell{where}. Tables: {tables}.\n"
            f"Budget: {remaining_text(state.budget)} remaining; {cost}.\n"
            "End SQL with ;  .help lists commands  Tab completes  Ctrl-D leaves\n")


def toolbar(state: ShellState) -> StyleAndTextTuples:
    """The bottom toolbar: the budget meter, then what the next query will use."""
    left = left_fraction(state.budget)
    level = "ok" if left > 0.25 else "low" if left > 0 else "empty"
    epsilon = state.epsilon if state.epsilon is not None else state.db.policy.query_epsilon
    mine = analyst_budget(state.budget)
    settings = f" · yours {remaining_text(mine)}" if mine is not None else ""
    settings += f" · next query ε {number(epsilon) if epsilon is not None else 'unset'}"
    if state.delta is not None:
        settings += f", δ {number(state.delta)}"
    settings += f" · mode {state.mode}"
    if state.output is not None:
        settings += f" → {state.output}"
    return [(f"class:meter.{level}", " " + budget_meter(state.budget)), ("class:bottom-toolbar", settings + " ")]


@contextmanager
def ctrl_c_cancels(state: ShellState) -> Iterator[None]:
    """While a query runs, Ctrl-C interrupts it and marks it cancelled (main thread only)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def interrupt(signum, frame):
        state.cancel_requested = True
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGINT, interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


def _prompt_session(state: ShellState, input: Any, output: Any, history: Path | None | str):
    from prompt_toolkit import PromptSession
    from prompt_toolkit.application.current import get_app
    from prompt_toolkit.auto_suggest import AutoSuggestFromHistory
    from prompt_toolkit.filters import Condition
    from prompt_toolkit.history import FileHistory, InMemoryHistory
    from prompt_toolkit.lexers import PygmentsLexer
    from prompt_toolkit.styles import Style
    from pygments.lexers.sql import SqlLexer

    path = history_path() if history == "default" else None if history is None else Path(history)
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
    # Enter inserts a new line until the statement is complete (pgcli's rule).
    typing_a_statement = Condition(lambda: not statement_is_complete(get_app().current_buffer.text))
    return PromptSession(
        PROMPT,
        multiline=typing_a_statement,
        prompt_continuation=lambda width, line, wrap: CONTINUATION.rjust(width),
        lexer=PygmentsLexer(SqlLexer),
        completer=SQLCompleter(state.catalog, completion_arguments()),
        complete_while_typing=True,
        auto_suggest=AutoSuggestFromHistory(),
        history=FileHistory(str(path)) if path is not None else InMemoryHistory(),
        bottom_toolbar=lambda: toolbar(state),
        style=Style.from_dict(STYLE),
        input=input,
        output=output,
    )


def _show(text: str, out: TextIO, *, page: bool, rows: int) -> None:
    """Print ``text``, through a pager when it is longer than the terminal."""
    if not text:
        return
    command = pager_command() if page and text.count("\n") > rows - 2 else None
    if command is None:
        out.write(text)
        out.flush()
        return
    environment = pager_environment(os.environ)
    try:
        subprocess.run(command, input=text, text=True, env=environment, check=False)
    except OSError:
        out.write(text)
        out.flush()


def pager_environment(environ: Any = os.environ) -> dict[str, str]:
    """The pager's environment: ``less`` in secure mode, whatever the caller's settings.

    A pager is a program with commands of its own: ``less`` lets whoever reads the answer
    run a shell (``!``), open or save files (``:e``, ``s``), and so reach the ledger. With
    ``LESSSECURE=1`` it refuses all of them; other pagers ignore the variable.

    >>> env = pager_environment({"LESSSECURE": "0", "LESS": "-R"})
    >>> env["LESSSECURE"], env["LESS"]
    ('1', '-R')
    """
    environment = dict(environ)
    environment.setdefault("LESS", "-FRSX")  # keep colours, chop wide lines, quit if it fits
    environment["LESSSECURE"] = "1"
    return environment


def pager_command(environ: Any = os.environ) -> list[str] | None:
    """The pager to run (``$PAGER``, else less), or None to print directly.

    >>> pager_command({"PAGER": "cat"}) is None
    True
    """
    command = environ.get("PAGER", "less").strip()
    if not command or command == "cat":
        return None
    words = shlex.split(command)
    return words if shutil.which(words[0]) else None


def _is_terminal(stream: Any) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False
