"""The differential sensitivity fuzzer, for as long as you like (issue 11 item 6, issue 16 item 6, issue 21).

Runs the properties of ``tests/test_differential_fuzz.py`` (``tests/differential.py``) on
``--examples`` generated neighbouring pairs, spread evenly over the families of
``tests/differential_cases.py`` (or the ``--family`` ones), and prints per family the cases
run, the time per case, how the queries ended, where the databases lived (memory, or a file
with its writes in the WAL), and every distinct mechanism that broke a property with how often
it did. The storage-order property (neighbour B stored reversed and shuffled must answer as
stored as listed) is checked on every case of the identity families, or of every family with
``--orders all`` (none with ``--orders none``). With ``--shrink`` each mechanism's first case
is shrunk by Hypothesis to a small reproduction, printed in full.

Run: ``python benchmarks/bench_fuzz.py --examples 5000 [--family coerced_join] [--shrink] [--seed 1]
[--orders identity|all|none]``.
"""

from __future__ import annotations

import argparse
import collections
import datetime
import platform
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE.parent), str(HERE.parent / "tests")]

import differential  # noqa: E402
from differential_cases import FAMILIES  # noqa: E402
from hypothesis import HealthCheck, Phase, given, seed, settings  # noqa: E402


class Tally:
    """What one family's run saw."""

    def __init__(self):
        self.cases = 0
        self.seconds = 0.0
        self.outcomes = collections.Counter()
        self.storages = collections.Counter()
        self.tags = collections.Counter()
        self.first = {}
        self.crashes = collections.Counter()

    def record(self, case, found, seconds: float, outcome: str) -> None:
        self.cases += 1
        self.seconds += seconds
        self.outcomes[outcome] += 1
        self.storages[case.storage + (", unit first" if case.extra_first else "")] += 1
        for violation in found:
            key = (violation.prop, violation.tag)
            self.tags[key] += 1
            self.first.setdefault(key, (case, violation))


ORDER_FAMILIES = ("identity", "identity_row")
"""Families checked for the storage-order property by default."""


def run_family(name: str, examples: int, seed_value: int, databases: differential.Databases,
               orders: tuple[str, ...] = ()) -> Tally:
    tally = Tally()

    @seed(seed_value)
    @settings(max_examples=examples, deadline=None, database=None, phases=[Phase.generate],
              suppress_health_check=list(HealthCheck))
    @given(case=FAMILIES[name]())
    def explore(case):
        started = time.perf_counter()
        try:
            sides, found = differential.observe_pair(case, 0, databases, orders)
        except Exception as error:  # a crash of the harness itself: count it, keep going
            tally.crashes[f"{type(error).__name__}: {str(error).splitlines()[0][:100]}"] += 1
            return
        outcome = " / ".join(sorted({side.outcome[0] for side in sides}))
        tally.record(case, found, time.perf_counter() - started, outcome)

    explore()
    return tally


def shrink(name: str, prop: str, tag: str, seed_value: int, examples: int, databases: differential.Databases,
           orders: tuple[str, ...] = ()):
    """A small case of ``name`` breaking ``prop`` with ``tag``, as Hypothesis shrinks it (or None)."""
    @seed(seed_value)
    @settings(max_examples=examples, deadline=None, database=None, suppress_health_check=list(HealthCheck),
              phases=[Phase.generate, Phase.shrink], report_multiple_bugs=False)
    @given(case=FAMILIES[name]())
    def breaks(case):
        found = differential.violations(case, databases=databases, orders=orders if prop == "order" else ())
        assert not any(v.prop == prop and v.tag == tag for v in found), case

    try:
        breaks()
    except AssertionError as failure:
        return failure.args[0] if failure.args else None
    return None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--examples", type=int, default=2000, help="cases in all, spread over the families")
    parser.add_argument("--family", action="append", choices=sorted(FAMILIES), help="only these (repeatable)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--shrink", action="store_true", help="shrink each mechanism's first case")
    parser.add_argument("--orders", choices=["identity", "all", "none"], default="identity",
                        help="which families' cases are also stored reversed and shuffled (default: identity ones)")
    args = parser.parse_args()
    sys.stdout.reconfigure(line_buffering=True)  # figures as they come, also into a file
    families = args.family or list(FAMILIES)
    each = max(args.examples // len(families), 1)
    print(f"bench_fuzz {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC, {platform.node()}, "
          f"python {platform.python_version()}; {each} examples per family, seed {args.seed}, "
          f"storage-order property on {args.orders} families")
    total_cases, total_seconds, broken = 0, 0.0, 0
    databases = differential.Databases()
    for name in families:
        started = time.perf_counter()
        ordered = args.orders == "all" or (args.orders == "identity" and name in ORDER_FAMILIES)
        orders = differential.ORDERS[1:] if ordered else ()
        tally = run_family(name, each, args.seed, databases, orders)
        wall = time.perf_counter() - started
        total_cases += tally.cases
        total_seconds += wall
        failing = sum(tally.tags.values())
        broken += bool(failing)
        per_case = tally.seconds / tally.cases if tally.cases else 0.0
        print(f"\n== {name}: {tally.cases} cases in {wall:.1f} s ({per_case * 1000:.0f} ms a case); "
              f"outcomes {dict(tally.outcomes.most_common())}; storage {dict(tally.storages.most_common())}"
              + ("; storage order checked" if orders else ""))
        for message, count in tally.crashes.most_common():
            print(f"   harness crash x{count}: {message}")
        if not tally.tags:
            print("   every property held")
        for (prop, tag), count in tally.tags.most_common():
            case, violation = tally.first[(prop, tag)]
            print(f"   ({prop}) {tag}: {count} of {tally.cases} cases")
            print(f"      e.g. {violation.detail[:300]}")
            print("      " + case.reproduction().replace("\n", "\n      "))
            if args.shrink:
                small = shrink(name, prop, tag, args.seed, max(each, 200), databases, orders)
                if small is not None:
                    print("      shrunk:\n      " + small.reproduction().replace("\n", "\n      "))
    databases.close()
    print(f"\n{total_cases} cases in {total_seconds:.0f} s ({total_cases / max(total_seconds, 1e-9):.1f} a second); "
          f"{broken} of {len(families)} families broke a property")


if __name__ == "__main__":
    main()
