"""Noisy gradient descent on per-unit clipped gradients: calibration and the update (no SQL).

A model is fitted in *scaled* space: each feature and (for linear regression) the target is
mapped affinely from its bounds [L, U] onto [-1, 1], so every row's gradient is bounded by the
current weights alone and one learning rate fits every column. Each step, the engine computes
(``dpsql.calls.fit_sql``), for every unit, the average over its rows of the row gradients, scales that
vector to L2 norm at most C (the *clip*), writes it on an integer grid of C/D by truncating
each coordinate toward zero (which never lengthens a vector: its norm stays at most D grid
steps), and sums the units' vectors exactly. One unit therefore moves the summed vector by at
most D in L2 when it is added or removed, and by at most 2D when it is replaced by another
(both vectors lie in the ball of radius D). Independent discrete Gaussian noise N_Z(0, s^2) on
each coordinate makes one step (sD)^2 / (2 s^2)-zCDP (Canonne, Kamath, Steinke 2020, Thm 14,
with s = 1 or 2 the relation's factor); T steps compose to the sum (Bun & Steinke 2016, Lemma
2.3), whatever the weights each step used, since they are post-processing of earlier releases.

The update divides the noisy sum by a noisy count of the units (one unit moves it by at most
1, under either relation), released once with a twentieth of the budget: a step on the average
over units of each unit's average row loss, so every unit weighs the same whatever its rows,
and a clip of about one row's gradient suits units of one row or of hundreds.

DP-SGD (Abadi et al. 2016): with a Poisson sample of units per step (``rate``), the sum and its
noise are divided by rate times the noisy count; the cost is the subsampled Gaussian's
(``dpsql.budget.subsampled``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction
from typing import Literal, Sequence

import numpy as np

from dpsql.errors import InvalidParameter

Model = Literal["linear", "logistic"]
MODELS: tuple[str, ...] = ("linear", "logistic")

COUNT_SHARE = Fraction(1, 20)
"""The share of the budget (of rho, or of epsilon and delta with sampling) spent on the count of units."""
MEAN_SHARE = Fraction(1, 10)
"""The share of rho spent on the noisy means of the scaled columns (full batch): the features are
centred on them and the intercept starts at the target's, so the slopes need not first undo an
intercept that starts at 0 (on flights, 30 steps from 0 reached 0.6-0.7 of the OLS slope; centred,
60 steps reach it within 2%: docs/models.md)."""
MAX_STEPS = 1_000
"""The most steps one fit may take: each runs one statement over the whole copy, and a server
answers one statement at a time."""
MAX_FEATURES = 100
"""The most features one fit may have (each adds a coordinate to every step's statement)."""
RADIUS = 1e4
"""Weights are kept in [-RADIUS, RADIUS] (scaled space): public post-processing that keeps
every literal of the next step's statement finite."""
MARGIN = 1 - 2.0 ** -20
"""The engine clips to C * MARGIN, so float rounding in its norm cannot take a vector past C."""
LARGEST_SIGMA_SQUARED = 2 ** 52
"""The grid is chosen so that the noise's sigma^2, in grid steps, stays below this (the exact
discrete Gaussian sampler takes up to about 2^54)."""


@dataclass(frozen=True)
class Bounds:
    """A column's bounds in its own units, and its map onto [-1, 1]."""

    lower: float
    upper: float

    @property
    def slope(self) -> float:
        """a in x' = a x + c (0 for a column whose bounds are one value: it carries nothing)."""
        return 0.0 if self.upper == self.lower else 2.0 / (self.upper - self.lower)

    @property
    def offset(self) -> float:
        return 0.0 if self.upper == self.lower else -(self.upper + self.lower) / (self.upper - self.lower)


@dataclass(frozen=True)
class Noise:
    """The noise of a fit: per-step gradient noise and the count's, in grid steps."""

    norm_steps: int
    """D: one unit's clipped gradient has L2 norm at most D grid steps (a grid step is clip / D)."""
    sigma_squared: Fraction
    """sigma^2 of the discrete Gaussian on each gradient coordinate, per step."""
    count_sigma_squared: Fraction
    """sigma^2 of the discrete Gaussian on the count of units."""
    mean_steps: int = 0
    """D_m: one unit's average of each scaled column is released in grid steps of 1 / D_m (0: no
    means are released, the fit starts at 0 uncentred: a Poisson-sampled fit)."""
    mean_sigma_squared: Fraction = Fraction(0)
    """sigma^2 of the discrete Gaussian on each column's sum of unit averages (grid steps)."""


def grid_steps(noise_multiplier: float) -> int:
    """D, the largest power of two up to 2^24 with (z D)^2 below ``LARGEST_SIGMA_SQUARED``: a fine
    grid (truncation moves a unit's vector by under sqrt(d)/D of the clip) the sampler still takes.

    >>> grid_steps(1.0), grid_steps(100.0)
    (16777216, 524288)
    """
    steps = 2 ** 24
    while steps > 1 and (noise_multiplier * steps) ** 2 >= LARGEST_SIGMA_SQUARED:
        steps //= 2
    return steps


def check_model(model: object) -> Model:
    if model not in MODELS:
        raise InvalidParameter(f"model must be 'linear' or 'logistic', got {model!r}",
                               hint="pass model='linear' (least squares) or model='logistic'")
    return model  # type: ignore[return-value]


def check_steps(steps: object) -> int:
    if isinstance(steps, bool) or not isinstance(steps, int) or not 1 <= steps <= MAX_STEPS:
        raise InvalidParameter(f"steps must be a whole number from 1 to {MAX_STEPS}, got {steps!r}",
                               hint="steps=50: more steps fit further, each with more noise")
    return steps


SANE = (1e-6, 1e6)
"""The clip and the learning rate, in scaled units, lie in this range: beyond it a fit is not
meaningful, and the statement's constants (D / clip) stay ordinary doubles."""


def check_scaled(value: object, name: str, example: str) -> float:
    """A clip or learning rate: a number in ``SANE`` (scaled units), refused before the charge."""
    low, high = SANE
    if isinstance(value, bool) or not isinstance(value, (int, float, Fraction)) or \
            not math.isfinite(float(value)) or not low <= float(value) <= high:
        shown = f"{float(value):g}" if isinstance(value, (int, float, Fraction)) and not isinstance(value, bool) \
            else repr(value)
        raise InvalidParameter(f"{name} must be a number from {low:g} to {high:g} (scaled units), got {shown}",
                               hint=f"pass {name}={example}")
    return float(value)


def default_learning_rate(model: Model, features: int, centred: bool = True) -> float:
    """A step that cannot overshoot on the average scaled loss's curvature. Uncentred, its Hessian
    has eigenvalues at most d + 1 (squared loss; a quarter of that for the logistic), since every
    scaled row (x', 1) has squared norm at most d + 1: 2 / (d + 1) (or 8 / (d + 1)) is the stable
    limit, capped at 1 (4). Centred on the features' means, the Hessian is about diag(1, Cov(x')),
    whose eigenvalues are at most max(1, d) (each scaled feature's variance is at most 1): 0.9 of
    the stable limit 2 / max(1, d) (four times that for the logistic).

    >>> default_learning_rate("linear", 3, centred=False), default_learning_rate("logistic", 15, centred=False)
    (0.5, 0.5)
    >>> default_learning_rate("linear", 1), default_learning_rate("linear", 3)
    (1.8, 0.6)
    """
    scale = 1.0 if model == "linear" else 4.0
    if centred:
        return scale * 1.8 / max(1, features)
    return scale * min(1.0, 2.0 / (features + 1))


def starting_point(model: Model, noisy_sums: Sequence[int], noise: Noise, units: float) -> tuple[np.ndarray, float]:
    """(offsets of the features, the intercept to start at) from the noisy sums of the units'
    averages of each scaled column (features, then the target): the means, kept within [-1, 1]
    (a logistic target's within [0.01, 0.99], its intercept the logit of that base rate)."""
    means = np.asarray([float(v) for v in noisy_sums]) / (noise.mean_steps * max(units, 1.0))
    offsets = np.clip(means[:-1], -1.0, 1.0)
    if model == "linear":
        return offsets, float(np.clip(means[-1], -1.0, 1.0))
    rate = float(np.clip(means[-1], 0.01, 0.99))
    return offsets, math.log(rate / (1 - rate))


def uncentred_weights(weights: np.ndarray, offsets: np.ndarray) -> np.ndarray:
    """Weights over (1, x') from weights over (1, x' - offsets): w0 - sum w_j m_j, the slopes as they are.

    >>> uncentred_weights(np.array([1.0, 2.0]), np.array([0.5])).tolist()
    [0.0, 2.0]
    """
    out = np.array(weights, dtype=float)
    out[0] = out[0] - float(np.dot(out[1:], offsets))
    return out


def descend(weights: np.ndarray, noisy_sum: Sequence[int], noise: Noise, clip: float, units: float,
            learning_rate: float) -> np.ndarray:
    """One update from the noisy integer gradient sum (intercept first, then the features):
    w - rate * grid * sum / units, kept within [-RADIUS, RADIUS]."""
    gradient = np.asarray([float(v) for v in noisy_sum]) * (clip / noise.norm_steps) / max(units, 1.0)
    return np.clip(weights - learning_rate * gradient, -RADIUS, RADIUS)


def unscaled(weights: np.ndarray, model: Model, features: Sequence[Bounds],
             target: Bounds | None) -> tuple[float, list[float]]:
    """(intercept, coefficients) in the columns' own units from scaled weights (intercept first).
    Linear: y' = b + sum w_j (a_j x_j + c_j) with y' = a_y y + c_y; logistic: the logit is y'.

    >>> unscaled(np.array([0.0, 1.0]), "linear", [Bounds(0, 10)], Bounds(0, 10))
    (0.0, [1.0])
    """
    intercept = float(weights[0]) + sum(float(w) * f.offset for w, f in zip(weights[1:], features))
    coefficients = [float(w) * f.slope for w, f in zip(weights[1:], features)]
    if model == "linear":
        assert target is not None
        if target.slope == 0:  # a target of one value: the model is that value
            return target.lower, [0.0] * len(coefficients)
        intercept = (intercept - target.offset) / target.slope
        coefficients = [c / target.slope for c in coefficients]
    return intercept, coefficients
