"""Per-node rewrites of string functions: DuckDB's meaning in Spark's terms.

As ``dpsql.backends.spark.rewrites`` (whose ``Writer`` they use): children are rewritten first,
types read with ``typed``. What differs, measured on pyspark 4.3 against DuckDB 2.0:

* LIKE: DuckDB's has no escape character, Spark's has ``\\``; and Spark's regular expression
  for a pattern with several ``%`` backtracks (time growing with a power of the text's length);
* SUBSTRING with a start of 0 or a negative length, LEFT and RIGHT with a negative length;
* TRIM: DuckDB removes every Unicode space separator, Spark only U+0020;
* LENGTH and strlen are BIGINTs on DuckDB, INTs on Spark; prefix / suffix are DuckDB's names;
* ``||`` and CONCAT of a non-string: written as text first, explicitly.
"""

from __future__ import annotations

from sqlglot import exp

from dpsql.backends.spark.infer import integer_literal, typed
from dpsql.backends.spark.rewrites import INT_MAX, Writer, _number, with_type

UNICODE_SPACES = " \u00a0\u1680" + "".join(chr(c) for c in range(0x2000, 0x200B)) + "\u202f\u205f\u3000"
"""What DuckDB's TRIM removes by default: the Unicode space separators (Zs). Spark's removes U+0020 only."""

def like(w: Writer, node: exp.Expr) -> exp.Expr:
    """LIKE as an anchored regular expression with atomic groups: DuckDB's LIKE has no escape
    character (Spark's has ``\\``), and Spark's own translation backtracks (a pattern with three
    ``%`` took seconds per kilobyte of text, a timing channel DuckDB does not have). Matching
    each ``%``-separated piece at its earliest place is exact for LIKE and linear."""
    matched: exp.Expr = exp.RegexpLike(this=node.this, expression=exp.Literal.string(like_regex(node.expression.name)))
    return with_type(exp.Not(this=exp.Paren(this=matched)) if node.args.get("negate") else matched, "BOOLEAN")


def like_regex(pattern: str) -> str:
    r"""The Java regular expression ``RLIKE`` matches exactly where DuckDB's ``LIKE pattern`` does.

    >>> like_regex('a%b_c%')
    '(?s)\\A\\Qa\\E(?>.*?\\Qb\\E.\\Qc\\E).*\\z'
    >>> like_regex('%x%y%')
    '(?s)\\A(?>.*?\\Qx\\E)(?>.*?\\Qy\\E).*\\z'
    """
    pieces = pattern.split("%")

    def fixed(piece: str) -> str:
        return ".".join(f"\\Q{part.replace(chr(92) + 'E', chr(92) + 'E' + chr(92) + chr(92) + 'E' + chr(92) + 'Q')}\\E"
                        if part else "" for part in piece.split("_"))

    if len(pieces) == 1:
        return f"(?s)\\A{fixed(pattern)}\\z"
    middle = "".join(f"(?>.*?{fixed(p)})" for p in pieces[1:-1] if p)
    return f"(?s)\\A{fixed(pieces[0])}{middle}.*{fixed(pieces[-1])}\\z"


def length(w: Writer, node: exp.Expr) -> exp.Expr:
    return w.cast(exp.Length(this=node.this), "BIGINT", fallible=False)


def substring(w: Writer, node: exp.Expr) -> exp.Expr:
    """DuckDB's positions in Spark's terms: a start of 0 is one before the first character, and
    a negative length counts back from the start (positions are literals: ``dpsql.backends.spark.text``)."""
    start, size = integer_literal(node.args["start"]), node.args.get("length")
    count = None if size is None else integer_literal(size)
    if count is None or start is None or (start > 0 and count >= 0) or (start < 0 and count >= 0):
        return node
    if start > 0:
        first = max(start - 1 + count, 0)
        position, count = first + 1, start - 1 - first
    elif start < 0:
        position = max(start + count, -INT_MAX)
        count = start - position
    else:
        position, count = 1, max(count - 1, 0)
    return exp.Substring(this=node.this, start=_number(position), length=_number(count))


def left_right(w: Writer, node: exp.Expr) -> exp.Expr:
    """LEFT and RIGHT with a negative length drop that many characters (DuckDB); Spark gives ''."""
    count = integer_literal(node.expression)
    if count is None or count >= 0:
        return node
    if isinstance(node, exp.Left):
        return exp.Substring(this=node.this, start=_number(-INT_MAX), length=_number(INT_MAX + count))
    return exp.Substring(this=node.this, start=_number(1 - count))


def trim(w: Writer, node: exp.Expr) -> exp.Expr:
    if node.expression is None:
        node.set("expression", exp.Literal.string(UNICODE_SPACES))
        node.set("position", node.args.get("position") or "BOTH")
    return node


def concatenation(w: Writer, node: exp.Expr) -> exp.Expr:
    """``||`` and CONCAT of non-strings: each written as text first (integers, DECIMALs and
    booleans are written alike by both engines)."""
    for operand in ([node.this, node.expression] if isinstance(node, exp.DPipe) else list(node.expressions)):
        if typed(operand) not in ("VARCHAR", '"NULL"'):
            operand.replace(w.cast(operand.copy(), "VARCHAR", fallible=False))
    return node


def searched(w: Writer, node: exp.Expr) -> exp.Expr:
    """prefix, suffix and contains (DuckDB names) as Spark's startswith, endswith, contains."""
    kind = {"prefix": exp.StartsWith, "suffix": exp.EndsWith, "contains": exp.Contains}[node.name.lower()]
    return kind(this=node.expressions[0], expression=node.expressions[1])


def octets(w: Writer, node: exp.Expr) -> exp.Expr:
    return w.cast(w.fn("octet_length", node.expressions[0]), "BIGINT", fallible=False)


