"""Statistical and contract tests of dpsql.mechanisms.noise.

Soundness: a correct sampler fails this whole file with probability below 1e-6, whatever
the seeds (they are fixed only for reproducibility); a scale off by a factor of 2 fails it
every time -- the ``*_factor_two`` tests run that mistake and assert the checks catch it.
The false-failure budget, by union bound:

- Goodness of fit (12 tests, counting the sources' uniformity): Pearson chi-square against
  the exact pmf, tails pooled so every bin expects >= 50 draws, failing at p < 1e-8
  (stricter than 1e-7, so that all of them stay below 1e-6 even if the asymptotic p-value
  were a few times optimistic; by simulation, with these bins P(p < 1e-6) is within 1.5x
  of 1e-6).
- Exact binomial tests (symmetry, coverage, sources, Bernoulli trials; about 50 tests):
  fail at p < 1e-9.
- Second moments (10 tests): Bernstein's inequality on truncated draws, failure
  probability 1e-9 + 1e-9 each, not an asymptotic approximation.
"""

from __future__ import annotations

import math
import os
import random
from decimal import Decimal
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats

from dpsql.errors import InternalError
from dpsql.mechanisms import noise
from dpsql.mechanisms.noise import (
    SecureSource,
    SeededSource,
    discrete_gaussian,
    discrete_gaussian_halfwidth,
    discrete_gaussian_variance,
    discrete_laplace,
    discrete_laplace_halfwidth,
    discrete_laplace_variance,
    round_up_fraction,
)

N = 200_000
P_FIT = 1e-8           # chi-square goodness of fit fails below this p-value
P_EXACT = 1e-9         # exact binomial tests fail below this p-value
MIN_EXPECTED = 50      # each chi-square bin expects at least this many draws (>= 20 asked)

LAPLACE_SCALES = [Fraction(1, 3), Fraction(1), Fraction(7, 2), Fraction(40),
                  Fraction(10**20 + 1, 10**19)]           # the last one is rounded up internally
GAUSSIAN_SIGMA_SQ = [Fraction(1, 2), Fraction(1), Fraction(10), Fraction(400),
                     Fraction(10**18 + 7, 10**16)]


# ---------------------------------------------------------------- exact reference pmfs
# Written independently of dpsql.mechanisms.noise: weights summed over a range wide enough that the
# mass left out is below 1e-21 (far below every probability the tests rely on).

def laplace_pmf(scale: Fraction) -> tuple[np.ndarray, np.ndarray]:
    """(z, P(Z = z)) for z in [-R, R]."""
    b = float(scale)
    reach = math.ceil(50 * b) + 2                           # mass left out < 1e-21
    z = np.arange(-reach, reach + 1)
    w = np.exp(-np.abs(z) / b)
    return z, w / math.fsum(w)


def gaussian_pmf(sigma_sq: Fraction) -> tuple[np.ndarray, np.ndarray]:
    s2 = float(sigma_sq)
    reach = math.ceil(math.sqrt(100 * s2)) + 2               # mass left out < 1e-21
    z = np.arange(-reach, reach + 1)
    w = np.exp(-(z.astype(float) ** 2) / (2 * s2))
    return z, w / math.fsum(w)


def pmf_of(kind: str, param: Fraction):
    return laplace_pmf(param) if kind == "laplace" else gaussian_pmf(param)


def draw(kind: str, param: Fraction, size: int, seed: int) -> np.ndarray:
    sampler = discrete_laplace if kind == "laplace" else discrete_gaussian
    return sampler(param, size, SeededSource(seed))


CASES = [("laplace", b) for b in LAPLACE_SCALES] + [("gaussian", s) for s in GAUSSIAN_SIGMA_SQ]
CASE_IDS = [f"{kind}-{float(p):g}" for kind, p in CASES]


# ---------------------------------------------------------------- statistics helpers

