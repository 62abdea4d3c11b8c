"""Issue 15 item 2: every DuckDB type a wrapped file may hold is handled or refused by name.

STRUCT fields bind as DuckDB binds them; ENUM and BOOLEAN columns group over their type's
values with no KEYS line; LIST and MAP columns are read through a policy length limit; and a
property test runs COUNT / GROUP BY / SUM / MIN over a column of each logical type.
"""

from __future__ import annotations

import duckdb
import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import dpsql
from dpsql.errors import DPError, PolicyError, UnsupportedQuery
from dpsql.mechanisms.noise import SeededSource
from dpsql.shell.session import handle_input
from dpsql.shell.state import new_state
from dpsql.sql.types import is_numeric_type, reads_as_integer, reads_as_number

POLICY = "BUDGET EPSILON 100000 DELTA 0.5; PRIVATE TABLE t (PRIVACY UNIT uid, MAX ROWS PER UNIT 1{rules});"


def database(rows: int = 200) -> duckdb.DuckDBPyConnection:
    """t: an ENUM, a BOOLEAN with NULLs, a nested STRUCT, a LIST and a MAP per unit."""
    con = duckdb.connect()
    con.execute("CREATE TYPE mood AS ENUM ('sad', 'o''k', 'happy')")
    con.execute(f"""CREATE TABLE t AS SELECT i AS uid,
        (['sad', 'o''k'][i % 2 + 1])::mood AS m,
        CASE WHEN i % 3 = 0 THEN NULL ELSE i % 2 = 0 END AS b,
        {{'src': CASE WHEN i % 4 = 0 THEN 'web' ELSE 'app' END, 'n': i % 5, 'inner': {{'k': i % 3}}}} AS meta,
        [i % 7, 100 + i % 7, 200] AS l,
        MAP {{'a': i % 7, 'b': 1}} AS mp
        FROM range({rows}) r(i)""")
    return con


def connect(con, rules: str = "", seed: int = 1, **options):
    return dpsql.connect(con, policy=POLICY.format(rules=", " + rules if rules else ""), rng=SeededSource(seed),
                         **options)


def exact(con, sql: str):
    return con.execute(sql).fetchall()


# ---------------------------------------------------------------------------------------------
# STRUCT fields


@pytest.mark.parametrize("where", ["meta.src = 'web'", "t.meta.src = 'web'", "meta['src'] = 'web'",
                                   "struct_extract(meta, 'src') = 'web'", "META.SRC = 'web'",
                                   "struct_extract(meta, 'SRC') = 'web'"])
def test_struct_field_filters_as_duckdb_reads_it(where):
    con = database()
    with connect(con) as db:
        noisy = db.sql(f"SELECT COUNT(*) AS n FROM t WHERE {where}", epsilon=50).fetchall()[0][0]
    assert abs(noisy - 50) < 5  # 50 of 200 units are 'web'; the noise scale is 1/50


@pytest.mark.parametrize("key", ["meta.inner.k", "t.meta.inner.k", "meta['inner']['k']", "meta['inner'].k",
                                 "struct_extract(struct_extract(meta, 'inner'), 'k')"])
def test_nested_struct_field_groups(key):
    con = database()
    with connect(con) as db:
        rows = db.sql(f"SELECT {key} AS k, COUNT(*) AS n FROM t GROUP BY k ORDER BY k", epsilon=50,
                      delta=1e-6).fetchall()
    assert [r[0] for r in rows] == [0, 1, 2]
    truth = dict(exact(con, "SELECT meta.inner.k, COUNT(*) FROM t GROUP BY 1"))
    assert all(abs(n - truth[k]) < 5 for k, n in rows)


def test_struct_field_in_aggregate_argument_and_subquery():
    con = database()
    with connect(con) as db:
        clamped = db.sql("SELECT SUM(CLAMP(meta.n, 0, 4)) AS s FROM t", epsilon=50).fetchall()[0][0]
        inner = db.sql("SELECT s, COUNT(*) AS n FROM (SELECT uid, meta.src AS s FROM t) AS q GROUP BY s ORDER BY s",
                       epsilon=50, delta=1e-6).fetchall()
        with pytest.raises(UnsupportedQuery, match="cannot derive bounds for STRUCT_EXTRACT"):
            db.sql("SELECT SUM(meta.n) FROM t", epsilon=1)
    assert abs(clamped - exact(con, "SELECT SUM(meta.n) FROM t")[0][0]) < 30
    assert [r[0] for r in inner] == ["app", "web"]


def test_table_alias_wins_over_struct_column_of_that_name():
    """DuckDB reads ``meta.src`` as table meta's column src when the table has that alias."""
    con = database()
    con.execute("CREATE TABLE u AS SELECT uid, meta, CAST(uid % 2 AS INTEGER) AS src FROM t")
    policy = POLICY.format(rules="") + " PRIVATE TABLE u (PRIVACY UNIT uid, MAX ROWS PER UNIT 1);"
    with dpsql.connect(con, policy=policy, rng=SeededSource(1)) as db:
        as_table = db.sql("SELECT COUNT(*) AS n FROM u AS meta WHERE meta.src = 1", epsilon=50).fetchall()[0][0]
        as_field = db.sql("SELECT COUNT(*) AS n FROM u WHERE meta.src = 'web'", epsilon=50).fetchall()[0][0]
        # the integer column src, not the field: 'web' is no INTEGER, refused as DuckDB refuses it
        with pytest.raises(UnsupportedQuery, match="the constant 'web' is not a valid INTEGER value"):
            db.sql("SELECT COUNT(*) AS n FROM u AS meta WHERE meta.src = 'web'", epsilon=50)
    assert abs(as_table - 100) < 5 and abs(as_field - 50) < 5
    with pytest.raises(duckdb.ConversionException):
        exact(con, "SELECT COUNT(*) FROM u AS meta WHERE meta.src = 'web'")
    assert exact(con, "SELECT COUNT(*) FROM u AS meta WHERE meta.src = 1") == [(100,)]


