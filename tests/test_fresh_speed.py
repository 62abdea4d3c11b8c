"""What the fresh-text path computes faster is what it computed before (issue 38, item 2).

``critical`` (a ratio's pivot quantile, ``dpsql.analysis.aggregates.intervals``) tests several
bisection steps in one vectorised call; it must return, to the bit, the t the one-step-at-a-time
search returned (kept here as the reference), for laws of both kinds and small and large scales.
"""

from __future__ import annotations

import random
from fractions import Fraction

import numpy as np
import pytest

from dpsql.analysis.aggregates import intervals
from dpsql.analysis.aggregates.intervals import Law, _blocks, critical


def critical_one_step_at_a_time(x: Law, y: Law, a: float, b: float, alpha: float) -> float:
    """``critical`` as written before it looked ahead (the reference)."""
    lows, highs, masses, beyond = _blocks(y, alpha)
    products = np.stack([a * lows, a * highs, b * lows, b * highs])
    least, most = products.min(axis=0), products.max(axis=0)
    budget = alpha * (1 - 1e-9) - beyond

    def misses(t: float) -> float:
        first, last = np.ceil(most - t), np.floor(least + t)
        inside = np.where(first <= last, 1.0 - x.tail(-first) - x.tail(last), 0.0)
        return float(np.sum(masses * (1.0 - np.maximum(inside, 0.0))))

    reach_x = x.reach(alpha / 4)
    high = float(reach_x + max(abs(a), abs(b)) * max(abs(lows).max(), abs(highs).max()) + 1)
    while misses(high) > budget:
        high *= 2
    low = 0.0
    while high - low > max(1e-3 * high, 0.5):
        middle = (low + high) / 2
        if misses(middle) <= budget:
            high = middle
        else:
            low = middle
    return high


def random_law(rng: random.Random) -> Law:
    kind = rng.choice(["laplace", "laplace", "gaussian", "none"])
    if kind == "none":
        return Law("none", Fraction(0))
    scale = Fraction(rng.randint(1, 10**6), rng.randint(1, 10**3))
    return Law(kind, scale if kind == "laplace" else scale * scale / 7)


def test_critical_looking_ahead_is_the_one_step_search_exactly():
    rng = random.Random(38)
    compared = 0
    for _ in range(300):
        x, y = random_law(rng), random_law(rng)
        low = rng.uniform(-1000, 1000)
        a, b = sorted((low, low + rng.choice([0.0, rng.uniform(0, 1), rng.uniform(0, 5000)])))
        alpha = rng.choice([0.05, 0.01, 0.1, 1e-3, 0.2])
        assert critical.__wrapped__(x, y, a, b, alpha) == critical_one_step_at_a_time(x, y, a, b, alpha), \
            (x, y, a, b, alpha)
        compared += 1
    assert compared == 300


@pytest.mark.parametrize("lookahead", [1, 2, 3, 6])
def test_critical_is_the_same_at_any_lookahead(monkeypatch, lookahead):
    rng = random.Random(lookahead)
    cases = [(random_law(rng), random_law(rng), -rng.uniform(0, 50), rng.uniform(0, 50), 0.05) for _ in range(25)]
    expected = [critical_one_step_at_a_time(*case) for case in cases]
    monkeypatch.setattr(intervals, "LOOKAHEAD", lookahead)
    assert [critical.__wrapped__(*case) for case in cases] == expected


# -- the public facts of a join, read once per generation --------------------------------------

JOIN_POLICY = """
BUDGET EPSILON 1000 DELTA 0.5;
PRIVATE TABLE visits (PRIVACY UNIT user_id, MAX ROWS PER UNIT 3, amount BOUNDS 0 TO 100);
PUBLIC TABLE stores;
"""
JOIN = ("SELECT s.city, COUNT(*) AS n, SUM(s.size) AS total FROM visits AS v JOIN stores AS s "
        "ON v.store = s.store WHERE v.amount < {k} GROUP BY s.city")


def shop_with_stores(size_of_a: int = 10):
    import duckdb

    connection = duckdb.connect()
    connection.execute("CREATE TABLE visits AS SELECT i % 7 AS user_id, 'a' || (i % 3) AS store, "
                       "CAST(i AS DOUBLE) AS amount FROM range(60) t(i)")
    connection.execute(f"CREATE TABLE stores AS SELECT * FROM (VALUES ('a0', 'x', {size_of_a}), ('a1', 'x', 20), "
                       "('a1', 'y', 30), ('a2', 'y', 40)) t(store, city, size)")
    return connection


