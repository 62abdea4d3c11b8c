"""Issue 16: privacy at the seam between DuckDB and Python (DESIGN.md invariant 19).

Each mechanism is attacked as an analyst would: two neighbouring databases that differ in one
unit carrying an adversarial value, the same query through ``dpsql.connect(...).sql(...)`` with
the engine's own (seeded) noise, and the outcome must be of the same kind on both — an answer
on both, or the same static refusal on both before anything is charged — and, where Python
could merge keys, the released key sets must agree apart from what partition selection may do
with the one unit's own key.
"""

from __future__ import annotations

import datetime
import math
import random
import struct
import uuid
from decimal import Decimal
from fractions import Fraction

import duckdb
import numpy as np
import pandas as pd
import pytest
from sqlglot import exp

import dpsql
from dpsql.analysis.plan import GroupKey
from dpsql.backends.keys import display, display_value, key_form, read_keys, typed_keys
from dpsql.errors import (
    DPError,
    InvalidParameter,
    PolicyError,
    QueryFailed,
    UnsupportedQuery,
)
from dpsql.mechanisms.noise import SeededSource
from dpsql.query.release import _integer_positions

SELECTED = "BUDGET EPSILON 1000 DELTA 0.5; PRIVATE TABLE t (PRIVACY UNIT {unit}{rules});"
PER_UNIT = "uid, MAX ROWS PER UNIT 1, MAX GROUPS PER UNIT 1"
ADVERSARY = 999


def policy(rules: str = "", unit: str = PER_UNIT) -> str:
    return SELECTED.format(unit=unit, rules=", " + rules if rules else "")


def neighbours(column: str, common, adversarial, count: int = 60, first: bool = False) -> tuple[dict, dict]:
    """D: ``count`` units with ``common``; D': D plus the adversary's one row with
    ``adversarial`` (placed first when ``first``, so a data-chosen representative would be it)."""
    base = pd.DataFrame({"uid": list(range(count)), column: [common] * count})
    extra = pd.DataFrame({"uid": [ADVERSARY], column: [adversarial]})
    added = pd.concat([extra, base] if first else [base, extra], ignore_index=True)
    return {"t": base}, {"t": added}


def outcome(target, sql: str, rules: str = "", seed: int = 1, epsilon=1, delta=1e-3, public: str = "",
            unit: str = PER_UNIT, **options):
    """("answer", rows) or ("refused", error type, message) with the budget untouched, or
    ("failed", error type) — what the analyst can tell apart."""
    with dpsql.connect(target, policy=policy(rules, unit) + public, rng=SeededSource(seed)) as db:
        before = db.budget.spent
        try:
            return "answer", db.sql(sql, epsilon=epsilon, delta=delta, **options).fetchall()
        except QueryFailed as error:
            return "failed", type(error)
        except DPError as error:
            assert db.budget.spent == before, "a static refusal charged the budget"
            return "refused", type(error), str(error)


def same_outcome(d, d2, sql: str, **options):
    first, second = outcome(d, sql, **options), outcome(d2, sql, **options)
    assert first[0] == second[0] == "answer", (first, second)
    return first[1], second[1]


# --- 1. a key Python cannot convert -----------------------------------------------------------

UNCONVERTIBLE = [
    "INTERVAL '1000000000 months'",
    "INTERVAL '1000000000 days'",
    "CAST('12345-01-01' AS DATE)",
    "CAST('infinity' AS TIMESTAMP)",
    "CAST('24:00:00' AS TIME)",
]


