"""An empty in-memory DuckDB for computing on public values only.

Some mechanisms compute on values the policy makes public before anything is charged: a
workload's cells are the product of its KEYS domains (``dpsql.calls.workload``), and each
query's coefficients are its predicates evaluated on them. ``public_scratch`` gives them a
database of their own, with no data attached and no external access, so only this package
talks to DuckDB; a statement DuckDB cannot evaluate there is refused with DuckDB's first line,
which speaks of public values only.
"""

from __future__ import annotations

import duckdb

from dpsql.errors import UnsupportedQuery


class PublicScratch:
    """An empty in-memory DuckDB (module docstring); a context manager that closes it."""

    def __init__(self) -> None:
        self._connection = duckdb.connect(":memory:", config={"enable_external_access": False})

    def execute(self, sql: str) -> None:
        """Run a statement that makes a table of public values (an error here is dpsql's own)."""
        self._connection.execute(sql)

    def fetch(self, sql: str) -> list[tuple]:
        """Every row of ``sql``; ``UnsupportedQuery`` with DuckDB's first line when it cannot be
        evaluated (a type mismatch: public values only, the message holds no private data)."""
        try:
            return self._connection.execute(sql).fetchall()
        except duckdb.Error as error:
            raise UnsupportedQuery(str(error).splitlines()[0]) from None

    def close(self) -> None:
        self._connection.close()

    def __enter__(self) -> "PublicScratch":
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()


def public_scratch() -> PublicScratch:
    """A fresh ``PublicScratch``.

    >>> with public_scratch() as scratch:
    ...     scratch.execute("CREATE TABLE cells AS SELECT 0 AS dp_cell")
    ...     scratch.fetch("SELECT dp_cell + 1 FROM cells")
    [(1,)]
    """
    return PublicScratch()
