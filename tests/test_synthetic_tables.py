"""Synthetic tables, stored and queried (issue 39, item 3): kept owner-only beside the ledger for
the analyst who paid, reloaded from disk, queried exactly and free by their owner only, in a
sandbox that reaches nothing else; another analyst cannot tell one exists.

Releases are built by hand here (``SyntheticRelease`` is the synthesizer's contract), and kept
through a ``SyntheticTables`` over the same ledger file as the connection: disk is the truth,
so the connection finds them as a second server process would.
"""

from __future__ import annotations

import os
import stat

import pandas as pd
import pytest

import dpsql
import dpsql.backends.duckdb.synthetic as synthetic_engine
from dpsql.backends.duckdb.synthetic import SyntheticSandbox, write_synthetic_file
from dpsql.errors import InsecureFile, InvalidParameter, QueryFailed, UnsupportedQuery
from dpsql.mechanisms.synthetic_release import Measured, SyntheticRelease
from dpsql.query.synthetic_tables import SyntheticTables, synthetic_directory

POLICY = ("BUDGET EPSILON 5 DELTA 1e-5; PRIVATE TABLE t (PRIVACY UNIT uid, MAX ROWS PER UNIT 1, "
          "a KEYS (0, 1, 2), b KEYS ('x', 'y'), v BOUNDS 0 TO 10); PUBLIC TABLE p;")
PRIVATE = pd.DataFrame({"uid": range(30), "a": [i % 3 for i in range(30)], "b": ["x", "y"] * 15,
                        "v": [float(i % 10) for i in range(30)]})
PUBLIC = pd.DataFrame({"a": [0, 1, 2], "label": ["zero", "one", "two"]})
SYNTHETIC = pd.DataFrame({"a": [0, 1, 1, 2, 2, 2], "b": ["x", "y", "y", "x", "y", "x"],
                          "v": ["[0, 5)", "[5, 10]", "[0, 5)", "[0, 5)", "[5, 10]", "[5, 10]"]})


def release(name: str = "fake", analyst: str | None = "alice", table: pd.DataFrame = SYNTHETIC,
            **changes) -> SyntheticRelease:
    fields = dict(name=name, source="t", method="aim", table=table, rows=len(table), epsilon=1.0, delta=1e-6,
                  rho=0.0421, measured=(Measured(("a",), 0.01, 7.07), Measured(("a", "b"), 0.0321, 3.95)),
                  bins={"a": ("0", "1", "2"), "b": ("x", "y"), "v": ("[0, 5)", "[5, 10]")}, analyst=analyst,
                  created="2026-12-08T01:00:00+00:00", error_estimates={("a", "b"): 12.5})
    fields.update(changes)
    return SyntheticRelease(**fields)


@pytest.fixture
def ledger(tmp_path):
    return tmp_path / "shop.ledger"


@pytest.fixture
def db(ledger):
    with dpsql.connect({"t": PRIVATE, "p": PUBLIC}, policy=POLICY, ledger=ledger) as connection:
        yield connection


def keep(ledger, *releases: SyntheticRelease) -> None:
    """Keep ``releases`` as another process over the same ledger would."""
    store = SyntheticTables(ledger, ["t", "p"])
    for made in releases:
        store.keep(made)


def refusal(connection, sql: str) -> str:
    with pytest.raises(dpsql.DPError) as refused:
        connection.sql(sql)
    return str(refused.value)


# -- kept with the ledger ------------------------------------------------------------------------

def test_a_kept_table_is_owner_only_on_disk_and_survives_a_restart(ledger):
    keep(ledger, release())
    directory = synthetic_directory(ledger)
    (folder,) = directory.iterdir()  # the owner's
    assert stat.S_IMODE(directory.stat().st_mode) == 0o700 and stat.S_IMODE(folder.stat().st_mode) == 0o700
    files = list(folder.iterdir())
    assert len(files) == 1 and stat.S_IMODE(files[0].stat().st_mode) == 0o600
    with dpsql.connect({"t": PRIVATE, "p": PUBLIC}, policy=POLICY, ledger=ledger, analyst="alice") as later:
        back = later.sql("SELECT * FROM fake ORDER BY a, b, v").df()
    assert back.equals(SYNTHETIC.sort_values(["a", "b", "v"]).reset_index(drop=True))


