"""The statements of a fit (``dpsql.calls.fit``): one per gradient step, and the row count.

Each reads the bounded rows of the fit's plan (``dpsql.backends.rewrite.rows_statement``: the
relation's rows with their unit, every column clamped into its bounds on its integer grid) and
adds, in the engine:

1. ``dp_fit_rows``: the rows with every column present, each scaled onto [-1, 1] as DOUBLE
   (a logistic target stays the class, 1 or 0);
2. ``dp_fit_units``: per unit, the average over its rows of the row gradient (intercept first):
   each unit weighs the same whatever its rows, and one clip fits units of one row or many;
3. ``dp_fit_clipped``: that vector in grid steps (clip / D each), scaled to L2 norm at most
   D * ``MARGIN`` steps, truncated toward zero coordinate by coordinate. Truncation toward zero
   never lengthens a vector, so its norm is at most D steps. A vector whose norm is not a finite
   number (it cannot be one: every input is bounded) counts as zero, and so does a coordinate
   outside [-D, D]: a unit's part is at most D steps whatever the engine's arithmetic does;
4. the sum over units, exact (BIGINT values summed as HUGEINT).

The count counts the units with a complete row (one unit moves it by at most 1).
Weights are literals in scientific notation (DOUBLE in DuckDB and Spark alike); they are public,
the previous steps' noisy releases.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import sqlglot
from sqlglot import exp

from dpsql.analysis.plan import Plan
from dpsql.backends.bounding import DATABASE
from dpsql.backends.render import DUCKDB
from dpsql.backends.rewrite import BoundedStatement, rows_statement, statement
from dpsql.mechanisms.descent import MARGIN, Bounds, Model
from dpsql.sql.pieces import exact_integer

LOGIT_LIMIT = 40.0
"""The logistic link's argument is clamped to [-40, 40] (its value moves by under 1e-17 beyond)
where its public bound (``_logit_reach``) passes ``EXP_SAFE``; within it no clamp is written."""
EXP_SAFE = 600.0
"""Below this, EXP of the link's argument (or of minus it) is finite: e^600 is about 1e260, far
from the largest double, so the statement cannot overflow there (invariant 19)."""


@dataclass(frozen=True)
class FitColumns:
    """The fit's columns in the bounded rows: value column, grid and bounds in grid steps."""

    values: tuple[str, ...]
    """``v_<measure>`` of each feature, then of the target."""
    grids: tuple[float, ...]
    """Each column's grid (its value is v * grid)."""
    lower: tuple[int, ...]
    upper: tuple[int, ...]

    def bounds(self) -> list[Bounds]:
        """Each column's bounds in its own units."""
        return [Bounds(lo * g, hi * g) for lo, hi, g in zip(self.lower, self.upper, self.grids)]


def _number(value: float) -> str:
    """A DOUBLE literal, exactly ``value`` (17 significant digits, scientific notation)."""
    return format(float(value), ".16e")


def _scaled(column: str, lower: int, upper: int, centre: float = 0.0) -> str:
    """The column's grid value mapped onto [-1, 1] (0 when its bounds are one value), less ``centre``
    (a public noisy mean: the fit's features are centred on theirs)."""
    if upper == lower:
        return _number(0.0)
    slope, offset = 2.0 / (upper - lower), -(upper + lower) / (upper - lower) - centre
    return f"(CAST({column} AS DOUBLE) * {_number(slope)} + {_number(offset)})"


