"""What keeping and querying a synthetic table costs (issue 39, item 3).

For a synthetic table of N rows and five columns (two small integers, three short strings, as the
synthesizer's categorical and binned columns are): the time to keep it (one DuckDB file beside
the ledger), the file's size, the time a fresh process takes to find it (its metadata), and the
time of a query through ``Connection.sql`` — the first, and the next — which copies the table into
its sandbox each time. Run from the repository:

    PYTHONPATH=. python benchmarks/bench_synthetic_store.py [N ...]   # default 100000 1000000
"""

from __future__ import annotations

import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pandas as pd


def synthetic_rows(n: int) -> pd.DataFrame:
    generator = np.random.default_rng(0)
    return pd.DataFrame({"a": generator.integers(0, 10, n), "b": generator.choice(["x", "y", "z"], n),
                         "c": generator.choice(["[0, 5)", "[5, 10)"], n), "d": generator.integers(0, 50, n),
                         "e": generator.choice(["AA", "UA", "DL", "B6"], n)})


def measure(n: int, folder: Path) -> dict[str, float]:
    import dpsql
    from dpsql.mechanisms.synthetic_release import Measured, SyntheticRelease
    from dpsql.query.synthetic_tables import SyntheticTables, synthetic_directory

    ledger = folder / f"bench-{n}.ledger"
    frame = synthetic_rows(n)
    release = SyntheticRelease(name="syn", source="t", method="aim", table=frame, rows=n, epsilon=1.0, delta=1e-6,
                               rho=0.02, measured=(Measured(("a", "b"), 0.02, 7.0),), analyst="alice")
    started = time.perf_counter()
    SyntheticTables(ledger, ["t"]).keep(release)
    kept = time.perf_counter() - started
    (file,) = synthetic_directory(ledger).rglob("*.duckdb")
    started = time.perf_counter()
    SyntheticTables(ledger, ["t"]).made("alice", "syn")
    found = time.perf_counter() - started
    policy = "BUDGET EPSILON 1; PRIVATE TABLE t (PRIVACY UNIT ROW, MAX ROWS PER UNIT 1);"
    with dpsql.connect({"t": pd.DataFrame({"x": [1]})}, policy=policy, ledger=ledger, analyst="alice",
                       separate_budget=True) as db:  # one budget per size, on purpose
        times = []
        for _ in range(3):
            started = time.perf_counter()
            db.sql("SELECT a, b, COUNT(*) AS n FROM syn GROUP BY a, b")
            times.append(time.perf_counter() - started)
    return {"rows": n, "keep_s": kept, "file_mb": file.stat().st_size / 1e6, "find_s": found,
            "first_query_s": times[0], "next_query_s": min(times[1:])}


def main(sizes: list[int]) -> None:
    with tempfile.TemporaryDirectory() as folder:
        os.environ["DPSQL_HOME"] = os.path.join(folder, "home")  # the ledger registry: not the curator's own
        for n in sizes:
            figures = measure(n, Path(folder))
            print("  ".join(f"{name} {value:,.3g}" if isinstance(value, float) else f"{name} {value:,}"
                            for name, value in figures.items()))


if __name__ == "__main__":
    main([int(argument) for argument in sys.argv[1:]] or [100_000, 1_000_000])
