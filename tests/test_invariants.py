"""One test per privacy invariant of DESIGN.md (numbers 1 to 14, and 16), each named after it.

Each test is built to fail if its invariant were broken: it watches what dpsql does (which
SQL reaches DuckDB, when the ledger is charged, which exact aggregates are computed) rather
than trusting what dpsql says it does.

The engine-facing ones also run on Spark (``-spark``): static refusals (01), the charge before the
first private read and a generic failure after it (02), free repeats (09) and reads of the bounded
copy only (12); errors that fire for one user (03) run on Spark as attacks (``test_attacks.py``).
The others test DuckDB itself (its hardening, 07; its time and memory limits, 03),
the ledger (08), the analysis and the allow-list (06, 11, 12, 14, 16) or the rewrite's arithmetic
(04, 05, 13), which the Spark oracles and the corpus cover on Spark.
"""

from __future__ import annotations

import math
import re
import subprocess
import sys
import textwrap
import threading
from fractions import Fraction
from pathlib import Path

import duckdb
import numpy as np
import pandas as pd
import pytest
import sqlglot
from adversary import POLICY, TARGET, frames, neighbours, run
from engines import Engine as EngineUnderTest

import dpsql
import dpsql.query.answering
import dpsql.mechanisms.noise
from dpsql.backends.duckdb import Engine
from dpsql.backends.duckdb.released import ReleasedDatabase
from dpsql.backends.spark import SparkEngine
from dpsql.mechanisms.noise import SeededSource

GENERIC_FAILURE = "the query failed while running; its cost was charged and no answer was released"
READS_VISITS = re.compile(r'["`]visits["`]|["`]dp_bounded_visits__')
"""Generated SQL reading private visits rows: the table, or its bounded copy (DuckDB quotes names
with double quotes, Spark with backticks)."""
SPARK = [pytest.mark.spark, pytest.mark.xdist_group("spark")]
SPARK_CI = [*SPARK, pytest.mark.spark_ci]


def _on_engines(values: list, ci: set[int] = frozenset(), ids: list[str] | None = None) -> list:
    """``values`` (tuples of arguments) on DuckDB, then on Spark ("-spark"): the ``ci`` indices in
    the CI subset, the others only under ``make test-spark``."""
    params = []
    for index, value in enumerate(values):
        value = value if isinstance(value, tuple) else (value,)
        name = ids[index] if ids else str(index)
        params.append(pytest.param(*value, "duckdb", id=name))
        params.append(pytest.param(*value, "spark", id=f"{name}-spark", marks=SPARK_CI if index in ci else SPARK))
    return params


@pytest.fixture
def opened():
    """Engines a test opened through ``tests/engines.py``, closed after it."""
    engines: list[EngineUnderTest] = []

    def open_engine(name: str) -> EngineUnderTest:
        engines.append(EngineUnderTest(name))
        return engines[-1]

    yield open_engine
    for engine in engines:
        engine.close()


class Watch:
    """Records every statement that reaches DuckDB, and the exact aggregates dpsql releases."""

    def __init__(self, monkeypatch):
        self.statements: list[tuple[str, str]] = []
        self.exact: list = []
        self.plans: list = []
        for backend in (Engine, SparkEngine):
            for method in ("fetch", "fetch_df", "describe"):
                original = getattr(backend, method)

                def recording(engine, sql, *args, _original=original, _method=method, **kwargs):
                    self.statements.append((_method, sql))
                    return _original(engine, sql, *args, **kwargs)

                monkeypatch.setattr(backend, method, recording)
        original_fill = SparkEngine._fill

        def filling(engine, sources, _original=original_fill):
            # Spark caches a private table's bounded copy when a statement first reads it
            self.statements.extend(("fill", f'fill the copy of "{source}"') for source in sources)
            return _original(engine, sources)

        monkeypatch.setattr(SparkEngine, "_fill", filling)
        # Every connection post-processes in its own private DuckDB: ReleasedDatabase.post_process, recorded below.
        original_post = ReleasedDatabase.post_process

        def post(engine, columns, types, rows, sql):
            self.statements.append(("post_process", sql))
            return original_post(engine, columns, types, rows, sql)

        monkeypatch.setattr(ReleasedDatabase, "post_process", post)
        release = dpsql.query.answering.release_measures

        def capture(plan, domain, exact, source=None, histograms=None):
            self.plans.append(plan)
            self.exact.append([tuple(row) for row in exact])
            return release(plan, domain, exact, source, histograms)

        monkeypatch.setattr(dpsql.query.answering, "release_measures", capture)

    def reads_of(self, table: str) -> list[str]:
        """Statements that read rows (not DESCRIBE) and name ``table``."""
        pattern = re.compile(rf'\b{table}\b', re.IGNORECASE)
        return [sql for method, sql in self.statements if method != "describe" and pattern.search(sql)]


@pytest.fixture(scope="module")
def pair():
    """The two neighbours, shared by the module (tests look at what each query charges)."""
    connections = neighbours()
    yield connections
    for connection in connections.values():
        connection.close()


# ------------------------------------------------------------------------------------------
# 1. Static refusals read no private data and charge nothing.

