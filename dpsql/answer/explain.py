"""EXPLAIN: what a private query would run and cost, rendered from its plan. Reads no data."""

from __future__ import annotations

import math
from collections.abc import Sequence
from decimal import Context, Decimal
from fractions import Fraction

from dpsql.analysis.aggregates.registry import family_of
from dpsql.analysis.domains import reports_outside
from dpsql.analysis.plan import Measure, Plan
from dpsql.answer.notes import selection_text
from dpsql.sql.names import sql_name


class Explanation(str):
    """The text ``explain()`` returns; ``refused`` is the refusal the query would meet if it ran
    now — a ``BudgetExceeded``, or a ``TooInaccurate`` of its ``max_error`` — (``None`` when it
    would run), so a caller can act on it (the CLI exits 3 or 2).

    >>> text = Explanation("cost: epsilon 5", refused=None)
    >>> text.startswith("cost"), text.refused
    (True, None)
    """

    refused = None

    def __new__(cls, text: str, refused=None) -> "Explanation":
        explanation = super().__new__(cls, text)
        explanation.refused = refused
        return explanation


def plural(count: int, noun: str, nouns: str | None = None) -> str:
    """``count`` and the noun, singular for exactly one.

    >>> plural(1, "group"), plural(5, "group"), plural(1, "query", "queries")
    ('1 group', '5 groups', '1 query')
    """
    return f"{count} {noun if count == 1 else nouns or noun + 's'}"


BOUNDED_SQL = "bounded SQL ($salt is a secret per-database salt):"
"""The header of the section holding the core's bounded statement."""
SEPARATE_SQL = "bounded SQL of {name}, run on its own ({what}):"
"""The header of a separate measure's statement (a quantile's histogram, distinct values)."""
POST_SQL = "post-processing over the noisy core (free):"
SYNTHETIC_SQL = "SQL that runs (in a sandbox holding only your synthetic tables):"
"""The header of the section holding a query of synthetic tables (``dpsql.query.synthetic_answering``)."""
SQL_HEADERS = (BOUNDED_SQL, "bounded SQL of ", POST_SQL, "bias SQL:", SYNTHETIC_SQL)
"""Sections that hold SQL: ``summary`` leaves them out."""


