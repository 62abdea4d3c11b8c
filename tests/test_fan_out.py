"""Rows per unit after joins (``MAX ROWS PER UNIT AFTER JOINS``, attack a1 finding 1).

Truncating to k rows per unit bounds what one unit adds to an answer, not the work DuckDB
does before: n self-joins on the unit give one unit k^n rows, and a query that filters on the
target (``WHERE v0.uid = 3``) then took 0.1 s without the target and hit the time limit with
it — a noiseless membership test. Every join and UNION ALL is now refused before the charge
when it would give one unit more rows than the policy's limit (and more than any of its
inputs held). Each path that multiplies rows is tried here, with a low limit so the tests stay
fast: a query over the limit must be refused on both neighbours with the same words, charge
nothing and read nothing; a query within it must answer.
"""

from __future__ import annotations

import pandas as pd
import pytest
from sqlglot import exp

import dpsql
from dpsql.backends.render import render
from dpsql.mechanisms.noise import SeededSource
from dpsql.policy.language import parse_policy, policy_to_text
from dpsql.policy.model import DEFAULT_MAX_ROWS_AFTER_JOINS
from dpsql.sql.pieces import needs_salt

LIMIT = 30
POLICY = f"""BUDGET EPSILON 1000 DELTA 0.5;
QUERY EPSILON 1;
MAX ROWS PER UNIT AFTER JOINS {LIMIT};
PRIVATE TABLE v (PRIVACY UNIT uid, MAX ROWS PER UNIT 5, amount BOUNDS 0 TO 500);
PRIVATE TABLE u (PRIVACY UNIT uid, MAX ROWS PER UNIT 1, amount BOUNDS 0 TO 500);
PRIVATE TABLE r (PRIVACY UNIT ROW, amount BOUNDS 0 TO 500, tag KEYS ('a', 'b'));
PRIVATE TABLE heavy (PRIVACY UNIT uid, MAX ROWS PER UNIT 50, amount BOUNDS 0 TO 500);
PUBLIC TABLE p;
PUBLIC TABLE one;
"""
TARGET = 3


