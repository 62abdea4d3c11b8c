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
    ):
        self.message = message
        self.line = line
        self.col = col
        self.hint = hint
        self.construct = construct
        super().__init__(self._render())

    def _render(self) -> str:
        text = self.message
        if self.line is not None:
            text += f" (line {self.line}, column {self.col})"
        if self.hint:
            text += f". Hint: {self.hint.rstrip('.')}."
        return text


class UnsupportedQuery(DPError):
    """A static refusal: decided from the SQL, the schema and the policy; nothing charged."""

    code = "unsupported_query"


class PolicyError(DPError):
    """The policy text or object is malformed, or does not match the database."""

    code = "policy_error"


class BudgetExceeded(DPError):
    """The query would spend more than remains; nothing released, nothing charged."""

    code = "budget_exceeded"


class InvalidParameter(DPError):
    """A privacy parameter from the caller (epsilon, delta, alpha, ...) is not acceptable."""

    code = "invalid_parameter"


class QueryFailed(DPError):
    """The query failed at run time after its charge; the message carries no data."""

    code = "query_failed"


class MissingDependency(DPError, ImportError):
    """An optional package a method needs is not installed (``DPResult.pl()`` needs polars)."""

    code = "missing_dependency"


class InternalError(Exception):
    """An invariant of dpsql itself was broken: this is a bug, please report it."""


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
