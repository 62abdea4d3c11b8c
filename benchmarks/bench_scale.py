"""Scale benchmark (issue 7): dpsql against raw DuckDB, the per-unit floor and peers, in one run.

One command runs everything::

    python benchmarks/bench_scale.py                       # 1k, 1M, 10M rows; every system
    python benchmarks/bench_scale.py --rows 1000 --systems duckdb dpsql   # a quick run

Shop data (``visits``: about one user per ten rows, very uneven rows per user — user ids are
``floor(users * u^3)``, so user 0 alone has about ``users^(-1/3)`` of all rows — scattered over
the file; ``stores``: 50 public stores in 7 cities) is generated once per size into a DuckDB
file under the cache directory (``--cache``, default ``$DPSQL_BENCH_CACHE`` or
``~/.cache/dpsql-bench``; never committed) and reused by later runs.

Each system runs in its own process per size (so memory and import costs do not mix), and
reports, per query, the median of ``--repeats`` (5) timed runs after one warm-up, with the
spread (min–max) and the process's peak RSS:

* ``duckdb``: raw DuckDB (the same aggregate with no privacy); the generic per-unit floor
  ``SELECT user_id, COUNT(*) FROM visits GROUP BY user_id`` (consumed inside DuckDB, so no
  Python fetch is timed); and each query's own floor: its aggregate computed per (unit, group)
  first and then summed per group — what any user-level bounding must at least do;
* ``dpsql``: ``db.sql(...)`` end to end (ledger charge included, a temp ledger file), with the
  per-unit policy; plus its stages (plan = parse + check + analyse + rewrite, execute = the
  bounded SQL on DuckDB, noise = release) from the internals, as bench_pipeline.py does;
* ``dpsql-row``: the same queries with ``PRIVACY UNIT ROW`` (one row per hidden unit: a copy, no per-unit step);
* ``smartnoise``, ``opendp``: peers, run by ``benchmarks/peers.py`` under ``--peer-python``
  (default ``.venv-peers/bin/python`` if present), a separate venv made with
  ``python3 -m venv .venv-peers && .venv-peers/bin/pip install -e '.[bench]'``; a peer that is
  missing or refuses a query shows its error in the table instead of a time.

Every dpsql run uses a slightly different epsilon (1 + i·1e-6), so no run is a free repeat (a
run answered from the ledger would stop the query with an error). The first query of a fresh
dpsql connection is timed separately: it pays whatever dpsql does once per connection (reading
nothing is cached before it), which the warmed-up medians leave out.

Also measured: plan time over the checker's accepted-query corpus (``tests/fixtures/check``) on
the demo shop database. ``--all`` also runs bench_noise.py and bench_utility.py (and
bench_100m.py with ``--with-100m``); ``benchmarks/bench_variants.py`` shows where the bounded
SQL's time goes. Output: a Markdown report on stdout (``--out FILE`` too), to be appended to
benchmarks/RESULTS.md, and the raw numbers as JSON in the cache directory.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import resource
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from fractions import Fraction
from pathlib import Path

import throwaway_budgets  # noqa: F401  (a fresh registry of ledgers for this run)

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
DEFAULT_SIZES = [1_000, 1_000_000, 10_000_000]
SYSTEMS = ["duckdb", "dpsql", "dpsql-row", "smartnoise", "opendp"]
STORES, CITIES, ZIPS = 50, 7, 5000
DELTA = Fraction(1, 10**6)  # for the private-keys query (partition selection needs delta > 0)

POLICY_USER = """
BUDGET EPSILON 100000000 DELTA 0.5;
PRIVATE TABLE visits (
    PRIVACY UNIT user_id, MAX ROWS PER UNIT 10, MAX GROUPS PER UNIT 5,
    amount BOUNDS 0 TO 500, store KEYS FROM stores.store
);
PUBLIC TABLE stores;
"""
POLICY_ROW = """
BUDGET EPSILON 100000000 DELTA 0.5;
PRIVATE TABLE visits (
    PRIVACY UNIT ROW,
    amount BOUNDS 0 TO 500, store KEYS FROM stores.store
);
PUBLIC TABLE stores;
"""

# name -> dpsql SQL, raw DuckDB SQL (no privacy), the query's own per-unit floor, delta, and
# ``row_level=False`` where the query needs a privacy unit (not asked under PRIVACY UNIT ROW).
QUERIES: dict[str, dict] = {
    "COUNT": dict(
        dp="SELECT COUNT(*) AS n FROM visits",
        raw="SELECT COUNT(*) AS n FROM visits",
        floor="SELECT SUM(n) FROM (SELECT user_id, COUNT(*) AS n FROM visits GROUP BY user_id)",
    ),
    "SUM": dict(
        dp="SELECT SUM(amount) AS s FROM visits",
        raw="SELECT SUM(amount) AS s FROM visits",
        floor="SELECT SUM(s) FROM (SELECT user_id, SUM(amount) AS s FROM visits GROUP BY user_id)",
    ),
    "AVG": dict(
        dp="SELECT AVG(amount) AS a FROM visits",
        raw="SELECT AVG(amount) AS a FROM visits",
        floor="SELECT SUM(s) / SUM(n) FROM (SELECT user_id, COUNT(*) AS n, SUM(amount) AS s "
              "FROM visits GROUP BY user_id)",
    ),
    "GROUP BY public keys (50)": dict(
        dp="SELECT store, COUNT(*) AS n, SUM(amount) AS s FROM visits GROUP BY store",
        raw="SELECT store, COUNT(*) AS n, SUM(amount) AS s FROM visits GROUP BY store",
        floor="SELECT store, SUM(n), SUM(s) FROM (SELECT user_id, store, COUNT(*) AS n, SUM(amount) AS s "
              "FROM visits GROUP BY user_id, store) GROUP BY store",
    ),
    "GROUP BY private keys (~5000)": dict(
        dp="SELECT zip, COUNT(*) AS n FROM visits GROUP BY zip",
        raw="SELECT zip, COUNT(*) AS n FROM visits GROUP BY zip",
        floor="SELECT zip, SUM(n), COUNT(*) FROM (SELECT user_id, zip, COUNT(*) AS n FROM visits "
              "GROUP BY user_id, zip) GROUP BY zip",
        delta=DELTA,
    ),
    "JOIN public table (7 cities)": dict(
        dp="SELECT s.city, COUNT(*) AS n FROM visits AS v JOIN stores AS s ON v.store = s.store GROUP BY s.city",
        raw="SELECT s.city, COUNT(*) AS n FROM visits AS v JOIN stores AS s ON v.store = s.store GROUP BY s.city",
        floor="SELECT city, SUM(n) FROM (SELECT v.user_id, s.city, COUNT(*) AS n FROM visits AS v "
              "JOIN stores AS s ON v.store = s.store GROUP BY v.user_id, s.city) GROUP BY city",
    ),
    "per-unit subquery": dict(
        dp="SELECT AVG(n) AS a FROM (SELECT user_id, COUNT(*) AS n FROM visits GROUP BY user_id) AS per_user",
        raw="SELECT AVG(n) AS a FROM (SELECT user_id, COUNT(*) AS n FROM visits GROUP BY user_id) AS per_user",
        floor="SELECT AVG(n) AS a FROM (SELECT user_id, COUNT(*) AS n FROM visits GROUP BY user_id) AS per_user",
        row_level=False,
    ),
}
NOT_ROW_LEVEL = "n/a: needs a privacy unit (refused under PRIVACY UNIT ROW, as it should be)"
UNIT_FLOOR = "SELECT COUNT(*), SUM(n) FROM (SELECT user_id, COUNT(*) AS n FROM visits GROUP BY user_id)"


# -- data -------------------------------------------------------------------------------------

def cache_dir(given: str | None = None) -> Path:
    path = Path(given or os.environ.get("DPSQL_BENCH_CACHE") or Path.home() / ".cache" / "dpsql-bench")
    path.mkdir(parents=True, exist_ok=True)
    return path


def data_path(rows: int, cache: Path) -> Path:
    return cache / f"shop_{rows}.duckdb"


def generate(con, rows: int) -> None:
    """Create ``stores`` and ``visits`` (deterministic: uniforms come from hash(8i + salt)).

    Not ``hash(i, salt)``: DuckDB combines the two hashes so that columns drawn with different
    salts come out almost perfectly correlated (r = 0.998), which made every user visit one store.
    """
    users = max(rows // 10, 1)

    def uniform(salt: int) -> str:
        return f"((hash(i * 8 + {salt}) >> 11) * pow(2, -53))"

    con.execute("SET enable_progress_bar = false")
    con.execute(f"""
        CREATE OR REPLACE TABLE stores AS
        SELECT 'store' || lpad(CAST(i AS VARCHAR), 2, '0') AS store, 'city' || (i % {CITIES}) AS city,
               CAST(100 + (i * 37) % 900 AS INTEGER) AS size
        FROM range({STORES}) t(i)""")
    con.execute(f"""
        CREATE OR REPLACE TABLE visits AS
        SELECT CAST(floor({users} * pow({uniform(1)}, 3)) AS INTEGER) AS user_id,
               'store' || lpad(CAST(CAST(floor({uniform(2)} * {STORES}) AS INTEGER) AS VARCHAR), 2, '0') AS store,
               round({uniform(3)} * 600, 2) AS amount,
               lpad(CAST(CAST(floor({ZIPS} * pow({uniform(4)}, 2)) AS INTEGER) AS VARCHAR), 5, '0') AS zip,
               DATE '2025-01-01' + CAST(floor({uniform(5)} * 365) AS INTEGER) AS day
        FROM range({rows}) t(i)""")


def ensure_data(rows: int, cache: Path) -> Path:
    """The DuckDB file for ``rows`` rows, generated on first use."""
    import duckdb

    path = data_path(rows, cache)
    if path.exists():
        return path
    partial = path.with_suffix(".partial")
    partial.unlink(missing_ok=True)
    start = time.perf_counter()
    con = duckdb.connect(str(partial))
    try:
        generate(con, rows)
        con.execute("CHECKPOINT")
    finally:
        con.close()
    partial.rename(path)
    print(f"# generated {path} ({rows:,} rows) in {time.perf_counter() - start:.1f} s", file=sys.stderr)
    return path


# -- timing -----------------------------------------------------------------------------------

def timed(action, repeats: int, budget: float = 600.0) -> dict:
    """Warm up once, then time ``repeats`` runs (fewer if one run would blow ``budget`` s)."""
    start = time.perf_counter()
    action()
    warm = time.perf_counter() - start
    runs = repeats if warm * repeats <= budget else max(1, min(repeats, int(budget // max(warm, 1e-9))))
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        action()
        times.append(time.perf_counter() - start)
    return stats(times)


def stats(times: list[float]) -> dict:
    return {"median": statistics.median(times), "min": min(times), "max": max(times), "n": len(times)}


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


# -- workers (each runs in its own process) ---------------------------------------------------

def worker_duckdb(db_path: Path, repeats: int, queries: list[str]) -> dict:
    import duckdb

    con = duckdb.connect(str(db_path), read_only=True)
    out = {"floor": timed(lambda: con.execute(UNIT_FLOOR).fetchall(), repeats)}
    for name in queries:
        q = QUERIES[name]
        out[name] = {"raw": timed(lambda: con.execute(q["raw"]).fetchall(), repeats),
                     "query_floor": timed(lambda: con.execute(q["floor"]).fetchall(), repeats)}
    con.close()
    return out


def no_time_limit() -> dict:
    """connect() options that lift dpsql's per-query time limit (a benchmark measures, not guards)."""
    import inspect

    import dpsql

    return {"query_timeout": None} if "query_timeout" in inspect.signature(dpsql.connect).parameters else {}


