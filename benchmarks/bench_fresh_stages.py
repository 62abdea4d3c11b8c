"""Where a fresh query text's milliseconds go (issue 38 item 2): ``db.sql`` per stage.

    python benchmarks/bench_fresh_stages.py                    # 1,000 rows, every query class
    python benchmarks/bench_fresh_stages.py --rows 1000000 --repeats 10
    python benchmarks/bench_fresh_stages.py --classes COUNT AVG --json out.json
    python benchmarks/bench_fresh_stages.py --before /tmp/before --rounds 2   # before -> after, one run

It runs bench_speed.py's query classes (bench_speed_queries.CLASSES) on bench_scale.py's shop
data and policy with a **new query text and a new epsilon every run** (the filter's constant
changes, so neither a cache keyed by text nor the ledger's free repeats serve it) against a
ledger on disk (so the charge's fsync is in the figure, as in bench_speed.py), and times each
stage by wrapping the function that does it (``STAGES``). A stage's time is exclusive: a
wrapped function called inside another is counted to its own stage only. ``other`` is the end
to end time less every stage: the glue between them.

The wrappers cost about a microsecond per call; the end-to-end median is also measured
unwrapped, in the same process, beside the wrapped one. Medians over ``--repeats`` runs per
class, after two warm-up runs (the first builds the bounded copy).

``--before PATH`` measures an older checkout too (``PYTHONPATH=PATH``; ``git archive`` of a
commit's ``dpsql`` and ``grammar`` is enough), each side in its own process, the sides
alternated ``--rounds`` times so a burst of load hits both; each cell is the least of the
rounds' medians, printed as before → after.
"""

from __future__ import annotations

import argparse
import functools
import importlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from fractions import Fraction
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from bench_scale import POLICY_USER, cache_dir, ensure_data, no_time_limit  # noqa: E402
from bench_speed_queries import CLASSES, SMALL_TARGET, constants  # noqa: E402

# (module, attribute path, stage): each is wrapped where it is looked up at run time.
STAGES: list[tuple[str, str, str]] = [
    ("dpsql.query.prepare", "parse", "parse"),
    ("dpsql.query.prepare", "check_query", "bind + check"),
    ("dpsql.query.prepare", "apply_contribution_options", "bind + check"),
    ("dpsql.backends.duckdb", "Engine.check", "bind + check"),
    ("dpsql.query.prepare", "analyse_query", "analyse"),
    ("dpsql.query.prepare", "rewrite_statement", "rewrite + render"),
    ("dpsql.query.prepare", "separate_statement", "rewrite + render"),
    ("dpsql.query.prepare", "bias_statement", "rewrite + render"),
    ("dpsql.query.prepare", "key_types_statement", "rewrite + render"),
    ("dpsql.query.prepare", "Preparer._repeat_key", "normalise + repeat key"),
    ("dpsql.backends.duckdb", "Engine.describe", "DuckDB bind (describe)"),
    ("dpsql.backends.duckdb", "Engine.fetch", "DuckDB execute"),
    ("dpsql.budget.ledger", "Ledger.find_answer", "ledger: repeat lookup"),
    ("dpsql.budget.ledger", "Ledger.charge", "ledger: charge (fsync)"),
    ("dpsql.budget.ledger", "Ledger.record_answer", "ledger: record answer"),
    ("dpsql.budget.ledger", "Ledger.tally", "ledger: budget tally"),
    ("dpsql.query.answering", "release_measures", "noise"),
    ("dpsql.query.answering", "Answerer.read_keys", "read keys"),
    ("dpsql.backends.duckdb.released", "ReleasedDatabase.post_process", "post-process"),
    ("dpsql.query.answering", "Answerer._intervals", "result building"),
    ("dpsql.query.answering", "Answerer._described", "result building"),
    ("dpsql.query.answering", "outside_domain", "result building"),
    ("dpsql.query.answering", "Answerer.limits", "result building"),
    ("dpsql.query.answering", "encode_answer", "result building"),
]
ORDER = ["parse", "bind + check", "analyse", "rewrite + render", "DuckDB bind (describe)", "normalise + repeat key",
         "ledger: repeat lookup", "ledger: charge (fsync)", "DuckDB execute", "read keys", "noise", "post-process",
         "ledger: record answer", "result building", "ledger: budget tally", "other"]