@pytest.mark.parametrize("sql, message", [
    ("SELECT COUNT(*) FROM t WHERE meta.nope = 1", r"the STRUCT meta has no field nope.*its fields are: src, n, inner"),
    ("SELECT COUNT(*) FROM t WHERE meta['nope'] = 1", "has no field nope"),
    ("SELECT COUNT(*) FROM t WHERE meta.src.x = 1", "meta.src is of type VARCHAR, not a STRUCT"),
    ("SELECT COUNT(*) FROM t WHERE struct_extract(uid, 'x') = 1", "struct_extract reads a STRUCT, but uid is of type BIGINT"),
    ("SELECT COUNT(*) FROM t WHERE meta[uid] = 1", "must be named by a string literal"),
    ("SELECT COUNT(*) FROM t WHERE nope.src = 1", "unknown table or alias nope"),
])
def test_struct_mistakes_refused_by_name_before_any_charge(sql, message):
    con = database()
    with connect(con) as db:
        with pytest.raises(UnsupportedQuery, match=message):
            db.sql(sql, epsilon=1)
        assert db.budget.spent.epsilon == 0


# ---------------------------------------------------------------------------------------------
# ENUM and BOOLEAN: the type's values are a public domain


def test_enum_groups_release_every_value_without_policy_line_or_delta():
    con = database()
    with connect(con) as db:
        rows = db.sql("SELECT m, COUNT(*) AS n FROM t GROUP BY m", epsilon=1, delta=0).fetchall()
        plan = db.explain("SELECT m, COUNT(*) AS n FROM t GROUP BY m", epsilon=1, delta=0)
    assert [r[0] for r in rows] == ["sad", "o'k", "happy"]  # 'happy' has no row: released all the same
    assert "every one of the 3 values of its type ENUM('sad', 'o''k', 'happy')" in str(plan)
    assert "partition selection:" not in str(plan)


@pytest.mark.parametrize("keys_only", ["SELECT {k} FROM t GROUP BY {k}", "SELECT DISTINCT {k} FROM t",
                                      "SELECT {k} AS key FROM t GROUP BY ALL ORDER BY key DESC"])
@pytest.mark.parametrize("column, rule", [("m", ""), ("b", ""), ("d", "d KEYS ('2024-01-01', '2024-01-02')"),
                                          ("s", "s KEYS ('x', 'y')"), ("n", "n KEYS (1, 2)")])
def test_keys_only_answers_have_the_keys_own_types(keys_only, column, rule):
    """The duck user's finding 4: GROUP BY (or DISTINCT) with no aggregate reports the key's
    own type (ENUM, BOOLEAN, DATE, ...), as the same key with an aggregate does; df() agrees."""
    con = database()
    con.execute("ALTER TABLE t ADD COLUMN d DATE DEFAULT DATE '2024-01-01'")
    con.execute("ALTER TABLE t ADD COLUMN s VARCHAR DEFAULT 'x'")
    con.execute("ALTER TABLE t ADD COLUMN n SMALLINT DEFAULT 1")
    with connect(con, rule) as db:
        keys = db.sql(keys_only.format(k=column), epsilon=1)
        counted = db.sql(f"SELECT {column}, COUNT(*) AS c FROM t GROUP BY {column}", epsilon=1)
        assert keys.cost.epsilon == 0 and keys.types == counted.types[:1]
        assert keys.types[0] == con.execute(f"SELECT typeof({column}) FROM t LIMIT 1").fetchone()[0]
        assert keys.df().dtypes.iloc[0] == counted.df().dtypes.iloc[0]


def test_boolean_groups_release_false_and_true_only():
    con = database()
    with connect(con) as db:
        rows = db.sql("SELECT b, m, COUNT(*) AS n FROM t GROUP BY b, m", epsilon=1, delta=0).fetchall()
    assert sorted((r[0], r[1]) for r in rows) == sorted((b, m) for b in (False, True)
                                                        for m in ("sad", "o'k", "happy"))


def test_enum_domain_is_the_same_on_neighbouring_databases():
    """One unit holding the only 'happy' row changes no released key: the keys are the type's."""
    base = database(60)
    added = database(60)
    added.execute("INSERT INTO t SELECT 999, 'happy', true, meta, l, mp FROM t LIMIT 1")
    keys = []
    for con in (base, added):
        with connect(con) as db:
            keys.append([r[0] for r in db.sql("SELECT m, COUNT(*) AS n FROM t GROUP BY m", epsilon=1).fetchall()])
    assert keys[0] == keys[1] == ["sad", "o'k", "happy"]


