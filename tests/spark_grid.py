"""A differential harness: an expression on a grid of values, on DuckDB and on Spark, compared.

``Grid`` builds the same typed table on both engines (every combination of the grid values of
its columns, one row id ``i``), renders an analyst expression as dpsql would — DuckDB's
``TRY(...)`` (``dpsql.backends.render``) on one side, ``total`` and ``agree``
(``dpsql.backends.spark.render``) on the other — runs all of a table's expressions in one
statement per engine, and returns every difference: values compared exactly (floats bit for
bit, NaN as NaN; DECIMALs with their scale; dates as days and timestamps as microseconds since
1970, so that years past 9999 compare too), and each expression's type (DuckDB's ``typeof``
against dpsql's inference and against Spark's result type).
"""

from __future__ import annotations

import datetime
import itertools
import math
import struct
from decimal import Decimal

import duckdb

from dpsql.backends.render import render
from dpsql.backends.spark.check import check_spark
from dpsql.backends.spark.infer import duckdb_type
from dpsql.backends.spark.render import agree, total
from dpsql.backends.spark.types import duckdb_type as spark_to_duckdb
from dpsql.sql.parse import parse_query
from dpsql.sql.pieces import Total

UTC = datetime.timezone.utc
NAN, INF = float("nan"), float("inf")

GRIDS = {
    "BOOLEAN": [None, True, False],
    "TINYINT": [None, 0, 1, -1, 2, 7, -7, 100, 127, -128],
    "SMALLINT": [None, 0, 1, -1, 7, 300, 32767, -32768],
    "INTEGER": [None, 0, 1, -1, 2, -2, 7, -7, 1000, 46341, 2147483647, -2147483648],
    "BIGINT": [None, 0, 1, -1, 7, -7, 2**31, 2**53 + 1, 2**63 - 1, -(2**63)],
    "DOUBLE": [None, 0.0, -0.0, 1.0, -1.0, 0.1, 0.5, -0.5, 1.5, 2.5, -2.5, 3.5, 0.49999999999999994, 1.005, 2.675,
               1e300, -1e300, 5e-324, 2.0**52 + 1, 2.0**63, 2147483647.5, -2147483648.5, NAN, INF, -INF],
    "FLOAT": [None, 0.0, -0.0, 1.0, -2.5, 0.1, 3.5, 1e30, NAN, INF],
    "DECIMAL(10,2)": [None, Decimal("0.00"), Decimal("1.50"), Decimal("-1.50"), Decimal("2.55"), Decimal("-2.50"),
                      Decimal("0.05"), Decimal("99999999.99"), Decimal("-99999999.99")],
    "DECIMAL(38,10)": [None, Decimal("0.1000000000"), Decimal("-1234567890123456789012.3456789012"),
                       Decimal("9999999999999999999999999999.9999999999"), Decimal("0.0000000001"),
                       Decimal("9007199254740993.0000000000"), Decimal("1.0000000005"),
                       Decimal("-9999999999999999999999999999.9999999999")],
    "DECIMAL(36,4)": [None, Decimal("99999999999999999999999999999999.9999"),
                      Decimal("-99999999999999999999999999999999.9999"), Decimal("-12345678901234567890123456789012.5"),
                      Decimal("0.0001"), Decimal("-0.5000")],
    "DECIMAL(4,1)": [None, Decimal("0.0"), Decimal("2.5"), Decimal("-0.5"), Decimal("999.9")],
    "VARCHAR": [None, "", "a", "A", "hello", " hello ", "\u00a0x\u3000", "\t x\n", "ß", "İ", "e\u0301", "👍🏽x",
                "a%b", "a\\b", "a_b", "line\nbreak", "it's", "xxab", "ab", "ΟΔΟΣ", "\ua7dcK", "İX"],
    "DATE": [None, datetime.date(1, 1, 1), datetime.date(1970, 1, 1), datetime.date(2020, 1, 31),
             datetime.date(2020, 2, 29), datetime.date(2021, 1, 3), datetime.date(2024, 1, 7),
             datetime.date(2024, 12, 30), datetime.date(1999, 12, 31), datetime.date(9999, 12, 31)],
    "TIMESTAMP": [None, datetime.datetime(2020, 1, 1), datetime.datetime(2020, 1, 1, 23, 59, 59, 999999),
                  datetime.datetime(2024, 2, 29, 12, 34, 56, 500000), datetime.datetime(1, 1, 1),
                  datetime.datetime(1969, 12, 31, 23, 0, 1), datetime.datetime(9999, 12, 31, 23, 59, 59)],
}
GRIDS["TIMESTAMP WITH TIME ZONE"] = [None if v is None else v.replace(tzinfo=UTC) for v in GRIDS["TIMESTAMP"]]