def worker_dpsql(db_path: Path, repeats: int, queries: list[str], row_level: bool) -> dict:
    """Each query's ``db.sql`` time, plus the one-off costs of a fresh connection: ``connect``
    itself and its first query (timed runs come after a warm-up, so they never include work
    dpsql does once per connection, such as building bounded copies of the private tables)."""
    import dpsql

    ledger = Path(tempfile.mkdtemp(prefix="dpsql-bench-")) / "bench.ledger"
    start = time.perf_counter()
    db = dpsql.connect(str(db_path), policy=POLICY_ROW if row_level else POLICY_USER, ledger=str(ledger),
                       **no_time_limit())
    out = {"_connect": time.perf_counter() - start}
    counter = iter(range(10**9))
    for name in queries:
        if row_level and not QUERIES[name].get("row_level", True):
            out[name] = {"not_applicable": NOT_ROW_LEVEL}
            continue
        if "_first_query" not in out:
            start = time.perf_counter()
            try:
                run_dpsql_query(db, name, counter)
            except (dpsql.DPError, RuntimeError):
                pass  # reported with the timed runs below
            out["_first_query"] = {"query": name, "seconds": time.perf_counter() - start}
        out[name] = time_dpsql_query(db, name, repeats, counter)
    db.close()
    return out


