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
* ``dpsql-row``: the same queries with ``PRIVACY UNIT ROW`` (no bounding needed);
* ``smartnoise``, ``opendp``: peers, run by ``benchmarks/peers.py`` under ``--peer-python``
  (a venv with ``pip install -e '.[bench]'``; default ``.venv-peers/bin/python`` if present).

Every dpsql run uses a slightly different epsilon (1 + i·1e-6), so no run is a free repeat.
Also measured: plan time over the checker's accepted-query corpus (``tests/fixtures/check``) on
the demo shop database. ``--all`` also runs bench_noise.py and bench_utility.py (and
bench_100m.py with ``--with-100m``). Output: a Markdown report on stdout (``--out FILE`` too)
and the raw numbers as JSON in the cache directory.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from fractions import Fraction
from pathlib import Path

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

# name -> dpsql SQL, raw DuckDB SQL (no privacy), the query's own per-unit floor, delta.
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
    ),
}
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
    import dpsql

    ledger = Path(tempfile.mkdtemp(prefix="dpsql-bench-")) / "bench.ledger"
    db = dpsql.connect(str(db_path), policy=POLICY_ROW if row_level else POLICY_USER, ledger=str(ledger),
                       **no_time_limit())
    out = {}
    counter = iter(range(10**9))
    for name in queries:
        q = QUERIES[name]
        delta = q.get("delta")

        def run():
            epsilon = Fraction(10**6 + next(counter), 10**6)  # never a free repeat
            return db.sql(q["dp"], epsilon=epsilon, delta=delta)

        try:
            total = timed(run, repeats)
        except dpsql.DPError as error:
            out[name] = {"error": f"{type(error).__name__}: {error}"}
            continue
        entry = {"total": total}
        try:
            entry.update(stage_times(db, q["dp"], delta, repeats))
        except Exception as error:  # internals move; the end-to-end time above still stands
            entry["stages_error"] = f"{type(error).__name__}: {error}"
        out[name] = entry
    db.close()
    return out


def stage_times(db, sql: str, delta, repeats: int) -> dict:
    """plan / execute / noise of one query from dpsql's internals (as bench_pipeline.py)."""
    from dpsql import release
    from dpsql.rewrite import rewrite_plan

    rows_of = getattr(release, "core_rows", None) or getattr(release, "released_rows")

    def plan():
        _, checked, _ = db._check(sql)
        planned = db._plan(checked, sql, Fraction(1), delta, None)
        return checked, planned, rewrite_plan(planned)

    checked, planned, bounded = plan()
    salt = db._salt_for(bounded)
    domain = db._domain(checked) if planned.selection is None else None
    exact = db._engine.fetch(bounded, salt)
    result = {
        "plan": timed(plan, repeats),
        "execute": timed(lambda: db._engine.fetch(bounded, salt), repeats),
        "noise": timed(lambda: rows_of(planned, release.release_measures(planned, domain, exact)), repeats),
        "groups": len(exact),
    }
    if planned.selection is None and checked.keys:
        result["domain"] = timed(lambda: db._domain(checked), repeats)
    return result


def worker_plan_corpus(repeats: int) -> dict:
    """Static stages (parse + check + analyse + rewrite) over tests/fixtures/check/accepted.sql."""
    import dpsql
    from dpsql.demo import build_shop_database
    from dpsql.plan import PublicQuery
    from dpsql.rewrite import rewrite_plan

    corpus = ROOT / "tests" / "fixtures" / "check" / "accepted.sql"
    blocks = [b.strip() for b in corpus.read_text().split("\n\n")]
    queries = ["\n".join(l for l in b.splitlines() if not l.startswith("--")).strip() for b in blocks]
    queries = [q for q in queries if q] + [QUERIES[name]["dp"] for name in QUERIES]
    workdir = Path(tempfile.mkdtemp(prefix="dpsql-bench-corpus-"))
    build_shop_database(workdir / "shop.duckdb")
    from dpsql.demo import SHOP_POLICY
    db = dpsql.connect(str(workdir / "shop.duckdb"), policy=SHOP_POLICY, ledger=str(workdir / "l.ledger"))
    per_query, skipped = [], []
    for sql in queries:
        for delta in (Fraction(0), DELTA):
            def plan():
                _, checked, _ = db._check(sql)
                if isinstance(checked, PublicQuery):
                    return None
                return rewrite_plan(db._plan(checked, sql, Fraction(1), delta, None))
            try:
                plan()
            except dpsql.DPError as error:
                last = f"{type(error).__name__}: {error}"
                continue
            per_query.append({"sql": sql, "delta": str(delta), **timed(plan, repeats)})
            break
        else:
            skipped.append({"sql": sql, "error": last})
    db.close()
    medians = [q["median"] for q in per_query]
    return {"queries": per_query, "skipped": skipped,
            "median": statistics.median(medians), "max": max(medians), "n": len(medians)}


