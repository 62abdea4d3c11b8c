"""Results as DuckDB's (conversions, cursor, types, show, notebooks), thin-answer notes and
``python -m dpsql``."""

from __future__ import annotations

import os
import subprocess
import sys
from fractions import Fraction
from pathlib import Path

import duckdb
import numpy as np
import pandas as pd
import pytest

import dpsql
from dpsql.budget.accounting import Spend
from dpsql.mechanisms.noise import SeededSource
from dpsql.answer.notes import FEW_ROWS, thin_answer_notes
from dpsql.answer.result import DPResult

ROOT = Path(__file__).resolve().parent.parent

VISITS = pd.DataFrame({
    "uid": [1, 1, 1, 2, 3, 3, 4, 5],
    "store": ["a", "a", "b", "b", "a", "zzz", "a", "c"],
    "amount": [10.0, 20.0, 30.0, 70.0, 1.0, 5.0, 50.0, 3.0],
    "day": pd.to_datetime(["2024-01-01", "2024-01-02"] * 4).date,
})
STORES = pd.DataFrame({"store": ["a", "b", "c"], "city": ["x", "y", "y"]})
POLICY = """
BUDGET EPSILON 100 DELTA 1e-3;
QUERY EPSILON 1;
PRIVATE TABLE visits (PRIVACY UNIT uid, MAX ROWS PER UNIT 2, MAX GROUPS PER UNIT 2,
                      amount BOUNDS 0 TO 100, store KEYS FROM stores.store);
PUBLIC TABLE stores;
"""
GROUPED = "SELECT store, COUNT(*) AS n, AVG(amount) AS a FROM visits GROUP BY store"


@pytest.fixture
def db():
    with dpsql.connect({"visits": VISITS, "stores": STORES}, policy=POLICY, rng=SeededSource(3)) as connection:
        yield connection


def duckdb_relation(result: DPResult):
    """The same rows, typed as ``result.types``, as a DuckDB relation: what DuckDB would give."""
    connection = duckdb.connect()
    columns = ", ".join(f'"{name}" {type_name}' for name, type_name in zip(result.columns, result.types))
    connection.execute(f"CREATE TABLE t ({columns})")
    rows = list(result)
    if rows:
        marks = ", ".join("?" for _ in result.columns)
        connection.executemany(f"INSERT INTO t VALUES ({marks})", rows)
    return connection, connection.sql("SELECT * FROM t")


# --- conversions -----------------------------------------------------------------------------

def test_types_are_duckdb_type_names_keys_as_typed_and_aggregates_as_released(db):
    result = db.sql(GROUPED)
    assert result.columns == ["store", "n", "a"]
    assert result.types == ["VARCHAR", "BIGINT", "DOUBLE"]
    assert [d[:2] for d in result.description] == list(zip(result.columns, result.types))
    post = db.sql("SELECT day, COUNT(*) + 1 AS n FROM visits GROUP BY day ORDER BY n", delta=1e-5)
    assert post.types == ["DATE", "BIGINT"]  # a private DATE key, through post-processing SQL
    repeat = db.sql(GROUPED)
    assert repeat.repeat and repeat.types == result.types  # a free repeat is typed the same, no data read
    public = db.sql("SELECT store, COUNT(*) AS n FROM stores GROUP BY store")
    assert public.exact and public.types == ["VARCHAR", "BIGINT"]


