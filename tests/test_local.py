"""Randomized-response columns (issue 24, item 4): the sampler, the estimator, the policy clause
and the de-biased COUNT queries (``dpsql.mechanisms.randomized_response``, ``dpsql.query.local``).

Privacy: the exact output distribution of the free path on neighbouring tables (every report
vector enumerated, its answer computed by ``db.sql`` itself) moves by at most e^epsilon, and
the empirical audit bounds the loss of the collected-then-counted release. Statistics: the
sampler's keep probability passes a Hoeffding test that fails a correct sampler with
probability below 1e-7 and any keep probability off by a factor 2 always (the tolerance is a
small fraction of the gap); the estimator is unbiased, and its variance exact, by enumeration.
"""

from __future__ import annotations

import itertools
import math
from decimal import Decimal
from fractions import Fraction

import duckdb
import numpy as np
import pandas as pd
import pytest
from audit import loss_lower_bound, thresholds
from pums import load_pums

import dpsql
from dpsql.errors import InvalidParameter, PolicyError
from dpsql.mechanisms.randomized_response import (
    debiased_count,
    debiased_variance,
    keep_probability,
    noise_variance_after_debiasing,
    other_probability,
    randomized_response,
)
from dpsql.mechanisms.noise import SeededSource, k_ary_response
from dpsql.policy.diff import policy_difference
from dpsql.policy.language import parse_policy, policy_to_text

DOMAIN = ("yes", "no", "maybe")
POLICY = """BUDGET EPSILON 10; NEIGHBOURS {neighbours}; QUERY EPSILON 1;
PRIVATE TABLE survey (PRIVACY UNIT {unit}, age BOUNDS 0 TO 100,
                      ans LOCAL RR EPSILON 1 DOMAIN ('yes', 'no', 'maybe'));"""
ROW = POLICY.format(neighbours="BOUNDED", unit="ROW")
GROUPED = "SELECT ans, COUNT(*) AS n FROM survey GROUP BY ans"


def survey(answers, ages=None) -> pd.DataFrame:
    ages = [40] * len(answers) if ages is None else ages
    return pd.DataFrame({"rid": range(len(answers)), "ans": list(answers), "age": ages})


@pytest.fixture(scope="module")
def collected() -> pd.DataFrame:
    """300 true answers, collected at epsilon 1."""
    rng = np.random.default_rng(5)
    true = rng.choice(DOMAIN, size=300, p=[0.5, 0.3, 0.2]).tolist()
    reports = randomized_response(true, epsilon=1, domain=DOMAIN, source=SeededSource(6))
    return survey(reports, rng.integers(18, 90, 300).tolist())


# --- the sampler --------------------------------------------------------------------------


def test_keep_probability_passes_a_sound_test_and_a_factor_two_error_cannot():
    draws, k, epsilon = 40_000, 10, Fraction(1)
    p, q = keep_probability(epsilon, k), other_probability(epsilon, k)
    tolerance = math.sqrt(math.log(2 / 1e-8) / (2 * draws))   # Hoeffding, per proportion tested
    assert tolerance < min(p / 2, q / 2) / 2                    # a factor 2 in p (or q) is always caught
    true = np.arange(draws) % k
    for source in (SeededSource(0), None):                     # the seeded source, and the secure one
        out = k_ary_response(true, epsilon, k, source)
        assert abs(np.mean(out == true) - p) < tolerance
        for shift in range(1, k):                               # each other value equally likely
            assert abs(np.mean(out == (true + shift) % k) - q) < tolerance


def test_randomized_response_keeps_the_domain_and_refuses_what_is_outside():
    reports = randomized_response(["a", "b"] * 50, epsilon=0.5, domain=["a", "b", "c"], source=SeededSource(1))
    assert set(reports) <= {"a", "b", "c"} and len(reports) == 100
    with pytest.raises(InvalidParameter, match=r"value 2 \(None\) is not in the domain"):
        randomized_response(["a", None], epsilon=1, domain=["a", "b"])
    with pytest.raises(InvalidParameter, match="at least two values"):
        randomized_response(["a"], epsilon=1, domain=["a"])
    with pytest.raises(InvalidParameter, match="lists 'a' twice"):
        randomized_response(["a"], epsilon=1, domain=["a", "a"])
    with pytest.raises(InvalidParameter, match="above 0"):
        randomized_response(["a"], epsilon=0, domain=["a", "b"])
    with pytest.raises(InvalidParameter, match="not in the domain"):
        randomized_response([1], epsilon=1, domain=["1", "2"])    # 1 is not '1'


