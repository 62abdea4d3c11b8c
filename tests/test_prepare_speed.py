"""What the prepare path skips for speed is what it would have computed (issue 26).

A grouped query's key types come from its relation's stored column types when every key is a
column (``dpsql.query.prepare.stored_key_types``) instead of binding the keys' SQL: for a column of
every DuckDB type, read from a table, either side of a join and a subquery, the two agree. A
public key domain's SQL is kept by what it is made of (``dpsql.query.domains.KeyDomains.text``): the kept
text is the one rendered afresh.
"""

from __future__ import annotations

import duckdb
import pytest
from sqlglot import exp
from test_types import TYPES, every_type  # noqa: F401 (a fixture)

import dpsql
from dpsql.analysis.analyse import analyse_query
from dpsql.backends.rewrite import domain_sql, key_types_statement
from dpsql.query.options import privacy_options
from dpsql.query.prepare import stored_key_types

POLICY = ("BUDGET EPSILON 100000 DELTA 0.5; PRIVATE TABLE every (PRIVACY UNIT uid, MAX ROWS PER UNIT 1); "
          "PUBLIC TABLE pub;")
SHAPES = ('SELECT "{c}", COUNT(*) FROM every GROUP BY "{c}"',
          'SELECT p."{c}", COUNT(*) FROM every e JOIN pub p ON e.integer = p.integer GROUP BY p."{c}"',
          'SELECT e."{c}", e.integer, COUNT(*) FROM every e JOIN pub p ON e.integer = p.integer GROUP BY 1, 2',
          'SELECT "{c}", COUNT(*) FROM (SELECT * FROM every WHERE integer > 1) GROUP BY "{c}"')


@pytest.fixture(scope="module")
def db(every_type):  # noqa: F811 (the fixture imported from test_types)
    """test_types' table of a column of every type, with a public table of three of its rows."""
    every_type.execute("CREATE OR REPLACE TABLE pub AS SELECT * EXCLUDE (uid) FROM every LIMIT 3")
    with dpsql.connect(every_type, policy=POLICY) as connection:
        yield connection


@pytest.mark.parametrize("name", sorted(TYPES))
def test_stored_key_types_are_what_binding_the_keys_gives(db, name):
    preparer = db._preparer
    compared = 0
    for shape in SHAPES:
        _, checked, _ = preparer.check(shape.format(c=name.lower()))
        plan = analyse_query(checked, preparer.policy, privacy_options(preparer.policy, 1, 1e-5, None, None))
        stored = stored_key_types(plan.query)
        assert stored is not None, shape
        bound = dict(db._answerer.describe(key_types_statement(plan)))
        assert stored == {key: bound[key] for key in stored}, shape
        compared += 1
    assert compared == len(SHAPES)


def test_a_key_that_is_an_expression_is_bound(db):
    _, checked, _ = db._preparer.check("SELECT integer + 1, COUNT(*) FROM every GROUP BY integer + 1")
    assert not isinstance(checked.keys[0].expression, exp.Column)
    assert stored_key_types(checked) is None


@pytest.mark.parametrize("other", ["DOUBLE", "VARCHAR", "BIGINT"])
def test_a_union_keys_types_are_bound_not_read_off_its_first_branch(other):
    """A UNION ALL column has its branches' common type (INTEGER with DOUBLE is DOUBLE): the key
    1.5 must come back as 1.5, not as the first branch's INTEGER 2 (an attacker's review)."""
    con = duckdb.connect()
    con.execute("CREATE TABLE t AS SELECT i AS uid, CAST(i % 3 AS INTEGER) AS k FROM range(300) r(i)")
    con.execute(f"CREATE TABLE s AS SELECT 1000 + i AS uid, CAST(CASE WHEN {other!r} = 'VARCHAR' THEN 'x' || (i % 2) "
                f"ELSE CAST(i % 3 * 1.5 AS VARCHAR) END AS {other}) AS kd FROM range(300) r(i)")
    policy = ("BUDGET EPSILON 1e12 DELTA 0.5; PRIVATE TABLE t (PRIVACY UNIT uid, MAX ROWS PER UNIT 1); "
              "PRIVATE TABLE s (PRIVACY UNIT uid, MAX ROWS PER UNIT 1);")
    sql = "SELECT k, COUNT(*) AS n FROM (SELECT uid, k FROM t UNION ALL SELECT uid, kd FROM s) u GROUP BY k"
    truth = sorted(con.execute("SELECT k FROM (SELECT uid, k FROM t UNION ALL SELECT uid, kd FROM s) GROUP BY k"
                               ).fetchall(), key=repr)
    with dpsql.connect(con, policy=policy) as db:
        _, checked, _ = db._preparer.check(sql)
        assert stored_key_types(checked) is None
        released = sorted(((row[0],) for row in db.sql(sql, epsilon=1e6, delta=1e-6).fetchall()), key=repr)
    assert released == truth and {type(k[0]) for k in released} == {type(k[0]) for k in truth}


def test_a_kept_domain_text_is_the_one_rendered_afresh():
    con = duckdb.connect()
    con.execute("CREATE TABLE t AS SELECT i AS uid, i % 3 AS n, 'v' || (i % 2) AS s FROM range(60) r(i)")
    policy = ("BUDGET EPSILON 1000; PRIVATE TABLE t (PRIVACY UNIT uid, MAX ROWS PER UNIT 1, "
              "n KEYS (0, 1, 2), s KEYS ('v0', 'v1', 'v2'));")
    with dpsql.connect(con, policy=policy) as db:
        for sql, released in (("SELECT n, COUNT(*) FROM t WHERE uid > {k} GROUP BY n", lambda k: 3),
                              ("SELECT s, n, COUNT(*) FROM t WHERE uid > {k} GROUP BY s, n", lambda k: 9),
                              ("SELECT n, COUNT(*) FROM t WHERE n < {k} GROUP BY n", lambda k: k)):  # narrowed
            for k in (1, 2):
                _, checked, _ = db._preparer.check(sql.format(k=k))
                query = db._preparer.plan(checked, sql, 1, None, None).query
                assert {key.form for key in query.keys} == ({"value", "text"} if "s," in sql else {"value"})
                for key in query.keys:
                    types = [query.column_type(key.expression.name)]
                    assert db._answerer.domains.text([key], types) == domain_sql([key], types)
                types = [query.column_type(key.expression.name) for key in query.keys]
                assert db._answerer.domains.text(list(query.keys), types) == domain_sql(list(query.keys), types)
                assert len(db.sql(sql.format(k=k), epsilon=1).fetchall()) == released(k)
