"""One dataset, one budget (DESIGN.md invariant 21): the curator's registry of ledgers.

A ledger accounts for the people in the tables its policy protects. Serving the same tables
under a second ledger (another path, a Spark config beside a DuckDB file, a Python Spark
session) would start a second, fresh budget over the same people, so the privacy loss of both
adds up unseen. The registry, a small SQLite file in the curator's dpsql home (``$DPSQL_HOME``,
else ``~/.dpsql``; the folder 0700, the file 0600), records which file ledger accounts for
which private tables. Opening a file ledger that would newly claim a table another existing
ledger already claims is refused (``SecondBudget``), before any private data is read or
anything is charged, unless the curator asks for a second budget on purpose
(``separate_budget=True``, ``dpsql init --separate-budget``).

What identifies a dataset is what the policy protects, not the bytes stored: the private
tables' names (case-folded, as DuckDB resolves them) with their privacy units. So an appended
or neighbouring copy of the data, or the same data as Parquet under Spark, is the same dataset
(the same people are in it). Two ledgers clash when they protect a table of the same name,
whatever unit each declares: a row-level budget and a user-level one over the same rows are
two budgets over the same people too. A ledger's claim only grows (``dpsql init --replace``
dropping a table does not undo what was spent on it), and a ledger in memory claims nothing.
Entries whose ledger file is gone are dropped.

The registry is the curator's own bookkeeping, not a wall against the curator: it warns
whoever opens a second ledger in that home (another OS user has another home).
"""

from __future__ import annotations

import hashlib
import json
import os
import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

from dpsql.budget.private_files import DIRECTORY_MODE, create_owner_only, refuse_exposed
from dpsql.errors import DPError, SecondBudget
from dpsql.policy.model import Policy
from dpsql.sql.names import table_key

REGISTRY_FILE = "ledgers.sqlite"
"""The registry's file name in the curator's dpsql home."""
BUSY_TIMEOUT_SECONDS = 30.0
_SCHEMA = """CREATE TABLE IF NOT EXISTS ledgers (
    ledger TEXT PRIMARY KEY,
    tables TEXT NOT NULL,
    sources TEXT NOT NULL,
    since TEXT NOT NULL,
    separate INTEGER NOT NULL
)"""


@dataclass(frozen=True)
class Dataset:
    """What a ledger accounts for: the private tables a policy protects, each with its unit."""

    tables: frozenset[tuple[str, str]]
    """(table name, privacy unit column or ``ROW``), both case-folded."""

    @property
    def description(self) -> str:
        """The tables as a curator reads them: ``users(user_id), visits(user_id)``."""
        return ", ".join(f"{table}({unit})" for table, unit in sorted(self.tables)) or "no private table"

    @property
    def digest(self) -> str:
        """A stable short digest of the description: the same tables, the same digest."""
        return hashlib.sha256(self.description.encode("utf-8")).hexdigest()[:16]

    @property
    def names(self) -> frozenset[str]:
        """The protected tables' names: two ledgers clash on a shared name, whatever its unit."""
        return frozenset(table for table, _ in self.tables)

    def union(self, other: Dataset) -> Dataset:
        return Dataset(self.tables | other.tables)

    def shared_with(self, other: Dataset) -> Dataset:
        """The part of this dataset whose tables ``other`` protects too."""
        return Dataset(frozenset(pair for pair in self.tables if pair[0] in other.names))

    def to_json(self) -> str:
        return json.dumps(sorted(self.tables))

    @staticmethod
    def from_json(text: str) -> Dataset:
        return Dataset(frozenset((str(table), str(unit)) for table, unit in json.loads(text)))


def dataset_identity(policy: Policy) -> Dataset:
    """The dataset ``policy`` protects: its private tables and units, names case-folded.

    >>> from dpsql.policy.language import parse_policy
    >>> from dpsql.policy.model import PrivateTable, PublicTable
    >>> policy = Policy(1, private_tables=(PrivateTable("Visits", "User_ID"), PrivateTable("logs")),
    ...                 public_tables=(PublicTable("stores"),))
    >>> dataset = dataset_identity(policy)
    >>> dataset.description
    'logs(ROW), visits(user_id)'
    >>> other = Policy(9, private_tables=(PrivateTable("LOGS"), PrivateTable("main.visits", "user_id", 10)))
    >>> dataset_identity(other).digest == dataset.digest
    True
    """
    return Dataset(frozenset((table_key(table.name), "ROW" if table.unit is None else table.unit.lower())
                             for table in policy.private_tables))