NOW = time.perf_counter
"""The clock every figure is read on: wall time, or with ``--cpu`` the process's CPU time (its
threads' too: DuckDB's workers), which a loaded machine inflates far less (a disk wait, such as
the charge's fsync, then counts only its CPU)."""


class Clock:
    """Exclusive time per stage: a stack of running stages, each paused while a child runs."""

    def __init__(self) -> None:
        self.spent: dict[str, float] = defaultdict(float)
        self._stack: list[list] = []  # [stage, started, child time]

    def wrap(self, function, stage: str):
        @functools.wraps(function)
        def timed(*args, **kwargs):
            self._stack.append([stage, NOW(), 0.0])
            try:
                return function(*args, **kwargs)
            finally:
                name, started, children = self._stack.pop()
                took = NOW() - started
                self.spent[name] += took - children
                if self._stack:
                    self._stack[-1][2] += took
        return timed


def instrument(clock: Clock) -> list[str]:
    """Wrap every ``STAGES`` entry; returns those not found (the code moved: say so, don't fail)."""
    missing = []
    for module_name, path, stage in STAGES:
        try:
            owner = importlib.import_module(module_name)
            *outer, attribute = path.split(".")
            for part in outer:
                owner = getattr(owner, part)
            original = owner.__dict__[attribute] if isinstance(owner, type) else getattr(owner, attribute)
        except (ImportError, AttributeError, KeyError):
            missing.append(f"{module_name}.{path}")
            continue
        setattr(owner, attribute, clock.wrap(original, stage))
    return missing


def measure(rows: int, names: list[str], repeats: int, cache: Path) -> dict:
    import dpsql

    db_path = ensure_data(rows, cache)
    ledger = Path(tempfile.mkdtemp(prefix="dpsql-fresh-stages-")) / "bench.ledger"
    db = dpsql.connect(str(db_path), policy=POLICY_USER, ledger=str(ledger), **no_time_limit())
    k, epsilons = constants(), iter(range(10**9))

    def answer(name: str) -> None:
        spec = CLASSES[name]
        epsilon = Fraction(10**6 + next(epsilons), 10**6)
        result = db.sql(spec["sql"].format(k=next(k)), epsilon=epsilon, delta=spec.get("delta"))
        if getattr(result, "repeat", False):
            raise RuntimeError("answered as a free repeat")

    def timed(name: str) -> float:
        start = NOW()
        answer(name)
        return NOW() - start

    plain: dict[str, float] = {}
    for name in names:
        answer(name)
        answer(name)
        plain[name] = statistics.median(timed(name) for _ in range(repeats))
    clock = Clock()
    missing = instrument(clock)
    out: dict = {"rows": rows, "missing": missing, "classes": {}}
    for name in names:
        answer(name)
        runs = []
        for _ in range(repeats):
            clock.spent.clear()
            total = timed(name)
            stages = dict(clock.spent)
            stages["other"] = total - sum(stages.values())
            runs.append((total, stages))
        out["classes"][name] = {
            "plain": plain[name],
            "total": statistics.median(total for total, _ in runs),
            "stages": {stage: statistics.median(s.get(stage, 0.0) for _, s in runs) for stage in ORDER},
            "least": {stage: min(s.get(stage, 0.0) for _, s in runs) for stage in ORDER},
        }
    db.close()
    return out


