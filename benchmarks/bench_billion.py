"""A billion rows, DuckDB part (issue 38, item 4): the bounded copy's build against a plain copy,
its peak memory, and a stored copy's reuse against its rebuild — before and after, one run.

    python benchmarks/bench_billion.py --rows 10000000 100000000 --before /path/to/main [--memory-limit 8GB]

On the shop data of ``bench_scale.py`` (generated into its cache on first use; ``--cache``), each
case runs in a fresh Python process (the code under test from ``--before`` or this checkout, by
``PYTHONPATH``), which reports its own wall and CPU seconds; the parent takes the child's peak
resident set (``os.wait4``: DuckDB's buffers included) and samples the size of DuckDB's spill
directories next to the data file every 0.25 s. Cases:

- *raw COUNT*: DuckDB opens the file and counts (the floor of a first query);
- *raw plain copy*: DuckDB copies the table into memory (``CREATE TABLE AS SELECT *``), the
  cost a bounded copy is set against;
- *dpsql, copies in memory*: connect and answer one COUNT (which builds the bounded copy);
- *dpsql, persisted, none stored* / *stored*: the same with ``persist_copies=True``, first with no
  stored copy (build, fingerprint, write), then with the one just stored (fingerprint, reuse).

Every DuckDB runs under ``--memory-limit`` (dpsql's ``memory_limit``). Then, in this process,
where the build's time goes (after): the plain copy, the build in one statement and in batches,
the row fingerprint and the file digest (``--no-parts`` skips it).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from bench_100m import directory_size  # noqa: E402
from bench_scale import cache_dir, ensure_data  # noqa: E402

CHILD = r"""
import json, os, random, resource, sys, time
start, cpu0 = time.perf_counter(), time.process_time()
mode, database, ledger, limit = sys.argv[1:5]
import duckdb
extra = {}
if mode in ("raw-count", "raw-copy"):
    con = duckdb.connect(database, read_only=True, config={"memory_limit": limit})
    if mode == "raw-copy":
        con.execute("ATTACH ':memory:' AS plain (READ_WRITE)")
        con.execute("CREATE TABLE plain.visits AS SELECT * FROM visits")
        con.execute("SELECT COUNT(*) FROM plain.visits").fetchall()
    else:
        con.execute("SELECT COUNT(*) FROM visits").fetchall()
else:
    import dpsql
    sys.path.insert(0, BENCH_DIR)
    from bench_scale import POLICY_USER
    db = dpsql.connect(database, policy=POLICY_USER, ledger=ledger, persist_copies=mode != "memory",
                       query_timeout=None, progress=False, memory_limit=limit)
    db.sql("SELECT COUNT(*) AS n FROM visits", epsilon=random.uniform(1, 2))
    con = db._engine._connection
    extra["copy_mb"] = con.execute("SELECT COALESCE(SUM(memory_usage_bytes), 0) / 2^20 FROM duckdb_memory() "
                                   "WHERE tag = 'IN_MEMORY_TABLE'").fetchall()[0][0]