@dataclass(frozen=True)
class Registered:
    """One ledger the registry knows."""

    ledger: Path
    """The ledger file (resolved)."""
    dataset: Dataset
    """Every table it has accounted for (a claim only grows)."""
    sources: tuple[str, ...]
    """Where it was opened from: database files, Spark configs, 'a Python Spark session'."""
    since: str
    """When it was first registered, UTC ISO date."""
    separate: bool
    """Registered with ``separate_budget``: a second budget the curator asked for."""

    @property
    def opened_from(self) -> str:
        return " and ".join(self.sources[:3]) + (" and others" if len(self.sources) > 3 else "")


@dataclass(frozen=True)
class Claim:
    """What opening a ledger found in the registry."""

    others: tuple[Registered, ...]
    """Other existing ledgers that account for some of the same tables (only ever with
    ``separate_budget``, or registered before this ledger claimed its tables)."""
    new: bool
    """This ledger was not registered before."""
    separate: bool
    """This open needed ``separate_budget``: it claimed tables another ledger accounts for."""


def curator_home() -> Path:
    """The curator's dpsql folder: ``$DPSQL_HOME`` when set (and not empty), else ``~/.dpsql``."""
    value = os.environ.get("DPSQL_HOME", "")
    return Path(value).expanduser() if value.strip() else Path.home() / ".dpsql"


def check_second_budget(ledger: Path, dataset: Dataset, *, separate: bool, home: Path | None = None) -> None:
    """Refuse (``SecondBudget``) to open ``ledger`` for ``dataset`` when another existing ledger
    accounts for one of its tables and ``ledger`` did not claim it before; writes nothing (beyond
    dropping entries of ledger files that are gone). For a ledger file not made yet: refused
    before it is made."""
    if separate:
        return
    with _registry(home) as (connection, where):
        _refuse(_clashes(connection, ledger.resolve(), dataset), ledger, dataset, where)


def claim(ledger: Path, dataset: Dataset, source: str, *, separate: bool, home: Path | None = None) -> Claim:
    """Check (as ``check_second_budget``) and record that ``ledger`` accounts for ``dataset``,
    opened from ``source``, in one transaction: of two processes opening two ledgers over the
    same tables at once, the second is refused."""
    ledger = ledger.resolve()
    with _registry(home) as (connection, where):
        clashes = _clashes(connection, ledger, dataset)
        if not separate:
            _refuse(clashes, ledger, dataset, where)
        before = _read(connection, ledger)
        others = tuple(other for other in _existing(connection) if other.ledger != ledger
                       and other.dataset.names & dataset.names)
        if before is None:
            mine = Registered(ledger, dataset, (source,), _today(), bool(clashes))
        else:
            sources = before.sources if source in before.sources else (*before.sources, source)
            mine = Registered(ledger, before.dataset.union(dataset), sources, before.since,
                              before.separate or bool(clashes))
        if mine != before:  # most opens change nothing: no write, no fsync
            connection.execute("INSERT OR REPLACE INTO ledgers (ledger, tables, sources, since, separate)"
                               " VALUES (?, ?, ?, ?, ?)",
                               (str(ledger), mine.dataset.to_json(), json.dumps(list(mine.sources)), mine.since,
                                int(mine.separate)))
        return Claim(others, new=before is None, separate=bool(clashes))


def release(ledger: Path, *, home: Path | None = None) -> None:
    """Forget ``ledger`` (a connection that registered it and then failed to open)."""
    with _registry(home) as (connection, _):
        connection.execute("DELETE FROM ledgers WHERE ledger = ?", (str(ledger.resolve()),))


def registered(home: Path | None = None) -> list[Registered]:
    """Every ledger the registry knows whose file exists, oldest first."""
    with _registry(home) as (connection, _):
        return _existing(connection)


def second_budget_note(claim: Claim, dataset: Dataset, ledger: Path) -> str | None:
    """What to tell the curator who opened ``ledger`` as a second budget on purpose, if they did."""
    if not claim.separate or not claim.others:
        return None
    other = claim.others[0]
    return (f"{ledger} is a second budget: {other.ledger} also accounts for "
            f"{dataset.shared_with(other.dataset).description} (separate_budget); the privacy loss "
            "of both adds up over the same people")


