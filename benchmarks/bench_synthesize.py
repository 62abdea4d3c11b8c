"""Time (and a utility sanity check) of ``db.synthesize`` (AIM and MST, ``dpsql.calls.synthesize``).

The PUMS sample (1,000 people, row-level: PRIVACY UNIT ROW), six columns, and the same rows
replicated to about 1M rows (``--million``). For each method: the wall time of one
``db.synthesize`` (the bounded copy's first build included) and the average total-variation
distance of every 2-way marginal of the synthetic table from the real one, both over the same
cells (KEYS values, the numeric columns' bins): a sanity figure, not the benchmark against the
peers (that is ``benchmarks/bench_synthetic_utility.py`` of issue 39, item 5).

    .venv/bin/python benchmarks/bench_synthesize.py [--million] [--methods aim mst] [--epsilon 1]
"""

from __future__ import annotations

import argparse
import itertools
import sys
import time
from pathlib import Path

import duckdb
import numpy as np
import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

import dpsql  # noqa: E402
from pums import load_pums  # noqa: E402

POLICY = """BUDGET EPSILON 1000 DELTA 1e-3;
PRIVATE TABLE pums (PRIVACY UNIT ROW, age BOUNDS 0 TO 100, income BOUNDS 0 TO 500000, sex KEYS (0, 1),
    educ KEYS (1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16), race KEYS (1, 2, 3, 4, 5, 6),
    married KEYS (0, 1));
"""
COLUMNS = ["age", "sex", "educ", "race", "income", "married"]


def cells(frame, release) -> dict[str, np.ndarray]:
    """Each row's cell per column, as the synthesizer's bins define them (NULL: the last cell)."""
    out = {}
    for column in COLUMNS:
        labels = release.bins[column]
        values = frame[column]
        if column in ("age", "income"):
            lower, upper = (0, 100) if column == "age" else (0, 500000)
            from dpsql.calls.synthesize import numeric_bins
            width, bins = numeric_bins(lower, upper)
            code = ((values.astype("float").clip(lower, upper) - lower) // width).fillna(bins)
            out[column] = code.to_numpy().astype(int)
        else:
            keys = [int(v) for v in labels if v != "NULL"]
            lookup = {k: i for i, k in enumerate(keys)}
            out[column] = np.array([len(keys) if pd.isna(v) else lookup.get(int(v), len(keys)) for v in values],
                                   dtype=int)
    return out


def average_tv(real, synthetic, sizes) -> float:
    errors = []
    for a, b in itertools.combinations(COLUMNS, 2):
        shape = (sizes[a], sizes[b])
        p = np.bincount(np.ravel_multi_index((real[a], real[b]), shape), minlength=shape[0] * shape[1])
        q = np.bincount(np.ravel_multi_index((synthetic[a], synthetic[b]), shape), minlength=shape[0] * shape[1])
        errors.append(0.5 * np.abs(p / p.sum() - q / q.sum()).sum())
    return float(np.mean(errors))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--million", action="store_true", help="replicate the rows to about 1M")
    parser.add_argument("--methods", nargs="+", default=["mst", "aim"])
    parser.add_argument("--epsilon", type=float, default=1.0)
    args = parser.parse_args()
    con = duckdb.connect()
    load_pums(con, variant="plain")
    if args.million:
        con.execute("CREATE OR REPLACE TABLE pums AS SELECT p.* FROM pums p, range(1000)")
    real = con.sql("SELECT * FROM pums").df()
    db = dpsql.connect(con, policy=POLICY, ledger=":memory:")
    for method in args.methods:
        started = time.perf_counter()
        release = db.synthesize("pums", COLUMNS, epsilon=args.epsilon, delta=1e-9, method=method,
                                name=f"pums_{method}")
        took = time.perf_counter() - started
        sizes = {c: len(release.bins[c]) for c in COLUMNS}
        tv = average_tv(cells(real, release), cells(release.table, release), sizes)
        print(f"{method}: {len(real):,} rows, epsilon {args.epsilon:g}: {took:.1f} s, {release.rows:,} synthetic rows, "
              f"{sum(1 for m in release.measured if m.columns)} marginals measured, average 2-way TV {tv:.3f}")


if __name__ == "__main__":
    main()
