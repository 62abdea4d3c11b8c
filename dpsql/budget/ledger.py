"""The durable privacy budget ledger: every charge, kept in one SQLite file.

A charge is a row of the ``entries`` table. What has been spent is the exact sum of those
rows, so reconnecting, restarting or opening the file from another process cannot reset
it (invariant 8). Amounts are stored as exact fraction text (``"1/10"``) and added up with
``fractions.Fraction``; no float ever takes part in deciding whether a query may run.

Why two charges can never both spend the last of a budget. ``charge`` is a single
``BEGIN IMMEDIATE`` transaction: IMMEDIATE takes SQLite's write lock *before* reading what
was spent, and SQLite lets one writer at a time hold it, across connections, threads and
processes (POSIX locks on the database file and its shared-memory index). So between reading
the spent total and ``COMMIT`` no other charge can commit, and the check and the insert see
the same state. A plain (deferred) ``BEGIN`` would let two transactions both read "0.2
remains" before either writes. A refusal raises before the ``INSERT`` and rolls back, so a
refused charge writes nothing.

Why a crash after a charge loses nothing (invariant 2). The file runs in WAL mode with
``synchronous=FULL``: ``COMMIT`` returns only after the log frames holding the new entry and
its commit marker are fsync'ed. If the process (or the machine) dies after ``COMMIT``
returned, the next open replays the log and the entry is there. If it dies before, recovery
drops the uncommitted frames, but then ``charge`` never returned an id and the caller, which
reads private data only after ``charge`` returns, never read any. So the file always holds
every charge whose query may have read data; at worst it also holds one whose query never
ran, which errs on the safe side. This relies on a local file system that honours fsync and
POSIX locks (not NFS), as SQLite's WAL mode itself does.

Why an answer is committed without an fsync. ``record_answer`` runs at
``synchronous=NORMAL``: its ``COMMIT`` writes the log but does not wait for the disk, which
spares each answered query its second fsync (one disk flush takes milliseconds). The answer
still survives a crash of the process (the written log is the operating system's then); only
a power cut or kernel crash in the moments before the next fsync can lose it, and losing an
answer is safe: its charge, committed (and fsync'ed) earlier, stays, and an identical query
later finds no stored answer and is charged again for a fresh draw (invariant 9 forbids only a
fresh draw for free). The log is appended in order, so the next charge's fsync makes every
earlier answer durable too, and checkpoints fsync at either level. Each write states its own
level: every ``BEGIN IMMEDIATE`` transaction (a charge, the salt, the policy) sets
``synchronous=FULL`` first, so no charge depends on what ran before it.

Which charges fit is the accountant's decision (``dpsql.budget.accounting``): ``charge`` reads the
exact sums of every committed entry (a ``Tally``, overall and per analyst) and asks the
accountant of each budget that applies *inside* the IMMEDIATE transaction, so the guarantees
above hold for BASIC, ADVANCED and ZCDP alike. Each entry keeps its cost exactly: epsilon,
delta and rho.

Entries are append-only (triggers refuse DELETE and any UPDATE but filling in the answer),
which is also what lets a ``Ledger`` cache the sums of the entries it has already read and
add only the newer ones inside each charge's transaction.

>>> from fractions import Fraction
>>> with Ledger.open(None) as ledger:
...     budget = Spend(Fraction(1), Fraction(0))
...     tenth = Spend(Fraction(1, 10), Fraction(0))
...     for _ in range(10):
...         _ = ledger.charge(tenth, budget, sql="SELECT 1", options={})
...     ledger.spent() == budget
True
"""

from __future__ import annotations

import json
import os
import secrets
import sqlite3
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, timezone
from fractions import Fraction
from typing import TYPE_CHECKING

from dpsql.budget.accounting import Accountant, Spend, Tally, accountant_for
from dpsql.budget.private_files import create_owner_only, refuse_exposed
from dpsql.errors import Cancelled, DPError, InternalError, PolicyError

if TYPE_CHECKING:
    import pandas

SCHEMA_VERSION = 1
LEDGER_SIDE_FILES = ("-wal", "-shm", "-journal")
"""Files SQLite keeps beside a ledger (its log, shared-memory index, rollback journal)."""
BUSY_TIMEOUT_SECONDS = 30.0
_CHARGING = "charge the ledger"

