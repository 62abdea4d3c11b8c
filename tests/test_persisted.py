"""Persisted bounded copies (``dpsql.backends.duckdb.persisted``): reused only when they are exactly
the copy a new build would make, rebuilt when the data, the recipe or the salt changed, and
kept where only the curator can read them."""

from __future__ import annotations

import os
import stat

import duckdb
import pytest

import dpsql
from dpsql.backends.duckdb import Engine
from dpsql.errors import DPError, InvalidParameter

POLICY = ("BUDGET EPSILON 100; PRIVATE TABLE t (PRIVACY UNIT uid, MAX ROWS PER UNIT 2, "
          "MAX STRING LENGTH 5, x BOUNDS -10 TO 10);")
COPY = "dp_bounded_t__uid__2__str5"


@pytest.fixture
def database(tmp_path):
    path = tmp_path / "t.duckdb"
    con = duckdb.connect(str(path))
    con.execute("CREATE TABLE t (uid INTEGER, x DOUBLE, s VARCHAR)")
    # heavy units (more rows than the limit), light ones, a -0.0 beside a 0.0, strings that
    # a NOCASE collation or a cut at 5 characters would merge
    con.execute("INSERT INTO t SELECT i % 5, CASE WHEN i % 7 = 0 THEN 0.0 ELSE i / 3 END, "
                "CASE WHEN i % 2 = 0 THEN 'Abc' ELSE 'abc' END || i FROM range(40) r(i)")
    con.execute("INSERT INTO t VALUES (100, 1.0, 'x'), (101, CAST('-0.0' AS DOUBLE), 'y')")
    assert con.execute("SELECT signbit(x) FROM t WHERE uid = 101").fetchall() == [(True,)]
    con.close()
    return path


@pytest.fixture
def builds(monkeypatch):
    """The copies built (by name), counted across every engine."""
    built: list[str] = []
    original = Engine._build_copy

    def counted(self, table, made):
        built.append(table.name)
        return original(self, table, made)

    monkeypatch.setattr(Engine, "_build_copy", counted)
    return built


def _copy(db) -> list[tuple]:
    """The copy's rows (padding included), in a fixed order."""
    return sorted(db._engine._connection.execute(f'SELECT * FROM dp_bounding.main."{COPY}"').fetchall(),
                  key=repr)


def _answer(path, **options) -> tuple[list[tuple], list[tuple]]:
    """The copy and its row-count table, as a new connection holds them once they are built."""
    with dpsql.connect(str(path), policy=POLICY, eager_bounding=True, **options) as db:
        return _copy(db), db._engine._connection.execute(
            f'SELECT * FROM dp_bounding.main."dp_raw_rows_{COPY}" ORDER BY dp_unit').fetchall()


def test_a_later_connection_reads_the_stored_copy_unchanged(database, builds):
    first = _answer(database, persist_copies=True)
    assert builds == [COPY]
    second = _answer(database, persist_copies=True)
    assert builds == [COPY]  # not rebuilt
    assert second == first
    assert _answer(database) == first  # the copy an in-memory build makes, row for row


def _edit(path, sql: str) -> None:
    con = duckdb.connect(str(path))
    con.execute(sql)
    con.close()


@pytest.mark.parametrize("edit", [
    # -0.0 to 0.0: only the sign bit (DuckDB's UPDATE keeps a -0.0 it takes for equal, so replace the row)
    "DELETE FROM t WHERE uid = 101; INSERT INTO t VALUES (101, CAST('0.0' AS DOUBLE), 'y')",
    "UPDATE t SET s = 'Y' WHERE uid = 101",  # one byte, which a NOCASE comparison would not see
    "INSERT INTO t VALUES (100, 1.0, 'x')",  # a duplicate row: a multiset change
    "DELETE FROM t WHERE uid = 101",
])
def test_a_change_to_the_data_rebuilds_the_copy(database, builds, edit):
    _answer(database, persist_copies=True)
    _edit(database, edit)
    after = _answer(database, persist_copies=True)
    assert builds == [COPY, COPY]
    assert after == _answer(database)  # what a fresh build makes of the edited data


