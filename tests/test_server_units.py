"""The server's pure parts: users file, SCRAM, statement classification, values, messages."""

from __future__ import annotations

import base64
import datetime
import os
import stat
from decimal import Decimal

import pytest

from dpsql.errors import BudgetExceeded, QueryFailed, UnsupportedQuery
from dpsql.server import messages as m
from dpsql.server.answers import refusal
from dpsql.server.catalog import catalog_query
from dpsql.server.scram import ScramError, final_reply, first_reply
from dpsql.server.statements import classify
from dpsql.server.users import (
    Verifier,
    add_user,
    decoy_verifier,
    load_users,
    make_verifier,
    remove_user,
)
from dpsql.server.values import (
    BOOL,
    DATE,
    FLOAT8,
    INT8,
    NUMERIC,
    TEXT,
    TIMESTAMP,
    column_type,
    text_value,
)


def test_users_file_keeps_salted_verifiers_only_readable_by_its_owner(tmp_path):
    path = tmp_path / "users"
    add_user(path, "alice", "correct horse")
    add_user(path, "bob", "correct horse")
    text = path.read_text()
    assert "correct horse" not in text and text.count("SCRAM-SHA-256$4096:") == 2
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    users = load_users(path)
    assert users["alice"].matches("correct horse") and not users["alice"].matches("correct horsE")
    assert users["alice"].salt != users["bob"].salt  # same password, unrelated verifiers
    remove_user(path, "bob")
    assert set(load_users(path)) == {"alice"}


@pytest.mark.parametrize("name, password", [("bad name", "long enough"), ("ada", "short"), ("ada", "")])
def test_bad_user_names_and_passwords_are_refused(tmp_path, name, password):
    with pytest.raises(Exception, match="name|password"):
        add_user(tmp_path / "users", name, password)


def test_scram_matches_the_rfc_7677_example():
    # RFC 7677 section 3: user "user", password "pencil".
    verifier = make_verifier("pencil", salt=base64.b64decode("W22ZaJ0SNY7soEsUEjb6gQ=="), iterations=4096)
    state, server_first = first_reply("n,,n=user,r=rOprNGfwEbeRWgbNEkqO", verifier,
                                      server_nonce="%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0")
    assert server_first == "r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,s=W22ZaJ0SNY7soEsUEjb6gQ==,i=4096"
    final = ("c=biws,r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,"
             "p=dHzbZapWIk4jUhN+Ute9ytag9zjfMHgsqmmiz7AndVQ=")
    assert final_reply(state, final) == "v=6rriTRBi23WpRR/wtup+mMhUZUn/dB5nLTJRsjl95G4="
    forged = final[:-6] + "AAAAA="
    assert final_reply(state, forged) is None


def test_scram_refuses_channel_binding_and_a_replayed_nonce():
    verifier = make_verifier("pencil")
    with pytest.raises(ScramError, match="channel binding"):
        first_reply("p=tls-server-end-point,,n=,r=abc", verifier)
    state, _ = first_reply("n,,n=,r=abc", verifier)
    with pytest.raises(ScramError):
        final_reply(state, "c=biws,r=abc-other,p=AAAA")


def test_unknown_users_get_a_stable_decoy_verifier():
    secret = os.urandom(32)
    decoy = decoy_verifier(secret, "mallory")
    assert isinstance(decoy, Verifier) and decoy == decoy_verifier(secret, "mallory")
    assert decoy.salt != decoy_verifier(secret, "trudy").salt and not decoy.matches("")


