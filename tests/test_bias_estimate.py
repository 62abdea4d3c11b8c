"""The recorded share of rows each table's limits drop (``dpsql.curator.dropped``), shown in every
answer's limits line, and the share intervals both it and the bias report use (``dpsql.mechanisms.shares``)."""

from __future__ import annotations

import math
import os
import re
import shutil
import subprocess
from fractions import Fraction
from itertools import product

import duckdb
import numpy as np
import pandas as pd
import pytest
from sqlglot import exp

import dpsql
from dpsql import cli
from dpsql.backends.bounding import bounded_tables, raw_rows_cap, raw_rows_columns, raw_rows_name
from dpsql.query.bias import raw_rows_table
from dpsql.curator.dropped import dropped_statement, noisy_counts, plan_dropped, release_dropped
from dpsql.mechanisms.noise import SeededSource, discrete_laplace, discrete_laplace_halfwidth
from dpsql.mechanisms.shares import estimate_share, share_interval

POLICY = ("BUDGET EPSILON 100; QUERY EPSILON 0.5; PRIVATE TABLE t (PRIVACY UNIT uid, MAX ROWS PER UNIT 2, "
          "x BOUNDS 0 TO 10);")


def frame(rows: dict[int, int], nameless: int = 0) -> pd.DataFrame:
    """``rows[u]`` rows of unit u, x = 1, and ``nameless`` rows whose unit is NULL."""
    pairs = [(u, 1.0) for u, n in rows.items() for _ in range(n)] + [(None, 1.0)] * nameless
    return pd.DataFrame(pairs or [(0, 0.0)][:0], columns=["uid", "x"]).astype(
        {"uid": "Int64" if nameless else "int64", "x": "float64"})


def exact(data: pd.DataFrame, policy: str = POLICY) -> tuple[tuple[int, int, int], dict]:
    """The exact (kept, dropped, no_unit) of table t's estimate, and its noise scales."""
    with dpsql.connect({"t": data}, policy=policy) as db:
        plan = plan_dropped(db.policy.table("t"), "t", Fraction(1))
        assert plan is not None
        statement = dropped_statement(plan)
        row = db._engine.fetch(statement.sql, bounded=statement.bounded)[0]
    return (int(row[0]), int(row[1]), int(row[2])), plan.scales


# -- sensitivity, by brute force --------------------------------------------------------------

@pytest.mark.parametrize("neighbours", ["UNBOUNDED", "BOUNDED"])
def test_no_unit_moves_a_count_beyond_its_sensitivity(neighbours):
    """One unit's rows from none (add or remove) to far beyond the stored cap R = K(1 + 4K),
    against every other such profile (replace), others fixed: each count moves by at most K =
    its sensitivity (the scale's numerator), and by exactly K for some pair (tight)."""
    policy = POLICY.replace("QUERY EPSILON 0.5;", f"QUERY EPSILON 0.5; NEIGHBOURS {neighbours};")
    background = {10: 1, 11: 3, 12: 7}
    profiles = [0, 1, 2, 3, 4, 5, raw_rows_cap(2), raw_rows_cap(2) + 1, 200]
    results = [exact(frame({**background, **({1: n} if n else {})}), policy)[0] for n in profiles]
    largest = [max(abs(a[i] - b[i]) for a, b in product(results, results)) for i in range(3)]
    assert largest == [2, 2, 0]
    # the estimate's own scales have K, K and 1 over each count's epsilon (3/10, 6/10 and 1/10 of 1)
    assert exact(frame(background), policy)[1] == {"kept": Fraction(20, 3), "dropped": Fraction(10, 3),
                                                   "no_unit": Fraction(10)}