HASH_TWINS = [
    # pairs DuckDB's hash() takes for equal (an attacker's review): a HUGEINT's halves are XORed,
    # a string's 8-byte blocks can be solved for, NULL hashes to a constant with a BIGINT twin
    ("HUGEINT", "0", "18446744073709551617"),
    ("VARCHAR", "'userAAAA12345678'", "'userAAAB1234567c'"),
    ("BIGINT", "NULL", "-2930909409056394622"),
]


@pytest.mark.parametrize("type_name, before, after", HASH_TWINS)
def test_an_edit_duckdb_hash_cannot_see_still_rebuilds_the_copy(tmp_path, builds, type_name, before, after):
    con = duckdb.connect()
    assert con.execute(f"SELECT hash(CAST({before} AS {type_name})) = hash(CAST({after} AS {type_name}))"
                       ).fetchall() == [(True,)]  # the twins this test is about
    path = tmp_path / "twins.duckdb"
    con = duckdb.connect(str(path))
    con.execute(f"CREATE TABLE t AS SELECT i AS uid, CAST({before} AS {type_name}) AS v FROM range(20) r(i)")
    con.close()
    policy = "BUDGET EPSILON 100; PRIVATE TABLE t (PRIVACY UNIT uid, MAX ROWS PER UNIT 1);"

    def stored_rows():
        with dpsql.connect(str(path), policy=policy, eager_bounding=True, persist_copies=True) as db:
            copy = next(name for name in db._engine._bounded)
            return db._engine._connection.execute(
                f'SELECT COUNT(*) FILTER (WHERE v IS NOT DISTINCT FROM CAST({after} AS {type_name})) '
                f'FROM dp_bounding.main."{copy}" WHERE NOT dp_pad').fetchall()[0][0]
    assert stored_rows() == 0
    _edit(path, f"UPDATE t SET v = CAST({after} AS {type_name}) WHERE uid < 5")
    assert stored_rows() == 5  # rebuilt: the stored copy of the old rows was not read
    assert len(builds) == 2


def test_a_change_beyond_the_string_limit_needs_no_rebuild(database, builds):
    """The fingerprint reads what the copy reads: strings cut to MAX STRING LENGTH."""
    _edit(database, "UPDATE t SET s = 'abcdef' WHERE uid = 100")
    _answer(database, persist_copies=True)
    _edit(database, "UPDATE t SET s = 'abcdeX' WHERE uid = 100")
    _answer(database, persist_copies=True)
    assert builds == [COPY]


@pytest.mark.parametrize("column, forged", [("salt", "another salt"), ("recipe", "an older dpsql")])
def test_a_copy_made_under_another_salt_or_recipe_is_never_read(database, builds, column, forged):
    _answer(database, persist_copies=True)
    store = duckdb.connect(str(database) + ".ledger.copies/copies.duckdb")
    store.execute(f"UPDATE dp_persisted SET {column} = ?", [forged])
    store.execute(f'DELETE FROM "{COPY}" WHERE NOT dp_pad')  # what a stale read would show: nothing
    store.close()
    after = _answer(database, persist_copies=True)
    assert builds == [COPY, COPY]
    assert after == _answer(database)


def test_the_copies_are_the_curators_alone(database):
    directory = database.parent / "t.duckdb.ledger.copies"
    directory.mkdir(mode=0o700)
    (directory / "left").write_text("")
    os.chmod(directory / "left", 0o644)  # unreachable for others in a 0700 directory: made 0600
    _answer(database, persist_copies=True)
    assert stat.S_IMODE(directory.stat().st_mode) == 0o700
    files = list(directory.iterdir())
    assert files and all(stat.S_IMODE(f.stat().st_mode) == 0o600 for f in files)
    os.chmod(directory, 0o755)  # a directory others can reach is refused (tests/test_secret_files.py)
    with pytest.raises(DPError, match="chmod 700"):
        _answer(database, persist_copies=True)
    os.chmod(directory, 0o700)
    (directory / "planted").symlink_to(database)
    with pytest.raises(InvalidParameter, match="not a file of this user's own"):
        _answer(database, persist_copies=True)