def test_randomized_response_takes_numpy_scalars_as_the_python_value_they_hold_exactly():
    """A column read with numpy or pandas holds np.str_ / np.int64: the same values as the
    domain's 'a' and 1. Nothing that is only equal after a lossy or type-changing conversion
    matches (True is not 1, 1.0 is not 1, -0.0 is not 0.0, float32(0.1) is not 0.1)."""
    sure = dict(epsilon=100, source=SeededSource(2))    # keep probability ~1 - 1e-43
    assert randomized_response([np.str_("a"), np.str_("b")], domain=["a", "b"], **sure) == ["a", "b"]
    assert randomized_response(np.array(["b", "a"]), domain=["a", "b"], **sure) == ["b", "a"]
    assert randomized_response(np.array([2, 1]), domain=[1, 2], **sure) == [2, 1]
    assert randomized_response([np.uint8(1), np.True_], domain=[1, True], **sure) == [1, True]
    assert randomized_response(["a"], domain=np.array(["a", "b"]), **sure) == ["a"]
    assert randomized_response([np.float32(0.5)], domain=[0.5, 1.0], **sure) == [0.5]
    for value, domain in [(np.True_, [1, 0]), (np.float64(1.0), [1, 2]), (np.int64(1), [1.0, 2.0]),
                          (np.float32(0.1), [0.1, 0.2]), (-0.0, [0.0, 1.0]), (np.str_("1"), [1, 2])]:
        with pytest.raises(InvalidParameter, match="not in the domain"):
            randomized_response([value], domain=domain, **sure)
    with pytest.raises(InvalidParameter, match="twice"):
        randomized_response(["a"], epsilon=1, domain=["a", np.str_("a")])


def test_each_report_moves_by_at_most_e_to_the_epsilon_exactly():
    """The mechanism's output law, P(y | v) = p or q: every ratio over two inputs is e^eps,
    e^-eps or 1, exactly, for every k (exact rationals with E standing for e^eps)."""
    for k in (2, 3, 5):
        for e_to_epsilon in (Fraction(3, 2), Fraction(27183, 10000), Fraction(20)):
            p, q = e_to_epsilon / (e_to_epsilon + k - 1), 1 / (e_to_epsilon + k - 1)
            assert p + (k - 1) * q == 1
            law = {(v, y): p if v == y else q for v in range(k) for y in range(k)}
            ratios = {law[v, y] / law[w, y] for v in range(k) for w in range(k) for y in range(k)}
            assert max(ratios) == e_to_epsilon and min(ratios) == 1 / e_to_epsilon


# --- the estimator ------------------------------------------------------------------------


def _enumerate(true, epsilon, k):
    """Every report vector of ``true`` (indices) with its exact probability (floats)."""
    p, q = keep_probability(epsilon, k), other_probability(epsilon, k)
    for reports in itertools.product(range(k), repeat=len(true)):
        yield reports, math.prod(p if r == t else q for r, t in zip(reports, true))


@pytest.mark.parametrize("chosen", [(0,), (1,), (0, 1), (0, 1, 2)])
def test_the_estimator_is_unbiased_and_its_variance_exact_by_enumeration(chosen):
    true, epsilon, k = [0, 1, 0, 2], 0.7, 3
    n, inside = len(true), sum(t in chosen for t in true)
    mean = second = 0.0
    for reports, probability in _enumerate(true, epsilon, k):
        estimate = debiased_count(sum(r in chosen for r in reports), n, epsilon=epsilon, k=k, size=len(chosen))
        mean += probability * estimate
        second += probability * estimate ** 2
    assert mean == pytest.approx(inside, abs=1e-9)
    assert second - mean ** 2 == pytest.approx(
        debiased_variance(inside, n, epsilon=epsilon, k=k, size=len(chosen)), abs=1e-9)