@pytest.mark.parametrize("neighbours", ["UNBOUNDED", "BOUNDED"])
def test_a_row_with_no_unit_moves_only_its_own_count_and_by_one(neighbours):
    """Each row whose unit is NULL is a unit of its own (module docstring of
    ``dpsql.curator.dropped``): adding or removing one (the table with 0..4 such rows, beside
    units of every profile) moves ``no_unit`` by exactly 1, the sensitivity its scale is made of
    (scale x its epsilon part), and ``kept`` and ``dropped`` not at all; a replaced unit (one
    profile for another, or a unit for a NULL row) moves each count within its sensitivity. A
    sensitivity of 1 mutated to 1/2 fails the first assertion."""
    policy = POLICY.replace("QUERY EPSILON 0.5;", f"QUERY EPSILON 0.5; NEIGHBOURS {neighbours};")
    background = {10: 1, 11: 3, 12: 7}
    results = {(n, profile): exact(frame({**background, **({1: profile} if profile else {})}, n), policy)[0]
               for n in range(5) for profile in (0, 3)}
    for (n, profile), counts in results.items():
        assert counts[2] == n  # counted exactly: every NULL row, and no other
        if n:
            before = results[n - 1, profile]
            assert (abs(counts[0] - before[0]), abs(counts[1] - before[1]), abs(counts[2] - before[2])) == (0, 0, 1)
    one_for_another = [tuple(abs(a - b) for a, b in zip(results[n, 3], results[n + 1, 0])) for n in range(4)]
    assert all(moved[0] <= 2 and moved[1] <= 2 and moved[2] <= 1 for moved in one_for_another)
    scales = exact(frame(background, 1), policy)[1]
    assert scales["no_unit"] * Fraction(1, 10) == 1  # sensitivity 1 over its part of epsilon 1


def test_counts_by_hand():
    # K = 2, C = 2: units of 1, 3, 7 and 200 rows keep 1, 2, 2, 2 and drop 0, 1, 2 (of 5), 2 (of 198)
    assert exact(frame({1: 1, 2: 3, 3: 7, 4: 200}))[0] == (7, 5, 0)
    assert exact(frame({1: 1, 2: 3, 3: 7, 4: 200}, 9))[0] == (7, 5, 9)


# -- noise: the scale, and the share's interval -----------------------------------------------

def test_noise_has_the_scale_of_sensitivity_over_epsilon_part():
    """E|Z| of 4,000 draws of each count against the discrete Laplace of its scale (20/3, 10/3
    and 10 at epsilon 1: kept gets 3/10, dropped 6/10, no_unit 1/10): the mean of 4,000 |Z| has
    relative sd ~1.6%, so 15% is > 9 sd (a false failure < 1e-18), and a factor-2 scale error
    moves it by 50% or more."""
    with dpsql.connect({"t": frame({1: 3})}, policy=POLICY) as db:
        plan = plan_dropped(db.policy.table("t"), "t", Fraction(1))
    assert plan is not None
    source, draws = SeededSource(7), 4000
    deviations = {"kept": 0.0, "dropped": 0.0, "no_unit": 0.0}
    for _ in range(draws):
        for name, value in noisy_counts(plan, (10**6, 10**6, 10**6), source).items():
            deviations[name] += abs(value - 10**6) / draws
    for name, scale in {"kept": 20 / 3, "dropped": 10 / 3, "no_unit": 10.0}.items():
        p = math.exp(-1 / scale)
        assert 0.85 < deviations[name] / (2 * p / (1 - p * p)) < 1.15, name


