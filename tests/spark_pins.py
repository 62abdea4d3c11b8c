"""Measured differences between DuckDB and Spark that dpsql's Spark rendering must not inherit.

``REFUSED``: constructs ``check_spark`` refuses, each with the reason's key phrase and one input
on which the engines answer differently (DuckDB's SQL, and what sqlglot's plain Spark
translation of it gives). ``REWRITTEN``: constructs accepted only because ``agree`` rewrites
them; the same kind of pin shows what the plain translation would have answered. Values are
what pyspark 4.3 and DuckDB 2.0 gave on this machine; "error" means the engine raised.
"""

import datetime
from decimal import Decimal

ERROR = "error"

REFUSED = [
    # (table, analyst expression, phrase of the refusal, DuckDB SQL showing the difference, DuckDB, Spark)
    ("g_str", "upper(a)", "maps some letters differently", "SELECT upper('straße')", "STRAẞE", "STRASSE"),
    ("g_str", "lower(a)", "maps some letters differently", "SELECT lower('İ')", "i", "i\u0307"),
    ("g_str", "a ILIKE 'i'", "maps some letters differently", "SELECT 'İ' ILIKE 'i'", True, False),
    ("g_str", "lower(a) LIKE '%ix%'", "maps some letters differently", "SELECT lower('İX') LIKE '%ix%'", True, False),
    ("g_str", "lower(a) LIKE 'h_'", "maps some letters differently", "SELECT lower('hİ') LIKE 'h_'", True, False),
    ("g_str", "CAST(a AS INTEGER)", "parse text differently", "SELECT CAST('1e3' AS INTEGER)", 1000, ERROR),
    ("g_str", "TRY_CAST(a AS INTEGER)", "parse text differently", "SELECT CAST('1.5' AS INTEGER)", 2, ERROR),
    ("g_str", "CAST(a AS BOOLEAN)", "parse text differently", "SELECT CAST(' true ' AS BOOLEAN)", ERROR, True),
    ("g_str", "CAST(a AS DATE)", "parse text differently", "SELECT CAST('2020' AS DATE)", ERROR,
     datetime.date(2020, 1, 1)),
    ("g_str", "CAST(a AS DOUBLE)", "parse text differently", "SELECT CAST('1d' AS DOUBLE)", ERROR, 1.0),
    ("g_dbl", "CAST(a AS VARCHAR)", "write floating-point numbers", "SELECT CAST(1e20::DOUBLE AS VARCHAR)",
     "1e+20", "1.0E20"),
    ("g_dbl", "'x' || a", "write differently", "SELECT 'x' || CAST(1e20 AS DOUBLE)", "x1e+20", "x1.0E20"),
    ("g_tz", "CAST(a AS VARCHAR)", "with its offset",
     "SELECT CAST(TIMESTAMPTZ '2020-01-01 10:00:00' AS VARCHAR)", "2020-01-01 10:00:00+00", "2020-01-01 10:00:00"),
    ("g_dbl", "CAST(a AS DECIMAL(4,2))", "decimal text of a DOUBLE",
     "SELECT CAST(1.005::DOUBLE AS DECIMAL(4,2))", Decimal("1.00"), Decimal("1.01")),
    ("g_dbl", "round(a, 2)", "decimal text of a DOUBLE", "SELECT round(1.005::DOUBLE, 2)", 1.0, 1.01),
    ("g_date", "a + INTERVAL 1 MONTH", "add intervals differently",
     "SELECT DATE '2024-01-31' + INTERVAL 1 MONTH", datetime.datetime(2024, 2, 29), datetime.date(2024, 2, 29)),
    ("g_ts", "a - b", "timestamp and interval arithmetic",
     "SELECT CAST(TIMESTAMP '2020-01-02' - TIMESTAMP '2020-01-01' AS VARCHAR)", "1 day",
     "INTERVAL '1 00:00:00' DAY TO SECOND"),
    ("g_int", "make_date(a, b, 1)", "no form that does", "SELECT TRY(make_date(2020, 2, 30))", None, ERROR),
    ("g_date", "strftime(a, '%j')", "format codes", "SELECT strftime(DATE '2024-01-07', '%j')", "007", "07"),
    ("g_dbl", "exp(a)", "math libraries differ", "SELECT exp(1.7::DOUBLE)", 5.4739473917272, 5.473947391727199),
    ("g_dbl", "ln(a)", "math libraries differ", "SELECT ln(0::DOUBLE)", float("-inf"), None),
    ("g_dbl", "log(a)", "math libraries differ", "SELECT log(100::DOUBLE)", 2.0, 4.605170185988092),
    ("g_dbl", "cbrt(a)", "math libraries differ", "SELECT cbrt(27::DOUBLE)", 3.0000000000000004, 3.0),
    ("g_dbl", "trunc(a)", "fails past BIGINT", "SELECT trunc(1e300::DOUBLE)", 1e300, ERROR),
    ("g_ts", "date_diff('hour', a, b)", "boundaries crossed",
     "SELECT date_diff('hour', TIMESTAMP '2020-01-01 23:59', TIMESTAMP '2020-01-02 00:01')", 1, 0),
    ("g_ts", "extract(epoch from a)", "epoch is refused",
     "SELECT extract(epoch from TIMESTAMP '2024-05-07 10:11:12.5')", 1715076672.5, ERROR),
    ("g_date", "date_trunc('decade', a)", "truncate alike",
     "SELECT date_trunc('decade', DATE '2024-05-05')", datetime.datetime(2020, 1, 1), None),
    ("g_str", "substring(a, b::INTEGER, 2)", "integer literal", "SELECT substring('hello', 0, 2)", "h", "he"),
    ("g_str", "left(a, length(a) - 3)", "integer literal", "SELECT left('hello', -2)", "hel", ""),
    ("g_dbl", "a // b", "plain division", "SELECT 7.5::DOUBLE // 2", 3.75, ERROR),
    ("g_dec", "CAST(a AS DECIMAL(38,10)) + b", "more than 38 digits",
     "SELECT CAST(CAST('1.0000000001' AS DECIMAL(38,10)) + CAST(1 AS DECIMAL(38,10)) AS VARCHAR)",
     "2.0000000001", "2.000000000"),
    ("g_dec", "CAST(a AS DECIMAL(30,10)) * CAST(b AS DECIMAL(30,10))", "more than 38 digits",
     "SELECT CAST(CAST(1.5 AS DECIMAL(30,10)) * CAST(1.5 AS DECIMAL(30,10)) AS VARCHAR)",
     "2.25000000000000000000", "2.250000"),
    ("g_wide", "-a", "more than 34 digits",
     "SELECT -CAST('9999999999999999999999999999.9999999999' AS DECIMAL(38,10))",
     Decimal("-9999999999999999999999999999.9999999999"), ERROR),
    ("g_wide", "c > a", "more than 38 digits",
     "SELECT TRY(c > a) FROM (VALUES (CAST('99999999999999999999999999999999.9999' AS DECIMAL(36,4)), "
     "CAST(1 AS DECIMAL(38,10)))) t(c, a)", None, True),
    ("g_str", "a = 1000", "converts differently", "SELECT '1e3' = 1000", True, ERROR),
    ("g_date", "a = '2020'", "as a date differently", "SELECT DATE '2020-01-01' = '2020'", ERROR, True),
    ("g_int", "[a, b][3]", "lists, maps and structs", "SELECT [10, 20][3]", None, ERROR),
    ("g_int", "list_sum([a, b])", "lists, maps and structs", "SELECT list_sum([1, 2])", 3, ERROR),
]

