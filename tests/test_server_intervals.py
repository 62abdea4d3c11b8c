"""Intervals on the wire (issue 23, item 1): psql shows every answer's 95% intervals in a
notice, per row where rows differ; ``OPTIONS (intervals = true)`` returns them as columns that
psql and pandas read as data; ``dpsql_cost`` carries each row's interval and exact decimals.
All of it is post-processing of the released answer: asking for intervals costs nothing more.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import warnings

import pytest
from served import serve_shop

from dpsql.answer.table import supported_decimals
from dpsql.demo import SHOP_POLICY

psycopg = pytest.importorskip("psycopg")

PSQL = shutil.which("psql")
PASSWORD = "alice-secret"
POLICY = SHOP_POLICY.replace("BUDGET EPSILON 3.0", "BUDGET EPSILON 50")
GROUPED = "SELECT store, COUNT(*) AS n, MEDIAN(age) AS med FROM visits GROUP BY store ORDER BY store"
WITH_INTERVALS = GROUPED.replace("SELECT", "SELECT WITH DIFFERENTIAL_PRIVACY OPTIONS (intervals = true)", 1)


@pytest.fixture(scope="module")
def server(built, tmp_path_factory):
    server = serve_shop(built, tmp_path_factory.mktemp("intervals"), POLICY, "alice", PASSWORD)
    yield server
    server.stop()
    server.thread.join(10)


def connect(server):
    return psycopg.connect(host="127.0.0.1", port=server.port, dbname="shop", user="alice", password=PASSWORD,
                           connect_timeout=5, autocommit=True)


def psql(server, *commands: str) -> subprocess.CompletedProcess:
    environment = {**os.environ, "PGPASSWORD": PASSWORD, "PGCONNECT_TIMEOUT": "5"}
    arguments = [PSQL, "-h", "127.0.0.1", "-p", str(server.port), "-U", "alice", "-d", "shop", "-X", "-A",
                 "-v", "ON_ERROR_STOP=0"]
    for command in commands:
        arguments += ["-c", command]
    return subprocess.run(arguments, env=environment, capture_output=True, text=True, timeout=60)


def interval_notice(stderr: str) -> str:
    """The intervals notice psql printed (it spans lines)."""
    match = re.search(r"NOTICE:  dpsql: 95% intervals \(post-processing, free\): (.*?)(?=\nNOTICE|\n[^ ]|\Z)",
                      stderr, flags=re.S)
    assert match, stderr
    return match.group(1)


def by_row(shown: str) -> tuple[list[str], list[list[str]]]:
    """(header, rows) of the notice's table of row-by-row intervals."""
    lines = shown.split("by row (asymmetric or varying: use these, not a ±):\n", 1)[1].splitlines()
    header, *rows = [[cell.strip() for cell in line.split(" | ")] for line in lines if line.startswith("  ")]
    return header, rows


@pytest.mark.skipif(PSQL is None, reason="psql is not installed")
def test_psql_shows_every_rows_interval_keyed_by_the_rows_keys(server):
    done = psql(server, GROUPED)
    assert done.returncode == 0 and "ERROR" not in done.stderr, done.stderr
    answer = [line.split("|") for line in done.stdout.strip().splitlines()[1:-1]]  # header and "(N rows)"
    assert len(answer) > 10  # the notice listed 10 rows and said "… 2 more rows" (issue 37)
    shown = interval_notice(done.stderr)
    assert "more row" not in shown and "OPTIONS" not in shown
    header, rows = by_row(shown)
    assert header[0] == "store" and "med" in header
    assert [row[0] for row in rows] == [row[0] for row in answer]  # every row, in the answer's order
    # a COUNT's interval is the same in every row, unless cut at 0 (no count is below it)
    assert re.search(r"^n ± [\d,]+ in every row;", shown) or "n" in header
    ends = [re.fullmatch(r"\[(-?[\d.,]+), (-?[\d.,]+)\]", row[header.index("med")]).groups() for row in rows]
    assert all(18 <= float(low) <= float(high) <= 90 for low, high in ends)  # within age's bounds


