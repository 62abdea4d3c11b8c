"""``dpsql serve`` with real clients: psql and psycopg (and pandas through psycopg) against a
server this module starts on a free loopback port, in a thread; it stops at the end.

Every client call has a timeout, so no test can hang on a server bug.
"""

from __future__ import annotations

import json
import os
import queue
import re
import shutil
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
import warnings
from fractions import Fraction
from pathlib import Path

import pytest

import dpsql
from dpsql.demo import SHOP_POLICY, build_shop_database
from dpsql.server import start_in_thread
from dpsql.server.users import add_user

psycopg = pytest.importorskip("psycopg")

PSQL = shutil.which("psql")
POLICY = SHOP_POLICY.replace("QUERY EPSILON 0.1;", "QUERY EPSILON 0.1;\nBUDGET PER ANALYST EPSILON 0.5;") \
    .replace("BUDGET EPSILON 3.0", "BUDGET EPSILON 10")
PASSWORDS = {name: f"{name}-secret" for name in ("alice", "bob", "carol", "dana", "erin")} | {
    f"analyst{i}": f"password-{i}" for i in range(6)}


@pytest.fixture(scope="module")
def shop(tmp_path_factory):
    directory = tmp_path_factory.mktemp("serve")
    database = directory / "shop.duckdb"
    build_shop_database(database, users=500)
    (directory / "shop.policy").write_text(POLICY)
    for name, password in PASSWORDS.items():
        add_user(directory / "users", name, password)
    return directory


@pytest.fixture(scope="module")
def server(shop):
    """The module's server, with the default 10 s for startup and authentication: a client slowed
    by a loaded machine (a JVM starting under a parallel test run) is not turned away."""
    server = start_in_thread(shop / "shop.duckdb", users=shop / "users", policy=shop / "shop.policy", port=0,
                             max_connections=12)
    yield server
    server.stop()
    server.thread.join(10)


@pytest.fixture
def impatient_server(shop, tmp_path):
    """A server of its own that allows a client only 1 s for startup and authentication."""
    server = start_in_thread(shop / "shop.duckdb", users=shop / "users", policy=shop / "shop.policy", port=0,
                             ledger=tmp_path / "ledger", startup_timeout=1.0, max_connections=12)
    yield server
    server.stop()
    server.thread.join(10)


def connect(server, user="alice", password=None, **options):
    password = PASSWORDS.get(user, "x") if password is None else password
    return psycopg.connect(host="127.0.0.1", port=server.port, dbname="shop", user=user, password=password,
                           connect_timeout=5, autocommit=True, **options)


def notices(connection) -> list[str]:
    seen: list[str] = []
    connection.add_notice_handler(lambda diagnostic: seen.append(diagnostic.message_primary))
    return seen


def cost_notice(seen: list[str]) -> str:
    """The last answer's cost notice (its intervals come in a notice after it)."""
    return next(text for text in reversed(seen) if text.startswith("dpsql: cost"))


def psql(server, *commands, user="alice", password=None):
    environment = {**os.environ, "PGPASSWORD": password or PASSWORDS[user], "PGCONNECT_TIMEOUT": "5"}
    arguments = [PSQL, "-h", "127.0.0.1", "-p", str(server.port), "-U", user, "-d", "shop", "-X",
                 "-v", "ON_ERROR_STOP=0"]
    for command in commands:
        arguments += ["-c", command]
    return subprocess.run(arguments, env=environment, capture_output=True, text=True, timeout=20)


@pytest.mark.skipif(PSQL is None, reason="psql is not installed")
def test_psql_answers_with_the_cost_as_a_notice_and_refuses_with_a_caret(server):
    done = psql(server, "SELECT COUNT(*) AS n FROM visits", "COPY visits TO '/tmp/x'",
                "SELECT nope FROM visits", "SELECT table_name FROM information_schema.tables ORDER BY 1")
    assert done.returncode == 0, done.stderr
    assert "NOTICE:  dpsql: cost epsilon 0.1" in done.stderr and "; limits: at most 10 rows per user_id" in done.stderr
    assert "ERROR:  COPY statements are not accepted" in done.stderr
    assert "ERROR:  unknown column nope\nLINE 1: SELECT nope FROM visits\n               ^" in done.stderr
    assert " stores\n users\n visits\n" in done.stdout  # the policy's tables, not `secrets` or bounded copies


