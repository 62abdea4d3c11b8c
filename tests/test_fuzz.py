"""Fuzzing (issue 6, item 9): Hypothesis-generated SQL, valid and invalid.

Every generated query runs on two databases whose private rows differ completely (sizes,
values, users), with the same public tables and the same seeded noise, and with every exact
input of the release step replaced by zero. Then:

* it ends in a result or a ``DPError``, never any other exception;
* both databases end the same way, with the same message and, for answers, the same values:
  with the exact aggregates zeroed, anything that still differs came from private data by a
  path other than the noisy release — an exact private value, or a data-dependent error;
* a refusal charges nothing; an answer over private data is charged (or a free repeat).

The generator leans on what breaks SQL engines: failing casts, division by zero, overflow,
huge and odd literals, NULLs, forbidden functions, table functions, catalogs, stacked and
non-query statements, truncated and mangled text.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import dpsql
import dpsql.query.answering
from dpsql.mechanisms.noise import SeededSource

POLICY = """
BUDGET EPSILON 1000000 DELTA 0.5;
QUERY EPSILON 1;
PRIVATE TABLE visits (PRIVACY UNIT user_id, MAX ROWS PER UNIT 4, MAX GROUPS PER UNIT 2,
                      amount BOUNDS 0 TO 500, age BOUNDS 18 TO 90, store KEYS FROM stores.store);
