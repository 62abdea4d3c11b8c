"""The outside cell as the analyst sees it (``dpsql.analysis.domains``): the rows whose keys lie
outside a public domain, released as one more cell beside the domain's, with its values named
as the query's outputs and its intervals derived as for any row. Released values only.

When it is shown. The cell is always released and always in ``res.outside_domain``; the
footers (``repr``, the shell, the CLI, the server's NOTICE) show it only when the query asks
(``OPTIONS (show_outside = true)``) or when it can be told from noise (``told_from_noise``):
some noisy measure of the cell (a count, a sum, a count of units) lies beyond its own noise's
95% half-width, Bonferroni-split over those measures. With no row outside, every such measure
is exactly 0 (a sum of nothing), so an empty cell is shown with probability at most 5%. A
decision on released values and plan constants alone: post-processing, free.
"""

from __future__ import annotations

from sqlglot import exp

from dpsql.analysis.aggregates import counts_rows, null_on_zero_divisors
from dpsql.analysis.aggregates.exact import noise_half_width
from dpsql.analysis.domains import key_text, reports_outside
from dpsql.analysis.plan import Plan, PrivateQuery
from dpsql.answer.result import OutsideDomain
from dpsql.backends.base import Backend
from dpsql.query.accuracy import aggregates_of, cut_half_width, output_cells
from dpsql.query.release import core_columns, from_stored, half_widths, intervals
from dpsql.sql.numbers import plain_number

ALPHA = 0.05
"""An empty outside cell is shown with at most this probability (``told_from_noise``)."""
ADDITIVE = ("count", "sum", "units")
"""Measure kinds that sum over the cell's rows: exactly 0 over none."""


def told_from_noise(plan: Plan, noisy: dict[str, int], alpha: float = ALPHA) -> bool:
    """True when a noisy additive measure of the outside cell (``noisy``: measure name -> noisy
    value in grid units) lies beyond its noise's (1 - alpha/m) half-width, m the number of such
    measures: an empty cell (each of them exactly 0) passes with probability at most ``alpha``.

    >>> from types import SimpleNamespace as S
    >>> from fractions import Fraction
    >>> count = S(name="m0", kind="count", noise="laplace", scale=Fraction(10))
    >>> plan = S(measures=(count,))
    >>> told_from_noise(plan, {"m0": 30}), told_from_noise(plan, {"m0": 31}), told_from_noise(plan, {"m0": -31})
    (False, True, True)
    """
    measures = [m for m in plan.measures if m.kind in ADDITIVE and m.noise != "none" and m.name in noisy]
    if not measures:
        return False
    return any(abs(int(noisy[m.name])) > noise_half_width(m, alpha / len(measures)) for m in measures)


def outside_domain(engine: Backend, plan: Plan, checked: PrivateQuery, stored: dict | None,
                   core_types: list[str], asked: bool = False) -> OutsideDomain | None:
    """The outside cell (``dpsql.analysis.domains``) as the analyst sees it, from its released values
    and noisy measures; ``None`` when the query has none. Its values are the query's outputs
    by their names (``AVG(amount) AS a`` is ``a``; ``ROUND(AVG(amount)) AS a`` is computed by
    post-processing the cell alone, with the interval derived as for any row), and, by their
    SQL, any aggregate no output reads (a COUNT(*) in HAVING still counts the cell's rows).
    ``asked``: the query asked for it in every footer (module docstring)."""
    if stored is None or not reports_outside(plan.query.keys):
        return None
    keys, aggregates = plan.query.keys, plan.query.aggregates
    core = tuple([None] * len(keys) + [plain_number(v) for v in stored["values"]])
    release = from_stored(plan, {k: (int(v),) for k, v in stored["noisy"].items()}, 1)
    outputs = [(position, name, item.unalias()) for position, (name, item)
               in enumerate(zip(checked.outputs, checked.post.expressions)) if aggregates_of(item.unalias())]
    read = {a for _, _, node in outputs for a in aggregates_of(node)}
    computed = [(p, name, node) for p, name, node in outputs if not isinstance(node, exp.Column)]
    shown = _outside_outputs(engine, plan, checked, core, core_types) if computed else None
    values, sources = {}, {}
    for position, name, node in outputs:
        if isinstance(node, exp.Column):
            values[name] = core[len(keys) + [a.name for a in aggregates].index(node.name)]
        elif shown is not None and not node.find(exp.Window):
            values[name] = plain_number(shown[position])
        else:
            continue
        sources[name] = position
    labels = {}
    for index, aggregate in enumerate(aggregates):
        if aggregate.name not in read and aggregate.label not in values:
            values[aggregate.label] = core[len(keys) + index]
            labels[aggregate.label] = aggregate.name
    names = {aggregate: output for output, aggregate in reversed(checked.direct)}
    rows = next((names.get(a.name, a.label) for a in aggregates
                 if counts_rows(a) and names.get(a.name, a.label) in values),
                None)

    def cells(alpha: float) -> dict[str, tuple[float, float, float]]:
        """Per value, (low, high, half-width) of its interval (cut to what the policy allows)."""
        shown_row = shown if shown is not None else (None,) * len(checked.outputs)
        derived = output_cells(plan, checked, release, [shown_row], alpha)
        own, spans = half_widths(plan, release, alpha), intervals(plan, release, alpha)
        found = {}
        for name in sources:
            if name in derived:
                low, high, half = map(float, derived[name][0])
                found[name] = (low, high, cut_half_width(half, values[name], low, high))
        for label, name in labels.items():
            if name in own:
                low, high = map(float, spans[name][0])
                found[label] = (low, high, cut_half_width(float(own[name][0]), values[label], low, high))
        return found

    return OutsideDomain(tuple(key_text(key) for key in keys), values,
                         lambda alpha: {name: cell[2] for name, cell in cells(alpha).items()}, rows,
                         spans=lambda alpha: {name: cell[:2] for name, cell in cells(alpha).items()},
                         shown=asked or told_from_noise(plan, stored["noisy"]))


def _outside_outputs(engine: Backend, plan: Plan, checked: PrivateQuery, core: tuple,
                     core_types: list[str]) -> tuple | None:
    """The select list of the query run on the outside cell alone (no WHERE, ORDER BY,
    LIMIT or DISTINCT: it is shown whatever they say); ``None`` if that fails. Released
    values only: nothing private is read."""
    try:
        select = exp.Select(expressions=[null_on_zero_divisors(e.copy()) for e in checked.post.expressions])
        select = select.from_("dp_core")  # a ratio over a noisy 0 is NULL here too, as in the rows
        _, rows = engine.post_processing.post_process(core_columns(plan), list(core_types), [core], select)
        return tuple(rows[0])
    except Exception:  # a post-processing error on NULL keys: the outputs are left out
        return None
