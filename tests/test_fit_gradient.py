"""The gradient a fit's statement computes is the loss's own gradient, checked against numpy.

tests/test_fit.py bounds what one unit can move (privacy); here the engine's summed gradient is
compared, coordinate by coordinate, with the gradient numpy computes from the same rows by hand:
for linear regression of the squared loss on targets scaled onto [-1, 1], for logistic
regression of the log loss on the class itself, y in {0, 1}. The clip is wide enough never to
bind (every scaled row gradient has norm at most sqrt(3) < 100), so the only difference allowed
is the truncation toward zero onto the grid: under one grid step per unit and coordinate. Then a
fit at an epsilon whose noise is tiny must retrace numpy's own descent.
"""

from __future__ import annotations

import duckdb
import numpy as np
import pandas as pd
import pytest

import dpsql
from dpsql.calls.fit import plan_fit
from dpsql.mechanisms.noise import SeededSource

POLICY = ("BUDGET EPSILON 1e13 DELTA 1e-3; PRIVATE TABLE t (PRIVACY UNIT uid, MAX ROWS PER UNIT 1, "
          "x BOUNDS 0 TO 10, z BOUNDS -5 TO 5, y BOUNDS 0 TO 30, label BOUNDS 0 TO 1);")
CLIP = 100.0


def rows() -> pd.DataFrame:
    """30 units, one row each; the classes overlap (no separating line), so the log loss has a
    finite minimum."""
    x = np.array([(7 * i) % 11 for i in range(30)], dtype=float)
    z = np.array([((5 * i) % 9) - 4 for i in range(30)], dtype=float)
    label = ((x + z + np.array([(3 * i) % 5 for i in range(30)]) - 2) > 6).astype(int)
    label[[0, 7, 19]] = 1 - label[[0, 7, 19]]
    return pd.DataFrame({"uid": range(30), "x": x, "z": z, "y": 1.5 * x - z + 5 + (np.arange(30) % 3),
                         "label": label})


def connect(frame: pd.DataFrame) -> dpsql.Connection:
    con = duckdb.connect()
    con.register("frame", frame)
    con.execute("CREATE TABLE t AS SELECT * FROM frame")
    return dpsql.connect(con, policy=POLICY, rng=SeededSource(25))


def design(frame: pd.DataFrame) -> np.ndarray:
    """(1, x', z'): each feature mapped from its bounds onto [-1, 1]."""
    return np.column_stack([np.ones(len(frame)), frame["x"] / 5 - 1, frame["z"] / 5])


def by_hand(frame: pd.DataFrame, model: str, weights: np.ndarray) -> np.ndarray:
    """The sum over rows of the row loss's gradient in scaled space (intercept first)."""
    A = design(frame)
    if model == "linear":
        residual = A @ weights - (frame["y"].to_numpy() / 15 - 1)
    else:
        residual = 1 / (1 + np.exp(-(A @ weights))) - frame["label"].to_numpy()
    return A.T @ residual


def engine(db, fit, weights: np.ndarray) -> np.ndarray:
    """The fit's own statement, run: the exact sum of the units' clipped gradients, in grid steps."""
    statement = fit.statement([float(w) for w in weights])
    row = db._engine.fetch(statement.sql, db._executor.salt_for(statement.needs_salt), bounded=statement.bounded)[0]
    return np.array([int(v) for v in row], dtype=float)


SQL = {"linear": ("SELECT x, z, y FROM t", "y"), "logistic": ("SELECT x, z, label FROM t", "label")}


@pytest.mark.parametrize("model", ["linear", "logistic"])
def test_the_statement_sums_the_loss_gradient_of_every_row(model):
    frame = rows()
    db = connect(frame)
    sql, target = SQL[model]
    fit = plan_fit(db.mechanism_context(), sql, target=target, model=model, epsilon=1, delta=1e-6, clip=CLIP)
    step = CLIP / fit.noise.norm_steps
    for weights in (np.zeros(3), np.array([0.3, -1.2, 0.7]), np.array([-2.0, 3.0, 1.5])):
        expected = by_hand(frame, model, weights) / step
        got = engine(db, fit, weights)
        # truncation toward zero: each of the 30 units loses under one step per coordinate
        assert np.all(np.abs(got - expected) <= len(frame)), (model, weights, got - expected)
        assert np.max(np.abs(expected)) > 1000 * len(frame)  # the comparison is not between zeros