@pytest.mark.skipif(PSQL is None, reason="psql is not installed")
def test_psql_wrong_password_and_unknown_user_are_refused_alike(server):
    wrong = psql(server, "SELECT 1", password="guess")
    unknown = psql(server, "SELECT 1", user="mallory", password="guess")
    assert wrong.returncode == unknown.returncode == 2
    assert 'password authentication failed for user "alice"' in wrong.stderr
    assert wrong.stderr.replace('"alice"', '"mallory"') == unknown.stderr


def test_psycopg_answers_refusals_and_the_session_stays_usable(server):
    with connect(server) as connection:
        seen = notices(connection)
        assert connection.execute("SELECT COUNT(*) AS n FROM visits WHERE age > 30").fetchone()[0] > 0
        assert "cost epsilon 0.1" in cost_notice(seen) and "analyst alice" in cost_notice(seen)
        assert seen[-1].startswith("dpsql: 95% intervals")
        with pytest.raises(psycopg.errors.SyntaxError) as refused:
            connection.execute("SELECT 1; DELETE FROM visits")
        assert refused.value.diag.statement_position == "11"
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            connection.execute("ATTACH '/tmp/other.duckdb' AS other")
        with pytest.raises(psycopg.errors.FeatureNotSupported) as refused:
            connection.execute("SELECT user_id FROM visits")
        assert refused.value.diag.message_hint
        rows = connection.execute("SELECT store, COUNT(*) AS n FROM stores GROUP BY store").fetchall()
        assert len(rows) > 1  # public table: exact and free
        assert connection.execute("SELECT version()").fetchone()[0].startswith("PostgreSQL 16")


def test_extended_protocol_prepared_binary_and_parameters(server):
    with connect(server) as connection:
        cursor = connection.cursor()
        cursor.execute("SELECT plan, COUNT(*) AS n FROM users GROUP BY plan", prepare=True)
        assert {row[0] for row in cursor.fetchall()} <= {"free", "plus", "pro"}
        assert [c.name for c in cursor.description] == ["plan", "n"]
        cursor.execute("SELECT COUNT(*) AS n FROM users", binary=True)
        assert isinstance(cursor.fetchone()[0], int)
        with pytest.raises(psycopg.errors.FeatureNotSupported, match="parameters"):
            cursor.execute("SELECT COUNT(*) FROM users WHERE plan = %s", ("pro",))
        assert cursor.execute("SELECT COUNT(*) AS n FROM users").fetchone()[0] > 0  # a free repeat
        cursor.execute("SELECT column_name FROM information_schema.columns WHERE table_name = %s "
                       "AND ordinal_position > %s ORDER BY 1", ("stores", 0))  # catalog: parameters work
        assert cursor.fetchall() == [("city",), ("size",), ("store",)]
    # libpq's blocking PQprepare and PQdescribePrepared hold the GIL, which would starve this
    # process's server thread: ask from another process.
    script = ("import psycopg, sys; c = psycopg.connect(sys.argv[1]); "
              "c.pgconn.prepare(b'lookup', b'SELECT typname FROM pg_type WHERE typname = $1'); "
              "d = c.pgconn.describe_prepared(b'lookup'); print(d.nparams, d.nfields)")
    url = f"postgresql://alice:{PASSWORDS['alice']}@127.0.0.1:{server.port}/shop"
    described = subprocess.run([sys.executable, "-c", script, url], capture_output=True, text=True, timeout=30)
    assert described.stdout.split() == ["1", "0"], described.stderr  # rows are known once it runs


def test_sqlalchemy_engine_lists_tables_and_reads_into_pandas(server):
    sqlalchemy = pytest.importorskip("sqlalchemy")
    import pandas as pd

    engine = sqlalchemy.create_engine(
        f"postgresql+psycopg://alice:{PASSWORDS['alice']}@127.0.0.1:{server.port}/shop")
    try:
        with engine.connect() as connection:
            assert sqlalchemy.inspect(connection).get_table_names() == ["stores", "users", "visits"]
            frame = pd.read_sql(sqlalchemy.text("SELECT city, COUNT(*) AS n FROM stores GROUP BY city"), connection)
            assert set(frame.columns) == {"city", "n"}
    finally:
        engine.dispose()


