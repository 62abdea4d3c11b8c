"""Answering one decided statement for one analyst: dpsql's answer, a catalog look-up, or a
fixed reply, as an ``Outcome`` (rows or an error, with a SQLSTATE) the protocol sends.

All sessions share one ``Connection`` (one engine, one ledger, bounded copies built once).
``SharedDatabase.run`` hands each call its own view of it acting for the analyst the session
authenticated (``Connection.acting_for``), so each query is charged to that analyst, and
``budget`` and ``ledger()`` read their own, whatever other calls run meanwhile. Calls run side
by side: each statement on its own DuckDB cursor (``dpsql.backends.duckdb``); what must be
atomic (the budget check with the charge, a free repeat with the answer it repeats) is the
ledger's one transaction and the connection's per-query lock (``dpsql.connection``).
"""

from __future__ import annotations

import json
import logging
import math
import re
import sqlite3
import threading
from dataclasses import dataclass, replace
from typing import Any, Callable

from dpsql.answer.explain import summary
from dpsql.budget.ledger import Cancellation
from dpsql.errors import (
    BudgetExceeded,
    Cancelled,
    DPError,
    InternalFailure,
    InvalidParameter,
    PolicyError,
    QueryFailed,
    RequestTooLong,
)
from dpsql.server import intervals
from dpsql.server.catalog import Catalog, catalog_query
from dpsql.server.described import described
from dpsql.server.intervals import asks_for_intervals, exact_text
from dpsql.server.statements import Statement, budget_reply, ledger_reply

log = logging.getLogger("dpsql.server")


class PolicyNotInForce(DPError):
    """The curator replaced the stored policy and the server could not open the database
    under it: nothing is answered until it can (the reason is in the server's log)."""

    code = "policy_not_in_force"


SQLSTATES: tuple[tuple[type[BaseException], str], ...] = (
    (Cancelled, "57014"),  # query_canceled: cancelled before its charge, nothing charged
    (BudgetExceeded, "53400"),  # configuration_limit_exceeded: the budget is the limit
    (PolicyNotInForce, "55000"),  # object_not_in_prerequisite_state: the curator's to fix
    (InvalidParameter, "22023"),  # invalid_parameter_value
    (RequestTooLong, "54000"),  # program_limit_exceeded: too many statements for one request
    (QueryFailed, "58000"),  # system_error: failed after the charge, no detail by design
    (InternalFailure, "XX000"),  # internal_error: a bug in dpsql, nothing released
    (PolicyError, "42501"),  # insufficient_privilege
    (DPError, "0A000"),  # feature_not_supported: a query dpsql refuses
)
"""Which DPError becomes which SQLSTATE, first match wins."""
MESSAGE_SQLSTATES = (("the SQL does not parse", "42601"), ("unknown column", "42703"),
                     ("unknown table", "42P01"), ("unknown function", "42883"))
"""Refusals whose PostgreSQL class clients know better by its own code (syntax error,
undefined column, undefined table, undefined function): matched on the start of the message."""


@dataclass(frozen=True)
class Outcome:
    """What the protocol sends for one statement."""

    columns: tuple = ()
    rows: tuple = ()
    tag: str = ""
    notice: str | None = None
    """The query's cost and the analyst's remaining budget."""
    intervals: str | None = None
    """Each noisy column's 95% interval, as a NoticeResponse (``dpsql.server.intervals``)."""
    notes: tuple = ()
    """The answer's notes (``DPResult.notes``: why it is thin), each sent as a NoticeResponse."""
    detail: str | None = None
    """The same, for programs: JSON sent as the ``dpsql_cost`` ParameterStatus."""
    sqlstate: str | None = None
    """Set for a refusal: then message, position and hint describe it."""
    message: str = ""
    position: int | None = None
    hint: str | None = None
    transaction: str | None = None
    cost: str = "-"
    """For the log line: what was charged."""


class _Serving:
    """A connection and how many calls are running on it: a connection the server has moved
    off (a replaced policy) is closed when its last call ends, never under one."""

    def __init__(self, connection):
        self.connection = connection
        self.calls = 0
        self.retired = False


