"""``db.fit`` by noisy gradient descent: a linear or logistic model, charged once (a linear model's
default is ``dpsql.calls.fit_sufficient``; ``dpsql.calls.fit_model`` chooses).

The analyst names the training rows with an ordinary query, ``SELECT f1, f2, ..., y FROM t
[WHERE ...]`` (columns or row-level expressions, each bounded by the policy's BOUNDS or by a
CLAMP in the query), and the target among its columns. The rows are planned as ``db.sql``
plans ``SELECT SUM(f1), ..., SUM(y) FROM t [WHERE ...]``: the same checks, the same bounded
copy (at most MAX ROWS PER UNIT rows per unit), every column clamped into its bounds. Each
gradient step is then one statement over those rows, run by the engine (``dpsql.calls.fit_sql``): per
unit, the average gradient of its rows, clipped to L2 norm ``clip``, summed exactly over units;
the noise and the update are ``dpsql.mechanisms.descent``'s. The guarantee is per unit: a
unit's rows are averaged before the clip, however many rows it has, and each unit weighs the
same in the fitted loss (the average over units of each unit's average row loss).

Cost: full-batch descent (the default) spends rho = rho_budget(epsilon, delta), a twentieth on
the count of units, a tenth on the means of the scaled columns (the features are centred on them,
the intercept starts at the target's) and the rest in equal parts on the steps; it is charged as (epsilon, delta) with
that rho. With ``TABLESAMPLE POISSON (p PERCENT)`` on the table, each step reads a fresh
Poisson sample of units (its own secret key) and, under BASIC or ADVANCED accounting, the
steps cost the subsampled Gaussian's (epsilon, delta) (``dpsql.budget.subsampled``); under
ZCDP accounting a sample saves no budget (``dpsql.budget.amplification``: no amplification for
Gaussian plans there), so the fit is calibrated as full batch and the sample only saves time.

The ledger records the fit (its rows' query and every option) and the fitted weights; the same
fit again is a free repeat.
"""

from __future__ import annotations

import hashlib
import json
import math
import secrets
from dataclasses import dataclass
from fractions import Fraction
from typing import Any, Callable, Sequence

import numpy as np
from sqlglot import exp

from dpsql.analysis.plan import Plan, PublicQuery
from dpsql.answer.result import Budget, DPResult, QueryCost
from dpsql.backends.rewrite import BoundedStatement
from dpsql.budget.accounting import Spend, check_accountable, rho_budget
from dpsql.calls.fit_sql import (
    FitColumns,
    count_statement,
    gradient_statement,
    held_count_statement,
    held_gradient_statement,
    held_means_statement,
    means_statement,
    projection_statement,
)
from dpsql.errors import DPError, InvalidParameter, UnsupportedQuery
from dpsql.mechanisms.descent import (
    COUNT_SHARE,
    MAX_FEATURES,
    MEAN_SHARE,
    Bounds,
    Model,
    Noise,
    check_model,
    check_scaled,
    check_steps,
    default_learning_rate,
    descend,
    grid_steps,
    starting_point,
    uncentred_weights,
    unscaled,
)
from dpsql.mechanisms.noise import discrete_gaussian, secret_key
from dpsql.query.context import MechanismContext
from dpsql.query.executor import Fetch
from dpsql.query.options import privacy_options
from dpsql.query.spend import Price
from dpsql.sql.parse import DIALECT, located, node_position, parse

OPTIONS = ("target", "model", "epsilon", "delta", "steps", "clip", "learning_rate", "method")
"""The options of ``SELECT * FROM fit('SELECT ...', target = 'y', ...)``, as keyword arguments."""
DEFAULT_STEPS = 60
DEFAULT_CLIP = 0.5
_SHAPE = "SELECT feature, ..., target FROM t [WHERE ...]: the rows to train on, one column per feature"


