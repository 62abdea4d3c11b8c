"""TABLESAMPLE POISSON (p PERCENT): a Poisson sample of units, charged the amplified cost
(``dpsql.analysis.sampling``, ``dpsql.budget.amplification``).

The amplification bound is checked by enumeration: the exact output distribution of the
discrete-Laplace COUNT dpsql plans, over every sample of two neighbouring three-unit tables, under
add/remove and under replace-one neighbours, against the epsilon dpsql charges (and the bound is
reached). The sampler is checked statistically (its rate, units whole) with tolerances that fail
a correct sampler with probability below 1e-6 and a rate off by a factor 2 always.
"""

from __future__ import annotations

import itertools
import math
import re
from dataclasses import replace
from fractions import Fraction

import duckdb
import numpy as np
import pandas as pd
import pytest

import dpsql
from dpsql.analysis.sampling import check_covers_removal
from dpsql.backends.bounding import (
    attach_sql,
    bounded_tables,
    create_raw_rows_sql,
    create_sql,
    fill_sql,
    raw_rows_sql,
)
from dpsql.backends.render import render
from dpsql.budget.accounting import Spend, query_cost
from dpsql.budget.amplification import amplified_cost, amplified_epsilon
from dpsql.errors import UnsupportedQuery
from dpsql.mechanisms.noise import SeededSource, secret_key
from dpsql.policy.language import parse_policy
from dpsql.sql.names import table_key
from dpsql.sql.pieces import bounded_read

POLICY = """BUDGET EPSILON 1000 DELTA 1e-3; NEIGHBOURS {neighbours};
PRIVATE TABLE t (PRIVACY UNIT uid, MAX ROWS PER UNIT 2, MAX GROUPS PER UNIT 1, x BOUNDS 0 TO 5,
                 g KEYS ('a', 'b'));
PUBLIC TABLE s;"""


def frame(units: dict[int, list[str]]) -> pd.DataFrame:
    """A table t: each unit's rows, one group key per row."""
    rows = [(uid, 1.0, g) for uid, groups in units.items() for g in groups]
    return pd.DataFrame(rows, columns=["uid", "x", "g"]).astype({"uid": "int64", "x": "float64", "g": "object"})


def connect(units=None, neighbours="UNBOUNDED", budget=1000, **kwargs):
    tables = {"t": frame(units or {1: ["a"], 2: ["a", "b"], 3: ["b"]}),
              "s": pd.DataFrame({"g": ["a", "b"], "label": ["A", "B"]})}
    policy = POLICY.format(neighbours=neighbours).replace("BUDGET EPSILON 1000", f"BUDGET EPSILON {budget}")
    return dpsql.connect(tables, policy=policy, **kwargs)


# -- the amplified bound, by enumeration ----------------------------------------------------------


def laplace_pmf(scale: Fraction):
    """The discrete Laplace pmf P(z) ∝ exp(-|z|/scale), exactly normalised."""
    q = math.exp(-1 / float(scale))
    return lambda z: (1 - q) / (1 + q) * q ** abs(z)


def output_distribution(units: list[list[str]], rate: float, pmfs, keys, outputs):
    """P(noisy counts = o) for each o in ``outputs``: every subset of units is the sample with its
    Poisson probability; the count of each key is noised independently (``pmfs``, per key)."""
    result = np.zeros(len(outputs))
    for kept in itertools.product((False, True), repeat=len(units)):
        weight = math.prod(rate if k else 1 - rate for k in kept)
        counts = [sum(rows.count(key) for rows, k in zip(units, kept) if k) for key in keys]
        result += weight * np.array([math.prod(pmf(o[i] - counts[i]) for i, pmf in enumerate(pmfs))
                                     for o in outputs])
    return result


def worst_log_ratio(first, second) -> float:
    return float(np.max(np.abs(np.log(first) - np.log(second))))


def neighbours_of(base: list[list[str]], relation: str, rows=(("a",), ("a", "a"), ("a", "b"), ("b", "b"), ())):
    """Every neighbour pair of ``base`` plus one unit (add/remove), or of ``base`` with its last
    unit replaced by any other (replace-one; empty units included: a unit with no rows)."""
    if relation == "unbounded":
        return [(base, base + [list(r)]) for r in rows if r]
    return [(base[:-1] + [list(a)], base[:-1] + [list(b)]) for a in rows for b in rows if a != b]


