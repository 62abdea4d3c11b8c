"""The empirical privacy audit end to end: every release through ``db.sql`` (issue 6, item 8).

``tests/test_audit.py`` samples the release step on exact aggregates computed once; this runs
the whole pipeline instead — parse, check, plan, charge, rewrite, DuckDB, the secure noise
source, post-processing — ``--releases`` times on each of two neighbouring databases (the
same D and D' as the test: one unit with 40 rows far beyond the bounds, a key nobody else has),
for COUNT, SUM, AVG, a grouped cell, a quantile (MEDIAN), partition selection, a COUNT on a
25% Poisson sample of the units (``TABLESAMPLE POISSON``: claimed, the amplified epsilon), the
mechanisms for many queries and a one-step model fit (``db.fit``: a coefficient). Each release
is a distinct query (a no-op condition of its own), so none is a free repeat.

The first ``--pilot`` releases of each side choose the threshold event; the rest give a
Clopper-Pearson lower bound on its privacy loss (``tests/audit.py``), printed next to the
claimed epsilon. Run: ``python benchmarks/bench_audit.py [--releases 2000] [--pilot 300]``.
"""

from __future__ import annotations

import argparse
import datetime
import platform
import sys
import time
from fractions import Fraction
from pathlib import Path

import numpy as np

sys.path[:0] = [str(Path(__file__).resolve().parent.parent), str(Path(__file__).resolve().parent.parent / "tests")]

from audit import loss_lower_bound, thresholds  # noqa: E402
from test_audit import (  # noqa: E402
    BOUNDED,
    EDGE_KEYS,
    QUANTILE_EPSILON,
    STORES,
    base,
    quantile_base,
    selection_base,
    worst_unit,
)

import dpsql  # noqa: E402
from dpsql.budget.amplification import amplified_epsilon  # noqa: E402

SELECTION_DELTA = 1e-4
"""Delta of each partition-selection release: thousands of them must fit the policy's delta of 0.5.
Its epsilon is 4 (2 for the selection), where 2,000 releases a side give a useful bound."""

CLASSES = {
    # name: (query, epsilon, delta, how to read the released value from the rows)
    "COUNT": ("SELECT COUNT(*) FROM visits", 1, 0, lambda rows: rows[0][0]),
    "SUM": ("SELECT SUM(amount) FROM visits", 1, 0, lambda rows: rows[0][0]),
    "AVG": ("SELECT AVG(amount) FROM visits", 1, 0, lambda rows: rows[0][0]),
    "grouped cell": ("SELECT store, SUM(amount) FROM visits GROUP BY store", 1, 0,
                     lambda rows: next(r[1] for r in rows if r[0] == "north")),
    "quantile": ("SELECT MEDIAN(amount) FROM visits", QUANTILE_EPSILON, 0, lambda rows: rows[0][0]),
    "partition selection": ("SELECT zip, COUNT(*) FROM visits GROUP BY zip", 4, SELECTION_DELTA,
                            lambda rows: tuple(key in {r[0] for r in rows} for key in EDGE_KEYS)),
    # The sparse vector's one-query stream, its threshold halfway between D's count and D''s (one
    # unit adds MAX ROWS PER UNIT = 5 rows): the released bit is "above". One query's loss is well
    # below the stream's epsilon (the proof pays for every query's noise); at epsilon 4 it is
    # large enough for 2,000 releases a side to bound.
    "sparse vector": ("SELECT * FROM above_threshold('SELECT COUNT(*) FROM visits', threshold = {threshold})", 4, 0,
                      lambda rows: float(rows[0][2])),
    # A fresh secret sample of the units per release; claimed: the amplified epsilon it is charged.
    "Poisson sample (25%)": ("SELECT COUNT(*) FROM visits TABLESAMPLE POISSON (25 PERCENT)", 2, 0,
                             lambda rows: rows[0][0]),
    # A one-query workload in one round: the answer is its measurement (epsilon 4: n̂ 0.4, the
    # forced selection 1.8, the measurement 1.8), through the SQL form of db.workload.
    "MWEM workload (one round)": ("SELECT * FROM workload('SELECT COUNT(*) FILTER (WHERE store = ''north'') "
                                  "FROM visits', rounds = 1)", 4, 0, lambda rows: rows[0][2]),
    # A one-step linear fit (issue 25) of amount on "visits north": its coefficient after one
    # noisy gradient step (clip 1, the count and the step at epsilon 4, delta 1e-5 in all).
    "fit (linear, one step)": ("SELECT * FROM fit('SELECT CASE WHEN store = ''north'' THEN 1 ELSE 0 END AS north, "
                               "amount FROM visits', target = 'amount', steps = 1, learning_rate = 1)", 4, 1e-5,
                               lambda rows: rows[1][1]),
}
CLAIMED = {"Poisson sample (25%)": float(amplified_epsilon(Fraction(2), Fraction(1, 4)))}
"""What a class is charged when that is not the epsilon it asks for."""


