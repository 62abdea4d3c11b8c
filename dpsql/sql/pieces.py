"""The engine-neutral vocabulary of the SQL dpsql generates: tree nodes whose meaning dpsql fixes
but whose SQL differs by engine.

Analysis (``dpsql.analysis``) and the rewrite (``dpsql.backends.rewrite``) build their trees out of
plain sqlglot nodes and these; each backend renders them in its engine's form
(``dpsql.backends.render``), once, at the end. They live in the sql layer so that analysis,
which builds a relation's source, never imports a backend:

* ``Total``: an expression whose errors become NULL;
* ``ExactInteger``: a value widened so that summing integers stays exact;
* ``SaltedHash``: a keyed, uniform 64-bit hash of the secret salt and values, the order of every
  salted choice (values of types whose engine equality is their exact identity, or their
  ``Canonical`` form; ties broken by the values);
* ``Canonical``: a value's exact canonical encoding, for identity decided by bytes;
* ``KeyText``: a key's canonical text as bytes, its lossless read-back form (``dpsql.backends.keys``);
* ``IsNaN``: true for a floating NaN;
* ``CopiedTable``: a private table, read through its bounded copy, which the backend names
  (``dpsql.backends.bounding``);
* ``InSample``: true for the units of a Poisson sample (``TABLESAMPLE POISSON``): a keyed
  cryptographic hash of the unit's canonical text under a fresh secret key per query, below a
  threshold (``dpsql.analysis.sampling``);
* ``star``: ``*`` without some columns or with some replaced (sqlglot renders it per dialect);
* exact literals (``literal``), written here so every engine reads the same number.

Whether a statement needs the salt, or a sample key, is read from its tree (``needs_salt``,
``needs_sample_key``), never its text.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from fractions import Fraction
from functools import lru_cache

from sqlglot import exp

from dpsql.sql.names import PAD
from dpsql.sql.types import equality_is_identity


class Total(exp.Expression, exp.Func):
    """``this``, with any error it raises while evaluated on a row turned into NULL."""

    arg_types = {"this": True}


class ExactInteger(exp.Expression, exp.Func):
    """``this`` (an integer) widened so that sums of it are exact."""

    arg_types = {"this": True}


class SaltedHash(exp.Expression, exp.Func):
    """A keyed, uniform hash of the secret salt and ``expressions``: the order of every salted
    choice. Uniform over the salt for every input, including small integers (DESIGN.md
    invariant 20); a function of the values as the engine's equality sees them, so a value
    whose equality is not its identity (a float, an INTERVAL) is passed as its ``Canonical``."""

    arg_types = {"expressions": True}
    is_var_len_args = True


class Canonical(exp.Expression, exp.Func):
    """The exact canonical encoding of ``this``, of catalog type ``type`` (a string literal), as
    text: equal exactly when nothing an analyst reads back tells the values apart
    (``dpsql.backends.bounding.canonical_text``). For values whose engine equality is not their
    identity (floats, INTERVAL, nested values), wherever dpsql decides that two are the same."""

    arg_types = {"this": True, "type": True}


class KeyText(exp.Expression, exp.Func):
    """A key's canonical text as bytes (``dpsql.backends.keys``); ``type`` (a string literal, when
    known) is its catalog type: an engine whose text of a value depends on it (Spark writes
    floats in hexadecimal, strings as their bytes) needs it."""

    arg_types = {"this": True, "type": False}


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


def exact(node: exp.Expr, type_name: str) -> exp.Expr:
    """``node`` itself where its type's equality is its identity (``equality_is_identity``), else
    its ``Canonical`` encoding: a value to compare, order or hash by exact identity."""
    if equality_is_identity(type_name):
        return node
    return Canonical(this=node, type=exp.Literal.string(type_name))


def key_text(node: exp.Expr, type_name: str | None = None) -> KeyText:
    return KeyText(this=node, type=None if type_name is None else exp.Literal.string(type_name))


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


def data_type(type_name: str, dialect: str) -> exp.DataType:
    """``exp.DataType.build(type_name, dialect=dialect)``, parsed once per name and dialect (sqlglot
    parses the text on every build: a fresh query's rewrite asks for the same few types again).

    >>> data_type("DECIMAL(38, 6)", "duckdb") == exp.DataType.build("DECIMAL(38, 6)", dialect="duckdb")
    True
    >>> data_type("DOUBLE", "duckdb") is data_type("DOUBLE", "duckdb")  # a fresh copy each time
    False
    """
    return _parsed_type(type_name, dialect).copy()


@lru_cache(maxsize=256)
def _parsed_type(type_name: str, dialect: str) -> exp.DataType:
    return exp.DataType.build(type_name, dialect=dialect)


def with_ctes(final: exp.Select, ctes: Sequence[tuple[str, exp.Expr]]) -> exp.Select:
    """``final`` with each (name, query) appended to its WITH, in place: what ``final.with_(name,
    as_=query, copy=False)`` builds, without parsing each plain name as SQL (dpsql's CTE names
    are plain lower-case words; any other is left to sqlglot).

    >>> q = with_ctes(exp.select("x").from_("a"), [("a", exp.select("1 AS x"))])
    >>> q.sql() == exp.select("x").from_("a").with_("a", as_=exp.select("1 AS x")).sql()
    True
    """
    for name, query in ctes:
        alias: exp.Expr | str = exp.TableAlias(this=exp.to_identifier(name)) if _PLAIN_NAME(name) else name
        final = final.with_(alias, as_=query, copy=False)
    return final


_PLAIN_NAME = re.compile(r"[a-z_][a-z0-9_]*").fullmatch


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


class InSample(exp.Expression, exp.Func):
    """True when the unit ``this`` (a column of catalog type ``type``, a string literal) is in the
    query's Poisson sample: the first 64 bits of SHA-256 of the query's secret sample key followed
    by the unit's ``Canonical`` text, read as an integer, are below ``threshold`` (a string
    literal: 16 lower-case hex digits, floor(p·2^64)); ``rate`` (a string literal, the exact
    fraction p) is what the charge is amplified by. The key is a query parameter drawn afresh for
    each charged query from the secure source (``dpsql.mechanisms.noise.secret_key``); it never
    appears in the SQL. ``units``: the ``CopiedTable`` of a unit-level copy, whose row-count table
    (one row per unit, ``dpsql.backends.bounding.raw_rows_sql``) the hash is computed over, once per
    unit instead of once per row (an engine's SHA-256 costs microseconds); absent for a row-level
    copy, whose rows are its units."""

    arg_types = {"this": True, "type": True, "threshold": True, "rate": True, "units": False}


SAMPLE_KEY_PARAMETER = "dp_sample_key"
"""The query parameter holding a sampled query's secret key (``InSample``)."""
UNBOUND_SAMPLE_KEY = "0" * 64
"""The key bound when a sampled statement is only typed (DESCRIBE reads no rows), never run."""


def needs_sample_key(tree: exp.Expr) -> bool:
    """True when the statement reads a Poisson sample: its key must be bound when it runs."""
    return tree.find(InSample) is not None


def binding_parameters(statement: exp.Expr | str, parameters: dict | None) -> dict | None:
    """``parameters`` to bind ``statement`` (DESCRIBE: no row is read) with: a tree reading a
    Poisson sample gets a placeholder key, which types the statement as any key would."""
    if isinstance(statement, exp.Expr) and needs_sample_key(statement):
        return {**(parameters or {}), SAMPLE_KEY_PARAMETER: UNBOUND_SAMPLE_KEY}
    return parameters


def sample_threshold(rate: Fraction) -> str:
    """``InSample``'s threshold for a sampling ``rate`` in (0, 1): floor(rate·2^64) as 16 hex
    digits, so a unit is kept with probability at most ``rate`` (a fixed-width lower-case hex
    text compares as its number does).

    >>> sample_threshold(Fraction(1, 2)), sample_threshold(Fraction(1, 3))
    ('8000000000000000', '5555555555555555')
    """
    if not 0 < rate < 1:
        raise ValueError(f"a sampling rate in (0, 1) has a threshold, got {rate}")
    return format(int(rate * 2**64), "016x")


class CopiedTable(exp.Expression, exp.Func):
    """A private table (``this``: its catalog key) read through its bounded copy: the backend
    renders it as the copy's table. The args say all the copy depends on besides the salt, so
    the backend names the copy from the node alone: ``unit`` (lower case; absent for a
    row-level table), ``rows`` (MAX ROWS PER UNIT), ``list_length`` and ``string_length`` (the
    policy's limits, absent for the defaults)."""

    arg_types = {"this": True, "unit": False, "rows": True, "list_length": False, "string_length": False}

    @property
    def table_key(self) -> str:
        return self.this.name

    @property
    def unit_column(self) -> str | None:
        unit = self.args.get("unit")
        return None if unit is None else unit.name

    @property
    def rows_per_unit(self) -> int:
        return int(self.args["rows"].name)

    @property
    def list_length(self) -> int | None:
        return _number_arg(self.args.get("list_length"))

    @property
    def string_length(self) -> int | None:
        return _number_arg(self.args.get("string_length"))


def _number_arg(node: exp.Expr | None) -> int | None:
    return None if node is None else int(node.name)


def bounded_read(key: str, unit: str | None, rows_per_unit: int, list_length: int | None,
                 string_length: int | None, columns: Iterable[str], *,
                 sample: tuple[Fraction, str, str] | None = None) -> exp.Select:
    """The rows of private table ``key``'s bounded copy, padding rows dropped (``PAD``): a query
    over its ``columns``. ``unit`` is ``None`` for a row-level table. ``sample``: (rate, unit
    column, its type): only the rows of the units in a Poisson sample at that rate (``InSample``;
    all of a unit's rows or none, after the copy's row limit).

    >>> print(bounded_read("visits", "uid", 2, None, None, ["uid"]).sql())
    SELECT "uid" FROM COPIED_TABLE('visits', 'uid', 2) WHERE NOT dp_pad
    """
    read = _bounded_read(key, unit, rows_per_unit, list_length, string_length, tuple(columns)).copy()
    if sample is None or sample[0] == 1:  # a sample of every unit is the table itself
        return read
    rate, column, type_name = sample
    copied = read.args["from_"].this
    sampled = InSample(this=exp.column(column, quoted=True), type=exp.Literal.string(type_name),
                       threshold=exp.Literal.string(sample_threshold(rate)), rate=exp.Literal.string(str(rate)),
                       units=copied.copy() if unit is not None else None)
    return read.where(sampled, copy=False)


@lru_cache(maxsize=256)
def _bounded_read(key: str, unit: str | None, rows_per_unit: int, list_length: int | None,
                  string_length: int | None, columns: tuple[str, ...]) -> exp.Select:
    table = CopiedTable(
        this=exp.Literal.string(key), unit=None if unit is None else exp.Literal.string(unit.lower()),
        rows=exp.Literal.number(rows_per_unit),
        list_length=None if list_length is None else exp.Literal.number(list_length),
        string_length=None if string_length is None else exp.Literal.number(string_length))
    select = exp.Select(expressions=[exp.column(c, quoted=True) for c in columns])
    return select.from_(table, copy=False).where(exp.Not(this=exp.column(PAD)), copy=False)


def bucket_of(value: exp.Expr, edges: Sequence[exp.Expr]) -> exp.Expr:
    """The smallest j with value <= edges[j] (len(edges) when above them all): a binary search
    written as nested CASEs, log2(len(edges)) comparisons a row instead of one an edge.
    ``edges`` are SQL expressions in the value's type of comparison.

    >>> bucket_of(exp.column("v"), [exp.Literal.number(1), exp.Literal.number(5)]).sql()
    'CASE WHEN v <= 5 THEN CASE WHEN v <= 1 THEN 0 ELSE 1 END ELSE 2 END'
    """
    def search(low: int, high: int) -> exp.Expr:
        if low == high:
            return exp.Literal.number(low)
        middle = (low + high) // 2
        return exp.Case(ifs=[exp.If(this=exp.LTE(this=value.copy(), expression=edges[middle].copy()),
                                    true=search(low, middle))], default=search(middle + 1, high))
    return search(0, len(edges))
