"""Tests of dpsql.query.release: the vectorised release equals, value for value and type for type, the
per-cell ``Fraction`` release it replaced (kept below as the reference), for the same noise.

Each case builds a real plan and its exact rows as ``Connection.sql`` does, then releases it
twice from the same seed: once with dpsql.query.release, once with the reference. Other cases feed
both the same hand-made noisy measures (negative, zero, one, past 2**53 and past int64) so every
exact path of the vectorised code runs.
"""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pandas as pd
import pytest

import dpsql
from dpsql.query import release
from dpsql.backends.rewrite import rewrite_statement, separate_statement
from dpsql.mechanisms import noise
from dpsql.mechanisms.noise import SeededSource
from dpsql.mechanisms.quantile import edge, release_interval
from dpsql.mechanisms.selection import SelectionRule, select_partitions
from dpsql.query.release import Release

# ---------------------------------------------------------------- the reference (per-cell Fractions)


def reference_release_measures(plan, domain, exact_rows, source=None, histograms=None) -> Release:
    width = len(plan.query.keys)
    exact_by_key = {tuple(row[:width]): row[width:] for row in exact_rows}
    if plan.selection is None:
        keys = [tuple(k) for k in domain]
    else:
        candidates = sorted(exact_by_key, key=_reference_sort_key)
        units = [int(exact_by_key[k][len(plan.summed)] or 0) for k in candidates]
        selection = plan.selection
        rule = SelectionRule(scale=selection.scale, threshold=selection.threshold, epsilon=selection.epsilon,
                             delta=selection.delta, groups_per_unit=0, neighbours=plan.neighbours)
        mask = select_partitions(units, rule, source)
        keys = [k for k, keep in zip(candidates, mask) if keep]
    noisy = {}
    for index, measure in enumerate(plan.summed):
        exact = [int(exact_by_key[k][index] or 0) if k in exact_by_key else 0 for k in keys]
        noisy[measure.name] = tuple(e + int(z) for e, z in zip(exact, _reference_draw(measure, len(exact), source)))
    for measure in plan.separate:
        if measure.kind == "distinct":
            counts = {tuple(r[:width]): int(r[width] or 0) for r in (histograms or {}).get(measure.name, [])}
            exact = [counts.get(k, 0) for k in keys]
            noisy[measure.name] = tuple(e + int(z) for e, z in zip(exact, _reference_draw(measure, len(exact), source)))
    chosen, edges = {}, {}
    for aggregate in plan.aggregates:
        if aggregate.function == "quantile":
            rows = (histograms or {}).get(aggregate.measures[0], [])
            buckets = aggregate.rule.buckets
            counts = {key: [0] * buckets for key in keys}
            for row in rows:
                key, bucket, count = tuple(row[:width]), int(row[width]), int(row[width + 1] or 0)
                if key in counts:
                    counts[key][bucket] += count
            # The value and its interval's endpoints, drawn per key in that order.
            drawn = tuple(release_interval(counts[key], aggregate.rule, source) for key in keys)
            edges[aggregate.measures[0]] = drawn
            chosen[aggregate.measures[0]] = tuple(edge(aggregate.rule, j) for j, _, _ in drawn)
    return Release(keys=tuple(keys), noisy=noisy, chosen=chosen, edges=edges)


def _reference_sort_key(key):
    return tuple((value is None, str(type(value)), value if value is not None else 0) for value in key)


def _reference_draw(measure, size, source):
    if measure.noise == "none":
        return [0] * size
    if measure.noise == "gaussian":
        return noise.discrete_gaussian(measure.scale, size, source)
    return noise.discrete_laplace(measure.scale, size, source)


def reference_core_rows(plan, released) -> list[tuple]:
    columns = [_reference_values(plan, released, aggregate) for aggregate in plan.aggregates]
    return [tuple(key) + tuple(column[i] for column in columns) for i, key in enumerate(released.keys)]


def _reference_values(plan, released, aggregate) -> list:
    measures = [plan.measure(name) for name in aggregate.measures]
    first = measures[0]
    if aggregate.function == "quantile":
        return [float(value) for value in released.chosen[first.name]]
    series = [released.noisy[m.name] for m in measures]
    function = aggregate.function
    if function in ("count", "count_units", "count_distinct"):
        return [max(n, 0) for n in series[0]]
    if function == "sum":  # kept on the side of 0 the bounds allow
        signed = [max(n, 0) if first.lower >= 0 else min(n, 0) if first.upper <= 0 else n for n in series[0]]
        return [_reference_on_grid(n, first.grid) for n in signed]
    if function == "avg":
        return [_reference_average(s, c, first, aggregate) for s, c in zip(*series)]
    return [_reference_variance(s, q, c, first, aggregate) for s, q, c in zip(*series)]