def test_pandas_read_sql_through_psycopg_and_a_transaction_block(server):
    import pandas as pd

    with psycopg.connect(host="127.0.0.1", port=server.port, dbname="shop", user="carol",
                         password=PASSWORDS["carol"], connect_timeout=5) as connection:  # not autocommit
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # pandas prefers SQLAlchemy; a DBAPI connection works
            frame = pd.read_sql("SELECT country, COUNT(*) AS n FROM users GROUP BY country", connection)
        assert list(frame.columns) == ["country", "n"] and len(frame) >= 1
        with pytest.raises(psycopg.Error):
            connection.execute("SELECT secret FROM users")
        connection.rollback()
        assert connection.execute("SHOW budget").fetchall()[1][0] == "analyst carol"


def test_each_analyst_is_charged_to_their_own_budget_until_it_runs_out(server):
    with connect(server, "bob") as bob:
        charged = 0
        with pytest.raises(psycopg.errors.ConfigurationLimitExceeded) as refused:
            for amount in range(10, 110):  # distinct queries: no free repeats
                bob.execute(f"SELECT COUNT(*) AS n FROM visits WHERE amount < {amount}")
                charged += 1
        assert charged == 5 and "bob" in refused.value.diag.message_primary
        scopes = dict((row[0], row[3]) for row in bob.execute("SHOW budget").fetchall())
        assert scopes["analyst bob"] == pytest.approx(0.0)
        assert bob.execute("SELECT 1").fetchone() == (1,)  # still usable after the refusal
    ledger = server.shared.run(None, lambda db: db.ledger())
    assert (ledger["analyst"] == "bob").sum() == 5
    assert set(ledger["analyst"]) <= set(PASSWORDS)  # every charge names the authenticated analyst


def test_a_sampled_query_is_charged_its_amplified_cost_to_the_analyst(server):
    """TABLESAMPLE POISSON from psql's wire protocol: epsilon 1 on a 10% sample costs
    ln(1 + 0.1(e - 1)), within erin's 0.5; scale_sample scales that release for free; a row sample
    with the database's random() is refused."""
    from dpsql.budget.amplification import amplified_epsilon

    with connect(server, "erin") as erin:
        rows = erin.execute("SELECT WITH DIFFERENTIAL_PRIVACY OPTIONS (epsilon = 1) COUNT(*) AS n "
                            "FROM visits TABLESAMPLE POISSON (10 PERCENT)").fetchall()
        assert len(rows) == 1
        scaled = erin.execute("SELECT WITH DIFFERENTIAL_PRIVACY OPTIONS (epsilon = 1, scale_sample = true) COUNT(*) "
                              "AS n FROM visits TABLESAMPLE POISSON (10 PERCENT)").fetchall()
        assert scaled[0][0] == pytest.approx(rows[0][0] * 10)  # the same release (a free repeat), scaled by 1/p
        with pytest.raises(psycopg.errors.FeatureNotSupported) as refused:
            erin.execute("SELECT COUNT(*) AS n FROM visits TABLESAMPLE BERNOULLI (10 PERCENT)")
        assert "random()" in refused.value.diag.message_primary
    ledger = server.shared.run(None, lambda db: db.ledger())
    mine = ledger[ledger["analyst"] == "erin"]
    assert len(mine) == 1 and Fraction(str(mine["epsilon"].iloc[0])) == amplified_epsilon(Fraction(1), Fraction(1, 10))


