"""Normalise a query's AST, so that two ways of writing one question get one repeat key.

A free repeat (DESIGN.md invariant 9) returns the stored noisy answer of an identical query.
"Identical" is decided on this normal form: whitespace, comments and keyword case vanish in
parsing; then each rule below rewrites the tree, in order, and the key hashes the SQL of the
result together with the options, the policy and the analyst.

* ``lower_identifiers``: DuckDB resolves names case-insensitively, quoted or not.
* ``canonicalise_aliases``: table aliases and select-list aliases are renamed by position.
* ``drop_parentheses``: parentheses that cannot change the meaning go.
* ``sort_commutative``: the operands of AND, OR, =, <> and IN lists are sorted, and > / >=
  are written as < / <=.

A rule may only ever merge queries that mean the same thing: two different questions sharing
a key would return one's answer for the other (a wrong answer, never a privacy loss, since
only a stored release is returned). So the alias rule acts only where it is unambiguous: a
single SELECT with no subquery, CTE or set operation, and select-list aliases that name no
column of any table (``columns``). Anything it cannot prove the same stays apart, and is
simply charged again.

>>> import sqlglot
>>> sql = lambda text, **kw: normalised_sql(sqlglot.parse_one(text, read=DIALECT), **kw)
>>> sql("select V.Store, count(*) as N from Main.Visits v where 3 < amount and v.store = 'a' group by 1 order by n")
"SELECT store, COUNT(*) AS c1 FROM visits WHERE 'a' = store AND 3 < amount GROUP BY 1 ORDER BY c1"
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Callable, Iterable
from typing import cast

from sqlglot import exp

from dpsql.sql.dialect import DIALECT

_SCOPES = (exp.Subquery, exp.CTE, exp.With, exp.Union, exp.Intersect, exp.Except, exp.Lateral)


def lower_identifiers(tree: exp.Expression, columns: frozenset[str] = frozenset()) -> exp.Expression:
    """Every identifier lower-cased (quoted only if it must be); ``main.`` and comments dropped."""
    for node in list(tree.walk()):  # one pass; a table is met before its identifiers
        node.comments = None
        if isinstance(node, exp.Identifier):
            name = node.name.lower()
            node.set("this", name)  # quoted only where plain text would not read back
            node.set("quoted", not _PLAIN.fullmatch(name))
        elif isinstance(node, exp.Table) and node.args.get("db") is not None \
                and node.db.lower() == "main" and not node.args.get("catalog"):
            node.set("db", None)
    return tree


_PLAIN = re.compile(r"[a-z_][a-z0-9_]*")


def canonicalise_aliases(tree: exp.Expression, columns: frozenset[str] = frozenset()) -> exp.Expression:
    """In a single SELECT: drop a lone table's alias and qualifiers, number other table aliases
    t0, t1, ..., and name referenced select-list aliases c<position> (unreferenced ones go)."""
    if not isinstance(tree, exp.Select):
        return tree
    nodes = list(tree.walk())  # one pass for every list below (renaming adds no table or column)
    if any(isinstance(node, _SCOPES) or (isinstance(node, exp.Select) and node is not tree)
           for node in nodes):
        return tree
    tables = [node for node in nodes if isinstance(node, exp.Table)]
    columns_used = [node for node in nodes if isinstance(node, exp.Column)]
    references = {(t.alias or t.name).lower() for t in tables}
    renamed = {(t.alias or t.name).lower(): None for t in tables} if len(tables) == 1 else {
        t.alias.lower(): f"t{index}" for index, t in enumerate(tables) if t.alias}
    if len(renamed) == len([t for t in tables if t.alias or len(tables) == 1]) and _free(
            renamed, nodes, columns):
        for index, table in enumerate(tables):
            if table.alias or len(tables) == 1:
                new = renamed[(table.alias or table.name).lower()]
                table.set("alias", None if new is None else exp.TableAlias(this=exp.to_identifier(new)))
        for column in columns_used:
            qualifier = column.table.lower() if column.table else None
            if qualifier in renamed and qualifier in references and not column.args.get("db"):
                new = renamed[qualifier]
                column.set("table", None if new is None else exp.to_identifier(new))
    _canonicalise_select_aliases(tree, columns, columns_used)
    return tree


def _free(renamed: dict, nodes: Iterable[exp.Expr], columns: frozenset[str]) -> bool:
    """True when no new name is already a column or another name in the query (``nodes``: all
    of its nodes), so renaming cannot make a reference mean something else."""
    new_names = [new for new in renamed.values() if new is not None]
    if not new_names:
        return True
    taken = (columns | {n.name.lower() for n in nodes if isinstance(n, exp.Identifier)}) - set(renamed)
    return not any(new in taken for new in new_names)


def _canonicalise_select_aliases(tree: exp.Select, columns: frozenset[str],
                                 columns_used: list[exp.Column]) -> None:
    aliases = [e.alias.lower() for e in tree.expressions if isinstance(e, exp.Alias)]
    if not aliases:
        return
    names = {}
    for index, item in enumerate(tree.expressions):
        if not isinstance(item, exp.Alias):
            continue
        alias = item.alias.lower()
        if alias in columns or aliases.count(alias) > 1:
            continue  # a reference to it might mean the column: leave it exactly as written
        names[alias] = f"c{index}"
    if not _free(names, tree.walk(), columns):  # walked again: table aliases may be renamed
        return
    referenced = set()
    for column in columns_used:
        if not column.table and column.name.lower() in names:
            referenced.add(column.name.lower())
            column.set("this", exp.to_identifier(names[column.name.lower()]))
    for item in list(tree.expressions):
        if isinstance(item, exp.Alias) and item.alias.lower() in names:
            alias = item.alias.lower()
            if alias in referenced:
                item.set("alias", exp.to_identifier(names[alias]))
            else:
                item.replace(item.this)


_ATOMS = (exp.Column, exp.Literal, exp.Identifier, exp.Null, exp.Boolean, exp.Func, exp.Paren)
_PREDICATES = (exp.Predicate, exp.Not)  # comparisons, IN, LIKE, IS, BETWEEN: tighter than AND/OR


def drop_parentheses(tree: exp.Expression, columns: frozenset[str] = frozenset()) -> exp.Expression:
    """Parentheses that cannot change the meaning go: around an atom, around a whole WHERE or
    HAVING condition, and around a comparison (or an AND) inside AND / OR."""
    for paren in list(tree.find_all(exp.Paren)):
        inner, parent = paren.this, paren.parent
        if (isinstance(inner, _ATOMS) or parent is None or isinstance(parent, (exp.Where, exp.Having))
                or (isinstance(parent, exp.Connector) and isinstance(inner, _PREDICATES))
                or (isinstance(parent, exp.Or) and isinstance(inner, exp.And))):
            if paren is tree:
                tree = inner
            else:
                paren.replace(inner)
    return tree


def sort_commutative(tree: exp.Expression, columns: frozenset[str] = frozenset()) -> exp.Expression:
    """AND/OR chains flattened and sorted, = and <> operands sorted, > and >= mirrored."""
    for node in reversed(list(tree.walk(bfs=False))):  # every node after its descendants
        replacement = _sorted_node(node)
        if replacement is not node:
            if node is tree:
                # Every concrete sqlglot node is an Expression; walks are typed by the base Expr.
                tree = cast(exp.Expression, replacement)
            else:
                node.replace(replacement)
    return tree


_MIRRORED: dict[type[exp.Expr], type[exp.Binary]] = {exp.GT: exp.LT, exp.GTE: exp.LTE}
_SYMMETRIC = (exp.EQ, exp.NEQ, exp.NullSafeEQ, exp.NullSafeNEQ)


def _sorted_node(node: exp.Expr) -> exp.Expr:
    if isinstance(node, (exp.And, exp.Or)):
        kind = type(node)
        operands = sorted(_operands(node, kind), key=_text)
        combine = exp.and_ if kind is exp.And else exp.or_
        return combine(*operands, copy=False)
    if type(node) in _MIRRORED:
        return _MIRRORED[type(node)](this=node.expression, expression=node.this)
    if isinstance(node, _SYMMETRIC):
        left, right = sorted((node.this, node.expression), key=_text)
        return type(node)(this=left, expression=right)
    if isinstance(node, exp.In) and node.expressions:
        node.set("expressions", sorted(node.expressions, key=_text))
    return node


def _operands(node: exp.Expr, kind: type[exp.Expr]) -> Iterable[exp.Expr]:
    """The operands of a chain of one connective, through redundant parentheses."""
    for child in (node.this, node.expression):
        inner = child.unnest()
        if isinstance(inner, kind):
            yield from _operands(inner, kind)
        else:
            yield inner


def _text(node: exp.Expr) -> str:
    return node.sql(dialect=DIALECT)


RULES: tuple[Callable[..., exp.Expression], ...] = (
    lower_identifiers, canonicalise_aliases, drop_parentheses, sort_commutative)
"""The normalising rules, applied in this order."""


def normalise(tree: exp.Expression, columns: Iterable[str] = ()) -> exp.Expression:
    """A normalised copy of ``tree``; ``columns`` are the table column names a select-list
    alias must not be confused with (pass every column of every table, to be safe)."""
    reserved = frozenset(c.lower() for c in columns)
    tree = tree.copy()
    for rule in RULES:
        tree = rule(tree, reserved)
    return tree


def normalised_sql(tree: exp.Expression, columns: Iterable[str] = ()) -> str:
    """The SQL text of the normal form."""
    # The normal form is a private copy, so the generator need not copy it again.
    return normalise(tree, columns).sql(dialect=DIALECT, copy=False)


def repeat_key(normal_sql: str, *, options: dict, policy_text: str, analyst: str | None) -> str:
    """The key a released answer is stored under: a hash of the normalised SQL, the options,
    the policy and the analyst. Any difference in these gives a different key.

    >>> a = repeat_key("SELECT 1", options={"epsilon": "1/10"}, policy_text="P", analyst=None)
    >>> a == repeat_key("SELECT 1", options={"epsilon": "1/5"}, policy_text="P", analyst=None)
    False
    """
    policy_hash = hashlib.sha256(policy_text.encode("utf-8")).hexdigest()
    payload = json.dumps({"sql": normal_sql, "options": options, "policy": policy_hash,
                          "analyst": analyst}, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(payload.encode("utf-8")).hexdigest()

