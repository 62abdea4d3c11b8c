"""Bias made visible (``dpsql.query.bias``): limits named on every answer, the charged bias report,
and its sensitivities checked by brute force."""

from __future__ import annotations

import math
from fractions import Fraction
from itertools import product

import pandas as pd
import pytest
import sqlglot
from sqlglot import exp

import dpsql
from dpsql.backends.bounding import DATABASE, copy_name, raw_rows_cap
from dpsql.query.bias import CAP, DROP_CAP, bias_sql, bias_statement, noisy_counts, release_bias
from dpsql.errors import BudgetExceeded, InvalidParameter, UnsupportedQuery
from dpsql.mechanisms.noise import SeededSource

POLICY = ("BUDGET EPSILON 1000; PRIVATE TABLE t (PRIVACY UNIT uid, MAX ROWS PER UNIT 2, MAX GROUPS PER UNIT 1, "
          "x BOUNDS 0 TO 10, g KEYS ('a', 'b')); PUBLIC TABLE p;")
QUERY = "SELECT SUM(x) AS s FROM t WHERE x < 40"
PUBLIC = pd.DataFrame({"g": ["a", "b"], "w": [1, 2]})


def frame(units: dict[int, tuple]) -> pd.DataFrame:
    """Rows of each unit: x values (group 'a'), or (x, group) pairs."""
    rows = [(uid, float(x[0]), x[1]) if isinstance(x, tuple) else (uid, float(x), "a")
            for uid, values in units.items() for x in values]
    return pd.DataFrame(rows or [(0, 0.0, "a")][:0], columns=["uid", "x", "g"]).astype({"uid": "int64", "x": "float64"})


def exact_counts(data: pd.DataFrame, sql: str = QUERY, policy: str = POLICY):
    """The bias plan of ``sql`` and its exact counts over ``data`` (what release_bias noises)."""
    with dpsql.connect({"t": data, "p": PUBLIC}, policy=policy) as db:
        tree, checked, written = db._check(sql)
        plan, bias = db._preparer.plan_with_bias(checked, sql, 1, None, None, None, True, written)
        counting = bias_statement(bias, plan.query)
        row = db._engine.fetch(counting.sql, db._executor.salt_for(counting.needs_salt), bounded=checked.bounded)[0]
        return bias, dict(zip([m.name for m in bias.measures], (int(v) for v in row)))


# -- limits ----------------------------------------------------------------------------------

def test_every_private_answer_names_its_limits_for_free():
    data = frame({1: (1, 2, 3), 2: (50,)})
    with dpsql.connect({"t": data, "p": PUBLIC}, policy=POLICY) as db:
        grouped = db.sql("SELECT g, SUM(x) AS s FROM t GROUP BY g", epsilon=1)
        assert str(grouped.limits) == ("at most 2 rows and 1 group per uid; x clamped to [0, 10]; rows with no uid belong to nobody and are never counted; not in the ±: "
                                       "dropped rows lower SUM(x), clamping can move it either way")
        plain = db.sql("SELECT COUNT(*) AS n FROM t", epsilon=1)
        assert str(plain.limits) == "at most 2 rows per uid; rows with no uid belong to nobody and are never counted; not in the ±: they can only lower COUNT(*)"
        averaged = db.sql("SELECT AVG(x) AS a, MEDIAN(x) AS m FROM t", epsilon=1)
        assert str(averaged.limits).endswith("not in the ±: they can move AVG(x) and MEDIAN(x) either way")
        lowered = db.sql("SELECT WITH DIFFERENTIAL_PRIVACY OPTIONS (max_rows_contributed = 1) COUNT(*) AS n FROM t",
                         epsilon=1)
        assert str(lowered.limits) == ("at most 1 row per uid; rows with no uid belong to nobody and are never counted; "
                                       "not in the ±: they can only lower COUNT(*)")
        assert grouped.bounding is None and "\nlimits: at most 2 rows" in repr(grouped)
        assert db.sql("SELECT * FROM p").limits is None
        text = db.explain("SELECT g, SUM(x) AS s FROM t GROUP BY g", epsilon=1)
        assert "limits: at most 2 rows and 1 group per uid; x clamped to [0, 10]" in text
        assert float(db.budget.spent.epsilon) == 4  # the limits cost nothing beyond the queries


