"""The normaliser behind free repeats: ways of writing one question meet, different questions
stay apart, the normal form is stable, and it means what the original means on DuckDB."""

from __future__ import annotations

import duckdb
import pytest
import sqlglot
from hypothesis import given, settings
from hypothesis import strategies as st

from dpsql.sql.normalise import normalise, normalised_sql, repeat_key

COLUMNS = frozenset({"user_id", "store", "amount", "age", "day"})


def normal(sql: str, columns=COLUMNS) -> str:
    return normalised_sql(sqlglot.parse_one(sql, read="duckdb"), columns)


SAME = [
    # whitespace, comments and keyword case
    ("SELECT COUNT(*) FROM visits WHERE amount > 3",
     "select   count(*)\n  from VISITS -- a comment\n where AMOUNT>3"),
    # identifier case and quoting (DuckDB resolves both case-insensitively)
    ('SELECT SUM("Amount") FROM "Visits"', "SELECT sum(amount) FROM visits"),
    # the default schema
    ("SELECT COUNT(*) FROM main.visits", "SELECT COUNT(*) FROM visits"),
    # table aliases of a lone table, and qualifiers
    ("SELECT COUNT(*) FROM visits v WHERE v.amount > 1 AND v.store = 'a'",
     "SELECT COUNT(*) FROM visits AS w WHERE w.amount > 1 AND store = 'a'"),
    ("SELECT COUNT(*) FROM visits WHERE visits.age < 30", "SELECT COUNT(*) FROM visits WHERE age < 30"),
    # select-list alias names, referenced or not
    ("SELECT store, COUNT(*) AS n FROM visits GROUP BY store ORDER BY n DESC",
     "SELECT store, COUNT(*) AS visits_per_store FROM visits GROUP BY store ORDER BY visits_per_store DESC"),
    ("SELECT COUNT(*) AS n FROM visits", "SELECT COUNT(*) FROM visits"),
    ("SELECT store AS s, COUNT(*) FROM visits GROUP BY s", "SELECT store AS k, COUNT(*) FROM visits GROUP BY k"),
    # commutative predicates, at any depth of AND / OR nesting
    ("SELECT COUNT(*) FROM visits WHERE store = 'a' AND age > 30 AND amount <= 5",
     "SELECT COUNT(*) FROM visits WHERE (5 >= amount AND 'a' = store) AND 30 < age"),
    ("SELECT COUNT(*) FROM visits WHERE store = 'a' OR store = 'b'",
     "SELECT COUNT(*) FROM visits WHERE 'b' = store OR (store = 'a')"),
    ("SELECT COUNT(*) FROM visits WHERE (age > 1 OR age < 0) AND store <> 'x'",
     "SELECT COUNT(*) FROM visits WHERE 'x' != store AND (0 > age OR 1 < age)"),
    ("SELECT COUNT(*) FROM visits WHERE store IN ('b', 'a', 'c')",
     "SELECT COUNT(*) FROM visits WHERE store IN ('c', 'a', 'b')"),
]

DIFFERENT = [
    ("SELECT COUNT(*) FROM visits WHERE amount > 3", "SELECT COUNT(*) FROM visits WHERE amount > 4"),
    ("SELECT COUNT(*) FROM visits WHERE amount > 3", "SELECT COUNT(*) FROM visits WHERE amount < 3"),
    ("SELECT COUNT(*) FROM visits WHERE amount > 3", "SELECT COUNT(*) FROM visits WHERE amount >= 3"),
    ("SELECT SUM(amount - age) FROM visits", "SELECT SUM(age - amount) FROM visits"),
    ("SELECT COUNT(*) FROM visits WHERE (age = 1 OR age = 2) AND store = 'a'",
     "SELECT COUNT(*) FROM visits WHERE age = 1 OR (age = 2 AND store = 'a')"),
    ("SELECT COUNT(*) FROM visits WHERE store = 'a'", "SELECT COUNT(*) FROM visits WHERE store = 'A'"),
    ("SELECT store, COUNT(*) AS n FROM visits GROUP BY store ORDER BY n",
     "SELECT store, COUNT(*) AS n FROM visits GROUP BY store ORDER BY n DESC"),
    ("SELECT store, COUNT(*) FROM visits GROUP BY store LIMIT 2",
     "SELECT store, COUNT(*) FROM visits GROUP BY store LIMIT 3"),
    ("SELECT COUNT(*), SUM(amount) FROM visits", "SELECT SUM(amount), COUNT(*) FROM visits"),
    ("SELECT COUNT(*) FROM visits", "SELECT COUNT(*) FROM users"),
    ("SELECT COUNT(amount) FROM visits", "SELECT COUNT(*) FROM visits"),
    # an alias named like a column is left alone: ORDER BY it might mean either
    ("SELECT store, COUNT(*) AS amount FROM visits GROUP BY store ORDER BY amount",
     "SELECT store, COUNT(*) AS n FROM visits GROUP BY store ORDER BY n"),
]


