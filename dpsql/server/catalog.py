"""Catalog look-ups (``information_schema``, ``pg_catalog``) and table-less chatter
(``SELECT 1``, ``SELECT current_schema()``) answered from a database that holds no data.

At start the server builds an in-memory DuckDB with an empty table of each declared table's
name and column types (``Connection.tables()`` and ``columns()``: the policy and schema
only). DuckDB's own ``information_schema`` and ``pg_catalog`` views over it let clients list
tables and columns; whatever an analyst writes there can read nothing but that schema.
It is opened hardened like every database dpsql opens (no files, no extensions, a memory
limit and a time limit), through ``dpsql.backends.duckdb``, the only module that talks to DuckDB.

>>> from sqlglot import parse_one
>>> reads_catalog_only(parse_one("SELECT * FROM information_schema.tables", read="postgres"))
True
>>> reads_catalog_only(parse_one("WITH t AS (SELECT 1) SELECT * FROM t", read="postgres"))
True
>>> reads_catalog_only(parse_one("SELECT COUNT(*) FROM visits", read="postgres"))
False
"""

from __future__ import annotations

import logging
import re

import sqlglot
from sqlglot import exp
from sqlglot.errors import SqlglotError

from dpsql.backends.base import Backend
from dpsql.backends.duckdb import Engine
from dpsql.errors import DPError, UnsupportedQuery
from dpsql.server.pg_compat import (
    DESCRIBING,
    FUNCTIONS,
    IDENTITY,
    INFORMATION_VIEWS,
    SERVED,
    SHADOWS,
    as_analyst,
    engine_identity,
    information_view,
    served_calls,
    served_column,
    settings_rows,
    shadowed,
)
from dpsql.server.statements import CATALOG_SCHEMAS, SETTINGS
from dpsql.sql.names import quoted, quoted_table

log = logging.getLogger("dpsql.server")
PG_CLASS_OID = 1259
"""PostgreSQL's OID of ``pg_class``: the ``classoid`` of a table's or column's comment."""
_PG_CLASS = re.compile(r"'(?:pg_catalog\.)?pg_class'\s*::\s*(?:pg_catalog\s*\.\s*)?regclass\b"
                       r"|CAST\s*\(\s*'(?:pg_catalog\.)?pg_class'\s+AS\s+(?:pg_catalog\s*\.\s*)?regclass\s*\)",
                       re.IGNORECASE)
"""``'pg_class'::regclass``, as pgjdbc picks the comments of tables: pg_class's OID, as text."""
_CAST_TO = r"(::\s*|\bAS\s+(?=(?:pg_catalog\s*\.\s*)?\w+\s*\)))(?:pg_catalog\s*\.\s*)?"
"""``::type`` or ``CAST(... AS type)`` (an ``AS`` followed by ``)``, not a column alias)."""
_REG_CASTS = re.compile(_CAST_TO + r"(regtype|regclass|regproc|regnamespace|name)\b", re.IGNORECASE)
"""PostgreSQL's OID alias types and ``name``, unknown to DuckDB: read as text."""
_OID_CASTS = re.compile(_CAST_TO + r"oid\b", re.IGNORECASE)
"""PostgreSQL's ``oid`` type: DuckDB's catalog keeps OIDs as BIGINT."""
_SETTING = re.compile(r"(\bpg_catalog\s*\.\s*|(?<![\w.\"]))current_setting\b", re.IGNORECASE)
"""``current_setting`` as ``reads_a_fixed_setting`` admits it (a form it does not match fails to
bind, as ``pg_catalog.fixed_setting``)."""
_QUALIFIED_TYPE = re.compile(r"(::\s*|\bAS\s+(?=pg_catalog\s*\.\s*\w+\s*\)))pg_catalog\s*\.\s*", re.IGNORECASE)
"""A cast to a type named with its schema (``::pg_catalog.text``, ``CAST(x AS pg_catalog.text)``):
DuckDB knows the bare name."""
_OPERATOR = re.compile(r"OPERATOR\s*\(\s*pg_catalog\s*\.\s*([~!=<>*]+)\s*\)", re.IGNORECASE)
_COLLATE = re.compile(r"\s*COLLATE\s+pg_catalog\s*\.\s*\"?default\"?", re.IGNORECASE)
_QUALIFIED = re.compile(r"\b(?:pg_catalog|information_schema)\s*\.\s*(\w+)\s*\(", re.IGNORECASE)
"""A function called with its schema (pg_catalog, or information_schema for pgjdbc's ``_pg_expandarray``):
DuckDB finds the bare name in ``main`` (``pg_compat.FUNCTIONS``,
``array_to_string``) and then in its own pg_catalog."""
FIXED_SETTINGS = {**SETTINGS, "default_table_access_method": "heap"}
"""What ``current_setting`` and ``pg_settings`` answer: SHOW's settings, and one SQLAlchemy reads."""
_ANY_ARRAY = re.compile(r"\bANY\s*\(\s*'\{([\w\s,\"]*)\}'(?:\s*::\s*(?:pg_catalog\s*\.\s*)?\w+\s*\[\s*\])?\s*\)",
                        re.IGNORECASE)
