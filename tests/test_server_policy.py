"""The server follows the stored policy (issue 23, item 6): after ``dpsql init --replace`` a
running server answers under the new policy and budget, in open sessions and new ones, and an
analyst never reads the server's paths — with the real psql, whose ``\\!`` runs the curator's
command between two statements of one session.
"""

from __future__ import annotations

import logging
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from dpsql.demo import SHOP_POLICY
from dpsql.server import start_in_thread
from dpsql.server.users import add_user

PSQL = shutil.which("psql")
pytestmark = pytest.mark.skipif(PSQL is None, reason="psql is not installed")
PASSWORD = "alice-secret"
BIGGER = SHOP_POLICY.replace("BUDGET EPSILON 3.0", "BUDGET EPSILON 100")
QUERY = "SELECT COUNT(*) AS n FROM visits"


@pytest.fixture
def served(built, tmp_path):
    """A copy of the shop database with its policy stored (``dpsql init``), served as
    ``dpsql serve`` serves it: no policy given, so the stored one rules."""
    database = tmp_path / "shop.duckdb"
    database.write_bytes(built.read_bytes())
    (tmp_path / "shop.policy").write_text(SHOP_POLICY)
    (tmp_path / "bigger.policy").write_text(BIGGER)
    assert curator("init", database, "--policy", tmp_path / "shop.policy").returncode == 0
    add_user(tmp_path / "users", "alice", PASSWORD)
    server = start_in_thread(database, users=tmp_path / "users", port=0)
    yield server, database
    server.stop()
    server.thread.join(10)


def curator(*arguments) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "dpsql", *map(str, arguments)], capture_output=True, text=True,
                          timeout=60)


def curator_command(*arguments) -> str:
    """The curator's command as psql's ``\\!`` runs it."""
    return "\\! " + " ".join(shlex.quote(str(a)) for a in (sys.executable, "-m", "dpsql", *arguments))


def psql(server, *commands: str) -> subprocess.CompletedProcess:
    """One psql session running ``commands`` in order (``-c`` each)."""
    environment = {**os.environ, "PGPASSWORD": PASSWORD, "PGCONNECT_TIMEOUT": "5"}
    arguments = [PSQL, "-h", "127.0.0.1", "-p", str(server.port), "-U", "alice", "-d", "shop", "-X", "-A", "-t",
                 "-v", "ON_ERROR_STOP=0"]
    for command in commands:
        arguments += ["-c", command]
    return subprocess.run(arguments, env=environment, capture_output=True, text=True, timeout=120)


def totals(output: str) -> list[str]:
    """The total epsilon of each ``SHOW budget`` in psql's unaligned output."""
    return re.findall(r"^total\|([\d.]+)\|", output, flags=re.M)


def test_an_open_session_and_a_new_one_follow_a_replaced_policy(served):
    server, database = served
    policy = database.parent / "bigger.policy"
    done = psql(server, "SHOW budget", QUERY, curator_command("init", database, "--policy", policy, "--replace"),
                "SHOW budget", QUERY, QUERY + " WHERE age > 30")
    assert done.returncode == 0, done.stderr
    assert "ERROR" not in done.stderr, done.stderr
    assert totals(done.stdout) == ["3.0", "100.0"]
    # Told once, on the first answer under the new policy; both queries answered and charged.
    assert done.stderr.count("the curator has changed this database's policy") == 1
    assert done.stderr.count("NOTICE:  dpsql: cost epsilon 0.1") == 3
    again = psql(server, "SHOW budget", "SHOW policy")  # reconnecting works, with no notice
    assert again.returncode == 0 and "ERROR" not in again.stderr, again.stderr
    assert totals(again.stdout) == ["100.0"] and "BUDGET EPSILON 100" in again.stdout
    assert "changed this database's policy" not in again.stderr


