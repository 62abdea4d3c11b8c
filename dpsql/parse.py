"""Stage 1, parse: SQL text to a sqlglot AST (DuckDB dialect), or a positioned refusal.

Only one statement is accepted, and it must be a query. Comments are dropped here, so no
analyst text can ever reach DuckDB except through SQL that dpsql regenerates from the AST.

>>> parse_query("SELECT COUNT(*) FROM visits -- hello").sql()
'SELECT COUNT(*) FROM visits'
>>> parse_query("SELECT 1; SELECT 2")
Traceback (most recent call last):
dpsql.errors.UnsupportedQuery: only one statement can be run at a time, found 2 (line 1, column 18). Hint: send each statement on its own.
"""

from __future__ import annotations

import re

import sqlglot
from sqlglot import exp
from sqlglot.errors import ParseError, TokenError

from .errors import UnsupportedQuery, position_of

DIALECT = "duckdb"


def parse_query(sql: str) -> exp.Expression:
    """Parse ``sql`` into one query AST, stripped of comments."""
    if not isinstance(sql, str):
        raise UnsupportedQuery(f"expected SQL text, got {type(sql).__name__}")
    try:
        statements = [s for s in sqlglot.parse(sql, read=DIALECT) if s is not None]
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
    if not statements:
        raise UnsupportedQuery("the SQL text holds no statement", hint="write a SELECT query")
    if len(statements) > 1:
        line, col = node_position(statements[1], sql)
        raise UnsupportedQuery(
            f"only one statement can be run at a time, found {len(statements)}",
            line=line,
            col=col,
            hint="send each statement on its own",
        )
    tree = statements[0]
    if not isinstance(tree, exp.Query):
        line, col = node_position(tree, sql)
        raise UnsupportedQuery(
            f"only queries can be run, not {describe(tree)}",
            line=line,
            col=col,
            construct=type(tree).__name__,
            hint="write a SELECT query over the declared tables",
        )
    for node in tree.walk():
        node.comments = None
    return tree


def node_position(node: exp.Expression, sql: str) -> tuple[int | None, int | None]:
    """Best known (line, column) of a node: its own token, else its first positioned descendant."""
    for candidate in node.walk():
        start = candidate.meta.get("start") if candidate.meta else None
        if start is not None:
            return position_of(sql, start)
    return None, None


def describe(node: exp.Expression) -> str:
    """A short human name for a construct, used in refusals: 'INSERT', 'COUNT(DISTINCT ...)', ..."""
    if isinstance(node, exp.Func):
        name = node.sql_name() if not isinstance(node, exp.Anonymous) else node.name
        return f"{name.upper()}(...)"
    key = node.key.upper().replace("_", " ")
    return key


def _short(text: str) -> str:
    text = re.sub(r"<Token token_type: TokenType\.\w+, text: (.*?), line: .*?>", r"'\1'", text)
    text = text.replace("'SENTINEL'", "the end of the query")
    return text if len(text) < 160 else text[:157] + "..."
