"""Each engine's ``Rendering`` by its dialect: the table ``dpsql.backends.render`` writes with.

It imports only the engines' piece modules (never an engine itself), so ``render`` can look it up
without going round a circle through the engines, which render with it.

>>> sorted(RENDERINGS)
['duckdb', 'spark']
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

from dpsql.backends.duckdb import pieces as duckdb_pieces
from dpsql.backends.rendering import DUCKDB, SPARK, Rendering
from dpsql.backends.spark import pieces as spark_pieces
from dpsql.errors import InternalError

RENDERINGS: Mapping[str, Rendering] = MappingProxyType({
    DUCKDB: duckdb_pieces.RENDERING,
    SPARK: spark_pieces.RENDERING,
})
"""Dialect -> its engine's forms (a new engine: its ``pieces.RENDERING`` here, and its line in
``dpsql.backends.registry.ENGINES``)."""


def rendering_for(dialect: str) -> Rendering:
    """The ``Rendering`` of the engine whose dialect is ``dialect``."""
    found = RENDERINGS.get(str(dialect))
    if found is None:
        raise InternalError(f"no engine renders the dialect {dialect!r}")
    return found
