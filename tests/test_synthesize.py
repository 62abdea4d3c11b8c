"""Synthetic tables (``db.synthesize``, ``dpsql.calls.synthesize``; AIM and MST in ``dpsql.mechanisms``):
the marginals' sensitivity by brute force through the real statement (per unit, add/remove and
replace), the noise drawn against the ρ charged, the charge (once, one ledger entry, everything
spent), refusals before any charge, and the SQL form."""

from __future__ import annotations

import itertools
import math
from fractions import Fraction

import duckdb
import numpy as np
import pandas as pd
import pytest
from scipy import stats

import dpsql
from dpsql.calls.synthesize import exact_marginals, numeric_bins, plan_synthesis
from dpsql.mechanisms import aim as aim_module
from dpsql.mechanisms import graphical
from dpsql.mechanisms.marginals import count_l2_squared, marginal_l1, marginal_l2_squared
from dpsql.mechanisms.mst import run_mst
from dpsql.mechanisms.noise import SeededSource
from dpsql.mechanisms.synthesis import TOTAL_SHARE, synthesize

pytestmark = pytest.mark.skipif(not graphical.has_mbi(), reason="needs mbi (pip install 'dpsql[synth]')")

POLICY = """BUDGET EPSILON 100 DELTA 1e-3;
NEIGHBOURS {neighbours};
PRIVATE TABLE t (PRIVACY UNIT uid, MAX ROWS PER UNIT 2, a KEYS (1, 2), b KEYS ('x', 'y'), v BOUNDS 0 TO 3,
                 w BOUNDS 0 TO 1);
"""
ROW_TYPES = [(1, "x", 2), (None, "z", 7), (2, "y", None), (1, "y", 0)]
"""Rows a unit may hold: keys, a NULL key and one outside b's domain (the outside cell), v inside,
above its bounds or NULL."""


def base_frame() -> pd.DataFrame:
    rows = [(uid, a, b, v, 0.5) for uid, (a, b, v) in enumerate(ROW_TYPES * 2, start=1)]
    return pd.DataFrame(rows, columns=["uid", "a", "b", "v", "w"]).astype({"a": "Int64", "v": "Int64"})


def connect(neighbours: str = "unbounded", frame: pd.DataFrame | None = None, **kwargs):
    con = duckdb.connect()
    con.register("frame", base_frame() if frame is None else frame)
    con.execute("CREATE TABLE t AS SELECT uid, a, b, v, w FROM frame")
    return con, dpsql.connect(con, policy=POLICY.format(neighbours=neighbours), ledger=":memory:", **kwargs)


def counts_now(db, planned) -> dict:
    db.refresh()
    rows = db._answerer.read_keys(db._executor._fetch(planned.statement), list(planned.keys))
    return exact_marginals(planned, rows)


@pytest.fixture(scope="module")
def enumerated():
    """(planned AIM synthesis over a, b, v, every unit's change to every marginal, through the real
    bounded statement: counts(D + unit) - counts(D) for every unit of 1 to 3 rows, one more than k)."""
    con, db = connect()
    with db:
        planned = plan_synthesis(db.mechanism_context(), "t", ["a", "b", "v"], 1, Fraction(1, 10**6), "aim", None,
                                 None)
        before = counts_now(db, planned)
        changes = {clique: [np.zeros_like(vector)] for clique, vector in before.items()}
        for size in (1, 2, 3):
            for rows in itertools.combinations_with_replacement(ROW_TYPES, size):
                con.execute("DELETE FROM t WHERE uid = 999")
                con.executemany("INSERT INTO t VALUES (999, ?, ?, ?, 0.5)", [list(r) for r in rows])
                after = counts_now(db, planned)
                for clique in before:
                    changes[clique].append(after[clique] - before[clique])
        con.execute("DELETE FROM t WHERE uid = 999")
    return planned, {clique: np.array(found) for clique, found in changes.items()}


def test_cells_come_from_the_policy(enumerated):
    planned, _ = enumerated
    assert {c.name: c.labels for c in planned.columns} == {
        "a": ("1", "2", "NULL"), "b": ("x", "y", "NULL"), "v": ("0", "1", "2", "3", "NULL")}
    assert planned.reach == 2
    assert numeric_bins(0, 100) == (4, 26) and numeric_bins(5, 5) == (1, 1)


