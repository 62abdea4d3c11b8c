"""``SELECT * FROM synthesize(table = 't', columns = 'a, b, c', epsilon = 1, delta = 1e-6, method = 'aim',
name = 't_synth')``: ``db.synthesize`` (``dpsql.calls.synthesize``) in SQL, for the shell, ``dpsql query``
and psql. It answers one row summing up the release (its name, source, method, rows, the marginals
measured and the cost); the synthetic table itself is its owner's, kept by the connection's store.
"""

from __future__ import annotations

from fractions import Fraction
from typing import Any

from dpsql.answer.result import DPResult
from dpsql.budget.accounting import Spend
from dpsql.calls.mechanism import Mechanism
from dpsql.calls.synthesize import MAX_MODEL_CELLS, plan_synthesis
from dpsql.mechanisms.aim import MEASURE_SHARE, ROUNDS_PER_COLUMN
from dpsql.mechanisms.synthesis import TOTAL_SHARE
from dpsql.query.synthetic_answering import distinct_marginals

OPTIONS = ("table", "columns", "epsilon", "delta", "method", "rows", "name")
"""The call's options, as ``db.synthesize`` takes them (``columns`` comma-separated)."""
COLUMNS = ["name", "source", "method", "rows", "columns", "marginals", "epsilon", "delta", "rho"]
TYPES = ["VARCHAR", "VARCHAR", "VARCHAR", "BIGINT", "VARCHAR", "INTEGER", "DOUBLE", "DOUBLE", "DOUBLE"]


def _arguments(options: dict[str, Any]) -> dict[str, Any]:
    return {"table": options.get("table"), "columns": options.get("columns"), "epsilon": options.get("epsilon"),
            "delta": options.get("delta"), "method": options.get("method", "aim"), "rows": options.get("rows"),
            "name": options.get("name")}


def _answer(connection: Any, queries: list[str], options: dict[str, Any]) -> DPResult:
    _no_queries(queries)
    arguments = _arguments(options)
    release = connection.synthesize(arguments.pop("table"), arguments.pop("columns"), arguments.pop("epsilon"),
                                    arguments.pop("delta"), **arguments)
    spender = connection.mechanism_context().spender
    cost = spender.charged(Spend(Fraction(release.epsilon), Fraction(release.delta), Fraction(release.rho)))
    marginals = distinct_marginals(release)  # as synthetic_tables() counts them: AIM may measure one twice
    row = (release.name, release.source, release.method, release.rows, ", ".join(release.table.columns), marginals,
           release.epsilon, release.delta, release.rho)
    note = (f"a synthetic table of {release.rows:,} rows from {marginals} noisy marginals of {release.source} "
            f"({release.method.upper()}), charged once; queries over it are post-processing")
    return DPResult(list(COLUMNS), [row], cost, types=list(TYPES), notes=[note], budget=spender.snapshot())


def _no_queries(queries: list[str]) -> None:
    if queries:
        from dpsql.errors import UnsupportedQuery

        raise UnsupportedQuery("synthesize() takes options only, no query",
                               hint="write SELECT * FROM synthesize(table = 't', columns = 'a, b', epsilon = 1, "
                                    "delta = 1e-6)")


def _explain(connection: Any, queries: list[str], options: dict[str, Any]) -> str:
    _no_queries(queries)
    arguments = _arguments(options)
    planned = plan_synthesis(connection.mechanism_context(), **arguments)
    cells = ", ".join(f"{c.name} ({c.size})" for c in planned.columns)
    bins = "; ".join(f"{c.name}: {', '.join(c.labels)}" for c in planned.columns if c.numeric) or "none"
    count_rho = planned.rho * TOTAL_SHARE
    if planned.method == "mst":
        split = ("MST: a third of the rest measures the one-way marginals, a third chooses a spanning tree of "
                 "column pairs (exponential mechanism), a third measures the pairs chosen")
    else:
        split = (f"AIM: rounds of a choice (exponential mechanism, {float(1 - MEASURE_SHARE):.0%} of a round) and a "
                 f"measurement ({float(MEASURE_SHARE):.0%}), sized for {ROUNDS_PER_COLUMN} rounds per column after "
                 "the one-way marginals, until the rest is spent; models up to "
                 f"{MAX_MODEL_CELLS:,} cells")
    return "\n".join([
        f"synthesize {planned.table} as {planned.name} by {planned.method.upper()}: columns {cells} "
        f"(cells from the policy; bins {bins})",
        f"one statement counts the bounded copy's rows (at most {planned.reach} per unit) in "
        f"{len(planned.cliques) - 1} candidate marginals and the total:\n{planned.statement.sql}",
        f"rho {float(planned.rho):.6g} in all: {float(count_rho):.6g} for the noisy row count; {split}",
        f"cost: epsilon {float(planned.epsilon):g}, delta {float(planned.delta):g}, rho {float(planned.rho):.6g}, "
        "charged once"])


MECHANISM = Mechanism(_answer, _explain, OPTIONS)
"""What ``SELECT * FROM synthesize(...)`` calls (listed in ``dpsql.calls.registry.MECHANISMS``)."""
