"""CORR, COVAR_POP/SAMP and REGR_SLOPE/INTERCEPT/R2 (issue 25): sensitivity by brute force, the
released value against DuckDB's own function on the clamped data, the derivation and coverage of
their intervals, refusals, and the surfaces (db.sql, shell, CLI, server)."""

from __future__ import annotations

import functools
import itertools
import math
import shutil
from dataclasses import replace
from fractions import Fraction

import duckdb
import numpy as np
import pytest
from engine_oracle import sql_value

import dpsql
from dpsql.analysis.aggregates import family_of, spellings
from dpsql.analysis.analyse import PrivacyOptions, analyse_query
from dpsql.analysis.check import check_query
from dpsql.analysis.plan import Plan, Release
from dpsql.backends.bounding import bounded_tables
from dpsql.backends.duckdb import Engine
from dpsql.backends.rewrite import rewrite_plan
from dpsql.mechanisms import noise
from dpsql.mechanisms.noise import SeededSource
from dpsql.policy.language import parse_policy
from dpsql.query.release import release_measures
from dpsql.shell.complete import complete
from dpsql.sql.names import table_key
from dpsql.sql.parse import parse

FUNCTIONS = ("CORR", "COVAR_POP", "COVAR_SAMP", "REGR_SLOPE", "REGR_INTERCEPT", "REGR_R2")

# -- brute-force sensitivity -------------------------------------------------------------------

ORACLE_POLICY = """BUDGET EPSILON 100;
NEIGHBOURS {neighbours};
PRIVATE TABLE t (PRIVACY UNIT uid, MAX ROWS PER UNIT 2, y BOUNDS -2 TO 3, x BOUNDS 0 TO 2,
                 g KEYS FROM keys.g);
PUBLIC TABLE keys;"""
BASE_ROWS = [(1, "a", 1, 2), (1, "b", -2, 0), (2, "a", 3, 1), (2, "a", None, 1), (3, "b", 0, None)]
CANDIDATES = [("a", 3, 2), ("a", 3, 0), ("a", -2, 2), ("a", None, 2), ("a", 100, -5), ("b", 3, 2)]
"""Rows a tested unit may hold: corners of the bounds (both signs of the cross product), a NULL
in one argument (no pair), values outside the bounds (clamped), both public keys."""
TESTED_UNIT = 99


def _units() -> list[tuple]:
    """Every multiset of up to k + 1 = 3 candidate rows."""
    return [unit for size in range(4) for unit in itertools.combinations_with_replacement(CANDIDATES, size)]


class Oracle:
    """Queries' bounded SQL run exactly on the base rows plus one tested unit's rows (each dataset
    loaded once for all of them)."""

    def __init__(self, *queries: tuple[str, bool]):
        """Each query with ``layered``: its statement's per-unit layers (``dp_units``, ``dp_granted``)
        bound the contributions, as for a source not bounded by construction, rather than the
        bounded copy."""
        self.connection = duckdb.connect()
        self.connection.execute("CREATE TABLE t (uid INTEGER, g VARCHAR, y INTEGER, x INTEGER)")
        self.connection.execute("CREATE TABLE keys AS SELECT * FROM (VALUES ('a'), ('b')) AS k(g)")
        self.engine = Engine(self.connection, owned=True, path=None)
        catalog = self.engine.catalog()
        tables = parse_policy(ORACLE_POLICY.format(neighbours="UNBOUNDED")).private_tables
        self.engine.prepare_bounding(bounded_tables(list(tables), catalog, table_key), "salt")
        self.plans: list[dict[str, Plan]] = []
        self.statements: list[str] = []
        for sql, layered in queries:
            plans = {}
            for neighbours in ("unbounded", "bounded"):
                policy = parse_policy(ORACLE_POLICY.format(neighbours=neighbours.upper()))
                query = check_query(parse(sql).tree, sql, policy, catalog, self.engine)
                plans[neighbours] = analyse_query(query, policy, PrivacyOptions(epsilon=Fraction(1)))
            plan = plans["unbounded"]
            statement = rewrite_plan(replace(plan, query=replace(plan.query, rows_per_unit=None)) if layered else plan)
            assert ("dp_granted" in statement) == layered
            self.plans.append(plans)
            self.statements.append(statement)

    def run(self, unit_rows: tuple) -> tuple[dict[tuple, tuple[int, ...]], ...]:
        """Per query, {key: exact measures} on the base rows plus the tested unit's."""
        rows = BASE_ROWS + [(TESTED_UNIT, g, y, x) for g, y, x in unit_rows]
        values = ", ".join(f"({u}, '{g}', {sql_value(y)}, {sql_value(x)})" for u, g, y, x in rows)
        self.connection.execute(f"DELETE FROM t; INSERT INTO t VALUES {values}")
        self.engine.refresh_bounding()
        results = []
        for plans, statement in zip(self.plans, self.statements):
            plan = plans["unbounded"]
            exact = self.engine.fetch(statement, {"salt": "salt"} if "$salt" in statement else None,
                                      bounded=plan.query.bounded)
            width = len(plan.query.keys)
            result = {key: (0,) * len(plan.measures) for key in ([("a",), ("b",)] if width else [()])}
            result.update({tuple(r[:width]): tuple(int(v or 0) for v in r[width:]) for r in exact})
            results.append(result)
        return tuple(results)


