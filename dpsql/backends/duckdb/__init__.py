"""The only module that talks to DuckDB.

It opens what the curator hands to ``dpsql.connect`` — a database file (read-only: the
user's file is never modified), an open DuckDB connection, or pandas DataFrames (copied into a
private in-memory database) — and runs SQL that dpsql generated. Analyst text never reaches it.

Threads run statements side by side, each on a cursor of its own: a DuckDB cursor is a
connection of its own to the same database instance (it sees the bounded copies), runs without
Python's GIL, and its deadline interrupts it alone. A lock covers what the connection itself
does (making a cursor, filling the bounded copies: a statement reading a copy waits for its
fill, never reads one half filled). Released values are post-processed elsewhere, in a private
database of their own (``dpsql.backends.duckdb.released``).

Many engines on one database, in one process. DuckDB keeps one database *instance* per file
per process: every ``duckdb.connect`` of the same file (with the same configuration) is a new
connection to that instance, and ``ATTACH ':memory:' AS dp_bounding`` attaches to the
instance, not to the connection. So every engine on one file reads and writes the same bounded
copies, and two of them creating or refilling a copy at once fail with DuckDB's "Catalog
write-write conflict". Engines on one instance therefore share one ``_Instance``: a lock held
around every change to ``dp_bounding`` (attach, create, fill, store) and the record of what is
already built there, so each copy is built once for all of them.

Hardening (DESIGN.md invariant 7; a second wall behind the check stage, invariant 10). A
database dpsql opens itself runs with ``HARDENED_CONFIG``: no external access (no files, no
network, no COPY, no extension INSTALL or LOAD), no replacement scans of Python variables,
no extension autoloading, no persistent secrets, a memory limit, and the configuration locked
so that no later statement can undo any of it. A connection the caller passes in is the
caller's: its settings are global to its database and may matter to the caller, so dpsql
changes none of them; ``Engine.hardening`` reports what is in force and
``docs/THREAT_MODEL.md`` says what the curator must set. Every statement, on any connection,
runs under a time limit: a timer interrupts it, and ``fetch`` raises ``QueryFailed`` — after
the charge, ``dpsql.connection`` turns that into its generic, charged failure, the same
whatever the data.
"""

from __future__ import annotations

import atexit
import contextlib
import hashlib
import os
import secrets
import shutil
import threading
import warnings
import weakref
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

import duckdb
import pandas as pd
from sqlglot import exp

from dpsql.analysis.plan import GroupKey
from dpsql.backends import facts
from dpsql.backends.bounding import (
    DATABASE,
    BoundedTable,
    attach_sql,
    batch_count,
    create_raw_rows_sql,
    create_sql,
    fill_batches,
    fill_sql,
    raw_rows_batches,
    raw_rows_name,
    raw_rows_sql,
)
from dpsql.backends.deadline import DEFAULT_QUERY_TIMEOUT, Deadline, check_timeout
from dpsql.backends.duckdb import persisted
from dpsql.backends.duckdb.hardening import HARDENED_CONFIG as HARDENED_CONFIG
from dpsql.backends.duckdb.hardening import default_memory_limit as default_memory_limit
from dpsql.backends.duckdb.hardening import hardened_config as hardened_config
from dpsql.backends.duckdb.hardening import spill_directory
from dpsql.backends.duckdb.released import MEMORY_LIMIT as RELEASED_MEMORY_LIMIT
from dpsql.backends.duckdb.released import ReleasedDatabase
from dpsql.backends.duckdb.released import convert_released as convert_released
from dpsql.backends.keys import decoded_text, read_keys
from dpsql.backends.render import render
from dpsql.errors import DPError, InvalidParameter, UnsupportedQuery
from dpsql.sql.names import Catalog, key_of_parts, quoted
from dpsql.sql.parse import DIALECT
from dpsql.sql.pieces import binding_parameters


