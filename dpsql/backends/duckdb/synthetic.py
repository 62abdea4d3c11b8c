"""Synthetic tables in DuckDB: their files, and the sandbox their owner's queries run in.

A synthetic table is a DP release, public to the analyst who paid for it
(``dpsql.query.synthetic_tables``). Kept with a ledger file, each is one DuckDB file (its rows in
table ``rows``, what was measured as JSON in table ``meta``), written once and never changed:
compact and quick to read back (a million rows in a few megabytes, copied in well under a second).

Queries of them run in a sandbox: an in-memory DuckDB holding those tables and nothing else (no
private table, no bounded copy, no ledger, nobody else's synthetic table). It is walled in as
every database dpsql opens (``dpsql.backends.duckdb.hardening``: no files, no network, no
extensions, no Python variables) with a small memory limit, one thread and a time limit, and its
configuration is locked once the tables are in, so no statement can undo any of it. The files are
copied in by dpsql before the wall goes up (``enable_external_access`` can be turned off at run
time, never back on), and detached, so not even their paths remain. That is the second wall: the
first is that only one query, regenerated from its parsed tree, reaches it (``dpsql.sql.parse``).

>>> import pandas as pd
>>> with SyntheticSandbox({"fake": pd.DataFrame({"a": [1, 2, 2]})}) as sandbox:
...     sandbox.run("SELECT a, COUNT(*) AS n FROM fake GROUP BY a ORDER BY a")
(['a', 'n'], [(1, 1), (2, 2)], ['BIGINT', 'BIGINT'])
"""

from __future__ import annotations

import os
import shutil
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import duckdb
from sqlglot import exp

from dpsql.backends.duckdb.hardening import HARDENED_CONFIG, spill_directory
from dpsql.backends.render import render
from dpsql.errors import QueryFailed, UnsupportedQuery
from dpsql.sql.names import quoted
from dpsql.sql.parse import DIALECT

SANDBOX_MEMORY = "512MB"
"""The sandbox's memory limit: a runaway query fails instead of starving the server."""
SANDBOX_TIMEOUT = 30.0
"""Seconds a query of synthetic tables may run before it is stopped (at most; the server's
per-statement limit when it is shorter: a free query holds a worker like any other)."""
SANDBOX_ROWS = 1_000_000
"""The most rows a query of synthetic tables may return: its result is held in the server's memory,
outside DuckDB's limit, and costs nothing, so it is bounded as the private path's answers are."""
SANDBOX_SPILL = "1GB"
"""The most the sandbox may spill, into an owner-only directory (``spill_directory``)."""
_FRAME = "dp_synthetic_frame"
"""The name a DataFrame is registered under while it is copied in (dropped before any query)."""
_FILE = "dp_synthetic_file"
"""The name a table's file is attached under while it is copied in (detached before any query)."""


def write_synthetic_file(path: str | os.PathLike, rows: Any, meta: str) -> None:
    """Write a new DuckDB file at ``path`` holding ``rows`` (a DataFrame) and ``meta`` (text).
    ``path`` must not exist; the caller's directory keeps it from others."""
    with duckdb.connect(os.fspath(path), config=dict(HARDENED_CONFIG)) as connection:
        connection.register(_FRAME, rows)
        connection.execute(f"CREATE TABLE rows AS SELECT * FROM {_FRAME}")
        connection.unregister(_FRAME)
        connection.execute("CREATE TABLE meta (json VARCHAR)")
        connection.execute("INSERT INTO meta VALUES ($1)", [meta])
        connection.execute("CHECKPOINT")


def read_synthetic_meta(path: str | os.PathLike) -> str:
    """The ``meta`` text of the synthetic table's file at ``path``."""
    with duckdb.connect(os.fspath(path), read_only=True, config=dict(HARDENED_CONFIG)) as connection:
        return connection.execute("SELECT json FROM meta").fetchall()[0][0]


def read_synthetic_rows(path: str | os.PathLike):
    """The rows of the synthetic table's file at ``path``, as a DataFrame."""
    with duckdb.connect(os.fspath(path), read_only=True, config=dict(HARDENED_CONFIG)) as connection:
        return connection.execute("SELECT * FROM rows").df()


def synthetic_sql(tree: exp.Expression, *, pretty: bool = False) -> str:
    """The text of ``tree`` as it runs in the sandbox (and as EXPLAIN shows it)."""
    return render(tree, DIALECT, pretty=pretty)


