"""What binding a query's SQL can depend on, less the values of the numbers it compares.

A fresh query text often differs from one answered before only in a threshold
(``WHERE amount < 590.1`` then ``< 590.2``). Binding the generated statement (DuckDB's
``DESCRIBE``, before the charge: it refuses a query that does not type-check and types the keys)
then gives the same answer, because a comparison's result is BOOLEAN and whether it binds
depends on the types compared, never on the number: ``binding_text`` writes such a text with
those numbers abstracted to their literal class, so the bind can be kept under it.

Only what that argument covers is abstracted: an unsigned decimal number (digits, at most one
point, no exponent, at most 18 digits, so every one parses as an exact integer or DECIMAL),
standing directly as one side of ``=``, ``<>``, ``<``, ``<=``, ``>``, ``>=``. Its class is what
decides how the engine types it: for an integer, its number of digits and the smallest integer
type (signed or unsigned, 8 to 128 bits) it fits, which DuckDB's integer literals are cast by;
for a decimal, the digits before and after the point (its DECIMAL width and scale). Any other
number (a bound in LEAST, a LIMIT, an OPTIONS value, a sampling rate, a CASE branch, an
argument) stays as written.

This keys the *bind* only (the statement's, and the keys' types where they are bound).
Everything the analysis reads (ranges narrowed by the comparison,
clamps, the plan, the noise) is computed afresh from the real text; the caller keys the bind by
the plan's shape too, so a threshold that narrows a column's range changes the key.
"""

from __future__ import annotations

import re

from sqlglot import exp

COMPARISONS = (exp.EQ, exp.NEQ, exp.LT, exp.LTE, exp.GT, exp.GTE)
"""The predicates whose numeric side is abstracted: each binds to BOOLEAN, or fails, by types alone."""

_PLAIN = re.compile(r"(\d{1,18})(?:\.(\d{1,18}))?").fullmatch
_INTEGER_BITS = (7, 8, 15, 16, 31, 32, 63, 64, 127, 128)
"""TINYINT, UTINYINT, SMALLINT, ..., UHUGEINT: the value bits of each integer type."""


def literal_class(text: str) -> tuple | None:
    """How the engine types the number ``text``, or ``None`` when it is not a plain one.

    >>> literal_class("590.0001") == literal_class("123.4567"), literal_class("590.0001") == literal_class("590.01")
    (True, False)
    >>> literal_class("100") == literal_class("127"), literal_class("127") == literal_class("128")
    (True, False)
    >>> literal_class("1e5"), literal_class("-1")
    (None, None)
    """
    found = _PLAIN(text)
    if found is None or len(found.group(1)) + len(found.group(2) or "") > 18:
        return None
    whole, fraction = found.groups()
    if fraction is not None:
        return ("decimal", len(whole), len(fraction))
    value = int(whole)
    return ("integer", len(whole), next(bits for bits in _INTEGER_BITS if value < 2**bits))


def binding_text(sql: str, tree: exp.Expression) -> tuple[str, tuple] | None:
    """``sql`` with each compared plain number replaced by ``?``, and their classes in order; or
    ``None`` when there is none (or the tree does not say where its numbers are in ``sql``).

    >>> from dpsql.sql.parse import parse_query
    >>> text = "SELECT COUNT(*) FROM t WHERE x < 590.25 AND LEAST(y, 7) > 3"
    >>> binding_text(text, parse_query(text))
    ('SELECT COUNT(*) FROM t WHERE x < ? AND LEAST(y, 7) > ?', (('decimal', 3, 2), ('integer', 1, 7)))
    >>> binding_text("SELECT COUNT(*) FROM t LIMIT 5", parse_query("SELECT COUNT(*) FROM t LIMIT 5")) is None
    True
    """
    spans = []
    for literal in tree.find_all(exp.Literal):
        if not literal.is_number or not isinstance(literal.parent, COMPARISONS):
            continue
        start, end = literal.meta.get("start"), literal.meta.get("end")
        if not isinstance(start, int) or not isinstance(end, int) or sql[start:end + 1] != literal.this:
            return None
        found = literal_class(literal.this)
        if found is not None:
            spans.append((start, end, found))
    if not spans:
        return None
    spans.sort()
    parts, classes, at = [], [], 0
    for start, end, found in spans:
        if start < at:
            return None
        parts += [sql[at:start], "?"]
        classes.append(found)
        at = end + 1
    parts.append(sql[at:])
    return "".join(parts), tuple(classes)
