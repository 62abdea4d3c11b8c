"""Where dpsql's query time goes: its bounded SQL, EXPLAIN ANALYZE, and equivalent rewrites timed.

    python benchmarks/bench_variants.py --rows 1000000 [--queries ...] [--repeats 5]

For each suite query (bench_scale.QUERIES) under the user-level and the row-level policy, the
bounded SQL dpsql generates is run on a plain DuckDB connection to the same file, next to
equivalent rewrites of it (built by text substitution on the current output, so a rewrite whose
pattern is gone is skipped; each must return exactly the generated SQL's rows, which is
checked), the query's own per-unit floor and the raw aggregate. Variants are timed round robin —
each once per round, after a warm-up round — so load from other processes on this shared
machine hits them alike. A variant that needs a global setting (an optimizer switched off) is
timed on its own afterwards, with the setting undone.

When dpsql reads a private table through a bounded copy (``dpsql.backends.bounding``), the plain
connection gets the same copies, built by the engine's own SQL, and the build is timed: that is
the one-off cost of a dpsql connection's first query.

Writes ``explain_<rows>_<query>.txt`` (bounded SQL + EXPLAIN ANALYZE) and ``variants_<rows>.json``
to the cache directory and prints a Markdown table.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import tempfile
import time
from fractions import Fraction
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import bench_scale  # noqa: E402
from bench_scale import POLICY_ROW, POLICY_USER, QUERIES, ratio, spread, stats, timed  # noqa: E402


def granted_variants(bounded: str) -> dict[str, str]:
    """Equivalent rewrites of a grouped, user-level bounded SQL (analysis of the window's cost).

    Built by text substitution on dpsql's current output, so a variant whose pattern is gone
    is skipped. Every variant must return exactly the rows of the original (checked by caller).
    """
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



def bounded_copies(db) -> tuple[list, str | None]:
    """(the bounded copies ``db``'s engine reads private tables through, their salt)."""
    engine = db._engine
    return list(getattr(engine, "_bounded", {}).values()), getattr(engine, "_salt", None)


def plain_connection(db_path: Path, tables: list, salt: str | None, repeats: int):
    """(a plain read-only DuckDB connection that can run dpsql's bounded SQL, the time to build
    each bounded copy it reads). Opened after dpsql's own connection is closed: DuckDB allows one
    configuration per file in a process."""
    import duckdb

    con = duckdb.connect(str(db_path), read_only=True)
    if not tables:
        return con, {}
    from dpsql.backends.bounding import attach_sql, create_sql, fill_sql

    con.execute(attach_sql())
    salt = {"salt": salt}
    build = {}
    for table in tables:
        con.execute(create_sql(table))
        build[table.name] = {**timed(lambda: con.execute(fill_sql(table), salt), repeats), "sql": fill_sql(table)}
    return con, build


def bounded_sql_of(db, queries: list[str]) -> dict[str, str | Exception]:
    """Query name -> the bounded SQL dpsql runs for it (or the refusal)."""
    import dpsql
    from dpsql.backends.rewrite import rewrite_plan

    out = {}
    for name in queries:
        q = QUERIES[name]
        try:
            _, checked, _ = db._check(q["dp"])
            out[name] = rewrite_plan(db._preparer.plan(checked, q["dp"], Fraction(1), q.get("delta"), None))
        except dpsql.DPError as error:
            out[name] = error
    return out


def variants_of(policy: str, name: str, bounded: str) -> dict[str, tuple[list[str], str, bool]]:
    """label -> (setup statements, SQL, whether it must return the generated SQL's rows)."""
    rewrites = granted_variants(bounded) if policy == "user" else {"as generated": bounded}
    if policy == "row":
        no_huge = re.sub(r"SUM\(CAST\((v_m\d+) AS HUGEINT\)\)", r"SUM(\1)", bounded)
        if no_huge != bounded:
            rewrites["SUM(v) instead of SUM(CAST(v AS HUGEINT))"] = no_huge
    out = {}
    for label, sql in rewrites.items():
        statements = [part for part in sql.split(";\n") if part.strip()]
        out[label] = (statements[:-1], statements[-1], True)
    if policy == "user":
        out["query floor (per-(unit, group) pre-aggregation, no bounding)"] = ([], QUERIES[name]["floor"], False)
    out["raw DuckDB"] = ([], QUERIES[name]["raw"], False)
    return out


def time_variants(con, variants: dict, params: dict, repeats: int) -> dict:
    """Timings and row checks of every variant (see the module docstring for the order)."""
    import duckdb

    entry, reference, plain = {}, None, {}
    for label, (setup, sql, same) in variants.items():
        p = params if "$salt" in sql else {}
        try:
            for statement in setup:
                con.execute(statement)
            rows = sorted(map(repr, con.execute(sql, p).fetchall()))
        except duckdb.Error as error:
            entry[label] = {"sql": sql, "same_rows": None, "error": str(error)[:300]}
            continue
        finally:
            undo_settings(con, setup)
        reference = rows if label == "as generated" else reference
        entry[label] = {"sql": sql, "same_rows": rows == reference if same else None}
        if setup:  # a global setting: timed alone, so it cannot touch the other variants
            entry[label].update(timed_with(con, setup, sql, p, repeats))
        else:
            plain[label] = (sql, p)
    times = {label: [] for label in plain}
    for _ in range(repeats):
        for label, (sql, p) in plain.items():
            start = time.perf_counter()
            con.execute(sql, p).fetchall()
            times[label].append(time.perf_counter() - start)
    for label in plain:
        entry[label].update(stats(times[label]))
    return entry


def timed_with(con, setup: list[str], sql: str, params: dict, repeats: int) -> dict:
    try:
        for statement in setup:
            con.execute(statement)
        return timed(lambda: con.execute(sql, params).fetchall(), repeats)
    finally:
        undo_settings(con, setup)


def undo_settings(con, setup: list[str]) -> None:
    for statement in setup:
        match = re.match(r"SET (\w+)", statement.strip(), re.IGNORECASE)
        if match:
            con.execute(f"RESET {match.group(1)}")


def worker(db_path: Path, repeats: int, queries: list[str]) -> dict:
    import dpsql

    out = {}
    ledger = Path(tempfile.mkdtemp(prefix="dpsql-bench-")) / "bench.ledger"
    for policy, text in (("user", POLICY_USER), ("row", POLICY_ROW)):
        db = dpsql.connect(str(db_path), policy=text, ledger=str(ledger), **bench_scale.no_time_limit())
        plans = bounded_sql_of(db, queries)
        params = {"salt": db._ledger.salt().hex()}
        tables, salt = bounded_copies(db)
        db.close()
        con, build = plain_connection(db_path, tables, salt, repeats)
        for table, timing in build.items():
            out[f"{policy}: building the bounded copy {table}"] = {
                "bounded_sql": timing["sql"], "explain_analyze": "",
                "variants": {"as generated": {**timing, "same_rows": None}}}
        for name, bounded in plans.items():
            label = f"{policy}: {name}"
            if isinstance(bounded, Exception):
                out[label] = {"error": f"{type(bounded).__name__}: {bounded}"}
                continue
            p = params if "$salt" in bounded else {}
            explained = con.execute("EXPLAIN ANALYZE " + bounded, p).fetchall()
            out[label] = {"bounded_sql": bounded, "explain_analyze": explained[0][1] if explained else "",
                          "variants": time_variants(con, variants_of(policy, name, bounded), params, repeats)}
        con.close()
    return out


def markdown(rows: int, result: dict, cache: Path, repeats: int) -> list[str]:
    lines = [f"#### {rows:,} rows", "", "| policy: query | variant | median (min–max) | vs generated | same rows |",
             "|---|---|---:|---:|---|"]
    for label, entry in result["results"].items():
        if "error" in entry:
            lines.append(f"| {label} | refused: {entry['error'][:90]} | | | |")
            continue
        stem = re.sub(r"[^A-Za-z0-9]+", "_", label).strip("_")
        (cache / f"explain_{rows}_{stem}.txt").write_text(entry["bounded_sql"] + "\n\n" + entry["explain_analyze"])
        base = entry["variants"].get("as generated", {}).get("median")
        for variant, v in entry["variants"].items():
            if "error" in v:
                lines.append(f"| {label} | {variant} | failed: {v['error'][:80]} | | |")
                continue
            same = "—" if v["same_rows"] is None else ("yes" if v["same_rows"] else "NO")
            lines.append(f"| {label} | {variant} | {spread(v, repeats)} | {ratio(v['median'], base)} | {same} |")
    return lines + [""]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, nargs="+", default=[1_000_000])
    parser.add_argument("--queries", nargs="+", default=list(QUERIES), choices=list(QUERIES))
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--cache", default=None, help="where the generated DuckDB files live")
    parser.add_argument("--timeout", type=float, default=4 * 3600, help="seconds per size")
    parser.add_argument("--out", default=None, help="also write the Markdown to this file")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--db", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:  # one size in its own process, so sizes do not share memory
        print(json.dumps({"results": worker(Path(args.db), args.repeats, args.queries)}, default=str))
        return
    cache = bench_scale.cache_dir(args.cache)
    lines = ["### Where the time goes: equivalent rewrites of the bounded SQL", "",
             f"Machine: {bench_scale.machine_line()}.", ""]
    for rows in args.rows:
        db = bench_scale.ensure_data(rows, cache)
        result = bench_scale.run_process([sys.executable, str(Path(__file__).resolve()), "--worker", "--db", str(db),
                                          "--repeats", str(args.repeats), "--queries", *args.queries], args.timeout)
        if "error" in result:
            lines += [f"{rows:,} rows: failed: {result['error']}", ""]
            continue
        lines += markdown(rows, result, cache, args.repeats)
        (cache / f"variants_{rows}.json").write_text(json.dumps(result, indent=1, default=str))
    text = "\n".join(lines)
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n")


if __name__ == "__main__":
    main()
