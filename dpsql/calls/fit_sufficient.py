"""``db.fit`` of a linear model from noisy sufficient statistics: one statement, charged once.

The training rows are those of ``dpsql.calls.fit`` (the same checks, the same bounded copy, every
column clamped into its bounds on its grid). One statement sums, per unit, n, each column and
each product of a feature with a feature or with the target, clamps each unit's totals, and adds
them up exactly over units (``dpsql.calls.fit_sql.sufficient_statement``); the noise, the clamps'
derivation and the solve are ``dpsql.mechanisms.sufficient``'s. The fitted model is ordinary
least squares over the (clamped) rows: every row weighs the same, as in OLS, and one unit's
weight is bounded by its clamped totals instead of by an average.

Cost: rho = rho_budget(epsilon, delta), split equally over the statistics; charged as (epsilon,
delta) with that rho. The ledger records the fit and its noisy statistics; the same fit again is
a free repeat, the same model and the same intervals.
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import dataclass
from fractions import Fraction
from typing import Any, Sequence

from sqlglot import exp

from dpsql.analysis.plan import Plan
from dpsql.analysis.sensitivity import Sensitivity, bounded_sum_sensitivity, unit_total_sensitivity
from dpsql.answer.result import DPResult
from dpsql.backends.rewrite import BoundedStatement
from dpsql.budget.accounting import Spend, check_accountable, rho_budget
from dpsql.calls.fit import FittedModel, plan_training, sampled
from dpsql.calls.fit_sql import FitColumns, sufficient_statement
from dpsql.errors import InternalError, UnsupportedQuery
from dpsql.mechanisms.noise import discrete_gaussian
from dpsql.mechanisms.sufficient import (
    LARGEST_BOUND,
    TARGET_SIGMA,
    WEIGHTS,
    Column,
    Statistic,
    bootstrap_halfwidths,
    clamp_interval,
    fitted_column,
    layout,
    row_interval,
    solve,
)
from dpsql.query.context import MechanismContext
from dpsql.query.spend import Price


@dataclass(frozen=True)
class SufficientPlan:
    """A linear fit from sufficient statistics, planned before the charge."""

    text: str
    features: tuple[str, ...]
    target: str
    plan: Plan
    columns: FitColumns
    fitted: tuple[Column, ...]
    """Each column as the statistics read it: grid, bounds, centre, per-unit bounds."""
    statistics: tuple[Statistic, ...]
    statement: BoundedStatement
    rows_per_unit: int
    neighbours: str
    cost: Spend
    epsilon: Fraction
    delta: Fraction
    normal: str
    repeat_key: str

    model = "linear"

    def key(self) -> str:
        text = json.dumps(["fit-sufficient", self.repeat_key, self.target, list(self.features), str(self.epsilon),
                           str(self.delta)])
        return "fit:" + hashlib.sha256(text.encode()).hexdigest()

    def price(self) -> Price:
        return Price(self.cost, f"FIT LINEAR {self.target} ON {', '.join(self.features)} (sufficient statistics) "
                                f"OF {self.normal}",
                     {"mechanism": "fit", "method": "sufficient", "model": "linear", "target": self.target,
                      "epsilon": self.epsilon, "delta": self.delta, "neighbours": self.neighbours},
                     key=self.key(), statements=1, what="a fit from sufficient statistics",
                     failure="the fit failed while running; its cost was charged and no model was released")

    def unit_bounded(self) -> list[str]:
        """The columns whose BOUNDS PER UNIT clamp the statistics."""
        names = (*self.features, self.target)
        return [name for name, column in zip(names, self.fitted) if column.unit_bounds is not None]


def _unit_bounds(plan: Plan, measure_index: int, grid: Fraction) -> tuple[int, int] | None:
    """A bare policy column's BOUNDS PER UNIT in grid steps (rounded inward), when the fit reads
    it with the policy's own row bounds (a CLAMP of other bounds, or an expression, has none)."""
    aggregate = plan.aggregates[measure_index]
    measure = plan.measure(aggregate.measures[0])
    if not isinstance(measure.argument, exp.Column) or len(measure.clamped_columns) != 1:
        return None
    clamped = measure.clamped_columns[0]
    rule = plan.query.rule.column(clamped.name)
    if rule is None or rule.unit_bounds is None or rule.bounds is None:
        return None
    if (Fraction(rule.bounds.lower), Fraction(rule.bounds.upper)) != (clamped.lower, clamped.upper):
        return None
    low, high = Fraction(rule.unit_bounds.lower) / grid, Fraction(rule.unit_bounds.upper) / grid
    return math.ceil(low), math.floor(high)


