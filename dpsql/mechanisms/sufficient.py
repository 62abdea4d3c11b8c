"""Linear regression from noisy sufficient statistics: the statistics, their bounds and noise,
and the solve (no SQL).

Least squares with an intercept needs only sums over the rows: n, each column's sum, and the
sums of products of every feature with every feature and with the target (X'X and X'y).
Each is released once as a sum over units of one unit's *total*, clamped into an interval:

* a column ``x`` with ``BOUNDS PER UNIT a TO b`` in the policy: its unit total is clamped into
  [a, b]; the total of ``x^2`` into [0, max(|a|, |b|) * max|row bound|] (derived, not a fact
  about the data: a clamp is private whatever it is, the derivation only aims to leave most
  units' totals alone), and of ``x z`` into +-sqrt(B_xx B_zz) (Cauchy-Schwarz: whenever both
  squares are within their bounds, so is the cross product);
* always also k times the row interval (at most k rows per unit, each clamped into its bounds),
  which is what bounds a column without ``BOUNDS PER UNIT``. Such a column is centred on the
  middle of its bounds first (``x - c``): a public shift, which leaves the slopes unchanged and
  makes every row interval, and the noise, smaller.

The clamp into the intersection of both intervals is written into the statement, so one unit
moves statistic s by at most ``unit_total_sensitivity`` of its interval (adding or removing a
unit: max(|lo|, |hi|); replacing one: hi - lo), which is never more than the rows rule
``bounded_sum_sensitivity`` gives. Each statistic is released on a coarser grid of ``scale``
(a power of two) fine units with discrete Gaussian noise; a unit moves the whole vector by the
vector of those bounds, so the zCDP costs add: rho = sum_s Delta_s^2 / (2 sigma_s^2) (Bun &
Steinke 2016; CKS20 for the discrete Gaussian). The budget's rho is split equally over the
statistics.

The coefficients solve the centred normal equations on the noisy statistics (post-processing),
with a ridge only where noise could make them indefinite: in units where the noise sd of each
feature's centred sum of squares is 1, lambda lifts the smallest eigenvalue to the noise
matrix's Frobenius norm, and is 0 when it is there (``_solve``). The interval of each
coefficient is a parametric bootstrap: the solve repeated on the released statistics plus
fresh draws of their known noise laws (Gaussian with the released sigmas), the interval the
(1 - alpha) quantile of the distance to the released fit.
A release that needed a ridge states no interval (the ridge's bias is not in the bootstrap;
it undercovered). The interval describes the noise only: clamping's bias (rows past their
bounds, unit totals past their per-unit bounds) is not in it.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass
from fractions import Fraction
from typing import Sequence

import numpy as np

TARGET_SIGMA = 2 ** 20
"""A statistic is released on the coarsest power-of-two grid that keeps its noise's sigma at
least this many grid steps: the rounding of one unit's total (under one step) is then nothing
next to the noise, and sigma^2 stays far below what the exact sampler takes (about 2^54)."""
LARGEST_BOUND = 2 ** 52
"""A clamp interval (in its grid) must lie within +-2^52: the statement clamps in DOUBLE, exact there."""
RIDGE_DEVIATIONS = 1.0
"""The noisy centred X'X, each feature in units of its diagonal's noise sd, is lifted to at least this
many times its noise's Frobenius norm."""
WEIGHTS = (Fraction(1), Fraction(1), Fraction(3))
"""The shares of rho of the count, of each column's sum and of each product (1 : 1 : 3): the products
(X'X, X'y) carry the slopes; measured on flights (docs/models.md), 1 : 1 : 3 halved the slope's spread
against an equal split."""
BOOTSTRAP_DRAWS = 2000
"""Draws of the parametric bootstrap behind each coefficient's interval."""


@dataclass(frozen=True)
class Column:
    """A feature or the target, as its bounded rows hold it: integers on ``grid``."""

    grid: Fraction
    """One step of the column's integer values, in the column's units."""
    lower: int
    """Row bound, in grid steps."""
    upper: int
    offset: int
    """The public centre subtracted from every value (grid steps): 0 with unit bounds."""
    unit_bounds: tuple[int, int] | None = None
    """``BOUNDS PER UNIT`` of the column in grid steps (inward), or None."""

    @property
    def centred(self) -> tuple[int, int]:
        return self.lower - self.offset, self.upper - self.offset


