"""PostgreSQL's catalog as psql, SQLAlchemy and JDBC read it, over DuckDB's.

DuckDB's ``pg_catalog`` views lack columns and tables that clients' catalog queries name
(psql's ``\\d`` reads ``pg_class.relforcerowsecurity``, ``\\l`` reads ``pg_database.datcollate``,
``\\d`` asks ``pg_policy``, ``pg_trigger``, ``pg_publication``...). The schema-only database
gets a table macro for each (``SHADOWS``): DuckDB's view with the missing columns, at the
value a database with no row security, partitions, triggers or publications has, or an empty
table with PostgreSQL's columns. ``shadowed`` points a query's references to those catalog
tables at the macros. Everything here reads the schema-only database, so it holds names and
types only: sizes are of empty tables.

>>> shadowed("SELECT c.relname FROM pg_catalog.pg_class c JOIN pg_namespace ON true")
'SELECT c.relname FROM pg_class() c JOIN pg_namespace() AS pg_namespace ON true'
>>> shadowed("SELECT pg_catalog.pg_class.relname FROM pg_catalog.pg_class")
'SELECT pg_class.relname FROM pg_class() AS pg_class'
>>> shadowed("WITH pg_class AS (SELECT 1 AS relname) SELECT relname FROM pg_class")
'WITH pg_class AS (SELECT 1 AS relname) SELECT relname FROM pg_class'
>>> shadowed("SELECT table_catalog FROM information_schema.tables t, information_schema.routines")
'SELECT table_catalog FROM information_schema_tables() t, information_schema.routines'
"""

from __future__ import annotations

import sqlglot
from sqlglot import exp
from sqlglot.dialects.dialect import Dialect
from sqlglot.errors import SqlglotError
from sqlglot.tokens import TokenType


def _empty(columns: str) -> str:
    """An empty table with ``columns`` (``name TYPE, ...``): a catalog DuckDB has no rows for.
    Type ``NULL`` is for a column clients compare with PostgreSQL's array literals (``'{0}'``),
    which DuckDB cannot read as a list."""
    listed = ", ".join(f"NULL{'' if kind == 'NULL' else '::' + kind} AS {name}" for name, kind in
                       (column.split() for column in columns.split(",")))
    return f"SELECT {listed} WHERE false"