print(json.dumps({"seconds": time.perf_counter() - start, "cpu": time.process_time() - cpu0, **extra}))
"""


def _spill_bytes(folder: Path, stem: str) -> int:
    """Bytes in DuckDB's spill directories: its default ``<file>.tmp`` beside the data file, and
    dpsql's own ``dpsql-spill-*`` in the temporary directory (another process's there counts too)."""
    entries = []
    for place, prefixes in ((folder, (f"{stem}.tmp",)), (Path(tempfile.gettempdir()), ("dpsql-spill-",))):
        try:
            entries += [e for e in place.iterdir() if e.name.startswith(prefixes)]
        except OSError:
            pass
    return sum(directory_size(entry) for entry in entries)


def run_case(mode: str, code: Path, database: Path, ledger: Path, limit: str) -> dict:
    script = CHILD.replace("BENCH_DIR", repr(str(HERE)))
    env = dict(os.environ, PYTHONPATH=str(code))
    peak_spill = [0]
    done = threading.Event()

    def watch():
        while not done.is_set():
            peak_spill[0] = max(peak_spill[0], _spill_bytes(database.parent, database.name))
            time.sleep(0.25)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        process = subprocess.Popen([sys.executable, "-c", script, mode, str(database), str(ledger), limit],
                                   stdout=out, stderr=err, env=env, cwd=str(code))
        _, status, usage = os.wait4(process.pid, 0)
        done.set()
        watcher.join()
        out.seek(0)
        err.seek(0)
        lines = [line for line in out.read().splitlines() if line.startswith("{")]
        if os.waitstatus_to_exitcode(status) or not lines:
            return {"error": (err.read().strip().splitlines() or ["no output"])[-1]}
    return {**json.loads(lines[-1]), "peak_mb": usage.ru_maxrss / 1024, "spill_mb": peak_spill[0] / 2**20}


def where_the_time_goes(database: Path, limit: str) -> dict[str, tuple[float, float]]:
    """Wall and CPU seconds of each step of the build and of both fingerprints (after), in this process."""
    import duckdb

    sys.path.insert(0, str(HERE.parent))
    from dpsql.backends import bounding
    from dpsql.backends.duckdb import persisted

    con = duckdb.connect(str(database), read_only=True, config={"memory_limit": limit})
    con.execute("SET enable_progress_bar = false")
    con.execute(bounding.attach_sql())
    columns = tuple(con.execute("SELECT column_name, column_type FROM (DESCRIBE visits)").fetchall())
    table = bounding.BoundedTable("visits", "user_id", 10, columns)
    rows = con.execute("SELECT estimated_size FROM duckdb_tables() WHERE table_name = 'visits'").fetchall()[0][0]
    count = bounding.batch_count(rows)
    steps = {
        "plain copy (CREATE TABLE AS SELECT *)": ["CREATE OR REPLACE TABLE dp_bounding.plain AS SELECT * FROM visits"],
        f"bounded copy, {count} batch(es)": bounding.fill_batches(table, count),
        f"row counts, {count} batch(es)": bounding.raw_rows_batches(table, count),
        "row fingerprint (keyed MD5 of each row's text; before: every reuse)": [persisted.fingerprint_sql(table)],
    }
    times = {}
    for name, statements in steps.items():
        wall, cpu = time.perf_counter(), _cpu()
        for statement in statements:
            parameters = {"salt": "bench"} if "$salt" in statement else (
                persisted.fingerprint_keys("bench") if "$fingerprint" in statement else None)
            con.execute(statement, parameters).fetchall()
        times[name] = (time.perf_counter() - wall, _cpu() - cpu)
        con.execute("DROP TABLE IF EXISTS dp_bounding.plain")
    con.close()
    wall, cpu = time.perf_counter(), _cpu()
    persisted.file_digest(database, persisted.file_identity(database), "bench")
    times["file digest (HMAC-SHA256 of the file)"] = (time.perf_counter() - wall, _cpu() - cpu)
    return times


def _cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, nargs="+", default=[10_000_000])
    parser.add_argument("--before", type=Path, default=None, help="a checkout of the code before (e.g. main)")
    parser.add_argument("--memory-limit", default="8GB")
    parser.add_argument("--cache", default=None)
    parser.add_argument("--no-parts", action="store_true", help="skip the in-process breakdown")
    parser.add_argument("--spill-limit", default=None,
                        help="also run dpsql (after, copies in memory) under this lower memory limit")
    args = parser.parse_args()
    after = HERE.parent
    sides = [("before", args.before)] if args.before else []
    sides.append(("after", after))
    print(f"Memory limit {args.memory_limit} for every DuckDB; one fresh process per cell; "
          f"peak = the process's maximum resident set.\n")
    for rows in args.rows:
        database = ensure_data(rows, cache_dir(args.cache))
        work = Path(tempfile.mkdtemp(prefix="dpsql-billion-"))
        results = {}
        try:
            for mode in ("raw-count", "raw-copy"):
                print(f"# {rows:,} {mode}", file=sys.stderr, flush=True)
                results[("raw", mode)] = run_case(mode, after, database, work / "raw.ledger", args.memory_limit)
            for side, code in sides:
                ledger = work / f"{side}.ledger"
                for mode, label in (("memory", "memory"), ("persist", "persisted, none stored"),
                                    ("persist", "persisted, stored")):
                    print(f"# {rows:,} {side} {label}", file=sys.stderr, flush=True)
                    results[(side, label)] = run_case(mode, code, database, ledger, args.memory_limit)
                    print(f"#   {results[(side, label)]}", file=sys.stderr, flush=True)
            if args.spill_limit:
                label = f"memory, limit {args.spill_limit}"
                print(f"# {rows:,} after {label}", file=sys.stderr, flush=True)
                results[("after", label)] = run_case("memory", after, database, work / "spill.ledger",
                                                     args.spill_limit)
                print(f"#   {results[('after', label)]}", file=sys.stderr, flush=True)
        finally:
            shutil.rmtree(work, ignore_errors=True)
        print(f"### {rows:,} rows ({database.stat().st_size / 2**30:.2f} GiB file)\n")
        print("| case | code | to first answer | CPU | peak RSS | peak spill | copies in memory |")
        print("|---|---|---:|---:|---:|---:|---:|")
        for (side, label), r in results.items():
            if "error" in r:
                print(f"| {label} | {side} | failed: {r['error'][:100]} | | | | |")
                continue
            copy = f"{r['copy_mb']:,.0f} MB" if "copy_mb" in r else ""
            print(f"| {label} | {side} | {r['seconds']:.2f} s | {r['cpu']:.2f} s | {r['peak_mb']:,.0f} MB | "
                  f"{r['spill_mb']:,.0f} MB | {copy} |")
        if not args.no_parts:
            print("\n| step (after, in one process) | wall | CPU |")
            print("|---|---:|---:|")
            for name, (wall, cpu) in where_the_time_goes(database, args.memory_limit).items():
                print(f"| {name} | {wall:.2f} s | {cpu:.2f} s |")
        print()


if __name__ == "__main__":
    main()
