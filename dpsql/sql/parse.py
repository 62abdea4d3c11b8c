"""Stage 1, parse: SQL text to a sqlglot AST (DuckDB dialect), or a positioned refusal.

Only one statement is accepted, and it must be a query. Comments are dropped here, so no
analyst text can ever reach DuckDB except through SQL that dpsql regenerates from the AST.

>>> parse_query("SELECT COUNT(*) FROM visits -- hello").sql()
'SELECT COUNT(*) FROM visits'
>>> try:
...     parse_query("SELECT 1; SELECT 2")
... except UnsupportedQuery as refused:
...     print(refused)
only one statement can be run at a time, found 2 (line 1, column 11). Hint: send each statement on its own.
"""

from __future__ import annotations

import logging
import re
import threading
from contextlib import contextmanager
from dataclasses import dataclass
from typing import cast

import sqlglot
from sqlglot import exp
from sqlglot.dialects.dialect import Dialect
from sqlglot.errors import ParseError, TokenError
from sqlglot.tokens import TokenType

from dpsql.errors import DPError, UnsupportedQuery, position_of
from dpsql.sql.dialect import DIALECT, DPDuckDB, dp_options, strip_dp_options


@dataclass(frozen=True)
class ParsedQuery:
    """A query AST and the options written in its SELECT WITH DIFFERENTIAL_PRIVACY clause."""

    tree: exp.Expression
    """The query, without the clause and without comments."""
    options: dict
    """Option name -> ``dpsql.sql.dialect.OptionValue`` (value with its position)."""


def parse(sql: str) -> ParsedQuery:
    """Parse ``sql`` (DuckDB, plus BigQuery's DP clause) into a query and its options.

    >>> parsed = parse("SELECT WITH DIFFERENTIAL_PRIVACY OPTIONS (epsilon = 0.5) COUNT(*) FROM t")
    >>> parsed.tree.sql(), parsed.options["epsilon"].value
    ('SELECT COUNT(*) FROM t', Fraction(1, 2))
    """
    tree = _parse_tree(sql)
    return ParsedQuery(strip_dp_options(tree), dp_options(tree))


def parse_query(sql: str) -> exp.Expression:
    """Parse ``sql`` into one query AST, stripped of comments and of dpsql's options."""
    return parse(sql).tree


class _QuietWhileParsing(logging.Filter):
    """Drops sqlglot's log records ("Falling back to parsing as a 'Command'") while this thread
    parses analyst SQL: dpsql refuses such statements itself, with a position and a hint."""

    local = threading.local()

    def filter(self, record: logging.LogRecord) -> bool:
        return not getattr(self.local, "parsing", False)


_READER = Dialect.get_or_raise(DPDuckDB)
"""dpsql's DuckDB dialect, as ``sqlglot.parse(sql, read=DPDuckDB)`` looks it up."""

_QUIET = _QuietWhileParsing()
logging.getLogger("sqlglot").addFilter(_QUIET)


@contextmanager
def _quiet_sqlglot():
    _QUIET.local.parsing = True
    try:
        yield
    finally:
        _QUIET.local.parsing = False


def _parse_tree(sql: str) -> exp.Expression:
    if not isinstance(sql, str):
        raise UnsupportedQuery(f"expected SQL text, got {type(sql).__name__}")
    try:
        with _quiet_sqlglot():  # tokenized once: the written names and statement starts read the same tokens
            tokens = _READER.tokenize(sql)
            parsed = _READER.parser().parse(tokens, sql)
        # Empty and comment-only statements (`SELECT 1; -- note`, `;;`) are nothing to run.
        statements = [s for s in parsed if s is not None and not isinstance(s, exp.Semicolon)]
    except ParseError as err:
        first = err.errors[0] if err.errors else {}
        description = first.get("description", str(err)).split(". Line")[0]
        raise UnsupportedQuery(
            f"the SQL does not parse: {_short(description)}",
            line=first.get("line"),
            col=first.get("col"),
            hint="check the syntax near that position",
        ) from None
    except TokenError as err:
        raise UnsupportedQuery(f"the SQL does not parse: {err}") from None
    except RecursionError:
        raise UnsupportedQuery("the SQL is nested too deeply to parse",
                               hint="write it with fewer nested parentheses or subqueries") from None
    if not statements:
        raise UnsupportedQuery("the SQL text holds no statement", hint="write a SELECT query")
    if len(statements) > 1:
        starts = _statement_starts(tokens)
        line, col = position_of(sql, starts[1] if len(starts) > 1 else None)
        raise UnsupportedQuery(
            f"only one statement can be run at a time, found {len(statements)}",
            line=line,
            col=col,
            hint="send each statement on its own",
        )
    tree = statements[0]
    if not isinstance(tree, exp.Query):
        starts = _statement_starts(tokens)
        line, col = position_of(sql, starts[0] if starts else None)
        name, hints = _instead_of(tree)
        raise UnsupportedQuery(
            f"only queries can be run, not {name}",
            line=line,
            col=col,
            construct=type(tree).__name__,
            **hints,
        )
    for node in tree.walk():
        node.comments = None
        if isinstance(node, exp.Count) and node.this is None:
            node.set("this", exp.Star())  # DuckDB's count() is COUNT(*)
    _note_written_names(tree, tokens)
    return as_tree(tree)


