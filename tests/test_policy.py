"""The policy language: parsing to the exact Policy, errors that point at the text, checks
against a real DuckDB catalog, and the round trip back to text."""

from __future__ import annotations

from fractions import Fraction
from pathlib import Path

import duckdb
import pandas as pd
import pytest

from dpsql.backends.duckdb import read_catalog
from dpsql.errors import PolicyError
from dpsql.policy.language import (
    check_policy,
    load_policy,
    parse_policy,
    policy_to_text,
    validate_policy,
)
from dpsql.policy.model import (
    Bounds,
    ColumnRule,
    KeyDomain,
    Policy,
    Position,
    PrivateTable,
    PublicTable,
)

DESIGN_EXAMPLE = """\
BUDGET EPSILON 3.0 DELTA 1e-6;
NEIGHBOURS UNBOUNDED;                 -- or BOUNDED
QUERY EPSILON 0.1;                    -- default cost of one query when none is given

PRIVATE TABLE visits (
    PRIVACY UNIT user_id,             -- or PRIVACY UNIT ROW
    MAX ROWS PER UNIT 10,
    MAX GROUPS PER UNIT 5,
    amount BOUNDS 0 TO 500,
    age BOUNDS 18 TO 90,
    store KEYS FROM stores.store      -- public domain of a grouping column
);
PUBLIC TABLE stores;
"""

DESIGN_POLICY = Policy(
    budget_epsilon=Fraction(3),
    budget_delta=Fraction(1, 10**6),
    neighbours="unbounded",
    query_epsilon=Fraction(1, 10),
    query_delta=Fraction(0),
    noise="laplace",
    private_tables=(
        PrivateTable(
            name="visits",
            unit="user_id",
            max_rows_per_unit=10,
            max_groups_per_unit=5,
            columns=(
                ColumnRule("amount", bounds=Bounds(Fraction(0), Fraction(500))),
                ColumnRule("age", bounds=Bounds(Fraction(18), Fraction(90))),
                ColumnRule("store", keys=KeyDomain(table="stores", column="store")),
            ),
        ),
    ),
    public_tables=(PublicTable("stores"),),
)

BUDGET = "BUDGET EPSILON 1;\n"


def at(text: str, fragment: str, occurrence: int = 1) -> tuple[int, int]:
    """1-based (line, column) of the n-th occurrence of ``fragment`` in ``text``."""
    offset = -1
    for _ in range(occurrence):
        offset = text.index(fragment, offset + 1)
    line = text.count("\n", 0, offset) + 1
    return line, offset - (text.rfind("\n", 0, offset) + 1) + 1


def policy_error(text: str) -> PolicyError:
    with pytest.raises(PolicyError) as caught:
        parse_policy(text)
    return caught.value


def table_of(text: str) -> PrivateTable:
    return parse_policy(BUDGET + text).private_tables[0]


# -- the DESIGN example -------------------------------------------------------------------


def test_design_example_parses_to_the_exact_policy():
    policy = parse_policy(DESIGN_EXAMPLE)
    assert policy == DESIGN_POLICY
    assert isinstance(policy.budget_delta, Fraction)  # exact, never a float


def test_design_example_records_positions():
    policy = parse_policy(DESIGN_EXAMPLE)
    visits = policy.table("visits")
    assert visits.position == Position(5, 15)
    assert [rule.position for rule in visits.columns] == [
        Position(9, 5), Position(10, 5), Position(11, 5)]
    assert policy.table("stores").position == Position(13, 14)


# -- every statement and item form --------------------------------------------------------


def test_budget_forms():
    assert parse_policy("BUDGET EPSILON 2;").budget_delta == 0
    policy = parse_policy("BUDGET EPSILON .5 DELTA 1E-6;")
    assert (policy.budget_epsilon, policy.budget_delta) == (Fraction(1, 2), Fraction(1, 10**6))
    assert parse_policy("BUDGET EPSILON 1.25e+1;").budget_epsilon == Fraction(25, 2)


def test_numbers_are_exact_decimals_not_floats():
    policy = parse_policy("BUDGET EPSILON 0.1 DELTA 0.3;")
    assert policy.budget_epsilon == Fraction(1, 10)
    assert policy.budget_delta == Fraction(3, 10)  # float(0.3) is not 3/10


@pytest.mark.parametrize("word", ["NEIGHBOURS", "NEIGHBORS", "neighbours", "Neighbors"])
@pytest.mark.parametrize("relation", ["bounded", "unbounded"])
def test_neighbours_both_spellings(word, relation):
    assert parse_policy(f"{BUDGET}{word} {relation.upper()};").neighbours == relation


def test_defaults_when_optional_statements_are_absent():
    policy = parse_policy(BUDGET)
    assert policy == Policy(budget_epsilon=Fraction(1))
    assert (policy.neighbours, policy.noise, policy.query_epsilon) == ("unbounded", "laplace", None)


