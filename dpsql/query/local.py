"""Counting over a column collected with randomized response (``col LOCAL RR EPSILON e DOMAIN (...)``).

A column declared ``LOCAL RR`` holds k-ary randomized-response reports (``dpsql.mechanisms.randomized_response``): each
row's value was drawn at collection, at the declared epsilon, from the true value. A COUNT(*)
(or COUNT of that column) whose GROUP BY and WHERE read that column alone — ``GROUP BY rr``,
``WHERE rr = 'a'``, ``WHERE rr IN (...)``, ANDed, and ANDed with conditions on other columns —
over one private table is answered by the unbiased estimator ĉ_S = (c_S − n·|S|·q) / (p − q) of
the true count, from the counts c_v of reports per domain value; ``accuracy()`` is its
normal-approximation interval from the estimator's standard error. The query's HAVING, ORDER
BY, LIMIT and select-list arithmetic then run on the estimates (post-processing).
``route_local`` decides, from the query's text, the schema and the policy alone (nothing
private), which of two paths such a query takes:

**Free** (post-processing of the reports, nothing charged): only when the policy's neighbours
are BOUNDED and the table is ``PRIVACY UNIT ROW``, and the WHERE reads the RR column alone.
Then the released counts are a function of the multiset of reports only: under bounded
neighbours the number of rows n is public (a neighbour replaces one row, never adds one), and
replacing one row changes one report, whose law moves by a factor of at most e^ε at every
outcome (``dpsql.mechanisms.randomized_response``). So the counts are ε-DP for the unit — paid once, at collection,
whatever the number of queries: repeats are identical because the reports are fixed. The
guarantee assumes every row holds a report from the DOMAIN: a NULL or another value was never
randomized, and under bounded neighbours its presence would show in n; ``check_reports`` makes
the connection refuse such data (the curator's error at connect, never the analyst's).

Why only ``PRIVACY UNIT ROW`` and not, as one might think, every table at rows-per-unit × ε:
(1) with a unit column, how many rows a unit has is private even under bounded neighbours
(DP-NOTES: a replaced unit may bring a different number of rows), so the counts' total would
reveal it; (2) MAX ROWS PER UNIT truncates, it promises nothing of the raw table, and the rows
a unit keeps are chosen by a salted hash of their content, reports included: a unit with 100
raw rows of true value a keeps the row whose report hashes lowest, and that choice can make
the kept report a function of all 100 reports (a guarantee of 100·ε, not 1·ε). Under
unbounded neighbours n is private (adding a row adds a report), so counting reports is not free.

**Central** (charged as any query): every other case — unbounded neighbours, a unit column, or
a WHERE that reads other columns too (``WHERE age > 30 GROUP BY rr``). The query is answered
from ``SELECT rr, COUNT(*) FROM t [WHERE <the other conditions>] GROUP BY rr``, run as an
ordinary query (planned, charged, bounded, noised, recorded and repeated by ``Connection.sql``)
with the RR column's DOMAIN as its public key domain; the noisy counts c̃_v are then de-biased
with n̂ = Σ_v c̃_v — post-processing of a charged release, so the cost is that query's. Its
variance adds the noise's, ((1 − sq)²·s + (sq)²·(k − s))·σ²/(p − q)², to randomized response's.

Any other query that reads an RR column (other aggregates grouped by it, a join, an expression
of it) is an ordinary central query over its DOMAIN, answered with a note that its groups and
filters are the randomized reports, not the true values.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction
from statistics import NormalDist
from typing import Any

from sqlglot import exp

from dpsql.analysis.plan import Measure, PrivateQuery, PublicQuery
from dpsql.mechanisms.noise import discrete_gaussian_variance, discrete_laplace_variance
from dpsql.mechanisms.randomized_response import debiased_count, debiased_variance, noise_variance_after_debiasing
from dpsql.policy.model import ColumnRule, Policy, PrivateTable
from dpsql.sql.names import sql_name, table_key
from dpsql.sql.numbers import finite_decimal
from dpsql.sql.parse import DIALECT


@dataclass(frozen=True)
class LocalCount:
    """A COUNT over one LOCAL RR column, answered by the de-biased estimator."""

    table: PrivateTable
    """The private table."""
    rule: ColumnRule
    """The RR column's rule (``rule.local`` is set)."""
    grouped: bool
    """GROUP BY the RR column: one row per chosen domain value; else one row for the set."""
    chosen: tuple
    """The domain values the WHERE keeps, in DOMAIN order (all of them without one)."""
    counts: tuple[str, ...]
    """The core names (a0, ...) of the query's COUNTs, each the same de-biased count."""
    post: exp.Select
    """The query's post-processing over its core (``PrivateQuery.post``): run on the de-biased
    counts (HAVING, ORDER BY, LIMIT, arithmetic: free, as over any released value)."""
    outputs: tuple[str, ...]
    """Released column names, in select-list order."""
    direct: tuple[tuple[str, str], ...]
    """(output name, core name) of outputs that are one COUNT: their ± is the estimator's."""
    free: bool
    """True: from the exact counts of reports, nothing charged (module docstring)."""
    why: str
    """Why this path, for explain() and the answer's notes."""
    counting_sql: str
    """``SELECT rr, COUNT(*) AS reports FROM t [WHERE others] GROUP BY rr``: the counts of reports
    per domain value, exact (free) or charged and noisy (central)."""

    @property
    def k(self) -> int:
        """The number of values a report can take."""
        assert self.rule.local is not None
        return len(self.rule.local.domain)

    @property
    def epsilon(self) -> Fraction:
        """The epsilon each report was drawn at."""
        assert self.rule.local is not None
        return self.rule.local.epsilon

    @property
    def column(self) -> str:
        """``table.column`` as SQL names."""
        return f"{sql_name(self.table.name)}.{sql_name(self.rule.name)}"