@pytest.mark.parametrize("neighbours", ["unbounded", "bounded"])
def test_marginal_sensitivity_is_what_one_unit_moves(enumerated, neighbours):
    """Δ₂² and Δ₁ of every measured marginal, and the count's, are the largest change one unit makes
    (add/remove: ||c||; replace: ||c - c'||), reached, and a bound for k - 1 fails."""
    planned, changes = enumerated
    k = planned.reach
    for clique, found in changes.items():
        if neighbours == "unbounded":
            l2 = int((found ** 2).sum(axis=1).max())
            l1 = int(np.abs(found).sum(axis=1).max())
        else:
            differences = found[:, None, :] - found[None, :, :]
            l2 = int((differences ** 2).sum(axis=2).max())
            l1 = int(np.abs(differences).sum(axis=2).max())
        if clique == ():
            assert l2 == count_l2_squared(k) and l2 > count_l2_squared(k - 1)
            continue
        assert l2 == marginal_l2_squared(k, neighbours), clique
        assert l1 == marginal_l1(k, neighbours), clique
        assert l2 > marginal_l2_squared(k - 1, neighbours) and l1 > marginal_l1(k - 1, neighbours)


def _standardised(measurements, exact_of) -> np.ndarray:
    parts = []
    for m in measurements:
        parts.append((m.values - exact_of(m.clique)) / math.sqrt(m.sigma_sq))
    return np.concatenate(parts)


def test_the_noise_drawn_is_the_rho_spent():
    """MST's measurements over zero counts: every cell's noise, divided by the σ its recorded ρ
    implies (σ² = Δ₂²/(2ρ)), has variance 1 (a chi-square test at failure 1e-7 per tail), and the
    recorded ρ (measurements and choices) add up to the ρ given exactly. A noise scale off by a
    factor 2 in variance is far outside the bounds."""
    sizes = {"p": 60, "q": 70, "r": 50}
    columns = list(sizes)
    rho = Fraction(1, 50)
    zero = {(c,): np.zeros(sizes[c], dtype=np.int64) for c in columns}
    for a, b in itertools.combinations(columns, 2):
        zero[(a, b)] = np.zeros(sizes[a] * sizes[b], dtype=np.int64)
    l2_squared = marginal_l2_squared(2, "bounded")
    measured = run_mst(columns, list(itertools.combinations(columns, 2)), rho, l2_squared, 4, zero.__getitem__,
                       1000.0, SeededSource(11))
    assert sum(m.rho + m.selection_rho for m in measured) == rho
    assert all(m.sigma_sq == Fraction(l2_squared) / (2 * m.rho) for m in measured)
    z = _standardised(measured, zero.__getitem__)
    n = z.size
    low, high = stats.chi2.ppf(1e-7, n) / n, stats.chi2.isf(1e-7, n) / n
    variance = float((z ** 2).mean())
    assert low <= variance <= high
    assert not low <= 2 * variance <= high and not low <= variance / 2 <= high


@pytest.fixture(scope="module")
def released():
    """One MST and one (short) AIM release on the tiny table, with the ledger before and after."""
    con, db = connect(rng=SeededSource(5))
    saved = aim_module.ROUNDS_PER_COLUMN
    aim_module.ROUNDS_PER_COLUMN = 2   # few rounds: each is a new model for jax to compile
    try:
        with db:
            entries = len(db.ledger())
            mst = db.synthesize("t", ["a", "b", "v"], epsilon=1, delta=1e-6, method="mst")
            after_mst = len(db.ledger())
            aim = db.synthesize("t", ["v", "w"], epsilon=2, delta=1e-6, method="aim", rows=40, name="t_aim")
            ledger = db.ledger()
            spent = db.budget.spent
    finally:
        aim_module.ROUNDS_PER_COLUMN = saved
    return mst, aim, entries, after_mst, ledger, spent