def test_query_and_noise():
    policy = parse_policy("BUDGET EPSILON 1 DELTA 1e-5; QUERY EPSILON 0.25 DELTA 1e-7; "
                          "NOISE GAUSSIAN;")
    assert (policy.query_epsilon, policy.query_delta) == (Fraction(1, 4), Fraction(1, 10**7))
    assert policy.noise == "gaussian"
    assert parse_policy(BUDGET + "NOISE laplace;").noise == "laplace"


def test_privacy_unit_row_means_one_row_per_unit():
    table = table_of("PRIVATE TABLE t (PRIVACY UNIT ROW);")
    assert (table.unit, table.max_rows_per_unit, table.row_level) == (None, 1, True)
    assert table_of("PRIVATE TABLE t (PRIVACY UNIT ROW, MAX ROWS PER UNIT 1);") == table


def test_negative_and_fractional_bounds():
    table = table_of("PRIVATE TABLE t (PRIVACY UNIT ROW, x BOUNDS -2.5 TO +1e2, "
                     "y BOUNDS -3 TO -3);")
    assert table.column("x").bounds == Bounds(Fraction(-5, 2), Fraction(100))
    assert table.column("y").bounds == Bounds(Fraction(-3), Fraction(-3))


def test_keys_list_of_strings_and_numbers():
    table = table_of("PRIVATE TABLE t (PRIVACY UNIT ROW, "
                     "c KEYS ('web', 'it''s', '', 3, -1.5, 2.0));")
    assert table.column("c").keys == KeyDomain(values=("web", "it's", "", 3, Fraction(-3, 2), 2))
    assert [type(v) for v in table.column("c").keys.values[3:]] == [int, Fraction, int]


def test_keys_from_a_qualified_public_table():
    policy = parse_policy(BUDGET + "PRIVATE TABLE t (PRIVACY UNIT ROW, c KEYS FROM s.dims.code);"
                                   "PUBLIC TABLE s.dims;")
    assert policy.table("t").column("c").keys == KeyDomain(table="s.dims", column="code")
    assert policy.public_tables == (PublicTable("s.dims"),)


def test_bounds_and_keys_of_one_column_merge_into_one_rule():
    table = table_of("PRIVATE TABLE t (PRIVACY UNIT ROW, n BOUNDS 0 TO 9, x BOUNDS 1 TO 2, "
                     "N KEYS (1, 2));")
    assert table.columns == (
        ColumnRule("n", bounds=Bounds(Fraction(0), Fraction(9)), keys=KeyDomain(values=(1, 2))),
        ColumnRule("x", bounds=Bounds(Fraction(1), Fraction(2))),
    )


def test_quoted_and_qualified_names():
    policy = parse_policy(BUDGET + 'PRIVATE TABLE "My Schema"."Odd ""T""" (PRIVACY UNIT "user id", '
                                   'MAX ROWS PER UNIT 2, "max" BOUNDS 0 TO 1, "ROW" KEYS (1));')
    table = policy.private_tables[0]
    assert table.name == 'My Schema.Odd "T"'
    assert table.unit == "user id"
    assert [rule.name for rule in table.columns] == ["max", "ROW"]


def test_keywords_are_names_where_no_keyword_is_expected():
    # Only item-opening words (PRIVACY, MAX) and ROW after PRIVACY UNIT are reserved.
    table = table_of("PRIVATE TABLE budget (PRIVACY UNIT unit, MAX ROWS PER UNIT 3, "
                     "rows BOUNDS 0 TO 1, bounds KEYS FROM keys.from); PUBLIC TABLE keys;")
    assert (table.name, table.unit) == ("budget", "unit")
    assert table.column("bounds").keys == KeyDomain(table="keys", column="from")


def test_unicode_identifiers():
    table = table_of("PRIVATE TABLE straße (PRIVACY UNIT ROW, größe BOUNDS 0 TO 3);")
    assert (table.name, table.columns[0].name) == ("straße", "größe")


# -- comments and case --------------------------------------------------------------------


def test_comments_and_case_insensitive_keywords():
    text = ("-- a policy\nbudget Epsilon 1 delta 0.5; -- trailing\n"
            "private TABLE T (\n  -- between items\n  privacy unit U, max rows per unit 4,\n"
            "  Max Groups Per Unit 2, x bounds 0 to 1 -- last\n);\npublic table P; -- end")
    policy = parse_policy(text)
    assert policy == Policy(
        budget_epsilon=Fraction(1), budget_delta=Fraction(1, 2),
        private_tables=(PrivateTable(
            "T", unit="U", max_rows_per_unit=4, max_groups_per_unit=2,
            columns=(ColumnRule("x", Bounds(Fraction(0), Fraction(1))),)),),
        public_tables=(PublicTable("P"),))


