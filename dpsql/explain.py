"""EXPLAIN: what a private query would run and cost, rendered from its plan. Reads no data."""

from __future__ import annotations

from fractions import Fraction

from .plan import Measure, Plan


def explain_plan(plan: Plan, bounded_sql: str, budget) -> str:
    """A readable account of a plan: measures, sensitivities, noise, cost and the SQL."""
    rule = plan.query.rule
    unit = "each row (PRIVACY UNIT ROW)" if rule.row_level else (
        f"{rule.unit}, at most {rule.max_rows_per_unit} rows and {rule.groups_per_unit} groups per unit")
    lines = [
        f"private table {plan.query.table}; privacy unit: {unit}",
        f"neighbours: {plan.neighbours} ({_neighbour_text(plan.neighbours)})",
        f"cost: epsilon {_num(plan.epsilon)}, delta {_num(plan.delta)}; "
        f"remaining after: epsilon {_num(budget.remaining.epsilon - plan.epsilon)}, "
        f"delta {_num(budget.remaining.delta - plan.delta)}",
        "",
        "released columns:",
    ]
    for column in plan.outputs:
        if column.kind == "key":
            key = plan.query.keys[column.key_index]
            source = (f"{key.domain.table}.{key.domain.column}" if key.domain.values is None
                      else f"{len(key.domain.values)} listed keys")
            lines.append(f"  {column.name}: group key, every key of its public domain ({source})")
        elif column.kind == "avg":
            lines.append(f"  {column.name}: AVG = centred SUM {column.measures[0]} / COUNT "
                         f"{column.measures[1]}, clamped to [{_num(column.lower)}, {_num(column.upper)}]")
        else:
            lines.append(f"  {column.name}: {column.kind.upper()} {column.measures[0]}")
    lines += ["", "measures (epsilon split equally):"]
    lines += [f"  {_measure_text(m)}" for m in plan.measures]
    lines += ["", "bounded SQL ($salt is a secret per-database salt):", bounded_sql]
    return "\n".join(lines)


def _neighbour_text(neighbours: str) -> str:
    return "add or remove one unit" if neighbours == "unbounded" else "replace one unit's data"


def _measure_text(measure: Measure) -> str:
    what = "count" if measure.kind == "count" else ("centred sum" if measure.centred else "sum")
    grid = "" if measure.grid == 1 else f", grid {_num(measure.grid)}"
    if measure.kind == "count":
        bounds = "values in [0, 1]"
    else:
        bounds = f"row values in [{measure.lower}, {measure.upper}] grid units{grid}"
    sensitivity = (f"L1 sensitivity {_num(measure.sensitivity.l1)}, "
                   f"L2 sensitivity {float(measure.sensitivity.l2_squared) ** 0.5:.6g}")
    if measure.noise == "laplace":
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