def test_concurrent_sessions_lose_no_charge(server):
    before = server.shared.run(None, lambda db: db.budget.spent.epsilon)
    failures: list[BaseException] = []

    def client(index: int) -> None:
        try:
            with connect(server, f"analyst{index}") as connection:
                for query in range(3):
                    connection.execute(f"SELECT COUNT(*) AS n FROM visits WHERE age > {20 + query}")
        except BaseException as error:  # noqa: BLE001 - reported below
            failures.append(error)

    threads = [threading.Thread(target=client, args=(i,)) for i in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert not failures
    after = server.shared.run(None, lambda db: db.budget.spent.epsilon)
    assert after - before == Fraction(18, 10)  # 6 analysts x 3 queries x 0.1: none lost, none merged
    for index in range(6):
        mine = server.shared.run(f"analyst{index}", lambda db: db.budget.analyst.spent.epsilon)
        assert mine == Fraction(3, 10)


def raw_exchange(server, payload: bytes, wait: float = 3.0) -> bytes:
    with socket.create_connection(("127.0.0.1", server.port), timeout=wait) as sock:
        sock.sendall(payload)
        received = b""
        try:
            while chunk := sock.recv(4096):
                received += chunk
        except socket.timeout:
            pass
        return received


@pytest.mark.parametrize("payload", [
    b"GET / HTTP/1.1\r\nHost: localhost\r\n\r\n",
    os.urandom(64),
    struct.pack("!ii", 8, 0x00020000),  # protocol 2
    struct.pack("!i", 3),  # a length shorter than itself
], ids=["http", "random", "protocol-2", "short-length"])  # fixed ids: xdist workers must collect the same names
def test_garbage_and_non_postgres_clients_are_turned_away(server, payload):
    answer = raw_exchange(server, payload)
    assert answer == b"" or answer.startswith(b"E")
    with connect(server) as connection:
        assert connection.execute("SELECT 1").fetchone() == (1,)


def test_half_open_connections_time_out_and_the_limit_holds(impatient_server):
    server = impatient_server
    started = time.monotonic()
    idle = [socket.create_connection(("127.0.0.1", server.port), timeout=5) for _ in range(12)]
    try:
        time.sleep(0.2)
        assert b"too many clients" in raw_exchange(server, b"", wait=2.0)
        # A silent client is told and closed once its startup time (1 s here) is over.
        assert b"startup and authentication took too long" in idle[0].recv(200)
        assert time.monotonic() - started < 4
    finally:
        for sock in idle:
            sock.close()
    time.sleep(0.3)
    with connect(server) as connection:
        assert connection.execute("SELECT 1").fetchone() == (1,)


def test_cancel_while_idle_leaves_the_session_usable(server):
    with connect(server) as connection:
        connection.cancel_safe(timeout=5)  # cancel() holds the GIL, starving a server in this process
        assert connection.execute("SELECT 2").fetchone() == (2,)


@pytest.mark.skipif(shutil.which("openssl") is None or PSQL is None, reason="needs openssl and psql")
def test_tls_when_a_certificate_is_given(shop, tmp_path):
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj",
                    "/CN=127.0.0.1", "-keyout", tmp_path / "key.pem", "-out", tmp_path / "cert.pem"],
                   check=True, capture_output=True, timeout=30)
    server = start_in_thread(shop / "shop.duckdb", users=shop / "users", policy=shop / "shop.policy", port=0,
                             ledger=tmp_path / "ledger", tls_cert=str(tmp_path / "cert.pem"),
                             tls_key=str(tmp_path / "key.pem"))
    try:
        with psycopg.connect(host="127.0.0.1", port=server.port, dbname="shop", user="alice",
                             password=PASSWORDS["alice"], sslmode="require", connect_timeout=5) as connection:
            assert connection.pgconn.ssl_in_use
            assert connection.execute("SELECT 1").fetchone() == (1,)
    finally:
        server.stop()
        server.thread.join(10)


def test_dpsql_serve_stops_on_sigterm_and_keeps_every_charge(shop, tmp_path):
    database = tmp_path / "shop.duckdb"
    shutil.copy(shop / "shop.duckdb", database)
    # --port 0 and the port read from the log: a port probed free here could be taken by another
    # test process before the child binds it.
    process = subprocess.Popen([sys.executable, "-m", "dpsql.cli", "serve", str(database), "--policy",
                                str(shop / "shop.policy"), "--users", str(shop / "users"), "--port", "0"],
                               stderr=subprocess.PIPE, text=True)
    lines: list[str] = []
    served: queue.Queue[int] = queue.Queue()

    def read_log():
        for line in process.stderr:
            lines.append(line)
            if found := re.search(r" serving .* on 127\.0\.0\.1:(\d+)", line):
                served.put(int(found.group(1)))

    reader = threading.Thread(target=read_log, daemon=True)
    reader.start()
    try:
        try:
            port = served.get(timeout=60)  # worker processes: the fork server and each worker open it too
        except queue.Empty:
            pytest.fail(f"dpsql serve did not start within 60 s: {''.join(lines)}")
        with psycopg.connect(host="127.0.0.1", port=port, dbname="shop", user="alice", password=PASSWORDS["alice"],
                             connect_timeout=5, autocommit=True) as connection:
            for amount in (100, 200, 300):
                connection.execute(f"SELECT COUNT(*) AS n FROM visits WHERE amount < {amount}")
        process.send_signal(signal.SIGTERM)
        assert process.wait(20) == 0
    finally:
        if process.poll() is None:
            process.kill()
    reader.join(10)
    log = "".join(lines)
    assert log.count("outcome=answered cost=epsilon 0.1") == 3 and "stopped" in log
    with dpsql.connect(str(database), policy=POLICY) as db:
        assert float(db.budget.spent.epsilon) == pytest.approx(0.3)