def run_dpsql_query(db, name: str, counter) -> int:
    """One charged answer of the query (never a free repeat); returns its number of rows."""
    q = QUERIES[name]
    epsilon = Fraction(10**6 + next(counter), 10**6)  # a new epsilon: never a stored answer
    result = db.sql(q["dp"], epsilon=epsilon, delta=q.get("delta"))
    if result.repeat:  # a replayed answer would time a ledger lookup, not the query
        raise RuntimeError("dpsql answered a timed run as a free repeat")
    return len(result)


def time_dpsql_query(db, name: str, repeats: int, counter) -> dict:
    import dpsql

    released = []  # rows of the last run: an empty answer would make a fast time meaningless
    try:
        total = timed(lambda: released.append(run_dpsql_query(db, name, counter)), repeats)
    except (dpsql.DPError, RuntimeError) as error:
        return {"error": f"{type(error).__name__}: {error}"}
    entry = {"total": total, "rows": released[-1]}
    q = QUERIES[name]
    try:
        entry.update(stage_times(db, q["dp"], q.get("delta"), repeats))
    except Exception as error:  # internals move; the end-to-end time above still stands
        entry["stages_error"] = f"{type(error).__name__}: {error}"
    return entry


def stage_times(db, sql: str, delta, repeats: int) -> dict:
    """plan / execute / noise of one query from dpsql's internals (as bench_pipeline.py)."""
    from dpsql.query import release
    from dpsql.backends.rewrite import rewrite_statement

    rows_of = getattr(release, "core_rows", None) or getattr(release, "released_rows")

    def plan():
        _, checked, _ = db._check(sql)
        planned = db._preparer.plan(checked, sql, Fraction(1), delta, None)
        return checked, planned, rewrite_statement(planned)

    checked, planned, statement = plan()
    bounded, salt = statement.sql, db._executor.salt_for(statement.needs_salt)
    domain = db._answerer.domains.domain(checked) if planned.selection is None else None
    exact = db._engine.fetch(bounded, salt, bounded=checked.bounded)
    result = {
        "plan": timed(plan, repeats),
        "execute": timed(lambda: db._engine.fetch(bounded, salt, bounded=checked.bounded), repeats),
        "noise": timed(lambda: rows_of(planned, release.release_measures(planned, domain, exact)), repeats),
        "groups": len(exact),
    }
    if planned.selection is None and checked.keys:
        result["domain"] = timed(lambda: read_domain(db, checked), repeats)
    return result


