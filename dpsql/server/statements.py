"""What a client sent, decided from its text alone: a query for dpsql, a catalog look-up,
client chatter answered with a fixed reply, or a refusal.

Clients send chatter on connecting (psycopg, JDBC and SQLAlchemy send ``SET``, ``SHOW``,
``BEGIN``...). Those get canned answers that read nothing: no statement but a single
SELECT (or EXPLAIN of one) ever reaches a database.

>>> classify("SET extra_float_digits = 3").reply.tag
'SET'
>>> classify("show time zone").reply.rows
(('UTC',),)
>>> classify("select 1; drop table visits").sqlstate
'42601'
>>> classify("COPY visits TO '/tmp/x'").message
'COPY statements are not accepted: this server answers a single SELECT query'
>>> classify("  SELECT COUNT(*) FROM visits;").kind
'query'
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from sqlglot.dialects.dialect import Dialect
from sqlglot.errors import TokenError
from sqlglot.tokens import TokenType

SERVER_VERSION = "16.0"
"""What clients are told: they pick catalog queries and features by this version."""
VERSION_TEXT = f"PostgreSQL {SERVER_VERSION} (dpsql differential-privacy server)"

CATALOG_SCHEMAS = frozenset({"pg_catalog", "information_schema"})
"""The schemas of PostgreSQL's catalog, which the server answers itself (``dpsql.server.catalog``)."""

SETTINGS = {
    "server_version": SERVER_VERSION, "server_version_num": "160000", "server_encoding": "UTF8",
    "client_encoding": "UTF8", "datestyle": "ISO, MDY", "timezone": "UTC", "intervalstyle": "postgres",
    "integer_datetimes": "on", "standard_conforming_strings": "on", "transaction_isolation": "read committed",
    "transaction isolation level": "read committed", "default_transaction_isolation": "read committed",
    "transaction_read_only": "on", "default_transaction_read_only": "on", "search_path": "main",
    "max_identifier_length": "63", "lc_collate": "C", "lc_ctype": "C", "lc_messages": "C", "lc_monetary": "C",
    "lc_numeric": "C", "lc_time": "C", "extra_float_digits": "3",
    "is_superuser": "off",
}
"""Fixed answers to SHOW: nothing here depends on the data or can be changed by SET."""
SHOWN_AS = {"time zone": "timezone"}
"""SHOW's other spellings of a setting (pgcli asks ``SHOW TIME ZONE`` on connecting)."""

WRITES = frozenset({"INSERT", "UPDATE", "DELETE", "MERGE", "CREATE", "DROP", "ALTER", "COPY", "ATTACH",
                    "DETACH", "PRAGMA", "INSTALL", "LOAD", "EXPORT", "IMPORT", "GRANT", "REVOKE",
                    "TRUNCATE", "CALL", "CHECKPOINT", "VACUUM", "USE", "UPSERT", "REPLACE"})
"""Statements that would change or reach beyond the database: a privilege the analyst lacks."""
QUERY_STARTS = frozenset({"SELECT", "WITH", "(", "VALUES", "TABLE", "FROM"})
TAGS = {"SET": ("SET", None), "RESET": ("RESET", None), "DISCARD": ("DISCARD ALL", None),
        "DEALLOCATE": ("DEALLOCATE", None), "BEGIN": ("BEGIN", "T"), "START": ("START TRANSACTION", "T"),
        "COMMIT": ("COMMIT", "I"), "END": ("COMMIT", "I"), "ROLLBACK": ("ROLLBACK", "I"),
        "ABORT": ("ROLLBACK", "I"), "SAVEPOINT": ("SAVEPOINT", None), "RELEASE": ("RELEASE", None),
        "UNLISTEN": ("UNLISTEN", None), "CLOSE": ("CLOSE CURSOR", None)}
"""Session chatter with no effect here, its command tag and the transaction status after it."""


@dataclass(frozen=True)
class Reply:
    """A fixed answer: columns, rows (already released or public) and a command tag."""

    columns: tuple = ()
    rows: tuple = ()
    tag: str = "SELECT 0"
    transaction: str | None = None
    """'T' after BEGIN, 'I' after COMMIT or ROLLBACK, ``None``: unchanged."""


