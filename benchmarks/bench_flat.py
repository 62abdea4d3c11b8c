"""Flat bounded statements (issue 26 item 1): dpsql's bounded statement against raw DuckDB.

    python benchmarks/bench_flat.py --rows 1000 1000000 10000000 [--repeats 7] [--old-sql old.json]

For each query class of ``bench_scale.QUERIES`` (COUNT, SUM, AVG, GROUP BY 50 public keys, GROUP
BY ~5000 private keys, JOIN a public table) on the shop data of ``bench_scale.ensure_data`` (cached
under ``--cache``, default ``$DPSQL_BENCH_CACHE``), after the bounded copy is built (its build is
timed once), this times, round robin so a busy machine's load hits them alike (median of
``--repeats`` rounds after a warm-up round):

* ``raw``: the same aggregate on the raw table, no privacy;
* ``bounded``: dpsql's bounded statement alone, on a cursor of the engine's own connection;
* ``old``: the bounded statement an older dpsql wrote for the same query (``--old-sql``: a JSON
  file ``{rows: {query: sql}}`` written by ``--write-sql`` run under that version's source),
  on the same copy and cursor;
* ``hand``: for grouped queries, a hand-written statement on the copy that does the least a
  correct bound must: the groups limit (at most MAX GROUPS PER UNIT groups per unit, chosen by a
  salted hash) and the clamp, nothing else (no domain test, no key encoding, no light-unit split);
* ``floor``: ``bench_scale``'s per-(unit, group) floor on the raw table (the "/q-floor" of
  benchmarks/RESULTS.md; it bounds nothing, it is the per-unit aggregation any bound pays), timed
  after the others (a third of the repeats);
* ``end to end``: ``db.sql`` with a new query text (a fresh output alias) and a new epsilon every
  run, so no free repeat answers it.

Each statement's result is checked against ``bounded``'s (``old`` exactly; ``hand`` too where
it computes the same measures) before it is timed. Timings on this shared 2-core machine are
noisy: compare within a run, and rerun on a quiet machine for RESULTS.md.
"""

from __future__ import annotations

import argparse
import itertools
import json
import re
import statistics
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import bench_scale  # noqa: E402
from bench_scale import DELTA, POLICY_USER, QUERIES  # noqa: E402
from bench_scale import timed as timed_runs  # noqa: E402

CLASSES = ["COUNT", "SUM", "AVG", "GROUP BY public keys (50)", "GROUP BY private keys (~5000)",
           "JOIN public table (7 cities)"]
COPY = '"dp_bounding"."main"."dp_bounded_visits__user_id__10"'
SALTED = "hash(xor(hash(xor(hash($salt), hash(user_id))), hash({key})))"


def hand_bound(name: str) -> str | None:
    """The least a correct bound does for a grouped class, on the copy (at most 10 rows per unit
    already): keep each unit's first 5 groups by a salted hash, clamp, aggregate per group."""
    ranked = "SELECT *, DENSE_RANK() OVER (PARTITION BY user_id ORDER BY {order}) AS r FROM {source}"
    copy = f"(SELECT * FROM {COPY} WHERE NOT dp_pad)"
    if name.startswith("GROUP BY public"):
        inner = ranked.format(order=SALTED.format(key="store"), source=copy)
        return (f"SELECT store, COUNT(*), SUM(CASE WHEN amount < 0 THEN 0 WHEN amount <= 500 THEN amount "
                f"WHEN NOT isnan(amount) THEN 500 END) FROM ({inner}) WHERE r <= 5 GROUP BY store")
    if name.startswith("GROUP BY private"):
        inner = ranked.format(order=SALTED.format(key="zip"), source=copy)
        return (f"SELECT zip, SUM(n), COUNT(*) FROM (SELECT user_id, zip, COUNT(*) AS n FROM ({inner}) "
                f"WHERE r <= 5 GROUP BY user_id, zip) GROUP BY zip")
    if name.startswith("JOIN"):
        joined = f"(SELECT v.user_id, s.city FROM {copy} AS v JOIN stores AS s ON v.store = s.store)"
        inner = ranked.format(order=SALTED.format(key="city"), source=joined)
        return f"SELECT city, COUNT(*) FROM ({inner}) WHERE r <= 5 GROUP BY city"
    return None


def connect(rows: int, cache: Path):
    """An in-memory copy of the shop data (so no file lock is shared) and a dpsql connection on it."""
    import duckdb

    import dpsql

    path = bench_scale.ensure_data(rows, cache)
    con = duckdb.connect()
    con.execute("SET enable_progress_bar = false")
    con.execute(f"ATTACH '{path}' AS src (READ_ONLY)")
    con.execute("CREATE TABLE visits AS SELECT * FROM src.visits; CREATE TABLE stores AS SELECT * FROM src.stores")
    con.execute("DETACH src")
    return con, dpsql.connect(con, policy=POLICY_USER)


def bounded_sql(db, name: str) -> str:
    """dpsql's bounded statement of a class, as ``db.sql`` would run it."""
    from dpsql.analysis.plan import PrivateQuery
    from dpsql.backends.rewrite import rewrite_statement
    from dpsql.query.options import merge_options

    sql = QUERIES[name]["dp"]
    _, checked, written = db._check(sql)
    assert isinstance(checked, PrivateQuery)
    epsilon, delta, noise = merge_options(written, 1, QUERIES[name].get("delta", DELTA), None)
    return rewrite_statement(db._preparer.plan(checked, sql, epsilon, delta, noise), db._engine.dialect).sql


