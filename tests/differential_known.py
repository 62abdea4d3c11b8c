"""Known mechanisms, as the smallest neighbouring pairs that show them (issue 11, issue 16, issue 21).

Each is a case the generated families of ``tests/differential_cases.py`` can draw, written out
by hand (from the fuzzer's shrunk output) so the suite checks every known mechanism on every
run, whatever the generator happens to draw in its budget.

``KNOWN`` holds neighbouring pairs (the properties of ``differential.violations``);
``KNOWN_ORDER`` holds cases for the storage-order property (``differential.order_violations``:
neighbour B's rows stored as listed, reversed and shuffled must answer alike).

Issue 21's cases say whether they failed on the code before its fix (commit dd694fa's parent,
run with the same fixed salt): "old code: fails" or "old code: holds (a control)".
"""

from __future__ import annotations

from dataclasses import replace

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
        "public_subquery", UNIT,
        "SELECT COUNT(*) FROM t JOIN (SELECT id, w FROM p WHERE length(current_query()) > 400) AS q ON t.c = q.id",
        "uid INTEGER, c INTEGER", [("1", "2")], [("99", "1")],
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
    # Found by bench_fuzz after the fixes: DuckDB's hash() takes INTERVAL '1 month' and
    # '1 microsecond' alike, so the row-level copy's hash ids collided and one added row dropped
    # another row (a second unit) — twice the analysed L2 under bounded neighbours.
    "row_level_ids_collide_under_a_weak_hash": replace(_case(
        "typed_keys", f"{ROW}, x BOUNDS 0 TO 5",
        "SELECT WITH DIFFERENTIAL_PRIVACY OPTIONS (max_rows_contributed = 1) COALESCE(k, k), COUNT(*) FROM t "
        "GROUP BY COALESCE(k, k)", "k INTERVAL, x INTEGER", [("INTERVAL 1 MONTH", "0"), ("INTERVAL 1 MONTH", "0")],
        [("INTERVAL 1 MICROSECOND", "0")], keys=1),
        policy=POLICY.format(rules=f"{ROW}, x BOUNDS 0 TO 5", public="").replace("UNBOUNDED", "BOUNDED"),
        replacement=(("INTERVAL 1 MONTH", "NULL"),)),
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
    # Issue 21: identity is exact. The added unit or row collides with an existing one under
    # DuckDB's equality, a collation, the string limit or a conversion, never in its encoding.
    # Old code: fails — MAX STRING LENGTH cut the unit column too, so 'abc2' joined unit 'abc1'
    # as 'abc' and the one row kept (MAX ROWS PER UNIT 1) moved from key 1 to key 2: L1 2.
    "identity_unit_id_cut_by_string_limit": _case(
        "identity", f"{UNIT}, MAX STRING LENGTH 3, x KEYS (1, 2)", "SELECT x, COUNT(*) FROM t GROUP BY x",
        "uid VARCHAR, x INTEGER", [("'abc1'", "1")], [("'abc2'", "2")], keys=1),
    # Old code: fails — the row-level copy grouped rows by their values and to_json text, which
    # takes [nan] for [-nan]: the group kept its first-stored value, the adversary's row stored
    # first, so every base row read back as [-nan]: L1 2 (n + 1 with n base rows).
    "identity_row_nested_nan_stored_first": replace(_case(
        "identity_row", ROW, "SELECT COUNT(*) FROM t WHERE CAST(l[1] AS VARCHAR) = '-nan'", "l DOUBLE[]",
        [("['nan'::DOUBLE]",)], [("['-nan'::DOUBLE]",)]), extra_first=True),
    # Old code: fails — the same inside a STRUCT, here in a database file with its rows in the WAL.
    "identity_row_struct_nan_stored_first": replace(_case(
        "identity_row", ROW, "SELECT COUNT(*) FROM t WHERE CAST(s.a AS VARCHAR) = '-nan'", "s STRUCT(a DOUBLE)",
        [("{'a': 'nan'::DOUBLE}",)], [("{'a': '-nan'::DOUBLE}",)]), extra_first=True, storage="wal"),
    # Old code: holds (a control) — the copy held VARCHAR units with the binary collation already.
    "identity_nocase_units_apart": _case(
        "identity", f"{UNIT}, x KEYS (1, 2)", "SELECT x, COUNT(*), COUNT(DISTINCT uid) FROM t GROUP BY x",
        "uid VARCHAR COLLATE NOCASE, x INTEGER", [("'a'", "1")], [("'A'", "2")], keys=1),
    # Old code: holds (a control) — TIMESTAMP_NS units one nanosecond apart (one microsecond in Python).
    "identity_timestamp_ns_units_apart": _case(
        "identity", f"{UNIT}, x KEYS (1, 2)", "SELECT x, COUNT(DISTINCT uid) FROM t GROUP BY x",
        "uid TIMESTAMP_NS, x INTEGER", [("'2020-01-01 00:00:00.000000001'", "1")],
        [("'2020-01-01 00:00:00.000000002'", "2")], keys=1),
    # Old code: holds (a control) — its row text carried the sign bit of top-level floats.
    "identity_row_signed_zero_stored_first": replace(_case(
        "identity_row", ROW, "SELECT COUNT(*) FROM t WHERE CAST(d AS VARCHAR) = '-0.0'", "d DOUBLE",
        [("'0.0'::DOUBLE",)], [("'-0.0'::DOUBLE",)]), extra_first=True),
    # Old code: holds (a control) — its row text spelt intervals out ('1 month' vs '30 days').
    "identity_row_interval_stored_first": replace(_case(
        "identity_row", ROW, "SELECT CAST(i AS VARCHAR), COUNT(*) FROM t GROUP BY CAST(i AS VARCHAR)", "i INTERVAL",
        [("INTERVAL '1 month'",)], [("INTERVAL '30 days'",)], keys=1), extra_first=True),
}
"""Name -> the smallest case showing the mechanism (controls: shapes that hold today)."""