def _rows_layer(columns: FitColumns, model: Model = "linear", offsets: Sequence[float] | None = None) -> str:
    centres = list(offsets or []) + [0.0] * (len(columns.values) - len(offsets or []))
    scaled = [_scaled(v, lo, hi, m) for v, lo, hi, m in zip(columns.values, columns.lower, columns.upper, centres)]
    if model == "logistic":  # the class, 1 or 0 (fit._target_value), as itself: the log loss needs y in {0, 1}
        scaled[-1] = f"(CAST({columns.values[-1]} AS DOUBLE) * {_number(columns.grids[-1])})"
    names = [f"x{j}" for j in range(1, len(columns.values))] + ["y"]
    present = " AND ".join(f"{v} IS NOT NULL" for v in columns.values)
    select = ", ".join(f"{s} AS {n}" for s, n in zip(scaled, names))
    return f"SELECT dp_unit, {select} FROM dp_values WHERE {present}"


def _logit_reach(weights: Sequence[float]) -> float:
    """A public bound on |w0 + sum w_j x_j| over every row: each scaled feature lies in [-1, 1] and
    its centre too, so a centred feature lies in [-2, 2] (a margin of 1 absorbs float rounding)."""
    return abs(float(weights[0])) + 2.0 * sum(abs(float(w)) for w in weights[1:]) + 1.0


def _residual(model: Model, weights: Sequence[float], features: int) -> str:
    """The row's residual: prediction minus target (the gradient's common factor). The logistic
    link's argument is clamped only where the weights could take it past ``EXP_SAFE``: a clamp on
    every row cost a step about a third of its time at 10M rows (benchmarks/RESULTS.md, issue 38)."""
    linear = " + ".join([_number(weights[0])] + [f"{_number(weights[j])} * x{j}" for j in range(1, features + 1)])
    if model == "linear":
        return f"({linear} - y)"
    if _logit_reach(weights) > EXP_SAFE:
        linear = f"LEAST(GREATEST({linear}, {_number(-LOGIT_LIMIT)}), {_number(LOGIT_LIMIT)})"
    return f"({_number(1.0)} / ({_number(1.0)} + EXP(-({linear}))) - y)"


def gradient_statement(plan: Plan, columns: FitColumns, model: Model, weights: Sequence[float],
                       clip: float, norm_steps: int, dialect: str = DUCKDB,
                       offsets: Sequence[float] | None = None) -> BoundedStatement:
    """The statement of one step: one row, ``s0`` (intercept) .. ``sd``, the exact sum over units
    of each unit's clipped gradient in grid steps of clip / ``norm_steps``, the scaled features
    centred on ``offsets`` (public: released means)."""
    final = ", ".join(f"SUM(t{i}) AS s{i}" for i in range(len(columns.values)))
    return _over_clipped(final, plan, columns, model, weights, clip, norm_steps, dialect, offsets)


def means_statement(plan: Plan, columns: FitColumns, model: Model, mean_steps: int,
                    dialect: str = DUCKDB) -> BoundedStatement:
    """The sums over units of each unit's average of each scaled column (features, then the target;
    a logistic target as its class): one row ``s0`` .., in grid steps of 1 / ``mean_steps``. Each
    unit's average lies in [-1, 1] and is truncated toward zero on the grid; a coordinate outside
    [-D, D] (it cannot be: every input is bounded) counts as zero, so one unit's part of each
    coordinate is at most D steps whatever the engine's arithmetic does."""
    names = [f"x{j}" for j in range(1, len(columns.values))] + ["y"]
    limit = _number(float(mean_steps))
    averages = ", ".join(f"CAST(AVG({n}) AS DOUBLE) * {limit} AS a{i}" for i, n in enumerate(names))
    truncated = _truncated_means(len(names), limit)
    final = ", ".join(f"SUM(t{i}) AS s{i}" for i in range(len(names)))
    return rows_statement(plan, _select(f"SELECT {final} FROM dp_fit_means"),
                          [("dp_fit_rows", _select(_rows_layer(columns, model))),
                           ("dp_fit_averages", _select(f"SELECT {averages} FROM dp_fit_rows GROUP BY dp_unit")),
                           ("dp_fit_means", _select(f"SELECT {truncated} FROM dp_fit_averages"))], dialect)