@dataclass(frozen=True)
class Statistic:
    """One released sum over units of a unit's clamped total."""

    name: str
    """``n``, ``sum(c)`` or ``sum(c*d)`` (column numbers, the target last)."""
    factors: tuple[int, ...]
    """The columns multiplied in each row (none: the count of rows)."""
    lower: int
    """One unit's total is clamped into [lower, upper], in units of ``scale`` fine steps."""
    upper: int
    scale: int
    """One step of the released value, in fine steps (the product of the factors' grid steps)."""
    sensitivity: Fraction
    """How far one unit moves it, in its own steps (one coordinate: its L1 and L2 sensitivity alike;
    ``dpsql.analysis.sensitivity.unit_total_sensitivity`` of [lower, upper])."""
    sigma_squared: Fraction
    """The discrete Gaussian's sigma^2, in its own steps (0: it cannot move, no noise)."""
    rho: Fraction
    """Its share of the fit's zCDP cost: sensitivity^2 / (2 sigma^2)."""
    unit_bounded: bool
    """Its interval comes from ``BOUNDS PER UNIT`` (else from the rows alone)."""


def fitted_column(grid: Fraction, lower: int, upper: int, unit_bounds: tuple[int, int] | None,
                  rows_per_unit: int) -> Column:
    """A column as the statistics read it: by its BOUNDS PER UNIT (uncentred) when they bound a
    unit's total tighter than k rows of its centred values do, else centred on the middle of its
    row bounds with no unit bounds (a public choice: it reads nothing but the policy).

    >>> fitted_column(Fraction(1), -60, 360, (-40, 5400), 300).offset
    0
    >>> fitted_column(Fraction(1), 0, 10, (0, 400), 4)
    Column(grid=Fraction(1, 1), lower=0, upper=10, offset=5, unit_bounds=None)
    """
    centre = (lower + upper) // 2
    centred_reach = rows_per_unit * max(abs(lower - centre), abs(upper - centre))
    if unit_bounds is not None:
        rows_reach = rows_per_unit * max(abs(lower), abs(upper))
        if min(max(abs(unit_bounds[0]), abs(unit_bounds[1])), rows_reach) < centred_reach:
            return Column(grid, lower, upper, 0, unit_bounds)
    return Column(grid, lower, upper, centre, None)


def layout(features: int) -> list[tuple[int, ...]]:
    """The factors of every statistic, in release order: n, each column's sum, X'X (upper
    triangle), X'y.

    >>> layout(1)
    [(), (0,), (1,), (0, 0), (0, 1)]
    """
    target = features
    order: list[tuple[int, ...]] = [()]
    order += [(j,) for j in range(features + 1)]
    order += [(i, j) for i in range(features) for j in range(i, features)]
    order += [(j, target) for j in range(features)]
    return order


def _corners(a: tuple[int, int], b: tuple[int, int]) -> tuple[int, int]:
    products = [x * y for x in a for y in b]
    return min(products), max(products)


def _square(a: tuple[int, int]) -> tuple[int, int]:
    low, high = a
    if low <= 0 <= high:
        return 0, max(low * low, high * high)
    return min(low * low, high * high), max(low * low, high * high)


def row_interval(factors: tuple[int, ...], columns: Sequence[Column]) -> tuple[int, int]:
    """The interval of one row's value of a statistic (fine steps)."""
    if not factors:
        return 1, 1
    if len(factors) == 1:
        return columns[factors[0]].centred
    i, j = factors
    if i == j:
        return _square(columns[i].centred)
    return _corners(columns[i].centred, columns[j].centred)


def _square_bound(column: Column) -> int | None:
    """The derived per-unit bound of a column's sum of squares: max|unit total| * max|row value|."""
    if column.unit_bounds is None:
        return None
    low, high = column.centred
    return max(abs(column.unit_bounds[0]), abs(column.unit_bounds[1])) * max(abs(low), abs(high))


