"""The constructs ``check_spark`` accepts, by the table of grid values they are compared over.

``TABLES`` names each table's columns (``tests/spark_grid.py`` fills it with every combination
of their grid values); ``ACCEPTED`` lists, per table, analyst expressions in DuckDB's SQL that
must mean the same on Spark. ``tests/test_spark_semantics.py`` runs each table's list as one
statement per engine.
"""

TABLES = {
    "g_int": {"a": "INTEGER", "b": "INTEGER"},
    "g_tiny": {"a": "TINYINT", "b": "SMALLINT"},
    "g_big": {"a": "BIGINT", "b": "BIGINT"},
    "g_dbl": {"a": "DOUBLE", "b": "DOUBLE"},
    "g_flt": {"a": "FLOAT", "b": "FLOAT"},
    "g_dec": {"a": "DECIMAL(10,2)", "b": "DECIMAL(4,1)"},
    "g_mix": {"a": "DECIMAL(10,2)", "b": "INTEGER", "c": "DOUBLE"},
    "g_wide": {"a": "DECIMAL(38,10)", "b": "DOUBLE", "c": "DECIMAL(36,4)"},
    "g_str": {"a": "VARCHAR", "b": "BOOLEAN"},
    "g_date": {"a": "DATE", "b": "DATE"},
    "g_day": {"a": "DATE", "b": "SMALLINT"},
    "g_far": {"a": "DATE", "b": "INTEGER", "c": "TIMESTAMP"},
    "g_ts": {"a": "TIMESTAMP", "b": "TIMESTAMP"},
    "g_tz": {"a": "TIMESTAMP WITH TIME ZONE", "b": "TIMESTAMP"},
    "g_bool": {"a": "BOOLEAN", "b": "BOOLEAN"},
}

_SHARED_NUMBERS = [
    "a + b", "a - b", "a * b", "a / b", "-a", "abs(a)", "sign(a)", "a = b", "a <> b", "a < b", "a >= b",
    "a IS NOT DISTINCT FROM b", "a IS DISTINCT FROM b", "a BETWEEN b AND 7", "a IN (1, b, NULL)", "a NOT IN (0, 1)",
    "coalesce(a, b)", "least(a, b)", "greatest(a, b, 0)", "nullif(a, b)", "CASE WHEN a > b THEN a ELSE b END",
    "IF(a = b, a, b)", "a IS NULL", "round(a)", "floor(a)", "ceil(a)", "CAST(a AS DOUBLE)", "TRY_CAST(a AS TINYINT)",
    "CAST(a AS INTEGER)",
]