def test_df_arrow_pl_numpy_hold_the_released_values_with_duckdb_dtypes(db):
    pyarrow = pytest.importorskip("pyarrow")
    polars = pytest.importorskip("polars")
    result = db.sql(GROUPED)
    rows = list(result)
    connection, relation = duckdb_relation(result)
    with connection:
        frame = result.df()
        expected = relation.df()
        assert list(frame.columns) == result.columns
        assert frame.dtypes.tolist() == expected.dtypes.tolist()
        assert list(frame.itertuples(index=False, name=None)) == rows
        pd.testing.assert_frame_equal(result.df(), expected)
        table = result.arrow()
        assert isinstance(table, pyarrow.Table)
        assert table.schema == relation.to_arrow_table().schema
        assert [tuple(r.values()) for r in table.to_pylist()] == rows
        assert result.to_arrow_table().equals(table)
        pl_frame = result.pl()
        assert isinstance(pl_frame, polars.DataFrame)
        assert pl_frame.dtypes == relation.pl().dtypes and pl_frame.rows() == rows
        arrays = result.fetchnumpy()
        theirs = relation.fetchnumpy()
        assert list(arrays) == list(theirs)
        for name in arrays:
            assert arrays[name].dtype == theirs[name].dtype
            assert arrays[name].tolist() == theirs[name].tolist()
        result.fetchone()
        assert result.fetchnumpy()["n"].tolist() == theirs["n"].tolist()[1:]  # the rows not yet fetched
        pd.testing.assert_frame_equal(db.sql(GROUPED).fetchdf(), expected)  # a repeat: same rows


def test_every_form_carries_the_halfwidth_of_each_noisy_column(db):
    pytest.importorskip("polars")
    result = db.sql(GROUPED)
    cells = result.accuracy_df(0.05)
    expected_columns = ["store", "n", "n_halfwidth95", "a", "a_halfwidth95"]
    frame = result.df(accuracy=True)
    assert list(frame.columns) == expected_columns
    assert frame["n_halfwidth95"].tolist() == cells["n"].tolist()
    assert frame["a_halfwidth95"].tolist() == cells["a"].tolist()
    assert frame["n_halfwidth95"].dtype == np.float64 and (frame["n_halfwidth95"] > 0).all()
    assert result.arrow(accuracy=True).column_names == expected_columns
    assert result.arrow(accuracy=True).column("a_halfwidth95").to_pylist() == cells["a"].tolist()
    assert result.pl(accuracy=True).columns == expected_columns
    assert list(result.fetchnumpy(accuracy=True)) == expected_columns
    narrower = result.df(accuracy=True, alpha=0.5)  # another level: its own label and narrower widths
    assert list(narrower.columns) == ["store", "n", "n_halfwidth50", "a", "a_halfwidth50"]
    assert (narrower["n_halfwidth50"] < frame["n_halfwidth95"]).all()
    exact = db.sql("SELECT city, COUNT(*) AS n FROM stores GROUP BY city ORDER BY city")
    assert list(exact.df(accuracy=True).columns) == ["city", "n"]  # exact: no noise, no half-width
    assert exact.df()["n"].tolist() == [1, 2] and exact.fetchall() == [("x", 1), ("y", 2)]


def test_a_value_duckdb_cannot_read_back_falls_back_to_the_python_values():
    result = DPResult(["d", "n"], [("not a date", 3)], Spend(Fraction(1)), types=["DATE", "BIGINT"])
    assert result.df().values.tolist() == [["not a date", 3]]
    assert result.fetchnumpy()["n"].tolist() == [3]


def test_types_without_a_connection_are_read_off_the_values():
    import datetime
    from decimal import Decimal

    result = DPResult(["k", "n", "x", "d", "m"], [("a", 3, 0.5, datetime.date(2024, 1, 2), Decimal("1.50"))],
                      Spend(Fraction(1)))
    assert result.types == ["VARCHAR", "BIGINT", "DOUBLE", "DATE", "DECIMAL(3,2)"]
    assert result.df().dtypes.tolist()[1:4] == [np.int64, np.float64, np.dtype("<M8[us]")]


def test_pl_without_polars_says_how_to_install_it(monkeypatch):
    monkeypatch.setitem(sys.modules, "polars", None)  # import polars now raises ImportError
    result = DPResult(["n"], [(1,)], Spend(Fraction(1)))
    with pytest.raises(dpsql.MissingDependency) as missing:
        result.pl()
    assert isinstance(missing.value, ImportError) and isinstance(missing.value, dpsql.DPError)
    assert "pip install polars" in str(missing.value)


