"""Speed against plain DuckDB (issue 26): every figure of the issue in one run, before and after.

    python benchmarks/bench_speed.py --quick                 # 1k + 1M, few repeats: ~3 minutes
    python benchmarks/bench_speed.py                         # 1k, 1M, 10M (what `make bench` runs)
    python benchmarks/bench_speed.py --with-100m             # also 100M rows (generating it takes minutes)
    python benchmarks/bench_speed.py --before /work/wt/before   # a before column from an older checkout

Data: bench_scale.py's shop data (``ensure_data``, same cache directory: ``--cache``,
``$DPSQL_BENCH_CACHE`` or ``~/.cache/dpsql-bench``) with bench_scale.py's per-unit policy
(MAX ROWS PER UNIT 10, MAX GROUPS PER UNIT 5, amount BOUNDS 0 TO 500).

What it measures, each in its own process per size (so memory and imports do not mix):

* per query class (``CLASSES``): raw DuckDB; dpsql ``db.sql`` end to end with a **new query text
  every run** (the filter's constant ``k`` changes, and so does epsilon, so neither the plan
  cache nor the ledger's stored answers can serve it); and, from dpsql's internals where they
  exist, the split of that time: ``prepare`` (parse to rendered bounded statement, for a new
  text), the bounded statement(s) alone on a DuckDB cursor, and the rest (noise, release,
  ledger). The issue's target per cell: 5 ms end to end at 1,000 rows, ``max(2 x raw, raw + 5 ms)``
  from 1M rows on (the issue sets it at 10M).
* grouped classes against a hand-written bound (``HAND_BOUNDS``): the least a correct bound must
  do given a copy whose rows per unit are already capped (as dpsql's bounded copy is): aggregate
  per (unit, group), keep at most MAX GROUPS PER UNIT groups per unit, clamp, aggregate per
  group (and count units per group for partition selection). It reads a window-capped copy
  the raw worker builds once (its build time is shown). Target 1.2x. Also shown: bench_scale's
  ``q-floor`` (the per-(unit, group) pre-aggregation on the raw table, no limits).
* first queries: dpsql's bounded copy built alone against a plain ``CREATE TABLE AS SELECT *``
  into an in-memory database (target 2x), and a fresh process's import, connect and first query.
* peak memory: each measurement in a fresh process, ``ru_maxrss`` after one query; raw DuckDB
  against dpsql (copy + query) at the largest size of 10M or more (``--memory-rows``), with the
  copy's in-memory size from ``duckdb_memory()`` and per row.
* the server: benchmarks/bench_serve.py (32 clients, 1k and 1M rows), run as its own command
  with only the options it declares (it is changed by others; ``--serve-workers`` is passed
  only when it has ``--workers``), its Markdown section included as it prints it.

``--before PATH`` runs every dpsql measurement a second time with ``PYTHONPATH=PATH`` (a
checkout or worktree of an older dpsql: ``git worktree add /work/wt/before aa60471``), through
the public API (``dpsql.connect``, ``db.sql``) and guarded internals, so one quiet run gives a
before and an after column. Output: Markdown on stdout (and ``--out``) for RESULTS.md; raw
numbers as ``speed-*.json`` in the cache directory. ``--all`` then runs ``bench_scale.py --all``
(peers, noise, utility) so ``make bench`` stays one command. The queries, hand-written bounds and
targets are in bench_speed_queries.py, the report in bench_speed_report.py.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import re
import shlex
import subprocess
import sys
import tempfile
import time
from fractions import Fraction
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))

from bench_scale import POLICY_USER, cache_dir, ensure_data, no_time_limit, peak_rss_mb, stats, timed  # noqa: E402
from bench_speed_queries import CAPPED, CLASSES, HAND_BOUNDS, Q_FLOORS, constants  # noqa: E402
from bench_speed_report import report  # noqa: E402

# -- workers (each in its own process; the last line printed is JSON) -------------------------

def worker_raw(db_path: Path, repeats: int, names: list[str]) -> dict:
    """Raw DuckDB per class, the hand-written bounds, and a plain copy of the table."""
    import duckdb

    con = duckdb.connect(str(db_path), read_only=True)
    con.execute("ATTACH ':memory:' AS scratch (READ_WRITE)")  # as dpsql attaches its copies' database
    k = constants()
    plain = "CREATE OR REPLACE TABLE scratch.plain AS SELECT * FROM visits"
    out: dict = {"copy": timed(lambda: con.execute(plain), 3)}
    out["capped_copy"] = timed(lambda: con.execute(CAPPED), 1)
    con.execute("DROP TABLE scratch.plain")
    for name in names:
        sql = CLASSES[name]["sql"]
        entry = {"raw": timed(lambda: con.execute(sql.format(k=next(k))).fetchall(), repeats)}
        if name in HAND_BOUNDS:
            entry["hand"] = timed(lambda: con.execute(HAND_BOUNDS[name].format(k=next(k))).fetchall(), repeats)
            entry["q_floor"] = timed(lambda: con.execute(Q_FLOORS[name].format(k=next(k))).fetchall(), repeats)
        out[name] = entry
    con.close()
    return out


def open_dpsql(db_path: Path, **options):
    import dpsql

    ledger = Path(tempfile.mkdtemp(prefix="dpsql-bench-speed-")) / "bench.ledger"
    return dpsql.connect(str(db_path), policy=POLICY_USER, ledger=str(ledger), **no_time_limit(), **options)


def worker_dpsql(db_path: Path, repeats: int, names: list[str]) -> dict:
    """``db.sql`` end to end with a new text and epsilon each run, and where it goes (guarded)."""
    db = open_dpsql(db_path)
    k, epsilons = constants(), iter(range(10**9))
    out: dict = {}
    for name in names:
        spec = CLASSES[name]

        def answer() -> int:
            epsilon = Fraction(10**6 + next(epsilons), 10**6)
            result = db.sql(spec["sql"].format(k=next(k)), epsilon=epsilon, delta=spec.get("delta"))
            if getattr(result, "repeat", False):
                raise RuntimeError("answered as a free repeat: the timing would be a ledger lookup")
            return len(result)

        try:
            released = [answer()]  # also builds the bounded copy, outside the timed runs
            entry = {"total": timed(lambda: released.append(answer()), repeats), "rows": released[-1]}
        except Exception as error:
            out[name] = {"error": f"{type(error).__name__}: {error}"[:300]}
            continue
        try:
            entry.update(split_times(db, spec, repeats, k))
        except Exception as error:  # internals move; the end-to-end time stands
            entry["split_error"] = f"{type(error).__name__}: {error}"[:200]
        out[name] = entry
    db.close()
    return out


def split_times(db, spec: dict, repeats: int, k) -> dict:
    """``prepare`` of a new text and its bounded statements alone (a cursor on dpsql's own
    DuckDB connection; the copy is filled by then). Needs ``db._prepare`` -> ``.priced.bounded``."""
    delta = spec.get("delta")

    def prepared():
        return db._prepare(spec["sql"].format(k=next(k)), Fraction(1), delta, None, None, None)

    def statements(prepared_query) -> list:
        priced = prepared_query.priced
        return [priced.bounded, *getattr(priced, "separate", ())]

    cursor = db._engine._connection.cursor()

    def run_bounded() -> float:
        """Prepare a new text untimed, then time only its statements on the cursor."""
        found = statements(prepared())
        start = time.perf_counter()
        for statement in found:
            cursor.execute(statement.sql, db._executor.salt_for(statement.needs_salt) or {}).fetchall()
        return time.perf_counter() - start

    prepare = timed(prepared, repeats)
    run_bounded()
    bounded = stats([run_bounded() for _ in range(repeats)])
    cursor.close()
    return {"prepare": prepare, "bounded": bounded, "statements": len(statements(prepared()))}


def worker_first(db_path: Path, started: float) -> dict:
    """A fresh process: import, connect, first COUNT (which builds the copy)."""
    import_start = time.perf_counter()
    import dpsql  # noqa: F401

    imported = time.perf_counter()
    db = open_dpsql(db_path)
    connected = time.perf_counter()
    db.sql(CLASSES["COUNT"]["sql"].format(k="595"), epsilon=1)
    answered = time.perf_counter()
    db.close()
    return {"import": imported - import_start, "connect": connected - imported, "first_query": answered - connected,
            "total": answered - started}


def worker_build(db_path: Path) -> dict:
    """The bounded copy's build alone (``db._engine.build_bounding``, else an eager connect less
    a lazy one), and what it holds in memory."""
    start = time.perf_counter()
    db = open_dpsql(db_path)
    lazy = time.perf_counter() - start
    before = copy_memory(db)
    start = time.perf_counter()
    engine = db._engine
    if hasattr(engine, "build_bounding"):
        engine.build_bounding()
        build, how = time.perf_counter() - start, "build_bounding()"
    else:
        db.close()
        start = time.perf_counter()
        db = open_dpsql(db_path, eager_bounding=True)
        build, how = time.perf_counter() - start - lazy, "eager connect - lazy connect"
    after = copy_memory(db)
    db.close()
    return {"build": build, "how": how, "copy_bytes": after["bytes"] - before["bytes"], "copy_rows": after["rows"],
            "copy_tables": after["tables"]}


def copy_memory(db) -> dict:
    """In-memory table bytes (``duckdb_memory()``) and the rows of the bounding database's tables."""
    con = db._engine._connection
    used = con.execute("SELECT COALESCE(SUM(memory_usage_bytes), 0) FROM duckdb_memory() "
                       "WHERE tag = 'IN_MEMORY_TABLE'").fetchall()[0][0]
    tables = con.execute("SELECT table_name, estimated_size FROM duckdb_tables() "
                         "WHERE database_name = 'dp_bounding' AND table_name LIKE 'dp_bounded_%'").fetchall()
    return {"bytes": int(used), "rows": sum(int(n) for _, n in tables), "tables": [t for t, _ in tables]}