def plan_facts(db, k: str):
    """What the analysis read of the public side, as the plan holds it: sensitivities and bounds."""
    prepared = db._prepare(JOIN.format(k=k), 1, None, None, None, None)
    return [(m.name, m.sensitivity, m.lower, m.upper, m.scale) for m in prepared.plan.measures]


def test_a_joins_public_facts_are_read_once_per_generation_and_plan_as_read_afresh(monkeypatch):
    import dpsql
    from dpsql.backends import duckdb as engine_module

    fetched: list[str] = []
    original = engine_module.Engine.fetch

    def counting(self, sql, *args, **kwargs):
        fetched.append(sql)
        return original(self, sql, *args, **kwargs)

    monkeypatch.setattr(engine_module.Engine, "fetch", counting)
    with dpsql.connect(shop_with_stores(), policy=JOIN_POLICY) as db:
        first = plan_facts(db, "50")
        facts = [sql for sql in fetched if "dp_counts" in sql or "MIN(" in sql]
        assert len(facts) == 2  # the key's multiplicity and the public columns' ranges
        fetched.clear()
        again = plan_facts(db, "51")  # a new text: parsed, checked and analysed again, facts kept
        assert not [sql for sql in fetched if "dp_counts" in sql or "MIN(" in sql]
        db._engine._facts.clear()
        assert plan_facts(db, "52") == again == first  # the kept facts plan as facts read afresh
        fetched.clear()
        db.refresh()  # a new generation: read again
        plan_facts(db, "53")
        assert len([sql for sql in fetched if "dp_counts" in sql or "MIN(" in sql]) == 2


def test_a_new_generation_reads_changed_public_facts(monkeypatch):
    """The kept facts never outlive a refresh: the public table changes the plan after one."""
    import dpsql

    connection = shop_with_stores(size_of_a=10)
    with dpsql.connect(connection, policy=JOIN_POLICY) as db:
        before = plan_facts(db, "50")
        connection.execute("UPDATE stores SET size = 1000 WHERE store = 'a0'")
        connection.execute("INSERT INTO stores VALUES ('a1', 'z', 5)")  # a1 now joins three rows
        db.refresh()
        after = plan_facts(db, "51")
        assert after != before
        db._engine._facts.clear()
        db._preparer.clear()
        assert plan_facts(db, "52") == after


# -- the bind kept without the values of compared numbers ---------------------------------------

BIND_POLICY = """
BUDGET EPSILON 100000 DELTA 0.5;
PRIVATE TABLE visits (PRIVACY UNIT user_id, MAX ROWS PER UNIT 3, MAX GROUPS PER UNIT 2,
    amount BOUNDS 0 TO 500, age BOUNDS 18 TO 90, store KEYS FROM stores.store);
PUBLIC TABLE stores;
"""
TEMPLATES = [
    "SELECT COUNT(*) AS n FROM visits WHERE amount < {a}",
    "SELECT SUM(amount) AS s FROM visits WHERE amount < {a} AND age >= {b}",
    "SELECT AVG(amount) AS m FROM visits WHERE amount > {a}",
    "SELECT SUM(LEAST(amount, {a})) AS s FROM visits WHERE age <> {b}",
    "SELECT store, COUNT(*) AS n, SUM(amount) AS s FROM visits WHERE amount <= {a} GROUP BY store",
    "SELECT amount > {a} AS big, COUNT(*) AS n FROM visits GROUP BY amount > {a}",
    "SELECT SUM(CASE WHEN age > {b} THEN amount ELSE {a} END) AS s FROM visits WHERE age = {b}",
    "SELECT s.city, COUNT(*) AS n FROM visits AS v JOIN stores AS s ON v.store = s.store "
    "WHERE v.amount < {a} AND s.size > {b} GROUP BY s.city",
    "SELECT COUNT(*) AS n FROM visits WHERE amount BETWEEN {b} AND {a}",
    "SELECT WITH DIFFERENTIAL_PRIVACY OPTIONS (epsilon = 0.{b}) SUM(amount) AS s FROM visits WHERE amount < {a}",
    "SELECT store, SUM(amount) AS s FROM visits WHERE amount < {a} GROUP BY store ORDER BY s DESC LIMIT {b}",
    # a key typed by its number (TINYINT + 100 is a SMALLINT sum, + 1000 an INTEGER one): kept apart
    "SELECT CAST(age AS TINYINT) + {c} AS k, COUNT(*) AS n FROM visits WHERE amount < {a} "
    "GROUP BY CAST(age AS TINYINT) + {c}",
]