def test_the_noise_variance_after_debiasing_is_the_estimator_s_own_linear_form():
    """The central path de-biases noisy counts c~ with n^ = sum c~: a linear map of the k counts,
    whose coefficients (read off by evaluating it) give the variance of independent noise."""
    epsilon, k, sigma_sq = 1.3, 4, 2.5
    for size in (1, 2, 3, 4):
        def estimate(counts):
            return debiased_count(sum(counts[:size]), sum(counts), epsilon=epsilon, k=k, size=size)
        base = [10.0] * k
        coefficients = [estimate(base[:i] + [11.0] + base[i + 1:]) - estimate(base) for i in range(k)]
        assert sum(c * c for c in coefficients) * sigma_sq == pytest.approx(
            noise_variance_after_debiasing(sigma_sq, epsilon=epsilon, k=k, size=size), rel=1e-9)


# --- the free path, exactly -----------------------------------------------------------------


def test_free_answers_on_neighbouring_tables_differ_by_at_most_e_to_the_epsilon():
    """Bounded neighbours, PRIVACY UNIT ROW: D and D' differ in one row (its answer and its age).
    Every report vector's answer comes from db.sql (free: nothing drawn at query time), and the
    probability of each answer on D and D' is summed exactly; the ratio never passes e^1, and
    reaches it. Under unbounded neighbours the same free computation would tell D from D plus a
    row with certainty (n differs), which is why that case is charged."""
    answers = {}
    for reports in itertools.product(DOMAIN, repeat=2):
        frame = survey(reports, [30, 70])
        with dpsql.connect({"survey": frame}, policy=ROW) as db:
            result = db.sql(GROUPED)
            assert result.cost.epsilon == 0
            answers[reports] = tuple(result.fetchall())
    index = {value: i for i, value in enumerate(DOMAIN)}

    def law(true):
        found: dict = {}
        for reports, probability in _enumerate([index[v] for v in true], 1, 3):
            answer = answers[tuple(DOMAIN[r] for r in reports)]
            found[answer] = found.get(answer, 0.0) + probability
        return found

    first, second = law(["yes", "no"]), law(["maybe", "no"])
    assert set(first) == set(second)
    worst = max(max(first[a] / second[a], second[a] / first[a]) for a in first)
    assert worst <= math.e * (1 + 1e-12) and worst == pytest.approx(math.e, rel=1e-9)
    assert len({len(a) for a in answers.values()}) == 1 and sum(answers[("yes", "no")][0][1:]) != 0


def test_free_path_costs_nothing_repeats_identically_and_is_recorded_nowhere(collected):
    with dpsql.connect({"survey": collected}, policy=ROW) as db:
        first = db.sql(GROUPED)
        again = db.sql(GROUPED)
        assert first.cost.epsilon == 0 and first.fetchall() == again.fetchall()
        assert db.budget.spent.epsilon == 0 and len(db.ledger()) == 0
        p, q = keep_probability(1, 3), other_probability(1, 3)
        reports = collected["ans"].value_counts()
        expected = [(v, (reports.get(v, 0) - 300 * q) / (p - q)) for v in DOMAIN]
        assert [r[0] for r in first.fetchall()] == list(DOMAIN)
        assert [r[1] for r in first.fetchall()] == pytest.approx([e for _, e in expected])
        half = first.accuracy_df()["n"].tolist()
        assert half == pytest.approx([1.959963984540054 * math.sqrt(debiased_variance(e, 300, epsilon=1, k=3))
                                      for _, e in expected])
        one = db.sql("SELECT COUNT(*) AS n FROM survey AS s WHERE s.ans IN ('yes', 'no') AND 'no' = ans")
        assert one.fetchall() == [(pytest.approx(expected[1][1]),)]
        both = db.sql("SELECT COUNT(ans) FROM survey WHERE ans IN ('yes', 'no')").fetchall()[0][0]
        assert both == pytest.approx(expected[0][1] + expected[1][1])
        assert db.sql("SELECT COUNT(*) FROM survey WHERE ans = 'never'").fetchall() == [(0.0,)]
        assert db.sql("SELECT ans, COUNT(*) FROM survey WHERE ans = 'never' GROUP BY ans").fetchall() == []
        assert db.budget.spent.epsilon == 0


def test_having_order_by_limit_and_arithmetic_post_process_the_de_biased_counts(collected):
    with dpsql.connect({"survey": collected}, policy=ROW) as db:
        plain = dict(db.sql(GROUPED).fetchall())
        halves = dict(zip(DOMAIN, db.sql(GROUPED).accuracy_df()["n"]))
        top = db.sql("SELECT ans, COUNT(*) AS n, COUNT(*) * 2 AS twice FROM survey GROUP BY ans "
                     "HAVING COUNT(*) > 10 ORDER BY n DESC LIMIT 2")
        best = sorted(plain.items(), key=lambda item: -item[1])[:2]
        assert [(a, pytest.approx(n), pytest.approx(2 * n)) for a, n in best] == top.fetchall()
        assert top.accuracy_df()["n"].tolist() == pytest.approx([halves[a] for a, _ in best])
        assert math.isnan(top.accuracy()["twice"]) and top.cost.epsilon == 0 and db.budget.spent.epsilon == 0