def _spark_type(name: str):
    from pyspark.sql import types as T

    if name.startswith("DECIMAL("):
        precision, scale = name[8:-1].split(",")
        return T.DecimalType(int(precision), int(scale))
    return {"BOOLEAN": T.BooleanType(), "TINYINT": T.ByteType(), "SMALLINT": T.ShortType(),
            "INTEGER": T.IntegerType(), "BIGINT": T.LongType(), "DOUBLE": T.DoubleType(), "FLOAT": T.FloatType(),
            "VARCHAR": T.StringType(), "DATE": T.DateType(), "TIMESTAMP": T.TimestampNTZType(),
            "TIMESTAMP WITH TIME ZONE": T.TimestampType()}[name]


def canonical(value):
    """A value as compared: floats by their bits (every NaN alike), DECIMALs with their scale."""
    if isinstance(value, float):
        return ("float", "nan") if math.isnan(value) else ("float", struct.pack(">d", value).hex())
    if isinstance(value, Decimal):
        return ("decimal", str(value))
    if isinstance(value, bool):
        return ("bool", value)
    return (type(value).__name__, value)


class Grid:
    """Typed tables on DuckDB and Spark, and expressions compared over them."""

    def __init__(self, spark) -> None:
        self.spark = spark
        self.duck = duckdb.connect()
        self.duck.execute("SET TimeZone = 'UTC'")
        self.types: dict[str, dict[str, str]] = {}

    def table(self, name: str, columns: dict[str, str], rows: list[tuple] | None = None) -> None:
        """Table ``name`` on both engines: ``rows``, or every combination of the columns' grids."""
        from pyspark.sql import types as T

        if rows is None:
            rows = list(itertools.product(*[GRIDS[t] for t in columns.values()]))
        rows = [(i, *row) for i, row in enumerate(rows)]
        self.types[name] = {c.lower(): t for c, t in columns.items()}
        listed = ", ".join(f"{c} {t}" for c, t in columns.items())
        self.duck.execute(f"CREATE OR REPLACE TABLE {name} (i INTEGER, {listed})")
        self.duck.executemany(f"INSERT INTO {name} VALUES ({', '.join('?' * (len(columns) + 1))})", rows)
        schema = T.StructType([T.StructField("i", T.IntegerType())]
                              + [T.StructField(c, _spark_type(t)) for c, t in columns.items()])
        self.spark.createDataFrame(rows, schema).createOrReplaceTempView(name)

    def forms(self, table: str, text: str) -> dict:
        """The renderings of one analyst expression over ``table`` (checked by ``check_spark`` first)."""
        tree = parse_query(f"SELECT {text} FROM {table}")
        types = self.types[table]
        check_spark(tree, types)
        node = tree.expressions[0]
        return {"text": text, "duck_try": render(Total(this=node.copy())), "duck_plain": render(node.copy()),
                "spark_total": total(node, types).sql(dialect="spark"),
                "spark_agree": agree(node, types).sql(dialect="spark"), "inferred": duckdb_type(node.copy(), types)}

    def compare(self, table: str, texts: list[str]) -> list[str]:
        """Every difference between the engines for ``texts`` over ``table`` (empty: they agree)."""
        forms = [self.forms(table, text) for text in texts]
        typeofs = ", ".join("typeof(" + f["duck_plain"] + ")" for f in forms)
        duck_types = self.duck.sql(f"SELECT {typeofs} FROM {table} LIMIT 1").fetchall()[0]
        problems = [f"{f['text']}: inferred {f['inferred']}, DuckDB says {t}"
                    for f, t in zip(forms, duck_types) if f["inferred"] != t]
        # agree's form is compared too where DuckDB raises nowhere and it differs from total's
        raises = [f["spark_agree"] == f["spark_total"] or self._raises(f"SELECT {f['duck_plain']} FROM {table}")
                  for f in forms]
        duck_items = [_wrap_duck(f["duck_try"], t) for f, t in zip(forms, duck_types)]
        duck_rows = self.duck.sql(f"SELECT i, {', '.join(duck_items)} FROM {table} ORDER BY i").fetchall()
        # one Spark statement: the plain forms (their types), wrapped for comparison in a projection over them
        plain = [f["spark_total"] for f in forms] + [f["spark_agree"] for f, r in zip(forms, raises) if not r]
        frame = self.spark.sql(f"SELECT i, {', '.join(f'{p} AS c{k}' for k, p in enumerate(plain))} FROM {table}")
        kinds = list(duck_types) + [t for t, r in zip(duck_types, raises) if not r]
        for f, field, t in zip(forms, frame.schema.fields[1:], duck_types):
            if spark_to_duckdb(field.dataType) != t:
                problems.append(f"{f['text']}: Spark's type {field.dataType.simpleString()}, DuckDB's {t}")
        wrapped = frame.selectExpr("i", *[_wrap_spark(f"c{k}", t) for k, t in enumerate(kinds)])
        spark_rows = sorted((tuple(r) for r in wrapped.collect()), key=lambda row: row[0])
        agreed = [k for k, r in enumerate(raises) if not r]
        for duck_row, spark_row in zip(duck_rows, spark_rows):
            inputs = duck_row[0]
            for k, f in enumerate(forms):
                if canonical(duck_row[k + 1]) != canonical(spark_row[k + 1]):
                    problems.append(f"{f['text']} (total) at row {inputs}: DuckDB {duck_row[k + 1]!r}, "
                                    f"Spark {spark_row[k + 1]!r}")
            for position, k in enumerate(agreed):
                value = spark_row[len(forms) + 1 + position]
                if canonical(duck_row[k + 1]) != canonical(value):
                    problems.append(f"{forms[k]['text']} (agree) at row {inputs}: DuckDB {duck_row[k + 1]!r}, "
                                    f"Spark {value!r}")
        return [self._located(table, p) for p in problems]

    def _raises(self, sql: str) -> bool:
        try:
            self.duck.sql(sql).fetchall()
        except duckdb.Error:
            return True
        return False

    def _located(self, table: str, problem: str) -> str:
        if " at row " not in problem:
            return problem
        head, tail = problem.split(" at row ", 1)
        row, rest = tail.split(":", 1)
        values = self.duck.sql(f"SELECT * EXCLUDE (i) FROM {table} WHERE i = {row}").fetchall()[0]
        return f"{head} at {values}:{rest}"

    def spark_value(self, sql: str):
        """The one value of a Spark query, or ``"error"`` when Spark raises."""
        try:
            return self.spark.sql(sql).collect()[0][0]
        except Exception:
            return "error"

    def duck_value(self, sql: str):
        try:
            return self.duck.sql(sql).fetchall()[0][0]
        except duckdb.Error:
            return "error"


def _wrap_duck(sql: str, type_name: str) -> str:
    if type_name == "DATE":
        return f"date_diff('day', DATE '1970-01-01', {sql})"
    if type_name.startswith("TIMESTAMP"):
        return f"epoch_us({sql})"
    return sql


def _wrap_spark(sql: str, type_name: str) -> str:
    if type_name == "DATE":
        return f"datediff({sql}, DATE '1970-01-01')"
    if type_name.startswith("TIMESTAMP"):
        return f"unix_micros(CAST({sql} AS TIMESTAMP))"
    return sql