# --- the cursor, compared with DuckDB's -------------------------------------------------------
# A DuckDB 1.x relation (duckdb.sql(...)): fetchone/fetchmany step; fetchall returns the rest
# and rewinds. Recorded from DuckDB 1.3.2 on SELECT * FROM range(5); compared live too when the
# installed DuckDB's relations fetch one row at a time (2.x relations have no fetchone). The
# part before any rewind is also compared with the installed DuckDB's result cursor.
R = [(i,) for i in range(5)]
SEQUENCES = [  # (steps, DuckDB 1.3.2's answers)
    (["fetchone", "fetchmany2", "fetchall", "fetchone", "fetchall", "fetchmany3"],
     [R[0], R[1:3], R[3:], R[0], R[1:], R[0:3]]),
    (["fetchall", "fetchall", "fetchone", "fetchone"], [R, R, R[0], R[1]]),
    (["fetchmany2", "fetchmany2", "fetchmany2", "fetchmany2", "fetchmany2"], [R[0:2], R[2:4], R[4:], [], []]),
    (["fetchmany", "fetchone", "fetchone"], [R[0:1], R[1], R[2]]),
    (["fetchmany5", "fetchone", "fetchmany0", "fetchone"], [R, None, [], None]),
    (["fetchone", "fetchdf", "fetchone"], [R[0], R[1:], R[0]]),
    (["fetchmany3", "fetchnumpy", "fetchall"], [R[0:3], R[3:], R]),
]


def _step(target, step: str):
    if step.startswith("fetchmany"):
        return target.fetchmany(int(step[9:])) if step[9:] else target.fetchmany()
    value = getattr(target, step)()
    if step == "fetchdf":
        return [tuple(row) for row in value.itertuples(index=False, name=None)]
    if step == "fetchnumpy":
        return [tuple(row) for row in zip(*(array.tolist() for array in value.values()))]
    return value


@pytest.mark.parametrize("steps, recorded", SEQUENCES, ids=["-".join(s) for s, _ in SEQUENCES])
def test_fetch_methods_move_a_cursor_as_a_duckdb_relation_does(steps, recorded):
    result = DPResult(["x"], R, Spend(Fraction(1)), types=["BIGINT"])
    assert [_step(result, step) for step in steps] == recorded
    connection = duckdb.connect()
    try:
        relation = connection.sql("SELECT * FROM range(5) AS t(x)")
        try:
            live = [_step(relation, step) for step in steps]
        except (AttributeError, duckdb.Error):  # DuckDB 2.x relations fetch all or nothing
            live = None
        if live is not None:
            assert live == recorded
        cursor = connection.execute("SELECT * FROM range(5) AS t(x)")
        before_rewind = steps[:next((i + 1 for i, s in enumerate(steps)
                                     if s in ("fetchall", "fetchdf", "fetchnumpy")), len(steps))]
        assert [_step(cursor, step) for step in before_rewind] == recorded[:len(before_rewind)]
    finally:
        connection.close()
    assert list(result) == R and len(result) == 5  # the whole answer, whatever was fetched
    assert result.df()["x"].tolist() == list(range(5))


def test_fetchmany_refuses_a_negative_size():
    with pytest.raises(dpsql.InvalidParameter):
        DPResult(["n"], [(1,)], Spend(Fraction(1))).fetchmany(-1)


# --- show, repr, notebooks --------------------------------------------------------------------

def test_show_prints_a_box_with_plus_minus_cost_and_budget(db, capsys):
    result = db.sql(GROUPED)
    result.show()
    shown = capsys.readouterr().out
    lines = shown.splitlines()
    assert lines[0].startswith("╭") and lines[1].split("│")[1].strip() == "store"
    # one line per released key, each with ± (or [low, high] in a column some row's cut at 0)
    assert sum("±" in line or " [" in line for line in lines if line.startswith("│")) == 3
    assert "(cost: epsilon 1, delta 0)" in shown
    assert f"budget: {db.budget}" in shown
    assert repr(result) == shown.rstrip("\n")


