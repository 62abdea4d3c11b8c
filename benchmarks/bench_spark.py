"""Spark benchmark: dpsql on Spark against dpsql on DuckDB and Tumult Analytics, on the same data.

Run (``make bench-spark`` runs the first line)::

    .venv/bin/python benchmarks/bench_spark.py                        # 10M and 100M rows, every engine
    .venv/bin/python benchmarks/bench_spark.py --rows 10000000 --engines dpsql-duckdb tumult
    .venv/bin/python benchmarks/bench_spark.py --rows 10000000 --cluster --engines dpsql-spark

**Data.** The shop data of ``bench_scale.py`` (its generator, imported: about one user per ten
rows, user ids ``floor(users * u^3)``, so a few users have many thousands of rows; 50 public
stores; ~5,000 zip codes), as a DuckDB file (``--duckdb-cache``, default ``/work/bench-cache``,
named as bench_scale names it, so its files are reused) and as Parquet written from that file
(``--cache``, default ``/work/bench-cache/spark``): the same rows for every engine. Both are made
once and reused. The exact answers (plain DuckDB, no bounds, no noise) are cached beside them.

**Engines**, each in its own process tree (one after another, never side by side):

* ``dpsql-duckdb``: ``dpsql.connect(<DuckDB file>, policy=POLICY_USER of bench_scale)``;
* ``dpsql-spark``: a ``local[2]`` session (``dpsql.backends.spark.session.local_session``), temp
  views over the Parquet files, ``dpsql.connect(session, policy=...)``;
* ``tumult``: Tumult Analytics (``tmlt-analytics``, its own venv ``--tumult-venv``, made on first
  use; it needs pyspark 3.x) on the same Parquet files in a ``local[2]`` session with the same
  Spark settings, run by ``benchmarks/tumult_peer.py``;
* ``--cluster`` adds ``dpsql-spark-cluster``: the dpsql-on-Spark leg against a standalone master
  and two one-core workers started on this machine from pyspark's own ``spark-class`` (stopped
  afterwards), at the first size only.

**Queries** (``CLASSES``), each at total epsilon 1 (private keys: delta 1e-6 too), one user's rows
bounded to 10: COUNT, SUM(amount) clamped to [0, 500], AVG(amount) likewise, COUNT GROUP BY store
(50 public keys; Tumult gets them as a KeySet), COUNT GROUP BY zip (private keys: dpsql selects
them by partition selection; Tumult with ``get_groups`` at (0.5, 1e-6) and then the count at 0.5).

**Measured**, per engine and class: the median (min–max) of ``--repeats`` (3) runs after a first
one (``--repeats 0``: that one run, for an engine too slow for more); the first query's time
from process start (imports, session start, and everything a fresh connection builds once:
dpsql's bounded copy); the peak RSS summed over the engine's process
tree sampled from /proc every 0.25 s (the JVM included; with ``--cluster`` the master, the workers
and their executors too); and the error of every released answer against the exact one: absolute
(grouped: mean over the exact answer's keys, a key not released counting as 0) and relative. A run
is stopped after ``--timeout`` seconds (20 min) and reported as a timeout; a query an engine
refuses shows its error instead of a time; an engine that cannot start at all (no Spark backend,
no Java) shows "not available: <error>" and the run goes on. Output: one Markdown section per
size on stdout (and appended to ``--out`` as each size ends), the raw numbers as JSON in the
cache, rewritten after each engine so that a stopped run keeps what it measured.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import queue
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from fractions import Fraction
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))

import bench_scale  # noqa: E402  (stdlib only at import time: safe under any python)

SIZES = [10_000_000, 100_000_000]
ENGINES = ["dpsql-duckdb", "dpsql-spark", "tumult"]
CLUSTER_ENGINE = "dpsql-spark-cluster"
TUMULT_REQUIREMENT = "tmlt-analytics==0.21.0"  # needs pyspark >=3.4,<3.6: hence its own venv
DELTA = Fraction(1, 10**6)

# class -> dpsql SQL (also the exact answer's SQL on DuckDB) and delta.
CLASSES: dict[str, dict] = {
    "COUNT": {"sql": "SELECT COUNT(*) AS n FROM visits"},
    "SUM": {"sql": "SELECT SUM(amount) AS s FROM visits"},
    "AVG": {"sql": "SELECT AVG(amount) AS a FROM visits"},
    "GROUP BY public": {"sql": "SELECT store, COUNT(*) AS n FROM visits GROUP BY store"},
    "GROUP BY private": {"sql": "SELECT zip, COUNT(*) AS n FROM visits GROUP BY zip", "delta": DELTA},
}
RUN_ORDER = ["COUNT", "SUM", "GROUP BY public", "GROUP BY private", "AVG"]
"""Classes run in this order (AVG last: Tumult's was the slowest at 1M rows, so a timeout there
costs the others nothing); the tables keep CLASSES' order."""
LABELS = {"GROUP BY public": "GROUP BY public (50 stores)", "GROUP BY private": "GROUP BY private (~5000 zips)"}