def selection_plan():
    """The partition selection of the audited query: static, so read off its plan."""
    sql = CLASSES["partition selection"][0]
    with dpsql.connect({"visits": base(), "stores": STORES}, policy=BOUNDED) as probe:
        _, checked, _ = probe._check(sql)
        return probe._preparer.plan(checked, sql, CLASSES["partition selection"][1], SELECTION_DELTA, None).selection


def neighbours(name: str):
    if name == "quantile":
        frame = quantile_base()
        return frame, worst_unit(frame)
    if name == "partition selection":
        frame = selection_base(selection_plan().threshold)
        return frame, worst_unit(frame, rows=6, zips=EDGE_KEYS)
    frame = base()
    return frame, worst_unit(frame)


def releases(frame, name: str, count: int) -> np.ndarray:
    sql, epsilon, delta, read = CLASSES[name]
    sql = sql.format(threshold=len(base()) + 2.5)  # (only the sparse vector's has a threshold)
    values = []
    with dpsql.connect({"visits": frame, "stores": STORES}, policy=BOUNDED) as db:  # secure noise, in-memory ledger
        for i in range(count):
            unique = f"{sql} WHERE {i} = {i}" if "TABLESAMPLE" in sql else \
                sql.replace(" FROM visits", f" FROM visits WHERE {i} = {i}")
            rows = db.sql(unique, epsilon=epsilon, delta=delta).fetchall()
            values.append(read(rows))
    return np.array(values, dtype=float)


def audit(name: str, count: int, pilot: int) -> tuple[float, float, int, float]:
    d, d2 = neighbours(name)
    started = time.perf_counter()
    first, second = releases(d, name, count + pilot), releases(d2, name, count + pilot)
    seconds = time.perf_counter() - started
    if first.ndim == 2:   # partition selection: events on the keys, all / none / each
        # The keys the unit was counted in (MAX GROUPS PER UNIT of its six): those the pilot
        # releases more often on D'.
        moved = [i for i in range(len(EDGE_KEYS)) if second[:pilot, i].mean() > first[:pilot, i].mean() + 0.05] or [0]
        events = [lambda x, m=moved: x[:, m].all(axis=1) > 0, lambda x, m=moved: ~(x[:, m].any(axis=1) > 0)]
        events += [lambda x, i=i: x[:, i] > 0 for i in range(len(EDGE_KEYS))]
        claimed = float(selection_plan().epsilon)   # the selection's share of the query's epsilon
    else:
        events = thresholds(np.concatenate([first[:pilot], second[:pilot]]))
        claimed = CLAIMED.get(name, float(CLASSES[name][1]))
    bound = loss_lower_bound(first[pilot:], second[pilot:], events)
    return claimed, bound, count, seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--releases", type=int, default=2000)
    parser.add_argument("--pilot", type=int, default=300)
    parser.add_argument("--only", nargs="*", default=list(CLASSES))
    args = parser.parse_args()
    print(f"`python benchmarks/bench_audit.py --releases {args.releases} --pilot {args.pilot}` "
          f"({datetime.date.today()}, {platform.system()}, Python {platform.python_version()})\n")
    print("| query class | claimed epsilon | releases per side | lower bound on the loss | seconds |")
    print("|---|---|---|---|---|")
    for name in args.only:
        claimed, bound, count, seconds = audit(name, args.releases, args.pilot)
        print(f"| {name} | {claimed:g} | {count} | {bound:.3f} | {seconds:.0f} |", flush=True)


if __name__ == "__main__":
    main()