ACCEPTED = {
    "g_int": _SHARED_NUMBERS + [
        "a // b", "a % b", "a + 1", "a * 2", "a - 3000000000", "a * 1.5", "a + 0.25", "round(a, -1)", "round(a, 2)",
        "CAST(a AS SMALLINT)", "CAST(a AS DECIMAL(5,1))", "CAST(a AS VARCHAR)", "CAST(a AS BOOLEAN)",
        "CAST(a AS BIGINT) * b", "concat('x', a)", "'x' || a", "isnan(a)", "isfinite(a)", "a IN (1.5, 2)",
        "CAST(round(a * 100) AS BIGINT)", "floor(a) * 2", "round(a, -1) + 1", "coalesce(a, 1.5) * 2",
        # DuckDB's TRY: an error anywhere makes the whole expression NULL, even under COALESCE, IS NULL, OR
        "coalesce(a // b, 5)", "(a // b) IS NULL", "b = 0 OR a // b > 0", "a // b > 0 AND b = 1",
        "CASE WHEN a // b > 0 THEN 1 ELSE 2 END", "IF(b = 0, 7, a // b)", "least(a // b, 3)",
        "concat('x', a // b)", "a // b IN (1, NULL)", "b IN (0, a // b)", "coalesce(a, 1 // b)", "nullif(1, a // b)",
        "CASE WHEN b = 0 THEN 0 WHEN a + b > 0 THEN a * b ELSE a - b END", "coalesce(a + b, a * b, 0)",
        "CASE a WHEN 1 THEN b * b WHEN 2 THEN -b END", "(a * b) IS NOT DISTINCT FROM NULL", "greatest(a + b, 0)",
    ],
    "g_tiny": [
        "a + b", "a + 1", "a * 2", "a - 1", "a + 1000", "-a", "abs(a)", "a // 2", "a % 2", "a // b", "a % b",
        "a * b", "coalesce(a, 1)", "coalesce(a, 1000)", "CASE WHEN b > 0 THEN a ELSE 1 END", "least(a, 1)",
        "round(a, -1)", "CAST(b AS TINYINT)", "CAST(a AS SMALLINT) * b", "a + 1.5", "a = 1", "b IN (1, 2)",
        # rewrites inside other expressions: each keeps DuckDB's type where it sits
        "coalesce(a, 1) + 127", "least(a, 1) * 2", "CASE WHEN b > 0 THEN a ELSE 1 END + 100", "-(a // 2) * 2",
        "abs(a) + 1", "round(a, -1) + 1", "sign(a) * 100", "(a % 3) * 60",
    ],
    "g_big": [
        "a + b", "a - b", "a * b", "a / b", "a // b", "a % b", "-a", "abs(a)", "a + 1", "a // -1",
        "CAST(a AS INTEGER)", "CAST(a AS DOUBLE)", "CAST(a AS DOUBLE) = b", "a = CAST(b AS DOUBLE)", "a < 1e18",
        "a * 0.5", "sign(a)", "floor(a)", "coalesce(a // b, 0)",
    ],
    "g_dbl": _SHARED_NUMBERS + [
        "a % b", "a % 2", "CAST(a AS BIGINT)", "CAST(a AS FLOAT)", "CAST(a AS SMALLINT)", "isnan(a)", "isinf(a)",
        "isfinite(a)", "a = 0.1", "a > 1e300", "CAST(a AS BOOLEAN)", "sqrt(a)", "a + 1", "a * 0.5", "a / 0",
        "round(a, 0)", "CASE WHEN isnan(a) THEN 0 ELSE a END", "a IN (0, b)", "TRY_CAST(a AS INTEGER)",
        "CAST(round(a * 100) AS BIGINT)", "floor(a) + ceil(b)", "round(a) - a", "CAST(a AS INTEGER) + 1",
    ],
    "g_flt": [
        "a + b", "a - b", "a * b", "a / b", "a % b", "a + 1.5", "a * 2", "a + 1", "a = 0.1", "a < b", "a = b",
        "CAST(a AS DOUBLE)", "CAST(a AS INTEGER)", "round(a)", "floor(a)", "ceil(a)", "-a", "abs(a)", "sign(a)",
        "coalesce(a, 1.5)", "least(a, 1)", "greatest(a, b)", "isnan(a)", "a > 0.5",
    ],
    "g_dec": [
        "a + b", "a - b", "a * b", "a / b", "-a", "abs(a)", "sign(a)", "round(a)", "round(a, 1)", "round(a, 5)",
        "round(a, -1)", "floor(a)", "ceil(a)", "CAST(a AS INTEGER)", "CAST(a AS BIGINT)", "CAST(a AS DOUBLE)",
        "CAST(a AS DECIMAL(5,1))", "CAST(a AS DECIMAL(12,4))", "CAST(a AS VARCHAR)", "a = b", "a < b", "least(a, b)",
        "coalesce(a, b)", "a + 1", "a * 2", "a + 1.5", "a * 1.5", "concat(a, 'x')", "a IN (1.5, b)",
        "CASE WHEN a > 0 THEN a ELSE b END", "a BETWEEN b AND 100", "nullif(a, b)", "a = 2.55",
        "CAST(round(a * 100) AS BIGINT)", "round(a, 1) * 3", "floor(a) + 1", "coalesce(a, b) + 1",
    ],
    "g_mix": [
        "a + b", "a * b", "a = b", "a / b", "coalesce(a, b)", "CASE WHEN b > 0 THEN a ELSE b END", "a + c",
        "a = c", "c / b", "b + c", "least(a, c)", "greatest(b, c)", "a < c", "c IN (a, b)", "a - b",
    ],
    "g_wide": [
        "CAST(a AS DOUBLE)", "a = b", "a < b", "a + b", "a / b", "a / 3", "a * b", "CAST(a AS BIGINT)",
        "CAST(a AS DECIMAL(38,2))", "round(a, 3)", "floor(a)", "CAST(a AS VARCHAR)", "coalesce(a, b)", "a = 0.1",
        "sign(a)", "a > 1e20", "a IN (0.1, 1.0000000005)", "c + c", "c - c", "floor(c)", "ceil(c)", "round(c)",
        "round(c, 1)", "round(c, -2)", "CAST(c AS DECIMAL(38,4))", "CAST(c AS DOUBLE)", "ceil(a)",
    ],
    "g_str": [
        "length(a)", "strlen(a)", "a || 'x'", "concat(a, NULL, 'y')", "concat(a, b)", "a || b",
        "trim(a)", "ltrim(a)", "rtrim(a)", "trim(a, 'ab')", "ltrim(a, 'x ')", "trim(a, '\u00a0\u3000x')",
        "substring(a, 2, 3)", "substring(a, 0, 2)", "substring(a, 0, 1)", "substring(a, 0, -1)", "substring(a, 0)",
        "substring(a, -2, 2)", "substring(a, -7, 3)", "substring(a, 2, -1)", "substring(a, 3, -5)",
        "substring(a, -2, -1)", "substring(a, -1, -9)", "substring(a, 9, 2)", "substring(a, 2)", "substring(a, -3)",
        "left(a, 2)", "left(a, -2)", "left(a, 0)", "left(a, -9)", "right(a, 2)", "right(a, -2)", "right(a, 0)",
        "a LIKE '%'", "a LIKE 'a%'", "a LIKE '%a'", "a LIKE '%a%b%'", "a LIKE '_'", "a LIKE 'a\\%'",
        "a LIKE '%\\%'", "a LIKE 'h_llo'", "a LIKE '%l_o'", "a LIKE 'line%break'", "a LIKE 'a\\b'",
        "a LIKE '%x%a%b'", "a LIKE '__'", "a LIKE '%\\E%'", "a NOT LIKE '%a%'", "a LIKE '%_%_'",
        "starts_with(a, 'he')", "ends_with(a, 'lo')", "contains(a, 'l')", "prefix(a, 'a')", "suffix(a, 'b')",
        "a = 'hello'", "a < 'b'", "a > 'é'", "a IN ('a', 'A')", "coalesce(a, 'z')", "least(a, 'b')", "nullif(a, '')",
        "CASE WHEN a = 'a' THEN 'x' WHEN b THEN a END", "a IS NULL", "lower(a) LIKE '%x%'", "lower(a) LIKE 'a%b'",
        "lower(a) NOT LIKE '%k'", "lower(a) LIKE 'hello'", "lower(a) LIKE '%\\%'", "a ILIKE '%%'", "a ILIKE '% %'",
        "a NOT ILIKE '%''%'", "a ILIKE '%\\%'", "a ILIKE ''",
    ],
    "g_date": [
        "a = b", "a < b", "a - b", "year(a)", "month(a)", "day(a)", "dayofmonth(a)", "quarter(a)", "dayofweek(a)",
        "isodow(a)", "dayofyear(a)", "weekofyear(a)", "week(a)", "yearweek(a)", "extract(dow from a)",
        "extract(isodow from a)", "extract(doy from a)", "extract(year from a)", "extract(week from a)",
        "date_part('isodow', a)", "date_part('dow', a)", "datepart('quarter', a)", "dayname(a)", "monthname(a)",
        "date_trunc('year', a)", "date_trunc('quarter', a)", "date_trunc('month', a)", "date_trunc('week', a)",
        "date_trunc('day', a)", "last_day(a)", "date_diff('day', a, b)", "date_diff('month', a, b)",
        "date_diff('quarter', a, b)", "date_diff('year', a, b)", "datediff('day', b, a)", "a = '2020-02-29'",
        "a BETWEEN '2020-01-01' AND b", "least(a, b)", "greatest(a, b)", "coalesce(a, b)", "CAST(a AS TIMESTAMP)",
        "hour(a)", "a IN ('2024-01-07', b)", "CASE WHEN a < b THEN a END", "nullif(a, b)",
        "CAST(a AS VARCHAR)", "CAST(a AS VARCHAR) LIKE '2020-%'", "a < DATE '2020-03-01'",
        "a BETWEEN DATE '2020-01-01' AND b", "TRY_CAST('2020-02-29' AS DATE) = a",
        "a BETWEEN '2020-01-01' AND '2020-02-29'", "a IN ('2024-01-07', '2020-02-29')",
        "'2020-02-29' NOT BETWEEN a AND b", "a - INTERVAL 30 DAY", "a + INTERVAL '1' DAY", "INTERVAL 2 DAYS + a",
        "b >= a - INTERVAL 30 DAY", "year(a + INTERVAL 400 DAY)",
    ],
    "g_day": [  # dates past 9999 and before year 1 (a + b with b down to -32768 days)
        "a + b", "a - b", "b + a", "a + 1", "a - 366", "year(a + b)", "(a + b) - a", "month(a + b)", "day(a - b)",
        "dayofweek(a + b)", "isodow(a + b)", "weekofyear(a + b)", "yearweek(a + b)", "dayofyear(a + b)",
        "quarter(a + b)", "dayname(a + b)", "monthname(a - b)", "date_trunc('month', a + b)", "last_day(a + b)",
        "date_diff('month', a, a + b)", "date_diff('year', a - b, a)", "a + b < a", "hour(a + b)",
        "CAST(a + b AS VARCHAR)", "CAST(a - b AS VARCHAR)",
    ],
    "g_far": [  # dates past the TIMESTAMP range (a + b, b up to 2^31 - 1 days)
        "year(a + b)", "CAST(a + b AS TIMESTAMP)", "hour(a + b)", "date_trunc('month', a + b)", "(a + b) < c",
        "a + b BETWEEN a AND c", "dayname(a + b)", "last_day(a + b)", "weekofyear(a + b)", "dayofweek(a + b)",
        "yearweek(a + b)", "date_diff('day', a + b, a)", "date_diff('month', a, a + b)", "month(a + b)",
        "coalesce((a + b) < c, true)", "CAST(c AS DATE) - (a + b)", "(a + b) - a", "CAST(a + b AS VARCHAR)",
        "(a + b) - INTERVAL 30 DAY", "(a + b) + INTERVAL 9999999 DAY", "(a + 106751995) - INTERVAL 30 DAY",
        "a - INTERVAL 30 DAY < c",
    ],
    "g_ts": [
        "a = b", "a < b", "year(a)", "month(a)", "hour(a)", "minute(a)", "second(a)", "extract(second from a)",
        "extract(hour from a)", "dayofweek(a)", "date_trunc('hour', a)", "date_trunc('minute', a)",
        "date_trunc('second', a)", "date_trunc('month', a)", "date_trunc('week', a)", "date_diff('day', a, b)",
        "date_diff('month', a, b)", "CAST(a AS DATE)", "a < '2020-01-01 12:00'", "a = '2020-01-01'", "last_day(a)",
        "dayname(a)", "least(a, b)", "CAST(a AS DATE) = b", "a > CAST(b AS DATE)",
        "a < TIMESTAMP '2020-01-01 12:00:00'", "a = TIMESTAMP '2020-01-01 00:00'",
    ],
    "g_tz": [
        "year(a)", "hour(a)", "minute(a)", "date_trunc('day', a)", "date_trunc('hour', a)", "CAST(a AS DATE)",
        "CAST(a AS TIMESTAMP)", "a = b", "a < b", "date_diff('day', a, b)", "CAST(b AS TIMESTAMP WITH TIME ZONE)",
        "dayofweek(a)", "last_day(a)",
    ],
    "g_bool": [
        "a AND b", "a OR b", "NOT a", "a IS TRUE", "a IS NOT FALSE", "a = b", "a < b", "CAST(a AS INTEGER)",
        "CAST(a AS VARCHAR)", "coalesce(a, b)", "CASE WHEN a THEN 1 WHEN b THEN 2 END", "concat(a, 'x')",
        "a IS DISTINCT FROM b", "least(a, b)", "CAST(a AS DOUBLE)", "IF(a, b, NULL)",
    ],
}