def _local_columns(table: PrivateTable) -> dict[str, ColumnRule]:
    return {rule.name.lower(): rule for rule in table.columns if rule.local is not None}


def reads_local(tree: exp.Expression, checked: PrivateQuery | PublicQuery, policy: Policy) -> list[str]:
    """``table.column`` of each LOCAL RR column the query may read (by name; nothing private)."""
    if not isinstance(checked, PrivateQuery):
        return []
    names = {column.name.lower() for column in tree.find_all(exp.Column)}
    found = []
    for table in policy.private_tables:
        if table_key(table.name) in checked.bounded:
            found += [f"{sql_name(table.name)}.{sql_name(rule.name)}"
                      for name, rule in _local_columns(table).items() if name in names]
    return found


def reports_note(columns: list[str]) -> str:
    """The note an ordinary query reading RR columns carries."""
    listed = ", ".join(columns)
    return (f"{listed} {'holds' if len(columns) == 1 else 'hold'} randomized-response reports (LOCAL RR): "
            "groups and filters on it are the reports, not the true values; only COUNT(*) grouped or "
            "filtered by such a column alone is de-biased")


def route_local(tree: exp.Expression, checked: PrivateQuery | PublicQuery, policy: Policy,
                written: dict) -> LocalCount | None:
    """The de-biased COUNT this query is (module docstring), or ``None`` when it is not one."""
    if not isinstance(checked, PrivateQuery) or checked.joins or len(checked.bounded) != 1:
        return None
    table = next((t for t in policy.private_tables if table_key(t.name) == checked.bounded[0]), None)
    if table is None or checked.table != checked.bounded[0] or not isinstance(tree, exp.Select):
        return None
    local = _local_columns(table)
    if not local or any(tree.args.get(part) for part in ("with", "joins", "qualify")):
        return None
    if set(written) - {"epsilon", "delta", "noise", "intervals"}:
        return None  # contribution options (and the rest) change the counting query: answered as written
    conjuncts = list(_conjuncts(tree.args["where"].this)) if tree.args.get("where") else []
    read = [name for name in local if any(c.name.lower() == name for c in tree.find_all(exp.Column))]
    if len(read) != 1:
        return None
    rule = local[read[0]]
    assert rule.local is not None
    chosen, residual = _split_where(conjuncts, rule)
    if chosen is None:
        return None
    grouped = _grouped(checked, rule)
    counts = _counts(checked, rule)
    if grouped is None or counts is None:
        return None
    sampled = any(True for _ in tree.find_all(exp.TableSample))  # a secret sample: drawn for a charge only
    free = policy.neighbours == "bounded" and table.row_level and not residual and not sampled
    why = _why(policy, table, bool(residual), sampled)
    column = exp.column(rule.name, quoted=True)
    counting = exp.select(column, exp.alias_(exp.Count(this=exp.Star()), "reports")).from_(
        tree.args["from_"].this.copy())
    if residual:
        counting = counting.where(exp.and_(*[c.copy() for c in residual]))
    counting = counting.group_by(column.copy())
    return LocalCount(table, rule, grouped, chosen, counts, checked.post, checked.outputs, checked.direct, free,
                      why, counting.sql(dialect=DIALECT))