def explain_plan(plan: Plan, bounded_sql: str, remaining_after, *, refused: bool = False,
                 separate: Sequence[str] = (), amplified=None, accuracy: Sequence[str] = ()) -> str:
    """A readable account of a plan: measures, sensitivities, noise, cost and the SQL that runs.

    ``remaining_after``: what the accountant says remains once this query is paid (a ``Spend``).
    ``refused``: the budget cannot pay for it, so no remainder is shown (it would be negative).
    ``separate``: the statements of ``plan.separate``'s measures, in order. The core statement
    is left out when it reads nothing (no keys, no summed measure: ``SELECT 1``), as for an
    ungrouped quantile, whose histogram statement is what runs. ``amplified``: (the charge, the
    sample's percentage) of a query run on a Poisson sample (``dpsql.analysis.sampling``): the
    plan's cost is then its cost on the sample. ``accuracy``: the lines stating each output's
    expected ± before the charge (``dpsql.query.prediction``), shown after the aggregates.
    """
    rule = plan.query.rule
    if plan.query.hidden_unit or rule.unit is None:  # a row-level table: no unit column to name
        unit = "each row is its own unit (PRIVACY UNIT ROW)"
    else:
        unit = sql_name(rule.unit)
    # Groups per unit bound nothing without GROUP BY: "10 groups per unit" misled (issue 23).
    groups = f" and {plural(rule.groups_per_unit, 'group')}" if plan.query.keys else ""
    unit += f", at most {plural(rule.max_rows_per_unit, 'row')}{groups} per unit"
    cost = f"cost: epsilon {_num(plan.epsilon)}, delta {_num(plan.delta)}; "
    if amplified is not None:
        charged, percent = amplified
        cost = (f"cost on the sample: epsilon {_num(plan.epsilon)}, delta {_num(plan.delta)}; charged, amplified by "
                f"TABLESAMPLE POISSON ({percent} PERCENT): epsilon {_num(charged.epsilon)}, "
                f"delta {_num(charged.delta)}; ")
    if refused:
        cost += "more than remains: it would be refused (see below)"
    else:
        cost += (f"remaining after: epsilon {_num(remaining_after.epsilon)}, "
                 f"delta {_num(remaining_after.delta)}")
    lines = [
        f"private table {plan.query.table}; privacy unit: {unit}",
        f"neighbours: {plan.neighbours} ({_neighbour_text(plan.neighbours)})",
        cost,
    ]
    lines += [f"join {text}" for text in plan.query.joins]
    lines += [
        "",
        "group keys:" if plan.query.keys else "no GROUP BY: exactly one row is released",
    ]
    for key in plan.query.keys:
        text = key.expression.sql(dialect="duckdb")
        if key.domain is None:
            lines.append(f"  {key.name} = {text}: private keys, released only if they pass partition selection")
        else:
            if key.domain.values is None:
                line = f"  {key.name} = {text}: every key of the public domain {key.domain.table}.{key.domain.column}"
                together = [k.name for k in plan.query.keys if k is not key and k.domain is not None
                            and k.domain.values is None and key.domain.joined is not None
                            and k.domain.joined == key.domain.joined]
                if together:
                    line += (f", combined with {', '.join(together)} as they occur together in the rows of the "
                             f"joined public table (not every pair)")
            elif key.domain.implied_by is not None:
                line = (f"  {key.name} = {text}: every one of the {len(key.domain.values)} values of its type "
                        f"{key.domain.implied_by} (schema, not data: no KEYS line or partition selection needed)")
            else:
                line = f"  {key.name} = {text}: every one of the {plural(len(key.domain.values), 'listed public key')}"
            if key.narrowed_by:
                line += " for which " + " AND ".join(c.sql(dialect="duckdb") for c in key.narrowed_by) + \
                    " holds (the query's WHERE, evaluated on the public domain when the query runs: free)"
            lines.append(line)
    if reports_outside(plan.query.keys) and plan.query.aggregates:
        lines.append("  rows whose keys are outside the released keys (or NULL) are released as one more cell, "
                     "res.outside_domain; it counts among each unit's groups, so the sensitivities below hold; "
                     "the answer shows it where it can be told from noise, or with OPTIONS (show_outside = true)")
    if plan.selection is not None:
        s = plan.selection
        lines.append(f"  partition selection: a key is released when its count of distinct units plus discrete "
                     f"Laplace noise (scale {_num(s.scale)}) reaches {s.threshold}; epsilon {_num(s.epsilon)}, "
                     f"delta {_num(s.delta)}")
        lines.append(f"  {selection_text(plan, ahead=True)}")
    lines += ["", "aggregates (epsilon split by weight, then equally between an aggregate's measures):"]
    for aggregate, original in zip(plan.aggregates, plan.query.aggregates):
        lines.append(f"  {aggregate.name} = {original.label}: {family_of(aggregate).explain(aggregate, _num)}; "
                     f"epsilon {_num(aggregate.epsilon)}")
    if accuracy:
        lines += ["", *accuracy]
    lines += ["", "measures:"]
    lines += [f"  {_measure_text(m)}" for m in plan.measures]
    if plan.query.keys or plan.summed or plan.selection is not None:
        lines += ["", BOUNDED_SQL, bounded_sql]
    for measure, sql in zip(plan.separate, separate):
        what = "the quantile's histogram" if measure.kind == "histogram" else "distinct values"
        lines += ["", SEPARATE_SQL.format(name=measure.name, what=what), sql]
    lines += ["", POST_SQL, plan.query.post.sql(dialect="duckdb")]
    return "\n".join(lines)


def summary(text: str) -> str:
    r"""``text`` (what ``explain()`` returns) without its SQL: the measures, sensitivities, noise,
    cost, limits and accounting, short enough to read in psql. The SQL sections are those whose
    header is in ``SQL_HEADERS``; pretty-printed SQL holds no blank line (outside a string
    literal), which ends a section. An ``Explanation``'s ``refused`` is kept.

    >>> print(summary("cost: epsilon 1\n\n" + BOUNDED_SQL + "\nSELECT\n  1\n\nlimits: none"))
    cost: epsilon 1
    <BLANKLINE>
    limits: none
    """
    kept = [part for part in text.split("\n\n") if not part.startswith(SQL_HEADERS)]
    return Explanation("\n\n".join(kept), refused=getattr(text, "refused", None))


