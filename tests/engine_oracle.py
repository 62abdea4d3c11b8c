"""The brute-force sensitivity oracles' Spark leg (issue 22): the same plan, rendered for Spark.

``tests/test_sensitivity_oracle.py`` runs a plan's rewritten SQL on DuckDB over a base dataset and
every neighbour. Every neighbour on Spark would take minutes per query (three Spark jobs per
dataset), so the Spark leg runs the *same plan* rendered for Spark (``SparkEngine.dialect``: the
catalog's column types) on the base dataset and a few chosen neighbours: those attaining the
DuckDB maximum of every measure (unbounded: a unit against the base; bounded: a pair of units in
one slot), plus a few others (a unit of k + 1 rows, whose rows a salted hash chooses, and
non-finite or out-of-bounds values).

What is compared. The two engines keep the same rows only where no salted choice is made: their
keyed hashes differ (DuckDB's ``hash`` chain, Spark's ``xxhash64``), so a base unit with more than
k rows keeps different rows on each. A unit's contribution depends only on its own rows and the
salt (invariant 5), so the base's choice cancels in ``result(D + u) - result(D)``, the vector the
sensitivity bounds. So, per chosen neighbour:

* a unit whose rows need no choice (at most k rows, and one distinct row when MAX GROUPS PER UNIT
  could cut a group) moves every measure on Spark by exactly what it moves it by on DuckDB; on
  those, Spark's observed sensitivity is DuckDB's, which the DuckDB brute force showed equal to
  the analysed one;
* every chosen unit, choices included, moves every measure on Spark by at most the analysed L1
  and squared L2 (unbounded against the base, bounded between every two chosen units).

The cancellation needs a measure that adds up over units: a sum, a count, a quantile's bucket
counts. A distinct count does not (whether a unit's value is new depends on the values the base
kept), so COUNT(DISTINCT) runs on a base whose rows need no salted choice, the same on both engines.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable
from dataclasses import dataclass
from fractions import Fraction

from engines import forget_copies
from spark import session

from dpsql.analysis.analyse import analyse_query
from dpsql.analysis.check import check_query
from dpsql.backends.bounding import bounded_tables
from dpsql.backends.keys import read_keys
from dpsql.backends.rewrite import BoundedStatement
from dpsql.backends.spark import SparkEngine
from dpsql.backends.spark.types import spark_type
from dpsql.query.options import apply_contribution_options
from dpsql.sql.names import table_key
from dpsql.sql.parse import parse

SPARK_SALT = "5a" * 16
"""The Spark copies' salt (any fixed salt: the sensitivity argument holds for each)."""
DUCKDB_SALT = "fixed-test-salt"
"""The salt ``Oracle`` builds DuckDB's copies with."""
EXTRAS = 2
"""Chosen neighbours besides the maximal ones."""


@dataclass(frozen=True)
class Shape:
    """How a statement's rows become a result vector: ``{key: (value, ...)}``."""

    keys: int
    """Leading key columns (a histogram's bucket counts as one)."""
    width: int = 1
    """Value columns after the keys."""
    domain: tuple = ()
    """Keys every result has (0 where no row came back): the public domain."""


def _spark_value(value) -> str:
    if value is None:
        return "NULL"
    if isinstance(value, bool):
        return "TRUE" if value else "FALSE"
    if isinstance(value, float) and math.isnan(value):
        return "CAST('NaN' AS DOUBLE)"
    if isinstance(value, float) and math.isinf(value):
        return f"CAST('{'-' if value < 0 else ''}Infinity' AS DOUBLE)"
    return repr(float(value)) if isinstance(value, Fraction) else repr(value)