def test_declared_keys_still_win_over_the_type_domain():
    con = database()
    with connect(con, "m KEYS ('sad')") as db:
        rows = db.sql("SELECT m, COUNT(*) AS n FROM t GROUP BY m", epsilon=1).fetchall()
    assert [r[0] for r in rows] == ["sad"]


def test_shell_schema_says_enum_and_boolean_keys_are_the_types():
    con = database()
    with connect(con) as db:
        text = handle_input(new_state(db, width=240), ".schema t")
    lines = {line.split()[0]: line for line in text.splitlines() if line.strip() and not line.startswith("t:")}
    assert "every value of its type (3)" in lines["m"]
    assert "every value of its type (2)" in lines["b"]
    assert "every value" not in lines["meta"]
    assert "lists: first 100 elements (MAX LIST LENGTH)" in lines["l"] and "first 100" in lines["mp"]


# ---------------------------------------------------------------------------------------------
# LIST and MAP: functions on private rows, every list cut to MAX LIST LENGTH in the bounded copy


@pytest.mark.parametrize("where, truth", [
    ("list_contains(l, 5)", "list_contains(l, 5)"), ("array_has(l, 105)", "array_has(l, 105)"),
    ("l[1] = 3", "l[1] = 3"), ("list_extract(l, 2) = 103", "l[2] = 103"), ("array_length(l) = 3", "TRUE"),
    ("mp['a'] = 4", "mp['a'] = 4"), ("map_contains(mp, 'b')", "TRUE"), ("list_position(l, 200) = 3", "TRUE"),
    ("list_min(l) = 6", "l[1] = 6"), ("cardinality(mp) = 2", "TRUE"), ("meta.inner.k = 2 AND l[1] > 3", "meta.inner.k = 2 AND l[1] > 3"),
])
def test_list_and_map_functions_answer_as_duckdb_does(where, truth):
    con = database()
    with connect(con) as db:
        noisy = db.sql(f"SELECT COUNT(*) AS n FROM t WHERE {where}", epsilon=50).fetchall()[0][0]
    assert abs(noisy - exact(con, f"SELECT COUNT(*) FROM t WHERE {truth}")[0][0]) < 5


def test_list_element_groups_and_list_sum_needs_a_clamp():
    con = database()
    with connect(con) as db:
        rows = db.sql("SELECT l[1] AS e, COUNT(*) AS n FROM t GROUP BY e ORDER BY e", epsilon=50, delta=1e-6).fetchall()
        total = db.sql("SELECT SUM(CLAMP(list_sum(l), 0, 400)) AS s FROM t", epsilon=50).fetchall()[0][0]
        with pytest.raises(UnsupportedQuery, match="cannot derive bounds"):
            db.sql("SELECT SUM(list_sum(l)) FROM t", epsilon=1)
    assert [r[0] for r in rows] == list(range(7))
    assert abs(total - exact(con, "SELECT SUM(list_sum(l)) FROM t")[0][0]) < 100


@pytest.mark.parametrize("sql", ["SELECT COUNT(*) FROM t WHERE unnest(l) = 2",
                                 "SELECT COUNT(*) FROM (SELECT uid, unnest(l) AS e FROM t) AS q",
                                 "SELECT e, COUNT(*) FROM (SELECT uid, UNNEST(l) AS e FROM t) AS q GROUP BY e"])
def test_unnest_is_refused_by_name(sql):
    with connect(database()) as db:
        with pytest.raises(UnsupportedQuery, match="UNNEST is not supported on private rows.*list_contains"):
            db.sql(sql, epsilon=1, delta=1e-6)
        assert db.budget.spent.epsilon == 0


def long_lists(length: int) -> duckdb.DuckDBPyConnection:
    """Units 0..99 with three-element lists; unit 999 with a list of ``length`` elements whose
    last one is 424242, a MAP with as many entries, and the same list inside a STRUCT."""
    con = duckdb.connect()
    con.execute("""CREATE TABLE t AS SELECT i AS uid, [1, 2, 3] AS l, MAP {'a': 1} AS mp,
                   {'tags': [1, 2, 3]} AS s FROM range(100) r(i)""")
    con.execute(f"""INSERT INTO t SELECT 999, list_append(range(1, {length})::BIGINT[], 424242),
                    map_from_entries(list_transform(range({length}), lambda x: struct_pack(key := 'k' || x, value := x))),
                    {{'tags': list_append(range(1, {length})::BIGINT[], 424242)}}""")
    return con


@pytest.mark.parametrize("where", ["list_contains(l, 424242)", "list_contains(s.tags, 424242)",
                                   "mp['k9999'] IS NOT NULL", "array_length(l) > 100", "cardinality(mp) > 100",
                                   "list_max(s.tags) > 100"])
def test_elements_beyond_the_list_limit_are_never_read(where):
    """The default MAX LIST LENGTH is 100: the unit's 10,000th element, entry or nested tag is
    not in the bounded copy, so no query can read it (or spend time on it)."""
    con = long_lists(10_000)
    assert exact(con, f"SELECT COUNT(*) FROM t WHERE {where}") == [(1,)]
    with connect(con) as db:
        noisy = db.sql(f"SELECT COUNT(*) AS n FROM t WHERE {where}", epsilon=50).fetchall()[0][0]
    assert abs(noisy) < 5