def test_charged_once_and_everything_spent(released):
    mst, aim, entries, after_mst, ledger, spent = released
    assert (entries, after_mst, len(ledger)) == (0, 1, 2)
    from dpsql.budget.accounting import rho_budget
    for release, epsilon in ((mst, 1), (aim, 2)):
        rho = rho_budget(Fraction(epsilon), Fraction(1, 10**6))
        assert release.rho == float(rho)
        assert math.isclose(sum(m.rho + m.selection_rho for m in release.measured), release.rho, rel_tol=1e-12)
        count = release.measured[0]
        assert count.columns == () and math.isclose(count.rho, float(rho * TOTAL_SHARE), rel_tol=1e-12)
        assert math.isclose(count.sigma, math.sqrt(4 / (2 * count.rho)), rel_tol=1e-12)   # Δ₂ = k = 2
    assert float(spent.epsilon) == 3
    assert "SYNTHESIZE MST t (a, b, v)" in ledger.iloc[0].to_dict().values().__repr__()


def test_release_fields(released):
    mst, aim, *_ = released
    assert (mst.name, mst.source, mst.method) == ("t_synthetic", "t", "mst")
    assert list(mst.table.columns) == ["a", "b", "v"] and len(mst.table) == mst.rows >= 1
    assert set(mst.table["a"].dropna()) <= {1, 2} and set(mst.table["b"].dropna()) <= {"x", "y"}
    assert set(mst.table["v"].dropna()) <= {0, 1, 2, 3}
    # one-way marginals, then the spanning tree's d - 1 = 2 pairs, each chosen
    assert [m.columns for m in mst.measured][:4] == [(), ("a",), ("b",), ("v",)]
    assert len(mst.measured) == 6 and all(m.selection_rho > 0 for m in mst.measured[4:])
    assert (aim.name, aim.rows, len(aim.table)) == ("t_aim", 40, 40)
    assert aim.bins["w"][-1] == "NULL" and len(aim.bins["w"]) == 33
    assert aim.table["w"].between(0, 1).all()
    assert aim.error_estimates and all(v >= 0 for v in aim.error_estimates.values())
    assert aim.created.endswith("+00:00") and aim.analyst is None


def test_refused_before_any_charge(monkeypatch):
    con, db = connect()
    frame = pd.DataFrame({"uid": [1], "a": [1], "b": ["x"], "v": [1], "w": [0.5], "note": ["n"]})
    con2 = duckdb.connect()
    con2.register("frame", frame)
    con2.execute("CREATE TABLE t AS SELECT * FROM frame")
    db2 = dpsql.connect(con2, policy=POLICY.format(neighbours="unbounded"), ledger=":memory:")
    with db, db2:
        with pytest.raises(dpsql.DPError, match="neither KEYS nor BOUNDS"):
            db2.synthesize("t", ["a", "note"], epsilon=1, delta=1e-6)
        with pytest.raises(dpsql.DPError, match="delta > 0"):
            db.synthesize("t", ["a", "b"], epsilon=1, delta=0)
        with pytest.raises(dpsql.DPError, match="method"):
            db.synthesize("t", ["a", "b"], epsilon=1, delta=1e-6, method="mwem")
        with pytest.raises(dpsql.DPError, match="no column"):
            db.synthesize("t", ["a", "zz"], epsilon=1, delta=1e-6)
        with pytest.raises(dpsql.DPError, match="buys no zCDP rho"):  # charged, then failed (attacker review)
            db.synthesize("t", ["a", "b"], epsilon=1e-6, delta=1e-12, method="mst")
        monkeypatch.setattr("dpsql.calls.synthesize.MAX_FETCHED_CELLS", 20)
        with pytest.raises(dpsql.DPError, match="cells of marginals"):
            db.synthesize("t", ["a", "b", "v"], epsilon=1, delta=1e-6)
        monkeypatch.undo()
        monkeypatch.setattr(graphical, "has_mbi", lambda: False)
        with pytest.raises(dpsql.MissingDependency, match=r"pip install 'dpsql\[synth\]'"):
            db.synthesize("t", ["a", "b"], epsilon=1, delta=1e-6)
        for connection in (db, db2):
            assert float(connection.budget.spent.epsilon) == 0 and len(connection.ledger()) == 0