def _note_written_names(tree: exp.Expr, tokens: list) -> None:
    """Record on each function node the name it was written with, when sqlglot parsed it as
    another (``random`` as RAND, ``list`` as ARRAY_AGG): refusals name what the analyst wrote."""
    following = {t.start: tokens[i + 1] for i, t in enumerate(tokens[:-1])}
    for node in tree.walk():
        if not isinstance(node, exp.Func) or isinstance(node, exp.Anonymous):
            continue
        start = _node_offset(node, tokens)
        after = following.get(start)
        if start is None or after is None or after.token_type != TokenType.L_PAREN:
            continue
        name = next(t.text for t in tokens if t.start == start)
        if re.fullmatch(r"\w+", name) and name.upper() != node.sql_name().upper():
            node.meta["written"] = name


def _instead_of(tree: exp.Expr) -> tuple[str, dict]:
    """The statement's name and a hint (``hint`` and ``hints`` by surface) for what to write
    instead: DuckDB's EXPLAIN, DESCRIBE, SHOW, SUMMARIZE and PRAGMA have their own in dpsql.

    >>> _instead_of(parse_one_quietly("DESCRIBE visits"))[1]["hints"]["shell"]
    '.schema visits lists the columns, their types and the policy rules'
    """
    if isinstance(tree, exp.Command) and tree.name.upper() == "EXPLAIN":
        query = tree.expression.name if isinstance(tree.expression, exp.Literal) else "SELECT ..."
        query = re.sub(r"(?is)^\s*ANALY[SZ]E\s+", "", query).strip()
        return "EXPLAIN", {"hint": f"db.explain({query!r}) shows what it would run and cost, reading no data",
                           "hints": {"shell": f".explain {query} shows what it would run and cost",
                                     "cli": f"`dpsql explain DB {query!r}` shows what it would run and cost"}}
    table = tree.this if isinstance(tree, (exp.Describe, exp.Summarize, exp.Pragma)) else None
    named = table.sql(dialect=DIALECT) if isinstance(table, exp.Table) else ""
    if isinstance(tree, (exp.Describe, exp.Summarize)) and named:
        name = "DESCRIBE" if isinstance(tree, exp.Describe) else "SUMMARIZE (its statistics are exact)"
        return name, {"hint": f"db.columns({named!r}) lists the columns and their types; print(db.policy) "
                              "shows their rules",
                      "hints": {"shell": f".schema {named} lists the columns, their types and the policy rules",
                                "cli": f"`dpsql shell DB` and .schema {named} list the columns and their rules"}}
    name = describe(tree) if not isinstance(tree, exp.Command) else tree.name.upper()
    if isinstance(tree, exp.Summarize):
        name = "SUMMARIZE (its statistics are exact)"
    if isinstance(tree, (exp.Show, exp.Describe, exp.Summarize, exp.Pragma)):
        return name, {"hint": "db.tables() lists the tables, db.columns(table) their columns",
                      "hints": {"shell": ".tables lists the tables, .schema their columns and rules",
                                "cli": "`dpsql shell DB` and .tables list the tables"}}
    return name, {"hint": "write a SELECT query over the declared tables"}


def parse_one_quietly(sql: str) -> exp.Expression:
    """``sqlglot.parse_one`` in dpsql's dialect, without sqlglot's log warnings."""
    with _quiet_sqlglot():
        return as_tree(sqlglot.parse_one(sql, read=DPDuckDB))


def as_tree(node: exp.Expr) -> exp.Expression:
    """A sqlglot node as the ``exp.Expression`` dpsql's stages are annotated with: sqlglot 30
    types its trees as ``exp.Expr`` (of which ``Expression`` is the familiar subclass) and
    every node it parses passes ``isinstance(node, exp.Expression)``; only the annotations differ."""
    return cast(exp.Expression, node)


def located(error: DPError, sql: str) -> DPError:
    """``error`` with the line and column of the node it carries in ``sql`` (once, at the
    boundary that holds the query text); an error with no node, or a position, is unchanged."""
    node = getattr(error, "node", None)
    if error.line is None and isinstance(node, exp.Expr):
        error.locate(*node_position(node, sql))
    return error