def test_policy_max_list_length_is_enforced_and_round_trips():
    con = long_lists(50)
    with connect(con, "MAX LIST LENGTH 5") as db:
        assert "MAX LIST LENGTH 5" in db.policy_text()
        longest = db.sql("SELECT COUNT(*) AS n FROM t WHERE array_length(l) > 5", epsilon=50).fetchall()[0][0]
        fifth = db.sql("SELECT COUNT(*) AS n FROM t WHERE l[5] = 5", epsilon=50).fetchall()[0][0]
    assert abs(longest) < 5 and abs(fifth - 1) < 5
    with connect(con) as db:  # the default (100) keeps all 50, in another copy
        assert abs(db.sql("SELECT COUNT(*) AS n FROM t WHERE array_length(l) = 50", epsilon=50).fetchall()[0][0] - 1) < 5


@pytest.mark.parametrize("item, message", [("MAX LIST LENGTH 0", "at least 1"), ("MAX LIST LENGTH 2.5", "whole number"),
                                           ("MAX LIST LENGTH 3, MAX LIST LENGTH 4", "given twice")])
def test_bad_max_list_length_is_a_policy_error(item, message):
    with pytest.raises(PolicyError, match=message):
        connect(database(), item)


def test_list_cost_does_not_grow_with_one_units_list():
    """What the limit is for: a list function's work per row is capped, so one unit's huge list
    cannot be timed. Compared as DuckDB work on the bounded copy: the longest list it holds."""
    con = long_lists(200_000)
    with connect(con) as db:
        db.sql("SELECT COUNT(*) AS n FROM t", epsilon=1).fetchall()
    copies = [r[0] for r in con.execute("SELECT table_name FROM duckdb_tables() WHERE database_name = 'dp_bounding'"
                                        ).fetchall()]
    longest = con.execute(f'SELECT max(len(l)), max(cardinality(mp)), max(len(s.tags)) FROM dp_bounding."{copies[0]}"'
                          ).fetchall()[0]
    assert longest == (100, 100, 100)


# ---------------------------------------------------------------------------------------------
# Every logical type: handled or refused by name, never an internal or bare DuckDB error

TYPES = {
    "BOOLEAN": "i % 2 = 0", "TINYINT": "(i % 5)::TINYINT", "SMALLINT": "(i % 5)::SMALLINT",
    "INTEGER": "(i % 5)::INTEGER", "BIGINT": "(i % 5)::BIGINT", "HUGEINT": "(i % 5)::HUGEINT",
    "UTINYINT": "(i % 5)::UTINYINT", "USMALLINT": "(i % 5)::USMALLINT", "UINTEGER": "(i % 5)::UINTEGER",
    "UBIGINT": "(i % 5)::UBIGINT", "UHUGEINT": "(i % 5)::UHUGEINT", "FLOAT": "(i % 5)::FLOAT",
    "DOUBLE": "(i % 5)::DOUBLE", "DECIMAL(10,2)": "(i % 5)::DECIMAL(10,2)", "DECIMAL(38,10)": "(i % 5)::DECIMAL(38,10)",
    "VARCHAR": "'v' || (i % 5)", "BLOB": "('v' || (i % 5))::BLOB", "BIT": "(CASE WHEN i % 2 = 0 THEN '101' ELSE '1' END)::BIT",
    "DATE": "DATE '2024-01-01' + (i % 5)::INTEGER", "TIME": "TIME '10:00:00' + INTERVAL (i % 5) MINUTE",
    "TIME_NS": "(TIME '10:00:00' + INTERVAL (i % 5) MINUTE)::TIME_NS",
    "TIMETZ": "(TIME '10:00:00' + INTERVAL (i % 5) MINUTE)::TIMETZ",
    "TIMESTAMP": "TIMESTAMP '2024-01-01' + INTERVAL (i % 5) HOUR",
    "TIMESTAMP_S": "(TIMESTAMP '2024-01-01' + INTERVAL (i % 5) HOUR)::TIMESTAMP_S",
    "TIMESTAMP_MS": "(TIMESTAMP '2024-01-01' + INTERVAL (i % 5) HOUR)::TIMESTAMP_MS",
    "TIMESTAMP_NS": "(TIMESTAMP '2024-01-01' + INTERVAL (i % 5) HOUR)::TIMESTAMP_NS",
    "TIMESTAMPTZ": "(TIMESTAMP '2024-01-01' + INTERVAL (i % 5) HOUR)::TIMESTAMPTZ",
    "TIMESTAMPTZ_NS": "(TIMESTAMP '2024-01-01' + INTERVAL (i % 5) HOUR)::TIMESTAMPTZ_NS",
    "INTERVAL": "INTERVAL (i % 5) DAY", "UUID": "('00000000-0000-0000-0000-00000000000' || (i % 5))::UUID",
    "ENUM": "(['a', 'b', 'c'][i % 3 + 1])::mood", "LIST": "[i % 5, 1]", "ARRAY": "[i % 5, 1]::INTEGER[2]",
    "STRUCT": "{'f': i % 5}", "MAP": "MAP {'k': i % 5}", "UNION": "(i % 5)::INTEGER::UNION(n INTEGER, s VARCHAR)",
    "JSON": "('{\"a\":' || (i % 5) || '}')::JSON", "BIGNUM": "(i % 5)::BIGNUM",
    "NESTED": "{'tags': [{'k': i % 5}], 'm': MAP {'x': [i % 5]}}",
}
"""A value of every logical type DuckDB 2.0 can store in a column (VARINT is BIGNUM's old name)."""

