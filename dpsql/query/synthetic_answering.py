"""Queries of synthetic tables: answered exactly and free, for their owner only.

A synthetic table (``dpsql.query.synthetic_tables``) is a DP release its owner already paid
for, so any SQL over it is post-processing: ``Connection.sql`` routes a statement here before the
private pipeline when it names one of the asking analyst's synthetic tables (or
``synthetic_tables()``, the listing of them). Such a statement is answered exactly over a
sandboxed in-memory DuckDB holding only those tables (``dpsql.backends.duckdb.synthetic``): no
noise, no charge, no ledger entry. One that also reads a declared table, a table function or
anything else is refused: a private table is answered with noise and charged, a synthetic one
exactly, and one statement cannot be both.

For any other analyst the name is simply not theirs: their statement takes the private path,
which refuses it as an unknown table, in the words it uses for a name nobody made. Routing reads
only the asking analyst's own tables, so no answer or refusal depends on anyone else's.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from fractions import Fraction

from sqlglot import exp

from dpsql.answer.explain import SYNTHETIC_SQL, Explanation, plural
from dpsql.answer.result import DPResult, QueryCost
from dpsql.backends.duckdb.synthetic import SyntheticSandbox, synthetic_sql
from dpsql.errors import DPError, UnsupportedQuery
from dpsql.mechanisms.synthetic_release import SyntheticRelease
from dpsql.query.synthetic_tables import SyntheticTables, name_key
from dpsql.sql.names import table_key
from dpsql.sql.parse import describe, parse_query

__all__ = ["LISTING", "SyntheticQuery", "answer_synthetic", "explain_synthetic", "synthetic_query"]

LISTING = "synthetic_tables"
"""The table function listing the asking analyst's synthetic tables: ``SELECT * FROM synthetic_tables()``."""
LISTED_AS = "dp_synthetic_tables"
"""The sandbox table ``synthetic_tables()`` reads."""
LISTING_COLUMNS = ("name", "source", "method", "rows", "epsilon", "delta", "rho", "marginals", "created")
"""The columns of ``synthetic_tables()``."""


@dataclass(frozen=True)
class SyntheticQuery:
    """A statement of the asking analyst's synthetic tables only."""

    tree: exp.Expression
    """The statement, ``synthetic_tables()`` replaced by the sandbox table listing them."""
    releases: tuple[SyntheticRelease, ...]
    """The synthetic tables it reads, in the order first named."""
    listing: tuple[SyntheticRelease, ...] | None
    """Every one of the analyst's synthetic tables when it reads ``synthetic_tables()``, else None."""
    sources: dict
    """Name -> where its rows are (``SyntheticTables.source``: a DataFrame, or its file)."""


def synthetic_query(sql: str, store: SyntheticTables, analyst: str | None,
                    declared: Iterable[str]) -> SyntheticQuery | None:
    """The statement ``sql`` is if it reads ``analyst``'s synthetic tables, else ``None`` (the
    private pipeline answers it, or refuses it there, a parse error included). Refused
    (``UnsupportedQuery``) when it also reads anything else."""
    mine = set(store.names(analyst))
    if not mine and LISTING not in sql.lower():
        return None  # the common case: no synthetic table of theirs, and no listing asked for
    try:
        tree = parse_query(sql)
    except DPError:
        return None
    declared_keys = {table_key(name) for name in declared}
    ctes = {name_key(cte.alias_or_name) for cte in tree.find_all(exp.CTE)}
    named: list[str] = []
    others: list[exp.Table] = []
    listing = False
    for table in tree.find_all(exp.Table):
        called = table.this
        if isinstance(called, exp.Anonymous) and name_key(called.name) == LISTING and not called.expressions:
            listing = True
            table.set("this", exp.to_identifier(LISTED_AS))
        elif isinstance(called, exp.GenerateSeries):
            continue  # range(...) / generate_series(...): numbers, computed in the sandbox
        elif not isinstance(called, exp.Identifier) or table.catalog:
            others.append(table)
        elif not table.db and name_key(table.name) in ctes:
            continue  # a CTE of the statement itself
        elif name_key(table.name) in mine and name_key(table.name) not in declared_keys \
                and name_key(table.db) in ("", "main"):
            if name_key(table.name) not in named:
                named.append(name_key(table.name))
        else:
            others.append(table)
    if not named and not listing:
        return None
    if others:
        raise _mixed(named, others[0], declared_keys)
    releases = tuple(release for release in (store.made(analyst, name) for name in named) if release is not None)
    if len(releases) != len(named):  # removed between the listing and the read: not theirs any more
        return None
    every = tuple(store.of(analyst).values()) if listing else None
    return SyntheticQuery(tree, releases, every, {release.name: store.source(analyst, release.name)
                                                  for release in releases})


