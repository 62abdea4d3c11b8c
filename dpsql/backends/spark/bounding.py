"""The bounded copies on Spark: the same per-unit transformation as on DuckDB, in Spark SQL.

``dpsql.backends.bounding`` says what a copy is and why it is safe; this module writes the same
copy for Spark. Each copy is a temporary view over a SELECT with the salt bound as a parameter
(``:salt``), cached when a query first reads it (``dpsql.backends.spark``). Identity is exact
as on DuckDB (DESIGN.md invariant 20): units are partitioned by their own value, of a type
whose Spark equality is its identity (strings compared ``UTF8_BINARY``); rows are ordered by
``dpsql.backends.spark.types.keyed_hash`` of each column's ``exact_parts``, ties broken by those
parts; a row-level copy numbers rows within their canonical text.

What differs from DuckDB, and why:

* No padding rows. DuckDB prunes on column statistics, which two padding rows per copy blunt;
  Spark prunes a cached table batch by batch, and a padding row lands in one batch only, so
  the session runs with ``spark.sql.inMemoryColumnarStorage.partitionPruning`` off instead
  (``dpsql.backends.spark.session.PINNED``). The ``dp_pad`` column stays (always false) so that
  the queries the rewrite writes read the same columns on both engines.
* The row-level id is the salted MD5's first 124 bits as a ``DECIMAL(38, 0)`` (Spark has no
  128-bit integer): collisions are about n²/2¹²⁵ for n rows, dropped as on DuckDB.
* Strings are cut with ``left`` (characters), binary values with ``substring`` (bytes), lists
  with ``slice``; columns of types the Spark catalog does not map (``spark_types.duckdb_type``)
  are not in the catalog at all, so no copy holds them.
"""

from __future__ import annotations

from dpsql.backends.bounding import (
    UNIT_ROWS,
    BoundedTable,
    per_level,
    raw_rows_cap,
    unit_id_limit,
)
from dpsql.backends.spark.types import canonical_text, exact_parts, keyed_hash, spark_type
from dpsql.policy.model import DEFAULT_MAX_LIST_LENGTH, DEFAULT_MAX_STRING_LENGTH
from dpsql.sql.names import PAD, ROW_UNIT
from dpsql.sql.types import base_type, list_element

SALT = ":salt"
"""The salt's parameter marker in Spark SQL (bound by ``spark.sql(..., args=...)``)."""


def name_of(identifier: str) -> str:
    """One identifier quoted for Spark SQL.

    >>> name_of("a`b"), name_of("visits")
    ('`a``b`', '`visits`')
    """
    return "`" + identifier.replace("`", "``") + "`"


def table_of(key: str) -> str:
    """A catalog key (``db.table`` outside the current database) as a Spark table reference.

    >>> table_of("sales.orders")
    '`sales`.`orders`'
    """
    return ".".join(name_of(part) for part in key.split("."))


def _is_string(type_name: str) -> bool:
    return base_type(type_name).upper() == "VARCHAR" and list_element(type_name) is None


def _is_binary(type_name: str) -> bool:
    return base_type(type_name).upper() == "BLOB"


def _binary_collated(value: str, type_name: str) -> str:
    """A string compared byte for byte whatever its column's collation."""
    return f"collate({value}, 'UTF8_BINARY')" if _is_string(type_name) else value


def _cut(value: str, type_name: str, length: int, characters: int) -> str:
    """``value`` cut to the policy's sizes (``bounding.shortened``): strings to ``characters``
    characters, binary values to as many bytes, lists to ``length`` elements per level."""
    if _is_string(type_name):
        return f"left({value}, {characters})"
    if _is_binary(type_name):
        return f"substring({value}, 1, {characters})"
    element = list_element(type_name)
    if element is not None:
        cut = f"slice({value}, 1, {length})"
        if _is_string(element) or _is_binary(element) or list_element(element) is not None:
            cut = f"transform({cut}, dp_x -> {_cut('dp_x', element, length, characters)})"
        return cut
    return value


def _depth(type_name: str) -> int:
    element = list_element(type_name)
    return 0 if element is None else 1 + _depth(element)


def copied_columns(table: BoundedTable) -> list[str]:
    """Each column as the copy holds it (``bounding._copied_columns``): strings collated binary,
    sized values cut, the unit whole (it is the unit's identity)."""
    length = DEFAULT_MAX_LIST_LENGTH if table.list_length is None else table.list_length
    characters = DEFAULT_MAX_STRING_LENGTH if table.string_length is None else table.string_length
    columns = []
    for column, type_name in table.columns:
        value = name_of(column)
        if column != table.unit:
            value = _cut(value, type_name, per_level(length, _depth(type_name)), characters)
        value = _binary_collated(value, type_name)
        columns.append(value if value == name_of(column) else f"{value} AS {name_of(column)}")
    return columns


def _unit_kept(unit: str, table: BoundedTable) -> str:
    """Rows whose unit the copy keeps: not NULL, and an id within ``bounding.unit_id_limit``."""
    type_name = dict(table.columns).get(table.unit, "")
    if _is_string(type_name):
        return f"{unit} IS NOT NULL AND NOT (length({unit}) > {unit_id_limit(table)})"
    if _is_binary(type_name):
        return f"{unit} IS NOT NULL AND NOT (octet_length({unit}) > {unit_id_limit(table)})"
    return f"{unit} IS NOT NULL"


