"""Analyst expressions written for Spark so that they mean what they mean on DuckDB.

dpsql's generated trees are rendered per engine (``dpsql.backends.render``); on Spark, with
sqlglot's "spark" dialect. sqlglot translates syntax, not meaning: ``7 // 2``, ``x / 0``,
``ORDER BY x`` (NULLs last on DuckDB, first on Spark), ``dayofweek``, ``CAST(2.7 AS INT)`` (3 on
DuckDB, 2 on Spark) and a TINYINT sum's overflow all differ. This module closes the gap:

* ``check_spark(tree, types)`` (``dpsql.backends.spark.check``) refuses, before the charge, any
  construct whose Spark form would not agree;
* ``agree(tree, types)`` rewrites the rest so it does: every node in DuckDB's type, DuckDB's
  function spelled in Spark's terms (``dpsql.backends.spark.rewrites``, ``spark_dates``);
* ``total(node, types)`` is the Spark rendering of dpsql's ``Total`` piece, DuckDB's
  ``TRY(node)``: NULL exactly on the rows where evaluating ``node`` on DuckDB raises, and never
  an error. Spark runs with ANSI mode on (``dpsql.backends.spark.session``), so each fallible
  step takes its ``try_`` form (``try_add``, ``try_subtract``, ``try_multiply``, ``try_mod``,
  ``TRY_CAST``; ``DIV`` by ``NULLIF(b, 0)``; the minimum integer's negation by ``NULLIF``),
  which is NULL exactly where DuckDB's step raises. That is not yet TRY: a NULL from a failed
  step can be absorbed (``COALESCE(x // 0, 5)`` is 5, ``(x // 0) IS NULL`` true, ``p OR
  TRUE`` true), where DuckDB's TRY makes the whole expression NULL. So ``total`` also builds
  the condition "some step DuckDB evaluates failed" — eagerly through every operator, AND, OR
  and IN (DuckDB does not short-circuit them), lazily through CASE, IF and COALESCE (DuckDB
  evaluates a branch only for the rows that reach it) — and returns NULL where it holds.

``types`` maps lower-cased ``column`` (or ``table.column``) names to DuckDB types
(``column_types``); a node whose Spark form depends on a type it cannot tell is left as sqlglot
writes it, and ``check_spark`` refuses such nodes, so the engine must pass the same ``types``
to all three.

>>> import sqlglot
>>> tree = sqlglot.parse_one("SELECT x // 2, d ORDER BY d", dialect="duckdb")
>>> agree(tree, {"x": "INTEGER", "d": "DATE"}).sql(dialect="spark")
'SELECT CAST(x DIV 2 AS INT), d ORDER BY d NULLS LAST'
>>> total(sqlglot.parse_one("x + 1", dialect="duckdb"), {"x": "INTEGER"}).sql(dialect="spark")
'CASE WHEN ((TRY_ADD(x, 1)) IS NULL AND NOT (x) IS NULL) THEN NULL ELSE TRY_ADD(x, 1) END'
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping

from sqlglot import exp

from dpsql.backends.spark import aggregates as aggregates
from dpsql.backends.spark import casts as casts
from dpsql.backends.spark import dates as dates
from dpsql.backends.spark import rewrites as rewrites
from dpsql.backends.spark import strings as strings
from dpsql.backends.spark.infer import (
    DONE,
    EXTRA_ERROR,
    TYPE_META,
    annotate,
    integer_literal,
    is_decimal,
    is_integer,
    typed,
)
from dpsql.backends.spark.rewrites import Writer, fails, is_null, widening
from dpsql.backends.spark.scopes import scoped_types
from dpsql.errors import UnsupportedQuery
from dpsql.sql.parse import describe
from dpsql.sql.pieces import Total

__all__ = ["agree", "column_types", "total"]


_Rule = Callable[[Writer, exp.Expr], exp.Expr]
_COMPARISONS = (exp.EQ, exp.NEQ, exp.GT, exp.GTE, exp.LT, exp.LTE, exp.NullSafeEQ, exp.NullSafeNEQ, exp.Is,
                exp.In, exp.Between)
_PARTS = (exp.Year, exp.Month, exp.Day, exp.DayOfMonth, exp.Quarter, exp.DayOfYear, exp.WeekOfYear, exp.Hour,
          exp.Minute, exp.Second, exp.DayOfWeek, exp.DayOfWeekIso, exp.Extract, exp.Week)

RULES: dict[type, _Rule] = {
    **dict.fromkeys(_COMPARISONS, rewrites.comparison),
    **dict.fromkeys([exp.Case, exp.If, exp.Coalesce, exp.Least, exp.Greatest, exp.Nullif], rewrites.combination),
    **dict.fromkeys([exp.Add, exp.Sub, exp.Mul, exp.Mod, exp.IntDiv], rewrites.arithmetic),
    exp.Div: rewrites.division, exp.Neg: rewrites.negation, exp.Abs: rewrites.negation, exp.Sign: rewrites.sign,
    **dict.fromkeys([exp.Round, exp.Floor, exp.Ceil], rewrites.rounding),
    exp.Cast: casts.cast, exp.TryCast: casts.cast, exp.Sum: aggregates.aggregate,
    exp.Avg: aggregates.average, exp.Filter: aggregates.filtered,
    exp.Like: strings.like, exp.ILike: strings.like, exp.Length: strings.length, exp.Substring: strings.substring,
    exp.Left: strings.left_right, exp.Right: strings.left_right, exp.Trim: strings.trim,
    exp.DPipe: strings.concatenation, exp.Concat: strings.concatenation,
    **dict.fromkeys(_PARTS, dates.date_part),
    exp.Dayname: dates.day_name, exp.Monthname: dates.day_name, exp.TimestampTrunc: dates.truncation,
    exp.DateTrunc: dates.truncation, exp.DateDiff: dates.difference, exp.LastDay: dates.last_day,
    **{kind: rewrites.float_test for kind in (getattr(exp, "IsNan", None), getattr(exp, "IsInf", None)) if kind},
}
"""sqlglot node class -> its rewrite (``dpsql.backends.spark.rewrites``, ``spark_dates``)."""

FUNCTIONS: dict[str, _Rule] = {
    **dict.fromkeys(["prefix", "suffix", "contains"], strings.searched),
    "strlen": strings.octets,
    **dict.fromkeys(["isnan", "isinf", "isfinite"], rewrites.float_test),
    **dict.fromkeys(["date_part", "datepart", "isodow", "yearweek", "week", "hour", "minute", "second"],
                    dates.date_part),
    **dict.fromkeys(["dayname", "monthname"], dates.day_name),
    **dict.fromkeys(["least", "greatest"], rewrites.combination),  # dpsql's clamps (``backends.rewrite``)
}
"""Functions sqlglot leaves anonymous, by lower-cased name -> rewrite."""

MAX_FAILURE_NODES = 20_000
"""Most nodes ``total`` spends on the conditions that rebuild DuckDB's TRY (each fallible step
repeats its operands there); an expression needing more is refused (``check_spark`` renders
every row-level expression, so the refusal comes before anything is charged)."""


def column_types(catalog: Mapping[str, Mapping[str, str]]) -> dict[str, str]:
    """The ``types`` mapping of a catalog (table -> {column: DuckDB type}): ``table.column`` for
    every column, and ``column`` alone where every table that has it gives it one type.

    >>> column_types({"visits": {"amount": "INTEGER", "id": "BIGINT"}, "shops": {"id": "VARCHAR"}})
    {'visits.amount': 'INTEGER', 'visits.id': 'BIGINT', 'shops.id': 'VARCHAR', 'amount': 'INTEGER'}
    """
    qualified: dict[str, str] = {}
    bare: dict[str, set[str]] = {}
    for table, columns in catalog.items():
        for column, type_name in columns.items():
            qualified[f"{table.split('.')[-1].lower()}.{column.lower()}"] = type_name
            bare.setdefault(column.lower(), set()).add(type_name)
    return {**qualified, **{name: next(iter(kinds)) for name, kinds in bare.items() if len(kinds) == 1}}


def agree(tree: exp.Expr, types: Mapping[str, str] | None = None) -> exp.Expr:
    """``tree`` (copied) rewritten so that sqlglot's Spark SQL of it means what DuckDB makes of
    it (module docstring); ``Total`` pieces in it are written by ``total``. Idempotent: a
    subtree already written for Spark is left as it is."""
    tree = tree.copy()
    scoped = scoped_types(tree, types)  # dpsql's statements read their CTEs' and subqueries' columns
    annotate(tree, scoped)
    return _write(tree, Writer(try_=False), scoped)


def total(node: exp.Expr, types: Mapping[str, str] | None = None) -> exp.Expr:
    """The Spark form of ``TRY(node)`` (module docstring): ``node`` agreed, with every fallible
    step in its ``try_`` form, NULL wherever DuckDB's evaluation of ``node`` raises."""
    tree = node.copy()
    annotate(tree, types)
    errors: dict[int, list[exp.Expr]] = {}
    written = _write(tree, Writer(try_=True), types, errors)
    failed = _any(errors.get(id(written), []))
    if failed is not None:
        written = exp.Case(ifs=[exp.If(this=failed, true=exp.Null())], default=written)
    written.meta[DONE] = True
    written.meta[TYPE_META] = typed(tree)
    return written