def test_persisted_copies_keep_the_database_walled_in(database):
    with dpsql.connect(str(database), policy=POLICY, persist_copies=True) as db:
        con = db._engine._connection
        assert con.execute("SELECT current_setting('enable_external_access'), "
                           "current_setting('lock_configuration')").fetchall() == [(False, True)]
        with pytest.raises(duckdb.Error, match="disabled"):
            con.execute(f"ATTACH '{database.parent}/other.duckdb' AS other")
        with pytest.raises(duckdb.Error, match="disabled"):
            con.execute(f"COPY (SELECT 1) TO '{database.parent}/t.duckdb.ledger.copies/out.csv'")


def test_persisting_needs_a_ledger_file(database):
    import pandas as pd

    frame = pd.DataFrame({"uid": [1], "x": [1.0], "s": ["a"]})
    with pytest.raises(InvalidParameter, match="ledger file"):
        dpsql.connect({"t": frame}, policy=POLICY, persist_copies=True)
    with pytest.raises(InvalidParameter, match="ledger file"):
        dpsql.connect(str(database), policy=POLICY, ledger=":memory:", persist_copies=True)


def test_a_second_process_holding_the_copies_leaves_this_one_in_memory(database):
    """DuckDB locks the copies' file per process: a second user builds in memory, and says so."""
    import subprocess
    import sys
    import textwrap

    _answer(database, persist_copies=True)
    holder = subprocess.Popen([sys.executable, "-c", textwrap.dedent(f"""
        import duckdb, sys, time
        con = duckdb.connect({str(database) + '.ledger.copies/copies.duckdb'!r})
        print('held', flush=True)
        sys.stdin.read()
    """)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.warns(UserWarning, match="in use by another process"):
            with dpsql.connect(str(database), policy=POLICY, persist_copies=True) as db:
                assert db._engine.copies is None
                db.sql("SELECT COUNT(*) AS n FROM t", epsilon=0.1)
    finally:
        holder.communicate("")


def test_a_failed_open_is_a_dperror(tmp_path):
    with pytest.raises(DPError):
        dpsql.connect(str(tmp_path / "missing.duckdb"), policy=POLICY, persist_copies=True)


def test_connections_in_one_process_share_the_stored_copies(database, builds):
    """As the server's reopen after `dpsql init --replace` does: the copies are the instance's."""
    with dpsql.connect(str(database), policy=POLICY, persist_copies=True, eager_bounding=True) as first:
        with dpsql.connect(str(database), policy=POLICY, persist_copies=True, eager_bounding=True) as second:
            assert second._engine.copies == first._engine.copies
            second.sql("SELECT COUNT(*) AS n FROM t", epsilon=0.1)
    assert builds == [COPY]


def test_the_server_passes_the_option_on(database, tmp_path, monkeypatch):
    from dpsql.server import commands

    seen = {}
    monkeypatch.setattr("dpsql.server.serve", lambda *args, **options: seen.update(options))
    parser = __import__("argparse").ArgumentParser()
    commands.serve_arguments(parser)
    commands.serve(parser.parse_args([str(database), "--users", str(tmp_path / "users"), "--persist-copies"]))
    assert seen["persist_copies"] is True


def test_a_build_shows_its_time_only_where_asked(database, capsys):
    """Progress is the curator's: on standard error, for copy builds, never on a pipe by default."""
    import contextlib

    from dpsql.curator.progress import elapsed_progress

    with dpsql.connect(str(database), policy=POLICY) as quiet:  # pytest's stderr is no terminal
        quiet.sql("SELECT COUNT(*) AS n FROM t", epsilon=0.1)
    assert capsys.readouterr().err == ""
    labels: list[str] = []

    @contextlib.contextmanager
    def recorded(label):
        labels.append(label)
        yield

    with dpsql.connect(str(database), policy=POLICY, progress=True) as db:
        assert db._engine.progress is elapsed_progress
        db._engine.progress = recorded
        db.sql("SELECT COUNT(*) AS n FROM t", epsilon=0.2)
        db.sql("SELECT COUNT(*) AS n FROM t", epsilon=0.3)  # a query alone shows nothing
    assert labels == ["bounding t"]