REFUSED_PUBLIC = [
    # a query over public tables, which Spark runs as written (a private query's aggregates are dpsql's own)
    ("g_dbl", "SELECT avg(g_dbl.a) FROM g_dbl", "different orders",
     "SELECT avg(x) FROM (VALUES (0.1::DOUBLE), (0.2), (0.3)) t(x)", 0.20000000000000004, 0.19999999999999998),
    ("g_dbl", "SELECT sum(g_dbl.a) FROM g_dbl", "different orders",
     "SELECT sum(x) FROM (VALUES (0.1::DOUBLE), (0.2), (0.3), (1e16), (-1e16)) t(x)", 0.0, 0.30000000000000004),
    ("g_dbl", "SELECT stddev_samp(g_dbl.a) FROM g_dbl", "different orders",
     "SELECT stddev_samp(x) FROM (VALUES (0.1::DOUBLE), (0.2), (0.3), (100000000.7)) t(x)",
     50000000.25, 50000000.25000001),
    ("g_dbl", "SELECT g_dbl.a FROM g_dbl UNION ALL SELECT g_str.a FROM g_str", "convert differently",
     "SELECT min(x) FROM (SELECT CAST(1e20 AS DOUBLE) AS x UNION ALL SELECT 'a')", "1e+20", ERROR),
]