def test_row_level_limits():
    data = pd.DataFrame({"x": [1.0, 2.0]})
    with dpsql.connect({"r": data}, policy="BUDGET EPSILON 9; PRIVATE TABLE r (PRIVACY UNIT ROW, x BOUNDS 0 TO 1);") as db:
        assert str(db.sql("SELECT SUM(x) AS s FROM r", epsilon=1).limits) == \
            "each row is its own unit; x clamped to [0, 1]; not in the ±: they can move SUM(x) either way"
        assert str(db.sql("SELECT COUNT(*) AS n FROM r", epsilon=1).limits) == "each row is its own unit"


# -- exact counts ----------------------------------------------------------------------------

def test_counts_by_hand():
    # unit 1: 5 rows, the copy keeps 2, all pass WHERE: kept 2, estimated dropped 5 - 2 = 3, capped at C = k = 2
    # unit 2: fails the WHERE entirely; unit 3: 2 rows both outside [0, 10]: kept 2, clamped 2
    bias, counts = exact_counts(frame({1: (1, 2, 3, 4, 5), 2: (50,), 3: (20, -1)}))
    assert counts == {"kept": 4, "dropped": 2, "clamped_0": 2}
    _, counts = exact_counts(frame({1: (1, 2, 3), 2: (50,), 3: (20, -1)}))
    assert counts == {"kept": 4, "dropped": 1, "clamped_0": 2}
    assert [(m.name, m.sensitivity) for m in bias.measures] == [("kept", 2), ("dropped", 2), ("clamped_0", 2)]


def test_dropped_rows_after_where_are_estimated_from_the_kept_sample():
    # 4 rows, all passing: the copy's 2 rows pass, so all 4 are estimated to pass: 2 dropped
    _, counts = exact_counts(frame({1: (1,) * 4}))
    assert counts["dropped"] == 2
    # 30 rows: 28 beyond the limit, but one unit adds at most C = k = 2
    _, counts = exact_counts(frame({1: (1,) * 30}))
    assert counts["dropped"] == CAP * 2
    # none pass the WHERE: the unit is not among the query's rows at all
    _, counts = exact_counts(frame({1: (50,) * 30}))
    assert counts == {"kept": 0, "dropped": 0, "clamped_0": 0}


def test_rows_beyond_the_group_limit_are_dropped_too():
    grouped = "SELECT g, COUNT(*) AS n FROM t WHERE x < 40 GROUP BY g"
    # two rows in two groups, MAX GROUPS PER UNIT 1: one kept, one dropped; one group: both kept
    _, counts = exact_counts(frame({1: ((1, "a"), (2, "b")), 2: ((1, "b"), (2, "b"))}), grouped)
    assert counts == {"kept": 3, "dropped": 1}
    # a key outside the domain is not among the query's rows
    _, counts = exact_counts(frame({1: ((1, "a"), (2, "zzz"))}), grouped)
    assert counts == {"kept": 1, "dropped": 0}


# -- the raw table is read once, when the copy is built -------------------------------------

def _dropped(r: int, w: int, kept: int, copy_k: int, k: int, cap: int = CAP) -> int:
    """One unit's dropped count as ``bias_sql`` computes it (c = min(r, K), t, then the cap C = cap·k)."""
    c = min(r, copy_k)
    total = w + ((r - c) * w) // c
    return min(max(total - kept, 0), cap * k)