@dataclass(frozen=True)
class Statement:
    """One decided statement."""

    kind: str
    """'empty', 'reply', 'budget', 'policy', 'ledger', 'explain', 'query', 'setting' (one of
    the session's own, ``SESSION_SETTINGS``) or 'refused'."""
    sql: str = ""
    """The query for dpsql or the catalog (for 'explain': the query explained)."""
    reply: Reply | None = None
    sqlstate: str = ""
    message: str = ""
    hint: str | None = None
    position: int | None = None
    """1-based character offset of what was refused."""
    offset: int = 0
    """Where ``sql`` starts in the string the client sent (0-based), for error positions."""
    parameters: tuple = ()
    """Values bound to ``$1``, ``$2``... (extended protocol), as text: catalog queries only."""
    setting: tuple | None = None
    """For 'setting': (name, value): ``SET`` gives the value, ``SHOW`` None, ``RESET`` False."""
    intervals: bool = False
    """For a query: answer with ``<column>_low``/``_high`` (the session's ``dpsql.intervals``)."""
    verbose: bool = False
    """For 'explain': ``EXPLAIN VERBOSE``, with the SQL that runs (else a summary without it)."""
    reads_a_table: bool = False
    """For a query: it reads, at its top level, a table no catalog look-up reads
    (``reads_a_plain_table``), so it is dpsql's without parsing it as one."""


MAX_QUERY_CHARACTERS = 32 << 10
"""Longest query string answered: checking a query costs time in proportion to its text, and
queries are answered one at a time, so a megabyte-long refusal (a 150,000-value IN list)
stalled every other analyst for seconds at no cost to its sender (an attacker's review)."""


def classify(sql: str) -> Statement:
    """Decide ``sql`` from its text: see the module's docstring."""
    if len(sql) > MAX_QUERY_CHARACTERS:
        return Statement("refused", sqlstate="54000", message=f"the query string is {len(sql):,} characters long, "
                         f"more than the {MAX_QUERY_CHARACTERS:,} this server reads",
                         hint="write a shorter query: group values into a public table and join it")
    try:
        tokens = Dialect.get_or_raise("postgres").tokenize(sql)
    except TokenError as error:
        return Statement("refused", sqlstate="42601", message=f"the SQL does not tokenize: {error}",
                         hint="close every string, quoted name and comment")
    ends = [t for t in tokens if t.token_type == TokenType.SEMICOLON]
    rest = [t for t in tokens if t.token_type != TokenType.SEMICOLON]
    if not rest:
        return Statement("empty")
    if any(t.start > ends[0].start for t in rest) if ends else False:
        second = next(t for t in rest if t.start > ends[0].start)
        return Statement("refused", sqlstate="42601", position=second.start + 1,
                         message="the query string holds more than one statement",
                         hint="send one SELECT per query, without a second statement after ';'")
    text = sql[rest[0].start:rest[-1].end + 1]
    word = rest[0].text.upper()
    if word in ("SET", "RESET") and (own := session_setting(rest)) is not None:
        return own
    if word in TAGS:
        tag, transaction = TAGS[word]
        return Statement("reply", sql=text, reply=Reply(tag=tag, transaction=transaction))
    if word == "SHOW":
        return show(text, rest[0].start + 1)
    if word == "EXPLAIN":
        after = text[len(rest[0].text):]
        verbose, start = explain_options(after)
        offset = rest[0].start + len(rest[0].text) + start
        return Statement("explain", sql=after[start:].strip(), offset=offset, verbose=verbose)
    if word in QUERY_STARTS:
        version = version_reply(text)
        return Statement("reply", reply=version) if version else Statement("query", sql=text,
                                                                            offset=rest[0].start,
                                                                            reads_a_table=reads_a_plain_table(rest))
    sqlstate = "42501" if word in WRITES else "0A000"
    return Statement("refused", sql=text, sqlstate=sqlstate, position=rest[0].start + 1,
                     message=f"{word} statements are not accepted: this server answers a single SELECT query",
                     hint="ask with SELECT ... (epsilon and delta in SELECT WITH DIFFERENTIAL_PRIVACY "
                          "OPTIONS (epsilon = 0.1) ...), SHOW budget for what remains")


