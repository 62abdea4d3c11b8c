"""Per-stage timing of dpsql's pipeline against the same query in raw DuckDB.

Generates shop data (about one user per ten rows, very uneven rows per user: user ids drawn
as floor(users * u^3), so a few users have thousands of rows), then for each query reports
medians of 5 runs (after one warm-up) of:

* raw DuckDB: the same aggregate with no privacy;
* plan: parse + bind + check + analyse + rewrite (static, reads no data), computed afresh;
* prepare: the same static half as ``db.sql`` runs it (``dpsql.query.prepare``), with a new epsilon
  each run, so only what the SQL text alone decides comes from the connection's cache;
* execute: the bounded SQL on DuckDB;
* noise: drawing the noise and building the released rows;
* dpsql total: ``db.sql(...)`` end to end, ledger charge included (in-memory ledger);
* overhead: dpsql total minus raw DuckDB.

Run: ``python benchmarks/bench_pipeline.py [--rows 1000 1000000] [--repeats 5]``.
Prints a Markdown table to paste into benchmarks/RESULTS.md.
"""

from __future__ import annotations

import argparse
import datetime
import itertools
import os
import platform
import statistics
import time
from fractions import Fraction

import duckdb

import dpsql
from dpsql.analysis.analyse import PrivacyOptions, analyse_query
from dpsql.analysis.check import check_query
from dpsql.backends.rewrite import rewrite_plan
from dpsql.query.release import core_rows, release_measures
from dpsql.sql.parse import parse_query

POLICY = """
BUDGET EPSILON 1000000;
PRIVATE TABLE visits (
    PRIVACY UNIT user_id, MAX ROWS PER UNIT 10, MAX GROUPS PER UNIT 5,
    amount BOUNDS 0 TO 500, store KEYS FROM stores.store
);
PUBLIC TABLE stores;
"""
QUERIES = {
    "COUNT": ("SELECT COUNT(*) FROM visits", "SELECT COUNT(*) FROM visits"),
    "SUM": ("SELECT SUM(amount) FROM visits", "SELECT SUM(amount) FROM visits"),
    "AVG": ("SELECT AVG(amount) FROM visits", "SELECT AVG(amount) FROM visits"),
    "GROUP BY 50 public keys": (
        "SELECT store, COUNT(*), SUM(amount) FROM visits GROUP BY store",
        "SELECT store, COUNT(*), SUM(amount) FROM visits GROUP BY store",
    ),
}


def build(rows: int) -> duckdb.DuckDBPyConnection:
    con = duckdb.connect()
    users = max(rows // 10, 1)
    con.execute("SELECT setseed(0.42)")
    con.execute("CREATE TABLE stores AS SELECT 'store' || i AS store, i % 7 AS city FROM range(50) t(i)")
    con.execute(f"""
        CREATE TABLE visits AS
        SELECT CAST(floor({users} * pow(random(), 3)) AS INTEGER) AS user_id,
               'store' || CAST(floor(random() * 50) AS INTEGER) AS store,
               round(random() * 600, 2) AS amount
        FROM range({rows})
    """)
    return con


def median_seconds(action, repeats: int = 5) -> float:
    action()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        action()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def bench(rows: int, repeats: int = 5) -> list[dict]:
    con = build(rows)
    db = dpsql.connect(con, policy=POLICY)  # in-memory ledger: the charge is a SQLite insert
    cursor = con.cursor()
    results = []
    # a different epsilon each run: an identical query would be answered for free from the ledger
    epsilons = (1 + Fraction(i, 10**6) for i in itertools.count())
    for name, (dp_sql, raw_sql) in QUERIES.items():
        def plan():
            query = check_query(parse_query(dp_sql), dp_sql, db.policy, db._catalog, db._engine)
            planned = analyse_query(query, db.policy, PrivacyOptions(epsilon=1))
            return planned, rewrite_plan(planned)

        planned, bounded = plan()
        keys = db._answerer.domains.domain(planned.query) if planned.selection is None else None
        salt = {"salt": "00" * 32} if "$salt" in bounded else None
        exact = db._engine.fetch(bounded, salt, bounded=planned.query.bounded)
        results.append({
            "rows": rows,
            "query": name,
            "raw": median_seconds(lambda: cursor.execute(raw_sql).fetchall(), repeats),
            "plan": median_seconds(plan, repeats),
            "prepare": median_seconds(lambda: db._prepare(dp_sql, next(epsilons), None, None, None, None), repeats),
            "execute": median_seconds(lambda: db._engine.fetch(bounded, salt, bounded=planned.query.bounded),
                                      repeats),
            "noise": median_seconds(lambda: core_rows(planned, release_measures(planned, keys, exact)), repeats),
            "total": median_seconds(lambda: db.sql(dp_sql, epsilon=next(epsilons)), repeats),
        })
    db.close()
    return results


def markdown(results: list[dict]) -> str:
    lines = [
        "| rows | query | raw DuckDB | plan (parse→rewrite) | prepare (as sql runs it) | execute | noise "
        "| dpsql total | overhead | ratio |",
        "|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in results:
        lines.append(
            f"| {r['rows']:,} | {r['query']} | {ms(r['raw'])} | {ms(r['plan'])} | {ms(r['prepare'])} | "
            f"{ms(r['execute'])} | "
            f"{ms(r['noise'])} | {ms(r['total'])} | {ms(r['total'] - r['raw'])} | {r['total'] / r['raw']:.1f}× |"
        )
    return "\n".join(lines)


def ms(seconds: float) -> str:
    return f"{seconds * 1000:.2f} ms"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, nargs="+", default=[1000, 1_000_000])
    parser.add_argument("--repeats", type=int, default=5, help="runs per median (more on a busy machine)")
    args = parser.parse_args()
    results = [r for rows in args.rows for r in bench(rows, args.repeats)]
    print(f"Machine: {platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}, "
          f"duckdb {duckdb.__version__}; {datetime.date.today().isoformat()}\n")
    print(markdown(results))


if __name__ == "__main__":
    main()