SHADOWS = {
    # relam: no access method (DuckDB's pg_am lists its index type, ART, which psql took for the
    # tables'); relreplident 'd', PostgreSQL's default, which psql does not print; reltuples -1,
    # PostgreSQL's "never counted" (the empty copy's 0 would read as "no rows").
    "pg_class": "SELECT * REPLACE ('d' AS relreplident, relacl::VARCHAR AS relacl, NULL::INTEGER AS relam,"
                " -1::FLOAT AS reltuples, 0::INTEGER AS relpages,"
                " reloptions::VARCHAR[] AS reloptions, relpartbound::VARCHAR AS relpartbound),"
                " false AS relforcerowsecurity FROM pg_catalog.pg_class"
                # Only the served schemas' relations: DuckDB's own views (duckdb_tables, its
                # information_schema) are engine internals, listed with no schema (pgcli's views).
                " WHERE relnamespace IN (SELECT oid FROM pg_catalog.pg_namespace)",
    "pg_namespace": "SELECT * REPLACE (nspacl::VARCHAR AS nspacl) FROM pg_catalog.pg_namespace",
    # One database, the one served (``database``): DuckDB's lists its own (memory, system, temp).
    "pg_database": "SELECT 1::BIGINT AS oid, {database} AS datname, true AS datallowconn, false AS datistemplate, "
                   "6::INTEGER AS encoding, 'C' AS datcollate, 'C' AS datctype, NULL::VARCHAR AS "
                   "daticulocale, NULL::VARCHAR AS daticurules, 'c' AS datlocprovider, NULL::VARCHAR AS datacl, "
                   "10::BIGINT AS datdba, -1::INTEGER AS datconnlimit, 0::BIGINT AS dattablespace",
    "pg_attribute": "SELECT * REPLACE (attlen::INTEGER AS attlen, 'p' AS attstorage, attalign::VARCHAR AS attalign,"
                    " -1::INTEGER AS attstattarget,"
                    " ''::VARCHAR AS attcompression, attacl::VARCHAR AS attacl, attoptions::VARCHAR[] AS attoptions,"
                    " attfdwoptions::VARCHAR[] AS attfdwoptions, attmissingval::VARCHAR AS attmissingval)"
                    " FROM pg_catalog.pg_attribute",
    "pg_collation": "SELECT *, 11::BIGINT AS collnamespace, 10::BIGINT AS collowner, 'c' AS collprovider, "
                    "true AS collisdeterministic, -1::INTEGER AS collencoding, collname AS collcollate, "
                    "collname AS collctype FROM pg_catalog.pg_collation",
    "pg_index": "SELECT *, false AS indnullsnotdistinct FROM pg_catalog.pg_index",
    "pg_opclass": _empty("oid BIGINT, opcmethod BIGINT, opcname VARCHAR, opcnamespace BIGINT, opcowner BIGINT, "
                         "opcfamily BIGINT, opcintype BIGINT, opcdefault BOOLEAN, opckeytype BIGINT"),
    # The policy's rules as comments (``dpsql.server.described``); DuckDB's own lists every
    # column with no comment, which clients joining on it read as a second column.
    "pg_description": "{descriptions}",
    "pg_policy": _empty("oid BIGINT, polname VARCHAR, polrelid BIGINT, polcmd VARCHAR, polpermissive BOOLEAN, "
                        "polroles NULL, polqual VARCHAR, polwithcheck VARCHAR"),
    "pg_roles": "SELECT 10::BIGINT AS oid, 'curator' AS rolname, false AS rolsuper, true AS rolinherit, "
                "false AS rolcreaterole, false AS rolcreatedb, true AS rolcanlogin, false AS rolreplication, "
                "false AS rolbypassrls, -1::INTEGER AS rolconnlimit, NULL::TIMESTAMP AS rolvaliduntil",
    "pg_trigger": _empty("oid BIGINT, tgrelid BIGINT, tgparentid BIGINT, tgname VARCHAR, tgfoid BIGINT, "
                         "tgtype INTEGER, tgenabled VARCHAR, tgisinternal BOOLEAN, tgconstrrelid BIGINT, "
                         "tgconstrindid BIGINT, tgconstraint BIGINT, tgdeferrable BOOLEAN, tginitdeferred BOOLEAN, "
                         "tgnargs INTEGER, tgattr INTEGER[], tgargs VARCHAR, tgqual VARCHAR, "
                         "tgoldtable VARCHAR, tgnewtable VARCHAR"),
    "pg_inherits": _empty("inhrelid BIGINT, inhparent BIGINT, inhseqno INTEGER, inhdetachpending BOOLEAN"),
    "pg_partitioned_table": _empty("partrelid BIGINT, partstrat VARCHAR, partnatts INTEGER, partdefid BIGINT"),
    "pg_publication": _empty("oid BIGINT, pubname VARCHAR, pubowner BIGINT, puballtables BOOLEAN, "
                             "pubinsert BOOLEAN, pubupdate BOOLEAN, pubdelete BOOLEAN, pubtruncate BOOLEAN, "
                             "pubviaroot BOOLEAN"),
    "pg_publication_rel": _empty("oid BIGINT, prpubid BIGINT, prrelid BIGINT, prqual VARCHAR, prattrs INTEGER[]"),
    "pg_publication_namespace": _empty("oid BIGINT, pnpubid BIGINT, pnnspid BIGINT"),
    "pg_statistic_ext": _empty("oid BIGINT, stxrelid BIGINT, stxname VARCHAR, stxnamespace BIGINT, "
                               "stxowner BIGINT, stxstattarget INTEGER, stxkeys INTEGER[], stxkind VARCHAR[], "
                               "stxexprs VARCHAR"),
    "pg_foreign_table": _empty("ftrelid BIGINT, ftserver BIGINT, ftoptions VARCHAR[]"),
    "pg_auth_members": _empty("oid BIGINT, roleid BIGINT, member BIGINT, grantor BIGINT, admin_option BOOLEAN, "
                              "inherit_option BOOLEAN, set_option BOOLEAN"),
    "pg_extension": _empty("oid BIGINT, extname VARCHAR, extowner BIGINT, extnamespace BIGINT, "
                           "extrelocatable BOOLEAN, extversion VARCHAR"),
    # DuckDB's lists its own functions (``glob``, ``read_text``...): engine internals, which no
    # analyst calls. Listed empty, as a database with no functions of its own (psql's ``\\df``,
    # pgcli's completion); the functions a query may use are in docs/sql.md.
    "pg_proc": _empty("oid BIGINT, proname VARCHAR, pronamespace BIGINT, proowner BIGINT, prolang BIGINT, "
                      "procost FLOAT, prorows FLOAT, provariadic BIGINT, prosupport VARCHAR, prokind VARCHAR, "
                      "prosecdef BOOLEAN, proleakproof BOOLEAN, proisstrict BOOLEAN, proretset BOOLEAN, "
                      "provolatile VARCHAR, proparallel VARCHAR, pronargs INTEGER, pronargdefaults INTEGER, "
                      "prorettype BIGINT, proargtypes NULL, proallargtypes NULL, proargmodes NULL, "
                      "proargnames NULL, proargdefaults VARCHAR, protrftypes NULL, prosrc VARCHAR, probin VARCHAR, "
                      "prosqlbody VARCHAR, proconfig NULL, proacl VARCHAR"),
    "pg_language": _empty("oid BIGINT, lanname VARCHAR, lanowner BIGINT, lanispl BOOLEAN, lanpltrusted BOOLEAN, "
                          "lanplcallfoid BIGINT, laninline BIGINT, lanvalidator BIGINT, lanacl VARCHAR"),
    # The fixed settings SHOW answers (``{settings}``), never DuckDB's (paths, memory, user).
    "pg_settings": "{settings}",
    "pg_stat_activity": _empty("datid BIGINT, datname VARCHAR, pid INTEGER, usesysid BIGINT, usename VARCHAR, "
                               "application_name VARCHAR, client_addr VARCHAR, backend_start TIMESTAMP, "
                               "xact_start TIMESTAMP, query_start TIMESTAMP, state_change TIMESTAMP, "
                               "wait_event_type VARCHAR, wait_event VARCHAR, state VARCHAR, backend_type VARCHAR, "
                               "query VARCHAR"),
    "pg_rewrite": _empty("oid BIGINT, rulename VARCHAR, ev_class BIGINT, ev_type VARCHAR, ev_enabled VARCHAR, "
                         "is_instead BOOLEAN, ev_qual VARCHAR, ev_action VARCHAR"),
}
"""Catalog tables clients read, as table macros of the schema-only database (name -> body, with
``{database}`` the served database's name as a SQL string, ``{settings}`` ``settings_rows``)."""