def test_a_stored_release_reads_back_whole(ledger):
    table = pd.DataFrame({"i": [1, 2, None], "f": [0.5, -1.25, 2.0], "s": ["a", None, "c"], "t": [True, False, True]})
    table["i"] = table["i"].astype("Int64")
    made = release(table=table)
    keep(ledger, made)
    back = SyntheticTables(ledger, []).find("alice", "FAKE")
    assert back is not None and back.table.equals(table) and list(back.table.dtypes) == list(table.dtypes)
    assert (back.measured, back.bins, back.error_estimates, back.rho, back.created) == \
           (made.measured, made.bins, made.error_estimates, made.rho, made.created)


def test_a_table_kept_by_another_process_is_found_on_a_miss(db, ledger):
    alice = db.acting_for("alice")
    assert alice.synthetic_tables().empty
    keep(ledger, release())  # after this connection opened, by another store
    assert list(alice.synthetic_tables()["name"]) == ["fake"]
    assert alice.sql("SELECT COUNT(*) FROM fake").fetchall() == [(6,)]


def test_a_file_others_could_read_is_refused(ledger):
    keep(ledger, release())
    (path,) = synthetic_directory(ledger).rglob("*.duckdb")
    os.chmod(path, 0o644)
    with pytest.raises(InsecureFile, match="chmod 600"):
        SyntheticTables(ledger, []).find("alice", "fake")


def test_names_are_checked_before_the_charge(ledger):
    store = SyntheticTables(ledger, ["t", "Main.P"])
    store.keep(release())
    for name, said in (("T", "a table of the database"), ("p", "a table of the database"),
                       ("FAKE", "already have"), ("dp_x", "starts with dp_"), ("pg_class", "starts with pg_"),
                       ("two words", "plain SQL name"), ("", "plain SQL name"), ("x" * 64, "at most 63")):
        with pytest.raises(InvalidParameter, match=said):
            store.check_name("alice", name)
    store.check_name("bob", "fake")  # another analyst's name is free for bob, and says nothing of alice's
    store.check_name(None, "fake")
    kept = SyntheticTables(ledger, []).keep(release(name="Fake", rows=99))  # another process's, after the check
    assert kept.name == "Fake_2" and store.made("alice", "fake").rows == 6  # neither lost nor overwritten
    assert store.made("alice", "fake_2").rows == 99


def test_in_memory_ledgers_keep_them_in_memory():
    store = SyntheticTables(None, ["t"])
    store.keep(release())
    assert store.names("alice") == ["fake"] and store.names("bob") == [] and store.directory is None
    assert store.keep(release()).name == "fake_2" and store.names("alice") == ["fake", "fake_2"]


# -- queried free by its owner ---------------------------------------------------------------------

def test_the_owner_queries_it_exactly_and_free(db, ledger):
    keep(ledger, release())
    alice = db.acting_for("alice")
    before = alice.budget
    result = alice.sql("SELECT a, b, COUNT(*) AS n FROM fake GROUP BY a, b ORDER BY a, b")
    expected = SYNTHETIC.groupby(["a", "b"]).size().reset_index(name="n")
    assert result.fetchall() == list(expected.itertuples(index=False, name=None))
    assert result.exact and result.cost.epsilon == 0 and result.cost.delta == 0 and result.cost.synthetic
    assert "free: your synthetic tables only" in str(result)
    assert alice.budget == before and db.ledger().empty  # nothing charged, nothing recorded
    assert any("answered exactly from your synthetic table fake (AIM over t" in note for note in result.notes)
    assert any("measured: it estimates that marginal's error at about 12 rows in all" in note for note in result.notes)


def test_the_error_estimate_is_given_only_for_a_measured_marginal_count(db, ledger):
    keep(ledger, release())
    alice = db.acting_for("alice")
    for sql in ("SELECT a, COUNT(*) FROM fake GROUP BY a",  # measured, but no estimate for it
                "SELECT a, b, COUNT(*) FROM fake WHERE v = '[0, 5)' GROUP BY a, b",
                "SELECT a, v, COUNT(*) FROM fake GROUP BY a, v",
                "SELECT a, b, SUM(1) FROM fake GROUP BY a, b"):
        notes = alice.sql(sql).notes
        assert not any("estimate" in note for note in notes), sql
        assert any("synthetic table fake" in note for note in notes)
    reordered = alice.sql("SELECT b, a, COUNT(*) AS n FROM fake GROUP BY b, a ORDER BY n DESC LIMIT 2")
    assert any("error at about 12 rows in all" in note for note in reordered.notes)