# -- data -------------------------------------------------------------------------------------

def ensure_data(rows: int, duckdb_cache: Path, cache: Path) -> tuple[Path, Path]:
    """(DuckDB file, Parquet directory holding visits.parquet and stores.parquet) for ``rows``."""
    import duckdb

    db = bench_scale.ensure_data(rows, duckdb_cache)
    parquet = cache / f"shop_{rows}.parquet"
    if not (parquet / "visits.parquet").exists():
        start = time.perf_counter()
        partial = cache / f"shop_{rows}.parquet.partial"
        partial.mkdir(parents=True, exist_ok=True)
        con = duckdb.connect(str(db), read_only=True)
        con.execute("SET enable_progress_bar = false")
        for table in ("stores", "visits"):
            con.execute(f"COPY {table} TO '{partial / (table + '.parquet')}' (FORMAT parquet, ROW_GROUP_SIZE 1000000)")
        con.close()
        partial.rename(parquet)
        print(f"# wrote {parquet} in {time.perf_counter() - start:.1f} s", file=sys.stderr, flush=True)
    return db, parquet


def exact_answers(db: Path, cache: Path) -> dict:
    """class -> {key: value} of the plain query on DuckDB (key "" for an ungrouped one); cached."""
    import duckdb

    path = cache / f"exact_{db.stem}.json"
    if path.exists():
        return json.loads(path.read_text())
    con = duckdb.connect(str(db), read_only=True)
    con.execute("SET enable_progress_bar = false")
    answers = {name: answer_of(con.execute(q["sql"]).fetchall()) for name, q in CLASSES.items()}
    con.close()
    path.write_text(json.dumps(answers))
    return answers


def answer_of(rows) -> dict[str, float | None]:
    """Rows (key..., value) or (value,) as {key: value}; the key of an ungrouped answer is ""."""
    return {("" if len(row) == 1 else str(row[0])): (None if row[-1] is None else float(row[-1])) for row in rows}


def error_of(answer: dict, exact: dict) -> dict:
    """Absolute and relative error of one released answer; grouped: over the exact keys."""
    if list(exact) == [""]:
        value, truth = answer.get(""), exact[""]
        if value is None:
            return {"abs": None, "rel": None}
        return {"abs": abs(value - truth), "rel": abs(value - truth) / abs(truth) if truth else None}
    errors = [abs((answer.get(key) or 0.0) - truth) for key, truth in exact.items()]
    total = sum(abs(truth) for truth in exact.values())
    return {"abs": statistics.mean(errors), "rel": sum(errors) / total if total else None,
            "released": sum(1 for key in answer if key in exact), "keys": len(exact)}


# -- process trees: memory and stopping -------------------------------------------------------

