"""What noisy gradient descent (DP-SGD) on the integer grid costs: the Rényi DP of a Poisson-
subsampled discrete Gaussian step, its composition over T steps, and the noise that fits a budget.

The mechanism. T steps; in each, every privacy unit is kept independently with probability q
(Poisson sampling of units from a secure source; q = 1 is the full batch), each kept unit gives a
vector in Z^d of L2 norm at most D (per-unit clipping), the vectors are summed exactly, and
independent discrete Gaussian noise N_Z(0, s^2) is added to each coordinate. Neighbours:
add/remove one unit (Poisson sampling under replace-one neighbours is refused by the caller: a
replaced unit keeps its coin or gets a fresh one, and the bound below is not proven for that).
The noise multiplier is z = s / D.

One step, no sampling (q = 1). Canonne, Kamath, Steinke 2020 ("The Discrete Gaussian for
Differential Privacy", NeurIPS; Prop 5 for one coordinate, Thm 14 for independent coordinates):
for mu, nu in Z^d, D_alpha(N_Z(mu, s^2 I) || N_Z(nu, s^2 I)) <= alpha ||mu - nu||^2 / (2 s^2) for
every alpha > 1, in both orders (the bound is symmetric in mu, nu). Adding or removing a unit
moves the sum by one clipped vector, so a step is (alpha, eps(alpha))-RDP with
eps(alpha) = alpha / (2 z^2). (For integer alpha and an integer shift it is an equality: the sum
over the lattice of exp(-(x - alpha*v)^2 / 2s^2) does not depend on the integer alpha*v.)

One step, sampled (q < 1). Let D' = D + x (a removal is the same pair, named the other way).
Given the sample S of D's units (its law is the same for D and D': every coin is independent),
the step's output on D is P_S = M(S) and on D' the mixture (1-q) P_S + q Q_S, Q_S = M(S + x); the
outputs are E_S of these. (a, b) -> a^alpha b^(1-alpha) is jointly convex for alpha > 1, so each
direction's e^((alpha-1) D_alpha) is at most the worst S's, and it suffices to bound, with r =
Q_S / P_S (E_P[r] = 1, E_P[r^l] = e^((l-1) D_l(Q_S || P_S)) <= e^((l-1) eps(l))), for integer
alpha >= 2:

  with || without: E_P[(1 - q + q r)^alpha] = sum_{l=0..alpha} C(alpha, l) q^l (1-q)^(alpha-l) E_P[r^l]
      <= F(alpha) = sum_l C(alpha, l) q^l (1-q)^(alpha-l) e^((l-1) eps(l))  (the binomial theorem;
      the formula Mironov, Talwar, Zhang 2019 prove exact for the continuous Gaussian).
  without || with: E_P[f(u)] with f(u) = (1 + u)^-(alpha-1), u = q (r - 1) >= -q. f(u) <= 1 -
      (alpha-1) u + K u^2 / q^2 for all u >= -q, K = (1-q)^-(alpha-1) - 1 - (alpha-1) q: on
      [-q, 0] because (f(u) - 1 + (alpha-1) u) / u^2 = sum_{k>=2} C(alpha+k-2, k) (-u)^(k-2) grows
      with -u, so is at most its value K / q^2 at u = -q; on u >= 0 because f'' falls, so the
      excess is at most f''(0) u^2 / 2 = C(alpha, 2) u^2 <= K u^2 / q^2. Taking E_P:
      R(alpha) = 1 + K (e^eps(2) - 1).

So eps'(alpha) <= max(log F, log R) / (alpha - 1). Both hold for any base mechanism with that RDP
curve; they use no density and no rotation invariance, so they hold for the multi-dimensional
discrete Gaussian, whose curve CKS20 gives on integer sums. (The second direction of MTZ19, that
it is the smaller one, is proven from the continuous Gaussian's density; we do not use it.)

We also take the minimum with two published bounds. Zhu & Wang 2019 ("Poisson Subsampled Rényi
Differential Privacy", ICML, PMLR 97, Theorem 6, "general upper bound"): if M is (l, eps(l))-RDP
for l = 2..alpha under add/remove neighbours (RDP in their sense: D_l(M(X) || M(X')) <= eps(l)
for every neighbouring pair, so in both orders, as CKS20's symmetric bound gives), then
M o PoissonSample_q is (alpha, eps'(alpha))-RDP for every neighbouring pair with

    eps'(alpha) <= 1/(alpha-1) log{ (1-q)^(alpha-1) (alpha q - q + 1)
                                   + C(alpha, 2) q^2 (1-q)^(alpha-2) e^eps(2)
                                   + 3 sum_{l=3..alpha} C(alpha, l) q^l (1-q)^(alpha-l) e^((l-1) eps(l)) },

F with a factor 3 on l >= 3 for the second direction: smaller than R where q alpha is large
(R's K grows like (1-q)^-alpha). It is the one ingredient not proven here; without it the charge
grows by at most 8.5% on the grid of docs/accounting.md, only at q = 0.1, z <= 1 (epsilon > 13).
And the unsampled alpha / (2 z^2): Rényi divergence is jointly quasi-convex, so sampling never
hurts (``dpsql.budget.amplification``).
``tests/test_subsampled.py`` checks the result against the exact divergences of the one- and
two-dimensional sampled discrete Gaussian summed over the lattice, in both directions (each of
the three bounds decides some case there), checks F and R on finite mechanisms (R is tight to
first order on some), and the final epsilon against the exact privacy profile of composed steps.

Computation. F, Zhu-Wang's bound and R are each written as 1 + x with x a sum of positive terms
(the l = 0, 1 terms and sum_l C(alpha, l) q^l (1-q)^(alpha-l) = 1 cancel the leading 1 exactly):

    x = sum_{l=2..alpha} C(alpha, l) q^l (1-q)^(alpha-l) (w_l e^((l-1) eps(l)) - 1),  w = 1 (F), or
        w_2 = 1, w_l = 3 (Zhu-Wang);   x = K (e^eps(2) - 1) (R),

so nothing cancels; terms are summed by log-sum-exp, log C(alpha, l) comes from log-gamma
(absolute error below 1e-10), K from 60-digit decimals (its subtraction cancels), and each
log1p(x) / (alpha - 1) is raised by a relative 1e-9, far above the float error (~1e-11).

T steps. RDP composes additively, also adaptively (Mironov 2017, Prop 1): T eps'(alpha). Then
(epsilon, delta)-DP with epsilon = T eps'(alpha) + log((alpha-1)/alpha) - (log delta + log alpha)
/ (alpha - 1) for any alpha (CKS20 Prop 12; Balle, Barthe, Gaboardi, Hsu, Sato 2020, Thm 21),
minimised over the integer ``ORDERS``. At q = 1 the steps are exactly (T / 2z^2)-zCDP, and the
zCDP conversion over every real alpha (``dpsql.budget.accounting.epsilon_of_rho``) is used when it
is smaller. Floats decide nothing without a margin in the safe direction: epsilon is rounded up
to a Fraction with a relative margin of 1e-9 of the sum of the magnitudes of its parts.

Under ``ACCOUNTING ZCDP`` a step is not cheaper for being sampled: the subsampled RDP is not
rho-zCDP for any smaller rho (its eps'(alpha)/alpha tends to 1/(2z^2)), so the run costs
rho = T / (2 z^2), the unsampled zCDP (``dp_sgd_cost``; ``dpsql.budget.amplification``).

>>> eps = dp_sgd_epsilon(Fraction(1, 100), Fraction(1), 1000, Fraction(1, 10**5))
>>> 2.1 < float(eps) < 2.2  # dp-accounting's RDP accountant, for the continuous Gaussian: 2.101
True
>>> z = noise_multiplier_for(Fraction(1), Fraction(1, 10**5), Fraction(1, 100), 1000)
>>> dp_sgd_epsilon(Fraction(1, 100), z, 1000, Fraction(1, 10**5)) <= 1
True
"""

