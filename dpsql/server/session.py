"""One client connection: startup, SCRAM authentication, then the simple and extended query
protocols, on asyncio streams. Answers run in the server's worker threads (``answers``).

Nothing here reads data: a session turns bytes into statements and outcomes into bytes. The
analyst's name is the user the SCRAM exchange authenticated, never anything sent later.
"""

from __future__ import annotations

import asyncio
import logging
import re
import secrets
import struct
from dataclasses import dataclass, field, replace

from dpsql.budget.ledger import Cancellation
from dpsql.server import messages as m
from dpsql.server.answers import Outcome
from dpsql.server.processes import RelayedCancellation
from dpsql.server.scram import ScramError, final_reply, first_reply
from dpsql.server.statements import SERVER_VERSION, Statement, classify
from dpsql.server.users import decoy_verifier, load_users
from dpsql.server.values import TEXT, column_type, text_value

log = logging.getLogger("dpsql.server")
COST_PARAMETER = "dpsql_cost"
"""The ParameterStatus that carries the last answer's exact cost and accuracy as JSON."""
FREE = '{"epsilon": "0", "delta": "0", "exact": true}'
"""Its value for answers that cost nothing and read no private data (catalog, SHOW, SET)."""
UNANSWERED = '{"answered": false}'
"""Its value after an error: no answer, so no cost or accuracy to read. It is sent with every
statement's outcome, so a program never reads the last answer's figures as an error's (an
attacker's review: after a refusal the stale value still described the answer before it)."""


POLICY_CHANGED = ("the curator has changed this database's policy: this answer and your budget follow "
                  "the new one (SHOW policy shows it, SHOW budget what remains)")
"""Told once to each session answered under a policy it has not been answered under before."""


class Refused(Exception):
    """Ends the connection after an ErrorResponse (bad startup, failed authentication)."""

    def __init__(self, sqlstate: str, text: str):
        super().__init__(text)
        self.sqlstate = sqlstate


@dataclass
class Portal:
    """A bound statement and, once described or executed, its outcome."""

    statement: Statement
    outcome: Outcome | None = None


@dataclass
class Session:
    """The state of one authenticated connection."""

    analyst: str
    pid: int
    key: int = field(default_factory=lambda: secrets.randbits(31))
    status: str = "I"
    cancellation: Cancellation = field(default_factory=Cancellation)
    """The running statement's: a cancel request sets it (``Server.cancel``); each statement has its own."""
    statements: dict = field(default_factory=dict)
    portals: dict = field(default_factory=dict)
    generation: int = 0
    """The server's policy generation this session's analyst was last answered under."""
    intervals: bool = False
    """``SET dpsql.intervals = on``: every answer carries its intervals as columns."""


async def read_message(reader: asyncio.StreamReader) -> tuple[bytes, bytes]:
    """(type byte, body) of the next frontend message."""
    head = await reader.readexactly(5)
    (length,) = struct.unpack("!i", head[1:])
    if not 4 <= length <= m.MAX_MESSAGE:
        raise m.ProtocolError(f"message length {length} out of range")
    return head[:1], await reader.readexactly(length - 4)


async def read_startup(reader, writer, server) -> m.Startup:
    """The protocol 3.0 startup packet, after answering SSL and GSS requests."""
    tls = False
    while True:
        (length,) = struct.unpack("!i", await reader.readexactly(4))
        if not 8 <= length <= m.MAX_STARTUP:
            raise m.ProtocolError("invalid startup packet length: this is a PostgreSQL server")
        startup = m.parse_startup(await reader.readexactly(length - 4))
        if startup.code == m.SSL_REQUEST and server.tls is not None and not tls:
            writer.write(b"S")
            await writer.drain()
            await writer.start_tls(server.tls)
            tls = True
        elif startup.code in (m.SSL_REQUEST, m.GSS_REQUEST):
            writer.write(b"N")
            await writer.drain()
        else:
            return startup