@dataclass(frozen=True)
class FitPlan:
    """A fit, planned before the charge."""

    text: str
    model: Model
    features: tuple[str, ...]
    target: str
    plan: Plan
    """The rows' plan: the bounded rows each step reads (with its Poisson sample, if any)."""
    columns: FitColumns
    count: BoundedStatement
    """The count of units' statement (over the whole table, never a sample)."""
    steps: int
    clip: float
    learning_rate: float
    noise: Noise
    rate: Fraction | None
    """The Poisson sampling rate of units per step (DP-SGD), or None: full batch."""
    amplified: bool
    """The charge counts the sample (BASIC or ADVANCED accounting)."""
    cost: Spend
    epsilon: Fraction
    delta: Fraction
    sensitivity_factor: int
    """1 under add/remove neighbours, 2 under replace-one (both vectors lie in the clip ball)."""
    normal: str
    repeat_key: str
    dialect: str
    means: BoundedStatement | None = None
    """The sums of the units' averages of each scaled column (None: the fit starts at 0, uncentred)."""
    projection: BoundedStatement | None = None
    """The fit's rows projected once, lean and typed (``fit_sql.projection_statement``), which the
    engine holds while the fit reads them (``Backend.hold``); None for a Poisson-sampled fit,
    whose every step reads the bounded rows with a fresh sample."""
    held: str = ""
    """The name the projection is held under: fresh for each planned fit, never shown."""

    def key(self) -> str:
        text = json.dumps(["fit", self.repeat_key, self.model, self.target, list(self.features), str(self.epsilon),
                           str(self.delta), self.steps, repr(self.clip), repr(self.learning_rate)])
        return "fit:" + hashlib.sha256(text.encode()).hexdigest()

    def price(self, neighbours: str) -> Price:
        """What the fit costs, charged once: its projection (if any), its count of units, its means
        (if any) and one statement per step."""
        statements = (self.projection is not None) + 1 + (self.means is not None) + self.steps
        return Price(self.cost, _ledger_text(self),
                     {"mechanism": "fit", "model": self.model, "target": self.target, "epsilon": self.epsilon,
                      "delta": self.delta, "steps": self.steps, "clip": self.clip,
                      "learning_rate": self.learning_rate, "sample_rate": None if self.rate is None else str(self.rate),
                      "neighbours": neighbours},
                     key=self.key(), statements=statements,
                     what=f"a fit of {self.steps:,} steps",
                     failure="the fit failed while running; its cost was charged and no model was released")

    def bounds(self) -> tuple[list[Bounds], Bounds | None]:
        every = self.columns.bounds()
        return every[:-1], (every[-1] if self.model == "linear" else None)

    def statement(self, weights: Sequence[float], offsets: Sequence[float] | None = None) -> BoundedStatement:
        """A step's statement over the bounded rows (a sampled fit's, or where no projection is held)."""
        return gradient_statement(self.plan, self.columns, self.model, weights, self.clip, self.noise.norm_steps,
                                  self.dialect, offsets)

    def held_statement(self, weights: Sequence[float], offsets: Sequence[float] | None = None) -> BoundedStatement:
        """A step's statement over the held projection: the same sum, one scan of typed numbers."""
        return held_gradient_statement(self.plan, self.columns, self.held, self.model, weights, self.clip,
                                       self.noise.norm_steps, offsets, self.dialect)


class FittedModel:
    """A model fitted by ``db.fit``: coefficients in the columns' own units, what it cost."""

    def __init__(self, model: Model, features: tuple[str, ...], target: str, bounds: Sequence[Bounds],
                 intercept: float, coefficients: Sequence[float], result: DPResult, entry: int | None = None,
                 method: str = "gradient"):
        self.model = model
        self.method = method
        """How it was fitted: ``sufficient`` (noisy sufficient statistics, once) or ``gradient`` (noisy descent)."""
        self.features = features
        self.target = target
        self._bounds = list(bounds)
        self.intercept = intercept
        self.coefficients = dict(zip(features, coefficients))
        self.cost = result.cost
        self.result = result
        """The release as a table: (term, coefficient)."""
        self.entry = entry
        """The id of the ledger entry that charged this fit (``db.ledger()``'s ``id``); None for a
        free repeat, which charged nothing."""

    def predict(self, frame: Any) -> np.ndarray:
        """Predictions for the rows of a pandas DataFrame with the feature columns (clamped into
        the bounds the model was trained in): values (linear) or probabilities (logistic)."""
        columns = {str(c).lower(): c for c in frame.columns}
        missing = [f for f in self.features if f not in columns]
        if missing:
            raise InvalidParameter(f"predict needs the feature columns {missing}",
                                   hint=f"pass a DataFrame with columns {list(self.features)}")
        values = self.intercept + sum(
            np.clip(np.asarray(frame[columns[f]], dtype=float), b.lower, b.upper) * self.coefficients[f]
            for f, b in zip(self.features, self._bounds))
        values = np.asarray(values, dtype=float)
        return values if self.model == "linear" else 1.0 / (1.0 + np.exp(-values))

    def __repr__(self) -> str:
        return repr(self.result)

    def _repr_html_(self) -> str:
        return self.result._repr_html_() if hasattr(self.result, "_repr_html_") else repr(self)