@pytest.mark.parametrize("relation", ["unbounded", "bounded"])
@pytest.mark.parametrize("grouped", [False, True])
def test_amplified_epsilon_bounds_the_exact_privacy_loss(relation, grouped):
    """The worst log-ratio of output probabilities over every neighbouring pair never exceeds
    the epsilon dpsql charges for COUNT on a 50% sample, and comes within 1e-6 of it where the
    base mechanism's loss is reached by a removal (in the far tail the ratio is then exactly
    1 + p(e^eps - 1)); grouped under replace-one neighbours a removal moves half the L1 the
    noise is calibrated to, so the bound holds with room there."""
    rate, epsilon = 0.5, Fraction(1)
    sql = "SELECT " + ("g, " if grouped else "") + "COUNT(*) AS n FROM t TABLESAMPLE POISSON (50 PERCENT)" \
        + (" GROUP BY g" if grouped else "")
    with connect(neighbours=relation.upper()) as db:
        prepared = db._prepare(sql, epsilon, None, None, None, None)
    charged = prepared.priced.cost.epsilon
    (measure,) = prepared.plan.measures
    assert prepared.priced.base_cost.epsilon == epsilon
    keys = ["a", "b"] if grouped else ["a"]
    pmf = laplace_pmf(measure.scale)
    span = range(-40, 44) if not grouped else range(-14, 18)
    outputs = list(itertools.product(span, repeat=len(keys)))
    worst = 0.0
    base = [["a", "b"], ["b"]]
    for first, second in neighbours_of(base, relation):
        if not grouped:  # ungrouped: every row counts, whatever its key
            first, second = [["a"] * len(r) for r in first], [["a"] * len(r) for r in second]
        p = output_distribution(first, rate, [pmf] * len(keys), keys, outputs)
        q = output_distribution(second, rate, [pmf] * len(keys), keys, outputs)
        worst = max(worst, worst_log_ratio(p, q))
    assert worst <= charged + 1e-12
    if relation == "unbounded" or not grouped:  # grouped replace-one noise is twice what a removal needs
        assert worst >= float(charged) - 1e-6


def test_a_mechanism_blind_to_removals_is_not_amplified():
    """The pitfall under replace-one neighbours: noise calibrated to a replacement alone (a SUM of
    values in [5, 6]: a replacement moves it by at most 1) is epsilon-DP on the whole table, but a
    Poisson sample can drop the replaced unit and keep its replacement, moving the sum by 6: the
    sampled mechanism's loss is then far above ln(1 + p(e^eps - 1)). dpsql's planner never
    calibrates so (its sensitivity takes min(lower, 0)), and ``check_covers_removal`` refuses a
    plan that would."""
    rate, epsilon = 0.5, 1.0
    pmf = laplace_pmf(Fraction(1) / Fraction(epsilon))  # scale 1/eps: sensitivity 1
    outputs = [(o,) for o in range(-30, 40)]
    # D = {5}, {6}; D' = {5}, {5}: one unit replaced (values as row counts of key 'a').
    first = output_distribution([["a"] * 5, ["a"] * 6], rate, [pmf], ["a"], outputs)
    second = output_distribution([["a"] * 5, ["a"] * 5], rate, [pmf], ["a"], outputs)
    unsampled = worst_log_ratio(output_distribution([["a"] * 5, ["a"] * 6], 1.0, [pmf], ["a"], outputs),
                                output_distribution([["a"] * 5, ["a"] * 5], 1.0, [pmf], ["a"], outputs))
    assert unsampled <= epsilon + 1e-9  # the base mechanism is epsilon-DP under replacement
    assert worst_log_ratio(first, second) > float(amplified_epsilon(Fraction(1), Fraction(1, 2))) + 0.3


def test_check_covers_removal_refuses_a_plan_calibrated_to_replacements_alone():
    with connect(neighbours="BOUNDED") as db:
        prepared = db._prepare("SELECT COUNT(*) AS n FROM t TABLESAMPLE POISSON (50 PERCENT)", 1, None, None,
                               None, None)
    plan = prepared.plan
    (measure,) = plan.measures
    check_covers_removal(plan, plan)  # the same plan covers itself
    smaller = replace(plan, measures=(replace(measure, sensitivity=replace(measure.sensitivity, l1=Fraction(1, 2))),))
    with pytest.raises(UnsupportedQuery, match="covers replacing a unit but not removing one"):
        check_covers_removal(smaller, plan)


def test_amplified_epsilon_matches_an_independent_float_computation():
    for epsilon, rate in [(Fraction(1), Fraction(1, 2)), (Fraction(1, 10), Fraction(1, 100)),
                          (Fraction(5), Fraction(3, 1000)), (Fraction(1, 1000), Fraction(99, 100))]:
        exact = math.log1p(float(rate) * math.expm1(float(epsilon)))
        charged = amplified_epsilon(epsilon, rate)
        assert exact * (1 - 1e-15) <= charged <= exact * (1 + 1e-12)  # the float is within an ulp or two
    assert amplified_epsilon(Fraction(2), Fraction(1)) == 2


