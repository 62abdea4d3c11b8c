"""The engine-specific pieces of dpsql's generated SQL, as tree nodes rendered once per engine.

Analysis and the rewrite (``dpsql.backends.rewrite``) build one sqlglot tree per statement out
of plain nodes (SELECT, CASE, LEAST, windows, ...), which sqlglot writes in any dialect, and the
few pieces of ``dpsql.sql.pieces``, whose meaning dpsql fixes but whose SQL differs by engine.
``render`` replaces each of them by its engine's form and writes the tree, once, at the end.

Each engine's forms live with its engine, as a ``Rendering``: DuckDB's in
``dpsql.backends.duckdb.pieces``, Spark's in ``dpsql.backends.spark.pieces``. This module holds
none of them: it finds an engine's ``Rendering`` by its dialect name through
``dpsql.backends.renderings``; ``Rendering`` and the one construction both share (``in_sample``)
are in ``dpsql.backends.rendering``, below the engines.

The pieces every engine writes (``dpsql.sql.pieces``):

* ``Total``: an expression whose errors become NULL;
* ``ExactInteger``: a value widened so that summing integers stays exact;
* ``SaltedHash``: a keyed, uniform 64-bit hash of the secret salt and values, the order of
  every salted choice;
* ``Canonical``: a value's exact canonical encoding as text;
* ``KeyText``: a key's canonical text as bytes, its lossless read-back form
  (``dpsql.backends.keys``);
* ``IsNaN``: true for a floating NaN, NULL for NULL;
* ``CopiedTable``: a private table's bounded copy (``dpsql.backends.bounding`` names it);
* ``InSample``: a unit in the query's Poisson sample (``in_sample``).
"""

from __future__ import annotations

from collections.abc import Mapping

from sqlglot import exp

from dpsql.backends.rendering import DUCKDB as DUCKDB
from dpsql.backends.rendering import SPARK as SPARK
from dpsql.backends.rendering import Rendering as Rendering
from dpsql.backends.rendering import in_sample as in_sample

_FOUND: dict[str, Rendering] = {}


def rendering_of(dialect: str) -> Rendering:
    """The ``Rendering`` of the engine whose dialect is ``dialect`` (``dpsql.backends.renderings``)."""
    found = _FOUND.get(dialect)
    if found is None:
        # Looked up when first asked: the engine packages render with this module themselves.
        from dpsql.backends.renderings import rendering_for

        found = _FOUND[str(dialect)] = rendering_for(dialect)
    return found


def render(tree: exp.Expr, dialect: str = DUCKDB, copy: bool = True, pretty: bool = False) -> str:
    """The SQL of ``tree`` for ``dialect``: each engine-specific node in its engine's form;
    ``pretty`` lays it out on indented lines (for EXPLAIN).

    >>> from dpsql.sql.pieces import salted_hash, total
    >>> render(exp.select(total(exp.column("x").div(2)), salted_hash(exp.column("u"))))
    'SELECT TRY(x / 2), HASH(XOR(HASH($salt), HASH(u)))'
    """
    rendering = rendering_of(dialect)
    tree = tree.copy() if copy else tree  # in place: the caller built ``tree`` for this call alone
    types: Mapping[str, str] = getattr(dialect, "types", {})
    if rendering.prepare is not None:
        tree = rendering.prepare(tree, types)
    pieces, typed = rendering.pieces, rendering.typed
    for node in reversed(list(tree.dfs())):  # children first: a piece may hold another
        kind = type(node)
        piece = pieces.get(kind)
        if piece is not None:
            replacement = piece(node)
        elif typed and kind in typed:
            replacement = typed[kind](node, types)
        else:
            continue
        if node is tree:
            tree = replacement
        else:
            node.replace(replacement)
    return tree.sql(dialect=dialect, copy=False, pretty=pretty)  # copied above if asked: no second copy