def test_the_stored_row_count_cap_changes_no_dropped_count():
    """Every unit a report counts (w >= 1 rows after WHERE, kept <= min(w, k)), every raw row
    count r, every K and k <= K: r capped at raw_rows_cap(K) gives the dropped count r gives,
    for the report's C = CAP·k and for any C up to DROP_CAP·k; one row lower would not for
    C = DROP_CAP·k (the cap is the least that works for it)."""
    assert CAP <= DROP_CAP
    for copy_k in range(1, 6):
        cap = raw_rows_cap(copy_k)
        assert cap == copy_k * (1 + DROP_CAP * copy_k)
        for k in range(1, copy_k + 1):
            for r in [*range(1, 2 * cap + 2), 10**9]:
                for w in range(1, min(r, copy_k) + 1):
                    for kept in range(min(w, k) + 1):
                        for factor in (CAP, DROP_CAP):
                            assert _dropped(min(r, cap), w, kept, copy_k, k, factor) == \
                                _dropped(r, w, kept, copy_k, k, factor)
        assert _dropped(cap - 1, 1, 1, copy_k, copy_k, DROP_CAP) != _dropped(cap, 1, 1, copy_k, copy_k, DROP_CAP)


def _relations(sql: str) -> set[tuple[str, str]]:
    """(catalog, name) of every table ``sql`` reads, its own CTEs left out."""
    tree = sqlglot.parse_one(sql, read="duckdb")
    ctes = {cte.alias_or_name for cte in tree.find_all(exp.CTE)}
    return {(t.catalog, t.name) for t in tree.find_all(exp.Table) if t.catalog or t.name not in ctes}


@pytest.mark.parametrize("sql", [QUERY, "SELECT g, SUM(x) AS s FROM t WHERE x < 40 GROUP BY g",
                                 ("SELECT WITH DIFFERENTIAL_PRIVACY OPTIONS (max_rows_contributed = 1) COUNT(*) AS n "
                                  "FROM t")])
def test_the_report_reads_bounded_data_only(sql):
    """The bias SQL reads the copy and its row-count table, never the raw table ``t``."""
    with dpsql.connect({"t": frame({1: (1,) * 30, 2: (3, 50)}), "p": PUBLIC}, policy=POLICY) as db:
        _, checked, written = db._check(sql)
        plan, bias = db._preparer.plan_with_bias(checked, sql, 1, None, None, None, True, written)
        relations = _relations(bias_sql(bias, plan.query))
    assert relations and all(catalog == DATABASE for catalog, _ in relations), relations
    copy = copy_name(checked.bounded[0], db.policy.table(checked.bounded[0]))  # the backend names the copy
    assert checked.bounded == ("t",)
    assert {name for _, name in relations} == {copy, "dp_raw_rows_" + copy}


def test_one_units_raw_rows_do_not_reach_a_reported_query():
    """The attack at small scale: D0 and D1 differ in one unit's raw rows (2 or 5,000; K = 2).
    With the copies built at connect, every query with a bias report runs the same SQL in both,
    reading only bounded relations of equal size (so its time cannot tell them apart), and its
    exact counts are equal: that unit's dropped rows are capped at C either way."""
    policy = POLICY.replace("BUDGET EPSILON 1000;", "BUDGET EPSILON 1000; REPORT BIAS SHARE 0.1;")
    background = {u: (1 + u % 5,) * (1 + u % 3) for u in range(40)}
    runs = []
    for raw in (DROP_CAP * 2 + 2, 5000):
        data = frame({**background, -1: (3,) * raw})
        with dpsql.connect({"t": data, "p": PUBLIC}, policy=policy, eager_bounding=True) as db:
            fetched, fetch = [], db._engine.fetch

            def recording(sql, parameters=None, *, bounded=(), fetch=fetch, fetched=fetched):
                fetched.append(sql)
                return fetch(sql, parameters, bounded=bounded)

            db._engine.fetch = recording
            assert db.sql("SELECT COUNT(*) AS n FROM t WHERE x > -1", epsilon=1).bounding is not None
            db._engine.fetch = fetch
            relations = set().union(*(_relations(sql) for sql in fetched))
            assert relations and all(catalog == DATABASE for catalog, _ in relations), relations
            sizes = {name: db._engine.fetch(f'SELECT COUNT(*) FROM {DATABASE}.main."{name}"')[0][0]
                     for _, name in relations}
            _, checked, written = db._check(QUERY)
            plan, bias = db._preparer.plan_with_bias(checked, QUERY, 1, None, None, None, True, written)
            counting = bias_statement(bias, plan.query)
            counts = db._engine.fetch(counting.sql, db._executor.salt_for(counting.needs_salt), bounded=checked.bounded)[0]
        runs.append((fetched, sizes, counts))
    (sql0, sizes0, counts0), (sql1, sizes1, counts1) = runs
    assert sql0 == sql1 and sizes0 == sizes1
    assert counts0 == counts1 and counts0[1] >= CAP * 2  # unit -1 adds C = 2 dropped rows in both


