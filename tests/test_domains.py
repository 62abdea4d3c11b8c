"""Issue 13 items 4 and 6: public key domains that follow the query, and SQL DuckDB users write.

* WHERE conjuncts on one KEYS column narrow the released keys, evaluated by DuckDB on the
  public domain (its coercions, never re-implemented);
* ``MAX RELEASED KEYS`` / ``OPTIONS (max_keys = ...)`` refuse a flood before the charge;
* rows outside the domain are one more noisy cell (``res.outside_domain``), bounded like any
  group (brute force below), never lost;
* FROM subqueries without an alias; GROUP BY (and SELECT DISTINCT) with no aggregate.
"""

from __future__ import annotations

import itertools
import re

import duckdb
import pandas as pd
import pytest
from test_sensitivity_oracle import CASES, Oracle, _distance, _frozen, _units

import dpsql
from dpsql.analysis.analyse import QUANTILE_BUCKETS
from dpsql.backends.rewrite import rewrite_distinct, rewrite_histogram
from dpsql.errors import PolicyError, UnsupportedQuery
from dpsql.mechanisms.noise import SeededSource
from dpsql.policy.language import load_policy, policy_to_text
from dpsql.shell.render import answer_from

AIRPORTS = ["EWR", "JFK", "LGA", "BOS", "ATL"]


def flights(outside: int = 0, null: int = 0) -> pd.DataFrame:
    """One flight per aircraft (unit), so exact counts are known: origins EWR x 30, JFK x 20,
    LGA x 10; ``outside`` more from 'XXX' (not an airport), ``null`` more with no origin."""
    origins = ["EWR"] * 30 + ["JFK"] * 20 + ["LGA"] * 10 + ["XXX"] * outside + [None] * null
    return pd.DataFrame({"tail": range(len(origins)), "origin": origins,
                         "code": [i % 5 + 1 for i in range(len(origins))],
                         "delay": [i % 7 for i in range(len(origins))]})


POLICY = """BUDGET EPSILON 1000 DELTA 0.001; QUERY EPSILON 1;
PRIVATE TABLE flights (PRIVACY UNIT tail, MAX ROWS PER UNIT 1, MAX GROUPS PER UNIT 1,
    delay BOUNDS 0 TO 10, origin KEYS FROM airports.faa, code KEYS (1, 2, 3, 4));
PUBLIC TABLE airports;
"""


def connect(frame=None, policy=POLICY, seed=1, **tables):
    data = {"flights": flights() if frame is None else frame, "airports": pd.DataFrame({"faa": AIRPORTS}), **tables}
    return dpsql.connect(data, policy=policy, rng=SeededSource(seed))


def keys_of(result) -> list:
    return [row[0] for row in result.fetchall()]


# --- 1. narrowing -----------------------------------------------------------------------------

NARROWED = [
    ("origin IN ('EWR', 'JFK', 'LGA')", ["EWR", "JFK", "LGA"]),
    ("origin = 'JFK'", ["JFK"]),
    ("'JFK' = origin", ["JFK"]),
    ("origin BETWEEN 'BOS' AND 'JFK'", ["BOS", "EWR", "JFK"]),
    ("origin < 'C'", ["ATL", "BOS"]),
    ("origin >= 'LGA'", ["LGA"]),
    ("origin <> 'EWR'", ["ATL", "BOS", "JFK", "LGA"]),
    ("origin NOT IN ('EWR', 'JFK')", ["ATL", "BOS", "LGA"]),
    ("NOT origin = 'EWR'", ["ATL", "BOS", "JFK", "LGA"]),
    ("(origin = 'EWR' OR origin = 'LGA')", ["EWR", "LGA"]),
    ("origin LIKE 'J%'", ["JFK"]),
    ("lower(origin) = 'bos'", ["BOS"]),
    ("origin IN ('EWR', 'JFK') AND delay >= 0 AND origin <> 'JFK'", ["EWR"]),
    ("origin = 'XXX'", []),
]


@pytest.mark.parametrize("where, released", NARROWED)
def test_where_on_a_keys_column_narrows_the_released_keys(where, released):
    with connect() as db:
        result = db.sql(f"SELECT origin, COUNT(*) AS n FROM flights WHERE {where} GROUP BY origin")
        assert keys_of(result) == released
        explained = db.explain(f"SELECT origin, COUNT(*) AS n FROM flights WHERE {where} GROUP BY origin")
    assert "for which" in explained and "evaluated on the public domain when the query runs: free" in explained


INTEGER_KEYS = [
    ("code = '2'", [2]),              # the string is cast to the INTEGER column's type, as DuckDB does
    ("code IN ('1', '03')", [1, 3]),  # '03' is 3 for DuckDB; a string comparison would drop it
    ("code < '3'", [1, 2]),
    ("code BETWEEN 2.5 AND 10", [3, 4]),
    ("code = 2.0", [2]),
    ("code % 2 = 0", [2, 4]),
]


@pytest.mark.parametrize("where, released", INTEGER_KEYS)
def test_narrowing_coerces_as_duckdb_does(where, released):
    with connect() as db:
        assert keys_of(db.sql(f"SELECT code, COUNT(*) AS n FROM flights WHERE {where} GROUP BY code")) == released
    # DuckDB's own answer on the public domain, typed as the column: the same keys
    domain = duckdb.sql("SELECT * FROM (VALUES (1), (2), (3), (4)) AS d(code)")
    assert [r[0] for r in duckdb.sql(f"SELECT code FROM domain WHERE {where} ORDER BY code").fetchall()] == released


@pytest.mark.parametrize("where", [
    "origin = 'EWR' OR delay > 3",          # an OR with another column: not about the key alone
    "delay > 3",
    "origin < CAST(delay AS VARCHAR)",      # the key and another column
])
def test_conjuncts_about_other_columns_do_not_narrow(where):
    with connect() as db:
        assert keys_of(db.sql(f"SELECT origin, COUNT(*) AS n FROM flights WHERE {where} GROUP BY origin")) == \
            sorted(AIRPORTS)