def _conjuncts(node: Any):
    node = node.unnest() if isinstance(node, exp.Paren) else node
    if isinstance(node, exp.And):
        yield from _conjuncts(node.this)
        yield from _conjuncts(node.expression)
    else:
        yield node


def _split_where(conjuncts: list[exp.Expression], rule: ColumnRule) -> tuple[tuple | None, list[exp.Expression]]:
    """(the domain values the RR conditions keep, the other conditions); ``(None, [])`` when a
    condition reads the RR column in any other form, or with other columns."""
    assert rule.local is not None
    domain = rule.local.domain
    keep = set(range(len(domain)))
    residual = []
    name = rule.name.lower()
    for conjunct in conjuncts:
        columns = list(conjunct.find_all(exp.Column))
        if not any(c.name.lower() == name for c in columns):
            residual.append(conjunct)
            continue
        values = _listed(conjunct, name)
        if values is None or len(columns) != 1:
            return None, []
        wanted = set()
        for value in values:
            wanted |= {i for i, v in enumerate(domain) if isinstance(v, str) == isinstance(value, str) and v == value}
            if not any(isinstance(v, str) == isinstance(value, str) for v in domain):
                return None, []  # '1' against numbers: a comparison the engine coerces, left to it
        keep &= wanted
    return tuple(domain[i] for i in sorted(keep)), residual


def _listed(conjunct: exp.Expression, name: str) -> list | None:
    """The literals of ``rr = lit``, ``lit = rr`` or ``rr IN (lit, ...)``, else ``None``."""
    def is_column(node):
        return isinstance(node, exp.Column) and node.name.lower() == name

    if isinstance(conjunct, exp.EQ):
        sides = [conjunct.this, conjunct.expression]
        literal = [s for s in sides if not is_column(s)]
        if len(literal) == 1 and any(is_column(s) for s in sides):
            return _literals(literal)
        return None
    if isinstance(conjunct, exp.In) and is_column(conjunct.this) and not conjunct.args.get("query") \
            and not conjunct.args.get("unnest"):
        return _literals(conjunct.expressions)
    return None


def _literals(nodes) -> list | None:
    values = []
    for node in nodes:
        negative = isinstance(node, exp.Neg)
        node = node.this if negative else node
        if not isinstance(node, exp.Literal):
            return None
        if node.is_string:
            if negative:
                return None
            values.append(node.this)
            continue
        try:
            number = Fraction(node.this)
        except ValueError:
            return None
        number = -number if negative else number
        values.append(int(number) if number.denominator == 1 else number)
    return values


def _grouped(checked: PrivateQuery, rule: ColumnRule) -> bool | None:
    """True for GROUP BY the RR column, False for no GROUP BY, ``None`` for anything else."""
    if not checked.keys:
        return False
    key = checked.keys[0].expression
    if len(checked.keys) == 1 and isinstance(key, exp.Column) and key.name.lower() == rule.name.lower():
        return True
    return None


