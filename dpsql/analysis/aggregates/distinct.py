"""COUNT(DISTINCT expr): a noisy count of distinct values per group.

Its measure has a bounded SQL of its own (``dpsql.backends.rewrite``): each unit's rows are
bounded first, so one unit brings at most k new values, and the COUNT rule holds.
"""

from __future__ import annotations

from sqlglot import exp

from dpsql.analysis.aggregates.count import CountingFamily
from dpsql.analysis.aggregates.family import Call, NumberText, filtered
from dpsql.analysis.plan import Aggregate, AggregateRelease
from dpsql.sql.allowlist import check_row_level


class DistinctFamily(CountingFamily):
    """COUNT(DISTINCT expr) of anything but the unit column."""

    functions = ("count_distinct",)
    spellings = ("COUNT",)
    measure_kind = "distinct"  # at most k new values per unit: the COUNT rule

    def classify_distinct(self, call: exp.Expression, values: list[exp.Expression],
                          context: Call) -> Aggregate | None:
        if not (isinstance(call, exp.Count) and len(values) == 1):
            return None
        check_row_level(values[0], "COUNT(DISTINCT ...)")
        return Aggregate(context.name, "count_distinct", filtered(values[0], context.condition), context.label)

    def explain(self, aggregate: AggregateRelease, number: NumberText) -> str:
        return f"distinct values, at most k per unit ({', '.join(aggregate.measures)})"