@pytest.mark.parametrize("value", UNCONVERTIBLE)
@pytest.mark.parametrize("post", ["", " ORDER BY n DESC"])
def test_a_key_python_cannot_convert_does_not_fail_the_query(value, post):
    d, d2 = neighbours("x", 1, 2)
    typed = "INTERVAL '1 day'" if "INTERVAL" in value else f"CAST(NULL AS {value.split(' AS ')[1]}"
    sql = (f"SELECT CASE WHEN uid = {ADVERSARY} THEN {value} ELSE {typed} END AS k, COUNT(*) AS n "
           f"FROM t GROUP BY k{post}")
    on_d, on_d2 = same_outcome(d, d2, sql)
    assert {row[0] for row in on_d} == {row[0] for row in on_d2}  # the adversary's key is not selected


@pytest.mark.parametrize("post", ["", " ORDER BY k"])
def test_released_unconvertible_keys_are_shown_as_text(post):
    frame = pd.DataFrame({"uid": range(80)})
    sql = ("SELECT CASE WHEN uid < 40 THEN INTERVAL '1000000000 months' ELSE INTERVAL '36 hours' END AS k, "
           f"COUNT(*) AS n FROM t GROUP BY k{post}")
    kind, rows = outcome({"t": frame}, sql)
    assert kind == "answer"
    assert {row[0] for row in rows} == {"83333333 years 4 months", "36:00:00"}


# --- 2. keys that Python would merge ----------------------------------------------------------

MERGED = [  # (column values: the large group's, the adversary's)
    (pd.Timestamp("2024-01-01 00:00:00.000000001"), pd.Timestamp("2024-01-01 00:00:00.000000002")),
    (0.0, -0.0),
    (float("nan"), float("nan")),
]


@pytest.mark.parametrize("common, adversarial", MERGED)
@pytest.mark.parametrize("first", [False, True])
@pytest.mark.parametrize("unit", [PER_UNIT, "ROW"])
def test_keys_that_python_would_merge_stay_apart(common, adversarial, first, unit):
    d, d2 = neighbours("k", common, adversarial, first=first)
    sql = "SELECT k, COUNT(*) AS n FROM t GROUP BY k"
    on_d, on_d2 = same_outcome(d, d2, sql, unit=unit)
    assert len(on_d) == 1 and on_d[0][1] > 40  # the large group is released on D
    big = [row for row in on_d2 if row[1] > 40]
    assert len(big) == 1 and repr(big[0][0]) == repr(on_d[0][0])  # ... and on D', under its own key


@pytest.mark.parametrize("first", [False, True])
def test_intervals_duckdb_calls_equal_are_separate_keys(first):
    for common, adversarial in (("30 days", "1 month"), ("36 hours", "1 day 12 hours")):
        d, d2 = neighbours("n", 0, 0, first=first)
        sql = (f"SELECT CASE WHEN uid = {ADVERSARY} THEN INTERVAL '{adversarial}' ELSE INTERVAL '{common}' END "
               "AS k, COUNT(*) AS n FROM t GROUP BY k")
        on_d, on_d2 = same_outcome(d, d2, sql)
        shown = {"30 days": "30 days", "36 hours": "36:00:00"}[common]
        assert [row[0] for row in on_d] == [row[0] for row in on_d2] == [shown]


@pytest.mark.parametrize("unit", ["uid, MAX ROWS PER UNIT 1, MAX GROUPS PER UNIT 1", "ROW"])
def test_a_collated_column_groups_by_its_exact_text(unit):
    def database(with_adversary: bool):
        con = duckdb.connect()
        con.execute("CREATE TABLE t (uid INTEGER, name VARCHAR COLLATE NOCASE)")
        if with_adversary:  # first in every order (inserted first, smallest unit): a NOCASE group
            con.execute("INSERT INTO t VALUES (-1, 'A')")  # would be named after it
        con.execute("INSERT INTO t SELECT range, 'a' FROM range(60)")
        return con

    sql = "SELECT name, COUNT(*) AS n FROM t GROUP BY name"
    text = f"BUDGET EPSILON 1000 DELTA 0.5; PRIVATE TABLE t (PRIVACY UNIT {unit});"
    for post in ("", " ORDER BY name"):
        shown = []
        for with_adversary in (False, True):
            with dpsql.connect(database(with_adversary), policy=text, rng=SeededSource(1)) as db:
                shown.append([row[0] for row in db.sql(sql + post, epsilon=1, delta=1e-3).fetchall()])
        assert shown == [["a"], ["a"]]  # never 'A', the adversary's spelling


