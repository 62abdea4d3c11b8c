"""bench_speed.py's Markdown report: each figure beside its target, before and after columns."""

from __future__ import annotations

import shlex
import statistics
import subprocess
from pathlib import Path

from bench_scale import machine_line
from bench_speed_queries import (
    CLASSES,
    COPY_TARGET,
    GROUPED_TARGET,
    HAND_BOUNDS,
    MAX_GROUPS,
    MAX_ROWS,
    SERVE_TARGET,
    SMALL_TARGET,
)


def version_of(root: Path) -> str:
    """``git describe``-like: the short commit of ``root``, ``+uncommitted`` if its dpsql/ changed."""
    def git(*words: str) -> str:
        return subprocess.run(["git", "-C", str(root), *words], capture_output=True, text=True).stdout.strip()

    head = git("rev-parse", "--short", "HEAD")
    if not head:
        return "a commit unknown (not a git checkout)"
    return head + ("+uncommitted" if git("status", "--porcelain", "--untracked-files=no", "dpsql")
                                  else "")



def median(entry: dict | None, key: str) -> float | None:
    cell = (entry or {}).get(key)
    return cell.get("median") if isinstance(cell, dict) else None


def results_of(result: dict | None) -> dict:
    return (result or {}).get("results", {}) if isinstance(result, dict) else {}


def target_for(rows: int, raw: float | None) -> float | None:
    if rows <= 1_000:
        return SMALL_TARGET
    return None if raw is None else max(2 * raw, raw + 0.005)


def verdict(value: float | None, limit: float | None) -> str:
    if value is None or limit is None:
        return "—"
    return "met" if value <= limit else f"**missed** ({value / limit:.1f}× the target)"


def ms(seconds: float | None) -> str:
    return "—" if seconds is None else f"{seconds * 1000:.1f} ms" if seconds < 10 else f"{seconds:.1f} s"


def failure(result: dict | None) -> str | None:
    if not isinstance(result, dict):
        return "not run"
    return result.get("error")


def speed_table(rows: int, size: dict, sides: list[str], args) -> list[str]:
    raw = results_of(size.get("raw"))
    after = sides[-1]
    head = ["class", "raw DuckDB"] + [f"dpsql {side}" for side in sides] + \
        [f"{after} / raw", "target", "met?", "prepare (new text)", "bounded statement alone", "rest"]
    lines = ["| " + " | ".join(head) + " |", "|---|" + "---:|" * (len(head) - 1)]
    for name in args.classes:
        raw_time = median(raw.get(name), "raw")
        cells = [name, ms(raw_time)]
        for side in sides:
            result = size.get(side, {}).get("speed")
            entry = results_of(result).get(name, {})
            problem = failure(result) or entry.get("error")
            total = median(entry, "total")
            cells.append(f"failed: {problem[:80]}" if problem else
                         ms(total) + (" (0 rows)" if entry.get("rows") == 0 else ""))
        entry = results_of(size.get(after, {}).get("speed")).get(name, {})
        total = median(entry, "total")
        limit = target_for(rows, raw_time)
        prepare, bounded = median(entry, "prepare"), median(entry, "bounded")
        rest = total - prepare - bounded if None not in (total, prepare, bounded) else None
        cells += [f"{total / raw_time:.1f}×" if total and raw_time else "—", ms(limit), verdict(total, limit),
                  ms(prepare), ms(bounded) + (f" ({entry['statements']} statements)" if entry.get("statements", 1) > 1
                                              else ""), ms(rest) if rest is None or rest >= 0 else "≈ 0 (noise)"]
        if "split_error" in entry:
            cells[-3:] = [f"internals unavailable: {entry['split_error'][:60]}", "", ""]
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def grouped_table(rows: int, size: dict, sides: list[str]) -> list[str]:
    raw = results_of(size.get("raw"))
    head = ["class", "raw DuckDB", "q-floor (raw table)", "hand-written bound"] + \
        [f"dpsql {side} / bound" for side in sides] + ["target", "met?", f"{sides[-1]}: bounded alone / bound"]
    lines = ["| " + " | ".join(head) + " |", "|---|" + "---:|" * (len(head) - 1)]
    for name in HAND_BOUNDS:
        if name not in raw:
            continue
        hand = median(raw[name], "hand")
        cells = [name, ms(median(raw[name], "raw")), ms(median(raw[name], "q_floor")), ms(hand)]
        ratio = None
        for side in sides:
            total = median(results_of(size.get(side, {}).get("speed")).get(name), "total")
            ratio = total / hand if total and hand else None
            cells.append("—" if ratio is None else f"{ratio:.2f}×")
        cells += [f"{GROUPED_TARGET}×", verdict(ratio, GROUPED_TARGET) if rows >= 1_000_000 else "— (from 1M rows)"]
        bounded = median(results_of(size.get(sides[-1], {}).get("speed")).get(name), "bounded")
        cells.append(f"{bounded / hand:.2f}×" if bounded and hand else "—")
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def first_table(rows: int, size: dict, sides: list[str]) -> list[str]:
    raw = results_of(size.get("raw"))
    plain = median(raw, "copy")
    lines = [f"Plain copy `CREATE TABLE AS SELECT * FROM visits` into an in-memory database: {ms(plain)} "
             f"(median of 3); the hand-written bounds' window-capped copy: {ms(median(raw, 'capped_copy'))}.", "",
             "| dpsql | copy build | / plain copy | target | met? | fresh process: import | connect | first query "
             "(builds the copy) | import to first answer |",
             "|---|---:|---:|---:|---|---:|---:|---:|---:|"]
    for side in sides:
        builds = [results_of(r) for r in size.get(side, {}).get("build", []) if "results" in r]
        firsts = [results_of(r) for r in size.get(side, {}).get("first", []) if "results" in r]
        errors = [failure(r) for r in size.get(side, {}).get("build", []) + size.get(side, {}).get("first", [])
                  if failure(r)]
        build = statistics.median(b["build"] for b in builds) if builds else None

        def first(key: str) -> str:
            return ms(statistics.median(f[key] for f in firsts)) if firsts else "—"

        cells = [side, ms(build), f"{build / plain:.1f}×" if build and plain else "—", f"{COPY_TARGET}×",
                 verdict(build, plain * COPY_TARGET if plain else None) if rows >= 1_000_000 else "— (from 1M rows)",
                 first("import"), first("connect"),
                 first("first_query"), first("total")]
        lines.append("| " + " | ".join(cells) + " |")
        if errors:
            lines.append(f"| {side}: failed | {errors[0][:120]} | | | | | | | |")
    runs = max((len(size.get(side, {}).get("build", [])) for side in sides), default=0)
    lines += ["", f"Medians of {runs} fresh processes per side, alternated."]
    return lines


