"""DuckDB's forms of dpsql's pieces (``dpsql.sql.pieces``), rendered by ``dpsql.backends.render``.

* ``Total``: ``TRY(expr)``;
* ``ExactInteger``: a cast to ``HUGEINT``;
* ``SaltedHash``: ``hash()`` of each value folded in by XOR and mixed by ``hash()`` again, the
  salt a query parameter (``dpsql.backends.bounding.keyed_hash``);
* ``Canonical``: ``dpsql.backends.bounding.canonical_text``;
* ``KeyText``: ``encode(CAST(x AS VARCHAR))`` (``dpsql.backends.keys``);
* ``IsNaN``: ``ISNAN``;
* ``CopiedTable``: the copy in the attached in-memory database ``dp_bounding``;
* ``InSample``: ``sha256($dp_sample_key || text)`` of the unit's canonical text
  (``dpsql.backends.render.in_sample``).
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import sqlglot
from sqlglot import exp

from dpsql.backends.bounding import DATABASE, SALT_PARAMETER, binary, canonical_text, piece_copy_name
from dpsql.backends.rendering import DUCKDB, Rendering, in_sample
from dpsql.sql.pieces import (
    SAMPLE_KEY_PARAMETER,
    Canonical,
    CopiedTable,
    ExactInteger,
    InSample,
    IsNaN,
    KeyText,
    SaltedHash,
    Total,
    data_type,
)


def _total(node: Total) -> exp.Expr:
    return exp.Anonymous(this="TRY", expressions=[node.this])


def _exact_integer(node: ExactInteger) -> exp.Expr:
    return exp.Cast(this=node.this, to=data_type("HUGEINT", DUCKDB))


def _salted_hash(node: SaltedHash) -> exp.Expr:
    """``dpsql.backends.bounding.keyed_hash``: each value's hash folded in by XOR, then mixed."""
    folded: exp.Expr = exp.Anonymous(this="HASH", expressions=[exp.Placeholder(this=SALT_PARAMETER)])
    for value in node.expressions:
        mixed = exp.Anonymous(this="XOR", expressions=[folded, exp.Anonymous(this="HASH", expressions=[value])])
        folded = exp.Anonymous(this="HASH", expressions=[mixed])
    return folded


def _canonical(node: Canonical) -> exp.Expr:
    return _canonical_tree(node.this.sql(dialect=DUCKDB), node.args["type"].name).copy()


@functools.lru_cache(maxsize=512)
def _canonical_tree(value: str, type_name: str) -> exp.Expr:
    """A value's canonical form, parsed once per (value SQL, type): each new query text re-renders
    the same unit and key columns."""
    return sqlglot.parse_one(binary(canonical_text(value, type_name)), dialect=DUCKDB)


def _key_text(node: KeyText) -> exp.Expr:
    text = exp.cast(node.this, data_type("VARCHAR", DUCKDB))
    return exp.Anonymous(this="ENCODE", expressions=[text])


def _is_nan(node: IsNaN) -> exp.Expr:
    return exp.Anonymous(this="ISNAN", expressions=[node.this])


def _in_sample(node: InSample) -> exp.Expr:
    return in_sample(node, lambda text: exp.Anonymous(this="SHA256", expressions=[
        exp.DPipe(this=exp.Placeholder(this=SAMPLE_KEY_PARAMETER), expression=exp.Paren(this=text))]),
        _canonical, lambda name: exp.table_(name, db="main", catalog=DATABASE, quoted=True))


def _bounded_table(node: CopiedTable) -> exp.Expr:
    return exp.table_(piece_copy_name(node), db="main", catalog=DATABASE, quoted=True)


_PIECES: dict[type, Callable] = {
    Total: _total,
    ExactInteger: _exact_integer,
    SaltedHash: _salted_hash,
    Canonical: _canonical,
    KeyText: _key_text,
    IsNaN: _is_nan,
    InSample: _in_sample,
    CopiedTable: _bounded_table,
}

RENDERING = Rendering(_PIECES)
"""DuckDB's forms of the pieces (``dpsql.backends.render.render``)."""
