"""``Connection.workload``: plan a workload (``dpsql.calls.workload``), price it, hand its one
histogram statement to the executor, run MWEM on the result (``dpsql.mechanisms.mwem``).

Everything up to the charge is static: the queries are checked, the histogram statement is
prepared and rendered by the ordinary pipeline (``Preparer.prepare``), the KEYS domains are read
(public data), the coefficient vectors computed on public cells, the budget split and the cost
fixed. Then the executor charges the ledger, runs the statement, and MWEM releases; the ledger
entry records the workload's query texts and the released answers, so that the same workload
with the same options, policy and analyst returns its earlier answer at no cost.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

import numpy as np
from sqlglot import exp

from dpsql.analysis.analyse import SAMPLER_LIMITS
from dpsql.analysis.plan import Plan
from dpsql.answer.result import Budget, DPResult, QueryCost
from dpsql.backends.rewrite import BoundedStatement, domain_sql
from dpsql.budget.accounting import Spend, rho_budget
from dpsql.calls.mechanism import Mechanism
from dpsql.calls.workload import (
    MAX_BYTES,
    WorkloadQuery,
    cell_labels,
    check_size,
    check_workload,
    coefficient_vectors,
    read_columns,
)
from dpsql.errors import InvalidParameter, UnsupportedQuery
from dpsql.mechanisms.mwem import (
    CHECK_SHARE,
    MwemPlan,
    MwemRelease,
    Round,
    Workload,
    checked_half_width,
    default_rounds,
    feasible_range,
    measured_half_width,
    plan_mwem,
    query_sensitivities,
    run_mwem,
)
from dpsql.query.context import MechanismContext
from dpsql.query.options import privacy_options
from dpsql.query.spend import Price
from dpsql.sql.normalise import repeat_key
from dpsql.sql.parse import DIALECT

COLUMNS = ["query", "cell", "answer", "measured"]
"""The columns of a workload's answer: the query's number (from 1), its GROUP BY cell as text
(NULL for an ungrouped query), the released answer, and whether it was measured directly."""
TYPES = ["INTEGER", "VARCHAR", "DOUBLE", "BOOLEAN"]


@dataclass(frozen=True)
class WorkloadPlan:
    """Everything about a workload decided before the charge."""

    queries: tuple[WorkloadQuery, ...]
    histogram: Plan
    """The prepared histogram query's plan (its bounded statement is ``statement``)."""
    statement: BoundedStatement
    """The rendered histogram statement (``BoundedStatement``)."""
    columns: tuple[str, ...]
    domains: tuple[tuple, ...]
    """Each column's KEYS domain, as read back from the engine."""
    workload: Workload
    sensitivities: tuple[Fraction, ...]
    mwem: MwemPlan
    cost: Spend
    normal: str
    """The ledger's text: every query's normalised SQL."""
    key: str
    """The repeat key."""
    types: tuple[str, ...] = ()
    """Each column's DuckDB type."""
    literals: tuple[tuple, ...] = ()
    """Each column's domain values as SQL literals (for coefficient vectors of later queries)."""

    def price(self) -> Price:
        """What the workload costs, charged once: its one histogram statement."""
        return Price(self.cost, self.normal,
                     {"epsilon": self.mwem.epsilon, "delta": self.mwem.delta, "rounds": self.mwem.rounds,
                      "mechanism": "mwem"},
                     key=self.key, statements=1,
                     failure="the workload failed while running; its cost was charged and nothing was released")


def histogram_reach(plan: Plan) -> int:
    """R, the largest total one unit adds to the exact histogram, read off the plan's count
    sensitivity (``dpsql.analysis.sensitivity``): a count's L1 is R for add/remove, and 2R for
    a replaced unit over groups (R ungrouped)."""
    l1 = plan.measures[0].sensitivity.l1
    if plan.neighbours == "bounded" and plan.query.keys:
        l1 = l1 / 2
    if l1.denominator != 1:
        raise UnsupportedQuery("the histogram's sensitivity is not a whole number of rows")
    return int(l1)