def unit_vectors_statement(plan: Plan, columns: FitColumns, model: Model, weights: Sequence[float],
                           clip: float, norm_steps: int, dialect: str = DUCKDB) -> BoundedStatement:
    """Each unit's clipped integer vector (``t0`` ..), before the sum: for tests of the bound."""
    final = ", ".join(f"t{i}" for i in range(len(columns.values)))
    return _over_clipped(final, plan, columns, model, weights, clip, norm_steps, dialect)


def _over_clipped(final: str, plan: Plan, columns: FitColumns, model: Model, weights: Sequence[float],
                  clip: float, norm_steps: int, dialect: str,
                  offsets: Sequence[float] | None = None) -> BoundedStatement:
    """``SELECT final FROM dp_fit_clipped`` over the step's layers."""
    return rows_statement(plan, _select(f"SELECT {final} FROM dp_fit_clipped"),
                          _gradient_layers(columns, model, weights, clip, norm_steps, _one_row_each(plan), offsets),
                          dialect)


def _one_row_each(plan: Plan) -> bool:
    """True when every unit has at most one row whatever the data (a bounded copy of one row per
    unit, or a row-level table read directly): its gradient is its row's, no GROUP BY needed."""
    return plan.query.rows_per_unit == 1


def _gradient_layers(columns: FitColumns, model: Model, weights: Sequence[float], clip: float,
                     norm_steps: int, one_row_each: bool = False,
                     offsets: Sequence[float] | None = None) -> list[tuple[str, exp.Expr]]:
    features = len(columns.values) - 1
    residual = _residual(model, weights, features)
    terms = ["r"] + [f"r * x{j}" for j in range(1, features + 1)]
    if one_row_each:
        per_row = ", ".join(f"{t} AS g{i}" for i, t in enumerate(terms))
        units = f"SELECT dp_unit, {per_row} FROM (SELECT *, {residual} AS r FROM dp_fit_rows) AS dp_residuals"
    else:
        per_unit = ", ".join(f"CAST(AVG({t}) AS DOUBLE) AS g{i}" for i, t in enumerate(terms))
        units = (f"SELECT dp_unit, {per_unit} FROM (SELECT *, {residual} AS r FROM dp_fit_rows) AS dp_residuals "
                 "GROUP BY dp_unit")
    return [("dp_fit_rows", _select(_rows_layer(columns, model, offsets))), ("dp_fit_units", _select(units)),
            *_clip_layers(len(terms), clip, norm_steps)]


def _clip_layers(size: int, clip: float, norm_steps: int) -> list[tuple[str, exp.Expr]]:
    """From ``dp_fit_units`` (``dp_unit``, ``g0`` .. one unit's gradient vector, whatever computed
    it from the unit's own rows) to ``dp_fit_clipped`` (``dp_unit``, ``t0`` ..: the vector in grid
    steps, clipped and truncated, so of L2 norm at most D steps: the module docstring's step 3)."""
    # Measured in grid steps first (clip / D each), then normed: a norm of the raw sums would
    # underflow to 0 for a tiny clip (squares below the smallest double) and let every
    # coordinate through at almost D (found by helper-30). In steps, a square underflows only
    # for a coordinate far below one step, which truncates to 0 anyway.
    in_steps = ", ".join(f"g{i} * {_number(norm_steps / clip)} AS h{i}" for i in range(size))
    norm = "SQRT(" + " + ".join(f"h{i} * h{i}" for i in range(size)) + ")"
    reach = _number(norm_steps * MARGIN)
    factor = (f"CASE WHEN dp_norm <= {reach} THEN {_number(1.0)} "
              f"WHEN dp_norm <= {_number(1e300)} THEN {reach} / dp_norm ELSE {_number(0.0)} END")
    limit = _number(float(norm_steps))
    truncated = ", ".join(
        f"CASE WHEN h{i} * dp_factor >= 0 AND h{i} * dp_factor <= {limit} "
        f"THEN CAST(FLOOR(h{i} * dp_factor) AS BIGINT) "
        f"WHEN h{i} * dp_factor < 0 AND h{i} * dp_factor >= -{limit} THEN CAST(CEIL(h{i} * dp_factor) AS BIGINT) "
        f"ELSE CAST(0 AS BIGINT) END AS t{i}" for i in range(size))
    clipped = (f"SELECT dp_unit, {truncated} FROM (SELECT *, {factor} AS dp_factor FROM "
               f"(SELECT *, {norm} AS dp_norm FROM dp_fit_steps) AS dp_normed) AS dp_factored")
    return [("dp_fit_steps", _select(f"SELECT dp_unit, {in_steps} FROM dp_fit_units")),
            ("dp_fit_clipped", _select(clipped))]