REFUSED_UNMEASURED = [
    # refused because no one has compared them yet, not for a measured difference
    ("g_int", "SELECT row_number() OVER (ORDER BY a) FROM g_int", "has not checked"),
    ("g_int", "SELECT COUNT(*) FROM g_int WHERE a IN (SELECT b FROM g_int)", "type of a subquery"),
    ("g_int", "SELECT COUNT(*) FROM g_int WHERE (a, b) = (1, 2)", "cannot tell the type"),
]

REWRITTEN = [
    # (DuckDB SQL, DuckDB, what Spark gives for sqlglot's plain translation of it, or for the Spark SQL
    # given fourth): agree's and total's forms give DuckDB's (the grid tests check them)
    ("SELECT typeof(7 // 2)", "INTEGER", "bigint"),
    ("SELECT AVG(x) FROM (SELECT UNNEST([9007199254740992, 1, 1, 1]::BIGINT[]) AS x)", 2251799813685249.0,
     2251799813685248.0, "SELECT AVG(x) FROM (SELECT explode(array(9007199254740992L, 1L, 1L, 1L)) AS x)"),
    ("SELECT 1 / 0", float("inf"), ERROR),
    ("SELECT 1.0::DOUBLE / '-0.0'::DOUBLE", float("-inf"), ERROR),
    ("SELECT 1.0::DOUBLE % 0", float("nan"), ERROR),
    ("SELECT CAST(127 AS TINYINT) + 1", ERROR, 128),
    ("SELECT CAST(2.7::DOUBLE AS INTEGER)", 3, 2),
    ("SELECT CAST(DATE '9999-12-31' + 1 AS VARCHAR)", "10000-01-01", "+10000-01-01"),
    ("SELECT CAST(DATE '0001-01-01' - 1 AS VARCHAR)", "0001-12-31 (BC)", "0000-12-31"),
    ("SELECT CAST(2.5::DECIMAL(3,1) AS INTEGER)", 3, 2),
    ("SELECT CAST(9223372036854775808::DOUBLE AS BIGINT)", ERROR, 9223372036854775807),
    ("SELECT CAST(1e300::DOUBLE AS FLOAT)", ERROR, float("inf")),
    ("SELECT substring('hello', 0, 2)", "h", "he"),
    ("SELECT substring('hello', 2, -1)", "h", ""),
    ("SELECT left('hello', -2)", "hel", ""),
    ("SELECT right('hello', -2)", "llo", ""),
    ("SELECT trim(chr(160) || 'a')", "a", "\u00a0a"),
    ("SELECT 'a%' LIKE 'a\\%'", False, True),
    ("SELECT dayofweek(DATE '2024-01-07')", 0, 1),
    ("SELECT isodow(DATE '2024-01-07')", 7, 2),
    ("SELECT dayname(DATE '2024-01-07')", "Sunday", "Sun"),
    ("SELECT extract(second from TIMESTAMP '2024-05-07 10:11:12.5')", 12, Decimal("12.500000")),
    ("SELECT date_diff('month', DATE '2020-01-31', DATE '2020-02-01')", 1, 0),
    ("SELECT date_diff('day', TIMESTAMP '2020-01-01 23:00', TIMESTAMP '2020-01-02 01:00')", 1, 0),
    ("SELECT floor(-0.5::DOUBLE)", -1.0, -1),
    ("SELECT ceil(-0.5::DOUBLE)", -0.0, 0),
    ("SELECT round(-0.4::DOUBLE)", -0.0, 0.0),
    ("SELECT sign('nan'::DOUBLE)", 0, float("nan")),
    ("SELECT isnan(NULL::DOUBLE)", None, False),
    ("SELECT least('-0.0'::FLOAT, 1)", 0.0, -0.0),
    ("SELECT TRY(COALESCE(1 // x, 5)) FROM (VALUES (0)) t(x)", None, 5,
     "SELECT COALESCE(1 DIV NULLIF(x, 0), 5) FROM VALUES (0) AS t(x)"),
    ("SELECT TRY(x = 0 OR 1 // x > 0) FROM (VALUES (0)) t(x)", None, True,
     "SELECT x = 0 OR 1 DIV NULLIF(x, 0) > 0 FROM VALUES (0) AS t(x)"),
    ("SELECT SUM(x) FROM (VALUES (9223372036854775807::BIGINT), (1)) t(x)", 9223372036854775808, ERROR),
]
"""sqlglot's translation of ``TRY(...)`` drops TRY ("Unsupported TRY function"), so the last pins give
the Spark SQL themselves: the expression with each step in its try_ form, which is not yet TRY."""