def children_map() -> dict[int, list[int]]:
    tree: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
                ppid = int(stat.rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
            tree.setdefault(ppid, []).append(int(entry))
    return tree


def tree_of(roots: list[int]) -> list[int]:
    tree, seen, todo = children_map(), [], list(roots)
    while todo:
        pid = todo.pop()
        if pid not in seen:
            seen.append(pid)
            todo += tree.get(pid, [])
    return seen


def rss_mb(pids: list[int]) -> float:
    total = 0
    for pid in pids:
        try:
            for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1])
        except OSError:
            pass
    return total / 1024


class PeakSampler:
    """The largest summed RSS of the process trees under ``roots()``, sampled every 0.25 s."""

    def __init__(self, roots):
        self.roots, self.peak, self._stop = roots, 0.0, threading.Event()
        self.loads: list[float] = []  # the machine's 1-minute load average, for the report
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, rss_mb(tree_of(self.roots())))
            self.loads.append(os.getloadavg()[0])
            self._stop.wait(0.25)

    def stop(self) -> float:
        self._stop.set()
        self._thread.join()
        return self.peak


def stop_tree(process: subprocess.Popen) -> None:
    """End a process we started in its own session, its group, and whatever it left behind."""
    pids = tree_of([process.pid])
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(process.pid, sig)
        except ProcessLookupError:
            pass
        for pid in pids:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        try:
            process.wait(timeout=10)
            break
        except subprocess.TimeoutExpired:
            continue


# -- running one engine -----------------------------------------------------------------------

def worker_command(engine: str, args, rows: int, db: Path, parquet: Path, master: str, queries: list[str]) -> list[str]:
    common = ["--rows", str(rows), "--parquet", str(parquet), "--repeats", str(args.repeats),
              "--master", master, "--driver-memory", args.driver_memory, "--executor-memory", args.executor_memory,
              "--shuffle-partitions", str(args.shuffle_partitions), "--queries", *queries]
    if engine == "tumult":
        return [str(Path(args.tumult_venv) / "bin" / "python"), str(HERE / "tumult_peer.py"), *common]
    return [sys.executable, str(Path(__file__).resolve()), "--worker", engine, "--db", str(db), *common]


def run_engine(engine: str, args, rows: int, db: Path, parquet: Path, master: str = "local[2]",
               extra_roots=lambda: [], result: dict | None = None) -> dict:
    """Run the engine's worker into ``result`` (the caller's, so that what is saved while it runs
    holds it); restart the worker after a timed-out run for the classes left."""
    result = {} if result is None else result
    result.update({"engine": engine, "queries": {}, "master": master})
    left = [name for name in RUN_ORDER if name in args.classes]
    start = time.perf_counter()
    while left:
        outcome = run_worker(engine, args, rows, db, parquet, master, left, extra_roots, result)
        if outcome == "unavailable":
            break
        left = [name for name in left if not finished(result, name)]
    result["wall_s"] = time.perf_counter() - start
    result["finished"] = datetime.datetime.now().isoformat(timespec="seconds")
    return result


def run_worker(engine, args, rows, db, parquet, master, queries, extra_roots, result) -> str:
    command = worker_command(engine, args, rows, db, parquet, master, queries)
    env = dict(os.environ, PYTHONPATH=str(ROOT), PYTHONUNBUFFERED="1")
    err = tempfile.TemporaryFile("w+")
    launched = time.perf_counter()
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=err, text=True, env=env,
                               cwd=str(ROOT), start_new_session=True)
    sampler = PeakSampler(lambda: [process.pid, *extra_roots()])
    lines: queue.Queue = queue.Queue()
    threading.Thread(target=lambda: [*map(lines.put, process.stdout), lines.put(None)], daemon=True).start()
    runs: dict[str, list] = {}
    try:
        outcome, current = read_events(engine, args, lines, launched, result, runs, queries)
    finally:  # also when this process is stopped: never leave a worker tree behind
        stop_tree(process)
        peak = sampler.stop()
    result["peak_rss_mb"] = max(result.get("peak_rss_mb", 0.0), peak)
    result.setdefault("loads", []).extend(sampler.loads[::20])
    err.seek(0)
    tail = [line for line in err.read().strip().splitlines() if line.strip()][-3:]
    err.close()
    if outcome == "done" and not all(finished(result, name) for name in queries):
        message = " / ".join(tail)[-300:] or f"exit code {process.returncode}"
        if not result["queries"] and "first_query_s" not in result:
            result["unavailable"] = message
            return "unavailable"
        result["queries"][current] = {"error": f"worker ended: {message}", "runs": runs.get(current, [])}
    return outcome


