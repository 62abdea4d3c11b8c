"""The grammar of the differential fuzzer: Hypothesis strategies for neighbouring cases.

Each *family* draws ``tests.differential.Case``s of one shape, so a family that fails today
can be marked on its own and turned back on once its bug is fixed:

* ``unit_level``: a private table with a unit column — plain, a row subquery, a CTE, UNION
  ALL, a per-unit subquery, a self-join on the unit; COUNT / SUM / AVG / VARIANCE /
  COUNT(DISTINCT) / quantiles / FILTER; public-domain and private (partition selection) keys;
  contribution options;
* ``row_level``: the same over a PRIVACY UNIT ROW table;
* ``public_join``: a private table joined to a public one on keys of the same type, with
  duplicated public keys (multiplicity m), grouped by private or public columns;
* ``coerced_join``: the same join with keys of different types, compared after DuckDB's implicit
  coercion: strings that cast ('1', '01', ' 1', 'x'), BIGINTs near 2^24 against FLOAT and near
  2^53 against DOUBLE, DECIMAL against DOUBLE, DATE against TIMESTAMP and VARCHAR;
* ``row_level_join``: a PRIVACY UNIT ROW table joined to a public table;
* ``public_subquery``: a public subquery in FROM joined to private data: filtered, fanned out by
  the analyst (a public self-join), or depending on the statement that evaluates it;
* ``typed_keys``: GROUP BY private keys of many DuckDB types (INTERVAL, TIMESTAMP_NS, infinite
  TIMESTAMPs, NaN and -0.0 DOUBLEs, HUGEINT, UUID, DECIMAL(38, s), collated VARCHAR, ...), or
  expressions of them;
* ``key_domains``: GROUP BY a column whose KEYS list (or KEYS FROM column) is typed like it, or not;
* ``extreme_bounds``: huge and tiny BOUNDS with epsilons down to 1e-8;
* ``identity`` (issue 21): units of admitted types whose added unit collides with a base unit
  under DuckDB's equality in some other way (a NOCASE collation, MAX STRING LENGTH 3 cutting
  'abc1' and 'abc9' alike, BIGINTs equal as DOUBLEs, TIMESTAMP_NS one nanosecond apart), and
  collision columns (``TWINS``) whose values come in classes DuckDB takes for one value: -0.0
  and 0.0, nan and -nan at top level and inside lists and structs, '1 month', '30 days' and
  '720 hours', 'a' and 'A' under NOCASE, nanoseconds; the unit's rows are often twins of base
  rows. Queries read the canonical text (``CAST(x AS VARCHAR) = '-nan'``, ``LIKE '-%'``), DuckDB's
  equality, GROUP BY the text, the value, x (public KEYS) or the column (KEYS FROM a public
  table of twins), COUNT(DISTINCT uid), with MAX GROUPS PER UNIT below MAX ROWS PER UNIT. The
  databases live in memory or in a file with its writes in the WAL, and the unit's rows are
  stored after the base rows or before them;
* ``identity_row``: the same over a PRIVACY UNIT ROW table: the added row is a twin of a base row.

Neighbours: add or remove one unit (``NEIGHBOURS UNBOUNDED``) or replace it (``BOUNDED``); the
unit draws from adversarial values — NULLs, NaN and infinities, values that fail casts, keys
with a large fan-out, keys only it has — and may have more rows than it is allowed.
"""

from __future__ import annotations

from dataclasses import dataclass

from differential import STORAGES, Case, Table
from hypothesis import strategies as st

UNIT_ID = "99"
"""The adversarial unit's id (its replacement keeps the same slot)."""
KEYS_TABLE = Table("keys", (("g", "VARCHAR"),), (("'a'",), ("'b'",), ("'c'",)))
KEYS_FROM = "KEYS FROM keys.g"


@dataclass(frozen=True)
class Column:
    """A column of the private table and the SQL literals its rows draw from."""

    name: str
    type: str
    values: tuple[str, ...]
    """What base rows hold."""
    adversarial: tuple[str, ...] = ()
    """What only the adversarial unit may hold besides ``values``."""


@dataclass(frozen=True)
class Source:
    """A FROM clause and the roles its columns play in a query."""

    sql: str
    value: str = "x"
    """A column with bounds (summed, averaged, ...)."""
    key: str | None = "g"
    """A column with a public key domain, if any."""
    private_key: str | None = "x"
    """A column without one (grouping by it needs partition selection), if any."""
    unit: str | None = "uid"
    """The privacy unit column, if it is a column."""
    with_: str = ""
    """A WITH clause the FROM clause reads."""


X_INTEGER = Column("x", "INTEGER", ("-2", "0", "1", "3", "NULL"), ("100", "-7", "2147483647"))
X_DOUBLE = Column("x", "DOUBLE", ("0.5", "1.0", "2.5", "NULL"),
                  ("'nan'::DOUBLE", "'inf'::DOUBLE", "'-inf'::DOUBLE", "1e300", "-0.0", "7.25"))
G_VARCHAR = Column("g", "VARCHAR", ("'a'", "'b'", "'c'"), ("NULL", "'zz'", "'A'"))
BOUNDS = {"INTEGER": ("-2 TO 3", "0 TO 10", "1 TO 4"), "DOUBLE": ("0.5 TO 2.5", "-1 TO 1", "0 TO 10")}

