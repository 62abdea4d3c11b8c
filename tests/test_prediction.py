"""Accuracy known before the charge (issue 37, item 3): each output's predicted 95% ± in its own
units (``dpsql.query.prediction``, ``AggregateFamily.predicted_half_width``), shown by EXPLAIN,
and ``max_error`` refusing a query before anything is charged, on every surface.

The predictions of COUNT and SUM are checked against the noise law computed here independently
(the discrete Laplace's and discrete Gaussian's own tails), and statistically against releases:
the share of released values farther than the predicted ± from the truth must be near 5% (a
prediction twice too wide or too narrow fails every time; a correct one fails with probability
below 1e-6).
"""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pandas as pd
import pytest
from cli_run import run

import dpsql
from dpsql.analysis.aggregates.registry import family_of
from dpsql.demo import SHOP_POLICY
from dpsql.mechanisms.noise import SeededSource
from dpsql.query.prediction import ALPHA, accuracy_goal, amount, needed_count, predict_outputs
from dpsql.shell.session import handle_input
from dpsql.shell.state import new_state

GROUPS = [f"k{i:03d}" for i in range(100)]
POLICY = f"""BUDGET EPSILON 1000 DELTA 1e-3;
PRIVATE TABLE t (PRIVACY UNIT uid, MAX ROWS PER UNIT 4, MAX GROUPS PER UNIT 2,
    x BOUNDS 0 TO 100, y BOUNDS -50 TO 50, g KEYS ({', '.join(repr(k) for k in GROUPS)}));"""


def frame(units: int = 6000, seed: int = 7) -> pd.DataFrame:
    """Each unit has at most 4 rows in at most 2 groups, so the contribution limits drop nothing
    and the bounded truth is the raw truth; x and y are whole numbers within their bounds."""
    rng = np.random.default_rng(seed)
    rows = []
    for uid in range(units):
        groups = rng.choice(GROUPS, size=2, replace=False)
        for r in range(int(rng.integers(1, 5))):
            rows.append((uid, groups[r % 2], int(rng.integers(0, 101)), int(rng.integers(-50, 51))))
    return pd.DataFrame(rows, columns=["uid", "g", "x", "y"])


DATA = frame()


@pytest.fixture
def db():
    with dpsql.connect({"t": DATA}, policy=POLICY, rng=SeededSource(11)) as connection:
        yield connection


def plan_of(db, sql: str, epsilon, **options):
    return db._prepare(sql, epsilon, options.get("delta"), options.get("noise")).plan


def laplace_half_width(scale: Fraction, alpha: float = ALPHA) -> int:
    """Smallest m with P(|Z| > m) <= alpha for the discrete Laplace of ``scale``: P(|Z| > m) =
    2 p^(m+1) / (1 + p), p = exp(-1/scale), summed here term by term from the pmf."""
    p = math.exp(-1 / float(scale))
    norm = (1 - p) / (1 + p)
    inside, m = norm, 0  # P(|Z| <= 0)
    while 1 - inside > alpha:
        m += 1
        inside += 2 * norm * p**m
    return m


def gaussian_half_width(sigma_sq: Fraction, alpha: float = ALPHA) -> int:
    """The same for the discrete Gaussian of variance parameter ``sigma_sq``, from its pmf."""
    sigma = math.sqrt(float(sigma_sq))
    z = np.arange(0, int(60 * sigma) + 10)
    weights = np.exp(-z.astype(float) ** 2 / (2 * float(sigma_sq)))
    total = weights[0] + 2 * weights[1:].sum()
    inside = np.cumsum(np.where(z == 0, weights, 2 * weights)) / total
    return int(np.argmax(inside >= 1 - alpha))


# -- the prediction equals the noise law, analytically --------------------------------------------

