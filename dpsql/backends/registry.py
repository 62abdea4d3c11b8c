"""The engines dpsql runs on, one line each: how a target is recognised, opened and rendered for.

``dpsql.connect(target, ...)`` opens the first engine of ``ENGINES`` whose ``recognise`` accepts
``target``; ``dpsql.backends.render`` writes a statement with the ``Rendering`` of the engine
whose dialect it is given. Callers never test what kind of engine they hold: everything they
ask of one is the ``Backend`` protocol (``dpsql.backends.base``). Adding an engine is a package
of its own (its ``Backend``, its ``recognise`` and ``open``, its ``Rendering``) and one line here.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from dpsql.backends import duckdb as duckdb_backend
from dpsql.backends import spark as spark_backend
from dpsql.backends.base import Backend
from dpsql.backends.rendering import DUCKDB, SPARK, Rendering
from dpsql.backends.renderings import RENDERINGS
from dpsql.backends.renderings import rendering_for as rendering_for


@dataclass(frozen=True)
class EngineKind:
    """One engine dpsql can run on."""

    dialect: str
    """The sqlglot dialect its statements are rendered in (``Backend.dialect``)."""
    recognise: Callable[[Any], bool]
    """Whether a ``dpsql.connect`` target is this engine's to open."""
    open: Callable[..., Backend]
    """Opens it: ``open(target, *, query_timeout, memory_limit, copies)``; refuses the options it has not."""
    rendering: Rendering
    """Its forms of dpsql's pieces (``dpsql.backends.render``)."""


ENGINES: tuple[EngineKind, ...] = (
    EngineKind(SPARK, spark_backend.recognise, spark_backend.open_spark, RENDERINGS[SPARK]),
    EngineKind(DUCKDB, duckdb_backend.recognise, duckdb_backend.open_duckdb, RENDERINGS[DUCKDB]),
)
"""Asked in order; the last recognises every target (and refuses what it cannot open)."""


def engine_for(target: Any) -> EngineKind:
    """The first engine that recognises ``target``.

    >>> engine_for(":memory:").dialect, engine_for("cluster.spark.toml").dialect
    ('duckdb', 'spark')
    """
    return next(kind for kind in ENGINES if kind.recognise(target))