def worker_memory(db_path: Path, system: str, name: str) -> dict:
    """Peak RSS of a fresh process after one query (``name``; ``idle``: opened only; ``build``:
    dpsql's copy built, no query — what the build alone costs at its peak)."""
    sql = CLASSES[name]["sql"].format(k="595") if name in CLASSES else None
    if system == "raw":
        import duckdb

        con = duckdb.connect(str(db_path), read_only=True)
        if sql:
            con.execute(sql).fetchall()
        elif name == "build":  # raw DuckDB's counterpart: a plain in-memory copy of the table
            con.execute("ATTACH ':memory:' AS scratch (READ_WRITE)")
            con.execute("CREATE TABLE scratch.plain AS SELECT * FROM visits")
        return {"peak_rss_mb": peak_rss_mb()}
    db = open_dpsql(db_path)
    if sql:
        db.sql(sql, epsilon=1, delta=CLASSES[name].get("delta"))
    elif name == "build":
        db._engine.build_bounding()
    out = {"peak_rss_mb": peak_rss_mb()}
    try:
        out["copy_bytes"] = copy_memory(db)["bytes"]
    except Exception as error:
        out["copy_error"] = f"{type(error).__name__}: {error}"[:200]
    db.close()
    return out


def worker_main(args) -> None:
    started = time.perf_counter()
    db = Path(args.db) if args.db else None
    if args.worker == "raw":
        results = worker_raw(db, args.repeats, args.classes)
    elif args.worker == "dpsql":
        results = worker_dpsql(db, args.repeats, args.classes)
    elif args.worker == "first":
        results = worker_first(db, started)
    elif args.worker == "build":
        results = worker_build(db)
    elif args.worker.startswith("memory-"):
        results = worker_memory(db, args.worker.split("-", 1)[1], args.classes[0])
    else:
        raise SystemExit(f"unknown worker {args.worker}")
    import_path = sys.modules["dpsql"].__file__ if "dpsql" in sys.modules else None
    print(json.dumps({"results": results, "peak_rss_mb": peak_rss_mb(), "dpsql_file": import_path,
                      "wall_s": time.perf_counter() - started}, default=str))