def finished(result: dict, name: str) -> bool:
    """Whether the class has its outcome (done, refused, timed out), not only some runs."""
    return name in result["queries"] and not result["queries"][name].get("partial")


def read_events(engine, args, lines, launched, result, runs, queries) -> tuple[str, str]:
    """Fold the worker's JSON events into ``result`` until it ends or a run times out:
    (outcome, the class it was on)."""
    current, last, outcome = queries[0], time.perf_counter(), "done"
    while True:
        try:
            line = lines.get(timeout=max(1.0, args.timeout - (time.perf_counter() - last)))
        except queue.Empty:
            result["queries"][current] = {"timeout": args.timeout, "runs": runs.get(current, [])}
            print(f"#   {engine}: {current} timed out after {args.timeout:.0f} s", file=sys.stderr, flush=True)
            outcome = "timeout"
            break
        if line is None:
            break
        if not line.startswith("{"):
            continue
        event, last = json.loads(line), time.perf_counter()
        kind = event["event"]
        if kind == "ready":
            result.setdefault("session_s", event["seconds"])
        elif kind == "unavailable":
            result["unavailable"] = event["error"]
            outcome = "unavailable"
        elif kind == "run":
            current = event["query"]
            runs.setdefault(current, []).append(event)
            if "first_query_s" not in result:
                result["first_query_s"] = last - launched
                result["first_query"] = current
            print(f"#   {engine} {current} run {event['run']}: {event['seconds']:.2f} s", file=sys.stderr, flush=True)
            result["queries"].setdefault(current, {"partial": True, "runs": runs[current]})
            args.save()  # every answer on disk at once: a run stopped from outside keeps it
        elif kind == "done":
            result["queries"][event["query"]] = {"runs": runs.get(event["query"], [])}
        elif kind == "error":
            result["queries"][event["query"]] = {"error": event["error"], "runs": runs.get(event["query"], [])}
        elif kind == "next":
            current = event["query"]
    return outcome, current


# -- the workers (dpsql; Tumult's is tumult_peer.py) ------------------------------------------

def emit(**event) -> None:
    print(json.dumps(event, default=str), flush=True)


def worker_main(args) -> None:
    try:
        import dpsql

        start = time.perf_counter()
        options = bench_scale.no_time_limit()
        if args.worker == "dpsql-duckdb":
            db = dpsql.connect(args.db, policy=bench_scale.POLICY_USER, ledger=":memory:", **options)
        else:
            from dpsql.backends.spark.session import local_session

            session = local_session(master=args.master, app="dpsql-bench", config=spark_config(args))
            for table in ("visits", "stores"):
                session.read.parquet(str(Path(args.parquet) / f"{table}.parquet")).createOrReplaceTempView(table)
            db = dpsql.connect(session, policy=bench_scale.POLICY_USER, ledger=":memory:", **options)
    except Exception as error:  # the Spark backend may not exist yet: say why, once
        emit(event="unavailable", error=f"{type(error).__name__}: {(str(error).splitlines() or [''])[0][:300]}")
        return
    emit(event="ready", seconds=time.perf_counter() - start)
    counter = iter(range(10**9))
    for name in args.queries:
        emit(event="next", query=name)
        q = CLASSES[name]
        try:
            for run in range(1 + args.repeats):
                epsilon = Fraction(10**6 + next(counter), 10**6)  # never a free repeat
                start = time.perf_counter()
                rows = db.sql(q["sql"], epsilon=epsilon, delta=q.get("delta")).fetchall()
                emit(event="run", query=name, run=run, seconds=time.perf_counter() - start, answer=answer_of(rows))
            emit(event="done", query=name)
        except Exception as error:
            emit(event="error", query=name, error=f"{type(error).__name__}: {str(error)[:300]}")


