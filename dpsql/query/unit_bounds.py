"""Bounds per unit chosen privately at query time: the ``unit_bounds_share`` option.

An analyst whose policy has no ``BOUNDS PER UNIT`` for a column may spend a share s of the
query's epsilon on choosing one (as Google's ApproximateBounds does): before the query, one
bounded statement (``dpsql.backends.rewrite.unit_totals_statement``) counts the magnitudes of
the per-(unit, group) totals of each aggregated bounded column in public buckets, and
``dpsql.mechanisms.total_bound`` draws a bound B per column by the exponential mechanism at
s·ε / (the columns). The query is then analysed with ``col BOUNDS PER UNIT -B TO B`` (``0 TO
B`` for a column bounded at or above 0, ``-B TO 0`` at or below 0) at the remaining (1 - s)·ε,
where the analysis keeps the rows model for each aggregate it does not help
(``dpsql.analysis.analyse``). The charge is the query's epsilon, once, before the draw; the
draws compose with the release (basic composition: s·ε + (1 - s)·ε).

Everything after the draw is post-processing of it: the plan, the bounded SQL and whether the
per-unit model is used are functions of the released bound and public facts. Should planning
at the drawn bounds fail, the rows-model plan priced before the charge answers instead (also a
function of the release alone). The drawn bounds are stored with the answer, so a repeat gives
back the same release for free.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, replace
from fractions import Fraction

from sqlglot import exp

from dpsql.analysis.plan import Measure, Plan, PrivateQuery
from dpsql.backends.rewrite import BoundedStatement, unit_totals_statement
from dpsql.errors import UnsupportedQuery
from dpsql.mechanisms.total_bound import (
    ALPHA,
    QUANTILE,
    candidates_below,
    draw_total_bound,
    stated_excess,
)
from dpsql.policy.model import Bounds


@dataclass(frozen=True)
class BoundDraw:
    """One column's draw, fixed before the charge."""

    column: str
    """The column (as the policy names it)."""
    measure: str
    """The rows-model measure whose clamped row values are totalled."""
    candidates: tuple[Fraction, ...]
    """The public candidates, in the column's units (the last: the cap)."""
    sign: int
    """1: the column is bounded at or above 0 ([0, B]); -1: at or below 0 ([-B, 0]); 0: [-B, B]."""


@dataclass(frozen=True)
class AutoBounds:
    """The draws of a query's bounds per unit, priced before the charge."""

    share: Fraction
    """The share of the query's epsilon the draws spend."""
    epsilon: Fraction
    """Their epsilon in all (share · the query's)."""
    groups_per_unit: int
    """l: the most totals one unit has (the utility's sensitivity)."""
    draws: tuple[BoundDraw, ...]
    """One per column, each at ``epsilon / len(draws)``."""
    statement: BoundedStatement
    """The statement counting the totals' magnitudes in the candidates' buckets."""

    @property
    def each(self) -> Fraction:
        return self.epsilon / len(self.draws)


def _plain_column(argument: exp.Expression | None) -> exp.Column | None:
    """The column an argument aggregates as it is (or under FILTER), as the analysis reads a
    policy's BOUNDS PER UNIT (``dpsql.analysis.analyse._unit_bounds_of``)."""
    if isinstance(argument, exp.Case) and len(argument.args.get("ifs") or []) == 1 \
            and argument.args.get("default") is None:
        argument = argument.args["ifs"][0].args["true"]
    return argument if isinstance(argument, exp.Column) else None


def _drawable(measure: Measure, query: PrivateQuery) -> str | None:
    """The policy name of the column ``measure`` totals when a bound per unit can be drawn for it."""
    if measure.kind != "sum" or measure.squared or measure.factors or measure.unit_bounds is not None \
            or measure.counts_values_of is not None:
        return None
    column = _plain_column(measure.argument)
    rule = query.rule.column(column.name) if column is not None else None
    if rule is None or rule.bounds is None or rule.unit_bounds is not None:
        return None
    return rule.name


def plan_auto_bounds(plan: Plan, share: Fraction, epsilon: Fraction, dialect: str,
                     where: exp.Expression | None = None) -> AutoBounds:
    """The draws for ``plan`` (the rows model at the remaining epsilon), spending ``share`` of
    ``epsilon``; refused (before the charge) where no bound can be drawn."""
    query = plan.query  # a row-level table's units are its rows (hidden ids): B then bounds a row's value
    rows = query.rows_per_unit or query.rule.max_rows_per_unit
    draws: dict[str, BoundDraw] = {}
    for measure in plan.measures:
        column = _drawable(measure, query)
        if column is None or column.lower() in draws:
            continue
        largest = max(abs(measure.lower), abs(measure.upper)) * measure.grid
        if largest == 0:
            continue
        cap = rows * largest  # no total of a unit's kept rows lies beyond it
        sign = 1 if measure.lower >= 0 else -1 if measure.upper <= 0 else 0
        draws[column.lower()] = BoundDraw(column, measure.name, candidates_below(cap, max(measure.grid,
                                                                                      Fraction(1, 1000))), sign)
    if not draws:
        raise UnsupportedQuery("unit_bounds_share chooses bounds per unit for SUM, AVG, VARIANCE, STDDEV and the "
                               "second moments of a column with BOUNDS and no BOUNDS PER UNIT, and this query "
                               "aggregates none", node=where,
                               hint="aggregate such a column as it is (e.g. AVG(delay)), "
                                    "or leave unit_bounds_share out")
    edges: dict[str, Sequence[int]] = {
        d.measure: [_edge(c, plan.measure(d.measure).grid) for c in d.candidates] for d in draws.values()}
    statement = unit_totals_statement(plan, edges, dialect)
    groups = query.rule.groups_per_unit if query.keys else 1
    return AutoBounds(share, share * epsilon, groups, tuple(draws.values()), statement)


