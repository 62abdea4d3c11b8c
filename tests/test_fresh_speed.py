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