async def authenticate(reader, writer, server, user: str) -> None:
    """SCRAM-SHA-256 against the users file; unknown users run the same exchange against a
    decoy verifier and fail at the same step with the same message."""
    users = load_users(server.users_path)  # read per login: `dpsql user add/remove` apply at once
    decoy = decoy_verifier(server.secret, user)  # made for every login, so both paths take as long
    verifier = users.get(user, decoy)
    writer.write(m.sasl_mechanisms("SCRAM-SHA-256"))
    await writer.drain()
    read = m.Reader(await _expect(reader, b"p"))
    if read.string() != "SCRAM-SHA-256":
        raise Refused("28000", "only SCRAM-SHA-256 authentication is accepted")
    client_first = read.raw(read.int32()).decode("utf-8", "replace")
    try:
        state, server_first = first_reply(client_first, verifier)
        writer.write(m.authentication(11, server_first.encode()))
        await writer.drain()
        client_final = (await _expect(reader, b"p")).decode("utf-8", "replace")
        server_final = final_reply(state, client_final)
    except ScramError as error:
        raise Refused("08P01", str(error)) from None
    if server_final is None or user not in users:
        raise Refused("28P01", f'password authentication failed for user "{user}"')
    writer.write(m.authentication(12, server_final.encode()) + m.authentication(0))


async def _expect(reader, kind: bytes) -> bytes:
    got, body = await read_message(reader)
    if got != kind:
        raise m.ProtocolError(f"expected message {kind!r} during authentication, got {got!r}")
    return body


async def start(reader, writer, server) -> Session | None:
    """Startup and authentication; the session, or ``None`` for a cancel request."""
    startup = await read_startup(reader, writer, server)
    if startup.code == m.CANCEL_REQUEST:
        server.cancel(startup.parameters["pid"], startup.parameters["key"])
        return None
    user = startup.parameters.get("user", "")
    await authenticate(reader, writer, server, user)
    database = startup.parameters.get("database") or user
    if database != server.database:
        raise Refused("3D000", f'database "{database}" does not exist; this server serves "{server.database}"')
    session = Session(user, server.next_pid(), generation=server.shared.generation,
                      intervals=asked_for_intervals(startup.parameters))
    status = {"server_version": SERVER_VERSION, "server_encoding": "UTF8", "client_encoding": "UTF8",
              "DateStyle": "ISO, MDY", "TimeZone": "UTC", "integer_datetimes": "on", "IntervalStyle": "postgres",
              "standard_conforming_strings": "on", "is_superuser": "off", "session_authorization": user,
              "application_name": startup.parameters.get("application_name", "")}
    writer.write(b"".join(m.parameter_status(k, v) for k, v in status.items())
                 + m.backend_key(session.pid, session.key) + m.ready_for_query("I"))
    await writer.drain()
    return session


async def serve_queries(reader, writer, server, session: Session) -> None:
    """The query phase, until Terminate or the client goes away."""
    failed = False  # in the extended protocol, an error skips messages until Sync
    while True:
        kind, body = await read_message(reader)
        if kind == b"X":
            return
        if kind == b"S":
            failed = False
            writer.write(m.ready_for_query(session.status))
            await writer.drain()
        elif kind == b"H":
            await writer.drain()
        elif kind == b"Q":
            sql = m.Reader(body).string()
            outcome = await run(server, session, classify(sql))
            writer.write(outcome_bytes(outcome, describe=True) + m.ready_for_query(session.status))
            await writer.drain()
        elif kind in b"PBDEC" and len(kind) == 1:
            if not failed:
                failed = not await extended(kind, body, writer, server, session)
        else:
            raise m.ProtocolError(f"unknown message type {kind!r}")


