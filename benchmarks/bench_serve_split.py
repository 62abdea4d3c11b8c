"""Where a served query's CPU goes, thread by thread: one psycopg client, a server with one worker.

    python benchmarks/bench_serve_split.py                 # 300 queries, 1,000 rows
    python benchmarks/bench_serve_split.py --rows 1000000 --queries 100

The server runs in this process (``dpsql.server.open_server``, its event loop in a thread), so
each thread's CPU time can be read: the worker's ``answer`` (and ``db.sql`` inside it), the event
loop (the protocol), the client's thread, and the rest of the process (DuckDB's own threads,
the deadline watchdog). The queries are bench_serve's three shapes with fresh texts. Threads of
one process overlap only what runs without the GIL, so the worker's Python time bounds what
parallel sessions can gain (benchmarks/RESULTS.md, "Serving in parallel").
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import sys
import tempfile
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from bench_scale import cache_dir, ensure_data, machine_line  # noqa: E402
from bench_serve import EPSILON, policy, query  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=1000)
    parser.add_argument("--queries", type=int, default=300)
    parser.add_argument("--cache", default=None)
    args = parser.parse_args()

    import psycopg

    import dpsql.connection as connection_module
    import dpsql.server.answers as answers_module
    from dpsql.server import open_server
    from dpsql.server.users import make_verifier, save_users

    source = ensure_data(args.rows, cache_dir(args.cache))
    directory = Path(tempfile.mkdtemp(prefix="dpsql-bench-split-"))
    spent = {"answer": 0.0, "sql": 0.0}

    def thread_timed(function, key):
        def timed(*arguments, **options):
            start = time.thread_time()
            try:
                return function(*arguments, **options)
            finally:
                spent[key] += time.thread_time() - start
        return timed

    try:
        database = directory / "shop.duckdb"
        shutil.copy(source, database)
        (directory / "shop.policy").write_text(policy(EPSILON * 10**4))  # all of the total
        save_users(directory / "users", {"analyst0": make_verifier("password-0")})
        answers_module.answer = thread_timed(answers_module.answer, "answer")  # type: ignore[assignment]
        connection_module.Connection.sql = thread_timed(connection_module.Connection.sql, "sql")  # type: ignore
        server = open_server(database, users=directory / "users", policy=directory / "shop.policy", port=0,
                             workers=1, processes=False)  # threads: each one's CPU is read here
        thread = threading.Thread(target=asyncio.run, args=(server.serve(),), daemon=True)
        thread.start()
        server.ready.wait(300)

        async def loop_cpu() -> float:
            return time.thread_time()

        def on_loop() -> float:
            return asyncio.run_coroutine_threadsafe(loop_cpu(), server._loop).result()

        with psycopg.connect(host="127.0.0.1", port=server.port, dbname="shop", user="analyst0",
                             password="password-0", autocommit=True) as client:
            for number in range(20):  # warm: caches, the first statements' binds
                client.execute(query(0, number, 10**6)).fetchall()
            spent.update(answer=0.0, sql=0.0)
            loop, process, client_cpu, wall = on_loop(), time.process_time(), time.thread_time(), time.perf_counter()
            for number in range(20, 20 + args.queries):
                client.execute(query(0, number, 10**6)).fetchall()
            wall, client_cpu = time.perf_counter() - wall, time.thread_time() - client_cpu
            process, loop = time.process_time() - process, on_loop() - loop
        server.stop()
        thread.join(60)
        each = lambda seconds: f"{seconds / args.queries * 1000:.2f} ms"  # noqa: E731
        others = process - client_cpu - spent["answer"] - loop
        print(f"### Served CPU per query, by thread: {args.rows:,} rows, {args.queries} queries\n\n"
              f"{machine_line()}.\n\n"
              "| wall | process CPU | worker: `answer` | of it `db.sql` | event loop | other threads | client |\n"
              "|---|---|---|---|---|---|---|\n"
              f"| {each(wall)} | {each(process)} | {each(spent['answer'])} | {each(spent['sql'])} | {each(loop)} | "
              f"{each(others)} | {each(client_cpu)} |")
    finally:
        shutil.rmtree(directory, ignore_errors=True)


if __name__ == "__main__":
    main()