@pytest.mark.parametrize("added, part, kept, part_scale, kept_scale, runs, least", [
    (True, 17_000, 83_000, 1_500.0, 3_000.0, 2000, 0.92),   # flights-like: a dropped share of 17%
    (True, 300, 2_000, 40.0, 80.0, 500, 0.88),
    (False, 900, 10_000, 200.0, 400.0, 500, 0.88),          # a clamped share of 9%
])
def test_the_share_interval_covers_the_true_share(added, part, kept, part_scale, kept_scale, runs, least):
    """Noisy pairs: the 95% interval holds the true share in at least ``least`` of ``runs``
    (Chernoff: a false failure < 1e-7 for both sizes), and with the noise scales halved (a
    factor-2 error) in fewer than 85% of 300; it is narrower than the interval it replaced
    (each count's 97.5% interval, the share's extremes over both)."""
    source = SeededSource(3)
    truth = part / (part + kept) if added else part / kept
    noisy_part = part + discrete_laplace(Fraction(part_scale), runs, source)
    noisy_kept = kept + discrete_laplace(Fraction(kept_scale), runs, source)
    covered = narrow = half_scales = 0
    for run, (x, y) in enumerate(zip(noisy_part.tolist(), noisy_kept.tolist())):
        share = estimate_share(x, part_scale, y, kept_scale, added=added)
        covered += abs(share.value - truth) <= share.halfwidth
        narrow += share.halfwidth < _corner_halfwidth(x, part_scale, y, kept_scale, added)
        if run < 300:
            low, high = share_interval(x, part_scale / 2, y, kept_scale / 2, added=added)
            half_scales += low <= truth <= high
    assert covered / runs >= least
    assert half_scales / 300 < 0.85
    assert narrow / runs > 0.95


def _corner_halfwidth(part: int, part_scale: float, kept: int, kept_scale: float, added: bool) -> float:
    """The interval the bias report used before: each count within its 97.5% half-width, the
    share's largest deviation over the corners."""
    pw = discrete_laplace_halfwidth(Fraction(part_scale), 0.025)
    kw = discrete_laplace_halfwidth(Fraction(kept_scale), 0.025)

    def ratio(p: float, k: float) -> float:
        p, k = max(p, 0.0), max(k, 0.0)
        whole = k + p if added else k
        return 1.0 if whole <= 0 else min(p / whole, 1.0)

    value = ratio(part, kept)
    return max(value - ratio(part - pw, kept + kw), ratio(part + pw, kept - kw) - value)


def test_the_interval_is_all_of_zero_to_one_when_nothing_is_consistent():
    assert share_interval(-10**6, 1.0, 10**6, 1.0, added=True) == (0.0, 1.0)  # T(s) = -10**6 for every s
    assert estimate_share(0, 5.0, 0, 5.0, added=False).value == 0.0


# -- recorded by init, shown on every answer --------------------------------------------------

@pytest.fixture()
def files(tmp_path):
    """A database with table t (units of 1..6 rows: K = 2 drops 9 of 21 rows per six units) and its policy file."""
    rows = {u: 1 + u % 6 for u in range(600)}
    database = tmp_path / "t.duckdb"
    connection = duckdb.connect(str(database))
    connection.register("frame", frame(rows))
    connection.execute("CREATE TABLE t AS SELECT * FROM frame")
    connection.close()
    policy = tmp_path / "t.policy"
    policy.write_text(POLICY.replace("QUERY EPSILON 0.5", "QUERY EPSILON 5"), encoding="utf-8")
    clipped = sum(min(max(n - 2, 0), 2) for n in rows.values())
    return str(database), str(policy), clipped / (clipped + sum(min(n, 2) for n in rows.values()))


