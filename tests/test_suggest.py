"""DP suggestions of contribution bounds (``dpsql.suggest``, ``Connection.suggest_bounds``,
``dpsql suggest``)."""

from __future__ import annotations

from fractions import Fraction
from itertools import product

import duckdb
import numpy as np
import pandas as pd
import pytest

import dpsql
from dpsql import cli
from dpsql.errors import BudgetExceeded, UnsupportedQuery
from dpsql.noise import SeededSource
from dpsql.rewrite import literal
from dpsql.suggest import (
    ROWS_CANDIDATES,
    bin_counts,
    is_float_type,
    is_integer_type,
    noisy_bounds,
    rows_sql,
    split_epsilon,
    suggestion_text,
    value_candidates,
    values_sql,
)


def known(units: int = 3000, seed: int = 0) -> pd.DataFrame:
    """Rows per unit uniform on 1..40 (95th percentile 38); x ~ Normal(100, 10) (1st and 99th
    percentiles 76.7 and 123.3); n an integer uniform on 0..999."""
    rng = np.random.default_rng(seed)
    sizes = rng.integers(1, 41, size=units)
    uid = np.repeat(np.arange(units), sizes)
    return pd.DataFrame({"uid": uid, "x": rng.normal(100, 10, size=len(uid)),
                         "n": rng.integers(0, 1000, size=len(uid)), "name": "a"})


POLICY = "BUDGET EPSILON 10; PRIVATE TABLE t (PRIVACY UNIT uid, MAX ROWS PER UNIT 5); PUBLIC TABLE p;"


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_suggestions_on_a_known_distribution_are_within_tolerance(seed):
    with dpsql.connect({"t": known(), "p": pd.DataFrame({"a": [1]})}, policy=POLICY, rng=SeededSource(seed)) as db:
        suggestion = db.suggest_bounds("t", epsilon=1)
        assert db.budget.spent.epsilon == 1
    # k: the 95th percentile 38 lies between candidates 30 and 40
    assert suggestion["max_rows_per_unit"] in (30, 40)
    assert suggestion["max_groups_per_unit"] is None
    # bounds: outer edges of the log bins holding the 1st and 99th percentiles: (60, 80] and (100, 150]
    lo, hi = suggestion["bounds"]["x"]
    assert 50 <= lo <= 80 and 120 <= hi <= 200
    lo, hi = suggestion["bounds"]["n"]  # uniform 0..999: its lowest bins hold too few units to stand out
    assert isinstance(lo, int) and 0 <= lo <= 100 and 800 <= hi <= 1000
    assert set(suggestion["bounds"]) == {"x", "n"}  # numeric columns but the unit
    assert suggestion["epsilon_split"] == {"total": 1.0, "max_rows_per_unit": 0.5, "each_column": 0.25}


def test_charged_like_a_query():
    with dpsql.connect({"t": known(200)}, policy=POLICY.replace(" PUBLIC TABLE p;", ""), analyst="ada",
                       rng=SeededSource(1)) as db:
        db.suggest_bounds("t", epsilon=4, columns=["x"])
        entry = db.ledger().iloc[-1]
        assert entry["sql"] == "SUGGEST BOUNDS t" and entry["analyst"] == "ada" and entry["epsilon"] == 4
        with pytest.raises(BudgetExceeded):
            db.suggest_bounds("t", epsilon=7)
        assert db.budget.spent.epsilon == 4 and len(db.ledger()) == 1
        with pytest.raises(UnsupportedQuery, match="name is not a numeric column of t"):
            db.suggest_bounds("t", epsilon=1, columns=["name"])
        with pytest.raises(UnsupportedQuery, match="uid is not a numeric column"):
            db.suggest_bounds("t", epsilon=1, columns=["uid"])
        with pytest.raises(UnsupportedQuery, match="q is not a private table"):
            db.suggest_bounds("q", epsilon=1)
        assert db.budget.spent.epsilon == 4  # refusals charge nothing


def test_epsilon_split():
    assert split_epsilon(Fraction(1), False, 0) == (split_epsilon(Fraction(1), False, 0).__class__(Fraction(1), Fraction(0)))
    assert split_epsilon(Fraction(1), True, 4).each_column == Fraction(1, 4)
    assert split_epsilon(Fraction(1), False, 4).each_column == Fraction(1, 8)


# -- brute-force sensitivity of what the mechanisms read -------------------------------------

PROFILES = [(), (1.0,), (150.0,), (-3.0, 7.0), (7.0,) * 5, (float("nan"), 2.0), (None, 1e12), (0.0,) * 40]