class SparkLeg:
    """The oracle's tables as views of the shared Spark session, read through Spark's bounded
    copies under ``policy`` (the oracle's unbounded-neighbours policy: both relations bound by the
    same copies)."""

    def __init__(self, type_name: str, policy):
        self.spark = session()
        forget_copies(self.spark)
        self.type_name = type_name
        self.spark.sql("SELECT * FROM VALUES ('a'), ('b') AS k(g)").createOrReplaceTempView("keys")
        self.spark.sql("SELECT * FROM VALUES ('a', 1), ('a', 2), ('b', 3) AS d(g, w)").createOrReplaceTempView("dup")
        self.load([(1, "a", None)])
        self.engine = SparkEngine(self.spark)
        self.catalog = self.engine.catalog()
        self.engine.prepare_bounding(bounded_tables(list(policy.private_tables), self.catalog, table_key),
                                     SPARK_SALT)

    def plan(self, sql: str, policy, options):
        """``sql``'s plan on Spark, made as a Spark connection makes it: checked against Spark's
        catalog (public relations stored on Spark, Spark's own refusals) and analysed."""
        parsed = parse(sql)
        query = check_query(parsed.tree, sql, policy, self.catalog, self.engine)
        self.engine.check(parsed.tree, True)
        return analyse_query(apply_contribution_options(query, parsed.options), policy, options)

    def load(self, rows: list[tuple]) -> None:
        """``t`` holding ``rows``, each value cast to its column's type (as DuckDB's INSERT casts)."""
        x_type = spark_type(self.type_name)
        values = ", ".join(f"(CAST({_spark_value(u)} AS INT), CAST({_spark_value(g)} AS STRING), "
                           f"CAST({_spark_value(x)} AS {x_type}))" for u, g, x in rows)
        self.spark.sql(f"SELECT * FROM VALUES {values} AS v(uid, g, x)").createOrReplaceTempView("t")

    def fetch(self, statement: Callable[[], BoundedStatement], rows: list[tuple], plan_keys) -> list[tuple]:
        """The rows of ``statement()`` (called after the new rows are in: a refresh drops the stored
        public relations) with ``rows`` in ``t``. The
        copies stay views, not cached: the same rows, one Spark job instead of three."""
        self.load(rows)
        self.engine.refresh_bounding()
        made = statement()
        fetched = self.engine.fetch(made.sql, {"salt": SPARK_SALT} if made.needs_salt else None)
        return read_keys(fetched, plan_keys, text=self.engine.key_text, value=self.engine.key_value)

    def close(self) -> None:
        self.engine.close()
        forget_copies(self.spark)
        for view in ("t", "keys", "dup"):
            self.spark.catalog.dropTempView(view)


def duckdb_fetch(oracle, statement: BoundedStatement, rows: list[tuple], plan_keys) -> list[tuple]:
    """``statement`` (rendered for DuckDB) on the oracle's DuckDB with ``rows`` in ``t``."""
    values = ", ".join(f"({sql_value(u)}, '{g}', {sql_value(x)})" for u, g, x in rows)
    oracle.connection.execute(f"DELETE FROM t; INSERT INTO t VALUES {values}")
    oracle.engine.refresh_bounding()
    fetched = oracle.engine.fetch(statement.sql, {"salt": DUCKDB_SALT} if statement.needs_salt else None,
                                  bounded=statement.bounded)
    return read_keys(fetched, plan_keys)


def sql_value(x) -> str:
    """``x`` as a DuckDB SQL literal (the oracles' rows: NULL, non-finite doubles, fractions)."""
    if x is None:
        return "NULL"
    if isinstance(x, float) and not math.isfinite(x):
        return f"'{x}'::DOUBLE"
    return repr(float(x)) if isinstance(x, Fraction) else repr(x)


def vector(rows: list[tuple], shape: Shape) -> dict[tuple, tuple[int, ...]]:
    """{key: exact values}; a NaN key as the string "NaN" (NaN is not equal to itself)."""
    result = {key: (0,) * shape.width for key in shape.domain}
    result.update({tuple(_comparable(v) for v in row[:shape.keys]): tuple(int(v or 0) for v in row[shape.keys:])
                   for row in rows})
    return result


def _comparable(value):
    return "NaN" if isinstance(value, float) and math.isnan(value) else value


def delta(a: dict, b: dict, index: int) -> dict[tuple, int]:
    """Column ``index`` of ``a - b`` over the union of keys (a missing key is 0), zeros left out."""
    moved = {}
    for key in set(a) | set(b):
        change = _at(a, key, index) - _at(b, key, index)
        if change:
            moved[key] = change
    return moved


def _at(result: dict, key: tuple, index: int) -> int:
    value = result.get(key)
    return 0 if value is None else value[index]


def norms(moved: dict) -> tuple[int, int]:
    return sum(abs(d) for d in moved.values()), sum(d * d for d in moved.values())


@dataclass(frozen=True)
class Column:
    """One measure the oracle bounds."""

    label: str
    analysed: dict
    """relation -> the analysed ``Sensitivity``."""
    tight: frozenset = frozenset()
    """(relation, norm: 0 for L1, 1 for squared L2) whose analysed bound the DuckDB brute force
    reaches, so Spark must reach it too."""


