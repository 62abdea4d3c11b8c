"""Stage 5, rewrite: a plan becomes one DuckDB statement that makes the analysed bounds true.

The statement has four layers; each establishes part of the precondition of
``dpsql.analysis.sensitivity`` (a unit's contribution vector lies in k * conv({L e_g, U e_g, 0})):

1. ``dp_rows``: filter (WHERE made total with TRY), keep only rows whose keys are in the public
   domain, and compute each measure's raw per-row value on its integer grid. Every
   expression that can fail is wrapped in TRY, so a failing row becomes NULL — no row can
   raise an error the analyst sees.
2. ``dp_values``: clamp each raw value into its integer bounds [L, U], keeping NULL as NULL
   (DuckDB's LEAST/GREATEST skip NULLs, so a bare clamp would turn NULL into a bound).
   Bounded columns are clamped before the expression is evaluated too (NaN becomes NULL,
   +-inf become the bounds), so the analyst's arithmetic sees policy-bounded inputs.
3. ``dp_units``: one row per (unit, group) with its row
   count ``n`` and per-measure sums and non-NULL counts. Then each (unit, group) is granted
   ``b = clamp(k - rows granted to the unit's earlier groups, 0, n)`` rows, the groups of a
   unit taken in the order of a salted hash of the unit's own (unit, key) values, and at most
   MAX GROUPS PER UNIT groups kept. So sum_g b_g <= k, and which contributions survive
   depends only on the unit's own rows and the secret salt (never on row order or rowid).
   A COUNT contributes b (or min(non-NULL count, b)); a SUM contributes its group sum scaled
   by c / (its non-NULL count), c = min(non-NULL count, b) — the total of c of its values on
   average — clamped into c * [min(L, 0), max(U, 0)].
4. the final GROUP BY adds the contributions up per group: exact integer (HUGEINT) sums
   (DuckDB sums BIGINT into HUGEINT).

A row-level table (PRIVACY UNIT ROW) takes every step of a unit-level one: its unit column is
its copy's hidden per-row id (``dpsql.backends.bounding``), so a join that turns its row into m rows
gives that unit k·m rows, groups and histogram values, and partition selection counts ids.
When the source is a private table's bounded copy (``dpsql.backends.bounding``: at most k rows per
unit whatever the data), layer 3 would grant every row, so it is replaced by what it would
still do: nothing (ungrouped, or MAX GROUPS PER UNIT not below k), or keeping each unit's
first MAX GROUPS PER UNIT groups in salted-hash order (``dp_limited``); tests compare both
forms on data, and the brute-force oracles run through the copies.
The salt is a query parameter (``$salt``), so EXPLAIN shows the SQL without the secret.

With partition selection the final layer also counts the distinct units of each group (``u``):
one per (unit, group) kept, so a unit moves at most MAX GROUPS PER UNIT of these counts by 1.
"""

from __future__ import annotations

from dataclasses import replace
from fractions import Fraction
from functools import lru_cache

from sqlglot import exp

from dpsql.analysis.domains import domain_parts, on_value, reports_outside
from dpsql.analysis.plan import ClampedColumn, GroupKey, Measure, Plan
from dpsql.analysis.ranges import clamp_arguments
from dpsql.backends.keys import key_sql
from dpsql.policy.model import KeyDomain
from dpsql.sql.parse import DIALECT

SAFE_NODES = (exp.Column, exp.Literal, exp.Null, exp.Boolean)


def rewrite_plan(plan: Plan) -> str:
    """The bounded SQL of ``plan``: columns ``g0..`` (keys), ``m0..`` (exact summed measures),
    then ``u`` (distinct units per group) with partition selection."""
    return _bounded_sql(replace(plan, measures=plan.summed))


def key_types_sql(plan: Plan) -> str:
    """SQL whose columns ``g0..`` are the query's keys as written (no measures): binding it gives
    each key's DuckDB type, which decides how the key is read back (``dpsql.backends.keys``)."""
    untyped = tuple(replace(key, form="value") for key in plan.query.keys)
    return _rows_layer(replace(plan, measures=(), query=replace(plan.query, keys=untyped)))


def rewrite_separate(plan: Plan, measure: Measure) -> str:
    """The bounded SQL of a measure computed on its own (a quantile histogram, distinct values)."""
    return rewrite_histogram(plan, measure) if measure.kind == "histogram" else rewrite_distinct(plan, measure)