STATIC_REFUSALS = [
    ("SELEC COUNT(*) FROM visits", {}, dpsql.UnsupportedQuery),                 # parse
    ("SELECT COUNT(*) FROM secrets", {}, dpsql.UnsupportedQuery),               # bind
    ("SELECT COUNT(nope) FROM visits", {}, dpsql.UnsupportedQuery),             # bind (column)
    ("SELECT amount FROM visits", {}, dpsql.UnsupportedQuery),                  # check
    ("SELECT SUM(user_id) FROM visits", {}, dpsql.UnsupportedQuery),            # analyse
    ("SELECT zip, COUNT(*) FROM visits GROUP BY zip", {}, dpsql.UnsupportedQuery),
    ("SELECT COUNT(*) FROM visits", {"epsilon": float("nan")}, dpsql.InvalidParameter),
    ("SELECT COUNT(*) FROM visits", {"epsilon": 1e6}, dpsql.BudgetExceeded),    # budget
    ("SELECT AVG(amount) FROM (SELECT user_id, amount FROM visits) AS t JOIN stores AS s "
     "ON t.store = s.store", {"epsilon": 1e6}, dpsql.DPError),
]


@pytest.mark.parametrize("sql, options, error, engine", _on_engines(STATIC_REFUSALS, ci={7},
                                                                    ids=[f"{sql[:32]}-{error.__name__}" for sql, _, error in STATIC_REFUSALS]))
def test_invariant_01_static_refusals_read_no_private_data_and_charge_nothing(sql, options, error, engine, opened,
                                                                                monkeypatch):
    with opened(engine).connect(frames(True), policy=POLICY, rng=SeededSource(0)) as db:
        watch = Watch(monkeypatch)
        with pytest.raises(error):
            db.sql(sql, **options)
        assert watch.reads_of("visits") == []
        assert db.budget.spent.epsilon == 0 and len(db.ledger()) == 0


def test_invariant_01_a_type_error_is_refused_before_the_charge(pair):
    outcome = run(pair[True], "SELECT COUNT(*) FROM visits WHERE amount < store")
    assert outcome.kind == "UnsupportedQuery" and outcome.spent == 0, (outcome.kind, outcome.spent)


# ------------------------------------------------------------------------------------------
# 2. The ledger is charged before any private data is read, in one transaction; a crash after
#    that loses no charge; run-time errors after the charge do not refund.

@pytest.mark.parametrize("engine", [pytest.param("duckdb", id="duckdb"), pytest.param("spark", id="spark",
                                                                                       marks=SPARK_CI)])
def test_invariant_02_charge_comes_first_and_survives_failures_and_crashes(tmp_path, monkeypatch, engine, opened):
    """On Spark too: the private read is a Spark statement (or the copy's fill, which runs inside it)."""
    backend = SparkEngine if engine == "spark" else Engine
    on = opened(engine)
    ledger = tmp_path / "shop.ledger"
    db = on.connect(frames(True), policy=POLICY, ledger=ledger, rng=SeededSource(0))
    seen = []
    original = backend.fetch

    def fetch(engine, sql, *args, **kwargs):
        if READS_VISITS.search(sql):
            seen.append(dpsql.connect(frames(False), policy=POLICY, ledger=ledger).budget.spent.epsilon)
            raise duckdb.ConversionException(f"Could not convert string 'secret-{TARGET}' to INT32")
        return original(engine, sql, *args, **kwargs)

    monkeypatch.setattr(backend, "fetch", fetch)
    with pytest.raises(dpsql.QueryFailed) as failed:
        db.sql("SELECT COUNT(*) FROM visits", epsilon=0.5)
    assert seen == [Fraction(1, 2)], "private data was read before the charge was committed"
    assert str(failed.value) == GENERIC_FAILURE and str(TARGET) not in str(failed.value)
    assert db.budget.spent.epsilon == Fraction(1, 2), "a run-time failure refunded the charge"

    def crash(engine, sql, *args, **kwargs):
        if READS_VISITS.search(sql):
            raise SystemExit("the process dies while reading private data")
        return original(engine, sql, *args, **kwargs)

    monkeypatch.setattr(backend, "fetch", crash)
    with pytest.raises(SystemExit):
        db.sql("SELECT SUM(amount) FROM visits", epsilon=0.25)
    monkeypatch.setattr(backend, "fetch", original)
    with on.connect(frames(True), policy=POLICY, ledger=ledger) as after_restart:
        assert after_restart.budget.spent.epsilon == Fraction(3, 4), "a crash lost a charge"


# ------------------------------------------------------------------------------------------
# 3. No data-dependent error reaches the analyst; NaN and +-inf are never summed.

ONE_USER_FAILURES = [
    f"SELECT COUNT(*) FROM visits WHERE 1 // (user_id - {TARGET}) = 0",
    f"SELECT COUNT(*) FROM visits WHERE 1 % (user_id - {TARGET}) = 0",
    f"SELECT COUNT(*) FROM visits WHERE CAST(CASE WHEN user_id = {TARGET} THEN 'x' ELSE '1' END AS INT) = 1",
    f"SELECT COUNT(*) FROM visits WHERE CAST(CASE WHEN user_id = {TARGET} THEN 999 ELSE 1 END AS TINYINT) = 1",
    f"SELECT COUNT(*) FROM visits WHERE user_id * 9223372036854775807 + {TARGET} > 0",
    f"SELECT SUM(CASE WHEN CAST(CASE WHEN user_id = {TARGET} THEN 'x' ELSE '2020-01-01' END AS DATE)"
    f" > DATE '2000-01-01' THEN amount END) FROM visits",
    f"SELECT store, AVG(CASE WHEN 1 // (user_id - {TARGET}) = 0 THEN amount END) FROM visits GROUP BY store",
    f"SELECT COUNT(k) FROM (SELECT user_id, 10 // (user_id - {TARGET}) AS k FROM visits) AS t",
]