def test_remote_connection_offers_what_the_shell_uses(server):
    from dpsql.shell.remote import connect_remote

    url = f"postgresql://analyst5:{PASSWORDS['analyst5']}@127.0.0.1:{server.port}/shop"
    with connect_remote(url) as db:
        assert db.analyst == "analyst5" and db.tables() == ["visits", "users", "stores"]
        assert list(db.columns("stores")) == ["store", "city", "size"]
        before = db.budget.analyst.spent.epsilon
        result = db.sql("SELECT AVG(amount) AS a FROM visits", epsilon=0.05)
        assert result.cost.epsilon == Fraction(1, 20) and result.accuracy()["a"] > 0
        assert db.budget.analyst.spent.epsilon - before == Fraction(1, 20)
        assert str(result.limits).startswith("at most 10 rows per user_id; amount clamped to")
        reported = db.sql("SELECT WITH DIFFERENTIAL_PRIVACY OPTIONS (report_bias = 0.2) COUNT(*) AS n FROM visits",
                          epsilon=0.05)
        assert "of rows beyond per-unit limits (at least)" in str(reported.bounding)
        with pytest.raises(dpsql.DPError) as refused:
            db.sql("SELECT nope FROM visits", epsilon=0.05)
        assert (refused.value.line, refused.value.col) == (1, 8)  # where it was typed, options aside
        assert "SELECT AVG(amount) FROM visits" in set(db.ledger()["sql"])
        assert "PRIVATE TABLE visits" in db.policy_text() and "bounded SQL" in db.explain("SELECT COUNT(*) FROM users")