def test_show_repr_and_notebooks_draw_the_first_rows_of_a_long_answer(capsys):
    rows = [(f"k{i}", i) for i in range(100)]
    result = DPResult(["k", "n"], rows, Spend(Fraction(1)), widths=lambda alpha: {"n": [1.5] * 100})
    result.show(max_rows=3)
    shown = capsys.readouterr().out
    assert sum("±" in line for line in shown.splitlines()) == 3 and "│ k3 " not in shown
    assert "100 rows (the first 3 shown; df() or fetchall() has every row)" in shown
    assert repr(result).count("±") == 40 and result._repr_html_().count("<tr>") == 41
    assert len(result.df()) == 100 and len(result.fetchall()) == 100
    with pytest.raises(dpsql.InvalidParameter):
        result.show(max_rows=0)


def test_repr_html_shows_plus_minus_cost_budget_and_escapes_every_value():
    hostile = "<script>alert('x')</script>"
    result = DPResult(["key", "<b>n</b>"], [(hostile, 7), ("a&b", 3)], Spend(Fraction(1, 2)),
                      widths=lambda alpha: {"<b>n</b>": [2.5, 2.5]},
                      notes=["a note with <img src=x onerror=alert(1)>"])
    page = result._repr_html_()
    assert "<script>" not in page and "<img" not in page and "<b>n</b>" not in page
    assert "&lt;script&gt;alert(&#x27;x&#x27;)&lt;/script&gt;" in page
    assert "a&amp;b" in page and "&lt;b&gt;n&lt;/b&gt;" in page
    assert "7 ± 2<" in page and "epsilon 0.5" in page  # as the shell shows it
    assert "&lt;img src=x onerror=alert(1)&gt;" in page


def test_repr_html_of_a_connection_answer_names_the_remaining_budget(db):
    result = db.sql(GROUPED)
    page = result._repr_html_()
    assert "budget: epsilon 1 of 100 spent, 99 remaining" in page
    assert page.count("<tr>") == 1 + len(result)


# --- thin answers explained -------------------------------------------------------------------

THIN = "SELECT day, COUNT(*) AS n FROM visits GROUP BY day"


def test_an_empty_partition_selection_answer_says_what_threshold_a_key_needed(db):
    result = db.sql(THIN, delta=1e-5)
    assert len(result) == 0  # 5 units cannot pass a threshold in the tens
    threshold = int(db.explain(THIN, delta=1e-5).split("reaches ")[1].split(";")[0])
    assert len(result.notes) == 2
    assert f"distinct uid values plus noise reaches {threshold}" in result.notes[0]
    assert result.notes[0].startswith("No rows were released")
    for way in ("MAX GROUPS PER UNIT 1", "twice the epsilon (2)", "ten times the delta (0.0001)", "KEYS"):
        assert way in result.notes[1]
    assert "note: No rows were released" in repr(result)
    assert "No rows were released" in result._repr_html_()
    assert db.sql(THIN, delta=1e-5).notes == result.notes  # the free repeat says the same


def test_the_suggested_thresholds_are_the_thresholds_those_settings_give(db):
    """Each number in the note is the threshold explain() shows for the changed query."""
    def threshold(sql: str, **options) -> int:
        return int(db.explain(sql, **options).split("reaches ")[1].split(";")[0])

    note = db.sql(THIN, delta=1e-5).notes[1]
    one_group = "SELECT WITH DIFFERENTIAL_PRIVACY OPTIONS (max_groups_contributed = 1) day, COUNT(*) AS n " \
                "FROM visits GROUP BY day"
    assert f"max_groups_contributed = 1)): {threshold(one_group, delta=1e-5)};" in note
    assert f"twice the epsilon (2): {threshold(THIN, epsilon=2, delta=1e-5)};" in note
    assert f"ten times the delta (0.0001): {threshold(THIN, delta=1e-4)};" in note