def _distance(a: dict, b: dict, index: int) -> tuple[int, int]:
    diffs = [a[key][index] - b[key][index] for key in a]
    return sum(abs(d) for d in diffs), sum(d * d for d in diffs)


def _worst(results: list[dict], empty: dict, count: int) -> dict[str, list[tuple[int, int]]]:
    """Per neighbour relation, per measure, the largest (L1, squared L2) change one unit makes."""
    results = list({repr(sorted(r.items())): r for r in results}.values())
    pairs = {"unbounded": [(r, empty) for r in results], "bounded": list(itertools.combinations(results, 2))}
    return {relation: [(max(_distance(a, b, i)[0] for a, b in chosen), max(_distance(a, b, i)[1] for a, b in chosen))
                       for i in range(count)] for relation, chosen in pairs.items()}


QUERIES = (("SELECT REGR_R2(y, x) FROM t", False), ("SELECT g, CORR(y, x) FROM t GROUP BY g", True))
"""Every statistic ungrouped through the bounded copy, and grouped through the per-unit layers."""


def test_each_statistic_s_sensitivity_is_the_largest_change_one_unit_makes():
    """Every statistic (centred sums, sums of squares, the cross-product sum over [-s_y s_x, s_y s_x]
    = [-10, 10] here, the count of pairs), ungrouped through the bounded copy and grouped through
    the per-unit layers: adding, removing or replacing one unit of up to k + 1 rows (corners, NULL
    in one argument, values outside the bounds) moves each measure's integer vector by at most —
    and at worst exactly — the analysed L1 and L2."""
    oracle = Oracle(*QUERIES)
    runs = [oracle.run(unit) for unit in _units()]
    empty = oracle.run(())
    for index, ((sql, _), plans) in enumerate(zip(QUERIES, oracle.plans)):
        worst = _worst([run[index] for run in runs], empty[index], len(plans["unbounded"].measures))
        for relation, plan in plans.items():
            assert sum(m.epsilon for m in plan.measures) == plan.epsilon == 1  # split equally: 1/m each
            for measure, (l1, l2_squared) in zip(plan.measures, worst[relation]):
                label = f"{sql} {measure.name} {relation}"
                assert (l1, l2_squared) == (measure.sensitivity.l1, measure.sensitivity.l2_squared), label
                # the noise is calibrated to the brute-forced change: Laplace scale >= L1 / epsilon
                assert measure.epsilon == Fraction(1, len(plan.measures)) and measure.scale * measure.epsilon >= l1


def test_the_cross_product_interval_is_the_corner_products_of_the_centred_arguments():
    """y in [-2, 3] and x in [0, 2] on the grid 1 centre to [-5, 5] and [-2, 2]: the cross-product
    sum's row values lie in [-10, 10], squares in [0, 25] and [0, 4], sums in [-5, 5] and [-2, 2]."""
    plan = Oracle(("SELECT REGR_R2(y, x) FROM t", False)).plans[0]["unbounded"]
    bounds = {tuple(f.power for f in m.factors): (m.lower, m.upper) for m in plan.measures if m.factors}
    assert bounds == {(0, 1): (-2, 2), (1, 0): (-5, 5), (1, 1): (-10, 10), (0, 2): (0, 4), (2, 0): (0, 25)}