@pytest.mark.parametrize("first, second", SAME)
def test_ways_of_writing_one_question_meet(first, second):
    assert normal(first) == normal(second)


@pytest.mark.parametrize("first, second", DIFFERENT)
def test_different_questions_stay_apart(first, second):
    assert normal(first) != normal(second)


def test_the_normal_form_reads_as_sql():
    assert normal("SELECT Store, count(*) AS N FROM Visits v WHERE v.age > 30 GROUP BY 1 ORDER BY n") == (
        "SELECT store, COUNT(*) AS c1 FROM visits WHERE 30 < age GROUP BY 1 ORDER BY c1")
    assert normal('SELECT COUNT(*) FROM "My Table" WHERE "Order" > 1') == (
        'SELECT COUNT(*) FROM "my table" WHERE 1 < "order"')


def test_an_alias_named_like_a_column_is_kept_as_written():
    assert "AS amount" in normal("SELECT COUNT(*) AS amount FROM visits ORDER BY amount")
    assert "AS c0" in normal("SELECT COUNT(*) AS amount FROM visits ORDER BY amount", columns=())


def test_canonical_names_never_capture_a_column_or_another_name():
    # GROUP BY c0 would bind to a column c0: renaming alias s to c0 would change the meaning
    columns = COLUMNS | {"c0"}
    grouped = "SELECT store AS s, COUNT(*) FROM visits GROUP BY s"
    assert normal(grouped, columns) != normal("SELECT store AS c0, COUNT(*) FROM visits GROUP BY c0", columns)
    assert "AS s" in normal(grouped, columns)
    joined = "SELECT COUNT(*) FROM visits AS a JOIN t1 AS b ON a.store = b.store"
    assert "AS a" in normal(joined) and "AS b" in normal(joined)  # a table is called t1


def test_aliases_inside_subqueries_and_joins_are_not_renamed():
    sql = "SELECT COUNT(*) AS n FROM (SELECT v.store AS s FROM visits AS v) AS q ORDER BY n"
    assert "AS s" in normal(sql) and "AS v" in normal(sql) and "AS n" in normal(sql)
    joined = "SELECT COUNT(*) FROM visits AS a JOIN stores AS b ON a.store = b.store"
    assert normal(joined) == normal("SELECT COUNT(*) FROM visits AS x JOIN stores AS y ON y.store = x.store")
    assert "AS t0" in normal(joined) and "AS t1" in normal(joined)


def test_normal_forms_do_not_drift():
    """Stored answers are found by the hash of these exact texts: a faster normaliser must
    still write them character for character, or every earlier answer would be charged again."""
    assert normal("select count(*) /* c */ from MAIN.Visits where Amount > 3 -- x") == (
        "SELECT COUNT(*) FROM visits WHERE 3 < amount")
    assert normal("SELECT V.store AS S, COUNT(*) AS N FROM visits AS V JOIN Stores AS W ON W.store = V.store"
                  " WHERE W.city = 'x' GROUP BY S ORDER BY N DESC") == (
        "SELECT t0.store AS c0, COUNT(*) AS c1 FROM visits AS t0 JOIN stores AS t1 ON t0.store = t1.store"
        " WHERE 'x' = t1.city GROUP BY c0 ORDER BY c1 DESC")
    assert normal("SELECT store, SUM(amount) AS total, COUNT(*) FROM visits GROUP BY store"
                  " HAVING total > 10 ORDER BY total") == (
        "SELECT store, SUM(amount) AS c1, COUNT(*) FROM visits GROUP BY store HAVING 10 < c1 ORDER BY c1")
    assert normal("SELECT COUNT(*) FROM \"Main\".\"Visits\" AS t WHERE (t.age >= 30 AND (t.store <> 'a'))"
                  " OR t.amount IN (3, 1)") == (
        "SELECT COUNT(*) FROM visits WHERE ('a' <> store AND 30 <= age) OR amount IN (1, 3)")