KINDS = {
    "count": "SELECT COUNT(*) AS n FROM t WHERE c IS NOT NULL",
    "group": "SELECT c, COUNT(*) AS n FROM t GROUP BY c",
    "sum": "SELECT SUM(c) AS s FROM t",
    "min": "SELECT MIN(c) AS s FROM t",
    "distinct": "SELECT COUNT(DISTINCT c) AS n FROM t",
}


@pytest.fixture(scope="module")
def every_type():
    con = duckdb.connect()
    con.execute("CREATE TYPE mood AS ENUM ('a', 'b', 'c')")
    columns = ", ".join(f'{value} AS "{name.lower()}"' for name, value in TYPES.items())
    con.execute(f"CREATE TABLE every AS SELECT i AS uid, {columns} FROM range(120) r(i)")
    return con


def test_the_type_list_covers_duckdb_storable_types(every_type):
    """Every type duckdb_types() lists that a column can hold has a value above (aliases aside)."""
    stored = {t.split("(")[0].split("[")[0] for t in
              (r[0] for r in every_type.execute("SELECT data_type FROM information_schema.columns "
                                                "WHERE table_name = 'every'").fetchall())}
    listed = {r[0].upper() for r in every_type.execute("SELECT DISTINCT type_name FROM duckdb_types() "
                                                       "WHERE logical_type NOT IN ('INVALID', 'ANY', 'USER', 'UNKNOWN')")
              .fetchall()}
    canonical = {r[0] for r in every_type.execute("SELECT DISTINCT logical_type FROM duckdb_types()").fetchall()}
    missing = {t for t in canonical if t not in stored and t not in
               {"INVALID", "ANY", "USER", "UNKNOWN", "SQLNULL", "NULL", "TUPLE", "POINTER", "VALIDITY", "TABLE", "LAMBDA", "STRING_LITERAL",
                "INTEGER_LITERAL", "AGGREGATE_STATE", "TYPE", "VARIANT", "GEOMETRY", "VARINT", "TIMESTAMP_TZ", "TIME_TZ",
                "CHAR", "TIMESTAMP_SEC", "TIMESTAMP_MS", "TIMESTAMP_NS", "TIME_NS", "UNION", "ENUM", "STRUCT", "MAP",
                "LIST", "ARRAY", "BIT", "INTERVAL", "UUID", "BLOB", "DECIMAL"}}
    assert "BIGNUM" in stored and "JSON" in stored and listed
    assert not missing, f"logical types with no column in TYPES: {sorted(missing)}"


@pytest.mark.parametrize("kind", sorted(KINDS))
@pytest.mark.parametrize("name", sorted(TYPES))
def test_every_type_is_handled_or_refused_by_name(every_type, name, kind):
    column = name.lower()
    sql = KINDS[kind].replace("FROM t", "FROM every").replace("c IS", f'"{column}" IS').replace("(c)", f'("{column}")') \
        .replace("DISTINCT c)", f'DISTINCT "{column}")').replace("SELECT c,", f'SELECT "{column}",') \
        .replace("BY c", f'BY "{column}"')
    policy = ("BUDGET EPSILON 100000 DELTA 0.5; PRIVATE TABLE every (PRIVACY UNIT uid, MAX ROWS PER UNIT 1);")
    with dpsql.connect(every_type, policy=policy, rng=SeededSource(3)) as db:
        try:
            rows = db.sql(sql, epsilon=1, delta=1e-3).fetchall()
        except DPError as error:
            text = str(error)
            assert not text.startswith(("Binder Error", "Conversion Error", "Invalid Input")), text
            named = [column, db.columns("every")[column].split("(")[0].split("[")[0]]
            assert any(n.lower() in text.lower() for n in named), f"refusal does not name {named}: {text}"
            assert "Hint:" in text, f"refusal says nothing of what to write instead: {text}"
            return
    assert rows, f"{name} {kind}: no rows"
    if kind == "count":
        assert abs(rows[0][0] - 120) < 30


@pytest.mark.parametrize("name", sorted(TYPES))
def test_every_type_with_bounds_is_handled_or_refused_by_name(every_type, name):
    """A policy BOUNDS on a column of each type: numeric types sum, others are a PolicyError."""
    column = name.lower()
    policy = (f'BUDGET EPSILON 100000 DELTA 0.5; PRIVATE TABLE every (PRIVACY UNIT uid, MAX ROWS PER UNIT 1, '
              f'"{column}" BOUNDS 0 TO 10);')
    try:
        db = dpsql.connect(every_type, policy=policy, rng=SeededSource(3))
    except PolicyError as error:
        assert column in str(error) and "BOUNDS need a numeric column" in str(error)
        assert name not in {"TINYINT", "INTEGER", "HUGEINT", "UHUGEINT", "DOUBLE", "DECIMAL(10,2)"}
        return
    with db:
        total = db.sql(f'SELECT SUM("{column}") AS s FROM every', epsilon=10).fetchall()[0][0]
    assert abs(total - 240) < 30  # 0..4 over 120 units: 24 of each