def test_a_collated_column_with_a_public_domain_releases_the_domain_keys():
    con = duckdb.connect()
    con.execute("CREATE TABLE t (uid INTEGER, name VARCHAR COLLATE NOCASE)")
    con.execute("INSERT INTO t VALUES (1, 'A'), (2, 'a'), (3, 'b')")
    kind, rows = outcome(con, "SELECT name, COUNT(*) AS n FROM t GROUP BY name", rules="name KEYS ('a', 'b')")
    assert kind == "answer" and [row[0] for row in rows] == ["a", "b"]


# --- 3. a public domain of another type than the column ---------------------------------------

@pytest.mark.parametrize("rules, words", [
    ("k KEYS (1, 2, 3)", ["KEYS of t.k (VARCHAR)", "number 1"]),
    ("n KEYS ('1', '2')", ["KEYS of t.n (BIGINT)", "text '1'"]),
    ("n KEYS (1.5)", ["1.5", "not a value of BIGINT"]),
    ("k KEYS FROM p.id", ["BIGINT", "VARCHAR", "KEYS FROM p.id"]),
    ("n KEYS FROM p.label", ["VARCHAR", "BIGINT"]),
    ("f KEYS FROM p.id", ["DOUBLE", "BIGINT"]),
    ("n BOUNDS 0 TO 1e30", ["BIGINT", "reach beyond"]),
    ("n BOUNDS 0.2 TO 0.8", ["hold no value"]),
])
def test_a_domain_or_bounds_of_another_type_is_refused_at_load_on_both(rules, words):
    d, d2 = neighbours("k", "1", "x")
    for frames in (d, d2):
        frames["t"] = frames["t"].assign(n=1, f=1.0)
        frames["p"] = pd.DataFrame({"id": [1, 2, 3], "label": ["1", "2", "3"]})
    for frames in (d, d2):
        with pytest.raises(PolicyError) as refused:
            dpsql.connect(frames, policy=policy(rules) + " PUBLIC TABLE p;")
        assert all(word in str(refused.value) for word in words), str(refused.value)
        assert "line 1" in str(refused.value)


def test_listed_keys_that_name_no_value_of_the_type_are_refused_at_load():
    frame = pd.DataFrame({"uid": range(3), "day": [datetime.date(2024, 1, 1)] * 3})
    with pytest.raises(PolicyError) as refused:
        dpsql.connect({"t": frame}, policy=policy("day KEYS ('2024-01-01', 'soon')"))
    assert "'soon'" in str(refused.value) and "DATE" in str(refused.value) and "line 1" in str(refused.value)
    dpsql.connect({"t": frame}, policy=policy("day KEYS ('2024-01-01', '2024-01-02')")).close()


def test_a_non_integer_bound_on_an_integer_column_is_rounded_inward():
    frame = pd.DataFrame({"uid": range(3), "n": [0, 5, 100]})
    with dpsql.connect({"t": frame}, policy=policy("n BOUNDS 0.5 TO 10.5")) as db:
        assert "LEAST(GREATEST(\"n\", 1), 10)" in db.explain("SELECT SUM(n) FROM t", epsilon=1)


@pytest.mark.parametrize("rules", ["k KEYS ('1', '2')", "k KEYS FROM p.label"])
def test_a_domain_filter_compares_in_the_column_type(rules):
    d, d2 = neighbours("k", "1", "x")  # 'x' fails a coercion to a number; the filter has none
    for frames in (d, d2):
        frames["p"] = pd.DataFrame({"label": ["1", "2"]})
    sql = "SELECT k, COUNT(*) AS n FROM t GROUP BY k"
    on_d, on_d2 = same_outcome(d, d2, sql, rules=rules, public=" PUBLIC TABLE p;")
    assert [row[0] for row in on_d] == [row[0] for row in on_d2] == ["1", "2"]