def granted_variants(bounded: str) -> dict[str, str]:
    """Equivalent rewrites of a grouped, user-level bounded SQL (analysis of the window's cost).

    Built by text substitution on dpsql's current output, so a variant whose pattern is gone
    is skipped. Every variant must return exactly the rows of the original (checked by caller).
    """
    import re

    out = {"as generated": bounded}
    out["top_n_window_elimination off"] = "SET disabled_optimizers = 'top_n_window_elimination';\n" + bounded
    no_huge = re.sub(r"SUM\(CAST\((v_m\d+) AS HUGEINT\)\)", r"SUM(\1)", bounded)
    if no_huge != bounded:
        out["SUM(v) instead of SUM(CAST(v AS HUGEINT))"] = no_huge
    window = re.search(r"COALESCE\(SUM\(n\) OVER \((PARTITION BY dp_unit ORDER BY [^)]*\)[^)]*?) ROWS BETWEEN "
                       r"UNBOUNDED PRECEDING AND 1 PRECEDING\), 0\)", bounded)
    if window:
        spec = window.group(1)
        running = bounded.replace(window.group(0), f"(SUM(n) OVER ({spec} ROWS BETWEEN UNBOUNDED PRECEDING "
                                                   f"AND CURRENT ROW) - n)")
        out["running sum incl. current row − n"] = running
    sizes = re.search(r"dp_sizes AS \(\n  SELECT \*, SUM\(n\) OVER \(PARTITION BY dp_unit\) AS dp_total, "
                      r"COUNT\(\*\) OVER \(PARTITION BY dp_unit\) AS dp_groups\n  FROM dp_units\n\)", bounded)
    split = re.search(r"dp_granted AS \(\n  SELECT \* EXCLUDE \(dp_total, dp_groups\), n AS b, 1 AS group_rank\n"
                      r"  FROM dp_sizes WHERE (dp_total <= (\d+) AND dp_groups <= (\d+))\n  UNION ALL\n"
                      r"  SELECT \* EXCLUDE \(dp_total, dp_groups\), (.*)\n  FROM dp_sizes WHERE NOT \(.*\)\n\)", bounded)
    units = re.search(r"dp_units AS \(\n  SELECT (.*)\n  FROM dp_values\n  GROUP BY (.*)\n\)", bounded)
    if sizes and split and units:
        light, k, groups, expressions = split.group(1), split.group(2), split.group(3), split.group(4)
        everyone = f"dp_granted AS (\n  SELECT *, {expressions}\n  FROM dp_units\n)"
        out["window over every unit (no light/heavy split)"] = bounded.replace(
            sizes.group(0) + ", " + split.group(0), everyone)
        out["light/heavy totals by GROUP BY unit + join (not a partition-only window)"] = bounded.replace(
            sizes.group(0), "dp_sizes AS (\n  SELECT * FROM dp_units JOIN (SELECT dp_unit, SUM(n) AS dp_total, "
            "COUNT(*) AS dp_groups FROM dp_units GROUP BY dp_unit) USING (dp_unit)\n)")
        columns = ["dp_unit"] + [c.strip() for c in units.group(2).split(",")][1:]
        columns += re.findall(r" AS (\w+)(?=,|$)", units.group(1))
        keys = [c for c in columns[1:] if re.fullmatch(r"g\d+", c)]
        fields = ", ".join(f"'{c}': {c}" for c in columns[1:])
        order = "{" + ", ".join([f"'h': hash($salt, dp_unit, {', '.join(keys)})"] + [f"'{g}': {g}" for g in keys]) + "}"
        heavy = (f"  SELECT {', '.join(columns)}, GREATEST(LEAST(n, {k} - earlier), 0) AS b, group_rank FROM (\n"
                 f"    SELECT dp_unit, unnest(list_transform(top, lambda x, i: struct_insert(x, group_rank := i, "
                 f"earlier := COALESCE(list_sum(list_transform(top[1:i - 1], lambda y: y.n)), 0))), recursive := true)\n"
                 f"    FROM (SELECT dp_unit, min_by({{{fields}}}, {order}, {groups}) AS top\n"
                 f"          FROM dp_sizes WHERE NOT ({light}) GROUP BY dp_unit)\n  )")
        topk = (f"dp_granted AS (\n  SELECT * EXCLUDE (dp_total, dp_groups), n AS b, 1 AS group_rank\n"
                f"  FROM dp_sizes WHERE {light}\n  UNION ALL\n{heavy}\n)")
        out[f"heavy units: first {groups} groups by min_by(..., {groups}) instead of a window sort"] = \
            bounded.replace(split.group(0), topk)
    granted = re.search(r"dp_granted AS \(\n  SELECT \*, (.*)\n  FROM dp_units\n\)", bounded)
    limits = re.search(r"WHERE b > 0 AND group_rank <= (\d+)", bounded)
    k = re.search(r"LEAST\(n, (\d+) - ", bounded)
    if granted and limits and k:
        expressions, groups, rows = granted.group(1), limits.group(1), k.group(1)
        light = f"dp_tn <= {rows} AND dp_ng <= {groups}"
        split = (f"dp_totals AS (\n  SELECT *, SUM(n) OVER (PARTITION BY dp_unit) AS dp_tn, "
                 f"COUNT(*) OVER (PARTITION BY dp_unit) AS dp_ng\n  FROM dp_units\n), dp_granted AS (\n"
                 f"  SELECT * EXCLUDE (dp_tn, dp_ng), n AS b, 1 AS group_rank FROM dp_totals WHERE {light}\n"
                 f"  UNION ALL\n  SELECT * EXCLUDE (dp_tn, dp_ng), {expressions} FROM dp_totals WHERE NOT ({light})\n)")
        out["window only for units over the limits (partition-only window for totals)"] = \
            bounded.replace(granted.group(0), split)
        joined = (f"dp_tot AS (\n  SELECT dp_unit, SUM(n) AS dp_tn, COUNT(*) AS dp_ng FROM dp_units GROUP BY dp_unit\n"
                  f"), dp_totals AS (\n  SELECT * FROM dp_units JOIN dp_tot USING (dp_unit)\n), dp_granted AS (\n"
                  f"  SELECT * EXCLUDE (dp_tn, dp_ng), n AS b, 1 AS group_rank FROM dp_totals WHERE {light}\n"
                  f"  UNION ALL\n  SELECT * EXCLUDE (dp_tn, dp_ng), {expressions} FROM dp_totals WHERE NOT ({light})\n)")
        out["window only for units over the limits (GROUP BY unit + join for totals)"] = \
            bounded.replace(granted.group(0), joined)
    return out