def node_position(node: exp.Expr, sql: str) -> tuple[int | None, int | None]:
    """Best known (line, column) where a construct starts in ``sql``.

    sqlglot records positions on identifiers, literals and some functions; a construct starts
    at its earliest positioned token, moved back to the function name or opening parenthesis
    that precedes it for calls and subqueries. A construct with no positioned token at all
    (``DISTINCT``) is found by its keyword.

    >>> import sqlglot
    >>> sql = "SELECT MAX(amount) FROM t"
    >>> node_position(sqlglot.parse_one(sql).find(exp.Max), sql)
    (1, 8)
    """
    return position_of(sql, _node_offset(node, _tokens(sql)))


def _node_offset(node: exp.Expr, tokens: list) -> int | None:
    """The character offset where ``node`` starts (``node_position``), given the SQL's tokens."""
    offsets = [n.meta["start"] for n in node.walk() if n.meta and "start" in n.meta]
    if not offsets:
        keywords = {node.key.upper(), node.key.upper().replace("_", "")}
        if isinstance(node, exp.Func):
            keywords.add(node.sql_name().upper())
            if node.meta.get("written"):
                keywords.add(node.meta["written"].upper())
        return next((t.start for t in tokens if t.text.upper() in keywords), None)
    start = min(offsets)
    own = node.meta.get("start") if node.meta else None
    if own is None and type(node) in CLAUSES:
        keyword = CLAUSES[type(node)]
        start = next((t.start for t in reversed(tokens) if t.start < start and t.text.upper() == keyword), start)
    elif own is None and isinstance(node, (exp.Func, exp.Subquery, exp.Window)):
        start = _opening_of(tokens, start, with_name=isinstance(node, exp.Func))
    return start


CLAUSES: dict[type[exp.Expr], str] = {
    exp.Where: "WHERE", exp.Having: "HAVING", exp.Group: "GROUP", exp.Order: "ORDER",
    exp.Limit: "LIMIT", exp.Offset: "OFFSET", exp.Qualify: "QUALIFY", exp.Join: "JOIN",
}
"""Clauses located by their keyword, the token just before their first positioned one."""


def statement_starts(sql: str) -> list[int]:
    """Character offsets where each statement of ``sql`` begins."""
    return _statement_starts(_tokens(sql))


def _statement_starts(tokens: list) -> list[int]:
    starts, expecting = [], True
    for token in tokens:
        if token.token_type == TokenType.SEMICOLON:
            expecting = True
        elif expecting:
            starts.append(token.start)
            expecting = False
    return starts


def _tokens(sql: str) -> list:
    try:
        return sqlglot.tokenize(sql, read=DPDuckDB)
    except TokenError:
        return []


def _opening_of(tokens: list, start: int, with_name: bool) -> int:
    """The '(' (or the name before it) that opens the construct whose first token is at ``start``:
    the innermost one still open there (a closed one, such as COUNT(*)'s before a WHERE holding
    ``2 ** x``, opens something else); ``start`` itself when none is."""
    open_parens: list[int] = []
    for i, token in enumerate(tokens):
        if token.start >= start:
            break
        if token.token_type == TokenType.L_PAREN:
            open_parens.append(i)
        elif token.token_type == TokenType.R_PAREN and open_parens:
            open_parens.pop()
    if not open_parens:
        return start
    index = open_parens[-1]
    while with_name and index > 0 and tokens[index - 1].token_type == TokenType.L_PAREN:
        index -= 1  # f((x)): the call's own parenthesis is the first of the run
    if with_name and index > 0:
        return tokens[index - 1].start
    return tokens[index].start


def describe(node: exp.Expr) -> str:
    """A short human name for a construct, used in refusals: 'INSERT', 'COUNT(DISTINCT ...)', ..."""
    if isinstance(node, exp.Func):
        name = node.sql_name() if not isinstance(node, exp.Anonymous) else node.name
        name = node.meta.get("written") or name  # as the analyst wrote it (parse notes it)
        return f"{name.upper()}(...)"
    key = node.key.upper().replace("_", " ")
    return key


def _short(text: str) -> str:
    text = re.sub(r"Required keyword: '\w+' missing for <class '[\w.]+\.(\w+)'>",
                  lambda m: f"the {m.group(1).upper()} clause is incomplete", text)
    text = re.sub(r"<Token token_type: TokenType\.\w+, text: (.*?), line: .*?>", r"'\1'", text)
    text = text.replace("'SENTINEL'", "the end of the query")
    return text if len(text) < 160 else text[:157] + "..."