def _order(family: str, rules: str, sql: str, columns: str, first: tuple, second: tuple) -> Case:
    """A unit ``uid`` 1 (or, row-level, two rows) with two rows DuckDB takes for one: ``first`` in
    the base rows, ``second`` added, so neighbour B stores them in both orders."""
    return _case(family, rules, sql, columns, [first], [second])


KNOWN_ORDER = {
    # Issue 21: the copy kept a unit's first k rows in the order of hash($salt, cols), cols; DuckDB's
    # hash and order tie values it takes as equal, so which row was kept was the stored order's.
    # Old code: fails (each of the next five).
    "order_signed_zero_tie_in_a_unit": _order(
        "identity", UNIT, "SELECT COUNT(*) FROM t WHERE CAST(d AS VARCHAR) = '-0.0'", "uid INTEGER, d DOUBLE",
        ("1", "'-0.0'::DOUBLE"), ("1", "'0.0'::DOUBLE")),
    "order_nan_sign_tie_in_a_unit": _order(
        "identity", UNIT, "SELECT COUNT(*) FROM t WHERE CAST(d AS VARCHAR) = '-nan'", "uid INTEGER, d DOUBLE",
        ("1", "'-nan'::DOUBLE"), ("1", "'nan'::DOUBLE")),
    "order_nested_nan_tie_in_a_unit": _order(
        "identity", UNIT, "SELECT COUNT(*) FROM t WHERE CAST(l[1] AS VARCHAR) = '-nan'", "uid INTEGER, l DOUBLE[]",
        ("1", "['-nan'::DOUBLE]"), ("1", "['nan'::DOUBLE]")),
    "order_interval_tie_in_a_unit": _order(
        "identity", UNIT, "SELECT COUNT(*) FROM t WHERE CAST(i AS VARCHAR) = '30 days'", "uid INTEGER, i INTERVAL",
        ("1", "INTERVAL '1 month'"), ("1", "INTERVAL '30 days'")),
    # the row-level copy's group of [nan] and [-nan] read back as its first-stored value
    "order_row_level_nested_nan": _order(
        "identity_row", ROW, "SELECT COUNT(*) FROM t WHERE CAST(l[1] AS VARCHAR) = '-nan'", "l DOUBLE[]",
        ("['-nan'::DOUBLE]",), ("['nan'::DOUBLE]",)),
    # Old code: holds (controls) — hash-equal intervals ('1 month', '1 microsecond') are told apart by
    # the order's tie-break; NOCASE strings were held binary; TIMESTAMP_NS compares exactly.
    "order_hash_equal_intervals_in_a_unit": _order(
        "identity", UNIT, "SELECT COUNT(*) FROM t WHERE CAST(i AS VARCHAR) = '1 month'", "uid INTEGER, i INTERVAL",
        ("1", "INTERVAL '1 microsecond'"), ("1", "INTERVAL '1 month'")),
    "order_nocase_tie_in_a_unit": _order(
        "identity", UNIT, "SELECT COUNT(*) FROM t WHERE c = 'A'", "uid INTEGER, c VARCHAR COLLATE NOCASE",
        ("1", "'A'"), ("1", "'a'")),
    "order_timestamp_ns_in_a_unit": replace(_order(
        "identity", UNIT, "SELECT COUNT(*) FROM t WHERE CAST(ts AS VARCHAR) LIKE '%1'", "uid INTEGER, ts TIMESTAMP_NS",
        ("1", "'2020-01-01 00:00:00.000000001'"), ("1", "'2020-01-01 00:00:00.000000002'")), storage="wal"),
}
"""Name -> a case whose neighbour B must answer alike however its rows are stored."""
