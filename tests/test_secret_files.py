"""The curator's secret files (invariant 21, ``dpsql.budget.private_files``): the ledger and
SQLite's files beside it, the users file and its decoy key, the persisted copies are made
owner-only whatever the umask, and refused, before anything is read, when another user could
read or change them."""

from __future__ import annotations

import os
import sqlite3
import stat
from contextlib import contextmanager
from fractions import Fraction
from pathlib import Path

import duckdb
import pytest

import dpsql
from dpsql.budget.accounting import Spend
from dpsql.budget.ledger import LEDGER_SIDE_FILES, Ledger
from dpsql.budget.private_files import refuse_exposed
from dpsql.errors import InsecureFile
from dpsql.server import open_server
from dpsql.server.users import UserNames, add_user, decoy_key, load_users, save_users
from tests.cli_run import run

POLICY = "BUDGET EPSILON 10; PRIVATE TABLE t (PRIVACY UNIT uid, MAX ROWS PER UNIT 2, x BOUNDS 0 TO 10);"
UMASKS = (0o022, 0o000)
TENTH, ONE = Spend(Fraction(1, 10), Fraction(0)), Spend(Fraction(1), Fraction(0))


@contextmanager
def umask(mask: int):
    """The process umask set to ``mask`` for the block, and restored after it."""
    before = os.umask(mask)
    try:
        yield
    finally:
        os.umask(before)