from __future__ import annotations

import decimal
import functools
import math
from decimal import Decimal
from fractions import Fraction
from numbers import Rational, Real

import numpy as np

from dpsql.budget.accounting import Spend, _best_epsilon, _log_inverse_up, _round_up, epsilon_of_rho
from dpsql.errors import InvalidParameter

ORDERS = tuple(range(2, 65)) + tuple(range(72, 257, 8)) + (320, 384, 512, 768, 1024)
"""The integer Rényi orders ``dp_sgd_epsilon`` minimises over. Any set gives a valid epsilon; this
one is dense where typical runs have their best order (below ~64; the curve is flat above) and
costs about 1 ms per evaluation."""
Z_CAP = 10**6
"""The largest noise multiplier ``noise_multiplier_for`` considers."""
_Z_FLOOR = Fraction(1, 1000)  # the smallest noise multiplier it returns
_MARGIN = 1e-9  # relative slack demanded of every float computation that decides a cost
_DIGITS = 6  # noise_multiplier_for rounds z up to this many significant decimal digits
_NO_BOUND = Fraction(10**12)  # the epsilon reported where no order bounds the loss: above any budget


def rdp_epsilon(alpha: int, q, z) -> float:
    """An upper bound on the Rényi DP at integer order ``alpha`` >= 2 of one step: a Poisson
    sample of units at rate ``q``, discrete Gaussian noise of multiplier ``z`` (module docstring).

    >>> rdp_epsilon(2, 1, 1)  # alpha / (2 z^2), raised by the float margin
    1.000000001
    >>> rdp_epsilon(8, Fraction(1, 100), 1) < 0.01
    True
    """
    if isinstance(alpha, bool) or not isinstance(alpha, int) or alpha < 2:
        raise InvalidParameter(f"a Rényi order must be a whole number >= 2, got {alpha!r}")
    q_float, z_float = _rate(q), _positive(z, "noise multiplier z")
    return float(_rdp_curve((alpha,), q_float, z_float)[0])