def test_narrowing_is_free_and_the_narrowed_cells_are_exact_in_expectation():
    """Narrowing reads the public domain only: the cost is the query's, the cells the same."""
    sql = "SELECT origin, COUNT(*) AS n FROM flights WHERE origin IN ('EWR', 'JFK') GROUP BY origin"
    with connect() as db:
        result = db.sql(sql, epsilon=50)
        assert result.cost.epsilon == 50
        assert dict(result.fetchall()) == pytest.approx({"EWR": 30, "JFK": 20}, abs=2)


def test_a_varchar_key_with_a_collation_compares_byte_for_byte_and_loses_no_row():
    """A column declared COLLATE NOCASE is read through its bounded copy, which compares byte
    for byte (``dpsql.backends.bounding``): the WHERE keeps 'EWR', not 'ewr', and so does the narrowed
    domain. Rows whose exact key is not a released one ('ewr' next to 'EWR') are in the outside
    cell, never lost, never merged into 'EWR'."""
    connection = duckdb.connect()
    connection.execute("CREATE TABLE flights (tail INTEGER, origin VARCHAR COLLATE NOCASE, code INTEGER, "
                       "delay INTEGER)")
    connection.execute("INSERT INTO flights SELECT i, CASE WHEN i < 30 THEN 'EWR' ELSE 'ewr' END, 1, 0 "
                       "FROM range(50) AS r(i)")
    connection.execute("CREATE TABLE airports AS SELECT * FROM (VALUES ('EWR'), ('JFK')) AS a(faa)")
    with dpsql.connect(connection, policy=POLICY, rng=SeededSource(3)) as db:
        def answer(where):
            result = db.sql(f"SELECT origin, COUNT(*) AS n FROM flights {where} GROUP BY origin", epsilon=50)
            return dict(result.fetchall()), result.outside_domain.values["n"]

        released, outside = answer("WHERE origin IN ('EWR', 'JFK')")
        assert released == pytest.approx({"EWR": 30, "JFK": 0}, abs=2) and outside == pytest.approx(0, abs=2)
        released, outside = answer("WHERE origin = 'ewr'")
        assert released == {} and outside == pytest.approx(20, abs=2)
        released, outside = answer("")
        assert released == pytest.approx({"EWR": 30, "JFK": 0}, abs=2) and outside == pytest.approx(20, abs=2)


# --- 2. the limit on released keys ------------------------------------------------------------

def test_a_domain_beyond_the_policy_limit_is_refused_before_the_charge():
    policy = POLICY + "MAX RELEASED KEYS 4;"
    with connect(policy=policy) as db:
        with pytest.raises(UnsupportedQuery) as refused:
            db.sql("SELECT origin, COUNT(*) FROM flights GROUP BY origin")
        assert db.budget.spent.epsilon == 0
        message = str(refused.value)
        assert "would release 5 keys" in message and "the KEYS domain of origin (airports.faa)" in message
        assert "limit of 4 keys (the policy's MAX RELEASED KEYS)" in message
        assert "WHERE origin IN (...)" in message and "MAX RELEASED KEYS" in refused.value.hint
        assert (refused.value.line, refused.value.col) == (1, 47)  # the GROUP BY key
        # narrowed under the limit, it runs
        assert keys_of(db.sql("SELECT origin, COUNT(*) FROM flights WHERE origin <> 'ATL' GROUP BY origin")) == \
            ["BOS", "EWR", "JFK", "LGA"]


def test_the_limit_counts_the_product_of_domains_before_building_it():
    policy = POLICY + "MAX RELEASED KEYS 19;"
    with connect(policy=policy) as db:
        with pytest.raises(UnsupportedQuery, match=r"would release 20 keys: the 5 keys of the KEYS domain of origin "
                                                   r"\(airports.faa\) times the 4 keys of the KEYS domain of code"):
            db.sql("SELECT origin, code, COUNT(*) FROM flights GROUP BY origin, code")
        assert len(db.sql("SELECT origin, code, COUNT(*) FROM flights WHERE code < 4 GROUP BY ALL")) == 15


def test_keys_columns_combine_freely_and_the_limit_counts_their_product():
    """KEYS lines are per column: columns whose domains come from one public table (even one
    column) release the product of their domains; the refusal counts that product."""
    stores = pd.DataFrame({"city": ["A", "A", "B"], "store": ["s1", "s2", "s1"]})
    frame = pd.DataFrame({"uid": range(3), "city": ["A", "A", "B"], "store": ["s1", "s2", "s1"], "plan": "x"})
    policy = """BUDGET EPSILON 1000; MAX RELEASED KEYS 7; PRIVATE TABLE v (PRIVACY UNIT uid, MAX ROWS PER UNIT 1,
        city KEYS FROM stores.city, store KEYS FROM stores.store, plan KEYS ('x', 'y')); PUBLIC TABLE stores;"""
    with dpsql.connect({"v": frame, "stores": stores}, policy=policy) as db:
        with pytest.raises(UnsupportedQuery) as refused:
            db.sql("SELECT city, store, plan, COUNT(*) AS n FROM v GROUP BY city, store, plan", epsilon=1)
        assert refused.value.message == (
            "GROUP BY would release 8 keys: the 2 keys of the KEYS domain of city (stores.city) times the 2 keys "
            "of the KEYS domain of store (stores.store) times the 2 keys of the KEYS domain of plan (2 listed "
            "keys), beyond the limit of 7 keys (the policy's MAX RELEASED KEYS)")
        assert db.budget.spent.epsilon == 0
        narrowed = db.sql("SELECT city, store, plan, COUNT(*) AS n FROM v WHERE city <> 'B' GROUP BY ALL", epsilon=1)
        assert [row[:3] for row in narrowed.fetchall()] == [
            ("A", "s1", "x"), ("A", "s1", "y"), ("A", "s2", "x"), ("A", "s2", "y")]