class Engine:
    """A DuckDB connection dpsql runs its generated SQL on."""

    dialect = DIALECT
    """The SQL it reads: dpsql's statements are rendered for DuckDB."""

    def __init__(self, connection: duckdb.DuckDBPyConnection, *, owned: bool, path: Path | None,
                 query_timeout: float | None = DEFAULT_QUERY_TIMEOUT):
        self._connection = connection
        self._owned = owned
        self._lock = threading.Lock()
        self._closed = False
        self._timeout = check_timeout(query_timeout)
        self.post_processing = released_database(self._timeout)
        """Where released values are post-processed: a private, empty DuckDB (``released``)."""
        self._bounded: dict[str, BoundedTable] = {}
        self._instance: _Instance | None = None
        """What this engine shares with every engine on its DuckDB instance (``prepare_bounding``)."""
        self._salt: str | None = None
        self._described: dict[str, list[tuple[str, str]]] = {}
        """Types of SQL already bound (the schema is fixed while the connection is open)."""
        self._facts: dict[tuple, Any] = {}
        """(generation, SQL) -> what it read of a stored public relation (``_public_fact``)."""
        self.path = path
        """The database file, when one was opened; the default ledger sits beside it."""
        self.copies: Path | None = None
        """The directory holding the persisted bounded copies (``dpsql.backends.duckdb.persisted``), when
        they are kept on disk; ``None``: in memory."""
        self._stored = DATABASE
        """The database the stored copies are read from: the bounding database itself, or ``STORED``
        (attached read-only) when other processes share them (``read_only_copies``)."""
        self.progress: Callable[[str], contextlib.AbstractContextManager] = _no_progress
        """Called with a label around each copy build: a context manager that may show the
        build's progress to the curator (``dpsql.curator.progress``)."""
        self.file_identity: tuple[int, int] | None = None
        """The device and inode of the database file DuckDB opened (``persisted.file_digest``)."""
        self._file_digest: str | None = None
        """The file digest, once read (the file cannot change while DuckDB holds it read-only)."""
        self.spill: str | None = None
        """The temporary directory dpsql made for DuckDB's spills, removed on close."""

    @classmethod
    def open(cls, target: Any, *, query_timeout: float | None = DEFAULT_QUERY_TIMEOUT,
             memory_limit: str | None = None, copies: Path | None = None,
             read_only_copies: bool = False) -> "Engine":
        """Open a path, adopt a connection, or load a dict of DataFrames.

        ``query_timeout``: seconds each statement may run (``None``: no limit). ``memory_limit``:
        a DuckDB size such as ``"4GB"`` for databases dpsql opens (default: half the memory).
        ``copies``: a directory to keep the bounded copies in (``dpsql.backends.duckdb.persisted``), for a
        database file only. ``read_only_copies``: read the stored copies without writing them, so
        that many processes share them (``dpsql serve``'s worker processes): a stored copy that
        is exactly the one this engine would build is read in place, any other is built in memory.
        """
        timeout = check_timeout(query_timeout)
        if copies is not None and not (isinstance(target, (str, os.PathLike)) and str(target) != ":memory:"):
            raise InvalidParameter("persisted copies need a database file: other targets are rebuilt by every process",
                                   hint="pass the path of a DuckDB file, or leave persist_copies off")
        if isinstance(target, duckdb.DuckDBPyConnection):
            return cls(target, owned=False, path=None, query_timeout=timeout)
        config = hardened_config(memory_limit)
        if isinstance(target, dict):
            return cls._spilling(config, None, lambda: cls(_load_frames(target, config), owned=True, path=None,
                                                             query_timeout=timeout))
        if isinstance(target, (str, os.PathLike)):
            path = Path(target)
            if str(target) == ":memory:":
                return cls._spilling(config, None, lambda: cls(open_hardened(":memory:", config), owned=True,
                                                                 path=None, query_timeout=timeout))
            if not path.exists():
                raise DPError(f"no database file at {path}", hint="pass the path of an existing DuckDB file")
            return cls._spilling(config, path, lambda: cls._open_file(path, config, timeout, copies, read_only_copies))
        raise DPError(
            f"cannot connect to a {type(target).__name__}",
            hint="pass a DuckDB file path, a duckdb connection, or a dict of table name to pandas DataFrame",
        )

    @classmethod
    def _spilling(cls, config: dict[str, Any], path: Path | None, opened: Callable[[], "Engine"]) -> "Engine":
        """``opened()`` with DuckDB spilling to a directory of the curator's alone (``spill_directory``;
        DuckDB's default, ``<file>.tmp`` or ``.tmp``, is made under the umask): a copy's build and
        large aggregates write private rows there once past the memory limit. ``path``: the database
        file, whose DuckDB instance every connection in the process shares (so one directory for it)."""
        if path is None:  # a new in-memory instance: its own directory, removed on close
            directory, made = spill_directory()
        else:  # one instance per file per process, whose configuration every connection must repeat
            with _INSTANCES_LOCK:
                key = str(path.resolve())
                if key not in _SPILLS:
                    _SPILLS[key] = spill_directory()
                    if _SPILLS[key][1]:
                        atexit.register(shutil.rmtree, _SPILLS[key][0], True)
                directory, made = _SPILLS[key][0], False
        config["temp_directory"] = directory
        try:
            engine = opened()
        except BaseException:
            if made:
                shutil.rmtree(directory, ignore_errors=True)
            raise
        engine.spill = directory if made else None
        return engine

    @classmethod
    def _open_file(cls, path: Path, config: dict[str, Any], timeout: float | None, copies: Path | None,
                   read_only_copies: bool) -> "Engine":
        try:
            file = None if copies is None else persisted.prepare_directory(copies)
            before = persisted.file_identity(path)
            connection = open_hardened(str(path), config, read_only=True, copies=file,
                                       read_only_copies=read_only_copies)
        except duckdb.Error as err:
            if "different configuration" in str(err):  # DuckDB: one instance per file per process
                raise DPError(
                    f"{path} is already open in this process with other settings (read-write, or "
                    "another memory_limit or configuration)",
                    hint="close that connection first, or pass it: dpsql.connect(that_connection, "
                         "policy=...) wraps an open DuckDB connection") from None
            raise DPError(f"cannot open {path} as a DuckDB database: {err}") from None
        engine = cls(connection, owned=True, path=path.resolve(), query_timeout=timeout)
        if copies is not None and _attached_file(connection, STORED if read_only_copies else DATABASE):
            engine.copies = copies
            engine._stored = STORED if read_only_copies else DATABASE
        if persisted.file_identity(path) == before:  # else a file was moved in meanwhile: which did DuckDB open?
            engine.file_identity = before
        return engine

    @property
    def hardening(self) -> dict[str, Any]:
        """The DuckDB settings that wall the database in, as they are now in force."""
        names = [*HARDENED_CONFIG, "memory_limit", "lock_configuration", "TimeZone", "Calendar"]
        listed = ", ".join(f"'{name}'" for name in names)
        rows = self.fetch(f"SELECT name, value FROM duckdb_settings() WHERE name IN ({listed})")
        found = dict(rows)
        return {name: found.get(name) for name in names} | {"query_timeout": self._timeout}

    @property
    def timeout(self) -> float | None:
        """Seconds one statement may run (``None``: no limit)."""
        return self._timeout

    def check(self, tree: exp.Expr, private: bool) -> None:
        """DuckDB runs every checked query as dpsql means it: nothing more is refused here."""

    def key_text(self, raw: Any, type_name: str) -> str | None:
        """A text-form key as fetched (DuckDB's text, UTF-8 bytes) as that text."""
        return decoded_text(raw)

    def key_value(self, value: Any, type_name: str) -> Any:
        """A value-form key as fetched: as DuckDB's client gives it already."""
        return value

    def read_keys(self, rows: list[tuple], keys: Sequence[GroupKey]) -> list[tuple]:
        """Fetched rows with their keys as DuckDB reads them back (``dpsql.backends.keys.read_keys``)."""
        return read_keys(rows, keys)

    def catalog(self) -> Catalog:
        """Lower-cased table name -> {lower-cased column: DuckDB type} (schema only, no data)."""
        with self._lock:
            cursor = self._connection.cursor()
            try:
                return read_catalog(cursor)
            finally:
                cursor.close()

    def prepare_bounding(self, tables: list[BoundedTable], salt: str) -> None:
        """Create the (empty) bounded copies of the private tables: reads no rows.

        Generated SQL reads private tables only through these copies (``dpsql.backends.bounding``);
        each is filled the first time SQL that reads it is fetched.
        """
        with self._lock:
            self._salt = salt
            self._instance = _instance_of(self._connection)
            with self._instance.lock:
                if self.copies is not None and self._stored == DATABASE:
                    self._drop_stale_copies(tables)
                for table in tables:
                    self._connection.execute(create_sql(table))
                    if not table.row_level:
                        self._connection.execute(create_raw_rows_sql(table))
                    self._bounded[table.name] = table

    def _drop_stale_copies(self, tables: list[BoundedTable]) -> None:
        """Drop each stored copy built by another recipe (``persisted.recipe``: another policy,
        schema or dpsql), so that it is created afresh with today's columns before anything
        binds against it (the caller holds both locks)."""
        self._connection.execute(persisted.manifest_sql(DATABASE))
        stored = dict(self._connection.execute(
            f"SELECT copy, recipe FROM {DATABASE}.main.{persisted.MANIFEST}").fetchall())
        for table in tables:
            if stored.get(table.name) != persisted.recipe(table):
                self._connection.execute(f'DROP TABLE IF EXISTS {DATABASE}.main."{table.name}"')
                self._connection.execute(f'DROP TABLE IF EXISTS {DATABASE}.main."{raw_rows_name(table.name)}"')
                self._connection.execute(f"DELETE FROM {DATABASE}.main.{persisted.MANIFEST} WHERE copy = ?",
                                         [table.name])

    def refresh_bounding(self) -> None:
        """Forget the bounded copies' contents, the stored public relations and the types of
        SQL bound so far: the next query reading each rebuilds it (for every engine on this
        DuckDB instance, since they read the same copies)."""
        with self._lock:
            self._described.clear()
            self._file_digest = None
            instance = self._bounding_instance()
            with instance.lock:
                instance.filled.clear()
                instance.materialised.clear()
                instance.generation += 1  # every engine on the instance re-reads its public facts

    def public_generation(self) -> int:
        """Changes whenever any engine on this DuckDB instance refreshes (``refresh_bounding``):
        the stored public relations and copies every engine shares are rebuilt then, so what an
        analysis read of them (a join's multiplicity, a column's range) may no longer hold."""
        with self._lock:
            return self._bounding_instance().generation

    def build_bounding(self) -> None:
        """Fill every bounded copy now (``connect(..., eager_bounding=True)``, and the server):
        then no analyst query's time includes a scan of a raw private table."""
        with self._lock:
            self._fill_bounded(tuple(table.source for table in self._bounded.values()))

    def materialise(self, statement: exp.Expression | str) -> str:
        """Store the rows of ``statement`` — public data only — once, in the bounding database, and
        return the stored table's name (``dp_bounding.main."<name>"``).

        A public relation joined to private data is computed here, before the charge, and the
        query reads the stored rows: what the analysis measures on them (a join key's
        multiplicity, a column's range) is what the query runs on, however the public SQL
        would evaluate a second time (DESIGN.md invariant 15). The same SQL is stored once per
        DuckDB instance (until ``refresh_bounding``); it runs under the statement time limit.
        """
        sql = _rendered(statement)
        name = "dp_public_" + hashlib.sha256(sql.encode()).hexdigest()[:20]
        with self._lock:
            instance = self._bounding_instance()
            with instance.lock:
                if name in instance.materialised:
                    return name
                computing = instance.computing.setdefault(name, threading.Lock())
            cursor = self._connection.cursor()
        # Computed outside the engine's lock: other sessions' statements run meanwhile (a costly
        # public subquery held every query of the server for its whole time limit: an attacker's
        # review); the same SQL from two sessions is computed once, the second waiting for it.
        try:
            with computing:
                with instance.lock:
                    if name in instance.materialised:
                        return name
                with Deadline(cursor, self._timeout):
                    cursor.execute(f'CREATE OR REPLACE TABLE {DATABASE}.main."{name}" AS {sql}')
                with instance.lock:
                    instance.materialised.add(name)
        finally:
            cursor.close()
        return name

    def stored_reference(self, name: str) -> exp.Table:
        """``dp_bounding.main."<name>"``: where ``materialise`` stores public rows."""
        return exp.table_(name, db="main", catalog=DATABASE, quoted=True)

    def key_multiplicity(self, stored: str, keys: Sequence[str]) -> int:
        """The most stored public rows sharing one value of ``keys`` (NULL keys never match)."""
        return facts.multiplicity(self._public_fact(facts.multiplicity_sql(_stored(stored), keys, quoted)))

    def column_ranges(self, stored: str, columns: Sequence[str]) -> dict[str, tuple[Any, Any]]:
        """Exact min and max of the stored public rows' ``columns`` (finite ones only)."""
        if not columns:
            return {}
        return facts.ranges(self._public_fact(facts.ranges_sql(_stored(stored), columns, quoted))[0], columns)

    def _public_fact(self, sql: str) -> list[tuple]:
        """``fetch(sql)`` of SQL reading only a stored public relation (``materialise``), kept per
        generation: such a relation is written once and never changed until ``refresh_bounding``
        starts a new generation, so within one the same SQL reads the same rows. A new query
        text joining the same public table then reads its facts again for nothing (two
        statements, 1-2 ms at 1,000 rows). The generation is read before the fetch: a refresh
        meanwhile files the rows under the old one, never read again."""
        generation = self.public_generation()
        key = (generation, sql)
        with self._lock:
            found = self._facts.get(key)
        if found is not None:
            return found
        rows = self.fetch(sql)
        with self._lock:  # threads share this cache; an old generation's entries are dropped
            if any(kept[0] != generation for kept in self._facts) or len(self._facts) >= 512:
                self._facts.clear()
            self._facts[key] = rows
        return rows

    def cast_error(self, value: str, type_name: str) -> str | None:
        """DuckDB's first line when the constant does not cast to ``type_name``, else ``None``."""
        try:
            self.fetch(f"SELECT CAST($v AS {type_name})", {"v": value})
        except Exception as error:  # the constant and the type only: no data
            return str(error).split("\n")[0]
        return None

    def time_zone(self) -> str:
        """DuckDB's TimeZone setting: where date parts of a TIMESTAMPTZ are taken."""
        return str(self.fetch("SELECT current_setting('TimeZone')")[0][0])

    def _bounding_instance(self) -> "_Instance":
        """The shared state of this engine's DuckDB instance (the caller holds ``_lock``)."""
        if self._instance is None:
            self._instance = _instance_of(self._connection)
        return self._instance

    def _fill_bounded(self, sources) -> None:
        """Fill the bounded copy of every private table in ``sources`` (catalog keys) that is
        not yet built with this engine's salt (the caller holds ``_lock``). Which tables a
        statement reads comes from its checked plan, never its text; the copies' names are
        this engine's (``dpsql.backends.bounding``), one per table under its policy.

        The copies live on the DuckDB instance, so the instance's lock is held while they are
        built and each is built once for every engine sharing it. An engine whose ledger has
        another salt (another ledger on the same file) rebuilds a copy with its own: either
        copy is a stable transformation by a secret, data-independent salt, so which one a
        query reads changes its rows, never its privacy. No time limit applies: the filling
        SQL is dpsql's own, its cost set by the table alone. Each copy is replaced whole, with
        its row-count table (``dpsql.backends.bounding.raw_rows_sql``), in one transaction, so neither
        is ever half built nor read out of step with the other.
        """
        sources = frozenset(sources)
        wanted = [name for name, table in self._bounded.items() if table.source in sources]
        if not wanted:
            return
        instance = self._bounding_instance()
        with instance.lock:
            for name in wanted:
                if instance.filled.get(name) == self._salt:
                    continue
                table = self._bounded[name]
                made = self._stored_recipe(table)
                if made is not None and self._manifest_row(name) == made:
                    if self._stored != DATABASE:
                        self._read_in_place(table)
                    instance.filled[name] = self._salt  # the stored copy is the one this build would make
                    continue
                with self.progress(f"bounding {table.source}"):
                    self._build_copy(table, made if self._stored == DATABASE else None)
                instance.filled[name] = self._salt

    def _build_copy(self, table: BoundedTable, made: tuple[str, str, str] | None) -> None:
        """Build one copy and its row-count table in one transaction (with its manifest row
        ``made`` when copies are persisted: they are stored together or not at all)."""
        rows, _ = self._source_facts(table)
        count = batch_count(rows)
        cursor = self._connection.cursor()
        try:
            cursor.begin()  # the copy and its row-count table are swapped in together
            try:
                if self._stored != DATABASE:  # a stored copy read in place before (a view) gives way to the build
                    _drop_bounding(cursor, [table.name, raw_rows_name(table.name)], "VIEW")
                for statement in [fill_sql(table)] if count == 1 else fill_batches(table, count):
                    cursor.execute(statement, {"salt": self._salt})
                if not table.row_level:
                    for statement in [raw_rows_sql(table)] if count == 1 else raw_rows_batches(table, count):
                        cursor.execute(statement)
                if made is not None:
                    cursor.execute(f"INSERT OR REPLACE INTO {DATABASE}.main.{persisted.MANIFEST} VALUES (?, ?, ?, ?)",
                                   [table.name, *made])
                cursor.commit()
            except BaseException:
                cursor.rollback()
                raise
            if made is not None and self.copies is not None:
                cursor.execute(f"CHECKPOINT {DATABASE}")  # the file alone holds the copy: no WAL to replay
                persisted.protect(self.copies)
        finally:
            cursor.close()

    def _stored_recipe(self, table: BoundedTable) -> tuple[str, str, str] | None:
        """What a stored copy of ``table`` must have been built from to be read now (recipe, salt
        digest, fingerprint of the data now: ``dpsql.backends.duckdb.persisted``); ``None`` when the
        copies are not persisted. Reads the raw table once (the fingerprint)."""
        if self.copies is None or self._salt is None:
            return None
        return persisted.recipe(table), persisted.salt_digest(self._salt), self._fingerprint(table)

    def _fingerprint(self, table: BoundedTable) -> str:
        """The data's fingerprint (``dpsql.backends.duckdb.persisted``): the file digest for a base table
        of the opened file when it is the cheaper, else the keyed row fingerprint."""
        rows, in_file = self._source_facts(table)
        if in_file and rows is not None and self.path is not None and self.file_identity is not None and \
                persisted.file_digest_pays(self.path.stat().st_size, rows):
            if self._file_digest is None:
                self._file_digest = persisted.file_digest(self.path, self.file_identity, self._salt or "")
            if self._file_digest is not None:
                return self._file_digest
        cursor = self._connection.cursor()
        try:
            keys = persisted.fingerprint_keys(self._salt or "")
            row = cursor.execute(persisted.fingerprint_sql(table), keys).fetchall()[0]
        finally:
            cursor.close()
        return persisted.fingerprint_text(row)

    def _source_facts(self, table: BoundedTable) -> tuple[int | None, bool]:
        """DuckDB's estimate of the private table's rows (``None``: not a table, say a view), and whether
        all DuckDB reads of it is in the database file: a base table of the file's own catalog that no
        temporary object shadows, with no generated column (whose expression may be ``random()``).
        Reads the catalog only."""
        schema, name = table.source.split(".", 1) if "." in table.source else ("main", table.source)
        cursor = self._connection.cursor()
        try:
            found = cursor.execute(
                "SELECT database_name = current_database(), estimated_size FROM duckdb_tables() "
                "WHERE database_name IN (current_database(), 'temp') "
                "AND lower(schema_name) = ? AND lower(table_name) = ? UNION ALL "
                "SELECT FALSE, NULL FROM duckdb_views() WHERE database_name IN (current_database(), 'temp') "
                "AND lower(schema_name) = ? AND lower(view_name) = ?", [schema, name, schema, name]).fetchall()
            generated = cursor.execute(
                "SELECT count(*) FROM information_schema.columns WHERE table_catalog = current_database() "
                "AND lower(table_schema) = ? AND lower(table_name) = ? AND is_generated <> 'NEVER'",
                [schema, name]).fetchall()[0][0]
        finally:
            cursor.close()
        if len(found) != 1 or found[0][1] is None:
            return None, False
        return int(found[0][1]), bool(found[0][0]) and not generated

    def _manifest_row(self, name: str) -> tuple[str, str, str] | None:
        try:
            rows = self._connection.execute(
                f"SELECT recipe, salt, fingerprint FROM {self._stored}.main.{persisted.MANIFEST} WHERE copy = ?",
                [name]).fetchall()
        except duckdb.CatalogException:  # read-only stored copies with no manifest yet: none to read
            return None
        return tuple(rows[0]) if rows else None

    def _read_in_place(self, table: BoundedTable) -> None:
        """Read the stored copy of ``table`` (and its row-count table) where it is, through views
        in the bounding database: shared by every process, never written (``read_only_copies``)."""
        names = [table.name] + ([] if table.row_level else [raw_rows_name(table.name)])
        cursor = self._connection.cursor()
        try:
            cursor.begin()  # the copy and its row-count table are swapped in together
            _drop_bounding(cursor, names, "TABLE")  # the empty copy made so queries bind
            for name in names:
                cursor.execute(f'CREATE OR REPLACE VIEW {DATABASE}.main."{name}" AS '
                               f'SELECT * FROM {STORED}.main."{name}"')
            cursor.commit()
        finally:
            cursor.close()

    def fetch(self, sql: str, parameters: Any = None, *, bounded: Iterable[str] = ()) -> list[tuple]:
        """Run generated SQL and fetch every row (``QueryFailed`` past the time limit).
        ``bounded``: the private tables it reads (``PrivateQuery.bounded``), their copies filled first."""
        with self._lock:
            self._fill_bounded(bounded)
            cursor = self._connection.cursor()
        try:  # outside the lock: other threads' statements run meanwhile, each on its cursor
            with Deadline(cursor, self._timeout):
                return cursor.execute(sql, parameters or {}).fetchall()
        finally:
            cursor.close()

    def hold(self, name: str, sql: str, parameters: Any = None, *, bounded: Iterable[str] = ()) -> bool:
        """Store generated SQL's rows as ``dp_bounding.main."<name>"`` beside the bounded copies
        (owner-only like them, in memory unless the copies are persisted); False where the bounding
        database is not writable (a read-only engine): nothing is stored."""
        with self._lock:
            self._fill_bounded(bounded)
            cursor = self._connection.cursor()
        try:
            with Deadline(cursor, self._timeout):
                cursor.execute(f'CREATE TABLE {DATABASE}.main."{name}" AS {sql}', parameters or {})
            return True
        except (duckdb.PermissionException, duckdb.InvalidInputException, duckdb.IOException):
            return False  # read-only: the caller reads its rows from the copies instead
        finally:
            cursor.close()

    def drop_held(self, name: str) -> None:
        with self._lock:
            cursor = self._connection.cursor()
        try:
            cursor.execute(f'DROP TABLE IF EXISTS {DATABASE}.main."{name}"')
        except duckdb.Error:  # the table goes with the engine's database anyway
            pass
        finally:
            cursor.close()

    def fetch_df(self, statement: exp.Expression | str) -> pd.DataFrame:
        """Run a checked query over public tables and fetch the result as a DataFrame."""
        sql = _rendered(statement)
        with self._lock:
            cursor = self._connection.cursor()
        try:
            with Deadline(cursor, self._timeout):
                return cursor.execute(sql).df()
        finally:
            cursor.close()

    def describe(self, statement: exp.Expression | str, parameters: Any = None) -> list[tuple[str, str]]:
        """(name, type) of each column ``statement`` would return: binds it, reads no rows.

        Binding sees the schema and the query text only, so when it fails (a type error such
        as comparing a number with a string) the first line of DuckDB's message says nothing
        about the data, and it is raised as a static refusal: ``UnsupportedQuery``.
        """
        sql = _rendered(statement)
        known = self._described.get(sql)
        if known is not None:
            return known
        parameters = binding_parameters(statement, parameters)
        with self._lock:
            cursor = self._connection.cursor()
        try:
            with Deadline(cursor, self._timeout):
                rows = cursor.execute(f"DESCRIBE {sql}", parameters or {}).fetchall()
        except duckdb.Error as error:
            message = str(error).strip().split("\n")[0]
            raise UnsupportedQuery(f"the query does not bind: {message}",
                                   hint="check the types of the values the query compares and combines") from None
        finally:
            cursor.close()
        described = [(row[0], row[1]) for row in rows]
        with self._lock:  # threads share this cache: change it one at a time
            if len(self._described) >= 512:  # a bound, not an LRU: an old entry is merely re-bound
                self._described.pop(next(iter(self._described)))
            self._described[sql] = described
        return described

    def close(self) -> None:
        """Close the connection if dpsql opened it, and the post-processing database."""
        self._closed = True
        self.post_processing.close()
        if self._owned:
            self._connection.close()
        if self.spill is not None:
            shutil.rmtree(self.spill, ignore_errors=True)