"""``= ANY('{r,p,f}')``, a PostgreSQL array literal written as text (pgcli lists tables so): DuckDB
reads the text as a string, not a list."""
CATALOG_TIMEOUT = 5.0
"""Seconds a catalog query may run: a look-up, never a computation."""


DENIED_FUNCTIONS = frozenset({"pg_sleep", "sleep", "current_setting", "set_config", "txid_current",
                              "repeat", "pad", "range", "generate_series", "current_query"})
"""Functions a catalog look-up may not call: they wait, show the server's settings or count other
sessions' work, or build values as large as the memory limit (an attacker's review)."""
DENIED_TABLES = frozenset({"pg_settings"})
"""DuckDB's catalog views that show the server's settings (paths, user, memory) rather than the
schema: a look-up reads ``pg_compat.SHADOWS``' fixed ones instead, and is refused if its
reference stays DuckDB's (``reads_engine_settings``)."""
MAX_ANSWER_CHARACTERS = 4 << 20
"""Largest catalog answer, in characters: a look-up lists names, it never builds large values
(an answer waiting for a client that does not read would pin its memory)."""


def reads_catalog_only(tree: exp.Expression) -> bool:
    """True when every table ``tree`` reads is a catalog view or one of its own CTEs, and it
    calls none of ``DENIED_FUNCTIONS`` (anything else goes to dpsql, which refuses it)."""
    ctes = {cte.alias_or_name.lower() for cte in tree.find_all(exp.CTE)}
    for source in tree.find_all(exp.Table, exp.Lateral):
        if not table_function_allowed(source):
            return False
    for table in tree.find_all(exp.Table):
        schema, name = table.db.lower(), table.name.lower()
        if table.catalog:
            return False
        if schema in CATALOG_SCHEMAS or (not schema and (name.startswith("pg_") or name in ctes)):
            continue
        return False
    for function in tree.find_all(exp.Func):
        if isinstance(function, exp.GenerateSeries):  # however written: sqlglot names it apart
            if not over_array_indexes(function):
                return False
            continue
        name = function.name if isinstance(function, exp.Anonymous) else function.sql_name()
        if name.lower() == "current_setting" and reads_a_fixed_setting(function):
            continue
        if name.lower() in DENIED_FUNCTIONS:
            return False
    return True


TABLE_FUNCTIONS = frozenset({"unnest", "_pg_expandarray"})
"""Functions a catalog look-up may read rows from, besides ``generate_series`` over an array's
indexes: they expand an array the query already holds. Any other (``query``, ``read_text``,
``glob``, ``duckdb_settings``...) would run DuckDB's own table functions, which read files and
settings, however qualified (an attacker's review: ``pg_catalog.query('...')`` ran any SELECT)."""