def test_dpsql_shell_at_a_server_url(server):
    environment = {**os.environ, "PGPASSWORD": PASSWORDS["analyst4"], "DPSQL_HISTORY": "", "NO_COLOR": "1"}
    script = ".tables\nSELECT plan, COUNT(*) AS n FROM users GROUP BY plan;\nCOPY users TO 'x';\n"
    done = subprocess.run([sys.executable, "-m", "dpsql.cli", "shell",
                           f"postgresql://analyst4@127.0.0.1:{server.port}/shop"], input=script, env=environment,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2, done.stderr  # the script ran on, and exits as its refused COPY would
    assert "visits   private" in done.stdout and " ± " in done.stdout and "cost ε 0.1" in done.stdout
    assert "COPY statements are not accepted" in done.stdout


def raw_login(server, user: str, password: str) -> socket.socket:
    """A hand-driven client: startup and SCRAM-SHA-256 over a bare socket."""
    from dpsql.server.scram import client_final_for

    sock = socket.create_connection(("127.0.0.1", server.port), timeout=5)
    body = struct.pack("!i", 196608) + b"user\x00" + user.encode() + b"\x00database\x00shop\x00\x00"
    sock.sendall(struct.pack("!i", len(body) + 4) + body)
    reader = sock.makefile("rb")

    def message() -> tuple[bytes, bytes]:
        kind = reader.read(1)
        (length,) = struct.unpack("!i", reader.read(4))
        return kind, reader.read(length - 4)

    assert message()[0] == b"R"  # AuthenticationSASL
    first = "n,,n=,r=handmadenonce"
    payload = b"SCRAM-SHA-256\x00" + struct.pack("!i", len(first)) + first.encode()
    sock.sendall(b"p" + struct.pack("!i", len(payload) + 4) + payload)
    server_first = message()[1][4:].decode()
    final = client_final_for(first, server_first, password).encode()
    sock.sendall(b"p" + struct.pack("!i", len(final) + 4) + final)
    while message()[0] != b"Z":  # SASLFinal, AuthenticationOk, ParameterStatus..., ReadyForQuery
        pass
    return sock


def test_a_client_that_vanishes_mid_query_is_still_charged(server):
    def charges() -> int:
        return int((server.shared.run(None, lambda db: db.ledger())["analyst"] == "analyst3").sum())

    before = charges()
    sock = raw_login(server, "analyst3", PASSWORDS["analyst3"])
    sql = b"SELECT COUNT(*) AS n FROM visits WHERE amount > 123\x00"
    sock.sendall(b"Q" + struct.pack("!i", len(sql) + 4) + sql)
    sock.close()  # gone before the answer
    deadline = time.monotonic() + 10
    while charges() == before and time.monotonic() < deadline:
        time.sleep(0.05)
    assert charges() == before + 1


JDBC_JARS = sorted(Path.home().glob(".m2/repository/org/postgresql/postgresql/*/postgresql-*.jar"))
JDBC_PROGRAM = """
import java.sql.*;
public class Probe {
  public static void main(String[] a) throws Exception {
    try (Connection c = DriverManager.getConnection(a[0], a[1], a[2])) {
      for (int i = 0; i < 6; i++) {  // past pgjdbc's prepareThreshold: server-side prepared statements
        try (PreparedStatement p = c.prepareStatement("SELECT COUNT(*) AS n FROM visits WHERE age > " + (60 + i % 2));
             ResultSet r = p.executeQuery()) { r.next(); System.out.println("count " + r.getLong(1)); }
      }
      try (ResultSet r = c.getMetaData().getTables(null, null, "%", new String[]{"TABLE"})) {
        while (r.next()) System.out.println("table " + r.getString("TABLE_NAME"));
      }
      try (Statement s = c.createStatement()) { s.executeQuery("DELETE FROM visits"); }
      catch (SQLException e) { System.out.println("refused " + e.getSQLState()); }
    }
  }
}
"""


@pytest.mark.skipif(shutil.which("java") is None or not JDBC_JARS, reason="needs java and the pgjdbc jar in ~/.m2")
def test_jdbc_prepared_statements_metadata_and_refusals(server, tmp_path):
    (tmp_path / "Probe.java").write_text(JDBC_PROGRAM)
    done = subprocess.run(["java", "-cp", str(JDBC_JARS[-1]), str(tmp_path / "Probe.java"),
                           f"jdbc:postgresql://127.0.0.1:{server.port}/shop", "dana", PASSWORDS["dana"]],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.split("\n")
    assert sum(line.startswith("count ") for line in lines) == 6
    assert ["table stores", "table users", "table visits"] == [line for line in lines if line.startswith("table")]
    assert "refused 42501" in lines


# Found by an attacker's review of the server (each was free of budget).

def test_a_query_string_past_the_length_limit_is_refused_at_once(server):
    """A 0.94 MB IN list took 10-13 s to refuse, in the queue every analyst waits in."""
    with connect(server) as connection:
        values = ", ".join(str(i) for i in range(20_000))
        with pytest.raises(psycopg.Error) as refused:
            connection.execute(f"SELECT COUNT(*) FROM visits WHERE age IN ({values})")
        assert refused.value.sqlstate == "54000"
        assert connection.execute("SELECT COUNT(*) FROM visits").fetchone()[0] >= 0


@pytest.mark.parametrize("sql", ["SELECT pg_sleep(1)", "SELECT \"current_setting\"('memory_limit')",
                                 "SELECT repeat('x', 100000000)",
                                 "SELECT txid_current()", "SELECT * FROM system.information_schema.tables"])
def test_catalog_look_ups_cannot_wait_show_settings_or_build_large_values(server, sql):
    """(``current_setting('memory_limit')`` unquoted and ``pg_settings`` read the fixed settings:
    tests/test_wire_catalog.py.)"""
    with connect(server) as connection:
        with pytest.raises(psycopg.Error):
            connection.execute(sql)
        assert connection.execute("SELECT table_name FROM information_schema.tables").fetchall()


def test_a_removed_user_can_no_longer_query_in_an_open_session(server, shop):
    from dpsql.server.users import remove_user
    add_user(shop / "users", "erin", "erin-secret")
    with connect(server, "erin", "erin-secret") as connection:
        connection.execute("SELECT COUNT(*) FROM visits")
        remove_user(shop / "users", "erin")
        with pytest.raises(psycopg.Error) as refused:
            connection.execute("SELECT COUNT(*) FROM visits WHERE age > 20")
        assert refused.value.sqlstate == "28000"


def test_an_unknown_name_gets_the_same_salt_from_every_server_on_a_users_file(shop):
    """The decoy key lives beside the users file: a restart no longer changes an unknown
    name's salt (which told unknown names from real ones, whose salts never change)."""
    from dpsql.server.users import decoy_key, decoy_verifier
    first, second = decoy_key(shop / "users"), decoy_key(shop / "users")
    assert first == second and len(first) == 32
    assert (Path(f"{shop / 'users'}.decoy-key").stat().st_mode & 0o777) == 0o600
    assert decoy_verifier(first, "nosuch").salt == decoy_verifier(second, "nosuch").salt


def test_a_user_name_cannot_forge_a_log_line(server, caplog):
    with caplog.at_level("INFO", logger="dpsql.server"):
        with pytest.raises(psycopg.Error):
            connect(server, "x\n2026-11-26 11:00:00,000 dpsql.server INFO analyst bob ok", "wrong")
    refused = [record.getMessage() for record in caplog.records if "refused a connection" in record.getMessage()]
    assert refused and not any("\n" in message for message in refused), refused


def test_a_thin_answer_sends_its_notes_as_notices(tmp_path):
    """Partition selection needs delta, which the module's per-analyst budget has none of."""
    build_shop_database(tmp_path / "shop.duckdb", users=100)
    (tmp_path / "shop.policy").write_text(SHOP_POLICY)
    add_user(tmp_path / "users", "alice", PASSWORDS["alice"])
    thin_server = start_in_thread(tmp_path / "shop.duckdb", users=tmp_path / "users",
                                  policy=tmp_path / "shop.policy", port=0, startup_timeout=1.0)
    try:
        with connect(thin_server) as connection:
            seen = notices(connection)
            rows = connection.execute("SELECT WITH DIFFERENTIAL_PRIVACY OPTIONS (epsilon = 0.1, delta = 1e-7) "
                                      "zip, COUNT(*) AS n FROM visits WHERE age > 200 GROUP BY zip").fetchall()
            assert rows == []
            thin = [text for text in seen if text.startswith("dpsql: No rows were released")]
            assert len(thin) == 1 and "distinct user_id values plus noise reaches" in thin[0]
            assert any(text.startswith("dpsql: To lower that threshold") for text in seen)
            detail = json.loads(connection.info.parameter_status("dpsql_cost"))  # for dpsql shell postgresql://
            assert [f"dpsql: {note}" for note in detail["notes"]] == [t for t in seen if not t.startswith("dpsql: cost")]
            from dpsql.shell.remote import RemoteConnection

            remote = RemoteConnection(connection).sql("SELECT zip, COUNT(*) AS n FROM visits WHERE age > 300 "
                                                      "GROUP BY zip", epsilon=0.1, delta=1e-7)
            assert len(remote) == 0 and remote.notes[0].startswith("No rows were released")  # the shell's view
            seen.clear()
            connection.execute("SELECT store, COUNT(*) AS n FROM visits GROUP BY store").fetchall()
            assert seen and not any("released" in text for text in seen)  # public keys: no note
    finally:
        thin_server.stop()
        thin_server.thread.join(10)


def test_rows_outside_a_keys_domain_are_told_in_the_notice(server, shop):
    add_user(shop / "users", "erin", "erin-secret")
    with psycopg.connect(host="127.0.0.1", port=server.port, dbname="shop", user="erin", password="erin-secret",
                         connect_timeout=5, autocommit=True) as connection:
        seen = notices(connection)
        asked = "SELECT WITH DIFFERENTIAL_PRIVACY OPTIONS (show_outside = true) plan, COUNT(*) AS n FROM users GROUP BY plan"
        assert len(connection.execute(asked).fetchall()) == 3
        assert "rows with plan outside its KEYS domain" in cost_notice(seen)
        connection.execute("SELECT COUNT(*) AS n FROM users")
        assert "outside" not in cost_notice(seen)
