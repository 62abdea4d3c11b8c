"""Privacy at the seams of joins (issue 11): what the analysis measures is what runs.

Each attack is run as an attacker would: on two neighbouring databases that differ in one
unit, the same query must end the same way on both (an answer, or the same static refusal
before any charge), and the rows one unit can add must stay within the analysed k·m.
"""

from __future__ import annotations

from fractions import Fraction

import duckdb
import pandas as pd
import pytest

import dpsql
from dpsql.analysis.joins import join_comparison_type
from dpsql.backends.duckdb import Engine
from dpsql.mechanisms.noise import SeededSource

POLICY = """BUDGET EPSILON 100000 DELTA 0.5;
PRIVATE TABLE v (PRIVACY UNIT uid, MAX ROWS PER UNIT 2, amount BOUNDS 0 TO 10);
PUBLIC TABLE p;
PUBLIC TABLE f;
"""
VISITS = pd.DataFrame({"uid": [1, 1, 2, 3], "code": ["1", "2", "1", "3"], "amount": [1.0, 2.0, 3.0, 4.0],
                       "big": [5, 6, 7, 8], "real": [1.0, 2.0, 3.0, 4.0]})
PUBLIC = pd.DataFrame({"id": [1, 2, 3], "name": ["a", "b", "c"]})
FLOATS = pd.DataFrame({"fid": [float(2**53), 5.0], "label": ["x", "y"]})


def outcome(frames: dict, sql: str, policy: str = POLICY) -> tuple:
    """How a query ends: ('answer', rows) or (error class, message)."""
    try:
        with dpsql.connect(frames, policy=policy, rng=SeededSource(7)) as db:
            return "answer", db.sql(sql, epsilon=1, delta=1e-3).fetchall()
    except dpsql.DPError as error:
        return type(error).__name__, str(error)


def neighbours(extra: dict) -> tuple[dict, dict]:
    """D, and D plus one unit (uid 99) with the given column values."""
    row = {"uid": 99, "code": "1", "amount": 1.0, "big": 5, "real": 1.0} | extra
    with_unit = pd.concat([VISITS, pd.DataFrame([row])], ignore_index=True)
    base = {"p": PUBLIC, "f": FLOATS}
    return base | {"v": VISITS}, base | {"v": with_unit}


def same_kind(sql: str, extra: dict, policy: str = POLICY) -> tuple:
    without, with_unit = (outcome(frames, sql, policy) for frames in neighbours(extra))
    assert without[0] == with_unit[0], (without, with_unit)
    if without[0] != "answer":
        assert without == with_unit  # a refusal is static: the same words whatever the data
    return without, with_unit


def test_join_comparison_types_are_lossless_or_refused():
    assert join_comparison_type("SMALLINT", "UBIGINT") == "HUGEINT"
    assert join_comparison_type("ENUM('a', 'b')", "VARCHAR") == "VARCHAR"
    for private, public in [("VARCHAR", "INTEGER"), ("BIGINT", "DOUBLE"), ("DATE", "TIMESTAMP"),
                            ("DECIMAL(9,2)", "DECIMAL(18,2)"), ("INTERVAL", "INTERVAL"), ("INTEGER[]", "INTEGER[]")]:
        assert join_comparison_type(private, public) is None, (private, public)


@pytest.mark.parametrize("condition", ["v.code = p.id", "v.big = f.fid", "p.id = v.code"])
def test_an_implicit_coercion_in_a_join_is_refused_statically(condition):
    table = "f" if "f." in condition else "p"
    sql = f"SELECT COUNT(*) FROM v JOIN {table} ON {condition}"
    without, _ = same_kind(sql, {"code": "x"})
    assert without[0] == "UnsupportedQuery" and "CAST one side" in without[1], without