def test_sql_form(monkeypatch):
    con, db = connect(rng=SeededSource(9))
    call = ("SELECT * FROM synthesize(table = 't', columns = 'a, b', epsilon = 1, delta = 1e-6, method = 'mst', "
            "name = 't_synth')")
    with db:
        text = str(db.explain(call))
        assert "MST" in text and "GROUPING SETS" in text and float(db.budget.spent.epsilon) == 0
        result = db.sql(call)
        row = dict(zip(result.columns, result.fetchall()[0]))
        assert (row["name"], row["source"], row["method"], row["columns"]) == ("t_synth", "t", "mst", "a, b")
        assert row["marginals"] == 3 and float(result.cost.epsilon) == 1
        assert float(db.budget.spent.epsilon) == 1 and len(db.ledger()) == 1
        # kept for its owner (dpsql.query.synthetic_tables): queried exactly, free
        assert db.sql("SELECT COUNT(*) FROM t_synth").fetchall()[0][0] == row["rows"]
        assert float(db.budget.spent.epsilon) == 1 and len(db.ledger()) == 1
        with pytest.raises(dpsql.DPError, match="already have a synthetic table"):
            db.sql(call)
        assert float(db.budget.spent.epsilon) == 1
        with pytest.raises(dpsql.DPError, match="no option"):
            db.sql("SELECT * FROM synthesize(table = 't', columns = 'a', epsilon = 1, bins = 3)")


def test_pure_synthesis_spends_exactly_rho_with_aim(monkeypatch):
    """AIM's rounds, annealing included, add up to exactly the ρ given (Fractions, not floats)."""
    monkeypatch.setattr(aim_module, "ROUNDS_PER_COLUMN", 2)
    sizes = {"p": 3, "q": 4}
    exact = {(): np.array([30]), ("p",): np.array([10, 10, 10]), ("q",): np.array([5, 5, 10, 10]),
             ("p", "q"): np.arange(12, dtype=np.int64)}
    weights = aim_module.candidates(["p", "q"], sizes, 100)
    rho = Fraction(3, 7)
    made = synthesize("aim", ["p", "q"], sizes, rho, 1, "unbounded", exact.__getitem__, 10**6, [], weights, None,
                      SeededSource(2))
    assert sum(m.rho + m.selection_rho for m in made.measurements) == rho
    assert made.measurements[0].rho == rho * TOTAL_SHARE and made.rows == len(made.cells["p"])


def test_projector_matches_mbi_projection():
    """The joint-table projection (``graphical.Projector``) gives mbi's own marginals, in any order."""
    from dpsql.mechanisms.marginals import Measurement

    sizes = {"a": 3, "b": 4, "c": 2}
    space = graphical.domain(list(sizes), list(sizes.values()))
    rng = np.random.default_rng(0)
    measured = [Measurement(clique, rng.poisson(20, math.prod(sizes[c] for c in clique)).astype(float), Fraction(4),
                            Fraction(1)) for clique in [("a",), ("b",), ("c",), ("a", "b"), ("b", "c")]]
    model = graphical.estimate(space, measured, 300.0)
    projected = graphical.Projector(model)
    for clique in [("a",), ("c", "a"), ("b", "c"), ("c", "b", "a")]:
        theirs = np.asarray(model.project(clique).datavector(flatten=True))
        assert np.allclose(projected(clique), theirs, rtol=1e-9, atol=1e-9)
    # rows drawn by randomized rounding (graphical.sample_rows) keep to the model's marginals
    n = 20_000
    drawn = graphical.sample_rows(model, n, SeededSource(4))
    plan = graphical.sampling_plan(model)
    first, (second, parents) = plan[0][0], plan[1]
    assert all(len(values) == n for values in drawn.values())
    # the first column's counts are n·p rounded up or down; a child of it, within 1 per group plus 1
    share = projected((first,)) / projected((first,)).sum()
    assert np.abs(np.bincount(drawn[first], minlength=sizes[first]) - n * share).max() < 1
    if parents == (first,):
        pair = (first, second)
        joint = np.bincount(np.ravel_multi_index((drawn[first], drawn[second]), (sizes[first], sizes[second])),
                            minlength=sizes[first] * sizes[second])
        assert np.abs(joint - n * projected(pair) / projected(pair).sum()).max() < 2
    # on every model clique, far closer than independent draws (whose chi-square statistic falls
    # below its 1e-6 quantile with probability 1e-6)
    for clique in [("a", "b"), ("b", "c")]:
        shape = tuple(sizes[c] for c in clique)
        observed = np.bincount(np.ravel_multi_index(tuple(drawn[c] for c in clique), shape),
                               minlength=math.prod(shape))
        expected = projected(clique) / projected(clique).sum() * n
        statistic = float(((observed - expected) ** 2 / expected).sum())
        assert statistic < stats.chi2.ppf(1e-6, math.prod(shape) - 1), clique


