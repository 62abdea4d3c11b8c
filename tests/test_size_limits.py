"""One unit's value cannot cost time by its size: the bounded copy cuts every nested value to
MAX LIST LENGTH elements *in all* (not per level) and every string to MAX STRING LENGTH
characters (BLOBs to as many bytes), at any depth (``dpsql.backends.bounding.shortened``).

Checked structurally, never by timing: the copy DuckDB reads holds nothing longer than the
limits, so no analyst expression can do more work on one unit's row than the limits allow."""

from __future__ import annotations

import duckdb
import pytest

import dpsql
from dpsql.backends.bounding import DATABASE, list_depth, per_level
from dpsql.errors import PolicyError
from dpsql.mechanisms.noise import SeededSource

POLICY = """BUDGET EPSILON 100000 DELTA 1e-3; QUERY EPSILON 1;
PRIVATE TABLE a (PRIVACY UNIT u, MAX ROWS PER UNIT 5{rules});"""


def attacked() -> duckdb.DuckDBPyConnection:
    """The attacker's database at a small scale: 200 units x 5 small rows, and unit -1 with a
    200,000-character string, a list of 50 strings of 20,000 characters, a 3-level list of
    30 x 30 x 30 elements, a 50,000-byte BLOB, a long JSON document and a MAP with a long key."""
    con = duckdb.connect()
    con.execute("""CREATE TABLE a AS SELECT i % 200 AS u, 'abc' AS s, ['x'] AS ls, [[[i]]] AS l,
                   '\\x01'::BLOB AS b, '{"k": 1}'::JSON AS j, MAP {'k': 1} AS mp,
                   {'name': 'n', 'tags': ['t']} AS st FROM range(1000) t(i)""")
    con.execute("""INSERT INTO a SELECT -1, repeat('ab', 100000), [repeat('q', 20000) for _ in range(50)],
                   [[range(30) for _ in range(30)] for _ in range(30)],
                   unhex(repeat('AB', 50000)), to_json(repeat('z', 5000)),
                   MAP {repeat('k', 5000): 2, 'short': 3},
                   {'name': repeat('n', 5000), 'tags': [repeat('t', 5000) for _ in range(200)]}
                   FROM range(5)""")
    return con


def connect(con, rules: str = "", **options):
    return dpsql.connect(con, policy=POLICY.format(rules=", " + rules if rules else ""), rng=SeededSource(1),
                         **options)


def copies(con) -> list[str]:
    return sorted(r[0] for r in con.execute(
        f"SELECT table_name FROM duckdb_tables() WHERE database_name = '{DATABASE}'").fetchall())


def copy_of(con, db, name: str = "dp_bounded_a__u__5") -> str:
    """The copy named ``name``, filled by a query (every stated limit is part of the name)."""
    db.sql("SELECT COUNT(*) AS n FROM a", epsilon=1).fetchall()
    assert name in copies(con)
    return f'{DATABASE}."{name}"'


def largest(con, copy: str) -> dict[str, int]:
    """The most work one row of the copy can cost, column by column (padding rows dropped)."""
    row = con.execute(f"""SELECT max(length(s)), max(list_max(list_transform(ls, lambda x: length(x)))),
        max(len(ls)), max(len(flatten(flatten(l)))), max(octet_length(b)), max(length(CAST(j AS VARCHAR))),
        max(list_max(list_transform(map_keys(mp), lambda k: length(k)))), max(length(st.name)),
        max(list_max(list_transform(st.tags, lambda x: length(x)))), max(len(st.tags))
        FROM {copy} WHERE NOT dp_pad""").fetchall()[0]
    names = ["s", "ls element", "ls", "l elements", "b", "j", "mp key", "st.name", "st.tags element", "st.tags"]
    return dict(zip(names, row))


