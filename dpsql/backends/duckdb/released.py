"""Post-processing of released values: a private, empty DuckDB that sees nothing else.

What combines released (noisy) values — the select items over aggregates, HAVING, ORDER BY,
LIMIT — runs after the charge, on the released rows alone. ``ReleasedDatabase`` is the one
place that does it, whichever engine ran the query (``Backend.post_processing``): a hardened
in-memory DuckDB to which the wrapped database is never attached, so the released rows are all
a post-processing query can read. It also gives released rows the dtypes a DuckDB user gets
(``convert_released``). Its expressions are total (``dpsql.analysis.aggregates.total_post``),
so it never fails depending on the data (invariant 19).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import Any

import duckdb
import pandas as pd
from sqlglot import exp

from dpsql.backends.deadline import DEFAULT_QUERY_TIMEOUT, Deadline, check_timeout
from dpsql.backends.duckdb.hardening import hardened_config
from dpsql.backends.keys import WIDE_INTEGERS, display_value, fetched_as_text
from dpsql.backends.render import DUCKDB, render
from dpsql.errors import InvalidParameter
from dpsql.sql.types import base_type

MEMORY_LIMIT = "1GB"
"""The post-processing database's memory limit: it holds one answer's released rows."""


class ReleasedDatabase:
    """The post-processing engine (module docstring): one per query engine, opened when first
    used (opening a database costs tens of milliseconds), each call loading the released rows
    into a fresh ``dp_core`` table. Calls are serialised (one connection, one ``dp_core``)."""

    def __init__(self, open_database: Callable[[], duckdb.DuckDBPyConnection],
                 query_timeout: float | None = DEFAULT_QUERY_TIMEOUT):
        self._open = open_database
        """Opens the private database: hardened, in memory (``dpsql.backends.duckdb.released_database``)."""
        self._timeout = check_timeout(query_timeout)
        self._lock = threading.Lock()
        self._connection: duckdb.DuckDBPyConnection | None = None
        self._closed = False

    def _database(self) -> duckdb.DuckDBPyConnection:
        """The private database, opened on first use (the caller holds ``_lock``)."""
        if self._connection is None:
            self._connection = self._open()
        return self._connection

    def post_process(self, columns: list[str], types: list[str], rows: list[tuple],
                     statement: exp.Expression | str) -> tuple[list[str], list[tuple]]:
        """Run a post-processing query (a tree over ``dp_core``, or its DuckDB text) over the
        released rows ``rows`` of ``columns`` typed ``types``: (column names, rows)."""
        sql = _rendered(statement)
        with self._lock:
            connection = self._database()
            definition = ", ".join(f'"{c}" {t}' for c, t in zip(columns, types))
            connection.execute(f"CREATE OR REPLACE TABLE dp_core ({definition})")
            if rows:
                connection.register("dp_frame", pd.DataFrame.from_records(_frameable(rows, types), columns=columns))
                try:
                    connection.execute("INSERT INTO dp_core SELECT * FROM dp_frame")
                finally:
                    connection.unregister("dp_frame")
            with Deadline(connection, self._timeout):
                described = connection.execute(f"DESCRIBE {sql}").fetchall()
                names, types = [row[0] for row in described], [row[1] for row in described]
                result = connection.execute(_fetchable_sql(sql, types)).fetchall()
            connection.execute("DROP TABLE dp_core")
            if any(map(fetched_as_text, types)):
                result = [tuple(display_value(value, type_name) if fetched_as_text(type_name) else value
                                for value, type_name in zip(row, types)) for row in result]
            return names, result

    def released_types(self, columns: list[str], types: list[str],
                       statement: exp.Expression | str) -> list[tuple[str, str]]:
        """(name, type) of a post-processing query's columns over an empty ``dp_core`` of
        these columns: binds the query, reads no rows (``DPResult.types``)."""
        sql = _rendered(statement)
        with self._lock:
            connection = self._database()
            definition = ", ".join(f'"{c}" {t}' for c, t in zip(columns, types))
            connection.execute(f"CREATE OR REPLACE TABLE dp_core ({definition})")
            try:
                return [(row[0], row[1]) for row in connection.execute(f"DESCRIBE {sql}").fetchall()]
            finally:
                connection.execute("DROP TABLE dp_core")

    def convert(self, columns: list[str], types: list[str], texts: Sequence[tuple], form: str) -> Any:
        """``convert_released`` in this database (a conversion of a small answer costs about a
        millisecond here); once closed, in a fresh one."""
        with self._lock:
            connection = None if self._closed else self._database()
            return convert_released(columns, types, texts, form, connection)

    def close(self) -> None:
        """Close the database; a later conversion opens a fresh one of its own."""
        with self._lock:
            self._closed = True
            if self._connection is not None:
                self._connection.close()
                self._connection = None


def convert_released(columns: list[str], types: list[str], texts: Sequence[tuple], form: str,
                     connection: duckdb.DuckDBPyConnection | None = None) -> Any:
    """Released rows as DuckDB itself converts them: ``form`` is "df", "arrow" or "numpy".

    ``texts`` holds each value as DuckDB's text (or ``None`` for NULL); each column is cast
    to its type, and DuckDB's own conversion of
    that relation is returned (in ``connection``, else in a fresh, hardened, empty in-memory
    database), so dtypes are exactly those a DuckDB user gets (HUGEINT as a
    float64 column in pandas and a decimal128(38, 0) in Arrow, DATE as datetime64, ...).
    Returns ``None`` when a value does not cast back (the caller converts the Python values).

    >>> convert_released(["n", "d"], ["BIGINT", "DATE"], [("3", "2024-01-31")], "df").dtypes.tolist()
    [dtype('int64'), dtype('<M8[us]')]
    """
    if any(";" in type_name for type_name in types):
        return None  # one statement only, whatever a type's text holds (field names are quoted)
    names = [f"dp_c{i}" for i in range(len(columns))]
    frame = pd.DataFrame.from_records(texts, columns=names) if texts else pd.DataFrame({n: [] for n in names})
    frame = frame.astype(object)
    owned = connection is None
    if connection is None:
        connection = duckdb.connect(":memory:", config=hardened_config(MEMORY_LIMIT))
    try:
        connection.register("dp_frame", frame)
        select = ", ".join(f'CAST(CAST({n} AS VARCHAR) AS {t}) AS "{c.replace(chr(34), chr(34) * 2)}"'
                           for n, t, c in zip(names, types, columns))
        relation = connection.sql(f"SELECT {select} FROM dp_frame")
        if form == "df":
            return relation.df()
        if form == "arrow":
            return relation.to_arrow_table()
        if form == "numpy":
            return relation.fetchnumpy()
        raise InvalidParameter(f"unknown conversion {form!r}")
    except duckdb.Error:
        return None
    finally:
        if owned:
            connection.close()
        else:
            connection.unregister("dp_frame")


def _rendered(statement: exp.Expression | str) -> str:
    return statement if isinstance(statement, str) else render(statement, DUCKDB)


def _frameable(rows: list[tuple], types: list[str]) -> list[tuple]:
    """Rows as pandas can carry them into DuckDB exactly: integers of types that need not fit
    int64 go as decimal text (pandas would make 2**64 - 1 with a NULL a float64, silently
    rounded), which DuckDB casts back into the column's type exactly.

    >>> _frameable([(2**64 - 1, 1), (None, 2)], ["UBIGINT", "BIGINT"])
    [('18446744073709551615', 1), (None, 2)]
    """
    wide = {i for i, type_name in enumerate(types) if base_type(type_name) in WIDE_INTEGERS}
    if not wide:
        return rows
    return [tuple(str(value) if i in wide and value is not None else value for i, value in enumerate(row))
            for row in rows]


def _fetchable_sql(sql: str, types: list[str]) -> str:
    """``sql`` with every result column whose Python conversion is lossy or can fail (a date past
    9999, an INTERVAL of 10^9 months, nanoseconds) cast to DuckDB's text (``dpsql.backends.keys``).
    Columns are renamed positionally (output names may repeat); a projection keeps the order
    of the rows it reads."""
    if not any(map(fetched_as_text, types)):
        return sql
    names = [f"dp_c{i}" for i in range(len(types))]
    select = ", ".join(f"CAST({n} AS VARCHAR)" if fetched_as_text(t) else n for n, t in zip(names, types))
    return f"SELECT {select} FROM ({sql}) AS dp_post({', '.join(names)})"
