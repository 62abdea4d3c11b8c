"""Synthetic tables on every surface (issue 39, item 3): the owner queries theirs, free, through
``dpsql query``, the shell and psql at ``dpsql serve``; another analyst at the same server meets
the refusal of a table nobody made. The tables are kept through a store over the server's ledger
file, as the synthesizer in another process would: the server finds them on disk."""

from __future__ import annotations

import os
import shutil
import subprocess

import pandas as pd
import pytest

import dpsql
from dpsql.demo import SHOP_POLICY
from dpsql.mechanisms.synthetic_release import Measured, SyntheticRelease
from dpsql.query.synthetic_tables import SyntheticTables
from dpsql.server import start_in_thread
from dpsql.server.users import add_user
from dpsql.shell.remote import connect_remote
from dpsql.shell.session import handle_input
from dpsql.shell.state import new_state
from tests.cli_run import run

PSQL = shutil.which("psql")
FAKE = pd.DataFrame({"store": ["a", "b", "b", "c"], "age": ["[18, 40)", "[40, 90]", "[18, 40)", "[18, 40)"]})
COUNTED = "SELECT store, COUNT(*) AS n FROM fake GROUP BY store ORDER BY store"


def release(analyst: str | None) -> SyntheticRelease:
    return SyntheticRelease(name="fake", source="visits", method="mst", table=FAKE, rows=4, epsilon=1.0, delta=1e-6,
                            rho=0.03, measured=(Measured(("store",), 0.01, 7.1), Measured(("store", "age"), 0.02, 5.0)),
                            bins={"age": ("[18, 40)", "[40, 90]")}, analyst=analyst,
                            created="2026-12-08T01:00:00+00:00")


@pytest.fixture
def shop(built, tmp_path):
    """A copy of the shop database, its policy file, and alice's synthetic table kept with its ledger."""
    database = tmp_path / "shop.duckdb"
    database.write_bytes(built.read_bytes())
    policy = tmp_path / "shop.policy"
    policy.write_text(SHOP_POLICY)
    dpsql.connect(str(database), policy=str(policy)).close()  # its ledger, as the synthesizer's charge made it
    SyntheticTables(f"{database}.ledger", ["visits", "users", "stores"]).keep(release("alice"))
    return database, policy


def test_dpsql_query_and_explain(shop, capsys):
    database, policy = shop
    code, out, err = run(capsys, "query", str(database), COUNTED, "--policy", str(policy), "--analyst", "alice")
    assert code == 0 and "│ b     │ 2 │" in out, out + err
    assert "synthetic table fake" in out + err and "exact: your synthetic tables only, no cost" in err
    code, out, err = run(capsys, "explain", str(database), COUNTED, "--policy", str(policy), "--analyst", "alice")
    assert code == 0 and "cost: free" in out and "(store, age): rho 0.02, sigma 5" in out, out + err
    code, _, err = run(capsys, "query", str(database), COUNTED, "--policy", str(policy), "--analyst", "bob")
    assert code == 2 and "unknown table fake" in err


def test_the_shell_answers_and_lists_them(shop):
    database, policy = shop
    with dpsql.connect(str(database), policy=str(policy), analyst="alice") as db:
        state = new_state(db, width=100, color=False)
        output = handle_input(state, COUNTED + ";")
        assert "│ b     │ 2 │" in output and "note: answered exactly from your synthetic table fake" in output
        assert "exact: your synthetic tables only, no cost" in output
        assert float(db.budget.spent.epsilon) == 0
        tables = handle_input(state, ".tables")
        assert "fake" in tables and "yours: MST over visits" in tables
    with dpsql.connect(str(database), policy=str(policy), analyst="bob") as db:
        assert "fake" not in handle_input(new_state(db, width=100, color=False), ".tables")


@pytest.mark.skipif(PSQL is None, reason="psql is not installed")
def test_psql_at_the_server(shop, tmp_path):
    database, policy = shop
    for user in ("alice", "bob"):
        add_user(tmp_path / "users", user, f"{user}-secret")
    server = start_in_thread(database, users=tmp_path / "users", policy=policy, port=0)
    try:
        def psql(user: str, command: str) -> subprocess.CompletedProcess:
            environment = {**os.environ, "PGPASSWORD": f"{user}-secret", "PGCONNECT_TIMEOUT": "5"}
            return subprocess.run([PSQL, "-h", "127.0.0.1", "-p", str(server.port), "-U", user, "-d", "shop", "-X",
                                   "-A", "-t", "-c", command], env=environment, capture_output=True, text=True,
                                  timeout=60)

        answered = psql("alice", COUNTED)
        assert answered.stdout.splitlines() == ["a|1", "b|2", "c|1"], answered.stdout + answered.stderr
        assert "synthetic table fake" in answered.stderr and "free: your synthetic tables only" in answered.stderr
        listed = psql("alice", "SELECT name, method FROM synthetic_tables()")
        assert listed.stdout.splitlines() == ["fake|mst"], listed.stderr
        explained = psql("alice", "EXPLAIN " + COUNTED)
        assert "cost: free" in explained.stdout, explained.stdout + explained.stderr
        assert "(store, age): rho 0.02" in explained.stdout and "EXPLAIN VERBOSE adds the SQL" in explained.stdout
        assert "GROUP BY" in psql("alice", "EXPLAIN VERBOSE " + COUNTED).stdout
        refused = psql("bob", COUNTED)
        nobody = psql("bob", COUNTED.replace("fake", "fakf"))
        assert "unknown table fake" in refused.stderr
        assert refused.stderr == nobody.stderr.replace("fakf", "fake")
        assert psql("bob", "SELECT name FROM synthetic_tables()").stdout.strip() == ""
        mixed = psql("alice", "SELECT COUNT(*) FROM fake JOIN visits USING (store)")
        assert "query them separately" in mixed.stderr
        psycopg = pytest.importorskip("psycopg")
        with psycopg.connect(host="127.0.0.1", port=server.port, dbname="shop", user="alice", password="alice-secret",
                             connect_timeout=5, autocommit=True) as connection:  # the extended protocol
            assert connection.execute(COUNTED).fetchall() == [("a", 1), ("b", 2), ("c", 1)]
            prepared = connection.execute("SELECT COUNT(*) FROM fake WHERE store = 'b'", prepare=True).fetchall()
            assert prepared == [(2,)]
            frame = pd.read_sql("SELECT * FROM fake ORDER BY store, age", connection)
            assert frame.equals(FAKE.sort_values(["store", "age"]).reset_index(drop=True))
        remote = connect_remote(f"postgresql://alice:alice-secret@127.0.0.1:{server.port}/shop")
        try:  # `dpsql shell postgresql://...`: the same answer, and .tables lists it
            state = new_state(remote, width=100, color=False)
            output = handle_input(state, COUNTED + ";")
            assert "│ b     │ 2 │" in output and "exact: your synthetic tables only, no cost" in output
            assert "yours: MST over visits" in handle_input(state, ".tables")
        finally:
            remote.close()
    finally:
        server.stop()
        server.thread.join(10)
