"""dpsql's dialect: BigQuery's WITH DIFFERENTIAL_PRIVACY clause on top of DuckDB.

Three promises: the clause parses, round-trips and strips away; every refusal names the
offending option at its line and column; and any other SQL parses exactly as DuckDB's.
"""

from __future__ import annotations

from fractions import Fraction

import pytest
import sqlglot
from sqlglot import exp
from sqlglot.errors import ParseError

from dpsql.errors import UnsupportedQuery
from dpsql.sql.dialect import (
    DIALECT,
    READ_DIALECT,
    DPDuckDB,
    DPOptions,
    OptionValue,
    dp_options,
    strip_dp_options,
)

BIGQUERY_EXAMPLE = (
    "SELECT WITH DIFFERENTIAL_PRIVACY OPTIONS (epsilon = 0.5, delta = 1e-7, "
    "max_groups_contributed = 3, privacy_unit_column = user_id) store, COUNT(*) AS n "
    "FROM visits GROUP BY store"
)


def parse(sql: str) -> exp.Expression:
    return sqlglot.parse_one(sql, read=READ_DIALECT)


def refusal(sql: str) -> UnsupportedQuery:
    with pytest.raises(UnsupportedQuery) as info:
        dp_options(parse(sql))
    return info.value


# ---------------------------------------------------------------------------------------------
# The clause: parsed, read, round-tripped, stripped.


def test_bigquery_example_parses_into_the_select():
    tree = parse(BIGQUERY_EXAMPLE)
    assert isinstance(tree, exp.Select)
    assert isinstance(tree.args["hint"], DPOptions)
    assert [e.sql(dialect=READ_DIALECT) for e in tree.expressions] == ["store", "COUNT(*) AS n"]
    assert tree.args["group"].sql(dialect=READ_DIALECT) == "GROUP BY store"


def test_options_are_exact_values_with_positions():
    assert dp_options(parse(BIGQUERY_EXAMPLE)) == {
        "epsilon": OptionValue(Fraction(1, 2), 1, 43),
        "delta": OptionValue(Fraction(1, 10**7), 1, 58),
        "max_groups_contributed": OptionValue(Fraction(3), 1, 72),
        "privacy_unit_column": OptionValue("user_id", 1, 100),
    }


def test_value_kinds():
    sql = """SELECT WITH DIFFERENTIAL_PRIVACY OPTIONS (
        EPSILON = 1.25e-1, Delta = 0, max_rows_contributed = 10,
        privacy_unit_column = "User Id", noise = 'Gaussian')
      COUNT(*) FROM visits"""
    options = dp_options(parse(sql))
    assert options["epsilon"] == OptionValue(Fraction(1, 8), 2, 9)
    assert options["delta"] == OptionValue(Fraction(0), 2, 28)
    assert options["max_rows_contributed"] == OptionValue(Fraction(10), 2, 39)
    assert options["privacy_unit_column"] == OptionValue("User Id", 3, 9)
    assert options["noise"] == OptionValue("gaussian", 3, 42)
    assert dp_options(parse("SELECT WITH DIFFERENTIAL_PRIVACY OPTIONS (noise = LAPLACE) 1"))["noise"].value == "laplace"


def test_signed_numbers_are_literals_and_ranges_are_left_to_the_caller():
    options = dp_options(parse("SELECT WITH DIFFERENTIAL_PRIVACY OPTIONS (epsilon = -0.5, delta = +1e-9) 1"))
    assert options["epsilon"].value == Fraction(-1, 2)
    assert options["delta"].value == Fraction(1, 10**9)


def test_numbers_are_parsed_from_their_text_not_through_floats():
    options = dp_options(parse("SELECT WITH DIFFERENTIAL_PRIVACY OPTIONS (epsilon = 0.1, delta = 1_000e-12) 1"))
    assert options["epsilon"].value == Fraction(1, 10) != Fraction(0.1)
    assert options["delta"].value == Fraction(1, 10**9)


def test_no_clause_and_empty_clause_give_no_options():
    assert dp_options(parse("SELECT COUNT(*) FROM visits")) == {}
    assert dp_options(parse("SELECT WITH DIFFERENTIAL_PRIVACY COUNT(*) FROM visits")) == {}
    assert dp_options(parse("SELECT WITH DIFFERENTIAL_PRIVACY OPTIONS () COUNT(*) FROM visits")) == {}
    assert dp_options(sqlglot.parse_one("SELECT 1", read=DIALECT)) == {}