def table_function_allowed(source: exp.Expression) -> bool:
    """Whether ``source`` reads a named table or subquery, or one of ``TABLE_FUNCTIONS``.

    >>> from sqlglot import parse_one
    >>> [reads_catalog_only(parse_one(sql, read="postgres")) for sql in (
    ...     "SELECT * FROM pg_catalog.query('SELECT 1')", "SELECT * FROM pg_catalog.duckdb_settings()",
    ...     "SELECT t.* FROM pg_catalog.pg_namespace c, LATERAL read_text('x') t",
    ...     "SELECT * FROM pg_catalog.pg_class c JOIN LATERAL pg_catalog.read_blob('x') b ON true",
    ...     "SELECT * FROM information_schema._pg_expandarray(ARRAY[1]) e")]
    [False, False, False, False, True]
    """
    function = source.this
    if isinstance(function, exp.Dot):  # pg_catalog.f(...) after LATERAL
        function = function.expression
    if function is None or isinstance(function, (exp.Identifier, exp.Subquery, exp.Select, exp.Unnest)):
        return True
    if isinstance(function, exp.Explode):  # UNNEST(array) read as a table: an array the query holds
        return True
    if isinstance(function, exp.GenerateSeries):  # its bounds are checked with every other call
        return True
    return isinstance(function, exp.Anonymous) and function.name.lower() in TABLE_FUNCTIONS


def reads_a_fixed_setting(call: exp.Func) -> bool:
    """Whether ``call`` is ``current_setting(...)`` or ``pg_catalog.current_setting(...)``,
    unquoted: ``compatible`` points those at ``fixed_setting`` (SQLAlchemy reads
    ``default_table_access_method``); DuckDB's own, written any other way, shows the catalog
    database's settings and stays refused.

    >>> from sqlglot import parse_one
    >>> [reads_catalog_only(parse_one(f"SELECT {call}('x')", read="postgres"))
    ...  for call in ("current_setting", "pg_catalog.current_setting", '"current_setting"', "main.current_setting")]
    [True, True, False, False]
    """
    if not isinstance(call, exp.Anonymous) or not isinstance(call.this, str):
        return False
    parent = call.parent
    if isinstance(parent, exp.Dot) and parent.expression is call:
        schema = parent.this
        return isinstance(schema, exp.Identifier) and not schema.quoted and schema.name.lower() == "pg_catalog"
    return True


def over_array_indexes(series: exp.GenerateSeries) -> bool:
    """Whether ``series`` runs over an array's indexes, ``generate_series(0, array_upper(a, 1))``
    (psql's ``\\d`` lists a publication's columns so): as long as a catalog array, never a
    length an analyst writes.

    >>> from sqlglot import parse_one
    >>> [reads_catalog_only(parse_one(f"SELECT * FROM pg_catalog.generate_series({bounds}) s", read="postgres"))
    ...  for bounds in ("0, pg_catalog.array_upper(i.indkey, 1)", "1, 100000000", "-100000000, array_upper(a, 1)")]
    [True, False, False]
    """
    start, end = series.args.get("start"), series.args.get("end")
    if isinstance(end, exp.Dot):  # pg_catalog.array_upper(...)
        end = end.expression
    return (isinstance(start, exp.Literal) and start.name in ("0", "1") and series.args.get("step") is None
            and isinstance(end, exp.Anonymous) and end.name.lower() == "array_upper")


def catalog_query(sql: str) -> bool:
    """True when ``sql`` should be answered by the schema-only database.

    >>> catalog_query("SELECT " + "(" * 3000 + "1" + ")" * 3000)  # dpsql's parser refuses it
    False
    """
    try:
        tree = sqlglot.parse_one(read_casts(sql), read="postgres")
    except (SqlglotError, RecursionError):  # deep nesting was an internal error (an attacker's review)
        return False  # dpsql's own parser refuses it, with a position
    # Only a query: `WITH t AS (...) INSERT ...` starts like one but must not reach this database.
    return isinstance(tree, exp.Expression) and isinstance(tree, exp.Query) and reads_catalog_only(tree)