# -- internals ---------------------------------------------------------------------------------

def _clashes(connection: sqlite3.Connection, ledger: Path, dataset: Dataset) -> list[Registered]:
    """Other existing ledgers protecting a table ``ledger`` has not claimed before."""
    mine = _read(connection, ledger)
    claimed = frozenset() if mine is None else mine.dataset.names
    new = dataset.names - claimed
    return [other for other in _existing(connection) if other.ledger != ledger and other.dataset.names & new]


def _refuse(clashes: list[Registered], ledger: Path, dataset: Dataset, where: Path) -> None:
    if not clashes:
        return
    other = min(clashes, key=lambda registered: (registered.separate, registered.since))  # the first budget
    shared = dataset.shared_with(other.dataset).description
    raise SecondBudget(
        f"the tables this policy protects ({shared}) already have a budget in {other.ledger} (opened from "
        f"{other.opened_from} on {other.since}); a ledger at {ledger} would be a second budget over the "
        f"same people (recorded in {where})",
        hint=f"open it with ledger='{other.ledger}' (in a Spark config: ledger = \"{other.ledger}\" under "
             "[spark]), or pass separate_budget=True to keep a second budget on purpose",
        hints={surface: f"serve this data with the ledger {other.ledger} (a Spark config names it with ledger = "
                        f"\"{other.ledger}\" under [spark]; Python with ledger='{other.ledger}'), or run "
                        "`dpsql init DB --policy P --separate-budget` to keep a second budget on purpose"
               for surface in ("cli", "shell")})


def _existing(connection: sqlite3.Connection) -> list[Registered]:
    """The registered ledgers whose file exists; the others are dropped."""
    known = [_registered(row) for row in connection.execute(
        "SELECT ledger, tables, sources, since, separate FROM ledgers ORDER BY since, ledger").fetchall()]
    gone = [registered for registered in known if not registered.ledger.exists()]
    for registered in gone:
        connection.execute("DELETE FROM ledgers WHERE ledger = ?", (str(registered.ledger),))
    return [registered for registered in known if registered not in gone]


def _read(connection: sqlite3.Connection, ledger: Path) -> Registered | None:
    row = connection.execute("SELECT ledger, tables, sources, since, separate FROM ledgers WHERE ledger = ?",
                             (str(ledger),)).fetchone()
    return None if row is None else _registered(row)


def _registered(row: tuple) -> Registered:
    return Registered(Path(row[0]), Dataset.from_json(row[1]), tuple(json.loads(row[2])), row[3], bool(row[4]))


def _today() -> str:
    return datetime.now(timezone.utc).date().isoformat()


@contextmanager
def _registry(home: Path | None) -> Iterator[tuple[sqlite3.Connection, Path]]:
    """The registry file, owner-only, inside one ``BEGIN IMMEDIATE`` transaction."""
    folder = curator_home() if home is None else home
    where = folder / REGISTRY_FILE
    try:
        folder.mkdir(mode=DIRECTORY_MODE, parents=True, exist_ok=True)
        if not create_owner_only(where):  # another user able to change it could hide a first budget
            refuse_exposed(where, "the registry of ledgers")
        connection = sqlite3.connect(where, timeout=BUSY_TIMEOUT_SECONDS, isolation_level=None)
    except (OSError, sqlite3.Error) as error:
        raise DPError(f"cannot open the curator's registry of ledgers at {where}: {error}",
                      hint="set DPSQL_HOME to a folder of yours that dpsql may write") from None
    try:
        connection.execute("BEGIN IMMEDIATE")
        connection.execute(_SCHEMA)
        try:
            yield connection, where
        except SecondBudget:
            connection.execute("COMMIT")  # keep the dropping of entries whose ledger is gone
            raise
        connection.execute("COMMIT")
    except sqlite3.Error as error:
        raise DPError(f"cannot use the curator's registry of ledgers at {where}: {error}",
                      hint="set DPSQL_HOME to a folder of yours that dpsql may write") from None
    finally:
        if connection.in_transaction:
            connection.execute("ROLLBACK")
        connection.close()