@pytest.mark.parametrize("sql, kind, sqlstate", [
    ("SELECT COUNT(*) FROM visits", "query", ""),
    ("with t as (select 1) select * from t;", "query", ""),
    ("SET extra_float_digits = 3", "reply", ""),
    ("BEGIN", "reply", ""),
    ("SHOW transaction isolation level", "reply", ""),
    ("SHOW budget", "budget", ""),
    ("EXPLAIN SELECT COUNT(*) FROM visits", "explain", ""),
    ("select pg_catalog.version()", "reply", ""),
    ("", "empty", ""),
    (" ; ", "empty", ""),
    ("SHOW data_directory", "refused", "42704"),
    ("COPY visits TO '/tmp/out.csv'", "refused", "42501"),
    ("ATTACH '/tmp/other.duckdb'", "refused", "42501"),
    ("PRAGMA database_list", "refused", "42501"),
    ("INSERT INTO visits VALUES (1)", "refused", "42501"),
    ("LISTEN x", "refused", "0A000"),
    ("SELECT 1; SELECT 2", "refused", "42601"),
    ("SELECT 'unterminated", "refused", "42601"),
])
def test_statements_are_decided_from_their_text(sql, kind, sqlstate):
    statement = classify(sql)
    assert (statement.kind, statement.sqlstate) == (kind, sqlstate)
    if kind == "refused":
        assert statement.message and (statement.hint or sqlstate == "42704")


def test_a_second_statement_is_refused_at_its_position():
    statement = classify("SELECT 1; DROP TABLE visits")
    assert statement.position == len("SELECT 1; ") + 1


def test_catalog_queries_are_told_apart_from_queries_on_declared_tables():
    assert catalog_query("SELECT table_name FROM information_schema.tables")
    assert catalog_query("SELECT c.relname FROM pg_catalog.pg_class c JOIN pg_namespace n ON true")
    assert catalog_query("SELECT 1")
    assert not catalog_query("SELECT relname FROM pg_class, visits")
    assert not catalog_query("WITH t AS (SELECT 1) INSERT INTO pg_settings SELECT * FROM t")
    assert not catalog_query("SELECT * FROM information_schema.tables WHERE table_name IN (SELECT store FROM stores)")


def test_refusals_carry_sqlstate_position_and_hint():
    statement = classify("  SELECT nope FROM visits")
    outcome = refusal(UnsupportedQuery("unknown column nope", line=1, col=8, hint="use a column"), statement)
    assert (outcome.sqlstate, outcome.position, outcome.hint) == ("42703", 10, "use a column")
    assert refusal(BudgetExceeded("no budget left"), statement).sqlstate == "53400"


def test_a_query_stopped_by_the_time_limit_names_no_server_setting():
    """The deadline's hint is the curator's ("a longer query_timeout"); the analyst reads another."""
    stopped = QueryFailed("the query was stopped after its time limit of 30 s",
                          hint="ask for less, or ask the curator for a longer query_timeout")
    outcome = refusal(stopped, classify("SELECT COUNT(*) FROM visits"))
    assert outcome.sqlstate == "58000" and "query_timeout" not in outcome.message + outcome.hint
    assert outcome.hint.startswith("ask for less")


def test_column_types_and_text_values():
    assert column_type([None, 3]) == INT8 and column_type([1, 2.5]) == FLOAT8
    assert column_type([Decimal("1.5")]) == NUMERIC and column_type([True]) == BOOL
    assert column_type([datetime.date(2024, 1, 2)]) == DATE
    assert column_type([datetime.datetime(2024, 1, 2, 3, 4)]) == TIMESTAMP
    assert column_type(["a", 1]) == TEXT
    assert text_value(datetime.datetime(2024, 1, 2, 3, 4)) == b"2024-01-02 03:04:00"
    assert text_value(float("-inf")) == b"-Infinity" and text_value(0.1) == b"0.1"
    assert text_value(b"\x01") == b"\\x01"


def test_malformed_startup_packets_are_protocol_errors():
    with pytest.raises(m.ProtocolError):
        m.parse_startup(b"\x00\x02\x00\x00user\x00x\x00\x00")  # protocol 2
    with pytest.raises(m.ProtocolError):
        m.parse_startup(b"\x00\x03\x00\x00user\x00x")  # unterminated
    with pytest.raises(m.ProtocolError):
        m.parse_bind(b"portal\x00stmt\x00\x00\x00\x00\x01\x00\x00\x00\x09ab")  # shorter than said
