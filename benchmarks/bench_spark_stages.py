"""dpsql on Spark, stage by stage: start-up, the copy build against a plain cache, and each query's jobs.

Run::

    .venv/bin/python benchmarks/bench_spark_stages.py --rows 1000000                 # local[2]
    .venv/bin/python benchmarks/bench_spark_stages.py --rows 1000000 10000000 --cluster
    .venv/bin/python benchmarks/bench_spark_stages.py --start-cluster   # only start it (Ctrl-C stops it)
    .venv/bin/python benchmarks/bench_spark_stages.py --rows 1000000 --serve   # `dpsql serve` start-up

``--cluster`` starts a standalone master and two one-core workers on this machine with pyspark's
own ``spark-class`` (``org.apache.spark.deploy.master.Master`` and ``...worker.Worker``,
``bench_spark.Cluster``; ``--worker-memory`` each, 2g by default), runs every size against it and
stops them afterwards (also when interrupted). Each size runs in a fresh process (a fresh
SparkSession: the JVM's warm-up is part of what a new user waits for).

Data: ``bench_spark``'s shop data (its Parquet files, made on first use under ``--cache``), the
policy ``bench_scale.POLICY_USER`` (10 rows per user).

What one size measures, in order, in one session:

1. ``session``: ``SparkSession`` start plus the temp views over the Parquet files;
2. ``plain cache``: ``df.cache(); df.count()`` of the visits table (then unpersisted): the
   yardstick for the copy build;
3. ``connect``: ``dpsql.connect`` (reads schemas only: no Spark job);
4. ``copy build``: the bounded copy and its row-count table cached (``SparkEngine._fill``, timed
   inside the first query), with the number of Spark jobs it ran;
5. per query class (``bench_spark.CLASSES``), ``--repeats`` runs after the first: the time of
   ``db.sql`` split into the Spark job that evaluates the query over the cached copy (per-unit
   aggregation, the grouping, the collect of the aggregated rows: ``SparkEngine.fetch``) and
   the rest, dpsql on this machine (parse, plan, sensitivity, rendering, noise, the ledger),
   with the number of Spark jobs and stages the query ran (``statusTracker`` of the job group
   each run gets; stages skipped because their output is cached are not counted).

``--serve`` measures instead how long ``dpsql serve`` on a Spark config (``[tables]`` naming the
Parquet files) takes to accept a psql login, against how long the same SparkSession takes to start
alone (``open_session`` of the config, in a process of its own): the difference is dpsql's start-up.

Output: a Markdown section per size (stdout; appended to ``--out``), the raw numbers as JSON.
Per-row costs (seconds per million rows) are given for the copy build and the queries, for the
extrapolation in benchmarks/RESULTS.md.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import time
from fractions import Fraction
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import bench_spark  # noqa: E402

QUERIES = ["COUNT", "SUM", "AVG", "GROUP BY public", "GROUP BY private"]


# -- the measuring worker (one size, one fresh session) ---------------------------------------

def worker(args) -> dict:
    import bench_scale

    import dpsql
    from dpsql.backends import spark as spark_backend
    from dpsql.backends.spark.session import local_session

    out: dict = {"rows": args.rows, "master": args.master}
    start = time.perf_counter()
    config = {"spark.driver.memory": args.driver_memory}
    if args.master.startswith("spark://"):
        config.update({"spark.executor.memory": args.executor_memory, "spark.cores.max": "2"})
    session = local_session(master=args.master, app="dpsql-stages", config=config)
    parquet = Path(args.parquet)
    for table in ("visits", "stores"):
        session.read.parquet(str(parquet / f"{table}.parquet")).createOrReplaceTempView(table)
    context = session.sparkContext
    tracker = context.statusTracker()
    session.range(1000).count()  # the first job: executors up
    out["session_s"] = time.perf_counter() - start

    group = iter(range(10**9))

    def jobs_of(action):
        """(seconds, jobs, stages run) of ``action`` under a job group of its own."""
        name = f"dpsql-bench-{next(group)}"
        context.setJobGroup(name, name)
        began = time.perf_counter()
        action()
        seconds = time.perf_counter() - began
        jobs = tracker.getJobIdsForGroup(name)
        stages = 0
        for job in jobs:
            info = tracker.getJobInfo(job)
            for stage in (info.stageIds if info else []):
                stage_info = tracker.getStageInfo(stage)
                stages += bool(stage_info and stage_info.numCompletedTasks + stage_info.numActiveTasks)
        context.setLocalProperty("spark.jobGroup.id", None)
        return seconds, len(jobs), stages

    plain = session.read.parquet(str(parquet / "visits.parquet")).cache()
    out["plain_cache_s"], out["plain_cache_jobs"], _ = jobs_of(plain.count)
    plain.unpersist(blocking=True)

    began = time.perf_counter()
    db = dpsql.connect(session, policy=bench_scale.POLICY_USER, ledger=":memory:", query_timeout=None)
    out["connect_s"] = time.perf_counter() - began
    out["partitions"] = {"shuffle": session.conf.get("spark.sql.shuffle.partitions"),
                         "adaptive": session.conf.get("spark.sql.adaptive.enabled")}

    timings = {"fill": 0.0, "fetch": 0.0}
    fill, fetch = spark_backend.SparkEngine._fill, spark_backend.SparkEngine.fetch

    def timed_fill(self, sources):
        began = time.perf_counter()
        try:
            return fill(self, sources)
        finally:
            timings["fill"] += time.perf_counter() - began

    def timed_fetch(self, sql, parameters=None, *, bounded=()):
        began = time.perf_counter()
        try:
            return fetch(self, sql, parameters, bounded=bounded)
        finally:
            timings["fetch"] += time.perf_counter() - began

    spark_backend.SparkEngine._fill = timed_fill
    spark_backend.SparkEngine.fetch = timed_fetch
    counter = iter(range(10**9))
    out["queries"] = {}
    for name in args.queries:
        query = bench_spark.CLASSES[name]
        runs = []
        for run in range(1 + args.repeats):
            timings.update(fill=0.0, fetch=0.0)
            epsilon = Fraction(10**6 + next(counter), 10**6)  # never a free repeat
            seconds, jobs, stages = jobs_of(lambda: db.sql(query["sql"], epsilon=epsilon,
                                                           delta=query.get("delta")).fetchall())
            runs.append({"seconds": seconds, "jobs": jobs, "stages": stages, "build": timings["fill"],
                         "spark": timings["fetch"] - timings["fill"], "local": seconds - timings["fetch"]})
        out["queries"][name] = runs
        if "copy_build_s" not in out:
            out["copy_build_s"] = runs[0]["build"]
            out["copy_partitions"] = session.table("dp_bounded_visits__user_id__10").rdd.getNumPartitions()
        print(f"# {args.rows:,} {name}: " + ", ".join(f"{r['seconds']:.2f} s/{r['jobs']} jobs" for r in runs),
              file=sys.stderr, flush=True)
    db.close()
    session.stop()
    return out


# -- dpsql serve's start-up ------------------------------------------------------------------

def serve_startup(rows: int, parquet: Path, master: str, work: Path) -> dict:
    """Seconds until ``dpsql serve`` answers a login, and until the bare session is up."""
    import socket

    import bench_scale

    from dpsql.server.users import add_user

    work.mkdir(parents=True, exist_ok=True)
    config = work / "shop.spark.toml"
    config.write_text(f'[spark]\nmaster = "{master}"\n\n[spark.config]\n"spark.driver.memory" = "2g"\n\n'
                      f'[tables]\nvisits = "{parquet / "visits.parquet"}"\nstores = "{parquet / "stores.parquet"}"\n')
    (work / "shop.policy").write_text(bench_scale.POLICY_USER)
    for stale in (work / "shop.spark.toml.ledger", work / "users"):
        stale.unlink(missing_ok=True)
    env = dict(os.environ, PYTHONPATH=str(HERE.parent))
    dpsql_cli = [sys.executable, "-m", "dpsql"]
    add_user(work / "users", "ada", "ada-secret")
    began = time.perf_counter()
    session_only = subprocess.run(
        [sys.executable, "-c", "import sys; from dpsql.backends.spark.config import load_spark_config, open_session; "
                               f"open_session(load_spark_config({str(config)!r}))"], env=env, capture_output=True)
    session_s = time.perf_counter() - began
    if session_only.returncode != 0:
        raise RuntimeError(session_only.stderr.decode()[-500:])
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    began = time.perf_counter()
    server = subprocess.Popen([*dpsql_cli, "serve", str(config), "--users", str(work / "users"), "--policy",
                               str(work / "shop.policy"), "--port", str(port)], env=env,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        while True:
            with socket.socket() as probe:
                if probe.connect_ex(("127.0.0.1", port)) == 0:
                    break
            if server.poll() is not None or time.perf_counter() - began > 600:
                raise RuntimeError(f"dpsql serve did not start (exit code {server.poll()})")
            time.sleep(0.1)
        ready_s = time.perf_counter() - began
    finally:
        bench_spark.stop_tree(server)
    return {"rows": rows, "master": master, "session_s": session_s, "serve_ready_s": ready_s}


# -- the report -------------------------------------------------------------------------------

def per_million(seconds: float, rows: int) -> str:
    return f"{seconds / rows * 1e6:.3g}"


def section(result: dict, repeats: int) -> list[str]:
    rows = result["rows"]
    lines = [f"### {rows:,} rows on {result['master']}", "",
             f"Session {result['session_s']:.1f} s; `dpsql.connect` {result['connect_s']:.2f} s; plain "
             f"`df.cache(); df.count()` {result['plain_cache_s']:.1f} s; dpsql's copy build (copy and row-count "
             f"table, in the first query) {result['copy_build_s']:.1f} s = "
             f"{result['copy_build_s'] / result['plain_cache_s']:.1f}× the plain cache "
             f"({per_million(result['copy_build_s'], rows)} s per million rows; "
             f"{result['copy_partitions']} partitions; "
             f"shuffle partitions {result['partitions']['shuffle']}, adaptive {result['partitions']['adaptive']}).", "",
             f"Per query, median of {repeats} runs after the first: total, of it the Spark job over the cached copy "
             "and dpsql on this machine, Spark jobs and stages run per query:", "",
             "| query | first run | total | Spark (per-unit aggregation + collect) | dpsql local (plan, noise, ledger) "
             "| jobs | stages | Spark s per M rows |", "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for name, runs in result["queries"].items():
        timed = runs[1:] or runs
        median = {key: statistics.median(r[key] for r in timed) for key in ("seconds", "spark", "local")}
        jobs = "/".join(sorted({str(r["jobs"]) for r in timed}))
        stages = "/".join(sorted({str(r["stages"]) for r in timed}))
        lines.append(f"| {name} | {runs[0]['seconds']:.2f} s | {median['seconds']:.2f} s | {median['spark']:.2f} s | "
                     f"{median['local']:.3f} s | {jobs} | {stages} | {per_million(median['spark'], rows)} |")
    return lines + [""]


# -- main -------------------------------------------------------------------------------------

def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, nargs="+", default=[1_000_000])
    parser.add_argument("--queries", nargs="+", default=QUERIES, choices=QUERIES)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--cluster", action="store_true", help="a standalone master and two workers, started here")
    parser.add_argument("--start-cluster", action="store_true", help="only start the cluster; stop it with Ctrl-C")
    parser.add_argument("--serve", action="store_true", help="measure `dpsql serve`'s start-up instead")
    parser.add_argument("--driver-memory", default="3g")
    parser.add_argument("--executor-memory", default="1536m", help="--cluster: each worker's executor")
    parser.add_argument("--worker-memory", default="2g", help="--cluster: each worker")
    parser.add_argument("--cache", default="/work/bench-cache/spark", help="Parquet files")
    parser.add_argument("--duckdb-cache", default="/work/bench-cache", help="DuckDB files (bench_scale's names)")
    parser.add_argument("--out", default=None, help="append the Markdown report to this file")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--master", default="local[2]", help=argparse.SUPPRESS)
    parser.add_argument("--parquet", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        args.rows = args.rows[0]
        print(json.dumps(worker(args)), flush=True)
        return
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # unwinds the finally below: the cluster stops
    cache = Path(args.cache)
    cluster = None
    if args.cluster or args.start_cluster:
        cluster = bench_spark.Cluster(cache / "cluster", worker_memory=args.worker_memory)
        print(f"# standalone cluster at {cluster.url} (UI {cluster.ui})", file=sys.stderr, flush=True)
    try:
        if args.start_cluster:
            print(f"spark master: {cluster.url}; Ctrl-C stops it", flush=True)
            signal.pause()
            return
        master = cluster.url if cluster else "local[2]"
        command = " ".join(sys.argv[1:] if argv is None else argv)
        header = ["## Spark stage by stage (issue 38)", "", f"Machine: {bench_spark.machine_line()}.", "",
                  f"Command: `python benchmarks/bench_spark_stages.py {command}`", ""]
        print("\n".join(header), flush=True)
        everything = []
        for rows in args.rows:
            _, parquet = bench_spark.ensure_data(rows, Path(args.duckdb_cache), cache)
            if args.serve:
                started = serve_startup(rows, parquet, master, cache / "serve")
                print(f"{rows:,} rows on {master}: `dpsql serve` accepted connections {started['serve_ready_s']:.1f} s "
                      f"after launch; the same SparkSession alone took {started['session_s']:.1f} s to start "
                      f"(dpsql's own start-up: {started['serve_ready_s'] - started['session_s']:.1f} s). "
                      f"Load average {os.getloadavg()[0]:.1f}.", flush=True)
                everything.append(started)
                continue
            command = [sys.executable, str(Path(__file__).resolve()), "--worker", "--rows", str(rows),
                       "--master", master, "--parquet", str(parquet), "--repeats", str(args.repeats),
                       "--driver-memory", args.driver_memory, "--executor-memory", args.executor_memory,
                       "--queries", *args.queries]
            env = dict(os.environ, PYTHONPATH=str(HERE.parent), PYTHONUNBUFFERED="1")
            done = subprocess.run(command, stdout=subprocess.PIPE, text=True, env=env, cwd=str(HERE.parent))
            lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
            if done.returncode != 0 or not lines:
                print(f"# {rows:,} rows: the worker failed (exit code {done.returncode})", file=sys.stderr)
                continue
            result = json.loads(lines[-1])
            result["load"] = os.getloadavg()[0]
            everything.append(result)
            text = "\n".join(section(result, args.repeats) + [f"Load average after: {result['load']:.1f}.", ""])
            print(text, flush=True)
            if args.out:
                with open(args.out, "a") as out:
                    out.write(("\n".join(header) + "\n" if rows == args.rows[0] else "") + text + "\n")
        (cache / f"stages-{time.strftime('%Y%m%d-%H%M%S')}.json").write_text(json.dumps(everything, indent=1))
    finally:
        if cluster is not None:
            cluster.stop()


if __name__ == "__main__":
    main()
