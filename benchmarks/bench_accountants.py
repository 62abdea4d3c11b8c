"""How many queries each accountant answers, and what a charge adds to a query's time.

1. Under a total of epsilon = 1, delta = 1e-6, distinct pure-epsilon queries (Laplace) of
   epsilon 0.01, 0.05 and 0.1 are charged to a fresh ledger file until the accountant refuses:
   the real ``Ledger.charge`` path, each check inside its IMMEDIATE transaction. For reference
   it also prints what each published filter admits on its own (without the "never fewer than
   BASIC" branch, see ``dpsql.budget.accounting``) and what Dwork-Rothblum-Vadhan's formula would allow
   for k fixed in advance (delta' = 5e-7), which a filter must not rely on.
2. The time the ledger adds to one query, medians over many: looking up a stored answer
   (``find_answer``), the charge (one IMMEDIATE transaction with the accountant's check, WAL,
   fsync on commit) and recording the answer (one UPDATE, committed without an fsync), on a
   ledger file that already holds N entries. dpsql.sql() does exactly these three per charged
   query.

Run: ``python benchmarks/bench_accountants.py``; prints Markdown for benchmarks/RESULTS.md.
"""

from __future__ import annotations

import argparse
import datetime
import math
import os
import platform
import shutil
import statistics
import tempfile
import time
from fractions import Fraction
from pathlib import Path

from dpsql.budget.accounting import ACCOUNTINGS, Spend, Tally, accountant_for
from dpsql.budget.ledger import Ledger
from dpsql.errors import BudgetExceeded

TOTAL = Spend(Fraction(1), Fraction(1, 10**6))
PER_QUERY = ("0.01", "0.05", "0.1")


def answered_on_a_ledger(accounting: str, epsilon: Fraction, directory: Path) -> int:
    """Charge distinct queries of ``epsilon`` to a new ledger file until refused."""
    accountant = accountant_for(accounting, TOTAL)
    cost = Spend(epsilon, Fraction(0), epsilon ** 2 / 2)
    with Ledger.open(directory / f"{accounting}-{float(epsilon)}.ledger") as ledger:
        count = 0
        while True:
            try:
                ledger.charge(cost, accountant, sql=f"SELECT COUNT(*) FROM t WHERE x > {count}",
                              options={"epsilon": epsilon}, key=f"q{count}")
            except BudgetExceeded:
                return count
            count += 1


def filter_alone(accounting: str, epsilon: Fraction) -> int:
    """What the published filter admits without the pure-basic branch."""
    accountant, cost = accountant_for(accounting, TOTAL), Spend(epsilon)
    if accounting == "basic":
        return accountant.answerable(cost)
    tally, count = Tally(), 0
    while accountant.filter_admits(tally.add(cost)):
        tally, count = tally.add(cost), count + 1
    return count


def drv_fixed_k(epsilon: float, delta_prime: float = 5e-7) -> int:
    k = 0
    while (math.sqrt(2 * (k + 1) * math.log(1 / delta_prime)) * epsilon
           + (k + 1) * epsilon * math.expm1(epsilon)) <= 1:
        k += 1
    return k


def table_of_counts(directory: Path) -> list[str]:
    lines = ["| per-query epsilon | BASIC | ADVANCED | ZCDP | ADVANCED filter alone | ZCDP filter alone "
             "| DRV formula, k fixed in advance |", "|---|---|---|---|---|---|---|"]
    for text in PER_QUERY:
        epsilon = Fraction(text)
        counts = [answered_on_a_ledger(a, epsilon, directory) for a in ACCOUNTINGS]
        for accounting, count in zip(ACCOUNTINGS, counts):
            assert count == accountant_for(accounting, TOTAL).answerable(Spend(epsilon))
        alone = [filter_alone(a, epsilon) for a in ("advanced", "zcdp")]
        lines.append(f"| {text} | " + " | ".join(map(str, counts + alone))
                     + f" | {drv_fixed_k(float(epsilon))} |")
    return lines


def history(directory: Path, entries: int) -> Path:
    """A ledger file holding ``entries`` charges by several analysts, of several costs."""
    path = directory / f"history-{entries}.ledger"
    if not path.exists():
        huge = Spend(Fraction(10**9), Fraction(1, 10**6))
        with Ledger.open(path) as ledger:
            for i in range(entries):
                ledger.charge(Spend(Fraction(1, 100 + i % 7), Fraction(0), Fraction(1, 20000 + i % 7)),
                              huge, sql="SELECT 1", options={}, analyst=f"a{i % 5}", key=f"h{i}")
    return path


def charge_timings(directory: Path, entries: int, runs: int, accounting: str) -> dict[str, float]:
    """Median milliseconds of each ledger step of a query, on a file with ``entries`` entries."""
    accountant = accountant_for(accounting, Spend(Fraction(10**9), Fraction(1, 10**6)))
    mine = accountant_for(accounting, Spend(Fraction(10**8), Fraction(1, 10**6)))
    cost = Spend(Fraction(1, 100), Fraction(0), Fraction(1, 20000))
    path = directory / f"timing-{accounting}-{entries}.ledger"
    shutil.copyfile(history(directory, entries), path)
    steps: dict[str, list[float]] = {"find_answer": [], "charge": [], "record_answer": []}
    with Ledger.open(path) as ledger:  # a fresh connection: its first charge reads all entries
        for i in range(runs):
            key = f"k{i}"
            start = time.perf_counter()
            ledger.find_answer(key)
            found = time.perf_counter()
            entry = ledger.charge(cost, accountant, sql="SELECT COUNT(*) FROM t", options={},
                                  analyst="alice", key=key, analyst_total=mine)
            charged = time.perf_counter()
            ledger.record_answer(entry, '{"format":1,"columns":["n"],"rows":[[41]],"noisy":{}}')
            done = time.perf_counter()
            steps["find_answer"].append(found - start)
            steps["charge"].append(charged - found)
            steps["record_answer"].append(done - charged)
    medians = {name: statistics.median(values) * 1000 for name, values in steps.items()}
    medians["total"] = statistics.median(sum(v) for v in zip(*steps.values())) * 1000
    return medians


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=500, help="timed queries per setting")
    parser.add_argument("--entries", type=int, nargs="+", default=[0, 10000])
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        directory = Path(tmp)
        print(f"Measured {datetime.date.today()} on {platform.platform()}, Python "
              f"{platform.python_version()}, {os.cpu_count()} CPUs.\n")
        print("Queries answered under a total of epsilon = 1, delta = 1e-6 (distinct pure-epsilon "
              "queries charged to a ledger file until refused):\n")
        print("\n".join(table_of_counts(directory)))
        print("\nTime the ledger adds to one charged query, median ms over "
              f"{args.runs} queries (file ledger, WAL, fsync per charge):\n")
        print("| accountant | entries already in the ledger | find_answer | charge | "
              "record_answer | total |")
        print("|---|---|---|---|---|---|")
        charge_timings(directory, 0, 50, "basic")  # warm the file system up
        for accounting in ACCOUNTINGS:
            for entries in args.entries:
                m = charge_timings(directory, entries, args.runs, accounting)
                print(f"| {accounting.upper()} | {entries} | {m['find_answer']:.3f} | "
                      f"{m['charge']:.3f} | {m['record_answer']:.3f} | {m['total']:.3f} |")


if __name__ == "__main__":
    main()