def rewrite_distinct(plan: Plan, measure: Measure) -> str:
    """Bounded COUNT(DISTINCT expr) per group: columns ``g0..``, ``n``.

    A unit keeps at most b of its distinct values in a (unit, group) — b its granted rows —
    chosen in the order of a salted hash of (unit, value), so at most k over all groups: one
    unit adds or removes at most k distinct values in all, the precondition of the COUNT rule.
    """
    single = replace(plan, measures=(measure,), selection=None)
    keys = [key.name for key in plan.query.keys]
    rows, values = _rows_layer(single), _values_layer(single, keys)
    value = f"v_{measure.name}"
    group = f"\nGROUP BY {', '.join(keys)}" if keys else ""
    select = ", ".join([*keys, "COUNT(DISTINCT value) AS n"])
    if _bounded_by_construction(single, keys):  # every unit keeps every value: count them
        return (f"WITH dp_rows AS (\n{rows}\n), dp_values AS (\n{values}\n)\n"
                f"SELECT {select}\nFROM (SELECT *, {value} AS value FROM dp_values){group}")
    unit_keys = ", ".join(["dp_unit", *keys])
    window = f"PARTITION BY {_qualified(keys)} ORDER BY hash($salt, k.dp_unit, value), value"
    conditions = ["b > 0", "value_rank <= b"] + ([f"group_rank <= {plan.query.rule.groups_per_unit}"] if keys else [])
    return (
        f"WITH dp_rows AS (\n{rows}\n), dp_values AS (\n{values}\n), dp_units AS (\n{_units_layer(single, keys)}\n), "
        f"{_granted_layer(single, keys)}, dp_distinct AS (\n"
        f"  SELECT DISTINCT {unit_keys}, {value} AS value\n  FROM dp_values\n  WHERE {value} IS NOT NULL\n), dp_kept AS (\n"
        f"  SELECT {', '.join(['k.' + k for k in keys] + ['value'])}, b, {'group_rank, ' if keys else ''}"
        f"ROW_NUMBER() OVER ({window}) AS value_rank\n"
        f"  FROM dp_distinct AS k JOIN dp_granted AS g ON {_same_unit_group(keys)}\n)\n"
        f"SELECT {select}\nFROM dp_kept\nWHERE {' AND '.join(conditions)}{group}"
    )


def rewrite_histogram(plan: Plan, measure: Measure) -> str:
    """Bounded bucket counts of one quantile: columns ``g0..``, ``bucket``, ``n``.

    Each unit's granted rows b of a (unit, group) are spread over its buckets in the order of
    a salted hash of (unit, bucket), so a unit puts at most b values into a group and at most
    k over all groups — the precondition of ``dpsql.mechanisms.quantile``.
    """
    single = replace(plan, measures=(measure,), selection=None)
    keys = [key.name for key in plan.query.keys]
    rows, values = _rows_layer(single), _values_layer(single, keys)
    value = f"v_{measure.name}"
    if _bounded_by_construction(single, keys):  # every unit keeps every value: count them
        group = ", ".join([*keys, "bucket"])
        return (f"WITH dp_rows AS (\n{rows}\n), dp_values AS (\n{values}\n)\n"
                f"SELECT {group}, COUNT(*) AS n\nFROM (SELECT *, {value} AS bucket FROM dp_values)\n"
                f"WHERE bucket IS NOT NULL\nGROUP BY {group}")
    unit_keys = ", ".join(["dp_unit", *keys])
    window = f"PARTITION BY {_qualified(keys)} ORDER BY hash($salt, k.dp_unit, bucket), bucket"
    earlier = f"COALESCE(SUM(n_bucket) OVER ({window} ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING), 0)"
    conditions = ["b > 0"] + ([f"group_rank <= {plan.query.rule.groups_per_unit}"] if keys else [])
    return (
        f"WITH dp_rows AS (\n{rows}\n), dp_values AS (\n{values}\n), dp_units AS (\n{_units_layer(single, keys)}\n), "
        f"{_granted_layer(single, keys)}, dp_buckets AS (\n"
        f"  SELECT {unit_keys}, {value} AS bucket, COUNT(*) AS n_bucket\n  FROM dp_values\n"
        f"  WHERE {value} IS NOT NULL\n  GROUP BY {unit_keys}, {value}\n), dp_spread AS (\n"
        f"  SELECT {', '.join(['k.' + k for k in keys] + ['bucket'])}, "
        f"GREATEST(LEAST(n_bucket, b - {earlier}), 0) AS n\n"
        f"  FROM dp_buckets AS k JOIN dp_granted AS g ON {_same_unit_group(keys)}\n"
        f"  WHERE {' AND '.join(conditions)}\n)\n"
        f"SELECT {', '.join([*keys, 'bucket'])}, SUM(n) AS n\nFROM dp_spread\nGROUP BY {', '.join([*keys, 'bucket'])}"
    )