def unit_interval(factors: tuple[int, ...], columns: Sequence[Column]) -> tuple[int, int] | None:
    """The per-unit interval the policy's BOUNDS PER UNIT give a statistic (fine steps), if any."""
    if len(factors) == 1:
        return columns[factors[0]].unit_bounds
    if len(factors) == 2:
        i, j = factors
        bi, bj = _square_bound(columns[i]), _square_bound(columns[j])
        if i == j:
            return None if bi is None else (0, bi)
        if bi is None or bj is None:
            return None
        reach = math.isqrt(bi * bj)
        return -reach, reach
    return None


def clamp_interval(factors: tuple[int, ...], columns: Sequence[Column],
                   rows_per_unit: int) -> tuple[tuple[int, int], bool]:
    """One unit's total is clamped into this (fine steps): k times the row interval (with 0: a
    unit may have fewer rows), intersected with the BOUNDS PER UNIT interval where there is one;
    and whether the latter was used."""
    low, high = row_interval(factors, columns)
    rows = (rows_per_unit * min(low, 0), rows_per_unit * max(high, 0))
    unit = unit_interval(factors, columns)
    if unit is None:
        return rows, False
    met = (max(rows[0], unit[0]), min(rows[1], unit[1]))
    if met[0] > met[1]:  # disjoint (a unit interval away from 0 past the rows' reach): the rows' edge
        edge = rows[0] if unit[1] < rows[0] else rows[1]
        met = (edge, edge)
    return met, True


# -- the solve ------------------------------------------------------------------------------------

def _in_units(values: Sequence[float], stats: Sequence[Statistic], columns: Sequence[Column]) -> np.ndarray:
    """Released integers (steps) to the centred columns' own units."""
    out = []
    for value, statistic in zip(values, stats):
        unit = float(statistic.scale)
        for f in statistic.factors:
            unit *= float(columns[f].grid)
        out.append(float(value) * unit)
    return np.asarray(out, dtype=float)


def noise_sds(stats: Sequence[Statistic], columns: Sequence[Column]) -> np.ndarray:
    """Each statistic's noise standard deviation, in the centred columns' own units."""
    return _in_units([math.sqrt(float(s.sigma_squared)) for s in stats], stats, columns)


def _system(values: np.ndarray, stats: Sequence[Statistic], features: int) -> tuple[np.ndarray, np.ndarray]:
    """(A, b) of the normal equations over (1, x_1 .. x_d), from statistics in units (batched: the
    last axis is the statistics)."""
    size = features + 1
    batch = values.shape[:-1]
    A = np.zeros(batch + (size, size))
    b = np.zeros(batch + (size,))
    for k, statistic in enumerate(stats):
        factors, value = statistic.factors, values[..., k]
        if not factors:
            A[..., 0, 0] = value
        elif len(factors) == 1:
            if factors[0] < features:
                A[..., 0, factors[0] + 1] = A[..., factors[0] + 1, 0] = value
            else:
                b[..., 0] = value
        elif factors[1] < features:
            i, j = factors[0] + 1, factors[1] + 1
            A[..., i, j] = A[..., j, i] = value
        else:
            b[..., factors[0] + 1] = value
    return A, b