def spark_config(args) -> dict[str, str]:
    """The Spark settings every Spark engine here gets (Tumult's worker sets the same)."""
    config = {"spark.driver.memory": args.driver_memory, "spark.executor.memory": args.executor_memory,
              "spark.cores.max": "2"}
    if args.shuffle_partitions:  # 0: dpsql sizes them (dpsql.backends.spark.session.size_shuffles)
        config["spark.sql.shuffle.partitions"] = str(args.shuffle_partitions)
    return config


# -- the standalone cluster -------------------------------------------------------------------

class Cluster:
    """A standalone master and two one-core workers on this machine, from pyspark's spark-class."""

    def __init__(self, log_dir: Path, worker_memory: str, port: int = 7077, ui_port: int = 8080):
        import pyspark

        home = Path(pyspark.__file__).parent
        self.url, self.ui = f"spark://localhost:{port}", f"http://localhost:{ui_port}/json/"
        env = dict(os.environ, SPARK_HOME=str(home), SPARK_WORKER_DIR=str(log_dir / "work"),
                   SPARK_LOCAL_DIRS=str(log_dir / "tmp"), SPARK_NO_DAEMONIZE="1")
        log_dir.mkdir(parents=True, exist_ok=True)
        spark_class = str(home / "bin" / "spark-class")
        self.processes = [self._start([spark_class, "org.apache.spark.deploy.master.Master", "--host", "localhost",
                                       "--port", str(port), "--webui-port", str(ui_port)], env, log_dir / "master.log")]
        self._wait(lambda: self._port_open(port), "the master to listen")
        for i in range(2):
            self.processes.append(self._start(
                [spark_class, "org.apache.spark.deploy.worker.Worker", "--cores", "1", "--memory", worker_memory,
                 "--webui-port", str(ui_port + 1 + i), self.url], env, log_dir / f"worker{i}.log"))
        self._wait(lambda: self._alive_workers() >= 2, "two workers to register")

    @staticmethod
    def _start(command, env, log: Path) -> subprocess.Popen:
        return subprocess.Popen(command, stdout=open(log, "w"), stderr=subprocess.STDOUT, env=env,
                                start_new_session=True)

    @staticmethod
    def _port_open(port: int) -> bool:
        with socket.socket() as s:
            return s.connect_ex(("localhost", port)) == 0

    def _alive_workers(self) -> int:
        try:
            with urllib.request.urlopen(self.ui, timeout=2) as response:
                return sum(1 for w in json.load(response).get("workers", []) if w.get("state") == "ALIVE")
        except OSError:
            return 0

    def _wait(self, ready, what: str, seconds: float = 120) -> None:
        deadline = time.monotonic() + seconds
        while not ready():
            if time.monotonic() > deadline or any(p.poll() is not None for p in self.processes):
                self.stop()
                raise RuntimeError(f"standalone cluster: gave up waiting for {what}")
            time.sleep(1)

    def pids(self) -> list[int]:
        return [p.pid for p in self.processes]

    def stop(self) -> None:
        for process in reversed(self.processes):
            stop_tree(process)


# -- the report -------------------------------------------------------------------------------

def fmt(seconds: float | None) -> str:
    return bench_scale.fmt(seconds)


def time_cell(entry: dict | None, repeats: int) -> str:
    if entry is None:
        return "not run"
    if "timeout" in entry:
        return f"timeout (> {entry['timeout']:.0f} s)"
    if "error" in entry:
        return f"failed: {entry['error'][:100]}"
    timed = [run["seconds"] for run in entry["runs"][1:]]
    if not timed:  # --repeats 0 (a slow engine): the one run there is, first query included
        return f"{fmt(entry['runs'][0]['seconds'])} (one run)" if entry["runs"] else "—"
    cell = {"median": statistics.median(timed), "min": min(timed), "max": max(timed), "n": len(timed)}
    return bench_scale.spread(cell, repeats)


