"""The only module that talks to DuckDB.

It opens what the curator hands to ``dpsql.connect`` — a database file (read-only: the
user's file is never modified), an open DuckDB connection, or pandas DataFrames (copied into a
private in-memory database) — and runs SQL that dpsql generated. Analyst text never reaches it.

One lock serialises use of the connection: a DuckDB connection refuses concurrent calls from
two threads, and results are always fetched completely before the lock is released.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import Any

import duckdb
import pandas as pd

from .errors import DPError


class Engine:
    """A DuckDB connection dpsql runs its generated SQL on."""

    def __init__(self, connection: duckdb.DuckDBPyConnection, *, owned: bool, path: Path | None):
        self._connection = connection
        self._owned = owned
        self._lock = threading.Lock()
        self._post = None
        self.path = path
        """The database file, when one was opened; the default ledger sits beside it."""

    @classmethod
    def open(cls, target: Any) -> "Engine":
        """Open a path, adopt a connection, or load a dict of DataFrames."""
        if isinstance(target, duckdb.DuckDBPyConnection):
            return cls(target, owned=False, path=None)
        if isinstance(target, dict):
            return cls(_load_frames(target), owned=True, path=None)
        if isinstance(target, (str, os.PathLike)):
            path = Path(target)
            if str(target) == ":memory:":
                return cls(duckdb.connect(":memory:"), owned=True, path=None)
            if not path.exists():
                raise DPError(f"no database file at {path}", hint="pass the path of an existing DuckDB file")
            try:
                connection = duckdb.connect(str(path), read_only=True)
            except duckdb.Error as err:
                raise DPError(f"cannot open {path} as a DuckDB database: {err}") from None
            return cls(connection, owned=True, path=path.resolve())
        raise DPError(
            f"cannot connect to a {type(target).__name__}",
            hint="pass a DuckDB file path, a duckdb connection, or a dict of table name to pandas DataFrame",
        )

    def catalog(self) -> dict[str, dict[str, str]]:
        """Lower-cased table name -> {lower-cased column: DuckDB type} (schema only, no data)."""
        rows = self.fetch(
            "SELECT schema_name, table_name, column_name, data_type FROM duckdb_columns() "
            "WHERE NOT internal AND database_name = current_database() ORDER BY table_oid, column_index"
        )
        catalog: dict[str, dict[str, str]] = {}
        for schema, table, column, type_name in rows:
            key = table.lower() if schema == "main" else f"{schema}.{table}".lower()
            catalog.setdefault(key, {})[column.lower()] = type_name
        return catalog

    def fetch(self, sql: str, parameters: dict | None = None) -> list[tuple]:
        """Run generated SQL and fetch every row."""
        with self._lock:
            cursor = self._connection.cursor()
            try:
                return cursor.execute(sql, parameters or {}).fetchall()
            finally:
                cursor.close()

    def fetch_df(self, sql: str) -> pd.DataFrame:
        """Run generated SQL and fetch the result as a DataFrame."""
        with self._lock:
            cursor = self._connection.cursor()
            try:
                return cursor.execute(sql).df()
            finally:
                cursor.close()

    def post_process(self, columns: list[str], types: list[str], rows: list[tuple], sql: str):
        """Run a post-processing query over released rows, in a separate, empty database.

        The released rows are all it can see: the wrapped database is not attached to it, and
        its external access is off. One such database is kept per engine (opening one costs
        tens of milliseconds); each call loads the rows into a fresh ``dp_core`` table.
        Returns (column names, rows).
        """
        with self._lock:
            if self._post is None:
                self._post = duckdb.connect(":memory:", config={"enable_external_access": False})
            connection = self._post
            definition = ", ".join(f'"{c}" {t}' for c, t in zip(columns, types))
            connection.execute(f"CREATE OR REPLACE TABLE dp_core ({definition})")
            if rows:
                connection.register("dp_frame", pd.DataFrame.from_records(rows, columns=columns))
                try:
                    connection.execute("INSERT INTO dp_core SELECT * FROM dp_frame")
                finally:
                    connection.unregister("dp_frame")
            cursor = connection.execute(sql)
            names = [d[0] for d in cursor.description]
            result = cursor.fetchall()
            connection.execute("DROP TABLE dp_core")
            return names, result

    def describe(self, sql: str, parameters: dict | None = None) -> list[tuple[str, str]]:
        """(name, type) of each column ``sql`` would return: binds the query, reads no rows."""
        with self._lock:
            cursor = self._connection.cursor()
            try:
                rows = cursor.execute(f"DESCRIBE {sql}", parameters or {}).fetchall()
            finally:
                cursor.close()
        return [(row[0], row[1]) for row in rows]

    def close(self) -> None:
        """Close the connection if dpsql opened it."""
        if self._post is not None:
            self._post.close()
            self._post = None
        if self._owned:
            self._connection.close()


def _load_frames(frames: dict) -> duckdb.DuckDBPyConnection:
    connection = duckdb.connect(":memory:")
    for name, frame in frames.items():
        if not isinstance(frame, pd.DataFrame):
            raise DPError(f"table {name!r} is a {type(frame).__name__}, not a pandas DataFrame")
        if not str(name).replace("_", "").isalnum():
            raise DPError(f"table name {name!r} must be letters, digits and underscores")
        connection.register("dp_frame", frame)
        connection.execute(f'CREATE TABLE "{name}" AS SELECT * FROM dp_frame')
        connection.unregister("dp_frame")
    return connection