def chi_square_pvalue(values: np.ndarray, z: np.ndarray, pmf: np.ndarray) -> float:
    """Pearson chi-square p-value of integer draws against a pmf on consecutive z,
    pooling each tail into one bin so that every bin expects >= MIN_EXPECTED draws."""
    expected = values.size * pmf
    core = np.flatnonzero(expected >= MIN_EXPECTED)
    lo, hi = core[0], core[-1]
    while expected[:lo].sum() < MIN_EXPECTED and lo < hi:
        lo += 1
    while expected[hi + 1:].sum() < MIN_EXPECTED and hi > lo:
        hi -= 1
    bins_expected = np.concatenate([[expected[:lo].sum()], expected[lo:hi + 1],
                                    [expected[hi + 1:].sum()]])
    clipped = np.clip(values, z[lo] - 1, z[hi] + 1) - (z[lo] - 1)
    observed = np.bincount(clipped, minlength=bins_expected.size)
    assert observed.size == bins_expected.size and observed.sum() == values.size
    keep = bins_expected > 0
    stat = float(np.sum((observed[keep] - bins_expected[keep]) ** 2 / bins_expected[keep]))
    return float(stats.chi2.sf(stat, keep.sum() - 1))


def second_moment_tolerance(z: np.ndarray, pmf: np.ndarray, n: int, delta: float = 1e-9):
    """(variance, tolerance): mean(z²) of n draws lies within variance ± tolerance except
    with probability < delta + 1e-9.

    Truncate at T with n·P(|Z| > T) <= 1e-9; on the complement, W = z² <= T² is bounded and
    Bernstein gives P(|mean W - E W| >= eps) <= 2 exp(-n eps² / (2 (Var W + T² eps / 3))).
    Var W uses the 4th moment; E z² - E W (the truncated mass) is added to the tolerance.
    """
    variance = math.fsum(z.astype(float) ** 2 * pmf)
    truncation = int(np.argmax(tails_by_halfwidth(z, pmf) * n <= 1e-9))
    w = np.minimum(z.astype(float) ** 2, truncation**2)
    mean_w = math.fsum(w * pmf)
    var_w = math.fsum(w * w * pmf) - mean_w**2
    log_term = math.log(2 / delta)
    a = 2 * log_term * truncation**2 / 3
    eps = (a + math.sqrt(a * a + 8 * n * log_term * var_w)) / (2 * n)
    return variance, eps + (variance - mean_w)


def tails_by_halfwidth(z: np.ndarray, pmf: np.ndarray) -> np.ndarray:
    """tails[m] = P(|Z| > m) for m = 0 .. max z, summing the pmf from the outside in."""
    centre = z.size // 2                                   # z[centre] == 0, pmf symmetric
    assert z[centre] == 0
    outside_in = np.cumsum(pmf[::-1])[::-1]                # outside_in[i] = P(Z >= z[i])
    return np.append(2 * outside_in[centre + 1:], 0.0)


def tail_probability(z: np.ndarray, pmf: np.ndarray, m: int) -> float:
    return math.fsum(pmf[np.abs(z) > m])


def brute_force_halfwidth(z: np.ndarray, pmf: np.ndarray, alpha: float) -> int:
    return int(np.argmax(tails_by_halfwidth(z, pmf) <= alpha))


# ---------------------------------------------------------------- goodness of fit

@pytest.mark.parametrize(("kind", "param"), CASES, ids=CASE_IDS)
def test_draws_fit_the_exact_pmf(kind, param):
    values = draw(kind, param, N, seed=11)
    assert chi_square_pvalue(values, *pmf_of(kind, param)) >= P_FIT


@pytest.mark.parametrize("factor", [Fraction(2), Fraction(1, 2)])
@pytest.mark.parametrize(("kind", "param"), CASES[:4] + CASES[5:9], ids=CASE_IDS[:4] + CASE_IDS[5:9])
def test_chi_square_catches_a_factor_two_in_scale(kind, param, factor):
    wrong = param * factor if kind == "laplace" else param * factor**2   # sigma off by 2
    values = draw(kind, wrong, N, seed=12)
    assert chi_square_pvalue(values, *pmf_of(kind, param)) < P_FIT


@pytest.mark.parametrize(("kind", "param"), CASES, ids=CASE_IDS)
def test_second_moment_matches_the_exact_variance(kind, param):
    z, pmf = pmf_of(kind, param)
    variance, tolerance = second_moment_tolerance(z, pmf, N)
    values = draw(kind, param, N, seed=13).astype(float)
    assert abs(np.mean(values**2) - variance) <= tolerance
    exact = discrete_laplace_variance(param) if kind == "laplace" else discrete_gaussian_variance(param)
    assert exact == pytest.approx(variance, rel=1e-9)


