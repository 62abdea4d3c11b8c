"""Stage 3, check: accept an allow-listed query shape, or refuse it with its position.

Static: reads the SQL, the policy and the schema only, touches no data and costs nothing.
Accepted are (a) queries over public tables only, which run exactly, and (b) one SELECT over
one private table of COUNT(*), COUNT(expr), SUM(expr), AVG(expr), grouped by columns with a
public KEYS domain, filtered by a deterministic row-level WHERE, sorted and limited on the
released values. Every node is checked against an allow-list (a dispatch on node class);
anything else is refused with a ``DPError`` that names it, where it is, and what to write.
"""

from __future__ import annotations

from sqlglot import exp

from .bind import Catalog, bind_columns, bind_table, table_key
from .errors import UnsupportedQuery
from .model import Policy, PrivateTable
from .parse import DIALECT, describe, node_position
from .plan import Aggregate, GroupKey, OrderItem, PrivateQuery, PublicQuery

ROW_LEVEL_NODES = tuple(
    getattr(exp, name)
    for name in (
        "Column", "Identifier", "Literal", "Null", "Boolean", "Paren", "Neg", "Not", "And", "Or",
        "EQ", "NEQ", "NullSafeEQ", "NullSafeNEQ", "GT", "GTE", "LT", "LTE", "Is", "In", "Between",
        "Like", "ILike", "Add", "Sub", "Mul", "Div", "IntDiv", "Mod", "Case", "If", "Coalesce",
        "Least", "Greatest", "Abs", "Round", "Floor", "Ceil", "Sign", "Cast", "TryCast", "DataType",
        "DataTypeParam", "Extract", "Var", "Year", "Month", "Day", "Quarter", "DayOfWeek",
        "DayOfWeekIso", "DayOfMonth", "DayOfYear", "WeekOfYear", "TimestampTrunc", "DateTrunc",
        "Lower", "Upper", "Length", "Substring", "Trim", "DPipe", "Concat", "Interval", "Nullif",
        "StartsWith", "EndsWith", "Left", "Right", "Tuple",
    )
    if hasattr(exp, name)
)
"""Row-level constructs: deterministic, total once wrapped in TRY, cost linear in the row."""

ROW_LEVEL_FUNCTIONS = frozenset(
    {
        "date_part", "datepart", "dayname", "monthname", "isodow", "yearweek", "week", "hour",
        "minute", "second", "isnan", "isinf", "isfinite", "strlen", "contains", "prefix", "suffix",
    }
)
"""DuckDB functions sqlglot leaves anonymous that are safe on private rows."""

AGGREGATES = {exp.Count: "count", exp.Sum: "sum", exp.Avg: "avg"}

SELECT_PARTS_ALLOWED = {"expressions", "from", "from_", "where", "group", "order", "limit", "offset", "kind"}
"""Parts of a SELECT a private query may have; any other part present is refused by name."""


def check_query(tree: exp.Expression, sql: str, policy: Policy, catalog: Catalog) -> PrivateQuery | PublicQuery:
    """Decide whether ``tree`` can be answered, and describe it for the next stage."""
    tree = tree.copy()
    with_ = tree.args.get("with_") or tree.args.get("with")
    if with_:
        _refuse(with_, sql, "WITH (a CTE) is not supported yet",
                "write the CTE's query as the FROM table's filter, or query the table directly")
    tables = list(tree.find_all(exp.Table))
    if not tables:
        _refuse(tree, sql, "a query must read a declared table", "add FROM <table>")
    bound = [bind_table(t, policy, catalog, sql) for t in tables]
    if all(not isinstance(b.declaration, PrivateTable) for b in bound):
        return _check_public(tree, sql)
    return _check_private(tree, sql, policy, catalog)


def _refuse(node: exp.Expression, sql: str, message: str, hint: str) -> None:
    line, col = node_position(node, sql)
    raise UnsupportedQuery(message, line=line, col=col, construct=describe(node), hint=hint)


# ---------------------------------------------------------------------------------------------
# Public tables only: exact, free. Still allow-listed, so no function reaches files or settings.

PUBLIC_NODES = ROW_LEVEL_NODES + (
    exp.Select, exp.From, exp.Where, exp.Group, exp.Having, exp.Order, exp.Ordered, exp.Limit,
    exp.Offset, exp.Table, exp.TableAlias, exp.Alias, exp.Star, exp.Join, exp.Subquery,
    exp.Union, exp.Distinct, exp.AggFunc, exp.Window, exp.Filter,
)


def _check_public(tree: exp.Expression, sql: str) -> PublicQuery:
    for node in tree.walk():
        if isinstance(node, exp.Anonymous):
            if node.name.lower() not in ROW_LEVEL_FUNCTIONS:
                _refuse(node, sql, f"function {node.name} is not allowed", "use standard SQL functions")
        elif not isinstance(node, PUBLIC_NODES):
            _refuse(node, sql, f"{describe(node)} is not allowed here", "query declared tables with SELECT")
    return PublicQuery(tree.sql(dialect=DIALECT))