def test_the_limit_message_counts_what_one_joined_public_table_holds_together():
    """Columns of one public table joined into the query come from one of its rows: they take
    the combinations it holds (3 here), not the product of their domains (2 x 2)."""
    stores = pd.DataFrame({"id": [1, 2, 3], "city": ["A", "A", "B"], "store": ["s1", "s2", "s1"]})
    frame = pd.DataFrame({"uid": range(4), "sid": [1, 2, 3, 3], "plan": "x"})
    policy = """BUDGET EPSILON 1000; MAX RELEASED KEYS 5; PRIVATE TABLE v (PRIVACY UNIT uid, MAX ROWS PER UNIT 1,
        plan KEYS ('x', 'y')); PUBLIC TABLE stores;"""
    sql = "SELECT s.city, s.store, v.plan, COUNT(*) AS n FROM v JOIN stores s ON v.sid = s.id GROUP BY ALL"
    with dpsql.connect({"v": frame, "stores": stores}, policy=policy, rng=SeededSource(3)) as db:
        with pytest.raises(UnsupportedQuery) as refused:
            db.sql(sql, epsilon=1)
        assert refused.value.message == (
            "GROUP BY would release 6 keys: the 3 combinations of (city, store) that occur together in the rows "
            "of the joined public table stores (stores.city, stores.store) times the 2 keys of the KEYS domain "
            "of plan (2 listed keys), beyond the limit of 5 keys (the policy's MAX RELEASED KEYS)")
        result = db.sql(sql.replace("GROUP BY", "WHERE v.plan = 'x' GROUP BY"), epsilon=200)
        assert [row[:3] for row in result.fetchall()] == [("A", "s1", "x"), ("A", "s2", "x"), ("B", "s1", "x")]
        assert [row[3] for row in result.fetchall()] == pytest.approx([1, 1, 2], abs=1)
        explained = db.explain(sql, epsilon=1)
        assert "combined with g1 as they occur together in the rows of the joined public table" in explained
        assert "g2 = \"plan\": every one of the 2 listed public keys" in explained
        # two joins of one table are two rows: their columns combine freely (3 x 3 cities' rows)
        twice = ("SELECT a.city, b.city AS other, COUNT(*) AS n FROM v JOIN stores a ON v.sid = a.id "
                 "JOIN stores b ON v.sid = b.id GROUP BY ALL")
        assert [row[:2] for row in db.sql(twice, epsilon=1).fetchall()] == [
            ("A", "A"), ("A", "B"), ("B", "A"), ("B", "B")]


ORIGIN_DEST = [
    ("origin IN ('JFK', 'LGA', 'EWR') AND dest IN ('BOS', 'ATL')", ["EWR", "JFK", "LGA"], ["ATL", "BOS"]),
    ("origin = 'JFK' AND dest = 'JFK'", ["JFK"], ["JFK"]),
    ("origin <> dest AND origin < 'F'", ["ATL", "BOS", "EWR"], AIRPORTS),
    ("TRUE", AIRPORTS, AIRPORTS),
]


@pytest.mark.parametrize("where, origins, dests", ORIGIN_DEST)
def test_two_keys_of_one_public_column_release_every_pair_with_duckdbs_answer(where, origins, dests):
    """The duck user's finding 1: origin and dest both KEYS FROM airports.faa. The released keys
    are every (origin, dest) pair of the narrowed domains, and each count is DuckDB's exact one
    (plus noise of scale 1/200); the outside cell holds what no pair holds."""
    pairs = [(o, d) for o in AIRPORTS + ["XXX", None] for d in AIRPORTS + ["XXX"]]
    frame = pd.DataFrame({"tail": range(3 * len(pairs)), "origin": [p[0] for p in pairs] * 3,
                          "dest": [p[1] for p in pairs] * 3, "delay": 1, "code": 1})
    frame = frame.iloc[[i for i in range(len(frame)) if i % 7 != 3]]  # uneven counts
    policy = POLICY.replace("origin KEYS FROM airports.faa", "origin KEYS FROM airports.faa, "
                            "dest KEYS FROM airports.faa")
    sql = f"SELECT origin, dest, COUNT(*) AS n FROM flights WHERE {where} GROUP BY origin, dest"
    with connect(frame, policy=policy) as db:
        result = db.sql(sql, epsilon=200)
        released = sorted(result.fetchall(), key=lambda row: row[:2])
        assert [row[:2] for row in released] == [(o, d) for o in sorted(origins) for d in sorted(dests)]
        exact = dict(((o, d), n) for o, d, n in duckdb.sql(sql.replace("FROM flights", "FROM frame")).fetchall())
        assert [row[2] for row in released] == pytest.approx([exact.get(row[:2], 0) for row in released], abs=1)
        outside = sum(n for key, n in exact.items() if key not in {row[:2] for row in released})
        assert result.outside_domain.values["n"] == pytest.approx(outside, abs=1)
        explained = db.explain(sql)
        assert "every key of the public domain airports.faa" in explained


JOINED_AIRPORTS = pd.DataFrame({"faa": ["EWR", "JFK", "LAX", "SFO", "SEA", "BOS", "XNA"],
                                "name": ["Newark", "Kennedy", "Los Angeles", "San Francisco", "Shared", "Shared",
                                         "Northwest Arkansas"],
                                "tz": [-5, -5, -8, -8, -8, -5, -6]})


@pytest.mark.parametrize("where, narrowed", [
    ("a.tz = -8", "\"tz\" = -8"),
    ("a.tz = -8 AND f.delay >= 0", "\"tz\" = -8"),
    ("a.tz < -5 AND a.faa <> 'XNA'", "\"tz\" < -5 AND \"faa\" <> 'XNA'"),
    ("a.tz = -8 AND upper(a.name) LIKE 'S%'", "\"tz\" = -8 AND UPPER(\"name\") LIKE 'S%'"),
    ("a.tz < f.delay - 10", None),  # reads a private column: narrows nothing
])
def test_where_on_a_joined_public_table_narrows_its_keys_with_duckdbs_answer(where, narrowed):
    """The duck user's finding 2: GROUP BY a column of a joined public table releases the keys
    of the table's rows for which the WHERE conjuncts reading only that table hold (evaluated
    on the public table, free), with DuckDB's exact answer for each and nothing outside."""
    dests = ["EWR", "JFK", "LAX", "SFO", "SEA", "BOS", "XNA", "LAX", "SEA", "BOS", "SFO", "SFO"]
    frame = pd.DataFrame({"tail": range(len(dests)), "origin": "EWR", "dest": dests, "code": 1,
                          "delay": [i % 11 for i in range(len(dests))]})
    sql = f"SELECT a.name, COUNT(*) AS n FROM flights f JOIN airports a ON f.dest = a.faa WHERE {where} GROUP BY a.name"
    with connect(frame, airports=JOINED_AIRPORTS) as db:
        result = db.sql(sql, epsilon=200)
        airports = JOINED_AIRPORTS  # noqa: F841  (DuckDB reads the frames by these names)
        public_where = where.split(" AND f.")[0] if narrowed else "TRUE"
        expected = sorted(r[0] for r in duckdb.sql(f"SELECT DISTINCT name FROM airports a WHERE {public_where}")
                          .fetchall())
        assert sorted(row[0] for row in result.fetchall()) == expected
        exact = dict(duckdb.sql(sql.replace("FROM flights f", "FROM frame f")).fetchall())
        assert [row[1] for row in result.fetchall()] == pytest.approx([exact.get(row[0], 0)
                                                                       for row in result.fetchall()], abs=1)
        assert result.outside_domain.values["n"] == pytest.approx(0, abs=1)
        explained = db.explain(sql, epsilon=1)
        if narrowed:
            assert f"for which {narrowed} holds" in explained
        else:
            assert "for which" not in explained