def plan_workload(context: MechanismContext, queries: Any, epsilon: Any, delta: Any, rounds: Any,
                  mwem_noise: bool = True) -> WorkloadPlan:
    """The static half of ``Connection.workload`` (reads no private data, charges nothing);
    ``mwem_noise=False`` (a PMW session, which draws and checks its own noise) skips the check of
    MWEM's noise scales."""
    options = privacy_options(context.policy, epsilon, delta, None)
    table, checked = check_workload(queries, context.policy, context.catalog)
    columns = read_columns(checked)
    ident = [exp.to_identifier(c, quoted=True) for c in columns]
    select = exp.select(*[exp.column(i) for i in ident], exp.Count(this=exp.Star())).from_(
        exp.to_identifier(table, quoted=True))
    if ident:
        select = select.group_by(*[exp.column(i.copy()) for i in ident])
    prepared = context.prepare(select.sql(dialect=DIALECT), options.epsilon, 0, "laplace")
    plan, priced = prepared.plan, prepared.priced
    if plan is None or priced is None or plan.selection is not None or \
            any(key.domain is None for key in plan.query.keys):
        raise UnsupportedQuery("the workload's columns need public KEYS domains",
                               hint="read only columns with KEYS in the policy")
    domains, literals = [], []
    for key in plan.query.keys:
        sql = domain_sql([key], [key.type_name or ""], dialect=context.dialect)
        values = [row[0] for row in context.read_keys(context.fetch_public(sql), [key])]
        domains.append(values)
        literals.append([exp.Literal.string(v) if isinstance(v, str) else exp.convert(v) for v in values])
    check_size(columns, [len(d) for d in domains], checked)
    types = [key.type_name or "VARCHAR" for key in plan.query.keys]
    workload = coefficient_vectors(checked, columns, types, domains, literals)
    reach = histogram_reach(plan)
    sensitivities = query_sensitivities(workload, reach, plan.neighbours)
    live = sorted({d for d in sensitivities if d > 0})
    if not live:
        raise UnsupportedQuery("every query of the workload is 0 whatever the data (no cell of the KEYS "
                               "domains satisfies its predicates)", hint="check the predicates' values")
    if rounds is None:
        rounds = default_rounds(sum(1 for d in sensitivities if d > 0), options.epsilon)
    elif isinstance(rounds, bool) or not isinstance(rounds, int) or not 1 <= rounds <= MAX_ROUNDS:
        raise InvalidParameter(f"rounds must be a whole number from 1 to {MAX_ROUNDS}, got {rounds!r}",
                               hint="pass rounds=10, or leave it out for the default rule")
    cells = math.prod(len(d) for d in domains) + 1 if domains else 1
    if 8 * cells * rounds > MAX_BYTES:  # each round keeps its measured query's vector over the cells
        raise UnsupportedQuery(f"{rounds} rounds over {cells:,} cells would keep about "
                               f"{8 * cells * rounds / 2 ** 20:,.0f} MB of measured vectors; the limit is "
                               f"{MAX_BYTES // 2 ** 20} MB", hint="ask for fewer rounds, or read fewer columns")
    mwem = plan_mwem(options.epsilon, options.delta, rounds, reach, rho_budget)
    if mwem_noise:
        check_scales(mwem, [mwem.total_scale(), mwem.check_scale(), *(mwem.measure_scale(d) for d in live)], rounds)
    cost = Spend(mwem.epsilon, mwem.delta, mwem.rho)
    normal = "WORKLOAD MWEM\n" + ";\n".join(q.normal for q in checked)
    rule = plan.query.rule
    repeat = repeat_key(normal, options={"epsilon": str(mwem.epsilon), "delta": str(mwem.delta), "rounds": rounds,
                                         "mechanism": "mwem", "neighbours": plan.neighbours,
                                         "check": str(CHECK_SHARE),
                                         "limits": [rule.unit, rule.max_rows_per_unit, rule.max_groups_per_unit]},
                        policy_text=context.policy_text, analyst=context.analyst)
    return WorkloadPlan(tuple(checked), plan, priced.bounded, tuple(columns), tuple(tuple(d) for d in domains),
                        workload, tuple(sensitivities), mwem, cost, normal, repeat, tuple(types),
                        tuple(tuple(v) for v in literals))


MAX_ROUNDS = 1000
"""The most rounds a workload may ask for: the work after the charge grows with their square."""