def released_database(query_timeout: float | None = DEFAULT_QUERY_TIMEOUT) -> ReleasedDatabase:
    """The post-processing engine of a query engine (``released.ReleasedDatabase``): a private,
    hardened, empty in-memory DuckDB, opened when first used; DuckDB's and Spark's engines each
    keep one."""
    return ReleasedDatabase(lambda: open_hardened(":memory:", hardened_config(RELEASED_MEMORY_LIMIT)), query_timeout)


def recognise(target: Any) -> bool:
    """DuckDB opens what no other engine recognises (``dpsql.backends.registry``): a database
    file, a DuckDB connection, a dict of DataFrames; ``Engine.open`` refuses anything else."""
    return True


def open_duckdb(target: Any, *, query_timeout: float | None, memory_limit: str | None,
                copies: Path | None = None, read_only_copies: bool = False) -> Engine:
    """``Engine.open`` (``dpsql.backends.registry``)."""
    return Engine.open(target, query_timeout=query_timeout, memory_limit=memory_limit, copies=copies,
                       read_only_copies=read_only_copies)


def read_catalog(connection: duckdb.DuckDBPyConnection) -> Catalog:
    """The tables and views an unqualified or ``schema.table`` name can reach on ``connection``:
    {table: {column: type}}, all lower-cased, with how the data spells each name.

    Objects in the main schema are keyed by their name, others by 'schema.table'. Temporary
    objects (registered DataFrames among them) shadow main ones, as in DuckDB's own lookup, so
    the policy is checked against, and the bounded copies read, what a name resolves to. The
    one catalog reader: the connection, its policy check and the server's schema database see
    the same tables. Reads the schema only, never a row.

    >>> con = duckdb.connect()
    >>> _ = con.execute("CREATE TABLE t (a INTEGER); CREATE TEMP TABLE t (b VARCHAR)")
    >>> read_catalog(con)
    {'t': {'b': 'VARCHAR'}}
    """
    rows = connection.execute(
        "SELECT database_name, schema_name, table_name, column_name, data_type "
        "FROM duckdb_columns() "
        "WHERE database_name IN (current_database(), 'temp') AND NOT internal "
        "ORDER BY database_name = 'temp', database_name, schema_name, table_name, column_index"
    ).fetchall()
    catalog = Catalog()
    seen: set[tuple[str, str, str]] = set()
    for database, schema, table, column, type_name in rows:
        main = schema.lower() == "main"
        key = key_of_parts((schema, table))
        if (database, schema, table) not in seen:  # a new object replaces what it shadows
            seen.add((database, schema, table))
            catalog[key] = {}
            catalog.spellings[key] = table if main else f"{schema}.{table}"
        catalog[key][column.lower()] = type_name
        catalog.spellings.setdefault(column.lower(), column)  # for messages: how the data spells it
    return catalog