def _counts(checked: PrivateQuery, rule: ColumnRule) -> tuple[str, ...] | None:
    """The core names of the query's aggregates when every one counts rows: COUNT(*) or COUNT
    of the RR column (every value of which is a report); ``None`` otherwise."""
    counts = []
    for aggregate in checked.aggregates:
        argument = aggregate.argument
        if aggregate.function != "count" or not (
                argument is None or isinstance(argument, exp.Column) and argument.name.lower() == rule.name.lower()):
            return None
        counts.append(aggregate.name)
    return tuple(counts) or None


def _why(policy: Policy, table: PrivateTable, residual: bool, sampled: bool = False) -> str:
    if sampled:
        return ("the table is sampled (TABLESAMPLE POISSON): the counts of the sample's reports are charged, "
                "at the amplified cost")
    if residual:
        return "the WHERE reads other columns, whose counts are private: the counts per report are charged"
    if policy.neighbours != "bounded":
        return ("neighbours are UNBOUNDED: adding or removing a row adds or removes a report, so the "
                "number of reports is private and their counts are charged")
    if not table.row_level:
        return (f"{sql_name(table.name)} has a unit column: a unit's number of rows is private, and the "
                "rows it keeps are chosen by their content, so the counts per report are charged")
    return ("neighbours are BOUNDED and each row is its own unit: the number of reports is public, "
            "and their counts are post-processing of reports already private at collection")


# --- answering ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Debiased:
    """The de-biased core rows (the key, if grouped, then each COUNT's estimate), and the
    variance of each row's estimate."""

    rows: list[tuple]
    variances: list[float]


def debias(query: LocalCount, counts: dict, noise_variance: float) -> Debiased:
    """The core rows ``query`` asks for, from the counts of reports per domain value
    (``counts``: value -> count, exact or noisy; missing values count 0), with each row's
    variance: randomized response's (plugged in) plus, for noisy counts, the noise's."""
    assert query.rule.local is not None
    domain = query.rule.local.domain
    values = [float(counts.get(v, 0) or 0) for v in domain]
    n = sum(values)
    sets = [(v,) for v in query.chosen] if query.grouped else [query.chosen]
    rows, variances = [], []
    for chosen in sets:
        if not chosen:  # no value chosen: an empty set holds no row, whatever the data
            estimate, variance = 0.0, 0.0
        else:
            reports = sum(values[domain.index(v)] for v in chosen)
            size = len(chosen)
            estimate = debiased_count(reports, n, epsilon=query.epsilon, k=query.k, size=size)
            variance = debiased_variance(estimate, n, epsilon=query.epsilon, k=query.k, size=size)
            if noise_variance:
                variance += noise_variance_after_debiasing(noise_variance, epsilon=query.epsilon, k=query.k,
                                                           size=size)
        rows.append(((_key(chosen[0]),) if query.grouped else ()) + (estimate,) * len(query.counts))
        variances.append(variance)
    return Debiased(rows, variances)


def _key(value):
    """A DOMAIN value as the engine reads it back: a non-integer number as its exact Decimal
    (the policy check made it a value of the DECIMAL column)."""
    if isinstance(value, Fraction) and value.denominator != 1:
        return finite_decimal(value)
    return value


def debiased_columns(query: LocalCount) -> list[str]:
    """The de-biased core's columns: g0 (the RR column) if grouped, then the COUNTs."""
    return (["g0"] if query.grouped else []) + list(query.counts)