# --- 4. grid scaling ----------------------------------------------------------------------------

@pytest.mark.parametrize("post", ["", " ORDER BY s"])
def test_grid_scaling_of_a_large_bound_cannot_overflow(post):
    d, d2 = neighbours("x", 1, 10**15)
    with dpsql.connect(d["t"].pipe(lambda f: {"t": f}), policy=policy("x BOUNDS 0 TO 10000000000000")) as db:
        explained = db.explain("SELECT SUM(x) AS s FROM t", epsilon="2e-8")
    assert "CAST('7.275957614183426e-12' AS DOUBLE)" in explained  # a grid of 2**37
    sql = f"SELECT SUM(x) AS s FROM t{post}"
    on_d, on_d2 = same_outcome(d, d2, sql, rules="x BOUNDS 0 TO 10000000000000", epsilon="2e-8")
    assert len(on_d) == len(on_d2) == 1


def test_grid_scaling_of_an_expression_cannot_fail():
    d, d2 = neighbours("x", 1, 10**15)
    sql = "SELECT SUM(x * 2) AS s, AVG(x) AS a FROM t"
    same_outcome(d, d2, sql, rules="x BOUNDS 0 TO 10000000000000", epsilon="2e-8")


# --- parameters ---------------------------------------------------------------------------------

@pytest.mark.parametrize("delta", ["1e-400", Fraction(1, 10**400), Decimal("1e-400")])
def test_a_delta_below_the_float_range_is_exact(delta):
    d, d2 = neighbours("k", "a", "b")
    on_d, on_d2 = same_outcome(d, d2, "SELECT k, COUNT(*) AS n FROM t GROUP BY k", delta=delta)
    assert on_d == on_d2 == []  # a threshold for delta 1e-400 is far above 61 units
    same_outcome(d, d2, "SELECT COUNT(*) AS n FROM t", delta=delta, noise="gaussian")


@pytest.mark.parametrize("epsilon", [np.float32(0.5), np.float64(0.5), np.int64(1), Decimal("0.5")])
def test_numpy_and_decimal_parameters_are_accepted(epsilon):
    frame = pd.DataFrame({"uid": range(10), "k": ["a"] * 10})
    kind, _ = outcome({"t": frame}, "SELECT k, COUNT(*) AS n FROM t GROUP BY k", epsilon=epsilon,
                      delta=np.float32(1e-3), weights={"n": np.int64(2)})
    assert kind == "answer"


@pytest.mark.parametrize("options", [
    dict(epsilon=np.float64("nan")), dict(epsilon=Decimal("NaN")), dict(epsilon=Decimal("-1")),
    dict(epsilon=Decimal("Infinity")), dict(delta=np.float32(2)), dict(epsilon=np.array([0.5])),
    dict(epsilon=1, weights={"n": Decimal("NaN")}), dict(epsilon=1, weights={"n": "x"}),
    dict(epsilon=1, weights={"n": np.int64(0)}), dict(epsilon=1, weights={"nothing": 1}),
    dict(epsilon=1, weights=[1]), dict(epsilon=True), dict(noise=1),
])
def test_every_parameter_error_is_an_invalid_parameter_before_anything_runs(options):
    frame = pd.DataFrame({"uid": range(10), "k": ["a"] * 10})
    arguments = {"epsilon": 1, "delta": 1e-3, **options}
    result = outcome({"t": frame}, "SELECT k, COUNT(*) AS n FROM t GROUP BY k", **arguments)
    assert result[:2] == ("refused", InvalidParameter), result


# --- refused key types ------------------------------------------------------------------------