def test_a_failing_explicit_cast_in_a_join_is_total():
    """Mechanism 1: one unit's 'x' made the cast raise after the charge, only when present."""
    without, with_unit = same_kind("SELECT COUNT(*) FROM v JOIN p ON CAST(v.code AS INTEGER) = p.id",
                                   {"code": "x"})
    assert without[0] == "answer"


def test_multiplicity_is_counted_in_the_type_the_join_compares():
    """Mechanism 2: many distinct BIGINT ids equal one DOUBLE. Counted on the public ids cast
    to DOUBLE — the join's own comparison — they are one key repeated, not distinct ones."""
    ids = pd.DataFrame({"id": [2**53, 2**53 + 1, 2**53 + 2, 2**53 + 3, 7], "name": list("abcde")})
    frames = {"v": VISITS.assign(real=[float(2**53), 1.0, 2.0, 3.0]), "p": ids, "f": FLOATS}
    with dpsql.connect(frames, policy=POLICY) as db:
        text = db.explain("SELECT COUNT(*) FROM v JOIN p ON v.real = CAST(p.id AS DOUBLE)", epsilon=1)
        # As DOUBLE, 2**53 + 1 rounds (to even) to 2**53: two public rows share that key, so
        # a private row matches at most 2 and one unit's 2 rows at most 4. Counted in BIGINT,
        # every id is distinct and the analysis would claim 2.
        assert "at most 4 rows" in text, text
        answer = db._engine.fetch(
            "SELECT COUNT(*) FROM (VALUES (CAST(9007199254740992 AS DOUBLE))) AS t(x) "
            "JOIN (SELECT CAST(id AS DOUBLE) AS d FROM p) AS q ON t.x = q.d")
        assert answer == [(2,)]


def test_collated_public_keys_cannot_match_more_rows_than_counted(tmp_path):
    """A NOCASE public column groups 'A' and 'a' as one key but a plain private 'a' would match
    both under DuckDB's collation rules: strings are compared as their bytes, so a private row
    matches exactly the rows whose key it equals byte for byte, and m counts exactly those."""
    path = tmp_path / "collated.duckdb"
    with duckdb.connect(str(path)) as setup:
        setup.execute("CREATE TABLE v (uid INTEGER, code VARCHAR, amount DOUBLE)")
        setup.execute("INSERT INTO v VALUES (1, 'a', 1), (2, 'b', 2)")
        setup.execute("CREATE TABLE p (id VARCHAR COLLATE NOCASE, name VARCHAR)")
        setup.execute("INSERT INTO p VALUES ('A', 'x'), ('a', 'y'), ('b', 'z')")
    policy = "BUDGET EPSILON 100; PRIVATE TABLE v (PRIVACY UNIT uid, MAX ROWS PER UNIT 1); PUBLIC TABLE p;"
    with dpsql.connect(path, policy=policy, ledger=tmp_path / "l") as db:
        _, checked, _ = db._check("SELECT COUNT(*) FROM v JOIN p ON v.code = p.id")
        assert checked.rule.max_rows_per_unit == 1  # each byte string appears once in p
        assert checked.rows_per_unit == 1
        joined = db._engine.fetch(f"SELECT dp_unit FROM ({_rows(db, checked)})")
        assert sorted(joined) == [(1,), (2,)]  # 'a' matched 'a' only, not 'A' too


def _rows(db, checked) -> str:
    """The rows layer of a checked query's bounded SQL (unit per joined row)."""
    from dpsql.analysis.analyse import PrivacyOptions, analyse_query
    from dpsql.backends.render import render
    from dpsql.backends.rewrite import _rows_layer
    plan = analyse_query(checked, db.policy, PrivacyOptions(epsilon=Fraction(1)))
    db._engine.fetch("SELECT 1", bounded=checked.bounded)
    return render(_rows_layer(plan))


