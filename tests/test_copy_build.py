"""The bounded copy's build at scale (issue 38, item 4): split into batches of units it keeps the
same rows (``dpsql.backends.bounding.fill_batches``), and DuckDB spills it to a directory of the
curator's alone (``dpsql.backends.duckdb.hardening.spill_directory``)."""

from __future__ import annotations

import os
import stat
import tempfile

import duckdb
import pandas as pd
import pytest

import dpsql
from dpsql.backends import bounding
from dpsql.backends.bounding import (
    BoundedTable,
    attach_sql,
    fill_batches,
    fill_sql,
    raw_rows_batches,
    raw_rows_name,
    raw_rows_sql,
)
from dpsql.backends.duckdb import hardening
from dpsql.errors import DPError

COLUMNS = {
    "INTEGER": "CAST(i % 37 AS INTEGER)",
    # units differing only in case or a trailing byte: one batch each, whatever the collation
    "VARCHAR": "CASE WHEN i % 3 = 0 THEN 'u' || (i % 11) ELSE 'U' || (i % 11) END "
               "|| CASE WHEN i % 5 = 0 THEN ' ' ELSE '' END",
    "BIGINT": "CAST(hash(i % 23) >> 1 AS BIGINT) - 4611686018427387904",  # large ids of either sign
}

FRAMES = {"p": pd.DataFrame({"a": [1]})}


def _built(con, table: BoundedTable, statements: list[str]) -> tuple[list[str], list[str]]:
    """The copy's rows and its row-count table's, once ``statements`` ran."""
    con.execute("BEGIN")
    for statement in statements:
        con.execute(statement, {"salt": "batches"} if "$salt" in statement else None)
    con.execute("COMMIT")
    return tuple(sorted(repr(row) for row in con.execute(f'SELECT * FROM dp_bounding."{name}"').fetchall())
                 for name in (table.name, raw_rows_name(table.name)))


@pytest.mark.parametrize("unit_type", list(COLUMNS))
@pytest.mark.parametrize("count", [2, 3, 7])
def test_a_copy_built_in_batches_is_the_copy_built_at_once(unit_type, count):
    """Heavy units (up to 60 rows beside a limit of 3), ties on every column, a -0.0 beside a 0.0:
    the same rows kept, with the same per-unit counts and padding, whatever the number of batches."""
    con = duckdb.connect()
    con.execute(f"CREATE TABLE t AS SELECT {COLUMNS[unit_type]} AS u, "
                "CASE WHEN i % 7 = 0 THEN CAST('-0.0' AS DOUBLE) WHEN i % 7 = 1 THEN 0.0 ELSE (i % 13) / 4 END AS x, "
                "'s' || (i % 4) AS s FROM range(2000) r(i)")
    con.execute("INSERT INTO t SELECT NULL, 1.0, 'null unit' FROM range(5)")
    con.execute(attach_sql())
    columns = tuple(con.execute("SELECT column_name, column_type FROM (DESCRIBE t)").fetchall())
    table = BoundedTable("t", "u", 3, columns)
    at_once = _built(con, table, [fill_sql(table), raw_rows_sql(table)])
    batched = _built(con, table, fill_batches(table, count) + raw_rows_batches(table, count))
    assert batched == at_once
    units = con.execute("SELECT count(DISTINCT u) FROM t").fetchall()[0][0]
    assert (len(at_once[0]), len(at_once[1])) == (2 + 3 * units, units)