def plan_sufficient(context: MechanismContext, sql: Any, target: Any, epsilon: Any = None,
                    delta: Any = None) -> SufficientPlan:
    """Check the arguments and plan the fit (reads no data; refusals name the construct)."""
    if sampled(sql):
        raise UnsupportedQuery("a fit from sufficient statistics reads every unit once: a Poisson sample "
                               "(TABLESAMPLE) saves it nothing", line=1, col=1,
                               hint="leave the sample out, or pass method='gradient' for DP-SGD")
    training = plan_training(context, sql, target, "linear", epsilon, delta)
    plan, columns = training.plan, training.columns
    rows_per_unit = plan.query.rule.max_rows_per_unit
    fitted = [fitted_column(Fraction(grid), lower, upper, _unit_bounds(plan, index, Fraction(grid)), rows_per_unit)
              for index, (lower, upper, grid) in enumerate(zip(columns.lower, columns.upper, columns.grids))]
    policy = context.policy
    rho = rho_budget(training.epsilon, training.delta)
    stats = statistics(fitted, rows_per_unit, policy.neighbours, rho)
    cost = Spend(training.epsilon, training.delta, rho)
    check_accountable(policy.accounting, cost)
    statement = sufficient_statement(plan, columns, [c.offset for c in fitted],
                                     [(s.factors, s.lower, s.upper, s.scale) for s in stats], context.dialect)
    return SufficientPlan(sql, training.features, training.target, plan, columns, tuple(fitted), tuple(stats),
                          statement, rows_per_unit, policy.neighbours, cost, training.epsilon, training.delta,
                          training.priced.normal_sql, training.priced.repeat_key)


