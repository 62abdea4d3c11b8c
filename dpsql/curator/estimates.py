"""The curator's charged estimates, spent like any release (``dpsql.query.spend``): the suggestion
of a table's contribution bounds (``Connection.suggest_bounds``, ``dpsql.curator.suggest``) and
the share of rows each table's MAX ROWS PER UNIT drops (``Connection.estimate_limits``,
``dpsql.curator.dropped``). Each is priced here, next to its planner, before anything is read."""

from __future__ import annotations

from fractions import Fraction
from typing import Any

from dpsql.budget.accounting import Spend, check_accountable
from dpsql.curator.dropped import (
    DroppedPlan,
    RecordedDrop,
    dropped_statement,
    plan_dropped,
    record_key,
    release_dropped,
)
from dpsql.curator.suggest import plan_suggestion, run_suggestion
from dpsql.errors import UnsupportedQuery
from dpsql.policy.model import PrivateTable
from dpsql.query.context import MechanismContext
from dpsql.query.limits import recorded_drop
from dpsql.query.options import privacy_options
from dpsql.query.spend import Price
from dpsql.sql.names import table_key
from dpsql.sql.parse import DIALECT


def estimate_cost(epsilon: Fraction) -> Spend:
    """An estimate at ``epsilon``: pure DP, rho epsilon^2/2."""
    return Spend(epsilon, Fraction(0), epsilon ** 2 / 2)


def suggestion_price(plan: Any, epsilon: Fraction) -> Price:
    """What a suggestion costs: ``epsilon`` in all, its statements at most ``plan.statements``;
    nothing is kept for a repeat."""
    return Price(estimate_cost(epsilon), f"SUGGEST BOUNDS {plan.table}",
                 {"epsilon": epsilon, "columns": [c for c, _ in plan.columns], "group_by": plan.group_by},
                 statements=plan.statements, what="this suggestion",
                 failure="the suggestion failed while running; its cost was charged and nothing was released")


def dropped_price(plan: DroppedPlan, epsilon: Fraction) -> Price:
    """What one table's estimate of dropped rows costs, recorded under its limit's key."""
    return Price(estimate_cost(epsilon), f"ESTIMATE LIMITS {plan.table}",
                 {"epsilon": epsilon, "rows_per_unit": plan.rows_per_unit},
                 key=record_key(plan.key, plan.unit, plan.rows_per_unit),
                 failure="the estimate failed while running; its cost was charged and nothing was released")


def suggest(context: MechanismContext, table: str, epsilon: Any, columns: Any, group_by: str | None) -> dict:
    """``Connection.suggest_bounds`` (its docstring): planned, charged, run adaptively."""
    if context.dialect != DIALECT:  # its statements read raw tables through DuckDB-only pieces
        raise UnsupportedQuery("suggest_bounds runs on DuckDB only: this connection is on Spark",
                               hint="run it on a DuckDB sample of the table (dpsql.connect(frames, ...)), "
                                    "then write the bounds into the policy")
    policy = context.policy
    epsilon = privacy_options(policy, epsilon, None, None).epsilon
    plan = plan_suggestion(policy, context.catalog, table_key, table, epsilon, columns, group_by)
    price = suggestion_price(plan, epsilon)
    check_accountable(policy.accounting, price.spend)
    source, dialect = context.source, context.dialect
    return context.spender.spend(price, lambda fetch: run_suggestion(plan, fetch, source, dialect)).released


def estimate_drops(context: MechanismContext, epsilon: Any, tables: Any,
                   only_missing: bool) -> dict[str, RecordedDrop]:
    """``Connection.estimate_limits`` (its docstring): one charge per table, each recorded."""
    policy, spender = context.policy, context.spender
    epsilon = privacy_options(policy, epsilon, None, None).epsilon
    names = [t.name for t in policy.private_tables] if tables is None else \
        [tables] if isinstance(tables, str) else list(tables)
    plans = []
    for name in names:
        rule = policy.table(name)
        if not isinstance(rule, PrivateTable):
            private = ", ".join(t.name for t in policy.private_tables) or "none"
            raise UnsupportedQuery(f"{name} is not a private table of the policy",
                                   hint=f"name one of the private tables: {private}")
        plan = plan_dropped(rule, table_key(rule.name), epsilon)
        if plan is None or (only_missing and recorded_drop(spender, plan.key, plan.unit, plan.rows_per_unit)):
            continue  # a row-level table drops no row
        plans.append(plan)
    check_accountable(policy.accounting, estimate_cost(epsilon))
    recorded = {}
    for plan in plans:
        counting = dropped_statement(plan, context.dialect)  # rendered before the charge

        def release(fetched: list[list[tuple]], plan: DroppedPlan = plan) -> RecordedDrop:
            kept, dropped, no_unit = fetched[0][0]
            return release_dropped(plan, (int(kept), int(dropped), int(no_unit)), context.source)

        recorded[plan.table] = spender.spend_statements(dropped_price(plan, epsilon), [counting], release,
                                                        RecordedDrop.to_json).released
    return recorded