@dataclass(frozen=True)
class Training:
    """A training query, checked and planned as ``db.sql`` plans its SUMs (reads no data)."""

    tree: exp.Select
    items: list[exp.Expression]
    order: list[int]
    """Select-list positions, features first, target last."""
    features: tuple[str, ...]
    target: str
    epsilon: Fraction
    delta: Fraction
    plan: Plan
    priced: Any
    columns: FitColumns


def sampled(sql: Any) -> bool:
    """Whether the training query reads a Poisson sample (``TABLESAMPLE``); False when it does not parse
    (its planning refuses it then)."""
    try:
        return isinstance(sql, str) and parse(sql).tree.find(exp.TableSample) is not None
    except DPError:
        return False


def plan_training(context: MechanismContext, sql: Any, target: Any, model: Model, epsilon: Any,
                  delta: Any) -> Training:
    """The checks every fit shares, and the rows' plan (refusals name the construct)."""
    if not isinstance(sql, str) or not sql.strip():
        raise InvalidParameter("fit needs the SQL of its training rows", hint=f"pass {_SHAPE}")
    if not isinstance(target, str) or not target.strip():
        raise InvalidParameter("fit needs its target column's name", hint="pass target='y', a column of the query")
    if delta is None and context.policy.query_delta == 0:
        raise _no_delta(context.policy)
    options = privacy_options(context.policy, epsilon, delta, "gaussian")
    tree, items = _rows_query(sql)
    names = [item.alias_or_name.lower() for item in items]
    duplicated = sorted({n for n in names if names.count(n) > 1})
    if duplicated:
        raise UnsupportedQuery(f"the training query names the column {duplicated[0]} twice", line=1, col=1,
                               hint="give each column its own name with AS")
    wanted = target.strip().lower()
    if wanted not in names:
        raise InvalidParameter(f"the target {target!r} is not a column of the training query (its columns: "
                               f"{', '.join(names)})", hint="name one of its columns, or add the target to it")
    if len(names) < 2:
        raise UnsupportedQuery("the training query has no feature besides the target", line=1, col=1, hint=_SHAPE)
    if len(names) - 1 > MAX_FEATURES:
        raise UnsupportedQuery(f"the training query has {len(names) - 1} features, more than the {MAX_FEATURES} a fit "
                               "takes", line=1, col=1, hint="fit on fewer columns")
    order = [i for i, n in enumerate(names) if n != wanted] + [names.index(wanted)]
    features = tuple(names[i] for i in order[:-1])
    prepared = _prepare_rows(context, sql, tree, items, order, model)
    plan, priced = prepared.plan, prepared.priced
    assert plan is not None and priced is not None
    columns = _columns(plan)
    if len(columns.values) != len(features) + 1:  # identical SUMs share one measure
        raise UnsupportedQuery("the training query selects the same expression twice", line=1, col=1,
                               hint="keep one column per expression: a copy adds nothing to a model")
    return Training(tree, items, order, features, wanted, options.epsilon, options.delta, plan, priced, columns)


