"""``db.fit``'s choice of method: noisy sufficient statistics (``dpsql.calls.fit_sufficient``) or
noisy gradient descent (``dpsql.calls.fit``).

``method='auto'`` (the default) fits a linear model from sufficient statistics, one pass and no
tuning, when a unit's totals are bounded tightly: every column of the fit reads its ``BOUNDS PER
UNIT``, or each unit has one row (``MAX ROWS PER UNIT 1``); and by descent otherwise, or when the
call asks for descent (``steps``, ``clip`` or ``learning_rate``) or reads a Poisson sample
(DP-SGD). A logistic model has no sufficient statistics and always descends. The choice reads the
policy and the query, never the data. Why: bounded by k rows of row bounds alone, a unit's totals
(and so the statistics' noise) grow with k, while descent averages a unit's rows before its clip.
On flights (k = 300, no per-unit bounds) the slope from sufficient statistics had a spread of 0.37
against descent's 0.018; with per-unit bounds, 0.042 in one statement against descent's 62
(docs/models.md).
"""

from __future__ import annotations

from typing import Any

from dpsql.calls.fit import DEFAULT_CLIP, DEFAULT_STEPS, FitPlan, FittedModel, plan_fit, run_fit, sampled
from dpsql.calls.fit_sufficient import SufficientPlan, plan_sufficient, run_sufficient
from dpsql.errors import InvalidParameter
from dpsql.mechanisms.descent import check_model
from dpsql.query.context import MechanismContext

METHODS = ("auto", "sufficient", "gradient")


def chosen_method(model: str, method: Any, sql: Any, descent: bool) -> str:
    """``sufficient`` or ``gradient`` (module docstring); refuses a combination that cannot be.

    >>> chosen_method("linear", "auto", "SELECT x, y FROM t", False), chosen_method("logistic", "auto", "", False)
    ('sufficient', 'gradient')
    """
    if method not in METHODS:
        raise InvalidParameter(f"method must be 'auto', 'sufficient' or 'gradient', got {method!r}",
                               hint="pass method='sufficient' (linear, one pass) or method='gradient' (noisy descent)")
    if method == "sufficient":
        if model != "linear":
            raise InvalidParameter("method='sufficient' fits linear models only: a logistic model has no "
                                   "sufficient statistics", hint="leave method out (gradient descent)")
        if descent:
            raise InvalidParameter("steps, clip and learning_rate are gradient descent's options; "
                                   "method='sufficient' takes none", hint="leave them out, or pass method='gradient'")
        return "sufficient"
    if method == "gradient" or model != "linear" or descent or sampled(sql):
        return "gradient"
    return "sufficient"


def plan_model(context: MechanismContext, sql: Any, target: Any, model: Any = "linear", epsilon: Any = None,
               delta: Any = None, steps: Any = None, clip: Any = None, learning_rate: Any = None,
               method: Any = "auto") -> FitPlan | SufficientPlan:
    """Plan the fit by the method chosen (reads no data; refusals name the construct)."""
    model = check_model(model)
    descent = steps is not None or clip is not None or learning_rate is not None
    if chosen_method(model, method, sql, descent) == "sufficient":
        planned = plan_sufficient(context, sql, target, epsilon, delta)
        if method == "sufficient" or planned.rows_per_unit == 1 or \
                all(column.unit_bounds is not None for column in planned.fitted):
            return planned
    return plan_fit(context, sql, target, model, epsilon, delta, DEFAULT_STEPS if steps is None else steps,
                    DEFAULT_CLIP if clip is None else clip, learning_rate)


def run_model(context: MechanismContext, fit: FitPlan | SufficientPlan) -> FittedModel:
    """Charge and run a planned fit, or replay it."""
    return run_sufficient(context, fit) if isinstance(fit, SufficientPlan) else run_fit(context, fit)