def settings_rows(settings: dict[str, str]) -> str:
    """``pg_settings``' rows for ``settings`` (name -> value, as SHOW answers them), each at its
    default, with PostgreSQL's columns: one row per setting with a one-word name.

    >>> print(settings_rows({"timezone": "UTC", "transaction isolation level": "x"}).split(" FROM ")[-1])
    (VALUES ('TimeZone', 'UTC')) AS s(name, setting)
    """
    quoted = lambda text: "'" + text.replace("'", "''") + "'"  # noqa: E731
    rows = ", ".join(f"({quoted(CASED.get(name, name))}, {quoted(value)})"
                     for name, value in sorted(settings.items()) if " " not in name)
    columns = ", ".join(f"{value} AS {column}" for column, value in (
        ("unit", "NULL::VARCHAR"), ("category", "'dpsql'"), ("short_desc", "NULL::VARCHAR"),
        ("extra_desc", "NULL::VARCHAR"), ("context", "'internal'"), ("vartype", "'string'"),
        ("source", "'default'"), ("min_val", "NULL::VARCHAR"), ("max_val", "NULL::VARCHAR"),
        ("enumvals", "NULL"), ("boot_val", "setting"), ("reset_val", "setting"), ("sourcefile", "NULL::VARCHAR"),
        ("sourceline", "NULL::INTEGER"), ("pending_restart", "false")))
    return f"SELECT name, setting, {columns} FROM (VALUES {rows}) AS s(name, setting)"


CASED = {"datestyle": "DateStyle", "timezone": "TimeZone", "intervalstyle": "IntervalStyle"}
"""Settings PostgreSQL names in mixed case in ``pg_settings``."""