def test_init_records_the_estimate_once_and_every_answer_shows_it(files, capsys):
    database, policy, truth = files
    assert cli.main(["init", database, "--policy", policy]) == cli.EXIT_OK
    out = capsys.readouterr().out
    found = re.search(r"t: limits drop ≈ ([\d.]+)% ± ([\d.]+)% of t's rows beyond 2 per uid \(at least\); "
                      r"≈ [\d,]+ (± [\d,]+|\[0, [\d,]+\]) rows with no uid "
                      r"\(ε 5 of the budget, once\)", out)
    assert found, out
    assert abs(float(found[1]) / 100 - truth) <= float(found[2]) / 100 + 0.005  # shown to the percent
    with dpsql.connect(database) as db:
        assert db.budget.spent.epsilon == 5 and db.ledger()["sql"].tolist() == ["ESTIMATE LIMITS t"]
        answer = db.sql("SELECT COUNT(*) AS n, AVG(x) AS a FROM t", epsilon=1)
        line = str(answer.limits)
        assert re.search(r"^at most 2 rows per uid; x clamped to \[0, 10\]; limits drop ≈ [\d.]+% ± [\d.]+% of t's rows "
                         r"\(at least; estimated \d{4}-\d{2}-\d{2}, from the rows then\); rows with no uid \(≈ [\d,]+ "
                         r"(± [\d,]+|\[0, [\d,]+\]) of t's rows\) belong to nobody and are never counted; not in the ±: "
                         r"they can only lower COUNT\(\*\); they can move AVG\(x\) "
                         r"either way$", line), line
        drop = answer.limits.dropped[0]
        assert abs(drop.share.value - truth) <= drop.share.halfwidth
        assert "limits: " + line in repr(answer)
        repeat = db.sql("SELECT COUNT(*) AS n, AVG(x) AS a FROM t", epsilon=1)
        assert repeat.repeat and str(repeat.limits) == line
        assert f"limits: {line}" in db.explain("SELECT COUNT(*) AS n, AVG(x) AS a FROM t", epsilon=1)
        lower = db.sql("SELECT WITH DIFFERENTIAL_PRIVACY OPTIONS (max_rows_contributed = 1) COUNT(*) AS n FROM t",
                       epsilon=1)
        assert "2 rows per uid drop ≈" in str(lower.limits) and "this query's row limit can drop more" in str(lower.limits)
    assert cli.main(["init", database, "--policy", policy]) == cli.EXIT_OK  # already estimated: nothing charged
    with dpsql.connect(database) as db:
        assert db.budget.spent.epsilon == 7


def test_init_without_an_estimate_and_after_a_new_limit(files, tmp_path, capsys):
    database, policy, _ = files
    assert cli.main(["init", database, "--policy", policy, "--estimate-epsilon", "0"]) == cli.EXIT_OK
    assert "limits drop" not in capsys.readouterr().out
    with dpsql.connect(database) as db:
        assert db.budget.spent.epsilon == 0
        assert "limits drop" not in str(db.sql("SELECT COUNT(*) AS n FROM t", epsilon=1).limits)
    wider = tmp_path / "wider.policy"
    wider.write_text(POLICY.replace("MAX ROWS PER UNIT 2", "MAX ROWS PER UNIT 4"), encoding="utf-8")
    assert cli.main(["init", database, "--policy", str(wider), "--replace", "--estimate-epsilon", "2"]) == cli.EXIT_OK
    assert "limits drop ≈ " in capsys.readouterr().out
    with dpsql.connect(database) as db:
        assert db.budget.spent.epsilon == 3
        assert "of t's rows (at least; estimated " in str(db.sql("SELECT COUNT(*) AS n FROM t", epsilon=1).limits)


def test_an_estimate_over_budget_is_refused_and_init_still_stores_the_policy(files, tmp_path, capsys):
    database, _, _ = files
    small = tmp_path / "small.policy"
    small.write_text(POLICY.replace("BUDGET EPSILON 100", "BUDGET EPSILON 1"), encoding="utf-8")
    assert cli.main(["init", database, "--policy", str(small), "--estimate-epsilon", "2"]) == cli.EXIT_OK
    out = capsys.readouterr().out
    assert "later commands on this database need no --policy" in out
    assert "the share of rows the limits drop was not estimated: " in out
    with dpsql.connect(database) as db:
        assert db.budget.spent.epsilon == 0
    with dpsql.connect(database) as db, pytest.raises(dpsql.DPError, match="not a private table"):
        db.estimate_limits(0.1, ["nope"])


def test_row_level_tables_have_nothing_to_estimate():
    data = pd.DataFrame({"x": np.arange(5.0)})
    with dpsql.connect({"r": data}, policy="BUDGET EPSILON 9; PRIVATE TABLE r (PRIVACY UNIT ROW, x BOUNDS 0 TO 9);") as db:
        assert db.estimate_limits(1) == {} and db.budget.spent.epsilon == 0


