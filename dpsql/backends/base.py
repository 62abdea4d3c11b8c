"""What the pipeline asks of an engine: the ``Backend`` protocol.

The stages above the backends (check, analysis, connection, release) talk to an engine only
through these methods, so a second engine (Spark) is a second implementation of this class
and nothing above it changes. ``dpsql.backends.duckdb.Engine`` is the DuckDB one.

Every method states what it must guarantee; the privacy argument leans on those guarantees
(DESIGN.md invariants 1, 3, 10, 15, 17, 19), so an implementation that cannot keep one must
refuse, never approximate.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from sqlglot import exp

from dpsql.analysis.plan import GroupKey
from dpsql.sql.names import Catalog


@runtime_checkable
class Backend(Protocol):
    """An engine dpsql runs its generated, checked SQL on (never analyst text)."""

    path: Path | None
    """The database file, when the backend opened one (the default ledger sits beside it)."""

    dialect: str
    """The sqlglot dialect statements are rendered in for this engine (``dpsql.backends.render``)."""

    @property
    def post_processing(self) -> PostProcessing:
        """Where released values are post-processed (``PostProcessing``): never this engine's own
        data, whatever the engine (DuckDB's and Spark's both use ``dpsql.backends.duckdb.released``)."""
        ...

    progress: Callable[[str], contextlib.AbstractContextManager]
    """Called with a label around each bounded copy's build: a context manager that may show
    the build's progress to the curator (``dpsql.curator.progress``); an engine that builds
    its copies lazily elsewhere (Spark) may never call it."""

    @property
    def timeout(self) -> float | None:
        """Seconds one statement may run (``dpsql.backends.deadline``); ``None``: no limit."""
        ...

    def check(self, tree: exp.Expression, private: bool) -> None:
        """Refuse, before anything is charged, a checked analyst query this engine would not run
        as DuckDB means it (``UnsupportedQuery``); ``private``: it reads a private table. Reads
        the query and the schema only. DuckDB refuses nothing more."""
        ...

    # ---- schema and public facts: read before the charge, never a private row ----------------

    def catalog(self) -> Catalog:
        """Every table and view the analyst's names could resolve to: lower-cased table name ->
        {lower-cased column: engine type}, with ``Catalog.spellings`` for messages. Objects
        that shadow others in name resolution (temporary ones) replace them here exactly as
        the engine resolves names. Reads the schema only."""
        ...

    def describe(self, statement: exp.Expression | str, parameters: Any = None) -> list[tuple[str, str]]:
        """(name, type) of each column ``statement`` (a tree the backend renders in its own
        dialect, or its text) would return. Binds the statement and reads no rows; one that
        does not bind raises ``UnsupportedQuery`` whose message depends on the statement and
        the schema only (a static refusal, invariant 1)."""
        ...

    def materialise(self, statement: exp.Expression | str) -> str:
        """Store the rows of ``statement`` — which reads public data only — once, before the
        charge, and return the stored relation's name (a table in ``DATABASE``'s main schema).
        Every public fact the analysis measures on a joined public side (a key's multiplicity,
        a column's range) is measured on these rows and the query reads these same rows
        (invariant 15: enforce, never measure apart)."""
        ...

    def stored_reference(self, name: str) -> exp.Table:
        """The table a query reads the stored public relation ``name`` (``materialise``) as."""
        ...

    def key_multiplicity(self, stored: str, keys: Sequence[str]) -> int:
        """The most rows of the stored public relation ``stored`` that share one value of its
        ``keys`` columns (rows with a NULL key never match a join, so they are not counted), at
        least 1. Read from the stored rows the join will read, in the type it compares."""
        ...

    def column_ranges(self, stored: str, columns: Sequence[str]) -> dict[str, tuple[Any, Any]]:
        """Column -> (min, max) of the stored public relation's ``columns`` (numbers); a column
        with no finite extremes (no rows, all NULL, NaN or infinite) is left out."""
        ...

    def cast_error(self, value: str, type_name: str) -> str | None:
        """``None`` when the public constant ``value`` casts to ``type_name``, else the engine's
        one-line reason. Casts the constant alone: no row is read."""
        ...

    def public_generation(self) -> int:
        """A number that changes whenever the public facts or stored public relations this
        engine shares with others may have changed (a refresh by any of them): an analysis
        prepared under another number must be made again."""
        ...

    def time_zone(self) -> str:
        """The zone the engine reads TIMESTAMP WITH TIME ZONE values in (a setting, not data)."""
        ...

    # ---- bounded copies ---------------------------------------------------------------------

    def prepare_bounding(self, tables: list, salt: str) -> None:
        """Declare the bounded copies of the private tables (``dpsql.backends.bounding``) and the
        secret salt that chooses which rows of a unit they keep. Reads no rows. A copy keeps at
        most k rows per unit, chosen from the unit's own rows and the salt only (invariant 5)."""
        ...

    def build_bounding(self) -> None:
        """Fill every bounded copy now (so no analyst query's time includes the raw scan)."""
        ...

    def refresh_bounding(self) -> None:
        """Forget the copies' contents, stored public relations and cached schemas: the next
        query that reads each rebuilds it."""
        ...

    # ---- running generated SQL --------------------------------------------------------------

    def fetch(self, sql: str, parameters: Any = None, *, bounded: Iterable[str] = ()) -> list[tuple]:
        """Run generated SQL and return every row, exactly (no lossy conversion of keys:
        invariant 19). ``bounded`` names the private tables it reads, their bounded copies filled first. Runs under
        the statement deadline: past it, ``QueryFailed``, whatever the data (invariant 17)."""
        ...

    def hold(self, name: str, sql: str, parameters: Any = None, *, bounded: Iterable[str] = ()) -> bool:
        """Store the rows of generated SQL over private data (its bounded copies filled first) as
        the table ``dp_bounding.main."<name>"`` (``dpsql.backends.bounding.DATABASE``), for one
        mechanism to read many times after its charge, and return True; or store nothing and
        return False (an engine that keeps no such table, or cannot write one): the mechanism then
        reads its rows as it would without. Runs under the statement deadline, as ``fetch``. The
        table is private: only generated SQL reads it, and ``drop_held`` removes it."""
        ...

    def drop_held(self, name: str) -> None:
        """Remove a table ``hold`` stored (never failing: it is gone when the engine closes anyway)."""
        ...

    def fetch_df(self, statement: exp.Expression | str) -> Any:
        """Run a checked query over public tables only (a tree, rendered by the backend) and
        return a pandas DataFrame."""
        ...

    # ---- reading keys back ------------------------------------------------------------------

    def key_text(self, raw: Any, type_name: str) -> str | None:
        """A text-form key as fetched (``KeyText``: the engine's text, as bytes) as DuckDB's text
        of the same value: one-to-one, never raising (invariant 19)."""
        ...

    def key_value(self, value: Any, type_name: str) -> Any:
        """A value-form key as fetched, as DuckDB's Python client gives the same value."""
        ...

    def read_keys(self, rows: list[tuple], keys: Sequence[GroupKey]) -> list[tuple]:
        """Fetched rows (keys first) with every key as DuckDB reads it back
        (``dpsql.backends.keys.read_keys`` with ``key_text`` and ``key_value``)."""
        ...

    def close(self) -> None:
        """Release the engine's resources (a connection the caller passed in stays open) and
        close its ``post_processing``."""
        ...


@runtime_checkable
class PostProcessing(Protocol):
    """Where released (noisy) values are combined after the charge: a place that cannot see the
    database, given the released rows alone (``dpsql.backends.duckdb.released.ReleasedDatabase``)."""

    def post_process(self, columns: list[str], types: list[str], rows: list[tuple],
                     statement: exp.Expression | str) -> tuple[list[str], list[tuple]]:
        """Run a post-processing query (a tree over ``dp_core``, rendered for DuckDB; its
        fallible expressions already marked total) over released rows only: (column names,
        rows). It runs after the charge, so it must never fail depending on the data
        (invariant 19): its expressions are total."""
        ...

    def released_types(self, columns: list[str], types: list[str],
                       statement: exp.Expression | str) -> list[tuple[str, str]]:
        """(name, type) of a post-processing query's columns; binds it, reads no rows."""
        ...

    def convert(self, columns: list[str], types: list[str], texts: Sequence[tuple], form: str) -> Any:
        """Released rows (as DuckDB's text) converted as DuckDB's own client converts them:
        ``form`` is "df", "arrow" or "numpy"; ``None`` when a value does not cast back."""
        ...

    def close(self) -> None:
        """Close it (a later ``convert`` still works, in a fresh database)."""
        ...