FUNCTIONS = {
    "pg_get_userbyid": "(role) AS 'curator'",
    "format_type": "(type_oid, typemod) AS CASE pg_catalog.format_type(type_oid, typemod) " + " ".join(
        f"WHEN '{duck}' THEN '{postgres}'" for duck, postgres in (
            ("int2", "smallint"), ("int4", "integer"), ("int8", "bigint"), ("float4", "real"),
            ("float8", "double precision"), ("varchar", "character varying"), ("bool", "boolean"),
            ("timestamp", "timestamp without time zone"), ("timestamptz", "timestamp with time zone"),
            ("time", "time without time zone"), ("timetz", "time with time zone")))
        + " ELSE pg_catalog.format_type(type_oid, typemod) END",
    "pg_encoding_to_char": "(encoding) AS 'UTF8'",
    "to_regtype": "(name) AS NULL::BIGINT",
    "pg_get_expr": "(expr, relation) AS expr, (expr, relation, pretty) AS expr",
    "pg_relation_is_publishable": "(relation) AS false",
    "pg_get_serial_sequence": "(relation, column_name) AS NULL::VARCHAR",
    # pgjdbc's getPrimaryKeys and getIndexInfo: an index's key columns, one row each, with their place.
    "_pg_expandarray": "(items) AS unnest(list_transform(items, lambda item, place: {'x': item, 'n': place}))",
    # SQLAlchemy builds identity and collation details with it, only for columns that have them.
    "json_build_object": ", ".join("(" + ", ".join(f"a{i}" for i in range(n)) + ") AS NULL::VARCHAR"
                                   for n in range(2, 17, 2)),
    "array_upper": "(items, dimension) AS len(items)",
    "pg_is_in_recovery": "() AS false",
    # pgcli's \\sv: the database has no views; PostgreSQL answers '' for a relation with no view rule.
    "pg_get_viewdef": "(view) AS ''::VARCHAR, (view, pretty) AS ''::VARCHAR",
    "array_remove": "(items, item) AS list_filter(items, lambda kept: kept IS DISTINCT FROM item)",
    **{function: "(function_oid) AS NULL::VARCHAR" for function in (
        "pg_get_function_result", "pg_get_function_arguments", "pg_get_function_identity_arguments",
        "pg_get_functiondef", "pg_get_function_sqlbody")},
    **{size: "(relation) AS NULL::BIGINT" for size in (
        "pg_table_size", "pg_relation_size", "pg_total_relation_size", "pg_indexes_size",
        "pg_database_size")},
    **{definition: "(a) AS NULL::VARCHAR, (a, b) AS NULL::VARCHAR, (a, b, c) AS NULL::VARCHAR"
       for definition in ("pg_get_statisticsobjdef_columns", "pg_get_statisticsobjdef", "pg_get_indexdef",
                          "pg_get_triggerdef", "pg_get_ruledef", "pg_get_partkeydef",
                          "pg_get_partition_constraintdef", "pg_tablespace_location")}}
"""PostgreSQL functions psql's backslash commands call that DuckDB lacks: fixed answers. Sizes are
unknown (NULL): a private table's size would count its rows, and the schema-only database's
empty tables would say 0, which reads as "empty". DuckDB will not add functions to its own
pg_catalog, so they are made in ``main`` and calls are unqualified first
(``dpsql.server.catalog.compatible``)."""


SERVED = {
    "current_database": ("served_database", "() AS {database}"),
    "current_catalog": ("served_catalog", "() AS {database}"),
    "current_schemas": ("served_schemas", "(implicit) AS CASE WHEN implicit THEN ['pg_catalog', 'main'] "
                                          "ELSE ['main'] END"),
}
"""PostgreSQL's function -> (the macro answering it, its definition): the served database's name
where DuckDB answers "memory" (its name of the in-memory schema-only database), and the schema
search path once each (DuckDB's listed ``main`` three times); ``{database}`` is the name as a SQL
string. Calls are renamed (``served_calls``), not shadowed: DuckDB's own catalog views call
``current_database()``, and a macro of that name emptied them."""


def served_calls(sql: str) -> str:
    """``sql`` with each call of a function of ``SERVED`` (unqualified or ``pg_catalog.``, not
    quoted, not in a string) calling its macro instead; ``current_catalog`` is also PostgreSQL's
    keyword, without parentheses.

    >>> served_calls("SELECT pg_catalog.current_database(), current_catalog, 'current_catalog', x.current_schemas(1)")
    "SELECT served_database(), served_catalog(), 'current_catalog', x.current_schemas(1)"
    """
    tokens = _tokens(sql)
    if tokens is None:
        return sql
    spans = []
    for i, token in enumerate(tokens):
        name = token.text.lower()
        if name not in SERVED or token.token_type not in (TokenType.VAR, TokenType.CURRENT_CATALOG):
            continue
        start = token.start
        if i > 0 and tokens[i - 1].token_type == TokenType.DOT:
            if i < 2 or tokens[i - 2].text.lower() != "pg_catalog" or tokens[i - 2].token_type != TokenType.VAR:
                continue
            start = tokens[i - 2].start
        called = i + 1 < len(tokens) and tokens[i + 1].token_type == TokenType.L_PAREN
        if not called and name != "current_catalog":
            continue
        spans.append((start, token.end + 1, SERVED[name][0] + ("" if called else "()")))
    return _spliced(sql, spans)


