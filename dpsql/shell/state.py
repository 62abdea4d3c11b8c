"""What one shell session remembers between inputs.

The state holds the connection and the analyst's settings (defaults for the next queries,
output mode, output file) and the last answer, for ``.chart``. It is a plain mutable object
so that each dot command can be a function of (state, arguments) tested without a terminal.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from fractions import Fraction
from pathlib import Path
from typing import Any

from dpsql.shell.output import OutputRules, output_rules
from dpsql.shell.render import Answer


@dataclass
class ShellState:
    """One interactive session over one connection."""

    db: Any
    """The dpsql connection; only its public API is used."""
    mode: str = "table"
    """How answers are shown: one of ``render.MODES``."""
    epsilon: Fraction | None = None
    """Epsilon of the next queries; None means the policy's QUERY EPSILON."""
    delta: Fraction | None = None
    """Delta of the next queries; None means the policy's default."""
    output: Path | None = None
    """Where answers are written (``.output FILE``); None means the screen."""
    output_identity: tuple[int, int] | None = None
    """(device, inode) of ``output``, as ``.output`` created it."""
    created_outputs: frozenset[tuple[int, int]] = frozenset()
    """Files this session created with ``.output``: the only existing files it writes again."""
    output_rules: OutputRules = field(default_factory=lambda: output_rules(()))
    """What ``.output`` may not write: the curator's files (``dpsql.shell.output``)."""
    last_answer: Answer | None = None
    """The last answer shown, which ``.chart`` draws."""
    width: int = 100
    """Columns of the terminal, for tables and charts."""
    color: bool = False
    """Whether output carries ANSI styles (a terminal) or is plain (tests, files, pipes)."""
    quit_requested: bool = False
    """Set by ``.quit``; the loop ends after the current input."""
    cancel_requested: bool = False
    """Set by Ctrl-C while a query runs, so its failure reads as a cancellation."""
    budget: Any = None
    """The budget as last read, for the toolbar (which redraws on every key press)."""
    catalog: dict[str, list[str]] = field(default_factory=dict)
    """Table -> column names the analyst may query (schema only), for completion."""
    max_rows: int = 40
    """Rows of an answer shown on the screen (``.maxrows``); 0 shows all. Files get every row."""
    max_error: Fraction | None = None
    """The widest predicted 95% ± of the next queries' outputs (``.max_error``); None: any."""
    expected_rows: int | None = None
    """The fewest values expected in a group, where ``max_error`` judges a ratio (``.max_error X N``)."""
    first_failure: BaseException | None = None
    """The first refusal or error of the session, which sets a script's exit code."""

    def options_for(self, sql: str) -> tuple[Fraction | None, Fraction | None]:
        """(epsilon, delta) to pass with ``sql``: the session's ``.epsilon``/``.delta``, except
        those the SQL writes itself in ``WITH DIFFERENTIAL_PRIVACY OPTIONS (...)``, which win.

        >>> state = ShellState(db=None, epsilon=Fraction(1, 10), delta=Fraction(0))
        >>> state.options_for("SELECT WITH DIFFERENTIAL_PRIVACY OPTIONS (epsilon = 0.5) COUNT(*) FROM t")
        (None, Fraction(0, 1))
        >>> state.options_for("SELECT COUNT(*) FROM t")
        (Fraction(1, 10), Fraction(0, 1))
        """
        if self.epsilon is None and self.delta is None:
            return None, None
        from dpsql.sql.parse import parse

        try:
            written = parse(sql).options
        except Exception:  # the engine refuses the SQL itself, at its position
            written = {}
        return (None if "epsilon" in written else self.epsilon,
                None if "delta" in written else self.delta)

    def goal_for(self, sql: str) -> dict[str, Any]:
        """``max_error`` and ``expected_rows`` to pass with ``sql``: the session's ``.max_error``,
        except those the SQL writes itself in its OPTIONS, which win.

        >>> state = ShellState(db=None, max_error=Fraction(5), expected_rows=1000)
        >>> state.goal_for("SELECT WITH DIFFERENTIAL_PRIVACY OPTIONS (max_error = 2) AVG(x) FROM t")
        {'max_error': None, 'expected_rows': 1000}
        >>> ShellState(db=None).goal_for("SELECT COUNT(*) FROM t")
        {}
        """
        if self.max_error is None and self.expected_rows is None:
            return {}
        from dpsql.sql.parse import parse

        try:
            written = parse(sql).options
        except Exception:  # the engine refuses the SQL itself, at its position
            written = {}
        return {"max_error": None if "max_error" in written else self.max_error,
                "expected_rows": None if "expected_rows" in written else self.expected_rows}

    def record_failure(self, error: BaseException) -> None:
        """Remember the session's first refusal or error (a script's exit code names it)."""
        if self.first_failure is None:
            self.first_failure = error

    def refresh_budget(self) -> None:
        """Read the budget again (after anything that may have charged it)."""
        self.budget = self.db.budget


def new_state(db: Any, **settings: Any) -> ShellState:
    """A state for ``db`` with its catalog and budget read once."""
    state = ShellState(db=db, **settings)
    state.output_rules = output_rules(getattr(db, "curator_files", tuple)())  # a remote db has none here
    state.catalog = {table: list(db.columns(table)) for table in db.tables()}
    state.refresh_budget()
    return state
