"""Exact discrete noise: the only module of dpsql that draws randomness.

Samples the discrete Laplace distribution, P(z) ∝ exp(-|z|/scale), and the discrete
Gaussian, P(z) ∝ exp(-z²/(2·sigma_sq)), over the integers, with rational parameters and
integer arithmetic only (Canonne, Kamath, Steinke 2020, "The Discrete Gaussian for
Differential Privacy", Algorithms 1-3). Every random bit comes from a source's
``integers(upper, size)``: ``SecureSource`` (``os.urandom``) in production, ``SeededSource``
in tests.

Why no float Laplace: ``-b*log(u)`` in floating point is not differentially private. The set
of doubles it can output around f(D) depends on f(D), so the low bits of a release reveal the
exact answer (Mironov 2012, "On Significance of the Least Significant Bits for Differential
Privacy"). Here no float decides a sample; floats only size batches and compute accuracy
half-widths and variances.

The samplers are vectorised: draw candidates for a whole batch, accept or reject with
masks, redraw only what is missing. All noise of one call is drawn in one batch of at least
``_MIN_CANDIDATES`` candidates, so a call's running time, set by the slowest of many
candidates, says little about the few draws it returns (it is not constant-time). Scales whose
numerator or denominator is too large for int64 arithmetic are rounded *up* (more noise is
always safe) by ``round_up_fraction``.

>>> src = SeededSource(7)
>>> z = discrete_laplace(Fraction(5, 2), 4, src)
>>> z.dtype, z.shape
(dtype('int64'), (4,))
"""

from __future__ import annotations

import math
import numbers
import os
from fractions import Fraction

import numpy as np

from dpsql.errors import InternalError

__all__ = [
    "SecureSource", "SeededSource", "discrete_laplace", "discrete_gaussian",
    "discrete_laplace_halfwidth", "discrete_gaussian_halfwidth", "discrete_laplace_variance",
    "discrete_gaussian_variance", "round_up_fraction", "discrete_laplace_sampled_scale",
    "discrete_gaussian_sampled_sigma_sq",
    "exponential_mechanism", "k_ary_response", "bernoulli_exp", "uniforms",
]

MAX_UPPER = 2**62            # largest bound a source's integers() accepts
_LAPLACE_MAX_NUM = 2**40     # numerator of a Laplace scale: the uniform U and the Bernoulli bounds
_GAUSS_MAX_DEN = 2**56       # denominator of the Gaussian acceptance exponent (x64 still fits 2**62)
_ENUMERATE_SIGMA = 4096.0    # above this sigma, pmf sums use Euler-Maclaurin instead of enumeration
_MIN_CANDIDATES = 256       # smallest batch of candidates, even for one draw (timing, above)
_EXPONENT_CAP = 1000         # Gumbel uniforms stop refining below 2**-1002 (probability 2**-1000)


# ---------------------------------------------------------------- sources of randomness

def _check_draw(upper: int, size: int) -> tuple[int, int]:
    if not isinstance(upper, numbers.Integral) or not 1 <= upper <= MAX_UPPER:
        raise InternalError(f"integers() needs an integer upper in [1, 2**62], got {upper!r}")
    if not isinstance(size, numbers.Integral) or size < 0:
        raise InternalError(f"integers() needs a size >= 0, got {size!r}")
    return int(upper), int(size)


class SecureSource:
    """Cryptographically secure uniform integers from ``os.urandom``.

    >>> v = SecureSource().integers(10, 1000)
    >>> v.dtype, bool(((0 <= v) & (v < 10)).all())
    (dtype('int64'), True)
    """

    def integers(self, upper: int, size: int) -> np.ndarray:
        """``size`` uniform int64 in [0, upper), by rejection from masked words (no modulo bias)."""
        upper, size = _check_draw(upper, size)
        if upper == 1 or size == 0:
            return np.zeros(size, dtype=np.int64)
        bits = (upper - 1).bit_length()
        dtype = np.dtype(f"u{next(b for b in (1, 2, 4, 8) if 8 * b >= bits)}")
        mask = dtype.type((1 << bits) - 1)
        out = np.empty(size, dtype=np.int64)
        filled = 0
        while filled < size:
            need = size - filled
            # Each word is accepted with probability upper / 2**bits > 1/2; draw a few extra.
            count = int(need * (1 << bits) / upper * 1.02) + 16
            words = np.frombuffer(os.urandom(count * dtype.itemsize), dtype=dtype) & mask
            good = words[words < upper][:need]
            out[filled:filled + good.size] = good
            filled += good.size
        return out