def test_the_per_unit_layers_and_the_bounded_copy_give_the_same_statistics():
    """On data whose units are within their k rows, the layered statement (products summed per
    (unit, group), scaled and clamped per unit) and the direct one give the same exact integers."""
    con = _data()
    engine = Engine(con, owned=False, path=None)
    policy = parse_policy(POLICY)
    sql = "SELECT g, REGR_R2(y, x), COVAR_SAMP(x, y) FILTER (WHERE y > 0) FROM t GROUP BY g"
    engine.prepare_bounding(bounded_tables(list(policy.private_tables), engine.catalog(), table_key), "salt")
    plan = analyse_query(check_query(parse(sql).tree, sql, policy, engine.catalog(), engine), policy,
                         PrivacyOptions(epsilon=Fraction(1)))
    layered = replace(plan, query=replace(plan.query, rows_per_unit=None))
    runs = [sorted(engine.fetch(rewrite_plan(p), {"salt": "salt"}, bounded=p.query.bounded)) for p in (plan, layered)]
    assert runs[0] == runs[1] and len(runs[0]) == 2


# -- released values ---------------------------------------------------------------------------

POLICY = """BUDGET EPSILON 1e16;
NEIGHBOURS UNBOUNDED;
PRIVATE TABLE t (PRIVACY UNIT uid, MAX ROWS PER UNIT 3, MAX GROUPS PER UNIT 2,
                 y BOUNDS -4 TO 4, x BOUNDS 0 TO 8, g KEYS ('a', 'b'));"""


def _data() -> duckdb.DuckDBPyConnection:
    """Pairs on a 1/8 grid (exact on the arguments' grids), some outside the bounds, some with a
    NULL in one argument; every unit within its 3 rows, so nothing is truncated."""
    con = duckdb.connect()
    con.execute("CREATE TABLE t (uid INTEGER, g VARCHAR, y DOUBLE, x DOUBLE)")
    con.execute(f"INSERT INTO t VALUES {_rows()}")
    return con


@functools.cache
def _rows() -> str:
    rng = np.random.default_rng(7)
    rows = []
    for uid in range(400):
        for _ in range(int(rng.integers(1, 4))):
            x = float(rng.integers(-8, 72)) / 8
            y = float(np.round((0.6 * x - 2 + rng.normal(0, 1.2)) * 8)) / 8
            rows.append((uid, "ab"[uid % 2], None if rng.random() < 0.05 else y, None if rng.random() < 0.05 else x))
    return ", ".join(f"({u}, '{g}', {sql_value(y)}, {sql_value(x)})" for u, g, y, x in rows)


CLAMPED = ("(SELECT g, x AS raw_x, CASE WHEN y IS NOT NULL THEN LEAST(GREATEST(y, -4), 4) END AS y, "
           "CASE WHEN x IS NOT NULL THEN LEAST(GREATEST(x, 0), 8) END AS x FROM t)")
"""The clamped data, NULL kept NULL (LEAST and GREATEST skip NULLs), the raw x for the FILTER."""


def test_with_noise_of_zero_variance_each_function_is_duckdb_s_own_on_the_clamped_data():
    """epsilon 1e14: every noise scale is below 1e-4 grid steps, so the seeded discrete Laplace draws
    0 and the release is the bounded truth: DuckDB's own function on the clamped pairs, per public
    key and with FILTER, for all six functions at once."""
    con = _data()
    calls = ", ".join(f"{f}(y, x) FILTER (WHERE x > 1) AS f_{f.lower()}" for f in FUNCTIONS)
    with dpsql.connect(con, policy=POLICY, ledger=":memory:", rng=SeededSource(3)) as db:
        released = db.sql(f"SELECT g, {calls} FROM t GROUP BY g ORDER BY g", epsilon=1e14).fetchall()
    truth = con.sql(f"SELECT g, {calls.replace('x > 1', 'raw_x > 1')} FROM {CLAMPED} GROUP BY g ORDER BY g").fetchall()
    assert [r[0] for r in released] == ["a", "b"]
    for got, want in zip(released, truth):
        assert got[1:] == pytest.approx(want[1:], rel=1e-9, abs=1e-12)