def frames(present: bool) -> dict:
    uids = [1] * 5 + [2] * 5 + ([TARGET] * 5 if present else [])
    v = pd.DataFrame({"uid": uids, "amount": [float(i % 10) for i in range(len(uids))],
                      "tag": ["a", "b", "a", "b", "a"] * (len(uids) // 5)})
    u = pd.DataFrame({"uid": [1, 2] + ([TARGET] if present else []), "amount": [10.0, 20.0] + ([400.0] if present else [])})
    r = pd.DataFrame({"amount": [1.0, 2.0] + ([400.0] if present else []), "tag": ["a", "b"] + (["a"] if present else [])})
    heavy = pd.DataFrame({"uid": [1] * 50 + ([TARGET] * 50 if present else []),
                          "amount": [float(i) for i in range(50 * (2 if present else 1))]})
    p = pd.DataFrame({"tag": ["a"] * 4 + ["b"] * 2, "slot": range(6)})  # 'a' matches 4 rows: m = 4
    one = pd.DataFrame({"tag": ["a", "b"], "label": ["A", "B"]})     # a key: m = 1
    return {"v": v, "u": u, "r": r, "heavy": heavy, "p": p, "one": one}


def outcome(sql: str, present: bool, policy: str = POLICY) -> tuple:
    """How the query ends on one neighbour, and the epsilon it charged."""
    with dpsql.connect(frames(present), policy=policy, rng=SeededSource(5)) as db:
        try:
            result = ("answer", db.sql(sql).fetchall())
        except dpsql.DPError as error:
            result = (type(error).__name__, str(error))
        return result, db.budget.spent.epsilon


def refused(sql: str, policy: str = POLICY) -> str:
    """The refusal of ``sql``: the same on both neighbours, before any charge."""
    (absent, spent_absent), (present, spent_present) = outcome(sql, False, policy), outcome(sql, True, policy)
    assert absent[0] == "UnsupportedQuery", absent
    assert absent == present, "a refusal must not depend on the data"
    assert spent_absent == spent_present == 0, "a refusal charges nothing"
    assert "MAX ROWS PER UNIT AFTER JOINS" in absent[1]
    return absent[1]


def answered(sql: str, policy: str = POLICY) -> list:
    (absent, spent_absent), (present, spent_present) = outcome(sql, False, policy), outcome(sql, True, policy)
    assert absent[0] == present[0] == "answer", (absent, present)
    assert spent_absent == spent_present == 1
    return present[1]


def self_joins(n: int, table: str = "v", k: int = 5) -> str:
    """The attacker's query: n copies of ``table`` joined on the unit, all hashed."""
    distinct = " + ".join(f"t{i}.amount * {10 ** i}" for i in range(n))
    joins = "".join(f" JOIN {table} AS t{i} ON t0.uid = t{i}.uid" for i in range(1, n))
    return f"SELECT COUNT(DISTINCT {distinct}) AS n FROM {table} AS t0{joins} WHERE t0.uid = {TARGET}"


# ------------------------------------------------------------------------------------------
# The attacker's scripts (a1_failure_oracle.py, a1_failure_oracle_k1.py), as regression tests


def test_the_failure_oracle_of_eight_self_joins_is_refused_before_the_charge():
    policy = POLICY.replace(f"MAX ROWS PER UNIT AFTER JOINS {LIMIT};\n", "")  # the default limit
    message = refused(self_joins(8), policy)
    # k = 5: 5, 25, 125, 625 rows per unit, then 3,125 at the fifth copy (the fourth JOIN).
    assert "up to 3,125 rows" in message and f"MAX ROWS PER UNIT AFTER JOINS {DEFAULT_MAX_ROWS_AFTER_JOINS:,}" in message
    sql = self_joins(8)
    fourth_join = sql.index("JOIN v AS t4")
    assert f"column {fourth_join + 1})" in message, "the refusal points at the join that crosses the limit"
    assert "aggregate per unit first in a subquery" in message


def test_the_attackers_full_size_query_is_refused_in_a_blink():
    """a1_failure_oracle.py's own numbers (k = 10, eight copies) on its own data: both refused."""
    policy = POLICY.replace("MAX ROWS PER UNIT 5,", "MAX ROWS PER UNIT 10,").replace(
        f"MAX ROWS PER UNIT AFTER JOINS {LIMIT};\n", "")
    assert "up to 10,000 rows" in refused(self_joins(8), policy)


def test_the_union_all_stacking_variant_is_refused():
    """a1_failure_oracle_k1.py: k = 1, a subquery with four UNION ALL copies, self-joined."""
    copies = " UNION ALL ".join(["SELECT uid, amount FROM u"] * 4)
    sql = (f"SELECT COUNT(*) AS n FROM ({copies}) AS s0"
           + "".join(f" JOIN ({copies}) AS s{i} ON s0.uid = s{i}.uid" for i in range(1, 12))
           + " WHERE s0.amount = 400")
    message = refused(sql)
    assert "up to 64 rows" in message  # 4 x 4 = 16 rows per unit pass, the third copy makes 64


# ------------------------------------------------------------------------------------------
# Each path that multiplies rows


def test_private_joins_on_the_unit_multiply_k1_k2():
    assert answered(self_joins(2)) == answered(self_joins(2))  # 25 rows per unit: within 30
    message = refused(self_joins(3))
    assert "up to 125 rows" in message and "(25 at most)" in message and "(5)" in message


def test_public_joins_multiply_by_m():
    # k = 5 x m = 4 = 20 within 30; a second join with m = 4 makes 80.
    answered("SELECT COUNT(*) FROM v JOIN p ON v.tag = p.tag")
    message = refused("SELECT COUNT(*) FROM v JOIN p ON v.tag = p.tag JOIN p AS q ON v.tag = q.tag")
    assert "up to 80 rows" in message and "m = 4" in message and "join on columns that identify" in message
    # A lookup (m = 1) adds no rows: any number of them pass.
    answered("SELECT COUNT(*) FROM v JOIN p ON v.tag = p.tag JOIN one ON v.tag = one.tag "
             "JOIN one AS o2 ON v.tag = o2.tag")


def test_union_all_inside_a_subquery_adds_up():
    six = " UNION ALL ".join(["SELECT uid, amount FROM v"] * 6)
    answered(f"SELECT COUNT(*) FROM ({six}) AS s")  # 30 rows per unit
    seven = " UNION ALL ".join(["SELECT uid, amount FROM v"] * 7)
    message = refused(f"SELECT COUNT(*) FROM ({seven}) AS s")
    assert "UNION ALL" in message and "up to 35 rows" in message


def test_self_joins_of_subqueries_and_ctes():
    sub = "(SELECT uid, amount FROM v WHERE amount >= 0)"
    assert "up to 125 rows" in refused(f"SELECT COUNT(*) FROM {sub} AS a JOIN {sub} AS b ON a.uid = b.uid "
                                       f"JOIN {sub} AS c ON a.uid = c.uid")
    assert "up to 125 rows" in refused("WITH s AS (SELECT uid, amount FROM v) SELECT COUNT(*) FROM s AS a "
                                       "JOIN s AS b ON a.uid = b.uid JOIN s AS c ON a.uid = c.uid")


def test_a_join_inside_a_per_unit_subquery_is_bounded_too():
    """The per-unit aggregate leaves one row per unit, but the join under it does the work."""
    inner = ("SELECT a.uid, SUM(a.amount) AS s FROM v AS a JOIN v AS b ON a.uid = b.uid "
             "JOIN v AS c ON a.uid = c.uid GROUP BY a.uid")
    assert "up to 125 rows" in refused(f"SELECT SUM(s) FROM ({inner}) AS t")


def test_the_hint_works_per_unit_aggregates_join_freely():
    """What the refusal suggests: aggregate per unit first; one row per unit joins any number of times."""
    per_unit = "(SELECT uid, SUM(amount) AS s FROM v GROUP BY uid)"
    joins = "".join(f" JOIN {per_unit} AS t{i} ON t0.uid = t{i}.uid" for i in range(1, 8))
    answered(f"SELECT COUNT(*) FROM {per_unit} AS t0{joins}")


def test_row_level_tables_through_public_joins_and_unions():
    answered("SELECT COUNT(*) FROM r JOIN p ON r.tag = p.tag JOIN p AS q ON r.tag = q.tag")  # 1 x 4 x 4 = 16
    assert "up to 64 rows" in refused("SELECT COUNT(*) FROM r JOIN p ON r.tag = p.tag JOIN p AS q ON r.tag = q.tag "
                                      "JOIN p AS w ON r.tag = w.tag")
    rows = " UNION ALL ".join(["SELECT amount, tag FROM r"] * 31)
    assert "up to 31 rows" in refused(f"SELECT COUNT(*) FROM ({rows}) AS s")


def test_a_declared_k_above_the_limit_is_the_curators_choice_but_not_multiplied():
    answered("SELECT COUNT(*) FROM heavy")  # 50 rows per unit, declared
    answered("SELECT COUNT(*) FROM heavy JOIN u ON heavy.uid = u.uid")  # 50 x 1: no more rows
    assert "up to 2,500 rows" in refused("SELECT COUNT(*) FROM heavy AS a JOIN heavy AS b ON a.uid = b.uid")
    assert "up to 100 rows" in refused("SELECT COUNT(*) FROM (SELECT uid, amount FROM heavy UNION ALL "
                                       "SELECT uid, amount FROM heavy) AS s")


def test_explain_refuses_as_sql_does():
    with dpsql.connect(frames(True), policy=POLICY) as db:
        with pytest.raises(dpsql.DPError, match="MAX ROWS PER UNIT AFTER JOINS 30"):
            db.explain(self_joins(3))
        assert db.budget.spent.epsilon == 0


def test_ordinary_joins_at_the_default_limit_still_answer():
    """k = 10 joined to a public table at the default MAX JOIN MULTIPLICITY 100 (1,000 rows per
    unit, what bench_timing measures) and a self-join (100): as before this limit existed."""
    policy = """BUDGET EPSILON 10; QUERY EPSILON 1;
PRIVATE TABLE v (PRIVACY UNIT uid, MAX ROWS PER UNIT 10, amount BOUNDS 0 TO 500);
PUBLIC TABLE wide;
"""
    data = {"v": pd.DataFrame({"uid": [1, 1, 2], "g": [0, 0, 1], "amount": [1.0, 2.0, 3.0]}),
            "wide": pd.DataFrame({"g": [0] * 100 + [1] * 3, "slot": range(103)})}
    with dpsql.connect(data, policy=policy, rng=SeededSource(1)) as db:
        db.sql("SELECT COUNT(*) FROM v JOIN wide ON v.g = wide.g")
        db.sql("SELECT SUM(a.amount) FROM v AS a JOIN v AS b ON a.uid = b.uid")
        assert db.budget.spent.epsilon == 2


# ------------------------------------------------------------------------------------------
# The policy statement


def test_the_policy_statement_parses_round_trips_and_is_checked():
    policy = parse_policy(POLICY)
    assert policy.max_rows_after_joins == LIMIT
    assert parse_policy(policy_to_text(policy)) == policy
    assert "AFTER JOINS" not in policy_to_text(parse_policy("BUDGET EPSILON 1;"))
    assert parse_policy("BUDGET EPSILON 1;").max_rows_after_joins == DEFAULT_MAX_ROWS_AFTER_JOINS
    for bad in ("0", "2.5", "-3"):
        with pytest.raises(dpsql.DPError, match="whole number from 1"):
            parse_policy(f"BUDGET EPSILON 1; MAX ROWS PER UNIT AFTER JOINS {bad};")
    with pytest.raises(dpsql.DPError, match="given twice"):
        parse_policy("BUDGET EPSILON 1; MAX ROWS PER UNIT AFTER JOINS 5; MAX ROWS PER UNIT AFTER JOINS 6;")
    # A column may still be called "after" or "joins".
    parse_policy("BUDGET EPSILON 1; PRIVATE TABLE t (PRIVACY UNIT u, MAX ROWS PER UNIT 1, after BOUNDS 0 TO 1);")


# ------------------------------------------------------------------------------------------
# The bound the limit is checked against holds on the rows that run


SHAPES = [
    "SELECT COUNT(*) FROM v AS a JOIN v AS b ON a.uid = b.uid",
    "SELECT COUNT(*) FROM v JOIN p ON v.tag = p.tag",
    "SELECT COUNT(*) FROM v JOIN p ON v.tag = p.tag JOIN one ON v.tag = one.tag",
    "SELECT COUNT(*) FROM (SELECT uid, amount FROM v UNION ALL SELECT uid, amount FROM u) AS s "
    "JOIN u ON s.uid = u.uid",
    "SELECT COUNT(*) FROM (SELECT uid, amount FROM v UNION ALL SELECT uid, amount FROM v) AS a "
    "JOIN u ON a.uid = u.uid",
    "SELECT COUNT(*) FROM (SELECT uid, COUNT(*) AS n FROM v GROUP BY uid) AS a JOIN v ON a.uid = v.uid",
    "SELECT COUNT(*) FROM r JOIN p ON r.tag = p.tag",
    "SELECT COUNT(*) FROM (SELECT amount, tag FROM r UNION ALL SELECT amount, tag FROM r) AS s JOIN p ON s.tag = p.tag",
]


@pytest.mark.parametrize("sql", SHAPES)
def test_no_unit_has_more_rows_than_the_analysed_bound(sql):
    """Brute force: on random data with units far above k (and rows repeated), the relation
    each shape builds gives no unit more rows than ``rows_per_unit``, the number the limit is
    checked against — and the bound is reached (it is tight) on some dataset."""
    import random
    generator = random.Random(11)
    reached = 0
    for trial in range(6):
        data = frames(True)
        rows = [(generator.choice([1, 2, 3, 4]), float(generator.randint(0, 3)), generator.choice("ab"))
                for _ in range(generator.randint(1, 40))]
        if trial == 0:  # the worst case: one unit with 2k rows, all on the most repeated public key
            rows = [(1, float(i), "a") for i in range(10)]
        data["v"] = pd.DataFrame(rows, columns=["uid", "amount", "tag"])
        data["u"] = pd.DataFrame({"uid": [1, 2, 3, 4, 4], "amount": [1.0, 2.0, 3.0, 4.0, 5.0]})
        data["r"] = pd.DataFrame([(float(generator.randint(0, 2)), generator.choice("ab")) for _ in range(6)],
                                 columns=["amount", "tag"])
        with dpsql.connect(data, policy=POLICY) as db:
            _, checked, _ = db._check(sql)
            source = checked.source if isinstance(checked.source, exp.Table) else exp.Subquery(this=checked.source)
            unit = exp.column(checked.rule.unit, quoted=True).sql(dialect="duckdb")
            text = (f"SELECT COALESCE(MAX(n), 0) FROM (SELECT COUNT(*) AS n FROM {render(source)} "
                    f"AS s GROUP BY {unit})")
            salt = {"salt": trial} if needs_salt(source) else None  # truncation before a private join
            counted = db._engine.fetch(text, salt, bounded=checked.bounded)[0][0]
            assert counted <= checked.rows_per_unit <= LIMIT, (trial, counted, checked.rows_per_unit)
            reached = max(reached, counted)
    assert reached == checked.rows_per_unit, "the bound should be reached on some dataset"


def test_the_stability_record_states_each_construct_and_the_rule_reads_the_last_step():
    """Each join, subquery and UNION ALL is one step of the relation's stability record, with
    the rows and groups per unit after it and why; the relation's limits are its last step's."""
    import sqlglot

    from dpsql.analysis.from_clause import build_relation
    from dpsql.analysis.stability import PUBLIC_JOIN, ROW_SUBQUERY, TABLE, TRUNCATION, UNION_ALL, UNIT_JOIN

    sql = ("SELECT COUNT(*) FROM (SELECT v.uid, p.slot FROM v JOIN p ON v.tag = p.tag "
           "UNION ALL SELECT v.uid, u.amount FROM v JOIN u ON v.uid = u.uid) AS w")
    with dpsql.connect(frames(True), policy=POLICY) as db:
        tree = sqlglot.parse_one(sql, read="duckdb")
        relation = build_relation(tree.args["from_"], [], db.policy, db._catalog, db._engine, {})
    steps = [(s.construct, s.rows_per_unit, s.held) for s in relation.stability]
    assert steps == [(TABLE, 5, 5), (PUBLIC_JOIN, 20, 20), (ROW_SUBQUERY, 20, 20),
                     (TABLE, 5, 5), (TABLE, 1, 1), (UNIT_JOIN, 5, 5), (ROW_SUBQUERY, 5, 5),
                     (UNION_ALL, 25, 25)], steps
    assert TRUNCATION not in {s.construct for s in relation.stability}  # bounded copies hold k already
    assert relation.rule.max_rows_per_unit == relation.stability[-1].rows_per_unit == 25
    assert relation.rows_per_unit == 25
    assert relation.joins == (relation.stability[1].why,) and "m = 4" in relation.joins[0]
