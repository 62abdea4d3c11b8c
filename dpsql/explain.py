"""EXPLAIN: what a private query would run and cost, rendered from its plan. Reads no data."""

from __future__ import annotations

from fractions import Fraction

from .plan import Measure, Plan
from .quantile import quantile_accuracy


def explain_plan(plan: Plan, bounded_sql: str, budget) -> str:
    """A readable account of a plan: measures, sensitivities, noise, cost and the SQL."""
    rule = plan.query.rule
    unit = "each row is its own unit (PRIVACY UNIT ROW)" if plan.query.hidden_unit else rule.unit
    unit += f", at most {rule.max_rows_per_unit} rows and {rule.groups_per_unit} groups per unit"
    lines = [
        f"private table {plan.query.table}; privacy unit: {unit}",
        f"neighbours: {plan.neighbours} ({_neighbour_text(plan.neighbours)})",
        f"cost: epsilon {_num(plan.epsilon)}, delta {_num(plan.delta)}; "
        f"remaining after: epsilon {_num(budget.remaining.epsilon - plan.epsilon)}, "
        f"delta {_num(budget.remaining.delta - plan.delta)}",
    ]
    lines += [f"join {text}" for text in plan.query.joins]
    lines += [
        "",
        "group keys:" if plan.query.keys else "no GROUP BY: exactly one row is released",
    ]
    for key in plan.query.keys:
        text = key.expression.sql(dialect="duckdb")
        if key.domain is None:
            lines.append(f"  {key.name} = {text}: private keys, released only if they pass partition selection")
        elif key.domain.values is None:
            lines.append(f"  {key.name} = {text}: every key of the public domain {key.domain.table}.{key.domain.column}")
        elif key.domain.implied_by is not None:
            lines.append(f"  {key.name} = {text}: every one of the {len(key.domain.values)} values of its type "
                         f"{key.domain.implied_by} (schema, not data: no KEYS line or partition selection needed)")
        else:
            lines.append(f"  {key.name} = {text}: every one of {len(key.domain.values)} listed public keys")
    if plan.selection is not None:
        s = plan.selection
        lines.append(f"  partition selection: a key is released when its count of distinct units plus discrete "
                     f"Laplace noise (scale {_num(s.scale)}) reaches {s.threshold}; epsilon {_num(s.epsilon)}, "
                     f"delta {_num(s.delta)}")
    lines += ["", "aggregates (epsilon split by weight, then equally between an aggregate's measures):"]
    for aggregate, original in zip(plan.aggregates, plan.query.aggregates):
        lines.append(f"  {aggregate.name} = {original.label}: {_release_text(aggregate)}; "
                     f"epsilon {_num(aggregate.epsilon)}")
    lines += ["", "measures:"]
    lines += [f"  {_measure_text(m)}" for m in plan.measures]
    lines += ["", "bounded SQL ($salt is a secret per-database salt):", bounded_sql]
    lines += ["", "post-processing over the noisy core (free):", plan.query.post.sql(dialect="duckdb")]
    return "\n".join(lines)


def _release_text(aggregate) -> str:
    measures = ", ".join(aggregate.measures)
    if aggregate.function == "avg":
        return (f"centred sum / count ({measures}), clamped to [{_num(aggregate.lower)}, "
                f"{_num(aggregate.upper)}]")
    if aggregate.function in ("variance", "stddev"):
        form = "sample" if aggregate.sample else "population"
        return f"{form} {aggregate.function} from centred sum, sum of squares and count ({measures})"
    if aggregate.function == "count_units":
        return f"distinct units ({measures})"
    if aggregate.function == "quantile":
        rule = aggregate.rule
        return (f"quantile q = {rule.q:g} by the exponential mechanism over {rule.buckets + 1} public edges "
                f"in [{_num(rule.lower)}, {_num(rule.upper)}] ({measures}); rank error at most "
                f"{quantile_accuracy(rule, float('inf'), 0.05):.4g} values with 95% probability"
                + ("; MIN/MAX are the 0 and 1 quantiles" if rule.q in (0.0, 1.0) else ""))
    if aggregate.function == "count_distinct":
        return f"distinct values, at most k per unit ({measures})"
    return f"{aggregate.function} ({measures})"


def _neighbour_text(neighbours: str) -> str:
    return "add or remove one unit" if neighbours == "unbounded" else "replace one unit's data"


def _measure_text(measure: Measure) -> str:
    what = {"count": "count", "units": "distinct units", "distinct": "distinct values",
            "histogram": "bucket counts"}.get(measure.kind) or (
        "sum of squared centred values" if measure.squared else "centred sum" if measure.centred else "sum")
    grid = "" if measure.grid == 1 else f", grid {_num(measure.grid)}"
    if measure.kind in ("count", "units", "distinct"):
        bounds = "values in [0, 1]"
    else:
        bounds = f"row values in [{measure.lower}, {measure.upper}] grid units{grid}"
    sensitivity = (f"L1 sensitivity {_num(measure.sensitivity.l1)}, "
                   f"L2 sensitivity {float(measure.sensitivity.l2_squared) ** 0.5:.6g}")
    if measure.noise == "exponential":
        noise = f"exponential mechanism, utility sensitivity {_num(measure.scale)}"
    elif measure.noise == "laplace":
        noise = f"discrete Laplace, scale {_num(measure.scale)}"
    elif measure.noise == "gaussian":
        noise = f"discrete Gaussian, sigma {float(measure.scale) ** 0.5:.6g}"
    else:
        noise = "no noise (nothing can change it)"
    return (f"{measure.name}: {what}, {bounds}; {sensitivity}; epsilon {_num(measure.epsilon)}, "
            f"delta {_num(measure.delta)}; {noise}")


def _num(value: Fraction) -> str:
    value = Fraction(value)
    return str(value.numerator) if value.denominator == 1 else f"{float(value):.6g}"