def test_a_nested_key_is_refused_by_name_on_both():
    def database(with_adversary: bool):
        con = duckdb.connect()
        con.execute("CREATE TABLE t (uid INTEGER, tags INTEGER[], s STRUCT(a INTEGER))")
        con.execute("INSERT INTO t SELECT range, [1], {'a': 1} FROM range(60)")
        if with_adversary:
            con.execute(f"INSERT INTO t VALUES ({ADVERSARY}, [2, 3], {{'a': 2}})")
        return con

    for column, type_name in (("tags", "INTEGER[]"), ("s", "STRUCT(a INTEGER)")):
        sql = f"SELECT {column}, COUNT(*) AS n FROM t GROUP BY {column}"
        first, second = outcome(database(False), sql), outcome(database(True), sql)
        assert first == second and first[:2] == ("refused", UnsupportedQuery)
        assert type_name in first[2] and "line 1" in first[2] and "CAST(key AS VARCHAR)" in first[2]


# --- wide integers, exact values, repeats ---------------------------------------------------------

@pytest.mark.parametrize("post", ["", " ORDER BY k"])
def test_huge_integer_keys_are_released_exactly(post):
    con = duckdb.connect()
    con.execute("CREATE TABLE t (uid INTEGER, h HUGEINT, u UBIGINT)")
    con.execute("INSERT INTO t SELECT range, (CAST(1 AS HUGEINT) << 100) + (range % 2), 18446744073709551615 - (range % 2) "
                "FROM range(80)")
    for column, values in (("h", {2**100, 2**100 + 1}), ("u", {2**64 - 1, 2**64 - 2})):
        kind, rows = outcome(con, f"SELECT {column} AS k, COUNT(*) AS n FROM t GROUP BY k{post}")
        assert kind == "answer" and {row[0] for row in rows} == values


def test_integer_positions_leave_keys_beyond_int64_to_the_dict():
    assert _integer_positions([2**100, 1], [1]) is None
    assert _integer_positions([2**63, 1], [1]) is None
    assert _integer_positions([5, 1], [1, 7]).tolist() == [1, -1]


def test_decimal_uuid_and_blob_keys_keep_their_values():
    con = duckdb.connect()
    con.execute("CREATE TABLE t (uid INTEGER, d DECIMAL(38,2), i UUID, b BLOB)")
    con.execute("INSERT INTO t SELECT range, 123456789012345678901234567890123456.78, "
                "'12345678-1234-5678-1234-567812345678', '\\x00\\xff'::BLOB FROM range(60)")
    for column, value in (("d", Decimal("123456789012345678901234567890123456.78")),
                          ("i", uuid.UUID("12345678-1234-5678-1234-567812345678")), ("b", b"\x00\xff")):
        for post in ("", " ORDER BY k"):
            kind, rows = outcome(con, f"SELECT {column} AS k, COUNT(*) AS n FROM t GROUP BY k{post}")
            assert kind == "answer" and [row[0] for row in rows] == [value]


def test_post_processing_sees_keys_in_their_own_type(tmp_path):
    frame = pd.DataFrame({"uid": range(80), "day": [datetime.date(2024, 1 + i % 2, 1) for i in range(80)]})
    kind, rows = outcome({"t": frame}, "SELECT year(day) AS y, month(day) AS m, COUNT(*) AS n FROM t "
                                      "GROUP BY day ORDER BY m")
    assert kind == "answer" and [row[:2] for row in rows] == [(2024, 1), (2024, 2)]


