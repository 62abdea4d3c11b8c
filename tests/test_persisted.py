"""Persisted bounded copies (``dpsql.backends.duckdb.persisted``): reused only when they are exactly
the copy a new build would make, rebuilt when the data, the recipe or the salt changed, and
kept where only the curator can read them."""

from __future__ import annotations

import os
import stat

import duckdb
import pytest

import dpsql
from dpsql.backends.duckdb import Engine, persisted
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


@pytest.fixture(params=["rows", "file"])
def fingerprint(request, monkeypatch):
    """Each test under both fingerprints: the keyed row fingerprint, and the file digest (which these
    small tables in a file of DuckDB's minimum size would not get: ``FILE_BYTES_PER_ROW`` raised)."""
    if request.param == "file":
        monkeypatch.setattr(persisted, "FILE_BYTES_PER_ROW", 10**12)
    return request.param


def _stored_fingerprints(path) -> list[str]:
    store = duckdb.connect(str(path) + ".ledger.copies/copies.duckdb", read_only=True)
    try:
        return [row[0] for row in store.execute("SELECT fingerprint FROM dp_persisted").fetchall()]
    finally:
        store.close()


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


def test_a_later_connection_reads_the_stored_copy_unchanged(database, builds, fingerprint):
    first = _answer(database, persist_copies=True)
    assert builds == [COPY]
    assert [f.startswith("file:") for f in _stored_fingerprints(database)] == [fingerprint == "file"]
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
    "INSERT INTO t VALUES (102, 2.0, 'z')",  # a new row
    "DELETE FROM t WHERE uid = 101",
    "UPDATE t SET x = 2.5 WHERE uid = 100",  # a changed value
])
def test_a_change_to_the_data_rebuilds_the_copy(database, builds, fingerprint, edit):
    before = _answer(database, persist_copies=True)
    _edit(database, edit)
    after = _answer(database, persist_copies=True)
    assert builds == [COPY, COPY]
    assert after == _answer(database)  # what a fresh build makes of the edited data
    assert repr(after) != repr(before)  # repr: -0.0 == 0.0 in Python


def test_a_reordered_table_reads_the_copy_a_fresh_build_makes(database, builds, fingerprint):
    """The same rows stored in another order: the row fingerprint is the same (order-independent), the
    file digest is not (a rebuild); either way the copy read is the fresh build's, which is the same."""
    before = _answer(database, persist_copies=True)
    _edit(database, "CREATE OR REPLACE TABLE t AS SELECT * FROM t ORDER BY hash(s) DESC")
    after = _answer(database, persist_copies=True)
    assert builds == ([COPY] if fingerprint == "rows" else [COPY, COPY])
    assert after == before == _answer(database)


@pytest.mark.parametrize("policy, copy", [
    (POLICY.replace("MAX ROWS PER UNIT 2", "MAX ROWS PER UNIT 3"), "dp_bounded_t__uid__3__str5"),
    (POLICY.replace("MAX STRING LENGTH 5", "MAX STRING LENGTH 4"), "dp_bounded_t__uid__2__str4"),
])
def test_a_changed_policy_builds_its_own_copy(database, builds, fingerprint, policy, copy):
    _answer(database, persist_copies=True)
    with dpsql.connect(str(database), policy=policy, eager_bounding=True, persist_copies=True) as db:
        stored = db._engine._connection.execute(f'SELECT * FROM dp_bounding.main."{copy}"').fetchall()
    with dpsql.connect(str(database), policy=policy, eager_bounding=True) as db:
        fresh = db._engine._connection.execute(f'SELECT * FROM dp_bounding.main."{copy}"').fetchall()
    assert builds == [COPY, copy, copy]
    assert sorted(stored, key=repr) == sorted(fresh, key=repr)


def test_what_the_file_does_not_hold_keeps_the_row_fingerprint(tmp_path, monkeypatch):
    """A view (its rows may come from anywhere it reads) or a generated column (its expression may
    be ``random()``) is not a function of the file's bytes; nor is a file moved in after DuckDB opened
    another: each keeps the row fingerprint."""
    monkeypatch.setattr(persisted, "FILE_BYTES_PER_ROW", 10**12)
    path = tmp_path / "v.duckdb"
    con = duckdb.connect(str(path))
    con.execute("CREATE TABLE base (uid INTEGER, x DOUBLE)")
    con.execute("INSERT INTO base SELECT i % 3, i FROM range(10) r(i)")
    con.execute("CREATE VIEW v AS SELECT * FROM base")
    con.execute("CREATE TABLE g (uid INTEGER, x DOUBLE GENERATED ALWAYS AS (uid * 2.0) VIRTUAL)")
    con.execute("INSERT INTO g (uid) SELECT i % 3 FROM range(10) r(i)")
    con.close()
    for table, kind in (("v", "rows"), ("g", "rows"), ("base", "file")):
        policy = f"BUDGET EPSILON 100; PRIVATE TABLE {table} (PRIVACY UNIT uid, MAX ROWS PER UNIT 2);"
        with dpsql.connect(str(path), policy=policy, eager_bounding=True, persist_copies=True):
            pass
        assert [f.startswith("file:") for f in _stored_fingerprints(path)] == [kind == "file"], table
        (path.parent / "v.duckdb.ledger.copies" / "copies.duckdb").unlink()
    policy = "BUDGET EPSILON 100; PRIVATE TABLE base (PRIVACY UNIT uid, MAX ROWS PER UNIT 2);"
    with dpsql.connect(str(path), policy=policy, persist_copies=True) as db:
        os.rename(path, tmp_path / "moved.duckdb")  # DuckDB keeps reading the file it opened
        (tmp_path / "v.duckdb").write_bytes((tmp_path / "moved.duckdb").read_bytes())
        db.sql("SELECT COUNT(*) AS n FROM base", epsilon=0.1)
    assert [f.startswith("file:") for f in _stored_fingerprints(path)] == [False]


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
    """The row fingerprint reads what the copy reads: strings cut to MAX STRING LENGTH (the file
    digest, which reads the file, rebuilds then)."""
    _edit(database, "UPDATE t SET s = 'abcdef' WHERE uid = 100")
    _answer(database, persist_copies=True)
    _edit(database, "UPDATE t SET s = 'abcdeX' WHERE uid = 100")
    _answer(database, persist_copies=True)
    assert builds == [COPY]


@pytest.mark.parametrize("column, forged", [("salt", "another salt"), ("recipe", "an older dpsql")])
def test_a_copy_made_under_another_salt_or_recipe_is_never_read(database, builds, fingerprint, column, forged):
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