def read_domain(db, checked):
    """The public key domain as a first query reads it: dpsql caches it per connection, so
    timing ``_domain`` alone would time the cache."""
    getattr(db, "_domains", {}).clear()
    return db._answerer.domains.domain(checked)


def worker_plan_corpus(repeats: int) -> dict:
    """Static stages (parse + check + analyse + rewrite) over tests/fixtures/check/accepted.sql."""
    import dpsql
    from dpsql.demo import SHOP_POLICY, build_shop_database

    corpus = ROOT / "tests" / "fixtures" / "check" / "accepted.sql"
    blocks = [b.strip() for b in corpus.read_text().split("\n\n")]
    queries = ["\n".join(l for l in b.splitlines() if not l.startswith("--")).strip() for b in blocks]
    queries = [q for q in queries if q] + [QUERIES[name]["dp"] for name in QUERIES]
    with tempfile.TemporaryDirectory(prefix="dpsql-bench-corpus-") as workdir:
        build_shop_database(Path(workdir) / "shop.duckdb")
        db = dpsql.connect(str(Path(workdir) / "shop.duckdb"), policy=SHOP_POLICY,
                           ledger=str(Path(workdir) / "l.ledger"))
        try:
            per_query, skipped = plan_times(db, queries, repeats)
        finally:
            db.close()
    medians = [q["median"] for q in per_query]
    return {"queries": per_query, "skipped": skipped,
            "median": statistics.median(medians), "max": max(medians), "n": len(medians)}