def test_any_sql_runs_over_several_of_ones_own_synthetic_tables(db, ledger):
    other = pd.DataFrame({"a": [0, 1, 2], "w": [10, 20, 30]})
    keep(ledger, release(), release(name="Other", table=other))
    alice = db.acting_for("alice")
    rows = alice.sql("WITH f AS (SELECT a, COUNT(*) AS n FROM fake GROUP BY a) "
                     "SELECT f.a, n * w AS nw FROM f JOIN main.other o ON f.a = o.a ORDER BY f.a").fetchall()
    assert rows == [(0, 10), (1, 40), (2, 90)]
    assert alice.sql("SELECT AVG(w) FROM other").fetchall() == [(20.0,)]
    assert alice.sql("SELECT r, COUNT(a) FROM range(4) AS s(r) LEFT JOIN fake ON a = r GROUP BY r ORDER BY r"
                     ).fetchall() == [(0, 1), (1, 2), (2, 3), (3, 0)]  # numbers of its own: no other table
    assert float(alice.budget.spent.epsilon) == 0


def test_mixing_synthetic_and_database_tables_is_refused_before_anything(db, ledger):
    keep(ledger, release())
    alice = db.acting_for("alice")
    for sql, other in (("SELECT * FROM fake JOIN t USING (a)", "the table t"),
                       ("SELECT COUNT(*) FROM fake WHERE a IN (SELECT a FROM t)", "the table t"),
                       ("SELECT * FROM fake JOIN p USING (a)", "the table p"),
                       ("SELECT * FROM fake UNION ALL SELECT a, b, NULL FROM main.t", "the table t"),
                       ("SELECT * FROM fake, nowhere", "nowhere, which is not one of your synthetic tables")):
        text = refusal(alice, sql)
        assert f"reads your synthetic table fake and also {other}" in text, sql
        assert "query them separately" in text
    assert db.ledger().empty and float(db.budget.spent.epsilon) == 0


# -- the sandbox -----------------------------------------------------------------------------------

def test_files_and_other_databases_are_out_of_reach(db, ledger, tmp_path):
    keep(ledger, release())
    alice = db.acting_for("alice")
    secret = tmp_path / "secret.csv"
    secret.write_text("x\n42\n")
    for sql in (f"SELECT * FROM fake, read_csv('{secret}')",
                f"SELECT * FROM fake WHERE a IN (SELECT x FROM read_parquet('{secret}'))",
                "SELECT * FROM fake, query_table('t')",
                "SELECT * FROM fake, query('SELECT * FROM t')",
                f"SELECT * FROM fake WHERE a = (SELECT COUNT(*) FROM glob('{tmp_path}/*'))"):
        assert "reads your synthetic table fake and also" in refusal(alice, sql), sql
    for sql in (f"COPY fake TO '{tmp_path}/out.csv'", f"ATTACH '{tmp_path}/x.duckdb'", "PRAGMA database_list",
                "SET enable_external_access = true", "INSTALL httpfs", "SELECT 1 FROM fake; SELECT 2"):
        with pytest.raises(UnsupportedQuery):
            alice.sql(sql)
    assert not (tmp_path / "out.csv").exists() and not (tmp_path / "x.duckdb").exists()


@pytest.mark.parametrize("kept", ["in memory", "in a file"])
def test_the_sandbox_itself_refuses_files_settings_and_holds_nothing_else(tmp_path, kept):
    """The second wall, met with raw text as if the first had let it through; a table kept in a
    file is copied in before external access is turned off, and its file is not reachable after."""
    secret = tmp_path / "secret.csv"
    secret.write_text("x\n42\n")
    source = SYNTHETIC
    if kept == "in a file":
        source = tmp_path / "fake.duckdb"
        write_synthetic_file(source, SYNTHETIC, "{}")
    with SyntheticSandbox({"fake": source}) as sandbox:
        assert sandbox.run("SELECT COUNT(*) FROM fake")[1] == [(6,)]
        with pytest.raises(UnsupportedQuery, match="disabled"):
            sandbox.run(f"ATTACH '{tmp_path / 'fake.duckdb'}' AS again (READ_ONLY)")
        for sql in (f"SELECT * FROM read_csv('{secret}')", f"SELECT * FROM read_parquet('{secret}')",
                    f"SELECT * FROM read_text('{secret}')", f"SELECT * FROM glob('{tmp_path}/*')",
                    f"ATTACH '{tmp_path}/x.duckdb'", f"COPY fake TO '{tmp_path}/out.csv'",
                    "SET enable_external_access = true", "SET lock_configuration = false", "INSTALL httpfs",
                    "SELECT * FROM t", "SELECT * FROM dp_synthetic_frame", "SELECT * FROM PRIVATE"):
            with pytest.raises(UnsupportedQuery):
                sandbox.run(sql)
        assert sandbox.run("SELECT table_name FROM duckdb_tables()")[1] == [("fake",)]
        assert sandbox.run("SELECT database_name, path FROM duckdb_databases() WHERE NOT internal")[1] == \
            [("memory", None)]
        assert sandbox.run("SELECT current_setting('enable_external_access')")[1] == [(False,)]
    assert not (tmp_path / "out.csv").exists() and not (tmp_path / "x.duckdb").exists()


