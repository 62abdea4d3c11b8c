"""Spark's types and values at the seam (``dpsql.backends.spark.types``, ``spark_keys``), checked on
a live local Spark against DuckDB.

The main check: for a large grid of values of every type both engines have, Spark's key text
(``key_text_sql``) read back by ``duckdb_key_text`` is exactly DuckDB's ``CAST(v AS VARCHAR)``
of the same value. Spark statements cost 0.3-1 s each, so values are batched: one statement for
all canonical texts, one for all key texts, one for the hash's uniformity.
"""

from __future__ import annotations

import math
import random
import struct
from decimal import Context, Decimal

import duckdb
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from spark import session

from dpsql.backends.spark.keys import UNTRANSLATED, _java_hex
from dpsql.backends.spark.types import (
    DUCKDB_KEYWORDS,
    _duckdb_field_name,
    canonical_text,
    duckdb_key_text,
    duckdb_type,
    exact_parts,
    key_text_sql,
    keyed_hash,
    spark_type,
    value_key,
)
from dpsql.errors import UnsupportedQuery

T = pytest.importorskip("pyspark.sql.types")


@pytest.fixture(scope="module")
def spark():
    return session()


def _duck():
    connection = duckdb.connect()
    connection.execute("SET TimeZone = 'UTC'")
    return connection


# --- types -----------------------------------------------------------------------------------

SUPPORTED = [
    (T.ByteType(), "TINYINT"), (T.ShortType(), "SMALLINT"), (T.IntegerType(), "INTEGER"), (T.LongType(), "BIGINT"),
    (T.FloatType(), "FLOAT"), (T.DoubleType(), "DOUBLE"), (T.DecimalType(38, 38), "DECIMAL(38,38)"),
    (T.DecimalType(9, 2), "DECIMAL(9,2)"), (T.StringType(), "VARCHAR"), (T.CharType(3), "VARCHAR"),
    (T.VarcharType(5), "VARCHAR"), (T.BooleanType(), "BOOLEAN"), (T.BinaryType(), "BLOB"), (T.DateType(), "DATE"),
    (T.TimestampType(), "TIMESTAMP WITH TIME ZONE"), (T.TimestampNTZType(), "TIMESTAMP"), (T.NullType(), '"NULL"'),
    (T.ArrayType(T.ArrayType(T.StringType())), "VARCHAR[][]"),
    (T.MapType(T.StringType(), T.ArrayType(T.DoubleType())), "MAP(VARCHAR, DOUBLE[])"),
    (T.StructType([T.StructField("a", T.IntegerType()), T.StructField("B c", T.StringType()),
                   T.StructField("select", T.DoubleType()), T.StructField('x"y', T.LongType()),
                   T.StructField("Ab", T.StructType([T.StructField("é", T.DateType()),
                                                     T.StructField("É", T.DateType())]))]),
     'STRUCT(a INTEGER, "B c" VARCHAR, "select" DOUBLE, "x""y" BIGINT, Ab STRUCT("é" DATE, "É" DATE))'),
]
REFUSED = [
    T.StringType("UTF8_LCASE"), T.StringType("UNICODE_CI"), T.DayTimeIntervalType(), T.YearMonthIntervalType(),
    T.CalendarIntervalType(), T.VariantType(), T.TimeType(), T.ArrayType(T.DayTimeIntervalType()),
    T.MapType(T.StringType(), T.VariantType()), T.StructType([T.StructField("a", T.IntegerType()),
                                                             T.StructField("A", T.IntegerType())]),
    T.StructType([T.StructField("", T.IntegerType())]), T.StructType([]),
]


def test_duckdb_type_names_what_duckdb_describes():
    """Each mapped name is DuckDB's own spelling: a column declared with it DESCRIBEs as it."""
    connection = _duck()
    for data_type, name in SUPPORTED:
        assert duckdb_type(data_type) == name, data_type
        connection.execute(f"CREATE OR REPLACE TABLE t (c {name})")
        assert connection.execute("DESCRIBE t").fetchone()[1] == name
    for data_type in REFUSED:
        assert duckdb_type(data_type) is None, data_type