def test_only_the_joined_tables_own_keys_are_narrowed_by_it():
    """A policy's KEYS column (origin KEYS FROM airports.faa) and a second join of the table
    are other rows: a.tz narrows neither."""
    frame = pd.DataFrame({"tail": range(4), "origin": ["EWR", "JFK", "EWR", "JFK"], "dest": ["LAX", "SFO", "EWR", "SEA"],
                          "code": 1, "delay": 1})
    airports = JOINED_AIRPORTS
    with connect(frame, airports=airports) as db:
        result = db.sql("SELECT f.origin, a.name, COUNT(*) AS n FROM flights f JOIN airports a ON f.dest = a.faa "
                        "WHERE a.tz = -8 AND f.origin IN ('EWR', 'JFK') GROUP BY f.origin, a.name", epsilon=200)
        assert sorted({row[0] for row in result.fetchall()}) == ["EWR", "JFK"]
        assert sorted({row[1] for row in result.fetchall()}) == ["Los Angeles", "San Francisco", "Shared"]
        twice = db.sql("SELECT b.name, COUNT(*) AS n FROM flights f JOIN airports a ON f.dest = a.faa "
                       "JOIN airports b ON f.origin = b.faa WHERE a.tz = -8 GROUP BY b.name", epsilon=200)
        assert len(twice.fetchall()) == airports.name.nunique()
        assert dict((row[0], row[1]) for row in twice.fetchall())["Newark"] == pytest.approx(1, abs=1)


def test_the_query_option_lowers_the_limit_but_cannot_raise_it():
    with connect(policy=POLICY + "MAX RELEASED KEYS 10;") as db:
        sql = "SELECT WITH DIFFERENTIAL_PRIVACY OPTIONS (max_keys = 3) origin, COUNT(*) FROM flights GROUP BY origin"
        with pytest.raises(UnsupportedQuery) as refused:
            db.sql(sql)
        assert "limit of 3 keys (max_keys in the query's OPTIONS)" in str(refused.value)
        assert "raise max_keys" in refused.value.hint and refused.value.col == 43
        narrowed = sql.replace("GROUP BY", "WHERE origin IN ('EWR', 'JFK') GROUP BY")
        assert keys_of(db.sql(narrowed)) == ["EWR", "JFK"]
        with pytest.raises(UnsupportedQuery, match="max_keys must be a whole number from 1 to the policy's"):
            db.sql(sql.replace("max_keys = 3", "max_keys = 11"))
        with pytest.raises(UnsupportedQuery, match="max_keys"):
            db.sql(sql.replace("max_keys = 3", "max_keys = 0"))
        assert db.budget.spent.epsilon == 1  # the one answered query only


def test_max_released_keys_in_the_policy_language():
    policy = load_policy(POLICY + "MAX RELEASED KEYS 250;")
    assert policy.max_released_keys == 250
    assert "MAX RELEASED KEYS 250;" in policy_to_text(policy)
    assert load_policy(policy_to_text(policy)) == policy
    assert "MAX RELEASED KEYS" not in policy_to_text(load_policy(POLICY))  # the default is not written
    assert load_policy(POLICY).max_released_keys == 100_000
    for wrong in ("0", "2.5"):
        with pytest.raises(PolicyError, match="MAX RELEASED KEYS must be a whole number"):
            load_policy(POLICY + f"MAX RELEASED KEYS {wrong};")
    with pytest.raises(PolicyError, match="given twice"):
        load_policy(POLICY + "MAX RELEASED KEYS 5; MAX RELEASED KEYS 6;")


# --- 3. the outside cell ----------------------------------------------------------------------

def test_rows_outside_the_domain_and_null_keys_are_one_more_noisy_cell():
    with connect(flights(outside=40, null=7)) as db:
        result = db.sql("SELECT origin, COUNT(*) AS n, AVG(delay) AS d FROM flights GROUP BY origin", epsilon=100)
        assert "XXX" not in keys_of(result) and None not in keys_of(result)
        outside = result.outside_domain
        assert outside.values["n"] == pytest.approx(47, abs=2)  # 40 outside the domain, 7 NULL
        assert set(outside.values) == {"n", "d"} and outside.rows == "n" and outside.keys == ("origin",)
        # the same noise as every other cell of its column
        assert outside.accuracy()["n"] == pytest.approx(result.accuracy()["n"])
        assert str(outside).startswith(f"≈ {outside.values['n']}") and "rows with origin outside its KEYS domain" \
            in str(outside)
        # the footer the shell and CLI print
        assert answer_from(result).outside == str(outside)


def test_rows_the_where_excludes_are_not_outside():
    with connect(flights(outside=40)) as db:
        result = db.sql("SELECT origin, COUNT(*) AS n FROM flights WHERE origin <> 'XXX' GROUP BY origin", epsilon=100)
        assert result.outside_domain.values["n"] == pytest.approx(0, abs=2)
        narrowed = db.sql("SELECT origin, COUNT(*) AS n FROM flights WHERE origin IN ('EWR', 'XXX') "
                          "GROUP BY origin", epsilon=100)
        assert keys_of(narrowed) == ["EWR"]
        assert narrowed.outside_domain.values["n"] == pytest.approx(40, abs=2)  # kept by WHERE, not a key