def reads_a_plain_table(tokens: list) -> bool:
    """True when the tokens of a query read, outside every parenthesis, ``FROM`` or ``JOIN`` a
    table that is neither in a catalog schema nor named ``pg_...``, and no ``WITH`` names a CTE:
    then ``dpsql.server.catalog.catalog_query`` is False for it, and the server need not parse it
    a second time to know (0.2 ms of CPU, ~2% of a small query). ``IS DISTINCT FROM x`` names no
    table; a name followed by ``(`` or a third part is left to the parse.

    >>> from sqlglot.dialects.dialect import Dialect
    >>> def reads(sql): return reads_a_plain_table(Dialect.get_or_raise("postgres").tokenize(sql))
    >>> reads("SELECT COUNT(*) FROM visits"), reads('SELECT 1 FROM pg_catalog.pg_class JOIN "Shop".t ON true')
    (True, True)
    >>> reads("SELECT * FROM pg_class"), reads("SELECT EXTRACT(year FROM d) FROM pg_type"), reads("SELECT 1")
    (False, False, False)
    >>> reads("WITH t AS (SELECT 1) SELECT * FROM t"), reads("SELECT * FROM pg_type WHERE a IS DISTINCT FROM b")
    (False, False)
    """
    names = (TokenType.VAR, TokenType.IDENTIFIER)
    if any(t.token_type == TokenType.WITH for t in tokens):
        return False
    depth = 0
    for i, token in enumerate(tokens):
        kind = token.token_type
        depth += (kind == TokenType.L_PAREN) - (kind == TokenType.R_PAREN)
        if depth or kind not in (TokenType.FROM, TokenType.JOIN) or i + 1 >= len(tokens):
            continue
        if kind == TokenType.FROM and i and tokens[i - 1].token_type == TokenType.DISTINCT:
            continue
        parts, j = [], i + 1
        while j < len(tokens) and tokens[j].token_type in names:
            parts.append(tokens[j].text.lower())
            if j + 1 < len(tokens) and tokens[j + 1].token_type == TokenType.DOT:
                j += 2
                continue
            j += 1
            break
        after = tokens[j].token_type if j < len(tokens) else None
        if not parts or len(parts) > 2 or after in (TokenType.L_PAREN, TokenType.DOT):
            continue
        schema, name = (parts[0], parts[1]) if len(parts) == 2 else ("", parts[0])
        if schema not in CATALOG_SCHEMAS and (schema or not name.startswith("pg_")):
            return True
    return False


_EXPLAIN_VERBOSE = re.compile(r"\s*(?:VERBOSE\b|\(\s*VERBOSE(?:\s+(\w+))?\s*\))\s*", re.IGNORECASE)


def explain_options(after: str) -> tuple[bool, int]:
    """Whether an EXPLAIN asks for VERBOSE (``EXPLAIN VERBOSE q``, ``EXPLAIN (VERBOSE) q``,
    ``EXPLAIN (VERBOSE true) q``), and where in ``after`` (the text after EXPLAIN) the query starts.

    >>> explain_options(" SELECT 1"), explain_options(" VERBOSE SELECT 1"), explain_options(" (verbose on) SELECT 1")
    ((False, 1), (True, 9), (True, 14))
    >>> explain_options(" (VERBOSE false) SELECT 1"), explain_options(" (ANALYZE) SELECT 1")
    ((False, 17), (False, 1))
    """
    match = _EXPLAIN_VERBOSE.match(after)
    if match is None or (match.group(1) is not None and match.group(1).lower() not in _TRUE + _FALSE):
        return False, len(after) - len(after.lstrip())
    return match.group(1) is None or match.group(1).lower() in _TRUE, match.end()


SESSION_SETTINGS = ("dpsql.intervals",)
"""Settings a session may change: ``dpsql.intervals`` (off by default) adds each noisy column's
95% interval as ``<column>_low``/``_high`` to every answer, as ``OPTIONS (intervals = true)``
does for one query (for BI tools, which write the SQL themselves)."""
_TRUE, _FALSE = ("on", "true", "yes", "1"), ("off", "false", "no", "0")


def session_setting(tokens: list) -> Statement | None:
    """``SET [SESSION] dpsql.intervals {= | TO} on|off`` or ``RESET dpsql.intervals``; ``None``
    for any other SET or RESET (chatter, answered with a fixed reply).

    >>> from sqlglot.dialects.dialect import Dialect
    >>> def decided(sql): return session_setting(Dialect.get_or_raise("postgres").tokenize(sql))
    >>> decided("SET dpsql.intervals = on").setting, decided("RESET dpsql.intervals").setting
    (('dpsql.intervals', True), ('dpsql.intervals', False))
    >>> decided("SET dpsql.intervals TO 'maybe'").message
    'invalid value for parameter "dpsql.intervals": "maybe"'
    >>> decided("SET search_path = main") is None
    True
    """
    words = [t.text for t in tokens[1:]]
    if words and words[0].upper() in ("SESSION", "LOCAL"):
        words = words[1:]
    split = next((i for i, w in enumerate(words) if w == "=" or w.upper() == "TO"), len(words))
    name = "".join(words[:split]).lower().strip('"')
    if name not in SESSION_SETTINGS:
        return None
    if tokens[0].text.upper() == "RESET":
        return Statement("setting", setting=(name, False)) if split == len(words) else None
    value = "".join(words[split + 1:]).lower().strip("'\"")
    if value not in _TRUE + _FALSE:
        return Statement("refused", sqlstate="22023", position=tokens[0].start + 1,
                         message=f'invalid value for parameter "{name}": "{value}"',
                         hint=f"write SET {name} = on (or off)")
    return Statement("setting", setting=(name, value in _TRUE))


