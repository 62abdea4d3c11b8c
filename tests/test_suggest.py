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
from dpsql.errors import BudgetExceeded, UnsupportedQuery
from dpsql.mechanisms.noise import SeededSource
from dpsql.curator.suggest import (
    ROWS_CANDIDATES,
    bin_counts,
    noisy_bounds,
    rows_sql,
    split_epsilon,
    value_candidates,
    values_sql,
)
from dpsql.curator.suggest_text import suggestion_text


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
    lo, hi = suggestion["estimated_bounds"]["x"]
    assert 50 <= lo <= 80 and 120 <= hi <= 200
    lo, hi = suggestion["estimated_bounds"]["n"]  # uniform 0..999: its lowest bins hold too few units to stand out
    assert isinstance(lo, int) and 0 <= lo <= 100 and 800 <= hi <= 1000
    assert set(suggestion["bounds"]) == {"x", "n"}  # numeric columns but the unit
    for column, pair in suggestion["bounds"].items():  # vouched for: the estimate or wider
        estimate = suggestion["estimated_bounds"][column]
        assert pair is None or (pair[0] <= estimate[0] and estimate[1] <= pair[1])
    assert abs(suggestion["units"] - 3000) <= suggestion["units_halfwidth"] + 60  # ± 30 at 95%; 60 more: < 1e-6
    assert suggestion["epsilon_split"] == {"total": 1.0, "units": 0.1, "max_rows_per_unit": 0.45, "each_column": 0.225}


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
    assert split_epsilon(Fraction(1), False, 4).each_column == Fraction(9, 80)
    for row_level, columns, grouped in product((True, False), (1, 3), (True, False)):
        split = split_epsilon(Fraction(2), row_level, columns, grouped and not row_level)
        assert split.units + split.rows + split.groups + columns * split.each_column == 2  # all of it, no more


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
    assert "noise of COUNT, SUM, AVG, VARIANCE and quantiles grows ∝ k" in out
    assert ("    x BOUNDS " in out) != ("WARNING x: no bounds suggest can vouch for" in out)
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
        assert suggestion["epsilon_split"]["max_groups_per_unit"] == 0.9  # (3 - 0.3) / 3
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


def test_an_empty_bin_passes_the_threshold_with_probability_at_most_beta():
    """τ = scale·ln(bins/β), β = 10⁻³: over 3000 all-empty histograms (236 bins, scale 27 as at
    epsilon 1/27) some bin passes in ≤ 3 expected; more than 25 has probability < 1e-10. With
    the threshold or the noise off by a factor 2, some bin passes in ~40% of them (~1200)."""
    from dpsql.curator import suggest
    edges = list(value_candidates(False))
    source = SeededSource(7)
    passed = sum(noisy_bounds(edges, [0] * (len(edges) + 1), Fraction(1, 27), 1, Fraction(98, 100), source)
                 is not None for _ in range(3000))
    assert suggest.BETA == 1e-3 and passed <= 25


def test_small_epsilon_warns_with_the_rank_and_bin_errors(capsys):
    with dpsql.connect({"t": known(), "p": pd.DataFrame({"a": [1]})}, policy=POLICY, rng=SeededSource(3)) as db:
        small = db.suggest_bounds("t", epsilon=Fraction(1, 20))
        large = db.suggest_bounds("t", epsilon=5)
    # 0.9·ε/2 = 0.0225 for k: rank error 2·ln(53/0.05)/0.0225 ≈ 619 units > 5% of 3000
    assert small["max_rows_per_unit_rank_error"] == pytest.approx(619.2, abs=0.1)
    assert any(w.startswith("MAX ROWS PER UNIT: epsilon 0.0225 ranks units only to within ±619")
               for w in small["warnings"])
    assert all(pair is None for pair in small["bounds"].values())  # nothing vouched for at 0.01125 a column
    assert sum(w.startswith(("x: no bounds suggest can vouch for", "n: no bounds suggest can vouch for"))
               for w in small["warnings"]) == sum(p is not None for p in small["estimated_bounds"].values())
    assert large["warnings"] == [] and large["max_rows_per_unit_rank_error"] < 10
    assert all(pair is not None for pair in large["bounds"].values())
    text = suggestion_text("t", "uid", small, 0.05)
    assert "-- WARNING MAX ROWS PER UNIT" in text and " BOUNDS " not in text.split(");")[0]
