"""The engine-specific pieces of dpsql's generated SQL, as tree nodes rendered once per engine.

The rewrite (``dpsql.backends.rewrite``) builds one sqlglot tree per statement out of plain
nodes (SELECT, CASE, LEAST, windows, ...), which sqlglot writes in any dialect, and the few
nodes below, whose meaning dpsql fixes but whose SQL differs by engine. ``render`` replaces
each of them by its engine's form and writes the tree, once, at the end.

A Spark backend supplies one more rendering per piece (a function in a table like
``_DUCKDB`` for sqlglot's "spark" dialect):

* ``Total``: an expression whose errors become NULL (DuckDB's ``TRY``; Spark has ``try_*``
  functions per operation and ANSI mode off, so it needs its own walk of the expression);
* ``ExactInteger``: a value widened so that summing integers stays exact (``HUGEINT``; Spark:
  ``DECIMAL(38, 0)``);
* ``SaltedHash``: a 64-bit hash of the secret salt and values, the order of every salted
  choice (DuckDB's ``hash($salt, ...)``, the salt a query parameter; Spark: ``xxhash64``
  with the salt bound as a literal or a parameter marker);
* ``KeyText``: a key's canonical text as bytes, its lossless read-back form
  (``dpsql.backends.keys``: DuckDB's ``encode(CAST(x AS VARCHAR))``; Spark: ``encode(CAST(x AS
  STRING), 'UTF-8')``, with its own canonical texts to check);
* ``IsNaN``: true for a floating NaN (DuckDB's ``ISNAN``; Spark's ``isnan``);
* ``* EXCLUDE`` / ``* REPLACE``: sqlglot's ``Star(except_=..., replace=...)``, which it renders
  as ``* EXCEPT`` for Spark; ``* REPLACE`` has no Spark form and must become an explicit list;
* exact literals (``literal``), written here so every engine reads the same number.

Whether a statement needs the salt is read from its tree (``needs_salt``), never its text.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from fractions import Fraction

from sqlglot import exp

DUCKDB = "duckdb"
SALT_PARAMETER = "salt"


class Total(exp.Expression, exp.Func):
    """``this``, with any error it raises while evaluated on a row turned into NULL."""

    arg_types = {"this": True}


class ExactInteger(exp.Expression, exp.Func):
    """``this`` (an integer) widened so that sums of it are exact."""

    arg_types = {"this": True}


class SaltedHash(exp.Expression, exp.Func):
    """A hash of the secret salt and ``expressions``: the order of every salted choice."""

    arg_types = {"expressions": True}
    is_var_len_args = True


class KeyText(exp.Expression, exp.Func):
    """A key's canonical text as bytes (``dpsql.backends.keys``)."""

    arg_types = {"this": True}


class IsNaN(exp.Expression, exp.Func):
    """True when the floating value ``this`` is NaN."""

    arg_types = {"this": True}


def total(node: exp.Expr) -> exp.Expr:
    """``node`` made total; columns, literals and NULL cannot fail and stay as they are."""
    if isinstance(node, (exp.Column, exp.Literal, exp.Null, exp.Boolean)):
        return node
    return Total(this=node)


def exact_integer(node: exp.Expr) -> exp.Expr:
    return ExactInteger(this=node)


def salted_hash(*values: exp.Expr) -> exp.Expr:
    return SaltedHash(expressions=list(values))


def key_text(node: exp.Expr) -> exp.Expr:
    return KeyText(this=node)


def is_nan(node: exp.Expr) -> exp.Expr:
    return IsNaN(this=node)


def star(exclude: list[str] | None = None, replace: Sequence[exp.Expr] | None = None) -> exp.Star:
    """``*`` without the ``exclude`` columns, or with the ``replace`` aliases in their place."""
    args: dict = {}
    if exclude:
        args["except_"] = [exp.column(name) for name in exclude]
    if replace:
        args["replace"] = replace
    return exp.Star(**args)


def catalog_type(type_name: str) -> exp.DataType:
    """A column's type as the engine's catalog names it, written back verbatim: it came from
    that engine, so no translation can change it (a STRUCT's field names, an ENUM's values)."""
    return exp.DataType(this=exp.DataType.Type.USERDEFINED, kind=type_name)


