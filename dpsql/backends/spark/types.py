"""Spark's types and values at the seam: DuckDB type names in, Spark SQL text out.

The rest of dpsql (binding, analysis, check) speaks DuckDB type names; the Spark backend
(``dpsql.backends.spark``) translates at the seam with the pure functions here:

* ``duckdb_type`` / ``spark_type``: a pyspark ``DataType`` as the DuckDB type that holds exactly
  its values, and back as Spark SQL for a ``CAST``. A Spark type with no exact DuckDB counterpart
  (intervals, VARIANT, TIME, geometry, strings under another collation than ``UTF8_BINARY``) maps
  to ``None``: the backend leaves such columns out of the catalog.
* ``canonical_text``, ``exact_parts``, ``keyed_hash``: the identity of a value, as Spark SQL, for
  the bounded copies (``dpsql.backends.bounding`` on DuckDB): equal exactly when nothing an
  analyst reads back on Spark tells the values apart.
* ``key_text_sql``: a text-form GROUP BY key (``dpsql.backends.keys``) as Spark writes it; its
  reading back as DuckDB's text of the same value (``duckdb_key_text``), and a value-form key's
  (``value_key``), are ``dpsql.backends.spark.keys``, re-exported here.

Spark facts these rest on (pyspark 4.3, Java 17; checked in ``tests/test_spark_types.py``):
``-0.0 = 0.0`` and ``xxhash64`` hashes them alike, but ``CAST(-0.0 AS STRING)`` is ``'-0.0'``;
every NaN is one value for ``=``, hashing, ordering and text (its sign is readable only by Java
reflection, which dpsql never renders); ``xxhash64`` skips NULL arguments and refuses MAPs;
strings compare byte for byte under ``UTF8_BINARY`` only; a struct's fields resolve by name
case-insensitively (``spark.sql.caseSensitive`` is pinned false), so fields are reached by
position instead; a TIMESTAMP is an instant written in the session time zone, pinned to UTC.
"""

from __future__ import annotations

__all__ = ["canonical_text", "duckdb_key_text", "duckdb_type", "exact_parts", "key_text_sql", "keyed_hash",
           "spark_type", "value_key"]

from dpsql.backends.spark.keys import duckdb_key_text, value_key
from dpsql.errors import UnsupportedQuery
from dpsql.sql.types import base_type, decimal_shape, list_element, map_types, struct_fields

_ATOMIC = {
    "ByteType": "TINYINT", "ShortType": "SMALLINT", "IntegerType": "INTEGER", "LongType": "BIGINT",
    "FloatType": "FLOAT", "DoubleType": "DOUBLE", "BooleanType": "BOOLEAN", "BinaryType": "BLOB",
    "DateType": "DATE", "TimestampType": "TIMESTAMP WITH TIME ZONE", "TimestampNTZType": "TIMESTAMP",
    "CharType": "VARCHAR", "VarcharType": "VARCHAR", "NullType": '"NULL"',
}
"""pyspark atomic type class -> DuckDB type name. A Spark TIMESTAMP is an instant (shown in the
session zone, pinned to UTC), DuckDB's TIMESTAMP WITH TIME ZONE; TIMESTAMP_NTZ is a wall-clock
TIMESTAMP. CHAR(n) and VARCHAR(n) values are strings (CHAR's padding is part of the value read)."""


def duckdb_type(data_type) -> str | None:
    """The DuckDB type name holding exactly the values of a pyspark ``DataType`` (as
    ``spark.table(t).schema`` gives it), written as DuckDB's ``DESCRIBE`` writes it; ``None``
    for a type dpsql does not support on Spark (module docstring).

    Dispatched on the class name, so that pyspark is imported only by the code that has a session.

    >>> from pyspark.sql import types as T
    >>> duckdb_type(T.DecimalType(9, 2)), duckdb_type(T.TimestampType()), duckdb_type(T.StringType("UTF8_LCASE"))
    ('DECIMAL(9,2)', 'TIMESTAMP WITH TIME ZONE', None)
    >>> duckdb_type(T.StructType([T.StructField("a", T.ArrayType(T.LongType())), T.StructField("Order", T.DateType())]))
    'STRUCT(a BIGINT[], "Order" DATE)'
    >>> duckdb_type(T.MapType(T.StringType(), T.DayTimeIntervalType())) is None
    True
    """
    kind = type(data_type).__name__
    if kind in _ATOMIC:
        return _ATOMIC[kind]
    if kind == "StringType":
        return "VARCHAR" if getattr(data_type, "collation", "UTF8_BINARY") == "UTF8_BINARY" else None
    if kind == "DecimalType":
        precision, scale = data_type.precision, data_type.scale
        return f"DECIMAL({precision},{scale})" if 0 <= scale <= precision <= 38 and precision > 0 else None
    if kind == "ArrayType":
        element = duckdb_type(data_type.elementType)
        return None if element is None else element + "[]"
    if kind == "MapType":
        key, value = duckdb_type(data_type.keyType), duckdb_type(data_type.valueType)
        return None if key is None or value is None else f"MAP({key}, {value})"
    if kind == "StructType":
        return _duckdb_struct([(field.name, field.dataType) for field in data_type.fields])
    return None


