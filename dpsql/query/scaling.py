"""``OPTIONS (scale_sample = true)``: COUNT and SUM estimates for the whole table from a Poisson
sample (``TABLESAMPLE POISSON``, ``dpsql.analysis.sampling``), with the sampling error in the ±.

Without it, an answer on a sample is about the sample. With it, each released COUNT, COUNT(DISTINCT
unit) and SUM column is divided by p (Horvitz-Thompson: unbiased for the table's bounded total,
since each unit is kept with probability p, up to p's rounding to 2^-64), and its interval is

    every Y with  low/p - Y <= z sqrt(v Y)  and  Y - high/p <= z sqrt(v Y),   v = (1 - p)/p · c,

where [low, high] is the noise's interval on the sample, z the normal quantile: the estimator's
variance is (1 - p)/p · sum_u y_u^2 over the units' contributions y_u, at most v · Y with c the
most one unit adds to the cell (its rows, k, for a COUNT; 1 for a count of units; k times the
upper bound for a SUM of values bounded below by 0) and Y the cell's total. Solving for Y (a
score interval, like Wilson's) keeps the interval wide when the sample came out small: one built
on the estimate's own size covered a true count of 5 at 10% only 4 times in 10. All of it is
computed from released values and public bounds: post-processing, free. It is approximate (a
normal approximation of a sum of independent bounded terms, with an estimated Y), and says so.

Refused where it cannot be stated: without a sample, when the query post-processes the
aggregates (HAVING, DISTINCT, arithmetic: scale the answer instead; ORDER BY and LIMIT on the
aggregates as they are keep their meaning, since dividing by p keeps every order), and for a SUM whose
values can be negative (its variance bound needs sum_u |y_u|, which no released value bounds).
AVG, VARIANCE and quantiles are ratios or orders, estimated by the sample as they are: left alone.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction
from statistics import NormalDist
from typing import Any

from sqlglot import exp

from dpsql.analysis.aggregates import plain_projection
from dpsql.analysis.plan import Plan, PrivateQuery
from dpsql.analysis.sampling import Sampling
from dpsql.answer.result import DPResult
from dpsql.errors import UnsupportedQuery
from dpsql.query.release import core_columns

SCALED = ("count", "count_units", "sum")
"""The aggregates whose released value is a total: scaled by 1/p."""


@dataclass(frozen=True)
class ScaledColumn:
    """One released column scaled by 1/p."""

    name: str
    """The output column."""
    largest: Fraction
    """c: the most one unit adds to one cell of it (a public bound)."""


@dataclass(frozen=True)
class Scaling:
    """How a sampled answer's totals are scaled to the table (module docstring)."""

    rate: Fraction
    """p, the sampling rate."""
    columns: tuple[ScaledColumn, ...]
    """The columns scaled."""


def plan_scaling(plan: Plan, checked: PrivateQuery, sampling: Sampling | None, written: dict) -> Scaling | None:
    """The scaling the ``scale_sample`` option asks for (``None``: none), or a refusal at the option."""
    option = written.get("scale_sample")
    if option is None or option.value is not True:
        return None
    where = {"line": option.line, "col": option.col}
    if sampling is None:
        raise UnsupportedQuery("scale_sample scales estimates from a Poisson sample, but this query reads no "
                               "TABLESAMPLE POISSON below 100 PERCENT (which is the whole table: nothing to scale)",
                               **where, hint="write FROM t TABLESAMPLE POISSON (10 PERCENT), or leave scale_sample out")
    aggregates = {a.name: a for a in plan.aggregates}
    totals = {name for name, a in aggregates.items() if a.function in SCALED}
    if not _scales_after_post(checked.post, core_columns(plan), totals):
        raise UnsupportedQuery("scale_sample scales released COUNT and SUM columns as they are, but this query "
                               "post-processes them (HAVING, DISTINCT, or arithmetic in the SELECT list or ORDER "
                               "BY)", **where,
                               hint="select the aggregates as they are (ORDER BY and LIMIT them as they are) and "
                                    "compute on the scaled answer, or leave scale_sample out")
    labels = {a.name: a.label for a in plan.query.aggregates}
    rows = Fraction(plan.query.rule.max_rows_per_unit)
    columns = []
    for output, name in checked.direct:
        aggregate = aggregates.get(name)
        if aggregate is None or aggregate.function not in SCALED:
            continue
        if aggregate.function == "count":
            largest = rows
        elif aggregate.function == "count_units":
            largest = Fraction(1)
        else:
            measure = plan.measure(aggregate.measures[0])
            if measure.centred or measure.lower < 0:
                raise UnsupportedQuery(
                    f"scale_sample cannot bound the sampling error of {labels.get(name, output)}: its values can "
                    "be negative", **where,
                    hint="sum a column bounded below by 0 (CLAMP or the policy's BOUNDS), or leave scale_sample out")
            largest = rows * measure.upper * measure.grid
        columns.append(ScaledColumn(output, largest))
    return Scaling(sampling.rate, tuple(columns))


