"""Each private table bounded once: at most MAX ROWS PER UNIT rows of every unit, for every query.

A private table is read by analyst queries only through its *bounded copy*, a table in an
in-memory database attached as ``dp_bounding`` (so every cursor of the connection sees it,
and a read-only database file stays untouched), holding at most ``k`` (the policy's MAX ROWS
PER UNIT) rows of each unit — the ``k`` rows first in the order of a secret keyed hash of the
row's own values — and no row whose unit is NULL or an id longer than ``unit_id_limit``.

Identity is exact (DESIGN.md invariant 20). Everything that decides which rows are the same or
come first compares what an analyst could read back, never DuckDB's equality or ``hash()``
(which take -0.0 for 0.0, -nan for nan, INTERVAL '1 month' for '30 days', and inside lists
``to_json`` writes nan and -nan alike): units are partitioned by their own value, whose type the
policy admits only when its equality is that identity (``dpsql.sql.types.equality_is_identity``)
and which the copy never cuts; a row is ordered by ``keyed_hash`` of each column's
``exact_parts`` (a float with its sign bit, anything inexact by its ``canonical_text``), ties
broken by those parts; a row-level table numbers rows within their ``canonical_text``.

Row-level tables (PRIVACY UNIT ROW) are unit-level tables whose unit is hidden (DESIGN.md
invariant 16): their copy adds a column ``dp_row``, the row's own id, and every later stage
treats it as the unit column — joins multiply its rows by ``m``, partition selection counts
distinct ids, quantiles and contribution options see ``k·m`` rows per id — while binding
never lets the analyst name it. The id is the salted MD5 (128 bits) of the row's canonical
text and of its index among the rows with that text (numbered 1..n), never a rowid or a
position: adding or removing a row changes no other row's id (rows with one canonical text are
interchangeable, so which of them gets which index does not matter). An id that more than one
row has (an MD5 collision under a secret salt: about n²/2¹²⁹ for n rows) is dropped with all
its rows: the copy holds one row
per id by construction, so a collision costs those rows (accuracy). Adding or removing one
row then adds or removes at most one id of the copy — add-or-remove neighbours map to
neighbouring copies exactly. Replacing a row (BOUNDED neighbours) is a removal and an
addition, and if the removed row shared its id with another, both could change the copy
by one unit each: that needs a collision in ``D``, so its probability over the salt adds to
delta (documented in ``docs/THREAT_MODEL.md``; a wider id would shrink it further).

Why this is safe. The copy is ``T(D)``, where ``T`` keeps, for each unit separately, a subset
of that unit's rows chosen from those rows and the salt alone. So ``T`` is *stable*: adding
or removing one unit (or changing its rows) changes the rows of that unit only, and the copy
of a neighbouring database is a neighbouring copy. Every query is then analysed and bounded
exactly as before, over ``T(D)`` instead of ``D``: its sensitivity argument holds for each
fixed salt, hence for the random one, and composition over many queries holds for the same
fixed ``T``. The salt is drawn independently of the data (it is the ledger's).

Strings are compared byte for byte. A ``COLLATE NOCASE`` column would make DuckDB group
'A' and 'a' together and release whichever spelling it met first (an order- and
data-dependent choice), and would make a unit 'A' equal to another table's unit 'a'; the copy
therefore holds every VARCHAR column with the binary collation, so a unit, a group key and a
join compare exactly the stored strings, whatever the table declares.

Why it is done. (1) Timing: analyst expressions never see more than ``k`` rows of one unit,
so a costly expression under ``CASE WHEN unit = target`` costs at most ``k`` rows' worth, not
the target's raw row count. (2) Speed: every unit in the copy is *light* (at most ``k``
rows), so a query that is ungrouped, or whose groups per unit cannot exceed its rows, needs
no per-unit aggregation at all (see ``dpsql.backends.rewrite``) — it runs like a row-level query.

Why it is padded. DuckDB's optimizer reads column statistics (each column's min and max)
when it plans a query, and a filter those statistics prove false — ``WHERE user_id = 424242``
above the largest id, ``WHERE age > 100`` when nobody is that old — is answered as an empty
result without a scan: milliseconds that say whether someone has such a value. So each copy
also holds two *padding rows* (``dp_pad``), one with every column at its type's lowest value
and one at its highest (±inf, ±infinity dates, '' and U+10FFFF strings, true and false),
which every query drops by ``NOT dp_pad`` before anything else: no comparison with a constant
can be decided from statistics any more. Columns of other types (lists, structs, blobs, ...)
are padded with NULL and keep their statistics.

What it costs. The copy is built on the first query that reads the table (one window over
the table, without the analyst's query time limit: its SQL is dpsql's alone; a large table in
batches of units, ``fill_batches``, so the window's sort holds ~``BATCH_ROWS`` rows at a time),
lives in memory (DuckDB spills it to disk under its memory limit), and reflects the data as it was then:
``Connection.refresh()`` rebuilds it after the wrapped database changed. Opt-in, the copies
are kept on disk instead and reused by later processes while the data, the recipe (this
module's SQL) and the salt are unchanged (``dpsql.backends.duckdb.persisted``): the same
``T(D)``, stored.
"""

from __future__ import annotations

from dataclasses import dataclass

from sqlglot import exp

from dpsql.policy.model import (
    DEFAULT_MAX_LIST_LENGTH,
    DEFAULT_MAX_STRING_LENGTH,
    PrivateTable,
)
from dpsql.sql.names import PAD, ROW_UNIT, ROW_UNIT_TYPE, quoted, quoted_table
from dpsql.sql.pieces import CopiedTable
from dpsql.sql.types import (
    base_type,
    enum_values,
    equality_is_identity,
    holds_lists,
    is_list,
    list_element,
    map_types,
    struct_fields,
)