def plan_fit(context: MechanismContext, sql: Any, target: Any, model: Any = "linear", epsilon: Any = None,
             delta: Any = None, steps: Any = DEFAULT_STEPS, clip: Any = DEFAULT_CLIP,
             learning_rate: Any = None) -> FitPlan:
    """Check the arguments and plan the fit by gradient descent (reads no data; refusals name the construct)."""
    model = check_model(model)
    steps = check_steps(steps)
    clip = check_scaled(clip, "clip", "1.0")
    learning_rate = (None if learning_rate is None else check_scaled(learning_rate, "learning_rate", "0.1"))
    training = plan_training(context, sql, target, model, epsilon, delta)
    features, plan, priced, columns = training.features, training.plan, training.priced, training.columns
    rate = None if priced.sampling is None else priced.sampling.rate
    if learning_rate is None:  # an amplified (DP-SGD) fit releases no means: it starts at 0, uncentred
        centred = rate is None or context.policy.accounting == "zcdp"
        learning_rate = default_learning_rate(model, len(features), centred=centred)
    policy = context.policy
    if rate is not None and policy.neighbours != "unbounded":
        raise UnsupportedQuery("a fit on a Poisson sample (TABLESAMPLE POISSON) needs NEIGHBOURS UNBOUNDED: under "
                               "replace-one neighbours a unit and its replacement are sampled apart",
                               line=1, col=1, hint="leave the sample out (full-batch descent)")
    count_plan = plan if rate is None else _prepare_rows(context, sql, _unsampled(training.tree), training.items,
                                                         training.order, model).plan
    assert count_plan is not None
    factor = 1 if policy.neighbours == "unbounded" else 2
    amplified = rate is not None and policy.accounting != "zcdp"
    noise, cost = _calibrate(training.epsilon, training.delta, steps, factor, rate if amplified else None,
                             len(features) + 1)
    check_accountable(policy.accounting, cost)
    fit = FitPlan(sql, model, features, training.target, plan, columns,
                  count_statement(count_plan, _columns(count_plan), context.dialect),
                  steps, clip, learning_rate, noise, rate, amplified, cost, training.epsilon, training.delta, factor,
                  priced.normal_sql, priced.repeat_key, context.dialect,
                  means_statement(count_plan, _columns(count_plan), model, noise.mean_steps, context.dialect)
                  if noise.mean_steps else None,
                  projection_statement(plan, columns, model, context.dialect)
                  if _holds(rate, context.dialect) else None,
                  "dp_fit_" + secrets.token_hex(8))
    fit.statement([0.0] * (len(features) + 1))  # rendered once before the charge: a refusal, not a failure
    if fit.projection is not None:
        fit.held_statement([0.0] * (len(features) + 1), [0.0] * len(features))
    return fit


def _holds(rate: Any, dialect: str) -> bool:
    """Whether a fit projects its rows once and steps over them (``Backend.hold``): not a sampled fit
    (each step draws its own sample of the copy), and only on DuckDB, the engine that holds a
    projection (Spark's copies are cached already, and it types no projection's columns)."""
    return rate is None and dialect == "duckdb"


def _no_delta(policy: Any) -> InvalidParameter:
    """A fit names no delta and the policy has no QUERY DELTA to give it: say what to write, with a
    delta the budget can pay (Gaussian noise needs delta > 0)."""
    if policy.budget_delta == 0:
        return InvalidParameter("a fit needs delta > 0 (its noise is Gaussian), and this policy's budget has no "
                                "delta to spend", hint="ask the curator for a BUDGET with a DELTA")
    suggested = f"{float(policy.budget_delta) / 10:.0e}".replace("e-0", "e-")
    return InvalidParameter(
        f"a fit needs delta > 0 (its noise is Gaussian), and the policy sets no QUERY DELTA to use when none is given "
        f"(its budget's delta is {float(policy.budget_delta):g} in all)",
        hint=f"pass delta={suggested}, or add DELTA {suggested} to the policy's QUERY EPSILON",
        hints={"sql": f"add delta = {suggested} to the fit(...) call, or ask the curator for a QUERY DELTA"})