ONE_USER_FAILURES += [
    pytest.param(f"SELECT COUNT(k) FROM (SELECT user_id, MAX(1 // (user_id - {TARGET})) AS k FROM visits "
                 "GROUP BY user_id) AS t", id="per-unit aggregate"),
    pytest.param(f"SELECT COUNT(k) FROM (SELECT user_id, 1 // (user_id - {TARGET}) AS k, COUNT(*) AS c FROM visits "
                 f"GROUP BY user_id, 1 // (user_id - {TARGET})) AS t", id="per-unit GROUP BY key"),
    pytest.param(f"SELECT COUNT(k) FROM (SELECT user_id, SUM(CASE WHEN user_id = {TARGET} THEN "
                 "170141183460469231731687303715884105727 ELSE 0 END) AS k FROM visits GROUP BY user_id) AS t",
                 id="per-unit HUGEINT overflow"),
]


@pytest.mark.parametrize("sql", ONE_USER_FAILURES)
def test_invariant_03_errors_that_fire_for_one_user_do_not_reach_the_analyst(sql, pair):
    present, absent = run(pair[True], sql), run(pair[False], sql)
    assert present.kind == absent.kind == "answer", (present.message, absent.message)


def test_invariant_03_nan_and_infinity_are_never_summed(monkeypatch, pair):
    watch = Watch(monkeypatch)
    result = pair[True].sql("SELECT SUM(amount) AS s, COUNT(amount) AS n FROM visits", epsilon=1)
    (total, count), = result.fetchall()
    assert math.isfinite(total) and math.isfinite(count)
    plan, exact = watch.plans[-1], watch.exact[-1]
    for value in exact[0]:
        assert isinstance(value, int), "an exact measure that is not an integer may hold NaN or inf"
    # The target's 12 rows hold 1e12, -1e12, NaN, inf, -inf, NULL, ...; at most k = 5 survive,
    # each clamped into [0, 500]: its share of the exact sum is within [0, 5 * 500].
    base = watch.exact[-1][0][0]
    pair[False].sql("SELECT SUM(amount) AS s, COUNT(amount) AS n FROM visits", epsilon=1)
    grid = plan.measures[0].grid
    assert 0 <= (base - watch.exact[-1][0][0]) * grid <= 5 * 500


# ------------------------------------------------------------------------------------------
# 4. Sums are exact: clamp, then sum in fixed point.

FLOAT_HOSTILE = [1e15, 0.1, -1e15, 1e-300, 0.1, 0.2, -0.0, 2.5e-8, 123456.789, -7e14, 3e15, -3e15,
                 5e-324, 0.30000000000000004, 999999999999999.9]


def _round_half_away(value: Fraction) -> int:
    """DuckDB's ROUND of a DOUBLE: halves away from zero."""
    floor = math.floor(abs(value) + Fraction(1, 2))
    return floor if value >= 0 else -floor


def test_invariant_04_sums_are_exact_fixed_point_integers(monkeypatch):
    policy = "BUDGET EPSILON 100; PRIVATE TABLE t (PRIVACY UNIT ROW, x BOUNDS -1e15 TO 1e15);"
    totals = []
    for values in (FLOAT_HOSTILE, FLOAT_HOSTILE + [7.77e14]):
        with dpsql.connect({"t": pd.DataFrame({"x": values})}, policy=policy, rng=SeededSource(0)) as db:
            watch = Watch(monkeypatch)
            db.sql("SELECT SUM(x) FROM t", epsilon=1)
        measure = watch.plans[-1].measures[0]
        (exact,), = watch.exact[-1]
        assert isinstance(exact, int), f"the exact sum is a {type(exact).__name__}, not a fixed-point integer"
        clamped = [min(max(Fraction(v), measure.lower * measure.grid), measure.upper * measure.grid) for v in values]
        assert exact == sum(_round_half_away(v / measure.grid) for v in clamped)
        totals.append(exact)
    # One more row moves the exact sum by exactly its own rounded value: within the sensitivity.
    assert totals[1] - totals[0] == _round_half_away(Fraction(7.77e14) / measure.grid)
    assert abs(totals[1] - totals[0]) <= measure.sensitivity.l1


# ------------------------------------------------------------------------------------------
# 5. Which rows survive contribution bounding depends only on the unit's own rows and a salt.

def _many_groups(seed: int) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    users = rng.integers(1, 9, size=120)
    return pd.DataFrame({"user_id": users, "store": [("north", "south", "east", "west")[i] for i in rng.integers(0, 4, 120)],
                         "amount": rng.integers(0, 600, 120).astype(float), "age": rng.integers(18, 90, 120),
                         "zip": "z", "note": ""})


_RUNS = iter(range(1, 10**6))


def _exact(frame: pd.DataFrame, ledger: Path, monkeypatch) -> dict:
    sql = "SELECT store, COUNT(*) AS n, SUM(amount) AS s FROM visits GROUP BY store"
    data = {"visits": frame.reset_index(drop=True), "stores": frames(False)["stores"]}
    with dpsql.connect(data, policy=POLICY, ledger=ledger, rng=SeededSource(0)) as db:
        watch = Watch(monkeypatch)
        # A new epsilon each time: an identical query would be a free repeat, not a release.
        db.sql(sql, epsilon=Fraction(1, 1000 + next(_RUNS)))
    return {row[0]: tuple(row[1:]) for row in watch.exact[-1]}


def test_invariant_05_contribution_bounding_depends_only_on_the_unit_and_the_salt(tmp_path, monkeypatch):
    ledger = tmp_path / "salt.ledger"   # one ledger: one secret salt for every run below
    data = _many_groups(3)
    assert data.groupby("user_id").size().max() > 5, "units must have more rows than MAX ROWS PER UNIT"
    whole = _exact(data, ledger, monkeypatch)
    # Physical order (rowid) must not matter ...
    for seed in range(3):
        shuffled = data.sample(frac=1, random_state=seed)
        assert _exact(shuffled, ledger, monkeypatch) == whole
    # ... nor other units: the bounded aggregate is the sum of each unit's own contribution.
    parts = [_exact(data[data.user_id == user], ledger, monkeypatch) for user in sorted(set(data.user_id))]
    added = {key: tuple(sum(part.get(key, (0, 0))[i] for part in parts) for i in range(2)) for key in whole}
    assert added == whole