def counts_of(profile) -> tuple[list[int], list[int]]:
    """The unit ranks (rows per unit) and histogram bin counts over background + one unit."""
    rows = [(100, 5.0), (100, 6.0), (101, -2.0)] + [(1, v) for v in profile]
    data = pd.DataFrame(rows, columns=["uid", "x"]).astype({"x": "float64"})
    connection = duckdb.connect()
    connection.register("frame", data)
    connection.execute("CREATE TABLE t AS SELECT * FROM frame")
    *ranks, _ = connection.execute(rows_sql("t", "uid")).fetchall()[0]
    edges = value_candidates(False)
    *at_most, total = connection.execute(values_sql("t", "uid", "x", True, edges), {"salt": "s"}).fetchall()[0]
    return list(ranks), bin_counts(at_most, total)


def test_one_unit_moves_each_rank_by_one_and_one_bin_by_one():
    results = [counts_of(p) for p in PROFILES]
    empty = results[0]
    for (ranks_a, bins_a), (ranks_b, bins_b) in product(results, results):
        assert max(abs(a - b) for a, b in zip(ranks_a, ranks_b)) <= 1  # Δu = 1 for k
        l1 = sum(abs(a - b) for a, b in zip(bins_a, bins_b))
        replaced = (ranks_a, bins_a) != empty and (ranks_b, bins_b) != empty
        assert l1 <= (2 if replaced else 1)  # add/remove: 1; replace: 2
    assert max(sum(abs(a - b) for a, b in zip(r[1], empty[1])) for r in results) == 1  # tight


def test_noisy_bounds_threshold_hides_empty_bins():
    edges = list(value_candidates(False))
    counts = [0] * (len(edges) + 1)
    counts[edges.index(Fraction(100)) + 1] = 2000  # everything in (100, 150]
    found = noisy_bounds(edges, counts, Fraction(1), 1, Fraction(98, 100), SeededSource(0))
    assert found == (Fraction(100), Fraction(150))
    assert noisy_bounds(edges, [0] * len(counts), Fraction(1), 1, Fraction(98, 100), SeededSource(0)) is None


def test_rows_candidates():
    assert ROWS_CANDIDATES[:8] == (1, 2, 3, 4, 5, 6, 8, 10) and ROWS_CANDIDATES[-1] == 10**6


# -- dpsql suggest ---------------------------------------------------------------------------

def test_cli_prints_a_policy_fragment_with_its_trade_offs(tmp_path, capsys):
    database = tmp_path / "d.duckdb"
    connection = duckdb.connect(str(database))
    frame = known(500)
    connection.register("frame", frame)
    connection.execute("CREATE TABLE t AS SELECT * FROM frame")
    connection.close()
    code = cli.main(["suggest", str(database), "t", "--unit", "uid", "--epsilon", "2", "--columns", "x"])
    out, err = capsys.readouterr()
    assert code == 0, err
    assert "PRIVATE TABLE t (\n    PRIVACY UNIT uid,\n    MAX ROWS PER UNIT " in out
    assert "    x BOUNDS " in out and "COUNT and SUM noise grows ∝ k" in out
    assert "cost ε 2 · remaining ε 0 of 2" in err
    code = cli.main(["suggest", str(database), "t", "--unit", "uid", "--epsilon", "2"])
    out, err = capsys.readouterr()
    assert code == 3 and "over budget" in err and out == ""


def test_suggestion_text_without_bounds():
    text = suggestion_text("t", "uid", {"max_rows_per_unit": 8, "bounds": {"x": None},
                                        "epsilon_split": {"max_rows_per_unit": 0.5, "each_column": 0.5}}, 1)
    assert "MAX ROWS PER UNIT 8\n);" in text and "-- x: no bounds: too few units" in text


def test_max_groups_per_unit_from_a_grouping_column():
    data = known(2000)
    data["day"] = data.groupby("uid").cumcount() % 12  # each unit touches min(rows, 12) days: 95th pct 12
    with dpsql.connect({"t": data}, policy=POLICY.replace(" PUBLIC TABLE p;", ""), rng=SeededSource(4)) as db:
        suggestion = db.suggest_bounds("t", epsilon=3, columns=["x"], group_by="day")
        assert suggestion["max_groups_per_unit"] in (10, 15) and suggestion["group_by"] == "day"
        assert suggestion["epsilon_split"]["max_groups_per_unit"] == 1.0
        with pytest.raises(UnsupportedQuery, match="cannot suggest MAX GROUPS PER UNIT"):
            db.suggest_bounds("t", epsilon=1, group_by="uid")
    text = suggestion_text("t", "uid", suggestion, 3)
    assert "    MAX GROUPS PER UNIT " in text and "values of day" in text


def test_one_unit_moves_each_group_rank_by_one():
    results = []
    for profile in [(), ("a",), ("a", "b"), ("a",) * 5, ("a", "b", "c", None), tuple("abcdefghijkl")]:
        rows = [(100, "a"), (100, "b"), (101, "z")] + [(1, g) for g in profile]
        connection = duckdb.connect()
        connection.register("frame", pd.DataFrame(rows, columns=["uid", "g"]))
        connection.execute("CREATE TABLE t AS SELECT * FROM frame")
        *ranks, _ = connection.execute(rows_sql("t", "uid", "g")).fetchall()[0]
        results.append(ranks)
    assert max(abs(a - b) for x, y in product(results, results) for a, b in zip(x, y)) == 1