@pytest.mark.parametrize("epsilon", [0.05, 0.5, 3])
def test_count_and_sum_predictions_are_their_noises_own_95_percent_half_width_times_the_grid(db, epsilon):
    plan = plan_of(db, "SELECT g, COUNT(*) AS n, SUM(x) AS s, SUM(y) AS sy FROM t GROUP BY g", epsilon)
    predicted = {p.output: p for p in predict_outputs(plan)}
    for output, name in (("n", "a0"), ("s", "a1"), ("sy", "a2")):
        aggregate = next(a for a in plan.aggregates if a.name == name)
        measure = plan.measure(aggregate.measures[0])
        assert measure.noise == "laplace"
        expected = laplace_half_width(measure.scale) * measure.grid
        assert predicted[output].half_width == float(expected)
        assert not predicted[output].counted


def test_gaussian_predictions_follow_the_discrete_gaussian(db):
    plan = plan_of(db, "SELECT g, COUNT(*) AS n, SUM(x) AS s FROM t GROUP BY g", 1, delta=1e-6, noise="gaussian")
    for prediction, aggregate in zip(predict_outputs(plan), plan.aggregates):
        measure = plan.measure(aggregate.measures[0])
        assert measure.noise == "gaussian"
        assert prediction.half_width == float(gaussian_half_width(measure.scale) * measure.grid)


def test_the_prediction_is_the_half_width_the_answer_states(db):
    sql = "SELECT g, COUNT(*) AS n, SUM(x) AS s FROM t GROUP BY g"
    predicted = {p.output: p.half_width for p in predict_outputs(plan_of(db, sql, 0.7))}
    result = db.sql(sql, epsilon=0.7)
    stated = result.accuracy()
    for output in ("n", "s"):
        widths = set(np.atleast_1d(stated[output]).tolist())
        assert widths == {predicted[output]} or max(widths) <= predicted[output]  # a floored count may cut it


def test_avg_prediction_is_its_ratio_law_at_each_count(db):
    """AVG's ± at a group of n values follows its interval's law (``intervals.ratio_interval``: the
    test of S' - r C' inverted, the two noises convolved): at least the sum's own noise half-width
    h_S / n (convolving a symmetric unimodal noise only widens it) and at most the union bound
    (h_S + h_C (U - L) / 2) / n with each at alpha/2 (h_S worth grid/2 a step)."""
    plan = plan_of(db, "SELECT g, AVG(x) AS m FROM t GROUP BY g", 0.5)
    aggregate = plan.aggregates[0]
    centred, count = (plan.measure(m) for m in aggregate.measures)
    h_sum = laplace_half_width(centred.scale, ALPHA / 2) * centred.grid / 2
    h_count = laplace_half_width(count.scale, ALPHA / 2)
    h_alone = laplace_half_width(centred.scale, ALPHA) * centred.grid / 2
    family, measures = family_of(aggregate), [centred, count]
    for n in (10**4, 10**5, 10**6):
        predicted = family.predicted_half_width(aggregate, measures, ALPHA, n)
        assert float(h_alone / n) * (1 - 1e-9) <= predicted <= float((h_sum + 50 * h_count) / n) * (1 + 1e-9)
        # it scales as 1/n: the law, not a constant
        assert family.predicted_half_width(aggregate, measures, ALPHA, 10 * n) == pytest.approx(predicted / 10,
                                                                                               rel=0.05)
    assert family.predicted_half_width(aggregate, measures, ALPHA, 1) == 50.0  # cut to [0, 100] around 50
    assert family.predicted_half_width(aggregate, measures, ALPHA) is None  # no count: no number
    prediction = predict_outputs(plan)[0]
    assert prediction.counted and prediction.half_width is None and len(prediction.curve) == 3
    assert [n for n, _ in prediction.curve] == sorted(n for n, _ in prediction.curve)


def test_variance_stddev_and_covariance_are_functions_of_the_count_and_corr_is_not_predicted(db):
    sql = ("SELECT g, VARIANCE(x) AS v, STDDEV(x) AS sd, COVAR_POP(x, y) AS c, CORR(x, y) AS r, "
           "REGR_SLOPE(y, x) AS b, MEDIAN(x) AS med, SUM(x) / COUNT(*) AS q FROM t GROUP BY g")
    predicted = {p.output: p for p in predict_outputs(plan_of(db, sql, 1), accuracy_goal({}, 5, 20000))}
    v, sd, c = predicted["v"], predicted["sd"], predicted["c"]
    assert v.counted and sd.counted and c.counted
    assert sd.half_width == pytest.approx(math.sqrt(v.half_width))  # STDDEV's ± is the root of VARIANCE's
    for p in (v, sd, c):
        ends = [h for _, h in p.curve]
        assert ends == sorted(ends, reverse=True) and ends[0] > ends[-1]  # shrinks as the count grows
    for output in ("r", "b", "med", "q"):
        assert predicted[output].half_width is None and predicted[output].reason