def test_amplified_cost_rho_is_honest():
    """Pure: the smaller of the base rho and eps'^2/2 (pure eps'-DP is eps'^2/2-zCDP). Gaussian:
    the base rho, and by the subsampled Gaussian's Rényi DP (Mironov, Talwar, Zhang 2019, integer
    orders, computed here independently) no smaller rho holds at every order: RDP(alpha)/alpha
    stays below 1/(2 sigma^2) and approaches it."""
    pure = amplified_cost(Spend(Fraction(1), Fraction(0), Fraction(1, 2)), Fraction(1, 10))
    assert pure.rho == pure.epsilon ** 2 / 2 and pure.delta == 0
    several = amplified_cost(Spend(Fraction(1), Fraction(0), Fraction(1, 20)), Fraction(9, 10))
    assert several.rho == Fraction(1, 20)  # the base's own rho was smaller
    gaussian = amplified_cost(Spend(Fraction(1), Fraction(1, 10**6), Fraction(1, 8)), Fraction(1, 10))
    assert gaussian.rho == Fraction(1, 8) and gaussian.delta == Fraction(1, 10**7)
    sigma_squared, q = 4.0, 0.1  # rho = 1/(2 sigma^2) = 1/8

    def rdp(alpha: int) -> float:  # log E[(p/q)^alpha] of the sampled Gaussian, by the binomial expansion
        terms = [math.lgamma(alpha + 1) - math.lgamma(k + 1) - math.lgamma(alpha - k + 1)
                 + (alpha - k) * math.log1p(-q) + k * math.log(q) + (k * k - k) / (2 * sigma_squared)
                 for k in range(alpha + 1)]
        top = max(terms)
        return (top + math.log(sum(math.exp(t - top) for t in terms))) / (alpha - 1)

    ratios = [rdp(alpha) / alpha for alpha in (2, 8, 32, 128, 512, 2048)]
    assert all(r <= 1 / (2 * sigma_squared) for r in ratios)
    assert ratios[-1] > 0.9 / (2 * sigma_squared)  # so no rho below the base holds for every order


# -- the sampler --------------------------------------------------------------------------------


def sampled_units(connection, rate: Fraction, key: str, unit_type: str = "INTEGER") -> dict:
    """{unit: rows kept} of the sampled read of t's bounded copy under ``key`` (the real piece, rendered)."""
    read = bounded_read("t", "uid", 3, None, None, ["uid"], sample=(rate, "uid", unit_type))
    sql = f"SELECT uid, COUNT(*) FROM ({render(read)}) GROUP BY uid"
    return dict(connection.execute(sql, {"dp_sample_key": key}).fetchall())


@pytest.fixture(scope="module")
def copied():
    """A DuckDB connection holding t's bounded copy: 20,000 units with 1-5 rows (3 kept)."""
    connection = duckdb.connect()
    rng = np.random.default_rng(5)
    counts = rng.integers(1, 6, 20_000)
    connection.execute("CREATE TABLE t AS SELECT * FROM (SELECT unnest($u) AS uid, 1.0 AS x)",
                       {"u": np.repeat(np.arange(20_000), counts).tolist()})
    policy = parse_policy("BUDGET EPSILON 1; PRIVATE TABLE t (PRIVACY UNIT uid, MAX ROWS PER UNIT 3);")
    connection.execute(attach_sql())
    for table in bounded_tables(list(policy.private_tables), {"t": {"uid": "BIGINT", "x": "DECIMAL(2,1)"}},
                                table_key):
        connection.execute(create_sql(table))
        connection.execute(fill_sql(table), {"salt": "ab"})
        connection.execute(create_raw_rows_sql(table))
        connection.execute(raw_rows_sql(table))  # one row per unit: the sample's hash is computed there
    kept = dict(connection.execute('SELECT uid, COUNT(*) FROM dp_bounding.main."dp_bounded_t__uid__3" '
                                   "WHERE NOT dp_pad GROUP BY uid").fetchall())
    return connection, kept