class SharedDatabase:
    """One ``Connection`` serving every session; calls run side by side, each as its analyst.

    The policy stored with the database rules it (DESIGN.md invariant 18): once the curator
    replaces it (``dpsql init --replace``), the next call opens a new connection with
    ``reopen`` (the stored policy and budget) and calls from then on run on it; calls already
    running finish on the old one, which is closed once they have (its charges the ledger
    refuses: ``run`` says so). ``generation`` counts those reloads, so a session can tell its
    analyst."""

    def __init__(self, connection, reopen: Callable[[], Any] | None = None, database: str = "memory"):
        self._serving = _Serving(connection)
        self._reopen = reopen
        self._reload = threading.Lock()
        """Held while the stored policy is checked and, if replaced, the database reopened."""
        self._calls = threading.Lock()
        """Guards ``_serving`` and the call counts."""
        self._database = database
        self.catalog = Catalog(schema_of(connection), database, described(connection.policy))
        self._retired: list[Catalog] = []
        """Catalogs of earlier policies, closed with the server: a look-up may still be reading one."""
        self.private_paths = private_paths(connection)
        """The server's files and their folders, never named to an analyst (``redacted``)."""
        self.generation = 0
        self._failure: str | None = None
        """Why the last reload failed, so the log says it once."""

    @property
    def _connection(self):
        """The connection calls start on now."""
        return self._serving.connection

    def run(self, analyst: str | None, action: Callable[[Any], Any], cancel: Cancellation | None = None) -> Any:
        """``action(connection)`` with a view of the connection acting for ``analyst``, its
        charges stopped by ``cancel`` until they commit."""
        serving = self._enter()
        try:
            return action(serving.connection.acting_for(analyst, cancel))
        except PolicyError:
            if _replaced(serving.connection):  # replaced while this call ran: the ledger refused the charge
                raise DPError("the curator changed this database's policy while your query was being "
                              "answered; nothing was charged",
                              hint="send the query again: it is answered under the new policy") from None
            raise
        finally:
            self._leave(serving)

    def catalog_answer(self, sql: str, parameters: tuple, analyst: str) -> tuple[list[str], list[tuple]]:
        """A catalog look-up by ``analyst``, from the schema of the policy in force. It waits only
        when the stored policy was replaced (then the first call reloads)."""
        if _replaced(self._connection):
            with self._reload:
                self._follow_stored_policy()
        return self.catalog.answer(sql, parameters, analyst=analyst)

    def _enter(self) -> _Serving:
        """The connection in force, counted as running one more call: first reopened under the
        stored policy if it was replaced."""
        if _replaced(self._connection):  # one read of the ledger; only a reload makes calls wait
            with self._reload:
                self._follow_stored_policy()
        with self._calls:
            serving = self._serving
            serving.calls += 1
            return serving

    def _leave(self, serving: _Serving) -> None:
        with self._calls:
            serving.calls -= 1
            done = serving.retired and serving.calls == 0
        if done:
            serving.connection.close()

    def _follow_stored_policy(self) -> None:
        """Reopen under the stored policy if it was replaced (the caller holds ``_reload``). The
        check is strict here: a ledger that cannot be read is its own error, not a replacement."""
        if not self._connection.policy_replaced:
            return
        if self._reopen is None:
            raise PolicyNotInForce("the curator changed this database's policy; this server cannot follow "
                                   "the change, and answers nothing until it restarts",
                                   hint="ask the curator to restart the server")
        try:
            fresh = self._reopen()
        except Exception as error:  # the curator's to fix; the analyst learns only that it failed
            reason = str(error)
            if reason != self._failure:
                log.error("the stored policy was replaced, and the database does not open under it: %s; "
                          "nothing is answered until it does", reason)
            self._failure = reason
            raise PolicyNotInForce("the curator changed this database's policy, and the server cannot put "
                                   "the new one in force yet; nothing was charged",
                                   hint="ask the curator to check the server's log; queries are answered "
                                        "again as soon as the new policy loads") from None
        self._retired.append(self.catalog)
        self.catalog = Catalog(schema_of(fresh), self._database, described(fresh.policy))
        self.private_paths = private_paths(fresh)
        with self._calls:
            old, self._serving = self._serving, _Serving(fresh)
            old.retired = True
            idle = old.calls == 0
        self.generation += 1
        self._failure = None
        if idle:  # otherwise its last call closes it (``_leave``)
            old.connection.close()
        log.info("the stored policy was replaced: now answering under it (budget %s)", fresh.budget)

    def close(self) -> None:
        """Close the catalogs and the connection (the server's workers have finished)."""
        with self._reload:
            for catalog in (*self._retired, self.catalog):
                catalog.close()
            self._connection.close()