# ---------------------------------------------------------------------------------------------
# One private table: aggregates only.


def _check_private(tree: exp.Expression, sql: str, policy: Policy, catalog: Catalog) -> PrivateQuery:
    if not isinstance(tree, exp.Select):
        _refuse(tree, sql, f"{describe(tree)} over a private table is not supported", "write one SELECT")
    for part, value in tree.args.items():
        if value and part not in SELECT_PARTS_ALLOWED:
            node = value[0] if isinstance(value, list) else value
            node = node if isinstance(node, exp.Expression) else tree
            _refuse(node, sql, f"{_part_name(part)} is not supported over a private table",
                    _PART_HINTS.get(part, "aggregate one private table with COUNT, SUM or AVG"))
    from_ = tree.args.get("from_") or tree.args.get("from")
    if from_ is None or not isinstance(from_.this, exp.Table):
        _refuse(from_.this if from_ is not None else tree, sql, "a private query must read one table directly",
                "write SELECT ... FROM <table> without subqueries")
    table = bind_table(from_.this, policy, catalog, sql)
    rule = table.declaration
    for node in tree.walk():
        if isinstance(node, (exp.Subquery, exp.Select)) and node is not tree:
            _refuse(node, sql, "subqueries over a private table are not supported yet",
                    "compute the aggregate over the table directly")
    aliases = frozenset(e.alias.lower() for e in tree.expressions if isinstance(e, exp.Alias))
    bind_columns(tree, table, sql, aliases)

    where = tree.args.get("where")
    if where is not None:
        _check_row_level(where.this, sql, "WHERE")
    keys = _check_group_by(tree, sql, rule)
    aggregates, outputs = _check_select_list(tree, sql, rule, keys)
    order = _check_order(tree, sql, outputs)
    limit, offset = _check_limit(tree, sql)
    return PrivateQuery(
        table=table.name,
        rule=rule,
        column_types=tuple(table.columns.items()),
        where=where.this if where is not None else None,
        keys=tuple(keys),
        aggregates=tuple(aggregates),
        outputs=tuple(outputs),
        order=order,
        limit=limit,
        offset=offset,
    )


_PART_HINTS = {
    "joins": "joins of private tables are not supported yet; query one table",
    "with": "inline the CTE; subqueries over private tables are not supported yet",
    "distinct": "SELECT DISTINCT would release private values; use COUNT or GROUP BY a column with KEYS",
    "having": "HAVING is not supported yet; filter the released DataFrame instead",
    "qualify": "QUALIFY filters on window functions, which are not supported",
    "windows": "window functions are not supported",
    "laterals": "LATERAL joins are not supported",
    "sample": "sampling is not supported",
}


def _part_name(part: str) -> str:
    return {"joins": "JOIN", "with": "WITH (a CTE)", "distinct": "SELECT DISTINCT"}.get(part, part.upper())


def _check_row_level(node: exp.Expression, sql: str, where: str) -> None:
    """Refuse anything in a row-level expression that is not on the allow-list."""
    for sub in node.walk():
        if isinstance(sub, exp.AggFunc):
            _refuse(sub, sql, f"aggregate {describe(sub)} cannot be used in {where}",
                    "aggregates belong in the select list")
        if isinstance(sub, exp.Window):
            _refuse(sub, sql, "window functions are not supported", "aggregate with GROUP BY instead")
        if isinstance(sub, exp.Anonymous):
            if sub.name.lower() not in ROW_LEVEL_FUNCTIONS:
                _refuse(sub, sql, f"function {sub.name} is not allowed on private rows",
                        "use comparisons, arithmetic, CASE, string and date functions")
            continue
        if not isinstance(sub, ROW_LEVEL_NODES):
            _refuse(sub, sql, f"{describe(sub)} is not allowed on private rows",
                    "use comparisons, arithmetic, CASE, string and date functions")


def _check_group_by(tree: exp.Select, sql: str, rule: PrivateTable) -> list[GroupKey]:
    group = tree.args.get("group")
    if group is None:
        return []
    for part in ("rollup", "cube", "grouping_sets"):
        if group.args.get(part):
            _refuse(group, sql, f"GROUP BY {part.upper()} is not supported", "GROUP BY plain columns")
    keys: list[GroupKey] = []
    for item in group.expressions:
        column = _resolve_group_item(item, tree)
        if not isinstance(column, exp.Column):
            _refuse(item, sql, f"GROUP BY {item.sql(dialect=DIALECT)} is not supported yet",
                    "group by a column that has a KEYS domain in the policy")
        name = column.name
        if rule.unit is not None and name == rule.unit.lower():
            _refuse(item, sql, f"GROUP BY the privacy unit {name} would release one answer per unit",
                    "group by a public attribute instead, or COUNT(DISTINCT ...) the units")
        declared = rule.column(name)
        if declared is None or declared.keys is None:
            _refuse(item, sql, f"GROUP BY {name}: the column has no public KEYS domain in the policy",
                    f"declare `{name} KEYS FROM <public table>.<column>` or `{name} KEYS ('a', 'b')`")
        if any(k.column == name for k in keys):
            continue
        keys.append(GroupKey(output=name, column=name, domain=declared.keys))
    return keys