def memory_table(rows: int, memory: dict, sides: list[str], builds: dict) -> list[str]:
    """Peaks, and each query's rise over its own process opened but idle (dpsql's imports,
    pandas and sqlglot among them, cost the same whatever the data): the target compares rises."""
    after = sides[-1]
    idle = {system: results_of(memory.get("idle", {}).get(system)).get("peak_rss_mb") for system in ["raw", *sides]}
    head = ["query", "raw DuckDB peak RSS", "raw: rise over idle"] + [f"dpsql {side} peak RSS" for side in sides] + \
        [f"dpsql {after}: rise over idle", "copy in memory", f"met? ({after} rise ≤ raw rise + copy)"]
    lines = ["| " + " | ".join(head) + " |", "|---|" + "---:|" * (len(head) - 1)]
    for name, by_system in memory.items():
        raw = results_of(by_system.get("raw")).get("peak_rss_mb")
        label = {"idle": "(opened, no query)", "build": "(copy built, no query; raw: a plain in-memory copy)"}
        cells = [label.get(name, name), mb(raw), rise(raw, idle["raw"], name)]
        for side in sides:
            result = by_system.get(side)
            peak = results_of(result).get("peak_rss_mb")
            cells.append(mb(peak) if peak is not None else f"failed: {(failure(result) or '')[:60]}")
        peak = results_of(by_system.get(after)).get("peak_rss_mb")
        copy = results_of(by_system.get(after)).get("copy_bytes")
        copy_mb = copy / 2**20 if copy is not None else None
        ok = None
        if name in CLASSES and None not in (raw, peak, idle["raw"], idle[after]):
            ok = peak - idle[after] <= raw - idle["raw"] + (copy_mb or 0)
        cells += [rise(peak, idle[after], name), mb(copy_mb), "—" if ok is None else "met" if ok else "**missed**"]
        lines.append("| " + " | ".join(cells) + " |")
    built = [results_of(r) for r in builds.get(after, {}).get("build", []) if "results" in r]
    if built and built[0].get("copy_rows"):
        b = built[0]
        lines += ["", f"The bounded copy ({', '.join(b['copy_tables'])}) holds {b['copy_rows']:,} of the "
                      f"{rows:,} rows in {mb(b['copy_bytes'] / 2**20)} of DuckDB memory "
                      f"(`duckdb_memory()`, in-memory tables, after less before the build): "
                      f"{b['copy_bytes'] / b['copy_rows']:.0f} bytes per copied row, "
                      f"{b['copy_bytes'] / rows:.0f} bytes per source row."]
    return lines