def test_struct_field_names_are_quoted_as_duckdb_quotes_them():
    connection = _duck()
    keywords = {row[0] for row in connection.execute("SELECT keyword_name FROM duckdb_keywords()").fetchall()}
    assert keywords == DUCKDB_KEYWORDS
    others = ["Ab", "a1", "_x", "1a", "é", "a-b", "x y", 'q"', "ß", "A_B", "select1", "É"]
    for names in (sorted(keywords) + others, [k.upper() for k in sorted(keywords)], [k.title() for k in keywords]):
        written = ", ".join("'" + n.replace("'", "''") + "': 1" for n in names)
        described = connection.execute(f"SELECT typeof({{{written}}})").fetchone()[0]
        assert described == "STRUCT(" + ", ".join(f"{_duckdb_field_name(n)} INTEGER" for n in names) + ")"


@pytest.mark.spark
@pytest.mark.spark_ci
def test_spark_type_round_trips(spark):
    """``spark_type`` of each DuckDB name is a Spark type that maps back to that name."""
    names = [name for _, name in SUPPORTED if name != '"NULL"'] + ["DECIMAL", "DECIMAL(38,0)", "INTEGER[]"]
    columns = ", ".join(f"CAST(NULL AS {spark_type(name)}) AS c{i}" for i, name in enumerate(names))
    schema = spark.sql(f"SELECT {columns}").schema  # analysis only: no job
    back = [duckdb_type(field.dataType) for field in schema.fields]
    assert back == [n if n != "DECIMAL" else "DECIMAL(18,3)" for n in names]
    assert spark_type('"NULL"') == "VOID"
    for refused in ("HUGEINT", "UBIGINT", "UUID", "INTERVAL", "TIME", "INTEGER[3]", "ENUM('a')", "TIMESTAMP_NS"):
        with pytest.raises(UnsupportedQuery, match="no exact counterpart on Spark"):
            spark_type(refused)


# --- canonical texts and hashes --------------------------------------------------------------

NAN = float("nan")
NEGATIVE_NAN = struct.unpack("<d", struct.pack("<Q", 0xFFF8000000000000))[0]
F32_TENTH = struct.unpack("<f", struct.pack("<f", 0.1))[0]
LONG = "x" * 20_000 + "é"

CANONICAL_CASES = {
    "double": [0.0, -0.0, NAN, NEGATIVE_NAN, math.inf, -math.inf, 1.0, 5e-324, -5e-324, None],
    "float": [0.0, -0.0, NAN, 1.5, F32_TENTH, None],
    "string": ["a", "A", "N", "1:N", "", "a,b", "é", "e\u0301", "\x00", LONG, LONG[1:], None, "'", "\\", "\n", "🙂"],
    "binary": [b"", b"\x00", b"\xff", b"\x00\xff", b"\xff\x00", b"N", b"0:", None],
    "array<string>": [["a,b"], ["a", "b"], [], None, [None], [""], ["N"], ["1:N"], [None, None], ["a", None],
                      ["1:a"], ["1:a1:b"], ["a", "b", ""]],
    "array<double>": [[0.0], [-0.0], [NAN], [NEGATIVE_NAN], [], [None], None, [0.0, -0.0]],
    "struct<a: int, `B c`: string>": [(1, "x"), (1, None), (None, "x"), (None, None), None, (1, "x "), (11, "")],
    "struct<s: struct<a: double>, l: array<string>>": [((0.0,), ["a"]), ((-0.0,), ["a"]), (None, ["a"]),
                                                       ((None,), ["a"]), ((0.0,), []), ((0.0,), None), None],
    "struct<`é`: int, `É`: int>": [(1, 2), (2, 1), (1, None), None],
    "map<string, int>": [[("a", 1), ("b", 2)], [("b", 2), ("a", 1)], [], None, [("a", None)], [("a", 1)],
                         [("a1:", 1)]],
    "map<int, array<double>>": [[(1, [0.0])], [(1, [-0.0])], [(1, [])], [(1, None)], [(2, [0.0])]],
    "decimal(38,38)": [Decimal(0), Decimal("0.5"), Decimal("-0.5"), Decimal("1E-38"), Decimal("0." + "9" * 38), None],
    "boolean": [True, False, None],
    "bigint": [-2**63, 2**63 - 1, 0, -1, None],
    "void": [None, None],
}
"""Spark column type -> values, every two of which an analyst tells apart unless ``identity``
says they are one. A map is given by its entries in order (pyspark would pass a dict through a
Java HashMap, losing the order an analyst reads with ``map_keys(m)[0]``)."""