# ------------------------------------------------------------------------------------------
# Parts every family shares.


def policy_text(*, neighbours: str, row_level: bool, k: int, groups: int | None, rules: list[str],
                public: tuple[Table, ...]) -> str:
    unit = "PRIVACY UNIT ROW" if row_level else f"PRIVACY UNIT uid, MAX ROWS PER UNIT {k}"
    limits = "" if groups is None or row_level else f", MAX GROUPS PER UNIT {groups}"
    items = ", ".join([unit + limits, *rules])
    publics = " ".join(f"PUBLIC TABLE {table.name};" for table in public)
    return (f"BUDGET EPSILON 1000000000 DELTA 0.9; NEIGHBOURS {neighbours.upper()}; QUERY EPSILON 1 DELTA 1e-6; "
            f"PRIVATE TABLE t ({items}); {publics}")


def _row(draw, columns: tuple[Column, ...], unit: str | None, adversarial: bool) -> tuple[str, ...]:
    """A row of literals; the adversarial unit draws two thirds of its values from the
    adversarial pools."""
    values = tuple(draw(st.sampled_from(c.adversarial if adversarial and c.adversarial and draw(st.integers(0, 2))
                                        else c.values)) for c in columns)
    return values if unit is None else (unit, *values)


@st.composite
def _base_rows(draw, columns: tuple[Column, ...], row_level: bool) -> tuple[tuple[str, ...], ...]:
    count = draw(st.integers(2, 7))
    return tuple(_row(draw, columns, None if row_level else str(draw(st.integers(1, 4))), False)
                 for _ in range(count))


@st.composite
def _unit_rows(draw, columns: tuple[Column, ...], row_level: bool, k: int) -> tuple[tuple[str, ...], ...]:
    """One privacy unit: a single row when each row is a unit, else up to k + 2 rows — often
    one row repeated, which concentrates all it can contribute on one key."""
    count = 1 if row_level else draw(st.integers(1, k + 2))
    if draw(st.booleans()):
        return (_row(draw, columns, None if row_level else UNIT_ID, True),) * count
    return tuple(_row(draw, columns, None if row_level else UNIT_ID, True) for _ in range(count))


@st.composite
def assemble(draw, family: str, columns: tuple[Column, ...], rules: list[str], public: tuple[Table, ...],
             query: st.SearchStrategy, row_level: bool | None = None) -> Case:
    """A case from the private table's columns, its policy rules, public tables and a query
    strategy (drawn with the policy's shape: ``query(row_level, k)`` gives (sql, key count))."""
    row_level = draw(st.booleans()) if row_level is None else row_level
    k = 1 if row_level else draw(st.integers(1, 3))
    groups = draw(st.sampled_from([None, 1, 2]))
    neighbours = draw(st.sampled_from(["unbounded", "bounded"]))
    sql, keys = draw(query(row_level, k))
    definition = (() if row_level else (("uid", "INTEGER"),)) + tuple((c.name, c.type) for c in columns)
    private = Table("t", definition, draw(_base_rows(columns, row_level)))
    unit = draw(_unit_rows(columns, row_level, k))
    replacement = draw(_unit_rows(columns, row_level, k)) if neighbours == "bounded" else None
    policy = policy_text(neighbours=neighbours, row_level=row_level, k=k, groups=groups, rules=rules, public=public)
    return Case(family, policy, sql, private, unit, public, replacement, keys)


def _aggregates(source: Source, row_level: bool) -> st.SearchStrategy:
    v = source.value
    choices = ["COUNT(*)", f"COUNT({v})", f"SUM({v})", f"AVG({v})", f"VARIANCE({v})", f"MEDIAN({v})",
               f"QUANTILE_CONT({v}, 0.9)", f"MIN({v})", f"COUNT(DISTINCT {v})", f"SUM(CLAMP({v} * 2, -3, 5))"]
    if source.key is not None:
        choices.append(f"SUM({v}) FILTER (WHERE {source.key} = 'a')")
    if source.unit is not None and not row_level:
        choices.append(f"COUNT(DISTINCT {source.unit})")
    return st.lists(st.sampled_from(choices), min_size=1, max_size=3, unique=True)


def _options(row_level: bool, k: int, epsilons: tuple[str, ...] = ()) -> st.SearchStrategy:
    parts = st.lists(st.sampled_from(["max_groups_contributed = 1", "max_groups_contributed = 2",
                                      "max_rows_contributed = 1"]
                                     + ([f"max_rows_contributed = {k}"] if not row_level else [])
                                     + [f"epsilon = {e}" for e in epsilons]), max_size=2, unique_by=lambda p: p[:8])
    return parts.map(lambda chosen: f"WITH DIFFERENTIAL_PRIVACY OPTIONS ({', '.join(chosen)}) " if chosen else "")