def _reference_on_grid(units, grid):
    value = units * grid
    return int(value) if grid.denominator == 1 else float(value)


def _reference_average(centred_sum, count, measure, aggregate):
    if count <= 0:
        return float((aggregate.lower + aggregate.upper) / 2)
    average = measure.grid * (Fraction(centred_sum, count) + measure.lower + measure.upper) / 2
    return float(min(max(average, aggregate.lower), aggregate.upper))


def _reference_variance(centred_sum, squares, count, measure, aggregate):
    largest = (aggregate.upper - aggregate.lower) ** 2 / 4
    if count <= 0 or (aggregate.sample and count <= 1):
        value = Fraction(0)
    else:
        mean = Fraction(centred_sum, count)
        value = measure.grid**2 * (Fraction(squares, count) - mean * mean) / 4
        if aggregate.sample:
            value = value * count / (count - 1)
    value = min(max(value, Fraction(0)), largest)
    return math.sqrt(value) if aggregate.function == "stddev" else float(value)


# ---------------------------------------------------------------- plans and exact rows

RNG = np.random.default_rng(20240607)
UNITS = 300
VISITS = pd.DataFrame({
    "uid": RNG.integers(0, UNITS, 3000),
    "store": RNG.choice(["a", "b", "c", "zzz"], 3000, p=[0.5, 0.3, 0.1, 0.1]),  # 'zzz' is not public
    "day": RNG.integers(0, 5, 3000),
    "amount": np.where(RNG.random(3000) < 0.05, np.nan, RNG.random(3000) * 120 - 10),
    "items": RNG.integers(0, 9, 3000),
    "city": RNG.choice(["x", "y", None], 3000),
})
STORES = pd.DataFrame({"store": ["a", "b", "c", "d", "e"]})  # 'd' and 'e' have no rows
POLICY = """
BUDGET EPSILON 1000000 DELTA 0.5;
PRIVATE TABLE visits (PRIVACY UNIT uid, MAX ROWS PER UNIT 4, MAX GROUPS PER UNIT 2,
                      amount BOUNDS -5.5 TO 100, items BOUNDS 0 TO 8,
                      store KEYS FROM stores.store, day KEYS (0, 1, 2, 3, 4, 7));
PUBLIC TABLE stores;
"""

CASES = [
    ("SELECT store, COUNT(*), SUM(amount), SUM(items), AVG(amount), AVG(items) FROM visits GROUP BY store",
     Fraction(1), None, None),
    ("SELECT store, day, COUNT(*), VARIANCE(amount), STDDEV(amount), VAR_POP(items), STDDEV_POP(amount) "
     "FROM visits GROUP BY store, day", Fraction(2), None, None),
    ("SELECT COUNT(*), SUM(amount), AVG(amount), VARIANCE(amount), STDDEV_POP(items) FROM visits",
     Fraction(1, 10), None, None),
    ("SELECT COUNT(*), SUM(amount), AVG(amount), VAR_SAMP(amount) FROM visits WHERE amount > 1000",
     Fraction(1), None, None),  # no rows at all
    ("SELECT store, COUNT(*), SUM(amount), AVG(amount), STDDEV(items) FROM visits GROUP BY store",
     Fraction(1), Fraction(1, 10**6), "gaussian"),
    ("SELECT city, COUNT(*), SUM(amount), AVG(items), VARIANCE(amount) FROM visits GROUP BY city",
     Fraction(5), Fraction(1, 10**6), None),  # private keys (NULL among them): partition selection
    ("SELECT city, store, COUNT(*), SUM(items) FROM visits GROUP BY city, store",
     Fraction(50), Fraction(1, 10**6), None),
    ("SELECT store, COUNT(DISTINCT items), MEDIAN(amount), SUM(items) FROM visits GROUP BY store",
     Fraction(3), None, None),
    ("SELECT store, COUNT(DISTINCT uid), SUM(items) FROM visits GROUP BY store", Fraction(1), None, None),
    ("SELECT day, COUNT(*), SUM(items), AVG(amount) FROM visits GROUP BY day",  # integer keys, 7 without rows
     Fraction(1), None, None),
    ("SELECT day, COUNT(*), SUM(items), AVG(amount), VARIANCE(items) FROM visits GROUP BY day",  # coarse grids
     Fraction(1, 10**9), None, None),
    ("SELECT items, COUNT(*), SUM(amount) FROM visits GROUP BY items", Fraction(20), Fraction(1, 10**6), None),
]


@pytest.fixture(scope="module")
def db():
    with dpsql.connect({"visits": VISITS, "stores": STORES}, policy=POLICY, rng=SeededSource(1)) as connection:
        yield connection