def test_notes_depend_on_the_plan_and_released_count_only_never_on_dropped_keys():
    """Two databases with very different candidate keys, both releasing nothing: same notes."""
    few = VISITS.assign(day=pd.to_datetime(["2024-01-01"] * len(VISITS)).date)
    many = VISITS.assign(day=pd.to_datetime([f"2024-01-0{i + 1}" for i in range(len(VISITS))]).date)
    answers = []
    for frame in (few, many):
        with dpsql.connect({"visits": frame, "stores": STORES}, policy=POLICY, rng=SeededSource(1)) as db:
            answers.append(db.sql(THIN, delta=1e-5))
    assert [len(a) for a in answers] == [0, 0]
    assert answers[0].notes == answers[1].notes != []


def test_after_having_the_note_names_both_steps_and_blames_neither():
    """Attack a1 finding 4b: HAVING removed every row, yet the note said the threshold had. With
    a HAVING (or DISTINCT) the note names partition selection and HAVING and says the answer
    does not tell which removed a key. Public facts only: a database whose key fails the
    threshold and one whose key passes it (3,000 units) but fails HAVING get the same notes."""
    having = THIN + " HAVING COUNT(*) > 1000000"
    few = VISITS.assign(day=pd.to_datetime(["2024-01-01"] * len(VISITS)).date)
    many = pd.DataFrame({"uid": range(3000), "store": "a", "amount": 1.0,
                         "day": pd.to_datetime(["2024-01-01"] * 3000).date})
    answers = []
    for frame in (few, many):
        with dpsql.connect({"visits": frame, "stores": STORES}, policy=POLICY, rng=SeededSource(1)) as db:
            answers.append(db.sql(having, delta=1e-5))
            if frame is many:
                assert len(db.sql(THIN, delta=1e-5)) == 1  # the key passed partition selection
    assert [len(a) for a in answers] == [0, 0]
    notes = answers[0].notes
    assert notes == answers[1].notes and len(notes) == 2
    assert notes[0].startswith("No rows were released") and "HAVING then keeps only the rows" in notes[0]
    assert "the answer does not say which did" in notes[0] and "a key is released only when" not in notes[0]
    assert notes[1].startswith("To lower that threshold")


def test_no_notes_when_keys_are_public_or_the_answer_is_not_thin(db):
    # store KEYS FROM stores.store: no selection, so no thin-answer note (only that its 3 rows,
    # each of 1 to 4 visits at epsilon 1, are within their ± of 0: tests/test_noise_rows.py, and that
    # their AVG's interval is all of its bounds: tests/test_intervals.py)
    assert [note for note in db.sql(GROUPED).notes if "± of 0" not in note and "uninformative" not in note] == []
    assert db.sql("SELECT COUNT(*) AS n FROM visits").notes == []
    assert db.sql("SELECT * FROM stores").notes == []


def test_few_is_fewer_than_five_rows_and_a_limit_is_not_thin():
    from types import SimpleNamespace as S

    from dpsql.mechanisms.selection import selection_rule

    rule = selection_rule(Fraction(1), Fraction(1, 10**6), groups_per_unit=1, neighbours="unbounded")
    plan = S(selection=S(epsilon=rule.epsilon, delta=rule.delta, threshold=rule.threshold),
             epsilon=Fraction(1), delta=Fraction(1, 10**6), neighbours="unbounded",
             query=S(rule=S(unit="uid", groups_per_unit=1)))
    assert FEW_ROWS == 5
    assert thin_answer_notes(plan, 4)[0].startswith("Only 4 rows were released")
    assert thin_answer_notes(plan, 1)[0].startswith("Only 1 row was released")
    assert thin_answer_notes(plan, 5) == []
    assert "MAX GROUPS PER UNIT" not in thin_answer_notes(plan, 0)[1]  # already 1 group per unit