def _qualified(keys: list[str]) -> str:
    """The (unit, group) columns of the per-value side ``k`` of a join with ``dp_granted``."""
    return ", ".join(f"k.{name}" for name in ["dp_unit", *keys])


def _same_unit_group(keys: list[str]) -> str:
    """A per-value row ``k`` joins its (unit, group)'s grant ``g``. A NULL key is a group too
    (the outside cell, ``dpsql.analysis.domains``, or a NULL key under partition selection), so keys
    match with IS NOT DISTINCT FROM: an equi-join (or USING) would drop those rows.

    >>> _same_unit_group(["g0"])
    'k.dp_unit = g.dp_unit AND k.g0 IS NOT DISTINCT FROM g.g0'
    """
    return " AND ".join(["k.dp_unit = g.dp_unit", *(f"k.{name} IS NOT DISTINCT FROM g.{name}" for name in keys)])


def _bounded_sql(plan: Plan) -> str:
    query = plan.query
    keys = [key.name for key in query.keys]
    if not keys and not plan.measures and plan.selection is None:
        return "SELECT 1 AS dp_none"  # every measure has SQL of its own: nothing to read here
    rows = _rows_layer(plan)
    values = _values_layer(plan, keys)
    if _rows_bounded_by_construction(plan):
        if not _groups_bounded_by_construction(plan, keys):
            final = _direct_totals(plan, keys, source="dp_limited")
            return (f"WITH dp_rows AS (\n{rows}\n), dp_values AS (\n{values}\n), "
                    f"{_group_limit_layer(plan, keys)}\n{final}")
        final = _direct_totals(plan, keys)
        return f"WITH dp_rows AS (\n{rows}\n), dp_values AS (\n{values}\n)\n{final}"
    units = _units_layer(plan, keys)
    granted = _granted_layer(plan, keys)
    final = _unit_level_totals(plan, keys)
    return (
        f"WITH dp_rows AS (\n{rows}\n), dp_values AS (\n{values}\n), dp_units AS (\n{units}\n), "
        f"{granted}\n{final}"
    )


def _sql(node: exp.Expression) -> str:
    return expand_clamps(node).sql(dialect=DIALECT)


def expand_clamps(node: exp.Expression) -> exp.Expression:
    """dpsql's CLAMP(x, lo, hi) as DuckDB SQL: NULL and NaN stay NULL, the rest is clamped.

    >>> import sqlglot
    >>> expand_clamps(sqlglot.parse_one("SELECT CLAMP(x, 0, 10)")).sql(dialect="duckdb")
    'SELECT CASE WHEN x IS NULL OR ISNAN(CAST(x AS DOUBLE)) THEN NULL ELSE LEAST(GREATEST(x, 0), 10) END'
    """
    def visit(sub: exp.Expression) -> exp.Expression:
        parts = clamp_arguments(sub)
        if parts is None:
            return sub
        value, low, high = parts
        text = value.sql(dialect=DIALECT)
        return exp.maybe_parse(
            f"CASE WHEN {text} IS NULL OR ISNAN(CAST({text} AS DOUBLE)) THEN NULL "
            f"ELSE LEAST(GREATEST({text}, {literal(low)}), {literal(high)}) END", dialect=DIALECT)

    return node.transform(visit)


def _total(node: exp.Expression) -> str:
    """Make a row-level expression total: errors become NULL."""
    return _sql(node) if isinstance(node, SAFE_NODES) else f"TRY({_sql(node)})"


def literal(value: Fraction | int | str) -> str:
    """An exact SQL literal for a policy number or key.

    >>> literal(Fraction(1, 4)), literal(Fraction(1, 3)), literal("O'Hara")
    ('0.25', '(1 / 3)', "'O''Hara'")
    """
    if isinstance(value, str):
        return "'" + value.replace("'", "''") + "'"
    value = Fraction(value)
    if value.denominator == 1:
        return str(value.numerator)
    denominator = value.denominator
    while denominator % 2 == 0:
        denominator //= 2
    while denominator % 5 == 0:
        denominator //= 5
    if denominator == 1:  # a finite decimal: write it exactly
        digits = 0
        while (value * 10**digits).denominator != 1:
            digits += 1
        scaled = value * 10**digits
        sign = "-" if scaled < 0 else ""
        text = str(abs(scaled.numerator)).rjust(digits + 1, "0")
        return f"{sign}{text[:-digits]}.{text[-digits:]}"
    return f"({value.numerator} / {value.denominator})"