@pytest.mark.parametrize("factor", [Fraction(2), Fraction(1, 2)])
@pytest.mark.parametrize(("kind", "param"), CASES, ids=CASE_IDS)
def test_second_moment_catches_a_factor_two_in_scale(kind, param, factor):
    wrong = param * factor if kind == "laplace" else param * factor**2
    variance, tolerance = second_moment_tolerance(*pmf_of(kind, param), N)
    values = draw(kind, wrong, N, seed=14).astype(float)
    assert abs(np.mean(values**2) - variance) > tolerance


@pytest.mark.parametrize(("kind", "param"), CASES, ids=CASE_IDS)
def test_draws_are_symmetric(kind, param):
    values = draw(kind, param, N, seed=15)
    positive, negative = int(np.sum(values > 0)), int(np.sum(values < 0))
    assert stats.binomtest(positive, positive + negative, 0.5).pvalue >= P_EXACT


# ---------------------------------------------------------------- contract

@pytest.mark.parametrize("sampler", [discrete_laplace, discrete_gaussian])
@pytest.mark.parametrize("source", [SeededSource(1), SecureSource()], ids=["seeded", "secure"])
def test_samplers_return_int64_arrays_of_the_requested_size(sampler, source):
    for size in (0, 1, 7, 1000):
        values = sampler(Fraction(5, 2), size, source)
        assert isinstance(values, np.ndarray) and values.dtype == np.int64 and values.shape == (size,)
    assert sampler(3, 10, source).dtype == np.int64          # an int parameter is accepted


@pytest.mark.parametrize("bad", [0, -1, Fraction(-1, 2), Fraction(0), 1.0, float("nan"),
                                 float("inf"), True, "1", Decimal(1), None])
@pytest.mark.parametrize("function", [
    lambda x: discrete_laplace(x, 3, SeededSource(0)),
    lambda x: discrete_gaussian(x, 3, SeededSource(0)),
    lambda x: discrete_laplace_halfwidth(x, 0.05),
    lambda x: discrete_gaussian_halfwidth(x, 0.05),
    discrete_laplace_variance,
    discrete_gaussian_variance,
], ids=["laplace", "gaussian", "laplace_hw", "gaussian_hw", "laplace_var", "gaussian_var"])
def test_invalid_parameters_raise_internal_error(function, bad):
    with pytest.raises(InternalError):
        function(bad)


def test_other_invalid_arguments_raise_internal_error():
    for call in (lambda: discrete_laplace(Fraction(1), -1, SeededSource(0)),
                 lambda: discrete_gaussian(Fraction(1), 2.0, SeededSource(0)),
                 lambda: discrete_laplace(Fraction(2**41), 3, SeededSource(0)),
                 lambda: discrete_gaussian(Fraction(2**60), 3, SeededSource(0)),
                 lambda: discrete_laplace_halfwidth(Fraction(1), 0),
                 lambda: discrete_gaussian_halfwidth(Fraction(1), 1.0),
                 lambda: discrete_gaussian_halfwidth(Fraction(1), float("nan")),
                 lambda: round_up_fraction(Fraction(1, 3), 0)):
        with pytest.raises(InternalError):
            call()


def test_extreme_but_valid_parameters():
    source = SeededSource(3)
    assert not discrete_laplace(Fraction(1, 10**30), 1000, source).any()
    assert not discrete_gaussian(Fraction(1, 10**30), 1000, source).any()
    big = discrete_gaussian(Fraction(10**14, 3), 20_000, source).astype(float)
    assert 0.8 < np.mean(big**2) / (10**14 / 3) < 1.25    # 20k draws: > 12 standard errors each way
    wide = discrete_laplace(Fraction(10**12), 20_000, source).astype(float)
    assert 0.8 < np.mean(wide**2) / discrete_laplace_variance(Fraction(10**12)) < 1.25


# ---------------------------------------------------------------- rounding parameters up