_SCHEMA = (
    "CREATE TABLE meta (key TEXT PRIMARY KEY, value NOT NULL)",
    # epsilon, delta and rho are exact fraction text "num/den" (rho NULL only in entries
    # written before it was recorded). key is the normalised-query key of free repeats.
    """CREATE TABLE entries (
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        time TEXT NOT NULL,
        analyst TEXT,
        sql TEXT NOT NULL,
        options TEXT NOT NULL,
        epsilon TEXT NOT NULL,
        delta TEXT NOT NULL,
        rho TEXT,
        key TEXT,
        answer TEXT
    )""",
    "CREATE INDEX entries_by_key ON entries (key, id) WHERE key IS NOT NULL",
    "CREATE INDEX entries_by_analyst ON entries (analyst)",
    """CREATE TRIGGER entries_are_permanent BEFORE DELETE ON entries
        BEGIN SELECT RAISE(ABORT, 'ledger entries are permanent'); END""",
    """CREATE TRIGGER entries_are_append_only
        BEFORE UPDATE OF id, time, analyst, sql, options, epsilon, delta, rho, key ON entries
        BEGIN SELECT RAISE(ABORT, 'ledger entries are append-only'); END""",
    f"INSERT INTO meta (key, value) VALUES ('schema_version', {SCHEMA_VERSION})",
)

# Every change of the stored policy, kept like the entries: append-only. Created on the first
# change (IF NOT EXISTS), so ledgers written before it existed keep schema version 1.
_POLICY_CHANGES = (
    """CREATE TABLE IF NOT EXISTS policy_changes (
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        time TEXT NOT NULL,
        old TEXT,
        new TEXT NOT NULL
    )""",
    """CREATE TRIGGER IF NOT EXISTS policy_changes_are_permanent BEFORE DELETE ON policy_changes
        BEGIN SELECT RAISE(ABORT, 'policy changes are permanent'); END""",
    """CREATE TRIGGER IF NOT EXISTS policy_changes_are_append_only BEFORE UPDATE ON policy_changes
        BEGIN SELECT RAISE(ABORT, 'policy changes are append-only'); END""",
)


@dataclass(frozen=True)
class Entry:
    """One charge as the ledger keeps it."""

    id: int
    """Increasing, never reused."""
    time: str
    """When the charge was committed, UTC ISO-8601."""
    analyst: str | None
    """Who asked, when known."""
    sql: str
    """The query's normalised SQL (``dpsql.sql.normalise``)."""
    options: dict
    """The query's options, decoded from canonical JSON (fractions as "num/den" text)."""
    cost: Spend
    """What was charged: exact epsilon, delta and rho."""
    answer: str | None
    """The released (noisy) answer as JSON text, once recorded."""


@dataclass(frozen=True)
class PolicyChange:
    """One change of the policy stored with a ledger (``dpsql init``)."""

    time: str
    """When it was committed, UTC ISO-8601."""
    old: str | None
    """The policy text stored before, or ``None`` for the first one."""
    new: str
    """The policy text stored since."""


class Cancellation:
    """One call's cancel, handed down to the charges it makes (the server makes one per
    statement: ``Connection.acting_for``). A cancel requested before a charge commits stops it:
    ``charge`` checks first and again just before ``COMMIT``, rolling back, so a cancel sent while
    the call waited for the ledger's lock is honoured once it has the lock. A cancel requested
    after that finds ``charged`` set: the charge stays, and the caller withholds the answer.

    >>> cancel = Cancellation()
    >>> cancel.request()
    >>> cancel.check()
    Traceback (most recent call last):
    dpsql.errors.Cancelled: canceling statement due to user request; nothing was charged
    """

    def __init__(self) -> None:
        self._requested = threading.Event()
        self.charged = False
        """Set once a charge made under this cancellation has committed."""

    def request(self) -> None:
        """Cancel (from any thread)."""
        self._requested.set()

    @property
    def requested(self) -> bool:
        return self._requested.is_set()

    def check(self) -> None:
        """Raise ``Cancelled`` if a cancel was requested, saying truly what was charged."""
        if not self._requested.is_set():
            return
        if self.charged:  # a call of several charges, cancelled between them
            raise Cancelled("canceling statement due to user request; what it had charged before stays "
                            "charged, and nothing was released")
        raise Cancelled("canceling statement due to user request; nothing was charged")