def _rendered(statement: exp.Expression | str) -> str:
    """A statement as DuckDB reads it: trees (with their ``dpsql.sql.pieces``) are rendered here."""
    return statement if isinstance(statement, str) else render(statement, DIALECT)


def _stored(name: str) -> str:
    """A stored public relation (``Engine.materialise``) as a table reference."""
    return f"{DATABASE}.main.{quoted(name)}"



class _Instance:
    """What every engine on one DuckDB database instance shares (module docstring)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        """Held around every change to ``dp_bounding``; taken after an engine's own lock."""
        self.filled: dict[str, str | None] = {}
        """Bounded copy name -> the salt it was last filled with."""
        self.materialised: set[str] = set()
        """Public relations stored in ``dp_bounding`` (``Engine.materialise``)."""
        self.computing: dict[str, threading.Lock] = {}
        """A lock per public relation being stored, so one computes it and the others wait."""
        self.generation = 0
        """Counts the refreshes of this instance (``Engine.public_generation``)."""


_INSTANCES: "weakref.WeakValueDictionary[str, _Instance]" = weakref.WeakValueDictionary()
_INSTANCES_LOCK = threading.Lock()
_SPILLS: dict[str, tuple[str, bool]] = {}
"""Each database file's spill directory in this process (``Engine._spilling``), and whether dpsql made it."""
_INSTANCE_TABLE = f"{DATABASE}.main.dp_instance"
STORED = "dp_stored"
"""Stored copies attached read-only, shared by many processes (``Engine.open``'s ``read_only_copies``)."""