# ------------------------------------------------------------------------------------------
# 6. GROUP BY keys come from a public domain or pass partition selection (delta > 0).

def test_invariant_06_keys_are_public_or_selected(pair):
    result = pair[True].sql("SELECT store, COUNT(*) AS n FROM visits GROUP BY store", epsilon=0.75)
    assert sorted(row[0] for row in result.fetchall()) == ["east", "north", "south", "west"]
    with pytest.raises(dpsql.UnsupportedQuery, match="no public KEYS domain"):
        pair[True].sql("SELECT zip, COUNT(*) FROM visits GROUP BY zip", epsilon=1)
    # The target's zip code is held by one unit only: P(released) <= delta per run (here
    # 1e-9, so thirty runs release it with probability below 3e-8).
    for run_ in range(30):  # a new epsilon each time, or the answer would be a free repeat
        rows = pair[True].sql("SELECT zip, COUNT(*) AS n FROM visits GROUP BY zip", epsilon=Fraction(1, 2 + run_),
                              delta=1e-9).fetchall()
        assert "target-zip" not in {row[0] for row in rows}
    plan = pair[True]._preparer.plan(pair[True]._check("SELECT zip, COUNT(*) FROM visits GROUP BY zip")[1],
                                     "", 1, Fraction(1, 10**9), None)
    from dpsql.mechanisms.selection import SelectionRule, release_probability
    rule = SelectionRule(plan.selection.scale, plan.selection.threshold, plan.selection.epsilon,
                         plan.selection.delta, 3, "unbounded")
    assert 3 * release_probability(1, rule) <= 1e-9


# ------------------------------------------------------------------------------------------
# 7. Only declared tables are reachable; DuckDB runs with external access disabled.

def test_invariant_07_databases_dpsql_opens_are_walled_in(tmp_path):
    path = tmp_path / "shop.duckdb"
    with duckdb.connect(str(path)) as setup:
        setup.execute("CREATE TABLE visits AS SELECT 1 AS user_id, 2.0 AS amount")
    secret_file = tmp_path / "secret.csv"
    secret_file.write_text("a\n1\n")
    leak_frame = pd.DataFrame({"a": [1]})  # noqa: F841 - a replacement scan would find it
    for target in (str(path), {"visits": pd.DataFrame({"user_id": [1]})}, ":memory:"):
        engine = Engine.open(target)
        try:
            hardening = engine.hardening
            assert hardening["enable_external_access"] == "false"
            assert hardening["python_enable_replacements"] == "false"
            assert hardening["lock_configuration"] == "true"
            assert hardening["autoload_known_extensions"] == "false"
            with pytest.raises(duckdb.PermissionException):
                engine.fetch(f"SELECT * FROM read_csv('{secret_file}')")
            with pytest.raises(duckdb.Error):
                engine.fetch("SET enable_external_access = true")
            with pytest.raises(duckdb.Error):
                engine.fetch("SELECT * FROM leak_frame")
            with pytest.raises(duckdb.Error):
                engine.fetch(f"COPY (SELECT 1) TO '{tmp_path / 'out.csv'}'")
        finally:
            engine.close()
    assert not (tmp_path / "out.csv").exists()


def test_invariant_07_the_analyst_reaches_only_declared_tables(pair):
    before = pair[True].budget.spent
    for sql in ("SELECT COUNT(*) FROM secrets", "SELECT * FROM duckdb_tables()", "SELECT * FROM read_csv('x')",
                "SELECT * FROM information_schema.tables", "ATTACH 'x.duckdb'", "COPY visits TO 'x.csv'",
                "PRAGMA version", "SET threads = 1", "INSTALL httpfs", "SELECT * FROM 'x.parquet'"):
        with pytest.raises(dpsql.UnsupportedQuery):
            pair[True].sql(sql)
    assert pair[True].budget.spent == before


# ------------------------------------------------------------------------------------------
# 8. The budget cannot be overspent: concurrently, across processes, or by reconnecting.

_SPEND = textwrap.dedent("""
    import sys
    sys.path[:0] = {paths!r}
    import dpsql
    from adversary import frames
    policy = "BUDGET EPSILON 2; PRIVATE TABLE visits (PRIVACY UNIT user_id, MAX ROWS PER UNIT 5);"
    db = dpsql.connect(frames(True), policy=policy, ledger=sys.argv[1])
    answered = 0
    for i in range(12):
        try:
            db.sql(f"SELECT COUNT(*) FROM visits WHERE age > {{i}} + 100 * {{sys.argv[2]}}", epsilon=0.25)
            answered += 1
        except dpsql.BudgetExceeded:
            pass
    print(answered)
""")