def dp_sgd_epsilon(q, z, steps: int, delta) -> Fraction:
    """The epsilon (rounded up) for which ``steps`` steps at sampling rate ``q`` and noise
    multiplier ``z`` are (epsilon, ``delta``)-DP under add/remove neighbours.

    >>> rho = Fraction(100, 2 * 4)  # q = 1, z = 2, 100 steps: exactly the zCDP route
    >>> dp_sgd_epsilon(1, 2, 100, Fraction(1, 10**6)) == epsilon_of_rho(rho, Fraction(1, 10**6))
    True
    """
    q_float, z_exact, steps, delta = _rate(q), _exact(z, "noise multiplier z"), _steps(steps), _delta(delta)
    if z_exact <= 0:
        raise InvalidParameter(f"the noise multiplier z must be > 0, got {z}", hint="give z > 0")
    bound = _epsilon_bound(q_float, _float_down(z_exact), steps, float(_log_inverse_up(delta)))
    epsilon = max(_round_up(bound), Fraction(0)) if math.isfinite(bound) else _NO_BOUND
    if q_float == 1:  # exactly (steps / 2z^2)-zCDP: its conversion over every real order
        epsilon = min(epsilon, epsilon_of_rho(Fraction(steps) / (2 * z_exact ** 2), delta))
    return epsilon


