"""pgcli, the client many psql users prefer, against ``dpsql serve`` (issue 37, item 7): it signs
in with a password, starts (its startup queries are answered, as ``SHOW TIME ZONE`` was not), its
completer's catalog look-ups fill in table and column names, and it answers a DP query (with the
cost and intervals notices) and a public one.

pgcli runs in a pseudo-terminal under pexpect; every wait is on its output, never a sleep.
"""

from __future__ import annotations

import io
import os
import re
import sys
from pathlib import Path

import pytest
from served import serve_shop

from dpsql.demo import SHOP_POLICY

pexpect = pytest.importorskip("pexpect")
pytest.importorskip("pgcli")  # the test extra installs it

PGCLI = Path(sys.executable).with_name("pgcli")
PASSWORD = "alice-secret"
PROMPT = "dpsql-shop>"  # pgcli draws its trailing space apart
SETTINGS = """[main]
enable_pager = False
keyring = False
less_chatty = True
multi_line = False
log_file = {home}/pgcli.log
history_file = {home}/history
"""


@pytest.fixture(scope="module")
def server(built, tmp_path_factory):
    server = serve_shop(built, tmp_path_factory.mktemp("pgcli"), SHOP_POLICY, "alice", PASSWORD)
    yield server
    server.stop()
    server.thread.join(10)


@pytest.fixture
def pgcli(server, tmp_path):
    """pgcli signed in as alice: the password typed at its prompt, then its own prompt seen."""
    (tmp_path / "pgclirc").write_text(SETTINGS.format(home=tmp_path))
    environment = {**os.environ, "HOME": str(tmp_path), "XDG_CONFIG_HOME": str(tmp_path), "TERM": "xterm",
                   "LC_ALL": "C.UTF-8", "LANG": "C.UTF-8", "PAGER": "cat"}
    environment.pop("PGPASSWORD", None)
    child = pexpect.spawn(str(PGCLI), ["--pgclirc", str(tmp_path / "pgclirc"), "--prompt", PROMPT, "-W",
                                       "-h", "127.0.0.1", "-p", str(server.port), "-U", "alice", "-d", "shop"],
                          env=environment, encoding="utf-8", timeout=15, dimensions=(50, 200))
    child.logfile_read = transcript = io.StringIO()
    try:
        child.expect("Password for alice")
        child.sendline(PASSWORD)
        child.expect_exact(PROMPT)
        yield child
        child.sendcontrol("d")
        child.expect(pexpect.EOF)
    finally:
        child.close(force=True)
        assert "Traceback" not in transcript.getvalue(), transcript.getvalue()[-3000:]
        assert "Exception" not in transcript.getvalue(), transcript.getvalue()[-3000:]


def completes(child, typed: str, expected: str) -> None:
    """Type ``typed`` and press Tab until pgcli's completer (filled by a background refresh just
    after start) writes ``expected``; then clear the line."""
    child.send(typed)
    for _ in range(15):
        child.send("\t")
        if child.expect([re.escape(expected), pexpect.TIMEOUT], timeout=1) == 0:
            break
    else:
        raise AssertionError(f"pgcli did not complete {typed!r} to {expected!r}")
    child.sendcontrol("u")  # the line, not run


def test_pgcli_starts_completes_names_and_answers(pgcli):
    pgcli.sendline("SELECT store, COUNT(*) AS n FROM visits GROUP BY store ORDER BY store")
    pgcli.expect(r"dpsql: cost epsilon 0\.1")  # the cost notice, then the intervals notice
    pgcli.expect(r"dpsql: 95% intervals")
    pgcli.expect(r"Wicker Park\s*\S*\s*-?\d+")  # the last row, with its count
    pgcli.expect_exact(PROMPT)
    pgcli.sendline("SELECT city FROM stores WHERE store = 'Loop'")
    pgcli.expect(r"dpsql: cost free: public tables only")
    pgcli.expect("Chicago")
    pgcli.expect_exact(PROMPT)
    completes(pgcli, "SELECT * FROM vis", "visits")
    completes(pgcli, "SELECT * FROM stores WHERE ci", "city")