def test_the_outside_cell_is_there_whatever_the_data_and_only_for_public_keys():
    with connect() as db:  # no row outside: the cell is still released (its presence is not data)
        assert db.sql("SELECT code, SUM(delay) AS s FROM flights GROUP BY code").outside_domain is not None
        assert db.sql("SELECT COUNT(*) FROM flights").outside_domain is None
        assert db.sql("SELECT delay, COUNT(*) FROM flights GROUP BY delay", delta=1e-5).outside_domain is None
        assert db.sql("SELECT origin FROM flights GROUP BY origin").outside_domain is None
        explained = db.explain("SELECT code, COUNT(*) FROM flights GROUP BY code")
        assert "released as one more cell, res.outside_domain" in explained
        assert "outside_domain" not in db.explain("SELECT COUNT(*) FROM flights")


def test_combinations_one_joined_public_table_lacks_are_outside():
    """Keys of two private columns KEYS FROM one table combine freely ((B, s2) is a key); only
    keys outside their domains, and NULL, are outside."""
    stores = pd.DataFrame({"city": ["A", "A", "B"], "store": ["s1", "s2", "s1"]})
    frame = pd.DataFrame({"uid": range(6), "city": ["A", "A", "B", "B", "B", None],
                          "store": ["s1", "s2", "s1", "s2", "s2", "s1"]})
    policy = """BUDGET EPSILON 1000; PRIVATE TABLE v (PRIVACY UNIT uid, MAX ROWS PER UNIT 1,
        city KEYS FROM stores.city, store KEYS FROM stores.store); PUBLIC TABLE stores;"""
    with dpsql.connect({"v": frame, "stores": stores}, policy=policy, rng=SeededSource(2)) as db:
        result = db.sql("SELECT city, store, COUNT(*) AS n FROM v GROUP BY city, store", epsilon=200)
        assert [row[:2] for row in result.fetchall()] == [("A", "s1"), ("A", "s2"), ("B", "s1"), ("B", "s2")]
        assert [row[2] for row in result.fetchall()] == pytest.approx([1, 1, 1, 2], abs=1)
        assert result.outside_domain.values["n"] == pytest.approx(1, abs=1)  # (NULL, s1)
        assert "with (city, store) outside their KEYS domains" in str(result.outside_domain)


def test_the_outside_cell_names_the_outputs_not_the_aggregates():
    """The duck user's finding 3: an output that computes with an aggregate is shown by its
    name, with its own value (post-processing of the cell alone) and derived interval; an
    aggregate no output reads (HAVING COUNT(*)) keeps its SQL. A free repeat shows the same."""
    with connect(flights(outside=40)) as db:
        sql = ("SELECT origin, ROUND(AVG(delay), 1) AS a, COUNT(*) * 2 AS twice FROM flights GROUP BY origin "
               "HAVING SUM(delay) > 0 ORDER BY a LIMIT 1")
        result = db.sql(sql, epsilon=100)
        outside = result.outside_domain
        assert set(outside.values) == {"a", "twice", "SUM(delay)"} and outside.rows is None
        frame = flights(outside=40)
        inside = frame[frame.origin == "XXX"]
        assert outside.values["twice"] == pytest.approx(2 * len(inside), abs=4) and outside.values["twice"] % 2 == 0
        assert outside.values["a"] == pytest.approx(inside.delay.mean(), abs=0.5)
        assert outside.values["a"] == round(outside.values["a"], 1)
        assert outside.values["SUM(delay)"] == pytest.approx(inside.delay.sum(), abs=5)
        widths = outside.accuracy()
        assert set(widths) == {"a", "twice", "SUM(delay)"} and widths["twice"] > 0
        text = str(outside)
        assert "a ≈ " in text and "twice ≈ " in text and "AVG(delay)" not in text and "COUNT(*)" not in text
        again = db.sql(sql, epsilon=100)
        assert again.cost.repeat and again.outside_domain.values == outside.values
        assert again.outside_domain.accuracy() == pytest.approx(widths)
        counted = db.sql("SELECT origin, AVG(delay) AS d FROM flights GROUP BY origin HAVING COUNT(*) > 0",
                         epsilon=100).outside_domain
        assert counted.rows == "COUNT(*)" and str(counted).startswith(f"≈ {counted.values['COUNT(*)']}")


def test_a_repeat_returns_the_same_outside_cell_for_free():
    with connect(flights(outside=5)) as db:
        sql = "SELECT origin, COUNT(*) AS n FROM flights GROUP BY origin"
        first, again = db.sql(sql), db.sql(sql)
        assert again.cost.repeat and again.outside_domain.values == first.outside_domain.values
        assert again.outside_domain.accuracy() == first.outside_domain.accuracy()


def test_the_outside_cell_counts_among_a_units_groups_by_brute_force():
    """The oracle of ``test_sensitivity_oracle`` (every unit of up to k + 1 rows, keys 'a' and
    'b' in the domain and 'c' outside it, values at and beyond the bounds, NULL): the outside
    cell is a released key of the exact result, and one unit moves the vector over every cell,
    the outside one included, by at most the analysed L1 — reached by a unit whose rows are all
    outside. With MAX GROUPS PER UNIT 1 a unit's rows inside and outside do not add up."""
    candidates = {"one_group": [("a", 4), ("a", 0), ("b", 4), ("c", 4), ("c", -7), ("c", None), ("c", 0)],
                  "integer": [("a", 3), ("b", -2), ("c", 3), ("c", 100), ("c", None)]}
    for case, query in (("one_group", "SELECT g, SUM(x) FROM t GROUP BY g"),
                        ("integer", "SELECT g, COUNT(*) FROM t GROUP BY g")):
        oracle = Oracle(case, query)
        analysed = oracle.plans["unbounded"].measures[0].sensitivity
        empty = oracle.run(())
        units = [u for size in range(4) for u in itertools.combinations_with_replacement(candidates[case], size)]
        results = list({_frozen(r): r for r in (oracle.run(unit) for unit in units + _units(case))}.values())
        assert any(r.get((None,), (0,))[0] != empty.get((None,), (0,))[0] for r in results)
        worst = max(_distance(r, empty, 0)[0] for r in results)
        assert worst == analysed.l1
        outside_only = max(abs(r.get((None,), (0,))[0] - empty.get((None,), (0,))[0]) for r in results)
        assert outside_only == analysed.l1  # the outside cell alone can take the whole bound
        if case == "one_group":
            both = oracle.run((("a", 4), ("c", 4)))  # one group kept: 4 lands in 'a' or outside, not both
            moved = [both.get(k, (0,))[0] - empty.get(k, (0,))[0] for k in set(both) | set(empty)]
            assert sorted(moved)[-1] == 4 and sum(abs(m) for m in moved) == 4


