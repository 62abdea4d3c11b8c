"""What query time can still reveal: one target user present versus absent (issue 6, item 6).

Shop-like data (``--rows`` visits, one user per ten rows, 80-character notes), and a target
user with 1, 10 or 10,000 rows of its own (400-character notes). For a handful of query
shapes — plain aggregates, a filter that selects the target, the most expensive row-level
expression the allow-list admits evaluated for the target's rows only, a quantile, a
private-key GROUP BY and a private self-join — each query runs ``--runs`` times end to end
(``db.sql``, a fresh epsilon each run so that no answer is a free repeat), alternating present
and absent. Reported: median milliseconds each way, the difference, and whether a one-sided
Mann-Whitney test at 1% tells the two apart. A last table shows how time grows with the table
size (which is acceptable to reveal).

Run: ``python benchmarks/bench_timing.py [--rows 200000] [--runs 15]``; prints Markdown.
"""

from __future__ import annotations

import argparse
import datetime
import platform
import statistics
import time

import numpy as np
import pandas as pd
from scipy import stats

import dpsql

TARGET = 424242
POLICY = """
BUDGET EPSILON 100000000 DELTA 0.5;
PRIVATE TABLE visits (PRIVACY UNIT user_id, MAX ROWS PER UNIT 10, MAX GROUPS PER UNIT 5,
                      amount BOUNDS 0 TO 500, store KEYS FROM stores.store);
PUBLIC TABLE stores;
PUBLIC TABLE fanout;
"""
HEAVY = "(" + " || ".join(["note"] * 5) + ") LIKE '%" + "a_" * 30 + "c%'"
"""The costliest row-level test the allow-list admits, roughly: four concatenations and a
64-character LIKE pattern full of single-character wildcards (matching is |value| x |pattern|)."""
SHAPES = {
    "COUNT(*)": "SELECT COUNT(*) FROM visits",
    "store, AVG(amount) GROUP BY store": "SELECT store, AVG(amount) FROM visits GROUP BY store",
    "COUNT(*) WHERE user_id = target": f"SELECT COUNT(*) FROM visits WHERE user_id = {TARGET}",
    "costliest allowed expression, target's rows only":
        f"SELECT COUNT(*) FROM visits WHERE CASE WHEN user_id = {TARGET} THEN {HEAVY} ELSE FALSE END",
    "MEDIAN(amount) WHERE user_id = target": f"SELECT MEDIAN(amount) FROM visits WHERE user_id = {TARGET}",
    "zip, COUNT(*) GROUP BY zip (partition selection)": "SELECT zip, COUNT(*) FROM visits GROUP BY zip",
    "self-join on the unit":
        "SELECT SUM(CASE WHEN a.amount > b.amount THEN 1 ELSE 0 END) FROM visits a JOIN visits b ON a.user_id = b.user_id",
    # Every store has FAN_OUT rows in `fanout`, the default MAX JOIN MULTIPLICITY: the target's
    # k rows become k·m joined rows, each evaluating the costliest expression (invariant 17).
    "join at MAX JOIN MULTIPLICITY, costliest expression on the target's joined rows":
        f"SELECT COUNT(*) FROM visits v JOIN fanout f ON v.store = f.store "
        f"WHERE CASE WHEN v.user_id = {TARGET} THEN {HEAVY.replace('note', 'v.note')} ELSE FALSE END",
    "join at MAX JOIN MULTIPLICITY, GROUP BY a public column":
        "SELECT f.slot, COUNT(*) FROM visits v JOIN fanout f ON v.store = f.store GROUP BY f.slot",
}
STORES = [f"store{i}" for i in range(50)]
FAN_OUT = 100


