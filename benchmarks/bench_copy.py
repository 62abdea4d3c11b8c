"""First queries: the bounded copy's build, its memory, and a fresh process with and without
persisted copies (issue 26, item 3 and the copy's share of item 5).

    python benchmarks/bench_copy.py --rows 1000000 10000000 [--rounds 3] [--cache DIR]

On the shop data of ``bench_scale.py`` (generated into its cache on first use; user-level
policy, MAX ROWS PER UNIT 10), prints Markdown:

1. *Build*: ``CREATE TABLE AS SELECT *`` of the table (a plain copy) against dpsql's build of its
   bounded copy (``fill_sql`` and ``raw_rows_sql``, as ``Engine`` runs them) and against the
   persisted copies' fingerprint (``dpsql.backends.duckdb.persisted.fingerprint_sql``): wall time and
   process CPU time (user + system, every DuckDB thread), medians over ``--rounds``, alternated.
2. *Memory*: the in-memory size of the bounded copy (with its row-count table) and of a plain
   copy (DuckDB's ``duckdb_memory()``, tag IN_MEMORY_TABLE), per raw row and per kept row; and
   the persisted file's size.
3. *First query in a fresh process*: a new Python process that connects and answers one COUNT
   (a new epsilon each time, so no free repeat) — without persisted copies, with them when none
   is stored yet (build + write), and with a stored one (fingerprint + reuse) — against a new
   process running the same COUNT on raw DuckDB.
"""

from __future__ import annotations

import argparse
import json
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import duckdb
from bench_scale import cache_dir, ensure_data

from dpsql.backends import bounding
from dpsql.backends.duckdb import persisted

HERE = Path(__file__).resolve().parent


def _cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _timed(con, sql: str, parameters=None) -> tuple[float, float]:
    wall, cpu = time.perf_counter(), _cpu()
    con.execute(sql, parameters).fetchall()
    return time.perf_counter() - wall, _cpu() - cpu


def _visits(con) -> bounding.BoundedTable:
    columns = tuple(con.execute("SELECT column_name, column_type FROM (DESCRIBE visits)").fetchall())
    return bounding.BoundedTable("visits", "user_id", 10, columns)


def measure_build(path: Path, rounds: int) -> dict[str, dict[str, list[float]]]:
    """Wall and CPU seconds of a plain copy, the bounded copy's build and the fingerprint."""
    con = duckdb.connect(str(path), read_only=True)
    con.execute("SET enable_progress_bar = false")
    con.execute(bounding.attach_sql())
    table = _visits(con)
    salt = {"salt": "bench"}
    plain = "CREATE OR REPLACE TABLE dp_bounding.dp_plain AS SELECT * FROM visits"
    steps = {
        "plain copy (CREATE TABLE AS SELECT *)": [(plain, None)],
        "bounded copy (fill + row counts)": [(bounding.fill_sql(table), salt), (bounding.raw_rows_sql(table), None)],
        "fingerprint (persisted copies)": [(persisted.fingerprint_sql(table), persisted.fingerprint_keys("bench"))],
    }
    times: dict[str, dict[str, list[float]]] = {name: {"wall": [], "cpu": []} for name in steps}
    for i in range(rounds):
        order = list(steps) if i % 2 == 0 else list(steps)[::-1]
        for name in order:
            wall = cpu = 0.0
            for sql, parameters in steps[name]:
                w, c = _timed(con, sql, parameters)
                wall, cpu = wall + w, cpu + c
            times[name]["wall"].append(wall)
            times[name]["cpu"].append(cpu)
    con.close()
    return times


def _table_bytes(con) -> int:
    """Bytes DuckDB's buffer manager holds for in-memory tables (``duckdb_memory()``)."""
    return int(con.execute("SELECT COALESCE(SUM(memory_usage_bytes), 0) FROM duckdb_memory() "
                           "WHERE tag = 'IN_MEMORY_TABLE'").fetchall()[0][0])


def measure_memory(path: Path) -> dict[str, float]:
    """Bytes the bounded copy (with its row-count table) and a plain copy take in memory."""
    con = duckdb.connect(str(path), read_only=True)
    con.execute("SET enable_progress_bar = false")
    table = _visits(con)
    raw_rows = con.execute("SELECT COUNT(*) FROM visits").fetchall()[0][0]
    con.execute(bounding.attach_sql())
    con.execute(bounding.fill_sql(table), {"salt": "bench"})
    con.execute(bounding.raw_rows_sql(table))
    kept = con.execute(f'SELECT COUNT(*) FROM {bounding.DATABASE}."{table.name}" WHERE NOT dp_pad').fetchall()[0][0]
    copy_bytes = _table_bytes(con)
    con.execute("CREATE TABLE dp_bounding.dp_plain AS SELECT * FROM visits")
    plain_bytes = _table_bytes(con) - copy_bytes
    con.close()
    return {"raw_rows": raw_rows, "kept_rows": kept, "copy_bytes": copy_bytes, "plain_bytes": plain_bytes}