# -- brute-force sensitivity -----------------------------------------------------------------

PROFILES = [(), (3,), (50,), (-1, 3), (3, 3, 3), (-1,) * 5, (3,) * 12, (20,) * 13, (50,) * 12 + (3,),
            (-1, 3, 50) * 4, (float("nan"), 3), (float("inf"), float("-inf"), 3),
            ((3, "b"), (3, "a")), ((20, "b"),) * 6 + ((3, "a"),) * 6, ((-1, "b"), (3, "zzz")) * 5]
BACKGROUND = {100: (3, -1), 101: (5,) * 7}


@pytest.mark.parametrize("sql, k", [(QUERY, 2),
                                    ("SELECT WITH DIFFERENTIAL_PRIVACY OPTIONS (max_rows_contributed = 1) "
                                     "SUM(x) AS s FROM t WHERE x < 40", 1),
                                    ("SELECT g, SUM(x) AS s FROM t WHERE x < 40 GROUP BY g", 2)])
@pytest.mark.parametrize("neighbours", ["UNBOUNDED", "BOUNDED"])
def test_no_unit_moves_a_count_beyond_its_sensitivity(sql, k, neighbours):
    """Every profile of one unit against every other (the empty profile: add or remove; any
    other: replace), with other units fixed: the largest change of each count is at most its
    analysed sensitivity, and reaches it."""
    policy = POLICY.replace("BUDGET EPSILON 1000;", f"BUDGET EPSILON 1000; NEIGHBOURS {neighbours};")
    results = []
    for profile in PROFILES:
        bias, counts = exact_counts(frame({**BACKGROUND, 1: profile}), sql, policy)
        results.append(counts)
    sensitivity = {m.name: m.sensitivity for m in bias.measures}
    assert sensitivity == {"kept": k, "dropped": CAP * k, "clamped_0": k}
    largest = {name: max(abs(a[name] - b[name]) for a, b in product(results, results)) for name in sensitivity}
    assert largest == sensitivity


UNIT_POLICY = POLICY.replace("x BOUNDS 0 TO 10,", "x BOUNDS 0 TO 10, x BOUNDS PER UNIT 0 TO 12,")


@pytest.mark.parametrize("sql", ["SELECT SUM(x) AS s FROM t WHERE x < 40",
                                 "SELECT g, SUM(x) AS s FROM t WHERE x < 40 GROUP BY g",
                                 "SELECT g, AVG(x, contribution_bounds_per_group => (1, 4)) AS a FROM t GROUP BY g"])