def errors_of(entry: dict | None, exact: dict) -> list[dict]:
    if not entry or "runs" not in entry:
        return []
    return [error_of(run["answer"], exact) for run in entry["runs"]]


def error_cell(errors: list[dict]) -> str:
    absolute = [e["abs"] for e in errors if e["abs"] is not None]
    relative = [e["rel"] for e in errors if e.get("rel") is not None]
    if not absolute:
        return "—"
    text = f"{statistics.mean(absolute):,.4g}"
    if relative:
        text += f" ({100 * statistics.mean(relative):.2g}%)"
    if "keys" in errors[0]:
        text += f", {statistics.mean(e['released'] for e in errors):,.0f}/{errors[0]['keys']:,} keys"
    return text


def size_section(rows: int, results: dict, exact: dict, args) -> list[str]:
    names = list(CLASSES)
    lines = [f"### {rows:,} rows", "",
             (f"Time per query: median (min–max) of {args.repeats} runs after a first one; " if args.repeats else
              "Time per query: one run per class (--repeats 0), the first query's included; ") + "first query: from "
             "process start to the first answer (imports, session start, what a fresh connection builds). "
             "Peak memory: summed RSS of the engine's process tree (JVM included). Error: relative error "
             "against the exact answer, averaged over the classes the engine answered (per class in the next "
             "table; it is mostly the rows that bounding each user to 10 leaves out, the same for every engine). Load: "
             "the machine's mean 1-minute load average while the leg ran (2 cores: above 2, other work "
             "shared the CPUs and every time here is longer than on a quiet machine).", "",
             "| engine | first query | " + " | ".join(LABELS.get(n, n) for n in names)
             + " | peak memory | error | leg took | load |",
             "|---|---:|" + "---:|" * len(names) + "---:|---:|---:|---:|"]
    for engine, result in results.items():
        label = engine + (f" ({result['master']})" if "cluster" in engine else "")
        if "unavailable" in result:
            lines.append(f"| {label} | not available: {result['unavailable'][:160]} |" + " |" * (len(names) + 4))
            continue
        first = f"{fmt(result.get('first_query_s'))} ({result.get('first_query', '—')})"
        answered = [n for n in names if errors_of(result["queries"].get(n), exact[n])]
        relative = [statistics.mean(e["rel"] for e in errors_of(result["queries"].get(n), exact[n])) for n in answered]
        cells = [time_cell(result["queries"].get(n), args.repeats) for n in names]
        error = f"{(100 * statistics.mean(relative)) if relative else float('nan'):.2g}%"
        lines.append(f"| {label} | {first} | " + " | ".join(cells) + f" | {result.get('peak_rss_mb', 0):,.0f} MB | "
                     f"{error} ({len(answered)} of {len(names)}) | {fmt(result.get('wall_s'))} | "
                     f"{statistics.mean(result.get('loads') or [float('nan')]):.1f} |")
    lines += ["", "Error per class: mean absolute error over every run's answer (grouped: per key of the exact "
              "answer, a key not released counting as 0; then keys released / keys), relative in brackets:", "",
              "| engine | " + " | ".join(LABELS.get(n, n) for n in names) + " |", "|---|" + "---:|" * len(names)]
    for engine, result in results.items():
        if "unavailable" not in result:
            lines.append(f"| {engine} | " + " | ".join(error_cell(errors_of(result["queries"].get(n), exact[n]))
                                                        for n in names) + " |")
    return lines + [""]


def machine_line() -> str:
    cpu = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")), "")
    memory = int(Path("/proc/meminfo").read_text().split()[1]) / 2**20
    return (f"{platform.system()} {platform.machine()} ({cpu}), {os.cpu_count()} cores, {memory:.0f} GiB RAM, "
            f"Python {platform.python_version()}, dpsql at {bench_scale.dpsql_version()}, "
            f"{datetime.datetime.now().isoformat(timespec='minutes')}, load average before "
            f"{os.getloadavg()[0]:.1f}")


# -- main -------------------------------------------------------------------------------------