class Ledger:
    """A privacy budget ledger in one SQLite file, or privately in memory.

    One connection per ``Ledger``, behind a lock: threads sharing a ledger take turns, and
    ledgers in other threads or processes on the same file take turns on SQLite's write lock.
    """

    def __init__(self, path: str | None, connection: sqlite3.Connection):
        """Use ``Ledger.open``; this only stores what it was given."""
        self.path = path
        """The ledger file, or ``None`` for a private in-memory ledger."""
        self._connection: sqlite3.Connection | None = connection
        self._lock = threading.Lock()
        self._pid = os.getpid()
        self._inherited: list[sqlite3.Connection] = []
        self._salt: bytes | None = None
        self._seen_id = 0  # entries with id <= _seen_id sum to these tallies (append-only)
        self._seen_tally = Tally()
        self._seen_by_analyst: dict[str | None, Tally] = {}

    @classmethod
    def open(cls, path: str | os.PathLike | None) -> Ledger:
        """Open (creating if needed) the ledger at ``path``; ``None`` gives a private one."""
        if path is not None:
            path = os.fspath(path)
            if path in ("", ":memory:"):
                path = None
        return cls(path, _connect(path))

    def charge(
        self,
        cost: Spend,
        total: Accountant | Spend,
        *,
        sql: str,
        options: dict,
        analyst: str | None = None,
        key: str | None = None,
        analyst_total: Accountant | Spend | None = None,
        policies: frozenset | None = None,
        cancel: Cancellation | None = None,
    ) -> int:
        """Record ``cost`` and return the entry id, or raise ``BudgetExceeded`` if it does not
        fit: after every committed entry, in ``total``'s accountant (a bare ``Spend`` means
        BASIC) and, with an ``analyst``, after that analyst's entries in ``analyst_total``.
        ``policies``: the stored policy texts (``None``: none stored) the accountants were
        built from; the charge is refused with a ``PolicyError`` when the policy stored now is
        none of them (``dpsql init --replace`` ran since), so the stored budget always rules.
        ``cancel``: the call's ``Cancellation``; a cancel requested before ``COMMIT`` rolls the
        charge back and raises ``Cancelled``. One IMMEDIATE transaction: atomic across threads
        and processes."""
        budget = _accountant(total)
        analyst_budget = None if analyst_total is None else _accountant(analyst_total)
        if not isinstance(cost, Spend):
            raise InternalError("charge() takes a Spend amount")
        if cost.epsilon < 0 or cost.delta < 0 or (cost.rho is not None and cost.rho < 0):
            raise InternalError(f"a negative charge would be a refund: {cost}")
        options_json = _options_json(options)
        rho = None if cost.rho is None else _fraction_text(cost.rho)
        if cancel is not None:
            cancel.check()
        with self._connected() as connection:
            with _transaction(connection, self.path, _CHARGING):
                if policies is not None:
                    self._check_policy(connection, policies)
                overall, by_analyst = self._read_tallies(connection)
                budget.check(overall, cost, "the total budget")
                if analyst_budget is not None and analyst is not None:
                    mine = by_analyst.get(analyst, Tally())
                    analyst_budget.check(mine, cost, f"analyst {analyst}'s budget")
                cursor = connection.execute(
                    "INSERT INTO entries (time, analyst, sql, options, epsilon, delta, rho, key)"
                    " VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                    (_now(), analyst, sql, options_json,
                     _fraction_text(cost.epsilon), _fraction_text(cost.delta), rho, key),
                )
                entry_id = cursor.lastrowid
                if entry_id is None:
                    raise InternalError("the ledger's INSERT returned no row id")
                if cancel is not None:  # the last moment to stop: cancelled while it waited for the lock
                    cancel.check()
            # Only once committed: a rolled-back id may be reused by the next writer.
            self._seen_id, self._seen_tally = entry_id, overall.add(cost)
            self._seen_by_analyst[analyst] = by_analyst.get(analyst, Tally()).add(cost)
            if cancel is not None:
                cancel.charged = True
            return entry_id

    def record_answer(self, entry_id: int, answer: str) -> None:
        """Keep the released answer of an entry; an entry's answer is set once, never changed.

        One ``UPDATE`` that fills only an empty answer, so it is atomic on its own; committed
        without an fsync (see "Why an answer is committed without an fsync" above)."""
        with self._connected() as connection:
            try:
                connection.execute("PRAGMA synchronous = NORMAL")
                filled = connection.execute(
                    "UPDATE entries SET answer = ? WHERE id = ? AND answer IS NULL",
                    (answer, entry_id)).rowcount
                row = None if filled else connection.execute(
                    "SELECT answer FROM entries WHERE id = ?", (entry_id,)).fetchone()
            except sqlite3.Error as error:
                raise _ledger_error(self.path, "record an answer in the ledger", error) from error
        if filled:
            return
        if row is None:
            raise InternalError(f"no ledger entry {entry_id} to record an answer for")
        if row[0] != answer:
            raise InternalError(f"ledger entry {entry_id} already has an answer")

    def find_answer(self, key: str) -> str | None:
        """The answer of the most recent entry with this key that has one, else ``None``."""
        row = self._read_one(
            "SELECT answer FROM entries WHERE key = ? AND answer IS NOT NULL"
            " ORDER BY id DESC LIMIT 1", (key,))
        return None if row is None else row[0]

    def tally(self, analyst: str | None = None) -> Tally:
        """The exact sums accountants read: of every entry, or of one analyst's."""
        with self._connected() as connection:
            try:
                overall, by_analyst = self._read_tallies(connection)
            except sqlite3.Error as error:
                raise _ledger_error(self.path, "read the ledger", error) from error
        return overall if analyst is None else by_analyst.get(analyst, Tally())

    def spent(self, analyst: str | None = None) -> Spend:
        """Everything charged so far under basic composition, by everyone or by one analyst."""
        tally = self.tally(analyst)
        return Spend(tally.epsilon, tally.delta)

    def entries(self, analyst: str | None = None) -> pandas.DataFrame:
        """Every entry (or one analyst's), oldest first, with costs as floats for reading (not
        for arithmetic); rho is NaN where it was not recorded."""
        import pandas

        columns = ["id", "time", "analyst", "sql", "options", "epsilon", "delta", "rho", "answer"]
        query = f"SELECT {', '.join(columns)} FROM entries"
        query, parameters = (query, ()) if analyst is None else (query + " WHERE analyst = ?",
                                                                  (analyst,))
        rows = [
            (*row[:5], *(float("nan") if v is None else float(Fraction(v)) for v in row[5:8]),
             row[8])
            for row in self._read_all(query + " ORDER BY id", parameters)
        ]
        frame = pandas.DataFrame(rows, columns=columns)
        return frame.astype({"id": "int64", "epsilon": "float64", "delta": "float64",
                             "rho": "float64"})

    def entry(self, entry_id: int) -> Entry | None:
        """One entry, or ``None`` when there is no such id."""
        row = self._read_one(
            "SELECT id, time, analyst, sql, options, epsilon, delta, rho, answer FROM entries"
            " WHERE id = ?", (entry_id,))
        if row is None:
            return None
        cost = Spend(Fraction(row[5]), Fraction(row[6]), None if row[7] is None else Fraction(row[7]))
        return Entry(row[0], row[1], row[2], row[3], json.loads(row[4]), cost, row[8])

    def salt(self) -> bytes:
        """This ledger's 32 secret random bytes, made once and kept in the file forever."""
        with self._connected() as connection:
            if self._salt is None:
                with _transaction(connection, self.path, "make the ledger's salt"):
                    row = connection.execute(
                        "SELECT value FROM meta WHERE key = 'salt'").fetchone()
                    if row is None:
                        row = (secrets.token_bytes(32),)
                        connection.execute(
                            "INSERT INTO meta (key, value) VALUES ('salt', ?)", row)
                if not isinstance(row[0], bytes) or len(row[0]) != 32:
                    raise InternalError("the ledger's salt is not 32 bytes")
                self._salt = row[0]
            return self._salt

    def store_policy(self, text: str, *, replacing: str | None) -> PolicyChange | None:
        """Keep the policy text with the ledger (``dpsql init``) in place of ``replacing``,
        the text the caller read as stored (``None``: none), and record the change.

        Compare and swap, in one IMMEDIATE transaction: if the stored text is no longer
        ``replacing`` (someone else changed it meanwhile) nothing is written and a
        ``PolicyError`` says so. Storing the text already stored changes nothing (``None``).
        Entries, the salt and earlier changes are untouched: what was spent stays spent."""
        with self._connected() as connection:
            with _transaction(connection, self.path, "store the policy"):
                stored = _stored_policy(connection)
                if stored == text:
                    return None
                if stored != replacing:
                    raise PolicyError(
                        f"the policy stored with the ledger at {self.path or ':memory:'} changed "
                        "while this one was being stored; nothing was changed",
                        hint="look at the stored policy (`dpsql shell DB`, then .policy) and run "
                             "`dpsql init` again")
                for statement in _POLICY_CHANGES:
                    connection.execute(statement)
                change = PolicyChange(_now(), stored, text)
                connection.execute(
                    "INSERT OR REPLACE INTO meta (key, value) VALUES ('policy', ?)", (text,))
                connection.execute("INSERT INTO policy_changes (time, old, new) VALUES (?, ?, ?)",
                                   (change.time, change.old, change.new))
            return change

    def policy_changes(self) -> list[PolicyChange]:
        """Every change of the stored policy, oldest first (none before the first ``init``)."""
        if self._read_one("SELECT 1 FROM sqlite_master WHERE name = 'policy_changes'") is None:
            return []
        rows = self._read_all("SELECT time, old, new FROM policy_changes ORDER BY id")
        return [PolicyChange(*row) for row in rows]

    def stored_policy(self) -> str | None:
        """The policy text kept by ``store_policy``, if any."""
        row = self._read_one("SELECT value FROM meta WHERE key = 'policy'")
        return None if row is None else row[0]

    def dataset(self) -> str | None:
        """What this ledger accounts for (``dpsql.budget.registry.Dataset.to_json``), once recorded."""
        row = self._read_one("SELECT value FROM meta WHERE key = 'dataset'")
        return None if row is None else row[0]

    def record_dataset(self, text: str) -> None:
        """Keep what this ledger accounts for with it (a meta row: older ledgers get it on open)."""
        with self._connected() as connection:
            with _transaction(connection, self.path, "record what the ledger accounts for"):
                connection.execute("INSERT OR REPLACE INTO meta (key, value) VALUES ('dataset', ?)", (text,))

    def close(self) -> None:
        """Close the file; a closed ledger refuses further use."""
        with self._locked():
            if self._connection is not None and self._pid == os.getpid():
                self._connection.close()  # never the parent's, from a forked child
            self._connection = None

    def __enter__(self) -> Ledger:
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"Ledger({self.path!r})" if self.path else "Ledger(None)"

    # -- internals ---------------------------------------------------------------------

    def _locked(self) -> threading.Lock:
        """The lock; a fresh one in a forked child, where the parent's holders are gone."""
        if self._pid != os.getpid():
            self._lock = threading.Lock()
        return self._lock

    @contextmanager
    def _connected(self) -> Iterator[sqlite3.Connection]:
        """Hold the lock and yield the connection (reopened in a forked child, since SQLite
        connections must not cross fork)."""
        with self._locked():
            yield self._connect()

    def _connect(self) -> sqlite3.Connection:
        if self._connection is None:
            raise InternalError("the ledger is closed")
        if self._pid != os.getpid():
            if self.path is None:
                raise DPError("an in-memory ledger cannot be shared with a forked process",
                              hint="open the ledger from a file to share it between processes")
            # Keep the parent's connection referenced so garbage collection never closes it
            # here, where closing could disturb the parent's WAL.
            self._inherited.append(self._connection)
            self._connection = _connect(self.path)
            self._pid = os.getpid()
        return self._connection

    def _check_policy(self, connection: sqlite3.Connection, policies: frozenset) -> None:
        """Refuse a charge made under a policy that is no longer the stored one."""
        if _stored_policy(connection) not in policies:
            raise PolicyError(
                f"the policy stored with the ledger at {self.path or ':memory:'} was replaced "
                "after this connection opened; nothing was charged",
                hint="connect again to work under the stored policy")

    def _read_tallies(self, connection: sqlite3.Connection) -> tuple[Tally, dict]:
        """The tallies of every entry and of each analyst's: the cached sums plus the entries
        committed since they were taken, grouped by equal costs so long ledgers stay fast."""
        newer = connection.execute(
            "SELECT analyst, epsilon, delta, rho, count(*), max(id) FROM entries WHERE id > ?"
            " GROUP BY analyst, epsilon, delta, rho", (self._seen_id,)).fetchall()
        for analyst, epsilon, delta, rho, count, _ in newer:
            cost = Spend(Fraction(epsilon), Fraction(delta), None if rho is None else Fraction(rho))
            self._seen_tally = self._seen_tally.add(cost, count)
            self._seen_by_analyst[analyst] = self._seen_by_analyst.get(analyst, Tally()).add(
                cost, count)
        if newer:
            self._seen_id = max(row[5] for row in newer)
        return self._seen_tally, self._seen_by_analyst

    def _read_all(self, query: str, parameters: tuple = ()) -> list[tuple]:
        with self._connected() as connection:
            try:
                return connection.execute(query, parameters).fetchall()
            except sqlite3.Error as error:
                raise _ledger_error(self.path, "read the ledger", error) from error

    def _read_one(self, query: str, parameters: tuple = ()) -> tuple | None:
        rows = self._read_all(query, parameters)
        return rows[0] if rows else None