def _row_parts(table: BoundedTable) -> list[str]:
    return [part for column, type_name in table.columns for part in exact_parts(name_of(column), type_name)]


def _row_text(table: BoundedTable) -> str:
    texts = [canonical_text(name_of(column), type_name) for column, type_name in table.columns]
    return f"concat({', '.join(texts)})" if texts else "''"


def fill_select(table: BoundedTable, partitions: int | None = None) -> str:
    """The copy's rows (``bounding.fill_sql`` on DuckDB), with the salt as ``:salt``.

    ``partitions``: lay the copy out in that many partitions by the unit's hash (a unit's rows
    all in one partition), so that the per-unit steps of every query over it (the limits'
    windows, a GROUP BY of the unit) run within each partition, without a shuffle. Without it
    the copy is partitioned by the unit too (its windows need that), in as many partitions as the
    session's shuffles have.

    A unit copy carries ``dp_raw_rows``, each unit's row count capped at ``raw_rows_cap``:
    the row-count table (``raw_rows_select``) is read from the copy, not from the source again."""
    if table.row_level:
        return _fill_rows_select(table)
    names = [name_of(column) for column, _ in table.columns]
    parts = _row_parts(table)
    order = ", ".join([keyed_hash(SALT, parts), *parts])
    unit = name_of(table.unit)
    laid_out = f"/*+ REPARTITION({partitions}, {unit}) */ " if partitions else ""
    return (
        f"SELECT {', '.join(names)}, LEAST(dp_all, {table.rows_per_unit}) AS {UNIT_ROWS}, FALSE AS {PAD},\n"
        f"  LEAST(dp_all, {raw_rows_cap(table.rows_per_unit)}) AS dp_raw_rows FROM (\n"
        f"  SELECT *, ROW_NUMBER() OVER (PARTITION BY {unit} ORDER BY {order}) AS dp_n,\n"
        f"  COUNT(*) OVER (PARTITION BY {unit}) AS dp_all\n"
        f"  FROM (SELECT {laid_out}{', '.join(copied_columns(table))} FROM {table_of(table.source)}) AS dp_source\n"
        f"  WHERE {_unit_kept(unit, table)}\n"
        f") AS dp_numbered WHERE dp_n <= {table.rows_per_unit}"
    )


def _fill_rows_select(table: BoundedTable) -> str:
    """A row-level copy (``bounding._fill_rows_sql``): rows numbered within their canonical
    text, the id the salted MD5 of (table, text, number), ids held by two rows dropped."""
    names = [name_of(column) for column, _ in table.columns]
    tag = "'" + table.source.replace("\\", "\\\\").replace("'", "\\'") + "'"
    digest = f"md5(concat({SALT}, '|', {tag}, '|', dp_text, '|', CAST(dp_i AS STRING)))"
    # conv() reads at most 64 bits: the first 60 bits and the next 64, joined (< 2^124 < 10^38).
    high = f"CAST(conv(substring({digest}, 1, 15), 16, 10) AS DECIMAL(38, 0))"
    low = f"CAST(conv(substring({digest}, 16, 16), 16, 10) AS DECIMAL(38, 0))"
    row_id = f"({high} * CAST(18446744073709551616 AS DECIMAL(38, 0)) + {low})"
    listed = ", ".join(names)
    return (
        f"SELECT {listed}, {ROW_UNIT}, FALSE AS {PAD} FROM (\n"
        f"  SELECT *, COUNT(*) OVER (PARTITION BY {ROW_UNIT}) AS dp_n FROM (\n"
        f"    SELECT {listed}, {row_id} AS {ROW_UNIT} FROM (\n"
        f"      SELECT *, ROW_NUMBER() OVER (PARTITION BY dp_text ORDER BY dp_text) AS dp_i FROM (\n"
        f"        SELECT *, {_row_text(table)} AS dp_text\n"
        f"        FROM (SELECT {', '.join(copied_columns(table))} FROM {table_of(table.source)}) AS dp_source\n"
        f"      ) AS dp_texts) AS dp_indexed) AS dp_ids) AS dp_counted\n"
        f"WHERE dp_n = 1"
    )


def raw_rows_select(table: BoundedTable) -> str:
    """A unit table's row-count table (``bounding.raw_rows_sql``): each kept unit with its raw
    row count capped at ``raw_rows_cap``, read from its copy's ``dp_raw_rows`` (``fill_select``:
    the same count over the same rows, whose units the copy keeps all of), grouped by the unit the
    copy is partitioned by: no shuffle, no second read of the source."""
    unit = name_of(table.unit)
    return (f"SELECT {unit} AS dp_unit, MAX(dp_raw_rows) AS r\n"
            f"FROM {name_of(table.name)} GROUP BY {unit}")


def cast_to(value: str, type_name: str) -> str:
    """``value`` cast to the Spark type of a DuckDB type name."""
    return f"CAST({value} AS {spark_type(type_name)})"
