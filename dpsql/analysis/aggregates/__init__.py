"""Aggregates as one registry: every aggregate function dpsql answers, a family per module.

``split`` turns a private query's select list, HAVING and ORDER BY into the aggregate calls of
the noisy core and a free post-processing query over it; each call is classified by the family
that owns its sqlglot node. Each family then carries its aggregates through every stage:

* check (``split.classify``): which calls it accepts and its refusals;
* analyse (``dpsql.analysis.analyse``): the measures it needs, their kinds and grids, and how
  its value is released from them (an ``AggregateRelease``); the query's epsilon is split
  between aggregates by weight and each aggregate's share equally between its measures;
* release and accuracy (``dpsql.query.release``, ``dpsql.query.accuracy``): its values from the noisy
  measures, and their intervals;
* explain (``dpsql.answer.explain``): how its release is described;
* the shell (``dpsql.shell.complete``): its SQL spellings.

The rewrite (``dpsql.backends.rewrite``) sees measure kinds (count, sum, units, histogram,
distinct), never aggregate functions; a sum may be a *product measure* (``Measure.factors``: each
row value a product of clamped, centred arguments, each on its own grid), as the two-argument
second moments (CORR, COVAR_*, REGR_*: ``AggregateFamily.arity`` 2, ``pair_shapes``) ask.

Adding an aggregate
-------------------
Write one module here with a subclass of ``family.AggregateFamily``:

1. ``functions`` (the ``Aggregate.function`` values it owns; add them to
   ``dpsql.analysis.plan.AggregateFunction``), ``spellings`` (its SQL names) and ``nodes`` (the
   sqlglot call classes it classifies; ``classify_distinct`` for ``F(DISTINCT ...)``);
2. ``classify``: the ``Aggregate`` a call computes, refusing with ``refuse(node, message, hint)``;
3. ``shapes``: its ``measure_count`` measures, as bounded sums of integer row values whose
   sensitivity ``dpsql.analysis.sensitivity`` derives (a new measure kind also needs the
   rewrite), and its ``AggregateRelease``; ``ranged`` when its argument needs a bounded range;
4. ``values``: its released values, from noisy measures only; override ``half_widths`` (and
   ``intervals`` when not value ± half-width), ``explain`` and ``result_type`` as needed;
5. add an instance to ``registry.FAMILIES``, and its tests: a brute-force sensitivity oracle
   (tests/test_sensitivity_oracle.py) for any new measure, and release/accuracy tests.
"""

from dpsql.analysis.aggregates.count import counts_rows
from dpsql.analysis.aggregates.family import AggregateFamily
from dpsql.analysis.aggregates.registry import FAMILIES, family_of, spellings
from dpsql.analysis.aggregates.split import (
    classify,
    null_on_zero_divisors,
    output_name,
    plain_projection,
    split_aggregates,
    total_post,
)

__all__ = [
    "AggregateFamily", "FAMILIES", "classify", "counts_rows", "family_of", "null_on_zero_divisors", "output_name",
    "plain_projection",
    "total_post", "spellings", "split_aggregates",
]