class SeededSource:
    """Reproducible uniform integers for tests: numpy's PCG64 with a fixed seed.

    >>> SeededSource(1).integers(10, 5).tolist() == SeededSource(1).integers(10, 5).tolist()
    True
    """

    def __init__(self, seed: int):
        self._rng = np.random.Generator(np.random.PCG64(seed))

    def integers(self, upper: int, size: int) -> np.ndarray:
        """``size`` uniform int64 in [0, upper) (numpy's unbiased bounded integers)."""
        upper, size = _check_draw(upper, size)
        return self._rng.integers(0, upper, size=size, dtype=np.int64)


def secret_key(source=None) -> str:
    """A fresh 256-bit secret as 64 lower-case hex digits, from ``source`` (the secure source by
    default): a sampled query's key (``dpsql.sql.pieces.InSample``).

    >>> key = secret_key()
    >>> len(key), key == secret_key(), set(key) <= set("0123456789abcdef")
    (64, False, True)
    """
    words = (source or SecureSource()).integers(1 << 32, 8)
    return "".join(format(int(word), "08x") for word in words)


# ---------------------------------------------------------------- exact Bernoulli trials

def _bernoulli_ratio(num: np.ndarray, den: int, k: int, source) -> np.ndarray:
    """Bernoulli(num[i] / (den*k)) for each i, exactly."""
    if den * k <= MAX_UPPER:
        return source.integers(den * k, num.size) < num
    # Bernoulli(a*b) is Bernoulli(a) AND an independent Bernoulli(b).
    return (source.integers(den, num.size) < num) & (source.integers(k, num.size) == 0)


def _bernoulli_exp_fraction(num: np.ndarray, den: int, source) -> np.ndarray:
    """Bernoulli(exp(-num[i]/den)) for 0 <= num[i] <= den (CKS20 Algorithm 1, gamma <= 1).

    Count K = the first k whose Bernoulli(gamma/k) fails; P(K > k) = gamma**k / k!, so
    P(K odd) = exp(-gamma). All elements still running share k, so each round is one draw.
    """
    result = np.zeros(num.size, dtype=bool)
    index = np.arange(num.size)
    k = 1
    while index.size:
        go_on = _bernoulli_ratio(num, den, k, source)
        if k % 2:
            result[index[~go_on]] = True
        index, num = index[go_on], num[go_on]
        k += 1
    return result


def _bernoulli_exp_minus_one(size: int, source) -> np.ndarray:
    return _bernoulli_exp_fraction(np.ones(size, dtype=np.int64), 1, source)


def _bernoulli_exp_integer(f: np.ndarray, source) -> np.ndarray:
    """Bernoulli(exp(-f[i])) for integers f[i] >= 0: f[i] trials of Bernoulli(exp(-1)) all pass."""
    result = np.ones(f.size, dtype=bool)
    index = np.flatnonzero(f > 0)
    remaining = f[index]
    while index.size:
        passed = _bernoulli_exp_minus_one(index.size, source)
        result[index[~passed]] = False
        index, remaining = index[passed], remaining[passed] - 1
        index, remaining = index[remaining > 0], remaining[remaining > 0]
    return result


def _count_exp_minus_one_passes(size: int, source) -> np.ndarray:
    """Geometric V with P(V >= v) = exp(-v): passes of Bernoulli(exp(-1)) before a failure."""
    v = np.zeros(size, dtype=np.int64)
    index = np.arange(size)
    while index.size:
        index = index[_bernoulli_exp_minus_one(index.size, source)]
        v[index] += 1
    return v


