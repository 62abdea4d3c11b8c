"""``FROM t TABLESAMPLE POISSON (p PERCENT)``: a query run on a Poisson sample of a private
table's units, charged the amplified cost (``dpsql.budget.amplification``).

The sample. Each unit of the table's bounded copy (after MAX ROWS PER UNIT: the base
mechanism's sensitivity is that of the unsampled query) is kept, with all its rows, when the
first 64 bits of SHA-256(key ‖ the unit's canonical text) are below floor(p·2^64)
(``dpsql.sql.pieces.InSample``). The key is 256 bits drawn from the secure source for every
charged query (``dpsql.mechanisms.noise.secret_key``) and bound as a query parameter: it is in
no SQL text, ledger entry, message or answer. So, modelling SHA-256 under a secret prefix key as
a pseudo-random function, each unit is kept independently with probability at most p, whatever
the data and whatever the analyst saw before (a fresh key per query: two queries' samples are
independent too). The hash reads the unit's exact canonical text (DESIGN.md invariant 20), so
two units DuckDB takes as equal but an analyst can tell apart get independent coins. Not the
database's ``random()`` (not a secure source, and per row, not per unit), and not its
``hash()`` (a public function: a key folded in by XOR leaves units' coins correlated).

Where amplification holds. The whole mechanism must run on the sample and nothing else of the
unit's data: so the query reads exactly one private table reference, the sampled one (a join or
UNION ALL with another private reference, or the same table read twice, would let the unit's
rows outside the sample move the answer), and no bias report (it reads each unit's raw row
count, outside the sample). Public tables may be joined. What the amplification theorem
covers for replace-one neighbours is checked by ``check_covers_removal``.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from fractions import Fraction

from sqlglot import exp

from dpsql.errors import UnsupportedQuery
from dpsql.sql.allowlist import refuse
from dpsql.sql.pieces import CopiedTable, InSample

METHODS_HINT = "write TABLESAMPLE POISSON (p PERCENT): a sample of units drawn with dpsql's secure source"


@dataclass(frozen=True)
class Sampling:
    """A query's Poisson sample of units."""

    rate: Fraction
    """p: each unit is kept with probability at most p (exactly floor(p·2^64)/2^64)."""
    table: str
    """The sampled private table (catalog key)."""

    @property
    def percent(self) -> str:
        """The rate as the analyst wrote it, in percent."""
        value = self.rate * 100
        return str(value.numerator) if value.denominator == 1 else format(float(value), "g")


def poisson_rate(sample: exp.TableSample, table: str) -> Fraction:
    """The rate p of ``TABLESAMPLE POISSON (x PERCENT)`` on private table ``table``; any other
    sampling is refused with why and what to write."""
    written = sample.args.get("method")
    method = (written.name if written is not None else "SYSTEM").upper()
    if method != "POISSON":
        refuse(sample, f"TABLESAMPLE {method} of private table {table} samples rows with the database's own "
               "random(), which is neither a secure source nor a sample of units, so it buys no privacy",
               METHODS_HINT)
    if sample.args.get("seed") not in (None, False):  # (False: DuckDB's "10 PERCENT (POISSON)" has none)
        refuse(sample.args["seed"], f"a REPEATABLE seed would make the sample of {table} predictable: dpsql draws "
               "a secret key for each query", "leave REPEATABLE out")
    percent = sample.args.get("percent")
    if percent is None or any(sample.args.get(part) is not None for part in ("size", "rows", "bucket_numerator")):
        refuse(sample, f"TABLESAMPLE POISSON of {table} takes a percentage of units, not a number of rows",
               "write TABLESAMPLE POISSON (10 PERCENT)")
    if not isinstance(percent, exp.Literal) or percent.is_string:
        refuse(percent, f"the sampling percentage of {table} must be a number", "write e.g. POISSON (10 PERCENT)")
    if len(percent.this) > 40:
        refuse(percent, f"the sampling percentage of {table} has {len(percent.this)} characters",
               "write it with at most 40, e.g. POISSON (0.5 PERCENT)")
    try:
        value = Fraction(percent.this)
    except (ValueError, ZeroDivisionError):
        refuse(percent, f"the sampling percentage of {table} must be a number", "write e.g. POISSON (10 PERCENT)")
    if not 0 < value <= 100:
        refuse(percent, f"the sampling percentage of {table} is {percent.this}, outside (0, 100]",
               "sample between just above 0 and 100 PERCENT of the units")
    if value / 100 < Fraction(1, 2**64):  # floor(p * 2^64) = 0: no unit could ever be kept
        refuse(percent, f"the sampling percentage of {table} is {percent.this}: below 2^-64 of the units, the "
               "sample would always be empty", "sample at least 1e-15 PERCENT of the units")
    return value / 100


def sampling_of(source: exp.Expression | None) -> Sampling | None:
    """The Poisson sample a query's source reads, or ``None``; refused unless the sampled table
    is the only private table reference in it (module docstring)."""
    if source is None:
        return None
    samples = list(source.find_all(InSample))
    if not samples:
        return None
    copies = [c for c in source.find_all(CopiedTable) if c.find_ancestor(InSample) is None]  # its own: per unit
    table = _sampled_table(samples[0], copies)
    if len(copies) != 1 or len(samples) != 1:
        raise UnsupportedQuery(
            f"TABLESAMPLE POISSON of {table} amplifies privacy only when the query reads no other private data, "
            "but this query also reads private data outside the sample (another private table, or the same one "
            "again): a unit's rows there could move the answer",
            hint="sample the only private table the query reads (joins with public tables are fine)")
    return Sampling(Fraction(samples[0].args["rate"].name), copies[0].table_key)


def _sampled_table(sample: InSample, copies: list[CopiedTable]) -> str:
    select = sample.find_ancestor(exp.Select)
    table = select.args["from_"].this if select is not None and select.args.get("from_") else None
    return table.table_key if isinstance(table, CopiedTable) else (copies[0].table_key if copies else "the table")


def check_covers_removal(plan, unbounded) -> None:
    """Under replace-one neighbours the sampled mechanism is (epsilon', p·delta)-DP only if the
    base one is also (epsilon, delta)-DP for adding or removing a unit
    (``dpsql.budget.amplification``). ``unbounded`` is the same query planned for add/remove
    neighbours at the same epsilon and delta: each of ``plan``'s noise scales is calibrated to
    its replace-one sensitivity, so it covers removal when that sensitivity is at least the
    add/remove one, measure by measure (and partition selection's scale and threshold at least
    the add/remove ones)."""
    pairs = list(zip(plan.measures, unbounded.measures))
    covered = len(plan.measures) == len(unbounded.measures) and all(
        m.name == u.name and m.sensitivity.l1 >= u.sensitivity.l1
        and m.sensitivity.l2_squared >= u.sensitivity.l2_squared for m, u in pairs)
    if (plan.selection is None) != (unbounded.selection is None):
        covered = False
    elif plan.selection is not None:
        covered = covered and plan.selection.scale >= unbounded.selection.scale \
            and plan.selection.threshold >= unbounded.selection.threshold
    if not covered:
        raise UnsupportedQuery(
            "under NEIGHBOURS BOUNDED this query's noise covers replacing a unit but not removing one, "
            "which a Poisson sample can do (a replaced unit may be sampled while its replacement is not), "
            "so amplification does not apply", hint="query the whole table, without TABLESAMPLE")


def unbounded_policy(policy):
    """``policy`` with add/remove neighbours: the plan ``check_covers_removal`` compares with."""
    return replace(policy, neighbours="unbounded")