def schema_of(connection) -> dict[str, dict[str, str]]:
    """Table -> column -> type of the tables the policy declares: what the catalog shows."""
    return {table: connection.columns(table) for table in connection.tables()}


def private_paths(connection) -> tuple[str, ...]:
    """The curator's files this connection uses (database, ledger, policy) and their folders,
    longest first."""
    files = connection.curator_files()
    # Folders two levels down or more: "/srv/dpsql" says where, "/srv" nothing, and replacing a
    # short one would garble a message that happens to hold its letters.
    names = {str(f) for f in files} | {str(f.parent) for f in files if len(f.parent.parts) > 2}
    return tuple(sorted(names, key=len, reverse=True))


SERVER_FILE = "(a file of the server)"
ABSOLUTE_PATH = re.compile(r"(?<![\w)\]])/[\w.~+-]+(?:/[\w.~+-]*)*")
"""A path from the root where a word could start (not ``x/2`` or ``(a)/b``, divisions)."""


def redacted(outcome: Outcome, paths: tuple[str, ...]) -> Outcome:
    """A refusal that names none of ``paths``: errors written for the curator (a ledger that
    cannot be written, a policy replaced) name files, and an analyst may learn nothing of the
    server's disk (issue 23). The curator reads the full text in the server's log.

    >>> redacted(Outcome(sqlstate="0A000", message="could not charge the ledger at /srv/a.ledger: locked",
    ...                  hint="check /srv"), ("/srv/a.ledger", "/srv")).message
    'could not charge the ledger at (a file of the server): locked'
    >>> [redacted(Outcome(sqlstate="42P01", message=f'unknown table "{name}"'), ("/srv/a.ledger",)).message
    ...  for name in ("/srv/a.ledger", "/srv/b.ledger", "x/2")]
    ['unknown table "(a file of the server)"', 'unknown table "(a file of the server)"', 'unknown table "x/2"']
    """
    def clean(text: str | None) -> str | None:
        if text is None:
            return None
        # Every absolute path first, whoever wrote it: replacing only the server's own would
        # tell an analyst which of the paths their SQL names are the server's (a free oracle,
        # found by an attacker's review).
        text = ABSOLUTE_PATH.sub(SERVER_FILE, text)
        for path in paths:
            text = text.replace(path, SERVER_FILE)
        return text

    message, hint = clean(outcome.message) or "", clean(outcome.hint)
    if message == outcome.message and hint == outcome.hint:
        return outcome
    log.info("refused with: %s (hint: %s)", outcome.message, outcome.hint)
    return replace(outcome, message=message, hint=hint)


def _replaced(connection) -> bool:
    """Whether ``connection``'s policy may no longer be the stored one, to decide whether to
    wait for the lock: a connection that a reload in another thread has just closed counts as
    replaced, and under the lock the new one is found current."""
    try:
        return connection.policy_replaced
    except Exception:
        return True


def answer(statement: Statement, analyst: str, shared: SharedDatabase, cancel: Cancellation | None = None) -> Outcome:
    """The outcome of ``statement`` for ``analyst`` (blocking: call it in a worker thread);
    ``cancel`` stops it before its charge commits (``Cancelled``: 57014, nothing charged)."""
    try:
        if cancel is not None:
            cancel.check()  # cancelled while it waited for a worker
        return _answer(statement, analyst, shared, cancel)
    except DPError as error:
        return redacted(refusal(error, statement), shared.private_paths)
    except Exception:  # a bug or a catalog query DuckDB could not run: no detail, session goes on
        return Outcome(sqlstate="XX000", message="internal error while answering; nothing was released",
                       hint="report the query to the curator")