@pytest.mark.skipif(shutil.which("psql") is None, reason="psql is not installed")
def test_psql_sees_the_recorded_share_in_every_answers_notice(built, tmp_path):
    """Through the server, an analyst's psql gets the share ``dpsql init`` recorded in each
    answer's NOTICE, with the per-aggregate words."""
    from dpsql.demo import SHOP_POLICY
    from dpsql.server import start_in_thread
    from dpsql.server.users import add_user

    database = tmp_path / "shop.duckdb"
    database.write_bytes(built.read_bytes())
    (tmp_path / "shop.policy").write_text(SHOP_POLICY)
    assert cli.main(["init", str(database), "--policy", str(tmp_path / "shop.policy"), "--estimate-epsilon", "1"]) == 0
    add_user(tmp_path / "users", "alice", "alice-secret")
    server = start_in_thread(database, users=tmp_path / "users", port=0)
    try:
        environment = {**os.environ, "PGPASSWORD": "alice-secret", "PGCONNECT_TIMEOUT": "5"}
        done = subprocess.run([shutil.which("psql"), "-h", "127.0.0.1", "-p", str(server.port), "-U", "alice",
                               "-d", "shop", "-X", "-A", "-t", "-c", "SELECT COUNT(*) AS n, AVG(amount) AS a FROM visits"],
                              env=environment, capture_output=True, text=True, timeout=120)
    finally:
        server.stop()
        server.thread.join(10)
    assert done.returncode == 0, done.stderr
    notice = next(line for line in done.stderr.splitlines() if line.startswith("NOTICE:  dpsql: cost"))
    assert re.search(r"limits drop ≈ [\d.]+% ± [\d.]+% of visits' rows \(at least; estimated \d{4}-\d{2}-\d{2}, "
                     r"from the rows then\); rows with no user_id \(≈ [\d,]+ (± [\d,]+|\[0, [\d,]+\]) of visits' "
                     r"rows\) belong to nobody and are never counted; not in the ±: they can only lower "
                     r"COUNT\(\*\); they can move AVG\(amount\) either way", notice), notice


def test_a_bad_estimate_epsilon_is_refused_before_the_policy_is_stored(files, capsys):
    database, policy, _ = files
    for bad in ("abc", "-1", "nan", "inf"):
        assert cli.main(["init", database, "--policy", policy, "--estimate-epsilon", bad]) == cli.EXIT_ERROR
        assert "--estimate-epsilon must be a number above 0" in capsys.readouterr().err
    assert cli.main(["budget", database]) == cli.EXIT_ERROR  # no policy was stored


# -- on Spark as on DuckDB ----------------------------------------------------------------------

SPARK = [pytest.mark.spark, pytest.mark.spark_ci, pytest.mark.xdist_group("spark")]
UNEVEN = {1: 1, 2: 3, 3: 7, 4: 200}
"""Units keeping 1, 2, 2, 2 rows and dropping 0, 1, 2, 2 of them (K = C = 2): (kept, dropped) = (7, 5)."""


@pytest.fixture(params=[pytest.param("duckdb", id="duckdb"), pytest.param("spark", id="spark", marks=SPARK)])
def engine(request):
    """Each engine in turn (``tests/engines.py``; Spark in the CI subset)."""
    from engines import Engine

    opened = Engine(request.param)
    yield opened
    opened.close()


def test_the_row_count_tables_have_their_declared_types_on_each_engine(engine):
    """Spark writes ``r - K`` by the type of ``r``, which its engine takes from
    ``raw_rows_columns``: what each engine's row-count table really holds, for a number and a
    string unit."""
    names = pd.DataFrame({"name": ["a", "A", "a"], "x": [1.0, 2.0, 3.0]})
    policy = POLICY + " PRIVATE TABLE s (PRIVACY UNIT name, MAX ROWS PER UNIT 2);"
    db = engine.connect({"t": frame(UNEVEN), "s": names}, policy=policy)
    for table in bounded_tables(list(db.policy.private_tables), db._catalog, lambda name: name):
        counts = raw_rows_table(raw_rows_name(table.name), db._engine.dialect)
        described = db._engine.describe(exp.select("*").from_(counts))
        assert dict(described) == raw_rows_columns(table) == {"dp_unit": {"t": "BIGINT", "s": "VARCHAR"}[table.source],
                                                               "r": "BIGINT"}


