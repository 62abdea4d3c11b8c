"""The errors dpsql raises.

Every refusal an analyst sees is a ``DPError``: one sentence saying what was found, where
(line and column of the SQL or policy text), what is allowed, and how to fix it. Errors are
decided from the query text, the schema and the policy only, never from private data; the
one exception is ``QueryFailed``, raised after a charge, whose message is fixed text.

>>> err = UnsupportedQuery("window functions are not supported", line=1, col=8,
...                        hint="aggregate with GROUP BY instead")
>>> str(err)
'window functions are not supported (line 1, column 8). Hint: aggregate with GROUP BY instead.'
"""

from __future__ import annotations


class DPError(Exception):
    """Base of every error dpsql shows an analyst."""

    code = "dp_error"

    def __init__(
        self,
        message: str,
        *,
        line: int | None = None,
        col: int | None = None,
        hint: str | None = None,
        construct: str | None = None,
        hints: dict[str, str] | None = None,
        node: object = None,
    ):
        self.message = message
        self.node = node
        """The query construct refused (a sqlglot node), when the error has one: its line and
        column are found once, at the boundary that has the SQL text (``locate``)."""
        self.line = line
        self.col = col
        self.hint = hint
        """How to fix it, in the Python API's terms (``db.sql(..., epsilon=0.1)``)."""
        self.construct = construct
        self.hints = dict(hints or {})
        """The hint in another surface's own syntax, by surface: ``cli`` (``--epsilon 0.1``),
        ``shell`` (``.epsilon 0.1``), ``sql`` (``OPTIONS (epsilon = 0.1)``); absent: ``hint``."""
        super().__init__(self._render())

    def locate(self, line: int | None, col: int | None) -> None:
        """Give the error its position in the SQL text, unless it has one already."""
        if self.line is None and line is not None:
            self.line, self.col = line, col
            self.args = (self._render(),)

    def hint_for(self, surface: str = "python") -> str | None:
        """The hint as the ``surface`` ('python', 'cli', 'shell' or 'sql') writes it.

        >>> err = InvalidParameter("no epsilon", **surface_hints("{epsilon}", epsilon="0.1"))
        >>> err.hint_for("python"), err.hint_for("cli"), err.hint_for("shell")
        ('pass epsilon=0.1', 'give --epsilon 0.1', 'set .epsilon 0.1')
        """
        return self.hints.get(surface, self.hint)

    def text_for(self, surface: str = "python") -> str:
        """The error as one sentence, its hint in ``surface``'s syntax (``str`` is the Python one)."""
        return self._render(self.hint_for(surface))

    def _render(self, hint: str | None = None) -> str:
        hint = self.hint if hint is None else hint
        text = self.message
        if self.line is not None:
            text += f" (line {self.line}, column {self.col})"
        if hint:
            text += f". Hint: {hint.rstrip('.')}."
        return text


class UnsupportedQuery(DPError):
    """A static refusal: decided from the SQL, the schema and the policy; nothing charged."""

    code = "unsupported_query"


class RequestTooLong(UnsupportedQuery):
    """A request of many statements (a stream, a fit) whose public time bound — its statements
    times the per-statement limit — passes the curator's limit per request; nothing charged."""

    code = "request_too_long"


class TooInaccurate(UnsupportedQuery):
    """The query's predicted ± is wider than the ``max_error`` its analyst gave
    (``dpsql.query.prediction``): refused before the charge, nothing charged."""

    code = "too_inaccurate"


class PolicyError(DPError):
    """The policy text or object is malformed, or does not match the database."""

    code = "policy_error"


class SecondBudget(PolicyError):
    """Opening this ledger would start a second budget over data another ledger accounts for
    (``dpsql.budget.registry``); nothing was read, nothing charged."""

    code = "second_budget"


class SecondBudgetWarning(UserWarning):
    """A ledger was opened as a second budget on purpose (``separate_budget=True``) over data
    another ledger accounts for: the privacy loss of both adds up over the same people."""


class BudgetExceeded(DPError):
    """The query would spend more than remains; nothing released, nothing charged."""

    code = "budget_exceeded"