def _duckdb_struct(fields: list) -> str | None:
    """``STRUCT(...)`` as DuckDB writes it, or ``None`` when DuckDB cannot hold it: no fields, a
    field of an unsupported type, an empty field name, or two names equal up to ASCII case
    (DuckDB's struct field names are case-insensitive; Spark allows both ``a`` and ``A``)."""
    if not fields:
        return None
    written, seen = [], set()
    for name, data_type in fields:
        field_type = duckdb_type(data_type)
        folded = _ascii_lower(name)
        if field_type is None or not name or folded in seen:
            return None
        seen.add(folded)
        written.append(f"{_duckdb_field_name(name)} {field_type}")
    return f"STRUCT({', '.join(written)})"


def _ascii_lower(name: str) -> str:
    return "".join(chr(ord(c) + 32) if "A" <= c <= "Z" else c for c in name)


def _duckdb_field_name(name: str) -> str:
    """A struct field name as DuckDB's ``DESCRIBE`` writes it: bare when it is a plain identifier
    that is no DuckDB keyword of any category (``Ab``, ``a1``), else double-quoted (``"select"``,
    ``"B c"``, ``"é"``); found over every keyword and case, ``tests/test_spark_types.py``."""
    plain = name[:1].isascii() and (name[0].isalpha() or name[0] == "_") and all(
        c.isascii() and (c.isalnum() or c == "_") for c in name)
    if plain and _ascii_lower(name) not in DUCKDB_KEYWORDS:
        return name
    return '"' + name.replace('"', '""') + '"'


_SPARK_SCALARS = {
    "TINYINT": "TINYINT", "INT1": "TINYINT", "SMALLINT": "SMALLINT", "INT2": "SMALLINT", "SHORT": "SMALLINT",
    "INTEGER": "INT", "INT": "INT", "INT4": "INT", "SIGNED": "INT", "BIGINT": "BIGINT", "INT8": "BIGINT",
    "LONG": "BIGINT", "FLOAT": "FLOAT", "FLOAT4": "FLOAT", "REAL": "FLOAT", "DOUBLE": "DOUBLE",
    "FLOAT8": "DOUBLE", "BOOLEAN": "BOOLEAN", "BOOL": "BOOLEAN", "LOGICAL": "BOOLEAN", "BLOB": "BINARY",
    "BYTEA": "BINARY", "BINARY": "BINARY", "VARBINARY": "BINARY", "VARCHAR": "STRING", "TEXT": "STRING",
    "STRING": "STRING", "CHAR": "STRING", "BPCHAR": "STRING", "DATE": "DATE", "TIMESTAMP": "TIMESTAMP_NTZ",
    "DATETIME": "TIMESTAMP_NTZ", "TIMESTAMP WITH TIME ZONE": "TIMESTAMP", "TIMESTAMPTZ": "TIMESTAMP",
    '"NULL"': "VOID", "NULL": "VOID",
}
"""DuckDB type names (and DuckDB's aliases of them) -> Spark SQL type names. A DuckDB VARCHAR(n)
ignores n, so it is STRING, never Spark's length-checking VARCHAR(n)."""