def identity(value):
    """What an analyst can read back of a Python value: NaNs are one value, -0.0 is not 0.0."""
    if isinstance(value, float):
        return "nan" if math.isnan(value) else value.hex()
    if isinstance(value, (list, tuple)):
        return (type(value).__name__, tuple(identity(v) for v in value))
    return (type(value).__name__, value)


def _wide(spark, columns: list[tuple[str, list]]):
    """One DataFrame with a column ``c<k>`` per (Spark type, values), shorter ones padded with NULLs:
    one statement for all of them (each costs 0.3-1 s)."""
    height = max(len(values) for _, values in columns)
    rows = [tuple(values[i] if i < len(values) else None for _, values in columns) for i in range(height)]
    return spark.createDataFrame(rows, ", ".join(f"c{k} {t}" for k, (t, _) in enumerate(columns)))


@pytest.mark.spark
@pytest.mark.spark_ci
def test_canonical_text_and_keyed_hash_tell_values_apart_exactly(spark):
    """Two values get one canonical text, and one keyed hash of their ``exact_parts``, exactly
    when an analyst cannot tell them apart; the texts are ``UTF8_BINARY`` strings."""
    columns = [(t.replace("map<", "array<struct<key: ", 1).replace(", ", ", value: ", 1) + ">" if t.startswith("map<")
                else t, values) for t, values in CANONICAL_CASES.items()]
    values = _wide(spark, columns).selectExpr(*(f"map_from_entries(c{k}) AS v{k}" if t.startswith("map<") else
                                                f"c{k} AS v{k}" for k, t in enumerate(CANONICAL_CASES)))
    types = [duckdb_type(field.dataType) for field in values.schema.fields]
    assert None not in types
    values.createOrReplaceTempView("dp_canonical")
    selected = [f"{canonical_text(f'v{k}', t)} AS t{k}, {keyed_hash('42', exact_parts(f'v{k}', t))} AS h{k}, "
                f"typeof({canonical_text(f'v{k}', t)}) AS y{k}" for k, t in enumerate(types)]
    rows = spark.sql(f"SELECT {', '.join(selected)} FROM dp_canonical").collect()
    for k, cases in enumerate(CANONICAL_CASES.values()):
        texts = [(rows[i][f"t{k}"], rows[i][f"h{k}"]) for i in range(len(cases))]
        assert rows[0][f"y{k}"] in ("string", "string collate UTF8_BINARY")
        for i, first in enumerate(cases):
            for j, second in enumerate(cases):
                same = identity(first) == identity(second)
                assert (texts[i][0] == texts[j][0]) == same, (types[k], first, second, texts[i][0])
                assert (texts[i][1] == texts[j][1]) == same, (types[k], first, second)
    assert [rows[i].t0 for i in range(3)] == ["3:0.0", "4:-0.0", "3:NaN"]


@pytest.mark.spark
@pytest.mark.spark_ci
def test_spark_facts_the_identity_rests_on(spark):
    """Why floats carry their sign, strings are cast and hashes carry NULL flags."""
    row = spark.sql(
        "SELECT xxhash64(CAST('-0.0' AS DOUBLE)) = xxhash64(0.0D) AS zero_hashes,"
        " CAST('-0.0' AS DOUBLE) = 0.0D AS zero_eq,"
        " xxhash64(NULL, 1) = xxhash64(1) AS skips_null, encode(CAST(unhex('61FF') AS STRING), 'UTF-8') AS encoded,"
        " CAST(CAST(unhex('61FF') AS STRING) AS BINARY) AS cast_bytes,"
        f" {keyed_hash('7', ['CAST(NULL AS INT)', '1'])} = {keyed_hash('7', ['1', 'CAST(NULL AS INT)'])} AS flagged,"
        " format_string('%a', CAST(NULL AS DOUBLE)) AS null_hex,"
        " CAST('NaN' AS DOUBLE) = -CAST('NaN' AS DOUBLE) AS nan_eq,"
        " CAST(-CAST('NaN' AS DOUBLE) AS STRING) AS nan_text, pow(CAST('-0.0' AS DOUBLE), -1.0D) AS inverse,"
        " atan2(CAST('-0.0' AS DOUBLE), -1.0D) > 0 AS atan2_unsigned").collect()[0]
    assert row.zero_hashes and row.zero_eq and row.skips_null and not row.flagged
    assert row.nan_eq and row.nan_text == "NaN" and row.inverse == -math.inf and row.atan2_unsigned
    assert bytes(row.encoded) == b"a\xef\xbf\xbd" and bytes(row.cast_bytes) == b"a\xff"
    assert row.null_hex == "null"  # so key_text_sql keeps NULL out of format_string
    with pytest.raises(Exception, match="MAP"):
        spark.sql("SELECT xxhash64(map(1, 2))").schema
    with pytest.raises(Exception, match="AMBIGUOUS_REFERENCE_TO_FIELDS"):  # so fields are reached by position
        spark.sql("SELECT named_struct('é', 1, 'É', 2).`é`").schema