def _instance_of(connection: duckdb.DuckDBPyConnection) -> _Instance:
    """The shared state of ``connection``'s DuckDB instance, attaching ``dp_bounding`` if needed.

    The instance is recognised by a random token kept in its own ``dp_bounding``: a DuckDB
    instance closed and opened again (every connection to a file closed, then a new one) has
    a fresh, empty ``dp_bounding`` and so a new token, and never inherits a record of copies
    it no longer holds. One process-wide lock covers the attach and the token, which are
    themselves changes to the instance's catalog.
    """
    with _INSTANCES_LOCK:
        try:  # a read when the instance has its token: no catalog write at all
            token = connection.execute(f"SELECT token FROM {_INSTANCE_TABLE}").fetchall()[0][0]
        except duckdb.Error:
            connection.execute(attach_sql())
            connection.execute(f"CREATE TABLE IF NOT EXISTS {_INSTANCE_TABLE} AS "
                               f"SELECT '{secrets.token_hex(16)}' AS token")
            token = connection.execute(f"SELECT token FROM {_INSTANCE_TABLE}").fetchall()[0][0]
        instance = _INSTANCES.get(token)
        if instance is None:
            instance = _INSTANCES[token] = _Instance()
        return instance


TIME_ZONE = "UTC"
"""The time zone of every database dpsql opens: date parts, truncations and casts of TIMESTAMP
WITH TIME ZONE values are taken in it (the Gregorian calendar), whatever the machine's zone,
and the locked configuration keeps any statement from changing it."""


