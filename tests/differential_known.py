"""Known mechanisms, as the smallest neighbouring pairs that show them (issue 11, issue 16).

Each is a case the generated families of ``tests/differential_cases.py`` can draw, written out
by hand (from the fuzzer's shrunk output) so the suite checks every known mechanism on every
run, whatever the generator happens to draw in its budget.
"""

from __future__ import annotations

from differential import Case, Table
from differential_cases import KEYS_TABLE

POLICY = ("BUDGET EPSILON 1000000000 DELTA 0.9; NEIGHBOURS UNBOUNDED; QUERY EPSILON 1 DELTA 1e-6; "
          "PRIVATE TABLE t ({rules}); {public}")
UNIT = "PRIVACY UNIT uid, MAX ROWS PER UNIT 1"
ROW = "PRIVACY UNIT ROW"


def _case(family: str, rules: str, sql: str, columns: str, rows: list[tuple], unit: list[tuple],
          public: tuple[Table, ...] = (), keys: int = 0) -> Case:
    """A case adding ``unit`` to ``rows`` of ``t(columns)`` (``"uid INTEGER, c VARCHAR"``)."""
    definition = tuple(tuple(part.split(" ", 1)) for part in columns.split(", "))
    policy = POLICY.format(rules=rules, public=" ".join(f"PUBLIC TABLE {t.name};" for t in public))
    return Case(family, policy, sql, Table("t", definition, tuple(rows)), tuple(unit), public, keys=keys)


def _public(id_type: str, *ids: str) -> Table:
    return Table("p", (("id", id_type), ("w", "INTEGER")), tuple((i, str(n)) for n, i in enumerate(ids, 1)))


JOIN_COUNT = "SELECT COUNT(*) FROM t JOIN p ON t.c = p.id"

KNOWN = {
    # name: (family, case)
    "join_varchar_integer_cast_fails": _case(
        "coerced_join", UNIT, JOIN_COUNT, "uid INTEGER, c VARCHAR", [("1", "'1'")], [("99", "'x'")],
        (_public("INTEGER", "1", "2"),)),
    "join_strings_equal_one_integer": _case(
        "coerced_join", UNIT, JOIN_COUNT, "uid INTEGER, c INTEGER", [("1", "2")], [("99", "1")],
        (_public("VARCHAR", "'1'", "'01'", "' 1'", "'2'"),)),
    "join_bigints_equal_one_float": _case(
        "coerced_join", UNIT, JOIN_COUNT, "uid INTEGER, c FLOAT", [("1", "5")], [("99", "16777216")],
        (_public("BIGINT", "16777216", "16777217", "5"),)),
    "join_bigints_equal_one_double": _case(
        "coerced_join", UNIT, JOIN_COUNT, "uid INTEGER, c DOUBLE", [("1", "7")], [("99", "9007199254740992")],
        (_public("BIGINT", "9007199254740992", "9007199254740993", "7"),)),
    "row_level_join_selection_counts_rows": _case(
        "row_level_join", ROW, "SELECT t.x, COUNT(*) FROM t JOIN p ON t.c = p.id GROUP BY t.x", "x INTEGER, c INTEGER",
        [("1", "2")], [("5", "1")], (_public("INTEGER", "1", "1", "2"),), keys=1),
    "row_level_join_quantile_assumes_one_row": _case(
        "row_level_join", f"{ROW}, x BOUNDS 0 TO 10", "SELECT MEDIAN(t.x) FROM t JOIN p ON t.c = p.id",
        "x INTEGER, c INTEGER", [("1", "2")], [("5", "1")], (_public("INTEGER", "1", "1", "2"),)),
    "row_level_join_max_rows_contributed": _case(
        "row_level_join", ROW, "SELECT WITH DIFFERENTIAL_PRIVACY OPTIONS (max_rows_contributed = 1) COUNT(*) "
        "FROM t JOIN p ON t.c = p.id", "x INTEGER, c INTEGER", [("1", "2")], [("5", "1")],
        (_public("INTEGER", "1", "1", "2"),)),
    "public_subquery_evaluated_again": _case(
        "public_subquery", UNIT, "SELECT COUNT(*) FROM t JOIN (SELECT id, w FROM p WHERE length(current_query()) > 400) "
        "AS q ON t.c = q.id", "uid INTEGER, c INTEGER", [("1", "2")], [("99", "1")],
        (_public("INTEGER", "1", "1", "2"),)),
    "key_timestamp_ns_merged": _case(
        "typed_keys", UNIT, "SELECT k, COUNT(*) FROM t GROUP BY k", "uid INTEGER, k TIMESTAMP_NS",
        [("1", "'2020-01-01 00:00:00.000000001'::TIMESTAMP_NS")],
        [("99", "'2020-01-01 00:00:00.000000002'::TIMESTAMP_NS")], keys=1),
    "key_interval_does_not_convert": _case(
        "typed_keys", UNIT, "SELECT k, COUNT(*) FROM t GROUP BY k", "uid INTEGER, k INTERVAL",
        [("1", "INTERVAL 1 DAY")], [("99", "INTERVAL 1000000000 MONTH")], keys=1),
    "key_infinite_timestamp_merged": _case(
        "typed_keys", UNIT, "SELECT k, COUNT(*) FROM t GROUP BY k", "uid INTEGER, k TIMESTAMP",
        [("1", "'9999-12-31 23:59:59.999999'")], [("99", "'infinity'")], keys=1),
    "key_domain_of_another_type": _case(
        "key_domains", f"{UNIT}, g KEYS (1, 2, 3)", "SELECT g, COUNT(*) FROM t GROUP BY g", "uid INTEGER, g VARCHAR",
        [("1", "'1'")], [("99", "'x'")], keys=1),
    "bounds_decimal_clamp_of_hugeint": _case(
        "extreme_bounds", f"{ROW}, x BOUNDS 0 TO 1e-1", "SELECT SUM(x) FROM t", "x HUGEINT", [("0",)],
        [("170141183460469231731687303715884105727",)]),
    "bounds_grid_scaling_overflows": _case(
        "extreme_bounds", f"{UNIT}, x BOUNDS 0 TO 1e18", "SELECT AVG(x) FROM t", "uid INTEGER, x BIGINT",
        [("1", "0")], [("99", "1000000000000000000")]),
    # Controls: the same shapes where today's code holds, so the properties are seen to pass too.
    "control_join_same_type": _case(
        "public_join", UNIT, JOIN_COUNT, "uid INTEGER, c INTEGER", [("1", "2")], [("99", "1")],
        (_public("INTEGER", "1", "1", "2"),)),
    "control_public_keys": _case(
        "unit_level", f"{UNIT}, g KEYS FROM keys.g, x BOUNDS 0 TO 10",
        "SELECT g, COUNT(*), SUM(x), MEDIAN(x) FROM t GROUP BY g", "uid INTEGER, g VARCHAR, x INTEGER",
        [("1", "'a'", "3")], [("99", "'zz'", "10")], (KEYS_TABLE,), keys=1),
}
"""Name -> the smallest case showing the mechanism (controls: shapes that hold today)."""