@st.composite
def select(draw, source: Source, row_level: bool, k: int, epsilons: tuple[str, ...] = (),
           aggregates: st.SearchStrategy | None = None) -> tuple[str, int]:
    """SELECT [options] keys, aggregates FROM source [WHERE] [GROUP BY keys]: (sql, key count)."""
    candidates = [key for key in (source.key, source.private_key) if key is not None]
    keys = draw(st.lists(st.sampled_from(candidates), max_size=2, unique=True)) if candidates else []
    items = keys + draw(aggregates if aggregates is not None else _aggregates(source, row_level))
    sql = f"{source.with_}SELECT {draw(_options(row_level, k, epsilons))}{', '.join(items)} FROM {source.sql}"
    where = draw(st.sampled_from(["", f" WHERE {source.value} > 0", f" WHERE {source.value} IS NOT NULL"]
                                 + ([f" WHERE {source.key} <> 'b'"] if source.key else [])))
    group = f" GROUP BY {', '.join(keys)}" if keys else ""
    return sql + where + group, len(keys)


# ------------------------------------------------------------------------------------------
# The families.


def _plain_sources(row_level: bool) -> list[Source]:
    sources = [Source("t"), Source("(SELECT *, x AS y FROM t WHERE x > -1) AS s", value="y", private_key="y"),
               Source("s", with_="WITH s AS (SELECT *, 2 * x AS z FROM t WHERE g <> 'c') ", value="z",
                      private_key="z")]
    if row_level:
        return [replace_unit(s, None) for s in sources]
    return sources + [
        Source("(SELECT uid, g, x FROM t UNION ALL SELECT uid, g, x FROM t WHERE x > 0) AS s", key=None,
               private_key="g"),
        Source("(SELECT uid, COUNT(*) AS n, SUM(x) AS x FROM t GROUP BY uid) AS s", key=None, private_key="n"),
        Source("(SELECT uid, g, AVG(x) AS x FROM t GROUP BY uid, g) AS s", private_key=None),
        Source("t AS a JOIN t AS b ON a.uid = b.uid", value="a.x", key="a.g", private_key="b.x", unit="a.uid"),
    ]


def replace_unit(source: Source, unit: str | None) -> Source:
    return Source(source.sql, source.value, source.key, source.private_key, unit, source.with_)


def _plain(family: str, row_level: bool) -> st.SearchStrategy:
    @st.composite
    def draw_case(draw) -> Case:
        x = draw(st.sampled_from([X_INTEGER, X_DOUBLE]))
        rules = [f"x BOUNDS {draw(st.sampled_from(BOUNDS[x.type]))}", f"g {KEYS_FROM}"]
        def query(row, k):
            return st.sampled_from(_plain_sources(row)).flatmap(lambda s: select(s, row, k))

        return draw(assemble(family, (G_VARCHAR, x), rules, (KEYS_TABLE,), query, row_level=row_level))
    return draw_case()


def unit_level() -> st.SearchStrategy:
    return _plain("unit_level", row_level=False)


def row_level() -> st.SearchStrategy:
    return _plain("row_level", row_level=True)


JOIN_TYPES = {
    # (private join column, public id column): private values, public ids (repeats give multiplicity)
    "same_integer": (Column("c", "INTEGER", ("1", "2", "3"), ("NULL", "4", "1")), "INTEGER", ("1", "1", "2", "3")),
    "same_varchar": (Column("c", "VARCHAR", ("'1'", "'2'"), ("NULL", "'01'", "'x'")), "VARCHAR", ("'1'", "'1'", "'2'")),
}
COERCED_JOIN_TYPES = {
    "varchar_integer": (Column("c", "VARCHAR", ("'1'", "'2'", "'3'"), ("'01'", "' 1'", "'x'", "'1.0'", "NULL")),
                        "INTEGER", ("1", "2", "2", "3")),
    "integer_varchar": (Column("c", "INTEGER", ("1", "2"), ("3", "NULL")), "VARCHAR", ("'1'", "'01'", "' 1'", "'2'")),
    "bigint_float": (Column("c", "BIGINT", ("16777216", "5"), ("16777217", "16777218", "16777219")),
                     "FLOAT", ("16777216", "16777218", "5")),
    "float_bigint": (Column("c", "FLOAT", ("16777216", "5"), ("16777218",)),
                     "BIGINT", ("16777216", "16777217", "16777215", "5")),
    "double_bigint": (Column("c", "DOUBLE", ("9007199254740992", "7"), ("9007199254740994",)),
                      "BIGINT", ("9007199254740992", "9007199254740993", "7")),
    "decimal_double": (Column("c", "DECIMAL(18, 3)", ("0.100", "1.000"), ("0.300",)),
                       "DOUBLE", ("0.1", "1.0", "0.30000000000000004", "0.3")),
    "date_timestamp": (Column("c", "DATE", ("'2020-01-01'", "'2020-01-02'"), ("'infinity'", "NULL")),
                       "TIMESTAMP", ("'2020-01-01 00:00:00'", "'2020-01-01 12:00:00'", "'2020-01-02'")),
    "varchar_date": (Column("c", "VARCHAR", ("'2020-01-01'",), ("'2020-1-1'", "'x'", "' 2020-01-01'")),
                     "DATE", ("'2020-01-01'", "'2020-01-01'", "'2020-01-02'")),
}


def _public_table(id_type: str, ids: tuple[str, ...]) -> Table:
    rows = tuple((value, str(index % 3 + 1)) for index, value in enumerate(ids))
    return Table("p", (("id", id_type), ("w", "INTEGER")), rows)