def test_released_values_stay_within_what_is_possible():
    """At a small epsilon the noisy statistics are far off; CORR stays in [-1, 1], R^2 in [0, 1],
    COVAR_POP within h_y h_x = 4 * 4 and COVAR_SAMP within twice that, and so do their intervals."""
    con = _data()
    calls = ", ".join(f"{f}(y, x) AS {f.lower()}" for f in FUNCTIONS)
    possible = {"corr": (-1, 1), "regr_r2": (0, 1), "covar_pop": (-16, 16), "covar_samp": (-32, 32)}
    with dpsql.connect(con, policy=POLICY, ledger=":memory:", rng=SeededSource(5)) as db:
        for _ in range(20):
            frame = db.sql(f"SELECT {calls} FROM t WHERE uid < 30", epsilon=0.05).intervals()
            for name, (low, high) in possible.items():
                for column in (name, f"{name}_low", f"{name}_high"):
                    value = frame[column][0]
                    assert math.isnan(value) or low <= value <= high, (column, value)


# -- intervals ---------------------------------------------------------------------------------

@functools.cache
def _plan(function: str) -> Plan:
    con = _data()
    with dpsql.connect(con, policy=POLICY, ledger=":memory:") as db:
        engine = db._engine  # noqa: SLF001 - the plan of a query, as the connection builds it
        sql = f"SELECT {function}(y, x) FROM t"
        policy = parse_policy(POLICY)
        query = check_query(parse(sql).tree, sql, policy, engine.catalog(), engine)
        return analyse_query(query, policy, PrivacyOptions(epsilon=Fraction(2)))


def _exact(plan: Plan) -> dict[str, int]:
    """Exact statistics of a fixed sample of pairs (no database): y, x in grid steps, clamped."""
    aggregate = plan.aggregates[0]
    measures = [plan.measure(name) for name in aggregate.measures]
    rng = np.random.default_rng(11)
    y_factor, x_factor = measures[0].factors
    exact = {}
    xs = rng.integers(x_factor.lower, x_factor.upper + 1, 2000)
    ys = np.clip((0.5 * (xs - x_factor.lower) * (y_factor.upper - y_factor.lower) / (x_factor.upper - x_factor.lower)
                  + y_factor.lower + rng.normal(0, 300, 2000)).astype(int), y_factor.lower, y_factor.upper)
    for measure in measures:
        if not measure.factors:
            exact[measure.name] = len(xs)
            continue
        total = 0
        for y, x in zip(ys.tolist(), xs.tolist()):
            term = 1
            for factor, v in zip(measure.factors, (y, x)):
                term *= (2 * v - factor.lower - factor.upper) ** factor.power
            total += term
        exact[measure.name] = total
    return exact


def _release(plan: Plan, noisy: dict[str, list[int]]) -> Release:
    rows = len(next(iter(noisy.values())))
    return Release(keys=tuple(() for _ in range(rows)), noisy={k: tuple(v) for k, v in noisy.items()})


def _truth(plan: Plan, exact: dict[str, int]) -> float:
    aggregate = plan.aggregates[0]
    measures = [plan.measure(name) for name in aggregate.measures]
    return family_of(aggregate).values(aggregate, measures, _release(plan, {k: [v] for k, v in exact.items()}))[0]


def _binomial_tail(trials: int, p: float, at_least: int) -> float:
    """P(Binomial(trials, p) >= at_least), exactly enough (log-space sum)."""
    logs = [math.lgamma(trials + 1) - math.lgamma(k + 1) - math.lgamma(trials - k + 1)
            + k * math.log(p) + (trials - k) * math.log1p(-p) for k in range(at_least, trials + 1)]
    top = max(logs)
    return math.exp(top) * sum(math.exp(v - top) for v in logs)


