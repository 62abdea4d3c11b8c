"""``db.synthesize(table, columns, epsilon=, delta=, method="aim" | "mst", rows=None, name=None)``: a
synthetic table, charged once, from noisy marginals of the table's bounded copy (the math:
``dpsql.mechanisms.synthesis``, ``aim``, ``mst``, ``marginals``; the model: ``graphical``).

Everything up to the charge is static and reads no private data:

* each column becomes cells from the policy alone: a KEYS column one cell per key (read from its
  public domain), plus a NULL cell when the policy reports values outside the domain; a numeric
  column with BOUNDS its bins (``numeric_bins``: one per value when there are at most
  ``NUMERIC_BINS``, else ``NUMERIC_BINS`` or fewer equal widths on the bounds' grid) plus a NULL
  cell; a column with neither is refused, with the fix;
* the marginals the method may measure (MST: every column and every pair; AIM: every marginal of at
  most 3 columns), each at most ``MAX_MARGINAL_CELLS`` cells, and all together at most
  ``MAX_FETCHED_CELLS`` (the exact counts the one statement returns), and the model at most
  ``MAX_MODEL_CELLS``: refused beyond, before the charge;
* ONE statement, prepared by the ordinary pipeline (``SELECT keys, SUM(numeric), COUNT(*) FROM t
  GROUP BY keys``) so its rows are the bounded copy's, at most k = MAX ROWS PER UNIT per unit, with
  the keys in their domains and the numbers clamped into their bounds: it counts the rows of every
  candidate marginal and the total at once (``GROUPING SETS``);
* the cost: (ε, δ) with δ > 0, as zCDP ρ = ``rho_budget(ε, δ)``, all of it spent (the count, the
  measurements and the choices add up to ρ exactly).

The executor then charges the ledger, runs the statement and the synthesizer releases. The answer
is a ``SyntheticRelease`` (``dpsql.mechanisms.synthetic_release``): the rows, what was measured at
which ρ, the bins. It is not kept for a free repeat (the same call is charged again).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from fractions import Fraction
from typing import Any

import numpy as np
import pandas as pd
import sqlglot
from sqlglot import exp

from dpsql.analysis.domains import reports_outside
from dpsql.backends.render import DUCKDB
from dpsql.backends.rewrite import BoundedStatement, domain_sql, rows_statement
from dpsql.budget.accounting import Spend, check_accountable, rho_budget
from dpsql.errors import InvalidParameter, UnsupportedQuery
from dpsql.mechanisms import graphical, noise
from dpsql.mechanisms.aim import candidates
from dpsql.mechanisms.mst import allowed_pairs
from dpsql.mechanisms.synthesis import MAX_ROWS as SYNTHETIC_ROWS
from dpsql.mechanisms.synthesis import synthesize
from dpsql.mechanisms.synthetic_release import Measured, SyntheticRelease
from dpsql.policy.model import PrivateTable
from dpsql.query.context import MechanismContext
from dpsql.query.options import privacy_options
from dpsql.query.spend import Price
from dpsql.sql.names import table_key

METHODS = ("aim", "mst")
MAX_COLUMNS = 16
"""The most columns one synthetic table may have."""
NUMERIC_BINS = 32
"""The most bins a numeric column is cut into (its NULL cell besides)."""
MAX_MARGINAL_CELLS = 2 ** 16
"""The largest marginal the methods may measure (larger ones are left out of the candidates)."""
MAX_FETCHED_CELLS = 2 ** 22
"""The most exact counts the statement may return (the candidates' cells added up)."""
MAX_MODEL_CELLS = 2 ** 23
"""The largest graphical model (junction-tree cells, 8 bytes each: 64 MB)."""
MAX_ROWS = SYNTHETIC_ROWS
"""The most synthetic rows one may ask for (a noisy count is cut to it too)."""
FAILED = "synthesize failed while running; its cost was charged and nothing was released"
NULL_LABEL = "NULL"
_SHAPE = "db.synthesize('t', ['a', 'b'], epsilon=1, delta=1e-6, method='aim')"


@dataclass(frozen=True)
class SynthColumn:
    """One column of the synthetic table and its cells (all from the policy)."""

    name: str
    """Its name in the synthetic table (as the table has it)."""
    source: str
    """The statement's column holding its cell: a key ``g<i>`` or a bin ``b<i>``."""
    labels: tuple[str, ...]
    """Each cell's label; the NULL cell, where there is one, last."""
    keys: tuple = ()
    """A KEYS column: its domain's values, in cell order."""
    lower: int = 0
    """A numeric column: its lower bound, in grid steps."""
    upper: int = 0
    width: int = 1
    """A numeric column: each bin's width, in grid steps."""
    grid: Fraction = Fraction(1)
    integral: bool = True
    """A numeric column whose values are whole numbers (grid 1, an integer type)."""
    null_cell: bool = True

    @property
    def numeric(self) -> bool:
        return self.source.startswith("b")

    @property
    def size(self) -> int:
        return len(self.labels)


@dataclass(frozen=True)
class SynthesisPlan:
    """A synthesize call, planned before the charge."""

    table: str
    columns: tuple[SynthColumn, ...]
    method: str
    epsilon: Fraction
    delta: Fraction
    rho: Fraction
    reach: int
    """k: the most rows one unit has in the bounded copy."""
    neighbours: str
    statement: BoundedStatement
    keys: tuple
    """The statement's group keys (``GroupKey``), read back as the pipeline reads keys."""
    cliques: tuple[tuple[str, ...], ...]
    """Every marginal the statement counts (the empty one: the total)."""
    pairs: tuple[tuple[str, ...], ...]
    weights: dict[tuple[str, ...], int]
    rows: int | None
    name: str
    analyst: str | None

    @property
    def sizes(self) -> dict[str, int]:
        return {c.name: c.size for c in self.columns}

    @property
    def cost(self) -> Spend:
        return Spend(self.epsilon, self.delta, self.rho)

    def price(self) -> Price:
        """Charged once, up front: its one statement. Not kept for repeats."""
        names = ", ".join(c.name for c in self.columns)
        return Price(self.cost, f"SYNTHESIZE {self.method.upper()} {self.table} ({names}) AS {self.name}",
                     {"mechanism": "synthesize", "method": self.method, "epsilon": self.epsilon,
                      "delta": self.delta, "rho": self.rho, "name": self.name, "rows": self.rows,
                      "neighbours": self.neighbours},
                     statements=1, what=f"synthesize {self.table}", failure=FAILED)


def plan_synthesis(context: MechanismContext, table: Any, columns: Any, epsilon: Any, delta: Any, method: Any,
                   rows: Any, name: Any, check_name: Callable[[str], None] | None = None) -> SynthesisPlan:
    """The static half of ``Connection.synthesize`` (module docstring): refuses before the charge.
    ``check_name``: the store's refusal of a name its owner cannot use (``SyntheticTables.check_name``)."""
    method = _method(method)
    rows = _rows(rows)
    graphical.require_mbi()
    options = privacy_options(context.policy, epsilon, delta, "gaussian")
    if options.delta == 0:
        raise InvalidParameter("synthesize measures marginals with Gaussian noise, which needs delta > 0",
                               hint=f"pass delta, e.g. {_SHAPE}")
    rule, names = _table_columns(context, table, columns)
    label = _name(name, rule.name)
    if check_name is not None:
        check_name(label)
    keyed = [n for n in names if rule.column(n) is not None and rule.column(n).keys is not None]  # type: ignore
    numeric = [n for n in names if n not in keyed]
    sums = [f"SUM({_quoted(n)})" for n in numeric]
    select = ", ".join([*(_quoted(n) for n in keyed), *sums, "COUNT(*)"])
    grouped = f" GROUP BY {', '.join(_quoted(n) for n in keyed)}" if keyed else ""
    prepared = context.prepare(f"SELECT {select} FROM {_quoted(rule.name)}{grouped}", options.epsilon, 0, "laplace")
    plan = prepared.plan
    if plan is None or plan.selection is not None or any(key.domain is None for key in plan.query.keys):
        raise UnsupportedQuery("synthesize needs public KEYS domains for its categorical columns",
                               hint="declare KEYS for each categorical column in the policy")
    built: dict[str, SynthColumn] = {}
    outside = reports_outside(plan.query.keys)
    for position, (column, key) in enumerate(zip(keyed, plan.query.keys)):
        built[column] = _keys_column(context, column, key, outside, position)
    types = context.catalog[table_key(rule.name)]
    for position, (column, measure) in enumerate(zip(numeric, plan.measures)):
        built[column] = _numeric_column(column, measure, types.get(column.lower(), ""), position)
    ordered = tuple(built[n] for n in names)
    sizes = {c.name: c.size for c in ordered}
    cliques, pairs, weights = _candidates(method, names, sizes)
    statement = _statement(plan, ordered, cliques, context.dialect)
    cost = Spend(options.epsilon, options.delta, rho_budget(options.epsilon, options.delta))
    if not cost.rho:  # no noise could be calibrated: refused here, not failed after the charge
        raise InvalidParameter(f"epsilon {float(options.epsilon):g} with delta {float(options.delta):g} buys no "
                               "zCDP rho to measure marginals with", hint="raise epsilon (or delta)")
    check_accountable(context.policy.accounting, cost)
    return SynthesisPlan(rule.name, ordered, method, options.epsilon, options.delta, cost.rho or Fraction(0),
                         rule.max_rows_per_unit, plan.neighbours, statement, tuple(plan.query.keys), cliques,
                         tuple(pairs), weights, rows, label, context.analyst)


def answer_synthesis(context: MechanismContext, table: Any, columns: Any, epsilon: Any, delta: Any, method: Any,
                     rows: Any, name: Any, check_name: Callable[[str], None] | None = None) -> SyntheticRelease:
    """``Connection.synthesize``: plan, charge once, fetch, synthesize, release."""
    planned = plan_synthesis(context, table, columns, epsilon, delta, method, rows, name, check_name)

    def release(fetched: list[list[tuple]]) -> SyntheticRelease:
        counts = exact_marginals(planned, context.read_keys(fetched[0], list(planned.keys)))
        return synthesize_release(planned, counts, context.source)

    spent = context.spender.spend_statements(planned.price(), [planned.statement], release)
    return spent.released


def synthesize_release(planned: SynthesisPlan, counts: dict[tuple[str, ...], np.ndarray], source) -> SyntheticRelease:
    """After the charge: the synthesizer over the exact counts, then the release."""
    names = [c.name for c in planned.columns]
    made = synthesize(planned.method, names, planned.sizes, planned.rho, planned.reach, planned.neighbours,
                      counts.__getitem__, MAX_MODEL_CELLS, planned.pairs, planned.weights, planned.rows, source)
    frame = pd.DataFrame({c.name: _values(c, made.cells[c.name], source) for c in planned.columns})
    measured = tuple(Measured(m.clique, float(m.rho), m.sigma) for m in made.measurements)
    selections = tuple(float(m.selection_rho) for m in made.measurements)
    return SyntheticRelease(planned.name, planned.table, planned.method, frame, made.rows, float(planned.epsilon),
                            float(planned.delta), float(planned.rho), _with_selections(measured, selections),
                            {c.name: c.labels for c in planned.columns}, planned.analyst,
                            datetime.now(timezone.utc).isoformat(timespec="seconds"), made.error_estimates)


def _with_selections(measured: tuple[Measured, ...], selections: tuple[float, ...]) -> tuple[Measured, ...]:
    return tuple(Measured(m.columns, m.rho, m.sigma, s) for m, s in zip(measured, selections))


def exact_marginals(planned: SynthesisPlan, rows: list[tuple]) -> dict[tuple[str, ...], np.ndarray]:
    """The statement's rows as each marginal's exact counts (row-major cells). Total: a value that
    is in no cell (it cannot be: the statement keeps keys in their domains) is not counted."""
    columns = planned.columns
    sizes = [c.size for c in columns]
    width = len(columns)
    counts = {clique: np.zeros(math.prod(planned.sizes[c] for c in clique), dtype=np.int64)
              for clique in planned.cliques}
    lookups = [{value: i for i, value in enumerate(c.keys)} for c in columns]
    by_flags = {tuple(0 if c.name in clique else 1 for c in columns): clique for clique in planned.cliques}
    for row in rows:
        cells, flags, count = _reordered(row, columns, width)
        clique = by_flags.get(flags)
        if clique is None:
            continue
        index = 0
        for position, column in enumerate(columns):
            if flags[position]:
                continue
            cell = _cell(column, lookups[position], cells[position])
            if cell is None:
                index = -1
                break
            index = index * sizes[position] + cell
        if index >= 0:
            counts[clique][index] += int(count)
    return counts


def _reordered(row: tuple, columns: Sequence[SynthColumn], width: int) -> tuple[list, tuple, int]:
    """(each column's raw cell value, each column's GROUPING flag, count), in the columns' order:
    the statement returns the keys first, then the bins, then the flags in that same order."""
    keyed = [c for c in columns if not c.numeric]
    numeric = [c for c in columns if c.numeric]
    raw = dict(zip([c.name for c in keyed + numeric], row[:width]))
    flags = dict(zip([c.name for c in keyed + numeric], row[width:2 * width]))
    return [raw[c.name] for c in columns], tuple(int(flags[c.name]) for c in columns), int(row[-1])


def _cell(column: SynthColumn, lookup: dict, value: Any) -> int | None:
    if value is None:
        return column.size - 1 if column.null_cell else None
    if column.numeric:
        cell = int(value)
        return cell if 0 <= cell < column.size - 1 else None
    return lookup.get(value, column.size - 1 if column.null_cell else None)


# -- columns, before the charge ---------------------------------------------------------------------

def _quoted(name: str) -> str:
    """A catalog name as a quoted identifier (the names are the database's, never the analyst's text)."""
    return exp.to_identifier(name, quoted=True).sql(dialect=DUCKDB)


def _method(method: Any) -> str:
    if not isinstance(method, str) or method.lower() not in METHODS:
        raise InvalidParameter(f"method must be 'aim' or 'mst', got {method!r}",
                               hint="pass method='aim' (adaptive, the default) or method='mst'")
    return method.lower()


def _rows(rows: Any) -> int | None:
    if rows is None:
        return None
    if isinstance(rows, bool) or not isinstance(rows, int) or not 1 <= rows <= MAX_ROWS:
        raise InvalidParameter(f"rows must be a whole number from 1 to {MAX_ROWS:,}, got {rows!r}",
                               hint="leave rows out for a noisy count of the table's rows")
    return rows


def _name(name: Any, table: str) -> str:
    if name is None:
        return f"{table}_synthetic"
    if not isinstance(name, str) or not name.isidentifier():
        raise InvalidParameter(f"name must be a plain identifier (letters, digits, _), got {name!r}",
                               hint=f"pass name='{table}_synthetic'")
    return name


def _table_columns(context: MechanismContext, table: Any, columns: Any) -> tuple[PrivateTable, list[str]]:
    if isinstance(columns, str):
        columns = [c.strip() for c in columns.split(",")]
    if not isinstance(table, str) or not isinstance(columns, (list, tuple)) or not columns \
            or not all(isinstance(c, str) and c for c in columns):
        raise InvalidParameter("synthesize needs a private table's name and a list of its columns",
                               hint=f"write {_SHAPE}")
    rule = context.policy.table(table)
    if not isinstance(rule, PrivateTable):
        raise UnsupportedQuery(f"{table} is not a private table of the policy",
                               hint="synthesize a private table (a public one needs no privacy)")
    types = context.catalog.get(table_key(rule.name), {})
    names: list[str] = []
    for column in columns:
        found = next((c for c in types if c.lower() == column.lower()), None)
        if found is None:
            raise UnsupportedQuery(f"{rule.name} has no column {column}",
                                   hint=f"use its columns: {', '.join(sorted(types))}")
        if found in names:
            raise InvalidParameter(f"column {column} is given twice", hint="name each column once")
        policy_rule = rule.column(found)
        if policy_rule is None or (policy_rule.keys is None and policy_rule.bounds is None):
            raise UnsupportedQuery(f"column {column} of {rule.name} has neither KEYS nor BOUNDS in the policy: "
                                   "its cells cannot be chosen without looking at the data",
                                   hint=f"declare `{column} KEYS (...)` (categories) or `{column} BOUNDS lo TO hi` "
                                        "(numbers, binned) in the policy, or leave the column out")
        names.append(found)
    if len(names) > MAX_COLUMNS:
        raise UnsupportedQuery(f"synthesize takes at most {MAX_COLUMNS} columns, got {len(names)}",
                               hint="synthesize fewer columns, or several tables of fewer columns")
    return rule, names


def _keys_column(context: MechanismContext, name: str, key: Any, outside: bool, position: int) -> SynthColumn:
    sql = domain_sql([key], [key.type_name or ""], dialect=context.dialect)
    values = tuple(row[0] for row in context.read_keys(context.fetch_public(sql), [key]))
    labels = tuple(str(v) for v in values) + ((NULL_LABEL,) if outside else ())
    return SynthColumn(name, key.name, labels, keys=values, null_cell=outside)


def numeric_bins(lower: int, upper: int) -> tuple[int, int]:
    """(width, bins) of a numeric column's cells on its grid, from its bounds alone: one per value up
    to ``NUMERIC_BINS`` values, else equal widths, at most ``NUMERIC_BINS`` of them.

    >>> numeric_bins(0, 9), numeric_bins(0, 100), numeric_bins(18, 90)
    ((1, 10), (4, 26), (3, 25))
    """
    values = upper - lower + 1
    width = 1 if values <= NUMERIC_BINS else -(-values // NUMERIC_BINS)
    return width, -(-values // width)


def _numeric_column(name: str, measure: Any, type_name: str, position: int) -> SynthColumn:
    if measure.kind != "sum" or measure.factors:
        raise UnsupportedQuery(f"column {name} cannot be binned by its BOUNDS",
                               hint=f"declare `{name} KEYS (...)` instead, or leave it out")
    lower, upper, grid = int(measure.lower), int(measure.upper), Fraction(measure.grid)
    if upper - lower >= 2 ** 62:
        raise UnsupportedQuery(f"column {name}'s BOUNDS span too many steps of its grid to bin",
                               hint=f"narrow {name}'s BOUNDS in the policy")
    width, bins = numeric_bins(lower, upper)
    integral = grid == 1 and any(t in type_name.upper() for t in ("INT", "HUGEINT"))
    labels = []
    for i in range(bins):
        low, high = lower + i * width, min(lower + (i + 1) * width - 1, upper)
        labels.append(_shown(low * grid) if low == high else
                      f"[{_shown(low * grid)}, {_shown(high * grid) if integral else _shown((high + 1) * grid)}"
                      f"{']' if integral else ')'}")
    return SynthColumn(name, f"b{position}", (*labels, NULL_LABEL), lower=lower, upper=upper, width=width, grid=grid,
                       integral=integral)


def _shown(value: Fraction) -> str:
    return str(value.numerator) if value.denominator == 1 else format(float(value), "g")


def _candidates(method: str, names: list[str], sizes: dict[str, int]) -> tuple[tuple, list, dict]:
    """The marginals the statement counts, MST's pairs and AIM's weights; refuses, before the charge,
    what would not fit in memory."""
    big = [n for n in names if sizes[n] > MAX_MARGINAL_CELLS]
    if big:
        raise UnsupportedQuery(f"column {big[0]} has {sizes[big[0]]:,} cells, more than the {MAX_MARGINAL_CELLS:,} "
                               "a marginal may have", hint="declare fewer KEYS, or leave the column out")
    if method == "mst":
        pairs = allowed_pairs(names, sizes, MAX_MARGINAL_CELLS)
        weights: dict[tuple[str, ...], int] = {}
        cliques = [(n,) for n in names] + [tuple(p) for p in pairs]
        largest = sorted((sizes[a] * sizes[b] for a, b in pairs), reverse=True)[:max(len(names) - 1, 0)]
        model = sum(largest) + sum(sizes.values())
    else:
        pairs = []
        weights = candidates(names, sizes, MAX_MARGINAL_CELLS)
        cliques = list(weights)
        model = sum(sizes.values())
    fetched = 1 + sum(math.prod(sizes[c] for c in clique) for clique in cliques)
    if fetched > MAX_FETCHED_CELLS or model > MAX_MODEL_CELLS:
        raise UnsupportedQuery(f"synthesizing these columns counts {fetched:,} cells of marginals (limit "
                               f"{MAX_FETCHED_CELLS:,}) for a model of up to {model:,} cells (limit "
                               f"{MAX_MODEL_CELLS:,})", hint="synthesize fewer columns, or declare fewer KEYS or "
                                                             "narrower BOUNDS")
    return ((), *cliques), pairs, weights


def _statement(plan: Any, columns: tuple[SynthColumn, ...], cliques: tuple, dialect: str) -> BoundedStatement:
    """Counts of the bounded rows per cell of every marginal in ``cliques`` (``GROUPING SETS``):
    columns keys ``g..`` then bins ``b..``, one GROUPING flag for each in that order, then the count."""
    keyed = [c for c in columns if not c.numeric]
    numeric = [c for c in columns if c.numeric]
    measures = {c.source: m for c, m in zip(numeric, plan.measures)}
    bins = [f"(v_{measures[c.source].name} - {c.lower}) // {c.width} AS {c.source}" for c in numeric]
    cells = ", ".join([*(c.source for c in keyed), *bins]) or "1 AS dp_none"
    ordered = [c.source for c in keyed + numeric]
    by_name = {c.name: c.source for c in columns}
    sets = ", ".join("(" + ", ".join(by_name[n] for n in clique) + ")" for clique in cliques)
    flags = [f"GROUPING({s}) AS s_{s}" for s in ordered]
    final = ", ".join([*ordered, *flags, "COUNT(*) AS dp_n"])
    layer = _select(f"SELECT {cells} FROM dp_values")
    return rows_statement(plan, _select(f"SELECT {final} FROM dp_synth_cells GROUP BY GROUPING SETS ({sets})"),
                          [("dp_synth_cells", layer)], dialect)


def _select(text: str) -> exp.Select:
    tree = sqlglot.parse_one(text, read=DUCKDB)
    assert isinstance(tree, exp.Select)
    return tree


# -- the synthetic values, after the release (post-processing) --------------------------------------

def _values(column: SynthColumn, cells: np.ndarray, source) -> list | np.ndarray:
    """Each synthetic row's value from its cell: a key, or a number drawn uniformly on the grid
    within its bin (a whole number for an integer column); NULL for the NULL cell."""
    null = cells == column.size - 1 if column.null_cell else np.zeros(cells.size, dtype=bool)
    if not column.numeric:
        values = [None if n else column.keys[int(c)] for c, n in zip(cells, null)]
        whole = all(isinstance(k, int) and not isinstance(k, bool) for k in column.keys)
        return pd.array(values, dtype="Int64") if whole and column.keys else pd.array(values, dtype=object)
    low = column.lower + cells * column.width
    span = np.minimum(low + column.width - 1, column.upper) - low + 1
    steps = low + np.minimum((noise.uniforms(cells.size, source) * span).astype(np.int64), span - 1)
    if column.integral:
        return pd.array([None if n else int(v) for v, n in zip(steps, null)], dtype="Int64")
    values = steps.astype(np.float64) * float(column.grid)
    return np.where(null, np.nan, values)