def test_a_limit_query_carries_no_thin_note(db):
    result = db.sql(THIN + " ORDER BY n LIMIT 1", delta=1e-5)
    # only what partition selection leaves out, which LIMIT does not change (tests/test_limits_hide.py)
    assert [note[:44] for note in result.notes] == ["The GROUP BY keys are private: a key was rel"]


def test_the_shell_shows_the_notes_under_the_answer(db):
    from dpsql.shell.session import run_sql
    from dpsql.shell.state import new_state

    state = new_state(db, width=100, color=False)
    state.delta = Fraction(1, 10**5)
    shown = run_sql(state, THIN)
    assert "0 rows" in shown
    assert "note: No rows were released" in shown and "note: To lower that threshold" in shown
    assert "note: No rows" not in run_sql(state, GROUPED) and "note: Only" not in run_sql(state, GROUPED)


def test_the_shell_and_cli_show_the_notes(tmp_path):
    from dpsql.shell.render import answer_from, render_notes

    result = DPResult(["d"], [], Spend(Fraction(1)), notes=["No rows were released: because."])
    assert render_notes(answer_from(result)) == "note: No rows were released: because.\n"
    database = tmp_path / "v.duckdb"
    with duckdb.connect(str(database)) as connection:
        connection.register("visits_frame", VISITS)
        connection.register("stores_frame", STORES)
        connection.execute("CREATE TABLE visits AS SELECT * FROM visits_frame")
        connection.execute("CREATE TABLE stores AS SELECT * FROM stores_frame")
    (tmp_path / "v.policy").write_text(POLICY)
    run = subprocess.run([sys.executable, "-m", "dpsql", "query", str(database), THIN, "--policy",
                          str(tmp_path / "v.policy"), "--delta", "1e-5", "--format", "csv"],
                         capture_output=True, text=True, timeout=120, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert run.returncode == 0, run.stderr
    assert run.stdout == "day,n,n_halfwidth95\n"  # the answer alone on stdout
    assert "note: No rows were released" in run.stderr


# --- python -m dpsql --------------------------------------------------------------------------

def test_python_m_dpsql_runs_the_cli_and_prints_the_version():
    run = subprocess.run([sys.executable, "-m", "dpsql", "--version"], capture_output=True, text=True,
                         timeout=60, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert run.returncode == 0 and run.stdout == f"dpsql {dpsql.__version__}\n"
    help_run = subprocess.run([sys.executable, "-m", "dpsql", "--help"], capture_output=True, text=True,
                              timeout=60, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert help_run.returncode == 0 and "usage: dpsql" in help_run.stdout


def test_the_version_is_the_one_pyproject_declares():
    import tomllib

    declared = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    assert dpsql.__version__ == declared


def test_show_and_notebook_tell_rows_outside_the_keys_domain():
    """Shown when asked for (``show_outside``); the cell is in ``outside_domain`` either way
    (``tests/test_limits_hide.py``: shown unasked only when told from noise)."""
    frame = pd.DataFrame({"u": [1, 2, 3], "k": ["a", "b", "zz"]})
    policy = "BUDGET EPSILON 10; PRIVATE TABLE t (PRIVACY UNIT u, MAX ROWS PER UNIT 1, k KEYS ('a', 'b'));"
    with dpsql.connect({"t": frame}, policy=policy) as connection:
        result = connection.sql("SELECT WITH DIFFERENTIAL_PRIVACY OPTIONS (show_outside = true) k, COUNT(*) AS n "
                                "FROM t GROUP BY k", epsilon=1)
        assert result.outside_domain is not None and result.outside_domain.shown
        assert "rows with k outside its KEYS domain" in repr(result)
        assert "rows with k outside its KEYS domain" in result._repr_html_()