class Catalog:
    """The schema-only database, of the tables of ``database`` (the name clients connect to)."""

    def __init__(self, tables: dict[str, dict[str, str]], database: str = "memory",
                 comments: dict[str, tuple[str, dict[str, str]]] | None = None):
        """``comments``: table -> (its comment, column -> comment) (``dpsql.server.described``)."""
        self._engine: Backend = Engine.open(":memory:", query_timeout=CATALOG_TIMEOUT, memory_limit="256MB")
        for name, definition in FUNCTIONS.items():
            self._engine.fetch(f"CREATE MACRO {name}{definition}")
        settings = " ".join(f"WHEN {text_literal(name)} THEN {text_literal(value)}"
                            for name, value in FIXED_SETTINGS.items())
        self._engine.fetch(f"CREATE MACRO fixed_setting(name) AS CASE lower(name) {settings} END, "
                           f"(name, missing_ok) AS CASE lower(name) {settings} END")
        for table, columns in tables.items():
            parts = table.split(".")
            if len(parts) == 2 and parts[0].lower() != "main":
                self._engine.fetch(f"CREATE SCHEMA IF NOT EXISTS {quoted(parts[0])}")
            listed = ", ".join(f"{quoted(name)} {kind}" for name, kind in columns.items())
            self._engine.fetch(f"CREATE TABLE {quoted_table(table)} ({listed})")
        values = {"database": text_literal(database), "descriptions": self._descriptions(comments or {}),
                  "settings": settings_rows(FIXED_SETTINGS)}
        for name, body in SHADOWS.items():
            self._engine.fetch(f"CREATE MACRO {name}() AS TABLE {body.format(**values)}")
        for macro in IDENTITY.values():
            self._engine.fetch(f"CREATE MACRO {macro}(analyst) AS analyst")
        for macro, definition in SERVED.values():
            self._engine.fetch(f"CREATE MACRO {macro}{definition.format(**values)}")
        for view in INFORMATION_VIEWS:  # its columns as this DuckDB has them
            named = [column for column, _ in self._engine.describe(f"SELECT * FROM information_schema.{view}")]
            self._engine.fetch(f"CREATE MACRO information_schema_{view}() AS TABLE "
                               f"{information_view(view, named, values['database'])}")
        for name, definition in DESCRIBING.items():  # they read pg_description(), made just now
            self._engine.fetch(f"CREATE MACRO {name}{definition}")

    def _descriptions(self, comments: dict[str, tuple[str, dict[str, str]]]) -> str:
        """``pg_description``'s rows for ``comments``, as a VALUES list (NULL-typed when none):
        objoid (the table's OID), objsubid (0, or the column's number), description."""
        rows = []
        for table, (text, columns) in comments.items():
            parts = table.split(".")
            schema, name = (parts[0], parts[1]) if len(parts) == 2 else ("main", parts[0])
            found = self._engine.fetch(
                "SELECT c.oid FROM pg_catalog.pg_class c JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace "
                "WHERE lower(c.relname) = lower($1) AND lower(n.nspname) = lower($2) AND c.relkind = 'r'",
                [name, schema])
            if len(found) != 1:
                continue
            oid = int(found[0][0])
            rows.append((oid, 0, text))
            numbers = dict(self._engine.fetch("SELECT lower(attname), attnum FROM pg_catalog.pg_attribute "
                                              "WHERE attrelid = $1 AND attnum > 0", [oid]))
            rows += [(oid, int(numbers[column.lower()]), comment) for column, comment in columns.items()
                     if column.lower() in numbers]
        if not rows:
            return "SELECT NULL::BIGINT AS objoid, NULL::VARCHAR AS classoid, NULL::INTEGER AS objsubid, " \
                   "NULL::VARCHAR AS description WHERE false"
        # classoid: pg_class's OID in PostgreSQL, as text here: pgjdbc compares it with
        # pg_class.oid (a BIGINT) and with 'pg_class'::regclass (``_PG_CLASS`` reads that as '1259').
        listed = ", ".join(f"({oid}::BIGINT, '{PG_CLASS_OID}', {number}::INTEGER, {text_literal(text)})"
                           for oid, number, text in rows)
        return f"SELECT * FROM (VALUES {listed}) AS d(objoid, classoid, objsubid, description)"

    def answer(self, sql: str, parameters: tuple = (), *, analyst: str) -> tuple[list[str], list[tuple]]:
        """(column names, rows) of a catalog query asked by ``analyst`` (who ``current_user``
        is), with ``$1``... bound to ``parameters`` (text, as clients send them);
        ``UnsupportedQuery`` if it does not bind."""
        bound = self._named_objects(sql, array_parameters(sql, regclass_parameters(sql, list(parameters)))) \
            if parameters else None
        sql = self._named_literals(sql)
        sql = as_analyst(sql, analyst)
        if (word := engine_identity(sql)) is not None:
            raise UnsupportedQuery(f"this catalog look-up names {word} quoted, qualified or as a function: that "
                                   "is not the analyst this session signed in as",
                                   hint="write current_user, unquoted, for the analyst you are signed in as")
        sql = compatible(sql)
        if reads_engine_settings(sql):
            raise UnsupportedQuery("this catalog look-up reads pg_settings in a form this server cannot answer "
                                   "from its fixed settings",
                                   hint="write FROM pg_settings (or pg_catalog.pg_settings), with no CTE of that "
                                        "name, or SHOW the setting")
        try:
            names = [served_column(name) for name, _ in self._engine.describe(sql, bound)]
        except UnsupportedQuery as error:  # DuckDB's words about the schema-only database: named, not shown
            raise catalog_refusal(error.message.removeprefix("the query does not bind: ")) from None
        try:
            rows = self._engine.fetch(sql, bound)
        except DPError as error:  # dpsql's own words (a time limit)
            raise UnsupportedQuery(f"this catalog look-up failed: {error.message}", hint=CATALOG_HINT) from None
        except Exception as error:  # a cast or a limit, on names and types only
            raise catalog_refusal(str(error)) from None
        if sum(len(str(value)) for row in rows for value in row) > MAX_ANSWER_CHARACTERS:
            raise UnsupportedQuery("this catalog look-up's answer is larger than a catalog listing can be",
                                   hint="select the names you need, with a WHERE or LIMIT")
        return names, rows

    def _named_objects(self, sql: str, parameters: list) -> list:
        """``parameters`` with a table's name cast to ``regclass`` as its OID's text, as PostgreSQL
        reads ``$1::regclass`` (pgcli's ``\\sv``), and a refusal where PostgreSQL would fail: a
        table this database does not have (42P01), or any function's name cast to ``regproc``
        (42883: it has no functions of its own, ``pg_proc`` is empty)."""
        for pattern, resolve in ((_REGCLASS_PARAMETER, self._relation_oid), (_REGPROC_PARAMETER, _no_function)):
            for match in pattern.finditer(sql):
                index = int(match.group(1) or match.group(2)) - 1
                value = parameters[index] if 0 <= index < len(parameters) else None
                if isinstance(value, str) and not value.strip().isdigit() and not _names_catalog(value):
                    parameters[index] = str(resolve(value))
        return parameters

    def _named_literals(self, sql: str) -> str:
        """``sql`` with each name written as a literal cast to ``regclass`` (psql's
        ``'visits'::regclass``) as its OID's text, and the refusals, that ``_named_objects`` gives
        the same name bound as a parameter (``$1::regclass``); ``pg_class`` and other catalog names
        are left to ``read_casts``."""
        def resolved(match: re.Match) -> str:
            opened, literal, kind = match.group(1), match.group(2), match.group(3) or match.group(4)
            if kind is None or (match.group(4) is not None and opened is None):
                return match.group(0)  # a literal not cast to an OID alias type (or an AS that is not a CAST's)
            name = literal.replace("''", "'")
            if name.strip().isdigit() or _names_catalog(name):
                return match.group(0)
            resolve = self._relation_oid if kind.lower() == "regclass" else _no_function
            return f"'{resolve(name)}'"

        return _LITERAL_CAST.sub(resolved, sql) if "'" in sql else sql

    def _relation_oid(self, name: str) -> int:
        """The OID of the served table ``name`` (``schema.table`` or ``table``, unquoted names
        folded to lower case as PostgreSQL does), or ``UnsupportedQuery`` (42P01)."""
        parts = [part[1:-1].replace('""', '"') if part.startswith('"') else part.lower()
                 for part in re.findall(r'"(?:[^"]|"")*"|[^."]+', name.strip())]
        schema, table = (parts[0], parts[1]) if len(parts) == 2 else (None, parts[0] if parts else "")
        found = self._engine.fetch(
            "SELECT c.oid FROM pg_catalog.pg_class c JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace "
            "WHERE c.relname = $1 AND ($2::VARCHAR IS NULL OR n.nspname = $2) AND c.relkind IN ('r', 'v')",
            [table, schema]) if len(parts) in (1, 2) else []
        if len(found) != 1:
            raise UnsupportedQuery(f'unknown table "{name}": no relation of that name in this database',
                                   hint="list the tables with \\dt or information_schema.tables")
        return int(found[0][0])

    def close(self) -> None:
        self._engine.close()


