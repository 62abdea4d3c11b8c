"""Where a grouped statement's time goes beyond its hand-written bound (issue 38, item 2).

    python benchmarks/bench_grouped_parts.py                  # 1M rows, CPU time, 9 rounds
    python benchmarks/bench_grouped_parts.py --rows 1000 --wall

For bench_speed.py's grouped classes it renders dpsql's bounded statement (bench_scale.py's shop
data and per-unit policy), then runs, on dpsql's own DuckDB connection with its bounded copy
filled, that statement, the hand-written bound (bench_speed_queries.HAND_BOUNDS, over the
window-capped copy it builds) and the statement with one of its parts taken out at a time
(``PARTS``). The variants are for measurement only: each drops something the bound needs (the
domain test, the canonical key bytes, the salted order, the total comparison), so the difference
is what that part costs; none of them is a correct rewrite. The runs are interleaved (round
robin), timed by the process's CPU time (DuckDB's threads included) unless ``--wall``, which a
loaded machine inflates far less than the wall clock; the table gives the median and the least.
"""

from __future__ import annotations

import argparse
import re
import statistics
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from bench_scale import POLICY_USER, cache_dir, ensure_data, no_time_limit  # noqa: E402
from bench_speed_queries import CAPPED, CLASSES, HAND_BOUNDS  # noqa: E402

K = "595.5"
SALT = {"salt": "00" * 32}


def _no_domain(sql: str) -> str:
    return re.sub(r"CASE WHEN g0 IN \(SELECT k0 FROM .*? IS NULL\)\) THEN g0 END AS g0", "g0", sql)


def _no_canonical_bytes(sql: str) -> str:
    return re.sub(r'ENCODE\(CAST\(("?\w+"?) AS TEXT\)\)', r"\1", sql)


def _plain_hash(sql: str) -> str:
    return re.sub(r"HASH\(XOR\(HASH\(XOR\(HASH\(\$salt\), HASH\(dp_unit\)\)\), HASH\(g0\)\)\), g0", "HASH(dp_unit, g0)",
                  sql)


def _plain_filter(sql: str) -> str:
    return sql.replace(f'COALESCE(TRY("amount" < {K}), FALSE)', f'"amount" < {K}')


PARTS = {
    "without the public-domain test": _no_domain,
    "without the canonical key bytes (ENCODE)": _no_canonical_bytes,
    "with an unsalted hash(unit, key) order": _plain_hash,
    "without TRY around the filter": _plain_filter,
}
"""A part of the statement and the statement without it (for measurement only)."""


def measure(rows: int, rounds: int, wall: bool) -> dict:
    import dpsql

    path = ensure_data(rows, cache_dir())
    ledger = Path(tempfile.mkdtemp(prefix="dpsql-grouped-parts-")) / "bench.ledger"
    db = dpsql.connect(str(path), policy=POLICY_USER, ledger=str(ledger), **no_time_limit())
    db._engine.build_bounding()
    connection = db._engine._connection
    connection.execute("ATTACH ':memory:' AS scratch (READ_WRITE)")  # the hand-written bounds' capped copy
    connection.execute(CAPPED)
    clock = time.perf_counter if wall else time.process_time
    out: dict = {}
    for name in HAND_BOUNDS:
        spec = CLASSES[name]
        sql = db._prepare(spec["sql"].format(k=K), 1, spec.get("delta"), None, None, None).priced.bounded.sql
        variants = {"dpsql's bounded statement": sql, "hand-written bound": HAND_BOUNDS[name].format(k=K)}
        for part, without in PARTS.items():
            changed = without(sql)
            if changed != sql:  # a part this statement does not have is left out of its table
                variants[part] = changed
        cursor = connection.cursor()

        def run(text: str) -> float:
            start = clock()
            cursor.execute(text, SALT if "$salt" in text else {}).fetchall()
            return clock() - start

        for text in variants.values():
            run(text)
        times: dict[str, list[float]] = {label: [] for label in variants}
        for _ in range(rounds):
            for label, text in variants.items():
                times[label].append(run(text))
        cursor.close()
        out[name] = {label: (statistics.median(found), min(found)) for label, found in times.items()}
    db.close()
    return out


def markdown(rows: int, results: dict, wall: bool) -> str:
    clock = "wall" if wall else "CPU"
    lines = []
    for name, found in results.items():
        hand = found["hand-written bound"][0]
        statement = found["dpsql's bounded statement"][0]
        lines += [f"{name}, {rows:,} rows ({clock} ms, median and least of the rounds; target 1.2× the bound)", "",
                  "| statement | median | least | / hand-written bound | part's share of dpsql's |",
                  "|---|---:|---:|---:|---:|"]
        for label, (median, least) in found.items():
            share = "" if label in ("hand-written bound", "dpsql's bounded statement") else \
                f"{(statement - median) / statement:.0%}"
            lines.append(f"| {label} | {median * 1000:.1f} | {least * 1000:.1f} | {median / hand:.2f}× | {share} |")
        lines.append("")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--wall", action="store_true", help="wall time instead of the process's CPU time")
    args = parser.parse_args()
    print(markdown(args.rows, measure(args.rows, args.rounds, args.wall), args.wall))


if __name__ == "__main__":
    main()
