"""Utility benchmark (issue 7, item 3): empirical error at epsilon = 1 against stated accuracy and a peer.

For each query class of bench_scale.py, on the shop data (``--rows``, default 100,000; same
generator and cache), dpsql answers the query ``--runs`` times at epsilon = 1 (1 + i·1e-9, so no
run is a free repeat; delta = 1e-6 for private keys) and we compare:

* **noise error against the stated accuracy**: |released − exact bounded value|, where the exact
  bounded value is what the bounded SQL computes before noise (dpsql internals; the salt is
  fixed per database, so it is the same every run). ``res.accuracy()`` states a 95% half-width;
  the empirical 95th percentile of the error should match it (target: within 5%), and about
  95% of released values should lie within it (coverage);
* **total error against the true answer** (no bounding, no noise) — bias from contribution
  bounding and clamping included: RMSE and 95th percentile of |released − true|;
* the same for **SmartNoise SQL** at the same total epsilon per query: SmartNoise spends epsilon
  per mechanism (and one more on the user count it censors with), so its per-mechanism epsilon is
  set to ``1 / get_privacy_cost(query)`` (its delta is 1e-6 as well). Run by benchmarks/peers.py
  under ``--peer-python``.

Grouped queries pool all released cells of all runs. Prints Markdown.
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
    from dpsql.rewrite import rewrite_plan

    _, checked, _ = db._check(sql)
    plan = db._plan(checked, sql, Fraction(1), delta, None)
    bounded = rewrite_plan(plan)
    rows = db._engine.fetch(bounded, db._salt_for(bounded))
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


def run_dpsql(db_path: Path, runs: int) -> dict:
    import duckdb

    import dpsql

    con = duckdb.connect(str(db_path), read_only=True)  # true answers first: one config per file
    truths = {name: truth(con, q["raw"], KEYS.get(name, 0)) for name, q in QUERIES.items()}
    con.close()
    ledger = Path(tempfile.mkdtemp(prefix="dpsql-utility-")) / "u.ledger"
    db = dpsql.connect(str(db_path), policy=bench_scale.POLICY_USER, ledger=str(ledger), **bench_scale.no_time_limit())
    out = {}
    counter = iter(range(1, 10**9))
    for name, q in QUERIES.items():
        width = KEYS.get(name, 0)
        delta = q.get("delta")
        try:
            if name in RATIO_OF:
                parts = bounded_exact(db, RATIO_OF[name], None)
                target = {k: [v[0] / v[1]] for k, v in parts.items()}
            else:
                target = bounded_exact(db, q["dp"], delta)
        except dpsql.DPError as error:
            out[name] = {"error": str(error)}
            continue
        true = truths[name]
        noise_err = {c: [] for c in COLUMNS[name]}
        stated = {c: [] for c in COLUMNS[name]}
        covered = {c: 0 for c in COLUMNS[name]}
        total_err = {c: [] for c in COLUMNS[name]}
        released = []
        for _ in range(runs):
            epsilon = Fraction(10**9 + next(counter), 10**9)
            result = db.sql(q["dp"], epsilon=epsilon, delta=delta)
            accuracy = result.accuracy()
            rows = result.fetchall()
            released.append(len(rows))
            for index, row in enumerate(rows):
                key = tuple(row[:width])
                for i, column in enumerate(COLUMNS[name]):
                    value = float(row[width + i])
                    bound = target.get(key, [0.0] * len(COLUMNS[name]))[i]
                    err = abs(value - bound)
                    half = accuracy[column]
                    half = float(half[index] if isinstance(half, (list, tuple, np.ndarray)) else half)
                    noise_err[column].append(err)
                    stated[column].append(half)
                    covered[column] += err <= half
                    exact = true.get(key, [0.0] * len(COLUMNS[name]))[i] or 0.0
                    total_err[column].append(value - exact)
        out[name] = {"columns": {
            c: {"stated_hw": _median(stated[c]), "q95_noise": _q95(noise_err[c]),
                "coverage": covered[c] / len(noise_err[c]) if noise_err[c] else None,
                "samples": len(noise_err[c]), "rmse_true": _rmse(total_err[c]), "q95_true": _q95(total_err[c]),
                "bias_true": _mean(total_err[c])}
            for c in COLUMNS[name]}, "released": float(np.mean(released)), "true_cells": len(true)}
    db.close()
    return out


def _q95(values: list) -> float | None:
    return float(np.quantile(np.abs(values), 0.95)) if values else None


def _rmse(values: list) -> float | None:
    return float(np.sqrt(np.mean(np.square(values)))) if values else None


def _mean(values: list) -> float | None:
    return float(np.mean(values)) if values else None


def _median(values: list) -> float | None:
    return float(np.median(values)) if values else None


def run_smartnoise(db_path: Path, runs: int, peer_python: str) -> dict:
    import duckdb

    command = [peer_python, str(HERE / "peers.py"), "--system", "smartnoise", "--db", str(db_path),
               "--utility", "--runs", str(runs), "--epsilon", "1"]
    done = subprocess.run(command, capture_output=True, text=True)
    lines = [l for l in done.stdout.splitlines() if l.startswith("{")]
    if not lines:
        return {"_error": (done.stderr.strip().splitlines() or ["no output"])[-1]}
    answers = json.loads(lines[-1])["results"]
    con = duckdb.connect(str(db_path), read_only=True)
    out = {}
    for name, q in QUERIES.items():
        entry = answers.get(name, {})
        if "error" in entry or not entry:
            out[name] = {"error": entry.get("error", "not run")}
            continue
        width = KEYS.get(name, 0)
        true = truth(con, q["raw"], width)
        errors = {c: [] for c in COLUMNS[name]}
        released = []
        for rows in entry["answers"]:
            released.append(len(rows))
            for row in rows:
                key = tuple(row[:width])
                for i, column in enumerate(COLUMNS[name]):
                    if row[width + i] is None:
                        continue
                    exact = true.get(key, [0.0] * len(COLUMNS[name]))[i] or 0.0
                    errors[column].append(float(row[width + i]) - exact)
        out[name] = {"cost": entry["cost"], "epsilon_per_mechanism": entry["epsilon_per_mechanism"],
                     "released": float(np.mean(released)) if released else 0.0, "true_cells": len(true),
                     "columns": {c: {"rmse_true": _rmse(e), "q95_true": _q95(e), "bias_true": _mean(e)}
                                 for c, e in errors.items()}}
    con.close()
    return out


def num(x) -> str:
    if x is None:
        return "—"
    if abs(x) >= 1000:
        return f"{x:,.0f}"
    if abs(x) >= 10:
        return f"{x:.1f}"
    return f"{x:.3g}"


def markdown(dp: dict, sn: dict, rows: int, runs: int, sn_runs: int) -> str:
    lines = [f"### Utility at epsilon = 1 ({rows:,} rows, {runs} dpsql runs, {sn_runs} SmartNoise runs per query)", "",
             "Noise error = |released − exact bounded value| (what `accuracy()` describes); total error = "
             "released − true answer (contribution bounding and clamping included). Cells: released rows "
             "per run (mean) / rows of the true answer.", "",
             "| query | column | stated 95% half-width | empirical q95 noise error | ratio | coverage | "
             "dpsql RMSE vs true | dpsql q95 vs true | SmartNoise RMSE vs true | SmartNoise q95 vs true | "
             "cells dpsql / SmartNoise / true | SmartNoise ε per mechanism |",
             "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---|---:|"]
    for name in QUERIES:
        d, s = dp.get(name, {}), sn.get(name, {})
        if "error" in d:
            lines.append(f"| {name} | | dpsql: {d['error'][:60]} | | | | | | | | | |")
            continue
        for column in COLUMNS[name]:
            c = d["columns"][column]
            sc = s.get("columns", {}).get(column, {}) if "columns" in s else {}
            ratio = c["q95_noise"] / c["stated_hw"] if c["stated_hw"] and c["q95_noise"] is not None else None
            sn_cells = f"{s['released']:.0f}" if "released" in s else "—"
            sn_text = (num(sc.get("rmse_true")), num(sc.get("q95_true"))) if sc else \
                ((f"fails: {s.get('error', s.get('_error', ''))[:50]}",) * 1 + ("",))
            eps = f"{s['epsilon_per_mechanism']:.3g} (cost {s['cost'][0]:.3g})" if "cost" in s else "—"
            lines.append(f"| {name} | {column} | {num(c['stated_hw'])} | {num(c['q95_noise'])} | "
                         f"{num(ratio)} | {num(c['coverage'])} | {num(c['rmse_true'])} | {num(c['q95_true'])} | "
                         f"{sn_text[0]} | {sn_text[1]} | {d['released']:.0f} / {sn_cells} / {d['true_cells']} | "
                         f"{eps} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=100_000)
    parser.add_argument("--runs", type=int, default=1000)
    parser.add_argument("--sn-runs", type=int, default=200)
    parser.add_argument("--cache", default=None)
    parser.add_argument("--peer-python", default=None)
    parser.add_argument("--json", default=None, help="also write the raw numbers here")
    args = parser.parse_args()
    db_path = bench_scale.ensure_data(args.rows, bench_scale.cache_dir(args.cache))
    dp = run_dpsql(db_path, args.runs)
    peer = args.peer_python or bench_scale.default_peer_python()
    sn = run_smartnoise(db_path, args.sn_runs, peer) if peer else {"_error": "no peer python"}
    if args.json:
        Path(args.json).write_text(json.dumps({"dpsql": dp, "smartnoise": sn}, indent=1, default=str))
    print(markdown(dp, sn, args.rows, args.runs, args.sn_runs))


if __name__ == "__main__":
    main()