def data(rows: int, target_rows: int, present: bool, seed: int = 7) -> dict:
    rng = np.random.default_rng(seed)
    users = max(rows // 10, 1)
    frame = pd.DataFrame({
        "user_id": rng.integers(1, users + 1, rows),
        "store": rng.choice(STORES, rows),
        "amount": rng.uniform(0, 600, rows),
        "zip": rng.integers(10000, 10100, rows).astype(str),
        "note": rng.choice(["ab" * 40, "cd" * 40], rows),
    })
    if present:
        target = pd.DataFrame({"user_id": TARGET, "store": "store0", "amount": 1e6, "zip": "00000",
                               "note": "ab" * 200}, index=range(target_rows))
        frame = pd.concat([frame, target], ignore_index=True)
    fanout = pd.DataFrame([(store, slot) for store in STORES for slot in range(FAN_OUT)], columns=["store", "slot"])
    return {"visits": frame, "stores": pd.DataFrame({"store": STORES}), "fanout": fanout}


def measure(rows: int, target_rows: int, runs: int, shapes: dict) -> dict[str, tuple[list[float], list[float]]]:
    times = {name: ([], []) for name in shapes}
    # Bounded copies built at connect, as the server does: no query's time includes them.
    connections = {present: dpsql.connect(data(rows, target_rows, present), policy=POLICY, query_timeout=60,
                                          eager_bounding=True)
                   for present in (True, False)}
    try:
        for run in range(runs + 1):
            for name, sql in shapes.items():
                if "costliest" in name and target_rows > 1000 and run > 5:
                    continue  # seconds per run, and plainly distinguishable
                for present in ((True, False) if run % 2 else (False, True)):
                    epsilon = 0.5 + run * 1e-6   # a new epsilon: never a free repeat
                    started = time.perf_counter()
                    try:
                        connections[present].sql(sql, epsilon=epsilon, delta=1e-6 if "zip" in sql else 0)
                    except dpsql.DPError:
                        pass
                    if run:  # the first round warms up
                        times[name][0 if present else 1].append((time.perf_counter() - started) * 1000)
    finally:
        for connection in connections.values():
            connection.close()
    return times


def table(rows: int, runs: int, shapes: dict) -> str:
    lines = [f"Target present vs absent, {rows:,} other rows, median ms of {runs} runs each "
             "(Mann-Whitney, one-sided, 1%):", "",
             "| query | target rows | present | absent | difference | distinguishable |", "|---|---|---|---|---|---|"]
    for target_rows in (1, 10, 10_000):
        for name, (present, absent) in measure(rows, target_rows, runs, shapes).items():
            p = stats.mannwhitneyu(present, absent, alternative="greater").pvalue
            a, b = statistics.median(present), statistics.median(absent)
            lines.append(f"| {name} | {target_rows:,} | {a:.1f} | {b:.1f} | {a - b:+.1f} | {'yes' if p < 0.01 else 'no'} |")
    return "\n".join(lines)


def size_table(runs: int) -> str:
    lines = ["Table size, no target, median ms:", "", "| rows | COUNT(*) | store, AVG(amount) GROUP BY store |",
             "|---|---|---|"]
    for rows in (10_000, 100_000, 1_000_000):
        with dpsql.connect(data(rows, 0, False), policy=POLICY) as db:
            cells = []
            for sql in (SHAPES["COUNT(*)"], SHAPES["store, AVG(amount) GROUP BY store"]):
                samples = []
                for run in range(runs):
                    started = time.perf_counter()
                    db.sql(sql, epsilon=0.5 + run * 1e-6)
                    samples.append((time.perf_counter() - started) * 1000)
                cells.append(f"{statistics.median(samples):.1f}")
        lines.append(f"| {rows:,} | {' | '.join(cells)} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=200_000)
    parser.add_argument("--runs", type=int, default=15)
    parser.add_argument("--only", default="", help="run only the shapes whose name contains this text")
    args = parser.parse_args()
    shapes = {name: sql for name, sql in SHAPES.items() if args.only in name}
    print(f"`python benchmarks/bench_timing.py --rows {args.rows} --runs {args.runs}` "
          f"({datetime.date.today()}, {platform.system()}, Python {platform.python_version()}, "
          f"duckdb {__import__('duckdb').__version__})\n")
    print(table(args.rows, args.runs, shapes))
    if not args.only:
        print()
        print(size_table(max(args.runs // 3, 5)))


if __name__ == "__main__":
    main()
