"""Local differential privacy: k-ary randomized response, and counting what it collected.

Collecting. ``randomized_response(values, epsilon=ε, domain=D)`` is what each respondent's
device runs (or the curator, on their behalf, before anything is stored): a value v of the
domain D of k ≥ 2 values is reported as itself with probability p = e^ε / (e^ε + k − 1), and
as each other value of D with probability q = 1 / (e^ε + k − 1) (Warner 1965 for k = 2;
Kairouz, Oh & Viswanath 2014, "Extremal mechanisms for local differential privacy", and
2016, "Discrete distribution estimation under local privacy", for k-ary RR, "k-RR").

Privacy (ε-LDP). For any two inputs v, v' and any report y, P(y | v) / P(y | v') is one of
p/q = e^ε, q/p = e^−ε, or 1 (y neither or both): never above e^ε. So the report alone is
ε-DP with respect to its input, whatever anyone else reports, and a unit with r such rows
is protected at r·ε (group privacy). The draws are exact (``dpsql.mechanisms.noise.k_ary_response``,
a Bernoulli race over CKS20's Bernoulli(exp(−ε))): no float decides a report, so the ratio
bound holds for the sampler that runs, not only for the ideal one.

Counting. With n reports of which c_S fall in a set S of s domain values, and n_S true
values in S, E[c_S] = n_S·(p + (s−1)q) + (n − n_S)·s·q = n_S·(p − q) + n·s·q, so
ĉ_S = (c_S − n·s·q) / (p − q) is unbiased (for s = 1 the usual k-RR estimator). The reports
are independent, so Var(ĉ_S) = [n_S·a(1−a) + (n − n_S)·b(1−b)] / (p − q)² with a = p + (s−1)q and
b = s·q; for s = 1 this is Wang, Blocki, Li & Jha 2017 ("Locally differentially private
protocols for frequency estimation"), n·q(1−q)/(p−q)² + n_v·(1−p−q)/(p−q). The standard error
plugs ĉ_S (clamped to [0, n]) in for n_S. These are pure functions of released numbers.

>>> from dpsql.mechanisms.noise import SeededSource
>>> randomized_response(["a", "b", "a"], epsilon=30, domain=["a", "b", "c"], source=SeededSource(0))
['a', 'b', 'a']
>>> round(keep_probability(1, 2), 4), round(debiased_count(60, 100, epsilon=1, k=2), 2)
(0.7311, 71.64)
"""

from __future__ import annotations

import math
import struct
from collections.abc import Iterable, Sequence
from fractions import Fraction
from typing import Any

import numpy as np

from dpsql.errors import InvalidParameter
from dpsql.mechanisms.noise import k_ary_response
from dpsql.sql.numbers import exact_parameter

__all__ = ["randomized_response", "keep_probability", "other_probability", "debiased_count",
           "debiased_variance", "noise_variance_after_debiasing"]

_MAX_EPSILON = 100   # e^100 makes q below 1e-43: nothing a report could still hide


def randomized_response(values: Iterable[Any], *, epsilon: Any, domain: Sequence[Any], source=None) -> list:
    """Each of ``values`` (every one a value of ``domain``) as k-ary randomized response reports
    it at ``epsilon``: kept with probability e^ε / (e^ε + k − 1), else one of the other k − 1
    values of ``domain``, uniformly. ``source``: a noise source (the secure one by default;
    tests pass ``dpsql.mechanisms.noise.SeededSource``). A value outside ``domain`` (NULL
    included) is refused: randomized response protects values it can replace, and a value
    nothing can replace it with would be reported as is.

    >>> randomized_response(["x"], epsilon=1, domain=["a", "b"])  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    dpsql.errors.InvalidParameter: value 1 ('x') is not in the domain ['a', 'b']. Hint: list every value...
    """
    epsilon = checked_epsilon(epsilon)
    domain = checked_domain(domain)
    index = {_identity(value): i for i, value in enumerate(domain)}
    true = []
    for position, value in enumerate(values, start=1):
        found = index.get(_identity(value))
        if found is None:
            raise InvalidParameter(f"value {position} ({value!r}) is not in the domain {list(domain)!r}",
                                   hint="list every value the column can hold in domain=, or map the "
                                        "others to one of them first")
        true.append(found)
    reported = k_ary_response(np.array(true, dtype=np.int64), epsilon, len(domain), source)
    return [domain[i] for i in reported.tolist()]


def checked_epsilon(epsilon: Any) -> Fraction:
    """A randomized-response epsilon: exact, above 0, at most 100."""
    value = exact_parameter(epsilon, "epsilon")
    if not 0 < value <= _MAX_EPSILON:
        raise InvalidParameter(f"epsilon must be above 0 and at most {_MAX_EPSILON}, got {epsilon!r}",
                               hint="pass a number such as 1")
    return value