def test_the_copy_holds_no_value_beyond_the_default_limits():
    """Defaults: 100 elements in all, 1,000 characters. The 3-level list keeps 4 x 4 x 4 = 64
    elements (not 100^3), the 200,000-character string 1,000 characters, the JSON document
    longer than the limit is NULL (a cut one would not be JSON), the MAP entry whose key is
    too long is dropped (a cut key could collide with another)."""
    con = attacked()
    with connect(con) as db:
        got = largest(con, copy_of(con, db))
    assert got == {"s": 1000, "ls element": 1000, "ls": 50, "l elements": 64, "b": 1000, "j": 8,
                   "mp key": 5, "st.name": 1000, "st.tags element": 1000, "st.tags": 100}
    source = largest(con, "(SELECT *, FALSE AS dp_pad FROM a)")  # the attack is real: the stored values are far larger
    assert source["s"] == 200_000 and source["l elements"] == 27_000 and source["b"] == 50_000


def test_stated_limits_hold_and_name_their_own_copy():
    con = attacked()
    with connect(con, "MAX LIST LENGTH 8, MAX STRING LENGTH 20") as db:
        assert "MAX STRING LENGTH 20" in db.policy_text()
        got = largest(con, copy_of(con, db, "dp_bounded_a__u__5__list8__str20"))
    assert got == {"s": 20, "ls element": 20, "ls": 8, "l elements": 8, "b": 20, "j": 8,
                   "mp key": 5, "st.name": 20, "st.tags element": 20, "st.tags": 8}
    with connect(con, "MAX STRING LENGTH 30") as db:  # another policy: another copy, never shared
        assert largest(con, copy_of(con, db, "dp_bounded_a__u__5__str30"))["s"] == 30
    assert len([c for c in copies(con) if c.startswith("dp_bounded_a__")]) == 2


def test_the_cut_is_what_queries_see():
    """Equality and grouping change only for values longer than the limit: the long string
    equals its first 20 characters, and no longer equals itself."""
    con = attacked()
    long = "ab" * 100000
    with connect(con, "MAX STRING LENGTH 20") as db:
        cut = db.sql(f"SELECT COUNT(*) AS n FROM a WHERE s = '{long[:20]}'", epsilon=100).fetchall()[0][0]
        whole = db.sql("SELECT COUNT(*) AS n FROM a WHERE length(s) > 20", epsilon=100).fetchall()[0][0]
        short = db.sql("SELECT COUNT(*) AS n FROM a WHERE s = 'abc'", epsilon=100).fetchall()[0][0]
    assert cut == pytest.approx(5, abs=1) and whole == pytest.approx(0, abs=1)
    assert short == pytest.approx(1000, abs=1)


def test_a_long_key_is_cut_and_then_outside_its_domain():
    """A KEYS domain value longer than the limit: the stored value is cut, so it no longer
    equals the domain's value and its rows go to the outside cell, never lost."""
    con = duckdb.connect()
    long = "k" * 30
    con.execute(f"CREATE TABLE a AS SELECT i AS u, CASE WHEN i < 10 THEN '{long}' ELSE 'short' END AS s "
                "FROM range(30) t(i)")
    with connect(con, f"s KEYS ('{long}', 'short'), MAX STRING LENGTH 20") as db:
        result = db.sql("SELECT s, COUNT(*) AS n FROM a GROUP BY s", epsilon=100)
        released = dict(result.fetchall())
        outside = result.outside_domain.values["n"]
    assert released == pytest.approx({long: 0, "short": 20}, abs=1)
    assert outside == pytest.approx(10, abs=1)


@pytest.mark.parametrize("item, message", [("MAX STRING LENGTH 0", "at least 1"),
                                           ("MAX STRING LENGTH 2.5", "whole number"),
                                           ("MAX STRING LENGTH 3, MAX STRING LENGTH 4", "given twice")])
def test_bad_max_string_length_is_a_policy_error(item, message):
    with pytest.raises(PolicyError, match=message):
        connect(attacked(), item)


def test_per_level_keeps_the_product_within_the_limit():
    for length in (1, 2, 7, 64, 100, 1000, 12345):
        for depth in range(1, 6):
            n = per_level(length, depth)
            assert n >= 1 and (n ** depth <= length or n == 1) and (n + 1) ** depth > length
    assert list_depth("MAP(VARCHAR, INTEGER[][])") == 3
