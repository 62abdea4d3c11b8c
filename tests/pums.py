"""Load the census (PUMS) test data into DuckDB.

The CSV files live in ``tests/data/pums/`` (see the README there for their origin); their
policy is ``tests/data/pums/pums.policy``. Columns are typed explicitly, so every variant has
the same schema whatever DuckDB's CSV sniffer would guess: all ``INTEGER``.

>>> import duckdb
>>> con = duckdb.connect()
>>> load_pums(con)
>>> con.sql("SELECT COUNT(*), COUNT(DISTINCT pid) FROM pums").fetchall()
[(1948, 1000)]
"""

from __future__ import annotations

from pathlib import Path

PUMS_DIR = Path(__file__).resolve().parent / "data" / "pums"
"""The folder holding the CSV files, their README and the policy."""

POLICY_PATH = PUMS_DIR / "pums.policy"
"""The dpsql policy of the ``pums`` table (written for the ``dup`` variant)."""

VARIANTS = {
    "plain": "PUMS.csv",
    "pid": "PUMS_pid.csv",
    "dup": "PUMS_dup.csv",
    "null": "PUMS_null.csv",
}
"""Variant name -> CSV file: ``plain`` has no pid; ``pid`` one row per person; ``dup`` rows
duplicated 1-4 times per person; ``null`` is ``dup`` with about 38% of rows missing a value."""

_COLUMNS = ("age", "sex", "educ", "race", "income", "married", "pid")


def load_pums(con, table: str = "pums", variant: str = "dup") -> None:
    """Create (or replace) ``table`` in the DuckDB connection ``con`` from a PUMS CSV file."""
    if variant not in VARIANTS:
        raise ValueError(f"unknown PUMS variant {variant!r}; use one of {sorted(VARIANTS)}")
    path = PUMS_DIR / VARIANTS[variant]
    columns = _COLUMNS if variant != "plain" else _COLUMNS[:-1]
    types = ", ".join(f"'{column}': 'INTEGER'" for column in columns)
    name = '"' + table.replace('"', '""') + '"'
    con.execute(
        f"CREATE OR REPLACE TABLE {name} AS SELECT {', '.join(columns)} "
        f"FROM read_csv(?, header = true, types = {{{types}}})",
        [str(path)],
    )


def pums_policy() -> str:
    """The text of ``pums.policy``."""
    return POLICY_PATH.read_text(encoding="utf-8")