def mode(path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


@pytest.fixture
def database(tmp_path) -> Path:
    path = tmp_path / "t.duckdb"
    with duckdb.connect(str(path)) as con:
        con.execute("CREATE TABLE t AS SELECT i % 7 AS uid, i % 11 AS x FROM range(50) r(i)")
    return path


@pytest.mark.parametrize("mask", UMASKS, ids=oct)
def test_a_new_ledger_and_its_sqlite_files_are_owner_only(tmp_path, mask):
    path = tmp_path / "x.ledger"
    with umask(mask), Ledger.open(path) as ledger:
        ledger.charge(TENTH, ONE, sql="SELECT 1", options={})
        ledger.record_answer(1, "[]")
        ledger.salt()
        # the WAL-mode files exist while the ledger is open: SQLite made them, under this umask
        sides = [Path(f"{path}{side}") for side in LEDGER_SIDE_FILES if Path(f"{path}{side}").exists()]
        assert {p.name for p in sides} >= {"x.ledger-wal", "x.ledger-shm"}
        assert {p.name: mode(p) for p in [path, *sides]} == {p.name: 0o600 for p in [path, *sides]}


@pytest.mark.parametrize("mask", UMASKS, ids=oct)
def test_connect_makes_its_default_ledger_owner_only(database, mask):
    with umask(mask), dpsql.connect(str(database), policy=POLICY) as db:
        db.sql("SELECT COUNT(*) AS n FROM t", epsilon=0.5)
        ledger = Path(f"{database}.ledger")
        assert mode(ledger) == 0o600
        assert mode(f"{ledger}-wal") == 0o600 and mode(f"{ledger}-shm") == 0o600


@pytest.mark.parametrize("mask", UMASKS, ids=oct)
def test_cli_init_makes_the_ledger_owner_only(database, tmp_path, capsys, mask):
    policy = tmp_path / "t.policy"
    policy.write_text(POLICY)
    with umask(mask):
        code, _, err = run(capsys, "init", str(database), "--policy", str(policy))
    assert code == 0, err
    assert mode(f"{database}.ledger") == 0o600


def _loose_ledger(path: Path, loose: int) -> None:
    """A ledger with one charge, then its mode loosened."""
    with Ledger.open(path) as ledger:
        ledger.charge(TENTH, ONE, sql="SELECT 1", options={})
    os.chmod(path, loose)


@pytest.mark.parametrize("loose", [0o644, 0o640, 0o604, 0o620, 0o660, 0o666], ids=oct)
def test_a_ledger_others_can_reach_is_refused_with_the_chmod_that_fixes_it(tmp_path, loose):
    path = tmp_path / "x.ledger"
    _loose_ledger(path, loose)
    with pytest.raises(InsecureFile, match=rf"the ledger {path} has mode 0{loose:o}: other users can .*"
                                           rf"chmod 600 {path}"):
        Ledger.open(path)
    os.chmod(path, 0o600)  # the fix the message gives
    with Ledger.open(path) as ledger:
        assert ledger.spent() == TENTH


def test_a_loose_ledger_is_refused_before_sqlite_reads_it(tmp_path, monkeypatch):
    path = tmp_path / "x.ledger"
    _loose_ledger(path, 0o644)
    before = (path.read_bytes(), path.stat().st_atime_ns, path.stat().st_mtime_ns)
    opened = []
    monkeypatch.setattr(sqlite3, "connect", lambda *a, **k: opened.append(a))
    with pytest.raises(InsecureFile):
        Ledger.open(path)
    assert opened == []  # SQLite never opened it: no recovery, no read, no side file made
    assert not any(Path(f"{path}{side}").exists() for side in LEDGER_SIDE_FILES)
    assert (path.read_bytes(), path.stat().st_mtime_ns) == (before[0], before[2])


def test_a_loose_side_file_is_refused_too(tmp_path):
    path = tmp_path / "x.ledger"
    _loose_ledger(path, 0o600)
    wal = Path(f"{path}-wal")
    wal.write_bytes(b"")
    os.chmod(wal, 0o644)
    with pytest.raises(InsecureFile, match=rf"SQLite file {wal} has mode 0644.*chmod 600 {wal}"):
        Ledger.open(path)


def test_a_ledger_of_another_user_is_refused(tmp_path, monkeypatch):
    path = tmp_path / "x.ledger"
    _loose_ledger(path, 0o600)
    monkeypatch.setattr(os, "geteuid", lambda: os.stat(path).st_uid + 1)  # as if another user ran dpsql
    with pytest.raises(InsecureFile, match=rf"the ledger {path} belongs to another user.*chown"):
        Ledger.open(path)


def test_every_surface_refuses_a_loose_ledger(database, tmp_path, capsys):
    ledger = Path(f"{database}.ledger")
    _loose_ledger(ledger, 0o644)
    with pytest.raises(InsecureFile, match="chmod 600"):
        dpsql.connect(str(database), policy=POLICY)
    with pytest.raises(InsecureFile, match="chmod 600"):
        dpsql.connect(str(database), policy=POLICY, ledger=ledger)
    policy = tmp_path / "t.policy"
    policy.write_text(POLICY)
    for argv in (("init", str(database), "--policy", str(policy)),
                 ("query", str(database), "SELECT COUNT(*) FROM t", "--policy", str(policy)),
                 ("budget", str(database), "--policy", str(policy))):
        code, _, err = run(capsys, *argv)
        assert code != 0 and "has mode 0644" in err and f"chmod 600 {ledger}" in err, (argv, err)


@pytest.mark.parametrize("mask", UMASKS, ids=oct)
def test_users_file_and_decoy_key_are_owner_only(tmp_path, mask):
    users = tmp_path / "users"
    with umask(mask):
        add_user(users, "ada", "long enough")
        save_users(users, load_users(users))
        decoy_key(users)
    assert mode(users) == 0o600 and mode(f"{users}.decoy-key") == 0o600


def test_a_loose_users_file_is_refused_before_it_is_read(tmp_path, monkeypatch):
    users = tmp_path / "users"
    add_user(users, "ada", "long enough")
    os.chmod(users, 0o644)
    read = []
    monkeypatch.setattr(Path, "read_text", lambda self, *a, **k: read.append(self))
    for attempt in (lambda: load_users(users), lambda: add_user(users, "bob", "long enough"),
                    lambda: UserNames(users)()):
        with pytest.raises(InsecureFile, match=rf"the users file {users} has mode 0644.*chmod 600 {users}"):
            attempt()
    assert read == []


def test_the_users_file_is_checked_again_after_a_chmod(tmp_path):
    users = tmp_path / "users"
    add_user(users, "ada", "long enough")
    names = UserNames(users)
    assert names() == {"ada"}
    os.chmod(users, 0o640)  # same content, size and modification time
    with pytest.raises(InsecureFile):
        names()


def test_a_loose_decoy_key_is_refused(tmp_path):
    users = tmp_path / "users"
    decoy_key(users)
    os.chmod(f"{users}.decoy-key", 0o644)
    with pytest.raises(InsecureFile, match=r"decoy key .* has mode 0644"):
        decoy_key(users)


def test_a_server_refuses_a_loose_users_file_at_start(database, tmp_path):
    users = tmp_path / "users"
    add_user(users, "ada", "long enough")
    os.chmod(users, 0o604)
    with pytest.raises(InsecureFile, match=rf"chmod 600 {users}"):
        open_server(database, users=users, policy=POLICY, port=0)


@pytest.mark.parametrize("mask", UMASKS, ids=oct)
def test_persisted_copies_are_owner_only(database, mask):
    with umask(mask), dpsql.connect(str(database), policy=POLICY, persist_copies=True) as db:
        db.sql("SELECT COUNT(*) AS n FROM t", epsilon=0.5)
    directory = Path(f"{database}.ledger.copies")
    assert mode(directory) == 0o700
    files = list(directory.iterdir())
    assert files and {f.name: mode(f) for f in files} == {f.name: 0o600 for f in files}


@pytest.mark.parametrize("loose", [0o755, 0o750, 0o701, 0o770], ids=oct)
def test_a_copies_directory_others_can_reach_is_refused(database, loose):
    directory = Path(f"{database}.ledger.copies")
    directory.mkdir()
    os.chmod(directory, loose)
    with pytest.raises(InsecureFile, match=rf"copies directory {directory} has mode 0{loose:o}.*"
                                           rf"chmod 700 {directory}"):
        dpsql.connect(str(database), policy=POLICY, persist_copies=True)
    assert list(directory.iterdir()) == [] and mode(directory) == loose  # nothing made or changed there


def test_the_check_reads_no_content_and_names_what_others_can_do(tmp_path):
    path = tmp_path / "secret"
    assert refuse_exposed(path, "the secret") is False  # nothing there: nothing to refuse
    path.write_bytes(b"")
    os.chmod(path, 0o000)  # not even its owner may read it: the check only looks at its status
    assert refuse_exposed(path, "the secret") is True
    os.chmod(path, 0o622)
    with pytest.raises(InsecureFile, match="other users can change it"):
        refuse_exposed(path, "the secret")