def _join_sources(row_level: bool) -> list[Source]:
    unit = None if row_level else "t.uid"
    return [
        Source("t JOIN p ON t.c = p.id", value="t.x", key="t.g", private_key="p.w", unit=unit),
        Source("t JOIN p ON t.c = p.id", value="p.w", key="p.w", private_key="t.x", unit=unit),
        Source("t LEFT JOIN p ON t.c = p.id", value="t.x", key="t.g", private_key="t.c", unit=unit),
        Source("p JOIN t ON p.id = t.c", value="t.x", key=None, private_key="t.c", unit=unit),
    ]


def _cast_sources(row_level: bool, private_type: str, public_type: str) -> list[Source]:
    """The mismatched join written as the refusal's hint says: one side CAST to the other's
    type — a private cast that fails (the adversary's 'x') must match nothing, not raise."""
    unit = None if row_level else "t.uid"
    private_side = private_type.split(" COLLATE")[0]
    return [
        Source(f"t JOIN p ON CAST(t.c AS {public_type}) = p.id", value="t.x", key="t.g", private_key="p.w", unit=unit),
        Source(f"t JOIN p ON t.c = CAST(p.id AS {private_side})", value="t.x", key="t.g", private_key="t.c", unit=unit),
        Source(f"t LEFT JOIN p ON TRY_CAST(t.c AS {public_type}) = p.id", value="p.w", key="t.g", private_key="t.x",
               unit=unit),
    ]


def _join_family(family: str, types: dict, row_level: bool | None, casts: bool = False) -> st.SearchStrategy:
    @st.composite
    def draw_case(draw) -> Case:
        column, id_type, ids = types[draw(st.sampled_from(sorted(types)))]
        rules = ["x BOUNDS 0 TO 10", f"g {KEYS_FROM}"]
        public = (KEYS_TABLE, _public_table(id_type, ids))
        x = Column("x", "INTEGER", ("0", "1", "10"), ("NULL", "50"))

        def sources(row: bool) -> list[Source]:
            return _join_sources(row) + (_cast_sources(row, column.type, id_type) if casts else [])

        def query(row, k):
            return st.sampled_from(sources(row)).flatmap(lambda s: select(s, row, k))

        return draw(assemble(family, (G_VARCHAR, x, column), rules, public, query, row_level=row_level))
    return draw_case()


def public_join() -> st.SearchStrategy:
    return _join_family("public_join", JOIN_TYPES, row_level=False)


def coerced_join() -> st.SearchStrategy:
    return _join_family("coerced_join", COERCED_JOIN_TYPES, row_level=False, casts=True)


def row_level_join() -> st.SearchStrategy:
    return _join_family("row_level_join", JOIN_TYPES, row_level=True)


PUBLIC_SUBQUERIES = (
    "(SELECT id, w FROM p WHERE w > 1) AS q",
    "(SELECT a.id, a.w FROM p AS a JOIN p AS b ON a.w <= b.w) AS q",
    "(SELECT a.id, b.w FROM p AS a CROSS JOIN p AS b) AS q",
    "(SELECT id, w FROM p WHERE length(current_query()) > 400) AS q",
    "(SELECT id, w FROM p WHERE strpos(current_query(), 'dp_' || 'rows') > 0) AS q",
)


def public_subquery() -> st.SearchStrategy:
    @st.composite
    def draw_case(draw) -> Case:
        column, id_type, ids = JOIN_TYPES["same_integer"]
        subquery = draw(st.sampled_from(PUBLIC_SUBQUERIES))
        source = Source(f"t JOIN {subquery} ON t.c = q.id", value="t.x", key="t.g", private_key="q.w", unit="t.uid")
        x = Column("x", "INTEGER", ("0", "1", "10"), ("NULL",))
        rules = ["x BOUNDS 0 TO 10", f"g {KEYS_FROM}"]
        public = (KEYS_TABLE, _public_table(id_type, ids))
        def query(row, k):
            return select(source, row, k)

        return draw(assemble("public_subquery", (G_VARCHAR, x, column), rules, public, query, row_level=False))
    return draw_case()


KEY_TYPES = {
    "INTERVAL": ("INTERVAL 1 MONTH", "INTERVAL 2 DAY"),
    "TIMESTAMP_NS": ("'2020-01-01 00:00:00.000000001'::TIMESTAMP_NS", "'2020-01-01'::TIMESTAMP_NS"),
    "TIMESTAMP": ("'2020-01-01'::TIMESTAMP", "'2021-06-01 10:00:00'::TIMESTAMP"),
    "DOUBLE": ("0.0", "1.5", "'nan'::DOUBLE"), "HUGEINT": ("1", "170141183460469231731687303715884105727"),
    "UUID": ("'00000000-0000-0000-0000-000000000001'", "'ffffffff-ffff-ffff-ffff-ffffffffffff'"),
    "DECIMAL(38, 10)": ("0.0000000001", "1234567890123456789012345678.0123456789"),
    "VARCHAR COLLATE NOCASE": ("'a'", "'b'"), "DATE": ("'2020-01-01'", "'1999-12-31'"),
    "TIME": ("'00:00:00'", "'12:30:00'"), "BOOLEAN": ("TRUE", "FALSE"), "BIGINT": ("1", "9223372036854775807"),
}
ADVERSARIAL_KEYS = {
    "INTERVAL": ("INTERVAL 1000000000 MONTH", "INTERVAL 30 DAY", "INTERVAL 1 MICROSECOND"),
    "TIMESTAMP_NS": ("'2020-01-01 00:00:00.000000002'::TIMESTAMP_NS", "'2020-01-01 00:00:00.000001'::TIMESTAMP_NS"),
    "TIMESTAMP": ("'infinity'::TIMESTAMP", "'-infinity'::TIMESTAMP", "'290000-01-01'::TIMESTAMP"),
    "DOUBLE": ("-0.0", "'-nan'::DOUBLE", "'inf'::DOUBLE", "1e308"),
    "HUGEINT": ("-170141183460469231731687303715884105728", "18446744073709551616"),
    "UUID": ("'80000000-0000-0000-0000-000000000000'",),
    "DECIMAL(38, 10)": ("-9999999999999999999999999999.9999999999", "0.0000000002"),
    "VARCHAR COLLATE NOCASE": ("'A'", "'B'", "'a '"), "DATE": ("'infinity'", "'-infinity'", "'5877642-06-25 (BC)'"),
    "TIME": ("'24:00:00'",), "BOOLEAN": ("NULL",), "BIGINT": ("-9223372036854775808",),
}