@pytest.mark.parametrize("neighbours", ["UNBOUNDED", "BOUNDED"])
def test_per_unit_clamp_counts_move_by_at_most_their_sensitivity(sql, neighbours):
    """Under the per-unit model the report also counts (unit, group) pairs and those whose total
    (or own average) lies outside the bound per unit: one unit moves each by at most l = 1 (one
    group per unit), and reaches it; the clamp's share shows up when units are clamped."""
    policy = UNIT_POLICY.replace("BUDGET EPSILON 1000;", f"BUDGET EPSILON 1000; NEIGHBOURS {neighbours};")
    results = []
    for profile in PROFILES:
        bias, counts = exact_counts(frame({**BACKGROUND, 1: profile}), sql, policy)
        results.append(counts)
    assert [c.average for c in bias.unit_clamps] == ["AVG" in sql]
    sensitivity = {m.name: m.sensitivity for m in bias.measures}
    assert sensitivity["groups"] == sensitivity["unit_clamped_0"] == 1
    largest = {name: max(abs(a[name] - b[name]) for a, b in product(results, results)) for name in sensitivity}
    assert largest == sensitivity
    _, clamped = exact_counts(frame({1: (10, 10), 2: (1,), 3: (5, 5)}), sql, policy)
    assert (clamped["groups"], clamped["unit_clamped_0"]) == (3, 2 if "AVG" in sql else 1)


# -- noise: scale, and the interval's coverage -----------------------------------------------

@pytest.mark.slow  # 12,000 draws; fast: the share and sensitivity tests above and below
def test_noise_has_the_scale_of_sensitivity_over_epsilon_share():
    _, counts = exact_counts(frame({1: (1, 2, 3, 4, 5), 3: (20, -1)}))
    with dpsql.connect({"t": frame({1: (1,)}), "p": PUBLIC}, policy=POLICY) as db:
        tree, checked, written = db._check(QUERY)
        _, bias = db._preparer.plan_with_bias(checked, QUERY, 1, None, None, None, 0.3, written)
    # epsilon 1, share 0.3 over three counts weighted 1, 2, 2: 0.06, 0.12, 0.12; k = C = 2
    expected = {"kept": 2 / 0.06, "dropped": 2 / 0.12, "clamped_0": 2 / 0.12}
    exact = {name: 10**6 for name in expected}
    source, draws = SeededSource(11), 4000
    deviations = {name: 0.0 for name in expected}
    for _ in range(draws):
        for name, value in noisy_counts(bias, exact, source).items():
            deviations[name] += abs(value - exact[name]) / draws
    for name, scale in expected.items():
        p = math.exp(-1 / scale)
        mean_absolute = 2 * p / (1 - p * p)  # E|Z| of the discrete Laplace with this scale
        # the mean of 4000 |Z| has relative sd ~1.6%: 15% is > 9 sd (fails < 1e-18); a factor 2 always fails
        assert 0.85 < deviations[name] / mean_absolute < 1.15, name


def test_the_interval_covers_the_true_share():
    # 400 units with 1..4 rows, k = 2, no WHERE: the exact dropped count (at most 2 = C per
    # unit) is the true one; x = 30 for every third unit: clamped to 10
    units = {u: (30 if u % 3 == 0 else 3,) * (1 + u % 4) for u in range(400)}
    data = frame(units)
    sizes = data.groupby("uid").size()
    true_dropped = (sizes - sizes.clip(upper=2)).sum() / sizes.sum()
    true_clamped = sizes.clip(upper=2)[sizes.index % 3 == 0].sum() / sizes.clip(upper=2).sum()
    bias, counts = exact_counts(data, "SELECT SUM(x) AS s FROM t")
    assert counts["dropped"] + counts["kept"] == sizes.sum()
    source, runs, covered = SeededSource(5), 400, {"dropped": 0, "clamped": 0}
    for _ in range(runs):
        report = release_bias(bias, counts, source)
        covered["dropped"] += abs(report.dropped.value - true_dropped) <= report.dropped.halfwidth
        covered["clamped"] += abs(report.clamped[0][1].value - true_clamped) <= report.clamped[0][1].halfwidth
    # each report covers with probability >= 95%: fewer than 89% of 400 (5.5 sd below 95%)
    # has probability < 1e-7
    assert covered["dropped"] / runs >= 0.89 and covered["clamped"] / runs >= 0.89