PREFIX = "dp_bounded_"
DATABASE = "dp_bounding"
"""The in-memory database holding the copies (never in the analyst's catalog)."""
RAW_ROWS_PREFIX = "dp_raw_rows_"
"""Prefix of a unit table's *row-count table*: each unit's raw row count, capped (``raw_rows_sql``)."""
UNIT_ROWS = "dp_unit_rows"
"""A unit-level copy's column holding, on each row, how many rows its unit keeps in the copy (at
most k): a unit with at most MAX GROUPS PER UNIT rows has at most that many groups, so a query's
group limit can skip its window for that unit (``dpsql.backends.rewrite``). A function of the
unit's own kept rows, so the copy stays a per-unit transformation."""
DROP_CAP = 4
"""The bias report's C = DROP_CAP · k (``dpsql.query.bias``): the most rows beyond the limit one unit
may add to its ``dropped`` count. The row-count table caps what it stores by it."""


@dataclass(frozen=True)
class BoundedTable:
    """The bounded copy of one private table."""

    source: str
    """The private table's catalog name (``schema.table`` outside ``main``)."""
    unit: str
    """Its privacy unit column (lower case); ``ROW_UNIT`` for a row-level table."""
    rows_per_unit: int
    """How many rows of each unit the copy keeps: the policy's MAX ROWS PER UNIT."""
    columns: tuple[tuple[str, str], ...]
    """Every column of the table (lower case) with its DuckDB type, in order."""
    row_level: bool = False
    """Each row is its own unit: the copy adds the hidden id column ``ROW_UNIT``."""
    list_length: int | None = None
    """The policy's MAX LIST LENGTH for the table (``None``: the default applies)."""
    string_length: int | None = None
    """The policy's MAX STRING LENGTH for the table (``None``: the default applies)."""

    @property
    def name(self) -> str:
        if self.row_level:
            return row_copy_name(self.source, self.list_length, self.string_length)
        return bounded_name(self.source, self.unit, self.rows_per_unit, self.list_length, self.string_length)


def bounded_name(source: str, unit: str, rows_per_unit: int, list_length: int | None = None,
                 string_length: int | None = None) -> str:
    """The table holding ``source``'s copy bounded to ``rows_per_unit`` rows of each ``unit``.

    The name says all the copy depends on besides the salt, so two connections sharing one
    DuckDB connection under different policies never read each other's copies.

    >>> bounded_name("sales.visits", "User_Id", 10)
    'dp_bounded_sales__visits__user_id__10'
    """
    return (f"{PREFIX}{source.lower().replace('.', '__')}__{unit.lower()}__{rows_per_unit}"
            f"{_limits_suffix(list_length, string_length)}")


def _limits_suffix(list_length: int | None, string_length: int | None) -> str:
    """A stated MAX LIST LENGTH or MAX STRING LENGTH changes what the copy holds, so it is part
    of the copy's name.

    >>> _limits_suffix(None, None), _limits_suffix(5, None), _limits_suffix(None, 20)
    ('', '__list5', '__str20')
    """
    return ("" if list_length is None else f"__list{list_length}") + (
        "" if string_length is None else f"__str{string_length}")


def row_copy_name(source: str, list_length: int | None = None, string_length: int | None = None) -> str:
    """The table holding a row-level table's copy, one row per hidden id.

    >>> row_copy_name("sales.events")
    'dp_bounded_sales__events__row'
    """
    return f"{PREFIX}{source.lower().replace('.', '__')}__row{_limits_suffix(list_length, string_length)}"


def copy_name(source: str, rule: PrivateTable) -> str:
    """The table holding the bounded copy of ``source``, which ``rule`` declares."""
    if rule.unit is None:  # row-level
        return row_copy_name(source, rule.max_list_length, rule.max_string_length)
    return bounded_name(source, rule.unit, rule.max_rows_per_unit, rule.max_list_length, rule.max_string_length)


def raw_rows_name(copy: str) -> str:
    """The row-count table of the unit table whose bounded copy is ``copy``.

    >>> raw_rows_name("dp_bounded_visits__uid__10")
    'dp_raw_rows_dp_bounded_visits__uid__10'
    """
    return RAW_ROWS_PREFIX + copy


def raw_rows_columns(table: BoundedTable) -> dict[str, str]:
    """The row-count table's columns with their DuckDB types, the same on every engine: ``dp_unit``
    of the unit's type (strings byte for byte), ``r`` a BIGINT (``COUNT(*)`` is one on DuckDB and
    Spark, and ``LEAST`` with an INTEGER cap keeps it). Spark's rendering writes ``r - K`` by the
    type of ``r`` (``dpsql.backends.spark.rewrites``), so its engine declares these for each table
    (``SparkEngine.prepare_bounding``); ``tests/test_bias_estimate.py`` checks them on both engines.

    >>> raw_rows_columns(BoundedTable("t", "uid", 2, (("uid", "INTEGER"), ("x", "DOUBLE"))))
    {'dp_unit': 'INTEGER', 'r': 'BIGINT'}
    """
    return {"dp_unit": dict(table.columns)[table.unit], "r": "BIGINT"}


def raw_rows_cap(rows_per_unit: int) -> int:
    """What the row-count table stores at most for a unit: K·(1 + DROP_CAP·K), K = MAX ROWS PER
    UNIT. A public number, so the table is a per-unit function of the unit's rows alone (one
    value per unit: stable like the copy), and the bias report reads the same values whatever
    one unit's raw row count beyond it (``dpsql.query.bias`` proves its counts unchanged).

    >>> raw_rows_cap(2)
    18
    """
    return rows_per_unit * (1 + DROP_CAP * rows_per_unit)