def check_scales(mwem: MwemPlan, scales: list[Fraction], rounds: int) -> None:
    """Refuse, before the charge, a workload whose noise the exact samplers cannot draw (an epsilon
    too small for its rounds and sensitivities): after the charge it could only fail."""
    limit = SAMPLER_LIMITS[mwem.noise]
    if max(scales) >= limit:
        raise InvalidParameter(f"epsilon {float(mwem.epsilon):g} is too small for {rounds} rounds of this workload: "
                               "its noise would be beyond what the exact samplers draw",
                               hint="use a larger epsilon, fewer rounds, or queries with smaller coefficients")


def exact_histogram(planned: WorkloadPlan, rows: list[tuple]) -> np.ndarray:
    """The exact rows (keys, count) as a vector over the cells; a key outside its domain (the
    outside cell's NULLs) goes to the outside cell. Total: nothing here can fail on data."""
    sizes = [len(d) for d in planned.domains]
    cells = math.prod(sizes) + 1
    lookups = [{value: i for i, value in enumerate(domain)} for domain in planned.domains]
    stride = [math.prod(sizes[i + 1:]) for i in range(len(sizes))]
    histogram = np.zeros(cells if planned.columns else 1, dtype=np.int64)
    for row in rows:
        count = int(row[-1])
        if not planned.columns:
            histogram[0] += count
            continue
        index = 0
        for position, value in enumerate(row[:-1]):
            found = lookups[position].get(value) if value is not None else None
            if found is None:
                index = cells - 1
                break
            index += found * stride[position]
        histogram[index] += count
    return histogram


def answer_workload(context: MechanismContext, queries: Any, epsilon: Any, delta: Any, rounds: Any) -> DPResult:
    """``Connection.workload`` (its docstring)."""
    planned = plan_workload(context, queries, epsilon, delta, rounds)

    def replay(text: str) -> MwemRelease | None:
        release = _decode(text)
        return release if release is not None and len(release.values) == planned.workload.size else None

    def release_rows(fetched: list[list[tuple]]) -> MwemRelease:
        rows = context.read_keys(fetched[0], planned.histogram.query.keys)
        return run_mwem(planned.mwem, planned.workload, planned.sensitivities,
                        exact_histogram(planned, rows), context.source)

    spent = context.spender.spend_statements(planned.price(), [planned.statement], release_rows, _encode, replay)
    return _result(planned, spent.released, spent.cost, spent.budget)


def _result(planned: WorkloadPlan, release: MwemRelease, cost: QueryCost, budget: Budget | None) -> DPResult:
    rows, kinds = [], []
    s = 0
    for number, query in enumerate(planned.queries, start=1):
        for label in cell_labels(query, list(planned.columns), [list(d) for d in planned.domains],
                                 [key.type_name or "" for key in planned.histogram.query.keys]):
            rows.append((number, label, float(release.values[s]), bool(release.measurements[s])))
            kinds.append(s)
            s += 1
    sensitivities, mwem = planned.sensitivities, planned.mwem
    low, high = feasible_range(planned.workload)

    def intervals(alpha: float) -> dict[str, list[tuple[float, float, float]]]:
        cells = []
        for s in kinds:
            taken = release.measurements[s]
            if sensitivities[s] == 0:
                centre, half = 0.0, 0.0
            elif taken:   # around the measurements' mean, before it was cut to the feasible range
                centre, half = sum(taken) / len(taken), measured_half_width(mwem, sensitivities[s], len(taken), alpha)
            else:
                centre, half = release.values[s], checked_half_width(mwem, sensitivities[s], release.check, alpha)
            # the truth lies in [low, high]: cutting the interval to it keeps the truth, and the answer
            cells.append((float(min(max(centre - half, low[s]), high[s])),
                          float(min(max(centre + half, low[s]), high[s])), half))
        return {"answer": cells}

    measured = sum(1 for m in release.measurements if m)
    kind = "discrete Laplace" if mwem.noise == "laplace" else "discrete Gaussian"
    notes = (f"MWEM over {planned.workload.cells:,} cells: {mwem.rounds} rounds measured {measured} of "
             f"{planned.workload.size:,} queries ({kind} noise, ± that noise's); the others are answered from the "
             f"synthetic data of round {release.chosen + 1}, their ± from a noisy check of their largest error "
             f"({float(CHECK_SHARE):.0%} of the budget), which holds for all of them at once",
             "counts are cut at 0 (and their intervals with them): post-processing, no cost",
             "rows whose value is outside a column's KEYS domain (or NULL) count in COUNT(*) but match no "
             "predicate on that column")
    return DPResult(list(COLUMNS), rows, cost, intervals=intervals, types=list(TYPES), notes=notes,
                    budget=budget)