def ensure_tumult_venv(path: Path) -> None:
    if (path / "bin" / "python").exists():
        return
    print(f"# creating {path} with {TUMULT_REQUIREMENT} ...", file=sys.stderr, flush=True)
    base = getattr(sys, "_base_executable", None) or "python3"
    subprocess.run([base, "-m", "venv", str(path)], check=True)
    subprocess.run([str(path / "bin" / "pip"), "install", "--quiet", TUMULT_REQUIREMENT], check=True)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, nargs="+", default=SIZES)
    parser.add_argument("--engines", nargs="+", default=ENGINES, choices=ENGINES)
    parser.add_argument("--classes", nargs="+", default=list(CLASSES), choices=list(CLASSES))
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--timeout", type=float, default=1200.0, help="seconds one run may take")
    parser.add_argument("--cache", default="/work/bench-cache/spark", help="Parquet files and results")
    parser.add_argument("--duckdb-cache", default="/work/bench-cache", help="DuckDB files (bench_scale's names)")
    parser.add_argument("--tumult-venv", default="/work/tmlt-venv")
    parser.add_argument("--cluster", action="store_true", help="also dpsql on a standalone cluster (first size)")
    parser.add_argument("--driver-memory", default="8g")
    parser.add_argument("--executor-memory", default="4g", help="--cluster: each worker's executor")
    parser.add_argument("--shuffle-partitions", type=int, default=0,
                        help="0: left to dpsql (the executors' cores, adaptive execution off)")
    parser.add_argument("--out", default=None, help="append the Markdown report to this file")
    parser.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--db", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--parquet", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--master", default="local[2]", help=argparse.SUPPRESS)
    parser.add_argument("--queries", nargs="+", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        return worker_main(args)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # unwinds run_worker: workers stopped too
    cache, duckdb_cache = Path(args.cache), Path(args.duckdb_cache)
    cache.mkdir(parents=True, exist_ok=True)
    if "tumult" in args.engines:
        ensure_tumult_venv(Path(args.tumult_venv))
    header = ["## Spark backend: dpsql on Spark, on DuckDB, and Tumult Analytics", "",
              f"Machine: {machine_line()}.", "",
              f"Command: `python benchmarks/bench_spark.py {' '.join(sys.argv[1:] if argv is None else argv)}`"]
    print("\n".join(header) + "\n", flush=True)
    everything: dict = {}
    raw = cache / f"spark-{datetime.datetime.now().strftime('%Y%m%d-%H%M%S')}.json"
    args.save = lambda: raw.write_text(json.dumps(everything, indent=1, default=str))
    for index, rows in enumerate(args.rows):
        db, parquet = ensure_data(rows, duckdb_cache, cache)
        exact = exact_answers(db, cache)
        results = everything[rows] = {}
        for engine in args.engines:
            print(f"# {engine} on {rows:,} rows ...", file=sys.stderr, flush=True)
            run_engine(engine, args, rows, db, parquet, result=results.setdefault(engine, {}))
            raw.write_text(json.dumps(everything, indent=1, default=str))  # what is done survives a stop
        if args.cluster and index == 0:
            print(f"# {CLUSTER_ENGINE} on {rows:,} rows ...", file=sys.stderr, flush=True)
            try:
                cluster = Cluster(cache / "cluster", worker_memory=args.executor_memory)
            except Exception as error:
                results[CLUSTER_ENGINE] = {"master": "spark://localhost:7077", "unavailable": str(error)}
            else:
                try:
                    run_engine("dpsql-spark", args, rows, db, parquet, cluster.url, extra_roots=cluster.pids,
                               result=results.setdefault(CLUSTER_ENGINE, {}))
                finally:
                    cluster.stop()
        raw.write_text(json.dumps(everything, indent=1, default=str))
        section = size_section(rows, results, exact, args)
        print("\n".join(section), flush=True)
        if args.out:  # each size as soon as it is done
            with open(args.out, "a") as out:
                out.write("\n".join(([*header, ""] if index == 0 else []) + section) + "\n")


if __name__ == "__main__":
    main()