def _names_catalog(name: str) -> bool:
    """Whether ``name`` is one of PostgreSQL's catalog tables (``pg_catalog.pg_constraint``, as
    SQLAlchemy binds a comment's ``classoid``): left as text, which matches no comment but
    ``pg_class``'s (``regclass_parameters``).

    >>> _names_catalog("pg_catalog.pg_constraint"), _names_catalog("pg_proc"), _names_catalog("visits")
    (True, True, False)
    """
    text = name.strip().lower()
    return text.startswith(("pg_catalog.", "information_schema.", "pg_", '"pg_catalog".'))


def _no_function(name: str) -> int:
    raise UnsupportedQuery(f'unknown function "{name}": this database has no functions of its own',
                           hint="the functions a query may call are listed in docs/sql.md")


CATALOG_HINT = ("list tables and columns with information_schema.tables and information_schema.columns "
                "(psql: \\dt, \\d TABLE), and the rules with SHOW policy")
ENGINE_ERRORS = (
    (re.compile(r"Table with name (\w+) does not exist"),
     "this catalog look-up reads {}, a part of PostgreSQL's catalog this server does not have"),
    (re.compile(r"Function with name (\w+) does not exist"),
     "this catalog look-up calls {}(), which this server's catalog does not have"),
    (re.compile(r"Type with name (\w+) does not exist"),
     "this catalog look-up names the type {}, which this server's catalog does not have"),
    (re.compile(r'column named "(\w+)"|Referenced column "(\w+)" not found'),
     "this catalog look-up reads the column {}, which this server's catalog does not have"),
    (re.compile(r"Could not convert string '([^'\n]{0,60})' to"),
     "this catalog look-up casts '{}' to a type it does not convert to"),
)
"""DuckDB's errors about the schema-only database -> what the analyst is told, naming what their
look-up used (a name or a literal they wrote); any other error is told without detail."""


