"""A column's suggested bounds: DP quantiles that state the share of units they cover.

Two kinds of bounds, each one or two draws of the exponential mechanism over the public
candidates ``value_candidates`` (0 and ±m·10^e), by ``dpsql.curator.suggest.pick_quantile``:
its utility -dist(q·n, [rank(c_{i-1}), rank(c_i)]) is 0 only at the first candidate reaching
the target rank and has no grid error (the endpoint utility of ``dpsql.mechanisms.quantile``
without its shift and floor).

* **Row bounds** ``col BOUNDS lo TO hi``: quantiles of the rows with each unit weighing 1 in
  all: unit u with m_u values adds floor(S·#{its values ≤ c}/m_u) to the rank of c (S =
  ``SHARE_SCALE``, exact integers), so one unit moves every rank by at most S and the total
  n·S by S: Δu = S in rank units (a quantile of one weight-S value per unit, with
  ``dpsql.mechanisms.quantile``'s k = S). The statement "covers ≥ x%" reads: on average over
  units, at least x% of a unit's rows lie inside.
* **Per-unit bounds** ``col BOUNDS PER UNIT L TO U``: quantiles of each unit's totals of its
  row values clamped into the suggested row bounds, U from the totals of the positive parts
  Σ max(v, 0) and -L from the magnitudes of the totals of the negative parts -Σ min(v, 0). Any
  group's total of a unit's rows lies between its two, so the statement holds for every GROUP
  BY (and over all the unit's rows, of which MAX ROWS PER UNIT keeps fewer). Each unit adds one
  total to each list: Δu = 1. With row bounds lo ≥ 0 the lower one is 0 (no draw), with hi ≤ 0
  the upper. The candidates stop below k·max(|lo|, |hi|), which is itself the last candidate
  (``draw_unit_bound``): no unit's kept rows total more, so a draw cannot run off to an absurd
  bound, only lose the gain, and its run-off margin is looser (``UNIT_RUN_OFF``).

Units with no value in the column (all NULL or NaN) count as inside both bounds (they add
nothing outside): the upper draw counts them below every candidate, the lower above, so the
shares are of all n units, the suggestion's DP count of which is public.

**What is stated.** A draw of epsilon e over N candidates, aimed at rank q·n, lands where
dist(q·n, [rank(c_{i-1}), rank(c_i)]) ≤ d = 2·Δu·ln(N/α)/e with probability ≥ 1 - α (the
EM's utility theorem, the best utility being 0): an upper bound c_i has rank ≥ q·n - d, so at
most (1 - q) + d/n of the units lie above it; a lower bound (the candidate below c_i) at most
q + d/n below it. It is aimed at the tail share τ = max(1%, d_off/n), d_off = 2·Δu·ln(N/β)/e:
the candidates beyond all values score -τ·n, so with probability ≥ 1 - β it does not run off
to an absurd edge; when τ is above 1% the suggestion says which percentile it could aim at
and the epsilon that would reach 99%. n is the DP count's lower 95% bound (the statement is
post-processing of DP releases and public numbers; α and β are ``ALPHA`` and ``RUN_OFF``).
Values beyond the candidates (|v| > 8·10^9) count as at the outermost candidate.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction

from sqlglot import exp

from dpsql.mechanisms.total_bound import draw_total_bound
from dpsql.sql import pieces

SHARE_SCALE = 2**16
"""S: the weight of one unit in a row-bound rank (its rows share it): the row draws' Δu."""
TOTAL_WEIGHT = 1
"""The weight of one unit in a per-unit total's rank (one total each): the per-unit draws' Δu."""
TAIL = Fraction(1, 100)
"""The tail share each bound aims at when the epsilon allows: bounds at the 1st and 99th percentiles."""
WITHHELD_TAIL = 0.25
"""A bound that may leave more than this share of units beyond it is withheld, not suggested."""
ALPHA = 0.025
"""Each bound's stated share holds with probability at least 1 - this (a pair: 95%)."""
RUN_OFF = 0.01
"""A row bound's draw lands beyond all values (an absurd bound) with probability at most this."""
UNIT_RUN_OFF = 0.2
"""A per-unit bound's draw lands beyond all totals with probability at most this: it lands at
most at k·max(|lo|, |hi|), so all it loses is the gain over the row bounds, and a looser margin
lets it aim further out."""
DECIMAL_TOTAL = exp.DataType.build("DECIMAL(38, 6)")
"""Per-unit totals are summed exactly in this type (each row's clamped DOUBLE rounded once)."""