KEY_EXPRESSIONS = ("k", "COALESCE(k, k)", "CAST(k AS VARCHAR)", "k IS NULL")
"""What typed_keys groups by: the key itself, an expression of its type, its text, a boolean."""


def typed_keys() -> st.SearchStrategy:
    @st.composite
    def draw_case(draw) -> Case:
        type_name = draw(st.sampled_from(sorted(KEY_TYPES)))
        key = Column("k", type_name, KEY_TYPES[type_name], ADVERSARIAL_KEYS[type_name])
        x = Column("x", "INTEGER", ("0", "1", "3"), ("NULL", "9"))
        source = Source("t", value="x", key=None, private_key=draw(st.sampled_from(KEY_EXPRESSIONS)))
        aggregates = st.lists(st.sampled_from(["COUNT(*)", "SUM(x)", "AVG(x)", "MEDIAN(x)", "COUNT(DISTINCT x)"]),
                              min_size=1, max_size=2, unique=True)
        def query(row, k):
            return select(source, row, k, aggregates=aggregates).filter(lambda q: q[1] > 0)

        return draw(assemble("typed_keys", (key, x), ["x BOUNDS 0 TO 5"], (), query))
    return draw_case()


KEY_DOMAINS = {
    # column type: (values, adversarial values, KEYS lists typed like the column or not)
    "VARCHAR": (("'1'", "'2'", "'1'", "'b'"), ("'01'", "'x'", "NULL", "' 1'", "'a'"),
                ("KEYS ('a', 'b')", "KEYS (1, 2, 3)", "KEYS ('1', 'b')", "KEYS FROM ids.id")),
    "INTEGER": (("1", "2"), ("3", "NULL", "-1"),
                ("KEYS (1, 2)", "KEYS ('1', '2')", "KEYS (1.5, 2)", "KEYS FROM keys.g")),
    "DATE": (("'2020-01-01'", "'2020-01-02'"), ("'infinity'", "NULL"),
             ("KEYS ('2020-01-01', '2020-01-02')", "KEYS (20200101, 2)", "KEYS FROM keys.g")),
    "DOUBLE": (("0.5", "1.0"), ("-0.0", "0.0", "'nan'::DOUBLE", "NULL"), ("KEYS (0.5, 1, 0)", "KEYS ('0.5', 'nan')")),
}
IDS_TABLE = Table("ids", (("id", "INTEGER"),), (("1",), ("2",)))


def key_domains() -> st.SearchStrategy:
    @st.composite
    def draw_case(draw) -> Case:
        type_name = draw(st.sampled_from(sorted(KEY_DOMAINS)))
        values, adversarial, domains = KEY_DOMAINS[type_name]
        key = Column("g", type_name, values, adversarial)
        x = Column("x", "INTEGER", ("0", "1", "3"), ("NULL", "9"))
        rules = ["x BOUNDS 0 TO 5", f"g {draw(st.sampled_from(domains))}"]
        source = Source("t", value="x", key="g", private_key=None)
        def query(row, k):
            return select(source, row, k).filter(lambda q: q[1] > 0)

        return draw(assemble("key_domains", (key, x), rules, (KEYS_TABLE, IDS_TABLE), query))
    return draw_case()


EXTREME_COLUMNS = {
    # column type: (values, adversarial values: far beyond any bound, or just at a large one)
    "DOUBLE": (("0", "1", "0.5", "NULL"), ("1e300", "-1e300", "'nan'::DOUBLE", "'inf'::DOUBLE")),
    "BIGINT": (("0", "1", "2", "NULL"), ("9223372036854775807", "-9223372036854775808", "1000000000000000000")),
    "DECIMAL(38, 10)": (("0", "1", "0.5", "NULL"), ("9999999999999999999999999999.9999999999",
                                                    "-9999999999999999999999999999.9999999999", "1000000000000.5")),
    "HUGEINT": (("0", "1", "2", "NULL"), ("170141183460469231731687303715884105727",
                                          "-170141183460469231731687303715884105727", "1000000000000000000")),
}