@pytest.mark.parametrize("sql", [
    BIGQUERY_EXAMPLE,
    "SELECT WITH DIFFERENTIAL_PRIVACY COUNT(*) FROM visits",
    "SELECT WITH DIFFERENTIAL_PRIVACY OPTIONS (noise = 'laplace', epsilon = 1) DISTINCT store FROM visits",
    "WITH v AS (SELECT * FROM visits) SELECT WITH DIFFERENTIAL_PRIVACY OPTIONS (epsilon = 1) COUNT(*) FROM v",
    "FROM visits SELECT WITH DIFFERENTIAL_PRIVACY OPTIONS (epsilon = 1) COUNT(*)",
])
def test_round_trip_and_strip(sql):
    tree = parse(sql)
    generated = tree.sql(dialect=READ_DIALECT)
    assert parse(generated) == tree
    assert generated.count("WITH DIFFERENTIAL_PRIVACY") == 1
    stripped = strip_dp_options(tree)
    plain = stripped.sql(dialect=DIALECT)
    assert "DIFFERENTIAL_PRIVACY" not in plain
    assert sqlglot.parse_one(plain, read=DIALECT) == stripped
    assert not list(stripped.find_all(DPOptions))
    assert tree.find(DPOptions) is not None, "strip_dp_options must not change its input"
    with pytest.raises(ValueError, match="DPOptions"):
        tree.sql(dialect=DIALECT)  # plain DuckDB refuses the clause rather than dropping it


def test_round_trip_text_and_pretty():
    assert parse(BIGQUERY_EXAMPLE).sql(dialect=READ_DIALECT) == BIGQUERY_EXAMPLE
    pretty = parse(BIGQUERY_EXAMPLE).sql(dialect=READ_DIALECT, pretty=True)
    assert pretty.splitlines()[0].startswith("SELECT WITH DIFFERENTIAL_PRIVACY OPTIONS (epsilon = 0.5,")
    assert parse(pretty) == parse(BIGQUERY_EXAMPLE)


def test_generating_does_not_change_the_tree():
    tree = parse(BIGQUERY_EXAMPLE)
    before = repr(tree)
    tree.sql(dialect=READ_DIALECT, copy=False)
    assert repr(tree) == before


def test_registered_by_name():
    assert sqlglot.parse_one(BIGQUERY_EXAMPLE, read="dpduckdb") == parse(BIGQUERY_EXAMPLE)
    assert READ_DIALECT is DPDuckDB


def test_option_names_keep_their_position_meta():
    item = parse(BIGQUERY_EXAMPLE).find(DPOptions).expressions[1]
    assert isinstance(item, exp.EQ) and item.this.name == "delta"
    assert item.this.meta["line"] == 1 and BIGQUERY_EXAMPLE[item.this.meta["start"]:].startswith("delta")


# ---------------------------------------------------------------------------------------------
# Refusals: each at the offending option (or the clause), with a hint.


def test_unknown_option():
    err = refusal("SELECT WITH DIFFERENTIAL_PRIVACY OPTIONS (epsilon = 1,\n  epsilonn = 2) COUNT(*) FROM visits")
    assert (err.line, err.col) == (2, 3)
    assert "epsilonn" in err.message and "max_rows_contributed" in err.hint


def test_keyword_as_option_name_is_an_unknown_option():
    err = refusal("SELECT WITH DIFFERENTIAL_PRIVACY OPTIONS (limit = 2) 1")
    assert (err.line, err.col) == (1, 43) and "'limit'" in err.message


def test_repeated_option_points_at_the_second():
    err = refusal("SELECT WITH DIFFERENTIAL_PRIVACY OPTIONS (epsilon = 1, delta = 0,\n EPSILON = 2) 1")
    assert (err.line, err.col) == (2, 2)
    assert "twice" in err.message and "line 1, column 43" in err.message and err.hint


@pytest.mark.parametrize("value, found", [
    ("0.1 + 0.2", "'0.1 + 0.2'"),
    ("(SELECT MAX(e) FROM budgets)", "'(SELECT MAX(e) FROM budgets)'"),
    ("sqrt(2)", "'SQRT(2)'"),
    ("NULL", "'NULL'"),
    ("t.user_id", "'t.user_id'"),
    ("-x", "'-x'"),
    ("1::DOUBLE", "'CAST(1 AS DOUBLE)'"),
])
def test_computed_values_are_refused(value, found):
    err = refusal(f"SELECT WITH DIFFERENTIAL_PRIVACY OPTIONS (delta = 0,\n    epsilon = {value}) COUNT(*) FROM visits")
    assert (err.line, err.col) == (2, 5)
    assert "must be a literal or a name" in err.message and found in err.message and err.hint