def worker_variants(db_path: Path, repeats: int, queries: list[str]) -> dict:
    """Explain + EXPLAIN ANALYZE of each query's bounded SQL, and timings of equivalent variants."""
    import duckdb

    import dpsql
    from dpsql.rewrite import rewrite_plan

    out = {}
    ledger = Path(tempfile.mkdtemp(prefix="dpsql-bench-")) / "bench.ledger"
    for policy_name, policy in (("user", POLICY_USER), ("row", POLICY_ROW)):
        db = dpsql.connect(str(db_path), policy=policy, ledger=str(ledger), **no_time_limit())
        plans = {}
        for name in queries:
            q = QUERIES[name]
            try:
                _, checked, _ = db._check(q["dp"])
                plans[name] = rewrite_plan(db._plan(checked, q["dp"], Fraction(1), q.get("delta"), None))
            except dpsql.DPError as error:
                plans[name] = None
                out[f"{policy_name}: {name}"] = {"error": str(error)}
        salt = {"salt": db._ledger.salt().hex()}
        db.close()
        con = duckdb.connect(str(db_path), read_only=True)
        for name, bounded in plans.items():
            if bounded is None:
                continue
            params = salt if "$salt" in bounded else {}
            entry = {"bounded_sql": bounded, "variants": {}}
            plan_rows = con.execute("EXPLAIN ANALYZE " + bounded, params).fetchall()
            entry["explain_analyze"] = plan_rows[0][1] if plan_rows else ""
            reference = None
            variants = granted_variants(bounded) if policy_name == "user" else {"as generated": bounded}
            if policy_name == "user":
                variants["query floor (per-(unit, group) pre-aggregation, no bounding)"] = QUERIES[name]["floor"]
                variants["raw DuckDB"] = QUERIES[name]["raw"]
            if policy_name == "row":
                import re
                no_huge = re.sub(r"SUM\(CAST\((v_m\d+) AS HUGEINT\)\)", r"SUM(\1)", bounded)
                if no_huge != bounded:
                    variants["SUM(v) instead of SUM(CAST(v AS HUGEINT))"] = no_huge
                variants["raw DuckDB"] = QUERIES[name]["raw"]
            # Round robin: every variant once per round, so load from other processes on this
            # shared machine hits all variants alike; the first round is the warm-up.
            runners, times = {}, {}
            for label, sql in variants.items():
                statements = [s for s in sql.split(";\n") if s.strip()]
                setup, main = statements[:-1], statements[-1]
                vcon = duckdb.connect(str(db_path), read_only=True) if setup else con
                for statement in setup:
                    vcon.execute(statement)
                p = params if "$salt" in main else {}
                try:
                    rows = sorted(map(repr, vcon.execute(main, p).fetchall()))
                except duckdb.Error as error:
                    entry["variants"][label] = {"sql": sql, "same_rows": None, "error": str(error)[:300]}
                    continue
                runners[label] = (vcon, main, p)
                if label == "as generated":
                    reference = rows
                same = rows == reference if label in granted_variants(bounded) or label.startswith("SUM(v)") \
                    else None
                entry["variants"][label] = {"sql": sql, "same_rows": same}
                times[label] = []
            for _ in range(repeats):
                for label, (vcon, main, p) in runners.items():
                    begin = time.perf_counter()
                    vcon.execute(main, p).fetchall()
                    times[label].append(time.perf_counter() - begin)
            for label, (vcon, _, _) in runners.items():
                entry["variants"][label].update(stats(times[label]))
                if vcon is not con:
                    vcon.close()
            out[f"{policy_name}: {name}"] = entry
        if policy_name == "user":
            out["user: bound once per policy"] = bound_once(con, salt, repeats)
        con.close()
    return out