OUTSIDE_FAMILIES = {
    # the SQL of each family's bounded values: separate (distinct values, quantile histograms)
    # or summed with the other measures (VARIANCE: count, centred sum, squared sum)
    "distinct": "SELECT g, COUNT(DISTINCT x) FROM t GROUP BY g",
    "quantile": "SELECT g, MEDIAN(x) FROM t GROUP BY g",
    "variance": "SELECT g, VARIANCE(x) FROM t GROUP BY g",
}


def _family_cells(oracle: Oracle, family: str):
    """A function of a unit's rows: the exact bounded values per released cell, keyed by the
    group (and, for a histogram, the bucket). The outside cell's key starts with None."""
    plan = oracle.plans["unbounded"]
    if family == "variance":
        return oracle.run
    separate = rewrite_distinct(plan, plan.separate[0]) if family == "distinct" else \
        rewrite_histogram(plan, plan.separate[0])
    width = 1 if family == "distinct" else 2

    def cells(unit_rows):
        oracle.run(unit_rows)  # loads the data
        rows = oracle.engine.fetch(separate, {"salt": "s"} if "$salt" in separate else None,
                                   bounded=plan.query.bounded)
        return {tuple(r[:width]): tuple(int(v) for v in r[width:]) for r in rows}

    return cells


@pytest.mark.parametrize("family", list(OUTSIDE_FAMILIES))
@pytest.mark.parametrize("case", ["integer", "one_group"])
def test_every_aggregate_family_bounds_and_fills_the_outside_cell_by_brute_force(case, family):
    """COUNT(DISTINCT x), a quantile's histogram and VARIANCE's measures, with no group limit
    ('integer': k = 2) and with MAX GROUPS PER UNIT 1 below k ('one_group': the per-(unit,
    group) grant path). Every unit of up to k + 1 rows with keys 'a', 'b' (the domain) and 'c'
    (outside) and values at and beyond the bounds and NULL: one unit moves all cells, the
    outside one included, by at most the analysed bound, which the outside cell alone reaches;
    and a unit whose at most k rows are all outside is in the outside cell with all its values
    (distinct values, histogram entries, non-NULL values counted). Regression: distinct values
    and histograms joined their (unit, group) grant with USING, which never matches the outside
    cell's NULL key, so that cell was always 0 under a group limit."""
    oracle = Oracle(case, OUTSIDE_FAMILIES[family])
    plan = oracle.plans["unbounded"]
    cells = _family_cells(oracle, family)
    lo, hi = CASES[case][1]
    raw = [lo, hi, None, 100 * hi]
    candidates = [("c", v) for v in raw] + [("a", hi), ("b", lo)]
    k = CASES[case][3]
    units = [u for size in range(k + 2) for u in itertools.combinations_with_replacement(candidates, size)]
    empty = cells(())
    results = {unit: cells(unit) for unit in units}
    outside = [key for r in results.values() for key in r if key[0] is None]
    assert outside, "the outside cell never got a value"
    bounds = ([plan.separate[0].sensitivity.l1] if family == "distinct" else
              [plan.aggregates[0].rule.rows_per_unit] if family == "quantile" else
              [m.sensitivity.l1 for m in plan.measures])
    for index, bound in enumerate(bounds):
        def moved(result, only_outside=False):
            keys = set(result) | set(empty)
            return sum(abs(result.get(key, (0,) * len(bounds))[index] - empty.get(key, (0,) * len(bounds))[index])
                       for key in keys if not only_outside or key[0] is None)
        assert max(moved(r) for r in results.values()) == bound
        assert max(moved(r, only_outside=True) for r in results.values()) == bound
    for unit, result in results.items():
        if len(unit) > k or any(g != "c" for g, _ in unit):
            continue
        values = [x for _, x in unit if x is not None]
        got = [sum(v[i] for key, v in result.items() if key[0] is None) -
               sum(v[i] for key, v in empty.items() if key[0] is None) for i in range(len(bounds))]
        if family == "variance":  # count, centred sum and squared sum of the clamped values
            centred = [2 * min(max(x, lo), hi) - (lo + hi) for x in values]
            expected = [len(values) if m.kind == "count" else sum(c * c for c in centred) if m.squared
                        else sum(centred) for m in plan.measures]
        else:
            expected = [len(set(values)) if family == "distinct" else len(values)]
        assert got == expected, (unit, result)