@pytest.mark.parametrize("function", FUNCTIONS)
def test_intervals_cover_the_truth_at_least_as_often_as_promised(function):
    """1,000 releases of fixed statistics with the plan's own noise (seeded): the 80% intervals miss
    the truth at most t times, where P(Binomial(1000, 0.2) >= t) < 1e-6 — a sound test of the
    promised coverage (tests/test_intervals.py also checks that narrower intervals fail)."""
    plan = _plan(function)
    aggregate = plan.aggregates[0]
    measures = [plan.measure(name) for name in aggregate.measures]
    exact = _exact(plan)
    truth = _truth(plan, exact)
    trials, alpha = 1000, 0.2
    source = SeededSource(17)
    noisy = {m.name: (exact[m.name] + noise.discrete_laplace(m.scale, trials, source)).tolist() for m in measures}
    spans = family_of(aggregate).intervals(aggregate, measures, _release(plan, noisy), alpha)
    # a NaN interval ("derived, no ±": a slope whose var_x may be 0) claims nothing, so misses nothing
    misses = sum(not (low <= truth <= high) for low, high in spans if not math.isnan(low))
    limit = next(t for t in range(trials + 1) if _binomial_tail(trials, alpha, t) < 1e-6)
    assert misses < limit


def test_an_undefined_statistic_reports_no_interval_narrower_than_possible():
    """When the noisy count of pairs is not positive nothing is known: NaN values, and intervals
    that are the whole possible range (CORR [-1, 1], R^2 [0, 1]) or none for the unbounded slope
    and intercept (NaN: "derived, no ±")."""
    for function, expected in (("CORR", (-1.0, 1.0)), ("REGR_R2", (0.0, 1.0)), ("REGR_SLOPE", "none"),
                               ("REGR_INTERCEPT", "none")):
        plan = _plan(function)
        aggregate = plan.aggregates[0]
        measures = [plan.measure(name) for name in aggregate.measures]
        release = _release(plan, {m.name: [0] for m in measures})
        family = family_of(aggregate)
        assert math.isnan(family.values(aggregate, measures, release)[0])
        (low, high), = family.intervals(aggregate, measures, release, 0.05)
        assert (low, high) == expected if expected != "none" else math.isnan(low) and math.isnan(high)
        assert math.isnan(family.half_widths(aggregate, measures, release, 0.05)[0])


# -- refusals and surfaces ---------------------------------------------------------------------

@pytest.mark.parametrize("sql, construct, fragment", [
    ("SELECT REGR_SLOPE(amount) FROM visits", "REGR_SLOPE", "takes two arguments"),
    ("SELECT CORR(amount, user_id) FROM visits", "user_id", "no BOUNDS"),
    ("SELECT COVAR_POP(amount, store) FROM visits", "store", ""),
])
def test_refusals_name_the_construct_its_position_and_a_fix(db, sql, construct, fragment):
    before = db.budget.spent
    with pytest.raises(dpsql.UnsupportedQuery) as refused:
        db.sql(sql, epsilon=0.1)
    error = refused.value
    assert fragment in str(error) and error.line == 1 and error.col is not None and error.hint
    assert construct in sql[error.col - 1:]
    assert db.budget.spent == before


def test_explain_names_each_statistic_and_the_epsilon_split(db):
    text = db.explain("SELECT CORR(amount, age) FROM visits")
    assert "cross-product sum of centred \"amount\" × \"age\"" in text
    assert "sum of squared centred \"age\"" in text and "centred sum of \"amount\"" in text
    assert "split equally between these 6 measures" in text
    assert text.count("epsilon 0.0166667") == 6  # the query's 0.1, one sixth per measure
    covar = db.explain("SELECT COVAR_SAMP(amount, age) FROM visits")
    assert "split equally between these 4 measures" in covar and "sum of squared" not in covar


def test_the_shell_offers_every_second_moment_spelling():
    offered = {s.text for s in complete("SELECT ", {"visits": ["amount"]}) if s.detail == "DP aggregate"}
    assert {f"{name}(" for name in FUNCTIONS} <= offered
    assert set(FUNCTIONS) <= set(spellings())


def test_the_cli_answers_corr(shop, capsys):
    from cli_run import run

    database, policy = shop
    code, out, err = run(capsys, "query", database, "--policy", policy, "--epsilon", "0.5",
                         "SELECT CORR(amount, age) AS r, REGR_INTERCEPT(amount, age) AS b FROM visits")
    assert code == 0, err
    header, row = (line for line in out.splitlines() if line.startswith("│"))
    assert [part.strip() for part in header.split("│")[1:3]] == ["r", "b"]
    r, b = row.split("│")[1:3]
    assert "[" in r or "±" in r or "NULL" in r  # its interval cut to [-1, 1], or NULL: a noisy variance <= 0
    assert "derived, no ±" in b or "±" in b or "NULL" in b  # the intercept: a finite ± or none
    assert "cost ε 0.5" in err  # the footer, on stderr