def piece_copy_name(table: CopiedTable) -> str:
    """The table holding the bounded copy a ``dpsql.sql.pieces.CopiedTable`` node reads.

    >>> from dpsql.sql.pieces import bounded_read
    >>> piece_copy_name(bounded_read("sales.visits", "User_Id", 10, None, None, ["x"]).args["from_"].this)
    'dp_bounded_sales__visits__user_id__10'
    """
    if table.unit_column is None:  # row-level
        return row_copy_name(table.table_key, table.list_length, table.string_length)
    return bounded_name(table.table_key, table.unit_column, table.rows_per_unit, table.list_length,
                        table.string_length)


def with_unit_rows(source: exp.Expr) -> exp.Select | None:
    """``source`` with its rows' ``UNIT_ROWS`` as one more column, when it is exactly a read of one
    unit-level copy (``dpsql.sql.pieces.bounded_read``: the rows of each unit are that unit's kept rows); else
    ``None``."""
    if not isinstance(source, exp.Select) or source.args.get("joins") or source.args.get("group"):
        return None
    table = source.args["from_"].this if source.args.get("from_") else None
    if not isinstance(table, CopiedTable) or table.unit_column is None:  # row-level copies keep no UNIT_ROWS
        return None
    return source.select(exp.column(UNIT_ROWS), copy=True)


def bounded_tables(rules: list[PrivateTable], catalog: dict[str, dict[str, str]], key_of) -> list[BoundedTable]:
    """A bounded copy for every private table (row-level ones with their hidden id column)."""
    tables = []
    for rule in rules:
        key = key_of(rule.name)
        unit = ROW_UNIT if rule.unit is None else rule.unit.lower()
        tables.append(BoundedTable(key, unit, rule.max_rows_per_unit, tuple(catalog[key].items()), rule.row_level,
                                   rule.max_list_length, rule.max_string_length))
    return tables




def attach_sql() -> str:
    """The copies' database: in memory, writable even beside a read-only database file."""
    return f"ATTACH IF NOT EXISTS ':memory:' AS {DATABASE} (READ_WRITE)"


def _copied_columns(table: BoundedTable) -> str:
    """The table's columns as the copy holds them: strings with the binary collation, and
    every value whose size is data cut (``shortened``): LISTs and MAPs to MAX LIST LENGTH
    elements in all, strings to MAX STRING LENGTH characters (BLOBs to as many bytes) — except
    the privacy unit, which stays whole: it is the unit's identity."""
    length = DEFAULT_MAX_LIST_LENGTH if table.list_length is None else table.list_length
    characters = DEFAULT_MAX_STRING_LENGTH if table.string_length is None else table.string_length

    def copied(column: str, type_name: str) -> str:
        # The unit is its identity: never cut (two ids sharing a prefix would become one unit).
        value = quoted(column) if column == table.unit or not is_sized(type_name) else \
            shortened(quoted(column), type_name, length, characters)
        collated = f'{value} COLLATE "binary"' if type_name.upper() == "VARCHAR" else value
        return quoted(column) if collated == quoted(column) else f"{collated} AS {quoted(column)}"

    return ", ".join(copied(c, t) for c, t in table.columns)


def _string_kind(type_name: str) -> str | None:
    """``VARCHAR``, ``BLOB`` or ``JSON`` for a type whose values' length is data, else ``None``."""
    upper = type_name.upper()
    return upper if upper in ("VARCHAR", "BLOB", "JSON") else None


def is_sized(type_name: str) -> bool:
    """A value whose size is data: a LIST or MAP, a string, or a STRUCT or ARRAY holding one.

    >>> is_sized("STRUCT(a INTEGER, b VARCHAR)"), is_sized("INTEGER[3]"), is_sized("BLOB")
    (True, False, True)
    """
    if holds_lists(type_name) or _string_kind(type_name):
        return True
    pair = map_types(type_name)
    fields = struct_fields(type_name)
    if fields is not None:
        return any(is_sized(t) for t in fields.values())
    element = list_element(type_name) if pair is None else None
    return element is not None and is_sized(element)


def list_depth(type_name: str) -> int:
    """How many LIST or MAP levels a value of ``type_name`` nests, along its deepest path.

    >>> [list_depth(t) for t in ("INTEGER[][][]", "STRUCT(a INTEGER[], b MAP(VARCHAR, INTEGER[]))", "INTEGER[4]")]
    [3, 2, 0]
    """
    pair = map_types(type_name)
    if pair is not None:
        return 1 + max(list_depth(t) for t in pair)
    fields = struct_fields(type_name)
    if fields is not None:
        return max((list_depth(t) for t in fields.values()), default=0)
    element = list_element(type_name)
    if element is None:
        return 0
    return list_depth(element) + (1 if is_list(type_name) else 0)


def per_level(length: int, depth: int) -> int:
    """The most elements each LIST or MAP level may keep so that a value nesting ``depth``
    levels holds at most ``length`` innermost elements in all: the largest ``n`` with
    ``n ** depth <= length`` (at least 1).

    >>> per_level(100, 1), per_level(100, 2), per_level(100, 3), per_level(1, 5)
    (100, 10, 4, 1)
    """
    if depth <= 1:
        return length
    n = max(1, round(length ** (1 / depth)))
    while n > 1 and n ** depth > length:
        n -= 1
    while (n + 1) ** depth <= length:
        n += 1
    return n