def bind_shop():
    import duckdb

    connection = duckdb.connect()
    connection.execute("CREATE TABLE visits AS SELECT i % 11 AS user_id, 's' || (i % 4) AS store, "
                       "CAST(i * 7 % 600 AS DOUBLE) AS amount, CAST(18 + i % 70 AS INTEGER) AS age "
                       "FROM range(200) t(i)")
    connection.execute("CREATE TABLE stores AS SELECT 's' || i AS store, 'c' || (i % 2) AS city, "
                       "CAST(i * 10 AS INTEGER) AS size FROM range(4) t(i)")
    return connection


def prepared_facts(db, sql: str, epsilon=1, delta=None) -> tuple:
    """Everything a prepared query releases by: its statement, types, measures and selection."""
    prepared = db._prepare(sql, epsilon, delta, None, None, None)
    plan, priced = prepared.plan, prepared.priced
    measures = [(m.name, m.noise, m.sensitivity, m.epsilon, m.delta, m.scale, m.lower, m.upper)
                for m in plan.measures]
    return (priced.bounded.sql, priced.core_types, [s.sql for s in priced.separate], measures,
            repr(plan.selection), plan.epsilon, plan.delta, priced.cost)


def random_number(rng: random.Random) -> str:
    kind = rng.choice(["small", "int", "wide", "decimal", "decimal", "zero"])
    if kind == "small":
        return str(rng.randint(1, 127))
    if kind == "int":
        return str(rng.randint(128, 70000))
    if kind == "wide":
        return str(rng.randint(2**31, 2**40))
    if kind == "zero":
        return "0"
    return f"{rng.randint(0, 700)}.{rng.randint(0, 9999):0{rng.randint(1, 4)}d}"


def test_kept_binds_plan_release_and_render_as_a_fresh_uncached_prepare():
    """Differential: for many random numbers in every template (compared ones, clamps, CASE
    branches, LIMIT, OPTIONS), the connection that keeps binds prepares exactly what a fresh
    connection (nothing kept) prepares: statements, types, sensitivities, bounds, noise scales."""
    import dpsql

    rng = random.Random(382)
    connection = bind_shop()
    compared = 0
    with dpsql.connect(connection, policy=BIND_POLICY) as warm:
        for _ in range(8):
            for template in TEMPLATES:
                sql = template.format(a=random_number(rng), b=rng.randint(1, 99), c=rng.choice([5, 100, 1000, 70000]))
                delta = 1e-6 if rng.random() < 0.5 else None
                with dpsql.connect(connection, policy=BIND_POLICY) as cold:
                    try:
                        expected = prepared_facts(cold, sql, delta=delta)
                    except dpsql.DPError as refusal:
                        with pytest.raises(type(refusal)):
                            prepared_facts(warm, sql, delta=delta)
                        continue
                assert prepared_facts(warm, sql, delta=delta) == expected, sql
                compared += 1
        assert warm._preparer._bound  # the binds were kept (the test compares something)
    assert compared >= 60


def test_numbers_that_bound_a_value_change_the_noise_though_the_bind_is_kept():
    """Texts differing only in a number that bounds an aggregated value (a per-group contribution
    bound, a factor) get different noise, each exactly the fresh prepare's, on a connection whose
    bind of the text's compared threshold is kept; and a compared number that narrows a range
    (WHERE amount < k, BETWEEN) plans as the fresh prepare does."""
    import dpsql

    bounding = ["SELECT SUM(amount, contribution_bounds_per_group => (0, {})) AS s FROM visits WHERE age < 40",
                "SELECT SUM(amount * {}) AS s FROM visits WHERE age < 40",
                "SELECT SUM(amount / {}) AS s FROM visits WHERE age < 40"]
    narrowing = ["SELECT SUM(amount) AS s FROM visits WHERE amount < {} AND age < 40",
                 "SELECT AVG(amount) AS s FROM visits WHERE amount BETWEEN 10 AND {} AND age < 40",
                 "SELECT store, SUM(amount) AS s FROM visits WHERE amount <= {} AND age < 40 GROUP BY store"]
    connection = bind_shop()
    with dpsql.connect(connection, policy=BIND_POLICY) as warm:
        warm.sql("SELECT COUNT(*) AS n FROM visits WHERE age < 39", epsilon=1)  # a bind kept for "age < ?"
        for template in bounding + narrowing:
            plans = [warm._prepare(template.format(v), 1, None, None, None, None).plan for v in ("50", "100")]
            noise = [[m.scale * m.grid for m in plan.measures] for plan in plans]
            if template in bounding:
                assert noise[0] != noise[1], template
            for value in ("50", "100"):
                with dpsql.connect(connection, policy=BIND_POLICY) as cold:
                    assert prepared_facts(warm, template.format(value)) == prepared_facts(cold, template.format(value))