# ---------------------------------------------------------------------------------------------
# Field names and enum values as DuckDB writes them in type names (quotes, commas, brackets)

NAMES = st.text(alphabet=st.sampled_from(list("abcXY _,()'\"[]é1")), min_size=1, max_size=8).filter(
    lambda s: s.strip() == s and s.strip())


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(fields=st.lists(NAMES, min_size=1, max_size=3, unique_by=str.lower), pick=st.integers(0, 2))
def test_struct_fields_with_any_name_bind_as_duckdb_reads_them(fields, pick):
    field = fields[pick % len(fields)]
    quoted = ['"' + f.replace('"', '""') + '"' for f in fields]
    packed = ", ".join(f"{q} := CAST(i % {n + 2} AS INTEGER)" for n, q in enumerate(quoted))
    con = duckdb.connect()
    con.execute(f"CREATE TABLE t AS SELECT i AS uid, struct_pack({packed}) AS s FROM range(60) r(i)")
    index = fields.index(field)
    written = "s." + quoted[index]
    truth = exact(con, f"SELECT COUNT(*) FROM t WHERE {written} = 1")[0][0]
    literal = "'" + field.replace("'", "''") + "'"
    with connect(con) as db:
        for form in (written, f"s[{literal}]", f"struct_extract(s, {literal})"):
            noisy = db.sql(f"SELECT COUNT(*) AS n FROM t WHERE {form} = 1", epsilon=100).fetchall()[0][0]
            assert abs(noisy - truth) < 3, form


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(values=st.lists(NAMES, min_size=1, max_size=4, unique=True))
def test_enum_domain_is_every_value_as_written(values):
    con = duckdb.connect()
    listed = ", ".join("'" + v.replace("'", "''") + "'" for v in values)
    con.execute(f"CREATE TYPE e AS ENUM ({listed})")
    con.execute(f"CREATE TABLE t AS SELECT i AS uid, (ARRAY[{listed}])[1]::e AS v FROM range(30) r(i)")
    with connect(con) as db:
        rows = db.sql("SELECT v, COUNT(*) AS n FROM t GROUP BY v", epsilon=1, delta=0).fetchall()
    assert [r[0] for r in rows] == values


# ---------------------------------------------------------------------------------------------
# Padding: statistics of nested fields and of the other types decide no filter


PROBES = {
    "m": "m = 'happy'", "u": "u = 'ffffffff-0000-0000-0000-000000000000'", "iv": "iv = INTERVAL 400 DAY",
    "bl": "bl = '\\x7A\\x7A'::BLOB", "tn": "tn = '23:00:00'::TIME_NS", "meta": "meta.n = 424242",
    "l": "list_contains(l, 424242)", "l1": "l[1] = 424242", "mp": "mp['a'] = 424242",
    "nested": "list_contains(meta.tags, 424242)", "j": "j = '[1]'::JSON",
    "tzn": "tzn = '2030-01-01'::TIMESTAMPTZ_NS",
}


def test_padding_rows_leave_statistics_nothing_to_prune_in_any_type():
    con = duckdb.connect()
    con.execute("CREATE TYPE mood AS ENUM ('sad', 'ok', 'happy')")
    con.execute("""CREATE TABLE t AS SELECT i AS uid, (['sad', 'ok'][i % 2 + 1])::mood AS m,
        ('00000000-0000-0000-0000-00000000000' || (i % 5))::UUID AS u, INTERVAL (i % 5) DAY AS iv,
        ('x' || i)::BLOB AS bl, (TIME '10:00' + INTERVAL (i) SECOND)::TIME_NS AS tn,
        {'n': i % 5, 'tags': [i % 3]} AS meta, [i % 5] AS l, MAP {'a': i % 5} AS mp, (i % 5)::VARCHAR::JSON AS j,
        (TIMESTAMP '2024-01-01' + INTERVAL (i % 5) HOUR)::TIMESTAMPTZ_NS AS tzn FROM range(1000) r(i)""")
    with connect(con) as db:
        db.sql("SELECT COUNT(*) AS n FROM t", epsilon=1).fetchall()
    copy = con.execute("SELECT table_name FROM duckdb_tables() WHERE database_name = 'dp_bounding'").fetchall()[0][0]
    source = f'(SELECT * FROM dp_bounding."{copy}" WHERE NOT dp_pad)'
    for name, probe in PROBES.items():
        raw = con.execute(f"EXPLAIN SELECT COUNT(*) FROM t WHERE {probe}").fetchall()[0][1]
        padded = con.execute(f"EXPLAIN SELECT COUNT(*) FROM {source} WHERE COALESCE(TRY({probe}), FALSE)").fetchall()[0][1]
        assert "EMPTY_RESULT" in raw.upper().replace(" ", "_"), name  # what the padding prevents
        assert "EMPTY_RESULT" not in padded.upper().replace(" ", "_"), name


# ---------------------------------------------------------------------------------------------
# TIMESTAMPTZ: date parts in the stated time zone (UTC), whatever the machine's