def test_repeats_return_the_same_text_and_typed_keys(tmp_path):
    frame = pd.DataFrame({"uid": range(80), "ts": pd.to_datetime(["2024-01-01 00:00:00.000000001"] * 80),
                          "day": [datetime.date(2024, 1, 1)] * 80, "x": [0.5] * 80,
                          "tz": pd.to_datetime(["2024-01-01 10:00:00+00:00"] * 80)})
    sql = ("SELECT ts, day, x, CASE WHEN uid >= 0 THEN INTERVAL '1000000000 months' END AS i, tz, COUNT(*) AS n "
           "FROM t GROUP BY ts, day, x, i, tz")
    with dpsql.connect({"t": frame}, policy=policy(), ledger=tmp_path / "l.ledger", rng=SeededSource(3)) as db:
        first = db.sql(sql, epsilon=1, delta=1e-3)
    with dpsql.connect({"t": frame}, policy=policy(), ledger=tmp_path / "l.ledger") as db:
        again = db.sql(sql, epsilon=1, delta=1e-3)
    assert again.repeat and again.fetchall() == first.fetchall()
    (ts, day, x, interval, tz, _), = first.fetchall()
    assert (ts, day, x, interval) == ("2024-01-01 00:00:00.000000001", datetime.date(2024, 1, 1), 0.5,
                                      "83333333 years 4 months")
    assert isinstance(tz, datetime.datetime) and tz.utcoffset() is not None  # an aware value, or its text
    assert tz == datetime.datetime(2024, 1, 1, 10, tzinfo=datetime.timezone.utc)
    assert [type(v) for v in again.fetchone()[:5]] == [str, datetime.date, float, str, datetime.datetime]


# --- unit tests: classification and the total display ---------------------------------------------

@pytest.mark.parametrize("type_name, form", [
    ("TINYINT", "value"), ("HUGEINT", "value"), ("UHUGEINT", "value"), ("BOOLEAN", "value"),
    ("DECIMAL(38,10)", "value"), ("UUID", "value"), ("BLOB", "value"), ("ENUM('a', 'b')", "value"),
    ("VARCHAR", "text"), ("DATE", "text"), ("TIME", "text"), ("TIMESTAMP", "text"), ("TIMESTAMP_NS", "text"),
    ("TIMESTAMP WITH TIME ZONE", "text"), ("TIME WITH TIME ZONE", "text"), ("INTERVAL", "text"),
    ("FLOAT", "text"), ("DOUBLE", "text"), ("BIT", "text"),
    ("INTEGER[]", None), ("VARCHAR[3]", None), ("STRUCT(a INTEGER)", None), ("MAP(VARCHAR, INTEGER)", None),
    ("UNION(a INTEGER, b VARCHAR)", None), ("GEOMETRY", None),
])
def test_key_form_classifies_every_type(type_name, form):
    assert key_form(type_name) == form


def test_every_classified_type_is_what_duckdb_names():
    con = duckdb.connect()
    values = {"TINYINT": "1", "UHUGEINT": "1", "DECIMAL(38,10)": "1", "UUID": "gen_random_uuid()",
              "DATE": "'2024-01-01'", "TIMESTAMP_NS": "'2024-01-01'", "TIMESTAMP WITH TIME ZONE": "'2024-01-01'",
              "TIME WITH TIME ZONE": "'10:00:00+01'", "INTERVAL": "'1 day'", "FLOAT": "1", "BIT": "'01'"}
    for type_name, value in values.items():
        named = con.execute(f"DESCRIBE SELECT CAST({value} AS {type_name}) AS k").fetchone()[1]
        assert key_form(named) is not None, named


def test_typed_keys_refuses_with_position_and_hint():
    key = GroupKey("g0", exp.column("tags"), None)
    with pytest.raises(UnsupportedQuery) as refused:
        typed_keys([key], {"g0": "VARCHAR[]"})
    assert refused.value.node is key.expression  # located at the boundary (dpsql.query.prepare)
    assert "VARCHAR[]" in str(refused.value) and "hint" in str(refused.value).lower()