def test_rounded_counts_are_unbiased_and_exact_in_total():
    """Systematic rounding: every group's counts sum to its size, each cell is floor or ceil of its
    expectation, and over many shifts a cell's mean is its expectation (a 1e-6 two-sided bound)."""
    expected = np.array([[0.3, 2.45, 1.25], [0.0, 0.0, 0.0], [1.0, 0.5, 0.5]])
    sizes = np.array([4, 0, 2])
    trials = 20_000
    shifts = np.random.default_rng(5).uniform(0, 1, trials)
    counts = np.stack([graphical.rounded_counts(expected, sizes, np.full(3, u)) for u in shifts])
    assert (counts.sum(axis=2) == sizes).all()
    assert ((counts == np.floor(expected)) | (counts == np.ceil(expected))).all()
    fraction = expected - np.floor(expected)
    spread = np.sqrt(fraction * (1 - fraction) / trials)
    assert (np.abs(counts.mean(axis=0) - expected) <= stats.norm.isf(1e-6 / 18) * spread + 1e-12).all()
    # a rounding biased by a quarter of a row somewhere would be caught by the same bound
    assert (np.abs(counts.mean(axis=0) - (expected + 0.25)) > stats.norm.isf(1e-6 / 18) * spread + 1e-12).all()


@pytest.mark.parametrize("neighbours", ["unbounded", "bounded"])
def test_selection_scores_move_by_at_most_their_sensitivity(enumerated, neighbours):
    """AIM's and MST's score ||M_r(x) - a||₁ (exact, on the 2**-20 grid) moves by at most Δ₁ between
    neighbours (every enumerated unit; replace: any two of them), for public estimates a anywhere."""
    from dpsql.mechanisms.marginals import l1_distance, on_score_grid

    planned, changes = enumerated
    base = {clique: np.full(found.shape[1], 3, dtype=np.int64) for clique, found in changes.items()}
    rng = np.random.default_rng(1)
    for clique, found in changes.items():
        if clique == ():
            continue
        estimate = on_score_grid(rng.uniform(0, 6, found.shape[1]))
        scores = [l1_distance(base[clique] + change, estimate) for change in found]
        reference = l1_distance(base[clique], estimate)
        moved = max(abs(s - reference) for s in scores) if neighbours == "unbounded" else max(scores) - min(scores)
        assert moved <= marginal_l1(planned.reach, neighbours), clique


def test_choice_follows_the_exponential_mechanism():
    """``choose`` draws r with probability ∝ exp(ε·q_r/(2Δ)): frequencies over many seeded draws
    within a chi-square bound (failure 1e-6), and far from the law with ε doubled."""
    from dpsql.mechanisms.marginals import choose

    scores = [Fraction(0), Fraction(3), Fraction(-2), Fraction(5, 2)]
    epsilon, sensitivity = Fraction(1), Fraction(2)
    law = np.exp([float(epsilon * q / (2 * sensitivity)) for q in scores])
    law /= law.sum()
    source = SeededSource(8)
    n = 4000
    observed = np.bincount([choose(scores, sensitivity, epsilon, source) for _ in range(n)], minlength=4)
    statistic = float(((observed - n * law) ** 2 / (n * law)).sum())
    assert statistic < stats.chi2.isf(1e-6, 3)
    doubled = np.exp([float(2 * epsilon * q / (2 * sensitivity)) for q in scores])
    doubled /= doubled.sum()
    assert float(((observed - n * doubled) ** 2 / (n * doubled)).sum()) > stats.chi2.isf(1e-6, 3)