@pytest.mark.parametrize("subquery, refusal", [
    ("SELECT id, random() AS r FROM p", "RAND"),
    ("SELECT id, current_query() AS r FROM p", "current_query"),
    ("SELECT id, error('boom') AS r FROM p", "error"),
    ("SELECT id, now() AS r FROM p", "now"),
    ("SELECT id, ROW_NUMBER() OVER () AS r FROM p", "window functions"),
    ("SELECT id, getenv('HOME') AS r FROM p", "getenv"),
])
def test_public_subqueries_joined_to_private_data_obey_the_allow_list(subquery, refusal):
    """Mechanism 4: a non-deterministic or failing public subquery could evaluate differently
    when the analysis measured it and when the query ran."""
    without, _ = same_kind(f"SELECT COUNT(*) FROM v JOIN ({subquery}) AS q ON v.uid = q.id", {})
    assert without[0] == "UnsupportedQuery" and refusal.lower() in without[1].lower(), without


def test_the_public_side_is_stored_once_and_the_query_reads_the_stored_rows():
    """Evaluated once, before the charge: the run cannot see other public rows than the ones
    the multiplicity was counted on (DESIGN.md invariant 15)."""
    calls = []
    with dpsql.connect({"v": VISITS, "p": PUBLIC, "f": FLOATS}, policy=POLICY, rng=SeededSource(1)) as db:
        original = db._engine.materialise

        def materialise(sql):
            calls.append(sql)
            return original(sql)

        db._engine.materialise = materialise
        sql = "SELECT COUNT(*) FROM v JOIN (SELECT id FROM p WHERE id > 1) AS q ON v.uid = q.id"
        _, checked, _ = db._check(sql)
        db.explain(sql, epsilon=1)
        db.sql(sql, epsilon=1)
        assert len({c for c in calls}) == 1
        stored = db._engine._instance.materialised
        assert len(stored) == 1
        from dpsql.backends.rewrite import rewrite_plan
        bounded = rewrite_plan(db._preparer.plan(checked, sql, 1, None, None))
        assert next(iter(stored)) in bounded
        assert '"p"' not in bounded  # the public subquery itself does not run again


def test_an_analyst_chosen_fan_out_is_refused_before_the_charge():
    """Mechanism 5: a public cross join made one unit's rows k·10^8, and only its presence
    tripped the statement deadline. m is a public fact, limited by MAX JOIN MULTIPLICITY."""
    sql = ("SELECT COUNT(*) FROM v JOIN (SELECT a.id FROM p AS a, p AS b, p AS c, p AS d, p AS e, p AS f) AS q "
           "ON v.uid = q.id")
    without, _ = same_kind(sql, {})
    assert without[0] == "UnsupportedQuery" and "MAX JOIN MULTIPLICITY 100" in without[1], without
    tight = POLICY + "MAX JOIN MULTIPLICITY 2;"
    sql = "SELECT COUNT(*) FROM v JOIN (SELECT a.id FROM p AS a, p AS b) AS q ON v.uid = q.id"
    without, _ = same_kind(sql, {}, tight)
    assert without[0] == "UnsupportedQuery" and "up to 3 rows" in without[1], without
    with dpsql.connect({"v": VISITS, "p": PUBLIC, "f": FLOATS}, policy=POLICY + "MAX JOIN MULTIPLICITY 3;") as db:
        _, checked, _ = db._check(sql)
        assert checked.rule.max_rows_per_unit == 2 * 3 and checked.rows_per_unit == 2 * 3
    with dpsql.connect({"v": VISITS, "p": PUBLIC, "f": FLOATS}, policy=POLICY) as db:
        with pytest.raises(dpsql.UnsupportedQuery):
            db.sql("SELECT COUNT(*) FROM v JOIN (SELECT a.id FROM p AS a, p AS b, p AS c, p AS d, p AS e, "
                   "p AS f) AS q ON v.uid = q.id", epsilon=1)
        assert db.budget.spent.epsilon == 0