@pytest.mark.parametrize("groups", [3, 1])
def test_the_outside_cell_of_every_aggregate_family_is_its_true_value(groups):
    """End to end, at an epsilon so large the noise is below the rounding: the outside cell
    of COUNT(DISTINCT amount), COUNT(DISTINCT store), MEDIAN and VARIANCE is what the outside
    rows (keys 'Z', 'W', 'Q' and NULL) give, with MAX GROUPS PER UNIT 3 (= k) and 1 (below k:
    the per-(unit, group) path that used to give the distinct counts 0). Every unit has at
    most k rows in one group, so bounding keeps every row and the expected values are plain
    pandas on the outside rows."""
    inside = [(u, "A" if u % 2 else "B", 10 + u) for u in range(8) for _ in range(2)]
    outside = [(100 + u, ["Z", "W", "Q", None][u % 4], 300 + (u * 7) % 11 * 3 + r) for u in range(12) for r in range(2)]
    visits = pd.DataFrame(inside + outside, columns=["uid", "store", "amount"])
    policy = f"""BUDGET EPSILON 10000000 DELTA 0.001; QUERY EPSILON 1;
    PRIVATE TABLE visits (PRIVACY UNIT uid, MAX ROWS PER UNIT 3, MAX GROUPS PER UNIT {groups},
        amount BOUNDS 0 TO 500, store KEYS FROM stores.store);
    PUBLIC TABLE stores;"""
    rows = visits[~visits["store"].isin(["A", "B", "C"])]
    amounts = sorted(rows["amount"])
    assert len(rows) == 24 and rows["store"].isna().sum() == 6
    with dpsql.connect({"visits": visits, "stores": pd.DataFrame({"store": ["A", "B", "C"]})},
                       policy=policy, rng=SeededSource(3)) as db:
        result = db.sql("SELECT store, COUNT(DISTINCT amount) AS da, COUNT(DISTINCT store) AS ds, "
                        "MEDIAN(amount) AS med, VARIANCE(amount) AS var FROM visits GROUP BY store",
                        epsilon=1_000_000)
    got = result.outside_domain.values
    assert got["da"] == pytest.approx(rows["amount"].nunique(), abs=0.5)
    assert got["ds"] == pytest.approx(rows["store"].nunique(), abs=0.5)
    width = 500 / QUANTILE_BUCKETS * 2  # the median is an edge of a bucket next to the two middle values
    assert amounts[11] - width <= got["med"] <= amounts[12] + width and amounts[12] - amounts[11] < 20
    assert got["var"] == pytest.approx(rows["amount"].var(), rel=1e-3)


# --- 4. SQL that DuckDB users write -----------------------------------------------------------

def test_a_from_subquery_needs_no_alias():
    with connect(seed=5) as db:
        named = db.sql("SELECT COUNT(*) AS n FROM (SELECT * FROM flights WHERE delay > 2) AS f").fetchall()
    with connect(seed=5) as db:
        assert db.sql("SELECT COUNT(*) AS n FROM (SELECT * FROM flights WHERE delay > 2)").fetchall() == named
        # DuckDB's own names for unnamed subqueries, in FROM order
        result = db.sql("SELECT unnamed_subquery2.faa, COUNT(*) AS n FROM (SELECT * FROM flights) "
                        "JOIN (SELECT faa FROM airports) ON origin = faa GROUP BY ALL", delta=1e-5)
        assert set(keys_of(result)) <= set(AIRPORTS)


AMBIGUOUS = [
    # the analyst's alias and DuckDB's name for the unaliased subquery are the same
    "SELECT SUM(unnamed_subquery.delay) AS s FROM (SELECT tail, origin, delay FROM flights) AS unnamed_subquery "
    "JOIN (SELECT faa AS origin, 1 AS delay FROM airports) USING (origin)",
    "SELECT SUM(unnamed_subquery.delay) AS s FROM (SELECT faa AS origin, 1 AS delay FROM airports) "
    "JOIN (SELECT tail, origin, delay FROM flights) AS unnamed_subquery USING (origin)",
    # a CTE of that name
    "WITH unnamed_subquery AS (SELECT tail, origin, delay FROM flights) SELECT SUM(unnamed_subquery.delay) AS s "
    "FROM unnamed_subquery JOIN (SELECT faa AS origin, 1 AS delay FROM airports) USING (origin)",
    # the second unaliased subquery's name
    "SELECT unnamed_subquery2.origin, COUNT(*) AS n FROM (SELECT tail, origin FROM flights) "
    "JOIN (SELECT faa AS origin FROM airports) USING (origin) "
    "JOIN (SELECT faa AS origin FROM airports) AS unnamed_subquery2 USING (origin) GROUP BY ALL",
]


@pytest.mark.parametrize("sql", AMBIGUOUS)
def test_a_name_two_from_items_answer_to_is_refused_as_duckdb_does(sql):
    """An unaliased subquery is named as DuckDB names it; when the analyst's alias or CTE has
    that name too, a column qualified with it is refused as ambiguous, as DuckDB refuses it,
    never bound to the other item (attack a1 finding 4a: SUM(unnamed_subquery.amount)
    summed the unaliased public subquery's column)."""
    duck = duckdb.connect()
    duck.register("flights", flights())
    duck.register("airports", pd.DataFrame({"faa": AIRPORTS}))
    with pytest.raises(duckdb.BinderException, match="Ambiguous reference to table"):
        duck.execute(sql)
    with connect() as db:
        before = db.budget
        with pytest.raises(UnsupportedQuery, match="the table name unnamed_subquery2? is ambiguous") as raised:
            db.sql(sql, delta=1e-5)
        assert db.budget == before
    error = raised.value
    column = re.search(r"unnamed_subquery2?\.", sql).start() + 1
    assert (error.line, error.col) == (1, column) and "AS my_alias" in error.hint
    assert "a subquery written without an alias is named unnamed_subquery" in error.message


def test_an_alias_written_twice_is_ambiguous_when_used():
    with connect() as db:
        with pytest.raises(UnsupportedQuery) as raised:
            db.sql("SELECT SUM(a.delay) AS s FROM flights AS a JOIN airports AS a ON origin = faa")
    assert raised.value.message == "the table name a is ambiguous: it names 2 items of this FROM"
    assert raised.value.col == 12


def test_a_repeated_name_nobody_uses_is_harmless():
    """As in DuckDB: two FROM items answering to one name is fine while no column is
    qualified with it; an explicit alias that is not a generated name is no collision."""
    with connect(seed=2) as db:
        repeated = db.sql("SELECT SUM(delay) AS s FROM (SELECT tail, origin, delay FROM flights) AS unnamed_subquery "
                          "JOIN (SELECT faa AS origin FROM airports) USING (origin)", epsilon=100)
        assert repeated.fetchall()[0][0] == pytest.approx(flights()["delay"].sum(), abs=2)
        # the first unaliased subquery is unnamed_subquery, so an explicit unnamed_subquery2 is unique
        named = db.sql("SELECT SUM(unnamed_subquery2.delay) AS s FROM (SELECT faa AS origin FROM airports) "
                       "JOIN (SELECT tail, origin, delay FROM flights) AS unnamed_subquery2 USING (origin)", epsilon=100)
        assert named.fetchall()[0][0] == pytest.approx(flights()["delay"].sum(), abs=2)