def _encode(release: MwemRelease) -> str:
    return json.dumps({"mechanism": "mwem", "total": release.total, "values": list(release.values),
                       "measurements": [list(m) for m in release.measurements],
                       "rounds": [[r.selected, r.measured] for r in release.rounds],
                       "chosen": release.chosen, "check": release.check}, separators=(",", ":"))


def _decode(text: str) -> MwemRelease | None:
    try:
        data = json.loads(text)
        if data.get("mechanism") != "mwem":
            return None
        return MwemRelease(int(data["total"]), tuple(float(v) for v in data["values"]),
                           tuple(tuple(int(v) for v in m) for m in data["measurements"]),
                           tuple(Round(int(a), int(b)) for a, b in data["rounds"]),
                           int(data["chosen"]), int(data["check"]))
    except (ValueError, KeyError, TypeError):
        return None


OPTIONS = ("epsilon", "delta", "rounds")
"""The options of ``SELECT * FROM workload('SELECT ...', ..., epsilon = 1, delta = ..., rounds = T)``."""


def explain_workload(context: MechanismContext, queries: Any, epsilon: Any = None, delta: Any = None,
                     rounds: Any = None) -> str:
    """What a workload would run and cost: the histogram statement, the domain, the split of the
    budget and the cost; reads no private data (the KEYS domains are public)."""
    planned = plan_workload(context, queries, epsilon, delta, rounds)
    mwem = planned.mwem
    sizes = " × ".join(f"{c} ({len(d)})" for c, d in zip(planned.columns, planned.domains)) or "no column"
    live = [d for d in planned.sensitivities if d > 0]
    lines = [f"MWEM workload: {len(planned.queries)} queries, {planned.workload.size:,} answers, over "
             f"{planned.workload.cells:,} cells ({sizes}, plus one for values outside them)",
             f"exact histogram (one statement, charged once):\n{planned.statement.sql}",
             f"one unit adds at most {mwem.reach} rows to it; the queries' sensitivities range from "
             f"{_shown(min(live))} to {_shown(max(live))}",
             f"{mwem.rounds} rounds; "
             + (f"n̂ at epsilon {_shown(mwem.total_epsilon)}, each round's selection at epsilon "
                f"{_shown(mwem.select_epsilon)} and measurement at epsilon {_shown(mwem.measure_epsilon)}, "
                f"the check of the synthetic answers' largest error at epsilon {_shown(mwem.check_epsilon)} "
                "(discrete Laplace); basic composition" if mwem.noise == "laplace" else
                f"zCDP: n̂ at rho {_shown(mwem.total_rho)}, each round's selection at epsilon "
                f"{_shown(mwem.select_epsilon)} (rho ε²/8, bounded range) and measurement at rho "
                f"{_shown(mwem.measure_rho)}, the check of the synthetic answers' largest error at rho "
                f"{_shown(mwem.check_rho)} (discrete Gaussian)"),
             f"cost: epsilon {_shown(mwem.epsilon)}, delta {_shown(mwem.delta)}, rho {_shown(mwem.rho)}"]
    if context.spender.stored(planned.key) is not None:
        lines.append("asked before: the stored release is returned, free")
    return "\n".join(lines)


def _shown(value: Fraction) -> str:
    return format(float(value), ".6g")


def _answer_call(connection: Any, queries: list[str], options: dict[str, Any]) -> DPResult:
    return connection.workload(queries, **options)


def _explain_call(connection: Any, queries: list[str], options: dict[str, Any]) -> str:
    return explain_workload(connection.mechanism_context(), queries, **options)


MECHANISM = Mechanism(_answer_call, _explain_call, OPTIONS)
"""What ``SELECT * FROM workload(...)`` calls (listed in ``dpsql.calls.registry.MECHANISMS``)."""