@dataclass(frozen=True)
class Aim:
    """Where one draw aims and what it can state, before it is drawn."""

    tail: float
    """τ: the target share beyond the bound (at least ``TAIL``)."""
    stated: float
    """The share beyond it the suggestion vouches for: τ + d/n."""
    epsilon_for_tail: float
    """The epsilon of the draw at which τ would be ``TAIL``."""

    @property
    def withheld(self) -> bool:
        return self.stated > WITHHELD_TAIL


def aim(epsilon: Fraction, candidates: int, units: int, run_off: float = RUN_OFF) -> Aim:
    """The aim and statement of a draw of ``epsilon`` over ``candidates`` for ``units`` units
    (a low estimate), in unit terms (Δu = 1 unit: S share-weights, or one total), landing
    beyond all values with probability at most ``run_off``.

    >>> a = aim(Fraction(1, 10), 236, 4000)
    >>> round(a.tail, 4), round(a.stated, 4), round(a.epsilon_for_tail, 2)
    (0.0503, 0.0961, 0.5)
    >>> aim(Fraction(1), 236, 4000).tail
    0.01
    """
    scale = 2 / float(epsilon)
    off = scale * math.log(candidates / run_off)
    error = scale * math.log(candidates / ALPHA)
    units = max(units, 1)
    tail = max(float(TAIL), off / units)
    return Aim(tail, tail + error / units, float(epsilon) * max(off / units / float(TAIL), 1.0))


def _column(name: str) -> exp.Column:
    return exp.column(name, quoted=True)


def _present(value: exp.Expr) -> exp.Expr:
    return exp.and_(exp.Not(this=exp.Is(this=value.copy(), expression=exp.Null())),
                    exp.Not(this=pieces.is_nan(value.copy())))


def _double(column: str) -> exp.Expr:
    """The value as a DOUBLE, total for every numeric type (``dpsql.curator.suggest.values_select``)."""
    return exp.TryCast(this=_column(column), to=exp.DataType.build("DOUBLE"))


def _edge(value: Fraction) -> exp.Expr:
    return exp.Cast(this=pieces.literal(value), to=exp.DataType.build("DOUBLE"))


def _number(value: int) -> exp.Expr:
    return exp.Literal.number(value)


def ranks_from(rows, candidates: int) -> list[int]:
    """The ≤-rank at each candidate from (bucket, weight) rows: the sum of the weights of the
    buckets at or below it (bucket ``candidates`` lies above them all); then the whole weight.

    >>> ranks_from([(0, 2), (2, 5), (3, 1)], 3)
    [2, 2, 7, 8]
    """
    weights = [0] * (candidates + 1)
    for bucket, weight in rows:
        weights[int(bucket)] += int(weight)
    ranks, running = [], 0
    for weight in weights:
        running += weight
        ranks.append(running)
    return ranks


def shares_select(table: exp.Table, owner: exp.Expr | None, column: str, edges) -> exp.Select:
    """(bucket, weight) rows whose ``ranks_from`` is, per edge c, Σ over units of
    floor(S·#{its values ≤ c}/m) (m its values; units without a value add nothing): each unit's
    weight at its bucket b is the increase of floor(S·(its values in buckets ≤ b)/m) there.
    ``owner`` is the unit's identity (``None``: each row its own unit, weight S at its bucket)."""
    value = exp.column("dp_value")
    buckets = pieces.bucket_of(value, [_edge(c) for c in edges])
    scale = _number(SHARE_SCALE)
    if owner is None:
        rows = exp.select(exp.alias_(_double(column), "dp_value")).from_(table)
        return (exp.select(exp.alias_(buckets, "dp_bucket"), exp.Mul(this=exp.Count(this=exp.Star()), expression=scale))
                .from_(rows.subquery()).where(_present(value)).group_by(exp.column("dp_bucket")))
    rows = (exp.select(exp.alias_(owner, "dp_owner"), exp.alias_(_double(column), "dp_value")).from_(table))
    counted = (exp.select(exp.column("dp_owner"), exp.alias_(buckets, "dp_bucket"),
                          exp.alias_(exp.Count(this=exp.Star()), "dp_count"))
               .from_(rows.subquery())
               .where(exp.Not(this=exp.Is(this=exp.column("dp_owner"), expression=exp.Null())), _present(value))
               .group_by(exp.column("dp_owner"), exp.column("dp_bucket")))
    in_order = exp.Order(expressions=[exp.Ordered(this=exp.column("dp_bucket"))])
    running = exp.Window(this=exp.Sum(this=exp.column("dp_count")), partition_by=[exp.column("dp_owner")],
                         order=in_order.copy(),
                         spec=exp.WindowSpec(kind="ROWS", start="UNBOUNDED", start_side="PRECEDING"))
    values = exp.Window(this=exp.Sum(this=exp.column("dp_count")), partition_by=[exp.column("dp_owner")])
    share = exp.IntDiv(this=exp.Mul(this=running, expression=scale), expression=values)
    shared = exp.select(exp.column("dp_owner"), exp.column("dp_bucket"), exp.alias_(share, "dp_share")) \
        .from_(counted.subquery())
    before = exp.Window(this=exp.Anonymous(this="LAG", expressions=[exp.column("dp_share"), _number(1), _number(0)]),
                        partition_by=[exp.column("dp_owner")], order=in_order.copy())
    increase = exp.Sub(this=exp.column("dp_share"), expression=before)
    increases = exp.select(exp.column("dp_bucket"), exp.alias_(increase, "dp_increase")).from_(shared.subquery())
    return (exp.select(exp.column("dp_bucket"), exp.Sum(this=exp.column("dp_increase")))
            .from_(increases.subquery()).group_by(exp.column("dp_bucket")))