def test_names_keep_their_case_and_match_case_insensitively():
    policy = parse_policy(BUDGET + "PRIVATE TABLE Visits (PRIVACY UNIT ROW, Amount BOUNDS 0 TO 1);")
    assert policy.private_tables[0].name == "Visits"
    assert policy.table("VISITS").column("amount").name == "Amount"


def test_comment_markers_inside_strings_are_text():
    table = table_of("PRIVATE TABLE t (PRIVACY UNIT ROW, c KEYS ('a--b', ';'));")
    assert table.column("c").keys.values == ("a--b", ";")


# -- syntax errors ------------------------------------------------------------------------

SYNTAX_ERRORS = [
    # (text, fragment marking the position, message fragment, hint fragment)
    ("BUDGET EPSILON 1\nNEIGHBOURS BOUNDED;", "NEIGHBOURS", "found 'NEIGHBOURS' where ';'", ";"),
    (BUDGET + "PRIVATE TABLE t (\n  PRIVACY UNIT ROW,\n);", ");", "found ')' where MAX, PRIVACY "
     "or a name was expected", "remove the comma"),
    (BUDGET + "PRIVATE TABLE t (PRIVACY UNIT ROW, -- c\n  -- more\n);", ");", "found ')'",
     "remove the comma"),
    (BUDGET + "PRIVATE TABLE t (PRIVACY UNIT ROW, x KEYS ('a',));", "));", "found ')' where a "
     "number or a quoted string", "remove the comma"),
    (BUDGET + "PRIVATE TABLE t ();", ");", "found ')'", None),
    ("BUDGET EPSILON lots;", "lots", "found 'lots' where a number was expected", None),
    ("BUDGET EPSILON @;", "@", "found '@' where a number was expected", None),
    ("BUDGET EPSILON 1; SELECT 1;", "SELECT", "where ACCOUNTING, BUDGET, MAX, NEIGHBORS, NEIGHBOURS, "
     "NOISE, PRIVATE, PUBLIC, QUERY or REPORT was expected", None),
    ("BUDGET DELTA 1;", "DELTA", "found 'DELTA' where EPSILON or PER was expected", None),
    ("BUDGET PER EPSILON 1;", "EPSILON", "found 'EPSILON' where ANALYST was expected", None),
    ("BUDGET EPSILON 1; ACCOUNTING RDP;", "RDP", "where ADVANCED, BASIC or ZCDP was expected",
     None),
    ("NOISE UNIFORM;", "UNIFORM", "where GAUSSIAN or LAPLACE was expected", None),
    ("NEIGHBOURS SOME;", "SOME", "where BOUNDED or UNBOUNDED was expected", None),
    (BUDGET + "PRIVATE TABLE t (PRIVACY UNIT ROW, max BOUNDS 0 TO 1);", "BOUNDS 0",
     "where GROUPS, LIST, ROWS or STRING was expected", 'double-quote a column named like a keyword'),
    (BUDGET + "PRIVATE TABLE t (PRIVACY UNIT ROW, x BOUNDS 0 1);", "1);", "where TO was expected",
     None),
    (BUDGET + "PRIVATE TABLE t (PRIVACY UNIT ROW, x KEYS FROM dims);", ");", "found ')' where "
     "'.' was expected", None),
    (BUDGET + "PRIVATE TABLE t (PRIVACY UNIT ROW, x KEYS ('open));", "'open", "found \"'\"", None),
    (BUDGET + "PRIVATE TABLE a.b.c (PRIVACY UNIT ROW);", ".c", "found '.' where '(' was expected",
     None),
]


@pytest.mark.parametrize("text, fragment, message, hint", SYNTAX_ERRORS)
def test_syntax_errors_name_line_column_and_expectation(text, fragment, message, hint):
    err = policy_error(text)
    assert (err.line, err.col) == at(text, fragment)
    assert err.message.startswith("syntax error: ")
    assert message in err.message
    if hint is not None:
        assert hint in err.hint
    assert "Token(" not in str(err) and "\n" not in str(err)  # one sentence, not a lark dump


def test_missing_semicolon_at_the_end_points_after_the_last_token():
    err = policy_error("BUDGET EPSILON 3 DELTA 0.1")
    assert (err.line, err.col) == (1, 27)
    assert "found the end of the policy where ';' was expected" in err.message
    assert "end every statement with ';'" in err.hint


def test_number_with_a_huge_exponent_is_refused_before_it_is_built():
    err = policy_error("BUDGET EPSILON 1e999999999;")
    assert (err.line, err.col, "out of range" in err.message) == (1, 16, True)


# -- errors the text alone decides --------------------------------------------------------

PRIVATE = "PRIVATE TABLE t (PRIVACY UNIT u, MAX ROWS PER UNIT 3, "

