"""Privacy accounting: how adaptively chosen releases add up, and when the next one must wait.

Each accountant is a *privacy filter* (Rogers, Roth, Ullman, Vadhan 2016, "Privacy Odometers
and Filters: Pay-as-you-Go Composition"): a rule that looks at the costs of the releases made so
far plus the cost of the next one, all chosen by an analyst who saw every earlier answer, and
says whether the next one may run. A valid filter guarantees (epsilon, delta)-DP for the whole
interaction whatever the analyst does, which a composition formula for a number of queries
fixed in advance does not. The ledger runs ``check`` inside the same ``BEGIN IMMEDIATE``
transaction as the insert (``dpsql.budget.ledger``), so the rule sees every committed charge.

BASIC: sequential composition as a filter (RRUV16): admit while sum(epsilon_i) <= epsilon and
sum(delta_i) <= delta. Exact in Fractions.

ADVANCED: the advanced-composition filter of Whitehouse, Ramdas, Rogers, Wu, "Fully-Adaptive
Composition in Differential Privacy" (ICML 2023, arXiv:2203.05481), which matches the constants
of Dwork-Rothblum-Vadhan while each epsilon_i may be chosen after seeing earlier answers. The
budget delta is split as delta' + delta'' (half each); admit while, counting the new release,

    sqrt(2 ln(1/delta') S) + S/2 <= epsilon   (S = sum of epsilon_i^2)   and   sum(delta_i) <= delta''.

(The loss of an epsilon_i-DP step lies in [-epsilon_i, epsilon_i] with conditional mean at most
epsilon_i^2/2, Bun & Steinke 2016 Prop 3.3; the centred losses are a martingale, sub-Gaussian
with variance proxy S, and a line-crossing bound that holds at any stopping time keeps the total
below epsilon with probability 1 - delta'.) S/2 is below DRV's k*eps*(e^eps - 1). No square root
decides: with L >= ln(1/delta') rounded up, the test is 2 L S <= (epsilon - S/2)^2 with
epsilon - S/2 >= 0, exactly. Each query is one step (its measures compose basically inside it).

ZCDP: zero-concentrated DP (Bun & Steinke 2016) as a Renyi filter (Feldman & Zrnic 2021,
"Individual Privacy Accounting via a Renyi Filter"; WRRW23): admit while sum(rho_i) <= rho_budget.
A discrete Gaussian measure costs Delta_2^2 / (2 sigma^2) (Canonne, Kamath, Steinke 2020, Thm
14), a pure epsilon-DP measure epsilon^2/2 (BS16 Prop 3.3), exactly, per measure. rho-zCDP is
(alpha, alpha*rho)-RDP for every alpha and the stopping rule is the same for every alpha, so the
interaction is rho_budget-zCDP. rho_budget is the largest rho that converts to the policy's
(epsilon, delta) by CKS20 Prop 12 / Cor 13, the tightest conversion that holds for every
rho-zCDP mechanism (the exact Gaussian one would need every release to be a continuous
Gaussian; discrete Gaussians and Laplace are not):
delta = min over alpha > 1 of exp((alpha-1)(alpha rho - epsilon)) (alpha-1)^(alpha-1) / alpha^alpha.
It is found with floats and rounded *down* to a Fraction with a margin, so checks stay exact.

Never fewer than BASIC. While every release so far is pure (all delta_i = 0), ADVANCED and ZCDP
also admit what BASIC admits: "pure and sum(epsilon_i) <= epsilon, or the filter's rule". Proof:
let N be where this combined rule stops and N' = min(N, the filter's own stopping time), a
stopping time against which the filter's theorem holds (an analyst may always stop early). The
privacy loss of pure steps is bounded pathwise, L_N <= sum(epsilon_i), so on {L_N > epsilon} the
basic branch failed, hence the filter's rule held at N, so N' = N and L_N = L_N'. Then
delta_N(epsilon) = E[(1 - e^(epsilon - L_N))+] <= E[(1 - e^(epsilon - L_N'))+] <= delta.

Floats only ever report (square roots, logarithms), rounded in the safe direction: spent up,
remaining down. ``remaining.epsilon`` means the same under every accountant: the largest epsilon
one more single-measure, pure-epsilon query may spend now. Under BASIC that is total minus
spent; under ADVANCED and ZCDP composition is sublinear, so spent + remaining < total, and
``spent`` is the (epsilon, delta) guarantee of everything released so far.

>>> total = Spend(Fraction(1), Fraction(1, 10**6))
>>> [accountant_for(name, total).answerable(Spend(Fraction(1, 100))) for name in ACCOUNTINGS]
[100, 333, 487]
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field
from decimal import Decimal
from fractions import Fraction
from numbers import Rational
from typing import TYPE_CHECKING, ClassVar

from dpsql.errors import BudgetExceeded, DPError, InternalError, UnsupportedQuery
from dpsql.mechanisms.calibrate import rho_of
from dpsql.sql.numbers import finite_decimal

if TYPE_CHECKING:
    from dpsql.analysis.plan import Plan

ACCOUNTINGS = ("basic", "advanced", "zcdp")
"""The accountants a policy can choose with ``ACCOUNTING BASIC | ADVANCED | ZCDP``."""
_ZERO = Fraction(0)
_MARGIN = 1e-9  # relative slack demanded of every float computation that decides a budget
_HINT = "ask for less, or raise the policy's budget: dpsql.init_policy(DB, POLICY, replace=True) keeps what was spent"
_HINTS = {"cli": "ask for less, or raise the policy's budget: `dpsql init DB --policy P --replace` keeps what was "
                 "spent",
          "shell": "ask for less, or raise the policy's budget: `dpsql init DB --policy P --replace` keeps what was "
                   "spent",
          "sql": "ask for less, or ask the data curator for more budget"}
"""Who sees a budget refusal: the curator on the local surfaces (Python, CLI, shell: DESIGN.md
invariant 18), who can raise it; the analyst at a server (SQL), who can only ask."""


def _exact(value, name: str) -> Fraction:
    if isinstance(value, Rational) and not isinstance(value, bool):
        return Fraction(value)
    if isinstance(value, Decimal) and value.is_finite():
        return Fraction(value)
    raise TypeError(f"Spend.{name} must be an exact number (Fraction or int), "
                    f"got {value!r}; convert with Fraction(str(x)) at the boundary")


@dataclass(frozen=True, eq=False)
class Spend:
    """An amount of privacy budget: exact epsilon and delta, and rho where it is known.

    >>> Spend(Fraction(1, 10), Fraction(0)) + Spend(Fraction(1, 5), Fraction(1, 10**6))
    Spend(epsilon=Fraction(3, 10), delta=Fraction(1, 1000000))
    >>> Spend(Fraction(1, 2)).fits_in(Spend(Fraction(1, 2), Fraction(0)))
    True
    """

    epsilon: Fraction
    """The epsilon of pure or approximate DP, exact."""
    delta: Fraction = _ZERO
    """The delta of approximate DP, exact; 0 under pure epsilon-DP."""
    rho: Fraction | None = None
    """The zCDP cost, exact, where it is known (every charge records it)."""

    ZERO: ClassVar[Spend]

    def __post_init__(self) -> None:
        object.__setattr__(self, "epsilon", _exact(self.epsilon, "epsilon"))
        object.__setattr__(self, "delta", _exact(self.delta, "delta"))
        if self.rho is not None:
            object.__setattr__(self, "rho", _exact(self.rho, "rho"))

    @classmethod
    def zero(cls) -> Spend:
        """No budget at all."""
        return cls(_ZERO, _ZERO)

    def __add__(self, other: Spend) -> Spend:
        rho = None if self.rho is None or other.rho is None else self.rho + other.rho
        return Spend(self.epsilon + other.epsilon, self.delta + other.delta, rho)

    def __sub__(self, other: Spend) -> Spend:
        rho = None if self.rho is None or other.rho is None else self.rho - other.rho
        return Spend(self.epsilon - other.epsilon, self.delta - other.delta, rho)

    def __eq__(self, other) -> bool:  # amounts compare equal whatever subclass carries them
        if not isinstance(other, Spend):
            return NotImplemented
        return (self.epsilon, self.delta, self.rho) == (other.epsilon, other.delta, other.rho)

    def __hash__(self) -> int:
        return hash((self.epsilon, self.delta, self.rho))

    def __repr__(self) -> str:
        rho = "" if self.rho is None else f", rho={self.rho!r}"
        return f"Spend(epsilon={self.epsilon!r}, delta={self.delta!r}{rho})"

    def __str__(self) -> str:
        """For reading, in decimals (``repr`` keeps the exact Fractions).

        >>> print(Spend(Fraction(7, 10), Fraction(1, 10**6)))
        epsilon 0.7, delta 1e-6
        """
        rho = "" if self.rho is None else f", rho {show(self.rho)}"
        return f"epsilon {show(self.epsilon)}, delta {show(self.delta)}{rho}"

    def fits_in(self, total: Spend) -> bool:
        """True when this amount exceeds ``total`` in neither epsilon nor delta."""
        return self.epsilon <= total.epsilon and self.delta <= total.delta


Spend.ZERO = Spend.zero()


def none_below_zero(amount: Spend) -> Spend:
    """``amount`` with every part below zero raised to zero: what remains of a budget.

    More than the total is spent only when the curator lowered the budget below what had been
    spent (``dpsql init --replace``); then nothing remains, and nothing fits either.

    >>> none_below_zero(Spend(Fraction(-59, 5), Fraction(1, 10**6)))
    Spend(epsilon=Fraction(0, 1), delta=Fraction(1, 1000000))
    """
    rho = None if amount.rho is None else max(amount.rho, _ZERO)
    return Spend(max(amount.epsilon, _ZERO), max(amount.delta, _ZERO), rho)


def check_accountable(accounting: str, cost: Spend) -> None:
    """Refuse a release the policy's accounting cannot add up: under ZCDP every release needs a
    rho, and partition selection is (epsilon, delta)-DP only (it has none)."""
    if accounting == "zcdp" and cost.rho is None:
        raise UnsupportedQuery(
            "part of this query (partition selection of private GROUP BY keys) is only "
            "(epsilon, delta)-DP, which the policy's ACCOUNTING ZCDP cannot add up",
            hint="group by columns with a KEYS domain, or use ACCOUNTING BASIC or ADVANCED")


def query_cost(plan: Plan) -> Spend:
    """What a plan costs: its (epsilon, delta), and rho summed over its parts.

    A discrete Gaussian measure is (l2^2 / 2 sigma^2)-zCDP; a measure nothing can move costs
    nothing; any other part that is pure epsilon-DP (Laplace, or the plan's epsilon beyond its
    measures', with no delta) costs epsilon^2/2. A part with delta > 0 and no Gaussian form
    (partition selection) has no rho: the cost's rho is then ``None``.
    """
    rho, epsilon, delta = _ZERO, _ZERO, _ZERO
    for measure in plan.measures:
        epsilon, delta = epsilon + measure.epsilon, delta + measure.delta
        if measure.noise == "gaussian":
            rho += rho_of(measure.sensitivity.l2_squared, measure.scale)
        elif measure.noise != "none" and measure.delta == 0:
            rho += measure.epsilon ** 2 / 2
        elif measure.noise != "none":
            return Spend(plan.epsilon, plan.delta, None)
    if plan.delta > delta:  # the delta beyond the measures' is partition selection's: no rho
        return Spend(plan.epsilon, plan.delta, None)
    if plan.epsilon > epsilon:
        rho += (plan.epsilon - epsilon) ** 2 / 2
    return Spend(plan.epsilon, plan.delta, rho)


@dataclass(frozen=True)
class Tally:
    """What an accountant needs of a set of past releases: exact, additive sums.

    >>> tally = Tally().add(Spend(Fraction(1, 10))).add(Spend(Fraction(1, 5), rho=Fraction(1, 50)))
    >>> tally  # doctest: +NORMALIZE_WHITESPACE
    Tally(entries=2, epsilon=Fraction(3, 10), delta=Fraction(0, 1), epsilon_squared=Fraction(1, 20),
          rho=Fraction(1, 40), unconverted=0)
    """

    entries: int = 0
    """How many releases."""
    epsilon: Fraction = _ZERO
    """Sum of their epsilons."""
    delta: Fraction = _ZERO
    """Sum of their deltas."""
    epsilon_squared: Fraction = _ZERO
    """Sum of their squared epsilons (ADVANCED)."""
    rho: Fraction = _ZERO
    """Sum of their rhos; epsilon^2/2 for a pure-epsilon release recorded without one (ZCDP)."""
    unconverted: int = 0
    """Releases with delta > 0 and no recorded rho: ZCDP cannot bound them."""

    def add(self, cost: Spend, times: int = 1) -> Tally:
        """This tally with ``times`` more releases of ``cost``."""
        rho, unconverted = cost.rho, 0
        if rho is None:
            rho, unconverted = (cost.epsilon ** 2 / 2, 0) if cost.delta == 0 else (_ZERO, times)
        return Tally(self.entries + times, self.epsilon + times * cost.epsilon,
                     self.delta + times * cost.delta,
                     self.epsilon_squared + times * cost.epsilon ** 2,
                     self.rho + times * rho, self.unconverted + unconverted)


@dataclass(frozen=True)
class Account:
    """A budget as an accountant reads it: what was granted, spent, and what still fits."""

    accounting: str
    """'basic', 'advanced' or 'zcdp'."""
    total: Spend
    """What the policy grants (with the rho it converts to, under ZCDP)."""
    spent: Spend
    """The (epsilon, delta) guarantee of everything released so far (rounded up)."""
    remaining: Spend
    """What one more single-measure query may still spend (rounded down)."""


@dataclass(frozen=True)
class Accountant:
    """A privacy filter over one budget: BASIC; subclasses ADVANCED and ZCDP."""

    total: Spend
    """The policy's (epsilon, delta) for this budget (and its rho, under ZCDP)."""
    name: ClassVar[str] = "basic"
    title: ClassVar[str] = "basic composition"

    def admits(self, tally: Tally) -> bool:
        """True when releases with these sums stay inside the budget."""
        return tally.epsilon <= self.total.epsilon and tally.delta <= self.total.delta

    def account(self, tally: Tally) -> Account:
        """Total, spent and remaining, in this accountant's terms."""
        spent = Spend(tally.epsilon, tally.delta, tally.rho)
        return Account(self.name, self.total, spent,
                       none_below_zero(self.total - Spend(spent.epsilon, spent.delta)))

    def check(self, before: Tally, cost: Spend, which: str) -> None:
        """Raise ``BudgetExceeded`` unless ``cost`` fits after the releases of ``before``."""
        if not self.admits(before.add(cost)):
            reasons = self._shortfalls(before, cost) or [f"{show(cost.epsilon)} of epsilon, which "
                                                         "does not fit"]
            raise BudgetExceeded(f"this query needs {', and '.join(reasons)}, in {which}",
                                 hint=_HINT, hints=_HINTS)

    def answerable(self, cost: Spend, limit: int = 10**6) -> int:
        """How many releases of ``cost`` this budget admits, from nothing spent."""
        tally, count = Tally(), 0
        while count < limit and self.admits(tally.add(cost)):
            tally, count = tally.add(cost), count + 1
        return count

    def _shortfalls(self, before: Tally, cost: Spend) -> list[str]:
        remaining = self.account(before).remaining
        return [_short(name, getattr(cost, name), getattr(remaining, name))
                for name in ("epsilon", "delta") if getattr(cost, name) > getattr(remaining, name)]


class _Filter(Accountant):
    """A filter that also admits what BASIC admits while every release is pure (docstring)."""

    def admits(self, tally: Tally) -> bool:
        return self._pure_basic(tally) or self.filter_admits(tally)

    def filter_admits(self, tally: Tally) -> bool:
        """The published filter's rule alone."""
        raise NotImplementedError

    def _pure_basic(self, tally: Tally) -> bool:
        return tally.delta == 0 and tally.unconverted == 0 and tally.epsilon <= self.total.epsilon

    def account(self, tally: Tally) -> Account:
        spent, remaining = self._filter_account(tally)
        if tally.delta == 0 and tally.unconverted == 0:  # pure so far: basic's bounds hold too
            if tally.epsilon < spent.epsilon:
                spent = Spend(tally.epsilon, _ZERO, spent.rho)
            left = self.total.epsilon - tally.epsilon
            if left > remaining.epsilon:
                remaining = Spend(left, remaining.delta, remaining.rho)
        return Account(self.name, self.total, spent, remaining)

    def _filter_account(self, tally: Tally) -> tuple[Spend, Spend]:
        raise NotImplementedError


@dataclass(frozen=True)
class AdvancedAccountant(_Filter):
    """The WRRW23 advanced-composition filter (module docstring)."""

    name: ClassVar[str] = "advanced"
    title: ClassVar[str] = "advanced composition (a privacy filter)"
    log_term: Fraction = field(init=False)
    """L >= ln(1/delta') for delta' = delta/2, rounded up."""

    def __post_init__(self) -> None:
        if self.total.delta <= 0:
            raise InternalError("advanced composition needs a budget delta > 0")
        object.__setattr__(self, "log_term", _log_inverse_up(self.total.delta / 2))

    def filter_admits(self, tally: Tally) -> bool:
        slack = self.total.epsilon - tally.epsilon_squared / 2
        return (tally.delta <= self.total.delta / 2 and slack >= 0
                and 2 * self.log_term * tally.epsilon_squared <= slack ** 2)

    def _filter_account(self, tally: Tally) -> tuple[Spend, Spend]:
        s, two_l = tally.epsilon_squared, 2 * float(self.log_term)
        spent_epsilon = _round_up_with_margin(math.sqrt(two_l * float(s)) + float(s) / 2) if s else _ZERO
        spent = Spend(spent_epsilon, tally.delta + (self.total.delta / 2 if s else _ZERO))
        s_max = (math.sqrt(two_l + 2 * float(self.total.epsilon)) - math.sqrt(two_l)) ** 2
        next_epsilon = _largest(math.sqrt(max(s_max - float(s), 0.0)),
                                lambda e: self.filter_admits(Tally(epsilon_squared=s + e * e)))
        return spent, Spend(next_epsilon, max(self.total.delta / 2 - tally.delta, _ZERO))


@dataclass(frozen=True)
class ZcdpAccountant(_Filter):
    """A zCDP (Renyi) filter against the rho the policy's (epsilon, delta) converts to."""

    name: ClassVar[str] = "zcdp"
    title: ClassVar[str] = "zero-concentrated DP"

    def __post_init__(self) -> None:
        if self.total.delta <= 0:
            raise InternalError("zCDP accounting needs a budget delta > 0")
        rho = rho_budget(self.total.epsilon, self.total.delta)
        object.__setattr__(self, "total", Spend(self.total.epsilon, self.total.delta, rho))

    def filter_admits(self, tally: Tally) -> bool:
        return tally.unconverted == 0 and tally.rho <= _known(self.total.rho)

    def check(self, before: Tally, cost: Spend, which: str) -> None:
        if before.add(cost).unconverted:
            raise DPError("a release with delta > 0 and no zCDP cost (partition selection, or a "
                          "ledger entry from an older dpsql) cannot be bounded by zCDP",
                          hint="use ACCOUNTING BASIC or ADVANCED")
        super().check(before, cost, which)

    def _filter_account(self, tally: Tally) -> tuple[Spend, Spend]:
        rho = tally.rho
        spent = Spend(epsilon_of_rho(rho, self.total.delta), self.total.delta if rho else _ZERO, rho)
        left = max(_known(self.total.rho) - rho, _ZERO) if not tally.unconverted else _ZERO
        next_epsilon = _largest(math.sqrt(2 * float(left)), lambda e: e * e / 2 <= left)
        return spent, Spend(next_epsilon, self.total.delta, left)

    def _shortfalls(self, before: Tally, cost: Spend) -> list[str]:
        remaining = self.account(before).remaining
        rho = before.add(cost).rho - before.rho
        return [_short("rho", rho, _known(remaining.rho)) + f" (a pure-epsilon query may still spend "
                f"epsilon {show(remaining.epsilon)})"]


def _known(rho: Fraction | None) -> Fraction:
    """A zCDP accountant's rho: its budget's and what remains of it always have one
    (``ZcdpAccountant.__post_init__`` converts the budget; ``_filter_account`` keeps it)."""
    if rho is None:
        raise InternalError("a zCDP budget without its rho")
    return rho


_ACCOUNTANTS = {a.name: a for a in (Accountant, AdvancedAccountant, ZcdpAccountant)}


def accountant_for(accounting: str, total: Spend) -> Accountant:
    """The accountant a policy names, over the budget ``total``."""
    if accounting not in _ACCOUNTANTS:
        raise InternalError(f"unknown accounting {accounting!r}; expected one of {ACCOUNTINGS}")
    return _ACCOUNTANTS[accounting](Spend(total.epsilon, total.delta))


# --- zCDP conversion ------------------------------------------------------------------------


def _epsilon_at(rho: float, log_inverse_delta: float, alpha: float) -> float:
    """CKS20 Cor 13 solved for epsilon at one alpha: any alpha > 1 gives a valid epsilon."""
    return (alpha * rho + math.log(alpha - 1) - alpha * math.log(alpha) / (alpha - 1)
            + log_inverse_delta / (alpha - 1))


def _best_epsilon(rho: float, log_inverse_delta: float) -> float:
    """min over alpha of ``_epsilon_at``: a log-spaced scan, then golden-section refinement."""
    grid = [1 + math.exp(k / 8) for k in range(-120, 121)]
    values = [_epsilon_at(rho, log_inverse_delta, a) for a in grid]
    best = min(range(len(grid)), key=values.__getitem__)
    low, high = grid[max(best - 1, 0)], grid[min(best + 1, len(grid) - 1)]
    ratio = (math.sqrt(5) - 1) / 2
    for _ in range(100):
        a, b = high - ratio * (high - low), low + ratio * (high - low)
        if _epsilon_at(rho, log_inverse_delta, a) < _epsilon_at(rho, log_inverse_delta, b):
            high = b
        else:
            low = a
    return min(values[best], _epsilon_at(rho, log_inverse_delta, (low + high) / 2))


def epsilon_of_rho(rho: Fraction, delta: Fraction) -> Fraction:
    """The epsilon that rho-zCDP guarantees at ``delta`` (CKS20 Prop 12), rounded up.

    >>> 0.99 < float(epsilon_of_rho(rho_budget(Fraction(1), Fraction(1, 10**6)), Fraction(1, 10**6))) <= 1
    True
    """
    if rho <= 0:
        return _ZERO
    return max(_round_up_with_margin(_best_epsilon(float(rho), float(_log_inverse_up(delta)))), _ZERO)


@functools.lru_cache(maxsize=64)
def rho_budget(epsilon: Fraction, delta: Fraction) -> Fraction:
    """The largest rho (rounded down) whose zCDP converts to (epsilon, delta)-DP.

    >>> float(rho_budget(Fraction(1), Fraction(1, 10**6)))  # doctest: +ELLIPSIS
    0.0243...
    """
    if epsilon <= 0 or not 0 < delta < 1:
        raise InternalError(f"no rho budget for epsilon={epsilon}, delta={delta}")
    log_inverse_delta, target = float(_log_inverse_up(delta)), float(epsilon) * (1 - _MARGIN)
    low, high = 0.0, float(epsilon)
    for _ in range(200):
        middle = (low + high) / 2
        if _round_up_with_margin(_best_epsilon(middle, log_inverse_delta)) <= target:
            low = middle
        else:
            high = middle
    return _round_down(low * (1 - _MARGIN))


# --- rounding in the safe direction and messages ---------------------------------------------


def _log_inverse_up(delta: Fraction) -> Fraction:
    """A Fraction no smaller than ln(1/delta), with room for the float logarithms' error."""
    return _round_up_with_margin(math.log(delta.denominator) - math.log(delta.numerator) + 1e-9)


def _round_up_with_margin(value: float) -> Fraction:
    """A Fraction above ``value`` by a relative ``_MARGIN``: room for float rounding errors."""
    return _round_up(value + abs(value) * _MARGIN)


def _round_up(value: float, bits: int = 48) -> Fraction:
    """A short Fraction no smaller than ``value``."""
    return -_round_down(-value, bits)


def _round_down(value: float, bits: int = 48) -> Fraction:
    """A short Fraction no larger than ``value`` (0 stays 0).

    >>> _round_down(0.1) <= Fraction(1, 10) <= _round_up(0.1)
    True
    """
    if not math.isfinite(value):
        raise InternalError(f"cannot round {value}")
    if value == 0:
        return _ZERO
    unit = Fraction(2) ** (math.floor(math.log2(abs(value))) - bits)
    return math.floor(Fraction(value) / unit) * unit


def _largest(estimate: float, fits) -> Fraction:
    """A Fraction at most ``estimate`` that ``fits`` accepts: shrink until it does."""
    value = _round_down(estimate)
    while value > 0 and not fits(value):
        value = _round_down(float(value) * (1 - 2 ** -30))
    return max(value, _ZERO)


def _short(name: str, needed: Fraction, left: Fraction) -> str:
    left = max(left, _ZERO)
    return f"{name} {show(needed)} but only {show(left)} remains ({show(needed - left)} short)"


def show(value: Fraction) -> str:
    """Exact decimal text when short, else ``num/den`` with an approximation, or 6 digits.

    >>> show(Fraction(3, 10)), show(Fraction(1, 10**6)), show(Fraction(1, 3)), show(Fraction(2**-60))
    ('0.3', '1e-6', '1/3 (about 0.3333)', '8.67362e-19')
    """
    exact = finite_decimal(value)
    if exact is None:
        if len(str(value.denominator)) > 12:
            return f"{float(value):.6g}"
        return f"{value.numerator}/{value.denominator} (about {float(value):.4g})"
    if exact == 0:
        return "0"
    if len(exact.as_tuple().digits) > 12:
        return f"{float(value):.6g}"
    return format(exact, "e" if exact.adjusted() < -4 else "f")