def clamp_column_sql(column: ClampedColumn) -> str:
    """A column clamped into its policy bounds, NULL and NaN kept NULL.

    >>> clamp_column_sql(ClampedColumn("amount", Fraction(0), Fraction(500), True))
    'CASE WHEN "amount" IS NULL OR ISNAN("amount") THEN NULL ELSE LEAST(GREATEST("amount", 0), 500) END'
    """
    name = f'"{column.name}"'
    missing = f"{name} IS NULL OR ISNAN({name})" if column.floating else f"{name} IS NULL"
    return (
        f"CASE WHEN {missing} THEN NULL ELSE "
        f"LEAST(GREATEST({name}, {literal(column.lower)}), {literal(column.upper)}) END"
    )


def _in_value_position(column: exp.Column, root: exp.Expression) -> bool:
    """False when the column only feeds a condition (a WHEN, a comparison): it is not summed."""
    node = column.parent
    while node is not None and node is not root.parent:
        if isinstance(node, (exp.Predicate, exp.Connector, exp.Not)):
            return False
        node = node.parent
    return True


def clamp_inputs(argument: exp.Expression, clamped: tuple[ClampedColumn, ...]) -> exp.Expression:
    """Replace bounded columns in value positions of ``argument`` with their clamped form."""
    by_name = {c.name: c for c in clamped}
    tree = argument.copy()
    wrapper = exp.Paren(this=tree)  # a parent, so the root column can be replaced too
    for column in list(tree.find_all(exp.Column)):
        rule = by_name.get(column.name)
        if rule is not None and _in_value_position(column, wrapper.this):
            column.replace(exp.Paren(this=_clamped_column(rule).copy()))
    return wrapper.this


@lru_cache(maxsize=1024)
def _clamped_column(column: ClampedColumn) -> exp.Expression:
    """``clamp_column_sql`` parsed, once per column rule (parsing costs about a millisecond);
    callers copy it before placing it in a tree."""
    return exp.maybe_parse(clamp_column_sql(column), dialect=DIALECT)


def _raw_value_sql(measure: Measure) -> str:
    if measure.argument is None:
        return "1"
    if measure.kind == "histogram":  # the bucket: floor((value - offset) / width)
        evaluated = _sql(clamp_inputs(measure.argument, measure.clamped_columns))
        return (f"TRY(CAST(FLOOR((({evaluated}) - {literal(measure.offset)}) * {literal(1 / measure.grid)}) "
                f"AS BIGINT))")
    if measure.kind in ("count", "distinct") and not measure.clamped_columns and measure.counts_values_of is None:
        return _total(measure.argument)  # COUNT: only NULL-ness matters; DISTINCT: the value itself
    evaluated = _sql(clamp_inputs(measure.argument, measure.clamped_columns))
    scaled = f"CAST(({evaluated}) AS BIGINT)" if measure.grid == 1 else \
        f"CAST(ROUND(CAST(({evaluated}) AS DOUBLE) * {power_of_two(1 / measure.grid)}) AS BIGINT)"
    return scaled if _cannot_fail(measure) else f"TRY({scaled})"


def power_of_two(value: Fraction) -> str:
    """A power of two as an exact DOUBLE literal: scaling by it is exact in floating point (the
    product never needs more digits, as a DECIMAL literal's would: 2**-37 written out has 37
    decimals, a DECIMAL(38,37) that overflows when multiplied by 10).

    >>> power_of_two(Fraction(1, 2**37)), power_of_two(Fraction(2**40))
    ("CAST('7.275957614183426e-12' AS DOUBLE)", "CAST('1099511627776.0' AS DOUBLE)")
    """
    exponent = value.numerator.bit_length() - 1 if value >= 1 else -(value.denominator.bit_length() - 1)
    if value <= 0 or Fraction(2) ** exponent != value or abs(exponent) > 1000:
        raise ValueError(f"{value} is not a power of two a double holds exactly")
    return f"CAST('{float(value)!r}' AS DOUBLE)"