def plan_times(db, queries: list[str], repeats: int) -> tuple[list[dict], list[dict]]:
    """Plan time of each query, with delta 0 or, if it needs one (private keys), 1e-6."""
    import dpsql
    from dpsql.analysis.plan import PublicQuery
    from dpsql.backends.rewrite import rewrite_plan

    per_query, skipped = [], []
    for sql in queries:
        for delta in (Fraction(0), DELTA):
            def plan():
                _, checked, _ = db._check(sql)
                if isinstance(checked, PublicQuery):
                    return None
                return rewrite_plan(db._preparer.plan(checked, sql, Fraction(1), delta, None))
            try:
                plan()
            except dpsql.DPError as error:
                last = f"{type(error).__name__}: {error}"
                continue
            per_query.append({"sql": sql, "delta": str(delta), **timed(plan, repeats)})
            break
        else:
            skipped.append({"sql": sql, "error": last})
    return per_query, skipped


def dpsql_version() -> str:
    """The dpsql commit, ``+uncommitted`` when dpsql/ has changes (others change the engine
    while benchmarks run, so each worker records the version it ran)."""
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                              cwd=str(ROOT)).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no", "dpsql"],
                               capture_output=True, text=True, cwd=str(ROOT)).stdout.strip()
    except OSError:
        return "unknown"
    return f"{head}{'+uncommitted' if dirty else ''}" if head else "unknown"


def worker_main(args) -> None:
    queries = args.queries or list(QUERIES)
    start = time.perf_counter()
    version = dpsql_version()
    if args.worker == "duckdb":
        results = worker_duckdb(Path(args.db), args.repeats, queries)
    elif args.worker in ("dpsql", "dpsql-row"):
        results = worker_dpsql(Path(args.db), args.repeats, queries, args.worker == "dpsql-row")
    elif args.worker == "plan-corpus":
        results = worker_plan_corpus(args.repeats)
    else:
        raise SystemExit(f"unknown worker {args.worker}")
    print(json.dumps({"system": args.worker, "results": results, "peak_rss_mb": peak_rss_mb(),
                      "wall_s": time.perf_counter() - start, "dpsql": version,
                      "finished": datetime.datetime.now().isoformat(timespec="seconds")}, default=str))


# -- orchestration ----------------------------------------------------------------------------

def default_peer_python() -> str | None:
    for candidate in (os.environ.get("DPSQL_BENCH_PEER_PYTHON"), ROOT / ".venv-peers" / "bin" / "python"):
        if candidate and Path(candidate).exists():
            return str(candidate)
    return None


def run_process(command: list[str], timeout: float) -> dict:
    """Run one worker process and parse the JSON it prints last."""
    start = time.perf_counter()
    try:
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout, cwd=str(ROOT), env=env)
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {timeout:.0f} s"}
    lines = [l for l in done.stdout.splitlines() if l.startswith("{")]
    if done.returncode != 0 or not lines:
        tail = (done.stderr or done.stdout).strip().splitlines()[-3:]
        return {"error": f"exit {done.returncode}: {' | '.join(tail)}", "wall_s": time.perf_counter() - start}
    return json.loads(lines[-1])


def run_system(system: str, rows: int, db: Path, args, queries: list[str]) -> dict:
    if system in ("smartnoise", "opendp"):
        peer = args.peer_python or default_peer_python()
        if peer is None:
            return {"error": "no peer venv: pass --peer-python (a venv with pip install -e '.[bench]')"}
        command = [peer, str(HERE / "peers.py"), "--system", system, "--db", str(db),
                   "--repeats", str(args.repeats), "--queries", *queries]
    else:
        command = [sys.executable, str(Path(__file__).resolve()), "--worker", system, "--db", str(db),
                   "--repeats", str(args.repeats), "--queries", *queries]
    print(f"# {system} on {rows:,} rows ...", file=sys.stderr, flush=True)
    result = run_process(command, args.timeout)
    note = result.get("error") or f"{result.get('wall_s', 0):.1f} s, peak {result.get('peak_rss_mb', 0):.0f} MB"
    print(f"#   {system} on {rows:,} rows: {note}", file=sys.stderr, flush=True)
    return result


