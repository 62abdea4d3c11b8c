"""Split an aggregate query into a private core and a post-processing query.

The *core* is what differential privacy releases: per group, one noisy value for every
distinct aggregate call the query makes (in the select list, HAVING or ORDER BY). The *post*
query is the analyst's query rewritten over the core's noisy result, table ``dp_core`` with
columns ``g0..`` (keys) and ``a0..`` (aggregates): aggregates and key expressions become column
references, HAVING becomes WHERE, and ORDER BY, LIMIT, OFFSET and DISTINCT stay. DP is closed
under post-processing, so the post query costs nothing — and it never sees an exact value,
because the core holds none.

>>> import sqlglot
>>> from dpsql.analysis.plan import GroupKey
>>> tree = sqlglot.parse_one("SELECT store, ROUND(SUM(x) / COUNT(*), 1) AS mean FROM t GROUP BY store "
...                          "HAVING COUNT(*) > 10 ORDER BY mean DESC")
>>> keys = [GroupKey("g0", tree.find(exp.Group).expressions[0], None)]
>>> aggregates, post, outputs, direct = split_aggregates(tree, keys, "")
>>> [a.label for a in aggregates]
['SUM(x)', 'COUNT(*)']
>>> post.sql()
'SELECT g0 AS store, ROUND(a0 / a1, 1) AS mean FROM dp_core WHERE a1 > 10 ORDER BY mean DESC'
"""

from __future__ import annotations

from sqlglot import exp

from dpsql.analysis.aggregates.family import Call
from dpsql.analysis.aggregates.registry import FAMILIES, family_for_call
from dpsql.analysis.bind import is_bound, written_name
from dpsql.analysis.plan import Aggregate, GroupKey
from dpsql.sql.allowlist import check_post, check_row_level, refuse
from dpsql.sql.parse import DIALECT, describe
from dpsql.sql.pieces import Total, total

NAMED_BY_FUNCTION = {exp.Count: "count", exp.Sum: "sum", exp.Avg: "avg"}
"""Calls DuckDB names ``function(argument)`` in lower case, whatever the analyst wrote."""


def split_aggregates(tree: exp.Select, keys: list[GroupKey], unit: str | None = None,
                     names: list[str] | None = None):
    """(aggregates, post query, output names, direct outputs) of a bound private SELECT;
    ``names`` are the output names as written (binding may have renamed columns)."""
    aggregates: list[Aggregate] = []

    def register(call: exp.Expression) -> exp.Column:
        aggregate = classify(call, unit, f"a{len(aggregates)}")
        for existing in aggregates:
            if _same(existing, aggregate):
                return exp.column(existing.name)
        aggregates.append(aggregate)
        return exp.column(aggregate.name)

    outputs, items, direct = [], [], []
    earlier: dict[str, exp.Expression] = {}  # alias -> its item, for lateral column aliases
    for position, item in enumerate(tree.expressions):
        if isinstance(item.unalias(), exp.Star):
            refuse(item, "SELECT * would release private rows",
                   "select aggregates such as COUNT(*), SUM(col) or AVG(col)")
        name = names[position] if names else output_name(item)
        written = _inline_lateral(item.unalias().copy(), earlier)
        if isinstance(item, exp.Alias):
            earlier[item.alias.lower()] = written
        value = _replace(written.copy(), keys, register, unit)
        if isinstance(item.unalias(), AGGREGATE_CALLS) and isinstance(value, exp.Column):
            direct.append((name, value.name))
        outputs.append(name)
        items.append(exp.alias_(value, name, quoted=not _plain(name)))
    post = exp.Select(expressions=items).from_("dp_core")
    having = tree.args.get("having")
    if having is not None:
        post = post.where(_replace(having.this.copy(), keys, register, unit))
    order = tree.args.get("order")
    if order is not None:
        post.set("order", _replace(order.copy(), keys, register, unit))
    for part in ("limit", "offset", "distinct"):
        if tree.args.get(part) is not None:
            post.set(part, tree.args[part].copy())
    if not aggregates and not keys:  # GROUP BY with no aggregate releases its keys
        refuse(tree, "a query over a private table must aggregate",
               "select COUNT(*), SUM(col) or AVG(col)")
    _check_post_query(post)
    return aggregates, post, outputs, direct


AGGREGATE_CALLS = (exp.AggFunc, exp.Filter, exp.WithinGroup)