def test_the_engine_builds_a_large_table_in_batches(tmp_path, monkeypatch):
    """Through ``dpsql.connect``: a table of more than ``BATCH_ROWS`` rows is built in batches, and its copy
    is the one a single statement builds under the same salt (the same ledger)."""
    path = tmp_path / "b.duckdb"
    con = duckdb.connect(str(path))
    con.execute("CREATE TABLE t AS SELECT i % 101 AS uid, (i * 7) % 13 AS x FROM range(3000) r(i)")
    con.close()
    policy = "BUDGET EPSILON 100; PRIVATE TABLE t (PRIVACY UNIT uid, MAX ROWS PER UNIT 4, x BOUNDS 0 TO 20);"
    ledger = tmp_path / "b.ledger"

    def copy() -> list[str]:
        with dpsql.connect(str(path), policy=policy, ledger=str(ledger), eager_bounding=True) as db:
            return [sorted(repr(row) for row in db._engine._connection.execute(
                f'SELECT * FROM dp_bounding."{name}"').fetchall())
                for name in ("dp_bounded_t__uid__4", "dp_raw_rows_dp_bounded_t__uid__4")]

    counts: list[int] = []
    original = bounding.fill_batches
    monkeypatch.setattr("dpsql.backends.duckdb.fill_batches",
                        lambda table, count: counts.append(count) or original(table, count))
    at_once = copy()
    assert counts == []  # 3,000 rows: one statement
    monkeypatch.setattr(bounding, "BATCH_ROWS", 1000)
    assert copy() == at_once
    assert counts == [3]


def test_duckdb_spills_to_a_directory_of_the_curators_alone(tmp_path):
    path = tmp_path / "s.duckdb"
    with duckdb.connect(str(path)) as con:
        con.execute("CREATE TABLE p (a INTEGER)")
    policy = "BUDGET EPSILON 1; PUBLIC TABLE p;"
    with dpsql.connect(str(path), policy=policy) as db:
        directory = db._engine._connection.execute("SELECT current_setting('temp_directory')").fetchall()[0][0]
        assert os.path.dirname(directory) == tempfile.gettempdir()  # never beside the data, under the umask
        assert stat.S_IMODE(os.stat(directory).st_mode) == 0o700
        with dpsql.connect(str(path), policy=policy) as again:  # one directory per file: DuckDB's instance is shared
            assert again._engine._connection.execute(
                "SELECT current_setting('temp_directory')").fetchall()[0][0] == directory
    with dpsql.connect(FRAMES, policy=policy) as db:  # in memory: its own directory, removed on close
        directory = db._engine._connection.execute("SELECT current_setting('temp_directory')").fetchall()[0][0]
        assert stat.S_IMODE(os.stat(directory).st_mode) == 0o700
    assert not os.path.exists(directory)


def test_a_named_spill_directory_must_be_the_curators_alone(tmp_path, monkeypatch):
    shared = tmp_path / "shared"
    shared.mkdir(mode=0o755)
    os.chmod(shared, 0o755)
    monkeypatch.setenv(hardening.SPILL_VARIABLE, str(shared))
    with pytest.raises(DPError, match="chmod 700"):
        dpsql.connect(FRAMES, policy="BUDGET EPSILON 1; PUBLIC TABLE p;")
    os.chmod(shared, 0o700)
    with dpsql.connect(FRAMES, policy="BUDGET EPSILON 1; PUBLIC TABLE p;") as db:
        assert db._engine._connection.execute(
            "SELECT current_setting('temp_directory')").fetchall()[0][0] == str(shared)
    assert shared.exists()  # the curator's directory stays


def test_a_build_past_the_memory_limit_spills_and_keeps_the_same_rows(tmp_path):
    """Under a memory limit far below the build's sort, DuckDB spills to the directory and the copy is
    the one built with memory to spare."""
    path = tmp_path / "m.duckdb"
    con = duckdb.connect(str(path))
    con.execute("CREATE TABLE t AS SELECT i % 50000 AS uid, md5(CAST(i AS VARCHAR)) AS s FROM range(1500000) r(i)")
    con.close()
    policy = "BUDGET EPSILON 100; PRIVATE TABLE t (PRIVACY UNIT uid, MAX ROWS PER UNIT 2);"
    ledger = tmp_path / "m.ledger"

    def copy(limit: str) -> tuple[int, int]:
        with dpsql.connect(str(path), policy=policy, ledger=str(ledger), eager_bounding=True,
                           memory_limit=limit) as db:
            return db._engine._connection.execute(
                'SELECT count(*), sum(hash(uid, s)) FROM dp_bounding."dp_bounded_t__uid__2"').fetchall()[0]

    assert copy("60MB") == copy("2GB")