EXTREME_EXPONENTS = (-9, -6, -3, -1, 0, 6, 12, 13, 15, 17, 18, 19, 24, 30)
"""Bounds up to 10**e: below one (clamps in DECIMAL), around 2**53 and 2**63, beyond BIGINT."""
EXTREME_AGGREGATES = ("SUM(x)", "AVG(x)", "VARIANCE(x)", "STDDEV(x)", "MEDIAN(x)", "SUM(x) FILTER (WHERE g = 'a')",
                      "COUNT(x)", "SUM(CLAMP(x * 2, -3, 5))")


@st.composite
def _extreme_bounds(draw) -> str:
    """Bounds from 1e-9 to 1e30 wide, one-signed or symmetric."""
    upper = f"1e{draw(st.sampled_from(EXTREME_EXPONENTS))}"
    return f"{draw(st.sampled_from(['0', '-' + upper]))} TO {upper}"


def extreme_bounds() -> st.SearchStrategy:
    @st.composite
    def draw_case(draw) -> Case:
        type_name = draw(st.sampled_from(sorted(EXTREME_COLUMNS)))
        x = Column("x", type_name, *EXTREME_COLUMNS[type_name])
        rules = [f"x BOUNDS {draw(_extreme_bounds())}", f"g {KEYS_FROM}"]
        source = Source("t", private_key=None)
        epsilons = tuple(f"1e-{n}" for n in range(1, 9))
        aggregates = st.lists(st.sampled_from(EXTREME_AGGREGATES), min_size=1, max_size=3, unique=True)
        def query(row, k):
            return select(source, row, k, epsilons=epsilons, aggregates=aggregates)

        return draw(assemble("extreme_bounds", (G_VARCHAR, x), rules, (KEYS_TABLE,), query))
    return draw_case()


# ------------------------------------------------------------------------------------------
# Identity (issue 21): the added unit or row collides with existing ones under DuckDB's equality,
# a collation, a cut or a conversion, but not in its canonical encoding.


@dataclass(frozen=True)
class Probe:
    """An expression of a column that the identity families' queries read."""

    sql: str
    texts: tuple[str, ...]
    """Canonical texts its values may have (``CAST(sql AS VARCHAR) = text``)."""
    literals: tuple[str, ...] = ()
    """Literals of its type to compare it with by DuckDB's equality (none: not a scalar, so
    neither compared nor grouped by itself)."""


@dataclass(frozen=True)
class Twins:
    """A column of the identity families: classes of values that DuckDB's equality (or the bounded
    copy's string cut, or the microseconds of a Python conversion) takes for one value and an
    analyst can tell apart."""

    name: str
    type: str
    classes: tuple[tuple[str, ...], ...]
    probes: tuple[Probe, ...]

    @property
    def values(self) -> tuple[str, ...]:
        return tuple(value for members in self.classes for value in members)

    @property
    def scalar(self) -> bool:
        return bool(self.probes[0].literals)


DOUBLES = ("'0.0'::DOUBLE", "'-0.0'::DOUBLE", "'nan'::DOUBLE", "'-nan'::DOUBLE")
"""A bare -0.0 is DECIMAL 0 and loses its sign: signed floats are written as casts of text."""
DOUBLE_TEXTS = ("-nan", "nan", "-0.0", "0.0")
INTERVALS = ("INTERVAL '1 month'", "INTERVAL '30 days'", "INTERVAL '720 hours'", "INTERVAL '1 day'",
             "INTERVAL '24 hours'", "INTERVAL '1 microsecond'")
"""'1 month', '30 days' and '720 hours' are equal; '1 microsecond' has their hash()."""
INTERVAL_TEXTS = ("1 month", "30 days", "720:00:00", "1 day", "24:00:00", "00:00:00.000001")


def _ns(fraction: str) -> str:
    return f"'2020-01-01 00:00:00{fraction}'::TIMESTAMP_NS"


TWINS = {
    "d": Twins("d", "DOUBLE", ((*DOUBLES[:2], "-0.0"), DOUBLES[2:], ("1.5",), ("NULL",)),
               (Probe("d", DOUBLE_TEXTS, DOUBLES),)),
    "l": Twins("l", "DOUBLE[]", (("['0.0'::DOUBLE]", "['-0.0'::DOUBLE]"), ("['nan'::DOUBLE]", "['-nan'::DOUBLE]"),
                                 ("[1.5, 'nan'::DOUBLE]", "[1.5, '-nan'::DOUBLE]"), ("[NULL]", "NULL")),
               (Probe("l", ("[-nan]", "[nan]", "[-0.0]", "[0.0]", "[1.5, -nan]")),
                Probe("l[1]", DOUBLE_TEXTS, DOUBLES), Probe("l[2]", DOUBLE_TEXTS, DOUBLES))),
    "s": Twins("s", "STRUCT(a DOUBLE, i INTERVAL)",
               (("{'a': 'nan'::DOUBLE, 'i': INTERVAL '1 month'}", "{'a': '-nan'::DOUBLE, 'i': INTERVAL '30 days'}",
                 "{'a': '-nan'::DOUBLE, 'i': INTERVAL '1 month'}", "{'a': 'nan'::DOUBLE, 'i': INTERVAL '720 hours'}"),
                ("{'a': '-0.0'::DOUBLE, 'i': NULL}", "{'a': '0.0'::DOUBLE, 'i': NULL}"), ("NULL",)),
               (Probe("s", ("{'a': -nan, 'i': 30 days}", "{'a': nan, 'i': 1 month}", "{'a': -0.0, 'i': NULL}")),
                Probe("s.a", DOUBLE_TEXTS, DOUBLES), Probe("s.i", INTERVAL_TEXTS, INTERVALS))),
    "i": Twins("i", "INTERVAL", ((*INTERVALS[:3], INTERVALS[5]), INTERVALS[3:5], ("NULL",)),
               (Probe("i", INTERVAL_TEXTS, INTERVALS),)),
    "c": Twins("c", "VARCHAR COLLATE NOCASE",
               (("'a'", "'A'"), ("'b'", "'B'"), ("'abc1'", "'ABC1'", "'abc2'"), ("NULL",)),
               (Probe("c", ("a", "A", "abc1", "ABC1", "abc"), ("'a'", "'A'", "'abc1'")),)),
    "ts": Twins("ts", "TIMESTAMP_NS", ((_ns(".000000001"), _ns(".000000002"), _ns("")),
                                       (_ns(".000001"), _ns(".000001001")), ("NULL",)),
                (Probe("ts", ("2020-01-01 00:00:00.000000001", "2020-01-01 00:00:00", "2020-01-01 00:00:00.000001"),
                       (_ns(".000000001"), _ns(""))),)),
    "v": Twins("v", "VARCHAR", (("'abc1'", "'abc2'", "'abc'"), ("'ab'", "'ab '"), ("NULL",)),
               (Probe("v", ("abc1", "abc", "ab"), ("'abc1'", "'abc'")),)),
}
"""Name -> the identity families' collision columns (each case draws one to three of them)."""
X_SMALL = Column("x", "INTEGER", ("0", "1", "2", "3", "NULL"), ("9", "-1"))