def markdown(result: dict) -> str:
    names = list(result["classes"])
    lines = [f"{result['rows']:,} rows, median ms per stage of a fresh text (target: "
             f"{SMALL_TARGET * 1000:.0f} ms end to end at 1,000 rows); in brackets the least of the runs", "",
             "| stage | " + " | ".join(names) + " |", "|---|" + "---:|" * len(names)]
    for stage in ORDER:
        cells = [(result["classes"][n]["stages"][stage] * 1000, result["classes"][n]["least"][stage] * 1000)
                 for n in names]
        lines.append(f"| {stage} | " + " | ".join(f"{c:.2f} ({least:.2f})" for c, least in cells) + " |")
    for label, field in (("**total (wrapped)**", "total"), ("**total (unwrapped)**", "plain")):
        lines.append(f"| {label} | " + " | ".join(f"**{result['classes'][n][field] * 1000:.2f}**" for n in names)
                     + " |")
    if result["missing"]:
        lines += ["", "not wrapped (moved?): " + ", ".join(result["missing"])]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1000)
    parser.add_argument("--classes", nargs="+", default=list(CLASSES), choices=list(CLASSES))
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--cache", default=None, help="where bench_scale.py's DuckDB files live")
    parser.add_argument("--json", default=None, help="also write the raw medians here")
    parser.add_argument("--cpu", action="store_true", help="CPU time of the process instead of wall time")
    parser.add_argument("--before", default=None, help="an older checkout: before -> after columns")
    parser.add_argument("--rounds", type=int, default=1, help="with --before: processes per side, alternated")
    args = parser.parse_args()
    if args.cpu:
        global NOW
        NOW = time.process_time
    if args.before:
        return compare(args)
    result = measure(args.rows, args.classes, args.repeats, cache_dir(args.cache))
    import dpsql

    print(f"dpsql from {Path(dpsql.__file__).parent}\n")
    print(markdown(result))
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1))


def compare(args) -> None:
    """Each side in its own process, alternated; each cell the least median of its rounds."""
    sides = {"before": Path(args.before).resolve(), "after": HERE.parent}
    runs: dict[str, list[dict]] = {side: [] for side in sides}
    for _ in range(args.rounds):
        for side, root in sides.items():
            out = Path(tempfile.mkdtemp(prefix="dpsql-fresh-stages-")) / f"{side}.json"
            command = [sys.executable, str(Path(__file__).resolve()), "--rows", str(args.rows), "--repeats",
                       str(args.repeats), "--json", str(out), "--classes", *args.classes]
            if args.cache:
                command += ["--cache", args.cache]
            if args.cpu:
                command.append("--cpu")
            subprocess.run(command, check=True, capture_output=True, cwd=str(root),
                           env=dict(os.environ, PYTHONPATH=str(root)))
            runs[side].append(json.loads(out.read_text()))
    best = {side: {name: {"stages": {stage: min(r["classes"][name]["stages"][stage] for r in found)
                                     for stage in ORDER},
                          "plain": min(r["classes"][name]["plain"] for r in found)}
                   for name in args.classes} for side, found in runs.items()}
    clock = "CPU ms" if args.cpu else "ms"
    print(f"{args.rows:,} rows, {clock} per stage of a fresh text, before → after (least of {args.rounds} "
          f"processes' medians of {args.repeats} runs per side; before = {sides['before']})\n")
    print("| stage | " + " | ".join(args.classes) + " |")
    print("|---|" + "---:|" * len(args.classes))
    for stage in ORDER:
        print(f"| {stage} | " + " | ".join(f"{best['before'][n]['stages'][stage] * 1000:.2f} → "
                                            f"{best['after'][n]['stages'][stage] * 1000:.2f}"
                                            for n in args.classes) + " |")
    print("| **total (the stages summed)** | " + " | ".join(
        f"**{sum(best['before'][n]['stages'].values()) * 1000:.2f} → "
        f"{sum(best['after'][n]['stages'].values()) * 1000:.2f}**" for n in args.classes) + " |")
    print("| **end to end (unwrapped)** | " + " | ".join(
        f"**{best['before'][n]['plain'] * 1000:.2f} → {best['after'][n]['plain'] * 1000:.2f}**"
        for n in args.classes) + f" |\n\ntarget: {SMALL_TARGET * 1000:.0f} ms end to end at 1,000 rows")


if __name__ == "__main__":
    main()