def spark_type(type_name: str) -> str:
    """The Spark SQL type of a DuckDB type name, for ``CAST(x AS ...)``; a type with no exact
    Spark counterpart (HUGEINT, unsigned integers, UUID, INTERVAL, TIME, fixed-size arrays, ...)
    is refused.

    >>> spark_type("DECIMAL"), spark_type("TIMESTAMP"), spark_type('STRUCT(a INTEGER[], "b c" MAP(VARCHAR, BLOB))')
    ('DECIMAL(18,3)', 'TIMESTAMP_NTZ', 'STRUCT<`a`: ARRAY<INT>, `b c`: MAP<STRING, BINARY>>')
    """
    name = type_name.strip()
    if name.endswith("[]"):
        return f"ARRAY<{spark_type(name[:-2])}>"
    pair = map_types(name)
    if pair is not None:
        return f"MAP<{spark_type(pair[0])}, {spark_type(pair[1])}>"
    fields = struct_fields(name)
    if fields is not None:
        listed = ", ".join(f"`{field.replace('`', '``')}`: {spark_type(t)}" for field, t in fields.items())
        return f"STRUCT<{listed}>"
    base = base_type(name)
    if base in ("DECIMAL", "NUMERIC"):
        precision, scale = decimal_shape(name)
        return f"DECIMAL({precision},{scale})"
    if base in _STRINGS:
        return "STRING"
    if base in _SPARK_SCALARS and "(" not in name:
        return _SPARK_SCALARS[base]
    raise UnsupportedQuery(f"values of type {type_name} have no exact counterpart on Spark",
                           hint="cast to BIGINT, DECIMAL, DOUBLE, VARCHAR, DATE or TIMESTAMP instead")


# --- identity: canonical texts, exact parts, keyed hashes ---------------------------------------

def canonical_text(value: str, type_name: str, depth: int = 0) -> str:
    """Spark SQL for the exact canonical encoding of ``value`` (of DuckDB type ``type_name``) as
    a ``UTF8_BINARY`` STRING: two values get the same text exactly when nothing an analyst can
    read back on Spark tells them apart (``bounding.canonical_text`` is DuckDB's).

    Every encoding delimits itself, so a concatenation of them splits only one way: NULL is
    ``N``; a scalar ``<bytes>:<text>``, its text's length in bytes first; an array ``[`` its
    elements' encodings ``]``; a struct ``{`` its fields' in the type's order ``}``; a map the
    array of its entries, in their order (an analyst reads it with ``map_keys(m)[0]``). A scalar's
    text: a string's own bytes (collated binary), a BINARY's hex digits, anything else Spark's
    ``CAST(x AS STRING)`` (floats keep the sign of zero; every NaN is ``NaN``; a TIMESTAMP is
    written in UTC, the pinned session zone). Struct fields are reached by position (a cast to
    ``STRUCT<dp_f0: ..>``): by name, Spark resolves ``a`` and ``A`` alike.

    >>> print(canonical_text("x", "BLOB"))
    collate(CASE WHEN x IS NULL THEN 'N' ELSE concat(CAST(octet_length(hex(x)) AS STRING), ':', hex(x)) END, \
'UTF8_BINARY')
    >>> print(canonical_text("l", "DOUBLE[]", depth=1))
    CASE WHEN l IS NULL THEN 'N' ELSE concat('[', array_join(transform(l, dp_e1 -> CASE WHEN dp_e1 IS NULL \
THEN 'N' ELSE concat(CAST(octet_length(CAST(dp_e1 AS STRING)) AS STRING), ':', CAST(dp_e1 AS STRING)) END), \
''), ']') END
    """
    text = _canonical(value, type_name.strip(), depth)
    return f"collate({text}, 'UTF8_BINARY')" if depth == 0 else text


def _canonical(value: str, type_name: str, depth: int) -> str:
    element = list_element(type_name)
    if element is not None:
        name = f"dp_e{depth}"
        inner = _canonical(name, element, depth + 1)
        return _nested(value, "[", f"array_join(transform({value}, {name} -> {inner}), '')", "]")
    pair = map_types(type_name)
    if pair is not None:
        return _canonical(f"map_entries({value})", f"STRUCT(key {pair[0]}, value {pair[1]})[]", depth)
    fields = struct_fields(type_name)
    if fields:  # DuckDB has no struct without fields
        positional = ", ".join(f"dp_f{i}: {spark_type(t)}" for i, t in enumerate(fields.values()))
        cast = f"CAST({value} AS STRUCT<{positional}>)"
        inner = ", ".join(_canonical(f"{cast}.dp_f{i}", t, depth) for i, t in enumerate(fields.values()))
        return _nested(value, "{", inner, "}")
    base = base_type(type_name)
    if base in ("NULL", '"NULL"'):
        return "'N'"
    if base in ("BLOB", "BYTEA", "BINARY", "VARBINARY"):
        text = f"hex({value})"
    elif base in _STRINGS:
        text = f"collate({value}, 'UTF8_BINARY')"
    else:
        text = f"CAST({value} AS STRING)"
    return f"CASE WHEN {value} IS NULL THEN 'N' ELSE concat(CAST(octet_length({text}) AS STRING), ':', {text}) END"