def _answer(statement: Statement, analyst: str, shared: SharedDatabase, cancel: Cancellation | None) -> Outcome:
    kind = statement.kind
    if kind == "empty":
        return Outcome()
    if kind == "refused":
        return Outcome(sqlstate=statement.sqlstate, message=statement.message, position=statement.position,
                       hint=statement.hint)
    if kind == "reply":
        reply = statement.reply
        assert reply is not None  # classify gives every 'reply' statement its reply
        return Outcome(reply.columns, reply.rows, reply.tag, transaction=reply.transaction)
    if kind == "budget":
        reply = budget_reply(shared.run(analyst, lambda db: db.budget))
        return Outcome(reply.columns, reply.rows, reply.tag)
    if kind == "policy":
        return Outcome(("policy",), ((shared.run(analyst, lambda db: db.policy_text()),),), "SHOW 1")
    if kind == "ledger":
        reply = ledger_reply(*shared.run(analyst, lambda db: (db.ledger(), db.policy.accounting)))
        return Outcome(reply.columns, reply.rows, reply.tag)
    if kind == "explain":
        text = shared.run(analyst, lambda db: db.explain(statement.sql))
        if not statement.verbose:  # psql shows every line: the SQL made it 130 lines long (issue 23)
            shorter = summary(text)
            text = shorter + "\n\nEXPLAIN VERBOSE adds the SQL that runs" if shorter != text else text
        lines = tuple((line,) for line in text.splitlines())
        return Outcome(("QUERY PLAN",), lines, f"EXPLAIN {len(lines)}")
    if catalog_query(statement.sql):
        columns, rows = shared.catalog_answer(statement.sql, statement.parameters, analyst)
        return Outcome(tuple(columns), tuple(rows), f"SELECT {len(rows)}")
    if statement.parameters:
        return Outcome(sqlstate="0A000", message="query parameters are accepted in catalog look-ups only",
                       hint="write the values into the SQL text of a query on the policy's tables")
    result, budget = shared.run(analyst, lambda db: _with_budget(db.sql(statement.sql), db), cancel)
    found = intervals.cells(result)
    sent = intervals.rounded_ends(found)  # to the digits the ± supports, as the values are sent
    released = intervals.rounded_rows(result, found)
    as_columns = statement.intervals or asks_for_intervals(statement.sql)
    names, values = intervals.with_intervals(result, sent, released) if as_columns \
        else (tuple(result.columns), released)
    remaining = budget.analyst if budget.analyst is not None else budget
    notice = f"dpsql: cost {result.cost}; remaining: {remaining}"
    if result.outside_domain is not None and result.outside_domain.shown:  # asked for, or told from noise
        notice += f"\ndpsql: {result.outside_domain}"
    if result.limits is not None:
        notice += f"; limits: {result.limits}"
    if result.bounding is not None:
        notice += f"; bias: {result.bounding}"
    return Outcome(names, values, f"SELECT {len(values)}", notice=notice,
                   intervals=None if as_columns else intervals.notice(result, found),  # the columns hold them
                   detail=cost_detail(result, sent), cost=str(result.cost), notes=tuple(result.notes))


def _with_budget(result, db) -> tuple:
    """The answer and the budget just after it: the one it carries (read when it was charged, in
    the same call) or, when it carries none, read now (the ledger is read once, not twice)."""
    return result, result.budget if getattr(result, "budget", None) is not None else db.budget