@pytest.mark.spark
@pytest.mark.spark_ci
def test_keyed_hash_ranks_small_keys_uniformly(spark):
    """For 2,000 salts x 10 units, the month (of 12) ranked first by the keyed hash of (unit,
    month), and the 3 ranked first, are each month equally often, within 6 standard deviations."""
    salts, units, months, top = 2000, 10, 12, 3
    hashed = keyed_hash("s", exact_parts("u", "BIGINT") + exact_parts("m", "INTEGER"))
    ranked = f"array_sort(transform(sequence(1, {months}), m -> named_struct('h', {hashed}, 'm', m)))"
    rows = spark.sql(
        f"SELECT m, count_if(r = 1) AS first, count(*) AS kept FROM ("
        f"  SELECT posexplode(transform(slice({ranked}, 1, {top}), e -> e.m)) AS (r0, m), r0 + 1 AS r"
        f"  FROM (SELECT s.id * 7919 + 13 AS s, u.id AS u FROM range({salts}) s CROSS JOIN range({units}) u))"
        f" GROUP BY m").collect()
    n = salts * units
    assert sorted(row.m for row in rows) == list(range(1, months + 1))
    for count, p in [(row.first, 1 / months) for row in rows] + [(row.kept, top / months) for row in rows]:
        assert abs(count - n * p) <= 6 * math.sqrt(n * p * (1 - p)), (count, n * p)


@pytest.mark.spark
@pytest.mark.spark_ci
def test_keyed_order_is_independent_of_partitioning(spark):
    """The order the copies keep rows in (hash, then the parts) is a function of the values only."""
    rows = [(u % 10, float(v) if v % 5 else -0.0, None if v % 7 == 0 else f"s{v}") for u, v in
            zip(range(400), random.Random(3).sample(range(10_000), 400))]
    frame = spark.createDataFrame(rows, "u bigint, d double, s string")
    parts = exact_parts("d", "DOUBLE") + exact_parts("s", "VARCHAR")
    order = ", ".join([keyed_hash("42", parts), *parts])
    frame.repartition(1).createOrReplaceTempView("dp_one_partition")
    frame.repartition(7).createOrReplaceTempView("dp_seven_partitions")
    numbered = ("SELECT {} AS p, u, ROW_NUMBER() OVER (PARTITION BY u ORDER BY " + order + ") AS n, "
                "CAST(d AS STRING) AS d, s FROM {}")
    rows = spark.sql(numbered.format(1, "dp_one_partition") + " UNION ALL " +
                     numbered.format(7, "dp_seven_partitions")).collect()
    seen = [sorted(tuple(row)[1:] for row in rows if row.p == p) for p in (1, 7)]
    assert len(seen[0]) == 400
    assert seen[0] == seen[1]


# --- key texts: Spark's text read back as DuckDB's ------------------------------------------------

