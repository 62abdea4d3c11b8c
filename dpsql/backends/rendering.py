"""What an engine's forms of dpsql's pieces are (``Rendering``), and the one construction every
engine shares (``in_sample``): below the engine packages, which build their ``Rendering`` from it,
and below ``dpsql.backends.render``, which writes a tree with one of them."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from sqlglot import exp

from dpsql.backends.bounding import piece_copy_name, raw_rows_name
from dpsql.sql.pieces import Canonical, InSample

DUCKDB = "duckdb"
SPARK = "spark"


@dataclass(frozen=True)
class Rendering:
    """One engine's forms of dpsql's pieces: what ``render`` asks of an engine package."""

    pieces: Mapping[type, Callable[[exp.Expr], exp.Expr]]
    """Node class -> its engine form (children already rendered)."""
    typed: Mapping[type, Callable[[exp.Expr, Mapping[str, str]], exp.Expr]] = field(default_factory=dict)
    """Node class -> its engine form given the dialect's column types (``SparkSQL.types``)."""
    prepare: Callable[[exp.Expr, Mapping[str, str]], exp.Expr] | None = None
    """A rewrite of the whole tree, given the column types, before any piece is written
    (Spark: DuckDB's meaning in Spark's terms)."""


def in_sample(node: InSample, digest: Callable[[exp.Expr], exp.Expr], canonical: Callable[[Canonical], exp.Expr],
              units: Callable[[str], exp.Expr]) -> exp.Expr:
    """A unit in the query's Poisson sample: the first 16 hex digits of ``digest`` (a lower-case
    hex SHA-256, each engine's own) of the sample key and the unit's canonical text
    (``canonical``), below the threshold (fixed-width hex compares as the number it writes).
    Over a unit-level copy, computed once per unit on its row-count table (``units`` of its
    name) and matched by the unit's own equality, which is its identity (the copy admits no
    other units); a row-level copy's rows are its units, hashed as they are."""

    def kept(value: exp.Expr) -> exp.Expr:
        text = canonical(Canonical(this=value, type=node.args["type"].copy()))
        head = exp.Anonymous(this="LEFT", expressions=[digest(text), exp.Literal.number(16)])
        return exp.LT(this=head, expression=node.args["threshold"].copy())

    copied = node.args.get("units")
    if copied is None:
        return exp.Paren(this=kept(node.this))
    # Children are rendered first: the copy is its engine's table by now, named as the copy.
    name = copied.name if isinstance(copied, exp.Table) else piece_copy_name(copied)
    sampled = exp.Select(expressions=[exp.column("dp_unit")]).from_(units(raw_rows_name(name)))
    return exp.In(this=node.this, query=sampled.where(kept(exp.column("dp_unit"))).subquery())