PUBLIC TABLE stores;
"""
STORES = pd.DataFrame({"store": ["north", "south", "east"], "city": ["a", "b", "b"]})


def private(seed: int, users: int) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    n = users * 3
    amounts = rng.choice([0.0, 1.5, 499.0, 1e9, -3.0, math.nan, math.inf, None, -0.0], n)
    return pd.DataFrame({
        "user_id": rng.integers(1, users + 1, n),
        "store": rng.choice(["north", "south", "east", "elsewhere", None], n),
        "amount": pd.array(amounts, dtype="float64"),
        "age": rng.integers(0, 120, n),
        "zip": rng.choice(["1", "x", "2020-01-01", "", "99999999999"], n),
        "note": rng.choice(["a", "b" * 50, "%", "'"], n),
    })


DATABASES = [private(1, 40), private(2, 7)]
"""Two private tables that differ in every way an analyst could try to observe."""

# ------------------------------------------------------------------------------------------
# The SQL generator.

NUMBER_COLUMNS = ["amount", "age", "user_id"]
TEXT_COLUMNS = ["store", "zip", "note"]
LITERALS = ["0", "1", "-1", "2.5", "1e308", "-1e308", "9223372036854775807", "170141183460469231731687303715884105727",
            "NULL", "0.0", "-0.0", "'x'", "'2020-01-01'", "''", "TRUE"]
TYPES = ["INTEGER", "TINYINT", "BIGINT", "HUGEINT", "DOUBLE", "VARCHAR", "DATE", "DECIMAL(38, 2)", "INTEGER[]",
         "BOOLEAN", "TIMESTAMP"]
FUNCTIONS = ["abs", "round", "floor", "ceil", "length", "lower", "upper", "strlen", "isnan", "year", "repeat",
             "hash", "random", "getenv", "regexp_matches", "error", "range", "current_setting", "md5", "sqrt"]

leaf = st.one_of(st.sampled_from(NUMBER_COLUMNS + TEXT_COLUMNS), st.sampled_from(LITERALS),
                 st.integers(-10**20, 10**20).map(str), st.floats(allow_nan=False).map(repr))


def _extend(inner):
    return st.one_of(
        st.tuples(inner, st.sampled_from(["+", "-", "*", "/", "//", "%", "||"]), inner).map(lambda t: f"({t[0]} {t[1]} {t[2]})"),
        st.tuples(inner, st.sampled_from(TYPES)).map(lambda t: f"CAST({t[0]} AS {t[1]})"),
        st.tuples(inner, st.sampled_from(TYPES)).map(lambda t: f"TRY_CAST({t[0]} AS {t[1]})"),
        st.tuples(st.sampled_from(FUNCTIONS), inner).map(lambda t: f"{t[0]}({t[1]})"),
        st.tuples(inner, inner, inner).map(lambda t: f"CASE WHEN {t[0]} > {t[1]} THEN {t[1]} ELSE {t[2]} END"),
        st.tuples(inner, inner).map(lambda t: f"COALESCE({t[0]}, {t[1]})"),
        st.tuples(inner, inner).map(lambda t: f"LEAST({t[0]}, {t[1]})"),
    )


expression = st.recursive(leaf, _extend, max_leaves=6)

condition = st.one_of(
    st.tuples(expression, st.sampled_from(["=", "<>", "<", ">=", "IS DISTINCT FROM"]), expression).map(" ".join),
    st.tuples(expression, st.sampled_from(["'%a%'", "'x'", "note", "'%'"])).map(lambda t: f"{t[0]} LIKE {t[1]}"),
    st.tuples(expression, expression).map(lambda t: f"{t[0]} IN ({t[1]}, 1, 'x')"),
    expression.map(lambda e: f"{e} IS NULL"),
    st.tuples(expression, expression).map(lambda t: f"{t[0]} BETWEEN 0 AND {t[1]}"),
    st.just("user_id IN (SELECT user_id FROM visits)"),
)

aggregate = st.one_of(
    st.just("COUNT(*)"),
    st.tuples(st.sampled_from(["COUNT", "SUM", "AVG", "MEDIAN", "MIN", "MAX", "VARIANCE", "STDDEV"]), expression)
    .map(lambda t: f"{t[0]}({t[1]})"),
    expression.map(lambda e: f"COUNT(DISTINCT {e})"),
    st.tuples(expression, condition).map(lambda t: f"SUM({t[0]}) FILTER (WHERE {t[1]})"),
    st.tuples(expression, st.sampled_from(["0.1", "0.5", "2", "-1"])).map(lambda t: f"QUANTILE_CONT({t[0]}, {t[1]})"),
    st.sampled_from(["COUNT(DISTINCT user_id)", "string_agg(note, ',')", "SUM(amount) OVER ()", "list(amount)"]),
)

source = st.sampled_from([
    "visits", "visits", "visits", "stores", "VISITS", "main.visits", "visits AS v",
    "visits v JOIN stores s ON v.store = s.store",
    "(SELECT user_id, amount, store FROM visits WHERE age > 30) AS t",
    "(SELECT user_id, COUNT(*) AS amount FROM visits GROUP BY user_id) AS t",
    "(SELECT user_id, amount FROM visits UNION ALL SELECT user_id, age AS amount FROM visits) AS t",
    "read_csv('/etc/passwd')", "duckdb_tables()", "secrets", "information_schema.tables",
    "visits a JOIN visits b ON a.user_id = b.user_id", "visits, stores", "glob('*')",
])


@st.composite
def query(draw) -> str:
    items = draw(st.lists(st.one_of(aggregate, aggregate, expression, st.just("*"), st.just("store")),
                          min_size=1, max_size=3))
    sql = f"SELECT {', '.join(items)} FROM {draw(source)}"
    if draw(st.booleans()):
        sql += f" WHERE {draw(condition)}"
    group = draw(st.sampled_from(["", "", " GROUP BY store", " GROUP BY zip", " GROUP BY 1", " GROUP BY user_id"]))
    sql += group
    if group and draw(st.booleans()):
        sql += f" HAVING {draw(aggregate)} > {draw(st.sampled_from(['0', '1e9', 'NULL']))}"
    if draw(st.booleans()):
        sql += draw(st.sampled_from([" ORDER BY 1", " ORDER BY amount", " LIMIT 1", " ORDER BY 1 DESC LIMIT 2 OFFSET 1"]))
    mangle = draw(st.sampled_from(["none"] * 6 + ["truncate", "stack", "prefix", "comment", "option", "garbage"]))
    if mangle == "truncate":
        sql = sql[: draw(st.integers(0, len(sql)))]
    elif mangle == "stack":
        sql += draw(st.sampled_from(["; DROP TABLE visits", "; SELECT amount FROM visits", ";"]))
    elif mangle == "prefix":
        sql = draw(st.sampled_from(["EXPLAIN ", "EXPLAIN ANALYZE ", "COPY (", "CREATE TABLE x AS ", "PIVOT "])) + sql
    elif mangle == "comment":
        sql = sql.replace(" FROM ", " /* FROM secrets */ FROM ", 1) + " -- ' \""
    elif mangle == "option":
        sql = sql.replace("SELECT ", "SELECT WITH DIFFERENTIAL_PRIVACY OPTIONS (epsilon = "
                          + draw(st.sampled_from(["0.5", "-1", "1e999", "0", "nan"])) + ") ", 1)
    elif mangle == "garbage":
        position = draw(st.integers(0, len(sql)))
        sql = sql[:position] + draw(st.sampled_from(["'", ")", "(", "\x00", "$1", "?", "\\", "🙂", "SELECT"])) + sql[position:]
    return sql


safe_leaf = st.one_of(st.sampled_from(["amount", "age", "user_id", "1", "0", "-1", "2.5", "NULL", "1e9"]),
                      st.integers(-1000, 1000).map(str))
safe_expression = st.recursive(safe_leaf, lambda inner: st.one_of(
    st.tuples(inner, st.sampled_from(["+", "-", "*", "//", "%"]), inner).map(lambda t: f"({t[0]} {t[1]} {t[2]})"),
    st.tuples(inner, st.sampled_from(["INTEGER", "TINYINT", "DOUBLE", "BIGINT"])).map(lambda t: f"CAST({t[0]} AS {t[1]})"),
    st.tuples(condition, inner, inner).map(lambda t: f"CASE WHEN {t[0]} THEN {t[1]} ELSE {t[2]} END"),
    st.tuples(inner, inner).map(lambda t: f"COALESCE({t[0]}, {t[1]})"),
), max_leaves=4)
bounded_value = st.one_of(st.sampled_from(["amount", "age", "CLAMP(user_id, 0, 9)"]),
                          st.tuples(condition, st.sampled_from(["amount", "age", "1"]))
                          .map(lambda t: f"CASE WHEN {t[0]} THEN {t[1]} ELSE 0 END"))


@st.composite
def plausible(draw) -> str:
    """A query an analyst might send, with hostile details: most of these are answered."""
    items = draw(st.lists(st.one_of(
        st.just("COUNT(*)"), safe_expression.map(lambda e: f"COUNT({e})"),
        st.tuples(st.sampled_from(["SUM", "AVG", "MEDIAN", "VARIANCE", "MAX"]), bounded_value)
        .map(lambda t: f"{t[0]}({t[1]})"),
        st.tuples(bounded_value, condition).map(lambda t: f"SUM({t[0]}) FILTER (WHERE {t[1]})"),
        safe_expression.map(lambda e: f"COUNT(DISTINCT {e})")), min_size=1, max_size=3))
    grouped = draw(st.booleans())
    sql = f"SELECT {'store, ' if grouped else ''}{', '.join(items)} FROM "
    sql += draw(st.sampled_from(["visits", "visits", "(SELECT user_id, amount, age, store, zip, note FROM visits "
                                 "WHERE amount > 1) AS t", "visits v JOIN stores s ON v.store = s.store"]))
    if draw(st.booleans()):
        sql += f" WHERE {draw(st.one_of(condition, safe_expression.map(lambda e: f'{e} > 0')))}"
    if grouped:
        sql += " GROUP BY store"
        if draw(st.booleans()):
            sql += " HAVING COUNT(*) > 2 ORDER BY 2 DESC LIMIT 2"
    return sql


options = st.fixed_dictionaries({}, optional={
    "epsilon": st.sampled_from([0.5, 1, 1e-3, 0, -1, float("nan"), float("inf"), "0.5"]),
    "delta": st.sampled_from([0, 1e-9, 1, -1e-9]),
})

# ------------------------------------------------------------------------------------------
# The property.


@pytest.fixture(scope="module")
def connections():
    """Connections to the two databases; the release step sees zeros instead of exact values."""
    patch = pytest.MonkeyPatch()
    release = dpsql.query.answering.release_measures

    def zeroed(plan, domain, exact, source=None, histograms=None):
        width = len(plan.query.keys)
        exact = [tuple(row[:width]) + (0,) * (len(row) - width) for row in exact]
        histograms = {name: [tuple(r[:-1]) + (0,) for r in rows] for name, rows in (histograms or {}).items()}
        return release(plan, domain, exact, source, histograms)

    patch.setattr(dpsql.query.answering, "release_measures", zeroed)
    opened = [dpsql.connect({"visits": frame, "stores": STORES}, policy=POLICY, query_timeout=10)
              for frame in DATABASES]
    yield opened
    for connection in opened:
        connection.close()
    patch.undo()


def observe(db, sql: str, seed: int, **kwargs):
    """What the analyst sees: ('answer', rows, cost) or (error class, message, charged)."""
    db._rng = SeededSource(seed)   # the same noise on both databases
    before = db.budget.spent
    try:
        result = db.sql(sql, **kwargs)
    except dpsql.DPError as error:
        return type(error).__name__, str(error), db.budget.spent != before
    rows = [tuple("nan" if isinstance(v, float) and math.isnan(v) else v for v in row) for row in result.fetchall()]
    return "answer", (result.columns, rows, result.exact), db.budget.spent != before


@settings(max_examples=150, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(sql=st.one_of(plausible(), query()), kwargs=options, seed=st.integers(0, 2**32))
def test_generated_sql_ends_in_a_result_or_a_dp_error_that_reveals_nothing(connections, sql, kwargs, seed):
    seen = [observe(db, sql, seed, **kwargs) for db in connections]   # anything else raises: a failure
    assert seen[0] == seen[1], f"private data shows through: {seen[0]!r} vs {seen[1]!r}"
    kind, detail, charged = seen[0]
    if kind == "answer":
        columns, rows, exact = detail
        if exact:
            assert not charged, "a public query was charged"
    elif kind != "QueryFailed":
        assert not charged, f"{kind} charged the budget: {detail}"


@pytest.mark.parametrize("depth", [70, 400])
def test_deeply_nested_sql_ends_in_a_dp_error(connections, depth):
    sql = "SELECT COUNT(*) FROM visits WHERE " + "(" * depth + "age" + ")" * depth + " > 0"
    with pytest.raises(dpsql.DPError):
        connections[0].sql(sql)