# -- the lean path: the rows projected once per fit, every step a scan of them ----------------------

def projection_statement(plan: Plan, columns: FitColumns, model: Model, dialect: str = DUCKDB) -> BoundedStatement:
    """The fit's rows once, as lean as a step needs them (``Backend.hold`` keeps them for the fit):
    ``u``, a BIGINT id of the row's unit (one per unit: numbered over the units the engine
    groups, so two rows share an id exactly when they share a unit), ``x1`` .. and ``y``, the
    scaled DOUBLE columns of ``_rows_layer`` (uncentred), and ``c``, 1 / (the unit's complete
    rows). Every TRY, cast, clamp and filter of the bounded rows is paid here once; a step then
    reads typed numbers only (``held_gradient_statement``). With one row per unit each row is its
    unit: ``u`` is 0, ``c`` 1, and no step groups."""
    names = [f"x{j}" for j in range(1, len(columns.values))] + ["y"]
    listed = ", ".join(f"dp_fit_rows.{n} AS {n}" for n in names)
    if _one_row_each(plan):
        final = f"SELECT CAST(0 AS BIGINT) AS u, {listed}, {_number(1.0)} AS c FROM dp_fit_rows"
        return rows_statement(plan, _select(final), [("dp_fit_rows", _select(_rows_layer(columns, model)))], dialect)
    ids = ("SELECT dp_unit, CAST(ROW_NUMBER() OVER () AS BIGINT) AS u, "
           f"{_number(1.0)} / CAST(COUNT(*) AS DOUBLE) AS c FROM dp_fit_rows GROUP BY dp_unit")
    final = (f"SELECT dp_fit_ids.u AS u, {listed}, dp_fit_ids.c AS c FROM dp_fit_rows "
             "JOIN dp_fit_ids ON dp_fit_rows.dp_unit = dp_fit_ids.dp_unit")
    return rows_statement(plan, _select(final), [("dp_fit_rows", _select(_rows_layer(columns, model))),
                                                 ("dp_fit_ids", _select(ids))], dialect)


def held_table(name: str) -> exp.Table:
    """Where ``Backend.hold`` stores the projection ``name``."""
    return exp.table_(name, db="main", catalog=DATABASE, quoted=True)


def _held_rows(name: str, features: int, offsets: Sequence[float] | None) -> str:
    """The held rows with their unit as ``dp_unit`` and the features centred on ``offsets``."""
    centres = list(offsets or []) + [0.0] * (features - len(offsets or []))
    centred = ", ".join(f"x{j} - {_number(m)} AS x{j}" if m else f"x{j}" for j, m in enumerate(centres, 1))
    return f"SELECT u AS dp_unit, {centred}, y, c FROM {held_table(name).sql(dialect=DUCKDB)}"


