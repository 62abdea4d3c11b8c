"""The shell as a client of ``dpsql serve``: ``dpsql shell postgresql://alice@host:5433/shop``.

``RemoteConnection`` offers what the shell uses of a local ``Connection`` (``sql``,
``explain``, ``budget``, ``ledger``, ``tables``, ``columns``, ``policy``, ``policy_text``)
over psycopg, so every dot command that reads works the same remotely; the analyst is the
user the server authenticated. Epsilon and delta set with ``.epsilon``/``.delta`` travel in
the SQL (``SELECT WITH DIFFERENTIAL_PRIVACY OPTIONS (...)``); the exact cost and each noisy
cell's 95% interval and half-width come back in the ``dpsql_cost`` parameter the server sends.

>>> with_options("SELECT COUNT(*) FROM visits", 0.5, None)
('SELECT WITH DIFFERENTIAL_PRIVACY OPTIONS (epsilon = 0.5) COUNT(*) FROM visits', Shift(at=6, added=50, prefix=0))
>>> with_options("SELECT 1", None, None)
('SELECT 1', Shift(at=0, added=0, prefix=0))
>>> Shift(at=6, added=50, prefix=8).typed_offset(8 + 6 + 50 + 1)
7
"""

from __future__ import annotations

import getpass
import json
import math
import re
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

from dpsql.answer.result import Budget, DPResult, QueryCost
from dpsql.budget.accounting import Spend
from dpsql.errors import (
    BudgetExceeded,
    DPError,
    InvalidParameter,
    QueryFailed,
    UnsupportedQuery,
    position_of,
)
from dpsql.policy.language import load_policy

ERRORS = {"53400": BudgetExceeded, "22023": InvalidParameter, "58000": QueryFailed}
"""SQLSTATEs the server sends for dpsql's errors (``dpsql.server.answers.SQLSTATES``)."""
_SELECT = re.compile(r"\s*select\b", re.IGNORECASE)


def is_url(target: str) -> bool:
    return isinstance(target, str) and target.startswith(("postgresql://", "postgres://"))


def shown_url(url: str) -> str:
    """The URL without its password, for the prompt and messages.

    >>> shown_url("postgresql://alice:secret@127.0.0.1:5433/shop")
    'postgresql://alice@127.0.0.1:5433/shop'
    """
    return re.sub(r"^(postgres(?:ql)?://[^:@/]*):[^@/]*@", r"\1@", url)


def connect_remote(url: str) -> "RemoteConnection":
    """Connect to a dpsql server, asking for the password if neither the URL, PGPASSWORD nor
    ~/.pgpass gives one."""
    import psycopg

    try:
        return RemoteConnection(psycopg.connect(url, autocommit=True, connect_timeout=10))
    except psycopg.OperationalError as error:
        if "password" not in str(error) or "no password" not in str(error):
            raise DPError(f"cannot connect: {str(error).strip().splitlines()[-1]}",
                          hint="check the host, port, database name, user and password") from None
    password = getpass.getpass("Password: ")
    try:
        return RemoteConnection(psycopg.connect(url, password=password, autocommit=True, connect_timeout=10))
    except psycopg.OperationalError as error:
        raise DPError(f"cannot connect: {str(error).strip().splitlines()[-1]}",
                      hint="check the user name and password") from None


@dataclass(frozen=True)
class Shift:
    """Where text was added to what the analyst typed, to put error positions back."""

    at: int
    """Offset in the typed SQL where the options were inserted."""
    added: int
    """Characters inserted there."""
    prefix: int = 0
    """Characters sent before the typed SQL (``EXPLAIN ``)."""

    def typed_offset(self, sent: int) -> int:
        """The 0-based offset in the typed SQL of 0-based offset ``sent`` in the sent text."""
        offset = max(sent - self.prefix, 0)
        if offset >= self.at + self.added:
            return offset - self.added
        return min(offset, self.at)


def with_options(sql: str, epsilon: Any, delta: Any, max_error: Any = None,
                 expected_rows: Any = None) -> tuple[str, Shift]:
    """``sql`` with epsilon, delta, max_error and expected_rows written into it after its SELECT,
    and the shift."""
    match = _SELECT.match(sql)
    given = [(name, value) for name, value in (("epsilon", epsilon), ("delta", delta), ("max_error", max_error))
             if value is not None]
    given += [] if expected_rows is None else [("expected_rows", int(expected_rows))]
    if not given or match is None or "differential_privacy" in sql.lower():
        return sql, Shift(0, 0)
    options = ", ".join(f"{name} = {value if isinstance(value, int) else repr(float(value))}"
                        for name, value in given)
    inserted = f" WITH DIFFERENTIAL_PRIVACY OPTIONS ({options})"
    return sql[:match.end()] + inserted + sql[match.end():], Shift(match.end(), len(inserted))