def test_each_statistic_is_released_with_its_plan_s_noise_scale():
    """The noise each statistic gets is the discrete Laplace of its plan's scale: over 6,000 released
    cells of one grouped CORR, each measure's noise has a sample variance within 25% of the exact
    variance 2q/(1 - q)^2 (q = e^(-1/scale)). The sample variance of 6,000 draws has a relative
    standard error below 3% (excess kurtosis about 3), so 25% is over 8 standard errors: a correct
    release fails far less than 1e-6 of the time, and a scale off by a factor 2 (variance x4 or /4)
    always fails. Seeded, so deterministic."""
    con = _data()
    sql = "SELECT g, CORR(y, x) FROM t GROUP BY g"
    policy = parse_policy(POLICY)
    with dpsql.connect(con, policy=POLICY, ledger=":memory:") as db:
        engine = db._engine  # noqa: SLF001 - the plan of a query, as the connection builds it
        plan = analyse_query(check_query(parse(sql).tree, sql, policy, engine.catalog(), engine), policy,
                             PrivacyOptions(epsilon=Fraction(1)))
    cells = 6000
    exact = [(f"k{i}", *(1000 * (j + 1) for j in range(len(plan.summed)))) for i in range(cells)]
    release = release_measures(plan, [(f"k{i}",) for i in range(cells)], exact, SeededSource(23))
    for j, measure in enumerate(plan.summed):
        draws = np.array(release.noisy[measure.name], dtype=float) - 1000 * (j + 1)
        q = math.exp(-1 / float(measure.scale))
        assert abs(draws.var() / (2 * q / (1 - q) ** 2) - 1) < 0.25, measure.name


@pytest.mark.skipif(shutil.which("psql") is None, reason="psql is not installed")
def test_psql_gets_corr_per_public_key_through_the_server_charged_to_the_analyst(built, tmp_path):
    from served import psql_lines, serve_shop

    from dpsql.demo import SHOP_POLICY

    server = serve_shop(built, tmp_path, SHOP_POLICY, "alice", "alice-secret")
    try:
        lines, shown = psql_lines(server, "alice", "alice-secret",
                                  "SELECT store, REGR_SLOPE(amount, age) AS slope, CORR(amount, age) FILTER "
                                  "(WHERE age > 30) AS r FROM visits GROUP BY store ORDER BY store", "SHOW budget")
    finally:
        server.stop()
        server.thread.join(10)
    rows = [line.split("|") for line in lines if line.count("|") == 2]
    # one row per public store key; an undefined CORR (a noisy variance not positive) reads as NULL
    assert len(rows) == 12 and all(r[2] == "" or -1 <= float(r[2]) <= 1 for r in rows), shown
    assert "total|3.0|0.1|2.9|1e-06|0.0|1e-06" in lines, shown  # charged once, the query's 0.1


def test_products_are_summed_in_bigint_only_where_it_cannot_overflow():
    """Row values are computed in BIGINT when every centred factor and the product stay below 2**62
    (always, on the 12-bit grids the planner picks), and in HUGEINT otherwise: never an overflow
    after the charge."""
    from dpsql.backends.render import render
    from dpsql.backends.rewrite import _needs_hugeint, _product_value

    plan = _plan("CORR")
    cross = next(m for m in plan.measures if all(f.power == 1 for f in m.factors))
    assert not _needs_hugeint(cross)
    y, x = cross.factors
    wide = replace(cross, factors=(replace(y, lower=-2**40, upper=2**40), replace(x, lower=-2**40, upper=2**40)),
                   lower=-2**82, upper=2**82)
    assert _needs_hugeint(wide)
    columns = {(m, i): f"r{i}" for m in (cross.name,) for i in range(2)}
    assert "INT128" not in render(_product_value(cross, columns))
    assert render(_product_value(wide, columns)).count("AS INT128)") == 2  # each centred factor widened