def _write(tree: exp.Expr, writer: Writer, types: Mapping[str, str] | None,
           errors: dict[int, list[exp.Expr]] | None = None) -> exp.Expr:
    """``tree`` written for Spark, children first; under ``total``, ``errors`` maps each written
    node (by ``id``) to its failure conditions (kept out of the nodes' meta, which every copy of
    a node would copy again). Their size is capped (``MAX_FAILURE_NODES``)."""
    errors = {} if errors is None else errors
    size = 0
    for node in list(_children_first(tree)):
        # where the node sits: a rewrite may wrap the node itself, which moves it under the wrapper
        parent, key, index = node.parent, node.arg_key, node.index
        if isinstance(node, Total):
            written = total(node.this, types)
        elif isinstance(node, exp.Neg) and isinstance(node.this, exp.Literal):
            written = node  # a negative number: a literal, not a negation that could overflow
        else:
            rule = (FUNCTIONS.get(node.name.lower()) if isinstance(node, exp.Anonymous)
                    else None if isinstance(node, exp.If) and isinstance(node.parent, exp.Case)
                    else RULES.get(type(node)))
            failed = _failure(node, errors) if writer.try_ else []
            operands = _operands(node) if writer.try_ and _fallible(node) else None
            written = node if rule is None else rule(writer, node)
            written.meta.setdefault(TYPE_META, typed(node))
            added = [fails(written, operands)] if operands is not None else []
            extra = node.meta.pop(EXTRA_ERROR, None)
            added += [] if extra is None else [extra]
            size += sum(len(list(term.walk())) for term in added)
            if size > MAX_FAILURE_NODES:
                raise UnsupportedQuery(f"{describe(tree)} is too long to make total on Spark: DuckDB's TRY is rebuilt "
                                       "there from every fallible step, and this expression has too many",
                                       node=tree, hint="split it, or use fewer integer operations in one expression")
            if failed or added:
                errors[id(written)] = failed + added
        if isinstance(node, exp.Ordered) and node.args.get("nulls_first") is None:
            node.set("nulls_first", False)  # DuckDB's default for ASC and DESC alike; Spark's ASC puts NULLs first
        if written is not node:
            written.meta[DONE] = True
            if node is tree:
                tree = written
            elif parent is not None and key is not None:
                parent.set(key, written, index)
    return tree