# -- the query surface: charging, options, policy --------------------------------------------

def test_report_takes_its_share_out_of_the_query_epsilon():
    data = frame({u: (3,) * (1 + u % 6) + (50,) for u in range(300)})
    with dpsql.connect({"t": data, "p": PUBLIC}, policy=POLICY, rng=SeededSource(2)) as db:
        result = db.sql(QUERY, epsilon=2, report_bias=0.25)
        assert result.cost.epsilon == 2 and db.budget.spent.epsilon == 2
        assert len(db.ledger()) == 1
        assert result.bounding.epsilon == Fraction(1, 2)
        assert 0 <= result.bounding.dropped.value <= 1 and result.bounding.clamped[0][0] == "x"
        assert "of rows beyond per-unit limits (at least)" in str(result.bounding)
        text = db.explain(QUERY, epsilon=2, report_bias=0.25)
        assert "bias report: 0.25 of the query's epsilon (0.5)" in text
        assert "m0: sum" in text and "epsilon 1.5" in text  # the aggregate gets the rest
        again = db.sql(QUERY, epsilon=2, report_bias=0.25)  # a repeat: the same report, free
        assert again.repeat and again.bounding == result.bounding and db.budget.spent.epsilon == 2
        different = db.sql(QUERY, epsilon=2)  # without the report: a different query, charged
        assert different.bounding is None and db.budget.spent.epsilon == 4


def test_report_is_refused_over_budget_before_anything_is_charged():
    with dpsql.connect({"t": frame({1: (1,)}), "p": PUBLIC},
                       policy=POLICY.replace("EPSILON 1000", "EPSILON 1")) as db:
        with pytest.raises(BudgetExceeded):
            db.sql(QUERY, epsilon=2, report_bias=True)
        assert db.budget.spent.epsilon == 0


def test_option_in_sql_and_argument_agree_or_are_refused():
    with dpsql.connect({"t": frame({1: (1,)}), "p": PUBLIC}, policy=POLICY, rng=SeededSource(1)) as db:
        sql = "SELECT WITH DIFFERENTIAL_PRIVACY OPTIONS (report_bias = 0.1) COUNT(*) AS n FROM t"
        assert db.sql(sql, epsilon=1).bounding.epsilon == Fraction(1, 10)
        with pytest.raises(InvalidParameter, match="report_bias is given twice"):
            db.sql(sql, epsilon=1, report_bias=0.2)
        with pytest.raises(InvalidParameter, match="report_bias must be"):
            db.sql("SELECT COUNT(*) AS n FROM t", epsilon=1, report_bias=1.5)


def test_policy_share_reports_on_every_query_that_can_have_one():
    policy = POLICY.replace("BUDGET EPSILON 1000;", "BUDGET EPSILON 1000; REPORT BIAS SHARE 0.1;")
    joined = "SELECT COUNT(*) AS n FROM t JOIN p ON t.g = p.g"
    with dpsql.connect({"t": frame({1: (1,), 2: (2, 3, 4)}), "p": PUBLIC}, policy=policy, rng=SeededSource(3)) as db:
        assert db.sql("SELECT COUNT(*) AS n FROM t", epsilon=1).bounding.epsilon == Fraction(1, 10)
        assert db.sql("SELECT COUNT(*) AS n FROM t WHERE x > 0", epsilon=1, report_bias=False).bounding is None
        assert db.sql(joined, epsilon=1).bounding is None  # a join: no report, the whole epsilon to COUNT
        spent = db.budget.spent.epsilon
        with pytest.raises(UnsupportedQuery, match="needs a query that reads one private table directly"):
            db.sql(joined + " WHERE x > 1", epsilon=1, report_bias=True)
        assert db.budget.spent.epsilon == spent  # refused before the charge