class _transaction:
    """``BEGIN IMMEDIATE`` ... ``COMMIT`` at ``synchronous=FULL`` (``COMMIT`` returns once the
    log is fsync'ed), rolled back if anything raises inside."""

    def __init__(self, connection: sqlite3.Connection, path: str | None, action: str):
        self.connection, self.path, self.action = connection, path, action

    def __enter__(self) -> None:
        try:
            self.connection.execute("PRAGMA synchronous = FULL")
            self.connection.execute("BEGIN IMMEDIATE")
        except sqlite3.Error as error:
            raise _ledger_error(self.path, self.action, error) from error

    def __exit__(self, exc_type, exc, traceback) -> None:
        try:
            if exc_type is None:
                self.connection.execute("COMMIT")
                return
        except sqlite3.Error as error:
            self._rollback()
            raise _ledger_error(self.path, self.action, error) from error
        self._rollback()
        if isinstance(exc, sqlite3.Error):
            raise _ledger_error(self.path, self.action, exc) from exc

    def _rollback(self) -> None:
        if self.connection.in_transaction:
            self.connection.execute("ROLLBACK")


def _connect(path: str | None) -> sqlite3.Connection:
    """Open the file in WAL mode with fsync on every commit, creating the schema if new."""
    if path is not None:
        _claim(path)
    try:
        connection = sqlite3.connect(
            ":memory:" if path is None else path,
            timeout=BUSY_TIMEOUT_SECONDS,
            isolation_level=None,  # transactions are ours: BEGIN IMMEDIATE ... COMMIT
            check_same_thread=False,  # guarded by Ledger._lock
        )
    except sqlite3.Error as error:
        raise _open_error(path, error) from error
    try:
        _use_wal(connection)
        connection.execute("PRAGMA synchronous = FULL")
        _create_schema(connection, path)
    except BaseException as error:
        connection.close()
        if isinstance(error, sqlite3.Error):
            raise _open_error(path, error) from error
        raise
    return connection