# -- orchestration ----------------------------------------------------------------------------

def run_worker(worker: str, root: Path, args, db: Path | None = None, classes: list[str] | None = None,
               timeout: float = 4 * 3600) -> dict:
    """Run this script as ``worker`` in a fresh process importing dpsql from ``root``."""
    command = [sys.executable, str(Path(__file__).resolve()), "--worker", worker, "--repeats", str(args.repeats)]
    if db is not None:
        command += ["--db", str(db)]
    if classes:
        command += ["--classes", *classes]
    env = dict(os.environ, PYTHONPATH=str(root))
    start = time.perf_counter()
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout, cwd=str(root), env=env)
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {timeout:.0f} s"}
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode != 0 or not lines:
        tail = (done.stderr or done.stdout).strip().splitlines()[-3:]
        return {"error": f"exit {done.returncode}: {' | '.join(tail)}"[:400]}
    result = json.loads(lines[-1])
    result["process_wall_s"] = time.perf_counter() - start
    expected = str(root.resolve())
    if worker != "raw" and worker != "memory-raw" and not str(result.get("dpsql_file", "")).startswith(expected):
        return {"error": f"imported dpsql from {result.get('dpsql_file')}, not {expected}"}
    return result


def log(text: str) -> None:
    print(f"# {datetime.datetime.now():%H:%M:%S} {text}", file=sys.stderr, flush=True)