def interval_cells(query: LocalCount, shown: list[tuple], variances: list[float]):
    """accuracy() of the de-biased counts shown: per output that is one COUNT and per row,
    (low, high, half-width) of the normal-approximation (1 − alpha) interval, estimate ±
    z·standard error (``variances``: of each shown row); NaN for other computed outputs (derived,
    no ±), none for the key."""
    def cells(alpha: float) -> dict[str, list[tuple[float, float, float]]]:
        z = NormalDist().inv_cdf(1 - alpha / 2)
        direct = {output for output, _ in query.direct}
        found = {}
        for position, (output, item) in enumerate(zip(query.outputs, query.post.expressions)):
            node = item.unalias()
            if isinstance(node, exp.Column) and node.name == "g0":
                continue  # the key: public, no ±
            found[output] = [(row[position] - z * math.sqrt(v), row[position] + z * math.sqrt(v), z * math.sqrt(v))
                             if output in direct else (math.nan, math.nan, math.nan)
                             for row, v in zip(shown, variances)]
        return found
    return cells


def local_notes(query: LocalCount, charged: bool) -> list[str]:
    """What the answer says of its path."""
    assert query.rule.local is not None
    path = "de-biased from the noisy counts of reports (charged)" if charged else \
        "de-biased from the exact counts of reports (free)"
    return [f"{query.column} was collected with randomized response at epsilon {query.epsilon} over "
            f"{query.k} values (LOCAL RR): the counts are {path}, because {query.why}; the ± is the "
            "estimator's normal-approximation interval"]


def explain_local(query: LocalCount) -> str:
    """explain()'s text for a de-biased count (the central path's counting query follows it)."""
    assert query.rule.local is not None
    epsilon = query.epsilon
    head = (f"randomized-response count: {query.column} is LOCAL RR at epsilon {epsilon} over {query.k} values; "
            f"the estimate is (c - n*s*q) / (p - q) with p = e^{epsilon}/(e^{epsilon}+{query.k - 1}), "
            f"q = 1/(e^{epsilon}+{query.k - 1}), s the number of values counted together")
    if query.free:
        return (f"{head}\npath: free, {query.why}; each row's report cost epsilon {epsilon} at collection "
                f"(a row is a unit here), paid once for every query\ncounts of reports: {query.counting_sql}\n"
                "accounting: this query costs epsilon 0, delta 0")
    return f"{head}\npath: central, {query.why}; the counting query below is charged and noised as usual"


def noise_variance(measure: Measure) -> float:
    """The variance of the noise a count measure was released with, in counts."""
    if measure.noise == "laplace":
        variance = discrete_laplace_variance(measure.scale)
    elif measure.noise == "gaussian":
        variance = discrete_gaussian_variance(measure.scale)
    else:
        variance = 0.0
    return variance * float(measure.grid) ** 2


def reports_sql(table: PrivateTable, rule: ColumnRule) -> str:
    """The counts of a LOCAL RR column's reports per domain value (``check_reports``)."""
    column = exp.column(rule.name, quoted=True)
    source = exp.to_table(".".join(sql_name(part) for part in table.name.split(".")), dialect=DIALECT)
    select = exp.select(column, exp.alias_(exp.Count(this=exp.Star()), "reports")).from_(source).group_by(column.copy())
    return select.sql(dialect=DIALECT)


def check_reports(policy: Policy, count_outside) -> None:
    """Refuse, at connect (the curator's step), data a free answer would misreport: a NULL or a
    value outside the DOMAIN of a LOCAL RR column of a table the free path can read (module
    docstring). ``count_outside(table, rule)`` counts such rows of the table's bounded copy."""
    from dpsql.errors import PolicyError

    if policy.neighbours != "bounded":
        return
    for table in policy.private_tables:
        if not table.row_level:
            continue
        for rule in _local_columns(table).values():
            if count_outside(table, rule):
                position = rule.position
                raise PolicyError(
                    f"{sql_name(table.name)}.{sql_name(rule.name)} is declared LOCAL RR, but holds NULL or values "
                    "outside its DOMAIN: such a row was never randomized, and counting reports would reveal it",
                    line=position.line if position else None, col=position.col if position else None,
                    hint="list every reported value in the DOMAIN, or declare a view that keeps only rows "
                         "holding a report as the private table")