def open_hardened(database: str, config: dict[str, Any], *, copies: Path | None = None,
                  read_only_copies: bool = False, **options: Any) -> duckdb.DuckDBPyConnection:
    """A DuckDB connection with ``config``, its time zone fixed to ``TIME_ZONE`` for every
    cursor (a global setting, made before the configuration is locked: DuckDB's ICU extension
    takes TimeZone only once it is loaded, after the connection opens).

    ``copies``: a DuckDB file attached as the bounding database (``dpsql.backends.duckdb.persisted``).
    It is attached before external access is turned off and the configuration locked, so no
    directory is ever allowed: the attached file stays readable and writable, and nothing else.
    """
    deferred = ("lock_configuration", "enable_external_access") if copies is not None else ("lock_configuration",)
    unlocked = {name: value for name, value in config.items() if name not in deferred}
    connection = duckdb.connect(database, config=unlocked, **options)
    try:
        if copies is not None:
            _attach_copies(connection, copies, read_only=read_only_copies)
        # Another connection to the same instance (same file, same process) may have fixed and
        # locked these already, or be doing so now: each SET may fail once locked, the outcome
        # is what must hold.
        statements = [f"SET GLOBAL TimeZone = '{TIME_ZONE}'", "SET GLOBAL Calendar = 'gregorian'"]
        if copies is not None and config.get("enable_external_access") is False:
            statements.append("SET GLOBAL enable_external_access = false")
        if config.get("lock_configuration"):
            statements.append("SET lock_configuration = true")
        for statement in statements:
            try:
                connection.execute(statement).fetchall()  # fetched: an unfinished result blocks the connection
            except duckdb.Error:
                pass
        zone, calendar, locked, external = connection.execute(
            "SELECT current_setting('TimeZone'), current_setting('Calendar'), "
            "current_setting('lock_configuration'), current_setting('enable_external_access')").fetchall()[0]
        if external and config.get("enable_external_access") is False:
            raise DPError("cannot turn off external access on the database: another connection in this process "
                          "opened it with other settings",
                          hint="open the file through dpsql.connect only, or pass your own connection")
        if (zone, calendar) != (TIME_ZONE, "gregorian") or (config.get("lock_configuration") and not locked):
            raise DPError(f"cannot fix the database's time zone to {TIME_ZONE} (it is {zone}, {calendar}): "
                          "another connection in this process opened it with other settings",
                          hint="open the file through dpsql.connect only, or pass your own connection")
    except BaseException:
        connection.close()
        raise
    return connection