def _children_first(node: exp.Expr) -> Iterator[exp.Expr]:
    """Post-order over ``node``, not entering subtrees already written for Spark, nor a ``Total``
    piece's (``total`` writes them, from DuckDB's tree: agreeing them first would hide their steps)."""
    if isinstance(node, Total):
        yield node
        return
    for child in list(node.iter_expressions()):
        if not child.meta.get(DONE):
            yield from _children_first(child)
    yield node


# -- DuckDB's TRY: which steps fail, and when DuckDB evaluates them -----------------------------

def _fallible(node: exp.Expr) -> bool:
    """A step that raises on DuckDB for some non-NULL inputs (and whose ``try_`` form is NULL
    exactly then): integer and DECIMAL overflow, division by zero, a narrowing cast, a date
    beyond the TIMESTAMP range."""
    target = typed(node)
    if isinstance(node, (exp.Add, exp.Sub, exp.Mul)):
        return is_integer(target) or is_decimal(target) or target == "DATE"
    if isinstance(node, (exp.IntDiv, exp.Mod)):
        return is_integer(target)
    if isinstance(node, (exp.Neg, exp.Abs)):
        return is_integer(target)
    if isinstance(node, exp.Cast) and not isinstance(node, exp.TryCast):
        return not widening(typed(node.this), target or "")
    if isinstance(node, exp.Round):
        return is_integer(target) and node.args.get("decimals") is not None
    if isinstance(node, (exp.TimestampTrunc, exp.DateTrunc)):
        return typed(node.this) == "DATE"
    return False