BOUND_ONCE = (
    "CREATE OR REPLACE TEMP TABLE dp_bounded AS SELECT user_id, store, zip, amount FROM visits "
    "WHERE user_id IS NOT NULL QUALIFY ROW_NUMBER() OVER (PARTITION BY user_id "
    "ORDER BY hash($salt, user_id, store, zip, amount, day)) <= 10")
ON_BOUNDED = ("SELECT store, COUNT(*) AS m0, SUM(CAST(ROUND(LEAST(GREATEST(amount, 0), 500) * 262144) AS BIGINT)) AS m1 "
              "FROM dp_bounded WHERE store IN (SELECT store FROM stores) GROUP BY store")


def bound_once(con, salt: dict, repeats: int) -> dict:
    """Bounding once per policy (at most 10 rows per unit by a salted hash of the row), then a
    row-level query on the kept rows: the one-off cost and the per-query cost."""
    try:
        build = timed(lambda: con.execute(BOUND_ONCE, salt).fetchall(), repeats)
        query = timed(lambda: con.execute(ON_BOUNDED).fetchall(), repeats)
        kept = con.execute("SELECT COUNT(*) FROM dp_bounded").fetchone()[0]
    except Exception as error:
        return {"error": f"{type(error).__name__}: {error}"}
    return {"bounded_sql": BOUND_ONCE + ";\n" + ON_BOUNDED, "explain_analyze": "",
            "variants": {"as generated": {**build, "sql": BOUND_ONCE, "same_rows": None},
                         f"then GROUP BY store on the {kept:,} kept rows": {**query, "sql": ON_BOUNDED,
                                                                            "same_rows": None}}}