def prepare(db, sql: str, epsilon, delta, noise_kind):
    """(plan, domain, exact rows, histograms), as ``Connection.sql`` builds them."""
    _, checked, _ = db._check(sql)
    plan = db._preparer.plan(checked, sql, epsilon, delta, noise_kind)
    bounded = rewrite_statement(plan)
    exact = db._engine.fetch(bounded.sql, db._executor.salt_for(bounded.needs_salt), bounded=checked.bounded)
    histograms = {}
    for measure in plan.separate:
        separate = separate_statement(plan, measure)
        histograms[measure.name] = db._engine.fetch(separate.sql, db._executor.salt_for(separate.needs_salt),
                                                    bounded=checked.bounded)
    domain = db._answerer.domains.domain(checked) if plan.selection is None else None
    return plan, domain, exact, histograms


def same(new, old) -> None:
    """Equal values of equal types (repr tells 1 from 1.0, -0.0 from 0.0 and numpy from Python)."""
    assert repr(new) == repr(old)


# ---------------------------------------------------------------- the tests


@pytest.mark.parametrize("sql, epsilon, delta, noise_kind", CASES)
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_release_equals_the_per_cell_reference_for_the_same_noise(db, sql, epsilon, delta, noise_kind, seed):
    plan, domain, exact, histograms = prepare(db, sql, epsilon, delta, noise_kind)
    new = release.release_measures(plan, domain, exact, SeededSource(seed), histograms)
    old = reference_release_measures(plan, domain, exact, SeededSource(seed), histograms)
    same(new, old)
    same(release.core_rows(plan, new), reference_core_rows(plan, old))


@pytest.mark.parametrize("sql, epsilon, delta, noise_kind", CASES)
def test_release_of_extreme_noisy_measures_equals_the_reference(db, sql, epsilon, delta, noise_kind):
    """Noisy values at every edge: <= 0 and 1 (counts), past 2**53 (floats) and past int64."""
    plan, *_ = prepare(db, sql, epsilon, delta, noise_kind)
    edges = [0, 1, -1, 2, -2, 3, 7, 10**6, -10**6, 2**53 - 1, 2**53, 2**53 + 1, -(2**53) - 3,
             2**62, 2**63 - 1, -(2**63), 2**63, 2**64 + 5, -(2**70), 3**60]
    rng = np.random.default_rng(5)
    within_int64 = [0, 1, -1, 3, -7, 2**53 + 1, 2**56 + 1, -(2**56), 2**62, -(2**62), 2**63 - 1]
    for column_values in (edges, within_int64, [int(v) for v in rng.integers(-50, 50, 40)],
                          [int(v) for v in rng.integers(-2**40, 2**40, 40)], [5, 2**80]):
        size = len(column_values)
        noisy = {m.name: tuple(int(v) for v in rng.permutation(np.array(column_values, dtype=object)))
                 for m in plan.noised}
        chosen = {m.name: tuple(m.offset + int(j) * m.grid for j in rng.integers(0, 1024, size))
                  for m in plan.histograms}
        made = Release(keys=tuple((f"k{i}",) * len(plan.query.keys) for i in range(size)), noisy=noisy,
                       chosen=chosen)
        same(release.core_rows(plan, made), reference_core_rows(plan, made))


def test_keys_missing_from_the_exact_rows_release_noise_around_zero(db):
    plan, domain, exact, histograms = prepare(db, CASES[0][0], Fraction(1), None, None)
    empty = release.release_measures(plan, domain, [], SeededSource(4), histograms)
    same(empty, reference_release_measures(plan, domain, [], SeededSource(4), histograms))
    assert [key[0] for key in empty.keys] == ["a", "b", "c", "d", "e"]


def test_exact_rows_with_nulls_and_huge_sums_are_added_exactly(db):
    plan, domain, _, histograms = prepare(db, CASES[0][0], Fraction(1), None, None)
    width = len(plan.summed)
    past_int64 = [("a",) + (None,) * width, ("b",) + (2**70,) * width, ("zzz",) + (5,) * width,
                  ("c",) + (-(2**62),) * width]
    at_int64_edges = [("a",) + (2**63 - 1,) * width, ("b",) + (-(2**63),) * width, ("c",) + (None,) * width,
                      ("d",) + (2**63 - 2,) * width, ("e",) + (1 - 2**63,) * width]
    for rows in (past_int64, at_int64_edges):
        new = release.release_measures(plan, domain, rows, SeededSource(6), histograms)
        same(new, reference_release_measures(plan, domain, rows, SeededSource(6), histograms))
        same(release.core_rows(plan, new), reference_core_rows(plan, new))