def _claim(path: str) -> None:
    """Make sure the ledger and SQLite's files beside it are the curator's alone before SQLite
    reads a byte (``dpsql.budget.private_files``): a new ledger is created 0600 here, and SQLite
    gives the side files it makes later the same mode; an existing one is refused when anyone
    else could read or change it."""
    try:
        if not create_owner_only(path) and not refuse_exposed(path, "the ledger"):
            raise DPError(f"the ledger at {path} is a link to nothing", hint="remove the link, or pass "
                          "ledger=... the path of the ledger itself")
    except OSError as error:  # no such directory, no permission: SQLite would fail the same way
        raise DPError(f"cannot open the ledger at {path}: {error.strerror or error}",
                      hint="pass ledger=... a writable path") from None
    for side in LEDGER_SIDE_FILES:
        refuse_exposed(f"{path}{side}", "the ledger's SQLite file")


def _use_wal(connection: sqlite3.Connection) -> None:
    """Switch the file to WAL mode, waiting for other openers as long as any lock wait.

    SQLite answers ``PRAGMA journal_mode = WAL`` with "database is locked" at once, without
    calling the busy handler, when another connection is opening the same new file at that
    moment (it needs the exclusive lock to rewrite the header). Many connects to one fresh
    ledger at once (threads or processes) hit that, so retry until ``BUSY_TIMEOUT_SECONDS``.
    """
    deadline, pause = time.monotonic() + BUSY_TIMEOUT_SECONDS, 0.001
    while True:
        try:
            connection.execute("PRAGMA journal_mode = WAL")
            return
        except sqlite3.OperationalError as error:
            if not _is_busy(error) or time.monotonic() >= deadline:
                raise
        time.sleep(pause)
        pause = min(pause * 2, 0.05)