def dpsql_version() -> str:
    """The dpsql commit the worker runs (others change the engine while benchmarks run)."""
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
    elif args.worker == "variants":
        results = worker_variants(Path(args.db), args.repeats, queries)
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
    commit = ""
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                              cwd=str(ROOT)).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no", "dpsql"],
                               capture_output=True, text=True, cwd=str(ROOT)).stdout.strip()
        commit = f"dpsql at {head}{' with uncommitted changes to dpsql/' if dirty else ''} when the report was written, " if head else ""
    except OSError:
        pass
    return (f"{commit}{platform.system()} {platform.machine()} ({cpu}), {os.cpu_count()} cores{memory}, "
            f"Python {platform.python_version()}, duckdb {duckdb.__version__}; "
            f"{datetime.date.today().isoformat()}; the machine was shared with other engineers' test runs")


def fmt(seconds: float | None) -> str:
    if seconds is None:
        return "—"
    if seconds < 0.1:
        return f"{seconds * 1000:.1f} ms"
    return f"{seconds:.2f} s"


def spread(cell: dict | None) -> str:
    if not cell or "median" not in cell:
        return "—"
    text = f"{fmt(cell['median'])} ({fmt(cell['min'])}–{fmt(cell['max'])})"
    return text + (f" n={cell['n']}" if cell.get("n", 5) < 5 else "")


def ratio(a: float | None, b: float | None) -> str:
    return "—" if not a or not b else f"{a / b:.2f}×"


def median_of(cell: dict | None, key: str | None = None) -> float | None:
    if cell is None:
        return None
    if key is not None:
        cell = cell.get(key)
    return cell.get("median") if isinstance(cell, dict) else None