def _scales_after_post(post: exp.Select, core: list[str], totals: set[str]) -> bool:
    """Whether scaling the post-processed answer is scaling the totals before post-processing:
    the SELECT list picks core columns as they are, and ORDER BY (then LIMIT, OFFSET) orders by
    output columns as they are, or by expressions of unscaled columns (keys, AVG). Dividing by
    p > 0 keeps every order, ties included, so rows sorted and cut by a sampled total are the
    rows sorted and cut by its estimate; HAVING n > 100 or ORDER BY n % 7 would not be.

    >>> import sqlglot
    >>> ok = lambda sql: _scales_after_post(sqlglot.parse_one(sql), ["g0", "a0", "a1"], {"a0"})
    >>> ok("SELECT g0 AS g, a0 AS n FROM dp_core ORDER BY UPPER(g0), n DESC, 1, a1 + 1 LIMIT 3")
    True
    >>> ok("SELECT g0 AS g, a0 AS n FROM dp_core ORDER BY a0 % 7"), ok("SELECT a0 * 2 AS n FROM dp_core")
    (False, False)
    >>> ok("SELECT a1 AS m, a0 AS n FROM dp_core ORDER BY m + 1"), ok("SELECT a0 AS n FROM dp_core ORDER BY -n")
    (True, False)
    """
    bare = post.copy()
    order = bare.args.get("order")
    for part in ("order", "limit", "offset"):
        bare.set(part, None)
    if plain_projection(bare, core) is None:
        return False
    unscaled = set(core) - totals
    aliases = {item.alias_or_name: item.unalias().name for item in bare.expressions}

    def unscaled_name(name: str) -> bool:  # unscaled whether it names a core column or an output
        return ((name in core or name in aliases) and (name not in core or name in unscaled)
                and (name not in aliases or aliases[name] in unscaled))

    for ordered in order.expressions if order is not None else ():
        term = ordered.this
        if isinstance(term, exp.Column) or (isinstance(term, exp.Literal) and not term.is_string):
            continue  # an output column or its position: its order survives the scaling
        if not all(unscaled_name(column.name) for column in term.find_all(exp.Column)):
            return False
    return True


def scaled_result(result: DPResult, scaling: Scaling) -> DPResult:
    """``result`` with its scaled columns divided by p and their intervals widened by the
    sampling error (module docstring); the outside-domain cell is left out (it is not scaled)."""
    rate = float(scaling.rate)
    positions = {c.name: (result.columns.index(c.name), c) for c in scaling.columns if c.name in result.columns}
    rows = []
    for row in result.fetchall():
        values = list(row)
        for index, _ in positions.values():
            values[index] = None if values[index] is None else float(values[index]) / rate
        rows.append(tuple(values))
    original = result._intervals

    def intervals(alpha: float) -> dict[str, list[tuple[float, float, float]]]:
        cells = dict(original(alpha)) if original is not None else {}
        z = NormalDist().inv_cdf(1 - alpha / 2)
        for name, (_, column) in positions.items():
            if name not in cells:
                continue
            spread = (1 - rate) / rate * float(column.largest)  # Var(X/p) <= spread * Y
            widened = []
            for (low, high, _), row in zip(cells[name], rows):
                value = row[positions[name][0]]
                lower, upper = _score_interval(low / rate, high / rate, z, spread)
                centre = value if isinstance(value, float) else (lower + upper) / 2
                widened.append((lower, upper, max(upper - centre, centre - lower)))
            cells[name] = widened
        return cells

    def types() -> list[str]:
        return ["DOUBLE" if name in positions else type_name for name, type_name in zip(result.columns, result.types)]

    names = ", ".join(positions)
    notes = list(result.notes)
    if positions:
        estimate = "is an estimate" if len(positions) == 1 else "are estimates"
        notes.append(f"scale_sample: {names} {estimate} for the whole table (the sample's values divided by "
                     f"{scaling.rate if scaling.rate.denominator <= 1000 else rate}); their ± adds the sampling "
                     "error, an approximate bound (normal approximation)")
    if result.outside_domain is not None:
        notes.append("the cell of keys outside their domain is about the sample: it is not scaled")
    return DPResult(result.columns, rows, result.cost, intervals=intervals, types=types, notes=notes,
                    budget=result.budget, converter=_converter(result), limits=result.limits,
                    bounding=result.bounding, outside_domain=result.outside_domain)


def _score_interval(low: float, high: float, z: float, spread: float) -> tuple[float, float]:
    """The totals Y whose sampling error could put the estimate inside [low, high]: the largest
    Y with Y - high <= z sqrt(spread Y), the smallest with low - Y <= z sqrt(spread Y) (a score
    interval, Wilson-type: it does not shrink when the sample came out small, as one built on
    the estimate itself would).

    >>> [round(x, 2) for x in _score_interval(0.0, 0.0, 1.96, 9.0)]  # an empty sample, p = 0.1
    [0.0, 34.57]
    """
    if not math.isfinite(high):
        return (-math.inf if not math.isfinite(low) else 0.0), math.inf
    root = z * math.sqrt(spread)
    upper = ((root + math.sqrt(root * root + 4 * max(high, 0.0))) / 2) ** 2
    lower = ((-root + math.sqrt(root * root + 4 * low)) / 2) ** 2 if low > 0 else min(low, 0.0)
    return lower, upper


def _converter(result: DPResult) -> Any:
    return result._converter