def test_timestamptz_parts_are_taken_in_utc_whatever_the_machine_zone(monkeypatch):
    import datetime
    import time
    monkeypatch.setenv("TZ", "Asia/Tokyo")
    time.tzset()
    try:
        frame = pd.DataFrame({"uid": range(100),
                              "ts": [datetime.datetime(2024, 1, 1, 23, 30, tzinfo=datetime.timezone.utc)] * 100})
        with connect({"t": frame}) as db:
            hours = db.sql("SELECT date_part('hour', ts) AS h, COUNT(*) AS n FROM t GROUP BY h", epsilon=5,
                           delta=1e-3).fetchall()
            days = db.sql("SELECT date_trunc('day', ts) AS d, COUNT(*) AS n FROM t GROUP BY d", epsilon=5,
                          delta=1e-3).fetchall()
            hardening = db._engine.hardening
            plan = db.explain("SELECT date_part('hour', ts) AS h, COUNT(*) AS n FROM t GROUP BY h", epsilon=5,
                              delta=1e-3)
        assert duckdb.connect().execute("SELECT current_setting('TimeZone')").fetchone()[0] == "Asia/Tokyo"
    finally:
        monkeypatch.delenv("TZ")
        time.tzset()
    assert [h for h, _ in hours] == [23]  # Tokyo would say 8
    assert [d for d, _ in days] == [datetime.datetime(2024, 1, 1, tzinfo=datetime.timezone.utc)]
    assert hardening["TimeZone"] == "UTC" and hardening["lock_configuration"] == "true"
    assert "time zone: ts (TIMESTAMP WITH TIME ZONE) are read in UTC" in plan


def test_policy_bounds_on_a_struct_field_are_refused_with_the_view_that_works():
    con = database()
    with pytest.raises(PolicyError, match="not a field of the STRUCT meta.*CLAMP\\(meta.f, lo, hi\\).*view"):
        connect(con, "meta.n BOUNDS 0 TO 4")
    con.execute("CREATE VIEW v AS SELECT uid, meta.n AS n FROM t")
    policy = "BUDGET EPSILON 100; PRIVATE TABLE v (PRIVACY UNIT uid, MAX ROWS PER UNIT 1, n BOUNDS 0 TO 4);"
    with dpsql.connect(con, policy=policy, rng=SeededSource(1)) as db:
        total = db.sql("SELECT SUM(n) AS s FROM v", epsilon=50).fetchall()[0][0]
    assert abs(total - exact(con, "SELECT SUM(meta.n) FROM t")[0][0]) < 10


def test_struct_field_as_join_key_with_a_public_table():
    con = database()
    con.execute("CREATE TABLE p AS SELECT i::BIGINT AS id, 'label' || i AS label FROM range(5) r(i)")
    policy = POLICY.format(rules="") + " PUBLIC TABLE p;"
    with dpsql.connect(con, policy=policy, rng=SeededSource(1)) as db:
        rows = db.sql("SELECT p.label, COUNT(*) AS n FROM t JOIN p ON t.meta.n = p.id GROUP BY p.label ORDER BY 1",
                      epsilon=50, delta=1e-6).fetchall()
        with pytest.raises(UnsupportedQuery, match="has no field nope"):
            db.sql("SELECT COUNT(*) FROM t JOIN p ON t.meta.nope = p.id", epsilon=1)
    assert [r[0] for r in rows] == [f"label{i}" for i in range(5)]
    assert all(abs(n - 40) < 5 for _, n in rows)


# ---------------------------------------------------------------------------------------------
# UUID, INTERVAL, TIMESTAMPTZ, HUGEINT, UHUGEINT, DECIMAL: listed KEYS (zero rows included), BOUNDS


@pytest.mark.parametrize("column, keys, expected", [
    ("u", "'00000000-0000-0000-0000-000000000001', 'ffffffff-ffff-ffff-ffff-ffffffffffff'",
     ["00000000-0000-0000-0000-000000000001", "ffffffff-ffff-ffff-ffff-ffffffffffff"]),
    ("iv", "'1 day', '1 month'", ["1 day", "1 month"]),
    ("tz", "'2024-01-01 01:00:00+00', '2024-01-01 05:00:00+00'",
     ["2024-01-01 01:00:00+00:00", "2024-01-01 05:00:00+00:00"]),
    ("h", "10000000000000000000000, 170141183460469231731687303715884105727",
     ["10000000000000000000000", "170141183460469231731687303715884105727"]),
    ("uh", "1, 340282366920938463463374607431768211455", ["1", "340282366920938463463374607431768211455"]),
    ("d", "0.25, 0.75", ["0.25", "0.75"]),
])
def test_listed_keys_of_wide_and_temporal_types_release_every_key(column, keys, expected):
    con = duckdb.connect()
    con.execute("""CREATE TABLE t AS SELECT i AS uid, ('00000000-0000-0000-0000-00000000000' || (i % 3))::UUID AS u,
        INTERVAL (i % 3) DAY AS iv, TIMESTAMPTZ '2024-01-01 00:00:00+00' + INTERVAL (i % 3) HOUR AS tz,
        (i % 3)::HUGEINT * 10000000000000000000000 AS h, (i % 3)::UHUGEINT AS uh,
        (i % 3)::DECIMAL(10,2) / 4 AS d FROM range(90) r(i)""")
    with connect(con, f"{column} KEYS ({keys})") as db:
        rows = db.sql(f"SELECT {column}, COUNT(*) AS n FROM t GROUP BY {column} ORDER BY {column}", epsilon=50,
                      delta=0).fetchall()
    assert [str(k) for k, _ in rows] == expected
    assert abs(rows[0][1] - 30) < 5 and abs(rows[1][1]) < 5  # the second key has no row