def test_shell_and_cli_footers_show_limits_and_bias():
    from dpsql.shell.render import answer_from, bias_lines

    with dpsql.connect({"t": frame({1: (1, 2, 3), 2: (4,)}), "p": PUBLIC}, policy=POLICY, rng=SeededSource(4)) as db:
        footer = bias_lines(answer_from(db.sql(QUERY, epsilon=1, report_bias=0.2)))
    lines = footer.splitlines()
    assert lines[0] == ("limits: at most 2 rows per uid; x clamped to [0, 10]; rows with no uid belong to nobody and are never counted; not in the ±: dropped rows lower "
                        "SUM(x), clamping can move it either way")
    assert lines[1].startswith("bias: ≈ ") and "of x values clamped" in lines[1]


def test_kept_is_what_the_query_itself_counts():
    """kept = the exact total of the query's own bounded COUNT(*), groups limited by the same salted order."""
    from dpsql.backends.rewrite import rewrite_statement

    units = {u: tuple((u % 7 + i, "ab"[(u + i) % 2]) for i in range(1 + u % 5)) for u in range(60)}
    sql = "SELECT g, COUNT(*) AS n FROM t WHERE x < 8 GROUP BY g"
    with dpsql.connect({"t": frame(units), "p": PUBLIC}, policy=POLICY) as db:
        tree, checked, written = db._check(sql)
        plan, bias = db._preparer.plan_with_bias(checked, sql, 1, None, None, None, True, written)
        counting, bounded = bias_statement(bias, plan.query), rewrite_statement(plan)
        kept = db._engine.fetch(counting.sql, db._executor.salt_for(counting.needs_salt), bounded=checked.bounded)[0][0]
        exact = db._engine.fetch(bounded.sql, db._executor.salt_for(bounded.needs_salt), bounded=checked.bounded)
    assert kept == sum(row[1] for row in exact) and 0 < kept


def test_policy_setting_round_trips_and_is_checked():
    from dpsql.errors import PolicyError
    from dpsql.policy.check import validate_policy
    from dpsql.policy.language import parse_policy, policy_to_text
    from dpsql.policy.model import Policy

    policy = parse_policy("BUDGET EPSILON 1;\nreport bias share 0.05;")
    assert policy.bias_share == Fraction(1, 20) and "REPORT BIAS SHARE 0.05;" in policy_to_text(policy)
    assert parse_policy(policy_to_text(policy)) == policy
    with pytest.raises(PolicyError, match=r"REPORT BIAS SHARE must be above 0 and below 1, not 1 \(line 2, column 19\)"):
        parse_policy("BUDGET EPSILON 1;\nREPORT BIAS SHARE 1;")
    with pytest.raises(PolicyError, match="REPORT BIAS is given twice"):
        parse_policy("BUDGET EPSILON 1; REPORT BIAS SHARE 0.1; REPORT BIAS SHARE 0.2;")
    with pytest.raises(PolicyError, match="REPORT BIAS SHARE must be above 0"):
        validate_policy(Policy(Fraction(1), bias_share=Fraction(0)))


def test_cli_query_and_explain_with_report_bias(tmp_path, capsys):
    import duckdb

    from dpsql import cli

    database = tmp_path / "d.duckdb"
    connection = duckdb.connect(str(database))
    connection.register("frame", frame({u: (3,) * (1 + u % 6) for u in range(100)}))
    connection.execute("CREATE TABLE t AS SELECT * FROM frame")
    connection.register("public", PUBLIC)
    connection.execute("CREATE TABLE p AS SELECT * FROM public")
    connection.close()
    policy = tmp_path / "t.policy"
    policy.write_text(POLICY, encoding="utf-8")
    code = cli.main(["query", str(database), QUERY, "--policy", str(policy), "--epsilon", "1", "--report-bias", "0.3"])
    out, err = capsys.readouterr()
    assert code == 0, err
    assert "limits: at most 2 rows per uid; x clamped to [0, 10]" in err
    assert "bias: ≈ " in err and "of rows beyond per-unit limits (at least)" in err
    code = cli.main(["explain", str(database), QUERY, "--policy", str(policy), "--epsilon", "1", "--report-bias", "0.3"])
    out, err = capsys.readouterr()
    assert code == 0 and "bias report: 0.3 of the query's epsilon (0.3)" in out and "bias SQL:" in out