def show(text: str, position: int) -> Statement:
    """SHOW budget (the analyst's budget as a result set), a session setting, or a fixed one."""
    name = " ".join(text.split()[1:]).lower().strip('"')
    name = SHOWN_AS.get(name, name)
    if name in ("budget", "policy", "ledger"):
        return Statement(name, sql=text)
    if name in SESSION_SETTINGS:
        return Statement("setting", setting=(name, None))
    if name == "all":
        return Statement("reply", reply=Reply(("name", "setting"), tuple(sorted(SETTINGS.items())),
                                              f"SHOW {len(SETTINGS)}"))
    if name in SETTINGS:
        column = name.split()[-1] if " " not in name else "transaction_isolation"
        return Statement("reply", reply=Reply((column,), ((SETTINGS[name],),), "SHOW"))
    return Statement("refused", sqlstate="42704", position=position,
                     message=f"unrecognized configuration parameter \"{name}\"",
                     hint="SHOW budget shows what remains of your privacy budget, SHOW policy the "
                          "rules, SHOW ledger your past queries, SHOW dpsql.intervals whether answers "
                          "carry their intervals as columns")


_VERSION = re.compile(r"select\s+(pg_catalog\s*\.\s*)?version\s*\(\s*\)(\s+as\s+(\w+))?", re.IGNORECASE)


def version_reply(text: str) -> Reply | None:
    """``SELECT version()``: drivers read the server's version from it."""
    match = _VERSION.fullmatch(text.strip())
    if match is None:
        return None
    return Reply((match.group(3) or "version",), ((VERSION_TEXT,),), "SELECT 1")


LEDGER_COLUMNS = ("id", "time", "analyst", "sql", "epsilon", "delta", "rho")
"""What ``SHOW ledger`` shows of the analyst's own entries (not the stored answers)."""


def ledger_reply(frame, accounting: str = "basic") -> Reply:
    """The analyst's ledger entries (``Connection.ledger()``, oldest first) as rows, numbered
    1, 2, ... among their own: the ledger's ids count every analyst's queries, so gaps between
    them told an analyst how many queries the others asked, and when (an attacker's review).
    rho only where the policy accounts in it (under BASIC it is not what is spent, and only
    misleads).

    >>> import pandas
    >>> frame = pandas.DataFrame({"id": [4, 9], "time": ["t1", "t2"], "analyst": ["ada", "ada"],
    ...                           "sql": ["q1", "q2"], "epsilon": [0.1, 0.2], "delta": [0.0, 0.0],
    ...                           "rho": [float("nan")] * 2})
    >>> [row[0] for row in ledger_reply(frame).rows], ledger_reply(frame).columns[-1]
    ([1, 2], 'delta')
    """
    columns = LEDGER_COLUMNS if accounting != "basic" else LEDGER_COLUMNS[:-1]
    rows = tuple((number, *(None if value != value else value for value in row[1:]))  # NaN rho: NULL
                 for number, row in enumerate(frame[list(columns)].itertuples(index=False, name=None), 1))
    return Reply(columns, rows, f"SHOW {len(rows)}")


def budget_reply(budget) -> Reply:
    """A ``Budget`` as rows: the database-wide budget and, if the policy gives one, the
    analyst's own."""
    rows = [("total", budget)] + ([(f"analyst {budget.analyst.owner}", budget.analyst)]
                                  if budget.analyst is not None else [])
    columns = ("scope", "epsilon_total", "epsilon_spent", "epsilon_remaining",
               "delta_total", "delta_spent", "delta_remaining")
    values = tuple((scope, float(b.total.epsilon), float(b.spent.epsilon), float(b.remaining.epsilon),
                    float(b.total.delta), float(b.spent.delta), float(b.remaining.delta))
                   for scope, b in rows)
    return Reply(columns, values, f"SHOW {len(values)}")