def test_normalise_copies_its_input():
    tree = sqlglot.parse_one("SELECT COUNT(*) AS n FROM Visits v WHERE 3 < v.amount", read="duckdb")
    before = tree.sql()
    normalise(tree, COLUMNS)
    assert tree.sql() == before


PREDICATES = st.sampled_from([
    "amount > 3", "age <= 40", "store = 'a'", "store <> 'b'", "age IN (3, 1, 2)", "amount IS NULL",
    "(age = 1 OR age = 2)", "NOT store LIKE 'x%'", "amount + age < 100", "day >= DATE '2024-01-01'",
])


@settings(max_examples=60, deadline=None)
@given(st.lists(PREDICATES, min_size=1, max_size=5, unique=True), st.randoms(use_true_random=False))
def test_any_order_of_a_conjunction_has_one_normal_form(predicates, random):
    shuffled = list(predicates)
    random.shuffle(shuffled)
    first = normal("SELECT COUNT(*) FROM visits WHERE " + " AND ".join(predicates))
    second = normal("SELECT COUNT(*) FROM visits v WHERE " + " AND ".join(f"({p})" for p in shuffled))
    assert first == second
    assert normal(first) == first  # the normal form is a fixed point


# The rules must not change what a query means: run both forms on DuckDB (public data).
EXECUTED = [
    "SELECT store, COUNT(*) AS n FROM visits WHERE amount > 3 AND age < 50 GROUP BY store ORDER BY n DESC, store",
    "SELECT COUNT(*) FROM visits v WHERE 'a' = v.store OR (v.age >= 40 AND v.amount IS NOT NULL)",
    "SELECT SUM(amount) AS total FROM visits WHERE store IN ('b', 'a') AND NOT (age > 60)",
    "SELECT store AS s, AVG(age) AS a FROM visits GROUP BY s HAVING COUNT(*) > 1 ORDER BY s",
    "SELECT COUNT(*) FROM visits AS x JOIN stores AS y ON y.store = x.store WHERE y.city = 'p'",
]


@pytest.mark.parametrize("sql", EXECUTED)
def test_the_normal_form_means_the_same_on_duckdb(sql):
    con = duckdb.connect()
    con.execute("CREATE TABLE visits AS SELECT * FROM (VALUES (1, 'a', 5.0, 30), (2, 'b', 1.0, 45), "
                "(3, 'a', NULL, 61), (4, 'c', 9.5, 20), (5, 'b', 4.0, 33)) t(user_id, store, amount, age)")
    con.execute("CREATE TABLE stores AS SELECT * FROM (VALUES ('a', 'p'), ('b', 'q')) t(store, city)")
    columns = {"user_id", "store", "amount", "age", "city"}
    assert con.execute(normal(sql, columns)).fetchall() == con.execute(sql).fetchall()


def test_repeat_keys_differ_by_options_policy_and_analyst():
    base = dict(options={"epsilon": "1/10"}, policy_text="BUDGET EPSILON 1;", analyst=None)
    key = repeat_key("SELECT 1", **base)
    assert key == repeat_key("SELECT 1", **dict(base))
    for change in ({"options": {"epsilon": "1/5"}}, {"policy_text": "BUDGET EPSILON 2;"},
                   {"analyst": "alice"}):
        assert repeat_key("SELECT 1", **{**base, **change}) != key
    assert repeat_key("SELECT 2", **base) != key