def test_a_policy_the_server_cannot_load_is_refused_without_its_reasons_until_it_loads(served, caplog):
    server, database = served
    moved = database.with_name("elsewhere.duckdb")
    assert curator("init", database, "--policy", database.parent / "bigger.policy", "--replace").returncode == 0
    database.rename(moved)  # the curator's mistake: the database cannot be opened again
    try:
        with caplog.at_level(logging.ERROR, logger="dpsql.server"):
            refused = psql(server, QUERY, "SHOW budget")
    finally:
        moved.rename(database)
    assert refused.stderr.count("ERROR:  the curator changed this database's policy, and the server cannot "
                                "put the new one in force yet; nothing was charged") == 2
    assert "HINT:  ask the curator to check the server's log" in refused.stderr
    assert str(database.parent) not in refused.stderr + refused.stdout and "ledger" not in refused.stderr
    logged = [r.getMessage() for r in caplog.records if "does not open under it" in r.getMessage()]
    assert len(logged) == 1 and str(database) in logged[0]  # the curator's log says why, once
    fixed = psql(server, "SHOW budget", QUERY)
    assert fixed.returncode == 0 and "ERROR" not in fixed.stderr, fixed.stderr
    assert totals(fixed.stdout) == ["100.0"]


def test_a_replace_while_a_query_is_charged_is_refused_without_the_ledger_path(served):
    """The ledger refuses a charge made under a policy replaced after the server's check: the
    analyst reads that nothing was charged and to send it again, not where the ledger is."""
    server, database = served
    shared = server.shared
    original = shared._follow_stored_policy
    shared._follow_stored_policy = lambda: None  # the replace lands between the check and the charge
    try:
        assert curator("init", database, "--policy", database.parent / "bigger.policy", "--replace").returncode == 0
        refused = psql(server, QUERY)
    finally:
        shared._follow_stored_policy = original
    assert "ERROR:  the curator changed this database's policy while your query was being answered; " \
           "nothing was charged" in refused.stderr
    assert "HINT:  send the query again" in refused.stderr
    assert str(Path(database).parent) not in refused.stderr and "ledger" not in refused.stderr
    answered = psql(server, QUERY, "SHOW ledger")
    assert "ERROR" not in answered.stderr, answered.stderr
    assert answered.stdout.count("SELECT COUNT(*)") == 1  # the refused query was not charged


def test_a_ledger_failure_reaches_the_analyst_without_the_ledger_path(shop):
    """A ledger that cannot be written fails the charge with the curator's text, which names
    the file; the analyst reads the same sentence with the server's files left out."""
    import sqlite3

    import dpsql
    from dpsql.budget.ledger import _CHARGING, _ledger_error
    from dpsql.server.answers import SharedDatabase, answer
    from dpsql.server.statements import Statement

    database, policy = shop
    shared = SharedDatabase(dpsql.connect(database, policy))
    ledger = Path(f"{database}.ledger").resolve()
    try:
        def failing(analyst, action, cancel=None):
            raise _ledger_error(str(ledger), _CHARGING, sqlite3.OperationalError("disk I/O error"))

        shared.run = failing
        outcome = answer(Statement("query", sql=QUERY), "alice", shared)
    finally:
        shared.close()
    assert outcome.message == "could not charge the ledger at (a file of the server): disk I/O error; " \
                              "nothing was charged"
    assert str(ledger.parent) not in outcome.message + (outcome.hint or "")


def test_the_catalog_follows_a_replaced_policy_before_any_query(served):
    """psql's ``\\d+`` is a catalog look-up: it reloads too, and shows the new policy's rules."""
    server, database = served
    wider = database.parent / "wider.policy"
    wider.write_text(SHOP_POLICY.replace("amount BOUNDS 0 TO 500", "amount BOUNDS 0 TO 1000"))
    assert "amount BOUNDS 0 TO 500" in SHOP_POLICY
    before = psql(server, "\\d+ visits")
    assert curator("init", database, "--policy", wider, "--replace").returncode == 0
    after = psql(server, "\\d+ visits")
    assert before.returncode == after.returncode == 0 and "ERROR" not in after.stderr, after.stderr
    assert "|clamped to [0, 500]" in before.stdout and "|clamped to [0, 1000]" in after.stdout