def held_gradient_statement(plan: Plan, columns: FitColumns, name: str, model: Model, weights: Sequence[float],
                            clip: float, norm_steps: int, offsets: Sequence[float] | None = None,
                            dialect: str = DUCKDB, final: str | None = None) -> BoundedStatement:
    """One step over the held projection ``name``: the same sum of per-unit clipped gradients as
    ``gradient_statement`` (each unit's average row gradient, SUM(c * r * x) with c = 1 / its rows,
    through the same ``_clip_layers``), in one scan of typed numbers. ``final``: what to select
    from ``dp_fit_clipped`` instead of the sums (tests: each unit's vector)."""
    features = len(columns.values) - 1
    residual = _residual(model, weights, features)
    terms = ["r"] + [f"r * x{j}" for j in range(1, features + 1)]
    weighted = f"SELECT *, c * {residual} AS r FROM dp_fit_rows"
    if _one_row_each(plan):
        units = f"SELECT dp_unit, {', '.join(f'{t} AS g{i}' for i, t in enumerate(terms))} FROM ({weighted}) AS dp_r"
    else:
        units = (f"SELECT dp_unit, {', '.join(f'SUM({t}) AS g{i}' for i, t in enumerate(terms))} "
                 f"FROM ({weighted}) AS dp_r GROUP BY dp_unit")
    layers = [("dp_fit_rows", _select(_held_rows(name, features, offsets))), ("dp_fit_units", _select(units)),
              *_clip_layers(len(terms), clip, norm_steps)]
    chosen = final or ", ".join(f"SUM(t{i}) AS s{i}" for i in range(len(terms)))
    return statement(_with_layers(_select(f"SELECT {chosen} FROM dp_fit_clipped"), layers), plan, dialect)


def held_count_statement(plan: Plan, name: str, dialect: str = DUCKDB) -> BoundedStatement:
    """The units of the held projection (``count_statement``'s count: units with a complete row)."""
    source = held_table(name).sql(dialect=DUCKDB)
    counted = "COUNT(*)" if _one_row_each(plan) else "COUNT(DISTINCT u)"
    return statement(_select(f"SELECT {counted} AS n FROM {source}"), plan, dialect)


def held_means_statement(plan: Plan, columns: FitColumns, name: str, mean_steps: int,
                         dialect: str = DUCKDB) -> BoundedStatement:
    """``means_statement``'s sums over the held projection: each unit's average of each scaled
    column (SUM(c * x)), truncated onto the same grid, summed."""
    names = [f"x{j}" for j in range(1, len(columns.values))] + ["y"]
    limit = _number(float(mean_steps))
    source = held_table(name).sql(dialect=DUCKDB)
    if _one_row_each(plan):  # each row is its unit's average
        averages = ", ".join(f"{n} * {limit} AS a{i}" for i, n in enumerate(names))
        per_unit = f"SELECT {averages} FROM {source}"
    else:
        averages = ", ".join(f"SUM(c * {n}) * {limit} AS a{i}" for i, n in enumerate(names))
        per_unit = f"SELECT {averages} FROM {source} GROUP BY u"
    layers = [("dp_fit_averages", _select(per_unit)),
              ("dp_fit_means", _select(f"SELECT {_truncated_means(len(names), limit)} FROM dp_fit_averages"))]
    final = ", ".join(f"SUM(t{i}) AS s{i}" for i in range(len(names)))
    return statement(_with_layers(_select(f"SELECT {final} FROM dp_fit_means"), layers), plan, dialect)


def _truncated_means(size: int, limit: str) -> str:
    return ", ".join(
        f"CASE WHEN a{i} >= 0 AND a{i} <= {limit} THEN CAST(FLOOR(a{i}) AS BIGINT) "
        f"WHEN a{i} < 0 AND a{i} >= -{limit} THEN CAST(CEIL(a{i}) AS BIGINT) ELSE CAST(0 AS BIGINT) END AS t{i}"
        for i in range(size))


def _with_layers(final: exp.Select, layers: Sequence[tuple[str, exp.Expr]]) -> exp.Select:
    tree = final
    for alias, layer in layers:
        tree = tree.with_(alias, as_=layer, copy=False)
    return tree