def _rows_query(sql: str) -> tuple[exp.Select, list[exp.Expression]]:
    """The training query's tree and its select items, checked to be rows (no aggregation)."""
    parsed = parse(sql)
    if parsed.options:
        raise UnsupportedQuery("the training query may not carry OPTIONS", line=1, col=1,
                               hint="give epsilon, delta and the fit's options as fit's own arguments")
    tree = parsed.tree
    if not isinstance(tree, exp.Select):
        raise located(UnsupportedQuery(f"fit trains on the rows of one SELECT, found {tree.key.upper()}",
                                       node=tree, hint=_SHAPE), sql)
    for clause in ("group", "having", "order", "limit", "offset", "distinct", "qualify", "windows"):
        if tree.args.get(clause):
            raise located(UnsupportedQuery(f"the training query has {clause.upper()}: fit trains on rows as they are",
                                           node=tree.args[clause], hint=_SHAPE), sql)
    for item in tree.expressions:
        if isinstance(item, exp.Star) or isinstance(item.unalias(), exp.Star):
            raise located(UnsupportedQuery("the training query selects *", node=item,
                                           hint=f"name the columns: {_SHAPE}"), sql)
        if item.find(exp.AggFunc) is not None or item.find(exp.Window) is not None:
            raise located(UnsupportedQuery("the training query aggregates", node=item, hint=_SHAPE), sql)
    return tree, list(tree.expressions)


def _target_value(expression: exp.Expr) -> exp.Expr:
    """A logistic target as 1 (its value is 1, or TRUE), 0 (any other value) or NULL."""
    value = exp.Paren(this=expression.copy())
    return exp.Case(ifs=[exp.If(this=exp.EQ(this=value, expression=exp.Literal.number(1)),
                                true=exp.Literal.number(1)),
                         exp.If(this=exp.Not(this=exp.Is(this=value.copy(), expression=exp.Null())),
                                true=exp.Literal.number(0))])


def _prepare_rows(context: MechanismContext, sql: str, tree: exp.Select, items: list[exp.Expression], order: list[int],
                  model: Model):
    """``db.sql``'s preparation of SUM(column) for each column, features first, target last: its
    plan's bounded rows are the fit's; a refusal is placed at the analyst's column."""
    try:
        prepared = context.prepare(_sums(tree, items, order, model), 1, 0, "laplace", None, False)
    except DPError as error:
        raise _placed(context, error, sql, tree, items, order, model) from None
    if isinstance(prepared.checked, PublicQuery) or prepared.plan is None or prepared.priced is None:
        raise UnsupportedQuery("the training query reads no private data", line=1, col=1,
                               hint="fit a public table with any library: nothing needs protecting")
    return prepared


def _sums(tree: exp.Select, items: list[exp.Expression], order: list[int], model: Model) -> str:
    """SELECT SUM(column) AS c<i>, ... of the training query (its FROM and WHERE as written)."""
    sums = tree.copy()
    selected = []
    for position, index in enumerate(order):
        value = items[index].unalias().copy()
        if model == "logistic" and position == len(order) - 1:
            value = _target_value(value)
        selected.append(exp.alias_(exp.Sum(this=value), f"c{position}"))
    sums.set("expressions", selected)
    return sums.sql(dialect=DIALECT)


def _placed(context: MechanismContext, error: DPError, sql: str, tree: exp.Select, items: list[exp.Expression],
            order: list[int], model: Model) -> DPError:
    """A refusal of the SUM query, said of the analyst's own query: at the first column whose SUM
    alone is refused (found by preparing each alone: the refusal path only), else where its node
    is in the analyst's text."""
    error.line = error.col = None
    for position, index in enumerate(order):
        try:
            context.prepare(_sums(tree, items, [index], model if position == len(order) - 1 else "linear"),
                                1, 0, "laplace", None, False)
        except DPError:
            error.locate(*node_position(items[index], sql))
            break
    else:
        place = _same_node(getattr(error, "node", None), sql)
        if place is not None:
            error.locate(*place)
    error.message = f"in the training query: {error.message}"
    error.args = (error._render(),)
    return error


def _same_node(node: Any, sql: str) -> tuple[int | None, int | None] | None:
    """Where a node of the SUM query (its FROM or WHERE, copied from the analyst's) is in ``sql``."""
    if not isinstance(node, exp.Expression):
        return None
    for candidate in parse(sql).tree.walk():
        if type(candidate) is type(node) and candidate == node:
            return node_position(candidate, sql)
    return None