def test_join_conditions_beside_the_keys_are_total():
    """A second condition that fails for one unit's value (an implicit cast) becomes false."""
    without, with_unit = same_kind(
        "SELECT COUNT(*) FROM v JOIN p ON v.uid = p.id AND CAST(v.code AS INTEGER) > 0", {"code": "x"})
    assert without[0] == "answer"


def test_private_joins_make_every_condition_but_the_units_total():
    policy = POLICY + "PRIVATE TABLE w (PRIVACY UNIT uid, MAX ROWS PER UNIT 1);"
    extra = pd.DataFrame({"uid": [1, 2, 99], "n": [1, 2, 3]})
    sql = "SELECT COUNT(*) FROM v JOIN w ON v.uid = w.uid AND v.code = w.n"
    frames = [dict(f, w=extra) for f in neighbours({"code": "x"})]
    results = [outcome(f, sql, policy) for f in frames]
    assert results[0][0] == results[1][0] == "answer", results


def test_which_bounded_copies_a_query_builds_comes_from_its_plan_not_its_text():
    """A public query whose text merely contains a copy's name builds nothing; a private one
    builds exactly the copies its plan reads; eager_bounding builds them at connect."""
    frames = {"v": VISITS, "p": PUBLIC, "f": FLOATS}
    with dpsql.connect(frames, policy=POLICY) as db:
        db.sql("SELECT 'dp_bounded_v__uid__2' AS name, COUNT(*) FROM p")
        assert set(db._engine._instance.filled) == set()
        db.sql("SELECT COUNT(*) FROM v", epsilon=1)
        assert set(db._engine._instance.filled) == {"dp_bounded_v__uid__2"}
    with dpsql.connect(frames, policy=POLICY, eager_bounding=True) as db:
        assert set(db._engine._instance.filled) == {"dp_bounded_v__uid__2"}


def test_materialise_stores_public_rows_once_per_text():
    engine = Engine(duckdb.connect(), owned=True, path=None)
    first = engine.materialise("SELECT 1 AS x")
    assert engine.materialise("SELECT 1 AS x") == first
    assert engine.fetch(f'SELECT x FROM dp_bounding.main."{first}"') == [(1,)]
    engine.close()


def test_an_attached_database_is_out_of_reach(tmp_path):
    """Attacker's finding: with the curator's connection holding a second attached database,
    `raw.main.p` read that database's `p` exactly and for free, beside the declared `p`."""
    main, raw = tmp_path / "main.duckdb", tmp_path / "raw.duckdb"
    with duckdb.connect(str(main)) as setup:
        setup.execute("CREATE TABLE t AS SELECT 1 AS uid, CAST(2 AS DOUBLE) AS x")
        setup.execute("CREATE TABLE p AS SELECT 1 AS k, 1 AS v")
    with duckdb.connect(str(raw)) as setup:
        setup.execute("CREATE TABLE p AS SELECT 42 AS k, 4242 AS v")
    connection = duckdb.connect(str(main), read_only=True)
    connection.execute(f"ATTACH '{raw}' AS raw (READ_ONLY)")
    policy = "BUDGET EPSILON 10; PRIVATE TABLE t (PRIVACY UNIT uid, MAX ROWS PER UNIT 2, x BOUNDS 0 TO 10); PUBLIC TABLE p;"
    with dpsql.connect(connection, policy=policy, ledger=tmp_path / "l") as db:
        for sql in ("SELECT * FROM raw.main.p", "SELECT k FROM raw.main.p UNION ALL SELECT k FROM p",
                    "SELECT COUNT(*) FROM t JOIN (SELECT k FROM raw.main.p) AS q ON t.uid = q.k"):
            with pytest.raises(dpsql.UnsupportedQuery, match="database part"):
                db.sql(sql, epsilon=1)
        assert db.sql("SELECT * FROM p").fetchall() == [(1, 1)]
    connection.close()