def test_the_estimate_is_the_same_on_both_engines_and_every_answer_shows_it(engine):
    """The same exact counts on both engines (so, seeded, the same recorded share), and the
    answers reading the table carry it in their limits line. Old code: Spark refused the
    estimate's own SQL ("cannot tell the type of r")."""
    db = engine.connect({"t": frame(UNEVEN)}, policy=POLICY, rng=SeededSource(3))
    plan = plan_dropped(db.policy.table("t"), "t", Fraction(1))
    assert plan is not None
    statement = dropped_statement(plan, db._engine.dialect)
    assert db._engine.fetch(statement.sql, bounded=statement.bounded) == [(7, 5, 0)]
    recorded = db.estimate_limits(1)["t"]
    assert recorded.share == release_dropped(plan, (7, 5, 0), SeededSource(3)).share
    assert recorded.no_unit == release_dropped(plan, (7, 5, 0), SeededSource(3)).no_unit
    assert db.budget.spent.epsilon == 1
    line = str(db.sql("SELECT COUNT(*) AS n FROM t", epsilon=1).limits)
    assert f"limits drop {recorded.share} of t's rows (at least; estimated {recorded.estimated}, " in line, line


def test_the_bias_report_reads_the_row_counts_on_both_engines(engine):
    """The per-query report (``dpsql.query.bias``) reads ``r`` too: seeded, the same report on both
    engines. Old code: Spark refused its SQL ("cannot tell the type of LEAST(COALESCE(r, w), 2)")."""
    sql = "SELECT COUNT(*) AS n FROM t WHERE x > 0"
    reports = []
    for db in (dpsql.connect({"t": frame(UNEVEN)}, policy=POLICY, ledger=":memory:", rng=SeededSource(5)),
               engine.connect({"t": frame(UNEVEN)}, policy=POLICY, rng=SeededSource(5))):
        with db:
            reports.append(db.sql(sql, epsilon=1, report_bias=0.25).bounding)
    assert reports[0] == reports[1] and reports[0].dropped is not None


@pytest.mark.spark
@pytest.mark.spark_ci
@pytest.mark.xdist_group("spark")
def test_init_on_a_spark_config_records_the_estimate_and_answers_show_it(tmp_path, capsys):
    """``dpsql init shop.spark.toml``: the estimate is recorded as over a DuckDB file, and the
    answers of a later connection to the config show it."""
    from engines import forget_copies
    from spark import session

    forget_copies(session())
    connection = duckdb.connect()
    connection.register("frame", frame({u: 1 + u % 6 for u in range(120)}))
    connection.execute(f"COPY (SELECT * FROM frame) TO '{tmp_path / 't.parquet'}' (FORMAT PARQUET)")
    connection.close()
    config = tmp_path / "t.spark.toml"
    config.write_text('[spark]\nmaster = "local[2]"\n\n[tables]\nt = "t.parquet"\n', encoding="utf-8")
    policy = tmp_path / "t.policy"
    policy.write_text(POLICY, encoding="utf-8")
    try:
        assert cli.main(["init", str(config), "--policy", str(policy)]) == cli.EXIT_OK
        out = capsys.readouterr().out
        found = re.search(r"t: limits drop (≈ \S+ (?:± \S+|\[\S+, \S+\])) of t's rows beyond 2 per uid \(at least\)"
                          r"(?:; ≈ \S+ (?:± \S+|\[\S+, \S+\]) rows with no uid)? \(ε 0.5 of the budget, once\)", out)
        assert found, out
        with dpsql.connect(str(config)) as db:
            assert db.ledger()["sql"].tolist() == ["ESTIMATE LIMITS t"]
            line = str(db.sql("SELECT COUNT(*) AS n FROM t", epsilon=1).limits)
            assert f"limits drop {found[1]} of t's rows (at least; estimated " in line, line
    finally:
        forget_copies(session())
