"""Every aggregate family, in the order the stages consult them.

Order matters in one place: ``classify_distinct`` asks each family in turn, so COUNT(DISTINCT
unit) (units) is tried before any other COUNT(DISTINCT expr) (distinct values).
"""

from __future__ import annotations

from typing import Union

from sqlglot import exp

from dpsql.analysis.aggregates.avg import AvgFamily
from dpsql.analysis.aggregates.correlation import CorrelationFamily
from dpsql.analysis.aggregates.count import CountFamily
from dpsql.analysis.aggregates.covariance import CovarianceFamily
from dpsql.analysis.aggregates.distinct import DistinctFamily
from dpsql.analysis.aggregates.family import AggregateFamily
from dpsql.analysis.aggregates.quantile import QuantileFamily
from dpsql.analysis.aggregates.regression import RegressionFamily
from dpsql.analysis.aggregates.sum import SumFamily
from dpsql.analysis.aggregates.units import UnitsFamily
from dpsql.analysis.aggregates.variance import VarianceFamily
from dpsql.analysis.plan import Aggregate, AggregateRelease
from dpsql.errors import InternalError

FAMILIES: tuple[AggregateFamily, ...] = (
    CountFamily(), UnitsFamily(), DistinctFamily(), SumFamily(), AvgFamily(), VarianceFamily(), QuantileFamily(),
    CovarianceFamily(), CorrelationFamily(), RegressionFamily(),
)
"""The aggregate families dpsql answers with noise; adding one is adding it here."""

_BY_FUNCTION = {function: family for family in FAMILIES for function in family.functions}
_BY_NODE = {node: family for family in FAMILIES for node in family.nodes}


def family_of(aggregate: Union[Aggregate, AggregateRelease]) -> AggregateFamily:
    """The family that owns an aggregate (by its ``function``)."""
    try:
        return _BY_FUNCTION[aggregate.function]
    except KeyError:
        raise InternalError(f"no aggregate family computes {aggregate.function!r}") from None


def family_for_call(call: exp.Expr) -> AggregateFamily | None:
    """The family that classifies a sqlglot aggregate call, or None when none does. A subclass
    is a spelling of its parent (sqlglot's ApproxQuantile is a Quantile)."""
    return next((_BY_NODE[cls] for cls in type(call).__mro__ if cls in _BY_NODE), None)


def spellings() -> tuple[str, ...]:
    """Every SQL spelling of every family, each once, in registry order (for completion).

    >>> spellings()[:4]
    ('COUNT', 'SUM', 'AVG', 'VARIANCE')
    """
    return tuple(dict.fromkeys(name for family in FAMILIES for name in family.spellings))