def catalog_refusal(engine: str) -> UnsupportedQuery:
    """The refusal of a catalog look-up DuckDB could not answer with ``engine`` (its error): the
    part of PostgreSQL's catalog it used, never DuckDB's own words (which name its internals);
    the curator's log keeps them.

    >>> catalog_refusal("Catalog Error: Table with name pg_cast does not exist!\\nDid you mean x").message
    "this catalog look-up reads pg_cast, a part of PostgreSQL's catalog this server does not have"
    >>> catalog_refusal("Binder Error: Values list \\"pgc\\" does not have a column named \\"tableoid\\"").message
    "this catalog look-up reads the column tableoid, which this server's catalog does not have"
    >>> catalog_refusal("INTERNAL Error: Attempted to access index 3 within vector of size 3").message
    "this catalog look-up uses SQL this server's catalog does not answer"
    """
    log.info("catalog look-up refused: %s", " ".join(engine.split())[:500])
    for pattern, message in ENGINE_ERRORS:
        found = pattern.search(engine)
        if found is not None:
            return UnsupportedQuery(message.format(next(group for group in found.groups() if group is not None)),
                                    hint=CATALOG_HINT)
    return UnsupportedQuery("this catalog look-up uses SQL this server's catalog does not answer", hint=CATALOG_HINT)