IDENTITY = {"current_user": "served_current_user", "session_user": "served_session_user",
            "user": "served_user", "current_role": "served_current_role"}
"""PostgreSQL's words for who is asking -> the macro (``(analyst) AS analyst``) answering each
with the analyst the session authenticated (``as_analyst``); DuckDB's own answer "duckdb"."""


def as_analyst(sql: str, analyst: str) -> str:
    """``sql`` with each of PostgreSQL's words for who is asking (``IDENTITY``: unquoted, not a
    qualified name or an alias; ``current_user`` and ``session_user`` also with DuckDB's ``()``)
    answered with ``analyst``, the name the session authenticated: never one the SQL gives.

    >>> print(as_analyst("SELECT current_user, user AS u, session_user(), x.user, 1 AS user, 'user'", "o'n"))
    SELECT served_current_user('o''n'), served_user('o''n') AS u, served_session_user('o''n'), x.user, 1 AS user, 'user'

    """
    tokens = _tokens(sql)
    if tokens is None:
        return sql
    spans = []
    for i, token in enumerate(tokens):
        word = token.text.lower()
        keyword = token.token_type in (TokenType.CURRENT_USER, TokenType.SESSION_USER)
        if word not in IDENTITY or not (keyword or token.token_type == TokenType.VAR):
            continue
        if i > 0 and tokens[i - 1].token_type in (TokenType.DOT, TokenType.ALIAS):
            continue
        end = token.end + 1
        called = i + 2 < len(tokens) and tokens[i + 1].token_type == TokenType.L_PAREN
        if called and keyword and tokens[i + 2].token_type == TokenType.R_PAREN:
            end = tokens[i + 2].end + 1
        elif called:  # a function of that name, not PostgreSQL's word
            continue
        spans.append((token.start, end, f"{IDENTITY[word]}('{analyst.replace(chr(39), chr(39) * 2)}')"))
    return _spliced(sql, spans)


def _tokens(sql: str) -> list | None:
    """``sql``'s PostgreSQL tokens, or ``None`` when it does not tokenize (left as it is)."""
    try:
        return Dialect.get_or_raise("postgres").tokenize(sql)
    except SqlglotError:
        return None


def _spliced(sql: str, spans: list[tuple[int, int, str]]) -> str:
    """``sql`` with each (start, end, text) span, in order and apart, replaced by its text."""
    for start, end, text in reversed(spans):
        sql = sql[:start] + text + sql[end:]
    return sql


def engine_identity(sql: str) -> str | None:
    """The first of ``IDENTITY``'s words left in ``sql`` after ``as_analyst`` (quoted, qualified
    or called otherwise), other than as an alias: DuckDB answers each spelling with its own user
    ("duckdb"), so a look-up naming one is refused; ``None`` when there is none.

    >>> [engine_identity(as_analyst(sql, "alice")) for sql in (
    ...     'SELECT "user"', "SELECT main.current_user()", 'SELECT current_user AS "user"', "SELECT 'user'")]
    ['user', 'current_user', None, None]
    """
    tokens = _tokens(sql)
    if tokens is None:
        return None
    for i, token in enumerate(tokens):
        if token.text.lower() in IDENTITY and token.token_type != TokenType.STRING \
                and not (i > 0 and tokens[i - 1].token_type == TokenType.ALIAS):
            return token.text.lower()
    return None


def served_column(name: str) -> str:
    """A result column's name as PostgreSQL gives it to a call of ``SERVED`` (DuckDB names it
    by the macro's call).

    >>> served_column("served_database()"), served_column("served_schemas(false)"), served_column("n")
    ('current_database', 'current_schemas', 'n')
    >>> served_column("served_user('alice')"), served_column("served_current_user('alice')")
    ('user', 'current_user')
    """
    for function, macro in [*((function, macro) for function, (macro, _) in SERVED.items()), *IDENTITY.items()]:
        if name.startswith(f"{macro}(") and name.endswith(")"):
            return function
    return name


INFORMATION_VIEWS = ("tables", "columns", "schemata", "views", "table_constraints", "key_column_usage",
                     "referential_constraints", "check_constraints", "constraint_column_usage",
                     "constraint_table_usage", "character_sets")