def measure_size(rows: int, db: Path, sides: dict[str, Path], args) -> dict:
    """Every per-size figure: raw, dpsql per side, the copy's build and a fresh first query."""
    log(f"{rows:,} rows: raw DuckDB")
    out: dict = {"raw": run_worker("raw", ROOT, args, db, args.classes)}
    for side, root in sides.items():
        log(f"{rows:,} rows: dpsql {side} per query class")
        out[side] = {"speed": run_worker("dpsql", root, args, db, args.classes)}
    for _ in range(args.first_runs):  # alternate sides, so a burst of load hits both
        for side, root in sides.items():
            log(f"{rows:,} rows: dpsql {side} copy build and first query")
            out[side].setdefault("build", []).append(run_worker("build", root, args, db))
            out[side].setdefault("first", []).append(run_worker("first", root, args, db))
    return out


def measure_memory(rows: int, db: Path, sides: dict[str, Path], args) -> dict:
    out: dict = {}
    for name in ["idle", "build", *args.memory_classes]:
        log(f"{rows:,} rows: peak memory, {name}")
        out[name] = {"raw": run_worker("memory-raw", ROOT, args, db, [name])}
        for side, root in sides.items():
            out[name][side] = run_worker("memory-dpsql", root, args, db, [name])
    return out


def serve_options(script: Path) -> set[str]:
    """The long options bench_serve.py declares now (it changes under other hands)."""
    done = subprocess.run([sys.executable, str(script), "--help"], capture_output=True, text=True, cwd=str(ROOT))
    return set(re.findall(r"(--[a-z][a-z0-9-]*)", done.stdout))


def measure_serve(rows: int, root: Path, args) -> dict:
    """bench_serve.py's own run, as it prints it, plus its served row parsed for the summary."""
    script = HERE / "bench_serve.py"
    known = serve_options(script)
    wanted = {"--rows": rows, "--clients": args.serve_clients, "--queries": args.serve_queries,
              "--cache": args.cache_path, "--workers": args.serve_workers}
    command = [sys.executable, str(script)]
    for option, value in wanted.items():
        if value is not None and option in known:
            command += [option, str(value)]
    env = dict(os.environ, PYTHONPATH=str(root))
    try:  # cwd too: its server runs `python -m dpsql.cli`, which imports from the working directory first
        done = subprocess.run(command, capture_output=True, text=True, cwd=str(root), env=env, timeout=3600)
    except subprocess.TimeoutExpired:
        return {"error": "timed out after 3600 s", "command": command}
    if done.returncode != 0:
        return {"error": f"exit {done.returncode}: {done.stderr.strip()[-300:]}", "command": command}
    return {"markdown": done.stdout.strip(), "served": parse_served(done.stdout), "command": command}