def _cannot_fail(measure: Measure) -> bool:
    """True for a bare bounded column: clamped (into literals within its bounds), it is NULL or
    finite within [lo, hi]; scaled by the exact power of two 1/grid and rounded, it lies within
    [L, U] grid units, up to the double's relative rounding of 2**-53 and one unit of ROUND —
    below 2**63 when max(|L|, |U|) < 2**62 (``dpsql.analysis.analyse`` refuses larger), so the cast to
    BIGINT cannot overflow and TRY (a per-row cost) is not needed. The clamp of ``dp_values``
    then makes the bounds exact."""
    argument = measure.argument
    bounded = {c.name for c in measure.clamped_columns}
    return isinstance(argument, exp.Column) and argument.name in bounded and \
        max(abs(measure.lower), abs(measure.upper)) < 2**62


def _domain_filter(column: str, domain: KeyDomain, column_type: str) -> str:
    """Keep rows whose key is in the public domain, compared in the column's own type: each domain
    value is TRY_CAST to it, so no implicit coercion of the private column can fail on one unit's
    value ('x' in a VARCHAR column against numeric keys) — the comparison is total."""
    source, value = _domain_source(domain, f'"{domain.column}"' if domain.values is None else "v")
    return f'"{column}" IN (SELECT TRY_CAST({value} AS {column_type}) FROM {source})'


def _domain_source(domain: KeyDomain, column: str) -> tuple[str, str]:
    """FROM of a public domain (a listed one as VALUES ... AS d(v)) and the column it reads."""
    if domain.values is None:
        return _table_sql(domain.table), column
    numbers = [Fraction(v) for v in domain.values if not isinstance(v, str)]
    # VALUES gives its column one type: a UHUGEINT key beyond HUGEINT's range with a small one
    # is DuckDB's conversion error, so such keys are listed as exact text (TRY_CAST reads it).
    as_text = any(not -2**127 <= n < 2**127 for n in numbers if n.denominator == 1)
    texts = [literal(v) if isinstance(v, str) else literal(Fraction(v)) for v in domain.values]
    rows = ", ".join(f"({literal(t) if as_text and not isinstance(v, str) else t})"
                     for v, t in zip(domain.values, texts))
    return f"(VALUES {rows}) AS d(v)", "v"


def _table_sql(name: str) -> str:
    return ".".join(f'"{part}"' for part in name.split("."))


def _rows_layer(plan: Plan) -> str:
    query = plan.query
    select = [f'"{query.rule.unit.lower()}" AS dp_unit']
    select += [f"{_key_sql(key)} AS {key.name}" for key in query.keys]
    outside = reports_outside(query.keys)
    for measure in plan.measures:
        if measure.counts_values_of is None and measure.argument is not None:
            select.append(f"{_raw_value_sql(measure)} AS r_{measure.name}")
    # Rows with no unit belong to nobody we can bound: merging them into one pseudo-unit
    # would let one person move it by the full spread of a mixed-sign sum.
    conditions = [f'"{query.rule.unit.lower()}" IS NOT NULL']
    if query.where is not None:
        conditions.append(f"COALESCE({_total(query.where)}, FALSE)")
    if not outside:
        conditions += [_domain_filter(key.expression.name, key.domain, query.column_type(key.expression.name))
                       for key in query.keys if key.domain]
    where = f"\n  WHERE {' AND '.join(conditions)}" if conditions else ""
    columns = ", ".join(select)
    if query.source is None:
        source = _table_sql(query.table)
    elif isinstance(query.source, exp.Table):
        source = _sql(query.source)
    else:
        source = f"(\n{_sql(query.source)}\n  ) AS dp_source"
    rows = f"  SELECT {columns}\n  FROM {source}{where}"
    if not outside:
        return rows
    # Keys that are not released keys become NULL: one more group, the outside cell
    # (dpsql.analysis.domains). Each key is computed once, below, and compared in its read-back form.
    inside = " AND ".join(_membership(query, part) for part in domain_parts(query.keys))
    keys = ", ".join(f"CASE WHEN {inside} THEN {key.name} END AS {key.name}" for key in query.keys)
    return f"  SELECT * REPLACE ({keys})\n  FROM (\n{rows}\n  ) AS dp_keyed"


def _membership(query, part: list[int]) -> str:
    """A row's keys of one domain part are among the released ones (``domain_membership``)."""
    keys = [query.keys[i] for i in part]
    return domain_membership(keys, [query.column_type(k.expression.name) for k in keys],
                             [k.name for k in keys])


def _key_sql(key: GroupKey) -> str:
    """A key as grouped and read back: made total, then in its form (``dpsql.backends.keys``)."""
    return key_sql(_total(key.expression), key.type_name or "", key.form)