@settings(max_examples=300, deadline=None)
@given(st.fractions(min_value=Fraction(1, 10**40), max_value=Fraction(10**40)),
       st.integers(min_value=1, max_value=2**70))
def test_round_up_fraction_never_rounds_down(x, max_den):
    y = round_up_fraction(x, max_den)
    assert y >= x
    assert y.denominator <= max_den
    assert y - x < Fraction(1, max_den)
    if x.denominator <= max_den:
        assert y == x


@settings(max_examples=300, deadline=None)
@given(st.integers(min_value=1, max_value=10**30), st.integers(min_value=1, max_value=10**30))
def test_sampler_parameters_round_up_and_fit_int64(numerator, denominator):
    x = Fraction(numerator, denominator)
    if x < 2**39:
        t, s = noise._laplace_parameters(x)
        assert Fraction(t, s) >= x and t <= 2**40 and s <= 2**62
        assert Fraction(t, s) - x <= x * Fraction(1, 2**38) + Fraction(1, 2**62)
    if x < 2**50:
        t, m, d = noise._gaussian_parameters(x)
        assert Fraction(t * m, d) >= x and 2 * t * m * d <= 2**56
        assert t == math.isqrt(math.floor(x)) + 1
        assert Fraction(t * m, d) - x <= x * Fraction(1, 2**20) + Fraction(1, 2**20)


def test_acceptance_exponent_is_exact_for_huge_values():
    rng = random.Random(5)
    m, d, den = 12345, 2**27, 2**56 - 3
    y = np.array([0, 1, -7, 2**20, -(2**34), 2**40, 2**45 + 3, -(2**62)] +
                 [rng.randrange(-(2**62), 2**62) for _ in range(20)], dtype=np.int64)
    f, r = noise._acceptance_exponent(y, m, d, den)
    for yi, fi, ri in zip(y.tolist(), f.tolist(), r.tolist()):
        q, rem = divmod((abs(yi) * d - m) ** 2, den)
        assert (fi, ri) == (min(q, 2**62), rem)


@pytest.mark.parametrize(("num", "den"), [(0, 3), (1, 3), (3, 3), (7, 2**61 + 1),
                                        (2**61 - 5, 2**61 + 1), (2**61 + 1, 2**61 + 1)])
def test_bernoulli_exp_fraction_has_the_exact_probability(num, den):
    # den = 2**61 + 1 takes the split Bernoulli(a)·Bernoulli(b) path from k = 2 on.
    hits = noise._bernoulli_exp_fraction(np.full(N, num, dtype=np.int64), den, SeededSource(17))
    assert stats.binomtest(int(hits.sum()), N, math.exp(-num / den)).pvalue >= P_EXACT