def test_group_by_public_keys_without_an_aggregate_is_the_domain_free():
    with connect() as db:
        result = db.sql("SELECT origin FROM flights WHERE origin <> 'EWR' GROUP BY origin ORDER BY origin DESC")
        assert result.fetchall() == [("LGA",), ("JFK",), ("BOS",), ("ATL",)]
        assert result.exact and result.cost.epsilon == 0 and db.budget.spent.epsilon == 0
        assert len(db.ledger()) == 0
        assert db.sql("SELECT DISTINCT code FROM flights").fetchall() == [(1,), (2,), (3,), (4,)]
        assert db.sql("SELECT origin, code FROM flights WHERE code = 1 GROUP BY ALL LIMIT 2").fetchall() == \
            [("ATL", 1), ("BOS", 1)]
        assert "the KEYS domain of origin (airports.faa)) are released exactly; no private data is read, " \
            "nothing is charged" in db.explain("SELECT DISTINCT origin FROM flights")


def test_group_by_private_keys_without_an_aggregate_passes_partition_selection():
    frame = pd.DataFrame({"tail": range(300), "origin": ["EWR"] * 300, "code": [1] * 300,
                          "delay": [1] * 150 + [2] * 149 + [9]})
    with connect(frame) as db:
        with pytest.raises(UnsupportedQuery, match="has no public KEYS domain"):
            db.sql("SELECT delay FROM flights GROUP BY delay")
        assert db.budget.spent.epsilon == 0
        for sql in ("SELECT delay FROM flights GROUP BY delay", "SELECT DISTINCT delay FROM flights"):
            result = db.sql(sql, epsilon=1, delta=1e-6)
            assert sorted(keys_of(result)) == [1, 2]  # 9 has one unit: below the threshold
            assert result.cost.epsilon == 1 and result.cost.delta > 0 and not result.exact
        assert db.budget.spent.epsilon == 2


def test_explain_of_a_narrowed_query_reads_no_data(monkeypatch):
    with connect() as db:
        def no_data(*args, **kwargs):
            raise AssertionError("explain must not read data")

        monkeypatch.setattr(db._engine, "fetch", no_data)
        text = db.explain("SELECT origin, COUNT(*) FROM flights WHERE origin IN ('EWR', 'JFK') GROUP BY origin")
        assert "every key of the public domain airports.faa for which \"origin\" IN ('EWR', 'JFK') holds" in text
        assert "res.outside_domain" in text
        assert "no private data is read" in db.explain("SELECT origin FROM flights GROUP BY origin")


def test_the_shell_and_the_cli_print_the_outside_cell_as_a_footer(tmp_path, capsys):
    from dpsql import cli
    from dpsql.shell.session import handle_input
    from dpsql.shell.state import new_state

    with connect(flights(outside=4)) as db:
        output = handle_input(new_state(db, width=100, color=False),
                              "SELECT origin, COUNT(*) AS n FROM flights GROUP BY origin;")
        assert "rows with origin outside its KEYS domain\ncost ε 1" in output
        output = handle_input(new_state(db, width=100, color=False), "SELECT COUNT(*) AS n FROM flights;")
        assert "outside" not in output
    database = tmp_path / "f.duckdb"
    with duckdb.connect(str(database)) as connection:
        frame, airports = flights(outside=4), pd.DataFrame({"faa": AIRPORTS})
        connection.execute("CREATE TABLE flights AS SELECT * FROM frame; CREATE TABLE airports AS SELECT * FROM airports")
    policy = tmp_path / "f.policy"
    policy.write_text(POLICY, encoding="utf-8")
    # asked for: unseeded, 4 rows outside are not always told from the noise (then the cell is not shown)
    code = cli.main(["query", str(database), "SELECT WITH DIFFERENTIAL_PRIVACY OPTIONS (show_outside = true) "
                     "origin, COUNT(*) AS n FROM flights GROUP BY origin", "--policy", str(policy)])
    err = capsys.readouterr().err
    # (near 0 the interval is cut at 0 and printed as its ends: "≈ 1 [0, 4]")
    assert code == 0 and re.search(r"^≈ -?[\d,]+ (± [\d,]+|\[-?[\d,]+, [\d,]+\]) rows with origin outside its KEYS "
                                   r"domain$", err, re.M)


def test_refresh_rereads_the_public_domain():
    connection = duckdb.connect()
    connection.execute("CREATE TABLE flights AS SELECT i AS tail, 'EWR' AS origin, 1 AS code, 0 AS delay FROM range(5) r(i)")
    connection.execute("CREATE TABLE airports AS SELECT 'JFK' AS faa")
    with dpsql.connect(connection, policy=POLICY, rng=SeededSource(1)) as db:
        assert keys_of(db.sql("SELECT origin FROM flights GROUP BY origin")) == ["JFK"]
        connection.execute("INSERT INTO airports VALUES ('EWR')")
        db.refresh()
        assert keys_of(db.sql("SELECT origin FROM flights GROUP BY origin")) == ["EWR", "JFK"]


def test_the_outside_cell_gets_the_noise_of_every_cell():
    """Statistical: the outside cell's noise is the discrete Laplace of its measure's scale.
    6,000 releases of an all-zero exact result: the sample variance of the outside cell is
    within 25% of the exact variance (over 8 standard errors of the estimate, whose relative
    standard error is sqrt((kurtosis - 1) / n) < 0.03: a correct sampler fails with
    probability far below 1e-6), which a factor-2 error in the scale (4x or 1/4 the variance)
    always breaks; its mean is within 6 standard errors of 0."""
    import math

    import numpy as np

    from dpsql.query.release import release_measures

    plan = Oracle("integer", "SELECT g, COUNT(*) FROM t GROUP BY g").plans["unbounded"]
    scale = float(plan.measures[0].scale)
    assert scale == 2  # k = 2 rows per unit, epsilon 1
    source = SeededSource(11)
    draws = np.array([release_measures(plan, [("a",), ("b",), (None,)], [], source).noisy["m0"][-1]
                      for _ in range(6_000)], dtype=float)
    q = math.exp(-1 / scale)
    variance = 2 * q / (1 - q) ** 2
    assert abs(draws.var() / variance - 1) < 0.25
    assert abs(draws.mean()) < 6 * math.sqrt(variance / len(draws))