def _unsampled(tree: exp.Select) -> exp.Select:
    """The training query without its TABLESAMPLE: the row count reads every unit."""
    copy = tree.copy()
    for sample in list(copy.find_all(exp.TableSample)):
        sample.pop()
    return copy


def _columns(plan: Plan) -> FitColumns:
    """Each SUM's measure: the column's value, grid and bounds in the bounded rows."""
    if plan.query.keys or any(a.function != "sum" or len(a.measures) != 1 for a in plan.aggregates):
        raise UnsupportedQuery("the training query's columns cannot be read as rows", line=1, col=1, hint=_SHAPE)
    measures = [plan.measure(a.measures[0]) for a in plan.aggregates]
    if any(m.kind != "sum" or m.centred or m.argument is None for m in measures):
        raise UnsupportedQuery("the training query's columns cannot be read as rows", line=1, col=1, hint=_SHAPE)
    return FitColumns(tuple(f"v_{m.name}" for m in measures), tuple(float(m.grid) for m in measures),
                      tuple(m.lower for m in measures), tuple(m.upper for m in measures))


def _calibrate(epsilon: Fraction, delta: Fraction, steps: int, factor: int,
               rate: Fraction | None, columns: int = 2) -> tuple[Noise, Spend]:
    """The noise of each step, of the count and (full batch) of the columns' means, and the charge
    (module docstring). One unit moves each of the ``columns`` sums of unit averages by at most
    D_m grid steps (2 D_m replacing it): L2 sqrt(columns) times that."""
    if rate is None:
        rho = rho_budget(epsilon, delta)
        count_rho, mean_rho = rho * COUNT_SHARE, rho * MEAN_SHARE
        step_rho = (rho - count_rho - mean_rho) / steps
        multiplier_squared = Fraction(factor * factor) / (2 * step_rho)  # (sigma / D)^2
        norm_steps = grid_steps(math.sqrt(multiplier_squared))
        mean_multiplier_squared = Fraction(factor * factor * columns) / (2 * mean_rho)
        mean_steps = grid_steps(math.sqrt(mean_multiplier_squared))
        noise = Noise(norm_steps, multiplier_squared * norm_steps * norm_steps, 1 / (2 * count_rho),
                      mean_steps, mean_multiplier_squared * mean_steps * mean_steps)
        return noise, Spend(epsilon, delta, rho)
    from dpsql.budget.subsampled import noise_multiplier_for

    count_epsilon, count_delta = epsilon * COUNT_SHARE, delta * COUNT_SHARE
    count_rho = rho_budget(count_epsilon, count_delta)
    multiplier = Fraction(noise_multiplier_for(epsilon - count_epsilon, delta - count_delta, rate, steps))
    norm_steps = grid_steps(float(multiplier))
    noise = Noise(norm_steps, (multiplier * norm_steps) ** 2, 1 / (2 * count_rho))
    return noise, Spend(epsilon, delta, count_rho + steps / (2 * multiplier * multiplier))


def run_fit(context: MechanismContext, fit: FitPlan) -> FittedModel:
    """Charge ``fit``, run its steps and release (or replay a stored fit), through the spender."""
    source = context.source

    def from_copy(fetch: Fetch) -> dict:
        def gradient(weights: list[float], offsets: list[float]) -> list[int]:
            # No stop on the fit's summed run time (invariant 17): its time was bounded before the
            # charge by its number of statements (Price.statements), each under its own deadline.
            statement = fit.statement(weights, offsets)
            rows = fetch(statement, secret_key(source)) if statement.needs_sample_key else fetch(statement)
            return [int(v or 0) for v in rows[0]]

        units = int(fetch(fit.count)[0][0] or 0)
        means = None if fit.means is None else [int(v or 0) for v in fetch(fit.means)[0]]
        return descend_noisily(fit, units, gradient, source, means)

    def from_projection(fetch: Fetch) -> dict:
        def gradient(weights: list[float], offsets: list[float]) -> list[int]:
            return [int(v or 0) for v in fetch(fit.held_statement(weights, offsets))[0]]

        units = int(fetch(held_count_statement(fit.plan, fit.held, fit.dialect))[0][0] or 0)
        means = None if fit.means is None else [
            int(v or 0) for v in fetch(held_means_statement(fit.plan, fit.columns, fit.held, fit.noise.mean_steps,
                                                            fit.dialect))[0]]
        return descend_noisily(fit, units, gradient, source, means)

    def run(fetch: Fetch) -> dict:
        if fit.projection is not None:
            with fetch.holding(fit.held, fit.projection) as held:
                if held:
                    return from_projection(fetch)
        return from_copy(fetch)  # a sampled fit, or an engine that holds no projection

    spent = context.spender.spend(fit.price(context.policy.neighbours), run, json.dumps, json.loads)
    return _model(fit, spent.released, spent.cost, spent.budget, spent.entry)