def _inline_lateral(node: exp.Expression, earlier: dict[str, exp.Expression]) -> exp.Expression:
    """``COUNT(*) AS n, n * 2``: a select item naming an earlier item's alias (left unbound by
    bind, see ``bind_columns``'s ``lateral``) gets that item's expression, in parentheses."""
    def visit(sub: exp.Expression):
        if isinstance(sub, exp.Column) and not sub.table and not is_bound(sub) and sub.name.lower() in earlier:
            return exp.paren(earlier[sub.name.lower()].copy(), copy=False)
        return sub

    return node.transform(visit, copy=False) if earlier else node


def _replace(node: exp.Expression, keys: list[GroupKey], register, unit: str | None = None):
    """Aggregates -> a*, key expressions -> g*; anything else private is refused."""
    def visit(sub: exp.Expression):
        if isinstance(sub, AGGREGATE_CALLS):
            return register(sub)
        for key in keys:
            if sub == key.expression:
                return exp.column(key.name)
        if isinstance(sub, exp.Window):
            refuse(sub, "window functions are not supported", "aggregate with GROUP BY instead")
        return sub

    replaced = node.transform(visit, copy=False)
    for column in replaced.find_all(exp.Column):
        if _is_core_column(column.name):
            continue
        if _is_alias_reference(column):
            continue
        written = written_name(column)
        hint = (f"count the units with COUNT(DISTINCT {written})" if column.name == unit else
                f"wrap it in COUNT, SUM or AVG, or GROUP BY {written}")
        refuse(column, f"column {written} is neither aggregated nor grouped, so it would "
               "release private values", hint)
    return replaced


def _is_core_column(name: str) -> bool:
    return len(name) > 1 and name[0] in "ag" and name[1:].isdigit()


def _is_alias_reference(column: exp.Column) -> bool:
    # ORDER BY / HAVING may name an output alias; bind left those unresolved.
    return not is_bound(column)


def _check_post_query(post: exp.Select) -> None:
    for item in post.expressions:
        check_post(item.unalias(), "the select list")
    if post.args.get("where") is not None:
        check_post(post.args["where"].this, "HAVING")
    if post.args.get("order") is not None:
        for ordered in post.args["order"].expressions:
            check_post(ordered.this, "ORDER BY")
    for part in ("limit", "offset"):
        node = post.args.get(part)
        if node is not None:
            value = node.expression
            if not (isinstance(value, exp.Literal) and not value.is_string and value.this.isdigit()):
                refuse(node, f"{part.upper()} must be a non-negative integer constant",
                       f"write {part.upper()} 10")


def classify(call: exp.Expression, unit: str | None, name: str) -> Aggregate:
    """What one aggregate call computes, as the family that owns it classifies it; refuses the
    calls no family can make private."""
    label = call.sql(dialect=DIALECT).replace('"', "")
    condition = None
    if isinstance(call, exp.Filter):
        condition = call.expression.this
        check_row_level(condition, "FILTER (WHERE ...)")
        call = call.this
    context = Call(name, label, condition, unit)
    family = family_for_call(call)
    if isinstance(call, exp.WithinGroup) and family is not None:  # its argument is in its ORDER BY
        return family.classify(call, None, context)
    argument = call.this if not isinstance(call.this, exp.Star) else None
    if call.this is None and not isinstance(call, exp.Count):  # count() is COUNT(*); MIN() means nothing
        refuse(call, f"{describe(call)[:-5]}() needs an argument", f"name a column: {describe(call)[:-5]}(col)")
    if isinstance(argument, exp.Distinct):
        for candidate in FAMILIES:
            aggregate = candidate.classify_distinct(call, argument.expressions, context)
            if aggregate is not None:
                return aggregate
        refuse(call, f"{describe(call)} with DISTINCT is supported only as COUNT(DISTINCT expr)",
               "count distinct values with COUNT(DISTINCT col), or drop DISTINCT")
    if argument is not None:
        check_row_level(argument, f"{describe(call)}")
    if family is None:
        refuse(call, f"aggregate {describe(call)} is not supported",
               "use COUNT, SUM, AVG, VARIANCE, STDDEV, MEDIAN, QUANTILE_CONT, MIN or MAX")
    return family.classify(call, argument, context)


def _same(a: Aggregate, b: Aggregate) -> bool:
    return (a.function, a.argument, a.other, a.sample, a.quantile, a.unit_bounds) == (
        b.function, b.argument, b.other, b.sample, b.quantile, b.unit_bounds)


def output_name(node: exp.Expression) -> str:
    """The column name DuckDB would give a select-list item."""
    if isinstance(node, exp.Alias):
        return node.alias
    if isinstance(node, exp.Column):
        return node.name
    if isinstance(node, exp.Count) and (node.this is None or isinstance(node.this, exp.Star)):
        return "count_star()"  # count() is DuckDB's COUNT(*)
    if isinstance(node, exp.AggFunc) and type(node) in NAMED_BY_FUNCTION:
        return f"{NAMED_BY_FUNCTION[type(node)]}({node.this.sql(dialect=DIALECT)})".replace('"', "")
    return node.sql(dialect=DIALECT).replace('"', "")