def test_a_runaway_query_is_stopped():
    with SyntheticSandbox({"fake": SYNTHETIC}, timeout=0.2) as sandbox:
        with pytest.raises(QueryFailed, match="longer than 0.2 seconds"):
            sandbox.run("SELECT COUNT(*) FROM range(100000000000) r1, fake")


def test_a_cancel_stops_a_free_query_and_the_server_limit_applies():
    """A free query holds a server worker like any other: the per-statement limit the curator set
    (shorter than the sandbox's own) and a cancel request stop it (attacker review: a free 30 s
    query ignored both)."""
    with SyntheticSandbox({"fake": SYNTHETIC}, timeout=0.3, cancelled=lambda: True) as sandbox:
        with pytest.raises(QueryFailed, match="cancelled"):
            sandbox.run("SELECT COUNT(*) FROM range(100000000000) r1, fake")
    with SyntheticSandbox({"fake": SYNTHETIC}, timeout=1000.0) as sandbox:
        assert sandbox._timeout == 30.0  # never longer than the sandbox's own limit


def test_a_free_answer_is_bounded_in_rows(monkeypatch):
    """Its rows are held in the server's memory, outside DuckDB's limit, at no cost: bounded."""
    monkeypatch.setattr(synthetic_engine, "SANDBOX_ROWS", 5)
    with SyntheticSandbox({"fake": SYNTHETIC}) as sandbox:
        assert len(sandbox.run("SELECT * FROM range(5)")[1]) == 5
        with pytest.raises(UnsupportedQuery, match="more than 5 rows"):
            sandbox.run("SELECT * FROM range(6)")


def test_the_sandbox_spills_only_to_a_directory_of_the_curators_alone():
    """Not DuckDB's default .tmp in the server's working directory, made under the umask."""
    with SyntheticSandbox({"fake": SYNTHETIC}) as sandbox:
        spill = sandbox.run("SELECT current_setting('temp_directory')")[1][0][0]
        assert stat.S_IMODE(os.stat(spill).st_mode) == 0o700 and "dpsql-spill-" in spill
    assert not os.path.exists(spill)


# -- nobody else sees it ---------------------------------------------------------------------------

def test_another_analyst_meets_the_refusal_of_a_table_nobody_made(db, ledger, tmp_path):
    queries = ("SELECT COUNT(*) FROM fake", "SELECT a, COUNT(*) FROM fake GROUP BY a",
               "SELECT * FROM fake JOIN t USING (a)")
    with dpsql.connect({"t": PRIVATE, "p": PUBLIC}, policy=POLICY, ledger=":memory:") as fresh:
        nobody = {sql: refusal(fresh.acting_for("bob"), sql) for sql in queries}
    keep(ledger, release())
    for sql in queries:
        assert refusal(db.acting_for("bob"), sql) == nobody[sql]
        assert refusal(db, sql) == nobody[sql]  # the curator's own are separate too
    assert db.acting_for("bob").synthetic_tables().empty
    assert db.acting_for("bob").sql("SELECT * FROM synthetic_tables()").fetchall() == []
    with pytest.raises(UnsupportedQuery) as refused:
        db.acting_for("bob").explain("SELECT COUNT(*) FROM fake")
    assert "unknown table fake" in str(refused.value)


def test_an_analyst_with_tables_of_their_own_learns_nothing_of_anothers(db, ledger):
    keep(ledger, release(name="mine", analyst="bob"))
    bob = db.acting_for("bob")
    before = refusal(bob, "SELECT * FROM mine, fake")
    keep(ledger, release(analyst="alice"))
    assert refusal(bob, "SELECT * FROM mine, fake") == before
    assert refusal(bob, "SELECT * FROM fake") == refusal(bob, "SELECT * FROM fakf").replace("fakf", "fake")