SEMANTIC_ERRORS = [
    # (text, fragment marking the position, occurrence, message fragment)
    ("", None, 1, "the policy has no BUDGET"),
    ("NEIGHBOURS BOUNDED;\nPUBLIC TABLE x;", None, 1, "the policy has no BUDGET"),
    ("BUDGET EPSILON 1;\nBUDGET EPSILON 2;", "BUDGET", 2, "BUDGET is given twice"),
    (BUDGET + "QUERY EPSILON 0.1;\nQUERY EPSILON 0.2;", "QUERY", 2, "QUERY is given twice"),
    (BUDGET + "NOISE LAPLACE; NOISE LAPLACE;", "NOISE", 2, "NOISE is given twice"),
    (BUDGET + "NEIGHBOURS BOUNDED; NEIGHBORS BOUNDED;", "NEIGHBORS", 1,
     "NEIGHBOURS is given twice"),
    ("BUDGET EPSILON 0;", "0", 1, "BUDGET EPSILON must be greater than 0, not 0"),
    ("BUDGET EPSILON -1;", "-1", 1, "BUDGET EPSILON must be greater than 0, not -1"),
    ("BUDGET EPSILON 1 DELTA -1e-9;", "-1e-9", 1, "BUDGET DELTA must be at least 0 and less "
     "than 1, not -1E-9"),
    ("BUDGET EPSILON 1 DELTA 1;", "1;", 1, "BUDGET DELTA must be at least 0 and less than 1"),
    ("BUDGET EPSILON 1 DELTA 0.1;\nQUERY EPSILON 0;", "0;", 1, "QUERY EPSILON must be greater"),
    ("BUDGET EPSILON 1 DELTA 0.1;\nQUERY EPSILON 1 DELTA 1.5;", "1.5", 1, "QUERY DELTA must be"),
    ("BUDGET EPSILON 1;\nQUERY EPSILON 1.5;", "1.5", 1, "QUERY EPSILON 1.5 is more than BUDGET "
     "EPSILON 1"),
    ("BUDGET EPSILON 1 DELTA 1e-6;\nQUERY EPSILON 1 DELTA 1e-5;", "1e-5", 1, "QUERY DELTA 0.00001 "
     "is more than BUDGET DELTA 0.000001"),
    ("BUDGET EPSILON 1;\nQUERY EPSILON 1 DELTA 1e-9;", "1e-9", 1, "QUERY DELTA 1E-9 is more than "
     "BUDGET DELTA 0"),
    ("BUDGET EPSILON 1;\nNOISE GAUSSIAN;", "NOISE", 1, "NOISE GAUSSIAN needs a budget delta"),
    ("BUDGET EPSILON 1 DELTA 0;\n  NOISE GAUSSIAN;", "NOISE", 1, "NOISE GAUSSIAN needs"),
    (BUDGET + "PRIVATE TABLE t (MAX ROWS PER UNIT 2);", "t (", 1, "private table t has no "
     "PRIVACY UNIT"),
    (BUDGET + "PRIVATE TABLE t (PRIVACY UNIT a, MAX ROWS PER UNIT 2, PRIVACY UNIT ROW);",
     "PRIVACY", 2, "PRIVACY UNIT of table t is given twice"),
    (BUDGET + "PRIVATE TABLE t (\n  PRIVACY UNIT u,\n  x BOUNDS 0 TO 1);", "PRIVACY", 1,
     "the privacy unit u of table t has no MAX ROWS PER UNIT"),
    (BUDGET + "PRIVATE TABLE t (PRIVACY UNIT ROW, MAX ROWS PER UNIT 5);", "MAX", 1,
     "has PRIVACY UNIT ROW, so MAX ROWS PER UNIT must be 1, not 5"),
    (BUDGET + "PRIVATE TABLE t (PRIVACY UNIT u, MAX ROWS PER UNIT 0);", "MAX", 1,
     "MAX ROWS PER UNIT must be a whole number of at least 1, not 0"),
    (BUDGET + "PRIVATE TABLE t (PRIVACY UNIT u, MAX ROWS PER UNIT -2);", "MAX", 1,
     "MAX ROWS PER UNIT must be a whole number of at least 1, not -2"),
    (BUDGET + "PRIVATE TABLE t (PRIVACY UNIT u, MAX ROWS PER UNIT 2.5);", "2.5", 1,
     "MAX ROWS PER UNIT must be a whole number, not 2.5"),
    (BUDGET + PRIVATE + "MAX GROUPS PER UNIT 0);", "MAX GROUPS", 1,
     "MAX GROUPS PER UNIT must be a whole number of at least 1"),
    (BUDGET + PRIVATE + "MAX ROWS PER UNIT 4);", "MAX", 2, "MAX ROWS PER UNIT of table t is "
     "given twice"),
    (BUDGET + PRIVATE + "MAX GROUPS PER UNIT 1, MAX GROUPS PER UNIT 2);", "MAX", 3,
     "MAX GROUPS PER UNIT of table t is given twice"),
    (BUDGET + PRIVATE + "\n  x BOUNDS 5 TO 1);", "x BOUNDS", 1, "the BOUNDS of column x of table "
     "t are reversed: 5 is more than 1"),
    (BUDGET + PRIVATE + "x BOUNDS 0 TO 1, X BOUNDS 0 TO 2);", "X BOUNDS", 1, "column X of table t "
     "is given BOUNDS twice"),
    (BUDGET + PRIVATE + "x KEYS (1), x KEYS FROM d.x); PUBLIC TABLE d;", "x KEYS FROM", 1,
     "column x of table t is given KEYS twice"),
    (BUDGET + "PRIVATE TABLE t (PRIVACY UNIT ROW);\nPRIVATE TABLE T (PRIVACY UNIT ROW);", "T (",
     1, "table T is declared twice"),
    (BUDGET + "PRIVATE TABLE t (PRIVACY UNIT ROW);\nPUBLIC TABLE t;", "t;", 1,
     "table t is declared twice"),
    (BUDGET + "PUBLIC TABLE d;\nPUBLIC TABLE D;", "D;", 1, "table D is declared twice"),
    (BUDGET + PRIVATE + "U BOUNDS 0 TO 1);", "U BOUNDS", 1, "the privacy unit column U of table t "
     "cannot have BOUNDS or KEYS"),
    (BUDGET + PRIVATE + "u KEYS (1, 2));", "u KEYS", 1, "the privacy unit column u"),
    (BUDGET + PRIVATE + "c KEYS FROM d.c);", "c KEYS", 1, "KEYS FROM d.c of column c in table t: "
     "d is not a declared table"),
    (BUDGET + PRIVATE + "c KEYS FROM p.c);\nPRIVATE TABLE p (PRIVACY UNIT ROW);", "c KEYS", 1,
     "p is a private table"),
]


