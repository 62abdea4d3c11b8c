"""100M rows (issue 7 target: answered within the machine's 24 GiB; DuckDB spills to disk).

Generates the shop data of bench_scale.py at ``--rows`` (default 100,000,000: about 10M users,
a ~0.9 GB DuckDB file) under the cache directory, then runs every (system, query) in its own
process and reports its time (median of ``--repeats`` runs after a warm-up; 3 by default,
since one dpsql run takes tens of seconds here) and its peak memory (the child's maximum
resident set size from ``os.wait4``, DuckDB's buffers included), and the peak size of DuckDB's
spill directory (``<database>.tmp``) sampled every 0.25 s.

Systems: raw DuckDB (the aggregate with no privacy), the per-unit floor (the query's own
per-(unit, group) pre-aggregation), dpsql with the user-level policy of bench_scale.py (its
30 s per-query time limit lifted: ``query_timeout=None``; its memory limit left at the default).
The data file is deleted afterwards unless ``--keep`` (disk use: the file plus any spill).

Run: ``python benchmarks/bench_100m.py [--rows N] [--queries COUNT SUM ...] [--keep]``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from fractions import Fraction
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import bench_scale  # noqa: E402
from bench_scale import QUERIES, timed  # noqa: E402

DEFAULT_QUERIES = ["COUNT", "SUM", "GROUP BY public keys (50)", "GROUP BY private keys (~5000)"]


def child(args) -> None:
    """One (system, query) in this process; prints JSON timings."""
    q = QUERIES[args.query]
    if args.child in ("raw", "floor"):
        import duckdb

        con = duckdb.connect(args.db, read_only=True)
        sql = q["raw"] if args.child == "raw" else q["floor"]
        result = timed(lambda: con.execute(sql).fetchall(), args.repeats, budget=3600)
    else:
        sys.path.insert(0, str(HERE.parent))
        import dpsql

        ledger = Path(tempfile.mkdtemp(prefix="dpsql-100m-")) / "l.ledger"
        # dpsql stops a query after 30 s by default (query_timeout); lift it to measure.
        db = dpsql.connect(args.db, policy=bench_scale.POLICY_USER, ledger=str(ledger),
                           **bench_scale.no_time_limit())
        counter = iter(range(10**9))

        def run():
            db.sql(q["dp"], epsilon=Fraction(10**6 + next(counter), 10**6), delta=q.get("delta"))

        # The first query of a connection also builds what dpsql keeps per connection (the
        # bounded copy of the table): timed on its own, since the warmed-up runs leave it out.
        start = time.perf_counter()
        run()
        first = time.perf_counter() - start
        result = {**timed(run, args.repeats, budget=3600), "first_s": first}
        db.close()
    print(json.dumps(result))


def directory_size(path: Path) -> int:
    if not path.exists():
        return 0
    total = 0
    for root, _, files in os.walk(path):
        for name in files:
            try:
                total += os.path.getsize(os.path.join(root, name))
            except OSError:
                pass
    return total


def run_child(system: str, query: str, db: Path, repeats: int) -> dict:
    command = [sys.executable, str(Path(__file__).resolve()), "--child", system, "--query", query,
               "--db", str(db), "--repeats", str(repeats)]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(HERE.parent), os.environ.get("PYTHONPATH")])))
    spill = Path(f"{db}.tmp")
    peak_spill = [0]
    done = threading.Event()

    def watch():
        while not done.is_set():
            peak_spill[0] = max(peak_spill[0], directory_size(spill))
            time.sleep(0.25)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    start = time.perf_counter()
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        process = subprocess.Popen(command, stdout=out, stderr=err, env=env, cwd=str(HERE.parent))
        _, status, usage = os.wait4(process.pid, 0)
        process.returncode = os.waitstatus_to_exitcode(status)
        done.set()
        watcher.join()
        out.seek(0)
        err.seek(0)
        lines = [l for l in out.read().splitlines() if l.startswith("{")]
        error = err.read().strip().splitlines()[-1:] if process.returncode or not lines else []
    result = json.loads(lines[-1]) if lines and not error else {"error": " ".join(error) or "no output"}
    result.update(peak_rss_mb=usage.ru_maxrss / 1024, peak_spill_mb=peak_spill[0] / 2**20,
                  wall_s=time.perf_counter() - start)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=100_000_000)
    parser.add_argument("--queries", nargs="+", default=DEFAULT_QUERIES)
    parser.add_argument("--systems", nargs="+", default=["raw", "floor", "dpsql"])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--cache", default=None)
    parser.add_argument("--keep", action="store_true", help="keep the generated data file")
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--query", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--db", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        return child(args)
    cache = bench_scale.cache_dir(args.cache)
    existed = bench_scale.data_path(args.rows, cache).exists()
    start = time.perf_counter()
    db = bench_scale.ensure_data(args.rows, cache)
    generated = time.perf_counter() - start
    size_gb = db.stat().st_size / 2**30
    results = {}
    try:
        for query in args.queries:
            for system in args.systems:
                print(f"# {system} {query} ...", file=sys.stderr, flush=True)
                results[(system, query)] = r = run_child(system, query, db, args.repeats)
                print(f"#   {r}", file=sys.stderr, flush=True)
    finally:
        if not args.keep and not existed:
            db.unlink(missing_ok=True)
            shutil.rmtree(f"{db}.tmp", ignore_errors=True)
    lines = [f"### {args.rows:,} rows", "",
             f"Data: {size_gb:.2f} GiB DuckDB file{'' if existed else f', generated in {generated:.0f} s'}. "
             f"Each cell: median of {args.repeats} runs after a warm-up (min–max), its own process; peak RSS "
             f"of that process; peak size of DuckDB's spill directory; for dpsql, the first query on its "
             f"fresh connection too (it builds the bounded copy of the table).", "",
             "| query | system | time | /raw | /q-floor | first query | peak RSS | spill |",
             "|---|---|---:|---:|---:|---:|---:|---:|"]
    for query in args.queries:
        raw = results.get(("raw", query), {}).get("median")
        floor = results.get(("floor", query), {}).get("median")
        for system in args.systems:
            r = results.get((system, query), {})
            if "median" not in r:
                lines.append(f"| {query} | {system} | failed: {r.get('error', '')[:80]} | | | | "
                             f"{r.get('peak_rss_mb', 0):,.0f} MB | |")
                continue
            first = bench_scale.fmt(r.get("first_s")) if "first_s" in r else "—"
            lines.append(f"| {query} | {system} | {bench_scale.spread(r, args.repeats)} | "
                         f"{bench_scale.ratio(r['median'], raw)} | {bench_scale.ratio(r['median'], floor)} | {first} | "
                         f"{r['peak_rss_mb']:,.0f} MB | {r['peak_spill_mb']:,.0f} MB |")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