def test_refusal_names_the_option_where_it_was_written():
    with dpsql.connect({"t": frame({1: (1,)}), "p": PUBLIC}, policy=POLICY) as db:
        with pytest.raises(UnsupportedQuery) as refused:
            db.sql("SELECT WITH DIFFERENTIAL_PRIVACY OPTIONS (report_bias = true) COUNT(*) AS n\n"
                   "FROM t JOIN p ON t.g = p.g", epsilon=1)
        assert (refused.value.line, refused.value.col) == (1, 43) and "drop report_bias" in str(refused.value)
        assert db.budget.spent.epsilon == 0


@pytest.mark.parametrize("options", [{"report_bias": "1e-11"}, {"report_bias": 1e-11, "epsilon": 0.5}])
def test_a_bias_share_too_small_to_sample_is_refused_before_the_charge(options):
    """The report's counts get share * epsilon; a share so small their noise is beyond the exact
    sampler is refused by explain and sql alike, before anything is charged (it used to be
    charged and then fail)."""
    import pandas as pd

    frame = pd.DataFrame({"user_id": range(300), "amount": [i % 100 for i in range(300)]})
    policy = "BUDGET EPSILON 10; PRIVATE TABLE visits (PRIVACY UNIT user_id, MAX ROWS PER UNIT 10, amount BOUNDS 0 TO 100);"
    with dpsql.connect({"visits": frame}, policy=policy) as db:
        arguments = {"epsilon": 1, **options}
        for ask in (db.explain, db.sql):
            with pytest.raises(dpsql.InvalidParameter, match="bias report's epsilon .* is too small"):
                ask("SELECT COUNT(*) AS n FROM visits", **arguments)
        assert db.budget.spent.epsilon == 0
        db.sql("SELECT COUNT(*) AS n FROM visits", epsilon=1, report_bias=0.05)  # a sampleable share: answered


@pytest.mark.parametrize("written, argument", [("OPTIONS (report_bias = 0.999999999999) ", None),
                                               ("", 0.9999999999999999)])
def test_a_bias_share_that_leaves_the_aggregates_too_little_is_refused_by_its_name(written, argument):
    """A share just below 1 is in range, but leaves the aggregates (1 - share) * epsilon: when
    that is too small for their noise, the refusal names report_bias and the share, not an
    epsilon the analyst never wrote; before the charge. A share that leaves enough is answered."""
    with dpsql.connect({"t": frame({1: (1,), 2: (3,)}), "p": PUBLIC}, policy=POLICY) as db:
        sql = f"SELECT WITH DIFFERENTIAL_PRIVACY {written}SUM(x) AS s FROM t"
        for ask in (db.explain, db.sql):
            with pytest.raises(InvalidParameter, match=r"report_bias 0\.99999.* leaves the aggregates 1e-1\d: "
                                                       r"too small") as refused:
                ask(sql, epsilon=1, report_bias=argument)
            assert "report_bias=0.05" in refused.value.hint and "below 1" in refused.value.hint
            assert (refused.value.line, refused.value.col) == ((1, 43) if written else (None, None))
        assert db.budget.spent.epsilon == 0
        with pytest.raises(InvalidParameter, match="epsilon 1e-13 is below 1e-12"):  # the epsilon's own fault
            db.sql("SELECT SUM(x) AS s FROM t", epsilon=1e-13, report_bias=0.5)
        assert db.sql("SELECT SUM(x) AS s FROM t", epsilon=1, report_bias=0.9999).cost.epsilon == 1