def test_needed_count_is_the_smallest_count_within_max_error():
    law = lambda n: min(100.0, 7e5 / n)  # noqa: E731
    n = needed_count(law, 5.0)
    assert law(n) <= 5.0 < law(n - 1)
    assert amount(1234567.0) == "1,230,000" and amount(0.0123) == "0.0123"


# -- the prediction holds on releases (statistical) -----------------------------------------------

def outside_share(db, sql: str, truth: dict, output: str, epsilons, scale: float = 1.0) -> tuple[float, int]:
    """Share of released cells farther from the truth than ``scale`` × the predicted ±."""
    outside = total = 0
    for epsilon in epsilons:  # a new epsilon is a new release (no free repeat)
        half = next(p for p in predict_outputs(plan_of(db, sql, epsilon)) if p.output == output).half_width
        for key, value in db.sql(sql, epsilon=epsilon).fetchall():
            outside += abs(value - truth[key]) > scale * half
            total += 1
    return outside / total, total


@pytest.mark.parametrize("sql, column", [("SELECT g, COUNT(*) AS v FROM t GROUP BY g", None),
                                         ("SELECT g, SUM(y) AS v FROM t GROUP BY g", "y")])
def test_released_values_fall_outside_the_predicted_half_width_about_5_percent_of_the_time(db, sql, column):
    """4,000 cells (100 groups × 40 epsilons). For a correct 95% half-width of discrete noise the
    share outside lies in [0.04, 0.05] (a half-width is the smallest integer meeting 5%), and 0.075
    is 7 standard deviations (0.0034) above: probability below 1e-11. A half-width twice too wide
    leaves about 0.25% outside, twice too narrow about 22% (Laplace tails: 0.05^2, 0.05^(1/2)),
    both far out of [0.025, 0.075]."""
    truth = DATA.groupby("g").size() if column is None else DATA.groupby("g")[column].sum()
    truth = truth.reindex(GROUPS, fill_value=0).to_dict()
    epsilons = [Fraction(1, 2) + Fraction(i, 100) for i in range(40)]
    share, total = outside_share(db, sql, truth, "v", epsilons)
    assert total == 4000
    assert 0.025 <= share <= 0.075, share
    # The same check fails a prediction off by a factor of 2 either way.
    wide, _ = outside_share(db, sql, truth, "v", epsilons, scale=2.0)
    narrow, _ = outside_share(db, sql, truth, "v", epsilons, scale=0.5)
    assert not 0.025 <= wide <= 0.075 and not 0.025 <= narrow <= 0.075, (wide, narrow)


# -- max_error refuses before the charge: the Python API and SQL ----------------------------------

def charged(db) -> tuple[float, int]:
    return float(db.budget.spent.epsilon), len(db.ledger())


def test_max_error_refuses_a_too_wide_count_before_anything_is_charged(db):
    before = charged(db)
    with pytest.raises(dpsql.TooInaccurate) as refused:
        db.sql("SELECT g, COUNT(*) AS n FROM t GROUP BY g", epsilon=0.1, max_error=5)
    message = str(refused.value)
    assert "n = COUNT(*)" in message and "max_error 5" in message and "nothing was charged" in message
    assert "raise epsilon" in message and "narrow the bounds" in message and "group more coarsely" in message
    assert charged(db) == before
    assert isinstance(refused.value, dpsql.UnsupportedQuery)