def test_invariant_08_budget_cannot_be_overspent(tmp_path):
    ledger = tmp_path / "budget.ledger"
    paths = [str(Path(__file__).parent.parent), str(Path(__file__).parent)]
    script = _SPEND.format(paths=paths)
    processes = [subprocess.Popen([sys.executable, "-c", script, str(ledger), str(i)], stdout=subprocess.PIPE,
                                  text=True) for i in range(2)]
    answered = [int(p.communicate(timeout=120)[0]) for p in processes]
    assert sum(answered) == 8, answered            # 8 x 0.25 = the budget of 2, never more
    policy = "BUDGET EPSILON 3; PRIVATE TABLE visits (PRIVACY UNIT user_id, MAX ROWS PER UNIT 5);"
    with dpsql.connect(frames(True), policy=policy, ledger=ledger) as reconnected:  # a larger budget
        assert reconnected.budget.spent.epsilon == 2                                # keeps what was spent
        outcomes = []

        def ask(i):
            try:
                reconnected.sql(f"SELECT COUNT(*) FROM visits WHERE age < {i}", epsilon=0.25)
                outcomes.append("answered")
            except dpsql.BudgetExceeded:
                outcomes.append("refused")

        threads = [threading.Thread(target=ask, args=(i,)) for i in range(12)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert outcomes.count("answered") == 4 and reconnected.budget.spent.epsilon == 3


# ------------------------------------------------------------------------------------------
# 9. An identical query may return its earlier answer for free, never a fresh draw for free.

@pytest.mark.parametrize("engine", [pytest.param("duckdb", id="duckdb"), pytest.param("spark", id="spark",
                                                                                       marks=SPARK_CI)])
def test_invariant_09_free_repeats_are_stored_answers_never_fresh_draws(tmp_path, monkeypatch, engine, opened):
    on = opened(engine)
    ledger = tmp_path / "repeat.ledger"
    sql = "SELECT store, COUNT(*) AS n, AVG(amount) AS a FROM visits GROUP BY store"
    with on.connect(frames(True), policy=POLICY, ledger=ledger) as db:
        first = db.sql(sql, epsilon=1)
        spent = db.budget.spent.epsilon

        def no_noise(*args, **kwargs):
            raise AssertionError("a free repeat drew fresh noise")

        with monkeypatch.context() as patch:
            for name in ("discrete_laplace", "discrete_gaussian", "exponential_mechanism"):
                patch.setattr(dpsql.mechanisms.noise, name, no_noise)
            again = db.sql("select  STORE, count(*) as n, avg(AMOUNT) as a from VISITS group by store", epsilon=1)
        assert again.fetchall() == first.fetchall() and again.cost.epsilon == 0 and again.repeat
        assert db.budget.spent.epsilon == spent
        different = db.sql(sql, epsilon=0.5)             # other options: a new, charged release
        assert not different.repeat and db.budget.spent.epsilon == spent + Fraction(1, 2)
    with on.connect(frames(True), policy=POLICY, ledger=ledger) as reconnected:
        later = reconnected.sql(sql, epsilon=1)
        assert later.fetchall() == first.fetchall() and later.repeat


# ------------------------------------------------------------------------------------------
# 10. DuckDB never sees analyst text, only SQL dpsql generated from the checked AST.

def test_invariant_10_duckdb_never_sees_analyst_text(pair, monkeypatch):
    watch = Watch(monkeypatch)
    analyst = ("SeLeCt   /* marker-one */ store,   CoUnT(*)  AS n -- marker-two\n"
               "FrOm   visits   WHERE amount > 7 /* marker-three; DROP TABLE visits */ GROUP BY store")
    pair[True].sql(analyst, epsilon=1)
    pair[True].sql("SELECT COUNT(*) / 2 + 1 AS half FROM visits -- marker-four", epsilon=1)
    assert watch.statements, "nothing reached the engine"
    for _, statement in watch.statements:
        assert "marker" not in statement and "DROP" not in statement
        assert "SeLeCt" not in statement and "CoUnT" not in statement and "FrOm" not in statement
    for sql in ("SELECT * FROM query('SELECT amount FROM visits')", "SUMMARIZE visits",
                "SELECT COUNT(*) FROM visits; SELECT 1", "EXPLAIN ANALYZE SELECT COUNT(*) FROM visits"):
        before = len(watch.statements)
        with pytest.raises(dpsql.UnsupportedQuery):
            pair[True].sql(sql)
        assert len(watch.statements) == before, f"{sql!r} reached DuckDB"


# ------------------------------------------------------------------------------------------
# 11. Names resolve as DuckDB resolves them; no shadowing; taint follows the data.

@pytest.mark.parametrize("sql", [
    "SELECT COUNT(*) FROM memory.main.visits",
    "SELECT * FROM memory.main.stores",
    "SELECT COUNT(*) FROM visits JOIN (SELECT store FROM memory.main.stores) AS s ON visits.store = s.store",
    "SELECT COUNT(*) FROM system.main.stores",
])
def test_invariant_11_a_database_part_in_a_table_name_is_refused(sql, pair):
    """A database part names another attached database — or dpsql's own — whose tables the
    policy never declared (an attacker read an attached file's `main.stores` exactly and for
    free this way): refused before anything runs, whatever the rest of the name."""
    with pytest.raises(dpsql.UnsupportedQuery, match="database part"):
        pair[True].sql(sql, epsilon=0.1)


@pytest.mark.parametrize("sql", [
    "SELECT COUNT(*) FROM VISITS",
    'SELECT COUNT(*) FROM "Visits"',
    "SELECT COUNT(*) FROM main.visits",
    "SELECT COUNT(*) FROM visits AS stores",
    "WITH s AS (SELECT * FROM visits) SELECT COUNT(*) FROM s",
    "SELECT COUNT(*) FROM (SELECT user_id, store FROM visits) AS stores",
    "SELECT COUNT(*) FROM stores JOIN visits ON stores.store = visits.store",
    "SELECT COUNT(*) FROM (SELECT user_id FROM visits UNION ALL SELECT user_id FROM visits) AS t",
])
def test_invariant_11_anything_derived_from_a_private_table_is_private(sql, pair):
    # Several spellings name the same query: a fresh epsilon keeps each from being a free repeat.
    epsilon = Fraction(1, 3 + next(_RUNS))
    before = pair[True].budget.spent.epsilon
    result = pair[True].sql(sql, epsilon=epsilon)
    assert not result.exact and not result.repeat and pair[True].budget.spent.epsilon == before + epsilon


def test_invariant_11_ctes_cannot_shadow_tables_and_public_data_stays_public(pair):
    before = pair[True].budget.spent
    for sql in ("WITH stores AS (SELECT * FROM visits) SELECT COUNT(*) FROM stores",
                "WITH visits AS (SELECT * FROM stores) SELECT COUNT(*) FROM visits",
                "WITH Stores AS (SELECT 1 AS store) SELECT COUNT(*) FROM stores"):
        with pytest.raises(dpsql.UnsupportedQuery, match="shadow"):
            pair[True].sql(sql)
    result = pair[True].sql("SELECT COUNT(*) AS n FROM STORES")
    assert result.exact and result.fetchall() == [(4,)] and pair[True].budget.spent == before


# ------------------------------------------------------------------------------------------
# 12. Functions are allow-listed and cost-bounded.

@pytest.mark.parametrize("expression", [
    "length(repeat(zip, 1000000)) > 0",
    "len(range(user_id)) > 0",
    "len(generate_series(1, user_id)) > 0",
    "regexp_matches(zip, '(a+)+$')",
    "len(list_value(zip, zip)) > 0",
    "len(string_split(note, 'a')) > 0",
    "lpad(zip, 1000000, 'x') <> ''",
    "note LIKE '%' || note",
    "note ILIKE zip",
    "length(" + " || ".join(["note"] * 20) + ") > 0",
    "TRY_CAST(note AS INTEGER[99999]) IS NULL",
    " + ".join(["age"] * 99) + " > 0",
    " + ".join(["age"] * 600) + " > 0",
])
def test_invariant_12_costly_functions_on_private_rows_are_refused(expression, pair):
    sql = f"SELECT COUNT(*) FROM visits WHERE CASE WHEN user_id = {TARGET} THEN {expression} ELSE FALSE END"
    outcome = run(pair[True], sql)
    assert outcome.kind == "UnsupportedQuery" and outcome.spent == 0, outcome


def test_invariant_12_a_self_join_costs_no_more_for_one_heavy_user():
    sql = "SELECT SUM(CASE WHEN a.age + b.age > 50 THEN 1 ELSE 0 END) FROM visits a JOIN visits b ON a.user_id = b.user_id"
    kinds = []
    for target in (True, False):
        data = frames(target)
        if target:
            heavy = pd.DataFrame({"user_id": TARGET, "store": "north", "amount": 1.0, "age": 30, "zip": "z",
                                  "note": ""}, index=range(40_000))
            data["visits"] = pd.concat([data["visits"], heavy], ignore_index=True)
        with dpsql.connect(data, policy=POLICY, query_timeout=1.0) as db:
            kinds.append(run(db, sql, epsilon=0.1).kind)
    assert kinds[0] == kinds[1], kinds


READ_SHAPES = [
    "SELECT COUNT(*) FROM visits WHERE age > 30",
    "SELECT store, SUM(amount) FROM visits GROUP BY store",
    "SELECT zip, COUNT(*) FROM visits GROUP BY zip",
    "SELECT MEDIAN(amount), COUNT(DISTINCT zip) FROM visits",
    "SELECT s.city, COUNT(*) FROM visits v JOIN stores s ON v.store = s.store GROUP BY s.city",
    "SELECT COUNT(*) FROM (SELECT user_id, SUM(amount) AS total FROM visits GROUP BY user_id) AS t WHERE total > 10",
    "WITH old AS (SELECT * FROM visits WHERE age > 60) SELECT COUNT(*) FROM old",
    "SELECT COUNT(*) FROM (SELECT user_id FROM visits WHERE age < 30 UNION ALL SELECT user_id FROM visits WHERE age > 60) AS u",
    "SELECT SUM(CASE WHEN a.amount > b.amount THEN 1 ELSE 0 END) FROM visits a JOIN visits b ON a.user_id = b.user_id",
]


@pytest.mark.parametrize("sql, engine", _on_engines(READ_SHAPES, ci={5}))
def test_invariant_12_analyst_expressions_only_ever_read_the_bounded_copy(sql, engine, opened, monkeypatch):
    """Every SQL a private query runs reads private rows only through the table's bounded copy
    (dpsql.backends.bounding): analyst expressions never see more than MAX ROWS PER UNIT rows of a
    unit, so they cannot cost more for one heavy user; and never reads the padding rows."""
    seen = []
    backend = SparkEngine if engine == "spark" else Engine
    original = backend.fetch

    def fetch(engine, sql_text, *args, **kwargs):
        seen.append(sql_text)
        return original(engine, sql_text, *args, **kwargs)

    with opened(engine).connect(frames(True), policy=POLICY) as db:
        monkeypatch.setattr(backend, "fetch", fetch)  # what queries run, not what connecting reads
        assert run(db, sql, epsilon=0.5, delta=1e-5 if "zip" in sql else 0).kind == "answer"
    private = [text for text in seen if "dp_bounded_visits" in text]
    assert private, seen
    for text in seen:
        tree = sqlglot.parse_one(text, read=engine)
        ctes = {cte.alias_or_name for cte in tree.find_all(sqlglot.exp.CTE)}
        tables = {table.name for table in tree.find_all(sqlglot.exp.Table)} - ctes
        stored_public = {t for t in tables if t.startswith("dp_public_")}  # public rows stored before the charge
        assert tables - stored_public <= {"stores", "dp_bounded_visits__user_id__5"}, (tables, text)
    for text in private:
        copies = len(re.findall(r'["`]dp_bounded_visits__\w+["`]', text))
        assert text.count("WHERE NOT dp_pad") == copies, text


def test_invariant_12_the_allow_list_holds_no_known_blow_up():
    from dpsql.sql import allowlist
    names = {c.__name__.lower() for c in allowlist.ROW_LEVEL_NODES} | set(allowlist.ROW_LEVEL_FUNCTIONS)
    for costly in ("repeat", "range", "generateseries", "generate_series", "regexpextract", "regexplike",
                   "regexpreplace", "arrayagg", "groupconcat", "lpad", "rpad", "pad", "unnest", "explode",
                   "split", "stringtoarray", "repeat", "array", "list_value", "random", "rand", "hash"):
        assert costly not in names, costly


# ------------------------------------------------------------------------------------------
# 13. Clamping preserves NULL and has one policy for NaN and +-inf.

def test_invariant_13_clamping_keeps_null_null_and_treats_nan_and_inf_by_one_rule(monkeypatch):
    values = [None, math.nan, math.inf, -math.inf, 600.0, -5.0, 250.0, None]
    frame = pd.DataFrame({"x": pd.array(values, dtype="float64")})
    policy = "BUDGET EPSILON 100; PRIVATE TABLE t (PRIVACY UNIT ROW, x BOUNDS 0 TO 500);"
    with dpsql.connect({"t": frame}, policy=policy, rng=SeededSource(0)) as db:
        watch = Watch(monkeypatch)
        db.sql("SELECT COUNT(x) AS n, SUM(x) AS s, AVG(x) AS a, SUM(COALESCE(x, 7)) AS c FROM t", epsilon=1)
    plan, (exact,) = watch.plans[-1], watch.exact[-1]
    by_name = dict(zip([m.name for m in plan.summed], exact))
    count, total, _, average_count, coalesced = (by_name[m.name] for m in plan.summed)
    # NULL and NaN are missing (not counted, not summed); +inf is the upper bound, -inf the lower.
    assert count == 5 and average_count == 5
    assert total * plan.summed[1].grid == 500 + 0 + 500 + 0 + 250
    # COALESCE sees the NULLs (not a bound in their place): 7 for each of the two NULLs, and
    # NaN, which is NULL to dpsql, too.
    assert coalesced * plan.summed[4].grid == 500 + 0 + 500 + 0 + 250 + 3 * 7


# ------------------------------------------------------------------------------------------
# 14. An ungrouped aggregate returns exactly one row; privacy parameters are validated.

@pytest.mark.parametrize("where", ["", "WHERE amount > 1e9", "WHERE user_id IS NULL", "WHERE FALSE"])
def test_invariant_14_an_ungrouped_aggregate_returns_exactly_one_row(where, pair):
    for db in pair.values():
        rows = db.sql(f"SELECT COUNT(*), SUM(amount), AVG(amount), MEDIAN(amount) FROM visits {where}",
                      epsilon=1).fetchall()
        assert len(rows) == 1 and all(value is not None and math.isfinite(value) for value in rows[0])


@pytest.mark.parametrize("options, error", [
    ({"epsilon": float("nan")}, dpsql.InvalidParameter),
    ({"epsilon": float("inf")}, dpsql.InvalidParameter),
    ({"epsilon": float("-inf")}, dpsql.InvalidParameter),
    ({"epsilon": -0.5}, dpsql.InvalidParameter),
    ({"epsilon": 0}, dpsql.InvalidParameter),
    ({"epsilon": -0.0}, dpsql.InvalidParameter),
    ({"epsilon": True}, dpsql.InvalidParameter),
    ({"epsilon": "1; DROP TABLE visits"}, dpsql.InvalidParameter),
    ({"epsilon": 10**6}, dpsql.BudgetExceeded),
    ({"epsilon": 0.5, "delta": 1}, dpsql.InvalidParameter),
    ({"epsilon": 0.5, "delta": 1.5}, dpsql.InvalidParameter),
    ({"epsilon": 0.5, "delta": -1e-9}, dpsql.InvalidParameter),
    ({"epsilon": 0.5, "delta": float("nan")}, dpsql.InvalidParameter),
    ({"epsilon": 0.5, "delta": 0.5, "noise": "gaussian"}, dpsql.BudgetExceeded),
    ({"epsilon": 0.5, "noise": "gaussian"}, dpsql.InvalidParameter),
])
def test_invariant_14_privacy_parameters_are_validated_never_refunded(options, error, pair):
    before = pair[True].budget.spent
    with pytest.raises(error):
        pair[True].sql("SELECT COUNT(*) FROM visits", **options)
    assert pair[True].budget.spent == before


def test_invariant_14_an_epsilon_too_small_to_sample_is_refused_before_the_charge(pair):
    outcome = run(pair[True], "SELECT COUNT(*) FROM visits", epsilon=1e-13)
    assert outcome.kind in ("answer", "InvalidParameter", "UnsupportedQuery"), outcome.kind
    assert outcome.kind == "answer" or outcome.spent == 0


_TINY_SUM = textwrap.dedent("""
    import sys
    sys.path[:0] = {paths!r}
    import dpsql
    from adversary import POLICY, frames
    db = dpsql.connect(frames(True), policy=POLICY)
    try:
        db.sql("SELECT SUM(amount) FROM visits", epsilon=1e-11)
    except dpsql.DPError:
        pass
    print("done")
""")


def test_invariant_14_a_tiny_epsilon_ends_in_an_answer_or_an_error():
    paths = [str(Path(__file__).parent.parent), str(Path(__file__).parent)]
    try:
        done = subprocess.run([sys.executable, "-c", _TINY_SUM.format(paths=paths)], capture_output=True,
                              text=True, timeout=60)
    except subprocess.TimeoutExpired:
        pytest.fail("db.sql did not return within 60 s: planning loops")
    assert done.stdout.strip() == "done", done.stderr


def test_invariant_03_the_time_and_memory_limits_end_in_the_generic_charged_failure(monkeypatch):
    rows = 60_000
    frame = pd.DataFrame({"user_id": np.arange(rows) // 3, "store": "north", "amount": 1.0, "age": 30,
                          "zip": "z", "note": "ab" * 200})
    costly = ("SELECT COUNT(*) FROM visits WHERE (note || note || note || note || note) LIKE '%"
              + "a_" * 30 + "c%'")
    data = {"visits": frame, "stores": frames(False)["stores"]}
    with dpsql.connect(data, policy=POLICY, query_timeout=0.3, memory_limit="256MB") as db:
        assert db._engine.hardening["memory_limit"] in ("244.1 MiB", "256.0 MiB", "256MB")
        outcome = run(db, costly, epsilon=0.5)
        assert outcome.kind == "QueryFailed" and outcome.message == GENERIC_FAILURE
        assert outcome.spent == Fraction(1, 2), "a timed-out query keeps its charge"
        original = Engine.fetch

        def out_of_memory(engine, sql, *args, **kwargs):
            if READS_VISITS.search(sql):
                raise duckdb.OutOfMemoryException("Out of Memory Error: failed to allocate 128.0 MiB (user 42424)")
            return original(engine, sql, *args, **kwargs)

        monkeypatch.setattr(Engine, "fetch", out_of_memory)
        outcome = run(db, "SELECT SUM(amount) FROM visits", epsilon=0.5)
        assert outcome.kind == "QueryFailed" and outcome.message == GENERIC_FAILURE and outcome.spent > 0
    with pytest.raises(dpsql.InvalidParameter):
        dpsql.connect(data, policy=POLICY, query_timeout=float("nan"))
    with pytest.raises(dpsql.InvalidParameter):
        dpsql.connect(data, policy=POLICY, query_timeout=-1)


# ------------------------------------------------------------------------------------------
# 16. Row-level privacy is unit-level privacy with one hidden unit per row.

_ROW_LEVEL = "BUDGET EPSILON 1000 DELTA 1e-3; PRIVATE TABLE t (PRIVACY UNIT ROW, x BOUNDS 0 TO 10); PUBLIC TABLE p;"
_ONE_ROW_UNITS = ("BUDGET EPSILON 1000 DELTA 1e-3; PRIVATE TABLE t (PRIVACY UNIT id, MAX ROWS PER UNIT 1, "
                  "x BOUNDS 0 TO 10); PUBLIC TABLE p;")


def _planned(explained: str) -> list[str]:
    """What explain says about the release: limits, measures, selection, bounding layers."""
    lines = [line.split("privacy unit: ")[-1].replace("each row is its own unit (PRIVACY UNIT ROW)", "id")
             for line in explained.splitlines()
             if line.startswith(("private table", "  m", "  a", "  partition selection"))]
    layers = [layer for layer in ("dp_granted", "dp_limited", "COUNT(DISTINCT dp_unit)") if layer in explained]
    return lines + layers


@pytest.mark.parametrize("sql, exact", [
    ("SELECT COUNT(*) AS n, SUM(x) AS s FROM t JOIN p ON t.g = p.g", True),
    ("SELECT t.g, COUNT(*) AS n, AVG(x) AS a FROM t JOIN p ON t.g = p.g GROUP BY t.g", True),
    ("SELECT MEDIAN(x) AS m FROM t JOIN p ON t.g = p.g", True),
    ("SELECT p.w, COUNT(DISTINCT x) AS d FROM t JOIN p ON t.g = p.g GROUP BY p.w", True),
    ("SELECT WITH DIFFERENTIAL_PRIVACY OPTIONS (max_rows_contributed = 1) p.w, SUM(x) AS s "
     "FROM t JOIN p ON t.g = p.g GROUP BY p.w", False),
    ("SELECT WITH DIFFERENTIAL_PRIVACY OPTIONS (max_groups_contributed = 2) p.w + 0 AS w, COUNT(*) AS n "
     "FROM t JOIN p ON t.g = p.g GROUP BY p.w + 0", False),
])
def test_invariant_16_row_level_privacy_is_unit_level_privacy_with_a_hidden_unit(sql, exact, monkeypatch):
    """A row-level table and the same table with a unique id per row, declared as the unit
    with MAX ROWS PER UNIT 1, get the same plan (rows and groups per unit after a join,
    sensitivities, noise, selection threshold, bounding layers) — and, where no salted choice
    is made, the same exact aggregates."""
    rng = np.random.default_rng(16)
    rows = pd.DataFrame({"id": np.arange(200), "g": rng.choice(["a", "b", "c"], 200), "x": rng.integers(0, 12, 200)})
    public = pd.DataFrame({"g": ["a", "a", "a", "b", "b"], "w": [1, 2, 3, 1, 2]})
    plans, results = [], []
    for policy in (_ROW_LEVEL, _ONE_ROW_UNITS):
        with dpsql.connect({"t": rows, "p": public}, policy=policy, rng=SeededSource(0)) as db:
            plans.append(_planned(db.explain(sql, epsilon=1, delta=1e-6)))
            watch = Watch(monkeypatch)
            db.sql(sql, epsilon=1, delta=1e-6)
            results.append(sorted(watch.exact[-1], key=repr))
    assert plans[0] == plans[1]
    assert ("at most 1 row and" if "max_rows_contributed" in sql else "at most 3 rows") in plans[0][0]
    if exact:
        assert results[0] == results[1]
