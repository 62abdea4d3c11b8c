"""The Spark backend's own guarantees: bounded copies, deadlines, the wall, pinned settings, key
read-back, and ``dpsql serve`` over a Spark config answering psql (issue 22).

What both engines share (the corpus, the sensitivity oracles) is tested through ``tests/engines.py``;
this module tests what Spark does its own way: its copies are cut by another keyed hash
(``xxhash64``) and cached, its statements stop through job tags, its settings are the session's.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from pathlib import Path

import duckdb
import numpy as np
import pandas as pd
import pytest
from engines import Engine, forget_copies
from spark import session

import dpsql
from dpsql.backends.bounding import BoundedTable
from dpsql.backends.spark.bounding import fill_select
from dpsql.errors import QueryFailed
from dpsql.mechanisms.noise import SeededSource
from dpsql.server import start_in_thread
from dpsql.server.users import add_user

pytestmark = [pytest.mark.spark, pytest.mark.spark_ci, pytest.mark.xdist_group("spark")]

PSQL = shutil.which("psql")
POLICY = """BUDGET EPSILON 100; QUERY EPSILON 1;
PRIVATE TABLE t (PRIVACY UNIT uid, MAX ROWS PER UNIT 3, MAX GROUPS PER UNIT 2,
  x BOUNDS 0 TO 10, g KEYS ('a', 'b', 'c'));"""


def _frame(rows: int = 600, units: int = 60, seed: int = 1) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    return pd.DataFrame({"uid": rng.integers(0, units, rows), "g": rng.choice(["a", "b", "c"], rows),
                         "x": np.round(rng.normal(5, 2, rows), 3)})


@pytest.fixture
def spark_engine():
    opened = Engine("spark")
    yield opened
    opened.close()


def _copy_rows(spark, table: BoundedTable, salt: str) -> list[tuple]:
    return sorted(tuple(row) for row in spark.sql(fill_select(table), args={"salt": salt}).collect())


def test_the_copy_keeps_at_most_k_rows_of_each_unit_chosen_by_the_salt_not_by_storage(spark_engine):
    frame = _frame()
    spark = spark_engine.load({"t": frame})
    table = BoundedTable("t", "uid", 3, (("uid", "BIGINT"), ("g", "VARCHAR"), ("x", "DOUBLE")))
    kept = _copy_rows(spark, table, "00" * 16)
    per_unit = pd.DataFrame(kept, columns=["uid", "g", "x", "dp_unit_rows", "dp_pad", "dp_raw_rows"]).groupby("uid").size()
    raw = frame.groupby("uid").size()
    assert (per_unit == raw.clip(upper=3)).all(), "each unit keeps min(rows, k) of its rows"
    # The same rows stored in another order and other partitions: the same copy.
    spark.table("t").repartition(7).orderBy("x").createOrReplaceTempView("t")
    assert _copy_rows(spark, table, "00" * 16) == kept
    # Another salt chooses other rows of the units that have more than k.
    assert _copy_rows(spark, table, "11" * 16) != kept


def test_rows_without_a_unit_and_overlong_ids_are_left_out(spark_engine):
    frame = pd.DataFrame({"uid": ["a", None, "x" * 1001, "b"], "x": [1.0, 2.0, 3.0, 4.0]})
    spark = spark_engine.load({"t": frame})
    table = BoundedTable("t", "uid", 2, (("uid", "VARCHAR"), ("x", "DOUBLE")))
    assert [row[0] for row in _copy_rows(spark, table, "ab" * 16)] == ["a", "b"]


def test_row_level_copies_give_each_row_its_own_id(spark_engine):
    frame = pd.DataFrame({"x": [1.0, 1.0, 2.0, -0.0, 0.0]})
    spark = spark_engine.load({"t": frame})
    table = BoundedTable("t", "dp_row", 1, (("x", "DOUBLE"),), row_level=True)
    rows = _copy_rows(spark, table, "cd" * 16)
    assert len(rows) == 5 and len({row[1] for row in rows}) == 5, "two equal rows still get two ids"
    assert _copy_rows(spark, table, "cd" * 16) == rows


def test_answers_match_duckdb_when_no_unit_is_cut(spark_engine):
    """Units with at most k rows: both copies hold every row, so the same seed gives the same answer."""
    frame = _frame(rows=150, units=60)
    frame = frame.groupby("uid").head(3).reset_index(drop=True)
    queries = ["SELECT COUNT(*) AS n FROM t", "SELECT g, COUNT(*) AS n, SUM(x) AS s FROM t GROUP BY g ORDER BY g",
               "SELECT AVG(x) AS a FROM t WHERE x > 2", "SELECT COUNT(DISTINCT uid) AS u FROM t"]
    policy = POLICY.replace("MAX GROUPS PER UNIT 2", "MAX GROUPS PER UNIT 3")  # no group cut either
    duck = dpsql.connect({"t": frame}, policy=policy, ledger=":memory:", rng=SeededSource(3))
    spark_db = spark_engine.connect({"t": frame}, policy=policy, rng=SeededSource(3))
    for sql in queries:
        assert spark_db.sql(sql).fetchall() == duck.sql(sql).fetchall(), sql
    duck.close()


def test_keys_of_every_shared_type_read_back_as_on_duckdb(spark_engine):
    con = duckdb.connect()
    # Forty units share each row's values, so every key clears the threshold of its release.
    con.execute("""CREATE TABLE t AS SELECT uid * 100 + k AS uid, * EXCLUDE (uid, k) FROM (VALUES
        (1, 1.5::DOUBLE, -0.0::DOUBLE, DATE '2024-02-29', TIMESTAMP '2024-01-01 10:00:00.25',
         TIMESTAMPTZ '2024-03-31 02:30:00+00', 'Zürich', 12.50::DECIMAL(9,2), true, 7::SMALLINT),
        (2, 1e22::DOUBLE, 0.0::DOUBLE, DATE '0999-12-31', TIMESTAMP '9999-12-31 23:59:59.999999',
         TIMESTAMPTZ '1970-01-01 00:00:00+00', 'a''b"c', -0.01::DECIMAL(9,2), false, -7::SMALLINT))
        AS v(uid, d, z, day, ts, tz, s, m, b, i), range(40) AS r(k)""")
    columns = ["d", "z", "day", "ts", "tz", "s", "m", "b", "i"]
    policy = ("BUDGET EPSILON 100 DELTA 1e-3;\nPRIVATE TABLE t (PRIVACY UNIT uid, MAX ROWS PER UNIT 1, "
              "MAX GROUPS PER UNIT 1);")
    duck = dpsql.connect(con, policy=policy, ledger=":memory:", rng=SeededSource(5))
    spark_db = spark_engine.connect(con, policy=policy, rng=SeededSource(5))
    for column in columns:
        sql = (f"SELECT WITH DIFFERENTIAL_PRIVACY OPTIONS (epsilon = 5, delta = 1e-6) {column}, "
               f"COUNT(*) AS n FROM t GROUP BY {column} ORDER BY {column}")
        assert spark_db.sql(sql).fetchall() == duck.sql(sql).fetchall(), column
    duck.close()


def test_a_changed_setting_is_refused_before_anything_runs(spark_engine):
    spark = spark_engine.load({"t": _frame(rows=10)})
    db = dpsql.connect(spark, policy=POLICY, ledger=":memory:")
    spark.conf.set("spark.sql.ansi.enabled", "false")
    try:
        with pytest.raises(dpsql.DPError, match="spark.sql.ansi.enabled"):
            db.sql("SELECT COUNT(*) FROM t")
        assert db.budget.spent.epsilon == 0
    finally:
        spark.conf.set("spark.sql.ansi.enabled", "true")
        db.close()



COLLATION = "spark.sql.session.collation.default"


def test_a_session_default_collation_is_pinned_binary_and_a_change_refused(spark_engine):
    """A session handed over with UTF8_LCASE as its default collation is pinned back to
    UTF8_BINARY; 'a' and 'A' stay two groups, as on DuckDB (seeded: the same answer); setting
    it again afterwards refuses the next query before anything is charged."""
    frame = pd.DataFrame({"uid": range(80), "s": ["a"] * 40 + ["A"] * 40})
    spark = spark_engine.load({"t": frame})
    policy = ("BUDGET EPSILON 100 DELTA 1e-3; "
              "PRIVATE TABLE t (PRIVACY UNIT uid, MAX ROWS PER UNIT 1, MAX GROUPS PER UNIT 1);")
    sql = ("SELECT WITH DIFFERENTIAL_PRIVACY OPTIONS (epsilon = 5, delta = 1e-6) s, COUNT(*) AS n "
           "FROM t GROUP BY s ORDER BY s")
    spark.conf.set(COLLATION, "UTF8_LCASE")
    try:
        db = dpsql.connect(spark, policy=policy, ledger=":memory:", rng=SeededSource(4))
        assert spark.conf.get(COLLATION) == "UTF8_BINARY"
        rows = db.sql(sql).fetchall()
        with dpsql.connect({"t": frame}, policy=policy, ledger=":memory:", rng=SeededSource(4)) as duck:
            assert rows == duck.sql(sql).fetchall()
        assert [key for key, _ in rows] == ["A", "a"] and all(25 < n < 55 for _, n in rows)  # scale 0.2 noise
        spent = db.budget.spent.epsilon
        spark.conf.set(COLLATION, "UTF8_LCASE")
        with pytest.raises(dpsql.DPError, match=f"{COLLATION} is 'UTF8_LCASE', dpsql needs 'UTF8_BINARY'"):
            db.sql(sql.replace("epsilon = 5", "epsilon = 4"))
        assert db.budget.spent.epsilon == spent
        db.close()
    finally:
        spark.conf.set(COLLATION, "UTF8_BINARY")

def test_a_statement_spark_cannot_analyse_is_refused_without_spark_s_text(spark_engine):
    """Spark's analysis errors quote the analysed plan: with a salted hash in the failing
    expression, the salt would be in the refusal. Only the error's class is shown."""
    spark = spark_engine.load({"t": _frame(rows=10)})
    db = dpsql.connect(spark, policy=POLICY, ledger=":memory:")
    try:
        with pytest.raises(dpsql.UnsupportedQuery) as refused:
            db._engine.describe("SELECT xxhash64(:salt, map(1, 2)) AS h", {"salt": "SECRETSALT123"})
        assert "DATATYPE_MISMATCH" in str(refused.value)
        assert "SECRETSALT123" not in str(refused.value) and "xxhash64" not in str(refused.value)
    finally:
        db.close()