def shortened(value: str, type_name: str, length: int, characters: int = DEFAULT_MAX_STRING_LENGTH) -> str:
    """SQL for ``value`` (of ``type_name``) cut to a size the policy bounds, in its own type.

    Lists and maps: every LIST level keeps its first ``per_level(length, depth)`` elements and
    every MAP its first as many entries, ``depth`` the type's nesting (``list_depth``), so a
    nested value holds at most ``length`` innermost elements in all (a STRUCT holds that many
    per field: the fields are the type's, not data). Strings: a VARCHAR keeps its first
    ``characters`` characters and a BLOB as many bytes, at any depth; a JSON value longer than
    that becomes NULL (a cut one would not be JSON), and so is a MAP entry whose string key is
    longer (a cut key could collide with another). Which elements and characters stay depends
    on the value alone (a stable, row-by-row transformation), and no query reads the rest: one
    unit's million-element list or 40 MB string costs a function no more than the limit.

    >>> shortened('"l"', "INTEGER[]", 3)
    'CAST(list_slice("l", 1, 3) AS INTEGER[])'
    >>> print(shortened('"l"', "INTEGER[][]", 100))
    CAST(list_transform(list_slice("l", 1, 10), lambda dp_x: CAST(list_slice(dp_x, 1, 10) AS INTEGER[])) AS INTEGER[][])
    >>> shortened('"m"', "MAP(INTEGER, INTEGER)", 2)
    'CAST(map_from_entries(list_slice(map_entries("m"), 1, 2)) AS MAP(INTEGER, INTEGER))'
    >>> shortened('"s"', "VARCHAR", 2, 5)
    'left("s", 5)'
    """
    return _cut(value, type_name, per_level(length, list_depth(type_name)), characters)


def _too_long(value: str, kind: str, characters: int) -> str:
    """SQL true when a string ``value`` of ``kind`` is longer than the limit."""
    return f"{'octet_length' if kind == 'BLOB' else 'length'}({value}) > {characters}"


def _cut(value: str, type_name: str, length: int, characters: int) -> str:
    kind = _string_kind(type_name)
    if kind == "VARCHAR":
        return f"left({value}, {characters})"
    if kind == "BLOB":
        return (f"CASE WHEN {_too_long(value, kind, characters)} "
                f"THEN unhex(left(hex({value}), {2 * characters})) ELSE {value} END")
    if kind == "JSON":
        return f"CASE WHEN {_too_long(value, kind, characters)} THEN NULL ELSE {value} END"
    if not is_sized(type_name):
        return value
    if is_list(type_name):
        element = list_element(type_name) or ""  # a LIST always has one
        cut = f"list_slice({value}, 1, {length})"
        if is_sized(element):
            cut = f"list_transform({cut}, lambda dp_x: {_cut('dp_x', element, length, characters)})"
        return f"CAST({cut} AS {type_name})"
    pair = map_types(type_name)
    if pair is not None:
        entries = f"map_entries({value})"
        key_kind = _string_kind(pair[0])
        if key_kind:
            entries = f"list_filter({entries}, lambda dp_e: NOT ({_too_long('dp_e.key', key_kind, characters)}))"
        entries = f"list_slice({entries}, 1, {length})"
        if is_sized(pair[1]):
            entries = (f"list_transform({entries}, lambda dp_e: struct_pack(key := dp_e.key, "
                       f"value := {_cut('dp_e.value', pair[1], length, characters)}))")
        return f"CAST(map_from_entries({entries}) AS {type_name})"
    fields = struct_fields(type_name)
    if fields is not None:
        packed = ", ".join(quoted(f) + ' := '
                           + _cut(f"struct_extract({value}, '{f.replace(chr(39), chr(39) * 2)}')", t, length,
                                  characters)
                           for f, t in fields.items())
        return f"CAST(CASE WHEN {value} IS NULL THEN NULL ELSE struct_pack({packed}) END AS {type_name})"
    element = list_element(type_name) or ""  # a fixed-size ARRAY holding lists or strings
    return f"CAST(list_transform({value}, lambda dp_x: {_cut('dp_x', element, length, characters)}) AS {type_name})"


def create_sql(table: BoundedTable) -> str:
    """An empty copy with the table's columns and types, so queries bind: reads no rows."""
    hidden = f", CAST(NULL AS {ROW_UNIT_TYPE}) AS {ROW_UNIT}" if table.row_level else \
        f", CAST(NULL AS BIGINT) AS {UNIT_ROWS}"
    return (f'CREATE TABLE IF NOT EXISTS {DATABASE}."{table.name}" AS '
            f"SELECT {_copied_columns(table)}{hidden}, FALSE AS {PAD} FROM {quoted_table(table.source)} LIMIT 0")


def create_raw_rows_sql(table: BoundedTable) -> str:
    """An empty row-count table (``raw_rows_sql``), so SQL reading it binds: reads no rows."""
    return (f'CREATE TABLE IF NOT EXISTS {DATABASE}."{raw_rows_name(table.name)}" AS '
            f"SELECT dp_unit, r FROM ({_raw_rows_select(table)}) LIMIT 0")


def raw_rows_sql(table: BoundedTable, batch: tuple[int, int] | None = None) -> str:
    """(Re)build a unit table's row-count table: one row per unit of the copy, ``dp_unit`` (the
    unit as the copy holds it) and ``r``, its raw row count capped at ``raw_rows_cap``.

    Counted when the copy is built (that build scans the raw table anyway), so no analyst
    query reads the raw table again: the bias report's estimate of rows beyond the limit reads
    this table, of one row per unit, instead (``dpsql.query.bias``). Row-level tables have none
    (their units never have rows beyond the limit). ``batch``: as ``fill_sql``'s (``fill_batches``).
    """
    index, count = (0, 1) if batch is None else batch
    head = (f'CREATE OR REPLACE TABLE {DATABASE}."{raw_rows_name(table.name)}" AS' if index == 0
            else f'INSERT INTO {DATABASE}."{raw_rows_name(table.name)}"')
    return f"{head}\n{_raw_rows_select(table, batch)}"