class SyntheticSandbox:
    """An in-memory DuckDB holding ``tables`` and nothing else (module docstring): name -> a
    DataFrame, or the path of a file ``write_synthetic_file`` wrote. A context manager that closes it."""

    def __init__(self, tables: dict[str, Any], *, memory_limit: str = SANDBOX_MEMORY,
                 timeout: float | None = SANDBOX_TIMEOUT, cancelled: Callable[[], bool] | None = None):
        files = any(isinstance(source, (str, Path)) for source in tables.values())
        self._spill, made = spill_directory()  # not DuckDB's default .tmp, made under the umask in the cwd
        self._spill_made = made
        config: dict[str, Any] = {**HARDENED_CONFIG, "memory_limit": memory_limit, "threads": 1,
                                  "temp_directory": self._spill, "max_temp_directory_size": SANDBOX_SPILL,
                                  "enable_external_access": files}  # turned off below, before any query
        try:
            self._connection = duckdb.connect(":memory:", config=config)
        except BaseException:
            self._remove_spill()
            raise
        self._timeout = SANDBOX_TIMEOUT if timeout is None else min(timeout, SANDBOX_TIMEOUT)
        self._cancelled = cancelled
        try:
            for name, source in tables.items():
                self._copy_in(name, source)
            self._connection.execute("SET enable_external_access = false")
            self._connection.execute("SET lock_configuration = true")
        except BaseException:
            self.close()
            raise

    def _copy_in(self, name: str, source: Any) -> None:
        if isinstance(source, (str, Path)):
            path = os.fspath(source).replace("'", "''")
            self._connection.execute(f"ATTACH '{path}' AS {_FILE} (READ_ONLY)")
            self._connection.execute(f"CREATE TABLE {quoted(name)} AS SELECT * FROM {_FILE}.main.rows")
            self._connection.execute(f"DETACH {_FILE}")
        else:
            self._connection.register(_FRAME, source)
            self._connection.execute(f"CREATE TABLE {quoted(name)} AS SELECT * FROM {_FRAME}")
            self._connection.unregister(_FRAME)

    def run(self, statement: exp.Expression | str) -> tuple[list[str], list[tuple], list[str]]:
        """``statement``'s columns, rows and DuckDB types (a tree, rendered here; text only from
        dpsql itself and tests). DuckDB's refusal (a missing column, a file function) is an
        ``UnsupportedQuery`` with its first line: the database holds the analyst's own synthetic
        tables only, so its messages speak of nothing else."""
        done = threading.Event()
        stopped: list[str] = []

        def watch() -> None:  # the time limit, and the caller's cancel (a PostgreSQL cancel request)
            deadline = time.monotonic() + self._timeout
            while not done.wait(0.05):
                if time.monotonic() >= deadline or (self._cancelled is not None and self._cancelled()):
                    stopped.append("cancelled" if time.monotonic() < deadline else "timeout")
                    self._connection.interrupt()
                    return

        watcher = threading.Thread(target=watch, name="dpsql-synthetic-deadline", daemon=True)
        watcher.start()
        try:
            sql = statement if isinstance(statement, str) else synthetic_sql(statement)
            relation = self._connection.sql(sql)
            if relation is None:  # not a query: the parse stage lets none through
                raise UnsupportedQuery("only queries can be run on a synthetic table")
            columns, types = list(relation.columns), [str(t) for t in relation.types]
            rows = relation.limit(SANDBOX_ROWS + 1).fetchall()
        except duckdb.InterruptException:
            if stopped == ["cancelled"]:
                raise QueryFailed("the query of synthetic tables was cancelled") from None
            raise QueryFailed(f"the query of synthetic tables ran longer than {self._timeout:g} seconds and was "
                              "stopped") from None
        except duckdb.Error as error:
            raise UnsupportedQuery(f"the query of synthetic tables failed: {str(error).splitlines()[0]}",
                                   hint="check the names of your synthetic tables and their columns") from None
        finally:
            done.set()
            watcher.join()
        if len(rows) > SANDBOX_ROWS:
            raise UnsupportedQuery(f"the query of synthetic tables returns more than {SANDBOX_ROWS:,} rows",
                                   hint="aggregate, or add a LIMIT (and OFFSET to read further)")
        return columns, rows, types

    def _remove_spill(self) -> None:
        if self._spill_made:
            shutil.rmtree(self._spill, ignore_errors=True)

    def close(self) -> None:
        try:
            self._connection.close()
        finally:
            self._remove_spill()

    def __enter__(self) -> "SyntheticSandbox":
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()