"""``information_schema`` views with catalog columns (``table_catalog``...), read through macros
``information_schema_<view>()`` (``information_view``) that name the served database there."""
DUCKDB_CATALOGS = ("memory", "system")
"""DuckDB's names of the schema-only database and of its built-in one (``information_schema`` and
``pg_catalog``): both are the served database to a client."""


def information_view(view: str, columns: list[str], database: str) -> str:
    """The body of the macro standing for ``information_schema.<view>``, whose ``columns`` are
    given: each catalog column names ``database`` (a SQL string) where DuckDB names its own, and
    ``schemata`` lists the schemas a client of the served database sees (not DuckDB's temp
    database's or its built-in ``main``).

    >>> print(information_view("views", ["table_catalog", "table_name"], "'shop'").replace(" ELSE", "\\n ELSE"))
    SELECT * REPLACE (CASE WHEN table_catalog IN ('memory', 'system') THEN 'shop'
     ELSE table_catalog END AS table_catalog) FROM information_schema.views
    """
    named = ", ".join(f"CASE WHEN {column} IN {DUCKDB_CATALOGS} THEN {database} ELSE {column} END AS {column}"
                      for column in columns if column == "catalog_name" or column.endswith("_catalog"))
    body = f"SELECT * REPLACE ({named}) FROM information_schema.{view}" if named \
        else f"SELECT * FROM information_schema.{view}"
    if view == "schemata":
        body += " WHERE catalog_name = 'memory' OR (catalog_name = 'system' AND schema_name <> 'main')"
    return body


DESCRIBING = {
    "obj_description": ", ".join(f"({arguments}) AS (SELECT min(description) FROM pg_description() d "
                                 "WHERE d.objoid = id AND d.objsubid = 0)" for arguments in ("id", "id, kind")),
    "col_description": "(relation, number) AS (SELECT min(description) FROM pg_description() d "
                       "WHERE d.objoid = relation AND d.objsubid = number)",
}
"""PostgreSQL's comment look-ups, over ``pg_description()``: made after it."""


def shadowed(sql: str) -> str:
    """``sql`` with each reference to a catalog table of ``SHADOWS`` (``pg_catalog.pg_class``,
    or unqualified and not a CTE) read from its macro, and columns named with their schema
    (``pg_catalog.pg_type.oid``) by their table; any reference whose place in the text cannot
    be told exactly is left as written."""
    try:
        tree = sqlglot.parse_one(sql, read="postgres")
    except SqlglotError:
        return sql
    ctes = {cte.alias_or_name.lower() for cte in tree.find_all(exp.CTE)}
    spans = []
    for table in tree.find_all(exp.Table):
        name, schema = table.name.lower(), table.db.lower()
        if schema == "information_schema" and name in INFORMATION_VIEWS and not table.catalog \
                and isinstance(table.this, exp.Identifier):
            start, end = table.args["db"].meta.get("start"), table.this.meta.get("end")
            if start is not None and end is not None \
                    and "".join(sql[start:end + 1].split()).replace('"', "").lower() == f"{schema}.{name}":
                spans.append((start, end + 1, f"information_schema_{name}()" + ("" if table.alias else f" AS {name}")))
            continue
        if name not in SHADOWS or table.catalog or schema not in ("", "pg_catalog") \
                or (not schema and name in ctes) or not isinstance(table.this, exp.Identifier):
            continue
        first = table.args["db"] if schema else table.this
        start, end = first.meta.get("start"), table.this.meta.get("end")
        if start is None or end is None:
            continue
        written = "".join(sql[start:end + 1].split()).replace('"', "").lower()
        if written != (f"pg_catalog.{name}" if schema else name):
            continue
        spans.append((start, end + 1, f"{name}()" + ("" if table.alias else f" AS {name}")))
    for column in tree.find_all(exp.Column):  # pg_catalog.pg_class.relname (SQLAlchemy): pg_class.relname,
        name = column.table.lower()           # which DuckDB binds (it binds no schema.table.column there)
        if column.db.lower() == "pg_catalog" and not column.catalog:
            start, end = column.args["db"].meta.get("start"), column.args["table"].meta.get("end")
            if start is not None and end is not None \
                    and "".join(sql[start:end + 1].split()).replace('"', "").lower() == f"pg_catalog.{name}":
                spans.append((start, end + 1, name))
    for start, end, text in sorted(spans, reverse=True):
        sql = sql[:start] + text + sql[end:]
    return sql