def test_noisy_values_go_out_to_the_digits_their_plus_minus_supports(server):
    """psql printed 17 significant digits of noise (issue 37); a public answer stays exact."""
    query = "SELECT WITH DIFFERENTIAL_PRIVACY OPTIONS (epsilon = 1) store, AVG(amount) AS a, AVG(age) AS s " \
            "FROM visits GROUP BY store ORDER BY store"
    with connect(server) as connection:
        cursor = connection.cursor()
        cursor.execute(query)
        texts = [row for row in cursor.fetchall()]
        detail = json.loads(connection.info.parameter_status("dpsql_cost"))
        raw = connection.pgconn.exec_(query.encode())  # the text as sent: a free repeat
        size = connection.execute("SELECT size FROM stores ORDER BY store LIMIT 1").fetchone()[0]
        public = connection.pgconn.exec_(b"SELECT size / 7.0 AS s FROM stores ORDER BY store LIMIT 1")
    sent = [[raw.get_value(row, column).decode() for column in (1, 2)] for row in range(raw.ntuples)]
    assert [raw.ftype(column) for column in (1, 2)] == [701, 701]  # still float8, as drivers read it
    for row, (a_text, s_text) in enumerate(sent):
        for text, name in ((a_text, "a"), (s_text, "s")):
            half = detail["halfwidths95"][name][row]
            assert half is not None and half > 0
            decimals = supported_decimals(half)
            assert text == f"{float(text):.{decimals}f}" and (decimals > 0) == ("." in text), (text, half)
            assert abs(float(text) - texts[row][1 if name == "a" else 2]) < 1e-9  # what psycopg reads
    low, high = detail["intervals95"]["a"][0]
    assert low == round(low, supported_decimals(detail["halfwidths95"]["a"][0]))  # ends rounded outward too
    assert public.get_value(0, 0).decode() == repr(size / 7.0)  # public: exact, every digit


@pytest.mark.skipif(PSQL is None, reason="psql is not installed")
def test_psql_reads_intervals_as_columns_for_free_after_the_answer(server):
    done = psql(server, GROUPED + " LIMIT 4", WITH_INTERVALS + " LIMIT 4")
    assert done.returncode == 0 and "ERROR" not in done.stderr, done.stderr
    assert done.stderr.count("cost free: a repeat of an earlier query") == 1  # the option changes no release
    plain, with_columns = done.stdout.split("(4 rows)")[:2]
    header, *rows = with_columns.strip().splitlines()
    assert header == "store|n|n_low|n_high|med|med_low|med_high"
    assert [row.split("|")[0:2] + [row.split("|")[4]] for row in rows] == \
        [row.split("|") for row in plain.strip().splitlines()[1:]]  # the same answer, with its intervals
    for row in rows:
        store, n, n_low, n_high, med, med_low, med_high = row.split("|")
        assert 0 <= int(n_low) <= int(n) <= int(n_high)
        assert int(n_low) == 0 or int(n_high) - int(n) == int(n) - int(n_low)  # cut at 0 only
        assert float(med_low) <= float(med_high)


def test_pandas_reads_intervals_as_data_and_dpsql_cost_holds_every_rows_interval(server):
    import pandas as pd

    with connect(server) as connection:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # pandas prefers SQLAlchemy; a DBAPI connection works
            frame = pd.read_sql(WITH_INTERVALS.replace("ORDER BY store", "ORDER BY n DESC"), connection)
        detail = json.loads(connection.info.parameter_status("dpsql_cost"))
    assert list(frame.columns) == ["store", "n", "n_low", "n_high", "med", "med_low", "med_high"]
    assert str(frame["n_low"].dtype) == "int64" and str(frame["med_low"].dtype) == "float64"
    assert (frame["n_low"] <= frame["n"]).all() and (frame["n"] <= frame["n_high"]).all()
    assert detail["epsilon"] == "0.1" and detail["delta"] == "0"  # exact decimals, not 1/10
    sent = detail["intervals95"]
    assert set(sent) == {"n", "med"} and len(sent["med"]) == len(frame)
    assert [low for low, _ in sent["med"]] == frame["med_low"].tolist()
    assert [high for _, high in sent["med"]] == frame["med_high"].tolist()


def test_an_answer_with_its_intervals_as_columns_has_no_interval_notice(server):
    with connect(server) as connection:
        seen: list[str] = []
        connection.add_notice_handler(lambda diagnostic: seen.append(diagnostic.message_primary))
        rows = connection.execute(WITH_INTERVALS).fetchall()
    assert len(rows) > 10 and seen and not any(text.startswith("dpsql: 95% intervals") for text in seen)