@pytest.mark.parametrize("percent", [1, 10, 50, Fraction(100, 3)])
def test_the_sample_keeps_units_whole_at_rate_p(copied, percent):
    """Over 20,000 units the number kept is Binomial(n, p'), p' = floor(p 2^64)/2^64: within 5.5
    standard deviations (fails a correct sampler with probability below 4e-8 per key; a rate off by
    a factor 2 either way is beyond the tolerance). Every kept unit keeps all its rows of the copy."""
    connection, kept = copied
    rate = Fraction(percent) / 100
    n = len(kept)
    for seed in range(3):
        units = sampled_units(connection, rate, secret_key(SeededSource(seed)))
        spread = 5.5 * math.sqrt(n * float(rate) * (1 - float(rate)))
        assert abs(len(units) - n * float(rate)) <= spread
        assert all(rows == kept[unit] for unit, rows in units.items())
    assert n * float(rate) / 2 > 5.5 * math.sqrt(n * float(rate) * (1 - float(rate)))  # half or double: caught


def test_each_key_draws_its_own_sample(copied):
    """Two keys' samples of 20,000 units at 50% overlap in about a quarter of the units (independent
    coins), not in all of them: the key decides the sample."""
    connection, kept = copied
    first = set(sampled_units(connection, Fraction(1, 2), secret_key(SeededSource(1))))
    second = set(sampled_units(connection, Fraction(1, 2), secret_key(SeededSource(2))))
    n = len(kept)
    assert abs(len(first & second) - n / 4) <= 5.5 * math.sqrt(n * 3 / 16)


def test_units_telling_apart_only_by_bytes_get_independent_coins():
    """'a' and 'A' (equal under NOCASE) and 'é' composed or not: each pair's coins agree under 400 keys
    only if they were hashed as one value (probability 2^-400 for independent coins at 50%)."""
    connection = duckdb.connect()
    pairs = [("a", "A"), ("\u00e9", "e\u0301")]
    # The hash of one unit (a row-level copy's form: no row-count table to read it from).
    read = bounded_read("t", None, 1, None, None, ["uid"], sample=(Fraction(1, 2), "uid", "VARCHAR"))
    condition = render(read).split("WHERE NOT dp_pad AND ", 1)[1]
    for left, right in pairs:
        agree = 0
        for seed in range(400):
            key = secret_key(SeededSource(seed))
            coins = connection.execute(f"SELECT {condition} FROM (SELECT unnest([$l, $r]) AS uid)",
                                       {"dp_sample_key": key, "l": left, "r": right}).fetchall()
            agree += coins[0][0] == coins[1][0]
        assert agree < 400


# -- the charge, the key, repeats ----------------------------------------------------------------


def test_the_charge_is_the_amplified_cost_and_repeats_are_the_same_sample():
    with connect() as db:
        sql = "SELECT COUNT(*) AS n FROM t TABLESAMPLE POISSON (25 PERCENT)"
        first = db.sql(sql, epsilon=1)
        expected = amplified_cost(query_cost(db._prepare(sql, 1, None, None, None, None).plan), Fraction(1, 4))
        assert (first.cost.epsilon, first.cost.delta) == (expected.epsilon, expected.delta)
        assert db.budget.spent.epsilon == expected.epsilon
        again = db.sql(sql, epsilon=1)
        assert again.cost.repeat and again.fetchall() == first.fetchall()  # the stored release: no new sample
        other = db.sql(sql.replace("25", "50"), epsilon=1)  # another rate is another query, charged
        assert other.cost.epsilon == amplified_epsilon(Fraction(1), Fraction(1, 2))
        assert db.budget.spent.epsilon == expected.epsilon + other.cost.epsilon
        recorded = db.ledger()
        assert "sample_rate" in str(recorded["options"].iloc[0]) and "1/4" in str(recorded["options"].iloc[0])


def test_the_key_is_fresh_per_query_and_never_shown(monkeypatch, tmp_path):
    import dpsql.query.answering

    drawn = []

    def recording(source=None):
        drawn.append(secret_key(source))
        return drawn[-1]

    monkeypatch.setattr(dpsql.query.answering, "secret_key", recording)
    ledger = tmp_path / "t.ledger"
    with connect(ledger=str(ledger)) as db:
        sql = "SELECT g, COUNT(*) AS n, SUM(x) AS s FROM t TABLESAMPLE POISSON (50 PERCENT) GROUP BY g"
        shown = [db.explain(sql, epsilon=1)]
        for epsilon in (1, 2):
            result = db.sql(sql, epsilon=epsilon)
            shown += [repr(result.fetchall()), str(result.cost), str(result.accuracy())]
        shown.append(db.ledger().to_string())
        salt = db._ledger.salt().hex()
    assert len(drawn) == 2 and drawn[0] != drawn[1] and salt not in drawn
    stored = ledger.read_bytes()
    for key in drawn:
        assert all(key not in text for text in shown) and key.encode() not in stored