class InvalidParameter(DPError):
    """A privacy parameter from the caller (epsilon, delta, alpha, ...) is not acceptable."""

    code = "invalid_parameter"


class InsecureFile(DPError):
    """A file holding the curator's secrets (the ledger, the users file, the persisted copies)
    that another user owns or could read or change: refused before anything is read from it."""

    code = "insecure_file"


class QueryFailed(DPError):
    """The query failed at run time after its charge; the message carries no data."""

    code = "query_failed"


class Cancelled(DPError):
    """The statement was cancelled (a PostgreSQL cancel request) before its charge committed:
    nothing was charged, nothing read (``dpsql.budget.ledger.Cancellation``)."""

    code = "cancelled"


class MissingDependency(DPError, ImportError):
    """An optional package a method needs is not installed (``DPResult.pl()`` needs polars)."""

    code = "missing_dependency"


class InternalFailure(DPError):
    """A bug in dpsql met on the analyst's input: reported as an error, never as a crash.

    ``Connection.sql`` and ``explain`` turn any exception that is not a ``DPError`` into this,
    naming only the exception's kind; nothing was released."""

    code = "internal_error"


class InternalError(Exception):
    """An invariant of dpsql itself was broken: this is a bug, please report it."""


SURFACES = ("python", "cli", "shell", "sql")
"""Where an analyst meets dpsql: the Python API, the ``dpsql`` command line, its shell, and SQL
(at a ``dpsql serve`` server). A hint naming a privacy parameter is written for each."""

_GIVE = {
    "python": lambda name, value: f"pass {name}={value}",
    "cli": lambda name, value: f"give --{name} {value}",
    "shell": lambda name, value: f"set .{name} {value}",
    "sql": lambda name, value: f"write SELECT WITH DIFFERENTIAL_PRIVACY OPTIONS ({name} = {value}) ...",
}


def surface_hints(template: str, **parameters: str) -> dict:
    """``hint`` and ``hints`` for a DPError: ``template`` with each ``{name}`` replaced by how
    each surface gives that parameter the value ``parameters[name]``.

    >>> hints = surface_hints("{delta}, or use Laplace noise", delta="1e-7")
    >>> hints["hint"], hints["hints"]["cli"]
    ('pass delta=1e-7, or use Laplace noise', 'give --delta 1e-7, or use Laplace noise')
    >>> hints["hints"]["sql"]
    'write SELECT WITH DIFFERENTIAL_PRIVACY OPTIONS (delta = 1e-7) ..., or use Laplace noise'
    """
    written = {surface: template.format(**{name: _GIVE[surface](name, value)
                                           for name, value in parameters.items()})
               for surface in SURFACES}
    return {"hint": written.pop("python"), "hints": written}


def position_of(sql: str, offset: int | None) -> tuple[int | None, int | None]:
    """1-based (line, column) of a character offset into ``sql``.

    >>> position_of("SELECT a\\nFROM t", 9)
    (2, 1)
    """
    if offset is None or offset < 0:
        return None, None
    before = sql[:offset]
    line = before.count("\n") + 1
    col = offset - (before.rfind("\n") + 1) + 1
    return line, col


# -- exit codes: what the command line and a shell script end with -----------------------------

EXIT_OK = 0
EXIT_ERROR = 1
EXIT_REFUSED = 2
EXIT_OVER_BUDGET = 3

EXIT_CODES: tuple[tuple[type[BaseException], int], ...] = (
    (UnsupportedQuery, EXIT_REFUSED),
    (BudgetExceeded, EXIT_OVER_BUDGET),
)
"""Which error ends the process with which code, first match wins; anything else is 1."""


def exit_code(error: BaseException) -> int:
    """The exit code for an error that ended a command (``dpsql query``, a shell script).

    >>> exit_code(UnsupportedQuery("window functions are not supported"))
    2
    >>> exit_code(ValueError("anything else"))
    1
    """
    for kind, code in EXIT_CODES:
        if isinstance(error, kind):
            return code
    return EXIT_ERROR