def test_public_answers_have_no_intervals_and_a_wrong_option_is_refused(server):
    with connect(server) as connection:
        seen: list[str] = []
        connection.add_notice_handler(lambda diagnostic: seen.append(diagnostic.message_primary))
        cursor = connection.execute("SELECT WITH DIFFERENTIAL_PRIVACY OPTIONS (intervals = true) city, "
                                    "COUNT(*) AS n FROM stores GROUP BY city ORDER BY city")
        assert [column.name for column in cursor.description] == ["city", "n"]  # exact: nothing to add
        assert not any("95% intervals" in text for text in seen)
        with pytest.raises(psycopg.Error) as refused:
            connection.execute("SELECT WITH DIFFERENTIAL_PRIVACY OPTIONS (intervals = 1) COUNT(*) FROM visits")
    assert "the option 'intervals' must be true or false" in str(refused.value)


def test_the_remote_shell_gets_each_rows_own_interval(server):
    """``dpsql shell postgresql://...`` drew every row with its column's largest ± (issue 23)."""
    from dpsql.shell.remote import connect_remote

    with connect_remote(f"postgresql://alice:{PASSWORD}@127.0.0.1:{server.port}/shop") as db:
        result = db.sql(GROUPED.replace("ORDER BY store", "ORDER BY n DESC") + " LIMIT 5")
        as_columns = db.sql(WITH_INTERVALS.replace("ORDER BY store", "ORDER BY n DESC") + " LIMIT 5")
    shown = result.intervals()
    assert shown["med_low"].tolist() == [row[5] for row in as_columns.fetchall()]
    assert shown["med_high"].tolist() == [row[6] for row in as_columns.fetchall()]
    halves = result.accuracy_df()
    assert (halves["n"] == halves["n"].iloc[0]).all() and halves["store"].isna().all()


@pytest.mark.skipif(PSQL is None, reason="psql is not installed")
def test_a_session_setting_adds_intervals_to_every_answer_for_tools_that_write_the_sql(server):
    query = "SELECT plan, COUNT(*) AS n FROM users GROUP BY plan ORDER BY plan"
    done = psql(server, "SHOW dpsql.intervals", "SET dpsql.intervals = on", "SHOW dpsql.intervals", query,
                "SET dpsql.intervals TO maybe", "RESET dpsql.intervals", query)
    assert done.returncode == 0, done.stderr
    blocks = done.stdout.split("\n")
    assert blocks[:2] == ["dpsql.intervals", "off"] and "SET" in blocks and blocks[blocks.index("SET") + 2] == "on"
    with_columns = blocks.index("plan|n|n_low|n_high")
    assert blocks.count("plan|n") == 1 and blocks.index("plan|n") > with_columns  # RESET: off again
    assert 'ERROR:  invalid value for parameter "dpsql.intervals": "maybe"' in done.stderr
    assert "HINT:  write SET dpsql.intervals = on (or off)" in done.stderr


def test_sqlalchemy_and_pandas_ask_for_intervals_at_connection(server):
    """A BI tool writes its own SQL: libpq's options (pgjdbc's ``options``) carry the setting."""
    sqlalchemy = pytest.importorskip("sqlalchemy")
    import pandas as pd

    engine = sqlalchemy.create_engine(f"postgresql+psycopg://alice:{PASSWORD}@127.0.0.1:{server.port}/shop",
                                      connect_args={"options": "-c dpsql.intervals=on"})
    try:
        with engine.connect() as connection:
            frame = pd.read_sql(sqlalchemy.text("SELECT plan, COUNT(*) AS n FROM users GROUP BY plan"), connection)
    finally:
        engine.dispose()
    assert list(frame.columns) == ["plan", "n", "n_low", "n_high"]
    assert (frame["n_low"] <= frame["n"]).all() and (frame["n"] <= frame["n_high"]).all()