def test_explain_shows_rate_base_cost_and_charge():
    with connect() as db:
        text = db.explain("SELECT COUNT(*) AS n FROM t TABLESAMPLE POISSON (10 PERCENT)", epsilon=1)
    charged = amplified_epsilon(Fraction(1), Fraction(1, 10))
    assert "cost on the sample: epsilon 1, delta 0; charged, amplified by TABLESAMPLE POISSON (10 PERCENT)" in text
    assert "sampling: TABLESAMPLE POISSON (10 PERCENT) of t: each unit is kept with all its (at most 2 rows), " \
           "independently with probability 0.1" in text
    assert f"this query costs epsilon {float(charged):.6g}" in text
    assert "$dp_sample_key" in text and "about the sample" in text
    assert re.search(r"[0-9a-f]{64}", text) is None


def test_zcdp_charges_eps_prime_squared_over_two_for_laplace():
    policy = POLICY.format(neighbours="UNBOUNDED").replace("NEIGHBOURS UNBOUNDED;", "ACCOUNTING ZCDP;")
    with dpsql.connect({"t": frame({1: ["a"], 2: ["b"]})}, policy=policy.replace("PUBLIC TABLE s;", "")) as db:
        result = db.sql("SELECT COUNT(*) AS n FROM t TABLESAMPLE POISSON (10 PERCENT)", epsilon=1)
    charged = amplified_epsilon(Fraction(1), Fraction(1, 10))
    assert result.cost.rho == charged ** 2 / 2


# -- refusals ------------------------------------------------------------------------------------


@pytest.mark.parametrize("sql, message, hint", [
    ("SELECT COUNT(*) FROM t TABLESAMPLE (10 PERCENT)", "TABLESAMPLE SYSTEM of private table t", "POISSON"),
    ("SELECT COUNT(*) FROM t TABLESAMPLE BERNOULLI (10 PERCENT)", "database's own random()", "POISSON"),
    ("SELECT COUNT(*) FROM t TABLESAMPLE RESERVOIR (10 ROWS)", "TABLESAMPLE RESERVOIR", "POISSON"),
    ("SELECT COUNT(*) FROM t TABLESAMPLE POISSON (10)", "not a number of rows", "PERCENT"),
    ("SELECT COUNT(*) FROM t TABLESAMPLE POISSON (0 PERCENT)", "outside (0, 100]", "100 PERCENT"),
    ("SELECT COUNT(*) FROM t TABLESAMPLE POISSON (150 PERCENT)", "outside (0, 100]", "100 PERCENT"),
    ("SELECT COUNT(*) FROM t TABLESAMPLE POISSON (10 PERCENT) REPEATABLE (7)", "predictable", "REPEATABLE"),
    ("SELECT COUNT(*) FROM t JOIN s TABLESAMPLE POISSON (10 PERCENT) ON t.g = s.g", "public table s",
     "whole"),
    ("SELECT COUNT(*) FROM t AS a TABLESAMPLE POISSON (10 PERCENT) JOIN t AS b ON a.uid = b.uid",
     "reads private data outside the sample", "only private table"),
    ("SELECT COUNT(*) FROM (SELECT uid FROM t TABLESAMPLE POISSON (10 PERCENT) UNION ALL SELECT uid FROM t) AS v",
     "reads private data outside the sample", "only private table"),
    ("SELECT COUNT(*) FROM t USING SAMPLE 10%", "SAMPLE is not supported", "TABLESAMPLE POISSON"),
])
def test_refusals_name_the_construct_where_and_what_to_write(sql, message, hint):
    with connect() as db:
        with pytest.raises(UnsupportedQuery) as refused:
            db.sql(sql, epsilon=1)
        assert db.budget.spent.epsilon == 0
    assert message in str(refused.value) and hint in (refused.value.hint or "")
    assert refused.value.line == 1 and refused.value.col is not None


def test_a_bias_report_is_refused_on_a_sample():
    with connect() as db:
        with pytest.raises(UnsupportedQuery, match="bias report") as refused:
            db.sql("SELECT COUNT(*) AS n FROM t TABLESAMPLE POISSON (10 PERCENT)", epsilon=1, report_bias=True)
    assert refused.value.line == 1 and "report_bias" in refused.value.hint


# -- scale_sample ---------------------------------------------------------------------------------

SCALED = ("SELECT WITH DIFFERENTIAL_PRIVACY OPTIONS (scale_sample = true) g, COUNT(*) AS n, SUM(x) AS s, "
          "AVG(x) AS m FROM t TABLESAMPLE POISSON (20 PERCENT) GROUP BY g")


