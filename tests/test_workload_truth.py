"""Workload answers that tell the truth (issue 37, item 5): counts cut at 0 as post-processing, and
a ± for the synthetic answers from a noisy check whose coverage is tested over repeats, exactly
within the charged budget (``dpsql.mechanisms.mwem``: the check)."""

from __future__ import annotations

from fractions import Fraction

import duckdb
import numpy as np
import pandas as pd
import pytest

import dpsql
import dpsql.mechanisms.mwem as mwem
from dpsql.budget.accounting import rho_budget
from dpsql.calls.workload_run import _decode, plan_workload
from dpsql.mechanisms.noise import SeededSource

POLICY = """BUDGET EPSILON 1000;
PRIVATE TABLE t (PRIVACY UNIT uid, MAX ROWS PER UNIT 2, a KEYS (1, 2, 3), b KEYS ('x', 'y'));
"""
COUNTS = [
    "SELECT COUNT(*) FROM t WHERE a = 1",
    "SELECT COUNT(*) FROM t WHERE a = 3 AND b = 'y'",
    "SELECT a, COUNT(*) FROM t GROUP BY a",
    "SELECT -1 * COUNT(*) FILTER (WHERE b = 'x') FROM t",
]
SIGNED = "SELECT COUNT(*) FILTER (WHERE a = 1) - COUNT(*) FILTER (WHERE a = 2) FROM t"


def tiny_db(seed: int):
    frame = pd.DataFrame({"uid": [1, 2, 3, 4, 5, 5], "a": [1, 2, 2, 2, 3, 1], "b": ["x", "x", "y", "y", "x", "y"]})
    con = duckdb.connect()
    con.register("frame", frame)
    con.execute("CREATE TABLE t AS SELECT * FROM frame")
    return dpsql.connect(con, policy=POLICY, ledger=":memory:", rng=SeededSource(seed))


def test_counts_are_cut_at_zero_as_post_processing_only():
    """At ε 0.3 the measurements' noise (scale 2/0.12 ≈ 17 rows) makes raw counts negative often:
    a count's answer is max(0, mean of its measurements), its interval cut at 0 too; a query with
    only negative coefficients is cut at 0 from above; a signed combination is left alone."""
    queries = [*COUNTS, SIGNED]
    cut, signed_negative = 0, 0
    for seed in range(30):
        with tiny_db(seed) as db:
            planned = plan_workload(db.mechanism_context(), queries, Fraction(3, 10), None, 4)
            result = db.workload(queries, epsilon=Fraction(3, 10), rounds=4)
            release = _decode(db._ledger.find_answer(planned.key))
        low, high = mwem.feasible_range(planned.workload)
        rows, cells = result.fetchall(), result.cells()["answer"]
        for s, ((query, _, value, measured), (lower, upper, half)) in enumerate(zip(rows, cells)):
            assert lower <= value <= upper
            taken = release.measurements[s]
            if query <= 3:      # counts: never below 0, nor their intervals
                assert value >= 0 and lower >= 0 and low[s] == 0 and high[s] == np.inf
            elif query == 4:    # minus a count: never above 0
                assert value <= 0 and upper <= 0 and high[s] == 0
            else:
                assert low[s] == -np.inf and high[s] == np.inf
                signed_negative += value < 0
            if taken:           # post-processing: the released mean, moved into the feasible range
                mean = sum(taken) / len(taken)
                assert value == min(max(mean, low[s]), high[s])
                cut += value != mean
                assert (lower, upper) == (min(max(mean - half, low[s]), high[s]), min(max(mean + half, low[s]),
                                                                                   high[s]))
    assert cut > 0 and signed_negative > 0   # the cut happened, and the signed query was left to go negative


# The coverage test: a skewed histogram over 16 cells with n = 101,000, every cell's count and 8 ranges,
# one row per unit (Δ = 1), and 2 rounds: the synthetic answers are off by thousands, far beyond the
# check's own noise, so the bound's coverage is decided by the check, not by slack.
HISTOGRAM = np.array([50_000, 30_000, 0, 0, 10, 5_000, 0, 900, 15_000, 0, 0, 90, 0, 0, 0, 0], dtype=np.int64)
RANGES = [(0, 3), (2, 9), (4, 15), (0, 15), (7, 8), (10, 13), (1, 1), (5, 12)]
RUNS, ALPHA, FAILURES_ALLOWED = 600, 0.1, 99
"""Failures of the simultaneous statement are Binomial(600, p <= 0.1): P(>= 99) = 5.9e-7 < 1e-6."""


def skewed_workload() -> mwem.Workload:
    cells = HISTOGRAM.size
    bases = [np.eye(cells, dtype=np.int64)[i] for i in range(cells)]
    bases += [np.array([1 if lo <= i <= hi else 0 for i in range(cells)], dtype=np.int64) for lo, hi in RANGES]
    return mwem.Workload(np.array(bases), np.zeros((len(bases), cells), dtype=np.int64), (1,) * len(bases))


