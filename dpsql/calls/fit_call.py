"""The SQL form of ``db.fit`` and its explanation: ``SELECT * FROM fit('SELECT ...', target = 'y', ...)``
(``dpsql.calls.registry``), reached from psql through ``dpsql serve``, the shell and ``dpsql query``."""

from __future__ import annotations

import math
from typing import Any

from dpsql.answer.explain import Explanation
from dpsql.answer.result import DPResult
from dpsql.calls.fit import OPTIONS, FitPlan
from dpsql.calls.fit_model import plan_model
from dpsql.calls.fit_sufficient import SufficientPlan
from dpsql.calls.mechanism import Mechanism
from dpsql.errors import InvalidParameter
from dpsql.mechanisms.descent import COUNT_SHARE, MEAN_SHARE
from dpsql.query.context import MechanismContext


def explain_sufficient(context: MechanismContext, fit: SufficientPlan) -> Explanation:
    """What a fit from sufficient statistics would read, run and cost; reads no data."""
    price = fit.price()
    every = fit.columns.bounds()
    names = (*fit.features, fit.target)
    bounds = ", ".join(f"{name} in [{b.lower:g}, {b.upper:g}]" for name, b in zip(names, every))
    lines = [f"fit: linear regression of {fit.target} on {', '.join(fit.features)}, by least squares on noisy "
             "sufficient statistics (n, each column's sum, X'X, X'y), released once",
             f"rows: {fit.normal}",
             f"columns clamped into their bounds: {bounds}",
             "each statistic is a sum over units of one unit's total, clamped into an interval (at most "
             f"{fit.rows_per_unit} rows x the row bounds"
             + (f", and the BOUNDS PER UNIT of {', '.join(fit.unit_bounded())}" if fit.unit_bounded() else "") + "):"]
    for statistic in fit.statistics:
        unit = float(statistic.scale)
        for f in statistic.factors:
            unit *= float(fit.fitted[f].grid)
        term = "n (rows)" if not statistic.factors else "sum of " + " * ".join(
            f"({names[f]} - {float(fit.fitted[f].offset * fit.fitted[f].grid):g})" if fit.fitted[f].offset
            else names[f] for f in statistic.factors)
        sigma = math.sqrt(float(statistic.sigma_squared)) * unit
        lines.append(f"  {term}: one unit's total in [{statistic.lower * unit:g}, {statistic.upper * unit:g}]"
                     f"{' (per-unit bounds)' if statistic.unit_bounded else ''}; discrete Gaussian noise, sigma "
                     f"{sigma:.4g}")
    cost = fit.cost
    lines.append(f"cost: epsilon {float(cost.epsilon):g}, delta {float(cost.delta):g}"
                 f"{'' if cost.rho is None else f', rho {float(cost.rho):.6g}'} (a share of rho per statistic, "
                 "1 : 1 : 3 for the count, sums and products), charged once; the solve is post-processing")
    lines.append(fit.statement.sql)
    quote = context.spender.quote(cost, price.key)
    lines.append(quote.text)
    return Explanation("\n".join(lines), refused=quote.refusal)


def explain_fit(context: MechanismContext, fit: FitPlan | SufficientPlan) -> Explanation:
    """What the fit would read, run and cost; reads no data. A fit too long to run is refused."""
    if isinstance(fit, SufficientPlan):
        return explain_sufficient(context, fit)
    price = fit.price(context.policy.neighbours)
    context.spender.check_time(price.statements, price.what)
    every = fit.columns.bounds()
    bounds = ", ".join(f"{name} in [{b.lower:g}, {b.upper:g}]" for name, b in zip((*fit.features, fit.target), every))
    multiplier = math.sqrt(float(fit.noise.sigma_squared)) / fit.noise.norm_steps
    lines = [
        f"fit: {fit.model} regression of {fit.target} on {', '.join(fit.features)}, by {fit.steps} steps of "
        f"noisy gradient descent{'' if fit.rate is None else ' on Poisson samples of units (DP-SGD)'}",
        f"rows: {fit.normal}",
        f"columns clamped into their bounds and scaled onto [-1, 1]"
        f"{' (the target read as its class, 1 or 0)' if fit.model == 'logistic' else ''}: {bounds}",
        f"each step: per unit, the average gradient of its rows, clipped to L2 norm {fit.clip:g} (scaled units), "
        f"summed exactly over units; discrete Gaussian noise of sigma {multiplier:.4g} x clip on each of its "
        f"{len(fit.features) + 1} coordinates (one unit moves the sum by at most "
        f"{'the clip' if fit.sensitivity_factor == 1 else 'twice the clip, replace-one neighbours'})",
        f"learning rate {fit.learning_rate:g}, on the average over units of each unit's average row loss (the sum "
        f"over a noisy count of units, released once with {float(COUNT_SHARE):g} of the budget)",
    ]
    if fit.means is not None:
        lines.append(f"start: the means of the scaled columns (per unit the average of each, summed; "
                     f"{float(MEAN_SHARE):g} of the budget): the features centred on them, the intercept at the "
                     "target's")
    if fit.rate is not None:
        lines.append(f"sample: each step keeps each unit with probability {float(fit.rate):g}, by a keyed hash "
                     "with a fresh secret key per step; " +
                     ("the charge is the subsampled Gaussian's (dpsql.budget.subsampled)" if fit.amplified else
                      "under ZCDP accounting a sample saves no budget: calibrated as full batch"))
    cost = fit.cost
    lines.append(f"cost: epsilon {float(cost.epsilon):g}, delta {float(cost.delta):g}"
                 f"{'' if cost.rho is None else f', rho {float(cost.rho):.6g}'}, charged once for the whole fit")
    if fit.projection is not None:
        lines.append("the rows, projected once for the fit (each unit's id, the scaled columns and 1 / its rows; "
                     "held by the engine while the fit runs, never shown, then dropped):")
        lines.append(fit.projection.sql)
        lines.append("first step's statement over them (weights 0; later steps differ in their weights and centres "
                     "only):")
        lines.append(fit.held_statement([0.0] * (len(fit.features) + 1)).sql)
    else:
        lines.append("first step's statement (weights 0; later steps differ in their weights only):")
        lines.append(fit.statement([0.0] * (len(fit.features) + 1)).sql)
    quote = context.spender.quote(cost, price.key)
    refusal = quote.refusal
    lines.append(quote.text)
    return Explanation("\n".join(lines), refused=refusal)


def _answer_call(connection: Any, queries: list[str], options: dict[str, Any]) -> DPResult:
    return connection.fit(*_one_query(queries), **_with_target(options)).result


def _explain_call(connection: Any, queries: list[str], options: dict[str, Any]) -> str:
    context = connection.mechanism_context()
    return explain_fit(context, plan_model(context, *_one_query(queries), **_with_target(options)))


def _one_query(queries: list[str]) -> list[str]:
    if len(queries) != 1:
        raise InvalidParameter(f"fit() takes one training query, got {len(queries)}",
                               hint="write SELECT * FROM fit('SELECT x1, x2, y FROM t', target = 'y')")
    return queries


def _with_target(options: dict[str, Any]) -> dict[str, Any]:
    if "target" not in options:
        raise InvalidParameter("fit() needs a target",
                               hint="write SELECT * FROM fit('SELECT x1, x2, y FROM t', target = 'y')")
    return options


MECHANISM = Mechanism(_answer_call, _explain_call, OPTIONS)
"""What ``SELECT * FROM fit(...)`` calls (listed in ``dpsql.calls.registry.MECHANISMS``)."""