def test_max_error_written_in_the_sql_is_refused_at_its_position_and_a_wide_enough_one_answers(db):
    sql = "SELECT WITH DIFFERENTIAL_PRIVACY OPTIONS (epsilon = 0.1, max_error = 5) g, COUNT(*) AS n FROM t GROUP BY g"
    before = charged(db)
    with pytest.raises(dpsql.TooInaccurate) as refused:
        db.sql(sql)
    assert (refused.value.line, refused.value.col) == (1, 58)
    assert charged(db) == before
    half = predict_outputs(plan_of(db, "SELECT g, COUNT(*) AS n FROM t GROUP BY g", 0.1))[0].half_width
    answered = db.sql(sql.replace("max_error = 5", f"max_error = {half}"))
    assert len(answered) == 100 and charged(db)[0] == pytest.approx(before[0] + 0.1)


def test_a_ratio_is_judged_at_the_stated_count_and_refused_without_one(db):
    sql = "SELECT g, AVG(x) AS m FROM t GROUP BY g"
    before = charged(db)
    with pytest.raises(dpsql.TooInaccurate) as unknown:
        db.sql(sql, epsilon=1, max_error=5)
    assert "depends on how many values a group holds" in str(unknown.value)
    assert "expected_rows" in str(unknown.value) and "a group needs at least" in str(unknown.value)
    with pytest.raises(dpsql.TooInaccurate) as wide:
        db.sql(sql, epsilon=1, max_error=5, expected_rows=100)
    assert "at n = 100 values in a group" in str(wide.value)
    assert charged(db) == before
    needed = predict_outputs(plan_of(db, sql, 1), accuracy_goal({}, 5)).pop().needed
    db.sql(sql, epsilon=1, max_error=5, expected_rows=needed)  # judged within: answered and charged
    assert charged(db)[0] == pytest.approx(before[0] + 1)


def test_a_ratios_prediction_is_cut_to_half_the_possible_range_as_its_interval_is(db):
    # AVG(x), x in [0, 100]: its interval is cut to [0, 100], so no ± exceeds 50 whatever the count.
    plan = plan_of(db, AVG, 1)
    at_one = family_of(plan.aggregates[0]).predicted_half_width(
        plan.aggregates[0], [plan.measure(m) for m in plan.aggregates[0].measures], ALPHA, 1)
    assert at_one <= 100  # the law at n = 1, within the bounds' width
    prediction = predict_outputs(plan, accuracy_goal({}, None, 1))[0]
    assert prediction.half_width == 50 and all(h <= 50 for _, h in prediction.curve)
    assert predict_outputs(plan, accuracy_goal({}, None, 10**6))[0].half_width < 1  # below the cut: the law's
    before = charged(db)
    assert "every output it can judge is within it" in db.explain(AVG, epsilon=1, max_error=60)
    db.sql(AVG, epsilon=1, max_error=60)  # no count needed: none can exceed 50
    db.sql(AVG, epsilon=2, max_error=50, expected_rows=1)
    assert charged(db)[0] == pytest.approx(before[0] + 3)
    with pytest.raises(dpsql.TooInaccurate, match="depends on how many values a group holds"):
        db.sql(AVG, epsilon=1, max_error=49)


def test_a_released_count_below_one_is_named_in_the_refusal_not_called_private(db):
    from dpsql.query.known_counts import KnownCount
    from dpsql.query.prediction import accuracy_refusal

    goal = accuracy_goal({}, 5)
    plan = plan_of(db, AVG, 1)
    known = {"a0": KnownCount(0, ("k007",), 3, "SELECT g, COUNT(x) FROM t GROUP BY g")}
    message = accuracy_refusal(predict_outputs(plan, goal, known), goal, plan.epsilon).message
    assert "private until released" not in message
    assert "your answer #3 released 0 for k007" in message and "a group needs at least" in message
    unknown = accuracy_refusal(predict_outputs(plan, goal), goal, plan.epsilon).message
    assert "private until released" in unknown


def test_outputs_with_no_prediction_are_not_judged(db):
    db.sql("SELECT g, CORR(x, y) AS r, MEDIAN(x) AS med FROM t GROUP BY g", epsilon=1, max_error=0.001)
    text = db.explain("SELECT g, CORR(x, y) AS r FROM t GROUP BY g", epsilon=1, max_error=0.001)
    assert "every output it can judge is within it" in text