# -- no value fails the suggestion -----------------------------------------------------------

def _decimal_extremes(precision: int, scale: int) -> list[str]:
    """The largest magnitude, the largest power of ten and the smallest nonzero one, both signs."""
    nines = "9" * (precision - scale) + ("." + "9" * scale if scale else "")
    power = "1" + "0" * (precision - scale - 1) if precision > scale else "0." + "9" * scale
    smallest = "0." + "0" * (scale - 1) + "1" if scale else "1"
    return [v for m in (nines, power, smallest) for v in (m, "-" + m)]


EXTREMES = {
    **{f"DECIMAL(38,{s})": _decimal_extremes(38, s) for s in (0, 2, 10, 37, 38)},
    "DECIMAL(18,2)": _decimal_extremes(18, 2)[:4],
    "HUGEINT": [str(2**127 - 1), str(-(2**127)), str(10**38)],
    "UHUGEINT": [str(2**128 - 1), str(2**127)],
    "BIGINT": [str(2**63 - 1), str(-(2**63))],
    "UBIGINT": [str(2**64 - 1)],
    "DOUBLE": ["inf", "-inf", "nan", "1.7976931348623157e308", "-1.7976931348623157e308", "5e-324"],
    "FLOAT": ["inf", "nan", "-3.4028235e38"],
}
"""Values at the ends of each numeric type's range, as text cast to the type."""


@pytest.mark.parametrize("type_name", sorted(EXTREMES))
def test_no_value_of_any_numeric_type_makes_a_suggestion_fail(type_name):
    """Neighbouring databases: 300 ordinary units, and the same with one unit added holding an
    extreme value of the column's type (twice, and once beside a NULL). The suggestion runs on
    both: a failure (charged, nothing released) would tell whether that unit exists. A
    row-level table holding every extreme at once (each row its own unit) too."""
    values = [f"CAST('{extreme}' AS {type_name})" for extreme in EXTREMES[type_name]]
    background = f"SELECT i % 300 AS uid, CAST((i % 50) * 0.01 AS {type_name}) AS x FROM range(1500) t(i)"
    tables = ["t0", *(f"t{i + 1}" for i in range(len(values)))]
    policy = "BUDGET EPSILON 1000; PRIVATE TABLE r (PRIVACY UNIT ROW); " + " ".join(
        f"PRIVATE TABLE {table} (PRIVACY UNIT uid, MAX ROWS PER UNIT 5);" for table in tables)
    connection = duckdb.connect()
    for table, value in zip(tables, [None, *values]):
        connection.execute(f"CREATE TABLE {table} AS {background}")
        if value is not None:
            connection.execute(f"INSERT INTO {table} VALUES (-1, {value}), (-1, {value}), (-1, NULL)")
    rows = ", ".join(f"({value})" for value in values)
    connection.execute(f"CREATE TABLE r AS SELECT x FROM t0 UNION ALL SELECT * FROM (VALUES {rows})")
    with dpsql.connect(connection, policy=policy, rng=SeededSource(1)) as db:
        for table in [*tables, "r"]:
            suggestion = db.suggest_bounds(table, epsilon=1)
            assert list(suggestion["bounds"]) == ["x"], (table, suggestion)
        assert db.budget.spent.epsilon == len(tables) + 1


@pytest.mark.parametrize("type_name, step", [("DECIMAL(18,4)", Fraction(1, 10**4)), ("DECIMAL(38,20)", Fraction(1, 10**5)),
                                             ("DECIMAL(38,37)", Fraction(1, 10**15)), ("BIGINT", Fraction(1)),
                                             ("UHUGEINT", Fraction(1)), ("DOUBLE", Fraction(1, 2**10))])
def test_values_at_and_beside_the_edges_fall_in_their_exact_bins(type_name, step):
    """Comparing in DOUBLE keeps the bins exact for values at an edge and a step beside it (a
    value within a DOUBLE's rounding of an edge, beyond 15 significant digits, may not be)."""
    edges = value_candidates(is_integer_type(type_name))
    fits = (lambda v: abs(v) < 10) if type_name == "DECIMAL(38,37)" else \
        (lambda v: v >= 0) if type_name.startswith("U") else (lambda v: True)
    values = sorted(v for v in {v for e in edges[::5] for v in (e - step, e, e + step)} if fits(v))
    rows = ", ".join(f"({i}, CAST('{literal(v)}' AS {type_name}))" for i, v in enumerate(values))
    connection = duckdb.connect()
    connection.execute(f"CREATE TABLE t AS SELECT * FROM (VALUES {rows}) AS v(uid, x)")
    *at_most, total = connection.execute(values_sql("t", "uid", "x", is_float_type(type_name), edges),
                                         {"salt": "s"}).fetchall()[0]
    assert total == len(values) and at_most == [sum(v <= e for v in values) for e in edges]