def _resolve_group_item(item: exp.Expression, tree: exp.Select) -> exp.Expression:
    """GROUP BY 1 and GROUP BY alias refer to select-list items, as in DuckDB."""
    selects = tree.expressions
    if isinstance(item, exp.Literal) and not item.is_string and item.this.isdigit():
        index = int(item.this) - 1
        if 0 <= index < len(selects):
            return selects[index].unalias()
    if isinstance(item, exp.Column) and not item.table:
        for select in selects:
            if isinstance(select, exp.Alias) and select.alias.lower() == item.name.lower():
                return select.this
    return item


def _output_name(node: exp.Expression) -> str:
    if isinstance(node, exp.Alias):
        return node.alias
    if isinstance(node, exp.Column):
        return node.name
    if isinstance(node, exp.Count) and isinstance(node.this, exp.Star):
        return "count_star()"
    if isinstance(node, exp.AggFunc):
        return f"{AGGREGATES.get(type(node), node.key)}({node.this.sql(dialect=DIALECT)})".replace('"', "")
    return node.sql(dialect=DIALECT)


def _check_select_list(tree, sql, rule, keys):
    aggregates: list[Aggregate] = []
    outputs: list[tuple[str, str, int]] = []
    for item in tree.expressions:
        name = _output_name(item)
        node = item.unalias()
        if isinstance(node, exp.Star):
            _refuse(node, sql, "SELECT * would release private rows",
                    "select aggregates such as COUNT(*), SUM(col) or AVG(col)")
        if isinstance(node, exp.Column):
            index = next((i for i, k in enumerate(keys) if k.column == node.name), None)
            if index is None:
                _refuse(node, sql, f"column {node.name} is neither aggregated nor grouped, so it would "
                        "release private values", f"wrap it in COUNT, SUM or AVG, or GROUP BY {node.name} "
                        "if it has a public KEYS domain")
            outputs.append((name, "key", index))
            continue
        if isinstance(node, exp.Window):
            _refuse(node, sql, "window functions are not supported", "aggregate with GROUP BY instead")
        function = AGGREGATES.get(type(node))
        if function is None:
            if isinstance(node, exp.AggFunc):
                _refuse(node, sql, f"aggregate {describe(node)} is not supported yet",
                        "use COUNT, SUM or AVG")
            _refuse(node, sql, f"{describe(node)} in the select list is not supported over a private "
                    "table", "select group keys and plain COUNT, SUM or AVG aggregates")
        argument = node.this
        if isinstance(argument, exp.Distinct):
            _refuse(node, sql, f"{function.upper()}(DISTINCT ...) is not supported yet",
                    f"use {function.upper()}(column) without DISTINCT")
        if isinstance(argument, exp.Star):
            if function != "count":
                _refuse(node, sql, f"{function.upper()}(*) is not valid", "name a column")
            argument = None
        else:
            _check_row_level(argument, sql, f"{function.upper()}(...)")
        outputs.append((name, "aggregate", len(aggregates)))
        aggregates.append(Aggregate(output=name, function=function, argument=argument))
    if not aggregates:
        _refuse(tree, sql, "a query over a private table must aggregate",
                "select COUNT(*), SUM(col) or AVG(col)")
    return aggregates, outputs


def _check_order(tree, sql, outputs) -> tuple[OrderItem, ...]:
    order = tree.args.get("order")
    if order is None:
        return ()
    selects = tree.expressions
    items = []
    for ordered in order.expressions:
        target = ordered.this
        index = None
        if isinstance(target, exp.Literal) and not target.is_string and target.this.isdigit():
            index = int(target.this) - 1 if 0 < int(target.this) <= len(outputs) else None
        else:
            for i, select in enumerate(selects):
                names = {outputs[i][0].lower()}
                if (isinstance(target, exp.Column) and not target.table and target.name.lower() in names) \
                        or target == select.unalias():
                    index = i
                    break
        if index is None:
            shown = target.name if isinstance(target, exp.Column) else target.sql(dialect=DIALECT)
            _refuse(target, sql, f"ORDER BY {shown} must name a selected column",
                    "order by an output column, its alias or its position")
        items.append(OrderItem(output=index, descending=bool(ordered.args.get("desc"))))
    return tuple(items)


def _check_limit(tree, sql) -> tuple[int | None, int]:
    values = []
    for part in ("limit", "offset"):
        node = tree.args.get(part)
        if node is None:
            values.append(None)
            continue
        literal = node.expression if part == "limit" else node.expression
        if not (isinstance(literal, exp.Literal) and not literal.is_string and literal.this.isdigit()):
            _refuse(node, sql, f"{part.upper()} must be a non-negative integer constant",
                    f"write {part.upper()} 10")
        values.append(int(literal.this))
    return values[0], values[1] or 0


__all__ = ["check_query", "table_key"]