def dp_sgd_cost(q, z, steps: int, delta) -> Spend:
    """What ``steps`` steps cost: (``dp_sgd_epsilon``, ``delta``), and rho = steps / (2 z^2), the
    zCDP a sampled step keeps (module docstring), for ``ACCOUNTING ZCDP``.

    >>> print(dp_sgd_cost(Fraction(1, 100), 4, 200, Fraction(1, 10**6)))
    epsilon 0.172798, delta 1e-6, rho 6.25
    """
    z_exact = _exact(z, "noise multiplier z")
    epsilon = dp_sgd_epsilon(q, z_exact, steps, delta)
    return Spend(epsilon, _exact(delta, "delta"), Fraction(_steps(steps)) / (2 * z_exact ** 2))


def noise_multiplier_for(epsilon, delta, q, steps: int) -> Fraction:
    """The smallest noise multiplier z (to 6 significant digits, rounded up; at least 1/1000)
    with ``dp_sgd_epsilon(q, z, steps, delta) <= epsilon``.

    >>> delta = Fraction(1, 10**6)
    >>> z = noise_multiplier_for(Fraction(1), delta, 1, 10)
    >>> dp_sgd_epsilon(1, z, 10, delta) <= 1 < dp_sgd_epsilon(1, z * Fraction(99, 100), 10, delta)
    True
    """
    target, delta = _exact(epsilon, "epsilon"), _delta(delta)
    q_float, steps = _rate(q), _steps(steps)
    if target <= 0:
        raise InvalidParameter(f"epsilon must be > 0, got {epsilon}", hint="give epsilon > 0")
    log_inverse_delta = float(_log_inverse_up(delta))

    def fits(z: Fraction) -> bool:  # the exact rule the charge will use
        return dp_sgd_epsilon(q, z, steps, delta) <= target

    if not fits(Fraction(Z_CAP)):
        raise InvalidParameter(
            f"no noise multiplier up to {Z_CAP} gives epsilon {_text(target)} at delta {_text(delta)} "
            f"for {steps} steps at sampling rate {_text(Fraction(q_float))}",
            hint="allow a larger epsilon or delta, or take fewer steps or a smaller sampling rate")
    if fits(_Z_FLOOR):
        return _Z_FLOOR
    estimate = _solve(lambda z: _epsilon_bound(q_float, z, steps, log_inverse_delta), float(target))
    unit = Fraction(10) ** (math.floor(math.log10(estimate)) - _DIGITS + 1)
    count = max(math.ceil(Fraction(estimate) / unit), 1)
    while not fits(count * unit):  # the float search steers; the exact rule decides
        count += 1
    while count > 1 and fits((count - 1) * unit):
        count -= 1
    return count * unit


def _solve(epsilon_of, target: float) -> float:
    """About the z (within a relative 1e-7) where the decreasing ``epsilon_of(z)`` meets ``target``:
    regula falsi (Illinois) on log epsilon against log z, over [_Z_FLOOR, Z_CAP]."""
    def gap(log_z: float) -> float:
        value = epsilon_of(math.exp(log_z))
        return math.log(value / target) if 0 < value < math.inf else (math.inf if value else -math.inf)

    low, high = math.log(_Z_FLOOR), math.log(Z_CAP)
    gap_low, gap_high = gap(low), gap(high)  # > 0 (too little noise), <= 0
    side = 0
    for _ in range(100):
        if high - low < 1e-7:
            break
        if math.isfinite(gap_low) and math.isfinite(gap_high) and gap_low != gap_high:
            middle = high - gap_high * (high - low) / (gap_high - gap_low)
            middle = min(max(middle, low + 1e-9), high - 1e-9)
        else:
            middle = (low + high) / 2
        value = gap(middle)
        if value > 0:
            low, gap_low = middle, value
            gap_high, side = (gap_high / 2, side) if side == 1 else (gap_high, 1)
        else:
            high, gap_high = middle, value
            gap_low, side = (gap_low / 2, side) if side == -1 else (gap_low, -1)
    return math.exp(high)


# --- the computation ------------------------------------------------------------------------


