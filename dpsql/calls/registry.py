"""Mechanisms an analyst calls in SQL: ``SELECT * FROM above_threshold('SELECT ...', ..., epsilon = 1)``.

A mechanism that answers many queries at once (sparse vector, a workload) has a Python method,
and this one SQL form, so psql through ``dpsql serve``, the shell and ``dpsql query`` reach it
as they reach any query: ``Connection.sql`` and ``Connection.explain`` hand a statement whose
FROM names a mechanism of ``MECHANISMS`` to that mechanism instead of the query pipeline.

The form: ``SELECT * FROM name(<query>, <query>, ..., option = value, ...)``. Each query is a
string literal (``'...'``, with ``''`` for a quote inside; or ``$$...$$``), or an array of them;
each option is ``name = value`` (also ``name => value`` or ``name := value``) with a number,
string, boolean or NULL value. Nothing else may surround the call: the answer is a release, and
post-processing it is the analyst's, after it.

>>> call = recognise("SELECT * FROM above_threshold('SELECT COUNT(*) FROM t', threshold = -2.5, max_above => 2)")
>>> call.name, call.queries, call.options
('above_threshold', ['SELECT COUNT(*) FROM t'], {'threshold': Fraction(-5, 2), 'max_above': 2})
>>> recognise("SELECT COUNT(*) FROM visits") is None
True
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from fractions import Fraction
from types import MappingProxyType
from typing import Any

from sqlglot import exp

from dpsql.calls import above_threshold, fit_call, pmw_call, synthesize_call, workload_run
from dpsql.calls.mechanism import Call, Mechanism
from dpsql.errors import DPError, InvalidParameter, UnsupportedQuery
from dpsql.sql.numbers import exact_parameter
from dpsql.sql.parse import located, parse

__all__ = ["MECHANISMS", "Call", "Mechanism", "mechanism", "mechanism_names", "recognise"]


MECHANISMS: Mapping[str, Mechanism] = MappingProxyType({
    "above_threshold": above_threshold.MECHANISM,
    "workload": workload_run.MECHANISM,
    "pmw": pmw_call.MECHANISM,
    "fit": fit_call.MECHANISM,
    "synthesize": synthesize_call.MECHANISM,
})
"""Every mechanism ``SELECT * FROM name(...)`` can call, by its lower-case name (a new one: its
module's ``MECHANISM``, and one line here)."""


def mechanism(name: str) -> Mechanism:
    """The mechanism called ``name``."""
    return MECHANISMS[name.lower()]


def mechanism_names() -> list[str]:
    """The names a ``SELECT * FROM name(...)`` can call, sorted.

    >>> mechanism_names()
    ['above_threshold', 'fit', 'pmw', 'synthesize', 'workload']
    """
    return sorted(MECHANISMS)


def recognise(sql: Any) -> Call | None:
    """The mechanism call ``sql`` is, or None for any other statement (a cheap test first:
    most statements are queries). A malformed call is refused with its position."""
    if not isinstance(sql, str):
        return None
    found = _CALLED.search(sql)
    if found is None or found.group(1).lower() not in MECHANISMS:
        return None
    parsed = parse(sql)
    tree = parsed.tree
    table = tree.args.get("from_") or tree.args.get("from")
    function = table.this.this if isinstance(table, exp.From) and isinstance(table.this, exp.Table) else None
    if not isinstance(function, exp.Anonymous) or str(function.this).lower() not in MECHANISMS:
        return None
    name = str(function.this).lower()
    _check_alone(tree, name)
    if parsed.options:
        written = next(iter(parsed.options))
        raise _refused(f"{name}() takes its options inside its call, found OPTIONS ({written} = ...)", tree,
                       f"write SELECT * FROM {name}(..., {written} = ...)")
    alias = function.parent.args.get("alias") if function.parent is not None else None
    if alias is not None:
        raise _refused(f"{name}()'s answer cannot be renamed here", alias,
                       f"write SELECT * FROM {name}(...), and rename its columns afterwards")
    queries: list[str] = []
    options: dict[str, Any] = {}
    for argument in function.expressions:
        if isinstance(argument, (exp.EQ, exp.Kwarg, exp.PropertyEQ)):
            option = argument.this.name.lower()
            if option in options:
                raise _refused(f"{name}() is given the option {option} twice", argument,
                               f"give {option} once")
            options[option] = _value(argument.expression, name, option)
        elif options:
            raise _refused(f"{name}()'s queries come before its options", argument,
                           f"write {name}('SELECT ...', 'SELECT ...', option = value, ...)")
        else:
            queries.extend(_texts(argument, name))
    _check_options(name, options, function)
    return Call(name, queries, options)


_CALLED = re.compile(r"\bfrom\s+([a-z_][a-z0-9_]*)\s*\(", re.IGNORECASE)


def _check_alone(tree: exp.Expression, name: str) -> None:
    """The call must be the whole statement: ``SELECT * FROM name(...)``."""
    star = tree.expressions[0] if isinstance(tree, exp.Select) and len(tree.expressions) == 1 else None
    if not isinstance(star, exp.Star) or any(star.args.values()):  # no EXCLUDE, REPLACE, RENAME
        raise _refused(f"{name}() must be selected from alone", tree,
                       f"write SELECT * FROM {name}(...), and post-process its answer afterwards")
    for clause in ("where", "group", "having", "order", "limit", "offset", "joins", "with", "qualify", "distinct"):
        if tree.args.get(clause):
            raise _refused(f"{name}() must be selected from alone, found {clause.upper()}", _first(tree.args[clause]),
                           f"write SELECT * FROM {name}(...), and post-process its answer afterwards")


def _first(found: Any) -> exp.Expression:
    return found[0] if isinstance(found, list) else found


def _check_options(name: str, options: dict[str, Any], node: exp.Expression) -> None:
    accepted = MECHANISMS[name].options
    for option in options:
        if option not in accepted:
            raise _refused(f"{name}() has no option {option}", node,
                           f"its options are {', '.join(accepted)}")


def _texts(argument: exp.Expression, name: str) -> list[str]:
    """The query texts of one positional argument: a string, or an array of strings."""
    if isinstance(argument, exp.Array):
        return [text for element in argument.expressions for text in _texts(element, name)]
    if isinstance(argument, exp.RawString) or (isinstance(argument, exp.Literal) and argument.is_string):
        return [str(argument.this)]
    raise _refused(f"{name}() takes its queries as string literals, found {argument.sql()}", argument,
                   f"quote each query: {name}('SELECT COUNT(*) FROM t WHERE ...', ...), "
                   "doubling any quote inside it, or write it between $$ and $$")


def _value(node: exp.Expression, name: str, option: str) -> Any:
    """An option's value: a number (exact), a string, a boolean or NULL."""
    negative = isinstance(node, exp.Neg)
    inner = node.this if negative else node
    if isinstance(inner, exp.Literal) and not inner.is_string:
        try:
            number = Fraction(inner.this)
        except ValueError:
            raise _refused(f"{name}()'s option {option} is not a number: {inner.this}", node,
                           f"write {option} = 1.5 or {option} = 1e-6") from None
        number = -number if negative else number
        return int(number) if number.denominator == 1 and "." not in inner.this and "e" not in inner.this.lower() \
            else number
    if negative:
        raise _refused(f"{name}()'s option {option} must be a number, string, boolean or NULL", node,
                       f"write {option} = 1.5, {option} = 'text', {option} = true or {option} = NULL")
    if isinstance(node, exp.Literal):
        return str(node.this)
    if isinstance(node, exp.Boolean):
        return bool(node.this)
    if isinstance(node, exp.Null):
        return None
    raise _refused(f"{name}()'s option {option} must be a number, string, boolean or NULL, found {node.sql()}",
                   node, f"write {option} = 1.5, {option} = 'text', {option} = true or {option} = NULL")


def _refused(message: str, node: exp.Expression, hint: str) -> UnsupportedQuery:
    return UnsupportedQuery(message, hint=hint, node=node)


def call_of(sql: str, epsilon: Any, delta: Any, *others: Any) -> Call | None:
    """The mechanism ``sql`` calls (``Connection.sql``), or None for a query. An epsilon or delta
    given beside the call (the shell's ``.epsilon``, ``--epsilon``) is the default of the
    call's own option of that name; any other argument does not apply to a call."""
    try:
        call = recognise(sql)
    except DPError as error:
        raise located(error, sql) from None
    if call is None:
        return None
    taken = mechanism(call.name).options
    for name, value in (("epsilon", epsilon), ("delta", delta)):
        if value is None or name not in taken:
            continue  # a delta beside a pure mechanism's call: it spends none, within any delta
        if name not in call.options:
            call.options[name] = value
        elif exact_parameter(value, name) != exact_parameter(call.options[name], name):
            raise InvalidParameter(f"{name} is given twice: {float(call.options[name]):g} in the call and "
                                   f"{float(value):g} as an argument",
                                   hint=f"give {name} once, in the call or as an argument")
    if any(other not in (None, False) for other in others):
        raise InvalidParameter(f"{call.name}() takes its options inside its call",
                               hint=f"write SELECT * FROM {call.name}(..., option = value)")
    return call