def test_max_error_and_expected_rows_are_checked_and_given_once(db):
    for bad in ({"max_error": 0}, {"max_error": -1}, {"max_error": float("nan")}, {"expected_rows": 0},
                {"expected_rows": 2.5}):
        with pytest.raises(dpsql.InvalidParameter):
            db.sql("SELECT COUNT(*) FROM t", epsilon=1, **bad)
    with pytest.raises(dpsql.InvalidParameter, match="given twice"):
        db.sql("SELECT WITH DIFFERENTIAL_PRIVACY OPTIONS (max_error = 5) COUNT(*) FROM t", epsilon=1, max_error=6)
    with pytest.raises(dpsql.UnsupportedQuery, match="expected_rows"):
        db.sql("SELECT WITH DIFFERENTIAL_PRIVACY OPTIONS (expected_rows = 2.5) COUNT(*) FROM t", epsilon=1)
    assert charged(db) == (0.0, 0)


def test_explain_states_each_outputs_plus_minus_in_its_own_units_and_what_max_error_would_do(db):
    sql = "SELECT g, COUNT(*) AS n, AVG(x) AS m, SUM(x) / COUNT(*) AS q FROM t GROUP BY g"
    plan = plan_of(db, sql, 0.5)
    count = predict_outputs(plan)[0].half_width
    text = db.explain(sql, epsilon=0.5, max_error=3, expected_rows=1000)
    section = text.split("accuracy before the charge", 1)[1].split("\n\n", 1)[0]
    assert f"n = COUNT(*): ± {amount(count)} (the same for every group" in section
    assert "m = AVG(x): ± " in section and "at n = 1,000 (expected_rows)" in section
    assert "within ± 3 from n = " in section
    assert "q = SUM(x) / COUNT(*): no ± before the charge" in section
    assert "max_error 3: the query would be refused: n = COUNT(*)" in section
    assert charged(db) == (0.0, 0)


# -- every surface: the shell, the CLI, the server --------------------------------------------------

WIDE = "SELECT plan, COUNT(*) AS users FROM users GROUP BY plan"


def test_the_shell_max_error_refuses_before_the_charge_and_explain_shows_the_prediction(built):
    with dpsql.connect(str(built), policy=SHOP_POLICY, ledger=":memory:") as db:
        state = new_state(db, width=100, color=False)
        assert "wider than 0.5" in handle_input(state, ".max_error 0.5")
        out = handle_input(state, WIDE + ";")
        assert "users = COUNT(*) would be released with a predicted 95% ±" in out and "nothing was charged" in out
        assert float(db.budget.spent.epsilon) == 0
        assert "accuracy before the charge" in handle_input(state, ".explain " + WIDE)
        assert "ratios judged at 100 values" in handle_input(state, ".max_error 0.5 100")
        assert "no max_error" in handle_input(state, ".max_error off")
        assert "±" in handle_input(state, WIDE + ";") and float(db.budget.spent.epsilon) > 0


def test_the_cli_refuses_with_max_error_and_explains_the_prediction(built, tmp_path, capsys):
    database = tmp_path / "shop.duckdb"
    database.write_bytes(built.read_bytes())
    policy = tmp_path / "shop.policy"
    policy.write_text(SHOP_POLICY)
    code, out, err = run(capsys, "query", str(database), WIDE, "--policy", str(policy), "--max-error", "0.5")
    assert code == 2 and "would be released with a predicted 95% ±" in err and out == ""
    assert sorted(p.name for p in tmp_path.iterdir()) == ["shop.duckdb", "shop.policy"]  # not even a ledger made
    code, out, _ = run(capsys, "explain", str(database), WIDE, "--policy", str(policy), "--max-error", "0.5")
    assert code == 2 and "the query would be refused: users = COUNT(*)" in out  # shown, and the exit says so
    code, out, err = run(capsys, "query", str(database), "SELECT AVG(age) AS a FROM visits", "--policy", str(policy),
                         "--max-error", "1")
    assert code == 2 and "--expected-rows" in err
    with dpsql.connect(str(database), policy=SHOP_POLICY) as db:
        assert float(db.budget.spent.epsilon) == 0
    code, out, _ = run(capsys, "explain", str(database), "SELECT AVG(age) AS a FROM visits", "--policy",
                       str(policy), "--max-error", "100", "--expected-rows", "500")
    assert code == 0 and "a = AVG(age): ± " in out and "at n = 500 (expected_rows)" in out
    assert "every output it can judge is within it" in out