CHILD = """
import json, sys, time, random
start = time.perf_counter()
mode, database, ledger = sys.argv[1:4]
if mode == "import":
    import dpsql
elif mode == "raw":
    import duckdb
    con = duckdb.connect(database, read_only=True)
    con.execute("SELECT COUNT(*) FROM visits").fetchall()
else:
    import dpsql
    sys.path.insert(0, {here!r})
    from bench_scale import POLICY_USER
    db = dpsql.connect(database, policy=POLICY_USER, ledger=ledger, persist_copies=mode != "memory",
                       query_timeout=None, progress=False)
    db.sql("SELECT COUNT(*) AS n FROM visits", epsilon=random.uniform(1, 2))
first = time.perf_counter() - start
later = []
if mode != "import":
    for _ in range(5):
        begin = time.perf_counter()
        if mode == "raw":
            con.execute("SELECT SUM(amount) FROM visits").fetchall()
        else:
            db.sql("SELECT SUM(amount) AS s FROM visits", epsilon=random.uniform(1, 2))
        later.append(time.perf_counter() - begin)
print(json.dumps({{"seconds": first, "later": sorted(later)[len(later) // 2] if later else None}}))
"""


def _fresh_process(mode: str, database: Path, ledger: Path) -> tuple[float, float | None]:
    """Seconds to the first answer, and the median of five later SUMs in that process."""
    script = CHILD.format(here=str(HERE))
    out = subprocess.run([sys.executable, "-c", script, mode, str(database), str(ledger)], check=True,
                         capture_output=True, text=True).stdout
    answer = json.loads(out.strip().splitlines()[-1])
    return answer["seconds"], answer["later"]


def measure_first_query(path: Path, rounds: int, work: Path) -> tuple[dict[str, list[tuple]], int]:
    """Seconds from a new process's start to its first answer (and the median later SUM) per
    case, and the persisted file's size."""
    ledger = work / f"{path.stem}.ledger"
    copies = persisted.copies_directory(ledger)
    times: dict[str, list[tuple]] = {"raw DuckDB (no privacy)": [], "import dpsql (nothing else)": [],
                                     "dpsql, copies in memory": [],
                                     "dpsql, persisted: none stored yet": [], "dpsql, persisted: stored copy": []}
    for _ in range(rounds):
        times["raw DuckDB (no privacy)"].append(_fresh_process("raw", path, ledger))
        times["import dpsql (nothing else)"].append(_fresh_process("import", path, ledger))
        times["dpsql, copies in memory"].append(_fresh_process("memory", path, ledger))
        shutil.rmtree(copies, ignore_errors=True)
        times["dpsql, persisted: none stored yet"].append(_fresh_process("persist", path, ledger))
        times["dpsql, persisted: stored copy"].append(_fresh_process("persist", path, ledger))
    size = sum(f.stat().st_size for f in copies.iterdir())
    return times, size


def _median(values: list[float]) -> float:
    return statistics.median(values)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, nargs="+", default=[1_000_000, 10_000_000])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--cache", default=None, help="the shop data's directory (bench_scale.py's default)")
    parts = ("build", "memory", "first")
    parser.add_argument("--parts", nargs="+", choices=parts, default=list(parts),
                        help="what to measure (at 100M rows, 'first' alone spares memory: the others hold copies)")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="dpsql-bench-copy-"))
    builds, memory, first = {}, {}, {}
    try:
        for rows in args.rows:
            path = ensure_data(rows, cache_dir(args.cache))
            if "build" in args.parts:
                builds[rows] = measure_build(path, args.rounds)
            if "memory" in args.parts:
                memory[rows] = measure_memory(path)
            if "first" in args.parts:
                first[rows] = measure_first_query(path, args.rounds, work)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(f"Medians of {args.rounds} runs; shop data, user-level policy (MAX ROWS PER UNIT 10).\n")
    print("| rows | step | wall s | CPU s | wall × plain copy |")
    print("|---|---|---|---|---|")
    for rows, steps in builds.items():
        plain = _median(next(iter(steps.values()))["wall"])
        for name, values in steps.items():
            wall = _median(values["wall"])
            print(f"| {rows:,} | {name} | {wall:.3f} | {_median(values['cpu']):.2f} | {wall / plain:.1f}× |")
    print("\n| rows | kept rows | bounded copy in memory | per raw row | per kept row | plain copy | "
          "persisted file |")
    print("|---|---|---|---|---|---|---|")
    for rows, m in memory.items():
        size, copy = (f"{first[rows][1] / 2**20:.0f} MiB" if rows in first else "–"), m["copy_bytes"]
        print(f"| {rows:,} | {m['kept_rows']:,} | {copy / 2**20:.0f} MiB | {copy / m['raw_rows']:.1f} B "
              f"| {copy / m['kept_rows']:.1f} B | {m['plain_bytes'] / 2**20:.0f} MiB | {size} |")
    print("\n| rows | new process | to first COUNT, s | later SUMs, ms |")
    print("|---|---|---|---|")
    for rows, (times, _) in first.items():
        for name, values in times.items():
            later = [value for _, value in values if value is not None]
            shown = f"{1000 * _median(later):.1f}" if later else ""
            print(f"| {rows:,} | {name} | {_median([value for value, _ in values]):.2f} | {shown} |")


if __name__ == "__main__":
    main()