@pytest.mark.parametrize("policy, query, why", [
    (POLICY.format(neighbours="UNBOUNDED", unit="ROW"), GROUPED, "neighbours are UNBOUNDED"),
    (POLICY.format(neighbours="BOUNDED", unit="rid, MAX ROWS PER UNIT 1"), GROUPED, "has a unit column"),
    (ROW, "SELECT ans, COUNT(*) AS n FROM survey WHERE age > 50 GROUP BY ans", "the WHERE reads other columns"),
])
def test_the_central_path_is_charged_as_its_counting_query(collected, policy, query, why):
    with dpsql.connect({"survey": collected}, policy=policy, rng=SeededSource(3)) as db:
        result = db.sql(query, epsilon=0.5)
        assert result.cost.epsilon == Fraction(1, 2) and db.budget.spent.epsilon == Fraction(1, 2)
        assert why in result.notes[0] and "(charged)" in result.notes[0]
        assert "GROUP BY" in db.ledger()["sql"].iloc[0]
        again = db.sql(query, epsilon=0.5)           # the counting query's stored release: free, identical
        assert again.fetchall() == result.fetchall() and db.budget.spent.epsilon == Fraction(1, 2)
        noise = 2 * 2 ** 2                             # discrete Laplace, scale 2, variance ~2b²
        for (value, estimate), half in zip(result.fetchall(), result.accuracy_df()["n"]):
            variance = (debiased_variance(estimate, 300, epsilon=1, k=3)
                        + noise_variance_after_debiasing(noise, epsilon=1, k=3))
            assert value in DOMAIN and half >= 1.95 * math.sqrt(variance) * 0.9


def test_other_queries_over_the_column_are_ordinary_central_queries_with_a_note(collected):
    with dpsql.connect({"survey": collected}, policy=ROW, rng=SeededSource(4)) as db:
        result = db.sql("SELECT ans, AVG(age) AS a FROM survey GROUP BY ans", epsilon=1)
        assert result.cost.epsilon == 1 and "not the true values" in result.notes[-1]
        assert sorted(r[0] for r in result.fetchall()) == sorted(DOMAIN)
        assert "not the true values" in db.explain("SELECT COUNT(*) FROM survey WHERE upper(ans) = 'YES'")
        plain = db.sql("SELECT COUNT(*) FROM survey WHERE age > 50")    # reads no RR column: no note
        assert not any("randomized" in note for note in plain.notes)


def test_explain_says_which_path_and_why(collected):
    with dpsql.connect({"survey": collected}, policy=ROW) as db:
        free = db.explain(GROUPED)
        assert "path: free, neighbours are BOUNDED and each row is its own unit" in free
        assert "costs epsilon 0" in free and db.budget.spent.epsilon == 0
        central = db.explain("SELECT COUNT(*) FROM survey WHERE age > 50 AND ans = 'yes'", epsilon=0.25)
        assert "path: central, the WHERE reads other columns" in central
        assert "this query costs epsilon 0.25" in central and "GROUP BY" in central
    with pytest.raises(InvalidParameter):
        with dpsql.connect({"survey": collected}, policy=ROW) as db:
            db.sql(GROUPED, epsilon=-1)                # a free answer still validates what it is given


# --- the policy -------------------------------------------------------------------------------


def test_policy_round_trip_and_diff():
    policy = parse_policy(ROW)
    assert parse_policy(policy_to_text(policy)) == policy
    assert "ans LOCAL RR EPSILON 1 DOMAIN ('yes', 'no', 'maybe')" in policy_to_text(policy)
    changed = parse_policy(ROW.replace("EPSILON 1 DOMAIN", "EPSILON 2 DOMAIN"))
    assert "LOCAL RR EPSILON 2" in policy_difference(policy, changed)
    numbers = parse_policy("BUDGET EPSILON 1; PRIVATE TABLE t (PRIVACY UNIT ROW, "
                           "x local rr epsilon .5 domain (1, 2.5));")
    assert numbers.table("t").column("x").local.domain == (1, Fraction(5, 2))
    assert parse_policy(policy_to_text(numbers)) == numbers