def parse_served(markdown: str) -> dict | None:
    """throughput, p50, p99 of the ``| served, ...`` row of bench_serve's table (None if it moved)."""
    for line in markdown.splitlines():
        if line.startswith("| served"):
            throughput = re.search(r"([\d.]+) queries/s", line)
            times = re.findall(r"\| ([\d.]+) ms", line)
            if throughput and len(times) >= 2:
                return {"throughput": float(throughput.group(1)), "p50": float(times[0]) / 1000,
                        "p99": float(times[1]) / 1000}
    return None


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, nargs="+", default=None, help="sizes (default 1k 1M 10M)")
    parser.add_argument("--quick", action="store_true", help="1k and 1M rows, 5 repeats, a short server run")
    parser.add_argument("--with-100m", action="store_true", help="also 100M rows (generated on first use: minutes)")
    parser.add_argument("--before", default=None, help="a checkout of an older dpsql: a before column")
    parser.add_argument("--classes", nargs="+", default=list(CLASSES), help=f"query classes: {', '.join(CLASSES)}")
    parser.add_argument("--repeats", type=int, default=None, help="timed runs per cell (default 15; --quick 5)")
    parser.add_argument("--first-runs", type=int, default=None, help="fresh processes per side (default 3)")
    parser.add_argument("--memory-rows", type=int, nargs="*", default=None,
                        help="sizes for peak memory (default: each size of 10M rows or more; --quick 1M)")
    parser.add_argument("--memory-classes", nargs="+", default=None, choices=list(CLASSES))
    parser.add_argument("--serve-rows", type=int, nargs="*", default=None, help="default 1k 1M; none to skip")
    parser.add_argument("--serve-clients", type=int, default=32)
    parser.add_argument("--serve-queries", type=int, default=None, help="per client (default 100; --quick 10)")
    parser.add_argument("--serve-workers", type=int, default=None, help="passed on if bench_serve.py has --workers")
    parser.add_argument("--cache", default=None, help="where the generated DuckDB files live")
    parser.add_argument("--out", default=None, help="also write the Markdown report to this file")
    parser.add_argument("--all", action="store_true", help="then bench_scale.py --all (peers, noise, utility)")
    parser.add_argument("--scale-args", default="", help="with --all: more options for bench_scale.py, one string")
    parser.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--db", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    args.argv = argv
    if args.worker:
        args.repeats = args.repeats or 15
        return worker_main(args)
    unknown = [name for name in args.classes if name not in CLASSES]
    if unknown:
        parser.error(f"unknown query classes {unknown}; known: {list(CLASSES)}")
    quick = args.quick
    args.rows = args.rows or ([1_000, 1_000_000] if quick else [1_000, 1_000_000, 10_000_000])
    if args.with_100m and 100_000_000 not in args.rows:
        args.rows.append(100_000_000)
    args.repeats = args.repeats or (5 if quick else 15)
    args.first_runs = args.first_runs or (1 if quick else 3)
    if args.memory_rows is None:
        args.memory_rows = [1_000_000] if quick else [r for r in args.rows if r >= 10_000_000]
    args.memory_classes = args.memory_classes or (["COUNT", "GROUP BY ~5,000 private keys"] if quick else
                                                  list(CLASSES))
    args.serve_rows = [1_000, 1_000_000] if args.serve_rows is None else args.serve_rows
    args.serve_queries = args.serve_queries or (10 if quick else 100)
    cache = cache_dir(args.cache)
    args.cache_path = str(cache)
    sides = {"after": ROOT}
    if args.before:
        sides = {"before": Path(args.before).resolve(), "after": ROOT}
    results: dict = {"sizes": {}, "memory": {}, "serve": {}}
    for rows in args.rows:
        db = ensure_data(rows, cache)
        results["sizes"][rows] = measure_size(rows, db, sides, args)
        if rows in args.memory_rows:
            results["memory"][rows] = measure_memory(rows, db, sides, args)
    for rows in args.serve_rows:
        ensure_data(rows, cache)
        for side, root in sides.items():
            log(f"server, {rows:,} rows, dpsql {side}")
            results["serve"].setdefault(rows, {})[side] = measure_serve(rows, root, args)
    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    (cache / f"speed-{stamp}.json").write_text(json.dumps(results, indent=1, default=str))
    text = report(results, sides, args)
    if args.all:
        log("bench_scale.py --all")
        scale = subprocess.run([sys.executable, str(HERE / "bench_scale.py"), "--all", "--cache", str(cache),
                                *(["--with-100m"] if args.with_100m else []), *shlex.split(args.scale_args)],
                               capture_output=True, text=True, cwd=str(ROOT))
        text += "\n\n" + (scale.stdout.strip() or f"bench_scale.py --all failed: {scale.stderr.strip()[-300:]}")
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n")


if __name__ == "__main__":
    main()
