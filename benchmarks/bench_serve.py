"""Load benchmark of ``dpsql serve``: many concurrent psycopg clients on the 1M-row shop data.

    python benchmarks/bench_serve.py                     # 32 clients x 100 queries, 1M rows
    python benchmarks/bench_serve.py --clients 4 --queries 10 --rows 1000   # a quick run
    python benchmarks/bench_serve.py --rows 1000 --workers 2              # the server's worker processes
    python benchmarks/bench_serve.py --rows 1000 --threads                # before issue 38: threads of one process

The server runs as ``dpsql serve`` in its own process on a free loopback port; each client is
a thread with its own connection, as its own analyst, sending distinct queries (no free
repeats) of three shapes: COUNT, SUM and a GROUP BY over 50 public keys, each with a filter
that changes per query. Each analyst's budget holds 95 of their queries, so the last ones are
refused (53400): the run checks that no analyst and not the total was overspent, and that
every answered query's charge is in the ledger (nothing lost when the server stops on SIGTERM).
The same queries are then timed in-process (``db.sql``, one thread) for comparison, and the
server's CPU time (user + system, from /proc, of the server process and every process under it:
its worker processes) is read over the clients' run: CPU ms per query times queries per second
against the cores says what bounds the throughput. The report puts the issue 38 targets (500
queries/s, p99 under 50 ms, on 2 cores at 1,000 rows) beside the figures.
Output: a Markdown section for benchmarks/RESULTS.md.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from fractions import Fraction
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from bench_scale import cache_dir, ensure_data, machine_line  # noqa: E402

EPSILON = Fraction(1, 100)
SHAPES = (
    "SELECT COUNT(*) AS n FROM visits WHERE amount < {k}",
    "SELECT SUM(amount) AS s FROM visits WHERE amount < {k}",
    "SELECT store, COUNT(*) AS n FROM visits WHERE amount < {k} GROUP BY store",
)


def policy(per_analyst: Fraction) -> str:
    return f"""