def _coarse(value: int, scale: int, inward_up: bool) -> int:
    """``value`` in steps of ``scale``, rounded inward (up for a lower bound, down for an upper)."""
    return -((-value) // scale) if inward_up else value // scale


def statistics(columns: Sequence[Column], rows_per_unit: int, neighbours: str, rho: Fraction) -> list[Statistic]:
    """Every statistic with its clamp, grid and noise, for a fit costing ``rho`` (zCDP)."""
    factors_list = layout(len(columns) - 1)
    weights = [WEIGHTS[len(factors)] for factors in factors_list]
    out = []
    for factors, weight in zip(factors_list, weights):
        share = rho * weight / sum(weights)
        (low, high), unit_bounded = clamp_interval(factors, columns, rows_per_unit)
        fine = unit_total_sensitivity(low, high, groups_per_unit=1, neighbours=neighbours, grouped=False)
        sigma = math.sqrt(float(fine.l2_squared) / (2 * float(share))) if fine.l2_squared else 0.0
        scale = 1
        while sigma / (scale * 2) >= TARGET_SIGMA:
            scale *= 2
        lower, upper = _coarse(low, scale, True), _coarse(high, scale, False)
        if lower > upper:  # a one-point interval between two coarse steps: keep a point inside it
            lower = upper = _coarse(low, scale, False)
        if max(abs(lower), abs(upper)) > LARGEST_BOUND:
            raise InternalError(f"a sufficient statistic's clamp [{lower}, {upper}] is past 2^52 steps")
        sensitivity = unit_total_sensitivity(lower, upper, groups_per_unit=1, neighbours=neighbours, grouped=False)
        sigma_squared = sensitivity.l2_squared / (2 * share) if sensitivity.l2_squared else Fraction(0)
        spent = share if sensitivity.l2_squared else Fraction(0)
        assert sensitivity.l1 ** 2 == sensitivity.l2_squared  # one coordinate
        name = "n" if not factors else "sum(" + "*".join(f"c{f}" for f in factors) + ")"
        out.append(Statistic(name, factors, lower, upper, scale, sensitivity.l1, sigma_squared, spent, unit_bounded))
    return out


def rows_rule_sensitivity(statistic: Statistic, columns: Sequence[Column], rows_per_unit: int,
                          neighbours: str) -> Sensitivity:
    """The rows rule's bound on the same statistic, in its released steps (for comparison and
    tests: the clamp's rule is never above it, up to the coarse grid's rounding)."""
    low, high = row_interval(statistic.factors, columns)
    fine = bounded_sum_sensitivity(min(low, high), high, rows_per_unit=rows_per_unit, neighbours=neighbours,
                                   grouped=False)
    return Sensitivity(fine.l1 / statistic.scale, fine.l2_squared / statistic.scale ** 2)


def release_statistics(fit: SufficientPlan, exact: list[int], source: Any = None) -> list[int]:
    """The exact statistics plus their noise (none where one unit cannot move a statistic)."""
    noisy = []
    for value, statistic in zip(exact, fit.statistics):
        noise = int(discrete_gaussian(statistic.sigma_squared, 1, source)[0]) if statistic.sigma_squared else 0
        noisy.append(value + noise)
    return noisy


def run_sufficient(context: MechanismContext, fit: SufficientPlan) -> FittedModel:
    """Charge ``fit``, run its statement and release (or replay a stored fit), through the spender."""
    def run(fetch) -> dict:
        row = fetch(fit.statement)[0]
        return {"statistics": release_statistics(fit, [int(v or 0) for v in row], context.source)}

    spent = context.spender.spend(fit.price(), run, json.dumps, json.loads)
    return model_of(fit, spent.released["statistics"], spent.cost, spent.budget, spent.entry)


def model_of(fit: SufficientPlan, released: list[int], cost: Any, budget: Any, entry: int | None) -> FittedModel:
    """The fitted model and its table from the released statistics (post-processing)."""
    solution = solve(released, fit.statistics, fit.fitted)
    values = [solution.intercept, *solution.coefficients]
    rows = [("intercept", solution.intercept)] + list(zip(fit.features, solution.coefficients))

    def intervals(alpha: float) -> dict[str, list[tuple[float, float, float]]]:
        if solution.ridge > 0:  # the ridge's bias is not in the bootstrap: measured, it undercovered
            return {"coefficient": [(math.nan, math.nan, math.nan)] * len(values)}
        halves = bootstrap_halfwidths(released, fit.statistics, fit.fitted, alpha)
        return {"coefficient": [(v - float(h), v + float(h), float(h)) for v, h in zip(values, halves)]}

    count = released[0] * fit.statistics[0].scale
    bounded = fit.unit_bounded()
    notes = [f"linear regression of {fit.target} by least squares on noisy sufficient statistics (n, sums, X'X, "
             f"X'y), released once over about {max(count, 0):,} rows (a noisy count); coefficients in the "
             "columns' own units; ± by parametric bootstrap from the statistics' noise (it leaves out the "
             "clamps' bias)",
             "per-unit totals clamped by BOUNDS PER UNIT of " + ", ".join(bounded) if bounded else
             f"per-unit totals bounded by {fit.rows_per_unit} rows × the row bounds (no BOUNDS PER UNIT)"]
    if solution.ridge > 0:
        notes.append(f"the noisy X'X was not safely positive definite: a ridge of {solution.ridge:.3g} (in units of "
                     "its noise) was added before solving, which shrinks the coefficients; no ± is stated (raise "
                     "epsilon, or narrow the bounds with BOUNDS PER UNIT)")
    result = DPResult(["term", "coefficient"], rows, cost, intervals=intervals, types=["VARCHAR", "DOUBLE"],
                      budget=budget, notes=notes)
    bounds = fit.columns.bounds()[:-1]
    return FittedModel("linear", fit.features, fit.target, bounds, solution.intercept, solution.coefficients,
                       result, entry, method="sufficient")
