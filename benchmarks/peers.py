"""Peers for bench_scale.py and bench_utility.py: SmartNoise SQL on DuckDB, OpenDP's Polars context.

Run under the python of a separate venv that has ``pip install -e '.[bench]'`` (smartnoise-sql
and opendp[polars]; never dpsql's own dependencies), one system per process::

    .venv-peers/bin/python benchmarks/peers.py --system smartnoise --db shop_1000000.duckdb
    .venv-peers/bin/python benchmarks/peers.py --system opendp --db shop_1000000.duckdb
    .venv-peers/bin/python benchmarks/peers.py --system smartnoise --db ... --utility --runs 200

Every query costs ``--epsilon`` (1) in total, as in dpsql, and delta 1e-6 where the peer needs
one. Prints one JSON line: per query the median/min/max of ``--repeats`` timed runs after a
warm-up and the rows the last run released (or, with ``--utility``, every run's released rows
and the query's total privacy cost), and the process's peak RSS. A query the peer refuses gets
its error message instead (SmartNoise SQL 1.0.10 disables JOINs and subqueries).

**SmartNoise on DuckDB.** SmartNoise SQL has no DuckDB reader. ``DuckDBAsPostgres`` is a small
connection object that SmartNoise's ``postgres`` engine accepts (``cursor()``, ``commit()``,
``rollback()``; the cursor has ``execute``, ``description`` and iterates over rows) and runs
the SQL SmartNoise generates on a DuckDB connection. One change is needed: SmartNoise samples a
user's rows with ``ROW_NUMBER() OVER (PARTITION BY id ORDER BY RANDOM())``, and DuckDB 2 refuses
volatile window ordering ("ORDER BY window expressions cannot be volatile"). The adapter moves
the ``random()`` one level down — the window's input becomes ``(SELECT *, random() AS
sn_random FROM <input>)`` and the window orders by ``sn_random`` — which draws the same
uniform per row and keeps SmartNoise's semantics (the rewrite, done with sqlglot, is cached per
SQL text, so its cost is paid once per distinct statement). SmartNoise's epsilon is per
mechanism (each noisy aggregate, plus the user count it censors small groups with), so each
query gets the per-mechanism epsilon that makes its total cost ``--epsilon``.

**OpenDP Polars.** One ``dp.Context.compositor`` per query over the visits LazyFrame (loaded
once from the DuckDB file into memory; loading is not timed), privacy unit = one user_id
(``dp.unit_of(contributions=1, identifier="user_id")``), contribution bounded with
``truncate_per_group(10)`` (10 rows per user, as dpsql's policy; ``truncate_num_groups`` fails
on a single grouping column in opendp 0.14.2), public store keys through ``with_keys``. The join
with the public ``stores`` table is a ``replace_strict`` lookup inside the query (joining before
the Context loses the bounds OpenDP needs), with the public cities as keys. In opendp 0.14.2 a
query's ``release()`` takes 1–6 s even on 1,000 rows, almost all of it before any data is read:
``summarize()``, which only builds the measurement and derives its noise scale, takes as long
(5.5 s for the SUM, whose ``collect()`` then takes 5 ms). That is OpenDP's own cost, measured as
it is.
"""

from __future__ import annotations

import argparse
import datetime
import json
import resource
import statistics
import sys
import time

MAX_ROWS, MAX_GROUPS, LOWER, UPPER = 10, 5, 0.0, 500.0
DELTA = 1e-6

# The suite's query names (bench_scale.QUERIES), in SmartNoise's SQL: tables are schema.table.
SMARTNOISE_SQL = {
    "COUNT": "SELECT COUNT(*) AS n FROM main.visits",
    "SUM": "SELECT SUM(amount) AS s FROM main.visits",
    "AVG": "SELECT AVG(amount) AS a FROM main.visits",
    "GROUP BY public keys (50)": "SELECT store, COUNT(*) AS n, SUM(amount) AS s FROM main.visits GROUP BY store",
    "GROUP BY private keys (~5000)": "SELECT zip, COUNT(*) AS n FROM main.visits GROUP BY zip",
    "JOIN public table (7 cities)": "SELECT s.city, COUNT(*) AS n FROM main.visits AS v "
                                    "JOIN main.stores AS s ON v.store = s.store GROUP BY s.city",
    "per-unit subquery": "SELECT AVG(n) AS a FROM (SELECT user_id, COUNT(*) AS n FROM main.visits "
                         "GROUP BY user_id) AS per_user",
}