def _values_layer(plan: Plan, keys: list[str]) -> str:
    select = ["dp_unit", *keys]
    for measure in plan.measures:
        if measure.counts_values_of is not None or measure.argument is None:
            continue
        raw = f"r_{measure.name}"
        if measure.kind in ("count", "distinct") and not measure.clamped_columns:
            select.append(f"{raw} AS v_{measure.name}")
        else:
            select.append(
                f"CASE WHEN {raw} IS NULL THEN NULL ELSE LEAST(GREATEST({raw}, {measure.lower}), "
                f"{measure.upper}) END AS v_{measure.name}"
            )
    return f"  SELECT {', '.join(select)}\n  FROM dp_rows"


def _value_column(measure: Measure) -> str:
    return f"v_{measure.counts_values_of or measure.name}"


def _centred(measure: Measure, value: str) -> str:
    return f"(2 * CAST({value} AS HUGEINT) - ({measure.lower + measure.upper}))"


def _rows_bounded_by_construction(plan: Plan) -> bool:
    """True when the source holds at most k rows per unit whatever the data (a bounded copy,
    ``dpsql.backends.bounding``): layer 3 would grant every unit all its rows (b = n)."""
    query = plan.query
    held = query.rows_per_unit
    return held is not None and held <= query.rule.max_rows_per_unit


def _groups_bounded_by_construction(plan: Plan, keys: list[str]) -> bool:
    """True when, its rows bounded, a unit cannot touch more groups than allowed either: it
    has at most k rows, so at most k groups. Then summing row values per group gives exactly
    layer 3's result: a unit's rows are at most k values in [L, U] over at most MAX GROUPS
    PER UNIT groups, the precondition of the sensitivity rule."""
    return not keys or plan.query.rule.groups_per_unit >= plan.query.rows_per_unit


def _bounded_by_construction(plan: Plan, keys: list[str]) -> bool:
    """True when layer 3 would keep every row of every unit: rows and groups both bounded."""
    return _rows_bounded_by_construction(plan) and _groups_bounded_by_construction(plan, keys)


def _group_limit_layer(plan: Plan, keys: list[str]) -> str:
    """``dp_limited``: the rows of each unit's first MAX GROUPS PER UNIT groups, in the order
    of a salted hash of its own (unit, key) values — the groups layer 3 would keep, each with
    all its rows (the unit's rows are at most k already). A window over rows, not over
    per-(unit, group) aggregates: one sort instead of an aggregation and two sorts."""
    order = f"hash($salt, dp_unit, {', '.join(keys)}), {', '.join(keys)}"
    return (f"dp_limited AS (\n  SELECT * FROM (SELECT *, DENSE_RANK() OVER (PARTITION BY dp_unit ORDER BY {order}) "
            f"AS group_rank FROM dp_values)\n  WHERE group_rank <= {plan.query.rule.groups_per_unit}\n)")


def _units_counted(plan: Plan) -> str:
    """Distinct units of a group, from rows of units light by construction: each unit once —
    or each row, when a unit has at most one row (a row-level table read directly)."""
    return "COUNT(*)" if plan.query.rows_per_unit == 1 else "COUNT(DISTINCT dp_unit)"


def _row_value_sum(measure: Measure, plan: Plan) -> str:
    """Per-group total of a measure from row values of units light by construction."""
    if measure.kind == "units":
        return _units_counted(plan)
    if measure.kind == "count":
        return "COUNT(*)" if measure.argument is None else f"COUNT({_value_column(measure)})"
    value = _value_column(measure)
    if measure.squared:
        return f"SUM({_centred(measure, value)} * {_centred(measure, value)})"
    if measure.centred:  # sum(2v - (L + U)) = 2 sum(v) - (L + U) count(v): no per-row HUGEINT
        return f"(2 * SUM({value}) - CAST(COUNT({value}) AS HUGEINT) * ({measure.lower + measure.upper}))"
    return f"SUM({value})"  # BIGINT values: DuckDB sums them exactly, as HUGEINT


def _direct_totals(plan: Plan, keys: list[str], source: str = "dp_values") -> str:
    select = keys + [f"{_row_value_sum(m, plan)} AS {m.name}" for m in plan.measures]
    if plan.selection is not None:  # units per group: what partition selection thresholds
        select.append(f"{_units_counted(plan)} AS {plan.selection.measure}")
    group = f"\nGROUP BY {', '.join(keys)}" if keys else ""
    return f"SELECT {', '.join(select or ['1 AS dp_none'])}\nFROM {source}{group}"