def _attach_copies(connection: duckdb.DuckDBPyConnection, file: Path, *, read_only: bool = False) -> None:
    """Attach ``file`` as the bounding database (unless this instance has it already), with a new
    instance token (``_instance_of``): what this process records of its copies starts empty.

    Another process using the same copies holds DuckDB's lock on the file: this one then keeps
    its copies in memory, as without persistence, and says so.

    ``read_only``: ``file`` attached read-only as ``STORED`` (many processes at once) and the
    bounding database in memory, whose copies read the stored ones in place when they are current
    (``Engine._read_in_place``)."""
    if read_only:
        _attach_stored(connection, file)
        return
    with _INSTANCES_LOCK:
        if _has_database(connection, DATABASE):
            return
        literal = _file_literal(file)
        try:
            connection.execute(f"ATTACH {literal} AS {DATABASE} (READ_WRITE)")
        except duckdb.IOException as error:
            reason = str(error).splitlines()[0]
            warnings.warn(f"the persisted copies at {file} are in use by another process ({reason}); "
                          "this connection builds its own in memory", stacklevel=4)
            connection.execute(attach_sql())
        connection.execute(f"CREATE OR REPLACE TABLE {_INSTANCE_TABLE} AS SELECT '{secrets.token_hex(16)}' AS token")