def reads_engine_settings(sql: str) -> bool:
    """Whether ``sql`` (as ``compatible`` made it) still reads DuckDB's own view of one of
    ``DENIED_TABLES`` rather than the macro standing for it; True when that cannot be told.

    >>> [reads_engine_settings(compatible(sql)) for sql in (
    ...     "SELECT name FROM pg_catalog.pg_settings", 'SELECT s.setting FROM "pg_settings" s',
    ...     "WITH pg_settings AS (SELECT 1) SELECT * FROM pg_settings", "SELECT 1")]
    [False, False, True, False]
    """
    if not any(name in sql.lower() for name in DENIED_TABLES):
        return False
    try:
        tree = sqlglot.parse_one(sql, read="duckdb")
    except (SqlglotError, RecursionError):
        return True
    return any(isinstance(table.this, exp.Identifier) and table.name.lower() in DENIED_TABLES
               for table in tree.find_all(exp.Table))


_REGCLASS_PARAMETER = re.compile(r"CAST\s*\(\s*\$(\d+)\s+AS\s+(?:pg_catalog\s*\.\s*)?regclass\s*\)"
                                 r"|\$(\d+)\s*::\s*(?:pg_catalog\s*\.\s*)?regclass\b", re.IGNORECASE)


_REGPROC_PARAMETER = re.compile(r"CAST\s*\(\s*\$(\d+)\s+AS\s+(?:pg_catalog\s*\.\s*)?regproc(?:edure)?\s*\)"
                                r"|\$(\d+)\s*::\s*(?:pg_catalog\s*\.\s*)?regproc(?:edure)?\b", re.IGNORECASE)


_LITERAL_CAST = re.compile(r"(CAST\s*\(\s*)?'((?:[^']|'')*)'"
                           r"(?:\s*::\s*(?:pg_catalog\s*\.\s*)?(regclass|regproc)(?:edure)?\b"
                           r"|\s+AS\s+(?:pg_catalog\s*\.\s*)?(regclass|regproc)(?:edure)?\s*\))?", re.IGNORECASE)
"""Every string literal, left to right (so a quote inside one never starts another), with the
``CAST(`` before it and the OID alias type it is cast to, where it is (``_named_literals``)."""


def regclass_parameters(sql: str, parameters: list) -> list:
    """``parameters`` with a ``pg_class`` bound to a regclass cast as its OID's text, as
    ``_PG_CLASS`` reads it written in the SQL (SQLAlchemy binds it: its table comments).

    >>> regclass_parameters("SELECT 1 WHERE classoid = CAST($2 AS REGCLASS)", ["x", "pg_catalog.pg_class"])
    ['x', '1259']
    """
    for match in _REGCLASS_PARAMETER.finditer(sql):
        index = int(match.group(1) or match.group(2)) - 1
        if 0 <= index < len(parameters) and str(parameters[index]).lower() in ("pg_class", "pg_catalog.pg_class"):
            parameters[index] = str(PG_CLASS_OID)
    return parameters


_ANY_PARAMETER = re.compile(r"\bANY\s*\(\s*\$(\d+)\s*\)", re.IGNORECASE)
_ARRAY_ITEM = re.compile(r'\s*("(?:[^"\\]|\\.)*"|[^,{}"]*?)\s*(?:,|$)')


def array_parameters(sql: str, parameters: list) -> list:
    """``parameters`` with an array compared by ``= ANY($n)`` read from PostgreSQL's array text
    (``{r,p,f}``, as drivers send a list) into a list, which DuckDB binds as one (pgcli lists
    its tables and columns so).

    >>> array_parameters("SELECT 1 WHERE relkind = ANY($2)", ["{r}", '{r,p,"a b",f}'])
    ['{r}', ['r', 'p', 'a b', 'f']]
    >>> array_parameters("SELECT 1 WHERE relkind = ANY ($1)", ["{}"]), array_parameters("SELECT $1", ["{a}"])
    ([[]], ['{a}'])
    """
    for match in _ANY_PARAMETER.finditer(sql):
        index = int(match.group(1)) - 1
        value = parameters[index] if 0 <= index < len(parameters) else None
        if isinstance(value, str) and value.startswith("{") and value.endswith("}"):
            parameters[index] = array_items(value[1:-1])
    return parameters