def _solve(values: np.ndarray, stats: Sequence[Statistic], columns: Sequence[Column],
           sds: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Coefficients (intercept first) over the centred columns, and the ridge used (batched).

    The slopes solve the normal equations centred on the noisy means, (C + lambda W) b = c with
    C = X'X - S S' / n and c = X'y - S s_y / n; the intercept is then mean(y) - b . mean(x).
    Without a ridge that is the full system's solution. W is the diagonal of the noise standard
    deviations of C's diagonal (by the delta method from the statistics' sigmas): in the units
    where each is 1, lambda lifts C's smallest eigenvalue to ``RIDGE_DEVIATIONS``, and is 0 when
    it is there already. A feature the noise barely touches gets a ridge as small as its noise."""
    features = len(columns) - 1
    A, b = _system(values, stats, features)
    sd_A, _ = _system(sds[None, :], stats, features)
    n = np.maximum(A[..., 0, 0], 1.0)
    sums, target_sum = A[..., 0, 1:], b[..., 0]
    means = sums / n[..., None]
    C = A[..., 1:, 1:] - sums[..., :, None] * sums[..., None, :] / n[..., None, None]
    c = b[..., 1:] - sums * (target_sum / n)[..., None]
    # sd of C_ij = X'X_ij - S_i S_j / n (delta method): its own noise, mean_j times S_i's and
    # mean_i times S_j's, mean_i mean_j times n's
    sd_sums, sd_n = sd_A[0, 0, 1:], sd_A[0, 0, 0]
    spread = np.sqrt(sd_A[0, 1:, 1:] ** 2 + (means[..., None, :] * sd_sums[:, None]) ** 2
                     + (means[..., :, None] * sd_sums[None, :]) ** 2
                     + (means[..., :, None] * means[..., None, :] * sd_n) ** 2)
    diagonal = np.diagonal(spread, axis1=-2, axis2=-1)
    scale = np.where(diagonal > 0, 1.0 / np.sqrt(np.where(diagonal > 0, diagonal, 1.0)), 1.0)
    C = C * scale[..., :, None] * scale[..., None, :]
    c = c * scale
    # the noise matrix's norm is about its Frobenius norm, in the same units (at least 1)
    noise = np.sqrt(np.sum((spread * scale[..., :, None] * scale[..., None, :]) ** 2, axis=(-2, -1)))
    lowest = np.linalg.eigvalsh(C)[..., 0]
    ridge = np.maximum(RIDGE_DEVIATIONS * np.maximum(noise, 1.0) - lowest, 0.0)
    C = C + ridge[..., None, None] * np.eye(features)
    slopes = np.linalg.solve(C, c[..., None])[..., 0] * scale
    intercept = target_sum / n - np.sum(slopes * means, axis=-1)
    return np.concatenate([intercept[..., None], slopes], axis=-1), ridge


def uncentred(coefficients: np.ndarray, columns: Sequence[Column]) -> tuple[np.ndarray, np.ndarray]:
    """(intercept, slopes) in the columns' own units from a fit over centred columns (batched):
    y - c_y = b0 + sum b_j (x_j - c_j)."""
    slopes = coefficients[..., 1:]
    offsets = np.asarray([float(c.offset * c.grid) for c in columns[:-1]])
    intercept = coefficients[..., 0] + float(columns[-1].offset * columns[-1].grid) - slopes @ offsets
    return intercept, slopes


@dataclass(frozen=True)
class Solution:
    """A fit from released statistics."""

    intercept: float
    coefficients: tuple[float, ...]
    ridge: float
    """The ridge added to the scaled X'X (0: none was needed)."""


def solve(released: Sequence[int], stats: Sequence[Statistic], columns: Sequence[Column]) -> Solution:
    """The least-squares fit from the released statistics (integers in their steps): post-processing."""
    values = _in_units(released, stats, columns)
    coefficients, ridge = _solve(values[None, :], stats, columns, noise_sds(stats, columns))
    intercept, slopes = uncentred(coefficients, columns)
    return Solution(float(intercept[0]), tuple(float(s) for s in slopes[0]), float(ridge[0]))


def bootstrap_halfwidths(released: Sequence[int], stats: Sequence[Statistic], columns: Sequence[Column],
                         alpha: float, draws: int = BOOTSTRAP_DRAWS) -> np.ndarray:
    """Each term's (intercept first) half-width at level 1 - alpha by parametric bootstrap: the
    solve on the released statistics plus fresh Gaussian draws of their noise, the (1 - alpha)
    quantile of the distance to the released solve. Post-processing, seeded by the released values
    (the same release always states the same interval)."""
    seed = int.from_bytes(hashlib.sha256(repr([int(v) for v in released]).encode()).digest()[:8], "big")
    generator = np.random.Generator(np.random.PCG64(seed))
    sds = noise_sds(stats, columns)
    values = _in_units(released, stats, columns)
    centre, _ = _solve(values[None, :], stats, columns, sds)
    drawn = values[None, :] + generator.standard_normal((draws, len(stats))) * sds[None, :]
    simulated, _ = _solve(drawn, stats, columns, sds)
    intercepts, slopes = uncentred(simulated, columns)
    centre_intercept, centre_slopes = uncentred(centre, columns)
    distance = np.abs(np.column_stack([intercepts - centre_intercept[0], slopes - centre_slopes[0]]))
    return np.quantile(distance, 1 - alpha, axis=0)