def machine_line() -> str:
    import duckdb

    cpu = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    memory = ""
    try:
        kb = int(Path("/proc/meminfo").read_text().split()[1])
        memory = f", {kb / 2**20:.0f} GiB RAM"
    except (OSError, ValueError, IndexError):
        pass
    return (f"dpsql at {dpsql_version()} when the report was written, {platform.system()} {platform.machine()} ({cpu}), {os.cpu_count()} cores{memory}, "
            f"Python {platform.python_version()}, duckdb {duckdb.__version__}; "
            f"{datetime.date.today().isoformat()}; the machine was shared with other engineers' test runs")


def fmt(seconds: float | None) -> str:
    if seconds is None:
        return "—"
    if seconds < 0.1:
        return f"{seconds * 1000:.1f} ms"
    return f"{seconds:.2f} s"


def spread(cell: dict | None, repeats: int = 5) -> str:
    """``median (min–max)``, with the number of runs when fewer than asked (a slow query)."""
    if not cell or "median" not in cell:
        return "—"
    text = f"{fmt(cell['median'])} ({fmt(cell['min'])}–{fmt(cell['max'])})"
    return text + (f" n={cell['n']}" if cell.get("n", repeats) < repeats else "")


def ratio(a: float | None, b: float | None) -> str:
    return "—" if not a or not b else f"{a / b:.2f}×"


def median_of(cell: dict | None, key: str | None = None) -> float | None:
    if cell is None:
        return None
    if key is not None:
        cell = cell.get(key)
    return cell.get("median") if isinstance(cell, dict) else None


def report(all_results: dict, args, queries: list[str]) -> str:
    lines = [f"Machine: {machine_line()}.", "",
             f"Command: `{shlex.join(['python', 'benchmarks/bench_scale.py', *args.argv])}`", "",
             f"Medians of {args.repeats} timed runs after a warm-up, (min–max) in brackets; every system in "
             "its own process per size. dpsql times are `db.sql()` end to end (plan, bounded SQL on DuckDB, "
             "noise, ledger charge). Ratios are of medians: `/raw` over raw DuckDB (the same aggregate with "
             "no privacy), `/floor` over the generic per-unit floor `GROUP BY user_id`, `/q-floor` over the "
             "query's own per-(unit, group) pre-aggregation, `/dpsql` over dpsql with the user-level policy.",
             ""]
    for rows, by_system in all_results.items():
        lines += size_section(int(rows), by_system, queries, args.repeats)
    return "\n".join(lines)


def size_section(rows: int, by_system: dict, queries: list[str], repeats: int) -> list[str]:
    """One size: provenance, then dpsql against DuckDB, the peers, and dpsql's stages."""
    duck = by_system.get("duckdb", {}).get("results", {})
    lines = [f"### {rows:,} rows", ""]
    versions = sorted({r["dpsql"] for s, r in by_system.items() if s.startswith("dpsql") and r.get("dpsql")})
    if versions:
        finished = ", ".join(f"{s} {r['finished'][11:16]}" for s, r in by_system.items() if r.get("finished"))
        lines += [f"dpsql version measured: {', '.join(versions)}; finished {finished}.", ""]
    memory = ", ".join(f"{s} {r['peak_rss_mb']:.0f} MB" for s, r in by_system.items() if "peak_rss_mb" in r)
    lines += [f"Per-unit floor `SELECT user_id, COUNT(*) FROM visits GROUP BY user_id`: "
              f"{spread(duck.get('floor'), repeats)}. Peak RSS per process: {memory}.", ""]
    lines += one_off_costs(by_system)
    lines += dpsql_table(duck, by_system, queries, repeats) + [""]
    if any(system in by_system for system in PEERS):
        lines += peer_table(by_system, queries, repeats) + [""]
    lines += stages_table(duck, by_system, queries) + [""]
    return lines


def one_off_costs(by_system: dict) -> list[str]:
    """What a fresh dpsql connection pays once, outside the timed runs."""
    parts = []
    for label, system in (("user-level", "dpsql"), ("row-level", "dpsql-row")):
        results = by_system.get(system, {}).get("results", {})
        first = results.get("_first_query")
        if "_connect" in results and first:
            parts.append(f"{label}: `connect` {fmt(results['_connect'])}, first query ({first['query']}) "
                         f"{fmt(first['seconds'])}")
    if not parts:
        return []
    return ["One-off costs of a fresh dpsql connection, not in the medians below (the first query "
            "includes whatever dpsql builds once per connection): " + "; ".join(parts) + ".", ""]