def _operands(node: exp.Expr) -> list[exp.Expr]:
    """Copies of a step's values (not its literals, types or units), taken before it is rewritten."""
    return [child.copy() for child in node.iter_expressions()
            if not isinstance(child, (exp.Literal, exp.DataType, exp.Var, exp.Identifier))
            and integer_literal(child) is None]


def _failure(node: exp.Expr, known: dict[int, list[exp.Expr]]) -> list[exp.Expr]:
    """``node``'s operands failed, as DuckDB evaluates them, as a list of alternatives: every
    operand of an operator or function (AND, OR and IN included), a CASE / IF branch only if
    reached, a COALESCE argument only if those before it were NULL."""
    errors = lambda child: [] if child is None else known.pop(id(child), [])  # noqa: E731
    if isinstance(node, exp.If) and isinstance(node.parent, exp.Case):
        return []  # a WHEN branch: its CASE reads its condition's and value's failures
    if isinstance(node, exp.Coalesce):
        arguments = [node.this, *node.expressions]
        failed = _any(errors(arguments[-1]))
        for argument in reversed(arguments[:-1]):
            failed = _any([*errors(argument), *_guarded(is_null(argument), failed)])
        return [] if failed is None else [failed]
    if isinstance(node, (exp.Case, exp.If)):
        branches = [(node.this, node.args.get("true"))] if isinstance(node, exp.If) else [
            (i.this, i.args.get("true")) for i in node.args.get("ifs") or []]
        subject = node.this if isinstance(node, exp.Case) else None
        failed = _any(errors(node.args.get("false") if isinstance(node, exp.If) else node.args.get("default")))
        for condition, value in reversed(branches):
            test = condition.copy() if subject is None else exp.EQ(this=subject.copy(), expression=condition.copy())
            taken = exp.Is(this=exp.Paren(this=test), expression=exp.true())
            failed = _any([*errors(condition), *_guarded(taken, _any(errors(value))),
                           *_guarded(exp.not_(taken.copy()), failed)])
        return [*errors(subject), *([] if failed is None else [failed])]
    return [term for child in node.iter_expressions() for term in errors(child)]


def _any(terms: list[exp.Expr]) -> exp.Expr | None:
    """The alternatives as one flat OR (each parenthesised), or None when there are none."""
    if not terms:
        return None
    combined: exp.Expr = exp.Paren(this=terms[0])
    for term in terms[1:]:
        combined = exp.Or(this=combined, expression=exp.Paren(this=term))
    return combined


def _guarded(guard: exp.Expr, failed: exp.Expr | None) -> list[exp.Expr]:
    return [] if failed is None else [exp.And(this=exp.Paren(this=guard), expression=exp.Paren(this=failed))]