def stats(times: list[float]) -> dict:
    return {"median": statistics.median(times), "min": min(times), "max": max(times), "n": len(times)}


def timed(action, repeats: int, budget: float = 900.0) -> dict:
    start = time.perf_counter()
    action()
    warm = time.perf_counter() - start
    runs = repeats if warm * repeats <= budget else max(1, min(repeats, int(budget // max(warm, 1e-9))))
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        action()
        times.append(time.perf_counter() - start)
    return stats(times)


# -- SmartNoise SQL on DuckDB -----------------------------------------------------------------

class _Cursor:
    """The DB-API cursor surface SmartNoise's postgres reader uses."""

    def __init__(self, owner: "DuckDBAsPostgres"):
        self._owner = owner
        self.description = None
        self._rows: list = []

    def execute(self, sql: str) -> None:
        result = self._owner.connection.execute(self._owner.translate(sql))
        self.description = result.description
        self._rows = result.fetchall() if result.description is not None else []

    def __iter__(self):
        return iter(self._rows)

    def fetchall(self) -> list:
        return list(self._rows)


class DuckDBAsPostgres:
    """A DuckDB connection presented as the psycopg2-style connection SmartNoise expects."""

    def __init__(self, connection):
        self.connection = connection
        self._translated: dict[str, str] = {}
        self.statements: list[str] = []  # what SmartNoise sent, for inspection

    def cursor(self) -> _Cursor:
        return _Cursor(self)

    def commit(self) -> None:  # read-only queries: nothing to commit
        pass

    def rollback(self) -> None:
        pass

    def translate(self, sql: str) -> str:
        cached = self._translated.get(sql)
        if cached is None:
            cached = self._translated[sql] = _random_below_window(sql)
            self.statements.append(sql)
        return cached


def _random_below_window(sql: str) -> str:
    """Move ``random()`` out of window ORDER BY into a projection of the window's input."""
    if "RANDOM" not in sql.upper():
        return sql
    import sqlglot
    from sqlglot import exp

    tree = sqlglot.parse_one(sql, read="postgres")
    changed = False
    for window in list(tree.find_all(exp.Window)):
        randoms = [node for node in window.find_all(exp.Rand)]
        select = window.find_ancestor(exp.Select)
        source = select.args.get("from") or select.args.get("from_") if select is not None else None
        if not randoms or source is None:
            continue
        inner = source.this
        alias = inner.alias_or_name or "sn_input"
        unaliased = inner.copy()
        unaliased.set("alias", None)
        body = unaliased.this if isinstance(unaliased, exp.Subquery) else unaliased
        wrapped = exp.select("*", exp.alias_(exp.Rand(), "sn_random")).from_(
            body.subquery("sn_inner") if isinstance(body, exp.Select) else body)
        source.set("this", wrapped.subquery(alias))
        for node in randoms:
            node.replace(exp.column("sn_random"))
        changed = True
    return tree.sql(dialect="duckdb") if changed else sql


def smartnoise_metadata(rows: int) -> dict:
    return {"shop": {"main": {
        "visits": {
            "max_ids": MAX_ROWS, "sample_max_ids": True, "rows": rows,
            "user_id": {"type": "int", "private_id": True},
            "store": {"type": "string"}, "zip": {"type": "string"}, "day": {"type": "datetime"},
            "amount": {"type": "float", "lower": LOWER, "upper": UPPER},
        },
        "stores": {"store": {"type": "string"}, "city": {"type": "string"},
                   "size": {"type": "int", "lower": 0, "upper": 1000}},
    }}}


class SmartNoise:
    """SmartNoise readers over one read-only DuckDB connection, at a chosen epsilon."""

    def __init__(self, db_path: str):
        import duckdb

        self.adapter = DuckDBAsPostgres(duckdb.connect(db_path, read_only=True))
        self.rows = self.adapter.connection.execute("SELECT COUNT(*) FROM visits").fetchone()[0]

    def reader(self, epsilon: float, delta: float = DELTA):
        import snsql

        return snsql.from_connection(self.adapter, engine="postgres", metadata=smartnoise_metadata(self.rows),
                                     privacy=snsql.Privacy(epsilon=epsilon, delta=delta))

    def reader_for_total(self, sql: str, total: float, delta: float = DELTA):
        """(reader, per-mechanism epsilon, cost) such that ``sql`` costs ``total`` epsilon in all.

        SmartNoise's epsilon is per mechanism, and a query spends it on every noisy aggregate plus
        the user count it censors groups with; its cost scales linearly with that epsilon.
        """
        epsilon = total / float(self.reader(1.0, delta).get_privacy_cost(sql)[0])
        reader = self.reader(epsilon, delta)
        return reader, epsilon, [float(c) for c in reader.get_privacy_cost(sql)]


def bench_smartnoise(db_path: str, repeats: int, queries: list[str], total: float = 1.0) -> dict:
    peer = SmartNoise(db_path)
    out = {}
    for name in queries:
        sql = SMARTNOISE_SQL[name]
        try:
            reader, epsilon, cost = peer.reader_for_total(sql, total)
            released = []  # rows of the last run: SmartNoise censors groups with few users

            def run():
                released[:] = [len(reader.execute(sql)) - 1]  # the first row is the header

            out[name] = {"total": timed(run, repeats), "rows": released[0], "epsilon_per_mechanism": epsilon,
                         "cost": cost}
        except Exception as error:  # SmartNoise refuses by raising ValueError and others
            out[name] = {"error": _message(error)}
    out["_generated_sql"] = peer.adapter.statements[:20]
    return out


def utility_smartnoise(db_path: str, runs: int, queries: list[str], total: float) -> dict:
    peer = SmartNoise(db_path)
    out = {}
    for name in queries:
        sql = SMARTNOISE_SQL[name]
        try:
            reader, epsilon, cost = peer.reader_for_total(sql, total)
            answers = []
            for _ in range(runs):
                frame = reader.execute_df(sql)
                answers.append([[_plain(v) for v in row] for row in frame.itertuples(index=False, name=None)])
            out[name] = {"epsilon_per_mechanism": epsilon, "cost": cost, "answers": answers}
        except Exception as error:
            out[name] = {"error": _message(error)}
    return out


def _message(error: Exception) -> str:
    return f"{type(error).__name__}: {(str(error).splitlines() or [''])[0][:200]}"


def _plain(value):
    if hasattr(value, "item"):
        value = value.item()
    if isinstance(value, float) and value != value:
        return None
    return value


# -- OpenDP Polars ----------------------------------------------------------------------------

def opendp_frames(db_path: str):
    import duckdb

    connection = duckdb.connect(db_path, read_only=True)
    visits = connection.sql("SELECT user_id, store, amount, zip FROM visits").pl()
    stores = connection.sql("SELECT store, city FROM stores").pl()
    connection.close()
    return visits.lazy(), stores


def opendp_query(name: str, visits, stores, rows: int, epsilon: float = 1.0):
    """The released DataFrame of one suite query, through a fresh OpenDP Context."""
    import opendp.prelude as dp
    import polars as pl

    dp.enable_features("contrib")
    delta = DELTA if name == "GROUP BY private keys (~5000)" else 0.0
    by = {"GROUP BY public keys (50)": ["store"], "GROUP BY private keys (~5000)": ["zip"],
          "JOIN public table (7 cities)": ["city"]}.get(name, [])
    margins = [dp.polars.Margin(by=[], max_length=rows)]
    if by and by != ["city"]:
        margins.append(dp.polars.Margin(by=by, max_length=rows))
    context = dp.Context.compositor(
        data=visits, privacy_unit=dp.unit_of(contributions=1, identifier="user_id"),
        privacy_loss=dp.loss_of(epsilon=epsilon, delta=delta), split_evenly_over=1, margins=margins)
    query = context.query()
    amount = pl.col("amount").fill_null(0.0).fill_nan(0.0)
    if name == "per-unit subquery":
        query = query.group_by("user_id").agg(pl.len().alias("n"))
        return query.select(pl.col("n").cast(pl.Float64).dp.mean((0.0, float(MAX_ROWS)))).release().collect()
    if not by:
        query = query.truncate_per_group(MAX_ROWS)
        measure = {"COUNT": dp.len(), "SUM": amount.dp.sum((LOWER, UPPER)),
                   "AVG": amount.dp.mean((LOWER, UPPER))}[name]
        return query.select(measure).release().collect()
    # truncate_num_groups(5, by=[one column]) fails in opendp 0.14.2 ("multiple fields with name
    # 'store'"), so bound a user's rows in all (10): at most 10 groups of at most 10 rows each.
    query = query.truncate_per_group(MAX_ROWS)
    if by == ["city"]:
        # A join of the private table before the Context loses the bounds OpenDP needs ("unable
        # to infer bounds"); a join with a small public table is a row-by-row lookup, which
        # OpenDP accepts inside the query as replace_strict with the public mapping.
        city = dict(zip(stores["store"], stores["city"]))
        query = query.with_columns(pl.col("store").replace_strict(city, return_dtype=pl.String).alias("city"))
    aggregates = [dp.len()]
    if name == "GROUP BY public keys (50)":
        aggregates.append(amount.dp.sum((LOWER, UPPER)))
    grouped = query.group_by(*by).agg(*aggregates)
    if name == "GROUP BY public keys (50)":
        grouped = grouped.with_keys(stores.lazy().select("store"))
    if by == ["city"]:
        grouped = grouped.with_keys(stores.lazy().select("city").unique())
    return grouped.release().collect()


def bench_opendp(db_path: str, repeats: int, queries: list[str], epsilon: float = 1.0) -> dict:
    start = time.perf_counter()
    visits, stores = opendp_frames(db_path)
    rows = visits.select("user_id").collect().height
    out = {"_load_s": time.perf_counter() - start}
    for name in queries:
        released = []  # rows of the last run: OpenDP drops private keys below its threshold

        def run():
            released[:] = [opendp_query(name, visits, stores, rows, epsilon).height]

        try:
            out[name] = {"total": timed(run, repeats), "rows": released[0]}
        except Exception as error:  # OpenDP refuses what it cannot bound by raising
            out[name] = {"error": _message(error)}
    return out


REQUIRES = {"smartnoise": [("snsql", "smartnoise-sql"), ("duckdb", "duckdb"), ("sqlglot", "sqlglot")],
            "opendp": [("opendp", "opendp[polars]"), ("polars", "polars"), ("duckdb", "duckdb")]}


def require(system: str) -> None:
    """Stop with one clear line (shown in the report) when the peer is not installed here."""
    import importlib

    for module, package in REQUIRES[system]:
        try:
            importlib.import_module(module)
        except ImportError as error:
            raise SystemExit(f"{system} is not installed in {sys.executable} ({error}); "
                             f"pip install '{package}' there, or see pyproject's bench extra")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--system", choices=["smartnoise", "opendp"], required=True)
    parser.add_argument("--db", required=True)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--queries", nargs="+", default=list(SMARTNOISE_SQL))
    parser.add_argument("--utility", action="store_true", help="release --runs answers per query instead")
    parser.add_argument("--runs", type=int, default=200)
    parser.add_argument("--epsilon", type=float, default=1.0, help="total epsilon per query")
    args = parser.parse_args()
    require(args.system)
    start = time.perf_counter()
    if args.utility:
        if args.system != "smartnoise":
            raise SystemExit("--utility is implemented for smartnoise")
        results = utility_smartnoise(args.db, args.runs, args.queries, args.epsilon)
    elif args.system == "smartnoise":
        results = bench_smartnoise(args.db, args.repeats, args.queries, args.epsilon)
    else:
        results = bench_opendp(args.db, args.repeats, args.queries, args.epsilon)
    print(json.dumps({"system": args.system, "results": results, "wall_s": time.perf_counter() - start,
                      "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                      "finished": datetime.datetime.now().isoformat(timespec="seconds")}, default=str))


if __name__ == "__main__":
    sys.exit(main())