def choose(units: list[tuple], results: list[dict], base: dict, columns: list[Column],
           needs_choice: Callable[[tuple], bool], busiest_choice: bool = False) -> tuple[list[int], dict]:
    """Indices of the chosen units, and {(column, relation, norm): (DuckDB worst, units attaining it
    that need no salted choice, as a tuple of indices)}. ``busiest_choice``: also the unit needing a
    salted choice that moves the first measure most on DuckDB (the last such unit listed may have
    its rows outside the public domain, where the choice moves nothing)."""
    chosen: list[int] = []
    worst: dict = {}
    for index, column in enumerate(columns):
        unbounded = [norms(delta(r, base, index)) for r in results]
        for norm in (0, 1):
            top = max(d[norm] for d in unbounded)
            attaining = [u for u, d in enumerate(unbounded) if d[norm] == top]
            free = [u for u in attaining if not needs_choice(units[u])]
            worst[(index, "unbounded", norm)] = (top, (free[0],) if free else ())
            chosen.append((free or attaining)[0])
        if "bounded" not in column.analysed:
            continue
        pairs = {}
        for i, j in itertools.combinations(range(len(results)), 2):
            pairs[(i, j)] = norms(delta(results[i], results[j], index))
        for norm in (0, 1):
            top = max(d[norm] for d in pairs.values())
            attaining = [p for p, d in pairs.items() if d[norm] == top]
            free = [p for p in attaining if not (needs_choice(units[p[0]]) or needs_choice(units[p[1]]))]
            worst[(index, "bounded", norm)] = (top, free[0] if free else ())
            chosen.extend((free or attaining)[0])
    # A few others: the largest units (a salted hash chooses their rows) and the last ones listed.
    choices = [u for u in range(len(units)) if needs_choice(units[u])]
    others = choices[-EXTRAS // 2:] + list(range(len(units)))[-EXTRAS // 2:]
    if busiest_choice and choices:
        others.append(max(choices, key=lambda u: (norms(delta(results[u], base, 0))[0], u)))
    return sorted(set(chosen) | set(others)), worst


def check_spark_leg(label: str, units: list[tuple], duck: Callable[[tuple], dict], spark: Callable[[tuple], dict],
                    columns: list[Column], needs_choice: Callable[[tuple], bool],
                    base_needs_choice: bool = True, busiest_choice: bool = False) -> int:
    """Run the Spark leg (module docstring) and return how many measures' worst cases it
    reproduced exactly (the caller asserts there is at least one); ``busiest_choice`` as ``choose``."""
    duck_results = [duck(unit) for unit in units]
    duck_base = duck(())
    chosen, worst = choose(units, duck_results, duck_base, columns, needs_choice, busiest_choice)
    spark_base = spark(())
    if not base_needs_choice:
        assert spark_base == duck_base, f"{label}: the base differs: DuckDB {duck_base}, Spark {spark_base}"
    spark_results = {u: spark(units[u]) for u in chosen}
    reproduced = 0
    for index, column in enumerate(columns):
        tag = f"{label}/{column.label}"
        for u, result in spark_results.items():
            moved = delta(result, spark_base, index)
            if not needs_choice(units[u]):
                expected = delta(duck_results[u], duck_base, index)
                assert moved == expected, (f"{tag}: unit {units[u]} moves the measure by {moved} on Spark, "
                                           f"by {expected} on DuckDB")
            l1, l2 = norms(moved)
            analysed = column.analysed["unbounded"]
            assert l1 <= analysed.l1 and l2 <= analysed.l2_squared, \
                f"{tag}/unbounded: unit {units[u]} moves it by L1 {l1}, L2^2 {l2} on Spark > {analysed}"
        if "bounded" in column.analysed:
            analysed = column.analysed["bounded"]
            for u, v in itertools.combinations(spark_results, 2):
                l1, l2 = norms(delta(spark_results[u], spark_results[v], index))
                assert l1 <= analysed.l1 and l2 <= analysed.l2_squared, \
                    f"{tag}/bounded: units {units[u]}, {units[v]} move it by L1 {l1}, L2^2 {l2} on Spark > {analysed}"
        for relation in column.analysed:
            for norm in (0, 1):
                top, free = worst[(index, relation, norm)]
                if not free:
                    continue
                if relation == "unbounded":
                    observed = norms(delta(spark_results[free[0]], spark_base, index))[norm]
                else:
                    observed = norms(delta(spark_results[free[0]], spark_results[free[1]], index))[norm]
                assert observed == top, f"{tag}/{relation}: Spark's worst case {observed}, DuckDB's {top}"
                if (relation, norm) in column.tight:
                    bound = column.analysed[relation].l1 if norm == 0 else column.analysed[relation].l2_squared
                    assert observed == bound, f"{tag}/{relation}: Spark reaches {observed}, the proof says {bound}"
                reproduced += 1
    return reproduced
