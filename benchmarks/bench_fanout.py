"""How query time grows with one unit's rows after joins (MAX ROWS PER UNIT AFTER JOINS).

A private ``visits`` table (``--rows`` rows, k = 10, 400-character notes for the target, 80
for the others) and a public table ``fan`` where the target's store has M rows (every other
store one): the target's 10 visits become F = 10·M joined rows. For each F, each query runs
``--runs`` times with the target present and absent, alternating; reported are the median
milliseconds each way. The queries evaluate per joined row: a plain COUNT, the attacker's
COUNT(DISTINCT expression over both sides), and the costliest row-level expression the
allow-list admits with a public column in it (so that DuckDB cannot evaluate it below the
join, on the 10 private rows only).

Run: ``python benchmarks/bench_fanout.py [--rows 20000] [--runs 5] [--fanouts 100,1000,10000,100000]``.
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np
import pandas as pd

import dpsql

TARGET = 424242
STORES = [f"store{i}" for i in range(50)]
POLICY = """
BUDGET EPSILON 100000000;
MAX JOIN MULTIPLICITY 100000;
MAX ROWS PER UNIT AFTER JOINS 1000000000;
PRIVATE TABLE visits (PRIVACY UNIT user_id, MAX ROWS PER UNIT 10, amount BOUNDS 0 TO 500);
PUBLIC TABLE fan;
"""
HEAVY = "(" + " || ".join(["v.note", "f.tag"] * 2 + ["v.note"]) + ") LIKE '%" + "a_" * 30 + "c%'"
SHAPES = {
    "COUNT(*) WHERE user_id = target":
        f"SELECT COUNT(*) FROM visits v JOIN fan f ON v.store = f.store WHERE v.user_id = {TARGET}",
    "COUNT(DISTINCT amount + slot) WHERE user_id = target":
        f"SELECT COUNT(DISTINCT v.amount * 100000 + f.slot) FROM visits v JOIN fan f ON v.store = f.store "
        f"WHERE v.user_id = {TARGET}",
    "costliest allowed expression on the target's joined rows":
        f"SELECT COUNT(*) FROM visits v JOIN fan f ON v.store = f.store "
        f"WHERE CASE WHEN v.user_id = {TARGET} THEN {HEAVY} ELSE FALSE END",
}


def data(rows: int, fan_out: int, present: bool, seed: int = 7) -> dict:
    rng = np.random.default_rng(seed)
    frame = pd.DataFrame({"user_id": rng.integers(1, max(rows // 10, 1) + 1, rows),
                          "store": rng.choice(STORES[1:], rows), "amount": rng.uniform(0, 500, rows),
                          "note": rng.choice(["ab" * 40, "cd" * 40], rows)})
    if present:
        target = pd.DataFrame({"user_id": TARGET, "store": "store0", "amount": np.arange(10.0),
                               "note": "ab" * 200}, index=range(10))
        frame = pd.concat([frame, target], ignore_index=True)
    m = fan_out // 10
    fan = pd.DataFrame([("store0", slot, "ab") for slot in range(m)]
                       + [(store, 0, "ab") for store in STORES[1:]], columns=["store", "slot", "tag"])
    return {"visits": frame, "fan": fan}


def measure(rows: int, fan_out: int, runs: int) -> list[str]:
    connections = {present: dpsql.connect(data(rows, fan_out, present), policy=POLICY, eager_bounding=True)
                   for present in (True, False)}
    times = {name: ([], []) for name in SHAPES}
    try:
        for run in range(runs + 1):
            for name, sql in SHAPES.items():
                for present in ((True, False) if run % 2 else (False, True)):
                    started = time.perf_counter()
                    try:
                        connections[present].sql(sql, epsilon=0.5 + run * 1e-6)
                    except dpsql.DPError:
                        pass
                    if run:
                        times[name][0 if present else 1].append((time.perf_counter() - started) * 1000)
    finally:
        for connection in connections.values():
            connection.close()
    lines = []
    for name, (present, absent) in times.items():
        a, b = statistics.median(present), statistics.median(absent)
        lines.append(f"| {name} | {fan_out:,} | {a:.1f} | {b:.1f} | {a - b:+.1f} |")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=20_000)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--fanouts", default="100,1000,10000,100000")
    args = parser.parse_args()
    print(f"{args.rows:,} other rows, median ms of {args.runs} runs each way:\n")
    print("| query | target's rows after the join | present | absent | difference |")
    print("|---|---|---|---|---|")
    for fan_out in (int(f) for f in args.fanouts.split(",")):
        for line in measure(args.rows, fan_out, args.runs):
            print(line, flush=True)


if __name__ == "__main__":
    main()