def cell_of(by_system: dict, system: str, name: str) -> tuple[dict | None, str | None]:
    """(the system's entry for a query, or None with the text to show instead of a time)."""
    result = by_system.get(system)
    if result is None:
        return None, "not run"
    if "results" not in result:
        return None, f"failed: {result.get('error', 'no result')[:80]}"
    entry = result["results"].get(name)
    if entry is None:
        return None, "no result"
    if "not_applicable" in entry:
        return None, entry["not_applicable"]
    if "error" in entry:
        return None, f"refused/failed: {entry['error'][:90]}"
    return entry, None


def timing(entry: dict, repeats: int) -> str:
    """The entry's time, flagged when the answer had no rows (a censored answer is not comparable)."""
    text = spread(entry.get("total"), repeats)
    return text + (" (0 rows released)" if entry.get("rows") == 0 else "")


def dpsql_table(duck: dict, by_system: dict, queries: list[str], repeats: int) -> list[str]:
    lines = ["| query | raw DuckDB | query floor | dpsql (user) | /raw | /floor | /q-floor | dpsql (row) | /raw |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    floor = median_of(duck.get("floor"))
    for name in queries:
        raw = median_of(duck.get(name, {}).get("raw"))
        qfloor = median_of(duck.get(name, {}).get("query_floor"))
        cells = [name, spread(duck.get(name, {}).get("raw"), repeats),
                 spread(duck.get(name, {}).get("query_floor"), repeats)]
        user, missing = cell_of(by_system, "dpsql", name)
        total = median_of(user, "total")
        cells += [missing, "", "", ""] if user is None else \
            [timing(user, repeats), ratio(total, raw), ratio(total, floor), ratio(total, qfloor)]
        row, missing = cell_of(by_system, "dpsql-row", name)
        cells += [missing, ""] if row is None else [timing(row, repeats), ratio(median_of(row, "total"), raw)]
        lines.append("| " + " | ".join(cells) + " |")
    return lines


PEERS = {"smartnoise": "SmartNoise SQL", "opendp": "OpenDP Polars"}


def peer_table(by_system: dict, queries: list[str], repeats: int) -> list[str]:
    lines = ["Peers (benchmarks/peers.py, same data and total epsilon 1 per query; loading the data into "
             "OpenDP's LazyFrame is not timed):", "",
             "| query | " + " | ".join(f"{label} | /raw | /dpsql" for label in PEERS.values()) + " |",
             "|---|" + "---:|---:|---:|" * len(PEERS)]
    duck = by_system.get("duckdb", {}).get("results", {})
    for name in queries:
        raw = median_of(duck.get(name, {}).get("raw"))
        dp, _ = cell_of(by_system, "dpsql", name)
        cells = [name]
        for system in PEERS:
            entry, missing = cell_of(by_system, system, name)
            total = median_of(entry, "total")
            cells += [missing, "", ""] if entry is None else \
                [timing(entry, repeats), ratio(total, raw), ratio(total, median_of(dp, "total"))]
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def stages_table(duck: dict, by_system: dict, queries: list[str]) -> list[str]:
    lines = ["dpsql stages (medians): plan = parse + check + analyse + rewrite; execute = the bounded SQL on "
             "DuckDB; noise = release; domain = reading the public keys (cached per connection after the "
             "first query, so not part of the total); overhead = dpsql total − raw DuckDB.", "",
             "| query | policy | plan | execute | noise | domain | groups | dpsql total | raw DuckDB | overhead |",
             "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for label, system in (("user", "dpsql"), ("row", "dpsql-row")):
        for name in queries:
            entry, _ = cell_of(by_system, system, name)
            if entry is None:
                continue
            raw = median_of(duck.get(name, {}).get("raw"))
            total = median_of(entry, "total")
            stages = " | ".join(fmt(median_of(entry, stage)) for stage in ("plan", "execute", "noise", "domain"))
            if "stages_error" in entry:
                stages = f"stages failed: {entry['stages_error'][:80]} | | |"
            lines.append(f"| {name} | {label} | {stages} | {entry.get('groups', '—')} | {fmt(total)} | "
                         f"{fmt(raw)} | {fmt(total - raw) if total and raw else '—'} |")
    return lines


def corpus_report(result: dict) -> str:
    if "error" in result:
        return f"Plan-time corpus: failed ({result['error']})."
    r = result["results"]
    slow = sorted(r["queries"], key=lambda q: -q["median"])[:3]
    text = (f"Plan time (parse + check + analyse + rewrite, no data read) over {r['n']} accepted queries "
            f"(tests/fixtures/check/accepted.sql on the demo shop database, plus this suite's queries): "
            f"median {fmt(r['median'])}, slowest {fmt(r['max'])}. Slowest three: "
            + "; ".join(f"`{q['sql'][:70]}` {fmt(q['median'])}" for q in slow) + ".")
    if r["skipped"]:
        text += f" Not planned ({len(r['skipped'])}): " + "; ".join(
            f"`{s['sql'][:50]}` ({s['error'][:60]})" for s in r["skipped"]) + "."
    return text


def extra_sections(args, cache: Path) -> list[str]:
    """--all: the noise, utility (and 100M-row) benchmarks, each in its own process."""
    peer = args.peer_python or default_peer_python()
    scripts = [("bench_noise.py", ["--groups", str(args.noise_groups)]),
               ("bench_utility.py", ["--cache", str(cache), "--rows", str(args.utility_rows),
                                     "--runs", str(args.utility_runs)] + (["--peer-python", peer] if peer else []))]
    if args.with_100m:
        scripts.append(("bench_100m.py", ["--cache", str(cache)]))
    sections = []
    for script, extra in scripts:
        print(f"# {script} ...", file=sys.stderr, flush=True)
        done = subprocess.run([sys.executable, str(HERE / script), *extra], capture_output=True, text=True,
                              cwd=str(ROOT))
        sections += [done.stdout.strip() or f"{script} failed: {done.stderr.strip()[-300:]}", ""]
    return sections


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, nargs="+", default=DEFAULT_SIZES)
    parser.add_argument("--systems", nargs="+", default=SYSTEMS, choices=SYSTEMS)
    parser.add_argument("--queries", nargs="+", default=list(QUERIES), choices=list(QUERIES),
                        help="query names (default: all)")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--cache", default=None, help="where the generated DuckDB files live")
    parser.add_argument("--peer-python", default=None, help="python of a venv with dpsql[bench] installed")
    parser.add_argument("--timeout", type=float, default=4 * 3600, help="seconds per system and size")
    parser.add_argument("--no-corpus", action="store_true", help="skip the plan-time corpus")
    parser.add_argument("--all", action="store_true", help="also run bench_noise.py and bench_utility.py")
    parser.add_argument("--noise-groups", type=int, default=1_000_000, help="with --all: bench_noise.py --groups")
    parser.add_argument("--utility-rows", type=int, default=100_000, help="with --all: bench_utility.py --rows")
    parser.add_argument("--utility-runs", type=int, default=1000, help="with --all: bench_utility.py --runs")
    parser.add_argument("--with-100m", action="store_true", help="with --all: also bench_100m.py (slow)")
    parser.add_argument("--out", default=None, help="also write the Markdown report to this file")
    parser.add_argument("--reuse", default=None,
                        help="an earlier scale-*.json: systems not run now are taken from it (e.g. slow peers)")
    parser.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--db", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    args.argv = argv
    if args.worker:
        return worker_main(args)
    cache = cache_dir(args.cache)
    all_results: dict = {}
    earlier = json.loads(Path(args.reuse).read_text()) if args.reuse else {}
    for rows in args.rows:
        db = ensure_data(rows, cache)
        all_results[rows] = {system: run_system(system, rows, db, args, args.queries) for system in args.systems}
        for system, result in earlier.get(str(rows), {}).items():
            if system not in all_results[rows]:
                all_results[rows][system] = {**result, "reused": args.reuse}
    sections = ["## Scale (issue 7)", "", report(all_results, args, args.queries)]
    if not args.no_corpus and "dpsql" in args.systems:
        corpus = run_process([sys.executable, str(Path(__file__).resolve()), "--worker", "plan-corpus",
                              "--repeats", str(args.repeats)], args.timeout)
        all_results["plan_corpus"] = corpus
        sections += [corpus_report(corpus), ""]
    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    (cache / f"scale-{stamp}.json").write_text(json.dumps(all_results, indent=1, default=str))
    if args.all:
        sections += extra_sections(args, cache)
    text = "\n".join(sections)
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n")


if __name__ == "__main__":
    main()