def _nested(value: str, opening: str, inner: str, closing: str) -> str:
    return f"CASE WHEN {value} IS NULL THEN 'N' ELSE concat('{opening}', {inner}, '{closing}') END"


_STRINGS = frozenset({"VARCHAR", "TEXT", "STRING", "CHAR", "BPCHAR"})
_FLOATS = frozenset({"FLOAT", "FLOAT4", "REAL", "DOUBLE", "FLOAT8"})
_IDENTITY = frozenset({
    "TINYINT", "SMALLINT", "INTEGER", "INT", "BIGINT", "DECIMAL", "NUMERIC", "BOOLEAN", "BLOB", "DATE",
    "TIMESTAMP", "TIMESTAMP WITH TIME ZONE", "TIMESTAMPTZ"})
"""Base types whose Spark ``=`` and ``xxhash64`` are exact identity: integers; DECIMAL (one scale
per type, hashed by its unscaled value); BOOLEAN; BINARY (bytes); DATE; TIMESTAMP_NTZ and
TIMESTAMP (microseconds; an instant is written in the one pinned zone)."""


def exact_parts(value: str, type_name: str) -> list[str]:
    """Spark SQL values whose tuple is ``value``'s exact identity, to hash and order by: the
    value itself where Spark's ``=`` and ``xxhash64`` are exact (``_IDENTITY``); a string
    collated binary (under ``UTF8_LCASE`` 'a' = 'A' and they hash alike); a float with its sign
    (``-0.0 = 0.0`` and ``xxhash64`` hashes them alike; ``pow(-0.0, -1)`` is -Infinity, so the
    sign is ``pow(x, -1) < 0``, false for every NaN, which Spark cannot tell apart anyway);
    anything else its ``canonical_text``.

    >>> exact_parts("x", "BIGINT"), exact_parts("x", "VARCHAR"), exact_parts("x", "DOUBLE")
    (['x'], ["collate(x, 'UTF8_BINARY')"], ['x', 'pow(x, -1.0D) < 0'])
    """
    base = base_type(type_name)  # a list's is its whole name: none of these
    if base in _IDENTITY:
        return [value]
    if base in _STRINGS:
        return [f"collate({value}, 'UTF8_BINARY')"]
    if base in _FLOATS:
        return [value, f"pow({value}, -1.0D) < 0"]
    return [canonical_text(value, type_name)]


def keyed_hash(salt: str, parts: list[str]) -> str:
    """Spark SQL for a keyed, uniform 64-bit hash of ``salt`` and ``parts`` (``exact_parts``).

    ``xxhash64(a, b, ...)`` hashes each argument seeded with the hash of those before it, so the
    salt, first, keys every later step with a fresh 64-bit seed and the result is a full xxHash64
    avalanche (``tests/test_spark_types.py``: ranking 12 months by it picks each as often). It
    skips NULL arguments, so each part is followed by its NULL flag: ``(NULL, 1)`` and
    ``(1, NULL)`` would otherwise hash alike. It refuses MAPs: pass ``exact_parts``.

    >>> keyed_hash(":salt", ["u", "m"])
    'xxhash64(:salt, u, (u) IS NULL, m, (m) IS NULL)'
    """
    arguments = [salt] + [item for part in parts for item in (part, f"({part}) IS NULL")]
    return f"xxhash64({', '.join(arguments)})"


# --- key texts ---------------------------------------------------------------------------------