@dataclass(frozen=True)
class UnitIds:
    """A privacy unit column of an admitted type: the base units' ids, and the added unit's, which
    DuckDB's equality under a collation, the string limit or a conversion would take for one of
    them (it never equals one)."""

    type: str
    ids: tuple[str, ...]
    adversarial: tuple[str, ...]
    string_length: tuple[int | None, ...] = (None, 3)
    """MAX STRING LENGTH choices."""


UNIT_IDS = {
    "integer": UnitIds("INTEGER", ("1", "2", "3"), ("99",)),
    # 2^53 + 1 and 2^53 are one DOUBLE
    "bigint": UnitIds("BIGINT", ("1", "9007199254740993"), ("9007199254740992",)),
    # one prefix under MAX STRING LENGTH 3
    "long_ids": UnitIds("VARCHAR", ("'abc1'", "'abc2'", "'ab'"), ("'abc9'", "'abc'", "'abc1 '"), (3,)),
    "nocase": UnitIds("VARCHAR COLLATE NOCASE", ("'a'", "'B'", "'abc1'"), ("'A'", "'b'", "'ABC1'", "'abc2'")),
    # one microsecond
    "timestamp_ns": UnitIds("TIMESTAMP_NS", (_ns(".000000001"), _ns("")), (_ns(".000000002"), _ns(".000000999"))),
}


def _twin(draw, column: Twins, value: str) -> str:
    """Another value of ``value``'s class when it has one."""
    members = next(c for c in column.classes if value in c)
    others = [m for m in members if m != value]
    return draw(st.sampled_from(others)) if others else value


def _identity_row(draw, columns: tuple[Twins, ...], twin_of: tuple[str, ...] | None,
                  adversarial: bool) -> tuple[str, ...]:
    """A row of the collision columns and x: fresh, or (two times in three per value, x kept as
    well) the twin of ``twin_of`` — equal under DuckDB's equality, not identical."""
    values = []
    for index, column in enumerate(columns):
        if twin_of is not None and draw(st.integers(0, 2)):
            values.append(_twin(draw, column, twin_of[index]))
        else:
            values.append(draw(st.sampled_from(column.values)))
    if twin_of is not None and draw(st.integers(0, 2)):
        return (*values, twin_of[-1])
    x_pool = X_SMALL.adversarial if adversarial and X_SMALL.adversarial and not draw(st.integers(0, 2)) \
        else X_SMALL.values
    return (*values, draw(st.sampled_from(x_pool)))


def _identity_base(draw, columns: tuple[Twins, ...], ids: tuple[str, ...]) -> tuple[tuple[str, ...], ...]:
    """2 to 7 base rows (led by their unit's id when ``ids``); one in three is the twin of an
    earlier row, in the same unit: two rows the copy must tell apart by their exact identity."""
    rows: list[tuple[str, ...]] = []
    for _ in range(draw(st.integers(2, 7))):
        if rows and not draw(st.integers(0, 2)):
            earlier = draw(st.sampled_from(rows))
            twin = _identity_row(draw, columns, earlier[1:] if ids else earlier, False)
            rows.append((earlier[0], *twin) if ids else twin)
        else:
            row = _identity_row(draw, columns, None, False)
            rows.append((draw(st.sampled_from(ids)), *row) if ids else row)
    return tuple(rows)