# ---------------------------------------------------------------- parameters

def _check_parameter(x: Fraction | int, name: str) -> Fraction:
    if isinstance(x, bool) or not isinstance(x, numbers.Rational) or not x > 0:
        raise InternalError(f"{name} must be a positive Fraction or int, got {x!r}")
    return Fraction(x)


def _check_size(size: int) -> int:
    if isinstance(size, bool) or not isinstance(size, numbers.Integral) or size < 0:
        raise InternalError(f"size must be an integer >= 0, got {size!r}")
    return int(size)


def _check_alpha(alpha: float) -> float:
    # Callers validate the analyst's alpha (InvalidParameter); reaching here with a bad one is a bug.
    if not isinstance(alpha, numbers.Real) or not 0 < alpha < 1:
        raise InternalError(f"alpha must be in (0, 1), got {alpha!r}")
    return float(alpha)


def round_up_fraction(x: Fraction, max_den: int) -> Fraction:
    """The smallest fraction with denominator ``max_den`` that is >= x, or x if its denominator fits.

    A noise scale may be rounded up (more noise), never down.

    >>> round_up_fraction(Fraction(1, 3), 10)
    Fraction(1, 3)
    >>> round_up_fraction(Fraction(10**20 + 1, 3 * 10**19), 1000)
    Fraction(1667, 500)
    """
    x = Fraction(x)
    if max_den < 1:
        raise InternalError(f"max_den must be >= 1, got {max_den!r}")
    if x.denominator <= max_den:
        return x
    return Fraction(-((-x.numerator * max_den) // x.denominator), max_den)


def _laplace_parameters(scale: Fraction) -> tuple[int, int]:
    """(t, s) with t/s >= scale, t <= 2**40 and s <= 2**62."""
    if scale >= _LAPLACE_MAX_NUM:
        raise InternalError(f"discrete Laplace scale {float(scale):.3g} is too large (max 2**40)")
    scale = round_up_fraction(scale, min(MAX_UPPER, math.floor(_LAPLACE_MAX_NUM / scale)))
    return scale.numerator, scale.denominator


def _gaussian_parameters(sigma_sq: Fraction) -> tuple[int, int, int]:
    """(t, m, d): Laplace proposal scale t and sigma'² = t*m/d >= sigma_sq with 2*t*m*d <= 2**56."""
    t = math.isqrt(math.floor(sigma_sq)) + 1          # floor(sigma) + 1, exactly
    max_den = min((sigma_sq / t).denominator, _GAUSS_MAX_DEN)
    while max_den >= 1:
        ratio = round_up_fraction(sigma_sq / t, max_den)
        m, d = ratio.numerator, ratio.denominator
        if 2 * t * m * d <= _GAUSS_MAX_DEN:
            return t, m, d
        max_den //= 2
    raise InternalError(f"discrete Gaussian sigma_sq {float(sigma_sq):.3g} is too large (max ~2**54)")


# ---------------------------------------------------------------- samplers

def _laplace_candidates(t: int, s: int, count: int, source) -> np.ndarray:
    """One round of CKS20 Algorithm 2 on ``count`` candidates; returns the accepted samples."""
    u = source.integers(t, count)
    u = u[_bernoulli_exp_fraction(u, t, source)]           # U accepted w.p. exp(-U/t)
    v = _count_exp_minus_one_passes(u.size, source)
    if v.size and v.max() > (2**62 - t) // t:             # probability below exp(-2**22)
        raise InternalError("discrete Laplace geometric draw overflowed int64")
    y = (u + t * v) // s                                   # X = U + tV is geometric, exp(-1/t)
    negative = source.integers(2, y.size) == 1
    keep = ~(negative & (y == 0))                          # -0 would count zero twice
    return np.where(negative, -y, y)[keep]


def _fill(candidates, acceptance: float, size: int) -> np.ndarray:
    """Call ``candidates(count)`` until ``size`` accepted samples; keep the first ``size``.

    Accepted candidates are i.i.d. from the target, so taking them in draw order is exact.
    """
    parts, have = [], 0
    while have < size:
        part = candidates(max(int((size - have) / acceptance * 1.03) + 8, _MIN_CANDIDATES))
        parts.append(part)
        have += part.size
    return np.concatenate(parts)[:size] if parts else np.zeros(0, dtype=np.int64)


def _laplace_acceptance(t: int, s: int) -> float:
    """P(a candidate of Algorithm 2 is kept): P(U kept) · P(not a rejected -0); sizes batches."""
    return -math.expm1(-1.0) / (t * -math.expm1(-1.0 / t)) * (1.0 + math.exp(-s / t)) / 2.0


def discrete_laplace(scale: Fraction, size: int, source=None) -> np.ndarray:
    """``size`` i.i.d. draws with P(z) ∝ exp(-|z|/scale) over the integers (int64).

    ``scale`` is a positive Fraction or int below 2**40; one with large terms is rounded up
    (by a relative 2**-39 at most when scale >= 2**-20). ``source`` defaults to ``SecureSource()``.

    >>> discrete_laplace(Fraction(7, 2), 6, SeededSource(0)).tolist()
    [-2, 1, -4, 1, 0, 3]
    """
    t, s = _laplace_parameters(_check_parameter(scale, "scale"))
    size = _check_size(size)
    source = SecureSource() if source is None else source
    return _fill(lambda n: _laplace_candidates(t, s, n, source), _laplace_acceptance(t, s), size)


def discrete_laplace_sampled_scale(scale: Fraction) -> Fraction:
    """The scale ``discrete_laplace(scale, ...)`` really samples: ``scale`` itself, or the
    slightly larger fraction whose terms fit int64 (see ``round_up_fraction``).

    Callers whose guarantee grows with the scale's tail (partition selection's delta) compute
    it from this value, not from the one they asked for. Applying it twice changes nothing.

    >>> discrete_laplace_sampled_scale(Fraction(7, 2))
    Fraction(7, 2)
    >>> discrete_laplace_sampled_scale(Fraction(10**20 + 1, 10**19)) > Fraction(10**20 + 1, 10**19)
    True
    """
    t, s = _laplace_parameters(_check_parameter(scale, "scale"))
    return Fraction(t, s)


def discrete_gaussian_sampled_sigma_sq(sigma_sq: Fraction) -> Fraction:
    """The variance parameter ``discrete_gaussian(sigma_sq, ...)`` really samples: ``sigma_sq`` or
    slightly more (its terms rounded up to fit int64), for accuracy computed from the true law.

    >>> discrete_gaussian_sampled_sigma_sq(Fraction(9, 2)) >= Fraction(9, 2)
    True
    """
    t, m, d = _gaussian_parameters(_check_parameter(sigma_sq, "sigma_sq"))
    return Fraction(t * m, d)


def _square_divmod(a: np.ndarray, den: int) -> tuple[np.ndarray, np.ndarray]:
    """(a² // den, a² % den) exactly; the quotient capped at 2**62 (then exp(-quotient) is 0
    to within exp(-2**62)). Large |a| go through Python integers."""
    quotient = np.empty(a.size, dtype=np.int64)
    remainder = np.empty(a.size, dtype=np.int64)
    small = np.abs(a) < 2**31
    sq = a[small] * a[small]
    quotient[small], remainder[small] = sq // den, sq % den
    for i in np.flatnonzero(~small):
        q, r = divmod(int(a[i]) ** 2, den)
        quotient[i], remainder[i] = min(q, 2**62), r
    return quotient, remainder


def _acceptance_exponent(y: np.ndarray, m: int, d: int, den: int) -> tuple[np.ndarray, np.ndarray]:
    """(f, r) with (|y|·d - m)² / den = f + r/den exactly (f capped at 2**62, see _square_divmod)."""
    big = np.abs(y) > 2**62 // d                          # |y|·d would overflow int64
    f, r = _square_divmod(np.abs(np.where(big, 0, y)) * d - m, den)
    for i in np.flatnonzero(big):                          # far tail: exact, in Python ints
        q, rem = divmod((abs(int(y[i])) * d - m) ** 2, den)
        f[i], r[i] = min(q, 2**62), rem
    return f, r


def _gaussian_candidates(t: int, m: int, d: int, count: int, source) -> np.ndarray:
    """One round of CKS20 Algorithm 3: Laplace(t) proposals kept w.p.
    exp(-(|y| - sigma²/t)² / (2 sigma²)) = exp(-(|y|·d - m)² / (2·t·m·d))."""
    y = _fill(lambda n: _laplace_candidates(t, 1, n, source), _laplace_acceptance(t, 1), count)
    den = 2 * t * m * d
    f, r = _acceptance_exponent(y, m, d, den)
    keep = _bernoulli_exp_integer(f, source)
    index = np.flatnonzero(keep)
    keep[index] = _bernoulli_exp_fraction(r[index], den, source)
    return y[keep]


def discrete_gaussian(sigma_sq: Fraction, size: int, source=None) -> np.ndarray:
    """``size`` i.i.d. draws with P(z) ∝ exp(-z²/(2·sigma_sq)) over the integers (int64).

    ``sigma_sq`` is a positive Fraction or int up to about 2**54; one with large terms is
    rounded up (by a relative 2**-25 at most when sigma_sq >= 1, by less than sigma·2**-27
    below). ``source`` defaults to ``SecureSource()``.

    >>> discrete_gaussian(Fraction(10), 6, SeededSource(0)).tolist()
    [2, -1, -3, -2, -3, 2]
    """
    t, m, d = _gaussian_parameters(_check_parameter(sigma_sq, "sigma_sq"))
    size = _check_size(size)
    source = SecureSource() if source is None else source
    sigma = math.sqrt(t * m / d)
    z_laplace = (1 + math.exp(-1 / t)) / -math.expm1(-1 / t)
    z_gauss = max(math.sqrt(2 * math.pi) * sigma, 1.0)
    acceptance = min(1.0, z_gauss * math.exp(-sigma * sigma / (2 * t * t)) / z_laplace)
    return _fill(lambda n: _gaussian_candidates(t, m, d, n, source), acceptance, size)


# ---------------------------------------------------------------- randomized response

def bernoulli_exp(gamma: Fraction | int, size: int, source=None) -> np.ndarray:
    """``size`` exact Bernoulli(exp(-gamma)) trials for a rational ``gamma`` >= 0: the trials
    for its whole part and for its fractional part all pass (CKS20 Algorithm 1).

    >>> bool(bernoulli_exp(0, 3, SeededSource(0)).all())
    True
    """
    if isinstance(gamma, bool) or not isinstance(gamma, numbers.Rational) or gamma < 0:
        raise InternalError(f"gamma must be a Fraction or int >= 0, got {gamma!r}")
    gamma, size = Fraction(gamma), _check_size(size)
    if gamma.denominator > MAX_UPPER:
        raise InternalError(f"gamma {gamma} has a denominator above 2**62")
    source = SecureSource() if source is None else source
    whole = gamma.numerator // gamma.denominator
    passed = _bernoulli_exp_integer(np.full(size, whole, dtype=np.int64), source)
    part = gamma - whole
    if part:
        passed &= _bernoulli_exp_fraction(np.full(size, part.numerator, dtype=np.int64), part.denominator, source)
    return passed


def k_ary_response(true: np.ndarray, epsilon: Fraction | int, k: int, source=None) -> np.ndarray:
    """k-ary randomized response of category indices ``true`` (each in [0, k), k >= 2): each
    is kept with probability e^epsilon / (e^epsilon + k - 1), else replaced by one of the
    other k - 1 indices uniformly; exactly, from the source's integers.

    A Bernoulli race: each round proposes "keep" with probability 1/k, always accepted, and
    otherwise "change", accepted with probability exp(-epsilon) (``bernoulli_exp``); a
    rejected round starts again. So P(keep) : P(change) = 1/k : ((k-1)/k)·exp(-epsilon), that
    is P(keep) = 1 / (1 + (k-1)·exp(-epsilon)) = e^epsilon / (e^epsilon + k - 1), with no
    float anywhere. A round ends with probability at least 1/k.

    >>> k_ary_response(np.array([0, 1, 2, 0]), Fraction(50), 3, SeededSource(1)).tolist()
    [0, 1, 2, 0]
    """
    epsilon = _check_parameter(epsilon, "epsilon")
    if isinstance(k, bool) or not isinstance(k, numbers.Integral) or not 2 <= k <= MAX_UPPER:
        raise InternalError(f"k must be an integer >= 2, got {k!r}")
    true = np.asarray(true, dtype=np.int64)
    if true.ndim != 1 or (true.size and (true.min() < 0 or true.max() >= k)):
        raise InternalError("true categories must be a vector of indices in [0, k)")
    source = SecureSource() if source is None else source
    out = true.copy()
    pending = np.arange(true.size)
    while pending.size:
        keep = source.integers(int(k), pending.size) == 0
        change = np.zeros(pending.size, dtype=bool)
        proposed = np.flatnonzero(~keep)
        change[proposed] = bernoulli_exp(epsilon, proposed.size, source)
        changed = pending[change]
        other = source.integers(int(k) - 1, changed.size)   # one of the k - 1 other indices
        out[changed] = np.where(other >= true[changed], other + 1, other)
        pending = pending[~(keep | change)]
    return out


# ---------------------------------------------------------------- exponential mechanism

def exponential_mechanism(log_weights: np.ndarray, source=None) -> int:
    """An index j drawn with probability exp(x_j) / sum_i exp(x_i), x = ``log_weights``.

    The exponential mechanism (McSherry & Talwar 2007) passes x_j = epsilon·u_j / (2·Delta_u).
    Sampling is the Gumbel-max trick: add an independent standard Gumbel G_j = -ln(E_j),
    E_j ~ Exp(1), to each x_j and return the argmax, which for exact Gumbels has exactly that
    law. It draws a fixed amount of randomness per candidate whatever the weights (a second
    word only with probability 2**-53), so its running time says nothing about them. A weight
    of -inf is a candidate never chosen; NaN, +inf, an empty or an all -inf vector raise
    ``InternalError``.

    Why floats are acceptable here, when a float Laplace is not: the output is an index into a
    public candidate set, not a number, so there are no low bits to leak (Mironov 2012 needs
    the noisy value itself). Floats can only scale each output's probability, and by little:

    * Each E_j has full relative precision, built from the source's 53-bit integers: a fair
      bit picks U = V or U = 1 - V, with V uniform on (0, 1/2) as 2**(-2-e)·(1 + f), e the
      count of leading zero bits of 53-bit words (geometric, capped at 1000) and f the midpoint
      of one of 2**51 cells; E = -ln V or -log1p(-V). A plain 53-bit uniform would resolve
      the Gumbel's right tail in steps of 2**-53 in U: an output of probability ~e**-25 would
      be off by a relative 1e-5, and one of probability below 2**-53 could become impossible.
    * Coupled with an exact uniform in the same cell, and with log and log1p accurate to 4 ulps,
      |G_j| <= 695 and every computed score x_j - max(x) + G_j is within beta = 2**-40 of
      the exact one, for every candidate that can win (within ~700 of the largest weight;
      the others can win neither here nor, on the coupling, exactly).
    * Shifting each score by at most beta changes each output's probability by a factor in
      [e**(-2·beta), e**(2·beta)]. So when the exact mechanism is epsilon-DP, this sampler is
      (epsilon + 4·beta, delta_f)-DP with 4·beta = 2**-38 (about 3.6e-12) and
      delta_f <= e**epsilon · m · 2**-999 for m candidates (the cap on e being reached).
    * Rounding the log weights is the caller's share: if each x_j is the intended value with
      a relative error at most r, it is s_j·u_j for a scale s_j within a factor 1 ± r of the
      intended one, and epsilon becomes at most epsilon·(1 + 2r). ``dpsql.mechanisms.quantile`` rounds
      each weight once, correctly (r = 2**-53).

    >>> exponential_mechanism(np.array([0.0, -1.0, -2.0]), SeededSource(0))
    2
    >>> exponential_mechanism(np.array([-np.inf, 3.0]), SeededSource(0))
    1
    """
    return int(_exponential_mechanism_draws(log_weights, 1, source)[0])


def _check_log_weights(log_weights) -> np.ndarray:
    try:
        x = np.asarray(log_weights, dtype=np.float64)
    except (TypeError, ValueError) as exc:
        raise InternalError(f"log weights must be a vector of floats, got {log_weights!r}") from exc
    if x.ndim != 1 or x.size == 0:
        raise InternalError(f"log weights must be a non-empty vector, got shape {x.shape}")
    if np.isnan(x).any() or np.isposinf(x).any() or np.isneginf(x).all():
        raise InternalError("log weights must be finite or -inf, with at least one finite")
    return x


def _exponential_mechanism_draws(log_weights, size: int, source) -> np.ndarray:
    """``size`` independent draws of ``exponential_mechanism`` (one batch; for tests)."""
    x = _check_log_weights(log_weights)
    size = _check_size(size)
    source = SecureSource() if source is None else source
    shifted = x - x.max()                       # exact at the maximum; -inf stays -inf
    e = _exponential_variates(size * x.size, source).reshape(size, x.size)
    return np.argmax(shifted - np.log(e), axis=1)


def _exponential_variates(size: int, source) -> np.ndarray:
    """``size`` Exp(1) variates -ln(U) with U of full relative precision near 0 and near 1."""
    word = source.integers(2**53, size)
    near_one = (word & 1) == 1                  # U = 1 - V rather than U = V
    cell = (word >> 2).astype(np.float64)       # 51 bits: (2**52 + 2·cell + 1) < 2**53 is exact
    v = np.ldexp(2.0**52 + 2.0 * cell + 1.0, (-54 - _geometric_exponents(size, source)).astype(np.int32))
    return np.where(near_one, -np.log1p(-v), -np.log(v))


def _geometric_exponents(size: int, source) -> np.ndarray:
    """P(e = i) = 2**-(i+1): leading zero bits of 53-bit words, capped at _EXPONENT_CAP."""
    e = 53 - _bit_length(source.integers(2**53, size))
    index = np.flatnonzero(e == 53)             # an all-zero word: count on in a fresh one
    while index.size:
        more = 53 - _bit_length(source.integers(2**53, index.size))
        e[index] += more
        index = index[(more == 53) & (e[index] < _EXPONENT_CAP)]
    return np.minimum(e, _EXPONENT_CAP)


def _bit_length(words: np.ndarray) -> np.ndarray:
    """Bit lengths of int64 words in [0, 2**53), read off their exact double's exponent field."""
    exponent = (words.astype(np.float64).view(np.int64) >> 52) - 1022
    return np.where(words == 0, 0, exponent)


def uniforms(size: int, source=None) -> np.ndarray:
    """``size`` floats uniform on the grid {0, 2**-53, ..., 1 - 2**-53}: for post-processing only
    (sampling synthetic rows from a released model), never to noise a private value.

    >>> u = uniforms(1000, SeededSource(3))
    >>> bool(((0 <= u) & (u < 1)).all())
    True
    """
    size = _check_size(size)
    source = SecureSource() if source is None else source
    return np.ldexp(source.integers(2**53, size).astype(np.float64), -53)


# ---------------------------------------------------------------- accuracy

def discrete_laplace_variance(scale: Fraction) -> float:
    """Variance 2p/(1-p)² of the discrete Laplace, p = exp(-1/scale).

    >>> round(discrete_laplace_variance(Fraction(10)), 3)
    199.833
    """
    scale = _check_parameter(scale, "scale")
    q = -math.expm1(-1 / scale)
    return 2 * (1 - q) / (q * q)


def discrete_laplace_halfwidth(scale: Fraction, alpha: float) -> int:
    """Smallest m >= 0 with P(|Z| > m) <= alpha, from P(|Z| >= m+1) = 2p^(m+1)/(1+p).

    >>> discrete_laplace_halfwidth(Fraction(10), 0.05)
    30
    """
    scale, alpha = _check_parameter(scale, "scale"), _check_alpha(alpha)
    log_p = -1 / float(scale)
    log_c = math.log(2) - math.log1p(math.exp(log_p))       # tail(m) = exp(log_c + (m+1) log p)

    def tail_above(m: int) -> bool:
        return log_c + (m + 1) * log_p > math.log(alpha)

    m = max(0, math.ceil((math.log(alpha) - log_c) / log_p) - 1)
    while m > 0 and not tail_above(m - 1):
        m -= 1
    while tail_above(m):
        m += 1
    return m


def _gaussian_weights(sigma_sq: Fraction) -> np.ndarray:
    """exp(-z²/(2 sigma_sq)) for z = 0 .. R, R far enough out that the rest underflows."""
    reach = math.ceil(math.sqrt(2 * 745 * float(sigma_sq))) + 2
    z = np.arange(reach + 1, dtype=np.float64)
    return np.exp(-z * z / (2 * float(sigma_sq)))


def discrete_gaussian_variance(sigma_sq: Fraction) -> float:
    """Variance of the discrete Gaussian: sum of z² pmf(z) (slightly below sigma_sq).

    >>> round(discrete_gaussian_variance(Fraction(1, 2)), 4)
    0.499
    """
    sigma_sq = _check_parameter(sigma_sq, "sigma_sq")
    if math.sqrt(sigma_sq) > _ENUMERATE_SIGMA:
        return float(sigma_sq)    # the gap, of order σ⁴·exp(-2π²σ²) (Poisson summation), is 0 in floats
    w = _gaussian_weights(sigma_sq)
    z = np.arange(w.size, dtype=np.float64)
    return float(2 * np.sum(z * z * w) / (w[0] + 2 * np.sum(w[1:])))


def discrete_gaussian_halfwidth(sigma_sq: Fraction, alpha: float) -> int:
    """Smallest m >= 0 with P(|Z| > m) <= alpha, from the normalised pmf.

    >>> discrete_gaussian_halfwidth(Fraction(100), 0.05)
    20
    """
    sigma_sq, alpha = _check_parameter(sigma_sq, "sigma_sq"), _check_alpha(alpha)
    sigma = math.sqrt(sigma_sq)
    if sigma <= _ENUMERATE_SIGMA:
        w = _gaussian_weights(sigma_sq)
        above = np.cumsum(w[::-1])[::-1]               # above[m] = sum of w[z] for z >= m
        tails = np.append(2 * above[1:], 0.0) / (w[0] + 2 * above[1])   # tails[m] = P(|Z| > m)
        return int(np.argmax(tails <= alpha))

    def tail(m: int) -> float:
        # Euler-Maclaurin for sum_{z>m} exp(-z²/2σ²), two correction terms (error ~ σ^-3 · pmf);
        # the normaliser is sqrt(2π)·σ to within exp(-2π²σ²) by Poisson summation.
        a = m + 1
        f = math.exp(-a * a / (2 * sigma * sigma))
        em = f / 2 + a * f / (12 * sigma * sigma)
        return math.erfc(a / (sigma * math.sqrt(2))) + 2 * em / (math.sqrt(2 * math.pi) * sigma)

    lo, hi = 0, math.ceil(40 * sigma)
    while lo < hi:
        mid = (lo + hi) // 2
        if tail(mid) <= alpha:
            hi = mid
        else:
            lo = mid + 1
    return lo
