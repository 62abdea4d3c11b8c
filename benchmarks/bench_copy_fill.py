"""The bounded copy's fill statement, timed against the form it replaced (issue 21).

    python benchmarks/bench_copy_fill.py --rows 1000000 10000000

On the shop data of ``bench_scale.py`` (generated into its cache on first use), times, alternately
in one process, (a) ``dpsql.backends.bounding.fill_sql`` as it is — rows of each unit ordered by
a keyed hash of each column's exact parts, ties broken by those parts — and (b) the same
statement with the order DuckDB's ``hash($salt, cols), cols`` gave before issue 21, plus a plain
``CREATE TABLE AS SELECT *`` of the table for scale. Prints medians and minima.
"""

from __future__ import annotations

import argparse
import re
import statistics
import time

import duckdb
from bench_scale import cache_dir, ensure_data

from dpsql.backends import bounding


def measure(path: str, rounds: int) -> dict[str, list[float]]:
    con = duckdb.connect(path, read_only=True)
    con.execute("SET enable_progress_bar = false")
    columns = tuple(con.execute("SELECT column_name, column_type FROM (DESCRIBE visits)").fetchall())
    con.execute(bounding.attach_sql())
    table = bounding.BoundedTable("visits", "user_id", 10, columns)
    now = bounding.fill_sql(table)
    names = ", ".join(bounding.quoted(c) for c, _ in columns)
    before = re.sub(r"ORDER BY .*?\) AS dp_n", f"ORDER BY hash($salt, {names}), {names}) AS dp_n", now, flags=re.S)
    times: dict[str, list[float]] = {"keyed hash of exact parts": [], "hash($salt, cols), cols": [], "plain copy": []}
    plain = "CREATE OR REPLACE TABLE dp_bounding.dp_plain AS SELECT * FROM visits"
    for i in range(rounds):
        order = [("keyed hash of exact parts", now), ("hash($salt, cols), cols", before)]
        for name, sql in (order if i % 2 == 0 else order[::-1]) + [("plain copy", plain)]:
            start = time.perf_counter()
            con.execute(sql, {"salt": "bench"} if "$salt" in sql else None)
            times[name].append(time.perf_counter() - start)
    con.close()
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, nargs="+", default=[1_000_000])
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--cache", default=None, help="the shop data's directory (bench_scale.py's default)")
    args = parser.parse_args()
    for rows in args.rows:
        path = ensure_data(rows, cache_dir(args.cache))
        for name, values in measure(str(path), args.rounds).items():
            print(f"{rows:>10,} rows  {name:28s} median {statistics.median(values):.3f} s  min {min(values):.3f} s")


if __name__ == "__main__":
    main()