class RemoteConnection:
    """A dpsql server seen through one psycopg connection."""

    def __init__(self, connection):
        self._connection = connection
        self.analyst = connection.info.user
        self.policy = load_policy(self._rows("SHOW policy")[0][0])

    def sql(self, sql: str, epsilon: Any = None, delta: Any = None, *, max_error: Any = None,
            expected_rows: Any = None, **_: Any) -> DPResult:
        """The server's answer to ``sql``, with its cost and accuracy."""
        text, shift = with_options(sql, epsilon, delta, max_error, expected_rows)
        cursor = self._execute(text, sql, shift)
        columns = [column.name for column in cursor.description or ()]
        rows = cursor.fetchall() if cursor.description else []
        detail = json.loads(self._connection.info.parameter_status("dpsql_cost") or "{}")
        exact = bool(detail.get("exact", True))
        cost = QueryCost(Fraction(detail.get("epsilon", "0")), Fraction(detail.get("delta", "0")),
                         None if detail.get("rho") is None else Fraction(detail["rho"]),
                         accounting=detail.get("accounting", "basic"), repeat=bool(detail.get("repeat")),
                         public=exact and not detail.get("synthetic"), synthetic=bool(detail.get("synthetic")))
        half = detail.get("halfwidth95") or {}

        def widths(alpha: float) -> dict[str, list[float]]:
            # The server sends the 95% interval only: other levels are not known here.
            # null: no ± could be derived (NaN, shown as "derived, no ±").
            return {name: [math.nan if value is None else value] * len(rows)
                    for name, value in half.items()} if alpha == 0.05 else {}

        def intervals(alpha: float) -> dict[str, list[tuple[float, float, float]]]:
            # Each row's own 95% interval and half-width, as the server derived them.
            ends, halves = detail["intervals95"], detail.get("halfwidths95") or {}
            return {name: [(math.nan, math.nan, math.nan) if pair is None else
                           (pair[0], pair[1], math.nan if (halves.get(name) or [None] * len(rows))[i] is None
                            else halves[name][i]) for i, pair in enumerate(column)]
                    for name, column in ends.items()} if alpha == 0.05 else {}

        per_row = "intervals95" in detail and all(len(c) == len(rows) for c in detail["intervals95"].values())
        return DPResult(columns, rows, cost, widths=widths, intervals=intervals if per_row else None, exact=exact,
                        notes=detail.get("notes") or (), limits=detail.get("limits"), bounding=detail.get("bounding"))

    def explain(self, sql: str, epsilon: Any = None, delta: Any = None, *, max_error: Any = None,
                expected_rows: Any = None, **_: Any) -> str:
        text, shift = with_options(sql, epsilon, delta, max_error, expected_rows)
        shift = Shift(shift.at, shift.added, prefix=len("EXPLAIN VERBOSE "))  # with its SQL, as db.explain
        return "\n".join(row[0] for row in self._execute("EXPLAIN VERBOSE " + text, sql, shift).fetchall())

    @property
    def budget(self) -> Budget:
        rows = {row[0]: row[1:] for row in self._rows("SHOW budget")}
        scopes = [(scope, values) for scope, values in rows.items() if scope.startswith("analyst ")]
        analyst = None
        if scopes:
            scope, values = scopes[0]
            analyst = _budget(values, self.policy.accounting, owner=scope.split(" ", 1)[1])
        return _budget(rows["total"], self.policy.accounting, analyst=analyst)

    def ledger(self):
        import pandas as pd

        cursor = self._execute("SHOW ledger", "SHOW ledger", Shift(0, 0))
        return pd.DataFrame(cursor.fetchall(), columns=[c.name for c in cursor.description])

    def tables(self) -> list[str]:
        return [t.name for t in (*self.policy.private_tables, *self.policy.public_tables)]

    def synthetic_tables(self):
        """Your synthetic tables at the server (``SELECT * FROM synthetic_tables()``, free)."""
        import pandas as pd

        cursor = self._execute("SELECT * FROM synthetic_tables()", "SELECT * FROM synthetic_tables()", Shift(0, 0))
        return pd.DataFrame(cursor.fetchall(), columns=[c.name for c in cursor.description])

    def columns(self, table: str) -> dict[str, str]:
        if self.policy.table(table) is None:
            raise UnsupportedQuery(f"unknown table {table}", hint=f"the tables are: {', '.join(self.tables())}")
        name = table.split(".")[-1].lower().replace("'", "''")
        return dict(self._rows("SELECT column_name, data_type FROM information_schema.columns "
                               f"WHERE table_name = '{name}' ORDER BY ordinal_position"))

    def policy_text(self) -> str:
        return self._rows("SHOW policy")[0][0]

    def close(self) -> None:
        self._connection.close()

    def __enter__(self) -> "RemoteConnection":
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()

    def _rows(self, sql: str) -> list[tuple]:
        return self._execute(sql, sql, Shift(0, 0)).fetchall()

    def _execute(self, text: str, typed: str, shift: Shift):
        """Run ``text``; a server error becomes the DPError it was, at its place in ``typed``."""
        import psycopg

        try:
            return self._connection.execute(text)
        except psycopg.Error as error:
            raise _dp_error(error, typed, shift) from None


def _dp_error(error, typed: str, shift: Shift) -> DPError:
    diagnostic = error.diag
    kind = ERRORS.get(diagnostic.sqlstate or "", UnsupportedQuery)
    line = col = None
    if diagnostic.statement_position:
        line, col = position_of(typed, shift.typed_offset(int(diagnostic.statement_position) - 1))
    message = diagnostic.message_primary or str(error).strip()
    return kind(message, line=line, col=col, hint=diagnostic.message_hint)


def _budget(values: tuple, accounting: str, *, owner: str | None = None, analyst: Budget | None = None) -> Budget:
    exact = [Fraction(repr(float(v))) for v in values]
    return Budget(Spend(exact[0], exact[3]), Spend(exact[1], exact[4]), Spend(exact[2], exact[5]),
                  accounting=accounting, analyst=analyst, owner=owner)