def _doubles(rnd: random.Random) -> list[float]:
    bits = [rnd.getrandbits(64) for _ in range(6000)] + [rnd.getrandbits(52) for _ in range(500)]  # subnormals
    values = [struct.unpack("<d", struct.pack("<Q", b))[0] for b in bits]
    values += [0.0, -0.0, math.inf, -math.inf, NAN, 5e-324, -5e-324, 2.2250738585072014e-308, 2.225073858507201e-308,
               1.7976931348623157e308, 1e22, 1e23, 0.1, 123456789012345680000.0, 1e16, 1e15, 9999999999999998.0, 1e-4,
               1e-5, 2.0 ** -44, 1e7, 1e-3, 9.999999e-4, 2e-3]
    values += [float(f"1e{e}") for e in range(-323, 309)] + [2.0 ** e for e in range(-1074, 1024, 7)]
    values += [rnd.uniform(-1e6, 1e6) for _ in range(500)] + [float(rnd.randint(-10**17, 10**17)) for _ in range(200)]
    return values


def _floats(rnd: random.Random) -> list[float]:
    values = [struct.unpack("<f", struct.pack("<I", rnd.getrandbits(32)))[0] for _ in range(3000)]
    return values + [0.0, -0.0, math.inf, -math.inf, F32_TENTH, 3.4028234663852886e38, 1.401298464324817e-45]


def _decimals(rnd: random.Random, width: int, scale: int) -> list[str]:
    top = 10 ** width - 1
    unscaled = [0, 1, -1, top, -top] + [rnd.randint(-top, top) for _ in range(100)] + \
        [rnd.choice((-1, 1)) * rnd.randint(0, 10 ** rnd.randint(0, width) - 1) for _ in range(100)]
    return [format(Decimal(u).scaleb(-scale, Context(prec=80)), "f") for u in unscaled]


def _strings(rnd: random.Random) -> list[str]:
    special = ["", "a", "'", '"', "\\", "\n", "\r\n", "\t", "\x00", "a\x00b", "é", "e\u0301", "🙂", "\u2028",
               "NULL", "null", " ", "x" * 5000, "\ufeff", "中文", "\U0010ffff"]
    alphabet = "ab'\"\\\n\t é中🙂\x01\x7f\u00a0"
    return special + ["".join(rnd.choice(alphabet) for _ in range(rnd.randint(0, 12))) for _ in range(300)]


def _micros(rnd: random.Random) -> list[int]:
    year = 31_556_952_000_000  # microseconds in a Gregorian year
    edges = [0, -62135596800000000, -62135596800000001, 253402300799999999, 253402300800000000, -62198755200000000,
             -30610224000000001, 1_500_000, 1_123_000, 1_000_001, 86_399_999_999]
    spread = [rnd.randint(-3970 * year, 10_030 * year) for _ in range(1500)]
    rounded = [m - m % 1000 for m in spread[:300]] + [m - m % 1_000_000 for m in spread[300:600]]
    return edges + spread + rounded


def _key_cases(rnd: random.Random) -> dict[str, tuple[str, list, str]]:
    """DuckDB type -> (Spark column type, values, DuckDB SQL of a value from its parameter ``x``)."""
    days = [0, -1, -719162, -719163, -719528, -719893, 2932896, 2932897, 2_000_000_000, -2_000_000_000,
            -354285, -354286] + [rnd.randint(-1_000_000, 4_000_000) for _ in range(1000)]
    micros = _micros(rnd)
    cases = {
        "TINYINT": ("tinyint", [-128, 127, 0, -1] + [rnd.randint(-128, 127) for _ in range(50)], "x::TINYINT"),
        "SMALLINT": ("smallint", [-2**15, 2**15 - 1, 0], "x::SMALLINT"),
        "INTEGER": ("int", [-2**31, 2**31 - 1, 0, 7], "x::INTEGER"),
        "BIGINT": ("bigint", [-2**63, 2**63 - 1, 0] + [rnd.randint(-2**63, 2**63 - 1) for _ in range(100)],
                   "x::BIGINT"),
        "BOOLEAN": ("boolean", [True, False], "x::BOOLEAN"),
        "DOUBLE": ("double", _doubles(rnd), "x::DOUBLE"),
        "FLOAT": ("float", _floats(rnd), "x::FLOAT::DOUBLE"),
        "VARCHAR": ("string", _strings(rnd), "x::VARCHAR"),
        "DATE": ("bigint", days, "DATE '1970-01-01' + x::INTEGER"),
        "TIMESTAMP": ("bigint", micros, "make_timestamp(x::BIGINT)"),
        "TIMESTAMP WITH TIME ZONE": ("bigint", micros, "make_timestamp(x::BIGINT)::TIMESTAMPTZ"),
    }
    for width, scale in [(38, 38), (38, 0), (38, 10), (4, 4), (9, 2), (18, 3), (1, 0), (5, 1)]:
        cases[f"DECIMAL({width},{scale})"] = (f"decimal({width},{scale})", _decimals(rnd, width, scale),
                                             f"x::DECIMAL({width},{scale})")
    return cases