@pytest.mark.parametrize("epsilon, delta, sql", [
    ("1e-1000", None, "SELECT SUM(amount) FROM v"),
    (1e-320, None, "SELECT AVG(amount) FROM v"),
    ("1e-50", 1e-5, "SELECT code, COUNT(*) FROM v GROUP BY code"),
    ("2e-12", 1e-5, "SELECT code, COUNT(*) FROM v GROUP BY code"),
    (1, "1e-100000", "SELECT code, COUNT(*) FROM v GROUP BY code"),
])
def test_extreme_parameters_are_invalid_parameters_before_anything_runs(epsilon, delta, sql):
    """The attacker's review: these raised OverflowError, ValueError or InternalError."""
    with dpsql.connect({"v": VISITS, "p": PUBLIC, "f": FLOATS}, policy=POLICY) as db:
        with pytest.raises(dpsql.InvalidParameter):
            db.sql(sql, epsilon=epsilon, delta=delta)
        assert db.budget.spent.epsilon == 0


def test_public_values_at_the_float_extremes_calibrate():
    """Bounds read from public columns as large as 1e308 (or as small as 5e-324) are handled
    exactly: the grid is chosen without converting them to floats."""
    extremes = pd.DataFrame({"id": [1, 2, 3], "w": [5e-324, 1e308, 1.0]})
    with dpsql.connect({"v": VISITS, "p": extremes, "f": FLOATS}, policy=POLICY, rng=SeededSource(1)) as db:
        for sql in ("SELECT SUM(v.amount * p.w) FROM v JOIN p ON v.uid = p.id",
                    "SELECT AVG(p.w) FROM v JOIN p ON v.uid = p.id",
                    "SELECT SUM(CLAMP(p.w, 0, 1)) FROM v JOIN p ON v.uid = p.id"):
            assert len(db.sql(sql, epsilon=1).fetchall()) == 1


def test_public_tables_joined_first_are_refused_with_advice():
    with dpsql.connect({"v": VISITS, "p": PUBLIC, "f": FLOATS}, policy=POLICY) as db:
        with pytest.raises(dpsql.UnsupportedQuery, match="name the private table first"):
            db.sql("SELECT COUNT(*) FROM p JOIN f ON p.id = f.fid JOIN v ON v.uid = p.id", epsilon=1)


def test_a_refresh_by_another_connection_on_the_same_database_re_derives_a_kept_join_plan():
    """Connections on one DuckDB database share the stored public join sides; one connection's
    refresh() rebuilds them, so every other connection must re-derive what its kept plans read of
    them (here a join's multiplicity), not charge an answer calibrated to the old table."""
    con = duckdb.connect()
    con.execute("CREATE TABLE visits(user_id INT, store VARCHAR, amount DOUBLE)")
    con.execute("INSERT INTO visits SELECT i % 20, CASE WHEN i % 2 = 0 THEN 'n' ELSE 's' END, 100 FROM range(200) t(i)")
    con.execute("CREATE TABLE stores(store VARCHAR, region VARCHAR)")
    con.execute("INSERT INTO stores VALUES ('n', 'east'), ('s', 'west')")
    policy = ("BUDGET EPSILON 100; QUERY EPSILON 1; PRIVATE TABLE visits (PRIVACY UNIT user_id, "
              "MAX ROWS PER UNIT 10, amount BOUNDS 0 TO 100); PUBLIC TABLE stores;")
    sql = "SELECT SUM(amount) FROM visits v JOIN stores s ON v.store = s.store"

    def l1(db) -> Fraction:
        measure = db._prepare(sql, None, None, None, None, None).plan.measures[0]
        return measure.sensitivity.l1 * measure.grid

    with dpsql.connect(con, policy=policy) as first, dpsql.connect(con, policy=policy) as second:
        second.sql(sql)
        before = l1(second)
        con.execute("INSERT INTO stores VALUES ('n', 'north')")  # each 'n' visit now joins two stores
        first.refresh()
        assert l1(first) == 2 * before
        assert l1(second) == 2 * before  # kept under the old multiplicity: derived again