@st.composite
def _identity_query(draw, columns: tuple[Twins, ...], row_level: bool, k: int, x_keys: bool,
                    domain: bool) -> tuple[str, int]:
    """SELECT [options] [key,] aggregates FROM t [WHERE ...] [GROUP BY key] over one probe of the
    first collision column: WHERE its text, its sign, DuckDB's equality; GROUP BY its text, its
    value, x (public KEYS), the column itself (public KEYS FROM a table of twins)."""
    column = columns[0]
    probe = draw(st.sampled_from(column.probes))
    e, text = probe.sql, f"CAST({probe.sql} AS VARCHAR)"
    quoted = [_literal(t) for t in probe.texts]
    conditions = [f"{text} = {draw(st.sampled_from(quoted))}", f"{text} LIKE '-%'", f"{text} LIKE '%-%'",
                  f"{e} IS NULL", f"{text} <> {draw(st.sampled_from(quoted))}"]
    if probe.literals:
        conditions.append(f"{e} = {draw(st.sampled_from(probe.literals))}")
    condition = draw(st.sampled_from(conditions))
    keys = [text] + ([e] if probe.literals else []) + ["x"]
    if domain:
        keys.append(column.name)
    key = draw(st.sampled_from([None, *keys]))
    aggregates = ["COUNT(*)", f"COUNT({e})", "SUM(x)", "AVG(x)", "MEDIAN(x)", f"COUNT(DISTINCT {text})",
                  f"SUM(x) FILTER (WHERE {condition})", f"COUNT(*) FILTER (WHERE {text} LIKE '-%')"]
    if probe.literals:
        aggregates.append(f"COUNT(DISTINCT {e})")
    if not row_level:
        aggregates.append("COUNT(DISTINCT uid)")
    items = draw(st.lists(st.sampled_from(aggregates), min_size=1, max_size=3, unique=True))
    where = draw(st.sampled_from(["", f" WHERE {condition}"]))
    options = draw(_options(row_level, k))
    if key is None:
        return f"SELECT {options}{', '.join(items)} FROM t{where}", 0
    return f"SELECT {options}{key}, {', '.join(items)} FROM t{where} GROUP BY {key}", 1


def _literal(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


def _domain_table(column: Twins) -> Table:
    """A public table holding every value of ``column``'s classes: twins DuckDB takes for one."""
    return Table("dom", ((column.name, column.type),), tuple((v,) for v in column.values if v != "NULL"))


@st.composite
def _identity_case(draw, family: str, row_level: bool) -> Case:
    names = draw(st.lists(st.sampled_from(sorted(TWINS)), min_size=1, max_size=3, unique=True))
    columns = tuple(TWINS[name] for name in names)
    units = None if row_level else UNIT_IDS[draw(st.sampled_from(sorted(UNIT_IDS)))]
    k = 1 if row_level else draw(st.integers(1, 3))
    groups = None if row_level else draw(st.sampled_from([None, *range(1, k)]))  # below MAX ROWS PER UNIT
    neighbours = draw(st.sampled_from(["unbounded", "bounded"]))
    x_keys, domain = draw(st.booleans()), columns[0].scalar and draw(st.booleans())
    length = draw(st.sampled_from(units.string_length if units else (None, 3)))
    rules = ["x BOUNDS 0 TO 3"] + (["x KEYS (0, 1, 2, 3)"] if x_keys else []) \
        + ([f"{columns[0].name} KEYS FROM dom.{columns[0].name}"] if domain else []) \
        + ([f"MAX STRING LENGTH {length}"] if length is not None else [])
    public = (_domain_table(columns[0]),) if domain else ()
    sql, keys = draw(_identity_query(columns, row_level, k, x_keys, domain))

    rows = _identity_base(draw, columns, units.ids if units else ())
    base = tuple(row[1:] for row in rows) if units else rows
    unit_id = draw(st.sampled_from(units.adversarial)) if units else None

    def unit_rows() -> tuple[tuple[str, ...], ...]:
        """The adversarial unit: each row fresh or the twin of a base row or of its own earlier row."""
        count = 1 if row_level else draw(st.integers(1, k + 2))
        drawn: list[tuple[str, ...]] = []
        for _ in range(count):
            twin_of = draw(st.sampled_from([None, *base, *drawn]))
            drawn.append(_identity_row(draw, columns, twin_of, True))
        if count > 1 and draw(st.booleans()):
            drawn = [drawn[0]] * count  # all it can contribute, on one key
        return tuple(drawn) if row_level else tuple((unit_id, *row) for row in drawn)

    unit = unit_rows()
    replacement = unit_rows() if neighbours == "bounded" else None
    definition = (() if row_level else (("uid", units.type),)) + tuple((c.name, c.type) for c in columns) \
        + (("x", X_SMALL.type),)
    policy = policy_text(neighbours=neighbours, row_level=row_level, k=k, groups=groups, rules=rules, public=public)
    return Case(family, policy, sql, Table("t", definition, rows), unit, public, replacement, keys,
                storage=draw(st.sampled_from(STORAGES)), extra_first=draw(st.booleans()))


def identity() -> st.SearchStrategy:
    return _identity_case("identity", row_level=False)


def identity_row() -> st.SearchStrategy:
    return _identity_case("identity_row", row_level=True)


FAMILIES = {
    "unit_level": unit_level, "row_level": row_level, "public_join": public_join, "coerced_join": coerced_join,
    "row_level_join": row_level_join, "public_subquery": public_subquery, "typed_keys": typed_keys,
    "key_domains": key_domains, "extreme_bounds": extreme_bounds, "identity": identity, "identity_row": identity_row,
}
"""Family name -> the strategy drawing its cases."""