def test_the_server_refuses_with_max_error_before_the_charge_and_explain_shows_the_prediction(built, tmp_path):
    psycopg = pytest.importorskip("psycopg")
    from served import serve_shop

    server = serve_shop(built, tmp_path, SHOP_POLICY, "alice", "alice-secret")
    try:
        with psycopg.connect(host="127.0.0.1", port=server.port, dbname="shop", user="alice",
                             password="alice-secret", connect_timeout=5, autocommit=True) as connection:
            budget = connection.execute("SHOW budget").fetchall()
            refused = WIDE.replace("SELECT", "SELECT WITH DIFFERENTIAL_PRIVACY OPTIONS (max_error = 0.5)", 1)
            with pytest.raises(psycopg.Error) as error:
                connection.execute(refused)
            assert "predicted 95% ±" in str(error.value) and "nothing was charged" in str(error.value)
            assert error.value.sqlstate == "0A000"
            assert connection.execute("SHOW budget").fetchall() == budget
            plan = [row[0] for row in connection.execute("EXPLAIN " + refused).fetchall()]
            assert any(line.startswith("accuracy before the charge") for line in plan)
            assert any("users = COUNT(*): ± " in line for line in plan)
            assert any("the query would be refused" in line for line in plan)
            assert connection.execute("SHOW budget").fetchall() == budget
    finally:
        server.stop()
        server.thread.join(10)


# -- a count already released to the analyst states a ratio's ± for free --------------------------

AVG = "SELECT g, AVG(x) AS m FROM t GROUP BY g"


def test_a_released_count_of_the_same_values_states_the_ratios_plus_minus_and_max_error_judges_it(db):
    alice, bob = db.acting_for("alice"), db.acting_for("bob")
    bob.sql("SELECT g, COUNT(*) AS n FROM t GROUP BY g", epsilon=1)  # not alice's: never read for her
    bob.sql("SELECT g, COUNT(x) AS n FROM t GROUP BY g", epsilon=1)
    assert "your answer" not in alice.explain(AVG, epsilon=1)
    released = alice.sql("SELECT g AS grp, COUNT(x) AS n FROM t GROUP BY g ORDER BY n", epsilon=1).fetchall()
    smallest = min(n for _, n in released)
    plan = plan_of(alice, AVG, 1)
    at_smallest = predict_outputs(plan, accuracy_goal({}, None, smallest))[0].half_width
    text = alice.explain(AVG, epsilon=1)
    assert f"± {amount(at_smallest)} at n = {smallest:,} (the smallest count of its values your answer #1 " \
           "released, for k" in text  # numbered among alice's own answers, not the ledger's ids
    spent = charged(db)
    with pytest.raises(dpsql.TooInaccurate, match=f"at n = {smallest:,} values in a group"):
        alice.sql(AVG, epsilon=1, max_error=at_smallest / 2)
    assert charged(db) == spent
    alice.sql(AVG, epsilon=1, max_error=at_smallest)  # within it: answered
    assert charged(db)[0] == pytest.approx(spent[0] + 1)


@pytest.mark.parametrize("count", [
    "SELECT g, COUNT(x) AS n FROM t GROUP BY g ORDER BY n LIMIT 50",  # rows cut: the smallest may be gone
    "SELECT g, COUNT(x) AS n FROM t GROUP BY g HAVING COUNT(x) > 200",
    "SELECT g, COUNT(x) AS n FROM t WHERE y > 0 GROUP BY g",  # other rows
    "SELECT g, COUNT(y) AS n FROM t GROUP BY g",  # other values
    "SELECT COUNT(x) AS n FROM t",  # other groups
    "SELECT g, COUNT(x) + 0 AS n FROM t GROUP BY g",  # an expression of it
])
def test_a_count_of_other_rows_values_or_groups_is_not_used(db, count):
    db.sql(count, epsilon=1)
    assert "your answer" not in db.explain(AVG, epsilon=1)
    with pytest.raises(dpsql.TooInaccurate, match="depends on how many values a group holds"):
        db.sql(AVG, epsilon=1, max_error=5)