def totals_select(table: exp.Table, owner: exp.Expr, column: str, lower: Fraction, upper: Fraction,
                  edges) -> exp.Query:
    """(part, bucket, units) rows: per part (0: the total of positive parts Σ max(v', 0), 1: the
    magnitude of the total of negative parts -Σ min(v', 0)) and bucket, the units whose total
    falls in it (``ranks_from`` then gives the units whose total is ≤ each edge); v' is the row's value clamped into
    [lower, upper] (NULL and NaN rows add nothing; a unit without a value totals 0), summed
    exactly as DECIMAL(38, 6)."""
    value = exp.column("dp_value")
    clamped = exp.Greatest(this=exp.Least(this=value.copy(), expressions=[_edge(upper)]),
                           expressions=[_edge(lower)])
    zero = exp.Cast(this=_number(0), to=exp.DataType.build("DOUBLE"))
    present = _present(value)

    def total(part: exp.Expr) -> exp.Expr:
        exact = exp.Cast(this=part, to=DECIMAL_TOTAL.copy())
        kept = exp.Case(ifs=[exp.If(this=present.copy(), true=exact)], default=exp.Null())
        return exp.Coalesce(this=exp.Sum(this=kept), expressions=[exp.Cast(this=_number(0), to=DECIMAL_TOTAL.copy())])

    # Each row's part is cut at the largest edge before the exact cast: a total that reaches it lands
    # beyond every edge either way (parts have one sign), and no row's value can overflow the
    # DECIMAL and fail the statement (an attacker's review: with BOUNDS beyond 1e32 one unit's value
    # decided whether the charged suggestion failed).
    largest = _edge(max(abs(Fraction(c)) for c in edges))
    negative_largest = _edge(-max(abs(Fraction(c)) for c in edges))
    positive = exp.Least(this=exp.Greatest(this=clamped.copy(), expressions=[zero.copy()]), expressions=[largest])
    negative = exp.Greatest(this=exp.Least(this=clamped.copy(), expressions=[zero.copy()]),
                            expressions=[negative_largest])
    rows = exp.select(exp.alias_(owner, "dp_owner"), exp.alias_(_double(column), "dp_value")).from_(table)
    per_unit = (exp.select(exp.alias_(total(positive), "dp_0"),
                           exp.alias_(exp.Neg(this=total(negative)), "dp_1"))
                .from_(rows.subquery())
                .where(exp.Not(this=exp.Is(this=exp.column("dp_owner"), expression=exp.Null())))
                .group_by(exp.column("dp_owner")))
    exact_edges = [exp.Cast(this=pieces.literal(c), to=DECIMAL_TOTAL.copy()) for c in edges]
    parts = []
    for part in (0, 1):
        bucket = pieces.bucket_of(exp.column(f"dp_{part}"), exact_edges)
        parts.append(exp.select(exp.alias_(_number(part), "dp_part"), exp.alias_(bucket, "dp_bucket"),
                                exp.alias_(exp.Count(this=exp.Star()), "dp_units"))
                     .from_(exp.to_identifier("dp_totals")).group_by(exp.column("dp_bucket")))
    return exp.union(parts[0], parts[1], distinct=False).with_("dp_totals", as_=per_unit)