@pytest.mark.parametrize("text, fragment, occurrence, message", SEMANTIC_ERRORS)
def test_semantic_errors_point_at_the_offending_item(text, fragment, occurrence, message):
    err = policy_error(text)
    expected = (1, 1) if fragment is None else at(text, fragment, occurrence)
    assert (err.line, err.col) == expected
    assert message in err.message
    assert err.hint


def test_hints_say_what_to_write():
    assert "MAX ROWS PER UNIT k" in policy_error(
        BUDGET + "PRIVATE TABLE t (PRIVACY UNIT u);").hint
    assert "PUBLIC TABLE d;" in policy_error(
        BUDGET + "PRIVATE TABLE t (PRIVACY UNIT ROW, c KEYS FROM d.c);").hint
    assert "BUDGET EPSILON" in policy_error("").hint
    assert "line 1, column 1" in policy_error("BUDGET EPSILON 1; BUDGET EPSILON 2;").hint


def test_public_table_may_be_declared_after_its_use_in_keys_from():
    assert parse_policy(DESIGN_EXAMPLE).table("stores") == PublicTable("stores")


# -- checking against the database --------------------------------------------------------


@pytest.fixture
def con():
    connection = duckdb.connect()
    connection.execute(
        "CREATE TABLE visits(user_id INTEGER, day DATE, store VARCHAR, amount DOUBLE, "
        "age INTEGER, zip VARCHAR);"
        "CREATE TABLE stores(store VARCHAR, city VARCHAR, size INTEGER);")
    yield connection
    connection.close()


@pytest.fixture
def catalog(con):
    return read_catalog(con)


def test_read_catalog_reads_columns_in_order(catalog):
    assert catalog == {
        "visits": {"user_id": "INTEGER", "day": "DATE", "store": "VARCHAR", "amount": "DOUBLE",
                   "age": "INTEGER", "zip": "VARCHAR"},
        "stores": {"store": "VARCHAR", "city": "VARCHAR", "size": "INTEGER"},
    }
    assert list(catalog["visits"]) == ["user_id", "day", "store", "amount", "age", "zip"]


def test_read_catalog_keys_other_schemas_and_sees_views_and_dataframes(con):
    con.execute('CREATE SCHEMA Sales; CREATE TABLE Sales."Orders"("Total" DECIMAL(10,2));'
                "CREATE VIEW big AS SELECT * FROM stores WHERE size > 10")
    con.register("frame", pd.DataFrame({"n": [1, 2]}))
    con.register("stores", pd.DataFrame({"only": ["shadow"]}))  # temp objects shadow main ones
    catalog = read_catalog(con)
    assert catalog["sales.orders"] == {"total": "DECIMAL(10,2)"}
    assert catalog["big"] == {"store": "VARCHAR", "city": "VARCHAR", "size": "INTEGER"}
    assert catalog["frame"] == {"n": "BIGINT"}
    assert catalog["stores"] == {"only": "VARCHAR"}


def test_design_example_matches_the_database(catalog):
    check_policy(parse_policy(DESIGN_EXAMPLE), catalog)


