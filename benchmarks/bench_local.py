"""Randomized-response columns: the exact sampler's speed, the de-biased count's accuracy on PUMS,
and the audit of the collected-then-counted release with more samples than the test takes.

1. ``k_ary_response`` draws per second from the secure source, for a few (k, epsilon).
2. PUMS (one row per person, 1,000 people): ``married`` and ``educ`` collected at epsilon 1 and 2,
   ``--trials`` times; the free de-biased count's RMSE against the true count, the mean of the
   standard error ``accuracy()`` reports, and how often the 95% interval held the true count.
   The same through the central path (unbounded neighbours, query epsilon 1).
3. The audit of ``tests/test_local.py`` with ``--samples`` releases a side.

Run: ``python benchmarks/bench_local.py [--trials 200] [--samples 200000]``.
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from fractions import Fraction
from pathlib import Path

import duckdb
import numpy as np

sys.path[:0] = [str(Path(__file__).resolve().parent.parent), str(Path(__file__).resolve().parent.parent / "tests")]

from audit import loss_lower_bound, thresholds  # noqa: E402
from pums import load_pums  # noqa: E402
from test_local import _collected_answers  # noqa: E402

import dpsql  # noqa: E402
from dpsql.mechanisms.randomized_response import randomized_response  # noqa: E402
from dpsql.mechanisms.noise import SecureSource, k_ary_response  # noqa: E402


def sampler_speed() -> None:
    print("sampler: draws per second (secure source, 10^6 draws)")
    for k, epsilon in ((2, 1), (3, 1), (16, 1), (16, 5), (100, 5)):
        true = np.arange(1_000_000) % k
        start = time.perf_counter()
        k_ary_response(true, Fraction(epsilon), k, SecureSource())
        elapsed = time.perf_counter() - start
        print(f"  k={k:<4} epsilon={epsilon}: {1e6 / elapsed / 1e6:.2f} M/s ({elapsed:.2f} s)")


def pums_accuracy(trials: int) -> None:
    con = duckdb.connect()
    load_pums(con, variant="pid")
    frame = con.sql("SELECT pid, married, educ FROM pums").df()
    print(f"PUMS, {len(frame)} people, {trials} collections each")
    for column, domain, chosen in (("married", [0, 1], 1), ("educ", list(range(1, 17)), 9)):
        true = int((frame[column] == chosen).sum())
        for epsilon in (1, 2):
            for neighbours in ("BOUNDED", "UNBOUNDED"):
                errors, halves, covered, seconds = [], [], 0, 0.0
                for trial in range(trials):
                    collected = frame.copy()
                    collected[column] = randomized_response(frame[column].tolist(), epsilon=epsilon, domain=domain)
                    policy = (f"BUDGET EPSILON {trials + 1}; NEIGHBOURS {neighbours}; QUERY EPSILON 1; "
                              f"PRIVATE TABLE pums (PRIVACY UNIT ROW, {column} LOCAL RR EPSILON {epsilon} "
                              f"DOMAIN ({', '.join(map(str, domain))}));")
                    with dpsql.connect({"pums": collected}, policy=policy) as db:
                        start = time.perf_counter()
                        result = db.sql(f"SELECT COUNT(*) AS n FROM pums WHERE {column} = {chosen}")
                        seconds += time.perf_counter() - start
                    estimate, half = result.fetchall()[0][0], result.accuracy()["n"]
                    errors.append(estimate - true)
                    halves.append(half)
                    covered += abs(estimate - true) <= half
                rmse = math.sqrt(np.mean(np.square(errors)))
                path = "free" if neighbours == "BOUNDED" else "central, query epsilon 1"
                print(f"  {column} = {chosen} (true {true}), k={len(domain)}, epsilon {epsilon}, {path}: "
                      f"RMSE {rmse:.1f}, "
                      f"mean ± {np.mean(halves):.1f} (SE {np.mean(halves) / 1.96:.1f}), 95% interval held "
                      f"{covered / trials:.1%}, {seconds / trials * 1000:.1f} ms a query")


def audit(samples: int) -> None:
    import test_local

    test_local.SAMPLES = samples
    first, second = ["yes", "maybe"], ["no", "maybe"]
    events = thresholds([-5.0, 5.0], count=20)
    for epsilon in (Fraction(1), Fraction(2)):
        bound = loss_lower_bound(_collected_answers(first, epsilon, 1), _collected_answers(second, epsilon, 2), events)
        print(f"audit, {samples} releases a side, reports drawn at epsilon {epsilon}, declared 1: "
              f"loss lower bound {bound:.3f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=200)
    parser.add_argument("--samples", type=int, default=200_000)
    args = parser.parse_args()
    sampler_speed()
    pums_accuracy(args.trials)
    audit(args.samples)


if __name__ == "__main__":
    main()