def array_items(inner: str) -> list[str]:
    """The items of a one-dimensional PostgreSQL array's text between its braces, quoted ones
    unquoted (pgspecial's ``\\dt`` writes ``'{r,p,""}'``).

    >>> array_items('r, p,"a, b",""'), array_items(" ")
    (['r', 'p', 'a, b', ''], [])
    """
    if not inner.strip():
        return []
    return [re.sub(r'\\(.)', r"\1", item[1:-1]) if item.startswith('"') else item
            for item in _ARRAY_ITEM.findall(inner)[:-1]]


def compatible(sql: str) -> str:
    """A catalog query in the SQL DuckDB reads: psql writes ``OPERATOR(pg_catalog.~)`` and
    ``COLLATE pg_catalog.default``, drivers cast to OID alias types, and some functions
    DuckDB lacks are called qualified (``pg_compat.FUNCTIONS``).

    >>> compatible("SELECT 1 WHERE 'a' OPERATOR(pg_catalog.~) '^a$' COLLATE pg_catalog.default")
    "SELECT 1 WHERE 'a' ~ '^a$'"
    >>> compatible("SELECT CAST(CAST(a AS REGCLASS) AS OID), b::pg_catalog.regtype::pg_catalog.text, c AS name")
    'SELECT CAST(CAST(a AS VARCHAR) AS BIGINT), b::VARCHAR::text, c AS name'
    >>> compatible("SELECT CAST(t.typlen AS pg_catalog.text), 'a'::pg_catalog.text AS pg_catalog")
    "SELECT CAST(t.typlen AS text), 'a'::text AS pg_catalog"
    >>> compatible("SELECT 1 WHERE d.classoid = 'pg_class'::regclass")
    "SELECT 1 WHERE d.classoid = '1259'"
    >>> compatible("SELECT 1 WHERE c.relkind = ANY('{r,p, f}') OR c.relkind = ANY ('{}'::char[])")
    "SELECT 1 WHERE c.relkind = ANY(['r', 'p', 'f']) OR c.relkind = ANY([])"
    """
    sql = _SETTING.sub("fixed_setting", shadowed(served_calls(read_casts(sql))))
    sql = _OPERATOR.sub(lambda match: match.group(1), sql)
    sql = _COLLATE.sub("", sql)
    sql = _QUALIFIED.sub(lambda match: match.group(1) + "(", sql)
    return _QUALIFIED_TYPE.sub(lambda match: match.group(1), sql)


def read_casts(sql: str) -> str:
    """``sql`` with PostgreSQL's OID alias types and array literals in the forms DuckDB (and
    sqlglot: ``::regtype[]`` does not parse) reads: done before a catalog query is parsed, so that
    what is decided on and what runs are one text.

    >>> read_casts("SELECT COALESCE(a::regtype[], b::pg_catalog.regtype[])::text[] WHERE c = ANY('{r,p}')")
    "SELECT COALESCE(a::VARCHAR[], b::VARCHAR[])::text[] WHERE c = ANY(['r', 'p'])"
    """
    sql = _ANY_ARRAY.sub(lambda match: "ANY([" + ", ".join(map(text_literal, array_items(match.group(1)))) + "])",
                         sql)
    sql = _PG_CLASS.sub(f"'{PG_CLASS_OID}'", sql)
    sql = _OID_CASTS.sub(lambda match: match.group(1) + "BIGINT", sql)
    return _REG_CASTS.sub(lambda match: match.group(1) + "VARCHAR", sql)




def text_literal(text: str) -> str:
    """``text`` as a SQL string literal.

    >>> text_literal("o'hare")
    "'o''hare'"
    """
    return "'" + text.replace("'", "''") + "'"