def pick_quantile(candidates, ranks, total: int, quantile: Fraction, epsilon: Fraction, sensitivity: int,
                  source=None) -> int:
    """Index of the candidate chosen by the exponential mechanism whose best candidate is the
    first c with rank(c) ≥ q·n (``ranks[i]``: values ≤ candidates[i]; n = ``total``).

    u(c_i) = -max(q·n - rank(c_i), rank(c_{i-1}) - q·n, 0), rank(c_{-1}) = 0. The plain
    -|rank(c) - q·n| is flat above the largest value, so every far candidate would tie with
    the right one; this one is 0 only for the first candidate reaching the quantile and falls
    on both sides. Sensitivity: with a = q·n - rank(c_i) and b = rank(c_{i-1}) - q·n, a + b ≤ 0,
    so u = -max(a, b, 0); one unit moves a and b by at most ``sensitivity`` each (its values
    move each rank by at most that, and q·n by q times it), hence u by at most that.

    >>> from dpsql.mechanisms.noise import SeededSource
    >>> pick_quantile([1, 2, 3, 4], [10, 50, 100, 100], 100, Fraction(2, 5), Fraction(50), 1, SeededSource(0))
    1
    """
    return draw_total_bound(ranks, total, epsilon, sensitivity, quantile, source)  # the same draw


@dataclass(frozen=True)
class DrawnBound:
    """One suggested bound and what is said of it."""

    value: Fraction
    """The bound (one of the public candidates)."""
    aimed: float
    """The tail share it aimed beyond it."""
    stated: float
    """At most this share of units lies beyond it (probability ≥ 1 - ``ALPHA``)."""
    epsilon: Fraction
    """Its draw's epsilon (0: not drawn, the bound follows from the row bounds)."""


def draw_bound(side: str, candidates, ranks, total: int, weight: int, epsilon: Fraction, units_low: int,
               source=None) -> DrawnBound | None:
    """The ``side`` ("upper" or "lower") bound drawn by ``pick_quantile`` over ``candidates``
    with ≤-ranks ``ranks`` of ``total`` (``weight``: one unit's weight, Δu), aimed and stated by
    ``aim``; ``None`` when it would be withheld (decided before the draw: nothing drawn)."""
    aimed = aim(epsilon, len(candidates), units_low)
    if aimed.withheld:
        return None
    quantile = 1 - Fraction(aimed.tail) if side == "upper" else Fraction(aimed.tail)
    index = pick_quantile(candidates, ranks, total, quantile, epsilon, weight, source)
    if side == "lower":
        index = max(index - 1, 0)  # the candidate below: at most q·n + d units lie below it
    return DrawnBound(Fraction(candidates[index]), aimed.tail, aimed.stated, epsilon)


def draw_unit_bound(candidates, ranks, units: int, cap: Fraction, epsilon: Fraction, units_low: int,
                    source=None) -> DrawnBound | None:
    """An upper bound on units' totals (of positive parts, or the magnitudes of negative parts)
    drawn over the ``candidates`` below ``cap`` = k·max(|lo|, |hi|) and ``cap`` itself, which
    ranks all ``units``: no unit's kept rows (at most k, each within the row bounds) total more,
    so it is a bound with nothing beyond, and a draw landing there loses nothing but the gain:
    its run-off margin is ``UNIT_RUN_OFF``'s, looser than a row bound's. Its ``ranks`` are the
    ≤-ranks at ``candidates``. ``None`` when it would be withheld.

    >>> from dpsql.mechanisms.noise import SeededSource
    >>> drawn = draw_unit_bound([Fraction(10), Fraction(100)], [900, 1000], 1000, Fraction(500), Fraction(50),
    ...                         1000, SeededSource(0))
    >>> drawn.value, drawn.aimed
    (Fraction(100, 1), 0.01)
    """
    kept = [(c, r) for c, r in zip(candidates, ranks) if 0 < c < cap]
    values = [c for c, _ in kept] + [cap]
    aimed = aim(epsilon, len(values), units_low, UNIT_RUN_OFF)
    if aimed.withheld:
        return None
    index = pick_quantile(values, [r for _, r in kept] + [units], units, 1 - Fraction(aimed.tail), epsilon,
                          TOTAL_WEIGHT, source)
    if index == len(kept):
        return DrawnBound(cap, aimed.tail, 0.0, epsilon)
    return DrawnBound(Fraction(values[index]), aimed.tail, aimed.stated, epsilon)