def _edge(candidate: Fraction, grid: Fraction) -> int:
    """A candidate in grid units, as an integer total compares with it: |T|·grid <= c iff |T| <= floor(c/grid)."""
    return (candidate / grid).__floor__()


def draw_bounds(auto: AutoBounds, rows: Sequence[tuple], source=None) -> dict[str, Fraction]:
    """Each column's drawn bound B, from the statement's (measure, bucket, count) rows."""
    counts: dict[str, dict[int, int]] = {}
    for measure, bucket, count in rows:
        counts.setdefault(str(measure), {})[int(bucket)] = int(count)
    chosen = {}
    for draw in auto.draws:
        found = counts.get(draw.measure, {})
        ranks, running = [], 0
        for index in range(len(draw.candidates)):
            running += found.get(index, 0)
            ranks.append(running)
        total = running + found.get(len(draw.candidates), 0)
        index = draw_total_bound(ranks, total, auto.each, auto.groups_per_unit, source=source)
        chosen[draw.column] = draw.candidates[index]
    return chosen


def bounds_of(auto: AutoBounds, chosen: dict[str, Fraction]) -> dict[str, Bounds]:
    """Each column's BOUNDS PER UNIT from its drawn B and its sign."""
    found = {}
    for draw in auto.draws:
        bound = chosen[draw.column]
        found[draw.column] = Bounds(Fraction(0) if draw.sign > 0 else -bound, Fraction(0) if draw.sign < 0 else bound)
    return found


def with_unit_bounds(query: PrivateQuery, bounds: dict[str, Bounds]) -> PrivateQuery:
    """``query`` as if its policy declared ``bounds`` as its columns' BOUNDS PER UNIT."""
    named = {name.lower(): value for name, value in bounds.items()}
    columns = tuple(replace(rule, unit_bounds=named[rule.name.lower()]) if rule.name.lower() in named else rule
                    for rule in query.rule.columns)
    return replace(query, rule=replace(query.rule, columns=columns))


def stored_bounds(answer: str | None) -> dict[str, Fraction] | None:
    """The drawn bounds kept with a stored answer, if any."""
    try:
        record = json.loads(answer)  # type: ignore[arg-type]
        return {str(k): Fraction(v) for k, v in record["unit_bounds"].items()}
    except (TypeError, ValueError, KeyError, AttributeError, ZeroDivisionError):
        return None


def with_stored_bounds(answer: str, chosen: dict[str, Fraction]) -> str:
    """A stored answer's JSON with the drawn bounds added (exact: fractions as text)."""
    record = json.loads(answer)
    record["unit_bounds"] = {column: str(bound) for column, bound in chosen.items()}
    return json.dumps(record, separators=(",", ":"))


def _number(value: Fraction) -> str:
    return str(int(value)) if value.denominator == 1 else f"{float(value):g}"


def chosen_note(auto: AutoBounds, chosen: dict[str, Fraction], plan: Plan, fell_back: bool) -> str:
    """The answer's note: the bounds drawn, what they state, and where the per-unit model was used."""
    parts = [f"{column} BOUNDS PER UNIT {_number(bounds.lower)} TO {_number(bounds.upper)}"
             for column, bounds in bounds_of(auto, chosen).items()]
    used = any(m.unit_bounds is not None for m in plan.measures)
    grouped = "(unit, group)" if plan.query.keys else "unit"
    excess = stated_excess(auto.each, max(len(d.candidates) for d in auto.draws), auto.groups_per_unit)
    model = ("the rows model answered (planning at these bounds failed)" if fell_back else
             "the per-unit model answered where it lowers the noise" if used else
             "the rows model answered: these bounds would not lower the noise")
    return (f"bounds per unit chosen privately at epsilon {float(auto.epsilon):.3g} (unit_bounds_share "
            f"{float(auto.share):g}): {'; '.join(parts)}, each aimed at the {int(QUANTILE * 100)}th percentile of "
            f"the magnitudes of the per-{grouped} totals (with {100 * (1 - float(ALPHA)):g}% probability at most "
            f"{100 * (1 - float(QUANTILE)):g}% of them plus {excess} lie beyond it, and are clamped); {model}; "
            "the clamp's bias is not in the ±")


def explain_auto(auto: AutoBounds, sql: str) -> str:
    """EXPLAIN's section on the draws: they happen after the charge, so the bounds cannot be shown."""
    columns = ", ".join(d.column for d in auto.draws)
    excess = stated_excess(auto.each, max(len(d.candidates) for d in auto.draws), auto.groups_per_unit)
    return (f"bounds per unit: chosen privately at epsilon {float(auto.epsilon):.3g} (unit_bounds_share "
            f"{float(auto.share):g}; {float(auto.each):.3g} for each of {columns}) by the exponential mechanism "
            f"over {max(len(d.candidates) for d in auto.draws)} public candidates, aimed at the "
            f"{int(QUANTILE * 100)}th percentile of the magnitudes of each unit's per-group totals (sensitivity "
            f"{auto.groups_per_unit}: a unit has at most that many totals; at most "
            f"{100 * (1 - float(QUANTILE)):g}% plus {excess} of them beyond it, with "
            f"{100 * (1 - float(ALPHA)):g}% probability). EXPLAIN cannot state them before the charge: the plan "
            "above is the rows model at the remaining epsilon, and the query uses the per-unit model only where "
            "the drawn bounds lower its noise below it. It runs first:\n" + sql)