def test_check_policy_matches_names_case_insensitively():
    policy = parse_policy(BUDGET + "PRIVATE TABLE VISITS (PRIVACY UNIT User_ID, "
                                   "MAX ROWS PER UNIT 1, AMOUNT BOUNDS 0 TO 1, "
                                   "Store KEYS FROM Stores.STORE); PUBLIC TABLE stores;")
    check_policy(policy, {"Visits": {"USER_ID": "INTEGER", "amount": "DOUBLE", "store": "VARCHAR"},
                          "stores": {"store": "VARCHAR"}})


def test_check_policy_finds_qualified_tables(con):
    con.execute("CREATE SCHEMA s; CREATE TABLE s.events(v SMALLINT)")
    policy = parse_policy(BUDGET + "PRIVATE TABLE S.Events (PRIVACY UNIT ROW, v BOUNDS 0 TO 1);"
                                   "PUBLIC TABLE main.stores;")
    check_policy(policy, read_catalog(con))


CATALOG_ERRORS = [
    # (replace this, with that, fragment marking the position, message fragment, hint fragment)
    ("PUBLIC TABLE stores;", "PUBLIC TABLE stores; PUBLIC TABLE shops;", "shops",
     "table shops is not in the database", "the database has tables: stores, visits"),
    ("PRIVATE TABLE visits", "PRIVATE TABLE visit", "visit (", "table visit is not in the database",
     "stores, visits"),
    ("user_id,", "uid,", "visits (", "table visits has no column uid for its PRIVACY UNIT",
     "user_id, day, store, amount, age, zip"),
    ("amount BOUNDS", "price BOUNDS", "price", "table visits has no column price", "amount"),
    ("store KEYS FROM stores.store", "store KEYS FROM stores.shop", "store KEYS",
     "table stores has no column shop", "store, city, size"),
    ("store KEYS FROM stores.store", "shop KEYS FROM stores.store", "shop KEYS",
     "table visits has no column shop", None),
    ("amount BOUNDS", "zip BOUNDS", "zip BOUNDS", "BOUNDS need a numeric column, but visits.zip is "
     "VARCHAR", "KEYS"),
    ("amount BOUNDS", "day BOUNDS", "day BOUNDS", "visits.day is DATE", None),
]


@pytest.mark.parametrize("old, new, fragment, message, hint", CATALOG_ERRORS)
def test_check_policy_errors(catalog, old, new, fragment, message, hint):
    text = DESIGN_EXAMPLE.replace(old, new)
    policy = parse_policy(text)
    with pytest.raises(PolicyError) as caught:
        check_policy(policy, catalog)
    err = caught.value
    assert (err.line, err.col) == at(text, fragment)
    assert message in err.message
    if hint is not None:
        assert hint in err.hint


def test_keys_from_a_public_table_missing_from_the_database(catalog):
    text = DESIGN_EXAMPLE.replace("stores", "shops")
    with pytest.raises(PolicyError, match="table shops is not in the database"):
        check_policy(parse_policy(text), catalog)


# -- policies built in Python -------------------------------------------------------------


def test_policy_built_in_python_checks_against_the_database(catalog):
    policy = Policy(
        budget_epsilon=Fraction(1),
        private_tables=(PrivateTable("visits", unit="user_id", max_rows_per_unit=3, columns=(
            ColumnRule("amount", bounds=Bounds(Fraction(0), Fraction(100))),
            ColumnRule("store", keys=KeyDomain(values=("a", "b"))))),),
        public_tables=(PublicTable("stores"),))
    check_policy(policy, catalog)
    assert parse_policy(policy_to_text(policy)) == policy


@pytest.mark.parametrize("policy, message", [
    (Policy(budget_epsilon=0.5), "BUDGET EPSILON must be an exact number"),
    (Policy(budget_epsilon=Fraction(1), budget_delta=Fraction(2)), "BUDGET DELTA must be"),
    (Policy(budget_epsilon=Fraction(1), noise="gaussian"), "NOISE GAUSSIAN needs"),
    (Policy(budget_epsilon=Fraction(1), noise="uniform"), "noise must be one of"),
    (Policy(budget_epsilon=Fraction(1), private_tables=(
        PrivateTable("visits", max_rows_per_unit=4),)), "so MAX ROWS PER UNIT must be 1"),
    (Policy(budget_epsilon=Fraction(1), private_tables=(PrivateTable("visits", columns=(
        ColumnRule("age", bounds=Bounds(Fraction(1), 0.5)),)),)), "must be an exact number"),
    (Policy(budget_epsilon=Fraction(1), private_tables=(PrivateTable("visits", columns=(
        ColumnRule("age", bounds=Bounds(Fraction(1), Fraction(0))),)),)), "reversed"),
    (Policy(budget_epsilon=Fraction(1), private_tables=(PrivateTable("visits", columns=(
        ColumnRule("age", bounds=Bounds(Fraction(0), Fraction(1))),
        ColumnRule("AGE", keys=KeyDomain(values=(1,))))),)), "is ruled twice"),
    (Policy(budget_epsilon=Fraction(1), private_tables=(PrivateTable("visits", columns=(
        ColumnRule("store", keys=KeyDomain(table="stores", column="store")),)),)),
     "stores is not a declared table"),
    (Policy(budget_epsilon=Fraction(1), private_tables=(PrivateTable("visits"),),
            public_tables=(PublicTable("VISITS"),)), "declared twice"),
])
def test_invalid_python_policies_are_refused(catalog, policy, message):
    with pytest.raises(PolicyError, match=message):
        validate_policy(policy)
    with pytest.raises(PolicyError, match=message):
        check_policy(policy, catalog)