def test_under_basic_accounting_no_rho_is_shown(server):
    """rho is what zCDP spends; under BASIC it read as a second, unexplained cost (issue 23)."""
    import pandas as pd

    from dpsql.server.statements import ledger_reply

    with connect(server) as connection:
        connection.execute("SELECT COUNT(*) AS n FROM users WHERE plan = 'pro'").fetchall()
        detail = json.loads(connection.info.parameter_status("dpsql_cost"))
        cursor = connection.execute("SHOW ledger")
        assert [c.name for c in cursor.description] == ["id", "time", "analyst", "sql", "epsilon", "delta"]
    assert detail["accounting"] == "basic" and detail["rho"] is None
    frame = pd.DataFrame([(1, "t", "alice", "SELECT 1", 0.1, 0.0, 0.005)],
                         columns=["id", "time", "analyst", "sql", "epsilon", "delta", "rho"])
    assert ledger_reply(frame, "zcdp").columns[-1] == "rho"


def test_the_readmes_pandas_line_reads_without_a_warning(server):
    """README, "Serving analysts": pandas.read_sql over a SQLAlchemy engine (issue 23 papercut)."""
    sqlalchemy = pytest.importorskip("sqlalchemy")
    import pandas

    engine = sqlalchemy.create_engine(f"postgresql+psycopg://alice:{PASSWORD}@127.0.0.1:{server.port}/shop")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            frame = pandas.read_sql("SELECT plan, COUNT(*) AS n FROM users GROUP BY plan", engine)
    finally:
        engine.dispose()
    assert list(frame.columns) == ["plan", "n"] and len(frame) == 3


def test_a_column_with_no_interval_says_so_and_its_ends_are_null(server):
    with connect(server) as connection:
        seen: list[str] = []
        connection.add_notice_handler(lambda diagnostic: seen.append(diagnostic.message_primary))
        connection.execute("SELECT CASE WHEN COUNT(*) > 10 THEN 1 ELSE 0 END AS big FROM visits").fetchall()
        assert seen[-1] == "dpsql: 95% intervals (post-processing, free): big: derived, no ±"
        cursor = connection.execute("SELECT WITH DIFFERENTIAL_PRIVACY OPTIONS (intervals = true) "
                                    "CASE WHEN COUNT(*) > 10 THEN 1 ELSE 0 END AS big FROM visits")
        row = cursor.fetchone()
        detail = json.loads(connection.info.parameter_status("dpsql_cost"))
    assert [c.name for c in cursor.description] == ["big", "big_low", "big_high"] and row[1:] == (None, None)
    assert detail["intervals95"] == {"big": [None]} and detail["halfwidths95"] == {"big": [None]}


class _Answer:
    """A released answer as ``intervals.notice`` reads it: columns, rows."""

    def __init__(self, columns, rows):
        self.columns, self.rows = columns, rows

    def __iter__(self):
        return iter(self.rows)


@pytest.mark.parametrize("low, high, shown", [(0.0, 15.000000000000002, "[0, 15]"), (0.0, 31.0, "[0, 31]"),
                                              (0.0, 1234.5, "[0, 1,235]")])
def test_a_cut_counts_interval_shows_whole_ends_however_wide(low, high, shown):
    """A COUNT whose interval was cut at 0 showed ``n [0.0, 15.0]`` in one notice and ``n [0, 31]``
    in another: the decimals followed the interval's width, not the column's whole numbers."""
    from dpsql.server.intervals import notice

    one = notice(_Answer(["n"], [(3,)]), {"n": [(low, high, high - 3.5)]})
    assert one.endswith(f"n {shown}"), one
    rows = notice(_Answer(["store", "n"], [("a", 3), ("b", 40)]),
                  {"n": [(low, high, high - 3.5), (20.0, 60.0, 20.0)]})
    assert f"a     | {shown}" in rows and "b     | [20, 60]" in rows, rows
    uncut = notice(_Answer(["n"], [(30,)]), {"n": [(21.0, 39.0, 9.0)]})
    assert uncut.endswith("n ± 9"), uncut  # was "n ± 9.0": a count's ± in whole numbers too
    averages = notice(_Answer(["m"], [(3.25,)]), {"m": [(0.0, 7.5, 5.0)]})  # not whole numbers: decimals stay
    assert averages.endswith("m [0.0, 7.5]"), averages
    assert notice(_Answer(["m"], [(30.0,)]), {"m": [(21.0, 39.0, 9.0)]}).endswith("m ± 9.0")