def _mixed(named: list[str], other: exp.Table, declared: set[str]) -> UnsupportedQuery:
    """The refusal of a statement reading synthetic tables and ``other`` besides."""
    mine = ", ".join(named) if named else f"{LISTING}()"
    if isinstance(other.this, exp.Identifier) and name_key(other.name) in declared:
        what = f"the table {other.name}"
    elif isinstance(other.this, exp.Identifier):
        what = f"{other.sql()}, which is not one of your synthetic tables"
    else:
        what = describe(other.this)
    return UnsupportedQuery(
        f"this query reads your synthetic table {mine} and also {what}: a synthetic table is answered exactly "
        "and free from its release, anything else with noise and a charge (or not at all), so one query cannot "
        "read both", hint="query them separately: your synthetic tables in one query, the database's tables in "
                          "another", node=other)


def answer_synthetic(query: SyntheticQuery, timeout: float | None = None,
                     cancelled: Callable[[], bool] | None = None) -> DPResult:
    """``query``'s exact answer from the sandbox: free, not recorded, with a note per table; stopped
    after ``timeout`` seconds (the engine's per-statement limit) or when ``cancelled()``."""
    tables = dict(query.sources)
    if query.listing is not None:
        tables[LISTED_AS] = listing_frame(query.listing)
    with SyntheticSandbox(tables, timeout=timeout, cancelled=cancelled) as sandbox:
        columns, rows, types = sandbox.run(query.tree)
    notes = [answered_note(release) for release in query.releases]
    notes += [note for note in (estimate_note(query, release) for release in query.releases) if note]
    if query.listing is not None:
        notes.append(f"{LISTING}() lists your synthetic tables: only you see them, and reading them is free")
    return DPResult(columns, rows, QueryCost.free(synthetic=True), exact=True, types=types, notes=notes)


def listing_frame(releases: Iterable[SyntheticRelease]):
    """The rows of ``synthetic_tables()``: one per synthetic table, its name first."""
    import pandas as pd

    rows = [(r.name, r.source, r.method, r.rows, r.epsilon, r.delta, r.rho, distinct_marginals(r),
             r.created)
            for r in sorted(releases, key=lambda release: name_key(release.name))]
    frame = pd.DataFrame(rows, columns=list(LISTING_COLUMNS))
    return frame.astype({"name": "object", "source": "object", "method": "object", "rows": "int64",
                         "epsilon": "float64", "delta": "float64", "rho": "float64", "marginals": "int64",
                         "created": "object"})


def distinct_marginals(release: SyntheticRelease) -> int:
    """How many different marginals ``release`` measured (the row count aside; AIM may measure one twice)."""
    return len({frozenset(name_key(c) for c in m.columns) for m in release.measured if m.columns})


def answered_note(release: SyntheticRelease) -> str:
    """What an answer from ``release`` is: exact over a synthetic table, free, imperfect."""
    return (f"answered exactly from your synthetic table {release.name} ({release.method.upper()} over "
            f"{release.source}, epsilon {release.epsilon:g}, delta {release.delta:g}, charged once when it was "
            "made): free, and its values carry the synthesizer's error, which no ± here states")


def estimate_note(query: SyntheticQuery, release: SyntheticRelease) -> str | None:
    """AIM's error estimate for the marginal ``query`` counts, when it is one of those measured
    and the release has an estimate for it."""
    columns = counted_marginal(query.tree, release.name)
    if columns is None:
        return None
    for measured, error in release.error_estimates.items():
        if {name_key(c) for c in measured} == columns:
            return (f"this is the marginal ({', '.join(measured)}) of {release.name}, which {release.method.upper()} "
                    f"measured: it estimates that marginal's error at about {error:,.0f} rows in all (the sum over "
                    "its cells of each count's distance from the true one)")
    return None