def rise(peak: float | None, idle: float | None, name: str) -> str:
    return "—" if name == "idle" or None in (peak, idle) else mb(peak - idle)


def mb(value: float | None) -> str:
    return "—" if value is None else f"{value:,.0f} MB" if abs(value) >= 10 else f"{value:.2f} MB"


def serve_section(serve: dict, sides: list[str]) -> list[str]:
    lines = ["| rows | dpsql | throughput | p50 | p99 | target (small: ≥ 500 queries/s, p99 < 50 ms) |",
             "|---|---|---:|---:|---:|---|"]
    for rows, by_side in serve.items():
        for side in sides:
            result = by_side.get(side, {})
            served = result.get("served")
            if served is None:
                lines.append(f"| {int(rows):,} | {side} | {(result.get('error') or 'table not found')[:100]} | | | |")
                continue
            met = "—" if int(rows) > 1_000 else serve_verdict(served)
            lines.append(f"| {int(rows):,} | {side} | {served['throughput']:.1f} queries/s | {ms(served['p50'])} | "
                         f"{ms(served['p99'])} | {met} |")
    lines.append("")
    for rows, by_side in serve.items():
        for side in sides:
            text = by_side.get(side, {}).get("markdown")
            if text:
                lines += [f"bench_serve.py, {int(rows):,} rows, dpsql {side} "
                          f"(`{shlex.join(by_side[side]['command'][1:])}`):", "",
                          text.replace("### ", "#### "), ""]
    return lines


def serve_verdict(served: dict) -> str:
    throughput, p99 = SERVE_TARGET
    if served["throughput"] >= throughput and served["p99"] < p99:
        return "met"
    return f"**missed** ({served['throughput'] / throughput:.2f}× the throughput, p99 {ms(served['p99'])})"


def report(results: dict, sides: dict[str, Path], args) -> str:
    names = list(sides)
    versions = "; ".join(f"{side}: {path} at {version_of(path)}" for side, path in sides.items())
    lines = ["## Speed against plain DuckDB (issue 26)", "",
             f"Machine: {machine_line()}.", "",
             f"Command: `{shlex.join(['python', 'benchmarks/bench_speed.py', *args.argv])}`; dpsql {versions}.", "",
             f"Medians of {args.repeats} timed runs after a warm-up, each run a new query text (the filter "
             "constant `k` in `amount < k`, 590 ≤ k < 600, changes every run) and a new epsilon, so neither a "
             "cached plan nor a stored answer serves it; every system in its own process per size. dpsql is "
             "`db.sql` end to end, after its first query (the bounded copy built). Split of the after time: "
             "prepare = `db._prepare` of a new text (parse to rendered bounded statement); bounded statement "
             "alone = its statement(s) on a DuckDB cursor; rest = total − both (noise, release, ledger, "
             "dpsql's fetch wrapper). Targets: 5 ms end to end at 1,000 rows; max(2× raw, raw + 5 ms) from "
             "1M rows (the issue sets it at 10M).", ""]
    for rows, size in results["sizes"].items():
        rows = int(rows)
        lines += [f"### {rows:,} rows", "", *speed_table(rows, size, names, args), ""]
        if any(name in results_of(size.get("raw")) for name in HAND_BOUNDS):
            lines += ["Grouped queries against their hand-written bound (per (unit, group), at most "
                      f"{MAX_GROUPS} groups per unit by a hash, clamped, per group; over a copy capped at "
                      f"{MAX_ROWS} rows per unit, as dpsql's is; new text each run); q-floor: per (unit, group) "
                      "then per group on the raw table, with no limits (bench_scale.py's):", "",
                      *grouped_table(rows, size, names), ""]
        lines += ["First queries:", "", *first_table(rows, size, names), ""]
    for rows, memory in results.get("memory", {}).items():
        lines += [f"### Peak memory, {int(rows):,} rows", "",
                  "Each cell a fresh process (`ru_maxrss` after one query); the copy's size is DuckDB's "
                  "`duckdb_memory()` for in-memory tables once the query ran.", "",
                  *memory_table(int(rows), memory, names, results["sizes"].get(rows, {})), ""]
    if results.get("serve"):
        lines += [f"### Server: {args.serve_clients} clients (bench_serve.py)", "",
                  *serve_section(results["serve"], names)]
    return "\n".join(lines)
