"""Subsampling benchmark (issue 24 item 3): ``db.sql`` time with ``TABLESAMPLE POISSON`` vs without.

On the bench cache's shop database (default ``/work/bench-cache/shop_10000000.duckdb``: 10M
visits, ~1M users; ``benchmarks/bench_scale.py`` builds it), under bench_scale's user-level
policy (``MAX ROWS PER UNIT 10``, ``MAX GROUPS PER UNIT 5``), each query is run end to end through
``db.sql`` (plan, ledger charge, the bounded statement, noise) whole and on 1%, 10% and 50%
Poisson samples of the users. The bounded copy is built before timing (``eager_bounding``), so
every time is a query's own; each run changes epsilon a little, so no run is a free repeat. Also
the amplified epsilon each sample is charged for the query's epsilon 1, and the released value
(a sample's COUNT is about p of the whole).

    .venv/bin/python benchmarks/bench_subsample.py [--db PATH] [--repeats 5]

Prints Markdown (medians of ``--repeats``); the figures are in the report of the change and
benchmarks/RESULTS.md.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from fractions import Fraction
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.append(str(HERE.parent))

from bench_scale import POLICY_USER  # noqa: E402

import dpsql  # noqa: E402

QUERIES = {
    "COUNT": "SELECT COUNT(*) AS n FROM visits{sample}",
    "SUM": "SELECT SUM(amount) AS s FROM visits{sample}",
    "GROUP BY store (50 keys)": "SELECT store, COUNT(*) AS n, SUM(amount) AS s FROM visits{sample} GROUP BY store",
}
SAMPLES = [None, 1, 10, 50]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--db", default="/work/bench-cache/shop_10000000.duckdb")
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    ledger = Path(tempfile.mkdtemp(prefix="dpsql-bench-")) / "bench.ledger"
    start = time.perf_counter()
    db = dpsql.connect(args.db, policy=POLICY_USER, ledger=str(ledger), eager_bounding=True, query_timeout=None)
    print(f"connect with the bounded copy built: {time.perf_counter() - start:.1f} s\n")
    print("| query | whole table | 1% sample | 10% sample | 50% sample |")
    print("|---|---|---|---|---|")
    runs = iter(range(1, 10**9))
    values = {}
    for name, template in QUERIES.items():
        cells = []
        for percent in SAMPLES:
            sql = template.format(sample="" if percent is None else f" TABLESAMPLE POISSON ({percent} PERCENT)")
            db.sql(sql, epsilon=Fraction(1) + Fraction(next(runs), 10**9))  # warm: prepared, pages cached
            times = []
            for _ in range(args.repeats):
                start = time.perf_counter()
                result = db.sql(sql, epsilon=Fraction(1) + Fraction(next(runs), 10**9))
                times.append(time.perf_counter() - start)
                assert not result.repeat
            values[(name, percent)] = (result.fetchall()[0], result.cost.epsilon)
            cells.append(f"{statistics.median(times):.3f} s")
        print(f"| {name} | " + " | ".join(cells) + " |")
    print("\ncharged for epsilon 1 (amplified): " + ", ".join(
        f"{p}%: {float(values[('COUNT', p)][1]):.4f}" for p in SAMPLES if p is not None))
    print("released COUNT: " + ", ".join(
        f"{'whole' if p is None else f'{p}%'}: {values[('COUNT', p)][0][0]}" for p in SAMPLES))


if __name__ == "__main__":
    main()
