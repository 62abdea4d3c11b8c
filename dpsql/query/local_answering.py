"""The dynamic half of a count over a randomized-response column (``dpsql.query.local``): its
counts of reports read free (post-processing of data private already) or through ``db.sql``'s
charged path (central noise), de-biased and post-processed on the engine."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from dpsql.analysis.aggregates import total_post
from dpsql.answer.explain import Explanation
from dpsql.answer.result import DPResult, QueryCost
from dpsql.budget.accounting import Spend
from dpsql.policy.model import Policy, PrivateTable
from dpsql.query.answering import Answerer
from dpsql.query.context import MechanismContext
from dpsql.query.local import (
    LocalCount,
    debias,
    debiased_columns,
    explain_local,
    interval_cells,
    local_notes,
    noise_variance,
    reports_sql,
    route_local,
)
from dpsql.query.options import merge_options, privacy_options
from dpsql.query.prepare import Prepared
from dpsql.sql.names import table_key

FREE_FAILED = "the query failed while running; nothing was charged and no answer was released"


def check_local_options(policy: Policy, epsilon: Any, delta: Any, noise: str | None, written: dict) -> None:
    """A free randomized-response count spends nothing, but the privacy parameters given
    with it are still validated (DESIGN.md invariant 14)."""
    epsilon, delta, noise = merge_options(written, epsilon, delta, noise)
    if epsilon is not None or delta is not None or noise is not None:
        privacy_options(policy, 1 if epsilon is None else epsilon, delta, noise)


def reports_outside(answerer: Answerer, prepare: Callable[..., Prepared], table: PrivateTable, rule: Any) -> int:
    """Rows of the bounded copy of ``table`` whose LOCAL RR column ``rule`` holds NULL or a
    value outside its DOMAIN (``dpsql.query.local.check_reports``): the curator's connect
    reads it, no analyst's query; nothing is released."""
    prepared = prepare(reports_sql(table, rule), 1, 0, "laplace", None, False)
    assert prepared.plan is not None and prepared.priced is not None
    rows = answerer.curator_rows(prepared.priced.bounded, prepared.plan.query.keys)
    return sum(int(count) for key, count in rows if key is None)


def route(policy: Policy, check: Callable[[str], tuple], sql: str) -> tuple[LocalCount | None, dict]:
    """The de-biased count ``sql`` is, if it is one (``dpsql.query.local``), and its written
    options: from the checked query alone (``check``), before any epsilon is needed (a free one
    needs none)."""
    tree, checked, written = check(sql)
    return route_local(tree, checked, policy, written), written


def explain_local_count(answerer: Answerer, context: MechanismContext, query: LocalCount, epsilon: Any,
                        delta: Any, noise: str | None, written: dict) -> Explanation:
    """``explain`` of a COUNT over a LOCAL RR column: the de-biasing, and its counting query's
    explanation when its counts are noised centrally (charged)."""
    if query.free:
        check_local_options(context.policy, epsilon, delta, noise, written)
        return Explanation(explain_local(query))
    epsilon, delta, noise = merge_options(written, epsilon, delta, noise)
    counting = answerer.explain(context, context.prepare(query.counting_sql, epsilon, delta, noise, None, False))
    return Explanation(explain_local(query) + "\n\n" + counting, refused=getattr(counting, "refused", None))


def answer_local(answerer: Answerer, context: MechanismContext, query: LocalCount, epsilon: Any, delta: Any,
                 noise: str | None, written: dict) -> DPResult:
    """A COUNT over a LOCAL RR column, de-biased (``dpsql.query.local``): from the exact
    counts of reports (free), or from the noisy counts of its counting query, charged and
    recorded as that query (central)."""
    engine, policy = answerer.engine, context.policy
    if query.free:
        check_local_options(policy, epsilon, delta, noise, written)
        prepared = context.prepare(query.counting_sql, 1, 0, "laplace", None, False)  # planned, never noised
        assert prepared.plan is not None and prepared.priced is not None
        rows = answerer.free_rows(prepared.priced.bounded, prepared.plan.query.keys, FREE_FAILED)
        counts, variance = {row[0]: int(row[1]) for row in rows if row[0] is not None}, 0.0
        cost: Spend = QueryCost.free()
    else:
        epsilon, delta, noise = merge_options(written, epsilon, delta, noise)
        prepared = context.prepare(query.counting_sql, epsilon, delta, noise, None, False)
        assert prepared.plan is not None
        counted = answerer.sql(context, prepared)
        counts = {row[0]: row[1] for row in counted.fetchall()}
        measure = next(m for m in prepared.plan.measures if m.kind == "count")
        variance, cost = noise_variance(measure), counted.cost
    debiased = debias(query, counts, variance)
    key_type = context.catalog[table_key(query.table.name)].get(query.rule.name.lower(), "")
    columns = debiased_columns(query)
    types = [key_type if name == "g0" else "DOUBLE" for name in columns]
    indexed = [row + (index,) for index, row in enumerate(debiased.rows)]
    names, rows = engine.post_processing.post_process(columns + ["dp_row"], types + ["BIGINT"], indexed,
                                      total_post(query.post))  # released values only: free
    tracked = names[-1] == "dp_row"
    variances = [debiased.variances[row[-1]] for row in rows] if tracked else [math.nan] * len(rows)
    rows = [row[:-1] for row in rows] if tracked else rows

    def released_types() -> list[str]:
        described = engine.post_processing.released_types(columns + ["dp_row"], types + ["BIGINT"],
                                                          total_post(query.post))
        return [type_name for _, type_name in described[:len(query.outputs)]]

    return DPResult(list(query.outputs), rows, cost, intervals=interval_cells(query, rows, variances),
                    types=released_types, notes=local_notes(query, not query.free),
                    budget=context.spender.snapshot(), converter=engine.post_processing.convert)