def checked_domain(domain: Sequence[Any]) -> tuple:
    """A domain of at least two distinct values (told apart by type and value: 1 and '1' differ)."""
    if isinstance(domain, (str, bytes)) or not isinstance(domain, Iterable):
        raise InvalidParameter(f"domain must be a list of values, got {domain!r}",
                               hint="pass domain=['a', 'b', 'c']")
    values = tuple(domain)
    if len(values) < 2:
        raise InvalidParameter(f"domain must hold at least two values, got {list(values)!r}",
                               hint="randomized response chooses among the domain's values: list two or more")
    seen: set = set()
    for value in values:
        if _identity(value) in seen:
            raise InvalidParameter(f"domain lists {value!r} twice", hint="list each value once")
        seen.add(_identity(value))
    return values


# numpy scalars whose ``.item()`` is the same value as a Python str, bytes, int, bool or float:
# np.str_('a') is 'a' and np.int64(1) is 1, exactly (a float32 widens to float without loss).
# Others (datetime64, longdouble, complex) keep their own type and match only themselves.
_NUMPY_EXACT = (np.str_, np.bytes_, np.bool_, np.integer, np.floating)


def _identity(value: Any) -> tuple:
    """Values are one when their type and value are (True is not 1, 1 is not 1.0 nor '1'); a
    numpy scalar is the Python value it holds exactly; floats are told apart by their bits
    (-0.0 is not 0.0, and a NaN matches a NaN of the same sign and payload).

    >>> _identity(np.str_("a")) == _identity("a"), _identity(np.int64(1)) == _identity(1)
    (True, True)
    >>> _identity(np.True_) == _identity(1), _identity(1.0) == _identity(1), _identity(-0.0) == _identity(0.0)
    (False, False, False)
    """
    if isinstance(value, _NUMPY_EXACT):
        value = value.item()
    if type(value) is float:
        return "float", struct.pack("<d", value)
    return type(value).__name__, value


def _exp_minus(epsilon: Any) -> float:
    return math.exp(-float(epsilon))


def keep_probability(epsilon: Any, k: int) -> float:
    """p = e^ε / (e^ε + k − 1): the probability a value is reported as itself.

    >>> round(keep_probability(math.log(3), 3), 6)
    0.6
    """
    return 1.0 / (1.0 + (k - 1) * _exp_minus(epsilon))


def other_probability(epsilon: Any, k: int) -> float:
    """q = 1 / (e^ε + k − 1): the probability a value is reported as one given other value.

    >>> round(other_probability(math.log(3), 3), 6)
    0.2
    """
    e = _exp_minus(epsilon)
    return e / (1.0 + (k - 1) * e)


def _spread(epsilon: Any, k: int, size: int) -> tuple[float, float, float]:
    """(a, b, p − q): P(report in S | value in S), P(report in S | value not in S), |S| = size."""
    if not 1 <= size <= k:
        raise InvalidParameter(f"a set of {size} values is not part of a domain of {k}")
    p, q = keep_probability(epsilon, k), other_probability(epsilon, k)
    return p + (size - 1) * q, size * q, p - q


def debiased_count(reports: float, n: float, *, epsilon: Any, k: int, size: int = 1) -> float:
    """The unbiased estimate of how many of ``n`` true values lie in a set of ``size`` domain
    values, from the ``reports`` that fell in it: (c − n·size·q) / (p − q).

    >>> round(debiased_count(40, 100, epsilon=math.log(3), k=3), 9)   # E[c] = 0.6·n_v + 0.2·(100 − n_v)
    50.0
    """
    _, b, gap = _spread(epsilon, k, size)
    return (reports - n * b) / gap


def debiased_variance(estimate: float, n: float, *, epsilon: Any, k: int, size: int = 1) -> float:
    """The variance randomized response gives ``debiased_count`` over a set of ``size`` values,
    with the estimate (clamped into [0, n]) plugged in for the true count.

    >>> round(debiased_variance(50, 100, epsilon=math.log(3), k=3), 6)  # (50·.24 + 50·.16)/.16
    125.0
    """
    a, b, gap = _spread(epsilon, k, size)
    n = max(float(n), 0.0)
    inside = min(max(float(estimate), 0.0), n)
    return (inside * a * (1 - a) + (n - inside) * b * (1 - b)) / gap ** 2


def noise_variance_after_debiasing(noise_variance: float, *, epsilon: Any, k: int, size: int = 1) -> float:
    """The variance central noise adds to ``debiased_count`` when every one of the k counts
    carries independent noise of ``noise_variance`` and n is their (noisy) sum: the estimate is
    ((1 − s·q)·c_S − s·q·c_rest) / (p − q), so the noise variance is
    ((1 − s·q)²·s + (s·q)²·(k − s))·σ² / (p − q)².

    >>> round(noise_variance_after_debiasing(2.0, epsilon=math.log(3), k=3), 6)
    9.0
    """
    _, b, gap = _spread(epsilon, k, size)
    return ((1 - b) ** 2 * size + b ** 2 * (k - size)) * noise_variance / gap ** 2