def write_sql(rows_list: list[int], cache: Path, out: Path) -> None:
    """The bounded statements of this source's dpsql, for a later run's ``--old-sql``."""
    statements = {}
    for rows in rows_list:
        con, db = connect(min(rows, 1000), cache)  # the statement does not depend on the data's size
        statements[str(rows)] = {name: bounded_sql(db, name) for name in CLASSES}
        db.close()
    out.write_text(json.dumps(statements, indent=1))


def rounds(cursor, statements: dict[str, tuple[str, dict]], repeats: int) -> dict[str, float]:
    """Median ms of each statement, timed round robin after one warm-up round."""
    times: dict[str, list[float]] = {label: [] for label in statements}
    for round_ in range(repeats + 1):
        for label, (sql, parameters) in statements.items():
            start = time.perf_counter()
            cursor.execute(sql, parameters).fetchall()
            if round_:
                times[label].append(time.perf_counter() - start)
    return {label: statistics.median(t) * 1e3 for label, t in times.items()}


def canonical(rows: list[tuple]) -> list[tuple]:
    return sorted(tuple(0 if v is None else (v.decode() if isinstance(v, bytes) else v) for v in row)
                  for row in rows)


def measure(rows: int, cache: Path, repeats: int, old: dict | None, classes: list[str]) -> dict:
    con, db = connect(rows, cache)
    start = time.perf_counter()
    db.sql("SELECT COUNT(*) FROM visits", epsilon=1)
    first = (time.perf_counter() - start) * 1e3
    salt = {"salt": db._engine._salt}
    cursor = db._engine._connection.cursor()
    cursor.execute("SET enable_progress_bar = false")
    fresh = itertools.count()
    report: dict = {"rows": rows, "first query ms": first, "classes": {}}
    for name in classes:
        bounded = bounded_sql(db, name)
        statements = {"raw": (QUERIES[name]["raw"], {}), "bounded": (bounded, salt if "$salt" in bounded else {})}
        if old and name in old:
            statements["old"] = (old[name], salt if "$salt" in old[name] else {})
        hand = hand_bound(name)
        if hand:
            statements["hand"] = (hand, salt)
        truth = canonical(cursor.execute(bounded, statements["bounded"][1]).fetchall())
        checks = {}
        for label in ("old", "hand"):
            if label in statements:
                got = canonical(cursor.execute(*statements[label]).fetchall())
                checks[label] = "same" if got == truth else "differs"
        assert checks.get("old", "same") == "same", f"{name}: the old statement's exact totals differ"
        timed = rounds(cursor, statements, repeats)
        # The floor takes seconds at 10M rows: timed on its own, so it does not disturb the round robin.
        timed.update(rounds(cursor, {"floor": (QUERIES[name]["floor"], {})}, max(1, repeats // 3)))
        sql, delta = QUERIES[name]["dp"], QUERIES[name].get("delta", DELTA)

        def end_to_end() -> None:
            # A new output name (a new text) and a new epsilon each time (the same statement): an
            # identical query would be a free repeat, answered without running anything.
            i = next(fresh)
            db.sql(re.sub(r" AS (n|s|a)\b", lambda m: f" AS {m.group(1)}_{i}", sql, count=1),
                   epsilon=1 + i * 1e-9, delta=delta)

        timed["end to end"] = timed_runs(end_to_end, repeats)["median"] * 1e3
        report["classes"][name] = {"ms": timed, "checks": checks}
        print(f"{rows:>10,} {name:32s} " + "  ".join(f"{k} {v:8.2f}" for k, v in timed.items()), file=sys.stderr)
    db.close()
    return report


def markdown(reports: list[dict]) -> str:
    lines = []
    for report in reports:
        lines += [f"\n{report['rows']:,} rows (first query, building the copy: {report['first query ms']:.0f} ms)\n",
                  "| class | raw | bounded | old bounded | hand bound | floor | end to end | bounded / raw | "
                  "target max(2×raw, raw+5) | bounded / hand |",
                  "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
        for name, entry in report["classes"].items():
            t = entry["ms"]

            def cell(label: str) -> str:
                return f"{t[label]:.2f}" if label in t else "–"
            target = max(2 * t["raw"], t["raw"] + 5)
            met = "met" if t["bounded"] <= target else "missed"
            hand = f"{t['bounded'] / t['hand']:.2f}×" if "hand" in t else "–"
            lines.append(f"| {name} | {cell('raw')} | {cell('bounded')} | {cell('old')} | {cell('hand')} | "
                         f"{cell('floor')} | {cell('end to end')} | {t['bounded'] / t['raw']:.1f}× | "
                         f"{target:.1f} ({met}) | {hand} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, nargs="+", default=[1_000, 1_000_000, 10_000_000])
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--cache", default=None)
    parser.add_argument("--classes", nargs="+", default=CLASSES)
    parser.add_argument("--old-sql", type=Path, help="bounded statements of an older dpsql (--write-sql)")
    parser.add_argument("--write-sql", type=Path, help="write this dpsql's bounded statements and stop")
    args = parser.parse_args()
    cache = bench_scale.cache_dir(args.cache)
    if args.write_sql:
        write_sql(args.rows, cache, args.write_sql)
        return
    old = json.loads(args.old_sql.read_text()) if args.old_sql else {}
    reports = [measure(rows, cache, args.repeats, old.get(str(rows)), args.classes) for rows in args.rows]
    print(markdown(reports))
    (cache / "flat.json").write_text(json.dumps(reports, indent=1))


if __name__ == "__main__":
    main()