def cost_detail(result, found: dict | None = None) -> str:
    """For programs (``dpsql shell postgresql://...``): the exact cost (exact decimals, or a
    fraction where there is none), each noisy column's 95% half-width in its own units (the
    largest over its rows; null where none can be derived, which the shell shows as "derived,
    no ±"), every row's 95% interval (``intervals95``: [low, high] or null, per column) and
    half-width (``halfwidths95``), the
    contribution limits and any bias report (as text), as JSON."""
    cost = result.cost
    limits, bounding = getattr(result, "limits", None), getattr(result, "bounding", None)
    return json.dumps({"epsilon": exact_text(cost.epsilon), "delta": exact_text(cost.delta),
                       "rho": None if cost.rho is None or getattr(cost, "accounting", "basic") == "basic"
                       else exact_text(cost.rho),  # under BASIC, rho is not what is spent
                       "accounting": getattr(cost, "accounting", "basic"), "exact": result.exact,
                       "synthetic": bool(getattr(cost, "synthetic", False)),
                       "repeat": result.repeat,
                       "halfwidth95": {} if result.exact else (   # null: "derived, no ±"
                           intervals.largest_half_widths(found) if found is not None else
                           {name: None if math.isnan(half) else half for name, half in result.accuracy(0.05).items()}),
                       "intervals95": intervals.detail(found or {}),
                       "halfwidths95": intervals.half_widths(found or {}),
                       "notes": list(result.notes),
                       "limits": None if limits is None else str(limits),
                       "bounding": None if bounding is None else str(bounding)})


LEDGER_ACTIONS = ("charge the ledger", "record an answer in the ledger", "read the ledger", "create the ledger")
"""What the ledger's errors say it could not do (``dpsql.budget.ledger``), for ``ledger_locked``."""


def ledger_locked(error: DPError) -> Outcome | None:
    """The refusal for a ledger that another process holds locked past dpsql's wait: SQLSTATE
    55P03 (lock_not_available), in words that are true for the analyst. The ledger's own error
    says "feature not supported" by its class and SQLite's "database is locked", which an analyst
    reads as the data being locked, and names the file (an attacker's review).

    >>> import sqlite3
    >>> try:
    ...     try:
    ...         raise sqlite3.OperationalError("database is locked")
    ...     except sqlite3.Error as cause:
    ...         raise DPError("could not charge the ledger at /srv/x.ledger: database is locked; "
    ...                       "nothing was charged", hint="try again") from cause
    ... except DPError as error:
    ...     outcome = ledger_locked(error)
    >>> outcome.sqlstate, outcome.message
    ('55P03', 'the privacy ledger is locked by another process, so the server could not charge it; nothing was charged')
    """
    cause = error.__cause__
    if not (isinstance(cause, sqlite3.OperationalError) and ("locked" in str(cause) or "busy" in str(cause))):
        return None
    log.warning("%s", error)  # the curator's: which file, and SQLite's words
    action = next((a for a in LEDGER_ACTIONS if error.message.startswith(f"could not {a} ")), "use the ledger")
    action = action.replace(" the ledger", " it") if action.endswith(" the ledger") else action.replace(
        " in the ledger", " in it")
    outcome = "; nothing was charged" if error.message.endswith("; nothing was charged") else ""
    return Outcome(sqlstate="55P03", message=f"the privacy ledger is locked by another process, so the server "
                   f"could not {action}{outcome}", hint="send the query again in a moment")


def refusal(error: DPError, statement: Statement) -> Outcome:
    """A DPError as an ErrorResponse: its SQLSTATE, message, position and hint."""
    if (locked := ledger_locked(error)) is not None:
        return locked
    sqlstate = next(code for kind, code in SQLSTATES if isinstance(error, kind))
    if sqlstate == "0A000":
        sqlstate = next((code for start, code in MESSAGE_SQLSTATES if error.message.startswith(start)), sqlstate)
    hint = error.hint_for("sql")
    if isinstance(error, QueryFailed):  # its hint is the curator's (a longer query_timeout): no setting named
        hint = "ask for less (a narrower filter, fewer groups); what was charged stays charged"
    return Outcome(sqlstate=sqlstate, message=error.message, hint=hint,
                   position=position_in(statement, error.line, error.col))


def position_in(statement: Statement, line: int | None, col: int | None) -> int | None:
    """The 1-based character position, in the string the client sent, of (line, col) of the
    statement's SQL.

    >>> position_in(Statement("query", sql="SELECT\\n x", offset=2), 2, 2)
    11
    """
    if line is None or col is None:
        return None
    lines = statement.sql.split("\n")
    if not 1 <= line <= len(lines):
        return None
    return statement.offset + sum(len(text) + 1 for text in lines[:line - 1]) + col