_SPARK_VALUE = {"DATE": "date_from_unix_date(CAST({} AS INT))", "TIMESTAMP WITH TIME ZONE": "timestamp_micros({})",
                "TIMESTAMP": "CAST(timestamp_micros({}) AS TIMESTAMP_NTZ)"}
"""Temporal values travel as integers (days, microseconds) and are made on each engine alike."""


@pytest.mark.spark
@pytest.mark.spark_ci
def test_key_texts_read_back_as_duckdb_texts(spark):
    """For every value of the grid, ``duckdb_key_text`` of Spark's key text is DuckDB's
    ``CAST(v AS VARCHAR)`` of the same value, the one documented difference aside (a NaN
    whose sign bit is set, which DuckDB writes ``-nan`` and Spark cannot read)."""
    cases = _key_cases(random.Random(11))
    columns = [(column, [Decimal(v) for v in values] if column.startswith("decimal") else values)
               for column, values, _ in cases.values()]
    _wide(spark, columns).createOrReplaceTempView("dp_keys")
    selected = [f"{key_text_sql(_SPARK_VALUE.get(t, '{}').format(f'c{k}'), t)} AS k{k}" for k, t in enumerate(cases)]
    rows = spark.sql(f"SELECT {', '.join(selected)} FROM dp_keys").collect()
    fetched = {(k, i): row[k] for i, row in enumerate(rows) for k in range(len(cases))}
    connection = _duck()
    checked, wrong = 0, []
    for k, (type_name, (column, values, duck_value)) in enumerate(cases.items()):
        parameter = {"double": "DOUBLE[]", "float": "FLOAT[]", "string": "VARCHAR[]", "boolean": "BOOLEAN[]"}.get(
            column, "VARCHAR[]" if column.startswith("decimal") else "BIGINT[]")
        expected = connection.execute(f"SELECT list_transform(?::{parameter}, lambda x: CAST({duck_value} AS VARCHAR))",
                                      [values]).fetchone()[0]
        for i, text in enumerate(expected):
            raw = fetched[k, i]
            assert isinstance(raw, (bytes, bytearray))
            mine = duckdb_key_text(raw, type_name)
            if text == "-nan":
                text = "nan"
            checked += 1
            if mine != text:
                wrong.append((type_name, values[i], bytes(raw), mine, text))
    assert not wrong, (len(wrong), wrong[:10])
    assert checked > 15_000


@pytest.mark.spark
@pytest.mark.spark_ci
def test_value_keys_are_what_duckdb_fetches(spark):
    """A value-form key collected from Spark, normalised by ``value_key``, is DuckDB's fetched
    value: equal, and written alike (a DECIMAL's scale is its type's)."""
    cases = {"DECIMAL(38,38)": ["0", "0.5", "-0." + "0" * 37 + "1"], "DECIMAL(9,2)": ["0", "100", "-0.01", "1234567.5"],
             "DECIMAL(18,0)": ["0", "-5"], "DECIMAL(38,10)": ["0.0000001", "12"], "BLOB": [b"", b"\x00\xff"],
             "BIGINT": [-2**63], "TINYINT": [-128], "BOOLEAN": [True], "VARCHAR": ["é\x00"], "DOUBLE": [-0.0],
             "FLOAT": [F32_TENTH]}
    connection = _duck()
    names = list(cases)
    python = {t: [Decimal(v) if t.startswith("DECIMAL") else v for v in values] for t, values in cases.items()}
    rows = [tuple(python[t][i] if i < len(python[t]) else None for t in names) for i in range(4)]
    schema = ", ".join(f"c{k} {spark_type(t)}" for k, t in enumerate(names))
    collected = spark.createDataFrame(rows, schema).collect()
    for k, type_name in enumerate(names):
        for i, value in enumerate(cases[type_name]):
            want = connection.execute(f"SELECT ?::{type_name}", [value]).fetchone()[0]
            got = value_key(collected[i][k], type_name)
            assert got == want and repr(got) == repr(want), (type_name, collected[i][k], want)
    assert value_key(bytearray(b"\x00"), "BLOB") == b"\x00" and value_key(None, "DECIMAL(9,2)") is None