def literal(value: Fraction | int | str) -> exp.Expr:
    """An exact SQL literal for a policy number or key: a finite decimal written out, any other
    fraction as an exact division.

    >>> [literal(v).sql() for v in (Fraction(1, 4), Fraction(1, 3), "O'Hara", -7)]
    ['0.25', '(1 / 3)', "'O''Hara'", '-7']
    """
    if isinstance(value, str):
        return exp.Literal.string(value)
    text = literal_text(Fraction(value))
    if "/" in text:
        fraction = Fraction(value)
        return exp.Paren(this=exp.Div(this=_number(fraction.numerator), expression=_number(fraction.denominator)))
    return _number_text(text)


def _number(value: int) -> exp.Expr:
    return _number_text(str(value))


def _number_text(text: str) -> exp.Expr:
    # A negative number is a literal with a sign, not a negation node: both render as -n.
    return exp.Literal.number(text)


def literal_text(value: Fraction) -> str:
    """The exact text of ``literal`` for a number.

    >>> literal_text(Fraction(-1, 8)), literal_text(Fraction(2, 3)), literal_text(Fraction(5))
    ('-0.125', '2/3', '5')
    """
    if value.denominator == 1:
        return str(value.numerator)
    denominator = value.denominator
    while denominator % 2 == 0:
        denominator //= 2
    while denominator % 5 == 0:
        denominator //= 5
    if denominator != 1:
        return f"{value.numerator}/{value.denominator}"
    digits = 0
    while (value * 10**digits).denominator != 1:
        digits += 1
    scaled = value * 10**digits
    sign = "-" if scaled < 0 else ""
    text = str(abs(scaled.numerator)).rjust(digits + 1, "0")
    return f"{sign}{text[:-digits]}.{text[-digits:]}"


def needs_salt(tree: exp.Expr) -> bool:
    """True when the statement orders by a salted hash: the salt must be bound when it runs."""
    return tree.find(SaltedHash) is not None


def _duckdb_total(node: Total) -> exp.Expr:
    return exp.Anonymous(this="TRY", expressions=[node.this])


def _duckdb_exact_integer(node: ExactInteger) -> exp.Expr:
    return exp.Cast(this=node.this, to=exp.DataType.build("HUGEINT", dialect=DUCKDB))


def _duckdb_salted_hash(node: SaltedHash) -> exp.Expr:
    return exp.Anonymous(this="HASH", expressions=[exp.Placeholder(this=SALT_PARAMETER), *node.expressions])


def _duckdb_key_text(node: KeyText) -> exp.Expr:
    text = exp.cast(node.this, exp.DataType.build("VARCHAR", dialect=DUCKDB))
    return exp.Anonymous(this="ENCODE", expressions=[text])


def _duckdb_is_nan(node: IsNaN) -> exp.Expr:
    return exp.Anonymous(this="ISNAN", expressions=[node.this])


_DUCKDB: dict[type, Callable] = {
    Total: _duckdb_total,
    ExactInteger: _duckdb_exact_integer,
    SaltedHash: _duckdb_salted_hash,
    KeyText: _duckdb_key_text,
    IsNaN: _duckdb_is_nan,
}
_RENDERINGS = {DUCKDB: _DUCKDB}


def render(tree: exp.Expr, dialect: str = DUCKDB, copy: bool = True, pretty: bool = False) -> str:
    """The SQL of ``tree`` for ``dialect``: each engine-specific node in its engine's form;
    ``pretty`` lays it out on indented lines (for EXPLAIN).

    >>> render(exp.select(total(exp.column("x").div(2)), salted_hash(exp.column("u"))))
    'SELECT TRY(x / 2), HASH($salt, u)'
    """
    pieces = _RENDERINGS[dialect]
    tree = tree.copy() if copy else tree  # in place: the caller built ``tree`` for this call alone
    for node in reversed(list(tree.dfs())):  # children first: a piece may hold another
        rendering = pieces.get(type(node))
        if rendering is not None:
            replacement = rendering(node)
            if node is tree:
                tree = replacement
            else:
                node.replace(replacement)
    return tree.sql(dialect=dialect, copy=False, pretty=pretty)  # copied above if asked: no second copy