def test_the_curator_has_tables_of_their_own(db, ledger):
    keep(ledger, release(name="mine", analyst=None), release(analyst="alice"))
    assert db.sql("SELECT COUNT(*) FROM mine").fetchall() == [(6,)]
    assert list(db.synthetic_tables()["name"]) == ["mine"]
    assert "unknown table mine" in refusal(db.acting_for("alice"), "SELECT COUNT(*) FROM mine")


# -- explained and listed --------------------------------------------------------------------------

def test_explain_says_it_is_free_and_what_was_measured(db, ledger):
    keep(ledger, release())
    text = db.acting_for("alice").explain("SELECT a, b, COUNT(*) FROM fake GROUP BY a, b")
    for said in ("cost: free", "no charge", "synthetic table fake: AIM over t, 6 rows, made 2026-12-08",
                 "epsilon 1, delta 1e-06 (rho 0.0421", "(a): rho 0.01, sigma 7.07",
                 "(a, b): rho 0.0321, sigma 3.95, estimated error 12 rows in all",
                 "total rho spent measuring and choosing: 0.0421",
                 "a: 0, 1, 2", "v: [0, 5), [5, 10]", "sandbox holding only your synthetic tables", "FROM fake"):
        assert said in text, said
    assert text.refused is None and db.ledger().empty


def test_explain_names_the_row_count_among_what_was_measured(db, ledger):
    keep(ledger, release(measured=(Measured((), 0.005, 14.1), Measured(("a", "b"), 0.0371, 3.67))))
    text = db.acting_for("alice").explain("SELECT COUNT(*) FROM fake")
    assert "the row count: rho 0.005, sigma 14.1" in text and "(a, b): rho 0.0371, sigma 3.67" in text
    assert list(db.acting_for("alice").synthetic_tables()["marginals"]) == [1]  # the row count is no marginal


def test_a_marginal_measured_twice_gives_its_estimate_once_at_its_last_measurement(db, ledger):
    keep(ledger, release(measured=(Measured(("a", "b"), 0.01, 7.0), Measured(("b", "a"), 0.03, 4.0))))
    text = db.acting_for("alice").explain("SELECT COUNT(*) FROM fake")
    assert "measured (2 measurements in order" in text
    assert "(a, b): rho 0.01, sigma 7\n" in text and "(b, a): rho 0.03, sigma 4, estimated error 12 rows in all" in text
    assert list(db.acting_for("alice").synthetic_tables()["marginals"]) == [1]  # one marginal, measured twice


def test_the_listing_is_every_table_of_ones_own_and_queryable(db, ledger):
    keep(ledger, release(), release(name="second", method="mst", rows=99), release(name="bobs", analyst="bob"))
    alice = db.acting_for("alice")
    listed = alice.synthetic_tables()
    assert list(listed["name"]) == ["fake", "second"]
    assert list(listed.columns) == ["name", "source", "method", "rows", "epsilon", "delta", "rho", "marginals",
                                    "created"]
    assert alice.sql("SELECT name, method, rows FROM synthetic_tables() WHERE method = 'mst'").fetchall() == \
        [("second", "mst", 99)]
    assert "your synthetic tables (2)" in alice.explain("SELECT * FROM synthetic_tables()")


def test_each_owner_has_a_folder_of_their_own_whatever_their_name(ledger):
    long_name, odd_name = "x" * 200, "ana/../lyst"
    keep(ledger, release(analyst=long_name), release(analyst=odd_name), release(analyst=None))
    store = SyntheticTables(ledger, [])
    for owner in (long_name, odd_name, None):
        assert store.names(owner) == ["fake"] and store.find(owner, "fake").table.equals(SYNTHETIC)
    assert store.names("x") == [] and len(list(synthetic_directory(ledger).iterdir())) == 3


def test_a_folder_that_cannot_be_made_is_refused_by_the_name_check(ledger):
    synthetic_directory(ledger).write_text("not a folder")  # what a folder cannot be made over, even by root
    with pytest.raises(InvalidParameter, match="cannot be kept beside the ledger"):
        SyntheticTables(ledger, ["t"]).check_name("alice", "fake")


def test_two_keeps_of_one_name_at_once_keep_both(ledger):
    from concurrent.futures import ThreadPoolExecutor

    stores = [SyntheticTables(ledger, ["t"]) for _ in range(4)]  # as four processes would
    with ThreadPoolExecutor(4) as pool:
        kept = list(pool.map(lambda store: store.keep(release()).name, stores))
    assert sorted(kept) == ["fake", "fake_2", "fake_3", "fake_4"]
    assert SyntheticTables(ledger, []).names("alice") == sorted(kept)