def test_the_logistic_gradient_vanishes_at_the_log_loss_minimum():
    """At the maximum-likelihood weights (Newton's method on the scaled rows) the engine's sum is
    within truncation of zero; with the class read as -1/1 it would be far from it."""
    frame = rows()
    A, label = design(frame), frame["label"].to_numpy()
    weights = np.zeros(3)
    for _ in range(50):
        p = 1 / (1 + np.exp(-(A @ weights)))
        weights = weights - np.linalg.solve((A * (p * (1 - p))[:, None]).T @ A, A.T @ (p - label))
    assert np.max(np.abs(by_hand(frame, "logistic", weights))) < 1e-9
    db = connect(frame)
    fit = plan_fit(db.mechanism_context(), SQL["logistic"][0], target="label", model="logistic", epsilon=1, delta=1e-6, clip=CLIP)
    assert np.all(np.abs(engine(db, fit, weights)) <= len(frame))


@pytest.mark.parametrize("model", ["linear", "logistic"])
def test_a_fit_with_negligible_noise_retraces_numpys_descent(model):
    """epsilon 10^12: 40 steps of dpsql's descent land within truncation and noise of numpy's
    full-batch descent on the same rows (same rate; the noisy count is the count, its sigma far
    below 1/7). Each draw of the step noise is within 7.1 sigma but with probability 1e-12, so
    the tolerance fails a correct fit with probability under 120 draws x 1e-12."""
    frame = rows()
    db = connect(frame)
    sql, target = SQL[model]
    steps, rate, clip = 40, 0.5, 10.0  # every row gradient on this path has norm below 10
    fit = plan_fit(db.mechanism_context(), sql, target=target, model=model, epsilon=10**12, delta=1e-6, clip=clip, steps=steps,
                   learning_rate=rate)
    sigma_steps = float(fit.noise.sigma_squared) ** 0.5
    assert 7.1 * float(fit.noise.count_sigma_squared) ** 0.5 < 1  # the count's noise is 0 but w.p. 1e-12
    model_fit = db.fit(sql, target=target, model=model, epsilon=10**12, delta=1e-6, clip=clip, steps=steps,
                       learning_rate=rate)
    # The fit first releases the means of the scaled columns: the features are centred on them and
    # the intercept starts at the target's mean (logistic: the logit of the base rate).
    A = design(frame)
    means = A[:, 1:].mean(axis=0)
    target_mean = (frame["y"].to_numpy() / 15 - 1).mean() if model == "linear" else frame["label"].mean()
    weights = np.array([target_mean if model == "linear" else np.log(target_mean / (1 - target_mean)), 0.0, 0.0])
    for _ in range(steps):  # the gradient over centred features, from by_hand's at the uncentred weights
        uncentred = np.array([weights[0] - weights[1:] @ means, *weights[1:]])
        g = by_hand(frame, model, uncentred)
        weights = weights - rate * np.array([g[0], *(g[1:] - means * g[0])]) / len(frame)
    weights = np.array([weights[0] - weights[1:] @ means, *weights[1:]])
    intercept = weights[0] - weights[1]  # x' = x / 5 - 1, z' = z / 5
    coefficients = [weights[1] / 5, weights[2] / 5]
    if model == "linear":  # y' = y / 15 - 1
        intercept, coefficients = 15 * (intercept + 1), [15 * c for c in coefficients]
    # Each step moves each weight by at most rate * (units + 7.1 sigma) grid steps / rows (truncation,
    # noise); the descent map is non-expansive in L2 at this rate, so the errors add: sqrt(3) for L2
    # over 3 coordinates, 2 for the intercept w0 - w1, 15 for the linear target's unscaling.
    per_step = rate * (len(frame) + 7.1 * sigma_steps) * (clip / fit.noise.norm_steps) / len(frame)
    tolerance = steps * per_step * 3 ** 0.5 * 2 * (15 if model == "linear" else 1)
    assert model_fit.intercept == pytest.approx(intercept, abs=tolerance)
    assert [model_fit.coefficients["x"], model_fit.coefficients["z"]] == pytest.approx(coefficients, abs=tolerance)
    assert tolerance < 0.02
