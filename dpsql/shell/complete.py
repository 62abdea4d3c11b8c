"""Completion for the shell: a pure function from the text around the cursor to suggestions.

``complete`` knows nothing of terminals: it takes the text before (and after) the cursor and
the catalog the analyst may see (table -> column names, schema only), and returns what could
replace the word being typed. ``SQLCompleter`` adapts it to prompt_toolkit.

It reads SQL with a small tolerant scanner rather than a parser: the text being typed is
almost never valid SQL yet, and a completion menu must never raise. Nothing here decides
what a query may do; the engine checks every query it is sent.

>>> catalog = {"visits": ["user_id", "store", "amount"], "stores": ["store", "city"]}
>>> [s.text for s in complete("SELECT COUNT(*) FROM vi", catalog)]
['visits']
>>> [s.text for s in complete("SELECT am", catalog, text_after_cursor=" FROM visits")]
['amount']
>>> [s.text for s in complete("SELECT store, COUNT(*) FROM visits GROUP BY s", catalog)]  # typed case
['store', 'sum(', 'stddev(', 'stddev_samp(', 'stddev_pop(', 'select']
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass

from dpsql.analysis.aggregates.registry import spellings
from dpsql.calls.registry import mechanism_names

KEYWORDS = (
    "SELECT", "FROM", "WHERE", "GROUP BY", "ORDER BY", "HAVING", "LIMIT", "OFFSET", "JOIN",
    "LEFT JOIN", "INNER JOIN", "ON", "AS", "AND", "OR", "NOT", "IN", "IS", "NULL", "BETWEEN",
    "LIKE", "ILIKE", "CASE", "WHEN", "THEN", "ELSE", "END", "DISTINCT", "ASC", "DESC", "TRUE",
    "FALSE", "WITH", "DIFFERENTIAL_PRIVACY", "OPTIONS", "INTERVAL", "DATE",
)
"""SQL keywords worth offering; multi-word ones are completed whole."""

DP_AGGREGATES = spellings()
"""The aggregates dpsql answers with noise over a private table: every family's spellings
(``dpsql.analysis.aggregates``)."""

ROW_FUNCTIONS = (
    "ABS", "CAST", "CEIL", "COALESCE", "DATE_TRUNC", "EXTRACT", "FLOOR", "GREATEST", "IF",
    "LEAST", "LENGTH", "LOWER", "MONTH", "NULLIF", "ROUND", "UPPER", "YEAR",
)
"""Row-level functions documented for WHERE clauses and bounded expressions."""

CLAUSES = frozenset({"SELECT", "FROM", "JOIN", "WHERE", "BY", "HAVING", "ON", "LIMIT", "OFFSET"})
"""Words that start a part of a query; the last one before the cursor says what comes next."""

OPERAND_KEYWORDS = frozenset({"NULL", "TRUE", "FALSE", "END"})
"""Keywords that end an operand, so what follows them is an operator or a clause."""

RESERVED = frozenset(k.split()[0] for k in KEYWORDS) | CLAUSES
"""Words that cannot be a table alias written without AS."""

@dataclass(frozen=True)
class Suggestion:
    """One thing the word before the cursor could become."""

    text: str
    """What replaces the word being typed."""
    kind: str
    """keyword, function, table, column, command or argument."""
    start: int
    """Where the replaced word starts, counted back from the cursor (0 or negative)."""
    detail: str = ""
    """Shown beside the suggestion in the menu, e.g. the table a column belongs to."""


@dataclass(frozen=True)
class DotArgument:
    """What the argument of a dot command completes to."""

    kind: str
    """"table", "command" (a dot command's name), "sql" (a query), "choice" or "none"."""
    choices: tuple[str, ...] = ()
    """The words allowed when ``kind`` is "choice"."""


def complete(
    text_before_cursor: str,
    catalog: Mapping[str, Iterable[str]],
    *,
    text_after_cursor: str = "",
    dot_commands: Mapping[str, DotArgument] | None = None,
) -> list[Suggestion]:
    """Suggestions for the word before the cursor, best first.

    ``catalog`` maps each table the analyst may query to its column names. ``dot_commands``
    maps each dot command (``".schema"``) to what its argument completes to.

    >>> [s.text for s in complete(".sc", {}, dot_commands={".schema": DotArgument("table")})]
    ['.schema']
    >>> [s.text for s in complete(".schema u", {"users": []}, dot_commands={".schema": DotArgument("table")})]
    ['users']
    """
    if text_before_cursor.lstrip().startswith("."):
        return _complete_dot_command(text_before_cursor.lstrip(), catalog, dot_commands or {})
    return _complete_sql(text_before_cursor, text_after_cursor, catalog)


# -- dot commands ------------------------------------------------------------------------------

def _complete_dot_command(text: str, catalog, dot_commands: Mapping[str, DotArgument]) -> list[Suggestion]:
    name, space, argument = text.partition(" ")
    if not space:
        return [Suggestion(command, "command", -len(name)) for command in sorted(dot_commands)
                if command.startswith(name.lower())]
    spec = dot_commands.get(name.lower())
    if spec is None:
        return []
    if spec.kind == "sql":
        return _complete_sql(argument, "", catalog)
    word = argument.split(" ")[-1]
    if spec.kind == "table":
        options = list(catalog)
    elif spec.kind == "command":
        options = sorted(name.removeprefix(".") for name in dot_commands)
    elif spec.kind == "choice":
        options = list(spec.choices)
    else:
        return []
    return [Suggestion(option, "argument", -len(word)) for option in options
            if option.lower().startswith(word.lower())]


# -- SQL ---------------------------------------------------------------------------------------

@dataclass(frozen=True)
class _Token:
    kind: str  # word, quoted, string, number, symbol
    text: str


def _complete_sql(before: str, after: str, catalog: Mapping[str, Iterable[str]]) -> list[Suggestion]:
    tokens, open_literal = _scan(before)
    if open_literal:  # inside a string or comment: nothing sensible to offer
        return []
    tokens = _current_statement(tokens)
    word, qualifier = _word_at_end(before, tokens)
    previous = tokens[:-1] if word else tokens
    if qualifier is not None:
        previous = previous[:-2]  # the qualifier and its dot
    statement = previous + _statement_start(_scan(after)[0])
    tables = _tables_in(statement, catalog)
    start = -len(word)

    if qualifier is not None:
        table = tables.get(qualifier.lower()) or _catalog_name(qualifier, catalog)
        if table is None:
            return []
        return _matching([Suggestion(c, "column", start, table) for c in catalog.get(table, ())], word)

    context = _context(previous)
    if context == "table":
        # A mechanism is called as the whole statement: offered after SELECT * FROM only.
        calls = [t.text.upper() for t in previous] == ["SELECT", "*", "FROM"]
        return _matching([Suggestion(t, "table", start) for t in catalog]
                         + [Suggestion(name + "(", "function", start, "mechanism: many queries")
                            for name in (mechanism_names() if calls else ())], word)
    if context == "none":
        return []
    keywords = _keywords(start, word)
    if context == "column":
        return _matching(_columns(tables or {t: t for t in catalog}, catalog, start)
                         + _functions(start, word), word) + _matching(keywords, word)
    return _matching(keywords, word)


def _context(previous: list[_Token]) -> str:
    """What the next word is: a "table", a "column" (or expression), a "keyword" or "none"."""
    if not previous:
        return "keyword"
    last = previous[-1]
    last_word = last.text.upper() if last.kind == "word" else None
    clause = next((t.text.upper() for t in reversed(previous)
                   if t.kind == "word" and t.text.upper() in CLAUSES), None)
    if last_word in ("FROM", "JOIN"):
        return "table"
    if last_word in ("AS", "LIMIT", "OFFSET"):
        return "none"
    if clause in ("FROM", "JOIN"):
        # After FROM a comma starts another table; after a table name comes a keyword.
        return "table" if last.text == "," else "keyword"
    if clause is None or clause in ("LIMIT", "OFFSET"):
        return "keyword"
    ends_operand = (last.kind in ("quoted", "string", "number") or last.text == ")"
                    or (last_word is not None and (last_word not in RESERVED or last_word in OPERAND_KEYWORDS)))
    # "SELECT amount |" wants AS, FROM or an operator; "SELECT amount + |" wants a column.
    return "keyword" if ends_operand else "column"


def _columns(tables: Mapping[str, str], catalog, start: int) -> list[Suggestion]:
    """Columns of the query's tables, in declaration order, each once."""
    owners: dict[str, list[str]] = {}
    for table in dict.fromkeys(tables.values()):
        for column in catalog.get(table, ()):
            owners.setdefault(column, []).append(table)
    return [Suggestion(column, "column", start, ", ".join(names)) for column, names in owners.items()]


def _functions(start: int, word: str) -> list[Suggestion]:
    upper = not word or not word.islower()
    return [Suggestion((name if upper else name.lower()) + "(", "function", start,
                       "DP aggregate" if name in DP_AGGREGATES else "function")
            for name in (*DP_AGGREGATES, *ROW_FUNCTIONS)]


def _keywords(start: int, word: str) -> list[Suggestion]:
    # Answer in the case the analyst is typing in.
    upper = not word or not word.islower()
    return [Suggestion(k if upper else k.lower(), "keyword", start) for k in KEYWORDS]


def _matching(suggestions: list[Suggestion], word: str) -> list[Suggestion]:
    prefix = word.lower()
    return [s for s in suggestions if s.text.lower().startswith(prefix)]


def _tables_in(tokens: list[_Token], catalog) -> dict[str, str]:
    """Name or alias (lower-cased) -> catalog table, for each table after FROM or JOIN."""
    found: dict[str, str] = {}
    expecting_table = False
    i = 0
    while i < len(tokens):
        token = tokens[i]
        if token.kind == "word" and token.text.upper() in ("FROM", "JOIN"):
            expecting_table = True
            i += 1
        elif expecting_table and token.kind in ("word", "quoted"):
            name, i = _dotted_name(tokens, i)
            alias, i = _alias(tokens, i)
            table = _catalog_name(name, catalog)
            if table is not None:
                for key in (table, name, alias):
                    if key:
                        found[key.lower()] = table
            expecting_table = i < len(tokens) and tokens[i].text == ","
            i += expecting_table
        else:
            expecting_table = False
            i += 1
    return found


def _dotted_name(tokens: list[_Token], i: int) -> tuple[str, int]:
    """``schema.table`` starting at ``i``, and the index after it."""
    name = tokens[i].text
    i += 1
    while i + 1 < len(tokens) and tokens[i].text == "." and tokens[i + 1].kind in ("word", "quoted"):
        name += "." + tokens[i + 1].text
        i += 2
    return name, i


def _alias(tokens: list[_Token], i: int) -> tuple[str | None, int]:
    """The alias written at ``i`` (``AS a`` or just ``a``), and the index after it."""
    j = i + 1 if i < len(tokens) and tokens[i].kind == "word" and tokens[i].text.upper() == "AS" else i
    if j < len(tokens) and (tokens[j].kind == "quoted"
                            or (tokens[j].kind == "word" and tokens[j].text.upper() not in RESERVED)):
        return tokens[j].text, j + 1
    return None, i


def _catalog_name(name: str, catalog) -> str | None:
    lowered = name.lower().removeprefix("main.")
    return next((table for table in catalog if table.lower() == lowered), None)


def _word_at_end(before: str, tokens: list[_Token]) -> tuple[str, str | None]:
    """The identifier being typed (possibly empty) and its ``qualifier.`` if it has one."""
    word = ""
    if tokens and tokens[-1].kind == "word" and before.endswith(tokens[-1].text):
        word = tokens[-1].text
    rest = tokens[:-1] if word else tokens
    if len(rest) >= 2 and rest[-1].text == "." and rest[-2].kind in ("word", "quoted") \
            and before[:len(before) - len(word)].endswith("."):
        return word, rest[-2].text
    return word, None


def _current_statement(tokens: list[_Token]) -> list[_Token]:
    for i in range(len(tokens) - 1, -1, -1):
        if tokens[i].text == ";":
            return tokens[i + 1:]
    return tokens


def _statement_start(tokens: list[_Token]) -> list[_Token]:
    for i, token in enumerate(tokens):
        if token.text == ";":
            return tokens[:i]
    return tokens


def _scan(text: str) -> tuple[list[_Token], bool]:
    """Tokens of ``text``, and whether it ends inside a string, quoted name or comment."""
    tokens = list(_tokens(text))
    return [t for t in tokens if t.kind != "open"], bool(tokens) and tokens[-1].kind == "open"


def _tokens(text: str) -> Iterator[_Token]:
    i, n = 0, len(text)
    while i < n:
        char = text[i]
        if char.isspace():
            i += 1
        elif text.startswith("--", i):
            end = text.find("\n", i)
            if end < 0:
                yield _Token("open", text[i:])
                return
            i = end + 1
        elif text.startswith("/*", i):
            end = text.find("*/", i + 2)
            if end < 0:
                yield _Token("open", text[i:])
                return
            i = end + 2
        elif char in "'\"":
            end = _closing_quote(text, i)
            if end < 0:
                yield _Token("open", text[i:])
                return
            yield _Token("string" if char == "'" else "quoted", text[i + 1:end].replace(char * 2, char))
            i = end + 1
        elif char.isalpha() or char == "_":
            j = i
            while j < n and (text[j].isalnum() or text[j] in "_$"):
                j += 1
            yield _Token("word", text[i:j])
            i = j
        elif char.isdigit():
            j = i
            while j < n and (text[j].isalnum() or text[j] == "."):
                j += 1
            yield _Token("number", text[i:j])
            i = j
        else:
            yield _Token("symbol", char)
            i += 1


def _closing_quote(text: str, start: int) -> int:
    """Index of the quote closing the one at ``start`` (doubled quotes escape), or -1."""
    quote, i = text[start], start + 1
    while True:
        i = text.find(quote, i)
        if i < 0:
            return -1
        if text.startswith(quote * 2, i):
            i += 2
            continue
        return i


# -- prompt_toolkit adapter --------------------------------------------------------------------

try:
    from prompt_toolkit.completion import Completer, Completion
except ImportError:  # the shell needs prompt_toolkit; the pure function above does not
    Completer, Completion = object, None  # type: ignore[misc, assignment]


class SQLCompleter(Completer):
    """prompt_toolkit's view of ``complete``; the catalog is read once, when the shell starts."""

    def __init__(self, catalog: Mapping[str, Iterable[str]], dot_commands: Mapping[str, DotArgument]):
        self.catalog = {table: list(columns) for table, columns in catalog.items()}
        self.dot_commands = dict(dot_commands)

    def get_completions(self, document, complete_event):
        before = document.text_before_cursor
        if not getattr(complete_event, "completion_requested", True) and (not before or before[-1].isspace()):
            return  # while typing, a menu opens on a word, not on every space or new line; Tab still lists all
        for suggestion in complete(document.text_before_cursor, self.catalog,
                                   text_after_cursor=document.text_after_cursor,
                                   dot_commands=self.dot_commands):
            yield Completion(suggestion.text, start_position=suggestion.start,
                             display_meta=suggestion.detail or suggestion.kind)