@pytest.mark.parametrize("item, message", [
    ("ans LOCAL RR EPSILON 0 DOMAIN ('a', 'b')", "must be greater than 0, not 0"),
    ("ans LOCAL RR EPSILON 1 DOMAIN ('a')", "lists 1 value: randomized response needs two or more"),
    ("ans LOCAL RR EPSILON 1 DOMAIN ('a', 'b', 'a')", "lists 'a' twice"),
    ("ans LOCAL RR EPSILON 1 DOMAIN (1, 1.0)", "lists 1 twice"),
    ("ans LOCAL RR EPSILON 1 DOMAIN ('a', 'b'), ans KEYS ('a')", "has both KEYS and LOCAL RR"),
    ("rid LOCAL RR EPSILON 1 DOMAIN (1, 2)", "the privacy unit column rid of table survey cannot have LOCAL RR"),
])
def test_policy_refusals(item, message):
    text = f"BUDGET EPSILON 1; PRIVATE TABLE survey (PRIVACY UNIT rid, MAX ROWS PER UNIT 1, {item});"
    with pytest.raises(PolicyError, match=message) as refused:
        parse_policy(text)
    assert refused.value.line == 1 and refused.value.col is not None


def test_a_policy_built_in_python_has_it_too():
    rule = dpsql.ColumnRule("ans", local=dpsql.LocalRR(Fraction(1), DOMAIN))
    table = dpsql.PrivateTable("survey", columns=(rule,))
    policy = dpsql.Policy(Fraction(1), neighbours="bounded", private_tables=(table,))
    assert parse_policy(policy_to_text(policy)) == policy
    third = dpsql.Policy(Fraction(1), private_tables=(dpsql.PrivateTable("survey", columns=(
        dpsql.ColumnRule("ans", local=dpsql.LocalRR(Fraction(1, 3), DOMAIN)),)),))
    with pytest.raises(PolicyError, match="must be a decimal number, not 1/3"):
        dpsql.connect({"survey": survey(["yes"])}, policy=third)


def test_connect_refuses_a_domain_of_the_wrong_type_and_data_that_is_not_reports():
    with pytest.raises(PolicyError, match=r"LOCAL RR DOMAIN of survey.ans \(VARCHAR\) lists the number 1"):
        dpsql.connect({"survey": survey(["a"])}, policy=ROW.replace("('yes', 'no', 'maybe')", "(1, 2)"))
    with pytest.raises(PolicyError, match="LOCAL RR needs a text, integer or DECIMAL column, but survey.ans is DOUBLE"):
        dpsql.connect({"survey": survey([0.5])}, policy=ROW.replace("('yes', 'no', 'maybe')", "(0.5, 1.5)"))
    numeric = duckdb.connect()   # DECIMAL reports: the DOMAIN names them exactly
    numeric.execute("CREATE TABLE survey AS SELECT CAST(x AS DECIMAL(5, 2)) AS ans, 40 AS age "
                    "FROM (VALUES (1.5), (2.25), (1.5)) t(x)")
    with dpsql.connect(numeric, policy=ROW.replace("('yes', 'no', 'maybe')", "(1.5, 2.25)")) as db:
        p, q = keep_probability(1, 2), other_probability(1, 2)
        assert db.sql("SELECT ans, COUNT(*) AS n FROM survey GROUP BY ans").fetchall() == [
            (Decimal("1.50"), pytest.approx((2 - 3 * q) / (p - q))),
            (Decimal("2.25"), pytest.approx((1 - 3 * q) / (p - q)))]
    for bad in (["yes", None], ["yes", "perhaps"]):
        with pytest.raises(PolicyError, match="holds NULL or values outside its DOMAIN"):
            dpsql.connect({"survey": survey(bad)}, policy=ROW)
        unbounded = POLICY.format(neighbours="UNBOUNDED", unit="ROW")   # charged path: nothing to refuse
        with dpsql.connect({"survey": survey(bad)}, policy=unbounded, rng=SeededSource(1)) as db:
            assert db.sql(GROUPED, epsilon=1).cost.epsilon == 1


# --- the audit ------------------------------------------------------------------------------


SAMPLES = 20_000