# --- totality and injectivity of the read-back, on any bytes ---------------------------------------

TEXT_TYPES = ["DOUBLE", "FLOAT", "DATE", "TIMESTAMP", "TIMESTAMP WITH TIME ZONE", "DECIMAL(4,4)", "DECIMAL(9,2)",
              "DECIMAL(38,0)", "BIGINT", "BOOLEAN", "VARCHAR"]
NEAR = ["0x1.0p0", "-0x0.0p0", "0x0.0p0", "NaN", "Infinity", "-Infinity", "0x0.0000000000001p-1022", "0x1.8p1",
        "0000-12-31", "-0001-01-01", "+10000-01-01", "2024-02-29", "2024-01-31 10:00:00.5", "0001-01-01 00:00:00",
        "0.5000", "-0.50", "12.00", "0", "-1", "true", "false"]


def _edits(text: str, data) -> str:
    """A small edit of a valid text: a character replaced, inserted or removed."""
    position = data.draw(st.integers(0, len(text)))
    char = data.draw(st.sampled_from("0123456789abcdefpx.+-: E0"))
    return data.draw(st.sampled_from([text[:position] + char + text[position + 1:], text[:position] + char +
                                      text[position:], text[:position] + text[position + 1:]]))


@settings(max_examples=400, deadline=None)
@given(st.binary(max_size=40), st.binary(max_size=40), st.sampled_from(TEXT_TYPES))
def test_duckdb_key_text_is_total_and_injective_on_any_bytes(first, second, type_name):
    one, two = duckdb_key_text(first, type_name), duckdb_key_text(second, type_name)
    assert isinstance(one, str) and isinstance(two, str)
    assert (one == two) == (first == second)


@settings(max_examples=300, deadline=None)
@given(st.data(), st.sampled_from(NEAR), st.sampled_from(NEAR), st.sampled_from(TEXT_TYPES))
def test_duckdb_key_text_is_injective_near_valid_texts(data, first, second, type_name):
    first, second = _edits(first, data), data.draw(st.sampled_from([second, _edits(second, data)]))
    one, two = duckdb_key_text(first.encode(), type_name), duckdb_key_text(second.encode(), type_name)
    assert (one == two) == (first == second), (first, second, one)


def test_untranslated_texts_are_marked_and_distinct():
    assert duckdb_key_text(b"1.0", "DOUBLE") == UNTRANSLATED + "1.0"  # Java's decimal text is not the key text
    assert duckdb_key_text(b"0x1.00p0", "DOUBLE") == UNTRANSLATED + "0x1.00p0"  # not Java's spelling
    assert duckdb_key_text(b"2023-02-29", "DATE") == UNTRANSLATED + "2023-02-29"
    assert duckdb_key_text(b"-0.00", "DECIMAL(9,2)") == UNTRANSLATED + "-0.00"
    assert duckdb_key_text(b"2024-01-01 10:00:00.50", "TIMESTAMP") == UNTRANSLATED + "2024-01-01 10:00:00.50"
    assert duckdb_key_text(b"\xff", "VARCHAR") == "\udcff" and duckdb_key_text(None, "DATE") is None
    assert duckdb_key_text(bytearray(b"\xff\xfe"), "DATE") == UNTRANSLATED + "\udcff\udcfe"


def test_java_hex_matches_float_hex_reading():
    """``_java_hex`` spells each double once, and reads back as it (Python's reading of Java's form)."""
    rnd = random.Random(5)
    for bits in [rnd.getrandbits(64) for _ in range(20_000)] + [0, 1, 2**52 - 1, 2**52, 2**63]:
        value = struct.unpack("<Q", struct.pack("<Q", bits))[0]
        x = struct.unpack("<d", struct.pack("<Q", value))[0]
        if not math.isnan(x):
            back = float.fromhex(_java_hex(x))
            assert back == x and math.copysign(1, back) == math.copysign(1, x)