def descend_noisily(fit: FitPlan, exact_units: int, gradient: Callable[[list[float], list[float]], list[int]],
                    source: Any = None, exact_means: list[int] | None = None) -> dict:
    """The release of a fit from its exact count of units, the exact sums of the units' averages of
    each scaled column (``exact_means``, when the fit releases means) and ``gradient(weights,
    offsets)``, the exact integer sum of the units' clipped gradients at those weights, the features
    centred on ``offsets`` (one statement per step): the noisy count, the noisy means (the
    features' centres and the intercept's start), then ``fit.steps`` noisy steps. Only noisy
    values decide the next weights; the weights released are over the uncentred scaled columns."""
    units = exact_units + int(discrete_gaussian(fit.noise.count_sigma_squared, 1, source)[0])
    # DP-SGD divides by the expected batch, rate times the units (sum and noise alike).
    batch = float(units) * (1.0 if fit.rate is None else float(fit.rate))
    weights = np.zeros(len(fit.features) + 1)
    offsets = np.zeros(len(fit.features))
    if fit.noise.mean_steps:
        assert exact_means is not None
        noise = discrete_gaussian(fit.noise.mean_sigma_squared, len(exact_means), source)
        offsets, weights[0] = starting_point(fit.model, [s + int(n) for s, n in zip(exact_means, noise)], fit.noise,
                                             float(units))
    for _ in range(fit.steps):
        exact = gradient(weights.tolist(), offsets.tolist())
        noise = discrete_gaussian(fit.noise.sigma_squared, len(exact), source)
        weights = descend(weights, [s + int(n) for s, n in zip(exact, noise)], fit.noise, fit.clip, batch,
                          fit.learning_rate)
    weights = uncentred_weights(weights, offsets)
    return {"weights": [float(w) for w in weights], "units": units, "offsets": [float(m) for m in offsets]}


def _ledger_text(fit: FitPlan) -> str:
    sampled = "" if fit.rate is None else f", a Poisson sample of {float(fit.rate) * 100:g}% of units per step"
    return (f"FIT {fit.model.upper()} {fit.target} ON {', '.join(fit.features)} ({fit.steps} steps, clip "
            f"{fit.clip:g}{sampled}) OF {fit.normal}")


def _model(fit: FitPlan, released: dict, cost: QueryCost, budget: Budget | None, entry: int | None) -> FittedModel:
    weights = released["weights"]
    intercept, coefficients = unscaled(np.asarray(weights, dtype=float), fit.model, *fit.bounds())
    rows = [("intercept", intercept)] + list(zip(fit.features, coefficients))

    def intervals(alpha: float) -> dict[str, list[tuple[float, float, float]]]:
        # The last iterate of noisy descent has no closed-form interval: derived, no ±.
        return {"coefficient": [(math.nan, math.nan, math.nan)] * len(rows)}

    notes = (f"{fit.model} regression of {fit.target} by {fit.steps} steps of noisy gradient descent "
             f"over about {max(released['units'], 0):,} units (a noisy count); coefficients in the columns' own "
             "units, no interval (the last iterate of noisy descent has none in closed form)",)
    result = DPResult(["term", "coefficient"], rows, cost, intervals=intervals, types=["VARCHAR", "DOUBLE"],
                      budget=budget, notes=notes)
    return FittedModel(fit.model, fit.features, fit.target, fit.bounds()[0], intercept, coefficients, result, entry)