def _collected_answers(true: list[str], epsilon: Fraction, seed: int) -> np.ndarray:
    """SAMPLES collections of ``true`` at ``epsilon``, each counted by the free path's estimator
    (``dpsql.query.local.debias`` of the counts of reports): the released estimate of 'yes'."""
    from dpsql.query.local import debias, route_local
    from dpsql.sql.parse import parse

    policy = parse_policy(ROW)
    with dpsql.connect({"survey": survey(true)}, policy=policy) as db:
        tree, checked, written = db._check(GROUPED)
        query = route_local(parse(GROUPED).tree, checked, policy, written)
    assert query is not None and query.free
    index = {v: i for i, v in enumerate(DOMAIN)}
    reports = k_ary_response(np.tile([index[v] for v in true], SAMPLES), epsilon, 3, SeededSource(seed))
    counts = np.stack([np.bincount(row, minlength=3) for row in reports.reshape(SAMPLES, len(true))])
    cache: dict = {}
    out = np.empty(SAMPLES)
    for i, row in enumerate(counts):
        key = tuple(row)
        if key not in cache:
            cache[key] = debias(query, dict(zip(DOMAIN, map(int, row))), 0.0).rows[0][1]
        out[i] = cache[key]
    return out


def test_audit_collected_then_counted():
    """D and D' differ in one row ('yes' vs 'no'); the released estimate of 'yes' on each,
    SAMPLES times: its Clopper-Pearson loss bound stays within the declared epsilon 1, and
    passes it when the reports were drawn at twice the declared epsilon (a broken collection)."""
    first, second = ["yes", "maybe"], ["no", "maybe"]
    events = thresholds([-5.0, 5.0], count=20)
    honest = loss_lower_bound(_collected_answers(first, Fraction(1), 1), _collected_answers(second, Fraction(1), 2),
                              events)
    assert honest <= 1
    broken = loss_lower_bound(_collected_answers(first, Fraction(2), 3), _collected_answers(second, Fraction(2), 4),
                              events)
    assert broken > 1


# --- a census column collected with randomized response ---------------------------------------


def test_pums_married_collected_with_randomized_response():
    """PUMS (one row per person): ``married`` collected at epsilon 2 (a simulated survey); the
    free de-biased count of married people is within a sound bound of the true count: each
    report is an independent Bernoulli, so by Hoeffding |c − E c| <= sqrt(n ln(2/1e-7) / 2)
    fails with probability below 1e-7, and the estimate moves by that over (p − q)."""
    con = duckdb.connect()
    load_pums(con, variant="pid")
    frame = con.sql("SELECT pid, age, married FROM pums").df()
    true = int(frame["married"].sum())
    frame["married"] = randomized_response(frame["married"].tolist(), epsilon=2, domain=[0, 1],
                                           source=SeededSource(7))
    policy = ("BUDGET EPSILON 1; NEIGHBOURS BOUNDED; PRIVATE TABLE pums (PRIVACY UNIT ROW, "
              "married LOCAL RR EPSILON 2 DOMAIN (0, 1));")
    with dpsql.connect({"pums": frame}, policy=policy) as db:
        result = db.sql("SELECT COUNT(*) AS n FROM pums WHERE married = 1")
        estimate, half = result.fetchall()[0][0], result.accuracy()["n"]
        assert result.cost.epsilon == 0
    n = len(frame)
    gap = keep_probability(2, 2) - other_probability(2, 2)
    bound = math.sqrt(n * math.log(2 / 1e-7) / 2) / gap
    assert abs(estimate - true) <= bound < true / 2                  # a factor-2 error could not pass
    assert half == pytest.approx(1.959963984540054 * math.sqrt(debiased_variance(estimate, n, epsilon=2, k=2)))


def test_a_sampled_count_over_reports_is_charged_at_the_amplified_cost(collected):
    """A sample is secret and drawn for a charged query only: never the free path."""
    with dpsql.connect({"survey": collected}, policy=ROW, rng=SeededSource(5)) as db:
        result = db.sql("SELECT ans, COUNT(*) AS n FROM survey TABLESAMPLE POISSON (50 PERCENT) GROUP BY ans",
                        epsilon=1)
        assert 0 < result.cost.epsilon < 1 and db.budget.spent.epsilon == result.cost.epsilon
        assert "the table is sampled" in result.notes[0] and "(charged)" in result.notes[0]