def _plain(name: str) -> bool:
    return name.isidentifier() and name.lower() == name


def total_post(post: exp.Select) -> exp.Select:
    """The post-processing query as it runs, carrying the core row number along unless DISTINCT
    merges rows; the backend renders it.

    It runs after the charge, so it must not fail (DESIGN.md: nothing after the charge may
    fail): every select-list, HAVING and ORDER BY expression that computes anything is made
    total (``dpsql.sql.pieces.total``, DuckDB's ``TRY``), so an overflowing cast or a logarithm
    of a noisy zero gives NULL, not an error — a NULL in a row rather than a charged failure.
    ``post`` itself stays as written (``dpsql.query.accuracy`` derives intervals from its tree, never
    from this one).

    >>> import sqlglot
    >>> post = sqlglot.parse_one("SELECT g0 AS k, CAST(a0 * 30 AS TINYINT) AS v FROM dp_core "
    ...                          "WHERE LN(a0) > 1 ORDER BY v, a0 / 2", read="duckdb")
    >>> from dpsql.backends.render import render
    >>> for part in render(total_post(post)).split(" FROM "): print(part)
    SELECT g0 AS k, TRY(CAST(a0 * 30 AS TINYINT)) AS v, dp_row
    dp_core WHERE TRY(LN(a0) > 1) ORDER BY v, TRY(a0 / 2)
    """
    runs = post.copy()
    null_on_zero_divisors(runs)
    for item in runs.expressions:
        value = item.unalias()
        if _can_fail(value):
            value.replace(total(value.copy()))
    where = runs.args.get("where")
    if where is not None and _can_fail(where.this):
        where.set("this", total(where.this))
    if runs.args.get("order") is not None:
        for ordered in runs.args["order"].expressions:
            if _can_fail(ordered.this):
                ordered.set("this", total(ordered.this))
    if post.args.get("distinct") is not None:
        return runs
    return runs.select(exp.column("dp_row"), append=True, copy=False)


def null_on_zero_divisors(node: exp.Expression) -> exp.Expression:
    """``node`` (changed in place) with every divisor of ``/`` and ``%`` made NULL when it is 0:
    a noisy COUNT or SUM can come out 0, and DuckDB's 1/0 is inf, 0/0 and 5.0 % 0 NaN, where
    SQL under TRY (and DuckDB's own ``//`` and integer ``%``) give NULL. Post-processing then
    answers NULL for a ratio over a noisy 0, never ±inf or NaN (-0.0 is 0 too).

    >>> import sqlglot
    >>> null_on_zero_divisors(sqlglot.parse_one("a0 / (a1 % a2) + a0 / 2", read="duckdb")).sql("duckdb")
    'a0 / NULLIF((a1 % NULLIF(a2, 0)), 0) + a0 / 2'
    """
    for division in list(node.find_all(exp.Div, exp.Mod)):
        divisor = division.expression
        if not (isinstance(divisor, exp.Literal) and divisor.is_number and float(divisor.this) != 0):
            division.set("expression", exp.Nullif(this=divisor, expression=exp.Literal.number(0)))
    return node


def _can_fail(node: exp.Expression) -> bool:
    """Anything but a column or a constant may fail at run time (a cast, arithmetic, a function)."""
    return not isinstance(node, (exp.Column, exp.Literal, exp.Null, exp.Boolean, exp.Try, Total))


def plain_projection(post: exp.Select, core: list[str]) -> list[int] | None:
    """When the post query only picks core columns (no WHERE, ORDER BY, LIMIT, DISTINCT or
    arithmetic), the indices it picks: post-processing is then a reordering, done without SQL.

    >>> import sqlglot
    >>> plain_projection(sqlglot.parse_one("SELECT g0 AS store, a0 AS n FROM dp_core"), ["g0", "a0"])
    [0, 1]
    >>> plain_projection(sqlglot.parse_one("SELECT a0 * 2 AS n FROM dp_core"), ["a0"]) is None
    True
    """
    if any(post.args.get(part) for part in ("where", "order", "limit", "offset", "distinct", "group")):
        return None
    picked = []
    for item in post.expressions:
        column = item.unalias()
        if not isinstance(column, exp.Column) or column.name not in core:
            return None
        picked.append(core.index(column.name))
    return picked