async def extended(kind: bytes, body: bytes, writer, server, session: Session) -> bool:
    """One extended-protocol message; False after sending an error."""
    if kind == b"P":
        name, sql, _ = m.parse_parse(body)
        session.statements[name] = classify(sql)
        writer.write(m.PARSE_COMPLETE)
    elif kind == b"B":
        bind = m.parse_bind(body)
        statement = session.statements.get(bind.statement)
        if statement is None:
            return _error(writer, "26000", f'prepared statement "{bind.statement}" does not exist')
        try:
            parameters = m.bound_parameters(bind)
        except m.ProtocolError as error:
            return _error(writer, "22P03", str(error), hint="send parameters as text")
        session.portals[bind.portal] = Portal(replace(statement, parameters=parameters))
        writer.write(m.BIND_COMPLETE)
    elif kind == b"D":
        target, name = m.parse_target(body)
        return await describe(target, name, writer, server, session)
    elif kind == b"E":
        name, _ = m.parse_execute(body)
        portal = session.portals.get(name)
        if portal is None:
            return _error(writer, "34000", f'portal "{name}" does not exist')
        outcome = portal.outcome or await run(server, session, portal.statement)
        portal.outcome = None  # a portal runs once; executing it again runs the query again
        writer.write(outcome_bytes(outcome, describe=False))
        return outcome.sqlstate is None
    elif kind == b"C":
        target, name = m.parse_target(body)
        (session.statements if target == "S" else session.portals).pop(name, None)
        writer.write(m.CLOSE_COMPLETE)
    return True


async def describe(target: str, name: str, writer, server, session: Session) -> bool:
    """Describe a statement (its parameters, as text; its rows: unknown before it runs) or a
    portal. A portal's rows are known only by answering it, so describing a portal answers
    it — clients send Describe and Execute together — and Execute sends the rows."""
    if target == "S":
        if name not in session.statements:
            return _error(writer, "26000", f'prepared statement "{name}" does not exist')
        count = placeholders(session.statements[name].sql)
        writer.write(m.parameter_description([TEXT] * count) + m.NO_DATA)
        return True
    portal = session.portals.get(name)
    if portal is None:
        return _error(writer, "34000", f'portal "{name}" does not exist')
    portal.outcome = await run(server, session, portal.statement)
    if portal.outcome.sqlstate is not None:
        writer.write(outcome_bytes(portal.outcome, describe=False))
        return False
    writer.write(description(portal.outcome) if portal.outcome.columns else m.NO_DATA)
    return True


def placeholders(sql: str) -> int:
    """How many parameters (``$1``...) a statement takes; each is described as text.

    >>> placeholders("SELECT * FROM pg_type WHERE typname = $1 OR oid = $2::int"), placeholders("SELECT 1")
    (2, 0)
    """
    return max((int(number) for number in re.findall(r"\$(\d+)", sql)), default=0)


def _error(writer, sqlstate: str, text: str, hint: str | None = None) -> bool:
    writer.write(m.parameter_status(COST_PARAMETER, UNANSWERED) + m.error_response(sqlstate, text, hint=hint))
    return False


async def run(server, session: Session, statement: Statement) -> Outcome:
    """Answer in a worker thread. A cancel before the charge commits stops it: nothing charged,
    nothing answered; one after it withholds the answer, and the charge stays. Either way the
    57014 is sent once the call has decided, saying which (``withheld``)."""
    session.cancellation = cancel = RelayedCancellation()  # reaches a worker process running it
    if statement.kind == "setting":
        return setting_outcome(session, statement)
    if statement.kind == "query" and session.intervals:
        statement = replace(statement, intervals=True)
    querying = statement.kind in ("query", "explain", "budget", "ledger")

    def removed() -> Outcome | None:
        # `dpsql user remove` takes effect at once: an open session of a removed user spent
        # their budget after the curator had removed them (an attacker's review).
        if querying and session.analyst not in server.user_names():
            return Outcome(sqlstate="28000",
                           message=f"user {session.analyst} was removed; this session can no longer query",
                           hint="ask the curator for an account")
        return None

    def answer_if_still_a_user(statement: Statement, analyst: str, shared) -> Outcome:
        # Checked again when a worker takes the statement: one queued behind others was answered
        # and charged after its user's removal (a served attacker's review).
        return removed() or shared.answer(statement, analyst, cancel)

    refused = removed()
    if refused is not None:
        return refused
    outcome = await server.answer(statement, session.analyst, answer_if_still_a_user)
    if transaction := outcome.transaction:
        session.status = transaction
    # The log says what the analyst was told: an answer cancelled after its charge is "withheld",
    # with the cost it was charged (a served attacker's review found such answers logged "answered").
    shown = "withheld" if cancel.requested and outcome.sqlstate is None else outcome.sqlstate or "answered"
    log.info("analyst=%s outcome=%s cost=%s sql=%s", m.printable(session.analyst), shown,
             outcome.cost, m.printable(" ".join((statement.sql or statement.kind).split()), 500))
    if outcome.sqlstate is None and outcome.tag and session.generation != server.shared.generation:
        session.generation = server.shared.generation
        outcome = replace(outcome, notes=(POLICY_CHANGED, *outcome.notes))
    if cancel.requested and outcome.sqlstate is None:
        return withheld(cancel)
    return outcome