def key_text_sql(value: str, type_name: str) -> str:
    """Spark SQL for a text-form key's bytes (``dpsql.backends.keys``): what Spark groups by and
    ``spark_keys.duckdb_key_text`` reads back as DuckDB's text of the same value.

    Spark's own ``CAST(v AS STRING)``, as BINARY, for most types (a TIMESTAMP in UTC, the pinned
    zone). Two need care. A string is cast to BINARY itself: ``encode(s, 'UTF-8')`` turns every
    invalid byte into U+FFFD, merging keys. A float is written in Java's hexadecimal form
    (``format_string('%a', ..)``, after widening a FLOAT exactly): ``CAST(d AS STRING)`` is Java's
    ``Double.toString``, which on JDK 17 is not always the shortest digits, so its reading back
    could not tell Spark's text from another spelling of the same double; the hexadecimal form
    is exact and has one spelling per double.

    >>> print(key_text_sql("d", "DOUBLE"))
    CASE WHEN d IS NULL THEN NULL ELSE CAST(format_string('%a', CAST(d AS DOUBLE)) AS BINARY) END
    >>> key_text_sql("s", "VARCHAR"), key_text_sql("t", "DATE")
    ('CAST(s AS BINARY)', 'CAST(CAST(t AS STRING) AS BINARY)')
    """
    base = base_type(type_name)
    if base in _STRINGS:
        return f"CAST({value} AS BINARY)"
    if base in _FLOATS:
        written = f"format_string('%a', CAST({value} AS DOUBLE))"
        return f"CASE WHEN {value} IS NULL THEN NULL ELSE CAST({written} AS BINARY) END"
    return f"CAST(CAST({value} AS STRING) AS BINARY)"


DUCKDB_KEYWORDS = frozenset("""
    abort absolute access action add admin after aggregate all also alter always analyse analyze and anti any approx
    array as asc asof assertion assignment asymmetric at attach attribute authorization backward before begin
    between bigint binary bit boolean both by cache call called cascade cascaded case cast catalog centuries century
    chain char character characteristics check checkpoint class close cluster coalesce collate collation column
    columns columns comment comments commit committed compression concurrently configuration conflict connect
    connection constraint constraints content continue conversion copy cost create cross csv cube current cursor
    cycle data database day days deallocate dec decade decades decimal declare default defaults deferrable deferred
    definer delete delimiter delimiters depends desc describe destroy detach dictionary disable discard disconnect
    distance distinct do document domain double drop each else enable encoding encrypted end enum error escape event
    exact except exclude excluding exclusive execute exists explain export export_state extension extensions
    external extract false family fetch filter first float following for force foreign forward freeze from full
    function functions generated generated glob global grant granted group grouping grouping_id groups handler
    having header hold hour hours identity if ignore ilike immediate immutable implicit import in include including
    increment index indexes inherit inherits initially inline inner inout input insensitive insert install instead
    int integer intersect interval into invoker is isnull isolation join json key label lambda language large last
    lateral leading leakproof left level like limit listen load local location lock locked logged macro map map
    mapping match matched materialized maxvalue merge method microsecond microseconds millennia millennium
    millisecond milliseconds minute minutes minvalue mode month months move name names national natural nchar
    nearest new next no none not nothing notify notnull nowait null nullif nulls numeric object of off offset oids
    old on only operator option options or order ordinality others out outer over overlaps overlay overriding owned
    owner parallel parser partial partition partitioned passing password percent persistent pivot pivot_longer
    pivot_wider placing plans policy position positional pragma preceding precision prepare prepared preserve
    primary prior privileges procedural procedure program publication qualify quarter quarters quote range read real
    reassign recheck recursive ref references referencing refresh register reindex relative release rename
    repeatable replace replica reset resource resources respect restart restrict returning returns revoke right role
    rollback rollup row rows rule sample savepoint schema schemas scope scroll search second seconds secret secure
    security select semi sequence sequences serializable server session set setof sets share show similar similarity
    simple skip smallint snapshot some sorted source sql stable standalone start statement statistics stdin stdout
    storage stored strict strip struct struct subscription substring summarize symmetric sysid system table tables
    tablesample tablespace target temp template temporary text then ties time timestamp to trailing transaction
    transform treat trigger trim true truncate trusted try_cast try_cast tuple tuple type types unbounded
    uncommitted unencrypted union unique unknown unlisten unlogged unpack unpivot until update use user using vacuum
    valid validate validator value values varchar variable variadic varying verbose version view views virtual
    volatile week weeks when where whitespace window with within without work wrapper write xml xmlattributes
    xmlconcat xmlelement xmlexists xmlforest xmlnamespaces xmlparse xmlpi xmlroot xmlserialize xmltable year years
    yes zone
""".split())
"""Every DuckDB keyword, of any category (``SELECT keyword_name FROM duckdb_keywords()``, DuckDB
2.0): a struct field of one of these names is quoted by ``DESCRIBE`` (``_duckdb_field_name``)."""