@pytest.mark.parametrize("type_name, value", [("HUGEINT", "170141183460469231731687303715884105727"),
                                              ("UHUGEINT", "340282366920938463463374607431768211455"),
                                              ("DECIMAL(38,10)", "9999999999999999999999999999.9999999999")])
def test_bounds_on_wide_numeric_types_clamp_extreme_values(type_name, value):
    con = duckdb.connect()
    con.execute(f"CREATE TABLE t AS SELECT i AS uid, CAST(CASE WHEN i = 0 THEN '{value}' ELSE '2' END AS {type_name}) AS x "
                "FROM range(100) r(i)")
    with connect(con, "x BOUNDS 0 TO 10") as db:
        total = db.sql("SELECT SUM(x) AS s FROM t", epsilon=50).fetchall()[0][0]
    assert abs(total - (99 * 2 + 10)) < 5  # the extreme value is clamped to 10


@pytest.mark.parametrize("expression", ["CLAMP(uid, 0, 100)", "CLAMP(list_count(l), 0, 5)", "CLAMP(uid, 0, 4) * 2 - 1",
                                        "CLAMP(len(l) + 1, 0, 9)", "CLAMP(b::INT, 0, 1)"])
def test_a_sum_of_an_integer_expression_is_an_integer(expression):
    """An integer-typed expression clamped to integer bounds sums on a grid of 1 (no column
    BOUNDS needed): the release is a HUGEINT, like DuckDB's SUM of an integer, with the noise
    of the integer grid (scale k·max|bound|/ε)."""
    with connect(database()) as db:
        result = db.sql(f"SELECT SUM({expression}) AS s FROM t", epsilon=1)
        (value,), = result.fetchall()
        assert result.types == ["HUGEINT"] and isinstance(value, int)


def test_a_sum_of_a_fractional_clamp_stays_double():
    with connect(database()) as db:
        result = db.sql("SELECT SUM(CLAMP(uid, 0, 100.5)) AS s, SUM(CLAMP(uid / 2, 0, 100)) AS h FROM t", epsilon=1)
        assert result.types == ["DOUBLE", "DOUBLE"]


@pytest.mark.parametrize("where, literal", [("uid > 'abc'", "abc"), ("uid IN (1, 'x')", "x"),
                                            ("uid BETWEEN '1' AND 'z'", "z"),
                                            ("uid <> 3 AND (uid < '1.5e' OR uid = 2)", "1.5e")])
def test_a_constant_that_does_not_cast_to_the_column_type_is_refused_before_the_charge(where, literal):
    """DuckDB raises a Conversion Error at bind for these; dpsql's TRY would make every row
    fail the test silently (an answer of ~0, charged). Refused, naming the literal and type."""
    with connect(database()) as db:
        with pytest.raises(UnsupportedQuery) as caught:
            db.sql(f"SELECT COUNT(*) AS n FROM t WHERE {where}", epsilon=1)
        assert f"the constant '{literal}' is not a valid" in str(caught.value)
        assert "BIGINT" in str(caught.value)
        assert db.budget.spent.epsilon == 0
        with pytest.raises(duckdb.ConversionException):  # DuckDB itself refuses the same query
            database().execute(f"SELECT COUNT(*) FROM t WHERE {where}").fetchall()
        # DuckDB compares an ENUM with a string as text (no error, no match): so does dpsql
        sql = "SELECT COUNT(*) AS n FROM t WHERE m <> 'angry' AND uid > '3' AND uid IN ('1', '2', 5)"
        assert database().execute(sql).fetchall() == [(1,)]
        (n,), = db.sql(sql, epsilon=1).fetchall()
        assert isinstance(n, int)


# -- the two numeric predicates, side by side: where they differ is on purpose ------------

@pytest.mark.parametrize("type_name, numeric, as_number, as_integer", [
    ("TINYINT", True, True, True), ("SMALLINT", True, True, True), ("INTEGER", True, True, True),
    ("BIGINT", True, True, True), ("HUGEINT", True, True, True), ("UTINYINT", True, True, True),
    ("USMALLINT", True, True, True), ("UINTEGER", True, True, True), ("UBIGINT", True, True, True),
    ("FLOAT", True, True, False), ("REAL", True, True, False), ("DOUBLE", True, True, False),
    ("DECIMAL(18,3)", True, True, False),
    ("VARCHAR", False, False, False), ("DATE", False, False, False), ("TIMESTAMP", False, False, False),
    ("INTEGER[]", False, False, False), ("INTERVAL", False, False, False),
    # The catalog never names these; casts as sqlglot writes them do, and BOOLEAN reads as 0 / 1.
    ("BOOLEAN", False, True, True), ("INT", False, True, True), ("FLOAT4", False, True, False),
])
def test_numeric_type_predicates(type_name, numeric, as_number, as_integer):
    assert is_numeric_type(type_name) is numeric
    assert reads_as_number(type_name) is as_number
    assert reads_as_integer(type_name) is as_integer