def unit_id_limit(table: BoundedTable) -> int:
    """The longest unit id (characters of a VARCHAR, bytes of a BLOB) a copy keeps: the default
    MAX STRING LENGTH, or the table's when that is larger.

    A unit is its id, so the copy never cuts it (two ids sharing a prefix would become one unit);
    but a query's per-row cost grows with the strings it reads, and an id is a string analysts
    may compare and transform. A unit whose id is longer than this is left out of the copy with
    all its rows: a function of that unit's own id, so the copy stays a per-unit (stable)
    transformation, and the loss is accuracy on absurd ids only.

    >>> unit_id_limit(BoundedTable("t", "u", 1, (("u", "VARCHAR"),), string_length=3))
    1000
    """
    return max(DEFAULT_MAX_STRING_LENGTH, table.string_length or 0)


def _unit_kept(unit: str, table: BoundedTable) -> str:
    """SQL true for the rows whose unit the copy keeps: not NULL, and an id within ``unit_id_limit``."""
    kind = _string_kind(dict(table.columns).get(table.unit, ""))
    if kind is None:
        return f"{unit} IS NOT NULL"
    return f"{unit} IS NOT NULL AND NOT ({_too_long(unit, kind, unit_id_limit(table))})"


def _raw_rows_select(table: BoundedTable, batch: tuple[int, int] | None = None) -> str:
    """The unit as the copy holds it (strings byte for byte), so units join the copy's exactly;
    the units the copy leaves out (``_unit_kept``) are left out here too."""
    unit = f'"{table.unit}"'
    copied = f'{unit} COLLATE "binary"' if dict(table.columns).get(table.unit, "").upper() == "VARCHAR" else unit
    batched = batch is not None and batch[1] > 1
    source = quoted_table(table.source) + (f" WHERE {_in_batch(unit, *batch)}" if batch and batched else "")
    return (f"SELECT dp_unit, LEAST(COUNT(*), {raw_rows_cap(table.rows_per_unit)}) AS r\n"
            f"FROM (SELECT {copied} AS dp_unit FROM {source})\n"
            f"WHERE {_unit_kept('dp_unit', table)} GROUP BY dp_unit")


def fill_sql(table: BoundedTable, batch: tuple[int, int] | None = None) -> str:
    """(Re)build the copy: each unit's first ``k`` rows in the order of a keyed hash of the
    row's exact identity, then the two padding rows.

    Units are partitioned by DuckDB's equality on the unit column, which is their exact identity:
    the policy admits only unit types whose equality is that (``equality_is_identity``), and the
    copy compares strings byte for byte. Rows are ordered by ``keyed_hash`` of the salt and each
    column's ``exact_parts``, ties broken by those parts: a function of the rows' canonical
    encodings alone, so the rows kept never depend on physical order, rowid or which of two
    DuckDB-equal values ('1 month', '30 days') was stored first; rows that tie on every part
    read back identically, so which of them is kept does not matter. ``CREATE OR REPLACE``
    swaps the whole copy in one statement. Each row carries its unit's kept row count
    (``UNIT_ROWS``), from the same partitioning.

    ``batch`` (``i``, ``n``): the statement for the units of the ``i``-th of ``n`` batches only
    (``fill_batches``); the first creates the copy, the others add to it, the last adds the padding.
    """
    if table.row_level:
        return _fill_rows_sql(table)
    parts = _row_parts(table)
    order = ", ".join([keyed_hash(f"${SALT_PARAMETER}", parts), *parts])
    unit = quoted(table.unit)
    index, count = (0, 1) if batch is None else batch
    head = (f'CREATE OR REPLACE TABLE {DATABASE}."{table.name}" AS' if index == 0
            else f'INSERT INTO {DATABASE}."{table.name}"')
    source = quoted_table(table.source) + ("" if count == 1 else f" WHERE {_in_batch(unit, index, count)}")
    return (
        f"{head}\n"
        f"SELECT * EXCLUDE (dp_n, dp_all), LEAST(dp_all, {table.rows_per_unit}) AS {UNIT_ROWS}, FALSE AS {PAD} FROM (\n"
        f"  SELECT *, ROW_NUMBER() OVER (PARTITION BY {unit} ORDER BY {order}) AS dp_n,\n"
        f"  COUNT(*) OVER (PARTITION BY {unit}) AS dp_all\n"
        f"  FROM (SELECT {_copied_columns(table)} FROM {source})\n"
        f"  WHERE {_unit_kept(unit, table)}\n"
        f") WHERE dp_n <= {table.rows_per_unit}" + (f"\n{_padding(table)}" if index == count - 1 else "")
    )


BATCH_ROWS = 8_000_000
"""About how many source rows one statement of a unit-level copy's build sorts (``fill_batches``)."""