def _is_busy(error: sqlite3.Error) -> bool:
    return "locked" in str(error) or "busy" in str(error)


def _create_schema(connection: sqlite3.Connection, path: str | None) -> None:
    if _schema_version(connection) is None:
        with _transaction(connection, path, "create the ledger"):
            if _schema_version(connection) is None:  # nobody created it while we waited
                if connection.execute("SELECT count(*) FROM sqlite_master").fetchone()[0]:
                    raise DPError(f"{path} is an SQLite file but not a dpsql ledger",
                                  hint="pass ledger=... a new or existing ledger file")
                for statement in _SCHEMA:
                    connection.execute(statement)
    version = _schema_version(connection)
    if version != SCHEMA_VERSION:
        raise DPError(f"the ledger at {path} has schema version {version}, but this dpsql "
                      f"reads version {SCHEMA_VERSION}", hint="upgrade dpsql")


def _schema_version(connection: sqlite3.Connection) -> int | None:
    if connection.execute(
            "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'meta'").fetchone():
        row = connection.execute(
            "SELECT value FROM meta WHERE key = 'schema_version'").fetchone()
        return None if row is None else int(row[0])
    return None


def _stored_policy(connection: sqlite3.Connection) -> str | None:
    row = connection.execute("SELECT value FROM meta WHERE key = 'policy'").fetchone()
    return None if row is None else row[0]