def test_spark_checks_both_arguments_as_row_level_expressions():
    """The Spark backend checks the row-level expressions it would evaluate before the charge: both
    arguments of a two-argument aggregate (no Spark session needed for this part)."""
    import sqlglot

    from dpsql.backends.spark.check import row_level_roots

    tree = sqlglot.parse_one("SELECT CORR(y, x + 1), SUM(z), QUANTILE_CONT(w, 0.5) FROM t", read="duckdb")
    assert [root.sql() for root in row_level_roots(tree)] == ["y", "x + 1", "z", "w"]


def test_the_limits_name_both_clamped_columns(db):
    """The limits every answer states (and the bias report reads) list each argument's clamp."""
    result = db.sql("SELECT CORR(amount, age) FROM visits", epsilon=0.1)
    clamped = {name for name, _, _ in result.limits.clamped}
    assert clamped == {"amount", "age"}


def test_private_keys_pass_partition_selection_as_for_avg(db):
    """GROUP BY a column with no KEYS domain: keys are released by partition selection (delta > 0),
    which takes its share of epsilon beside CORR's six statistics; without delta it is refused."""
    sql = "SELECT zip, CORR(amount, age) AS r FROM visits GROUP BY zip"
    with pytest.raises(dpsql.UnsupportedQuery, match="no public KEYS domain"):
        db.explain(sql)
    text = db.explain(sql, epsilon=0.7, delta=1e-7)
    # 0.7 in two shares: 0.35 for partition selection, 0.35 for CORR, 0.35 / 6 for each statistic
    assert "reaches" in text and "; epsilon 0.35, delta 1e-07" in text and text.count("epsilon 0.0583333,") == 6
    result = db.sql(sql, epsilon=0.7, delta=1e-7)
    assert all(math.isnan(r) or -1 <= r <= 1 for _, r in result.fetchall())


def test_the_statement_renders_for_spark_without_a_session():
    """The Spark backend renders the same trees: both statement forms of a grouped CORR render, the
    products in BIGINT as on DuckDB (no partial product can reach 2**62 on these grids)."""
    from dpsql.backends.spark.pieces import SparkSQL
    from dpsql.backends.spark.render import column_types

    oracle = Oracle(("SELECT g, CORR(y, x) FROM t GROUP BY g", False))
    plan = oracle.plans[0]["unbounded"]
    dialect = SparkSQL(column_types(oracle.engine.catalog()))
    for form in (plan, replace(plan, query=replace(plan.query, rows_per_unit=None))):
        sql = rewrite_plan(form, dialect=dialect)
        product = sql[:sql.index(" AS v_m2")]
        product = product[product.rindex("CASE WHEN r_m0_0 IS NULL OR r_m0_1 IS NULL"):]
        assert "DECIMAL" not in product and "AS r_m0_1" in sql  # the cross product in BIGINT; sums are exact


@pytest.mark.parametrize("expression", ["COVAR_POP(y * 1e200, x * 1e200)", "COVAR_SAMP(y * 2e153, x * 2e153)",
                                        "REGR_SLOPE(y * 1e290, x * 1e-290)", "REGR_SLOPE(y * 1e303, x * 1e-6)",
                                        "REGR_INTERCEPT(y * 1e303, x * 1e-6)"])
def test_values_and_intervals_beyond_float_range_are_infinite_never_a_failure_after_the_charge(expression):
    """Scaling noisy statistics back to the columns' units can leave the range of a double: the
    value and the interval's ends become infinite (as DuckDB's DOUBLE arithmetic does), rather
    than a charged QueryFailed or an error while printing (found by helper-31)."""
    import pandas as pd

    frame = pd.DataFrame({"uid": range(60), "x": [i % 3 for i in range(60)], "y": [(i * 7) % 6 - 2 for i in range(60)]})
    policy = ("BUDGET EPSILON 1000; PRIVATE TABLE t (PRIVACY UNIT uid, MAX ROWS PER UNIT 1, y BOUNDS -2 TO 3, "
              "x BOUNDS 0 TO 2);")
    with dpsql.connect({"t": frame}, policy=policy, rng=SeededSource(3)) as db:
        for run in range(2):
            result = db.sql(f"SELECT {expression} AS s FROM t WHERE {run} = {run}", epsilon=20)
            (value,), = result.fetchall()
            low, high = result.intervals()[["s_low", "s_high"]].iloc[0]
            assert value is None or isinstance(value, float)
            assert (math.isnan(low) and math.isnan(high)) or low <= high
            assert "s" in str(result)