# -- round trip ---------------------------------------------------------------------------

ALL_FORMS = """\
budget epsilon 2.5 delta 1e-9;  -- every form at once
neighbors bounded;
query epsilon 0.125 delta 1E-10;
noise gaussian;
private table s.t (privacy unit "user id", max rows per unit 7, max groups per unit 2,
    "max" bounds -1.5 to 1e3, "max" keys (1, 2.25, -3),
    name keys ('a', 'it''s', 'say "hi"'), code keys from s.dims.code, tiny bounds 0 to 0.0001);
private table "Row Level" (privacy unit row, v bounds -10 to 10);
public table s.dims;
"""


@pytest.mark.parametrize("text", [DESIGN_EXAMPLE, ALL_FORMS, BUDGET])
def test_round_trip_through_text(text):
    policy = parse_policy(text)
    rendered = policy_to_text(policy)
    assert parse_policy(rendered) == policy
    assert policy_to_text(parse_policy(rendered)) == rendered


def test_policy_to_text_renders_the_design_example():
    assert policy_to_text(parse_policy(DESIGN_EXAMPLE)) == """\
BUDGET EPSILON 3 DELTA 0.000001;
NEIGHBOURS UNBOUNDED;
QUERY EPSILON 0.1;
NOISE LAPLACE;

PRIVATE TABLE visits (
    PRIVACY UNIT user_id,
    MAX ROWS PER UNIT 10,
    MAX GROUPS PER UNIT 5,
    amount BOUNDS 0 TO 500,
    age BOUNDS 18 TO 90,
    store KEYS FROM stores.store
);

PUBLIC TABLE stores;
"""


def test_policy_to_text_quotes_names_that_need_it():
    text = policy_to_text(parse_policy(ALL_FORMS))
    assert 'PRIVACY UNIT "user id"' in text and '"max" BOUNDS -1.5 TO 1000' in text
    assert "name KEYS ('a', 'it''s', 'say \"hi\"')" in text
    assert "code KEYS FROM s.dims.code" in text and 'PRIVATE TABLE "Row Level"' in text
    assert "tiny BOUNDS 0 TO 0.0001" in text and "DELTA 1E-9" in text


def test_non_decimal_fractions_round_outward():
    third = Fraction(1, 3)
    policy = Policy(budget_epsilon=third, private_tables=(PrivateTable("t", columns=(
        ColumnRule("x", bounds=Bounds(-third, third)),)),))
    reread = parse_policy(policy_to_text(policy))
    bounds = reread.table("t").column("x").bounds
    assert reread.budget_epsilon <= third  # never more budget than stated
    assert bounds.lower <= -third and bounds.upper >= third  # clamping only gets looser
    assert third - reread.budget_epsilon < Fraction(1, 10**16)


# -- load_policy --------------------------------------------------------------------------


def test_load_policy_from_a_path(tmp_path):
    path = tmp_path / "shop.policy"
    path.write_text(DESIGN_EXAMPLE, encoding="utf-8")
    assert load_policy(path) == DESIGN_POLICY
    assert load_policy(str(path)) == DESIGN_POLICY


def test_load_policy_from_text_and_object():
    assert load_policy(DESIGN_EXAMPLE) == DESIGN_POLICY
    assert load_policy("BUDGET EPSILON 1;") == Policy(budget_epsilon=Fraction(1))
    assert load_policy(DESIGN_POLICY) is DESIGN_POLICY


def test_load_policy_reports_a_missing_file(tmp_path):
    with pytest.raises(PolicyError, match="no policy file"):
        load_policy(str(tmp_path / "missing.policy"))
    with pytest.raises(PolicyError, match="no policy file"):
        load_policy("shop.policy")


def test_load_policy_from_a_missing_path_object(tmp_path):
    with pytest.raises(PolicyError, match="no policy file"):
        load_policy(tmp_path / "missing.policy")


def test_load_policy_errors_point_into_the_file(tmp_path):
    path = tmp_path / "bad.policy"
    path.write_text("BUDGET EPSILON 1;\nQUERY EPSILON 2;\n", encoding="utf-8")
    with pytest.raises(PolicyError) as caught:
        load_policy(path)
    assert (caught.value.line, caught.value.col) == (2, 15)


