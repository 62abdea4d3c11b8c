"""Each private table bounded once: at most MAX ROWS PER UNIT rows of every unit, for every query.

A private table whose privacy unit is a column is read by analyst queries only through its
*bounded copy*, a table in an in-memory database attached as ``dp_bounding`` (so every cursor
of the connection sees it, and a read-only database file stays untouched), holding at most ``k`` (the policy's MAX ROWS PER UNIT) rows
of each unit — the ``k`` rows first in the order of a secret salted hash of the row's own
values — and no row whose unit is NULL.

Why this is safe. The copy is ``T(D)``, where ``T`` keeps, for each unit separately, a subset
of that unit's rows chosen from those rows and the salt alone. So ``T`` is *stable*: adding
or removing one unit (or changing its rows) changes the rows of that unit only, and the copy
of a neighbouring database is a neighbouring copy. Every query is then analysed and bounded
exactly as before, over ``T(D)`` instead of ``D``: its sensitivity argument holds for each
fixed salt, hence for the random one, and composition over many queries holds for the same
fixed ``T``. The salt is drawn independently of the data (it is the ledger's).

Why it is done. (1) Timing: analyst expressions never see more than ``k`` rows of one unit,
so a costly expression under ``CASE WHEN unit = target`` costs at most ``k`` rows' worth, not
the target's raw row count. (2) Speed: every unit in the copy is *light* (at most ``k``
rows), so a query that is ungrouped, or whose groups per unit cannot exceed its rows, needs
no per-unit aggregation at all (see ``dpsql.rewrite``) — it runs like a row-level query.

What it costs. The copy is built on the first query that reads the table (one window over
the table, without the analyst's query time limit: its SQL is dpsql's alone), lives in memory
(DuckDB spills it to disk under its memory limit), and reflects the data as it was then:
``Connection.refresh()`` rebuilds it after the wrapped database changed.
"""

from __future__ import annotations

from dataclasses import dataclass

from sqlglot import exp

from .model import PrivateTable

PREFIX = "dp_bounded_"
DATABASE = "dp_bounding"
"""The in-memory database holding the copies (never in the analyst's catalog)."""


@dataclass(frozen=True)
class BoundedTable:
    """The bounded copy of one private table."""

    source: str
    """The private table's catalog name (``schema.table`` outside ``main``)."""
    unit: str
    """Its privacy unit column (lower case)."""
    rows_per_unit: int
    """How many rows of each unit the copy keeps: the policy's MAX ROWS PER UNIT."""
    columns: tuple[str, ...]
    """Every column of the table (lower case), in order."""

    @property
    def name(self) -> str:
        return bounded_name(self.source, self.unit, self.rows_per_unit)


def bounded_name(source: str, unit: str, rows_per_unit: int) -> str:
    """The table holding ``source``'s copy bounded to ``rows_per_unit`` rows of each ``unit``.

    The name says all the copy depends on besides the salt, so two connections sharing one
    DuckDB connection under different policies never read each other's copies.

    >>> bounded_name("sales.visits", "User_Id", 10)
    'dp_bounded_sales__visits__user_id__10'
    """
    return f"{PREFIX}{source.lower().replace('.', '__')}__{unit.lower()}__{rows_per_unit}"


def bounded_reference(source: str, rule: PrivateTable) -> exp.Table:
    """The bounded copy of ``source`` (declared by ``rule``) as a FROM item."""
    name = bounded_name(source, rule.unit, rule.max_rows_per_unit)
    return exp.table_(name, db="main", catalog=DATABASE, quoted=True)


def bounded_tables(rules: list[PrivateTable], catalog: dict[str, dict[str, str]], key_of) -> list[BoundedTable]:
    """A bounded copy for every private table whose unit is a column (row-level tables need none)."""
    tables = []
    for rule in rules:
        if rule.row_level:
            continue
        key = key_of(rule.name)
        tables.append(BoundedTable(key, rule.unit.lower(), rule.max_rows_per_unit, tuple(catalog[key])))
    return tables


def _quoted(name: str) -> str:
    return ".".join(f'"{part}"' for part in name.split("."))


def attach_sql() -> str:
    """The copies' database: in memory, writable even beside a read-only database file."""
    return f"ATTACH IF NOT EXISTS ':memory:' AS {DATABASE} (READ_WRITE)"


def create_sql(table: BoundedTable) -> str:
    """An empty copy with the table's columns and types, so queries bind: reads no rows."""
    return (f'CREATE TABLE IF NOT EXISTS {DATABASE}."{table.name}" AS '
            f"SELECT * FROM {_quoted(table.source)} LIMIT 0")


def fill_sql(table: BoundedTable) -> str:
    """(Re)build the copy: each unit's first ``k`` rows in salted-hash order of the row's values.

    Ties (identical hashes) are broken by the values themselves, so the rows kept never depend
    on physical order or rowid; rows that tie on every value are identical, so which of them is
    kept does not matter. ``CREATE OR REPLACE`` swaps the whole copy in one statement.
    """
    columns = ", ".join(f'"{c}"' for c in table.columns)
    unit = f'"{table.unit}"'
    return (
        f'CREATE OR REPLACE TABLE {DATABASE}."{table.name}" AS SELECT * EXCLUDE (dp_n) FROM (\n'
        f"  SELECT *, ROW_NUMBER() OVER (PARTITION BY {unit} ORDER BY hash($salt, {columns}), {columns}) AS dp_n\n"
        f"  FROM {_quoted(table.source)}\n  WHERE {unit} IS NOT NULL\n) WHERE dp_n <= {table.rows_per_unit}"
    )