def test_double_text_reads_back_as_the_very_double():
    rng = random.Random(5)
    doubles = [struct.unpack("<d", rng.getrandbits(64).to_bytes(8, "little"))[0] for _ in range(3000)]
    doubles += [0.0, -0.0, 5e-324, -5e-324, 1.7976931348623157e308, 0.1, 1e20, 1e-7, float("inf"), float("-inf")]
    doubles = [d for d in doubles if not math.isnan(d)]
    con = duckdb.connect()
    texts = con.execute("SELECT CAST(x AS VARCHAR) FROM (SELECT unnest($v::DOUBLE[]) AS x)", {"v": doubles}).fetchall()
    for value, (text,) in zip(doubles, texts):
        shown = display(text.encode(), "DOUBLE", "text")
        assert struct.pack("<d", shown) == struct.pack("<d", value), (value, text)
    floats = con.execute("SELECT CAST(CAST(CAST(x AS FLOAT) AS DOUBLE) AS VARCHAR), CAST(x AS FLOAT) "
                         "FROM (SELECT unnest([0.1, 1e30, -3.5, 1e-40]) AS x)").fetchall()
    for text, value in floats:
        assert display(text, "FLOAT", "text") == value


@pytest.mark.parametrize("type_name", ["DATE", "TIME", "TIMESTAMP", "TIMESTAMP_S", "TIMESTAMP_MS", "TIMESTAMP_NS",
                                       "TIMESTAMP WITH TIME ZONE"])
def test_display_is_exact_where_python_holds_the_value(type_name):
    con = duckdb.connect()
    con.execute("SET TimeZone = 'UTC'")
    literals = {"DATE": ["2024-01-31", "0001-01-01", "9999-12-31", "10000-01-01", "infinity", "-infinity",
                         "0044-03-15 (BC)"],
                "TIME": ["00:00:00", "10:00:00.5", "23:59:59.999999", "24:00:00"],
                "TIMESTAMP": ["2024-01-01 10:00:00", "2024-01-01 10:00:00.123456", "infinity", "10000-01-01"],
                "TIMESTAMP_S": ["2024-01-01 10:00:00"], "TIMESTAMP_MS": ["2024-01-01 10:00:00.5"],
                "TIMESTAMP_NS": ["2024-01-01 10:00:00.123456789", "2024-01-01 10:00:00.123456"],
                "TIMESTAMP WITH TIME ZONE": ["2024-01-01 10:00:00+00", "2024-01-01 10:00:00+05:30", "infinity"]}
    seen = {}
    for literal in literals[type_name]:
        text, = con.execute(f"SELECT CAST(CAST('{literal}' AS {type_name}) AS VARCHAR)").fetchone()
        shown = display_value(text, type_name)
        if not isinstance(shown, str):  # an exact value: DuckDB takes it back as the same value
            same, = con.execute(f"SELECT CAST(? AS {type_name}) = CAST('{literal}' AS {type_name})",
                                [shown]).fetchone()
            assert same, (literal, shown)
        assert repr(shown) not in seen, (literal, seen)  # one-to-one
        seen[repr(shown)] = literal


@pytest.mark.parametrize("text", ["", "garbage", "2024-13-45", "99:99:99", "2024-02-30 10:00:00",
                                  "1e999999", "\udcff", "2024-01-01 10:00:00+99:99"])
@pytest.mark.parametrize("type_name", ["DATE", "TIME", "TIMESTAMP", "TIMESTAMP WITH TIME ZONE", "DOUBLE",
                                       "INTERVAL", "BIT", "VARCHAR", "TIME WITH TIME ZONE"])
def test_display_never_raises(text, type_name):
    display_value(text, type_name)
    display_value(text.encode("utf-8", "surrogateescape"), type_name)


def test_read_keys_decodes_every_byte_string_one_to_one():
    key = GroupKey("g0", exp.column("k"), None, "VARCHAR", "text")
    rows = [(b"\xff", 1), (b"\xfe", 2), ("already".encode(), 3)]
    decoded = [row[0] for row in read_keys(rows, [key])]
    assert len(set(decoded)) == 3 and decoded[2] == "already"