def test_grammar_file_sits_in_the_repository():
    assert (Path(__file__).resolve().parents[1] / "grammar" / "policy.lark").is_file()


# -- accounting and per-analyst budgets ----------------------------------------------------


def test_accounting_and_per_analyst_budget_statements():
    policy = parse_policy("budget epsilon 3 delta 1e-6; Budget Per Analyst Epsilon 1 Delta 1e-7;\n"
                          "accounting zcdp; query epsilon 0.5;")
    assert policy.accounting == "zcdp"
    assert (policy.analyst_budget_epsilon, policy.analyst_budget_delta) == (
        Fraction(1), Fraction(1, 10**7))
    assert parse_policy("BUDGET EPSILON 1; ACCOUNTING ADVANCED;".replace("1;", "1 DELTA 1e-9;")
                        ).accounting == "advanced"


def test_accounting_defaults_to_basic_with_no_analyst_budget():
    policy = parse_policy(BUDGET)
    assert policy.accounting == "basic" and policy.analyst_budget_epsilon is None
    assert policy.analyst_budget_delta == 0
    assert "ACCOUNTING" not in policy_to_text(policy) and "ANALYST" not in policy_to_text(policy)


@pytest.mark.parametrize("text", [
    "BUDGET EPSILON 3 DELTA 1e-6;\nBUDGET PER ANALYST EPSILON 1.5 DELTA 1e-7;\nACCOUNTING ZCDP;\n",
    "BUDGET EPSILON 3 DELTA 1e-6;\nBUDGET PER ANALYST EPSILON 1;\nACCOUNTING BASIC;\n",
    "BUDGET EPSILON 3 DELTA 1e-6;\nACCOUNTING ADVANCED;\nQUERY EPSILON 0.01;\n",
])
def test_accounting_round_trips_through_text(text):
    policy = parse_policy(text)
    assert parse_policy(policy_to_text(policy)) == policy


@pytest.mark.parametrize("text, fragment, message", [
    ("BUDGET EPSILON 3;\nACCOUNTING ZCDP;", "ACCOUNTING",
     "ACCOUNTING ZCDP needs a BUDGET DELTA greater than 0"),
    ("BUDGET EPSILON 3;\nACCOUNTING ADVANCED;", "ACCOUNTING",
     "ACCOUNTING ADVANCED needs a BUDGET DELTA greater than 0"),
    ("BUDGET EPSILON 3 DELTA 1e-6;\nBUDGET PER ANALYST EPSILON 1;\nACCOUNTING ZCDP;", "ACCOUNTING",
     "ACCOUNTING ZCDP needs a BUDGET PER ANALYST DELTA greater than 0"),
    ("BUDGET EPSILON 3;\nBUDGET PER ANALYST EPSILON 4;", "4;",
     "BUDGET PER ANALYST EPSILON 4 is more than BUDGET EPSILON 3"),
    ("BUDGET EPSILON 3 DELTA 1e-6;\nBUDGET PER ANALYST EPSILON 1 DELTA 1e-5;", "1e-5",
     "BUDGET PER ANALYST DELTA 0.00001 is more than BUDGET DELTA 0.000001"),
    ("BUDGET EPSILON 3;\nBUDGET PER ANALYST EPSILON 0;", "0;",
     "BUDGET PER ANALYST EPSILON must be greater than 0"),
    ("BUDGET EPSILON 3;\nBUDGET PER ANALYST EPSILON 1;\nQUERY EPSILON 2;", "2;",
     "QUERY EPSILON 2 is more than BUDGET PER ANALYST EPSILON 1"),
    ("BUDGET EPSILON 3;\nACCOUNTING BASIC;\nACCOUNTING ZCDP;", "ACCOUNTING ZCDP",
     "ACCOUNTING is given twice"),
    ("BUDGET EPSILON 3;\nBUDGET PER ANALYST EPSILON 1;\nBUDGET PER ANALYST EPSILON 2;",
     "BUDGET PER ANALYST EPSILON 2", "BUDGET PER ANALYST is given twice"),
])
def test_accounting_errors_point_at_the_text(text, fragment, message):
    err = policy_error(text)
    assert message in err.message
    assert (err.line, err.col) == at(text, fragment)


def test_accounting_errors_in_python_policies():
    with pytest.raises(PolicyError, match="accounting must be one of"):
        validate_policy(Policy(Fraction(1), Fraction(1, 10**6), accounting="rdp"))
    with pytest.raises(PolicyError, match="PER ANALYST DELTA needs a BUDGET PER ANALYST EPSILON"):
        validate_policy(Policy(Fraction(1), Fraction(1, 10**6), analyst_budget_delta=Fraction(1, 10**7)))
    with pytest.raises(PolicyError, match="exact number"):
        validate_policy(Policy(Fraction(1), analyst_budget_epsilon=0.5))
