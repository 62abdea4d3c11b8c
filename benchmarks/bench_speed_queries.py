"""What bench_speed.py measures: issue 26's query classes, the grouped classes' hand-written
bounds and the targets (bench_speed.py's docstring says how they are run)."""

from bench_scale import DELTA

MAX_ROWS, MAX_GROUPS, LOW, HIGH = 10, 5, 0, 500  # POLICY_USER's limits, restated for the hand-written bounds
VISITS = "FROM visits WHERE amount < {k}"

# name -> the query with a constant {k} that changes every run; raw DuckDB runs the same text.
CLASSES: dict[str, dict] = {
    "COUNT": dict(sql="SELECT COUNT(*) AS n " + VISITS),
    "SUM": dict(sql="SELECT SUM(amount) AS s " + VISITS),
    "AVG": dict(sql="SELECT AVG(amount) AS a " + VISITS),
    "GROUP BY 50 public keys": dict(sql="SELECT store, COUNT(*) AS n, SUM(amount) AS s " + VISITS + " GROUP BY store",
                                    group="store"),
    "GROUP BY ~5,000 private keys": dict(sql="SELECT zip, COUNT(*) AS n " + VISITS + " GROUP BY zip",
                                         group="zip", delta=DELTA),
    "JOIN public table (7 cities)": dict(
        sql="SELECT s.city, COUNT(*) AS n FROM visits AS v JOIN stores AS s ON v.store = s.store "
            "WHERE v.amount < {k} GROUP BY s.city"),
    "MEDIAN": dict(sql="SELECT MEDIAN(amount) AS m " + VISITS),
}

# The grouped classes' hand-written bounds, over ``capped`` (at most MAX_ROWS rows per unit, each
# row with its unit's row count, as dpsql's copy holds them): a unit with at most MAX_GROUPS rows
# cannot exceed the groups limit, so only the others rank their groups (by a hash: a
# data-independent order) and keep MAX_GROUPS; values clamped; then per group (per (unit, group)
# first where units are counted, for partition selection). The fastest correct form tried at 1M
# rows: ranking per-(unit, group) aggregates instead of rows took 1.6-2.2x as long, and ranking
# every unit's groups (no row-count shortcut) 1.8-4.5x (DuckDB's top-n window rewrite on or off).
CLAMPED = f"LEAST(GREATEST(amount, {LOW}), {HIGH})"
LIMITED = """WITH unit_rows AS ({rows}), limited AS (
            SELECT * EXCLUDE (unit_rows) FROM unit_rows WHERE unit_rows <= {groups}
            UNION ALL SELECT * EXCLUDE (unit_rows, g) FROM (
                SELECT *, DENSE_RANK() OVER (PARTITION BY user_id ORDER BY hash(user_id, {key})) AS g
                FROM unit_rows WHERE unit_rows > {groups}) WHERE g <= {groups})"""
HAND_BOUNDS = {
    "GROUP BY 50 public keys": LIMITED.format(
        rows=f"SELECT user_id, unit_rows, store, {CLAMPED} AS a FROM scratch.capped WHERE amount < {{k}}",
        groups=MAX_GROUPS, key="store") + " SELECT store, COUNT(*) AS n, SUM(a) AS s FROM limited GROUP BY store",
    "GROUP BY ~5,000 private keys": LIMITED.format(
        rows="SELECT user_id, unit_rows, zip FROM scratch.capped WHERE amount < {k}", groups=MAX_GROUPS, key="zip")
    + " SELECT zip, SUM(n) AS n, COUNT(*) AS units FROM (SELECT user_id, zip, COUNT(*) AS n FROM limited "
      "GROUP BY user_id, zip) GROUP BY zip",
}
CAPPED = f"""CREATE OR REPLACE TABLE scratch.capped AS SELECT *, COUNT(*) OVER (PARTITION BY user_id) AS unit_rows
             FROM (SELECT * FROM visits QUALIFY ROW_NUMBER() OVER (
                 PARTITION BY user_id ORDER BY hash(user_id, store, amount, zip, day)) <= {MAX_ROWS})"""
# bench_scale's per-(unit, group) pre-aggregation on the raw table (no limits): its ``q-floor``.
Q_FLOORS = {
    "GROUP BY 50 public keys": "SELECT store, SUM(n), SUM(s) FROM (SELECT user_id, store, COUNT(*) AS n, SUM(amount) "
                               "AS s FROM visits WHERE amount < {k} GROUP BY user_id, store) GROUP BY store",
    "GROUP BY ~5,000 private keys": "SELECT zip, SUM(n), COUNT(*) FROM (SELECT user_id, zip, COUNT(*) AS n "
                                    "FROM visits WHERE amount < {k} GROUP BY user_id, zip) GROUP BY zip",
}
SMALL_TARGET = 0.005  # seconds end to end at 1,000 rows
GROUPED_TARGET, COPY_TARGET = 1.2, 2.0
SERVE_TARGET = (500.0, 0.050)  # queries/s, p99 seconds (small queries, 32 clients)


def constants():
    """A new filter constant per run (590 <= k < 600: keeps ~98% of rows, never the same text)."""
    for i in range(10**9):
        yield f"{590 + (i % 100_000) / 10_000:.4f}"