@pytest.mark.parametrize("option, value, problem", [
    ("epsilon", "user_id", "must be a number"),
    ("delta", "'1e-7'", "must be a number"),
    ("epsilon", "TRUE", "must be a number"),
    ("max_groups_contributed", "2.5", "must be a whole number"),
    ("max_rows_contributed", "'3'", "must be a whole number"),
    ("privacy_unit_column", "3", "must be a column name"),
    ("noise", "uniform", "must be laplace or gaussian"),
])
def test_values_of_the_wrong_kind_are_refused(option, value, problem):
    err = refusal(f"SELECT WITH DIFFERENTIAL_PRIVACY OPTIONS ({option} = {value}) 1")
    assert (err.line, err.col) == (1, 43)
    assert f"{option!r} {problem}" in err.message


@pytest.mark.parametrize("sql, line, col", [
    ("SELECT * FROM (\n  SELECT WITH DIFFERENTIAL_PRIVACY OPTIONS (epsilon = 1) COUNT(*) FROM visits)", 2, 10),
    ("WITH c AS (SELECT WITH DIFFERENTIAL_PRIVACY OPTIONS (epsilon = 1) COUNT(*) AS n FROM visits)\n"
     "SELECT n FROM c", 1, 19),
    ("SELECT (SELECT WITH DIFFERENTIAL_PRIVACY COUNT(*) FROM visits) AS n", 1, 16),
    ("SELECT 1 FROM t WHERE x IN (SELECT WITH DIFFERENTIAL_PRIVACY x FROM visits)", 1, 36),
    ("SELECT WITH DIFFERENTIAL_PRIVACY OPTIONS (epsilon = 1) COUNT(*) FROM visits\n"
     "UNION ALL SELECT 1", 1, 8),
    ("SELECT 1 UNION ALL\nSELECT WITH DIFFERENTIAL_PRIVACY OPTIONS (epsilon = 1) COUNT(*) FROM visits", 2, 8),
    ("(SELECT WITH DIFFERENTIAL_PRIVACY OPTIONS (epsilon = 1) COUNT(*) FROM visits)", 1, 9),
])
def test_clause_only_on_the_outermost_select(sql, line, col):
    err = refusal(sql)
    assert (err.line, err.col) == (line, col)
    assert "outermost SELECT" in err.message and err.hint


def test_inner_clause_is_refused_even_when_the_outer_one_is_fine():
    err = refusal("SELECT WITH DIFFERENTIAL_PRIVACY OPTIONS (epsilon = 1) COUNT(*) FROM "
                  "(SELECT WITH DIFFERENTIAL_PRIVACY OPTIONS (epsilon = 9) * FROM visits)")
    assert (err.line, err.col) == (1, 78)


@pytest.mark.parametrize("sql, description, line, col", [
    # sqlglot reports the column where the offending token ends, as for every parse error.
    ("SELECT WITH DIFFERENTIAL_PRIVACY OPTIONS (epsilon 0.5) 1", "Expected '='", 1, 53),
    ("SELECT WITH DIFFERENTIAL_PRIVACY OPTIONS epsilon = 1 1", "Expecting (", 1, 48),
    ("SELECT WITH DIFFERENTIAL_PRIVACY OPTIONS (epsilon = ) 1", "Expected a value", 1, 53),
    ("SELECT WITH DIFFERENTIAL_PRIVACY OPTIONS (epsilon = 1 1", "Expecting )", 1, 55),
    ("SELECT WITH DIFFERENTIAL_PRIVACY OPTIONS ('epsilon' = 1) 1", "Expected an option name", 1, 51),
    ("SELECT WITH DIFFERENTIAL_PRIVACY OPTIONS (epsilon = 1, ) 1", "Expected an option name", 1, 56),
    ("SELECT DISTINCT WITH DIFFERENTIAL_PRIVACY OPTIONS (epsilon = 1) x FROM t", "Invalid expression", 1, 20),
])
def test_malformed_clause_is_a_positioned_parse_error(sql, description, line, col):
    with pytest.raises(ParseError) as info:
        parse(sql)
    first = info.value.errors[0]
    assert first["description"].startswith(description)
    assert (first["line"], first["col"]) == (line, col)


# ---------------------------------------------------------------------------------------------
# Everything else is DuckDB, unchanged.