def _open_error(path: str | None, error: sqlite3.Error) -> DPError:
    return DPError(f"cannot open the ledger at {path or ':memory:'}: {error}",
                   hint="pass ledger=... a writable path")


def _ledger_error(path: str | None, action: str, error: sqlite3.Error) -> DPError:
    hint = "check that the ledger file is writable and on a local disk"
    if _is_busy(error):
        hint = (f"another connection holds the ledger's write lock (dpsql waits up to "
                f"{BUSY_TIMEOUT_SECONDS:g} s for it); try again")
    outcome = "; nothing was charged" if action == _CHARGING else ""
    return DPError(f"could not {action} at {path or ':memory:'}: {error}{outcome}", hint=hint)


def _fraction_text(value: Fraction) -> str:
    return f"{value.numerator}/{value.denominator}"


def _accountant(total: Accountant | Spend) -> Accountant:
    """A bare ``Spend`` total means basic composition."""
    if isinstance(total, Accountant):
        return total
    if isinstance(total, Spend):
        return accountant_for("basic", total)
    raise InternalError("charge() takes an Accountant or a Spend total")


def _options_json(options: dict) -> str:
    """Canonical JSON of the options: sorted keys, fractions as ``"num/den"`` text."""

    def encode(value):
        if isinstance(value, Fraction):
            return _fraction_text(value)
        raise TypeError(f"{type(value).__name__} is not JSON serialisable")

    try:
        return json.dumps(options, sort_keys=True, separators=(",", ":"),
                          allow_nan=False, default=encode)
    except (TypeError, ValueError) as error:
        raise InternalError(f"query options cannot be stored in the ledger: {error}") from error


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="microseconds")