@pytest.mark.parametrize("where", ["y > 0", "0 < y", "(y > 0)"])
def test_a_count_under_the_same_where_written_otherwise_is_used(db, where):
    # The ledger keeps the normalised SQL (``0 < y``): both WHEREs are compared in that normal form.
    db.sql("SELECT g, COUNT(x) AS n FROM t WHERE y > 0 GROUP BY g", epsilon=1)
    text = db.explain(f"SELECT g, AVG(x) AS m FROM t WHERE {where} GROUP BY g", epsilon=1)
    assert "the smallest count of its values your answer #1 released, for k" in text


def test_looking_for_a_released_count_prepares_no_earlier_query_and_reads_one_answer(db, monkeypatch):
    from dpsql.query import known_counts
    from dpsql.query.prepare import Preparer

    for i in range(12):  # the analyst's earlier plain counts, each under another WHERE
        db.sql(f"SELECT g, COUNT(x) AS n FROM t WHERE x <> {1000 + i} GROUP BY g", epsilon=0.01)
    db.sql("SELECT g, COUNT(x) AS n FROM t GROUP BY g", epsilon=1)
    for i in range(12):
        db.sql(f"SELECT g, COUNT(x) AS n FROM t WHERE y <> {1000 + i} GROUP BY g", epsilon=0.01)
    prepared, read = [], []
    real_prepare, real_read = Preparer.prepare, known_counts.decode_answer
    monkeypatch.setattr(Preparer, "prepare", lambda self, sql, *a, **k: prepared.append(sql) or
                        real_prepare(self, sql, *a, **k))
    monkeypatch.setattr(known_counts, "decode_answer", lambda text: read.append(text) or real_read(text))
    text = db.explain(AVG, epsilon=1, max_error=1000)
    assert "your answer #13 released" in text
    assert prepared == [AVG] and len(read) == 1  # only the query itself; only the matching answer is read


def test_a_count_scaled_from_a_sample_has_no_plus_minus_before_the_charge_and_is_not_judged(db):
    sql = ("SELECT WITH DIFFERENTIAL_PRIVACY OPTIONS (scale_sample = true) COUNT(*) AS n "
           "FROM t TABLESAMPLE POISSON (10 PERCENT)")
    text = db.explain(sql, epsilon=1, max_error=0.001)
    assert "n = COUNT(*): no ± before the charge: scaled from the sample to the table" in text
    unscaled = db.explain(sql.replace("scale_sample = true", "scale_sample = false"), epsilon=1, max_error=0.001)
    assert "the query would be refused: n = COUNT(*)" in unscaled


def test_the_remote_shell_writes_max_error_and_expected_rows_into_the_options_it_sends():
    from dpsql.shell.remote import with_options

    sent, shift = with_options("SELECT AVG(x) FROM t", 0.5, None, Fraction(5), 1000)
    assert sent == "SELECT WITH DIFFERENTIAL_PRIVACY OPTIONS (epsilon = 0.5, max_error = 5.0, expected_rows = 1000) " \
                   "AVG(x) FROM t"
    assert shift.typed_offset(len(sent) - 1) == len("SELECT AVG(x) FROM t") - 1
    assert with_options("SELECT 1", None, None)[0] == "SELECT 1"


def test_an_entry_with_no_stored_answer_is_passed_over_when_looking_for_known_counts(db):
    """Some charges store no answer (a synthetic table, a call cancelled after its charge); read back
    beside stored ones, pandas gives their missing answer as NaN, which the search for counts the
    analyst already has must pass over (it failed an EXPLAIN with an internal TypeError)."""
    db.sql("SELECT g, COUNT(x) AS n FROM t GROUP BY g", epsilon=1)
    db.synthesize("t", ["g", "x"], epsilon=1, delta=1e-6, method="mst")
    assert any(answer is None for _, _, answer in db.mechanism_context().spender.released())
    assert "accuracy before the charge" in str(db.explain("SELECT g, AVG(x) AS m FROM t GROUP BY g", epsilon=1))