BUDGET EPSILON 1000;
BUDGET PER ANALYST EPSILON {float(per_analyst)!r};
QUERY EPSILON {float(EPSILON)!r};
PRIVATE TABLE visits (
    PRIVACY UNIT user_id, MAX ROWS PER UNIT 10, MAX GROUPS PER UNIT 5,
    amount BOUNDS 0 TO 500, store KEYS FROM stores.store
);
PUBLIC TABLE stores;
"""


def query(client: int, number: int, queries: int) -> str:
    """A distinct query per (client, number): the filter's bound differs."""
    k = 1 + client * queries + number
    return SHAPES[number % len(SHAPES)].format(k=f"{k / 10:.1f}")


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def start_server(database: Path, policy_file: Path, users: Path, port: int, log: Path,
                 workers: int | None = None, threads: bool = False) -> subprocess.Popen:
    command = [sys.executable, "-m", "dpsql.cli", "serve", str(database), "--policy", str(policy_file),
               "--users", str(users), "--port", str(port), "--max-connections", "128"]
    if workers is not None:  # (a server before issue 26 has no --workers: leave it out to measure one)
        command += ["--workers", str(workers)]
    if threads:
        command.append("--threads")
    # The server's ledger is one more throwaway budget over the benchmark's tables: its own registry
    # of ledgers (a curator home of its own), or the run's other ledgers would make it a second budget.
    home = log.parent / "curator-home"
    home.mkdir(exist_ok=True)
    environment = {**os.environ, "DPSQL_HOME": str(home)}
    return subprocess.Popen(command, stderr=log.open("w"), stdout=subprocess.DEVNULL, env=environment)


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds the process and every live process under it (the server's worker
    processes) have used so far (Linux /proc; NaN elsewhere)."""
    stats = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stats[int(entry.name)] = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except (OSError, IndexError):
                continue
    if pid not in stats:
        return float("nan")
    tree, grown = {pid}, True
    while grown:
        below = {p for p, fields in stats.items() if int(fields[1]) in tree} - tree
        tree |= below
        grown = bool(below)
    ticks = sum(int(stats[p][11]) + int(stats[p][12]) for p in tree)
    return ticks / os.sysconf("SC_CLK_TCK")


def connect(port: int, name: str, password: str, deadline: float):
    import psycopg

    while True:
        try:
            return psycopg.connect(host="127.0.0.1", port=port, dbname="shop", user=name, password=password,
                                   autocommit=True, connect_timeout=10)
        except psycopg.OperationalError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


def run_clients(port: int, clients: int, queries: int, server_pid: int) -> dict:
    """Every client's latencies, refusals and errors, and the server's CPU seconds meanwhile."""
    import psycopg

    results = [dict(latencies=[], refused=0, errors=[], connect=0.0) for _ in range(clients)]
    barrier = threading.Barrier(clients + 1)

    def client(index: int) -> None:
        result = results[index]
        started = time.perf_counter()
        connection = connect(port, f"analyst{index}", f"password-{index}", time.monotonic() + 60)
        result["connect"] = time.perf_counter() - started
        barrier.wait()
        with connection:
            for number in range(queries):
                sql = query(index, number, queries)
                start = time.perf_counter()
                try:
                    connection.execute(sql).fetchall()
                    result["latencies"].append(time.perf_counter() - start)
                except psycopg.errors.ConfigurationLimitExceeded:
                    result["refused"] += 1
                except psycopg.Error as error:
                    result["errors"].append(f"{sql}: {error}")

    threads = [threading.Thread(target=client, args=(i,)) for i in range(clients)]
    for thread in threads:
        thread.start()
    barrier.wait()
    start, cpu = time.perf_counter(), cpu_seconds(server_pid)
    for thread in threads:
        thread.join()
    return dict(results=results, wall=time.perf_counter() - start, cpu=cpu_seconds(server_pid) - cpu)


def in_process(database: Path, policy_text: str, queries: int, clients: int, directory: Path) -> list[float]:
    """A sample of the served queries through ``db.sql`` in this process (a fresh ledger, so
    none is a free repeat), one at a time; ``in_process.thread_cpu`` keeps the CPU seconds of
    the calling thread per query: Python's work (which holds the GIL) and DuckDB's share run on
    that thread, an upper bound on the GIL time that threads in one process cannot overlap."""
    import dpsql

    latencies, thread_cpu = [], []
    # A throwaway budget beside the served one, over the same tables: a registry of ledgers of its own.
    os.environ["DPSQL_HOME"] = tempfile.mkdtemp(dir=directory, prefix="inprocess-home-")
    with dpsql.connect(str(database), policy_text, ledger=directory / "inprocess.ledger",
                       eager_bounding=True) as db:
        for number in range(queries):
            sql = query(number % clients, number, queries)  # a sample of the served queries
            start, cpu = time.perf_counter(), time.thread_time()
            db.sql(sql)
            latencies.append(time.perf_counter() - start)
            thread_cpu.append(time.thread_time() - cpu)
    in_process.thread_cpu = thread_cpu  # type: ignore[attr-defined]
    return latencies


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def check_ledger(database: Path, policy_text: str, ledger: Path, answered: dict[str, int], per_analyst: Fraction) -> list[str]:
    """What the ledger holds against what the clients were answered."""
    import dpsql

    problems = []
    with dpsql.connect(str(database), policy_text, ledger=ledger) as db:
        entries = db.ledger()
        total = db.budget.spent.epsilon
    expected = EPSILON * sum(answered.values())
    if total != expected:
        problems.append(f"the ledger's total {total} differs from the answered queries' {expected}")
    for name, count in answered.items():
        charged = int((entries["analyst"] == name).sum())
        if charged != count:
            problems.append(f"{name}: {charged} charges in the ledger, {count} answers received")
        if EPSILON * charged > per_analyst:
            problems.append(f"{name} overspent: {EPSILON * charged} > {per_analyst}")
    return problems


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--clients", type=int, default=32)
    parser.add_argument("--queries", type=int, default=100)
    parser.add_argument("--cache", default=None)
    parser.add_argument("--workers", type=int, default=None,
                        help="the server's worker processes or threads (default: the server's own default)")
    parser.add_argument("--threads", action="store_true",
                        help="serve in threads of one process (`dpsql serve --threads`: the model before issue 38)")
    args = parser.parse_args()

    from dpsql.server.users import make_verifier, save_users

    source = ensure_data(args.rows, cache_dir(args.cache))
    directory = Path(tempfile.mkdtemp(prefix="dpsql-bench-serve-"))
    try:
        database = directory / "shop.duckdb"
        shutil.copy(source, database)
        per_analyst = EPSILON * (args.queries * 95 // 100)
        policy_text = policy(per_analyst)
        (directory / "shop.policy").write_text(policy_text)
        save_users(directory / "users", {f"analyst{i}": make_verifier(f"password-{i}") for i in range(args.clients)})
        port = free_port()
        log = directory / "server.log"
        started = time.perf_counter()
        server = start_server(database, directory / "shop.policy", directory / "users", port, log, args.workers,
                              args.threads)
        try:
            connect(port, "analyst0", "password-0", time.monotonic() + 300).close()  # the server is up
            run = run_clients(port, args.clients, args.queries, server.pid)
        finally:
            server.send_signal(signal.SIGTERM)
            code = server.wait(60)
        serving = time.perf_counter() - started
        results = run["results"]
        latencies = [x for r in results for x in r["latencies"]]
        answered = {f"analyst{i}": len(r["latencies"]) for i, r in enumerate(results)}
        refused = sum(r["refused"] for r in results)
        errors = [e for r in results for e in r["errors"]]
        problems = check_ledger(database, policy_text, Path(f"{database}.ledger"), answered, per_analyst)
        baseline = in_process(database, policy_text, min(args.queries, 100), args.clients, directory)
        sent = args.clients * args.queries
        print(report(args, run, latencies, refused, errors, problems, baseline, sent, code, serving,
                     [r["connect"] for r in results], log.read_text().count("outcome=answered")))
    finally:
        if os.environ.get("BENCH_SERVE_KEEP"):  # to read the server's log after a failed run
            print(f"kept {directory}", file=sys.stderr)
        else:
            shutil.rmtree(directory, ignore_errors=True)


def report(args, run, latencies, refused, errors, problems, baseline, sent, code, serving, connects, logged) -> str:
    ms = lambda seconds: f"{seconds * 1000:.1f} ms"  # noqa: E731
    lines = [
        f"### {args.clients} clients x {args.queries} queries, {args.rows:,} rows, "
        f"{'default' if args.workers is None else args.workers} {'threads' if args.threads else 'worker processes'}",
        "",
        f"{machine_line()}. The server (`dpsql serve`, its own process) and the clients (psycopg, one "
        f"thread each, in the benchmark's process) shared the machine.",
        "",
        "| | queries | throughput | p50 | p99 | mean |",
        "|---|---|---|---|---|---|",
        "| target (issue 38: 2 cores, 1,000 rows, 16-32 clients) | | >= 500 queries/s | | < 50 ms | |",
        f"| served, {args.clients} concurrent clients | {len(latencies)} answered + {refused} refused "
        f"(budget) of {sent} | {sent / run['wall']:.1f} queries/s ({len(latencies) / run['wall']:.1f} "
        f"answered/s) | {ms(percentile(latencies, .5))} | {ms(percentile(latencies, .99))} | "
        f"{ms(statistics.mean(latencies))} |",
        f"| in-process `db.sql`, one thread | {len(baseline)} | {len(baseline) / sum(baseline):.1f} queries/s | "
        f"{ms(percentile(baseline, .5))} | {ms(percentile(baseline, .99))} | {ms(statistics.mean(baseline))} |",
        "",
        f"Served, the queries took {run['wall'] / sent * 1000:.1f} ms each on average of the server's "
        f"time (wall time / queries), and {run['cpu'] / sent * 1000:.1f} ms of the server's CPU (its processes' "
        f"(user + system; {run['cpu'] / run['wall']:.2f} cores busy on average). "
        f"Connecting (SCRAM-SHA-256, 4096 iterations) took {ms(statistics.median(connects))} median per "
        f"client; {run['wall']:.1f} s for the queries; the server ran {serving:.1f} s in all (start with "
        f"bounded copies built, queries, SIGTERM) and exited with code {code}.",
        f"In-process, a query held the calling thread's CPU for {ms(statistics.median(in_process.thread_cpu))} "
        f"median (Python's work, which holds the GIL, and DuckDB's share on that thread): threads of one "
        f"process answer at most ~{1 / statistics.median(in_process.thread_cpu):.0f} such queries/s.",
        f"Ledger check after the server stopped: {'no overspend, no lost charge' if not problems else '; '.join(problems)} "
        f"({len(latencies)} answers, {len(latencies)} charges, {logged} `outcome=answered` log lines); "
        f"errors other than budget refusals: {len(errors)}{' — ' + errors[0] if errors else ''}.",
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    main()