def big(units: int = 3000) -> dict[int, list[str]]:
    """Units with 1 or 2 rows, over keys a and b (one key per unit)."""
    return {u: ["a" if u % 2 else "b"] * (1 + u % 3 // 2) for u in range(units)}


def test_scale_sample_divides_totals_by_p_and_widens_their_intervals():
    """The stored release, scaled: values / p; each interval the totals Y within z·sqrt(v·Y) of
    [low/p, high/p], v = (1 - p)/p · c, c = 2 rows for COUNT, 2·5 for SUM(x) (dpsql.query.scaling)."""
    with connect(big(), rng=SeededSource(3)) as db:
        scaled = db.sql(SCALED, epsilon=1)
        plain = db.sql(SCALED.replace("scale_sample = true", "scale_sample = false"), epsilon=1)
    assert plain.cost.repeat  # the same release: scaling is post-processing
    with connect(big()) as db:
        assert "scale_sample: n, s divided by p for the whole table" in db.explain(SCALED, epsilon=1)
    assert scaled.types == ["VARCHAR", "DOUBLE", "DOUBLE", "DOUBLE"]
    noise, sampled = plain.intervals(0.05), scaled.intervals(0.05)
    for row, (key, n, s, m) in enumerate(plain.fetchall()):
        assert scaled.fetchall()[row] == (key, n / 0.2, s / 0.2, m)  # AVG is a ratio: left as it is
        for name, largest in (("n", 2), ("s", 2 * 5)):
            low, high = noise[f"{name}_low"][row], noise[f"{name}_high"][row]
            root = 1.959963984540054 * math.sqrt(0.8 / 0.2 * largest)  # z sqrt(v): the score interval's
            upper = ((root + math.sqrt(root ** 2 + 4 * max(high / 0.2, 0))) / 2) ** 2
            lower = ((-root + math.sqrt(root ** 2 + 4 * low / 0.2)) / 2) ** 2 if low > 0 else min(low / 0.2, 0)
            assert sampled[f"{name}_low"][row] == pytest.approx(lower)
            assert sampled[f"{name}_high"][row] == pytest.approx(upper)
            assert lower <= low / 0.2 and upper >= high / 0.2
        assert sampled["m_low"][row] == noise["m_low"][row]
    assert any("scale_sample: n, s are estimates for the whole table" in note for note in scaled.notes)


@pytest.mark.slow  # 200 queries; test_scale_sample_divides_totals_by_p_and_widens_their_intervals checks the formula
def test_scaled_intervals_cover_the_table_total():
    """Over 100 fresh samples, the 95% interval of the scaled COUNT holds the table's count in at
    least 80 of them: an approximate interval, conservative here (c bounds every unit's rows), so
    fewer than 80 has probability below 1e-6 at its nominal 95%. The noise's interval alone,
    scaled, covers about 40% here (at most 64 fails with probability below 1e-7): the sampling
    error is what the widening adds."""
    units = big(2000)
    truth = sum(len(rows) for rows in units.values() if rows[0] == "a")
    covered = noise_only = 0
    with connect(units, rng=SeededSource(8), budget=10**6) as db:
        for run in range(100):
            sql = SCALED.replace("20 PERCENT", f"{20 + run / 10**6} PERCENT")  # a new query each time: a new sample
            frame = db.sql(sql, epsilon=10).intervals(0.05)
            plain = db.sql(sql.replace("scale_sample = true", "scale_sample = false"), epsilon=10).intervals(0.05)
            rate = (20 + run / 10**6) / 100
            a = list(frame["g"]).index("a")
            covered += frame["n_low"][a] <= truth <= frame["n_high"][a]
            noise_only += plain["n_low"][a] / rate <= truth <= plain["n_high"][a] / rate
    assert covered >= 80
    assert noise_only <= 64


@pytest.mark.parametrize("order", ["ORDER BY g", "ORDER BY n DESC, g LIMIT 1", "ORDER BY UPPER(g) DESC",
                                   "ORDER BY 2, 1", "ORDER BY m + 1, g OFFSET 1"])
def test_scale_sample_orders_and_limits_by_keys_and_totals_as_they_are(order):
    """ORDER BY and LIMIT on keys, or on totals as they are, mean the same before and after the
    division by p (it keeps every order): accepted, and each row keeps its own scaled interval."""
    sql = SCALED + " " + order
    with connect(big(), rng=SeededSource(4)) as db:
        scaled = db.sql(sql, epsilon=1)
        plain = db.sql(sql.replace("scale_sample = true", "scale_sample = false"), epsilon=1)
    assert plain.cost.repeat  # the same release, post-processed
    assert scaled.fetchall() == [(g, n / 0.2, s / 0.2, m) for g, n, s, m in plain.fetchall()]
    noise, sampled = plain.intervals(0.05), scaled.intervals(0.05)
    root = 1.959963984540054 * math.sqrt(0.8 / 0.2 * 2)
    for row, (low, high) in enumerate(zip(noise["n_low"], noise["n_high"])):
        upper = ((root + math.sqrt(root ** 2 + 4 * max(high / 0.2, 0))) / 2) ** 2
        assert sampled["n_high"][row] == pytest.approx(upper)
        assert list(sampled["g"])[row] == list(noise["g"])[row]


@pytest.mark.parametrize("sql, message", [
    ("SELECT WITH DIFFERENTIAL_PRIVACY OPTIONS (scale_sample = true) COUNT(*) AS n FROM t", "reads no TABLESAMPLE"),
    ("SELECT WITH DIFFERENTIAL_PRIVACY OPTIONS (scale_sample = true) g, COUNT(*) AS n FROM t TABLESAMPLE "
     "POISSON (10 PERCENT) GROUP BY g ORDER BY n % 7", "post-processes them"),
    ("SELECT WITH DIFFERENTIAL_PRIVACY OPTIONS (scale_sample = true) g, COUNT(*) AS n FROM t TABLESAMPLE "
     "POISSON (10 PERCENT) GROUP BY g HAVING COUNT(*) > 5", "post-processes them"),
    ("SELECT WITH DIFFERENTIAL_PRIVACY OPTIONS (scale_sample = true) g, COUNT(*) * 2 AS n FROM t TABLESAMPLE "
     "POISSON (10 PERCENT) GROUP BY g", "post-processes them"),
    ("SELECT WITH DIFFERENTIAL_PRIVACY OPTIONS (scale_sample = true) SUM(x - 3) AS n FROM t TABLESAMPLE "
     "POISSON (10 PERCENT)", "can be negative"),
])
def test_scale_sample_refusals(sql, message):
    with connect() as db:
        with pytest.raises(UnsupportedQuery, match=message) as refused:
            db.sql(sql, epsilon=1)
        assert db.budget.spent.epsilon == 0
    assert refused.value.line == 1 and refused.value.col == 43  # at the option


def test_the_per_unit_hash_keeps_the_units_whose_own_hash_is_below_the_threshold(copied):
    """Over a unit-level copy the hash is computed once per unit on its row-count table and matched
    by the unit's equality: the same units as the hash of each row's own unit, for the same key."""
    connection, _ = copied
    key = secret_key(SeededSource(11))
    per_unit = set(sampled_units(connection, Fraction(3, 10), key))
    direct = render(bounded_read("t", None, 1, None, None, ["uid"], sample=(Fraction(3, 10), "uid", "BIGINT")))
    condition = direct.split("WHERE NOT dp_pad AND ", 1)[1]
    per_row = {row[0] for row in connection.execute(
        f'SELECT DISTINCT uid FROM dp_bounding.main."dp_bounded_t__uid__3" WHERE NOT dp_pad AND {condition}',
        {"dp_sample_key": key}).fetchall()}
    assert per_unit == per_row and 5000 < len(per_unit) < 7000


@pytest.mark.spark
@pytest.mark.xdist_group("spark")
def test_spark_draws_the_same_sample_through_the_same_plan_and_renderer():
    """The same plan rendered for Spark (``sha2`` over Spark's canonical text, on its row-count view)
    keeps the same units as DuckDB under the same key: with one seeded source (the key is its first
    draw, the noise the next) both engines release the same answer, about 30% of the table's."""
    from engines import Engine

    units = big(400)
    answers = []
    for name in ("duckdb", "spark"):
        engine = Engine(name)
        try:
            tables = {"t": frame(units), "s": pd.DataFrame({"g": ["a", "b"], "label": ["A", "B"]})}
            db = engine.connect(tables, policy=POLICY.format(neighbours="UNBOUNDED"), rng=SeededSource(5))
            result = db.sql("SELECT g, COUNT(*) AS n FROM t TABLESAMPLE POISSON (30 PERCENT) GROUP BY g", epsilon=1)
            answers.append(sorted(result.fetchall()))
        finally:
            engine.close()
    assert answers[0] == answers[1]
    total = sum(len(rows) for rows in units.values())
    assert 0.15 * total < sum(n for _, n in answers[0]) < 0.45 * total


def test_the_policys_default_bias_report_is_left_out_of_a_sample_and_explain_says_so():
    policy = POLICY.format(neighbours="UNBOUNDED").replace("NEIGHBOURS UNBOUNDED;",
                                                           "NEIGHBOURS UNBOUNDED; REPORT BIAS SHARE 0.1;")
    tables = {"t": frame({1: ["a"], 2: ["b"]}), "s": pd.DataFrame({"g": ["a", "b"], "label": ["A", "B"]})}
    with dpsql.connect(tables, policy=policy) as db:
        sql = "SELECT COUNT(*) AS n FROM t TABLESAMPLE POISSON (10 PERCENT)"
        assert "REPORT BIAS SHARE is left out" in db.explain(sql, epsilon=1)
        result = db.sql(sql, epsilon=1)
        assert result.bounding is None and result.cost.epsilon == amplified_epsilon(Fraction(1), Fraction(1, 10))
        assert "REPORT BIAS SHARE" not in db.explain(sql.replace(" TABLESAMPLE POISSON (10 PERCENT)", ""), epsilon=1)


@pytest.mark.parametrize("rate", [0.01, 0.1, 0.5])
def test_the_sampling_interval_covers_small_totals_too(rate):
    """Exact coverage over the binomial sample of Y units (one row each, no noise) of the scaled
    interval: at least 0.9 for every Y tried. An interval sized by the estimate itself (the first
    version) covered Y = 5 at 10% in 41% of samples: an empty sample gave [0, 0]."""
    from scipy import stats

    from dpsql.query.scaling import _score_interval
    z = 1.959963984540054
    for total in (1, 5, 20, 50, 200, 1000):
        covered = sum(stats.binom.pmf(x, total, rate) for x in range(total + 1)
                      if _score_interval(x / rate, x / rate, z, (1 - rate) / rate)[0] <= total
                      <= _score_interval(x / rate, x / rate, z, (1 - rate) / rate)[1])
        assert covered >= 0.899, (total, covered)  # (Y = 1 at 10%: exactly 0.9, an empty sample)


@pytest.mark.parametrize("sql, message", [
    ("SELECT COUNT(*) FROM (SELECT * FROM t) AS q TABLESAMPLE POISSON (10 PERCENT)", "not to a subquery or a CTE"),
    ("WITH c AS (SELECT * FROM t) SELECT COUNT(*) FROM c TABLESAMPLE POISSON (10 PERCENT)",
     "not to a subquery or a CTE"),
    ("SELECT COUNT(*) FROM (SELECT * FROM t) AS q TABLESAMPLE BERNOULLI (10 PERCENT)", "not to a subquery or a CTE"),
    ("SELECT COUNT(*) FROM t TABLESAMPLE POISSON (1e-60 PERCENT)", "the sample would always be empty"),
    ("SELECT COUNT(*) FROM t TABLESAMPLE POISSON (0.0000000000000000000000000000000000000000000001 PERCENT)",
     "has 48 characters"),
])
def test_a_sample_the_charge_would_not_match_is_refused_not_ignored(sql, message):
    """A TABLESAMPLE on a subquery or CTE was dropped and the full epsilon charged (helper-25)."""
    with dpsql.connect({"t": pd.DataFrame({"uid": range(50)})},
                       policy="BUDGET EPSILON 5; PRIVATE TABLE t (PRIVACY UNIT uid, MAX ROWS PER UNIT 1);") as db:
        with pytest.raises(dpsql.UnsupportedQuery, match=message):
            db.sql(sql, epsilon=1)
        assert db.budget.spent.epsilon == 0
        assert db.sql("SELECT COUNT(*) FROM t TABLESAMPLE 10 PERCENT (POISSON)", epsilon=1).cost.epsilon < 1


def test_scale_sample_keeps_the_outside_domain_cell_and_says_it_is_the_samples():
    frame = pd.DataFrame({"uid": range(300), "g": ["a", "b", "c"] * 100})
    policy = "BUDGET EPSILON 5; PRIVATE TABLE t (PRIVACY UNIT uid, MAX ROWS PER UNIT 1, g KEYS ('a', 'b'));"
    with dpsql.connect({"t": frame}, policy=policy, rng=SeededSource(2)) as db:
        scaled = db.sql("SELECT WITH DIFFERENTIAL_PRIVACY OPTIONS (scale_sample = true) g, COUNT(*) AS n "
                        "FROM t TABLESAMPLE POISSON (50 PERCENT) GROUP BY g", epsilon=1)
    assert scaled.outside_domain is not None
    assert any("outside their domain is about the sample" in note for note in scaled.notes)