SLOW_STATEMENT = "SELECT COUNT(*) FROM range(0, 4000000000) WHERE sha2(CAST(id AS STRING), 256) = ''"
"""About ten minutes of hashing on two cores: nothing but the deadline ends it in a test."""


def test_a_statement_past_its_deadline_is_stopped_and_the_session_stays_usable(spark_engine):
    spark = spark_engine.load({"t": _frame(rows=10)})
    db = dpsql.connect(spark, policy=POLICY, ledger=":memory:", query_timeout=2)
    try:
        started = time.monotonic()
        with pytest.raises(QueryFailed, match="time limit of 2 s"):
            db._engine.fetch(SLOW_STATEMENT)
        assert time.monotonic() - started < 30, "the job ran on past its cancellation"
        tracker = spark.sparkContext.statusTracker()
        for _ in range(50):  # the cancelled job's end reaches the tracker a moment later
            if not tracker.getActiveJobsIds():
                break
            time.sleep(0.1)
        assert not tracker.getActiveJobsIds(), "a cancelled statement left a job running"
        assert db._engine.fetch("SELECT COUNT(*) FROM range(0, 10)") == [(10,)]
        assert db.sql("SELECT COUNT(*) FROM t").fetchall()
    finally:
        db.close()

@pytest.mark.parametrize("sql", [
    "SELECT COUNT(*) FROM parquet.`/etc`",
    "SELECT COUNT(*) FROM t WHERE reflect('java.lang.System', 'exit', 0) IS NULL",
    "SELECT COUNT(*) FROM t WHERE java_method('java.lang.Math', 'abs', x) > 0",
    "SET spark.sql.ansi.enabled = false",
    "SELECT COUNT(*) FROM dp_bounded_t__uid__3",
    "SELECT COUNT(*) FROM global_temp.t",
    "SELECT COUNT(*) FROM t WHERE current_catalog() = 'spark_catalog'",
])
def test_the_wall_analyst_text_never_reaches_spark(spark_engine, sql):
    db = spark_engine.connect({"t": _frame(rows=10)}, policy=POLICY)
    with pytest.raises(dpsql.DPError):
        db.sql(sql)
    assert db.budget.spent.epsilon == 0