def test_a_new_threshold_of_the_same_class_is_not_bound_again(monkeypatch):
    import dpsql
    from dpsql.backends import duckdb as engine_module

    bound: list[str] = []
    original = engine_module.Engine.describe

    def counting(self, statement, *args, **kwargs):
        bound.append(statement if isinstance(statement, str) else "")
        return original(self, statement, *args, **kwargs)

    monkeypatch.setattr(engine_module.Engine, "describe", counting)
    with dpsql.connect(bind_shop(), policy=BIND_POLICY) as db:
        texts = ["SELECT COUNT(*) AS n FROM visits WHERE amount < {}".format(v)
                 for v in ("590.5", "591.7", "12.25", "7", "9", "300")]
        counts = []
        for text in texts:
            before = len(bound)
            db.sql(text, epsilon=1)
            counts.append(len(bound) - before)
        # 590.5 binds; 591.7 is kept; 12.25 (two decimals), 7 (an integer) and 300 (beyond TINYINT) bind
        assert counts == [1, 0, 1, 1, 0, 1]


def test_a_refused_bind_is_never_kept():
    """A statement that does not bind is refused before the charge every time."""
    import dpsql

    with dpsql.connect(bind_shop(), policy=BIND_POLICY) as db:
        spent = db.budget.spent
        for value in ("5", "6"):
            with pytest.raises(dpsql.DPError):
                db.sql(f"SELECT COUNT(*) AS n FROM visits WHERE store < {value}", epsilon=1)
        assert db.budget.spent == spent
        assert not db._preparer._bound


def test_a_new_threshold_does_not_bind_a_joins_statement_or_an_expression_key_again(monkeypatch):
    """A text differing only in a compared number binds neither its statement (a JOIN's) nor its
    keys (a key that is an expression is typed by binding it) again, and prepares as a fresh
    connection does."""
    import dpsql
    from dpsql.backends import duckdb as engine_module

    bound: list[str] = []
    original = engine_module.Engine.describe

    def counting(self, statement, *args, **kwargs):
        bound.append(statement if isinstance(statement, str) else statement.sql())
        return original(self, statement, *args, **kwargs)

    monkeypatch.setattr(engine_module.Engine, "describe", counting)
    join = ("SELECT s.city, COUNT(*) AS n FROM visits AS v JOIN stores AS s ON v.store = s.store "
            "WHERE v.amount < {} GROUP BY s.city")
    connection = bind_shop()
    with dpsql.connect(connection, policy=BIND_POLICY) as db:
        db.sql(join.format("590.5"), epsilon=1)
        before = len(bound)
        db.sql(join.format("591.5"), epsilon=1)
        assert not [sql for sql in bound[before:] if "591.5" in sql]  # neither the statement nor its keys bound
        with dpsql.connect(connection, policy=BIND_POLICY) as cold:
            assert prepared_facts(db, join.format("592.5")) == prepared_facts(cold, join.format("592.5"))
        keyed = "SELECT amount > {} AS big, COUNT(*) AS n FROM visits GROUP BY amount > {}"
        db.sql(keyed.format("250.5", "250.5"), epsilon=1, delta=1e-6)  # a key whose SQL holds the number
        before = len(bound)
        db.sql(keyed.format("260.5", "260.5"), epsilon=1, delta=1e-6)
        assert not [sql for sql in bound[before:] if "260.5" in sql]
        with dpsql.connect(connection, policy=BIND_POLICY) as cold:
            assert prepared_facts(db, keyed.format("270.5", "270.5"), delta=1e-6) == \
                prepared_facts(cold, keyed.format("270.5", "270.5"), delta=1e-6)