def _epsilon_bound(q: float, z: float, steps: int, log_inverse_delta: float) -> float:
    """min over ``ORDERS`` of the RDP-to-DP conversion of ``steps`` times ``_rdp_curve``, raised
    by ``_MARGIN`` of the magnitudes of its parts (an upper bound; inf where no order bounds it).
    At q = 1 also the zCDP conversion over every real order (float, as ``epsilon_of_rho``)."""
    composed = steps * _rdp_curve(ORDERS, q, z)
    shrink, spread = _conversion(ORDERS)
    spread = log_inverse_delta * spread
    with np.errstate(invalid="ignore"):
        values = composed + shrink + spread + _MARGIN * (composed - shrink + spread)
    best = float(np.where(np.isnan(values), np.inf, values).min())
    if q >= 1:
        best = min(best, _best_epsilon(steps / (2 * z * z), log_inverse_delta) * (1 + _MARGIN))
    return best


@functools.lru_cache(maxsize=4)
def _conversion(orders: tuple[int, ...]) -> tuple[np.ndarray, np.ndarray]:
    """Per order: log((a-1)/a) - log(a)/(a-1) (<= 0), and 1/(a-1), the factor of log(1/delta)."""
    alphas = np.asarray(orders, dtype=float)
    shrink, spread = _frozen(np.log1p(-1 / alphas) - np.log(alphas) / (alphas - 1), 1 / (alphas - 1))
    return shrink, spread


@functools.lru_cache(maxsize=8)
def _table(orders: tuple[int, ...]) -> tuple[np.ndarray, ...]:
    """For each order alpha and each l = 2..alpha (flattened): where each order's run (its l = 2)
    starts, l, alpha - l, and log C(alpha, l) (from log-gamma: an absolute error below 1e-10 at
    order 1024). Read-only: the cache hands the same arrays to every caller."""
    alpha = np.concatenate([np.full(a - 1, a) for a in orders])
    ell = np.concatenate([np.arange(2, a + 1) for a in orders])
    log_factorial = np.array([math.lgamma(n + 1) for n in range(max(orders) + 1)])  # ~1 ulp each
    log_binomial = log_factorial[alpha] - log_factorial[ell] - log_factorial[alpha - ell]
    starts = np.concatenate([[0], np.cumsum([a - 1 for a in orders])[:-1]]).astype(np.intp)
    return _frozen(starts, ell.astype(float), (alpha - ell).astype(float), log_binomial)


def _frozen(*arrays: np.ndarray) -> tuple[np.ndarray, ...]:
    for array in arrays:
        array.flags.writeable = False
    return arrays


@functools.lru_cache(maxsize=32)
def _sampling_part(orders: tuple[int, ...], q: float) -> tuple[np.ndarray, np.ndarray]:
    """What does not depend on z, computed once for a search over z: log(C(alpha, l) q^l
    (1-q)^(alpha-l)) for every (alpha, l) of ``_table``, and per order K(alpha) = (1-q)^-(alpha-1)
    - 1 - (alpha-1) q, in 60-digit decimals (the subtraction cancels up to log10(2/(alpha q)) digits)."""
    _, ell, rest, log_binomial = _table(orders)
    with decimal.localcontext() as context:
        context.prec = 60
        kept, rate = 1 - Decimal(q), Decimal(q)
        excess = [float(kept ** (1 - a) - 1 - (a - 1) * rate) for a in orders]
    sampling, excess_array = _frozen(log_binomial + ell * math.log(q) + rest * math.log1p(-q), np.asarray(excess))
    return sampling, excess_array


