"""DP suggestions of contribution bounds (``dpsql.curator.suggest``, ``Connection.suggest_bounds``,
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
from dpsql.curator.suggest import ROWS_CANDIDATES, rows_sql, split_epsilon
from dpsql.curator.suggest_text import suggestion_text
from dpsql.errors import BudgetExceeded, UnsupportedQuery
from dpsql.mechanisms.noise import SeededSource


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
    # at 0.175 a bound over 3000 units each aims at the 3.9% tails: x ~ N(100, 10) lies in 76.7..123.3 but
    # for 1%; the candidate grid (…, 60, 80, 100, 150, 200, …) puts lo at or below 80 and hi at or above 100
    lo, hi = suggestion["bounds"]["x"]
    assert 50 <= lo <= 80 and 100 <= hi <= 200
    lo, hi = suggestion["bounds"]["n"]  # uniform 0..999
    assert isinstance(lo, int) and 0 <= lo <= 100 and 800 <= hi <= 1000
    assert set(suggestion["bounds"]) == {"x", "n"}  # numeric columns but the unit
    assert abs(suggestion["units"] - 3000) <= suggestion["units_halfwidth"] + 60  # ± 30 at 95%; 60 more: < 1e-6
    assert suggestion["epsilon_split"] == {"total": 1.0, "units": 0.1, "max_rows_per_unit": 0.15,
                                           "each_column": 0.375, "each_bound": 0.09375}


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
    assert split_epsilon(Fraction(1), False, 0) == (split_epsilon(Fraction(1), False, 0).__class__(
        Fraction(9, 10), Fraction(0), Fraction(0), Fraction(1, 10)))
    assert split_epsilon(Fraction(1), True, 4).each_column == Fraction(9, 40)
    assert split_epsilon(Fraction(1), True, 4).each_bound == Fraction(9, 80)  # lo and hi
    assert split_epsilon(Fraction(1), False, 3).each_bound == Fraction(1, 16)  # lo, hi, L and U
    for row_level, columns, grouped in product((True, False), (1, 3), (True, False)):
        split = split_epsilon(Fraction(2), row_level, columns, grouped and not row_level)
        assert split.units + split.rows + split.groups + columns * split.each_column == 2  # all of it, no more


# -- brute-force sensitivity of what the mechanisms read -------------------------------------

def test_one_unit_moves_each_rank_by_one():
    results = []
    for profile in [(), (1.0,), (150.0,), (-3.0, 7.0), (7.0,) * 5, (None, 1e12), (0.0,) * 40]:
        rows = [(100, 5.0), (100, 6.0), (101, -2.0)] + [(1, v) for v in profile]
        connection = duckdb.connect()
        connection.register("frame", pd.DataFrame(rows, columns=["uid", "x"]).astype({"x": "float64"}))
        connection.execute("CREATE TABLE t AS SELECT * FROM frame")
        *ranks, _ = connection.execute(rows_sql("t", "uid")).fetchall()[0]
        results.append(ranks)
    assert max(abs(a - b) for x, y in product(results, results) for a, b in zip(x, y)) == 1  # Δu = 1 for k


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
    assert "noise of COUNT, SUM, AVG, VARIANCE and quantiles grows ∝ k" in out
    assert ("    x BOUNDS " in out) != ("WARNING x: no BOUNDS" in out)
    assert "records ε 2 spent on suggestions before any policy" in err
    # the curator repeats it: charged again and recorded, never refused for a budget nobody set
    code = cli.main(["suggest", str(database), "t", "--unit", "uid", "--epsilon", "0.5"])
    out, err = capsys.readouterr()
    assert code == 0 and "records ε 2.5 spent on suggestions before any policy" in err, err
    assert "ask the data curator" not in out + err


def test_suggestion_text_without_bounds():
    text = suggestion_text("t", "uid", {"max_rows_per_unit": 8, "bounds": {"x": None},
                                        "warnings": ["x: no BOUNDS: at epsilon 0.01 ..."],
                                        "epsilon_split": {"max_rows_per_unit": 0.5, "each_column": 0.5}}, 1)
    assert "MAX ROWS PER UNIT 8\n);" in text and "-- WARNING x: no BOUNDS" in text


def test_max_groups_per_unit_from_a_grouping_column():
    data = known(2000)
    data["day"] = data.groupby("uid").cumcount() % 12  # each unit touches min(rows, 12) days: 95th pct 12
    with dpsql.connect({"t": data}, policy=POLICY.replace(" PUBLIC TABLE p;", ""), rng=SeededSource(4)) as db:
        suggestion = db.suggest_bounds("t", epsilon=3, columns=["x"], group_by="day")
        assert suggestion["max_groups_per_unit"] in (10, 15) and suggestion["group_by"] == "day"
        assert suggestion["epsilon_split"]["max_groups_per_unit"] == 0.45  # 0.15 of 3
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


def test_small_epsilon_warns_with_the_rank_and_bin_errors(capsys):
    with dpsql.connect({"t": known(), "p": pd.DataFrame({"a": [1]})}, policy=POLICY, rng=SeededSource(3)) as db:
        small = db.suggest_bounds("t", epsilon=Fraction(1, 20))
        large = db.suggest_bounds("t", epsilon=5)
    # 0.15·ε = 0.0075 for k: rank error 2·ln(53/0.05)/0.0075 ≈ 1858 units > 5% of 3000
    assert small["max_rows_per_unit_rank_error"] == pytest.approx(1857.5, abs=0.1)
    assert any(w.startswith("MAX ROWS PER UNIT: epsilon 0.0075 ranks units only to within ±1858")
               for w in small["warnings"])
    assert all(pair is None for pair in small["bounds"].values())  # withheld at 0.0047 a bound
    assert sorted(w.split(":")[0] for w in small["warnings"] if ": no BOUNDS" in w) == ["n", "x"]
    assert large["warnings"] == [] and large["max_rows_per_unit_rank_error"] < 20  # 0.75 for k: ±18.6
    assert all(pair is not None for pair in large["bounds"].values())
    text = suggestion_text("t", "uid", small, 0.05)
    assert "-- WARNING MAX ROWS PER UNIT" in text and " BOUNDS " not in text.split(");")[0]


def test_row_bounds_the_policy_declares_are_kept_and_their_share_goes_per_unit():
    """A column the policy already BOUNDS keeps them (no draw); its two per-unit draws get the
    column's four shares between them, so the suggestion costs what it did."""
    policy = POLICY.replace("MAX ROWS PER UNIT 5)", "MAX ROWS PER UNIT 5, x BOUNDS -3 TO 40)")
    with dpsql.connect({"t": known(), "p": pd.DataFrame({"a": [1]})}, policy=policy, rng=SeededSource(3)) as db:
        kept = db.suggest_bounds("t", epsilon=2, columns=["x"])
        assert db.budget.spent.epsilon == 2
    assert kept["bounds"]["x"] == (-3, 40)
    said = kept["coverage"]["x"]
    assert said["lower"]["epsilon"] == said["upper"]["epsilon"] == 0
    each = kept["epsilon_split"]["each_bound"]
    assert said["unit_lower"]["epsilon"] == said["unit_upper"]["epsilon"] == pytest.approx(2 * each)
    k = kept["max_rows_per_unit"]  # the suggested k: the per-unit candidates stop at k × 40
    assert -k * 3 <= kept["unit_bounds"]["x"][0] <= 0 < kept["unit_bounds"]["x"][1] <= k * 40
    assert "x BOUNDS -3 TO 40: as the policy declares them" in suggestion_text("t", "uid", kept, 2)