def count_statement(plan: Plan, columns: FitColumns, dialect: str = DUCKDB) -> BoundedStatement:
    """The units with a row where every column is present: one row, ``n``."""
    if _one_row_each(plan):
        return rows_statement(plan, _select("SELECT COUNT(*) AS n FROM dp_fit_rows"),
                              [("dp_fit_rows", _select(_rows_layer(columns)))], dialect)
    return rows_statement(plan, _select("SELECT COUNT(*) AS n FROM dp_fit_units"),
                          [("dp_fit_rows", _select(_rows_layer(columns))),
                           ("dp_fit_units", _select("SELECT dp_unit FROM dp_fit_rows GROUP BY dp_unit"))], dialect)


def _select(text: str) -> exp.Select:
    tree = sqlglot.parse_one(text, read=DUCKDB)
    assert isinstance(tree, exp.Select)
    return tree


def sufficient_statement(plan: Plan, columns: FitColumns, offsets: Sequence[int],
                         clamps: Sequence[tuple[tuple[int, ...], int, int, int]],
                         dialect: str = DUCKDB) -> BoundedStatement:
    """The sufficient statistics' statement (``dpsql.mechanisms.sufficient``): one row, ``s0`` ..,
    one column per ``(factors, lower, upper, scale)`` of ``clamps``. Over the rows where every
    column is present, each centred on its offset (``w = v - offset``, grid steps): per unit, its
    total of each statistic's row value (1, w_i or w_i w_j, exact in HUGEINT), in steps of
    ``scale`` (floored), clamped into [lower, upper] (in DOUBLE, where every bound up to 2^52 is
    exact, then cast back: the cast cannot fail on a clamped value); then the exact sum over units.
    The clamp is what makes one unit's part of statistic s at most max(|lower|, |upper|)."""
    names = [f"w{j}" for j in range(len(columns.values))]
    centred = ", ".join(f"({v} - {int(c)}) AS {n}" for v, c, n in zip(columns.values, offsets, names))
    present = " AND ".join(f"{v} IS NOT NULL" for v in columns.values)
    rows = f"SELECT dp_unit, {centred} FROM dp_values WHERE {present}"

    def row_value(factors: tuple[int, ...]) -> str:
        if not factors:
            return "COUNT(*)"
        product = " * ".join([f"DP_EXACT({names[factors[0]]})"] + [names[f] for f in factors[1:]])
        return f"SUM({product})"

    totals = ", ".join(f"{row_value(factors)} AS q{i}" for i, (factors, _, _, _) in enumerate(clamps))
    clamped = ", ".join(
        f"CAST(LEAST(GREATEST(FLOOR(CAST(q{i} AS DOUBLE) / {_number(float(scale))}), {_number(float(lower))}), "
        f"{_number(float(upper))}) AS BIGINT) AS t{i}" for i, (_, lower, upper, scale) in enumerate(clamps))
    final = ", ".join(f"SUM(DP_EXACT(t{i})) AS s{i}" for i in range(len(clamps)))
    layers = [("dp_fit_rows", _select(rows)),
              ("dp_fit_totals", _exact(_select(f"SELECT dp_unit, {totals} FROM dp_fit_rows GROUP BY dp_unit"))),
              ("dp_fit_clamped", _select(f"SELECT {clamped} FROM dp_fit_totals"))]
    return rows_statement(plan, _exact(_select(f"SELECT {final} FROM dp_fit_clamped")), layers, dialect)


def _exact(tree: exp.Select) -> exp.Select:
    """``DP_EXACT(x)`` written in the text above as the engine's exact integer widening."""
    def widened(node: exp.Expr) -> exp.Expr:
        if isinstance(node, exp.Anonymous) and str(node.this).upper() == "DP_EXACT":
            return exact_integer(node.expressions[0])
        return node

    result = tree.transform(widened, copy=False)
    assert isinstance(result, exp.Select)
    return result