def _rdp_curve(orders: tuple[int, ...], q: float, z: float) -> np.ndarray:
    """``rdp_epsilon`` at each of ``orders``, vectorised: min(unsampled, Zhu-Wang, max(with || without,
    without || with)) (module docstring, "Computation")."""
    alphas = np.asarray(orders, dtype=float)
    unsampled = alphas / (2 * z * z)
    if q >= 1:
        return unsampled * (1 + _MARGIN)
    starts, ell, _, _ = _table(orders)
    sampling, excess = _sampling_part(orders, q)
    loss = ell * (ell - 1) / (2 * z * z)  # (l - 1) eps(l)
    with np.errstate(over="ignore", divide="ignore", invalid="ignore"):
        tight = loss + np.log(-np.expm1(-loss))  # log(e^loss - 1), finite for large loss
        wide = loss + np.log(3 - np.exp(-loss))  # log(3 e^loss - 1)
        wide[starts] = tight[starts]  # l = 2 has weight 1 in Zhu-Wang too
        with_unit = _no_nan(_log1p_sum(sampling + tight, starts) / (alphas - 1))
        zhu_wang = _no_nan(_log1p_sum(sampling + wide, starts) / (alphas - 1))
        without_unit = _no_nan(np.log1p(excess * np.expm1(1 / (z * z))) / (alphas - 1))
    sampled = np.minimum(zhu_wang, np.maximum(with_unit, without_unit))
    return np.minimum(sampled, unsampled) * (1 + _MARGIN)


def _no_nan(values: np.ndarray) -> np.ndarray:
    """``values`` with NaN (an overflow met as inf - inf) read as no bound at all: +inf."""
    return np.where(np.isnan(values), np.inf, values)


def _log1p_sum(log_terms: np.ndarray, starts: np.ndarray) -> np.ndarray:
    """log(1 + sum of exp(log_terms)) over each run of ``starts``: log-sum-exp, then log1p."""
    peak = np.maximum.reduceat(log_terms, starts)
    runs = np.repeat(peak, np.diff(np.append(starts, len(log_terms))))
    log_x = peak + np.log(np.add.reduceat(np.exp(log_terms - runs), starts))
    return np.logaddexp(0.0, log_x)


# --- inputs ---------------------------------------------------------------------------------


def _exact(value, name: str) -> Fraction:
    """``value`` as a Fraction: exact numbers as they are, finite floats by their decimal text."""
    if isinstance(value, bool):
        raise InvalidParameter(f"{name} must be a number, got {value!r}")
    if isinstance(value, Rational):
        return Fraction(value)
    if isinstance(value, Decimal) and value.is_finite():
        return Fraction(value)
    if isinstance(value, Real) and math.isfinite(float(value)):
        return Fraction(str(float(value)))
    raise InvalidParameter(f"{name} must be a finite number, got {value!r}")


def _positive(value, name: str) -> float:
    exact = _exact(value, name)
    if exact <= 0:
        raise InvalidParameter(f"the {name} must be > 0, got {value}", hint=f"give a {name} > 0")
    return _float_down(exact)


def _float_down(value: Fraction) -> float:
    """The largest float at most ``value`` (> 0): a noise multiplier never grows on its way to
    floats, so its cost never shrinks."""
    result = float(value)
    return math.nextafter(result, 0.0) if Fraction(result) > value else result


def _float_up(value: Fraction) -> float:
    """The smallest float at least ``value`` (> 0): a sampling rate never shrinks (nor reaches 0)."""
    result = float(value)
    return math.nextafter(result, 2.0) if Fraction(result) < value else result


def _rate(q) -> float:
    exact = _exact(q, "sampling rate q")
    if not 0 < exact <= 1:
        raise InvalidParameter(f"the sampling rate q must be in (0, 1], got {q}",
                               hint="give the probability with which each unit is kept in a step; 1 is the full batch")
    return _float_up(exact)


def _steps(steps) -> int:
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
        raise InvalidParameter(f"the number of steps must be a whole number >= 1, got {steps!r}")
    return steps


def _delta(delta) -> Fraction:
    exact = _exact(delta, "delta")
    if not 0 < exact < 1:
        raise InvalidParameter(f"delta must be in (0, 1), got {delta}",
                               hint="give a delta far below 1 / the number of units, such as 1e-6")
    return exact


def _text(value: Fraction) -> str:
    return f"{float(value):.6g}"