def check_failures(plan: mwem.MwemPlan, width: float) -> tuple[int, int]:
    """Over RUNS independent releases: in how many did some synthetic answer fall outside ``width``
    times its stated (1 - ALPHA) ±, and how many synthetic answers there were in all."""
    workload = skewed_workload()
    sensitivities = mwem.query_sensitivities(workload, 1, "unbounded")
    truth = workload.answers(HISTOGRAM)
    failures, answers = 0, 0
    for seed in range(RUNS):
        release = mwem.run_mwem(plan, workload, sensitivities, HISTOGRAM, SeededSource(1000 + seed))
        synthetic = [s for s in range(workload.size) if not release.measurements[s]]
        missed = False
        for s in synthetic:
            half = mwem.checked_half_width(plan, sensitivities[s], release.check, ALPHA)
            missed |= abs(Fraction(release.values[s]) - int(truth[s])) > Fraction(half) * Fraction(width)
        failures += missed
        answers += len(synthetic)
    return failures, answers


@pytest.mark.parametrize("noise", ["laplace", "gaussian"])
def test_the_checked_bound_covers_every_synthetic_answer_at_its_level_and_half_of_it_does_not(noise):
    """Each synthetic answer's ± holds for all of them at once with probability >= 1 - ALPHA, so the
    failures over RUNS seeds are at most Binomial(RUNS, ALPHA): >= FAILURES_ALLOWED has probability
    below 1e-6. The same ± halved fails in (almost) every run, far past that threshold."""
    delta = Fraction(0) if noise == "laplace" else Fraction(1, 10**6)
    plan = mwem.plan_mwem(Fraction(2), delta, 2, 1, rho_budget)
    assert plan.noise == noise
    failures, answers = check_failures(plan, 1.0)
    assert answers >= RUNS * 20 and failures < FAILURES_ALLOWED
    halved, _ = check_failures(plan, 0.5)
    assert halved >= FAILURES_ALLOWED


def test_the_check_is_within_the_charge():
    """The check is drawn once, at ε_c = CHECK_SHARE·ε (sensitivity CHECK_GRID), and the parts still
    add up to exactly the ε (or rho) charged."""
    pure = mwem.plan_mwem(Fraction(2), Fraction(0), 5, 3, None)
    assert pure.check_scale() == mwem.CHECK_GRID / (2 * mwem.CHECK_SHARE)
    assert pure.total_epsilon + pure.check_epsilon + 5 * (pure.select_epsilon + pure.measure_epsilon) == 2
    zcdp = mwem.plan_mwem(Fraction(2), Fraction(1, 10**6), 5, 3, rho_budget)
    assert zcdp.check_scale() == Fraction(mwem.CHECK_GRID) ** 2 / (2 * zcdp.check_rho)
    assert zcdp.check_rho == rho_budget(Fraction(2), Fraction(1, 10**6)) * mwem.CHECK_SHARE
    assert zcdp.total_rho + zcdp.check_rho + 5 * (zcdp.select_epsilon ** 2 / 8 + zcdp.measure_rho) == zcdp.rho


def test_the_stated_bound_is_far_tighter_than_the_worst_case():
    """On the skewed data the check's ± is within a small factor of the synthetic answers' real
    largest error (MWEM's exponential-mechanism bound was ~20x the RMSE on flights)."""
    plan = mwem.plan_mwem(Fraction(2), Fraction(0), 2, 1, None)
    workload = skewed_workload()
    sensitivities = mwem.query_sensitivities(workload, 1, "unbounded")
    truth = workload.answers(HISTOGRAM)
    release = mwem.run_mwem(plan, workload, sensitivities, HISTOGRAM, SeededSource(3))
    synthetic = [s for s in range(workload.size) if not release.measurements[s]]
    worst = max(abs(release.values[s] - int(truth[s])) for s in synthetic)
    stated = mwem.checked_half_width(plan, sensitivities[synthetic[0]], release.check, 0.05)
    assert worst <= stated <= worst + 200   # the check's noise at ε_c = 0.2: scale 5 rows


def test_pmw_measured_counts_are_cut_at_zero_with_their_intervals(monkeypatch):
    """A PMW session's measured count of an empty cell (a = 3 AND b = 'y' holds no row) at a small ε:
    the raw measurement goes below 0 about half the time; the answer is max(0, it), the interval
    [max(0, m - h), max(0, m + h)], the same ± h."""
    import dpsql.calls.pmw as pmw_module

    drawn = []
    laplace = pmw_module.noise.discrete_laplace

    def record(scale, size, source=None):
        out = laplace(scale, size, source)
        drawn.append(int(out[0]))
        return out

    monkeypatch.setattr(pmw_module.noise, "discrete_laplace", record)
    negative = 0
    for seed in range(12):
        with tiny_db(seed) as db:
            session = db.pmw("t", ["a", "b"], epsilon=Fraction(1, 2), max_updates=1, threshold=Fraction(1, 100))
            drawn.clear()
            answer = session.answer("SELECT COUNT(*) FROM t WHERE a = 3 AND b = 'y'")
        value, measured = answer.fetchall()[0]
        low, high, half = answer.cells()["answer"][0]
        if not measured:
            continue
        raw = drawn[-1]                     # the truth is 0: the measurement is its noise
        assert value == max(0, raw) and (low, high) == (max(0.0, raw - half), max(0.0, raw + half))
        negative += raw < 0
    assert negative > 0