def _units_layer(plan: Plan, keys: list[str]) -> str:
    select = ["dp_unit", *keys, "COUNT(*) AS n"]
    for measure in plan.measures:
        if measure.argument is None or measure.counts_values_of is not None:
            continue
        value = f"v_{measure.name}"
        select.append(f"COUNT({value}) AS c_{measure.name}")
        if measure.squared:
            select.append(f"SUM({_centred(measure, value)} * {_centred(measure, value)}) AS s_{measure.name}")
        elif measure.kind == "sum":
            select.append(f"SUM({value}) AS s_{measure.name}")  # exact: BIGINT sums are HUGEINT
    return f"  SELECT {', '.join(select)}\n  FROM dp_values\n  GROUP BY {', '.join(['dp_unit', *keys])}"


def _granted_layer(plan: Plan, keys: list[str]) -> str:
    """The CTEs granting each (unit, group) its rows ``b`` and rank: ``dp_granted`` (and
    ``dp_sizes`` when grouped).

    Grouped, most units are *light*: at most k rows in at most l groups, so the prefix budget
    grants every row (b = n) and every group survives; only *heavy* units need the window
    over their groups in salted-hash order. Both branches give exactly what the window gives
    for every unit (tests compare them), and each depends only on the unit's own rows.
    """
    rule = plan.query.rule
    k = rule.max_rows_per_unit
    if not keys:
        return f"dp_granted AS (\n  SELECT *, LEAST(n, {k}) AS b\n  FROM dp_units\n)"
    l = rule.groups_per_unit
    order = f"hash($salt, dp_unit, {', '.join(keys)}), {', '.join(keys)}"
    window = f"PARTITION BY dp_unit ORDER BY {order}"
    earlier = f"COALESCE(SUM(n) OVER ({window} ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING), 0)"
    light = f"dp_total <= {k} AND dp_groups <= {l}"
    return (
        f"dp_sizes AS (\n  SELECT *, SUM(n) OVER (PARTITION BY dp_unit) AS dp_total, "
        f"COUNT(*) OVER (PARTITION BY dp_unit) AS dp_groups\n  FROM dp_units\n), dp_granted AS (\n"
        f"  SELECT * EXCLUDE (dp_total, dp_groups), n AS b, 1 AS group_rank\n  FROM dp_sizes WHERE {light}\n"
        f"  UNION ALL\n"
        f"  SELECT * EXCLUDE (dp_total, dp_groups), GREATEST(LEAST(n, {k} - {earlier}), 0) AS b, "
        f"ROW_NUMBER() OVER ({window}) AS group_rank\n  FROM dp_sizes WHERE NOT ({light})\n)"
    )


def _contribution(measure: Measure) -> str:
    """One (unit, group)'s bounded contribution to a measure."""
    if measure.kind == "units":
        return "1"
    if measure.kind == "count" and measure.argument is None:
        return "b"
    values_of = measure.counts_values_of or measure.name
    kept = f"LEAST(c_{values_of}, b)"
    if measure.kind == "count":
        return kept
    total = f"s_{measure.name}"
    spread = measure.upper - measure.lower
    if measure.squared:
        low, high = 0, spread * spread
    elif measure.centred:
        total = f"(2 * {total} - ({measure.lower + measure.upper}) * c_{measure.name})"
        low, high = -spread, spread
    else:
        low, high = min(measure.lower, 0), max(measure.upper, 0)
    # A unit with more values than it is granted contributes its total scaled by kept / all
    # (as if `kept` of its values were sampled), not its total clamped: clamping would count a
    # heavy unit as `kept` values at a bound. The scaled total is in kept * [L, U] already; the
    # clamp stays as the guarantee.
    scaled = f"{total} * {kept} // NULLIF(c_{values_of}, 0)"
    return (
        f"LEAST(GREATEST({scaled}, CAST({kept} AS HUGEINT) * {low}), "
        f"CAST({kept} AS HUGEINT) * {high})"
    )


def _unit_level_totals(plan: Plan, keys: list[str]) -> str:
    select = keys + [f"SUM({_contribution(m)}) AS {m.name}" for m in plan.measures]
    if plan.selection is not None:  # distinct units per group, for partition selection
        select.append(f"COUNT(*) AS {plan.selection.measure}")
    conditions = ["b > 0"]
    if keys:
        conditions.append(f"group_rank <= {plan.query.rule.groups_per_unit}")
    group = f"\nGROUP BY {', '.join(keys)}" if keys else ""
    return f"SELECT {', '.join(select or ['1 AS dp_none'])}\nFROM dp_granted\nWHERE {' AND '.join(conditions)}{group}"