def withheld(cancel: Cancellation) -> Outcome:
    """The 57014 of a statement cancelled once it had an answer: withheld, and what it was
    charged (the ledger's word: ``Cancellation.charged``) stays charged.

    >>> cancel = Cancellation()
    >>> withheld(cancel).message
    'canceling statement due to user request; its answer was withheld, and nothing was charged'
    >>> cancel.charged = True
    >>> withheld(cancel).message
    'canceling statement due to user request after its charge; its answer was withheld, and its cost stays charged'
    """
    if cancel.charged:
        return Outcome(sqlstate="57014", message="canceling statement due to user request after its charge; its "
                       "answer was withheld, and its cost stays charged", hint="SHOW ledger lists the charge")
    return Outcome(sqlstate="57014", message="canceling statement due to user request; its answer was withheld, "
                   "and nothing was charged")


def asked_for_intervals(parameters: dict) -> bool:
    """``dpsql.intervals`` given at connection: as a startup parameter, or in libpq's ``options``
    (``PGOPTIONS="-c dpsql.intervals=on"``, pgjdbc's ``options``), so a tool that writes its own
    SQL and sends no SET gets intervals as columns too.

    >>> asked_for_intervals({"options": "-c dpsql.intervals=on"}), asked_for_intervals({"options": "-c x=1"})
    (True, False)
    """
    given = parameters.get("dpsql.intervals")
    for name, value in re.findall(r"(?:-c\s*|--)([\w.]+)=(\S+)", parameters.get("options", "")):
        if name.lower() == "dpsql.intervals":
            given = value
    return given is not None and given.lower() in ("on", "true", "yes", "1")


def setting_outcome(session: Session, statement: Statement) -> Outcome:
    """``SET``, ``RESET`` or ``SHOW`` of one of the session's own settings (``dpsql.intervals``)."""
    assert statement.setting is not None  # classify gives every 'setting' statement its setting
    name, value = statement.setting
    if value is None:
        return Outcome((name,), (("on" if session.intervals else "off",),), "SHOW")
    session.intervals = value
    return Outcome(tag="SET")


def description(outcome: Outcome) -> bytes:
    columns = [(str(name), column_type([row[i] for row in outcome.rows]))
               for i, name in enumerate(outcome.columns)]
    return m.row_description(columns)


def outcome_bytes(outcome: Outcome, *, describe: bool) -> bytes:
    """The messages for an outcome (RowDescription first in the simple protocol)."""
    if outcome.sqlstate is not None:
        return m.parameter_status(COST_PARAMETER, UNANSWERED) + m.error_response(
            outcome.sqlstate, outcome.message, position=outcome.position, hint=outcome.hint)
    # For programs, on every statement; libpq keeps it (PQparameterStatus), psql shows nothing.
    cost = m.parameter_status(COST_PARAMETER, outcome.detail or FREE)
    if not outcome.tag:
        return cost + m.EMPTY_QUERY
    parts = [m.notice(text) for text in (outcome.notice, outcome.intervals) if text]
    parts.extend(m.notice(f"dpsql: {note}") for note in outcome.notes)
    parts.append(cost)
    if describe and outcome.columns:
        parts.append(description(outcome))
    parts.extend(m.data_row([text_value(v) for v in row]) for row in outcome.rows)
    parts.append(m.command_complete(outcome.tag))
    return b"".join(parts)