def counted_marginal(tree: exp.Expression, name: str) -> frozenset[str] | None:
    """The columns of ``SELECT a, b, COUNT(*) FROM name GROUP BY a, b`` (any order, no WHERE,
    no join, no HAVING; ORDER BY and LIMIT allowed), or ``None`` when ``tree`` is not one.

    >>> sorted(counted_marginal(parse_query("SELECT b, a, COUNT(*) AS n FROM t GROUP BY a, b ORDER BY n"), "t"))
    ['a', 'b']
    >>> counted_marginal(parse_query("SELECT a, COUNT(*) FROM t WHERE b = 1 GROUP BY a"), "t") is None
    True
    """
    if not isinstance(tree, exp.Select) or tree.args.get("joins") or tree.args.get("where") \
            or tree.args.get("having") or tree.args.get("with_"):
        return None
    source = tree.args.get("from_") or tree.args.get("from")
    table = source.this if source is not None else None
    if not isinstance(table, exp.Table) or name_key(table.name) != name_key(name):
        return None
    group = tree.args.get("group")
    keys = [key for key in (group.expressions if group else [])]
    if not keys or not all(isinstance(key, exp.Column) for key in keys):
        return None
    columns = frozenset(name_key(key.name) for key in keys)
    counts = 0
    for selected in tree.expressions:
        inner = selected.this if isinstance(selected, exp.Alias) else selected
        if isinstance(inner, exp.Count) and isinstance(inner.this, exp.Star) and not inner.args.get("distinct"):
            counts += 1
        elif not (isinstance(inner, exp.Column) and name_key(inner.name) in columns):
            return None
    return columns if counts == 1 else None


def explain_synthetic(query: SyntheticQuery) -> Explanation:
    """What ``query`` reads and costs (nothing): each synthetic table's making, and the SQL that runs."""
    lines = ["cost: free — this query reads only your synthetic tables, answered exactly from them "
             "(no noise, no charge, no ledger entry)"]
    for release in query.releases:
        lines += ["", *describe_release(release)]
    if query.listing is not None:
        lines += ["", f"{LISTING}(): your synthetic tables ({len(query.listing)}), one row each"]
    lines += ["", SYNTHETIC_SQL,
              *("  " + line for line in synthetic_sql(query.tree, pretty=True).splitlines())]
    return Explanation("\n".join(lines))


def describe_release(release: SyntheticRelease) -> list[str]:
    """How ``release`` was made, as EXPLAIN shows it: method, cost, marginals and bins."""
    made = f", made {release.created}" if release.created else ""
    lines = [f"synthetic table {release.name}: {release.method.upper()} over {release.source}, "
             f"{release.rows:,} rows{made}",
             f"  charged once when made: epsilon {release.epsilon:g}, delta {release.delta:g} "
             f"(rho {release.rho:g} under zero-concentrated DP)",
             f"  measured ({plural(len(release.measured), 'measurement')} in order, each cell with Gaussian noise):"]
    estimates = {frozenset(name_key(c) for c in columns): error for columns, error in release.error_estimates.items()}
    last = {frozenset(name_key(c) for c in m.columns): index for index, m in enumerate(release.measured)}
    for index, measured in enumerate(release.measured):  # AIM may measure one marginal again: its estimate once, last
        marginal = frozenset(name_key(c) for c in measured.columns)
        estimate = estimates.get(marginal) if last[marginal] == index else None
        chosen = getattr(measured, "selection_rho", 0.0)  # the rho spent choosing it (AIM's, MST's selection)
        what = f"({', '.join(measured.columns)})" if measured.columns else "the row count"
        lines.append(f"    {what}: rho {measured.rho:g}, sigma {measured.sigma:g}"
                     + (f", chosen for rho {chosen:g}" if chosen else "")
                     + ("" if estimate is None else f", estimated error {estimate:,.0f} rows in all"))
    total = sum((Fraction(m.rho) + Fraction(getattr(m, "selection_rho", 0.0)) for m in release.measured), Fraction(0))
    lines.append(f"    total rho spent measuring and choosing: {float(total):g}")
    if release.bins:
        lines.append("  cells of each column (chosen from the policy alone):")
        for column, labels in release.bins.items():
            shown = ", ".join(labels[:12]) + (f", … ({len(labels)} in all)" if len(labels) > 12 else "")
            lines.append(f"    {column}: {shown}")
    return lines