def _neighbour_text(neighbours: str) -> str:
    return "add or remove one unit" if neighbours == "unbounded" else "replace one unit's data"


def unit_value(measure: Measure) -> Fraction:
    """What one integer step of ``measure`` is worth in the column's own units: 1 for counts,
    the grid for a sum, half of it for a centred sum (2v - (L + U) counts half-steps), its
    square over 4 for a sum of squared centred values (then in squared column units)."""
    if measure.kind in ("count", "units", "distinct", "histogram"):
        return Fraction(1)
    if measure.squared:
        return measure.grid * measure.grid / (4 if measure.centred else 1)
    return measure.grid / 2 if measure.centred else measure.grid


def _product_text(measure: Measure) -> str:
    """What a product measure sums, named by its factors' powers: a centred sum, a sum of squared
    centred values or a cross-product sum, over the rows where every factor is non-NULL."""
    used = [(f.argument.sql(dialect="duckdb"), f.power) for f in measure.factors if f.power]
    every = " and ".join(f.argument.sql(dialect="duckdb") for f in measure.factors)
    centred = "centred " if all(f.centred for f in measure.factors) else ""  # uncentred: the per-unit forms
    if len(used) > 1:
        what = f"cross-product sum of {centred}" + " × ".join(name + ("²" if p > 1 else "") for name, p in used)
    elif used:
        what = (f"sum of squared {centred}" if used[0][1] > 1 else f"{centred}sum of ") + used[0][0]
    else:
        what = "count"
    return f"{what} (rows where {every} are non-NULL)" if len(measure.factors) > 1 else what


def _measure_text(measure: Measure) -> str:
    """A measure in the column's units; the integer grid it is computed on is a separate fact."""
    what = {"count": "count", "units": "distinct units", "distinct": "distinct values",
            "histogram": "bucket counts"}.get(measure.kind) or (_product_text(measure) if measure.factors else
        ("sum of squared centred values" if measure.centred else "sum of squares") if measure.squared else
        "centred sum" if measure.centred else "sum")
    step = unit_value(measure)
    squared = " (squared units)" if measure.squared else ""
    if measure.kind in ("count", "units", "distinct"):
        bounds = "values in [0, 1]"
    elif measure.kind == "histogram":
        bounds = (f"values in [{_num(measure.offset)}, {_num(measure.offset + (measure.upper + 1) * measure.grid)}] "
                  f"in {measure.upper + 1} buckets of width {_num(measure.grid)}")
    else:
        bounds = f"row values in [{_num(measure.lower * measure.grid)}, {_num(measure.upper * measure.grid)}]"
    bounds += _contribution_model(measure, step)
    sensitivity = (f"L1 sensitivity {_num(measure.sensitivity.l1 * step)}{squared}, "
                   f"L2 sensitivity {_root(measure.sensitivity.l2_squared * step * step)}{squared}")
    if measure.noise == "exponential":
        noise = f"exponential mechanism, utility sensitivity {_num(measure.scale)}"
    elif measure.noise == "laplace":
        noise = f"discrete Laplace, scale {_num(measure.scale * step)}{squared}"
    elif measure.noise == "gaussian":
        noise = f"discrete Gaussian, sigma {_root(measure.scale * step * step)}{squared}"
    else:
        noise = "no noise (nothing can change it)"
    grid = ""
    if step != 1:  # the integers the engine sums and the samplers draw, as a labelled aside
        grid = (f" (computed on a grid of {_num(step)}: L1 sensitivity "
                f"{_num(measure.sensitivity.l1)} steps, noise scale {_num(measure.scale)} steps)")
    return (f"{measure.name}: {what}, {bounds}; {sensitivity}; epsilon {_num(measure.epsilon)}, "
            f"delta {_num(measure.delta)}; {noise}{grid}")