def domain_sql(keys: list, column_types: list[str], *, ordered: bool = True) -> str:
    """SQL listing the public domain of one key — or the combinations one public table holds
    of several — each value TRY_CAST to its column's type, kept where the key's narrowing WHERE
    conjuncts hold on it (``dpsql.analysis.domains``), and read back in its key's form, as the bounded
    SQL reads that key (reads public data only).

    >>> import sqlglot
    >>> from sqlglot import exp
    >>> from dpsql.analysis.plan import GroupKey
    >>> domain_sql([GroupKey("g0", exp.column("n"), KeyDomain(values=(1, 2)))], ["INTEGER"])
    'SELECT DISTINCT v0 AS k0 FROM (SELECT TRY_CAST(v AS INTEGER) AS v0 FROM (VALUES (1), (2)) AS d(v)) AS dp_domain WHERE v0 IS NOT NULL ORDER BY ALL'
    >>> narrowed = (sqlglot.parse_one("plan IN ('free', 'pro')"),)
    >>> domain_sql([GroupKey("g0", exp.column("plan"), KeyDomain(values=("free",)), "VARCHAR", "text", narrowed)], ["VARCHAR"], ordered=False)
    "SELECT DISTINCT encode(CAST(v0 AS VARCHAR)) AS k0 FROM (SELECT TRY_CAST(v AS VARCHAR) AS v0 FROM (VALUES ('free')) AS d(v)) AS dp_domain WHERE v0 IS NOT NULL AND COALESCE(TRY(v0 IN ('free', 'pro')), FALSE)"
    """
    domain = keys[0].domain
    if domain.values is not None:
        source, column = _domain_source(domain, "v")
        columns = [column]
    else:
        source, columns = _table_sql(domain.table), [f'"{key.domain.column}"' for key in keys]
    typed = ", ".join(f"TRY_CAST({c} AS {t}) AS v{i}" for i, (c, t) in enumerate(zip(columns, column_types)))
    # A joined public table's other columns its keys' narrowing reads: as stored, the values
    # the joined rows carry (``dpsql.analysis.domains.narrow_keys``).
    others = list(dict.fromkeys(pair for key in keys for pair in key.narrowing_columns))
    names = {key.expression.name.lower(): f"v{i}" for i, key in enumerate(keys)}
    for j, (name, public) in enumerate(others):
        names.setdefault(name, f"dp_c{j}")
    typed += "".join(f', "{public}" AS dp_c{j}' for j, (_, public) in enumerate(others))
    select = ", ".join(f"{key_sql(f'v{i}', t, key.form)} AS k{i}"
                       for i, (key, t) in enumerate(zip(keys, column_types)))
    conditions = [f"v{i} IS NOT NULL" for i in range(len(columns))]
    for i, key in enumerate(keys):
        mapping = {**names, key.expression.name.lower(): f"v{i}"}
        conditions += [f"COALESCE({_total(on_value(c, mapping))}, FALSE)" for c in key.narrowed_by]
    order = " ORDER BY ALL" if ordered else ""
    return (f"SELECT DISTINCT {select} FROM (SELECT {typed} FROM {source}) AS dp_domain "
            f"WHERE {' AND '.join(conditions)}{order}")


def domain_membership(keys: list, column_types: list[str], rows: list[str]) -> str:
    """A condition true when a row's keys (``rows``: their SQL, in the keys' forms) are one of
    the released combinations of one domain part (``domain_sql``); NULL keys are never in.

    >>> from sqlglot import exp
    >>> from dpsql.analysis.plan import GroupKey
    >>> domain_membership([GroupKey("g0", exp.column("n"), KeyDomain(values=(1,)))], ["INTEGER"], ['"n"'])
    '"n" IN (SELECT k0 FROM (SELECT DISTINCT v0 AS k0 FROM (SELECT TRY_CAST(v AS INTEGER) AS v0 FROM (VALUES (1)) AS d(v)) AS dp_domain WHERE v0 IS NOT NULL))'
    """
    listed = domain_sql(keys, column_types, ordered=False)
    if len(keys) == 1:
        return f"{rows[0]} IN (SELECT k0 FROM ({listed}))"
    matches = " AND ".join(f"dp_d.k{i} = {row}" for i, row in enumerate(rows))
    return f"EXISTS (SELECT 1 FROM ({listed}) AS dp_d WHERE {matches})"
