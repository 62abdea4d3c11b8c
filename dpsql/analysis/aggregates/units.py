"""COUNT(DISTINCT unit): how many privacy units contribute to each group.

One unit adds 1 to each group it appears in, and appears in at most ``groups_per_unit``
groups (``dpsql.analysis.sensitivity.distinct_units_sensitivity``). Only the bare unit column,
without FILTER, counts units; any other COUNT(DISTINCT ...) counts values
(``dpsql.analysis.aggregates.distinct``).
"""

from __future__ import annotations

from sqlglot import exp

from dpsql.analysis.aggregates.count import CountingFamily
from dpsql.analysis.aggregates.family import Call, NumberText
from dpsql.analysis.plan import Aggregate, AggregateRelease


class UnitsFamily(CountingFamily):
    """COUNT(DISTINCT unit)."""

    functions = ("count_units",)
    spellings = ("COUNT",)
    measure_kind = "units"

    def classify_distinct(self, call: exp.Expression, values: list[exp.Expression],
                          context: Call) -> Aggregate | None:
        if isinstance(call, exp.Count) and len(values) == 1 and isinstance(values[0], exp.Column) \
                and context.unit is not None and values[0].name == context.unit and context.condition is None:
            return Aggregate(context.name, "count_units", None, context.label)
        return None

    def explain(self, aggregate: AggregateRelease, number: NumberText) -> str:
        return f"distinct units ({', '.join(aggregate.measures)})"