def batch_count(rows: int | None) -> int:
    """How many statements build a unit-level copy of a table of about ``rows`` rows (``None``:
    unknown, one statement).

    >>> batch_count(None), batch_count(1000), batch_count(100_000_000)
    (1, 1, 13)
    """
    return 1 if rows is None else max(1, -(-rows // BATCH_ROWS))


def fill_batches(table: BoundedTable, count: int) -> list[str]:
    """``fill_sql`` as ``count`` statements, each for the units whose ``hash`` falls in its batch.

    The window's sort is the build's memory: DuckDB holds every row it numbers, with its keys,
    until the window is done (~5.5 GB beside a 3.3 GB copy at 100M rows). Split by unit, each
    statement sorts about ``1/count`` of the rows and the build needs that much at a time, with
    a scan of the table per statement (the filter on the unit column is applied in the scan).
    The copy is the same, row for row: every unit falls in one batch whole (``hash`` is a
    function of the unit's value, and equal units have equal values), and which rows of a unit
    are kept, and its ``UNIT_ROWS``, depend on that unit's rows alone. A row-level table is
    built in one statement (its rows are numbered by canonical text, not by unit).

    >>> table = BoundedTable("t", "u", 2, (("u", "INTEGER"),))
    >>> [s.split(chr(10))[0] for s in fill_batches(table, 2)]
    ['CREATE OR REPLACE TABLE dp_bounding."dp_bounded_t__u__2" AS', 'INSERT INTO dp_bounding."dp_bounded_t__u__2"']
    >>> fill_batches(table, 1) == [fill_sql(table)]
    True
    """
    if table.row_level or count <= 1:
        return [fill_sql(table)]
    return [fill_sql(table, (index, count)) for index in range(count)]


def raw_rows_batches(table: BoundedTable, count: int) -> list[str]:
    """``raw_rows_sql`` as ``count`` statements by the batches of ``fill_batches``: its aggregate's
    hash table (one entry per unit: ~0.5 GB at 10M units) is built a batch at a time.

    >>> table = BoundedTable("t", "u", 2, (("u", "INTEGER"),))
    >>> raw_rows_batches(table, 1) == [raw_rows_sql(table)], len(raw_rows_batches(table, 3))
    (True, 3)
    """
    if count <= 1:
        return [raw_rows_sql(table)]
    return [raw_rows_sql(table, (index, count)) for index in range(count)]


def _in_batch(unit: str, index: int, count: int) -> str:
    """SQL true for the rows whose unit is in batch ``index`` of ``count``: a function of the unit's value.

    >>> _in_batch('"u"', 1, 4)
    'hash("u") % 4 = 1'
    """
    return f"hash({unit}) % {count} = {index}"


def _fill_rows_sql(table: BoundedTable) -> str:
    """A row-level table's copy: every row with its id ``ROW_UNIT``, ids held by one row only.

    Each row's canonical text ``dp_text`` (``canonical_text`` of every column, as the copy holds
    it) is the same for two rows exactly when nothing an analyst reads back tells them apart.
    Rows are numbered 1..n among those with the same text (``PARTITION BY dp_text``: exact bytes,
    never DuckDB's equality of the values, which takes '1 month' for '30 days', 0.0 for -0.0 and,
    inside lists, nan for -nan; the rows so numbered are identical, so which gets which number
    cannot matter), and each row keeps its own values. The id is the salted MD5 of (table,
    text, number): 128 bits from a hash whose input an analyst cannot steer into a collision
    without the secret salt (DuckDB's own hash() is not collision-resistant: INTERVAL '1 month'
    and '1 microsecond' hash alike). An id held by two rows all the same is dropped with its
    rows, so the copy holds at most one row per id (a collision costs accuracy, never privacy).
    """
    names = [quoted(c) for c, _ in table.columns]
    tag = "'" + table.source.replace("'", "''") + "'"
    row_id = f"md5_number(${SALT_PARAMETER} || '|' || {tag} || '|' || dp_text || '|' || CAST(dp_i AS VARCHAR))"
    return (
        f'CREATE OR REPLACE TABLE {DATABASE}."{table.name}" AS\n'
        f"SELECT * EXCLUDE (dp_n), FALSE AS {PAD} FROM (\n"
        f"  SELECT *, COUNT(*) OVER (PARTITION BY {ROW_UNIT}) AS dp_n FROM (\n"
        f"    SELECT {', '.join(names)}, {row_id} AS {ROW_UNIT} FROM (\n"
        f"      SELECT *, ROW_NUMBER() OVER (PARTITION BY dp_text) AS dp_i FROM (\n"
        f"        SELECT *, {_row_text(table)} AS dp_text\n"
        f"        FROM (SELECT {_copied_columns(table)} FROM {quoted_table(table.source)})))))\n"
        f"WHERE dp_n = 1\n{_padding(table)}"
    )


SALT_PARAMETER = "salt"


# -- identity: the exact bytes of a value, and keyed choices over them (DESIGN.md invariant 20) --

def _floating(type_name: str) -> bool:
    return base_type(type_name).upper() in ("FLOAT", "DOUBLE", "REAL")


def union_members(type_name: str) -> dict[str, str] | None:
    """Tag -> type of a UNION type (``None``: not a UNION).

    >>> union_members("UNION(n INTEGER, s VARCHAR)")
    {'n': 'INTEGER', 's': 'VARCHAR'}
    """
    name = type_name.strip()
    if not name.upper().startswith("UNION(") or not name.endswith(")"):
        return None
    return struct_fields("STRUCT(" + name[name.index("(") + 1:])


def _lambda_name(depth: int) -> str:
    return f"dp_e{depth}"


def canonical_text(value: str, type_name: str, depth: int = 0) -> str:
    """SQL for the exact canonical encoding of ``value`` (of ``type_name``), as VARCHAR: two values
    get the same text exactly when an analyst can read back nothing that tells them apart.

    Every encoding delimits itself, so a concatenation of them splits only one way: NULL is
    ``N``; a scalar is ``<bytes>:<text>``, its text's length in bytes first; a LIST or ARRAY is
    ``[`` its elements' encodings ``]``, a STRUCT ``{`` its fields' in the type's order ``}``, a
    MAP the list of its (key, value) entries, a UNION ``<`` its tag's and its member's ``>``.
    A scalar's text is DuckDB's text of it: floats with their sign (``-0.0``, ``-nan``), an
    INTERVAL by its months, days and microseconds, which its text spells out separately, a
    string as its own bytes; a BLOB's is its hex digits (BLOB text escapes are ambiguous).
    DuckDB's own text of a nested value is not used: it writes ``['a, b']`` and ``[a, b]`` nearly
    alike, and ``to_json`` writes ``nan`` and ``-nan`` alike.

    >>> print(canonical_text('"x"', "BLOB"))
    CASE WHEN "x" IS NULL THEN 'N' ELSE CAST(strlen(hex("x")) AS VARCHAR) || ':' || hex("x") END
    >>> print(canonical_text('"l"', "INTEGER[]"))
    CASE WHEN "l" IS NULL THEN 'N' ELSE '[' || array_to_string(list_transform("l", lambda dp_e0: \
CASE WHEN dp_e0 IS NULL THEN 'N' ELSE CAST(strlen(CAST(dp_e0 AS VARCHAR)) AS VARCHAR) || ':' || \
CAST(dp_e0 AS VARCHAR) END), '') || ']' END
    """
    if list_element(type_name) is not None:
        element = _lambda_name(depth)
        inner = canonical_text(element, list_element(type_name) or "", depth + 1)
        return _nested(value, "[", f"array_to_string(list_transform({value}, lambda {element}: {inner}), '')", "]")
    pair = map_types(type_name)
    if pair is not None:
        return canonical_text(f"map_entries({value})", f"STRUCT(key {pair[0]}, value {pair[1]})[]", depth)
    fields = struct_fields(type_name)
    if fields is not None:
        inner = " || ".join(canonical_text(f"struct_extract({value}, {_string_literal(f)})", t, depth)
                            for f, t in fields.items()) or "''"
        return _nested(value, "{", inner, "}")
    members = union_members(type_name)
    if members is not None:
        cases = " ".join(f"WHEN {_string_literal(tag)} THEN "
                         f"{canonical_text(_string_literal(tag), 'VARCHAR', depth)} || "
                         f"{canonical_text(f'union_extract({value}, {_string_literal(tag)})', t, depth)}"
                         for tag, t in members.items())
        return _nested(value, "<", f"CASE union_tag({value}) {cases} END", ">")
    text = f"hex({value})" if type_name.strip().upper() == "BLOB" else f"CAST({value} AS VARCHAR)"
    return f"CASE WHEN {value} IS NULL THEN 'N' ELSE CAST(strlen({text}) AS VARCHAR) || ':' || {text} END"


def _nested(value: str, opening: str, inner: str, closing: str) -> str:
    return f"CASE WHEN {value} IS NULL THEN 'N' ELSE '{opening}' || {inner} || '{closing}' END"


def _string_literal(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


def exact_parts(value: str, type_name: str) -> list[str]:
    """SQL values whose tuple is ``value``'s exact identity, cheapest first: the value itself
    where DuckDB's equality is already exact; a float with its sign bit (``signbit`` tells -0.0
    from 0.0 and -nan from nan, which ``=`` and ``hash()`` take as equal); anything else with
    its canonical text (``canonical_text``).

    >>> exact_parts('"x"', "INTEGER"), exact_parts('"x"', "DOUBLE")
    (['"x"'], ['"x"', 'signbit("x")'])
    """
    if equality_is_identity(type_name):
        return [value]
    if _floating(type_name):
        return [value, f"signbit({value})"]
    return [binary(canonical_text(value, type_name))]


def binary(text: str) -> str:
    """``text`` compared byte for byte: a connection's ``default_collation`` (say NOCASE) would
    otherwise make DuckDB order and partition two canonical texts 'A…' and 'a…' as one."""
    return f'({text}) COLLATE "binary"'


def keyed_hash(salt: str, values: list[str]) -> str:
    """SQL for a keyed, uniform 64-bit hash of ``salt`` and ``values``: each value's ``hash()``
    folded in by XOR and the result mixed again (DuckDB's ``hash`` of a UBIGINT is a full 64-bit
    avalanche), so every input bit reaches every output bit.

    Not DuckDB's ``hash(salt, a, b)``: that combines the values' hashes with one multiply and
    XOR and no mixing after the last, so ranking small integer keys by it orders them almost
    alike whatever the salt (12 months: some dropped for 37% of units, some for 6%, where a
    uniform choice gives 17%). ``hash`` of one value is constant on DuckDB's equality classes,
    so callers pass ``exact_parts`` to key the hash on exact identities; the order it makes is
    a function of the values' canonical encodings (ties broken by those parts), never of where
    the rows are stored.

    >>> keyed_hash("$salt", ['"u"', '"m"'])
    'hash(xor(hash(xor(hash($salt), hash("u"))), hash("m")))'
    """
    folded = f"hash({salt})"
    for value in values:
        folded = f"hash(xor({folded}, hash({value})))"
    return folded


def _row_parts(table: BoundedTable) -> list[str]:
    """The exact identity of a row of ``table`` as the copy holds it: each column's ``exact_parts``."""
    return [part for c, t in table.columns for part in exact_parts(quoted(c), t)]


def _row_text(table: BoundedTable) -> str:
    """The canonical text of a whole row (``canonical_text`` of each column, concatenated)."""
    return binary(" || ".join(canonical_text(quoted(c), t) for c, t in table.columns) or "''")


def _padding(table: BoundedTable) -> str:
    """The two padding rows; a unit-level copy's ``UNIT_ROWS`` spans 0 to k there, so its
    statistics say nothing of how many rows units keep either."""
    hidden = [(ROW_UNIT, ROW_UNIT_TYPE)] if table.row_level else []
    rows = []
    for high in (False, True):
        values = [f"CAST({_extreme(t, high)} AS {t})" for _, t in (*table.columns, *hidden)]
        values += [] if table.row_level else [str(table.rows_per_unit if high else 0)]
        rows.append(f"UNION ALL SELECT {', '.join(values)}, TRUE")
    return "\n".join(rows)


_INTEGER_BITS = {"TINYINT": 8, "SMALLINT": 16, "INTEGER": 32, "BIGINT": 64, "HUGEINT": 128}
"""Bits of the signed integer types; a U prefix names the unsigned one (UHUGEINT too)."""
_TEMPORAL = ("DATE", "TIMESTAMP", "TIMESTAMP WITH TIME ZONE", "TIMESTAMP_S", "TIMESTAMP_MS", "TIMESTAMP_NS",
             "TIMESTAMPTZ_NS")


def _extreme(type_name: str, high: bool) -> str:
    """The lowest or highest value of a DuckDB type as SQL, or NULL for types without one.

    >>> _extreme("INTEGER", True), _extreme("UTINYINT", False), _extreme("DECIMAL(5,2)", False)
    ('2147483647', '0', '-999.99')
    """
    name = type_name.upper()
    if name in _INTEGER_BITS or (name.startswith("U") and name[1:] in _INTEGER_BITS):
        bits = _INTEGER_BITS[name.lstrip("U")] if name.startswith("U") else _INTEGER_BITS[name]
        if name.startswith("U"):
            return str(2**bits - 1) if high else "0"
        return str(2 ** (bits - 1) - 1) if high else str(-(2 ** (bits - 1)))
    if name.startswith("DECIMAL("):
        precision, scale = (int(p) for p in name[len("DECIMAL("):-1].split(","))
        nines = "9" * (precision - scale) + ("." + "9" * scale if scale else "")
        return nines if high else f"-{nines}"
    if name in ("FLOAT", "DOUBLE", "REAL"):
        return "'inf'" if high else "'-inf'"
    if name in _TEMPORAL:
        return "'infinity'" if high else "'-infinity'"
    if name == "TIME":
        return "'24:00:00'" if high else "'00:00:00'"
    if name == "VARCHAR":
        return "'\U0010FFFF\U0010FFFF'" if high else "''"
    if name == "BOOLEAN":
        return "TRUE" if high else "FALSE"
    return _extreme_other(type_name, high)


_OTHER_EXTREMES = {
    "UUID": ("'00000000-0000-0000-0000-000000000000'", "'ffffffff-ffff-ffff-ffff-ffffffffffff'"),
    "INTERVAL": ("'-2147483648 months -2147483648 days -9223372036854775807 microseconds'",
                 "'2147483647 months 2147483647 days 9223372036854775807 microseconds'"),
    "BLOB": ("''", "'" + "\\xFF" * 8 + "'"),
    "TIME_NS": ("'00:00:00'", "'24:00:00'"),
    "BIGNUM": ("'-" + "9" * 3000 + "'", "'" + "9" * 3000 + "'"),
    "VARINT": ("'-" + "9" * 3000 + "'", "'" + "9" * 3000 + "'"),
    "JSON": ("'" + "\t" * 8 + "0'", "'{}      '"),
}
"""Lowest and highest padding values of other types whose statistics DuckDB prunes on (an
8-byte prefix for BLOB and JSON text, as for VARCHAR; BIGNUM: 3000 digits, beyond any value a
real column holds)."""


def _extreme_other(type_name: str, high: bool) -> str:
    """Padding for ENUM, UUID, INTERVAL, BLOB, ... and, field by field and element by element,
    for STRUCT, LIST, ARRAY and MAP: DuckDB keeps statistics of every field and element, and
    prunes ``WHERE s.f = 424242`` or ``list_contains(l, 424242)`` on them just as on a column.

    >>> _extreme_other("ENUM('a', 'b''c')", True), _extreme_other("INTEGER[]", False)
    ("'b''c'", '[CAST(-2147483648 AS INTEGER)]')
    >>> print(_extreme_other('STRUCT(a DOUBLE, "b c" UNION(n INTEGER))', True))
    struct_pack("a" := CAST('inf' AS DOUBLE), "b c" := CAST(NULL AS UNION(n INTEGER)))
    """
    name = type_name.upper()
    if name in _OTHER_EXTREMES:
        return _OTHER_EXTREMES[name][high]
    values = enum_values(type_name)
    if values is not None:
        return "'" + values[-1 if high else 0].replace("'", "''") + "'" if values else "NULL"
    fields = struct_fields(type_name)
    if fields is not None:
        return "struct_pack(" + ", ".join(
            quoted(f) + f' := CAST({_extreme(t, high)} AS {t})' for f, t in fields.items()) + ")"
    element = list_element(type_name)
    if element is not None:
        inner = _extreme(element, high)
        if inner == "NULL":
            return "NULL"
        size = type_name[type_name.rindex("[") + 1:-1]
        return "[" + ", ".join([f"CAST({inner} AS {element})"] * (int(size) if size else 1)) + "]"
    pair = map_types(type_name)
    if pair is not None:
        key, value = (_extreme(t, high) for t in pair)
        return "NULL" if key == "NULL" else f"MAP {{CAST({key} AS {pair[0]}): CAST({value} AS {pair[1]})}}"
    return "NULL"