@pytest.mark.skipif(PSQL is None, reason="psql is not installed")
def test_dpsql_serve_over_a_spark_config_answers_psql(tmp_path):
    """The curator's command line: Parquet files named in a config, a policy, a users file."""
    forget_copies(session())
    con = duckdb.connect()
    con.register("frame", _frame(rows=300, units=50))
    con.execute(f"COPY (SELECT * FROM frame) TO '{tmp_path / 't.parquet'}' (FORMAT PARQUET)")
    config = tmp_path / "shop.spark.toml"
    config.write_text('[spark]\nmaster = "local[2]"\n\n[tables]\nt = "t.parquet"\n')
    (tmp_path / "p.policy").write_text(POLICY)
    add_user(tmp_path / "users", "ada", "ada-secret")
    server = start_in_thread(config, users=tmp_path / "users", policy=tmp_path / "p.policy", port=0)
    try:
        environment = {**os.environ, "PGPASSWORD": "ada-secret", "PGCONNECT_TIMEOUT": "20"}
        done = subprocess.run([PSQL, "-h", "127.0.0.1", "-p", str(server.port), "-U", "ada", "-d", "shop", "-X",
                               "-c", "SELECT nope FROM t",  # first: psql's status is its last command's
                               "-c", "SELECT g, COUNT(*) AS n FROM t GROUP BY g ORDER BY g"],
                              env=environment, capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr
        assert "NOTICE:  dpsql: cost epsilon" in done.stderr
        assert [line.split("|")[0].strip() for line in done.stdout.splitlines()[2:5]] == ["a", "b", "c"]
        assert "ERROR:  unknown column nope" in done.stderr
    finally:
        server.stop()
        server.thread.join(30)
    assert Path(f"{config}.ledger").exists(), "the ledger is a local file beside the config"
    forget_copies(session())


def test_one_dataset_is_one_budget_across_duckdb_and_spark(tmp_path):
    """Issue 35: the same table served from a DuckDB file, a Python Spark session and a Spark config
    is one budget. A second ledger over it is refused before anything is read (no ledger file made);
    the config's ``[spark] ledger`` and ``ledger=`` share the DuckDB file's ledger and what it spent."""
    forget_copies(session())
    with duckdb.connect(str(tmp_path / "t.duckdb")) as con:
        con.register("frame", _frame(rows=200, units=40))
        con.execute("CREATE TABLE t AS SELECT * FROM frame")
        con.execute(f"COPY t TO '{tmp_path / 't.parquet'}' (FORMAT PARQUET)")
    with dpsql.connect(str(tmp_path / "t.duckdb"), policy=POLICY) as db:
        db.sql("SELECT COUNT(*) FROM t", epsilon=0.5)
    spark = session()
    spark.read.parquet(str(tmp_path / "t.parquet")).createOrReplaceTempView("t")
    with pytest.raises(dpsql.SecondBudget, match=r"\(t\(uid\)\) already have a budget in .*t\.duckdb\.ledger"):
        dpsql.connect(spark, policy=POLICY, ledger=tmp_path / "spark.ledger")
    config = tmp_path / "t.spark.toml"
    config.write_text('[spark]\nmaster = "local[2]"\n\n[tables]\nt = "t.parquet"\n')
    with pytest.raises(dpsql.SecondBudget, match=r"t\.duckdb\.ledger"):
        dpsql.connect(config, policy=POLICY)  # its own ledger, beside it
    assert not (tmp_path / "spark.ledger").exists() and not Path(f"{config}.ledger").exists()
    config.write_text('[spark]\nmaster = "local[2]"\nledger = "t.duckdb.ledger"\n\n[tables]\nt = "t.parquet"\n')
    with dpsql.connect(config, policy=POLICY) as db:
        assert db.budget.spent.epsilon == 0.5
        db.sql("SELECT COUNT(*) FROM t", epsilon=0.25)
    with dpsql.connect(spark, policy=POLICY, ledger=tmp_path / "t.duckdb.ledger") as db:
        assert db.budget.spent.epsilon == 0.75
    forget_copies(session())


def test_the_sparse_vector_runs_on_spark_as_on_duckdb(spark_engine):
    """The stream's statements are planned and rendered for the engine, then run through the one
    executor: the same exact answers (no salted choice: every unit has at most k rows), so the
    same seeded release on both engines, each charged once."""
    frame = _frame(rows=150, units=60).drop_duplicates("uid")
    queries = ["SELECT COUNT(*) FROM t WHERE g = 'a'", "SELECT SUM(x) FROM t WHERE g <> 'a'", "SELECT COUNT(*) FROM t"]
    answers = []
    for db in (dpsql.connect({"t": frame}, policy=POLICY, ledger=":memory:", rng=SeededSource(9)),
               spark_engine.connect({"t": frame}, policy=POLICY, rng=SeededSource(9))):
        answers.append(db.sql(f"SELECT * FROM above_threshold({', '.join(f'$${q}$$' for q in queries)}, "
                              "threshold = 40, epsilon = 2, max_above = 2, values = true)").fetchall())
        assert db.budget.spent.epsilon == 4
    assert answers[0] == answers[1]


def test_a_fit_runs_on_spark_as_on_duckdb(spark_engine):
    """Each step's statement is rendered for the engine from the same trees: with one row per unit
    (no float sum inside a unit) every step's exact integer sums agree, so the seeded fit is the
    same model on both engines, charged once on each."""
    frame = _frame(rows=150, units=60).drop_duplicates("uid")
    frame["w"] = np.where(frame["g"] == "a", 1.0, 0.0)
    policy = POLICY.replace("BUDGET EPSILON 100;", "BUDGET EPSILON 100 DELTA 1e-3;")
    models = []
    for db in (dpsql.connect({"t": frame}, policy=policy, ledger=":memory:", rng=SeededSource(4)),
               spark_engine.connect({"t": frame}, policy=policy, rng=SeededSource(4))):
        models.append(db.sql("SELECT * FROM fit('SELECT CLAMP(w, 0, 1) AS a, x FROM t', target = 'x', epsilon = 2, "
                             "delta = 1e-6, steps = 2)").fetchall())
        assert db.budget.spent.epsilon == 2
    assert models[0] == models[1]