def report(all_results: dict, args) -> str:
    lines = [f"Machine: {machine_line()}.", ""]
    lines += [f"Command: `python benchmarks/bench_scale.py {' '.join(args.argv)}`".rstrip(), ""]
    lines += ["Medians of 5 timed runs after a warm-up, (min–max) in brackets; every system in its own "
              "process per size. Ratios are medians over raw DuckDB's median (`/raw`), over the generic "
              "per-unit floor `GROUP BY user_id` (`/floor`), and over the query's own per-(unit, group) "
              "pre-aggregation (`/q-floor`).", ""]
    for rows, by_system in all_results.items():
        duck = by_system.get("duckdb", {}).get("results", {})
        floor = median_of(duck.get("floor"))
        lines += [f"### {int(rows):,} rows", ""]
        versions = sorted({r.get("dpsql") for s, r in by_system.items() if s.startswith("dpsql") and r.get("dpsql")})
        if versions:
            lines.append(f"dpsql version measured: {', '.join(versions)}; finished "
                         + ", ".join(f"{s} {r['finished'][11:16]}" for s, r in by_system.items() if r.get("finished"))
                         + ".")
            lines.append("")
        lines.append(f"Per-unit floor `SELECT user_id, COUNT(*) FROM visits GROUP BY user_id`: "
                     f"{spread(duck.get('floor'))}. Peak RSS per process: " + ", ".join(
                         f"{s} {r.get('peak_rss_mb', 0):.0f} MB" for s, r in by_system.items() if "peak_rss_mb" in r)
                     + ".")
        lines.append("")
        lines.append("| query | raw DuckDB | query floor | dpsql (user) | /raw | /floor | /q-floor | dpsql (row) | "
                     "/raw | SmartNoise | /raw | OpenDP Polars | /raw |")
        lines.append("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
        for name in QUERIES:
            raw_cell = duck.get(name, {}).get("raw")
            raw = median_of(raw_cell)
            qfloor = median_of(duck.get(name, {}).get("query_floor"))
            cells = [name, spread(raw_cell), spread(duck.get(name, {}).get("query_floor"))]
            for system in ("dpsql", "dpsql-row", "smartnoise", "opendp"):
                result = by_system.get(system)
                if result is None:
                    cells += ["not run"] + (["", "", ""] if system == "dpsql" else [""])
                    continue
                entry = result.get("results", {}).get(name) if "results" in result else None
                if entry is None:
                    cells += [f"failed: {result.get('error', 'no result')[:60]}"] + (["", "", ""] if system == "dpsql" else [""])
                    continue
                if "error" in entry:
                    cells += [f"refused/failed: {entry['error'][:70]}"] + (["", "", ""] if system == "dpsql" else [""])
                    continue
                total = median_of(entry, "total")
                cells.append(spread(entry.get("total")))
                cells.append(ratio(total, raw))
                if system == "dpsql":
                    cells += [ratio(total, floor), ratio(total, qfloor)]
            lines.append("| " + " | ".join(cells) + " |")
        dp = by_system.get("dpsql", {}).get("results", {})
        row = by_system.get("dpsql-row", {}).get("results", {})
        if dp or row:
            lines += ["", "dpsql stages (medians): plan = parse + check + analyse + rewrite; execute = the bounded "
                      "SQL on DuckDB; noise = release; overhead = dpsql total − raw DuckDB.", "",
                      "| query | policy | plan | execute | noise | groups | dpsql total | raw DuckDB | overhead |",
                      "|---|---|---:|---:|---:|---:|---:|---:|---:|"]
            for label, results in (("user", dp), ("row", row)):
                for name in QUERIES:
                    entry = results.get(name)
                    if not entry or "error" in entry:
                        continue
                    raw = median_of(duck.get(name, {}).get("raw"))
                    total = median_of(entry, "total")
                    lines.append(f"| {name} | {label} | {fmt(median_of(entry, 'plan'))} | "
                                 f"{fmt(median_of(entry, 'execute'))} | {fmt(median_of(entry, 'noise'))} | "
                                 f"{entry.get('groups', '—')} | {fmt(total)} | {fmt(raw)} | "
                                 f"{fmt(total - raw) if total and raw else '—'} |")
        lines.append("")
    return "\n".join(lines)


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


def variants_main(args, cache: Path, queries: list[str]) -> None:
    """--variants: per size, EXPLAIN ANALYZE files in the cache and a table of variant timings."""
    lines = ["### Where the time goes: equivalent rewrites of the bounded SQL", "",
             f"Machine: {machine_line()}.", ""]
    for rows in args.rows:
        db = ensure_data(rows, cache)
        result = run_process([sys.executable, str(Path(__file__).resolve()), "--worker", "variants", "--db",
                              str(db), "--repeats", str(args.repeats), "--queries", *queries], args.timeout)
        if "error" in result:
            lines.append(f"{rows:,} rows: failed: {result['error']}")
            continue
        lines += [f"#### {rows:,} rows", "", "| policy: query | variant | median (min–max) | vs generated | same rows |",
                  "|---|---|---:|---:|---|"]
        for label, entry in result["results"].items():
            if "error" in entry:
                lines.append(f"| {label} | refused: {entry['error'][:60]} | | | |")
                continue
            stem = label.replace(": ", "_").replace(" ", "_").replace("(", "").replace(")", "").replace("~", "")
            (cache / f"explain_{rows}_{stem}.txt").write_text(
                entry["bounded_sql"] + "\n\n" + entry["explain_analyze"])
            base = entry["variants"]["as generated"]["median"]
            for variant, v in entry["variants"].items():
                if "error" in v:
                    lines.append(f"| {label} | {variant} | failed: {v['error'][:80]} | | |")
                    continue
                lines.append(f"| {label} | {variant} | {spread(v)} | {ratio(v['median'], base)} | "
                             f"{'—' if v['same_rows'] is None else ('yes' if v['same_rows'] else 'NO')} |")
        lines.append("")
        (cache / f"variants_{rows}.json").write_text(json.dumps(result, indent=1, default=str))
    text = "\n".join(lines)
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n")


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, nargs="+", default=DEFAULT_SIZES)
    parser.add_argument("--systems", nargs="+", default=SYSTEMS, choices=SYSTEMS)
    parser.add_argument("--queries", nargs="+", default=None, help="query names (default: all)")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--cache", default=None, help="where the generated DuckDB files live")
    parser.add_argument("--peer-python", default=None, help="python of a venv with dpsql[bench] installed")
    parser.add_argument("--timeout", type=float, default=4 * 3600, help="seconds per system and size")
    parser.add_argument("--no-corpus", action="store_true", help="skip the plan-time corpus")
    parser.add_argument("--all", action="store_true", help="also run bench_noise.py and bench_utility.py")
    parser.add_argument("--with-100m", action="store_true", help="with --all: also bench_100m.py (slow)")
    parser.add_argument("--out", default=None, help="also write the Markdown report to this file")
    parser.add_argument("--reuse", default=None,
                        help="an earlier scale-*.json: systems not run now are taken from it (e.g. slow peers)")
    parser.add_argument("--variants", action="store_true",
                        help="instead: EXPLAIN ANALYZE each bounded SQL and time equivalent rewrites")
    parser.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--db", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    args.argv = argv
    if args.worker:
        return worker_main(args)
    cache = cache_dir(args.cache)
    queries = args.queries or list(QUERIES)
    if args.variants:
        return variants_main(args, cache, queries)
    all_results: dict = {}
    earlier = json.loads(Path(args.reuse).read_text()) if args.reuse else {}
    for rows in args.rows:
        db = ensure_data(rows, cache)
        all_results[rows] = {system: run_system(system, rows, db, args, queries) for system in args.systems}
        for system, result in earlier.get(str(rows), {}).items():
            if system not in all_results[rows]:
                all_results[rows][system] = {**result, "reused": args.reuse}
    sections = ["## Scale (issue 7)", "", report(all_results, args)]
    if not args.no_corpus and "dpsql" in args.systems:
        corpus = run_process([sys.executable, str(Path(__file__).resolve()), "--worker", "plan-corpus",
                              "--repeats", str(args.repeats)], args.timeout)
        all_results["plan_corpus"] = corpus
        sections += [corpus_report(corpus), ""]
    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    (cache / f"scale-{stamp}.json").write_text(json.dumps(all_results, indent=1, default=str))
    if args.all:
        for script, extra in (("bench_noise.py", []), ("bench_utility.py", ["--cache", str(cache)])):
            command = [sys.executable, str(HERE / script), *extra]
            if script == "bench_utility.py" and (args.peer_python or default_peer_python()):
                command += ["--peer-python", args.peer_python or default_peer_python()]
            done = subprocess.run(command, capture_output=True, text=True, cwd=str(ROOT))
            sections += [done.stdout.strip() or f"{script} failed: {done.stderr.strip()[-300:]}", ""]
        if args.with_100m:
            done = subprocess.run([sys.executable, str(HERE / "bench_100m.py"), "--cache", str(cache)],
                                  capture_output=True, text=True, cwd=str(ROOT))
            sections += [done.stdout.strip() or f"bench_100m.py failed: {done.stderr.strip()[-300:]}", ""]
    text = "\n".join(sections)
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n")


if __name__ == "__main__":
    main()