def _has_database(connection: duckdb.DuckDBPyConnection, name: str) -> bool:
    """Whether this DuckDB instance has attached ``name`` already (another connection to it may have)."""
    return bool(connection.execute("SELECT count(*) FROM duckdb_databases() WHERE database_name = ?",
                                   [name]).fetchall()[0][0])


def _file_literal(file: Path) -> str:
    """``file`` as a SQL string literal (ATTACH takes no parameter)."""
    return "'" + str(file).replace("'", "''") + "'"


def _drop_bounding(cursor: duckdb.DuckDBPyConnection, names: list[str], kind: str) -> None:
    """Drop each of ``names`` in the bounding database that is a ``kind`` (TABLE or VIEW): DuckDB's
    ``DROP ... IF EXISTS`` fails on an object of the other kind."""
    listing = ("SELECT view_name FROM duckdb_views() WHERE database_name = ? AND list_contains(?, view_name)"
               if kind == "VIEW" else
               "SELECT table_name FROM duckdb_tables() WHERE database_name = ? AND list_contains(?, table_name)")
    for (name,) in cursor.execute(listing, [DATABASE, names]).fetchall():
        cursor.execute(f'DROP {kind} {DATABASE}.main."{name}"')


def _attach_stored(connection: duckdb.DuckDBPyConnection, file: Path) -> None:
    """``file`` read-only as ``STORED`` beside an in-memory bounding database (unless this instance
    has them already); without a stored file, or while a process writes it, copies are built in
    memory and a warning says so."""
    with _INSTANCES_LOCK:
        if _has_database(connection, STORED):
            return
        literal = _file_literal(file)
        try:
            if file.exists():
                connection.execute(f"ATTACH {literal} AS {STORED} (READ_ONLY)")
        except duckdb.IOException as error:
            reason = str(error).splitlines()[0]
            warnings.warn(f"the persisted copies at {file} cannot be read ({reason}); "
                          "this connection builds its own in memory", stacklevel=4)
        connection.execute(attach_sql())
        connection.execute(f"CREATE OR REPLACE TABLE {_INSTANCE_TABLE} AS SELECT '{secrets.token_hex(16)}' AS token")


def _attached_file(connection: duckdb.DuckDBPyConnection, database: str = DATABASE) -> str | None:
    """The file of the bounding database (or of ``database``), or ``None`` when it is in memory
    (or not attached)."""
    rows = connection.execute("SELECT path FROM duckdb_databases() WHERE database_name = ?", [database]).fetchall()
    return rows[0][0] if rows and rows[0][0] else None


@contextlib.contextmanager
def _no_progress(label: str):
    yield


def _load_frames(frames: dict, config: dict) -> duckdb.DuckDBPyConnection:
    connection = open_hardened(":memory:", config)
    try:
        for name, frame in frames.items():
            if not isinstance(frame, pd.DataFrame):
                raise DPError(f"table {name!r} is a {type(frame).__name__}, not a pandas DataFrame")
            if not str(name).replace("_", "").isalnum():
                raise DPError(f"table name {name!r} must be letters, digits and underscores")
            connection.register("dp_frame", frame)
            connection.execute(f'CREATE TABLE "{name}" AS SELECT * FROM dp_frame')
            connection.unregister("dp_frame")
    except BaseException:
        connection.close()
        raise
    return connection


def write_database(path: str | os.PathLike, tables: dict[str, tuple[Any, dict[str, str]]]) -> None:
    """Write a new DuckDB file at ``path`` holding ``tables``: name -> (a DataFrame, its column ->
    DuckDB type), each column cast to its type. For the curator's sample data (``dpsql demo``),
    never an analyst's: the file is written by its owner, outside any engine dpsql serves from.

    >>> import tempfile, pandas as pd
    >>> with tempfile.TemporaryDirectory() as d:
    ...     write_database(f"{d}/t.duckdb", {"t": (pd.DataFrame({"x": [1, 2]}), {"x": "SMALLINT"})})
    ...     with duckdb.connect(f"{d}/t.duckdb") as con:
    ...         con.sql("SELECT typeof(x), SUM(x) FROM t GROUP BY ALL").fetchall()
    [('SMALLINT', 3)]
    """
    with duckdb.connect(str(path)) as con:
        for name, (frame, types) in tables.items():
            columns = ", ".join(f"{column} {type_}" for column, type_ in types.items())
            con.execute(f"CREATE TABLE {name} ({columns})")
            con.register("frame", frame)
            casts = ", ".join(f"CAST({column} AS {type_})" for column, type_ in types.items())
            con.execute(f"INSERT INTO {name} SELECT {casts} FROM frame")
            con.unregister("frame")
        con.execute("CHECKPOINT")