DUCKDB_QUERIES = [
    "SELECT 1",
    "SELECT a, b AS c FROM t WHERE a > 1 AND b IS NOT NULL ORDER BY a DESC NULLS LAST LIMIT 10 OFFSET 5",
    "SELECT DISTINCT a FROM t",
    "SELECT DISTINCT ON (a) a, b FROM t ORDER BY a, b",
    "SELECT store, COUNT(*) AS n, SUM(amount) FROM visits GROUP BY store HAVING COUNT(*) > 3",
    "SELECT COUNT(*) FILTER (WHERE amount > 10) FROM visits",
    "SELECT * FROM a JOIN b ON a.id = b.id LEFT JOIN c USING (id) CROSS JOIN d",
    "SELECT * FROM a ASOF JOIN b ON a.id = b.id AND a.ts >= b.ts",
    "SELECT * FROM a POSITIONAL JOIN b",
    "SELECT * FROM a NATURAL JOIN b SEMI JOIN c ON TRUE",
    "WITH x AS (SELECT 1 AS a) SELECT * FROM x",
    "WITH RECURSIVE r(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM r WHERE n < 5) SELECT n FROM r",
    "WITH x AS (SELECT 1), y AS (SELECT * FROM x) SELECT * FROM y",
    "SELECT * FROM (WITH x AS (SELECT 1) SELECT * FROM x) AS s",
    "SELECT (WITH x AS (SELECT 1 AS a) SELECT a FROM x) AS v",
    "SELECT a, ROW_NUMBER() OVER (PARTITION BY b ORDER BY c ROWS BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW) FROM t",
    "SELECT a, SUM(b) OVER w FROM t WINDOW w AS (PARTITION BY a ORDER BY b)",
    "SELECT a FROM t QUALIFY ROW_NUMBER() OVER (PARTITION BY a ORDER BY b) = 1",
    "SELECT * EXCLUDE (a, b) FROM t",
    "SELECT * REPLACE (a + 1 AS a) FROM t",
    "SELECT COLUMNS('amount_.*') FROM t",
    "FROM t SELECT a, b WHERE a > 1",
    "FROM t",
    "SELECT a::INTEGER, CAST(b AS VARCHAR), TRY_CAST(c AS DOUBLE), '2024-01-01'::DATE FROM t",
    "SELECT list_transform([1, 2, 3], x -> x + 1), list_filter(l, (x, i) -> x > i) FROM t",
    "SELECT {'a': 1, 'b': 'x'} AS s, [1, 2][1], s.a FROM t",
    "SELECT a FROM t GROUP BY ALL ORDER BY ALL",
    "SELECT CASE WHEN a > 0 THEN 'pos' WHEN a < 0 THEN 'neg' ELSE 'zero' END FROM t",
    "SELECT a FROM t WHERE EXISTS (SELECT 1 FROM u WHERE u.id = t.id) AND b IN (SELECT b FROM v)",
    "SELECT a FROM t UNION SELECT a FROM u EXCEPT SELECT a FROM v",
    "SELECT * FROM t UNION ALL BY NAME SELECT * FROM u",
    "SELECT a ILIKE '%x%', b IS DISTINCT FROM c, d BETWEEN 1 AND 2 FROM t",
    "SELECT date_trunc('month', ts), ts + INTERVAL 1 DAY, EXTRACT(year FROM ts) FROM t",
    "SELECT * FROM t USING SAMPLE 10%",
    "SELECT UNNEST([1, 2, 3]) AS x",
    "SELECT a // 2, a % 3, a ** 2, 'a' || 'b' FROM t",
    "SELECT quantile_cont(x, 0.5), approx_count_distinct(y), string_agg(z, ',' ORDER BY z) FROM t",
    "PIVOT t ON a USING SUM(b)",
    "SELECT with_col, differential_privacy, options FROM t",
    'SELECT "with", "differential_privacy" FROM t',
    "SELECT x AS differential_privacy FROM t",
    "SELECT $1, ? FROM t",
    "INSERT INTO t SELECT 1",
    "UPDATE t SET a = 1 WHERE b = 2",
    "DELETE FROM t WHERE a = 1",
    "SUMMARIZE t",
    "/* comment */ SELECT a -- trailing\nFROM t",
]


def test_there_are_enough_duckdb_queries():
    assert len(DUCKDB_QUERIES) >= 30


@pytest.mark.parametrize("sql", DUCKDB_QUERIES)
def test_duckdb_queries_parse_identically(sql):
    ours, theirs = parse(sql), sqlglot.parse_one(sql, read=DIALECT)
    assert ours == theirs
    assert repr(ours) == repr(theirs)
    assert ours.sql(dialect=READ_DIALECT) == theirs.sql(dialect=DIALECT)
    assert ours.sql(dialect=READ_DIALECT, pretty=True) == theirs.sql(dialect=DIALECT, pretty=True)
    assert ours.find(DPOptions) is None and dp_options(ours) == {}


@pytest.mark.parametrize("sql", [
    "SELECT WITH x AS (SELECT 1) SELECT * FROM x",
    "SELECT WITH FROM t",
    "SELECT FROM WHERE",
    "SELECT (1",
])
def test_invalid_duckdb_stays_invalid(sql):
    with pytest.raises(ParseError):
        sqlglot.parse_one(sql, read=DIALECT)
    with pytest.raises(ParseError):
        parse(sql)


def test_a_cte_is_still_a_cte():
    tree = parse("WITH differential_privacy AS (SELECT 1 AS a) SELECT a FROM differential_privacy")
    assert tree.args["with_"].expressions[0].alias == "differential_privacy"
    assert tree.find(DPOptions) is None