def _contribution_model(measure: Measure, step: Fraction) -> str:
    """Which contribution model bounds what one unit adds to the measure (``Measure.unit_bounds``),
    with its bound, and that the per-unit clamp can bias; nothing for measures that are not sums."""
    if measure.kind not in ("count", "sum"):
        return ""
    if measure.unit_bounds is None:
        return "; rows model (MAX ROWS PER UNIT rows per unit, each within the row bounds)"
    low, high = (_num(bound * step) for bound in measure.unit_bounds)
    if measure.kind == "count":
        return "; per-unit model: each unit counted at most once per group"
    if measure.unit_average:
        return (f"; per-unit model: each unit's own average in a group clamped to [{low}, {high}] "
                "(the clamp can bias the answer)")
    return (f"; per-unit model: each unit's total in a group clamped to [{low}, {high}] "
            "(lower noise than the rows model; the clamp can bias the answer)")


def _num(value: Fraction) -> str:
    value = Fraction(value)
    return str(value.numerator) if value.denominator == 1 else _six_digits(_decimal(value))


def _root(value: Fraction) -> str:
    """The square root of a non-negative Fraction to 6 digits, beyond a float's range too.

    >>> _root(Fraction(25, 4)), _root(Fraction(10) ** 700)
    ('2.5', '1e+350')
    """
    return _six_digits(_decimal(Fraction(value)).sqrt(Context(prec=12)))


def _six_digits(value: Decimal) -> str:
    """6 significant digits, as a float prints them when it can hold the value."""
    as_float = float(value)
    if math.isfinite(as_float) and (value == 0 or abs(as_float) > 1e-300):
        return f"{as_float:.6g}"
    return f"{Context(prec=6).plus(value).normalize():g}"


def _decimal(value: Fraction) -> Decimal:
    """``value`` as a 12-digit Decimal, which (unlike a float) cannot overflow."""
    return Context(prec=12, Emax=10**9, Emin=-10**9).divide(Decimal(value.numerator), Decimal(value.denominator))


def explain_sampling(sampling, plan: Plan, base, charged, accounting: str, bias_left_out: bool = False,
                     scaled: Sequence[str] | None = None) -> str:
    """The sampling paragraph of a query on a Poisson sample (``dpsql.analysis.sampling``): the
    rate, how units are drawn, the base cost and the amplified charge, and what the answer is about
    (``scaled``: the columns the ``scale_sample`` option scales to the table, ``dpsql.query.scaling``)."""
    rows = plural(plan.query.rule.max_rows_per_unit, "row")
    lines = [
        f"sampling: TABLESAMPLE POISSON ({sampling.percent} PERCENT) of {sampling.table}: each unit is kept "
        f"with all its (at most {rows}), independently with probability {_num(sampling.rate)}, by a keyed SHA-256 "
        "of the unit under a secret key drawn for this query ($dp_sample_key)",
        f"  on the sample the mechanism above costs epsilon {_num(base.epsilon)}, delta {_num(base.delta)}",
        f"  charged: epsilon {_num(charged.epsilon)} = ln(1 + p(e^epsilon - 1)), delta {_num(charged.delta)} = p·delta "
        "(amplification by Poisson subsampling: Li, Qardaji, Su 2012; Balle, Barthe, Gaboardi 2018)",
    ]
    if accounting == "zcdp" and base.delta > 0:
        lines.append("  ACCOUNTING ZCDP: Gaussian noise keeps its rho on a sample (a subsampled Gaussian is no "
                     "more than rho-zCDP, and not less for every order); only Laplace queries cost less")
    if bias_left_out:
        lines.append("  the policy's REPORT BIAS SHARE is left out: a bias report reads each unit's rows outside "
                     "the sample (the aggregates get the whole epsilon)")
    if scaled is None:
        lines.append("  the answer is about the sample (each count and sum covers about "
                     f"{sampling.percent}% of the units), not scaled to the whole table")
    else:
        lines.append(f"  scale_sample: {', '.join(scaled) or 'no column'} divided by p for the whole table, the ± "
                     "widened by the sampling error (approximate: a normal approximation); other columns as released")
    return "\n".join(lines)
