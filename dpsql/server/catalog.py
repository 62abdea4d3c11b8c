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

import re

import sqlglot
from sqlglot import exp
from sqlglot.errors import SqlglotError

from dpsql.backends.base import Backend
from dpsql.backends.duckdb import Engine
from dpsql.errors import UnsupportedQuery
from dpsql.sql.names import quoted, quoted_table

CATALOG_SCHEMAS = frozenset({"pg_catalog", "information_schema"})
COMPAT_MACROS = {"pg_get_userbyid": "(role) AS 'curator'",
                 "pg_encoding_to_char": "(encoding) AS 'UTF8'",
                 "obj_description": "(id, kind := NULL) AS NULL::VARCHAR",
                 "to_regtype": "(name) AS NULL::BIGINT"}
"""PostgreSQL functions psql's backslash commands call that DuckDB lacks: fixed answers.
DuckDB will not add functions to its own pg_catalog, so calls are unqualified first."""
_REG_CASTS = re.compile(r"::\s*(pg_catalog\s*\.\s*)?(regtype|regclass|regproc|regnamespace)\b", re.IGNORECASE)
"""PostgreSQL's OID alias types, unknown to DuckDB: read as the OID's text."""
_OPERATOR = re.compile(r"OPERATOR\s*\(\s*pg_catalog\s*\.\s*([~!=<>*]+)\s*\)", re.IGNORECASE)
_COLLATE = re.compile(r"\s*COLLATE\s+pg_catalog\s*\.\s*\"?default\"?", re.IGNORECASE)
_QUALIFIED = re.compile(r"\bpg_catalog\s*\.\s*(" + "|".join(COMPAT_MACROS) + r")\s*\(", re.IGNORECASE)
CATALOG_TIMEOUT = 5.0
"""Seconds a catalog query may run: a look-up, never a computation."""


DENIED_FUNCTIONS = frozenset({"pg_sleep", "sleep", "current_setting", "set_config", "txid_current",
                              "repeat", "pad", "range", "generate_series", "current_query"})
"""Functions a catalog look-up may not call: they wait, show the server's settings or count other
sessions' work, or build values as large as the memory limit (an attacker's review)."""
DENIED_TABLES = frozenset({"pg_settings"})
"""Catalog views that show the server's settings (paths, user, memory) rather than the schema."""
MAX_ANSWER_CHARACTERS = 4 << 20
"""Largest catalog answer, in characters: a look-up lists names, it never builds large values
(an answer waiting for a client that does not read would pin its memory)."""


def reads_catalog_only(tree: exp.Expression) -> bool:
    """True when every table ``tree`` reads is a catalog view or one of its own CTEs, and it
    calls none of ``DENIED_FUNCTIONS`` (anything else goes to dpsql, which refuses it)."""
    ctes = {cte.alias_or_name.lower() for cte in tree.find_all(exp.CTE)}
    for table in tree.find_all(exp.Table):
        schema, name = table.db.lower(), table.name.lower()
        if table.catalog or name in DENIED_TABLES:
            return False
        if schema in CATALOG_SCHEMAS or (not schema and (name.startswith("pg_") or name in ctes)):
            continue
        return False
    for function in tree.find_all(exp.Func):
        name = function.name if isinstance(function, exp.Anonymous) else function.sql_name()
        if name.lower() in DENIED_FUNCTIONS:
            return False
    return True


def catalog_query(sql: str) -> bool:
    """True when ``sql`` should be answered by the schema-only database."""
    try:
        tree = sqlglot.parse_one(sql, read="postgres")
    except SqlglotError:
        return False  # dpsql's own parser refuses it, with a position
    # Only a query: `WITH t AS (...) INSERT ...` starts like one but must not reach this database.
    return isinstance(tree, exp.Expression) and isinstance(tree, exp.Query) and reads_catalog_only(tree)


class Catalog:
    """The schema-only database."""

    def __init__(self, tables: dict[str, dict[str, str]]):
        self._engine: Backend = Engine.open(":memory:", query_timeout=CATALOG_TIMEOUT, memory_limit="256MB")
        for name, definition in COMPAT_MACROS.items():
            self._engine.fetch(f"CREATE MACRO {name}{definition}")
        for table, columns in tables.items():
            parts = table.split(".")
            if len(parts) == 2 and parts[0].lower() != "main":
                self._engine.fetch(f"CREATE SCHEMA IF NOT EXISTS {quoted(parts[0])}")
            listed = ", ".join(f"{quoted(name)} {kind}" for name, kind in columns.items())
            self._engine.fetch(f"CREATE TABLE {quoted_table(table)} ({listed})")

    def answer(self, sql: str, parameters: tuple = ()) -> tuple[list[str], list[tuple]]:
        """(column names, rows) of a catalog query, with ``$1``... bound to ``parameters``
        (text, as clients send them); ``UnsupportedQuery`` if it does not bind."""
        sql = compatible(sql)
        bound = list(parameters) if parameters else None
        names = [name for name, _ in self._engine.describe(sql, bound)]
        rows = self._engine.fetch(sql, bound)
        if sum(len(str(value)) for row in rows for value in row) > MAX_ANSWER_CHARACTERS:
            raise UnsupportedQuery("this catalog look-up's answer is larger than a catalog listing can be",
                                   hint="select the names you need, with a WHERE or LIMIT")
        return names, rows

    def close(self) -> None:
        self._engine.close()


def compatible(sql: str) -> str:
    """A catalog query in the SQL DuckDB reads: psql writes ``OPERATOR(pg_catalog.~)`` and
    ``COLLATE pg_catalog.default``, drivers cast to OID alias types, and some functions
    DuckDB lacks are called qualified (``COMPAT_MACROS``).

    >>> compatible("SELECT 1 WHERE 'a' OPERATOR(pg_catalog.~) '^a$' COLLATE pg_catalog.default")
    "SELECT 1 WHERE 'a' ~ '^a$'"
    """
    sql = _OPERATOR.sub(lambda match: match.group(1), sql)
    sql = _COLLATE.sub("", sql)
    return _REG_CASTS.sub("::VARCHAR", _QUALIFIED.sub(lambda match: match.group(1) + "(", sql))