def test_bernoulli_exp_integer_has_the_exact_probability():
    f = np.repeat(np.array([0, 1, 3], dtype=np.int64), N // 2)
    hits = noise._bernoulli_exp_integer(f, SeededSource(18)).reshape(3, -1).sum(axis=1)
    for count, exponent in zip(hits.tolist(), (0, 1, 3)):
        assert stats.binomtest(count, N // 2, math.exp(-exponent)).pvalue >= P_EXACT


# ---------------------------------------------------------------- half-widths and variances

ALPHAS = [0.5, 0.1, 0.05, 0.01, 1e-3, 1e-6]


@pytest.mark.parametrize("scale", LAPLACE_SCALES[:4] + [Fraction(1, 100), Fraction(1000)])
def test_laplace_halfwidth_matches_brute_force(scale):
    z, pmf = laplace_pmf(scale)
    for alpha in ALPHAS:
        assert discrete_laplace_halfwidth(scale, alpha) == brute_force_halfwidth(z, pmf, alpha)


@pytest.mark.parametrize("sigma_sq", GAUSSIAN_SIGMA_SQ[:4] + [Fraction(1, 100), Fraction(10**15 + 1, 4 * 10**7)])
def test_gaussian_halfwidth_matches_brute_force(sigma_sq):
    z, pmf = gaussian_pmf(sigma_sq)
    for alpha in ALPHAS:
        assert discrete_gaussian_halfwidth(sigma_sq, alpha) == brute_force_halfwidth(z, pmf, alpha)


def test_variances_of_wide_gaussians_match_brute_force():
    for sigma_sq in (Fraction(5000**2 + 1, 3), Fraction(4100**2)):
        z, pmf = gaussian_pmf(sigma_sq)
        assert discrete_gaussian_variance(sigma_sq) == pytest.approx(
            math.fsum(z.astype(float) ** 2 * pmf), rel=1e-9)
    assert discrete_laplace_variance(Fraction(1, 100)) == pytest.approx(2 * math.exp(-100), rel=1e-9)


@pytest.mark.parametrize(("kind", "param"), CASES, ids=CASE_IDS)
@pytest.mark.parametrize("alpha", [0.05, 0.01])
def test_halfwidth_covers_empirically(kind, param, alpha):
    halfwidth = (discrete_laplace_halfwidth if kind == "laplace" else discrete_gaussian_halfwidth)
    m = halfwidth(param, alpha)
    z, pmf = pmf_of(kind, param)
    tail = tail_probability(z, pmf, m)
    assert tail <= alpha
    values = draw(kind, param, N, seed=16)
    outside = int(np.sum(np.abs(values) > m))
    assert stats.binomtest(outside, N, tail).pvalue >= P_EXACT


# ---------------------------------------------------------------- sources

def test_secure_source_is_uniform_for_a_bound_that_is_not_a_power_of_two():
    for upper in (3, 1000):
        values = SecureSource().integers(upper, 300_000)
        assert values.dtype == np.int64 and values.min() >= 0 and values.max() < upper
        counts = np.bincount(values, minlength=upper)
        assert stats.chisquare(counts).pvalue >= P_FIT


@pytest.mark.parametrize("source", [SecureSource(), SeededSource(2)], ids=["secure", "seeded"])
def test_sources_stay_in_range_near_two_to_the_62(source):
    for upper in (2**62, 2**62 - 1, 2**61 + 1, (2**62 // 3) * 2):
        values = source.integers(upper, 50_000)
        assert values.dtype == np.int64
        assert values.min() >= 0 and values.max() < upper
        # A modulo reduction of 62-bit words would put 2/3 of the mass below upper/2 for the
        # last bound; exact sampling puts half of it there.
        below = int(np.sum(values < upper // 2))
        assert stats.binomtest(below, values.size, (upper // 2) / upper).pvalue >= P_EXACT
        assert np.sum(values >= upper - upper // 8) > 0


@pytest.mark.parametrize("source", [SecureSource(), SeededSource(2)], ids=["secure", "seeded"])
def test_sources_edge_cases(source):
    assert source.integers(1, 5).tolist() == [0] * 5
    empty = source.integers(10, 0)
    assert empty.dtype == np.int64 and empty.size == 0
    for upper in (0, -3, 2**62 + 1, 2.0, None):
        with pytest.raises(InternalError):
            source.integers(upper, 3)
    with pytest.raises(InternalError):
        source.integers(10, -1)


class CountingSource:
    """A source with nothing but ``integers``: counts calls, delegates to a seeded one."""

    __slots__ = ("_inner", "calls")

    def __init__(self, seed: int):
        self._inner = SeededSource(seed)
        self.calls = 0

    def integers(self, upper, size):
        self.calls += 1
        return self._inner.integers(upper, size)


def _forbid(*args, **kwargs):
    raise AssertionError("a sampler drew randomness outside its source")


@pytest.mark.parametrize("param", [Fraction(1, 3), Fraction(7, 2), Fraction(10**18 + 7, 10**16)])
@pytest.mark.parametrize("sampler", [discrete_laplace, discrete_gaussian])
def test_samplers_draw_only_through_the_source(sampler, param, monkeypatch):
    for name in ("default_rng", "random", "randint", "integers", "laplace", "normal", "geometric"):
        if hasattr(np.random, name):
            monkeypatch.setattr(np.random, name, _forbid)
    monkeypatch.setattr(os, "urandom", _forbid)
    monkeypatch.setattr(random, "random", _forbid)
    first, second = CountingSource(9), CountingSource(9)
    a, b = sampler(param, 5000, first), sampler(param, 5000, second)
    assert first.calls > 0 and first.calls == second.calls
    assert np.array_equal(a, b)      # the output is a function of the source's integers alone


@pytest.mark.parametrize("sampler", [discrete_laplace, discrete_gaussian])
def test_default_source_is_the_secure_one(sampler, monkeypatch):
    calls = []
    real = SecureSource.integers

    def counting(self, upper, size):
        calls.append((upper, size))
        return real(self, upper, size)

    monkeypatch.setattr(SecureSource, "integers", counting)
    values = sampler(Fraction(5), 1000)
    assert values.size == 1000 and calls


# ---------------------------------------------------------------- exponential mechanism
# Budget of this section (on top of the one above, the total stays below 1e-6): five
# goodness-of-fit tests failing at p < P_FIT = 1e-8 and one exact binomial test at 1e-9.

from dpsql.mechanisms.noise import exponential_mechanism  # noqa: E402

EM_WEIGHTS = {
    "decreasing": np.array([0.0, -0.5, -1.0, -2.0, -3.0, -5.0]),
    "uniform": np.zeros(7),
    "one_dominant_with_impossible": np.array([4.0, -np.inf, 1.0, 0.0, -np.inf, 2.5]),
    "large_offsets": np.array([1e6, 1e6 - 1.0, 1e6 - 0.25, 1e6 - 9.0]),
    "many": -np.abs(np.arange(41) - 20.0) / 3,
}


def softmax(x: np.ndarray) -> np.ndarray:
    finite = np.isfinite(x)
    p = np.zeros(x.size)
    p[finite] = np.exp(x[finite] - np.logaddexp.reduce(x[finite]))
    return p


def em_chi_square_pvalue(draws: np.ndarray, p: np.ndarray) -> float:
    """Pearson chi-square of categorical draws against p, pooling categories expecting fewer
    than MIN_EXPECTED draws (in increasing order of p) until the pool expects enough."""
    expected = draws.size * p
    observed = np.bincount(draws, minlength=p.size).astype(float)
    assert observed[p == 0].sum() == 0                # impossible candidates never come out
    order = np.argsort(expected)
    bins_e, bins_o, pool_e, pool_o = [], [], 0.0, 0.0
    for i in order:
        if expected[i] == 0:
            continue
        pool_e, pool_o = pool_e + expected[i], pool_o + observed[i]
        if pool_e >= MIN_EXPECTED:
            bins_e.append(pool_e), bins_o.append(pool_o)
            pool_e = pool_o = 0.0
    if pool_e:                                        # a small remainder joins the last bin
        bins_e[-1] += pool_e
        bins_o[-1] += pool_o
    e, o = np.array(bins_e), np.array(bins_o)
    return float(stats.chi2.sf(np.sum((o - e) ** 2 / e), e.size - 1))


@pytest.mark.parametrize("name", list(EM_WEIGHTS))
def test_exponential_mechanism_matches_the_softmax(name):
    x = EM_WEIGHTS[name]
    draws = noise._exponential_mechanism_draws(x, N, SeededSource(21))
    assert em_chi_square_pvalue(draws, softmax(x)) >= P_FIT


@pytest.mark.parametrize("factor", [2.0, 0.5])
@pytest.mark.parametrize("name", ["decreasing", "one_dominant_with_impossible", "many"])
def test_chi_square_catches_a_factor_two_in_epsilon(name, factor):
    x = EM_WEIGHTS[name]                              # log weights are epsilon * u / (2 Delta_u)
    draws = noise._exponential_mechanism_draws(x * factor, N, SeededSource(22))
    assert em_chi_square_pvalue(draws, softmax(x)) < P_FIT


def test_exponential_variates_fit_exp1_including_both_tails():
    e = noise._exponential_variates(N, SeededSource(23))
    assert e.dtype == np.float64 and e.min() > 0 and np.isfinite(e).all()
    # Bins of equal probability, the outer ones reaching far into both tails.
    edges = np.concatenate([[0.0], -np.log1p(-np.linspace(0, 1, 401)[1:-1]), [np.inf]])
    observed = np.histogram(e, bins=edges)[0]
    assert stats.chisquare(observed).pvalue >= P_FIT
    # Below 1e-3 lies 0.1% of the mass; only full precision near U = 1 resolves it finely.
    small = e[e < 1e-3]
    assert stats.binomtest(small.size, N, -math.expm1(-1e-3)).pvalue >= P_EXACT
    assert np.unique(small).size == small.size


class ScriptedSource:
    """Returns the given arrays in turn (each must have the requested size)."""

    def __init__(self, *arrays):
        self.arrays = [np.asarray(a, dtype=np.int64) for a in arrays]
        self.requests = []

    def integers(self, upper, size):
        self.requests.append((upper, size))
        out = self.arrays.pop(0) if self.arrays else np.zeros(size, dtype=np.int64)
        assert out.size == size
        return out


def test_exponential_variates_follow_the_documented_construction():
    top = 2**53 - 1
    # words: side bit 0 (U = V) / 1 (U = 1 - V); cell = word >> 2. Exponent words: leading zeros.
    source = ScriptedSource([top - 1, top, 0, 1], [top, 2**51, 0, 0], [2**52, 1])
    e = noise._exponential_variates(4, source)
    cells = np.array([(top - 1) >> 2, top >> 2, 0, 0], dtype=float)
    exponents = np.array([0, 1, 53 + 0, 53 + 52])
    v = (2.0**52 + 2 * cells + 1) * 2.0 ** (-54 - exponents)
    assert np.array_equal(e, np.where([False, True, False, True], -np.log1p(-v), -np.log(v)))
    assert source.requests == [(2**53, 4), (2**53, 4), (2**53, 2)]


def test_exponent_cap_stops_an_all_zero_source():
    source = ScriptedSource()                          # every word is 0
    e = noise._exponential_variates(3, source)
    assert np.all(e == -np.log(2.0 ** (-54 - 1000) * (2.0**52 + 1)))
    assert len(source.requests) == 2 + 1000 // 53       # stops once the cap is reached
    assert 0 < e.min() < 700


def test_exponential_mechanism_returns_an_int_and_handles_edge_cases():
    assert exponential_mechanism(np.array([5.0]), SeededSource(0)) == 0
    assert exponential_mechanism([0.0, -np.inf, -np.inf], SeededSource(0)) == 0
    j = exponential_mechanism(np.array([-1e300, -1e300 + 1e285]), SeededSource(0))
    assert isinstance(j, int) and j in (0, 1)
    # A candidate 800 below the best is never chosen (exact probability e**-800).
    assert not noise._exponential_mechanism_draws(np.array([0.0, -800.0]), 10_000, SeededSource(1)).any()


@pytest.mark.parametrize("bad", [np.array([]), np.array([np.nan, 0.0]), np.array([np.inf, 0.0]),
                                 np.array([-np.inf, -np.inf]), np.zeros((2, 2)), "abc", None, [[1.0]]])
def test_exponential_mechanism_rejects_invalid_weights(bad):
    with pytest.raises(InternalError):
        exponential_mechanism(bad, SeededSource(0))


def test_exponential_mechanism_draws_only_through_the_source_and_always_the_same_amount(monkeypatch):
    for name in ("default_rng", "random", "randint", "integers", "gumbel", "exponential", "uniform"):
        if hasattr(np.random, name):
            monkeypatch.setattr(np.random, name, _forbid)
    monkeypatch.setattr(os, "urandom", _forbid)
    monkeypatch.setattr(random, "random", _forbid)
    sizes = []
    for x in (np.zeros(50), np.linspace(-40, 0, 50), np.r_[np.full(49, -np.inf), 0.0]):
        source = ScriptedSource(*[SeededSource(4).integers(2**53, 50) for _ in range(2)])
        exponential_mechanism(x, source)
        sizes.append(source.requests)
    assert sizes[0] == sizes[1] == sizes[2] == [(2**53, 50), (2**53, 50)]   # whatever the weights


def test_exponential_mechanism_default_source_is_the_secure_one(monkeypatch):
    calls = []
    real = SecureSource.integers

    def counting(self, upper, size):
        calls.append((upper, size))
        return real(self, upper, size)

    monkeypatch.setattr(SecureSource, "integers", counting)
    assert exponential_mechanism(np.array([0.0, -1.0, -2.0])) in (0, 1, 2)
    assert calls and all(upper == 2**53 for upper, _ in calls)
